//! Lineage: a saved version records what it read (storage URIs and dataset
//! versions, through Rust chains, joins, unions and SQL scripts), never a
//! credential; `Catalog::lineage` and `udfchain datasets info` show it; a
//! catalog created before lineage existed is upgraded in place at open,
//! keeping its versions.

use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use udfchain::{Catalog, Chain, JoinType, LineageEntry, Session, Settings};

use udfchain_testkit::{S3Server, SECRET_KEY, runner, stdout_ok, write_files};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Item {
    id: i64,
    name: String,
}

fn items(n: i64) -> Vec<Item> {
    (0..n)
        .map(|id| Item {
            id,
            name: format!("item-{id}"),
        })
        .collect()
}

fn storage(uri: &str) -> LineageEntry {
    LineageEntry::storage(uri)
}

fn dataset(name: &str, version: u32) -> LineageEntry {
    LineageEntry::Dataset {
        name: name.to_string(),
        version,
    }
}

/// The URI a local dir is listed as.
fn file_uri(dir: &Path) -> String {
    format!("file://{}", dir.display())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_records_the_storage_and_dataset_versions_it_read() {
    let root = tempfile::tempdir().expect("root");
    let data = tempfile::tempdir().expect("data");
    write_files(data.path(), 5, |_| 32);
    let session = Session::with_settings(Settings::new().root(root.path()));
    let catalog = session.catalog().await.expect("catalog");

    let raw = session
        .from_storage(data.path().to_str().expect("utf8"))
        .save("raw")
        .await
        .expect("save raw");
    let want_storage = storage(&file_uri(data.path()));
    assert_eq!(
        catalog.lineage("raw", None).await.expect("lineage"),
        vec![want_storage.clone()]
    );

    // Values are no source; a Parquet file is; a dataset is its version.
    let table = data.path().join("items.parquet");
    Chain::from_values(&items(3))
        .to_parquet(table.to_str().expect("utf8"))
        .await
        .expect("parquet");
    let values = Chain::from_values_in(Arc::clone(&session), &items(3))
        .save("values")
        .await
        .expect("save values");
    assert_eq!(
        catalog.lineage("values", None).await.expect("lineage"),
        vec![]
    );
    let joined = Chain::from_parquet(table.to_str().expect("utf8"))
        .in_session(Arc::clone(&session))
        .join(
            session
                .from_dataset("values")
                .select([udfchain::col("id").alias("rid")]),
            JoinType::Inner,
            &["id"],
            &["rid"],
        )
        .select([udfchain::col("name")])
        .save("joined")
        .await
        .expect("save joined");
    let got = catalog
        .lineage("joined", Some(joined.version))
        .await
        .expect("lineage");
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(got.contains(&dataset("values", values.version)), "{got:?}");
    assert!(
        got.iter()
            .any(|e| matches!(e, LineageEntry::Storage { uri } if uri.ends_with("items.parquet"))),
        "{got:?}"
    );

    // "latest" is recorded as the version it meant at the time.
    let raw2 = session
        .from_storage(data.path().to_str().expect("utf8"))
        .save("raw")
        .await
        .expect("save raw v2");
    assert_eq!(raw2.version, raw.version + 1);
    session
        .from_dataset("raw")
        .union(Chain::from_dataset_version("raw", raw.version).in_session(Arc::clone(&session)))
        .save("both")
        .await
        .expect("save both");
    assert_eq!(
        catalog.lineage("both", None).await.expect("lineage"),
        vec![dataset("raw", raw2.version), dataset("raw", raw.version)]
    );

    // Through a SQL script: table functions, a union, a subquery.
    let r = runner(root.path());
    let dir = data.path().display();
    r.run(&format!(
        "CREATE DATASET sql_made AS
           SELECT file.path AS p FROM read_storage('{dir}')
           UNION ALL SELECT name AS p FROM read_dataset('values', {v})
           UNION ALL SELECT name AS p FROM read_parquet('{t}')
             WHERE id IN (SELECT id FROM read_dataset('values'))
           UNION ALL SELECT file.path AS p FROM read_dataset('raw', 1)",
        v = values.version,
        t = table.display()
    ))
    .await
    .expect("script");
    let got = catalog.lineage("sql_made", None).await.expect("lineage");
    assert_eq!(got.first(), Some(&want_storage), "{got:?}");
    for want in [dataset("values", values.version), dataset("raw", 1)] {
        assert!(got.contains(&want), "{want:?} not in {got:?}");
    }
    assert!(
        got.iter()
            .any(|e| matches!(e, LineageEntry::Storage { uri } if uri.ends_with("items.parquet"))),
        "{got:?}"
    );
    assert_eq!(got.len(), 4, "each source once: {got:?}");

    // Removing a version removes its lineage; the others keep theirs.
    catalog.remove("both", None).await.expect("rm");
    assert!(catalog.lineage("both", None).await.is_err());
    assert_eq!(
        catalog.lineage("raw", Some(1)).await.expect("kept").len(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lineage_of_an_s3_listing_holds_no_credential() {
    let s3 = S3Server::start();
    write_files(&s3.bucket_dir().join("imgs"), 3, |_| 16);
    let root = tempfile::tempdir().expect("root");
    let session = Session::with_settings(s3.settings().root(root.path()));
    session
        .from_storage("s3://bucket/imgs/")
        .save("imgs")
        .await
        .expect("save");
    let got = session
        .catalog()
        .await
        .expect("catalog")
        .lineage("imgs", None)
        .await
        .expect("lineage");
    assert_eq!(got, vec![storage("s3://bucket/imgs")]);
    let bytes = std::fs::read(root.path().join("catalog.sqlite")).expect("catalog");
    let text = String::from_utf8_lossy(&bytes);
    assert!(!text.contains(SECRET_KEY), "secret in the catalog");
}

/// The catalog schema before lineage (`user_version` 0).
const OLD_SCHEMA: &str = "CREATE TABLE versions (
        name TEXT NOT NULL, version INTEGER NOT NULL, path TEXT NOT NULL,
        schema TEXT NOT NULL, rows INTEGER NOT NULL, bytes INTEGER NOT NULL,
        created INTEGER NOT NULL, query TEXT NOT NULL,
        PRIMARY KEY (name, version));
    CREATE TABLE dataset_seq (name TEXT PRIMARY KEY, last INTEGER NOT NULL);";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catalog_of_the_previous_schema_is_upgraded_keeping_its_versions() {
    let root = tempfile::tempdir().expect("root");
    // A catalog file as the previous udfchain wrote it, with one version.
    let dir = root.path().join("datasets/old/v3");
    std::fs::create_dir_all(&dir).expect("mkdir");
    Chain::from_values(&items(4))
        .to_parquet(dir.join("data.parquet").to_str().expect("utf8"))
        .await
        .expect("parquet");
    {
        let conn = rusqlite::Connection::open(root.path().join("catalog.sqlite")).expect("db");
        conn.execute_batch(OLD_SCHEMA).expect("old schema");
        conn.execute(
            "INSERT INTO versions VALUES ('old', 3, 'datasets/old/v3', 'id: Int64\nname: Utf8', 4, 10, 1700000000, 'q')",
            [],
        )
        .expect("row");
        conn.execute("INSERT INTO dataset_seq VALUES ('old', 3)", [])
            .expect("seq");
    }

    let catalog = Catalog::open(root.path()).await.expect("open upgrades");
    let conn = rusqlite::Connection::open(root.path().join("catalog.sqlite")).expect("db");
    let at: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .expect("user_version");
    assert_eq!(at, 1);
    let old = catalog
        .get("old", None)
        .await
        .expect("the old version is kept");
    assert_eq!((old.version, old.rows, old.created), (3, 4, 1_700_000_000));
    assert_eq!(
        catalog.lineage("old", None).await.expect("none recorded"),
        vec![]
    );
    let session = Session::with_settings(Settings::new().root(root.path()));
    let rows: Vec<Item> = session.from_dataset("old").to_rows().await.expect("read");
    assert_eq!(rows, items(4));

    // New versions record lineage; versions continue after the old ones.
    let next = session.from_dataset("old").save("old").await.expect("save");
    assert_eq!(next.version, 4);
    assert_eq!(
        catalog.lineage("old", None).await.expect("lineage"),
        vec![dataset("old", 3)]
    );
    // Opening again is a no-op.
    drop(Catalog::open(root.path()).await.expect("reopen"));
    assert_eq!(catalog.list().await.expect("list").len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn datasets_info_prints_what_a_version_read() {
    let root = tempfile::tempdir().expect("root");
    let data = tempfile::tempdir().expect("data");
    write_files(data.path(), 2, |_| 8);
    let session = Session::with_settings(Settings::new().root(root.path()));
    session
        .from_storage(data.path().to_str().expect("utf8"))
        .save("raw")
        .await
        .expect("save");
    session
        .from_dataset("raw")
        .save("derived")
        .await
        .expect("save");
    let cli = |args: &[&str]| {
        stdout_ok(
            &std::process::Command::new(env!("CARGO_BIN_EXE_udfchain"))
                .arg("--root")
                .arg(root.path())
                .args(args)
                .output()
                .expect("run udfchain"),
        )
    };
    let text = cli(&["datasets", "info", "derived", "--version", "1"]);
    assert!(
        text.contains("version: 1\nversions: 1\n") && text.contains("created: 20"),
        "{text}"
    );
    assert!(
        text.contains("read from:\n  dataset raw v1\nquery:"),
        "{text}"
    );
    let text = cli(&["datasets", "info", "raw"]);
    assert!(
        text.contains(&format!(
            "read from:\n  storage {}\n",
            file_uri(data.path())
        )),
        "{text}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&cli(&["datasets", "info", "derived", "--format", "json"]))
            .expect("json");
    assert_eq!(
        json["sources"],
        serde_json::json!([{"kind": "dataset", "name": "raw", "version": 1}])
    );
    assert_eq!(json["rows"], 2);
}
