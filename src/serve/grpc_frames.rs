//! A `do_get`'s Flight messages framed for gRPC by hand, each Arrow body sent
//! as the `Bytes` it already is.
//!
//! tonic's codec encodes every message with prost into one buffer, which
//! copies the whole Arrow body once more before HTTP/2 sends it. Here each
//! message becomes two chunks of the HTTP/2 body: a small head (the gRPC
//! prefix and the protobuf fields before the body) and the body itself,
//! shared, not copied (pyarrow's server hands gRPC the Arrow buffers the same
//! way).
//!
//! Guarantees:
//! - the bytes sent are, byte for byte, what tonic would send: per message a
//!   gRPC prefix (uncompressed, big-endian length) and the `FlightData`'s
//!   protobuf encoding as prost writes it (fields in tag order, empty fields
//!   left out, minimal varints);
//! - the body ends with trailers: `grpc-status: 0` after the last message, or
//!   the stream's error status; nothing is sent after an error;
//! - a message longer than a gRPC prefix can say (4 GiB - 1) ends the stream
//!   with an internal error instead of a wrong length.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use arrow_flight::FlightData;
use bytes::{BufMut, Bytes, BytesMut};
use futures::stream::{BoxStream, StreamExt};
use http::HeaderMap;
use http_body::Frame;
use prost::Message;
use tonic::Status;

/// Protobuf keys (field number << 3 | wire type 2) of `FlightData`'s fields.
const DESCRIPTOR_KEY: &[u8] = &[0x0a]; // 1
const HEADER_KEY: &[u8] = &[0x12]; // 2
const APP_METADATA_KEY: &[u8] = &[0x1a]; // 3
const BODY_KEY: &[u8] = &[0xc2, 0x3e]; // 1000

/// Bytes of `v` as a protobuf varint.
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

fn put_field(buf: &mut BytesMut, key: &[u8], value: &[u8]) {
    buf.put_slice(key);
    put_varint(buf, value.len());
    buf.put_slice(value);
}

/// One message as (head, body): the gRPC prefix and every field before the
/// body, then the body (empty when the message has none).
pub(crate) fn frame(message: &FlightData) -> Result<(Bytes, Bytes), Status> {
    let descriptor = message
        .flight_descriptor
        .as_ref()
        .map(|d| d.encode_to_vec());
    let header = &message.data_header;
    let app_metadata = &message.app_metadata;
    let body = &message.data_body;
    let mut len = 0;
    if let Some(d) = &descriptor {
        len += field_len(DESCRIPTOR_KEY, d.len());
    }
    if !header.is_empty() {
        len += field_len(HEADER_KEY, header.len());
    }
    if !app_metadata.is_empty() {
        len += field_len(APP_METADATA_KEY, app_metadata.len());
    }
    if !body.is_empty() {
        len += field_len(BODY_KEY, body.len());
    }
    let prefix_len = u32::try_from(len).map_err(|_| {
        Status::internal(format!(
            "a Flight message of {len} bytes is over gRPC's 4 GiB limit"
        ))
    })?;
    let mut head = BytesMut::with_capacity(5 + len - body.len());
    head.put_u8(0); // not compressed
    head.put_u32(prefix_len);
    if let Some(d) = &descriptor {
        put_field(&mut head, DESCRIPTOR_KEY, d);
    }
    if !header.is_empty() {
        put_field(&mut head, HEADER_KEY, header);
    }
    if !app_metadata.is_empty() {
        put_field(&mut head, APP_METADATA_KEY, app_metadata);
    }
    if body.is_empty() {
        return Ok((head.freeze(), Bytes::new()));
    }
    head.put_slice(BODY_KEY);
    put_varint(&mut head, body.len());
    Ok((head.freeze(), body.clone()))
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
    messages: BoxStream<'static, Result<FlightData, Status>>,
    body: Option<Bytes>,
    ended: bool,
}

impl FramedMessages {
    pub(crate) fn new(messages: BoxStream<'static, Result<FlightData, Status>>) -> Self {
        Self {
            messages,
            body: None,
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
        if let Some(body) = self.body.take() {
            return Poll::Ready(Some(Ok(Frame::data(body))));
        }
        if self.ended {
            return Poll::Ready(None);
        }
        match ready!(self.messages.poll_next_unpin(cx)) {
            Some(Ok(message)) => match frame(&message) {
                Ok((head, body)) => {
                    self.body = (!body.is_empty()).then_some(body);
                    Poll::Ready(Some(Ok(Frame::data(head))))
                }
                Err(status) => self.end(&status),
            },
            Some(Err(status)) => self.end(&status),
            None => self.end(&Status::ok("")),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended && self.body.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_flight::FlightDescriptor;
    use http_body::Body as _;
    use http_body_util::BodyExt;

    fn message(descriptor: bool, header: usize, app: usize, body: usize) -> FlightData {
        let bytes = |n: usize, b: u8| Bytes::from(vec![b; n]);
        FlightData {
            flight_descriptor: descriptor.then(|| FlightDescriptor::new_cmd("cmd")),
            data_header: bytes(header, 1),
            app_metadata: bytes(app, 2),
            data_body: bytes(body, 3),
        }
    }

    /// What tonic sends for `m`: the gRPC prefix and prost's encoding.
    fn tonic_bytes(m: &FlightData) -> Vec<u8> {
        let encoded = m.encode_to_vec();
        let mut out = vec![0];
        out.extend_from_slice(&(encoded.len() as u32).to_be_bytes());
        out.extend_from_slice(&encoded);
        out
    }

    #[test]
    fn a_message_is_framed_byte_for_byte_as_prost_encodes_it() {
        // Lengths around every varint width a Flight message meets.
        let sizes = [0, 1, 127, 128, 300, 16_383, 16_384, 2_097_152, 2_097_153];
        for descriptor in [false, true] {
            for &header in &[0, 5, 200, 16_384] {
                for &app in &[0, 1, 130] {
                    for &body in &sizes {
                        let m = message(descriptor, header, app, body);
                        let (head, b) = frame(&m).expect("test value");
                        let mut got = head.to_vec();
                        got.extend_from_slice(&b);
                        assert_eq!(got, tonic_bytes(&m), "{descriptor} {header} {app} {body}");
                        // The body is shared with the message, not copied.
                        if body > 0 {
                            assert_eq!(b.as_ptr(), m.data_body.as_ptr());
                        }
                    }
                }
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

    async fn collect(
        items: Vec<Result<FlightData, Status>>,
    ) -> (Vec<u8>, HeaderMap, Vec<Result<FlightData, Status>>) {
        let mut body = FramedMessages::new(futures::stream::iter(items.clone()).boxed());
        let mut data = Vec::new();
        let mut trailers = None;
        while let Some(frame) = body.frame().await {
            let frame = frame.expect("test value");
            assert!(trailers.is_none(), "nothing after the trailers");
            match frame.into_data() {
                Ok(d) => data.extend_from_slice(&d),
                Err(f) => trailers = Some(f.into_trailers().expect("test value")),
            }
        }
        assert!(body.is_end_stream());
        (data, trailers.expect("trailers end the body"), items)
    }

    #[tokio::test]
    async fn the_body_is_every_message_then_an_ok_status() {
        let items = vec![
            Ok(message(false, 40, 0, 0)),
            Ok(message(false, 200, 0, 5000)),
        ];
        let (data, trailers, items) = collect(items).await;
        let expected: Vec<u8> = items
            .iter()
            .flat_map(|m| tonic_bytes(m.as_ref().expect("test value")))
            .collect();
        assert_eq!(data, expected);
        assert_eq!(trailers["grpc-status"], "0");
        assert!(trailers.get("grpc-message").is_none());
    }

    #[tokio::test]
    async fn an_error_ends_the_body_with_its_status_and_nothing_after() {
        let items = vec![
            Ok(message(false, 40, 0, 10)),
            Err(Status::resource_exhausted("over the memory limit")),
            Ok(message(false, 40, 0, 10)),
        ];
        let (data, trailers, items) = collect(items).await;
        assert_eq!(data, tonic_bytes(items[0].as_ref().expect("test value")));
        assert_eq!(
            Status::from_header_map(&trailers)
                .expect("test value")
                .code(),
            tonic::Code::ResourceExhausted
        );
        assert_eq!(trailers["grpc-message"], "over%20the%20memory%20limit");
    }
}
