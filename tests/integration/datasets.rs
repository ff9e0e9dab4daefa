//! Datasets: typed save/read round trip, versions, rm, atomic saves (a child
//! killed with SIGKILL mid-save leaves nothing visible), concurrent saves.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use udfchain::{Catalog, Chain, Error, File, Session, Settings, col};

use crate::support::write_files;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Item {
    id: i64,
    name: String,
    score: f64,
}

fn items(n: i64) -> Vec<Item> {
    (0..n)
        .map(|id| Item {
            id,
            name: format!("item-{id}"),
            score: id as f64 * 1.5,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn save_read_versions_and_remove() {
    let root = tempfile::tempdir().expect("root");
    let session = Session::with_settings(Settings::new().root(root.path()));

    let v1 = Chain::from_values_in(Arc::clone(&session), &items(5))
        .save("items")
        .await
        .expect("save v1");
    assert_eq!((v1.name.as_str(), v1.version, v1.rows), ("items", 1, 5));
    assert!(v1.schema.contains("name: Utf8"), "{}", v1.schema);
    assert!(v1.bytes > 0);
    let v2 = Chain::from_values_in(Arc::clone(&session), &items(8))
        .save("items")
        .await
        .expect("save v2");
    assert_eq!(v2.version, 2);

    let latest: Vec<Item> = session
        .from_dataset("items")
        .order_by([col("id").sort(true, false)])
        .to_rows()
        .await
        .expect("read latest");
    assert_eq!(latest, items(8));
    let first: Vec<Item> = Chain::from_dataset_version("items", 1)
        .in_session(Arc::clone(&session))
        .order_by([col("id").sort(true, false)])
        .to_rows()
        .await
        .expect("read v1");
    assert_eq!(first, items(5));

    let catalog = session.catalog().expect("catalog");
    assert_eq!(catalog.list().expect("list").len(), 2);
    assert_eq!(catalog.get("items", None).expect("info").version, 2);
    assert_eq!(catalog.remove("items", Some(1)).expect("rm v1"), 1);
    assert!(!v1.path.exists(), "v1 files removed");
    let err = catalog.get("items", Some(1)).expect_err("v1 gone");
    assert!(err.to_string().contains("no version 1"), "{err}");
    let err = session
        .from_dataset("itemz")
        .count()
        .await
        .expect_err("typo");
    assert!(matches!(err, Error::Dataset(_)));
    assert!(err.to_string().contains("did you mean \"items\""), "{err}");
    assert_eq!(catalog.remove("items", None).expect("rm all"), 1);
    assert!(catalog.list().expect("list").is_empty());

    let err = Chain::from_values_in(Arc::clone(&session), &items(1))
        .save("../evil")
        .await
        .expect_err("bad name");
    assert!(err.to_string().contains("invalid dataset name"), "{err}");
    assert!(
        Catalog::open(root.path())
            .expect("reopen")
            .list()
            .expect("list")
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_save_leaves_no_version() {
    let root = tempfile::tempdir().expect("root");
    let data = tempfile::tempdir().expect("data");
    write_files(data.path(), 6, |_| 10);
    let session = Session::with_settings(Settings::new().root(root.path()));
    let err = session
        .from_storage(&data.path().display().to_string())
        .map("x", |f: File| async move {
            if f.path.contains("f0004") {
                return Err(std::io::Error::other("broken"));
            }
            Ok(f.size)
        })
        .save("files")
        .await
        .expect_err("the UDF fails");
    assert!(matches!(err, Error::Udf { .. }), "{err:?}");
    assert!(
        session
            .catalog()
            .expect("catalog")
            .list()
            .expect("list")
            .is_empty()
    );
    assert_eq!(staging_entries(root.path()), 0, "no staging dir left");
}

fn staging_entries(root: &std::path::Path) -> usize {
    std::fs::read_dir(root.join("datasets/.staging"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Run by `killed_save_leaves_nothing_visible` in a child process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "helper: runs only as a child process"]
async fn killed_save_worker() {
    let Ok(root) = std::env::var("UDFCHAIN_TEST_SAVE_ROOT") else {
        return;
    };
    let session = Session::with_settings(Settings::new().root(&root));
    let rows: Vec<Item> = items(2000);
    let _ = Chain::from_values_in(session, &rows)
        .settings(Settings::new().parallel(1))
        .map_on(&["id"], "slow", |id: i64| async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            Ok::<_, std::io::Error>(id * 2)
        })
        .save("killed")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_save_leaves_nothing_visible() {
    let root = tempfile::tempdir().expect("root");
    // A committed version first, to see it survives the sweep.
    let session = Session::with_settings(Settings::new().root(root.path()));
    Chain::from_values_in(Arc::clone(&session), &items(3))
        .save("killed")
        .await
        .expect("v1");

    let mut child = std::process::Command::new(std::env::current_exe().expect("exe"))
        .args([
            "--exact",
            "datasets::killed_save_worker",
            "--ignored",
            "--nocapture",
        ])
        .env("UDFCHAIN_TEST_SAVE_ROOT", root.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(30);
    while staging_entries(root.path()) == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
    assert_eq!(
        staging_entries(root.path()),
        1,
        "the killed save left its staging dir"
    );

    let catalog = Catalog::open(root.path()).expect("open sweeps");
    let versions = catalog.list().expect("list");
    assert_eq!(versions.len(), 1, "only the committed version is visible");
    assert_eq!(versions[0].version, 1);
    assert_eq!(
        staging_entries(root.path()),
        0,
        "orphans removed at the next start"
    );
    let n = session
        .from_dataset("killed")
        .count()
        .await
        .expect("v1 still reads");
    assert_eq!(n, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_saves_of_one_name_get_distinct_versions() {
    let root = tempfile::tempdir().expect("root");
    let mut tasks = Vec::new();
    for i in 0..4i64 {
        let root = root.path().to_path_buf();
        tasks.push(tokio::spawn(async move {
            // Separate sessions: separate catalog connections, as separate processes have.
            let session = Session::with_settings(Settings::new().root(&root));
            Chain::from_values_in(session, &items(10 + i))
                .save("shared")
                .await
        }));
    }
    let mut versions = Vec::new();
    for t in tasks {
        versions.push(t.await.expect("join").expect("save").version);
    }
    versions.sort();
    assert_eq!(versions, vec![1, 2, 3, 4]);
    let catalog = Catalog::open(root.path()).expect("open");
    let rows: Vec<u64> = catalog
        .list()
        .expect("list")
        .iter()
        .map(|i| i.rows)
        .collect();
    let mut sorted = rows.clone();
    sorted.sort();
    assert_eq!(sorted, vec![10, 11, 12, 13]);
}

/// Run by `two_processes_saving_one_name` in child processes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "helper: runs only as a child process"]
async fn concurrent_save_worker() {
    let Ok(root) = std::env::var("UDFCHAIN_TEST_SAVE2_ROOT") else {
        return;
    };
    let go = std::path::PathBuf::from(&root).join("go");
    while !go.exists() {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let session = Session::with_settings(Settings::new().root(&root));
    let info = Chain::from_values_in(session, &items(7))
        .save("both")
        .await
        .expect("save");
    println!("saved version {}", info.version);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_saving_one_name_get_distinct_versions() {
    let root = tempfile::tempdir().expect("root");
    let children: Vec<_> = (0..2)
        .map(|_| {
            std::process::Command::new(std::env::current_exe().expect("exe"))
                .args([
                    "--exact",
                    "datasets::concurrent_save_worker",
                    "--ignored",
                    "--nocapture",
                ])
                .env("UDFCHAIN_TEST_SAVE2_ROOT", root.path())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn")
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    std::fs::write(root.path().join("go"), b"").expect("go");
    for c in children {
        let out = c.wait_with_output().expect("wait");
        assert!(
            out.status.success(),
            "worker failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("saved version"));
    }
    let mut versions: Vec<u32> = Catalog::open(root.path())
        .expect("open")
        .list()
        .expect("list")
        .iter()
        .map(|i| i.version)
        .collect();
    versions.sort();
    assert_eq!(versions, vec![1, 2]);
}
