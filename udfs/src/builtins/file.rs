//! Built-in map UDFs over a `File`: size, hashes, text, line count.

use sha2::Digest;

use crate::error::UdfError;
use crate::file::File;

/// The file's size in bytes (no read).
pub async fn file_size(file: File) -> Result<u64, UdfError> {
    Ok(file.size)
}

/// Hex SHA-256 of the file's bytes.
pub async fn sha256(file: File) -> Result<String, UdfError> {
    Ok(hex(&sha2::Sha256::digest(file.read().await?)))
}

/// Hex MD5 of the file's bytes.
pub async fn md5(file: File) -> Result<String, UdfError> {
    Ok(hex(&md5::Md5::digest(file.read().await?)))
}

/// The file as UTF-8 text.
pub async fn read_text(file: File) -> Result<String, UdfError> {
    file.read_text().await
}

/// Number of lines (a last line without a newline counts).
pub async fn line_count(file: File) -> Result<u64, UdfError> {
    let bytes = file.read().await?;
    let newlines = bytes.iter().filter(|&&b| b == b'\n').count() as u64;
    Ok(newlines + u64::from(bytes.last().is_some_and(|&b| b != b'\n')))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
