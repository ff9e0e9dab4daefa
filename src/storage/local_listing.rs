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
//! - one `stat` per file (a directory's type comes from `readdir`), relative to
//!   its open directory (no path lookup from `/`), done at most one chunk of
//!   `CHUNK` files ahead of the consumer: the walk runs in a task of its own
//!   (aborted when the listing is dropped) that stats the next chunk while the
//!   consumer takes the current one, so a `limit` above the listing stops it
//!   within two chunks and the consumer's work overlaps the `statx` calls; a
//!   chunk's files are stat'ed on up to `cores` blocking threads at once, each
//!   part's results kept in the chunk's order;
//! - a symlink to one of its own ancestor directories is an error naming both
//!   paths, not an endless walk.

use std::ffi::OsString;
use std::fs::{self, Metadata};
use std::io;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use futures::stream::{self, BoxStream, StreamExt};
use object_store::ObjectMeta;
use object_store::path::{Path, PathPart};
use tokio::sync::mpsc;

/// Files stat'ed per trip of the walk (object_store's own chunk).
const CHUNK: usize = 1024;

/// The fewest files worth a blocking thread of their own: a smaller chunk is
/// stat'ed in the walk's own trip.
const MIN_PART: usize = 256;

/// The files under `prefix` of the local file system (the key space of
/// `LocalFileSystem::new()`), recursively or only those directly in it.
pub(crate) fn list_local(
    prefix: &Path,
    recursive: bool,
) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
    let walk = match prefix_dir(prefix) {
        Ok(root) => Walk::new(root, recursive),
        Err(e) => return stream::once(async move { Err(e) }).boxed(),
    };
    let cores = crate::runtime::cores();
    // The task starts at the first poll (inside the runtime that polls it).
    stream::unfold(Listing::Start(walk), move |state| async move {
        let (mut chunks, walker) = match state {
            Listing::Start(walk) => {
                let (tx, rx) = mpsc::channel(1);
                (rx, crate::runtime::spawn(walk_ahead(walk, cores, tx)))
            }
            Listing::Running(chunks, walker) => (chunks, walker),
            Listing::Done => return None,
        };
        match chunks.recv().await {
            Some(metas) => Some((metas, Listing::Running(chunks, walker))),
            // The walk is done, or its task ended without saying why.
            None => match walker.await {
                Ok(()) => None,
                Err(e) => Some((vec![Err(generic(format!("the walk {e}")))], Listing::Done)),
            },
        }
    })
    .flat_map(stream::iter)
    .boxed()
}

/// Where a listing is.
enum Listing {
    /// Not polled yet.
    Start(Walk),
    /// The walk's task and the chunks it sends.
    Running(
        mpsc::Receiver<Vec<object_store::Result<ObjectMeta>>>,
        crate::runtime::PoolTask<()>,
    ),
    /// An error was the last item.
    Done,
}

/// Walks and stats chunk after chunk into `tx`, one chunk ahead of the
/// consumer: a chunk is started only once the one before it was taken (the
/// channel holds one, and its slot is reserved before the work), and the walk
/// stops when the listing is dropped or after the first error.
async fn walk_ahead(
    mut walk: Walk,
    cores: usize,
    tx: mpsc::Sender<Vec<object_store::Result<ObjectMeta>>>,
) {
    while let Ok(slot) = tx.reserve().await {
        let (next, metas) = match next_chunk(walk, cores).await {
            Ok(chunk) => chunk,
            Err(e) => return slot.send(vec![Err(e)]),
        };
        slot.send(metas);
        let Some(next) = next else {
            return;
        };
        walk = next;
    }
}

/// The walk's next chunk of results (ended by its first error) and the walk,
/// `None` once it is done.
async fn next_chunk(
    mut walk: Walk,
    cores: usize,
) -> object_store::Result<(Option<Walk>, Vec<object_store::Result<ObjectMeta>>)> {
    let (walk, chunk, walk_error) = crate::runtime::blocking(move || {
        let files = walk.next_files(CHUNK);
        let walk_error = walk.failed.take();
        let chunk = if files.len() < 2 * MIN_PART {
            Chunk::Done(stat_all(files))
        } else {
            Chunk::Files(files)
        };
        Ok((walk, chunk, walk_error))
    })
    .await
    .map_err(|e| generic(e.to_string()))?;
    let mut metas = match chunk {
        Chunk::Done(metas) => metas,
        Chunk::Files(mut files) => {
            let parts = (files.len() / MIN_PART).clamp(1, cores.max(1));
            let per = files.len().div_ceil(parts);
            let mut split = Vec::with_capacity(parts);
            while files.len() > per {
                split.push(files.split_off(files.len() - per));
            }
            split.push(files);
            let stats = split
                .into_iter()
                .rev()
                .map(|part| crate::runtime::blocking(move || Ok(stat_all(part))));
            futures::future::try_join_all(stats)
                .await
                .map_err(|e| generic(e.to_string()))?
                .into_iter()
                .flatten()
                .collect()
        }
    };
    match metas.iter().position(|m| m.is_err()) {
        Some(i) => metas.truncate(i + 1),
        None => metas.extend(walk_error.map(Err)),
    }
    let failed = metas.last().is_some_and(|m| m.is_err());
    let walk = (!failed && !walk.done()).then_some(walk);
    Ok((walk, metas))
}

enum Chunk {
    /// Stat'ed already (a small chunk).
    Done(Vec<object_store::Result<ObjectMeta>>),
    /// To stat, in parts.
    Files(Vec<Visit>),
}

/// The objects of `files`, in their order, those `LocalFileSystem` skips left out.
fn stat_all(files: Vec<Visit>) -> Vec<object_store::Result<ObjectMeta>> {
    files
        .into_iter()
        .filter_map(|f| file_meta(f).transpose())
        .collect()
}

fn generic(msg: String) -> object_store::Error {
    object_store::Error::Generic {
        store: "LocalFileSystem",
        source: msg.into(),
    }
}

/// The directory `prefix` names, as `LocalFileSystem` maps keys to paths.
fn prefix_dir(prefix: &Path) -> object_store::Result<PathBuf> {
    super::local_file::fs_path(prefix)
        .ok_or_else(|| generic(format!("{prefix} is not a local path")))
}

/// One directory's entries, sorted, not yet visited.
struct Dir {
    entries: std::vec::IntoIter<Entry>,
    /// (device, inode): to notice a symlink back to an ancestor.
    id: (u64, u64),
    path: PathBuf,
    /// Shared by the visits of its files.
    key: Arc<DirKey>,
}

/// What a file's key is built from.
struct DirKey {
    /// `Path::from_absolute_path` of the directory; `None` when it has no valid
    /// key (then each file's own conversion gives object_store's error).
    location: Option<Path>,
}

struct Entry {
    /// The name, with `/` appended for a directory: the sort key.
    key: Vec<u8>,
    kind: Kind,
}

enum Kind {
    /// A directory (or a symlink to one) at this path.
    Dir(PathBuf),
    /// Anything else (a fifo or socket is skipped by the visit's stat).
    File(Stat),
}

enum Stat {
    /// Not a symlink per `readdir`: stat'ed at the visit, through the entry
    /// (relative to its directory's open handle).
    Entry(fs::DirEntry),
    /// A symlink: what it points to, stat'ed when the directory was read.
    Known(Metadata, PathBuf),
}

/// A file reached by the walk, not yet stat'ed.
struct Visit {
    name: Vec<u8>,
    stat: Stat,
    dir: Arc<DirKey>,
}

/// A depth-first walk in key order.
struct Walk {
    stack: Vec<Dir>,
    root: Option<PathBuf>,
    recursive: bool,
    /// An error met by the walk itself, returned after the files before it.
    failed: Option<object_store::Error>,
}

impl Walk {
    fn new(root: PathBuf, recursive: bool) -> Self {
        Self {
            stack: Vec::new(),
            root: Some(root),
            recursive,
            failed: None,
        }
    }

    fn done(&self) -> bool {
        self.root.is_none() && self.stack.is_empty()
    }

    /// The next up to `n` files in key order; a directory that cannot be read
    /// ends the walk (its error in `failed`, to come after these files).
    fn next_files(&mut self, n: usize) -> Vec<Visit> {
        let mut out = Vec::with_capacity(n);
        if let Some(root) = self.root.take() {
            match self.open_dir(&root) {
                Ok(Some(dir)) => self.stack.push(dir),
                Ok(None) => {}
                Err(e) => self.fail(e),
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
            match entry.kind {
                Kind::Dir(path) => {
                    if !self.recursive {
                        continue;
                    }
                    match self.open_dir(&path) {
                        Ok(Some(dir)) => self.stack.push(dir),
                        Ok(None) => {}
                        Err(e) => self.fail(e),
                    }
                }
                Kind::File(stat) => out.push(Visit {
                    name: entry.key,
                    stat,
                    dir: Arc::clone(&top.key),
                }),
            }
        }
        out
    }

    /// Ends the walk with `e`.
    fn fail(&mut self, e: object_store::Error) {
        self.stack.clear();
        self.failed = Some(e);
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
            let name = e.file_name();
            let kind = match e.file_type() {
                Ok(t) if t.is_dir() => Kind::Dir(e.path()),
                Ok(t) if !t.is_symlink() => Kind::File(Stat::Entry(e)),
                // A symlink (or a type readdir does not say): what it points to.
                _ => {
                    let path = e.path();
                    match fs::metadata(&path) {
                        Ok(m) if m.is_dir() => Kind::Dir(path),
                        Ok(m) => Kind::File(Stat::Known(m, path)),
                        // Broken, or gone since readdir.
                        Err(_) => continue,
                    }
                }
            };
            let key = sort_key(name, matches!(kind, Kind::Dir(_)));
            entries.push(Entry { key, kind });
        }
        entries.sort_unstable_by(|a, b| a.key.cmp(&b.key));
        Ok(Some(Dir {
            entries: entries.into_iter(),
            id,
            path: path.to_path_buf(),
            key: Arc::new(DirKey {
                location: Path::from_absolute_path(path).ok(),
            }),
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

/// The object of a file; `None` for what `LocalFileSystem` skips.
fn file_meta(file: Visit) -> object_store::Result<Option<ObjectMeta>> {
    // The file's path is only built for an error or a name that is no key.
    let (meta, at) = match file.stat {
        Stat::Known(m, path) => (m, Err(path)),
        Stat::Entry(e) => match e.metadata() {
            Ok(m) => (m, Ok(e)),
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(err) => return Err(io_error(&e.path(), err)),
        },
    };
    let path = || match &at {
        Ok(e) => e.path(),
        Err(path) => path.clone(),
    };
    if !meta.is_file() {
        return Ok(None);
    }
    // The name taken verbatim (`PathPart::parse`), as `from_absolute_path`
    // takes it, not percent-encoded as `join(&str)` would.
    let part = utf8_name(&file.name).and_then(|n| PathPart::parse(n).ok());
    let location = match (&file.dir.location, part) {
        (Some(dir), Some(part)) => dir.clone().join(part),
        // Not a valid key: object_store's own conversion says why.
        _ => Path::from_absolute_path(path())?,
    };
    if !is_valid_file_path(&location) {
        return Ok(None);
    }
    Ok(Some(ObjectMeta {
        location,
        last_modified: meta.modified().map_err(|e| io_error(&path(), e))?.into(),
        size: meta.len(),
        e_tag: Some(super::local_file::etag(&meta)),
        version: None,
    }))
}

/// A file's name as a key part, when it is UTF-8.
#[cfg(unix)]
fn utf8_name(name: &[u8]) -> Option<&str> {
    std::str::from_utf8(name).ok()
}

/// Elsewhere the sort key is a lossy copy of the name: always the slow path.
#[cfg(not(unix))]
fn utf8_name(_name: &[u8]) -> Option<&str> {
    None
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

    /// Our recursive listing of `prefix`, checked against `LocalFileSystem`'s
    /// in key order: the same objects, etags included.
    async fn same_as_local_file_system(prefix: &Path) -> Vec<ObjectMeta> {
        let ours: Vec<ObjectMeta> = list_local(prefix, true).try_collect().await.expect("walk");
        let mut theirs: Vec<ObjectMeta> = LocalFileSystem::new()
            .list(Some(prefix))
            .try_collect()
            .await
            .expect("list");
        theirs.sort_by(|a, b| a.location.as_ref().cmp(b.location.as_ref()));
        assert_eq!(ours, theirs, "same objects, etags included, in key order");
        ours
    }

    #[tokio::test]
    async fn lists_what_local_file_system_lists_in_key_order() {
        let dir = tree();
        let prefix = prefix(dir.path());
        let ours = same_as_local_file_system(&prefix).await;
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
    /// Names whose `readdir` order is unlikely to be their key order.
    fn many(dir: &FsPath, n: usize) -> Vec<String> {
        let names: Vec<String> = (0..n).map(|i| format!("f{:05}", (i * 7919) % n)).collect();
        for name in &names {
            fs::write(dir.join(name), name).expect("write");
        }
        names
    }

    #[tokio::test]
    async fn a_large_directory_is_stat_in_parts_and_keeps_key_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let n = 2 * CHUNK + MIN_PART + 7;
        let mut names = many(dir.path(), n);
        fs::create_dir(dir.path().join("f01000.d")).expect("mkdir");
        fs::write(dir.path().join("f01000.d").join("in"), "x").expect("write");
        let prefix = prefix(dir.path());
        let ours = same_as_local_file_system(&prefix).await;
        names.push("f01000.d/in".into());
        names.sort();
        let keys: Vec<String> = ours
            .iter()
            .map(|m| m.location.as_ref()[prefix.as_ref().len() + 1..].to_string())
            .collect();
        assert_eq!(keys, names);
    }

    #[tokio::test]
    async fn a_file_is_stat_only_once_the_chunk_before_it_is_reached() {
        let dir = tempfile::tempdir().expect("tempdir");
        let n = 4 * CHUNK;
        let mut names = many(dir.path(), n);
        names.sort();
        let prefix = prefix(dir.path());
        let mut walk = list_local(&prefix, true);
        let first = walk.try_next().await.expect("walk").expect("a file");
        assert!(first.location.as_ref().ends_with(&names[0]));
        // Files past the second chunk vanish: a consumer that stopped here
        // (a `limit`) never had them stat'ed, one that goes on skips them;
        // the second chunk, read ahead, is listed whole.
        for name in &names[2 * CHUNK..] {
            fs::remove_file(dir.path().join(name)).expect("rm");
        }
        let rest: Vec<ObjectMeta> = walk.try_collect().await.expect("walk");
        assert_eq!(rest.len(), 2 * CHUNK - 1);
        assert!(
            rest.last()
                .expect("last")
                .location
                .as_ref()
                .ends_with(&names[2 * CHUNK - 1])
        );
    }

    #[tokio::test]
    async fn a_dropped_listing_stops_its_walk() {
        let dir = tempfile::tempdir().expect("tempdir");
        many(dir.path(), 3 * CHUNK);
        let prefix = prefix(dir.path());
        let metrics = tokio::runtime::Handle::current().metrics();
        let mut walk = list_local(&prefix, true);
        walk.try_next().await.expect("walk").expect("a file");
        assert_eq!(
            metrics.num_alive_tasks(),
            1,
            "the walk runs ahead in a task"
        );
        drop(walk);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while metrics.num_alive_tasks() > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the walk's task outlived its listing"
            );
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }
}
