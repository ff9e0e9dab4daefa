//! The image operations as DataFusion scalar functions over image columns,
//! for SQL and for `Chain` expressions: `image_resize(img, w, h [, filter])`,
//! `image_resize_to_fit(img, max_side [, filter])`, `image_crop(img, x, y,
//! w, h)`, `image_center_crop(img, w, h)`, `image_convert(img, mode)`,
//! `image_encode(img, format [, quality])` (binary).
//!
//! Guarantees: a batch's images are processed data-parallel on rayon's pool;
//! on a worker of a multi-threaded tokio runtime the wait is announced with
//! `block_in_place`, so the runtime moves its other tasks (downloads) to
//! other threads instead of stalling them behind the pixels. Arguments after
//! the image may be constants or columns (read per row); a bad one is a
//! query error naming the function, the row and the argument.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BinaryBuilder};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Int64Type};
use datafusion::common::ScalarValue;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::logical_expr::{
    ColumnarValue, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use rayon::prelude::*;

use super::ops::{Filter, Format};
use super::value::{Image, ImageView, Mode};
use super::{blocking, center_crop, convert, crop, encode, resize, resize_to_fit};
use crate::error::UdfError;

/// Which operation a function is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Op {
    Resize,
    ResizeToFit,
    Crop,
    CenterCrop,
    Convert,
    Encode,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Self::Resize => "image_resize",
            Self::ResizeToFit => "image_resize_to_fit",
            Self::Crop => "image_crop",
            Self::CenterCrop => "image_center_crop",
            Self::Convert => "image_convert",
            Self::Encode => "image_encode",
        }
    }

    /// The arguments after the image: (required, optional) counts and their names.
    fn args(self) -> (usize, &'static [&'static str]) {
        match self {
            Self::Resize => (2, &["width", "height", "filter"]),
            Self::ResizeToFit => (1, &["max_side", "filter"]),
            Self::Crop => (4, &["x", "y", "width", "height"]),
            Self::CenterCrop => (2, &["width", "height"]),
            Self::Convert => (1, &["mode"]),
            Self::Encode => (1, &["format", "quality"]),
        }
    }
}

/// One image function.
#[derive(Debug, PartialEq, Eq, Hash)]
struct ImageFunction {
    op: Op,
    signature: Signature,
}

/// Every image function (with `image_to_tensor`), to register in a session.
pub fn functions() -> Vec<ScalarUDF> {
    [
        Op::Resize,
        Op::ResizeToFit,
        Op::Crop,
        Op::CenterCrop,
        Op::Convert,
        Op::Encode,
    ]
    .into_iter()
    .map(|op| {
        ScalarUDF::new_from_impl(ImageFunction {
            op,
            signature: Signature::variadic_any(Volatility::Immutable),
        })
    })
    .chain([super::to_tensor_function()])
    .collect()
}

/// `image_resize(img, width, height, filter)` as an expression.
pub fn resize_expr(img: Expr, width: u32, height: u32, filter: &str) -> Expr {
    call(
        Op::Resize,
        vec![
            img,
            lit_i(width),
            lit_i(height),
            Expr::Literal(ScalarValue::from(filter), None),
        ],
    )
}

/// `image_resize_to_fit(img, max_side)` as an expression.
pub fn resize_to_fit_expr(img: Expr, max_side: u32) -> Expr {
    call(Op::ResizeToFit, vec![img, lit_i(max_side)])
}

/// `image_center_crop(img, width, height)` as an expression.
pub fn center_crop_expr(img: Expr, width: u32, height: u32) -> Expr {
    call(Op::CenterCrop, vec![img, lit_i(width), lit_i(height)])
}

/// `image_convert(img, mode)` as an expression.
pub fn convert_expr(img: Expr, mode: Mode) -> Expr {
    call(
        Op::Convert,
        vec![img, Expr::Literal(ScalarValue::from(mode.as_str()), None)],
    )
}

fn lit_i(v: u32) -> Expr {
    Expr::Literal(ScalarValue::Int64(Some(i64::from(v))), None)
}

fn call(op: Op, args: Vec<Expr>) -> Expr {
    let udf = ScalarUDF::new_from_impl(ImageFunction {
        op,
        signature: Signature::variadic_any(Volatility::Immutable),
    });
    udf.call(args)
}

/// A plan error of function `op`.
fn error(op: Op, what: impl std::fmt::Display) -> DataFusionError {
    DataFusionError::Execution(format!("{}: {what}", op.name()))
}

/// The extra arguments of one row, as text or numbers.
enum Arg {
    Int(ArrayRef),
    Text(ArrayRef),
}

impl Arg {
    fn int(&self, op: Op, name: &str, row: usize) -> DfResult<i64> {
        match self {
            Self::Int(a) => {
                let a = a.as_primitive::<Int64Type>();
                if a.is_null(row) {
                    return Err(error(op, format!("{name} is null at row {row}")));
                }
                Ok(a.value(row))
            }
            Self::Text(_) => Err(error(op, format!("{name} must be a number"))),
        }
    }

    fn text<'a>(&'a self, op: Op, name: &str, row: usize) -> DfResult<&'a str> {
        match self {
            Self::Text(a) => {
                let a = a.as_string::<i32>();
                if a.is_null(row) {
                    return Err(error(op, format!("{name} is null at row {row}")));
                }
                Ok(a.value(row))
            }
            Self::Int(_) => Err(error(op, format!("{name} must be a string"))),
        }
    }
}

fn u32_arg(op: Op, name: &str, v: i64) -> DfResult<u32> {
    u32::try_from(v).map_err(|_| error(op, format!("{name} {v} is out of range")))
}

impl ScalarUDFImpl for ImageFunction {
    fn name(&self) -> &str {
        self.op.name()
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> DfResult<DataType> {
        let (required, names) = self.op.args();
        let given = arg_types.len().saturating_sub(1);
        if arg_types.is_empty() || given < required || given > names.len() {
            return Err(DataFusionError::Plan(format!(
                "{}(image, {}) takes {} to {} arguments after the image, got {given}",
                self.op.name(),
                names.join(", "),
                required,
                names.len()
            )));
        }
        if !Image::is_image_type(&arg_types[0]) {
            return Err(DataFusionError::Plan(format!(
                "{}: its first argument must be an image (image_decode(file)), got {}",
                self.op.name(),
                arg_types[0]
            )));
        }
        Ok(match self.op {
            Op::Encode => DataType::Binary,
            _ => Image::data_type(),
        })
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let op = self.op;
        let n = args.number_rows;
        let scalar = args
            .args
            .iter()
            .all(|a| matches!(a, ColumnarValue::Scalar(_)));
        let images = args.args[0].to_array(n)?;
        let (_, names) = op.args();
        let mut extra = Vec::with_capacity(args.args.len() - 1);
        for (i, a) in args.args[1..].iter().enumerate() {
            let a = a.to_array(n)?;
            let text = matches!(
                a.data_type(),
                DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
            );
            extra.push(if text {
                Arg::Text(cast(&a, &DataType::Utf8)?)
            } else {
                Arg::Int(cast(&a, &DataType::Int64).map_err(|_| {
                    error(
                        op,
                        format!("{} must be a number, got {}", names[i], a.data_type()),
                    )
                })?)
            });
        }
        let out = blocking(|| run(op, &images, &extra))?;
        if scalar && out.len() == 1 {
            return Ok(ColumnarValue::Scalar(ScalarValue::try_from_array(&out, 0)?));
        }
        Ok(ColumnarValue::Array(out))
    }
}

fn udf_err(op: Op, e: UdfError) -> DataFusionError {
    error(op, e)
}

/// The operation over a column, its per-row arguments read from `extra`.
fn run(op: Op, images: &ArrayRef, extra: &[Arg]) -> DfResult<ArrayRef> {
    let filter = |row: usize, at: usize| -> DfResult<Filter> {
        match extra.get(at) {
            Some(a) => Filter::parse(a.text(op, "filter", row)?).map_err(|e| udf_err(op, e)),
            None => Ok(Filter::Bicubic),
        }
    };
    let int = |row: usize, at: usize, name: &str| -> DfResult<u32> {
        u32_arg(op, name, extra[at].int(op, name, row)?)
    };
    if op == Op::Encode {
        let views = Image::views(images.as_ref()).map_err(|e| udf_err(op, e))?;
        let encoded: Vec<Option<Vec<u8>>> = views
            .par_iter()
            .enumerate()
            .map(|(row, v)| {
                let Some(v) = v else { return Ok(None) };
                let format =
                    Format::parse(extra[0].text(op, "format", row)?).map_err(|e| udf_err(op, e))?;
                let quality = match extra.get(1) {
                    Some(q) => {
                        Some(u8::try_from(q.int(op, "quality", row)?.clamp(1, 100)).unwrap_or(75))
                    }
                    None => None,
                };
                encode(*v, format, quality)
                    .map(Some)
                    .map_err(|e| error(op, format!("row {row}: {e}")))
            })
            .collect::<DfResult<_>>()?;
        let mut b = BinaryBuilder::new();
        for e in encoded {
            b.append_option(e);
        }
        return Ok(Arc::new(b.finish()));
    }
    // Arguments per row first (errors name the row), then the pixels in parallel.
    let views = Image::views(images.as_ref()).map_err(|e| udf_err(op, e))?;
    if op == Op::Convert && already_in_mode(&views, &extra[0]) {
        return Ok(Arc::clone(images));
    }
    let mut jobs: Vec<Job> = Vec::with_capacity(views.len());
    for row in 0..views.len() {
        jobs.push(match op {
            Op::Resize => {
                let (w, h, f) = (
                    int(row, 0, "width")?,
                    int(row, 1, "height")?,
                    filter(row, 2)?,
                );
                Box::new(move |v| resize(v, w, h, f))
            }
            Op::ResizeToFit => {
                let (m, f) = (int(row, 0, "max_side")?, filter(row, 1)?);
                Box::new(move |v| resize_to_fit(v, m, f))
            }
            Op::Crop => {
                let (x, y) = (int(row, 0, "x")?, int(row, 1, "y")?);
                let (w, h) = (int(row, 2, "width")?, int(row, 3, "height")?);
                Box::new(move |v| crop(v, x, y, w, h))
            }
            Op::CenterCrop => {
                let (w, h) = (int(row, 0, "width")?, int(row, 1, "height")?);
                Box::new(move |v| center_crop(v, w, h))
            }
            Op::Convert => {
                let mode =
                    Mode::parse(extra[0].text(op, "mode", row)?).map_err(|e| udf_err(op, e))?;
                Box::new(move |v| convert(v, mode))
            }
            Op::Encode => return Err(error(op, "encodes to binary, not to an image")),
        });
    }
    map_indexed(images.as_ref(), &jobs).map_err(|e| udf_err(op, e))
}

/// Whether every image is already in the mode its row asks for (then
/// `image_convert` returns its input column as it is, without a copy).
fn already_in_mode(views: &[Option<ImageView<'_>>], mode: &Arg) -> bool {
    views.iter().enumerate().all(|(row, v)| match v {
        None => true,
        Some(v) => {
            mode.text(Op::Convert, "mode", row)
                .ok()
                .and_then(|m| Mode::parse(m).ok())
                == Some(v.mode)
        }
    })
}

/// What one row's image becomes.
type Job = Box<dyn Fn(ImageView<'_>) -> Result<Image, UdfError> + Sync + Send>;

/// `jobs[r]` of row `r` of the image column, in parallel.
fn map_indexed(images: &dyn Array, jobs: &[Job]) -> Result<ArrayRef, UdfError> {
    let views = Image::views(images)?;
    let out: Vec<Option<Image>> = views
        .par_iter()
        .zip(jobs.par_iter())
        .enumerate()
        .map(|(row, (v, job))| match v {
            Some(v) => job(*v)
                .map(Some)
                .map_err(|e| UdfError::Contract(format!("row {row}: {e}"))),
            None => Ok(None),
        })
        .collect::<Result<_, _>>()?;
    Ok(Image::to_array(out.iter().map(Option::as_ref)))
}
