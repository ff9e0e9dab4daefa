//! A full disk: `temp_dir_limit` bounds the prefetched bytes on disk; a temp
//! dir, a shared cache and a save meeting ENOSPC on a real small file system
//! (a tmpfs mounted for the test; skipped, saying so, where mounting is not
//! allowed: it needs root, which CI has). Nothing fails that can go on,
//! nothing half-written is left, the catalog and earlier versions stay.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};
use udfchain::udfs::UdfError;
use udfchain::{Catalog, File, Settings};
use udfchain_testkit::{S3Server, content, disk_bytes, no_prefetch_dirs_soon, write_files};

const MIB: u64 = 1 << 20;

/// A tmpfs of `bytes` mounted on a temp dir, unmounted when dropped.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    /// `None` (printing why) where this process may not mount (not root).
    fn mount(bytes: u64) -> Option<Self> {
        let dir = tempfile::tempdir().expect("mount point");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir.path())
            .output();
        match out {
            Ok(o) if o.status.success() => Some(Self { dir }),
            Ok(o) => {
                eprintln!(
                    "skipped: cannot mount a tmpfs ({}): this test needs root (CI runs as root)",
                    String::from_utf8_lossy(&o.stderr).trim()
                );
                None
            }
            Err(e) => {
                eprintln!("skipped: cannot run mount ({e}): this test needs root");
                None
            }
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// `n` files of `size` bytes in the S3 server's bucket; their paths.
fn big_files(server: &S3Server, n: usize, size: u64) -> Vec<String> {
    write_files(&server.bucket_dir().join("big"), n, |_| size as usize)
}

fn sha(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Hashed {
    path: String,
    hash: String,
}

/// Runs a map hashing each file (read whole) over `s3://bucket/big/` with
/// `settings`, recording the most bytes seen in `<root>/tmp` at any call;
/// checks every hash, returns (the most bytes seen, files streamed).
async fn hash_all(server: &S3Server, settings: Settings, root: &Path, n: usize) -> (u64, usize) {
    let most = Arc::new(AtomicU64::new(0));
    let (seen, tmp) = (Arc::clone(&most), root.join("tmp"));
    let chain = server
        .session()
        .from_storage("s3://bucket/big/")
        .settings(settings.root(root))
        .map("h", move |f: File| {
            let (seen, tmp) = (Arc::clone(&seen), tmp.clone());
            async move {
                seen.fetch_max(disk_bytes(&tmp), Ordering::SeqCst);
                let bytes = f.read().await?;
                Ok::<_, UdfError>(Hashed {
                    path: f.path.clone(),
                    hash: sha(&bytes),
                })
            }
        });
    let (batches, report) = chain.collect_with_report().await.expect("every row");
    #[derive(serde::Deserialize)]
    struct Row {
        h: Hashed,
    }
    let rows: Vec<Row> = batches
        .iter()
        .flat_map(|b| serde_arrow::from_record_batch::<Vec<Row>>(b).expect("rows"))
        .collect();
    assert_eq!(rows.len(), n, "every file once");
    for Row {
        h: Hashed { path, hash },
    } in &rows
    {
        let i: usize = path
            .rsplit_once("/f")
            .and_then(|(_, f)| f.strip_suffix(".bin"))
            .and_then(|i| i.parse().ok())
            .expect("a written file");
        let size = std::fs::metadata(server.bucket_dir().join("big").join(path))
            .expect("its object")
            .len();
        assert_eq!(hash, &sha(&content(i, size as usize)), "{path}");
    }
    let left = no_prefetch_dirs_soon(root).await;
    assert!(left.is_empty(), "copies left behind: {left:?}");
    (
        most.load(Ordering::SeqCst),
        report.metric("PrefetchExec", "files_streamed"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn temp_dir_limit_bounds_the_prefetched_bytes_on_disk() {
    let server = S3Server::start();
    big_files(&server, 12, 2 * MIB);
    let root = tempfile::tempdir().expect("root");
    let limit = 5 * MIB;
    let settings = Settings::new().prefetch(8).temp_dir_limit(limit);
    let (most, streamed) = hash_all(&server, settings, root.path(), 12).await;
    // A window of 8 wants 16 MiB: two copies fit, the rest are streamed.
    assert!(most <= limit, "{most} bytes on disk, limit {limit}");
    assert!(streamed > 0, "no file was streamed");
    assert!(streamed < 12, "no file was copied: {streamed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_temp_disk_streams_what_does_not_fit_and_every_row_comes() {
    let Some(disk) = SmallDisk::mount(5 * MIB) else {
        return;
    };
    let server = S3Server::start();
    big_files(&server, 12, 2 * MIB);
    // The limit believes in 1 GiB; the disk has 5 MiB: ENOSPC decides.
    let settings = Settings::new().prefetch(8).temp_dir_limit(1 << 30);
    let (most, streamed) = hash_all(&server, settings, disk.path(), 12).await;
    assert!(most <= 5 * MIB, "{most}");
    assert!(streamed > 0, "the disk filled up, yet no file was streamed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_makes_the_shared_cache_evict_then_serve_without_caching() {
    let Some(disk) = SmallDisk::mount(7 * MIB) else {
        return;
    };
    let server = S3Server::start();
    write_files(&server.bucket_dir().join("old"), 3, |_| (2 * MIB) as usize);
    big_files(&server, 6, 2 * MIB);
    let root = disk.path();
    let cached = Settings::new().prefetch(2).cache(true);
    // The first run fills the cache with 6 MiB of entries nobody pins after it.
    let n = server
        .session()
        .from_storage("s3://bucket/old/")
        .settings(cached.clone().root(root))
        .map("n", |f: File| async move {
            Ok::<_, UdfError>(f.read().await?.len() as u64)
        })
        .count()
        .await
        .expect("the first run");
    assert_eq!(n, 3);
    let before = disk_bytes(&root.join("cache"));
    assert!(before >= 6 * MIB, "{before}");
    // 12 MiB more: entries are evicted to make room, and what still does not
    // fit is served without caching.
    hash_all(&server, cached, root, 6).await;
    let after = disk_bytes(&root.join("cache"));
    assert!(after > 0, "the cache was used");
    let leftovers = walk(&root.join("cache"))
        .into_iter()
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(".tmp-"))
        })
        .count();
    assert_eq!(leftovers, 0, "a half-written cache entry is left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_save_on_a_full_disk_fails_naming_the_path_and_keeps_earlier_versions() {
    let Some(disk) = SmallDisk::mount(6 * MIB) else {
        return;
    };
    let data = tempfile::tempdir().expect("data");
    write_files(data.path(), 20, |_| 100);
    let root = disk.path();
    let uri = data.path().display().to_string();
    let base = Settings::new().root(root);
    let small = udfchain::Chain::from_storage(&uri)
        .settings(base.clone())
        .map("n", |f: File| async move { Ok::<_, UdfError>(f.size) });
    let v1 = small.save("pressure").await.expect("version 1 fits");
    // 20 rows of 1 MiB of incompressible bytes: the disk fills up.
    let big =
        udfchain::Chain::from_storage(&uri)
            .settings(base)
            .map("blob", |f: File| async move {
                // xorshift64: bytes no Parquet codec compresses.
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (f.path.len() as u64 * 7919 + f.size);
                let blob: Vec<u8> = (0..MIB as usize)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        (x >> 24) as u8
                    })
                    .collect();
                Ok::<_, UdfError>(blob)
            });
    let err = big.save("pressure").await.expect_err("the disk is full");
    let text = err.to_string();
    eprintln!("the save's error: {text}");
    assert!(text.contains("no space left"), "{text}");
    assert!(text.contains("data.parquet"), "the path: {text}");
    assert!(
        text.contains("need more than the") && text.contains("when the save started"),
        "the space: {text}"
    );
    let catalog = Catalog::open(root).await.expect("the catalog opens");
    let versions: Vec<u32> = catalog
        .list()
        .await
        .expect("list")
        .into_iter()
        .filter(|v| v.name == "pressure")
        .map(|v| v.version)
        .collect();
    assert_eq!(versions, vec![v1.version], "only the earlier version");
    let back = udfchain::Chain::from_dataset("pressure")
        .settings(Settings::new().root(root))
        .count()
        .await
        .expect("version 1 reads back");
    assert_eq!(back, 20);
    let half_written: Vec<PathBuf> = walk(root)
        .into_iter()
        .filter(|p| {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
            name.is_some_and(|n| n.ends_with(".tmp") || n.starts_with(".tmp-"))
                || p.components().any(|c| c.as_os_str() == ".staging") && p.is_file()
        })
        .collect();
    assert!(half_written.is_empty(), "{half_written:?}");
}

/// Every path below `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            }
            out.push(p);
        }
    }
    out
}
