//! What every UDF operator shares: the [`UdfCall`] that runs one call of a UDF on
//! the UDF pool and turns its failures into errors naming the UDF, the file and
//! the row; the one meaning of `on_error` ([`Partition::call_rows`]); batch
//! slicing helpers; the plan properties and the boilerplate of unary operators.
//!
//! Guarantees: at most `parallel` calls of one UDF run at once across all its
//! partitions (a generator counts while it produces, not while it waits for
//! its consumer); a call's future is aborted when the operator's stream is dropped;
//! a panicking UDF fails the query with an error, never unwinds into it.
//!
//! `on_error`, the same for every UDF kind: `fail` fails the query with an
//! error naming the UDF, the file (the first `File` param of the row) and the
//! row (its number in the operator's input partition; for a call of several
//! rows that failed as a whole, its first row, the error saying how many rows
//! the call had); `null` emits every row of a failed call with a null output;
//! `skip` drops exactly the failed rows, each listed in the skip list by its
//! file URL (or `udf row N` when it has no file) when its call's result is
//! emitted (so in output order under `ordered = true`) and counted in the
//! `skipped_rows` metric. A call of several rows whose error names the row
//! that failed is run again without that row, so under `null` and `skip` only
//! the rows that fail lose their values (k failing rows cost k more calls).
//! Every row's prefetched files are released once its calls are done,
//! whatever the outcome.
//!
//! Under `ordered = false` an operator emits results as calls finish and
//! claims no output order; under `ordered = true` it keeps its input's order
//! (see [`udf_properties`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, RecordBatch, UInt32Array};
use datafusion::arrow::compute::take;
use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::metrics::{BaselineMetrics, Count, Gauge, MetricBuilder};
use futures::{Stream, StreamExt};
use tokio::sync::Semaphore;
use udfchain_udfs::{CallError, File, FileSource, UdfError, decode_column, with_file_source};

use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;

use super::batches::{append_column, take_rows};
use super::in_order::InOrder;
use super::prefetch::{Handoff, PrefetchExec};
use super::skip_list::SkipList;
use crate::cache::LocalCopies;
use crate::cache::StoreSource;
use crate::cache::{SharedCache, TempCache};
use crate::error::Error;
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
}

/// A call that failed, with the row (within the call's input batch) when known.
pub struct Failure {
    pub row: Option<usize>,
    pub error: Error,
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
        }
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
        let task = spawn_udf(with_file_source(source, fut));
        match task.await {
            Ok(Ok(v)) => Ok(v),
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

    fn error(&self, file: Option<String>, row: Option<u64>, source: crate::error::Source) -> Error {
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
    fn skip_entry(&self, batch: &RecordBatch, row: usize, row_base: u64) -> String {
        self.file_url(batch, row)
            .unwrap_or_else(|| format!("{} row {}", self.name, row_base + row as u64))
    }

    /// The skip list of this UDF (`on_error = skip`), bounded.
    pub(crate) fn skip_list(&self) -> &SkipList {
        &self.skipped
    }

    /// Tells the prefetch cache that the rows of `batch` are done with their files.
    pub fn release(&self, local: &Option<Arc<dyn LocalCopies>>, batch: &RecordBatch) {
        let Some(local) = local else { return };
        for &c in &self.file_params {
            if let Ok(files) = decode_column::<Option<File>>(batch.column(c)) {
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
        let files: Vec<Option<File>> = decode_column(&col.slice(row, 1)).ok()?;
        files.into_iter().next().flatten().map(|f| f.url())
    }
}

/// How a UDF operator's output relates to its input.
#[derive(Debug, Clone)]
pub enum Shape {
    /// Input columns then the UDF's column, at most one row per input row; as
    /// many partitions as the input.
    Append,
    /// Like `Append`, but an input row may repeat (a generator).
    Expand,
    /// One partition of groups: these key columns then the UDF's column.
    Group(Vec<usize>),
}

/// The parts every UDF operator has: its input, the UDF, how it is called,
/// whether its input is the `PrefetchExec` that fetches its files, and the
/// plan's bookkeeping.
#[derive(Debug)]
pub struct UdfOperator<U: ?Sized> {
    pub input: Arc<dyn ExecutionPlan>,
    pub udf: Arc<U>,
    pub call: Arc<UdfCall>,
    /// The input is a `PrefetchExec` whose local copies the calls read.
    pub prefetched: bool,
    pub schema: SchemaRef,
    pub properties: Arc<datafusion::physical_plan::PlanProperties>,
    pub metrics: ExecutionPlanMetricsSet,
    shape: Shape,
}

impl<U: ?Sized> UdfOperator<U> {
    pub fn new(
        input: Arc<dyn ExecutionPlan>,
        udf: Arc<U>,
        call: Arc<UdfCall>,
        prefetched: bool,
        schema: SchemaRef,
        shape: Shape,
    ) -> Self {
        Self {
            properties: Arc::new(udf_properties(
                &input,
                Arc::clone(&schema),
                &shape,
                call.ordered,
            )),
            input,
            udf,
            call,
            prefetched,
            schema,
            metrics: ExecutionPlanMetricsSet::new(),
            shape,
        }
    }

    /// The same operator over a new input.
    pub fn with_input(&self, input: Arc<dyn ExecutionPlan>) -> Self {
        Self::new(
            input,
            Arc::clone(&self.udf),
            Arc::clone(&self.call),
            self.prefetched,
            Arc::clone(&self.schema),
            self.shape.clone(),
        )
    }

    /// Executes the input of `partition` and gathers what its calls share. The
    /// input goes first: executing it starts the `PrefetchExec` whose local
    /// copies the calls read.
    pub fn start(
        &self,
        partition: usize,
        ctx: &Arc<TaskContext>,
    ) -> DfResult<(SendableRecordBatchStream, Partition<U>, BaselineMetrics)> {
        self.start_with(partition, ctx, false)
    }

    /// [`UdfOperator::start`]; with `handoff` (an operator that puts its
    /// results back in input order itself) an ordered `PrefetchExec` below
    /// hands rows on as their downloads finish, and [`Partition::handoff`]
    /// says where each belongs.
    pub fn start_with(
        &self,
        partition: usize,
        ctx: &Arc<TaskContext>,
        handoff: bool,
    ) -> DfResult<(SendableRecordBatchStream, Partition<U>, BaselineMetrics)> {
        let (input, handle) = if self.prefetched {
            let prefetch = self.input.downcast_ref::<PrefetchExec>().ok_or_else(|| {
                Error::internal(format!(
                    "UDF {} reads prefetched files but its input is {}, not its PrefetchExec",
                    self.call.name,
                    self.input.name()
                ))
                .into_df()
            })?;
            let (input, handle) =
                prefetch.execute_with_copies(partition, Arc::clone(ctx), handoff)?;
            (input, Some(handle))
        } else {
            (self.input.execute(partition, Arc::clone(ctx))?, None)
        };
        let (local, temp, handoff) = match handle {
            Some(h) => (Some(h.local), Some(h.temp), h.handoff),
            None => (None, None, None),
        };
        let part = Partition {
            source: self.call.file_source(ctx, local.clone())?,
            local,
            temp,
            handoff,
            copies_left: MetricBuilder::new(&self.metrics).gauge("copies_left", partition),
            call: Arc::clone(&self.call),
            udf: Arc::clone(&self.udf),
            schema: Arc::clone(&self.schema),
            skipped_rows: MetricBuilder::new(&self.metrics).counter("skipped_rows", partition),
        };
        Ok((input, part, BaselineMetrics::new(&self.metrics, partition)))
    }
}

/// What the calls of one partition of a UDF operator share; cheap to clone
/// into each call's future.
pub struct Partition<U: ?Sized> {
    pub call: Arc<UdfCall>,
    pub udf: Arc<U>,
    /// Serves the UDF's `File` reads.
    pub source: Arc<dyn FileSource>,
    /// The operator's output schema.
    pub schema: SchemaRef,
    /// The copies the `PrefetchExec` below made, released row by row.
    pub local: Option<Arc<dyn LocalCopies>>,
    /// The same copies, counted.
    temp: Option<Arc<TempCache>>,
    /// Rows come as their downloads finish, each with its position here.
    pub handoff: Option<Arc<Handoff>>,
    /// Copies still counted on when the output ended (0: every row released its files).
    copies_left: Gauge,
    /// Rows dropped under `on_error = skip` (every one, listed or not).
    skipped_rows: Count,
}

impl<U: ?Sized> Clone for Partition<U> {
    fn clone(&self) -> Self {
        Self {
            call: Arc::clone(&self.call),
            udf: Arc::clone(&self.udf),
            source: Arc::clone(&self.source),
            schema: Arc::clone(&self.schema),
            local: self.local.clone(),
            temp: self.temp.clone(),
            handoff: self.handoff.clone(),
            copies_left: self.copies_left.clone(),
            skipped_rows: self.skipped_rows.clone(),
        }
    }
}

impl<U: ?Sized> Partition<U> {
    /// A stream of no batches to chain after the operator's output: reached
    /// when the output is complete, it records in `copies_left` how many of
    /// the prefetched copies of this partition are still counted on (0 when
    /// every row released its files).
    pub fn end(&self) -> impl Stream<Item = DfResult<RecordBatch>> + Send + 'static {
        let (temp, gauge) = (self.temp.clone(), self.copies_left.clone());
        futures::stream::once(async move {
            if let Some(temp) = temp {
                gauge.set(temp.len());
            }
        })
        .filter_map(|()| futures::future::ready(None))
    }

    /// The operator's output stream: `calls` run `parallel` at once (results in
    /// input order, or as they finish with `ordered = false`), each call's
    /// skips recorded as its result is emitted, output rows counted, and the
    /// end-of-output bookkeeping of [`Partition::end`] last.
    pub fn output<S, F>(self, calls: S, baseline: BaselineMetrics) -> SendableRecordBatchStream
    where
        U: Send + Sync + 'static,
        S: Stream<Item = F> + Send + 'static,
        F: Future<Output = DfResult<Done>> + Send + 'static,
    {
        use futures::TryStreamExt;
        let (parallel, ordered) = (self.call.parallel, self.call.ordered);
        let (schema, end) = (Arc::clone(&self.schema), self.end());
        let results = if ordered {
            calls.buffered(parallel).boxed()
        } else {
            calls.buffer_unordered(parallel).boxed()
        };
        let stream = results
            .try_filter_map(move |done| futures::future::ready(Ok(self.emit(done))))
            .inspect_ok(move |b| baseline.record_output(b.num_rows()))
            .chain(end);
        Box::pin(datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(schema, stream))
    }

    /// The output stream of an operator whose calls come from a [`Handoff`]
    /// (rows as their downloads finish): each call's future resolves to the
    /// row's position and its result; `calls` run `parallel` at once, as they
    /// come, and their results are emitted in input order (see [`InOrder`]).
    pub fn output_in_order<S, F>(
        self,
        calls: S,
        handoff: Arc<Handoff>,
        baseline: BaselineMetrics,
    ) -> SendableRecordBatchStream
    where
        U: Send + Sync + 'static,
        S: Stream<Item = F> + Send + 'static,
        F: Future<Output = (Option<u64>, DfResult<Done>)> + Send + 'static,
    {
        use futures::TryStreamExt;
        let (schema, end) = (Arc::clone(&self.schema), self.end());
        let results = InOrder::new(calls.buffer_unordered(self.call.parallel).boxed(), handoff);
        let stream = results
            .try_filter_map(move |done| futures::future::ready(Ok(self.emit(done))))
            .inspect_ok(move |b| baseline.record_output(b.num_rows()))
            .chain(end);
        Box::pin(datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(schema, stream))
    }

    /// Records rows `rows` of `batch` (whose first row is row `row_base` of
    /// the partition) as dropped by `on_error = skip`.
    pub fn skip(&self, batch: &RecordBatch, row_base: u64, rows: impl IntoIterator<Item = usize>) {
        self.record(self.skips(batch, row_base, rows));
    }

    /// The skip-list entries of rows `rows` of `batch`, to [`Partition::record`]
    /// when the call's result is emitted (so an ordered operator lists them in
    /// output order).
    pub fn skips(
        &self,
        batch: &RecordBatch,
        row_base: u64,
        rows: impl IntoIterator<Item = usize>,
    ) -> Vec<String> {
        rows.into_iter()
            .map(|r| self.call.skip_entry(batch, r, row_base))
            .collect()
    }

    /// Lists and counts rows dropped under `on_error = skip`.
    pub fn record(&self, skipped: Vec<String>) {
        for entry in skipped {
            self.call.skipped.push(entry);
            self.skipped_rows.add(1);
        }
    }

    /// Records the skips of a finished call and passes on its rows.
    pub fn emit(&self, done: Done) -> Option<RecordBatch> {
        self.record(done.skipped);
        done.batch
    }

    /// Runs `udf_fn` on the params of `batch` (whose first row is row `base`
    /// of the partition), releases the batch's prefetched files, and returns
    /// `batch` with the UDF's output column appended, `on_error` applied (see
    /// the module header), with the rows it skipped (to [`Partition::emit`]).
    pub async fn call_rows<F, Fut>(
        &self,
        batch: &RecordBatch,
        base: u64,
        udf_fn: F,
    ) -> DfResult<Done>
    where
        F: Fn(Arc<U>, RecordBatch) -> Fut,
        Fut: Future<Output = Result<ArrayRef, CallError>> + Send + 'static,
    {
        let result = self.isolate(batch, base, &udf_fn).await;
        self.call.release(&self.local, batch);
        let Isolated {
            rows,
            values,
            mut failed,
        } = result?;
        let all = batch.num_rows();
        if failed.is_empty()
            && let Some(values) = values
        {
            return Done::rows(append_column(&self.schema, batch, values)?);
        }
        failed.sort_unstable();
        if self.call.on_error == OnError::Skip {
            let skipped = self.skips(batch, base, failed.iter().copied());
            let batch = match values {
                Some(values) => Some(append_column(
                    &self.schema,
                    &take_rows(batch, &rows)?,
                    values,
                )?),
                None => None,
            };
            return Ok(Done { batch, skipped });
        }
        // `null`: every row, the failed ones with a null output.
        let output = match values {
            None => null_output(&self.schema, all),
            Some(values) => {
                let mut at: Vec<Option<u32>> = vec![None; all];
                for (i, &r) in rows.iter().enumerate() {
                    at[r] = Some(i as u32);
                }
                take(values.as_ref(), &UInt32Array::from(at), None)?
            }
        };
        Done::rows(append_column(&self.schema, batch, output)?)
    }

    /// Calls the UDF on `batch`; under `null` and `skip`, a failure naming its
    /// row is retried without that row until a call succeeds or fails as a
    /// whole. Under `fail`, a failure is the error.
    async fn isolate<F, Fut>(
        &self,
        batch: &RecordBatch,
        base: u64,
        udf_fn: &F,
    ) -> DfResult<Isolated>
    where
        F: Fn(Arc<U>, RecordBatch) -> Fut,
        Fut: Future<Output = Result<ArrayRef, CallError>> + Send + 'static,
    {
        let mut rows: Vec<usize> = (0..batch.num_rows()).collect();
        let mut failed = Vec::new();
        loop {
            let sub = if rows.len() == batch.num_rows() {
                batch.clone()
            } else {
                take_rows(batch, &rows)?
            };
            let fut = udf_fn(Arc::clone(&self.udf), self.call.params_batch(&sub)?);
            let result = match self.call.run(Arc::clone(&self.source), fut).await {
                Ok(v) if v.len() == sub.num_rows() => Ok(v),
                Ok(v) => Err(Failure {
                    row: None,
                    error: self.call.error(
                        None,
                        None,
                        Arc::new(UdfError::Contract(format!(
                            "{} returned {} values for {} rows",
                            self.call.kind,
                            v.len(),
                            sub.num_rows()
                        ))),
                    ),
                }),
                Err(f) => Err(f),
            };
            match result {
                Ok(values) => {
                    return Ok(Isolated {
                        rows,
                        values: Some(values),
                        failed,
                    });
                }
                Err(f) if self.call.on_error == OnError::Fail => {
                    return Err(self.call.locate(f, &sub, base));
                }
                Err(Failure { row: Some(r), .. }) if r < rows.len() && rows.len() > 1 => {
                    failed.push(rows.remove(r));
                }
                Err(_) => {
                    failed.append(&mut rows);
                    return Ok(Isolated {
                        rows,
                        values: None,
                        failed,
                    });
                }
            }
        }
    }
}

/// The outcome of one call: the rows to emit and the skip-list entries of
/// the rows it dropped.
pub struct Done {
    pub batch: Option<RecordBatch>,
    pub skipped: Vec<String>,
}

impl Done {
    pub fn rows(batch: RecordBatch) -> DfResult<Self> {
        Ok(Self {
            batch: Some(batch),
            skipped: Vec::new(),
        })
    }

    pub fn dropped(skipped: Vec<String>) -> DfResult<Self> {
        Ok(Self {
            batch: None,
            skipped,
        })
    }
}

/// The outcome of [`Partition::isolate`]: the rows that have `values`, and
/// the rows that failed (both indexes into the call's batch).
struct Isolated {
    rows: Vec<usize>,
    values: Option<ArrayRef>,
    failed: Vec<usize>,
}

/// Plan properties of a UDF operator over `input`. Under `ordered`, the
/// output keeps what the input's equivalence properties say about the columns
/// it passes on (its orderings, constants and equalities; uniqueness only when
/// rows are not repeated); otherwise nothing is claimed. Emits incrementally.
pub fn udf_properties(
    input: &Arc<dyn ExecutionPlan>,
    schema: SchemaRef,
    shape: &Shape,
    ordered: bool,
) -> datafusion::physical_plan::PlanProperties {
    use datafusion::common::Constraints;
    use datafusion::physical_expr::EquivalenceProperties;
    use datafusion::physical_expr::equivalence::ProjectionMapping;
    use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
    use datafusion::physical_plan::{ExecutionPlanProperties, Partitioning};
    let input_schema = input.schema();
    let (kept, parts) = match shape {
        Shape::Append | Shape::Expand => (
            (0..input_schema.fields().len()).collect::<Vec<_>>(),
            input.output_partitioning().partition_count(),
        ),
        Shape::Group(keys) => (keys.clone(), 1),
    };
    let eq = match ProjectionMapping::from_indices(&kept, &input_schema) {
        Ok(mapping) if ordered => {
            let mut eq = input
                .equivalence_properties()
                .project(&mapping, Arc::clone(&schema));
            if parts == 1 && input.output_partitioning().partition_count() > 1 {
                eq.clear_per_partition_constants();
            }
            if !matches!(shape, Shape::Append) {
                // Repeated rows (several outputs of one row or group) are not unique.
                eq.set_constraints(Constraints::default());
            }
            eq
        }
        _ => EquivalenceProperties::new(Arc::clone(&schema)),
    };
    datafusion::physical_plan::PlanProperties::new(
        eq,
        Partitioning::UnknownPartitioning(parts),
        EmissionType::Incremental,
        Boundedness::Bounded,
    )
}

/// The null output of a row whose call failed under `on_error = null`.
pub fn null_output(schema: &SchemaRef, rows: usize) -> ArrayRef {
    let field = schema.field(schema.fields().len() - 1);
    datafusion::arrow::array::new_null_array(field.data_type(), rows)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::physical_expr::expressions::Column;
    use datafusion::physical_expr::{LexOrdering, PhysicalSortExpr};
    use datafusion::physical_plan::empty::EmptyExec;
    use datafusion::physical_plan::sorts::sort::SortExec;
    use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};
    use udfchain_udfs::{agg_fn, batch_map_fn, gen_fn, map_fn};

    use super::UdfCall;
    use crate::plan::{AggregateExec, BatchMapExec, GenerateExec, MapExec};
    use crate::settings::OnError;

    /// `id, key` sorted by `id`.
    fn sorted_input() -> Arc<dyn ExecutionPlan> {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::UInt64, false),
            Field::new("key", DataType::Utf8, false),
        ]));
        let by_id = LexOrdering::new([PhysicalSortExpr::new_default(Arc::new(Column::new(
            "id", 0,
        )))])
        .expect("ordering");
        Arc::new(SortExec::new(by_id, Arc::new(EmptyExec::new(schema))))
    }

    fn call(ordered: bool) -> Arc<UdfCall> {
        let params = vec![(0, "id".to_string())];
        Arc::new(
            UdfCall::new(
                "v".into(),
                "map",
                params,
                vec![],
                vec![],
                2,
                2,
                OnError::Fail,
                Default::default(),
            )
            .with_ordered(ordered),
        )
    }

    fn out_schema(input: &[&str]) -> Arc<Schema> {
        let mut fields: Vec<Field> = input
            .iter()
            .map(|n| match *n {
                "id" => Field::new("id", DataType::UInt64, false),
                _ => Field::new(*n, DataType::Utf8, false),
            })
            .collect();
        fields.push(Field::new("v", DataType::UInt64, true));
        Arc::new(Schema::new(fields))
    }

    /// The ordering a plan declares, as text (`id@0 ASC`), if any.
    fn ordering(plan: &dyn ExecutionPlan) -> Option<String> {
        plan.output_ordering().map(|o| o.to_string())
    }

    #[test]
    fn operators_declare_the_order_they_keep_and_none_when_unordered() {
        let map = map_fn(&["id"], "v", |id: u64| async move {
            Ok::<_, std::io::Error>(id)
        })
        .expect("map");
        let batch = batch_map_fn(&["id"], "v", |ids: Vec<u64>| async move {
            Ok::<_, std::io::Error>(ids)
        })
        .expect("batch_map");
        let generator = gen_fn(&["id"], "v", |id: u64| {
            futures::stream::iter([Ok::<_, std::io::Error>(id)])
        })
        .expect("gen");
        let agg = agg_fn(&["id"], "v", |ids: Vec<u64>| async move {
            Ok::<_, std::io::Error>(ids)
        })
        .expect("agg");
        let by_id = Some("id@0 ASC".to_string());
        for ordered in [true, false] {
            let want = if ordered { by_id.clone() } else { None };
            let appended = out_schema(&["id", "key"]);
            let plans: Vec<Arc<dyn ExecutionPlan>> = vec![
                Arc::new(MapExec::new(
                    sorted_input(),
                    Arc::clone(&map),
                    call(ordered),
                    false,
                    Arc::clone(&appended),
                )),
                Arc::new(BatchMapExec::new(
                    sorted_input(),
                    Arc::clone(&batch),
                    call(ordered),
                    false,
                    Arc::clone(&appended),
                )),
                Arc::new(GenerateExec::new(
                    sorted_input(),
                    Arc::clone(&generator),
                    call(ordered),
                    false,
                    Arc::clone(&appended),
                )),
            ];
            for plan in plans {
                assert_eq!(
                    ordering(plan.as_ref()),
                    want,
                    "{} ordered={ordered}",
                    plan.name()
                );
                assert_eq!(
                    plan.maintains_input_order(),
                    vec![ordered],
                    "{}",
                    plan.name()
                );
            }
            // An aggregate's output is its keys (here `id`) and the value.
            let grouped = AggregateExec::new(
                sorted_input(),
                Arc::clone(&agg),
                call(ordered),
                vec![(0, "id".to_string())],
                false,
                out_schema(&["id"]),
            );
            assert_eq!(ordering(&grouped), want, "AggregateExec ordered={ordered}");
            // Grouped by `key`, which the input is not sorted by: no order claimed.
            let by_key = AggregateExec::new(
                sorted_input(),
                Arc::clone(&agg),
                call(ordered),
                vec![(1, "key".to_string())],
                false,
                out_schema(&["key"]),
            );
            assert_eq!(ordering(&by_key), None);
        }
    }
}
