//! Exclusion per key across processes: a [`KeyLock`] (an exclusive `flock` on
//! `<entry>.lock`) held while checking and fetching (in process, callers take
//! turns first through [`crate::util::single_flight`]).
//! A lock file is unlinked only by its holder, so a waiter that locked an
//! unlinked file notices ([`still_linked`]) and retries.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use fs4::{FileExt, TryLockError};

use super::LOCK_SUFFIX;
use crate::error::{Error, Result};

pub(super) fn lock_path(entry: &Path) -> PathBuf {
    let mut s = entry.as_os_str().to_owned();
    s.push(LOCK_SUFFIX);
    PathBuf::from(s)
}

pub(super) enum TryLock {
    Acquired(KeyLock),
    Busy,
    Missing,
}

/// An exclusive `flock` on a key's lock file, released on drop.
pub(super) struct KeyLock {
    file: fs::File,
}

impl KeyLock {
    fn open(path: &Path, create: bool) -> io::Result<fs::File> {
        fs::File::options()
            .read(true)
            .write(true)
            .create(create)
            .truncate(false)
            .open(path)
    }

    /// Blocks until the lock is held.
    pub(super) fn acquire(path: &Path) -> Result<Self> {
        loop {
            let file = Self::open(path, true).map_err(|e| Error::io(path.display(), e))?;
            FileExt::lock(&file).map_err(|e| Error::io(path.display(), e))?;
            // A pruner may have unlinked the file while we waited: lock the new one.
            if still_linked(&file, path) {
                return Ok(Self { file });
            }
        }
    }

    /// The lock if nobody holds it now. Without `create`, a missing lock file is
    /// reported as such: then nobody holds it, as a lock file is only unlinked by
    /// its holder.
    pub(super) fn try_acquire(path: &Path, create: bool) -> Result<TryLock> {
        let file = match Self::open(path, create) {
            Ok(f) => f,
            Err(e) if !create && e.kind() == io::ErrorKind::NotFound => {
                return Ok(TryLock::Missing);
            }
            Err(e) => return Err(Error::io(path.display(), e)),
        };
        match FileExt::try_lock(&file) {
            Ok(()) if still_linked(&file, path) => Ok(TryLock::Acquired(Self { file })),
            Ok(()) => Ok(TryLock::Missing),
            Err(TryLockError::WouldBlock) => Ok(TryLock::Busy),
            Err(TryLockError::Error(e)) => Err(Error::io(path.display(), e)),
        }
    }

    /// Unlinks the lock file while holding it (waiters notice and retry).
    pub(super) fn remove(self, path: &Path) -> Result<()> {
        #[cfg(unix)]
        remove_if_exists(path)?;
        #[cfg(not(unix))]
        let _ = path;
        drop(self);
        Ok(())
    }
}

impl Drop for KeyLock {
    fn drop(&mut self) {
        let _ = FileExt::unlock(&self.file);
    }
}

/// Whether `path` still names the locked file.
pub(super) fn still_linked(file: &fs::File, path: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        match (file.metadata(), fs::metadata(path)) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    {
        let _ = (file, path);
        true
    }
}

pub(super) fn remove_if_exists(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(Error::io(path.display(), e)),
        _ => Ok(()),
    }
}
