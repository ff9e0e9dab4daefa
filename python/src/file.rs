//! `FileAccess`: how a Python UDF's `udfchain.File` objects read bytes. One is
//! made per UDF call over the source the engine installed for that call
//! (prefetched copies, the shared cache, or the store), so prefetch, caches
//! and retries apply to Python UDFs unchanged.
//!
//! Guarantees: every read releases the GIL while it waits (downloads never hold
//! it); a `FileAccess` serves reads only during its call: afterwards (the row
//! is done and its prefetched copy may be deleted) every method raises.
//! `cancelled()` says whether the query dropped the call (Ctrl-C, a dropped
//! stream), so a call waiting on a worker process can stop it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tokio::runtime::Handle;
use udfchain::udfs::{File, FileSource, UdfError};

use crate::calls::Abandon;
use crate::error::{Kind, raise};

/// The `File` fields in the order Python passes them.
pub type FileFields = (
    String,
    String,
    u64,
    Option<String>,
    Option<String>,
    Option<i64>,
    Option<String>,
);

fn file((source, path, size, version, etag, last_modified, location): FileFields) -> File {
    File {
        source,
        path,
        size,
        version,
        etag,
        last_modified,
        location,
    }
}

#[pyclass(frozen, module = "udfchain._internal")]
pub struct FileAccess {
    source: Arc<dyn FileSource>,
    handle: Handle,
    open: AtomicBool,
    abandon: Abandon,
}

impl FileAccess {
    /// Reads through `source`, waiting on `handle` (the UDF pool), for a call
    /// whose query dropped it once `abandon` is set.
    pub fn new(source: Arc<dyn FileSource>, handle: Handle, abandon: Abandon) -> Self {
        Self {
            source,
            handle,
            open: AtomicBool::new(true),
            abandon,
        }
    }

    /// Ends the call: no read is served after this.
    pub fn close(&self) {
        self.open.store(false, Ordering::Release);
    }

    fn check(&self) -> PyResult<()> {
        if self.open.load(Ordering::Acquire) {
            Ok(())
        } else {
            Err(PyRuntimeError::new_err(
                "this File belongs to a UDF call that has ended: read it inside the UDF",
            ))
        }
    }

    fn block<'py>(
        &self,
        py: Python<'py>,
        read: impl Future<Output = Result<Bytes, UdfError>> + Send,
    ) -> PyResult<Bound<'py, PyBytes>> {
        self.check()?;
        // A read that fails is a storage error, whatever the source's type says.
        let bytes = py
            .detach(|| self.handle.block_on(read))
            .map_err(|e| raise(Kind::Storage, e.to_string()))?;
        Ok(PyBytes::new(py, &bytes))
    }
}

#[pymethods]
impl FileAccess {
    /// The whole object's bytes.
    fn read<'py>(&self, py: Python<'py>, f: FileFields) -> PyResult<Bound<'py, PyBytes>> {
        let f = file(f);
        self.block(py, self.source.read(&f))
    }

    /// Bytes `start..end` of the object.
    fn read_range<'py>(
        &self,
        py: Python<'py>,
        f: FileFields,
        start: u64,
        end: u64,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let f = file(f);
        self.block(py, self.source.read_range(&f, start..end))
    }

    /// The path of a complete local copy (prefetched or cached), if any.
    fn local_path(&self, py: Python<'_>, f: FileFields) -> PyResult<Option<String>> {
        self.check()?;
        let f = file(f);
        Ok(py
            .detach(|| self.source.local_path(&f))
            .map(|p| p.display().to_string()))
    }

    /// Whether the query that made this call dropped it (its result is unwanted).
    fn cancelled(&self) -> bool {
        self.abandon.is_set()
    }

    /// Whether the engine holds a complete copy in memory (read() costs no I/O).
    fn in_memory(&self, f: FileFields) -> PyResult<bool> {
        self.check()?;
        let f = file(f);
        Ok(self.source.local_bytes(&f).is_some())
    }
}
