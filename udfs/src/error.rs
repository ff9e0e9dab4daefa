//! Errors a UDF call can return. The engine adds the UDF name and file URL.

/// Any error a user function returns.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Errors raised by the UDF contract itself (reading files, converting values).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UdfError {
    /// Reading an object's bytes failed.
    #[error("reading {url}: {source}")]
    Read {
        /// The object's URL (credentials never appear in it).
        url: String,
        /// What failed.
        #[source]
        source: BoxError,
    },
    /// `File::read` and friends were called outside a UDF run by the engine and no
    /// source was given explicitly.
    #[error("no file source: File::read must run inside a udfchain UDF (or use with_file_source)")]
    NoFileSource,
    /// Converting between Arrow and Rust values failed.
    #[error("converting {what} between Arrow and Rust values: {message}")]
    Convert {
        /// What was converted (a column, a value type).
        what: String,
        /// Why it failed.
        message: String,
    },
    /// A string is not the URL of an object (`File::from_url`, `file_from_url`).
    #[error("not an object URL: {url:?}: {reason}")]
    NotAUrl {
        /// The string as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The UDF's setup failed: the run fails, whatever `on_error` says.
    #[error("setup failed: {source}")]
    Setup {
        /// What the setup returned or raised.
        #[source]
        source: BoxError,
    },
    /// A UDF broke its contract (e.g. a batch mapper returned the wrong number of values).
    #[error("{0}")]
    Contract(String),
}

/// The error of one UDF call, with the row (within the call's input) that failed
/// when it is known. The engine turns `row` into a file URL and a row number.
#[derive(Debug)]
pub struct CallError {
    /// The failing row's index in the call's input, when known.
    pub row: Option<usize>,
    /// What failed.
    pub source: BoxError,
}

impl CallError {
    /// The call failed at row `row` of its input.
    pub fn at_row(row: usize, source: impl Into<BoxError>) -> Self {
        Self {
            row: Some(row),
            source: source.into(),
        }
    }

    /// The call failed as a whole (no one row to blame).
    pub fn whole(source: impl Into<BoxError>) -> Self {
        Self {
            row: None,
            source: source.into(),
        }
    }
}

impl From<UdfError> for CallError {
    fn from(e: UdfError) -> Self {
        Self::whole(e)
    }
}

/// The message of a caught panic: `panicked: <its message>`.
pub fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .map(|m| format!("panicked: {m}"))
        .unwrap_or_else(|| "panicked".to_string())
}

/// A caught panic as an error naming it.
pub(crate) fn panic_error(p: Box<dyn std::any::Any + Send>) -> BoxError {
    Box::new(std::io::Error::other(panic_message(p)))
}
