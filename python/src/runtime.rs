//! The one tokio runtime Python calls block on, and the only way they wait.
//!
//! Guarantees: [`wait`] never holds the GIL while it blocks (other Python
//! threads, and the engine's Python UDF calls, run meanwhile); it checks for
//! signals every [`SIGNAL_CHECK`], so Ctrl-C drops the running future (which
//! cancels the query, its UDF calls and downloads) and raises
//! `KeyboardInterrupt` within that interval, once a job it ran on a cluster
//! was cancelled there (at most [`CANCEL_WAIT`]). The engine's threads (this
//! runtime, its UDF pool) do not survive `fork()`: a process forked after the
//! engine started in its parent gets a clear `RuntimeError` from every call,
//! at once, instead of a hang; a process forked before that works.

use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use tokio::runtime::{Builder, Runtime};
use udfchain::cluster::cancels_sent;

/// How often a wait lets Python handle signals (Ctrl-C).
const SIGNAL_CHECK: Duration = Duration::from_millis(100);
/// How long an interrupted wait (or the exit) waits for the cancels of the
/// cluster jobs it dropped to reach their schedulers.
const CANCEL_WAIT: Duration = Duration::from_secs(5);

/// The process the engine started in, set by the first call that used it.
static STARTED_IN: OnceLock<u32> = OnceLock::new();

/// Fails when this process was forked after the engine started in its parent.
/// Every entry point into the engine calls it first.
pub fn engine() -> PyResult<()> {
    let pid = std::process::id();
    let started = *STARTED_IN.get_or_init(|| pid);
    if started == pid {
        return Ok(());
    }
    Err(PyRuntimeError::new_err(format!(
        "udfchain cannot run in this process ({pid}): it was forked from process {started} \
         after udfchain started its threads there, and threads do not survive fork(). \
         Start workers with multiprocessing's 'spawn' or 'forkserver' method (torch: \
         DataLoader(multiprocessing_context='spawn')), or use udfchain only after the fork"
    )))
}

static RUNTIME: OnceLock<Result<Runtime, String>> = OnceLock::new();

fn runtime() -> PyResult<&'static Runtime> {
    engine()?;
    RUNTIME
        .get_or_init(|| {
            Builder::new_multi_thread()
                .thread_name("udfchain-io")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start udfchain's runtime: {e}")))
}

/// Runs `fut` to completion on the runtime with the GIL released, checking
/// for signals every [`SIGNAL_CHECK`]; a signal handler's exception (Ctrl-C's
/// `KeyboardInterrupt`) drops `fut` and is returned.
pub fn wait<F>(py: Python<'_>, fut: F) -> PyResult<F::Output>
where
    F: Future + Send,
    F::Output: Send,
{
    let rt = runtime()?;
    py.detach(|| {
        let out = rt.block_on(async {
            tokio::pin!(fut);
            loop {
                tokio::select! {
                    out = &mut fut => return Ok(out),
                    _ = tokio::time::sleep(SIGNAL_CHECK) => {
                        Python::attach(|py| py.check_signals())?;
                    }
                }
            }
        });
        if out.is_err() {
            // Interrupted: a job the dropped future ran on a cluster is
            // cancelled there before the KeyboardInterrupt reaches Python
            // (which may exit the process at once).
            rt.block_on(cancels_sent(CANCEL_WAIT));
        }
        out
    })
}

/// Waits (at most [`CANCEL_WAIT`]) for the cluster cancels of dropped
/// queries to reach their schedulers: at an interrupted wait, and at exit.
/// Nothing when the runtime never started (or in a forked process).
pub fn send_cancels() {
    if let (Ok(()), Some(Ok(rt))) = (engine(), RUNTIME.get()) {
        rt.block_on(cancels_sent(CANCEL_WAIT));
    }
}

/// Drops `value` (a running query's stream) inside the runtime's context,
/// so that what its drop aborts or hands to the runtime finds the runtime,
/// whichever thread drops it (the one that lets go of the last reference).
pub fn drop_in_runtime<T>(value: T) {
    match runtime() {
        Ok(rt) => {
            let _entered = rt.enter();
            drop(value);
        }
        Err(_) => drop(value),
    }
}
