//! Saving a [`Chain`]'s rows: as the next version of a dataset (one Parquet
//! file staged under the root and committed to the catalog) or as one Parquet
//! file at a URI. Both run the plan of a `COPY TO` here, so progress is read
//! from its operators' metrics as it runs.
//!
//! Guarantees: a bad dataset name fails before anything runs; a save dropped
//! before its run finished leaves no version and removes its partial files;
//! a dataset's recorded query is redacted (no credentials); a version records
//! what it read (its lineage, `chain/lineage.rs`) in its commit.
//!
//! Resumable: under `checkpoints = true` (the default) a save's map and
//! batch_map UDFs keep their results in the checkpoint of (dataset name,
//! logical plan) as they complete (`dataset/checkpoints.rs`, `plan/memo/`);
//! the same save run again after a crash, a kill or an error answers the rows
//! kept there without a call or a download, and computes the rest. The saved
//! rows are those of an uninterrupted run (in the same order under `ordered =
//! true`): a kept value is the value the UDF returned for the same params. A
//! save that commits removes its checkpoint.

use std::sync::Arc;

use datafusion::arrow::array::{Array, RecordBatch};
use datafusion::logical_expr::LogicalPlanBuilder;
use datafusion::prelude::DataFrame;

use super::{Chain, DATA_FILE};
use crate::dataset::checkpoints::HeldCheckpoint;
use crate::dataset::{Catalog, DatasetInfo};
use crate::error::{Result, is_disk_full};
use crate::plan::Checkpoint;
use crate::progress::{self, Progress};
use crate::storage::Location;
use crate::util::redact::redact;

impl Chain {
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
        let root = self.settings.get_root();
        let catalog = Catalog::open(root.clone()).await?;
        // A delta save's plan reads its base version: the checkpoint key
        // below names that version's files, so a new base starts over.
        let chain = self.for_save(name, &catalog).await?;
        let staging = catalog.staging_dir().await?;
        // A save that fills the disk says how much it had.
        let at_start = {
            let dir = staging.path().to_path_buf();
            crate::runtime::blocking(move || Ok(fs4::available_space(&dir).ok())).await?
        };
        let mut df = chain.dataframe().await?;
        // What it reads, before anything runs (recorded with the version).
        let sources = super::lineage::sources(df.logical_plan(), &root);
        let checkpoint = if chain.settings.get_checkpoints() {
            let (name, fresh) = (name.to_string(), chain.settings.get_fresh_checkpoints());
            // A built-in UDF's results are those of this udfchain version.
            let plan = format!(
                "udfchain {}\n{}",
                env!("CARGO_PKG_VERSION"),
                df.logical_plan().display_indent()
            );
            crate::runtime::blocking(move || HeldCheckpoint::hold(&root, &name, &plan, fresh))
                .await?
        } else {
            None
        };
        if let Some(held) = &checkpoint {
            let (mut state, plan) = df.into_parts();
            state
                .config_mut()
                .set_extension(Arc::new(Checkpoint::new(held.dir().to_path_buf())));
            df = DataFrame::new(state, plan);
        }
        match chain.write_dataset(df, staging.path(), on_progress).await {
            Ok((schema, rows, query)) => {
                let info = catalog
                    .commit_with_lineage(name, staging, schema, rows, query, sources)
                    .await?;
                if let Some(held) = checkpoint {
                    let _ = crate::runtime::blocking(move || {
                        held.remove();
                        Ok(())
                    })
                    .await;
                }
                Ok(info)
            }
            Err(e) => {
                // Removing the partial files is blocking file work too; the
                // checkpoint stays for the next run.
                let full = is_disk_full(&e);
                let said = crate::runtime::blocking(move || {
                    let e = if full {
                        disk_full(e, staging.path(), at_start)
                    } else {
                        e
                    };
                    drop(staging);
                    drop(checkpoint);
                    Ok(e)
                })
                .await;
                Err(said.unwrap_or_else(|e| e))
            }
        }
    }

    /// Writes the rows of `df` into `dir` as one Parquet file (see `write_parquet`).
    async fn write_dataset(
        &self,
        df: DataFrame,
        dir: &std::path::Path,
        on_progress: impl FnMut(&Progress),
    ) -> Result<(String, u64, String)> {
        let query = redact(&df.logical_plan().display_indent().to_string()).into_owned();
        let schema = super::schema_text(df.schema());
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
}

/// A save's error once the disk filled up: the file it was writing, the
/// space available when the save started (the least it needs, with its
/// checkpoint) and now. Blocking (`statvfs`).
fn disk_full(e: crate::Error, staging: &std::path::Path, at_start: Option<u64>) -> crate::Error {
    let now = fs4::available_space(staging).unwrap_or(0);
    let bytes = |n: u64| crate::progress::bytes(n as usize);
    let needs = match at_start {
        Some(n) => format!(
            "the dataset (and its checkpoint) need more than the {} that were available on \
             that file system when the save started ({} now)",
            bytes(n),
            bytes(now)
        ),
        None => format!("{} are available on that file system now", bytes(now)),
    };
    let said = format!(
        "no space left on the device: {needs}; free space, or set `root` to a larger disk \
         (the catalog and earlier versions are unchanged; {e})"
    );
    crate::Error::io(
        staging.join(DATA_FILE).display(),
        std::io::Error::new(std::io::ErrorKind::StorageFull, said),
    )
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
