//! How engine errors reach Python: one exception class, `udfchain.UdfchainError`,
//! whose message is the engine's one-line error (a UDF failure names the UDF,
//! the file and the row, and carries the Python traceback of the UDF).

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(
    _internal,
    UdfchainError,
    PyException,
    "An error of the udfchain engine."
);

/// The Python exception of an engine error.
pub fn to_py(e: impl std::fmt::Display) -> PyErr {
    UdfchainError::new_err(e.to_string())
}
