//! A UDF's life: `setup -> calls -> teardown`, for UDFs that hold state (a
//! model, a connection, a tokenizer) built once per worker instead of once
//! per call.
//!
//! A UDF with state answers [`Lifecycle`] from its kind's `lifecycle()`
//! method. The engine guarantees (see `docs/models.md`):
//! - `setup` runs lazily, before the first call of a run, once per process
//!   for all the runs of that UDF value in flight at once (their calls share
//!   the state); a call never runs before its setup finished;
//! - `teardown` runs exactly once per `setup` that succeeded, when the last
//!   run using it ends, however it ends (success, a UDF error, Ctrl-C, a
//!   dropped query); a failed setup is not torn down;
//! - a setup that fails fails the run (naming the UDF, with the setup's
//!   error), whatever `on_error` says, and is not retried within that run;
//! - at most `concurrency()` calls of the UDF run at once in the process
//!   (when it says), besides the run's `parallel`.
//!
//! [`State`] is the typed form for Rust: a setup function whose value the
//! calls borrow (`Arc<S>`) and that is dropped at teardown. [`map_with`],
//! [`batch_map_with`], [`gen_with`] and [`agg_with`] wrap a typed function
//! that takes the state as its first argument into a UDF of each kind.

use std::fmt::{self, Debug};
use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use datafusion::arrow::array::{ArrayRef, RecordBatch};
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{
    Aggregator, BatchMapper, EachRow, Generator, Mapper, agg_fn, batch_map_fn, fn_name, gen_fn,
    map_fn,
};
use crate::error::{BoxError, CallError, UdfError};
use crate::signature::Signature;

/// The setup and teardown of a UDF with state (see the module header for
/// when the engine calls them).
#[async_trait]
pub trait Lifecycle: Send + Sync {
    /// Builds the state. An error fails the run.
    async fn setup(&self) -> Result<(), BoxError>;
    /// Releases the state; called once after each `setup` that succeeded.
    /// It may block (the engine calls it off the I/O threads' hot path, once).
    fn teardown(&self);
}

type SetupFn<S> = Box<dyn Fn() -> BoxFuture<'static, Result<S, BoxError>> + Send + Sync>;

/// State of type `S` built by a setup function and dropped at teardown.
pub struct State<S> {
    name: String,
    setup: SetupFn<S>,
    value: RwLock<Option<Arc<S>>>,
}

impl<S> Debug for State<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "State({})", self.name)
    }
}

impl<S: Send + Sync + 'static> State<S> {
    /// The state of UDF `name`, built by `setup`.
    pub fn new<E, SF, SFut>(name: &str, setup: SF) -> Self
    where
        E: Into<BoxError> + 'static,
        SF: Fn() -> SFut + Send + Sync + 'static,
        SFut: Future<Output = Result<S, E>> + Send + 'static,
    {
        Self {
            name: name.to_string(),
            setup: Box::new(move || {
                let fut = setup();
                Box::pin(async move { fut.await.map_err(Into::into) })
            }),
            value: RwLock::new(None),
        }
    }

    /// The state, between its setup and its teardown.
    pub fn get(&self) -> Result<Arc<S>, UdfError> {
        self.value
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| {
                UdfError::Contract(format!(
                    "UDF {} was called without its state: run it through the engine, \
                     which calls its setup first",
                    self.name
                ))
            })
    }
}

#[async_trait]
impl<S: Send + Sync + 'static> Lifecycle for State<S> {
    async fn setup(&self) -> Result<(), BoxError> {
        let value = (self.setup)().await?;
        *self.value.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(value));
        Ok(())
    }

    /// Drops the state (at once, or when the last call holding it ends).
    fn teardown(&self) {
        self.value.write().unwrap_or_else(|e| e.into_inner()).take();
    }
}

/// A UDF of any kind with a [`Lifecycle`] and an optional bound on its
/// calls at once; it implements the trait of its kind `U`.
pub struct Stateful<U: ?Sized> {
    signature: Signature,
    udf: Arc<U>,
    life: Arc<dyn Lifecycle>,
    concurrency: Option<usize>,
}

impl<U: ?Sized> Debug for Stateful<U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Stateful({})", self.signature.name)
    }
}

impl<U: ?Sized> Stateful<U> {
    /// `udf` (whose signature is `signature`) with `life`'s setup and teardown.
    pub fn new(signature: Signature, udf: Arc<U>, life: Arc<dyn Lifecycle>) -> Self {
        Self {
            signature,
            udf,
            life,
            concurrency: None,
        }
    }

    /// At most `n` calls at once in this process (at least 1): e.g. two
    /// copies of a model's work at once, not `parallel` of them.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = Some(n.max(1));
        self
    }
}

macro_rules! into_udf {
    ($kind:ident) => {
        impl Stateful<dyn $kind> {
            /// This UDF as the engine takes it.
            pub fn into_udf(self) -> Arc<dyn $kind> {
                Arc::new(self)
            }
        }
    };
}
into_udf!(Mapper);
into_udf!(BatchMapper);
into_udf!(Generator);
into_udf!(Aggregator);

#[async_trait]
impl Mapper for Stateful<dyn Mapper> {
    fn signature(&self) -> &Signature {
        &self.signature
    }
    async fn map(&self, input: RecordBatch) -> Result<ArrayRef, CallError> {
        self.udf.map(input).await
    }
    async fn map_each(
        &self,
        input: RecordBatch,
        stop_at_error: bool,
    ) -> Result<EachRow, CallError> {
        self.udf.map_each(input, stop_at_error).await
    }
    fn lifecycle(&self) -> Option<&dyn Lifecycle> {
        Some(self.life.as_ref())
    }
    fn concurrency(&self) -> Option<usize> {
        self.concurrency
    }
}

#[async_trait]
impl BatchMapper for Stateful<dyn BatchMapper> {
    fn signature(&self) -> &Signature {
        &self.signature
    }
    async fn map_batch(&self, input: RecordBatch) -> Result<ArrayRef, CallError> {
        self.udf.map_batch(input).await
    }
    fn lifecycle(&self) -> Option<&dyn Lifecycle> {
        Some(self.life.as_ref())
    }
    fn concurrency(&self) -> Option<usize> {
        self.concurrency
    }
}

impl Generator for Stateful<dyn Generator> {
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn generate(
        &self,
        input: RecordBatch,
        max_rows: usize,
    ) -> BoxStream<'static, Result<ArrayRef, CallError>> {
        self.udf.generate(input, max_rows)
    }
    fn lifecycle(&self) -> Option<&dyn Lifecycle> {
        Some(self.life.as_ref())
    }
    fn concurrency(&self) -> Option<usize> {
        self.concurrency
    }
}

#[async_trait]
impl Aggregator for Stateful<dyn Aggregator> {
    fn signature(&self) -> &Signature {
        &self.signature
    }
    async fn aggregate(&self, group: RecordBatch) -> Result<ArrayRef, CallError> {
        self.udf.aggregate(group).await
    }
    fn lifecycle(&self) -> Option<&dyn Lifecycle> {
        Some(self.life.as_ref())
    }
    fn concurrency(&self) -> Option<usize> {
        self.concurrency
    }
}

/// `signature` named after `F` when it is a named fn (the wrapped closure
/// has no name of its own).
fn named<F>(mut signature: Signature, output: &str) -> Signature {
    signature.name = fn_name::<F>().unwrap_or(output).to_string();
    signature
}

/// The state of a UDF for column `output`, and a handle its calls read it by.
fn state_of<S, E, SF, SFut>(output: &str, setup: SF) -> (Arc<State<S>>, Arc<dyn Lifecycle>)
where
    S: Send + Sync + 'static,
    E: Into<BoxError> + 'static,
    SF: Fn() -> SFut + Send + Sync + 'static,
    SFut: Future<Output = Result<S, E>> + Send + 'static,
{
    let state = Arc::new(State::new(output, setup));
    let life = Arc::clone(&state) as Arc<dyn Lifecycle>;
    (state, life)
}

/// A [`Mapper`] of `async fn(Arc<S>, I) -> Result<O, E>` whose state `S` is
/// built by `setup` once per worker (see the module header).
///
/// ```
/// use std::sync::Arc;
/// use udfchain_udfs::map_with;
///
/// struct Model { bias: i64 }
/// let udf = map_with(
///     &["x"],
///     "y",
///     || async { Ok::<_, std::io::Error>(Model { bias: 1 }) }, // loaded once
///     |m: Arc<Model>, x: i64| async move { Ok::<_, std::io::Error>(x + m.bias) },
/// )
/// .expect("udf")
/// .concurrency(2)
/// .into_udf();
/// assert_eq!(udf.signature().output.name(), "y");
/// ```
pub fn map_with<S, I, O, E, SE, SF, SFut, F, Fut>(
    params: &[&str],
    output: &str,
    setup: SF,
    f: F,
) -> Result<Stateful<dyn Mapper>, UdfError>
where
    S: Send + Sync + 'static,
    I: DeserializeOwned + Send + 'static,
    O: Serialize + DeserializeOwned + Send + 'static,
    E: Into<BoxError> + 'static,
    SE: Into<BoxError> + 'static,
    SF: Fn() -> SFut + Send + Sync + 'static,
    SFut: Future<Output = Result<S, SE>> + Send + 'static,
    F: Fn(Arc<S>, I) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<O, E>> + Send + 'static,
{
    let (state, life) = state_of(output, setup);
    let f = Arc::new(f);
    let udf = map_fn(params, output, move |i: I| {
        let (s, f) = (state.get(), Arc::clone(&f));
        async move { f(s?, i).await.map_err(Into::<BoxError>::into) }
    })?;
    let signature = named::<F>(udf.signature().clone(), output);
    Ok(Stateful::new(signature, udf, life))
}

/// A [`BatchMapper`] of `async fn(Arc<S>, Vec<I>) -> Result<Vec<O>, E>`
/// with state built once per worker (see [`map_with`]).
pub fn batch_map_with<S, I, O, E, SE, SF, SFut, F, Fut>(
    params: &[&str],
    output: &str,
    setup: SF,
    f: F,
) -> Result<Stateful<dyn BatchMapper>, UdfError>
where
    S: Send + Sync + 'static,
    I: DeserializeOwned + Send + 'static,
    O: Serialize + DeserializeOwned + Send + 'static,
    E: Into<BoxError> + 'static,
    SE: Into<BoxError> + 'static,
    SF: Fn() -> SFut + Send + Sync + 'static,
    SFut: Future<Output = Result<S, SE>> + Send + 'static,
    F: Fn(Arc<S>, Vec<I>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Vec<O>, E>> + Send + 'static,
{
    let (state, life) = state_of(output, setup);
    let f = Arc::new(f);
    let udf = batch_map_fn(params, output, move |rows: Vec<I>| {
        let (s, f) = (state.get(), Arc::clone(&f));
        async move { f(s?, rows).await.map_err(Into::<BoxError>::into) }
    })?;
    let signature = named::<F>(udf.signature().clone(), output);
    Ok(Stateful::new(signature, udf, life))
}

/// An [`Aggregator`] of `async fn(Arc<S>, Vec<I>) -> Result<Vec<O>, E>`
/// with state built once per worker (see [`map_with`]).
pub fn agg_with<S, I, O, E, SE, SF, SFut, F, Fut>(
    params: &[&str],
    output: &str,
    setup: SF,
    f: F,
) -> Result<Stateful<dyn Aggregator>, UdfError>
where
    S: Send + Sync + 'static,
    I: DeserializeOwned + Send + 'static,
    O: Serialize + DeserializeOwned + Send + 'static,
    E: Into<BoxError> + 'static,
    SE: Into<BoxError> + 'static,
    SF: Fn() -> SFut + Send + Sync + 'static,
    SFut: Future<Output = Result<S, SE>> + Send + 'static,
    F: Fn(Arc<S>, Vec<I>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Vec<O>, E>> + Send + 'static,
{
    let (state, life) = state_of(output, setup);
    let f = Arc::new(f);
    let udf = agg_fn(params, output, move |rows: Vec<I>| {
        let (s, f) = (state.get(), Arc::clone(&f));
        async move { f(s?, rows).await.map_err(Into::<BoxError>::into) }
    })?;
    let signature = named::<F>(udf.signature().clone(), output);
    Ok(Stateful::new(signature, udf, life))
}

/// A [`Generator`] of `fn(Arc<S>, I) -> impl Stream<Item = Result<O, E>>`
/// with state built once per worker (see [`map_with`]).
pub fn gen_with<S, I, O, E, SE, SF, SFut, F, St>(
    params: &[&str],
    output: &str,
    setup: SF,
    f: F,
) -> Result<Stateful<dyn Generator>, UdfError>
where
    S: Send + Sync + 'static,
    I: DeserializeOwned + Send + 'static,
    O: Serialize + DeserializeOwned + Send + 'static,
    E: Into<BoxError> + Send + 'static,
    SE: Into<BoxError> + 'static,
    SF: Fn() -> SFut + Send + Sync + 'static,
    SFut: Future<Output = Result<S, SE>> + Send + 'static,
    F: Fn(Arc<S>, I) -> St + Send + Sync + 'static,
    St: futures::Stream<Item = Result<O, E>> + Send + 'static,
{
    use futures::StreamExt;
    let (state, life) = state_of(output, setup);
    let udf = gen_fn(params, output, move |i: I| match state.get() {
        Ok(s) => f(s, i)
            .map(|r| r.map_err(Into::<BoxError>::into))
            .left_stream(),
        Err(e) => futures::stream::once(async move { Err(BoxError::from(e)) }).right_stream(),
    })?;
    let signature = named::<F>(udf.signature().clone(), output);
    Ok(Stateful::new(signature, udf, life))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use datafusion::arrow::array::{AsArray, Int64Array};
    use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};

    use super::*;

    fn input(values: Vec<i64>) -> RecordBatch {
        let schema = Schema::new(vec![Field::new("x", DataType::Int64, false)]);
        RecordBatch::try_new(Arc::new(schema), vec![Arc::new(Int64Array::from(values))])
            .expect("batch")
    }

    /// Counts the models alive: built by setup, dropped at teardown.
    struct Model(Arc<AtomicUsize>);
    impl Drop for Model {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }

    async fn add_bias(m: Arc<Model>, x: i64) -> Result<i64, std::io::Error> {
        Ok(x + m.0.load(Ordering::SeqCst) as i64)
    }

    #[tokio::test]
    async fn calls_read_the_state_between_setup_and_teardown() {
        let alive = Arc::new(AtomicUsize::new(0));
        let a = Arc::clone(&alive);
        let udf = map_with(
            &["x"],
            "y",
            move || {
                let a = Arc::clone(&a);
                async move {
                    a.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, std::io::Error>(Model(a))
                }
            },
            add_bias,
        )
        .expect("udf")
        .concurrency(0)
        .into_udf();
        assert_eq!(udf.signature().name, "add_bias");
        assert_eq!(udf.concurrency(), Some(1), "a bound of 0 means 1");
        // Before setup: a clear error, not a panic.
        let err = udf.map(input(vec![1])).await.expect_err("no state yet");
        assert!(
            err.source.to_string().contains("without its state"),
            "{}",
            err.source
        );
        let life = udf.lifecycle().expect("a lifecycle");
        life.setup().await.expect("setup");
        assert_eq!(alive.load(Ordering::SeqCst), 1);
        let out = udf.map(input(vec![1, 2])).await.expect("map");
        assert_eq!(out.as_primitive::<Int64Type>().values(), &[2, 3]);
        life.teardown();
        assert_eq!(alive.load(Ordering::SeqCst), 0, "teardown drops the state");
    }

    #[tokio::test]
    async fn a_failing_setup_is_an_error_of_setup() {
        let udf = batch_map_with(
            &["x"],
            "y",
            || async { Err::<i64, _>(std::io::Error::other("no weights")) },
            |_: Arc<i64>, xs: Vec<i64>| async move { Ok::<_, std::io::Error>(xs) },
        )
        .expect("udf")
        .into_udf();
        let err = udf
            .lifecycle()
            .expect("life")
            .setup()
            .await
            .expect_err("fails");
        assert_eq!(err.to_string(), "no weights");
    }
}
