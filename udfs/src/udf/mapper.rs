//! Mapper: one row in, one value out.

use std::fmt::Debug;
use std::marker::PhantomData;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{ArrayRef, RecordBatch};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::codec::{decode_rows, encode_column};
use crate::error::{BoxError, CallError, UdfError};
use crate::signature::Signature;

/// One value per input row.
#[async_trait]
pub trait Mapper: Send + Sync + Debug {
    /// The UDF's name, parameters and output field.
    fn signature(&self) -> &Signature;
    /// Returns one value per row of `input` (which holds the `params` columns), in order.
    async fn map(&self, input: RecordBatch) -> Result<ArrayRef, CallError>;
}

/// Wraps `async fn(I) -> Result<O, E>` as a [`Mapper`] reading `params`, writing `output`.
pub fn map_fn<I, O, E, F, Fut>(
    params: &[&str],
    output: &str,
    f: F,
) -> Result<Arc<dyn Mapper>, UdfError>
where
    I: DeserializeOwned + Send + 'static,
    O: Serialize + DeserializeOwned + Send + 'static,
    E: Into<BoxError> + 'static,
    F: Fn(I) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<O, E>> + Send,
{
    Ok(Arc::new(TypedMapper {
        signature: super::typed_signature::<F, I, O>(params, output)?,
        f,
        _types: PhantomData,
    }))
}

struct TypedMapper<I, O, F> {
    signature: Signature,
    f: F,
    _types: PhantomData<fn(I) -> O>,
}

impl<I, O, F> Debug for TypedMapper<I, O, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Mapper({})", self.signature.name)
    }
}

#[async_trait]
impl<I, O, E, F, Fut> Mapper for TypedMapper<I, O, F>
where
    I: DeserializeOwned + Send + 'static,
    O: Serialize + DeserializeOwned + Send + 'static,
    E: Into<BoxError> + 'static,
    F: Fn(I) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<O, E>> + Send,
{
    fn signature(&self) -> &Signature {
        &self.signature
    }

    async fn map(&self, input: RecordBatch) -> Result<ArrayRef, CallError> {
        let items: Vec<I> = decode_rows(&input, &self.signature.params)?;
        let mut out = Vec::with_capacity(items.len());
        for (row, item) in items.into_iter().enumerate() {
            out.push(
                (self.f)(item)
                    .await
                    .map_err(|e| CallError::at_row(row, e))?,
            );
        }
        Ok(encode_column(&self.signature.output, &out)?)
    }
}
