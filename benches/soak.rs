//! A long run: `--files` generated objects (a `GeneratedStore`, each GET and
//! listing page delayed by the tail latency model `Latency::object_store_tail`)
//! through prefetch (`auto`, every file downloaded to the temp dir:
//! `memory_file_limit = 0`) + a map that reads each file + a dataset save, for
//! `--minutes` at most. Every `--every` seconds it samples the process's RSS,
//! open file descriptors (`/proc/self/fd`), the temp dir's bytes and files
//! (`<root>/tmp`) and threads (`Threads` of `/proc/self/status`); the report
//! says whether each is flat after warm-up and how many temp files are left
//! at the end (there must be none). Not run by `.ci/run`.
//!
//! ```sh
//! cargo bench --bench soak                                  # 1,000,000 files, 60 min at most
//! cargo bench --bench soak -- --minutes 60 --files 1000000  # the same, spelled out
//! cargo bench --bench soak -- --quick                       # 300,000 files, 5 min at most
//! ```
//!
//! Flat: the samples taken while files flow (before the map has finished
//! every row), after warm-up (the first fifth of the run, at least two
//! samples) are split in thirds, and the largest value of the last third may
//! exceed the largest of the first third by at most 10% (threads and temp
//! files: or by at most 2, a blocking thread coming and going; fds and temp
//! bytes: or by at most one window of `max_connections` files, each with its
//! descriptor, the prefetch's files coming and going between samples). A leak
//! grows by one per file, past any window.
//! The exit code is 1 when something is not flat or a temp file is left.
//! Output: a table on stdout and `<target>/bench/soak.json`.

use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use udfchain::{File, Session, Settings};
use udfchain_testkit::{GeneratedStore, Latency};

/// Bytes per generated object.
const FILE_SIZE: usize = 4096;
/// `Settings::max_connections`' default (`settings.rs`, not exported): the
/// most downloads, so temp files, in flight.
const MAX_CONNECTIONS: usize = 128;

#[derive(Debug, Clone, Serialize)]
struct Sample {
    /// Seconds since the run started.
    secs: f64,
    /// Rows the map has finished.
    rows: u64,
    rss_bytes: u64,
    fds: u64,
    temp_bytes: u64,
    temp_files: u64,
    threads: u64,
    /// The save's checkpoint (its kept results, removed at the commit): it
    /// grows with the rows by design, so it is reported, not judged.
    checkpoint_bytes: u64,
}

#[derive(Debug, Serialize)]
struct Verdict {
    metric: &'static str,
    first_third_max: u64,
    last_third_max: u64,
    growth_pct: f64,
    flat: bool,
}

#[derive(Debug, Serialize)]
struct Report {
    files: u64,
    minutes_cap: f64,
    every_secs: u64,
    latency: String,
    rows_saved: Option<u64>,
    finished: bool,
    elapsed_secs: f64,
    warmup_samples: usize,
    verdicts: Vec<Verdict>,
    leaked_temp_files: u64,
    leaked_temp_bytes: u64,
    samples: Vec<Sample>,
}

fn status_field(name: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn open_fds() -> u64 {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count() as u64)
        .unwrap_or(0)
}

/// (bytes, files) below `dir`.
fn usage(dir: &FsPath) -> (u64, u64) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return (0, 0);
    };
    entries
        .flatten()
        .fold((0, 0), |(b, n), e| match e.file_type() {
            Ok(t) if t.is_dir() => {
                let (b2, n2) = usage(&e.path());
                (b + b2, n + n2)
            }
            Ok(_) => (b + e.metadata().map(|m| m.len()).unwrap_or(0), n + 1),
            Err(_) => (b, n),
        })
}

fn sample(started: Instant, root: &FsPath, rows: u64) -> Sample {
    let (temp_bytes, temp_files) = usage(&root.join("tmp"));
    Sample {
        secs: started.elapsed().as_secs_f64(),
        rows,
        rss_bytes: status_field("VmRSS:") * 1024,
        fds: open_fds(),
        temp_bytes,
        temp_files,
        threads: status_field("Threads:"),
        checkpoint_bytes: usage(&root.join("checkpoints")).0,
    }
}

fn verdict(metric: &'static str, values: &[u64], slack: u64) -> Verdict {
    let third = (values.len() / 3).max(1);
    let first = values[..third].iter().copied().max().unwrap_or(0);
    let last = values[values.len() - third..]
        .iter()
        .copied()
        .max()
        .unwrap_or(0);
    let growth_pct = if first == 0 {
        if last == 0 { 0.0 } else { f64::INFINITY }
    } else {
        (last as f64 / first as f64 - 1.0) * 100.0
    };
    Verdict {
        metric,
        first_third_max: first,
        last_third_max: last,
        growth_pct,
        flat: last as f64 <= first as f64 * 1.10 || last <= first + slack,
    }
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target"))
}

fn arg<T: std::str::FromStr>(args: &[String], flag: &str) -> Option<T> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let files: u64 = arg(&args, "--files").unwrap_or(if quick { 300_000 } else { 1_000_000 });
    let minutes: f64 = arg(&args, "--minutes").unwrap_or(if quick { 5.0 } else { 60.0 });
    let every: u64 = arg(&args, "--every").unwrap_or(10);
    let seed: u64 = std::env::var("UDFCHAIN_BENCH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let latency = Latency::object_store_tail(seed);
    let cores = udfchain::testing::cores();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores)
        .thread_name("bench-io")
        .enable_all()
        .build()
        .expect("runtime");

    let root = tempfile::tempdir().expect("root dir");
    let root_path = root.path().to_path_buf();
    let rows = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    eprintln!(
        "soak: {files} files of {FILE_SIZE} B, tail latency (seed {seed}), {minutes} min at most, a sample every {every} s"
    );

    // The sampler: a thread of its own, so a stalled runtime still gets sampled.
    let sampler = {
        let (root, rows, done) = (root_path.clone(), Arc::clone(&rows), Arc::clone(&done));
        std::thread::spawn(move || {
            let mut samples = Vec::new();
            let mut next = Instant::now();
            while !done.load(Ordering::SeqCst) {
                if Instant::now() >= next {
                    let s = sample(started, &root, rows.load(Ordering::SeqCst));
                    println!(
                        "{:>6.0} s {:>9} rows  rss {:>7.1} MiB  fds {:>4}  temp {:>8.1} KiB in {:>4} files  threads {:>3}  checkpoint {:>7.1} MiB",
                        s.secs,
                        s.rows,
                        s.rss_bytes as f64 / 1048576.0,
                        s.fds,
                        s.temp_bytes as f64 / 1024.0,
                        s.temp_files,
                        s.threads,
                        s.checkpoint_bytes as f64 / 1048576.0,
                    );
                    samples.push(s);
                    next += Duration::from_secs(every);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            samples
        })
    };

    let saved = rt.block_on(async {
        let settings = Settings::new()
            .root(&root_path)
            .progress(false)
            .memory_file_limit(0);
        let session = Session::with_settings(settings);
        let store = GeneratedStore::new("soak", files)
            .with_size(FILE_SIZE)
            .with_latency(latency);
        session
            .register_store("memory://soak", Arc::new(store))
            .expect("register the store");
        let counter = Arc::clone(&rows);
        let chain = session
            .from_storage("memory://soak/soak")
            .map("sum", move |f: File| {
                let counter = Arc::clone(&counter);
                async move {
                    let bytes = f.read().await?;
                    counter.fetch_add(1, Ordering::Relaxed);
                    Ok::<_, udfchain::udfs::UdfError>(bytes.iter().map(|&b| b as u64).sum::<u64>())
                }
            });
        let cap = Duration::from_secs_f64(minutes * 60.0);
        match tokio::time::timeout(cap, chain.save("soak")).await {
            Ok(r) => Some(r.expect("the save").rows),
            // Past the cap: the save is dropped (cancelled), as a user's would be.
            Err(_) => None,
        }
    });
    // Everything of the run is dropped: give aborted tasks a moment, then look.
    std::thread::sleep(Duration::from_secs(2));
    let last = sample(started, &root_path, rows.load(Ordering::SeqCst));
    done.store(true, Ordering::SeqCst);
    let mut samples = sampler.join().expect("sampler");
    let elapsed = started.elapsed().as_secs_f64();
    let (leaked_bytes, leaked_files) = (last.temp_bytes, last.temp_files);
    samples.push(last);

    // Warm-up: the first fifth of the run (at least two samples); the last
    // sample, taken after the run, is not judged.
    // Judged: the samples while files flow (the map has not finished every
    // row; the commit's blocking threads at the end are not the steady state).
    let flowing = samples[..samples.len() - 1]
        .iter()
        .take_while(|s| s.rows < files)
        .count();
    let running = &samples[..flowing];
    let warmup = (running.len() / 5).max(2).min(running.len());
    let judged = &running[warmup..];
    let verdicts = if judged.len() >= 3 {
        let col = |f: fn(&Sample) -> u64| judged.iter().map(f).collect::<Vec<_>>();
        vec![
            verdict("rss_bytes", &col(|s| s.rss_bytes), 0),
            // Each prefetched file holds a descriptor while it is written or
            // read: fds swing by up to one window too.
            verdict("fds", &col(|s| s.fds), MAX_CONNECTIONS as u64),
            // The temp dir holds the prefetch window's files, which come and
            // go between samples (4 KiB each, some half written): its bytes
            // swing by up to one window, `max_connections` files. A leak
            // grows past any window; so does a window that is not bounded.
            verdict(
                "temp_bytes",
                &col(|s| s.temp_bytes),
                (MAX_CONNECTIONS * FILE_SIZE) as u64,
            ),
            verdict("temp_files", &col(|s| s.temp_files), 2),
            verdict("threads", &col(|s| s.threads), 2),
        ]
    } else {
        eprintln!("soak: too few samples after warm-up to judge flatness");
        Vec::new()
    };
    println!();
    println!(
        "soak: {} in {elapsed:.0} s ({} rows saved), warm-up {warmup} samples",
        if saved.is_some() {
            "finished"
        } else {
            "stopped at the time cap"
        },
        saved.map_or("no".to_string(), |r| r.to_string())
    );
    println!(
        "{:<11} {:>16} {:>16} {:>9}  flat (<= 10%)",
        "metric", "first third max", "last third max", "growth"
    );
    for v in &verdicts {
        println!(
            "{:<11} {:>16} {:>16} {:>8.1}%  {}",
            v.metric,
            v.first_third_max,
            v.last_third_max,
            v.growth_pct,
            if v.flat { "yes" } else { "NO" }
        );
    }
    println!("leaked temp files at the end: {leaked_files} ({leaked_bytes} bytes)");

    let report = Report {
        files,
        minutes_cap: minutes,
        every_secs: every,
        latency: format!("{latency:?}"),
        rows_saved: saved,
        finished: saved.is_some(),
        elapsed_secs: elapsed,
        warmup_samples: warmup,
        verdicts,
        leaked_temp_files: leaked_files,
        leaked_temp_bytes: leaked_bytes,
        samples,
    };
    let dir = target_dir().join("bench");
    std::fs::create_dir_all(&dir).expect("bench dir");
    let path = dir.join("soak.json");
    std::fs::write(&path, serde_json::to_string_pretty(&report).expect("json"))
        .expect("write soak.json");
    println!("wrote {}", path.display());
    let ok = report.leaked_temp_files == 0
        && !report.verdicts.is_empty()
        && report.verdicts.iter().all(|v| v.flat);
    drop(root);
    if !ok {
        std::process::exit(1);
    }
}
