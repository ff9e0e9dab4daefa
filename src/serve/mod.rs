//! `udfchain serve`: datasets served to training loops over Arrow Flight, one
//! endpoint per loader partition, with the next partitions each client will ask
//! for fetched ahead (see `flight.rs` for the service, `request.rs` for the JSON
//! request, `ticket.rs` for tickets, `readahead.rs` for the per-client read-ahead,
//! `encode.rs` for a partition's messages, `routes.rs` and `grpc_frames.rs` for
//! how they are sent).
//!
//! Guarantees: [`FlightServer::bind`] listens before it returns (port 0 gets a
//! free port, [`BoundServer::local_addr`] names it); [`BoundServer::run_until`]
//! serves until its shutdown future completes, then stops accepting, lets the
//! partitions being sent finish for at most the shutdown grace, closes every
//! read-ahead stream and returns. [`BoundServer::run`] is `run_until` SIGINT or
//! SIGTERM. Idle read-ahead streams are closed after the TTL by a sweeper that
//! ends with the server. The bytes of partitions held for all clients stay
//! within [`FlightServer::memory_limit`] and open streams within the stream
//! caps ([`ServeLimits`], see `readahead.rs`); that memory is also charged to
//! the session's memory pool (`--set memory_limit=...` bounds it).

mod encode;
mod flight;
mod grpc_frames;
mod readahead;
mod request;
pub(crate) mod routes;
pub(crate) mod ticket;

// The protocol a client meets (the request, its limits, the stats action,
// the default message size) and the server's knobs with their defaults; the
// service, tickets and read-ahead stay inside (tests reach the ticket key and
// the request size cap through `testing`).
pub use flight::{
    FLIGHT_DATA_SIZE, FLIGHT_DATA_SIZE_UNLIMITED_CLIENT, STATS_ACTION, default_message_bytes,
};
pub use readahead::{
    DEFAULT_MAX_STREAMS, DEFAULT_MAX_STREAMS_PER_CLIENT, DEFAULT_MEMORY_LIMIT, READ_AHEAD_SHARE,
    ReadAheadStats, ServeLimits,
};
pub use request::{
    FlightRequest, ImagesRequest, MAX_CONSUMERS, MAX_PARALLEL_REQUESTS, MAX_PARTITION_ROWS,
    MAX_PREFETCH_PARTITIONS, MESSAGE_BYTES_RANGE, RequestError,
};

use flight::LoaderFlightService;
use readahead::ReadAhead;
use ticket::TicketKey;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;

use self::routes::FlightRoutes;
use crate::dataset::Catalog;
use crate::error::{Error, Result};
use crate::session::Session;

/// Partitions read ahead of each client unless its request says otherwise.
pub const DEFAULT_PREFETCH_PARTITIONS: usize = 2;
/// An idle read-ahead stream is closed after this long.
pub const DEFAULT_READAHEAD_TTL: Duration = Duration::from_secs(60);
/// How long a shutdown waits for partitions being sent.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// A Flight server over a session's datasets, before it listens.
#[derive(Debug, Clone)]
#[must_use = "a server does nothing until it is bound and run"]
pub struct FlightServer {
    session: Arc<Session>,
    prefetch_partitions: usize,
    readahead_ttl: Duration,
    shutdown_grace: Duration,
    limits: ServeLimits,
}

impl FlightServer {
    /// Serves the datasets under `session`'s root, loading with its settings.
    pub fn new(session: Arc<Session>) -> Self {
        Self {
            session,
            prefetch_partitions: DEFAULT_PREFETCH_PARTITIONS,
            readahead_ttl: DEFAULT_READAHEAD_TTL,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            limits: ServeLimits::default(),
        }
    }

    /// Bytes of partitions held for all clients, read ahead or being sent
    /// (default [`DEFAULT_MEMORY_LIMIT`]); read-ahead holds at most
    /// [`READ_AHEAD_SHARE`] of it.
    pub fn memory_limit(mut self, bytes: usize) -> Self {
        self.limits.memory_limit = bytes;
        self
    }

    /// Open streams per server (default [`DEFAULT_MAX_STREAMS`]).
    pub fn max_streams(mut self, n: usize) -> Self {
        self.limits.max_streams = n;
        self
    }

    /// Open streams per client IP address (default [`DEFAULT_MAX_STREAMS_PER_CLIENT`]).
    pub fn max_streams_per_client(mut self, n: usize) -> Self {
        self.limits.max_streams_per_client = n;
        self
    }

    /// Partitions read ahead of a client whose request has no `prefetch_partitions`.
    pub fn prefetch_partitions(mut self, k: usize) -> Self {
        self.prefetch_partitions = k;
        self
    }

    /// Idle time after which a client's read-ahead is dropped.
    pub fn readahead_ttl(mut self, ttl: Duration) -> Self {
        self.readahead_ttl = ttl;
        self
    }

    /// How long a shutdown waits for partitions being sent.
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// Listens on `addr`, tells `announce` the address it got, and serves
    /// until SIGINT or SIGTERM (what `udfchain serve` does).
    pub async fn serve(
        self,
        addr: &str,
        announce: impl FnOnce(SocketAddr) -> Result<()>,
    ) -> Result<()> {
        let bound = self.bind(addr).await?;
        announce(bound.local_addr())?;
        bound.run().await
    }

    /// Listens on `addr` (e.g. `127.0.0.1:0`).
    ///
    /// # Cancel safety
    /// Dropping the future drops the listener.
    pub async fn bind(self, addr: &str) -> Result<BoundServer> {
        if self.prefetch_partitions > MAX_PREFETCH_PARTITIONS {
            return Err(Error::Setting {
                name: "--prefetch-partitions".into(),
                value: self.prefetch_partitions.to_string(),
                reason: format!("must be in 0..={MAX_PREFETCH_PARTITIONS}"),
            });
        }
        for (name, value) in [
            ("--memory-limit", self.limits.memory_limit),
            ("--max-streams", self.limits.max_streams),
            (
                "--max-streams-per-client",
                self.limits.max_streams_per_client,
            ),
        ] {
            if value == 0 {
                return Err(Error::Setting {
                    name: name.into(),
                    value: "0".into(),
                    reason: "must be at least 1".into(),
                });
            }
        }
        let listener = TcpListener::bind(addr).await.map_err(|e| Error::Io {
            path: format!("listen address {addr}"),
            source: Arc::new(e),
        })?;
        let local_addr = listener.local_addr().map_err(|e| Error::io(addr, e))?;
        let catalog = Catalog::open(self.session.settings().get_root()).await?;
        let tickets = TicketKey::random().map_err(|e| Error::io("the OS's random source", e))?;
        Ok(BoundServer {
            server: self,
            listener,
            local_addr,
            catalog,
            tickets,
        })
    }
}

/// A server that listens and has not started serving yet.
#[must_use = "a bound server serves only when run"]
pub struct BoundServer {
    server: FlightServer,
    listener: TcpListener,
    local_addr: SocketAddr,
    catalog: Catalog,
    tickets: TicketKey,
}

impl BoundServer {
    /// The address it listens on (the real port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Serves until SIGINT or SIGTERM, then shuts down gracefully.
    pub async fn run(self) -> Result<()> {
        self.run_until(shutdown_signal()).await
    }

    /// Serves until `shutdown` completes, then stops accepting connections,
    /// waits for the partitions being sent for at most the shutdown grace and
    /// drops every read-ahead stream.
    ///
    /// # Cancel safety
    /// Dropping the future stops the server at once (connections are closed,
    /// read-ahead fetches aborted).
    pub async fn run_until(self, shutdown: impl Future<Output = ()> + Send) -> Result<()> {
        let Self {
            server,
            listener,
            local_addr,
            catalog,
            tickets,
        } = self;
        let readahead = ReadAhead::new(server.readahead_ttl, server.limits);
        let sweeper = {
            let readahead = Arc::clone(&readahead);
            let every = (server.readahead_ttl / 4).max(Duration::from_millis(50));
            crate::runtime::spawn(async move {
                loop {
                    tokio::time::sleep(every).await;
                    readahead.expire();
                }
            })
        };
        let service = LoaderFlightService::new(
            Arc::clone(&server.session),
            catalog,
            tickets,
            Arc::clone(&readahead),
            server.prefetch_partitions,
        );
        let (stopping_tx, stopping_rx) = tokio::sync::oneshot::channel::<()>();
        let signal = async move {
            shutdown.await;
            let _ = stopping_tx.send(());
        };
        let serve = tonic::transport::Server::builder()
            .add_service(FlightRoutes::new(service))
            .serve_with_incoming_shutdown(
                // No Nagle: the last segment of each partition goes out at
                // once instead of waiting for the client's delayed ACK.
                TcpIncoming::from(listener).with_nodelay(Some(true)),
                signal,
            );
        let grace = server.shutdown_grace;
        let result = tokio::select! {
            r = serve => r.map_err(|e| Error::Io {
                path: format!("flight server at {local_addr}"),
                source: Arc::new(std::io::Error::other(e)),
            }),
            () = async move {
                if stopping_rx.await.is_ok() {
                    tokio::time::sleep(grace).await;
                } else {
                    std::future::pending::<()>().await;
                }
            } => Ok(()),
        };
        drop(sweeper);
        readahead.close_all();
        result
    }
}

/// Completes on SIGINT (Ctrl-C) or, on Unix, SIGTERM.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
