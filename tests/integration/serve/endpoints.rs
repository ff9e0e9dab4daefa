//! What clients read: every row once, in order, split, shuffled, in bounded messages.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arrow_flight::decode::FlightRecordBatchStream;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{Criteria, FlightData, FlightInfo};
use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::DataType;
use futures::TryStreamExt;
use udfchain::serve::{FLIGHT_DATA_SIZE, FLIGHT_DATA_SIZE_UNLIMITED_CLIENT, FlightServer};
use udfchain::{Chain, File, Session, Settings};

use udfchain_testkit::{S3Server, content, write_files};

use super::{
    Row, client, ids, info, items, partition, pictures, read_epoch, start, stats, stats_until,
    status_of, ticket,
};

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

/// pyarrow 26's gRPC `user-agent` (Arrow's C++ Flight client).
const PYARROW_USER_AGENT: &str = "grpc-c++/1.81.1 grpc-c/54.0.0 (linux; chttp2)";

/// Every message of partition 0 of `json`, read by a raw client with tonic's
/// receive limit raised to `limit` (`None`: its default 4 MiB), sending
/// `user_agent` before tonic's own when given.
async fn raw_messages(
    addr: SocketAddr,
    json: &str,
    limit: Option<usize>,
    user_agent: Option<&str>,
) -> Vec<FlightData> {
    let mut c = client(addr).await;
    let fi = info(&mut c, json).await.expect("info");
    assert_eq!(fi.endpoint.len(), 1);
    let mut endpoint =
        tonic::transport::Endpoint::from_shared(format!("http://{addr}")).expect("endpoint");
    if let Some(ua) = user_agent {
        endpoint = endpoint.user_agent(ua).expect("a user agent");
    }
    let channel = endpoint.connect().await.expect("connect");
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
    // 64 bytes); a client that accepts more gets the ~6 MB batch whole, and
    // so does Arrow's C++ client (pyarrow's user agent) by default.
    for (extra, limit, ua, bound, count) in [
        ("", None, None, FLIGHT_DATA_SIZE, 3..=usize::MAX),
        (
            r#", "max_message_bytes": 1048576"#,
            None,
            None,
            1 << 20,
            7..=usize::MAX,
        ),
        (
            r#", "max_message_bytes": 16777216"#,
            Some(32 << 20),
            None,
            16 << 20,
            2..=2,
        ),
        (
            "",
            Some(32 << 20),
            Some(PYARROW_USER_AGENT),
            FLIGHT_DATA_SIZE_UNLIMITED_CLIENT,
            2..=2,
        ),
        (
            r#", "max_message_bytes": 1048576"#,
            None,
            Some(PYARROW_USER_AGENT),
            1 << 20,
            7..=usize::MAX,
        ),
    ] {
        let messages = raw_messages(server.addr, &json(extra), limit, ua).await;
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

/// `with_images` in a request: the partitions carry each File decoded and
/// resized on the server, as a `[H, W, C]` tensor column equal to the
/// pixels of the image functions; a bad spec is `InvalidArgument`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_images_serves_decoded_resized_tensors() {
    use udfchain::udfs::builtins::image::{DecodeOptions, Filter, decode, resize};
    let (_dir, _root, session, written) = pictures().await;
    let server = start(FlightServer::new(session)).await;
    let mut c = client(server.addr).await;
    let fi = info(
        &mut c,
        r#"{"dataset": "pictures", "columns": ["name"],
            "with_images": {"size": [16, 12], "out": "pixels"}}"#,
    )
    .await
    .expect("info");
    let mut rows = 0;
    for i in 0..fi.endpoint.len() {
        for b in partition(&mut c, ticket(&fi, i)).await.expect("do_get") {
            let names = b
                .column_by_name("name")
                .expect("name")
                .as_string::<i32>()
                .clone();
            let pixels = b.column_by_name("pixels").expect("pixels");
            let DataType::FixedSizeList(_, len) = pixels.data_type() else {
                panic!("a tensor column: {}", pixels.data_type());
            };
            assert_eq!(*len, 16 * 12 * 3);
            let pixels = pixels.as_fixed_size_list();
            for r in 0..b.num_rows() {
                let n: usize = names.value(r)[..1].parse().expect("file number");
                let want = resize(
                    decode(&written[n], &DecodeOptions::default())
                        .expect("decode")
                        .view(),
                    16,
                    12,
                    Filter::Bilinear,
                )
                .expect("resize");
                let got = pixels.value(r);
                assert_eq!(
                    got.as_primitive::<datafusion::arrow::datatypes::UInt8Type>()
                        .values(),
                    &want.data[..],
                    "{}",
                    names.value(r)
                );
                rows += 1;
            }
        }
    }
    assert_eq!(rows, 5);
    for (json, says) in [
        (
            r#"{"dataset": "pictures", "with_images": {"size": [0, 5]}}"#,
            "width must be in 1..=65535",
        ),
        (
            r#"{"dataset": "pictures", "with_images": {"mode": "CMYK"}}"#,
            "with_images mode",
        ),
        (
            r#"{"dataset": "pictures", "with_images": {"sise": [1, 1]}}"#,
            "unknown field `sise`",
        ),
    ] {
        let s = status_of(info(&mut c, json).await.expect_err(json));
        assert_eq!(s.code(), tonic::Code::InvalidArgument, "{json}: {s:?}");
        assert!(s.message().contains(says), "{json}: {}", s.message());
    }
    server.stop().await;
}
