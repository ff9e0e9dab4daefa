//! Size-limited LRU pruning and sweeping: entries are removed least recently
//! used first (by mtime; a hit refreshes it), never while pinned (an entry is
//! removed only under an exclusive `flock` taken without waiting, and under
//! its key's lock); leftover temp files and unused lock files of cancelled or
//! killed fetches are swept. A write with a limit prunes to 90% of it once the
//! estimated total may be over it.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use fs4::{FileExt, TryLockError};

use super::key_lock::{KeyLock, TryLock, lock_path, remove_if_exists, still_linked};
use super::{CacheUsage, Inner, KEY_LEN, LOCK_SUFFIX, TEMP_PREFIX};
use crate::error::{Error, Result};
use crate::util::lock::lock;

impl Inner {
    /// After writing `written` bytes: prunes to 90% of `limit` if the total may
    /// be over it.
    pub(super) fn prune_after_write(&self, limit: u64, written: u64) -> Result<()> {
        let mut est = lock(&self.estimate);
        if let Some(e) = est.as_mut() {
            *e = e.saturating_add(written);
            if *e <= limit {
                return Ok(());
            }
        }
        *est = None;
        let low_water = limit - limit / 10;
        let (_, remaining) = prune(&self.dir, low_water)?;
        *est = Some(remaining);
        Ok(())
    }
}

/// Removes LRU entries (skipping pinned ones) until the total is at most
/// `max_bytes`, then sweeps. Returns (removed, remaining total).
pub(super) fn prune(dir: &Path, max_bytes: u64) -> Result<(CacheUsage, u64)> {
    let mut scan = scan(dir)?;
    scan.entries
        .sort_by(|a, b| (a.mtime, &a.path).cmp(&(b.mtime, &b.path)));
    let mut total: u64 = scan.entries.iter().map(|e| e.len).sum();
    let mut removed = CacheUsage::default();
    for e in &scan.entries {
        if total <= max_bytes {
            break;
        }
        match remove_entry(&e.path)? {
            Removal::Removed => {
                removed.files += 1;
                removed.bytes += e.len;
                total -= e.len;
            }
            Removal::Gone => total -= e.len,
            Removal::Pinned => {}
        }
    }
    sweep(&scan)?;
    Ok((removed, total))
}

pub(super) enum Removal {
    Removed,
    /// Removed or replaced by someone else meanwhile.
    Gone,
    Pinned,
}

/// Removes the entry at `path` unless it is pinned: under an exclusive `flock`
/// taken without waiting (a pinner holds a shared one), and under the key's lock
/// taken without waiting, since a writer renames a new entry into place only
/// while it holds that lock: without it, a writer whose pin failed against our
/// exclusive lock could fetch and rename its new entry over the path between our
/// check and our unlink, and we would unlink its pinned entry. Then removes the
/// lock file.
pub(super) fn remove_entry(path: &Path) -> Result<Removal> {
    let lock_file = lock_path(path);
    let key_lock = match KeyLock::try_acquire(&lock_file, true)? {
        TryLock::Acquired(lock) => lock,
        // A writer or a waiter has the key: leave the entry to them.
        TryLock::Busy | TryLock::Missing => return Ok(Removal::Pinned),
    };
    let file = match fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            key_lock.remove(&lock_file)?;
            return Ok(Removal::Gone);
        }
        Err(e) => return Err(Error::io(path.display(), e)),
    };
    match FileExt::try_lock(&file) {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            key_lock.remove(&lock_file)?;
            return Ok(Removal::Pinned);
        }
        Err(TryLockError::Error(e)) => return Err(Error::io(path.display(), e)),
    }
    if !still_linked(&file, path) {
        key_lock.remove(&lock_file)?;
        return Ok(Removal::Gone);
    }
    // A pinner that opened it before this lock finds it unlinked once it locks.
    remove_if_exists(path)?;
    drop(file);
    key_lock.remove(&lock_file)?;
    Ok(Removal::Removed)
}

/// Removes temp files and lock files of keys nobody holds locked (leftovers of
/// cancelled or killed fetches, or of removed entries).
pub(super) fn sweep(scan: &Scan) -> Result<()> {
    for (tmp, entry) in &scan.temps {
        // A temp file's writer holds its key's lock until the temp file is gone.
        let lock_file = lock_path(entry);
        match KeyLock::try_acquire(&lock_file, false)? {
            TryLock::Busy => {}
            TryLock::Missing => remove_if_exists(tmp)?,
            TryLock::Acquired(lock) => {
                remove_if_exists(tmp)?;
                if !entry.exists() {
                    lock.remove(&lock_file)?;
                }
            }
        }
    }
    for (lock_file, entry) in &scan.locks {
        if entry.exists() {
            continue;
        }
        if let TryLock::Acquired(lock) = KeyLock::try_acquire(lock_file, false)?
            && !entry.exists()
        {
            lock.remove(lock_file)?;
        }
    }
    Ok(())
}

pub(super) struct EntryInfo {
    pub(super) path: PathBuf,
    pub(super) len: u64,
    mtime: SystemTime,
}

/// The cache dir's files by kind; temps and locks with their entry's path.
#[derive(Default)]
pub(super) struct Scan {
    pub(super) entries: Vec<EntryInfo>,
    temps: Vec<(PathBuf, PathBuf)>,
    locks: Vec<(PathBuf, PathBuf)>,
}

fn is_key(s: &str) -> bool {
    s.len() == KEY_LEN && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Reads a directory; a directory removed meanwhile reads as empty.
fn read_dir(dir: &Path) -> Result<Vec<fs::DirEntry>> {
    match fs::read_dir(dir) {
        Ok(rd) => rd
            .collect::<io::Result<Vec<_>>>()
            .map_err(|e| Error::io(dir.display(), e)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(Error::io(dir.display(), e)),
    }
}

pub(super) fn scan(dir: &Path) -> Result<Scan> {
    let mut scan = Scan::default();
    for shard in read_dir(dir)? {
        let name = shard.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.len() != 2 || !name.bytes().all(|b| b.is_ascii_hexdigit()) {
            continue;
        }
        let shard = shard.path();
        if !shard.is_dir() {
            continue;
        }
        for f in read_dir(&shard)? {
            let name = f.file_name();
            let Some(name) = name.to_str() else { continue };
            let path = f.path();
            if is_key(name) {
                let meta = match f.metadata() {
                    Ok(m) => m,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(Error::io(path.display(), e)),
                };
                if meta.is_file() {
                    scan.entries.push(EntryInfo {
                        len: meta.len(),
                        mtime: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                        path,
                    });
                }
            } else if let Some(key) = name.strip_suffix(LOCK_SUFFIX)
                && is_key(key)
            {
                scan.locks.push((path, shard.join(key)));
            } else if let Some(key) = name
                .strip_prefix(TEMP_PREFIX)
                .and_then(|rest| rest.get(..KEY_LEN))
                && is_key(key)
            {
                scan.temps.push((path, shard.join(key)));
            }
        }
    }
    Ok(scan)
}
