//! Built-in map UDFs over a `File`: size, hashes, text, line count.
//!
//! Guarantees: `sha256`, `md5` and `line_count` stream the file through
//! [`File::open`] in chunks of at most [`CHUNK`] bytes (a local copy read
//! from disk, else ranged reads of the store), so their memory is bounded
//! by the chunk whatever the file's size; their results are those of the
//! whole bytes at once. `read_text` returns the whole file, so it holds it.

use sha2::Digest;
use tokio::io::AsyncReadExt;

use crate::error::UdfError;
use crate::file::File;

/// The most bytes a streaming built-in holds of a file at once.
const CHUNK: usize = 1 << 20;

/// The file's size in bytes (no read).
pub async fn file_size(file: File) -> Result<u64, UdfError> {
    Ok(file.size)
}

/// Hex SHA-256 of the file's bytes, read in chunks.
pub async fn sha256(file: File) -> Result<String, UdfError> {
    let mut hash = sha2::Sha256::new();
    for_each_chunk(&file, |c| hash.update(c)).await?;
    Ok(hex(&hash.finalize()))
}

/// Hex MD5 of the file's bytes, read in chunks.
pub async fn md5(file: File) -> Result<String, UdfError> {
    let mut hash = md5::Md5::new();
    for_each_chunk(&file, |c| hash.update(c)).await?;
    Ok(hex(&hash.finalize()))
}

/// The file as UTF-8 text.
pub async fn read_text(file: File) -> Result<String, UdfError> {
    file.read_text().await
}

/// Number of lines (a last line without a newline counts), read in chunks.
pub async fn line_count(file: File) -> Result<u64, UdfError> {
    let (mut newlines, mut last) = (0u64, None);
    for_each_chunk(&file, |c| {
        newlines += c.iter().filter(|&&b| b == b'\n').count() as u64;
        last = c.last().copied().or(last);
    })
    .await?;
    Ok(newlines + u64::from(last.is_some_and(|b| b != b'\n')))
}

/// Feeds the file's bytes to `f` in order, at most [`CHUNK`] bytes at a time.
async fn for_each_chunk(file: &File, mut f: impl FnMut(&[u8])) -> Result<(), UdfError> {
    let mut reader = file.open().await?;
    // Held in memory already (a small prefetched file): no copy.
    if let crate::file::FileReader::Memory(bytes) = &reader {
        f(bytes.get_ref());
        return Ok(());
    }
    // A small file needs no chunk-sized buffer (allocated per call).
    let cap = match file.size_known() {
        true => usize::try_from(file.size).map_or(CHUNK, |n| n.clamp(1, CHUNK)),
        false => CHUNK,
    };
    let mut buf = vec![0u8; cap];
    loop {
        let n = reader
            .read(&mut buf)
            .await
            .map_err(|e| read_error(file, e))?;
        if n == 0 {
            return Ok(());
        }
        f(&buf[..n]);
    }
}

/// An I/O error of a reader as the read error it carries (a ranged read's
/// own `UdfError`), else as a read error of `file`.
fn read_error(file: &File, e: std::io::Error) -> UdfError {
    if !e.get_ref().is_some_and(|inner| inner.is::<UdfError>()) {
        return UdfError::Read {
            url: file.url(),
            source: Box::new(e),
        };
    }
    match e.into_inner().map(|b| b.downcast::<UdfError>()) {
        Some(Ok(inner)) => *inner,
        Some(Err(other)) => UdfError::Read {
            url: file.url(),
            source: other,
        },
        None => UdfError::Read {
            url: file.url(),
            source: "read failed".into(),
        },
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use sha2::Digest;

    use super::*;
    use crate::test_source::MemorySource;

    /// Bytes whose every chunk differs, longer than a few chunks.
    fn bytes(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 % 251) as u8).collect()
    }

    /// Chunked results equal the whole bytes' at once, across chunk
    /// boundaries and for a last line with no newline.
    #[test]
    fn chunked_results_are_the_whole_bytes() {
        for len in [0, 1, CHUNK - 1, CHUNK, 2 * CHUNK + 17] {
            let mut data = bytes(len);
            if let Some(b) = data.last_mut() {
                *b = b'x';
            }
            let source = MemorySource::new(data.clone());
            let file = source.file();
            let (sha, md, lines) = source.run(async {
                (
                    sha256(file.clone()).await.expect("sha256"),
                    md5(file.clone()).await.expect("md5"),
                    line_count(file.clone()).await.expect("line_count"),
                )
            });
            assert_eq!(sha, hex(&sha2::Sha256::digest(&data)), "len {len}");
            assert_eq!(md, hex(&md5::Md5::digest(&data)), "len {len}");
            let newlines = data.iter().filter(|&&b| b == b'\n').count() as u64;
            assert_eq!(lines, newlines + u64::from(len > 0), "len {len}");
        }
    }

    /// Without a local copy the bytes come by ranged reads, never one read
    /// of the whole file.
    #[test]
    fn a_remote_file_is_read_by_ranges() {
        let data = bytes(20 << 20);
        let source = MemorySource::new(data.clone());
        let file = source.file();
        let sha = source.run(sha256(file)).expect("sha256");
        assert_eq!(sha, hex(&sha2::Sha256::digest(&data)));
        assert!(source.reads() > 3, "{} reads", source.reads());
    }

    /// A read that fails is the source's error, not wrapped twice.
    #[test]
    fn a_failed_read_is_the_sources_error() {
        let source = MemorySource::new(bytes(10));
        let file = File {
            size: 100,
            ..source.file()
        };
        let err = source.run(sha256(file)).expect_err("past the end");
        let text = err.to_string();
        assert_eq!(text.matches("reading").count(), 1, "{text}");
    }
}
