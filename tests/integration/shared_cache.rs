//! The shared persistent cache on real files: no rerun downloads, one download for
//! concurrent callers (threads and processes), truncated entries are refetched,
//! wrong-size downloads and cancelled downloads leave nothing, the LRU limit.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::future::join_all;
use udfchain::cache::{CacheUsage, SharedCache};
use udfchain::{Error, File};

fn file(i: usize, size: u64) -> File {
    File {
        source: "memory:///cache-test".into(),
        path: format!("dir/f{i}.bin"),
        size,
        etag: Some(format!("\"etag-{i}\"")),
        ..Default::default()
    }
}

fn content(i: usize, size: u64) -> Vec<u8> {
    (0..size as usize)
        .map(|j| ((i * 31 + j * 7) % 251) as u8)
        .collect()
}

fn io_error(path: &Path, e: std::io::Error) -> Error {
    Error::Io {
        path: path.display().to_string(),
        source: Arc::new(e),
    }
}

/// A fetch that counts its calls, waits `delay`, then writes `bytes` to the temp path.
fn fetcher(
    calls: &Arc<AtomicUsize>,
    bytes: Vec<u8>,
    delay: Duration,
) -> impl FnOnce(PathBuf) -> futures::future::BoxFuture<'static, udfchain::Result<()>> + use<> {
    let calls = Arc::clone(calls);
    move |tmp: PathBuf| {
        Box::pin(async move {
            calls.fetch_add(1, Ordering::SeqCst);
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            tokio::fs::write(&tmp, &bytes)
                .await
                .map_err(|e| io_error(&tmp, e))
        })
    }
}

/// Every file under `dir`, recursively.
fn all_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir") {
            let p = e.expect("dir entry").path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

fn temp_files(dir: &Path) -> Vec<PathBuf> {
    all_files(dir)
        .into_iter()
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(".tmp-"))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rerun_does_not_download() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cache = SharedCache::open(tmp.path().join("cache"), None).expect("open");
    let calls = Arc::new(AtomicUsize::new(0));
    let f = file(1, 1234);
    assert_eq!(cache.get(&f), None);

    let (p1, downloaded) = cache
        .get_or_fetch(&f, fetcher(&calls, content(1, 1234), Duration::ZERO))
        .await
        .expect("first");
    assert!(downloaded);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(p1.starts_with(cache.dir()));
    let key = SharedCache::key(&f);
    assert_eq!(p1, cache.dir().join(&key[..2]).join(&key));

    // A second cache over the same dir, as in a rerun.
    let rerun = SharedCache::open(tmp.path().join("cache"), None).expect("reopen");
    let (p2, downloaded) = rerun
        .get_or_fetch(&f, fetcher(&calls, content(1, 1234), Duration::ZERO))
        .await
        .expect("second");
    assert!(!downloaded);
    assert_eq!(calls.load(Ordering::SeqCst), 1, "rerun must not download");
    assert_eq!(p1, p2);
    let got = rerun.get(&f).expect("entry present");
    assert_eq!(std::fs::read(got).expect("read"), content(1, 1234));
    assert_eq!(
        rerun.du().expect("du"),
        CacheUsage {
            files: 1,
            bytes: 1234
        }
    );
    assert!(temp_files(cache.dir()).is_empty());
}

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
    assert!(results.iter().all(|(p, _)| *p == results[0].0));
    assert_eq!(
        std::fs::read(&results[0].0).expect("read"),
        content(2, 4096)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_entry_is_refetched() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cache = SharedCache::open(tmp.path(), None).expect("open");
    let calls = Arc::new(AtomicUsize::new(0));
    let f = file(3, 5000);
    let (path, _) = cache
        .get_or_fetch(&f, fetcher(&calls, content(3, 5000), Duration::ZERO))
        .await
        .expect("fetch");

    std::fs::File::options()
        .write(true)
        .open(&path)
        .expect("open entry")
        .set_len(2000)
        .expect("truncate");
    assert_eq!(cache.get(&f), None, "a truncated entry is no hit");
    assert!(!path.exists(), "and is deleted");

    let (again, downloaded) = cache
        .get_or_fetch(&f, fetcher(&calls, content(3, 5000), Duration::ZERO))
        .await
        .expect("refetch");
    assert!(downloaded);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(again, path);
    assert_eq!(std::fs::read(&again).expect("read"), content(3, 5000));

    // Truncated behind get's back, get_or_fetch notices as well.
    std::fs::File::options()
        .write(true)
        .open(&path)
        .expect("open entry")
        .set_len(0)
        .expect("truncate");
    let (_, downloaded) = cache
        .get_or_fetch(&f, fetcher(&calls, content(3, 5000), Duration::ZERO))
        .await
        .expect("refetch");
    assert!(downloaded);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(std::fs::read(&path).expect("read"), content(3, 5000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_size_download_fails_and_leaves_nothing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cache = SharedCache::open(tmp.path(), None).expect("open");
    let calls = Arc::new(AtomicUsize::new(0));
    let f = file(4, 1000);
    let err = cache
        .get_or_fetch(&f, fetcher(&calls, content(4, 999), Duration::ZERO))
        .await
        .expect_err("a short download must fail");
    let msg = err.to_string();
    assert!(msg.contains(&f.url()), "names the file: {msg}");
    assert!(
        msg.contains("999") && msg.contains("1000"),
        "names both sizes: {msg}"
    );
    assert_eq!(cache.get(&f), None);
    assert_eq!(cache.du().expect("du"), CacheUsage::default());
    assert!(temp_files(cache.dir()).is_empty());

    // A failing fetch: its error comes back, nothing is left, a retry works.
    let err = cache
        .get_or_fetch(&f, |tmp: PathBuf| async move {
            std::fs::write(&tmp, b"partial").map_err(|e| io_error(&tmp, e))?;
            Err(Error::Plan("network down".into()))
        })
        .await
        .expect_err("fetch error");
    assert!(err.to_string().contains("network down"), "{err}");
    assert_eq!(cache.get(&f), None);
    assert!(temp_files(cache.dir()).is_empty());
    let (_, downloaded) = cache
        .get_or_fetch(&f, fetcher(&calls, content(4, 1000), Duration::ZERO))
        .await
        .expect("retry");
    assert!(downloaded);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_fetch_leaves_nothing_and_releases_the_key() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cache = SharedCache::open(tmp.path(), None).expect("open");
    let f = file(5, 2000);
    let started = Arc::new(tokio::sync::Notify::new());
    let fut = cache.get_or_fetch(&f, {
        let started = Arc::clone(&started);
        move |tmp: PathBuf| async move {
            std::fs::write(&tmp, &content(5, 2000)[..700]).map_err(|e| io_error(&tmp, e))?;
            started.notify_one();
            tokio::time::sleep(Duration::from_secs(30)).await;
            Ok(())
        }
    });
    tokio::select! {
        r = fut => panic!("the fetch cannot finish: {r:?}"),
        () = started.notified() => {}
    }
    // The future is dropped: no entry, no temp file, and the key is not stuck.
    assert_eq!(cache.get(&f), None);
    assert!(temp_files(cache.dir()).is_empty());
    let calls = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let (path, downloaded) = cache
        .get_or_fetch(&f, fetcher(&calls, content(5, 2000), Duration::ZERO))
        .await
        .expect("fetch after cancel");
    assert!(downloaded);
    assert!(start.elapsed() < Duration::from_secs(2));
    assert_eq!(std::fs::read(path).expect("read"), content(5, 2000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_evicts_least_recently_used() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cache = SharedCache::open(tmp.path(), Some(3 * 1000)).expect("open");
    let calls = Arc::new(AtomicUsize::new(0));
    for i in 0..10 {
        let f = file(i, 1000);
        cache
            .get_or_fetch(&f, fetcher(&calls, content(i, 1000), Duration::ZERO))
            .await
            .expect("fetch");
        assert!(cache.get(&f).is_some(), "the entry just written stays");
        let du = cache.du().expect("du");
        assert!(du.bytes <= 3000, "over the limit after entry {i}: {du:?}");
        // Keep entry 0 the most recently used one.
        assert!(
            cache.get(&file(0, 1000)).is_some(),
            "entry 0 evicted at {i}"
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), 10);
    let p0 = cache.get(&file(0, 1000)).expect("entry 0 present");
    assert_eq!(std::fs::read(p0).expect("read"), content(0, 1000));
    assert!(cache.get(&file(9, 1000)).is_some());

    let before = cache.du().expect("du");
    assert!(before.files >= 2);
    assert_eq!(cache.prune_to(0).expect("prune"), before);
    assert_eq!(cache.du().expect("du"), CacheUsage::default());
    assert_eq!(cache.get(&file(0, 1000)), None);

    // clear: entries, lock files and leftover temp files (e.g. of a killed process) go.
    for i in 0..3 {
        cache
            .get_or_fetch(
                &file(i, 1000),
                fetcher(&calls, content(i, 1000), Duration::ZERO),
            )
            .await
            .expect("fetch");
    }
    let key = SharedCache::key(&file(7, 1000));
    let leftover = cache
        .dir()
        .join(&key[..2])
        .join(format!(".tmp-{key}-leftover"));
    std::fs::create_dir_all(leftover.parent().expect("parent")).expect("mkdir");
    std::fs::write(&leftover, b"half").expect("write leftover");
    assert_eq!(
        cache.du().expect("du").files,
        3,
        "temp files are not entries"
    );
    cache.clear().expect("clear");
    assert_eq!(cache.du().expect("du"), CacheUsage::default());
    assert_eq!(cache.get(&file(1, 1000)), None);
    assert_eq!(all_files(cache.dir()), Vec::<PathBuf>::new());
}

#[test]
fn keys_are_stable_and_distinguish_identity() {
    let f = file(1, 10);
    let key = SharedCache::key(&f);
    assert_eq!(key.len(), 64);
    assert!(key.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(key, SharedCache::key(&f.clone()));
    let other = |g: File| assert_ne!(SharedCache::key(&g), key);
    other(File {
        etag: Some("\"changed\"".into()),
        ..f.clone()
    });
    other(File {
        path: "dir/other.bin".into(),
        ..f.clone()
    });
    other(File {
        location: Some("member.txt".into()),
        ..f.clone()
    });
    // A version takes precedence over the etag.
    let v = File {
        version: Some("v1".into()),
        ..f.clone()
    };
    assert_eq!(
        SharedCache::key(&v),
        SharedCache::key(&File {
            etag: None,
            ..v.clone()
        })
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
                    "shared_cache::child_process_worker",
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

/// How many children wrote their `<go>.<pid>` ready marker.
fn ready_children(go: &Path) -> usize {
    let (Some(dir), Some(name)) = (go.parent(), go.file_name().and_then(|n| n.to_str())) else {
        return 0;
    };
    let prefix = format!("{name}.");
    std::fs::read_dir(dir)
        .expect("read_dir")
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        })
        .count()
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
                std::fs::read(path).expect("read"),
                content(i, child_size(i))
            );
        }
    });
    join_all(work).await;
}
