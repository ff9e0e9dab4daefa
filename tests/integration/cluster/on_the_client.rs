//! A cluster run's results on the client: `save` commits one version, metrics arrive.

use serde::Deserialize;
use udfchain::cluster::UdfRegistry;
use udfchain::{Session, Settings, col};

use super::{Meta, meta, registry, server_with_files};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn save_on_a_cluster_commits_one_version_on_the_client() {
    let server = server_with_files(9);
    let root = tempfile::tempdir().expect("root");
    let settings = server.settings().root(root.path()).workers(2);
    let cluster = Session::standalone(settings.clone(), registry(), 2)
        .await
        .expect("standalone cluster");
    let info = cluster
        .from_storage("s3://bucket/data/")
        .map("meta", meta)
        .select([col("file.path").alias("path"), col("meta")])
        .save("metas")
        .await
        .expect("save");
    assert_eq!((info.version, info.rows), (1, 9));
    #[derive(Deserialize)]
    struct Row {
        path: String,
        meta: Meta,
    }
    let local = Session::with_settings(settings);
    let mut rows: Vec<Row> = local
        .from_dataset("metas")
        .to_rows()
        .await
        .expect("read back");
    rows.sort_by(|a, b| a.path.cmp(&b.path));
    assert_eq!(rows.len(), 9);
    assert_eq!(rows[0].path, "d0/f0000.bin");
    assert_eq!(rows[0].meta.len, 20);
}

/// `explain_analyze` of a chain run on the cluster shows udfchain's operator
/// metrics of the remote run, summed over its tasks (here two partitions):
/// prefetch fetched every file once, the UDF ran once per file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_runs_operator_metrics_reach_the_client() {
    let server = server_with_files(12);
    let udfs = UdfRegistry::with_builtins().register_map("meta", meta);
    let cluster = Session::standalone(server.settings().workers(2), udfs, 2)
        .await
        .expect("standalone cluster");
    let text = cluster
        .from_storage("s3://bucket/data/")
        .settings(Settings::new().prefetch(3))
        .map("meta", meta)
        .explain_analyze()
        .await
        .expect("explain analyze");
    eprintln!("{text}");
    for metric in [
        "PrefetchExec.files_fetched=12",
        "MapExec.output_rows=12",
        "PrefetchExec.peak_in_flight=",
    ] {
        assert!(text.contains(metric), "{metric}: {text}");
    }
    // SQL: `EXPLAIN ANALYZE` prints each stage's executed plan with its metrics.
    let runner = udfchain::ScriptRunner::new(cluster);
    let text = udfchain_testkit::last_table(
        &runner,
        "EXPLAIN ANALYZE SELECT sha256(file) AS h FROM read_storage('s3://bucket/data/')",
    )
    .await;
    eprintln!("{text}");
    assert!(text.contains("files_fetched=12"), "{text}");
}
