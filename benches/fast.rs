//! Workload L, fast storage: the engine's own cost per file where storage is
//! not the bottleneck (a local directory, `memory://`).
//!
//! ```sh
//! cargo bench --bench fast               # 30,000 x 1 B, 5,000 x 64 KiB, 300,000 listed
//! cargo bench --bench fast -- --quick    # 3,000 x 1 B, 1,000 x 64 KiB, 30,000 listed
//! cargo bench --bench fast -- --only tiny,64k,listing --no-syscalls
//! ```
//!
//! Each set of files lives in a local directory (written once under
//! `<target>/bench/fast-data/`, reused when complete) and, the same objects,
//! in an `InMemory` store registered as `memory://fast`. The UDF is SHA-256 of
//! the whole file (hex), through the Rust API at prefetch 0, 8 and the default
//! (auto), `parallel` at its default (cores), and once in SQL at default
//! settings (`SELECT count(sha256(file)) FROM read_storage(..)`). Next to it
//! over the same files: a single-threaded loop (`std::fs::read_dir` +
//! `std::fs::read` + sha2, what `os.listdir` + `hashlib` is in Python; over
//! memory, one GET after the other) and `buffer_unordered(k)` over the same
//! object_store (`LocalFileSystem`, `InMemory`) for k = 8, 32, hashing inline
//! in the stream's task, in `spawn_blocking`, or in one spawned task per file
//! (get and hash).
//!
//! The bound is min(cores x files/s of hashing alone on one core, files/s of
//! reading alone), reading alone being the best of three `buffer_unordered(32)`
//! runs that list and read every file without hashing.
//!
//! Each run records process CPU per file (`/proc/self/stat`, every thread,
//! exited ones included) split by thread group (from each live thread's
//! `schedstat`: `bench-io` the runtime's workers that drive the query,
//! `bench-blocking` its blocking pool, `udfchain-udf` the engine's UDF pool,
//! `main` the thread that consumes the stream, `other` the rest: other threads
//! and threads that exited during the run), context switches per file (each
//! live thread's `status`; threads that exited during the run are not
//! counted), read/write syscalls per file (`/proc/self/io`) and, in a
//! separate untimed run under `perf stat -e raw_syscalls:sys_enter`, all
//! syscalls per file (when `perf` can count them; else not measured).
//! Listing: udfchain counting 300,000 empty local files next to
//! `find <dir> -type f | wc -l`. Nothing is asserted: a table and the targets
//! of docs/performance.md on stdout, every run in `<target>/bench/fast.json`.

use std::collections::BTreeMap;
use std::path::{Path as FsPath, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::Serialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use udfchain::datafusion::arrow::array::{Array, Int64Array};
use udfchain::udfs::UdfError;
use udfchain::{File, Output, ScriptRunner, Session, Settings};

/// The memory store's URI (scheme and host).
const MEMORY_URI: &str = "memory://fast";
/// Runs shorter than this are repeated three times (the median is kept).
const SHORT: f64 = 3.0;

// ---------------------------------------------------------------------------
// The work

/// SHA-256 of the bytes, in hex: the UDF and every baseline do exactly this.
fn hash_hex(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

/// Files/s of `hash_hex` alone on one core over a buffer of `size` bytes
/// (the best of 5 rounds of about 0.1 s each).
fn hash_rate(size: usize) -> f64 {
    let buf = file_bytes(1, size);
    let t = Instant::now();
    let mut n = 0u64;
    while t.elapsed() < Duration::from_millis(20) {
        std::hint::black_box(hash_hex(std::hint::black_box(&buf)));
        n += 1;
    }
    let per_round = (n * 5).max(1);
    (0..5)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..per_round {
                std::hint::black_box(hash_hex(std::hint::black_box(&buf)));
            }
            per_round as f64 / t.elapsed().as_secs_f64()
        })
        .fold(0.0, f64::max)
}

// ---------------------------------------------------------------------------
// Data

/// Deterministic bytes of file `i` (xorshift, cheap for 64 KiB).
fn file_bytes(i: usize, size: usize) -> Vec<u8> {
    let mut x = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (0..size)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// `000/000123.bin`: 1,000 files per directory.
fn rel_path(i: usize) -> String {
    format!("{:03}/{i:06}.bin", i / 1000)
}

/// Writes `files` files of `size` bytes under `dir` unless a marker beside it
/// says a complete set is there (written last, so an interrupted write is
/// redone). Returns the seconds spent writing (0 when reused).
fn ensure_local(dir: &FsPath, files: usize, size: usize) -> f64 {
    let marker = dir.with_extension("done");
    let want = format!("{files} files of {size} bytes\n");
    if dir.is_dir() && std::fs::read_to_string(&marker).is_ok_and(|m| m == want) {
        return 0.0;
    }
    let t = Instant::now();
    let _ = std::fs::remove_file(&marker);
    if dir.exists() {
        std::fs::remove_dir_all(dir).expect("remove an incomplete data dir");
    }
    for d in 0..files.div_ceil(1000) {
        std::fs::create_dir_all(dir.join(format!("{d:03}"))).expect("mkdir");
    }
    let threads = udfchain::testing::cores().max(2);
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                for i in (t..files).step_by(threads) {
                    std::fs::write(dir.join(rel_path(i)), file_bytes(i, size)).expect("write");
                }
            });
        }
    });
    std::fs::write(&marker, want).expect("write the marker");
    t.elapsed().as_secs_f64()
}

/// Puts the same files into `store` under `prefix`.
async fn put_memory(store: &InMemory, prefix: &str, files: usize, size: usize) {
    for i in 0..files {
        let path = Path::from(format!("{prefix}/{}", rel_path(i)));
        store
            .put(&path, PutPayload::from(file_bytes(i, size)))
            .await
            .expect("put");
    }
}

// ---------------------------------------------------------------------------
// Measuring: CPU by thread group, context switches, syscalls

#[derive(Debug, Clone, Default)]
struct ThreadStat {
    name: String,
    /// ns on CPU (`schedstat`).
    ns: u64,
    voluntary: u64,
    involuntary: u64,
}

struct Snapshot {
    /// utime + stime of the whole process (exited threads included), seconds.
    process_s: f64,
    /// read and write syscalls of the whole process (`/proc/self/io`).
    rw_syscalls: u64,
    threads: BTreeMap<String, ThreadStat>,
}

fn snapshot() -> Snapshot {
    let process_s = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            let after: Vec<&str> = s.rsplit_once(')')?.1.split_whitespace().collect();
            let ticks = after.get(11)?.parse::<u64>().ok()? + after.get(12)?.parse::<u64>().ok()?;
            Some(ticks as f64 / 100.0)
        })
        .unwrap_or(0.0);
    let rw_syscalls = std::fs::read_to_string("/proc/self/io")
        .map(|s| {
            s.lines()
                .filter(|l| l.starts_with("syscr:") || l.starts_with("syscw:"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .sum()
        })
        .unwrap_or(0);
    let mut threads = BTreeMap::new();
    if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
        for t in dir.flatten() {
            let p = t.path();
            let mut st = ThreadStat {
                name: std::fs::read_to_string(p.join("comm"))
                    .unwrap_or_default()
                    .trim()
                    .to_string(),
                ..Default::default()
            };
            st.ns = std::fs::read_to_string(p.join("schedstat"))
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse().ok())
                .unwrap_or(0);
            for line in std::fs::read_to_string(p.join("status"))
                .unwrap_or_default()
                .lines()
            {
                let value = || line.split_whitespace().nth(1)?.parse::<u64>().ok();
                if line.starts_with("voluntary_ctxt_switches:") {
                    st.voluntary = value().unwrap_or(0);
                } else if line.starts_with("nonvoluntary_ctxt_switches:") {
                    st.involuntary = value().unwrap_or(0);
                }
            }
            threads.insert(t.file_name().to_string_lossy().to_string(), st);
        }
    }
    Snapshot {
        process_s,
        rw_syscalls,
        threads,
    }
}

/// The thread groups CPU is split into.
const GROUPS: [&str; 5] = ["io", "blocking", "udf", "main", "other"];

fn group_of(tid: &str, name: &str) -> &'static str {
    if tid == std::process::id().to_string() {
        return "main";
    }
    match name {
        "bench-io" => "io",
        "bench-blocking" => "blocking",
        "udfchain-udf" => "udf",
        _ => "other",
    }
}

/// What one run cost the process, between two snapshots.
#[derive(Debug, Clone, Default)]
struct Cost {
    cpu_s: f64,
    /// CPU seconds by group (`GROUPS`); `other` is the process's CPU the live
    /// named threads do not account for.
    groups: BTreeMap<&'static str, f64>,
    voluntary: u64,
    involuntary: u64,
    rw_syscalls: u64,
    /// Threads alive at the start and gone at the end.
    threads_exited: usize,
}

fn cost(a: &Snapshot, b: &Snapshot) -> Cost {
    let mut c = Cost::default();
    let mut named = 0.0;
    for g in GROUPS {
        c.groups.insert(g, 0.0);
    }
    for (tid, t) in &b.threads {
        let before = a.threads.get(tid).cloned().unwrap_or_default();
        let s = t.ns.saturating_sub(before.ns) as f64 / 1e9;
        let g = group_of(tid, &t.name);
        *c.groups.entry(g).or_default() += s;
        named += s;
        c.voluntary += t.voluntary.saturating_sub(before.voluntary);
        c.involuntary += t.involuntary.saturating_sub(before.involuntary);
    }
    c.threads_exited = a
        .threads
        .keys()
        .filter(|t| !b.threads.contains_key(*t))
        .count();
    // The process counter has 10 ms ticks; the threads' ns are exact.
    c.cpu_s = (b.process_s - a.process_s).max(named);
    *c.groups.entry("other").or_default() += c.cpu_s - named;
    c.rw_syscalls = b.rw_syscalls.saturating_sub(a.rw_syscalls);
    c
}

fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// What a run's body reports.
#[derive(Debug, Clone, Copy, Default)]
struct Outcome {
    seconds: f64,
    rows: usize,
}

/// One timed run and what it cost.
#[derive(Debug, Clone)]
struct Measured {
    outcome: Outcome,
    cost: Cost,
    load: f64,
    /// Seconds of every repeat, sorted.
    repeats: Vec<f64>,
    syscalls: Option<u64>,
}

fn measure(body: &mut dyn FnMut() -> Outcome) -> Measured {
    std::thread::sleep(Duration::from_millis(50));
    let load = load_average();
    let a = snapshot();
    let outcome = body();
    let b = snapshot();
    Measured {
        outcome,
        cost: cost(&a, &b),
        load,
        repeats: vec![outcome.seconds],
        syscalls: None,
    }
}

/// `measure`, three times when a run is short (the median by time is kept;
/// `best` keeps the fastest instead).
fn repeated(body: &mut dyn FnMut() -> Outcome, best: bool) -> Measured {
    let first = measure(body);
    if first.outcome.seconds >= SHORT {
        return first;
    }
    let mut runs = vec![first, measure(body), measure(body)];
    runs.sort_by(|a, b| a.outcome.seconds.total_cmp(&b.outcome.seconds));
    let repeats: Vec<f64> = runs.iter().map(|r| r.outcome.seconds).collect();
    let mut kept = runs.swap_remove(if best { 0 } else { 1 });
    kept.repeats = repeats;
    kept
}

/// Counts every syscall of this process during one run of `body` with
/// `perf stat -e raw_syscalls:sys_enter -p <pid>` (threads started during the
/// run included); `None` when perf cannot count them here.
fn count_syscalls(body: &mut dyn FnMut() -> Outcome) -> Option<u64> {
    let mut perf = Command::new("perf")
        .args(["stat", "-x", ",", "-e", "raw_syscalls:sys_enter", "-p"])
        .arg(std::process::id().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .ok()?;
    // perf opens its counters on every thread before it counts.
    std::thread::sleep(Duration::from_millis(300));
    body();
    let stopped = Command::new("kill")
        .args(["-INT", &perf.id().to_string()])
        .status()
        .is_ok_and(|s| s.success());
    if !stopped {
        let _ = perf.kill();
    }
    let out = perf.wait_with_output().ok()?;
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .find(|l| l.contains("raw_syscalls:sys_enter"))
        .and_then(|l| l.split(',').next()?.trim().parse().ok())
}

// ---------------------------------------------------------------------------
// Records

/// One run, as written to `fast.json`.
#[derive(Debug, Clone, Serialize)]
struct Record {
    /// L-tiny-local | L-tiny-memory | L-64k-local | L-64k-memory | L-listing-local
    workload: String,
    /// udfchain | sql | serial | buffer_unordered | read_only | find
    engine: String,
    settings: Value,
    files: usize,
    file_size: usize,
    /// The kept run (the median of three when under 3 s; read_only: the best).
    seconds: f64,
    repeats_s: Vec<f64>,
    files_per_s: f64,
    bound_files_per_s: Option<f64>,
    ratio_to_bound: Option<f64>,
    /// files/s over the single-threaded loop's on the same files.
    ratio_to_serial: Option<f64>,
    /// Listing: files/s over find's.
    ratio_to_find: Option<f64>,
    /// Process CPU (every thread) per file, µs.
    cpu_per_file_us: f64,
    /// CPU per file by thread group, µs: io (the runtime's workers), blocking
    /// (its blocking pool), udf (udfchain's UDF pool), main (the thread that
    /// consumes the stream), other (the rest, threads that exited included).
    cpu_split_us_per_file: BTreeMap<&'static str, f64>,
    /// Share of the machine's cores busy during the run.
    cpu_busy: f64,
    /// Voluntary + involuntary context switches per file (live threads).
    ctx_switches_per_file: f64,
    voluntary_ctx_switches_per_file: f64,
    involuntary_ctx_switches_per_file: f64,
    threads_exited: usize,
    /// read/write syscalls per file (`/proc/self/io` syscr + syscw).
    rw_syscalls_per_file: f64,
    /// Every syscall per file (a separate run under `perf stat`), if measured.
    syscalls_per_file: Option<f64>,
    /// 1-minute load average before the run, and at the start of the bench.
    load_average: f64,
    load_average_at_start: f64,
    cores: usize,
}

// ---------------------------------------------------------------------------
// Workloads

/// How a `buffer_unordered` baseline hashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hash {
    /// In the future that read the file, polled by the stream's own task.
    Inline,
    /// `spawn_blocking` after the read (as many at once as reads).
    SpawnBlocking,
    /// One `tokio::spawn` per file that reads and hashes.
    Task,
    /// No hashing: what the storage serves.
    None,
}

impl Hash {
    fn label(self) -> &'static str {
        match self {
            Self::Inline => "inline",
            Self::SpawnBlocking => "spawn_blocking",
            Self::Task => "task",
            Self::None => "none",
        }
    }
}

struct Workload {
    name: String,
    files: usize,
    size: usize,
    /// What udfchain reads (a path or `memory://fast/<set>/`).
    uri: String,
    store: Arc<dyn ObjectStore>,
    /// The objects' prefix in `store`.
    prefix: Option<Path>,
    /// The local directory (the serial loop walks it).
    dir: Option<PathBuf>,
}

async fn list(store: &Arc<dyn ObjectStore>, prefix: Option<&Path>) -> Vec<Path> {
    store
        .list(prefix)
        .map_ok(|m| m.location)
        .try_collect()
        .await
        .expect("list")
}

/// `std::fs::read_dir` + `std::fs::read` + SHA-256, one thread, the directory
/// tree walked depth first.
fn serial_local(dir: &FsPath) -> Outcome {
    let t0 = Instant::now();
    let mut rows = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir") {
            let e = e.expect("dir entry");
            if e.file_type().expect("file type").is_dir() {
                stack.push(e.path());
            } else {
                let bytes = std::fs::read(e.path()).expect("read");
                std::hint::black_box(hash_hex(&bytes));
                rows += 1;
            }
        }
    }
    Outcome {
        seconds: t0.elapsed().as_secs_f64(),
        rows,
    }
}

/// List, then one GET after the other, hashing each (one task).
async fn serial_store(store: &Arc<dyn ObjectStore>, prefix: Option<&Path>) -> Outcome {
    let t0 = Instant::now();
    let mut rows = 0;
    for p in list(store, prefix).await {
        let bytes = store
            .get(&p)
            .await
            .expect("get")
            .bytes()
            .await
            .expect("body");
        std::hint::black_box(hash_hex(&bytes));
        rows += 1;
    }
    Outcome {
        seconds: t0.elapsed().as_secs_f64(),
        rows,
    }
}

/// List, then `k` GETs in flight with `buffer_unordered`, hashing as `hash` says.
async fn buffered(
    store: &Arc<dyn ObjectStore>,
    prefix: Option<&Path>,
    k: usize,
    hash: Hash,
) -> Outcome {
    let t0 = Instant::now();
    let paths = futures::stream::iter(list(store, prefix).await);
    let get = {
        let store = Arc::clone(store);
        move |p: Path| {
            let store = Arc::clone(&store);
            async move {
                store
                    .get(&p)
                    .await
                    .expect("get")
                    .bytes()
                    .await
                    .expect("body")
            }
        }
    };
    let rows = match hash {
        Hash::None => paths.map(get).buffer_unordered(k).count().await,
        Hash::Inline => {
            paths
                .map(|p| {
                    let get = get.clone();
                    async move { hash_hex(&get(p).await).len() }
                })
                .buffer_unordered(k)
                .count()
                .await
        }
        Hash::SpawnBlocking => {
            paths
                .map(get)
                .buffer_unordered(k)
                .map(|b| async move {
                    tokio::task::spawn_blocking(move || hash_hex(&b).len())
                        .await
                        .expect("hash")
                })
                .buffer_unordered(k)
                .count()
                .await
        }
        Hash::Task => {
            paths
                .map(|p| {
                    let get = get.clone();
                    tokio::spawn(async move { hash_hex(&get(p).await).len() })
                })
                .buffer_unordered(k)
                .map(|r| r.expect("task"))
                .count()
                .await
        }
    };
    Outcome {
        seconds: t0.elapsed().as_secs_f64(),
        rows,
    }
}

/// The chain: SHA-256 of every file under `uri` at `settings`, streamed to its end.
async fn udfchain_run(session: &Arc<Session>, uri: &str, settings: Settings) -> Outcome {
    let t0 = Instant::now();
    let chain = session
        .from_storage(uri)
        .settings(settings)
        .map("h", |f: File| async move {
            let bytes = f.read().await?;
            Ok::<String, UdfError>(hash_hex(&bytes))
        });
    let mut stream = chain.stream().await.expect("plan the chain");
    let mut rows = 0;
    while let Some(batch) = stream.next().await {
        rows += batch.expect("run the chain").num_rows();
    }
    drop(stream);
    Outcome {
        seconds: t0.elapsed().as_secs_f64(),
        rows,
    }
}

/// The first Int64 of the last table of a script's outputs.
fn first_int(outputs: &[Output]) -> usize {
    outputs
        .iter()
        .rev()
        .find_map(|o| match o {
            Output::Table(b) => b.first().cloned(),
            Output::Message(_) => None,
        })
        .and_then(|b| {
            let v = b.column(0).as_any().downcast_ref::<Int64Array>()?;
            (!v.is_empty()).then(|| v.value(0) as usize)
        })
        .expect("a count")
}

async fn sql_run(runner: &ScriptRunner, uri: &str) -> Outcome {
    let t0 = Instant::now();
    let q = format!("SELECT count(sha256(file)) FROM read_storage('{uri}')");
    let out = runner.run(&q).await.expect("run the SQL");
    Outcome {
        seconds: t0.elapsed().as_secs_f64(),
        rows: first_int(&out),
    }
}

struct Bench {
    rt: tokio::runtime::Runtime,
    session: Arc<Session>,
    runner: ScriptRunner,
    cores: usize,
    load_at_start: f64,
    syscalls: bool,
    records: Vec<Record>,
}

impl Bench {
    fn record(
        &self,
        w: (&str, usize, usize),
        engine: &str,
        settings: Value,
        m: &Measured,
        bound: Option<f64>,
    ) -> Record {
        let (workload, expected, size) = w;
        let o = m.outcome;
        if o.rows != expected {
            eprintln!(
                "warning: {workload} {engine} {settings}: {} files, expected {expected}",
                o.rows
            );
        }
        let n = o.rows.max(1) as f64;
        let files_per_s = o.rows as f64 / o.seconds;
        let c = &m.cost;
        let r = Record {
            workload: workload.to_string(),
            engine: engine.to_string(),
            settings,
            files: o.rows,
            file_size: size,
            seconds: o.seconds,
            repeats_s: m.repeats.clone(),
            files_per_s,
            bound_files_per_s: bound,
            ratio_to_bound: bound.map(|b| files_per_s / b),
            ratio_to_serial: None,
            ratio_to_find: None,
            cpu_per_file_us: c.cpu_s / n * 1e6,
            cpu_split_us_per_file: c.groups.iter().map(|(g, s)| (*g, s / n * 1e6)).collect(),
            cpu_busy: c.cpu_s / (o.seconds * self.cores as f64),
            ctx_switches_per_file: (c.voluntary + c.involuntary) as f64 / n,
            voluntary_ctx_switches_per_file: c.voluntary as f64 / n,
            involuntary_ctx_switches_per_file: c.involuntary as f64 / n,
            threads_exited: c.threads_exited,
            rw_syscalls_per_file: c.rw_syscalls as f64 / n,
            syscalls_per_file: m.syscalls.map(|s| s as f64 / n),
            load_average: m.load,
            load_average_at_start: self.load_at_start,
            cores: self.cores,
        };
        progress(&r);
        r
    }

    /// A timed run (repeated when short) and, with `--syscalls`, one more under perf.
    fn run(&self, body: &mut dyn FnMut() -> Outcome, best: bool) -> Measured {
        let mut m = repeated(body, best);
        if self.syscalls {
            m.syscalls = count_syscalls(body);
        }
        m
    }

    fn workload(&mut self, w: &Workload) {
        let id = (w.name.as_str(), w.files, w.size);
        let hash_per_core = hash_rate(w.size);
        eprintln!(
            "{}: {} files of {} B; SHA-256 alone {:.0} files/s per core",
            w.name, w.files, w.size, hash_per_core
        );
        let store = &w.store;
        let prefix = w.prefix.as_ref();
        // What the storage serves: list and read every file, no hashing.
        let read = self.run(
            &mut || self.rt.block_on(buffered(store, prefix, 32, Hash::None)),
            true,
        );
        let read_rate = read.outcome.rows as f64 / read.outcome.seconds;
        let bound = (self.cores as f64 * hash_per_core).min(read_rate);
        let mut recs = vec![self.record(
            id,
            "read_only",
            json!({"k": 32, "hash": "none", "kept": "best of 3",
                   "hash_files_per_s_per_core": hash_per_core}),
            &read,
            Some(bound),
        )];
        let serial = match &w.dir {
            Some(dir) => self.run(&mut || serial_local(dir), false),
            None => self.run(&mut || self.rt.block_on(serial_store(store, prefix)), false),
        };
        let serial_rate = serial.outcome.rows as f64 / serial.outcome.seconds;
        let how = if w.dir.is_some() {
            "std::fs, one thread"
        } else {
            "GET after GET, one task"
        };
        recs.push(self.record(id, "serial", json!({"loop": how}), &serial, Some(bound)));
        for k in [8, 32] {
            for hash in [Hash::Inline, Hash::SpawnBlocking, Hash::Task] {
                let m = self.run(
                    &mut || self.rt.block_on(buffered(store, prefix, k, hash)),
                    false,
                );
                recs.push(self.record(
                    id,
                    "buffer_unordered",
                    json!({"k": k, "hash": hash.label()}),
                    &m,
                    Some(bound),
                ));
            }
        }
        for pf in [Some(0), Some(8), None] {
            let settings = match pf {
                Some(n) => Settings::new().prefetch(n),
                None => Settings::new(),
            };
            let m = self.run(
                &mut || {
                    self.rt
                        .block_on(udfchain_run(&self.session, &w.uri, settings.clone()))
                },
                false,
            );
            let label = pf.map_or(json!("auto (default)"), |n| json!(n));
            recs.push(self.record(
                id,
                "udfchain",
                json!({"prefetch": label, "parallel": self.cores}),
                &m,
                Some(bound),
            ));
        }
        let m = self.run(
            &mut || self.rt.block_on(sql_run(&self.runner, &w.uri)),
            false,
        );
        recs.push(self.record(
            id,
            "sql",
            json!({"query": "SELECT count(sha256(file)) FROM read_storage(..)", "settings": "defaults"}),
            &m,
            Some(bound),
        ));
        for r in &mut recs {
            r.ratio_to_serial = Some(r.files_per_s / serial_rate);
        }
        self.records.extend(recs);
    }

    /// udfchain listing `files` empty local files next to `find | wc -l`.
    fn listing(&mut self, dir: &FsPath, files: usize) {
        let id = ("L-listing-local", files, 0);
        let path = dir.display().to_string();
        let mut find = || {
            let t0 = Instant::now();
            let out = Command::new("sh")
                .arg("-c")
                .arg(format!("find '{path}' -type f | wc -l"))
                .output()
                .expect("run find");
            Outcome {
                seconds: t0.elapsed().as_secs_f64(),
                rows: String::from_utf8_lossy(&out.stdout)
                    .trim()
                    .parse()
                    .unwrap_or(0),
            }
        };
        find(); // warms the directory cache for both
        let find_m = self.run(&mut find, false);
        let find_rate = find_m.outcome.rows as f64 / find_m.outcome.seconds;
        let mut count = || {
            self.rt.block_on(async {
                let t0 = Instant::now();
                let rows = self
                    .session
                    .from_storage(&path)
                    .count()
                    .await
                    .expect("count the listing");
                Outcome {
                    seconds: t0.elapsed().as_secs_f64(),
                    rows,
                }
            })
        };
        let ours = self.run(&mut count, false);
        let mut a = self.record(
            id,
            "udfchain",
            json!({"call": "from_storage.count"}),
            &ours,
            None,
        );
        a.ratio_to_find = Some(a.files_per_s / find_rate);
        let mut b = self.record(
            id,
            "find",
            json!({"command": "find -type f | wc -l"}),
            &find_m,
            None,
        );
        b.ratio_to_find = Some(1.0);
        self.records.extend([a, b]);
    }
}

// ---------------------------------------------------------------------------
// Output

fn settings_label(v: &Value) -> String {
    match v {
        Value::Object(m) => m
            .iter()
            .filter(|(k, _)| {
                !matches!(
                    k.as_str(),
                    "kept" | "hash_files_per_s_per_core" | "parallel" | "query"
                )
            })
            .map(|(k, v)| match v {
                Value::String(s) => format!("{k}={s}"),
                v => format!("{k}={v}"),
            })
            .collect::<Vec<_>>()
            .join(" "),
        v => v.to_string(),
    }
}

fn progress(r: &Record) {
    eprintln!(
        "  {:<16} {:<32} {:>9.0} files/s  cpu {:>6.1} µs/file  {:>5.2} cs/file  ({:.2}s)",
        r.engine,
        settings_label(&r.settings),
        r.files_per_s,
        r.cpu_per_file_us,
        r.ctx_switches_per_file,
        r.seconds
    );
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".to_string(), |v| format!("{v:.digits$}"))
}

fn table(records: &[Record]) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "{:<16} {:<16} {:<30} {:>9} {:>7} {:>7} {:>8} {:>30} {:>6} {:>6} {:>6}\n",
        "workload",
        "engine",
        "settings",
        "files/s",
        "xserial",
        "xbound",
        "cpu µs",
        "io/blocking/udf/main/other µs",
        "cs",
        "rw sc",
        "sc"
    ));
    for r in records {
        let split = GROUPS
            .iter()
            .map(|g| {
                format!(
                    "{:.1}",
                    r.cpu_split_us_per_file.get(g).copied().unwrap_or(0.0)
                )
            })
            .collect::<Vec<_>>()
            .join("/");
        s.push_str(&format!(
            "{:<16} {:<16} {:<30} {:>9.0} {:>7} {:>7} {:>8.1} {:>30} {:>6.2} {:>6.2} {:>6}\n",
            r.workload,
            r.engine,
            settings_label(&r.settings),
            r.files_per_s,
            opt(r.ratio_to_serial.or(r.ratio_to_find), 2),
            opt(r.ratio_to_bound, 2),
            r.cpu_per_file_us,
            split,
            r.ctx_switches_per_file,
            r.rw_syscalls_per_file,
            opt(r.syscalls_per_file, 1),
        ));
    }
    s
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "NOT met" }
}

fn summary(records: &[Record]) -> String {
    let mut s = String::new();
    let udfchain = |w: &str| -> Vec<&Record> {
        records
            .iter()
            .filter(|r| r.workload == w && matches!(r.engine.as_str(), "udfchain" | "sql"))
            .collect()
    };
    let line = |r: &Record| {
        if r.engine == "sql" {
            "sql defaults".to_string()
        } else {
            format!(
                "prefetch {}",
                r.settings["prefetch"]
                    .as_str()
                    .map_or_else(|| r.settings["prefetch"].to_string(), str::to_string)
            )
        }
    };
    for w in ["L-tiny-local", "L-tiny-memory"] {
        let runs = udfchain(w);
        if runs.is_empty() {
            continue;
        }
        s.push_str(&format!(
            "{w}: target >= 2x the single-threaded loop and <= 20 µs CPU per file\n"
        ));
        for r in runs {
            let x = r.ratio_to_serial.unwrap_or(0.0);
            s.push_str(&format!(
                "  {:<26} {:>5.2}x serial ({}), {:>6.1} µs CPU/file ({})\n",
                line(r),
                x,
                verdict(x >= 2.0),
                r.cpu_per_file_us,
                verdict(r.cpu_per_file_us <= 20.0)
            ));
        }
    }
    for w in ["L-64k-local", "L-64k-memory"] {
        let runs = udfchain(w);
        if runs.is_empty() {
            continue;
        }
        s.push_str(&format!("{w}: target >= 0.8 of the bound\n"));
        for r in runs {
            let x = r.ratio_to_bound.unwrap_or(0.0);
            s.push_str(&format!(
                "  {:<26} {:>5.2} of bound ({:.0} files/s) ({}), {:>6.1} µs CPU/file\n",
                line(r),
                x,
                r.bound_files_per_s.unwrap_or(0.0),
                verdict(x >= 0.8),
                r.cpu_per_file_us
            ));
        }
    }
    if let Some(r) = records
        .iter()
        .find(|r| r.workload == "L-listing-local" && r.engine == "udfchain")
    {
        let x = r.ratio_to_find.unwrap_or(0.0);
        s.push_str(&format!(
            "L-listing-local ({} files): udfchain {:.0} files/s = {:.2} of find's rate (target >= 0.5: {})\n",
            r.files,
            r.files_per_s,
            x,
            verdict(x >= 0.5)
        ));
    }
    s
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target"))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let syscalls = !args.iter().any(|a| a == "--no-syscalls");
    let only: Option<Vec<String>> = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .map(|s| s.split(',').map(|w| w.trim().to_lowercase()).collect());
    let wanted = |w: &str| only.as_ref().is_none_or(|o| o.iter().any(|x| x == w));
    let load_at_start = load_average();
    let cores = udfchain::testing::cores();
    // The runtime's first `cores` threads are its workers; every later one is
    // of its blocking pool (kept alive so its CPU and switches stay counted).
    let spawned = AtomicUsize::new(0);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores)
        .thread_name_fn(move || {
            if spawned.fetch_add(1, Ordering::SeqCst) < cores {
                "bench-io".to_string()
            } else {
                "bench-blocking".to_string()
            }
        })
        .thread_keep_alive(Duration::from_secs(3600))
        .enable_all()
        .build()
        .expect("runtime");
    let on_workers: Vec<String> = rt.block_on(async {
        let tasks: Vec<_> = (0..4 * cores)
            .map(|_| {
                tokio::spawn(async {
                    tokio::task::yield_now().await;
                    std::thread::current().name().unwrap_or("").to_string()
                })
            })
            .collect();
        futures::future::join_all(tasks)
            .await
            .into_iter()
            .map(|r| r.expect("probe"))
            .collect()
    });
    if on_workers.iter().any(|n| n != "bench-io") {
        eprintln!(
            "warning: tokio workers not all named bench-io ({on_workers:?}): the io/blocking split is off"
        );
    }

    let bench_dir = target_dir().join("bench");
    let data = bench_dir.join("fast-data");
    std::fs::create_dir_all(&data).expect("bench data dir");
    let root = tempfile::TempDir::new().expect("root dir");
    let session = Session::with_settings(Settings::new().root(root.path()));
    let memory = Arc::new(InMemory::new());
    session
        .register_store(MEMORY_URI, Arc::clone(&memory) as Arc<dyn ObjectStore>)
        .expect("register memory://fast");
    let runner = ScriptRunner::new(Arc::clone(&session));
    eprintln!(
        "fast ({}): {cores} cores, load average {load_at_start:.2}, data under {}",
        if quick { "quick" } else { "full" },
        data.display()
    );
    let mut bench = Bench {
        rt,
        session,
        runner,
        cores,
        load_at_start,
        syscalls,
        records: Vec::new(),
    };
    let started = Instant::now();
    let sets = [
        ("tiny", if quick { 3_000 } else { 30_000 }, 1usize),
        ("64k", if quick { 1_000 } else { 5_000 }, 64 * 1024),
    ];
    for (set, files, size) in sets {
        if !wanted(set) {
            continue;
        }
        let key = format!("{set}-{files}");
        let dir = data.join(&key);
        let wrote = ensure_local(&dir, files, size);
        if wrote > 0.0 {
            eprintln!(
                "wrote {files} files of {size} B to {} in {wrote:.1}s",
                dir.display()
            );
        }
        let local: Arc<dyn ObjectStore> =
            Arc::new(LocalFileSystem::new_with_prefix(&dir).expect("local store"));
        bench.workload(&Workload {
            name: format!("L-{set}-local"),
            files,
            size,
            uri: dir.display().to_string(),
            store: local,
            prefix: None,
            dir: Some(dir.clone()),
        });
        bench.rt.block_on(put_memory(&memory, &key, files, size));
        bench.workload(&Workload {
            name: format!("L-{set}-memory"),
            files,
            size,
            uri: format!("{MEMORY_URI}/{key}/"),
            store: Arc::clone(&memory) as Arc<dyn ObjectStore>,
            prefix: Some(Path::from(key.as_str())),
            dir: None,
        });
        // Frees the objects before the next set.
        bench.rt.block_on(async {
            let paths = list(
                &(Arc::clone(&memory) as Arc<dyn ObjectStore>),
                Some(&Path::from(key.as_str())),
            )
            .await;
            for p in paths {
                memory.delete(&p).await.expect("delete");
            }
        });
    }
    if wanted("listing") {
        let files = if quick { 30_000 } else { 300_000 };
        let dir = data.join(format!("empty-{files}"));
        let wrote = ensure_local(&dir, files, 0);
        if wrote > 0.0 {
            eprintln!(
                "wrote {files} empty files to {} in {wrote:.1}s",
                dir.display()
            );
        }
        eprintln!("L-listing-local: {files} empty files");
        bench.listing(&dir, files);
    }
    let records = &bench.records;
    println!(
        "\nudfchain L: fast storage ({}; {cores} cores; load average {load_at_start:.2} at start; {:.0} s)\n",
        if quick { "--quick" } else { "full" },
        started.elapsed().as_secs_f64()
    );
    println!("files/s; xserial: over the single-threaded loop (listing: over find); xbound: over");
    println!(
        "min(cores x hash rate, read-only rate); cpu: process CPU µs per file, split by thread"
    );
    println!(
        "group; cs: context switches per file; rw sc: read/write syscalls per file; sc: every"
    );
    println!("syscall per file (perf stat, a separate run; - when not measured)\n");
    print!("{}", table(records));
    println!("\nTargets (reported, not asserted):");
    print!("{}", summary(records));
    let json = serde_json::to_string_pretty(records).expect("json");
    let out = bench_dir.join("fast.json");
    std::fs::write(&out, json).expect("write fast.json");
    println!("\nwrote {}", out.display());
}
