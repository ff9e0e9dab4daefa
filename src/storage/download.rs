//! Downloading one object to a local file: streamed to disk, transient errors
//! (refused connections included) retried with exponential backoff for up to
//! [`RETRY_WINDOW`] after the first failure (a server restart is ridden out),
//! an interrupted body resumed by range from the last byte written.
//!
//! Version-pinned: every GET of a listed file (first request, retries, resumed
//! ranges, and [`VersionPin`] used by on-demand range reads) asks for the version the
//! listing reported (`version`, else `If-Match` its etag; a file listed without
//! either is pinned to the etag of the first response). A rewritten object is
//! an error naming the file ("changed since it was listed"), never retried and
//! never bytes spliced from two versions; a store that ignores `If-Match` is
//! caught by comparing each response's etag with the pinned one.
//!
//! A file named by URL has no listed size or etag ([`File::size_known`]):
//! its first GET ([`download_first`]) takes both from the response (the
//! size checked against the bytes received, as a listed size is) and
//! returns the file pinned to them.

use std::path::Path as FsPath;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use datafusion::object_store::path::Path;
use datafusion::object_store::{
    GetOptions, GetRange, GetResultPayload, ObjectMeta, ObjectStore, ObjectStoreExt,
};
use futures::StreamExt;
use udfchain_udfs::File;

use crate::error::{Error, Result};
use crate::runtime::blocking;

/// Attempts per object at most (the first try plus retries).
pub const MAX_ATTEMPTS: u32 = 12;
const FIRST_BACKOFF: Duration = Duration::from_millis(10);
const MAX_BACKOFF: Duration = Duration::from_millis(400);
/// No retry starts later than this after an object's first failure: long
/// enough to ride out a server restart (1-2 s of refused connections) with
/// a store that does not retry by itself, short enough that a failure an
/// HTTP store has already retried for a long time (object_store backs off
/// from 100 ms up to 15 s, 10 times) is retried once more, not many times
/// over.
pub const RETRY_WINDOW: Duration = Duration::from_millis(2500);

/// The pause before retry number `retry + 1`: 10 ms doubling, at most 400 ms.
fn backoff(retry: u32) -> Duration {
    FIRST_BACKOFF
        .saturating_mul(2u32.saturating_pow(retry))
        .min(MAX_BACKOFF)
}
/// Body bytes gathered before one blocking write: a small object is written
/// with one call on the blocking pool instead of one per body chunk.
const WRITE_BATCH: usize = 1 << 20;

/// A local file body up to this size is read in one blocking call rather than
/// streamed in object_store's 8 KiB chunks (one blocking-pool round trip
/// each); larger ones stream, so memory stays bounded by the chunk.
const ONE_READ_MAX: u64 = 4 << 20;

/// What a download did.
#[derive(Debug, Clone, Copy, Default)]
pub struct Downloaded {
    /// Bytes written.
    pub bytes: u64,
    /// Requests sent again after a failure (a resumed range counts once).
    pub retries: u32,
    /// From sending the first request to its response headers.
    pub first_byte: Duration,
}

/// True for errors worth retrying (server errors, timeouts, resets, refused
/// connections: the HTTP stores report all of them as `Generic` once their own
/// retries are spent); false for answers that will not change (not found,
/// denied, bad path, a failed `If-Match`: the object changed).
pub fn is_transient(e: &object_store::Error) -> bool {
    use object_store::Error as E;
    matches!(e, E::Generic { .. } | E::JoinError { .. })
}

/// The version of a listed file that every GET of it asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VersionPin {
    version: Option<String>,
    etag: Option<String>,
}

impl VersionPin {
    /// The version or etag `file` was listed with (neither, for a file listed
    /// by a store that reports none).
    pub fn of(file: &File) -> Self {
        Self {
            version: file.version.clone(),
            etag: file.etag.clone(),
        }
    }

    fn is_empty(&self) -> bool {
        self.version.is_none() && self.etag.is_none()
    }

    /// GET options for `range` of the pinned version: `version` when the
    /// store reported one, else `If-Match` the etag.
    pub fn options(&self, range: Option<GetRange>) -> GetOptions {
        GetOptions {
            range,
            version: self.version.clone(),
            if_match: match self.version {
                Some(_) => None,
                None => self.etag.clone(),
            },
            ..Default::default()
        }
    }

    /// An error when a response is of another version than the pinned one (a
    /// store that ignored `If-Match`). Quotes and a weak `W/` prefix are not
    /// part of the compared value.
    pub fn check(&self, meta: &ObjectMeta) -> std::result::Result<(), Changed> {
        let differs = |a: &Option<String>, b: &Option<String>| match (a, b) {
            (Some(a), Some(b)) => bare_etag(a) != bare_etag(b),
            _ => false,
        };
        if differs(&self.version, &meta.version)
            || (self.version.is_none() && differs(&self.etag, &meta.e_tag))
        {
            return Err(self.changed(meta.e_tag.clone().or(meta.version.clone())));
        }
        Ok(())
    }

    /// `e` as an error source: a failed precondition (`If-Match`, or a version
    /// that is gone) becomes [`Changed`].
    pub fn error(&self, e: object_store::Error) -> Box<dyn std::error::Error + Send + Sync> {
        match e {
            object_store::Error::Precondition { .. } if !self.is_empty() => {
                Box::new(self.changed(None))
            }
            e => super::explain(e),
        }
    }

    fn changed(&self, now: Option<String>) -> Changed {
        let listed = match (&self.version, &self.etag) {
            (Some(v), _) => format!("version {v}"),
            (None, Some(e)) => format!("etag {e}"),
            (None, None) => "no version".to_string(),
        };
        Changed { listed, now }
    }
}

fn bare_etag(e: &str) -> &str {
    e.strip_prefix("W/").unwrap_or(e).trim_matches('"')
}

/// An object read after it was rewritten: its version or etag is no longer
/// the one it was listed with (or the one its download started with).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Changed {
    listed: String,
    now: Option<String>,
}

impl std::fmt::Display for Changed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the object changed since it was listed ({}", self.listed)?;
        if let Some(now) = &self.now {
            write!(f, ", now {now}")?;
        }
        f.write_str(")")
    }
}

impl std::error::Error for Changed {}

/// Downloads the whole object `file` (at `path` of `store`, `file.size` bytes,
/// the version it was listed with) into `dest`.
///
/// # Cancel safety
/// Dropping the future stops the download; `dest` may hold a partial file,
/// which the caller owns (temp dirs and cache temp files are cleaned by them).
pub async fn download_to(
    store: &Arc<dyn ObjectStore>,
    path: &Path,
    file: &File,
    dest: &FsPath,
) -> Result<Downloaded> {
    let mut out = Sink::File(Writer::create(dest).await?);
    download(store, path, file, &mut out).await.map(|(d, _)| d)
}

/// Where [`download_first`] put a file's bytes.
#[derive(Debug)]
pub enum Body {
    /// In memory (the object was at most the memory limit).
    Memory(Bytes),
    /// In the `dest` file.
    Disk,
}

/// The first GET of a file whose size is not known (named by URL, see
/// [`File::size_known`]): downloads it whole, with the retries, resumption
/// and pinning of [`download_to`], into memory when the response says it
/// is at most `memory_limit` bytes, else into `dest`; returns the file
/// pinned to what that response said (size, etag, version, modification
/// time), which every later read of it then asks for.
///
/// # Cancel safety
/// Dropping the future stops the download; `dest` may hold a partial file,
/// which the caller owns.
pub async fn download_first(
    store: &Arc<dyn ObjectStore>,
    path: &Path,
    file: &File,
    memory_limit: u64,
    dest: &FsPath,
) -> Result<(File, Body, Downloaded)> {
    let mut out = Sink::Choose {
        memory_limit,
        dest: dest.to_path_buf(),
    };
    let (d, meta) = download(store, path, file, &mut out).await?;
    let pinned = match meta {
        Some(meta) => pinned_to(file, meta, d.bytes),
        None => file.clone(),
    };
    let body = match out {
        Sink::Memory(b) => Body::Memory(b.freeze()),
        _ => Body::Disk,
    };
    Ok((pinned, body, d))
}

/// `file`, whose size is not known (named by URL), pinned to a HEAD of it:
/// the size, etag, version and modification time every later read asks for.
pub async fn stat(store: &Arc<dyn ObjectStore>, path: &Path, file: &File) -> Result<File> {
    let meta = store.head(path).await.map_err(|e| Error::Storage {
        url: file.url(),
        source: Arc::from(VersionPin::of(file).error(e)),
    })?;
    let size = meta.size;
    Ok(pinned_to(file, meta, size))
}

/// `file` as the response `meta` (of `size` bytes) describes it.
fn pinned_to(file: &File, meta: ObjectMeta, size: u64) -> File {
    File {
        size,
        etag: meta.e_tag,
        version: meta.version.or(file.version.clone()),
        last_modified: Some(meta.last_modified.timestamp_millis()),
        ..file.clone()
    }
}

/// Downloads the whole object `file` into memory, with the retries,
/// resumption and version pinning of [`download_to`].
///
/// # Cancel safety
/// Dropping the future stops the download; nothing is left behind.
pub async fn download_bytes(
    store: &Arc<dyn ObjectStore>,
    path: &Path,
    file: &File,
) -> Result<(Bytes, Downloaded)> {
    let mut out = Sink::Memory(BytesMut::with_capacity(file.size as usize));
    let (d, _) = download(store, path, file, &mut out).await?;
    match out {
        Sink::Memory(b) => Ok((b.freeze(), d)),
        _ => Err(Error::internal("download_bytes wrote a file")),
    }
}

/// The download loop; also returns the first response's metadata.
async fn download(
    store: &Arc<dyn ObjectStore>,
    path: &Path,
    file: &File,
    out: &mut Sink,
) -> Result<(Downloaded, Option<ObjectMeta>)> {
    let url = file.url();
    // Unknown (a file named by URL): the first response's size, checked as a
    // listed size is.
    let mut size = file.size_known().then_some(file.size);
    let mut first_meta = None;
    let mut pin = VersionPin::of(file);
    let mut written = 0u64;
    let mut retries = 0u32;
    let mut first_byte = None;
    let mut first_failure = None;
    let storage_err = |source: Box<dyn std::error::Error + Send + Sync>| Error::Storage {
        url: url.clone(),
        source: Arc::from(source),
    };
    loop {
        let opts = pin.options((written > 0).then_some(GetRange::Offset(written)));
        let sent = std::time::Instant::now();
        let failure = match store.get_opts(path, opts).await {
            Ok(result) => {
                pin.check(&result.meta)
                    .map_err(|changed| storage_err(Box::new(changed)))?;
                // Listed without a version or etag: the rest (a resumed range
                // after a broken body) must be of the version started with.
                if pin.is_empty() {
                    pin.etag = result.meta.e_tag.clone();
                }
                if first_meta.is_none() {
                    // A whole-object GET: `meta.size` is the object's size.
                    let object_size = *size.get_or_insert(result.meta.size);
                    out.choose(object_size).await?;
                    first_meta = Some(result.meta.clone());
                }
                first_byte.get_or_insert(sent.elapsed());
                // A local file streams in 8 KiB reads, each a blocking-pool
                // round trip (object_store's `LocalFileSystem`): one read of
                // the whole body instead when it goes to memory or is small.
                let one_read = matches!(result.payload, GetResultPayload::File(..))
                    && (matches!(out, Sink::Memory(_))
                        || result.range.end - result.range.start <= ONE_READ_MAX);
                if one_read {
                    match result.bytes().await {
                        Ok(bytes) => {
                            written += bytes.len() as u64;
                            out.push(bytes).await?;
                            break;
                        }
                        Err(e) => e,
                    }
                } else {
                    let mut body = result.into_stream();
                    let mut failure = None;
                    while let Some(chunk) = body.next().await {
                        match chunk {
                            Ok(bytes) => {
                                written += bytes.len() as u64;
                                out.push(bytes).await?;
                            }
                            Err(e) => {
                                failure = Some(e);
                                break;
                            }
                        }
                    }
                    match failure {
                        None => break,
                        Some(e) => e,
                    }
                }
            }
            Err(e) => e,
        };
        let failing_since = *first_failure.get_or_insert_with(std::time::Instant::now);
        if !is_transient(&failure)
            || retries + 1 >= MAX_ATTEMPTS
            || failing_since.elapsed() >= RETRY_WINDOW
        {
            return Err(storage_err(pin.error(failure)));
        }
        tokio::time::sleep(backoff(retries)).await;
        retries += 1;
    }
    out.finish().await?;
    let size = size.unwrap_or(written);
    if written != size {
        return Err(Error::Storage {
            url,
            source: Arc::new(std::io::Error::other(format!(
                "expected {size} bytes, got {written} (the object changed since it was listed)"
            ))),
        });
    }
    let d = Downloaded {
        bytes: written,
        retries,
        first_byte: first_byte.unwrap_or_default(),
    };
    Ok((d, first_meta))
}

/// Where a download's body goes.
enum Sink {
    File(Writer),
    Memory(BytesMut),
    /// Memory or the `dest` file, chosen by the size the first response
    /// gives ([`download_first`]).
    Choose {
        memory_limit: u64,
        dest: std::path::PathBuf,
    },
}

impl Sink {
    /// Settles a `Choose` sink for an object of `size` bytes.
    async fn choose(&mut self, size: u64) -> Result<()> {
        if let Self::Choose { memory_limit, dest } = self {
            *self = if size <= *memory_limit {
                Self::Memory(BytesMut::with_capacity(size as usize))
            } else {
                Self::File(Writer::create(dest).await?)
            };
        }
        Ok(())
    }

    async fn push(&mut self, bytes: Bytes) -> Result<()> {
        match self {
            Self::File(w) => w.push(bytes).await,
            Self::Memory(m) => {
                m.extend_from_slice(&bytes);
                Ok(())
            }
            Self::Choose { .. } => Err(Error::internal("a body before its response")),
        }
    }

    async fn finish(&mut self) -> Result<()> {
        match self {
            Self::File(w) => w.flush().await,
            Self::Memory(_) | Self::Choose { .. } => Ok(()),
        }
    }
}

/// Writes body chunks to a file in batches of `WRITE_BATCH` bytes, each batch
/// one call on the blocking pool (tokio's `File` makes one per chunk, and a
/// 16 MiB body arrives in hundreds of chunks).
struct Writer {
    path: std::path::PathBuf,
    file: Option<std::fs::File>,
    pending: Vec<Bytes>,
    pending_len: usize,
}

impl Writer {
    async fn create(path: &FsPath) -> Result<Self> {
        let p = path.to_path_buf();
        let file =
            blocking(move || std::fs::File::create(&p).map_err(|e| Error::io(p.display(), e)))
                .await?;
        Ok(Self {
            path: path.to_path_buf(),
            file: Some(file),
            pending: Vec::new(),
            pending_len: 0,
        })
    }

    async fn push(&mut self, bytes: Bytes) -> Result<()> {
        self.pending_len += bytes.len();
        self.pending.push(bytes);
        if self.pending_len >= WRITE_BATCH {
            self.flush().await?;
        }
        Ok(())
    }

    async fn flush(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let Some(mut file) = self.file.take() else {
            return Err(Error::io(
                self.path.display(),
                std::io::Error::other("an earlier write failed"),
            ));
        };
        let chunks = std::mem::take(&mut self.pending);
        self.pending_len = 0;
        let path = self.path.clone();
        let file = blocking(move || {
            use std::io::Write;
            for c in &chunks {
                file.write_all(c)
                    .map_err(|e| Error::io(path.display(), e))?;
            }
            Ok(file)
        })
        .await?;
        self.file = Some(file);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(e_tag: Option<&str>, version: Option<&str>) -> ObjectMeta {
        ObjectMeta {
            location: Path::from("x"),
            last_modified: Default::default(),
            size: 1,
            e_tag: e_tag.map(str::to_string),
            version: version.map(str::to_string),
        }
    }

    fn file(etag: Option<&str>, version: Option<&str>) -> File {
        File {
            source: "s3://b".into(),
            path: "x".into(),
            size: 1,
            etag: etag.map(str::to_string),
            version: version.map(str::to_string),
            ..Default::default()
        }
    }

    #[test]
    fn transient_errors_are_the_ones_worth_retrying() {
        let generic = object_store::Error::Generic {
            store: "S3",
            source: "error sending request: connection refused".into(),
        };
        assert!(is_transient(&generic));
        let path = "x".to_string();
        let not_found = object_store::Error::NotFound {
            path: path.clone(),
            source: "404".into(),
        };
        let precondition = object_store::Error::Precondition {
            path: path.clone(),
            source: "412".into(),
        };
        let denied = object_store::Error::PermissionDenied {
            path,
            source: "403".into(),
        };
        for e in [not_found, precondition, denied] {
            assert!(!is_transient(&e), "{e}");
        }
    }

    #[test]
    fn backoff_doubles_up_to_a_cap_and_retries_span_a_restart() {
        assert_eq!(backoff(0), Duration::from_millis(10));
        assert_eq!(backoff(3), Duration::from_millis(80));
        assert_eq!(backoff(30), MAX_BACKOFF);
        let slept: Duration = (0..MAX_ATTEMPTS - 1).map(backoff).sum();
        assert!(
            slept >= Duration::from_secs(2) && slept >= RETRY_WINDOW - MAX_BACKOFF,
            "the attempts outlast a 2 s restart, up to the window: {slept:?}"
        );
    }

    #[test]
    fn a_pin_asks_for_the_version_else_the_etag() {
        let opts = VersionPin::of(&file(Some("\"e1\""), None)).options(None);
        assert_eq!(opts.if_match.as_deref(), Some("\"e1\""));
        assert_eq!(opts.version, None);
        let opts =
            VersionPin::of(&file(Some("\"e1\""), Some("v1"))).options(Some(GetRange::Offset(5)));
        assert_eq!(opts.version.as_deref(), Some("v1"));
        assert_eq!(opts.if_match, None);
        assert!(matches!(opts.range, Some(GetRange::Offset(5))));
        let opts = VersionPin::of(&file(None, None)).options(None);
        assert_eq!((opts.if_match, opts.version), (None, None));
    }

    #[test]
    fn a_pin_catches_another_version_in_a_response() {
        let pin = VersionPin::of(&file(Some("\"e1\""), None));
        assert!(pin.check(&meta(Some("\"e1\""), None)).is_ok());
        assert!(pin.check(&meta(Some("W/\"e1\""), None)).is_ok(), "weak");
        assert!(pin.check(&meta(Some("e1"), None)).is_ok(), "unquoted");
        assert!(pin.check(&meta(None, None)).is_ok(), "no etag to compare");
        let changed = pin.check(&meta(Some("\"e2\""), None)).expect_err("changed");
        assert!(
            changed.to_string().contains("changed since it was listed"),
            "{changed}"
        );
        let versioned = VersionPin::of(&file(Some("\"e1\""), Some("v1")));
        assert!(versioned.check(&meta(Some("\"e9\""), Some("v1"))).is_ok());
        assert!(versioned.check(&meta(Some("\"e1\""), Some("v2"))).is_err());
        assert!(
            VersionPin::default()
                .check(&meta(Some("\"e2\""), None))
                .is_ok()
        );
    }

    #[test]
    fn a_failed_precondition_reads_as_changed() {
        let pin = VersionPin::of(&file(Some("\"e1\""), None));
        let e = object_store::Error::Precondition {
            path: "x".into(),
            source: "412".into(),
        };
        assert!(
            pin.error(e)
                .to_string()
                .contains("changed since it was listed")
        );
        let e = object_store::Error::NotFound {
            path: "x".into(),
            source: "404".into(),
        };
        assert!(!pin.error(e).to_string().contains("changed"));
    }
}
