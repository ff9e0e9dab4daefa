//! `udfchain ui`: the read-only dataset browser (`udfchain::ui`) over the
//! root, until SIGINT/SIGTERM. Prints `udfchain ui: open URL` once bound
//! (with the token when one is needed); opens no browser itself.

use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use udfchain::Session;
use udfchain::ui::{DEFAULT_BIND, UiServer};

use crate::cli::print;

#[derive(Args)]
pub struct UiArgs {
    /// The address to listen on (port 0: a free port). Any address other
    /// than loopback needs a token: --token, or a random one printed.
    #[arg(long, default_value = DEFAULT_BIND)]
    bind: String,
    /// The token every request must carry (?token=, then a cookie).
    #[arg(long)]
    token: Option<String>,
    /// A local dir queries may read besides the root (repeatable).
    #[arg(long, value_name = "DIR")]
    allow: Vec<std::path::PathBuf>,
    /// Seconds one query of a page may run.
    #[arg(long, default_value_t = udfchain::ui::DEFAULT_QUERY_TIMEOUT.as_secs())]
    query_timeout: u64,
}

/// Serves until a signal stops the server.
pub async fn run(args: UiArgs, session: Arc<Session>) -> udfchain::Result<()> {
    let mut server = UiServer::new(session)
        .token(args.token)
        .query_timeout(Duration::from_secs(args.query_timeout.max(1)));
    for dir in args.allow {
        server = server.allow_dir(dir);
    }
    let bound = server.bind(&args.bind).await?;
    print::line(format_args!("udfchain ui: open {}", bound.url()))?;
    bound.run().await
}
