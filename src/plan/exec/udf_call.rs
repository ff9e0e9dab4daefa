//! [`UdfCall`]: one UDF as its operator runs it. A call runs on the UDF pool
//! with the files of its rows served by the call's [`FileSource`] (the
//! prefetch's local copies, else the shared cache, else the store), and its
//! failures become errors naming the UDF, the file and the row.
//!
//! Guarantees: at most `parallel` calls of one UDF run at once across all its
//! partitions (a generator counts while it produces, not while it waits for
//! its consumer); a call's future is aborted when it is dropped (and so when the
//! operator's stream is); a panicking UDF fails its call with an error, never
//! unwinds into the query.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use datafusion::arrow::array::{Array, RecordBatch};
use datafusion::arrow::datatypes::{Field, Schema};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::TaskContext;
use tokio::sync::Semaphore;
use udfchain_udfs::engine::with_file_source;
use udfchain_udfs::{CallError, File, FileSource};

use crate::cache::{LocalCopies, SharedCache, StoreSource};
use crate::error::Error;
use crate::plan::exec::lifecycle::{Instance, setup_failed};
use crate::plan::memo::Memo;
use crate::plan::skip_list::SkipList;
use crate::runtime::spawn_udf;
use crate::settings::{OnError, Settings};

/// One UDF as its operator runs it.
#[derive(Debug)]
pub struct UdfCall {
    pub name: String,
    pub kind: &'static str,
    /// Param columns: index in the input schema and name the UDF sees.
    pub params: Vec<(usize, String)>,
    /// Input columns that hold `File`s, used to name the file in errors.
    pub file_cols: Vec<usize>,
    /// The params among them: the files a `PrefetchExec` below fetched.
    pub file_params: Vec<usize>,
    pub parallel: usize,
    pub batch_size: usize,
    pub on_error: OnError,
    /// Emit in input order (`true`) or as calls finish.
    pub ordered: bool,
    pub storage_options: BTreeMap<String, String>,
    /// The shared cache dir, its size limit, and whether reads fill it (`cache = true`).
    cache: Option<(std::path::PathBuf, Option<u64>, bool)>,
    slots: Arc<Semaphore>,
    skipped: SkipList,
    /// The settings the operator was planned with (what a codec sends).
    pub settings: Settings,
    /// Where results are kept for a save run again (its checkpoint).
    pub memo: Option<Arc<Memo>>,
    /// The recent time per row of calls made row by row in one task.
    row_cost: RowCost,
    /// The UDF's state in this process: set up before its first call, its
    /// `concurrency` bound held by each call.
    instance: Option<Arc<Instance>>,
}

/// A call of rows made one by one in one task aims at about this long: long
/// enough that the task and its thread crossings (tens of µs) are a few
/// percent of it, short enough that `parallel` calls share the rows evenly.
const CALL_TARGET: Duration = Duration::from_millis(1);

/// At most this many rows in one such call.
pub const MAX_ROWS_PER_CALL: usize = 128;

/// The recent time per row of a UDF's calls (a moving mean), which sizes its
/// next calls of file rows: a fast UDF gets up to [`MAX_ROWS_PER_CALL`] rows
/// per call, one whose row takes a millisecond or more (or waits on the
/// network) one row per call. One row per call until a call was measured.
#[derive(Debug, Default)]
pub struct RowCost {
    /// Nanoseconds per row; 0 until the first call.
    nanos: AtomicU64,
}

impl RowCost {
    /// A call of `rows` rows took `elapsed`.
    pub fn observe(&self, elapsed: Duration, rows: usize) {
        if rows == 0 {
            return;
        }
        let sample = (elapsed.as_nanos() / rows as u128).clamp(1, u64::MAX as u128) as u64;
        let old = self.nanos.load(Ordering::Relaxed);
        let new = if old == 0 {
            sample
        } else {
            old - old / 4 + sample / 4
        };
        self.nanos.store(new.max(1), Ordering::Relaxed);
    }

    /// Rows for the next call.
    pub fn rows_per_call(&self) -> usize {
        match self.nanos.load(Ordering::Relaxed) {
            0 => 1,
            n => (CALL_TARGET.as_nanos() as u64 / n).clamp(1, MAX_ROWS_PER_CALL as u64) as usize,
        }
    }
}

/// A call that failed, with the row (within the call's input batch) when known.
pub struct Failure {
    pub row: Option<usize>,
    pub error: Error,
}

impl Failure {
    /// The UDF's setup failed: the run fails, whatever `on_error` says.
    pub fn is_setup(&self) -> bool {
        setup_failed(&self.error)
    }
}

/// A setup's error on its way out of a call's task (already shared by the
/// calls that waited for the setup).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct SetupError(crate::error::Source);

impl SetupError {
    /// The setup's own error out of a boxed `SetupError`.
    fn into_source(e: udfchain_udfs::BoxError) -> crate::error::Source {
        match e.downcast::<SetupError>() {
            Ok(s) => s.0,
            Err(other) => Arc::from(other),
        }
    }
}

/// The source of a failure of a call of several rows that did not say which
/// row failed: the error names the call's first row and this says how many
/// rows the call had.
#[derive(Debug, thiserror::Error)]
#[error("the call of {rows} rows starting at this row failed: {source}")]
struct WholeCall {
    rows: usize,
    #[source]
    source: crate::error::Source,
}

impl UdfCall {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        name: String,
        kind: &'static str,
        params: Vec<(usize, String)>,
        file_cols: Vec<usize>,
        file_params: Vec<usize>,
        parallel: usize,
        batch_size: usize,
        on_error: OnError,
        storage_options: BTreeMap<String, String>,
    ) -> Self {
        Self {
            name,
            kind,
            params,
            file_cols,
            file_params,
            parallel: parallel.max(1),
            batch_size: batch_size.max(1),
            on_error,
            ordered: true,
            storage_options,
            cache: None,
            slots: Arc::new(Semaphore::new(parallel.max(1))),
            skipped: SkipList::default(),
            settings: Settings::new(),
            memo: None,
            row_cost: RowCost::default(),
            instance: None,
        }
    }

    /// Calls set up `instance` first and hold its `concurrency` bound.
    pub fn with_instance(mut self, instance: Arc<Instance>) -> Self {
        self.instance = Some(instance);
        self
    }

    /// The recent time per row of this UDF's calls made row by row.
    pub fn row_cost(&self) -> &RowCost {
        &self.row_cost
    }

    /// Results are kept in `memo`, and rows it holds are answered from it.
    pub fn with_memo(mut self, memo: Option<Arc<Memo>>) -> Self {
        self.memo = memo;
        self
    }

    /// Reads of files no prefetch fetched are served from the shared cache at
    /// `dir` when it holds them, and with `fill` (`cache = true`) go through it.
    pub fn with_cache(mut self, dir: std::path::PathBuf, limit: Option<u64>, fill: bool) -> Self {
        self.cache = Some((dir, limit, fill));
        self
    }

    /// The settings the operator was planned with.
    pub fn with_settings(mut self, settings: Settings) -> Self {
        self.settings = settings;
        self
    }

    /// `ordered = false`: results are emitted as calls finish (default true).
    pub fn with_ordered(mut self, ordered: bool) -> Self {
        self.ordered = ordered;
        self
    }

    /// The columns the UDF reads, named as its params.
    pub fn params_batch(&self, batch: &RecordBatch) -> DfResult<RecordBatch> {
        let mut fields = Vec::with_capacity(self.params.len());
        let mut cols = Vec::with_capacity(self.params.len());
        for (idx, name) in &self.params {
            let col = Arc::clone(batch.column(*idx));
            fields.push(Field::new(name, col.data_type().clone(), true));
            cols.push(col);
        }
        let opts = datafusion::arrow::array::RecordBatchOptions::new()
            .with_row_count(Some(batch.num_rows()));
        Ok(RecordBatch::try_new_with_options(
            Arc::new(Schema::new(fields)),
            cols,
            &opts,
        )?)
    }

    /// The source `File` reads of this UDF go through (must be called on the I/O
    /// runtime): the prefetch's `local` copies, else the shared cache.
    pub fn file_source(
        &self,
        ctx: &TaskContext,
        local: Option<Arc<dyn LocalCopies>>,
    ) -> DfResult<Arc<dyn FileSource>> {
        let env = ctx.runtime_env();
        let options = self.storage_options.clone();
        if local.is_some() {
            return Ok(Arc::new(StoreSource::new(env, options, local)));
        }
        let Some((dir, limit, fill)) = &self.cache else {
            return Ok(Arc::new(StoreSource::new(env, options, None)));
        };
        if !fill && !dir.is_dir() {
            return Ok(Arc::new(StoreSource::new(env, options, None)));
        }
        let shared = SharedCache::open(dir, *limit).map_err(Error::into_df)?;
        let source = StoreSource::new(env, options, Some(Arc::clone(&shared) as _));
        Ok(Arc::new(if *fill {
            source.with_read_through(shared)
        } else {
            source
        }))
    }

    /// Runs `fut` on the UDF pool once a slot is free, with `source` serving file reads.
    ///
    /// # Cancel safety
    /// Dropping the returned future aborts the call.
    pub async fn run<T, F>(&self, source: Arc<dyn FileSource>, fut: F) -> Result<T, Failure>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, CallError>> + Send + 'static,
    {
        let slots = Arc::clone(&self.slots);
        self.run_stepwise(source, async move {
            let _slot = slots.acquire_owned().await;
            fut.await
        })
        .await
    }

    /// The UDF's `parallel` slots, shared by all its partitions: a call run
    /// with [`run_stepwise`](Self::run_stepwise) holds one while it computes.
    pub fn slots(&self) -> &Arc<Semaphore> {
        &self.slots
    }

    /// Runs `fut` on the UDF pool as [`run`](Self::run) does, but takes no
    /// slot for it: `fut` holds one of [`slots`](Self::slots) for each step
    /// of its work and none while it waits for its consumer (a generator
    /// whose channel is full), so that slots are never all held by calls
    /// nobody drains.
    ///
    /// # Cancel safety
    /// Dropping the returned future aborts the call.
    pub async fn run_stepwise<T, F>(
        &self,
        source: Arc<dyn FileSource>,
        fut: F,
    ) -> Result<T, Failure>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, CallError>> + Send + 'static,
    {
        let instance = self.instance.clone();
        let task = spawn_udf(with_file_source(source, async move {
            let _permit = match &instance {
                Some(i) => {
                    i.ready()
                        .await
                        .map_err(|e| CallError::whole(SetupError(e)))?;
                    i.permit().await
                }
                None => None,
            };
            fut.await
        }));
        match task.await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) if e.source.is::<SetupError>() => Err(Failure {
                row: None,
                error: self.error(None, None, SetupError::into_source(e.source)),
            }),
            Ok(Err(e)) => Err(Failure {
                row: e.row,
                error: self.error(None, None, Arc::from(e.source)),
            }),
            Err(panic) => Err(Failure {
                row: None,
                error: self.error(None, None, Arc::new(std::io::Error::other(panic))),
            }),
        }
    }

    /// What happens on `f`: this UDF's `on_error`, or `fail` when its
    /// setup failed (a setup is not a row).
    pub fn on_error_for(&self, f: &Failure) -> OnError {
        if f.is_setup() {
            OnError::Fail
        } else {
            self.on_error
        }
    }

    pub(super) fn error(
        &self,
        file: Option<String>,
        row: Option<u64>,
        source: crate::error::Source,
    ) -> Error {
        Error::Udf {
            udf: self.name.clone(),
            file,
            row,
            source,
        }
    }

    /// Adds the file and absolute row of `f` (a failure on `batch`, whose first
    /// row is row `row_base` of the partition) and converts it for DataFusion.
    /// A failure of several rows without a row names the first one.
    pub fn locate(&self, f: Failure, batch: &RecordBatch, row_base: u64) -> DataFusionError {
        if f.is_setup() {
            return f.error.into_df();
        }
        let rows = batch.num_rows();
        let (row, whole) = match f.row {
            Some(r) if r < rows => (r, false),
            _ => (0, rows > 1),
        };
        let file = self.file_url(batch, row);
        match f.error {
            Error::Udf { udf, source, .. } => Error::Udf {
                udf,
                file,
                row: Some(row_base + row as u64),
                source: if whole {
                    Arc::new(WholeCall { rows, source })
                } else {
                    source
                },
            },
            other => other,
        }
        .into_df()
    }

    /// How row `row` of `batch` (row `row_base + row` of the partition) is
    /// named in the skip list: the URL of its first `File`, else `udf row N`.
    pub(super) fn skip_entry(&self, batch: &RecordBatch, row: usize, row_base: u64) -> String {
        self.file_url(batch, row)
            .unwrap_or_else(|| format!("{} row {}", self.name, row_base + row as u64))
    }

    /// The skip list of this UDF (`on_error = skip`), bounded.
    pub(crate) fn skip_list(&self) -> &SkipList {
        &self.skipped
    }

    /// Tells the prefetch cache that the rows of `batch` are done with their files.
    pub fn release(&self, local: &Option<Arc<dyn LocalCopies>>, batch: &RecordBatch) {
        let Some(local) = local.as_ref().filter(|l| !l.holds_nothing()) else {
            return;
        };
        for &c in &self.file_params {
            if let Ok(files) = File::decode_array(batch.column(c)) {
                for f in files.into_iter().flatten() {
                    local.release(&f);
                }
            }
        }
    }

    /// The URL of the first `File` column of row `row`.
    pub fn file_url(&self, batch: &RecordBatch, row: usize) -> Option<String> {
        let col = batch.column(*self.file_cols.first()?);
        if row >= col.len() {
            return None;
        }
        let files = File::decode_array(&col.slice(row, 1)).ok()?;
        files.into_iter().next().flatten().map(|f| f.url())
    }
}
