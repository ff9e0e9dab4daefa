//! The server's memory limit holds against greedy clients and oversized partitions.

use std::net::SocketAddr;
use std::sync::Arc;

use arrow_flight::FlightClient;
use arrow_flight::flight_service_client::FlightServiceClient;
use udfchain::serve::{FlightServer, ReadAheadStats};

use super::{client, ids, info, items, partition, start, stats, stats_until, status_of, ticket};

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
