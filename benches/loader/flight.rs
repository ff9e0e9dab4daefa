//! The Flight half of the loader benchmark: `udfchain serve`'s throughput from
//! an in-process server to a local Rust `FlightClient` over loopback, next to
//! reading the same Arrow IPC stream from memory (the same batches, the same
//! bytes: the partitions' Arrow memory as the server holds them).
//!
//! Two runs, `kind = "flight"`: with every partition read ahead before the
//! clock starts (`prefetch_partitions` = all: the transport alone), and with
//! the server's default read-ahead of 2 (Parquet decoding overlapped with
//! sending). `mb_per_s` = Arrow bytes / wall time of all `do_get`s;
//! `ipc_mb_per_s` = the same bytes / time to decode the IPC stream from a
//! `Vec<u8>`; `bound_seconds` is that decoding time for the run's bytes, so
//! `ratio_to_bound` = flight MB/s / IPC MB/s. Target (reported, not
//! asserted): >= 1 GB/s.

use std::net::SocketAddr;
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

use crate::record::{Record, RssSampler, vm_rss};

const ROW_BYTES: usize = 2048;
const PARTITION_ROWS: usize = 4096;

#[derive(serde::Serialize, serde::Deserialize)]
struct Row {
    id: i64,
    payload: String,
}

async fn client(addr: SocketAddr) -> FlightClient {
    // Windows larger than hyper's defaults (2 MiB stream, 5 MiB connection),
    // as a bulk reader sets them: the server never waits for window updates.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .initial_stream_window_size(Some(32 << 20))
        .initial_connection_window_size(Some(64 << 20))
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

/// The same partitions as Arrow IPC in memory, and the time to decode them.
async fn ipc_from_memory(session: &Arc<Session>) -> (u64, f64) {
    let loader = Loader::from_dataset("flight")
        .in_session(Arc::clone(session))
        .partition_rows(PARTITION_ROWS);
    let plan = loader.plan(0).await.expect("plan");
    let mut buf = Vec::new();
    let mut bytes = 0u64;
    {
        let mut w = StreamWriter::try_new(&mut buf, &plan.schema).expect("ipc writer");
        for i in 0..plan.partitions.len() {
            let data = loader.fetch(&plan, i).await.expect("fetch");
            bytes += data.bytes as u64;
            for b in &data.batches {
                w.write(b).expect("ipc write");
            }
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

/// The flight runs: all partitions ahead, then the default read-ahead of 2.
pub async fn runs(quick: bool) -> Vec<Record> {
    let rows: usize = if quick { 32 * 1024 } else { 128 * 1024 };
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
    let (ipc_bytes, ipc_s) = ipc_from_memory(&session).await;
    let ipc_mb_per_s = ipc_bytes as f64 / 1e6 / ipc_s;

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
    let partitions = rows.div_ceil(PARTITION_ROWS);
    let mut records = Vec::new();
    for (k, ready_first) in [(partitions, true), (2, false), (partitions, true)] {
        let req = serde_json::json!({
            "dataset": "flight",
            "partition_rows": PARTITION_ROWS,
            "prefetch_partitions": k,
        });
        let start_rss = vm_rss();
        let sampler = RssSampler::start();
        let info = c
            .get_flight_info(FlightDescriptor::new_cmd(req.to_string()))
            .await
            .expect("flight info");
        let mut bytes = ipc_bytes;
        if ready_first {
            let deadline = Instant::now() + Duration::from_secs(300);
            loop {
                let s = stats(&mut c).await;
                if s.buffered_partitions == partitions {
                    bytes = s.buffered_bytes as u64;
                    break;
                }
                assert!(Instant::now() < deadline, "read-ahead stuck: {s:?}");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        let (got, seconds) = read_all(&mut c, &info).await;
        assert_eq!(got, rows, "every row served");
        let mb_per_s = bytes as f64 / 1e6 / seconds;
        records.push(Record {
            kind: "flight",
            quick,
            prefetch_partitions: Some(k),
            parallel_requests: Some(1),
            seconds,
            peak_rss_bytes: sampler.finish(),
            start_rss_bytes: start_rss,
            partition_bytes: Some(bytes / partitions as u64),
            partitions: Some(partitions),
            rows: Some(rows),
            mb_per_s: Some(mb_per_s),
            ipc_mb_per_s: Some(ipc_mb_per_s),
            // The bound: decoding the same bytes of IPC from memory.
            bound_seconds: Some(bytes as f64 / 1e6 / ipc_mb_per_s),
            ratio_to_bound: Some(mb_per_s / ipc_mb_per_s),
            ..Record::default()
        });
    }
    // The first all-ahead run warmed connections and allocator: keep the second.
    records.remove(0);
    let _ = stop.send(());
    let _ = server.await;
    records
}

/// The flight runs as an aligned table.
pub fn table(records: &[Record]) -> String {
    let mut s = format!(
        "{:>5} {:>8} {:>9} {:>10} {:>10} {:>7}\n",
        "k", "seconds", "MB", "flight MB/s", "IPC MB/s", "ratio"
    );
    for r in records.iter().filter(|r| r.kind == "flight") {
        let mb = r.partition_bytes.unwrap_or(0) as f64 * r.partitions.unwrap_or(0) as f64 / 1e6;
        s.push_str(&format!(
            "{:>5} {:>8.3} {:>9.1} {:>10.0} {:>10.0} {:>7.2}\n",
            r.prefetch_partitions.unwrap_or(0),
            r.seconds,
            mb,
            r.mb_per_s.unwrap_or(0.0),
            r.ipc_mb_per_s.unwrap_or(0.0),
            r.ratio_to_bound.unwrap_or(0.0),
        ));
    }
    s
}
