//! Who may use the browser. Guarantees:
//! - with a token, every request carries it, as `?token=` (which also sets an
//!   `HttpOnly`, `SameSite=Strict` cookie, so the pages' links, images and
//!   players need not repeat it) or as that cookie; otherwise 401. Tokens are
//!   compared in constant time;
//! - without a token (loopback only: `UiServer::bind` makes one for any
//!   other address), the `Host` header must name the loopback address or
//!   `localhost`, so a web page elsewhere cannot reach the browser through
//!   DNS rebinding (403 otherwise);
//! - a random token is 128 bits from the OS (`getrandom`), hex.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::pages::AppState;
use crate::error::{Error, Result};

/// The cookie the token is kept in.
pub(super) const COOKIE: &str = "udfchain_ui_token";

/// A random token: 32 hex digits.
pub fn random_token() -> Result<String> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| Error::internal(format!("random token: {e}")))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The token rule of one server.
#[derive(Debug)]
pub(super) struct Auth {
    token: Option<String>,
    local: SocketAddr,
}

impl Auth {
    pub(super) fn new(token: Option<String>, local: SocketAddr) -> Self {
        Self { token, local }
    }
}

fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `?token=` of a query string.
fn query_token(query: Option<&str>) -> Option<String> {
    url::form_urlencoded::parse(query?.as_bytes())
        .find(|(k, _)| k == "token")
        .map(|(_, v)| v.into_owned())
}

fn cookie_token(req: &Request) -> Option<String> {
    req.headers()
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.to_string())
}

/// Whether a `Host` header names this loopback server.
fn loopback_host(host: Option<&str>, local: SocketAddr) -> bool {
    let Some(host) = host else { return false };
    let port = local.port().to_string();
    let name = match host.rsplit_once(':') {
        Some((name, p)) if p == port => name,
        _ => return false,
    };
    matches!(name, "localhost" | "127.0.0.1" | "[::1]") || name == local.ip().to_string()
}

/// The middleware: refuses a request without the token (or, without a
/// token, one whose `Host` is not loopback).
pub(super) async fn check(
    State(state): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Response {
    let auth = &state.auth;
    let Some(token) = &auth.token else {
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok());
        if !loopback_host(host, auth.local) {
            return (
                StatusCode::FORBIDDEN,
                "udfchain ui: this server answers only to http://127.0.0.1 or localhost",
            )
                .into_response();
        }
        return next.run(req).await;
    };
    let from_query = query_token(req.uri().query());
    let from_cookie = cookie_token(&req);
    let ok_query = from_query.as_deref().is_some_and(|t| same(t, token));
    let ok_cookie = from_cookie.as_deref().is_some_and(|t| same(t, token));
    if !(ok_query || ok_cookie) {
        return (
            StatusCode::UNAUTHORIZED,
            "udfchain ui: a token is needed (open the URL `udfchain ui` printed)",
        )
            .into_response();
    }
    let mut resp = next.run(req).await;
    if ok_query && !ok_cookie {
        let cookie = format!("{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict");
        if let Ok(v) = HeaderValue::from_str(&cookie) {
            resp.headers_mut().append(header::SET_COOKIE, v);
        }
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_of_a_loopback_server() {
        let local: SocketAddr = "127.0.0.1:8765".parse().expect("addr");
        assert!(loopback_host(Some("127.0.0.1:8765"), local));
        assert!(loopback_host(Some("localhost:8765"), local));
        assert!(!loopback_host(Some("evil.example:8765"), local));
        assert!(!loopback_host(Some("127.0.0.1:80"), local));
        assert!(!loopback_host(None, local));
    }

    #[test]
    fn tokens_compare_whole() {
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd"));
        assert!(!same("abc", "ab"));
        assert_eq!(random_token().expect("token").len(), 32);
    }
}
