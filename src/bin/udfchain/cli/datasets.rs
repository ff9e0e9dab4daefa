//! `udfchain datasets ls|info|rm|gc`: the datasets saved in the catalog under
//! the root. `info` redacts the stored query and prints what the version read
//! (its lineage, one `read from` line each; `--format json`: one JSON object);
//! `gc` removes the checkpoints of saves that failed or were killed.

use std::sync::Arc;

use clap::Subcommand;
use udfchain::testing::redact;
use udfchain::{Catalog, Output, ScriptRunner, Session, Settings};

use crate::cli::print::{self, Printer};

#[derive(Subcommand)]
pub enum DatasetsCommand {
    /// Every version of every dataset.
    #[command(after_help = "\
Examples:
  udfchain datasets ls
  udfchain datasets ls --format csv")]
    Ls,
    /// One dataset version (default: latest): its rows, bytes, creation
    /// time, schema, what it read (storage URIs, dataset versions) and query.
    #[command(after_help = "\
Examples:
  udfchain datasets info lines
  udfchain datasets info lines 1
  udfchain datasets info lines --version 1 --format json")]
    Info {
        /// The dataset's name.
        name: String,
        /// The version (default: latest).
        version: Option<u32>,
        /// The version, as a flag (the same as the positional VERSION).
        #[arg(long = "version", value_name = "V", conflicts_with = "version")]
        version_flag: Option<u32>,
    },
    /// Remove one version, or all versions.
    #[command(after_help = "\
Examples:
  udfchain datasets rm lines 1                  version 1 only
  udfchain datasets rm lines                    every version")]
    Rm {
        /// The dataset's name.
        name: String,
        /// The version to remove (default: every version).
        version: Option<u32>,
    },
    /// Remove stale checkpoints: the UDF results kept by saves that failed
    /// or were killed (a save run again continues from them; one that
    /// commits removes its own). Checkpoints of running saves are kept.
    #[command(after_help = "\
Examples:
  udfchain datasets gc")]
    Gc,
}

/// Runs one `datasets` command.
pub async fn run(
    command: DatasetsCommand,
    session: Arc<Session>,
    settings: &Settings,
    out: &Printer,
) -> udfchain::Result<()> {
    let catalog = Catalog::open(settings.get_root()).await?;
    match command {
        DatasetsCommand::Ls => {
            let runner = ScriptRunner::new(session);
            match runner.run("SHOW DATASETS").await?.pop() {
                Some(Output::Table(b)) => out.print(&b),
                _ => Ok(()),
            }
        }
        DatasetsCommand::Info {
            name,
            version,
            version_flag,
        } => {
            let i = catalog.get(&name, version.or(version_flag)).await?;
            let sources = catalog.lineage(&i.name, Some(i.version)).await?;
            let versions: Vec<u32> = catalog
                .list()
                .await?
                .into_iter()
                .filter(|v| v.name == i.name)
                .map(|v| v.version)
                .collect();
            let created = chrono::DateTime::from_timestamp(i.created, 0)
                .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                .unwrap_or_else(|| i.created.to_string());
            if let print::Format::Json = out.format {
                let json = serde_json::json!({
                    "name": i.name,
                    "version": i.version,
                    "versions": versions,
                    "rows": i.rows,
                    "bytes": i.bytes,
                    "created": created,
                    "path": i.path.display().to_string(),
                    "schema": i.schema.lines().collect::<Vec<_>>(),
                    "sources": sources,
                    "query": redact(&i.query),
                });
                return print::line(json);
            }
            let versions = versions
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ");
            let read_from = if sources.is_empty() {
                "\n  (nothing recorded)".to_string()
            } else {
                sources.iter().map(|s| format!("\n  {s}")).collect()
            };
            print::line(format_args!(
                "name:    {}\nversion: {}\nversions: {versions}\nrows:    {}\nbytes:   {}\ncreated: {created}\npath:    {}\nschema:\n  {}\nread from:{read_from}\nquery:\n  {}",
                i.name,
                i.version,
                i.rows,
                i.bytes,
                i.path.display(),
                i.schema.replace('\n', "\n  "),
                redact(&i.query).replace('\n', "\n  ")
            ))
        }
        DatasetsCommand::Rm { name, version } => {
            let n = catalog.remove(&name, version).await?;
            print::line(format_args!("removed {n} version(s) of {name}"))
        }
        DatasetsCommand::Gc => {
            let removed = catalog.remove_stale_checkpoints().await?;
            let bytes: u64 = removed.iter().map(|r| r.bytes).sum();
            for r in &removed {
                print::line(format_args!("removed {}", r.dir.display()))?;
            }
            print::line(format_args!(
                "removed {} stale checkpoint(s), {bytes} bytes",
                removed.len()
            ))
        }
    }
}
