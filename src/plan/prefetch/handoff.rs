//! [`Handoff`]: `ordered = true` without head-of-line blocking at the UDF. A
//! `PrefetchExec` whose `MapExec` above asks for it hands each row on as soon
//! as its download finishes (in completion order), telling the operator the
//! row's position in the input; the operator runs its UDF on it at once and
//! puts the results back in input order before emitting them, then settles
//! the row here.
//!
//! Positions are the prefetch's own order of what it hands on: one per row it
//! downloads, one per run of rows whose files needed none (handed on whole).
//!
//! Guarantees: every batch the stream returns has its position pushed just
//! before it is returned, so the operator, which reads the stream directly,
//! pairs each batch with its position by taking them in the same order; a row
//! the prefetch drops (`on_error = skip`) is announced so the operator does not
//! wait for it; a row handed on counts against the prefetch's reorder bound
//! (see `stream.rs`) until the operator settles it, so finished rows waiting
//! for their turn, before or after their UDF call, stay within the same bytes;
//! a settled row wakes the prefetch, which may then start new requests.

use std::collections::{BTreeSet, VecDeque};
use std::sync::Mutex;

use crate::util::lock::lock;
use tokio::sync::Notify;

#[derive(Default)]
pub struct Handoff {
    state: Mutex<State>,
    settled: Notify,
}

#[derive(Default)]
struct State {
    /// Places (and input positions of their first rows) of the batches
    /// returned and not yet taken by the operator.
    returned: VecDeque<(u64, u64)>,
    /// Rows the prefetch dropped, not yet passed over by the operator.
    dropped: BTreeSet<u64>,
    /// Rows the operator is done with, not yet seen by the prefetch.
    settled: Vec<u64>,
}

impl Handoff {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// The prefetch is about to return its batch number `seq`, whose first
    /// row is row `base` of its input.
    pub(super) fn returned(&self, seq: u64, base: u64) {
        self.state().returned.push_back((seq, base));
    }

    /// The prefetch dropped row `seq`: it never comes.
    pub(super) fn dropped(&self, seq: u64) {
        self.state().dropped.insert(seq);
    }

    /// The rows settled since the last call.
    pub(super) fn take_settled(&self) -> Vec<u64> {
        std::mem::take(&mut self.state().settled)
    }

    /// Resolves once a row was settled since the last time it resolved.
    pub(super) async fn settled(&self) {
        self.settled.notified().await;
    }

    /// The place in the prefetch's order of the batch the operator just
    /// received from the stream (one row, or a run of rows whose files needed
    /// no download), and the input position of its first row.
    pub fn take_seq(&self) -> Option<(u64, u64)> {
        self.state().returned.pop_front()
    }

    /// Whether row `seq` was dropped by the prefetch (then the operator moves
    /// past it; asked once per row).
    pub fn passes(&self, seq: u64) -> bool {
        self.state().dropped.remove(&seq)
    }

    /// The operator is done with row `seq` (emitted it, dropped it, or failed).
    pub fn settle(&self, seq: u64) {
        self.state().settled.push(seq);
        self.settled.notify_one();
    }
}

#[cfg(test)]
impl Handoff {
    /// For tests of the operator side: the prefetch dropped row `seq`.
    pub fn dropped_for_test(&self, seq: u64) {
        self.dropped(seq);
    }

    /// For tests of the operator side: the rows settled so far.
    pub fn settled_for_test(&self) -> Vec<u64> {
        self.take_settled()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_pair_in_order_and_settling_wakes_the_prefetch() {
        let h = Handoff::default();
        h.returned(3, 30);
        h.returned(1, 10);
        h.dropped(2);
        assert_eq!(
            (h.take_seq(), h.take_seq(), h.take_seq()),
            (Some((3, 30)), Some((1, 10)), None)
        );
        assert!(h.passes(2));
        assert!(!h.passes(2), "passed over once");
        h.settle(1);
        h.settle(3);
        assert_eq!(h.take_settled(), vec![1, 3]);
        assert!(h.take_settled().is_empty());
        // The notification is kept for the next wait.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        rt.block_on(async {
            tokio::time::timeout(std::time::Duration::from_secs(5), h.settled())
                .await
                .expect("woken");
        });
    }
}
