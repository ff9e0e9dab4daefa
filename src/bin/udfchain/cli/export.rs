//! `udfchain export QUERY OUTPUT`: the files of a query's `File` column
//! written below a local dir or a store URI (`Chain::to_storage`: the same
//! placement, atomic names, collision errors and skipped reruns). This is
//! SQL's way to `to_storage`: the query picks the files (`read_storage`,
//! `read_dataset`, filters, joins), the command writes them.

use std::sync::Arc;

use clap::Args;
use udfchain::{Chain, LinkType, Placement, ScriptRunner, Session};

use crate::cli::print::{self, Format, Printer};

/// The arguments of `udfchain export`.
#[derive(Args)]
pub struct ExportArgs {
    /// A SQL query with a File column, e.g. "SELECT file FROM read_storage('s3://b/imgs/')".
    query: String,
    /// The local dir or store URI to write below.
    output: String,
    /// The File column to export.
    #[arg(long, default_value = "file")]
    signal: String,
    /// Where each file goes: fullpath, filename, etag or checksum.
    #[arg(long, default_value = "fullpath")]
    placement: String,
    /// copy, or symlink (local files to a local dir only).
    #[arg(long, default_value = "copy")]
    link_type: String,
}

/// Runs `udfchain export`: prints how many files were written and skipped.
pub async fn run(args: ExportArgs, session: Arc<Session>, out: &Printer) -> udfchain::Result<()> {
    let placement: Placement = args.placement.parse()?;
    let link_type: LinkType = args.link_type.parse()?;
    // The script runner registers the table functions and UDFs in the session.
    let _runner = ScriptRunner::new(Arc::clone(&session));
    let plan = session
        .context()
        .sql(&args.query)
        .await?
        .into_unoptimized_plan();
    let summary = Chain::from_plan(Arc::clone(&session), plan)
        .to_storage(&args.output, &args.signal, placement, link_type)
        .await?;
    match out.format {
        Format::Json => print::line(format_args!(
            "{{\"written\": {}, \"skipped\": {}}}",
            summary.written, summary.skipped
        )),
        _ => print::line(format_args!(
            "exported {} file(s), skipped {} already there",
            summary.written, summary.skipped
        )),
    }
}
