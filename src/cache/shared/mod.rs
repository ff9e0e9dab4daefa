//! [`SharedCache`]: a persistent cache of whole stored objects in one local
//! directory, shared by every thread and every process that opens it.
//!
//! Guarantees:
//! - **One instance per dir per process.** [`SharedCache::open`] returns a handle
//!   to the process-wide state of the canonical dir (single-flight map, pin table,
//!   size estimate), so every partition and every operator of every query in the
//!   process shares them; each handle keeps its own size limit.
//! - **Complete entries only.** An entry appears by renaming a fully written,
//!   fsynced temp file whose length was checked against `File::size`, so a reader
//!   never sees a half-written entry. A lookup also checks the length and deletes
//!   an entry that does not match (a truncated or damaged file).
//! - **One download per key.** Concurrent [`SharedCache::get_or_fetch`] calls for
//!   one key in a process wait for a single fetch (per-key async mutex), and
//!   processes exclude each other with an exclusive file lock on `<entry>.lock`
//!   held while checking and fetching.
//! - **Pinned entries stay.** [`SharedCache::get_or_fetch`] and
//!   [`SharedCache::pin`] return a [`PinnedEntry`]: while it lives the entry holds a shared
//!   `flock` (one open file per pinned entry per process, counted in-process), and
//!   pruning or clearing, here or in another process, removes an entry only under
//!   an exclusive `flock` it can take without waiting, so a pinned entry is never
//!   removed, even when it is the least recently used. A new entry is pinned before
//!   its rename, so not even the prune that follows its own write can remove it.
//!   A process killed while holding pins releases them with its file descriptors.
//! - **Size limit.** With a limit, writes prune least-recently-used entries (by
//!   mtime; a hit refreshes it) to 90% of the limit once the total may be over it.
//!   Pinned entries are skipped, so while more than the limit is pinned (a
//!   prefetch window of large files, several readers) the cache exceeds its
//!   limit until the pins are released and a later write prunes again.
//! - **Stable keys.** Entry names are SHA-256 hex of the file's identity (source,
//!   path, version or etag or size and mtime, location), equal across processes.
//! - **Cancel safety.** Dropping a `get_or_fetch` future leaves no partial entry: its
//!   temp file is removed, and any temp file left by a killed process is ignored by
//!   lookups and `du` and removed by `prune_to`/`clear` (its writer's key lock died
//!   with it).
//!
//! One concept per file: this file the handle, its process-wide state and the
//! single-flight fetch; `entry.rs` complete entries, their stable keys and
//! pins; `lock.rs` the per-key file locks (across processes) and in-process
//! flights; `prune.rs` size-limited LRU pruning and sweeping leftovers.
//!
//! Layout: `<dir>/<first 2 hex chars>/<hex>` is an entry; `<hex>.lock` and
//! `.tmp-<hex>-*` next to it are its lock file and in-progress downloads. The
//! lock file exists only while a fetch of the key runs (its holder unlinks it
//! when done; waiters on the unlinked file notice and retry), so a settled
//! cache holds one inode per entry.

mod entry;
mod key_lock;
mod prune;

pub use entry::PinnedEntry;

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

use udfchain_udfs::File;

use self::entry::{OpenEntry, Prepared, install, prepare};
use self::key_lock::lock_path;
use self::prune::{prune, remove_entry, scan, sweep};
use crate::cache::LocalCopies;
use crate::error::{Error, Result};
use crate::runtime::blocking;
use crate::util::lock::lock;
use crate::util::single_flight::SingleFlight;

/// Hex chars of an entry name (SHA-256).
const KEY_LEN: usize = 64;
const LOCK_SUFFIX: &str = ".lock";
const TEMP_PREFIX: &str = ".tmp-";

/// Number and total size of cache entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CacheUsage {
    /// Entries (files) counted.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
}

/// The process-wide state of one cache dir.
#[derive(Debug)]
struct Inner {
    /// The canonical dir.
    dir: PathBuf,
    /// In-process single flight: one async mutex per key being fetched.
    flights: SingleFlight,
    /// Upper estimate of the total entry bytes (`None`: unknown), so that a write
    /// under the limit does not rescan the directory.
    estimate: Mutex<Option<u64>>,
    /// The pinned entries by key: one open, shared-locked file each.
    pins: Mutex<HashMap<String, Weak<OpenEntry>>>,
}

/// A persistent, size-limited cache of whole objects in a local directory: a
/// handle to the process-wide instance of its dir.
pub struct SharedCache {
    inner: Arc<Inner>,
    limit: Option<u64>,
}

impl std::fmt::Debug for SharedCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedCache")
            .field("dir", &self.inner.dir)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

impl SharedCache {
    /// Opens (creating) the cache dir. `limit`: max total bytes of entries,
    /// LRU-evicted by this handle's writes. Every handle on one dir (by its
    /// canonical path) in this process shares one instance.
    pub fn open(dir: impl Into<PathBuf>, limit: Option<u64>) -> Result<Arc<Self>> {
        static OPEN: Mutex<BTreeMap<PathBuf, Weak<Inner>>> = Mutex::new(BTreeMap::new());
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(|e| Error::io(dir.display(), e))?;
        let dir = fs::canonicalize(&dir).map_err(|e| Error::io(dir.display(), e))?;
        let mut open = lock(&OPEN);
        open.retain(|_, w| w.strong_count() > 0);
        let inner = match open.get(&dir).and_then(Weak::upgrade) {
            Some(inner) => inner,
            None => {
                let inner = Arc::new(Inner {
                    dir: dir.clone(),
                    flights: SingleFlight::default(),
                    estimate: Mutex::new(None),
                    pins: Mutex::default(),
                });
                open.insert(dir, Arc::downgrade(&inner));
                inner
            }
        };
        Ok(Arc::new(Self { inner, limit }))
    }

    /// The cache directory (canonical).
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Path of the complete entry if present and its length == `file.size`; a
    /// wrong-size (e.g. truncated) entry is deleted and `None` returned. A hit
    /// refreshes the entry's mtime, which orders LRU eviction. The entry is not
    /// pinned: use [`SharedCache::pin`] to keep it while reading.
    pub fn get(&self, file: &File) -> Option<PathBuf> {
        self.pin(file).map(|p| p.path().to_path_buf())
    }

    /// Pins the complete entry of `file` if present (as [`SharedCache::get`]
    /// finds it): it stays until the returned `PinnedEntry` is dropped.
    pub fn pin(&self, file: &File) -> Option<PinnedEntry> {
        let key = Self::key(file);
        let entry = self.entry_path(&key);
        self.inner.pin(&key, &entry, file.size)
    }

    /// Returns the entry of `file`, pinned, downloading it with `fetch` if
    /// missing, as `(pin, downloaded)`. `fetch(tmp)` must write the whole object
    /// to `tmp`, a temp file inside the cache dir; the entry appears only if it
    /// then holds exactly `file.size` bytes (else an error naming the file and
    /// both sizes).
    ///
    /// Concurrent calls for one key, in this process or others sharing the dir, run
    /// one fetch; the others wait for it and return its entry. After a write, with
    /// a limit set and the total over it, least-recently-used unpinned entries are
    /// pruned to 90% of the limit (so a full cache is not rescanned on every
    /// write); pruning is housekeeping, its errors do not fail the call.
    ///
    /// # Cancel safety
    /// Dropping the future leaves no partial entry visible (a leftover temp file is
    /// ignored by lookups and `du` and removed by `clear`/`prune_to`); once the
    /// fetch has finished, the entry is completed in the background.
    pub async fn get_or_fetch<F, Fut>(&self, file: &File, fetch: F) -> Result<(PinnedEntry, bool)>
    where
        F: FnOnce(PathBuf) -> Fut,
        Fut: Future<Output = Result<()>>,
    {
        let key = Self::key(file);
        let entry = self.entry_path(&key);
        let size = file.size;
        if let Some(p) = self.inner.pin(&key, &entry, size) {
            return Ok((p, false));
        }

        let flight = self.inner.flights.join(&key);
        let _turn = flight.turn().await;
        // The caller ahead of us may just have written it.
        if let Some(p) = self.inner.pin(&key, &entry, size) {
            return Ok((p, false));
        }

        let prepared = blocking({
            let (inner, entry, key) = (Arc::clone(&self.inner), entry.clone(), key.clone());
            move || prepare(&inner, &entry, &key, size)
        })
        .await?;
        let (lock, tmp) = match prepared {
            Prepared::Hit(p) => return Ok((p, false)),
            Prepared::Fetch(lock, tmp) => (lock, tmp),
        };

        // On error or cancellation `tmp` (removing the file) and `lock` are dropped.
        fetch(tmp.to_path_buf()).await?;

        let url = file.url();
        let (inner, limit) = (Arc::clone(&self.inner), self.limit);
        let pin = blocking({
            let entry = entry.clone();
            move || {
                let file = install(tmp, &entry, size, &url)?;
                let pin = inner.adopt(key, entry.clone(), file);
                // No lock file stays behind per entry (one inode each).
                let _ = lock.remove(&lock_path(&entry));
                if let Some(limit) = limit {
                    // Best effort: the entry is complete (and pinned) whatever
                    // pruning does.
                    let _ = inner.prune_after_write(limit, size);
                }
                Ok(pin)
            }
        })
        .await?;
        Ok((pin, true))
    }

    /// Number and bytes of complete entries (temp and lock files not counted).
    pub fn du(&self) -> Result<CacheUsage> {
        let scan = scan(&self.inner.dir)?;
        Ok(CacheUsage {
            files: scan.entries.len() as u64,
            bytes: scan.entries.iter().map(|e| e.len).sum(),
        })
    }

    /// Removes least-recently-used entries until the total is at most `max_bytes`,
    /// skipping pinned entries (so the total may stay above it); also removes
    /// leftover temp files and unused lock files. Returns what was removed.
    pub fn prune_to(&self, max_bytes: u64) -> Result<CacheUsage> {
        let (removed, remaining) = prune(&self.inner.dir, max_bytes)?;
        *lock(&self.inner.estimate) = Some(remaining);
        Ok(removed)
    }

    /// Removes every entry not pinned (here or by another process), every
    /// leftover temp file and every unused lock file.
    pub fn clear(&self) -> Result<()> {
        let scan = scan(&self.inner.dir)?;
        for e in &scan.entries {
            remove_entry(&e.path)?;
        }
        sweep(&scan)?;
        *lock(&self.inner.estimate) = None;
        Ok(())
    }

    fn entry_path(&self, key: &str) -> PathBuf {
        self.inner.dir.join(&key[..2]).join(key)
    }
}

impl LocalCopies for SharedCache {
    fn local_path(&self, file: &File) -> Option<PathBuf> {
        self.get(file)
    }
}
