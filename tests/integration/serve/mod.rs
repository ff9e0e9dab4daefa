//! `udfchain serve`: the Arrow Flight server in front of the loader, driven by
//! arrow-flight's `FlightClient` (and pyarrow) over loopback. Endpoints cover
//! every row once, in dataset order unshuffled, split across ranks and workers;
//! a large partition arrives in messages within the message size, in row order;
//! shuffle follows (seed, epoch); bad requests are Flight statuses with clear
//! messages; a slow client does not stall another; a dropped or SIGKILLed
//! client frees the read-ahead (stats action and the session's memory pool);
//! the CLI server prints its port and exits 0 on SIGTERM; the Python client
//! reads exactly the dataset's rows; `with_bytes` serves files' bytes from the
//! loopback S3 server, each file fetched once.
//!
//! One file per behaviour (below); the helpers they share are here.

use std::io::BufRead;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_flight::error::FlightError;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{Action, FlightClient, FlightDescriptor, FlightInfo, Ticket};
use datafusion::arrow::array::{Array, Int64Array, RecordBatch};
use futures::TryStreamExt;
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use udfchain::serve::{FlightServer, ReadAheadStats};
use udfchain::{Chain, Session, Settings};

mod bad_requests;
mod cli_and_python;
mod endpoints;
mod memory_limit;
mod read_ahead;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Row {
    id: i64,
    text: String,
}

/// A session over a fresh root holding dataset `items` of `n` rows
/// (`id` 0..n, `text` of `width` bytes).
async fn items(n: i64, width: usize) -> (tempfile::TempDir, Arc<Session>) {
    let root = tempfile::tempdir().expect("root");
    let session = Session::with_settings(Settings::new().root(root.path()));
    let rows: Vec<Row> = (0..n)
        .map(|id| Row {
            id,
            text: format!("{id:0width$}"),
        })
        .collect();
    Chain::from_values_in(Arc::clone(&session), &rows)
        .save("items")
        .await
        .expect("save items");
    (root, session)
}

/// Dataset `pictures` of five 40x30 PNGs (`0.png`..`4.png`, a `name`
/// column with the path): the images' dir, the root, the session and each
/// file's bytes by number.
async fn pictures() -> (
    tempfile::TempDir,
    tempfile::TempDir,
    Arc<Session>,
    Vec<Vec<u8>>,
) {
    use udfchain::File;
    use udfchain::udfs::builtins::image::{Format, Image, Mode, encode};
    let dir = tempfile::tempdir().expect("dir");
    let mut written = Vec::new();
    for i in 0..5u32 {
        let data: Vec<u8> = (0..40 * 30)
            .flat_map(|p| {
                [
                    (p % 40 * 6 + i) as u8,
                    (p / 40 * 8) as u8,
                    (p * 7 % 256) as u8,
                ]
            })
            .collect();
        let png = encode(
            Image::new(40, 30, Mode::Rgb, data).expect("image").view(),
            Format::Png,
            None,
        )
        .expect("png");
        std::fs::write(dir.path().join(format!("{i}.png")), &png).expect("write");
        written.push(png);
    }
    let root = tempfile::tempdir().expect("root");
    let session = Session::with_settings(Settings::new().root(root.path()));
    session
        .from_storage(&dir.path().display().to_string())
        .map("name", |f: File| async move {
            Ok::<String, std::io::Error>(f.path)
        })
        .save("pictures")
        .await
        .expect("save");
    (dir, root, session, written)
}

struct Running {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<udfchain::Result<()>>,
}

impl Running {
    async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let r = tokio::time::timeout(Duration::from_secs(30), &mut self.task)
            .await
            .expect("server stops");
        r.expect("join").expect("server ran");
    }
}

async fn start(server: FlightServer) -> Running {
    let bound = server.bind("127.0.0.1:0").await.expect("bind");
    let addr = bound.local_addr();
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(bound.run_until(async move {
        let _ = rx.await;
    }));
    Running {
        addr,
        stop: Some(tx),
        task,
    }
}

async fn client(addr: SocketAddr) -> FlightClient {
    connect(addr, None).await
}

async fn connect(addr: SocketAddr, window: Option<u32>) -> FlightClient {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .initial_stream_window_size(window)
        .initial_connection_window_size(window)
        .connect()
        .await
        .expect("connect");
    FlightClient::new_from_inner(
        FlightServiceClient::new(channel).max_decoding_message_size(64 * 1024 * 1024),
    )
}

async fn info(c: &mut FlightClient, json: &str) -> Result<FlightInfo, FlightError> {
    c.get_flight_info(FlightDescriptor::new_cmd(json.to_string()))
        .await
}

fn ticket(info: &FlightInfo, i: usize) -> Ticket {
    info.endpoint[i].ticket.clone().expect("ticket")
}

async fn partition(c: &mut FlightClient, t: Ticket) -> Result<Vec<RecordBatch>, FlightError> {
    c.do_get(t).await?.try_collect().await
}

fn ids(batches: &[RecordBatch]) -> Vec<i64> {
    batches
        .iter()
        .flat_map(|b| {
            let col = b
                .column_by_name("id")
                .expect("id column")
                .as_any()
                .downcast_ref::<Int64Array>()
                .expect("int64 ids")
                .clone();
            (0..col.len()).map(move |i| col.value(i))
        })
        .collect()
}

/// Every endpoint of `json`'s flight, in order: the ids read.
async fn read_epoch(c: &mut FlightClient, json: &str) -> Vec<i64> {
    let fi = info(c, json).await.expect("flight info");
    let mut out = Vec::new();
    for i in 0..fi.endpoint.len() {
        out.extend(ids(&partition(c, ticket(&fi, i)).await.expect("do_get")));
    }
    out
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

/// Polls the stats until `ok` holds (a deadlock detector, not a timing claim).
async fn stats_until(
    c: &mut FlightClient,
    what: &str,
    ok: impl Fn(&ReadAheadStats) -> bool,
) -> ReadAheadStats {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = stats(c).await;
        if ok(&s) {
            return s;
        }
        assert!(Instant::now() < deadline, "{what}: stats stuck at {s:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn status_of(e: FlightError) -> tonic::Status {
    match e {
        FlightError::Tonic(s) => *s,
        other => panic!("expected a Flight status, got {other}"),
    }
}

/// Starts `udfchain --root ROOT serve --addr 127.0.0.1:0`; returns the child
/// and the address it printed.
fn spawn_cli(root: &std::path::Path) -> (std::process::Child, SocketAddr) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_udfchain"))
        .arg("--root")
        .arg(root)
        .args(["serve", "--addr", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn udfchain serve");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read the address line");
    let addr = line
        .trim()
        .strip_prefix("listening on grpc://")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .parse()
        .expect("socket address");
    (child, addr)
}
