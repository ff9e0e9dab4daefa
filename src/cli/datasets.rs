//! `udfchain datasets ls|info|rm|gc`: the datasets saved in the catalog under
//! the root. `info` redacts the stored query; `gc` removes the checkpoints
//! of saves that failed or were killed.

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
    /// One dataset version (default: latest).
    #[command(after_help = "\
Examples:
  udfchain datasets info lines
  udfchain datasets info lines 1")]
    Info {
        /// The dataset's name.
        name: String,
        /// The version (default: latest).
        version: Option<u32>,
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
    let catalog = Catalog::open_async(settings.get_root()).await?;
    match command {
        DatasetsCommand::Ls => {
            let runner = ScriptRunner::new(session);
            match runner.run("SHOW DATASETS").await?.pop() {
                Some(Output::Table(b)) => out.print(&b),
                _ => Ok(()),
            }
        }
        DatasetsCommand::Info { name, version } => {
            let i = catalog.get_async(&name, version).await?;
            print::line(format_args!(
                "name:    {}\nversion: {}\nrows:    {}\nbytes:   {}\npath:    {}\nschema:\n  {}\nquery:\n  {}",
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
            let n = catalog.remove_async(&name, version).await?;
            print::line(format_args!("removed {n} version(s) of {name}"))
        }
        DatasetsCommand::Gc => {
            let removed = catalog.remove_stale_checkpoints_async().await?;
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
