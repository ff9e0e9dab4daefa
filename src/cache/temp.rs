//! `TempCache`: the per-UDF, per-partition temporary dir that prefetched files
//! live in when `cache = false`, and the small files it holds in memory instead.
//!
//! Guarantees: every row counts one reference per file it holds (one per
//! column, so a file in two columns of a row counts twice) and releases each
//! once; a file is deleted (or its bytes dropped) as soon as the last reference
//! is released, never before, so disk and memory use stay within the prefetch
//! window plus the files being processed; a row passed on without a copy of a
//! file (its download failed under `on_error = null`) holds a placeholder
//! reference, so its release cannot drop another row's copy; a file held in
//! memory is written to the dir only when a UDF asks for its path;
//! the whole dir is removed when the cache is dropped (the UDF's stream ended,
//! failed, was dropped or unwound from a panic); the process holds the dir's
//! owner lock ([`crate::util::owner`]) for the cache's life, so a dir whose lock
//! is free (its owner was killed with SIGKILL) is swept by the next
//! [`TempCache::open_blocking`] under the same root, and a live owner's dir never
//! is, whatever the pid or the OS. [`TempCache::new`] does no I/O: the dir is
//! made by `open_blocking`, which the prefetch stream runs on the blocking pool
//! before its first row, never on the thread that executes the plan.

use std::collections::HashMap;
use std::collections::HashSet;
use std::collections::hash_map::Entry as Slot;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use udfchain_udfs::File;

use crate::cache::{DiskReservation, LocalCopies, file_key};
use crate::error::{Error, Result};
use crate::util::lock::lock;
use crate::util::owner::{self, OwnerLock};

/// A temporary dir of prefetched files, with reference counts per file.
#[derive(Debug)]
pub struct TempCache {
    dir: PathBuf,
    /// Set once the dir exists; held until the dir is removed (fields drop
    /// after `Drop::drop`).
    owner: Mutex<Option<OwnerLock>>,
    entries: Mutex<HashMap<String, Entry>>,
    next: AtomicU64,
    fallback: OnceLock<Arc<dyn LocalCopies>>,
}

#[derive(Debug)]
struct Entry {
    copy: TempCopy,
    refs: usize,
    /// The disk space a copy on disk took (released with the entry).
    _disk: Option<DiskReservation>,
}

/// Where a prefetched file is held.
#[derive(Debug, Clone)]
enum TempCopy {
    Disk(PathBuf),
    Memory(bytes::Bytes),
    /// No copy: rows whose download of the file failed still count on it.
    Missing,
}

impl TempCache {
    /// A cache whose dir will be `root/tmp/prefetch-<pid>-<n>`; no I/O (see
    /// [`TempCache::open_blocking`]).
    pub fn new(root: &Path) -> Arc<Self> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = root.join("tmp").join(format!(
            "prefetch-{}-{nanos:x}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        Arc::new(Self {
            dir,
            owner: Mutex::new(None),
            entries: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
            fallback: OnceLock::new(),
        })
    }

    /// `fallback` serves files this cache does not hold (the shared cache).
    pub fn set_fallback(&self, fallback: Arc<dyn LocalCopies>) {
        let _ = self.fallback.set(fallback);
    }

    /// Makes the dir, owned by this process, first sweeping (once per root per
    /// process) the dirs whose owner is gone. Blocking: file system calls.
    pub fn open_blocking(&self) -> Result<()> {
        let mut owner = lock(&self.owner);
        if owner.is_some() {
            return Ok(());
        }
        let tmp = self.dir.parent().unwrap_or(&self.dir).to_path_buf();
        static SWEPT: Mutex<Option<HashSet<PathBuf>>> = Mutex::new(None);
        let first = lock(&SWEPT)
            .get_or_insert_with(HashSet::new)
            .insert(tmp.clone());
        if first {
            sweep_orphans(&tmp);
        }
        std::fs::create_dir_all(&tmp).map_err(|e| Error::io(tmp.display(), e))?;
        let lock =
            OwnerLock::create_dir(&self.dir).map_err(|e| Error::io(self.dir.display(), e))?;
        *owner = Some(lock);
        Ok(())
    }

    /// The dir (its tests check it is kept or gone).
    #[cfg(test)]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A fresh path in this dir to download `file` to.
    pub fn new_path(&self, file: &File) -> PathBuf {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let ext = file
            .name()
            .rsplit_once('.')
            .map(|(_, e)| e)
            .unwrap_or("bin");
        self.dir.join(format!("{n}.{ext}"))
    }

    /// Registers a complete download of `file` at `path` for one more row,
    /// with the disk space it took (released when the copy is deleted).
    pub fn insert(&self, file: &File, path: PathBuf, disk: Option<DiskReservation>) {
        self.hold(file, TempCopy::Disk(path), disk);
    }

    /// Registers the complete bytes of `file`, held in memory, for one more row.
    pub fn insert_bytes(&self, file: &File, bytes: bytes::Bytes) {
        self.hold(file, TempCopy::Memory(bytes), None);
    }

    fn hold(&self, file: &File, copy: TempCopy, disk: Option<DiskReservation>) {
        let mut entries = lock(&self.entries);
        match entries.entry(file_key(file)) {
            Slot::Occupied(mut held) => {
                let e = held.get_mut();
                e.refs += 1;
                match (&copy, &e.copy) {
                    // Rows whose download failed wait on it: the copy is theirs too.
                    (_, TempCopy::Missing) => {
                        e.copy = copy;
                        e._disk = disk;
                    }
                    // Already held (the same file in two rows of the window): keep one copy.
                    (TempCopy::Disk(new), TempCopy::Disk(old)) if new != old => {
                        let _ = std::fs::remove_file(new);
                    }
                    _ => {}
                }
            }
            Slot::Vacant(slot) => {
                slot.insert(Entry {
                    copy,
                    refs: 1,
                    _disk: disk,
                });
            }
        }
    }

    /// Counts one more row using `file` (a row whose download of it failed
    /// under `on_error = null`), whether or not a copy is held.
    pub fn hold_missing(&self, file: &File) {
        self.hold(file, TempCopy::Missing, None);
    }

    /// Counts one more row using `file` if a copy of it is already held.
    pub fn acquire(&self, file: &File) -> bool {
        let mut entries = lock(&self.entries);
        match entries.get_mut(&file_key(file)) {
            Some(e) if !matches!(e.copy, TempCopy::Missing) => {
                e.refs += 1;
                true
            }
            _ => false,
        }
    }

    /// Files currently counted on (copies and placeholders).
    pub fn len(&self) -> usize {
        lock(&self.entries).len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl LocalCopies for TempCache {
    /// A file held in memory is written out first (once; the entry then points
    /// at the file), since the caller wants a path.
    fn local_path(&self, file: &File) -> Option<PathBuf> {
        let mut entries = lock(&self.entries);
        let entry = match entries.get_mut(&file_key(file)) {
            Some(e) if !matches!(e.copy, TempCopy::Missing) => e,
            _ => {
                drop(entries);
                return self.fallback.get()?.local_path(file);
            }
        };
        match &entry.copy {
            TempCopy::Disk(p) => Some(p.clone()),
            TempCopy::Missing => None,
            TempCopy::Memory(bytes) => {
                let path = self.new_path(file);
                std::fs::write(&path, bytes).ok()?;
                entry.copy = TempCopy::Disk(path.clone());
                Some(path)
            }
        }
    }

    fn local_bytes(&self, file: &File) -> Option<bytes::Bytes> {
        match &lock(&self.entries).get(&file_key(file))?.copy {
            TempCopy::Memory(b) => Some(b.clone()),
            TempCopy::Disk(_) | TempCopy::Missing => None,
        }
    }

    /// With no fallback and no entry (every file read where it is).
    fn holds_nothing(&self) -> bool {
        self.fallback.get().is_none() && lock(&self.entries).is_empty()
    }

    fn release(&self, file: &File) {
        let mut entries = lock(&self.entries);
        let k = file_key(file);
        if let Some(e) = entries.get_mut(&k) {
            e.refs -= 1;
            if e.refs == 0
                && let Some(Entry {
                    copy: TempCopy::Disk(path),
                    ..
                }) = entries.remove(&k)
            {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
}

impl Drop for TempCache {
    fn drop(&mut self) {
        let opened = self.owner.get_mut().map(|o| o.is_some()).unwrap_or(true);
        if opened {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Removes `prefetch-*` dirs under `tmp` whose owner lock is free (the owner
/// process is gone); a dir without a lock file only once it is older than
/// [`owner::GRACE`].
pub fn sweep_orphans(tmp: &Path) {
    let Ok(dirs) = std::fs::read_dir(tmp) else {
        return;
    };
    for d in dirs.flatten() {
        if d.file_name().to_string_lossy().starts_with("prefetch-") {
            let _ = owner::remove_if_orphan(&d.path(), owner::GRACE);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opened(root: &Path) -> Arc<TempCache> {
        let cache = TempCache::new(root);
        cache.open_blocking().expect("open");
        cache
    }

    #[test]
    fn a_held_dir_is_kept_and_a_dir_with_a_free_lock_is_swept_whatever_its_pid() {
        let root = tempfile::tempdir().expect("root");
        let tmp = root.path().join("tmp");
        let live = opened(root.path());
        // A dir whose owner is gone (lock released), with a pid file naming a
        // running process (this one), as after pid reuse.
        let orphan = tmp.join("prefetch-orphan");
        drop(OwnerLock::create_dir(&orphan).expect("orphan"));
        std::fs::write(orphan.join("owner.pid"), std::process::id().to_string()).expect("pid");
        std::fs::write(orphan.join("0.bin"), b"left over").expect("file");
        sweep_orphans(&tmp);
        assert!(live.dir().exists(), "a live cache's dir is kept");
        assert!(!orphan.exists(), "a dir with a free lock is swept");
        let dir = live.dir().to_path_buf();
        drop(live);
        assert!(!dir.exists(), "removed when the cache is dropped");
    }

    fn file(path: &str) -> File {
        File {
            source: "s3://bucket".into(),
            path: path.into(),
            size: 3,
            ..File::default()
        }
    }

    #[test]
    fn a_copy_lives_until_its_last_row_releases_it() {
        let root = tempfile::tempdir().expect("root");
        let cache = opened(root.path());
        let (a, b) = (file("a.bin"), file("b.bin"));
        // Row 1 holds `a` in both columns; row 2 holds `a` too.
        let path = cache.new_path(&a);
        std::fs::write(&path, b"abc").expect("write");
        cache.insert(&a, path.clone(), None);
        assert!(cache.acquire(&a));
        assert!(cache.acquire(&a));
        cache.release(&a);
        cache.release(&a);
        assert!(path.exists(), "row 2 still holds it");
        assert_eq!(cache.local_path(&a), Some(path.clone()));
        cache.release(&a);
        assert!(!path.exists() && cache.is_empty());

        // Row 3's download of `b` failed (a placeholder); row 4 downloads it.
        cache.hold_missing(&b);
        assert!(!cache.acquire(&b), "a placeholder is no copy");
        assert_eq!(cache.local_path(&b), None);
        let path = cache.new_path(&b);
        std::fs::write(&path, b"abc").expect("write");
        cache.insert(&b, path.clone(), None);
        // Row 3 is done first: row 4's copy stays.
        cache.release(&b);
        assert!(path.exists());
        assert_eq!(cache.local_path(&b), Some(path.clone()));
        cache.release(&b);
        assert!(!path.exists() && cache.is_empty());
    }
}
