//! Files named by URL: `file_from_url(url)` in SQL and
//! `File::from_url` / `file_from_url(col(..))` in Rust over a Parquet of URLs
//! pointing at the loopback S3 server and at loopback HTTP servers. Downloads
//! go through the prefetch like listed files': a 404 under `on_error = skip`
//! drops its row and is listed, the first GET pins size and etag, so an
//! object changed before a later read is caught, and the stores of new hosts
//! are opened on demand with the session's settings.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use datafusion::arrow::array::{Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::parquet::arrow::ArrowWriter;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use udfchain::{Chain, File, OnError, ScriptRunner, Settings, col, file_from_url};

use udfchain_testkit::{BUCKET, S3Server, content};

/// A plain HTTP server on 127.0.0.1 serving the files of `dir` by GET (404
/// for a missing one), each with an ETag of its length and mtime and
/// `If-Match` answered with 412 unless it names it; counts GETs.
struct HttpFiles {
    url: String,
    gets: Arc<AtomicUsize>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Drop for HttpFiles {
    fn drop(&mut self) {
        // Dropping a runtime blocks, which the test's runtime must not do.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

impl HttpFiles {
    fn start(dir: PathBuf) -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        let addr = listener.local_addr().expect("addr");
        listener.set_nonblocking(true).expect("nonblocking");
        let gets = Arc::new(AtomicUsize::new(0));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let (dir, counter) = (Arc::new(dir), Arc::clone(&gets));
        runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    continue;
                };
                let (dir, counter) = (Arc::clone(&dir), Arc::clone(&counter));
                let service = hyper::service::service_fn(move |req: Request<_>| {
                    let (dir, counter) = (Arc::clone(&dir), Arc::clone(&counter));
                    async move { Ok::<_, Infallible>(answer(&dir, &counter, &req)) }
                });
                tokio::spawn(async move {
                    let _ = ConnBuilder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(socket), service)
                        .await;
                });
            }
        });
        Self {
            url: format!("http://{addr}"),
            gets,
            runtime: Some(runtime),
        }
    }

    fn gets(&self) -> usize {
        self.gets.load(Ordering::SeqCst)
    }
}

fn answer<B>(dir: &FsPath, gets: &AtomicUsize, req: &Request<B>) -> Response<Full<Bytes>> {
    let status = |s: StatusCode| {
        let mut r = Response::new(Full::new(Bytes::new()));
        *r.status_mut() = s;
        r
    };
    if req.method() != hyper::Method::GET {
        return status(StatusCode::METHOD_NOT_ALLOWED);
    }
    gets.fetch_add(1, Ordering::SeqCst);
    let path = dir.join(req.uri().path().trim_start_matches('/'));
    let (Ok(meta), Ok(body)) = (std::fs::metadata(&path), std::fs::read(&path)) else {
        return status(StatusCode::NOT_FOUND);
    };
    let mtime = meta
        .modified()
        .ok()
        .and_then(|m| m.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    let etag = format!("\"{:x}-{mtime:x}\"", meta.len());
    if let Some(want) = req.headers().get("if-match")
        && want.as_bytes() != etag.as_bytes()
    {
        return status(StatusCode::PRECONDITION_FAILED);
    }
    let mut r = Response::new(Full::new(Bytes::from(body)));
    r.headers_mut()
        .insert("etag", etag.parse().expect("header value"));
    r
}

fn decode<T: serde::de::DeserializeOwned>(batches: &[RecordBatch]) -> Vec<T> {
    batches
        .iter()
        .flat_map(|b| serde_arrow::from_record_batch::<Vec<T>>(b).expect("rows"))
        .collect()
}

fn hex_sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Writes a Parquet of `(id, url)` rows to `path`.
fn write_urls(path: &FsPath, urls: &[Option<String>]) {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("url", DataType::Utf8, true),
    ]));
    let ids = Int64Array::from_iter_values(0..urls.len() as i64);
    let batch = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![Arc::new(ids), Arc::new(StringArray::from(urls.to_vec()))],
    )
    .expect("batch");
    let mut w = ArrowWriter::try_new(std::fs::File::create(path).expect("create"), schema, None)
        .expect("writer");
    w.write(&batch).expect("write");
    w.close().expect("close");
}

/// `n` URLs alternating between the S3 server's bucket and the HTTP server,
/// every `missing`-th naming an object that does not exist; writes the
/// objects that do. Returns the URLs and the hash of each existing one by id.
fn url_table(
    s3: &S3Server,
    http: &HttpFiles,
    http_dir: &FsPath,
    n: usize,
    missing: usize,
) -> (Vec<Option<String>>, BTreeMap<i64, String>) {
    let mut urls = Vec::with_capacity(n);
    let mut want = BTreeMap::new();
    for i in 0..n {
        let key = format!("img/{}/{i:05}.bin", i % 7);
        let on_s3 = i % 2 == 0;
        let url = if on_s3 {
            format!("s3://{BUCKET}/{key}")
        } else {
            format!("{}/{key}", http.url)
        };
        if i % missing != missing - 1 {
            let bytes = content(i, 64 + i % 300);
            let dir = if on_s3 {
                s3.bucket_dir()
            } else {
                http_dir.to_path_buf()
            };
            let p = dir.join(&key);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(&p, &bytes).expect("write");
            want.insert(i as i64, hex_sha256(&bytes));
        }
        urls.push(Some(url));
    }
    (urls, want)
}

#[derive(Debug, Deserialize)]
struct Hashed {
    id: i64,
    h: Option<String>,
}

/// A LAION-style table: 5,000 URLs (S3 and HTTP, every 25th missing) in a
/// Parquet; `SELECT id, sha256(file_from_url(url))` under `on_error = skip`
/// gives exactly the existing objects' hashes and lists exactly the 404s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parquet_of_urls_hashes_the_objects_and_skips_the_404s() {
    let s3 = S3Server::start();
    let http_dir = tempfile::tempdir().expect("dir");
    let http = HttpFiles::start(http_dir.path().to_path_buf());
    let (urls, want) = url_table(&s3, &http, http_dir.path(), 5_000, 25);
    let work = tempfile::tempdir().expect("dir");
    let parquet = work.path().join("urls.parquet");
    write_urls(&parquet, &urls);

    let session = udfchain::Session::with_settings(s3.settings().root(work.path().join("root")));
    let runner = ScriptRunner::new(Arc::clone(&session));
    runner.set("on_error", "skip").expect("set");
    let sql = format!(
        "SELECT id, sha256(file_from_url(url)) AS h FROM read_parquet('{}')",
        parquet.display()
    );
    let plan = session
        .context()
        .sql(&sql)
        .await
        .expect("plan")
        .into_unoptimized_plan();
    let (batches, report) = Chain::from_plan(Arc::clone(&session), plan)
        .collect_with_report()
        .await
        .expect("run");
    let rows: Vec<Hashed> = decode(&batches);
    let got: BTreeMap<i64, String> = rows
        .into_iter()
        .map(|r| (r.id, r.h.expect("a hash for every row kept")))
        .collect();
    assert_eq!(got.len(), want.len());
    assert!(got == want, "the hashes of exactly the existing objects");

    let mut skipped = report.skipped.clone();
    skipped.sort();
    let mut missing: Vec<String> = (0..urls.len())
        .filter(|i| !want.contains_key(&(*i as i64)))
        .filter_map(|i| urls[i].clone())
        .collect();
    missing.sort();
    assert_eq!(missing.len(), 200);
    assert_eq!(skipped, missing, "the skip list is exactly the 404s");
    assert_eq!(report.skipped_unlisted, 0);
    assert_eq!(report.metric("PrefetchExec", "skipped_files"), 200);
    // One GET per URL, each server its own.
    assert_eq!(http.gets(), 2_500);
    assert_eq!(s3.object_gets(), 2_500);
}

#[derive(Debug, Serialize, Deserialize)]
struct UrlRow {
    id: i64,
    file: Option<File>,
}

#[derive(Debug, Deserialize)]
struct Pinned {
    id: i64,
    file: Option<File>,
    n: Option<u64>,
}

/// The Rust API: `File::from_url` values, and `file_from_url(col("url"))`
/// over a Parquet, read by a map UDF; the file column after the UDF carries
/// the size and etag of the first response. Bad strings and nulls: a null URL
/// is a null `File` (its row kept, the UDF's output null), a string that is
/// no URL fails its row under each `on_error`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_api_reads_urls_and_pins_size_and_etag() {
    let s3 = S3Server::start();
    let http_dir = tempfile::tempdir().expect("dir");
    let http = HttpFiles::start(http_dir.path().to_path_buf());
    let (urls, want) = url_table(&s3, &http, http_dir.path(), 40, 1_000);
    let work = tempfile::tempdir().expect("dir");
    let session = udfchain::Session::with_settings(s3.settings().root(work.path().join("root")));

    let rows: Vec<UrlRow> = urls
        .iter()
        .enumerate()
        .map(|(i, u)| UrlRow {
            id: i as i64,
            file: Some(File::from_url(u.as_deref().expect("url")).expect("a URL")),
        })
        .collect();
    let size = |f: File| async move { f.read().await.map(|b| b.len() as u64) };
    let out: Vec<Pinned> = Chain::from_values_in(Arc::clone(&session), &rows)
        .map("n", size)
        .to_rows()
        .await
        .expect("run");
    assert_eq!(out.len(), 40);
    for r in &out {
        let f = r.file.as_ref().expect("file");
        let i = r.id as usize;
        assert_eq!(r.n, Some(content(i, 64 + i % 300).len() as u64));
        assert_eq!(f.size, r.n.expect("n"), "size pinned from the response");
        assert!(f.etag.is_some(), "etag pinned from the response: {f:?}");
        assert_eq!(f.url(), urls[i].clone().expect("url"));
    }

    // The same through an expression over a Parquet column of URLs, with a
    // null and two strings that are no URLs.
    let mut mixed = urls.clone();
    mixed.extend([None, Some("img/1.jpg".into()), Some("ftp://h/x".into())]);
    let parquet = work.path().join("urls.parquet");
    write_urls(&parquet, &mixed);
    let run = |policy: OnError| {
        let session = Arc::clone(&session);
        let parquet = parquet.display().to_string();
        async move {
            Chain::from_parquet(&parquet)
                .in_session(session)
                .settings(Settings::new().on_error(policy))
                .mutate("file", file_from_url(col("url")))
                .map("n", |f: Option<File>| async move {
                    match f {
                        Some(f) => f.read().await.map(|b| Some(b.len() as u64)),
                        None => Ok(None),
                    }
                })
                .select([col("id"), col("file"), col("n")])
                .collect_with_report()
                .await
        }
    };
    let (batches, report) = run(OnError::Skip).await.expect("skip");
    let out: Vec<Pinned> = decode(&batches);
    assert_eq!(out.len(), want.len() + 1, "the null URL's row is kept");
    assert!(
        out.iter()
            .any(|r| r.id == 40 && r.file.is_none() && r.n.is_none())
    );
    // A prefetch lists failed downloads as they fail: in no fixed order.
    let mut skipped = report.skipped.clone();
    skipped.sort();
    assert_eq!(skipped, vec!["ftp://h/x", "img/1.jpg"]);
    let (batches, _) = run(OnError::Null).await.expect("null");
    let out: Vec<Pinned> = decode(&batches);
    assert_eq!(out.len(), 43);
    assert_eq!(out.iter().filter(|r| r.n.is_none()).count(), 3);
    let err = run(OnError::Fail).await.expect_err("fail").to_string();
    assert!(
        err.contains("img/1.jpg") && err.contains("no scheme"),
        "names the string and why: {err}"
    );
}

/// An object rewritten after its first GET (inside the first UDF) is caught
/// by the etag that GET pinned when the next UDF's prefetch reads it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_changed_after_its_first_get_is_caught_by_the_pinned_etag() {
    let s3 = S3Server::start();
    let http_dir = tempfile::tempdir().expect("dir");
    let http = HttpFiles::start(http_dir.path().to_path_buf());
    let work = tempfile::tempdir().expect("dir");
    let session = udfchain::Session::with_settings(s3.settings().root(work.path().join("root")));
    for (dir, url) in [
        (s3.bucket_dir(), format!("s3://{BUCKET}/x/obj.bin")),
        (
            http_dir.path().to_path_buf(),
            format!("{}/x/obj.bin", http.url),
        ),
    ] {
        let path = dir.join("x/obj.bin");
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(&path, b"first version").expect("write");
        let rows = vec![UrlRow {
            id: 0,
            file: Some(File::from_url(&url).expect("url")),
        }];
        let rewrite = path.clone();
        let err = Chain::from_values_in(Arc::clone(&session), &rows)
            .settings(Settings::new().prefetch(1))
            .map("a", move |f: File| {
                let rewrite = rewrite.clone();
                async move {
                    let first = f.read().await?;
                    // A new file renamed over the old: a new etag.
                    let tmp = rewrite.with_extension("new");
                    std::fs::write(&tmp, b"a second, longer version").expect("write");
                    std::fs::rename(&tmp, &rewrite).expect("rename");
                    Ok::<_, udfchain::udfs::UdfError>(first.len() as u64)
                }
            })
            .map_on(&["file"], "b", |f: File| async move {
                f.read().await.map(|b| b.len() as u64)
            })
            .collect()
            .await
            .expect_err("the second read must not see another version")
            .to_string();
        assert!(err.contains("changed since"), "{url}: {err}");
    }
}

/// Stores are opened on demand, one per scheme and host (two HTTP servers on
/// two ports, the S3 bucket), with the session's storage options; none is
/// registered before the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_for_two_hosts_are_built_on_demand() {
    let s3 = S3Server::start();
    let dirs = [
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    ];
    let servers: Vec<HttpFiles> = dirs
        .iter()
        .map(|d| HttpFiles::start(d.path().to_path_buf()))
        .collect();
    let mut rows = Vec::new();
    for (k, (dir, server)) in dirs.iter().zip(&servers).enumerate() {
        for i in 0..5 {
            std::fs::write(dir.path().join(format!("{i}.bin")), content(i + k, 100)).expect("w");
            let url = format!("{}/{i}.bin", server.url);
            rows.push(UrlRow {
                id: rows.len() as i64,
                file: Some(File::from_url(&url).expect("url")),
            });
        }
    }
    std::fs::write(s3.bucket_dir().join("s.bin"), content(9, 100)).expect("w");
    rows.push(UrlRow {
        id: rows.len() as i64,
        file: Some(File::from_url(&format!("s3://{BUCKET}/s.bin")).expect("url")),
    });
    let work = tempfile::tempdir().expect("dir");
    let session = udfchain::Session::with_settings(s3.settings().root(work.path().join("root")));
    let registry = Arc::clone(&session.context().runtime_env().object_store_registry);
    let store_urls: Vec<url::Url> = servers
        .iter()
        .map(|s| url::Url::parse(&s.url).expect("url"))
        .chain([url::Url::parse(&format!("s3://{BUCKET}")).expect("url")])
        .collect();
    for u in &store_urls {
        assert!(
            registry.get_store(u).is_err(),
            "{u} registered before the run"
        );
    }
    let out: Vec<Pinned> = Chain::from_values_in(Arc::clone(&session), &rows)
        .map("n", |f: File| async move {
            f.read().await.map(|b| b.len() as u64)
        })
        .to_rows()
        .await
        .expect("run");
    assert_eq!(out.len(), 11);
    assert!(out.iter().all(|r| r.n == Some(100)));
    for u in &store_urls {
        assert!(registry.get_store(u).is_ok(), "{u} opened on demand");
    }
    assert_eq!(servers[0].gets(), 5);
    assert_eq!(servers[1].gets(), 5);
    assert_eq!(s3.object_gets(), 1);
}

/// Under `cache = true` a file named by URL is pinned by a HEAD and goes
/// through the shared cache as a listed file does: the first run GETs each
/// object once, a second run over the same URLs (a new session on the same
/// cache dir) GETs none and reads the same bytes, and an object rewritten in
/// between is fetched again, only it, at its new version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn urls_under_cache_true_are_fetched_once_across_runs() {
    let s3 = S3Server::start();
    let work = tempfile::tempdir().expect("dir");
    let mut rows = Vec::new();
    for i in 0..60 {
        let key = format!("cached/{i:03}.bin");
        let path = s3.bucket_dir().join(&key);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(&path, content(i, 100 + i)).expect("write");
        let url = format!("s3://{BUCKET}/{key}");
        rows.push(UrlRow {
            id: i as i64,
            file: Some(File::from_url(&url).expect("url")),
        });
    }
    let run = || {
        let session = udfchain::Session::with_settings(
            s3.settings()
                .root(work.path().join("root"))
                .cache(true)
                .prefetch(8),
        );
        let rows = &rows;
        async move {
            let out: Vec<Pinned> = Chain::from_values_in(session, rows)
                .map("n", |f: File| async move {
                    f.read()
                        .await
                        .map(|b| hex_sha256(&b).len() as u64 + b.len() as u64)
                })
                .to_rows()
                .await
                .expect("run");
            let mut out: Vec<(i64, u64, Option<String>, u64)> = out
                .into_iter()
                .map(|r| {
                    let f = r.file.expect("file");
                    (r.id, f.size, f.etag, r.n.expect("n"))
                })
                .collect();
            out.sort();
            out
        }
    };
    let gets = s3.object_gets();
    let first = run().await;
    assert_eq!(s3.object_gets() - gets, 60, "one GET per URL");
    for (id, size, etag, n) in &first {
        let i = *id as usize;
        assert_eq!(*size, (100 + i) as u64, "size pinned by the HEAD");
        assert!(etag.is_some(), "etag pinned by the HEAD");
        assert_eq!(*n, 64 + *size);
    }

    let (gets, requests) = (s3.object_gets(), s3.requests());
    let second = run().await;
    assert_eq!(
        s3.object_gets() - gets,
        0,
        "every URL from the shared cache"
    );
    assert_eq!(
        s3.requests() - requests,
        60,
        "one HEAD per URL, nothing else"
    );
    assert_eq!(second, first);

    let path = s3.bucket_dir().join("cached/007.bin");
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, b"rewritten").expect("write");
    std::fs::rename(&tmp, &path).expect("rename");
    let gets = s3.object_gets();
    let third = run().await;
    assert_eq!(s3.object_gets() - gets, 1, "only the rewritten object");
    let seventh = third.iter().find(|r| r.0 == 7).expect("row 7");
    assert_eq!((seventh.1, seventh.3), (9, 64 + 9));
    assert_ne!(seventh.2, first[7].2, "its new etag");
}
