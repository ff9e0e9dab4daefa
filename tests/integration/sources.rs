//! The same chain over a local dir, memory:// and a real S3 server on loopback.

use std::sync::Arc;

use object_store::memory::InMemory;
use serde::{Deserialize, Serialize};
use udfchain::{Chain, File, Session, Settings, col, lit};

use udfchain_testkit::{S3Server, content, put_files, write_files};

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
struct Row {
    path: String,
    size: u64,
    len: u64,
    sum: u64,
    head: Vec<u8>,
}

fn size(i: usize) -> usize {
    100 + i * 37
}

fn chain(session: &Arc<Session>, uri: &str) -> Chain {
    session
        .from_storage(uri)
        .settings(Settings::new().parallel(3))
        .filter(col("file.size").gt(lit(0u64)))
        .map("len", |f: File| async move {
            f.read().await.map(|b| b.len() as u64)
        })
        .map("sum", |f: File| async move {
            f.read()
                .await
                .map(|b| b.iter().map(|&x| x as u64).sum::<u64>())
        })
        .map("head", |f: File| async move {
            f.read_range(0..4).await.map(|b| b.to_vec())
        })
        .select([
            col("file.path").alias("path"),
            col("file.size").alias("size"),
            col("len"),
            col("sum"),
            col("head"),
        ])
}

fn expected(n: usize) -> Vec<Row> {
    let mut rows: Vec<Row> = (0..n)
        .map(|i| {
            let c = content(i, size(i));
            Row {
                path: format!("d{}/f{i:04}.bin", i % 3),
                size: c.len() as u64,
                len: c.len() as u64,
                sum: c.iter().map(|&x| x as u64).sum(),
                head: c[..4].to_vec(),
            }
        })
        .collect();
    rows.sort();
    rows
}

async fn rows(chain: Chain) -> Vec<Row> {
    let mut rows: Vec<Row> = chain.to_rows().await.expect("run chain");
    rows.sort();
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_rows_on_local_memory_and_s3() {
    const N: usize = 25;
    let want = expected(N);

    let dir = tempfile::tempdir().expect("tempdir");
    write_files(&dir.path().join("data"), N, size);
    let local = Session::new();
    let uri = dir.path().join("data").display().to_string();
    assert_eq!(rows(chain(&local, &uri)).await, want, "local path");
    assert_eq!(
        rows(chain(&local, &format!("file://{uri}"))).await,
        want,
        "file:// URL"
    );

    let mem = Session::new();
    let store = Arc::new(InMemory::new());
    put_files(store.as_ref(), "some/prefix", N, size).await;
    mem.register_store("memory://mem", store).expect("register");
    assert_eq!(
        rows(chain(&mem, "memory://mem/some/prefix")).await,
        want,
        "memory://"
    );

    let s3 = S3Server::start();
    write_files(&s3.bucket_dir().join("data"), N, size);
    let session = s3.session();
    assert_eq!(
        rows(chain(&session, "s3://bucket/data/")).await,
        want,
        "s3://"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_columns_glob_and_non_recursive() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_files(dir.path(), 6, |_| 10);
    std::fs::write(dir.path().join("top.txt"), b"hello").expect("write");
    let session = Session::new();
    let uri = dir.path().display().to_string();

    let files: Vec<FileRow> = session.from_storage(&uri).to_rows().await.expect("list");
    assert_eq!(files.len(), 7);
    let top = files
        .iter()
        .find(|r| r.file.path == "top.txt")
        .expect("top.txt listed");
    assert_eq!(top.file.size, 5);
    assert!(
        top.file.source.starts_with("file:///"),
        "{}",
        top.file.source
    );
    assert!(top.file.last_modified.is_some());

    let n = session
        .from_storage(&uri)
        .glob("**/*.bin")
        .count()
        .await
        .expect("count");
    assert_eq!(n, 6);
    let n = session
        .from_storage(&uri)
        .non_recursive()
        .count()
        .await
        .expect("count");
    assert_eq!(n, 1);
}

#[derive(Debug, Deserialize)]
struct FileRow {
    file: File,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_bucket_root_listing() {
    let s3 = S3Server::start();
    write_files(&s3.bucket_dir(), 4, |_| 64);
    let files: Vec<FileRow> = s3
        .session()
        .from_storage("s3://bucket")
        .to_rows()
        .await
        .expect("list");
    assert_eq!(files.len(), 4);
    for f in &files {
        assert_eq!(f.file.source, "s3://bucket/");
        assert_eq!(f.file.size, 64);
        assert_eq!(f.file.url(), format!("s3://bucket/{}", f.file.path));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_parquet_csv_json_round_trip() {
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Item {
        id: i64,
        name: String,
    }
    let items: Vec<Item> = (0..5)
        .map(|id| Item {
            id,
            name: format!("n{id}"),
        })
        .collect();
    let session = Session::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("items.parquet").display().to_string();
    Chain::from_values_in(Arc::clone(&session), &items)
        .to_parquet(&out)
        .await
        .expect("write parquet");
    let back: Vec<Item> = Chain::from_parquet(&out)
        .order_by([col("id").sort(true, false)])
        .to_rows()
        .await
        .expect("read parquet");
    assert_eq!(back, items);

    let csv = dir.path().join("items.csv");
    std::fs::write(&csv, "id,name\n1,a\n2,b\n").expect("csv");
    let n = Chain::from_csv(&csv.display().to_string())
        .count()
        .await
        .expect("csv count");
    assert_eq!(n, 2);
    let json = dir.path().join("items.json");
    std::fs::write(
        &json,
        "{\"id\":1,\"name\":\"a\"}\n{\"id\":2,\"name\":\"b\"}\n",
    )
    .expect("json");
    let back: Vec<Item> = Chain::from_json(&json.display().to_string())
        .order_by([col("id").sort(true, false)])
        .to_rows()
        .await
        .expect("json rows");
    assert_eq!(
        back[1],
        Item {
            id: 2,
            name: "b".into()
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parquet_csv_json_from_the_s3_server() {
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Item {
        id: i64,
        name: String,
    }
    let s3 = S3Server::start();
    let items: Vec<Item> = (0..4)
        .map(|id| Item {
            id,
            name: format!("n{id}"),
        })
        .collect();
    let local = s3.bucket_dir().join("tables");
    std::fs::create_dir_all(&local).expect("mkdir");
    Chain::from_values(&items)
        .to_parquet(&local.join("items.parquet").display().to_string())
        .await
        .expect("write parquet");
    std::fs::write(local.join("items.csv"), "id,name\n0,n0\n1,n1\n").expect("csv");
    std::fs::write(local.join("items.json"), "{\"id\":0,\"name\":\"n0\"}\n").expect("json");
    let session = s3.session();
    let back: Vec<Item> = Chain::from_parquet("s3://bucket/tables/items.parquet")
        .in_session(Arc::clone(&session))
        .order_by([col("id").sort(true, false)])
        .to_rows()
        .await
        .expect("parquet from s3");
    assert_eq!(back, items);
    let n = Chain::from_csv("s3://bucket/tables/items.csv")
        .in_session(Arc::clone(&session))
        .count()
        .await
        .expect("csv from s3");
    assert_eq!(n, 2);
    let n = Chain::from_json("s3://bucket/tables/items.json")
        .in_session(session)
        .count()
        .await
        .expect("json from s3");
    assert_eq!(n, 1);
}

/// The listing reads one page ahead: once the consumer has taken about half of
/// the first page (S3 pages hold 1,000 keys), the second LIST request is made
/// before it asks for more; a query that stops early (a limit in the scan, or
/// above a UDF) makes one LIST request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_reads_the_next_page_ahead_but_not_past_a_limit() {
    use futures::StreamExt;
    let s3 = S3Server::start();
    write_files(&s3.bucket_dir(), 1500, |_| 1);
    let session = s3.session();

    let before = s3.requests();
    let mut stream = session
        .from_storage("s3://bucket")
        .stream()
        .await
        .expect("plan");
    let mut rows = stream
        .next()
        .await
        .expect("a batch")
        .expect("rows")
        .num_rows();
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(
        s3.requests() - before,
        1,
        "{rows} rows taken: no read-ahead before half a page"
    );
    rows += stream
        .next()
        .await
        .expect("a batch")
        .expect("rows")
        .num_rows();
    assert!(rows <= 600, "{rows} rows taken: part of the first page");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while s3.requests() - before < 2 && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(
        s3.requests() - before,
        2,
        "page 2 is requested while page 1 is being consumed"
    );
    while let Some(batch) = stream.next().await {
        rows += batch.expect("rows").num_rows();
    }
    assert_eq!(rows, 1500);
    assert_eq!(s3.requests() - before, 2, "two pages, two LIST requests");

    let before = s3.requests();
    let ten = session
        .from_storage("s3://bucket")
        .limit(10)
        .collect()
        .await
        .expect("limit");
    assert_eq!(ten.iter().map(|b| b.num_rows()).sum::<usize>(), 10);
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(s3.requests() - before, 1, "the first page covers the limit");

    // A limit above a UDF is not pushed into the scan: the listing stops
    // with the query, before reading the next page ahead.
    let (before, gets_before) = (s3.requests(), s3.object_gets());
    let ten = session
        .from_storage("s3://bucket")
        .map(
            "n",
            |f: File| async move { Ok::<u64, std::io::Error>(f.size) },
        )
        .limit(10)
        .count()
        .await
        .expect("limit above a map");
    assert_eq!(ten, 10);
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let lists = (s3.requests() - before) - (s3.object_gets() - gets_before);
    assert_eq!(lists, 1, "one LIST request");
}
