//! `udfchain cluster scheduler|executor`, and Ctrl-C for commands that may
//! run on a cluster (`--cluster df://HOST:PORT`, `--set cluster=...`,
//! `SET cluster = '...'`): during `run` or `query` it cancels the running job
//! on the cluster before the CLI exits.

use std::path::PathBuf;
use std::time::Duration;

use clap::Subcommand;
use udfchain::cluster::{Executor, Scheduler, cancels_sent};
use udfchain::{Error, Result, Settings};

/// The cluster's processes.
#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Run a scheduler: it plans jobs and hands their tasks to executors.
    #[command(after_help = "\
Examples:
  udfchain cluster scheduler
  udfchain cluster scheduler --bind 0.0.0.0:50050")]
    Scheduler {
        /// The address to listen on.
        #[arg(long, default_value = "127.0.0.1:50050")]
        bind: String,
    },
    /// Run an executor with the built-in UDFs: it takes tasks from the scheduler.
    #[command(after_help = "\
Examples:
  udfchain cluster executor --scheduler 127.0.0.1:50050
  udfchain cluster executor --scheduler 10.0.0.5:50050 --slots 4 --work-dir /data/exec1
Executors with your own UDFs: build one with udfchain::cluster::Executor::builder().")]
    Executor {
        /// The scheduler's HOST:PORT.
        #[arg(long, default_value = "127.0.0.1:50050")]
        scheduler: String,
        /// Tasks run at once (default: the number of cores).
        #[arg(long)]
        slots: Option<usize>,
        /// Shuffle files, temp caches and the shared cache (default: <root>/executor).
        #[arg(long)]
        work_dir: Option<PathBuf>,
        /// The address other nodes reach this executor at.
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
    },
}

/// Runs a `udfchain cluster` command until the process ends.
pub async fn run(command: ClusterCommand, settings: &Settings) -> Result<()> {
    match command {
        ClusterCommand::Scheduler { bind } => {
            eprintln!("udfchain: scheduler listening on {bind}");
            Scheduler::builder().bind(&bind).run().await
        }
        ClusterCommand::Executor {
            scheduler,
            slots,
            work_dir,
            host,
        } => {
            let mut b = Executor::builder().scheduler(&scheduler).bind_host(&host);
            if let Some(n) = slots {
                b = b.slots(n);
            }
            let dir = work_dir.unwrap_or_else(|| settings.get_root().join("executor"));
            b.work_dir(dir).run().await
        }
    }
}

/// Runs `work`; Ctrl-C drops it instead. A job it was running on a cluster
/// (given by `settings` or by the script's `SET cluster`) is then cancelled,
/// after waiting up to 5 s for the cancel to reach the scheduler; either way
/// the result is [`Error::Interrupted`], naming the cluster whose job was
/// cancelled.
pub async fn interruptible<T>(
    settings: &Settings,
    work: impl Future<Output = Result<T>>,
) -> Result<T> {
    let mut work = Box::pin(work);
    tokio::select! {
        done = &mut work => return done,
        _ = tokio::signal::ctrl_c() => {}
    }
    drop(work);
    let schedulers = cancels_sent(Duration::from_secs(5)).await;
    let cluster = settings
        .get_cluster()
        .map(str::to_string)
        .or_else(|| schedulers.into_iter().next());
    Err(Error::Interrupted { cluster })
}
