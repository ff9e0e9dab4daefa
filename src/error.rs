//! The one public error type. Every variant carries the context a user needs to
//! act (URL, UDF name, file, row); credentials never appear in it (the URLs
//! of storage and UDF errors are shown redacted: a presigned URL's signature
//! is masked).

use std::sync::Arc;

use datafusion::error::DataFusionError;

use crate::util::redact::redact;

/// A shared, clonable error source.
pub type Source = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// Result alias for udfchain.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors of udfchain.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A URI that names no store udfchain can open.
    #[error("invalid URI {uri:?}: {reason}")]
    InvalidUri {
        /// The URI as given.
        uri: String,
        /// Why it names no store.
        reason: String,
    },

    /// A store operation failed.
    #[error("storage error at {}: {}", redact(url), redact(&source.to_string()))]
    Storage {
        /// The store URL (redacted when shown).
        url: String,
        #[source]
        /// The store's error.
        source: Source,
    },

    /// A UDF returned an error (or panicked) for a row.
    #[error("UDF {udf} failed{}{}: {}", file.as_ref().map(|f| format!(" on {}", redact(f))).unwrap_or_default(), row.map(|r| format!(" (row {r})")).unwrap_or_default(), redact(&source.to_string()))]
    Udf {
        /// The UDF's name.
        udf: String,
        /// The file the row was about, if any.
        file: Option<String>,
        /// The row's position in its input, if known.
        row: Option<u64>,
        #[source]
        /// What the UDF returned.
        source: Source,
    },

    /// A chain that cannot be planned: unknown column, wrong input type, bad setting.
    #[error("invalid chain: {0}")]
    Plan(String),

    /// A setting name or value that is not accepted (`SET`, `--set`,
    /// `Settings::set`); `reason` says what is accepted. `value` is the text
    /// given (empty for a store option, which may be a credential).
    #[error("{name} {reason}")]
    Setting {
        /// The setting's name.
        name: String,
        /// The value given.
        value: String,
        /// What is accepted.
        reason: String,
    },

    /// Script text that cannot be split or recognised (unterminated string or
    /// comment, `SET` without `=`), before any DataFusion parsing.
    #[error("syntax error: {0}")]
    Syntax(String),

    /// A dataset that does not exist, a bad dataset name.
    #[error("{0}")]
    Dataset(String),

    /// The dataset catalog (SQLite) at `path` failed.
    #[error("dataset catalog {path}: {source}")]
    Catalog {
        /// The catalog's database file.
        path: String,
        #[source]
        /// SQLite's error.
        source: Arc<rusqlite::Error>,
    },

    /// An error in a script, at a line and column (1-based).
    #[error("line {line}, column {column}: {source}")]
    Script {
        /// The statement's line (1-based).
        line: usize,
        /// The statement's column (1-based).
        column: usize,
        /// The statement's error.
        source: Box<Error>,
    },

    /// A local I/O error (cache or temp dirs, output files).
    #[error("I/O error at {path}: {source}")]
    Io {
        /// The local path (or `standard output`, `standard input`).
        path: String,
        #[source]
        /// The I/O error.
        source: Arc<std::io::Error>,
    },

    /// A broken invariant inside udfchain (a bug, never the user's input): a
    /// task that panicked outside a UDF, a closed semaphore, a lost hand-off.
    #[error("internal error: {0} (please report this)")]
    Internal(String),

    /// A pipeline that cannot go on: a bad config (with its line), a training
    /// hook that failed (naming the trigger and the exit status), its state db.
    #[error("pipeline {pipeline}: {reason}")]
    Pipeline {
        /// The pipeline's name.
        pipeline: String,
        /// What went wrong.
        reason: String,
        #[source]
        /// The underlying error, if any.
        source: Option<Source>,
    },

    /// A cluster plan names a UDF that a node (an executor) cannot run: it is
    /// not registered there, or as another kind.
    #[error("UDF {udf} is not available on {node}: {reason}")]
    UnknownUdf {
        /// The UDF's name.
        udf: String,
        /// The node that cannot run it.
        node: String,
        /// Why.
        reason: String,
    },

    /// A cluster (a Ballista scheduler or executor) that cannot be reached,
    /// did not start, or failed a job.
    #[error("cluster {url}: {reason}")]
    Cluster {
        /// The scheduler's or executor's address.
        url: String,
        /// What happened.
        reason: String,
    },

    /// Ctrl-C stopped a CLI run; `cluster` names the cluster whose running
    /// job was cancelled, if one was. The CLI exits with status 130.
    #[error("interrupted (Ctrl-C){}", .cluster.as_ref().map(|c| format!(": the running job was cancelled on the cluster {c}")).unwrap_or_default())]
    Interrupted {
        /// The cluster whose running job was cancelled, if any.
        cluster: Option<String>,
    },

    /// A task of cluster job `job` failed on an executor: `reason` is the
    /// executor's one-line error (which UDF, which file, the cause); the
    /// source is Ballista's full report.
    #[error("{reason} (job {job} on the cluster {url})")]
    ClusterTask {
        /// The scheduler's URL.
        url: String,
        /// The Ballista job id.
        job: String,
        /// The executor's one-line error.
        reason: String,
        #[source]
        /// Ballista's full report.
        source: Source,
    },

    /// Any other error from the DataFusion engine.
    #[error(transparent)]
    DataFusion(Arc<DataFusionError>),
}

impl Error {
    pub(crate) fn plan(msg: impl Into<String>) -> Self {
        Self::Plan(msg.into())
    }

    pub(crate) fn internal(msg: impl Into<String>) -> Self {
        Self::Internal(msg.into())
    }

    pub(crate) fn io(path: impl std::fmt::Display, source: std::io::Error) -> Self {
        Self::Io {
            path: path.to_string(),
            source: Arc::new(source),
        }
    }

    /// Whether doing the same work again may succeed. Never for errors of
    /// the input, the plan, the settings or a UDF's own logic, nor for store
    /// answers that do not change (not found, no permission, a path or a
    /// request the store refuses); yes for other storage and I/O errors
    /// (timeouts, resets, server errors the store's own retries gave up on)
    /// and for engine errors other than resource limits. A UDF error heals
    /// only when its cause is a storage or I/O error that does.
    pub fn may_heal(&self) -> bool {
        match self {
            Error::Udf { source, .. } => cause_heals(source.as_ref()).unwrap_or(false),
            Error::Storage { source, .. } => cause_heals(source.as_ref()).unwrap_or(true),
            Error::Io { source, .. } => cause_heals(source.as_ref()).unwrap_or(true),
            Error::Script { source, .. } => source.may_heal(),
            // A busy or locked catalog is released by its other writer.
            Error::Catalog { .. } => true,
            Error::DataFusion(df) => match find_ours(df) {
                Some(ours) => ours.may_heal(),
                None => !matches!(df.as_ref(), DataFusionError::ResourcesExhausted(_)),
            },
            Error::Cluster { .. } | Error::ClusterTask { .. } => true,
            _ => false,
        }
    }

    /// Wraps this error for transport through DataFusion; [`From<DataFusionError>`]
    /// unwraps it again.
    pub(crate) fn into_df(self) -> DataFusionError {
        DataFusionError::External(Box::new(self))
    }
}

/// A UDF that cannot be built (`Udf::map`, `udfs::map_with`, ...: a type that
/// does not trace, a wrong number of params) is a chain that cannot be
/// planned, so `?` works where chains are built.
impl From<udfchain_udfs::UdfError> for Error {
    fn from(e: udfchain_udfs::UdfError) -> Self {
        Self::Plan(e.to_string())
    }
}

impl From<DataFusionError> for Error {
    fn from(e: DataFusionError) -> Self {
        if let Some(ours) = find_ours(&e) {
            return ours;
        }
        match e {
            e @ (DataFusionError::Plan(_) | DataFusionError::SchemaError(..)) => {
                Self::Plan(e.strip_backtrace())
            }
            e => Self::DataFusion(Arc::new(e)),
        }
    }
}

/// What the first storage or I/O error in `e`'s chain of causes says about
/// trying again (see [`Error::may_heal`]); `None` when there is none.
fn cause_heals(e: &(dyn std::error::Error + 'static)) -> Option<bool> {
    let mut cause = Some(e);
    // A generic store error (a transport error or a server error after the
    // store's own retries) heals unless a cause below it says otherwise.
    let mut generic = false;
    while let Some(e) = cause {
        if let Some(ours) = e.downcast_ref::<Error>() {
            return Some(ours.may_heal());
        }
        if let Some(store) = e.downcast_ref::<object_store::Error>() {
            use object_store::Error as E;
            if let E::Generic { .. } = store {
                generic = true;
                cause = e.source();
                continue;
            }
            return Some(!matches!(
                store,
                E::NotFound { .. }
                    | E::InvalidPath { .. }
                    | E::NotSupported { .. }
                    | E::AlreadyExists { .. }
                    | E::Precondition { .. }
                    | E::NotModified { .. }
                    | E::NotImplemented { .. }
                    | E::PermissionDenied { .. }
                    | E::Unauthenticated { .. }
                    | E::UnknownConfigurationKey { .. }
            ));
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind as K;
            match io.kind() {
                K::NotFound
                | K::PermissionDenied
                | K::InvalidInput
                | K::InvalidData
                | K::Unsupported
                | K::AlreadyExists
                | K::StorageFull
                | K::QuotaExceeded => return Some(false),
                // `io::Error::other(e)` says nothing itself: `e` may.
                K::Other => {
                    cause = io
                        .get_ref()
                        .map(|inner| inner as &(dyn std::error::Error + 'static));
                    continue;
                }
                _ => return Some(true),
            }
        }
        cause = e.source();
    }
    generic.then_some(true)
}

/// Whether `e`, or an error it carries, is a full disk (ENOSPC) or an
/// exhausted quota (EDQUOT).
pub(crate) fn is_disk_full(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(e);
    while let Some(e) = cause {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind as K;
            if matches!(io.kind(), K::StorageFull | K::QuotaExceeded) {
                return true;
            }
            if let Some(inner) = io.get_ref() {
                cause = Some(inner as &(dyn std::error::Error + 'static));
                continue;
            }
        }
        // `Error::Io`'s source is an `Arc<io::Error>`: it does not downcast
        // to the `io::Error` inside.
        if let Some(Error::Io { source, .. }) = e.downcast_ref::<Error>() {
            cause = Some(source.as_ref() as &(dyn std::error::Error + 'static));
            continue;
        }
        cause = e.source();
    }
    false
}

/// Finds a udfchain error carried anywhere inside a DataFusion error.
fn find_ours(e: &DataFusionError) -> Option<Error> {
    match e {
        DataFusionError::External(b) => {
            if let Some(ours) = b.downcast_ref::<Error>() {
                return Some(ours.clone());
            }
            if let Some(df) = b.downcast_ref::<DataFusionError>() {
                return find_ours(df);
            }
        }
        DataFusionError::Shared(inner) => return find_ours(inner),
        DataFusionError::Context(_, inner) => return find_ours(inner),
        DataFusionError::ArrowError(inner, _) => {
            if let datafusion::arrow::error::ArrowError::ExternalError(b) = inner.as_ref() {
                if let Some(ours) = b.downcast_ref::<Error>() {
                    return Some(ours.clone());
                }
                if let Some(df) = b.downcast_ref::<DataFusionError>() {
                    return find_ours(df);
                }
            }
        }
        _ => {}
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(ours) = s.downcast_ref::<Error>() {
            return Some(ours.clone());
        }
        source = s.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn udf(source: Source) -> Error {
        Error::Udf {
            udf: "u".into(),
            file: None,
            row: None,
            source,
        }
    }

    fn store(e: object_store::Error) -> Error {
        Error::Storage {
            url: "s3://b/k".into(),
            source: Arc::new(e),
        }
    }

    #[test]
    fn only_errors_that_may_heal_are_worth_another_try() {
        let missing = || object_store::Error::NotFound {
            path: "k".into(),
            source: "404".into(),
        };
        let reset = || object_store::Error::Generic {
            store: "S3",
            source: Box::new(std::io::Error::from(std::io::ErrorKind::ConnectionReset)),
        };
        let refused = object_store::Error::Generic {
            store: "HTTP",
            source: Box::new(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "the server answered PROPFIND with 501",
            )),
        };
        assert!(!store(refused).may_heal(), "a permanent status");
        assert!(!store(missing()).may_heal(), "404");
        assert!(
            store(reset()).may_heal(),
            "a reset after the store's retries"
        );
        // A UDF's own error does not heal; a read that failed heals as its cause.
        assert!(!udf(Arc::new(std::io::Error::other("bad header"))).may_heal());
        let read = |cause: Error| {
            udf(Arc::new(udfchain_udfs::UdfError::Read {
                url: "s3://b/k".into(),
                source: Box::new(cause),
            }))
        };
        assert!(
            !read(store(missing())).may_heal(),
            "a read of a missing object"
        );
        assert!(read(store(reset())).may_heal(), "a read cut by a reset");
        // Through DataFusion, as the loader sees them.
        assert!(!Error::from(store(missing()).into_df()).may_heal());
        assert!(Error::from(read(store(reset())).into_df()).may_heal());
        assert!(!Error::plan("no such column").may_heal());
        let timeout = Error::io("f", std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert!(timeout.may_heal());
        let denied = Error::io(
            "f",
            std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        );
        assert!(!denied.may_heal());
    }
}
