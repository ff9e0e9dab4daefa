//! What a first run meets, through the real binary and the Rust API: the
//! `Chain::new()` entry the design names (settings before the source), a start
//! guide and examples in the help, and one-line errors that say what to do for
//! the usual first mistakes (no S3 credentials, a bucket that does not exist, a
//! mistyped relative path), against the S3 server on 127.0.0.1.

use udfchain::{Chain, File, Settings, col};

use crate::support::write_files;

#[tokio::test]
async fn chain_new_gives_the_rows_and_plan_of_from_storage() {
    let dir = tempfile::tempdir().expect("dir");
    write_files(dir.path(), 5, |i| 10 + i);
    let uri = dir.path().display().to_string();
    let len = |f: File| async move { f.read().await.map(|b| b.len() as u64) };

    let old = Chain::from_storage(&uri)
        .settings(Settings::new().prefetch(3))
        .map("len", len)
        .select([col("file.path").alias("path"), col("len")])
        .order_by([col("path").sort(true, false)]);
    let new = Chain::new()
        .settings(Settings::new().prefetch(3))
        .from_storage(&uri)
        .map("len", len)
        .select([col("file.path").alias("path"), col("len")])
        .order_by([col("path").sort(true, false)]);

    let (old_plan, new_plan) = (
        old.explain().await.expect("explain old"),
        new.explain().await.expect("explain new"),
    );
    assert_eq!(old_plan, new_plan);
    assert!(new_plan.contains("PrefetchExec: prefetch=3"), "{new_plan}");
    let rows = |b: Vec<udfchain::datafusion::arrow::array::RecordBatch>| {
        udfchain::datafusion::arrow::util::pretty::pretty_format_batches(&b)
            .expect("format")
            .to_string()
    };
    let (a, b) = (
        rows(old.collect().await.expect("old")),
        rows(new.collect().await.expect("new")),
    );
    assert_eq!(a, b);
    assert!(b.contains("| d1/f0004.bin | 14  |"), "{b}");
}

#[tokio::test]
async fn settings_before_the_source_apply_to_udfs_added_after() {
    let dir = tempfile::tempdir().expect("dir");
    write_files(dir.path(), 2, |_| 4);
    let uri = dir.path().display().to_string();
    let len = |f: File| async move { f.read().await.map(|b| b.len() as u64) };

    let off = Chain::new()
        .settings(Settings::new().prefetch(0))
        .from_storage(&uri)
        .map("len", len);
    let plan = off.explain().await.expect("explain");
    assert!(
        plan.contains("MapExec") && !plan.contains("PrefetchExec"),
        "{plan}"
    );
    assert_eq!(
        off.collect()
            .await
            .expect("rows")
            .iter()
            .map(|b| b.num_rows())
            .sum::<usize>(),
        2
    );

    // The default (prefetch on) for the same chain without settings.
    let on = Chain::new().from_storage(&uri).map("len", len);
    assert!(
        on.explain()
            .await
            .expect("explain")
            .contains("PrefetchExec")
    );

    // Values and a session given before the source.
    let session = udfchain::Session::with_settings(Settings::new().prefetch(0));
    let values = Chain::new()
        .in_session(session)
        .from_values(&[1u32, 2, 3])
        .collect()
        .await
        .expect("values");
    assert_eq!(values.iter().map(|b| b.num_rows()).sum::<usize>(), 3);
}
