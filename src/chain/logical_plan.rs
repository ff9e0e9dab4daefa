//! A [`Chain`] as a DataFusion plan: its source's plan, then each step
//! applied in order (a UDF step becomes a `UdfNode` with the settings it
//! captured). Every error a chain holds surfaces here, at the first call that
//! plans it; nothing runs.

use std::sync::Arc;

use datafusion::datasource::provider_as_source;
use datafusion::logical_expr::{LogicalPlan, LogicalPlanBuilder};
use datafusion::physical_plan::displayable;
use datafusion::prelude::{CsvReadOptions, DataFrame, JsonReadOptions, ParquetReadOptions};

use super::{Chain, DATA_FILE, DeltaSource, Source, Step};
use crate::dataset::Catalog;
use crate::error::Result;
use crate::plan::UdfNode;
use crate::storage::StorageTable;
use crate::util::redact::redact;

impl Chain {
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
                delta,
            } => {
                let table = StorageTable::try_new(uri, *recursive, glob.clone(), options.clone())?;
                let provider: Arc<dyn datafusion::catalog::TableProvider> = match delta {
                    None => Arc::new(table),
                    Some(delta) => Arc::new(DeltaSource {
                        table,
                        delta: delta.clone(),
                    }),
                };
                return Ok(LogicalPlanBuilder::scan(
                    "storage",
                    provider_as_source(provider),
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
                let info = Catalog::open(self.settings.get_root())
                    .await?
                    .get(name, *version)
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
            Step::Verb(v) => v.apply(self, b.build()?).await?,
            Step::Fail(e) => return Err(e.clone()),
        };
        Ok(plan)
    }

    pub(super) async fn dataframe(&self) -> Result<DataFrame> {
        Ok(DataFrame::new(
            self.session.state(),
            self.logical_plan().await?,
        ))
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
}
