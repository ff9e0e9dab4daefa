//! How runs behave: dropping the stream stops the work, CPU-heavy UDFs do not
//! delay I/O, EXPLAIN names every UDF operator.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use object_store::ObjectStoreExt;
use object_store::memory::InMemory;
use object_store::path::Path;
use udfchain::udfs::UdfError;
use udfchain::{File, OnError, Session, Settings};

use udfchain_testkit::{CountingStore, put_files};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_stream_stops_the_reads() {
    const N: usize = 300;
    let inner = Arc::new(InMemory::new());
    put_files(inner.as_ref(), "", N, |_| 1000).await;
    let store = CountingStore::new(inner);
    let session = Session::new();
    session
        .register_store("memory://counted", Arc::clone(&store) as _)
        .expect("register");

    let chain = session
        .from_storage("memory://counted/")
        .settings(Settings::new().parallel(2))
        .map("len", |f: File| async move {
            tokio::time::sleep(Duration::from_millis(2)).await;
            f.read().await.map(|b| b.len() as u64)
        });
    let mut stream = chain.stream().await.expect("stream");
    let first = stream.next().await.expect("a batch").expect("ok batch");
    assert!(first.num_rows() > 0);
    drop(stream);
    let at_drop = store.gets();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let later = store.gets();
    assert!(
        at_drop < 20,
        "{at_drop} of {N} objects read before the first batch"
    );
    assert!(
        store.peak_in_flight() <= 2,
        "parallel = 2 read {} objects at once",
        store.peak_in_flight()
    );
    assert!(
        later <= at_drop + 2,
        "reads went on after the drop: {at_drop} -> {later}"
    );

    // Sanity: the full run does read every object.
    assert_eq!(chain.count().await.expect("count"), N);
    assert!(store.gets() >= later + N);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_stops_the_work_early() {
    const N: usize = 500;
    // `LIMIT 5` over a map goes below the map and its prefetch (one row out
    // per row in): five objects are read, whatever the window.
    for settings in [Settings::new().parallel(2).prefetch(2), Settings::new()] {
        let inner = Arc::new(InMemory::new());
        put_files(inner.as_ref(), "", N, |_| 10).await;
        let store = CountingStore::new(inner);
        let session = Session::new();
        session
            .register_store("memory://lim", Arc::clone(&store) as _)
            .expect("register");
        let rows = session
            .from_storage("memory://lim/")
            .settings(settings)
            .map("len", |f: File| async move {
                f.read().await.map(|b| b.len() as u64)
            })
            .limit(5)
            .collect()
            .await
            .expect("run");
        assert_eq!(rows.iter().map(|b| b.num_rows()).sum::<usize>(), 5);
        assert_eq!(store.gets(), 5, "objects read for 5 rows");
    }
}

/// Under `on_error = skip` a map may drop rows, so the limit stays above it:
/// rows skipped among the first ones are made up by the rows after them.
#[tokio::test]
async fn limit_over_a_skipping_map_still_gives_its_rows() {
    let inner = Arc::new(InMemory::new());
    put_files(inner.as_ref(), "", 40, |_| 10).await;
    let session = Session::new();
    session
        .register_store("memory://lim", inner as _)
        .expect("register");
    let rows = session
        .from_storage("memory://lim/")
        .settings(Settings::new().on_error(OnError::Skip).prefetch(2))
        .map("len", |f: File| async move {
            if f.path.ends_with("f0000.bin") || f.path.ends_with("f0003.bin") {
                return Err(UdfError::Contract("refused".into()));
            }
            f.read().await.map(|b| b.len() as u64)
        })
        .limit(5)
        .collect()
        .await
        .expect("run");
    assert_eq!(rows.iter().map(|b| b.num_rows()).sum::<usize>(), 5);
}

/// Under a single-threaded I/O runtime, a UDF that burns 50 ms of CPU per row
/// must not delay reads made concurrently on that runtime: UDFs run on their
/// own pool. Measured with the store's request timestamps.
#[tokio::test(flavor = "current_thread")]
async fn cpu_heavy_udf_does_not_delay_concurrent_reads() {
    let inner = Arc::new(InMemory::new());
    put_files(inner.as_ref(), "udf", 8, |_| 100).await;
    put_files(inner.as_ref(), "probe", 30, |_| 100).await;
    let store = CountingStore::new(inner);
    let session = Session::new();
    session
        .register_store("memory://cpu", Arc::clone(&store) as _)
        .expect("register");

    let chain = session
        .from_storage("memory://cpu/udf")
        .settings(Settings::new().parallel(1))
        .map("spin", |f: File| async move {
            let bytes = f.read().await?;
            let start = Instant::now();
            let mut x = 0u64;
            while start.elapsed() < Duration::from_millis(50) {
                x = x.wrapping_add(std::hint::black_box(1));
            }
            std::hint::black_box(x);
            Ok::<_, udfchain::udfs::UdfError>(bytes.len() as u64)
        });
    let run = tokio::spawn(async move { chain.collect().await });
    let probe = store.clone();
    let reader = tokio::spawn(async move {
        for i in 0..30 {
            let path = Path::from(format!("probe/d{}/f{i:04}.bin", i % 3));
            probe
                .get(&path)
                .await
                .expect("probe get")
                .bytes()
                .await
                .expect("body");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    reader.await.expect("reader");
    let batches = run.await.expect("join").expect("chain");
    assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 8);
    let starts = store.get_starts("probe/");
    assert_eq!(starts.len(), 30);
    let worst = starts.windows(2).map(|w| w[1] - w[0]).max().expect("gaps");
    // Each probe sleeps 10 ms; a UDF on this runtime would add 50 ms gaps.
    assert!(
        worst < Duration::from_millis(45),
        "a probe read waited {worst:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_shows_every_udf_operator() {
    let session = Session::new();
    let store = session.store("memory:///").expect("memory store");
    put_files(store.as_ref(), "ex", 3, |_| 10).await;
    let text = session
        .from_storage("memory:///ex")
        .map(
            "len",
            |f: File| async move { Ok::<_, std::io::Error>(f.size) },
        )
        .batch_map("lens", |fs: Vec<File>| async move {
            Ok::<_, std::io::Error>(fs.iter().map(|f| f.size).collect::<Vec<u64>>())
        })
        .explain()
        .await
        .expect("explain");
    assert!(text.contains("MapExec: udf=len"), "{text}");
    assert!(text.contains("BatchMapExec: udf=lens"), "{text}");
    assert!(text.contains("ListingExec: source=memory:///ex"), "{text}");
}
