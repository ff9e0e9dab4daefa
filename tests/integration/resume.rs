//! Resumable saves: a save killed (SIGKILL of the CLI, from the loopback S3
//! server) or failed (a UDF failing on one row under `on_error = fail`)
//! continues from its checkpoint when run again — no call and no GET for a
//! row already kept, the dataset equal to an uninterrupted run's, row for
//! row — while a new UDF version, `checkpoints = false`, `--fresh` and
//! `udfchain datasets gc` start over.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde::Deserialize;
use sha2::{Digest, Sha256};
use udfchain::{Chain, File, Settings, col};

use udfchain_testkit::{S3Server, stdout_ok};

/// Rows per chunk a memo writes (`plan::memo::CHUNK_ROWS`).
const CHUNK_ROWS: usize = 512;

/// The chunk files of every checkpoint under `root`.
fn chunk_files(root: &Path) -> Vec<std::path::PathBuf> {
    let Ok(saves) = std::fs::read_dir(root.join("checkpoints")) else {
        return Vec::new();
    };
    saves
        .flatten()
        .filter_map(|save| std::fs::read_dir(save.path()).ok())
        .flatten()
        .flatten()
        .filter_map(|udf| std::fs::read_dir(udf.path()).ok())
        .flatten()
        .flatten()
        .filter(|f| f.file_name().to_string_lossy().starts_with("chunk-"))
        .map(|f| f.path())
        .collect()
}

fn kept_chunks(root: &Path) -> usize {
    chunk_files(root).len()
}

/// The rows kept in the chunks of every checkpoint under `root`.
fn kept_rows(root: &Path) -> usize {
    chunk_files(root)
        .iter()
        .map(|path| {
            let file = std::fs::File::open(path).expect("open a chunk");
            datafusion::arrow::ipc::reader::FileReader::try_new(file, None)
                .expect("a whole chunk")
                .map(|b| b.expect("a batch").num_rows())
                .sum::<usize>()
        })
        .sum()
}

fn checkpoint_dirs(root: &Path) -> usize {
    std::fs::read_dir(root.join("checkpoints"))
        .map(|d| d.flatten().count())
        .unwrap_or(0)
}

const SAVE: &str = "CREATE DATASET hashes AS \
    SELECT file.path AS path, sha256(file) AS h FROM read_storage('s3://bucket/files/')";

fn cli(server: &S3Server, root: &Path, extra: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_udfchain"));
    cmd.arg("--root").arg(root);
    for (k, v) in [
        ("endpoint", server.endpoint.as_str()),
        ("allow_http", "true"),
        ("access_key_id", udfchain_testkit::ACCESS_KEY),
        ("secret_access_key", udfchain_testkit::SECRET_KEY),
        ("region", "us-east-1"),
        ("virtual_hosted_style_request", "false"),
    ] {
        cmd.arg("--set").arg(format!("storage.{k}={v}"));
    }
    cmd.args(extra)
        .env("AWS_METADATA_ENDPOINT", "http://127.0.0.1:1")
        .env_remove("CI");
    cmd
}

/// Starts the save and kills it with SIGKILL once its checkpoint holds
/// `chunks` chunk files; the GETs it made.
fn save_killed_at(server: &S3Server, root: &Path, chunks: usize) -> usize {
    let before = server.object_gets();
    let mut child: Child = cli(server, root, &["query", SAVE])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the CLI");
    let deadline = Instant::now() + Duration::from_secs(300);
    while kept_chunks(root) < chunks {
        assert!(
            child.try_wait().expect("poll").is_none(),
            "the save ended before its checkpoint held {chunks} chunks"
        );
        assert!(Instant::now() < deadline, "no progress in 300 s");
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
    settled_gets(server) - before
}

/// The server's GET count once requests a killed client sent before it died
/// (still in the server's socket buffers) have been counted.
fn settled_gets(server: &S3Server) -> usize {
    let mut last = server.object_gets();
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let now = server.object_gets();
        if now == last {
            return now;
        }
        last = now;
    }
}

#[derive(Debug, Deserialize, PartialEq)]
struct Hash {
    path: String,
    h: String,
}

#[test]
fn a_cli_save_killed_twice_continues_with_a_get_for_each_row_not_kept() {
    const N: usize = 20_000;
    let server = S3Server::start();
    let dir = server.bucket_dir().join("files");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let mut want = Vec::with_capacity(N);
    for i in 0..N {
        let (name, body) = (format!("f-{i:05}.bin"), format!("file {i}"));
        std::fs::write(dir.join(&name), &body).expect("write");
        want.push(Hash {
            path: name.clone(),
            h: format!("{:x}", Sha256::digest(body.as_bytes())),
        });
    }
    let root = tempfile::tempdir().expect("root");
    let first = save_killed_at(&server, root.path(), 3);
    let kept_first = kept_chunks(root.path());
    let second = save_killed_at(&server, root.path(), kept_first + 8);
    let kept = kept_rows(root.path());
    assert!(kept < N, "the kills came too late to test anything");

    let before = server.object_gets();
    let out = cli(&server, root.path(), &["query", SAVE])
        .output()
        .expect("run the CLI");
    stdout_ok(&out);
    let last = server.object_gets() - before;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let reused: usize = stderr
        .split(" rows from a checkpoint")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no checkpoint in the summary: {stderr}"));
    assert_eq!(reused, kept, "every row kept is reused: {stderr}");
    assert_eq!(
        last,
        N - reused,
        "a GET for each row not kept, and no other (kept {reused})"
    );
    // A kill loses at most the chunk being filled and the downloads in flight.
    let in_flight = 128 + 8;
    assert!(
        first + second + last <= N + 2 * (CHUNK_ROWS + in_flight),
        "GETs {first} + {second} + {last} for {N} files"
    );
    assert_eq!(
        checkpoint_dirs(root.path()),
        0,
        "a commit removes its checkpoint"
    );

    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let got: Vec<Hash> = rt.block_on(async {
        Chain::from_dataset("hashes")
            .settings(Settings::new().root(root.path()))
            .to_rows()
            .await
            .expect("read the dataset")
    });
    assert_eq!(got.len(), want.len());
    if let Some(i) = (0..N).find(|&i| got[i] != want[i]) {
        panic!(
            "row {i} differs from an uninterrupted run's: {:?} != {:?}",
            got[i], want[i]
        );
    }
}

/// Local files `f-0000.txt`... holding their number.
fn numbered_files(n: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("data");
    for i in 0..n {
        std::fs::write(dir.path().join(format!("f-{i:04}.txt")), i.to_string()).expect("write");
    }
    dir
}

#[derive(Debug, Deserialize, PartialEq)]
struct Doubled {
    path: String,
    twice: u64,
}

/// The chain `path, twice` over `data`, whose map counts its calls in
/// `calls` and fails on file 1500 while `broken` is set.
fn doubling(
    data: &Path,
    root: &Path,
    calls: &Arc<AtomicUsize>,
    broken: &Arc<AtomicBool>,
    settings: Settings,
) -> Chain {
    let (calls, broken) = (Arc::clone(calls), Arc::clone(broken));
    Chain::from_storage(data.to_str().expect("utf8"))
        .settings(Settings::new().root(root).parallel(4).merge(&settings))
        .map("twice", move |f: File| {
            let (calls, broken) = (Arc::clone(&calls), Arc::clone(&broken));
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                let n: u64 =
                    String::from_utf8_lossy(&f.read().await.map_err(std::io::Error::other)?)
                        .trim()
                        .parse()
                        .map_err(std::io::Error::other)?;
                if n == 1500 && broken.load(Ordering::SeqCst) {
                    return Err(std::io::Error::other("file 1500 is broken"));
                }
                Ok::<_, std::io::Error>(2 * n)
            }
        })
}

/// Resets `calls` once the calls of a run that just failed have settled: a
/// UDF call that was already running when the save returned its error ends
/// on the UDF pool a little later, and must not count for the next run.
async fn reset_when_settled(calls: &AtomicUsize) {
    let mut last = calls.load(Ordering::SeqCst);
    let mut stable = 0;
    while stable < 3 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = calls.load(Ordering::SeqCst);
        stable = if now == last { stable + 1 } else { 0 };
        last = now;
    }
    calls.store(0, Ordering::SeqCst);
}

fn doubled(chain: Chain) -> Chain {
    chain.select([col("file.path").alias("path"), col("twice")])
}

/// Saves `chain` as `name`; the rows its checkpoint held at the start.
async fn save_counting_kept(chain: Chain, name: &str) -> udfchain::Result<usize> {
    let mut kept = 0;
    chain
        .save_with_progress(name, |p| {
            kept = kept.max(p.udfs.first().map_or(0, |u| u.kept));
        })
        .await?;
    Ok(kept)
}

async fn rows(root: &Path, name: &str) -> Vec<Doubled> {
    Chain::from_dataset(name)
        .settings(Settings::new().root(root))
        .to_rows()
        .await
        .expect("read")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_udf_fixed_after_failing_on_one_row_is_called_only_for_the_rows_not_kept() {
    const N: usize = 2000;
    let data = numbered_files(N);
    let root = tempfile::tempdir().expect("root");
    let calls = Arc::new(AtomicUsize::new(0));
    let broken = Arc::new(AtomicBool::new(true));
    let chain = || {
        doubled(doubling(
            data.path(),
            root.path(),
            &calls,
            &broken,
            Settings::new(),
        ))
    };
    let err = chain().save("doubled").await.expect_err("file 1500 fails");
    assert!(err.to_string().contains("file 1500 is broken"), "{err}");
    assert!(
        checkpoint_dirs(root.path()) == 1,
        "a failed save keeps its checkpoint"
    );

    broken.store(false, Ordering::SeqCst);
    reset_when_settled(&calls).await;
    let kept = save_counting_kept(chain(), "doubled").await.expect("fixed");
    assert!(
        kept >= 1500,
        "every row before the failing one is kept: {kept}"
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        N - kept,
        "a call per row not kept"
    );
    let want: Vec<Doubled> = (0..N as u64)
        .map(|i| Doubled {
            path: format!("f-{i:04}.txt"),
            twice: 2 * i,
        })
        .collect();
    assert!(
        rows(root.path(), "doubled").await == want,
        "in order, as an uninterrupted run"
    );
    assert_eq!(checkpoint_dirs(root.path()), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_udf_version_or_checkpoints_off_or_fresh_starts_over() {
    const N: usize = 2000;
    let data = numbered_files(N);
    let root = tempfile::tempdir().expect("root");
    let calls = Arc::new(AtomicUsize::new(0));
    let broken = Arc::new(AtomicBool::new(true));
    let run = |settings: Settings, version: &str| {
        doubled(doubling(data.path(), root.path(), &calls, &broken, settings).version(version))
    };
    for (failed, then, settings, what) in [
        ("1", "2", Settings::new(), "a new version"),
        (
            "3",
            "3",
            Settings::new().checkpoints(false),
            "checkpoints = false",
        ),
        (
            "4",
            "4",
            Settings::new().fresh_checkpoints(),
            "checkpoints = fresh",
        ),
    ] {
        // A run of version `failed` fails on file 1500, keeping what it computed.
        broken.store(true, Ordering::SeqCst);
        let chunks = kept_chunks(root.path());
        run(Settings::new(), failed)
            .save("v")
            .await
            .expect_err("file 1500 fails");
        assert!(
            kept_chunks(root.path()) > chunks,
            "{what}: the failed run kept results"
        );
        broken.store(false, Ordering::SeqCst);
        reset_when_settled(&calls).await;
        let kept = save_counting_kept(run(settings, then), "v")
            .await
            .expect("save");
        assert_eq!(kept, 0, "{what}");
        assert_eq!(calls.load(Ordering::SeqCst), N, "{what}: every row called");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn datasets_gc_removes_the_checkpoint_of_a_failed_save_and_sql_can_turn_them_off() {
    let root = tempfile::tempdir().expect("root");
    let data = numbered_files(1600);
    let dir = data.path().to_str().expect("utf8");
    // A save that fails under `SET checkpoints = false` keeps nothing.
    let runner = udfchain_testkit::runner(root.path());
    runner
        .run(&format!(
            "SET checkpoints = false; CREATE DATASET t AS \
             SELECT file.path, sha256(file) AS h FROM read_storage('{dir}') LIMIT 10"
        ))
        .await
        .expect("save");
    assert_eq!(checkpoint_dirs(root.path()), 0);
    // A save that fails keeps a checkpoint, which gc removes.
    let calls = Arc::new(AtomicUsize::new(0));
    let broken = Arc::new(AtomicBool::new(true));
    doubling(data.path(), root.path(), &calls, &broken, Settings::new())
        .save("g")
        .await
        .expect_err("fails");
    assert_eq!(checkpoint_dirs(root.path()), 1);
    let out = Command::new(env!("CARGO_BIN_EXE_udfchain"))
        .arg("--root")
        .arg(root.path())
        .args(["datasets", "gc"])
        .output()
        .expect("gc");
    let text = stdout_ok(&out);
    assert!(text.contains("removed 1 stale checkpoint(s)"), "{text}");
    assert_eq!(checkpoint_dirs(root.path()), 0);
}
