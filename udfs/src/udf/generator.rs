//! Generator: one row in, a stream of values out, never held whole in memory.

use std::fmt::Debug;
use std::marker::PhantomData;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, RecordBatch};
use futures::stream::{self, BoxStream, StreamExt, TryStreamExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Code, Lifecycle};
use crate::codec::{decode_rows, encode_column};
use crate::error::{BoxError, CallError, UdfError};
use crate::signature::Signature;

/// Expands one row into zero or more values, streamed in chunks.
pub trait Generator: Send + Sync + Debug {
    /// The UDF's name, parameters and output field.
    fn signature(&self) -> &Signature;
    /// `input` holds one row. The stream yields arrays of at most `max_rows` values;
    /// dropping it stops the generator.
    fn generate(
        &self,
        input: RecordBatch,
        max_rows: usize,
    ) -> BoxStream<'static, Result<ArrayRef, CallError>>;

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

/// Wraps `fn(I) -> impl Stream<Item = Result<O, E>>` as a [`Generator`].
pub fn gen_fn<I, O, E, F, S>(
    params: &[&str],
    output: &str,
    f: F,
) -> Result<Arc<dyn Generator>, UdfError>
where
    I: DeserializeOwned + Send + 'static,
    O: Serialize + DeserializeOwned + Send + 'static,
    E: Into<BoxError> + Send + 'static,
    F: Fn(I) -> S + Send + Sync + 'static,
    S: futures::Stream<Item = Result<O, E>> + Send + 'static,
{
    Ok(Arc::new(TypedGenerator {
        signature: super::typed_signature::<F, I, O>(params, output)?,
        f,
        _types: PhantomData,
    }))
}

struct TypedGenerator<I, O, F> {
    signature: Signature,
    f: F,
    _types: PhantomData<fn(I) -> O>,
}

impl<I, O, F> Debug for TypedGenerator<I, O, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Generator({})", self.signature.name)
    }
}

impl<I, O, E, F, S> Generator for TypedGenerator<I, O, F>
where
    I: DeserializeOwned + Send + 'static,
    O: Serialize + DeserializeOwned + Send + 'static,
    E: Into<BoxError> + Send + 'static,
    F: Fn(I) -> S + Send + Sync + 'static,
    S: futures::Stream<Item = Result<O, E>> + Send + 'static,
{
    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn generate(
        &self,
        input: RecordBatch,
        max_rows: usize,
    ) -> BoxStream<'static, Result<ArrayRef, CallError>> {
        let item = match decode_rows::<I>(&input, &self.signature.params) {
            Ok(mut items) if items.len() == 1 => items.remove(0),
            Ok(items) => {
                let e = UdfError::Contract(format!("generator got {} rows, not 1", items.len()));
                return stream::once(async move { Err(e.into()) }).boxed();
            }
            Err(e) => return stream::once(async move { Err(e.into()) }).boxed(),
        };
        let field = self.signature.output.clone();
        (self.f)(item)
            .map_err(|e| CallError::at_row(0, e))
            .try_chunks(max_rows.max(1))
            .map(move |chunk| match chunk {
                Ok(values) => Ok(encode_column(&field, &values)?),
                Err(e) => Err(e.1),
            })
            .boxed()
    }
}
