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

use std::collections::BTreeSet;
use std::io::BufRead;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_flight::decode::FlightRecordBatchStream;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{
    Action, Criteria, FlightClient, FlightData, FlightDescriptor, FlightInfo, Ticket,
};
use datafusion::arrow::array::{Array, AsArray, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::DataType;
use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use udfchain::serve::{FLIGHT_DATA_SIZE, FlightServer, ReadAheadStats};
use udfchain::{Chain, File, Session, Settings};

use udfchain_testkit::{S3Server, content, write_files};

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

/// A client whose HTTP/2 windows are 64 KiB: when it stops reading, the server
/// is stuck mid-partition (with the default 2 MiB windows a partition of a few
/// MiB would sit whole in the buffers).
async fn small_window_client(addr: SocketAddr) -> FlightClient {
    connect(addr, Some(65_535)).await
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_cover_every_row_once_in_dataset_order() {
    let (_root, session) = items(1000, 8).await;
    let server = start(FlightServer::new(session).prefetch_partitions(2)).await;
    let mut c = client(server.addr).await;

    let fi = info(&mut c, r#"{"dataset": "items", "partition_rows": 64}"#)
        .await
        .expect("info");
    assert_eq!(fi.endpoint.len(), 16, "ceil(1000 / 64) partitions");
    assert_eq!(fi.total_records, 1000);
    assert!(fi.ordered);
    let schema = fi.clone().try_decode_schema().expect("schema");
    assert_eq!(schema.fields().len(), 2, "{schema:?}");

    // Unshuffled: dataset order across partition boundaries (64 does not divide 1000).
    let mut got = Vec::new();
    for i in 0..fi.endpoint.len() {
        let batches = partition(&mut c, ticket(&fi, i)).await.expect("do_get");
        let part = ids(&batches);
        assert!(part.len() <= 64);
        got.extend(part);
    }
    assert_eq!(got, (0..1000).collect::<Vec<i64>>());

    // A column subset.
    let fi = info(
        &mut c,
        r#"{"dataset": "items", "columns": ["id"], "version": 1}"#,
    )
    .await
    .expect("info");
    let batches = partition(&mut c, ticket(&fi, 0)).await.expect("do_get");
    assert_eq!(batches[0].schema().fields().len(), 1);
    assert_eq!(ids(&batches), (0..1000).collect::<Vec<i64>>());

    // The read-ahead served the trainer: some partitions were ready when asked for.
    let s = stats(&mut c).await;
    assert_eq!(s.partitions_served, 17, "{s:?}");
    assert_eq!(s.streams, 0, "read-to-the-end streams are closed: {s:?}");
    server.stop().await;
}

/// Every message of partition 0 of `json`, read by a raw client with tonic's
/// receive limit raised to `limit` (`None`: its default 4 MiB).
async fn raw_messages(addr: SocketAddr, json: &str, limit: Option<usize>) -> Vec<FlightData> {
    let mut c = client(addr).await;
    let fi = info(&mut c, json).await.expect("info");
    assert_eq!(fi.endpoint.len(), 1);
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let mut raw = FlightServiceClient::new(channel);
    if let Some(limit) = limit {
        raw = raw.max_decoding_message_size(limit);
    }
    raw.do_get(ticket(&fi, 0))
        .await
        .expect("do_get")
        .into_inner()
        .try_collect()
        .await
        .expect("every message")
}

/// A partition of ~6 MiB: more than one Flight message, each within the
/// message size (a default gRPC client, 4 MiB receive limit, reads it), the
/// rows in order with their content.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_partition_arrives_in_bounded_messages_in_row_order() {
    let (n, width) = (768, 8192);
    let (_root, session) = items(n, width).await;
    let server = start(FlightServer::new(session)).await;
    let json = |extra: &str| format!(r#"{{"dataset": "items", "partition_rows": {n}{extra}}}"#);
    // The default fits tonic's default limit; a request's max_message_bytes
    // bounds the messages instead (the IPC body pads each of its 3 buffers to
    // 64 bytes); a client that accepts more gets the ~6 MB batch whole.
    for (extra, limit, bound, count) in [
        ("", None, FLIGHT_DATA_SIZE, 3..=usize::MAX),
        (
            r#", "max_message_bytes": 1048576"#,
            None,
            1 << 20,
            7..=usize::MAX,
        ),
        (
            r#", "max_message_bytes": 16777216"#,
            Some(32 << 20),
            16 << 20,
            2..=2,
        ),
    ] {
        let messages = raw_messages(server.addr, &json(extra), limit).await;
        let bodies: Vec<usize> = messages.iter().map(|m| m.data_body.len()).collect();
        assert!(
            count.contains(&bodies.len()),
            "{extra}: a schema and the batch: {bodies:?}"
        );
        assert!(
            bodies.iter().all(|&b| b <= bound + 3 * 64),
            "{extra}: {bodies:?}"
        );
        let batches: Vec<RecordBatch> = FlightRecordBatchStream::new_from_flight_data(
            futures::stream::iter(messages.into_iter().map(Ok)),
        )
        .try_collect()
        .await
        .expect("decode");
        assert_eq!(ids(&batches), (0..n).collect::<Vec<i64>>());
        let texts: Vec<String> = batches
            .iter()
            .flat_map(|b| {
                let col = b.column_by_name("text").expect("text column");
                let col = datafusion::arrow::compute::cast(col, &DataType::Utf8).expect("as utf8");
                let col = col.as_string::<i32>().clone();
                (0..col.len()).map(move |i| col.value(i).to_string())
            })
            .collect();
        let want: Vec<String> = (0..n).map(|id| format!("{id:0width$}")).collect();
        assert!(texts == want, "{extra}: every row's text, in order");
    }
    let mut c = client(server.addr).await;
    stats_until(&mut c, "the partitions are let go once sent", |s| {
        s.streams == 0 && s.buffered_bytes == 0
    })
    .await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranks_and_workers_split_every_row_once() {
    let (_root, session) = items(500, 4).await;
    let server = start(FlightServer::new(session)).await;
    let mut c = client(server.addr).await;
    for (world, workers) in [(1, 0), (2, 1), (3, 2), (2, 4)] {
        for shuffle in ["", r#", "shuffle": true, "seed": 3"#] {
            let mut all = Vec::new();
            for rank in 0..world {
                for worker in 0..workers.max(1) {
                    let json = format!(
                        r#"{{"dataset": "items", "partition_rows": 37, "rank": {rank}, "world_size": {world},
                            "worker": {worker}, "num_workers": {workers}{shuffle}}}"#
                    );
                    all.extend(read_epoch(&mut c, &json).await);
                }
            }
            let n = all.len();
            let unique: BTreeSet<i64> = all.into_iter().collect();
            assert_eq!(n, 500, "world {world} x workers {workers} {shuffle}");
            assert_eq!(
                unique,
                (0..500).collect(),
                "world {world} x workers {workers}"
            );
        }
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shuffle_follows_seed_and_epoch() {
    let (_root, session) = items(400, 4).await;
    let server = start(FlightServer::new(session)).await;
    let mut c = client(server.addr).await;
    let req = |seed: u64, epoch: u64| {
        format!(
            r#"{{"dataset": "items", "partition_rows": 50, "shuffle": true, "seed": {seed}, "epoch": {epoch}}}"#
        )
    };
    let e0 = read_epoch(&mut c, &req(7, 0)).await;
    let again = read_epoch(&mut c, &req(7, 0)).await;
    let e1 = read_epoch(&mut c, &req(7, 1)).await;
    let other_seed = read_epoch(&mut c, &req(8, 0)).await;
    assert_eq!(e0, again, "same (seed, epoch), same order");
    assert_ne!(e0, e1, "a new order each epoch");
    assert_ne!(e0, other_seed, "a new order for another seed");
    assert_ne!(e0, (0..400).collect::<Vec<i64>>(), "shuffled");
    for order in [&e0, &e1, &other_seed] {
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..400).collect::<Vec<i64>>());
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_flight_statuses_with_clear_messages() {
    let (_root, session) = items(10, 4).await;
    let server = start(FlightServer::new(session)).await;
    let mut c = client(server.addr).await;
    let cases: &[(&str, tonic::Code, &str)] = &[
        (
            r#"{"dataset": "items", "shufle": true}"#,
            tonic::Code::InvalidArgument,
            "unknown field `shufle`",
        ),
        (
            r#"{"dataset": "items", "rank": 2, "world_size": 2}"#,
            tonic::Code::InvalidArgument,
            "rank must be < world_size (2), got 2",
        ),
        (
            r#"{"dataset": "items", "partition_rows": 0}"#,
            tonic::Code::InvalidArgument,
            "partition_rows must be in 1..=",
        ),
        (
            r#"{"dataset": "itens"}"#,
            tonic::Code::NotFound,
            "no dataset \"itens\" (did you mean \"items\"?)",
        ),
        (
            r#"{"dataset": "items", "version": 9}"#,
            tonic::Code::NotFound,
            "has no version 9",
        ),
        (
            r#"{"dataset": "items", "columns": ["nope"]}"#,
            tonic::Code::InvalidArgument,
            "\"nope\"",
        ),
        (
            "{dataset: items",
            tonic::Code::InvalidArgument,
            "JSON request",
        ),
        (
            r#"{"dataset": "items", "max_message_bytes": 100}"#,
            tonic::Code::InvalidArgument,
            "max_message_bytes must be in 1024..=67108864, got 100",
        ),
    ];
    for (json, code, needle) in cases {
        let s = status_of(info(&mut c, json).await.expect_err(json));
        assert_eq!(s.code(), *code, "{json}: {s:?}");
        assert!(s.message().contains(needle), "{json}: {:?}", s.message());
    }
    let s = status_of(
        c.get_flight_info(FlightDescriptor::new_path(vec!["items".into()]))
            .await
            .expect_err("path descriptor"),
    );
    assert_eq!(s.code(), tonic::Code::InvalidArgument);
    assert!(
        s.message().contains("command descriptor"),
        "{}",
        s.message()
    );
    let s = status_of(
        partition(&mut c, Ticket::new("garbage"))
            .await
            .expect_err("bad ticket"),
    );
    assert_eq!(s.code(), tonic::Code::InvalidArgument);
    assert!(
        s.message().contains("tickets come from get_flight_info"),
        "{}",
        s.message()
    );
    // DoGet reads its request itself (serve/routes.rs): a request over the
    // limit is refused once the limit is read, not buffered whole.
    let huge = Ticket::new(vec![b'x'; udfchain::serve::MAX_REQUEST_MESSAGE + 1]);
    let s = status_of(partition(&mut c, huge).await.expect_err("huge ticket"));
    assert_eq!(s.code(), tonic::Code::ResourceExhausted, "{s:?}");
    assert!(
        s.message().contains("DoGet request over"),
        "{}",
        s.message()
    );
    // The connection still serves the next request.
    let info = info(&mut c, r#"{"dataset": "items"}"#).await.expect("info");
    assert!(
        !partition(&mut c, ticket(&info, 0))
            .await
            .expect("rows")
            .is_empty()
    );
    let s = status_of(
        c.do_action(Action::new("reboot", ""))
            .await
            .err()
            .expect("unknown action"),
    );
    assert_eq!(s.code(), tonic::Code::InvalidArgument);
    assert!(s.message().contains("\"stats\""), "{}", s.message());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_flights_lists_datasets_with_schema_and_rows() {
    let (_root, session) = items(12, 4).await;
    Chain::from_values_in(
        Arc::clone(&session),
        &[Row {
            id: 1,
            text: "x".into(),
        }],
    )
    .save("other")
    .await
    .expect("save other");
    let server = start(FlightServer::new(session)).await;
    let mut c = client(server.addr).await;
    let infos: Vec<FlightInfo> = c
        .list_flights(Criteria::default().expression)
        .await
        .expect("list")
        .try_collect()
        .await
        .expect("infos");
    let listed: Vec<(String, i64)> = infos
        .iter()
        .map(|i| {
            let cmd: serde_json::Value =
                serde_json::from_slice(&i.flight_descriptor.as_ref().expect("descriptor").cmd)
                    .expect("cmd json");
            (
                cmd["dataset"].as_str().expect("name").to_string(),
                i.total_records,
            )
        })
        .collect();
    assert_eq!(
        listed,
        [("items".to_string(), 12), ("other".to_string(), 1)]
    );
    let schema = infos[0].clone().try_decode_schema().expect("schema");
    assert!(schema.field_with_name("id").is_ok(), "{schema:?}");
    // A listed descriptor is a valid request.
    let fi = c
        .get_flight_info(infos[0].flight_descriptor.clone().expect("descriptor"))
        .await
        .expect("listed descriptor reads");
    assert_eq!(fi.total_records, 12);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_client_does_not_stall_another() {
    // 2 partitions of 250 rows x 32 KiB (8 MiB, 4 Flight messages each); the
    // slow client's 64 KiB windows leave its partition stuck in the server's send.
    let (_root, session) = items(500, 32 * 1024).await;
    let server = start(FlightServer::new(session).prefetch_partitions(1)).await;
    let req = r#"{"dataset": "items", "partition_rows": 250}"#;

    let mut slow = small_window_client(server.addr).await;
    let slow_info = info(&mut slow, req).await.expect("info");
    let mut slow_stream = slow.do_get(ticket(&slow_info, 0)).await.expect("do_get");
    let first = slow_stream
        .next()
        .await
        .expect("a first batch")
        .expect("batch");
    // The slow client now stops reading, its stream open.

    let mut fast = client(server.addr).await;
    let all = tokio::time::timeout(Duration::from_secs(120), read_epoch(&mut fast, req))
        .await
        .expect("the fast client finishes while the slow one holds its stream");
    assert_eq!(all, (0..500).collect::<Vec<i64>>());
    // Meanwhile the slow client's partition 0 was still being sent and its
    // partition 1 read ahead: the fast client went past a stuck stream.
    let s = stats(&mut fast).await;
    assert_eq!((s.streams, s.buffered_partitions), (1, 2), "{s:?}");

    // The slow client resumes and still gets every row.
    let mut slow_ids = ids(&[first]);
    while let Some(b) = slow_stream.next().await {
        slow_ids.extend(ids(&[b.expect("batch")]));
    }
    slow_ids.extend(ids(&partition(&mut slow, ticket(&slow_info, 1))
        .await
        .expect("do_get")));
    assert_eq!(slow_ids, (0..500).collect::<Vec<i64>>());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_stream_frees_the_read_ahead() {
    // Partitions of 250 rows x 32 KiB (8 MiB, 4 Flight messages): a client
    // that stops reading leaves the server mid-partition.
    let (_root, session) = items(1250, 32 * 1024).await;
    let pool = Arc::clone(&session.context().runtime_env().memory_pool);
    let server = start(FlightServer::new(Arc::clone(&session))).await;
    let mut c = client(server.addr).await;
    let fi = info(&mut c, DISCONNECT_REQUEST).await.expect("info");
    assert_eq!(fi.endpoint.len(), 5);
    let s = stats_until(&mut c, "3 partitions read ahead", |s| {
        s.buffered_partitions == 3
    })
    .await;
    assert!(s.buffered_bytes > 3 * 250 * 32 * 1024, "{s:?}");
    assert!(
        pool.reserved() >= s.buffered_bytes,
        "charged to the session's pool"
    );

    let mut reader = small_window_client(server.addr).await;
    let mut stream = reader.do_get(ticket(&fi, 0)).await.expect("do_get");
    stream.next().await.expect("a batch").expect("batch");
    // Partition 0 being sent, 1..=3 read ahead.
    let s = stats_until(&mut c, "partition 3 read ahead", |s| {
        s.buffered_partitions == 4
    })
    .await;
    assert_eq!(s.streams, 1);
    drop(stream); // the client goes away mid-partition
    drop(reader);

    let s = stats_until(&mut c, "read-ahead freed", |s| {
        s.buffered_bytes == 0 && s.streams == 0
    })
    .await;
    assert_eq!(s.streams_closed_on_disconnect, 1, "{s:?}");
    assert_eq!(pool.reserved(), 0, "the pool is released");

    // Its tickets still work: the stream reopens on demand.
    let batches = partition(&mut c, ticket(&fi, 1)).await.expect("reopened");
    assert_eq!(ids(&batches), (250..500).collect::<Vec<i64>>());
    server.stop().await;
}

const DISCONNECT_REQUEST: &str =
    r#"{"dataset": "items", "partition_rows": 250, "prefetch_partitions": 3}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_stream_expires_after_the_ttl() {
    let (_root, session) = items(400, 16).await;
    let pool = Arc::clone(&session.context().runtime_env().memory_pool);
    let server = start(FlightServer::new(session).readahead_ttl(Duration::from_millis(300))).await;
    let mut c = client(server.addr).await;
    let fi = info(&mut c, r#"{"dataset": "items", "partition_rows": 100}"#)
        .await
        .expect("info");
    let first = partition(&mut c, ticket(&fi, 0)).await.expect("do_get");
    assert_eq!(ids(&first), (0..100).collect::<Vec<i64>>());
    // The trainer stops between partitions (no disconnect to see): the TTL frees
    // partitions 1 and 2, read ahead for it.
    let s = stats_until(&mut c, "the idle stream expires", |s| {
        s.streams == 0 && s.buffered_bytes == 0
    })
    .await;
    assert_eq!(s.streams_expired, 1, "{s:?}");
    assert_eq!(pool.reserved(), 0);
    // Coming back later still works.
    let next = partition(&mut c, ticket(&fi, 1))
        .await
        .expect("do_get after expiry");
    assert_eq!(ids(&next), (100..200).collect::<Vec<i64>>());
    server.stop().await;
}

/// The child of `a_killed_client_frees_the_read_ahead`: reads the first
/// message of partition 0 of `UDFCHAIN_TEST_SERVE_ADDR`, says so, and hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "child process of a_killed_client_frees_the_read_ahead"]
async fn killed_client_worker() {
    let addr: SocketAddr = std::env::var("UDFCHAIN_TEST_SERVE_ADDR")
        .expect("addr env")
        .parse()
        .expect("addr");
    let mut c = small_window_client(addr).await;
    let fi = info(&mut c, DISCONNECT_REQUEST).await.expect("info");
    let mut stream = c.do_get(ticket(&fi, 0)).await.expect("do_get");
    stream.next().await.expect("a batch").expect("batch");
    println!("READING");
    tokio::time::sleep(Duration::from_secs(600)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_client_frees_the_read_ahead() {
    let (_root, session) = items(1250, 32 * 1024).await;
    let pool = Arc::clone(&session.context().runtime_env().memory_pool);
    let server = start(FlightServer::new(Arc::clone(&session))).await;
    let mut child = Command::new(std::env::current_exe().expect("exe"))
        .args([
            "--exact",
            "serve::killed_client_worker",
            "--ignored",
            "--nocapture",
        ])
        .env("UDFCHAIN_TEST_SERVE_ADDR", server.addr.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn child client");
    let stdout = child.stdout.take().expect("stdout");
    let said = tokio::task::spawn_blocking(move || {
        std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .any(|l| l.contains("READING"))
    });
    assert!(said.await.expect("join"), "the child reads partition 0");
    let mut c = client(server.addr).await;
    let s = stats_until(&mut c, "read-ahead of the child", |s| {
        s.buffered_partitions == 4
    })
    .await;
    assert_eq!(s.streams, 1);
    assert!(pool.reserved() > 0);

    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
    let s = stats_until(&mut c, "read-ahead freed after the kill", |s| {
        s.buffered_bytes == 0 && s.streams == 0
    })
    .await;
    assert_eq!(s.streams_closed_on_disconnect, 1, "{s:?}");
    // Fetches aborted by the close give their memory back as the runtime
    // drops them, a moment after the stream is gone.
    let deadline = Instant::now() + Duration::from_secs(5);
    while pool.reserved() > 0 {
        assert!(
            Instant::now() < deadline,
            "{} bytes still reserved",
            pool.reserved()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    server.stop().await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_serves_and_exits_zero_on_sigterm() {
    let (root, _session) = items(100, 4).await;
    let (mut child, addr) = spawn_cli(root.path());
    let mut c = client(addr).await;
    let all = read_epoch(&mut c, r#"{"dataset": "items", "partition_rows": 30}"#).await;
    assert_eq!(all, (0..100).collect::<Vec<i64>>());
    // A stream left open must not keep the server from stopping.
    let fi = info(&mut c, r#"{"dataset": "items"}"#).await.expect("info");
    let _open = c.do_get(ticket(&fi, 0)).await.expect("do_get");

    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill -TERM");
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("udfchain serve did not exit after SIGTERM");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "exit status {status:?}");
}

/// A Python with pyarrow: `UDFCHAIN_PYTHON`, the venv `.ci/run` makes, or
/// `python3`; failing those, that venv is made here from `python3` (pyarrow from
/// PyPI). `Err` says why there is none — the test skips only then.
fn python_with_pyarrow() -> Result<String, String> {
    let has_pyarrow = |py: &str| {
        Command::new(py)
            .args(["-c", "import pyarrow.flight"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let venv = std::env::var("HOME")
        .map(|h| format!("{h}/.cache/udfchain-venv"))
        .map_err(|_| "HOME is not set".to_string())?;
    let venv_python = format!("{venv}/bin/python");
    let found = std::env::var("UDFCHAIN_PYTHON")
        .ok()
        .into_iter()
        .chain([venv_python.clone(), "python3".to_string()])
        .find(|py| has_pyarrow(py));
    if let Some(py) = found {
        return Ok(py);
    }
    let run = |program: &str, args: &[&str]| {
        Command::new(program)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !run("python3", &["--version"]) {
        return Err("no python3 on PATH".into());
    }
    let pip = format!("{venv}/bin/pip");
    if !(run("python3", &["-m", "venv", &venv]) && run(&pip, &["install", "-q", "pyarrow"])) {
        return Err(format!(
            "could not make {venv} with pyarrow (python3 -m venv; pip install pyarrow)"
        ));
    }
    if has_pyarrow(&venv_python) {
        Ok(venv_python)
    } else {
        Err(format!("{venv_python} cannot import pyarrow.flight"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_reads_exactly_the_datasets_rows() {
    let python = match python_with_pyarrow() {
        Ok(python) => python,
        Err(why) => {
            println!("SKIPPED python_client_reads_exactly_the_datasets_rows: {why}");
            return;
        }
    };
    let (root, _session) = items(1000, 16).await;
    let (mut child, addr) = spawn_cli(root.path());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/python/loader.py");
    let run = |json: &str| {
        let out = Command::new(&python)
            .args([
                script,
                &format!("grpc://{addr}"),
                json,
                "--prefetch",
                "2",
                "--column",
                "id",
            ])
            .output()
            .expect("run loader.py");
        assert!(
            out.status.success(),
            "loader.py failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let summary: serde_json::Value =
            serde_json::from_slice(&out.stdout).expect("loader.py prints JSON");
        summary
    };
    let s = run(r#"{"dataset": "items", "partition_rows": 64}"#);
    assert_eq!(s["rows"], 1000);
    assert_eq!(s["partitions"], 16);
    assert_eq!(s["checksum"], (0..1000).sum::<i64>());
    let values: Vec<i64> = serde_json::from_value(s["values"].clone()).expect("values");
    assert_eq!(values, (0..1000).collect::<Vec<i64>>(), "dataset order");

    // Two workers of a shuffled epoch: every row once between them.
    let mut both = Vec::new();
    for worker in 0..2 {
        let s = run(&format!(
            r#"{{"dataset": "items", "partition_rows": 64, "shuffle": true, "seed": 1, "worker": {worker}, "num_workers": 2}}"#
        ));
        both.extend(serde_json::from_value::<Vec<i64>>(s["values"].clone()).expect("values"));
    }
    both.sort_unstable();
    assert_eq!(both, (0..1000).collect::<Vec<i64>>());
    let _ = child.kill();
    let _ = child.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_bytes_serves_each_files_bytes_from_s3_once() {
    let s3 = S3Server::start_shaped(Duration::from_millis(5), None);
    let mut names = write_files(&s3.bucket_dir(), 20, |_| 3000);
    names.sort();
    let root = tempfile::tempdir().expect("root");
    let session = Session::with_settings(s3.settings().root(root.path()));
    session
        .from_storage("s3://bucket/")
        .settings(Settings::new().prefetch(0))
        .map("name", |f: File| async move {
            Ok::<String, std::io::Error>(f.path)
        })
        .save("files")
        .await
        .expect("save files");
    let gets_before = s3.object_gets();
    let server = start(FlightServer::new(session)).await;
    let mut c = client(server.addr).await;
    let fi = info(
        &mut c,
        r#"{"dataset": "files", "partition_rows": 6, "columns": ["name"],
            "with_bytes": {"file": "data"}, "prefetch_partitions": 2, "parallel_requests": 2}"#,
    )
    .await
    .expect("info");
    assert_eq!(fi.endpoint.len(), 4);
    let mut seen = Vec::new();
    for i in 0..fi.endpoint.len() {
        for b in partition(&mut c, ticket(&fi, i)).await.expect("do_get") {
            assert_eq!(b.schema().fields().len(), 2, "name, data");
            let name = b
                .column_by_name("name")
                .expect("name")
                .as_string::<i32>()
                .clone();
            let data = b
                .column_by_name("data")
                .expect("data")
                .as_binary::<i32>()
                .clone();
            for r in 0..b.num_rows() {
                let n: usize = name.value(r)[4..8].parse().expect("file number");
                assert_eq!(data.value(r), content(n, 3000), "{}", name.value(r));
                seen.push(name.value(r).to_string());
            }
        }
    }
    seen.sort();
    assert_eq!(seen, names, "every file once");
    assert_eq!(
        s3.object_gets() - gets_before,
        20,
        "each file fetched once: the read-ahead never fetches a partition twice"
    );
    server.stop().await;
}

/// Saves dataset `name` of ids `from..from + n` in `session`'s root.
async fn save_ids(session: &Arc<Session>, name: &str, from: i64, n: i64) {
    let rows: Vec<Row> = (from..from + n)
        .map(|id| Row {
            id,
            text: name.to_string(),
        })
        .collect();
    Chain::from_values_in(Arc::clone(session), &rows)
        .save(name)
        .await
        .expect("save");
}

/// SIGTERMs a `udfchain serve` child and waits for its exit.
async fn sigterm(mut child: std::process::Child) {
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill -TERM");
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("udfchain serve did not exit after SIGTERM");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_of_a_restarted_server_is_refused_not_served_another_streams_rows() {
    // Stream ids restart at 1 in every server process, so a ticket that did not
    // name its server would let client 1's old ticket for `da` partition 0 read
    // `db`'s rows from the restarted server's stream 1.
    let root = tempfile::tempdir().expect("root");
    let session = Session::with_settings(Settings::new().root(root.path()));
    save_ids(&session, "da", 0, 100).await;
    save_ids(&session, "db", 1000, 100).await;
    let (first, addr) = spawn_cli(root.path());
    let mut c1 = client(addr).await;
    let da = info(&mut c1, r#"{"dataset": "da", "partition_rows": 50}"#)
        .await
        .expect("da");
    sigterm(first).await;

    let (second, addr) = spawn_cli(root.path());
    let mut c2 = client(addr).await;
    let db = info(&mut c2, r#"{"dataset": "db", "partition_rows": 50}"#)
        .await
        .expect("db");
    let mut c1 = client(addr).await;
    let s = status_of(
        partition(&mut c1, ticket(&da, 0))
            .await
            .expect_err("a ticket of the stopped server is refused"),
    );
    assert_eq!(s.code(), tonic::Code::FailedPrecondition, "{}", s.message());
    assert!(
        s.message().contains("another udfchain serve process")
            && s.message().contains("call get_flight_info again"),
        "{}",
        s.message()
    );
    // Client 2 reads db whole; client 1 starts over and reads da.
    let got = ids(&partition(&mut c2, ticket(&db, 0)).await.expect("db 0"));
    assert_eq!(got, (1000..1050).collect::<Vec<i64>>());
    let again = read_epoch(&mut c1, r#"{"dataset": "da", "partition_rows": 50}"#).await;
    assert_eq!(again, (0..100).collect::<Vec<i64>>());
    sigterm(second).await;
}

/// `t`'s JSON with `edit` applied, as a ticket.
fn edited(t: &Ticket, edit: impl FnOnce(&mut serde_json::Value)) -> Ticket {
    let mut v: serde_json::Value = serde_json::from_slice(&t.ticket).expect("ticket json");
    edit(&mut v);
    Ticket::new(serde_json::to_vec(&v).expect("bytes"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_altered_or_stale_ticket_never_reads_another_requests_rows() {
    let root = tempfile::tempdir().expect("root");
    let session = Session::with_settings(Settings::new().root(root.path()));
    save_ids(&session, "da", 0, 100).await;
    save_ids(&session, "db", 1000, 100).await;
    let server = start(FlightServer::new(Arc::clone(&session))).await;
    let mut c = client(server.addr).await;
    let da = info(&mut c, r#"{"dataset": "da", "partition_rows": 50}"#)
        .await
        .expect("da");
    let db = info(&mut c, r#"{"dataset": "db", "partition_rows": 50}"#)
        .await
        .expect("db");
    let (ta, tb) = (ticket(&da, 0), ticket(&db, 0));
    let db_ticket: serde_json::Value = serde_json::from_slice(&tb.ticket).expect("db ticket json");
    let (db_stream, db_request) = (db_ticket["stream"].clone(), db_ticket["request"].clone());
    let forged = [
        // da's ticket pointed at db's open stream.
        edited(&ta, |v| v["stream"] = db_stream.clone()),
        // da's ticket rewritten into db's request and stream, da's tag kept.
        edited(&ta, |v| {
            v["stream"] = db_stream.clone();
            v["request"] = db_request.clone();
        }),
        // Another partition than listed, another version than pinned.
        edited(&ta, |v| v["index"] = 1.into()),
        edited(&ta, |v| v["request"]["version"] = 2.into()),
    ];
    for t in forged {
        let s = status_of(partition(&mut c, t).await.expect_err("forged"));
        assert_eq!(s.code(), tonic::Code::InvalidArgument, "{}", s.message());
        assert!(s.message().contains("altered or forged"), "{}", s.message());
    }
    // The real tickets read their own rows.
    let got = ids(&partition(&mut c, tb).await.expect("db 0"));
    assert_eq!(got, (1000..1050).collect::<Vec<i64>>());
    let got = ids(&partition(&mut c, ta.clone()).await.expect("da 0"));
    assert_eq!(got, (0..50).collect::<Vec<i64>>());
    let got = ids(&partition(&mut c, ticket(&da, 1)).await.expect("da 1"));
    assert_eq!(
        got,
        (50..100).collect::<Vec<i64>>(),
        "its stream is closed now"
    );

    // A ticket pins its version: once da v1 is removed and a new da saved, the
    // old ticket (its stream closed) is NotFound, not the new version's rows.
    let catalog = udfchain::Catalog::open(root.path()).expect("catalog");
    catalog.remove("da", Some(1)).expect("rm da 1");
    save_ids(&session, "da", 5000, 100).await;
    assert_eq!(catalog.get("da", None).expect("da").version, 2);
    let s = status_of(partition(&mut c, ta).await.expect_err("removed version"));
    assert_eq!(s.code(), tonic::Code::NotFound, "{}", s.message());
    assert!(s.message().contains("no version 1"), "{}", s.message());
    server.stop().await;
}

/// A client whose connections come from `ip` (any 127/8 address is loopback).
async fn client_from(addr: SocketAddr, ip: &str) -> FlightClient {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .local_address(Some(ip.parse().expect("ip")))
        .connect()
        .await
        .expect("connect");
    FlightClient::new_from_inner(
        FlightServiceClient::new(channel).max_decoding_message_size(64 * 1024 * 1024),
    )
}

const GREEDY_REQUEST: &str = r#"{"dataset": "items", "partition_rows": 100,
    "prefetch_partitions": 1024, "parallel_requests": 8}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_greedy_client_cannot_make_the_server_hold_more_than_its_memory_limit() {
    // 2,000 rows of 4 KiB: 20 partitions of about 400 KiB each (8 MiB an epoch).
    let (_root, session) = items(2000, 4096).await;
    const LIMIT: usize = 4 << 20;
    let server = start(
        FlightServer::new(Arc::clone(&session))
            .memory_limit(LIMIT)
            .max_streams(8)
            .max_streams_per_client(6),
    )
    .await;
    let mut watch = client(server.addr).await;
    let held_within_limit = |s: &ReadAheadStats| {
        assert!(s.buffered_bytes <= LIMIT, "held over the limit: {s:?}");
        assert_eq!(s.memory_limit, LIMIT);
    };

    // The greedy client opens streams that each ask for the whole epoch ahead,
    // in a loop, until the per-client cap refuses it.
    let mut greedy = client_from(server.addr, "127.0.0.2").await;
    let mut opened = Vec::new();
    let refusal = loop {
        match info(&mut greedy, GREEDY_REQUEST).await {
            Ok(fi) => opened.push(fi),
            Err(e) => break status_of(e),
        }
        assert!(opened.len() <= 6, "the per-client cap holds");
        held_within_limit(&stats(&mut watch).await);
    };
    assert_eq!(opened.len(), 6);
    assert_eq!(refusal.code(), tonic::Code::ResourceExhausted);
    assert!(
        refusal.message().contains("127.0.0.2")
            && refusal.message().contains("--max-streams-per-client 6"),
        "{}",
        refusal.message()
    );
    // Its read-ahead fills its share of the limit and is cut there.
    let s = stats_until(&mut watch, "read-ahead cut at the limit", |s| {
        s.over_memory_limit > 0 || s.buffered_bytes > LIMIT / 2
    })
    .await;
    held_within_limit(&s);

    // A well-behaved client still reads every row, in order; what the server
    // holds stays within the limit between its partitions.
    let mut polite = client(server.addr).await;
    let fi = info(
        &mut polite,
        r#"{"dataset": "items", "partition_rows": 100}"#,
    )
    .await
    .expect("the polite client's stream");
    let mut got = Vec::new();
    for i in 0..fi.endpoint.len() {
        got.extend(ids(&partition(&mut polite, ticket(&fi, i))
            .await
            .expect("do_get")));
        held_within_limit(&stats(&mut watch).await);
    }
    assert_eq!(got, (0..2000).collect::<Vec<i64>>());

    // The server-wide cap: the polite stream is closed (read to its end), so
    // 6 greedy streams + 2 of a third client fill 8 of 8.
    let mut third = client_from(server.addr, "127.0.0.3").await;
    for n in [7, 8] {
        info(&mut third, GREEDY_REQUEST)
            .await
            .unwrap_or_else(|e| panic!("stream {n}: {e}"));
    }
    let s = status_of(
        info(&mut third, GREEDY_REQUEST)
            .await
            .expect_err("a 9th stream"),
    );
    assert_eq!(s.code(), tonic::Code::ResourceExhausted);
    assert!(s.message().contains("--max-streams 8"), "{}", s.message());
    let s = stats(&mut watch).await;
    held_within_limit(&s);
    assert_eq!(s.refused_streams, 2, "{s:?}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_larger_than_the_memory_limit_is_resource_exhausted() {
    let (_root, session) = items(100, 4096).await;
    let server = start(FlightServer::new(session).memory_limit(64 * 1024)).await;
    let mut c = client(server.addr).await;
    let fi = info(&mut c, r#"{"dataset": "items", "partition_rows": 100}"#)
        .await
        .expect("info");
    let s = status_of(
        partition(&mut c, ticket(&fi, 0))
            .await
            .expect_err("too big"),
    );
    assert_eq!(s.code(), tonic::Code::ResourceExhausted);
    assert!(
        s.message().contains("--memory-limit 65536") && s.message().contains("raise"),
        "{}",
        s.message()
    );
    assert_eq!(stats(&mut c).await.buffered_bytes, 0);
    server.stop().await;
}
