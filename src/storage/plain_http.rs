//! [`PlainHttp`]: the HTTP client of `http(s)://` stores, which says what a
//! plain HTTP server lacks instead of asking it again.
//!
//! object_store retries every 5xx answer (up to ten times, over seconds) and
//! then shows the server's raw error page. Some answers never change: a
//! server without WebDAV (Python's `http.server`) answers a listing's
//! `PROPFIND` with 501 Not Implemented on every try.
//!
//! Guarantees: a request answered with a status that will not change and
//! that object_store would retry (501 Not Implemented, 505 HTTP Version Not
//! Supported), a `PROPFIND` answered 405 Method Not Allowed, and a ranged
//! `GET` answered 200 with the whole object (a server that ignores `Range`,
//! which object_store fails as a "non-partial response") end at once, not
//! retried, as [`Unsupported`]: the method, the URL, the status and what the
//! server lacks (listing needs WebDAV `PROPFIND`; reading part of an object
//! needs `Range`). It reaches callers as an I/O error of kind `Unsupported`,
//! so nothing above retries it either ([`Error::may_heal`](crate::Error::may_heal)).
//! Every other answer passes unchanged: a 404 is still "not found", and
//! object_store itself retries no other 4xx than 408 and 429.

use async_trait::async_trait;
use object_store::ClientOptions;
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest, HttpResponse, HttpService,
    ReqwestConnector,
};

/// Connects `http(s)://` stores through [`Permanent`] (see the module header).
#[derive(Debug, Default)]
pub(crate) struct PlainHttp;

impl HttpConnector for PlainHttp {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let inner = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(Permanent(inner)))
    }
}

/// The reqwest client, with permanent answers turned into [`Unsupported`].
#[derive(Debug)]
struct Permanent(HttpClient);

#[async_trait]
impl HttpService for Permanent {
    async fn call(&self, req: HttpRequest) -> Result<HttpResponse, HttpError> {
        let method = req.method().as_str().to_string();
        let url = req.uri().to_string();
        let ranged = req.headers().contains_key("range");
        let response = self.0.execute(req).await?;
        let status = response.status();
        let Some(lacks) = lacks(&method, ranged, status.as_u16()) else {
            return Ok(response);
        };
        let unsupported = Unsupported {
            method,
            url,
            status: status.to_string(),
            lacks,
        };
        Err(HttpError::new(
            HttpErrorKind::Unknown,
            std::io::Error::new(std::io::ErrorKind::Unsupported, unsupported),
        ))
    }
}

/// What the server lacks when it answers `method` (`ranged`: with a `Range`
/// header) with `status`; `None` for an answer that may change or that
/// object_store handles itself.
fn lacks(method: &str, ranged: bool, status: u16) -> Option<&'static str> {
    match (method, status) {
        ("PROPFIND", 405 | 501) => Some(
            "it does not speak WebDAV, whose PROPFIND listing an http(s):// directory needs \
             (read the files by their URLs, or serve the directory with a WebDAV server)",
        ),
        ("GET", 200 | 501) if ranged => Some(
            "it does not serve byte ranges (HTTP Range), which reading part of an object \
             (a tar member, a Parquet footer) needs",
        ),
        (_, 501 | 505) => Some("it does not implement this request"),
        _ => None,
    }
}

/// A plain HTTP server cannot serve a request (see the module header).
#[derive(Debug, thiserror::Error)]
#[error("the server answered {method} {url} with {status}: {lacks}")]
pub struct Unsupported {
    method: String,
    url: String,
    status: String,
    lacks: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_answers_that_never_change_are_unsupported() {
        assert!(lacks("PROPFIND", false, 501).is_some_and(|l| l.contains("WebDAV")));
        assert!(lacks("PROPFIND", false, 405).is_some_and(|l| l.contains("WebDAV")));
        assert!(lacks("GET", true, 200).is_some_and(|l| l.contains("Range")));
        assert!(lacks("GET", true, 501).is_some_and(|l| l.contains("Range")));
        assert!(lacks("HEAD", false, 501).is_some());
        for (method, ranged, status) in [
            ("GET", false, 200),
            ("GET", true, 206),
            ("GET", false, 404),
            ("PROPFIND", false, 207),
            ("PROPFIND", false, 404),
            ("GET", false, 503),
            ("GET", false, 429),
            ("GET", false, 408),
        ] {
            assert_eq!(lacks(method, ranged, status), None, "{method} {status}");
        }
    }
}
