//! The one meaning of `on_error`, the same for every UDF kind
//! ([`CallContext::call_rows`]): `fail` fails the query with an error naming the UDF, the file (the first `File` param of the row) and the
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

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, RecordBatch, UInt32Array};
use datafusion::arrow::compute::take;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::error::Result as DfResult;
use futures::future::BoxFuture;
use udfchain_udfs::{CallError, EachRow, UdfError};

use crate::plan::exec::output_stream::Done;
use crate::plan::exec::udf_call::Failure;
use crate::plan::exec::udf_exec::CallContext;
use crate::plan::memo::Key;
use crate::plan::row_slices::{append_column, slices, take_rows};
use crate::settings::OnError;

impl<U: ?Sized> CallContext<U> {
    /// Records rows `rows` of `batch` (whose first row is row `row_base` of
    /// the partition) as dropped by `on_error = skip`.
    pub fn skip(&self, batch: &RecordBatch, row_base: u64, rows: impl IntoIterator<Item = usize>) {
        self.record(self.skips(batch, row_base, rows));
    }

    /// The skip-list entries of rows `rows` of `batch`, to [`CallContext::record`]
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
            self.call.skip_list().push(entry);
            self.skipped_rows.add(1);
        }
    }

    /// Runs `udf_fn` on the params of `batch` (whose first row is row `base`
    /// of the partition), releases the batch's prefetched files, and returns
    /// `batch` with the UDF's output column appended, `on_error` applied (see
    /// the module header), with the rows it skipped (to [`CallContext::emit`]).
    ///
    /// With a checkpoint ([`UdfCall::memo`](crate::plan::exec::udf_call::UdfCall)), rows it
    /// holds take their kept value without a call (their files were not
    /// fetched, so none is released), a call of some held and some new rows
    /// is made row by row, and every value computed is kept.
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
        self.call_rows_as(batch, base, &udf_fn, Calls::Whole).await
    }

    /// [`CallContext::call_rows`], the rows given to the UDF as `calls` says.
    pub(super) async fn call_rows_as<F, Fut>(
        &self,
        batch: &RecordBatch,
        base: u64,
        udf_fn: &F,
        calls: Calls<'_>,
    ) -> DfResult<Done>
    where
        F: Fn(Arc<U>, RecordBatch) -> Fut,
        Fut: Future<Output = Result<ArrayRef, CallError>> + Send + 'static,
    {
        let Some(memo) = &self.call.memo else {
            return self.call_new_rows(batch, base, udf_fn, None, calls).await;
        };
        let keys = memo.keys(batch)?;
        if memo.kept() == 0 || !keys.iter().any(|k| memo.contains(k)) {
            return self
                .call_new_rows(batch, base, udf_fn, Some(keys), calls)
                .await;
        }
        if let Some(values) = memo.values(&keys)? {
            self.checkpoint_hits.add(batch.num_rows());
            return Done::rows(append_column(&self.schema, batch, values)?);
        }
        // Some rows held, some not: each row on its own.
        let mut parts = Vec::new();
        for (i, (row, key)) in slices(batch, 1).into_iter().zip(keys).enumerate() {
            let done = match memo.values(&[key])? {
                Some(value) => {
                    self.checkpoint_hits.add(1);
                    Done::rows(append_column(&self.schema, &row, value)?)?
                }
                None => {
                    self.call_new_rows(&row, base + i as u64, udf_fn, Some(vec![key]), calls)
                        .await?
                }
            };
            parts.push(done);
        }
        Done::concat(&self.schema, parts)
    }

    /// [`CallContext::call_rows`] of rows the checkpoint does not hold (named
    /// by `keys` when there is one, to keep their values).
    async fn call_new_rows<F, Fut>(
        &self,
        batch: &RecordBatch,
        base: u64,
        udf_fn: &F,
        keys: Option<Vec<Key>>,
        calls: Calls<'_>,
    ) -> DfResult<Done>
    where
        F: Fn(Arc<U>, RecordBatch) -> Fut,
        Fut: Future<Output = Result<ArrayRef, CallError>> + Send + 'static,
    {
        let result = match calls {
            Calls::Each(each) => self.isolate_each(batch, base, each).await,
            _ => self.isolate(batch, base, udf_fn).await,
        };
        self.call.release(&self.local, batch);
        let Isolated {
            rows,
            values,
            mut failed,
        } = result?;
        if let (Some(memo), Some(keys), Some(values)) = (&self.call.memo, keys, &values) {
            let kept = rows.iter().map(|&r| keys[r]).collect();
            memo.record(kept, Arc::clone(values)).await;
        }
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
                Err(f) if self.call.on_error_for(&f) == OnError::Fail => {
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

impl<U: ?Sized> CallContext<U> {
    /// Calls the UDF on each row of `batch` alone, one row after another in
    /// one task on the UDF pool, through `each` (see [`Calls::Each`]). Under
    /// `fail` the first failure is the error and no later row is called.
    async fn isolate_each(
        &self,
        batch: &RecordBatch,
        base: u64,
        each: &EachFn,
    ) -> DfResult<Isolated> {
        let fail_fast = self.call.on_error == OnError::Fail;
        let fut = each(self.call.params_batch(batch)?, fail_fast);
        // Timed inside the task: the UDF's own pace, not the wait for a slot
        // (which would shrink the next calls' runs of rows to one).
        let timed = async move {
            let started = std::time::Instant::now();
            fut.await.map(|each| (each, started.elapsed()))
        };
        let n = batch.num_rows();
        let whole = match self.call.run(Arc::clone(&self.source), timed).await {
            Ok((each, took)) => {
                self.call.row_cost().observe(took, each.outcomes.len());
                let called_ok = each.outcomes.iter().filter(|o| o.is_ok()).count();
                let stopped = fail_fast && matches!(each.outcomes.last(), Some(Err(_)));
                if each.values.len() == called_ok
                    && (each.outcomes.len() == n || stopped && each.outcomes.len() < n)
                {
                    Ok(each)
                } else {
                    let contract = UdfError::Contract(format!(
                        "{} returned {} values and {} outcomes for {n} rows ({called_ok} without error)",
                        self.call.kind,
                        each.values.len(),
                        each.outcomes.len(),
                    ));
                    Err(Failure {
                        row: None,
                        error: self.call.error(None, None, Arc::new(contract)),
                    })
                }
            }
            Err(f) => Err(f),
        };
        let EachRow { values, outcomes } = match whole {
            Ok(each) => each,
            Err(f) if fail_fast || f.is_setup() => return Err(self.call.locate(f, batch, base)),
            Err(_) => {
                return Ok(Isolated {
                    rows: Vec::new(),
                    values: None,
                    failed: (0..n).collect(),
                });
            }
        };
        let (mut rows, mut failed) = (Vec::new(), Vec::new());
        for (r, outcome) in outcomes.into_iter().enumerate() {
            match outcome {
                Ok(()) => rows.push(r),
                Err(e) => {
                    let failure = Failure {
                        row: None,
                        error: self.call.error(None, None, Arc::from(e.source)),
                    };
                    if !fail_fast && !failure.is_setup() {
                        failed.push(r);
                        continue;
                    }
                    return Err(self
                        .call
                        .locate(failure, &batch.slice(r, 1), base + r as u64));
                }
            }
        }
        Ok(Isolated {
            rows,
            values: (!values.is_empty() || failed.is_empty()).then_some(values),
            failed,
        })
    }
}

/// Calls a UDF on each row of a params batch as its own call
/// ([`udfchain_udfs::Mapper::map_each`]); `true`: stop at the first error.
pub(super) type EachFn =
    dyn Fn(RecordBatch, bool) -> BoxFuture<'static, Result<EachRow, CallError>> + Sync;

/// How the rows of one batch are given to the UDF.
#[derive(Clone, Copy)]
pub(super) enum Calls<'a> {
    /// In one call (a failure naming its row is called again without it).
    Whole,
    /// Each row its own call (its own unit of error: a failing row costs no
    /// other row a second call, a panic fails only its row), all made one
    /// after another in one task on the UDF pool holding one of the
    /// `parallel` slots: a run of rows costs one thread crossing, not one each.
    Each(&'a EachFn),
}

/// The outcome of [`CallContext::isolate`]: the rows that have `values`, and
/// the rows that failed (both indexes into the call's batch).
struct Isolated {
    rows: Vec<usize>,
    values: Option<ArrayRef>,
    failed: Vec<usize>,
}

/// The null output of a row whose call failed under `on_error = null`.
pub fn null_output(schema: &SchemaRef, rows: usize) -> ArrayRef {
    let field = schema.field(schema.fields().len() - 1);
    datafusion::arrow::array::new_null_array(field.data_type(), rows)
}
