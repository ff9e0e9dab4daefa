//! The trainer's stream over one epoch: partitions fetched `k` ahead, `p` at
//! once, cut into batches of `batch_size` rows.
//!
//! Guarantees:
//! - partitions are delivered in plan order; while the trainer reads
//!   partition i, partitions i+1..=i+k are fetched (or ready), at most `p` of
//!   them at once; `k = 0` fetches a partition when the previous one is used up;
//! - at most k + 1 partitions are held (the one being read and k ahead):
//!   partition i + k starts only when the trainer has moved past partition
//!   i - 1 and released it (the rows left over for the next batch, fewer than
//!   `batch_size`, are copied out first); each held partition is charged to
//!   the session's memory pool; the fetching is [`super::ahead::FetchAhead`];
//! - batches straddle partitions, shuffled or not: every batch has
//!   `batch_size` rows but the last of the epoch, which `drop_last` drops;
//! - a fetch error ends the stream with that error, after every row before it;
//! - dropping the stream aborts the fetches (tasks aborted on drop, nothing detached).

use std::collections::VecDeque;
use std::sync::Arc;

use datafusion::arrow::array::{RecordBatch, UInt64Array};
use datafusion::arrow::compute::{concat_batches, take_record_batch};
use datafusion::arrow::datatypes::SchemaRef;
use futures::stream::{BoxStream, StreamExt};

use super::ahead::FetchAhead;
use super::{EpochPlan, PartitionData, partition::fetch};
use crate::error::{Error, Result};

/// The batches of `plan`, `k` partitions ahead, `p` fetches at once.
pub(crate) fn epoch_stream(
    plan: EpochPlan,
    k: usize,
    p: usize,
    batch_size: usize,
    drop_last: bool,
) -> Result<BoxStream<'static, Result<RecordBatch>>> {
    let handle = tokio::runtime::Handle::try_current()
        .map_err(|e| Error::internal(format!("the loader's epoch needs a tokio runtime: {e}")))?;
    let schema = Arc::clone(&plan.schema);
    let mut state = State {
        plan: Arc::new(plan),
        ahead: FetchAhead::new(handle, p, 0),
        k,
        next: 0,
        queue: VecDeque::new(),
        held: None,
        carry: None,
        schema,
        batch_size: batch_size.max(1),
        drop_last,
        done: false,
    };
    // Partitions 0..=k start now, before the trainer asks.
    state.read_ahead();
    Ok(futures::stream::unfold(state, |mut s| async move {
        let item = s.next().await?;
        Some((item, s))
    })
    .boxed())
}

struct State {
    plan: Arc<EpochPlan>,
    ahead: FetchAhead<PartitionData>,
    k: usize,
    /// The next partition to read.
    next: usize,
    /// The batches of the partition being read, not yet cut.
    queue: VecDeque<RecordBatch>,
    /// The partition being read.
    held: Option<PartitionData>,
    /// Rows read but not yet delivered (fewer than `batch_size` between calls).
    carry: Option<RecordBatch>,
    schema: SchemaRef,
    batch_size: usize,
    drop_last: bool,
    done: bool,
}

impl State {
    /// Starts partitions `next..=next + k` not started yet: with the one being
    /// read, k + 1 held at most.
    fn read_ahead(&mut self) {
        let end =
            (self.plan.partitions.len()).min(self.next.saturating_add(self.k).saturating_add(1));
        for i in self.next..end {
            let plan = Arc::clone(&self.plan);
            self.ahead.start(i, async move { fetch(&plan, i).await });
        }
    }

    async fn next(&mut self) -> Option<Result<RecordBatch>> {
        if self.done {
            return None;
        }
        loop {
            if let Some(c) = &self.carry
                && c.num_rows() >= self.batch_size
            {
                let out = c.slice(0, self.batch_size);
                let rest = c.slice(self.batch_size, c.num_rows() - self.batch_size);
                self.carry = (rest.num_rows() > 0).then_some(rest);
                return Some(Ok(out));
            }
            if let Some(b) = self.queue.pop_front() {
                if let Err(e) = self.push(b) {
                    return self.fail(e);
                }
                continue;
            }
            // The partition being read is used up: copy the leftover rows out
            // of it, then release it.
            if self.held.is_some() {
                if let Some(c) = self.carry.take() {
                    let all = UInt64Array::from_iter_values(0..c.num_rows() as u64);
                    match take_record_batch(&c, &all) {
                        Ok(copy) => self.carry = Some(copy),
                        Err(e) => {
                            return self
                                .fail(Error::from(datafusion::error::DataFusionError::from(e)));
                        }
                    }
                }
                self.held = None;
            }
            if self.next >= self.plan.partitions.len() {
                self.done = true;
                let rest = self.carry.take()?;
                return (!self.drop_last).then_some(Ok(rest));
            }
            self.read_ahead();
            let index = self.next;
            self.next += 1;
            let Some(fetch) = self.ahead.take(index) else {
                return self.fail(Error::internal(format!(
                    "loader partition {index} was never started"
                )));
            };
            match fetch.wait().await {
                Ok(mut data) => {
                    self.queue = std::mem::take(&mut data.batches).into();
                    self.held = Some(data);
                }
                Err(e) => return self.fail(e),
            }
        }
    }

    fn push(&mut self, b: RecordBatch) -> Result<()> {
        if b.num_rows() == 0 {
            return Ok(());
        }
        self.carry = Some(match self.carry.take() {
            None => b,
            Some(c) => concat_batches(&self.schema, [&c, &b])
                .map_err(|e| Error::from(datafusion::error::DataFusionError::from(e)))?,
        });
        Ok(())
    }

    fn fail(&mut self, e: Error) -> Option<Result<RecordBatch>> {
        self.done = true;
        self.queue.clear();
        self.held = None;
        self.ahead.clear();
        Some(Err(e))
    }
}
