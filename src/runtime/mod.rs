//! The UDF pool: a tokio runtime of its own where UDF calls run, so CPU-heavy
//! UDF code never blocks the runtime that drives I/O and DataFusion; and
//! [`blocking`], the one way blocking work (SQLite, file system calls) leaves
//! the async workers.
//!
//! Guarantees: a [`PoolTask`] aborts its task when dropped (no detached work
//! survives a dropped query); a panic in a task is returned as an error value,
//! not propagated into the caller's thread; [`blocking`] runs its closure on
//! tokio's blocking pool under the same policy (a panic is an error).

use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};

use tokio::runtime::{Builder, Handle, Runtime};
use tokio::task::JoinHandle;

use crate::error::{Error, Result};

/// Number of cores this process may use.
pub fn cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

fn pool() -> &'static Handle {
    static POOL: OnceLock<Runtime> = OnceLock::new();
    POOL.get_or_init(|| {
        Builder::new_multi_thread()
            .worker_threads(cores().max(2))
            .thread_name("udfchain-udf")
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("cannot start the UDF runtime: {e}"))
    })
    .handle()
}

/// Spawns `fut` on the UDF pool.
pub fn spawn_udf<F>(fut: F) -> PoolTask<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    PoolTask(pool().spawn(fut))
}

/// Spawns `fut` on the given runtime (the I/O runtime), aborted on drop.
pub fn spawn_on<F>(handle: &Handle, fut: F) -> PoolTask<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    PoolTask(handle.spawn(fut))
}

/// Spawns `fut` on the current runtime, aborted on drop.
///
/// # Panics
/// Outside a tokio runtime, as `tokio::spawn` does.
pub fn spawn<F>(fut: F) -> PoolTask<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    PoolTask(tokio::spawn(fut))
}

/// A task that is aborted when this handle is dropped. Resolves to the task's
/// output, or to the panic message if it panicked.
#[must_use = "dropping a PoolTask aborts it"]
pub struct PoolTask<T>(JoinHandle<T>);

impl<T> Future for PoolTask<T> {
    type Output = Result<T, String>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0)
            .poll(cx)
            .map(|r| r.map_err(join_error))
    }
}

impl<T> PoolTask<T> {
    /// Whether the task has ended (its output is ready).
    pub fn is_finished(&self) -> bool {
        self.0.is_finished()
    }
}

impl<T> Drop for PoolTask<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// "panicked: <message>" or "cancelled".
fn join_error(e: tokio::task::JoinError) -> String {
    if e.is_panic() {
        panic_message(e.into_panic())
    } else {
        "cancelled (the runtime is shutting down)".to_string()
    }
}

/// `panicked: <message>` for the payload of a caught panic (the UDF
/// contract's, so a panic reads the same wherever it was caught).
pub use udfchain_udfs::engine::panic_message;

/// Runs blocking work (SQLite, file system calls) on tokio's blocking pool, so
/// it never stalls an async worker. The one panic policy, as [`PoolTask`]'s:
/// a panic in `f` becomes an error naming it, never a panic of the caller
/// (blocking work parses stored bytes through third-party readers, e.g.
/// Parquet footers, which may panic on hostile input). Besides `f`'s own
/// errors and a panic, `Err` only when the runtime shuts down before `f` ran.
///
/// # Cancel safety
/// Dropping the future does not stop the work once started.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r,
        Err(e) => Err(Error::internal(format!("blocking work {}", join_error(e)))),
    }
}
