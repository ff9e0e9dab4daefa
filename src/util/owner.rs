//! Owner locks: a process marks a dir it works in (a dataset staging dir, a
//! per-UDF temp dir) with an exclusive `flock` (fs4) on `<dir>/.owner.lock`,
//! held for as long as it uses the dir; the OS releases it when the process
//! exits or is killed. A sweeper that can take the lock knows the owner is gone.
//!
//! Guarantees: [`remove_if_orphan`] never removes a dir whose lock is held, so
//! liveness does not depend on pids (no reuse problem) nor on `/proc`. A dir
//! only gets its lock file once the lock is held (locked under a temporary
//! name, then renamed in), so a sweeper never takes the lock of a dir being
//! created; a dir without a lock file (being created, or left by a process
//! killed while creating it) is removed only once older than the grace period.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use fs4::{FileExt, TryLockError};

/// The lock file inside an owned dir.
pub const LOCK_FILE: &str = ".owner.lock";

/// How long a dir without a lock file is left alone: it may still be in creation.
pub const GRACE: Duration = Duration::from_secs(60);

/// The held owner lock of a dir; released when dropped (or when the process dies).
#[derive(Debug)]
pub struct OwnerLock {
    dir: PathBuf,
    file: File,
}

impl OwnerLock {
    /// Creates `dir` (its parent must exist; `dir` must not) and holds its lock.
    pub fn create_dir(dir: &Path) -> io::Result<Self> {
        std::fs::create_dir(dir)?;
        let locked = (|| {
            let pending = dir.join(".owner.lock.new");
            let file = File::options()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&pending)?;
            FileExt::try_lock(&file).map_err(io::Error::from)?;
            std::fs::rename(&pending, dir.join(LOCK_FILE))?;
            Ok(file)
        })();
        match locked {
            Ok(file) => Ok(Self {
                dir: dir.to_path_buf(),
                file,
            }),
            Err(e) => {
                let _ = std::fs::remove_dir_all(dir);
                Err(e)
            }
        }
    }

    /// Holds the lock of `dir`, a dir that lives on across runs (a save's
    /// checkpoint): created as [`create_dir`](Self::create_dir) does when
    /// missing; `None` when another process holds it.
    pub fn acquire(dir: &Path) -> io::Result<Option<Self>> {
        match Self::create_dir(dir) {
            Ok(lock) => return Ok(Some(lock)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let path = dir.join(LOCK_FILE);
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        match FileExt::try_lock(&file) {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Ok(None),
            Err(TryLockError::Error(e)) => return Err(e),
        }
        if !still_linked(&file, &path) {
            // A sweeper removed the dir meanwhile: it is nobody's now.
            return Ok(None);
        }
        Ok(Some(Self {
            dir: dir.to_path_buf(),
            file,
        }))
    }

    /// Gives the dir up without removing it: the lock file is deleted first,
    /// then the lock released, so a sweeper that was waiting on it sees it
    /// unlinked and leaves the dir alone.
    pub fn release(self) -> io::Result<()> {
        std::fs::remove_file(self.dir.join(LOCK_FILE))?;
        drop(self.file);
        Ok(())
    }
}

/// Removes `dir` if its owner is gone: its lock file can be locked (and is still
/// the dir's lock file), or it has none and the dir is older than `grace`.
/// Returns whether it was removed. The lock is held while removing.
pub fn remove_if_orphan(dir: &Path, grace: Duration) -> io::Result<bool> {
    let path = dir.join(LOCK_FILE);
    let file = match File::options().read(true).write(true).open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let old = std::fs::metadata(dir)?
                .modified()
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age >= grace);
            if old {
                std::fs::remove_dir_all(dir)?;
            }
            return Ok(old);
        }
        Err(e) => return Err(e),
    };
    match FileExt::try_lock(&file) {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => return Ok(false),
        Err(TryLockError::Error(e)) => return Err(e),
    }
    if !still_linked(&file, &path) {
        // The owner released the dir (e.g. a save moving it into place).
        return Ok(false);
    }
    std::fs::remove_dir_all(dir)?;
    drop(file);
    Ok(true)
}

/// Whether `file` is still the file at `path` (not unlinked or replaced).
fn still_linked(file: &File, path: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        match (file.metadata(), std::fs::metadata(path)) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    {
        let _ = file;
        path.exists()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_dir_is_kept_and_a_released_lock_lets_it_go() {
        let root = tempfile::tempdir().expect("root");
        let dir = root.path().join("d");
        let lock = OwnerLock::create_dir(&dir).expect("create");
        assert!(dir.join(LOCK_FILE).is_file());
        assert!(!remove_if_orphan(&dir, GRACE).expect("sweep"), "held: kept");
        assert!(dir.exists());
        drop(lock);
        assert!(remove_if_orphan(&dir, GRACE).expect("sweep"), "owner gone");
        assert!(!dir.exists());
    }

    #[test]
    fn a_released_dir_is_not_swept() {
        let root = tempfile::tempdir().expect("root");
        let dir = root.path().join("d");
        OwnerLock::create_dir(&dir)
            .expect("create")
            .release()
            .expect("release");
        assert!(!dir.join(LOCK_FILE).exists());
        assert!(
            !remove_if_orphan(&dir, GRACE).expect("sweep"),
            "young, no lock"
        );
        assert!(dir.exists());
        assert!(
            remove_if_orphan(&dir, Duration::ZERO).expect("sweep"),
            "old, no lock"
        );
        assert!(!dir.exists());
    }

    #[test]
    fn an_existing_dir_is_not_taken_over() {
        let root = tempfile::tempdir().expect("root");
        let err = OwnerLock::create_dir(root.path()).expect_err("exists");
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
        assert!(root.path().exists(), "not removed on failure");
    }
}
