//! How many downloads run at once: the prefetch window, `auto`, and `max_connections`.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use object_store::memory::InMemory;
use object_store::throttle::{ThrottleConfig, ThrottledStore};
use udfchain::{Chain, File, RunReport, Session, Settings, col};

use udfchain_testkit::{CountingStore, prefetch_dirs, put_files};

use super::len_udf;

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
