//! [`Udf`]: a UDF of any kind as one value — what [`Chain::udf`](crate::Chain::udf),
//! a cluster's [`UdfRegistry`](crate::cluster::UdfRegistry) and the planner
//! take. Built from a typed Rust function (`Udf::map`, `Udf::r#gen`,
//! `Udf::batch_map`, `Udf::agg`), from a UDF with state
//! (`udfs::map_with` & co., via `From`), or from a hand-written trait
//! object (`Udf::Map(Arc<dyn Mapper>)`, ...). Cheap to clone: the UDF itself
//! is shared, and so is its state in the process (see `lifecycle.rs`).

use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;
use udfchain_udfs::{
    Aggregator, BatchMapper, BoxError, Code, Generator, Lifecycle, Mapper, Signature, Stateful,
    UdfError, agg_fn, batch_map_fn, gen_fn, map_fn,
};

/// A UDF of one of the four kinds.
#[derive(Debug, Clone)]
pub enum Udf {
    /// One value per row.
    Map(Arc<dyn Mapper>),
    /// Zero or more values per row.
    Gen(Arc<dyn Generator>),
    /// One value per row, `batch_size` rows per call.
    BatchMap(Arc<dyn BatchMapper>),
    /// Values per group of rows with equal `partition_by` columns.
    Agg {
        /// The UDF.
        udf: Arc<dyn Aggregator>,
        /// The columns whose equal values make a group.
        partition_by: Vec<String>,
    },
}

impl Udf {
    /// A map UDF of `async fn(I) -> Result<O, E>` reading `params` (one
    /// param: `I` is its value; several: a struct with fields named like the
    /// columns), writing column `output`.
    pub fn map<I, O, E, F, Fut>(params: &[&str], output: &str, f: F) -> Result<Self, UdfError>
    where
        I: DeserializeOwned + Send + 'static,
        O: Serialize + DeserializeOwned + Send + 'static,
        E: Into<BoxError> + 'static,
        F: Fn(I) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, E>> + Send,
    {
        map_fn(params, output, f).map(Self::Map)
    }

    /// A gen UDF of `fn(I) -> impl Stream<Item = Result<O, E>>`.
    pub fn r#gen<I, O, E, F, S>(params: &[&str], output: &str, f: F) -> Result<Self, UdfError>
    where
        I: DeserializeOwned + Send + 'static,
        O: Serialize + DeserializeOwned + Send + 'static,
        E: Into<BoxError> + Send + 'static,
        F: Fn(I) -> S + Send + Sync + 'static,
        S: futures::Stream<Item = Result<O, E>> + Send + 'static,
    {
        gen_fn(params, output, f).map(Self::Gen)
    }

    /// A batch_map UDF of `async fn(Vec<I>) -> Result<Vec<O>, E>` (as many
    /// values as rows).
    pub fn batch_map<I, O, E, F, Fut>(params: &[&str], output: &str, f: F) -> Result<Self, UdfError>
    where
        I: DeserializeOwned + Send + 'static,
        O: Serialize + DeserializeOwned + Send + 'static,
        E: Into<BoxError> + 'static,
        F: Fn(Vec<I>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<O>, E>> + Send,
    {
        batch_map_fn(params, output, f).map(Self::BatchMap)
    }

    /// An agg UDF of `async fn(Vec<I>) -> Result<Vec<O>, E>`, called once
    /// per group of rows with equal `partition_by` values.
    pub fn agg<I, O, E, F, Fut>(
        partition_by: &[&str],
        params: &[&str],
        output: &str,
        f: F,
    ) -> Result<Self, UdfError>
    where
        I: DeserializeOwned + Send + 'static,
        O: Serialize + DeserializeOwned + Send + 'static,
        E: Into<BoxError> + 'static,
        F: Fn(Vec<I>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<O>, E>> + Send,
    {
        let udf = agg_fn(params, output, f)?;
        Ok(Self::Agg {
            udf,
            partition_by: partition_by.iter().map(|s| s.to_string()).collect(),
        })
    }

    /// This aggregate over groups of `partition_by` (no-op for other kinds).
    pub fn partition_by(self, keys: &[&str]) -> Self {
        match self {
            Self::Agg { udf, .. } => Self::Agg {
                udf,
                partition_by: keys.iter().map(|s| s.to_string()).collect(),
            },
            other => other,
        }
    }

    /// The UDF's name, params and output field.
    pub fn signature(&self) -> &Signature {
        match self {
            Self::Map(u) => u.signature(),
            Self::Gen(u) => u.signature(),
            Self::BatchMap(u) => u.signature(),
            Self::Agg { udf, .. } => udf.signature(),
        }
    }

    /// The UDF's setup and teardown, if it holds state.
    pub fn lifecycle(&self) -> Option<&dyn Lifecycle> {
        match self {
            Self::Map(u) => u.lifecycle(),
            Self::Gen(u) => u.lifecycle(),
            Self::BatchMap(u) => u.lifecycle(),
            Self::Agg { udf, .. } => udf.lifecycle(),
        }
    }

    /// The UDF's bound on its calls at once in the process, if any.
    pub fn concurrency(&self) -> Option<usize> {
        match self {
            Self::Map(u) => u.concurrency(),
            Self::Gen(u) => u.concurrency(),
            Self::BatchMap(u) => u.concurrency(),
            Self::Agg { udf, .. } => udf.concurrency(),
        }
    }

    /// The UDF's code, when it travels to a cluster as code instead of by
    /// name (a Python function); an error when it cannot be sent.
    pub fn code(&self) -> Result<Option<Code>, UdfError> {
        match self {
            Self::Map(u) => u.code(),
            Self::Gen(u) => u.code(),
            Self::BatchMap(u) => u.code(),
            Self::Agg { udf, .. } => udf.code(),
        }
    }

    /// What the UDF's state in the process is keyed by: the address of its
    /// lifecycle when it has one (wrappers of one UDF, e.g. a cluster
    /// executor's per task, share it), else of the UDF value.
    pub fn address(&self) -> usize {
        if let Some(life) = self.lifecycle() {
            return life as *const dyn Lifecycle as *const () as usize;
        }
        match self {
            Self::Map(u) => Arc::as_ptr(u) as *const () as usize,
            Self::Gen(u) => Arc::as_ptr(u) as *const () as usize,
            Self::BatchMap(u) => Arc::as_ptr(u) as *const () as usize,
            Self::Agg { udf, .. } => Arc::as_ptr(udf) as *const () as usize,
        }
    }

    /// `map`, `gen`, `batch_map` or `agg`.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Self::Map(_) => "map",
            Self::Gen(_) => "gen",
            Self::BatchMap(_) => "batch_map",
            Self::Agg { .. } => "agg",
        }
    }
}

impl From<Arc<dyn Mapper>> for Udf {
    fn from(u: Arc<dyn Mapper>) -> Self {
        Self::Map(u)
    }
}

impl From<Arc<dyn Generator>> for Udf {
    fn from(u: Arc<dyn Generator>) -> Self {
        Self::Gen(u)
    }
}

impl From<Arc<dyn BatchMapper>> for Udf {
    fn from(u: Arc<dyn BatchMapper>) -> Self {
        Self::BatchMap(u)
    }
}

/// An aggregate over no keys until [`Udf::partition_by`].
impl From<Arc<dyn Aggregator>> for Udf {
    fn from(udf: Arc<dyn Aggregator>) -> Self {
        Self::Agg {
            udf,
            partition_by: Vec::new(),
        }
    }
}

impl From<Stateful<dyn Mapper>> for Udf {
    fn from(u: Stateful<dyn Mapper>) -> Self {
        Self::Map(u.into_udf())
    }
}

impl From<Stateful<dyn Generator>> for Udf {
    fn from(u: Stateful<dyn Generator>) -> Self {
        Self::Gen(u.into_udf())
    }
}

impl From<Stateful<dyn BatchMapper>> for Udf {
    fn from(u: Stateful<dyn BatchMapper>) -> Self {
        Self::BatchMap(u.into_udf())
    }
}

/// An aggregate with state, over no keys until [`Udf::partition_by`].
impl From<Stateful<dyn Aggregator>> for Udf {
    fn from(u: Stateful<dyn Aggregator>) -> Self {
        Self::Agg {
            udf: u.into_udf(),
            partition_by: Vec::new(),
        }
    }
}
