//! Downloading one object to a local file: streamed to disk, transient errors
//! retried with exponential backoff, an interrupted body resumed by range from
//! the last byte written.

use std::path::Path as FsPath;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use datafusion::object_store::path::Path;
use datafusion::object_store::{GetOptions, GetRange, ObjectStore};
use futures::StreamExt;

use crate::error::{Error, Result};

/// Attempts per object (the first try plus retries).
pub const MAX_ATTEMPTS: u32 = 6;
const FIRST_BACKOFF: Duration = Duration::from_millis(10);
/// Body bytes gathered before one blocking write: a small object is written
/// with one call on the blocking pool instead of one per body chunk.
const WRITE_BATCH: usize = 1 << 20;

/// What a download did.
#[derive(Debug, Clone, Copy, Default)]
pub struct Downloaded {
    pub bytes: u64,
    pub retries: u32,
    /// From sending the first request to its response headers.
    pub first_byte: Duration,
}

/// True for errors worth retrying (server errors, timeouts, resets); false for
/// answers that will not change (not found, denied, bad path).
pub fn is_transient(e: &object_store::Error) -> bool {
    use object_store::Error as E;
    matches!(e, E::Generic { .. } | E::JoinError { .. })
}

/// Downloads `path` of `store` (expected `size` bytes) into `dest`.
///
/// # Cancel safety
/// Dropping the future stops the download; `dest` may hold a partial file,
/// which the caller owns (temp dirs and cache temp files are cleaned by them).
pub async fn download_to(
    store: &Arc<dyn ObjectStore>,
    path: &Path,
    size: u64,
    dest: &FsPath,
    url: &str,
) -> Result<Downloaded> {
    let mut out = Sink::File(Writer::create(dest).await?);
    download(store, path, size, url, &mut out).await
}

/// Downloads `path` of `store` (expected `size` bytes) into memory, with the
/// retries and resumption of [`download_to`].
pub async fn download_bytes(
    store: &Arc<dyn ObjectStore>,
    path: &Path,
    size: u64,
    url: &str,
) -> Result<(Bytes, Downloaded)> {
    let mut out = Sink::Memory(BytesMut::with_capacity(size as usize));
    let d = download(store, path, size, url, &mut out).await?;
    match out {
        Sink::Memory(b) => Ok((b.freeze(), d)),
        Sink::File(_) => Err(Error::internal("download_bytes wrote a file")),
    }
}

async fn download(
    store: &Arc<dyn ObjectStore>,
    path: &Path,
    size: u64,
    url: &str,
    out: &mut Sink,
) -> Result<Downloaded> {
    let mut written = 0u64;
    let mut retries = 0u32;
    let mut first_byte = None;
    let storage_err = |e: object_store::Error| Error::Storage {
        url: url.to_string(),
        source: Arc::new(e),
    };
    loop {
        let opts = GetOptions {
            range: (written > 0).then_some(GetRange::Offset(written)),
            ..Default::default()
        };
        let sent = std::time::Instant::now();
        let failure = match store.get_opts(path, opts).await {
            Ok(result) => {
                first_byte.get_or_insert(sent.elapsed());
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
            Err(e) => e,
        };
        if !is_transient(&failure) || retries + 1 >= MAX_ATTEMPTS {
            return Err(storage_err(failure));
        }
        tokio::time::sleep(FIRST_BACKOFF * 2u32.pow(retries)).await;
        retries += 1;
    }
    out.finish().await?;
    if written != size {
        return Err(Error::Storage {
            url: url.to_string(),
            source: Arc::new(std::io::Error::other(format!(
                "expected {size} bytes, got {written} (the object changed since it was listed)"
            ))),
        });
    }
    Ok(Downloaded {
        bytes: written,
        retries,
        first_byte: first_byte.unwrap_or_default(),
    })
}

/// Where a download's body goes.
enum Sink {
    File(Writer),
    Memory(BytesMut),
}

impl Sink {
    async fn push(&mut self, bytes: Bytes) -> Result<()> {
        match self {
            Self::File(w) => w.push(bytes).await,
            Self::Memory(m) => {
                m.extend_from_slice(&bytes);
                Ok(())
            }
        }
    }

    async fn finish(&mut self) -> Result<()> {
        match self {
            Self::File(w) => w.flush().await,
            Self::Memory(_) => Ok(()),
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
        let file = blocking(path, move || std::fs::File::create(&p)).await?;
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
        let file = blocking(&self.path, move || {
            use std::io::Write;
            for c in &chunks {
                file.write_all(c)?;
            }
            Ok(file)
        })
        .await?;
        self.file = Some(file);
        Ok(())
    }
}

/// Runs `f` on the blocking pool; its I/O errors name `path`.
async fn blocking<T: Send + 'static>(
    path: &FsPath,
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::io(path.display(), std::io::Error::other(e)))?
        .map_err(|e| Error::io(path.display(), e))
}
