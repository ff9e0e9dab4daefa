//! `to_storage`: every placement to a local dir and to the loopback S3
//! server, byte for byte; a filename collision fails naming both files and
//! writes nothing; reruns skip (no GET) what is there; symlinks; and a real
//! `udfchain export` process killed with SIGKILL mid-export leaves no
//! partial file under a final name, and a rerun completes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::Digest;
use udfchain::{LinkType, Placement, Session, Settings};

use udfchain_testkit::{ACCESS_KEY, S3Server, SECRET_KEY, content, write_files};

/// Every regular file below `dir`: relative path -> bytes (temp names too).
fn tree(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(base, &p, out);
            } else {
                let rel = p.strip_prefix(base).expect("below").display().to_string();
                out.insert(rel, std::fs::read(&p).expect("read"));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// The files `write_files(dir, n, size)` wrote: relative path -> bytes.
fn sources(n: usize, size: impl Fn(usize) -> usize) -> BTreeMap<String, Vec<u8>> {
    (0..n)
        .map(|i| (format!("d{}/f{i:04}.bin", i % 3), content(i, size(i))))
        .collect()
}

fn size(i: usize) -> usize {
    100 + i * 37
}

fn session(root: &Path) -> Arc<Session> {
    Session::with_settings(Settings::new().root(root))
}

fn text(p: &Path) -> &str {
    p.to_str().expect("utf8")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_placement_to_a_local_dir() {
    let (root, data, out) = (
        tempfile::tempdir().expect("root"),
        tempfile::tempdir().expect("data"),
        tempfile::tempdir().expect("out"),
    );
    write_files(data.path(), 7, size);
    let want = sources(7, size);
    let s = session(root.path());
    let chain = s.from_storage(text(data.path()));

    let dir = out.path().join("full");
    let done = chain
        .to_storage(text(&dir), "file", Placement::FullPath, LinkType::Copy)
        .await
        .expect("fullpath");
    assert_eq!((done.written, done.skipped), (7, 0));
    assert_eq!(tree(&dir), want);

    let dir = out.path().join("name");
    chain
        .to_storage(text(&dir), "file", Placement::FileName, LinkType::Copy)
        .await
        .expect("filename");
    let by_name: BTreeMap<String, Vec<u8>> = want
        .iter()
        .map(|(k, v)| (k.rsplit('/').next().expect("name").to_string(), v.clone()))
        .collect();
    assert_eq!(tree(&dir), by_name);

    let dir = out.path().join("sum");
    chain
        .to_storage(text(&dir), "file", Placement::Checksum, LinkType::Copy)
        .await
        .expect("checksum");
    let by_sum: BTreeMap<String, Vec<u8>> = want
        .values()
        .map(|v| (format!("{:x}.bin", sha2::Sha256::digest(v)), v.clone()))
        .collect();
    assert_eq!(tree(&dir), by_sum);
    let again = chain
        .to_storage(text(&dir), "file", Placement::Checksum, LinkType::Copy)
        .await
        .expect("checksum again");
    assert_eq!((again.written, again.skipped), (0, 7));

    let dir = out.path().join("etag");
    chain
        .to_storage(text(&dir), "file", Placement::Etag, LinkType::Copy)
        .await
        .expect("etag");
    #[derive(serde::Deserialize)]
    struct Listed {
        etag: Option<String>,
        size: u64,
    }
    let listed: Vec<Listed> = chain
        .clone()
        .select([
            udfchain::col("file.etag").alias("etag"),
            udfchain::col("file.size").alias("size"),
        ])
        .to_rows()
        .await
        .expect("etags");
    let got = tree(&dir);
    assert_eq!(got.len(), 7);
    for Listed { etag, size } in listed {
        let name = format!("{}.bin", etag.expect("local files have etags"));
        assert_eq!(got[&name].len() as u64, size, "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filename_collision_names_both_files_and_writes_nothing() {
    let (root, data, out) = (
        tempfile::tempdir().expect("root"),
        tempfile::tempdir().expect("data"),
        tempfile::tempdir().expect("out"),
    );
    for d in ["a", "b", "c"] {
        std::fs::create_dir_all(data.path().join(d)).expect("mkdir");
        std::fs::write(data.path().join(d).join(format!("{d}.txt")), d).expect("write");
    }
    std::fs::write(data.path().join("b/x.txt"), "from b").expect("write");
    std::fs::write(data.path().join("c/x.txt"), "from c").expect("write");
    let dir = out.path().join("flat");
    let e = session(root.path())
        .from_storage(text(data.path()))
        .to_storage(text(&dir), "file", Placement::FileName, LinkType::Copy)
        .await
        .expect_err("collision");
    let msg = e.to_string();
    assert!(
        msg.contains("b/x.txt") && msg.contains("c/x.txt") && msg.contains("\"x.txt\""),
        "{msg}"
    );
    assert!(
        tree(&dir).is_empty(),
        "nothing written: {:?}",
        tree(&dir).keys()
    );
    // The same file listed twice is no collision: written once.
    let s = session(root.path());
    let twice = s
        .from_storage(text(&data.path().join("a")))
        .union(s.from_storage(text(&data.path().join("a"))));
    let done = twice
        .to_storage(text(&dir), "file", Placement::FileName, LinkType::Copy)
        .await
        .expect("twice");
    assert_eq!((done.written, done.skipped), (1, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_to_local_and_local_to_s3_with_reruns_that_skip() {
    let s3 = S3Server::start();
    write_files(&s3.bucket_dir().join("src"), 9, size);
    let want = sources(9, size);
    let root = tempfile::tempdir().expect("root");
    let out = tempfile::tempdir().expect("out");
    let s = Session::with_settings(s3.settings().root(root.path()));

    // From the store: fullpath puts the bucket and prefix first.
    let chain = s.from_storage("s3://bucket/src/");
    let done = chain
        .to_storage(
            text(out.path()),
            "file",
            Placement::FullPath,
            LinkType::Copy,
        )
        .await
        .expect("s3 -> local");
    assert_eq!((done.written, done.skipped), (9, 0));
    let prefixed: BTreeMap<String, Vec<u8>> = want
        .iter()
        .map(|(k, v)| (format!("bucket/src/{k}"), v.clone()))
        .collect();
    assert_eq!(tree(out.path()), prefixed);
    // filepath keeps the prefix and path, without the bucket.
    let keyed = tempfile::tempdir().expect("out");
    let done = chain
        .to_storage(
            text(keyed.path()),
            "file",
            Placement::FilePath,
            LinkType::Copy,
        )
        .await
        .expect("s3 -> local, filepath");
    assert_eq!((done.written, done.skipped), (9, 0));
    let unbucketed: BTreeMap<String, Vec<u8>> = want
        .iter()
        .map(|(k, v)| (format!("src/{k}"), v.clone()))
        .collect();
    assert_eq!(tree(keyed.path()), unbucketed);
    // A rerun downloads nothing; a file of another size is written again.
    let gets = s3.object_gets();
    let again = chain
        .to_storage(
            text(out.path()),
            "file",
            Placement::FullPath,
            LinkType::Copy,
        )
        .await
        .expect("rerun");
    assert_eq!((again.written, again.skipped), (0, 9));
    assert_eq!(s3.object_gets(), gets, "a rerun GETs nothing");
    std::fs::write(out.path().join("bucket/src/d1/f0004.bin"), b"short").expect("damage");
    let fixed = chain
        .to_storage(
            text(out.path()),
            "file",
            Placement::FullPath,
            LinkType::Copy,
        )
        .await
        .expect("repair");
    assert_eq!((fixed.written, fixed.skipped), (1, 8));
    assert_eq!(tree(out.path()), prefixed);

    // Into the store, by filename; then again.
    let data = tempfile::tempdir().expect("data");
    write_files(data.path(), 9, size);
    let local = s.from_storage(text(data.path()));
    let done = local
        .to_storage(
            "s3://bucket/exported",
            "file",
            Placement::FileName,
            LinkType::Copy,
        )
        .await
        .expect("local -> s3");
    assert_eq!((done.written, done.skipped), (9, 0));
    let by_name: BTreeMap<String, Vec<u8>> = want
        .iter()
        .map(|(k, v)| (k.rsplit('/').next().expect("name").to_string(), v.clone()))
        .collect();
    assert_eq!(tree(&s3.bucket_dir().join("exported")), by_name);
    let requests = s3.requests();
    let again = local
        .to_storage(
            "s3://bucket/exported/",
            "file",
            Placement::FileName,
            LinkType::Copy,
        )
        .await
        .expect("again");
    assert_eq!((again.written, again.skipped), (0, 9));
    assert_eq!(
        s3.requests() - requests,
        1,
        "one LIST, no HEAD or PUT per file"
    );
    // Read back through the store: what a reader of the bucket sees.
    let back = s
        .from_storage("s3://bucket/exported/")
        .count()
        .await
        .expect("list");
    assert_eq!(back, 9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn symlinks_link_local_files_only() {
    let (root, data, out) = (
        tempfile::tempdir().expect("root"),
        tempfile::tempdir().expect("data"),
        tempfile::tempdir().expect("out"),
    );
    write_files(data.path(), 4, size);
    let s = session(root.path());
    let chain = s.from_storage(text(data.path()));
    let done = chain
        .to_storage(
            text(out.path()),
            "file",
            Placement::FullPath,
            LinkType::Symlink,
        )
        .await
        .expect("symlink");
    assert_eq!(done.written, 4);
    for rel in sources(4, size).keys() {
        let link = out.path().join(rel);
        let target = std::fs::read_link(&link).expect("a link");
        assert_eq!(
            target,
            std::path::absolute(data.path().join(rel)).expect("abs")
        );
    }
    assert_eq!(tree(out.path()), sources(4, size));
    let again = chain
        .to_storage(
            text(out.path()),
            "file",
            Placement::FullPath,
            LinkType::Symlink,
        )
        .await
        .expect("again");
    assert_eq!((again.written, again.skipped), (0, 4));

    let e = chain
        .to_storage(
            "memory://elsewhere/x",
            "file",
            Placement::FullPath,
            LinkType::Symlink,
        )
        .await
        .expect_err("symlink into a store");
    assert!(e.to_string().contains("local output"), "{e}");
    let s3 = S3Server::start();
    write_files(&s3.bucket_dir(), 2, size);
    let e = Session::with_settings(s3.settings().root(root.path()))
        .from_storage("s3://bucket/")
        .to_storage(
            text(out.path()),
            "file",
            Placement::FullPath,
            LinkType::Symlink,
        )
        .await
        .expect_err("symlink to an object");
    assert!(e.to_string().contains("links local files only"), "{e}");
}

/// `udfchain export` of `s3://bucket/src/` below `out`, reaching `s3`.
fn export_command(s3: &S3Server, root: &Path, out: &Path) -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_udfchain"));
    c.arg("--root").arg(root).arg("--quiet");
    for (k, v) in [
        ("endpoint", s3.endpoint.as_str()),
        ("allow_http", "true"),
        ("access_key_id", ACCESS_KEY),
        ("secret_access_key", SECRET_KEY),
        ("region", "us-east-1"),
        ("virtual_hosted_style_request", "false"),
    ] {
        c.arg("--set").arg(format!("storage.{k}={v}"));
    }
    // No prefetch: each file streams from the server into its temp file,
    // so the kill lands in the middle of a write.
    c.args(["--set", "prefetch=0"])
        .arg("export")
        .arg("SELECT file FROM read_storage('s3://bucket/src/')")
        .arg(out)
        .env("AWS_METADATA_ENDPOINT", "http://127.0.0.1:1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    c
}

/// Final-named files below `dir` (not temp files).
fn finals(dir: &Path) -> Vec<PathBuf> {
    tree(dir)
        .keys()
        .filter(|k| {
            !k.rsplit('/')
                .next()
                .unwrap_or(k)
                .starts_with(".udfchain-part-")
        })
        .map(|k| dir.join(k))
        .collect()
}

#[test]
fn a_killed_export_leaves_no_partial_file_under_a_final_name_and_a_rerun_completes() {
    const N: usize = 60;
    let big = |_: usize| 200_000;
    // 12 MB through a 3 MB/s server: the export takes about 4 s.
    let s3 = S3Server::start_shaped(Duration::from_millis(5), Some(3_000_000));
    write_files(&s3.bucket_dir().join("src"), N, big);
    let want: BTreeMap<String, Vec<u8>> = sources(N, big)
        .into_iter()
        .map(|(k, v)| (format!("bucket/src/{k}"), v))
        .collect();
    let root = tempfile::tempdir().expect("root");
    let out = tempfile::tempdir().expect("out");

    let mut child = export_command(&s3, root.path(), out.path())
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(120);
    while finals(out.path()).len() < 3 {
        assert!(Instant::now() < deadline, "no file exported in 120 s");
        assert!(
            child.try_wait().expect("wait").is_none(),
            "export ended early"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
    let after_kill = tree(out.path());
    let done: Vec<&String> = after_kill
        .keys()
        .filter(|k| {
            !k.rsplit('/')
                .next()
                .unwrap_or(k)
                .starts_with(".udfchain-part-")
        })
        .collect();
    assert!(done.len() < N, "the kill came after the export ended");
    eprintln!(
        "killed with {} of {N} files under their final names, {} temp file(s)",
        done.len(),
        after_kill.len() - done.len()
    );
    for k in &done {
        assert_eq!(
            after_kill[*k], want[*k],
            "{k}: a final name holds a partial or wrong file"
        );
    }

    let rerun = export_command(&s3, root.path(), out.path())
        .output()
        .expect("rerun");
    let stdout = String::from_utf8_lossy(&rerun.stdout);
    assert!(
        rerun.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&rerun.stderr)
    );
    assert!(
        stdout.contains(&format!(
            "exported {} file(s), skipped {} already there",
            N - done.len(),
            done.len()
        )),
        "{stdout}"
    );
    assert_eq!(tree(out.path()), want, "complete, and no temp file left");
}
