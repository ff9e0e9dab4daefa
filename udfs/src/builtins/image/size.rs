//! `image_size`: width and height from an image's header, decoded by the
//! `imagesize` crate (PNG, JPEG, GIF, BMP, WebP, AVIF, HEIC/HEIF, TIFF, ICO,
//! PSD, QOI, JPEG XL, EXR and more).
//!
//! Guarantees:
//! - only the bytes the decoder asks for are read: the first 4 KiB, then one
//!   range read wherever it next looks (a JPEG's next segment, a TIFF's IFD at
//!   the end of the file), each range twice the last up to 1 MiB; so without
//!   prefetch only about the header crosses the network;
//! - the size is what the decoder finds in the whole file: when it looked at
//!   bytes not read yet, they are read and it decodes again;
//! - for any bytes the call ends in a size or a clear error within
//!   [`MAX_READS`] reads and about [`MAX_HEADER_BYTES`] bytes;
//! - a dimension that does not fit in `u32` is an error, never truncated.

use std::collections::BTreeMap;
use std::io::{BufReader, Read, Seek, SeekFrom};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::error::UdfError;
use crate::file::File;

/// The most range reads one `image_size` call makes.
pub const MAX_READS: usize = 64;
/// The most bytes one `image_size` call reads.
pub const MAX_HEADER_BYTES: u64 = 16 << 20;
const FIRST_READ: u64 = 4 << 10;
const MAX_READ: u64 = 1 << 20;

/// Pixel dimensions of an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageSize {
    /// Pixels across.
    pub width: u32,
    /// Pixels down.
    pub height: u32,
}

/// Reads the header of an image and returns its size.
pub async fn image_size(file: File) -> Result<ImageSize, UdfError> {
    let bad = |what: String| UdfError::Read {
        url: file.url(),
        source: format!("not an image imagesize knows: {what}").into(),
    };
    let mut bytes = Sparse::new(file.size);
    let (mut at, mut len) = (0u64, FIRST_READ);
    let mut result = Err(imagesize::ImageError::NotSupported);
    for _ in 0..MAX_READS {
        let end = bytes.end_of_gap(at, len);
        let chunk = file.read_range(at..end).await?;
        if chunk.len() as u64 != end - at {
            return Err(bad(format!(
                "short read at byte {at}: {} of {} bytes",
                chunk.len(),
                end - at
            )));
        }
        bytes.insert(at, chunk);
        len = (len * 2).min(MAX_READ);
        bytes.pos = 0;
        result = imagesize::reader_size(BufReader::new(&mut bytes));
        // A decoder that looked where nothing is read yet decided without
        // those bytes (some swallow read errors): read there and decode again.
        match bytes.missing.take() {
            Some(next) if bytes.held < MAX_HEADER_BYTES => at = next,
            _ => break,
        }
    }
    let mut size = result.map_err(|e| bad(e.to_string()))?;
    // imagesize reads a BMP's height unsigned; a top-down BMP stores it negative.
    bytes.pos = 0;
    if let Ok(imagesize::ImageType::Bmp) = imagesize::reader_type(BufReader::new(&mut bytes)) {
        size.height = (size.height as u32 as i32).unsigned_abs() as usize;
    }
    let dim = |v: usize| u32::try_from(v).map_err(|_| bad(format!("dimension {v}")));
    Ok(ImageSize {
        width: dim(size.width)?,
        height: dim(size.height)?,
    })
}

/// The bytes of an object read so far, as a seekable reader that fails
/// where it has no bytes and remembers the first such place.
struct Sparse {
    size: u64,
    chunks: BTreeMap<u64, Bytes>,
    held: u64,
    pos: u64,
    missing: Option<u64>,
}

impl Sparse {
    fn new(size: u64) -> Self {
        Self {
            size,
            chunks: BTreeMap::new(),
            held: 0,
            pos: 0,
            missing: None,
        }
    }

    /// The end of a read of at most `len` bytes at `at`: before the next
    /// chunk held and the end of the object (`at` itself lies in a gap).
    fn end_of_gap(&self, at: u64, len: u64) -> u64 {
        let next = self
            .chunks
            .range(at..)
            .next()
            .map_or(self.size, |(&start, _)| start);
        at.saturating_add(len).min(next).min(self.size)
    }

    fn insert(&mut self, at: u64, chunk: Bytes) {
        self.held += chunk.len() as u64;
        if !chunk.is_empty() {
            self.chunks.insert(at, chunk);
        }
    }
}

impl Read for Sparse {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if buf.is_empty() || self.pos >= self.size {
            return Ok(0);
        }
        if let Some((&start, chunk)) = self.chunks.range(..=self.pos).next_back() {
            let off = self.pos - start;
            if off < chunk.len() as u64 {
                let off = off as usize;
                let n = buf.len().min(chunk.len() - off);
                buf[..n].copy_from_slice(&chunk[off..off + n]);
                self.pos += n as u64;
                return Ok(n);
            }
        }
        self.missing.get_or_insert(self.pos);
        Err(std::io::Error::other(format!(
            "byte {} not read yet",
            self.pos
        )))
    }
}

impl Seek for Sparse {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        let pos = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::End(d) => self.size.checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        self.pos = pos.ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "seek before the start")
        })?;
        Ok(self.pos)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::test_source::MemorySource;

    fn size_of(bytes: Vec<u8>) -> (Result<(u32, u32), String>, usize) {
        let source = MemorySource::new(bytes);
        let got = source
            .run(image_size(source.file()))
            .map(|s| (s.width, s.height))
            .map_err(|e| e.to_string());
        (got, source.reads())
    }

    fn png_chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        let start = out.len();
        out.extend_from_slice(kind);
        out.extend_from_slice(data);
        let crc = crc32fast::hash(&out[start..]);
        out.extend_from_slice(&crc.to_be_bytes());
    }

    /// A complete grey PNG: IHDR, one IDAT (zlib stored block), IEND.
    fn png(w: u32, h: u32) -> Vec<u8> {
        let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
        let mut ihdr = Vec::new();
        ihdr.extend_from_slice(&w.to_be_bytes());
        ihdr.extend_from_slice(&h.to_be_bytes());
        ihdr.extend_from_slice(&[8, 0, 0, 0, 0]);
        png_chunk(&mut out, b"IHDR", &ihdr);
        let raw: Vec<u8> = (0..h)
            .flat_map(|_| std::iter::once(0).chain((0..w).map(|x| x as u8)))
            .collect();
        let (mut a, mut b) = (1u32, 0u32);
        for &x in &raw {
            a = (a + u32::from(x)) % 65521;
            b = (b + a) % 65521;
        }
        let mut z = vec![0x78, 0x01, 1];
        z.extend_from_slice(&(raw.len() as u16).to_le_bytes());
        z.extend_from_slice(&(!(raw.len() as u16)).to_le_bytes());
        z.extend_from_slice(&raw);
        z.extend_from_slice(&((b << 16) | a).to_be_bytes());
        png_chunk(&mut out, b"IDAT", &z);
        png_chunk(&mut out, b"IEND", &[]);
        out
    }

    /// A GIF89a with a 7x5 canvas holding one 1x1 image.
    fn gif() -> Vec<u8> {
        let mut out = b"GIF89a".to_vec();
        out.extend_from_slice(&[7, 0, 5, 0, 0x80, 0, 0]);
        out.extend_from_slice(&[0, 0, 0, 255, 255, 255]);
        out.extend_from_slice(&[0x2C, 0, 0, 0, 0, 1, 0, 1, 0, 0]);
        out.extend_from_slice(&[2, 2, 0x44, 1, 0, 0x3B]);
        out
    }

    /// A complete 24-bit BMP; a negative height is stored top-down.
    fn bmp(w: i32, h: i32) -> Vec<u8> {
        let row = (w as usize * 3).next_multiple_of(4);
        let pixels = row * h.unsigned_abs() as usize;
        let mut out = b"BM".to_vec();
        out.extend_from_slice(&((54 + pixels) as u32).to_le_bytes());
        out.extend_from_slice(&[0, 0, 0, 0]);
        out.extend_from_slice(&54u32.to_le_bytes());
        out.extend_from_slice(&40u32.to_le_bytes());
        out.extend_from_slice(&w.to_le_bytes());
        out.extend_from_slice(&h.to_le_bytes());
        out.extend_from_slice(&1u16.to_le_bytes());
        out.extend_from_slice(&24u16.to_le_bytes());
        out.extend_from_slice(&[0; 24]);
        out.resize(54 + pixels, 0x7f);
        out
    }

    /// A JPEG's markers up to its frame header, after `app1` APP1 segments of
    /// 64 KiB each (EXIF-sized), so the frame header lies far from the start.
    fn jpeg(w: u16, h: u16, app1: usize) -> Vec<u8> {
        let mut out = vec![0xFF, 0xD8, 0xFF, 0xE0, 0, 16];
        out.extend_from_slice(b"JFIF\0\x01\x01\0\0\x01\0\x01\0\0");
        for _ in 0..app1 {
            out.extend_from_slice(&[0xFF, 0xE1, 0xFF, 0xFF]);
            out.extend_from_slice(b"Exif\0\0");
            out.resize(out.len() + 0xFFFF - 8, 0);
        }
        out.extend_from_slice(&[0xFF, 0xC0, 0, 17, 8]);
        out.extend_from_slice(&h.to_be_bytes());
        out.extend_from_slice(&w.to_be_bytes());
        out.extend_from_slice(&[3, 1, 0x22, 0, 2, 0x11, 1, 3, 0x11, 1]);
        out.extend_from_slice(&[0xFF, 0xD9]);
        out
    }

    fn riff_webp(chunk: &[u8; 4], data: &[u8]) -> Vec<u8> {
        let mut out = b"RIFF".to_vec();
        out.extend_from_slice(&((4 + 8 + data.len()) as u32).to_le_bytes());
        out.extend_from_slice(b"WEBP");
        out.extend_from_slice(chunk);
        out.extend_from_slice(&(data.len() as u32).to_le_bytes());
        out.extend_from_slice(data);
        out
    }

    /// An extended WebP (VP8X) canvas header.
    fn webp_vp8x(w: u32, h: u32) -> Vec<u8> {
        let mut data = vec![0, 0, 0, 0];
        data.extend_from_slice(&(w - 1).to_le_bytes()[..3]);
        data.extend_from_slice(&(h - 1).to_le_bytes()[..3]);
        riff_webp(b"VP8X", &data)
    }

    /// A lossless WebP (VP8L) header: 14 bits of width - 1, 14 of height - 1.
    fn webp_vp8l(w: u32, h: u32) -> Vec<u8> {
        let bits = (w - 1) | ((h - 1) << 14);
        let mut data = vec![0x2F];
        data.extend_from_slice(&bits.to_le_bytes());
        riff_webp(b"VP8L", &data)
    }

    fn iso_box(kind: &[u8; 4], body: &[u8]) -> Vec<u8> {
        let mut out = ((8 + body.len()) as u32).to_be_bytes().to_vec();
        out.extend_from_slice(kind);
        out.extend_from_slice(body);
        out
    }

    /// An ISO-BMFF image file (HEIF family) of `brand`: `ftyp`, then `meta`
    /// holding `hdlr` (pict) and `iprp/ipco/ispe` with the size.
    fn heif(brand: &[u8; 4], w: u32, h: u32) -> Vec<u8> {
        let mut ftyp = brand.to_vec();
        ftyp.extend_from_slice(&[0, 0, 0, 0]);
        ftyp.extend_from_slice(b"mif1");
        ftyp.extend_from_slice(brand);
        let mut hdlr = vec![0; 8];
        hdlr.extend_from_slice(b"pict");
        hdlr.extend_from_slice(&[0; 13]);
        let mut ispe = vec![0; 4];
        ispe.extend_from_slice(&w.to_be_bytes());
        ispe.extend_from_slice(&h.to_be_bytes());
        let ipco = iso_box(b"ipco", &iso_box(b"ispe", &ispe));
        let iprp = iso_box(b"iprp", &ipco);
        let mut meta = vec![0; 4];
        meta.extend_from_slice(&iso_box(b"hdlr", &hdlr));
        meta.extend_from_slice(&iprp);
        let mut out = iso_box(b"ftyp", &ftyp);
        out.extend_from_slice(&iso_box(b"meta", &meta));
        out
    }

    /// A complete little-endian greyscale TIFF of one strip; with `ifd_last`
    /// its IFD follows `pad` bytes after the pixels, as many writers place it.
    fn tiff(w: u16, h: u16, ifd_last: bool, pad: usize) -> Vec<u8> {
        let pixels = usize::from(w) * usize::from(h);
        let entries: [(u16, u16, u32); 9] = [
            (256, 3, u32::from(w)),
            (257, 3, u32::from(h)),
            (258, 3, 8),
            (259, 3, 1),
            (262, 3, 1),
            (273, 4, 0), // the strip's offset, set below
            (277, 3, 1),
            (278, 3, u32::from(h)),
            (279, 4, pixels as u32),
        ];
        let ifd_len = 2 + 12 * entries.len() + 4;
        let (ifd_at, strip_at) = if ifd_last {
            (8 + pixels + pad, 8)
        } else {
            (8, 8 + ifd_len)
        };
        let mut out = b"II*\0".to_vec();
        out.extend_from_slice(&(ifd_at as u32).to_le_bytes());
        let mut ifd = (entries.len() as u16).to_le_bytes().to_vec();
        for (tag, kind, value) in entries {
            let value = if tag == 273 { strip_at as u32 } else { value };
            ifd.extend_from_slice(&tag.to_le_bytes());
            ifd.extend_from_slice(&kind.to_le_bytes());
            ifd.extend_from_slice(&1u32.to_le_bytes());
            ifd.extend_from_slice(&value.to_le_bytes());
        }
        ifd.extend_from_slice(&0u32.to_le_bytes());
        let body = vec![0x80; pixels];
        if ifd_last {
            out.extend_from_slice(&body);
            out.resize(out.len() + pad, 0);
            out.extend_from_slice(&ifd);
        } else {
            out.extend_from_slice(&ifd);
            out.extend_from_slice(&body);
        }
        out
    }

    #[test]
    fn every_common_format_gives_its_size() {
        for (what, bytes, want) in [
            ("png", png(3, 2), (3, 2)),
            ("gif", gif(), (7, 5)),
            ("bmp", bmp(5, 4), (5, 4)),
            ("bmp top-down", bmp(5, -4), (5, 4)),
            ("jpeg", jpeg(640, 480, 0), (640, 480)),
            ("webp vp8x", webp_vp8x(1920, 1080), (1920, 1080)),
            ("webp vp8l", webp_vp8l(300, 200), (300, 200)),
            ("avif", heif(b"avif", 4032, 3024), (4032, 3024)),
            ("heic", heif(b"heic", 800, 600), (800, 600)),
            ("tiff", tiff(6, 3, false, 0), (6, 3)),
        ] {
            let (got, reads) = size_of(bytes);
            assert_eq!(got, Ok(want), "{what}");
            assert_eq!(reads, 1, "{what}: its header is in the first read");
        }
    }

    /// Headers far from the start are found with a few range reads, not by
    /// reading what lies between.
    #[test]
    fn distant_headers_take_a_few_reads() {
        let (got, reads) = size_of(jpeg(1024, 768, 3));
        assert_eq!(got, Ok((1024, 768)));
        assert!(reads <= 5, "{reads} reads over 3 APP1 segments");
        let (got, reads) = size_of(tiff(100, 50, true, 3 << 20));
        assert_eq!(got, Ok((100, 50)));
        assert!(reads <= 3, "{reads} reads for an IFD 3 MiB in");
    }

    #[test]
    fn non_images_are_clear_errors() {
        for bytes in [
            Vec::new(),
            b"hello world, not an image".to_vec(),
            png(3, 2)[..20].to_vec(),
        ] {
            let (got, _) = size_of(bytes);
            let err = got.expect_err("not an image");
            assert!(err.contains("not an image imagesize knows"), "{err}");
        }
    }

    fn valid_images() -> Vec<Vec<u8>> {
        vec![
            png(3, 2),
            gif(),
            bmp(5, 4),
            jpeg(64, 48, 1),
            webp_vp8x(10, 10),
            webp_vp8l(10, 10),
            heif(b"avif", 9, 9),
            heif(b"heic", 9, 9),
            tiff(6, 3, true, 100),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 128,
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        /// Any bytes, and each image format with bytes changed in its first
        /// 64 bytes or cut short: a size or an error within the read bounds.
        #[test]
        fn arbitrary_and_mutated_headers_end_in_bounded_reads(
            which in 0usize..10,
            edits in proptest::collection::vec((0usize..64, any::<u8>()), 0..6),
            cut in proptest::option::of(any::<usize>()),
            noise in proptest::collection::vec(any::<u8>(), 0..256),
        ) {
            let mut bytes = valid_images().into_iter().nth(which).unwrap_or(noise);
            let len = bytes.len();
            for (at, value) in edits {
                if len > 0 {
                    bytes[at % len] = value;
                }
            }
            if let (Some(cut), true) = (cut, len > 0) {
                bytes.truncate(cut % len);
            }
            let (_, reads) = size_of(bytes);
            prop_assert!(reads <= MAX_READS);
        }
    }
}
