//! The shared cache end to end (reruns, limit, read-through with cache = false)
//! and virtual files (tar members prefetch their parent once).

use std::sync::Arc;

use object_store::memory::InMemory;
use object_store::{ObjectStore, PutPayload};
use serde::Deserialize;
use udfchain::SharedCache;
use udfchain::udfs::builtins::tar_members;
use udfchain::{File, Session, Settings, col};

use udfchain_testkit::{CountingStore, put_files};

async fn counted(name: &str, n: usize, size: usize) -> (Arc<Session>, Arc<CountingStore>) {
    let inner = Arc::new(InMemory::new());
    put_files(inner.as_ref(), "", n, |_| size).await;
    let store = CountingStore::new(inner);
    let session = Session::new();
    session
        .register_store(&format!("memory://{name}"), Arc::clone(&store) as _)
        .expect("register");
    (session, store)
}

#[derive(Debug, PartialEq, Deserialize)]
struct Sum {
    path: String,
    sum: u64,
}

async fn sums(
    session: &Arc<Session>,
    uri: &str,
    settings: Settings,
) -> (Vec<Sum>, udfchain::RunReport) {
    let chain = session
        .from_storage(uri)
        .settings(settings)
        .map("sum", |f: File| async move {
            f.read()
                .await
                .map(|b| b.iter().map(|&x| x as u64).sum::<u64>())
        })
        .select([col("file.path").alias("path"), col("sum")])
        .order_by([col("path").sort(true, false)]);
    let (batches, report) = chain.collect_with_report().await.expect("run");
    let rows = batches
        .iter()
        .flat_map(|b| serde_arrow::from_record_batch::<Vec<Sum>>(b).expect("rows"))
        .collect();
    (rows, report)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_true_rerun_does_no_gets_and_cache_false_reads_through() {
    let root = tempfile::tempdir().expect("root");
    let (session, store) = counted("cached", 20, 3000).await;
    let settings = Settings::new().cache(true).root(root.path());

    let (first, report) = sums(&session, "memory://cached/", settings.clone()).await;
    assert_eq!(first.len(), 20);
    assert_eq!(store.gets(), 20);
    assert_eq!(report.metric("PrefetchExec", "files_fetched"), 20);

    let (second, report) = sums(&session, "memory://cached/", settings).await;
    assert_eq!(second, first);
    assert_eq!(store.gets(), 20, "a rerun with cache = true makes no GET");
    assert_eq!(report.metric("PrefetchExec", "cache_hits"), 20);

    let (third, _) = sums(
        &session,
        "memory://cached/",
        Settings::new().cache(false).root(root.path()),
    )
    .await;
    assert_eq!(third, first);
    assert_eq!(
        store.gets(),
        20,
        "cache = false reads files the shared cache holds"
    );
    assert!(udfchain_tmp_is_empty(root.path()));

    let cache = SharedCache::open(root.path().join("cache"), None).expect("open");
    assert_eq!(cache.du().expect("du").files, 20);
    cache.clear().expect("clear");
    assert_eq!(cache.du().expect("du").files, 0);
}

fn udfchain_tmp_is_empty(root: &std::path::Path) -> bool {
    udfchain_testkit::prefetch_dirs(root).is_empty()
}

/// Without a prefetch in front of the UDF, `cache = true` still caches: the
/// UDF's own reads go through the shared cache, and a rerun makes no GET.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_true_without_prefetch_reads_through_the_cache() {
    let root = tempfile::tempdir().expect("root");
    let (session, store) = counted("cached_p0", 10, 2000).await;
    let settings = Settings::new().cache(true).prefetch(0).root(root.path());

    let (first, _) = sums(&session, "memory://cached_p0/", settings.clone()).await;
    assert_eq!(first.len(), 10);
    assert_eq!(store.gets(), 10);
    let cache = SharedCache::open(root.path().join("cache"), None).expect("open");
    assert_eq!(
        cache.du().expect("du").files,
        10,
        "every read filled the cache"
    );

    let (second, _) = sums(&session, "memory://cached_p0/", settings).await;
    assert_eq!(second, first);
    assert_eq!(store.gets(), 10, "a rerun reads the cache, not the store");

    let uncached = Settings::new().cache(false).prefetch(0).root(root.path());
    let (third, _) = sums(&session, "memory://cached_p0/", uncached).await;
    assert_eq!(third, first);
    assert_eq!(
        store.gets(),
        10,
        "cache = false still reads what the cache holds"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_larger_than_the_limit_leaves_the_cache_within_it() {
    let root = tempfile::tempdir().expect("root");
    let (session, _store) = counted("limited", 12, 10_000).await;
    let settings = Settings::new()
        .cache(true)
        .cache_limit(35_000)
        .root(root.path())
        .prefetch(2)
        .parallel(1);
    let (rows, _) = sums(&session, "memory://limited/", settings).await;
    assert_eq!(rows.len(), 12);
    let du = SharedCache::open(root.path().join("cache"), None)
        .expect("open")
        .du()
        .expect("du");
    assert!(
        du.bytes <= 35_000,
        "cache holds {} bytes over a 35,000 limit",
        du.bytes
    );
    assert!(du.files >= 1);
}

fn tar_shard(members: usize) -> (Vec<u8>, Vec<(String, Vec<u8>)>) {
    let mut builder = tar::Builder::new(Vec::new());
    let mut want = Vec::new();
    for i in 0..members {
        let name = format!(
            "sample{:04}/{}.txt",
            i / 2,
            if i % 2 == 0 { "label" } else { "caption" }
        );
        let data = format!("member {i} {}", "x".repeat(i % 37)).into_bytes();
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder
            .append_data(&mut header, &name, data.as_slice())
            .expect("append");
        want.push((name, data));
    }
    (builder.into_inner().expect("tar"), want)
}

async fn tar_run(cache: bool) -> (usize, usize) {
    let root = tempfile::tempdir().expect("root");
    let (shard, want) = tar_shard(1000);
    let inner = Arc::new(InMemory::new());
    inner
        .put_opts(
            &"shards/s0.tar".into(),
            PutPayload::from(shard),
            Default::default(),
        )
        .await
        .expect("put");
    let store = CountingStore::new(inner);
    let session = Session::new();
    session
        .register_store("memory://tar", Arc::clone(&store) as _)
        .expect("register");
    #[derive(Deserialize)]
    struct R {
        member: File,
        data: Vec<u8>,
    }
    let rows: Vec<R> = session
        .from_storage("memory://tar/shards")
        .settings(Settings::new().prefetch(4).cache(cache).root(root.path()))
        .r#gen("member", tar_members)
        .map_on(&["member"], "data", |m: File| async move {
            m.read().await.map(|b| b.to_vec())
        })
        .select([col("member"), col("data")])
        .to_rows()
        .await
        .expect("run");
    assert_eq!(rows.len(), 1000);
    for (row, (name, data)) in rows.iter().zip(&want) {
        let member = row.member.member().expect("a virtual file");
        assert_eq!(&member.name, name);
        assert_eq!(&row.data, data, "bytes of {name}");
        assert_eq!(
            row.member.url(),
            format!("memory://tar/shards/s0.tar#{name}")
        );
    }
    assert!(udfchain_testkit::prefetch_dirs(root.path()).is_empty());
    (store.gets(), rows.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tar_shard_with_1000_members_is_downloaded_once() {
    // cache = false: each UDF (the generator, then the map over members) has its
    // own temporary cache, so the shard is fetched once per UDF, not per member.
    let (gets, rows) = tar_run(false).await;
    assert_eq!((gets, rows), (2, 1000));
    // cache = true: once in all.
    let (gets, _) = tar_run(true).await;
    assert_eq!(gets, 1);
}
