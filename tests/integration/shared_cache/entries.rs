//! What makes an entry: stable keys; bad, truncated or cancelled downloads leave none.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use udfchain::{CacheUsage, Error, File, SharedCache};

use super::{content, fetcher, file, io_error, temp_files};

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
