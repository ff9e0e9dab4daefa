//! Files larger than memory: `SELECT sha256(file)` over one 1 GiB and one
//! 4 GiB S3 object, with prefetch on (the default: the object is streamed
//! into the temp dir, then hashed from there in chunks) and with
//! `prefetch = 0` (the hash reads the store by ranges), gives the hash of the
//! bytes computed here without the engine, at a peak RSS under
//! [`PEAK_RSS_LIMIT`], leaving no file in the root's temp dir; and so does
//! `sha256(member)` of a 1 GiB member of a tar archive (`tar_members`).
//!
//! The objects are sparse files in the test S3 server's bucket dir (no disk
//! for their holes) with a 16-byte marker in every MiB, so a chunk dropped,
//! repeated or reordered changes the hash. The server runs in this test's
//! process; the engine runs in a child process of its own
//! ([`run_child_test`]), so its peak RSS is the engine's alone.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::time::Duration;

use sha2::Digest;
use udfchain::{ScriptRunner, Session, Settings};
use udfchain_testkit::{
    ACCESS_KEY, S3Server, SECRET_KEY, child_peak_rss, disk_bytes, last_table, prefetch_dirs,
    report_peak_rss, run_child_test,
};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// The most resident memory the engine's process may reach.
const PEAK_RSS_LIMIT: u64 = 300 * MIB;
const CHILD_TIMEOUT: Duration = Duration::from_secs(300);

/// The environment a child reads its workload from.
const ENDPOINT: &str = "UDFCHAIN_LARGE_ENDPOINT";
const ROOT: &str = "UDFCHAIN_LARGE_ROOT";
const SCRIPT: &str = "UDFCHAIN_LARGE_SCRIPT";
/// The line a child prints its table on.
const TABLE: &str = "udfchain-large-table=";

/// A sparse file of `size` bytes at `path`: zeros, but for 16 bytes in every
/// MiB from `from` on (the MiB's index, at an offset that moves with it).
fn write_sparse(path: &Path, size: u64, from: u64) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    let mut f = std::fs::File::create(path).expect("create");
    f.set_len(size).expect("set_len");
    for k in 0..(size - from) / MIB {
        let at = from + k * MIB + (k * 4093) % (MIB - 16);
        f.seek(SeekFrom::Start(at)).expect("seek");
        let mut marker = [0u8; 16];
        marker[..8].copy_from_slice(&k.to_le_bytes());
        marker[8..].copy_from_slice(&(!k).to_le_bytes());
        f.write_all(&marker).expect("marker");
    }
}

/// Hex SHA-256 of `len` bytes at `offset` of the file at `path`, read here
/// (not by the engine).
fn sha256_of(path: &Path, offset: u64, len: u64) -> String {
    let mut f = std::fs::File::open(path).expect("open");
    f.seek(SeekFrom::Start(offset)).expect("seek");
    let mut f = f.take(len);
    let mut hash = sha2::Sha256::new();
    let mut buf = vec![0u8; 4 << 20];
    loop {
        let n = f.read(&mut buf).expect("read");
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
    }
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Runs `script` in a child over the server's bucket (root dir `root`) and
/// returns its last table and peak RSS.
fn run_child(child: &str, s3: &S3Server, root: &Path, script: &str) -> (String, u64) {
    let name = format!("pressure::large_files::{child}");
    let root = root.display().to_string();
    let out = run_child_test(
        &name,
        &[
            (ENDPOINT, s3.endpoint.as_str()),
            (ROOT, root.as_str()),
            (SCRIPT, script),
        ],
        CHILD_TIMEOUT,
    );
    let table = out
        .lines()
        .filter_map(|l| l.strip_prefix(TABLE))
        .collect::<Vec<_>>()
        .join("\n");
    let rss = child_peak_rss(&out).expect("the child's peak RSS");
    (table, rss)
}

/// `select` run by a child with prefetch on, with `prefetch = 0` and with a
/// `temp_dir_limit` below the object's size (streamed from the store): its
/// table holds `want`, its peak RSS stays under [`PEAK_RSS_LIMIT`] and its
/// root's temp dir is empty after it.
fn bounded_both_ways(s3: &S3Server, what: &str, select: &str, want: &str) {
    let mut peaks = Vec::new();
    for (label, script) in [
        ("prefetch on", select.to_string()),
        ("prefetch = 0", format!("SET prefetch = 0;\n{select}")),
        // Larger than the temp dir may hold: no copy, read from the store.
        (
            "temp_dir_limit 64 MiB",
            format!("SET temp_dir_limit = 67108864;\n{select}"),
        ),
    ] {
        let root = tempfile::tempdir().expect("root");
        let (table, rss) = run_child("child_script", s3, root.path(), &script);
        eprintln!("{what}, {label}: peak RSS {} MiB", rss / MIB);
        assert!(
            table.contains(want),
            "{what}, {label}: want {want}, got\n{table}"
        );
        assert!(prefetch_dirs(root.path()).is_empty(), "{what}, {label}");
        assert_eq!(disk_bytes(&root.path().join("tmp")), 0, "{what}, {label}");
        peaks.push((label, rss));
    }
    for (label, rss) in peaks {
        assert!(
            rss < PEAK_RSS_LIMIT,
            "{what}, {label}: peak RSS {} MiB",
            rss / MIB
        );
    }
}

/// One object of `size` bytes, hashed by `sha256` with prefetch on and off.
fn sha256_stays_bounded(size: u64) {
    let s3 = S3Server::start();
    let object = s3.bucket_dir().join("large/object.bin");
    write_sparse(&object, size, 0);
    let want = sha256_of(&object, 0, size);
    let select = "SELECT sha256(file) AS h FROM read_storage('s3://bucket/large/')";
    let what = format!("sha256 of a {} GiB object", size / GIB);
    bounded_both_ways(&s3, &what, select, &want);
}

#[test]
fn sha256_of_a_1_gib_object_stays_under_300_mb() {
    sha256_stays_bounded(GIB);
}

#[test]
fn sha256_of_a_4_gib_object_stays_under_300_mb() {
    sha256_stays_bounded(4 * GIB);
}

/// A 1 GiB member of a tar archive: `tar_members` reads the headers by
/// range and `sha256(member)` streams the member's range of the archive.
#[test]
fn sha256_of_a_1_gib_tar_member_stays_under_300_mb() {
    let s3 = S3Server::start();
    let archive = s3.bucket_dir().join("tars/big.tar");
    // A header, the member's data, then the two zero blocks that end it.
    write_sparse(&archive, 512 + GIB + 1024, 512);
    let mut header = tar::Header::new_gnu();
    header.set_path("big.bin").expect("path");
    header.set_size(GIB);
    header.set_mode(0o644);
    header.set_entry_type(tar::EntryType::Regular);
    header.set_cksum();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(&archive)
        .expect("open");
    f.write_all(header.as_bytes()).expect("header");
    drop(f);
    let want = sha256_of(&archive, 512, GIB);
    let select = "SELECT name, sha256(member) AS h FROM tar_members('s3://bucket/tars/')";
    bounded_both_ways(&s3, "sha256 of a 1 GiB tar member", select, &want);
}

/// The child: runs `$UDFCHAIN_LARGE_SCRIPT` against the S3 server at
/// `$UDFCHAIN_LARGE_ENDPOINT` under the root `$UDFCHAIN_LARGE_ROOT`, prints
/// its last table and this process's peak RSS. Does nothing when run
/// without them (`cargo test -- --ignored`).
#[test]
#[ignore = "a child of the large-file tests, run by them"]
fn child_script() {
    let (Ok(endpoint), Ok(root), Ok(script)) = (
        std::env::var(ENDPOINT),
        std::env::var(ROOT),
        std::env::var(SCRIPT),
    ) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let table = rt.block_on(async {
        let settings = Settings::new()
            .root(&root)
            .storage_option("endpoint", &endpoint)
            .storage_option("allow_http", "true")
            .storage_option("access_key_id", ACCESS_KEY)
            .storage_option("secret_access_key", SECRET_KEY)
            .storage_option("region", "us-east-1")
            .storage_option("virtual_hosted_style_request", "false");
        let runner = ScriptRunner::new(Session::with_settings(settings));
        last_table(&runner, &script).await
    });
    drop(rt);
    for line in table.lines() {
        println!("{TABLE}{line}");
    }
    report_peak_rss();
}
