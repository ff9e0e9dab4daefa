//! The size limit: LRU eviction, runs stay within it, pinned entries survive it.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use udfchain::{CacheUsage, File, Settings, SharedCache};

use super::{ChildTest, all_files, checked_run, content, counted, fetcher, file, sums, wait_until};

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

/// With a limit below one file, every write prunes; the entries a prefetch
/// window holds for its rows stay until the UDF has read them, so the UDF
/// never falls back to a second GET.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetch_window_holds_its_entries_under_a_tiny_limit() {
    let root = tempfile::tempdir().expect("root");
    let (session, store) = counted("pinned", 24, 10_000).await;
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

const PIN_DIR: &str = "UDFCHAIN_TEST_PIN_DIR";
const PIN_READY: &str = "UDFCHAIN_TEST_PIN_READY";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pin_in_another_process_holds_its_entry_until_that_process_is_killed() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("cache");
    let ready = tmp.path().join("ready");
    let mut child = ChildTest::spawn(
        "shared_cache::pruning::child_pin_holder",
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_larger_than_the_limit_leaves_the_cache_within_it() {
    let root = tempfile::tempdir().expect("root");
    let (session, _store) = counted("limited", 12, 10_000).await;
    let settings = Settings::new()
        .cache(true)
        .cache_limit(35_000)
        .root(root.path())
        .prefetch(2)
        .parallel(1);
    let (rows, _) = sums(&session, "memory://limited/", settings).await;
    assert_eq!(rows.len(), 12);
    let du = SharedCache::open(root.path().join("cache"), None)
        .expect("open")
        .du()
        .expect("du");
    assert!(
        du.bytes <= 35_000,
        "cache holds {} bytes over a 35,000 limit",
        du.bytes
    );
    assert!(du.files >= 1);
}
