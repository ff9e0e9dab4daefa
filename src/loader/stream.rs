//! The trainer's stream over one epoch: partitions fetched `k` ahead, `p` at
//! once, cut into batches of `batch_size` rows.
//!
//! Guarantees:
//! - partitions are delivered in plan order; while the trainer reads
//!   partition i, partitions i+1..=i+k are fetched (or ready), at most `p` of
//!   them at once; `k = 0` fetches a partition when the previous one is used up;
//! - at most k + 1 partitions are held (the one being read and k ahead): a
//!   partition's slot is taken before its fetch starts and released when the
//!   trainer has moved past it (the rows left over for the next batch, fewer
//!   than `batch_size`, are copied out first); each held partition is charged
//!   to the session's memory pool;
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
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use super::{EpochPlan, PartitionData, fetch::fetch};
use crate::error::{Error, Result};
use crate::runtime::{PoolTask, spawn_on};

type Fetched = PoolTask<Result<(PartitionData, OwnedSemaphorePermit)>>;

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
    let (tx, rx) = mpsc::unbounded_channel::<Fetched>();
    let schema = Arc::clone(&plan.schema);
    let plan = Arc::new(plan);
    // Slots bound what is held (k + 1 partitions), permits what is fetched at once.
    let slots = Arc::new(Semaphore::new(
        k.saturating_add(1).min(Semaphore::MAX_PERMITS),
    ));
    let permits = Arc::new(Semaphore::new(p.max(1)));
    let spawner = handle.clone();
    let driver = spawn_on(&handle, async move {
        for i in 0..plan.partitions.len() {
            let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
                return;
            };
            let Ok(permit) = Arc::clone(&permits).acquire_owned().await else {
                return;
            };
            let plan = Arc::clone(&plan);
            let task = spawn_on(&spawner, async move {
                let data = fetch(&plan, i).await;
                drop(permit);
                data.map(|d| (d, slot))
            });
            if tx.send(task).is_err() {
                return;
            }
        }
    });
    let state = State {
        rx,
        _driver: driver,
        queue: VecDeque::new(),
        held: None,
        carry: None,
        schema,
        batch_size: batch_size.max(1),
        drop_last,
        done: false,
    };
    Ok(futures::stream::unfold(state, |mut s| async move {
        let item = s.next().await?;
        Some((item, s))
    })
    .boxed())
}

struct State {
    rx: mpsc::UnboundedReceiver<Fetched>,
    _driver: PoolTask<()>,
    /// The batches of the partition being read, not yet cut.
    queue: VecDeque<RecordBatch>,
    /// The partition being read and its slot.
    held: Option<(PartitionData, OwnedSemaphorePermit)>,
    /// Rows read but not yet delivered (fewer than `batch_size` between calls).
    carry: Option<RecordBatch>,
    schema: SchemaRef,
    batch_size: usize,
    drop_last: bool,
    done: bool,
}

impl State {
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
            // of it, then release it and its slot.
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
            match self.rx.recv().await {
                Some(task) => match task.await {
                    Ok(Ok((mut data, slot))) => {
                        self.queue = std::mem::take(&mut data.batches).into();
                        self.held = Some((data, slot));
                    }
                    Ok(Err(e)) => return self.fail(e),
                    Err(msg) => {
                        return self.fail(Error::internal(format!("loader fetch task {msg}")));
                    }
                },
                None => {
                    self.done = true;
                    let rest = self.carry.take()?;
                    return (!self.drop_last).then_some(Ok(rest));
                }
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
        Some(Err(e))
    }
}
