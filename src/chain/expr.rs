//! Expression helpers: `col("file.size")` reaches into struct columns;
//! `file_from_url(col("url"))` turns a column of URLs into `File`s.

use datafusion::functions::core::expr_fn::get_field;
use datafusion::logical_expr::Expr;
use datafusion::prelude::ident;

/// A column, where dots reach into struct fields: `col("file.size")` is the
/// `size` field of the `file` column. (DataFusion's own `col` reads a dot as a
/// table qualifier.)
pub fn col(name: &str) -> Expr {
    let mut parts = name.split('.');
    let first = parts.next().unwrap_or(name);
    parts.fold(ident(first), get_field)
}

/// `file_from_url(url)`: a `File` per URL string (`https://host/img/1.jpg`,
/// `s3://bucket/key`), read by the UDFs it is given to like a listed file
/// (see [`File::from_url`](udfchain_udfs::File::from_url)). A null URL gives
/// a null `File`; a string that is no URL fails that row's read, under
/// `on_error`.
pub fn file_from_url(url: Expr) -> Expr {
    udfchain_udfs::FileFromUrl::udf().call(vec![url])
}
