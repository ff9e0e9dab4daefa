//! What an input batch needs from a `PrefetchExec` partition
//! ([`rows_to_fetch`]): its rows, each with the files to fetch for it; runs
//! of local rows read ahead under a fixed `prefetch = N` ([`runs_ahead`]);
//! or nothing, when every file is read where it is ([`Direct`]) or the
//! UDF's checkpoint already holds the row.
//!
//! Guarantees: a batch none of whose rows has a file to fetch is handed on
//! whole, never cut into rows, and its files are counted (`files_in_place`,
//! `bytes_in_place`) without decoding a `File`; files read ahead are never
//! copied; a row the checkpoint holds starts no download.

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::UInt64Type;
use datafusion::error::Result as DfResult;
use udfchain_udfs::File;

use super::downloads::Downloads;
use crate::cache::{Reach, StoreSource};
use crate::error::Error;
use crate::plan::memo::Memo;
use crate::plan::row_slices::slices;

/// Which files a `PrefetchExec` leaves where they are, for the UDF to read
/// directly. An in-memory store's objects, at every `prefetch` (a fetch
/// would only hand the same bytes across a task); the local file system's
/// as [`LocalMode`] says. With `cache = true` every file goes through the
/// shared cache.
#[derive(Debug, Clone, Copy)]
pub(super) struct Direct {
    pub(super) local: LocalMode,
    pub(super) memory: bool,
}

/// What a `PrefetchExec` does with the files of the local file system.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LocalMode {
    /// `prefetch = auto`: read by the UDF where they are (a page-cached read
    /// costs less than the hand-off of a download).
    InPlace,
    /// A fixed `prefetch = N`: read ahead, as asked (for network file systems
    /// and cold disks), in runs of rows (see [`runs_ahead`]), then read by
    /// the UDF where they are or from the bytes read ahead; never copied.
    Ahead,
    /// `cache = true`: fetched into the shared cache as any file.
    Fetched,
}

impl Direct {
    /// Whether files kept where `reach` says are read where they are.
    pub(super) fn reads(&self, reach: Reach) -> bool {
        match reach {
            Reach::LocalFiles => self.local == LocalMode::InPlace,
            Reach::Memory => self.memory,
            Reach::Network => false,
        }
    }
}

/// `stores.reach(source)`, kept in `last` for the next file: a batch's files
/// mostly share one source, whose store is then looked up once.
fn reach_of<'a>(
    stores: &StoreSource,
    last: &mut Option<(&'a str, Reach)>,
    source: &'a str,
) -> Reach {
    match *last {
        Some((seen, reach)) if seen == source => reach,
        _ => {
            let reach = stores.reach(source);
            *last = Some((source, reach));
            reach
        }
    }
}

/// A run of local rows read ahead holds at most this many rows ...
const RUN_ROWS: usize = 64;
/// ... and ends at the row whose files bring it to this many bytes: one
/// blocking-pool trip and one batch to the UDF per run instead of per row.
const RUN_BYTES: u64 = 4 << 20;

/// `b` cut into runs of rows to read ahead (see [`RUN_ROWS`], at least one
/// row each), each with the files of its rows.
fn runs_ahead(b: &RecordBatch, files: Vec<Vec<File>>) -> Vec<Pending> {
    let mut runs = Vec::new();
    let (mut start, mut run, mut bytes) = (0, Vec::new(), 0u64);
    for (row, row_files) in files.into_iter().enumerate() {
        bytes += row_files.iter().map(|f| f.size).sum::<u64>();
        run.extend(row_files);
        if row + 1 - start == RUN_ROWS || bytes >= RUN_BYTES || row + 1 == b.num_rows() {
            runs.push(Pending {
                batch: b.slice(start, row + 1 - start),
                files: std::mem::take(&mut run),
                ahead: true,
            });
            (start, bytes) = (row + 1, 0);
        }
    }
    runs
}

/// Rows not started yet: one row to fetch, or a run of local rows to read
/// ahead (`ahead`), with the files of its rows.
pub(super) struct Pending {
    pub(super) batch: RecordBatch,
    pub(super) files: Vec<File>,
    pub(super) ahead: bool,
}

/// What an input batch needs from the prefetch.
pub(super) enum Needs {
    /// Its rows (one-row batches, or runs read ahead), each with the files
    /// to fetch for it.
    Fetch(Vec<Pending>),
    /// Nothing: its `files` files (of `bytes` bytes) are read where they are.
    Nothing { files: usize, bytes: usize },
}

/// The non-null `File`s of each row of `batch` in its `file_cols` (every
/// column decoded once for the whole batch).
fn files_by_row(batch: &RecordBatch, file_cols: &[usize]) -> DfResult<Vec<Vec<File>>> {
    let mut rows: Vec<Vec<File>> = vec![Vec::with_capacity(file_cols.len()); batch.num_rows()];
    for &c in file_cols {
        let files = File::decode_array(batch.column(c)).map_err(|e| {
            Error::internal(format!("a File column the planner checked: {e}")).into_df()
        })?;
        for (row, f) in rows.iter_mut().zip(files) {
            row.extend(f);
        }
    }
    Ok(rows)
}

/// The rows of `b` with the files to fetch for each: none for a row whose
/// result the UDF's checkpoint already holds (its UDF makes no call), nor
/// for a file read where it is (see [`Direct`]). When no row has a file
/// to fetch, `b` is handed on whole (and never cut into rows).
pub(super) fn rows_to_fetch(
    b: &RecordBatch,
    memo: Option<&Memo>,
    downloads: &Downloads,
    direct: Direct,
) -> DfResult<Needs> {
    let no_memo = memo.is_none_or(|m| m.kept() == 0);
    if let Some((files, bytes)) = no_memo
        .then(|| all_in_place(b, downloads, direct))
        .flatten()
    {
        return Ok(Needs::Nothing { files, bytes });
    }
    let mut files = files_by_row(b, &downloads.file_cols)?;
    if let Some(memo) = memo.filter(|m| m.kept() > 0) {
        for (files, key) in files.iter_mut().zip(memo.keys(b)?) {
            if memo.contains(&key) {
                files.clear();
            }
        }
    }
    // One pass over the files: whether all are read where they are, or
    // all are local files to read ahead.
    let source = &downloads.source;
    let (mut all_direct, mut ahead) = (true, direct.local == LocalMode::Ahead);
    let (mut n, mut bytes) = (0, 0);
    let mut last = None;
    for f in files.iter().flatten() {
        let reach = reach_of(source, &mut last, &f.source);
        all_direct &= direct.reads(reach);
        ahead &= f.size_known() && f.member().is_none() && reach == Reach::LocalFiles;
        n += 1;
        bytes += if f.size_known() { f.size as usize } else { 0 };
    }
    if all_direct {
        return Ok(Needs::Nothing { files: n, bytes });
    }
    if ahead {
        return Ok(Needs::Fetch(runs_ahead(b, files)));
    }
    let rows = slices(b, 1).into_iter().zip(files);
    Ok(Needs::Fetch(
        rows.map(|(batch, files)| Pending {
            batch,
            files,
            ahead: false,
        })
        .collect(),
    ))
}

/// The count and listed bytes of the files of `b` when every one is
/// read where it is (see [`Direct`]), read off the File columns' `source`
/// and `size` arrays, no `File` decoded (a batch's files mostly share
/// one source, whose reach is looked up once). `None` when some file is
/// to be fetched, or a column is not laid out as a `File`.
fn all_in_place(b: &RecordBatch, downloads: &Downloads, direct: Direct) -> Option<(usize, usize)> {
    let (mut files, mut bytes) = (0, 0);
    for &c in &downloads.file_cols {
        let column = b.column(c).as_struct_opt()?;
        let sources = column.column_by_name("source")?.as_string_opt::<i32>()?;
        let sizes = column
            .column_by_name("size")?
            .as_primitive_opt::<UInt64Type>()?;
        let mut last = None;
        for row in (0..column.len()).filter(|&r| column.is_valid(r)) {
            let source = sources.value(row);
            if !direct.reads(reach_of(&downloads.source, &mut last, source)) {
                return None;
            }
            files += 1;
            bytes += sizes.value(row) as usize;
        }
    }
    Some((files, bytes))
}
