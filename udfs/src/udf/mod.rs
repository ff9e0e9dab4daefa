//! The four UDF kinds. Each has a dyn-safe Arrow-level trait (what the engine
//! calls) and a typed constructor that wraps a plain async Rust function.
//!
//! Every call receives a `RecordBatch` holding exactly the UDF's `params`
//! columns. The engine decides how many rows go into one call, runs calls off
//! the I/O runtime, and installs the `FileSource` that `File` reads go through.

mod aggregator;
mod batch_mapper;
mod code;
mod generator;
mod lifecycle;
mod mapper;

pub use aggregator::{Aggregator, agg_fn};
pub use batch_mapper::{BatchMapper, batch_map_fn};
pub use code::Code;
pub use generator::{Generator, gen_fn};
pub use lifecycle::{Lifecycle, State, Stateful, agg_with, batch_map_with, gen_with, map_with};
pub use mapper::{EachRow, Mapper, map_fn};

use serde::de::DeserializeOwned;

use crate::codec::trace_field;
use crate::error::UdfError;
use crate::signature::Signature;

/// Builds the signature of a typed UDF: input traced from `I`, output from `O`.
/// The name is the function's own name when `F` is a named fn, else `output`.
fn typed_signature<F, I: DeserializeOwned, O: DeserializeOwned>(
    params: &[&str],
    output: &str,
) -> Result<Signature, UdfError> {
    if params.is_empty() {
        return Err(UdfError::Contract(format!(
            "UDF for column {output} reads no column: give at least one param"
        )));
    }
    let input = trace_field::<I>("input")?;
    let input = if params.len() == 1 {
        input.data_type().clone()
    } else {
        // Several params convert to a struct whose fields are named like the columns;
        // a param the struct does not name is passed but ignored.
        input.data_type().clone()
    };
    Ok(Signature {
        name: fn_name::<F>().unwrap_or(output).to_string(),
        params: params.iter().map(|s| s.to_string()).collect(),
        input: Some(input),
        output: trace_field::<O>(output)?,
    })
}

/// `my_crate::module::image_meta` -> `image_meta`; closures have no name.
fn fn_name<F>() -> Option<&'static str> {
    let full = std::any::type_name::<F>();
    if full.contains("{{closure}}") || full.contains('<') || full.contains(' ') {
        return None;
    }
    full.rsplit("::").next()
}
