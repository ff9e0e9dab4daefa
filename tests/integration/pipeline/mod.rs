//! Pipelines end to end, on real files with set mtimes, the real SQLite state
//! and the real `udfchain` binary: replays whose trigger sets are checked key
//! by key for each format, new-data semantics with shared timestamps, live mode
//! picking up files added while it runs, kill -9 and rerun, a failing hook,
//! config errors with their line, the saved sets read back as datasets.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use udfchain::pipeline::{Pipeline, PipelineConfig, StopHandle, TriggerRecord};
use udfchain::{File, Session, Settings, col};

use udfchain_testkit::stdout_ok as ok;

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

/// A config using every section docs/pipelines.md describes, with comments
/// in it as users write them.
const FULL_YAML: &str = r#"name: demo
data:
  uri: ./data                  # any udfchain URI
  glob: "*.csv"
  format: {csv: {label_column: 1, header: false}}   # columns counted from 0
    # or {single_sample: {label_file_ext: ".label"}}
    # or {binary: {record_size: 8, label_size: 4, byte_order: little}}
  timestamp: mtime             # or {column: 2} (seconds since the epoch)
  selector_batch_size: 128
trigger: {amount: {num_samples: 100}}   # or {time: {every: "1d"}} or {drift: {...}}
selection:
  strategy: new_data           # new_data | freshness | label_balanced | coreset
  maximum_keys_in_memory: 1000
  tail_triggers: 0             # omit for all data so far
  limit: 50                    # omit for no limit
  limit_reset: last            # last | uniform
  seed: 0
training:
  command: ["python3", "train.py"]   # optional; run at each trigger
"#;

#[test]
fn a_full_config_is_accepted_and_its_alternatives_too() {
    use udfchain::pipeline::{ByteOrder, Format, TimestampSource};
    let c = PipelineConfig::from_yaml(FULL_YAML, "demo.yaml").expect("the full config");
    assert_eq!(c.name, "demo");
    assert_eq!(c.data.uri, "./data");
    assert_eq!(c.data.glob.as_deref(), Some("*.csv"));
    assert!(matches!(&c.data.format, Format::Csv(f) if f.label_column == 1 && !f.header));
    assert_eq!(c.data.timestamp, TimestampSource::Mtime);
    assert_eq!(c.data.selector_batch_size, 128);
    assert_eq!(c.selection.maximum_keys_in_memory, 1000);
    assert_eq!(c.selection.tail_triggers, Some(0));
    assert_eq!(c.selection.limit, Some(50));
    assert_eq!(
        c.training.and_then(|t| t.command),
        Some(vec!["python3".to_string(), "train.py".to_string()])
    );
    let alt = FULL_YAML
        .replace(
            "format: {csv: {label_column: 1, header: false}}",
            "format: {binary: {record_size: 8, label_size: 4, byte_order: big}}",
        )
        .replace(
            "trigger: {amount: {num_samples: 100}}",
            "trigger: {time: {every: \"1d\"}}",
        );
    let c = PipelineConfig::from_yaml(&alt, "alt.yaml").expect("binary + time");
    assert!(matches!(&c.data.format, Format::Binary(b) if b.byte_order == ByteOrder::Big));
    let alt = FULL_YAML
        .replace(
            "format: {csv: {label_column: 1, header: false}}",
            "format: {single_sample: {label_file_ext: \".label\"}}",
        )
        .replace("timestamp: mtime ", "timestamp: {column: 2}");
    let err = PipelineConfig::from_yaml(&alt, "alt.yaml").expect_err("column needs csv");
    assert!(err.to_string().contains("needs the csv format"), "{err}");
}

#[test]
fn an_unknown_key_is_rejected_with_its_line() {
    let yaml = FULL_YAML.replace("  selector_batch_size: 128", "  selector_batch_sise: 128");
    let err = PipelineConfig::from_yaml(&yaml, "demo.yaml").expect_err("unknown key");
    let msg = err.to_string();
    assert!(
        msg.contains("demo.yaml: line 9") && msg.contains("selector_batch_sise"),
        "{msg}"
    );
    // Nested too: inside the selection and inside the format's enum.
    let yaml = FULL_YAML.replace("  seed: 0", "  sed: 0");
    let msg = PipelineConfig::from_yaml(&yaml, "demo.yaml")
        .expect_err("unknown key")
        .to_string();
    assert!(msg.contains("line 17") && msg.contains("sed"), "{msg}");
    let yaml = FULL_YAML.replace("header: false", "headers: false");
    let msg = PipelineConfig::from_yaml(&yaml, "demo.yaml")
        .expect_err("unknown key")
        .to_string();
    assert!(msg.contains("line 5") && msg.contains("headers"), "{msg}");
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

/// Amount triggers every 5 samples across batches of 3, new_data since the
/// last trigger, partitions of 2: keys follow (timestamp, path, row).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csv_replay_sets_key_by_key() {
    let root = tempfile::tempdir().expect("root");
    let data = tempfile::tempdir().expect("data");
    csv_files(data.path());
    let session = session(root.path());
    let config = csv_config(
        "csvs",
        data.path(),
        "{amount: {num_samples: 5}}",
        "{strategy: new_data, maximum_keys_in_memory: 2, tail_triggers: 0, seed: 7}",
    );
    let trained = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&trained);
    let done = Pipeline::new(config)
        .session(Arc::clone(&session))
        .on_trigger(move |t| {
            log.lock().expect("log").push(t.trigger_id);
            Ok(())
        })
        .replay(None, None)
        .await
        .expect("replay");
    // b.csv (T0) rows 0..4 = keys 0..3 (labels 0 1 2 0), a.csv (T0+10) keys
    // 4..7 (labels 1 2 0 1), c.csv (T0+20) keys 8..11 (labels 2 0 1 2).
    assert_eq!(
        records(&done),
        vec![
            (0, T0 + 10, 5, vec![2, 2, 1], Some("csvs-trigger-0".into())),
            (1, T0 + 20, 5, vec![2, 2, 1], Some("csvs-trigger-1".into())),
        ]
    );
    assert_eq!(*trained.lock().expect("log"), vec![0, 1]);
    check_set(
        &session,
        "csvs-trigger-0",
        &[
            (0, "b.csv", 0, T0, 0),
            (1, "b.csv", 1, T0, 1),
            (2, "b.csv", 2, T0, 2),
            (3, "b.csv", 3, T0, 0),
            (4, "a.csv", 0, T0 + 10, 1),
        ],
        &[2, 2, 1],
    )
    .await;
    check_set(
        &session,
        "csvs-trigger-1",
        &[
            (5, "a.csv", 1, T0 + 10, 2),
            (6, "a.csv", 2, T0 + 10, 0),
            (7, "a.csv", 3, T0 + 10, 1),
            (8, "c.csv", 0, T0 + 20, 2),
            (9, "c.csv", 1, T0 + 20, 0),
        ],
        &[2, 2, 1],
    )
    .await;
}

/// Binary records, label first, both byte orders; all data so far with a
/// limit of the newest 4.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_replay_sets_key_by_key() {
    for (order, big) in [("little", false), ("big", true)] {
        let root = tempfile::tempdir().expect("root");
        let data = tempfile::tempdir().expect("data");
        // 3 records of 6 bytes (2-byte label + 4 bytes) per file.
        for (f, ts) in [("r0.bin", T0), ("r1.bin", T0 + 1)] {
            let mut bytes = Vec::new();
            for r in 0..3u16 {
                let label = 300 + r + if f == "r1.bin" { 10 } else { 0 };
                let l = if big {
                    label.to_be_bytes()
                } else {
                    label.to_le_bytes()
                };
                bytes.extend_from_slice(&l);
                bytes.extend_from_slice(&[9, 9, 9, 9]);
            }
            put(data.path(), f, &bytes, ts);
        }
        let yaml = format!(
            "name: bins
data:
  uri: {}
  format: {{binary: {{record_size: 6, label_size: 2, byte_order: {order}}}}}
  selector_batch_size: 2
trigger: {{amount: {{num_samples: 3}}}}
selection: {{strategy: new_data, maximum_keys_in_memory: 3, limit: 4, limit_reset: last}}
",
            data.path().display()
        );
        let session = session(root.path());
        let done = Pipeline::from_yaml(&yaml)
            .expect("config")
            .session(Arc::clone(&session))
            .replay(None, None)
            .await
            .expect("replay");
        assert_eq!(done.len(), 2);
        check_set(
            &session,
            "bins-trigger-0",
            &[
                (0, "r0.bin", 0, T0, 300),
                (1, "r0.bin", 1, T0, 301),
                (2, "r0.bin", 2, T0, 302),
            ],
            &[3],
        )
        .await;
        // All 6 so far, limited to the newest 4.
        check_set(
            &session,
            "bins-trigger-1",
            &[
                (2, "r0.bin", 2, T0, 302),
                (3, "r1.bin", 0, T0 + 1, 310),
                (4, "r1.bin", 1, T0 + 1, 311),
                (5, "r1.bin", 2, T0 + 1, 312),
            ],
            &[3, 1],
        )
        .await;
    }
}

/// One sample per file, labels from sibling files or from the parent dir; a
/// time trigger whose boundaries fall in a gap fires once per boundary (the
/// second one empty: skipped, no dataset); the `file` column reads the bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_sample_replay_with_time_trigger() {
    for by_dir in [false, true] {
        let root = tempfile::tempdir().expect("root");
        let data = tempfile::tempdir().expect("data");
        let samples = [("s0", 4, 0), ("s1", 5, 3), ("s2", 4, 12), ("s3", 6, 35)];
        for (name, label, dt) in samples {
            let rel = if by_dir {
                format!("{label}/{name}.img")
            } else {
                format!("{name}.img")
            };
            put(
                data.path(),
                &rel,
                format!("bytes of {name}").as_bytes(),
                T0 + dt,
            );
            if !by_dir {
                put(
                    data.path(),
                    &format!("{name}.label"),
                    format!("{label}\n").as_bytes(),
                    T0,
                );
            }
        }
        let format = if by_dir {
            "{single_sample: {}}"
        } else {
            "{single_sample: {label_file_ext: \".label\"}}"
        };
        let yaml = format!(
            "name: imgs
data: {{uri: {}, format: {format}, selector_batch_size: 10}}
trigger: {{time: {{every: 10s}}}}
selection: {{strategy: new_data, maximum_keys_in_memory: 8, tail_triggers: 0}}
",
            data.path().display()
        );
        let session = session(root.path());
        let trained = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&trained);
        let done = Pipeline::from_yaml(&yaml)
            .expect("config")
            .session(Arc::clone(&session))
            .on_trigger(move |t| {
                log.lock().expect("log").push(t.trigger_id);
                Ok(())
            })
            .replay(None, None)
            .await
            .expect("replay");
        // Boundaries T0+10 (before s2), T0+20 and T0+30 (both before s3).
        assert_eq!(
            records(&done),
            vec![
                (0, T0 + 3, 2, vec![2], Some("imgs-trigger-0".into())),
                (1, T0 + 12, 1, vec![1], Some("imgs-trigger-1".into())),
                (2, T0 + 12, 0, vec![], None),
            ],
            "by_dir={by_dir}"
        );
        assert_eq!(
            *trained.lock().expect("log"),
            vec![0, 1],
            "empty sets skip training"
        );
        let p = |n: &str, l: i64| -> &'static str {
            let s = if by_dir {
                format!("{l}/{n}.img")
            } else {
                format!("{n}.img")
            };
            Box::leak(s.into_boxed_str())
        };
        check_set(
            &session,
            "imgs-trigger-0",
            &[(0, p("s0", 4), 0, T0, 4), (1, p("s1", 5), 0, T0 + 3, 5)],
            &[2],
        )
        .await;
        check_set(
            &session,
            "imgs-trigger-1",
            &[(2, p("s2", 4), 0, T0 + 12, 4)],
            &[1],
        )
        .await;
        assert!(
            session
                .catalog()
                .expect("catalog")
                .get("imgs-trigger-2", None)
                .is_err()
        );
        // The file column reads each sample's bytes, as the loader does.
        let mut read: Vec<KeyBytes> = session
            .from_dataset("imgs-trigger-0")
            .map("bytes", |f: File| async move {
                f.read()
                    .await
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
            })
            .select([col("key"), col("label"), col("bytes")])
            .to_rows()
            .await
            .expect("read the files");
        read.sort_by_key(|r| r.key);
        assert_eq!(
            read,
            vec![
                KeyBytes {
                    key: 0,
                    label: 4,
                    bytes: "bytes of s0".into()
                },
                KeyBytes {
                    key: 1,
                    label: 5,
                    bytes: "bytes of s1".into()
                },
            ]
        );
    }
}

#[derive(Debug, PartialEq, Deserialize, Serialize)]
struct KeyBytes {
    key: u64,
    label: i64,
    bytes: String,
}

/// A file sharing the watermark's timestamp with ingested files is new; the
/// ingested files are not read again; a file older than the watermark is not
/// new data. Replay bounds are inclusive and a later run continues after them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_data_shares_timestamps_and_replay_bounds_are_inclusive() {
    let root = tempfile::tempdir().expect("root");
    let data = tempfile::tempdir().expect("data");
    let one = |label: i64| format!("x,label\n0,{label}\n");
    put(data.path(), "a.csv", one(1).as_bytes(), T0 + 5);
    put(data.path(), "b.csv", one(2).as_bytes(), T0 + 5);
    put(data.path(), "c.csv", one(3).as_bytes(), T0 + 8);
    let session = session(root.path());
    let pipeline = || {
        Pipeline::new(csv_config(
            "fresh",
            data.path(),
            "{amount: {num_samples: 1}}",
            "{strategy: new_data, maximum_keys_in_memory: 10, tail_triggers: 0}",
        ))
        .session(Arc::clone(&session))
    };
    // [.., T0+5]: a and b (keys 0, 1); c waits.
    let done = pipeline().replay(None, Some(T0 + 5)).await.expect("replay");
    assert_eq!(
        done.iter()
            .map(|t| (t.trigger_id, t.at))
            .collect::<Vec<_>>(),
        vec![(0, T0 + 5), (1, T0 + 5)]
    );
    // d shares c's timestamp (the watermark), e is older than it.
    put(data.path(), "d.csv", one(4).as_bytes(), T0 + 8);
    put(data.path(), "e.csv", one(5).as_bytes(), T0 + 7);
    // Rewriting a's content keeps it ingested: it is never read again.
    put(data.path(), "a.csv", b"x,label\n0,99\n0,98\n", T0 + 8);
    let done = pipeline().replay(Some(T0 + 6), None).await.expect("replay");
    assert_eq!(
        done.iter()
            .map(|t| (t.trigger_id, t.at, t.num_keys))
            .collect::<Vec<_>>(),
        vec![(2, T0 + 8, 1), (3, T0 + 8, 1)]
    );
    check_set(
        &session,
        "fresh-trigger-2",
        &[(2, "c.csv", 0, T0 + 8, 3)],
        &[1],
    )
    .await;
    check_set(
        &session,
        "fresh-trigger-3",
        &[(3, "d.csv", 0, T0 + 8, 4)],
        &[1],
    )
    .await;
    // Nothing new: nothing happens.
    assert!(
        pipeline()
            .replay(None, None)
            .await
            .expect("replay")
            .is_empty()
    );
}

/// Live mode lists storage every poll interval and triggers on files written
/// while it runs; stopping returns what it finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_mode_picks_up_files_added_while_it_runs() {
    let root = tempfile::tempdir().expect("root");
    let data = tempfile::tempdir().expect("data");
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64;
    put(data.path(), "f0.csv", b"x,label\n0,0\n1,1\n", now);
    let mut config = csv_config(
        "live",
        data.path(),
        "{amount: {num_samples: 3}}",
        "{strategy: new_data, maximum_keys_in_memory: 10, tail_triggers: 0}",
    );
    config.data.poll_interval = Some("100ms".into());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let pipeline = Pipeline::new(config)
        .session(session(root.path()))
        .on_completed(move |t| {
            let _ = tx.send(t.clone());
        });
    let stop = StopHandle::new();
    let run = tokio::spawn({
        let stop = stop.clone();
        async move { pipeline.run_live(stop).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(rx.try_recv().is_err(), "2 samples: no trigger yet");
    put(data.path(), "f1.csv", b"x,label\n2,2\n", now + 1);
    let t0 = next_trigger(&mut rx).await;
    assert_eq!((t0.trigger_id, t0.num_keys, t0.at), (0, 3, now + 1));
    put(
        data.path(),
        "f2.csv",
        b"x,label\n3,0\n4,1\n5,2\n6,0\n",
        now + 2,
    );
    let t1 = next_trigger(&mut rx).await;
    assert_eq!((t1.trigger_id, t1.num_keys, t1.at), (1, 3, now + 2));
    stop.stop();
    let done = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("stops")
        .expect("joined")
        .expect("live run");
    assert_eq!(done.len(), 2);
}

async fn next_trigger(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<TriggerRecord>,
) -> TriggerRecord {
    tokio::time::timeout(Duration::from_secs(30), rx.recv())
        .await
        .expect("a trigger in time")
        .expect("running")
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

#[test]
fn cli_run_prints_one_json_line_per_trigger_and_ls_show_keys() {
    let dir = tempfile::tempdir().expect("dir");
    let root = dir.path().join("root");
    let log = dir.path().join("hook.log");
    let hook = format!(
        "[\"sh\", \"-c\", \"echo $UDFCHAIN_PIPELINE $UDFCHAIN_TRIGGER_ID $UDFCHAIN_DATASET $UDFCHAIN_FLIGHT_ADDR >> {}; echo noise\"]",
        log.display()
    );
    let config = cli_setup(dir.path(), "demo", &hook);
    let cfg = config.to_str().expect("utf8");
    // Up to T0+5 (RFC 3339), at most 2 triggers.
    let out = ok(&udfchain(
        &root,
        &[
            "pipeline",
            "run",
            cfg,
            "--replay-to",
            "2023-11-14T22:13:25Z",
            "--max-triggers",
            "2",
            "--flight-addr",
            "127.0.0.1:50051",
        ],
    ));
    assert_eq!(
        out,
        format!(
            "{{\"trigger_id\":0,\"at\":{},\"num_keys\":2,\"num_partitions\":1,\"partition_sizes\":[2],\"dataset\":\"demo-trigger-0\"}}\n\
             {{\"trigger_id\":1,\"at\":{},\"num_keys\":4,\"num_partitions\":2,\"partition_sizes\":[3,1],\"dataset\":\"demo-trigger-1\"}}\n",
            T0 + 1,
            T0 + 3
        )
    );
    // The rest up to T0+5 (2023-11-14T22:13:25Z = T0+5): trigger 2 after key 5.
    let out = ok(&udfchain(
        &root,
        &["pipeline", "run", cfg, "--replay-to", &(T0 + 5).to_string()],
    ));
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(out.starts_with("{\"trigger_id\":2,"), "{out}");
    assert_eq!(
        std::fs::read_to_string(&log).expect("hook log"),
        "demo 0 demo-trigger-0 127.0.0.1:50051\ndemo 1 demo-trigger-1 127.0.0.1:50051\ndemo 2 demo-trigger-2\n"
    );
    let ls = ok(&udfchain(&root, &["pipeline", "ls"]));
    assert_eq!(ls, "demo\ttriggers=3\tpending=0\tsamples=8\n");
    let show = ok(&udfchain(&root, &["pipeline", "show", "demo"]));
    assert!(show.starts_with("config:\n  name: demo\n"), "{show}");
    assert!(
        show.contains("\"trigger_id\":2") && show.contains("\"status\":\"done\""),
        "{show}"
    );
    // Trigger 1 holds every key so far (0..3), partitions of 3 then 1.
    let keys = ok(&udfchain(
        &root,
        &["pipeline", "keys", "demo", "1", "--format", "csv"],
    ));
    let mut lines: Vec<&str> = keys.lines().collect();
    assert_eq!(lines.remove(0), "key,path,index,timestamp,label,weight");
    lines.sort();
    assert_eq!(
        lines,
        (0..4)
            .map(|i| format!("{i},f{i}.csv,0,{},{},1", T0 + i, i % 3))
            .collect::<Vec<_>>()
    );
    let p1 = ok(&udfchain(
        &root,
        &["pipeline", "keys", "demo", "1", "--partition", "1"],
    ));
    assert_eq!(p1.lines().count(), 2, "{p1}");
    let bad = udfchain(
        &root,
        &["pipeline", "keys", "demo", "1", "--partition", "2"],
    );
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("has 2 partition(s), no partition 2"),
        "{bad:?}"
    );
    let missing = udfchain(&root, &["pipeline", "show", "dem"]);
    assert!(String::from_utf8_lossy(&missing.stderr).contains("did you mean demo?"));
}

/// A failing hook stops the run with an error naming the trigger and the
/// exit status; the trigger stays pending and a rerun retries it.
#[test]
fn a_failing_hook_stops_the_pipeline_and_a_rerun_retries_it() {
    let dir = tempfile::tempdir().expect("dir");
    let root = dir.path().join("root");
    let flag = dir.path().join("fail");
    std::fs::write(&flag, "").expect("flag");
    let hook = format!(
        "[\"sh\", \"-c\", \"test $UDFCHAIN_TRIGGER_ID != 1 || ! test -e {} || exit 3\"]",
        flag.display()
    );
    let config = cli_setup(dir.path(), "flaky", &hook);
    let cfg = config.to_str().expect("utf8");
    let out = udfchain(&root, &["pipeline", "run", cfg]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("pipeline flaky: training hook of trigger 1 failed")
            && err.contains("exit status: 3"),
        "{err}"
    );
    // Trigger 0 was printed and recorded; 1 is pending.
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    let show = ok(&udfchain(&root, &["pipeline", "show", "flaky"]));
    assert!(show.contains("\"status\":\"pending\""), "{show}");
    std::fs::remove_file(&flag).expect("unflag");
    let out = ok(&udfchain(&root, &["pipeline", "run", cfg]));
    let ids: Vec<u64> = out
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).expect("json")["trigger_id"]
                .as_u64()
                .expect("id")
        })
        .collect();
    assert_eq!(ids, vec![1, 2, 3]);
    let datasets = session(&root)
        .catalog()
        .expect("catalog")
        .list()
        .expect("list");
    assert_eq!(
        datasets
            .iter()
            .filter(|d| d.name == "flaky-trigger-1")
            .count(),
        1,
        "one version of the retried trigger's set"
    );
}

/// The CLI killed with SIGKILL at several points (early, mid-run, and inside
/// the hooks of triggers 1 and 3) and run again: every trigger is recorded
/// exactly once, none is printed twice, and each set equals the one an
/// uninterrupted run computes, key by key and in order.
#[test]
fn kill_9_and_rerun_repeat_and_lose_no_trigger() {
    let dir = tempfile::tempdir().expect("dir");
    let root = dir.path().join("root");
    let log = dir.path().join("hook.log");
    let d = dir.path().display();
    for k in [1, 3] {
        std::fs::write(dir.path().join(format!("block-{k}")), "").expect("block");
    }
    // The first attempt of a blocked trigger's hook waits to be killed.
    let hook = format!(
        "[\"sh\", \"-c\", \"echo start $UDFCHAIN_TRIGGER_ID >> {d}/hook.log; \
         if [ -e {d}/block-$UDFCHAIN_TRIGGER_ID ]; then rm {d}/block-$UDFCHAIN_TRIGGER_ID; \
         echo $$ > {d}/hookpid; touch {d}/blocked; exec sleep 60; fi; \
         echo end $UDFCHAIN_TRIGGER_ID >> {d}/hook.log\"]"
    );
    let config = cli_setup(dir.path(), "durable", &hook);
    let cfg = config.to_str().expect("utf8");
    let blocked = dir.path().join("blocked");
    let mut printed: Vec<u64> = Vec::new();
    let mut kills = 0;
    let early = [Duration::from_millis(30), Duration::from_millis(250)];
    for attempt in 0.. {
        assert!(attempt < 12, "the pipeline never finished");
        let mut child = Command::new(env!("CARGO_BIN_EXE_udfchain"))
            .arg("--root")
            .arg(&root)
            .args(["pipeline", "run", cfg])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn");
        let started = std::time::Instant::now();
        let killed = loop {
            if let Some(status) = child.try_wait().expect("wait") {
                assert!(status.success(), "run {attempt} failed: {status}");
                break false;
            }
            let due = early.get(attempt).is_some_and(|d| started.elapsed() >= *d);
            if due || blocked.exists() {
                child.kill().expect("SIGKILL");
                child.wait().expect("reap");
                if blocked.exists() {
                    let pid = std::fs::read_to_string(dir.path().join("hookpid")).expect("pid");
                    let _ = Command::new("kill").args(["-9", pid.trim()]).status();
                    std::fs::remove_file(&blocked).expect("unblock");
                }
                kills += 1;
                break true;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let mut out = String::new();
        std::io::Read::read_to_string(&mut child.stdout.take().expect("stdout"), &mut out)
            .expect("stdout");
        for line in out.lines() {
            let v: serde_json::Value = serde_json::from_str(line).expect("json line");
            printed.push(v["trigger_id"].as_u64().expect("id"));
        }
        if !killed {
            break;
        }
    }
    assert!(kills >= 2, "killed inside both hooks");
    let mut unique = printed.clone();
    unique.dedup();
    assert_eq!(printed, unique, "no trigger printed twice: {printed:?}");
    let show = ok(&udfchain(&root, &["pipeline", "show", "durable"]));
    let states: Vec<(u64, String)> = show
        .lines()
        .filter(|l| l.starts_with("  {"))
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l.trim()).expect("json");
            (
                v["trigger_id"].as_u64().expect("id"),
                v["status"].as_str().expect("status").to_string(),
            )
        })
        .collect();
    assert_eq!(
        states,
        (0..4).map(|i| (i, "done".to_string())).collect::<Vec<_>>()
    );
    let hook_log = std::fs::read_to_string(&log).expect("log");
    for k in [1, 3] {
        assert_eq!(
            hook_log.matches(&format!("end {k}\n")).count(),
            1,
            "trigger {k} trained once after its kill: {hook_log}"
        );
    }
    // The same sets as a run never killed, key by key in order.
    let reference = dir.path().join("reference-root");
    let plain = cli_setup(&dir.path().join("ref"), "durable", "[\"true\"]");
    ok(&udfchain(
        &reference,
        &["pipeline", "run", plain.to_str().expect("utf8")],
    ));
    for t in 0..4 {
        let t = t.to_string();
        let want = ok(&udfchain(&reference, &["pipeline", "keys", "durable", &t]));
        let got = ok(&udfchain(&root, &["pipeline", "keys", "durable", &t]));
        // Paths are relative to each run's data dir: equal.
        assert_eq!(got, want, "trigger {t}");
    }
    let datasets = session(&root)
        .catalog()
        .expect("catalog")
        .list()
        .expect("list");
    let mut names: Vec<(String, u32)> = datasets.into_iter().map(|d| (d.name, d.version)).collect();
    names.sort();
    assert_eq!(
        names.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>(),
        (0..4)
            .map(|i| format!("durable-trigger-{i}"))
            .collect::<Vec<_>>(),
        "one version per trigger: {names:?}"
    );
    // Triggers 1 and 3 were saved, then killed in their hook: the rerun
    // removed that save and saved again under a new number (never reused).
    for k in [1, 3] {
        assert!(names[k].1 >= 2, "trigger {k}: {names:?}");
    }
}

/// Samples on the S3 server, timestamps from a column (interleaved across
/// files: keys follow time, not files), and a drift trigger on a feature
/// column that the supervisor fills: the first evaluation fires, a small
/// shift (KS 1/3) does not, a large one (KS 1) does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_csv_with_column_timestamps_and_a_drift_trigger() {
    let s3 = udfchain_testkit::S3Server::start();
    let root = tempfile::tempdir().expect("root");
    let dir = s3.bucket_dir().join("p");
    // (feature, timestamp) per row; the label is the file's number.
    let files = [
        ("a.csv", [(1.0, 100), (1.5, 103), (10.0, 106)]),
        ("b.csv", [(2.0, 101), (2.5, 104), (11.0, 107)]),
        ("c.csv", [(3.0, 102), (2.0, 105), (12.0, 108)]),
    ];
    for (label, (name, rows)) in files.iter().enumerate() {
        let text: String = rows
            .iter()
            .map(|(f, ts)| format!("{f},{label},{ts}\n"))
            .collect();
        put(&dir, name, text.as_bytes(), T0);
    }
    let yaml = "name: drifty
data:
  uri: s3://bucket/p
  format: {csv: {label_column: 1}}
  timestamp: {column: 2}
  selector_batch_size: 2
trigger: {drift: {reference_size: 3, current_size: 3, metric: ks, threshold: 0.5, feature: {column: 0}}}
selection: {strategy: new_data, maximum_keys_in_memory: 4, tail_triggers: 0}
";
    let session = Session::with_settings(s3.settings().root(root.path()).progress(false));
    let done = Pipeline::from_yaml(yaml)
        .expect("config")
        .session(Arc::clone(&session))
        .replay(None, None)
        .await
        .expect("replay");
    assert_eq!(
        records(&done),
        vec![
            (0, 102, 3, vec![3], Some("drifty-trigger-0".into())),
            (1, 108, 6, vec![4, 2], Some("drifty-trigger-1".into())),
        ]
    );
    check_set(
        &session,
        "drifty-trigger-0",
        &[
            (0, "a.csv", 0, 100, 0),
            (1, "b.csv", 0, 101, 1),
            (2, "c.csv", 0, 102, 2),
        ],
        &[3],
    )
    .await;
    check_set(
        &session,
        "drifty-trigger-1",
        &[
            (3, "a.csv", 1, 103, 0),
            (4, "b.csv", 1, 104, 1),
            (5, "c.csv", 1, 105, 2),
            (6, "a.csv", 2, 106, 0),
            (7, "b.csv", 2, 107, 1),
            (8, "c.csv", 2, 108, 2),
        ],
        &[4, 2],
    )
    .await;
}

/// `pipeline run --live` picks up files written while it runs and stops
/// cleanly on Ctrl-C (SIGINT): exit 0, one JSON line per trigger.
#[test]
fn cli_live_run_stops_on_ctrl_c() {
    let dir = tempfile::tempdir().expect("dir");
    let root = dir.path().join("root");
    let config = cli_setup(dir.path(), "watch", "[\"true\"]");
    let data = dir.path().join("data");
    let mut child = Command::new(env!("CARGO_BIN_EXE_udfchain"))
        .arg("--root")
        .arg(&root)
        .args(["pipeline", "run", config.to_str().expect("utf8"), "--live"])
        .args(["--poll-interval", "100ms"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut done = |n: usize| {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let show = udfchain(&root, &["pipeline", "show", "watch"]);
            let text = String::from_utf8_lossy(&show.stdout);
            if text.matches("\"status\":\"done\"").count() >= n {
                return;
            }
            // Say what `show` and the live run said, should this ever time out.
            assert!(
                std::time::Instant::now() < deadline,
                "{n} triggers in time: show exited {:?}, stdout {text:?}, stderr {:?}; \
                 files in the data dir: {:?}; the live run: {:?}",
                show.status,
                String::from_utf8_lossy(&show.stderr),
                std::fs::read_dir(&data).map(|d| d.count()).ok(),
                child.try_wait(),
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    // 8 files: 4 triggers of 2; a 9th and 10th file make a 5th.
    done(4);
    let now = T0 + 100;
    put(&data, "g0.csv", b"x,label\n8,1\n", now);
    put(&data, "g1.csv", b"x,label\n9,2\n", now);
    done(5);
    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-INT", &pid])
            .status()
            .expect("kill")
            .success()
    );
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let ids: Vec<u64> = stdout
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).expect("json")["trigger_id"]
                .as_u64()
                .expect("id")
        })
        .collect();
    assert_eq!(ids, vec![0, 1, 2, 3, 4]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("stopping the pipeline"),
        "{out:?}"
    );
}

/// coreset's offline selection with a Rust scoring function given to the
/// pipeline: at each trigger, the k = 2 best-scored candidates of all data so far.
struct LabelThenKey;

impl udfchain::pipeline::ScoreFn for LabelThenKey {
    fn score(&self, candidates: &[udfchain::pipeline::Sample]) -> udfchain::Result<Vec<f64>> {
        Ok(candidates
            .iter()
            .map(|s| (s.label * 10) as f64 + s.key as f64)
            .collect())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coreset_with_a_rust_score_fn() {
    let root = tempfile::tempdir().expect("root");
    let data = tempfile::tempdir().expect("data");
    csv_files(data.path());
    let session = session(root.path());
    let config = csv_config(
        "scored",
        data.path(),
        "{amount: {num_samples: 6}}",
        "{strategy: coreset, maximum_keys_in_memory: 4, k: 2, sampling: top_k}",
    );
    let done = Pipeline::new(config)
        .session(Arc::clone(&session))
        .score_fn(Arc::new(LabelThenKey))
        .replay(None, None)
        .await
        .expect("replay");
    assert_eq!(done.len(), 2);
    // Keys 0..5 have labels 0 1 2 0 1 2: the best are 5 (25) and 2 (22).
    check_set(
        &session,
        "scored-trigger-0",
        &[(2, "b.csv", 2, T0, 2), (5, "a.csv", 1, T0 + 10, 2)],
        &[2],
    )
    .await;
    // Keys 6..11 have labels 0 1 2 0 1 2: the best of all are 11 (31) and 8 (28).
    check_set(
        &session,
        "scored-trigger-1",
        &[(8, "c.csv", 0, T0 + 20, 2), (11, "c.csv", 3, T0 + 20, 2)],
        &[2],
    )
    .await;
}

/// Ctrl-C at a terminal (SIGINT to the whole foreground process group) while
/// a hook trains: the hook, in its own group, finishes; the pipeline records
/// that trigger and stops with exit 0 before the next one.
#[test]
fn ctrl_c_lets_the_running_hook_finish() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().expect("dir");
    let root = dir.path().join("root");
    let d = dir.path().display();
    let hook = format!(
        "[\"sh\", \"-c\", \"touch {d}/running; sleep 1; echo trained $UDFCHAIN_TRIGGER_ID >> {d}/log\"]"
    );
    let config = cli_setup(dir.path(), "patient", &hook);
    let child = Command::new(env!("CARGO_BIN_EXE_udfchain"))
        .arg("--root")
        .arg(&root)
        .args(["pipeline", "run", config.to_str().expect("utf8")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("spawn");
    let running = dir.path().join("running");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !running.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the hook never started"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let group = format!("-{}", child.id());
    assert!(
        Command::new("kill")
            .args(["-INT", "--", &group])
            .status()
            .expect("kill")
            .success()
    );
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(stdout.starts_with("{\"trigger_id\":0,"), "{stdout}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("log")).expect("log"),
        "trained 0\n"
    );
}

/// A Rust training callback that fails stops the replay with an error naming
/// the trigger; a rerun retries it. A pipeline's data, trigger or selection
/// config cannot change under its state; its poll interval can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_callback_and_a_changed_config() {
    let root = tempfile::tempdir().expect("root");
    let data = tempfile::tempdir().expect("data");
    csv_files(data.path());
    let session = session(root.path());
    let config = || {
        csv_config(
            "cb",
            data.path(),
            "{amount: {num_samples: 4}}",
            "{strategy: new_data, maximum_keys_in_memory: 4, tail_triggers: 0}",
        )
    };
    let err = Pipeline::new(config())
        .session(Arc::clone(&session))
        .on_trigger(|t| {
            if t.trigger_id == 1 {
                Err(udfchain::Error::Plan("out of GPUs".into()))
            } else {
                Ok(())
            }
        })
        .replay(None, None)
        .await
        .expect_err("the callback fails");
    let msg = err.to_string();
    assert!(
        msg.contains("pipeline cb: training hook of trigger 1 failed: invalid chain: out of GPUs"),
        "{msg}"
    );
    let mut changed = config();
    changed.trigger = csv_config(
        "cb",
        data.path(),
        "{amount: {num_samples: 5}}",
        "{strategy: new_data, maximum_keys_in_memory: 4}",
    )
    .trigger;
    let err = Pipeline::new(changed)
        .session(Arc::clone(&session))
        .replay(None, None)
        .await
        .expect_err("another trigger");
    assert!(
        err.to_string()
            .contains("another data, trigger or selection config"),
        "{err}"
    );
    let mut polled = config();
    polled.data.poll_interval = Some("1s".into());
    let done = Pipeline::new(polled)
        .session(Arc::clone(&session))
        .replay(None, None)
        .await
        .expect("rerun");
    assert_eq!(
        done.iter().map(|t| t.trigger_id).collect::<Vec<_>>(),
        vec![1, 2],
        "trigger 1 retried, then 2"
    );
}

/// A drift trigger on embeddings from a Rust UDF (MMD): the UDF gets each
/// binary record's bytes after its label once, when the sample is ingested;
/// the first evaluation fires, a window equal to the reference does not, a
/// shifted one does. A feature UDF the pipeline does not have is a clear error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_on_embeddings_from_a_feature_udf() {
    let root = tempfile::tempdir().expect("root");
    let data = tempfile::tempdir().expect("data");
    // 9 records: 4-byte label, then two u16 coordinates.
    let points: [(u16, u16); 9] = [
        (0, 0),
        (1, 0),
        (0, 1),
        (0, 0),
        (1, 0),
        (0, 1),
        (100, 100),
        (101, 100),
        (100, 101),
    ];
    let mut bytes = Vec::new();
    for (i, (x, y)) in points.iter().enumerate() {
        bytes.extend_from_slice(&(i as u32 % 2).to_le_bytes());
        bytes.extend_from_slice(&x.to_le_bytes());
        bytes.extend_from_slice(&y.to_le_bytes());
    }
    put(data.path(), "points.bin", &bytes, T0);
    let yaml = format!(
        "name: embed
data:
  uri: {}
  format: {{binary: {{record_size: 8, label_size: 4, byte_order: little}}}}
  selector_batch_size: 4
trigger: {{drift: {{reference_size: 3, current_size: 3, metric: mmd, threshold: 0.5, bandwidth: 1.0, feature: {{udf: xy}}}}}}
selection: {{strategy: new_data, maximum_keys_in_memory: 10, tail_triggers: 0}}
",
        data.path().display()
    );
    let session = session(root.path());
    let err = Pipeline::from_yaml(&yaml)
        .expect("config")
        .session(Arc::clone(&session))
        .feature_fn("other", |_| Ok(vec![0.0]))
        .replay(None, None)
        .await
        .expect_err("no UDF xy");
    let msg = err.to_string();
    assert!(msg.contains("\"xy\"") && msg.contains("other"), "{msg}");

    let calls = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&calls);
    let done = Pipeline::from_yaml(&yaml)
        .expect("config")
        .session(Arc::clone(&session))
        .feature_fn("xy", move |b: &[u8]| {
            seen.lock().expect("calls").push(b.to_vec());
            let [x0, x1, y0, y1] = <[u8; 4]>::try_from(b).map_err(|_| format!("{b:?}"))?;
            Ok(vec![
                u16::from_le_bytes([x0, x1]) as f32,
                u16::from_le_bytes([y0, y1]) as f32,
            ])
        })
        .replay(None, None)
        .await
        .expect("replay");
    assert_eq!(
        records(&done),
        vec![
            (0, T0, 3, vec![3], Some("embed-trigger-0".into())),
            (1, T0, 6, vec![6], Some("embed-trigger-1".into())),
        ]
    );
    // Once per sample, with the record's bytes after the label.
    let calls = calls.lock().expect("calls").clone();
    assert_eq!(calls.len(), 9);
    assert_eq!(calls[6], [100, 0, 100, 0]);
}

/// A scoring function that notes the thread of each call: it runs inside the
/// transaction that computes a trigger's set.
struct ThreadNoter(Arc<std::sync::Mutex<Vec<std::thread::ThreadId>>>);

impl udfchain::pipeline::ScoreFn for ThreadNoter {
    fn score(&self, candidates: &[udfchain::pipeline::Sample]) -> udfchain::Result<Vec<f64>> {
        self.0
            .lock()
            .expect("threads")
            .push(std::thread::current().id());
        Ok(candidates.iter().map(|s| s.key as f64).collect())
    }
}

#[test]
fn the_state_db_transactions_run_off_the_async_runtime() {
    // A current-thread runtime: its only worker is this thread, so work done
    // on a worker runs here and work on the blocking pool elsewhere.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let root = tempfile::tempdir().expect("root");
    let data = tempfile::tempdir().expect("data");
    csv_files(data.path());
    let config = csv_config(
        "threads",
        data.path(),
        "{amount: {num_samples: 6}}",
        "{strategy: coreset, maximum_keys_in_memory: 4, k: 2, sampling: top_k}",
    );
    let threads = Arc::new(std::sync::Mutex::new(Vec::new()));
    let done = rt
        .block_on(async {
            Pipeline::new(config)
                .session(session(root.path()))
                .score_fn(Arc::new(ThreadNoter(Arc::clone(&threads))))
                .replay(None, None)
                .await
        })
        .expect("replay");
    assert_eq!(done.len(), 2);
    let worker = std::thread::current().id();
    let threads = threads.lock().expect("threads");
    assert!(!threads.is_empty(), "the score fn ran");
    assert!(
        threads.iter().all(|t| *t != worker),
        "a trigger's transaction ran on the async worker: {threads:?}"
    );
}
