//! `BatchMapExec`: `batch_size` rows per call, one value per row out.
//!
//! Guarantees: every call gets exactly `batch_size` rows except the last of a
//! partition, which gets the rest (never zero); rows are regrouped across input
//! batches; with `ordered = true` output keeps input order (and declares it),
//! with `ordered = false` a call's rows are emitted as soon as it finishes (no
//! order declared); up to `parallel` calls run at once.
//!
//! `on_error` (see `on_error.rs`): a call that fails as a whole fails, nulls or
//! skips all its rows; a call whose error names its failing row
//! (`CallError::at_row`) is run again without that row, so only the rows that
//! fail are nulled or skipped. A call returning the wrong number of values
//! has failed as a whole.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::compute::concat_batches;
use datafusion::error::Result as DfResult;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use futures::stream::{BoxStream, StreamExt, TryStreamExt};
use udfchain_udfs::BatchMapper;

use crate::plan::exec::udf_call::UdfCall;
use crate::plan::exec::udf_exec::{Shape, UdfExec, UdfKind};
use crate::plan::logical::Udf;

/// The batch_map kind: `batch_size` rows per call, one value per row.
#[derive(Debug, Clone)]
pub struct BatchMap;

/// The `BatchMapExec` of plans: a UDF operator of the batch_map kind.
pub type BatchMapExec = UdfExec<BatchMap>;

impl UdfKind for BatchMap {
    type Udf = dyn BatchMapper;
    const NAME: &'static str = "BatchMapExec";

    fn output_name(udf: &dyn BatchMapper) -> &str {
        udf.signature().output.name()
    }

    fn udf(&self, udf: &Arc<dyn BatchMapper>) -> Udf {
        Udf::BatchMap(Arc::clone(udf))
    }

    fn shape(&self) -> Shape {
        Shape::Append
    }

    fn fmt_settings(&self, call: &UdfCall, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            ", parallel={}, batch_size={}",
            call.parallel, call.batch_size
        )
    }

    fn execute(
        exec: &BatchMapExec,
        partition: usize,
        ctx: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let (input, part, baseline) = exec.start(partition, &ctx)?;
        let mut seen = 0u64;
        let call = Arc::clone(&part.call);
        let out = part.clone();
        let calls = rebatch(input, call.batch_size)
            .map_ok(move |b| {
                let base = seen;
                seen += b.num_rows() as u64;
                (base, b)
            })
            .map(move |batch| {
                let part = part.clone();
                async move {
                    let (base, batch) = batch?;
                    part.call_rows(&batch, base, |udf, params| async move {
                        udf.map_batch(params).await
                    })
                    .await
                }
            });
        Ok(out.output(calls, baseline))
    }
}

/// Regroups `input` into batches of exactly `rows` rows (the last may be smaller).
fn rebatch(
    input: SendableRecordBatchStream,
    rows: usize,
) -> BoxStream<'static, DfResult<RecordBatch>> {
    struct State {
        input: SendableRecordBatchStream,
        pending: Vec<RecordBatch>,
        pending_rows: usize,
        done: bool,
    }
    let schema = input.schema();
    let state = State {
        input,
        pending: Vec::new(),
        pending_rows: 0,
        done: false,
    };
    futures::stream::unfold(state, move |mut s| {
        let schema = Arc::clone(&schema);
        async move {
            while s.pending_rows < rows && !s.done {
                match s.input.next().await {
                    Some(Ok(b)) => {
                        s.pending_rows += b.num_rows();
                        s.pending.push(b);
                    }
                    Some(Err(e)) => return Some((Err(e), s)),
                    None => s.done = true,
                }
            }
            if s.pending_rows == 0 {
                return None;
            }
            let all = match concat_batches(&schema, &s.pending) {
                Ok(b) => b,
                Err(e) => return Some((Err(e.into()), s)),
            };
            let take = rows.min(all.num_rows());
            let out = all.slice(0, take);
            let rest = all.slice(take, all.num_rows() - take);
            s.pending_rows = rest.num_rows();
            s.pending = if rest.num_rows() > 0 {
                vec![rest]
            } else {
                vec![]
            };
            Some((Ok(out), s))
        }
    })
    .boxed()
}
