//! Drift triggers and coreset selections (column timestamps, score functions, feature UDFs).

use std::sync::{Arc, Mutex};

use udfchain::Session;
use udfchain::pipeline::Pipeline;

use super::{T0, check_set, csv_config, csv_files, put, records, session};

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
