//! Reads through the cache: reruns download nothing, `cache = false` reads what it holds.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use udfchain::{CacheUsage, File, Settings, SharedCache};

use super::{content, counted, counted_store, fetcher, file, sums, temp_files};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_true_rerun_does_no_gets_and_cache_false_reads_through() {
    let root = tempfile::tempdir().expect("root");
    let (session, store) = counted("cached", 20, 3000).await;
    let settings = Settings::new().cache(true).root(root.path());

    let (first, report) = sums(&session, "memory://cached/", settings.clone()).await;
    assert_eq!(first.len(), 20);
    assert_eq!(store.gets(), 20);
    assert_eq!(report.metric("PrefetchExec", "files_fetched"), 20);

    let (second, report) = sums(&session, "memory://cached/", settings).await;
    assert_eq!(second, first);
    assert_eq!(store.gets(), 20, "a rerun with cache = true makes no GET");
    assert_eq!(report.metric("PrefetchExec", "cache_hits"), 20);

    let (third, _) = sums(
        &session,
        "memory://cached/",
        Settings::new().cache(false).root(root.path()),
    )
    .await;
    assert_eq!(third, first);
    assert_eq!(
        store.gets(),
        20,
        "cache = false reads files the shared cache holds"
    );
    assert!(udfchain_testkit::prefetch_dirs(root.path()).is_empty());

    let cache = SharedCache::open(root.path().join("cache"), None).expect("open");
    assert_eq!(cache.du().expect("du").files, 20);
    cache.clear().expect("clear");
    assert_eq!(cache.du().expect("du").files, 0);
}

/// Without a prefetch in front of the UDF, `cache = true` still caches: the
/// UDF's own reads go through the shared cache, and a rerun makes no GET.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_true_without_prefetch_reads_through_the_cache() {
    let root = tempfile::tempdir().expect("root");
    let (session, store) = counted("cached_p0", 10, 2000).await;
    let settings = Settings::new().cache(true).prefetch(0).root(root.path());

    let (first, _) = sums(&session, "memory://cached_p0/", settings.clone()).await;
    assert_eq!(first.len(), 10);
    assert_eq!(store.gets(), 10);
    let cache = SharedCache::open(root.path().join("cache"), None).expect("open");
    assert_eq!(
        cache.du().expect("du").files,
        10,
        "every read filled the cache"
    );

    let (second, _) = sums(&session, "memory://cached_p0/", settings).await;
    assert_eq!(second, first);
    assert_eq!(store.gets(), 10, "a rerun reads the cache, not the store");

    let uncached = Settings::new().cache(false).prefetch(0).root(root.path());
    let (third, _) = sums(&session, "memory://cached_p0/", uncached).await;
    assert_eq!(third, first);
    assert_eq!(
        store.gets(),
        10,
        "cache = false still reads what the cache holds"
    );
}
