//! The `udfchain` command line: run scripts and queries, list storage, manage
//! datasets and the shared cache. Errors print one line (`--verbose`: the chain
//! of causes) and exit non-zero. Statements that run a plan (queries,
//! `CREATE DATASET`, `EXPLAIN ANALYZE`) show a live progress display on stderr
//! when it is a terminal and `CI` is unset, then a one-line summary on stderr
//! (in pipes too) if they worked on files; `--quiet` turns both off. Standard
//! output only ever gets results.
//! Every command's `--help` ends with examples; no arguments print a start
//! guide (stdout, exit 0). The commands themselves live in `cli/`; this file
//! parses, dispatches and turns the result into an exit code (130 after
//! Ctrl-C, 1 on error, 0 when standard output was closed by its reader).

mod cli;

use std::process::ExitCode;

use clap::Parser;
use udfchain::testing::redact;
use udfchain::{Error, Settings};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    if cli.command.is_none() {
        let root = cli
            .root
            .clone()
            .unwrap_or_else(|| Settings::new().get_root());
        // A closed stdout is no error here either.
        let _ = cli::print::line(cli::start_guide(&root));
        return ExitCode::SUCCESS;
    }
    let verbose = cli.verbose;
    match cli::run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        // A reader that stopped reading (`udfchain ls ... | head`) is not an error.
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::BrokenPipe => {
            ExitCode::SUCCESS
        }
        Err(e @ Error::Interrupted { .. }) => {
            eprintln!("udfchain: {}", redact(&e.to_string()));
            ExitCode::from(130)
        }
        Err(e) => {
            let mut msg = e.to_string().replace('\n', " ");
            if verbose {
                let mut source = std::error::Error::source(&e);
                while let Some(s) = source {
                    msg.push_str(&format!("\n  caused by: {s}"));
                    source = s.source();
                }
            }
            eprintln!("udfchain: {}", redact(&msg));
            ExitCode::FAILURE
        }
    }
}
