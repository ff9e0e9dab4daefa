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

use udfchain_testkit::{S3Server, prefetch_dirs, write_files};

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
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_udf_kind_with_prefetch_gives_the_local_rows_in_process() {
    let server = server_with_files(24);
    let local = kinds(&server.session()).await;
    assert_eq!(local["map"].len(), 24);
    assert_eq!(local["agg"].len(), 3);
    assert!(local["gen"].len() > 10, "{:?}", local["gen"]);
    let cluster = Session::standalone(server.settings().workers(2), registry(), 2)
        .await
        .expect("standalone cluster");
    let remote = tokio::time::timeout(Duration::from_secs(240), kinds(&cluster))
        .await
        .expect("the cluster runs finish");
    for kind in ["map", "gen", "batch_map", "agg"] {
        assert_eq!(remote[kind], local[kind], "{kind}: cluster rows differ");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_error_travels_with_the_udf() {
    let server = server_with_files(12);
    let cluster = Session::standalone(server.settings().workers(2), registry(), 2)
        .await
        .expect("standalone cluster");
    let run = |session: &Arc<Session>, on_error: udfchain::OnError| {
        session
            .from_storage("s3://bucket/data/")
            .settings(Settings::new().on_error(on_error).prefetch(2))
            .map("n", picky)
            .select([col("file.path").alias("path"), col("n")])
            .order_by([col("path").sort(true, false)])
    };
    let text = |b: Vec<datafusion::arrow::array::RecordBatch>| {
        datafusion::arrow::util::pretty::pretty_format_batches(&b)
            .expect("format")
            .to_string()
    };
    for on_error in [udfchain::OnError::Skip, udfchain::OnError::Null] {
        let local = text(
            run(&server.session(), on_error)
                .collect()
                .await
                .expect("local"),
        );
        let remote = text(run(&cluster, on_error).collect().await.expect("cluster"));
        assert_eq!(remote, local, "{on_error:?}");
    }
    let err = run(&cluster, udfchain::OnError::Fail)
        .collect()
        .await
        .expect_err("fail");
    // The executor's one line reaches the client: the UDF, the file, the row
    // and the cause are all in it.
    let text = err.to_string();
    for part in ["picky", "s3://bucket/data/", "row", "odd length"] {
        assert!(text.contains(part), "{part}: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_values_travel_to_the_cluster() {
    #[derive(Serialize, Deserialize)]
    struct N {
        n: u64,
    }
    let values = [N { n: 3 }, N { n: 0 }, N { n: 1000 }, N { n: 2 }];
    let cluster = Session::standalone(Settings::new().workers(2), registry(), 2)
        .await
        .expect("standalone cluster");
    let run = |session: Arc<Session>| {
        Chain::from_values_in(session, &values)
            .settings(Settings::new().batch_size(64))
            .gen_on(&["n"], "i", upto)
            .group_by(
                [col("n")],
                [datafusion::functions_aggregate::expr_fn::sum(col("i"))],
            )
            .order_by([col("n").sort(true, false)])
    };
    let text = |b: Vec<datafusion::arrow::array::RecordBatch>| {
        datafusion::arrow::util::pretty::pretty_format_batches(&b)
            .expect("format")
            .to_string()
    };
    let remote = text(run(cluster).collect().await.expect("cluster"));
    let local = text(run(Session::new()).collect().await.expect("local"));
    assert_eq!(remote, local);
    assert!(local.contains("499500"), "{local}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_udf_the_executor_lacks_fails_at_once_naming_it_and_the_executor() {
    let server = server_with_files(4);
    let lacking = UdfRegistry::new().register_map("other", meta);
    let cluster = Session::standalone(server.settings(), lacking, 1)
        .await
        .expect("standalone cluster");
    let started = Instant::now();
    let chain = cluster.from_storage("s3://bucket/data/").map("meta", meta);
    let run = chain.collect();
    let err = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("no hang")
        .expect_err("the executor has no UDF meta");
    let text = err.to_string();
    assert!(text.contains("UDF meta"), "{text}");
    assert!(text.contains("standalone executor"), "{text}");
    assert!(text.contains("other"), "names what it has: {text}");
    assert!(started.elapsed() < Duration::from_secs(60));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn save_on_a_cluster_commits_one_version_on_the_client() {
    let server = server_with_files(9);
    let root = tempfile::tempdir().expect("root");
    let settings = server.settings().root(root.path()).workers(2);
    let cluster = Session::standalone(settings.clone(), registry(), 2)
        .await
        .expect("standalone cluster");
    let info = cluster
        .from_storage("s3://bucket/data/")
        .map("meta", meta)
        .select([col("file.path").alias("path"), col("meta")])
        .save("metas")
        .await
        .expect("save");
    assert_eq!((info.version, info.rows), (1, 9));
    #[derive(Deserialize)]
    struct Row {
        path: String,
        meta: Meta,
    }
    let local = Session::with_settings(settings);
    let mut rows: Vec<Row> = local
        .from_dataset("metas")
        .to_rows()
        .await
        .expect("read back");
    rows.sort_by(|a, b| a.path.cmp(&b.path));
    assert_eq!(rows.len(), 9);
    assert_eq!(rows[0].path, "d0/f0000.bin");
    assert_eq!(rows[0].meta.len, 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduler_that_is_down_is_a_clear_error_at_once() {
    let port = free_port();
    let started = Instant::now();
    let err = Session::remote(&format!("df://127.0.0.1:{port}"), Settings::new())
        .await
        .expect_err("nothing listens there");
    let text = err.to_string();
    assert!(text.contains("cannot connect to the scheduler"), "{text}");
    assert!(text.contains(&port.to_string()), "{text}");
    assert!(started.elapsed() <= udfchain::cluster::CONNECT_TIMEOUT + Duration::from_secs(1));
    let bad = Session::remote("df://no-port", Settings::new())
        .await
        .expect_err("no port");
    assert!(bad.to_string().contains("df://HOST:PORT"), "{bad}");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduler_and_two_executor_processes_give_the_local_rows() {
    let server = server_with_files(24);
    let local = kinds(&server.session()).await;
    let cluster = Cluster::start().await;
    let session = Session::remote(&cluster.url(), server.settings().workers(2))
        .await
        .expect("connect");
    let remote = tokio::time::timeout(Duration::from_secs(300), kinds(&session))
        .await
        .expect("the cluster runs finish");
    for kind in ["map", "gen", "batch_map", "agg"] {
        assert_eq!(remote[kind], local[kind], "{kind}: cluster rows differ");
    }
    // workers = 2 spread a UDF's partitions over both executors: some job
    // ran a task on each (a task writes its shuffle output below `<work
    // dir>/<job id>/`; Ballista deletes the files of stages already read, the
    // job's dir stays until its data is cleaned up).
    let jobs = |w: &PathBuf| -> std::collections::BTreeSet<std::ffi::OsString> {
        std::fs::read_dir(w)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.path().is_dir())
                    .map(|e| e.file_name())
                    .filter(|n| n != "udfchain" && !n.to_string_lossy().starts_with("datafusion-"))
                    .collect()
            })
            .unwrap_or_default()
    };
    let (a, b) = (jobs(&cluster.work_dirs[0]), jobs(&cluster.work_dirs[1]));
    assert!(
        a.intersection(&b).next().is_some(),
        "no job ran on both: {a:?} {b:?}"
    );
}

/// `slow` over `s3://bucket/data/` in `session`, as sorted (path, length).
async fn slow_rows(session: &Arc<Session>) -> udfchain::Result<Vec<(String, u64)>> {
    #[derive(Deserialize)]
    struct R {
        path: String,
        n: u64,
    }
    let mut rows: Vec<(String, u64)> = session
        .from_storage("s3://bucket/data/")
        .settings(Settings::new().prefetch(2).parallel(1).memory_file_limit(0))
        .map("n", slow)
        .select([col("file.path").alias("path"), col("n")])
        .to_rows::<R>()
        .await?
        .into_iter()
        .map(|r| (r.path, r.n))
        .collect();
    rows.sort();
    Ok(rows)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_executor_killed_mid_query_ends_the_query_in_bounded_time_and_is_swept_on_restart() {
    let server = server_with_files(40);
    let mut cluster = Cluster::start().await;
    let session = Session::remote(&cluster.url(), server.settings().workers(2))
        .await
        .expect("connect");
    let query = tokio::spawn({
        let session = Arc::clone(&session);
        async move { slow_rows(&session).await }
    });
    // Mid-query: an executor has a prefetch dir (files of its running task)
    // with its owner lock. A dir killed between its mkdir and its lock file is
    // swept only once 60 s old (owner::GRACE), so those are not waited for.
    let roots: Vec<PathBuf> = cluster
        .work_dirs
        .iter()
        .map(|w| w.join("udfchain"))
        .collect();
    let locked = |root: &PathBuf| -> Vec<PathBuf> {
        prefetch_dirs(root)
            .into_iter()
            .filter(|d| d.join(".owner.lock").exists())
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let victim = loop {
        if let Some(i) = roots.iter().position(|r| !locked(r).is_empty()) {
            break i;
        }
        assert!(Instant::now() < deadline, "no executor started a task");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    cluster.executors[victim].kill();
    let killed_at = Instant::now();
    let left = locked(&roots[victim]);
    assert!(!left.is_empty(), "SIGKILL leaves the task's prefetch dir");
    // Bound: the scheduler declares it dead after EXECUTOR_TIMEOUT and runs
    // its tasks on the other executor; either way the query ends.
    let outcome = tokio::time::timeout(Duration::from_secs(120), query)
        .await
        .expect("the query ends after the kill, no hang")
        .expect("join");
    let took = killed_at.elapsed();
    eprintln!(
        "query ended {took:?} after the kill: {:?}",
        outcome.as_ref().map(|r| r.len())
    );
    // EXECUTOR_TIMEOUT + EXPIRE_CHECK to notice, then the lost tasks again.
    assert!(
        took < Duration::from_secs(90),
        "ended {took:?} after the kill"
    );
    match outcome {
        Ok(rows) => {
            let local = slow_rows(&server.session()).await.expect("local");
            assert_eq!(rows, local, "Ballista's retry gives every row once");
        }
        Err(e) => {
            let text = e.to_string();
            assert!(!text.is_empty(), "a clear error");
        }
    }
    // Restarted on the same work dir, the executor sweeps what the killed one left.
    cluster.executors[victim] = Child::executor(cluster.port, &cluster.work_dirs[victim]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while left.iter().any(|d| d.exists()) {
        assert!(
            Instant::now() < deadline,
            "orphan prefetch dirs not swept: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs the `udfchain` binary with `args` (and `stdin`), at most 120 s.
async fn cli(args: Vec<String>, stdin: Option<String>) -> std::process::Output {
    let run = tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut child = Command::new(env!("CARGO_BIN_EXE_udfchain"))
            .args(&args)
            .env("CI", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn udfchain");
        if let Some(text) = stdin {
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(text.as_bytes())
                .expect("write stdin");
        }
        child.wait_with_output().expect("udfchain output")
    });
    tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("udfchain ends")
        .expect("join")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_runs_queries_and_scripts_on_a_cluster_of_cli_processes() {
    let dir = tempfile::tempdir().expect("dir");
    let data = dir.path().join("data");
    write_files(&data, 6, |i| 10 + i);
    let root = dir.path().join("root");
    let port = free_port();
    let _scheduler = Child::scheduler(port);
    let work = dir.path().join("exec");
    let _executor = Child::cli_executor(port, &work, 2).await;
    let url = format!("df://127.0.0.1:{port}");
    let base = |extra: &[&str]| {
        let mut a: Vec<String> = vec!["--root".into(), root.display().to_string()];
        a.extend(["--format".into(), "csv".into()]);
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let sql = format!(
        "SELECT file.path AS path, sha256(file) AS h FROM read_storage('{}') ORDER BY path",
        data.display()
    );
    let local = cli(base(&["query", &sql]), None).await;
    let remote = cli(base(&["--cluster", &url, "query", &sql]), None).await;
    assert!(
        remote.status.success(),
        "{}",
        String::from_utf8_lossy(&remote.stderr)
    );
    let local = String::from_utf8_lossy(&local.stdout).to_string();
    assert_eq!(local.lines().count(), 7, "{local}");
    assert_eq!(String::from_utf8_lossy(&remote.stdout), local);

    // row_hash (SQL's shuffle / chunk) travels in the plan to real processes.
    let sql = format!(
        "SELECT file.path AS path, row_hash(3, file.path) % 2 AS half FROM read_storage('{}') \
         ORDER BY row_hash(3, file.path)",
        data.display()
    );
    let local = cli(base(&["query", &sql]), None).await;
    let remote = cli(base(&["--cluster", &url, "query", &sql]), None).await;
    assert!(
        remote.status.success(),
        "{}",
        String::from_utf8_lossy(&remote.stderr)
    );
    let local = String::from_utf8_lossy(&local.stdout).to_string();
    assert_eq!(local.lines().count(), 7, "{local}");
    assert_eq!(String::from_utf8_lossy(&remote.stdout), local);

    // A script switching to the cluster, saving a dataset there (committed here).
    let script = format!(
        "SET cluster = '{url}';\nSET workers = 2;\n\
         CREATE DATASET hashes AS SELECT file.path AS path, sha256(file) AS h FROM read_storage('{}');\n\
         SELECT count(*) AS n FROM read_dataset('hashes');",
        data.display()
    );
    let out = cli(base(&["run", "-"]), Some(script)).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("saved dataset hashes version 1 (6 rows)"),
        "{stderr}"
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "n\n6");

    // A scheduler that is down: a one-line error, soon.
    let started = Instant::now();
    let down = format!("df://127.0.0.1:{}", free_port());
    let out = cli(base(&["--cluster", &down, "query", "SELECT 1"]), None).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("cannot connect to the scheduler"),
        "{stderr}"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
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

/// `counted` over `s3://bucket/data/` in `session`, on one partition.
fn counted_chain(session: &Arc<Session>) -> Chain {
    session
        .from_storage("s3://bucket/data/")
        .settings(Settings::new().prefetch(2).parallel(1))
        .map("n", counted)
}

/// Runs the 60-file `counted` chain for 1.5 s, drops it, and returns the
/// call counts (by `count`) 1.5 s and 3.5 s after the drop.
async fn drop_after_a_while(session: &Arc<Session>, count: impl Fn() -> usize) -> (usize, usize) {
    let run = tokio::time::timeout(
        Duration::from_millis(1500),
        counted_chain(session).collect(),
    )
    .await;
    assert!(run.is_err(), "the query takes ~6 s, it cannot end in 1.5 s");
    calls_after_the_drop(&count).await
}

/// After a cancel the executor's one slot is free: a 3-file query (on a
/// prefix of its own) is done well before the cancelled job would have been.
async fn the_slot_is_free(session: &Arc<Session>) {
    let started = Instant::now();
    let rows = session
        .from_storage("s3://bucket/few/")
        .settings(Settings::new().prefetch(2))
        .map("n", counted)
        .collect()
        .await
        .expect("a query after the cancel");
    assert_eq!(rows.iter().map(|b| b.num_rows()).sum::<usize>(), 3);
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "waited for the cancelled job: {:?}",
        started.elapsed()
    );
}

/// A client that drops a query's stream before its end (a timeout around
/// `collect`) has the job cancelled on the cluster: the executor stops
/// calling the UDF well before the 60 files are done, and its one slot is
/// free for the next query. Without the cancel the job runs to its end
/// (~6 s, the count growing after the drop).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_query_is_cancelled_on_the_cluster() {
    let server = server_with_files(60);
    write_files(&server.bucket_dir().join("few"), 3, |i| 10 + i);
    let cluster = Session::standalone(
        server.settings().workers(1),
        UdfRegistry::new().register_map("counted", counted),
        1,
    )
    .await
    .expect("standalone cluster");
    let count = || COUNTED.load(std::sync::atomic::Ordering::SeqCst);
    let (after_cancel, later) = drop_after_a_while(&cluster, count).await;
    assert!(after_cancel > 0, "the job started");
    assert_eq!(later, after_cancel, "calls went on after the cancel");
    assert!(later < 60, "the whole job ran: {later} calls");
    the_slot_is_free(&cluster).await;
}

/// The same with real processes: a scheduler and two executor processes
/// of one slot each; the calls are counted in files the executors append to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_query_is_cancelled_on_a_cluster_of_processes() {
    let server = server_with_files(60);
    write_files(&server.bucket_dir().join("few"), 3, |i| 10 + i);
    let cluster = Cluster::start().await;
    let session = Session::remote(&cluster.url(), server.settings().workers(1))
        .await
        .expect("connect");
    let counts: Vec<PathBuf> = cluster
        .work_dirs
        .iter()
        .map(|w| w.with_extension("count"))
        .collect();
    let count = || {
        counts
            .iter()
            .map(|c| std::fs::metadata(c).map(|m| m.len() as usize).unwrap_or(0))
            .sum::<usize>()
    };
    let chain = counted_chain(&session);
    let run = tokio::spawn(async move { chain.collect().await });
    // The job, named by its shuffle dir `<work dir>/<job id>/`, runs.
    let deadline = Instant::now() + Duration::from_secs(30);
    let job = loop {
        let jobs: Vec<String> = cluster
            .work_dirs
            .iter()
            .filter_map(|w| std::fs::read_dir(w).ok())
            .flat_map(|d| d.flatten())
            .filter(|e| e.path().is_dir())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            // Not udfchain's caches, not DataFusion's spill dirs.
            .filter(|name| name != "udfchain" && !name.starts_with("datafusion-"))
            .collect();
        if let [job] = jobs.as_slice() {
            break job.clone();
        }
        assert!(Instant::now() < deadline, "no job started: {jobs:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let status = scheduler_job_status(cluster.port, &job).await;
    assert!(status.contains("Running"), "the job: {status}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // The client drops the query's stream.
    run.abort();
    assert!(
        run.await.is_err(),
        "the query takes ~6 s, it cannot end in 1.5 s"
    );
    let (after_cancel, later) = calls_after_the_drop(&count).await;
    assert!(after_cancel > 0, "the job started");
    assert_eq!(later, after_cancel, "calls went on after the cancel");
    assert!(later < 60, "the whole job ran: {later} calls");
    // The scheduler failed the job as cancelled (and may have forgotten it).
    let status = scheduler_job_status(cluster.port, &job).await;
    eprintln!("job {job} after the cancel: {status}");
    assert!(
        status.contains("Failed") && status.contains("\"Cancelled\"") || status == "None",
        "the job: {status}"
    );
    the_slot_is_free(&session).await;
}

/// The scheduler's status of `job`, as `Debug` text.
async fn scheduler_job_status(port: u16, job: &str) -> String {
    use ballista_core::serde::protobuf::GetJobStatusParams;
    use ballista_core::serde::protobuf::scheduler_grpc_client::SchedulerGrpcClient;
    let mut client = SchedulerGrpcClient::connect(format!("http://127.0.0.1:{port}"))
        .await
        .expect("connect to the scheduler");
    let status = client
        .get_job_status(GetJobStatusParams {
            job_id: job.to_string(),
        })
        .await
        .expect("job status")
        .into_inner()
        .status;
    format!("{status:?}")
}

/// A UDF failing on an executor (on_error = fail) reaches the client as one
/// readable line naming the UDF, the file and the cause, as locally, not as
/// Ballista's nested `Debug` text (which stays in the error's sources).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_error_reaches_the_client_as_one_readable_line() {
    let server = server_with_files(4);
    let cluster = Session::standalone(server.settings().workers(1), registry(), 1)
        .await
        .expect("standalone cluster");
    let err = cluster
        .from_storage("s3://bucket/data/")
        .settings(Settings::new().on_error(udfchain::OnError::Fail))
        .map("n", picky)
        .collect()
        .await
        .expect_err("odd lengths fail");
    let text = err.to_string();
    eprintln!("{text}");
    assert_eq!(text.lines().count(), 1, "{text}");
    for part in ["picky", "s3://bucket/data/", "odd length"] {
        assert!(text.contains(part), "{part}: {text}");
    }
    for noise in ["Execution(", "\\\"", "DataFusionError"] {
        assert!(!text.contains(noise), "{noise}: {text}");
    }
    let mut sources = String::new();
    let mut source = std::error::Error::source(&err);
    while let Some(s) = source {
        sources.push_str(&s.to_string());
        source = s.source();
    }
    assert!(sources.contains("Execution("), "the raw report: {sources}");
}

/// `explain_analyze` of a chain run on the cluster shows udfchain's operator
/// metrics of the remote run, summed over its tasks (here two partitions):
/// prefetch fetched every file once, the UDF ran once per file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_runs_operator_metrics_reach_the_client() {
    let server = server_with_files(12);
    let udfs = UdfRegistry::with_builtins().register_map("meta", meta);
    let cluster = Session::standalone(server.settings().workers(2), udfs, 2)
        .await
        .expect("standalone cluster");
    let text = cluster
        .from_storage("s3://bucket/data/")
        .settings(Settings::new().prefetch(3))
        .map("meta", meta)
        .explain_analyze()
        .await
        .expect("explain analyze");
    eprintln!("{text}");
    for metric in [
        "PrefetchExec.files_fetched=12",
        "MapExec.output_rows=12",
        "PrefetchExec.peak_in_flight=",
    ] {
        assert!(text.contains(metric), "{metric}: {text}");
    }
    // SQL: `EXPLAIN ANALYZE` prints each stage's executed plan with its metrics.
    let runner = udfchain::ScriptRunner::new(cluster);
    let text = udfchain_testkit::last_table(
        &runner,
        "EXPLAIN ANALYZE SELECT sha256(file) AS h FROM read_storage('s3://bucket/data/')",
    )
    .await;
    eprintln!("{text}");
    assert!(text.contains("files_fetched=12"), "{text}");
}

/// Ctrl-C (SIGINT) of `udfchain --cluster ... query` cancels the job on the
/// cluster: the CLI exits with status 130 and says so, and the executor
/// process stops downloading (the S3 server, 150 ms per request, sees no new
/// GET).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_of_the_cli_cancels_its_job_on_the_cluster() {
    interrupt_a_cluster_run(false).await;
}

/// The same when the cluster is chosen by the script (`SET cluster = ...`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_of_a_script_that_set_its_cluster_cancels_its_job() {
    interrupt_a_cluster_run(true).await;
}

async fn interrupt_a_cluster_run(cluster_in_script: bool) {
    let server = S3Server::start_shaped(Duration::from_millis(150), None);
    write_files(&server.bucket_dir().join("data"), 40, |i| 20 + i);
    let dir = tempfile::tempdir().expect("dir");
    let port = free_port();
    let _scheduler = Child::scheduler(port);
    let work = dir.path().join("exec");
    let _executor = Child::cli_executor(port, &work, 1).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let url = format!("df://127.0.0.1:{port}");
    let mut args: Vec<String> = vec![
        "--root".into(),
        dir.path().join("root").display().to_string(),
    ];
    if !cluster_in_script {
        args.extend(["--cluster".into(), url.clone()]);
    }
    for kv in [
        format!("storage.endpoint={}", server.endpoint),
        "storage.allow_http=true".into(),
        format!("storage.access_key_id={}", udfchain_testkit::ACCESS_KEY),
        format!("storage.secret_access_key={}", udfchain_testkit::SECRET_KEY),
        "storage.region=us-east-1".into(),
        "storage.virtual_hosted_style_request=false".into(),
        "workers=1".into(),
        "prefetch=1".into(),
    ] {
        args.extend(["--set".into(), kv]);
    }
    let sql = "SELECT sha256(file) AS h FROM read_storage('s3://bucket/data/')";
    if cluster_in_script {
        let script = dir.path().join("job.sql");
        std::fs::write(&script, format!("SET cluster = '{url}';\n{sql};\n")).expect("script");
        args.extend(["run".into(), script.display().to_string()]);
    } else {
        args.extend(["query".into(), sql.into()]);
    }
    let client = Command::new(env!("CARGO_BIN_EXE_udfchain"))
        .args(&args)
        .env("CI", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the client");
    // The job runs (GETs arrive), then Ctrl-C.
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.object_gets() < 3 {
        assert!(Instant::now() < deadline, "the job did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pid = client.id().to_string();
    let kill = Command::new("kill").args(["-INT", &pid]).status();
    assert!(kill.expect("kill").success());
    let out = tokio::time::timeout(
        Duration::from_secs(20),
        tokio::task::spawn_blocking(move || client.wait_with_output()),
    )
    .await
    .expect("the client exits soon after Ctrl-C")
    .expect("join")
    .expect("client output");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "interrupted (Ctrl-C): the running job was cancelled on the cluster {url}"
        )),
        "{stderr}"
    );
    let at_exit = server.object_gets();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let after_cancel = server.object_gets();
    tokio::time::sleep(Duration::from_secs(2)).await;
    eprintln!("GETs: {at_exit} when the CLI exited, {after_cancel} 1.5 s later");
    assert_eq!(server.object_gets(), after_cancel, "GETs went on");
    assert!(after_cancel < 40, "the whole job ran: {after_cancel} GETs");
}

/// The UDF calls counted 1.5 s after a drop (the cancel has reached the
/// executor; a call in flight may still finish) and 2 s after that.
async fn calls_after_the_drop(count: &impl Fn() -> usize) -> (usize, usize) {
    let at_drop = count();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let after_cancel = count();
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let later = count();
    eprintln!("calls: {at_drop} at the drop, {after_cancel} 1.5 s later, {later} 3.5 s later");
    (after_cancel, later)
}

/// A query on a cluster whose scheduler has no executor. Run by the CLI in
/// a pseudo-terminal (util-linux `script`), where the live display draws: it
/// says "waiting for an executor", and after `cluster_executor_timeout` the
/// query fails with an error saying so, instead of waiting silently forever
/// (the test's own bound fails a run that never ends).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_on_a_cluster_without_executors_says_so_and_gives_up() {
    let dir = tempfile::tempdir().expect("dir");
    let port = free_port();
    let _scheduler = Child::scheduler(port);
    let quote = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
    let cmd = [
        env!("CARGO_BIN_EXE_udfchain"),
        "--root",
        dir.path().to_str().expect("utf8 dir"),
        "--cluster",
        &format!("df://127.0.0.1:{port}"),
        "--set",
        "cluster_executor_timeout=3s",
        "query",
        "SELECT 1 AS one",
    ]
    .map(quote)
    .join(" ");
    let run = tokio::task::spawn_blocking(move || {
        Command::new("script")
            .args(["-qfec", &cmd, "/dev/null"])
            .stdin(Stdio::null())
            .env_remove("CI")
            .output()
            .expect("util-linux `script` runs the CLI in a pty")
    });
    let out = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("the query ends although no executor ever registers")
        .expect("join");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("waiting for an executor"), "{text}");
    assert!(
        text.contains("no executor registered at the scheduler for 3s (cluster_executor_timeout)"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shuffle_sample_chunk_and_explode_run_on_the_cluster_as_locally() {
    #[derive(Serialize, Deserialize)]
    struct Row {
        id: u64,
        json: String,
    }
    let rows: Vec<Row> = (0..40)
        .map(|id| Row {
            id,
            json: format!("{{\"a\": {id}, \"b\": \"x{id}\"}}"),
        })
        .collect();
    let cluster = Session::standalone(Settings::new().workers(2), registry(), 2)
        .await
        .expect("standalone cluster");
    let text = |b: Vec<datafusion::arrow::array::RecordBatch>| {
        datafusion::arrow::util::pretty::pretty_format_batches(&b)
            .expect("format")
            .to_string()
    };
    type MakeChain<'a> = Box<dyn Fn(Arc<Session>) -> Chain + 'a>;
    let chains: Vec<(&str, MakeChain)> = vec![
        (
            "shuffle",
            Box::new(|s| Chain::from_values_in(s, &rows).shuffle(Some(7))),
        ),
        (
            "sample",
            Box::new(|s| Chain::from_values_in(s, &rows).sample(5, Some(3))),
        ),
        (
            "chunk",
            Box::new(|s| {
                Chain::from_values_in(s, &rows)
                    .chunk(1, 3)
                    .order_by([col("id").sort(true, false)])
            }),
        ),
        (
            "explode",
            Box::new(|s| {
                Chain::from_values_in(s, &rows)
                    .explode("json", Some("j"), 10)
                    .select([col("id"), col("j.a"), col("j.b")])
                    .order_by([col("id").sort(true, false)])
            }),
        ),
    ];
    for (name, chain) in &chains {
        let remote = text(
            chain(Arc::clone(&cluster))
                .collect()
                .await
                .unwrap_or_else(|e| panic!("{name} on the cluster: {e}")),
        );
        let local = text(chain(Session::new()).collect().await.expect("local"));
        assert_eq!(remote, local, "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_decoders_travel_with_their_spec_and_give_the_local_rows() {
    use udfchain::udfs::builtins::image::{Format, Image, Mode, encode};
    let dir = tempfile::tempdir().expect("dir");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).expect("mkdir");
    for i in 0..4u32 {
        let pixels = (0..40 * 30)
            .flat_map(|p| {
                [
                    (p * 3 + i * 50) as u8,
                    (p / 40 * 8) as u8,
                    (p % 40 * 6) as u8,
                ]
            })
            .collect();
        let img = Image::new(40, 30, Mode::Rgb, pixels).expect("image");
        let format = if i % 2 == 0 {
            Format::Png
        } else {
            Format::Jpeg
        };
        let bytes = encode(img.view(), format, Some(90)).expect("encode");
        std::fs::write(data.join(format!("img{i}")), bytes).expect("write");
    }
    // A thumbnail, a fused decode + convert + resize and a plain decode: three
    // specs, each rebuilt by the executors from the name the plan carries.
    let sql = format!(
        "SELECT file.path AS path,
                image_encode(image_thumbnail(file, 12), 'png') AS thumb,
                image_encode(image_resize(image_convert(image_decode(file), 'L'), 5, 4, 'bilinear'), 'png') AS small,
                image_decode(file)['width'] AS w
         FROM read_storage('{}') ORDER BY path",
        data.display()
    );
    let text = |b: Vec<udfchain::Output>| match b.into_iter().last() {
        Some(udfchain::Output::Table(b)) => {
            datafusion::arrow::util::pretty::pretty_format_batches(&b)
                .expect("format")
                .to_string()
        }
        _ => panic!("a table"),
    };
    let root = dir.path().join("root");
    let local = udfchain::ScriptRunner::new(Session::with_settings(Settings::new().root(&root)))
        .run(&sql)
        .await
        .expect("local");
    let cluster = Session::standalone(Settings::new().root(&root).workers(2), registry(), 2)
        .await
        .expect("standalone cluster");
    let remote = udfchain::ScriptRunner::new(cluster)
        .run(&sql)
        .await
        .expect("cluster");
    let local = text(local);
    assert_eq!(local.lines().count(), 8, "{local}");
    assert_eq!(text(remote), local);
}
