//! Replays: trigger sets key by key for each format, new-data semantics, inclusive bounds.

use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use udfchain::pipeline::Pipeline;
use udfchain::{File, col};

use super::{T0, check_set, csv_config, csv_files, put, records, session};

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
                .await
                .expect("catalog")
                .get("imgs-trigger-2", None)
                .await
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
