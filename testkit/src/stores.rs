//! `object_store` wrappers for tests: [`CountingStore`] counts the GETs (and
//! bytes, start times, peak in flight) that reach a store, [`FaultyStore`]
//! delays GETs and injects failed requests or bodies cut off midway.

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult,
};

/// Wraps a store, counting GET requests, their start times, and how many are in
/// flight (a GET is in flight until its body is consumed or dropped).
#[derive(Debug)]
pub struct CountingStore {
    inner: Arc<dyn ObjectStore>,
    gets: AtomicUsize,
    bytes: Arc<AtomicUsize>,
    in_flight: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
    starts: Mutex<Vec<(Instant, String)>>,
}

impl CountingStore {
    /// Wraps `inner`, with every count at zero.
    pub fn new(inner: Arc<dyn ObjectStore>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            gets: AtomicUsize::new(0),
            bytes: Arc::new(AtomicUsize::new(0)),
            in_flight: Arc::new(AtomicUsize::new(0)),
            peak: Arc::new(AtomicUsize::new(0)),
            starts: Mutex::new(Vec::new()),
        })
    }

    /// GET requests received (a `get_ranges` call counts each range).
    pub fn gets(&self) -> usize {
        self.gets.load(Ordering::SeqCst)
    }

    /// Body bytes transferred by GETs.
    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::SeqCst)
    }

    /// The most GETs that were in flight at once.
    pub fn peak_in_flight(&self) -> usize {
        self.peak.load(Ordering::SeqCst)
    }

    /// Start times of the GETs of paths containing `needle`.
    pub fn get_starts(&self, needle: &str) -> Vec<Instant> {
        self.starts
            .lock()
            .expect("lock")
            .iter()
            .filter(|(_, p)| p.contains(needle))
            .map(|(t, _)| *t)
            .collect()
    }
}

impl fmt::Display for CountingStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Counting({})", self.inner)
    }
}

struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[async_trait]
impl ObjectStore for CountingStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        self.starts
            .lock()
            .expect("lock")
            .push((Instant::now(), location.to_string()));
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        let guard = InFlight(Arc::clone(&self.in_flight));
        let mut result = self.inner.get_opts(location, options).await?;
        result.payload = match result.payload {
            GetResultPayload::Stream(s) => {
                let bytes = Arc::clone(&self.bytes);
                let s = s.map(move |chunk| {
                    let _held = &guard;
                    if let Ok(c) = &chunk {
                        bytes.fetch_add(c.len(), Ordering::SeqCst);
                    }
                    chunk
                });
                GetResultPayload::Stream(s.boxed())
            }
            other => other,
        };
        Ok(result)
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        self.gets.fetch_add(ranges.len(), Ordering::SeqCst);
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

/// Wraps a store, delaying each GET by `delay(path)` and failing GETs as
/// `fault(path, attempt)` says (attempt counts the GETs of that path so far).
pub struct FaultyStore {
    inner: Arc<dyn ObjectStore>,
    delay: Box<DelayFn>,
    fault: Box<FaultFn>,
    attempts: Mutex<std::collections::HashMap<String, usize>>,
    /// Listings carry no ETag or version (as some stores' do not).
    hide_list_etags: bool,
}

type DelayFn = dyn Fn(&str) -> std::time::Duration + Send + Sync;
type FaultFn = dyn Fn(&str, usize) -> Fault + Send + Sync;

/// What a GET of a `FaultyStore` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The GET is passed to the wrapped store.
    None,
    /// The request fails (like a 503).
    Request,
    /// The body breaks off after half of it (like a connection reset).
    MidBody,
}

impl FaultyStore {
    /// Wraps `inner`: each GET of a path waits `delay(path)`, then does what
    /// `fault(path, attempt)` says (attempt 0 is the path's first GET).
    pub fn new(
        inner: Arc<dyn ObjectStore>,
        delay: impl Fn(&str) -> std::time::Duration + Send + Sync + 'static,
        fault: impl Fn(&str, usize) -> Fault + Send + Sync + 'static,
    ) -> Arc<Self> {
        Arc::new(Self {
            inner,
            delay: Box::new(delay),
            fault: Box::new(fault),
            attempts: Mutex::new(Default::default()),
            hide_list_etags: false,
        })
    }

    /// Like [`FaultyStore::new`], and its listings carry no ETag or version
    /// (GET responses still do).
    pub fn hiding_list_etags(
        inner: Arc<dyn ObjectStore>,
        delay: impl Fn(&str) -> std::time::Duration + Send + Sync + 'static,
        fault: impl Fn(&str, usize) -> Fault + Send + Sync + 'static,
    ) -> Arc<Self> {
        let mut store = Arc::into_inner(Self::new(inner, delay, fault)).expect("new store");
        store.hide_list_etags = true;
        Arc::new(store)
    }
}

fn without_etag(mut meta: ObjectMeta) -> ObjectMeta {
    meta.e_tag = None;
    meta.version = None;
    meta
}

impl fmt::Debug for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultyStore")
    }
}

impl fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Faulty({})", self.inner)
    }
}

fn injected(msg: &str) -> object_store::Error {
    object_store::Error::Generic {
        store: "faulty",
        source: msg.to_string().into(),
    }
}

#[async_trait]
impl ObjectStore for FaultyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let key = location.to_string();
        let attempt = {
            let mut a = self.attempts.lock().expect("lock");
            let n = a.entry(key.clone()).or_default();
            *n += 1;
            *n - 1
        };
        tokio::time::sleep((self.delay)(&key)).await;
        match (self.fault)(&key, attempt) {
            Fault::None => self.inner.get_opts(location, options).await,
            Fault::Request => Err(injected("injected 503 Service Unavailable")),
            Fault::MidBody => {
                let mut result = self.inner.get_opts(location, options).await?;
                let body = match result.payload {
                    GetResultPayload::Stream(s) => {
                        let chunks: Vec<Bytes> = s.map(|c| c.expect("inner body")).collect().await;
                        chunks.concat()
                    }
                    other => panic!("unexpected payload {other:?}"),
                };
                let half = Bytes::from(body[..body.len() / 2].to_vec());
                let parts = vec![Ok(half), Err(injected("injected connection reset"))];
                result.payload = GetResultPayload::Stream(futures::stream::iter(parts).boxed());
                Ok(result)
            }
        }
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let hide = self.hide_list_etags;
        self.inner
            .list(prefix)
            .map(move |m| if hide { m.map(without_etag) } else { m })
            .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        let mut result = self.inner.list_with_delimiter(prefix).await?;
        if self.hide_list_etags {
            result.objects = result.objects.into_iter().map(without_etag).collect();
        }
        Ok(result)
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}
