//! A `do_get`'s Flight messages framed for gRPC by hand, each Arrow body sent
//! as the `Bytes` it already is.
//!
//! tonic's codec encodes every message with prost into one buffer, which
//! copies the whole Arrow body once more before HTTP/2 sends it. Here each
//! message becomes chunks of the HTTP/2 body: the gRPC prefix and the
//! protobuf fields before the body, then the body's pieces — each Arrow
//! buffer over [`COALESCE`] bytes as it is, shared, not copied; smaller
//! pieces (bitmaps, padding) copied together into one chunk so HTTP/2 sends
//! few frames. pyarrow's server hands gRPC the Arrow buffers the same way.
//!
//! Guarantees:
//! - the bytes sent are, byte for byte, what tonic would send for the same
//!   `FlightData`: per message a gRPC prefix (uncompressed, big-endian length)
//!   and the protobuf encoding as prost writes it (fields in tag order, empty
//!   fields left out, minimal varints);
//! - the body ends with trailers: `grpc-status: 0` after the last message, or
//!   the stream's error status; nothing is sent after an error;
//! - a message longer than a gRPC prefix can say (4 GiB - 1) ends the stream
//!   with an internal error instead of a wrong length.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{BufMut, Bytes, BytesMut};
use futures::stream::{BoxStream, StreamExt};
use http::HeaderMap;
use http_body::Frame;
use tonic::Status;

use super::encode::FlightMessage;

/// Body pieces up to this many bytes are copied into the chunk before them.
pub(crate) const COALESCE: usize = 16 * 1024;

/// Protobuf keys (field number << 3 | wire type 2) of `FlightData`'s
/// `data_header` (2) and `data_body` (1000).
const HEADER_KEY: &[u8] = &[0x12];
const BODY_KEY: &[u8] = &[0xc2, 0x3e];

/// Bytes of `v` as a protobuf varint (prost's own varint functions are
/// `#[doc(hidden)]`, not its API).
fn varint_len(v: usize) -> usize {
    let bits = usize::BITS - (v | 1).leading_zeros();
    bits.div_ceil(7) as usize
}

fn put_varint(buf: &mut BytesMut, mut v: usize) {
    while v >= 0x80 {
        buf.put_u8((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    buf.put_u8(v as u8);
}

/// Length of a length-delimited field of `n` bytes under a key of `key` bytes.
fn field_len(key: &[u8], n: usize) -> usize {
    key.len() + varint_len(n) + n
}

/// One message as the chunks of the HTTP/2 body that carry it.
pub(crate) fn frame(message: &FlightMessage) -> Result<Vec<Bytes>, Status> {
    let header = &message.header;
    let body_len = message.body_len();
    let mut len = 0;
    if !header.is_empty() {
        len += field_len(HEADER_KEY, header.len());
    }
    if body_len > 0 {
        len += field_len(BODY_KEY, body_len);
    }
    let prefix_len = u32::try_from(len).map_err(|_| {
        Status::internal(format!(
            "a Flight message of {len} bytes is over gRPC's 4 GiB limit"
        ))
    })?;
    let mut small = BytesMut::with_capacity(5 + len - body_len + COALESCE.min(body_len));
    small.put_u8(0); // not compressed
    small.put_u32(prefix_len);
    if !header.is_empty() {
        small.put_slice(HEADER_KEY);
        put_varint(&mut small, header.len());
        small.put_slice(header);
    }
    let mut chunks = Vec::new();
    if body_len > 0 {
        small.put_slice(BODY_KEY);
        put_varint(&mut small, body_len);
        for piece in &message.body {
            if piece.len() <= COALESCE {
                small.put_slice(piece);
            } else {
                if !small.is_empty() {
                    chunks.push(small.split().freeze());
                }
                chunks.push(piece.clone());
            }
        }
    }
    if !small.is_empty() {
        chunks.push(small.freeze());
    }
    Ok(chunks)
}

/// The trailers that end a response with `status`.
fn trailers(status: &Status) -> HeaderMap {
    let mut map = HeaderMap::new();
    if status.add_header(&mut map).is_err() {
        // The message could not be a header value: say what failed, codeless.
        map.clear();
        let _ = Status::internal("the error's message is no valid header").add_header(&mut map);
    }
    map
}

/// The HTTP/2 body of a `do_get`: its messages framed, then the trailers.
pub(crate) struct FramedMessages {
    messages: BoxStream<'static, Result<FlightMessage, Status>>,
    chunks: VecDeque<Bytes>,
    ended: bool,
}

impl FramedMessages {
    pub(crate) fn new(messages: BoxStream<'static, Result<FlightMessage, Status>>) -> Self {
        Self {
            messages,
            chunks: VecDeque::new(),
            ended: false,
        }
    }

    fn end(&mut self, status: &Status) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        self.ended = true;
        Poll::Ready(Some(Ok(Frame::trailers(trailers(status)))))
    }
}

impl http_body::Body for FramedMessages {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        loop {
            if let Some(chunk) = self.chunks.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(chunk))));
            }
            if self.ended {
                return Poll::Ready(None);
            }
            match ready!(self.messages.poll_next_unpin(cx)) {
                Some(Ok(message)) => match frame(&message) {
                    Ok(chunks) => self.chunks.extend(chunks),
                    Err(status) => return self.end(&status),
                },
                Some(Err(status)) => return self.end(&status),
                None => return self.end(&Status::ok("")),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended && self.chunks.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body::Body as _;
    use http_body_util::BodyExt;
    use prost::Message;

    /// A message whose body has pieces of `sizes` bytes.
    fn message(header: usize, sizes: &[usize]) -> FlightMessage {
        FlightMessage {
            header: Bytes::from(vec![1; header]),
            body: sizes
                .iter()
                .enumerate()
                .map(|(i, &n)| Bytes::from(vec![i as u8 + 2; n]))
                .collect(),
        }
    }

    /// What tonic sends for the same message: the gRPC prefix and prost's encoding.
    fn tonic_bytes(m: &FlightMessage) -> Vec<u8> {
        let encoded = m.clone().into_flight_data().encode_to_vec();
        let mut out = vec![0];
        out.extend_from_slice(&(encoded.len() as u32).to_be_bytes());
        out.extend_from_slice(&encoded);
        out
    }

    #[test]
    fn a_message_is_framed_byte_for_byte_as_prost_encodes_it() {
        // Lengths around every varint width a Flight message meets, and
        // pieces on both sides of COALESCE.
        let bodies: &[&[usize]] = &[
            &[],
            &[1],
            &[127],
            &[0, 128],
            &[300, 4],
            &[COALESCE, COALESCE + 1, 60],
            &[16_383, 16_384, 2_097_152],
            &[2_097_153],
        ];
        for &header in &[0, 5, 200, 16_384] {
            for &sizes in bodies {
                let m = message(header, sizes);
                let chunks = frame(&m).expect("framed");
                assert_eq!(chunks.concat(), tonic_bytes(&m), "{header} {sizes:?}");
                // A large piece is sent as it is, shared, not copied.
                for piece in m.body.iter().filter(|p| p.len() > COALESCE) {
                    assert!(
                        chunks.iter().any(|c| c.as_ptr() == piece.as_ptr()),
                        "{header} {sizes:?}"
                    );
                }
                assert!(chunks.iter().all(|c| !c.is_empty()));
            }
        }
    }

    #[test]
    fn varint_lengths_match_the_encoding() {
        for v in [0, 1, 127, 128, 16_383, 16_384, usize::MAX >> 1, usize::MAX] {
            let mut buf = BytesMut::new();
            put_varint(&mut buf, v);
            assert_eq!(buf.len(), varint_len(v), "{v}");
        }
    }

    async fn collect(items: Vec<Result<FlightMessage, Status>>) -> (Vec<u8>, HeaderMap) {
        let mut body = FramedMessages::new(futures::stream::iter(items).boxed());
        let mut data = Vec::new();
        let mut trailers = None;
        while let Some(frame) = body.frame().await {
            let frame = frame.expect("no body error: errors are trailers");
            assert!(trailers.is_none(), "nothing after the trailers");
            match frame.into_data() {
                Ok(d) => data.extend_from_slice(&d),
                Err(f) => trailers = Some(f.into_trailers().expect("trailers")),
            }
        }
        assert!(body.is_end_stream());
        (data, trailers.expect("trailers end the body"))
    }

    #[tokio::test]
    async fn the_body_is_every_message_then_an_ok_status() {
        let items = [message(40, &[]), message(200, &[5000, 30_000, 7])];
        let (data, trailers) = collect(items.iter().cloned().map(Ok).collect()).await;
        assert_eq!(
            data,
            items.iter().flat_map(tonic_bytes).collect::<Vec<u8>>()
        );
        assert_eq!(trailers["grpc-status"], "0");
        assert!(trailers.get("grpc-message").is_none());
    }

    #[tokio::test]
    async fn an_error_ends_the_body_with_its_status_and_nothing_after() {
        let first = message(40, &[10]);
        let items = vec![
            Ok(first.clone()),
            Err(Status::resource_exhausted("over the memory limit")),
            Ok(message(40, &[10])),
        ];
        let (data, trailers) = collect(items).await;
        assert_eq!(data, tonic_bytes(&first));
        assert_eq!(
            Status::from_header_map(&trailers).expect("a status").code(),
            tonic::Code::ResourceExhausted
        );
        assert_eq!(trailers["grpc-message"], "over%20the%20memory%20limit");
    }
}
