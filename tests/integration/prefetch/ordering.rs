//! Output order: `ordered` keeps input order behind a slow object; the reorder buffer's bound.

use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::memory::InMemory;
use udfchain::{Chain, File, RunReport, Session, Settings, col};

use udfchain_testkit::{CountingStore, Fault, FaultyStore, put_files};

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
