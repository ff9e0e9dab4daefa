//! `PyUdf`: a Python function as a udfchain UDF, one type for the four kinds
//! (it implements `Mapper`, `BatchMapper`, `Aggregator` and `Generator`).
//!
//! The engine calls it on its UDF pool, as any UDF. Guarantees: the Python
//! function runs on a blocking thread of that pool that takes the GIL for the
//! call (one call per row of files for map and gen, per batch for batch_map,
//! per group for agg) and gives it up around every wait (file reads, a full
//! generator channel); the pool's I/O threads never wait for the GIL. A Python
//! exception becomes the call's error with the row it names and the
//! traceback in the message, so `on_error` treats it as any UDF error; an
//! output of the wrong type or length is an error naming the UDF.
//!
//! The Python side (`udfchain/_udf.py`'s `Invoker`) gets the call's rows as
//! Python lists when every column is of a plain type (`values.rs`: no pyarrow
//! on the per-file path) and returns its values, which this side converts
//! when their type is plain; otherwise, and for worker processes, the rows go
//! as an Arrow IPC stream and the output comes back as one.

use std::fmt;
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use datafusion::arrow::array::{ArrayRef, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field};
use futures::stream::{self, BoxStream, StreamExt};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString};
use tokio::runtime::Handle;
use tokio::sync::mpsc;
use udfchain::Udf;
use udfchain::udfs::engine::current_source;
use udfchain::udfs::{
    Aggregator, BatchMapper, BoxError, CallError, Code, Generator, Lifecycle, Mapper, Signature,
    UdfError,
};

use crate::arrow::{column_from_ipc, to_ipc};
use crate::calls::{self, Abandon};
use crate::file::FileAccess;
use crate::values;

/// A Python exception raised by a UDF, with its traceback.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct PythonError(pub String);

pub struct PyUdf {
    signature: Signature,
    /// `invoke(ipc: bytes, files: FileAccess) -> bytes` for map, batch_map and
    /// agg; `invoke(ipc, files, max_rows) -> iterator of bytes` for gen.
    invoke: Arc<Py<PyAny>>,
    info: InvokerInfo,
    /// `invoke.setup()` / `invoke.teardown()`, when `info.stateful`.
    life: Option<PyLife>,
    /// `ship() -> bytes`: the UDF's code for cluster executors (`_ship.ship`
    /// bound to the UDF's parts), asked once, when a plan first goes to a
    /// cluster; `None` on an executor (its UDFs never travel on).
    ship: Option<Arc<Py<PyAny>>>,
    code: OnceLock<Result<Code, String>>,
}

/// What the engine asks of an invoker once, where the GIL is held.
#[derive(Debug, Clone, Copy, Default)]
pub struct InvokerInfo {
    /// `invoke` also takes Python lists (`values(cols, files)`, `gen(cols,
    /// files, max_rows)`), answers with values (a list, or IPC bytes when it
    /// encoded them itself) and converts what this side does not
    /// (`encode(values)`): `_udf.Invoker` and the worker pool's `Remote`.
    direct: bool,
    /// `invoke.stateful` is true: it has `setup()` and `teardown()` for the
    /// engine to call once per run (a class UDF, `Chain.setup` values).
    stateful: bool,
    /// `invoke.concurrency`: at most this many calls at once.
    concurrency: Option<usize>,
}

impl InvokerInfo {
    /// Asks `invoke` (see the fields).
    pub fn of<'py>(invoke: &Bound<'py, PyAny>) -> PyResult<Self> {
        let py = invoke.py();
        let direct = [
            intern!(py, "values"),
            intern!(py, "gen"),
            intern!(py, "encode"),
        ]
        .iter()
        .all(|m| invoke.hasattr(m).unwrap_or(false));
        let attr = |name: &Bound<'py, PyString>| -> PyResult<Option<Bound<'py, PyAny>>> {
            if invoke.hasattr(name)? {
                Ok(Some(invoke.getattr(name)?))
            } else {
                Ok(None)
            }
        };
        let stateful = match attr(intern!(py, "stateful"))? {
            Some(v) => v.is_truthy()?,
            None => false,
        };
        let concurrency = match attr(intern!(py, "concurrency"))? {
            Some(v) if !v.is_none() => Some(v.extract::<usize>()?.max(1)),
            _ => None,
        };
        Ok(Self {
            direct,
            stateful,
            concurrency,
        })
    }
}

/// The setup and teardown of a stateful invoker: `invoke.setup()` on a
/// blocking thread (a failure with its traceback), `invoke.teardown()` once
/// after each setup that succeeded.
struct PyLife {
    name: String,
    invoke: Arc<Py<PyAny>>,
}

#[async_trait]
impl Lifecycle for PyLife {
    async fn setup(&self) -> Result<(), BoxError> {
        let invoke = Arc::clone(&self.invoke);
        tokio::task::spawn_blocking(move || {
            Python::attach(|py| match invoke.bind(py).call_method0("setup") {
                Ok(_) => Ok(()),
                Err(e) => Err(PyUdf::failure(py, e).source),
            })
        })
        .await
        .map_err(|e| -> BoxError { format!("Python setup failed: {e}").into() })?
    }

    fn teardown(&self) {
        Python::attach(|py| {
            if let Err(e) = self.invoke.bind(py).call_method0("teardown") {
                let text = PyUdf::failure(py, e).source;
                eprintln!("udfchain: the teardown of UDF {} failed: {text}", self.name);
            }
        })
    }
}

/// What a call returned: an array built here, or pyarrow's IPC stream.
enum Output {
    Array(ArrayRef),
    Ipc(Vec<u8>),
}

/// The rows of one call as the invoker takes them.
enum Input {
    /// Every column is plain: Python lists are built under the GIL.
    Rows(RecordBatch),
    Ipc(Vec<u8>),
}

impl Input {
    fn of(input: RecordBatch, direct: bool) -> Result<Self, CallError> {
        if direct && values::plain_batch(&input) {
            Ok(Self::Rows(input))
        } else {
            ipc_of(&input).map(Self::Ipc)
        }
    }

    /// The rows as the call's first argument: a list of columns, or IPC bytes.
    fn arg<'py>(
        &self,
        py: Python<'py>,
        files: &Bound<'py, FileAccess>,
    ) -> PyResult<Bound<'py, PyAny>> {
        Ok(match self {
            Self::Rows(batch) => values::columns(py, batch, files.as_any())?.into_any(),
            Self::Ipc(ipc) => PyBytes::new(py, ipc).into_any(),
        })
    }

    /// The invoker's method for these rows: `values`/`gen` for lists, the
    /// invoker itself for IPC.
    fn method<'py>(
        &self,
        invoke: &Bound<'py, PyAny>,
        list_method: &Bound<'py, PyString>,
    ) -> PyResult<Bound<'py, PyAny>> {
        match self {
            Self::Rows(_) => invoke.getattr(list_method),
            Self::Ipc(_) => Ok(invoke.clone()),
        }
    }
}

/// Values from the invoker (a list, or IPC bytes it encoded) as an output:
/// a list of a plain type is converted here, any other goes to `encode`.
fn output_of(
    py: Python<'_>,
    invoke: &Bound<'_, PyAny>,
    out: Bound<'_, PyAny>,
    want: &DataType,
) -> PyResult<Output> {
    let Ok(list) = out.cast::<PyList>() else {
        return Ok(Output::Ipc(out.extract()?));
    };
    if let Some(array) = values::array(list, want) {
        return Ok(Output::Array(array));
    }
    let ipc = invoke.call_method1(intern!(py, "encode"), (out,))?;
    Ok(Output::Ipc(ipc.extract()?))
}

impl fmt::Debug for PyUdf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PyUdf({})", self.signature.name)
    }
}

impl PyUdf {
    /// `info`: what [`InvokerInfo::of`] said of `invoke`.
    pub fn new(
        name: &str,
        params: Vec<String>,
        output: Field,
        invoke: Arc<Py<PyAny>>,
        info: InvokerInfo,
    ) -> Self {
        let life = info.stateful.then(|| PyLife {
            name: name.to_string(),
            invoke: Arc::clone(&invoke),
        });
        Self {
            signature: Signature {
                name: name.to_string(),
                params,
                input: None,
                output,
            },
            invoke,
            info,
            life,
            ship: None,
            code: OnceLock::new(),
        }
    }

    /// This UDF as the engine's `Udf` of `kind` (`map`, `gen`, `batch_map`,
    /// `agg` grouped by `partition_by`); `None` for another kind.
    pub fn of_kind(self: Arc<Self>, kind: &str, partition_by: Vec<String>) -> Option<Udf> {
        Some(match kind {
            "map" => Udf::Map(self),
            "gen" => Udf::Gen(self),
            "batch_map" => Udf::BatchMap(self),
            "agg" => Udf::Agg {
                udf: self,
                partition_by,
            },
            _ => return None,
        })
    }

    /// Sends the UDF to cluster executors as what `ship()` returns.
    pub fn with_ship(mut self, ship: Py<PyAny>) -> Self {
        self.ship = Some(Arc::new(ship));
        self
    }

    /// The UDF's code (see `ship`), pickled once.
    fn code(&self) -> Result<Option<Code>, UdfError> {
        let Some(ship) = &self.ship else {
            return Ok(None);
        };
        let made = self.code.get_or_init(|| {
            Python::attach(|py| match ship.bind(py).call0() {
                Ok(b) => b
                    .extract::<Vec<u8>>()
                    .map(|bytes| Code {
                        runtime: crate::cluster::RUNTIME.to_string(),
                        bytes: bytes.into(),
                    })
                    .map_err(|e| e.to_string()),
                Err(e) => Err(Self::failure(py, e).source.to_string()),
            })
        });
        made.clone().map(Some).map_err(UdfError::Contract)
    }

    /// The error of a Python exception: `row` from a `UdfFailure` (the
    /// invoker's wrapper of the user's exception), the message with traceback.
    fn failure(py: Python<'_>, e: PyErr) -> CallError {
        let value = e.value(py);
        let row = value
            .getattr("row")
            .ok()
            .and_then(|r| r.extract::<Option<usize>>().ok())
            .flatten();
        let text = value
            .getattr("text")
            .ok()
            .and_then(|t| t.extract::<String>().ok())
            .unwrap_or_else(|| {
                format!(
                    "{}: {}",
                    e.get_type(py)
                        .name()
                        .map(|n| n.to_string())
                        .unwrap_or_default(),
                    value
                )
            });
        let mut source: BoxError = Box::new(PythonError(text));
        // `UdfFailure.setup`: the UDF's setup failed (in a worker process).
        let setup = value.getattr("setup").and_then(|s| s.is_truthy());
        if setup.unwrap_or(false) {
            source = Box::new(UdfError::Setup { source });
        }
        CallError { row, source }
    }

    /// The output column from the invoker's IPC bytes or built array,
    /// checked against the declared type and `rows` (when the kind fixes it).
    fn output(&self, out: Output, rows: Option<usize>) -> Result<ArrayRef, CallError> {
        let array = match out {
            Output::Array(a) => a,
            Output::Ipc(bytes) => column_from_ipc(&bytes).map_err(|e| UdfError::Convert {
                what: format!("the output of {}", self.signature.name),
                message: e.to_string(),
            })?,
        };
        let want = self.signature.output.data_type();
        if array.data_type() != want {
            return Err(UdfError::Contract(format!(
                "UDF {} returned {} values, declared {want}",
                self.signature.name,
                array.data_type()
            ))
            .into());
        }
        if let Some(n) = rows
            && array.len() != n
        {
            return Err(UdfError::Contract(format!(
                "UDF {} returned {} values for {n} rows",
                self.signature.name,
                array.len()
            ))
            .into());
        }
        Ok(array)
    }

    /// One call of map, batch_map or agg, holding the GIL.
    fn invoke(
        py: Python<'_>,
        invoke: &Py<PyAny>,
        input: &Input,
        files: &Bound<'_, FileAccess>,
        want: &DataType,
    ) -> PyResult<Output> {
        let invoke = invoke.bind(py);
        let method = input.method(invoke, intern!(py, "values"))?;
        let out = method.call1((input.arg(py, files)?, files))?;
        output_of(py, invoke, out, want)
    }

    /// One call: `input` to the invoker on a blocking thread holding the GIL.
    async fn call(&self, input: RecordBatch, rows: Option<usize>) -> Result<ArrayRef, CallError> {
        let abandon = Abandon::default();
        let files = FileAccess::new(current_source()?, Handle::current(), abandon.clone());
        let input = Input::of(input, self.info.direct)?;
        let invoke = Arc::clone(&self.invoke);
        let want = self.signature.output.data_type().clone();
        let _unwanted_when_dropped = abandon.guard();
        let out = tokio::task::spawn_blocking(move || {
            let _running = calls::enter(&abandon).map_err(CallError::whole)?;
            Python::attach(|py| {
                let files = Bound::new(py, files).map_err(|e| Self::failure(py, e))?;
                let result = Self::invoke(py, &invoke, &input, &files, &want);
                files.get().close();
                result.map_err(|e| Self::failure(py, e))
            })
        })
        .await
        .map_err(|e| CallError::whole(UdfError::Contract(format!("Python call failed: {e}"))))??;
        self.output(out, rows)
    }
}

fn ipc_of(input: &RecordBatch) -> Result<Vec<u8>, CallError> {
    to_ipc(&input.schema(), std::slice::from_ref(input)).map_err(|e| {
        CallError::whole(UdfError::Convert {
            what: "a UDF's input".into(),
            message: e.to_string(),
        })
    })
}

#[async_trait]
impl Mapper for PyUdf {
    fn signature(&self) -> &Signature {
        &self.signature
    }

    async fn map(&self, input: RecordBatch) -> Result<ArrayRef, CallError> {
        let n = input.num_rows();
        self.call(input, Some(n)).await
    }

    fn lifecycle(&self) -> Option<&dyn Lifecycle> {
        self.life.as_ref().map(|l| l as &dyn Lifecycle)
    }

    fn concurrency(&self) -> Option<usize> {
        self.info.concurrency
    }

    fn code(&self) -> Result<Option<Code>, UdfError> {
        PyUdf::code(self)
    }
}

#[async_trait]
impl BatchMapper for PyUdf {
    fn signature(&self) -> &Signature {
        &self.signature
    }

    async fn map_batch(&self, input: RecordBatch) -> Result<ArrayRef, CallError> {
        let n = input.num_rows();
        self.call(input, Some(n)).await
    }

    fn lifecycle(&self) -> Option<&dyn Lifecycle> {
        self.life.as_ref().map(|l| l as &dyn Lifecycle)
    }

    fn concurrency(&self) -> Option<usize> {
        self.info.concurrency
    }

    fn code(&self) -> Result<Option<Code>, UdfError> {
        PyUdf::code(self)
    }
}

#[async_trait]
impl Aggregator for PyUdf {
    fn signature(&self) -> &Signature {
        &self.signature
    }

    async fn aggregate(&self, group: RecordBatch) -> Result<ArrayRef, CallError> {
        self.call(group, None).await
    }

    fn lifecycle(&self) -> Option<&dyn Lifecycle> {
        self.life.as_ref().map(|l| l as &dyn Lifecycle)
    }

    fn concurrency(&self) -> Option<usize> {
        self.info.concurrency
    }

    fn code(&self) -> Result<Option<Code>, UdfError> {
        PyUdf::code(self)
    }
}

impl Generator for PyUdf {
    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn lifecycle(&self) -> Option<&dyn Lifecycle> {
        self.life.as_ref().map(|l| l as &dyn Lifecycle)
    }

    fn concurrency(&self) -> Option<usize> {
        self.info.concurrency
    }

    fn code(&self) -> Result<Option<Code>, UdfError> {
        PyUdf::code(self)
    }

    /// The Python generator runs on a blocking thread and sends each chunk of
    /// at most `max_rows` values through a channel of two; dropping the stream
    /// closes the channel, which stops the generator at its next chunk, and
    /// marks the call cancelled (`FileAccess.cancelled()`).
    fn generate(
        &self,
        input: RecordBatch,
        max_rows: usize,
    ) -> BoxStream<'static, Result<ArrayRef, CallError>> {
        let source = match current_source() {
            Ok(s) => s,
            Err(e) => return stream::once(async move { Err(e.into()) }).boxed(),
        };
        let input = match Input::of(input, self.info.direct) {
            Ok(i) => i,
            Err(e) => return stream::once(async move { Err(e) }).boxed(),
        };
        // Set when the stream is dropped (its guard lives in the stream's state).
        let abandon = Abandon::default();
        let files = FileAccess::new(source, Handle::current(), abandon.clone());
        let unwanted_when_dropped = abandon.guard();
        let (tx, rx) = mpsc::channel::<Result<Output, CallError>>(2);
        let invoke = Arc::clone(&self.invoke);
        let want = self.signature.output.data_type().clone();
        let thread = tokio::task::spawn_blocking(move || {
            if tx.is_closed() {
                return; // the stream was dropped before the call started
            }
            let _running = match calls::enter(&abandon) {
                Ok(r) => r,
                Err(e) => return drop(tx.blocking_send(Err(CallError::whole(e)))),
            };
            Python::attach(|py| {
                let files = match Bound::new(py, files) {
                    Ok(f) => f,
                    Err(e) => return drop(tx.blocking_send(Err(Self::failure(py, e)))),
                };
                let run = || -> PyResult<()> {
                    let invoke = invoke.bind(py);
                    let method = input.method(invoke, intern!(py, "gen"))?;
                    let chunks = method
                        .call1((input.arg(py, &files)?, &files, max_rows.max(1)))?
                        .try_iter()?;
                    for chunk in chunks {
                        let out = output_of(py, invoke, chunk?, &want)?;
                        if py.detach(|| tx.blocking_send(Ok(out))).is_err() {
                            break; // the stream was dropped
                        }
                    }
                    Ok(())
                };
                let result = run();
                files.get().close();
                if let Err(e) = result {
                    let failure = Self::failure(py, e);
                    py.detach(|| drop(tx.blocking_send(Err(failure))));
                }
            })
        });
        let this = Self {
            signature: self.signature.clone(),
            invoke: Arc::clone(&self.invoke),
            info: self.info,
            life: None,
            ship: None,
            code: OnceLock::new(),
        };
        stream::unfold(
            (rx, Some(thread), this, unwanted_when_dropped),
            |(mut rx, thread, this, guard)| async move {
                match rx.recv().await {
                    Some(Ok(out)) => Some((this.output(out, None), (rx, thread, this, guard))),
                    Some(Err(e)) => Some((Err(e), (rx, thread, this, guard))),
                    None => {
                        // The thread ended: a panic there is this call's error.
                        let joined = match thread {
                            Some(t) => t.await,
                            None => return None,
                        };
                        match joined {
                            Ok(()) => None,
                            Err(e) => Some((
                                Err(CallError::whole(UdfError::Contract(format!(
                                    "Python generator failed: {e}"
                                )))),
                                (rx, None, this, guard),
                            )),
                        }
                    }
                }
            },
        )
        .boxed()
    }
}
