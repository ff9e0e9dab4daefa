//! PrefetchExec and the temporary cache: in-flight bounds, UDF wait, temp dir
//! lifecycle (success, error, panic, drop, SIGKILL), disk window, ordering,
//! retries and skips, range reads without prefetch.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use object_store::memory::InMemory;
use object_store::throttle::{ThrottleConfig, ThrottledStore};
use object_store::{ObjectStore, PutPayload};

use tokio::io::{AsyncReadExt, AsyncSeekExt};
use udfchain::{Chain, File, OnError, RunReport, Session, Settings, col};

use udfchain_testkit::{
    CountingStore, Fault, FaultyStore, content, disk_bytes, no_prefetch_dirs_soon, prefetch_dirs,
    put_files, remote_view, write_files,
};

/// A session whose `memory://<name>` serves `n` files through a 20 ms-per-GET
/// throttle, counted.
async fn slow_store(name: &str, n: usize, size: usize) -> (Arc<Session>, Arc<CountingStore>) {
    let inner = Arc::new(InMemory::new());
    put_files(inner.as_ref(), "", n, |_| size).await;
    let throttled = ThrottledStore::new(
        inner,
        ThrottleConfig {
            wait_get_per_call: Duration::from_millis(20),
            ..Default::default()
        },
    );
    let counting = CountingStore::new(Arc::new(throttled));
    let session = Session::new();
    session
        .register_store(&format!("memory://{name}"), Arc::clone(&counting) as _)
        .expect("register");
    (session, counting)
}

fn len_udf(chain: Chain, work: Duration) -> Chain {
    chain.map("len", move |f: File| async move {
        tokio::time::sleep(work).await;
        f.read().await.map(|b| b.len() as u64)
    })
}

async fn run_report(chain: &Chain) -> RunReport {
    let (batches, report) = chain.collect_with_report().await.expect("run");
    assert!(batches.iter().map(|b| b.num_rows()).sum::<usize>() > 0);
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_equals_prefetch_and_udf_wait_falls() {
    let root = tempfile::tempdir().expect("root");
    let mut waits = Vec::new();
    for prefetch in [1usize, 4, 8] {
        let (session, store) = slow_store("inflight", 24, 1024).await;
        let chain = len_udf(
            session.from_storage("memory://inflight/").settings(
                Settings::new()
                    .prefetch(prefetch)
                    .parallel(1)
                    .root(root.path()),
            ),
            Duration::from_millis(5),
        );
        let report = run_report(&chain).await;
        assert_eq!(
            store.peak_in_flight(),
            prefetch,
            "peak GETs in flight at prefetch={prefetch}"
        );
        assert_eq!(report.metric("PrefetchExec", "files_fetched"), 24);
        assert_eq!(report.metric("PrefetchExec", "peak_in_flight"), prefetch);
        assert_eq!(
            store.gets(),
            24,
            "each file is downloaded once; the UDF reads the local copy"
        );
        waits.push(report.metric("PrefetchExec", "udf_wait"));
    }
    // 24 GETs of 20 ms: about 24 x 15 ms of waiting with one in flight, far less with 8.
    assert!(
        waits[1] < waits[0] && waits[2] * 2 < waits[0],
        "UDF wait (ns) by prefetch 1/4/8: {waits:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_connections_caps_downloads_across_partitions() {
    let root = tempfile::tempdir().expect("root");
    let (session, store) = slow_store("cap", 24, 256).await;
    let settings = Settings::new().prefetch(4).parallel(1).root(root.path());
    // A union of two listings: two partitions, each with its own prefetch window.
    let two = |max: usize| {
        let s = settings.clone().max_connections(max);
        let a = session.from_storage("memory://cap/d0");
        let b = session.from_storage("memory://cap/d1");
        len_udf(a.union(b).settings(s), Duration::from_millis(5))
    };
    run_report(&two(64)).await;
    assert_eq!(store.peak_in_flight(), 8, "two partitions x prefetch 4");
    let (session2, store2) = slow_store("cap2", 24, 256).await;
    let capped = len_udf(
        session2
            .from_storage("memory://cap2/d0")
            .union(session2.from_storage("memory://cap2/d1"))
            .settings(settings.clone().max_connections(3)),
        Duration::from_millis(5),
    );
    run_report(&capped).await;
    assert_eq!(
        store2.peak_in_flight(),
        3,
        "max_connections = 3 across partitions"
    );
}

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
            "prefetch::killed_child_worker",
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

async fn ordered_run(ordered: bool, slow: &'static str) -> Vec<String> {
    let inner = Arc::new(InMemory::new());
    put_files(inner.as_ref(), "", 30, |_| 100).await;
    let store = FaultyStore::new(
        inner,
        move |path| {
            if path.contains(slow) {
                Duration::from_millis(400)
            } else {
                // Pseudo-random 0-25 ms per object.
                let h = path
                    .bytes()
                    .fold(7u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64));
                Duration::from_millis(h % 26)
            }
        },
        |_, _| Fault::None,
    );
    let session = Session::new();
    session
        .register_store("memory://ordered", store as _)
        .expect("register");
    #[derive(serde::Deserialize)]
    struct R {
        path: String,
    }
    session
        .from_storage("memory://ordered/")
        .settings(Settings::new().prefetch(8).parallel(1).ordered(ordered))
        .map("len", |f: File| async move {
            f.read().await.map(|b| b.len() as u64)
        })
        .select([col("file.path").alias("path")])
        .to_rows::<R>()
        .await
        .expect("run")
        .into_iter()
        .map(|r| r.path)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_keeps_input_order_unordered_does_not_wait_for_the_slow_one() {
    let ordered = ordered_run(true, "f0003").await;
    let mut sorted = ordered.clone();
    sorted.sort();
    assert_eq!(ordered, sorted, "ordered = true keeps the listing order");

    let unordered = ordered_run(false, "f0003").await;
    assert_eq!(unordered.len(), 30);
    let slow_at = unordered
        .iter()
        .position(|p| p.contains("f0003"))
        .expect("slow row present");
    let slow_in_input = sorted
        .iter()
        .position(|p| p.contains("f0003"))
        .expect("in input");
    assert!(
        slow_at >= slow_in_input + 8,
        "with ordered = false the slow object (input #{slow_in_input}) came out #{slow_at}: {unordered:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_faults_are_retried_and_skip_reports_exactly_the_permanent_failures() {
    const N: usize = 40;
    let hash = |s: &str, salt: u64| {
        s.bytes()
            .fold(salt, |h, b| h.wrapping_mul(131).wrapping_add(b as u64))
    };
    let build = |faults: bool| {
        let inner = Arc::new(InMemory::new());
        let store = FaultyStore::new(
            Arc::clone(&inner) as _,
            |_| Duration::ZERO,
            move |path, attempt| {
                if !faults {
                    return Fault::None;
                }
                if path.contains("f0007") || path.contains("f0031") {
                    return Fault::Request; // permanent
                }
                // ~10% request errors and ~10% broken bodies on the first two tries.
                match (attempt, hash(path, attempt as u64 + 1) % 10) {
                    (0 | 1, 0) => Fault::Request,
                    (0 | 1, 1) => Fault::MidBody,
                    _ => Fault::None,
                }
            },
        );
        (inner, store)
    };
    let rows = |session: Arc<Session>, policy: OnError| async move {
        #[derive(serde::Deserialize, PartialEq, Debug)]
        struct R {
            path: String,
            sum: u64,
        }
        let chain = session
            .from_storage("memory://faulty/")
            .settings(Settings::new().prefetch(8).on_error(policy))
            .map("sum", |f: File| async move {
                f.read()
                    .await
                    .map(|b| b.iter().map(|&x| x as u64).sum::<u64>())
            })
            .select([col("file.path").alias("path"), col("sum")]);
        let (batches, report) = chain.collect_with_report().await.expect("run");
        let mut out: Vec<R> = batches
            .iter()
            .flat_map(|b| serde_arrow::from_record_batch::<Vec<R>>(b).expect("rows"))
            .collect();
        out.sort_by(|a, b| a.path.cmp(&b.path));
        (
            out.into_iter().map(|r| (r.path, r.sum)).collect::<Vec<_>>(),
            report,
        )
    };

    let (clean_inner, clean_store) = build(false);
    put_files(clean_inner.as_ref(), "", N, |i| 5000 + i * 100).await;
    let clean_session = Session::new();
    clean_session
        .register_store("memory://faulty", clean_store as _)
        .expect("register");
    let (clean, _) = rows(clean_session, OnError::Fail).await;
    assert_eq!(clean.len(), N);

    let (inner, store) = build(true);
    put_files(inner.as_ref(), "", N, |i| 5000 + i * 100).await;
    let session = Session::new();
    session
        .register_store("memory://faulty", store as _)
        .expect("register");
    let (got, report) = rows(session, OnError::Skip).await;
    let want: Vec<_> = clean
        .iter()
        .filter(|(p, _)| !p.contains("f0007") && !p.contains("f0031"))
        .cloned()
        .collect();
    assert_eq!(
        got, want,
        "results equal a clean run minus the permanently failing files"
    );
    let mut skipped = report.skipped.clone();
    skipped.sort();
    assert_eq!(
        skipped,
        vec![
            "memory://faulty/d1/f0007.bin",
            "memory://faulty/d1/f0031.bin"
        ]
    );
    assert!(
        report.metric("PrefetchExec", "retries") > 0,
        "faults were retried"
    );
    assert_eq!(report.metric("PrefetchExec", "skipped_files"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_read_without_prefetch_transfers_a_tiny_part() {
    const SIZE: usize = 64 * 1024 * 1024;
    let inner = Arc::new(InMemory::new());
    let body = content(3, SIZE);
    inner
        .put_opts(
            &"big/blob.bin".into(),
            PutPayload::from(body.clone()),
            Default::default(),
        )
        .await
        .expect("put");
    let store = CountingStore::new(inner);
    let session = Session::new();
    session
        .register_store("memory://hdr", Arc::clone(&store) as _)
        .expect("register");
    #[derive(serde::Deserialize)]
    struct R {
        hdr: Vec<u8>,
    }
    let rows: Vec<R> = session
        .from_storage("memory://hdr/big")
        .settings(Settings::new().prefetch(0))
        .map("hdr", |f: File| async move {
            let mut r = f.open().await.map_err(std::io::Error::other)?;
            let mut head = vec![0u8; 1024];
            r.read_exact(&mut head).await?;
            // Seek near the end and read the tail too.
            r.seek(std::io::SeekFrom::End(-16)).await?;
            let mut tail = vec![0u8; 16];
            r.read_exact(&mut tail).await?;
            head.extend(tail);
            Ok::<_, std::io::Error>(head)
        })
        .select([col("hdr")])
        .to_rows()
        .await
        .expect("run");
    let mut want = body[..1024].to_vec();
    want.extend_from_slice(&body[SIZE - 16..]);
    assert_eq!(rows[0].hdr, want);
    assert!(
        store.bytes() < SIZE / 100,
        "{} bytes transferred of {SIZE}",
        store.bytes()
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetch_auto_grows_while_the_udf_waits() {
    let root = tempfile::tempdir().expect("root");
    let (session, store) = slow_store("auto", 40, 512).await;
    let chain = len_udf(
        session.from_storage("memory://auto/").settings(
            Settings::new()
                .prefetch_auto()
                .parallel(1)
                .root(root.path()),
        ),
        Duration::ZERO,
    );
    let report = run_report(&chain).await;
    assert!(
        store.peak_in_flight() >= 4,
        "auto reached only {} in flight",
        store.peak_in_flight()
    );
    assert!(
        store.peak_in_flight() <= 64,
        "auto stays within max_connections"
    );
    assert_eq!(report.metric("PrefetchExec", "files_fetched"), 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gen_batch_map_and_agg_are_prefetched_too() {
    let root = tempfile::tempdir().expect("root");
    let (session, store) = slow_store("kinds", 12, 300).await;
    let base = || {
        session
            .from_storage("memory://kinds/")
            .settings(Settings::new().prefetch(4).root(root.path()))
    };
    #[derive(serde::Deserialize)]
    struct Total {
        total: u64,
    }

    let rows: Vec<Total> = base()
        .batch_map("total", |fs: Vec<File>| async move {
            let mut out = Vec::new();
            for f in fs {
                out.push(f.read().await?.len() as u64);
            }
            Ok::<_, udfchain::udfs::UdfError>(out)
        })
        .select([col("total")])
        .to_rows()
        .await
        .expect("batch_map");
    assert_eq!(rows.iter().map(|r| r.total).sum::<u64>(), 12 * 300);
    assert_eq!(store.gets(), 12, "batch_map: one GET per file");

    let n = base()
        .r#gen("byte", |f: File| {
            futures::stream::once(async move { f.read().await })
                .map(|b| {
                    futures::stream::iter(
                        b.map(|b| b.to_vec())
                            .unwrap_or_default()
                            .into_iter()
                            .take(3)
                            .map(Ok::<u8, std::io::Error>),
                    )
                })
                .flatten()
        })
        .count()
        .await
        .expect("gen");
    assert_eq!(n, 36);
    assert_eq!(store.gets(), 24, "gen: one GET per file");

    let rows: Vec<Total> = base()
        .mutate(
            "dir",
            datafusion::functions::expr_fn::split_part(
                col("file.path"),
                udfchain::lit("/"),
                udfchain::lit(1),
            ),
        )
        .agg(&["dir"], &["file"], "total", |fs: Vec<File>| async move {
            let mut total = 0u64;
            for f in fs {
                total += f.read().await?.len() as u64;
            }
            Ok::<_, udfchain::udfs::UdfError>(vec![total])
        })
        .select([col("total")])
        .to_rows()
        .await
        .expect("agg");
    assert_eq!(rows.len(), 3);
    assert_eq!(rows.iter().map(|r| r.total).sum::<u64>(), 12 * 300);
    assert_eq!(store.gets(), 36, "agg: one GET per file");
    assert!(prefetch_dirs(root.path()).is_empty());

    let text = base()
        .map(
            "len",
            |f: File| async move { Ok::<_, std::io::Error>(f.size) },
        )
        .explain_analyze()
        .await
        .expect("explain analyze");
    assert!(text.contains("PrefetchExec: prefetch=4"), "{text}");
    for metric in [
        "files_fetched=12",
        "bytes_fetched=",
        "cache_hits=",
        "udf_wait=",
        "peak_in_flight=",
        "retries=0",
        "skipped_files=0",
    ] {
        assert!(text.contains(metric), "{metric} missing in {text}");
    }
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

/// A session whose `memory://<name>` serves `n` files of `size` bytes: the
/// object whose path contains `slow` answers after `slow_for`, every other
/// one after 20 ms; GETs are counted (start times, peak in flight).
async fn one_slow_object(
    name: &str,
    n: usize,
    size: usize,
    slow: &'static str,
    slow_for: Duration,
) -> (Arc<Session>, Arc<CountingStore>) {
    let inner = Arc::new(InMemory::new());
    put_files(inner.as_ref(), "", n, |_| size).await;
    let faulty = FaultyStore::new(
        inner,
        move |path| {
            if path.contains(slow) {
                slow_for
            } else {
                Duration::from_millis(20)
            }
        },
        |_, _| Fault::None,
    );
    let counting = CountingStore::new(faulty as _);
    let session = Session::new();
    session
        .register_store(&format!("memory://{name}"), Arc::clone(&counting) as _)
        .expect("register");
    (session, counting)
}

/// Runs `chain` (whose rows carry `file.path`) and returns the paths in
/// output order with the run's report.
async fn paths_and_report(chain: Chain) -> (Vec<String>, RunReport) {
    let (batches, report) = chain
        .select([col("file.path").alias("path")])
        .collect_with_report()
        .await
        .expect("run");
    let mut paths = Vec::new();
    for b in &batches {
        let col = b.column(0);
        let strings = udfchain::datafusion::arrow::compute::cast(
            col,
            &udfchain::datafusion::arrow::datatypes::DataType::Utf8,
        )
        .expect("cast");
        let strings = strings
            .as_any()
            .downcast_ref::<udfchain::datafusion::arrow::array::StringArray>()
            .expect("strings");
        paths.extend(strings.iter().flatten().map(str::to_string));
    }
    (paths, report)
}

/// GETs that started before the slow object's GET ended (earlier than
/// `within` after it started), the slow one included.
fn started_while_pending(store: &CountingStore, slow: &str, within: Duration) -> usize {
    let slow_at = store.get_starts(slow)[0];
    store
        .get_starts("")
        .into_iter()
        .filter(|t| *t < slow_at + within)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_output_keeps_the_window_in_flight_behind_a_slow_object() {
    const N: usize = 30;
    const SIZE: usize = 100;
    let root = tempfile::tempdir().expect("root");
    // d0/f0006 is the third row of the listing (d0/f0000, d0/f0003, ...).
    let (session, store) =
        one_slow_object("hol", N, SIZE, "d0/f0006", Duration::from_millis(1500)).await;
    let chain = session
        .from_storage("memory://hol/")
        .settings(
            Settings::new()
                .prefetch(8)
                .parallel(1)
                .ordered(true)
                .root(root.path()),
        )
        .map("len", |f: File| async move {
            f.read().await.map(|b| b.len() as u64)
        });
    let (paths, report) = paths_and_report(chain).await;
    let mut sorted = paths.clone();
    sorted.sort();
    assert_eq!(paths.len(), N);
    assert_eq!(
        paths, sorted,
        "ordered = true keeps the listing order exactly"
    );
    assert_eq!(paths[2], "d0/f0006.bin");
    // Behind the pending slow GET the window keeps 8 requests in flight: every
    // later object (27 of them, 20 ms each, 7 at a time) is fetched within its
    // 1.5 s. Counted against the window, the 7 finished rows behind it would
    // have stopped the requests at 10 (2 before it, it, 7 behind it).
    let during = started_while_pending(&store, "d0/f0006", Duration::from_millis(1200));
    assert_eq!(during, N, "GETs started before the slow one ended");
    assert_eq!(store.peak_in_flight(), 8, "never more than the window");
    assert_eq!(report.metric("PrefetchExec", "peak_in_flight"), 8);
    let peak = report.metric("PrefetchExec", "reorder_peak_bytes");
    assert!(
        ((N - 3) * SIZE..=(N - 1) * SIZE).contains(&peak),
        "reorder buffer peak {peak}: the 27 rows behind the slow one"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reorder_buffer_is_bounded_by_bytes_and_is_the_only_backpressure() {
    const N: usize = 400;
    const SIZE: usize = 1000;
    // The bound: 32 windows of 8 rows of 1000 bytes.
    const BOUND: usize = 32 * 8 * SIZE;
    let root = tempfile::tempdir().expect("root");
    let (session, store) =
        one_slow_object("bounded", N, SIZE, "d0/f0006", Duration::from_secs(3)).await;
    let (calls, udf) = timed_calls();
    let chain = session
        .from_storage("memory://bounded/")
        .settings(Settings::new().prefetch(8).parallel(1).root(root.path()))
        .map("len", udf);
    let (paths, report) = paths_and_report(chain).await;
    let mut sorted = paths.clone();
    sorted.sort();
    assert_eq!(paths.len(), N);
    assert_eq!(
        paths, sorted,
        "ordered = true keeps the listing order exactly"
    );
    let calls = calls.lock().expect("calls").clone();
    assert_eq!(calls.len(), N);
    let peak = report.metric("PrefetchExec", "reorder_peak_bytes");
    assert!(
        peak <= BOUND,
        "reorder buffer peak {peak} > its bound {BOUND}"
    );
    assert!(
        peak > BOUND - 8 * SIZE,
        "the buffer filled up behind the slow object: peak {peak}"
    );
    // While the slow row (the third) is pending, requests go on until the
    // buffer is full (256 rows of 1000 bytes after it, ~0.75 s at 7 x 20 ms),
    // then stop: 259 of the 400 rows.
    let during = started_while_pending(&store, "d0/f0006", Duration::from_millis(2800));
    assert!(
        (BOUND / SIZE..=BOUND / SIZE + 3).contains(&during),
        "{during} GETs started while the slow one was pending"
    );
    assert_eq!(store.peak_in_flight(), 8);
    // The rows handed on behind the stalled one were called meanwhile (each
    // counts against the bound until it is emitted): the 256 rows after it
    // that the bound admits and the 2 before it, give or take the window.
    let called = calls_while_pending(&store, &calls, "d0/f0006", Duration::from_millis(2800));
    assert!(
        (BOUND / SIZE - 8..=BOUND / SIZE + 2).contains(&called),
        "{called} UDF calls while the slow download was pending"
    );
}

/// A map UDF returning the file's length that records each call's file and
/// start time.
#[allow(clippy::type_complexity)]
fn timed_calls() -> (
    Arc<std::sync::Mutex<Vec<(String, Instant)>>>,
    impl Fn(File) -> futures::future::BoxFuture<'static, Result<u64, udfchain::udfs::UdfError>>
    + Send
    + Sync
    + 'static,
) {
    let calls = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = Arc::clone(&calls);
    let udf = move |f: File| {
        log.lock()
            .expect("calls")
            .push((f.path.clone(), Instant::now()));
        let call: futures::future::BoxFuture<'static, Result<u64, udfchain::udfs::UdfError>> =
            Box::pin(async move { f.read().await.map(|b| b.len() as u64) });
        call
    };
    (calls, udf)
}

/// UDF calls (of other files than `slow`) that started before the slow
/// object's GET ended (earlier than `within` after it started).
fn calls_while_pending(
    store: &CountingStore,
    calls: &[(String, Instant)],
    slow: &str,
    within: Duration,
) -> usize {
    let slow_at = store.get_starts(slow)[0];
    calls
        .iter()
        .filter(|(path, at)| !path.contains(slow) && *at < slow_at + within)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_map_calls_the_udf_on_the_rows_behind_a_stalled_download() {
    const N: usize = 60;
    const SIZE: usize = 100;
    let root = tempfile::tempdir().expect("root");
    // d0/f0006 is the third row of the listing.
    let (session, store) =
        one_slow_object("stalled", N, SIZE, "d0/f0006", Duration::from_millis(1500)).await;
    let (calls, udf) = timed_calls();
    let chain = session
        .from_storage("memory://stalled/")
        .settings(
            Settings::new()
                .prefetch(8)
                .parallel(2)
                .ordered(true)
                .root(root.path()),
        )
        .map("len", udf);
    let (paths, report) = paths_and_report(chain).await;
    let mut sorted = paths.clone();
    sorted.sort();
    assert_eq!(paths.len(), N);
    assert_eq!(paths, sorted, "the output keeps the listing order exactly");
    assert_eq!(paths[2], "d0/f0006.bin");
    let calls = calls.lock().expect("calls").clone();
    assert_eq!(calls.len(), N, "one call per row");
    // Every other row (59 of them, 20 ms each, 7 downloads at a time, ~0.2 s)
    // reached the UDF while the stalled download was pending; in input order
    // the 57 rows behind it would have waited the whole 1.5 s.
    let called = calls_while_pending(&store, &calls, "d0/f0006", Duration::from_millis(1200));
    assert_eq!(
        called,
        N - 1,
        "UDF calls while the stalled download was pending"
    );
    let stalled_call = calls
        .iter()
        .find(|(p, _)| p.contains("d0/f0006"))
        .map(|(_, at)| *at)
        .expect("the stalled row was called");
    assert!(
        stalled_call >= store.get_starts("d0/f0006")[0] + Duration::from_millis(1400),
        "the stalled row is called after its download"
    );
    // The rows behind it are held (after their calls) within the reorder bound.
    let peak = report.metric("PrefetchExec", "reorder_peak_bytes");
    assert!(
        ((N - 3) * SIZE..=(N - 1) * SIZE).contains(&peak),
        "reorder peak {peak}: the 57 rows behind the stalled one"
    );
    assert_eq!(report.metric("PrefetchExec", "peak_in_flight"), 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetch_is_per_partition_and_max_connections_across_partitions() {
    let root = tempfile::tempdir().expect("root");
    let inner = Arc::new(InMemory::new());
    for p in 0..4 {
        put_files(inner.as_ref(), &format!("p{p}"), 30, |_| 256).await;
    }
    let throttled = ThrottledStore::new(
        inner,
        ThrottleConfig {
            wait_get_per_call: Duration::from_millis(20),
            ..Default::default()
        },
    );
    let store = CountingStore::new(Arc::new(throttled));
    let session = Session::new();
    session
        .register_store("memory://parts", Arc::clone(&store) as _)
        .expect("register");
    // Four listings: the UDF's input has four partitions, each with a window of 8.
    let four = |max: usize| {
        let mut chain = session.from_storage("memory://parts/p0/");
        for p in 1..4 {
            chain = chain.union(session.from_storage(&format!("memory://parts/p{p}/")));
        }
        len_udf(
            chain.settings(
                Settings::new()
                    .prefetch(8)
                    .parallel(4)
                    .max_connections(max)
                    .root(root.path()),
            ),
            Duration::from_millis(2),
        )
    };
    let text = four(10).explain_analyze().await.expect("explain analyze");
    let peak = |text: &str| -> usize {
        let line = text
            .lines()
            .find(|l| l.contains("PrefetchExec:"))
            .unwrap_or_else(|| panic!("no PrefetchExec in {text}"));
        let at = line
            .find("peak_in_flight=")
            .unwrap_or_else(|| panic!("no peak_in_flight in {line}"));
        line[at + "peak_in_flight=".len()..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .expect("a number")
    };
    assert!(
        text.contains("PrefetchExec: prefetch=8") && text.contains("max_connections=10"),
        "{text}"
    );
    let shown = peak(&text);
    assert!(
        shown > 8 && shown <= 10,
        "EXPLAIN ANALYZE peak_in_flight={shown}: more than one partition's 8, within 10"
    );
    assert!(
        store.peak_in_flight() > 8 && store.peak_in_flight() <= 10,
        "GETs in flight at once: {}",
        store.peak_in_flight()
    );
    // Without the cap the four windows of 8 run together.
    let store_peak_before = store.peak_in_flight();
    let report = run_report(&four(64)).await;
    assert_eq!(report.metric("PrefetchExec", "files_fetched"), 120);
    assert!(store_peak_before <= 10);
    assert!(
        report.metric("PrefetchExec", "peak_in_flight") > 10,
        "four partitions x prefetch 8 uncapped: {}",
        report.metric("PrefetchExec", "peak_in_flight")
    );
}

/// `sum of bytes` of each file of `uri`, in output order, with its path.
async fn sums_of(
    session: &Arc<Session>,
    uri: &str,
    settings: Settings,
    calls: Arc<std::sync::atomic::AtomicUsize>,
) -> (Vec<(String, Option<u64>)>, RunReport) {
    use datafusion::arrow::array::{Array, AsArray};
    use datafusion::arrow::datatypes::UInt64Type;
    let chain = session
        .from_storage(uri)
        .settings(settings)
        .map("sum", move |f: File| {
            let calls = Arc::clone(&calls);
            async move {
                calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if f.path.ends_with("7.bin") {
                    return Err(std::io::Error::other(format!("no sevens: {}", f.path)));
                }
                f.read()
                    .await
                    .map_err(std::io::Error::other)
                    .map(|b| b.iter().map(|&x| x as u64).sum::<u64>())
            }
        })
        .select([col("file.path").alias("path"), col("sum")]);
    let (batches, report) = chain.collect_with_report().await.expect("run");
    let mut rows = Vec::new();
    for b in &batches {
        let (paths, sums) = (
            b.column(0).as_string::<i32>(),
            b.column(1).as_primitive::<UInt64Type>(),
        );
        for i in 0..b.num_rows() {
            rows.push((
                paths.value(i).to_string(),
                sums.is_valid(i).then(|| sums.value(i)),
            ));
        }
    }
    (rows, report)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_at_hand_are_read_in_place_under_auto_each_row_its_own_call() {
    // 600 local files and the same in an in-memory store: under `auto` (the
    // default) no download, rows in listing order, every row called exactly
    // once though fast rows share a task, and only the failing rows (names
    // ending in 7) lose their value; a fixed window fetches the local files
    // (for disks that are cold) but never the in-memory ones.
    use std::sync::atomic::{AtomicUsize, Ordering};
    let size = |i: usize| 1 + i % 300;
    let dir = tempfile::tempdir().expect("dir");
    let rels = write_files(dir.path(), 600, size);
    let session = Session::new();
    let mem = Arc::new(InMemory::new());
    put_files(mem.as_ref(), "", 600, size).await;
    session
        .register_store("memory://athand", mem as _)
        .expect("register");
    let mut want: Vec<(String, Option<u64>)> = (0..600)
        .map(|i| {
            let sum = content(i, size(i)).iter().map(|&x| x as u64).sum();
            (
                rels[i].clone(),
                Some(sum).filter(|_| !rels[i].ends_with("7.bin")),
            )
        })
        .collect();
    want.sort();
    let local = dir.path().display().to_string();
    for (uri, fixed_fetches) in [(local.as_str(), 600), ("memory://athand/", 0)] {
        for (label, settings, fetched) in [
            ("auto", Settings::new(), 0),
            ("prefetch 8", Settings::new().prefetch(8), fixed_fetches),
        ] {
            let calls = Arc::new(AtomicUsize::new(0));
            let settings = settings.on_error(OnError::Null);
            let (rows, report) = sums_of(&session, uri, settings, Arc::clone(&calls)).await;
            let got: Vec<(String, Option<u64>)> = rows
                .into_iter()
                .map(|(path, sum)| {
                    let rel = rels.iter().find(|r| path.ends_with(r.as_str()));
                    (rel.expect("a written file").clone(), sum)
                })
                .collect();
            assert_eq!(got, want, "{uri} {label}: values, nulls and listing order");
            assert_eq!(
                calls.load(Ordering::SeqCst),
                600,
                "{uri} {label}: one call per row"
            );
            assert_eq!(
                report.metric("PrefetchExec", "files_fetched"),
                fetched,
                "{uri} {label}"
            );
            assert_eq!(
                report.metric("PrefetchExec", "files_in_place"),
                600 - fetched,
                "{uri} {label}"
            );
            let listed: usize = (0..600).map(size).sum();
            assert_eq!(
                report.metric("PrefetchExec", "bytes_in_place"),
                if fetched == 0 { listed } else { 0 },
                "{uri} {label}: the listed bytes of the files read in place"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_rows_sharing_a_task_skip_or_fail_one_by_one() {
    // Fast rows are called several to a task: `skip` drops exactly the
    // failing rows (each called once), `fail` names the first failing file.
    use std::sync::atomic::{AtomicUsize, Ordering};
    let dir = tempfile::tempdir().expect("dir");
    let rels = write_files(dir.path(), 400, |_| 16);
    let session = Session::new();
    let uri = dir.path().display().to_string();
    let calls = Arc::new(AtomicUsize::new(0));
    let settings = Settings::new().on_error(OnError::Skip);
    let (rows, _) = sums_of(&session, &uri, settings, Arc::clone(&calls)).await;
    assert_eq!(calls.load(Ordering::SeqCst), 400, "each row called once");
    let sevens = rels.iter().filter(|r| r.ends_with("7.bin")).count();
    assert_eq!(rows.len(), 400 - sevens);
    assert!(
        rows.iter()
            .all(|(p, s)| !p.ends_with("7.bin") && s.is_some())
    );
    let err = session
        .from_storage(&uri)
        .map("sum", |f: File| async move {
            if f.path.ends_with("7.bin") {
                return Err(std::io::Error::other("no sevens"));
            }
            f.read()
                .await
                .map_err(std::io::Error::other)
                .map(|b| b.len() as u64)
        })
        .collect()
        .await
        .expect_err("fails");
    let text = err.to_string();
    assert!(
        text.contains("no sevens") && text.contains("7.bin"),
        "{text}"
    );
}
