//! Listing a local directory in the order S3 lists keys, so the same files
//! give the same dataset order (and the same loader epochs) on every store and
//! every machine; object_store's `LocalFileSystem::list` returns them in the
//! order the file system's `readdir` happens to give.
//!
//! Guarantees:
//! - the same objects as `LocalFileSystem::list` — regular files, symlinks
//!   followed (a broken one skipped), files named like an unfinished upload
//!   (`name#123`) skipped, a file or dir that vanishes during the walk skipped —
//!   with the same `location`, `size`, `last_modified` and `e_tag` (inode,
//!   mtime and size, as object_store computes it), so reads pin to the etag
//!   listed;
//! - in byte-wise lexicographic order of the key, as S3 returns it: each
//!   directory's entries are sorted by name with a directory compared as
//!   `name/` (so `a-c` < `a/x` < `a0`, as the full keys compare);
//! - one `stat` per file (a directory's type comes from `readdir`), done when
//!   the file is reached, and the walk runs on the blocking pool in chunks, so
//!   a `limit` above the listing stops it early;
//! - a symlink to one of its own ancestor directories is an error naming both
//!   paths, not an endless walk.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fs::{self, Metadata};
use std::io;
use std::path::{Path as FsPath, PathBuf};
use std::time::SystemTime;

use futures::stream::{BoxStream, StreamExt};
use object_store::ObjectMeta;
use object_store::path::Path;
use url::Url;

/// Files stat'ed per trip to the blocking pool (object_store's own chunk).
const CHUNK: usize = 1024;

/// The files under `prefix` of the local file system (the key space of
/// `LocalFileSystem::new()`), recursively or only those directly in it.
pub(crate) fn list_local(
    prefix: &Path,
    recursive: bool,
) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
    let walk = match prefix_dir(prefix) {
        Ok(root) => Walk::new(root, recursive),
        Err(e) => return futures::stream::once(async move { Err(e) }).boxed(),
    };
    futures::stream::try_unfold(
        (Some(walk), VecDeque::new()),
        |(mut walk, mut ready)| async move {
            if ready.is_empty()
                && let Some(mut w) = walk.take()
            {
                let (w, chunk) = crate::runtime::blocking(move || {
                    let chunk = w.next_chunk(CHUNK);
                    Ok((w, chunk))
                })
                .await
                .map_err(|e| generic(e.to_string()))?;
                walk = (!w.done()).then_some(w);
                ready = chunk;
            }
            match ready.pop_front() {
                Some(meta) => Ok(Some((meta?, (walk, ready)))),
                None => Ok(None),
            }
        },
    )
    .boxed()
}

fn generic(msg: String) -> object_store::Error {
    object_store::Error::Generic {
        store: "LocalFileSystem",
        source: msg.into(),
    }
}

/// The directory `prefix` names, as `LocalFileSystem` maps keys to paths.
fn prefix_dir(prefix: &Path) -> object_store::Result<PathBuf> {
    let mut url = Url::parse("file:///").map_err(|e| generic(e.to_string()))?;
    url.path_segments_mut()
        .map_err(|_| generic("file:/// has no path".into()))?
        .pop_if_empty()
        .extend(prefix.parts());
    url.to_file_path()
        .map_err(|_| generic(format!("{url} is not a local path")))
}

/// One directory's entries, sorted, not yet visited.
struct Dir {
    entries: std::vec::IntoIter<Entry>,
    /// (device, inode): to notice a symlink back to an ancestor.
    id: (u64, u64),
    path: PathBuf,
}

struct Entry {
    /// The name, with `/` appended for a directory: the sort key.
    key: Vec<u8>,
    path: PathBuf,
    /// Known when the type needed a `stat` (a symlink); else taken at visit.
    meta: Option<Metadata>,
    is_dir: bool,
}

/// A depth-first walk in key order.
struct Walk {
    stack: Vec<Dir>,
    root: Option<PathBuf>,
    recursive: bool,
}

impl Walk {
    fn new(root: PathBuf, recursive: bool) -> Self {
        Self {
            stack: Vec::new(),
            root: Some(root),
            recursive,
        }
    }

    fn done(&self) -> bool {
        self.root.is_none() && self.stack.is_empty()
    }

    /// Up to `n` results; an error ends the walk after it.
    fn next_chunk(&mut self, n: usize) -> VecDeque<object_store::Result<ObjectMeta>> {
        let mut out = VecDeque::new();
        if let Some(root) = self.root.take() {
            match self.open_dir(&root) {
                Ok(Some(dir)) => self.stack.push(dir),
                Ok(None) => {}
                Err(e) => {
                    out.push_back(Err(e));
                    return out;
                }
            }
        }
        while out.len() < n {
            let Some(top) = self.stack.last_mut() else {
                break;
            };
            let Some(entry) = top.entries.next() else {
                self.stack.pop();
                continue;
            };
            if entry.is_dir {
                if !self.recursive {
                    continue;
                }
                match self.open_dir(&entry.path) {
                    Ok(Some(dir)) => self.stack.push(dir),
                    Ok(None) => {}
                    Err(e) => {
                        out.push_back(Err(e));
                        self.stack.clear();
                        break;
                    }
                }
                continue;
            }
            match file_meta(entry) {
                Ok(Some(meta)) => out.push_back(Ok(meta)),
                Ok(None) => {}
                Err(e) => {
                    out.push_back(Err(e));
                    self.stack.clear();
                    break;
                }
            }
        }
        out
    }

    /// The sorted entries of `path`; `None` when it is gone or not a directory.
    fn open_dir(&self, path: &FsPath) -> object_store::Result<Option<Dir>> {
        let meta = match fs::metadata(path) {
            Ok(m) if m.is_dir() => m,
            Ok(_) => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_error(path, e)),
        };
        let id = dir_id(&meta);
        if let Some(a) = self.stack.iter().find(|d| d.id == id) {
            return Err(generic(format!(
                "file system loop found: {} points to an ancestor {}",
                path.display(),
                a.path.display()
            )));
        }
        let read = match fs::read_dir(path) {
            Ok(r) => r,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_error(path, e)),
        };
        let mut entries = Vec::new();
        for e in read {
            let e = match e {
                Ok(e) => e,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_error(path, e)),
            };
            let (path, name) = (e.path(), e.file_name());
            let (is_dir, meta) = match e.file_type() {
                Ok(t) if t.is_dir() => (true, None),
                // A file (or a fifo or socket, which the visit's stat skips).
                Ok(t) if !t.is_symlink() => (false, None),
                // A symlink (or a type readdir does not say): what it points to.
                _ => match fs::metadata(&path) {
                    Ok(m) => (m.is_dir(), Some(m)),
                    // Broken, or gone since readdir.
                    Err(_) => continue,
                },
            };
            entries.push(Entry {
                key: sort_key(name, is_dir),
                path,
                meta,
                is_dir,
            });
        }
        entries.sort_unstable_by(|a, b| a.key.cmp(&b.key));
        Ok(Some(Dir {
            entries: entries.into_iter(),
            id,
            path: path.to_path_buf(),
        }))
    }
}

fn sort_key(name: OsString, is_dir: bool) -> Vec<u8> {
    #[cfg(unix)]
    let mut key = std::os::unix::ffi::OsStringExt::into_vec(name);
    #[cfg(not(unix))]
    let mut key = name.to_string_lossy().into_owned().into_bytes();
    if is_dir {
        key.push(b'/');
    }
    key
}

/// The object of a file entry; `None` for what `LocalFileSystem` skips.
fn file_meta(entry: Entry) -> object_store::Result<Option<ObjectMeta>> {
    let meta = match entry.meta {
        Some(m) => m,
        None => match fs::metadata(&entry.path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_error(&entry.path, e)),
        },
    };
    if !meta.is_file() {
        return Ok(None);
    }
    let location = Path::from_absolute_path(&entry.path)?;
    if !is_valid_file_path(&location) {
        return Ok(None);
    }
    Ok(Some(ObjectMeta {
        location,
        last_modified: meta
            .modified()
            .map_err(|e| io_error(&entry.path, e))?
            .into(),
        size: meta.len(),
        e_tag: Some(etag(&meta)),
        version: None,
    }))
}

/// `LocalFileSystem`'s rule: `name#123` is an upload in progress.
fn is_valid_file_path(path: &Path) -> bool {
    match path.filename() {
        Some(p) => match p.split_once('#') {
            Some((_, suffix)) if !suffix.is_empty() => {
                !suffix.as_bytes().iter().all(|x| x.is_ascii_digit())
            }
            _ => true,
        },
        None => false,
    }
}

/// `LocalFileSystem`'s etag: inode, mtime in µs and size, in hex.
fn etag(meta: &Metadata) -> String {
    let inode = dir_id(meta).1;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .unwrap_or_default()
        .as_micros();
    format!("{inode:x}-{mtime:x}-{:x}", meta.len())
}

#[cfg(unix)]
fn dir_id(meta: &Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (meta.dev(), meta.ino())
}

#[cfg(not(unix))]
fn dir_id(_meta: &Metadata) -> (u64, u64) {
    (0, 0)
}

fn io_error(path: &FsPath, e: io::Error) -> object_store::Error {
    generic(format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::TryStreamExt;
    use object_store::ObjectStore;
    use object_store::local::LocalFileSystem;

    const NAMES: &[&str] = &[
        "b.txt",
        "a-c",
        "a/x",
        "a/y/z",
        "a0",
        "A",
        "é.bin",
        "with space",
        "pct%41",
        "up#12",
        "ok#x",
        "z/deep/er/file",
    ];

    fn tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        // Written in reverse so readdir order is unlikely to be sorted.
        for (i, name) in NAMES.iter().enumerate().rev() {
            let p = dir.path().join(name);
            fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            fs::write(&p, vec![b'x'; i]).expect("write");
        }
        dir
    }

    fn prefix(dir: &FsPath) -> Path {
        Path::from_absolute_path(dir.canonicalize().expect("canonical")).expect("path")
    }

    #[tokio::test]
    async fn lists_what_local_file_system_lists_in_key_order() {
        let dir = tree();
        let prefix = prefix(dir.path());
        let ours: Vec<ObjectMeta> = list_local(&prefix, true).try_collect().await.expect("walk");
        let mut theirs: Vec<ObjectMeta> = LocalFileSystem::new()
            .list(Some(&prefix))
            .try_collect()
            .await
            .expect("list");
        theirs.sort_by(|a, b| a.location.as_ref().cmp(b.location.as_ref()));
        assert_eq!(ours, theirs, "same objects, etags included, in key order");
        let keys: Vec<&str> = ours
            .iter()
            .map(|m| {
                m.location
                    .as_ref()
                    .strip_prefix(prefix.as_ref())
                    .expect("under")
            })
            .collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
        assert!(
            !keys.iter().any(|k| k.ends_with("up#12")),
            "uploads skipped"
        );
        assert_eq!(keys.len(), NAMES.len() - 1);
    }

    #[tokio::test]
    async fn non_recursive_lists_only_the_top_files_and_a_missing_dir_is_empty() {
        let dir = tree();
        let prefix = prefix(dir.path());
        let top: Vec<ObjectMeta> = list_local(&prefix, false)
            .try_collect()
            .await
            .expect("walk");
        assert!(
            top.iter()
                .all(|m| !m.location.as_ref()[prefix.as_ref().len() + 1..].contains('/'))
        );
        assert_eq!(top.len(), 8);
        let gone = prefix.clone().join("no-such-dir");
        let none: Vec<ObjectMeta> = list_local(&gone, true).try_collect().await.expect("walk");
        assert!(none.is_empty());
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn a_symlink_loop_is_an_error_and_links_to_files_are_followed() {
        let dir = tree();
        std::os::unix::fs::symlink(dir.path().join("b.txt"), dir.path().join("link")).expect("ln");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), dir.path().join("broken"))
            .expect("ln");
        let prefix = prefix(dir.path());
        let all: Vec<ObjectMeta> = list_local(&prefix, true).try_collect().await.expect("walk");
        assert!(all.iter().any(|m| m.location.as_ref().ends_with("/link")));
        assert!(!all.iter().any(|m| m.location.as_ref().ends_with("/broken")));
        std::os::unix::fs::symlink(dir.path(), dir.path().join("a").join("loop")).expect("ln");
        let err = list_local(&prefix, true)
            .try_collect::<Vec<_>>()
            .await
            .expect_err("a loop");
        assert!(err.to_string().contains("loop"), "{err}");
    }
}
