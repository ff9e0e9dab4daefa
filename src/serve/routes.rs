//! The Flight service's gRPC routes: `DoGet` answered with its messages framed
//! by hand (`grpc_frames.rs`: the Arrow bodies sent as they are), every other
//! method by the generated `FlightServiceServer` and tonic's codec.
//!
//! Guarantees for `DoGet`, as tonic gives them for the other methods:
//! - the request is read up to [`MAX_REQUEST_MESSAGE`] bytes (more is
//!   `ResourceExhausted`) and must be one uncompressed gRPC message holding a
//!   `Ticket` (anything else is `InvalidArgument`, a compressed one
//!   `Unimplemented`);
//! - the handler sees the request's metadata and the connection's remote
//!   address, as it would through tonic;
//! - an error before the first message is a trailers-only response carrying
//!   the status; the response's metadata become its headers.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use arrow_flight::Ticket;
use arrow_flight::flight_service_server::FlightServiceServer;
use bytes::Bytes;
use http::HeaderValue;
use http::header::CONTENT_TYPE;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use prost::Message;
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::{BoxFuture, Service};
use tonic::server::NamedService;

use super::flight::LoaderFlightService;
use super::grpc_frames::FramedMessages;

/// The longest request message the server reads (a ticket holds its JSON
/// request, so it follows the request's limit, not a ticket's usual ~300 bytes).
pub const MAX_REQUEST_MESSAGE: usize = 16 * 1024 * 1024;

const DO_GET_PATH: &str = "/arrow.flight.protocol.FlightService/DoGet";

/// Every route of the Flight service.
#[derive(Clone)]
pub(crate) struct FlightRoutes {
    service: Arc<LoaderFlightService>,
    generated: FlightServiceServer<LoaderFlightService>,
}

impl FlightRoutes {
    pub(crate) fn new(service: LoaderFlightService) -> Self {
        let service = Arc::new(service);
        let generated = FlightServiceServer::from_arc(Arc::clone(&service))
            .max_decoding_message_size(MAX_REQUEST_MESSAGE)
            .max_encoding_message_size(usize::MAX);
        Self { service, generated }
    }
}

impl NamedService for FlightRoutes {
    const NAME: &'static str = <FlightServiceServer<LoaderFlightService> as NamedService>::NAME;
}

impl Service<http::Request<Body>> for FlightRoutes {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        if req.uri().path() != DO_GET_PATH {
            return self.generated.call(req);
        }
        let service = Arc::clone(&self.service);
        Box::pin(async move {
            Ok(do_get(&service, req)
                .await
                .unwrap_or_else(Status::into_http))
        })
    }
}

async fn do_get(
    service: &LoaderFlightService,
    req: http::Request<Body>,
) -> Result<http::Response<Body>, Status> {
    let (parts, body) = req.into_parts();
    if let Some(encoding) = parts.headers.get("grpc-encoding")
        && encoding != "identity"
    {
        return Err(Status::unimplemented(format!(
            "the request is compressed ({encoding:?}): send DoGet uncompressed"
        )));
    }
    let bytes = Limited::new(body, MAX_REQUEST_MESSAGE + 5)
        .collect()
        .await
        .map_err(|e| {
            if e.downcast_ref::<LengthLimitError>().is_some() {
                Status::resource_exhausted(format!(
                    "a DoGet request over {MAX_REQUEST_MESSAGE} bytes"
                ))
            } else {
                Status::from_error(e)
            }
        })?
        .to_bytes();
    let ticket = one_ticket(bytes)?;
    let request = tonic::Request::from_http(http::Request::from_parts(parts, ticket));
    let (metadata, messages, _) = service.partition_messages(request).await?.into_parts();
    let messages = futures::StreamExt::boxed(messages);
    let mut response = http::Response::new(Body::new(FramedMessages::new(messages)));
    *response.headers_mut() = metadata.into_headers();
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    Ok(response)
}

/// The `Ticket` of a request body holding exactly one gRPC message.
fn one_ticket(bytes: Bytes) -> Result<Ticket, Status> {
    let bad = |what: &str| Status::invalid_argument(format!("a DoGet request {what}"));
    let [flag, l0, l1, l2, l3, ..] = bytes[..] else {
        return Err(bad("holds no message: send one Ticket"));
    };
    match flag {
        0 => {}
        1 => {
            return Err(Status::unimplemented(
                "the request is compressed: send DoGet uncompressed",
            ));
        }
        _ => return Err(bad(&format!("has the invalid compression flag {flag}"))),
    }
    let len = u32::from_be_bytes([l0, l1, l2, l3]) as usize;
    if bytes.len() - 5 != len {
        return Err(bad(&format!(
            "holds {} bytes after a message of {len}: send one Ticket",
            bytes.len() - 5
        )));
    }
    Ticket::decode(bytes.slice(5..)).map_err(|e| bad(&format!("holds no Ticket: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn framed(flag: u8, message: &[u8], extra: &[u8]) -> Bytes {
        let mut b = vec![flag];
        b.extend_from_slice(&(message.len() as u32).to_be_bytes());
        b.extend_from_slice(message);
        b.extend_from_slice(extra);
        b.into()
    }

    #[test]
    fn a_request_is_one_uncompressed_ticket_or_a_clear_status() {
        let t = Ticket::new("abc").encode_to_vec();
        assert_eq!(
            one_ticket(framed(0, &t, b"")).expect("test value"),
            Ticket::new("abc")
        );
        assert_eq!(
            one_ticket(framed(0, b"", b"")).expect("test value"),
            Ticket::new("")
        );
        let code = |b: Bytes| one_ticket(b).expect_err("refused").code();
        assert_eq!(code(Bytes::new()), tonic::Code::InvalidArgument);
        assert_eq!(
            code(Bytes::from_static(&[0, 0, 0])),
            tonic::Code::InvalidArgument
        );
        assert_eq!(code(framed(1, &t, b"")), tonic::Code::Unimplemented);
        assert_eq!(code(framed(7, &t, b"")), tonic::Code::InvalidArgument);
        assert_eq!(code(framed(0, &t, b"x")), tonic::Code::InvalidArgument);
        assert_eq!(
            code(framed(0, &t, &framed(0, &t, b""))),
            tonic::Code::InvalidArgument
        );
        // Declares more than it holds.
        let mut short = framed(0, &t, b"").to_vec();
        short.pop();
        assert_eq!(code(short.into()), tonic::Code::InvalidArgument);
        // Not a protobuf Ticket (field 1 as a varint of 10 bytes and more).
        assert_eq!(
            code(framed(0, &[0x0a, 0xff], b"")),
            tonic::Code::InvalidArgument
        );
    }

    proptest! {
        #![proptest_config(crate::util::fuzz_cases())]

        /// Any bytes from a client, framed or not: a Ticket or a clear status, never a panic.
        #[test]
        fn any_request_body_is_a_ticket_or_a_status(
            flag in 0u8..3,
            declared in proptest::option::of(0u32..64),
            message in proptest::collection::vec(any::<u8>(), 0..48),
        ) {
            let mut b = vec![flag];
            let len = declared.unwrap_or(message.len() as u32);
            b.extend_from_slice(&len.to_be_bytes());
            b.extend_from_slice(&message);
            match one_ticket(b.into()) {
                Ok(t) => prop_assert!(t.ticket.len() <= message.len()),
                Err(s) => prop_assert!(!s.message().is_empty()),
            }
        }
    }
}
