//! One partition's Flight messages, encoded as Arrow IPC, each message's body
//! the batch's own Arrow buffers (no copy).
//!
//! Guarantees:
//! - the messages are the schema, then (for dictionary columns) dictionary
//!   batches and the batches in order, as Arrow's IPC stream encoder writes
//!   them; each batch is split into messages of at most the request's
//!   `max_message_bytes` of Arrow data (zero-copy slices, no per-row work; a
//!   single larger row is one message);
//! - a message's body is the batch's buffers and the IPC padding between them,
//!   shared, not copied (offsets of a sliced string column are rebased into a
//!   small new buffer, as Arrow's writer does);
//! - the bodies share the partition's buffers: what a `do_get` holds beyond
//!   its partition is the messages' headers and rebased offsets;
//! - an encoding error is a status before anything is sent.

use std::collections::VecDeque;

use arrow_flight::FlightData;
use bytes::{Bytes, BytesMut};
use datafusion::arrow::array::{Array, RecordBatch};
use datafusion::arrow::buffer::Buffer;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::ipc::writer::StreamEncoder;
use tonic::Status;

/// One Flight message: the IPC header (a flatbuffer `Message`, padded) and
/// its body as the pieces it is made of.
#[derive(Debug, Clone, Default)]
pub(crate) struct FlightMessage {
    pub(crate) header: Bytes,
    pub(crate) body: Vec<Bytes>,
}

impl FlightMessage {
    /// Bytes of the body.
    pub(crate) fn body_len(&self) -> usize {
        self.body.iter().map(Bytes::len).sum()
    }

    /// The message as one `FlightData` (a body of several pieces copied into one).
    pub(crate) fn into_flight_data(self) -> FlightData {
        FlightData {
            data_header: self.header,
            data_body: contiguous(self.body),
            ..FlightData::default()
        }
    }
}

/// An Arrow buffer as `Bytes`, shared, not copied.
struct Shared(Buffer);

impl AsRef<[u8]> for Shared {
    fn as_ref(&self) -> &[u8] {
        self.0.as_slice()
    }
}

/// The IPC stream encoder's output (continuation marker and length, header,
/// body pieces, message after message) cut back into messages. The stream's
/// end marker, if any, is dropped.
fn cut_messages(buffers: Vec<Buffer>) -> Result<Vec<FlightMessage>, ArrowError> {
    let mut pieces: VecDeque<Bytes> = buffers
        .into_iter()
        .filter(|b| !b.is_empty())
        .map(|b| Bytes::from_owner(Shared(b)))
        .collect();
    let mut messages = Vec::new();
    while !pieces.is_empty() {
        let prefix = contiguous(take(&mut pieces, 8)?);
        if prefix[..4] != [0xff; 4] {
            return Err(ArrowError::IpcError(
                "the IPC encoder wrote no continuation marker".into(),
            ));
        }
        let len = i32::from_le_bytes([prefix[4], prefix[5], prefix[6], prefix[7]]);
        let len = usize::try_from(len)
            .map_err(|_| ArrowError::IpcError(format!("an IPC header of {len} bytes")))?;
        if len == 0 {
            continue; // the end-of-stream marker
        }
        let header = contiguous(take(&mut pieces, len)?);
        let body_len = datafusion::arrow::ipc::root_as_message(&header)
            .map_err(|e| ArrowError::IpcError(format!("the IPC header: {e}")))?
            .bodyLength();
        let body_len = usize::try_from(body_len)
            .map_err(|_| ArrowError::IpcError(format!("an IPC body of {body_len} bytes")))?;
        let body = take(&mut pieces, body_len)?;
        messages.push(FlightMessage { header, body });
    }
    Ok(messages)
}

/// The next `n` bytes of `pieces`, as zero-copy slices of them.
fn take(pieces: &mut VecDeque<Bytes>, mut n: usize) -> Result<Vec<Bytes>, ArrowError> {
    let mut out = Vec::new();
    while n > 0 {
        let Some(front) = pieces.front_mut() else {
            return Err(ArrowError::IpcError(
                "the IPC encoder's output ends inside a message".into(),
            ));
        };
        if front.len() <= n {
            n -= front.len();
            out.extend(pieces.pop_front());
        } else {
            out.push(front.split_to(n));
            n = 0;
        }
    }
    Ok(out)
}

/// `pieces` as one `Bytes` (copied only when there is more than one).
fn contiguous(mut pieces: Vec<Bytes>) -> Bytes {
    if pieces.len() <= 1 {
        return pieces.pop().unwrap_or_default();
    }
    let mut one = BytesMut::with_capacity(pieces.iter().map(Bytes::len).sum());
    for p in &pieces {
        one.extend_from_slice(p);
    }
    one.freeze()
}

/// `batch` cut into row slices of at most about `max_bytes` of Arrow data
/// each (at least one row each).
fn split(batch: &RecordBatch, max_bytes: usize) -> Vec<RecordBatch> {
    let bytes: usize = batch
        .columns()
        .iter()
        .map(|c| {
            c.to_data()
                .get_slice_memory_size()
                .unwrap_or_else(|_| c.get_buffer_memory_size())
        })
        .sum();
    let rows = batch.num_rows();
    let pieces = bytes.div_ceil(max_bytes.max(1)).clamp(1, rows.max(1));
    let per = rows.div_ceil(pieces).max(1);
    (0..rows)
        .step_by(per)
        .map(|at| batch.slice(at, per.min(rows - at)))
        .collect()
}

/// Every Flight message of `batches` (of `schema`) in order, the schema
/// first, in messages of at most about `max_bytes` of Arrow data.
///
/// Only headers are built (microseconds per message): the bodies are the
/// batches' buffers, so encoding a whole partition before its first message
/// is sent costs no copy and no memory beyond the headers.
pub(crate) fn messages(
    schema: &SchemaRef,
    batches: &[RecordBatch],
    max_bytes: usize,
) -> Result<Vec<FlightMessage>, Status> {
    let failed = |e: ArrowError| Status::internal(format!("encoding the partition: {e}"));
    let mut encoder = StreamEncoder::try_new(schema).map_err(failed)?;
    let mut out = Vec::new();
    for batch in batches {
        for slice in split(batch, max_bytes) {
            out.extend(cut_messages(encoder.encode(&slice).map_err(failed)?).map_err(failed)?);
        }
    }
    if out.is_empty() {
        // No batch: the schema alone (finish writes it before the end marker).
        out = cut_messages(encoder.finish().map_err(failed)?).map_err(failed)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_flight::decode::FlightRecordBatchStream;
    use datafusion::arrow::array::{
        ArrayRef, BinaryArray, BooleanArray, DictionaryArray, Int32Array, ListArray, StringArray,
        StructArray, UInt64Array,
    };
    use datafusion::arrow::datatypes::{DataType, Field, Int32Type, Schema};
    use futures::TryStreamExt;

    use super::*;

    /// A batch of every kind of column a dataset holds: nullable numbers,
    /// strings, bytes, booleans, a File-like struct, lists and a dictionary.
    fn batch(rows: usize) -> RecordBatch {
        let n = rows as i32;
        let ids: ArrayRef = Arc::new(Int32Array::from_iter(
            (0..n).map(|i| (i % 7 != 3).then_some(i)),
        ));
        let texts: ArrayRef =
            Arc::new(StringArray::from_iter((0..n).map(|i| {
                (i % 5 != 1).then(|| format!("row {i} {}", "x".repeat(i as usize % 40)))
            })));
        let bytes: ArrayRef = Arc::new(BinaryArray::from_iter_values(
            (0..n).map(|i| vec![i as u8; (i as usize * 37) % 300]),
        ));
        let flags: ArrayRef = Arc::new(BooleanArray::from_iter(
            (0..n).map(|i| (i % 11 != 0).then_some(i % 2 == 0)),
        ));
        let file: ArrayRef = Arc::new(StructArray::from(vec![
            (
                Arc::new(Field::new("source", DataType::Utf8, false)),
                Arc::new(StringArray::from_iter_values(
                    (0..n).map(|i| format!("s3://b/{i}")),
                )) as ArrayRef,
            ),
            (
                Arc::new(Field::new("size", DataType::UInt64, false)),
                Arc::new(UInt64Array::from_iter_values(
                    (0..rows as u64).map(|i| i * 3),
                )) as ArrayRef,
            ),
        ]));
        let lists: ArrayRef = Arc::new(ListArray::from_iter_primitive::<
            datafusion::arrow::datatypes::Int64Type,
            _,
            _,
        >(
            (0..n)
                .map(|i| (i % 4 != 2).then(|| (0..i64::from(i % 6)).map(Some).collect::<Vec<_>>())),
        ));
        let labels: ArrayRef = Arc::new(
            (0..n)
                .map(|i| ["cat", "dog", "bird"][i as usize % 3])
                .collect::<DictionaryArray<Int32Type>>(),
        );
        RecordBatch::try_from_iter([
            ("id", ids),
            ("text", texts),
            ("bytes", bytes),
            ("flag", flags),
            ("file", file),
            ("list", lists),
            ("label", labels),
        ])
        .expect("batch")
    }

    async fn decoded(messages: Vec<FlightMessage>) -> Vec<RecordBatch> {
        FlightRecordBatchStream::new_from_flight_data(futures::stream::iter(
            messages.into_iter().map(|m| Ok(m.into_flight_data())),
        ))
        .try_collect()
        .await
        .expect("decodes")
    }

    fn concat(schema: &SchemaRef, batches: &[RecordBatch]) -> RecordBatch {
        datafusion::arrow::compute::concat_batches(schema, batches).expect("concat")
    }

    #[tokio::test]
    async fn sliced_batches_of_every_column_kind_decode_to_the_same_rows() {
        let whole = batch(1000);
        let schema = whole.schema();
        // Slices at offsets that are not multiples of 8 (bitmaps) and whose
        // strings do not start at offset 0 (rebased offsets).
        let slices = vec![
            whole.slice(3, 500),
            whole.slice(503, 1),
            whole.slice(504, 496),
        ];
        for max_bytes in [1024, 16 * 1024, 64 << 20] {
            let messages = messages(&schema, &slices, max_bytes).expect("encoded");
            let got = decoded(messages).await;
            assert_eq!(
                concat(&schema, &got),
                concat(&schema, &slices),
                "{max_bytes}"
            );
        }
    }

    #[tokio::test]
    async fn a_large_column_is_sent_from_its_own_buffer() {
        let values: Vec<u8> = (0..4 << 20).map(|i| (i % 251) as u8).collect();
        let big = BinaryArray::from_iter_values(values.chunks(1 << 20));
        let data_ptr = big.values().as_ptr() as usize;
        let b = RecordBatch::try_from_iter([("blob", Arc::new(big) as ArrayRef)]).expect("batch");
        let schema = b.schema();
        let messages = messages(&schema, std::slice::from_ref(&b), 2 << 20).expect("encoded");
        // The schema, then 4 rows of 1 MiB in 2 messages.
        assert_eq!(messages.len(), 3, "{messages:?}");
        let shared = messages
            .iter()
            .flat_map(|m| &m.body)
            .filter(|p| {
                let at = p.as_ptr() as usize;
                at >= data_ptr && at < data_ptr + (4 << 20)
            })
            .count();
        assert_eq!(
            shared, 2,
            "each message's values are the column's own buffer"
        );
        assert_eq!(concat(&schema, &decoded(messages).await), b);
    }

    #[tokio::test]
    async fn no_batch_is_the_schema_alone() {
        let schema = Arc::new(Schema::new(vec![Field::new("a", DataType::Int32, true)]));
        let messages = messages(&(schema.clone() as SchemaRef), &[], 1024).expect("encoded");
        assert_eq!(messages.len(), 1);
        assert!(messages[0].body.is_empty());
        assert!(decoded(messages).await.is_empty());
    }

    #[test]
    fn a_batch_splits_into_slices_of_about_max_bytes_each_at_least_one_row() {
        let b = batch(1000);
        for max in [1, 1000, 10_000, 1 << 30] {
            let slices = split(&b, max);
            assert_eq!(
                slices.iter().map(RecordBatch::num_rows).sum::<usize>(),
                1000
            );
            assert!(slices.iter().all(|s| s.num_rows() >= 1));
        }
        assert_eq!(split(&b, 1 << 30).len(), 1);
        assert_eq!(split(&b, 1).len(), 1000);
        assert!(split(&b.slice(0, 0), 10).len() <= 1);
    }
}
