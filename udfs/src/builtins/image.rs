//! `image_size`: width and height from an image's header (PNG, GIF, BMP, JPEG),
//! read through `File::open`, so without prefetch only the header is fetched.

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use crate::error::UdfError;
use crate::file::File;

/// Pixel dimensions of an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageSize {
    pub width: u32,
    pub height: u32,
}

/// Reads the header of an image and returns its size.
pub async fn image_size(file: File) -> Result<ImageSize, UdfError> {
    let bad = |what: &str| UdfError::Read {
        url: file.url(),
        source: what.to_string().into(),
    };
    let io = |e: std::io::Error| UdfError::Read {
        url: file.url(),
        source: Box::new(e),
    };
    let mut r = file.open().await?;
    let mut head = [0u8; 26];
    let n = r.read(&mut head).await.map_err(io)?;
    let head = &head[..n];
    let be32 = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    let le32 = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let le16 = |b: &[u8]| u32::from(u16::from_le_bytes([b[0], b[1]]));
    if n >= 24 && head.starts_with(b"\x89PNG\r\n\x1a\n") {
        return Ok(ImageSize {
            width: be32(&head[16..20]),
            height: be32(&head[20..24]),
        });
    }
    if n >= 10 && (head.starts_with(b"GIF87a") || head.starts_with(b"GIF89a")) {
        return Ok(ImageSize {
            width: le16(&head[6..8]),
            height: le16(&head[8..10]),
        });
    }
    if n >= 26 && head.starts_with(b"BM") {
        let h = le32(&head[22..26]) as i32;
        return Ok(ImageSize {
            width: le32(&head[18..22]),
            height: h.unsigned_abs(),
        });
    }
    if n >= 4 && head.starts_with(&[0xFF, 0xD8]) {
        // Walk the JPEG segments to the first start-of-frame marker.
        let mut pos = 2u64;
        loop {
            r.seek(std::io::SeekFrom::Start(pos)).await.map_err(io)?;
            let mut seg = [0u8; 9];
            r.read_exact(&mut seg)
                .await
                .map_err(|_| bad("JPEG without a frame header"))?;
            if seg[0] != 0xFF {
                return Err(bad("corrupt JPEG marker"));
            }
            let marker = seg[1];
            let len = u64::from(u16::from_be_bytes([seg[2], seg[3]]));
            let is_sof = matches!(marker, 0xC0..=0xCF) && !matches!(marker, 0xC4 | 0xC8 | 0xCC);
            if is_sof {
                let height = u32::from(u16::from_be_bytes([seg[5], seg[6]]));
                let width = u32::from(u16::from_be_bytes([seg[7], seg[8]]));
                return Ok(ImageSize { width, height });
            }
            pos += 2 + len;
        }
    }
    Err(bad("not a PNG, GIF, BMP or JPEG image"))
}
