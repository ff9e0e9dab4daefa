//! The per-UDF temp cache: a tar shard is fetched once per UDF, or once with `cache = true`.

use std::sync::Arc;

use object_store::memory::InMemory;
use object_store::{ObjectStore, PutPayload};
use serde::Deserialize;
use udfchain::udfs::builtins::tar_members;
use udfchain::{File, Session, Settings, col};

use udfchain_testkit::CountingStore;

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
