//! The download bookkeeping of one `PrefetchExec` partition ([`Downloads`]):
//! where each file's local copy goes (memory, the temp dir, or the shared
//! cache), one download per object at a time, the connection cap across
//! partitions, what a failed download does under each `on_error`, and
//! [`Fetched`], what a download task yields.
//!
//! Guarantees: a row is passed on only when every `File` in it has a complete
//! local copy (a temp copy, or a pinned shared-cache entry), each holding
//! exactly one reference for the row, released by the UDF when the row is done;
//! a row dropped under `skip` releases the copies it took at once (its
//! shared-cache pins included); under `null` the
//! failed file holds a placeholder and its other files are still fetched.
//! A file named by URL (size not known, see `File::size_known`) has no
//! version to key a shared-cache entry by: under `cache = true` a HEAD pins
//! it first and it goes on as a listed file (a rerun costs a HEAD, not a
//! GET); otherwise its first GET goes to memory or the temp dir by the size
//! the response gives. Either way the row is passed on with the file pinned
//! to that response (size, etag, version).

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use datafusion::arrow::array::RecordBatch;
use datafusion::error::Result as DfResult;
use datafusion::physical_plan::metrics::{Count, Gauge, Time};
use tokio::sync::Semaphore;
use udfchain_udfs::{File, encode_column};

use super::window::RoundTrip;
use super::window_pins::WindowPins;
use crate::cache::StoreSource;
use crate::cache::{DiskBudget, SharedCache, TempCache};
use crate::cache::{LocalCopies, file_key};
use crate::error::{Error, is_disk_full};
use crate::plan::skip_list::SkipList;
use crate::runtime::PoolTask;
use crate::settings::OnError;
use crate::storage::{
    Body, Downloaded, VersionPin, download_bytes, download_first, download_to, read_local_pinned,
    stat, warm_pinned,
};
use crate::util::lock::lock;
use crate::util::single_flight::SingleFlight;

pub(super) struct PrefetchMetrics {
    pub(super) files_fetched: Count,
    pub(super) bytes_fetched: Count,
    pub(super) cache_hits: Count,
    pub(super) retries: Count,
    pub(super) skipped_files: Count,
    /// Files handed on without a copy for want of disk (`temp_dir_limit`,
    /// a full disk): their UDF reads them from the store, streamed.
    pub(super) files_streamed: Count,
    /// Files handed on to be read where they are, and their listed bytes.
    pub(super) files_in_place: Count,
    pub(super) bytes_in_place: Count,
    /// Downloads in flight at once across all partitions (one gauge shared by them).
    pub(super) peak_in_flight: Gauge,
    /// The most bytes the reorder buffer held (`ordered = true`).
    pub(super) reorder_peak_bytes: Gauge,
    pub(super) udf_wait: Time,
}

/// What every download task of one partition shares: the download bookkeeping.
pub(super) struct Downloads {
    pub(super) file_cols: Vec<usize>,
    pub(super) temp: Arc<TempCache>,
    /// The shared-cache entries of the window's rows, pinned until released.
    pub(super) pins: Arc<WindowPins>,
    /// The shared cache, when `cache = true` or its dir exists (set by `prepare`).
    pub(super) shared_cache: OnceLock<Arc<SharedCache>>,
    pub(super) cache_dir: PathBuf,
    pub(super) cache_limit: Option<u64>,
    /// `cache = true`: downloads go into `shared`.
    pub(super) into_cache: bool,
    /// Otherwise files up to this size are held in memory, larger ones on disk.
    pub(super) memory_file_limit: u64,
    /// The disk the temp dir's copies may take (`temp_dir_limit`), shared by
    /// every prefetch of the process under the same root.
    pub(super) disk: Arc<DiskBudget>,
    /// `temp_dir_limit` (`None`: a share of the free space, see `DiskBudget`).
    pub(super) temp_dir_limit: Option<u64>,
    pub(super) source: StoreSource,
    pub(super) connections: Arc<Semaphore>,
    pub(super) on_error: OnError,
    /// Downloads running across all partitions.
    pub(super) active: Arc<AtomicUsize>,
    /// The parent of the last virtual file fetched, held one extra time so the
    /// next members of the same shard find it even when the window ran dry
    /// in between (at most one file beyond the window).
    pub(super) pinned: Mutex<Option<File>>,
    /// Per-object locks: one download of an object at a time.
    pub(super) fetching: SingleFlight,
    pub(super) skipped: Arc<SkipList>,
    pub(super) metrics: PrefetchMetrics,
    /// The shortest recent time to first byte of a download (for `auto`).
    pub(super) round_trip: Mutex<RoundTrip>,
}

impl Downloads {
    /// Opens what the partition's downloads need from the file system on the
    /// blocking pool: the shared cache (when `cache = true` or its dir exists;
    /// it serves files it holds even with `cache = false`) and the temp dir,
    /// sweeping dirs of killed processes first.
    ///
    /// # Cancel safety
    /// Dropping the future leaves at most an empty temp dir owned by this
    /// process, removed with the `TempCache`.
    pub(super) async fn prepare(self: &Arc<Self>) -> Result<(), Error> {
        let me = Arc::clone(self);
        crate::runtime::blocking(move || {
            if me.into_cache || me.cache_dir.is_dir() {
                let cache = SharedCache::open(&me.cache_dir, me.cache_limit)?;
                me.temp
                    .set_fallback(Arc::clone(&cache) as Arc<dyn LocalCopies>);
                let _ = me.shared_cache.set(cache);
            }
            me.temp.open_blocking()?;
            me.disk.start_run(me.temp_dir_limit);
            Ok(())
        })
        .await
    }

    /// Downloads the files of a one-row batch; `None` when the row is skipped.
    /// A row passed on holds one reference per file in `temp` (under `null`, a
    /// placeholder for a file whose download failed), which the UDF above
    /// releases when the row is done; a skipped row releases what it took.
    /// Also returns the bytes of the files of unknown size this row
    /// downloaded first, as their responses gave them.
    pub(super) async fn fetch_row(
        &self,
        row: RecordBatch,
        files: Vec<File>,
    ) -> (DfResult<Option<RecordBatch>>, usize) {
        let mut pinned: Vec<File> = Vec::new();
        let row = self.fetch_files(row, files, &mut pinned).await;
        (row, pinned.iter().map(|f| f.size as usize).sum())
    }

    async fn fetch_files(
        &self,
        row: RecordBatch,
        files: Vec<File>,
        pinned: &mut Vec<File>,
    ) -> DfResult<Option<RecordBatch>> {
        let mut held: Vec<File> = Vec::with_capacity(files.len());
        for file in files {
            match self.fetch_file(&file).await {
                Ok(first) => {
                    pinned.extend(first);
                    if file.member().is_some() {
                        self.pin(file.parent());
                    }
                    held.push(file);
                }
                Err(e) => match self.on_error {
                    OnError::Fail => return Err(e.into_df()),
                    OnError::Skip => {
                        // Through the window's pins: a copy in the shared
                        // cache is released there, any other in the temp cache.
                        for f in &held {
                            self.pins.release(f);
                        }
                        self.metrics.skipped_files.add(1);
                        self.skipped.push(file.url());
                        return Ok(None);
                    }
                    OnError::Null => self.temp.hold_missing(&file),
                },
            }
        }
        if pinned.is_empty() {
            return Ok(Some(row));
        }
        with_pinned(row, &self.file_cols, pinned)
            .map(Some)
            .map_err(Error::into_df)
    }

    /// Reads a run of local files ahead (a fixed `prefetch = N` over the
    /// local file system) in one blocking-pool trip, one file after another,
    /// within one slot of the connection cap: a file up to
    /// `memory_file_limit` into memory, a larger one read through once (its
    /// pages are then cached for the UDF's read in place; no temp copy of a
    /// file that is already local). Every file holds one reference for its
    /// row, as a download's copy does: its bytes, or a placeholder for a file
    /// read through or failed. A failed read is not an error here: the UDF's
    /// own read in place meets it and `on_error` applies there, as under
    /// `prefetch = auto`, where nothing is read ahead.
    pub(super) async fn read_ahead(self: &Arc<Self>, files: Vec<File>) -> DfResult<()> {
        let _slot = self
            .connections
            .acquire()
            .await
            .map_err(|e| Error::internal(format!("connection slots: {e}")).into_df())?;
        let now = self.active.fetch_add(1, Ordering::SeqCst) + 1;
        self.metrics.peak_in_flight.set_max(now);
        let me = Arc::clone(self);
        let read = crate::runtime::blocking(move || {
            for f in &files {
                me.read_one_ahead(f);
            }
            Ok(())
        })
        .await;
        self.active.fetch_sub(1, Ordering::SeqCst);
        read.map_err(Error::into_df)
    }

    /// [`Self::read_ahead`] of one file, in the calling thread.
    fn read_one_ahead(&self, file: &File) {
        let pin = VersionPin::of(file);
        let Ok((_, key)) = self.source.resolve(file) else {
            return self.temp.hold_missing(file);
        };
        let read = match read_local_pinned(&key, &pin, self.memory_file_limit) {
            Ok(Some(bytes)) => {
                let n = bytes.len();
                self.temp.insert_bytes(file, bytes);
                Some(n)
            }
            Ok(None) => {
                self.temp.hold_missing(file);
                warm_pinned(&key, &pin).ok().map(|n| n as usize)
            }
            Err(_) => {
                self.temp.hold_missing(file);
                None
            }
        };
        if let Some(n) = read {
            self.metrics.files_fetched.add(1);
            self.metrics.bytes_fetched.add(n);
        }
    }

    /// Holds `parent` one extra time, releasing the previously pinned parent.
    fn pin(&self, parent: File) {
        let mut pinned = lock(&self.pinned);
        if pinned
            .as_ref()
            .is_some_and(|p| p.path == parent.path && p.source == parent.source)
        {
            return;
        }
        if (self.temp.acquire(&parent) || self.pins.acquire(&parent))
            && let Some(old) = pinned.replace(parent)
        {
            self.pins.release(&old);
        }
    }

    /// Drops the extra hold of the pinned parent.
    pub(super) fn unpin(&self) {
        let old = lock(&self.pinned).take();
        if let Some(old) = old {
            self.pins.release(&old);
        }
    }

    /// Makes a local copy of `file` (of its parent, for a virtual file) and
    /// counts one more row using it. One download per object at a time: rows
    /// sharing a parent wait for the first download instead of starting their
    /// own. A file whose size was not known (named by URL) and that this call
    /// downloaded comes back pinned to its first response.
    async fn fetch_file(&self, file: &File) -> Result<Option<File>, Error> {
        let file = &file.parent();
        self.fetching
            .run(&file_key(file), async || self.fetch_locked(file).await)
            .await
    }

    async fn fetch_locked(&self, file: &File) -> Result<Option<File>, Error> {
        if self.temp.acquire(file) || self.pins.acquire(file) {
            self.metrics.cache_hits.add(1);
            return Ok(None);
        }
        if !file.size_known() {
            // Named by URL: no shared-cache key before a response names the
            // version. Under `cache = true` a HEAD pins it first, so the
            // entry is found (or written) as a listed file's is; otherwise
            // the first GET pins it.
            if self.into_cache && self.shared_cache.get().is_some() {
                let pinned = self.head(file).await?;
                return self.fetch_known(&pinned).await.map(|()| Some(pinned));
            }
            return self.download_first(file).await.map(Some);
        }
        self.fetch_known(file).await.map(|()| None)
    }

    /// [`Self::fetch_locked`] for a file of known size and version: a hit in
    /// the shared cache, or a download into it, into memory or the temp dir.
    async fn fetch_known(&self, file: &File) -> Result<(), Error> {
        if let Some(pin) = self.shared_cache.get().and_then(|c| c.pin(file)) {
            self.pins.hold(file, pin);
            self.metrics.cache_hits.add(1);
            return Ok(());
        }
        match (self.shared_cache.get(), self.into_cache) {
            (Some(cache), true) => self.fetch_into_cache(cache, file).await,
            _ => self.fetch_uncached(file).await,
        }
    }

    /// A download into the shared cache. A full disk evicts unpinned
    /// entries to make room and tries once more; still full, the file is
    /// fetched as without the cache (memory, the temp dir or streamed).
    async fn fetch_into_cache(&self, cache: &Arc<SharedCache>, file: &File) -> Result<(), Error> {
        let mut evicted = false;
        loop {
            let fetched = cache
                .get_or_fetch(file, |tmp| async move { self.download(file, &tmp).await })
                .await;
            match fetched {
                Ok((pin, downloaded)) => {
                    self.pins.hold(file, pin);
                    if !downloaded {
                        self.metrics.cache_hits.add(1);
                    }
                    return Ok(());
                }
                Err(e) if is_disk_full(&e) && !evicted => {
                    evicted = true;
                    let (cache, need) = (Arc::clone(cache), file.size);
                    crate::runtime::blocking(move || {
                        let held = cache.du()?.bytes;
                        cache.prune_to(held.saturating_sub(need)).map(drop)
                    })
                    .await?;
                }
                Err(e) if is_disk_full(&e) => return self.fetch_uncached(file).await,
                Err(e) => return Err(e),
            }
        }
    }

    /// A file into memory (up to `memory_file_limit`), else into the temp
    /// dir within the disk budget; a file that does not fit there, or meets
    /// a full disk, goes on without a copy: its UDF reads it from the store.
    async fn fetch_uncached(&self, file: &File) -> Result<(), Error> {
        if file.size <= self.memory_file_limit {
            let bytes = self.download_bytes(file).await?;
            self.temp.insert_bytes(file, bytes);
            return Ok(());
        }
        let Some(reserved) = self.disk.try_reserve(file.size) else {
            self.streamed(file);
            return Ok(());
        };
        let dest = self.temp.new_path(file);
        match self.download(file, &dest).await {
            Ok(()) => {
                self.temp.insert(file, dest, Some(reserved));
                Ok(())
            }
            Err(e) => {
                let _ = tokio::fs::remove_file(&dest).await;
                drop(reserved);
                if !is_disk_full(&e) {
                    return Err(e);
                }
                self.disk.back_off();
                self.streamed(file);
                Ok(())
            }
        }
    }

    /// `file` goes on without a copy (see `files_streamed`).
    fn streamed(&self, file: &File) {
        self.temp.hold_missing(file);
        self.metrics.files_streamed.add(1);
    }

    /// `file` (size not known) pinned to a HEAD of it, made within the
    /// connection cap (not counted as a fetch: it moves no body).
    async fn head(&self, file: &File) -> Result<File, Error> {
        let (store, path, _slot) = self.connect(file).await?;
        stat(&store, &path, file).await
    }

    /// The first GET of `file`, whose size is not known, within the
    /// connection cap: into memory up to `memory_file_limit` bytes, else into
    /// the temp dir; returns `file` pinned to the response.
    async fn download_first(&self, file: &File) -> Result<File, Error> {
        let dest = self.temp.new_path(file);
        let limit = self.memory_file_limit;
        let to = dest.clone();
        let result = self
            .counted(file, |store, path, _url| async move {
                let (pinned, body, d) = download_first(&store, &path, file, limit, &to).await?;
                Ok(((pinned, body), d))
            })
            .await;
        match result {
            Ok((pinned, Body::Memory(bytes))) => {
                self.temp.insert_bytes(file, bytes);
                Ok(pinned)
            }
            Ok((pinned, Body::Disk)) => {
                // A size not known before the GET cannot be reserved ahead:
                // files named by URL are outside the disk budget.
                self.temp.insert(file, dest, None);
                Ok(pinned)
            }
            Err(e) => {
                let _ = tokio::fs::remove_file(&dest).await;
                Err(e)
            }
        }
    }

    /// Downloads `file` to `dest` within the connection cap, counting it.
    async fn download(&self, file: &File, dest: &std::path::Path) -> Result<(), Error> {
        self.counted(file, |store, path, _url| async move {
            let d = download_to(&store, &path, file, dest).await?;
            Ok(((), d))
        })
        .await
    }

    /// Downloads `file` into memory within the connection cap, counting it.
    async fn download_bytes(&self, file: &File) -> Result<bytes::Bytes, Error> {
        self.counted(file, |store, path, _url| async move {
            download_bytes(&store, &path, file).await
        })
        .await
    }

    /// The store and path of `file`, and a slot of the connection cap held
    /// for as long as the permit lives.
    async fn connect(
        &self,
        file: &File,
    ) -> Result<
        (
            Arc<dyn object_store::ObjectStore>,
            object_store::path::Path,
            tokio::sync::SemaphorePermit<'_>,
        ),
        Error,
    > {
        let (store, path) = self.source.resolve(file).map_err(|e| Error::Storage {
            url: file.url(),
            source: Arc::new(e),
        })?;
        let slot = self
            .connections
            .acquire()
            .await
            .map_err(|e| Error::internal(format!("connection slots: {e}")))?;
        Ok((store, path, slot))
    }

    /// Runs one download of `file` within the connection cap and counts it.
    async fn counted<T, F, Fut>(&self, file: &File, run: F) -> Result<T, Error>
    where
        F: FnOnce(Arc<dyn object_store::ObjectStore>, object_store::path::Path, String) -> Fut,
        Fut: Future<Output = Result<(T, Downloaded), Error>>,
    {
        let (store, path, _slot) = self.connect(file).await?;
        let now = self.active.fetch_add(1, Ordering::SeqCst) + 1;
        self.metrics.peak_in_flight.set_max(now);
        let result = run(store, path, file.url()).await;
        self.active.fetch_sub(1, Ordering::SeqCst);
        let (value, d) = result?;
        lock(&self.round_trip).observe(d.first_byte);
        self.metrics.files_fetched.add(1);
        self.metrics.bytes_fetched.add(d.bytes as usize);
        self.metrics.retries.add(d.retries as usize);
        Ok(value)
    }
}

/// `row` with each `File` whose size was not known (named by URL) replaced by
/// its pinned version in `pinned` (same source and path): the UDF and every
/// later operator see the size and etag of the first response, so their reads
/// ask for that version.
fn with_pinned(row: RecordBatch, cols: &[usize], pinned: &[File]) -> Result<RecordBatch, Error> {
    let schema = row.schema();
    let mut columns = row.columns().to_vec();
    let convert = |e: udfchain_udfs::UdfError| Error::internal(format!("a File column: {e}"));
    for &c in cols {
        let mut files = File::decode_array(&columns[c]).map_err(convert)?;
        let mut changed = false;
        for f in files.iter_mut().flatten() {
            if f.size_known() {
                continue;
            }
            if let Some(p) = pinned
                .iter()
                .find(|p| p.source == f.source && p.path == f.path)
            {
                *f = p.clone();
                changed = true;
            }
        }
        if changed {
            columns[c] = encode_column(schema.field(c), &files).map_err(convert)?;
        }
    }
    RecordBatch::try_new(schema, columns).map_err(|e| Error::internal(e.to_string()))
}

/// A finished fetch of one row, or a run of rows that needed none.
pub(super) struct Fetched {
    /// Its place in the order of what this stream hands on.
    pub(super) seq: u64,
    /// The position of its first row in the partition's input.
    pub(super) base: u64,
    /// The row, `None` if skipped.
    pub(super) row: DfResult<Option<RecordBatch>>,
    /// Bytes charged to the memory pool for it.
    pub(super) bytes: usize,
    /// Of `bytes`, what was estimated for files of unknown size (named by
    /// URL), and how many such files the row has.
    pub(super) estimated: usize,
    pub(super) unsized_files: usize,
    /// The sizes the first responses gave those files.
    pub(super) learned: usize,
}

pub(super) type Fetch = PoolTask<Fetched>;
