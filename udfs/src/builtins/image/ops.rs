//! Operations on images: resize (nearest, bilinear, bicubic, lanczos3 by
//! `fast_image_resize`'s SIMD convolutions, alpha not premultiplied, as
//! Pillow), resize to fit, crop, center crop, mode conversion (Pillow's
//! formulas) and encoding (JPEG with a quality, PNG, lossless WebP).
//!
//! Guarantees: every operation checks its arguments against the image (a
//! crop box inside it, sizes above zero and at most [`MAX_SIDE`] a side)
//! and returns an error naming what is wrong, never a panic; none reads
//! past the image's buffer (`Image` checks its length).

use fast_image_resize::images::{Image as Pixels, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};
use image::ImageEncoder;

use super::value::{Image, ImageView, Mode};
use crate::error::UdfError;

/// The largest side an operation makes (the JPEG format's own limit).
pub const MAX_SIDE: u32 = 65_535;

/// A resampling filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Filter {
    /// The nearest pixel.
    Nearest,
    /// Linear interpolation (a triangle filter widened when shrinking).
    Bilinear,
    /// Cubic convolution, a = -0.5 (Catmull-Rom, Pillow's BICUBIC).
    Bicubic,
    /// Lanczos, 3 lobes (Pillow's LANCZOS).
    Lanczos3,
}

impl Filter {
    /// The filter named `s`: `nearest`, `bilinear`, `bicubic`, `lanczos3` (or `lanczos`).
    pub fn parse(s: &str) -> Result<Self, UdfError> {
        match s.to_ascii_lowercase().as_str() {
            "nearest" => Ok(Self::Nearest),
            "bilinear" | "linear" => Ok(Self::Bilinear),
            "bicubic" | "cubic" => Ok(Self::Bicubic),
            "lanczos3" | "lanczos" => Ok(Self::Lanczos3),
            _ => Err(UdfError::Contract(format!(
                "resize filter {s:?}: expected nearest, bilinear, bicubic or lanczos3"
            ))),
        }
    }

    /// Its name as [`Filter::parse`] reads it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Nearest => "nearest",
            Self::Bilinear => "bilinear",
            Self::Bicubic => "bicubic",
            Self::Lanczos3 => "lanczos3",
        }
    }

    fn algorithm(self) -> ResizeAlg {
        match self {
            Self::Nearest => ResizeAlg::Nearest,
            Self::Bilinear => ResizeAlg::Convolution(FilterType::Bilinear),
            Self::Bicubic => ResizeAlg::Convolution(FilterType::CatmullRom),
            Self::Lanczos3 => ResizeAlg::Convolution(FilterType::Lanczos3),
        }
    }
}

fn pixel_type(mode: Mode) -> PixelType {
    match mode {
        Mode::L => PixelType::U8,
        Mode::Rgb => PixelType::U8x3,
        Mode::Rgba => PixelType::U8x4,
    }
}

fn check_side(what: &str, v: u32) -> Result<(), UdfError> {
    if v == 0 || v > MAX_SIDE {
        return Err(UdfError::Contract(format!(
            "{what} {v}: expected 1 to {MAX_SIDE} pixels"
        )));
    }
    Ok(())
}

/// `img` resampled to `width` x `height` with `filter`.
pub fn resize(
    img: ImageView<'_>,
    width: u32,
    height: u32,
    filter: Filter,
) -> Result<Image, UdfError> {
    check_side("resize width", width)?;
    check_side("resize height", height)?;
    if img.width == 0 || img.height == 0 {
        return Err(UdfError::Contract("cannot resize an empty image".into()));
    }
    if (img.width, img.height) == (width, height) {
        return Ok(img.to_image());
    }
    let fail = |e: &dyn std::fmt::Display| UdfError::Contract(format!("resize: {e}"));
    let src = ImageRef::new(img.width, img.height, img.data, pixel_type(img.mode))
        .map_err(|e| fail(&e))?;
    let mut dst = Pixels::new(width, height, pixel_type(img.mode));
    let options = ResizeOptions::new()
        .resize_alg(filter.algorithm())
        .use_alpha(false);
    Resizer::new()
        .resize(&src, &mut dst, &options)
        .map_err(|e| fail(&e))?;
    Image::new(width, height, img.mode, dst.into_vec())
}

/// The size of `img` scaled so that its longer side is `max_side` (the
/// image's own size when it is no larger), the shorter side rounded, at least 1.
pub fn fit_size(width: u32, height: u32, max_side: u32) -> (u32, u32) {
    let long = width.max(height);
    if long <= max_side || long == 0 {
        return (width, height);
    }
    let scale = |d: u32| -> u32 {
        let v = (u64::from(d) * u64::from(max_side) + u64::from(long) / 2) / u64::from(long);
        v.clamp(1, u64::from(max_side)) as u32
    };
    (scale(width), scale(height))
}

/// `img` shrunk to fit `max_side` (never enlarged), with `filter`.
pub fn resize_to_fit(img: ImageView<'_>, max_side: u32, filter: Filter) -> Result<Image, UdfError> {
    check_side("max_side", max_side)?;
    let (w, h) = fit_size(img.width, img.height, max_side);
    resize(img, w, h, filter)
}

/// The `width` x `height` box of `img` whose top-left pixel is (`x`, `y`).
pub fn crop(
    img: ImageView<'_>,
    x: u32,
    y: u32,
    width: u32,
    height: u32,
) -> Result<Image, UdfError> {
    let inside = x
        .checked_add(width)
        .zip(y.checked_add(height))
        .is_some_and(|(r, b)| r <= img.width && b <= img.height);
    if width == 0 || height == 0 || !inside {
        return Err(UdfError::Contract(format!(
            "crop box {width}x{height} at ({x}, {y}) is not inside the {}x{} image",
            img.width, img.height
        )));
    }
    let c = img.mode.channels();
    let row = img.width as usize * c;
    let mut data = Vec::with_capacity(width as usize * height as usize * c);
    for r in y as usize..(y + height) as usize {
        let start = r * row + x as usize * c;
        data.extend_from_slice(&img.data[start..start + width as usize * c]);
    }
    Image::new(width, height, img.mode, data)
}

/// The `width` x `height` box at the center of `img` (torchvision's
/// `CenterCrop`, the offsets rounded down); an error when the image is smaller.
pub fn center_crop(img: ImageView<'_>, width: u32, height: u32) -> Result<Image, UdfError> {
    if width > img.width || height > img.height {
        return Err(UdfError::Contract(format!(
            "center crop {width}x{height} is larger than the {}x{} image",
            img.width, img.height
        )));
    }
    crop(
        img,
        (img.width - width) / 2,
        (img.height - height) / 2,
        width,
        height,
    )
}

/// Pillow's luma of RGB pixels: `L = R * 299/1000 + G * 587/1000 + B * 114/1000`.
pub(super) fn luma_of_rgb(rgb: &[u8]) -> Vec<u8> {
    rgb.chunks_exact(3)
        .map(|p| {
            let v = u32::from(p[0]) * 19595 + u32::from(p[1]) * 38470 + u32::from(p[2]) * 7471;
            ((v + 0x8000) >> 16) as u8
        })
        .collect()
}

/// `img` in `mode`: gray replicated to RGB, alpha 255 added, alpha dropped,
/// or Pillow's luma.
pub fn convert(img: ImageView<'_>, mode: Mode) -> Result<Image, UdfError> {
    let data = match (img.mode, mode) {
        (Mode::L, Mode::L) | (Mode::Rgb, Mode::Rgb) | (Mode::Rgba, Mode::Rgba) => img.data.to_vec(),
        (Mode::L, Mode::Rgb) => img.data.iter().flat_map(|&v| [v, v, v]).collect(),
        (Mode::L, Mode::Rgba) => img.data.iter().flat_map(|&v| [v, v, v, 255]).collect(),
        (Mode::Rgb, Mode::Rgba) => img
            .data
            .chunks_exact(3)
            .flat_map(|p| [p[0], p[1], p[2], 255])
            .collect(),
        (Mode::Rgba, Mode::Rgb) => img
            .data
            .chunks_exact(4)
            .flat_map(|p| [p[0], p[1], p[2]])
            .collect(),
        (Mode::Rgb, Mode::L) => luma_of_rgb(img.data),
        (Mode::Rgba, Mode::L) => {
            let rgb: Vec<u8> = img
                .data
                .chunks_exact(4)
                .flat_map(|p| [p[0], p[1], p[2]])
                .collect();
            luma_of_rgb(&rgb)
        }
    };
    Image::new(img.width, img.height, mode, data)
}

/// An encoded file format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// JPEG (of `L` or `RGB`; `RGBA` loses its alpha), with a quality 1..=100.
    Jpeg,
    /// PNG, lossless.
    Png,
    /// WebP, lossless (the encoder this build has).
    Webp,
}

impl Format {
    /// The format named `s`: `jpeg` (`jpg`), `png` or `webp`.
    pub fn parse(s: &str) -> Result<Self, UdfError> {
        match s.to_ascii_lowercase().as_str() {
            "jpeg" | "jpg" => Ok(Self::Jpeg),
            "png" => Ok(Self::Png),
            "webp" => Ok(Self::Webp),
            _ => Err(UdfError::Contract(format!(
                "image format {s:?}: expected jpeg, png or webp"
            ))),
        }
    }
}

/// `img` encoded as `format` (`quality` for JPEG, default 75 as Pillow's).
pub fn encode(
    img: ImageView<'_>,
    format: Format,
    quality: Option<u8>,
) -> Result<Vec<u8>, UdfError> {
    let fail = |e: image::ImageError| UdfError::Contract(format!("encoding an image: {e}"));
    let mut out = Vec::new();
    let color = |m: Mode| match m {
        Mode::L => image::ExtendedColorType::L8,
        Mode::Rgb => image::ExtendedColorType::Rgb8,
        Mode::Rgba => image::ExtendedColorType::Rgba8,
    };
    match format {
        Format::Jpeg => {
            let q = quality.unwrap_or(75).clamp(1, 100);
            let rgb;
            let img = if img.mode == Mode::Rgba {
                rgb = convert(img, Mode::Rgb)?;
                rgb.view()
            } else {
                img
            };
            image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, q)
                .write_image(img.data, img.width, img.height, color(img.mode))
                .map_err(fail)?;
        }
        Format::Png => image::codecs::png::PngEncoder::new(&mut out)
            .write_image(img.data, img.width, img.height, color(img.mode))
            .map_err(fail)?,
        Format::Webp => {
            let rgb;
            let img = if img.mode == Mode::L {
                rgb = convert(img, Mode::Rgb)?;
                rgb.view()
            } else {
                img
            };
            image::codecs::webp::WebPEncoder::new_lossless(&mut out)
                .write_image(img.data, img.width, img.height, color(img.mode))
                .map_err(fail)?
        }
    }
    Ok(out)
}
