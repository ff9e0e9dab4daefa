//! The training loader against a real S3 server on 127.0.0.1 with 20 ms per
//! request: a simulated trainer (a fixed sleep per batch, as a trainer waiting
//! on its accelerator) reads an epoch of files' bytes through
//! `Loader::with_bytes`, for k = 0, 1, 2, 4 partitions prefetched.
//!
//! ```sh
//! cargo bench --bench loader              # full run
//! cargo bench --bench loader -- --quick   # scaled down (CI)
//! ```
//!
//! Each run reports its epoch time next to the bound max(total fetch time / p,
//! total train time) (fetch time measured partition by partition, alone, in the
//! same process) and the serial sum (nothing overlapped), the ratio to the
//! bound, the time to the first batch, and the peak RSS next to (k + 1) x the
//! largest partition's bytes. Nothing is asserted: the harness reports.
//! Output: a table on stdout and `<target dir>/bench/loader.json` (records in
//! `loader/record.rs`, shared with the Flight runs of `loader/flight.rs`:
//! `udfchain serve` to a local Rust and pyarrow client next to pyarrow's own
//! Flight server and client, `loader/flight.py`).

#[path = "loader/record.rs"]
mod record;

#[path = "loader/flight.rs"]
mod flight;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use udfchain::loader::Loader;
use udfchain::{File, Session, Settings, col};

use record::{Record, RssSampler, epoch_table, vm_rss, write_json};
use udfchain_testkit::{S3Server, write_files};

/// Latency the server adds to every request.
const LATENCY: Duration = Duration::from_millis(20);
const FILE_BYTES: usize = 256 << 10;
const PARTITION_ROWS: usize = 16;
const BATCH: usize = 8;
/// What the trainer takes per batch.
const STEP: Duration = Duration::from_millis(20);

/// The files on the server, dataset `files` of them, and a session reaching both.
struct Env {
    _server: S3Server,
    _root: tempfile::TempDir,
    session: Arc<Session>,
}

async fn env(files: usize) -> Env {
    let server = S3Server::start_shaped(LATENCY, None);
    write_files(&server.bucket_dir(), files, |_| FILE_BYTES);
    let root = tempfile::TempDir::new().expect("root");
    let session = Session::with_settings(
        server
            .settings()
            .root(root.path())
            .cache(false)
            .prefetch(PARTITION_ROWS),
    );
    session
        .from_storage("s3://bucket/")
        .settings(Settings::new().prefetch(0))
        .map("name", |f: File| async move {
            Ok::<String, std::io::Error>(f.path)
        })
        .order_by([col("name").sort(true, false)])
        .save("files")
        .await
        .expect("save the dataset");
    Env {
        _server: server,
        _root: root,
        session,
    }
}

fn loader(env: &Env, k: usize, p: usize) -> Loader {
    Loader::from_dataset("files")
        .in_session(Arc::clone(&env.session))
        .partition_rows(PARTITION_ROWS)
        .batch_size(BATCH)
        .prefetch_partitions(k)
        .parallel_requests(p)
        .columns(["name"])
        .with_bytes("file", "data")
}

/// Fetches every partition alone, one after the other: (total seconds, largest bytes).
async fn fetch_alone(env: &Env) -> (f64, u64) {
    let l = loader(env, 0, 1);
    let plan = l.plan(0).await.expect("plan");
    let (mut total, mut largest) = (0.0, 0u64);
    for i in 0..plan.partitions.len() {
        let t = Instant::now();
        let data = l.fetch(&plan, i).await.expect("fetch");
        total += t.elapsed().as_secs_f64();
        largest = largest.max(data.bytes as u64);
    }
    (total, largest)
}

/// One epoch with the simulated trainer.
async fn epoch(
    env: &Env,
    k: usize,
    p: usize,
    fetch_s: f64,
    part_bytes: u64,
    quick: bool,
) -> Record {
    let l = loader(env, k, p);
    let partitions = l.plan(0).await.expect("plan").partitions.len();
    let start_rss = vm_rss();
    let sampler = RssSampler::start();
    let t0 = Instant::now();
    let mut stream = l.epoch(0).await.expect("epoch");
    let (mut first, mut rows, mut train) = (None, 0, 0.0);
    while let Some(batch) = stream.next().await {
        let batch = batch.expect("batch");
        first.get_or_insert_with(|| t0.elapsed().as_secs_f64());
        rows += batch.num_rows();
        let step = Instant::now();
        tokio::time::sleep(STEP).await;
        train += step.elapsed().as_secs_f64();
    }
    let seconds = t0.elapsed().as_secs_f64();
    let peak = sampler.finish();
    let bound = (fetch_s / p as f64).max(train);
    Record {
        kind: "epoch",
        quick,
        prefetch_partitions: Some(k),
        parallel_requests: Some(p),
        seconds,
        bound_seconds: Some(bound),
        serial_seconds: Some(fetch_s + train),
        ratio_to_bound: Some(bound / seconds),
        first_batch_seconds: first,
        peak_rss_bytes: peak,
        start_rss_bytes: start_rss,
        partition_bytes: Some(part_bytes),
        held_bound_bytes: Some((k as u64 + 1) * part_bytes),
        partitions: Some(partitions),
        rows: Some(rows),
        ..Record::default()
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    // `--only epoch` or `--only flight`: one half of the benchmark.
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .cloned();
    let wanted = |kind: &str| only.as_deref().is_none_or(|o| o == kind);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(udfchain::testing::cores())
        .thread_name("bench-io")
        .enable_all()
        .build()
        .expect("runtime");
    let partitions = if quick { 12 } else { 40 };
    let files = partitions * PARTITION_ROWS;
    let mut records = Vec::new();
    rt.block_on(async {
        if wanted("epoch") {
            let env = env(files).await;
            // Warm up (connections, the catalog, the page cache), then measure.
            let _ = fetch_alone(&env).await;
            let (fetch_s, part_bytes) = fetch_alone(&env).await;
            eprintln!(
                "loader epoch: {files} files x {} KiB, {PARTITION_ROWS} rows per partition, {} ms per request, trainer {} ms per batch of {BATCH}; fetching every partition alone took {fetch_s:.3} s",
                FILE_BYTES >> 10,
                LATENCY.as_millis(),
                STEP.as_millis()
            );
            let mut grid: Vec<(usize, usize)> = [0, 1, 2, 4].iter().map(|&k| (k, 1)).collect();
            if !quick {
                grid.extend([(2, 2), (4, 2)]);
            }
            for (k, p) in grid {
                let r = epoch(&env, k, p, fetch_s, part_bytes, quick).await;
                eprintln!("  k={k} p={p}: {:.3} s, ratio to bound {:.2}", r.seconds, r.ratio_to_bound.unwrap_or(0.0));
                records.push(r);
            }
        }
        if wanted("flight") {
            records.extend(flight::runs(quick).await);
        }
    });
    println!(
        "\nudfchain loader ({}): epoch of simulated training, bound = max(fetch / p, train)\n",
        if quick { "--quick" } else { "full" }
    );
    print!("{}", epoch_table(&records));
    println!("\nTarget (reported, not asserted): k >= 2 within 10% of the bound (ratio >= 0.90):");
    for r in records
        .iter()
        .filter(|r| r.kind == "epoch" && r.prefetch_partitions.unwrap_or(0) >= 2)
    {
        let ratio = r.ratio_to_bound.unwrap_or(0.0);
        println!(
            "  k={} p={}: ratio {ratio:.2} {}",
            r.prefetch_partitions.unwrap_or(0),
            r.parallel_requests.unwrap_or(0),
            if ratio >= 0.9 { "met" } else { "NOT met" }
        );
    }
    println!(
        "\nFlight over loopback: udfchain serve (in-process) to a Rust and a pyarrow client, next to pyarrow's own server and client on the same partitions (the reference) and to decoding the same Arrow IPC from memory\n"
    );
    print!("{}", flight::table(&records));
    println!(
        "\nTargets (reported, not asserted; ratios of this run, load average {}):",
        record::load_average().map_or_else(|| "-".to_string(), |l| format!("{l:.2}"))
    );
    print!("{}", flight::targets(&records));
    println!("\nwrote {}", write_json(&records).display());
}
