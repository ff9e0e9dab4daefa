//! The training hook run at each trigger whose set is not empty: a Rust
//! callback, a command, or both (the callback first).
//!
//! Guarantees: the command runs without a shell, with `UDFCHAIN_PIPELINE`,
//! `UDFCHAIN_TRIGGER_ID`, `UDFCHAIN_DATASET`, `UDFCHAIN_ROOT` (the root the
//! dataset is saved under) and, when a Flight server is configured,
//! `UDFCHAIN_FLIGHT_ADDR` in its environment; its standard output goes to
//! standard error (standard output carries the pipeline's JSON lines); the
//! supervisor waits for it. It runs in its own process group, so a Ctrl-C
//! at the terminal reaches the pipeline (which stops after the hook) and not
//! the training; a pipeline killed with SIGKILL leaves a running hook running
//! (the next run runs that trigger's hook again). A command that cannot start or exits non-zero, and
//! a callback that returns an error, are an [`Error::Pipeline`] naming the
//! trigger and the exit status (or the error).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::pipeline::state::TriggerRecord;

/// A Rust training callback: gets the trigger (its dataset is saved).
pub type TriggerCallback = Arc<dyn Fn(&TriggerRecord) -> Result<()> + Send + Sync>;

/// Called with each trigger once it is recorded finished (done or skipped).
pub type CompletedCallback = Arc<dyn Fn(&TriggerRecord) + Send + Sync>;

/// What runs at a trigger.
#[derive(Clone, Default)]
pub struct Hook {
    pub pipeline: String,
    pub command: Option<Vec<String>>,
    pub callback: Option<TriggerCallback>,
    pub flight_addr: Option<String>,
    pub root: PathBuf,
}

impl Hook {
    /// Runs the callback, then the command, for `record` (whose dataset is set).
    /// Blocking: call it on a blocking thread.
    pub fn run(&self, record: &TriggerRecord) -> Result<()> {
        let failed = |reason: String, source: Option<crate::error::Source>| Error::Pipeline {
            pipeline: self.pipeline.clone(),
            reason: format!(
                "training hook of trigger {} failed: {reason} (rerun to retry it)",
                record.trigger_id
            ),
            source,
        };
        if let Some(cb) = &self.callback {
            cb(record).map_err(|e| failed(e.to_string(), Some(Arc::new(e))))?;
        }
        let Some(argv) = &self.command else {
            return Ok(());
        };
        let Some((program, args)) = argv.split_first() else {
            return Ok(());
        };
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::null())
            .env("UDFCHAIN_PIPELINE", &self.pipeline)
            .env("UDFCHAIN_TRIGGER_ID", record.trigger_id.to_string())
            .env("UDFCHAIN_DATASET", record.dataset.as_deref().unwrap_or(""))
            .env("UDFCHAIN_ROOT", &self.root);
        match &self.flight_addr {
            Some(addr) => cmd.env("UDFCHAIN_FLIGHT_ADDR", addr),
            None => cmd.env_remove("UDFCHAIN_FLIGHT_ADDR"),
        };
        // Its own process group: a Ctrl-C at the terminal stops the pipeline
        // after this hook (see `cli`), it does not kill the training midway.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        if let Ok(err) = stderr_stdio() {
            cmd.stdout(err);
        }
        let status = cmd
            .status()
            .map_err(|e| failed(format!("cannot run {program:?}: {e}"), Some(Arc::new(e))))?;
        if status.success() {
            Ok(())
        } else {
            Err(failed(format!("{argv:?} ended with {status}"), None))
        }
    }
}

/// Standard error as a `Stdio` for a child's standard output.
fn stderr_stdio() -> std::io::Result<Stdio> {
    use std::os::fd::AsFd;
    Ok(Stdio::from(std::io::stderr().as_fd().try_clone_to_owned()?))
}
