//! Deterministic data and small helpers: file contents ([`content`]) written to
//! a directory or put into a store, a session that sees a local directory as
//! remote, script runners and table goldens, and checks of a root dir's temp
//! files.

use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::arrow::util::pretty::pretty_format_batches;
use object_store::path::Path;
use object_store::{ObjectStore, PutOptions, PutPayload};
use udfchain::{Output, ScriptRunner, Session, Settings};

/// Deterministic content of test file `i`.
pub fn content(i: usize, size: usize) -> Vec<u8> {
    (0..size).map(|j| ((i * 31 + j * 7) % 251) as u8).collect()
}

/// Writes `n` files `dir/d{i%3}/f{i:04}.bin` of `size(i)` bytes; returns their relative paths.
pub fn write_files(dir: &FsPath, n: usize, size: impl Fn(usize) -> usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            let rel = format!("d{}/f{i:04}.bin", i % 3);
            let p = dir.join(&rel);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(&p, content(i, size(i))).expect("write");
            rel
        })
        .collect()
}

/// A session that serves the files under `dir` as `memory://<name>/`
/// through a `LocalFileSystem` rooted at `dir`: files of this disk that the
/// engine treats as remote (a store's reach is told by the store itself), so
/// a fixed `prefetch` downloads them to its temp dir as a network object's.
pub fn remote_view(dir: &FsPath, name: &str) -> Arc<Session> {
    let store = object_store::local::LocalFileSystem::new_with_prefix(dir).expect("local store");
    let session = Session::new();
    session
        .register_store(&format!("memory://{name}"), Arc::new(store))
        .expect("register");
    session
}

/// Puts the same files into an object store under `prefix`.
pub async fn put_files(
    store: &dyn ObjectStore,
    prefix: &str,
    n: usize,
    size: impl Fn(usize) -> usize,
) -> Vec<String> {
    let mut out = Vec::new();
    for i in 0..n {
        let rel = format!("d{}/f{i:04}.bin", i % 3);
        let path = if prefix.is_empty() {
            Path::from(rel.as_str())
        } else {
            Path::from(format!("{prefix}/{rel}"))
        };
        store
            .put_opts(
                &path,
                PutPayload::from(content(i, size(i))),
                PutOptions::default(),
            )
            .await
            .expect("put");
        out.push(rel);
    }
    out
}

/// `prefetch-*` temp dirs under `root/tmp`.
pub fn prefetch_dirs(root: &FsPath) -> Vec<PathBuf> {
    std::fs::read_dir(root.join("tmp"))
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("prefetch-"))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Waits up to 2 s for `root` to have no prefetch dirs (aborted tasks drop their
/// handles on the runtime, a moment after the stream is dropped).
pub async fn no_prefetch_dirs_soon(root: &FsPath) -> Vec<PathBuf> {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let dirs = prefetch_dirs(root);
        if dirs.is_empty() || Instant::now() > deadline {
            return dirs;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Total bytes of files below `dir`.
pub fn disk_bytes(dir: &FsPath) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => disk_bytes(&e.path()),
            Ok(_) => e.metadata().map(|m| m.len()).unwrap_or(0),
            Err(_) => 0,
        })
        .sum()
}

/// A script runner with default settings under the root dir `root`.
pub fn runner(root: &FsPath) -> ScriptRunner {
    ScriptRunner::new(Session::with_settings(Settings::new().root(root)))
}

/// Runs `script` and returns its last table, pretty-printed.
pub async fn last_table(r: &ScriptRunner, script: &str) -> String {
    let outputs = r.run(script).await.unwrap_or_else(|e| panic!("{e}"));
    let batches = outputs
        .into_iter()
        .rev()
        .find_map(|o| match o {
            Output::Table(b) => Some(b),
            Output::Message(_) => None,
        })
        .expect("a table");
    pretty_format_batches(&batches).expect("format").to_string()
}

/// Asserts a pretty-printed table equals `want` (both trimmed).
pub fn golden(got: &str, want: &str) {
    let want = want.trim();
    assert_eq!(
        got.trim(),
        want,
        "\n--- got ---\n{got}\n--- want ---\n{want}\n"
    );
}

/// The stdout of a CLI run that must have succeeded.
pub fn stdout_ok(out: &std::process::Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
