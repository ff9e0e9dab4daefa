//! `ParquetRows`: a generator expanding each Parquet file into its rows, as one
//! struct column whose fields are the file's columns. The schema is given when
//! the UDF is built (from a sample file, see [`parquet_schema`]); a file with a
//! different schema fails naming the file. Rows stream in batches of the
//! generator's `max_rows`; the file's bytes come from its (prefetched) `File`.

use std::sync::Arc;

use bytes::Bytes;
use datafusion::arrow::array::{ArrayRef, RecordBatch, RecordBatchReader, StructArray};
use datafusion::arrow::datatypes::{DataType, Field, SchemaRef};
use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use futures::stream::{self, BoxStream, StreamExt};

use crate::codec::decode_column;
use crate::error::{CallError, UdfError};
use crate::file::File;
use crate::signature::Signature;
use crate::udf::Generator;

/// The Arrow schema of a Parquet file's bytes.
pub fn parquet_schema(bytes: Bytes) -> Result<SchemaRef, UdfError> {
    ParquetRecordBatchReaderBuilder::try_new(bytes)
        .map(|b| Arc::clone(b.schema()))
        .map_err(|e| UdfError::Convert {
            what: "parquet footer".into(),
            message: e.to_string(),
        })
}

/// Expands a `File` column of Parquet files into their rows.
#[derive(Debug)]
pub struct ParquetRows {
    signature: Signature,
    schema: SchemaRef,
}

impl ParquetRows {
    /// Reads param `file`, writes the struct column `output` with `schema`'s fields.
    pub fn udf(param: &str, output: &str, schema: SchemaRef) -> Arc<dyn Generator> {
        Arc::new(Self {
            signature: Signature {
                name: "parquet_rows".into(),
                params: vec![param.to_string()],
                input: Some(File::data_type()),
                output: Field::new(output, DataType::Struct(schema.fields().clone()), true),
            },
            schema,
        })
    }
}

impl Generator for ParquetRows {
    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn generate(
        &self,
        input: RecordBatch,
        max_rows: usize,
    ) -> BoxStream<'static, Result<ArrayRef, CallError>> {
        let schema = Arc::clone(&self.schema);
        let file = decode_column::<File>(input.column(0)).map(|mut f| f.remove(0));
        stream::once(async move {
            let file = file?;
            let bytes = file.read().await?;
            let bad = |message: String| UdfError::Read {
                url: file.url(),
                source: message.into(),
            };
            let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
                .map_err(|e| bad(e.to_string()))?
                .with_batch_size(max_rows.max(1))
                .build()
                .map_err(|e| bad(e.to_string()))?;
            if reader.schema().fields() != schema.fields() {
                return Err(bad(format!(
                    "schema {:?} differs from the expected {:?}",
                    reader.schema().fields(),
                    schema.fields()
                )));
            }
            Ok(stream::iter(reader.map(move |b| {
                b.map(|b| Arc::new(StructArray::from(b)) as ArrayRef)
                    .map_err(|e| CallError::at_row(0, e))
            })))
        })
        .map(|r: Result<_, UdfError>| match r {
            Ok(s) => s.boxed(),
            Err(e) => stream::iter(vec![Err(CallError::at_row(0, e))]).boxed(),
        })
        .flatten()
        .boxed()
    }
}
