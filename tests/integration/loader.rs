//! The training loader against real parts: datasets in a real catalog, files
//! on the loopback S3 server (with per-request latency), GETs counted and
//! timestamped, faults injected into the store. Every row exactly once per
//! epoch over the grid of prefetch × parallel × shuffle × ranks × workers;
//! dataset order without shuffle; seeded, per-epoch shuffles; prefetch really
//! ahead of the trainer; at most k + 1 partitions in memory; whole-partition
//! retries that neither lose nor repeat a row; clear errors for bad settings.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use datafusion::arrow::array::{AsArray, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, UInt64Type};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tempfile::TempDir;
use udfchain::loader::Loader;
use udfchain::{Chain, Error, File, Session, Settings, col};

use udfchain_testkit::{CountingStore, Fault, FaultyStore, S3Server, content, write_files};

#[derive(Serialize, Deserialize)]
struct Row {
    id: u64,
    label: String,
}

/// A session under a fresh root holding dataset `ids`: rows 0..n, in order.
async fn id_dataset(n: usize) -> (TempDir, Arc<Session>) {
    let root = TempDir::new().expect("root");
    let session = Session::with_settings(Settings::new().root(root.path()));
    let rows: Vec<Row> = (0..n as u64)
        .map(|id| Row {
            id,
            label: format!("row {id}"),
        })
        .collect();
    Chain::from_values_in(Arc::clone(&session), &rows)
        .save("ids")
        .await
        .expect("save ids");
    (root, session)
}

fn column_u64(b: &RecordBatch, name: &str) -> Vec<u64> {
    let c = cast(b.column_by_name(name).expect("column"), &DataType::UInt64).expect("cast");
    c.as_primitive::<UInt64Type>().values().to_vec()
}

fn column_str(b: &RecordBatch, name: &str) -> Vec<String> {
    let c = cast(b.column_by_name(name).expect("column"), &DataType::Utf8).expect("cast");
    c.as_string::<i32>()
        .iter()
        .map(|s| s.expect("value").to_string())
        .collect()
}

async fn drain(loader: &Loader, epoch: u64) -> Vec<RecordBatch> {
    let mut s = loader.epoch(epoch).await.expect("epoch");
    let mut out = Vec::new();
    while let Some(b) = s.next().await {
        out.push(b.expect("batch"));
    }
    out
}

async fn epoch_ids(loader: &Loader, epoch: u64) -> Vec<u64> {
    drain(loader, epoch)
        .await
        .iter()
        .flat_map(|b| column_u64(b, "id"))
        .collect()
}

/// Every row exactly once per epoch across all (rank, worker) consumers, for
/// k in {0,1,2,5,1000} × p in {1,3} × shuffle off/on × 1-3 ranks × 0-4 workers;
/// each consumer gets the rows its plan announces.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_row_exactly_once_over_the_grid() {
    let n = 23;
    let (_root, session) = id_dataset(n).await;
    let base = Loader::from_dataset("ids")
        .in_session(Arc::clone(&session))
        .partition_rows(5)
        .batch_size(3);
    let mut runs = 0;
    for k in [0, 1, 2, 5, 1000] {
        for p in [1, 3] {
            for shuffle in [false, true] {
                for world in 1..=3 {
                    for workers in 0..=4 {
                        let mut seen = Vec::new();
                        for rank in 0..world {
                            for worker in 0..workers.max(1) {
                                let mut l = base
                                    .clone()
                                    .prefetch_partitions(k)
                                    .parallel_requests(p)
                                    .shard(rank, world)
                                    .worker(worker, workers);
                                if shuffle {
                                    l = l.shuffle(7);
                                }
                                let plan = l.plan(1).await.expect("plan");
                                let announced: usize = plan.partitions.iter().map(|p| p.rows).sum();
                                let got = epoch_ids(&l, 1).await;
                                assert_eq!(
                                    got.len(),
                                    announced,
                                    "k={k} p={p} rank={rank} worker={worker}"
                                );
                                seen.extend(got);
                                runs += 1;
                            }
                        }
                        seen.sort_unstable();
                        assert_eq!(
                            seen,
                            (0..n as u64).collect::<Vec<_>>(),
                            "k={k} p={p} shuffle={shuffle} world={world} workers={workers}"
                        );
                    }
                }
            }
        }
    }
    assert_eq!(runs, 5 * 2 * 2 * (1 + 2 + 3) * (1 + 1 + 2 + 3 + 4));
}

/// Without shuffle the rows come in dataset order, batches straddling
/// partitions (batch size 7 over partitions of 10): full batches but the
/// last, which `drop_last` drops; a chain source gives the same rows, and
/// `columns` keeps only (and orders) the columns asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unshuffled_order_is_dataset_order_across_partitions() {
    let n = 53;
    let (_root, session) = id_dataset(n).await;
    let loader = Loader::from_dataset("ids")
        .in_session(Arc::clone(&session))
        .partition_rows(10)
        .batch_size(7)
        .prefetch_partitions(2);
    let batches = drain(&loader, 0).await;
    let sizes: Vec<usize> = batches.iter().map(|b| b.num_rows()).collect();
    assert_eq!(sizes, [7, 7, 7, 7, 7, 7, 7, 4]);
    let ids: Vec<u64> = batches.iter().flat_map(|b| column_u64(b, "id")).collect();
    assert_eq!(ids, (0..n as u64).collect::<Vec<_>>());
    let labels: Vec<String> = batches
        .iter()
        .flat_map(|b| column_str(b, "label"))
        .collect();
    assert_eq!(labels[52], "row 52");

    let dropped = drain(&loader.clone().drop_last(true), 0).await;
    assert_eq!(dropped.iter().map(|b| b.num_rows()).sum::<usize>(), 49);

    let only = loader.clone().columns(["label", "id"]);
    let b = drain(&only, 0).await;
    let names: Vec<String> = b[0]
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    assert_eq!(names, ["label", "id"]);

    let chain = session
        .from_dataset("ids")
        .filter(col("id").lt(datafusion::prelude::lit(30u64)));
    let from_chain = Loader::from_chain(chain).partition_rows(4).batch_size(5);
    assert_eq!(
        epoch_ids(&from_chain, 0).await,
        (0..30u64).collect::<Vec<_>>()
    );
    let plan = from_chain.plan(3).await.expect("plan");
    let order: Vec<usize> = plan.partitions.iter().map(|p| p.source_partition).collect();
    assert_eq!(order, (0..8).collect::<Vec<_>>());
}

/// Shuffled orders differ between epochs and seeds, and repeat for the same
/// (seed, epoch), in a fresh loader too; partition order and the rows inside
/// a partition are both permuted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shuffles_are_new_per_epoch_and_repeat_per_seed_and_epoch() {
    let n = 60;
    let (_root, session) = id_dataset(n).await;
    let loader = |seed| {
        Loader::from_dataset("ids")
            .in_session(Arc::clone(&session))
            .partition_rows(10)
            .batch_size(4)
            .shuffle(seed)
    };
    let e0 = epoch_ids(&loader(7), 0).await;
    let e1 = epoch_ids(&loader(7), 1).await;
    let again = epoch_ids(&loader(7), 0).await;
    let other_seed = epoch_ids(&loader(8), 0).await;
    assert_eq!(e0, again, "same (seed, epoch), same order");
    assert_ne!(e0, e1, "a new permutation each epoch");
    assert_ne!(e0, other_seed);
    let mut sorted = e0.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..n as u64).collect::<Vec<_>>());
    assert_ne!(e0, sorted, "shuffled");

    let orders: Vec<Vec<usize>> = {
        let mut v = Vec::new();
        for e in 0..4 {
            let plan = loader(7).plan(e).await.expect("plan");
            v.push(plan.partitions.iter().map(|p| p.source_partition).collect());
        }
        v
    };
    assert!(
        orders.iter().any(|o| *o != (0..6).collect::<Vec<_>>()),
        "partition order is shuffled: {orders:?}"
    );
    assert!(
        orders.windows(2).any(|w| w[0] != w[1]),
        "and changes between epochs"
    );
    // Rows inside the first partition read: from that partition, not in order.
    let plan = loader(7).plan(0).await.expect("plan");
    let first = plan.partitions[0].source_partition as u64;
    let head = &e0[..10];
    assert!(
        head.iter().all(|id| id / 10 == first),
        "{head:?} from partition {first}"
    );
    assert!(
        head.windows(2).any(|w| w[0] > w[1]),
        "rows inside are shuffled: {head:?}"
    );
}

/// Files `0..n` on an S3 server with `latency` per request (served through a
/// store built by `wrap`), and dataset `files` of their `file` and `name`
/// columns, sorted by name.
struct S3Files {
    server: S3Server,
    _root: TempDir,
    session: Arc<Session>,
    counting: Arc<CountingStore>,
    names: Vec<String>,
    size: usize,
}

async fn s3_files(
    n: usize,
    size: usize,
    latency: Duration,
    wrap: impl FnOnce(Arc<dyn object_store::ObjectStore>) -> Arc<dyn object_store::ObjectStore>,
) -> S3Files {
    let server = S3Server::start_shaped(latency, None);
    let mut names = write_files(&server.bucket_dir(), n, |_| size);
    names.sort();
    let root = TempDir::new().expect("root");
    let session = Session::with_settings(server.settings().root(root.path()));
    let inner = session.store("s3://bucket/").expect("store");
    let counting = CountingStore::new(wrap(inner));
    session
        .register_store("s3://bucket", Arc::clone(&counting) as _)
        .expect("register");
    session
        .from_storage("s3://bucket/")
        .settings(Settings::new().prefetch(0))
        .map("name", |f: File| async move {
            Ok::<String, std::io::Error>(f.path)
        })
        .order_by([col("name").sort(true, false)])
        .save("files")
        .await
        .expect("save files");
    S3Files {
        server,
        _root: root,
        session,
        counting,
        names,
        size,
    }
}

/// The file number of `d1/f0004.bin`.
fn file_number(name: &str) -> usize {
    name.rsplit('f')
        .next()
        .and_then(|s| s.strip_suffix(".bin"))
        .and_then(|s| s.parse().ok())
        .expect("a test file name")
}

/// Checks every batch's bytes column against the files' content and returns the names.
fn names_and_bytes(batches: &[RecordBatch], size: usize) -> Vec<String> {
    let mut out = Vec::new();
    for b in batches {
        let names = column_str(b, "name");
        let data = b
            .column_by_name("data")
            .expect("data")
            .as_binary::<i32>()
            .clone();
        for (i, name) in names.into_iter().enumerate() {
            assert_eq!(data.value(i), content(file_number(&name), size), "{name}");
            out.push(name);
        }
    }
    out
}

/// With bytes: every file's bytes exactly once, right, over p and shuffle.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bytes_of_every_file_exactly_once() {
    let s = s3_files(30, 3000, Duration::from_millis(5), |s| s).await;
    for (k, p, shuffle, workers) in [(0, 1, false, 0), (2, 3, true, 2), (1000, 3, true, 3)] {
        let mut seen = Vec::new();
        for w in 0..workers.max(1) {
            let mut l = Loader::from_dataset("files")
                .in_session(Arc::clone(&s.session))
                .partition_rows(4)
                .batch_size(3)
                .prefetch_partitions(k)
                .parallel_requests(p)
                .worker(w, workers)
                .columns(["name"])
                .with_bytes("file", "data");
            if shuffle {
                l = l.shuffle(3);
            }
            let batches = drain(&l, 2).await;
            assert_eq!(batches[0].num_columns(), 2, "name and data");
            let names = names_and_bytes(&batches, s.size);
            if !shuffle && workers == 0 {
                assert_eq!(names, s.names, "dataset order");
            }
            seen.extend(names);
        }
        seen.sort();
        assert_eq!(seen, s.names, "k={k} p={p} shuffle={shuffle}");
    }
}

/// The trainer takes 40 ms per batch of 2 rows (partitions of 4 rows, 20 ms
/// per request): with k = 2 the GETs of partition i+1 start before the trainer
/// is done with partition i; with k = 0 only after it (on demand).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn prefetch_runs_ahead_of_the_trainer() {
    let s = s3_files(24, 2000, Duration::from_millis(20), |s| s).await;
    for k in [2, 0] {
        let loader = Loader::from_dataset("files")
            .in_session(Arc::clone(&s.session))
            .partition_rows(4)
            .batch_size(2)
            .prefetch_partitions(k)
            .with_bytes("file", "data");
        let mut stream = loader.epoch(0).await.expect("epoch");
        // (names of the batch, when the trainer was done with it)
        let mut done = Vec::new();
        while let Some(b) = stream.next().await {
            let b = b.expect("batch");
            tokio::time::sleep(Duration::from_millis(40)).await;
            done.push((column_str(&b, "name"), Instant::now()));
        }
        let rows: Vec<&String> = done.iter().flat_map(|(n, _)| n).collect();
        assert_eq!(rows.len(), 24);
        for i in 0..5 {
            // The trainer finishes partition i with the batch holding its 4th row.
            let finished = done[2 * i + 1].1;
            let next_start = s.names[4 * (i + 1)..4 * (i + 2)]
                .iter()
                .filter_map(|n| s.counting.get_starts(n).into_iter().max())
                .min()
                .expect("GETs of the next partition");
            if k == 2 {
                assert!(
                    next_start < finished,
                    "k=2: partition {} fetched ahead",
                    i + 1
                );
            } else {
                assert!(
                    next_start > finished,
                    "k=0: partition {} fetched on demand",
                    i + 1
                );
            }
        }
    }
}

/// The session's memory pool, sampled every millisecond while a slow trainer
/// reads: at most k + 1 partitions are held (k = 0 and 2), and with k = 2
/// more than one is (the bound is reached, the sampling sees it).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn at_most_k_plus_one_partitions_are_held() {
    let s = s3_files(32, 20_000, Duration::ZERO, |s| s).await;
    for k in [0usize, 2] {
        let loader = Loader::from_dataset("files")
            .in_session(Arc::clone(&s.session))
            .partition_rows(4)
            .batch_size(2)
            .prefetch_partitions(k)
            .parallel_requests(2)
            .with_bytes("file", "data");
        let plan = loader.plan(0).await.expect("plan");
        let mut largest = 0;
        for i in 0..plan.partitions.len() {
            largest = largest.max(loader.fetch(&plan, i).await.expect("fetch").bytes);
        }
        assert!(largest >= 4 * 20_000);
        let pool = Arc::clone(&s.session.context().runtime_env().memory_pool);
        assert_eq!(pool.reserved(), 0, "fetched partitions were released");
        let peak = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let sampler = {
            let (peak, stop, pool) = (Arc::clone(&peak), Arc::clone(&stop), Arc::clone(&pool));
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    peak.fetch_max(pool.reserved(), Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            })
        };
        let mut stream = loader.epoch(0).await.expect("epoch");
        let mut rows = 0;
        while let Some(b) = stream.next().await {
            rows += b.expect("batch").num_rows();
            tokio::time::sleep(Duration::from_millis(15)).await;
        }
        stop.store(true, Ordering::SeqCst);
        sampler.await.expect("sampler");
        assert_eq!(rows, 32);
        let peak = peak.load(Ordering::SeqCst);
        // In-flight downloads are charged by the prefetch too: allow one
        // partition's worth for them.
        assert!(
            peak <= (k + 2) * largest,
            "k={k}: peak {peak} > {} partitions of {largest}",
            k + 2
        );
        if k == 2 {
            assert!(peak > largest, "k=2 holds partitions ahead: peak {peak}");
        }
        drop(stream);
        assert_eq!(pool.reserved(), 0, "k={k}: all released at the end");
    }
}

/// One file's GETs fail for its first 12 attempts (more than a download
/// retries), another's body breaks off once: the partitions holding them are
/// fetched again as a whole, and the epoch still has every row once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn faults_mid_partition_give_every_row_once() {
    let victim = "d1/f0013.bin";
    let broken = "d2/f0005.bin";
    let s = s3_files(20, 3000, Duration::ZERO, move |inner| {
        FaultyStore::new(
            inner,
            |_| Duration::ZERO,
            move |path, attempt| {
                if path.ends_with(victim) && attempt < 12 {
                    Fault::Request
                } else if path.ends_with(broken) && attempt == 0 {
                    Fault::MidBody
                } else {
                    Fault::None
                }
            },
        ) as _
    })
    .await;
    let loader = Loader::from_dataset("files")
        .in_session(Arc::clone(&s.session))
        .partition_rows(5)
        .batch_size(3)
        .prefetch_partitions(2)
        .parallel_requests(3)
        .shuffle(11)
        .with_bytes("file", "data");
    let batches = drain(&loader, 0).await;
    let mut names = names_and_bytes(&batches, s.size);
    let unique: BTreeSet<&String> = names.iter().collect();
    assert_eq!(unique.len(), names.len(), "no row twice");
    names.sort();
    assert_eq!(names, s.names, "no row dropped");
    assert!(
        s.counting.get_starts(victim).len() > 12,
        "the victim's partition was fetched again ({} GETs)",
        s.counting.get_starts(victim).len()
    );
}

/// Bad settings fail at plan/epoch with the setting named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_settings_are_clear_errors() {
    let (_root, session) = id_dataset(5).await;
    let l = || Loader::from_dataset("ids").in_session(Arc::clone(&session));
    let cases: Vec<(Loader, &str)> = vec![
        (l().partition_rows(0), "partition_rows"),
        (l().batch_size(0), "batch_size"),
        (l().parallel_requests(0), "parallel_requests"),
        (l().shard(2, 2), "rank"),
        (l().shard(0, 0), "world_size"),
        (l().worker(4, 4), "worker"),
        (l().worker(1, 0), "worker"),
        (l().columns(["id", "nope"]), "columns"),
        (l().with_bytes("label", "data"), "with_bytes file column"),
        (l().with_bytes("nope", "data"), "with_bytes file column"),
    ];
    for (loader, name) in cases {
        match loader.epoch(0).await.map(|_| ()) {
            Err(Error::Setting { name: got, .. }) => assert_eq!(got, name),
            other => panic!("{name}: expected a setting error, got {other:?}"),
        }
    }
    let msg = l().shard(3, 2).plan(0).await.expect_err("rank").to_string();
    assert!(
        msg.contains("rank") && msg.contains("world_size 2"),
        "{msg}"
    );
    let msg = l()
        .columns(["nope"])
        .plan(0)
        .await
        .expect_err("col")
        .to_string();
    assert!(msg.contains("nope") || msg.contains("columns"), "{msg}");
    let missing = Loader::from_dataset("absent")
        .in_session(Arc::clone(&session))
        .plan(0)
        .await;
    assert!(matches!(missing, Err(Error::Dataset(_))), "{missing:?}");
    let plan = l().plan(0).await.expect("plan");
    assert!(matches!(
        l().fetch(&plan, 9).await,
        Err(Error::Setting { .. })
    ));
}

/// Dropping the epoch stream part-way aborts the fetches ahead: no GET starts
/// after the drop has settled, and the memory pool holds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dropping_the_stream_stops_fetching_and_frees_memory() {
    let s = s3_files(40, 10_000, Duration::from_millis(20), |s| s).await;
    let loader = Loader::from_dataset("files")
        .in_session(Arc::clone(&s.session))
        .partition_rows(4)
        .batch_size(2)
        .prefetch_partitions(3)
        .parallel_requests(2)
        .with_bytes("file", "data");
    let pool = Arc::clone(&s.session.context().runtime_env().memory_pool);
    let mut stream = loader.epoch(0).await.expect("epoch");
    for _ in 0..3 {
        stream.next().await.expect("a batch").expect("batch");
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(pool.reserved() > 0, "partitions ahead are held");
    drop(stream);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let gets = s.counting.gets();
    assert!(gets < 40, "the epoch was cut short ({gets} GETs)");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(s.counting.gets(), gets, "no GET after the drop");
    assert_eq!(pool.reserved(), 0, "nothing held after the drop");
}

/// The S3 server stops part-way through the epoch and comes back 500 ms
/// later: the epoch still has every row once, with the right bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_stopped_mid_epoch_gives_every_row_once() {
    let s = s3_files(24, 5000, Duration::from_millis(10), |s| s).await;
    let loader = Loader::from_dataset("files")
        .in_session(Arc::clone(&s.session))
        .partition_rows(4)
        .batch_size(3)
        .prefetch_partitions(2)
        .parallel_requests(2)
        .with_bytes("file", "data");
    let mut stream = loader.epoch(0).await.expect("epoch");
    let mut batches = Vec::new();
    let mut stopped = false;
    while let Some(b) = stream.next().await {
        batches.push(b.expect("batch"));
        if batches.len() == 2 {
            s.server.stop();
            stopped = true;
            tokio::time::sleep(Duration::from_millis(500)).await;
            s.server.restart();
        }
    }
    assert!(stopped);
    let mut names = names_and_bytes(&batches, s.size);
    assert_eq!(names.len(), 24, "no row twice or dropped");
    names.sort();
    assert_eq!(names, s.names);
}

/// A partition whose object is gone (404) fails after one GET of that object:
/// the loader retries a partition (`ATTEMPTS` in `src/loader/partition.rs`) only
/// on an error that may heal, and the error says what is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_object_fails_the_partition_without_retries() {
    let s = s3_files(6, 100, Duration::ZERO, |s| s).await;
    let gone = s.names[2].clone();
    std::fs::remove_file(s.server.bucket_dir().join(&gone)).expect("remove");
    let loader = Loader::from_dataset("files")
        .in_session(Arc::clone(&s.session))
        .partition_rows(3)
        .with_bytes("file", "data");
    let mut stream = loader.epoch(0).await.expect("epoch");
    let mut failure = None;
    while let Some(b) = stream.next().await {
        if let Err(e) = b {
            failure = Some(e);
            break;
        }
    }
    let e = failure.expect("the missing object fails its partition");
    assert!(!e.may_heal(), "{e}");
    assert!(e.to_string().contains(&gone), "{e}");
    assert_eq!(
        s.counting.get_starts(&gone).len(),
        1,
        "one GET, no retry: {e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_images_delivers_each_file_decoded_and_resized_as_one_tensor_block() {
    use udfchain::udfs::builtins::image::{
        DecodeOptions, Filter, Format, Image, Mode, decode, encode, resize,
    };
    let dir = tempfile::tempdir().expect("dir");
    let mut written = std::collections::BTreeMap::new();
    for i in 0..23u32 {
        let (w, h) = (30 + i, 20 + 2 * i);
        let data = (0..w * h * 3)
            .map(|j| ((j * 7 + i * 31) % 256) as u8)
            .collect();
        let img = Image::new(w, h, Mode::Rgb, data).expect("image");
        let format = if i % 3 == 0 {
            Format::Jpeg
        } else {
            Format::Png
        };
        let bytes = encode(img.view(), format, Some(90)).expect("encode");
        let name = format!("img{i:02}.{}", if i % 3 == 0 { "jpg" } else { "png" });
        std::fs::write(dir.path().join(&name), &bytes).expect("write");
        written.insert(name, bytes);
    }
    let session = Session::new();
    let chain = Chain::from_storage(&dir.path().display().to_string()).in_session(session);
    let loader = Loader::from_chain(chain)
        .partition_rows(5)
        .prefetch_partitions(2)
        .batch_size(4)
        .columns(["file"])
        .with_images("file", "image", (16, 12), Mode::Rgb);
    let batches = drain(&loader, 0).await;
    let field = batches[0]
        .schema()
        .field_with_name("image")
        .expect("image")
        .clone();
    assert_eq!(
        field
            .metadata()
            .get("ARROW:extension:name")
            .map(String::as_str),
        Some("arrow.fixed_shape_tensor")
    );
    let mut seen = 0;
    for b in &batches {
        let files = b.column_by_name("file").expect("file").as_struct();
        let paths = files
            .column_by_name("path")
            .expect("path")
            .as_string::<i32>();
        let images = b
            .column_by_name("image")
            .expect("image")
            .as_fixed_size_list();
        assert_eq!(images.value_length(), 16 * 12 * 3);
        for row in 0..b.num_rows() {
            let name = paths.value(row).rsplit('/').next().expect("name");
            // Decoded as documented: RGB, a JPEG at reduced size in the DCT
            // when it is at least twice the longer target side, then resized.
            let options = DecodeOptions {
                mode: Some(Mode::Rgb),
                max_side: Some(16),
                ..DecodeOptions::default()
            };
            let want = resize(
                decode(&written[name], &options).expect("decode").view(),
                16,
                12,
                Filter::Bilinear,
            )
            .expect("resize");
            let got = images.value(row);
            let got = got.as_primitive::<datafusion::arrow::datatypes::UInt8Type>();
            assert_eq!(got.values().as_ref(), want.data.as_slice(), "{name}");
            seen += 1;
        }
    }
    assert_eq!(seen, written.len());

    // A file that is not an image fails the epoch, naming it.
    std::fs::write(dir.path().join("zz-broken.png"), b"\x89PNG nope").expect("write");
    let chain = Chain::from_storage(&dir.path().display().to_string()).in_session(Session::new());
    let loader = Loader::from_chain(chain).with_images("file", "image", (8, 8), Mode::L);
    let mut stream = loader.epoch(0).await.expect("epoch");
    let mut err = None;
    while let Some(b) = stream.next().await {
        if let Err(e) = b {
            err = Some(e);
            break;
        }
    }
    let err = err.expect("the broken file fails");
    assert!(err.to_string().contains("zz-broken.png"), "{err}");
    // Bad sizes and names are setting errors.
    let l = || Loader::from_chain(Chain::from_values(&[1u64]));
    let e = l()
        .with_images("value", "image", (8, 8), Mode::Rgb)
        .plan(0)
        .await
        .expect_err("not a File");
    assert!(e.to_string().contains("with_images file column"), "{e}");
    let chain = Chain::from_storage(&dir.path().display().to_string()).in_session(Session::new());
    let e = Loader::from_chain(chain)
        .with_images("file", "image", (0, 8), Mode::Rgb)
        .plan(0)
        .await
        .expect_err("width 0");
    assert!(e.to_string().contains("with_images size"), "{e}");
}
