//! The stream of one `PrefetchExec` partition: pulls input rows, keeps the
//! window of their downloads in flight, and hands rows on (in input order, or
//! as they finish with `ordered = false`) once their files have local copies.
//!
//! Guarantees: at most `window` rows are downloading or downloaded-but-not-taken;
//! their bytes are charged to the memory pool (one row always proceeds, so a
//! tiny pool slows the run but never stalls it); input is pulled before a
//! finished row is handed on whenever the window has room, so a burst of
//! finished rows never drains the window while input is ready; every download
//! is a task aborted when the stream is dropped.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::array::RecordBatch;
use datafusion::error::Result as DfResult;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::execution::memory_pool::MemoryReservation;
use futures::StreamExt;
use futures::stream::{FuturesOrdered, FuturesUnordered};
use udfchain_udfs::{File, decode_column};

use super::fetch::Downloads;
use super::window::AutoWindow;
use crate::error::Error;
use crate::plan::batches::slices;
use crate::runtime::{PoolTask, spawn_on};

/// A finished fetch of one row.
pub(super) struct Fetched {
    /// The row, `None` if skipped.
    row: DfResult<Option<RecordBatch>>,
    /// Bytes charged to the memory pool for it.
    bytes: usize,
}

pub(super) type Fetch = PoolTask<Fetched>;

pub(super) enum Queue {
    Ordered(FuturesOrdered<Fetch>),
    Unordered(FuturesUnordered<Fetch>),
}

impl Queue {
    pub(super) fn push(&mut self, f: Fetch) {
        match self {
            Self::Ordered(q) => q.push_back(f),
            Self::Unordered(q) => q.push(f),
        }
    }

    pub(super) fn len(&self) -> usize {
        match self {
            Self::Ordered(q) => q.len(),
            Self::Unordered(q) => q.len(),
        }
    }

    pub(super) async fn next(&mut self) -> Option<Result<Fetched, String>> {
        match self {
            Self::Ordered(q) => q.next().await,
            Self::Unordered(q) => q.next().await,
        }
    }
}

impl Queue {
    pub(super) fn new(ordered: bool) -> Self {
        if ordered {
            Self::Ordered(FuturesOrdered::new())
        } else {
            Self::Unordered(FuturesUnordered::new())
        }
    }
}

pub(super) struct PrefetchStream {
    pub(super) input: SendableRecordBatchStream,
    /// Whether `Downloads::prepare` ran (before the first row).
    pub(super) prepared: bool,
    pub(super) input_done: bool,
    /// Rows not started yet, each with its files (decoded once per input batch).
    pub(super) rows: VecDeque<(RecordBatch, Vec<File>)>,
    pub(super) queue: Queue,
    pub(super) window: usize,
    /// `prefetch = auto`: the policy that sizes `window`.
    pub(super) auto: Option<AutoWindow>,
    pub(super) reservation: MemoryReservation,
    pub(super) shared: Arc<Downloads>,
}

impl PrefetchStream {
    pub(super) async fn next(&mut self) -> Option<DfResult<RecordBatch>> {
        if !self.prepared {
            if let Err(e) = self.shared.prepare().await {
                return Some(Err(e.into_df()));
            }
            self.prepared = true;
        }
        loop {
            while self.queue.len() < self.window {
                let Some((_, files)) = self.rows.front() else {
                    break;
                };
                // A virtual file is charged its parent, the object downloaded.
                let bytes = files.iter().map(|f| f.parent().size as usize).sum();
                if self.reservation.try_grow(bytes).is_err() {
                    if self.queue.len() > 0 {
                        break; // the memory budget is spent: wait for a row to be taken
                    }
                    self.reservation.grow(bytes);
                }
                let Some((row, files)) = self.rows.pop_front() else {
                    break;
                };
                self.start(row, files, bytes);
            }
            if self.queue.len() == 0 && self.rows.is_empty() && self.input_done {
                // Every row is out: the pin has no next member to serve.
                self.shared.unpin();
                return None;
            }
            let want_input =
                !self.input_done && self.rows.is_empty() && self.queue.len() < self.window;
            let waited = Instant::now();
            // Input first: a window with room and no rows to start must be
            // refilled before the next finished row is handed out, or a burst
            // of finished rows drains the window while input is ready.
            tokio::select! {
                biased;
                batch = self.input.next(), if want_input => match batch {
                    Some(Ok(b)) => match rows_with_files(&b, &self.shared.file_cols) {
                        Ok(rows) => self.rows.extend(rows),
                        Err(e) => return Some(Err(e)),
                    },
                    Some(Err(e)) => return Some(Err(e)),
                    None => self.input_done = true,
                },
                done = self.queue.next(), if self.queue.len() > 0 => {
                    let wait = waited.elapsed();
                    self.shared.metrics.udf_wait.add_duration(wait);
                    if let Some(Ok(f)) = &done {
                        self.reservation.shrink(f.bytes);
                        self.adapt();
                    }
                    match done {
                        Some(Ok(Fetched { row: Ok(Some(row)), .. })) => return Some(Ok(row)),
                        Some(Ok(Fetched { row: Ok(None), .. })) => continue,
                        Some(Ok(Fetched { row: Err(e), .. })) => return Some(Err(e)),
                        Some(Err(panic)) => return Some(Err(Error::internal(format!("prefetch task {panic}")).into_df())),
                        None => continue,
                    }
                }
            }
        }
    }

    /// `prefetch = auto`: resizes the window after a row was taken (see
    /// [`AutoWindow`]); a fixed window never changes.
    fn adapt(&mut self) {
        let Some(auto) = &mut self.auto else {
            return;
        };
        let estimate = self
            .shared
            .round_trip
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get();
        // No download finished yet: keep the initial window.
        if let Some(rtt) = estimate {
            self.window = auto.taken(Instant::now(), rtt, self.window);
        }
    }

    fn start(&mut self, row: RecordBatch, files: Vec<File>, bytes: usize) {
        let shared = Arc::clone(&self.shared);
        let task = spawn_on(&tokio::runtime::Handle::current(), async move {
            let row = shared.fetch_row(row, files).await;
            Fetched { row, bytes }
        });
        self.queue.push(task);
    }
}

/// The rows of `batch`, one-row batches each with the non-null `File`s of its
/// `file_cols` (every column decoded once for the whole batch).
pub(super) fn rows_with_files(
    batch: &RecordBatch,
    file_cols: &[usize],
) -> DfResult<Vec<(RecordBatch, Vec<File>)>> {
    let mut columns = Vec::with_capacity(file_cols.len());
    for &c in file_cols {
        let files: Vec<Option<File>> = decode_column(batch.column(c)).map_err(|e| {
            Error::internal(format!("a File column the planner checked: {e}")).into_df()
        })?;
        columns.push(files);
    }
    Ok(slices(batch, 1)
        .into_iter()
        .enumerate()
        .map(|(i, row)| {
            let files = columns.iter().filter_map(|c| c[i].clone()).collect();
            (row, files)
        })
        .collect())
}
