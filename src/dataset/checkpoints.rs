//! The checkpoints of saves under a root: `<root>/checkpoints/<dataset>-<hash>/`,
//! one per (dataset name, plan) — the hash is of the save's logical plan, which
//! names every UDF with its version — holding one memo dir per UDF (see
//! `plan/memo/`: `checkpoint.rs` and `udf_memo.rs`).
//!
//! Guarantees: a checkpoint is used by one process at a time (the owner lock
//! of its dir, released by the OS when the process dies); a save that finds
//! it held by another process runs without one rather than wait or share.
//! A save that commits removes its checkpoint and every other unheld
//! checkpoint of the same dataset (an older plan's, which no run can
//! continue any more). [`gc`] removes every checkpoint no running process
//! holds. A checkpoint never holds a dataset's rows, only UDF results, so
//! removing one costs work, never data.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::util::owner::{self, OwnerLock};

/// The dir of every checkpoint under `root`.
pub fn checkpoints_dir(root: &Path) -> PathBuf {
    root.join("checkpoints")
}

/// A checkpoint this process holds.
#[derive(Debug)]
pub struct HeldCheckpoint {
    dir: PathBuf,
    dataset: String,
    lock: Option<OwnerLock>,
}

impl HeldCheckpoint {
    /// Holds the checkpoint of saving `plan` (its text) as dataset `name`
    /// under `root`, created if missing, emptied first when `fresh`; `None`
    /// when another process holds it. Blocking file work.
    pub fn hold(root: &Path, name: &str, plan: &str, fresh: bool) -> Result<Option<Self>> {
        let parent = checkpoints_dir(root);
        std::fs::create_dir_all(&parent).map_err(|e| Error::io(parent.display(), e))?;
        let hash: String = Sha256::digest(plan)[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let dir = parent.join(format!("{name}-{hash}"));
        let Some(lock) = OwnerLock::acquire(&dir).map_err(|e| Error::io(dir.display(), e))? else {
            return Ok(None);
        };
        if fresh {
            for entry in std::fs::read_dir(&dir).map_err(|e| Error::io(dir.display(), e))? {
                let entry = entry.map_err(|e| Error::io(dir.display(), e))?;
                if entry.file_name() != owner::LOCK_FILE && entry.path().is_dir() {
                    std::fs::remove_dir_all(entry.path())
                        .map_err(|e| Error::io(entry.path().display(), e))?;
                }
            }
        }
        Ok(Some(Self {
            dir,
            dataset: name.to_string(),
            lock: Some(lock),
        }))
    }

    /// Where the save's UDFs keep their results.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// After a commit: removes this checkpoint and the dataset's other
    /// unheld ones. Blocking file work; errors are left for [`gc`].
    pub fn remove(mut self) {
        let lock = self.lock.take();
        let _ = std::fs::remove_dir_all(&self.dir);
        drop(lock);
        let Some(parent) = self.dir.parent() else {
            return;
        };
        let Ok(entries) = std::fs::read_dir(parent) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let of_dataset = name
                .to_str()
                .and_then(|n| n.rsplit_once('-'))
                .is_some_and(|(dataset, hash)| dataset == self.dataset && hash.len() == 16);
            if of_dataset {
                let _ = owner::remove_if_orphan(&entry.path(), owner::GRACE);
            }
        }
    }
}

/// A checkpoint `Catalog::remove_stale_checkpoints` removed: its dir and the bytes it held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemovedCheckpoint {
    /// The checkpoint's dir.
    pub dir: PathBuf,
    /// Bytes of its files.
    pub bytes: u64,
}

/// Removes every checkpoint under `root` that no running process holds.
/// Blocking file work.
pub fn gc(root: &Path) -> Result<Vec<RemovedCheckpoint>> {
    let parent = checkpoints_dir(root);
    let entries = match std::fs::read_dir(&parent) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(parent.display(), e)),
    };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let dir = entry.path();
        if !dir.is_dir() {
            continue;
        }
        let bytes = super::dir_bytes(&dir);
        if owner::remove_if_orphan(&dir, owner::GRACE).map_err(|e| Error::io(dir.display(), e))? {
            removed.push(RemovedCheckpoint { dir, bytes });
        }
    }
    removed.sort_by(|a, b| a.dir.cmp(&b.dir));
    Ok(removed)
}
