//! Read-ahead of partitions, "k ahead, p at once": the one implementation the
//! trainer's stream ([`super::stream`]) and the Flight server's per-client
//! streams (`serve::readahead`) share. The caller says which partitions to
//! start and which one it takes; this file owns the fetch tasks.
//!
//! Guarantees:
//! - at most `p` fetches of one [`FetchAhead`] do their work at once (a fetch
//!   task waits for one of `p` permits before it starts);
//! - a partition is started at most once, and the read-ahead only moves
//!   forward: [`FetchAhead::start`] is a no-op for a partition at or below
//!   the highest one started (or asked for, or the mark it was opened at);
//! - every fetch is a task aborted when dropped: taking a fetch and dropping
//!   it, [`FetchAhead::forget_below`], [`FetchAhead::clear`] or dropping the
//!   read-ahead stops the fetches nobody awaits (nothing detached).

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::runtime::Handle;
use tokio::sync::Semaphore;

use crate::error::{Error, Result};
use crate::runtime::{PoolTask, spawn_on};

/// The fetch of one partition, running as a task aborted on drop.
#[must_use = "dropping a Fetch aborts it"]
pub(crate) struct Fetch<T>(PoolTask<Result<T>>);

impl<T> Fetch<T> {
    /// Whether the fetch has ended (its result is ready).
    pub(crate) fn is_ready(&self) -> bool {
        self.0.is_finished()
    }

    /// The fetch's result; a panic in it is an internal error.
    ///
    /// # Cancel safety
    /// Dropping the future aborts the fetch.
    pub(crate) async fn wait(self) -> Result<T> {
        self.0
            .await
            .unwrap_or_else(|msg| Err(Error::internal(format!("partition fetch task {msg}"))))
    }
}

/// The partitions being fetched ahead of their reader, by index.
pub(crate) struct FetchAhead<T> {
    handle: Handle,
    permits: Arc<Semaphore>,
    /// Started and not taken yet.
    started: BTreeMap<usize, Fetch<T>>,
    /// Partitions below this are started, taken or skipped.
    started_below: usize,
}

impl<T: Send + 'static> FetchAhead<T> {
    /// A read-ahead running at most `p` fetches at once on `handle`, whose
    /// partitions below `read_from` count as read.
    pub(crate) fn new(handle: Handle, p: usize, read_from: usize) -> Self {
        Self {
            handle,
            permits: Arc::new(Semaphore::new(p.clamp(1, Semaphore::MAX_PERMITS))),
            started: BTreeMap::new(),
            started_below: read_from,
        }
    }

    /// Whether partition `index` was started or skipped: the read-ahead only
    /// moves forward, so everything below the last partition started counts.
    pub(crate) fn is_started(&self, index: usize) -> bool {
        index < self.started_below
    }

    /// Starts fetching partition `index` with `fetch` unless it was started.
    pub(crate) fn start<F>(&mut self, index: usize, fetch: F)
    where
        F: Future<Output = Result<T>> + Send + 'static,
    {
        if self.is_started(index) {
            return;
        }
        let task = self.fetch_now(fetch);
        self.started.insert(index, task);
        self.started_below = index + 1;
    }

    /// A fetch outside the read-ahead (a partition asked for that was not
    /// started, or must be fetched again), under the same `p` permits; it
    /// marks `index` as started.
    pub(crate) fn fetch_asked<F>(&mut self, index: usize, fetch: F) -> Fetch<T>
    where
        F: Future<Output = Result<T>> + Send + 'static,
    {
        self.started_below = self.started_below.max(index + 1);
        self.fetch_now(fetch)
    }

    fn fetch_now<F>(&self, fetch: F) -> Fetch<T>
    where
        F: Future<Output = Result<T>> + Send + 'static,
    {
        let permits = Arc::clone(&self.permits);
        Fetch(spawn_on(&self.handle, async move {
            let _permit = permits
                .acquire_owned()
                .await
                .map_err(|_| Error::internal("the read-ahead's permits closed"))?;
            fetch.await
        }))
    }

    /// The fetch of partition `index`, if it was started and not taken.
    pub(crate) fn take(&mut self, index: usize) -> Option<Fetch<T>> {
        self.started.remove(&index)
    }

    /// Aborts the fetches of partitions below `index` (skipped by the reader).
    pub(crate) fn forget_below(&mut self, index: usize) {
        self.started = self.started.split_off(&index);
    }

    /// Aborts every fetch not taken.
    pub(crate) fn clear(&mut self) {
        self.started.clear();
    }

    /// Fetches started and not taken.
    pub(crate) fn pending(&self) -> usize {
        self.started.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    fn counting(
        running: &Arc<AtomicUsize>,
        most: &Arc<AtomicUsize>,
        value: usize,
    ) -> impl Future<Output = Result<usize>> + Send + 'static {
        let (running, most) = (Arc::clone(running), Arc::clone(most));
        async move {
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(5)).await;
            running.fetch_sub(1, Ordering::SeqCst);
            Ok(value)
        }
    }

    #[tokio::test]
    async fn at_most_p_fetches_run_and_each_partition_starts_once() {
        let (running, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let mut ahead = FetchAhead::new(Handle::current(), 2, 0);
        for i in 0..6 {
            ahead.start(i, counting(&running, &most, i));
        }
        // Started again: ignored (the value would differ).
        ahead.start(3, counting(&running, &most, 99));
        assert_eq!(ahead.pending(), 6);
        for i in 0..6 {
            let fetch = ahead.take(i).expect("started");
            assert_eq!(fetch.wait().await.expect("fetch"), i);
        }
        assert!(most.load(Ordering::SeqCst) <= 2, "{most:?} ran at once");
        assert!(ahead.take(3).is_none(), "taken already");
        assert!(ahead.is_started(5) && !ahead.is_started(6));
    }

    #[tokio::test]
    async fn dropped_fetches_are_aborted_and_the_mark_holds() {
        let done = Arc::new(AtomicUsize::new(0));
        let mut ahead = FetchAhead::new(Handle::current(), 4, 2);
        assert!(ahead.is_started(1), "below the mark counts as read");
        for i in 2..6 {
            let done = Arc::clone(&done);
            ahead.start(i, async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                done.fetch_add(1, Ordering::SeqCst);
                Ok(i)
            });
        }
        ahead.forget_below(4);
        assert_eq!(ahead.pending(), 2);
        ahead.clear();
        assert_eq!(ahead.pending(), 0);
        tokio::time::sleep(Duration::from_millis(120)).await;
        assert_eq!(
            done.load(Ordering::SeqCst),
            0,
            "aborted fetches never finish"
        );
        let asked = ahead.fetch_asked(9, async { Ok(9) });
        assert_eq!(asked.wait().await.expect("asked"), 9);
        assert!(ahead.is_started(8), "asking for 9 moves the mark past it");
    }
}
