//! [`Image`]: a decoded image as a value of the engine, and its Arrow layout.
//!
//! The layout (stable, documented in docs/images.md, read by pyarrow as it
//! is): a struct of
//! - `width: uint32`, `height: uint32` (not null),
//! - `mode: utf8` (not null): `"L"` (one channel), `"RGB"` or `"RGBA"`,
//! - `data: binary` (not null): `height * width * channels` bytes, rows top
//!   to bottom, pixels left to right, channels interleaved (H x W x C, uint8)
//!   — a numpy array `(height, width, channels)` over the same bytes.
//!
//! Guarantees: [`Image::new`] and every reader of the layout check that the
//! buffer holds exactly `height * width * channels` bytes, so no operation
//! indexes past a pixel buffer.

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, BinaryArray, BinaryBuilder, StringArray, StringBuilder, StructArray,
    UInt32Array, UInt32Builder,
};
use datafusion::arrow::buffer::NullBuffer;
use datafusion::arrow::datatypes::{DataType, Field, Fields};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::UdfError;

/// Pixel layout of an [`Image`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Mode {
    /// 8-bit gray.
    L,
    /// 8-bit red, green, blue.
    #[serde(rename = "RGB")]
    Rgb,
    /// 8-bit red, green, blue, alpha.
    #[serde(rename = "RGBA")]
    Rgba,
}

impl Mode {
    /// Channels per pixel.
    pub fn channels(self) -> usize {
        match self {
            Self::L => 1,
            Self::Rgb => 3,
            Self::Rgba => 4,
        }
    }

    /// `"L"`, `"RGB"` or `"RGBA"` (Pillow's names).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::L => "L",
            Self::Rgb => "RGB",
            Self::Rgba => "RGBA",
        }
    }

    /// The mode named `s` (case-insensitive).
    pub fn parse(s: &str) -> Result<Self, UdfError> {
        match s.to_ascii_uppercase().as_str() {
            "L" => Ok(Self::L),
            "RGB" => Ok(Self::Rgb),
            "RGBA" => Ok(Self::Rgba),
            _ => Err(UdfError::Contract(format!(
                "image mode {s:?}: expected 'L', 'RGB' or 'RGBA'"
            ))),
        }
    }
}

/// A decoded image: `height` rows of `width` pixels of `mode`, 8 bits a channel.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Image {
    /// Pixels across.
    pub width: u32,
    /// Pixels down.
    pub height: u32,
    /// The pixel layout.
    pub mode: Mode,
    /// `height * width * channels` bytes, H x W x C.
    #[serde(serialize_with = "as_bytes", deserialize_with = "from_bytes")]
    pub data: Vec<u8>,
}

impl std::fmt::Debug for Image {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Image({}x{} {}, {} bytes)",
            self.width,
            self.height,
            self.mode.as_str(),
            self.data.len()
        )
    }
}

fn as_bytes<S: Serializer>(data: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_bytes(data)
}

fn from_bytes<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    struct Bytes;
    impl<'de> serde::de::Visitor<'de> for Bytes {
        type Value = Vec<u8>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("bytes")
        }
        fn visit_bytes<E>(self, v: &[u8]) -> Result<Vec<u8>, E> {
            Ok(v.to_vec())
        }
        fn visit_byte_buf<E>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
            Ok(v)
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
            let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0));
            while let Some(b) = seq.next_element()? {
                out.push(b);
            }
            Ok(out)
        }
    }
    d.deserialize_byte_buf(Bytes)
}

/// The bytes `width x height` pixels of `mode` take, if that fits in memory's addresses.
pub fn buffer_len(width: u32, height: u32, mode: Mode) -> Option<usize> {
    (width as usize)
        .checked_mul(height as usize)?
        .checked_mul(mode.channels())
}

impl Image {
    /// An image over `data`, which must hold exactly `width * height * channels` bytes.
    pub fn new(width: u32, height: u32, mode: Mode, data: Vec<u8>) -> Result<Self, UdfError> {
        check_len(width, height, mode, data.len())?;
        Ok(Self {
            width,
            height,
            mode,
            data,
        })
    }

    /// The Arrow type of an image column (see the module header).
    pub fn data_type() -> DataType {
        DataType::Struct(Self::fields())
    }

    fn fields() -> Fields {
        Fields::from(vec![
            Field::new("width", DataType::UInt32, false),
            Field::new("height", DataType::UInt32, false),
            Field::new("mode", DataType::Utf8, false),
            Field::new("data", DataType::Binary, false),
        ])
    }

    /// Whether `dt` is an image column's type.
    pub fn is_image_type(dt: &DataType) -> bool {
        *dt == Self::data_type()
    }

    /// Whether `dt` is a struct with the image's field names (what tracing
    /// a Rust `Image` gives before its exact types are put in).
    pub fn is_image_shaped(dt: &DataType) -> bool {
        match dt {
            DataType::Struct(fields) => {
                fields.iter().map(|f| f.name().as_str()).collect::<Vec<_>>()
                    == ["width", "height", "mode", "data"]
            }
            _ => false,
        }
    }

    /// One image column of `images` (`None`: a null row).
    pub fn to_array<'a>(images: impl IntoIterator<Item = Option<&'a Image>>) -> ArrayRef {
        let images: Vec<Option<&Image>> = images.into_iter().collect();
        let bytes: usize = images.iter().flatten().map(|i| i.data.len()).sum();
        let mut w = UInt32Builder::with_capacity(images.len());
        let mut h = UInt32Builder::with_capacity(images.len());
        let mut m = StringBuilder::with_capacity(images.len(), images.len() * 4);
        let mut d = BinaryBuilder::with_capacity(images.len(), bytes);
        for img in &images {
            match img {
                Some(i) => {
                    w.append_value(i.width);
                    h.append_value(i.height);
                    m.append_value(i.mode.as_str());
                    d.append_value(&i.data);
                }
                None => {
                    w.append_value(0);
                    h.append_value(0);
                    m.append_value("L");
                    d.append_value([]);
                }
            }
        }
        let nulls = NullBuffer::from(images.iter().map(Option::is_some).collect::<Vec<_>>());
        let columns: Vec<ArrayRef> = vec![
            Arc::new(w.finish()),
            Arc::new(h.finish()),
            Arc::new(m.finish()),
            Arc::new(d.finish()),
        ];
        Arc::new(StructArray::new(
            Self::fields(),
            columns,
            (nulls.null_count() > 0).then_some(nulls),
        ))
    }

    /// The images of an image column, borrowed (`None`: a null row); an
    /// error naming the row when a row's buffer does not fit its size.
    pub fn views(array: &dyn Array) -> Result<Vec<Option<ImageView<'_>>>, UdfError> {
        let bad = |what: &str| UdfError::Convert {
            what: "an image column".into(),
            message: what.to_string(),
        };
        let s = array
            .as_any()
            .downcast_ref::<StructArray>()
            .filter(|s| Self::is_image_type(s.data_type()))
            .ok_or_else(|| {
                bad(&format!(
                    "expected {}, got {}",
                    Self::data_type(),
                    array.data_type()
                ))
            })?;
        let col = |i: usize| s.column(i).as_any();
        let (Some(w), Some(h), Some(m), Some(d)) = (
            col(0).downcast_ref::<UInt32Array>(),
            col(1).downcast_ref::<UInt32Array>(),
            col(2).downcast_ref::<StringArray>(),
            col(3).downcast_ref::<BinaryArray>(),
        ) else {
            return Err(bad("its fields are not of the image's types"));
        };
        (0..s.len())
            .map(|r| {
                if s.is_null(r) {
                    return Ok(None);
                }
                let mode = Mode::parse(m.value(r))?;
                let data = d.value(r);
                check_len(w.value(r), h.value(r), mode, data.len())
                    .map_err(|e| bad(&format!("row {r}: {e}")))?;
                Ok(Some(ImageView {
                    width: w.value(r),
                    height: h.value(r),
                    mode,
                    data,
                }))
            })
            .collect()
    }
}

fn check_len(width: u32, height: u32, mode: Mode, len: usize) -> Result<(), UdfError> {
    match buffer_len(width, height, mode) {
        Some(n) if n == len => Ok(()),
        want => Err(UdfError::Contract(format!(
            "a {width}x{height} {} image holds {} bytes, not {len}",
            mode.as_str(),
            want.map(|n| n.to_string())
                .unwrap_or_else(|| "too many".into())
        ))),
    }
}

/// An image borrowed from an Arrow column.
#[derive(Debug, Clone, Copy)]
pub struct ImageView<'a> {
    /// Pixels across.
    pub width: u32,
    /// Pixels down.
    pub height: u32,
    /// The pixel layout.
    pub mode: Mode,
    /// H x W x C bytes.
    pub data: &'a [u8],
}

impl ImageView<'_> {
    /// An owned copy.
    pub fn to_image(&self) -> Image {
        Image {
            width: self.width,
            height: self.height,
            mode: self.mode,
            data: self.data.to_vec(),
        }
    }
}

impl Image {
    /// This image, borrowed.
    pub fn view(&self) -> ImageView<'_> {
        ImageView {
            width: self.width,
            height: self.height,
            mode: self.mode,
            data: &self.data,
        }
    }
}
