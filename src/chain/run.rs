//! Running a [`Chain`]: collecting its rows (with progress, as typed rows, as
//! a table), streaming them, counting them, one aggregate over every row
//! (`sum`, `avg`, `min`, `max`), and running with a report.
//!
//! Guarantees: dropping a run's future (or its stream) cancels the run, its
//! UDF calls and downloads; progress is shown as the chain's `progress`
//! setting says, read from the operators' metrics.

use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::common::ScalarValue;
use datafusion::functions_aggregate::expr_fn as agg;
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::display::DisplayableExecutionPlan;
use futures::stream::{BoxStream, StreamExt, TryStreamExt};
use serde::de::DeserializeOwned;

use super::Chain;
use crate::error::{Error, Result};
use crate::plan::RunReport;
use crate::progress::{self, Progress};
use crate::util::redact::redact;

impl Chain {
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
    /// with the run's [`Progress`] at once, every tick (150 ms)
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

    /// The value of one aggregate expression over every row, e.g.
    /// `count(col("id"))` from `datafusion::functions_aggregate::expr_fn`:
    /// the chain runs once, the value is computed by DataFusion's aggregate
    /// (null for `sum` / `avg` / `min` / `max` of no rows, as in SQL).
    ///
    /// # Cancel safety
    /// Dropping the future cancels the run, as [`collect`](Self::collect).
    pub async fn aggregate_value(&self, agg: Expr) -> Result<ScalarValue> {
        let batches = self
            .clone()
            .group_by(Vec::<Expr>::new(), [agg.alias("value")])
            .collect()
            .await?;
        let batch = batches
            .iter()
            .find(|b| b.num_rows() > 0)
            .ok_or_else(|| Error::internal("an aggregate without keys gave no row"))?;
        Ok(ScalarValue::try_from_array(batch.column(0), 0)?)
    }

    /// The sum of column `column` (dots reach into structs: `file.size`)
    /// over every row (DataChain's `sum`); null for no rows.
    pub async fn sum(&self, column: &str) -> Result<ScalarValue> {
        self.aggregate_value(agg::sum(super::col(column))).await
    }

    /// The mean of column `column` over every row (a float); null for no rows.
    pub async fn avg(&self, column: &str) -> Result<ScalarValue> {
        self.aggregate_value(agg::avg(super::col(column))).await
    }

    /// The smallest value of column `column`; null for no rows.
    pub async fn min(&self, column: &str) -> Result<ScalarValue> {
        self.aggregate_value(agg::min(super::col(column))).await
    }

    /// The largest value of column `column`; null for no rows.
    pub async fn max(&self, column: &str) -> Result<ScalarValue> {
        self.aggregate_value(agg::max(super::col(column))).await
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

fn rows(batches: &[RecordBatch]) -> usize {
    batches.iter().map(|b| b.num_rows()).sum()
}
