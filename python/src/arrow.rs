//! Arrow data across the boundary: Arrow IPC stream bytes, which pyarrow reads
//! without copying (`pyarrow.ipc.open_stream`). One copy on each crossing, of
//! whole batches, never row by row; the schema travels with the data, so an
//! empty result keeps its columns.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, RecordBatch};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::ipc::reader::StreamReader;
use datafusion::arrow::ipc::writer::StreamWriter;

/// `batches` (all of `schema`) as one IPC stream.
pub fn to_ipc(schema: &SchemaRef, batches: &[RecordBatch]) -> Result<Vec<u8>, ArrowError> {
    let mut out = Vec::new();
    let mut w = StreamWriter::try_new(&mut out, schema)?;
    for b in batches {
        w.write(b)?;
    }
    w.finish()?;
    drop(w);
    Ok(out)
}

/// The schema and batches of an IPC stream.
pub fn from_ipc(bytes: &[u8]) -> Result<(SchemaRef, Vec<RecordBatch>), ArrowError> {
    let reader = StreamReader::try_new(std::io::Cursor::new(bytes), None)?;
    let schema = reader.schema();
    let batches = reader.collect::<Result<Vec<_>, _>>()?;
    Ok((schema, batches))
}

/// The first column of an IPC stream of one-column batches, concatenated.
pub fn column_from_ipc(bytes: &[u8]) -> Result<ArrayRef, ArrowError> {
    let (schema, batches) = from_ipc(bytes)?;
    if schema.fields().len() != 1 {
        return Err(ArrowError::SchemaError(format!(
            "expected one column, got {}",
            schema.fields().len()
        )));
    }
    let arrays: Vec<&dyn datafusion::arrow::array::Array> =
        batches.iter().map(|b| b.column(0).as_ref()).collect();
    match arrays.as_slice() {
        [] => Ok(datafusion::arrow::array::new_empty_array(
            schema.field(0).data_type(),
        )),
        [_] => Ok(Arc::clone(batches[0].column(0))),
        many => datafusion::arrow::compute::concat(many),
    }
}
