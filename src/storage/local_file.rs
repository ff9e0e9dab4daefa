//! Reading a small file of the local file system store (`file://`) in the
//! calling thread. Through `LocalFileSystem` one read of a local file crosses
//! threads twice (the I/O runtime, then its blocking pool) and costs more
//! than the read itself for a file of a few KiB; a UDF-pool thread reading a
//! page-cached file directly pays only the syscalls (open, fstat, read,
//! close).
//!
//! Guarantees: the key maps to the path `LocalFileSystem` (rooted at `/`)
//! maps it to; the bytes, and the errors for a missing file (a directory
//! counts as missing, as there), are those of a GET through it; the version
//! pin is checked against the open file's own metadata (the etag object_store
//! computes: inode, mtime in µs, size), so a file rewritten since it was
//! listed is a `Changed` error, never bytes of another version; a file larger
//! than the caller's limit is not read (`None`: take the streamed path); a
//! file warmed ([`warm_pinned`]) is read to its end under the same pin.

use std::fs::Metadata;
use std::io::Read;
use std::path::PathBuf;
use std::time::SystemTime;

use bytes::Bytes;
use datafusion::object_store::ObjectMeta;
use datafusion::object_store::path::Path;

use super::VersionPin;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A file up to this size may be read in the calling thread: at memory speed
/// that blocks it for about a millisecond, less than two thread crossings of
/// a streamed read cost for small files.
pub const INLINE_READ_MAX: u64 = 4 << 20;

/// The file `key` names in `LocalFileSystem::new()`'s key space.
///
/// A key of plain parts (see [`plain_key`]) is the path itself under `/`;
/// any other goes through the URL `LocalFileSystem` builds (percent-encoded
/// parts, then decoded), which is about a third of a page-cached small
/// file's whole read, so plain keys, which are most, skip it.
pub fn fs_path(key: &Path) -> Option<PathBuf> {
    if cfg!(unix) && plain_key(key.as_ref()) {
        return Some(PathBuf::from(format!("/{key}")));
    }
    url_fs_path(key)
}

/// Whether `key` maps to `/` + `key` byte for byte through the URL: no
/// part empty, `.` or `..` (the URL drops them), no tab or newline (the URL
/// drops them), no `:` or `|` (the URL reads Windows drive letters by
/// them). Every other character, `%` too, the URL encodes and decodes back
/// to itself.
fn plain_key(key: &str) -> bool {
    !key.is_empty()
        && !key
            .bytes()
            .any(|b| matches!(b, b'\t' | b'\n' | b'\r' | b':' | b'|'))
        && key.split('/').all(|part| !matches!(part, "" | "." | ".."))
}

/// [`fs_path`] by `LocalFileSystem`'s own way: the key's parts as a
/// `file:` URL's segments, converted to a path.
fn url_fs_path(key: &Path) -> Option<PathBuf> {
    let mut url = url::Url::parse("file:///").ok()?;
    url.path_segments_mut()
        .ok()?
        .pop_if_empty()
        .extend(key.parts());
    url.to_file_path().ok()
}

/// `LocalFileSystem`'s etag: inode, mtime in µs and size, in hex.
pub fn etag(meta: &Metadata) -> String {
    #[cfg(unix)]
    let inode = std::os::unix::fs::MetadataExt::ino(meta);
    #[cfg(not(unix))]
    let inode = 0u64;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .unwrap_or_default()
        .as_micros();
    format!("{inode:x}-{mtime:x}-{:x}", meta.len())
}

/// The whole of the file `key` names, of the version `pin` names, read in
/// this thread; `Ok(None)` when it is larger than `limit` bytes.
pub fn read_pinned(key: &Path, pin: &VersionPin, limit: u64) -> Result<Option<Bytes>, BoxError> {
    let (mut file, size) = open_pinned(key, pin)?;
    if size > limit {
        return Ok(None);
    }
    // Reads of the whole size and one byte past it: the file's own read and
    // the read that sees its end. (`read_to_end` through `take` has no size
    // hint and reads in 8, 16, 32 KiB ... steps: five reads for 64 KiB.)
    let mut buf = vec![0; size as usize + 1];
    let n = fill(&mut file, &mut buf)?;
    buf.truncate(n);
    if n as u64 > size {
        // It grew since the fstat: read whole rather than cut (its etag,
        // checked above, was of this version), up to the limit.
        (&mut file)
            .take(limit + 1 - n as u64)
            .read_to_end(&mut buf)?;
    }
    if buf.len() as u64 > limit {
        return Ok(None);
    }
    Ok(Some(Bytes::from(buf)))
}

/// Reads into `buf` until it is full or the file ends; the bytes read.
fn fill(file: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Reads the file `key` names, of the version `pin` names, to its end in
/// this thread and keeps nothing: its pages are then in the page cache (a
/// read ahead of a file too large to hold); the bytes read.
pub fn warm_pinned(key: &Path, pin: &VersionPin) -> Result<u64, BoxError> {
    let (mut file, _) = open_pinned(key, pin)?;
    Ok(std::io::copy(&mut file, &mut std::io::sink())?)
}

/// The file `key` names, open, and its size, once its own metadata showed it
/// is the version `pin` names (a directory is not found, as through
/// `LocalFileSystem`).
fn open_pinned(key: &Path, pin: &VersionPin) -> Result<(std::fs::File, u64), BoxError> {
    let path = fs_path(key).ok_or_else(|| format!("{key} is not a local path"))?;
    let not_found = |source: std::io::Error| -> BoxError {
        super::explain(object_store::Error::NotFound {
            path: path.display().to_string(),
            source: Box::new(source),
        })
    };
    let file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(not_found(e)),
        Err(e) => return Err(Box::new(e)),
    };
    let meta = file.metadata()?;
    if meta.is_dir() {
        return Err(not_found(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "is directory",
        )));
    }
    let object = ObjectMeta {
        location: key.clone(),
        last_modified: meta.modified()?.into(),
        size: meta.len(),
        e_tag: Some(etag(&meta)),
        version: None,
    };
    pin.check(&object)?;
    Ok((file, meta.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pin_of(path: &std::path::Path) -> VersionPin {
        let meta = std::fs::metadata(path).expect("stat");
        let file = udfchain_udfs::File {
            etag: Some(etag(&meta)),
            ..Default::default()
        };
        VersionPin::of(&file)
    }

    /// Characters that the URL treats specially, and plain ones.
    const ODD: &[char] = &[
        'a', 'é', ' ', '%', '2', 'e', '.', ':', '|', '\t', '\n', '\r', '#', '?', '\\', 'C', '/',
    ];

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]
        /// The plain-key shortcut names the file `LocalFileSystem`'s URL
        /// conversion names, for keys of any characters.
        #[test]
        fn fs_path_is_the_urls_path(chars in proptest::collection::vec(proptest::sample::select(ODD), 0..12)) {
            let raw: String = chars.into_iter().collect();
            // Keys as object_store makes them: parsed, and from parts.
            let parsed = Path::parse(&raw).ok();
            let parts = Path::from_iter(raw.split('/').filter(|p| !p.is_empty()));
            for key in parsed.into_iter().chain([parts]) {
                proptest::prop_assert_eq!(fs_path(&key), url_fs_path(&key), "key {:?}", key.as_ref());
            }
        }
    }

    #[test]
    fn plain_keys_skip_the_url_and_others_do_not() {
        assert!(plain_key("tmp/a b/é#?%2e%2e.txt"));
        for odd in ["", "a//b", "a/./b", "a/..", "c:", "a|b", "a\tb", "a\nb"] {
            assert!(!plain_key(odd), "{odd:?}");
        }
        // Keys whose path is not `/` + key: the URL's way is kept.
        for (key, path) in [("a/C:", "/a/C:/"), ("x|", "/x:/"), ("a/b:", "/a/b:/")] {
            let key = Path::parse(key).expect("key");
            assert_eq!(fs_path(&key), Some(PathBuf::from(path)), "{key:?}");
        }
    }

    #[test]
    fn a_local_read_gives_the_bytes_and_refuses_another_version() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("a b#%é.txt");
        std::fs::write(&path, b"hello").expect("write");
        let key = Path::from_absolute_path(&path).expect("key");
        assert_eq!(fs_path(&key).as_deref(), Some(path.as_path()));
        let pin = pin_of(&path);
        let bytes = read_pinned(&key, &pin, 1 << 20).expect("read");
        assert_eq!(bytes.as_deref(), Some(&b"hello"[..]));
        assert_eq!(
            read_pinned(&key, &pin, 4).expect("read"),
            None,
            "over the limit"
        );
        // Rewritten with another size: another etag.
        std::fs::write(&path, b"hello, again").expect("rewrite");
        let err = read_pinned(&key, &pin, 1 << 20).expect_err("changed");
        assert!(err.to_string().contains("changed"), "{err}");
        let err = warm_pinned(&key, &pin).expect_err("changed");
        assert!(err.to_string().contains("changed"), "{err}");
        assert_eq!(warm_pinned(&key, &pin_of(&path)).expect("warm"), 12);
        // Read whole at any size up to the limit, in place of a streamed read
        // past it; an empty file too.
        for size in [0usize, 1, 8191, 70_000] {
            let body: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
            std::fs::write(&path, &body).expect("rewrite");
            let pin = pin_of(&path);
            let read = read_pinned(&key, &pin, size as u64).expect("read");
            assert_eq!(read.as_deref(), Some(&body[..]), "{size} B at its size");
            if size > 0 {
                let over = read_pinned(&key, &pin, size as u64 - 1).expect("read");
                assert_eq!(over, None, "{size} B over the limit");
            }
        }
        // Missing, and a directory, are not found.
        std::fs::remove_file(&path).expect("rm");
        let err = read_pinned(&key, &pin, 1 << 20).expect_err("missing");
        assert!(err.to_string().contains("not found"), "{err}");
        let dir_key = Path::from_absolute_path(dir.path()).expect("key");
        let err = read_pinned(&dir_key, &VersionPin::default(), 1 << 20).expect_err("dir");
        assert!(err.to_string().contains("not found"), "{err}");
    }
}
