//! `ParquetRows`: a generator expanding each Parquet file into its rows, as one
//! struct column whose fields are the file's columns. The schema is given when
//! the UDF is built (from a sample file, see [`parquet_schema`]); a file with a
//! different schema fails naming the file. Rows stream in batches of the
//! generator's `max_rows`; the file's bytes come from its (prefetched) `File`.
//!
//! Hostile bytes end in rows or an error naming the file, never a panic: the
//! `parquet` crate panics on some malformed footers and page offsets (e.g.
//! "column start and length should not be negative"), so every call into it
//! runs under [`no_panic`], and a reader that panicked is not read again.

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

/// Runs `f`, turning a panic in it into an error message.
fn no_panic<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|p| {
        let msg = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        format!("malformed Parquet (the reader panicked: {msg})")
    })
}

/// The Arrow schema of a Parquet file's bytes.
pub fn parquet_schema(bytes: Bytes) -> Result<SchemaRef, UdfError> {
    let convert = |message: String| UdfError::Convert {
        what: "parquet footer".into(),
        message,
    };
    no_panic(|| ParquetRecordBatchReaderBuilder::try_new(bytes))
        .map_err(convert)?
        .map(|b| Arc::clone(b.schema()))
        .map_err(|e| convert(e.to_string()))
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
        let file = decode_column::<File>(input.column(0));
        stream::once(async move {
            let file = file?
                .into_iter()
                .next()
                .ok_or_else(|| UdfError::Contract("parquet_rows got no row".into()))?;
            let bytes = file.read().await?;
            let bad = |message: String| UdfError::Read {
                url: file.url(),
                source: message.into(),
            };
            let reader = no_panic(|| {
                ParquetRecordBatchReaderBuilder::try_new(bytes)?
                    .with_batch_size(max_rows.max(1))
                    .build()
            })
            .map_err(bad)?
            .map_err(|e| bad(e.to_string()))?;
            if reader.schema().fields() != schema.fields() {
                return Err(bad(format!(
                    "schema {:?} differs from the expected {:?}",
                    reader.schema().fields(),
                    schema.fields()
                )));
            }
            let url = file.url();
            let mut reader = Some(reader);
            let batches = std::iter::from_fn(move || {
                let r = reader.as_mut()?;
                match no_panic(|| r.next()) {
                    Ok(next) => next.map(|b| {
                        b.map(|b| Arc::new(StructArray::from(b)) as ArrayRef)
                            .map_err(|e| CallError::at_row(0, e))
                    }),
                    Err(message) => {
                        reader = None;
                        let e = UdfError::Read {
                            url: url.clone(),
                            source: message.into(),
                        };
                        Some(Err(CallError::at_row(0, e)))
                    }
                }
            });
            Ok(stream::iter(batches))
        })
        .map(|r: Result<_, UdfError>| match r {
            Ok(s) => s.boxed(),
            Err(e) => stream::iter(vec![Err(CallError::at_row(0, e))]).boxed(),
        })
        .flatten()
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{Int64Array, RecordBatch, StringArray};
    use datafusion::arrow::datatypes::Schema;
    use datafusion::parquet::arrow::ArrowWriter;
    use datafusion::parquet::file::properties::WriterProperties;
    use futures::TryStreamExt;
    use proptest::prelude::*;

    use super::*;
    use crate::codec::encode_column;
    use crate::test_source::MemorySource;

    /// 300 rows in row groups of 100 (pages of 20), with the page index.
    fn valid() -> Vec<u8> {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("tag", DataType::Utf8, false),
        ]));
        let ids: Vec<i64> = (0..300).collect();
        let tags: Vec<String> = ids.iter().map(|i| format!("row-{i}")).collect();
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(Int64Array::from(ids)),
                Arc::new(StringArray::from(tags)),
            ],
        )
        .expect("batch");
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(100))
            .set_data_page_row_count_limit(20)
            .build();
        let mut out = Vec::new();
        let mut w = ArrowWriter::try_new(&mut out, schema, Some(props)).expect("writer");
        w.write(&batch).expect("write");
        w.close().expect("close");
        out
    }

    /// The rows `parquet_rows` gives for `bytes` (with the valid file's schema).
    fn rows(bytes: Vec<u8>) -> Result<usize, String> {
        let schema = parquet_schema(Bytes::from(valid())).expect("schema");
        let _ = parquet_schema(Bytes::from(bytes.clone()));
        let source = MemorySource::new(bytes);
        let file = source.file();
        let field = Field::new("file", File::data_type(), false);
        let column = encode_column(&field, &[file]).expect("file column");
        let input = RecordBatch::try_from_iter([("file", column)]).expect("input");
        let udf = ParquetRows::udf("file", "row", schema);
        let arrays: Vec<ArrayRef> = source
            .run(udf.generate(input, 64).try_collect())
            .map_err(|e| e.source.to_string())?;
        Ok(arrays.iter().map(|a| a.len()).sum())
    }

    #[test]
    fn the_valid_file_gives_its_rows() {
        assert_eq!(rows(valid()), Ok(300));
        let err = rows(b"PAR1 not really PAR1".to_vec()).expect_err("not parquet");
        assert!(err.contains("memory:///t/x"), "names the file: {err}");
    }

    /// A byte of the footer changed so a column chunk's offset turns
    /// negative: the `parquet` crate panics reading it; here it is an error
    /// naming the file (found by `mutated_parquet_gives_rows_or_an_error`).
    #[test]
    fn a_negative_column_offset_is_an_error_not_a_panic() {
        let mut bytes = valid();
        let at = bytes.len() - 1 - 11561859728666182114usize % 2048.min(bytes.len());
        bytes[at] = 129;
        let err = rows(bytes).expect_err("a negative offset");
        assert!(err.contains("memory:///t/x"), "names the file: {err}");
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 64,
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        /// Edits mostly in the footer (and page index before it), some
        /// anywhere, and truncations: rows or an error, never a panic.
        #[test]
        fn mutated_parquet_gives_rows_or_an_error(
            edits in proptest::collection::vec((any::<bool>(), any::<usize>(), any::<u8>()), 1..6),
            cut in proptest::option::of(any::<usize>()),
        ) {
            let mut bytes = valid();
            let len = bytes.len();
            for (footer, at, value) in edits {
                let at = if footer { len - 1 - at % 2048.min(len) } else { at % len };
                bytes[at] = value;
            }
            if let Some(cut) = cut {
                bytes.truncate(cut % len);
            }
            let _ = rows(bytes);
        }

        #[test]
        fn arbitrary_bytes_give_rows_or_an_error(
            head in proptest::collection::vec(any::<u8>(), 0..600),
            footer_len in any::<u32>(),
        ) {
            // Bytes that end like a Parquet file, with any footer length.
            let mut bytes = head;
            bytes.extend_from_slice(&footer_len.to_le_bytes());
            bytes.extend_from_slice(b"PAR1");
            let _ = rows(bytes);
        }
    }
}
