//! Arrow <-> Rust conversion for typed UDFs, once per batch, through `serde_arrow`.
//!
//! A single column converts to `Vec<T>` of its values; several columns convert to
//! `Vec<T>` where `T` is a struct whose fields are named like the columns. Output
//! types are traced from the Rust type, so a UDF declares its schema by its
//! signature; a struct shaped like [`File`] is given `File`'s exact Arrow type.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_arrow::schema::{SchemaLike, TracingOptions};

use crate::error::UdfError;
use crate::file::File;

#[derive(Serialize, Deserialize)]
struct One<T> {
    a0: T,
}

fn tracing_options() -> TracingOptions {
    TracingOptions::default()
        .allow_null_fields(true)
        .strings_as_large_utf8(false)
        .sequence_as_large_list(false)
        .bytes_as_large_binary(false)
        .enums_without_data_as_strings(true)
}

fn convert_err(what: &str, e: impl std::fmt::Display) -> UdfError {
    UdfError::Convert {
        what: what.to_string(),
        message: e.to_string(),
    }
}

/// The Arrow field, named `name`, that values of type `T` convert to.
pub fn trace_field<T: DeserializeOwned>(name: &str) -> Result<Field, UdfError> {
    let what = std::any::type_name::<T>();
    let fields = Vec::<FieldRef>::from_type::<One<T>>(tracing_options())
        .map_err(|e| convert_err(what, e))?;
    let traced = fields
        .first()
        .ok_or_else(|| convert_err(what, "tracing gave no field"))?;
    Ok(Field::new(
        name,
        with_file_types(traced.data_type()),
        traced.is_nullable(),
    ))
}

/// Replaces every struct shaped like `File` or `Image` (same field names)
/// with that type's exact Arrow type.
fn with_file_types(dt: &DataType) -> DataType {
    match dt {
        dt if File::is_file_type(dt) => File::data_type(),
        dt if crate::builtins::image::Image::is_image_shaped(dt) => {
            crate::builtins::image::Image::data_type()
        }
        DataType::Struct(fields) => DataType::Struct(
            fields
                .iter()
                .map(|f| {
                    Arc::new(Field::new(
                        f.name(),
                        with_file_types(f.data_type()),
                        f.is_nullable(),
                    ))
                })
                .collect(),
        ),
        DataType::List(item) => DataType::List(Arc::new(Field::new(
            item.name(),
            with_file_types(item.data_type()),
            item.is_nullable(),
        ))),
        other => other.clone(),
    }
}

/// Converts `values` into one Arrow array of `field`'s type.
pub fn encode_column<T: Serialize>(field: &Field, values: &[T]) -> Result<ArrayRef, UdfError> {
    let wrapped: Vec<One<&T>> = values.iter().map(|a0| One { a0 }).collect();
    let fields = [Arc::new(Field::new(
        "a0",
        field.data_type().clone(),
        field.is_nullable(),
    ))];
    let mut arrays = serde_arrow::to_arrow(&fields, &wrapped)
        .map_err(|e| convert_err(std::any::type_name::<T>(), e))?;
    arrays
        .pop()
        .ok_or_else(|| convert_err(std::any::type_name::<T>(), "no array"))
}

/// Converts one Arrow array into its values.
pub fn decode_column<T: DeserializeOwned>(array: &ArrayRef) -> Result<Vec<T>, UdfError> {
    let fields = [Arc::new(Field::new(
        "a0",
        array.data_type().clone(),
        array.null_count() > 0 || array.is_nullable(),
    ))];
    let wrapped: Vec<One<T>> = serde_arrow::from_arrow(&fields, std::slice::from_ref(array))
        .map_err(|e| convert_err(std::any::type_name::<T>(), e))?;
    Ok(wrapped.into_iter().map(|o| o.a0).collect())
}

/// Converts the `params` columns of `batch` into values: one column gives its
/// values, several give a struct per row with fields named like the columns.
pub fn decode_rows<T: DeserializeOwned>(
    batch: &RecordBatch,
    params: &[String],
) -> Result<Vec<T>, UdfError> {
    let what = std::any::type_name::<T>();
    let column = |name: &String| {
        batch
            .column_by_name(name)
            .cloned()
            .ok_or_else(|| convert_err(what, format!("no column {name}")))
    };
    match params {
        [one] => decode_column(&column(one)?),
        _ => {
            let mut fields = Vec::with_capacity(params.len());
            let mut arrays = Vec::with_capacity(params.len());
            for p in params {
                let a = column(p)?;
                fields.push(Arc::new(Field::new(p, a.data_type().clone(), true)));
                arrays.push(a);
            }
            serde_arrow::from_arrow(&fields, &arrays).map_err(|e| convert_err(what, e))
        }
    }
}
