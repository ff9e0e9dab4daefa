//! Mapper: one row in, one value out.

use std::fmt::Debug;
use std::marker::PhantomData;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{Array, ArrayRef, RecordBatch, new_empty_array};
use datafusion::arrow::compute::concat;
use futures::FutureExt;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Code, Lifecycle};
use crate::codec::{decode_rows, encode_column};
use crate::error::{BoxError, CallError, UdfError, panic_error};
use crate::signature::Signature;

/// One value per input row.
#[async_trait]
pub trait Mapper: Send + Sync + Debug {
    /// The UDF's name, parameters and output field.
    fn signature(&self) -> &Signature;
    /// Returns one value per row of `input` (which holds the `params` columns), in order.
    async fn map(&self, input: RecordBatch) -> Result<ArrayRef, CallError>;

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

    /// Calls the UDF on each row of `input` as a call of its own, one row
    /// after another: a row's error or panic is that row's outcome and costs
    /// no other row anything. With `stop_at_error`, no row after the first
    /// failure is called. `Err` only when no row could be called at all
    /// (every row called fails with it).
    ///
    /// The default makes one [`map`](Self::map) call per row; [`map_fn`]'s
    /// UDFs convert the rows once for all of them.
    async fn map_each(
        &self,
        input: RecordBatch,
        stop_at_error: bool,
    ) -> Result<EachRow, CallError> {
        map_each_by_row(self, input, stop_at_error).await
    }
}

/// [`Mapper::map_each`] by one [`Mapper::map`] call per row.
async fn map_each_by_row<M: Mapper + ?Sized>(
    udf: &M,
    input: RecordBatch,
    stop_at_error: bool,
) -> Result<EachRow, CallError> {
    let calls = (0..input.num_rows()).map(|r| {
        let row = input.slice(r, 1);
        async move {
            let v = udf.map(row).await.map_err(|e| CallError::whole(e.source))?;
            if v.len() != 1 {
                return Err(CallError::whole(UdfError::Contract(format!(
                    "map returned {} values for 1 row",
                    v.len()
                ))));
            }
            Ok(v)
        }
    });
    let (values, outcomes) = call_each(calls, stop_at_error).await;
    Ok(EachRow {
        values: concat_values(udf.signature(), &values)?,
        outcomes,
    })
}

/// Awaits `calls` one after another, each a row's own call: its error or
/// panic is that row's outcome. With `stop_at_error`, no call after the
/// first failure is made. The values of the calls that succeeded, in order,
/// and each call's outcome.
async fn call_each<T, Fut>(
    calls: impl IntoIterator<Item = Fut>,
    stop_at_error: bool,
) -> (Vec<T>, Vec<Result<(), CallError>>)
where
    Fut: Future<Output = Result<T, CallError>>,
{
    let calls = calls.into_iter();
    let mut values = Vec::with_capacity(calls.size_hint().0);
    let mut outcomes = Vec::with_capacity(calls.size_hint().0);
    for call in calls {
        let outcome = match AssertUnwindSafe(call).catch_unwind().await {
            Ok(Ok(v)) => {
                values.push(v);
                Ok(())
            }
            Ok(Err(e)) => Err(e),
            Err(p) => Err(CallError::whole(panic_error(p))),
        };
        let stop = outcome.is_err() && stop_at_error;
        outcomes.push(outcome);
        if stop {
            break;
        }
    }
    (values, outcomes)
}

/// One array of `values` (empty, of the output's type, when there are none).
fn concat_values(signature: &Signature, values: &[ArrayRef]) -> Result<ArrayRef, CallError> {
    match values {
        [] => Ok(new_empty_array(signature.output.data_type())),
        vs => concat(&vs.iter().map(|v| v.as_ref()).collect::<Vec<&dyn Array>>())
            .map_err(CallError::whole),
    }
}

/// What [`Mapper::map_each`] returns: an outcome for each row called, in
/// order (fewer than the input's rows when it stopped at an error), and the
/// values of the rows whose outcome is `Ok`, in the same order.
#[derive(Debug)]
pub struct EachRow {
    /// One value per `Ok` in `outcomes`.
    pub values: ArrayRef,
    /// Each called row's outcome (its error names no row: it is the row's own).
    pub outcomes: Vec<Result<(), CallError>>,
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

    /// One conversion of `input` and one of the values, each row's call its
    /// own (a panic is caught per row). Rows that do not convert together
    /// (one of them does not fit `I`) are converted and called one by one.
    async fn map_each(
        &self,
        input: RecordBatch,
        stop_at_error: bool,
    ) -> Result<EachRow, CallError> {
        let Ok(items) = decode_rows::<I>(&input, &self.signature.params) else {
            return map_each_by_row(self, input, stop_at_error).await;
        };
        let calls = items
            .into_iter()
            .map(|item| async { (self.f)(item).await.map_err(CallError::whole) });
        let (out, mut outcomes) = call_each(calls, stop_at_error).await;
        if let Ok(values) = encode_column(&self.signature.output, &out) {
            return Ok(EachRow { values, outcomes });
        }
        // Some value does not convert: that row's outcome is the error.
        let called_ok = outcomes.iter_mut().filter(|o| o.is_ok());
        let mut values = Vec::with_capacity(out.len());
        for (outcome, value) in called_ok.zip(&out) {
            match encode_column(&self.signature.output, std::slice::from_ref(value)) {
                Ok(v) => values.push(v),
                Err(e) => *outcome = Err(CallError::whole(e)),
            }
        }
        Ok(EachRow {
            values: concat_values(&self.signature, &values)?,
            outcomes,
        })
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{AsArray, Int64Array};
    use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};

    use super::*;

    fn input(values: Vec<i64>) -> RecordBatch {
        let schema = Schema::new(vec![Field::new("x", DataType::Int64, false)]);
        RecordBatch::try_new(Arc::new(schema), vec![Arc::new(Int64Array::from(values))])
            .expect("batch")
    }

    /// x * 10; an error at 3, a panic at 5.
    fn tens() -> Arc<dyn Mapper> {
        map_fn(&["x"], "y", |x: i64| async move {
            match x {
                3 => Err(UdfError::Contract("three".into())),
                5 => panic!("five"),
                x => Ok(x * 10),
            }
        })
        .expect("map_fn")
    }

    /// `tens` through the trait's default `map_each` (one `map` per row).
    #[derive(Debug)]
    struct ByRow(Arc<dyn Mapper>);

    #[async_trait]
    impl Mapper for ByRow {
        fn signature(&self) -> &Signature {
            self.0.signature()
        }
        async fn map(&self, input: RecordBatch) -> Result<ArrayRef, CallError> {
            self.0.map(input).await
        }
    }

    fn summary(each: &EachRow) -> (Vec<i64>, Vec<Option<String>>) {
        let values = each.values.as_primitive::<Int64Type>().values().to_vec();
        let errors = each
            .outcomes
            .iter()
            .map(|o| o.as_ref().err().map(|e| e.source.to_string()))
            .collect();
        (values, errors)
    }

    #[tokio::test]
    async fn map_each_gives_each_row_its_own_outcome_typed_or_by_default() {
        for udf in [tens(), Arc::new(ByRow(tens())) as Arc<dyn Mapper>] {
            let each = udf
                .map_each(input(vec![1, 3, 4, 5, 6]), false)
                .await
                .expect("rows called");
            let (values, errors) = summary(&each);
            assert_eq!(values, vec![10, 40, 60], "{udf:?}");
            assert_eq!(
                errors,
                vec![
                    None,
                    Some("three".into()),
                    None,
                    Some("panicked: five".into()),
                    None
                ],
                "{udf:?}"
            );
            // Stopping at the first error calls no row after it.
            let each = udf
                .map_each(input(vec![1, 2, 3, 4]), true)
                .await
                .expect("rows called");
            let (values, errors) = summary(&each);
            assert_eq!(values, vec![10, 20], "{udf:?}");
            assert_eq!(errors, vec![None, None, Some("three".into())], "{udf:?}");
            // No row fails: every value, and an all-error input gives none.
            let each = udf.map_each(input(vec![7, 8]), false).await.expect("rows");
            assert_eq!(summary(&each), (vec![70, 80], vec![None, None]));
            let each = udf.map_each(input(vec![3]), false).await.expect("rows");
            assert_eq!(summary(&each).0, Vec::<i64>::new());
        }
    }
}
