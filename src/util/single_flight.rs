//! Single flight per key, in process: callers that [`SingleFlight::join`] the
//! same key take turns (one async mutex per key), so of many readers of one
//! missing object only the first fetches it and the others find its result.
//!
//! Guarantees: at most one holder of a key's turn at a time; a key's map entry
//! lives exactly as long as someone has joined it (removed when its last
//! [`Flight`] is dropped, a cancelled waiter included), so the map holds only
//! keys in use. Turns are granted in FIFO order (tokio's fair mutex).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::util::lock::lock;

/// The keys being worked on, each with its turn.
#[derive(Debug, Default)]
pub(crate) struct SingleFlight {
    keys: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl SingleFlight {
    /// Joins `key`'s queue; wait for the turn with [`Flight::turn`].
    pub(crate) fn join(&self, key: &str) -> Flight<'_> {
        let mut keys = lock(&self.keys);
        let mutex = Arc::clone(keys.entry(key.to_string()).or_default());
        Flight {
            owner: self,
            key: key.to_string(),
            mutex,
        }
    }

    /// Runs `work` in `key`'s turn.
    ///
    /// # Cancel safety
    /// Dropping the future leaves the queue (or ends the turn) at once.
    pub(crate) async fn run<T>(&self, key: &str, work: impl AsyncFnOnce() -> T) -> T {
        let flight = self.join(key);
        let _turn = flight.turn().await;
        work().await
    }

    /// Keys someone has joined (for tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        lock(&self.keys).len()
    }
}

/// One caller's place in a key's queue.
pub(crate) struct Flight<'a> {
    owner: &'a SingleFlight,
    key: String,
    mutex: Arc<tokio::sync::Mutex<()>>,
}

impl Flight<'_> {
    /// Waits for this key's turn; the turn ends when the guard is dropped.
    pub(crate) async fn turn(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.mutex.lock().await
    }
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        let mut keys = lock(&self.owner.keys);
        // Clones are made only under the map's lock, so 2 (the map's and ours)
        // means nobody else has joined.
        if Arc::strong_count(&self.mutex) == 2
            && keys
                .get(&self.key)
                .is_some_and(|m| Arc::ptr_eq(m, &self.mutex))
        {
            keys.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[tokio::test]
    async fn one_caller_at_a_time_per_key_and_the_map_empties() {
        let flights = Arc::new(SingleFlight::default());
        let (inside, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let (flights, inside, most) = (flights.clone(), inside.clone(), most.clone());
                tokio::spawn(async move {
                    flights
                        .run("k", async || {
                            let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                            most.fetch_max(now, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(2)).await;
                            inside.fetch_sub(1, Ordering::SeqCst);
                        })
                        .await
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("task");
        }
        assert_eq!(most.load(Ordering::SeqCst), 1);
        assert_eq!(flights.len(), 0);
    }

    #[tokio::test]
    async fn a_cancelled_waiter_leaves_no_entry_behind() {
        let flights = SingleFlight::default();
        let first = flights.join("k");
        let turn = first.turn().await;
        let waiter = tokio::time::timeout(Duration::from_millis(10), flights.run("k", async || ()));
        assert!(waiter.await.is_err(), "the waiter must still be waiting");
        assert_eq!(flights.len(), 1);
        drop(turn);
        drop(first);
        assert_eq!(flights.len(), 0);
        // Other keys never wait on each other.
        let _a = flights.join("a");
        let _held = _a.turn().await;
        flights.run("b", async || ()).await;
    }
}
