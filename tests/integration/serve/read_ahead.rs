//! The read-ahead: slow clients do not stall others; dropped, idle, killed ones free it.

use std::io::BufRead;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_flight::FlightClient;
use futures::StreamExt;
use udfchain::serve::FlightServer;

use super::{
    client, connect, ids, info, items, partition, read_epoch, start, stats, stats_until, ticket,
};

/// A client whose HTTP/2 windows are 64 KiB: when it stops reading, the server
/// is stuck mid-partition (with the default 2 MiB windows a partition of a few
/// MiB would sit whole in the buffers).
async fn small_window_client(addr: SocketAddr) -> FlightClient {
    connect(addr, Some(65_535)).await
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
            "serve::read_ahead::killed_client_worker",
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
