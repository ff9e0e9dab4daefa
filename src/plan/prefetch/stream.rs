//! The stream of one `PrefetchExec` partition: pulls input rows, keeps the
//! window of their downloads in flight, and hands rows on (in input order, or
//! as they finish with `ordered = false`) once their files have local copies.
//!
//! Two separate bounds:
//! - the **window** counts requests actually outstanding: at most `window`
//!   rows are downloading at once. A row whose download finished never counts
//!   against it, so under `ordered = true` a slow object does not shrink the
//!   number of requests in flight behind it;
//! - the **reorder buffer** (`ordered = true` only) holds rows that finished
//!   before their turn. It is bounded by bytes: the file bytes of the rows it
//!   holds, plus those of the rows in flight that may land in it (every row in
//!   flight but the next one due), stay within [`REORDER_WINDOWS`] times the
//!   window times the mean bytes of a row started so far (each row counting at
//!   least one byte), capped at [`REORDER_MAX_BYTES`] (or two windows' bytes
//!   when those are more). When a new row would not fit, no new request starts until
//!   rows are handed on: **a full reorder buffer is the only backpressure on
//!   the window** (besides the memory pool below). The next row due always
//!   starts, so a single row larger than the bound still proceeds; the buffer's
//!   peak is the `reorder_peak_bytes` metric.
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

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::UInt64Type;
use datafusion::error::Result as DfResult;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::execution::memory_pool::MemoryReservation;
use datafusion::physical_plan::metrics::Gauge;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use udfchain_udfs::File;

use super::downloads::Downloads;
use super::handoff::Handoff;
use super::window::AutoWindow;
use crate::cache::{Reach, StoreSource};
use crate::error::Error;
use crate::plan::memo::Memo;
use crate::plan::row_slices::slices;
use crate::runtime::{PoolTask, spawn_on};
use crate::util::lock::lock;

/// The reorder buffer may hold this many windows' worth of bytes: with a
/// window sized for the mean round trip (~30 ms under the bench's tail model),
/// 32 windows keep requests going through a 1 s stall of the row due. Four
/// windows held them for ~0.1 s of it, and ordered output lost most of each
/// stall to unordered output. The memory pool caps it like every prefetched byte.
pub(super) const REORDER_WINDOWS: usize = 32;

/// ... but no more than this many bytes once the window's own bytes are met
/// (DataFusion's default memory pool is unbounded): at the default
/// `max_connections` of 128 and rows of 256 KiB, 32 windows would be 1 GiB.
/// 256 MiB is still 32 windows of 64 KiB rows at 128 in flight; a window whose
/// own rows are larger keeps twice its bytes.
pub(super) const REORDER_MAX_BYTES: usize = 256 << 20;

/// A finished fetch of one row, or a run of rows that needed none.
pub(super) struct Fetched {
    /// Its place in the order of what this stream hands on.
    seq: u64,
    /// The position of its first row in the partition's input.
    base: u64,
    /// The row, `None` if skipped.
    row: DfResult<Option<RecordBatch>>,
    /// Bytes charged to the memory pool for it.
    bytes: usize,
    /// Of `bytes`, what was estimated for files of unknown size (named by
    /// URL), and how many such files the row has.
    estimated: usize,
    unsized_files: usize,
    /// The sizes the first responses gave those files.
    learned: usize,
}

pub(super) type Fetch = PoolTask<Fetched>;

/// `ordered = true`: the rows that finished before their turn.
#[derive(Default)]
pub(super) struct Reorder {
    /// The seq of the next row to hand on.
    next: u64,
    /// Finished rows by seq, each with the bytes it counts in `bytes` (0 for
    /// a row that finished in its turn).
    done: BTreeMap<u64, (Fetched, usize)>,
    /// Bytes (at least one per row) of the rows in `done`.
    bytes: usize,
    /// Bytes of each row in flight, by seq.
    in_flight: BTreeMap<u64, usize>,
    /// Sum of `in_flight`.
    in_flight_bytes: usize,
    /// Bytes and rows started so far (for the mean row size).
    started_bytes: usize,
    started_rows: usize,
    /// With a [`Handoff`]: rows handed on before their turn, by seq, with the
    /// bytes they count in `bytes` until the operator above settles them.
    out: BTreeMap<u64, usize>,
    /// With a [`Handoff`]: rows after `next` that are done with (settled by
    /// the operator above, or dropped).
    settled: BTreeSet<u64>,
}

impl Reorder {
    /// Bytes the buffer may come to hold: what it holds plus every row in
    /// flight except the next one due (handed on as soon as it finishes).
    fn committed(&self) -> usize {
        self.bytes + self.in_flight_bytes - self.in_flight.get(&self.next).copied().unwrap_or(0)
    }

    /// The bound on `committed` for a window of `window` rows.
    fn limit(&self, window: usize) -> usize {
        let mean = self.started_bytes.div_ceil(self.started_rows.max(1)).max(1);
        let windows = REORDER_WINDOWS.saturating_mul(window).saturating_mul(mean);
        windows.min(REORDER_MAX_BYTES.max(window.saturating_mul(mean).saturating_mul(2)))
    }

    /// Whether row `seq` of `cost` bytes may start now.
    fn admits(&self, seq: u64, cost: usize, window: usize) -> bool {
        seq == self.next || self.committed() + cost <= self.limit(window)
    }

    fn started(&mut self, seq: u64, cost: usize) {
        self.in_flight.insert(seq, cost);
        self.in_flight_bytes += cost;
        self.started_bytes += cost;
        self.started_rows += 1;
    }

    /// Row `seq`, still in flight, turned out to cost `cost` (its files'
    /// sizes learned from their first responses).
    fn resize(&mut self, seq: u64, cost: usize) {
        if let Some(old) = self.in_flight.insert(seq, cost) {
            self.in_flight_bytes = self.in_flight_bytes - old + cost;
            self.started_bytes = self.started_bytes - old + cost;
        }
    }

    /// A row finished: into the buffer (its turn comes out of `pop`).
    fn finished(&mut self, f: Fetched, peak: &Gauge) {
        let mut counted = 0;
        if let Some(cost) = self.in_flight.remove(&f.seq) {
            self.in_flight_bytes -= cost;
            if f.seq != self.next {
                counted = cost;
                self.bytes += cost;
                peak.set_max(self.bytes);
            }
        }
        self.done.insert(f.seq, (f, counted));
    }

    /// The next row due, if it finished.
    fn pop(&mut self) -> Option<Fetched> {
        let (f, counted) = self.done.remove(&self.next)?;
        self.next += 1;
        self.bytes -= counted;
        Some(f)
    }

    fn head_ready(&self) -> bool {
        self.done.contains_key(&self.next)
    }

    /// With a [`Handoff`]: row `seq` is handed on as it finished; unless it
    /// is the next row due, it counts in `bytes` until settled (as it would
    /// waiting in `done`).
    fn handed_early(&mut self, seq: u64, peak: &Gauge) {
        if let Some(cost) = self.in_flight.remove(&seq) {
            self.in_flight_bytes -= cost;
            let counted = if seq == self.next { 0 } else { cost };
            self.bytes += counted;
            peak.set_max(self.bytes);
            self.out.insert(seq, counted);
        }
    }

    /// With a [`Handoff`]: row `seq` was dropped here or settled above.
    fn settle(&mut self, seq: u64) {
        if let Some(cost) = self.in_flight.remove(&seq) {
            self.in_flight_bytes -= cost;
        }
        if let Some(cost) = self.out.remove(&seq) {
            self.bytes -= cost;
        }
        if seq >= self.next {
            self.settled.insert(seq);
        }
        while self.settled.remove(&self.next) {
            self.next += 1;
        }
    }

    /// Whether rows were handed on early and not settled yet, or wait.
    fn pending(&self) -> bool {
        !self.out.is_empty() || !self.done.is_empty()
    }
}

/// Resolves when the operator above settles a row (never without a handoff).
async fn settled(handoff: &Option<Arc<Handoff>>) {
    match handoff {
        Some(h) => h.settled().await,
        None => std::future::pending().await,
    }
}

/// What a row counts against the reorder bound: its file bytes, at least one.
fn cost_of(bytes: usize) -> usize {
    bytes.max(1)
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
                        Some(Ok(b)) => match self.rows_to_fetch(&b) {
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

    /// The rows of `b` with the files to fetch for each: none for a row whose
    /// result the UDF's checkpoint already holds (its UDF makes no call), nor
    /// for a file read where it is (see [`Direct`]). When no row has a file
    /// to fetch, `b` is handed on whole (and never cut into rows).
    fn rows_to_fetch(&self, b: &RecordBatch) -> DfResult<Needs> {
        let no_memo = self.memo.as_ref().is_none_or(|m| m.kept() == 0);
        if let Some((files, bytes)) = no_memo.then(|| self.all_in_place(b)).flatten() {
            return Ok(Needs::Nothing { files, bytes });
        }
        let mut files = files_by_row(b, &self.downloads.file_cols)?;
        if let Some(memo) = self.memo.as_ref().filter(|m| m.kept() > 0) {
            for (files, key) in files.iter_mut().zip(memo.keys(b)?) {
                if memo.contains(&key) {
                    files.clear();
                }
            }
        }
        // One pass over the files: whether all are read where they are, or
        // all are local files to read ahead.
        let source = &self.downloads.source;
        let (mut direct, mut ahead) = (true, self.direct.local == LocalMode::Ahead);
        let (mut n, mut bytes) = (0, 0);
        let mut last = None;
        for f in files.iter().flatten() {
            let reach = reach_of(source, &mut last, &f.source);
            direct &= self.direct.reads(reach);
            ahead &= f.size_known() && f.member().is_none() && reach == Reach::LocalFiles;
            n += 1;
            bytes += if f.size_known() { f.size as usize } else { 0 };
        }
        if direct {
            return Ok(Needs::Nothing { files: n, bytes });
        }
        if ahead {
            return Ok(Needs::Fetch(runs_ahead(b, files)));
        }
        let rows = slices(b, 1).into_iter().zip(files);
        Ok(Needs::Fetch(
            rows.map(|(batch, files)| Pending {
                batch,
                files,
                ahead: false,
            })
            .collect(),
        ))
    }

    /// The count and listed bytes of the files of `b` when every one is
    /// read where it is (see [`Direct`]), read off the File columns' `source`
    /// and `size` arrays, no `File` decoded (a batch's files mostly share
    /// one source, whose reach is looked up once). `None` when some file is
    /// to be fetched, or a column is not laid out as a `File`.
    fn all_in_place(&self, b: &RecordBatch) -> Option<(usize, usize)> {
        let (mut files, mut bytes) = (0, 0);
        for &c in &self.downloads.file_cols {
            let column = b.column(c).as_struct_opt()?;
            let sources = column.column_by_name("source")?.as_string_opt::<i32>()?;
            let sizes = column
                .column_by_name("size")?
                .as_primitive_opt::<UInt64Type>()?;
            let mut last = None;
            for row in (0..column.len()).filter(|&r| column.is_valid(r)) {
                let source = sources.value(row);
                if !self
                    .direct
                    .reads(reach_of(&self.downloads.source, &mut last, source))
                {
                    return None;
                }
                files += 1;
                bytes += sizes.value(row) as usize;
            }
        }
        Some((files, bytes))
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

/// Which files a `PrefetchExec` leaves where they are, for the UDF to read
/// directly. An in-memory store's objects, at every `prefetch` (a fetch
/// would only hand the same bytes across a task); the local file system's
/// as [`LocalMode`] says. With `cache = true` every file goes through the
/// shared cache.
#[derive(Debug, Clone, Copy)]
pub(super) struct Direct {
    pub(super) local: LocalMode,
    pub(super) memory: bool,
}

/// What a `PrefetchExec` does with the files of the local file system.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LocalMode {
    /// `prefetch = auto`: read by the UDF where they are (a page-cached read
    /// costs less than the hand-off of a download).
    InPlace,
    /// A fixed `prefetch = N`: read ahead, as asked (for network file systems
    /// and cold disks), in runs of rows (see [`runs_ahead`]), then read by
    /// the UDF where they are or from the bytes read ahead; never copied.
    Ahead,
    /// `cache = true`: fetched into the shared cache as any file.
    Fetched,
}

impl Direct {
    /// Whether files kept where `reach` says are read where they are.
    fn reads(&self, reach: Reach) -> bool {
        match reach {
            Reach::LocalFiles => self.local == LocalMode::InPlace,
            Reach::Memory => self.memory,
            Reach::Network => false,
        }
    }
}

/// `stores.reach(source)`, kept in `last` for the next file: a batch's files
/// mostly share one source, whose store is then looked up once.
fn reach_of<'a>(
    stores: &StoreSource,
    last: &mut Option<(&'a str, Reach)>,
    source: &'a str,
) -> Reach {
    match *last {
        Some((seen, reach)) if seen == source => reach,
        _ => {
            let reach = stores.reach(source);
            *last = Some((source, reach));
            reach
        }
    }
}

/// A run of local rows read ahead holds at most this many rows ...
const RUN_ROWS: usize = 64;
/// ... and ends at the row whose files bring it to this many bytes: one
/// blocking-pool trip and one batch to the UDF per run instead of per row.
const RUN_BYTES: u64 = 4 << 20;

/// `b` cut into runs of rows to read ahead (see [`RUN_ROWS`], at least one
/// row each), each with the files of its rows.
fn runs_ahead(b: &RecordBatch, files: Vec<Vec<File>>) -> Vec<Pending> {
    let mut runs = Vec::new();
    let (mut start, mut run, mut bytes) = (0, Vec::new(), 0u64);
    for (row, row_files) in files.into_iter().enumerate() {
        bytes += row_files.iter().map(|f| f.size).sum::<u64>();
        run.extend(row_files);
        if row + 1 - start == RUN_ROWS || bytes >= RUN_BYTES || row + 1 == b.num_rows() {
            runs.push(Pending {
                batch: b.slice(start, row + 1 - start),
                files: std::mem::take(&mut run),
                ahead: true,
            });
            (start, bytes) = (row + 1, 0);
        }
    }
    runs
}

/// Rows not started yet: one row to fetch, or a run of local rows to read
/// ahead (`ahead`), with the files of its rows.
pub(super) struct Pending {
    batch: RecordBatch,
    files: Vec<File>,
    ahead: bool,
}

/// What an input batch needs from the prefetch.
enum Needs {
    /// Its rows (one-row batches, or runs read ahead), each with the files
    /// to fetch for it.
    Fetch(Vec<Pending>),
    /// Nothing: its `files` files (of `bytes` bytes) are read where they are.
    Nothing { files: usize, bytes: usize },
}

/// The non-null `File`s of each row of `batch` in its `file_cols` (every
/// column decoded once for the whole batch).
fn files_by_row(batch: &RecordBatch, file_cols: &[usize]) -> DfResult<Vec<Vec<File>>> {
    let mut rows: Vec<Vec<File>> = vec![Vec::with_capacity(file_cols.len()); batch.num_rows()];
    for &c in file_cols {
        let files = File::decode_array(batch.column(c)).map_err(|e| {
            Error::internal(format!("a File column the planner checked: {e}")).into_df()
        })?;
        for (row, f) in rows.iter_mut().zip(files) {
            row.extend(f);
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::physical_plan::metrics::Gauge;

    fn fetched(seq: u64, bytes: usize) -> Fetched {
        Fetched {
            seq,
            base: seq,
            row: Ok(None),
            bytes,
            estimated: 0,
            unsized_files: 0,
            learned: 0,
        }
    }

    #[test]
    fn the_reorder_bound_is_capped_in_bytes_but_never_below_two_windows() {
        let mut r = Reorder::default();
        r.started(0, 256 << 10);
        // 32 windows of 128 rows of 256 KiB would be 1 GiB.
        assert_eq!(r.limit(128), REORDER_MAX_BYTES);
        // Small rows: 32 windows, under the cap.
        let mut small = Reorder::default();
        small.started(0, 1 << 10);
        assert_eq!(small.limit(128), 32 * 128 * (1 << 10));
        // Rows so large that two windows exceed the cap: two windows.
        let mut large = Reorder::default();
        large.started(0, 16 << 20);
        assert_eq!(large.limit(64), 2 * 64 * (16 << 20));
    }

    #[test]
    fn the_reorder_buffer_never_holds_more_than_its_bound() {
        // Window 2 of 10-byte rows: the bound is 32 x 2 x 10 = 640 bytes.
        let (mut r, peak) = (Reorder::default(), Gauge::new());
        let mut seq = 0;
        // Row 0 (the head) is slow; everything after it finishes at once.
        while r.admits(seq, 10, 2) {
            r.started(seq, 10);
            if seq > 0 {
                r.finished(fetched(seq, 10), &peak);
            }
            seq += 1;
            assert!(seq < 100, "admitted without bound");
        }
        assert_eq!(r.limit(2), 640);
        assert_eq!(seq, 65, "the head plus 64 rows of 10 bytes fill 640 bytes");
        assert_eq!(peak.value(), 640);
        assert!(r.pop().is_none(), "the head is still in flight");
        r.finished(fetched(0, 10), &peak);
        for want in 0..65 {
            assert_eq!(r.pop().map(|f| f.seq), Some(want));
        }
        assert_eq!((r.bytes, r.committed()), (0, 0));
        assert!(r.admits(seq, 1_000, 2), "the next row due always starts");
    }
}
