//! BatchMapper: up to `batch_size` rows in, as many values out.

use std::fmt::Debug;
use std::marker::PhantomData;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{ArrayRef, RecordBatch};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Code, Lifecycle};
use crate::codec::{decode_rows, encode_column};
use crate::error::{BoxError, CallError, UdfError};
use crate::signature::Signature;

/// Many rows per call (a model over a batch of images); one value per row.
#[async_trait]
pub trait BatchMapper: Send + Sync + Debug {
    /// The UDF's name, parameters and output field.
    fn signature(&self) -> &Signature;
    /// Returns exactly one value per row of `input`, in order.
    async fn map_batch(&self, input: RecordBatch) -> Result<ArrayRef, CallError>;

    /// The UDF's setup and teardown, when it holds state (see [`Lifecycle`]).
    fn lifecycle(&self) -> Option<&dyn Lifecycle> {
        None
    }

    /// At most this many calls of the UDF at once in this process, when it
    /// says (besides the run's `parallel`).
    fn concurrency(&self) -> Option<usize> {
        None
    }

    /// The UDF's code, when it travels to cluster executors as code instead
    /// of by name (a Python function; see [`Code`]). Asked when a plan is
    /// sent to a cluster; an error fails that query.
    fn code(&self) -> Result<Option<Code>, UdfError> {
        Ok(None)
    }
}

/// Wraps `async fn(Vec<I>) -> Result<Vec<O>, E>` as a [`BatchMapper`]. The
/// function must return as many values as it was given.
pub fn batch_map_fn<I, O, E, F, Fut>(
    params: &[&str],
    output: &str,
    f: F,
) -> Result<Arc<dyn BatchMapper>, UdfError>
where
    I: DeserializeOwned + Send + 'static,
    O: Serialize + DeserializeOwned + Send + 'static,
    E: Into<BoxError> + 'static,
    F: Fn(Vec<I>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Vec<O>, E>> + Send,
{
    Ok(Arc::new(TypedBatchMapper {
        signature: super::typed_signature::<F, I, O>(params, output)?,
        f,
        _types: PhantomData,
    }))
}

struct TypedBatchMapper<I, O, F> {
    signature: Signature,
    f: F,
    _types: PhantomData<fn(I) -> O>,
}

impl<I, O, F> Debug for TypedBatchMapper<I, O, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BatchMapper({})", self.signature.name)
    }
}

#[async_trait]
impl<I, O, E, F, Fut> BatchMapper for TypedBatchMapper<I, O, F>
where
    I: DeserializeOwned + Send + 'static,
    O: Serialize + DeserializeOwned + Send + 'static,
    E: Into<BoxError> + 'static,
    F: Fn(Vec<I>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Vec<O>, E>> + Send,
{
    fn signature(&self) -> &Signature {
        &self.signature
    }

    async fn map_batch(&self, input: RecordBatch) -> Result<ArrayRef, CallError> {
        let items: Vec<I> = decode_rows(&input, &self.signature.params)?;
        let n = items.len();
        let out = (self.f)(items).await.map_err(CallError::whole)?;
        if out.len() != n {
            return Err(UdfError::Contract(format!(
                "batch UDF {} returned {} values for {n} rows",
                self.signature.name,
                out.len()
            ))
            .into());
        }
        Ok(encode_column(&self.signature.output, &out)?)
    }
}
