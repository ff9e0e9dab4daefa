//! The stream of one `PrefetchExec` partition: pulls input rows, keeps the
//! window of their downloads in flight, and hands rows on (in input order, or
//! as they finish with `ordered = false`) once their files have local copies.
//!
//! Two separate bounds:
//! - the **window** counts requests actually outstanding: at most `window`
//!   rows are downloading at once. A row whose download finished never counts
//!   against it, so under `ordered = true` a slow object does not shrink the
//!   number of requests in flight behind it;
//! - the **reorder buffer** (`ordered = true` only, [`Reorder`]) holds rows
//!   that finished before their turn, bounded by bytes. When a new row would
//!   not fit, no new request starts until rows are handed on: **a full
//!   reorder buffer is the only backpressure on the window** (besides the
//!   memory pool below). The next row due always starts.
//!
//! What each input batch needs (rows to fetch, runs of local rows to read
//! ahead, or nothing when its files are read where they are) is decided in
//! `in_place.rs`.
//!
//! Other guarantees: the bytes of every row started and not yet handed on (in
//! flight or in the reorder buffer) are charged to the memory pool; when the
//! pool refuses, no new request starts until a row is handed on (one row always
//! proceeds, so a tiny pool slows the run but never stalls it); input is pulled
//! before a finished row is handed on whenever the window has room, so a burst
//! of finished rows never drains the window while input is ready; every
//! download is a task aborted when the stream is dropped; a download error is
//! returned in its row's turn under `ordered = true`.
//!
//! With a [`Handoff`] (a `MapExec` above that reorders its results itself), a
//! row that finished is handed on at once instead of waiting in the buffer,
//! with its position in the handoff; it still counts against the reorder bound
//! (unless it was the next row due) until the map settles it, a dropped row
//! (`on_error = skip`) is announced there, and an error still waits for its turn.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::array::RecordBatch;
use datafusion::error::Result as DfResult;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::execution::memory_pool::MemoryReservation;
use futures::StreamExt;
use futures::stream::FuturesUnordered;

use super::downloads::{Downloads, Fetch, Fetched};
use super::handoff::Handoff;
use super::in_place::{Direct, Needs, Pending, rows_to_fetch};
use super::reorder::{Reorder, cost_of};
use super::window::AutoWindow;
use crate::error::Error;
use crate::plan::memo::Memo;
use crate::runtime::spawn_on;
use crate::util::lock::lock;

/// Resolves when the operator above settles a row (never without a handoff).
async fn settled(handoff: &Option<Arc<Handoff>>) {
    match handoff {
        Some(h) => h.settled().await,
        None => std::future::pending().await,
    }
}

pub(super) struct PrefetchStream {
    pub(super) input: SendableRecordBatchStream,
    /// The checkpoint of the UDF above: rows it holds are not fetched.
    memo: Option<Arc<Memo>>,
    /// Whether `Downloads::prepare` ran (before the first row).
    pub(super) prepared: bool,
    pub(super) input_done: bool,
    /// Rows (or runs of local rows read ahead) not started yet, each with
    /// its files (decoded once per input batch).
    pub(super) rows: VecDeque<Pending>,
    /// The downloads in flight (never a finished one).
    pub(super) in_flight: FuturesUnordered<Fetch>,
    /// `ordered = true`: rows that finished before their turn.
    pub(super) reorder: Option<Reorder>,
    /// The seq of the next row (or run of rows) to start.
    pub(super) next_seq: u64,
    /// The input position of the next row to start.
    next_row: u64,
    /// Runs of rows whose files need no download, in input order, handed on
    /// as finished fetches (a whole input batch each).
    passed: VecDeque<Fetched>,
    /// Which stores' files are read where they are, not fetched first.
    direct: Direct,
    pub(super) window: usize,
    /// `prefetch = auto`: the policy that sizes `window`.
    pub(super) auto: Option<AutoWindow>,
    pub(super) reservation: MemoryReservation,
    pub(super) downloads: Arc<Downloads>,
    /// `ordered = true` with the UDF operator reordering: rows are handed on
    /// as they finish (see [`Handoff`]).
    pub(super) handoff: Option<Arc<Handoff>>,
    /// Bytes and count of the files of unknown size fetched so far: their
    /// mean is what the next such file is charged until its size is known.
    learned: (usize, usize),
}

impl PrefetchStream {
    /// A stream over `input`: in input order when `ordered`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        input: SendableRecordBatchStream,
        ordered: bool,
        window: usize,
        auto: Option<AutoWindow>,
        reservation: MemoryReservation,
        downloads: Arc<Downloads>,
        handoff: Option<Arc<Handoff>>,
        memo: Option<Arc<Memo>>,
        direct: Direct,
    ) -> Self {
        Self {
            memo,
            input,
            prepared: false,
            input_done: false,
            rows: VecDeque::new(),
            in_flight: FuturesUnordered::new(),
            reorder: ordered.then(Reorder::default),
            next_seq: 0,
            next_row: 0,
            passed: VecDeque::new(),
            direct,
            window,
            auto,
            reservation,
            downloads,
            handoff: handoff.filter(|_| ordered),
            learned: (0, 0),
        }
    }

    /// Starts rows while the window, the reorder buffer and the memory pool
    /// have room.
    fn fill(&mut self) {
        while self.in_flight.len() < self.window {
            let Some(Pending { files, .. }) = self.rows.front() else {
                break;
            };
            // A virtual file is charged its parent, the object downloaded; a
            // file of unknown size the mean of those fetched so far.
            let unsized_files = files.iter().filter(|f| !f.size_known()).count();
            let estimated = unsized_files * self.learned.0.div_ceil(self.learned.1.max(1));
            let bytes = estimated
                + files
                    .iter()
                    .map(|f| f.parent().size as usize)
                    .sum::<usize>();
            if let Some(r) = &self.reorder
                && !r.admits(self.next_seq, cost_of(bytes), self.window)
            {
                break; // the reorder buffer is full: wait for a row to be handed on
            }
            if self.reservation.try_grow(bytes).is_err() {
                if !self.in_flight.is_empty()
                    || self.reorder.as_ref().is_some_and(|r| r.head_ready())
                {
                    break; // the memory budget is spent: wait for a row to be handed on
                }
                self.reservation.grow(bytes);
            }
            let Some(pending) = self.rows.pop_front() else {
                break;
            };
            self.start(pending, bytes, (estimated, unsized_files));
        }
    }

    /// A row with files of unknown size finished: charges it what their
    /// first responses said instead of the estimate (the memory pool and the
    /// reorder bound), and learns their sizes for the next estimate.
    fn learn(&mut self, f: &mut Fetched) {
        if f.unsized_files == 0 {
            return;
        }
        self.learned.0 += f.learned;
        self.learned.1 += f.unsized_files;
        let actual = f.bytes - f.estimated + f.learned;
        if actual > f.bytes {
            self.reservation.grow(actual - f.bytes);
        } else {
            self.reservation.shrink(f.bytes - actual);
        }
        if let Some(r) = &mut self.reorder {
            r.resize(f.seq, cost_of(actual));
        }
        f.bytes = actual;
    }

    pub(super) async fn next(&mut self) -> Option<DfResult<RecordBatch>> {
        if !self.prepared {
            if let Err(e) = self.downloads.prepare().await {
                return Some(Err(e.into_df()));
            }
            self.prepared = true;
        }
        loop {
            if let (Some(h), Some(r)) = (&self.handoff, &mut self.reorder) {
                for seq in h.take_settled() {
                    r.settle(seq);
                }
            }
            self.fill();
            let head_ready = self.reorder.as_ref().is_some_and(|r| r.head_ready());
            // With a handoff, a row waiting for its turn (an error) is not out yet.
            let waiting =
                self.handoff.is_some() && self.reorder.as_ref().is_some_and(|r| !r.done.is_empty());
            if self.in_flight.is_empty()
                && !head_ready
                && !waiting
                && self.rows.is_empty()
                && self.passed.is_empty()
                && self.input_done
            {
                // Every row is out: the pin has no next member to serve.
                self.downloads.unpin();
                return None;
            }
            let want_input = !self.input_done
                && self.rows.is_empty()
                && self.passed.is_empty()
                && self.in_flight.len() < self.window;
            let waited = Instant::now();
            // Input first: a window with room and no rows to start must be
            // refilled before the next finished row is handed out, or a burst
            // of finished rows drains the window while input is ready.
            let done = tokio::select! {
                biased;
                batch = self.input.next(), if want_input => {
                    match batch {
                        Some(Ok(b)) => match rows_to_fetch(&b, self.memo.as_deref(), &self.downloads, self.direct) {
                            Ok(Needs::Fetch(rows)) => self.rows.extend(rows),
                            Ok(Needs::Nothing { files, bytes }) => self.pass(b, files, bytes),
                            Err(e) => return Some(Err(e)),
                        },
                        Some(Err(e)) => return Some(Err(e)),
                        None => self.input_done = true,
                    }
                    continue;
                }
                () = std::future::ready(()), if head_ready => None,
                () = std::future::ready(()), if !self.passed.is_empty() => self.passed.pop_front(),
                // A row settled above may make room in the reorder bound.
                () = settled(&self.handoff), if self.handoff.is_some() && self.reorder.as_ref().is_some_and(Reorder::pending) => continue,
                done = self.in_flight.next(), if !self.in_flight.is_empty() => {
                    self.downloads.metrics.udf_wait.add_duration(waited.elapsed());
                    match done {
                        Some(Ok(mut f)) => {
                            self.learn(&mut f);
                            Some(f)
                        }
                        Some(Err(panic)) => {
                            return Some(Err(Error::internal(format!("prefetch task {panic}")).into_df()));
                        }
                        None => continue,
                    }
                }
            };
            let fetched = match (&mut self.reorder, done) {
                (None, Some(f)) => f,
                (None, None) => continue,
                (Some(r), done) => {
                    match (done, &self.handoff) {
                        // Handed on now, settled by the operator above in its turn.
                        (Some(f), Some(h)) if matches!(f.row, Ok(Some(_))) => {
                            r.handed_early(f.seq, &self.downloads.metrics.reorder_peak_bytes);
                            h.returned(f.seq, f.base);
                            f
                        }
                        (Some(f), Some(h)) if matches!(f.row, Ok(None)) => {
                            r.settle(f.seq);
                            h.dropped(f.seq);
                            f
                        }
                        (Some(f), _) => {
                            r.finished(f, &self.downloads.metrics.reorder_peak_bytes);
                            match r.pop() {
                                Some(f) => f,
                                None => continue,
                            }
                        }
                        (None, _) => match r.pop() {
                            Some(f) => f,
                            None => continue,
                        },
                    }
                }
            };
            self.reservation.shrink(fetched.bytes);
            self.adapt();
            match fetched.row {
                Ok(Some(row)) => return Some(Ok(row)),
                Ok(None) => continue,
                Err(e) => return Some(Err(e)),
            }
        }
    }

    /// Hands `b` on whole, after the rows started before it: a finished
    /// fetch that needed no download (no bytes charged, nothing to release)
    /// of `files` files of `bytes` bytes, read where they are.
    fn pass(&mut self, b: RecordBatch, files: usize, bytes: usize) {
        self.downloads.metrics.files_in_place.add(files);
        self.downloads.metrics.bytes_in_place.add(bytes);
        let (seq, base) = (self.next_seq, self.next_row);
        self.next_seq += 1;
        self.next_row += b.num_rows() as u64;
        if let Some(r) = &mut self.reorder {
            r.started(seq, cost_of(0));
        }
        self.passed.push_back(Fetched {
            seq,
            base,
            row: Ok(Some(b)),
            bytes: 0,
            estimated: 0,
            unsized_files: 0,
            learned: 0,
        });
    }

    /// `prefetch = auto`: resizes the window after a row was taken (see
    /// [`AutoWindow`]); a fixed window never changes.
    fn adapt(&mut self) {
        let Some(auto) = &mut self.auto else {
            return;
        };
        let estimate = lock(&self.downloads.round_trip).get();
        // No download finished yet: keep the initial window.
        if let Some(rtt) = estimate {
            self.window = auto.taken(Instant::now(), rtt, self.window);
        }
    }

    fn start(
        &mut self,
        Pending {
            batch,
            files,
            ahead,
        }: Pending,
        bytes: usize,
        (estimated, unsized_files): (usize, usize),
    ) {
        let (seq, base) = (self.next_seq, self.next_row);
        self.next_seq += 1;
        self.next_row += batch.num_rows() as u64;
        if let Some(r) = &mut self.reorder {
            r.started(seq, cost_of(bytes));
        }
        let downloads = Arc::clone(&self.downloads);
        let task = spawn_on(&tokio::runtime::Handle::current(), async move {
            let (row, learned) = if ahead {
                let read = downloads.read_ahead(files).await;
                (read.map(|()| Some(batch)), 0)
            } else {
                downloads.fetch_row(batch, files).await
            };
            Fetched {
                seq,
                base,
                row,
                bytes,
                estimated,
                unsized_files,
                learned,
            }
        });
        self.in_flight.push(task);
    }
}
