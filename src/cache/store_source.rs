//! [`StoreSource`]: the engine's [`FileSource`], reading objects from the stores
//! in DataFusion's registry, preferring a local copy when a cache holds one, and
//! [`LocalCopies`], what every holder of local copies (the temp cache, the shared
//! cache, a prefetch window's pins) offers it. Here, above `storage/`, because it
//! reads through the shared cache; `storage/` knows nothing of caches.
//!
//! Guarantees: every network read runs on the I/O runtime captured at creation
//! (never on the UDF pool), and is aborted when the reading future is dropped;
//! a whole-file read of the local file system (up to `INLINE_READ_MAX`) or of
//! a `memory://` store runs in the calling thread, as the UDF's own work would.
//! With a read-through cache (`cache = true` and no prefetch in front of the
//! UDF), a whole-file read goes through the shared cache: the first read of an
//! object downloads it into the cache, later reads (in this run or the next)
//! find it there and make no request. A local copy that vanished between its
//! lookup and the read (an unpinned shared-cache entry evicted meanwhile) is
//! read from the store instead of failing. Every read of a listed file asks for
//! the version it was listed with (see [`VersionPin`]): the range reads of one
//! `File::open` reader never mix two versions of a rewritten object. A file
//! named by URL whose size is not known yet (no prefetch in front of the UDF)
//! learns it from its local copy, else from a HEAD, before a range read; a
//! `File` that `file_from_url` could not parse fails each read with why. A
//! file of the local file system store is its own local copy: `local_path`
//! names it in place, never a copy made to give a UDF a path.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::object_store::{GetRange, ObjectStore, path::Path};
use tokio::runtime::Handle;
use udfchain_udfs::{File, FileSource, UdfError};

use super::SharedCache;
use crate::runtime::spawn_on;
use crate::storage::VersionPin;
use crate::storage::{
    INLINE_READ_MAX, Location, download_to, local_fs_path, open_store, read_local_pinned,
};
use crate::util::lock::lock;

/// Where local copies of files may be found (prefetch temp dirs, the shared cache).
pub trait LocalCopies: Send + Sync + std::fmt::Debug {
    /// The path of a complete local copy of `file`, if held.
    fn local_path(&self, file: &File) -> Option<PathBuf>;
    /// The bytes of `file`, if held in memory.
    fn local_bytes(&self, _file: &File) -> Option<Bytes> {
        None
    }
    /// One row using `file` is done (a temporary copy may now be deleted).
    fn release(&self, _file: &File) {}
    /// `true` only when no file has a copy here now, so that every lookup
    /// would miss and every release do nothing (files read where they are
    /// then cost no key and no lock each). A copy a row holds stays until
    /// that row releases it, so the answer cannot turn under such a row.
    fn holds_nothing(&self) -> bool {
        false
    }
}

type Resolved = (Arc<dyn ObjectStore>, Location, Reach);

/// Reads `File`s from object stores.
#[derive(Debug)]
pub struct StoreSource {
    env: Arc<RuntimeEnv>,
    io: Handle,
    options: BTreeMap<String, String>,
    /// Resolved stores by `File::source`.
    stores: Mutex<HashMap<String, Resolved>>,
    local: Option<Arc<dyn LocalCopies>>,
    /// Whole-file reads of files held nowhere locally are downloaded into it.
    read_through: Option<Arc<SharedCache>>,
}

impl StoreSource {
    /// Must be created inside the I/O runtime: its handle runs every read.
    pub fn new(
        env: Arc<RuntimeEnv>,
        options: BTreeMap<String, String>,
        local: Option<Arc<dyn LocalCopies>>,
    ) -> Self {
        Self {
            env,
            io: Handle::current(),
            options,
            stores: Mutex::new(HashMap::new()),
            local,
            read_through: None,
        }
    }

    /// Whole-file reads of files no local copy holds download into `cache` first.
    pub fn with_read_through(mut self, cache: Arc<SharedCache>) -> Self {
        self.read_through = Some(cache);
        self
    }

    /// The store and object path of `file`.
    pub fn resolve(&self, file: &File) -> Result<(Arc<dyn ObjectStore>, Path), UdfError> {
        self.lookup(file).map(|(store, path, _)| (store, path))
    }

    /// [`Self::resolve`], and whether the store does network I/O.
    fn lookup(&self, file: &File) -> Result<(Arc<dyn ObjectStore>, Path, Reach), UdfError> {
        let read_err = |e: crate::Error| UdfError::Read {
            url: file.url(),
            source: Box::new(e),
        };
        if let Some(e) = file.url_error() {
            return Err(e);
        }
        let (store, path, reach) = self
            .with_store(&file.source, |(store, loc, reach)| {
                (Arc::clone(store), loc.child(&file.path), *reach)
            })
            .map_err(read_err)?;
        Ok((store, path.map_err(read_err)?, reach))
    }

    /// `f` of the store of a `File::source`, opened on first use and kept.
    fn with_store<T>(
        &self,
        source: &str,
        f: impl FnOnce(&Resolved) -> T,
    ) -> Result<T, crate::Error> {
        let mut stores = lock(&self.stores);
        if let Some(resolved) = stores.get(source) {
            return Ok(f(resolved));
        }
        let loc = Location::of_source(source)?;
        let store = open_store(&self.env, &loc, &self.options)?;
        let reach = Reach::of(store.as_ref());
        let resolved = stores
            .entry(source.to_string())
            .or_insert((store, loc, reach));
        Ok(f(resolved))
    }

    /// Where the store of the files of `source` (a `File::source`; a virtual
    /// file has its parent's) keeps its bytes; [`Reach::Network`] when it
    /// cannot be opened, or is empty (a URL that did not parse; its reads
    /// then fail as any other's).
    pub(crate) fn reach(&self, source: &str) -> Reach {
        if source.is_empty() {
            return Reach::Network;
        }
        self.with_store(source, |(_, _, reach)| *reach)
            .unwrap_or(Reach::Network)
    }

    /// The local copies to look in: none when they hold nothing.
    fn copies(&self) -> Option<&Arc<dyn LocalCopies>> {
        self.local.as_ref().filter(|l| !l.holds_nothing())
    }
}

/// Where a store keeps its bytes: object_store's own `LocalFileSystem`
/// (rooted at `/`, as the registry opens `file://`) and `InMemory` need no
/// I/O runtime (and a small local file no thread crossing at all). Told by
/// the store itself, not the URL: any store may be registered under any URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    LocalFiles,
    Memory,
    Network,
}

impl Reach {
    fn of(store: &dyn ObjectStore) -> Self {
        match store.to_string().as_str() {
            "LocalFileSystem(file:///)" => Self::LocalFiles,
            "InMemory" => Self::Memory,
            _ => Self::Network,
        }
    }
}

#[async_trait]
impl FileSource for StoreSource {
    async fn stat(&self, file: &File) -> Result<File, UdfError> {
        if file.size_known() {
            return Ok(file.clone());
        }
        let (store, path) = self.resolve(file)?;
        let unsized_file = file.clone();
        let task = spawn_on(&self.io, async move {
            crate::storage::stat(&store, &path, &unsized_file).await
        });
        task.await
            .map_err(|e| read_error(file, std::io::Error::other(e)))?
            .map_err(|e| UdfError::Read {
                url: file.url(),
                source: Box::new(e),
            })
    }

    async fn read(&self, file: &File) -> Result<Bytes, UdfError> {
        if file.member().is_some() {
            return self.read_range(file, 0..file.size).await;
        }
        // Asked once: a read of a file where it is then costs no lookup.
        let copies = self.copies();
        if let Some(b) = copies.and_then(|c| c.local_bytes(file)) {
            return Ok(b);
        }
        // With a read-through cache, its entry is read pinned below.
        if self.read_through.is_none()
            && let Some(p) = copies.and_then(|c| c.local_path(file))
        {
            match tokio::fs::read(&p).await {
                // An unpinned shared-cache entry evicted since the lookup.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                r => return r.map(Bytes::from).map_err(|e| read_error(file, e)),
            }
        }
        let (store, path, reach) = self.lookup(file)?;
        if let Some(cache) = &self.read_through {
            // A file named by URL is cached under what the store says of it now.
            let target = self.stat(file).await?;
            let cache = Arc::clone(cache);
            let task = spawn_on(&self.io, async move {
                let fetch = |tmp: PathBuf| {
                    let target = &target;
                    async move { download_to(&store, &path, target, &tmp).await.map(|_| ()) }
                };
                // Pinned until the read is done: no pruning removes it meanwhile.
                let (pin, _) = cache.get_or_fetch(&target, fetch).await?;
                let entry = pin.path();
                tokio::fs::read(entry)
                    .await
                    .map_err(|e| crate::Error::io(entry.display(), e))
            });
            return task
                .await
                .map_err(|e| read_error(file, std::io::Error::other(e)))?
                .map(Bytes::from)
                .map_err(|e| read_error(file, e));
        }
        let pin = VersionPin::of(file);
        let read_err = |source| UdfError::Read {
            url: file.url(),
            source,
        };
        match reach {
            Reach::LocalFiles => {
                if let Some(bytes) =
                    read_local_pinned(&path, &pin, INLINE_READ_MAX).map_err(read_err)?
                {
                    return Ok(bytes);
                }
            }
            Reach::Memory => {
                return get_pinned(&store, &path, &pin, None)
                    .await
                    .map_err(read_err);
            }
            Reach::Network => {}
        }
        let task = spawn_on(&self.io, async move {
            get_pinned(&store, &path, &pin, None).await
        });
        task.await
            .map_err(|e| read_error(file, std::io::Error::other(e)))?
            .map_err(|source| UdfError::Read {
                url: file.url(),
                source,
            })
    }

    async fn read_range(&self, file: &File, range: Range<u64>) -> Result<Bytes, UdfError> {
        if !file.size_known() && file.url_error().is_none() {
            let local = self.copies();
            let size = match local.and_then(|l| l.local_bytes(file)) {
                Some(b) => Some(b.len() as u64),
                None => local
                    .and_then(|l| l.local_path(file))
                    .and_then(|p| std::fs::metadata(p).ok())
                    .map(|m| m.len()),
            };
            let sized = match size {
                Some(size) => File {
                    size,
                    ..file.clone()
                },
                None => self.stat(file).await?,
            };
            if sized.size_known() {
                return self.read_range(&sized, range).await;
            }
        }
        let end = range.end.min(file.size);
        if range.start >= end {
            return Ok(Bytes::new());
        }
        // A virtual file reads its range of the parent object.
        let (target, range) = match file.member() {
            Some(m) => (file.parent(), m.offset + range.start..m.offset + end),
            None => (file.clone(), range.start..end),
        };
        let local = self.copies();
        if let Some(b) = local.and_then(|l| l.local_bytes(&target)) {
            return Ok(b.slice(range.start as usize..range.end as usize));
        }
        if let Some(p) = local.and_then(|l| l.local_path(&target)) {
            match read_local_range(&p, range.clone()).await {
                // An unpinned shared-cache entry evicted since the lookup.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                r => return r.map_err(|e| read_error(file, e)),
            }
        }
        let (store, path) = self.resolve(&target)?;
        let pin = VersionPin::of(&target);
        let task = spawn_on(&self.io, async move {
            get_pinned(&store, &path, &pin, Some(GetRange::Bounded(range))).await
        });
        task.await
            .map_err(|e| read_error(file, std::io::Error::other(e)))?
            .map_err(|source| UdfError::Read {
                url: file.url(),
                source,
            })
    }

    fn local_path(&self, file: &File) -> Option<PathBuf> {
        // A local copy of a virtual file's parent is not a copy of the file.
        if file.member().is_some() {
            return None;
        }
        // A file of the local file system is its own local copy: it is named
        // in place, never copied to give a UDF a path (a fixed prefetch reads
        // such files ahead into memory, not to the temp dir).
        if let Ok((_, path, Reach::LocalFiles)) = self.lookup(file)
            && let Some(p) = local_fs_path(&path).filter(|p| p.is_file())
        {
            return Some(p);
        }
        self.copies()?.local_path(file)
    }

    fn local_bytes(&self, file: &File) -> Option<Bytes> {
        match file.member() {
            Some(m) => {
                let parent = self.copies()?.local_bytes(&file.parent())?;
                let start = m.offset as usize;
                let end = start.checked_add(file.size as usize)?;
                (end <= parent.len()).then(|| parent.slice(start..end))
            }
            None => self.copies()?.local_bytes(file),
        }
    }
}

/// One GET of `range` (all when `None`) of the version `pin` names: a
/// rewritten object is a [`Changed`](super::download::Changed) error, whether
/// the store refused the `If-Match` or ignored it.
async fn get_pinned(
    store: &Arc<dyn ObjectStore>,
    path: &Path,
    pin: &VersionPin,
    range: Option<GetRange>,
) -> Result<Bytes, Box<dyn std::error::Error + Send + Sync>> {
    let result = store
        .get_opts(path, pin.options(range))
        .await
        .map_err(|e| pin.error(e))?;
    pin.check(&result.meta)?;
    result.bytes().await.map_err(|e| pin.error(e))
}

fn read_error(file: &File, e: impl std::error::Error + Send + Sync + 'static) -> UdfError {
    UdfError::Read {
        url: file.url(),
        source: Box::new(e),
    }
}

async fn read_local_range(path: &std::path::Path, range: Range<u64>) -> std::io::Result<Bytes> {
    use tokio::io::{AsyncReadExt, AsyncSeekExt};
    let mut f = tokio::fs::File::open(path).await?;
    f.seek(std::io::SeekFrom::Start(range.start)).await?;
    let mut buf = Vec::with_capacity((range.end - range.start) as usize);
    f.take(range.end - range.start)
        .read_to_end(&mut buf)
        .await?;
    Ok(Bytes::from(buf))
}
