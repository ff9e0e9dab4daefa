//! The shared persistent cache on real files: no rerun downloads, one download for
//! concurrent callers (threads and processes), truncated entries are refetched,
//! wrong-size downloads and cancelled downloads leave nothing, the LRU limit;
//! pinned entries survive pruning (in this process and from another one, until
//! it is killed), one instance per dir per process, prefetch windows hold their
//! entries, a four-process stress run on one dir, and a writer killed with
//! SIGKILL mid-download leaves no entry and a temp file that pruning removes.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::future::join_all;
use udfchain::{CacheUsage, SharedCache};
use udfchain::{Error, File};

mod temp_cache;

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
    assert!(p1.path().starts_with(cache.dir()));
    let key = SharedCache::key(&f);
    assert_eq!(p1.path(), cache.dir().join(&key[..2]).join(&key));

    // A second cache over the same dir, as in a rerun.
    let rerun = SharedCache::open(tmp.path().join("cache"), None).expect("reopen");
    let (p2, downloaded) = rerun
        .get_or_fetch(&f, fetcher(&calls, content(1, 1234), Duration::ZERO))
        .await
        .expect("second");
    assert!(!downloaded);
    assert_eq!(calls.load(Ordering::SeqCst), 1, "rerun must not download");
    assert_eq!(p1.path(), p2.path());
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
    assert!(results.iter().all(|(p, _)| p.path() == results[0].0.path()));
    assert_eq!(
        std::fs::read(results[0].0.path()).expect("read"),
        content(2, 4096)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_entry_is_refetched() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cache = SharedCache::open(tmp.path(), None).expect("open");
    let calls = Arc::new(AtomicUsize::new(0));
    let f = file(3, 5000);
    let (pin, _) = cache
        .get_or_fetch(&f, fetcher(&calls, content(3, 5000), Duration::ZERO))
        .await
        .expect("fetch");
    let path = pin.path().to_path_buf();
    // Pinned or not, a wrong-size entry is no hit.

    std::fs::File::options()
        .write(true)
        .open(&path)
        .expect("open entry")
        .set_len(2000)
        .expect("truncate");
    assert_eq!(cache.get(&f), None, "a truncated entry is no hit");
    assert!(!path.exists(), "and is deleted");
    drop(pin);

    let (again, downloaded) = cache
        .get_or_fetch(&f, fetcher(&calls, content(3, 5000), Duration::ZERO))
        .await
        .expect("refetch");
    assert!(downloaded);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(again.path(), path);
    assert_eq!(std::fs::read(again.path()).expect("read"), content(3, 5000));
    drop(again);

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
    assert_eq!(std::fs::read(path.path()).expect("read"), content(5, 2000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_evicts_least_recently_used() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cache = SharedCache::open(tmp.path(), Some(3 * 1000)).expect("open");
    let calls = Arc::new(AtomicUsize::new(0));
    for i in 0..10 {
        let f = file(i, 1000);
        let _ = cache
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
        let _ = cache
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
                std::fs::read(path.path()).expect("read"),
                content(i, child_size(i))
            );
        }
    });
    join_all(work).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pinned_entries_survive_pruning_and_clear() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cache = SharedCache::open(tmp.path(), Some(3 * 1000)).expect("open");
    let calls = Arc::new(AtomicUsize::new(0));
    let (pin0, _) = cache
        .get_or_fetch(
            &file(0, 1000),
            fetcher(&calls, content(0, 1000), Duration::ZERO),
        )
        .await
        .expect("fetch 0");
    // Entry 0 is the least recently used from here on, but pinned.
    for i in 1..10 {
        let (pin, _) = cache
            .get_or_fetch(
                &file(i, 1000),
                fetcher(&calls, content(i, 1000), Duration::ZERO),
            )
            .await
            .expect("fetch");
        drop(pin);
        assert!(pin0.path().exists(), "pinned entry 0 evicted at {i}");
    }
    assert_eq!(std::fs::read(pin0.path()).expect("read"), content(0, 1000));
    assert!(cache.du().expect("du").bytes <= 3000);

    // A second pin of the same entry through another handle on the same dir.
    let other = SharedCache::open(tmp.path(), None).expect("reopen");
    let pin0b = other.pin(&file(0, 1000)).expect("pin 0 again");
    let before = cache.du().expect("du");
    assert!(before.files >= 2);
    assert_eq!(cache.prune_to(0).expect("prune").files, before.files - 1);
    assert_eq!(
        cache.du().expect("du"),
        CacheUsage {
            files: 1,
            bytes: 1000
        },
        "only the pinned entry is left"
    );
    drop(pin0);
    cache.clear().expect("clear");
    assert!(pin0b.path().exists(), "still pinned by the second pin");
    drop(pin0b);
    assert_eq!(cache.prune_to(0).expect("prune").files, 1);
    assert_eq!(cache.du().expect("du"), CacheUsage::default());
    assert_eq!(calls.load(Ordering::SeqCst), 10);
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

/// A store of `n` files of `size` bytes (`udfchain_testkit::content`), counting GETs.
async fn counted_store(n: usize, size: usize) -> Arc<udfchain_testkit::CountingStore> {
    let inner = Arc::new(object_store::memory::InMemory::new());
    udfchain_testkit::put_files(inner.as_ref(), "", n, |_| size).await;
    udfchain_testkit::CountingStore::new(inner)
}

/// Runs a map UDF over `uri` that checks every file's bytes against
/// `udfchain_testkit::content` (by the number in its name); returns the rows.
async fn checked_run(
    session: &Arc<udfchain::Session>,
    uri: &str,
    settings: udfchain::Settings,
) -> usize {
    let batches = session
        .from_storage(uri)
        .settings(settings)
        .map("ok", |f: File| async move {
            let bytes = f.read().await?;
            let i: usize = f
                .name()
                .trim_start_matches('f')
                .trim_end_matches(".bin")
                .parse()
                .expect("file number");
            Ok::<_, udfchain::udfs::UdfError>(
                bytes.as_ref() == udfchain_testkit::content(i, bytes.len()).as_slice()
                    && bytes.len() as u64 == f.size,
            )
        })
        .collect()
        .await
        .expect("run");
    let mut rows = 0;
    for b in &batches {
        let ok = b
            .column_by_name("ok")
            .expect("ok column")
            .as_any()
            .downcast_ref::<udfchain::datafusion::arrow::array::BooleanArray>()
            .expect("bool");
        assert_eq!(ok.true_count(), ok.len(), "a file read back wrong");
        rows += b.num_rows();
    }
    rows
}

/// With a limit below one file, every write prunes; the entries a prefetch
/// window holds for its rows stay until the UDF has read them, so the UDF
/// never falls back to a second GET.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetch_window_holds_its_entries_under_a_tiny_limit() {
    let root = tempfile::tempdir().expect("root");
    let store = counted_store(24, 10_000).await;
    let session = udfchain::Session::new();
    session
        .register_store("memory://pinned", Arc::clone(&store) as _)
        .expect("register");
    let settings = udfchain::Settings::new()
        .cache(true)
        .cache_limit(5_000)
        .prefetch(8)
        .parallel(2)
        .root(root.path());
    assert_eq!(
        checked_run(&session, "memory://pinned/", settings).await,
        24
    );
    assert_eq!(
        store.gets(),
        24,
        "one GET per file: no entry evicted before its read"
    );
    // Pins are released with the rows: the next write prunes the cache back.
    let cache = SharedCache::open(root.path().join("cache"), Some(5_000)).expect("open");
    cache.prune_to(0).expect("prune");
    assert_eq!(
        cache.du().expect("du"),
        CacheUsage::default(),
        "no pin outlives the run"
    );
}

/// Two queries (two prefetch operators, several partitions each) over the same
/// files at once, in one process: one GET per file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_queries_fetch_each_file_once() {
    let root = tempfile::tempdir().expect("root");
    let store = counted_store(60, 3_000).await;
    let session = udfchain::Session::new();
    session
        .register_store("memory://twice", Arc::clone(&store) as _)
        .expect("register");
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

/// A child process of this test binary running the ignored test `test`, killed
/// (SIGKILL) and reaped when dropped.
struct ChildTest(Option<std::process::Child>);

impl ChildTest {
    fn spawn(test: &str, envs: &[(&str, &std::ffi::OsStr)]) -> Self {
        let exe = std::env::current_exe().expect("current exe");
        let mut cmd = Command::new(exe);
        cmd.args(["--exact", test, "--ignored", "--nocapture"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in envs {
            cmd.env(k, v);
        }
        Self(Some(cmd.spawn().expect("spawn child")))
    }

    /// Sends SIGKILL and reaps the child; returns its exit status.
    fn kill(&mut self) -> std::process::ExitStatus {
        let mut child = self.0.take().expect("child");
        child.kill().expect("SIGKILL");
        child.wait().expect("wait child")
    }

    /// Waits for the child to exit and returns its output.
    async fn output(mut self) -> std::process::Output {
        let child = self.0.take().expect("child");
        tokio::task::spawn_blocking(move || child.wait_with_output().expect("wait child"))
            .await
            .expect("join")
    }
}

impl Drop for ChildTest {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Waits (up to 20 s) until `ready()`.
async fn wait_until(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ready() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

const PIN_DIR: &str = "UDFCHAIN_TEST_PIN_DIR";
const PIN_READY: &str = "UDFCHAIN_TEST_PIN_READY";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pin_in_another_process_holds_its_entry_until_that_process_is_killed() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("cache");
    let ready = tmp.path().join("ready");
    let mut child = ChildTest::spawn(
        "shared_cache::child_pin_holder",
        &[(PIN_DIR, dir.as_os_str()), (PIN_READY, ready.as_os_str())],
    );
    wait_until("the child's pin", || ready.exists()).await;

    let cache = SharedCache::open(&dir, None).expect("open");
    let calls = Arc::new(AtomicUsize::new(0));
    let (pin, _) = cache
        .get_or_fetch(
            &file(78, 3000),
            fetcher(&calls, content(78, 3000), Duration::ZERO),
        )
        .await
        .expect("fetch");
    drop(pin);
    // Entry 77 (pinned by the child) is the least recently used one.
    assert_eq!(
        cache.prune_to(0).expect("prune"),
        CacheUsage {
            files: 1,
            bytes: 3000
        },
        "only the unpinned entry goes"
    );
    cache.clear().expect("clear");
    let held = cache
        .get(&file(77, 3000))
        .expect("the child's pinned entry stays");
    assert_eq!(std::fs::read(held).expect("read"), content(77, 3000));

    let status = child.kill();
    assert!(!status.success(), "the child was killed: {status}");
    // Its pin died with it.
    assert_eq!(cache.prune_to(0).expect("prune").files, 1);
    assert_eq!(cache.du().expect("du"), CacheUsage::default());
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// Run by `a_pin_in_another_process_holds_its_entry_until_that_process_is_killed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a child process of a_pin_in_another_process_holds_its_entry_until_that_process_is_killed"]
async fn child_pin_holder() {
    let Some(dir) = std::env::var_os(PIN_DIR) else {
        return;
    };
    let ready = PathBuf::from(std::env::var_os(PIN_READY).expect("ready env"));
    let cache = SharedCache::open(PathBuf::from(dir), None).expect("open");
    let calls = Arc::new(AtomicUsize::new(0));
    let (pin, _) = cache
        .get_or_fetch(
            &file(77, 3000),
            fetcher(&calls, content(77, 3000), Duration::ZERO),
        )
        .await
        .expect("fetch");
    std::fs::write(&ready, b"pinned").expect("ready marker");
    tokio::time::sleep(Duration::from_secs(60)).await;
    drop(pin);
}

/// An S3 client of the loopback test server.
fn s3_store(endpoint: &str) -> Arc<dyn object_store::ObjectStore> {
    use udfchain_testkit::{ACCESS_KEY, BUCKET, SECRET_KEY};
    Arc::new(
        object_store::aws::AmazonS3Builder::new()
            .with_endpoint(endpoint)
            .with_allow_http(true)
            .with_access_key_id(ACCESS_KEY)
            .with_secret_access_key(SECRET_KEY)
            .with_region("us-east-1")
            .with_bucket_name(BUCKET)
            .with_virtual_hosted_style_request(false)
            .build()
            .expect("s3 store"),
    )
}

/// Pseudo-random bytes (xorshift64*) seeded by `seed`.
fn random_bytes(seed: u64, size: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(size + 8);
    while out.len() < size {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(size);
    out
}

/// Downloads `file` (at `path` of `store`) into the cache's temp file.
async fn download_into(
    store: &Arc<dyn object_store::ObjectStore>,
    path: &str,
    file: &File,
    tmp: PathBuf,
) -> udfchain::Result<()> {
    let path = object_store::path::Path::from(path);
    udfchain::testing::download_to(store, &path, file, &tmp)
        .await
        .map(|_| ())
}

const BIG_PATH: &str = "big/object.bin";
const BIG_SIZE: usize = 2 << 20;
const KILL_DIR: &str = "UDFCHAIN_TEST_KILL_DIR";
const KILL_ENDPOINT: &str = "UDFCHAIN_TEST_KILL_ENDPOINT";

fn big_file() -> File {
    File {
        source: "s3://bucket".into(),
        path: BIG_PATH.into(),
        size: BIG_SIZE as u64,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_killed_mid_download_leaves_no_entry() {
    // 1 MiB/s: the 2 MiB download takes about two seconds.
    let server = udfchain_testkit::S3Server::start_shaped(Duration::ZERO, Some(1 << 20));
    let object = server.bucket_dir().join(BIG_PATH);
    std::fs::create_dir_all(object.parent().expect("parent")).expect("mkdir");
    let want = random_bytes(42, BIG_SIZE);
    std::fs::write(&object, &want).expect("write object");
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("cache");
    let endpoint = std::ffi::OsString::from(&server.endpoint);
    let mut child = ChildTest::spawn(
        "shared_cache::child_killed_mid_download",
        &[(KILL_DIR, dir.as_os_str()), (KILL_ENDPOINT, &endpoint)],
    );
    // Kill it while the body streams into the cache's temp file.
    let partial = |min: u64| {
        dir.exists()
            && temp_files(&dir)
                .iter()
                .any(|t| std::fs::metadata(t).is_ok_and(|m| m.len() >= min))
    };
    wait_until("the child's download", || partial(64 << 10)).await;
    let status = child.kill();
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(9), "killed mid-download: {status}");
    }
    let temps = temp_files(&dir);
    assert_eq!(temps.len(), 1, "the killed writer's temp file: {temps:?}");
    let partial_len = std::fs::metadata(&temps[0]).expect("temp").len();
    assert!(partial_len < BIG_SIZE as u64, "{partial_len} bytes");

    // The next start: no entry, nothing counted, the temp file pruned.
    let cache = SharedCache::open(&dir, None).expect("open");
    let f = big_file();
    assert_eq!(cache.get(&f), None, "no partial entry");
    assert_eq!(cache.du().expect("du"), CacheUsage::default());
    assert_eq!(
        cache.prune_to(u64::MAX).expect("prune"),
        CacheUsage::default()
    );
    assert!(temp_files(&dir).is_empty(), "prune removes the temp file");

    // The killed writer's key lock died with it: a fetch proceeds, completely.
    let store = s3_store(&server.endpoint);
    let gets = server.object_gets();
    let (pin, downloaded) = cache
        .get_or_fetch(&f, |tmp| download_into(&store, BIG_PATH, &f, tmp))
        .await
        .expect("refetch");
    assert!(downloaded);
    assert_eq!(server.object_gets() - gets, 1);
    assert!(
        std::fs::read(pin.path()).expect("read") == want,
        "complete entry"
    );
    drop(pin);

    // clear removes a killed writer's temp file too.
    let key = SharedCache::key(&file(9, 10));
    let leftover = cache
        .dir()
        .join(&key[..2])
        .join(format!(".tmp-{key}-killed"));
    std::fs::create_dir_all(leftover.parent().expect("parent")).expect("mkdir");
    std::fs::write(&leftover, b"half").expect("leftover");
    cache.clear().expect("clear");
    assert_eq!(all_files(&dir), Vec::<PathBuf>::new());
}

/// Run by `a_writer_killed_mid_download_leaves_no_entry`, killed mid-download.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a child process of a_writer_killed_mid_download_leaves_no_entry"]
async fn child_killed_mid_download() {
    let Some(dir) = std::env::var_os(KILL_DIR) else {
        return;
    };
    let endpoint = std::env::var(KILL_ENDPOINT).expect("endpoint env");
    let store = s3_store(&endpoint);
    let cache = SharedCache::open(PathBuf::from(dir), None).expect("open");
    let f = big_file();
    let (_pin, _) = cache
        .get_or_fetch(&f, |tmp| download_into(&store, BIG_PATH, &f, tmp))
        .await
        .expect("download");
    println!("the download finished before the kill");
}

const STRESS_FILES: usize = 10_000;
const STRESS_PROCS: usize = 4;
/// Reads in flight per process.
const STRESS_CONCURRENCY: usize = 16;
const STRESS_DIR: &str = "UDFCHAIN_TEST_STRESS_DIR";
const STRESS_STORE: &str = "UDFCHAIN_TEST_STRESS_STORE";
const STRESS_LIMIT: &str = "UDFCHAIN_TEST_STRESS_LIMIT";
const STRESS_GO: &str = "UDFCHAIN_TEST_STRESS_GO";

/// 1-4 KiB.
fn stress_size(i: usize) -> usize {
    1024 + (i.wrapping_mul(2_654_435_761) >> 7) % 3072
}

fn stress_path(i: usize) -> String {
    format!("stress/f{i:05}.bin")
}

fn stress_file(i: usize) -> File {
    File {
        source: "s3://bucket".into(),
        path: stress_path(i),
        size: stress_size(i) as u64,
        ..Default::default()
    }
}

/// What one stress child reported.
#[derive(Debug, Default, PartialEq)]
struct StressResult {
    reads: usize,
    corrupt: usize,
    errors: usize,
    fetched: usize,
    /// The first errors the child printed, for the assertion message.
    stderr: String,
}

/// Runs `STRESS_PROCS` children on the cache `dir`, started together, each
/// reading every stress file once in the same order (so they race for the same
/// keys); returns their reports.
async fn run_stress(dir: &Path, store: &str, limit: Option<u64>) -> Vec<StressResult> {
    let go = dir.with_extension("go");
    let limit = limit.map(|l| l.to_string()).unwrap_or_default();
    let children: Vec<_> = (0..STRESS_PROCS)
        .map(|_| {
            ChildTest::spawn(
                "shared_cache::stress_child",
                &[
                    (STRESS_DIR, dir.as_os_str()),
                    (STRESS_STORE, store.as_ref()),
                    (STRESS_LIMIT, limit.as_ref()),
                    (STRESS_GO, go.as_os_str()),
                ],
            )
        })
        .collect();
    wait_until("the stress children", || {
        ready_children(&go) == STRESS_PROCS
    })
    .await;
    std::fs::write(&go, b"go").expect("go marker");
    let mut results = Vec::new();
    for child in children {
        let out = child.output().await;
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "stress child failed: {}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let line = stdout
            .lines()
            .find_map(|l| l.strip_prefix("stress-result "))
            .unwrap_or_else(|| panic!("no result: {stdout}"));
        let mut r = StressResult {
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            ..StressResult::default()
        };
        for kv in line.split_whitespace() {
            let (k, v) = kv.split_once('=').expect("k=v");
            let v: usize = v.parse().expect("number");
            match k {
                "reads" => r.reads = v,
                "corrupt" => r.corrupt = v,
                "errors" => r.errors = v,
                "fetched" => r.fetched = v,
                _ => {}
            }
        }
        results.push(r);
    }
    results
}

/// Four processes read the same 10,000 small files through one cache dir:
/// under a limit of 1/64 of the total (constant eviction) every read
/// returns the file's exact bytes; without a limit each file is fetched once
/// across all processes, by the server's count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_processes_stress_one_cache_dir() {
    let setup = Instant::now();
    let server = udfchain_testkit::S3Server::start();
    let bucket = server.bucket_dir();
    std::fs::create_dir_all(bucket.join("stress")).expect("mkdir");
    let mut total = 0u64;
    for i in 0..STRESS_FILES {
        let bytes = random_bytes(i as u64, stress_size(i));
        total += bytes.len() as u64;
        std::fs::write(bucket.join(stress_path(i)), bytes).expect("write");
    }
    eprintln!(
        "stress: files written after {:.1} s",
        setup.elapsed().as_secs_f64()
    );
    // The cache dirs on tmpfs where there is one: removing their 20,000 files
    // from the disk took 40 s here while other builds ran (the locking and
    // renaming under test are the same; fsync costs nothing there).
    let shm = Path::new("/dev/shm");
    let tmp = if shm.is_dir() {
        tempfile::tempdir_in(shm)
    } else {
        tempfile::tempdir()
    }
    .expect("tempdir");

    // 1. Under a limit of 1/64 of the total (about 160 entries, while the four
    //    processes hold up to 64 pins), from a local dir store (the cache under
    //    test, not HTTP).
    let limit = total / 256;
    let started = Instant::now();
    let store = format!("local:{}", bucket.display());
    let limited = run_stress(&tmp.path().join("limited"), &store, Some(limit)).await;
    let limited_secs = started.elapsed().as_secs_f64();
    for r in &limited {
        assert_eq!(
            (r.reads, r.corrupt, r.errors),
            (STRESS_FILES, 0, 0),
            "limited run: {r:?}"
        );
    }
    let refetched: usize = limited.iter().map(|r| r.fetched).sum();
    assert!(refetched >= STRESS_FILES, "{refetched} fetches");
    let left = SharedCache::open(tmp.path().join("limited"), None)
        .expect("open")
        .du()
        .expect("du");
    assert!(
        left.files < STRESS_FILES as u64 / 10,
        "the limit evicted entries all along: {left:?}"
    );

    // 2. No limit, from the S3 server, every process reading the same key at once.
    let gets = server.object_gets();
    let started = Instant::now();
    let store = format!("s3:{}", server.endpoint);
    let unlimited = run_stress(&tmp.path().join("unlimited"), &store, None).await;
    let unlimited_secs = started.elapsed().as_secs_f64();
    for r in &unlimited {
        assert_eq!(
            (r.reads, r.corrupt, r.errors),
            (STRESS_FILES, 0, 0),
            "unlimited run: {r:?}"
        );
    }
    assert_eq!(
        server.object_gets() - gets,
        STRESS_FILES,
        "each key fetched exactly once across {STRESS_PROCS} processes"
    );
    assert_eq!(
        unlimited.iter().map(|r| r.fetched).sum::<usize>(),
        STRESS_FILES
    );
    let cache = SharedCache::open(tmp.path().join("unlimited"), None).expect("open");
    assert_eq!(
        cache.du().expect("du"),
        CacheUsage {
            files: STRESS_FILES as u64,
            bytes: total
        }
    );
    assert!(temp_files(cache.dir()).is_empty());
    assert_eq!(
        all_files(cache.dir()).len(),
        STRESS_FILES,
        "one file per entry: no lock file stays behind"
    );
    println!(
        "stress: {STRESS_PROCS} processes x {STRESS_FILES} files ({total} bytes): \
         limit {limit}: {limited_secs:.1} s, {refetched} fetches; \
         no limit: {unlimited_secs:.1} s, {} GETs",
        STRESS_FILES
    );
}

/// Run by `four_processes_stress_one_cache_dir`: reads every stress file once
/// through the cache, holding each entry's pin while it reads (after a short
/// pause, as a UDF would), and compares the bytes with the expected ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a child process of four_processes_stress_one_cache_dir"]
async fn stress_child() {
    use futures::StreamExt;
    let Some(dir) = std::env::var_os(STRESS_DIR) else {
        return;
    };
    let store_arg = std::env::var(STRESS_STORE).expect("store env");
    let limit: Option<u64> = std::env::var(STRESS_LIMIT)
        .ok()
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().expect("limit"));
    let go = PathBuf::from(std::env::var_os(STRESS_GO).expect("go env"));
    let store: Arc<dyn object_store::ObjectStore> = match store_arg.split_once(':') {
        Some(("local", dir)) => Arc::new(
            object_store::local::LocalFileSystem::new_with_prefix(dir).expect("local store"),
        ),
        Some(("s3", endpoint)) => s3_store(endpoint),
        _ => panic!("bad store {store_arg}"),
    };
    let cache = SharedCache::open(PathBuf::from(dir), limit).expect("open");
    let ready = PathBuf::from(format!("{}.{}", go.display(), std::process::id()));
    std::fs::write(ready, b"ready").expect("ready marker");
    wait_until("the go marker", || go.exists()).await;

    let order = 0..STRESS_FILES;
    let results: Vec<Result<bool, String>> = futures::stream::iter(order)
        .map(|i| {
            let (cache, store) = (Arc::clone(&cache), Arc::clone(&store));
            async move {
                let (f, path) = (stress_file(i), stress_path(i));
                let (pin, fetched) = cache
                    .get_or_fetch(&f, |tmp| download_into(&store, &path, &f, tmp))
                    .await
                    .map_err(|e| format!("get_or_fetch {i}: {e}"))?;
                // Working on it: the entry must stay while pinned.
                tokio::time::sleep(Duration::from_millis(1)).await;
                let bytes = tokio::fs::read(pin.path())
                    .await
                    .map_err(|e| format!("read {i}: {e}"))?;
                if bytes != random_bytes(i as u64, stress_size(i)) {
                    return Err(format!("corrupt {i}"));
                }
                Ok(fetched)
            }
        })
        .buffer_unordered(STRESS_CONCURRENCY)
        .collect()
        .await;
    let mut r = StressResult::default();
    for res in &results {
        match res {
            Ok(fetched) => {
                r.reads += 1;
                r.fetched += usize::from(*fetched);
            }
            Err(e) if e.starts_with("corrupt") => r.corrupt += 1,
            Err(e) => {
                if r.errors < 5 {
                    eprintln!("{e}");
                }
                r.errors += 1;
            }
        }
    }
    println!(
        "stress-result reads={} corrupt={} errors={} fetched={}",
        r.reads, r.corrupt, r.errors, r.fetched
    );
}

/// Local copies that name a file removed before the read (a shared-cache entry
/// evicted between lookup and read).
#[derive(Debug)]
struct Vanished(PathBuf);

impl udfchain::testing::LocalCopies for Vanished {
    fn local_path(&self, _file: &File) -> Option<PathBuf> {
        Some(self.0.clone())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_copy_gone_before_the_read_is_read_from_the_store() {
    use udfchain::FileSource;
    use udfchain::datafusion::execution::runtime_env::RuntimeEnv;
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = counted_store(1, 3000).await;
    let env = Arc::new(RuntimeEnv::default());
    let url = url::Url::parse("memory://vanish").expect("url");
    env.register_object_store(&url, Arc::clone(&store) as _);
    let source = udfchain::testing::StoreSource::new(
        env,
        Default::default(),
        Some(Arc::new(Vanished(tmp.path().join("evicted")))),
    );
    let f = File {
        source: "memory://vanish".into(),
        path: "d0/f0000.bin".into(),
        size: 3000,
        ..Default::default()
    };
    let want = udfchain_testkit::content(0, 3000);
    assert_eq!(
        source.read(&f).await.expect("read").as_ref(),
        want.as_slice()
    );
    let range = source.read_range(&f, 10..20).await.expect("read_range");
    assert_eq!(range.as_ref(), &want[10..20]);
    assert_eq!(store.gets(), 2, "both reads went to the store");
}

/// Local copies that record what was released to them.
#[derive(Debug, Default)]
struct Released(std::sync::Mutex<Vec<String>>);

impl udfchain::testing::LocalCopies for Released {
    fn local_path(&self, _file: &File) -> Option<PathBuf> {
        None
    }

    fn release(&self, file: &File) {
        self.0.lock().expect("lock").push(file.path.clone());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_pins_hold_an_entry_until_its_last_row_is_released() {
    use udfchain::testing::LocalCopies;
    use udfchain::testing::WindowPins;
    let tmp = tempfile::tempdir().expect("tempdir");
    let cache = SharedCache::open(tmp.path(), None).expect("open");
    let calls = Arc::new(AtomicUsize::new(0));
    let f = file(1, 1000);
    let (pin, _) = cache
        .get_or_fetch(&f, fetcher(&calls, content(1, 1000), Duration::ZERO))
        .await
        .expect("fetch");
    let entry = pin.path().to_path_buf();
    let inner = Arc::new(Released::default());
    let pins = WindowPins::new(Arc::clone(&inner) as _);
    pins.hold(&f, pin); // row 1
    assert!(pins.acquire(&f)); // row 2
    assert!(!pins.acquire(&file(2, 1000)), "not held");
    assert_eq!(pins.local_path(&f), Some(entry.clone()));

    pins.release(&f); // row 1 done
    assert_eq!(cache.prune_to(0).expect("prune").files, 0, "row 2 holds it");
    pins.release(&f); // row 2 done
    assert!(pins.is_empty());
    assert_eq!(cache.prune_to(0).expect("prune").files, 1);
    assert!(!entry.exists());

    // A file the window does not hold is released to the copies behind it.
    pins.release(&file(2, 1000));
    assert_eq!(
        *inner.0.lock().expect("lock"),
        vec!["dir/f2.bin".to_string()]
    );
}
