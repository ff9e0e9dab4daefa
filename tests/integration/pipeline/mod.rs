//! Pipelines end to end, on real files with set mtimes, the real SQLite state
//! and the real `udfchain` binary: replays whose trigger sets are checked key
//! by key for each format, new-data semantics with shared timestamps, live mode
//! picking up files added while it runs, kill -9 and rerun, a failing hook,
//! config errors with their line, the saved sets read back as datasets.
//!
//! One file per behaviour (below); the helpers they share are here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use udfchain::pipeline::{PipelineConfig, TriggerRecord};
use udfchain::{Session, Settings};

mod cli;
mod config;
mod live;
mod recovery;
mod replay;
mod state_db;
mod triggers;

/// A base time (seconds since the epoch) for the generated files.
const T0: i64 = 1_700_000_000;

/// Writes `bytes` at `dir/rel` with mtime `ts` (seconds since the epoch),
/// atomically (written and dated elsewhere, then renamed in), as a store's PUT
/// is: a live pipeline listing the dir never sees a partial file.
fn put(dir: &Path, rel: &str, bytes: &[u8], ts: i64) {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let path = dir.join(rel);
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    let staging = dir.parent().expect("a parent dir").join(format!(
        ".put-{}-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::write(&staging, bytes).expect("write");
    set_mtime(&staging, ts);
    std::fs::rename(&staging, &path).expect("rename into place");
}

fn set_mtime(path: &Path, ts: i64) {
    let f = std::fs::File::options()
        .write(true)
        .open(path)
        .expect("open for mtime");
    f.set_modified(UNIX_EPOCH + Duration::from_secs(ts as u64))
        .expect("set mtime");
}

fn session(root: &Path) -> Arc<Session> {
    Session::with_settings(Settings::new().root(root).progress(false))
}

/// A row of a saved training set.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Row {
    key: u64,
    path: String,
    index: u64,
    timestamp: i64,
    label: i64,
    weight: f64,
    partition: u64,
}

/// (key, path, index, timestamp, label): one expected sample.
type Want = (u64, &'static str, u64, i64, i64);

/// Reads dataset `name` back and checks it holds exactly `want` (any order
/// inside a partition), weight 1, cut into partitions of `sizes`.
async fn check_set(session: &Arc<Session>, name: &str, want: &[Want], sizes: &[usize]) {
    let rows: Vec<Row> = session
        .from_dataset(name)
        .to_rows()
        .await
        .expect("read the set");
    let mut got: Vec<Want> = Vec::new();
    let mut per_partition: BTreeMap<u64, usize> = BTreeMap::new();
    for r in &rows {
        assert_eq!(r.weight, 1.0, "{r:?}");
        *per_partition.entry(r.partition).or_default() += 1;
        let path: &'static str = Box::leak(r.path.clone().into_boxed_str());
        got.push((r.key, path, r.index, r.timestamp, r.label));
    }
    got.sort();
    let mut want = want.to_vec();
    want.sort();
    assert_eq!(got, want, "set {name}");
    assert_eq!(
        per_partition.values().copied().collect::<Vec<_>>(),
        sizes,
        "partitions of {name}"
    );
    // Partitions are stored in order: 0, 1, 2, ...
    let order: Vec<u64> = rows.iter().map(|r| r.partition).collect();
    let mut sorted = order.clone();
    sorted.sort();
    assert_eq!(order, sorted);
}

/// (trigger_id, at, num_keys, partition_sizes, dataset) of a finished trigger.
type Seen = (u64, i64, u64, Vec<usize>, Option<String>);

fn records(done: &[TriggerRecord]) -> Vec<Seen> {
    done.iter()
        .map(|t| {
            (
                t.trigger_id,
                t.at,
                t.num_keys,
                t.partition_sizes.clone(),
                t.dataset.clone(),
            )
        })
        .collect()
}

fn csv_config(name: &str, data: &Path, trigger: &str, selection: &str) -> PipelineConfig {
    let yaml = format!(
        "name: {name}
data:
  uri: {}
  glob: \"*.csv\"
  format: {{csv: {{label_column: 1, header: true}}}}
  selector_batch_size: 3
trigger: {trigger}
selection: {selection}
",
        data.display()
    );
    PipelineConfig::from_yaml(&yaml, "test.yaml").expect("config")
}

/// Three CSV files (4 rows each, header, label = row % 3) at T0, T0+10, T0+20.
fn csv_files(dir: &Path) {
    for (i, name) in ["b.csv", "a.csv", "c.csv"].iter().enumerate() {
        let mut text = String::from("x,label\n");
        for r in 0..4 {
            text.push_str(&format!("{}.5,{}\n", i * 10 + r, (i + r) % 3));
        }
        put(dir, name, text.as_bytes(), T0 + 10 * i as i64);
    }
}

fn udfchain(root: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_udfchain"))
        .arg("--root")
        .arg(root)
        .args(args)
        .output()
        .expect("run udfchain")
}

/// Writes a CSV pipeline config (`hook`: the training command as YAML) and
/// eight one-row files at T0..T0+7 (labels 0 1 2 0 1 2 0 1).
fn cli_setup(dir: &Path, name: &str, hook: &str) -> PathBuf {
    let data = dir.join("data");
    for i in 0..8i64 {
        put(
            &data,
            &format!("f{i}.csv"),
            format!("x,label\n{i},{}\n", i % 3).as_bytes(),
            T0 + i,
        );
    }
    let config = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &config,
        format!(
            "name: {name}
data:
  uri: {}
  glob: \"*.csv\"
  format: {{csv: {{label_column: 1, header: true}}}}
  selector_batch_size: 3
trigger: {{amount: {{num_samples: 2}}}}
selection:
  strategy: new_data
  maximum_keys_in_memory: 3
  seed: 1
training:
  command: {hook}
",
            data.display()
        ),
    )
    .expect("write config");
    config
}
