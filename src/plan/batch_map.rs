//! `BatchMapExec`: `batch_size` rows per call, one value per row out.
//!
//! Guarantees: every call gets exactly `batch_size` rows except the last of a
//! partition, which gets the rest (never zero); rows are regrouped across input
//! batches; output keeps input order; up to `parallel` calls run at once.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::error::Result as DfResult;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::metrics::BaselineMetrics;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan};
use futures::stream::{BoxStream, StreamExt, TryStreamExt};
use udfchain_udfs::BatchMapper;

use super::common::{UdfCall, UdfOperator, append_column, null_output, unary_exec_boilerplate};
use super::prefetch::PrefetchLink;
use crate::chain::OnError;

#[derive(Debug)]
pub struct BatchMapExec {
    op: UdfOperator<dyn BatchMapper>,
}

impl BatchMapExec {
    pub fn new(
        input: Arc<dyn ExecutionPlan>,
        udf: Arc<dyn BatchMapper>,
        call: Arc<UdfCall>,
        link: Option<Arc<PrefetchLink>>,
        schema: SchemaRef,
    ) -> Self {
        Self {
            op: UdfOperator::new(input, udf, call, link, schema, false),
        }
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

impl DisplayAs for BatchMapExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "BatchMapExec: udf={}, output={}, parallel={}, batch_size={}",
            self.op.call.name,
            self.op.udf.signature().output.name(),
            self.op.call.parallel,
            self.op.call.batch_size
        )
    }
}

impl ExecutionPlan for BatchMapExec {
    unary_exec_boilerplate!("BatchMapExec", op);

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn execute(
        &self,
        partition: usize,
        ctx: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let input = self.op.input.execute(partition, Arc::clone(&ctx))?;
        let local = self.op.local(partition);
        let call = Arc::clone(&self.op.call);
        let udf = Arc::clone(&self.op.udf);
        let source = call.file_source(&ctx, local.clone())?;
        let schema = Arc::clone(&self.op.schema);
        let baseline = BaselineMetrics::new(&self.op.metrics, partition);
        let mut seen = 0u64;
        let stream = rebatch(input, call.batch_size)
            .map_ok(move |b| {
                let base = seen;
                seen += b.num_rows() as u64;
                (base, b)
            })
            .map(move |part| {
                let (call, udf, source, schema, local) = (
                    Arc::clone(&call),
                    Arc::clone(&udf),
                    Arc::clone(&source),
                    Arc::clone(&schema),
                    local.clone(),
                );
                async move {
                    let (base, batch) = part?;
                    let params = call.params_batch(&batch)?;
                    let result = call
                        .run(source, async move { udf.map_batch(params).await })
                        .await;
                    call.release(&local, &batch);
                    match result {
                        Ok(values) => append_column(&schema, &batch, values).map(Some),
                        Err(f) => match call.on_error {
                            OnError::Fail => Err(call.locate(f, &batch, base)),
                            OnError::Skip => {
                                call.record_skip(&batch, base);
                                Ok(None)
                            }
                            OnError::Null => append_column(
                                &schema,
                                &batch,
                                null_output(&schema, batch.num_rows()),
                            )
                            .map(Some),
                        },
                    }
                }
            })
            .buffered(self.op.call.parallel)
            .try_filter_map(|b| futures::future::ready(Ok(b)))
            .inspect_ok(move |b| baseline.record_output(b.num_rows()));
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.op.schema),
            stream,
        )))
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
