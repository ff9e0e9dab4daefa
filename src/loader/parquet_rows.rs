//! Where a loader's rows come from: Parquet file(s) read by row range.
//!
//! A dataset version is its Parquet file(s) under the catalog; a [`Chain`]
//! is run once, on the first plan, and spilled to one Parquet file in a
//! temporary directory that lives as long as the loader (and its clones and
//! plans). Either way the rows are then read by position, never by a scan:
//! the footer (row groups and their row counts, the page index) is read once,
//! and reading rows `[start, end)` opens only the row groups that hold them
//! and, through the page index, skips the pages before `start`.
//!
//! Dataset order is the order of the files by name, then of their rows.

use std::path::PathBuf;
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::parquet::arrow::ProjectionMask;
use datafusion::parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder, RowSelection,
    RowSelector,
};
use datafusion::parquet::file::metadata::PageIndexPolicy;

use crate::chain::Chain;
use crate::dataset::Catalog;
use crate::error::{Error, Result};
use crate::runtime::blocking;
use crate::session::Session;

/// One Parquet file of the source, with its footer.
struct Part {
    path: PathBuf,
    meta: ArrowReaderMetadata,
    /// The position of its first row in dataset order.
    first_row: usize,
    rows: usize,
}

/// The rows of a loader, ready to be read by position.
pub(crate) struct Resolved {
    parts: Vec<Part>,
    schema: SchemaRef,
    rows: usize,
    /// The spilled chain's directory, removed when the last plan is dropped.
    _spill: Option<tempfile::TempDir>,
}

impl std::fmt::Debug for Resolved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resolved")
            .field("files", &self.parts.len())
            .field("rows", &self.rows)
            .finish()
    }
}

impl Resolved {
    /// The Parquet files of dataset `name` (latest version when `version` is None).
    pub(crate) async fn dataset(
        session: &Session,
        name: &str,
        version: Option<u32>,
    ) -> Result<Self> {
        let info = Catalog::open(session.settings().get_root())
            .await?
            .get(name, version)
            .await?;
        let dir = info.path.clone();
        blocking(move || {
            let mut files = Vec::new();
            let entries = std::fs::read_dir(&dir).map_err(|e| Error::io(dir.display(), e))?;
            for entry in entries {
                let path = entry.map_err(|e| Error::io(dir.display(), e))?.path();
                if path.extension().is_some_and(|e| e == "parquet") {
                    files.push(path);
                }
            }
            files.sort();
            Self::open(files, None)
        })
        .await
    }

    /// Runs `chain` once and spills its rows to a temporary Parquet file.
    pub(crate) async fn chain(chain: &Chain) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("udfchain-loader-")
            .tempdir()
            .map_err(|e| Error::io(std::env::temp_dir().display(), e))?;
        let file = dir.path().join("rows.parquet");
        chain.to_parquet(&file.display().to_string()).await?;
        blocking(move || Self::open(vec![file], Some(dir))).await
    }

    fn open(files: Vec<PathBuf>, spill: Option<tempfile::TempDir>) -> Result<Self> {
        let mut parts = Vec::with_capacity(files.len());
        let mut rows = 0;
        let mut schema = None;
        for path in files {
            let file = std::fs::File::open(&path).map_err(|e| Error::io(path.display(), e))?;
            let meta = ArrowReaderMetadata::load(
                &file,
                ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Optional),
            )
            .map_err(|e| parquet_err(&path, e))?;
            let n = usize::try_from(meta.metadata().file_metadata().num_rows()).unwrap_or(0);
            match &schema {
                None => schema = Some(Arc::clone(meta.schema())),
                Some(s) if s.fields() != meta.schema().fields() => {
                    return Err(Error::Dataset(format!(
                        "{}: its columns differ from the first file's",
                        path.display()
                    )));
                }
                Some(_) => {}
            }
            parts.push(Part {
                path,
                meta,
                first_row: rows,
                rows: n,
            });
            rows += n;
        }
        let schema =
            schema.unwrap_or_else(|| Arc::new(datafusion::arrow::datatypes::Schema::empty()));
        Ok(Self {
            parts,
            schema,
            rows,
            _spill: spill,
        })
    }

    /// The columns of the stored rows.
    pub(crate) fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// The number of rows.
    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    /// Rows `[start, end)` in dataset order, with the columns at `columns`
    /// (indices into [`schema`](Self::schema), in that order). Blocking file I/O.
    pub(crate) fn read(
        &self,
        start: usize,
        end: usize,
        columns: &[usize],
    ) -> Result<Vec<RecordBatch>> {
        let mut out = Vec::new();
        for part in &self.parts {
            let (lo, hi) = (part.first_row, part.first_row + part.rows);
            if hi <= start || lo >= end {
                continue;
            }
            let (from, to) = (start.max(lo) - lo, end.min(hi) - lo);
            out.extend(self.read_part(part, from, to, columns)?);
        }
        Ok(out)
    }

    fn read_part(
        &self,
        part: &Part,
        from: usize,
        to: usize,
        columns: &[usize],
    ) -> Result<Vec<RecordBatch>> {
        // The row groups that hold [from, to), and the selection inside them.
        let mut groups = Vec::new();
        let mut first = None;
        let mut at = 0;
        for (i, rg) in part.meta.metadata().row_groups().iter().enumerate() {
            let n = usize::try_from(rg.num_rows()).unwrap_or(0);
            if at + n > from && at < to {
                groups.push(i);
                first.get_or_insert(at);
            }
            at += n;
        }
        let Some(first) = first else {
            return Ok(Vec::new());
        };
        let file =
            std::fs::File::open(&part.path).map_err(|e| Error::io(part.path.display(), e))?;
        let mut sorted: Vec<usize> = columns.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let mask = ProjectionMask::roots(part.meta.parquet_schema(), sorted.iter().copied());
        let selection = RowSelection::from(vec![
            RowSelector::skip(from - first),
            RowSelector::select(to - from),
        ]);
        let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(file, part.meta.clone())
            .with_row_groups(groups)
            .with_projection(mask)
            .with_row_selection(selection)
            .with_batch_size(8192)
            .build()
            .map_err(|e| parquet_err(&part.path, e))?;
        // The reader returns the projected columns in file order: put them in
        // the order asked for.
        let order: Vec<usize> = columns
            .iter()
            .filter_map(|c| sorted.iter().position(|s| s == c))
            .collect();
        let mut out = Vec::new();
        for batch in reader {
            let batch =
                batch.map_err(|e| Error::from(datafusion::error::DataFusionError::from(e)))?;
            out.push(
                batch
                    .project(&order)
                    .map_err(|e| Error::from(datafusion::error::DataFusionError::from(e)))?,
            );
        }
        Ok(out)
    }
}

fn parquet_err(path: &std::path::Path, e: datafusion::parquet::errors::ParquetError) -> Error {
    Error::io(path.display(), std::io::Error::other(e.to_string()))
}
