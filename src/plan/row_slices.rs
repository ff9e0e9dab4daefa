//! Row and batch slicing every physical operator of `plan/` shares (taking
//! rows, slicing a batch, repeating a row, appending a column), importing
//! nothing else from `plan/`, so the UDF operators and `prefetch/` both use it
//! without importing each other.

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
