//! Four processes on one cache dir: exact bytes under eviction, one fetch per file.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use udfchain::{CacheUsage, File, SharedCache};

use super::{
    ChildTest, all_files, download_into, random_bytes, ready_children, s3_store, temp_files,
    wait_until,
};

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
                "shared_cache::stress::stress_child",
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
