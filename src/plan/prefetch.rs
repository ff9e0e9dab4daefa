//! `PrefetchExec`: while a UDF works on one row, the files of the next rows are
//! downloading.
//!
//! Guarantees (per partition unless said otherwise):
//! - at most `prefetch` rows are downloading or downloaded-but-not-yet-taken,
//!   and at most `max_connections` downloads run across all partitions;
//! - the bytes of those rows' files are charged to DataFusion's memory pool:
//!   when the pool refuses, no new download starts until a row is taken (one
//!   row always proceeds, so a tiny pool slows the run but never stalls it);
//! - a row is emitted only when every `File` in it has a complete local copy
//!   (a temp file, or a shared-cache entry with `cache = true`); the UDF's
//!   `File` reads then go to that copy;
//! - `ordered = true` emits rows in input order; `false` in completion order,
//!   so one slow object does not hold back the rest;
//! - every download is a task aborted when the stream is dropped; the temp dir
//!   (see `TempCache`) goes away with the stream;
//! - a download that fails after retries fails the query naming the file
//!   (`on_error = fail`), drops the row and records the file (`skip`), or passes
//!   the row on uncached so the UDF's own read fails into a null (`null`).
//! - `prefetch = auto` sizes the window by Little's law, within 1..=max_connections:
//!   eight times the rows the UDF takes per round trip (the shortest recent time
//!   to first byte; the larger of the last round trip's count and the mean of
//!   the last four), shrinking by at most one per row taken. While downloads are
//!   the bottleneck every row of a round trip is taken, so the window grows
//!   eightfold per round trip up to the cap; when the UDF, the bandwidth or the
//!   server is the bottleneck, the rows taken per round trip stop growing and the
//!   window settles at eight times what the UDF consumes per round trip.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use datafusion::arrow::array::RecordBatch;
use datafusion::error::Result as DfResult;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::metrics::{
    Count, ExecutionPlanMetricsSet, Gauge, MetricBuilder, Time,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::StreamExt;
use futures::stream::{FuturesOrdered, FuturesUnordered};
use tokio::sync::Semaphore;
use udfchain_udfs::{File, decode_column};

use super::common::{slices, unary_exec_boilerplate};
use crate::cache::{SharedCache, TempCache};
use crate::chain::{OnError, Prefetch};
use crate::error::Error;
use crate::session::{PoolTask, spawn_on};
use crate::storage::source::LocalCopies;
use crate::storage::{Downloaded, StoreSource, download_bytes, download_to};

/// Lets the UDF operator above find, per partition, the local copies its
/// `PrefetchExec` made (they are created when the partition starts).
#[derive(Debug, Default)]
pub struct PrefetchLink {
    partitions: Mutex<HashMap<usize, Weak<dyn LocalCopies>>>,
}

impl PrefetchLink {
    fn publish(&self, partition: usize, local: &Arc<dyn LocalCopies>) {
        self.partitions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(partition, Arc::downgrade(local));
    }

    /// The local copies of `partition`, once its prefetch stream has started.
    pub fn local(&self, partition: usize) -> Option<Arc<dyn LocalCopies>> {
        self.partitions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&partition)?
            .upgrade()
    }
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
    pub storage_options: std::collections::BTreeMap<String, String>,
}

#[derive(Debug)]
pub struct PrefetchExec {
    input: Arc<dyn ExecutionPlan>,
    file_cols: Vec<usize>,
    options: PrefetchOptions,
    connections: Arc<Semaphore>,
    link: Arc<PrefetchLink>,
    skipped: Arc<Mutex<Vec<String>>>,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl PrefetchExec {
    pub fn new(
        input: Arc<dyn ExecutionPlan>,
        file_cols: Vec<usize>,
        options: PrefetchOptions,
        link: Arc<PrefetchLink>,
    ) -> Self {
        let mut properties = PlanProperties::clone(input.properties());
        if !options.ordered {
            properties = properties.with_eq_properties(EquivalenceProperties::new(input.schema()));
        }
        Self {
            connections: Arc::new(Semaphore::new(options.max_connections.max(1))),
            input,
            file_cols,
            options,
            link,
            skipped: Arc::default(),
            properties: Arc::new(properties),
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }

    fn with_input(&self, input: Arc<dyn ExecutionPlan>) -> Self {
        Self::new(
            input,
            self.file_cols.clone(),
            self.options.clone(),
            Arc::clone(&self.link),
        )
    }

    /// URLs of the files dropped under `on_error = skip`.
    pub fn skipped(&self) -> Vec<String> {
        self.skipped
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
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
    unary_exec_boilerplate!("PrefetchExec");

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![self.options.ordered]
    }

    fn execute(
        &self,
        partition: usize,
        ctx: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let input = self.input.execute(partition, Arc::clone(&ctx))?;
        // The shared cache serves files it holds even with `cache = false`.
        let cache_dir = self.options.root.join("cache");
        let shared = if self.options.cache || cache_dir.is_dir() {
            Some(SharedCache::open(&cache_dir, self.options.cache_limit).map_err(Error::into_df)?)
        } else {
            None
        };
        let fallback = shared.clone().map(|s| s as Arc<dyn LocalCopies>);
        let temp = TempCache::create(&self.options.root, fallback).map_err(Error::into_df)?;
        let local: Arc<dyn LocalCopies> = Arc::clone(&temp) as _;
        self.link.publish(partition, &local);
        let m = |name: &'static str| MetricBuilder::new(&self.metrics).counter(name, partition);
        let metrics = PrefetchMetrics {
            files_fetched: m("files_fetched"),
            bytes_fetched: m("bytes_fetched"),
            cache_hits: m("cache_hits"),
            retries: m("retries"),
            skipped_files: m("skipped_files"),
            peak_in_flight: MetricBuilder::new(&self.metrics).gauge("peak_in_flight", partition),
            udf_wait: MetricBuilder::new(&self.metrics).subset_time("udf_wait", partition),
        };
        let window = match self.options.prefetch {
            Prefetch::Fixed(n) => n.max(1),
            Prefetch::Auto => 2.min(self.options.max_connections).max(1),
        };
        let state = PrefetchStream {
            input,
            input_done: false,
            rows: VecDeque::new(),
            queue: if self.options.ordered {
                Queue::Ordered(FuturesOrdered::new())
            } else {
                Queue::Unordered(FuturesUnordered::new())
            },
            window,
            auto: self.options.prefetch == Prefetch::Auto,
            taken: VecDeque::new(),
            reservation: MemoryConsumer::new(format!("PrefetchExec[{partition}]"))
                .register(ctx.memory_pool()),
            shared: Arc::new(Shared {
                file_cols: self.file_cols.clone(),
                temp,
                shared,
                into_cache: self.options.cache,
                memory_file_limit: self.options.memory_file_limit,
                source: StoreSource::new(
                    ctx.runtime_env(),
                    self.options.storage_options.clone(),
                    None,
                ),
                connections: Arc::clone(&self.connections),
                max_connections: self.options.max_connections.max(1),
                on_error: self.options.on_error,
                active: AtomicUsize::new(0),
                fetching: Mutex::default(),
                pinned: Mutex::default(),
                skipped: Arc::clone(&self.skipped),
                metrics,
                round_trip: Mutex::default(),
            }),
        };
        let schema = self.input.schema();
        let stream = futures::stream::unfold(state, |mut s| async move {
            let next = s.next().await?;
            Some((next, s))
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

struct PrefetchMetrics {
    files_fetched: Count,
    bytes_fetched: Count,
    cache_hits: Count,
    retries: Count,
    skipped_files: Count,
    peak_in_flight: Gauge,
    udf_wait: Time,
}

/// What every download task of one partition shares.
struct Shared {
    file_cols: Vec<usize>,
    temp: Arc<TempCache>,
    shared: Option<Arc<SharedCache>>,
    /// `cache = true`: downloads go into `shared`.
    into_cache: bool,
    /// Otherwise files up to this size are held in memory, larger ones on disk.
    memory_file_limit: u64,
    source: StoreSource,
    connections: Arc<Semaphore>,
    max_connections: usize,
    on_error: OnError,
    active: AtomicUsize,
    /// The parent of the last virtual file fetched, held one extra time so the
    /// next members of the same shard find it even when the window ran dry
    /// in between (at most one file beyond the window).
    pinned: Mutex<Option<File>>,
    /// Per-object locks: one download of an object at a time.
    fetching: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    skipped: Arc<Mutex<Vec<String>>>,
    metrics: PrefetchMetrics,
    /// The shortest recent time to first byte of a download (for `auto`).
    round_trip: Mutex<RoundTrip>,
}

/// A finished fetch of one row.
struct Fetched {
    /// The row, `None` if skipped.
    row: DfResult<Option<RecordBatch>>,
    /// Bytes charged to the memory pool for it.
    bytes: usize,
}

type Fetch = PoolTask<Fetched>;

enum Queue {
    Ordered(FuturesOrdered<Fetch>),
    Unordered(FuturesUnordered<Fetch>),
}

impl Queue {
    fn push(&mut self, f: Fetch) {
        match self {
            Self::Ordered(q) => q.push_back(f),
            Self::Unordered(q) => q.push(f),
        }
    }

    fn len(&self) -> usize {
        match self {
            Self::Ordered(q) => q.len(),
            Self::Unordered(q) => q.len(),
        }
    }

    async fn next(&mut self) -> Option<Result<Fetched, String>> {
        match self {
            Self::Ordered(q) => q.next().await,
            Self::Unordered(q) => q.next().await,
        }
    }
}

struct PrefetchStream {
    input: SendableRecordBatchStream,
    input_done: bool,
    /// Rows not started yet, each with its files (decoded once per input batch).
    rows: VecDeque<(RecordBatch, Vec<File>)>,
    queue: Queue,
    window: usize,
    auto: bool,
    /// When the rows of the last `HORIZON` round trips were taken (`auto` only).
    taken: VecDeque<Instant>,
    reservation: MemoryReservation,
    shared: Arc<Shared>,
}

impl PrefetchStream {
    async fn next(&mut self) -> Option<DfResult<RecordBatch>> {
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
                        Some(Err(panic)) => return Some(Err(Error::plan(format!("prefetch task {panic}")).into_df())),
                        None => continue,
                    }
                }
            }
        }
    }

    /// `prefetch = auto`: the window becomes `GAIN` times the rows taken per
    /// round trip (Little's law with room to grow), or shrinks by one when
    /// that is less. Rows per round trip is the larger of the count in the last
    /// round trip (so a burst grows the window at once) and the mean over the
    /// last `HORIZON` round trips (so the gap between two bursts, when loaded
    /// round trips exceed the shortest one, does not read as a slowdown: counted
    /// over the last round trip alone, the window shrank to 0.65 of the best
    /// fixed setting at 64 in flight).
    ///
    /// A rule of "+1 whenever the UDF waited" grows by one per round trip, since
    /// the rows of one round trip arrive together and only the first of them
    /// finds the UDF waiting: 60 round trips to reach 64 in flight.
    fn adapt(&mut self) {
        if !self.auto {
            return;
        }
        let estimate = self
            .shared
            .round_trip
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get();
        let Some(rtt) = estimate else {
            return; // no download yet: keep the initial window
        };
        const HORIZON: u32 = 4;
        const GAIN: usize = 8;
        let now = Instant::now();
        self.taken.push_back(now);
        while self
            .taken
            .front()
            .is_some_and(|t| now.duration_since(*t) > rtt * HORIZON)
        {
            self.taken.pop_front();
        }
        let last = self.taken.len() - self.taken.partition_point(|t| now.duration_since(*t) > rtt);
        let mean = self.taken.len().div_ceil(HORIZON as usize);
        // Grow at once, shrink by one row at a time.
        let target = (GAIN * last.max(mean)).clamp(1, self.shared.max_connections);
        self.window = target.max(self.window.saturating_sub(1)).max(1);
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

impl Shared {
    /// Downloads the files of a one-row batch; `None` when the row is skipped.
    async fn fetch_row(&self, row: RecordBatch, files: Vec<File>) -> DfResult<Option<RecordBatch>> {
        for file in files {
            let fetched = self.fetch_file(&file).await;
            if fetched.is_ok() && file.member().is_some() {
                self.pin(file.parent());
            }
            match fetched {
                Ok(_) => {}
                Err(e) => {
                    return match self.on_error {
                        OnError::Fail => Err(e.into_df()),
                        OnError::Skip => {
                            self.metrics.skipped_files.add(1);
                            self.skipped
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .push(file.url());
                            Ok(None)
                        }
                        OnError::Null => Ok(Some(row)),
                    };
                }
            }
        }
        Ok(Some(row))
    }

    /// Holds `parent` one extra time, releasing the previously pinned parent.
    fn pin(&self, parent: File) {
        let mut pinned = self.pinned.lock().unwrap_or_else(|p| p.into_inner());
        if pinned
            .as_ref()
            .is_some_and(|p| p.path == parent.path && p.source == parent.source)
        {
            return;
        }
        if self.temp.acquire(&parent)
            && let Some(old) = pinned.replace(parent)
        {
            self.temp.release(&old);
        }
    }

    /// Makes a local copy of `file` (of its parent, for a virtual file) and
    /// counts one more row using it; true if it was downloaded (not already held).
    /// One download per object at a time: rows sharing a parent wait for the
    /// first download instead of starting their own.
    async fn fetch_file(&self, file: &File) -> Result<bool, Error> {
        let file = &file.parent();
        let key = format!("{}\u{0}{}", file.source, file.path);
        let lock = Arc::clone(
            self.fetching
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(key.clone())
                .or_default(),
        );
        let result = {
            let _one = lock.lock().await;
            self.fetch_locked(file).await
        };
        let mut fetching = self.fetching.lock().unwrap_or_else(|p| p.into_inner());
        if Arc::strong_count(&lock) == 2 {
            fetching.remove(&key);
        }
        result
    }

    async fn fetch_locked(&self, file: &File) -> Result<bool, Error> {
        let in_shared = || self.shared.as_ref().is_some_and(|c| c.get(file).is_some());
        if self.temp.acquire(file) || in_shared() {
            self.metrics.cache_hits.add(1);
            return Ok(false);
        }
        match (&self.shared, self.into_cache) {
            (Some(cache), true) => {
                let (_, downloaded) = cache
                    .get_or_fetch(file, |tmp| async move { self.download(file, &tmp).await })
                    .await?;
                if !downloaded {
                    self.metrics.cache_hits.add(1);
                }
                Ok(downloaded)
            }
            _ if file.size <= self.memory_file_limit => {
                let bytes = self.download_bytes(file).await?;
                self.temp.insert_bytes(file, bytes);
                Ok(true)
            }
            _ => {
                let dest = self.temp.new_path(file);
                match self.download(file, &dest).await {
                    Ok(()) => {
                        self.temp.insert(file, dest);
                        Ok(true)
                    }
                    Err(e) => {
                        let _ = tokio::fs::remove_file(&dest).await;
                        Err(e)
                    }
                }
            }
        }
    }

    /// Downloads `file` to `dest` within the connection cap, counting it.
    async fn download(&self, file: &File, dest: &std::path::Path) -> Result<(), Error> {
        self.counted(file, |store, path, _url| async move {
            let d = download_to(&store, &path, file, dest).await?;
            Ok(((), d))
        })
        .await
    }

    /// Downloads `file` into memory within the connection cap, counting it.
    async fn download_bytes(&self, file: &File) -> Result<bytes::Bytes, Error> {
        self.counted(file, |store, path, _url| async move {
            download_bytes(&store, &path, file).await
        })
        .await
    }

    /// Runs one download of `file` within the connection cap and counts it.
    async fn counted<T, F, Fut>(&self, file: &File, run: F) -> Result<T, Error>
    where
        F: FnOnce(Arc<dyn object_store::ObjectStore>, object_store::path::Path, String) -> Fut,
        Fut: Future<Output = Result<(T, Downloaded), Error>>,
    {
        let (store, path) = self.source.resolve(file).map_err(|e| Error::Storage {
            url: file.url(),
            source: Arc::new(e),
        })?;
        let _slot = self
            .connections
            .acquire()
            .await
            .map_err(|e| Error::plan(e.to_string()))?;
        let now = self.active.fetch_add(1, Ordering::SeqCst) + 1;
        self.metrics.peak_in_flight.set_max(now);
        let result = run(store, path, file.url()).await;
        self.active.fetch_sub(1, Ordering::SeqCst);
        let (value, d) = result?;
        self.round_trip
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .observe(d.first_byte);
        self.metrics.files_fetched.add(1);
        self.metrics.bytes_fetched.add(d.bytes as usize);
        self.metrics.retries.add(d.retries as usize);
        Ok(value)
    }
}

/// The shortest time to first byte of the last 64 to 128 downloads (a windowed
/// minimum kept as the minima of the current and the previous 64). Time to
/// first byte, not the whole download: when bandwidth is the limit a download
/// takes longer the more run at once, and a window sized by it would feed on
/// itself.
#[derive(Debug, Default)]
struct RoundTrip {
    current: Option<Duration>,
    previous: Option<Duration>,
    samples: usize,
}

impl RoundTrip {
    const EPOCH: usize = 64;

    fn observe(&mut self, took: Duration) {
        self.current = Some(self.current.map_or(took, |c| c.min(took)));
        self.samples += 1;
        if self.samples == Self::EPOCH {
            self.previous = self.current.take();
            self.samples = 0;
        }
    }

    fn get(&self) -> Option<Duration> {
        match (self.current, self.previous) {
            (Some(c), Some(p)) => Some(c.min(p)),
            (c, p) => c.or(p),
        }
    }
}

/// The rows of `batch`, one-row batches each with the non-null `File`s of its
/// `file_cols` (every column decoded once for the whole batch).
fn rows_with_files(
    batch: &RecordBatch,
    file_cols: &[usize],
) -> DfResult<Vec<(RecordBatch, Vec<File>)>> {
    let mut columns = Vec::with_capacity(file_cols.len());
    for &c in file_cols {
        let files: Vec<Option<File>> =
            decode_column(batch.column(c)).map_err(|e| Error::plan(e.to_string()).into_df())?;
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
