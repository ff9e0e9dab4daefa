//! The cluster path against a local run, in one run: workload C (a CPU-bound
//! UDF over local files) and workload A (a latency-bound UDF over the loopback
//! S3 server with 20 ms per request), each run locally, on one executor of
//! one slot (`workers = 1`) and on two executors of one slot each (`workers =
//! 2`). The scheduler and executors are child processes of this binary
//! (`--scheduler PORT`, `--executor PORT DIR`) on 127.0.0.1.
//!
//! Then workload C-py, the same three ways from Python:
//! `benches/python/cluster_driver.py`, run with `$UDFCHAIN_BENCH_PYTHON`
//! (else `~/.cache/udfchain-bench-venv/bin/python`, the Python benchmark's
//! venv), runs a pure-Python CPU loop (`udfs.burn_file` of the Python
//! benchmark's workload C, calibrated to ~20 ms of CPU per 4 KiB file) over
//! local files (600; `--quick`: 200) in that interpreter, on one
//! Python executor of one slot (`python -m udfchain cluster executor --slots
//! 1`, `workers = 1`) and on two of one slot each (`workers = 2`), each
//! cluster with its own scheduler (`python -m udfchain cluster scheduler`),
//! all children of the driver on 127.0.0.1. Every C-py run has
//! `parallel = 1, prefetch = 2`: one UDF call at a time locally, as in one
//! slot. The executors import the UDF by module (the driver's directory is
//! on their PYTHONPATH): no cloudpickle needed. Without a Python that
//! imports udfchain (or with `UDFCHAIN_BENCH_PYTHON` set but empty), C-py is
//! a record with `skipped` and the reason; a C-py run that fails, one with
//! `error`; the Rust rows run either way.
//!
//! ```sh
//! cargo bench --bench cluster              # full run
//! cargo bench --bench cluster -- --quick   # scaled down
//! cargo bench --bench cluster -- --quick --rounds 40   # less CPU per file
//! UDFCHAIN_BENCH_PYTHON=~/venv/bin/python cargo bench --bench cluster -- --quick
//! python benches/python/cluster_driver.py --dir /tmp/c-py --quick   # C-py alone
//! ```
//!
//! Reported (a table on stdout and `<target>/bench/cluster.json`): files/s
//! of each run (the best of `REPEATS` runs after a warm-up; C-py the same),
//! the ratio of one executor to local (the cluster path's overhead: target
//! at least 0.8) and of two executors to one (the second executor's
//! speedup: C-py's target at least 1.4). The machine's cores are recorded:
//! with 2 cores, the CPU-bound speedup cannot pass 2 and shares the cores
//! with the client, the scheduler and any other load. C-py records also
//! carry `bare_two_over_one`, the driver's loop alone (no engine) in two
//! processes over one, measured after the runs: what the machine gives a
//! second process, the ceiling of C-py's speedup (1.8-2.1 in quiet runs on
//! the 2-core development machine, 1.5-1.7 at busier times), and
//! `udf_cpu_ms`, the calibrated CPU per call. See docs/performance.md,
//! "Cluster".
//! Nothing is asserted: the harness reports.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use udfchain::cluster::{Executor, Scheduler, UdfRegistry};
use udfchain::udfs::UdfError;
use udfchain::{File, Session, Settings};

use udfchain_testkit::S3Server;

/// Timed runs per configuration (after one warm-up run).
const REPEATS: usize = 2;
/// SHA-256 rounds over a file's bytes per call of `burn` by default (a few
/// ms of CPU in a release build); `--rounds N` sets it (passed on to the
/// executors in `ROUNDS_ENV`).
const BURN_ROUNDS: usize = 400;
const ROUNDS_ENV: &str = "UDFCHAIN_CLUSTER_BENCH_ROUNDS";
static ROUNDS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();

fn rounds() -> usize {
    *ROUNDS.get_or_init(|| {
        std::env::var(ROUNDS_ENV)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(BURN_ROUNDS)
    })
}

/// Workload C's UDF: SHA-256 of the bytes, `BURN_ROUNDS` times over.
async fn burn(f: File) -> Result<u64, UdfError> {
    let bytes = f.read().await?;
    let mut digest = Sha256::digest(&bytes);
    for _ in 1..rounds() {
        let mut h = Sha256::new();
        h.update(digest);
        h.update(&bytes);
        digest = h.finalize();
    }
    Ok(u64::from(digest[0]))
}

/// Workload A's UDF: the length (the time is the GET's).
async fn touch(f: File) -> Result<u64, UdfError> {
    Ok(f.read().await?.len() as u64)
}

fn registry() -> UdfRegistry {
    UdfRegistry::new()
        .register_map("burn", burn)
        .register_map("touch", touch)
}

#[derive(Debug, Serialize)]
struct Record {
    workload: &'static str,
    mode: &'static str,
    executors: usize,
    files: usize,
    seconds: f64,
    files_per_s: f64,
    /// files/s over the local run's.
    ratio_to_local: f64,
    /// files/s over the one-executor run's (two executors only).
    speedup_vs_one: Option<f64>,
    cores: usize,
    latency_ms: u64,
    /// SHA-256 rounds per file of workload C; C-py: rounds of its Python
    /// byte loop per file.
    burn_rounds: usize,
    /// C-py: the calibrated CPU of one call, in ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    udf_cpu_ms: Option<f64>,
    /// C-py: files/s of its loop alone (no engine, no I/O) in two processes
    /// over one: what the machine gives a second process, the ceiling of
    /// `speedup_vs_one`.
    #[serde(skip_serializing_if = "Option::is_none")]
    bare_two_over_one: Option<f64>,
    /// C-py: the interpreter that ran the client and the executors.
    #[serde(skip_serializing_if = "Option::is_none")]
    python: Option<String>,
    /// `release` (cargo bench) or `dev` (an unoptimized build) for C and A;
    /// absent for C-py, whose engine is the Python package as installed.
    #[serde(skip_serializing_if = "Option::is_none")]
    profile: Option<&'static str>,
    quick: bool,
}

const PROFILE: &str = if cfg!(debug_assertions) {
    "dev"
} else {
    "release"
};

struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn spawn(args: &[String]) -> Child {
    Command::new(std::env::current_exe().expect("current exe"))
        .args(args)
        .env(ROUNDS_ENV, rounds().to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

/// A scheduler and `n` executors of one slot each.
async fn cluster(n: usize, dir: &Path) -> (Children, String) {
    let port = free_port();
    let mut children = vec![spawn(&["--scheduler".into(), port.to_string()])];
    let dirs: Vec<PathBuf> = (0..n).map(|i| dir.join(format!("exec{n}-{i}"))).collect();
    for d in &dirs {
        children.push(spawn(&[
            "--executor".into(),
            port.to_string(),
            d.display().to_string(),
        ]));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while !dirs.iter().all(|d| d.exists()) {
        assert!(Instant::now() < deadline, "executors did not start");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Registration follows the work dir within a heartbeat.
    tokio::time::sleep(Duration::from_secs(3)).await;
    (Children(children), format!("df://127.0.0.1:{port}"))
}

/// Files/s of the best of `REPEATS` runs of `udf` over `uri` in `session`.
async fn measure(session: &Arc<Session>, uri: &str, udf: &str, files: usize) -> f64 {
    let run = || async {
        let chain = session.from_storage(uri);
        let chain = match udf {
            "burn" => chain.map("out", burn),
            _ => chain.map("out", touch),
        };
        let started = Instant::now();
        let rows: usize = chain
            .collect()
            .await
            .expect("run")
            .iter()
            .map(|b| b.num_rows())
            .sum();
        assert_eq!(rows, files, "every file");
        started.elapsed().as_secs_f64()
    };
    run().await; // warm-up: connections, executors registered, page cache
    let mut best = f64::MAX;
    for _ in 0..REPEATS {
        best = best.min(run().await);
    }
    best
}

struct Workload {
    name: &'static str,
    udf: &'static str,
    uri: String,
    files: usize,
    settings: Settings,
    latency_ms: u64,
}

async fn bench(quick: bool, out: &Path) {
    let dir = tempfile::tempdir().expect("temp dir");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // C: CPU-bound, local files.
    let c_files = if quick { 48 } else { 160 };
    let c_dir = dir.path().join("c");
    udfchain_testkit::write_files(&c_dir, c_files, |_| 16 << 10);
    // A: latency-bound, 20 ms per request.
    let a_files = if quick { 120 } else { 400 };
    let server = S3Server::start_shaped(Duration::from_millis(20), None);
    udfchain_testkit::write_files(&server.bucket_dir().join("a"), a_files, |_| 8 << 10);
    let base = Settings::new()
        .parallel(1)
        .root(dir.path().join("root"))
        .cache(false);
    let workloads = [
        Workload {
            name: "C",
            udf: "burn",
            uri: c_dir.display().to_string(),
            files: c_files,
            settings: base.clone().prefetch(2),
            latency_ms: 0,
        },
        Workload {
            name: "A",
            udf: "touch",
            uri: "s3://bucket/a/".into(),
            files: a_files,
            settings: server.settings().merge(&base).prefetch(8),
            latency_ms: 20,
        },
    ];
    let mut records = Vec::new();
    for w in &workloads {
        let local = Session::with_settings(w.settings.clone());
        let local_secs = measure(&local, &w.uri, w.udf, w.files).await;
        let mut push = |mode, executors, secs: f64, one: Option<f64>| {
            let fps = w.files as f64 / secs;
            records.push(Record {
                workload: w.name,
                mode,
                executors,
                files: w.files,
                seconds: secs,
                files_per_s: fps,
                ratio_to_local: local_secs / secs,
                speedup_vs_one: one.map(|o| o / secs),
                cores,
                latency_ms: w.latency_ms,
                burn_rounds: rounds(),
                udf_cpu_ms: None,
                bare_two_over_one: None,
                python: None,
                profile: Some(PROFILE),
                quick,
            });
        };
        push("local", 0, local_secs, None);
        let mut one_secs = None;
        for n in [1, 2] {
            let (_children, url) = cluster(n, dir.path()).await;
            let session = Session::remote(&url, w.settings.clone().workers(n))
                .await
                .expect("connect");
            let secs = measure(&session, &w.uri, w.udf, w.files).await;
            if n == 1 {
                push("one executor", 1, secs, None);
                one_secs = Some(secs);
            } else {
                push("two executors", 2, secs, one_secs);
            }
        }
    }
    // C-py: after the Rust rows, with their clusters gone.
    let (py_records, py_notes) = python_rows(quick, dir.path(), cores);
    records.extend(py_records);
    println!(
        "\ncluster benchmark ({}, {PROFILE} build, {} SHA-256 rounds per file in C; {cores} cores \
         shared by the client, the scheduler, the executors and the rest of the machine)",
        if quick { "--quick" } else { "full" },
        rounds()
    );
    if let Some(r) = records.iter().find(|r| r.workload == "C-py") {
        println!(
            "C-py: a pure-Python loop of {:.1} ms of CPU per file ({} rounds), Python executors, \
             parallel = 1 everywhere; the loop alone in two processes / one: {} (the ceiling \
             of two executors / one); {}",
            r.udf_cpu_ms.unwrap_or(f64::NAN),
            r.burn_rounds,
            r.bare_two_over_one
                .map(|x| format!("{x:.2}"))
                .unwrap_or_else(|| "-".into()),
            r.python.as_deref().unwrap_or("?")
        );
    }
    println!(
        "{:<9} {:<14} {:>6} {:>9} {:>9} {:>10} {:>11}",
        "workload", "mode", "files", "seconds", "files/s", "vs local", "vs one exec"
    );
    for r in &records {
        println!(
            "{:<9} {:<14} {:>6} {:>9.2} {:>9.1} {:>10.2} {:>11}",
            r.workload,
            r.mode,
            r.files,
            r.seconds,
            r.files_per_s,
            r.ratio_to_local,
            r.speedup_vs_one
                .map(|s| format!("{s:.2}"))
                .unwrap_or_else(|| "-".into())
        );
    }
    for note in &py_notes {
        let (what, why) = match (&note["skipped"], &note["error"]) {
            (Value::String(s), _) => ("skipped", s.as_str()),
            (_, Value::String(e)) => ("error", e.as_str()),
            _ => ("note", ""),
        };
        match note["mode"].as_str() {
            Some(mode) => println!("C-py      {mode}: {what}: {why}"),
            None => println!("C-py      {what}: {why}"),
        }
    }
    let mut json: Vec<Value> = records
        .iter()
        .map(|r| serde_json::to_value(r).expect("json"))
        .collect();
    json.extend(py_notes);
    std::fs::create_dir_all(out).expect("bench dir");
    let path = out.join("cluster.json");
    std::fs::write(&path, serde_json::to_string_pretty(&json).expect("json"))
        .expect("write cluster.json");
    println!("\nrecords: {}", path.display());
}

/// The interpreter of the Python rows: `$UDFCHAIN_BENCH_PYTHON`, else the
/// Python benchmark's venv (`~/.cache/udfchain-bench-venv`); `None` when
/// the variable is set but empty (no Python rows: `.ci/run` without a build
/// of the Python package).
fn python() -> Option<PathBuf> {
    match std::env::var_os("UDFCHAIN_BENCH_PYTHON") {
        Some(p) if p.is_empty() => None,
        Some(p) => Some(PathBuf::from(p)),
        None => {
            let home = std::env::var_os("HOME")
                .map(PathBuf::from)
                .unwrap_or_default();
            Some(home.join(".cache/udfchain-bench-venv/bin/python"))
        }
    }
}

/// Workload C-py: `benches/python/cluster_driver.py` runs it locally, on
/// one Python executor and on two, and prints one JSON line with the
/// seconds of each. Its records, and the notes of what did not run (a
/// record with `skipped`: no Python with udfchain; with `error`: a run that
/// failed). Never panics: the Rust rows are reported either way.
fn python_rows(quick: bool, dir: &Path, cores: usize) -> (Vec<Record>, Vec<Value>) {
    let note = |key: &str, mode: Option<&str>, why: String| {
        let mut v = json!({"workload": "C-py", key: why});
        if let Some(m) = mode {
            v["mode"] = json!(m);
        }
        v
    };
    let Some(py) = python() else {
        let why = "UDFCHAIN_BENCH_PYTHON is empty (no Python with udfchain)".to_string();
        return (Vec::new(), vec![note("skipped", None, why)]);
    };
    let driver = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/python/cluster_driver.py");
    let scratch = dir.join("c-py");
    // The driver's own watchdog ends it (and its cluster) by then; this
    // process kills it a minute later if it did not.
    let deadline: u64 = if quick { 300 } else { 900 };
    let mut cmd = Command::new(&py);
    cmd.arg(&driver)
        .arg("--dir")
        .arg(&scratch)
        .args(["--deadline", &deadline.to_string()]);
    if quick {
        cmd.arg("--quick");
    }
    cmd.env("AWS_METADATA_ENDPOINT", "http://127.0.0.1:1")
        .env("UDFCHAIN_ROOT", scratch.join("root"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let why = format!(
                "cannot run {}: {e} (set UDFCHAIN_BENCH_PYTHON to a Python with udfchain installed)",
                py.display()
            );
            return (Vec::new(), vec![note("skipped", None, why)]);
        }
    };
    let mut stdout = child.stdout.take().expect("piped stdout");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stdout, &mut s);
        s
    });
    let limit = Instant::now() + Duration::from_secs(deadline + 60);
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Ok(s),
            Ok(None) if Instant::now() < limit => std::thread::sleep(Duration::from_millis(200)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                break Err(format!("killed after {} s", deadline + 60));
            }
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                break Err(e.to_string());
            }
        }
    };
    let text = reader.join().unwrap_or_default();
    let Some(out) = text.lines().rev().find_map(|l| {
        serde_json::from_str::<Value>(l)
            .ok()
            .filter(Value::is_object)
    }) else {
        let why = match status {
            Ok(s) => format!("{} exited with {s} and no result", driver.display()),
            Err(e) => e,
        };
        return (Vec::new(), vec![note("error", None, why)]);
    };
    if let Some(why) = out["skipped"].as_str() {
        return (Vec::new(), vec![note("skipped", None, why.to_string())]);
    }
    if let Some(why) = out["error"].as_str() {
        return (Vec::new(), vec![note("error", None, why.to_string())]);
    }
    let files = out["files"].as_u64().unwrap_or(0) as usize;
    let mut notes: Vec<Value> = out["errors"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(mode, e)| note("error", Some(mode), e.as_str().unwrap_or("?").to_string()))
        .collect();
    let Some(local) = out["local"].as_f64() else {
        notes.push(note("error", None, "the local run failed".into()));
        return (Vec::new(), notes);
    };
    let one = out["one"].as_f64();
    let record = |mode, executors, secs: f64, vs_one: Option<f64>| Record {
        workload: "C-py",
        mode,
        executors,
        files,
        seconds: secs,
        files_per_s: files as f64 / secs,
        ratio_to_local: local / secs,
        speedup_vs_one: vs_one.map(|o| o / secs),
        cores,
        latency_ms: 0,
        burn_rounds: out["burn_rounds"].as_u64().unwrap_or(0) as usize,
        udf_cpu_ms: out["t_udf_seconds"].as_f64().map(|s| s * 1e3),
        bare_two_over_one: out["bare_two_over_one"].as_f64(),
        python: out["python"].as_str().map(str::to_string),
        profile: None,
        quick,
    };
    let mut records = vec![record("local", 0, local, None)];
    if let Some(s) = one {
        records.push(record("one executor", 1, s, None));
    }
    if let Some(s) = out["two"].as_f64() {
        records.push(record("two executors", 2, s, one));
    }
    (records, notes)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    match args.first().map(String::as_str) {
        Some("--scheduler") => {
            let addr = format!("127.0.0.1:{}", args[1]);
            rt.block_on(Scheduler::builder().bind(&addr).run())
                .expect("scheduler");
        }
        Some("--executor") => {
            let addr = format!("127.0.0.1:{}", args[1]);
            rt.block_on(
                Executor::builder()
                    .registry(registry())
                    .scheduler(&addr)
                    .slots(1)
                    .work_dir(&args[2])
                    .run(),
            )
            .expect("executor");
        }
        _ => {
            let quick = args.iter().any(|a| a == "--quick");
            if let Some(n) = args
                .iter()
                .position(|a| a == "--rounds")
                .and_then(|i| args.get(i + 1))
                .and_then(|n| n.parse().ok())
            {
                let _ = ROUNDS.set(n);
            }
            let target = std::env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("target"));
            rt.block_on(bench(quick, &target.join("bench")));
        }
    }
}
