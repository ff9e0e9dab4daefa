//! The `udfchain` command line, compiled into the binary only: the clap
//! types of every command and their dispatch. One file per command group
//! (`script` run/query/explain, `ls` ls and du, `datasets`, `export`, `pipeline`,
//! `cluster`, `serve`, `cache`, `ui`); everything written to standard output goes
//! through `print`. It uses the library's public API (and its
//! `#[doc(hidden)]` testing module for what only the CLI needs); nothing in
//! the library imports it.

mod cache;
mod cluster;
mod datasets;
mod export;
mod ls;
mod pipeline;
pub mod print;
mod script;
mod serve;
mod ui;

use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand};
use udfchain::{Error, Session, Settings};

use print::{Format, Printer};

/// Examples at the end of `udfchain --help`.
const EXAMPLES: &str = "\
Examples:
  udfchain run job.sql                          run a script (SET, CREATE DATASET, SELECT ...)
  udfchain query \"SELECT file.path, sha256(file) FROM read_storage('data/')\"
  udfchain ls s3://bucket/images/ --glob '**/*.jpg'
  udfchain datasets ls                          datasets saved under the root
  udfchain --set prefetch=16 run job.sql        a setting, as SET prefetch = 16 would";

#[derive(Parser)]
#[command(
    name = "udfchain",
    version,
    about = "Chains of user functions over files in object storage",
    after_help = EXAMPLES
)]
pub struct Cli {
    /// Root dir for datasets, caches and temp files (default: $UDFCHAIN_ROOT or ./.udfchain).
    #[arg(long, global = true)]
    pub root: Option<PathBuf>,
    /// A setting, as `SET name = value` would (repeatable), e.g. --set prefetch=8.
    #[arg(long = "set", value_name = "NAME=VALUE", global = true)]
    set: Vec<String>,
    /// Saves start from nothing: what earlier runs of the same save kept in
    /// their checkpoint is discarded (as --set checkpoints=fresh).
    #[arg(long, global = true)]
    fresh: bool,
    /// Output format of tables.
    #[arg(long, value_enum, default_value_t = Format::Table, global = true)]
    format: Format,
    /// Print the full chain of causes on error.
    #[arg(long, short, global = true)]
    pub verbose: bool,
    /// No progress display and no summary line.
    #[arg(long, short, global = true)]
    quiet: bool,
    /// Run on the Ballista cluster whose scheduler is at df://HOST:PORT.
    #[arg(long, value_name = "df://HOST:PORT", global = true)]
    cluster: Option<String>,
    /// None: print the start guide.
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run a script file (`-` for standard input).
    #[command(after_help = "\
Examples:
  udfchain run job.sql
  udfchain run - < job.sql
  udfchain run job.sql --format csv > out.csv

A script holds statements separated by ';', e.g.
  SET prefetch = 16;
  CREATE DATASET lines AS SELECT file.path, line_count(file) AS n FROM read_storage('data/');
  SELECT sum(n) FROM read_dataset('lines');")]
    Run {
        /// The script file, or `-` for standard input.
        script: String,
    },
    /// Run one SQL statement.
    #[command(after_help = "\
Examples:
  udfchain query \"SELECT file.path, file.size FROM read_storage('data/') LIMIT 10\"
  udfchain query \"SELECT sha256(file) AS h FROM read_storage('s3://bucket/imgs/')\" --format json
  udfchain query \"SELECT count(*) FROM read_dataset('lines')\"")]
    Query {
        /// One SQL statement (quote it for the shell).
        sql: String,
    },
    /// Print the plan of each query of a script.
    #[command(after_help = "\
Examples:
  udfchain explain job.sql
  udfchain --set prefetch=0 explain job.sql     the plan without prefetching")]
    Explain {
        /// The script file, or `-` for standard input.
        script: String,
    },
    /// List the objects under a URI.
    #[command(after_help = "\
Examples:
  udfchain ls data/
  udfchain ls s3://bucket/images/ --glob '**/*.jpg' --format csv
  udfchain ls s3://bucket/ --non-recursive
  udfchain --set storage.endpoint=http://127.0.0.1:9000 ls s3://bucket/")]
    Ls {
        /// A local dir, or s3://, gs://, az://, http(s)://, file://, memory:// URI.
        uri: String,
        /// Only the objects directly under the URI.
        #[arg(long)]
        non_recursive: bool,
        /// Only paths (relative to the URI) matching this pattern, e.g. '**/*.jpg'.
        #[arg(long)]
        glob: Option<String>,
    },
    /// Count the objects and bytes under a URI.
    #[command(after_help = "\
Examples:
  udfchain du data/
  udfchain du s3://bucket/images/")]
    Du {
        /// A local dir, or s3://, gs://, az://, http(s)://, file://, memory:// URI.
        uri: String,
    },
    /// Datasets in the catalog.
    #[command(after_help = "\
Examples:
  udfchain datasets ls
  udfchain datasets info lines
  udfchain datasets rm lines 2")]
    Datasets {
        #[command(subcommand)]
        command: datasets::DatasetsCommand,
    },
    /// Write the files of a query's File column below a dir or store URI (to_storage).
    #[command(after_help = "\
Examples:
  udfchain export \"SELECT file FROM read_storage('s3://bucket/imgs/') WHERE file.size > 0\" out/
  udfchain export \"SELECT file FROM read_dataset('picked')\" s3://bucket/picked/ --placement filename
  udfchain export \"SELECT file FROM read_storage('data/')\" links/ --link-type symlink

Files appear complete or not at all; a rerun skips files already written.")]
    Export(export::ExportArgs),
    /// Pipelines: triggers and selection over new data, training sets as datasets.
    #[command(after_help = pipeline::EXAMPLES)]
    Pipeline {
        #[command(subcommand)]
        command: pipeline::PipelineCommand,
    },
    /// Cluster processes (Apache Ballista): a scheduler and its executors.
    #[command(after_help = "\
Examples:
  udfchain cluster scheduler --bind 127.0.0.1:50050
  udfchain cluster executor --scheduler 127.0.0.1:50050 --slots 2
  udfchain --cluster df://127.0.0.1:50050 run job.sql")]
    Cluster {
        #[command(subcommand)]
        command: cluster::ClusterCommand,
    },
    /// Serve datasets to training loops over Arrow Flight (see docs/training.md).
    #[command(after_help = "\
Examples:
  udfchain serve                                listen on 127.0.0.1:50051
  udfchain --root /data/udfchain serve --addr 0.0.0.0:50051
  udfchain serve --addr 127.0.0.1:0             a free port (printed)

Clients call get_flight_info with a JSON command, e.g.
  {\"dataset\": \"images\", \"partition_rows\": 1000, \"shuffle\": true, \"seed\": 7, \"epoch\": 0}
and read its endpoints in order (examples/python/loader.py). SIGINT/SIGTERM stop it.")]
    Serve(serve::ServeArgs),
    /// Browse the datasets in a web browser (read-only; see docs/ui.md).
    #[command(after_help = "\
Examples:
  udfchain ui                                   http://127.0.0.1:8765/ (printed)
  udfchain --root /data/udfchain ui --bind 127.0.0.1:0
  udfchain ui --bind 0.0.0.0:8765 --token SECRET  another address needs a token
  udfchain ui --allow ./data                    queries may also read ./data")]
    Ui(ui::UiArgs),
    /// The shared cache.
    #[command(after_help = "\
Examples:
  udfchain cache du
  udfchain cache prune --to 10g
  udfchain cache clear")]
    Cache {
        #[command(subcommand)]
        command: cache::CacheCommand,
    },
}

/// What `udfchain` with no command prints: the first commands to try and
/// where their data goes.
pub fn start_guide(root: &Path) -> String {
    let root = std::path::absolute(root).unwrap_or_else(|_| root.to_path_buf());
    format!(
        "udfchain runs chains of user functions over files in object storage.

Start with:
  udfchain query \"SELECT file.path, file.size FROM read_storage('data/') LIMIT 10\"
                                   query a dir (or s3://bucket/prefix/, gs://, az://, http(s)://)
  udfchain ls data/                list the files of a dir
  udfchain run job.sql             run a script (SET, CREATE DATASET ... AS SELECT, SELECT)
  udfchain datasets ls             list the saved datasets
  udfchain --help                  every command; `udfchain COMMAND --help` shows examples

Root (datasets, shared cache, temp files): {}
  (set it with --root DIR or UDFCHAIN_ROOT)
S3 credentials: --set storage.access_key_id=... --set storage.secret_access_key=...
  or AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY; another endpoint: --set storage.endpoint=URL",
        root.display()
    )
}

/// Runs the parsed command line.
pub async fn run(cli: Cli) -> udfchain::Result<()> {
    // Progress on unless --quiet (a script's `SET progress = off` still wins).
    let mut settings = Settings::new().progress(!cli.quiet);
    if let Some(root) = &cli.root {
        settings = settings.root(root);
    }
    for kv in &cli.set {
        let (k, v) = kv.split_once('=').ok_or_else(|| Error::Setting {
            name: "--set".into(),
            value: kv.clone(),
            reason: format!("takes NAME=VALUE, got {kv:?}"),
        })?;
        settings = settings.set(k.trim(), v)?;
    }
    if cli.fresh {
        settings = settings.fresh_checkpoints();
    }
    if let Some(url) = &cli.cluster {
        settings = settings.set("cluster", url)?;
    }
    let session = Session::connect(settings.clone()).await?;
    let out = Printer { format: cli.format };
    let Some(command) = cli.command else {
        return Ok(()); // `main` printed the start guide
    };
    match command {
        Command::Run { script } => {
            let script = script::read_script(&script)?;
            cluster::interruptible(
                &settings,
                script::run_script(&session, &script, &out, false),
            )
            .await
        }
        Command::Query { sql } => {
            cluster::interruptible(&settings, script::run_script(&session, &sql, &out, false)).await
        }
        Command::Explain { script } => {
            script::run_script(&session, &script::read_script(&script)?, &out, true).await
        }
        Command::Ls {
            uri,
            non_recursive,
            glob,
        } => ls::ls(&session, &out, &uri, non_recursive, glob).await,
        Command::Du { uri } => ls::du(&session, &out, &uri).await,
        Command::Datasets { command } => datasets::run(command, session, &settings, &out).await,
        Command::Export(args) => {
            cluster::interruptible(&settings, export::run(args, session, &out)).await
        }
        Command::Pipeline { command } => {
            pipeline::run(command, &session, matches!(out.format, Format::Json)).await
        }
        Command::Cluster { command } => cluster::run(command, &settings).await,
        Command::Serve(args) => serve::run(args, session).await,
        Command::Ui(args) => ui::run(args, session).await,
        Command::Cache { command } => cache::run(command, &settings),
    }
}
