//! Complete cache entries: their stable keys ([`SharedCache::key`]), how one
//! is installed (fetched into a temp file under the key's lock, fsynced,
//! size-checked, locked shared and renamed into place, so a reader never sees
//! a half-written entry) and [`PinnedEntry`]s (a shared `flock` per pinned entry per
//! process, counted in-process) that keep an entry from being pruned, here or
//! in another process, while they live.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::SystemTime;

use fs4::FileExt;
use sha2::{Digest, Sha256};
use tempfile::TempPath;
use udfchain_udfs::File;

use super::key_lock::{KeyLock, lock_path, still_linked};
use super::{Inner, SharedCache, TEMP_PREFIX};
use crate::error::{Error, Result};
use crate::util::lock::lock;

/// A cache entry held in place: no pruning, in this process or another, removes
/// it while the `PinnedEntry` lives. Dropping the last `PinnedEntry` of an entry releases it.
#[must_use]
pub struct PinnedEntry {
    held: Arc<OpenEntry>,
    inner: Arc<Inner>,
}

/// One pinned entry: its open file holds a shared `flock`.
#[derive(Debug)]
pub(super) struct OpenEntry {
    file: fs::File,
    path: PathBuf,
    key: String,
}

impl PinnedEntry {
    /// The entry's path; it names the complete entry while the pin lives.
    pub fn path(&self) -> &Path {
        &self.held.path
    }
}

impl std::fmt::Debug for PinnedEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("PinnedEntry").field(&self.held.path).finish()
    }
}

impl Drop for PinnedEntry {
    fn drop(&mut self) {
        let mut pins = lock(&self.inner.pins);
        // Clones of `held` are only made under this lock: 1 means ours is the last.
        if Arc::strong_count(&self.held) == 1
            && pins
                .get(&self.held.key)
                .is_some_and(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(&self.held)))
        {
            pins.remove(&self.held.key);
        }
    }
}

impl SharedCache {
    /// The stable key of `file`: SHA-256 hex of its source, path, identity (version,
    /// else etag, else size and last_modified) and location. It is the entry's name.
    pub fn key(file: &File) -> String {
        let identity = match (&file.version, &file.etag) {
            (Some(v), _) => format!("version:{v}"),
            (None, Some(e)) => format!("etag:{e}"),
            (None, None) => match file.last_modified {
                Some(ms) => format!("size:{}:modified:{ms}", file.size),
                None => format!("size:{}", file.size),
            },
        };
        let location = match &file.location {
            Some(l) => format!("some:{l}"),
            None => "none".to_string(),
        };
        let mut h = Sha256::new();
        for part in [
            "udfchain-cache-v1",
            &file.source,
            &file.path,
            &identity,
            &location,
        ] {
            // Length-prefixed, so field boundaries cannot shift between files.
            h.update((part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        h.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl Inner {
    /// Pins the entry `key` at `entry` if it is complete (`size` bytes; a
    /// wrong-size entry is deleted) and not being removed, refreshing its mtime.
    pub(super) fn pin(self: &Arc<Self>, key: &str, entry: &Path, size: u64) -> Option<PinnedEntry> {
        if let Some(held) = lock(&self.pins).get(key).and_then(Weak::upgrade)
            && still_linked(&held.file, entry)
            && held.file.metadata().is_ok_and(|m| m.len() == size)
        {
            let _ = held.file.set_modified(SystemTime::now());
            return Some(PinnedEntry {
                held,
                inner: Arc::clone(self),
            });
        }
        let file = fs::File::open(entry).ok()?;
        let meta = file.metadata().ok()?;
        if !meta.is_file() {
            return None;
        }
        if meta.len() != size {
            if still_linked(&file, entry) {
                let _ = fs::remove_file(entry);
            }
            return None;
        }
        // Fails only while a pruner holds it exclusively, about to unlink it.
        FileExt::try_lock_shared(&file).ok()?;
        // The pruner may have unlinked it between our open and our lock.
        if !still_linked(&file, entry) {
            return None;
        }
        let _ = file.set_modified(SystemTime::now());
        Some(self.adopt(key.to_string(), entry.to_path_buf(), file))
    }

    /// Registers `file`, the shared-locked entry `key` at `path`, as pinned.
    pub(super) fn adopt(
        self: &Arc<Self>,
        key: String,
        path: PathBuf,
        file: fs::File,
    ) -> PinnedEntry {
        let held = Arc::new(OpenEntry {
            file,
            path,
            key: key.clone(),
        });
        lock(&self.pins).insert(key, Arc::downgrade(&held));
        PinnedEntry {
            held,
            inner: Arc::clone(self),
        }
    }
}

pub(super) enum Prepared {
    Hit(PinnedEntry),
    Fetch(KeyLock, TempPath),
}

/// Under the key's file lock: the entry, pinned, if another process wrote it
/// meanwhile, else the lock and a fresh temp file to fetch into.
pub(super) fn prepare(inner: &Arc<Inner>, entry: &Path, key: &str, size: u64) -> Result<Prepared> {
    let shard = entry.parent().unwrap_or(entry);
    fs::create_dir_all(shard).map_err(|e| Error::io(shard.display(), e))?;
    let lock_file = lock_path(entry);
    let lock = KeyLock::acquire(&lock_file)?;
    if let Some(p) = inner.pin(key, entry, size) {
        let _ = lock.remove(&lock_file);
        return Ok(Prepared::Hit(p));
    }
    let prefix = format!("{TEMP_PREFIX}{key}-");
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(fs::Permissions::from_mode(0o644));
    }
    let tmp = builder
        .tempfile_in(shard)
        .map_err(|e| Error::io(shard.display(), e))?
        .into_temp_path();
    Ok(Prepared::Fetch(lock, tmp))
}

/// Fsyncs the fetched temp file, checks its size, locks it shared (pinning it
/// before anyone can see it) and renames it into place; returns the locked file.
pub(super) fn install(tmp: TempPath, entry: &Path, size: u64, url: &str) -> Result<fs::File> {
    let io_err = |e| Error::io(tmp.display(), e);
    let f = fs::File::options()
        .read(true)
        .write(true)
        .open(&tmp)
        .map_err(io_err)?;
    f.sync_all().map_err(io_err)?;
    let got = f.metadata().map_err(io_err)?.len();
    if got != size {
        return Err(Error::Storage {
            url: url.to_string(),
            source: Arc::new(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("downloaded {got} bytes into the cache, but the file's size is {size}"),
            )),
        });
    }
    // The same clock as a pin's touch, at full precision, for LRU order.
    let _ = f.set_modified(SystemTime::now());
    FileExt::lock_shared(&f).map_err(io_err)?;
    tmp.persist(entry)
        .map_err(|e| Error::io(entry.display(), e.error))?;
    #[cfg(unix)]
    if let Some(shard) = entry.parent()
        && let Ok(d) = fs::File::open(shard)
    {
        let _ = d.sync_all();
    }
    Ok(f)
}
