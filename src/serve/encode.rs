//! One partition's Flight messages, encoded as Arrow IPC on a task of their
//! own while the previous messages are being sent.
//!
//! Guarantees:
//! - the messages are the schema, then the batches in order, each batch split
//!   into messages of at most the request's `max_message_bytes` of Arrow data
//!   (zero-copy slices, no per-row work; a single larger row is one message);
//! - at most [`ENCODED_AHEAD`] encoded messages wait for the sender, so what a
//!   `do_get` holds beyond its partition stays within `ENCODED_AHEAD` messages
//!   (at most 2 × 64 MiB, the largest `max_message_bytes`, and never more than
//!   the partition's own bytes);
//! - dropping the stream (the client went away) aborts the encoding task;
//! - an encoding error, or a panic of the encoding task, is the last item:
//!   nothing is sent after it (a stream never ends short without an error).

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use arrow_flight::FlightData;
use arrow_flight::encode::FlightDataEncoderBuilder;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use futures::stream::{Stream, StreamExt};
use tokio::sync::mpsc;
use tonic::Status;

use crate::runtime::{PoolTask, spawn};

/// Encoded messages of one `do_get` waiting for the sender: the next one is
/// ready when the previous one has been handed to HTTP/2.
pub const ENCODED_AHEAD: usize = 2;

/// The Flight messages of `batches` (of `schema`), encoded ahead of the send.
pub(crate) struct EncodedAhead {
    messages: mpsc::Receiver<Result<FlightData, Status>>,
    task: Option<PoolTask<()>>,
}

impl EncodedAhead {
    /// Starts encoding on the current runtime, in messages of at most
    /// `max_bytes` of Arrow data.
    pub(crate) fn start(schema: SchemaRef, batches: Vec<RecordBatch>, max_bytes: usize) -> Self {
        let (tx, messages) = mpsc::channel(ENCODED_AHEAD);
        let task = spawn(async move {
            let mut encoded = FlightDataEncoderBuilder::new()
                .with_schema(schema)
                .with_max_flight_data_size(max_bytes)
                .build(futures::stream::iter(batches.into_iter().map(Ok)));
            while let Some(message) = encoded.next().await {
                let message = message.map_err(Status::from);
                let failed = message.is_err();
                if tx.send(message).await.is_err() || failed {
                    return;
                }
            }
        });
        Self {
            messages,
            task: Some(task),
        }
    }
}

impl Stream for EncodedAhead {
    type Item = Result<FlightData, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(message) = ready!(self.messages.poll_recv(cx)) {
            return Poll::Ready(Some(message));
        }
        // Every message was received: the task has ended or is ending.
        let Some(task) = self.task.as_mut() else {
            return Poll::Ready(None);
        };
        let ended = ready!(Pin::new(task).poll(cx));
        self.task = None;
        Poll::Ready(ended.err().map(|e| {
            Err(Status::internal(format!(
                "encoding the partition's Flight messages: {e}"
            )))
        }))
    }
}
