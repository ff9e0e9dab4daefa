//! `ordered = false` emits results as calls finish; `ordered = true` keeps input order.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde::Deserialize;
use udfchain::{Chain, Session, Settings, col};

use super::{Kind, Row, file};

/// One slow row among fast ones: `ordered = false` emits it last, `ordered =
/// true` keeps input order, in every operator. The slow call waits until every
/// other call has finished (no timing), then a little more so their results
/// are ready first.
async fn slow_first(kind: Kind, ordered: bool) -> Vec<u64> {
    const N: usize = 6;
    let rows: Vec<Row> = (0..N as u64)
        .map(|id| Row {
            id,
            key: format!("k{id}"),
            a: file("x.bin", 1),
            b: file("y.bin", 1),
        })
        .collect();
    let done = Arc::new(AtomicUsize::new(0));
    let wait = move |id: u64, done: Arc<AtomicUsize>| async move {
        if id == 0 {
            let deadline = Instant::now() + Duration::from_secs(20);
            while done.load(Ordering::SeqCst) < N - 1 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        } else {
            done.fetch_add(1, Ordering::SeqCst);
        }
    };
    // No prefetch: the UDFs read no file, but the `File` columns make map
    // call one row at a time.
    let chain = Chain::from_values_in(Session::new(), &rows).settings(
        Settings::new()
            .prefetch(0)
            .parallel(N)
            .batch_size(1)
            .ordered(ordered),
    );
    let chain = match kind {
        Kind::Map => chain.map_on(&["id"], "v", move |id: u64| {
            let done = Arc::clone(&done);
            async move {
                wait(id, done).await;
                Ok::<_, std::io::Error>(id)
            }
        }),
        Kind::BatchMap => chain.batch_map_on(&["id"], "v", move |ids: Vec<u64>| {
            let done = Arc::clone(&done);
            async move {
                for &id in &ids {
                    wait(id, Arc::clone(&done)).await;
                }
                Ok::<_, std::io::Error>(ids)
            }
        }),
        Kind::Gen => chain.gen_on(&["id"], "v", move |id: u64| {
            let done = Arc::clone(&done);
            futures::stream::once(async move {
                wait(id, done).await;
                Ok::<_, std::io::Error>(id)
            })
        }),
        Kind::Agg => chain.agg(&["key"], &["id"], "v", move |ids: Vec<u64>| {
            let done = Arc::clone(&done);
            async move {
                for &id in &ids {
                    wait(id, Arc::clone(&done)).await;
                }
                Ok::<_, std::io::Error>(ids)
            }
        }),
    };
    #[derive(Deserialize)]
    struct R {
        v: u64,
    }
    chain
        .select([col("v")])
        .to_rows::<R>()
        .await
        .expect("run")
        .into_iter()
        .map(|r| r.v)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unordered_emits_the_slow_row_last_ordered_keeps_input_order() {
    for kind in [Kind::Map, Kind::BatchMap, Kind::Gen, Kind::Agg] {
        assert_eq!(
            slow_first(kind, true).await,
            vec![0, 1, 2, 3, 4, 5],
            "{kind:?} ordered"
        );
        let got = slow_first(kind, false).await;
        let mut sorted = got.clone();
        sorted.sort_unstable();
        assert_eq!(
            sorted,
            vec![0, 1, 2, 3, 4, 5],
            "{kind:?} unordered: {got:?}"
        );
        assert_eq!(got.last(), Some(&0), "{kind:?} unordered: {got:?}");
    }
}
