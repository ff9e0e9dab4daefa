//! Decoding images written by the `image` crate's encoders, the operations'
//! arithmetic, and hostile bytes: mutated headers of every format and
//! decompression bombs end in an error, in bounded time and memory.

use std::io::Cursor;

use image::{ImageEncoder, RgbImage};
use proptest::prelude::*;

use super::*;

/// A 64x48 RGB gradient with some texture.
fn photo(w: u32, h: u32) -> RgbImage {
    RgbImage::from_fn(w, h, |x, y| {
        image::Rgb([
            (x * 255 / w.max(1)) as u8,
            (y * 255 / h.max(1)) as u8,
            ((x * 7 + y * 13) % 256) as u8,
        ])
    })
}

fn encoded(img: &RgbImage, format: image::ImageFormat) -> Vec<u8> {
    let mut out = Cursor::new(Vec::new());
    image::DynamicImage::ImageRgb8(img.clone())
        .write_to(&mut out, format)
        .expect("encode");
    out.into_inner()
}

#[test]
fn lossless_formats_decode_to_the_pixels_written() {
    let img = photo(64, 48);
    for format in [
        image::ImageFormat::Png,
        image::ImageFormat::Bmp,
        image::ImageFormat::Tiff,
        image::ImageFormat::WebP,
    ] {
        let got = decode(&encoded(&img, format), &DecodeOptions::default()).expect("decode");
        assert_eq!(
            (got.width, got.height, got.mode),
            (64, 48, Mode::Rgb),
            "{format:?}"
        );
        assert_eq!(got.data, img.as_raw().as_slice(), "{format:?}");
    }
}

#[test]
fn a_jpeg_decodes_close_to_its_source_and_a_size_hint_decodes_it_smaller() {
    let img = photo(640, 480);
    let mut jpeg = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, 95)
        .write_image(img.as_raw(), 640, 480, image::ExtendedColorType::Rgb8)
        .expect("jpeg");
    let full = decode(&jpeg, &DecodeOptions::default()).expect("decode");
    assert_eq!((full.width, full.height), (640, 480));
    let mad: f64 = full
        .data
        .iter()
        .zip(img.as_raw())
        .map(|(a, b)| f64::from((i16::from(*a) - i16::from(*b)).unsigned_abs()))
        .sum::<f64>()
        / full.data.len() as f64;
    assert!(mad < 3.0, "mean absolute difference {mad}");
    // A hint of 100: 1/4 scale (160x120) is the smallest with a side >= 100.
    let hint = DecodeOptions {
        max_side: Some(100),
        ..DecodeOptions::default()
    };
    let small = decode(&jpeg, &hint).expect("decode scaled");
    assert_eq!((small.width, small.height), (160, 120));
    // A hint above half the size decodes it whole.
    let hint = DecodeOptions {
        max_side: Some(400),
        ..DecodeOptions::default()
    };
    assert_eq!(decode(&jpeg, &hint).expect("decode").width, 640);
}

#[test]
fn operations_keep_their_arithmetic() {
    let img = decode(
        &encoded(&photo(64, 48), image::ImageFormat::Png),
        &DecodeOptions::default(),
    )
    .expect("decode");
    let small = resize(img.view(), 32, 24, Filter::Bilinear).expect("resize");
    assert_eq!(
        (small.width, small.height, small.data.len()),
        (32, 24, 32 * 24 * 3)
    );
    assert_eq!(fit_size(640, 480, 224), (224, 168));
    assert_eq!(fit_size(100, 50, 224), (100, 50), "never enlarged");
    assert_eq!(fit_size(1, 4000, 10), (1, 10), "a side is at least 1");
    let c = center_crop(img.view(), 10, 8).expect("crop");
    assert_eq!(
        c.data[..3],
        img.data[(20 * 64 + 27) * 3..(20 * 64 + 27) * 3 + 3]
    );
    assert!(
        crop(img.view(), 60, 0, 10, 10).is_err(),
        "outside the image"
    );
    assert!(crop(img.view(), u32::MAX, 0, 2, 2).is_err(), "no overflow");
    assert!(resize(img.view(), 0, 10, Filter::Nearest).is_err());
    let gray = convert(img.view(), Mode::L).expect("L");
    let [r, g, b] = [img.data[0], img.data[1], img.data[2]].map(f64::from);
    let want = (r * 0.299 + g * 0.587 + b * 0.114).round();
    assert!((f64::from(gray.data[0]) - want).abs() <= 1.0);
    let back = convert(gray.view(), Mode::Rgba).expect("RGBA");
    assert_eq!(
        back.data[..4],
        [gray.data[0], gray.data[0], gray.data[0], 255]
    );
    for format in [Format::Png, Format::Jpeg, Format::Webp] {
        let bytes = encode(img.view(), format, Some(90)).expect("encode");
        let again = decode(&bytes, &DecodeOptions::default()).expect("decode again");
        assert_eq!((again.width, again.height), (64, 48), "{format:?}");
    }
}

#[test]
fn an_image_column_round_trips_with_nulls_and_maps_in_parallel() {
    let a = decode(
        &encoded(&photo(8, 6), image::ImageFormat::Png),
        &DecodeOptions::default(),
    )
    .expect("decode");
    let array = Image::to_array([Some(&a), None, Some(&a)]);
    assert!(Image::is_image_type(array.data_type()));
    let views = Image::views(array.as_ref()).expect("views");
    assert!(views[1].is_none());
    assert_eq!(views[2].expect("row 2").data, a.data.as_slice());
    let out = map_column(array.as_ref(), |v| resize(v, 4, 3, Filter::Bicubic)).expect("map");
    let out = Image::views(out.as_ref()).expect("views");
    assert_eq!(out[0].map(|v| (v.width, v.height)), Some((4, 3)));
    assert!(out[1].is_none());
    // The typed codec traces an Image as exactly this layout.
    let traced = crate::engine::trace_field::<Image>("img").expect("trace");
    assert_eq!(traced.data_type(), &Image::data_type());
    let encoded = crate::encode_column(&traced, std::slice::from_ref(&a)).expect("encode");
    let views = Image::views(encoded.as_ref()).expect("views");
    assert_eq!(views[0].expect("row").to_image(), a);
}

/// A PNG claiming `w` x `h` (IHDR), with a tiny IDAT and IEND: valid
/// chunks and CRCs, far fewer pixels than it claims.
#[test]
fn a_decode_spec_gives_the_values_of_its_steps_one_after_another() {
    let rgb = photo(96, 64);
    let gray = image::DynamicImage::ImageRgb8(rgb.clone()).to_luma8();
    let rgba = image::DynamicImage::ImageRgb8(rgb.clone()).to_rgba8();
    let mut files = vec![
        encoded(&rgb, image::ImageFormat::Png),
        encoded(&rgb, image::ImageFormat::Jpeg),
    ];
    for img in [
        image::DynamicImage::ImageLuma8(gray),
        image::DynamicImage::ImageRgba8(rgba),
    ] {
        let mut out = Cursor::new(Vec::new());
        img.write_to(&mut out, image::ImageFormat::Png)
            .expect("png");
        files.push(out.into_inner());
    }
    let resizes = [
        None,
        Some(Resize::To {
            width: 40,
            height: 30,
            filter: Filter::Bilinear,
        }),
        Some(Resize::Fit {
            max_side: 50,
            filter: Filter::Lanczos3,
        }),
    ];
    for (i, bytes) in files.iter().enumerate() {
        for mode in [None, Some(Mode::L), Some(Mode::Rgb), Some(Mode::Rgba)] {
            for resize in resizes {
                let spec = DecodeSpec {
                    mode,
                    resize,
                    ..DecodeSpec::default()
                };
                // The steps as separate calls: decode, convert, resize.
                let natural = decode(bytes, &DecodeOptions::default()).expect("decode");
                let converted = match mode {
                    Some(m) => convert(natural.view(), m).expect("convert"),
                    None => natural,
                };
                let want = match resize {
                    None => converted,
                    Some(Resize::To {
                        width,
                        height,
                        filter,
                    }) => super::resize(converted.view(), width, height, filter).expect("resize"),
                    Some(Resize::Fit { max_side, filter }) => {
                        resize_to_fit(converted.view(), max_side, filter).expect("fit")
                    }
                };
                let got = spec.apply(bytes).expect("spec");
                assert_eq!(got, want, "file {i}, {spec:?}");
                assert_eq!(
                    DecodeSpec::from_name(&spec.name()),
                    Some(spec),
                    "{}",
                    spec.name()
                );
            }
        }
    }
    let thumb = DecodeSpec {
        max_pixels: 1000,
        ..DecodeSpec::thumbnail(128)
    };
    assert_eq!(DecodeSpec::from_name(&thumb.name()), Some(thumb));
    let of_bytes = DecodeSpec {
        input: DecodeInput::Bytes,
        ..thumb
    };
    assert_eq!(DecodeSpec::from_name(&of_bytes.name()), Some(of_bytes));
    assert!(thumb.apply(&files[0]).is_err(), "96x64 is over 1000 pixels");
    for bad in [
        "image_decode[]",
        "image_decode[mode=CMYK]",
        "image_decode[resize=0x10/bilinear]",
        "image_decode[fit=10/box]",
        "image_decode[mode=RGB",
        "image_decoder",
        "image_decode[x=1]",
        "image_decode[input=file]",
    ] {
        assert_eq!(DecodeSpec::from_name(bad), None, "{bad}");
    }
}

fn png_claiming(w: u32, h: u32) -> Vec<u8> {
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&w.to_be_bytes());
    ihdr.extend_from_slice(&h.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    for (kind, body) in [
        (&b"IHDR"[..], ihdr),
        (
            &b"IDAT"[..],
            vec![0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01],
        ),
        (&b"IEND"[..], Vec::new()),
    ] {
        let mut chunk = kind.to_vec();
        chunk.extend_from_slice(&body);
        out.extend_from_slice(&(body.len() as u32).to_be_bytes());
        out.extend_from_slice(&chunk);
        out.extend_from_slice(&crc32fast::hash(&chunk).to_be_bytes());
    }
    out
}

/// A JPEG whose SOF0 claims `w` x `h`, then the rest of a real small JPEG.
fn jpeg_claiming(w: u16, h: u16) -> Vec<u8> {
    let mut jpeg = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, 80)
        .write_image(
            photo(16, 16).as_raw(),
            16,
            16,
            image::ExtendedColorType::Rgb8,
        )
        .expect("jpeg");
    let sof = jpeg
        .windows(2)
        .position(|w| w == [0xFF, 0xC0])
        .expect("a SOF0 marker");
    jpeg[sof + 5..sof + 7].copy_from_slice(&h.to_be_bytes());
    jpeg[sof + 7..sof + 9].copy_from_slice(&w.to_be_bytes());
    jpeg
}

#[test]
fn decompression_bombs_are_refused_before_decoding() {
    let started = std::time::Instant::now();
    let err =
        decode(&png_claiming(100_000, 100_000), &DecodeOptions::default()).expect_err("a PNG bomb");
    assert!(
        matches!(
            err,
            ImageError::TooLarge {
                pixels: 10_000_000_000,
                ..
            }
        ),
        "{err}"
    );
    let err =
        decode(&jpeg_claiming(65_535, 65_535), &DecodeOptions::default()).expect_err("a JPEG bomb");
    assert!(matches!(err, ImageError::TooLarge { .. }), "{err}");
    // Under the limit but lying about its data: zune-jpeg fills the missing
    // blocks (an image of the claimed size, bounded by the limit) or errs.
    let small_limit = DecodeOptions {
        max_pixels: 1 << 20,
        ..DecodeOptions::default()
    };
    if let Ok(img) = decode(&jpeg_claiming(1000, 1000), &small_limit) {
        assert_eq!((img.width, img.height), (1000, 1000));
    }
    assert!(decode(&jpeg_claiming(2000, 2000), &small_limit).is_err());
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
}

#[test]
fn truncated_images_are_errors() {
    let img = photo(64, 48);
    for format in [
        image::ImageFormat::Png,
        image::ImageFormat::Jpeg,
        image::ImageFormat::Gif,
        image::ImageFormat::WebP,
        image::ImageFormat::Bmp,
        image::ImageFormat::Tiff,
    ] {
        let bytes = encoded(&img, format);
        for cut in [0, 8, bytes.len() / 3, bytes.len() - 1] {
            // Either an error or (a format that tolerates a lost tail) a whole image.
            if let Ok(got) = decode(&bytes[..cut], &DecodeOptions::default()) {
                assert_eq!((got.width, got.height), (64, 48), "{format:?} cut at {cut}");
            }
        }
    }
}

/// A small image of each format, encoded once.
fn samples() -> Vec<Vec<u8>> {
    let img = photo(24, 16);
    [
        image::ImageFormat::Png,
        image::ImageFormat::Jpeg,
        image::ImageFormat::Gif,
        image::ImageFormat::WebP,
        image::ImageFormat::Bmp,
        image::ImageFormat::Tiff,
    ]
    .into_iter()
    .map(|f| encoded(&img, f))
    .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    /// Any bytes changed in the first 64 (where every header lives), and a
    /// cut anywhere: an image or an error, never a panic, with a small
    /// pixel limit so that a mutated size cannot allocate much.
    #[test]
    fn decode_never_panics_on_mutated_headers(
        which in 0usize..6,
        edits in proptest::collection::vec((0usize..64, any::<u8>()), 1..6),
        cut in any::<prop::sample::Index>(),
        hint in proptest::option::of(1u32..64),
    ) {
        let mut bytes = samples()[which].clone();
        for (at, v) in edits {
            if at < bytes.len() {
                bytes[at] = v;
            }
        }
        let keep = cut.index(bytes.len() + 1);
        let options = DecodeOptions { max_pixels: 1 << 16, max_side: hint, mode: None };
        if let Ok(img) = decode(&bytes[..keep], &options) {
            prop_assert_eq!(
                img.data.len() as u64,
                u64::from(img.width) * u64::from(img.height) * img.mode.channels() as u64
            );
            prop_assert!(u64::from(img.width) * u64::from(img.height) <= 1 << 16);
        }
    }
}
