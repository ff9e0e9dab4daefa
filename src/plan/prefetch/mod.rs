//! `PrefetchExec`: while a UDF works on one row, the files of the next rows are
//! downloading. This file holds the plan node and the hand-off to the UDF
//! operator above; `stream.rs` the window, `reorder.rs` its reorder buffer,
//! `in_place.rs` what each input batch needs (rows to fetch, local rows to
//! read ahead, or nothing), `downloads.rs` the download bookkeeping,
//! `window.rs` the `prefetch = auto` policy, `window_pins.rs` the shared-cache
//! entries the window holds for its rows.
//!
//! Guarantees (per partition unless said otherwise):
//! - at most `prefetch` downloads are in flight; a row whose download finished
//!   no longer counts against that window, and at most `max_connections`
//!   downloads run across all partitions of the operator (one semaphore they
//!   share); `peak_in_flight` in EXPLAIN ANALYZE is the peak across partitions;
//! - `ordered = true` emits rows in input order; rows that finish before their
//!   turn wait in a reorder buffer bounded by bytes (32 windows of the mean
//!   row; its peak is `reorder_peak_bytes`), and a full reorder buffer is what
//!   stops new requests (see `stream.rs`); `false` emits in completion order;
//!   a `MapExec` above under `ordered = true` asks for a [`Handoff`]: then rows
//!   are emitted as they finish, each with its input position, and count
//!   against the same reorder bound until the map settles them in order;
//! - the bytes of every row started and not yet taken (in flight or waiting
//!   in the reorder buffer) are charged to DataFusion's memory pool: when the
//!   pool refuses, no new download starts until a row is taken (one row always
//!   proceeds, so a tiny pool slows the run but never stalls it);
//! - a row is emitted only when every `File` in it has a complete local copy
//!   (a temp file, or a shared-cache entry, pinned so that no pruning removes
//!   it until the row is released); the UDF's `File` reads then go to that copy;
//! - except files already at hand: under `prefetch = auto` and `cache =
//!   false`, those of the local file system and of an in-memory store are
//!   read by the UDF where they are (no copy, no download task; counted in
//!   `files_in_place` and `bytes_in_place`): an input batch none of whose
//!   rows has a file to fetch is handed on whole, in its turn; under a fixed
//!   `prefetch = N` the local file system's are read ahead instead, never
//!   copied: runs of up to 64 rows (or 4 MiB), each read in one
//!   blocking-pool trip (at most N runs at once, each reading one file at a
//!   time) and handed on whole; a file up to `memory_file_limit` is held in
//!   memory, a larger one read through so the UDF finds it in the page
//!   cache, and a read that fails is left to the UDF's own read (as under
//!   `auto`, `on_error` applies there);
//! - every download is a task aborted when the stream is dropped; the temp dir
//!   (see `TempCache`) goes away with the stream;
//! - a download that fails after retries fails the query naming the file
//!   (`on_error = fail`), drops the row, releasing the copies it took, and
//!   records the file (`skip`), or passes the row on without a copy of that
//!   file (its other files are still fetched) so the UDF's own read fails into
//!   a null (`null`); each file of a row
//!   passed on holds exactly one reference in the temp cache, released by the
//!   UDF when the row is done.
//! - `prefetch = auto` (the default) sizes the window by Little's law, within
//!   1..=max_connections, starting at 2: eight times the rows the UDF takes per
//!   round trip (the *mean* time to first byte of the last 128 downloads; the
//!   larger of the last round trip's count and the mean of the last four),
//!   shrinking by at most one per row taken. While downloads are the
//!   bottleneck every row of a round trip is taken, so the window grows
//!   eightfold per round trip up to the cap; when the UDF, the bandwidth or the
//!   server is the bottleneck, the rows taken per round trip stop growing and the
//!   window settles at eight times what the UDF consumes per round trip. A
//!   stall takes no row, so it shrinks nothing.
//! - the UDF operator above gets this partition's local copies as a
//!   [`PrefetchHandle`] returned with the stream by
//!   [`PrefetchExec::execute_with_copies`]: no lookup by partition number, and
//!   a UDF operator whose input is not its `PrefetchExec` fails with an internal
//!   error instead of silently downloading every file again.

mod downloads;
mod handoff;
mod in_place;
mod reorder;
mod stream;
mod window;
mod window_pins;

use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, OnceLock};

use datafusion::error::Result as DfResult;
use datafusion::execution::memory_pool::MemoryConsumer;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, Gauge, MetricBuilder};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use tokio::sync::Semaphore;

use crate::cache::LocalCopies;
use crate::cache::StoreSource;
use crate::cache::{DiskBudget, TempCache};
use crate::plan::skip_list::SkipList;
use crate::settings::{OnError, Prefetch};
use crate::util::exec_boilerplate::exec_boilerplate;
use downloads::{Downloads, PrefetchMetrics};
use stream::PrefetchStream;
use window::AutoWindow;
pub use window_pins::WindowPins;

pub use handoff::Handoff;

/// What one partition of a `PrefetchExec` hands to the UDF operator above it,
/// together with its stream.
#[derive(Clone)]
pub struct PrefetchHandle {
    /// Serves the UDF's reads of the prefetched files (the window's pinned
    /// shared-cache entries in front of its temp cache) and takes the releases.
    pub local: Arc<dyn LocalCopies>,
    /// The temp cache itself, for the end-of-run check that no copy is left.
    pub temp: Arc<TempCache>,
    /// Asked for with `ordered = true`: rows come as their downloads finish,
    /// each with its position here, for the operator to put back in order.
    pub handoff: Option<Arc<Handoff>>,
}

/// How a `PrefetchExec` is configured.
#[derive(Debug, Clone)]
pub struct PrefetchOptions {
    pub prefetch: Prefetch,
    pub ordered: bool,
    pub max_connections: usize,
    pub on_error: OnError,
    pub root: PathBuf,
    /// Download into the shared cache (`cache = true`) instead of a temp dir.
    pub cache: bool,
    pub cache_limit: Option<u64>,
    /// Files up to this size are held in memory (`cache = false` only).
    pub memory_file_limit: u64,
    /// `temp_dir_limit`: the disk the temp dir's copies may take.
    pub temp_dir_limit: Option<u64>,
    pub storage_options: std::collections::BTreeMap<String, String>,
    /// The checkpoint of the UDF this prefetch serves: the rows it holds
    /// need no download.
    pub memo: Option<Arc<crate::plan::memo::Memo>>,
}

#[derive(Debug)]
pub struct PrefetchExec {
    input: Arc<dyn ExecutionPlan>,
    file_cols: Vec<usize>,
    options: PrefetchOptions,
    connections: Arc<Semaphore>,
    /// Downloads running across all partitions, and their peak.
    active: Arc<AtomicUsize>,
    peak_in_flight: Gauge,
    skipped: Arc<SkipList>,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl PrefetchExec {
    pub fn new(
        input: Arc<dyn ExecutionPlan>,
        file_cols: Vec<usize>,
        options: PrefetchOptions,
    ) -> Self {
        let mut properties = PlanProperties::clone(input.properties());
        if !options.ordered {
            properties = properties.with_eq_properties(EquivalenceProperties::new(input.schema()));
        }
        let metrics = ExecutionPlanMetricsSet::new();
        Self {
            connections: Arc::new(Semaphore::new(options.max_connections.max(1))),
            active: Arc::default(),
            peak_in_flight: MetricBuilder::new(&metrics).global_gauge("peak_in_flight"),
            input,
            file_cols,
            options,
            skipped: Arc::default(),
            properties: Arc::new(properties),
            metrics,
        }
    }

    fn with_input(&self, input: Arc<dyn ExecutionPlan>) -> Self {
        Self::new(input, self.file_cols.clone(), self.options.clone())
    }

    /// The input columns whose files it fetches.
    pub fn file_cols(&self) -> &[usize] {
        &self.file_cols
    }

    pub fn options(&self) -> &PrefetchOptions {
        &self.options
    }

    /// URLs of the files dropped under `on_error = skip` (bounded).
    pub(crate) fn skip_list(&self) -> &SkipList {
        &self.skipped
    }

    /// Executes `partition` and returns its stream with the handle to the local
    /// copies its rows' files will have when they are emitted. With `handoff`
    /// and `ordered = true` the rows come as their downloads finish and the
    /// handle's [`Handoff`] says where each belongs (the caller reorders).
    pub fn execute_with_copies(
        &self,
        partition: usize,
        ctx: Arc<TaskContext>,
        handoff: bool,
    ) -> DfResult<(SendableRecordBatchStream, PrefetchHandle)> {
        let input = self.input.execute(partition, Arc::clone(&ctx))?;
        // No file system call here: the stream opens the caches on the
        // blocking pool before its first row (`Downloads::prepare`).
        let temp = TempCache::new(&self.options.root);
        let pins = WindowPins::new(Arc::clone(&temp) as _);
        let handoff = (handoff && self.options.ordered).then(Arc::<Handoff>::default);
        let handle = PrefetchHandle {
            local: Arc::clone(&pins) as _,
            temp: Arc::clone(&temp),
            handoff: handoff.clone(),
        };
        let m = |name: &'static str| MetricBuilder::new(&self.metrics).counter(name, partition);
        let metrics = PrefetchMetrics {
            files_fetched: m("files_fetched"),
            bytes_fetched: m("bytes_fetched"),
            cache_hits: m("cache_hits"),
            retries: m("retries"),
            skipped_files: m("skipped_files"),
            files_streamed: m("files_streamed"),
            files_in_place: m("files_in_place"),
            bytes_in_place: m("bytes_in_place"),
            peak_in_flight: self.peak_in_flight.clone(),
            reorder_peak_bytes: MetricBuilder::new(&self.metrics)
                .gauge("reorder_peak_bytes", partition),
            udf_wait: MetricBuilder::new(&self.metrics).subset_time("udf_wait", partition),
        };
        let (window, auto) = match self.options.prefetch {
            Prefetch::Fixed(n) => (n.max(1), None),
            Prefetch::Auto => {
                let auto = AutoWindow::new(self.options.max_connections);
                (auto.initial(), Some(auto))
            }
        };
        let reservation =
            MemoryConsumer::new(format!("PrefetchExec[{partition}]")).register(ctx.memory_pool());
        let downloads = Arc::new(Downloads {
            file_cols: self.file_cols.clone(),
            temp,
            pins,
            shared_cache: OnceLock::new(),
            cache_dir: self.options.root.join("cache"),
            cache_limit: self.options.cache_limit,
            into_cache: self.options.cache,
            memory_file_limit: self.options.memory_file_limit,
            disk: DiskBudget::of(&self.options.root.join("tmp")),
            temp_dir_limit: self.options.temp_dir_limit,
            source: StoreSource::new(
                ctx.runtime_env(),
                self.options.storage_options.clone(),
                None,
            ),
            connections: Arc::clone(&self.connections),
            on_error: self.options.on_error,
            active: Arc::clone(&self.active),
            fetching: Default::default(),
            pinned: Mutex::default(),
            skipped: Arc::clone(&self.skipped),
            metrics,
            round_trip: Mutex::default(),
        });
        let state = PrefetchStream::new(
            input,
            self.options.ordered,
            window,
            auto,
            reservation,
            downloads,
            handoff,
            self.options.memo.clone(),
            in_place::Direct {
                local: match (self.options.cache, self.options.prefetch) {
                    (true, _) => in_place::LocalMode::Fetched,
                    (false, Prefetch::Auto) => in_place::LocalMode::InPlace,
                    (false, Prefetch::Fixed(_)) => in_place::LocalMode::Ahead,
                },
                memory: !self.options.cache,
            },
        );
        let schema = self.input.schema();
        let stream = futures::stream::unfold(state, |mut s| async move {
            let next = s.next().await?;
            Some((next, s))
        });
        Ok((
            Box::pin(RecordBatchStreamAdapter::new(schema, stream)),
            handle,
        ))
    }
}

impl DisplayAs for PrefetchExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let prefetch = match self.options.prefetch {
            Prefetch::Fixed(n) => n.to_string(),
            Prefetch::Auto => "auto".to_string(),
        };
        write!(
            f,
            "PrefetchExec: prefetch={prefetch}, ordered={}, max_connections={}, cache={}",
            self.options.ordered, self.options.max_connections, self.options.cache
        )
    }
}

impl ExecutionPlan for PrefetchExec {
    exec_boilerplate!("PrefetchExec", one_input, metrics);

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        // Each partition keeps its own window of downloads; more partitions would
        // only scatter the input order.
        vec![false]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![self.options.ordered]
    }

    /// One row out per row in, unless `on_error = skip` drops some: then a
    /// `LIMIT n` above is pushed below it, so the prefetch is given only the
    /// n rows wanted and starts no download past them.
    fn supports_limit_pushdown(&self) -> bool {
        self.options.on_error != OnError::Skip
    }

    /// The stream alone: its local copies live as long as it does. A UDF
    /// operator calls [`PrefetchExec::execute_with_copies`] instead.
    fn execute(
        &self,
        partition: usize,
        ctx: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        self.execute_with_copies(partition, ctx, false)
            .map(|(stream, _)| stream)
    }
}
