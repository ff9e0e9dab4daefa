//! How engine errors reach Python: exception classes a user catches by kind,
//! all subclasses of `udfchain.UdfchainError`, whose message is the engine's
//! one-line error (a UDF failure names the UDF, the file and the row, and
//! carries the Python traceback of the UDF).
//!
//! Guarantees: [`to_py`] raises the class of the error's kind —
//! `UdfError` (a UDF failed for a row, or its setup failed), `StorageError`
//! (a store or local file could not be listed, read or written, or a URI
//! names no store), `DatasetNotFound` (no dataset of that name, or no such
//! version), `SettingError` (a setting name or value that is not accepted) —
//! and `UdfchainError` itself for every other engine error. `SettingError`
//! is also a `ValueError`, which `settings(processes=...)` raised before the
//! classes existed, so code that caught that keeps working.

use std::any::Any;
use std::fmt::Display;

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

create_exception!(
    udfchain,
    UdfchainError,
    PyException,
    "An error of the udfchain engine; the base of every exception class udfchain raises."
);

/// The kinds of error a Python user can catch apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Udf,
    Storage,
    DatasetNotFound,
    Setting,
    Other,
}

/// The subclasses of `UdfchainError` (made at module init, see [`add_classes`]).
struct Classes {
    udf: Py<PyType>,
    storage: Py<PyType>,
    dataset_not_found: Py<PyType>,
    setting: Py<PyType>,
}

static CLASSES: PyOnceLock<Classes> = PyOnceLock::new();

/// `class name(*bases)` in module `udfchain`, with docstring `doc`.
fn subclass<'py>(
    py: Python<'py>,
    name: &str,
    bases: &[Bound<'py, PyType>],
    doc: &str,
) -> PyResult<Py<PyType>> {
    let ns = PyDict::new(py);
    ns.set_item("__doc__", doc)?;
    ns.set_item("__module__", "udfchain")?;
    let t = py
        .get_type::<PyType>()
        .call1((name, PyTuple::new(py, bases)?, ns))?;
    Ok(t.cast_into::<PyType>()?.unbind())
}

fn classes(py: Python<'_>) -> PyResult<&Classes> {
    CLASSES.get_or_try_init(py, || {
        let base = py.get_type::<UdfchainError>();
        Ok::<_, PyErr>(Classes {
            udf: subclass(
                py,
                "UdfError",
                std::slice::from_ref(&base),
                "A UDF failed for a row (its exception, with the traceback, is in the \
                 message, which names the UDF, the file and the row), or its setup failed.",
            )?,
            storage: subclass(
                py,
                "StorageError",
                std::slice::from_ref(&base),
                "A store or a local file could not be listed, read or written, or a URI \
                 names no store udfchain can open.",
            )?,
            dataset_not_found: subclass(
                py,
                "DatasetNotFound",
                std::slice::from_ref(&base),
                "No dataset of that name, or no such version of it.",
            )?,
            setting: subclass(
                py,
                "SettingError",
                &[base, py.get_type::<PyValueError>()],
                "A setting name or value that is not accepted (an unknown name suggests \
                 the closest one). Also a ValueError.",
            )?,
        })
    })
}

/// Adds `UdfchainError` and its subclasses to module `m`.
pub fn add_classes(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("UdfchainError", py.get_type::<UdfchainError>())?;
    let c = classes(py)?;
    m.add("UdfError", c.udf.bind(py))?;
    m.add("StorageError", c.storage.bind(py))?;
    m.add("DatasetNotFound", c.dataset_not_found.bind(py))?;
    m.add("SettingError", c.setting.bind(py))?;
    Ok(())
}

/// The kind of an engine error (a script's error is its statement's).
pub fn kind_of(e: &udfchain::Error) -> Kind {
    use udfchain::Error as E;
    match e {
        E::Udf { .. } => Kind::Udf,
        E::Storage { .. } | E::InvalidUri { .. } | E::Io { .. } => Kind::Storage,
        E::Setting { .. } => Kind::Setting,
        // The catalog's "no dataset \"x\"" and "dataset \"x\" has no version 3";
        // an invalid name is the same variant and stays a plain UdfchainError.
        E::Dataset(msg) if msg.starts_with("no dataset ") || msg.contains(" has no version ") => {
            Kind::DatasetNotFound
        }
        E::Script { source, .. } => kind_of(source),
        _ => Kind::Other,
    }
}

/// An exception of class `kind` with message `msg`.
pub fn raise(kind: Kind, msg: String) -> PyErr {
    Python::attach(|py| {
        let class = match (kind, classes(py)) {
            (Kind::Other, _) | (_, Err(_)) => return UdfchainError::new_err(msg),
            (Kind::Udf, Ok(c)) => &c.udf,
            (Kind::Storage, Ok(c)) => &c.storage,
            (Kind::DatasetNotFound, Ok(c)) => &c.dataset_not_found,
            (Kind::Setting, Ok(c)) => &c.setting,
        };
        PyErr::from_type(class.bind(py).clone(), msg)
    })
}

/// The Python exception of an error: of its kind's class when it is an
/// engine error ([`udfchain::Error`]), else `UdfchainError`.
pub fn to_py<E: Display + 'static>(e: E) -> PyErr {
    let kind = (&e as &dyn Any)
        .downcast_ref::<udfchain::Error>()
        .map_or(Kind::Other, kind_of);
    raise(kind, e.to_string())
}
