//! The loader benchmark's records, table and JSON file, shared by its parts:
//! `kind = "epoch"` runs (the simulated trainer, `benches/loader.rs`) and
//! `kind = "flight"` runs (the Flight half: add its fields here and its runs
//! next to the epoch runs in `main`). One record per run, all written to
//! `<target dir>/bench/loader.json`.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::Serialize;

/// One run. Fields a kind does not measure are `null` in the JSON.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Record {
    /// "epoch" or "flight".
    pub kind: &'static str,
    pub quick: bool,
    pub prefetch_partitions: Option<usize>,
    pub parallel_requests: Option<usize>,
    /// Wall time of the run.
    pub seconds: f64,
    /// epoch: max(total fetch time / parallel_requests, total train time).
    pub bound_seconds: Option<f64>,
    /// epoch: total fetch time + total train time (nothing overlapped).
    pub serial_seconds: Option<f64>,
    /// bound_seconds / seconds (1.0 = at the bound).
    pub ratio_to_bound: Option<f64>,
    /// epoch: from asking for the epoch to the first batch.
    pub first_batch_seconds: Option<f64>,
    /// Peak resident set of the process during the run.
    pub peak_rss_bytes: u64,
    /// Resident set when the run started.
    pub start_rss_bytes: u64,
    /// epoch: the largest partition's Arrow bytes.
    pub partition_bytes: Option<u64>,
    /// epoch: (k + 1) x partition_bytes, what the loader may hold.
    pub held_bound_bytes: Option<u64>,
    pub partitions: Option<usize>,
    pub rows: Option<usize>,
    /// flight: MB/s from the server to a local client.
    pub mb_per_s: Option<f64>,
    /// flight: MB/s reading the same Arrow IPC from memory.
    pub ipc_mb_per_s: Option<f64>,
    /// flight: server -> client, "udfchain->rust", "udfchain->pyarrow" or
    /// "pyarrow->pyarrow" (the reference).
    pub peer: Option<&'static str>,
    /// flight: the request's `max_message_bytes` (`null`: the server's
    /// default for the client, 16 MiB for pyarrow's and 2 MiB for others;
    /// the reference sends each partition as one message).
    pub max_message_bytes: Option<usize>,
    /// flight: timed rounds (after one warm-up); `seconds` is the best.
    pub rounds: Option<usize>,
    /// flight: mb_per_s / the pyarrow->pyarrow reference's, measured in the same run.
    pub ratio_to_reference: Option<f64>,
    /// flight: the ratio_to_reference this peer aims at (reported, not asserted).
    pub target_ratio: Option<f64>,
    /// The 1-minute load average when the run ended.
    pub load_average: Option<f64>,
    /// Why this run has no numbers (e.g. no pyarrow).
    pub error: Option<String>,
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".to_string(), |v| format!("{v:.digits$}"))
}

fn mib(v: u64) -> String {
    format!("{:.1}", v as f64 / (1 << 20) as f64)
}

/// The epoch runs as an aligned table.
pub fn epoch_table(records: &[Record]) -> String {
    let mut s = format!(
        "{:>3} {:>3} {:>8} {:>8} {:>8} {:>7} {:>9} {:>9} {:>9} {:>11}\n",
        "k",
        "p",
        "epoch s",
        "bound s",
        "serial s",
        "ratio",
        "first s",
        "RSS MiB",
        "+RSS MiB",
        "(k+1)P MiB"
    );
    for r in records.iter().filter(|r| r.kind == "epoch") {
        s.push_str(&format!(
            "{:>3} {:>3} {:>8.3} {:>8} {:>8} {:>7} {:>9} {:>9} {:>9} {:>11}\n",
            r.prefetch_partitions.unwrap_or(0),
            r.parallel_requests.unwrap_or(0),
            r.seconds,
            opt(r.bound_seconds, 3),
            opt(r.serial_seconds, 3),
            opt(r.ratio_to_bound, 2),
            opt(r.first_batch_seconds, 3),
            mib(r.peak_rss_bytes),
            mib(r.peak_rss_bytes.saturating_sub(r.start_rss_bytes)),
            r.held_bound_bytes.map_or_else(|| "-".to_string(), mib),
        ));
    }
    s
}

/// Writes every record to `<target dir>/bench/loader.json` and returns the path.
pub fn write_json(records: &[Record]) -> PathBuf {
    let dir = target_dir().join("bench");
    std::fs::create_dir_all(&dir).expect("bench dir");
    let path = dir.join("loader.json");
    let json = serde_json::to_string_pretty(records).expect("json");
    std::fs::write(&path, json).expect("write loader.json");
    path
}

pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target"))
}

/// The 1-minute load average, from /proc (None where there is none).
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The process's resident set, from /proc (0 where there is none).
pub fn vm_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// Samples the resident set every 5 ms on a thread of its own until finished.
pub struct RssSampler {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<u64>,
}

impl RssSampler {
    pub fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let handle = std::thread::Builder::new()
            .name("bench-rss".into())
            .spawn(move || {
                let mut peak = 0;
                loop {
                    peak = vm_rss().max(peak);
                    if flag.load(Ordering::SeqCst) {
                        return peak;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
            .expect("sampler thread");
        Self { stop, handle }
    }

    /// The peak resident set seen.
    pub fn finish(self) -> u64 {
        self.stop.store(true, Ordering::SeqCst);
        self.handle.join().expect("sampler")
    }
}
