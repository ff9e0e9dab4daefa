//! The ticket of one Flight endpoint, and the key of the server process that
//! issues and checks them.
//!
//! A ticket names the request it was listed for (its dataset version pinned),
//! the server process that issued it, the read-ahead stream opened by that
//! `get_flight_info` call and the partition's index, and carries a tag: the
//! keyed BLAKE3 hash of those fields under the server's key. The key and the
//! server id are drawn from the OS's random source when a server starts.
//!
//! Guarantees: [`TicketKey::check`] accepts only a ticket this server process
//! issued, unchanged: a ticket of another (e.g. restarted) server process is
//! [`TicketError::OtherServer`], a ticket whose request, stream or index was
//! edited (or made up) is [`TicketError::Forged`], bytes that are no ticket
//! are [`TicketError::Malformed`]. A stream id is issued once per server
//! process, so a checked ticket's stream was opened for exactly its request:
//! a ticket never reads another request's rows.

use serde::{Deserialize, Serialize};

use super::request::{FlightRequest, RequestError};

/// One endpoint's ticket: what to read and who issued it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlightTicket {
    /// The request listed by `get_flight_info`, its version pinned.
    pub request: FlightRequest,
    /// The id of the server process that issued it (hex).
    pub server: String,
    /// The read-ahead stream opened by that `get_flight_info` call.
    pub stream: u64,
    /// The partition's index in the epoch's read order.
    pub index: usize,
    /// The keyed hash of the fields above under the issuing server's key (hex).
    pub tag: String,
}

/// The fields a tag covers, in a fixed order.
#[derive(Serialize)]
struct Signed<'a> {
    request: &'a FlightRequest,
    server: &'a str,
    stream: u64,
    index: usize,
}

/// Why a ticket is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TicketError {
    /// Not a ticket at all (or its request is invalid).
    #[error("not a ticket of this server (tickets come from get_flight_info): {0}")]
    Malformed(String),
    /// Issued by another server process (the server was restarted since).
    #[error(
        "this ticket was issued by another udfchain serve process (server {ticket}; this \
         one is {this}), e.g. before the server restarted: call get_flight_info again for \
         fresh tickets"
    )]
    OtherServer {
        /// The server id the ticket names.
        ticket: String,
        /// This server's id.
        this: String,
    },
    /// Its fields do not match its tag: edited or made up.
    #[error(
        "this ticket was altered or forged (its tag does not match its request, stream \
         and index): use the tickets get_flight_info returns, unchanged"
    )]
    Forged,
}

/// A server process's id and ticket key.
pub struct TicketKey {
    server: String,
    key: [u8; blake3::KEY_LEN],
}

impl std::fmt::Debug for TicketKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key stays out of logs.
        f.debug_struct("TicketKey")
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

impl TicketKey {
    /// A fresh server id and key from the OS's random source.
    pub fn random() -> std::io::Result<Self> {
        let mut bytes = [0u8; 8 + blake3::KEY_LEN];
        getrandom::fill(&mut bytes).map_err(std::io::Error::other)?;
        let (id, key) = bytes.split_at(8);
        let mut k = [0u8; blake3::KEY_LEN];
        k.copy_from_slice(key);
        Ok(Self {
            server: id.iter().map(|b| format!("{b:02x}")).collect(),
            key: k,
        })
    }

    fn tag(
        &self,
        request: &FlightRequest,
        server: &str,
        stream: u64,
        index: usize,
    ) -> blake3::Hash {
        let signed = Signed {
            request,
            server,
            stream,
            index,
        };
        // Plain data with string keys: serialising cannot fail.
        let bytes = serde_json::to_vec(&signed).unwrap_or_default();
        blake3::keyed_hash(&self.key, &bytes)
    }

    /// The ticket of partition `index` of `stream`, opened for `request`.
    pub fn issue(&self, request: &FlightRequest, stream: u64, index: usize) -> Vec<u8> {
        let ticket = FlightTicket {
            request: request.clone(),
            server: self.server.clone(),
            stream,
            index,
            tag: self
                .tag(request, &self.server, stream, index)
                .to_hex()
                .to_string(),
        };
        // Plain data with string keys: serialising cannot fail.
        serde_json::to_vec(&ticket).unwrap_or_default()
    }

    /// Parses a ticket and checks that this server process issued it as it is.
    pub fn check(&self, bytes: &[u8]) -> Result<FlightTicket, TicketError> {
        let t: FlightTicket =
            serde_json::from_slice(bytes).map_err(|e| TicketError::Malformed(e.to_string()))?;
        if t.server != self.server {
            return Err(TicketError::OtherServer {
                ticket: t.server,
                this: self.server.clone(),
            });
        }
        let got = blake3::Hash::from_hex(&t.tag).map_err(|_| TicketError::Forged)?;
        // blake3::Hash compares in constant time.
        if got != self.tag(&t.request, &t.server, t.stream, t.index) {
            return Err(TicketError::Forged);
        }
        t.request
            .check()
            .map_err(|RequestError(e)| TicketError::Malformed(e))?;
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(json: &str) -> FlightRequest {
        FlightRequest::parse(json.as_bytes()).expect("request")
    }

    #[test]
    fn an_issued_ticket_checks_and_round_trips() {
        let key = TicketKey::random().expect("key");
        let req = request(r#"{"dataset": "d", "version": 2, "shuffle": true}"#);
        let t = key.check(&key.issue(&req, 9, 3)).expect("ticket");
        assert_eq!((t.request, t.stream, t.index), (req, 9, 3));
        assert_eq!(t.server, key.server);
    }

    #[test]
    fn another_server_s_ticket_is_refused() {
        let (a, b) = (
            TicketKey::random().expect("a"),
            TicketKey::random().expect("b"),
        );
        assert_ne!(a.server, b.server, "ids are random");
        let bytes = a.issue(&request(r#"{"dataset": "d"}"#), 1, 0);
        let e = b.check(&bytes).expect_err("other server");
        assert!(matches!(e, TicketError::OtherServer { .. }), "{e}");
        assert!(e.to_string().contains("get_flight_info again"), "{e}");
    }

    #[test]
    fn an_edited_ticket_is_refused() {
        let key = TicketKey::random().expect("key");
        let bytes = key.issue(&request(r#"{"dataset": "da", "version": 1}"#), 1, 0);
        let mut t: serde_json::Value = serde_json::from_slice(&bytes).expect("json");
        for (field, value) in [
            ("stream", serde_json::json!(2)),
            ("index", serde_json::json!(1)),
            (
                "request",
                serde_json::json!({"dataset": "db", "version": 1}),
            ),
            (
                "request",
                serde_json::json!({"dataset": "da", "version": 2}),
            ),
            ("tag", serde_json::json!("00")),
        ] {
            let mut edited = t.clone();
            edited[field] = value;
            let e = key
                .check(&serde_json::to_vec(&edited).expect("bytes"))
                .expect_err("edited");
            assert_eq!(e, TicketError::Forged, "{field}");
        }
        t["extra"] = serde_json::json!(1);
        let e = key
            .check(&serde_json::to_vec(&t).expect("bytes"))
            .expect_err("unknown field");
        assert!(matches!(e, TicketError::Malformed(_)), "{e}");
        assert!(matches!(
            key.check(b"garbage"),
            Err(TicketError::Malformed(_))
        ));
    }
}
