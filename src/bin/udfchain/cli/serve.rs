//! `udfchain serve`: the Arrow Flight server over the datasets under the
//! root, until SIGINT/SIGTERM. Prints `listening on grpc://ADDR` once bound.

use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use udfchain::Session;
use udfchain::serve::{
    DEFAULT_MAX_STREAMS, DEFAULT_MAX_STREAMS_PER_CLIENT, DEFAULT_PREFETCH_PARTITIONS,
    DEFAULT_READAHEAD_TTL, FlightServer,
};

use crate::cli::print;

#[derive(Args)]
pub struct ServeArgs {
    /// The address to listen on (port 0: a free port).
    #[arg(long, default_value = "127.0.0.1:50051")]
    addr: String,
    /// Partitions read ahead of each client whose request does not say.
    #[arg(long, default_value_t = DEFAULT_PREFETCH_PARTITIONS)]
    prefetch_partitions: usize,
    /// Seconds after which an idle client's read-ahead is dropped.
    #[arg(long, default_value_t = DEFAULT_READAHEAD_TTL.as_secs())]
    readahead_ttl: u64,
    /// Bytes of partitions held for all clients, read ahead or being sent
    /// (e.g. 512MiB, 2GB); requests over it get RESOURCE_EXHAUSTED.
    #[arg(long, default_value = "1GiB", value_parser = serve_size)]
    memory_limit: usize,
    /// Open streams (get_flight_info calls being read) per server.
    #[arg(long, default_value_t = DEFAULT_MAX_STREAMS)]
    max_streams: usize,
    /// Open streams per client IP address.
    #[arg(long, default_value_t = DEFAULT_MAX_STREAMS_PER_CLIENT)]
    max_streams_per_client: usize,
}

/// Serves until a signal stops the server.
pub async fn run(args: ServeArgs, session: Arc<Session>) -> udfchain::Result<()> {
    FlightServer::new(session)
        .prefetch_partitions(args.prefetch_partitions)
        .readahead_ttl(Duration::from_secs(args.readahead_ttl))
        .memory_limit(args.memory_limit)
        .max_streams(args.max_streams)
        .max_streams_per_client(args.max_streams_per_client)
        .serve(&args.addr, |at| {
            print::line(format_args!("listening on grpc://{at}"))
        })
        .await
}

/// `--memory-limit`: a byte size such as `512MiB` or `2GB`, at least 1 byte.
fn serve_size(text: &str) -> Result<usize, String> {
    udfchain::testing::parse_size(text)
        .filter(|&n| n > 0)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| format!("{text:?} is not a size such as 512MiB or 2GB"))
}
