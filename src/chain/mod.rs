//! [`Chain`]: the builder users write, turned into a DataFusion `LogicalPlan`
//! when it runs.
//!
//! Building is cheap and never fails: a chain is a source plus a list of steps,
//! and every error (bad URI, unknown column, a UDF whose declared input does not
//! match its column) is returned by the first call that plans it (`collect`,
//! `explain`, ...). UDFs capture the chain's settings at the point they are added.
//! [`Chain::new`] starts a [`ChainBuilder`] that takes settings (and a session)
//! before the source; a chain without a source cannot be built, so none can run.
//!
//! One concept per file: this file the chain itself (its source, its steps and
//! the calls that add them); `logical_plan.rs` turning it into a DataFusion plan
//! (and `explain`); `run.rs` running it (`collect`, `stream`, reports);
//! `save.rs` writing its rows (a dataset version, a Parquet file);
//! `delta.rs` delta saves (only the files added or changed since the last version);
//! `session_chains.rs` the chains and the catalog a [`Session`] offers;
//! `verbs.rs` dataset verbs (diff, subtract, shuffle, sample, chunk);
//! `lineage.rs` what a chain reads (the sources a save records);
//! `export.rs` `to_storage` (a File column's files written out).

mod builder;
mod delta;
mod explode;
mod export;
mod expr;
mod lineage;
mod logical_plan;
mod run;
mod save;
mod session_chains;
mod verbs;

pub use builder::ChainBuilder;
pub(crate) use delta::{Delta, DeltaSource};
pub(crate) use explode::JsonToStruct;
pub use export::{ExportSummary, LinkType, Placement};
pub use verbs::Diff;

use crate::settings::Settings;
pub use expr::{col, file_from_url};

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{Array, RecordBatch};
use datafusion::catalog::TableProvider;
use datafusion::common::JoinType;
use datafusion::datasource::MemTable;
use datafusion::logical_expr::{Expr, LogicalPlan, SortExpr};
use serde::Serialize;
use serde::de::DeserializeOwned;
use udfchain_udfs::{BoxError, UdfError};

use crate::error::{Error, Result};
use crate::plan::Udf;
use crate::session::Session;

/// Where a chain's rows come from.
#[derive(Clone)]
enum Source {
    Storage {
        uri: String,
        recursive: bool,
        glob: Option<String>,
        delta: Option<Delta>,
    },
    Table(Arc<dyn TableProvider>),
    Parquet(String),
    Csv(String),
    Json(String),
    Dataset {
        name: String,
        version: Option<u32>,
    },
    Plan(LogicalPlan),
}

#[derive(Clone)]
enum Step {
    Filter(Expr),
    Select(Vec<Expr>),
    Mutate(String, Expr),
    OrderBy(Vec<SortExpr>),
    Limit {
        skip: usize,
        fetch: Option<usize>,
    },
    Distinct,
    Union(Box<Chain>),
    Join {
        right: Box<Chain>,
        how: JoinType,
        left_on: Vec<String>,
        right_on: Vec<String>,
    },
    GroupBy {
        keys: Vec<Expr>,
        aggs: Vec<Expr>,
    },
    Udf {
        kind: Udf,
        settings: Settings,
    },
    Verb(verbs::Verb),
    Fail(Error),
}

/// A lazy chain of relational steps and UDFs over a source.
#[derive(Clone)]
#[must_use = "a chain does nothing until collected, streamed or saved"]
pub struct Chain {
    session: Arc<Session>,
    settings: Settings,
    source: Source,
    steps: Vec<Step>,
}

impl fmt::Debug for Chain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Chain")
            .field("settings", &self.settings)
            .field("steps", &self.steps.len())
            .finish()
    }
}

impl Chain {
    #[allow(clippy::new_ret_no_self)]
    /// A builder to start a chain from (settings first, then a source).
    pub fn new() -> ChainBuilder {
        ChainBuilder::default()
    }

    fn with_source(session: Arc<Session>, source: Source) -> Self {
        Self {
            settings: session.settings().clone(),
            session,
            source,
            steps: Vec::new(),
        }
    }

    /// The objects under `uri` (recursive), one row each with a `file` column.
    /// Runs in the process-wide [`Session::global`].
    pub fn from_storage(uri: &str) -> Self {
        Self::from_storage_in(Session::global(), uri)
    }

    pub(crate) fn from_storage_in(session: Arc<Session>, uri: &str) -> Self {
        Self::with_source(
            session,
            Source::Storage {
                uri: uri.to_string(),
                recursive: true,
                glob: None,
                delta: None,
            },
        )
    }

    /// Lists only the objects directly under the URI (no sub-directories).
    pub fn non_recursive(mut self) -> Self {
        if let Source::Storage { recursive, .. } = &mut self.source {
            *recursive = false;
        }
        self
    }

    /// Keeps only objects whose path (relative to the URI) matches `glob`, e.g. `**/*.jpg`.
    pub fn glob(mut self, pattern: &str) -> Self {
        if let Source::Storage { glob, .. } = &mut self.source {
            *glob = Some(pattern.to_string());
        }
        self
    }

    /// Rows from Rust values, one column per struct field (or one column named
    /// `value` for non-struct values).
    pub fn from_values<T: Serialize + DeserializeOwned>(values: &[T]) -> Self {
        Self::from_values_in(Session::global(), values)
    }

    /// A chain over `values` (one row per value, its fields as columns), in `session`.
    pub fn from_values_in<T: Serialize + DeserializeOwned>(
        session: Arc<Session>,
        values: &[T],
    ) -> Self {
        match values_table(values) {
            Ok(t) => Self::with_source(session, Source::Table(t)),
            Err(e) => Self::with_source(session, Source::Plan(empty_plan())).fail(e),
        }
    }

    /// Rows of Parquet file(s) at `uri` (a file, a directory, local or in a store).
    pub fn from_parquet(uri: &str) -> Self {
        Self::with_source(Session::global(), Source::Parquet(uri.to_string()))
    }

    /// Rows of CSV file(s) with a header row.
    pub fn from_csv(uri: &str) -> Self {
        Self::with_source(Session::global(), Source::Csv(uri.to_string()))
    }

    /// Rows of newline-delimited JSON file(s).
    pub fn from_json(uri: &str) -> Self {
        Self::with_source(Session::global(), Source::Json(uri.to_string()))
    }

    /// The rows of the latest version of dataset `name`.
    pub fn from_dataset(name: &str) -> Self {
        Self::with_source(
            Session::global(),
            Source::Dataset {
                name: name.to_string(),
                version: None,
            },
        )
    }

    /// The rows of version `version` of dataset `name`.
    pub fn from_dataset_version(name: &str, version: u32) -> Self {
        Self::with_source(
            Session::global(),
            Source::Dataset {
                name: name.to_string(),
                version: Some(version),
            },
        )
    }

    /// A chain over any DataFusion logical plan (for example a SQL query's).
    pub fn from_plan(session: Arc<Session>, plan: LogicalPlan) -> Self {
        Self::with_source(session, Source::Plan(plan))
    }

    /// Runs this chain in `session` instead (its stores and settings).
    pub fn in_session(mut self, session: Arc<Session>) -> Self {
        self.settings = session.settings().clone().merge(&self.settings);
        self.session = session;
        self
    }

    /// The session this chain runs in.
    pub fn session(&self) -> &Arc<Session> {
        &self.session
    }

    /// The settings the next UDF would capture (the session's, then every
    /// `settings` call so far): e.g. the `cluster` a binding runs it on.
    pub fn get_settings(&self) -> &Settings {
        &self.settings
    }

    /// Settings for the UDFs added after this call.
    pub fn settings(mut self, settings: Settings) -> Self {
        self.settings = self.settings.merge(&settings);
        self
    }

    fn step(mut self, step: Step) -> Self {
        self.steps.push(step);
        self
    }

    fn fail(self, e: impl Into<Error>) -> Self {
        self.step(Step::Fail(e.into()))
    }

    /// Keeps the rows for which `predicate` is true (pushed down to the listing where it can be).
    pub fn filter(self, predicate: Expr) -> Self {
        self.step(Step::Filter(predicate))
    }

    /// Keeps these expressions as columns (use `.alias(..)` to name them).
    pub fn select(self, exprs: impl IntoIterator<Item = Expr>) -> Self {
        self.step(Step::Select(exprs.into_iter().collect()))
    }

    /// Adds or replaces column `name`.
    pub fn mutate(self, name: &str, expr: Expr) -> Self {
        self.step(Step::Mutate(name.to_string(), expr))
    }

    /// Sorts the rows.
    pub fn order_by(self, sort: impl IntoIterator<Item = SortExpr>) -> Self {
        self.step(Step::OrderBy(sort.into_iter().collect()))
    }

    /// Keeps the first `n` rows; upstream UDFs stop once they are produced.
    pub fn limit(self, n: usize) -> Self {
        self.step(Step::Limit {
            skip: 0,
            fetch: Some(n),
        })
    }

    /// Skips the first `n` rows.
    pub fn offset(self, n: usize) -> Self {
        self.step(Step::Limit {
            skip: n,
            fetch: None,
        })
    }

    /// Removes duplicate rows.
    pub fn distinct(self) -> Self {
        self.step(Step::Distinct)
    }

    /// Rows of both chains (same columns, by name).
    pub fn union(self, other: Chain) -> Self {
        self.step(Step::Union(Box::new(other)))
    }

    /// Joins on equal `left_on` / `right_on` columns.
    pub fn join(self, right: Chain, how: JoinType, left_on: &[&str], right_on: &[&str]) -> Self {
        self.step(Step::Join {
            right: Box::new(right),
            how,
            left_on: left_on.iter().map(|s| s.to_string()).collect(),
            right_on: right_on.iter().map(|s| s.to_string()).collect(),
        })
    }

    /// Groups by `keys` and computes DataFusion aggregates (`count`, `sum`, ...).
    pub fn group_by(
        self,
        keys: impl IntoIterator<Item = Expr>,
        aggs: impl IntoIterator<Item = Expr>,
    ) -> Self {
        self.step(Step::GroupBy {
            keys: keys.into_iter().collect(),
            aggs: aggs.into_iter().collect(),
        })
    }

    /// Adds `udf` (any kind: see [`Udf`]), with the settings given so far.
    ///
    /// ```
    /// use udfchain::{Chain, Udf};
    ///
    /// let udf = Udf::map(&["x"], "y", |x: u64| async move { Ok::<_, std::io::Error>(x + 1) })
    ///     .expect("a UDF");
    /// let chain = Chain::from_values(&[1u64, 2, 3]).udf(udf);
    /// # drop(chain);
    /// ```
    pub fn udf(self, udf: impl Into<Udf>) -> Self {
        self.add_udf(Ok(udf.into()))
    }

    fn add_udf(self, kind: Result<Udf, UdfError>) -> Self {
        match kind {
            Ok(kind) => {
                let settings = self.settings.clone();
                self.step(Step::Udf { kind, settings })
            }
            Err(e) => self.fail(Error::plan(e.to_string())),
        }
    }

    /// Adds column `output` = `f(file)` for each row: `async fn(File) -> Result<O>`.
    pub fn map<I, O, E, F, Fut>(self, output: &str, f: F) -> Self
    where
        I: DeserializeOwned + Send + 'static,
        O: Serialize + DeserializeOwned + Send + 'static,
        E: Into<BoxError> + 'static,
        F: Fn(I) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<O, E>> + Send,
    {
        self.map_on(&["file"], output, f)
    }

    /// Like [`Chain::map`], reading the `params` columns (several params give `I`
    /// as a struct with fields named like the columns).
    pub fn map_on<I, O, E, F, Fut>(self, params: &[&str], output: &str, f: F) -> Self
    where
        I: DeserializeOwned + Send + 'static,
        O: Serialize + DeserializeOwned + Send + 'static,
        E: Into<BoxError> + 'static,
        F: Fn(I) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<O, E>> + Send,
    {
        self.add_udf(Udf::map(params, output, f))
    }

    /// Expands each row into the values of the stream `f(file)` returns.
    /// (`gen` is a reserved word in Rust 2024: call it as `.r#gen(..)`.)
    pub fn r#gen<I, O, E, F, S>(self, output: &str, f: F) -> Self
    where
        I: DeserializeOwned + Send + 'static,
        O: Serialize + DeserializeOwned + Send + 'static,
        E: Into<BoxError> + Send + 'static,
        F: Fn(I) -> S + Send + Sync + 'static,
        S: futures::Stream<Item = std::result::Result<O, E>> + Send + 'static,
    {
        self.gen_on(&["file"], output, f)
    }

    /// A gen UDF over the columns `params`, writing column `output` (see [`Chain::gen`]).
    pub fn gen_on<I, O, E, F, S>(self, params: &[&str], output: &str, f: F) -> Self
    where
        I: DeserializeOwned + Send + 'static,
        O: Serialize + DeserializeOwned + Send + 'static,
        E: Into<BoxError> + Send + 'static,
        F: Fn(I) -> S + Send + Sync + 'static,
        S: futures::Stream<Item = std::result::Result<O, E>> + Send + 'static,
    {
        self.add_udf(Udf::r#gen(params, output, f))
    }

    /// Adds column `output` computed `batch_size` rows at a time: `async fn(Vec<File>) -> Result<Vec<O>>`.
    pub fn batch_map<I, O, E, F, Fut>(self, output: &str, f: F) -> Self
    where
        I: DeserializeOwned + Send + 'static,
        O: Serialize + DeserializeOwned + Send + 'static,
        E: Into<BoxError> + 'static,
        F: Fn(Vec<I>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<Vec<O>, E>> + Send,
    {
        self.batch_map_on(&["file"], output, f)
    }

    /// A batch_map UDF over the columns `params`, writing column `output` (see [`Chain::batch_map`]).
    pub fn batch_map_on<I, O, E, F, Fut>(self, params: &[&str], output: &str, f: F) -> Self
    where
        I: DeserializeOwned + Send + 'static,
        O: Serialize + DeserializeOwned + Send + 'static,
        E: Into<BoxError> + 'static,
        F: Fn(Vec<I>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<Vec<O>, E>> + Send,
    {
        self.add_udf(Udf::batch_map(params, output, f))
    }

    /// One call per group of rows with equal `partition_by` values, reading
    /// `params`; the result has the key columns and `output`.
    pub fn agg<I, O, E, F, Fut>(
        self,
        partition_by: &[&str],
        params: &[&str],
        output: &str,
        f: F,
    ) -> Self
    where
        I: DeserializeOwned + Send + 'static,
        O: Serialize + DeserializeOwned + Send + 'static,
        E: Into<BoxError> + 'static,
        F: Fn(Vec<I>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<Vec<O>, E>> + Send,
    {
        self.add_udf(Udf::agg(partition_by, params, output, f))
    }

    /// Declares the version of the UDF added last (e.g. `.map(..).version("2")`):
    /// a save's checkpoint is keyed by it, so results of another version are
    /// never reused; bump it when the UDF's code changes what it returns.
    /// After a step that is not a UDF it is an error at planning.
    pub fn version(mut self, version: &str) -> Self {
        match self.steps.last_mut() {
            Some(Step::Udf { settings, .. }) => {
                *settings = settings.clone().udf_version(version);
                self
            }
            _ => self.fail(Error::plan(format!(
                "version({version:?}) follows a UDF step (map, gen, batch_map, agg)"
            ))),
        }
    }
}

fn values_table<T: Serialize + DeserializeOwned>(values: &[T]) -> Result<Arc<dyn TableProvider>> {
    use datafusion::arrow::datatypes::{DataType, Schema};
    let field =
        udfchain_udfs::engine::trace_field::<T>("value").map_err(|e| Error::plan(e.to_string()))?;
    let array =
        udfchain_udfs::encode_column(&field, values).map_err(|e| Error::plan(e.to_string()))?;
    let batch = match field.data_type() {
        DataType::Struct(_) => {
            let s = datafusion::arrow::array::StructArray::from(array.to_data());
            RecordBatch::from(s)
        }
        _ => RecordBatch::try_new(Arc::new(Schema::new(vec![field.clone()])), vec![array])
            .map_err(|e| Error::from(datafusion::error::DataFusionError::from(e)))?,
    };
    Ok(Arc::new(MemTable::try_new(
        batch.schema(),
        vec![vec![batch]],
    )?))
}

fn empty_plan() -> LogicalPlan {
    LogicalPlan::EmptyRelation(datafusion::logical_expr::EmptyRelation {
        produce_one_row: false,
        schema: Arc::new(datafusion::common::DFSchema::empty()),
    })
}

/// The data file of a dataset version.
const DATA_FILE: &str = "data.parquet";

/// A plan's columns as a dataset version records them: `name: type` per line.
fn schema_text(schema: &datafusion::common::DFSchema) -> String {
    schema
        .fields()
        .iter()
        .map(|f| format!("{}: {}", f.name(), f.data_type()))
        .collect::<Vec<_>>()
        .join("\n")
}
