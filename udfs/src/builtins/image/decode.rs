//! Decoding stored bytes into an [`Image`]: JPEG, PNG, WebP, GIF (its
//! first frame), BMP and TIFF, by the `image` crate (JPEG by zune-jpeg), with
//! the EXIF orientation applied and the pixels converted to `L`, `RGB` or
//! `RGBA` as Pillow's `convert` does (palettes expanded, alpha dropped for
//! `RGB`; 16-bit channels to 8 as Pillow reads them: gray clipped at 255,
//! others by their high byte).
//!
//! Guarantees, for any bytes (tests: `decode_never_panics_on_mutated_headers`):
//! - the image's size is read from its header first, and one of more than
//!   `max_pixels` pixels (default [`MAX_IMAGE_PIXELS`], Pillow's
//!   `Image.MAX_IMAGE_PIXELS`) is refused before any pixel buffer exists;
//! - the decoders' own allocations are bounded by the same budget
//!   (`image::Limits`, libjpeg's `max_memory_to_use`);
//! - truncated or corrupt input ends in an [`ImageError`], never a panic; a
//!   JPEG cut short (no end-of-image marker after its last scan) is an error
//!   as in Pillow, though its decoders could fill the lost blocks with gray.
//!
//! With a `max_side` hint, a JPEG at least twice as large as the hint is
//! decoded at 1/2, 1/4 or 1/8 of its size in the DCT by libjpeg-turbo
//! (`jpeg_scaled.rs`; libjpeg's `scale_denom`, Pillow's `draft`): the smallest of those
//! whose longer side is still at least `max_side`, so a 224-pixel thumbnail of
//! a 4,000-pixel photo never holds the full image.

use std::io::Cursor;

use image::{DynamicImage, ImageDecoder, ImageFormat, ImageReader, metadata::Orientation};

use super::value::{Image, Mode};

/// Pillow's default `Image.MAX_IMAGE_PIXELS`: larger images are refused.
pub const MAX_IMAGE_PIXELS: u64 = 178_956_970;

/// How to decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeOptions {
    /// The mode to convert to; `None`: `L` for gray images, `RGBA` for those
    /// with alpha, else `RGB`.
    pub mode: Option<Mode>,
    /// The longest side the caller needs: a JPEG may be decoded smaller (see
    /// the module header), never smaller than this.
    pub max_side: Option<u32>,
    /// Images of more pixels are refused.
    pub max_pixels: u64,
}

impl Default for DecodeOptions {
    fn default() -> Self {
        Self {
            mode: None,
            max_side: None,
            max_pixels: MAX_IMAGE_PIXELS,
        }
    }
}

/// Why bytes did not decode.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ImageError {
    /// Not a format this build decodes.
    #[error("not an image of a known format (JPEG, PNG, WebP, GIF, BMP, TIFF): {0}")]
    Unsupported(String),
    /// More pixels than the limit.
    #[error(
        "image of {width}x{height} = {pixels} pixels is over the limit of {limit} \
         (max_image_pixels; a decompression bomb?)"
    )]
    TooLarge {
        /// Pixels across, as the header says.
        width: u32,
        /// Pixels down, as the header says.
        height: u32,
        /// Their product.
        pixels: u64,
        /// The limit it is over.
        limit: u64,
    },
    /// Truncated or corrupt data.
    #[error("corrupt or truncated image: {0}")]
    Corrupt(String),
}

impl From<image::ImageError> for ImageError {
    fn from(e: image::ImageError) -> Self {
        match e {
            image::ImageError::Unsupported(u) => Self::Unsupported(u.to_string()),
            other => Self::Corrupt(other.to_string()),
        }
    }
}

/// The image in `bytes`, as `options` say.
pub fn decode(bytes: &[u8], options: &DecodeOptions) -> Result<Image, ImageError> {
    let format = image::guess_format(bytes).map_err(|e| ImageError::Unsupported(e.to_string()))?;
    if format == ImageFormat::Jpeg && !jpeg_complete(bytes) {
        return Err(ImageError::Corrupt(
            "truncated JPEG: no end-of-image marker after its last scan \
             (Pillow: \"image file is truncated\")"
                .into(),
        ));
    }
    // Decoders may allocate a few buffers of the image's size (16-bit RGBA at most).
    let budget = options
        .max_pixels
        .saturating_mul(8)
        .saturating_add(64 << 20);
    let mut reader = ImageReader::with_format(Cursor::new(bytes), format);
    let mut limits = image::Limits::default();
    limits.max_alloc = Some(budget);
    reader.limits(limits);
    let mut decoder = reader.into_decoder()?;
    let (width, height) = decoder.dimensions();
    let pixels = u64::from(width) * u64::from(height);
    if pixels > options.max_pixels {
        return Err(ImageError::TooLarge {
            width,
            height,
            pixels,
            limit: options.max_pixels,
        });
    }
    let orientation = decoder.orientation().unwrap_or(Orientation::NoTransforms);
    let reduced = match (format, options.max_side) {
        (ImageFormat::Jpeg, Some(side)) if side > 0 && width.max(height) >= side * 2 => {
            jpeg_reduced(bytes, width, height, side, budget)?
        }
        _ => None,
    };
    let mut img = match reduced {
        Some(img) => img,
        None => DynamicImage::from_decoder(decoder)?,
    };
    img.apply_orientation(orientation);
    let mode = options.mode.unwrap_or_else(|| natural_mode(&img));
    Ok(from_dynamic(img, mode))
}

/// Whether a JPEG's last scan is followed by its end-of-image marker. A file
/// cut short lacks it, and both JPEG decoders would fill the blocks it lost
/// with gray rather than fail. The last EOI is found from the end (at the
/// very end in a whole file, so this costs nothing there); a start-of-scan
/// after it means the last image was cut (an EXIF thumbnail's EOI comes
/// before the main scans). Data after a whole image (another image, a
/// trailer) is allowed.
fn jpeg_complete(bytes: &[u8]) -> bool {
    const EOI: [u8; 2] = [0xFF, 0xD9];
    const SOS: [u8; 2] = [0xFF, 0xDA];
    match bytes.windows(2).rposition(|w| w == EOI) {
        Some(eoi) => !bytes[eoi..].windows(2).any(|w| w == SOS),
        None => false,
    }
}

/// `L` for gray images, `RGBA` for those with alpha, else `RGB`.
fn natural_mode(img: &DynamicImage) -> Mode {
    let color = img.color();
    match (color.has_color(), color.has_alpha()) {
        (_, true) => Mode::Rgba,
        (false, false) => Mode::L,
        (true, false) => Mode::Rgb,
    }
}

/// `img` with 8-bit channels as Pillow reads 16-bit images: 16-bit gray
/// (Pillow's `I;16`) clipped to 255 (what its `convert("L")` and
/// `convert("RGB")` do), other 16-bit images by their high byte (Pillow's
/// `;16B` raw modes). Float images convert as the `image` crate does.
fn to_eight_bits(img: DynamicImage) -> DynamicImage {
    use image::{ImageBuffer, Luma, LumaA, Rgb, Rgba};
    let (w, h) = (img.width(), img.height());
    let high = |v: &u16| (v >> 8) as u8;
    match img {
        DynamicImage::ImageLuma16(b) => {
            let data = b.into_raw().iter().map(|&v| v.min(255) as u8).collect();
            ImageBuffer::<Luma<u8>, Vec<u8>>::from_raw(w, h, data)
                .map_or_else(|| DynamicImage::new_luma8(w, h), DynamicImage::ImageLuma8)
        }
        DynamicImage::ImageLumaA16(b) => {
            let data = b.into_raw().iter().map(high).collect();
            ImageBuffer::<LumaA<u8>, Vec<u8>>::from_raw(w, h, data).map_or_else(
                || DynamicImage::new_luma_a8(w, h),
                DynamicImage::ImageLumaA8,
            )
        }
        DynamicImage::ImageRgb16(b) => {
            let data = b.into_raw().iter().map(high).collect();
            ImageBuffer::<Rgb<u8>, Vec<u8>>::from_raw(w, h, data)
                .map_or_else(|| DynamicImage::new_rgb8(w, h), DynamicImage::ImageRgb8)
        }
        DynamicImage::ImageRgba16(b) => {
            let data = b.into_raw().iter().map(high).collect();
            ImageBuffer::<Rgba<u8>, Vec<u8>>::from_raw(w, h, data)
                .map_or_else(|| DynamicImage::new_rgba8(w, h), DynamicImage::ImageRgba8)
        }
        other => other,
    }
}

/// `img`'s pixels in `mode`.
pub(super) fn from_dynamic(img: DynamicImage, mode: Mode) -> Image {
    let img = to_eight_bits(img);
    let (width, height) = (img.width(), img.height());
    let data = match (mode, img) {
        (Mode::L, DynamicImage::ImageLuma8(b)) => b.into_raw(),
        (Mode::Rgb, DynamicImage::ImageRgb8(b)) => b.into_raw(),
        (Mode::Rgba, DynamicImage::ImageRgba8(b)) => b.into_raw(),
        (Mode::L, other) => super::ops::luma_of_rgb(&other.to_rgb8().into_raw()),
        (Mode::Rgb, other) => other.to_rgb8().into_raw(),
        (Mode::Rgba, other) => other.to_rgba8().into_raw(),
    };
    Image {
        width,
        height,
        mode,
        data,
    }
}

/// A JPEG decoded at the smallest DCT scale whose longer side is still at
/// least `side` (by libjpeg-turbo, `jpeg_scaled.rs`); `None` when that is
/// the full size or its pixels are not gray or RGB (CMYK goes through the
/// full decoder, which converts it).
fn jpeg_reduced(
    bytes: &[u8],
    width: u32,
    height: u32,
    side: u32,
    budget: u64,
) -> Result<Option<DynamicImage>, ImageError> {
    let Some(s) = super::jpeg_scaled::decode_scaled(bytes, (width, height), side, budget)
        .map_err(ImageError::Corrupt)?
    else {
        return Ok(None);
    };
    let short =
        || ImageError::Corrupt("the JPEG decoder returned fewer pixels than its size".into());
    Ok(Some(if s.gray {
        DynamicImage::ImageLuma8(
            image::GrayImage::from_raw(s.width, s.height, s.pixels).ok_or_else(short)?,
        )
    } else {
        DynamicImage::ImageRgb8(
            image::RgbImage::from_raw(s.width, s.height, s.pixels).ok_or_else(short)?,
        )
    }))
}
