//! The Flight half of the loader benchmark: `udfchain serve`'s throughput from
//! an in-process server over loopback, to a Rust `FlightClient` and to a
//! pyarrow client, next to pyarrow's own Flight server and client moving the
//! same partitions (the reference) and to decoding the same Arrow IPC from
//! memory.
//!
//! Runs, all `kind = "flight"`, one `peer` each:
//! - `udfchain->rust`: with the server's default read-ahead of 2 (Parquet
//!   decoding overlapped with sending), and with every partition read ahead
//!   before the clock starts (`prefetch_partitions` = all: the transport alone);
//! - `udfchain->pyarrow`: `flight.py client` (pyarrow's client, default
//!   options) reading the same server, every partition read ahead first, once
//!   with the server's default messages (16 MiB for pyarrow's user agent: a
//!   partition in one message, as pyarrow's server sends it) and once asking
//!   for 2 MiB messages (`max_message_bytes`; every other client's default);
//! - `pyarrow->pyarrow`: `flight.py reference`, pyarrow's `FlightServerBase`
//!   serving the partitions' batches (written by this file as Arrow IPC, read
//!   into memory) to pyarrow's client in the same process.
//!
//! Every all-ahead peer runs one warm-up and then [`ROUNDS`] timed rounds
//! (`--quick`: 1); its record keeps the best. MB/s is the partitions' Arrow
//! bytes (as the server holds them, the same number for every peer) / wall
//! time from the first `do_get` to the last batch. `ratio_to_reference` = MB/s
//! / pyarrow->pyarrow MB/s of the same run; targets (reported, not asserted):
//! udfchain->rust >= 1.0 and udfchain->pyarrow (the server's defaults) >= 0.9
//! with every partition read ahead. In the table a `*` marks the server's
//! default message size for that client. `ipc_mb_per_s`/`ratio_to_bound`: the same bytes
//! decoded from a `Vec<u8>` of Arrow IPC. Python is `$UDFCHAIN_PYTHON`, else
//! `~/.cache/udfchain-venv/bin/python`; without pyarrow the pyarrow peers
//! are records with an `error` and no numbers.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{Action, FlightClient, FlightDescriptor, FlightInfo};
use datafusion::arrow::ipc::reader::StreamReader;
use datafusion::arrow::ipc::writer::StreamWriter;
use futures::TryStreamExt;
use udfchain::loader::Loader;
use udfchain::serve::{FlightServer, ReadAheadStats};
use udfchain::{Chain, Session, Settings};

use crate::record::{Record, RssSampler, load_average, vm_rss};

const ROW_BYTES: usize = 2048;
const PARTITION_ROWS: usize = 4096;
/// Timed rounds of each all-ahead peer, after one warm-up: a round moves
/// 272 MB in ~0.15 s, so the best of 9 is steadier than the best of 3.
const ROUNDS: usize = 9;
/// Target ratios to pyarrow->pyarrow (reported, not asserted).
const RUST_TARGET: f64 = 1.0;
const PYARROW_TARGET: f64 = 0.9;

#[derive(serde::Serialize, serde::Deserialize)]
struct Row {
    id: i64,
    payload: String,
}

async fn client(addr: SocketAddr) -> FlightClient {
    // Windows larger than hyper's defaults (2 MiB stream, 5 MiB connection),
    // as a bulk reader sets them: the server never waits for window updates;
    // and frames of up to 1 MiB instead of HTTP/2's 16 KiB, so the server
    // writes a message in a few system calls instead of one per 16 KiB.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .initial_stream_window_size(Some(32 << 20))
        .initial_connection_window_size(Some(64 << 20))
        .max_frame_size(Some(1 << 20))
        .tcp_nodelay(true)
        .connect()
        .await
        .expect("connect");
    FlightClient::new_from_inner(
        FlightServiceClient::new(channel).max_decoding_message_size(64 << 20),
    )
}

async fn stats(c: &mut FlightClient) -> ReadAheadStats {
    let body: Vec<_> = c
        .do_action(Action::new("stats", ""))
        .await
        .expect("stats")
        .try_collect()
        .await
        .expect("stats body");
    serde_json::from_slice(&body[0]).expect("stats json")
}

/// Reads every endpoint in order; returns (rows, seconds).
async fn read_all(c: &mut FlightClient, info: &FlightInfo) -> (usize, f64) {
    let t0 = Instant::now();
    let mut rows = 0;
    for e in &info.endpoint {
        let ticket = e.ticket.clone().expect("ticket");
        let mut s = c.do_get(ticket).await.expect("do_get");
        while let Some(b) = s.try_next().await.expect("batch") {
            rows += b.num_rows();
        }
    }
    (rows, t0.elapsed().as_secs_f64())
}

/// The request of a run reading `k` partitions ahead; `max_message_bytes` left to the
/// server's default (2 MiB) when `None`.
fn request(k: usize, max_message_bytes: Option<usize>) -> String {
    let mut r = serde_json::json!({
        "dataset": "flight",
        "partition_rows": PARTITION_ROWS,
        "prefetch_partitions": k,
    });
    if let Some(b) = max_message_bytes {
        r["max_message_bytes"] = b.into();
    }
    r.to_string()
}

/// One epoch from the server to the Rust client, `k` partitions ahead
/// (`ready_first`: the clock starts once all are held); (seconds, peak RSS,
/// RSS at the start).
async fn rust_epoch(
    c: &mut FlightClient,
    k: usize,
    partitions: usize,
    rows: usize,
    ready_first: bool,
) -> (f64, u64, u64) {
    let start_rss = vm_rss();
    let sampler = RssSampler::start();
    let info = c
        .get_flight_info(FlightDescriptor::new_cmd(request(k, None)))
        .await
        .expect("flight info");
    if ready_first {
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            let s = stats(c).await;
            if s.buffered_partitions == partitions {
                break;
            }
            assert!(Instant::now() < deadline, "read-ahead stuck: {s:?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let (got, seconds) = read_all(c, &info).await;
    assert_eq!(got, rows, "every row served");
    (seconds, sampler.finish(), start_rss)
}

fn python() -> PathBuf {
    std::env::var_os("UDFCHAIN_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME")
                .map(PathBuf::from)
                .unwrap_or_default();
            home.join(".cache/udfchain-venv/bin/python")
        })
}

/// Runs `flight.py` with `args` (one warm-up round and `rounds` timed ones);
/// the best time of the timed rounds, or why there is none.
fn python_best(args: &[String], rounds: usize, rows: usize) -> Result<f64, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/loader/flight.py");
    let py = python();
    let mut cmd = Command::new(&py);
    // numpy's OpenBLAS threads spin in every pyarrow process that imports it
    // (~20% of a client's samples here), the reference's as much as ours: one
    // thread unless the caller chose, so both sides measure Flight, not BLAS.
    if std::env::var_os("OPENBLAS_NUM_THREADS").is_none() {
        cmd.env("OPENBLAS_NUM_THREADS", "1");
    }
    let out = cmd
        .arg(&script)
        .args(args)
        .args(["--rounds", &(rounds + 1).to_string()])
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| {
            format!(
                "cannot run {}: {e} (set UDFCHAIN_PYTHON to a python with pyarrow)",
                py.display()
            )
        })?;
    let mut times = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("{line:?} from flight.py: {e}"))?;
        if let Some(e) = v.get("error") {
            return Err(format!("flight.py {}: {e}", args[0]));
        }
        let got = v["rows"].as_u64().unwrap_or(0) as usize;
        if got != rows {
            return Err(format!("flight.py {} read {got} rows of {rows}", args[0]));
        }
        times.push(v["seconds"].as_f64().unwrap_or(f64::MAX));
    }
    if !out.status.success() || times.len() != rounds + 1 {
        return Err(format!(
            "flight.py {} ({}) exited with {} after {} rounds",
            args[0],
            py.display(),
            out.status,
            times.len()
        ));
    }
    Ok(times[1..].iter().copied().fold(f64::MAX, f64::min))
}

/// The same partitions as Arrow IPC in memory, and the time to decode them;
/// each partition's batches also go to `dir/part-NNNNN.arrows` (the
/// reference server's input).
async fn ipc_from_memory(session: &Arc<Session>, dir: &Path) -> (u64, f64) {
    let loader = Loader::from_dataset("flight")
        .in_session(Arc::clone(session))
        .partition_rows(PARTITION_ROWS);
    let plan = loader.plan(0).await.expect("plan");
    std::fs::create_dir_all(dir).expect("reference dir");
    let mut buf = Vec::new();
    let mut bytes = 0u64;
    {
        let mut w = StreamWriter::try_new(&mut buf, &plan.schema).expect("ipc writer");
        for i in 0..plan.partitions.len() {
            let data = loader.fetch(&plan, i).await.expect("fetch");
            bytes += data.bytes as u64;
            let file = std::fs::File::create(dir.join(format!("part-{i:05}.arrows")))
                .expect("partition file");
            let mut part = StreamWriter::try_new(std::io::BufWriter::new(file), &plan.schema)
                .expect("partition writer");
            for b in &data.batches {
                w.write(b).expect("ipc write");
                part.write(b).expect("partition write");
            }
            part.finish().expect("partition finish");
        }
        w.finish().expect("ipc finish");
    }
    // Best of 3 (the first also warms the allocator).
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t0 = Instant::now();
        let mut rows = 0;
        for b in StreamReader::try_new(std::io::Cursor::new(&buf[..]), None).expect("ipc reader") {
            rows += b.expect("ipc batch").num_rows();
        }
        assert!(rows > 0);
        best = best.min(t0.elapsed().as_secs_f64());
    }
    (bytes, best)
}

/// Every Flight run (see the header); ratios to the reference filled in.
pub async fn runs(quick: bool) -> Vec<Record> {
    let rows: usize = if quick { 32 * 1024 } else { 128 * 1024 };
    let rounds = if quick { 1 } else { ROUNDS };
    let root = tempfile::tempdir().expect("root");
    let session = Session::with_settings(Settings::new().root(root.path()));
    let data: Vec<Row> = (0..rows as i64)
        .map(|id| Row {
            id,
            payload: format!(
                "{:0>width$}",
                id.wrapping_mul(2_654_435_761),
                width = ROW_BYTES
            ),
        })
        .collect();
    Chain::from_values_in(Arc::clone(&session), &data)
        .save("flight")
        .await
        .expect("save the flight dataset");
    drop(data);
    let parts_dir = root.path().join("reference");
    let (bytes, ipc_s) = ipc_from_memory(&session, &parts_dir).await;
    let ipc_mb_per_s = bytes as f64 / 1e6 / ipc_s;
    let partitions = rows.div_ceil(PARTITION_ROWS);
    let base = Record {
        kind: "flight",
        quick,
        parallel_requests: Some(1),
        partition_bytes: Some(bytes / partitions as u64),
        partitions: Some(partitions),
        rows: Some(rows),
        ipc_mb_per_s: Some(ipc_mb_per_s),
        ..Record::default()
    };
    let timed = |peer: &'static str, k: usize, rounds: usize, seconds: f64| {
        let mb_per_s = bytes as f64 / 1e6 / seconds;
        Record {
            peer: Some(peer),
            prefetch_partitions: Some(k),
            rounds: Some(rounds),
            seconds,
            mb_per_s: Some(mb_per_s),
            // The bound: decoding the same bytes of IPC from memory.
            bound_seconds: Some(bytes as f64 / 1e6 / ipc_mb_per_s),
            ratio_to_bound: Some(mb_per_s / ipc_mb_per_s),
            load_average: load_average(),
            ..base.clone()
        }
    };
    let failed = |peer: &'static str, error: String| {
        eprintln!("  {peer}: {error}");
        Record {
            peer: Some(peer),
            prefetch_partitions: Some(partitions),
            error: Some(error),
            load_average: load_average(),
            ..base.clone()
        }
    };

    let bound = FlightServer::new(Arc::clone(&session))
        .bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = bound.local_addr();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(bound.run_until(async move {
        let _ = stopped.await;
    }));
    let mut c = client(addr).await;
    let mut records = Vec::new();
    // Warm-up (connections, allocator), then the default read-ahead, then
    // the transport alone.
    let _ = rust_epoch(&mut c, partitions, partitions, rows, true).await;
    let (seconds, peak, start) = rust_epoch(&mut c, 2, partitions, rows, false).await;
    records.push(Record {
        peak_rss_bytes: peak,
        start_rss_bytes: start,
        ..timed("udfchain->rust", 2, 1, seconds)
    });
    let mut best = (f64::MAX, 0, 0);
    for _ in 0..rounds {
        let run = rust_epoch(&mut c, partitions, partitions, rows, true).await;
        if run.0 < best.0 {
            best = run;
        }
    }
    records.push(Record {
        peak_rss_bytes: best.1,
        start_rss_bytes: best.2,
        target_ratio: Some(RUST_TARGET),
        ..timed("udfchain->rust", partitions, rounds, best.0)
    });
    drop(c);
    // pyarrow's client with the server's default messages (16 MiB for its
    // user agent: a partition whole), and asking for 2 MiB messages (the
    // default of every other client) to show what they cost it.
    for (peer, max_message_bytes, target) in [
        ("udfchain->pyarrow", None, Some(PYARROW_TARGET)),
        (
            "udfchain->pyarrow",
            Some(udfchain::serve::FLIGHT_DATA_SIZE),
            None,
        ),
    ] {
        let args = [
            "client".to_string(),
            format!("grpc://{addr}"),
            request(partitions, max_message_bytes),
            partitions.to_string(),
        ];
        let py_client = tokio::task::spawn_blocking(move || python_best(&args, rounds, rows))
            .await
            .expect("flight.py client");
        records.push(match py_client {
            Ok(seconds) => Record {
                target_ratio: target,
                max_message_bytes,
                ..timed(peer, partitions, rounds, seconds)
            },
            Err(e) => failed(peer, e),
        });
    }
    let _ = stop.send(());
    let _ = server.await;
    let args = [
        "reference".to_string(),
        parts_dir.to_string_lossy().into_owned(),
    ];
    let reference = tokio::task::spawn_blocking(move || python_best(&args, rounds, rows))
        .await
        .expect("flight.py reference");
    let reference_mb_per_s = reference.as_ref().ok().map(|s| bytes as f64 / 1e6 / s);
    records.push(match reference {
        Ok(seconds) => timed("pyarrow->pyarrow", partitions, rounds, seconds),
        Err(e) => failed("pyarrow->pyarrow", e),
    });
    for r in &mut records {
        r.ratio_to_reference = r.mb_per_s.zip(reference_mb_per_s).map(|(m, r)| m / r);
    }
    records
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".to_string(), |v| format!("{v:.digits$}"))
}

/// The flight runs as an aligned table.
pub fn table(records: &[Record]) -> String {
    let mut s = format!(
        "{:<18} {:>4} {:>8} {:>6} {:>8} {:>7} {:>7} {:>9} {:>11} {:>7}\n",
        "server->client",
        "k",
        "msg MiB",
        "rounds",
        "seconds",
        "MB",
        "MB/s",
        "IPC MB/s",
        "vs pyarrow",
        "target"
    );
    for r in records.iter().filter(|r| r.kind == "flight") {
        let mb = r.partition_bytes.unwrap_or(0) as f64 * r.partitions.unwrap_or(0) as f64 / 1e6;
        if let Some(e) = &r.error {
            s.push_str(&format!("{:<18} error: {e}\n", r.peer.unwrap_or("-")));
            continue;
        }
        let message = match (r.peer, r.max_message_bytes) {
            (Some("pyarrow->pyarrow"), _) => "whole".to_string(),
            (_, Some(b)) => (b >> 20).to_string(),
            (Some("udfchain->pyarrow"), None) => format!(
                "{}*",
                udfchain::serve::FLIGHT_DATA_SIZE_UNLIMITED_CLIENT >> 20
            ),
            (_, None) => format!("{}*", udfchain::serve::FLIGHT_DATA_SIZE >> 20),
        };
        s.push_str(&format!(
            "{:<18} {:>4} {:>8} {:>6} {:>8.3} {:>7.1} {:>7.0} {:>9.0} {:>11} {:>7}\n",
            r.peer.unwrap_or("-"),
            r.prefetch_partitions.unwrap_or(0),
            message,
            r.rounds.unwrap_or(0),
            r.seconds,
            mb,
            r.mb_per_s.unwrap_or(0.0),
            r.ipc_mb_per_s.unwrap_or(0.0),
            opt(r.ratio_to_reference, 2),
            opt(r.target_ratio, 2),
        ));
    }
    s
}

/// The targets, met or not, one line each.
pub fn targets(records: &[Record]) -> String {
    let mut s = String::new();
    for r in records.iter().filter(|r| r.kind == "flight") {
        let Some(target) = r.target_ratio else {
            continue;
        };
        let line = match r.ratio_to_reference {
            Some(ratio) => format!(
                "  {} (every partition ahead): {ratio:.2} of pyarrow->pyarrow, target {target:.1}: {}\n",
                r.peer.unwrap_or("-"),
                if ratio >= target { "met" } else { "NOT met" }
            ),
            None => format!(
                "  {}: no ratio (the reference or this run failed), target {target:.1}\n",
                r.peer.unwrap_or("-")
            ),
        };
        s.push_str(&line);
    }
    s
}
