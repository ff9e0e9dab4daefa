//! `MapExec`: one row in, one value out, appended as a new column.
//!
//! Guarantees: output rows are the input rows, each with the UDF's value (or
//! null under `on_error = null`; dropped under `skip`; see `on_error.rs` for the
//! one meaning of `on_error`); with `ordered = true` in input order (and the
//! input's order is declared kept), with `ordered = false` in the order calls
//! finish, so one slow row does not hold back the others (no order declared);
//! up to `parallel` calls run at once on the UDF pool; input is pulled only as
//! calls finish, so a dropped stream or a `limit` above stops the work. Rows
//! whose input holds `File`s, and every row under `on_error = null | skip`,
//! are each their own call (their own unit of error), several of them one
//! after another in one task when the UDF is fast (see `chunks`); other rows
//! go up to 1024 per call. With `ordered = true` over a
//! `PrefetchExec`, rows reach the UDF as their downloads finish (a stalled
//! download holds back only the output, not the calls of the rows behind it),
//! within the prefetch's reorder bound, and results are emitted in input order.

use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::error::Result as DfResult;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::metrics::BaselineMetrics;
use futures::FutureExt;
use futures::stream::{self, StreamExt, TryStreamExt};
use udfchain_udfs::Mapper;

use crate::error::Error;
use crate::plan::exec::on_error::Calls;
use crate::plan::exec::output_stream::Done;
use crate::plan::exec::udf_call::UdfCall;
use crate::plan::exec::udf_exec::{CallContext, Shape, UdfExec, UdfKind};
use crate::plan::logical::Udf;
use crate::plan::prefetch::Handoff;
use crate::settings::OnError;

/// Rows per call when the UDF reads no file.
const VALUE_ROWS_PER_CALL: usize = 1024;

/// The map kind: one value per row, appended as a column.
#[derive(Debug, Clone)]
pub struct Map;

/// The `MapExec` of plans: a UDF operator of the map kind.
pub type MapExec = UdfExec<Map>;

impl UdfKind for Map {
    type Udf = dyn Mapper;
    const NAME: &'static str = "MapExec";

    fn output_name(udf: &dyn Mapper) -> &str {
        udf.signature().output.name()
    }

    fn udf(&self, udf: &Arc<dyn Mapper>) -> Udf {
        Udf::Map(Arc::clone(udf))
    }

    fn shape(&self) -> Shape {
        Shape::Append
    }

    /// One row out per row in, unless `on_error = skip` drops some: then a
    /// `LIMIT n` above goes below the map (and its prefetch), so only the n
    /// rows wanted are fetched and called.
    fn supports_limit_pushdown(&self, call: &UdfCall) -> bool {
        call.on_error != OnError::Skip
    }

    fn execute(
        exec: &MapExec,
        partition: usize,
        ctx: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let (input, part, baseline) = exec.start_with(partition, &ctx, exec.call.ordered)?;
        if let Some(handoff) = part.handoff.clone() {
            return Ok(in_order(input, part, handoff, baseline));
        }
        let call = Arc::clone(&part.call);
        let whole = call.file_cols.is_empty() && call.on_error == OnError::Fail;
        let mut seen = 0u64;
        let out = part.clone();
        let calls = input
            .map_ok(move |batch| {
                let base = seen;
                seen += batch.num_rows() as u64;
                chunks(batch, base, Arc::clone(&call), whole)
            })
            .try_flatten()
            .map(move |chunk| {
                let part = part.clone();
                async move {
                    let (base, chunk) = chunk?;
                    call_chunk(&part, &chunk, base, whole).await
                }
            });
        Ok(out.output(calls, baseline))
    }
}

/// The calls `batch` (whose first row is row `base` of the partition) is
/// cut into, each with the position of its first row: up to
/// [`VALUE_ROWS_PER_CALL`] rows in one call for `whole` (rows without files,
/// `on_error = fail`); otherwise as many rows, each its own call, as the
/// UDF's recent pace fits in one task ([`RowCost`](crate::plan::exec::udf_call::RowCost)),
/// never more than an even share of the batch among `parallel` calls. Sized
/// as each call is asked for, so the pace of the calls before it counts.
fn chunks(
    batch: RecordBatch,
    base: u64,
    call: Arc<UdfCall>,
    whole: bool,
) -> impl futures::Stream<Item = DfResult<(u64, RecordBatch)>> + Send {
    let rows = batch.num_rows();
    let share = rows.div_ceil(call.parallel).max(1);
    stream::unfold(0usize, move |at| {
        let next = (at < rows).then(|| {
            let size = if whole {
                VALUE_ROWS_PER_CALL
            } else {
                call.row_cost().rows_per_call().min(share)
            };
            let n = size.min(rows - at);
            (Ok((base + at as u64, batch.slice(at, n))), at + n)
        });
        futures::future::ready(next)
    })
}

/// Calls the UDF on `chunk` (see [`chunks`]).
async fn call_chunk(
    part: &CallContext<dyn Mapper>,
    chunk: &RecordBatch,
    base: u64,
    whole: bool,
) -> DfResult<Done> {
    let map = |udf: Arc<dyn Mapper>, params| async move { udf.map(params).await };
    let udf = Arc::clone(&part.udf);
    let each = move |params, stop_at_error| {
        let udf = Arc::clone(&udf);
        async move { udf.map_each(params, stop_at_error).await }.boxed()
    };
    let calls = if whole {
        Calls::Whole
    } else {
        Calls::Each(&each)
    };
    part.call_rows_as(chunk, base, &map, calls).await
}

/// The calls of a batch handed on by the prefetch (one row, or several
/// whose files needed no download), `parallel` at once, as one result.
async fn call_unit(
    part: &CallContext<dyn Mapper>,
    batch: RecordBatch,
    base: u64,
) -> DfResult<Done> {
    if batch.num_rows() <= 1 {
        return call_chunk(part, &batch, base, false).await;
    }
    let parallel = part.call.parallel;
    let done: Vec<Done> = chunks(batch, base, Arc::clone(&part.call), false)
        .map_ok(|(base, chunk)| async move { call_chunk(part, &chunk, base, false).await })
        .try_buffered(parallel)
        .try_collect()
        .await?;
    Done::concat(&part.schema, done)
}

/// `ordered = true` over a `PrefetchExec` that hands rows on as their
/// downloads finish: each batch it hands on (one row, or a run of rows whose
/// files needed no download) is called at once, named by its place in the
/// prefetch's order and the position of its first row in the input, and the
/// results go back in that order.
fn in_order(
    input: SendableRecordBatchStream,
    part: CallContext<dyn Mapper>,
    handoff: Arc<Handoff>,
    baseline: BaselineMetrics,
) -> SendableRecordBatchStream {
    let out = part.clone();
    let positions = Arc::clone(&handoff);
    let calls = input.map(move |batch| {
        let part = part.clone();
        let unit = batch.as_ref().ok().and_then(|_| positions.take_seq());
        async move {
            let done = match (batch, unit) {
                (Ok(rows), Some((_, base))) => call_unit(&part, rows, base).await,
                (Ok(_), None) => {
                    Err(Error::internal("a prefetched row without its position").into_df())
                }
                (Err(e), _) => Err(e),
            };
            (unit.map(|(seq, _)| seq), done)
        }
    });
    out.output_in_order(calls, handoff, baseline)
}
