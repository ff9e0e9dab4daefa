//! Images as a fixed-shape tensor column (the loader's `with_images`, SQL's
//! `image_to_tensor(img, width, height [, mode])`): many images decoded,
//! converted and resized to one `height x width x channels` uint8 block per
//! row, data-parallel on rayon's pool, into one Arrow
//! `FixedSizeList<UInt8>[H*W*C]` that carries Arrow's canonical
//! `arrow.fixed_shape_tensor` extension (shape `[H, W, C]`, row-major).
//! pyarrow reads it as a `FixedShapeTensorArray` and numpy as one
//! `(N, H, W, C)` array without a copy.
//!
//! Guarantees: every row's block is exactly `H*W*C` bytes (the image resized
//! to `width x height`, aspect not kept, as torchvision's `Resize((h, w))`);
//! a null input is a null row (its block zeros); the first row that does not
//! decode is an error naming that row; the pixel limit of [`DecodeOptions`]
//! applies; a JPEG is decoded at reduced size in the DCT when it is at least
//! twice the target.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, FixedSizeListArray, UInt8Array};
use datafusion::arrow::buffer::NullBuffer;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef};
use datafusion::common::ScalarValue;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::logical_expr::{
    ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    Volatility,
};
use rayon::prelude::*;

use super::{DecodeOptions, Filter, Image, ImageView, Mode, blocking, convert, decode, resize};
use crate::error::UdfError;

/// The shape every image of a tensor column is made to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorShape {
    /// Pixels across.
    pub width: u32,
    /// Pixels down.
    pub height: u32,
    /// The channels: `L` 1, `RGB` 3, `RGBA` 4.
    pub mode: Mode,
    /// The resampling filter.
    pub filter: Filter,
}

impl TensorShape {
    /// `width x height` in `mode`, resized with bilinear (torchvision's default).
    pub fn new(width: u32, height: u32, mode: Mode) -> Result<Self, UdfError> {
        for (what, side) in [("width", width), ("height", height)] {
            if !(1..=super::MAX_SIDE).contains(&side) {
                return Err(UdfError::Contract(format!(
                    "an image tensor's {what} is 1 to {}; got {side}",
                    super::MAX_SIDE
                )));
            }
        }
        Ok(Self {
            width,
            height,
            mode,
            filter: Filter::Bilinear,
        })
    }

    /// Bytes of one row: `H * W * C`.
    pub fn row_len(&self) -> usize {
        self.width as usize * self.height as usize * self.mode.channels()
    }

    /// The column `name` of this shape, with the extension's metadata.
    pub fn field(&self, name: &str) -> Field {
        let item = Arc::new(Field::new("item", DataType::UInt8, false));
        let shape = format!(
            "{{\"shape\":[{},{},{}],\"dim_names\":[\"H\",\"W\",\"C\"]}}",
            self.height,
            self.width,
            self.mode.channels()
        );
        Field::new(
            name,
            DataType::FixedSizeList(item, self.row_len() as i32),
            true,
        )
        .with_metadata(HashMap::from([
            (
                "ARROW:extension:name".to_string(),
                "arrow.fixed_shape_tensor".to_string(),
            ),
            ("ARROW:extension:metadata".to_string(), shape),
        ]))
    }
}

/// The tensor column of `encoded` (one encoded image per row, `None` for a
/// null row), made to `shape`; else the first row that failed and why.
pub fn decode_to_tensor(
    encoded: &[Option<&[u8]>],
    shape: &TensorShape,
    max_pixels: u64,
) -> Result<ArrayRef, (usize, UdfError)> {
    let options = DecodeOptions {
        mode: Some(shape.mode),
        max_side: Some(shape.width.max(shape.height)),
        max_pixels,
    };
    tensor_of(encoded.len(), shape, |row, out| {
        let Some(bytes) = encoded[row] else {
            return Ok(false);
        };
        let img = decode(bytes, &options).map_err(|e| UdfError::Contract(e.to_string()))?;
        fill(img.view(), shape, out)?;
        Ok(true)
    })
}

/// The tensor column of the image column `images`, each image converted to
/// the shape's mode and resized to its size (when it is another).
pub fn images_to_tensor(
    images: &dyn Array,
    shape: &TensorShape,
) -> Result<ArrayRef, (usize, UdfError)> {
    let views = Image::views(images).map_err(|e| (0, e))?;
    tensor_of(views.len(), shape, |row, out| {
        let Some(img) = views[row] else {
            return Ok(false);
        };
        fill(img, shape, out)?;
        Ok(true)
    })
}

/// `img` in the shape's mode and size, written to `out`.
fn fill(img: ImageView<'_>, shape: &TensorShape, out: &mut [u8]) -> Result<(), UdfError> {
    let converted;
    let img = if img.mode == shape.mode {
        img
    } else {
        converted = convert(img, shape.mode)?;
        converted.view()
    };
    if (img.width, img.height) == (shape.width, shape.height) {
        out.copy_from_slice(img.data);
    } else {
        out.copy_from_slice(&resize(img, shape.width, shape.height, shape.filter)?.data);
    }
    Ok(())
}

/// `n` rows of `shape`, row `i` written by `one(i, block)` on rayon's pool
/// (`Ok(false)`: a null row); the first row that fails, and why.
fn tensor_of(
    n: usize,
    shape: &TensorShape,
    one: impl Fn(usize, &mut [u8]) -> Result<bool, UdfError> + Sync,
) -> Result<ArrayRef, (usize, UdfError)> {
    let row_len = shape.row_len();
    let mut values = vec![0u8; n * row_len];
    let mut valid = vec![true; n];
    let failed: Option<(usize, UdfError)> = blocking(|| {
        values
            .par_chunks_mut(row_len.max(1))
            .zip(valid.par_iter_mut())
            .enumerate()
            .filter_map(|(row, (out, valid))| match one(row, out) {
                Ok(v) => {
                    *valid = v;
                    None
                }
                Err(e) => Some((row, e)),
            })
            .min_by_key(|(row, _)| *row)
    });
    if let Some(failed) = failed {
        return Err(failed);
    }
    let nulls = valid.iter().any(|v| !v).then(|| NullBuffer::from(valid));
    let item = Arc::new(Field::new("item", DataType::UInt8, false));
    let list = FixedSizeListArray::try_new(
        item,
        row_len as i32,
        Arc::new(UInt8Array::from(values)),
        nulls,
    )
    .map_err(|e| {
        (
            0,
            UdfError::Contract(format!("an image tensor column: {e}")),
        )
    })?;
    Ok(Arc::new(list))
}

/// `image_to_tensor(img, width, height [, mode])`: the image column as a
/// tensor column of one shape (each image converted to `mode`, default
/// `RGB`, and resized to `width x height` when it is another size); the
/// size and mode are constants, so the column's type is known when the
/// query is planned.
pub fn to_tensor_function() -> ScalarUDF {
    ScalarUDF::new_from_impl(ToTensor {
        signature: Signature::variadic_any(Volatility::Immutable),
    })
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct ToTensor {
    signature: Signature,
}

const TO_TENSOR: &str = "image_to_tensor";

/// The shape a call's constant arguments give.
fn shape_of(args: &[Option<&ScalarValue>], types: &[DataType]) -> DfResult<TensorShape> {
    let usage = || {
        DataFusionError::Plan(format!(
            "{TO_TENSOR}(image, width, height [, mode]) takes an image, constant sizes \
             and a constant mode ('RGB', 'L' or 'RGBA')"
        ))
    };
    if !(3..=4).contains(&args.len()) || !types.first().is_some_and(Image::is_image_type) {
        return Err(usage());
    }
    let side = |i: usize| -> DfResult<u32> {
        match args[i].map(|v| v.cast_to(&DataType::Int64)) {
            Some(Ok(ScalarValue::Int64(Some(v)))) => u32::try_from(v).map_err(|_| usage()),
            _ => Err(usage()),
        }
    };
    let mode = match args.get(3) {
        None => Mode::Rgb,
        Some(Some(ScalarValue::Utf8(Some(m)) | ScalarValue::Utf8View(Some(m)))) => {
            Mode::parse(m).map_err(|e| DataFusionError::Plan(format!("{TO_TENSOR}: {e}")))?
        }
        Some(_) => return Err(usage()),
    };
    TensorShape::new(side(1)?, side(2)?, mode)
        .map_err(|e| DataFusionError::Plan(format!("{TO_TENSOR}: {e}")))
}

impl ScalarUDFImpl for ToTensor {
    fn name(&self) -> &str {
        TO_TENSOR
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> DfResult<DataType> {
        Err(DataFusionError::Internal(format!(
            "{TO_TENSOR}: its type comes from its constant arguments"
        )))
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> DfResult<FieldRef> {
        let types: Vec<DataType> = args
            .arg_fields
            .iter()
            .map(|f| f.data_type().clone())
            .collect();
        let shape = shape_of(args.scalar_arguments, &types)?;
        Ok(Arc::new(shape.field(TO_TENSOR)))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let constants: Vec<Option<ScalarValue>> = args
            .args
            .iter()
            .map(|a| match a {
                ColumnarValue::Scalar(v) => Some(v.clone()),
                ColumnarValue::Array(_) => None,
            })
            .collect();
        let refs: Vec<Option<&ScalarValue>> = constants.iter().map(Option::as_ref).collect();
        let types: Vec<DataType> = args.args.iter().map(|a| a.data_type()).collect();
        let shape = shape_of(&refs, &types)?;
        let images = args.args[0].to_array(args.number_rows)?;
        images_to_tensor(images.as_ref(), &shape)
            .map(ColumnarValue::Array)
            .map_err(|(row, e)| DataFusionError::Execution(format!("{TO_TENSOR}: row {row}: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{Array, AsArray};
    use datafusion::arrow::datatypes::UInt8Type;

    use super::super::{Format, Image, encode};
    use super::*;

    fn png(w: u32, h: u32, seed: u8) -> Vec<u8> {
        let data = (0..w * h * 3)
            .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed))
            .collect();
        let img = Image::new(w, h, Mode::Rgb, data).expect("image");
        encode(img.view(), Format::Png, None).expect("png")
    }

    #[test]
    fn every_row_is_its_image_resized_and_a_null_stays_null() {
        let shape = TensorShape::new(8, 6, Mode::Rgb).expect("shape");
        let (a, b) = (png(20, 10, 1), png(5, 9, 2));
        let rows = [Some(a.as_slice()), None, Some(b.as_slice())];
        let col = decode_to_tensor(&rows, &shape, u64::MAX).expect("tensor");
        let list = col.as_fixed_size_list();
        assert_eq!((list.len(), list.value_length()), (3, 8 * 6 * 3));
        assert!(list.is_null(1) && list.is_valid(0) && list.is_valid(2));
        for (row, bytes) in [(0, &a), (2, &b)] {
            let want = resize(
                decode(bytes, &DecodeOptions::default())
                    .expect("decode")
                    .view(),
                8,
                6,
                Filter::Bilinear,
            )
            .expect("resize");
            let got = list.value(row);
            assert_eq!(
                got.as_primitive::<UInt8Type>().values().as_ref(),
                want.data.as_slice()
            );
        }
        let field = shape.field("image");
        assert_eq!(
            field.metadata()["ARROW:extension:metadata"],
            "{\"shape\":[6,8,3],\"dim_names\":[\"H\",\"W\",\"C\"]}"
        );
    }

    #[test]
    fn a_broken_image_names_its_row() {
        let shape = TensorShape::new(4, 4, Mode::L).expect("shape");
        let good = png(6, 6, 0);
        let rows = [Some(good.as_slice()), Some(b"not an image".as_slice())];
        let (row, err) = decode_to_tensor(&rows, &shape, u64::MAX).expect_err("broken");
        assert_eq!(row, 1, "{err}");
        assert!(err.to_string().contains("not an image"), "{err}");
        assert!(TensorShape::new(0, 4, Mode::L).is_err());
    }
}
