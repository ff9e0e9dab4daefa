//! The SQL built-ins `image_decode(file | bytes [, mode [, max_side]])` and
//! `image_thumbnail(file, max_side)`, and a decode fused with the resize
//! after it, as one map UDF over a batch: the rows' files are read (from
//! their prefetched copies) one after another, or their bytes taken from a
//! binary column as they are, then decoded (and resized) data-parallel on rayon's pool,
//! so one call keeps every core busy and a full-size image never leaves the
//! worker that decoded it. A per-row typed function (`udfs::map_fn(..,
//! image_decode)`) decodes the rows of a call one after another, and calls
//! come `parallel` at a time in runs of rows: for a kernel of a few
//! milliseconds a run at a time left cores idle.
//!
//! Guarantees: each row's outcome is its own (a file that does not read or
//! decode is that row's error, naming the file; a null file is an error, a
//! null binary value a null image);
//! the values are exactly those of decoding the same bytes, converting to the
//! spec's mode and resizing with the image functions one after another
//! ([`DecodeSpec`] says which); a UDF's name is its spec's [`DecodeSpec::name`],
//! which [`DecodeSpec::from_name`] reads back (a cluster executor rebuilds
//! the node from it).

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::DataType;
use rayon::prelude::*;

use super::{
    DecodeOptions, Filter, Image, MAX_IMAGE_PIXELS, MAX_SIDE, Mode, blocking, decode, image_decode,
    resize, resize_to_fit,
};
use crate::codec::decode_rows;
use crate::error::{BoxError, CallError, UdfError};
use crate::file::File;
use crate::signature::Signature;
use crate::udf::{EachRow, Mapper, map_fn};

/// Where a decode node's encoded images come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum DecodeInput {
    /// A File column: each row's object is read (its prefetched copy).
    #[default]
    File,
    /// A binary column holding the encoded images themselves.
    Bytes,
}

/// What a decode node makes of each stored image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DecodeSpec {
    /// What the node reads: files, or bytes.
    pub input: DecodeInput,
    /// The mode to convert to; `None`: the image's natural mode.
    pub mode: Option<Mode>,
    /// The longest side needed: a JPEG may be decoded at reduced size in
    /// the DCT (see [`DecodeOptions::max_side`]). Set by a thumbnail and by
    /// `image_decode`'s `max_side`: it changes pixels.
    pub draft: Option<u32>,
    /// The resize after decoding.
    pub resize: Option<Resize>,
    /// Images of more pixels are refused (the `max_image_pixels` setting).
    pub max_pixels: u64,
}

/// A resize fused into a decode: `image_resize` or `image_resize_to_fit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Resize {
    /// To exactly `width` x `height`.
    To {
        /// Pixels across.
        width: u32,
        /// Pixels down.
        height: u32,
        /// The resampling filter.
        filter: Filter,
    },
    /// The longer side to at most `max_side`, aspect kept.
    Fit {
        /// The longest side.
        max_side: u32,
        /// The resampling filter.
        filter: Filter,
    },
}

impl Default for DecodeSpec {
    fn default() -> Self {
        Self {
            input: DecodeInput::File,
            mode: None,
            draft: None,
            resize: None,
            max_pixels: MAX_IMAGE_PIXELS,
        }
    }
}

impl DecodeSpec {
    /// `image_decode(file [, mode])`.
    pub fn decode(mode: Option<Mode>) -> Self {
        Self {
            mode,
            ..Self::default()
        }
    }

    /// `image_thumbnail(file, max_side)`: RGB, drafted, fit with bicubic.
    pub fn thumbnail(max_side: u32) -> Self {
        Self {
            mode: Some(Mode::Rgb),
            draft: Some(max_side),
            resize: Some(Resize::Fit {
                max_side,
                filter: Filter::Bicubic,
            }),
            ..Self::default()
        }
    }

    /// The UDF's name: `image_decode`, then the spec's non-default parts in
    /// brackets, e.g. `image_decode[mode=RGB,resize=224x224/bilinear]`.
    pub fn name(&self) -> String {
        let mut parts = Vec::new();
        if self.input == DecodeInput::Bytes {
            parts.push("input=bytes".to_string());
        }
        if let Some(m) = self.mode {
            parts.push(format!("mode={}", m.as_str()));
        }
        if let Some(d) = self.draft {
            parts.push(format!("draft={d}"));
        }
        match self.resize {
            Some(Resize::To {
                width,
                height,
                filter,
            }) => parts.push(format!("resize={width}x{height}/{}", filter.as_str())),
            Some(Resize::Fit { max_side, filter }) => {
                parts.push(format!("fit={max_side}/{}", filter.as_str()));
            }
            None => {}
        }
        if self.max_pixels != MAX_IMAGE_PIXELS {
            parts.push(format!("max_pixels={}", self.max_pixels));
        }
        if parts.is_empty() {
            "image_decode".to_string()
        } else {
            format!("image_decode[{}]", parts.join(","))
        }
    }

    /// The spec [`Self::name`] wrote; `None` for any other text.
    pub fn from_name(name: &str) -> Option<Self> {
        let mut spec = Self::default();
        if name == "image_decode" {
            return Some(spec);
        }
        let inner = name.strip_prefix("image_decode[")?.strip_suffix(']')?;
        let side = |v: &str| v.parse::<u32>().ok().filter(|n| (1..=MAX_SIDE).contains(n));
        let filtered = |v: &str| -> Option<(String, Filter)> {
            let (a, f) = v.split_once('/')?;
            Some((a.to_string(), Filter::parse(f).ok()?))
        };
        for part in inner.split(',') {
            let (key, value) = part.split_once('=')?;
            match key {
                "input" if value == "bytes" => spec.input = DecodeInput::Bytes,
                "mode" => spec.mode = Some(Mode::parse(value).ok()?),
                "draft" => spec.draft = Some(side(value)?),
                "resize" => {
                    let (size, filter) = filtered(value)?;
                    let (w, h) = size.split_once('x')?;
                    spec.resize = Some(Resize::To {
                        width: side(w)?,
                        height: side(h)?,
                        filter,
                    });
                }
                "fit" => {
                    let (max_side, filter) = filtered(value)?;
                    spec.resize = Some(Resize::Fit {
                        max_side: side(&max_side)?,
                        filter,
                    });
                }
                "max_pixels" => spec.max_pixels = value.parse().ok()?,
                _ => return None,
            }
        }
        Some(spec)
    }

    /// One image from its bytes, as this spec says.
    pub fn apply(&self, bytes: &[u8]) -> Result<Image, super::ImageError> {
        let options = DecodeOptions {
            mode: self.mode,
            max_side: self.draft,
            max_pixels: self.max_pixels,
        };
        let img = decode(bytes, &options)?;
        let resized = match self.resize {
            None => return Ok(img),
            Some(Resize::To {
                width,
                height,
                filter,
            }) => resize(img.view(), width, height, filter),
            Some(Resize::Fit { max_side, filter }) => resize_to_fit(img.view(), max_side, filter),
        };
        resized.map_err(|e| super::ImageError::Corrupt(e.to_string()))
    }
    /// The image in `file`'s `bytes`, as this spec says; an error names the file.
    pub fn apply_to(&self, file: &File, bytes: &[u8]) -> Result<Image, UdfError> {
        self.apply(bytes).map_err(|e| UdfError::Read {
            url: file.url(),
            source: Box::new(e),
        })
    }
}

/// The decode UDF of `spec`, reading column `param`, writing `output`.
pub fn decode_udf(
    param: &str,
    output: &str,
    spec: DecodeSpec,
) -> Result<Arc<dyn Mapper>, UdfError> {
    // The signature a typed UDF of the same function would have, named by the spec.
    let mut signature = map_fn(&[param], output, image_decode)?.signature().clone();
    signature.name = spec.name();
    if spec.input == DecodeInput::Bytes {
        signature.input = Some(DataType::Binary);
        signature.output = signature.output.with_nullable(true);
    }
    Ok(Arc::new(DecodeUdf { signature, spec }))
}

#[derive(Debug)]
struct DecodeUdf {
    signature: Signature,
    spec: DecodeSpec,
}

#[async_trait]
impl Mapper for DecodeUdf {
    fn signature(&self) -> &Signature {
        &self.signature
    }

    async fn map(&self, input: RecordBatch) -> Result<ArrayRef, CallError> {
        let each = self.map_each(input, true).await?;
        for (row, outcome) in each.outcomes.into_iter().enumerate() {
            if let Err(e) = outcome {
                return Err(CallError::at_row(row, e.source));
            }
        }
        Ok(each.values)
    }

    async fn map_each(
        &self,
        input: RecordBatch,
        stop_at_error: bool,
    ) -> Result<EachRow, CallError> {
        let decoded = match self.spec.input {
            DecodeInput::File => self.decode_files(&input, stop_at_error).await?,
            DecodeInput::Bytes => self.decode_bytes(&input)?,
        };
        let mut values = Vec::with_capacity(decoded.len());
        let mut outcomes = Vec::with_capacity(decoded.len());
        for d in decoded {
            let stop = d.is_err() && stop_at_error;
            match d {
                Ok(img) => {
                    values.push(img);
                    outcomes.push(Ok(()));
                }
                Err(e) => outcomes.push(Err(CallError::whole(e))),
            }
            if stop {
                break;
            }
        }
        let values = Image::to_array(values.iter().map(Option::as_ref));
        Ok(EachRow { values, outcomes })
    }
}

/// One row's decoded image (`None`: a null binary value), or its error.
type Decoded = Result<Option<Image>, BoxError>;

impl DecodeUdf {
    /// The images of the batch's files: read one after another (from their
    /// prefetched copies), then decoded data-parallel; stops after the
    /// first file that does not read when `stop_at_error`.
    async fn decode_files(
        &self,
        input: &RecordBatch,
        stop_at_error: bool,
    ) -> Result<Vec<Decoded>, CallError> {
        let files: Vec<Option<File>> = decode_rows(input, &self.signature.params)?;
        let mut read = Vec::with_capacity(files.len());
        for file in &files {
            let bytes = match file {
                Some(f) => f.read().await.map(|b| (f, b)),
                None => Err(UdfError::Contract("a null file".into())),
            };
            let failed = bytes.is_err();
            read.push(bytes);
            if failed && stop_at_error {
                break;
            }
        }
        Ok(blocking(|| {
            read.into_par_iter()
                .map(|r| {
                    r.and_then(|(f, bytes)| self.spec.apply_to(f, &bytes))
                        .map(Some)
                        .map_err(BoxError::from)
                })
                .collect()
        }))
    }

    /// The images in the batch's binary column, decoded data-parallel
    /// without copying the bytes (a null value is a null image).
    fn decode_bytes(&self, input: &RecordBatch) -> Result<Vec<Decoded>, CallError> {
        let param = &self.signature.params[0];
        let column = input.column_by_name(param).ok_or_else(|| {
            CallError::whole(UdfError::Contract(format!(
                "no column {param} in the input"
            )))
        })?;
        let column = cast(column, &DataType::Binary).map_err(|e| {
            CallError::whole(UdfError::Convert {
                what: format!("column {param} ({})", column.data_type()),
                message: format!("image_decode takes a File or a binary column: {e}"),
            })
        })?;
        let bytes = column.as_binary::<i32>();
        Ok(blocking(|| {
            (0..bytes.len())
                .into_par_iter()
                .map(|row| {
                    if bytes.is_null(row) {
                        return Ok(None);
                    }
                    self.spec
                        .apply(bytes.value(row))
                        .map(Some)
                        .map_err(BoxError::from)
                })
                .collect()
        }))
    }
}
