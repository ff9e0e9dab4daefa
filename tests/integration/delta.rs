//! Delta saves (`Chain::delta`, `read_storage(.., delta => ..)`) against the
//! loopback S3 server: only the added and changed files are downloaded and
//! passed to the UDF, deleted ones drop out, and the new version equals a full
//! rebuild.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use datafusion::arrow::util::pretty::pretty_format_batches;
use udfchain::udfs::File;
use udfchain::{Chain, Output, ScriptRunner, Session, col};

use udfchain_testkit::{Fault, FaultyStore, S3Server, content, write_files};

/// Files in the first version. 10,000 passes with the same counts (200
/// calls, 200 GETs) but two full runs of 10,000 GETs each take ~45 s apiece
/// in a debug build on a loaded 2-core machine, so the test keeps 1,000
/// (changing, adding and deleting 100 each) and stays near 15 s. The delta
/// save's counts do not depend on this number.
const FILES: usize = 1_000;

/// A chain over `s3://bucket/data` mapping each file to the sum of its bytes,
/// counting calls in `calls`.
fn summed(session: &Arc<Session>, calls: &Arc<AtomicUsize>) -> Chain {
    let calls = Arc::clone(calls);
    session
        .from_storage("s3://bucket/data")
        .map("sum", move |f: File| {
            let calls = Arc::clone(&calls);
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                let bytes = f.read().await?;
                Ok::<_, udfchain::udfs::UdfError>(bytes.iter().map(|&b| u64::from(b)).sum::<u64>())
            }
        })
}

/// The rows of dataset `name`'s latest version as sorted lines (path, etag, sum).
async fn rows(session: &Arc<Session>, name: &str) -> Vec<String> {
    let batches = session
        .from_dataset(name)
        .select([
            col("file.path").alias("path"),
            col("file.etag").alias("etag"),
            col("sum"),
        ])
        .collect()
        .await
        .expect("read dataset");
    let text = pretty_format_batches(&batches).expect("format").to_string();
    let mut lines: Vec<String> = text
        .lines()
        .filter(|l| l.starts_with("| "))
        .skip(1)
        .map(str::to_string)
        .collect();
    lines.sort();
    lines
}

/// Changes files 0..100 (new bytes and size), deletes 100..200 and adds
/// FILES..FILES+100 under the bucket's `data/`.
fn change_add_delete(dir: &std::path::Path) {
    for i in 0..100 {
        let p = dir.join(format!("d{}/f{i:04}.bin", i % 3));
        std::fs::write(&p, content(i + 7, 65)).expect("change");
    }
    for i in 100..200 {
        std::fs::remove_file(dir.join(format!("d{}/f{i:04}.bin", i % 3))).expect("delete");
    }
    for i in FILES..FILES + 100 {
        let p = dir.join(format!("d{}/f{i:04}.bin", i % 3));
        std::fs::write(&p, content(i, 64)).expect("add");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_delta_save_calls_and_fetches_only_the_added_and_changed_files() {
    let s3 = S3Server::start();
    let root = tempfile::tempdir().expect("root");
    let data = s3.bucket_dir().join("data");
    write_files(&data, FILES, |_| 64);
    let session = Session::with_settings(s3.settings().root(root.path()));
    let calls = Arc::new(AtomicUsize::new(0));
    let delta = || summed(&session, &calls).delta(&["file.path"], &["file.etag"]);

    // No version yet: a full run.
    let v1 = delta().save("sums").await.expect("first save");
    assert_eq!((v1.version, v1.rows), (1, FILES as u64));
    assert_eq!(calls.swap(0, Ordering::SeqCst), FILES);

    change_add_delete(&data);
    let gets = s3.object_gets();
    let v2 = delta().save("sums").await.expect("delta save");
    assert_eq!(
        (calls.swap(0, Ordering::SeqCst), s3.object_gets() - gets),
        (200, 200),
        "UDF calls and GETs of the delta save: 100 changed + 100 added files"
    );
    assert_eq!((v2.version, v2.rows), (2, FILES as u64));

    let full = summed(&session, &calls)
        .save("sums-full")
        .await
        .expect("full");
    assert_eq!(calls.load(Ordering::SeqCst), FILES);
    let (got, want) = (
        rows(&session, "sums").await,
        rows(&session, "sums-full").await,
    );
    assert_eq!(got.len(), full.rows as usize);
    assert!(got == want, "the delta version differs from a full rebuild");
    // The changed files carry their new sums, the deleted ones are gone.
    let changed: u64 = content(7, 65).iter().map(|&b| u64::from(b)).sum();
    assert!(
        got.iter()
            .any(|l| l.contains("d0/f0000.bin") && l.contains(&format!(" {changed} ")))
    );
    assert!(!got.iter().any(|l| l.contains("f0100.bin")));
    assert!(got.iter().any(|l| l.contains(&format!("f{FILES}.bin"))));
}

fn runner(s3: &S3Server, root: &std::path::Path) -> ScriptRunner {
    ScriptRunner::new(Session::with_settings(s3.settings().root(root)))
}

async fn message(r: &ScriptRunner, script: &str) -> String {
    match r.run(script).await.unwrap_or_else(|e| panic!("{e}")).pop() {
        Some(Output::Message(m)) => m,
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn create_dataset_over_read_storage_with_delta_saves_only_the_changes() {
    let s3 = S3Server::start();
    let root = tempfile::tempdir().expect("root");
    let data = s3.bucket_dir().join("data");
    write_files(&data, 300, |_| 64);
    let r = runner(&s3, root.path());
    let script = "CREATE DATASET h AS SELECT file, sha256(file) AS h \
                  FROM read_storage('s3://bucket/data', delta => 'h') ORDER BY file.path";
    assert_eq!(
        message(&r, script).await,
        "saved dataset h version 1 (300 rows)"
    );
    std::fs::write(data.join("d0/f0000.bin"), b"changed").expect("change");
    std::fs::remove_file(data.join("d1/f0001.bin")).expect("delete");
    std::fs::write(data.join("d2/new.bin"), b"new").expect("add");
    let gets = s3.object_gets();
    assert_eq!(
        message(&r, script).await,
        "saved dataset h version 2 (300 rows)"
    );
    assert_eq!(s3.object_gets() - gets, 2, "the changed and the added file");
    let got =
        udfchain_testkit::last_table(&r, "SELECT file.path AS p FROM read_dataset('h')").await;
    let paths: Vec<&str> = got
        .lines()
        .filter(|l| l.starts_with("| d"))
        .map(|l| l.trim_matches(|c| c == '|' || c == ' '))
        .collect();
    let mut sorted = paths.clone();
    sorted.sort();
    assert_eq!(paths, sorted, "a final ORDER BY orders the whole version");
    assert!(!paths.contains(&"d1/f0001.bin") && paths.contains(&"d2/new.bin"));

    // The delta names the dataset it continues.
    let e = r
        .run("CREATE DATASET other AS SELECT file FROM read_storage('s3://bucket/data', delta => 'h')")
        .await
        .expect_err("another dataset");
    assert!(
        e.to_string().contains("continues the dataset it saves"),
        "{e}"
    );
    // Outside a save the delta listing does not run.
    let e = r
        .run("SELECT count(*) FROM read_storage('s3://bucket/data', delta => 'h')")
        .await
        .expect_err("not a save");
    assert!(e.to_string().contains("only runs in a save"), "{e}");
    let e = r
        .run("SELECT * FROM read_storage('s3://bucket/data', delta_of => 'h')")
        .await
        .expect_err("unknown argument");
    assert!(e.to_string().contains("did you mean delta"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_delta_save_refuses_steps_that_are_not_row_local_unless_delta_unsafe() {
    let s3 = S3Server::start();
    let root = tempfile::tempdir().expect("root");
    write_files(&s3.bucket_dir().join("data"), 10, |_| 64);
    let r = runner(&s3, root.path());
    for (query, what) in [
        (
            "SELECT count(*) AS n FROM read_storage('s3://bucket/data', delta => 'd')",
            "an aggregate",
        ),
        (
            "SELECT DISTINCT file.size FROM read_storage('s3://bucket/data', delta => 'd')",
            "distinct",
        ),
        (
            "SELECT file FROM read_storage('s3://bucket/data', delta => 'd') LIMIT 3",
            "a limit",
        ),
    ] {
        let e = r
            .run(&format!("CREATE DATASET d AS {query}"))
            .await
            .expect_err(query);
        let msg = e.to_string();
        assert!(
            msg.contains(what) && msg.contains("delta_unsafe = true"),
            "{query}: {msg}"
        );
    }
    let session = Session::with_settings(s3.settings().root(root.path()));
    let e = session
        .from_storage("s3://bucket/data")
        .delta(&[], &[])
        .distinct()
        .save("d")
        .await
        .expect_err("distinct");
    assert!(e.to_string().contains("refuses distinct"), "{e}");
    assert!(
        session
            .catalog()
            .await
            .expect("catalog")
            .list()
            .await
            .expect("list")
            .is_empty()
    );

    // Allowed by the setting: the limit sees the new and changed files only.
    let script = "SET delta_unsafe = true; CREATE DATASET d AS \
                  SELECT file FROM read_storage('s3://bucket/data', delta => 'd') LIMIT 3";
    assert_eq!(
        message(&r, script).await,
        "saved dataset d version 1 (3 rows)"
    );
    // The keys stay in the rows, where the next delta save compares them.
    for (query, want) in [
        (
            "SELECT file.size AS s FROM read_storage('s3://bucket/data', delta => 'k')",
            "keeps the column \"file\"",
        ),
        (
            "SELECT file FROM read_storage('s3://bucket/data', delta => 'k', delta_on => 'name')",
            "fields of the listing's `file` column",
        ),
    ] {
        let e = r
            .run(&format!("CREATE DATASET k AS {query}"))
            .await
            .expect_err(query);
        assert!(e.to_string().contains(want), "{query}: {e}");
    }
    let e = Chain::from_values(&[1u32])
        .delta(&[], &[])
        .save("v")
        .await
        .expect_err("not storage");
    assert!(
        e.to_string().contains("delta needs a storage source"),
        "{e}"
    );
}

/// An S3 store of `s3` whose listings carry no ETag and no version, as some
/// S3 servers' do (their HEAD and GET responses still have them).
fn listing_without_etags(s3: &S3Server) -> Arc<dyn object_store::ObjectStore> {
    let inner: Arc<dyn object_store::ObjectStore> = Arc::new(
        object_store::aws::AmazonS3Builder::new()
            .with_endpoint(&s3.endpoint)
            .with_allow_http(true)
            .with_bucket_name(udfchain_testkit::BUCKET)
            .with_access_key_id(udfchain_testkit::ACCESS_KEY)
            .with_secret_access_key(udfchain_testkit::SECRET_KEY)
            .with_region("us-east-1")
            .with_virtual_hosted_style_request(false)
            .build()
            .expect("s3 store"),
    );
    FaultyStore::hiding_list_etags(inner, |_| Duration::ZERO, |_, _| Fault::None)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_listing_without_etags_never_keeps_stale_rows() {
    const N: usize = 300;
    let s3 = S3Server::start();
    let root = tempfile::tempdir().expect("root");
    let data = s3.bucket_dir().join("data");
    write_files(&data, N, |_| 64);
    let session = Session::with_settings(s3.settings().root(root.path()));
    session
        .register_store("s3://bucket", listing_without_etags(&s3))
        .expect("register");
    let calls = Arc::new(AtomicUsize::new(0));
    let delta = |compare: &'static [&'static str]| summed(&session, &calls).delta(&[], compare);

    let v1 = delta(&[]).save("sums").await.expect("first save");
    assert_eq!((v1.rows, calls.swap(0, Ordering::SeqCst)), (N as u64, N));
    // 100 objects rewritten (new bytes, new size), 50 deleted, 50 added.
    for i in 0..100 {
        let p = data.join(format!("d{}/f{i:04}.bin", i % 3));
        std::fs::write(&p, content(i + 7, 65)).expect("rewrite");
    }
    for i in 100..150 {
        std::fs::remove_file(data.join(format!("d{}/f{i:04}.bin", i % 3))).expect("delete");
    }
    for i in N..N + 50 {
        std::fs::write(data.join(format!("d{}/f{i:04}.bin", i % 3)), content(i, 64)).expect("add");
    }
    // The default compare falls back to size and last_modified: the rewritten
    // files are computed again, never kept with their old rows.
    let v2 = delta(&[]).save("sums").await.expect("delta save");
    assert_eq!((v2.rows, calls.swap(0, Ordering::SeqCst)), (N as u64, 150));
    summed(&session, &calls)
        .save("sums-full")
        .await
        .expect("full");
    calls.store(0, Ordering::SeqCst);
    let (got, want) = (
        rows(&session, "sums").await,
        rows(&session, "sums-full").await,
    );
    assert!(got == want, "the delta version differs from a full rebuild");
    let rewritten: u64 = content(7, 65).iter().map(|&b| u64::from(b)).sum();
    assert!(
        got.iter()
            .any(|l| l.contains("d0/f0000.bin") && l.contains(&format!(" {rewritten} "))),
        "f0000 carries its new sum"
    );
    // A compare field the listing lacks (null on both sides) never means
    // "unchanged": every listed file is computed again.
    let v3 = delta(&["file.etag"]).save("sums").await.expect("etag save");
    assert_eq!((v3.rows, calls.load(Ordering::SeqCst)), (N as u64, N));
    assert!(rows(&session, "sums").await == want);
}
