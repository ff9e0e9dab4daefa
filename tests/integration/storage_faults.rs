//! Storage under change and failure, against real peers: an object rewritten
//! after it was listed is named (or skipped), never read as a mix of two
//! versions; the S3 server stopped and restarted mid-run changes no row; the
//! CLI reaches an `http://` endpoint without `allow_http`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde::Deserialize;
use tokio::io::AsyncReadExt;
use udfchain::{File, OnError, Session, Settings, col};

use udfchain_testkit::{
    ACCESS_KEY, Fault, FaultyStore, S3Server, SECRET_KEY, content, put_files, write_files,
};

/// Replaces the file at `path` by one of the same size with other bytes,
/// written at `tmp` and renamed over it (as a PUT makes a new object: a new
/// ETag on S3, a new inode for the local store).
fn rewrite(path: &Path, tmp: &Path) {
    let old = std::fs::read(path).expect("read the object");
    let new: Vec<u8> = old.iter().map(|b| b.wrapping_add(1)).collect();
    std::fs::write(tmp, new).expect("write the new version");
    std::fs::rename(tmp, path).expect("replace the object");
}

/// Lists `uri`, then (in a first UDF, prefetch 0) rewrites `d1/f0004.bin`
/// below `dir`, then reads every file in a second UDF with prefetch.
fn rewrite_then_read(
    session: &Arc<Session>,
    uri: &str,
    dir: &Path,
    policy: OnError,
) -> udfchain::Chain {
    let (dir, tmp) = (dir.to_path_buf(), dir.with_extension("rewrite-tmp"));
    session
        .from_storage(uri)
        .settings(Settings::new().prefetch(0))
        .map("kept", move |f: File| {
            let (dir, tmp) = (dir.clone(), tmp.clone());
            async move {
                if f.path == "d1/f0004.bin" {
                    rewrite(&dir.join(&f.path), &tmp);
                }
                Ok::<bool, std::io::Error>(true)
            }
        })
        .settings(Settings::new().prefetch(4).on_error(policy))
        .map("sum", |f: File| async move {
            f.read()
                .await
                .map(|b| b.iter().map(|&x| x as u64).sum::<u64>())
        })
}

/// An object rewritten between its listing and its download (on the S3
/// server, honouring `If-Match` as S3 does, and on a local dir): `skip` drops
/// exactly that file without retrying the 412; `fail` names it and says it
/// changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_rewritten_after_listing_is_skipped_or_named() {
    let s3 = S3Server::start();
    let local = tempfile::tempdir().expect("tempdir");
    let local_dir = local.path().join("data");
    let cases: [(Arc<Session>, String, PathBuf); 2] = [
        (s3.session(), "s3://bucket".into(), s3.bucket_dir()),
        (
            Session::new(),
            local_dir.display().to_string(),
            local_dir.clone(),
        ),
    ];
    for (session, uri, dir) in &cases {
        write_files(dir, 6, |i| 100 + i);
        let (batches, report) = rewrite_then_read(session, uri, dir, OnError::Skip)
            .collect_with_report()
            .await
            .unwrap_or_else(|e| panic!("{uri}: skip: {e}"));
        assert_eq!(
            batches.iter().map(|b| b.num_rows()).sum::<usize>(),
            5,
            "{uri}"
        );
        assert_eq!(report.skipped.len(), 1, "{uri}: {:?}", report.skipped);
        assert!(
            report.skipped[0].ends_with("/d1/f0004.bin"),
            "{uri}: {:?}",
            report.skipped
        );
        assert_eq!(
            report.metric("PrefetchExec", "retries"),
            0,
            "{uri}: a changed object is not retried"
        );

        write_files(dir, 6, |i| 100 + i);
        let err = rewrite_then_read(session, uri, dir, OnError::Fail)
            .count()
            .await
            .expect_err("fail");
        let msg = err.to_string();
        assert!(
            msg.contains("/d1/f0004.bin") && msg.contains("changed since it was listed"),
            "{uri}: {msg}"
        );
    }
}

/// Without prefetch a UDF's whole-file read goes to the store (or, with
/// `cache = true`, through the shared cache's read-through download): both
/// ask for the listed ETag, so an object rewritten after listing fails the
/// read, naming the file, instead of returning the new bytes for the old
/// listing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_without_prefetch_are_pinned_to_the_listing() {
    let s3 = S3Server::start();
    let bucket = s3.bucket_dir();
    for cache in [false, true] {
        write_files(&bucket, 6, |i| 100 + i);
        let root = tempfile::tempdir().expect("root");
        let session = Session::with_settings(s3.settings().root(root.path()));
        let (dir, tmp) = (bucket.clone(), s3.root_dir().join("pinned.tmp"));
        let err = session
            .from_storage("s3://bucket")
            .settings(Settings::new().prefetch(0))
            .map("kept", move |f: File| {
                let (dir, tmp) = (dir.clone(), tmp.clone());
                async move {
                    if f.path == "d1/f0004.bin" {
                        rewrite(&dir.join(&f.path), &tmp);
                    }
                    Ok::<bool, std::io::Error>(true)
                }
            })
            .settings(Settings::new().prefetch(0).cache(cache))
            .map("len", |f: File| async move {
                f.read().await.map(|b| b.len() as u64)
            })
            .count()
            .await
            .expect_err("the rewritten file fails");
        let msg = err.to_string();
        assert!(
            msg.contains("s3://bucket/d1/f0004.bin") && msg.contains("changed since it was listed"),
            "cache {cache}: {msg}"
        );
    }
}

/// A rewrite between two range reads of one `File::open` reader (no
/// prefetch: the reader fetches 64 KiB, then the rest) is an error naming the
/// file, never the first bytes of one version and the rest of another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_reader_never_mixes_two_versions() {
    let s3 = S3Server::start();
    let bucket = s3.bucket_dir();
    std::fs::write(bucket.join("big.bin"), content(7, 300 << 10)).expect("write");
    let tmp = s3.root_dir().join("big.tmp");
    let err = s3
        .session()
        .from_storage("s3://bucket")
        .settings(Settings::new().prefetch(0))
        .map("all", move |f: File| {
            let (path, tmp) = (bucket.join(&f.path), tmp.clone());
            async move {
                let mut reader = f.open().await.map_err(std::io::Error::other)?;
                let mut bytes = vec![0u8; 1024];
                reader.read_exact(&mut bytes).await?;
                rewrite(&path, &tmp);
                reader.read_to_end(&mut bytes).await?;
                Ok::<_, std::io::Error>(bytes)
            }
        })
        .count()
        .await
        .expect_err("a reader of a rewritten object fails");
    let msg = err.to_string();
    assert!(
        msg.contains("s3://bucket/big.bin") && msg.contains("changed since it was listed"),
        "{msg}"
    );
}

/// A download whose body breaks off mid-way, and whose object is rewritten
/// before the resumed range is requested: the resume asks `If-Match` the
/// listed ETag and gets 412, so the file fails ("changed since it was
/// listed") instead of being the first half of one version and the second
/// half of another; the other files are intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_download_never_splices_two_versions() {
    resumed_download_case(false).await;
}

/// The same when the listing carries no ETag: the download pins the ETag of
/// its first response, so the resume still asks `If-Match` and gets 412.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_download_of_a_file_listed_without_etag_never_splices() {
    resumed_download_case(true).await;
}

async fn resumed_download_case(hide_list_etags: bool) {
    let s3 = S3Server::start();
    let bucket = s3.bucket_dir();
    write_files(&bucket, 4, |i| 40_000 + i);
    let inner: Arc<dyn object_store::ObjectStore> = Arc::new(
        object_store::aws::AmazonS3Builder::new()
            .with_endpoint(&s3.endpoint)
            .with_allow_http(true)
            .with_bucket_name(udfchain_testkit::BUCKET)
            .with_access_key_id(ACCESS_KEY)
            .with_secret_access_key(SECRET_KEY)
            .with_region("us-east-1")
            .with_virtual_hosted_style_request(false)
            .build()
            .expect("s3 store"),
    );
    let tmp = s3.root_dir().join("splice.tmp");
    let victim = bucket.join("d1/f0001.bin");
    let victim_gets = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&victim_gets);
    let fault = move |key: &str, attempt: usize| match (key, attempt) {
        ("d1/f0001.bin", _) if counted.fetch_add(1, Ordering::SeqCst) > 1 => Fault::None,
        ("d1/f0001.bin", 0) => Fault::MidBody,
        ("d1/f0001.bin", 1) => {
            rewrite(&victim, &tmp);
            Fault::None
        }
        _ => Fault::None,
    };
    let store = if hide_list_etags {
        FaultyStore::hiding_list_etags(inner, |_| Duration::ZERO, fault)
    } else {
        FaultyStore::new(inner, |_| Duration::ZERO, fault)
    };
    let session = s3.session();
    session
        .register_store("s3://bucket", store as _)
        .expect("register");
    let (batches, report) = session
        .from_storage("s3://bucket")
        .settings(Settings::new().prefetch(2).on_error(OnError::Skip))
        .map("sum", |f: File| async move {
            f.read()
                .await
                .map(|b| b.iter().map(|&x| x as u64).sum::<u64>())
        })
        .select([col("file.path").alias("path"), col("sum")])
        .collect_with_report()
        .await
        .expect("run");
    assert_eq!(report.skipped, vec!["s3://bucket/d1/f0001.bin".to_string()]);
    assert_eq!(
        victim_gets.load(Ordering::SeqCst),
        2,
        "the broken body was resumed once, the 412 not retried"
    );
    let rows: Vec<SumRow> = batches
        .iter()
        .flat_map(|b| {
            let params = ["path".to_string(), "sum".to_string()];
            udfchain::udfs::decode_rows::<SumRow>(b, &params).expect("rows")
        })
        .collect();
    let mut got: Vec<(String, u64)> = rows.into_iter().map(|r| (r.path, r.sum)).collect();
    got.sort();
    let mut want: Vec<(String, u64)> = [0usize, 2, 3]
        .iter()
        .map(|&i| {
            let sum = content(i, 40_000 + i).iter().map(|&x| x as u64).sum();
            (format!("d{}/f{i:04}.bin", i % 3), sum)
        })
        .collect();
    want.sort();
    assert_eq!(got, want);
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
struct SumRow {
    path: String,
    sum: u64,
}

/// Rows `(path, byte sum)` of every file under `s3://bucket`, read with
/// `prefetch`; `hook` runs before each read.
async fn sums(
    session: &Arc<Session>,
    prefetch: usize,
    hook: impl Fn() + Send + Sync + 'static,
) -> Vec<SumRow> {
    let hook = Arc::new(hook);
    let mut rows: Vec<SumRow> = session
        .from_storage("s3://bucket")
        .settings(Settings::new().prefetch(prefetch).parallel(2))
        .map("sum", move |f: File| {
            let hook = Arc::clone(&hook);
            async move {
                hook();
                f.read()
                    .await
                    .map(|b| b.iter().map(|&x| x as u64).sum::<u64>())
            }
        })
        .select([col("file.path").alias("path"), col("sum")])
        .to_rows()
        .await
        .unwrap_or_else(|e| panic!("prefetch {prefetch}: {e}"));
    rows.sort();
    rows
}

/// Stops `s3` and starts it again on the same address about 1 s later (on
/// another thread, returned).
fn outage(s3: &Arc<S3Server>) -> std::thread::JoinHandle<()> {
    s3.stop();
    let addr = s3.endpoint.trim_start_matches("http://");
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "stopped: connections are refused"
    );
    let s3 = Arc::clone(s3);
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(1));
        s3.restart();
    })
}

/// LIST requests the server answered so far.
fn lists(s3: &S3Server) -> usize {
    s3.requests() - s3.object_gets()
}

/// Runs a chain over `n` files of `size(i)` bytes on the S3 server, clean,
/// then once per `prefetch` with an [`outage`] when the UDF reaches row
/// `stop_at` (connections and downloads in flight cut, new connections
/// refused; `None`: before the run starts, so the first LIST is refused);
/// every faulty run's rows must equal the clean run's. Returns the LISTs
/// answered by each faulty run before its outage and in all.
async fn restart_mid_run(
    n: usize,
    size: fn(usize) -> usize,
    stop_at: Option<usize>,
    prefetches: &[usize],
) -> Vec<(usize, usize)> {
    let s3 = Arc::new(S3Server::start());
    write_files(&s3.bucket_dir(), n, size);
    let session = s3.session();
    let started = std::time::Instant::now();
    let clean = sums(&session, 8, || {}).await;
    eprintln!("clean run took {:?}", started.elapsed());
    assert_eq!(clean.len(), n);
    let mut listed = Vec::new();
    for &prefetch in prefetches {
        let lists_before = lists(&s3);
        let seen = Arc::new(AtomicUsize::new(0));
        let restarter = Arc::new(std::sync::Mutex::new(None));
        let at_stop = Arc::new(AtomicUsize::new(0));
        let hook = {
            let (s3, seen, restarter, at_stop) = (
                Arc::clone(&s3),
                Arc::clone(&seen),
                Arc::clone(&restarter),
                Arc::clone(&at_stop),
            );
            move || {
                if Some(seen.fetch_add(1, Ordering::SeqCst)) == stop_at {
                    at_stop.store(lists(&s3), Ordering::SeqCst);
                    *restarter.lock().expect("lock") = Some(outage(&s3));
                }
            }
        };
        if stop_at.is_none() {
            at_stop.store(lists(&s3), Ordering::SeqCst);
            *restarter.lock().expect("lock") = Some(outage(&s3));
        }
        let started = std::time::Instant::now();
        let got = sums(&session, prefetch, hook).await;
        eprintln!(
            "prefetch {prefetch}: run with a restart took {:?}",
            started.elapsed()
        );
        let handle = restarter.lock().expect("lock").take();
        handle
            .expect("the server was stopped")
            .join()
            .expect("restart");
        assert_eq!(got, clean, "prefetch {prefetch}");
        listed.push((
            at_stop.load(Ordering::SeqCst) - lists_before,
            lists(&s3) - lists_before,
        ));
    }
    listed
}

/// The server restarted while files are downloaded (prefetch: bodies cut
/// and resumed, requests refused and retried) and while read directly (no
/// prefetch): no row lost or changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_s3_server_restarted_mid_run_changes_no_row() {
    restart_mid_run(300, |i| 20_000 + i * 7, Some(60), &[8, 0]).await;
}

/// The server down when a listing of two pages starts: its first LIST is
/// refused and retried until the server is back; no row lost or repeated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_s3_server_down_when_the_listing_starts_changes_no_row() {
    let listed = restart_mid_run(1_100, |i| 16 + i % 7, None, &[8]).await;
    assert_eq!(listed, [(0, 2)], "both pages listed after the restart");
}

/// A store that refuses every GET for 1.5 s and does not retry by itself
/// (as a restarting server looks through a plain client): the downloads'
/// own retries span the gap, and the rows equal a clean run's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downloads_ride_out_a_gap_in_a_store_that_does_not_retry() {
    let inner = Arc::new(object_store::memory::InMemory::new());
    put_files(inner.as_ref(), "", 20, |i| 1000 + i * 3).await;
    let down_until = Arc::new(std::sync::Mutex::new(std::time::Instant::now()));
    let until = Arc::clone(&down_until);
    let store = FaultyStore::new(
        inner,
        |_| Duration::ZERO,
        move |_, _| {
            if std::time::Instant::now() < *until.lock().expect("lock") {
                Fault::Request
            } else {
                Fault::None
            }
        },
    );
    let session = Session::new();
    session
        .register_store("memory://gap", store as _)
        .expect("register");
    let run = || async {
        let mut rows: Vec<SumRow> = session
            .from_storage("memory://gap/")
            .settings(Settings::new().prefetch(8))
            .map("sum", |f: File| async move {
                f.read()
                    .await
                    .map(|b| b.iter().map(|&x| x as u64).sum::<u64>())
            })
            .select([col("file.path").alias("path"), col("sum")])
            .to_rows()
            .await
            .expect("run");
        rows.sort();
        rows
    };
    let clean = run().await;
    assert_eq!(clean.len(), 20);
    *down_until.lock().expect("lock") = std::time::Instant::now() + Duration::from_millis(1500);
    assert_eq!(run().await, clean);
}

/// `--set storage.endpoint=http://...` without `allow_http`: the CLI lists and
/// reads the loopback S3 server (plain HTTP is allowed because the user gave an
/// http:// endpoint); with `allow_http=false` it says which setting to change.
#[test]
fn the_cli_reaches_an_http_endpoint_without_allow_http() {
    let s3 = S3Server::start();
    write_files(&s3.bucket_dir(), 3, |i| 10 + i);
    let root = tempfile::tempdir().expect("root");
    let run = |extra: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_udfchain"));
        cmd.arg("--root").arg(root.path());
        for (k, _) in std::env::vars() {
            if k.starts_with("AWS_") {
                cmd.env_remove(k);
            }
        }
        cmd.env("AWS_METADATA_ENDPOINT", "http://127.0.0.1:1");
        let settings = [
            format!("storage.endpoint={}", s3.endpoint),
            format!("storage.access_key_id={ACCESS_KEY}"),
            format!("storage.secret_access_key={SECRET_KEY}"),
            "storage.region=us-east-1".to_string(),
            "storage.virtual_hosted_style_request=false".to_string(),
        ];
        for s in &settings {
            cmd.args(["--set", s]);
        }
        cmd.args(extra);
        cmd.args([
            "query",
            "SELECT file.path AS path, file_size(file) AS size, sha256(file) AS sha \
             FROM read_storage('s3://bucket') ORDER BY path",
            "--format",
            "csv",
        ]);
        cmd.output().expect("run udfchain")
    };
    let out = run(&[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{stdout}");
    for (i, line) in lines[1..].iter().enumerate() {
        let want = format!("d{}/f{i:04}.bin,{},", i % 3, 10 + i);
        assert!(line.starts_with(&want), "{line} vs {want}");
        assert_eq!(line.len(), want.len() + 64, "a sha256: {line}");
    }

    let out = run(&["--set", "storage.allow_http=false"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("storage.allow_http=true") && !stderr.contains("builder error"),
        "{stderr}"
    );
}

/// Python's `http.server` (a real process) serving `dir` on 127.0.0.1: no
/// WebDAV (`PROPFIND` is 501), no `Range` (a ranged GET gets the whole
/// file). Its request log (stderr) is kept to count requests.
struct PythonHttp {
    child: std::process::Child,
    url: String,
    log: PathBuf,
}

impl PythonHttp {
    async fn start(dir: &Path, log: PathBuf) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let child = Command::new("python3")
            .args(["-m", "http.server", "--bind", "127.0.0.1"])
            .arg(port.to_string())
            .arg("--directory")
            .arg(dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("python3 -m http.server");
        // Killed and reaped when dropped, also if it does not start.
        let server = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
            log,
        };
        for _ in 0..200 {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return server;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("python3 -m http.server did not start on port {port}");
    }

    /// Requests logged whose request line starts with `method`.
    fn requests(&self, method: &str) -> usize {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        log.matches(&format!("\"{method} /")).count()
    }
}

impl Drop for PythonHttp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A server without `PROPFIND` or `Range` answers 501 (or ignores the
/// range). A listing is one `PROPFIND` (a 501 is not retried) and an error
/// saying listing needs WebDAV, not object_store's error with the server's
/// HTML page; a ranged read is one GET, failing with an error saying reads
/// need `Range`; a whole read still works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_http_server_is_asked_once_and_the_error_says_what_it_lacks() {
    let dir = tempfile::tempdir().expect("dir");
    std::fs::write(dir.path().join("a.bin"), content(0, 100)).expect("write");
    let server = PythonHttp::start(dir.path(), dir.path().join("requests.log")).await;

    let listed = Session::new()
        .from_storage(&format!("{}/", server.url))
        .collect()
        .await
        .expect_err("no WebDAV: no listing");
    let text = listed.to_string();
    assert!(text.contains("PROPFIND") && text.contains("501"), "{text}");
    assert!(text.contains("WebDAV"), "{text}");
    assert!(
        !text.contains("<html") && !text.contains("<!DOCTYPE"),
        "{text}"
    );
    assert_eq!(server.requests("PROPFIND"), 1, "no retry of a 501: {text}");

    #[derive(serde::Serialize, serde::Deserialize)]
    struct Row {
        file: File,
    }
    let rows = [Row {
        file: File {
            source: server.url.clone(),
            path: "a.bin".into(),
            size: 100,
            ..File::default()
        },
    }];
    let chain = |range: bool| {
        udfchain::Chain::from_values(&rows)
            .settings(Settings::new().prefetch(0))
            .map("n", move |f: File| async move {
                let bytes = if range {
                    f.read_range(10..20).await?
                } else {
                    f.read().await?
                };
                Ok::<u64, udfchain::udfs::UdfError>(bytes.len() as u64)
            })
    };
    let whole = chain(false)
        .collect()
        .await
        .expect("a whole read needs no Range");
    assert_eq!(whole.iter().map(|b| b.num_rows()).sum::<usize>(), 1);
    let gets = server.requests("GET");
    let ranged = chain(true).collect().await.expect_err("no Range");
    let text = ranged.to_string();
    assert!(text.contains("Range"), "{text}");
    assert_eq!(
        server.requests("GET") - gets,
        1,
        "one GET, no retry: {text}"
    );
}
