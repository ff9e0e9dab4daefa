//! The image decoders' calls in SQL and chain expressions: their constant
//! arguments after the File column, and the fusion of a decode with the
//! convert and resize above it.
//!
//! `image_decode(file [, mode [, max_side]])` and `image_thumbnail(file,
//! max_side)` take constants after the File (or binary) column; a bad one is
//! a plan error naming the function and what it takes. `max_side` is a size
//! hint: a JPEG may decode at 1/2, 1/4 or 1/8 of its size in the DCT, its
//! longer side still at least `max_side`.
//!
//! Fusion: `image_convert(image_decode(f), m)`, `image_resize(image_decode(f),
//! w, h [, filter])` and `image_resize_to_fit(image_decode(f), s [, filter])`,
//! with constant arguments in range, nested in that order, become one decode
//! node whose spec does all of it (`DecodeSpec`): each image is decoded and
//! resized on the worker that read it, so the full-size pixels are never
//! copied into an Arrow column, converted and resized a batch at a time on
//! the query's thread. The values are the same as the unfused calls' (the
//! spec applies the same functions in the same order; tested in
//! `udfs/src/builtins/image/tests.rs`). A call with a column or an
//! out-of-range argument is left as written, so it fails as it would alone.

use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::ScalarValue;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{
    ColumnarValue, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use udfchain_udfs::builtins::image::{DecodeSpec, Filter, Image, MAX_SIDE, Mode, Resize};

use super::{Builtin, Stub};

/// What `image_decode` takes, for its plan errors.
const DECODE_TAKES: &str = "takes a File or binary column, then an optional constant mode \
     and max_side, e.g. image_decode(file, 'RGB') or image_decode(file, 'RGB', 224)";

/// The spec of a decoder call `name(file, rest..)` whose table entry
/// decodes as `base`.
pub(super) fn spec_for(name: &str, base: DecodeSpec, rest: &[Expr]) -> DfResult<DecodeSpec> {
    let bad = |what: &str| -> DataFusionError { DataFusionError::Plan(format!("{name}: {what}")) };
    match (name, rest) {
        ("image_thumbnail", [size @ Expr::Literal(..)]) => {
            side(size).map(DecodeSpec::thumbnail).ok_or_else(|| {
                bad(&format!(
                    "max_side is a whole number from 1 to {MAX_SIDE}; got {size}"
                ))
            })
        }
        ("image_thumbnail", _) => Err(bad(
            "takes a File column and a constant max_side, e.g. image_thumbnail(file, 256)",
        )),
        (_, []) => Ok(base),
        (_, [mode, draft @ ..]) if base == DecodeSpec::default() => {
            let mode = match mode {
                Expr::Literal(v, _) if v.is_null() => None,
                _ => Some(
                    text(mode)
                        .and_then(|m| Mode::parse(m).ok())
                        .ok_or_else(|| {
                            bad(&format!("mode is 'L', 'RGB', 'RGBA' or NULL; got {mode}"))
                        })?,
                ),
            };
            let draft = match draft {
                [] => None,
                [Expr::Literal(v, _)] if v.is_null() => None,
                [s] => Some(side(s).ok_or_else(|| {
                    bad(&format!(
                        "max_side is a whole number from 1 to {MAX_SIDE}; got {s}"
                    ))
                })?),
                _ => return Err(bad(DECODE_TAKES)),
            };
            Ok(DecodeSpec {
                draft,
                ..DecodeSpec::decode(mode)
            })
        }
        _ => Err(bad(DECODE_TAKES)),
    }
}

/// `e` with each decode under a convert or a resize of constant arguments
/// fused into one decode call (see the module header).
pub(super) fn fuse(e: Expr, table: &[Builtin]) -> DfResult<Expr> {
    let decoder = table
        .iter()
        .any(|b| b.name == "image_decode" && b.decode.is_some());
    if !decoder {
        return Ok(e);
    }
    Ok(e.transform_up(|x| {
        Ok(match fused(&x) {
            Some(call) => Transformed::yes(call),
            None => Transformed::no(x),
        })
    })?
    .data)
}

/// `x` as one fused decode call, when it is a convert or a resize of a
/// decode with constant arguments.
fn fused(x: &Expr) -> Option<Expr> {
    let Expr::ScalarFunction(ScalarFunction { func, args }) = x else {
        return None;
    };
    let (inner, rest) = args.split_first()?;
    let (file, spec) = decode_call(inner)?;
    if spec.resize.is_some() {
        return None;
    }
    let spec = match (func.name(), rest) {
        ("image_convert", [mode]) => DecodeSpec {
            mode: Some(Mode::parse(text(mode)?).ok()?),
            ..spec
        },
        ("image_resize", [w, h, filter @ ..]) => DecodeSpec {
            resize: Some(Resize::To {
                width: side(w)?,
                height: side(h)?,
                filter: filter_of(filter)?,
            }),
            ..spec
        },
        ("image_resize_to_fit", [max_side, filter @ ..]) => DecodeSpec {
            resize: Some(Resize::Fit {
                max_side: side(max_side)?,
                filter: filter_of(filter)?,
            }),
            ..spec
        },
        _ => return None,
    };
    Some(fused_call(file.clone(), spec))
}

/// The File argument and the spec of a decode call: `image_decode(f [, mode])`
/// of the session, or a call fusion made.
fn decode_call(e: &Expr) -> Option<(&Expr, DecodeSpec)> {
    let Expr::ScalarFunction(ScalarFunction { func, args }) = e else {
        return None;
    };
    let (file, rest) = args.split_first()?;
    if let Some(spec) = fused_spec(func) {
        return Some((file, spec));
    }
    if func.name() != "image_decode" || func.inner().downcast_ref::<Stub>().is_none() {
        return None;
    }
    let spec = spec_for("image_decode", DecodeSpec::default(), rest).ok()?;
    Some((file, spec))
}

/// The spec of a call fusion made.
pub(super) fn fused_spec(func: &ScalarUDF) -> Option<DecodeSpec> {
    func.inner().downcast_ref::<FusedDecode>().map(|f| f.spec)
}

fn fused_call(file: Expr, spec: DecodeSpec) -> Expr {
    let udf = ScalarUDF::new_from_impl(FusedDecode {
        spec,
        signature: Signature::any(1, Volatility::Volatile),
    });
    Expr::ScalarFunction(ScalarFunction::new_udf(Arc::new(udf), vec![file]))
}

/// A constant side: a whole number from 1 to [`MAX_SIDE`].
fn side(e: &Expr) -> Option<u32> {
    let Expr::Literal(v, _) = e else { return None };
    match v.cast_to(&DataType::Int64).ok()? {
        ScalarValue::Int64(Some(n)) => u32::try_from(n).ok().filter(|n| (1..=MAX_SIDE).contains(n)),
        _ => None,
    }
}

/// A constant string.
fn text(e: &Expr) -> Option<&str> {
    match e {
        Expr::Literal(
            ScalarValue::Utf8(Some(s))
            | ScalarValue::LargeUtf8(Some(s))
            | ScalarValue::Utf8View(Some(s)),
            _,
        ) => Some(s),
        _ => None,
    }
}

/// An optional constant filter name (bicubic when absent, as `image_resize`).
fn filter_of(rest: &[Expr]) -> Option<Filter> {
    match rest {
        [] => Some(Filter::Bicubic),
        [f] => Filter::parse(text(f)?).ok(),
        _ => None,
    }
}

/// The call fusion makes, typed as an image; the rewrite replaces it by a
/// decode node's column before anything runs.
#[derive(Debug, PartialEq, Eq, Hash)]
struct FusedDecode {
    spec: DecodeSpec,
    signature: Signature,
}

impl ScalarUDFImpl for FusedDecode {
    fn name(&self) -> &str {
        "image_decode"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> DfResult<DataType> {
        Ok(Image::data_type())
    }

    fn invoke_with_args(&self, _args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        Err(DataFusionError::Internal(format!(
            "{} was not planned as a UDF node",
            self.spec.name()
        )))
    }
}
