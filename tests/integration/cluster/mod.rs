//! Distributed runs on Ballista. In-process (`Session::standalone`: a
//! scheduler and an executor in this process): every UDF kind with prefetch
//! on gives the same rows as a local run over the loopback S3 server; a UDF
//! the executor lacks fails at once naming the UDF and the executor; `save`
//! commits the cluster's rows as a dataset on the client. Real processes: a
//! scheduler (`udfchain cluster scheduler`) and two executors (child
//! processes of this test binary with their own UDFs) on 127.0.0.1 give the
//! same rows as local; one executor killed with SIGKILL mid-query, the query
//! still ends (rows or a clear error) in bounded time; the killed executor's
//! prefetch dirs are swept when it restarts; a scheduler that is down is a
//! clear error at once. A query whose stream the client drops is cancelled
//! on the cluster (the executor stops calling the UDF, its slot is free
//! again), in process and with real processes; a failing UDF's error reaches
//! the client as one readable line. `shuffle`, `sample`, `chunk` and
//! `explode` (their `row_hash` and `json_to_struct` functions) give the
//! local rows on the cluster in process, and SQL's `row_hash` with real
//! processes.
//!
//! One file per behaviour (below); the helpers they share are here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::{self, BoxStream, StreamExt};
use serde::{Deserialize, Serialize};
use udfchain::cluster::UdfRegistry;
use udfchain::udfs::UdfError;
use udfchain::{Chain, File, Session, Settings, col, lit};

use udfchain_testkit::{S3Server, write_files};

mod cancel;
mod clear_errors;
mod on_the_client;
mod processes;
mod same_rows;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Meta {
    name: String,
    len: u64,
    first: u8,
}

/// map: the file's name, length and first byte.
async fn meta(f: File) -> Result<Meta, UdfError> {
    let bytes = f.read().await?;
    Ok(Meta {
        name: f.name().to_string(),
        len: bytes.len() as u64,
        first: bytes.first().copied().unwrap_or(0),
    })
}

/// gen: `len % 4` rows per file (0 to 3), each `len * 10 + k`.
fn pieces(f: File) -> BoxStream<'static, Result<u64, UdfError>> {
    stream::once(async move { f.read().await.map(|b| b.len() as u64) })
        .map(|len| match len {
            Ok(n) => stream::iter((0..n % 4).map(move |k| Ok(n * 10 + k))).boxed(),
            Err(e) => stream::iter(vec![Err(e)]).boxed(),
        })
        .flatten()
        .boxed()
}

/// batch_map: the sum of the bytes of each file.
async fn byte_sum(files: Vec<File>) -> Result<Vec<u64>, UdfError> {
    let mut out = Vec::with_capacity(files.len());
    for f in files {
        out.push(f.read().await?.iter().map(|&b| u64::from(b)).sum());
    }
    Ok(out)
}

/// agg: the total length of a group's files.
async fn total(files: Vec<File>) -> Result<Vec<u64>, UdfError> {
    let mut sum = 0;
    for f in files {
        sum += f.read().await?.len() as u64;
    }
    Ok(vec![sum])
}

/// map: the length, after 150 ms (a query long enough to kill an executor in).
async fn slow(f: File) -> Result<u64, UdfError> {
    let n = f.read().await?.len() as u64;
    tokio::time::sleep(Duration::from_millis(150)).await;
    Ok(n)
}

/// gen over values: 0..n.
fn upto(n: u64) -> BoxStream<'static, Result<u64, UdfError>> {
    stream::iter((0..n).map(Ok)).boxed()
}

/// map: the length, failing on files of odd length.
async fn picky(f: File) -> Result<u64, UdfError> {
    let n = f.read().await?.len() as u64;
    if n % 2 == 1 {
        return Err(UdfError::Contract(format!("odd length {n}")));
    }
    Ok(n)
}

/// The UDFs of these tests, as executors register them.
fn registry() -> UdfRegistry {
    UdfRegistry::new()
        .register_map("picky", picky)
        .register_gen("upto", upto)
        .register_map("meta", meta)
        .register_map("slow", slow)
        .register_gen("pieces", pieces)
        .register_batch_map("byte_sum", byte_sum)
        .register_agg("total", total)
        .register_map("counted", counted)
}

/// Files `d{i%3}/f{i}.bin` of 20 + 7i bytes in the S3 server's bucket.
fn server_with_files(n: usize) -> S3Server {
    let server = S3Server::start();
    write_files(&server.bucket_dir().join("data"), n, |i| 20 + 7 * i);
    server
}

/// Every UDF kind over `s3://bucket/data/` in `session`, as sorted text rows.
async fn kinds(session: &Arc<Session>) -> BTreeMap<&'static str, Vec<String>> {
    let on = |c: Chain| c.settings(Settings::new().prefetch(4).parallel(2));
    let src = || on(session.from_storage("s3://bucket/data/"));
    let mut out = BTreeMap::new();
    let rows = |batches: Vec<datafusion::arrow::array::RecordBatch>| {
        let text = datafusion::arrow::util::pretty::pretty_format_batches(&batches)
            .expect("format")
            .to_string();
        let mut lines: Vec<String> = text
            .lines()
            .filter(|l| l.starts_with('|'))
            .skip(1)
            .map(str::to_string)
            .collect();
        lines.sort();
        lines
    };
    let path = || col("file.path").alias("path");
    let map = src()
        .map("meta", meta)
        .select([path(), col("meta")])
        .collect()
        .await
        .expect("map");
    out.insert("map", rows(map));
    let generated = src()
        .r#gen("piece", pieces)
        .select([path(), col("piece")])
        .collect()
        .await
        .expect("gen");
    out.insert("gen", rows(generated));
    let batch = src()
        .settings(Settings::new().batch_size(4))
        .batch_map("sum", byte_sum)
        .select([path(), col("sum")])
        .collect()
        .await
        .expect("batch_map");
    out.insert("batch_map", rows(batch));
    let dir = datafusion::functions::expr_fn::split_part(col("file.path"), lit("/"), lit(1));
    let agg = src()
        .mutate("dir", dir)
        .agg(&["dir"], &["file"], "total", total)
        .collect()
        .await
        .expect("agg");
    out.insert("agg", rows(agg));
    // No keys: one group of every row, above a UDF the cluster spreads.
    let whole = src()
        .map("meta", meta)
        .agg(&[], &["file"], "total", total)
        .collect()
        .await
        .expect("agg of every row");
    out.insert("agg_all", rows(whole));
    out
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

// ---- real processes ----

/// A child process killed (SIGKILL) and reaped when dropped.
struct Child(Option<std::process::Child>);

impl Child {
    /// `udfchain cluster scheduler --bind 127.0.0.1:PORT`.
    fn scheduler(port: u16) -> Self {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_udfchain"));
        cmd.args([
            "cluster",
            "scheduler",
            "--bind",
            &format!("127.0.0.1:{port}"),
        ]);
        Self::spawn(cmd)
    }

    /// The ignored test `cluster::executor_process` of this binary: an
    /// executor with this module's UDFs.
    fn executor(scheduler: u16, work_dir: &Path) -> Self {
        let mut cmd = Command::new(std::env::current_exe().expect("current exe"));
        cmd.args([
            "--exact",
            "cluster::executor_process",
            "--ignored",
            "--nocapture",
        ])
        .env("UDFCHAIN_TEST_SCHEDULER", format!("127.0.0.1:{scheduler}"))
        .env("UDFCHAIN_TEST_WORK_DIR", work_dir)
        .env("UDFCHAIN_TEST_COUNT_FILE", work_dir.with_extension("count"));
        Self::spawn(cmd)
    }

    /// `udfchain cluster executor --slots N --scheduler 127.0.0.1:PORT
    /// --work-dir W`, once it made its work dir.
    async fn cli_executor(port: u16, work: &Path, slots: usize) -> Self {
        let mut exec = Command::new(env!("CARGO_BIN_EXE_udfchain"));
        exec.args(["cluster", "executor", "--slots", &slots.to_string()])
            .arg("--scheduler")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--work-dir")
            .arg(work);
        let child = Self::spawn(exec);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !work.exists() {
            assert!(Instant::now() < deadline, "the executor did not start");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        child
    }

    fn spawn(mut cmd: Command) -> Self {
        cmd.stdout(Stdio::null()).stderr(Stdio::null());
        Self(Some(cmd.spawn().expect("spawn")))
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The body of an executor child process (see [`Child::executor`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a child process of the cluster process tests"]
async fn executor_process() {
    let scheduler = std::env::var("UDFCHAIN_TEST_SCHEDULER").expect("scheduler");
    let work_dir = std::env::var("UDFCHAIN_TEST_WORK_DIR").expect("work dir");
    udfchain::cluster::Executor::builder()
        .registry(registry())
        .scheduler(&scheduler)
        .slots(1)
        .work_dir(work_dir)
        .run()
        .await
        .expect("executor");
}

/// A scheduler and two executors of one slot each on 127.0.0.1.
struct Cluster {
    port: u16,
    _scheduler: Child,
    executors: Vec<Child>,
    work_dirs: Vec<PathBuf>,
    _dir: tempfile::TempDir,
}

impl Cluster {
    async fn start() -> Self {
        let dir = tempfile::tempdir().expect("work dirs");
        let port = free_port();
        let scheduler = Child::scheduler(port);
        let work_dirs: Vec<PathBuf> = (0..2).map(|i| dir.path().join(format!("e{i}"))).collect();
        let executors = work_dirs.iter().map(|w| Child::executor(port, w)).collect();
        let cluster = Self {
            port,
            _scheduler: scheduler,
            executors,
            work_dirs,
            _dir: dir,
        };
        cluster.wait_for_executors(2).await;
        cluster
    }

    fn url(&self) -> String {
        format!("df://127.0.0.1:{}", self.port)
    }

    /// Waits until `n` executors have made their work dirs (they do before
    /// registering) and the scheduler answers, then a little for registration.
    async fn wait_for_executors(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.work_dirs.iter().filter(|w| w.exists()).count() < n {
            assert!(Instant::now() < deadline, "executors did not start");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
}

/// Calls of `counted` in this process.
static COUNTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// map: counts its calls (in [`COUNTED`], and one byte appended to
/// `$UDFCHAIN_TEST_COUNT_FILE` in an executor process), then takes 100 ms.
async fn counted(f: File) -> Result<u64, UdfError> {
    COUNTED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    if let Ok(path) = std::env::var("UDFCHAIN_TEST_COUNT_FILE") {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .expect("count file");
        file.write_all(b".").expect("count");
    }
    let n = f.read().await?.len() as u64;
    tokio::time::sleep(Duration::from_millis(100)).await;
    Ok(n)
}
