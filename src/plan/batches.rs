//! Helpers every physical operator of `plan/` shares, importing nothing else
//! from `plan/`: row and batch slicing, and the [`unary_exec_boilerplate`] of
//! single-input operators. (Kept apart so that `common.rs`, which hands files
//! from `PrefetchExec` to the UDF operators, and `prefetch/` do not import each other.)

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, RecordBatch, UInt32Array};
use datafusion::arrow::compute::take;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::error::Result as DfResult;

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
