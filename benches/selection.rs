//! Selection benchmark: for each strategy, samples informed
//! per second and the latency of one trigger over all data informed, at 1M and
//! 10M samples (`--quick`: 100k and 1M), and each case's peak RSS.
//!
//! ```sh
//! cargo bench --bench selection              # 1M and 10M samples
//! cargo bench --bench selection -- --quick   # 100k and 1M
//! cargo bench --bench selection -- --only new_data,raw
//! ```
//!
//! Every case runs in its own child process (this binary with `--case`), so
//! its peak RSS (VmHWM of /proc/self/status) is its own; the RSS right after
//! opening the db is reported next to it, and the difference is what the case
//! added. The state db is a file in a temp dir (WAL, synchronous=NORMAL, as a
//! pipeline's), samples are informed in batches of 1024 inside transactions
//! of 100k samples, then one trigger (tail_triggers none: all data) builds a
//! set in partitions of `maximum_keys_in_memory` = 100k keys and commits.
//! The `raw` case inserts the same rows one by one with a plain prepared
//! INSERT into a table of the same shape: the baseline the informed rate is
//! compared with (ratio > 1: faster than the naive loop). Nothing is
//! asserted; the harness reports a table and `<target>/bench/selection.json`.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use udfchain::pipeline::Sample;
use udfchain::pipeline::{
    CoresetSampling, LimitReset, Presampling, PresamplingKind, SelectionConfig, StrategyKind,
};
use udfchain::testing::build_strategy;

const BATCH: usize = 1024;
const TXN: usize = 100_000;
const MAX_KEYS: usize = 100_000;
const LABELS: u64 = 10;
const TARGET_RATE: f64 = 1e6;
const TARGET_TRIGGER_S: f64 = 5.0;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    case: String,
    samples: u64,
    maximum_keys_in_memory: usize,
    inform_s: f64,
    samples_per_s: f64,
    /// samples_per_s / the raw insert loop's rate at the same size (same run).
    ratio_to_raw: Option<f64>,
    /// samples_per_s / the 1M samples/s target.
    ratio_to_target_rate: f64,
    trigger_s: f64,
    /// trigger_s / the 5 s target (below 1 meets it).
    ratio_to_target_trigger: f64,
    num_keys: u64,
    partitions: usize,
    /// Reading one partition back (keys + weights) after the trigger.
    read_partition_s: f64,
    rss_open_bytes: u64,
    peak_rss_bytes: u64,
    db_bytes: u64,
}

fn vm_hwm() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<u64>().ok())
            })
        })
        .map_or(0, |kb| kb * 1024)
}

fn config(case: &str, n: u64) -> Option<SelectionConfig> {
    let mut c = SelectionConfig {
        strategy: StrategyKind::NewData,
        maximum_keys_in_memory: MAX_KEYS,
        tail_triggers: None,
        limit: None,
        limit_reset: None,
        seed: Some(1),
        unused_ratio: None,
        presampling: None,
        score: None,
        k: None,
        sampling: None,
        warmup_triggers: None,
    };
    match case {
        "new_data" => {}
        "new_data_uniform" => {
            c.limit = Some(n / 2);
            c.limit_reset = Some(LimitReset::Uniform);
        }
        "freshness" => {
            c.strategy = StrategyKind::Freshness;
            c.unused_ratio = Some(0.5);
            c.limit = Some(n / 2);
        }
        "label_balanced" => {
            c.strategy = StrategyKind::LabelBalanced;
            c.limit = Some(n / 2);
        }
        "coreset" => {
            c.strategy = StrategyKind::Coreset;
            c.presampling = Some(Presampling {
                strategy: PresamplingKind::Random,
                ratio: 0.1,
            });
            c.score = Some("recency".into());
            c.k = Some(n / 100);
            c.sampling = Some(CoresetSampling::Proportional);
        }
        _ => return None,
    }
    Some(c)
}

fn open_db(path: &std::path::Path) -> rusqlite::Connection {
    let db = rusqlite::Connection::open(path).expect("open db");
    db.execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;")
        .expect("pragmas");
    db
}

fn sample(i: u64) -> Sample {
    // Keys are not in informed order (a pipeline assigns them per file).
    Sample {
        key: i.wrapping_mul(0x9E37_79B9) % (1 << 40),
        timestamp: 1_700_000_000 + (i / 100) as i64,
        label: (i % LABELS) as i64,
        features: None,
    }
}

/// One case in this process; prints its record as JSON.
fn run_case(case: &str, n: u64) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("state.db");
    let mut db = open_db(&path);
    let rss_open = vm_hwm();
    let mut batch = Vec::with_capacity(BATCH);
    let (inform_s, trigger_s, num_keys, partitions, read_s);
    if case == "raw" {
        db.execute_batch("CREATE TABLE t (seq INTEGER PRIMARY KEY, key INTEGER, ts INTEGER, label INTEGER, used INTEGER NOT NULL DEFAULT 0)").expect("create");
        let start = Instant::now();
        let mut i = 0;
        while i < n {
            let tx = db.transaction().expect("begin");
            {
                let mut st = tx
                    .prepare("INSERT INTO t (seq, key, ts, label) VALUES (?1, ?2, ?3, ?4)")
                    .expect("prepare");
                for j in i..(i + TXN as u64).min(n) {
                    let s = sample(j);
                    st.execute(rusqlite::params![
                        j as i64,
                        s.key as i64,
                        s.timestamp,
                        s.label
                    ])
                    .expect("insert");
                }
            }
            tx.commit().expect("commit");
            i += TXN as u64;
        }
        inform_s = start.elapsed().as_secs_f64();
        (trigger_s, num_keys, partitions, read_s) = (0.0, 0, 0, 0.0);
    } else {
        let cfg = config(case, n).expect("known case");
        let mut strategy = build_strategy(&cfg, None).expect("strategy");
        strategy.open(&db).expect("open");
        let start = Instant::now();
        let mut i = 0;
        while i < n {
            let tx = db.transaction().expect("begin");
            let end = (i + TXN as u64).min(n);
            while i < end {
                batch.clear();
                batch.extend((i..(i + BATCH as u64).min(end)).map(sample));
                strategy.inform(&tx, &batch).expect("inform");
                i += batch.len() as u64;
            }
            tx.commit().expect("commit");
        }
        inform_s = start.elapsed().as_secs_f64();
        let start = Instant::now();
        let tx = db.transaction().expect("begin");
        let info = strategy.trigger(&tx, 0).expect("trigger");
        tx.commit().expect("commit");
        trigger_s = start.elapsed().as_secs_f64();
        num_keys = info.num_keys;
        partitions = info.partition_sizes.len();
        let start = Instant::now();
        if partitions > 0 {
            let p = strategy
                .partition(&db, 0, partitions / 2)
                .expect("partition");
            std::hint::black_box(p);
        }
        read_s = start.elapsed().as_secs_f64();
    }
    let db_bytes = ["state.db", "state.db-wal"]
        .iter()
        .filter_map(|f| std::fs::metadata(dir.path().join(f)).ok())
        .map(|m| m.len())
        .sum();
    let rate = n as f64 / inform_s;
    let r = Record {
        case: case.to_string(),
        samples: n,
        maximum_keys_in_memory: MAX_KEYS,
        inform_s,
        samples_per_s: rate,
        ratio_to_raw: None,
        ratio_to_target_rate: rate / TARGET_RATE,
        trigger_s,
        ratio_to_target_trigger: trigger_s / TARGET_TRIGGER_S,
        num_keys,
        partitions,
        read_partition_s: read_s,
        rss_open_bytes: rss_open,
        peak_rss_bytes: vm_hwm(),
        db_bytes,
    };
    println!("RECORD {}", serde_json::to_string(&r).expect("json"));
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target"))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(i) = args.iter().position(|a| a == "--case") {
        let case = args.get(i + 1).expect("--case NAME N");
        let n: u64 = args
            .get(i + 2)
            .and_then(|s| s.parse().ok())
            .expect("--case NAME N");
        run_case(case, n);
        return;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let sizes: &[u64] = if quick {
        &[100_000, 1_000_000]
    } else {
        &[1_000_000, 10_000_000]
    };
    let all = [
        "raw",
        "new_data",
        "new_data_uniform",
        "freshness",
        "label_balanced",
        "coreset",
    ];
    let only: Option<Vec<String>> = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .map(|s| s.split(',').map(|w| w.trim().to_lowercase()).collect());
    let exe = std::env::current_exe().expect("own path");
    let mut records: Vec<Record> = Vec::new();
    println!(
        "{:<17} {:>10} {:>10} {:>8} {:>9} {:>10} {:>8} {:>10} {:>5} {:>9} {:>9} {:>9}",
        "case",
        "samples",
        "inform/s",
        "vs raw",
        "vs 1M/s",
        "trigger s",
        "vs 5 s",
        "keys",
        "parts",
        "read p s",
        "RSS open",
        "peak RSS"
    );
    for &n in sizes {
        for case in all {
            if only.as_ref().is_some_and(|o| !o.iter().any(|c| c == case)) {
                continue;
            }
            let out = Command::new(&exe)
                .args(["--case", case, &n.to_string()])
                .output()
                .expect("run a case");
            let text = String::from_utf8_lossy(&out.stdout);
            let Some(mut r) = text
                .lines()
                .find_map(|l| l.strip_prefix("RECORD "))
                .and_then(|j| serde_json::from_str::<Record>(j).ok())
            else {
                eprintln!(
                    "case {case} at {n} failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                continue;
            };
            r.ratio_to_raw = records
                .iter()
                .find(|b| b.case == "raw" && b.samples == n)
                .map(|b| r.samples_per_s / b.samples_per_s);
            let mb = |b: u64| format!("{:.0} MB", b as f64 / 1e6);
            println!(
                "{:<17} {:>10} {:>10.0} {:>8} {:>9.2} {:>10.3} {:>8.3} {:>10} {:>5} {:>9.4} {:>9} {:>9}",
                r.case,
                r.samples,
                r.samples_per_s,
                r.ratio_to_raw.map_or("-".into(), |x| format!("{x:.2}")),
                r.ratio_to_target_rate,
                r.trigger_s,
                r.ratio_to_target_trigger,
                r.num_keys,
                r.partitions,
                r.read_partition_s,
                mb(r.rss_open_bytes),
                mb(r.peak_rss_bytes),
            );
            records.push(r);
        }
    }
    let dir = target_dir().join("bench");
    let path = dir.join("selection.json");
    let written = std::fs::create_dir_all(&dir).and_then(|()| {
        std::fs::write(
            &path,
            serde_json::to_string_pretty(&serde_json::json!({
                "mode": if quick { "--quick" } else { "full" },
                "maximum_keys_in_memory": MAX_KEYS,
                "batch": BATCH,
                "records": records,
            }))
            .unwrap_or_default(),
        )
    });
    match written {
        Ok(()) => println!("records: {}", path.display()),
        Err(e) => eprintln!("could not write {}: {e}", path.display()),
    }
}
