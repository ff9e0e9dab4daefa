//! Datasets: typed save/read round trip, versions, rm, atomic saves (a child
//! killed with SIGKILL mid-save leaves nothing visible), concurrent saves; a
//! version survives its root being opened through a symlink, `..` or after a
//! move (Catalog API and CLI); staging liveness by owner lock (live and killed
//! holders, pid reuse, dropped saves); names checked before the run; catalog
//! errors typed; catalog work off the async runtime.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use udfchain::{Catalog, Chain, Error, File, Session, Settings, col};

use udfchain_testkit::write_files;

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

    let catalog = session.catalog().await.expect("catalog");
    assert_eq!(catalog.list().await.expect("list").len(), 2);
    assert_eq!(catalog.get("items", None).await.expect("info").version, 2);
    assert_eq!(catalog.remove("items", Some(1)).await.expect("rm v1"), 1);
    assert!(!v1.path.exists(), "v1 files removed");
    let err = catalog.get("items", Some(1)).await.expect_err("v1 gone");
    assert!(err.to_string().contains("no version 1"), "{err}");
    let err = session
        .from_dataset("itemz")
        .count()
        .await
        .expect_err("typo");
    assert!(matches!(err, Error::Dataset(_)));
    assert!(err.to_string().contains("did you mean \"items\""), "{err}");
    assert_eq!(catalog.remove("items", None).await.expect("rm all"), 1);
    assert!(catalog.list().await.expect("list").is_empty());

    let err = Chain::from_values_in(Arc::clone(&session), &items(1))
        .save("../evil")
        .await
        .expect_err("bad name");
    assert!(err.to_string().contains("invalid dataset name"), "{err}");
    assert!(
        Catalog::open(root.path())
            .await
            .expect("reopen")
            .list()
            .await
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
            .await
            .expect("catalog")
            .list()
            .await
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

    let catalog = Catalog::open(root.path()).await.expect("open sweeps");
    let versions = catalog.list().await.expect("list");
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
    let catalog = Catalog::open(root.path()).await.expect("open");
    let rows: Vec<u64> = catalog
        .list()
        .await
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
        .await
        .expect("open")
        .list()
        .await
        .expect("list")
        .iter()
        .map(|i| i.version)
        .collect();
    versions.sort();
    assert_eq!(versions, vec![1, 2]);
}

/// Saves `items(n)` as `name` under `root`.
async fn save_items(root: &std::path::Path, name: &str, n: i64) -> udfchain::DatasetInfo {
    let session = Session::with_settings(Settings::new().root(root));
    Chain::from_values_in(session, &items(n))
        .save(name)
        .await
        .expect("save")
}

/// The rows of the latest version of `name`, read through the root spelled `root`.
async fn read_items(root: &std::path::Path, name: &str) -> Vec<Item> {
    let session = Session::with_settings(Settings::new().root(root));
    session
        .from_dataset(name)
        .order_by([col("id").sort(true, false)])
        .to_rows()
        .await
        .expect("read")
}

/// Opens the root under `spelling`, then checks version 1 of `items` is still
/// listed, lives under that spelling and reads the same rows.
async fn check_items_survive(spelling: &std::path::Path) {
    let catalog = Catalog::open(spelling).await.expect("open");
    let versions = catalog.list().await.expect("list");
    assert_eq!(versions.len(), 1, "{versions:?}");
    assert_eq!(versions[0].version, 1);
    assert!(
        versions[0]
            .path
            .starts_with(std::path::absolute(spelling).expect("abs")),
        "resolved against the root as opened: {}",
        versions[0].path.display()
    );
    assert!(versions[0].path.join("data.parquet").is_file());
    assert_eq!(read_items(spelling, "items").await, items(5));
    // Opening again (a second sweep) under the same spelling keeps it too.
    assert_eq!(
        Catalog::open(spelling)
            .await
            .expect("reopen")
            .list()
            .await
            .expect("list")
            .len(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_survives_opening_its_root_through_a_symlink() {
    let base = tempfile::tempdir().expect("base");
    let real = base.path().join("r");
    save_items(&real, "items", 5).await;
    let link = base.path().join("link");
    std::os::unix::fs::symlink(&real, &link).expect("symlink");
    check_items_survive(&link).await;
    check_items_survive(&real).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_survives_opening_its_root_through_dot_dot() {
    let base = tempfile::tempdir().expect("base");
    let real = base.path().join("r");
    save_items(&real, "items", 5).await;
    std::fs::create_dir(base.path().join("x")).expect("mkdir x");
    check_items_survive(&base.path().join("x/../r")).await;
    check_items_survive(&real).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_survives_its_root_being_moved() {
    let base = tempfile::tempdir().expect("base");
    let old = base.path().join("r");
    save_items(&old, "items", 5).await;
    let new = base.path().join("moved");
    std::fs::rename(&old, &new).expect("move the root");
    check_items_survive(&new).await;
}

/// Rows as stored in the catalog: (name, version, path).
fn stored_rows(root: &std::path::Path) -> Vec<(String, u32, String)> {
    let conn = rusqlite::Connection::open(root.join("catalog.sqlite")).expect("sqlite");
    let mut stmt = conn
        .prepare("SELECT name, version, path FROM versions ORDER BY name, version")
        .expect("prepare");
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_catalog_with_absolute_paths_is_migrated_not_swept() {
    let base = tempfile::tempdir().expect("base");
    let real = base.path().join("r");
    save_items(&real, "items", 5).await;
    save_items(&real, "elsewhere", 2).await;
    assert_eq!(
        stored_rows(&real),
        vec![
            ("elsewhere".into(), 1, "datasets/elsewhere/v1".into()),
            ("items".into(), 1, "datasets/items/v1".into())
        ],
        "new rows are relative"
    );
    // As an older udfchain wrote them: absolute, spelled through the real root;
    // and one row naming a dir outside this root.
    let conn = rusqlite::Connection::open(real.join("catalog.sqlite")).expect("sqlite");
    let abs = real.join("datasets/items/v1").display().to_string();
    conn.execute("UPDATE versions SET path = ?1 WHERE name = 'items'", [&abs])
        .expect("update");
    conn.execute(
        "UPDATE versions SET path = '/no/such/place/v1' WHERE name = 'elsewhere'",
        [],
    )
    .expect("update");
    drop(conn);

    let link = base.path().join("link");
    std::os::unix::fs::symlink(&real, &link).expect("symlink");
    let catalog = Catalog::open(&link).await.expect("open through the link");
    assert_eq!(catalog.list().await.expect("list").len(), 2);
    assert_eq!(
        stored_rows(&real),
        vec![
            ("elsewhere".into(), 1, "/no/such/place/v1".into()),
            ("items".into(), 1, "datasets/items/v1".into())
        ],
        "the row under the root is made relative, the other one kept"
    );
    assert!(
        real.join("datasets/elsewhere/v1/data.parquet").is_file(),
        "a dir whose row could not be matched is kept"
    );
    assert_eq!(read_items(&link, "items").await, items(5));
}

fn cli(root: &std::path::Path, args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_udfchain"))
        .arg("--root")
        .arg(root)
        .args(args)
        .output()
        .expect("run udfchain");
    assert!(
        out.status.success(),
        "udfchain {args:?} under {}: {}",
        root.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_cli_keeps_a_version_under_every_spelling_of_its_root() {
    let base = tempfile::tempdir().expect("base");
    let real = base.path().join("r");
    cli(
        &real,
        &[
            "query",
            "CREATE DATASET nums AS SELECT * FROM (VALUES (1, 'a'), (2, 'b'), (3, 'c')) AS t(id, name)",
        ],
    );
    let read = |root: &std::path::Path| {
        let ls = cli(root, &["datasets", "ls", "--format", "csv"]);
        assert!(
            ls.starts_with("name,version,rows,bytes,created\nnums,1,3,"),
            "{ls}"
        );
        cli(
            root,
            &[
                "query",
                "SELECT * FROM read_dataset('nums') ORDER BY id",
                "--format",
                "csv",
            ],
        )
    };
    let expected = read(&real);
    assert_eq!(expected, "id,name\n1,a\n2,b\n3,c\n");

    let link = base.path().join("link");
    std::os::unix::fs::symlink(&real, &link).expect("symlink");
    assert_eq!(read(&link), expected, "through a symlink");
    assert_eq!(read(&real), expected, "then through the real path again");
    std::fs::create_dir(base.path().join("x")).expect("mkdir x");
    assert_eq!(
        read(&base.path().join("x/../r")),
        expected,
        "through x/../r"
    );
    let moved = base.path().join("moved");
    std::fs::rename(&real, &moved).expect("move the root");
    assert_eq!(read(&moved), expected, "after the root was moved");
    let info = cli(&moved, &["datasets", "info", "nums"]);
    assert!(
        info.contains(&format!(
            "path:    {}",
            moved.join("datasets/nums/v1").display()
        )),
        "{info}"
    );
}

/// Run by the staging liveness tests in a child process: holds a staging dir
/// (with a file in it) until killed.
#[tokio::test]
#[ignore = "helper: runs only as a child process"]
async fn staging_holder_worker() {
    let Ok(root) = std::env::var("UDFCHAIN_TEST_STAGING_ROOT") else {
        return;
    };
    let catalog = Catalog::open(std::path::Path::new(&root))
        .await
        .expect("open");
    let staging = catalog.staging_dir().await.expect("staging");
    std::fs::write(staging.path().join("part.parquet"), b"partial").expect("write");
    println!("holding {}", staging.path().display());
    std::thread::sleep(Duration::from_secs(600));
    drop(staging);
}

/// Starts a child process holding a staging dir under `root`; returns it with the dir.
fn spawn_staging_holder(root: &std::path::Path) -> (std::process::Child, std::path::PathBuf) {
    let child = std::process::Command::new(std::env::current_exe().expect("exe"))
        .args([
            "--exact",
            "datasets::staging_holder_worker",
            "--ignored",
            "--nocapture",
        ])
        .env("UDFCHAIN_TEST_STAGING_ROOT", root)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn");
    let held = || {
        std::fs::read_dir(root.join("datasets/.staging"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.join("part.parquet").exists())
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut dir = held();
    while dir.is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        dir = held();
    }
    match dir {
        Some(dir) => (child, dir),
        None => {
            kill(child);
            panic!("the holder never made its dir");
        }
    }
}

fn kill(mut child: std::process::Child) {
    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
}

#[tokio::test]
async fn a_staging_dir_held_by_a_live_process_is_kept() {
    let root = tempfile::tempdir().expect("root");
    let (child, dir) = spawn_staging_holder(root.path());
    for _ in 0..2 {
        Catalog::open(root.path()).await.expect("open sweeps");
        assert!(
            dir.join("part.parquet").exists(),
            "a live save's staging dir is not touched"
        );
    }
    kill(child);
}

#[tokio::test]
async fn a_staging_dir_whose_holder_was_killed_is_swept() {
    let root = tempfile::tempdir().expect("root");
    let (child, dir) = spawn_staging_holder(root.path());
    kill(child);
    assert!(dir.exists(), "the killed holder left its dir");
    Catalog::open(root.path()).await.expect("open sweeps");
    assert!(!dir.exists(), "swept at the next open");
    assert_eq!(staging_entries(root.path()), 0);
}

#[tokio::test]
async fn a_staging_dir_is_swept_even_when_its_pid_belongs_to_a_live_process() {
    let root = tempfile::tempdir().expect("root");
    let (child, dir) = spawn_staging_holder(root.path());
    kill(child);
    // Pid reuse: the pid recorded for the dir now names a running process (this
    // one). Liveness comes from the lock, so the dir still goes.
    std::fs::write(dir.join("owner.pid"), std::process::id().to_string()).expect("pid");
    Catalog::open(root.path()).await.expect("open sweeps");
    assert!(!dir.exists(), "swept although its recorded pid is alive");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_save_removes_its_staging_dir_at_once() {
    let root = tempfile::tempdir().expect("root");
    let session = Session::with_settings(Settings::new().root(root.path()));
    let chain = Chain::from_values_in(Arc::clone(&session), &items(2000))
        .settings(Settings::new().parallel(1))
        .map_on(&["id"], "slow", |id: i64| async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            Ok::<_, std::io::Error>(id)
        });
    let mut save = Box::pin(chain.save("dropped"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while staging_entries(root.path()) == 0 {
        assert!(Instant::now() < deadline, "the save never started");
        tokio::select! {
            r = &mut save => panic!("the save finished early: {r:?}"),
            _ = tokio::time::sleep(Duration::from_millis(10)) => {}
        }
    }
    drop(save);
    // Aborted writer tasks stop a moment after the drop.
    let deadline = Instant::now() + Duration::from_secs(2);
    while staging_entries(root.path()) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(staging_entries(root.path()), 0, "no staging dir left");
    assert!(
        session
            .catalog()
            .await
            .expect("catalog")
            .list()
            .await
            .expect("list")
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_name_fails_before_anything_runs() {
    let root = tempfile::tempdir().expect("root");
    let data = tempfile::tempdir().expect("data");
    write_files(data.path(), 6, |_| 10);
    let session = Session::with_settings(Settings::new().root(root.path()));
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    let err = session
        .from_storage(&data.path().display().to_string())
        .map("x", move |f: File| {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move { Ok::<_, std::io::Error>(f.size) }
        })
        .save("bad name/..")
        .await
        .expect_err("bad name");
    assert!(matches!(err, Error::Dataset(_)), "{err:?}");
    assert!(
        err.to_string()
            .contains("invalid dataset name \"bad name/..\""),
        "{err}"
    );
    assert_eq!(
        calls.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "no UDF ran"
    );
    assert!(
        !root.path().join("datasets").exists(),
        "nothing was created"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_catalog_is_a_typed_error_with_its_source() {
    let root = tempfile::tempdir().expect("root");
    let db = root.path().join("catalog.sqlite");
    std::fs::write(&db, vec![b'x'; 4096]).expect("garbage");
    let check = |err: Error| match err {
        Error::Catalog { path, source } => {
            assert_eq!(path, db.display().to_string());
            assert!(
                matches!(
                    &*source,
                    rusqlite::Error::SqliteFailure(e, _) if e.code == rusqlite::ErrorCode::NotADatabase
                ),
                "{source:?}"
            );
        }
        other => panic!("expected Error::Catalog, got {other:?}"),
    };
    check(
        Catalog::open(root.path())
            .await
            .expect_err("not a database"),
    );
    let session = Session::with_settings(Settings::new().root(root.path()));
    check(
        Chain::from_values_in(Arc::clone(&session), &items(2))
            .save("items")
            .await
            .expect_err("save"),
    );
    check(
        session
            .from_dataset("items")
            .count()
            .await
            .expect_err("read"),
    );
}

/// Runs `work` on a current-thread runtime while another thread holds the
/// catalog's SQLite write lock for a second; returns how often a ticker task
/// on the same runtime ran while the lock was held. Catalog work done on the
/// runtime thread itself would stop the ticker for the whole second.
fn ticks_while_catalog_locked<F: std::future::Future<Output = ()>>(
    root: &std::path::Path,
    work: impl FnOnce() -> F,
) -> usize {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let conn = rusqlite::Connection::open(root.join("catalog.sqlite")).expect("sqlite");
    conn.execute_batch("BEGIN IMMEDIATE").expect("write lock");
    let held = Arc::new(AtomicBool::new(true));
    let releaser = {
        let held = Arc::clone(&held);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(1));
            held.store(false, Ordering::SeqCst);
            conn.execute_batch("COMMIT").expect("release");
        })
    };
    let ticks = Arc::new(AtomicUsize::new(0));
    rt.block_on(async {
        let ticker = {
            let (held, ticks) = (Arc::clone(&held), Arc::clone(&ticks));
            tokio::spawn(async move {
                loop {
                    if held.load(Ordering::SeqCst) {
                        ticks.fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
        };
        tokio::task::yield_now().await;
        work().await;
        ticker.abort();
    });
    releaser.join().expect("releaser");
    ticks.load(Ordering::SeqCst)
}

#[test]
fn catalog_work_never_blocks_the_async_runtime() {
    let root = tempfile::tempdir().expect("root");
    // Each measurement below runs on its own runtime: this test has none.
    tokio::runtime::Runtime::new()
        .expect("runtime")
        .block_on(Catalog::open(root.path()))
        .expect("create");
    let session = Session::with_settings(Settings::new().root(root.path()));
    let ticks = ticks_while_catalog_locked(root.path(), || async {
        let info = Chain::from_values_in(Arc::clone(&session), &items(3))
            .save("items")
            .await
            .expect("save");
        assert_eq!(info.version, 1);
    });
    assert!(ticks > 10, "save: other tasks ran only {ticks} times");
    let ticks = ticks_while_catalog_locked(root.path(), || async {
        let n = session.from_dataset("items").count().await.expect("read");
        assert_eq!(n, 3);
        let out = udfchain::ScriptRunner::new(Arc::clone(&session))
            .run("SHOW DATASETS")
            .await
            .expect("show");
        assert!(matches!(&out[..], [udfchain::Output::Table(b)] if b[0].num_rows() == 1));
    });
    assert!(
        ticks > 10,
        "read and SHOW DATASETS: other tasks ran only {ticks} times"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_removes_unregistered_version_dirs_and_keeps_what_it_cannot_match() {
    let root = tempfile::tempdir().expect("root");
    save_items(root.path(), "items", 5).await;
    let dir = root.path().join("datasets/items");
    // What a save killed between its rename and its insert leaves: a version dir
    // without a row. And entries that are not version dirs at all.
    std::fs::create_dir(dir.join("v2")).expect("v2");
    std::fs::write(dir.join("v2/data.parquet"), b"partial").expect("write");
    std::fs::create_dir(dir.join("notes")).expect("notes");
    std::fs::write(dir.join("v3"), b"a file, not a dir").expect("file");
    let catalog = Catalog::open(root.path()).await.expect("open sweeps");
    assert!(
        !dir.join("v2").exists(),
        "the unregistered version is removed"
    );
    assert!(
        dir.join("v1/data.parquet").is_file(),
        "the registered one is kept"
    );
    assert!(
        dir.join("notes").is_dir() && dir.join("v3").is_file(),
        "unknown entries kept"
    );
    assert_eq!(catalog.list().await.expect("list").len(), 1);
    let next = save_items(root.path(), "items", 2).await;
    assert_eq!(next.version, 2);
    assert_eq!(read_items(root.path(), "items").await, items(2));
}

/// A row of `churn`: which process saved it, at which step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Token {
    token: String,
}

/// Run by `two_processes_saving_and_removing_keep_every_listed_version_readable`
/// in child processes: saves `churn` and removes its oldest version (when more
/// than two are listed) in a loop,
/// reading every listed version each time; prints `saved V TOKEN` per save.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "helper: runs only as a child process"]
async fn churn_worker() {
    let Ok(root) = std::env::var("UDFCHAIN_TEST_CHURN_ROOT") else {
        return;
    };
    let who = std::env::var("UDFCHAIN_TEST_CHURN_WHO").expect("who");
    let session = Session::with_settings(Settings::new().root(&root));
    let catalog = Catalog::open(root.as_str()).await.expect("open");
    for step in 0..12 {
        let token = format!("{who}-{step}");
        let rows = vec![Token {
            token: token.clone(),
        }];
        let info = Chain::from_values_in(Arc::clone(&session), &rows)
            .save("churn")
            .await
            .expect("save");
        println!("saved {} {token}", info.version);
        for v in catalog.list().await.expect("list") {
            let read: udfchain::Result<Vec<Token>> =
                Chain::from_dataset_version("churn", v.version)
                    .in_session(Arc::clone(&session))
                    .to_rows()
                    .await;
            if let Err(e) = read {
                // Removed by the other process since the listing: fine; still
                // listed and unreadable: the defect.
                let still = catalog.get("churn", Some(v.version)).await.is_ok();
                assert!(!still, "listed version {} unreadable: {e}", v.version);
            }
        }
        let listed = catalog.list().await.expect("list");
        if let [oldest, _, _, ..] = &listed[..] {
            match catalog.remove("churn", Some(oldest.version)).await {
                Ok(_) => println!("removed {}", oldest.version),
                Err(e) => assert!(e.to_string().contains("no version"), "{e}"),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_saving_and_removing_keep_every_listed_version_readable() {
    let root = tempfile::tempdir().expect("root");
    Catalog::open(root.path()).await.expect("create");
    let children: Vec<_> = ["a", "b"]
        .into_iter()
        .map(|who| {
            std::process::Command::new(std::env::current_exe().expect("exe"))
                .args([
                    "--exact",
                    "datasets::churn_worker",
                    "--ignored",
                    "--nocapture",
                ])
                .env("UDFCHAIN_TEST_CHURN_ROOT", root.path())
                .env("UDFCHAIN_TEST_CHURN_WHO", who)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn")
        })
        .collect();
    let mut saved = std::collections::BTreeMap::new();
    for c in children {
        let out = c.wait_with_output().expect("wait");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "worker failed: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        for line in stdout.lines() {
            if let Some(rest) = line.strip_prefix("saved ") {
                let (v, token) = rest.split_once(' ').expect("saved V TOKEN");
                let v: u32 = v.parse().expect("version");
                let old = saved.insert(v, token.to_string());
                assert!(
                    old.is_none(),
                    "version {v} issued twice: {old:?} and {token}"
                );
            }
        }
    }
    assert_eq!(saved.len(), 24, "every save got its own version");
    // What is left reads the rows first saved under its number.
    let session = Session::with_settings(Settings::new().root(root.path()));
    let left = Catalog::open(root.path())
        .await
        .expect("open")
        .list()
        .await
        .expect("list");
    assert!(left.len() >= 2, "the loop keeps two versions: {left:?}");
    for v in &left {
        let rows: Vec<Token> = Chain::from_dataset_version("churn", v.version)
            .in_session(Arc::clone(&session))
            .to_rows()
            .await
            .expect("a listed version reads");
        assert_eq!(
            rows,
            vec![Token {
                token: saved[&v.version].clone()
            }]
        );
    }
    let dirs = std::fs::read_dir(root.path().join("datasets").join("churn"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(
        dirs,
        left.len(),
        "no dir without its row, no row without its dir"
    );
}
