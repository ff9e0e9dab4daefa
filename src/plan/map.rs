//! `MapExec`: one row in, one value out, appended as a new column.
//!
//! Guarantees: output rows are the input rows, each with the UDF's value (or
//! null under `on_error = null`; dropped under `skip`; see `on_error.rs` for the
//! one meaning of `on_error`); with `ordered = true` in input order (and the
//! input's order is declared kept), with `ordered = false` in the order calls
//! finish, so one slow row does not hold back the others (no order declared);
//! up to `parallel` calls run at once on the UDF pool; input is pulled only as
//! calls finish, so a dropped stream or a `limit` above stops the work. Rows
//! whose input holds `File`s go one per call, so each file is its own unit of
//! work, error and cancellation; other rows go up to 1024 per call under
//! `on_error = fail` and one per call otherwise. With `ordered = true` over a
//! `PrefetchExec`, rows reach the UDF as their downloads finish (a stalled
//! download holds back only the output, not the calls of the rows behind it),
//! within the prefetch's reorder bound, and results are emitted in input order.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::error::Result as DfResult;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::metrics::BaselineMetrics;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan};
use futures::stream::{self, StreamExt, TryStreamExt};
use udfchain_udfs::Mapper;

use super::batches::slices;
use super::operator::{CallContext, Shape, UdfOperator};
use super::prefetch::Handoff;
use super::udf_call::UdfCall;
use super::unary_exec::unary_exec_boilerplate;
use crate::error::Error;
use crate::settings::OnError;

/// Rows per call when the UDF reads no file.
const VALUE_ROWS_PER_CALL: usize = 1024;

#[derive(Debug)]
pub struct MapExec {
    op: UdfOperator<dyn Mapper>,
}

impl MapExec {
    pub fn new(
        input: Arc<dyn ExecutionPlan>,
        udf: Arc<dyn Mapper>,
        call: Arc<UdfCall>,
        prefetched: bool,
        schema: SchemaRef,
    ) -> Self {
        Self {
            op: UdfOperator::new(input, udf, call, prefetched, schema, Shape::Append),
        }
    }

    pub(crate) fn op(&self) -> &UdfOperator<dyn Mapper> {
        &self.op
    }

    pub(crate) fn call(&self) -> &UdfCall {
        &self.op.call
    }

    fn with_input(&self, input: Arc<dyn ExecutionPlan>) -> Self {
        Self {
            op: self.op.with_input(input),
        }
    }
}

impl DisplayAs for MapExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "MapExec: udf={}, output={}, parallel={}",
            self.op.call.name,
            self.op.udf.signature().output.name(),
            self.op.call.parallel
        )
    }
}

impl ExecutionPlan for MapExec {
    unary_exec_boilerplate!("MapExec", op);

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![self.op.call.ordered]
    }

    /// One row out per row in, unless `on_error = skip` drops some: then a
    /// `LIMIT n` above goes below the map (and its prefetch), so only the n
    /// rows wanted are fetched and called.
    fn supports_limit_pushdown(&self) -> bool {
        self.op.call.on_error != OnError::Skip
    }

    fn execute(
        &self,
        partition: usize,
        ctx: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let (input, part, baseline) = self.op.start_with(partition, &ctx, self.op.call.ordered)?;
        if let Some(handoff) = part.handoff.clone() {
            return Ok(in_order(input, part, handoff, baseline));
        }
        let call = Arc::clone(&part.call);
        let rows_per_call = if call.file_cols.is_empty() && call.on_error == OnError::Fail {
            VALUE_ROWS_PER_CALL
        } else {
            1
        };
        let mut seen = 0u64;
        let out = part.clone();
        let calls = input
            .map_ok(move |batch| {
                let parts: Vec<DfResult<(u64, RecordBatch)>> = slices(&batch, rows_per_call)
                    .into_iter()
                    .map(|s| {
                        let base = seen;
                        seen += s.num_rows() as u64;
                        Ok((base, s))
                    })
                    .collect();
                stream::iter(parts)
            })
            .try_flatten()
            .map(move |chunk| {
                let part = part.clone();
                async move {
                    let (base, chunk) = chunk?;
                    part.call_rows(
                        &chunk,
                        base,
                        |udf, params| async move { udf.map(params).await },
                    )
                    .await
                }
            });
        Ok(out.output(calls, baseline))
    }
}

/// `ordered = true` over a `PrefetchExec` that hands rows on as their
/// downloads finish: each (one-row) batch is called at once, named by its
/// position in the input, and the results go back in input order.
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
        let seq = batch.as_ref().ok().and_then(|_| positions.take_seq());
        async move {
            let done = match (batch, seq) {
                (Ok(row), Some(seq)) => {
                    part.call_rows(
                        &row,
                        seq,
                        |udf, params| async move { udf.map(params).await },
                    )
                    .await
                }
                (Ok(_), None) => {
                    Err(Error::internal("a prefetched row without its position").into_df())
                }
                (Err(e), _) => Err(e),
            };
            (seq, done)
        }
    });
    out.output_in_order(calls, handoff, baseline)
}
