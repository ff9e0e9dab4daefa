//! Downloading one object to a local file: streamed to disk, transient errors
//! retried with exponential backoff, an interrupted body resumed by range from
//! the last byte written.

use std::path::Path as FsPath;
use std::sync::Arc;
use std::time::Duration;

use datafusion::object_store::path::Path;
use datafusion::object_store::{GetOptions, GetRange, ObjectStore};
use futures::StreamExt;
use tokio::io::AsyncWriteExt;

use crate::error::{Error, Result};

/// Attempts per object (the first try plus retries).
pub const MAX_ATTEMPTS: u32 = 6;
const FIRST_BACKOFF: Duration = Duration::from_millis(10);

/// What a download did.
#[derive(Debug, Clone, Copy, Default)]
pub struct Downloaded {
    pub bytes: u64,
    pub retries: u32,
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
    let mut out = tokio::fs::File::create(dest)
        .await
        .map_err(|e| Error::io(dest.display(), e))?;
    let mut written = 0u64;
    let mut retries = 0u32;
    let storage_err = |e: object_store::Error| Error::Storage {
        url: url.to_string(),
        source: Arc::new(e),
    };
    loop {
        let opts = GetOptions {
            range: (written > 0).then_some(GetRange::Offset(written)),
            ..Default::default()
        };
        let failure = match store.get_opts(path, opts).await {
            Ok(result) => {
                let mut body = result.into_stream();
                let mut failure = None;
                while let Some(chunk) = body.next().await {
                    match chunk {
                        Ok(bytes) => {
                            out.write_all(&bytes)
                                .await
                                .map_err(|e| Error::io(dest.display(), e))?;
                            written += bytes.len() as u64;
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
    out.flush()
        .await
        .map_err(|e| Error::io(dest.display(), e))?;
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
    })
}
