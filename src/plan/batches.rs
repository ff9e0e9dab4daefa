//! Helpers every physical operator of `plan/` shares, importing nothing else
//! from `plan/`: row and batch slicing, batch coalescing ([`coalesce`]: emits
//! when a batch is full or nothing else is ready, so it never holds a row back
//! waiting for more), and the [`unary_exec_boilerplate`] of single-input operators. (Kept apart so that `common.rs`, which hands files
//! from `PrefetchExec` to the UDF operators, and `prefetch/` do not import each other.)

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use datafusion::arrow::array::{ArrayRef, RecordBatch, UInt32Array};
use datafusion::arrow::compute::{concat_batches, take};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::error::Result as DfResult;
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream};
use futures::Stream;

/// Rows `rows` of `batch`, in that order.
pub fn take_rows(batch: &RecordBatch, rows: &[usize]) -> DfResult<RecordBatch> {
    let idx = UInt32Array::from(rows.iter().map(|&r| r as u32).collect::<Vec<_>>());
    let cols = batch
        .columns()
        .iter()
        .map(|c| Ok(take(c.as_ref(), &idx, None)?))
        .collect::<DfResult<Vec<_>>>()?;
    let opts = datafusion::arrow::array::RecordBatchOptions::new().with_row_count(Some(rows.len()));
    Ok(RecordBatch::try_new_with_options(
        batch.schema(),
        cols,
        &opts,
    )?)
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

/// `input` with its small batches merged, up to `rows` rows a batch: the
/// batches that are ready are merged and emitted as soon as `input` has
/// nothing more ready (or the batch is full, or `input` ends), so coalescing
/// never delays a row. DataFusion's operators above pay per batch; the UDF
/// operators produce one-row batches, one per call.
pub fn coalesce(input: SendableRecordBatchStream, rows: usize) -> SendableRecordBatchStream {
    Box::pin(Coalesce {
        schema: input.schema(),
        input,
        rows: rows.max(1),
        held: Vec::new(),
        held_rows: 0,
        done: false,
    })
}

struct Coalesce {
    input: SendableRecordBatchStream,
    schema: SchemaRef,
    rows: usize,
    held: Vec<RecordBatch>,
    held_rows: usize,
    done: bool,
}

impl Coalesce {
    fn flush(&mut self) -> Option<DfResult<RecordBatch>> {
        self.held_rows = 0;
        match self.held.len() {
            0 => None,
            1 => self.held.pop().map(Ok),
            _ => {
                let merged = concat_batches(&self.schema, &self.held);
                self.held.clear();
                Some(merged.map_err(Into::into))
            }
        }
    }
}

impl Stream for Coalesce {
    type Item = DfResult<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        while !this.done {
            match this.input.as_mut().poll_next(cx) {
                Poll::Ready(Some(Ok(batch))) => {
                    if batch.num_rows() == 0 {
                        continue;
                    }
                    this.held_rows += batch.num_rows();
                    this.held.push(batch);
                    if this.held_rows >= this.rows {
                        return Poll::Ready(this.flush());
                    }
                }
                // The query fails: the held rows go with it.
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => this.done = true,
                Poll::Pending if this.held.is_empty() => return Poll::Pending,
                Poll::Pending => return Poll::Ready(this.flush()),
            }
        }
        Poll::Ready(this.flush())
    }
}

impl RecordBatchStream for Coalesce {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
    use futures::StreamExt;

    fn one_row(schema: &SchemaRef, v: i64) -> DfResult<RecordBatch> {
        Ok(RecordBatch::try_new(
            Arc::clone(schema),
            vec![Arc::new(Int64Array::from(vec![v]))],
        )?)
    }

    fn values(b: &RecordBatch) -> Vec<i64> {
        let a = b.column(0).as_any().downcast_ref::<Int64Array>();
        a.map(|a| a.values().to_vec()).unwrap_or_default()
    }

    #[tokio::test]
    async fn ready_rows_are_merged_up_to_the_limit_and_none_waits_for_more() {
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]));
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let input = RecordBatchStreamAdapter::new(Arc::clone(&schema), rx);
        let mut out = coalesce(Box::pin(input), 3);
        for v in 0..5 {
            tx.unbounded_send(one_row(&schema, v)).expect("send");
        }
        // Five ready rows: a full batch of 3, then the 2 left without waiting.
        let b = out.next().await.expect("batch").expect("ok");
        assert_eq!(values(&b), vec![0, 1, 2]);
        let b = out.next().await.expect("batch").expect("ok");
        assert_eq!(values(&b), vec![3, 4], "emitted while the input is pending");
        tx.unbounded_send(one_row(&schema, 5)).expect("send");
        drop(tx);
        let b = out.next().await.expect("batch").expect("ok");
        assert_eq!(values(&b), vec![5]);
        assert!(out.next().await.is_none());
    }
}
