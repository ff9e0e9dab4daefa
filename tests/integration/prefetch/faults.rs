//! Failed downloads: faults are retried, `skip` and `fail` report exactly the failing rows.

use std::sync::Arc;
use std::time::Duration;

use object_store::memory::InMemory;
use udfchain::{File, OnError, Session, Settings, col};

use udfchain_testkit::{Fault, FaultyStore, put_files, write_files};

use super::sums_of;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_faults_are_retried_and_skip_reports_exactly_the_permanent_failures() {
    const N: usize = 40;
    let hash = |s: &str, salt: u64| {
        s.bytes()
            .fold(salt, |h, b| h.wrapping_mul(131).wrapping_add(b as u64))
    };
    let build = |faults: bool| {
        let inner = Arc::new(InMemory::new());
        let store = FaultyStore::new(
            Arc::clone(&inner) as _,
            |_| Duration::ZERO,
            move |path, attempt| {
                if !faults {
                    return Fault::None;
                }
                if path.contains("f0007") || path.contains("f0031") {
                    return Fault::Request; // permanent
                }
                // ~10% request errors and ~10% broken bodies on the first two tries.
                match (attempt, hash(path, attempt as u64 + 1) % 10) {
                    (0 | 1, 0) => Fault::Request,
                    (0 | 1, 1) => Fault::MidBody,
                    _ => Fault::None,
                }
            },
        );
        (inner, store)
    };
    let rows = |session: Arc<Session>, policy: OnError| async move {
        #[derive(serde::Deserialize, PartialEq, Debug)]
        struct R {
            path: String,
            sum: u64,
        }
        let chain = session
            .from_storage("memory://faulty/")
            .settings(Settings::new().prefetch(8).on_error(policy))
            .map("sum", |f: File| async move {
                f.read()
                    .await
                    .map(|b| b.iter().map(|&x| x as u64).sum::<u64>())
            })
            .select([col("file.path").alias("path"), col("sum")]);
        let (batches, report) = chain.collect_with_report().await.expect("run");
        let mut out: Vec<R> = batches
            .iter()
            .flat_map(|b| serde_arrow::from_record_batch::<Vec<R>>(b).expect("rows"))
            .collect();
        out.sort_by(|a, b| a.path.cmp(&b.path));
        (
            out.into_iter().map(|r| (r.path, r.sum)).collect::<Vec<_>>(),
            report,
        )
    };

    let (clean_inner, clean_store) = build(false);
    put_files(clean_inner.as_ref(), "", N, |i| 5000 + i * 100).await;
    let clean_session = Session::new();
    clean_session
        .register_store("memory://faulty", clean_store as _)
        .expect("register");
    let (clean, _) = rows(clean_session, OnError::Fail).await;
    assert_eq!(clean.len(), N);

    let (inner, store) = build(true);
    put_files(inner.as_ref(), "", N, |i| 5000 + i * 100).await;
    let session = Session::new();
    session
        .register_store("memory://faulty", store as _)
        .expect("register");
    let (got, report) = rows(session, OnError::Skip).await;
    let want: Vec<_> = clean
        .iter()
        .filter(|(p, _)| !p.contains("f0007") && !p.contains("f0031"))
        .cloned()
        .collect();
    assert_eq!(
        got, want,
        "results equal a clean run minus the permanently failing files"
    );
    let mut skipped = report.skipped.clone();
    skipped.sort();
    assert_eq!(
        skipped,
        vec![
            "memory://faulty/d1/f0007.bin",
            "memory://faulty/d1/f0031.bin"
        ]
    );
    assert!(
        report.metric("PrefetchExec", "retries") > 0,
        "faults were retried"
    );
    assert_eq!(report.metric("PrefetchExec", "skipped_files"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_rows_sharing_a_task_skip_or_fail_one_by_one() {
    // Fast rows are called several to a task: `skip` drops exactly the
    // failing rows (each called once), `fail` names the first failing file.
    use std::sync::atomic::{AtomicUsize, Ordering};
    let dir = tempfile::tempdir().expect("dir");
    let rels = write_files(dir.path(), 400, |_| 16);
    let session = Session::new();
    let uri = dir.path().display().to_string();
    let calls = Arc::new(AtomicUsize::new(0));
    let settings = Settings::new().on_error(OnError::Skip);
    let (rows, _) = sums_of(&session, &uri, settings, Arc::clone(&calls)).await;
    assert_eq!(calls.load(Ordering::SeqCst), 400, "each row called once");
    let sevens = rels.iter().filter(|r| r.ends_with("7.bin")).count();
    assert_eq!(rows.len(), 400 - sevens);
    assert!(
        rows.iter()
            .all(|(p, s)| !p.ends_with("7.bin") && s.is_some())
    );
    let err = session
        .from_storage(&uri)
        .map("sum", |f: File| async move {
            if f.path.ends_with("7.bin") {
                return Err(std::io::Error::other("no sevens"));
            }
            f.read()
                .await
                .map_err(std::io::Error::other)
                .map(|b| b.len() as u64)
        })
        .collect()
        .await
        .expect_err("fails");
    let text = err.to_string();
    assert!(
        text.contains("no sevens") && text.contains("7.bin"),
        "{text}"
    );
}
