//! Arrow columns as Python lists and Python lists as Arrow arrays, without
//! pyarrow, for the plain types: the per-file path of a Python UDF.
//!
//! A `map` over files is one call per row, so what a call costs beside the
//! function is paid per file. Going through pyarrow (an IPC stream each way, a
//! File column taken apart field by field) costs several times the SHA-256 of
//! a 64 KiB file per call, so for plain types the engine builds the call's
//! arguments itself and converts the outputs itself.
//!
//! Guarantees: the values are those `pyarrow`'s `to_pylist()` gives for the
//! same column (a `File` column as `udfchain.File` objects reading through the
//! call's `FileAccess`, its `last_modified` in ms); [`columns`] answers `None`
//! for a column of another type, and [`array`] `None` for an output type it
//! does not build or any value that is not exactly its Python type (`None`
//! aside), so the caller takes the IPC path and pyarrow decides, with its
//! error messages: this module never accepts a value pyarrow would refuse.

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BinaryBuilder, BooleanBuilder, Float64Builder, Int64Builder,
    RecordBatch, StringBuilder, StructArray,
};
use datafusion::arrow::datatypes::{
    DataType, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type,
    TimestampMillisecondType, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyBytes, PyFloat, PyInt, PyList, PyString, PyType};
use udfchain::udfs::File;

static FILE_CLASS: PyOnceLock<Py<PyType>> = PyOnceLock::new();

/// Whether [`columns`] converts a column of type `dt`.
fn plain_input(dt: &DataType) -> bool {
    use DataType::*;
    matches!(
        dt,
        Null | Boolean
            | Int8
            | Int16
            | Int32
            | Int64
            | UInt8
            | UInt16
            | UInt32
            | UInt64
            | Float32
            | Float64
            | Utf8
            | LargeUtf8
            | Utf8View
            | Binary
            | LargeBinary
            | BinaryView
    ) || file_shaped(dt)
}

/// A `File` struct whose fields have `File`'s types (nullability aside).
fn file_shaped(dt: &DataType) -> bool {
    match (dt, File::data_type()) {
        (DataType::Struct(have), DataType::Struct(want)) => {
            have.len() == want.len()
                && have
                    .iter()
                    .zip(want.iter())
                    .all(|(a, b)| a.name() == b.name() && a.data_type() == b.data_type())
        }
        _ => false,
    }
}

/// Whether every column of `batch` converts (no GIL needed to ask).
pub fn plain_batch(batch: &RecordBatch) -> bool {
    batch.columns().iter().all(|c| plain_input(c.data_type()))
}

/// The columns of `batch` as Python lists (File columns as `udfchain.File`
/// objects holding `access`); an error for a batch [`plain_batch`] refuses.
pub fn columns<'py>(
    py: Python<'py>,
    batch: &RecordBatch,
    access: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyList>> {
    let out = PyList::empty(py);
    for column in batch.columns() {
        out.append(column_values(py, column.as_ref(), access)?)?;
    }
    Ok(out)
}

/// `f(i)` for every valid row, `None` for a null one.
fn each<'py, T: IntoPyObject<'py>>(
    py: Python<'py>,
    a: &dyn Array,
    f: impl Fn(usize) -> T,
) -> PyResult<Bound<'py, PyList>> {
    let out = PyList::empty(py);
    for i in 0..a.len() {
        if a.is_null(i) {
            out.append(py.None())?;
        } else {
            out.append(f(i))?;
        }
    }
    Ok(out)
}

fn column_values<'py>(
    py: Python<'py>,
    a: &dyn Array,
    access: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyList>> {
    use DataType::*;
    match a.data_type() {
        Null => each(py, a, |_| py.None()),
        Boolean => each(py, a, |i| a.as_boolean().value(i)),
        Int8 => each(py, a, |i| a.as_primitive::<Int8Type>().value(i)),
        Int16 => each(py, a, |i| a.as_primitive::<Int16Type>().value(i)),
        Int32 => each(py, a, |i| a.as_primitive::<Int32Type>().value(i)),
        Int64 => each(py, a, |i| a.as_primitive::<Int64Type>().value(i)),
        UInt8 => each(py, a, |i| a.as_primitive::<UInt8Type>().value(i)),
        UInt16 => each(py, a, |i| a.as_primitive::<UInt16Type>().value(i)),
        UInt32 => each(py, a, |i| a.as_primitive::<UInt32Type>().value(i)),
        UInt64 => each(py, a, |i| a.as_primitive::<UInt64Type>().value(i)),
        Float32 => each(py, a, |i| {
            f64::from(a.as_primitive::<Float32Type>().value(i))
        }),
        Float64 => each(py, a, |i| a.as_primitive::<Float64Type>().value(i)),
        Utf8 => each(py, a, |i| a.as_string::<i32>().value(i)),
        LargeUtf8 => each(py, a, |i| a.as_string::<i64>().value(i)),
        Utf8View => each(py, a, |i| a.as_string_view().value(i)),
        Binary => each(py, a, |i| PyBytes::new(py, a.as_binary::<i32>().value(i))),
        LargeBinary => each(py, a, |i| PyBytes::new(py, a.as_binary::<i64>().value(i))),
        BinaryView => each(py, a, |i| PyBytes::new(py, a.as_binary_view().value(i))),
        dt if file_shaped(dt) => files(py, a.as_struct(), access),
        dt => Err(PyRuntimeError::new_err(format!(
            "no plain Python values for a column of {dt}"
        ))),
    }
}

/// A File column as `udfchain.File(source, path, size, version, etag,
/// last_modified, location, access)` objects.
fn files<'py>(
    py: Python<'py>,
    s: &StructArray,
    access: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyList>> {
    let class = FILE_CLASS.import(py, "udfchain._file", "File")?;
    let text = |k: usize| s.column(k).as_string::<i32>();
    let (source, path, version, etag, location) = (text(0), text(1), text(3), text(4), text(6));
    let size = s.column(2).as_primitive::<UInt64Type>();
    let modified = s.column(5).as_primitive::<TimestampMillisecondType>();
    let out = PyList::empty(py);
    for i in 0..s.len() {
        if s.is_null(i) {
            out.append(py.None())?;
            continue;
        }
        let file = class.call1((
            source.value(i),
            path.value(i),
            size.value(i),
            version.is_valid(i).then(|| version.value(i)),
            etag.is_valid(i).then(|| etag.value(i)),
            modified.is_valid(i).then(|| modified.value(i)),
            location.is_valid(i).then(|| location.value(i)),
            access,
        ))?;
        out.append(file)?;
    }
    Ok(out)
}

/// `values` as an array of `dt`, or `None` when `dt` is not one this builds
/// or a value is not exactly its Python type (then pyarrow converts, or says
/// why not).
pub fn array(values: &Bound<'_, PyList>, dt: &DataType) -> Option<ArrayRef> {
    // Every value exactly of Python type `$py` (or None), appended as `$value`.
    macro_rules! build {
        ($builder:expr, $py:ty, |$x:ident| $value:expr) => {{
            let mut b = $builder;
            for v in values.iter() {
                match v.cast_exact::<$py>() {
                    Ok($x) => b.append_value($value),
                    Err(_) if v.is_none() => b.append_null(),
                    Err(_) => return None,
                }
            }
            Arc::new(b.finish()) as ArrayRef
        }};
    }
    let n = values.len();
    Some(match dt {
        DataType::Int64 => build!(Int64Builder::with_capacity(n), PyInt, |i| i
            .extract::<i64>()
            .ok()?),
        DataType::Float64 => build!(Float64Builder::with_capacity(n), PyFloat, |f| f.value()),
        DataType::Boolean => build!(BooleanBuilder::with_capacity(n), PyBool, |t| t.is_true()),
        DataType::Utf8 => build!(StringBuilder::with_capacity(n, 16 * n), PyString, |s| s
            .to_str()
            .ok()?),
        DataType::Binary => build!(BinaryBuilder::with_capacity(n, 16 * n), PyBytes, |s| s
            .as_bytes()),
        _ => return None,
    })
}
