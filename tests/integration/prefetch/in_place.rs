//! Reads without a download: header reads without prefetch, files at hand read in place.

use std::sync::Arc;

use object_store::memory::InMemory;
use object_store::{ObjectStore, PutPayload};
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use udfchain::{File, OnError, Session, Settings, col};

use udfchain_testkit::{CountingStore, content, put_files, write_files};

use super::sums_of;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_read_without_prefetch_transfers_a_tiny_part() {
    const SIZE: usize = 64 * 1024 * 1024;
    let inner = Arc::new(InMemory::new());
    let body = content(3, SIZE);
    inner
        .put_opts(
            &"big/blob.bin".into(),
            PutPayload::from(body.clone()),
            Default::default(),
        )
        .await
        .expect("put");
    let store = CountingStore::new(inner);
    let session = Session::new();
    session
        .register_store("memory://hdr", Arc::clone(&store) as _)
        .expect("register");
    #[derive(serde::Deserialize)]
    struct R {
        hdr: Vec<u8>,
    }
    let rows: Vec<R> = session
        .from_storage("memory://hdr/big")
        .settings(Settings::new().prefetch(0))
        .map("hdr", |f: File| async move {
            let mut r = f.open().await.map_err(std::io::Error::other)?;
            let mut head = vec![0u8; 1024];
            r.read_exact(&mut head).await?;
            // Seek near the end and read the tail too.
            r.seek(std::io::SeekFrom::End(-16)).await?;
            let mut tail = vec![0u8; 16];
            r.read_exact(&mut tail).await?;
            head.extend(tail);
            Ok::<_, std::io::Error>(head)
        })
        .select([col("hdr")])
        .to_rows()
        .await
        .expect("run");
    let mut want = body[..1024].to_vec();
    want.extend_from_slice(&body[SIZE - 16..]);
    assert_eq!(rows[0].hdr, want);
    assert!(
        store.bytes() < SIZE / 100,
        "{} bytes transferred of {SIZE}",
        store.bytes()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_at_hand_are_read_in_place_under_auto_each_row_its_own_call() {
    // 600 local files and the same in an in-memory store: under `auto` (the
    // default) no download, rows in listing order, every row called exactly
    // once though fast rows share a task, and only the failing rows (names
    // ending in 7) lose their value; a fixed window fetches the local files
    // (for disks that are cold) but never the in-memory ones.
    use std::sync::atomic::{AtomicUsize, Ordering};
    let size = |i: usize| 1 + i % 300;
    let dir = tempfile::tempdir().expect("dir");
    let rels = write_files(dir.path(), 600, size);
    let session = Session::new();
    let mem = Arc::new(InMemory::new());
    put_files(mem.as_ref(), "", 600, size).await;
    session
        .register_store("memory://athand", mem as _)
        .expect("register");
    let mut want: Vec<(String, Option<u64>)> = (0..600)
        .map(|i| {
            let sum = content(i, size(i)).iter().map(|&x| x as u64).sum();
            (
                rels[i].clone(),
                Some(sum).filter(|_| !rels[i].ends_with("7.bin")),
            )
        })
        .collect();
    want.sort();
    let local = dir.path().display().to_string();
    for (uri, fixed_fetches) in [(local.as_str(), 600), ("memory://athand/", 0)] {
        for (label, settings, fetched) in [
            ("auto", Settings::new(), 0),
            ("prefetch 8", Settings::new().prefetch(8), fixed_fetches),
        ] {
            let calls = Arc::new(AtomicUsize::new(0));
            let settings = settings.on_error(OnError::Null);
            let (rows, report) = sums_of(&session, uri, settings, Arc::clone(&calls)).await;
            let got: Vec<(String, Option<u64>)> = rows
                .into_iter()
                .map(|(path, sum)| {
                    let rel = rels.iter().find(|r| path.ends_with(r.as_str()));
                    (rel.expect("a written file").clone(), sum)
                })
                .collect();
            assert_eq!(got, want, "{uri} {label}: values, nulls and listing order");
            assert_eq!(
                calls.load(Ordering::SeqCst),
                600,
                "{uri} {label}: one call per row"
            );
            assert_eq!(
                report.metric("PrefetchExec", "files_fetched"),
                fetched,
                "{uri} {label}"
            );
            assert_eq!(
                report.metric("PrefetchExec", "files_in_place"),
                600 - fetched,
                "{uri} {label}"
            );
            let listed: usize = (0..600).map(size).sum();
            assert_eq!(
                report.metric("PrefetchExec", "bytes_in_place"),
                if fetched == 0 { listed } else { 0 },
                "{uri} {label}: the listed bytes of the files read in place"
            );
        }
    }
}
