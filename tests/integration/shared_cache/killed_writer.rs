//! A writer killed mid-download leaves no entry, and a temp file that pruning removes.

use std::path::PathBuf;
use std::time::Duration;

use udfchain::{CacheUsage, File, SharedCache};

use super::{
    ChildTest, all_files, download_into, file, random_bytes, s3_store, temp_files, wait_until,
};

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
        "shared_cache::killed_writer::child_killed_mid_download",
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
