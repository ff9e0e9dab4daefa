//! `udfchain ui`: a local, read-only browser of the datasets under a root,
//! served over HTTP by an axum router (`pages.rs` the pages, `render.rs` values
//! as HTML, `safety.rs` what SQL may run and which local paths it may read,
//! `files.rs` signed file references, thumbnails and file bytes, `auth.rs` the
//! token and the Host check). The CSS and JavaScript are compiled into the
//! binary (`assets/`): no build step, nothing fetched from elsewhere.
//!
//! Guarantees: [`UiServer::bind`] listens before it returns (port 0 gets a free
//! port, [`BoundUi::url`] names it, with the token when one is needed).
//! A non-loopback address needs a token: the one given, or a random one made
//! at bind (see `auth.rs`); every request then carries it (`?token=` or the
//! cookie set from it), else 401. Only one `SELECT` runs per request, with a
//! row limit (a page of rows) and a timeout; its local reads stay under the
//! root and the `allow` dirs (`safety.rs`). File bytes are served only for
//! file references the server itself signed on a page it rendered
//! (`files.rs`). Every text that reaches a page goes through `redact`.
//! [`BoundUi::run_until`] serves until its shutdown future completes.

mod auth;
mod files;
mod pages;
mod render;
mod safety;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use tokio::net::TcpListener;

use crate::dataset::Catalog;
use crate::error::{Error, Result};
use crate::script::ScriptRunner;
use crate::session::Session;

pub use auth::random_token;

/// The address `udfchain ui` listens on by default.
pub const DEFAULT_BIND: &str = "127.0.0.1:8765";
/// Rows on a page.
pub const PAGE_ROWS: usize = 50;
/// How long one query of a page may run (default).
pub const DEFAULT_QUERY_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest side of a thumbnail, in pixels.
pub const THUMB_SIDE: u32 = 160;

/// A dataset browser over a session's root, before it listens.
#[derive(Debug, Clone)]
#[must_use = "a server does nothing until it is bound and run"]
pub struct UiServer {
    session: Arc<Session>,
    token: Option<String>,
    allow: Vec<PathBuf>,
    timeout: Duration,
}

impl UiServer {
    /// Browses the datasets under `session`'s root, reading with its settings.
    pub fn new(session: Arc<Session>) -> Self {
        Self {
            session,
            token: None,
            allow: Vec::new(),
            timeout: DEFAULT_QUERY_TIMEOUT,
        }
    }

    /// Every request must carry this token (a non-loopback bind without one
    /// gets a random token).
    pub fn token(mut self, token: Option<String>) -> Self {
        self.token = token.filter(|t| !t.is_empty());
        self
    }

    /// A local dir queries may read besides the root (repeatable).
    pub fn allow_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.allow.push(dir.into());
        self
    }

    /// How long one query may run (default [`DEFAULT_QUERY_TIMEOUT`]).
    pub fn query_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Listens on `addr` (`host:port`, port 0 for a free one). The session
    /// then reads each file in one partition
    /// (`datafusion.optimizer.repartition_file_scans = false`), so pages and
    /// row numbers follow the stored order: give the browser its own session.
    pub async fn bind(self, addr: &str) -> Result<BoundUi> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| Error::io(format!("ui address {addr}"), e))?;
        let local = listener
            .local_addr()
            .map_err(|e| Error::io(format!("ui address {addr}"), e))?;
        let token = match self.token {
            Some(t) => Some(t),
            None if local.ip().is_loopback() => None,
            None => Some(random_token()?),
        };
        let settings = self.session.settings().clone();
        let root = settings.get_root();
        let catalog = Catalog::open(root.clone()).await?;
        let mut allowed = vec![catalog.root().to_path_buf()];
        allowed.extend(self.allow.iter().cloned());
        let allowed = allowed
            .into_iter()
            .map(|d| std::fs::canonicalize(&d).map_err(|e| Error::io(d.display(), e)))
            .collect::<Result<Vec<_>>>()?;
        let runner = ScriptRunner::new(Arc::clone(&self.session));
        // One partition per file: pages and row numbers follow the stored order.
        self.session
            .context()
            .sql("SET datafusion.optimizer.repartition_file_scans = false")
            .await?;
        let state = Arc::new(pages::AppState {
            session: self.session,
            _runner: runner,
            catalog,
            allowed,
            timeout: self.timeout,
            files: files::Files::new(&settings.cache_dir().join("ui-thumbs"))?,
            auth: auth::Auth::new(token.clone(), local),
        });
        Ok(BoundUi {
            listener,
            local,
            token,
            router: router(state),
        })
    }
}

/// A browser listening, not serving yet.
#[derive(Debug)]
pub struct BoundUi {
    listener: TcpListener,
    local: SocketAddr,
    token: Option<String>,
    router: Router,
}

impl BoundUi {
    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The token requests need (`None` on loopback without `--token`).
    pub fn token_required(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// The URL to open: `http://ADDR/`, with `?token=...` when one is needed.
    pub fn url(&self) -> String {
        match &self.token {
            Some(t) => format!("http://{}/?token={}", self.local, render::url_encode_raw(t)),
            None => format!("http://{}/", self.local),
        }
    }

    /// Serves until `shutdown` completes.
    ///
    /// # Cancel safety
    /// Dropping the future stops the server and closes its connections.
    pub async fn run_until(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<()> {
        let local = self.local;
        axum::serve(
            self.listener,
            self.router
                .into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|e| Error::io(format!("ui server on {local}"), e))
    }

    /// Serves until SIGINT or SIGTERM.
    pub async fn run(self) -> Result<()> {
        self.run_until(crate::serve::shutdown_signal()).await
    }
}

fn router(state: Arc<pages::AppState>) -> Router {
    Router::new()
        .route("/", get(pages::datasets))
        .route("/d/{name}/{version}", get(pages::version))
        .route("/d/{name}/{version}/row/{index}", get(pages::version_row))
        .route("/compare", get(pages::compare))
        .route("/query", get(pages::query))
        .route("/query/row", get(pages::query_row))
        .route("/count", get(pages::count))
        .route("/thumb", get(files::thumb))
        .route("/file", get(files::file))
        .route("/static/style.css", get(pages::style))
        .route("/static/app.js", get(pages::script))
        .fallback(pages::not_found)
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            auth::check,
        ))
        .with_state(state)
}
