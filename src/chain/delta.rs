//! Delta saves: the next version of a dataset computed from the files added
//! or changed since its latest version, as DataChain's `delta=True` does.
//!
//! A chain over storage marked with [`Chain::delta`] (or SQL's
//! `read_storage(uri, delta => 'name')`) and saved as dataset `D` gives
//!
//! ```text
//! (rows of D's latest version whose `on` keys are still listed with equal `compare` values)
//! UNION ALL
//! (the chain's steps over the listed files whose (`on`, `compare`) values are not in D's latest version)
//! ```
//!
//! so files deleted from the bucket drop out, changed ones are computed again
//! and unchanged ones are neither downloaded nor passed to a UDF: the delta
//! source is an anti-join of the listing against the previous version's keys,
//! placed where the listing was, below every step. Without a previous
//! version the save is a full run.
//!
//! What "unchanged" means: the `on` keys are equal and so is every `compare`
//! value, where **a null is never equal to anything** (a value that is not
//! known never says "same": the file is computed again). The default compare
//! is one change token per file: its ETag and version when the listing has
//! either (`e:<etag>|v:<version>`), else its size and last-modified time
//! (`s:<size>|m:<time>`), since some S3 servers' listings carry no ETag; a
//! file with neither is always computed again, and a file whose token changed
//! kind between two listings (an ETag now, none before) is too. The listing is read twice (once
//! for the anti-join, once to keep the unchanged files' previous rows): LIST
//! requests, never an object GET. A file the previous version has no row for
//! (filtered out, skipped under `on_error = skip`, a `gen` that yielded
//! nothing) is new to every delta save and goes through the steps again,
//! which gives what a full run gives.
//!
//! Guarantees: the result equals a full run over the same listing when every
//! step is row-local (a row's output depends on that row alone). Steps that are
//! not (aggregates and agg UDFs, joins, unions, distinct, limits, window
//! functions, subqueries) are refused, naming the step and the setting
//! `delta_unsafe` that allows them (then they see only the new and changed
//! files, as in DataChain). The previous version must have the schema the
//! chain outputs now (else an error saying to save without delta once).
//! Order: an `order_by` that ends the chain orders the whole new version (it is
//! applied after the union); without one the previous rows and the new ones
//! are interleaved in no promised order.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, JoinType, TableReference};
use datafusion::datasource::{provider_as_source, source_as_provider};
use datafusion::error::Result as DfResult;
use datafusion::functions::core::expr_fn::get_field;
use datafusion::logical_expr::expr_rewriter::unnormalize_col;
use datafusion::logical_expr::{
    Expr, LogicalPlan, LogicalPlanBuilder, SortExpr, TableScan, TableType,
};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::ParquetReadOptions;

use super::{Chain, DATA_FILE, Source, schema_text};
use crate::dataset::{Catalog, DatasetInfo};
use crate::error::{Error, Result};
use crate::plan::{Udf, UdfNode};
use crate::storage::{StorageTable, file_schema};

/// Which rows a delta save compares: `on` identifies a file (default
/// `file.path`), `compare` tells whether it changed (default: the change
/// token of the header, from `file.etag` and `file.version`, else
/// `file.size` and `file.last_modified`). Names reach into struct columns
/// with dots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Delta {
    /// The dataset whose latest version is the base (`None`: the one saved).
    pub(crate) dataset: Option<String>,
    pub(crate) on: Vec<String>,
    /// Empty: the default change token.
    pub(crate) compare: Vec<String>,
}

/// The fields of `file` the default change token reads.
const TOKEN_FIELDS: [&str; 4] = [
    "file.etag",
    "file.version",
    "file.size",
    "file.last_modified",
];

impl Delta {
    /// `on` and `compare` as given; empty lists take the defaults.
    pub(crate) fn new(dataset: Option<String>, on: &[&str], compare: &[&str]) -> Self {
        let names = |given: &[&str]| given.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        Self {
            dataset,
            on: if on.is_empty() {
                vec!["file.path".to_string()]
            } else {
                names(on)
            },
            compare: names(compare),
        }
    }

    /// The names of the columns the keys read.
    fn names(&self) -> Vec<&str> {
        let compare = if self.compare.is_empty() {
            TOKEN_FIELDS.to_vec()
        } else {
            self.compare.iter().map(String::as_str).collect()
        };
        self.on.iter().map(String::as_str).chain(compare).collect()
    }

    /// The key expressions over the table `side`: the `on` fields, then the
    /// `compare` fields or the default change token (see the header).
    fn keys(&self, side: &TableReference) -> Vec<Expr> {
        let mut keys: Vec<Expr> = self.on.iter().map(|k| key(side, k)).collect();
        if self.compare.is_empty() {
            keys.push(change_token(side));
        } else {
            keys.extend(self.compare.iter().map(|k| key(side, k)));
        }
        keys
    }
}

/// The default change token of a file of table `side` (see the header):
/// never null when the file has an ETag or a version, or a size and a time.
fn change_token(side: &TableReference) -> Expr {
    file_change_token(|name| key(side, name))
}

/// The change token of the file whose fields `field("file.etag")`, ... give
/// (see the header); `Chain::file_diff` compares files by it too.
pub(super) fn file_change_token(field: impl Fn(&str) -> Expr) -> Expr {
    use datafusion::functions::expr_fn::{coalesce, concat};
    use datafusion::logical_expr::{cast, when};
    use datafusion::prelude::lit;
    let text = |name: &str| cast(field(name), datafusion::arrow::datatypes::DataType::Utf8);
    let [etag, version, size, time] = TOKEN_FIELDS.map(text);
    let by_etag = concat(vec![
        lit("e:"),
        coalesce(vec![etag.clone(), lit("")]),
        lit("|v:"),
        coalesce(vec![version.clone(), lit("")]),
    ]);
    let by_size = concat(vec![lit("s:"), size.clone(), lit("|m:"), time.clone()]);
    let token = when(etag.is_not_null().or(version.is_not_null()), by_etag)
        .when(size.is_not_null().and(time.is_not_null()), by_size)
        .end();
    // `when(..).end()` fails only without a branch; it has two.
    token.unwrap_or_else(|_| lit(datafusion::common::ScalarValue::Utf8(None)))
}

/// A listing marked for a delta save. It cannot be scanned itself: the save
/// replaces it with the anti-joined listing (see the header), so running it
/// anywhere else is an error that says where it works.
#[derive(Debug, Clone)]
pub(crate) struct DeltaSource {
    pub(crate) table: StorageTable,
    pub(crate) delta: Delta,
}

#[async_trait]
impl TableProvider for DeltaSource {
    fn schema(&self) -> SchemaRef {
        file_schema()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        _projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        Err(Error::plan(
            "a delta listing (read_storage(.., delta => ..) or Chain::delta) only runs in a \
             save: CREATE DATASET name AS ... or Chain::save(name)",
        )
        .into_df())
    }
}

/// The delta scan of a plan: its table name, projection and source.
struct Marked {
    table_name: TableReference,
    projection: Option<Vec<usize>>,
    source: DeltaSource,
}

fn delta_source(scan: &TableScan) -> Option<DeltaSource> {
    source_as_provider(&scan.source)
        .ok()?
        .downcast_ref::<DeltaSource>()
        .cloned()
}

impl Chain {
    /// Saves as a delta (see `chain/delta.rs`): [`Chain::save`] then computes
    /// the new version from the files added or changed since the dataset's
    /// latest version (by `on`, default `file.path`, and `compare`, default
    /// a change token of the ETag and version, else the size and
    /// last-modified time; empty lists take the defaults; a null compare
    /// value never counts as unchanged), unioned
    /// with that version's rows for the unchanged files; deleted files drop
    /// out. Only for a storage source ([`Chain::from_storage`]); steps that are
    /// not row-local are refused unless `delta_unsafe` is set.
    pub fn delta(mut self, on: &[&str], compare: &[&str]) -> Self {
        match &mut self.source {
            Source::Storage { delta, .. } => {
                *delta = Some(Delta::new(None, on, compare));
                self
            }
            _ => self.fail(Error::plan(
                "delta needs a storage source (Chain::from_storage)",
            )),
        }
    }

    /// The chain a save of dataset `name` runs: this one, or for a delta
    /// chain one over the delta plan (see the header).
    pub(super) async fn for_save(&self, name: &str, catalog: &Catalog) -> Result<Chain> {
        let plan = self.logical_plan().await?;
        let mut found = Vec::new();
        plan.apply(|node| {
            if let LogicalPlan::TableScan(scan) = node
                && let Some(source) = delta_source(scan)
            {
                found.push(Marked {
                    table_name: scan.table_name.clone(),
                    projection: scan.projection.clone(),
                    source,
                });
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        let marked = match found.len() {
            0 => return Ok(self.over(plan)),
            1 => found.remove(0),
            n => {
                return Err(Error::plan(format!(
                    "a delta save reads one delta listing, this one reads {n}"
                )));
            }
        };
        if let Some(d) = &marked.source.delta.dataset
            && d != name
        {
            return Err(Error::plan(format!(
                "read_storage(.., delta => {d:?}) in a save of dataset {name:?}: a delta \
                 continues the dataset it saves, name {name:?}"
            )));
        }
        if !self.settings.get_delta_unsafe() {
            refuse_non_row_local(&plan)?;
        }
        check_keys(&marked.source.delta, &plan)?;
        let previous = match catalog.get(name, None).await {
            Ok(info) => Some(info),
            Err(Error::Dataset(_)) => None,
            Err(e) => return Err(e),
        };
        let plan = match previous {
            None => replace_scan(plan, listing_scan(&marked)?)?,
            Some(info) => self.delta_plan(plan, &marked, &info).await?,
        };
        Ok(self.over(plan))
    }

    /// A chain over `plan` with this one's session and settings.
    fn over(&self, plan: LogicalPlan) -> Chain {
        Chain {
            session: Arc::clone(&self.session),
            settings: self.settings.clone(),
            source: Source::Plan(plan),
            steps: Vec::new(),
        }
    }

    /// `plan` over the new and changed files, unioned with `previous`'s rows
    /// of the unchanged ones.
    async fn delta_plan(
        &self,
        plan: LogicalPlan,
        marked: &Marked,
        previous: &DatasetInfo,
    ) -> Result<LogicalPlan> {
        let delta = &marked.source.delta;
        // An order_by ending the chain orders the whole version: lifted above the union.
        let (plan, sort) = match plan {
            LogicalPlan::Sort(s) if s.fetch.is_none() => (Arc::unwrap_or_clone(s.input), s.expr),
            other => (other, Vec::new()),
        };
        let now = schema_text(plan.schema());
        if now != previous.schema {
            return Err(Error::plan(format!(
                "delta: version {} of dataset {:?} has the columns\n{}\nbut the chain outputs\n{}\n\
                 save once without delta (a full run) to change them",
                previous.version, previous.name, previous.schema, now
            )));
        }
        let prev_name = TableReference::bare("__delta_previous");
        let list_name = TableReference::bare("__delta_listing");
        // The previous rows, read with the exact types the chain outputs.
        let arrow_schema = plan.schema().as_arrow().clone();
        let path = previous.path.join(DATA_FILE).display().to_string();
        let options = ParquetReadOptions {
            schema: Some(&arrow_schema),
            ..Default::default()
        };
        let ctx = self.session.context();
        let prev = LogicalPlanBuilder::from(
            ctx.read_parquet(path, options)
                .await?
                .into_unoptimized_plan(),
        )
        .alias(prev_name.clone())?
        .build()?;
        let prev_keys = LogicalPlanBuilder::from(prev.clone())
            .project(
                delta
                    .keys(&prev_name)
                    .into_iter()
                    .enumerate()
                    .map(|(i, k)| k.alias(format!("__delta_k{i}"))),
            )?
            .build()?;
        // The listed files whose keys the previous version does not hold.
        let changed = matching(
            listing_scan(marked)?,
            delta.keys(&marked.table_name),
            prev_keys,
            JoinType::LeftAnti,
        )?;
        let new_rows = replace_scan(plan, changed)?;
        // The previous rows whose keys are still listed.
        let listed = LogicalPlanBuilder::scan(
            list_name.clone(),
            provider_as_source(Arc::new(marked.source.table.clone())),
            None,
        )?
        .project(
            delta
                .keys(&list_name)
                .into_iter()
                .enumerate()
                .map(|(i, k)| k.alias(format!("__delta_k{i}"))),
        )?
        .build()?;
        let kept = matching(prev, delta.keys(&prev_name), listed, JoinType::LeftSemi)?;
        // Each side under its own name (a rename, not a projection: a projection
        // holding both `__delta_previous.file` and `file` trips DataFusion's
        // push_down_leaf_projections), the union by position.
        let named = |plan: LogicalPlan, name: &str| -> Result<LogicalPlan> {
            Ok(LogicalPlanBuilder::from(plan).alias(name)?.build()?)
        };
        let mut union = LogicalPlanBuilder::from(named(kept, "__delta_kept")?)
            .union(named(new_rows, "__delta_new")?)?;
        if !sort.is_empty() {
            union = union.sort(sort.into_iter().map(|s| SortExpr {
                expr: unnormalize_col(s.expr),
                ..s
            }))?;
        }
        Ok(union.build()?)
    }
}

/// Every key is a field of the listing's `file` column, kept in the saved
/// rows (where the next delta save reads it back).
fn check_keys(delta: &Delta, plan: &LogicalPlan) -> Result<()> {
    for k in delta.names() {
        let column = k.split('.').next().unwrap_or(k);
        if column != "file" {
            return Err(Error::plan(format!(
                "delta key {k:?}: keys are fields of the listing's `file` column \
                 (file.path, file.etag, file.version, file.size, file.last_modified)"
            )));
        }
        if plan.schema().fields().iter().all(|f| f.name() != column) {
            return Err(Error::plan(format!(
                "a delta save keeps the column {column:?} in its rows (the next one compares \
                 {k} with it): select it"
            )));
        }
    }
    Ok(())
}

/// `name` (dots reach into struct fields) of the table `qualifier`.
fn key(qualifier: &TableReference, name: &str) -> Expr {
    let mut parts = name.split('.');
    let first = parts.next().unwrap_or(name);
    let column = Expr::Column(Column::new(Some(qualifier.clone()), first));
    parts.fold(column, get_field)
}

/// The rows of `left` whose `keys` are (`LeftSemi`) or are not
/// (`LeftAnti`) among the `__delta_k{i}` columns of `right`, with `left`'s
/// columns. A null key equals nothing: an unknown key or compare value never
/// makes a file "unchanged". The keys are computed into columns first: a
/// join on expressions (the change token's CASE) trips DataFusion 55's
/// extraction of join-key expressions.
fn matching(
    left: LogicalPlan,
    keys: Vec<Expr>,
    right: LogicalPlan,
    how: JoinType,
) -> Result<LogicalPlan> {
    let own: Vec<Expr> = left
        .schema()
        .columns()
        .into_iter()
        .map(Expr::Column)
        .collect();
    let n = keys.len();
    let with_keys = LogicalPlanBuilder::from(left)
        .project(
            own.iter().cloned().chain(
                keys.into_iter()
                    .enumerate()
                    .map(|(i, k)| k.alias(format!("__delta_l{i}"))),
            ),
        )?
        .build()?;
    let name = |prefix: &str, i: usize| Expr::Column(Column::from_name(format!("{prefix}{i}")));
    let on = (0..n)
        .map(|i| (name("__delta_l", i), name("__delta_k", i)))
        .collect();
    let joined = super::verbs::key_join(with_keys, right, on, how)?;
    Ok(LogicalPlanBuilder::from(joined).project(own)?.build()?)
}

/// The marked scan as a plain listing (same name and projection, so the
/// steps above it resolve as before).
fn listing_scan(marked: &Marked) -> Result<LogicalPlan> {
    Ok(LogicalPlanBuilder::scan(
        marked.table_name.clone(),
        provider_as_source(Arc::new(marked.source.table.clone())),
        marked.projection.clone(),
    )?
    .build()?)
}

/// `plan` with its delta scan replaced by `with` (whose schema is the scan's).
fn replace_scan(plan: LogicalPlan, with: LogicalPlan) -> Result<LogicalPlan> {
    Ok(plan
        .transform_up(|node| match &node {
            LogicalPlan::TableScan(scan) if delta_source(scan).is_some() => {
                Ok(Transformed::yes(with.clone()))
            }
            _ => Ok(Transformed::no(node)),
        })?
        .data)
}

/// Fails on the first step whose rows over some files differ from its rows
/// over all files restricted to those files.
fn refuse_non_row_local(plan: &LogicalPlan) -> Result<()> {
    let mut refused = None;
    plan.apply(|node| {
        let what = match node {
            LogicalPlan::Projection(_)
            | LogicalPlan::Filter(_)
            | LogicalPlan::SubqueryAlias(_)
            | LogicalPlan::TableScan(_)
            | LogicalPlan::Unnest(_) => None,
            LogicalPlan::Sort(s) if s.fetch.is_none() => None,
            LogicalPlan::Sort(_) | LogicalPlan::Limit(_) => Some("a limit".to_string()),
            LogicalPlan::Aggregate(_) => {
                Some("an aggregate (group_by, GROUP BY, count, ...)".into())
            }
            LogicalPlan::Distinct(_) => Some("distinct".into()),
            LogicalPlan::Join(_) => Some("a join".into()),
            LogicalPlan::Union(_) => Some("a union".into()),
            LogicalPlan::Window(_) => Some("a window function".into()),
            LogicalPlan::Extension(e) => match e.node.as_any().downcast_ref::<UdfNode>() {
                Some(u) if matches!(u.kind, Udf::Agg { .. }) => {
                    Some(format!("the agg UDF {}", u.kind.signature().name))
                }
                Some(_) => None,
                None => Some(format!("the step {}", e.node.name())),
            },
            other => Some(format!("the step {}", other.display())),
        };
        let subquery = node.expressions().iter().any(|e| {
            e.exists(|e| {
                Ok(matches!(
                    e,
                    Expr::Exists(_) | Expr::InSubquery(_) | Expr::ScalarSubquery(_)
                ))
            })
            .unwrap_or(false)
        });
        refused = what.or_else(|| subquery.then(|| "a subquery".to_string()));
        Ok(if refused.is_some() {
            TreeNodeRecursion::Stop
        } else {
            TreeNodeRecursion::Continue
        })
    })?;
    match refused {
        None => Ok(()),
        Some(what) => Err(Error::plan(format!(
            "a delta save refuses {what}: its rows over the new and changed files alone \
             would differ from a full run's; SET delta_unsafe = true \
             (Settings::delta_unsafe(true)) to run it over those files anyway"
        ))),
    }
}
