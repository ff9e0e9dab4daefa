//! [`Code`]: a UDF's code as it travels to cluster executors that cannot
//! rebuild it by name (a Python function: the executor's registry holds the
//! Rust UDFs by name, a Python function travels pickled).
//!
//! Guarantees: the engine treats the bytes as opaque; an executor hands them
//! to the loader registered for `runtime` (`UdfRegistry::register_runtime`),
//! and a node without one refuses the UDF naming the runtime.

use std::fmt;
use std::sync::Arc;

/// A UDF's code: the runtime that loads it (`"python"`) and its bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct Code {
    /// Which loader reads `bytes` (`"python"`).
    pub runtime: String,
    /// What that loader reads (for Python: a header line, then a pickle).
    pub bytes: Arc<[u8]>,
}

impl fmt::Debug for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Code({}, {} bytes)", self.runtime, self.bytes.len())
    }
}
