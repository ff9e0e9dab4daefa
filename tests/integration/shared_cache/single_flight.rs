//! One download per key for concurrent callers, handles, queries and processes.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::future::join_all;
use udfchain::SharedCache;

use super::{checked_run, content, counted, fetcher, file, io_error, ready_children, temp_files};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_callers_share_one_fetch() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cache = SharedCache::open(tmp.path(), None).expect("open");
    let calls = Arc::new(AtomicUsize::new(0));
    let f = file(2, 4096);
    let tasks = (0..8).map(|_| {
        let (cache, calls, f) = (Arc::clone(&cache), Arc::clone(&calls), f.clone());
        tokio::spawn(async move {
            cache
                .get_or_fetch(
                    &f,
                    fetcher(&calls, content(2, 4096), Duration::from_millis(50)),
                )
                .await
        })
    });
    let results: Vec<_> = join_all(tasks)
        .await
        .into_iter()
        .map(|r| r.expect("task").expect("get_or_fetch"))
        .collect();
    assert_eq!(calls.load(Ordering::SeqCst), 1, "exactly one fetch");
    assert_eq!(
        results.iter().filter(|(_, downloaded)| *downloaded).count(),
        1
    );
    assert!(results.iter().all(|(p, _)| p.path() == results[0].0.path()));
    assert_eq!(
        std::fs::read(results[0].0.path()).expect("read"),
        content(2, 4096)
    );
}

const CHILD_DIR: &str = "UDFCHAIN_TEST_SHARED_CACHE_DIR";
const CHILD_LOG: &str = "UDFCHAIN_TEST_SHARED_CACHE_LOG";
const CHILD_GO: &str = "UDFCHAIN_TEST_SHARED_CACHE_GO";
const CHILD_KEYS: usize = 20;

fn child_size(i: usize) -> u64 {
    100 + 37 * i as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_download_each_key_once() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("cache");
    let log = tmp.path().join("downloads.log");
    let go = tmp.path().join("go");
    let exe = std::env::current_exe().expect("current exe");
    let children: Vec<_> = (0..2)
        .map(|_| {
            Command::new(&exe)
                .args([
                    "--exact",
                    "shared_cache::single_flight::child_process_worker",
                    "--ignored",
                    "--nocapture",
                ])
                .env(CHILD_DIR, &dir)
                .env(CHILD_LOG, &log)
                .env(CHILD_GO, &go)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn child")
        })
        .collect();
    // Once both are ready (each writes `<go>.<pid>`), let them go at once.
    let deadline = Instant::now() + Duration::from_secs(20);
    while ready_children(&go) < 2 {
        assert!(Instant::now() < deadline, "children not ready");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    std::fs::write(&go, b"go").expect("go marker");
    let outputs = tokio::task::spawn_blocking(move || {
        children
            .into_iter()
            .map(|c| c.wait_with_output().expect("wait child"))
            .collect::<Vec<_>>()
    })
    .await
    .expect("join");
    for out in &outputs {
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "child failed: {}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains("1 passed"),
            "the worker did not run: {stdout}"
        );
    }

    let cache = SharedCache::open(&dir, None).expect("open");
    let mut want: Vec<String> = Vec::new();
    for i in 0..CHILD_KEYS {
        let f = file(i, child_size(i));
        let p = cache.get(&f).expect("entry present");
        assert_eq!(std::fs::read(p).expect("read"), content(i, child_size(i)));
        want.push(SharedCache::key(&f));
    }
    let mut got: Vec<String> = std::fs::read_to_string(&log)
        .expect("downloads log")
        .lines()
        .map(str::to_string)
        .collect();
    got.sort();
    want.sort();
    assert_eq!(
        got, want,
        "each key downloaded exactly once across processes"
    );
    assert!(temp_files(&dir).is_empty());
}

/// Run by `two_processes_download_each_key_once` in a child process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a child process of two_processes_download_each_key_once"]
async fn child_process_worker() {
    let Some(dir) = std::env::var_os(CHILD_DIR) else {
        return;
    };
    let log = PathBuf::from(std::env::var_os(CHILD_LOG).expect("log env"));
    let go = PathBuf::from(std::env::var_os(CHILD_GO).expect("go env"));
    let ready = PathBuf::from(format!("{}.{}", go.display(), std::process::id()));
    std::fs::write(ready, b"ready").expect("ready marker");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !go.exists() {
        assert!(Instant::now() < deadline, "no go marker");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let cache = SharedCache::open(PathBuf::from(dir), None).expect("open");
    let work = (0..CHILD_KEYS).map(|i| {
        let (cache, log) = (Arc::clone(&cache), log.clone());
        async move {
            let f = file(i, child_size(i));
            let key = SharedCache::key(&f);
            let (path, _) = cache
                .get_or_fetch(&f, |tmp: PathBuf| async move {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    std::fs::write(&tmp, content(i, child_size(i)))
                        .map_err(|e| io_error(&tmp, e))?;
                    let mut l = std::fs::File::options()
                        .create(true)
                        .append(true)
                        .open(&log)
                        .map_err(|e| io_error(&log, e))?;
                    // One write of one line: appends do not interleave.
                    l.write_all(format!("{key}\n").as_bytes())
                        .map_err(|e| io_error(&log, e))
                })
                .await
                .expect("get_or_fetch");
            assert_eq!(
                std::fs::read(path.path()).expect("read"),
                content(i, child_size(i))
            );
        }
    });
    join_all(work).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handles_on_one_dir_share_one_instance() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("cache");
    let a = SharedCache::open(&dir, Some(3000)).expect("open a");
    // Another spelling of the same dir.
    let b = SharedCache::open(dir.join("..").join("cache"), Some(3000)).expect("open b");
    assert_eq!(a.dir(), b.dir());
    let calls = Arc::new(AtomicUsize::new(0));
    // Writes alternate between the handles: one size estimate sees them all, so
    // the cache stays within its limit after every write (with one estimate per
    // handle, each saw half of the writes and the dir grew past the limit).
    for i in 0..12 {
        let cache = if i % 2 == 0 { &a } else { &b };
        let (pin, _) = cache
            .get_or_fetch(
                &file(i, 1000),
                fetcher(&calls, content(i, 1000), Duration::ZERO),
            )
            .await
            .expect("fetch");
        drop(pin);
        let du = a.du().expect("du");
        assert!(du.bytes <= 3000, "over the limit after entry {i}: {du:?}");
    }
    // Both handles' callers of one key share one fetch.
    let f = file(100, 500);
    let slow = || fetcher(&calls, content(100, 500), Duration::from_millis(100));
    let before = calls.load(Ordering::SeqCst);
    let (ra, rb) = tokio::join!(a.get_or_fetch(&f, slow()), b.get_or_fetch(&f, slow()));
    let (ra, rb) = (ra.expect("a"), rb.expect("b"));
    assert_eq!(calls.load(Ordering::SeqCst) - before, 1);
    assert!(ra.1 != rb.1, "one of them downloaded");
    assert_eq!(ra.0.path(), rb.0.path());
}

/// Two queries (two prefetch operators, several partitions each) over the same
/// files at once, in one process: one GET per file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_queries_fetch_each_file_once() {
    let root = tempfile::tempdir().expect("root");
    let (session, store) = counted("twice", 60, 3_000).await;
    let settings = udfchain::Settings::new()
        .cache(true)
        .prefetch(16)
        .parallel(4)
        .root(root.path());
    let (a, b) = tokio::join!(
        checked_run(&session, "memory://twice/", settings.clone()),
        checked_run(&session, "memory://twice/", settings.clone())
    );
    assert_eq!((a, b), (60, 60));
    assert_eq!(store.gets(), 60, "one GET per file across both queries");
}
