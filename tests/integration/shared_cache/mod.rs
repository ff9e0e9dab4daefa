//! The shared persistent cache, on real files and through runs: what makes an
//! entry, reads through it (reruns download nothing, `cache = false` still
//! reads what it holds), one download per key for concurrent callers (threads,
//! handles, queries, processes), the size limit and the pins that survive it,
//! a writer killed mid-download, a four-process stress run on one dir, and the
//! per-UDF temp cache next to it. One file per behaviour; the helpers they
//! share are here.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use object_store::memory::InMemory;
use serde::Deserialize;
use udfchain::{Error, File, Session, Settings, col};

use udfchain_testkit::{CountingStore, put_files};

mod entries;
mod killed_writer;
mod pruning;
mod read_through;
mod single_flight;
mod stress;
mod temp_cache;

fn file(i: usize, size: u64) -> File {
    File {
        source: "memory:///cache-test".into(),
        path: format!("dir/f{i}.bin"),
        size,
        etag: Some(format!("\"etag-{i}\"")),
        ..Default::default()
    }
}

fn content(i: usize, size: u64) -> Vec<u8> {
    (0..size as usize)
        .map(|j| ((i * 31 + j * 7) % 251) as u8)
        .collect()
}

fn io_error(path: &Path, e: std::io::Error) -> Error {
    Error::Io {
        path: path.display().to_string(),
        source: Arc::new(e),
    }
}

/// A fetch that counts its calls, waits `delay`, then writes `bytes` to the temp path.
fn fetcher(
    calls: &Arc<AtomicUsize>,
    bytes: Vec<u8>,
    delay: Duration,
) -> impl FnOnce(PathBuf) -> futures::future::BoxFuture<'static, udfchain::Result<()>> + use<> {
    let calls = Arc::clone(calls);
    move |tmp: PathBuf| {
        Box::pin(async move {
            calls.fetch_add(1, Ordering::SeqCst);
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            tokio::fs::write(&tmp, &bytes)
                .await
                .map_err(|e| io_error(&tmp, e))
        })
    }
}

/// Every file under `dir`, recursively.
fn all_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir") {
            let p = e.expect("dir entry").path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

fn temp_files(dir: &Path) -> Vec<PathBuf> {
    all_files(dir)
        .into_iter()
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(".tmp-"))
        })
        .collect()
}

/// How many children wrote their `<go>.<pid>` ready marker.
fn ready_children(go: &Path) -> usize {
    let (Some(dir), Some(name)) = (go.parent(), go.file_name().and_then(|n| n.to_str())) else {
        return 0;
    };
    let prefix = format!("{name}.");
    std::fs::read_dir(dir)
        .expect("read_dir")
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        })
        .count()
}

/// A store of `n` files of `size` bytes (`udfchain_testkit::content`), counting GETs.
async fn counted_store(n: usize, size: usize) -> Arc<CountingStore> {
    let inner = Arc::new(InMemory::new());
    put_files(inner.as_ref(), "", n, |_| size).await;
    CountingStore::new(inner)
}

/// Runs a map UDF over `uri` that checks every file's bytes against
/// `udfchain_testkit::content` (by the number in its name); returns the rows.
async fn checked_run(
    session: &Arc<udfchain::Session>,
    uri: &str,
    settings: udfchain::Settings,
) -> usize {
    let batches = session
        .from_storage(uri)
        .settings(settings)
        .map("ok", |f: File| async move {
            let bytes = f.read().await?;
            let i: usize = f
                .name()
                .trim_start_matches('f')
                .trim_end_matches(".bin")
                .parse()
                .expect("file number");
            Ok::<_, udfchain::udfs::UdfError>(
                bytes.as_ref() == udfchain_testkit::content(i, bytes.len()).as_slice()
                    && bytes.len() as u64 == f.size,
            )
        })
        .collect()
        .await
        .expect("run");
    let mut rows = 0;
    for b in &batches {
        let ok = b
            .column_by_name("ok")
            .expect("ok column")
            .as_any()
            .downcast_ref::<udfchain::datafusion::arrow::array::BooleanArray>()
            .expect("bool");
        assert_eq!(ok.true_count(), ok.len(), "a file read back wrong");
        rows += b.num_rows();
    }
    rows
}

/// A child process of this test binary running the ignored test `test`, killed
/// (SIGKILL) and reaped when dropped.
struct ChildTest(Option<std::process::Child>);

impl ChildTest {
    fn spawn(test: &str, envs: &[(&str, &std::ffi::OsStr)]) -> Self {
        let exe = std::env::current_exe().expect("current exe");
        let mut cmd = Command::new(exe);
        cmd.args(["--exact", test, "--ignored", "--nocapture"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in envs {
            cmd.env(k, v);
        }
        Self(Some(cmd.spawn().expect("spawn child")))
    }

    /// Sends SIGKILL and reaps the child; returns its exit status.
    fn kill(&mut self) -> std::process::ExitStatus {
        let mut child = self.0.take().expect("child");
        child.kill().expect("SIGKILL");
        child.wait().expect("wait child")
    }

    /// Waits for the child to exit and returns its output.
    async fn output(mut self) -> std::process::Output {
        let child = self.0.take().expect("child");
        tokio::task::spawn_blocking(move || child.wait_with_output().expect("wait child"))
            .await
            .expect("join")
    }
}

impl Drop for ChildTest {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Waits (up to 20 s) until `ready()`.
async fn wait_until(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ready() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// An S3 client of the loopback test server.
fn s3_store(endpoint: &str) -> Arc<dyn object_store::ObjectStore> {
    use udfchain_testkit::{ACCESS_KEY, BUCKET, SECRET_KEY};
    Arc::new(
        object_store::aws::AmazonS3Builder::new()
            .with_endpoint(endpoint)
            .with_allow_http(true)
            .with_access_key_id(ACCESS_KEY)
            .with_secret_access_key(SECRET_KEY)
            .with_region("us-east-1")
            .with_bucket_name(BUCKET)
            .with_virtual_hosted_style_request(false)
            .build()
            .expect("s3 store"),
    )
}

/// Pseudo-random bytes (xorshift64*) seeded by `seed`.
fn random_bytes(seed: u64, size: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(size + 8);
    while out.len() < size {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(size);
    out
}

/// Downloads `file` (at `path` of `store`) into the cache's temp file.
async fn download_into(
    store: &Arc<dyn object_store::ObjectStore>,
    path: &str,
    file: &File,
    tmp: PathBuf,
) -> udfchain::Result<()> {
    let path = object_store::path::Path::from(path);
    udfchain::testing::download_to(store, &path, file, &tmp)
        .await
        .map(|_| ())
}

/// A session whose `memory://<name>` is a [`counted_store`] of `n` files.
async fn counted(name: &str, n: usize, size: usize) -> (Arc<Session>, Arc<CountingStore>) {
    let store = counted_store(n, size).await;
    let session = Session::new();
    session
        .register_store(&format!("memory://{name}"), Arc::clone(&store) as _)
        .expect("register");
    (session, store)
}

/// A row of [`sums`]: a file and the sum of its bytes.
#[derive(Debug, PartialEq, Deserialize)]
struct Sum {
    path: String,
    sum: u64,
}

/// Runs a map UDF summing each file's bytes over `uri`; the rows by path and
/// the run's report.
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
