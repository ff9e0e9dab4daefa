//! Expression helpers: `col("file.size")` reaches into struct columns.

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
