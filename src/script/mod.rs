//! Scripts: statements in DataFusion's SQL dialect plus udfchain's own.
//! `statement.rs` splits a script and recognises each statement from tokens
//! (any case, whitespace and comments); nothing else here looks at the text.
//!
//! - `SET name = value;` changes a setting for the statements after it
//!   (`prefetch`, `cache`, `parallel`, ..., `storage.<option>`);
//! - `CREATE DATASET name AS query;` saves a new dataset version
//!   (`EXPLAIN CREATE DATASET ...` explains the query and saves nothing);
//! - `SHOW DATASETS;` lists the catalog;
//! - table functions `read_storage`, `read_dataset`, `read_parquet`, `read_csv`,
//!   `read_json`, `tar_members` (see `functions.rs`), and built-in UDFs by name
//!   wherever an expression stands (see `builtins.rs`), planned with the same
//!   `PrefetchExec` as from the Rust API;
//! - everything else (`SELECT`, `EXPLAIN [ANALYZE]`, `CREATE VIEW`, ...) is DataFusion's.
//!
//! `SET` of a credential (`storage.*key*`, `*secret*`, `*token*`, ...) echoes
//! `***`, never the value. Errors carry the line and column in the
//! script (inside the query of a `CREATE DATASET` too); a script that does not split runs nothing; unknown
//! settings, table functions and UDFs suggest the closest known name.

mod builtins;
mod functions;
pub mod statement;

pub use builtins::{Builtin, builtins};
pub(crate) use functions::NAMES as TABLE_FUNCTIONS;
pub use statement::{Kind, Statement, split};

use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{RecordBatch, StringArray, UInt32Array, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema};

use datafusion::logical_expr::{LogicalPlan, LogicalPlanBuilder};

use crate::chain::Chain;
use crate::error::{Error, Result};
use crate::session::Session;
use crate::settings::Settings;
use crate::util::closest;
use crate::util::lock::lock;

/// What a statement produced.
#[derive(Debug, Clone)]
pub enum Output {
    /// Rows (from SELECT, EXPLAIN, SHOW DATASETS).
    Table(Vec<RecordBatch>),
    /// A one-line message (from SET, CREATE DATASET).
    Message(String),
}

/// A statement ready to run: either already done, or a plan to execute (so a
/// caller can watch its metrics while it streams).
pub enum Execution {
    /// Ran already (`SET`, `SHOW DATASETS`, a saved dataset): its output.
    Done(Output),
    /// A query to execute: its plan and the task context to run it in.
    Plan {
        /// The physical plan.
        plan: Arc<dyn datafusion::physical_plan::ExecutionPlan>,
        /// Its task context.
        ctx: Arc<datafusion::execution::TaskContext>,
    },
}

/// Runs scripts in a session. Settings set by `SET` last for the runner's life.
#[derive(Debug)]
pub struct ScriptRunner {
    session: Arc<Session>,
    settings: Arc<Mutex<Settings>>,
    udfs: Arc<Mutex<Vec<Builtin>>>,
}

impl ScriptRunner {
    /// Registers udfchain's table functions and built-in UDFs in `session`.
    pub fn new(session: Arc<Session>) -> Self {
        let settings = Arc::new(Mutex::new(session.settings().clone()));
        let ctx = session.context();
        for (name, f) in functions::table_functions(&settings) {
            ctx.register_udtf(name, f);
        }
        // Infallible in DataFusion 55 (it only inserts the planner).
        let _ = ctx.register_relation_planner(Arc::new(functions::NamedArgs));
        let udfs = builtins::builtins();
        for stub in udfs.iter().filter_map(Builtin::stub) {
            ctx.register_udf(stub);
        }
        let udfs = Arc::new(Mutex::new(udfs));
        ctx.add_analyzer_rule(Arc::new(builtins::BuiltinRewrite {
            settings: Arc::clone(&settings),
            udfs: Arc::clone(&udfs),
        }));
        Self {
            session,
            settings,
            udfs,
        }
    }

    /// Makes `name(column)` callable in this runner's scripts: `make(param,
    /// output)` builds the UDF, e.g. `|p, o| udfchain::udfs::map_fn(&[p], o, my_fn)`.
    /// With `header_only`, calls are planned with `prefetch = 0`.
    pub fn register_map(
        &self,
        name: &str,
        header_only: bool,
        make: impl Fn(
            &str,
            &str,
        )
            -> std::result::Result<Arc<dyn udfchain_udfs::Mapper>, udfchain_udfs::UdfError>
        + Send
        + Sync
        + 'static,
    ) -> Result<()> {
        let b = Builtin::new(name, header_only, Arc::new(make));
        let stub = b
            .stub()
            .ok_or_else(|| Error::plan(format!("UDF {name}: its constructor failed")))?;
        self.session.context().register_udf(stub);
        lock(&self.udfs).push(b);
        Ok(())
    }

    /// Makes `name(column)` call `udf` per row in this runner's scripts: a
    /// map [`Udf`](crate::Udf), e.g. one with state from
    /// `udfchain::udfs::map_with` (set up once in the process, shared by every
    /// call, torn down when the last run using it ends). The call's column is
    /// handed to the UDF as its first param, whatever either is named. A gen,
    /// batch_map or agg UDF is refused: SQL calls a function once per row;
    /// those run in a [`Chain`] ([`Chain::udf`]).
    pub fn register(&self, name: &str, udf: impl Into<crate::Udf>) -> Result<()> {
        let udf = udf.into();
        if !matches!(udf, crate::Udf::Map(_)) {
            return Err(Error::plan(format!(
                "UDF {name}: SQL calls map UDFs (one value per row); this is a {} UDF, \
                 which runs in a Chain (Chain::udf)",
                udf.kind_name()
            )));
        }
        let called = name.to_string();
        self.register_map(name, false, move |param, output| {
            let own = udf.signature();
            let sig = udfchain_udfs::Signature {
                name: called.clone(),
                params: vec![param.to_string()],
                input: own.input.clone(),
                output: own.output.clone().with_name(output),
            };
            match udf.clone().renamed(&sig, &[]) {
                crate::Udf::Map(m) => Ok(m),
                other => Err(udfchain_udfs::UdfError::Contract(format!(
                    "UDF {}: a {} UDF where a map was registered",
                    sig.name,
                    other.kind_name()
                ))),
            }
        })
    }

    /// Applies `name = value` as a `SET` would.
    pub fn set(&self, name: &str, value: &str) -> Result<()> {
        let mut s = lock(&self.settings);
        *s = s.clone().set(name, value)?;
        Ok(())
    }

    /// The settings statements run with now.
    pub fn settings(&self) -> Settings {
        lock(&self.settings).clone()
    }

    /// Runs every statement of `script` in order; stops at the first error.
    /// A script that does not split (see `script/statement.rs`) runs nothing.
    pub async fn run(&self, script: &str) -> Result<Vec<Output>> {
        let mut out = Vec::new();
        for stmt in split(script)? {
            out.push(
                self.run_statement(&stmt)
                    .await
                    .map_err(|e| locate(e, &stmt))?,
            );
        }
        Ok(out)
    }

    /// Runs one statement.
    pub async fn run_statement(&self, stmt: &Statement) -> Result<Output> {
        match &stmt.kind {
            Kind::Set { name, value } => {
                self.set(name, value)?;
                let shown = match name.to_ascii_lowercase().strip_prefix("storage.") {
                    Some(option) if crate::util::redact::is_secret_name(option) => {
                        crate::util::redact::MASK.to_string()
                    }
                    _ => crate::util::redact::redact(value).into_owned(),
                };
                Ok(Output::Message(format!("set {name} = {shown}")))
            }
            Kind::ShowDatasets => Ok(Output::Table(vec![datasets_table(&self.settings()).await?])),
            Kind::CreateDataset { name, query } => {
                let plan = self.plan(query).await?;
                let info = Chain::from_plan(Arc::clone(&self.session), plan)
                    .settings(self.settings())
                    .save(name)
                    .await?;
                Ok(Output::Message(format!(
                    "saved dataset {} version {} ({} rows)",
                    info.name, info.version, info.rows
                )))
            }
            Kind::Explain { .. } | Kind::Sql => match Box::pin(self.execute(stmt)).await? {
                Execution::Done(out) => Ok(out),
                Execution::Plan { plan, ctx } => {
                    let run = datafusion::physical_plan::collect(Arc::clone(&plan), ctx);
                    let show = self.settings().get_progress();
                    let rows = |b: &Vec<RecordBatch>| b.iter().map(|b| b.num_rows()).sum();
                    let batches = crate::progress::run(&plan, run, show, |_| {}, rows).await?;
                    Ok(Output::Table(batches))
                }
            },
        }
    }

    /// Plans a statement: udfchain's own statements run now, queries are
    /// returned as a physical plan to execute. `EXPLAIN CREATE DATASET` explains
    /// the dataset's query.
    pub async fn execute(&self, stmt: &Statement) -> Result<Execution> {
        match &stmt.kind {
            Kind::Set { .. } | Kind::ShowDatasets | Kind::CreateDataset { .. } => {
                Ok(Execution::Done(Box::pin(self.run_statement(stmt)).await?))
            }
            Kind::Explain {
                analyze,
                verbose,
                body,
            } => match &body.kind {
                Kind::CreateDataset { query, .. } => {
                    self.explain_query(query, *verbose, *analyze).await
                }
                _ => self.sql(stmt).await,
            },
            Kind::Sql => self.sql(stmt).await,
        }
    }

    /// DataFusion plans the statement's text.
    async fn sql(&self, stmt: &Statement) -> Result<Execution> {
        let df = self
            .session
            .context()
            .sql(&stmt.text)
            .await
            .map_err(|e| self.explain_unknown(e.into()))?;
        let ctx = Arc::new(df.task_ctx());
        let plan = df.create_physical_plan().await?;
        Ok(Execution::Plan { plan, ctx })
    }

    /// What `udfchain explain` runs for a statement: queries (and the query of
    /// a `CREATE DATASET`) are explained, not run or saved; `SET`, `SHOW
    /// DATASETS` and `EXPLAIN` run as in [`execute`](Self::execute).
    pub async fn explain(&self, stmt: &Statement) -> Result<Execution> {
        match &stmt.kind {
            Kind::CreateDataset { query, .. } => self.explain_query(query, false, false).await,
            Kind::Sql => self.explain_query(stmt, false, false).await,
            Kind::Set { .. } | Kind::ShowDatasets | Kind::Explain { .. } => {
                self.execute(stmt).await
            }
        }
    }

    /// The plan of `EXPLAIN [VERBOSE] [ANALYZE] query`, built from the query's
    /// logical plan (so errors point into the query as written).
    async fn explain_query(
        &self,
        query: &Statement,
        verbose: bool,
        analyze: bool,
    ) -> Result<Execution> {
        let plan = self.plan(query).await?;
        let plan = LogicalPlanBuilder::from(plan)
            .explain(verbose, analyze)?
            .build()?;
        let df = self.session.context().execute_logical_plan(plan).await?;
        let ctx = Arc::new(df.task_ctx());
        let plan = df.create_physical_plan().await?;
        Ok(Execution::Plan { plan, ctx })
    }

    /// The logical plan of a query (nothing runs, DDL included); errors are
    /// located in the script by the query's own position.
    async fn plan(&self, query: &Statement) -> Result<LogicalPlan> {
        let state = self.session.context().state();
        state
            .create_logical_plan(&query.text)
            .await
            .map_err(|e| locate(self.explain_unknown(e.into()), query))
    }

    /// Adds a "did you mean" to unknown table functions.
    fn explain_unknown(&self, e: Error) -> Error {
        let msg = e.to_string();
        let marker = "table function '";
        if let Some(i) = msg.find(marker) {
            let name: String = msg[i + marker.len()..]
                .chars()
                .take_while(|&c| c != '\'')
                .collect();
            if let Some(c) = closest(&name, functions::NAMES.iter().copied()) {
                return Error::Plan(format!("{msg} (did you mean {c}?)"));
            }
        }
        e
    }
}

/// Gives an error the script position: the parser's own line/column (relative
/// to the statement) shifted to the script, else the statement's start. An
/// error already located (e.g. in the query of a `CREATE DATASET`) is kept.
pub fn locate(e: Error, stmt: &Statement) -> Error {
    if let Error::Script { .. } = e {
        return e;
    }
    let msg = e.to_string();
    let (mut line, mut column) = (stmt.line, stmt.column);
    if let Some(i) = msg.find("Line: ") {
        let nums: Vec<usize> = msg[i..]
            .split(|c: char| !c.is_ascii_digit())
            .filter(|s| !s.is_empty())
            .take(2)
            .filter_map(|s| s.parse().ok())
            .collect();
        if let [l, c] = nums[..]
            && l >= 1
            && c >= 1
        {
            column = if l == 1 { stmt.column + c - 1 } else { c };
            line = stmt.line + l - 1;
        }
    }
    Error::Script {
        line,
        column,
        source: Box::new(e),
    }
}

async fn datasets_table(settings: &Settings) -> Result<RecordBatch> {
    let list = crate::dataset::Catalog::open(settings.get_root())
        .await?
        .list()
        .await?;
    let schema = Arc::new(Schema::new(vec![
        Field::new("name", DataType::Utf8, false),
        Field::new("version", DataType::UInt32, false),
        Field::new("rows", DataType::UInt64, false),
        Field::new("bytes", DataType::UInt64, false),
        Field::new("created", DataType::Utf8, false),
    ]));
    let created = |secs: i64| {
        let days = secs.div_euclid(86_400);
        let (y, m, d) = civil_from_days(days);
        let rem = secs.rem_euclid(86_400);
        format!(
            "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
            rem / 3600,
            rem / 60 % 60,
            rem % 60
        )
    };
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(StringArray::from_iter_values(
                list.iter().map(|i| i.name.clone()),
            )),
            Arc::new(UInt32Array::from_iter_values(
                list.iter().map(|i| i.version),
            )),
            Arc::new(UInt64Array::from_iter_values(list.iter().map(|i| i.rows))),
            Arc::new(UInt64Array::from_iter_values(list.iter().map(|i| i.bytes))),
            Arc::new(StringArray::from_iter_values(
                list.iter().map(|i| created(i.created)),
            )),
        ],
    )
    .map_err(|e| Error::from(datafusion::error::DataFusionError::from(e)))
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}
