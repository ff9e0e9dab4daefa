//! [`InOrder`]: puts the results of calls that ran as their rows' downloads
//! finished (see `prefetch::Handoff`) back in input order.
//!
//! Guarantees: results are emitted in input position order, each as soon as
//! every earlier row was emitted or is known to have been dropped by the
//! prefetch; the results below are polled once per result asked for, and
//! until the next one due is there, as `buffered` does (so the calls and the
//! prefetch below go on while a burst of results that waited behind a stalled
//! row is emitted, and nothing runs ahead of what `parallel` calls and the
//! prefetch's reorder bound allow);
//! every row emitted is settled in the [`Handoff`], so the prefetch below
//! counts it against its reorder bound until then; an error without a
//! position (from the input) is emitted at once.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use datafusion::error::Result as DfResult;
use futures::stream::{BoxStream, Fuse};
use futures::{Stream, StreamExt};

use crate::plan::prefetch::Handoff;

pub struct InOrder<T> {
    results: Fuse<BoxStream<'static, (Option<u64>, DfResult<T>)>>,
    /// The position of the next result due.
    next: u64,
    /// Results that came before their turn, by position.
    ready: BTreeMap<u64, DfResult<T>>,
    /// An error without a position taken while a result was due: next out.
    unplaced: Option<DfResult<T>>,
    handoff: Arc<Handoff>,
}

impl<T> InOrder<T> {
    pub fn new(
        results: BoxStream<'static, (Option<u64>, DfResult<T>)>,
        handoff: Arc<Handoff>,
    ) -> Self {
        Self {
            results: results.fuse(),
            next: 0,
            ready: BTreeMap::new(),
            unplaced: None,
            handoff,
        }
    }

    fn emit(&mut self, seq: u64, done: DfResult<T>) -> Poll<Option<DfResult<T>>> {
        self.handoff.settle(seq);
        self.next = seq + 1;
        Poll::Ready(Some(done))
    }
}

// Never pin-projected: the results are moved out of the map.
impl<T> Unpin for InOrder<T> {}

impl<T> Stream for InOrder<T> {
    type Item = DfResult<T>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if let Some(done) = this.unplaced.take() {
            return Poll::Ready(Some(done));
        }
        if this.ready.contains_key(&this.next) {
            // Keep the calls and the prefetch below going (see the header).
            match this.results.poll_next_unpin(cx) {
                Poll::Ready(Some((Some(seq), done))) => {
                    this.ready.insert(seq, done);
                }
                Poll::Ready(Some((None, done))) => this.unplaced = Some(done),
                Poll::Ready(None) | Poll::Pending => {}
            }
        }
        loop {
            if let Some(done) = this.ready.remove(&this.next) {
                return this.emit(this.next, done);
            }
            if this.handoff.passes(this.next) {
                this.next += 1;
                continue;
            }
            match this.results.poll_next_unpin(cx) {
                Poll::Ready(Some((Some(seq), done))) => {
                    this.ready.insert(seq, done);
                }
                Poll::Ready(Some((None, done))) => return Poll::Ready(Some(done)),
                // Only rows behind a gap no drop announced are left: in order.
                Poll::Ready(None) => {
                    return match this.ready.pop_first() {
                        Some((seq, done)) => this.emit(seq, done),
                        None => Poll::Ready(None),
                    };
                }
                Poll::Pending => {
                    if this.handoff.passes(this.next) {
                        this.next += 1;
                        continue;
                    }
                    return Poll::Pending;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::error::DataFusionError;

    #[test]
    fn results_come_out_in_input_order_past_dropped_rows_and_are_settled() {
        let handoff = Arc::new(Handoff::default());
        // Row 2 was dropped by the prefetch; the calls finished as 3, 1, 0, 4.
        handoff.dropped_for_test(2);
        let results: Vec<(Option<u64>, DfResult<u64>)> = vec![
            (Some(3), Ok(3)),
            (Some(1), Ok(1)),
            (Some(0), Ok(0)),
            (Some(4), Ok(4)),
        ];
        let stream = InOrder::new(futures::stream::iter(results).boxed(), Arc::clone(&handoff));
        let out: Vec<u64> = futures::executor::block_on(stream.map(|r| r.expect("ok")).collect());
        assert_eq!(out, vec![0, 1, 3, 4]);
        let mut settled = handoff.settled_for_test();
        settled.sort_unstable();
        assert_eq!(settled, vec![0, 1, 3, 4], "every emitted row is settled");
    }

    #[test]
    fn an_error_without_a_position_is_emitted_at_once() {
        let handoff = Arc::new(Handoff::default());
        let results: Vec<(Option<u64>, DfResult<u64>)> = vec![
            (Some(1), Ok(1)),
            (None, Err(DataFusionError::Execution("input".into()))),
            (Some(0), Ok(0)),
        ];
        let stream = InOrder::new(futures::stream::iter(results).boxed(), handoff);
        let out: Vec<String> = futures::executor::block_on(
            stream
                .map(|r| r.map_or_else(|e| e.to_string(), |v| v.to_string()))
                .collect(),
        );
        assert_eq!(out.len(), 3);
        assert!(out[0].contains("input"), "{out:?}");
        assert_eq!(&out[1..], ["0", "1"]);
    }
}
