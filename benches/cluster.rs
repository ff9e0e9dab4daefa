//! The cluster path against a local run, in one run: workload C (a CPU-bound
//! UDF over local files) and workload A (a latency-bound UDF over the loopback
//! S3 server with 20 ms per request), each run locally, on one executor of
//! one slot (`workers = 1`) and on two executors of one slot each (`workers =
//! 2`). The scheduler and executors are child processes of this binary
//! (`--scheduler PORT`, `--executor PORT DIR`) on 127.0.0.1.
//!
//! ```sh
//! cargo bench --bench cluster              # full run
//! cargo bench --bench cluster -- --quick   # scaled down
//! cargo bench --bench cluster -- --quick --rounds 40   # less CPU per file
//! ```
//!
//! Reported (a table on stdout and `<target>/bench/cluster.json`): files/s
//! of each run (the best of `REPEATS` after a warm-up), the ratio of one
//! executor to local (the cluster path's overhead; target >= 0.8) and of two
//! executors to one (the second executor's speedup). The machine's cores are
//! recorded: with 2 cores, the CPU-bound speedup cannot pass 2 and shares the
//! cores with the client, the scheduler and any other load. Nothing is
//! asserted: the harness reports.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
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
    /// SHA-256 rounds per file of workload C.
    burn_rounds: usize,
    /// `release` (cargo bench) or `dev` (an unoptimized build).
    profile: &'static str,
    quick: bool,
}

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
                profile: if cfg!(debug_assertions) {
                    "dev"
                } else {
                    "release"
                },
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
    println!(
        "\ncluster benchmark ({}, {} build, {} SHA-256 rounds per file in C; {cores} cores \
         shared by the client, the scheduler, the executors and the rest of the machine)",
        if quick { "--quick" } else { "full" },
        if cfg!(debug_assertions) {
            "dev"
        } else {
            "release"
        },
        rounds()
    );
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
    std::fs::create_dir_all(out).expect("bench dir");
    let path = out.join("cluster.json");
    std::fs::write(&path, serde_json::to_string_pretty(&records).expect("json"))
        .expect("write cluster.json");
    println!("\nrecords: {}", path.display());
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
