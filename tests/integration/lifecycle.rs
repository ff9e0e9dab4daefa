//! A UDF's state (`udfs::map_with` & co.): set up once per process before
//! the first call, shared by the calls running at once, torn down exactly
//! once per setup however the run ends (success, a UDF error, a dropped
//! query); a failing setup fails the run once, whatever `on_error` says; a
//! `concurrency` bound is never exceeded under a larger `parallel`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde::{Deserialize, Serialize};
use udfchain::udfs::{agg_with, batch_map_with, gen_with, map_with};
use udfchain::{Chain, OnError, Session, Settings, Udf};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Row {
    x: i64,
    g: i64,
}

fn rows(n: i64) -> Vec<Row> {
    (0..n).map(|x| Row { x, g: x % 3 }).collect()
}

/// Counts setups, teardowns (the model's drop), calls in flight and their peak.
#[derive(Default)]
struct Counts {
    setups: AtomicUsize,
    teardowns: AtomicUsize,
    in_flight: AtomicUsize,
    peak: AtomicUsize,
}

impl Counts {
    fn setups(&self) -> usize {
        self.setups.load(Ordering::SeqCst)
    }
    fn teardowns(&self) -> usize {
        self.teardowns.load(Ordering::SeqCst)
    }
    /// Waits (bounded) until every setup is torn down: a dropped query's
    /// operators may be dropped by tasks a moment after the caller returns.
    async fn settled(&self) -> (usize, usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.teardowns() < self.setups() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        (self.setups(), self.teardowns())
    }
}

/// The state: counts its own teardown when dropped.
struct Model {
    counts: Arc<Counts>,
    bias: i64,
}

impl Drop for Model {
    fn drop(&mut self) {
        self.counts.teardowns.fetch_add(1, Ordering::SeqCst);
    }
}

/// A setup that builds a `Model` (after a little while, so that calls pile up behind it).
fn loader(
    counts: &Arc<Counts>,
) -> impl Fn() -> futures::future::BoxFuture<'static, Result<Model, std::io::Error>>
+ Send
+ Sync
+ 'static {
    let counts = Arc::clone(counts);
    move || {
        let counts = Arc::clone(&counts);
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            counts.setups.fetch_add(1, Ordering::SeqCst);
            Ok(Model { counts, bias: 100 })
        })
    }
}

/// x + the model's bias, failing at `fail_at`; counts calls in flight.
async fn predict(m: Arc<Model>, x: i64, fail_at: i64) -> Result<i64, std::io::Error> {
    let c = &m.counts;
    let now = c.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    c.peak.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(2)).await;
    c.in_flight.fetch_sub(1, Ordering::SeqCst);
    if x == fail_at {
        return Err(std::io::Error::other(format!("bad row {x}")));
    }
    Ok(x + m.bias)
}

fn chain_of(counts: &Arc<Counts>, fail_at: i64, settings: Settings, concurrency: usize) -> Chain {
    let udf = map_with(&["x"], "y", loader(counts), move |m: Arc<Model>, x: i64| {
        predict(m, x, fail_at)
    })
    .expect("udf")
    .concurrency(concurrency);
    Chain::from_values_in(Session::new(), &rows(60))
        .settings(settings)
        .udf(udf)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_is_set_up_once_per_run_and_torn_down_once() {
    let counts = Arc::new(Counts::default());
    let chain = chain_of(&counts, -1, Settings::new().parallel(8).batch_size(4), 8);
    let n: usize = chain
        .collect()
        .await
        .expect("run")
        .iter()
        .map(|b| b.num_rows())
        .sum();
    assert_eq!(n, 60);
    assert_eq!(counts.setups(), 1, "one setup for 60 rows at parallel 8");
    assert_eq!(counts.settled().await, (1, 1), "torn down once at the end");
    // A second run of the same chain: its own setup and teardown.
    assert_eq!(chain.count().await.expect("count"), 60);
    assert_eq!(counts.settled().await, (2, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_bounds_calls_under_a_larger_parallel() {
    let counts = Arc::new(Counts::default());
    let chain = chain_of(&counts, -1, Settings::new().parallel(8).batch_size(1), 1);
    chain.collect().await.expect("run");
    assert_eq!(counts.peak.load(Ordering::SeqCst), 1, "concurrency = 1");
    let counts = Arc::new(Counts::default());
    let chain = chain_of(&counts, -1, Settings::new().parallel(8).batch_size(1), 3);
    chain.collect().await.expect("run");
    let peak = counts.peak.load(Ordering::SeqCst);
    assert!((1..=3).contains(&peak), "concurrency = 3, peak {peak}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_udf_error_or_a_dropped_query_still_tears_down_once() {
    let counts = Arc::new(Counts::default());
    let chain = chain_of(&counts, 7, Settings::new().parallel(4), 8);
    let err = chain.collect().await.expect_err("row 7 fails");
    assert!(err.to_string().contains("bad row 7"), "{err}");
    assert_eq!(counts.settled().await, (1, 1), "after an error");

    let counts = Arc::new(Counts::default());
    let chain = chain_of(&counts, -1, Settings::new().parallel(4).batch_size(2), 8);
    let mut stream = chain.stream().await.expect("stream");
    let first = stream.next().await.expect("a batch").expect("ok");
    assert!(first.num_rows() > 0);
    drop(stream);
    assert_eq!(counts.settled().await, (1, 1), "after a dropped query");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_setup_fails_the_run_once_whatever_on_error_says() {
    let tries = Arc::new(AtomicUsize::new(0));
    for policy in [OnError::Skip, OnError::Null, OnError::Fail] {
        tries.store(0, Ordering::SeqCst);
        let t = Arc::clone(&tries);
        let udf = map_with(
            &["x"],
            "y",
            move || {
                let t = Arc::clone(&t);
                async move {
                    t.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    Err::<i64, _>(std::io::Error::other("weights not found"))
                }
            },
            |m: Arc<i64>, x: i64| async move { Ok::<_, std::io::Error>(x + *m) },
        )
        .expect("udf");
        let err = Chain::from_values_in(Session::new(), &rows(40))
            .settings(Settings::new().parallel(8).on_error(policy))
            .udf(udf)
            .collect()
            .await
            .expect_err("setup fails");
        let text = err.to_string();
        assert!(
            text.contains("setup failed") && text.contains("weights not found"),
            "{policy:?}: {text}"
        );
        assert!(!text.contains("row"), "a setup is no row's failure: {text}");
        assert_eq!(tries.load(Ordering::SeqCst), 1, "{policy:?}: one setup try");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_sets_up_once_and_tears_down_once() {
    let counts = Arc::new(Counts::default());
    let batch = batch_map_with(
        &["x"],
        "b",
        loader(&counts),
        |m: Arc<Model>, xs: Vec<i64>| async move {
            Ok::<_, std::io::Error>(xs.into_iter().map(|x| x + m.bias).collect::<Vec<_>>())
        },
    )
    .expect("batch");
    let generator = gen_with(&["x"], "e", loader(&counts), |m: Arc<Model>, x: i64| {
        futures::stream::iter([Ok::<_, std::io::Error>(x), Ok(m.bias)])
    })
    .expect("gen");
    let agg = agg_with(
        &["e"],
        "total",
        loader(&counts),
        |m: Arc<Model>, es: Vec<i64>| async move {
            Ok::<_, std::io::Error>(vec![es.iter().sum::<i64>() + m.bias])
        },
    )
    .expect("agg");
    let chain = Chain::from_values_in(Session::new(), &rows(30))
        .settings(Settings::new().parallel(4).batch_size(4))
        .udf(batch)
        .udf(generator)
        .udf(Udf::from(agg).partition_by(&["g"]));
    let n: usize = chain
        .collect()
        .await
        .expect("run")
        .iter()
        .map(|b| b.num_rows())
        .sum();
    assert_eq!(n, 3, "one total per group");
    assert_eq!(
        counts.settled().await,
        (3, 3),
        "one setup and teardown per UDF"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_executor_sets_up_once_for_all_its_tasks_and_runs() {
    let counts = Arc::new(Counts::default());
    let udf: udfchain::Udf = map_with(
        &["x"],
        "biased",
        loader(&counts),
        |m: Arc<Model>, x: i64| predict(m, x, -1),
    )
    .expect("udf")
    .into();
    let registry = udfchain::cluster::UdfRegistry::new().register(udf.clone());
    let session = Session::standalone(Settings::new().workers(2), registry, 2)
        .await
        .expect("standalone cluster");
    for run in 0..2 {
        let n: usize = Chain::from_values_in(Arc::clone(&session), &rows(60))
            .udf(udf.clone())
            .collect()
            .await
            .expect("cluster run")
            .iter()
            .map(|b| b.num_rows())
            .sum();
        assert_eq!(n, 60, "run {run}");
    }
    // The executor keeps the state of the UDFs its tasks ran: one setup for
    // every task of both runs, nothing torn down while it runs.
    assert_eq!((counts.setups(), counts.teardowns()), (1, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_udf_value_registered_for_sql_runs_under_its_sql_name_on_any_column() {
    use datafusion::arrow::array::{AsArray, RecordBatch};
    use datafusion::arrow::datatypes::Int64Type;
    use udfchain::{Output, ScriptRunner};

    let counts = Arc::new(Counts::default());
    let udf = map_with(&["x"], "y", loader(&counts), |m: Arc<Model>, x: i64| {
        predict(m, x, -1)
    })
    .expect("udf")
    .concurrency(1);
    let runner = ScriptRunner::new(Session::new());
    runner.register("predict", udf).expect("register");
    // Its param is `x`; the SQL calls it on `v`, beside a column named `x`
    // that must not shadow `v`.
    let out = runner
        .run("SELECT v, predict(v) AS p FROM (VALUES (1, 7), (2, 7), (3, 7)) AS t(v, x) ORDER BY v")
        .await
        .expect("query");
    let Some(Output::Table(batches)) = out.last() else {
        panic!("a table: {out:?}")
    };
    let batch =
        datafusion::arrow::compute::concat_batches(&batches[0].schema(), batches).expect("concat");
    let p: Vec<i64> = RecordBatch::column_by_name(&batch, "p")
        .expect("p")
        .as_primitive::<Int64Type>()
        .values()
        .to_vec();
    assert_eq!(p, vec![101, 102, 103]);
    let (setups, teardowns) = counts.settled().await;
    assert_eq!((setups, teardowns), (1, 1));

    let generator = gen_with(&["x"], "e", loader(&counts), |_: Arc<Model>, x: i64| {
        futures::stream::iter([Ok::<_, std::io::Error>(x)])
    })
    .expect("gen");
    let err = runner
        .register("explode_x", generator)
        .expect_err("a gen UDF is not a SQL function");
    assert!(
        err.to_string().contains("a gen UDF") && err.to_string().contains("Chain::udf"),
        "{err}"
    );
}
