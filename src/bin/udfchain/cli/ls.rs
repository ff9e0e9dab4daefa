//! `udfchain ls` and `udfchain du`: the objects under a URI (path and size,
//! sorted by path) and their count and bytes, each one chain printed as a table.

use std::sync::Arc;

use udfchain::datafusion::functions_aggregate::expr_fn::{count, sum};
use udfchain::{Session, col};

use crate::cli::print::Printer;

/// `ls`: path and size of each object, sorted by path.
pub async fn ls(
    session: &Arc<Session>,
    out: &Printer,
    uri: &str,
    non_recursive: bool,
    glob: Option<String>,
) -> udfchain::Result<()> {
    let mut chain = session.from_storage(uri);
    if non_recursive {
        chain = chain.non_recursive();
    }
    if let Some(g) = glob {
        chain = chain.glob(&g);
    }
    let chain = chain
        .select([
            col("file.path").alias("path"),
            col("file.size").alias("size"),
        ])
        .order_by([col("path").sort(true, false)]);
    out.print(&chain.collect().await?)
}

/// `du`: the number of objects and their bytes.
pub async fn du(session: &Arc<Session>, out: &Printer, uri: &str) -> udfchain::Result<()> {
    let chain = session.from_storage(uri).group_by(
        [],
        [
            count(col("file.size")).alias("files"),
            sum(col("file.size")).alias("bytes"),
        ],
    );
    out.print(&chain.collect().await?)
}
