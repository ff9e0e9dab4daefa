//! [`InOrder`]: puts the results of calls that ran as their rows' downloads
//! finished (see `prefetch::Handoff`) back in input order.
//!
//! Guarantees: results are emitted in input position order, each as soon as
//! every earlier row was emitted or is known to have been dropped by the
//! prefetch; the input of results is polled only while the next result due is
//! missing (never ahead of the consumer's demand for a result that is ready);
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

use super::prefetch::Handoff;

pub struct InOrder<T> {
    results: Fuse<BoxStream<'static, (Option<u64>, DfResult<T>)>>,
    /// The position of the next result due.
    next: u64,
    /// Results that came before their turn, by position.
    ready: BTreeMap<u64, DfResult<T>>,
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
