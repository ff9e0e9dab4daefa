//! What every UDF operator shares: the [`UdfCall`] that runs one call of a UDF on
//! the UDF pool and turns its failures into errors naming the UDF, the file and
//! the row; batch slicing helpers; and the boilerplate of unary operators.
//!
//! Guarantees: at most `parallel` calls of one UDF run at once across all its
//! partitions; a call's future is aborted when the operator's stream is dropped;
//! a panicking UDF fails the query with an error, never unwinds into it.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, RecordBatch, UInt32Array};
use datafusion::arrow::compute::take;
use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::metrics::BaselineMetrics;
use tokio::sync::Semaphore;
use udfchain_udfs::{CallError, File, FileSource, decode_column, with_file_source};

use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;

use super::prefetch::PrefetchLink;
use crate::cache::SharedCache;
use crate::error::Error;
use crate::runtime::spawn_udf;
use crate::settings::OnError;
use crate::storage::StoreSource;
use crate::storage::source::LocalCopies;

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
    pub storage_options: BTreeMap<String, String>,
    /// The shared cache dir, its size limit, and whether reads fill it (`cache = true`).
    cache: Option<(std::path::PathBuf, Option<u64>, bool)>,
    slots: Arc<Semaphore>,
    skipped: std::sync::Mutex<Vec<String>>,
}

/// A call that failed, with the row (within the call's input batch) when known.
pub struct Failure {
    pub row: Option<usize>,
    pub error: Error,
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
            storage_options,
            cache: None,
            slots: Arc::new(Semaphore::new(parallel.max(1))),
            skipped: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// Reads of files no prefetch fetched are served from the shared cache at
    /// `dir` when it holds them, and with `fill` (`cache = true`) go through it.
    pub fn with_cache(mut self, dir: std::path::PathBuf, limit: Option<u64>, fill: bool) -> Self {
        self.cache = Some((dir, limit, fill));
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
        let task = spawn_udf(async move {
            let _slot = slots.acquire_owned().await;
            with_file_source(source, fut).await
        });
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
    pub fn locate(&self, f: Failure, batch: &RecordBatch, row_base: u64) -> DataFusionError {
        let row = match (f.row, batch.num_rows()) {
            (Some(r), _) => Some(r),
            (None, 1) => Some(0),
            _ => None,
        };
        let file = row.and_then(|r| self.file_url(batch, r));
        match f.error {
            Error::Udf { udf, source, .. } => Error::Udf {
                udf,
                file,
                row: row.map(|r| row_base + r as u64),
                source,
            },
            other => other,
        }
        .into_df()
    }

    /// Records the rows of `batch` as skipped (`on_error = skip`), by file URL
    /// where the row has a file, else by UDF and row number.
    pub fn record_skip(&self, batch: &RecordBatch, row_base: u64) {
        let mut skipped = self.skipped.lock().unwrap_or_else(|p| p.into_inner());
        for r in 0..batch.num_rows() {
            let what = self
                .file_url(batch, r)
                .unwrap_or_else(|| format!("{} row {}", self.name, row_base + r as u64));
            skipped.push(what);
        }
    }

    /// What `record_skip` recorded.
    pub fn skipped(&self) -> Vec<String> {
        self.skipped
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
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

/// The parts every UDF operator has: its input, the UDF, how it is called, the
/// link to the `PrefetchExec` below it, and the plan's bookkeeping.
#[derive(Debug)]
pub struct UdfOperator<U: ?Sized> {
    pub input: Arc<dyn ExecutionPlan>,
    pub udf: Arc<U>,
    pub call: Arc<UdfCall>,
    pub link: Option<Arc<PrefetchLink>>,
    pub schema: SchemaRef,
    pub properties: Arc<datafusion::physical_plan::PlanProperties>,
    pub metrics: ExecutionPlanMetricsSet,
    /// One output partition (an aggregate), else as many as the input has.
    single: bool,
}

impl<U: ?Sized> UdfOperator<U> {
    pub fn new(
        input: Arc<dyn ExecutionPlan>,
        udf: Arc<U>,
        call: Arc<UdfCall>,
        link: Option<Arc<PrefetchLink>>,
        schema: SchemaRef,
        single: bool,
    ) -> Self {
        use datafusion::physical_plan::ExecutionPlanProperties;
        let parts = if single {
            1
        } else {
            input.output_partitioning().partition_count()
        };
        Self {
            properties: Arc::new(udf_properties(Arc::clone(&schema), parts)),
            input,
            udf,
            call,
            link,
            schema,
            metrics: ExecutionPlanMetricsSet::new(),
            single,
        }
    }

    /// The same operator over a new input.
    pub fn with_input(&self, input: Arc<dyn ExecutionPlan>) -> Self {
        Self::new(
            input,
            Arc::clone(&self.udf),
            Arc::clone(&self.call),
            self.link.clone(),
            Arc::clone(&self.schema),
            self.single,
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
        let input = self.input.execute(partition, Arc::clone(ctx))?;
        let local = self.link.as_ref().and_then(|l| l.local(partition));
        let part = Partition {
            source: self.call.file_source(ctx, local.clone())?,
            local,
            call: Arc::clone(&self.call),
            udf: Arc::clone(&self.udf),
            schema: Arc::clone(&self.schema),
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
}

impl<U: ?Sized> Clone for Partition<U> {
    fn clone(&self) -> Self {
        Self {
            call: Arc::clone(&self.call),
            udf: Arc::clone(&self.udf),
            source: Arc::clone(&self.source),
            schema: Arc::clone(&self.schema),
            local: self.local.clone(),
        }
    }
}

impl<U: ?Sized> Partition<U> {
    /// Runs `udf_fn` on the params of `batch` (whose first row is row `base` of
    /// the partition), releases the batch's prefetched files, and returns the
    /// UDF's output column. A failure becomes what `on_error` says: an error
    /// naming the UDF, file and row (`fail`), `None` with the rows recorded
    /// (`skip`), or a column of nulls (`null`).
    pub async fn call_column<F, Fut>(
        &self,
        batch: &RecordBatch,
        base: u64,
        udf_fn: F,
    ) -> DfResult<Option<ArrayRef>>
    where
        F: FnOnce(Arc<U>, RecordBatch) -> Fut,
        Fut: Future<Output = Result<ArrayRef, CallError>> + Send + 'static,
    {
        let params = self.call.params_batch(batch)?;
        let fut = udf_fn(Arc::clone(&self.udf), params);
        let result = self.call.run(Arc::clone(&self.source), fut).await;
        self.call.release(&self.local, batch);
        match result {
            Ok(values) => Ok(Some(values)),
            Err(f) => match self.call.on_error {
                OnError::Fail => Err(self.call.locate(f, batch, base)),
                OnError::Skip => {
                    self.call.record_skip(batch, base);
                    Ok(None)
                }
                OnError::Null => Ok(Some(null_output(&self.schema, batch.num_rows()))),
            },
        }
    }
}

/// Splits `batch` into slices of at most `rows` rows.
pub fn slices(batch: &RecordBatch, rows: usize) -> Vec<RecordBatch> {
    let rows = rows.max(1);
    (0..batch.num_rows())
        .step_by(rows)
        .map(|start| batch.slice(start, rows.min(batch.num_rows() - start)))
        .collect()
}

/// `row` of `batch` repeated `n` times, column by column.
pub fn repeat_row(batch: &RecordBatch, row: usize, n: usize) -> DfResult<Vec<ArrayRef>> {
    let idx = UInt32Array::from(vec![row as u32; n]);
    batch
        .columns()
        .iter()
        .map(|c| Ok(take(c.as_ref(), &idx, None)?))
        .collect()
}

/// `batch`'s columns followed by `output`, as a batch of `schema`.
pub fn append_column(
    schema: &SchemaRef,
    batch: &RecordBatch,
    output: ArrayRef,
) -> DfResult<RecordBatch> {
    let mut cols = batch.columns().to_vec();
    cols.push(output);
    Ok(RecordBatch::try_new(Arc::clone(schema), cols)?)
}

/// Implements the parts of `ExecutionPlan` that are the same for every
/// single-input udfchain operator. The type needs fields `input`,
/// `properties`, `metrics` and a method `with_input(&self, input) -> Self`.
macro_rules! unary_exec_boilerplate {
    ($name:literal $(, $base:ident)?) => {
        fn name(&self) -> &str {
            $name
        }

        fn properties(&self) -> &std::sync::Arc<datafusion::physical_plan::PlanProperties> {
            &self$(.$base)?.properties
        }

        fn children(&self) -> Vec<&std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
            vec![&self$(.$base)?.input]
        }

        fn benefits_from_input_partitioning(&self) -> Vec<bool> {
            // Each operator runs `parallel` calls itself; more partitions would
            // only scatter the input order.
            vec![false]
        }

        fn apply_expressions(
            &self,
            _f: &mut dyn FnMut(
                &std::sync::Arc<dyn datafusion::physical_expr::PhysicalExpr>,
            ) -> datafusion::error::Result<
                datafusion::common::tree_node::TreeNodeRecursion,
            >,
        ) -> datafusion::error::Result<datafusion::common::tree_node::TreeNodeRecursion> {
            Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
        }

        fn with_new_children(
            self: std::sync::Arc<Self>,
            mut children: Vec<std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>>,
        ) -> datafusion::error::Result<std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>>
        {
            if children.len() != 1 {
                return datafusion::common::internal_err!("{} takes one input", $name);
            }
            Ok(std::sync::Arc::new(
                self.with_input(children.swap_remove(0)),
            ))
        }

        fn metrics(&self) -> Option<datafusion::physical_plan::metrics::MetricsSet> {
            Some(self$(.$base)?.metrics.clone_inner())
        }
    };
}

pub(crate) use unary_exec_boilerplate;

/// Plan properties of a UDF operator: `partitions` partitions of unknown layout,
/// emitting incrementally.
pub fn udf_properties(
    schema: SchemaRef,
    partitions: usize,
) -> datafusion::physical_plan::PlanProperties {
    use datafusion::physical_expr::EquivalenceProperties;
    use datafusion::physical_plan::Partitioning;
    use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
    datafusion::physical_plan::PlanProperties::new(
        EquivalenceProperties::new(schema),
        Partitioning::UnknownPartitioning(partitions),
        EmissionType::Incremental,
        Boundedness::Bounded,
    )
}

/// The null output of a row whose call failed under `on_error = null`.
pub fn null_output(schema: &SchemaRef, rows: usize) -> ArrayRef {
    let field = schema.field(schema.fields().len() - 1);
    datafusion::arrow::array::new_null_array(field.data_type(), rows)
}
