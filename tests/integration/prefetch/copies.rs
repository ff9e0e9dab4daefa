//! Where prefetched copies live (temp dir, memory) and that they are gone after every ending.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use object_store::memory::InMemory;
use object_store::throttle::{ThrottleConfig, ThrottledStore};
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use udfchain::{Chain, File, Session, Settings, col};

use udfchain_testkit::{
    CountingStore, disk_bytes, no_prefetch_dirs_soon, prefetch_dirs, put_files, remote_view,
    write_files,
};

use super::len_udf;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn temp_dir_is_gone_after_success_error_panic_and_drop() {
    let root = tempfile::tempdir().expect("root");
    let data = tempfile::tempdir().expect("data");
    write_files(data.path(), 30, |_| 2000);
    let uri = data.path().display().to_string();
    let session = Session::new();
    let base = || {
        session
            .from_storage(&uri)
            .settings(Settings::new().prefetch(4).root(root.path()))
    };

    let n = len_udf(base(), Duration::ZERO)
        .count()
        .await
        .expect("success");
    assert_eq!(n, 30);
    assert_eq!(
        no_prefetch_dirs_soon(root.path()).await,
        Vec::<std::path::PathBuf>::new(),
        "after success"
    );

    let err = base()
        .map("x", |f: File| async move {
            if f.path.contains("f0011") {
                return Err(std::io::Error::other("bad file"));
            }
            Ok(1u8)
        })
        .count()
        .await;
    assert!(err.is_err());
    assert!(
        no_prefetch_dirs_soon(root.path()).await.is_empty(),
        "after a UDF error"
    );

    let err = base()
        .map("x", |f: File| async move {
            if f.path.contains("f0012") {
                panic!("udf panic");
            }
            Ok::<_, std::io::Error>(1u8)
        })
        .count()
        .await;
    assert!(err.is_err());
    assert!(
        no_prefetch_dirs_soon(root.path()).await.is_empty(),
        "after a UDF panic"
    );

    let mut stream = len_udf(
        base().settings(Settings::new().parallel(1)),
        Duration::from_millis(20),
    )
    .stream()
    .await
    .expect("stream");
    stream.next().await.expect("first").expect("ok");
    assert_eq!(
        prefetch_dirs(root.path()).len(),
        1,
        "the temp dir exists while the UDF runs"
    );
    drop(stream);
    assert!(
        no_prefetch_dirs_soon(root.path()).await.is_empty(),
        "after the stream is dropped"
    );
}

/// Run by `temp_dir_of_a_killed_process_is_swept` in a child process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "helper: runs only as a child process"]
async fn killed_child_worker() {
    let Ok(root) = std::env::var("UDFCHAIN_TEST_CHILD_ROOT") else {
        return;
    };
    let data = std::env::var("UDFCHAIN_TEST_CHILD_DATA").expect("data dir");
    // Downloaded to the temp dir (local files are read ahead, never copied).
    let _ = remote_view(std::path::Path::new(&data), "child")
        .from_storage("memory://child/")
        .settings(
            Settings::new()
                .prefetch(2)
                .parallel(1)
                .memory_file_limit(0)
                .root(&root),
        )
        .map("x", |f: File| async move {
            tokio::time::sleep(Duration::from_secs(600)).await;
            Ok::<_, std::io::Error>(f.size)
        })
        .count()
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn temp_dir_of_a_killed_process_is_swept() {
    let root = tempfile::tempdir().expect("root");
    let data = tempfile::tempdir().expect("data");
    write_files(data.path(), 5, |_| 100);
    let mut child = std::process::Command::new(std::env::current_exe().expect("test exe"))
        .args([
            "--exact",
            "prefetch::copies::killed_child_worker",
            "--ignored",
            "--nocapture",
        ])
        .env("UDFCHAIN_TEST_CHILD_ROOT", root.path())
        .env("UDFCHAIN_TEST_CHILD_DATA", data.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn child");
    let deadline = Instant::now() + Duration::from_secs(30);
    while prefetch_dirs(root.path()).is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Wait for the prefetched files to land, then SIGKILL the child mid-run.
    tokio::time::sleep(Duration::from_millis(200)).await;
    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
    let orphans = prefetch_dirs(root.path());
    assert_eq!(orphans.len(), 1, "the killed child left its temp dir");
    assert!(disk_bytes(&orphans[0]) > 0, "with prefetched files in it");

    // The next run under the same root sweeps it.
    let n = Session::new()
        .from_storage(&data.path().display().to_string())
        .settings(Settings::new().root(root.path()))
        .map(
            "x",
            |f: File| async move { Ok::<_, std::io::Error>(f.size) },
        )
        .count()
        .await
        .expect("next run");
    assert_eq!(n, 5);
    assert!(!orphans[0].exists(), "the orphan dir was swept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn temp_disk_use_stays_within_the_window() {
    const SIZE: usize = 256 * 1024;
    const PREFETCH: usize = 2;
    let root = tempfile::tempdir().expect("root");
    let data = tempfile::tempdir().expect("data");
    write_files(data.path(), 24, |_| SIZE);
    let chain = len_udf(
        remote_view(data.path(), "window")
            .from_storage("memory://window/")
            .settings(
                Settings::new()
                    .prefetch(PREFETCH)
                    .parallel(1)
                    .memory_file_limit(0)
                    .root(root.path()),
            ),
        Duration::from_millis(10),
    );
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (flag, tmp) = (Arc::clone(&done), root.path().join("tmp"));
    let sampler = tokio::spawn(async move {
        let (mut peak, mut samples) = (0u64, 0usize);
        while !flag.load(std::sync::atomic::Ordering::SeqCst) {
            peak = peak.max(disk_bytes(&tmp));
            samples += 1;
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        (peak, samples)
    });
    assert_eq!(chain.count().await.expect("run"), 24);
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let (peak, samples) = sampler.await.expect("sampler");
    assert!(samples > 20, "sampled {samples} times");
    assert!(peak > 0, "the sampler saw prefetched files");
    let bound = ((PREFETCH + 1) * SIZE) as u64 + 64;
    assert!(
        peak <= bound,
        "temp disk use {peak} > window + one file ({bound})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetched_bytes_are_charged_to_the_memory_pool() {
    const SIZE: usize = 100_000;
    let root = tempfile::tempdir().expect("root");
    let inner = Arc::new(InMemory::new());
    put_files(inner.as_ref(), "", 20, |_| SIZE).await;
    let throttled = ThrottledStore::new(
        inner,
        ThrottleConfig {
            wait_get_per_call: Duration::from_millis(10),
            ..Default::default()
        },
    );
    let store = CountingStore::new(Arc::new(throttled));
    // A pool of 3.5 files: prefetch = 16 may hold only 3 downloads at a time.
    let session = Session::with_settings(Settings::new().memory_limit(3 * SIZE + SIZE / 2));
    session
        .register_store("memory://budget", Arc::clone(&store) as _)
        .expect("register");
    let chain = len_udf(
        session
            .from_storage("memory://budget/")
            .settings(Settings::new().prefetch(16).parallel(1).root(root.path())),
        Duration::from_millis(2),
    );
    assert_eq!(chain.count().await.expect("run"), 20);
    assert!(
        (1..=3).contains(&store.peak_in_flight()),
        "peak in flight {} with a 3.5-file memory budget",
        store.peak_in_flight()
    );
}

/// Sizes of the prefetched files under `tmp` (the owner lock file left out).
fn temp_file_sizes(tmp: &std::path::Path) -> Vec<u64> {
    let mut sizes = Vec::new();
    for dir in std::fs::read_dir(tmp).into_iter().flatten().flatten() {
        for f in std::fs::read_dir(dir.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            // The owner lock, and its `.new` name before the rename that
            // publishes it (a sampler can catch a dir being created).
            if !f
                .file_name()
                .to_string_lossy()
                .starts_with(udfchain::testing::LOCK_FILE)
            {
                sizes.extend(f.metadata().map(|m| m.len()));
            }
        }
    }
    sizes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_files_are_prefetched_into_memory_and_large_ones_to_disk() {
    // Over a store the engine treats as remote, small files are held in
    // memory and large ones downloaded to the temp dir; over the local file
    // system the same files are read ahead and never copied to it.
    const SMALL: usize = 4096;
    const LARGE: usize = 200 * 1024;
    let root = tempfile::tempdir().expect("root");
    let data = tempfile::tempdir().expect("data");
    let rels = write_files(data.path(), 12, |i| if i % 2 == 0 { SMALL } else { LARGE });
    let expected: std::collections::BTreeMap<String, Vec<u8>> = rels
        .iter()
        .map(|r| (r.clone(), std::fs::read(data.path().join(r)).expect("read")))
        .collect();
    let settings = Settings::new()
        .prefetch(4)
        .parallel(1)
        .memory_file_limit(64 * 1024)
        .root(root.path());
    let remote = remote_view(data.path(), "remote");
    let local = data.path().display().to_string();
    for (session, uri, remote_store) in [
        (&remote, "memory://remote/", true),
        (&Session::new(), local.as_str(), false),
    ] {
        // Whole reads, range reads and seeks of every file match the original.
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (flag, tmp) = (Arc::clone(&done), root.path().join("tmp"));
        let sampler = tokio::spawn(async move {
            let mut seen = std::collections::BTreeSet::new();
            while !flag.load(std::sync::atomic::Ordering::SeqCst) {
                seen.extend(temp_file_sizes(&tmp));
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            seen
        });
        #[derive(serde::Serialize, serde::Deserialize)]
        struct Parts {
            whole: Vec<u8>,
            range: Vec<u8>,
            sought: Vec<u8>,
        }
        #[derive(serde::Deserialize)]
        struct Named {
            path: String,
        }
        #[derive(serde::Deserialize)]
        struct Row {
            file: Named,
            parts: Parts,
        }
        let (batches, report) = session
            .from_storage(uri)
            .settings(settings.clone())
            .map("parts", |f: File| async move {
                let whole = f.read().await?.to_vec();
                let range = f.read_range(100..300).await?.to_vec();
                let mut reader = f.open().await?;
                reader.seek(std::io::SeekFrom::Start(1000)).await?;
                let mut sought = vec![0u8; 50];
                reader.read_exact(&mut sought).await?;
                tokio::time::sleep(Duration::from_millis(10)).await;
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(Parts {
                    whole,
                    range,
                    sought,
                })
            })
            .collect_with_report()
            .await
            .expect("run");
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        let seen = sampler.await.expect("sampler");
        let rows: Vec<Row> = batches
            .iter()
            .flat_map(|b| serde_arrow::from_record_batch::<Vec<Row>>(b).expect("rows"))
            .collect();
        assert_eq!(rows.len(), 12, "{uri}");
        for Row { file, parts } in &rows {
            let want = &expected[&file.path];
            assert_eq!(&parts.whole, want, "{uri} {}", file.path);
            assert_eq!(parts.range, want[100..300], "{uri} {}", file.path);
            assert_eq!(parts.sought, want[1000..1050], "{uri} {}", file.path);
        }
        assert_eq!(report.metric("PrefetchExec", "files_fetched"), 12, "{uri}");
        assert!(
            !seen.contains(&(SMALL as u64)),
            "{uri}: a small file was written to the temp dir: sizes seen {seen:?}"
        );
        if remote_store {
            assert!(
                seen.contains(&(LARGE as u64)),
                "large files go to the temp dir: sizes seen {seen:?}"
            );
        } else {
            assert!(
                seen.is_empty(),
                "local files were copied: sizes seen {seen:?}"
            );
        }
    }

    // A UDF that wants a path gets one, also for a file held in memory; a
    // local file's path is the file itself (it is never copied).
    for (session, uri, in_place) in [
        (&remote, "memory://remote/", false),
        (&Session::new(), local.as_str(), true),
    ] {
        let sums: Vec<(String, String, Vec<u8>)> = session
            .from_storage(uri)
            .settings(settings.clone())
            .map("at", |f: File| async move {
                let path = f.local_path().ok_or("no local path")?;
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(path.display().to_string())
            })
            .map("bytes", |f: File| async move {
                let path = f.local_path().ok_or("no local path")?;
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(std::fs::read(path)?)
            })
            .select([col("file.path").alias("path"), col("at"), col("bytes")])
            .to_rows()
            .await
            .expect("run");
        assert_eq!(sums.len(), 12, "{uri}");
        for (path, at, bytes) in &sums {
            assert_eq!(bytes, &expected[path], "{uri} {path}");
            let own = data.path().join(path).display().to_string();
            assert_eq!(at == &own, in_place, "{uri} {path}: local path {at}");
        }
    }
    assert!(prefetch_dirs(root.path()).is_empty(), "temp dirs removed");
}

/// Executing a plan makes no file system call: the prefetch stream opens its
/// temp dir (and the shared cache) on the blocking pool before its first row,
/// so `execute()` never blocks the thread that drives the query.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executing_the_plan_touches_no_disk_until_the_first_row() {
    let root = tempfile::tempdir().expect("root");
    let data = tempfile::tempdir().expect("data");
    write_files(data.path(), 6, |_| 2048);
    let chain = Chain::from_storage(&data.path().display().to_string())
        .settings(
            Settings::new()
                .root(root.path())
                .prefetch(2)
                .memory_file_limit(0),
        )
        .map("n", |f: File| async move {
            f.read().await.map(|b| b.len() as u64)
        });
    let mut stream = chain.stream().await.expect("executed");
    assert!(
        !root.path().join("tmp").exists(),
        "execute() made the temp dir"
    );
    let first = stream.next().await.expect("a batch").expect("ok");
    assert!(first.num_rows() > 0);
    let mut rows = first.num_rows();
    while let Some(b) = stream.next().await {
        rows += b.expect("ok").num_rows();
    }
    assert_eq!(rows, 6);
    drop(stream);
    assert!(no_prefetch_dirs_soon(root.path()).await.is_empty());
}
