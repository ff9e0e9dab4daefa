//! Table functions of scripts: `read_storage('uri' [, 'glob'] [, delta => 'dataset'])`
//! (the named arguments are planned by [`NamedArgs`]),
//! `read_dataset('name' [, version])`, `read_parquet/read_csv/read_json('uri')`,
//! and the generator forms `tar_members('uri' [, 'glob'])` (one row per regular
//! member of each tar archive under the URI: columns `file`, the archive;
//! `member`, the member as a `File`; `name`, its path inside the archive) and
//! `webdataset('uri' [, 'glob'])` (one row per sample: `file` and `sample`, a
//! struct of `key`, `members` and `names`, the members sharing a key and their
//! names) and `parquet_rows('uri' [, 'glob'])` (the rows of every Parquet file,
//! as a struct column `row`), with the same `PrefetchExec` as from Rust.
//!
//! Table functions are synchronous in DataFusion; the ones that must read a
//! schema (Parquet, CSV, JSON, datasets) block in place, so scripts run on a
//! multi-threaded tokio runtime (the CLI's is).

use std::sync::{Arc, Mutex};

use datafusion::catalog::{TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::datasource::{ViewTable, provider_as_source, source_as_provider};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::SessionState;
use datafusion::functions::core::expr_fn::get_field;
use datafusion::logical_expr::planner::{
    PlannedRelation, RelationPlanner, RelationPlannerContext, RelationPlanning,
};
use datafusion::logical_expr::{Expr, LogicalPlanBuilder};
use datafusion::prelude::col;
use datafusion::prelude::{CsvReadOptions, JsonReadOptions, ParquetReadOptions, SessionContext};
use datafusion::sql::sqlparser::ast::{FunctionArg, FunctionArgExpr, TableFactor};
use udfchain_udfs::builtins::{ParquetRows, parquet_file_schema, tar_entries, webdataset_samples};
use udfchain_udfs::engine::with_file_source;
use udfchain_udfs::gen_fn;

use crate::cache::StoreSource;
use crate::chain::{Delta, DeltaSource};
use crate::dataset::Catalog;
use crate::error::Error;
use crate::plan::{Udf, UdfNode};
use crate::settings::Settings;
use crate::storage::StorageTable;
use crate::util::lock::lock;

/// The table functions scripts know, for suggestions.
pub const NAMES: &[&str] = &[
    "read_storage",
    "read_dataset",
    "read_parquet",
    "read_csv",
    "read_json",
    "tar_members",
    "webdataset",
    "parquet_rows",
];

#[derive(Debug, Clone, Copy)]
enum Kind {
    Storage,
    Dataset,
    Parquet,
    Csv,
    Json,
    TarMembers,
    WebDataset,
    ParquetRows,
}

/// One table function, reading the script's current settings.
#[derive(Debug)]
pub struct TableFn {
    kind: Kind,
    settings: Arc<Mutex<Settings>>,
}

/// All table functions, by name.
pub fn table_functions(
    settings: &Arc<Mutex<Settings>>,
) -> Vec<(&'static str, Arc<dyn TableFunctionImpl>)> {
    let f = |kind| -> Arc<dyn TableFunctionImpl> {
        Arc::new(TableFn {
            kind,
            settings: Arc::clone(settings),
        })
    };
    vec![
        ("read_storage", f(Kind::Storage)),
        ("read_dataset", f(Kind::Dataset)),
        ("read_parquet", f(Kind::Parquet)),
        ("read_csv", f(Kind::Csv)),
        ("read_json", f(Kind::Json)),
        ("tar_members", f(Kind::TarMembers)),
        ("webdataset", f(Kind::WebDataset)),
        ("parquet_rows", f(Kind::ParquetRows)),
    ]
}

fn string_arg(args: &[Expr], i: usize, what: &str) -> DfResult<Option<String>> {
    match args.get(i) {
        None => Ok(None),
        Some(Expr::Literal(v, _)) => match v.try_as_str() {
            Some(Some(s)) => Ok(Some(s.to_string())),
            _ => Ok(Some(v.to_string())),
        },
        Some(other) => Err(DataFusionError::Plan(format!(
            "{what} must be a literal, got {other}"
        ))),
    }
}

/// Runs `fut` to completion from synchronous code inside the runtime.
fn block<T>(fut: impl Future<Output = T>) -> DfResult<T> {
    let handle = tokio::runtime::Handle::try_current()
        .map_err(|_| DataFusionError::Plan("scripts must run inside a tokio runtime".into()))?;
    if handle.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread {
        return Err(DataFusionError::Plan(
            "this table function needs a multi-threaded tokio runtime".into(),
        ));
    }
    Ok(tokio::task::block_in_place(|| handle.block_on(fut)))
}

impl TableFunctionImpl for TableFn {
    fn call_with_args(&self, args: TableFunctionArgs) -> DfResult<Arc<dyn TableProvider>> {
        let settings = lock(&self.settings).clone();
        let exprs = args.exprs();
        let first = string_arg(exprs, 0, "the first argument")?.ok_or_else(|| {
            DataFusionError::Plan("missing the first argument (a URI or name)".into())
        })?;
        let state = args
            .session()
            .as_any()
            .downcast_ref::<SessionState>()
            .ok_or_else(|| DataFusionError::Plan("table functions need a SessionState".into()))?;
        let options = settings.get_storage_options().clone();
        let open = |uri: &str| -> DfResult<()> {
            crate::storage::open_source(state.runtime_env(), uri, &options).map_err(Error::into_df)
        };
        let ctx = || SessionContext::new_with_state(state.clone());
        match self.kind {
            Kind::Storage | Kind::TarMembers | Kind::WebDataset => {
                let glob = string_arg(exprs, 1, "the glob")?;
                let table = StorageTable::try_new(&first, true, glob, options.clone())
                    .map_err(Error::into_df)?;
                open(&first)?;
                let scan = LogicalPlanBuilder::scan(
                    "storage",
                    provider_as_source(Arc::new(table.clone())),
                    None,
                )?
                .build()?;
                if let Kind::Storage = self.kind {
                    return Ok(Arc::new(table));
                }
                let plan_err = |e: udfchain_udfs::UdfError| DataFusionError::Plan(e.to_string());
                if let Kind::WebDataset = self.kind {
                    let udf = gen_fn(&["file"], "sample", webdataset_samples).map_err(plan_err)?;
                    let node =
                        UdfNode::try_new(scan, Udf::Gen(udf), settings).map_err(Error::into_df)?;
                    return Ok(Arc::new(ViewTable::new(node.into_plan(), None)));
                }
                // One row per member: the entry struct split into `member` and `name`.
                let udf = gen_fn(&["file"], "entry", tar_entries).map_err(plan_err)?;
                let node =
                    UdfNode::try_new(scan, Udf::Gen(udf), settings).map_err(Error::into_df)?;
                let plan = LogicalPlanBuilder::from(node.into_plan())
                    .project([
                        col("file"),
                        get_field(col("entry"), "member").alias("member"),
                        get_field(col("entry"), "name").alias("name"),
                    ])?
                    .build()?;
                Ok(Arc::new(ViewTable::new(plan, None)))
            }
            Kind::ParquetRows => {
                let glob =
                    string_arg(exprs, 1, "the glob")?.unwrap_or_else(|| "**/*.parquet".into());
                let table = StorageTable::try_new(&first, true, Some(glob), options.clone())
                    .map_err(Error::into_df)?;
                open(&first)?;
                let provider: Arc<dyn TableProvider> = Arc::new(table);
                let env = Arc::clone(state.runtime_env());
                // The schema of the first file is the schema of every file's rows.
                let schema = block(async {
                    let batches = ctx()
                        .read_table(Arc::clone(&provider))?
                        .limit(0, Some(1))?
                        .collect()
                        .await?;
                    let file = batches
                        .iter()
                        .find(|b| b.num_rows() > 0)
                        .map(|b| udfchain_udfs::decode_column::<udfchain_udfs::File>(b.column(0)))
                        .transpose()
                        .map_err(|e| DataFusionError::Plan(e.to_string()))?
                        .and_then(|mut f| f.pop())
                        .ok_or_else(|| {
                            DataFusionError::Plan(format!(
                                "parquet_rows: no Parquet file under {first}"
                            ))
                        })?;
                    // Its footer alone, read by range: never the whole file.
                    let source = Arc::new(StoreSource::new(env, options.clone(), None));
                    let url = file.url();
                    with_file_source(source, parquet_file_schema(file))
                        .await
                        .map_err(|e| match e {
                            udfchain_udfs::UdfError::Read { .. } => Error::Storage {
                                url,
                                source: Arc::new(e),
                            }
                            .into_df(),
                            e => DataFusionError::Plan(format!("{url}: {e}")),
                        })
                })??;
                let scan = LogicalPlanBuilder::scan("storage", provider_as_source(provider), None)?
                    .build()?;
                let udf = ParquetRows::udf("file", "row", schema);
                let node =
                    UdfNode::try_new(scan, Udf::Gen(udf), settings).map_err(Error::into_df)?;
                Ok(Arc::new(ViewTable::new(node.into_plan(), None)))
            }
            Kind::Dataset => {
                let version = string_arg(exprs, 1, "the version")?
                    .map(|v| {
                        v.parse::<u32>()
                            .map_err(|_| DataFusionError::Plan(format!("bad version {v:?}")))
                    })
                    .transpose()?;
                // Catalog work blocks: it runs on the blocking pool.
                let root = settings.get_root();
                let info =
                    block(async move { Catalog::open(root).await?.get(&first, version).await })?
                        .map_err(Error::into_df)?;
                let path = info.path.join("data.parquet").display().to_string();
                let df = block(ctx().read_parquet(path, ParquetReadOptions::default()))??;
                Ok(df.into_view())
            }
            Kind::Parquet => {
                open(&first)?;
                Ok(block(ctx().read_parquet(first, ParquetReadOptions::default()))??.into_view())
            }
            Kind::Csv => {
                open(&first)?;
                Ok(block(ctx().read_csv(first, CsvReadOptions::default()))??.into_view())
            }
            Kind::Json => {
                open(&first)?;
                let opts = JsonReadOptions {
                    file_extension: if first.ends_with(".jsonl") {
                        ".jsonl"
                    } else {
                        ".json"
                    },
                    ..Default::default()
                };
                Ok(block(ctx().read_json(first, opts))??.into_view())
            }
        }
    }
}

/// Plans `read_storage(uri [, glob], delta => 'name' [, delta_on => 'a,b']
/// [, delta_compare => 'c,d'])`: DataFusion passes a table function's
/// arguments without their names, so calls with named arguments are planned
/// here, before it sees them. `delta` marks the listing for a delta save of
/// dataset `name` (see `chain/delta.rs`); `delta_on` and `delta_compare` are
/// comma-separated column names (defaults `file.path` and `file.etag,file.version`).
#[derive(Debug)]
pub struct NamedArgs;

/// The named arguments `read_storage` takes.
const NAMED: &[&str] = &["delta", "delta_on", "delta_compare"];

impl RelationPlanner for NamedArgs {
    fn plan_relation(
        &self,
        relation: TableFactor,
        context: &mut dyn RelationPlannerContext,
    ) -> DfResult<RelationPlanning> {
        let TableFactor::Table {
            name,
            args: Some(args),
            alias,
            ..
        } = &relation
        else {
            return Ok(RelationPlanning::Original(Box::new(relation)));
        };
        let function = context.object_name_to_table_reference(name.clone())?;
        let named = args
            .args
            .iter()
            .any(|a| matches!(a, FunctionArg::Named { .. }));
        if !named || function.table() != "read_storage" {
            return Ok(RelationPlanning::Original(Box::new(relation)));
        }
        let empty = datafusion::common::DFSchema::empty();
        let (mut positional, mut values) = (Vec::new(), std::collections::BTreeMap::new());
        for arg in &args.args {
            match arg {
                FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => {
                    positional.push(context.sql_to_expr(e.clone(), &empty)?);
                }
                FunctionArg::Named {
                    name,
                    arg: FunctionArgExpr::Expr(e),
                    ..
                } => {
                    let key = context.normalize_ident(name.clone());
                    if !NAMED.contains(&key.as_str()) {
                        let hint = crate::util::closest(&key, NAMED.iter().copied())
                            .map(|c| format!(" (did you mean {c}?)"))
                            .unwrap_or_default();
                        return Err(DataFusionError::Plan(format!(
                            "read_storage has no argument {key:?}{hint}; its named arguments are {}",
                            NAMED.join(", ")
                        )));
                    }
                    let value = context.sql_to_expr(e.clone(), &empty)?;
                    let text = string_arg(&[value], 0, &format!("{key} =>"))?.unwrap_or_default();
                    values.insert(key, text);
                }
                other => {
                    return Err(DataFusionError::Plan(format!(
                        "unsupported argument of read_storage: {other}"
                    )));
                }
            }
        }
        let Some(dataset) = values.remove("delta") else {
            return Err(DataFusionError::Plan(
                "read_storage: delta_on and delta_compare need delta => 'dataset name'".into(),
            ));
        };
        let source = context
            .context_provider()
            .get_table_function_source("read_storage", positional)?;
        let table = source_as_provider(&source)?
            .downcast_ref::<StorageTable>()
            .cloned()
            .ok_or_else(|| DataFusionError::Plan("read_storage did not list storage".into()))?;
        let list = |key: &str| -> Vec<String> {
            values
                .get(key)
                .map(|v| v.split(',').map(|s| s.trim().to_string()).collect())
                .unwrap_or_default()
        };
        let (on, compare) = (list("delta_on"), list("delta_compare"));
        let on: Vec<&str> = on.iter().map(String::as_str).collect();
        let compare: Vec<&str> = compare.iter().map(String::as_str).collect();
        let delta = Delta::new(Some(dataset), &on, &compare);
        let plan = LogicalPlanBuilder::scan(
            "read_storage()",
            provider_as_source(Arc::new(DeltaSource { table, delta })),
            None,
        )?
        .build()?;
        Ok(RelationPlanning::Planned(Box::new(PlannedRelation::new(
            plan,
            alias.clone(),
        ))))
    }
}
