//! [`Chain`]: the builder users write, turned into a DataFusion `LogicalPlan`
//! when it runs.
//!
//! Building is cheap and never fails: a chain is a source plus a list of steps,
//! and every error (bad URI, unknown column, a UDF whose declared input does not
//! match its column) is returned by the first call that plans it (`collect`,
//! `explain`, ...). UDFs capture the chain's settings at the point they are added.
//! [`Chain::new`] starts a [`ChainBuilder`] that takes settings (and a session)
//! before the source; a chain without a source cannot be built, so none can run.

mod builder;
mod expr;

pub use crate::settings::{OnError, Prefetch, Settings, parse_size};
pub use builder::ChainBuilder;
pub use expr::col;

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::catalog::TableProvider;
use datafusion::common::JoinType;
use datafusion::datasource::{MemTable, provider_as_source};
use datafusion::logical_expr::{Expr, LogicalPlan, LogicalPlanBuilder, SortExpr};
use datafusion::physical_plan::display::DisplayableExecutionPlan;
use datafusion::physical_plan::displayable;
use datafusion::prelude::{CsvReadOptions, DataFrame, JsonReadOptions, ParquetReadOptions};
use futures::stream::{BoxStream, StreamExt, TryStreamExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use udfchain_udfs::{
    Aggregator, BatchMapper, BoxError, Generator, Mapper, UdfError, agg_fn, batch_map_fn, gen_fn,
    map_fn,
};

use crate::dataset::{Catalog, DatasetInfo};
use crate::error::{Error, Result};
use crate::plan::{RunReport, UdfKind, UdfNode};
use crate::progress::{self, Progress};
use crate::session::Session;
use crate::storage::{Location, StorageTable};
use crate::util::redact::redact;

/// Where a chain's rows come from.
#[derive(Clone)]
enum Source {
    Storage {
        uri: String,
        recursive: bool,
        glob: Option<String>,
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
        kind: UdfKind,
        settings: Settings,
    },
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
    /// Starts a chain whose settings (and session) come before its source, as
    /// in `Chain::new().settings(..).from_storage(uri).map(..)`; the same plan
    /// as `Chain::from_storage(uri).settings(..).map(..)`.
    // The design's entry point: a chain with no source yet is a builder, so
    // that one without a source cannot run.
    #[allow(clippy::new_ret_no_self)]
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

    pub fn order_by(self, sort: impl IntoIterator<Item = SortExpr>) -> Self {
        self.step(Step::OrderBy(sort.into_iter().collect()))
    }

    pub fn limit(self, n: usize) -> Self {
        self.step(Step::Limit {
            skip: 0,
            fetch: Some(n),
        })
    }

    pub fn offset(self, n: usize) -> Self {
        self.step(Step::Limit {
            skip: n,
            fetch: None,
        })
    }

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

    fn udf(self, kind: Result<UdfKind, UdfError>) -> Self {
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
        let udf = map_fn(params, output, f).map(UdfKind::Map);
        self.udf(udf)
    }

    pub fn map_udf(self, udf: Arc<dyn Mapper>) -> Self {
        self.udf(Ok(UdfKind::Map(udf)))
    }

    /// Expands each row into the values of the stream `f(file)` returns.
    /// (`gen` is a reserved word in Rust 2024; call it as `.r#gen(..)` or `.generate(..)`.)
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

    /// Same as [`Chain::r#gen`].
    pub fn generate<I, O, E, F, S>(self, output: &str, f: F) -> Self
    where
        I: DeserializeOwned + Send + 'static,
        O: Serialize + DeserializeOwned + Send + 'static,
        E: Into<BoxError> + Send + 'static,
        F: Fn(I) -> S + Send + Sync + 'static,
        S: futures::Stream<Item = std::result::Result<O, E>> + Send + 'static,
    {
        self.gen_on(&["file"], output, f)
    }

    pub fn gen_on<I, O, E, F, S>(self, params: &[&str], output: &str, f: F) -> Self
    where
        I: DeserializeOwned + Send + 'static,
        O: Serialize + DeserializeOwned + Send + 'static,
        E: Into<BoxError> + Send + 'static,
        F: Fn(I) -> S + Send + Sync + 'static,
        S: futures::Stream<Item = std::result::Result<O, E>> + Send + 'static,
    {
        let udf = gen_fn(params, output, f).map(UdfKind::Gen);
        self.udf(udf)
    }

    pub fn gen_udf(self, udf: Arc<dyn Generator>) -> Self {
        self.udf(Ok(UdfKind::Gen(udf)))
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

    pub fn batch_map_on<I, O, E, F, Fut>(self, params: &[&str], output: &str, f: F) -> Self
    where
        I: DeserializeOwned + Send + 'static,
        O: Serialize + DeserializeOwned + Send + 'static,
        E: Into<BoxError> + 'static,
        F: Fn(Vec<I>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<Vec<O>, E>> + Send,
    {
        let udf = batch_map_fn(params, output, f).map(UdfKind::BatchMap);
        self.udf(udf)
    }

    pub fn batch_map_udf(self, udf: Arc<dyn BatchMapper>) -> Self {
        self.udf(Ok(UdfKind::BatchMap(udf)))
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
        let keys = partition_by.iter().map(|s| s.to_string()).collect();
        let udf = agg_fn(params, output, f).map(|udf| UdfKind::Agg {
            udf,
            partition_by: keys,
        });
        self.udf(udf)
    }

    pub fn agg_udf(self, partition_by: &[&str], udf: Arc<dyn Aggregator>) -> Self {
        let partition_by = partition_by.iter().map(|s| s.to_string()).collect();
        self.udf(Ok(UdfKind::Agg { udf, partition_by }))
    }

    /// The DataFusion logical plan of this chain.
    pub async fn logical_plan(&self) -> Result<LogicalPlan> {
        Box::pin(self.build()).await
    }

    async fn build(&self) -> Result<LogicalPlan> {
        let mut plan = self.source_plan().await?;
        for step in &self.steps {
            plan = self.apply(plan, step).await?;
        }
        Ok(plan)
    }

    async fn source_plan(&self) -> Result<LogicalPlan> {
        let ctx = self.session.context();
        let options = self.settings.get_storage_options();
        let open =
            |uri: &str| crate::storage::open_source(ctx.runtime_env().as_ref(), uri, options);
        let df = match &self.source {
            Source::Storage {
                uri,
                recursive,
                glob,
            } => {
                let table = StorageTable::try_new(uri, *recursive, glob.clone(), options.clone())?;
                return Ok(LogicalPlanBuilder::scan(
                    "storage",
                    provider_as_source(Arc::new(table)),
                    None,
                )?
                .build()?);
            }
            Source::Table(t) => {
                return Ok(LogicalPlanBuilder::scan(
                    "values",
                    provider_as_source(Arc::clone(t)),
                    None,
                )?
                .build()?);
            }
            Source::Plan(p) => return Ok(p.clone()),
            Source::Parquet(uri) => {
                open(uri)?;
                ctx.read_parquet(uri.as_str(), ParquetReadOptions::default())
                    .await?
            }
            Source::Csv(uri) => {
                open(uri)?;
                ctx.read_csv(uri.as_str(), CsvReadOptions::default())
                    .await?
            }
            Source::Dataset { name, version } => {
                let info = Catalog::open_async(self.settings.get_root())
                    .await?
                    .get_async(name, *version)
                    .await?;
                let path = info.path.join(DATA_FILE);
                ctx.read_parquet(path.display().to_string(), ParquetReadOptions::default())
                    .await?
            }
            Source::Json(uri) => {
                open(uri)?;
                let opts = JsonReadOptions {
                    file_extension: if uri.ends_with(".jsonl") {
                        ".jsonl"
                    } else {
                        ".json"
                    },
                    ..Default::default()
                };
                ctx.read_json(uri.as_str(), opts).await?
            }
        };
        Ok(df.into_unoptimized_plan())
    }

    async fn apply(&self, plan: LogicalPlan, step: &Step) -> Result<LogicalPlan> {
        let b = LogicalPlanBuilder::from(plan);
        let plan = match step {
            Step::Filter(e) => b.filter(e.clone())?.build()?,
            Step::Select(exprs) => b.project(exprs.clone())?.build()?,
            Step::Mutate(name, e) => {
                let df = DataFrame::new(self.session.state(), b.build()?);
                df.with_column(name, e.clone())?.into_unoptimized_plan()
            }
            Step::OrderBy(sort) => b.sort(sort.clone())?.build()?,
            Step::Limit { skip, fetch } => b.limit(*skip, *fetch)?.build()?,
            Step::Distinct => b.distinct()?.build()?,
            Step::Union(other) => b.union_by_name(other.logical_plan().await?)?.build()?,
            Step::Join {
                right,
                how,
                left_on,
                right_on,
            } => {
                let right = right.logical_plan().await?;
                b.join(right, *how, (left_on.clone(), right_on.clone()), None)?
                    .build()?
            }
            Step::GroupBy { keys, aggs } => b.aggregate(keys.clone(), aggs.clone())?.build()?,
            Step::Udf { kind, settings } => {
                UdfNode::try_new(b.build()?, kind.clone(), settings.clone())?.into_plan()
            }
            Step::Fail(e) => return Err(e.clone()),
        };
        Ok(plan)
    }

    async fn dataframe(&self) -> Result<DataFrame> {
        Ok(DataFrame::new(
            self.session.state(),
            self.logical_plan().await?,
        ))
    }

    /// Runs the chain and returns all result batches.
    ///
    /// # Cancel safety
    /// Dropping the future cancels the run, its UDF calls and downloads.
    pub async fn collect(&self) -> Result<Vec<RecordBatch>> {
        self.collect_watched(|_| {}).await
    }

    /// Shows the progress of this chain's runs (`collect`, `to_rows`, `show`,
    /// `save`, `to_parquet`, `collect_with_report`, `explain_analyze`; not
    /// `stream`, whose consumer sets the pace, nor `count`): a
    /// live display on stderr when it is a terminal and `CI` is unset, and a
    /// one-line summary on stderr after each run over files (or of a second
    /// or more), e.g. `3000 rows, 3000 files, 2.9 MiB fetched in 1.4 s`. Same as
    /// `.settings(Settings::new().progress(on))`.
    pub fn progress(mut self, on: bool) -> Self {
        self.settings = self.settings.progress(on);
        self
    }

    /// Runs the chain like [`collect`](Self::collect), calling `on_progress`
    /// with the run's [`Progress`] at once, every [`TICK`](crate::progress::TICK)
    /// while it runs (read from the operators' metrics), and once after it
    /// ended (`finished = true`, final counts).
    ///
    /// # Cancel safety
    /// Dropping the future cancels the run; `on_progress` is not called again.
    pub async fn collect_with_progress(
        &self,
        on_progress: impl FnMut(&Progress),
    ) -> Result<Vec<RecordBatch>> {
        self.collect_watched(on_progress).await
    }

    async fn collect_watched(
        &self,
        on_progress: impl FnMut(&Progress),
    ) -> Result<Vec<RecordBatch>> {
        let df = self.dataframe().await?;
        let ctx = Arc::new(df.task_ctx());
        let physical = df.create_physical_plan().await?;
        let run = datafusion::physical_plan::collect(Arc::clone(&physical), ctx);
        let show = self.settings.get_progress();
        Ok(progress::run(&physical, run, show, on_progress, |b| rows(b)).await?)
    }

    /// Runs the chain and converts every row to `T` (fields named like columns).
    pub async fn to_rows<T: DeserializeOwned>(&self) -> Result<Vec<T>> {
        let mut out = Vec::new();
        for batch in self.collect().await? {
            let rows: Vec<T> = serde_arrow::from_record_batch(&batch).map_err(|e| {
                Error::plan(format!(
                    "converting rows to {}: {e}",
                    std::any::type_name::<T>()
                ))
            })?;
            out.extend(rows);
        }
        Ok(out)
    }

    /// Runs the chain as a stream of batches.
    ///
    /// # Cancel safety
    /// Dropping the stream stops the run: no more input is pulled, running UDF
    /// calls and downloads are aborted.
    pub async fn stream(&self) -> Result<BoxStream<'static, Result<RecordBatch>>> {
        let s = self.dataframe().await?.execute_stream().await?;
        Ok(s.map_err(Error::from).boxed())
    }

    /// The number of result rows.
    pub async fn count(&self) -> Result<usize> {
        Ok(self.dataframe().await?.count().await?)
    }

    /// The first `n` rows as an aligned table.
    pub async fn to_table_string(&self, n: usize) -> Result<String> {
        let batches = self.clone().limit(n).collect().await?;
        Ok(pretty_format_batches(&batches)
            .map_err(|e| Error::from(datafusion::error::DataFusionError::from(e)))?
            .to_string())
    }

    /// Prints the first `n` rows.
    pub async fn show(&self, n: usize) -> Result<()> {
        println!("{}", self.to_table_string(n).await?);
        Ok(())
    }

    /// Runs the chain and saves the result as the next version of dataset `name`
    /// (Parquet under the root dir, registered in the catalog). A bad `name`
    /// fails before anything runs; catalog work runs on the blocking pool.
    ///
    /// # Cancel safety
    /// Dropping the future before the run has finished leaves no version and
    /// removes the partial files at once; once the commit has started it runs
    /// to completion. A killed process leaves no visible version; its partial
    /// files are removed by the next `Catalog::open` under the root.
    pub async fn save(&self, name: &str) -> Result<DatasetInfo> {
        self.save_with_progress(name, |_| {}).await
    }

    /// Saves like [`save`](Self::save), calling `on_progress` as
    /// [`collect_with_progress`](Self::collect_with_progress) does while the
    /// rows are computed and written.
    ///
    /// # Cancel safety
    /// As [`save`](Self::save).
    pub async fn save_with_progress(
        &self,
        name: &str,
        on_progress: impl FnMut(&Progress),
    ) -> Result<DatasetInfo> {
        crate::dataset::check_name(name)?;
        let catalog = Catalog::open_async(self.settings.get_root()).await?;
        let staging = catalog.staging_dir_async().await?;
        match self.write_dataset(staging.path(), on_progress).await {
            Ok((schema, rows, query)) => {
                catalog
                    .commit_async(name, staging, schema, rows, query)
                    .await
            }
            Err(e) => {
                // Removing the partial files is blocking file work too.
                let _ = tokio::task::spawn_blocking(move || drop(staging)).await;
                Err(e)
            }
        }
    }

    /// Writes the rows into `dir` as one Parquet file (see `write_parquet`).
    async fn write_dataset(
        &self,
        dir: &std::path::Path,
        on_progress: impl FnMut(&Progress),
    ) -> Result<(String, u64, String)> {
        let df = self.dataframe().await?;
        let query = redact(&df.logical_plan().display_indent().to_string()).into_owned();
        let schema = df
            .schema()
            .fields()
            .iter()
            .map(|f| format!("{}: {}", f.name(), f.data_type()))
            .collect::<Vec<_>>()
            .join("\n");
        let path = dir.join(DATA_FILE).display().to_string();
        let rows = self.write_parquet(df, path, on_progress).await?;
        Ok((schema, rows as u64, query))
    }

    /// Writes `df` as one Parquet file at `path` and returns the rows written:
    /// the plan of `DataFrame::write_parquet` (a `COPY TO`), executed here so
    /// that its operators' metrics can be watched while it runs.
    async fn write_parquet(
        &self,
        df: DataFrame,
        path: String,
        on_progress: impl FnMut(&Progress),
    ) -> Result<usize> {
        use datafusion::datasource::file_format::format_as_file_type;
        use datafusion::datasource::file_format::parquet::ParquetFormatFactory;

        let (state, plan) = df.into_parts();
        let copy = LogicalPlanBuilder::copy_to(
            plan,
            path,
            format_as_file_type(Arc::new(ParquetFormatFactory::new())),
            [("single_file_output".to_string(), "true".to_string())].into(),
            vec![],
        )?
        .build()?;
        let df = DataFrame::new(state, copy);
        let ctx = Arc::new(df.task_ctx());
        let physical = df.create_physical_plan().await?;
        let run = datafusion::physical_plan::collect(Arc::clone(&physical), ctx);
        let show = self.settings.get_progress();
        let counts = progress::run(&physical, run, show, on_progress, |c| written(c)).await?;
        Ok(written(&counts))
    }

    /// Writes the result as one Parquet file at `uri` (local or in a store).
    pub async fn to_parquet(&self, uri: &str) -> Result<()> {
        if let Ok(loc) = Location::parse_output(uri) {
            crate::storage::open_store(
                self.session.context().runtime_env().as_ref(),
                &loc,
                self.settings.get_storage_options(),
            )?;
        }
        let df = self.dataframe().await?;
        self.write_parquet(df, uri.to_string(), |_| {}).await?;
        Ok(())
    }

    /// The optimized logical plan and the physical plan, with each UDF operator
    /// by name and kind.
    pub async fn explain(&self) -> Result<String> {
        let df = self.dataframe().await?;
        let logical = df.clone().into_optimized_plan()?;
        let physical = df.create_physical_plan().await?;
        let text = format!(
            "logical plan:\n{}\n\nphysical plan:\n{}",
            logical.display_indent(),
            displayable(physical.as_ref()).indent(true)
        );
        Ok(redact(&text).into_owned())
    }

    /// Runs the chain and returns the physical plan annotated with metrics
    /// (prefetch: files fetched, bytes, cache hits, UDF wait, peak in flight, retries, skips).
    pub async fn explain_analyze(&self) -> Result<String> {
        let (_, physical) = self.run_plan().await?;
        let text = DisplayableExecutionPlan::with_metrics(physical.as_ref())
            .indent(true)
            .to_string();
        Ok(redact(&text).into_owned())
    }

    /// Runs the chain and returns its batches with a [`RunReport`] (metrics of
    /// every operator, files skipped under `on_error = skip`).
    pub async fn collect_with_report(&self) -> Result<(Vec<RecordBatch>, RunReport)> {
        let (batches, physical) = self.run_plan().await?;
        Ok((batches, RunReport::from_plan(&physical)))
    }

    async fn run_plan(
        &self,
    ) -> Result<(
        Vec<RecordBatch>,
        Arc<dyn datafusion::physical_plan::ExecutionPlan>,
    )> {
        let physical = self.dataframe().await?.create_physical_plan().await?;
        let ctx = self.session.context().task_ctx();
        let run = datafusion::physical_plan::collect(Arc::clone(&physical), ctx);
        let show = self.settings.get_progress();
        let batches = progress::run(&physical, run, show, |_| {}, |b| rows(b)).await?;
        Ok((batches, physical))
    }
}

fn values_table<T: Serialize + DeserializeOwned>(values: &[T]) -> Result<Arc<dyn TableProvider>> {
    use datafusion::arrow::datatypes::{DataType, Schema};
    let field = udfchain_udfs::trace_field::<T>("value").map_err(|e| Error::plan(e.to_string()))?;
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

fn rows(batches: &[RecordBatch]) -> usize {
    batches.iter().map(|b| b.num_rows()).sum()
}

/// The rows a `COPY TO` wrote: the sum of its one `count` column.
fn written(counts: &[RecordBatch]) -> usize {
    counts
        .first()
        .and_then(|b| {
            b.column(0)
                .as_any()
                .downcast_ref::<datafusion::arrow::array::UInt64Array>()
        })
        .map(|a| a.iter().flatten().sum::<u64>() as usize)
        .unwrap_or(0)
}

/// The data file of a dataset version.
const DATA_FILE: &str = "data.parquet";

/// The chains and the catalog of a session: here rather than in `session/`, which
/// sits below the builder and the catalog and does not import them.
impl Session {
    /// A chain over the latest version of dataset `name` (under this session's root).
    pub fn from_dataset(self: &Arc<Self>, name: &str) -> Chain {
        Chain::from_dataset(name).in_session(Arc::clone(self))
    }

    /// The dataset catalog under this session's root dir. Blocks on SQLite:
    /// async code can use [`Catalog::open_async`].
    pub fn catalog(&self) -> Result<Catalog> {
        Catalog::open(&self.settings().get_root())
    }

    /// A chain over the objects under `uri` (recursive).
    pub fn from_storage(self: &Arc<Self>, uri: &str) -> Chain {
        Chain::from_storage_in(Arc::clone(self), uri)
    }
}
