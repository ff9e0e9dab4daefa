//! `ParquetRows`: a generator expanding each Parquet file into its rows, as one
//! struct column whose fields are the file's columns. The schema is given when
//! the UDF is built (from a sample file's footer, see [`parquet_file_schema`]);
//! a file with a different schema fails naming the file. Rows stream in
//! batches of the generator's `max_rows`.
//!
//! Guarantees: the file is read through [`File::open`] by range (its
//! prefetched copy from disk, else ranged reads of the store): the footer,
//! then one row group's column chunks at a time, so memory is bounded by the
//! largest row group, never by the file. A range the footer names past the
//! end of the file is an error before anything is allocated for it.
//!
//! Hostile bytes end in rows or an error naming the file, never a panic: the
//! `parquet` crate panics on some malformed footers and page offsets (e.g.
//! "column start and length should not be negative"), so every call into it
//! runs under [`no_panic`] (or its async twin), and a reader that panicked
//! is not read again.

use std::io::SeekFrom;
use std::ops::Range;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use bytes::Bytes;
use datafusion::arrow::array::{ArrayRef, RecordBatch, StructArray};
use datafusion::arrow::datatypes::{DataType, Field, SchemaRef};
use datafusion::parquet::arrow::ParquetRecordBatchStreamBuilder;
use datafusion::parquet::arrow::arrow_reader::{
    ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
};
use datafusion::parquet::arrow::async_reader::AsyncFileReader;
use datafusion::parquet::errors::ParquetError;
use datafusion::parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};
use futures::FutureExt;
use futures::future::BoxFuture;
use futures::stream::{self, BoxStream, StreamExt};
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use crate::codec::decode_column;
use crate::error::{CallError, UdfError};
use crate::file::{File, FileReader};
use crate::signature::Signature;
use crate::udf::Generator;

/// A caught panic of the `parquet` crate as an error message.
fn panicked(p: Box<dyn std::any::Any + Send>) -> String {
    let msg = p
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    format!("malformed Parquet (the reader panicked: {msg})")
}

/// Runs `f`, turning a panic in it into an error message.
fn no_panic<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(AssertUnwindSafe(f)).map_err(panicked)
}

/// Awaits `fut`, turning a panic in it into an error message.
async fn no_panic_async<T>(fut: impl Future<Output = T>) -> Result<T, String> {
    AssertUnwindSafe(fut).catch_unwind().await.map_err(panicked)
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

/// The Arrow schema of the Parquet file `file`, from its footer alone (read
/// by range, as [`ParquetRows`] reads it).
pub async fn parquet_file_schema(file: File) -> Result<SchemaRef, UdfError> {
    let convert = |message: String| UdfError::Convert {
        what: "parquet footer".into(),
        message,
    };
    let input = Ranges::open(&file).await?;
    let builder = no_panic_async(ParquetRecordBatchStreamBuilder::new(input))
        .await
        .map_err(convert)?
        .map_err(|e| convert(e.to_string()))?;
    Ok(Arc::clone(builder.schema()))
}

/// A `File` as the `parquet` crate's async reader reads it: ranges of
/// [`File::open`]'s reader, each checked against the file's size.
struct Ranges {
    reader: FileReader,
    size: u64,
}

impl Ranges {
    async fn open(file: &File) -> Result<Self, UdfError> {
        let io = |e: std::io::Error| UdfError::Read {
            url: file.url(),
            source: Box::new(e),
        };
        let mut reader = file.open().await?;
        let size = reader.seek(SeekFrom::End(0)).await.map_err(io)?;
        Ok(Self { reader, size })
    }
}

impl AsyncFileReader for Ranges {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, Result<Bytes, ParquetError>> {
        async move {
            if range.start > range.end || range.end > self.size {
                return Err(ParquetError::General(format!(
                    "byte range {range:?} past the end of the {}-byte file",
                    self.size
                )));
            }
            self.reader.seek(SeekFrom::Start(range.start)).await?;
            let mut buf = vec![0u8; (range.end - range.start) as usize];
            self.reader.read_exact(&mut buf).await?;
            Ok(Bytes::from(buf))
        }
        .boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, Result<Arc<ParquetMetaData>, ParquetError>> {
        async move {
            let size = self.size;
            let metadata = ParquetMetaDataReader::new()
                .with_arrow_reader_options(options)
                .load_and_finish(&mut *self, size)
                .await?;
            Ok(Arc::new(metadata))
        }
        .boxed()
    }
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
            let url = file.url();
            let bad = |message: String| UdfError::Read {
                url: url.clone(),
                source: message.into(),
            };
            let input = Ranges::open(&file).await?;
            let builder = no_panic_async(ParquetRecordBatchStreamBuilder::new(input))
                .await
                .map_err(bad)?
                .map_err(|e| bad(e.to_string()))?;
            if builder.schema().fields() != schema.fields() {
                return Err(bad(format!(
                    "schema {:?} differs from the expected {:?}",
                    builder.schema().fields(),
                    schema.fields()
                )));
            }
            let reader = no_panic(|| builder.with_batch_size(max_rows.max(1)).build())
                .map_err(bad)?
                .map_err(|e| bad(e.to_string()))?;
            // One batch per step; a reader that panicked or failed is not read again.
            let batches = stream::unfold(Some(reader), move |reader| {
                let url = url.clone();
                async move {
                    let mut r = reader?;
                    let error = |source: String| {
                        let e = UdfError::Read {
                            url,
                            source: source.into(),
                        };
                        Some((Err(CallError::at_row(0, e)), None))
                    };
                    match no_panic_async(r.next()).await {
                        Ok(None) => None,
                        Ok(Some(Ok(b))) => {
                            Some((Ok(Arc::new(StructArray::from(b)) as ArrayRef), Some(r)))
                        }
                        Ok(Some(Err(e))) => error(e.to_string()),
                        Err(message) => error(message),
                    }
                }
            });
            Ok(batches)
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
    use datafusion::arrow::array::{BinaryArray, Int64Array, RecordBatch, StringArray};
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
        written(&batch, props)
    }

    /// `batch` as a Parquet file written with `props`.
    fn written(batch: &RecordBatch, props: WriterProperties) -> Vec<u8> {
        let mut out = Vec::new();
        let mut w = ArrowWriter::try_new(&mut out, batch.schema(), Some(props)).expect("writer");
        w.write(batch).expect("write");
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

    /// A file of six row groups of about 4 MiB each (hard to compress).
    fn large() -> Vec<u8> {
        let schema = Arc::new(Schema::new(vec![Field::new(
            "blob",
            DataType::Binary,
            false,
        )]));
        let blobs: Vec<Vec<u8>> = (0..24u64)
            .map(|i| {
                (0..1u64 << 20)
                    .map(|j| ((i * 1_000_003 + j).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8)
                    .collect()
            })
            .collect();
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![Arc::new(BinaryArray::from_iter_values(&blobs))],
        )
        .expect("batch");
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(4))
            .set_dictionary_enabled(false)
            .build();
        written(&batch, props)
    }

    /// Rows come by ranges of the file, about a row group at a time: no read
    /// asks for the whole file (before, `file.read()` held all 24 MiB).
    #[test]
    fn a_file_is_read_a_row_group_at_a_time() {
        let bytes = large();
        let size = bytes.len() as u64;
        let source = MemorySource::new(bytes);
        let file = source.file();
        let schema = source
            .run(parquet_file_schema(file.clone()))
            .expect("schema");
        let field = Field::new("file", File::data_type(), false);
        let column = encode_column(&field, &[file]).expect("file column");
        let input = RecordBatch::try_from_iter([("file", column)]).expect("input");
        let udf = ParquetRows::udf("file", "row", schema);
        let arrays: Vec<ArrayRef> = source
            .run(udf.generate(input, 3).try_collect())
            .expect("rows");
        assert_eq!(arrays.iter().map(|a| a.len()).sum::<usize>(), 24);
        assert!(
            source.max_read() <= 8 << 20 && source.max_read() < size / 2,
            "largest read {} of a {size}-byte file",
            source.max_read()
        );
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
