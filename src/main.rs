//! The `udfchain` command line: run scripts and queries, list storage, manage
//! datasets and the shared cache. Errors print one line (`--verbose`: the chain
//! of causes) and exit non-zero. Statements that run a plan (queries,
//! `CREATE DATASET`, `EXPLAIN ANALYZE`) show a live progress display on stderr
//! when it is a terminal and `CI` is unset, then a one-line summary on stderr
//! (in pipes too) if they worked on files; `--quiet` turns both off. Standard
//! output only ever gets results.
//! Every command's `--help` ends with examples; no arguments print a start
//! guide (stdout, exit 0).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand, ValueEnum};
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::physical_plan::ExecutionPlan;
use futures::StreamExt;
use udfchain::cache::SharedCache;
use udfchain::progress;
use udfchain::script::{Execution, Output, locate, split};
use udfchain::util::redact::redact;
use udfchain::{Catalog, Error, ScriptRunner, Session, Settings, col};

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
struct Cli {
    /// Root dir for datasets, caches and temp files (default: $UDFCHAIN_ROOT or ./.udfchain).
    #[arg(long, global = true)]
    root: Option<PathBuf>,
    /// A setting, as `SET name = value` would (repeatable), e.g. --set prefetch=8.
    #[arg(long = "set", value_name = "NAME=VALUE", global = true)]
    set: Vec<String>,
    /// Output format of tables.
    #[arg(long, value_enum, default_value_t = Format::Table, global = true)]
    format: Format,
    /// Print the full chain of causes on error.
    #[arg(long, short, global = true)]
    verbose: bool,
    /// No progress display and no summary line.
    #[arg(long, short, global = true)]
    quiet: bool,
    /// Run on the Ballista cluster whose scheduler is at df://HOST:PORT.
    #[arg(long, value_name = "df://HOST:PORT", global = true)]
    cluster: Option<String>,
    /// None: print the start guide.
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Table,
    Csv,
    Json,
    Parquet,
}

#[derive(Subcommand)]
enum Command {
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
        command: DatasetsCommand,
    },
    /// Pipelines: triggers and selection over new data, training sets as datasets.
    #[command(after_help = udfchain::pipeline::cli::EXAMPLES)]
    Pipeline {
        #[command(subcommand)]
        command: udfchain::pipeline::cli::PipelineCommand,
    },
    /// Cluster processes (Apache Ballista): a scheduler and its executors.
    #[command(after_help = "\
Examples:
  udfchain cluster scheduler --bind 127.0.0.1:50050
  udfchain cluster executor --scheduler 127.0.0.1:50050 --slots 2
  udfchain --cluster df://127.0.0.1:50050 run job.sql")]
    Cluster {
        #[command(subcommand)]
        command: udfchain::cluster::cli::ClusterCommand,
    },
    /// Serve datasets to training loops over Arrow Flight (see the README's "Training").
    #[command(after_help = "\
Examples:
  udfchain serve                                listen on 127.0.0.1:50051
  udfchain --root /data/udfchain serve --addr 0.0.0.0:50051
  udfchain serve --addr 127.0.0.1:0             a free port (printed)

Clients call get_flight_info with a JSON command, e.g.
  {\"dataset\": \"images\", \"partition_rows\": 1000, \"shuffle\": true, \"seed\": 7, \"epoch\": 0}
and read its endpoints in order (examples/python/loader.py). SIGINT/SIGTERM stop it.")]
    Serve {
        /// The address to listen on (port 0: a free port).
        #[arg(long, default_value = "127.0.0.1:50051")]
        addr: String,
        /// Partitions read ahead of each client whose request does not say.
        #[arg(long, default_value_t = udfchain::serve::DEFAULT_PREFETCH_PARTITIONS)]
        prefetch_partitions: usize,
        /// Seconds after which an idle client's read-ahead is dropped.
        #[arg(long, default_value_t = udfchain::serve::DEFAULT_READAHEAD_TTL.as_secs())]
        readahead_ttl: u64,
        /// Bytes of partitions held for all clients, read ahead or being sent
        /// (e.g. 512MiB, 2GB); requests over it get RESOURCE_EXHAUSTED.
        #[arg(long, default_value = "1GiB", value_parser = serve_size)]
        memory_limit: usize,
        /// Open streams (get_flight_info calls being read) per server.
        #[arg(long, default_value_t = udfchain::serve::DEFAULT_MAX_STREAMS)]
        max_streams: usize,
        /// Open streams per client IP address.
        #[arg(long, default_value_t = udfchain::serve::DEFAULT_MAX_STREAMS_PER_CLIENT)]
        max_streams_per_client: usize,
    },
    /// The shared cache.
    #[command(after_help = "\
Examples:
  udfchain cache du
  udfchain cache prune --to 10g
  udfchain cache clear")]
    Cache {
        #[command(subcommand)]
        command: CacheCommand,
    },
}

#[derive(Subcommand)]
enum DatasetsCommand {
    /// Every version of every dataset.
    #[command(after_help = "\
Examples:
  udfchain datasets ls
  udfchain datasets ls --format csv")]
    Ls,
    /// One dataset version (default: latest).
    #[command(after_help = "\
Examples:
  udfchain datasets info lines
  udfchain datasets info lines 1")]
    Info {
        /// The dataset's name.
        name: String,
        /// The version (default: latest).
        version: Option<u32>,
    },
    /// Remove one version, or all versions.
    #[command(after_help = "\
Examples:
  udfchain datasets rm lines 1                  version 1 only
  udfchain datasets rm lines                    every version")]
    Rm {
        /// The dataset's name.
        name: String,
        /// The version to remove (default: every version).
        version: Option<u32>,
    },
}

#[derive(Subcommand)]
enum CacheCommand {
    /// Entries and bytes in the cache.
    #[command(after_help = "\
Examples:
  udfchain cache du
  udfchain --root /data/udfchain cache du")]
    Du,
    /// Evict least recently used entries down to SIZE bytes (k/m/g suffixes allowed).
    #[command(after_help = "\
Examples:
  udfchain cache prune --to 10g
  udfchain cache prune --to 0")]
    Prune {
        /// The size to prune down to, in bytes (e.g. 500m, 10g).
        #[arg(long)]
        to: String,
    },
    /// Remove every entry.
    #[command(after_help = "\
Examples:
  udfchain cache clear")]
    Clear,
}

/// What `udfchain` with no command prints: the first commands to try and
/// where their data goes.
fn start_guide(root: &std::path::Path) -> String {
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

/// `println!` that returns an error instead of panicking when standard output
/// is closed (a broken pipe ends the command quietly, see `main`).
macro_rules! outln {
    ($($arg:tt)*) => {
        writeln!(std::io::stdout(), $($arg)*).map_err(|e| Error::Io {
            path: "standard output".into(),
            source: Arc::new(e),
        })?
    };
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.command.is_none() {
        let root = cli
            .root
            .clone()
            .unwrap_or_else(|| Settings::new().get_root());
        // A closed stdout is no error here either.
        let _ = writeln!(std::io::stdout(), "{}", start_guide(&root));
        return ExitCode::SUCCESS;
    }
    let verbose = cli.verbose;
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        // A reader that stopped reading (`udfchain ls ... | head`) is not an error.
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::BrokenPipe => {
            ExitCode::SUCCESS
        }
        Err(e @ Error::Interrupted { .. }) => {
            eprintln!("udfchain: {}", redact(&e.to_string()));
            ExitCode::from(130)
        }
        Err(e) => {
            let mut msg = e.to_string().replace('\n', " ");
            if verbose {
                let mut source = std::error::Error::source(&e);
                while let Some(s) = source {
                    msg.push_str(&format!("\n  caused by: {s}"));
                    source = s.source();
                }
            }
            eprintln!("udfchain: {}", redact(&msg));
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> udfchain::Result<()> {
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
    if let Some(url) = &cli.cluster {
        settings = settings.set("cluster", url)?;
    }
    let session = udfchain::cluster::cli::session(settings.clone()).await?;
    let out = Printer { format: cli.format };
    let Some(command) = cli.command else {
        return Ok(()); // `main` printed the start guide
    };
    match command {
        Command::Run { script } => {
            let script = read_script(&script)?;
            udfchain::cluster::cli::interruptible(
                &settings,
                run_script(&session, &script, &out, false),
            )
            .await
        }
        Command::Query { sql } => {
            udfchain::cluster::cli::interruptible(
                &settings,
                run_script(&session, &sql, &out, false),
            )
            .await
        }
        Command::Explain { script } => {
            run_script(&session, &read_script(&script)?, &out, true).await
        }
        Command::Ls {
            uri,
            non_recursive,
            glob,
        } => {
            let mut chain = session.from_storage(&uri);
            if non_recursive {
                chain = chain.non_recursive();
            }
            if let Some(g) = glob {
                chain = chain.glob(&g);
            }
            let chain = chain
                .select([
                    col("file.path").alias("path"),
                    col("file.size").alias("size"),
                ])
                .order_by([col("path").sort(true, false)]);
            out.print(&chain.collect().await?)
        }
        Command::Du { uri } => {
            use datafusion::functions_aggregate::expr_fn::{count, sum};
            let chain = session.from_storage(&uri).group_by(
                [],
                [
                    count(col("file.size")).alias("files"),
                    sum(col("file.size")).alias("bytes"),
                ],
            );
            out.print(&chain.collect().await?)
        }
        Command::Datasets { command } => {
            let catalog = Catalog::open_async(settings.get_root()).await?;
            match command {
                DatasetsCommand::Ls => {
                    let runner = ScriptRunner::new(session);
                    match runner.run("SHOW DATASETS").await?.pop() {
                        Some(Output::Table(b)) => out.print(&b),
                        _ => Ok(()),
                    }
                }
                DatasetsCommand::Info { name, version } => {
                    let i = catalog.get_async(&name, version).await?;
                    outln!(
                        "name:    {}\nversion: {}\nrows:    {}\nbytes:   {}\npath:    {}\nschema:\n  {}\nquery:\n  {}",
                        i.name,
                        i.version,
                        i.rows,
                        i.bytes,
                        i.path.display(),
                        i.schema.replace('\n', "\n  "),
                        redact(&i.query).replace('\n', "\n  ")
                    );
                    Ok(())
                }
                DatasetsCommand::Rm { name, version } => {
                    let n = catalog.remove_async(&name, version).await?;
                    outln!("removed {n} version(s) of {name}");
                    Ok(())
                }
            }
        }
        Command::Pipeline { command } => {
            udfchain::pipeline::cli::run(command, &session, matches!(out.format, Format::Json))
                .await
        }
        Command::Cluster { command } => udfchain::cluster::cli::run(command, &settings).await,
        Command::Serve {
            addr,
            prefetch_partitions,
            readahead_ttl,
            memory_limit,
            max_streams,
            max_streams_per_client,
        } => {
            udfchain::serve::FlightServer::new(session)
                .prefetch_partitions(prefetch_partitions)
                .readahead_ttl(std::time::Duration::from_secs(readahead_ttl))
                .memory_limit(memory_limit)
                .max_streams(max_streams)
                .max_streams_per_client(max_streams_per_client)
                .serve(&addr, |at| {
                    outln!("listening on grpc://{at}");
                    Ok(())
                })
                .await
        }
        Command::Cache { command } => {
            let cache = SharedCache::open(settings.cache_dir(), None)?;
            match command {
                CacheCommand::Du => {
                    let u = cache.du()?;
                    outln!(
                        "{} entries, {} bytes in {}",
                        u.files,
                        u.bytes,
                        cache.dir().display()
                    );
                }
                CacheCommand::Prune { to } => {
                    let limit = udfchain::chain::parse_size(&to).ok_or_else(|| Error::Setting {
                        name: "--to".into(),
                        value: to.clone(),
                        reason: format!(
                            "must be a size in bytes (e.g. 1048576, 512k, 64m, 2g), got {to:?}"
                        ),
                    })?;
                    let removed = cache.prune_to(limit)?;
                    outln!("removed {} entries, {} bytes", removed.files, removed.bytes);
                }
                CacheCommand::Clear => {
                    cache.clear()?;
                    outln!("cleared {}", cache.dir().display());
                }
            }
            Ok(())
        }
    }
}

/// `--memory-limit`: a byte size such as `512MiB` or `2GB`, at least 1 byte.
fn serve_size(text: &str) -> Result<usize, String> {
    udfchain::chain::parse_size(text)
        .filter(|&n| n > 0)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| format!("{text:?} is not a size such as 512MiB or 2GB"))
}

fn read_script(path: &str) -> udfchain::Result<String> {
    if path == "-" {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).map_err(|e| Error::Io {
            path: "standard input".into(),
            source: Arc::new(e),
        })?;
        return Ok(s);
    }
    std::fs::read_to_string(path).map_err(|e| {
        // A mistyped script name: where it was looked for, and a close name.
        let e = match e.kind() {
            std::io::ErrorKind::NotFound => {
                std::io::Error::new(e.kind(), udfchain::storage::missing_path(path))
            }
            _ => e,
        };
        Error::Io {
            path: path.into(),
            source: Arc::new(e),
        }
    })
}

/// Runs every statement, printing tables and messages as they come.
async fn run_script(
    session: &Arc<Session>,
    script: &str,
    out: &Printer,
    explain: bool,
) -> udfchain::Result<()> {
    let mut runner = ScriptRunner::new(Arc::clone(session));
    for stmt in split(script)? {
        let cluster_set = matches!(&stmt.kind, udfchain::script::Kind::Set { name, .. }
            if name.eq_ignore_ascii_case("cluster"));
        let result = async {
            // `explain`: queries (and the query of a `CREATE DATASET`) are
            // explained, not run or saved; `SET` still applies.
            let execution = if explain {
                runner.explain(&stmt).await?
            } else {
                runner.execute(&stmt).await?
            };
            match execution {
                Execution::Done(Output::Message(m)) => {
                    eprintln!("{}", redact(&m));
                    Ok(())
                }
                Execution::Done(Output::Table(b)) => out.print(&b),
                Execution::Plan { plan, ctx } => {
                    let on = runner.settings().get_progress();
                    let batches = run_with_progress(plan, ctx, on).await?;
                    out.print(&batches)
                }
            }
        }
        .await;
        result.map_err(|e| locate(e, &stmt))?;
        if cluster_set {
            // The statements after `SET cluster = '...'` run there.
            let session = udfchain::cluster::cli::session(runner.settings()).await;
            runner = ScriptRunner::new(session.map_err(|e| locate(e, &stmt))?);
        }
    }
    Ok(())
}

/// Executes a plan; when `on`, shows its progress (on a terminal) and then
/// the summary line on stderr.
async fn run_with_progress(
    plan: Arc<dyn ExecutionPlan>,
    ctx: Arc<datafusion::execution::TaskContext>,
    on: bool,
) -> udfchain::Result<Vec<RecordBatch>> {
    let run = async {
        let mut stream = datafusion::physical_plan::execute_stream(Arc::clone(&plan), ctx)?;
        let mut batches = Vec::new();
        while let Some(batch) = stream.next().await {
            batches.push(batch?);
        }
        Ok::<_, Error>(batches)
    };
    let rows = |b: &Vec<RecordBatch>| b.iter().map(|b| b.num_rows()).sum();
    progress::run(&plan, run, on, |_| {}, rows).await
}

struct Printer {
    format: Format,
}

/// Standard output that keeps the error of a failed write.
struct Stdout {
    inner: std::io::StdoutLock<'static>,
    failed: Option<std::io::Error>,
}

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.inner.write(buf).inspect_err(|e| {
            self.failed = Some(std::io::Error::new(e.kind(), e.to_string()));
        })
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush().inspect_err(|e| {
            self.failed = Some(std::io::Error::new(e.kind(), e.to_string()));
        })
    }
}

impl Printer {
    fn print(&self, batches: &[RecordBatch]) -> udfchain::Result<()> {
        let io_err = |e: std::io::Error| Error::Io {
            path: "standard output".into(),
            source: Arc::new(e),
        };
        let parquet_err = |e: datafusion::parquet::errors::ParquetError| {
            Error::from(datafusion::error::DataFusionError::from(e))
        };
        let mut stdout = Stdout {
            inner: std::io::stdout().lock(),
            failed: None,
        };
        // A writer's error says only "Csv error: ..."; the failed write's own
        // error (a broken pipe) is what `main` needs to see.
        let df_err =
            |e: datafusion::arrow::error::ArrowError, out: &mut Stdout| match out.failed.take() {
                Some(io) => io_err(io),
                None => Error::from(datafusion::error::DataFusionError::from(e)),
            };
        match self.format {
            Format::Table => {
                // Tables are for people: plans and messages in them never echo a secret.
                let text = pretty_format_batches(batches)
                    .map_err(|e| df_err(e, &mut stdout))?
                    .to_string();
                writeln!(stdout.inner, "{}", redact(&text)).map_err(io_err)?;
            }
            Format::Csv => {
                let mut w = datafusion::arrow::csv::Writer::new(&mut stdout);
                for b in batches {
                    if let Err(e) = w.write(b) {
                        drop(w);
                        return Err(df_err(e, &mut stdout));
                    }
                }
            }
            Format::Json => {
                let mut w = datafusion::arrow::json::LineDelimitedWriter::new(&mut stdout);
                let mut result = Ok(());
                for b in batches {
                    result = w.write(b);
                    if result.is_err() {
                        break;
                    }
                }
                let result = result.and_then(|()| w.finish());
                drop(w);
                result.map_err(|e| df_err(e, &mut stdout))?;
            }
            Format::Parquet => {
                let Some(first) = batches.first() else {
                    return Ok(());
                };
                let mut buf = Vec::new();
                let mut w = datafusion::parquet::arrow::ArrowWriter::try_new(
                    &mut buf,
                    first.schema(),
                    None,
                )
                .map_err(parquet_err)?;
                for b in batches {
                    w.write(b).map_err(parquet_err)?;
                }
                w.close().map_err(parquet_err)?;
                stdout.inner.write_all(&buf).map_err(io_err)?;
            }
        }
        Ok(())
    }
}
