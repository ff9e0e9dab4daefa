//! [`GeneratedStore`]: a read-only `ObjectStore` of `count` generated objects,
//! `<prefix>/<i:010>.bin` for `i` in `0..count`, for tests and benches over
//! millions of keys that no store on this machine could hold.
//!
//! Guarantees: a listing is generated lazily, one page of [`PAGE`] keys at a
//! time (as S3 answers a LIST), so the store never holds more than one page of
//! keys; keys come in lexicographic order (zero-padded); every generated key
//! answers `get` / `head` (ranges and `If-Match` included) with
//! [`content`](crate::content)`(i, size)` and the same size and ETag as its
//! listing entry; other keys are `NotFound`; the counters ([`listed`], [`pages`],
//! [`gets`]) say how far listings and reads got. With a [`Latency`], each GET
//! and each listing page waits one draw of it (one seeded sequence).
//! Writes, deletes, copies and non-recursive listings are refused
//! (`NotSupported`).
//!
//! [`listed`]: GeneratedStore::listed
//! [`pages`]: GeneratedStore::pages
//! [`gets`]: GeneratedStore::gets

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::{self, BoxStream};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult,
};

use crate::Latency;
use crate::s3_server::LatencySampler;

/// Keys per listing page, as S3's `ListObjectsV2` answers.
pub const PAGE: u64 = 1_000;

/// `count` generated objects under `prefix` (see the module header).
pub struct GeneratedStore {
    prefix: String,
    count: u64,
    size: usize,
    latency: Option<LatencySampler>,
    listed: Arc<AtomicU64>,
    pages: Arc<AtomicUsize>,
    gets: AtomicUsize,
}

impl GeneratedStore {
    /// `count` objects of 64 bytes under `prefix` (e.g. `"keys"`; no slashes
    /// at either end), answered at once.
    pub fn new(prefix: &str, count: u64) -> Self {
        Self {
            prefix: prefix.trim_matches('/').to_string(),
            count,
            size: 64,
            latency: None,
            listed: Arc::new(AtomicU64::new(0)),
            pages: Arc::new(AtomicUsize::new(0)),
            gets: AtomicUsize::new(0),
        }
    }

    /// Objects of `size` bytes each.
    pub fn with_size(mut self, size: usize) -> Self {
        self.size = size;
        self
    }

    /// Each GET and each listing page waits one draw of `latency`.
    pub fn with_latency(mut self, latency: Latency) -> Self {
        self.latency = Some(LatencySampler::new(latency));
        self
    }

    /// The key of object `i`.
    pub fn key(&self, i: u64) -> String {
        format!("{}/{i:010}.bin", self.prefix)
    }

    /// Keys the listings have answered so far (whole pages, counted when a
    /// page is produced).
    pub fn listed(&self) -> u64 {
        self.listed.load(Ordering::SeqCst)
    }

    /// Listing pages produced so far.
    pub fn pages(&self) -> usize {
        self.pages.load(Ordering::SeqCst)
    }

    /// GET and HEAD requests received.
    pub fn gets(&self) -> usize {
        self.gets.load(Ordering::SeqCst)
    }

    fn index(&self, location: &Path) -> Option<u64> {
        let rest = location
            .as_ref()
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix('/')?;
        let digits = rest.strip_suffix(".bin")?;
        if digits.len() != 10 {
            return None;
        }
        let i: u64 = digits.parse().ok()?;
        (i < self.count).then_some(i)
    }

    fn meta(&self, i: u64) -> ObjectMeta {
        meta(&self.prefix, i, self.size)
    }
}

fn meta(prefix: &str, i: u64, size: usize) -> ObjectMeta {
    ObjectMeta {
        location: Path::from(format!("{prefix}/{i:010}.bin")),
        // The epoch: a fixed time, so a listing is the same every time.
        last_modified: Default::default(),
        size: size as u64,
        e_tag: Some(format!("\"{i:x}-{size:x}\"")),
        version: None,
    }
}

fn refused(what: &str) -> object_store::Error {
    object_store::Error::NotSupported {
        source: format!("a GeneratedStore is read-only and lists recursively only ({what})").into(),
    }
}

impl fmt::Debug for GeneratedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GeneratedStore({}, {})", self.prefix, self.count)
    }
}

impl fmt::Display for GeneratedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Generated({}/, {} objects)", self.prefix, self.count)
    }
}

#[async_trait]
impl ObjectStore for GeneratedStore {
    async fn put_opts(
        &self,
        _location: &Path,
        _payload: PutPayload,
        _opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        Err(refused("put"))
    }

    async fn put_multipart_opts(
        &self,
        _location: &Path,
        _opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        Err(refused("put"))
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        if let Some(l) = &self.latency {
            tokio::time::sleep(l.next()).await;
        }
        let i = self
            .index(location)
            .ok_or_else(|| object_store::Error::NotFound {
                path: location.to_string(),
                source: "not a generated key".into(),
            })?;
        let meta = self.meta(i);
        options.check_preconditions(&meta)?;
        let range = match &options.range {
            Some(r) => r
                .as_range(meta.size)
                .map_err(|e| object_store::Error::Generic {
                    store: "generated",
                    source: Box::new(e),
                })?,
            None => 0..meta.size,
        };
        let data = if options.head {
            Bytes::new()
        } else {
            let all = crate::content(i as usize, self.size);
            Bytes::from(all).slice(range.start as usize..range.end as usize)
        };
        Ok(GetResult {
            payload: GetResultPayload::Stream(stream::once(async move { Ok(data) }).boxed()),
            meta,
            range,
            attributes: Default::default(),
        })
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        locations.map(|_| Err(refused("delete"))).boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let asked = prefix.map(|p| p.as_ref().to_string()).unwrap_or_default();
        let whole = asked.is_empty()
            || asked == self.prefix
            || self.prefix.starts_with(&format!("{asked}/"));
        // Below the prefix there are no sub-directories: nothing to list.
        let count = if whole { self.count } else { 0 };
        let (prefix, size, latency) = (self.prefix.clone(), self.size, self.latency.clone());
        let (listed, pages) = (Arc::clone(&self.listed), Arc::clone(&self.pages));
        stream::unfold(0u64, move |start| {
            let (prefix, latency) = (prefix.clone(), latency.clone());
            let (listed, pages) = (Arc::clone(&listed), Arc::clone(&pages));
            async move {
                if start >= count {
                    return None;
                }
                if let Some(l) = &latency {
                    tokio::time::sleep(l.next()).await;
                }
                let end = (start + PAGE).min(count);
                let page: Vec<_> = (start..end).map(|i| Ok(meta(&prefix, i, size))).collect();
                listed.fetch_add(end - start, Ordering::SeqCst);
                pages.fetch_add(1, Ordering::SeqCst);
                Some((stream::iter(page), end))
            }
        })
        .flatten()
        .boxed()
    }

    async fn list_with_delimiter(
        &self,
        _prefix: Option<&Path>,
    ) -> object_store::Result<ListResult> {
        Err(refused("list_with_delimiter"))
    }

    async fn copy_opts(
        &self,
        _from: &Path,
        _to: &Path,
        _options: CopyOptions,
    ) -> object_store::Result<()> {
        Err(refused("copy"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::TryStreamExt;
    use object_store::ObjectStoreExt;

    #[tokio::test]
    async fn lists_pages_lazily_and_reads_every_listed_key() {
        let store = GeneratedStore::new("keys", 2_500).with_size(100);
        let mut list = store.list(Some(&Path::from("keys")));
        let first = list.next().await.expect("a key").expect("ok");
        assert_eq!(first.location.as_ref(), "keys/0000000000.bin");
        assert_eq!((store.listed(), store.pages()), (1_000, 1));
        let rest: Vec<ObjectMeta> = list.try_collect().await.expect("list");
        assert_eq!((rest.len(), store.pages()), (2_499, 3));
        assert!(rest.windows(2).all(|w| w[0].location < w[1].location));

        let last = rest.last().expect("last");
        let got = store.get(&last.location).await.expect("get");
        assert_eq!(got.meta.e_tag, last.e_tag);
        assert_eq!(got.bytes().await.expect("body"), crate::content(2_499, 100));
        let head = store.head(&last.location).await.expect("head");
        assert_eq!(head.size, 100);
        let part = store
            .get_range(&Path::from("keys/0000000007.bin"), 10..20)
            .await
            .expect("range");
        assert_eq!(part.as_ref(), &crate::content(7, 100)[10..20]);
        let missing = store.get(&Path::from("keys/0000002500.bin")).await;
        assert!(matches!(missing, Err(object_store::Error::NotFound { .. })));
        assert_eq!(store.list(Some(&Path::from("other"))).count().await, 0);
    }
}
