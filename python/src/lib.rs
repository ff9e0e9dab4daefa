//! `udfchain._internal`: the engine's Python bindings (pyo3, an abi3 module for
//! CPython 3.10 and later), used by the `udfchain` Python package, which gives
//! them DataChain's names. Layers: `runtime` (the one runtime every call waits
//! on, Ctrl-C, fork), `calls` (Python calls from engine threads, interpreter
//! exit), `arrow` (Arrow across the boundary as IPC) and `values` (as Python
//! lists, for plain types), `error`; `file` and `udf`
//! (Python functions as engine UDFs, reading through the engine's file
//! source); `expr`, `chain`, `sql` and `loader` (what Python builds and runs);
//! `thumb` (native thumbnails for notebook display); `cluster` (the Python
//! executor, and the cluster session a chain's `cluster` setting names).
//! Everything here uses the engine's public API only.

mod arrow;
mod calls;
mod chain;
mod cluster;
mod error;
mod expr;
mod file;
mod loader;
mod runtime;
mod sql;
mod thumb;
mod udf;
mod values;

use pyo3::prelude::*;

#[pymodule]
fn _internal(m: &Bound<'_, PyModule>) -> PyResult<()> {
    error::add_classes(m)?;
    m.add_class::<chain::PyChain>()?;
    m.add_class::<chain::ResultStream>()?;
    m.add_class::<expr::PyExpr>()?;
    m.add_class::<file::FileAccess>()?;
    m.add_class::<loader::PyLoader>()?;
    m.add_class::<loader::Batches>()?;
    m.add_function(wrap_pyfunction!(expr::col, m)?)?;
    m.add_function(wrap_pyfunction!(expr::literal, m)?)?;
    m.add_function(wrap_pyfunction!(expr::aggregate, m)?)?;
    m.add_function(wrap_pyfunction!(chain::read_storage, m)?)?;
    m.add_function(wrap_pyfunction!(chain::read_arrow, m)?)?;
    m.add_function(wrap_pyfunction!(chain::read_parquet, m)?)?;
    m.add_function(wrap_pyfunction!(chain::read_csv, m)?)?;
    m.add_function(wrap_pyfunction!(chain::read_json, m)?)?;
    m.add_function(wrap_pyfunction!(chain::read_dataset, m)?)?;
    m.add_function(wrap_pyfunction!(chain::dataset_info, m)?)?;
    m.add_function(wrap_pyfunction!(sql::query, m)?)?;
    m.add_function(wrap_pyfunction!(sql::run, m)?)?;
    m.add_function(wrap_pyfunction!(sql::register, m)?)?;
    m.add_function(wrap_pyfunction!(sql::function, m)?)?;
    m.add_function(wrap_pyfunction!(calls::shutdown, m)?)?;
    m.add_function(wrap_pyfunction!(cluster::cluster_executor, m)?)?;
    m.add_function(wrap_pyfunction!(cluster::cluster_scheduler, m)?)?;
    m.add_function(wrap_pyfunction!(cluster::connect, m)?)?;
    m.add_function(wrap_pyfunction!(cluster::version, m)?)?;
    m.add_function(wrap_pyfunction!(thumb::image_thumbnail_jpeg, m)?)?;
    Ok(())
}
