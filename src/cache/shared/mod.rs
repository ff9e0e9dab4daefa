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
//!   [`SharedCache::pin`] return a [`Pin`]: while it lives the entry holds a shared
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
//! Layout: `<dir>/<first 2 hex chars>/<hex>` is an entry; `<hex>.lock` and
//! `.tmp-<hex>-*` next to it are its lock file and in-progress downloads. The
//! lock file exists only while a fetch of the key runs (its holder unlinks it
//! when done; waiters on the unlinked file notice and retry), so a settled
//! cache holds one inode per entry.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::SystemTime;

use fs4::{FileExt, TryLockError};
use sha2::{Digest, Sha256};
use tempfile::TempPath;
use udfchain_udfs::File;

use crate::cache::LocalCopies;
use crate::error::{Error, Result};

/// Hex chars of an entry name (SHA-256).
const KEY_LEN: usize = 64;
const LOCK_SUFFIX: &str = ".lock";
const TEMP_PREFIX: &str = ".tmp-";

/// Number and total size of cache entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CacheUsage {
    pub files: u64,
    pub bytes: u64,
}

type Flights = Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>;

/// The process-wide state of one cache dir.
#[derive(Debug)]
struct Inner {
    /// The canonical dir.
    dir: PathBuf,
    /// In-process single flight: one async mutex per key being fetched.
    flights: Flights,
    /// Upper estimate of the total entry bytes (`None`: unknown), so that a write
    /// under the limit does not rescan the directory.
    estimate: Mutex<Option<u64>>,
    /// The pinned entries by key: one open, shared-locked file each.
    pins: Mutex<HashMap<String, Weak<Held>>>,
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

/// A cache entry held in place: no pruning, in this process or another, removes
/// it while the `Pin` lives. Dropping the last `Pin` of an entry releases it.
#[must_use]
pub struct Pin {
    held: Arc<Held>,
    inner: Arc<Inner>,
}

/// One pinned entry: its open file holds a shared `flock`.
#[derive(Debug)]
struct Held {
    file: fs::File,
    path: PathBuf,
    key: String,
}

impl Pin {
    /// The entry's path; it names the complete entry while the pin lives.
    pub fn path(&self) -> &Path {
        &self.held.path
    }
}

impl std::fmt::Debug for Pin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Pin").field(&self.held.path).finish()
    }
}

impl Drop for Pin {
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
                    flights: Mutex::default(),
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

    /// Path of the complete entry if present and its length == `file.size`; a
    /// wrong-size (e.g. truncated) entry is deleted and `None` returned. A hit
    /// refreshes the entry's mtime, which orders LRU eviction. The entry is not
    /// pinned: use [`SharedCache::pin`] to keep it while reading.
    pub fn get(&self, file: &File) -> Option<PathBuf> {
        self.pin(file).map(|p| p.path().to_path_buf())
    }

    /// Pins the complete entry of `file` if present (as [`SharedCache::get`]
    /// finds it): it stays until the returned [`Pin`] is dropped.
    pub fn pin(&self, file: &File) -> Option<Pin> {
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
    pub async fn get_or_fetch<F, Fut>(&self, file: &File, fetch: F) -> Result<(Pin, bool)>
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

        let flight = Flight::join(&self.inner.flights, &key);
        let _turn = flight.wait().await;
        // The caller ahead of us may just have written it.
        if let Some(p) = self.inner.pin(&key, &entry, size) {
            return Ok((p, false));
        }

        let prepared = blocking(&entry, {
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
        let pin = blocking(&entry, {
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

/// The shared-cache entries a prefetch window holds for its rows, in front of
/// the window's other local copies (`inner`, its temp cache): each entry stays
/// pinned until the last row using it is released.
#[derive(Debug)]
pub struct WindowPins {
    inner: Arc<dyn LocalCopies>,
    /// Pins by `source \0 path` (a virtual file shares its parent's), with the
    /// number of rows using each.
    held: Mutex<HashMap<String, (Pin, usize)>>,
}

impl WindowPins {
    pub fn new(inner: Arc<dyn LocalCopies>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            held: Mutex::default(),
        })
    }

    /// Holds `pin`, the entry of `file`, for one more row.
    pub fn hold(&self, file: &File, pin: Pin) {
        lock(&self.held)
            .entry(window_key(file))
            .and_modify(|(_, rows)| *rows += 1)
            .or_insert((pin, 1));
    }

    /// Counts one more row using `file` if its entry is held.
    pub fn acquire(&self, file: &File) -> bool {
        match lock(&self.held).get_mut(&window_key(file)) {
            Some((_, rows)) => {
                *rows += 1;
                true
            }
            None => false,
        }
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        lock(&self.held).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl LocalCopies for WindowPins {
    fn local_path(&self, file: &File) -> Option<PathBuf> {
        if let Some((pin, _)) = lock(&self.held).get(&window_key(file)) {
            return Some(pin.path().to_path_buf());
        }
        self.inner.local_path(file)
    }

    fn local_bytes(&self, file: &File) -> Option<bytes::Bytes> {
        self.inner.local_bytes(file)
    }

    fn release(&self, file: &File) {
        let mut held = lock(&self.held);
        let key = window_key(file);
        match held.get_mut(&key) {
            Some((_, rows)) => {
                *rows -= 1;
                if *rows == 0 {
                    held.remove(&key);
                }
            }
            None => {
                drop(held);
                self.inner.release(file);
            }
        }
    }
}

fn window_key(file: &File) -> String {
    format!("{}\u{0}{}", file.source, file.path)
}

impl Inner {
    /// Pins the entry `key` at `entry` if it is complete (`size` bytes; a
    /// wrong-size entry is deleted) and not being removed, refreshing its mtime.
    fn pin(self: &Arc<Self>, key: &str, entry: &Path, size: u64) -> Option<Pin> {
        if let Some(held) = lock(&self.pins).get(key).and_then(Weak::upgrade)
            && still_linked(&held.file, entry)
            && held.file.metadata().is_ok_and(|m| m.len() == size)
        {
            let _ = held.file.set_modified(SystemTime::now());
            return Some(Pin {
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
    fn adopt(self: &Arc<Self>, key: String, path: PathBuf, file: fs::File) -> Pin {
        let held = Arc::new(Held {
            file,
            path,
            key: key.clone(),
        });
        lock(&self.pins).insert(key, Arc::downgrade(&held));
        Pin {
            held,
            inner: Arc::clone(self),
        }
    }

    /// After writing `written` bytes: prunes to 90% of `limit` if the total may
    /// be over it.
    fn prune_after_write(&self, limit: u64, written: u64) -> Result<()> {
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

fn lock_path(entry: &Path) -> PathBuf {
    let mut s = entry.as_os_str().to_owned();
    s.push(LOCK_SUFFIX);
    PathBuf::from(s)
}

enum Prepared {
    Hit(Pin),
    Fetch(KeyLock, TempPath),
}

/// Under the key's file lock: the entry, pinned, if another process wrote it
/// meanwhile, else the lock and a fresh temp file to fetch into.
fn prepare(inner: &Arc<Inner>, entry: &Path, key: &str, size: u64) -> Result<Prepared> {
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
fn install(tmp: TempPath, entry: &Path, size: u64, url: &str) -> Result<fs::File> {
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

/// Runs blocking file work off the async workers.
async fn blocking<T: Send + 'static>(
    what: &Path,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::io(what.display(), io::Error::other(e)))?
}

/// A key's slot in the in-process single-flight map; the map entry is removed when
/// its last user leaves.
struct Flight<'a> {
    flights: &'a Flights,
    key: String,
    mutex: Option<Arc<tokio::sync::Mutex<()>>>,
}

impl<'a> Flight<'a> {
    fn join(flights: &'a Flights, key: &str) -> Self {
        let mut map = flights.lock().unwrap_or_else(|p| p.into_inner());
        let mutex = Arc::clone(map.entry(key.to_string()).or_default());
        Self {
            flights,
            key: key.to_string(),
            mutex: Some(mutex),
        }
    }

    async fn wait(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        match &self.mutex {
            Some(m) => Some(m.lock().await),
            None => None,
        }
    }
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        let mut map = self.flights.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(mutex) = self.mutex.take() {
            // Clones are only made under the map lock, so 2 (the map's and ours)
            // means nobody else is waiting. Ours is dropped before the map lock.
            if Arc::strong_count(&mutex) == 2
                && map.get(&self.key).is_some_and(|m| Arc::ptr_eq(m, &mutex))
            {
                map.remove(&self.key);
            }
        }
    }
}

enum TryLock {
    Held(KeyLock),
    Busy,
    Missing,
}

/// An exclusive `flock` on a key's lock file, released on drop.
struct KeyLock {
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
    fn acquire(path: &Path) -> Result<Self> {
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
    fn try_acquire(path: &Path, create: bool) -> Result<TryLock> {
        let file = match Self::open(path, create) {
            Ok(f) => f,
            Err(e) if !create && e.kind() == io::ErrorKind::NotFound => {
                return Ok(TryLock::Missing);
            }
            Err(e) => return Err(Error::io(path.display(), e)),
        };
        match FileExt::try_lock(&file) {
            Ok(()) if still_linked(&file, path) => Ok(TryLock::Held(Self { file })),
            Ok(()) => Ok(TryLock::Missing),
            Err(TryLockError::WouldBlock) => Ok(TryLock::Busy),
            Err(TryLockError::Error(e)) => Err(Error::io(path.display(), e)),
        }
    }

    /// Unlinks the lock file while holding it (waiters notice and retry).
    fn remove(self, path: &Path) -> Result<()> {
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
fn still_linked(file: &fs::File, path: &Path) -> bool {
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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Removes LRU entries (skipping pinned ones) until the total is at most
/// `max_bytes`, then sweeps. Returns (removed, remaining total).
fn prune(dir: &Path, max_bytes: u64) -> Result<(CacheUsage, u64)> {
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

enum Removal {
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
fn remove_entry(path: &Path) -> Result<Removal> {
    let lock_file = lock_path(path);
    let key_lock = match KeyLock::try_acquire(&lock_file, true)? {
        TryLock::Held(lock) => lock,
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
fn sweep(scan: &Scan) -> Result<()> {
    for (tmp, entry) in &scan.temps {
        // A temp file's writer holds its key's lock until the temp file is gone.
        let lock_file = lock_path(entry);
        match KeyLock::try_acquire(&lock_file, false)? {
            TryLock::Busy => {}
            TryLock::Missing => remove_if_exists(tmp)?,
            TryLock::Held(lock) => {
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
        if let TryLock::Held(lock) = KeyLock::try_acquire(lock_file, false)?
            && !entry.exists()
        {
            lock.remove(lock_file)?;
        }
    }
    Ok(())
}

fn remove_if_exists(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(Error::io(path.display(), e)),
        _ => Ok(()),
    }
}

struct EntryInfo {
    path: PathBuf,
    len: u64,
    mtime: SystemTime,
}

/// The cache dir's files by kind; temps and locks with their entry's path.
#[derive(Default)]
struct Scan {
    entries: Vec<EntryInfo>,
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

fn scan(dir: &Path) -> Result<Scan> {
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
