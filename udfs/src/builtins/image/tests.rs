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

/// `img` as a baseline JPEG of `quality` (the `image` crate's encoder).
fn jpeg_of(img: &RgbImage, quality: u8) -> Vec<u8> {
    let mut out = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, quality)
        .write_image(
            img.as_raw(),
            img.width(),
            img.height(),
            image::ExtendedColorType::Rgb8,
        )
        .expect("jpeg");
    out
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
    let jpeg = jpeg_of(&img, 95);
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
            let got = decode(&bytes[..cut], &DecodeOptions::default());
            if format == image::ImageFormat::Jpeg {
                let err = got.expect_err("a JPEG cut short");
                let says = if cut == 0 {
                    "not an image"
                } else {
                    "truncated"
                };
                assert!(err.to_string().contains(says), "cut at {cut}: {err}");
            } else if let Ok(got) = got {
                // A format that tolerates a lost tail gives a whole image.
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
    /// pixel limit so that a mutated size cannot allocate much. The samples
    /// are 24x16, so a hint of at most 12 takes a JPEG's reduced-size path.
    #[test]
    fn decode_never_panics_on_mutated_headers(
        which in 0usize..6,
        edits in proptest::collection::vec((0usize..64, any::<u8>()), 1..6),
        cut in any::<prop::sample::Index>(),
        hint in proptest::option::of(1u32..16),
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

/// `img` (`channels` a pixel) averaged over `f x f` boxes (a side's last
/// box may be short), as a DCT-scaled decode approximates it.
fn box_average(img: &Image, f: u32) -> Vec<u8> {
    let c = img.mode.channels();
    let (w, h) = (img.width.div_ceil(f), img.height.div_ceil(f));
    let mut out = Vec::with_capacity((w * h) as usize * c);
    for by in 0..h {
        for bx in 0..w {
            for ch in 0..c {
                let (mut sum, mut n) = (0u32, 0u32);
                for y in by * f..((by + 1) * f).min(img.height) {
                    for x in bx * f..((bx + 1) * f).min(img.width) {
                        sum += u32::from(img.data[(y * img.width + x) as usize * c + ch]);
                        n += 1;
                    }
                }
                out.push(((sum + n / 2) / n) as u8);
            }
        }
    }
    out
}

fn mean_abs_diff(a: &[u8], b: &[u8]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(a, b)| f64::from(a.abs_diff(*b)))
        .sum::<f64>()
        / a.len() as f64
}

/// `bytes` decoded whole and with hints for 1/2, 1/4 and 1/8: each reduced
/// decode within `tolerance` (mean absolute difference per channel, 0..255)
/// of the whole one averaged over 2x2, 4x4 or 8x8 boxes. The scaled IDCT
/// keeps a block's low frequencies where a box average keeps its mean, and
/// subsampled chroma is upsampled by another filter (libjpeg's at the
/// reduced size, zune-jpeg's at full size).
fn assert_scaled_decodes_match(bytes: &[u8], mode: Mode, tolerance: f64, what: &str) {
    let full = decode(bytes, &DecodeOptions::default()).expect("full decode");
    assert_eq!(full.mode, mode, "{what}");
    let long = full.width.max(full.height);
    for f in [2, 4, 8] {
        let hint = DecodeOptions {
            max_side: Some(long / f),
            ..DecodeOptions::default()
        };
        let small = decode(bytes, &hint).expect("scaled decode");
        assert_eq!(
            (small.width, small.height, small.mode),
            (full.width.div_ceil(f), full.height.div_ceil(f), mode),
            "{what} at 1/{f}"
        );
        let mad = mean_abs_diff(&small.data, &box_average(&full, f));
        assert!(mad < tolerance, "{what} at 1/{f}: {mad}");
    }
}

/// Tolerances from a measurement (at 1/2, 1/4, 1/8): the `image` crate's
/// baseline RGB (4:4:4) 0.47, 0.44, 0.41; gray 0.16, 0.07, 0.02; mozjpeg's
/// progressive RGB (4:2:0: the upsampling filters differ most at this
/// image's sharp blue edges) 3.12, 1.85, 1.02; progressive gray 0.13, 0.06,
/// 0.03. A wrong channel order or row stride is tens.
#[test]
fn jpeg_scaled_decodes_are_box_averages_of_the_full_decode() {
    let img = photo(640, 480);
    let baseline = jpeg_of(&img, 90);
    assert_scaled_decodes_match(&baseline, Mode::Rgb, 1.0, "baseline RGB");
    let gray = image::DynamicImage::ImageRgb8(img.clone()).to_luma8();
    let mut gray_jpeg = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut gray_jpeg, 90)
        .write_image(gray.as_raw(), 640, 480, image::ExtendedColorType::L8)
        .expect("gray jpeg");
    assert_scaled_decodes_match(&gray_jpeg, Mode::L, 0.5, "gray");
    let progressive = jpeg_scaled::encode_progressive(img.as_raw(), (640, 480), 3, 90);
    assert!(
        progressive.windows(2).any(|m| m == [0xFF, 0xC2]),
        "a progressive frame (SOF2)"
    );
    assert_scaled_decodes_match(&progressive, Mode::Rgb, 4.5, "progressive RGB");
    let progressive_gray = jpeg_scaled::encode_progressive(gray.as_raw(), (640, 480), 1, 90);
    assert_scaled_decodes_match(&progressive_gray, Mode::L, 0.5, "progressive gray");
}

#[test]
fn jpeg_scaled_leaves_cmyk_to_the_full_decoder() {
    let cmyk: Vec<u8> = photo(64, 48)
        .pixels()
        .flat_map(|p| [255 - p[0], 255 - p[1], 255 - p[2], 0])
        .collect();
    let jpeg = jpeg_scaled::encode_progressive(&cmyk, (64, 48), 4, 90);
    let hint = DecodeOptions {
        max_side: Some(8),
        ..DecodeOptions::default()
    };
    let whole = decode(&jpeg, &DecodeOptions::default()).expect("CMYK decodes");
    let hinted = decode(&jpeg, &hint).expect("CMYK decodes with a hint");
    assert_eq!(
        (hinted.width, hinted.height, hinted.mode),
        (64, 48, Mode::Rgb)
    );
    assert_eq!(hinted, whole);
}

/// A truncated JPEG is an error with a size hint as without (both decoders
/// would fill the blocks the file lost with gray: `decode` refuses a JPEG
/// with no end-of-image marker after its last scan first), and a whole one
/// followed by other bytes decodes.
#[test]
fn jpeg_scaled_treats_a_truncated_jpeg_as_the_full_decoder_does() {
    let img = photo(640, 480);
    let jpeg = jpeg_of(&img, 90);
    let progressive = jpeg_scaled::encode_progressive(img.as_raw(), (640, 480), 3, 90);
    let hint = DecodeOptions {
        max_side: Some(100),
        ..DecodeOptions::default()
    };
    for (what, bytes) in [("baseline", &jpeg), ("progressive", &progressive)] {
        let mut cuts = vec![2, 20, 300, bytes.len() - 2, bytes.len() - 1];
        cuts.extend((1..10).map(|k| bytes.len() * k / 10));
        for cut in cuts {
            for options in [&DecodeOptions::default(), &hint] {
                let err = decode(&bytes[..cut], options).expect_err("cut short");
                assert!(
                    matches!(err, ImageError::Corrupt(_) | ImageError::Unsupported(_)),
                    "{what} cut at {cut}: {err}"
                );
            }
        }
        let mut trailer = bytes.clone();
        trailer.extend_from_slice(b"\0\0a trailer after the image");
        let small = decode(&trailer, &hint).expect("a whole JPEG and a trailer");
        assert_eq!((small.width, small.height), (160, 120), "{what}");
        // A second JPEG appended (as in a multi-picture file) cut short
        // makes the file truncated.
        let mut two = bytes.clone();
        two.extend_from_slice(&bytes[..bytes.len() / 2]);
        assert!(
            decode(&two, &hint).is_err(),
            "{what}: its last scan has no end"
        );
    }
}

#[test]
fn jpeg_scaled_decodes_a_jpeg_with_extraneous_bytes_before_a_marker() {
    let img = photo(640, 480);
    let jpeg = jpeg_of(&img, 90);
    let hint = DecodeOptions {
        max_side: Some(100),
        ..DecodeOptions::default()
    };
    let clean = decode(&jpeg, &hint).expect("decode");
    // Junk between the scan's end and EOI (libjpeg warns "extraneous bytes
    // before marker 0xd9"), and between two header segments.
    let eoi = jpeg.len() - 2;
    let mut junk_at_end = jpeg[..eoi].to_vec();
    junk_at_end.extend_from_slice(&[0x12, 0x34, 0x56]);
    junk_at_end.extend_from_slice(&jpeg[eoi..]);
    let sos = jpeg
        .windows(2)
        .position(|m| m == [0xFF, 0xDA])
        .expect("a SOS marker");
    let mut junk_in_header = jpeg[..sos].to_vec();
    junk_in_header.extend_from_slice(&[0x00, 0x42]);
    junk_in_header.extend_from_slice(&jpeg[sos..]);
    for (what, bytes) in [("before EOI", junk_at_end), ("before SOS", junk_in_header)] {
        let got = decode(&bytes, &hint).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(got, clean, "{what}");
        assert!(decode(&bytes, &DecodeOptions::default()).is_ok(), "{what}");
    }
}

#[test]
fn jpeg_scaled_is_bounded_on_hostile_files() {
    let img = photo(640, 480);
    let progressive = jpeg_scaled::encode_progressive(img.as_raw(), (640, 480), 3, 90);
    // The coefficient buffer of a progressive JPEG is held to the budget.
    let got = jpeg_scaled::decode_scaled(&progressive, (640, 480), 100, 100_000);
    assert!(
        got.is_err(),
        "over the budget: {:?}",
        got.map(|s| s.is_some())
    );
    assert!(
        jpeg_scaled::decode_scaled(&progressive, (640, 480), 100, 8 << 20)
            .expect("within the budget")
            .is_some()
    );
    // The last scan repeated past MAX_SCANS: refused, quickly.
    let last_sos = progressive
        .windows(2)
        .rposition(|m| m == [0xFF, 0xDA])
        .expect("a SOS marker");
    let eoi = progressive.len() - 2;
    let mut many = progressive[..eoi].to_vec();
    for _ in 0..=jpeg_scaled::MAX_SCANS {
        many.extend_from_slice(&progressive[last_sos..eoi]);
    }
    many.extend_from_slice(&progressive[eoi..]);
    let started = std::time::Instant::now();
    let got = jpeg_scaled::decode_scaled(&many, (640, 480), 100, 1 << 30);
    assert!(
        got.as_ref().is_err_and(|e| e.contains("scans")),
        "too many scans: {:?}",
        got.map(|s| s.map(|s| (s.width, s.height)))
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    // Libjpeg reading another size than the caller did: the full decoder decides.
    assert!(
        jpeg_scaled::decode_scaled(&progressive, (641, 480), 100, 1 << 30)
            .expect("no error")
            .is_none()
    );
    // Empty and header-only input: libjpeg's errors, not a panic.
    for cut in [0, 2, 100] {
        assert!(jpeg_scaled::decode_scaled(&progressive[..cut], (640, 480), 100, 1 << 30).is_err());
    }
}

/// Small JPEGs the size-hinted path decodes: baseline RGB, gray and
/// progressive, 64x48 (a hint of at most 24 takes the reduced path).
fn jpeg_samples() -> Vec<Vec<u8>> {
    let img = photo(64, 48);
    let gray = image::DynamicImage::ImageRgb8(img.clone()).to_luma8();
    let rgb = jpeg_of(&img, 80);
    let mut l = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut l, 80)
        .write_image(gray.as_raw(), 64, 48, image::ExtendedColorType::L8)
        .expect("gray jpeg");
    vec![
        rgb,
        l,
        jpeg_scaled::encode_progressive(img.as_raw(), (64, 48), 3, 80),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    /// The size-hinted JPEG path (libjpeg-turbo) on JPEGs with bytes changed
    /// anywhere (markers, tables, scans) and a cut anywhere: an image or an
    /// error, never a panic, within the pixel limit.
    #[test]
    fn jpeg_scaled_never_panics_on_mutated_jpegs(
        which in 0usize..3,
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
        hint in 1u32..=24,
    ) {
        let mut bytes = jpeg_samples()[which].clone();
        for (at, v) in edits {
            let at = at.index(bytes.len());
            bytes[at] = v;
        }
        let keep = cut.index(bytes.len() + 1);
        let options = DecodeOptions { max_pixels: 1 << 16, max_side: Some(hint), mode: None };
        if let Ok(img) = decode(&bytes[..keep], &options) {
            prop_assert_eq!(
                img.data.len() as u64,
                u64::from(img.width) * u64::from(img.height) * img.mode.channels() as u64
            );
            prop_assert!(u64::from(img.width) * u64::from(img.height) <= 1 << 16);
        }
    }
}
