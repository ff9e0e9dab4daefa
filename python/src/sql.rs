//! SQL from Python: `uc.query(sql)` (a chain over a query's plan),
//! `uc.run(script)` (udfchain scripts: SET, CREATE DATASET, SELECT, ...) and
//! `uc.register(name, fn)`, which makes a Python function callable by name in
//! both, planned with prefetch in front as the built-in UDFs are.
//!
//! Guarantees: one script runner per process over the global session, so a
//! function registered once is known to every later query and script; `SET`
//! in a script lasts for the runner's life, as in the CLI.

use std::sync::{Arc, OnceLock};

use datafusion::arrow::datatypes::Field;
use datafusion::execution::FunctionRegistry;
use datafusion::logical_expr::Expr;
use datafusion::logical_expr::expr::ScalarFunction;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};
use udfchain::{Output, ScriptRunner, Session};

use crate::arrow::to_ipc;
use crate::chain::{PyChain, from_sql, output_field};
use crate::error::to_py;
use crate::expr::{PyExpr, operand};
use crate::runtime::{engine, wait};
use crate::udf::{InvokerInfo, PyUdf};

fn runner() -> &'static ScriptRunner {
    static RUNNER: OnceLock<ScriptRunner> = OnceLock::new();
    RUNNER.get_or_init(|| ScriptRunner::new(Session::global()))
}

/// A chain over the rows of `sql`.
#[pyfunction]
pub fn query(py: Python<'_>, sql: String) -> PyResult<PyChain> {
    engine()?;
    runner();
    from_sql(py, Session::global(), sql)
}

/// Runs a script; one item per statement: an IPC stream of rows or a message.
#[pyfunction]
pub fn run(py: Python<'_>, script: String) -> PyResult<Vec<Py<PyAny>>> {
    engine()?;
    let outputs = wait(py, async move { runner().run(&script).await })?.map_err(to_py)?;
    outputs
        .into_iter()
        .map(|o| match o {
            Output::Message(m) => Ok(PyString::new(py, &m).into_any().unbind()),
            Output::Table(batches) => {
                let schema = match batches.first() {
                    Some(b) => b.schema(),
                    None => Arc::new(datafusion::arrow::datatypes::Schema::empty()),
                };
                let ipc = to_ipc(&schema, &batches).map_err(to_py)?;
                Ok(PyBytes::new(py, &ipc).into_any().unbind())
            }
        })
        .collect()
}

/// Makes `name(column)` call the map invoker `invoke` in queries and scripts;
/// `output` is the IPC schema of its one output field (its name is replaced
/// by the column name the query gives).
#[pyfunction]
pub fn register(py: Python<'_>, name: &str, output: &[u8], invoke: Py<PyAny>) -> PyResult<()> {
    engine()?;
    let field = output_field(output)?;
    let info = InvokerInfo::of(invoke.bind(py))?;
    let invoke = Arc::new(invoke);
    let udf_name = name.to_string();
    runner()
        .register_map(name, false, move |param, out| {
            let f = Field::new(out, field.data_type().clone(), true);
            Ok(Arc::new(PyUdf::new(
                &udf_name,
                vec![param.to_string()],
                f,
                Arc::clone(&invoke),
                info,
            )))
        })
        .map_err(to_py)
}

/// `name(*args)` as an expression: a function of the session (the image
/// functions, the built-in UDFs such as `image_decode` and `sha256`, and
/// those `register`ed). A built-in UDF in a chain's expression is planned as
/// in a query, with prefetch in front, under the session's settings.
#[pyfunction]
pub fn function(name: &str, args: Vec<Bound<'_, PyAny>>) -> PyResult<PyExpr> {
    engine()?;
    runner();
    let f = Session::global().context().udf(name).map_err(|_| {
        PyValueError::new_err(format!(
            "no function {name} in this session (the image functions, the built-in UDFs, \
             and those given to udfchain.register)"
        ))
    })?;
    let args = args.iter().map(operand).collect::<PyResult<Vec<_>>>()?;
    Ok(PyExpr::of(Expr::ScalarFunction(ScalarFunction::new_udf(
        f, args,
    ))))
}
