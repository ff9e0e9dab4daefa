//! Python calls from the engine's threads, and the interpreter's exit.
//!
//! A UDF call runs Python on a thread Python did not create. Guarantees:
//! [`enter`] lets a call in only while the interpreter is not exiting and its
//! query still wants it (a call queued behind a dropped query never starts);
//! [`shutdown`], run by `atexit`, refuses new calls and waits (bounded) for the
//! running ones to return, so no engine thread touches the interpreter while
//! it finalizes (CPython ends a thread that takes the GIL then with
//! `pthread_exit` inside Rust frames, which would crash the process, e.g. at
//! an exit right after Ctrl-C stopped a run).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use pyo3::prelude::*;

struct State {
    running: usize,
    closed: bool,
}

static STATE: Mutex<State> = Mutex::new(State {
    running: 0,
    closed: false,
});
static DONE: Condvar = Condvar::new();

fn state() -> std::sync::MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Set when the future that scheduled a call is dropped before it ran.
#[derive(Clone, Default)]
pub struct Abandon(Arc<AtomicBool>);

impl Abandon {
    /// Whether the future (or stream) that scheduled the call was dropped.
    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    /// Marks the call unwanted when dropped: hold it in the scheduling future.
    pub fn guard(&self) -> AbandonOnDrop {
        AbandonOnDrop(self.clone())
    }
}

/// Sets its [`Abandon`] when dropped (after the call ran, that changes nothing).
pub struct AbandonOnDrop(Abandon);

impl Drop for AbandonOnDrop {
    fn drop(&mut self) {
        self.0.0.store(true, Ordering::Release);
    }
}

/// A running Python call; the interpreter waits for it at exit.
pub struct Running(());

impl Drop for Running {
    fn drop(&mut self) {
        let mut s = state();
        s.running -= 1;
        if s.running == 0 {
            DONE.notify_all();
        }
    }
}

/// Why a call did not start.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("the Python interpreter is exiting")]
    Exiting,
    #[error("the query that asked for this call was dropped")]
    Abandoned,
}

/// Lets a call in, unless the interpreter exits or `abandon` was set.
pub fn enter(abandon: &Abandon) -> Result<Running, Refused> {
    let mut s = state();
    if s.closed {
        return Err(Refused::Exiting);
    }
    if abandon.is_set() {
        return Err(Refused::Abandoned);
    }
    s.running += 1;
    Ok(Running(()))
}

/// Refuses new Python calls from the engine and waits up to `timeout`
/// seconds for the running ones (the GIL released, so they can finish).
#[pyfunction]
#[pyo3(signature = (timeout=10.0))]
pub fn shutdown(py: Python<'_>, timeout: f64) {
    py.detach(|| {
        // Cluster jobs of streams dropped just before the exit: cancelled.
        crate::runtime::send_cancels();
        let deadline = Instant::now() + Duration::from_secs_f64(timeout.max(0.0));
        let mut s = state();
        s.closed = true;
        while s.running > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            s = DONE
                .wait_timeout(s, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    })
}
