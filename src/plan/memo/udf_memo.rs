//! [`Memo`]: one UDF's results kept in a save's checkpoint, so that a save run
//! again after a crash, a kill or a failed row continues where it stopped.
//!
//! A row is named by a [`Key`]: a hash (SHA-256, first 16 bytes) of the
//! row-format bytes of the UDF's param values. For a `File` param that is its
//! source, path, size, version, etag, last modified time and location, so a
//! file that changed since the result was kept is called again. What else
//! determines a result — the plan, the UDF's name, `version` and `on_error` —
//! names the checkpoint dir (see `memo/checkpoint.rs`), so a memo only ever
//! answers for the same UDF in the same plan.
//!
//! Guarantees:
//! - results are kept in chunks: Arrow IPC files of (key, value), each
//!   written under a temporary name, fsynced, renamed into place and the dir
//!   fsynced, so a chunk on disk is whole; a process killed between chunks
//!   loses at most the rows of the chunk being filled ([`CHUNK_ROWS`] rows or
//!   [`CHUNK_AGE`] of results, whichever comes first); a memo dropped (a
//!   failed or cancelled run) writes what it holds;
//! - only successful results are kept: a row that failed (under any
//!   `on_error`) is called again on the next run;
//! - a chunk that does not read back (torn by a crash of the disk, edited,
//!   of another schema) is ignored, its rows called again: a checkpoint can
//!   cost work, never give a wrong value;
//! - a memo whose writes fail stops writing and says so once on stderr; the
//!   run goes on.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use datafusion::arrow::array::{Array, ArrayRef, FixedSizeBinaryArray, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::row::RowConverter;
use datafusion::error::Result as DfResult;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::util::durable;
use crate::util::lock::lock;

/// A row's name in a memo: 16 bytes of the SHA-256 of its param values.
pub type Key = [u8; 16];

/// Rows per chunk file.
pub const CHUNK_ROWS: usize = 512;

/// A chunk is written once its first result is this old, so a slow UDF
/// loses at most this much work to a kill.
pub const CHUNK_AGE: Duration = Duration::from_secs(2);

/// One UDF's kept results, and the chunk being filled.
#[derive(Debug)]
pub struct Memo {
    dir: PathBuf,
    name: String,
    params: Vec<usize>,
    /// Encodes the params of a row as bytes (one for the types of `params`).
    converter: RowConverter,
    schema: SchemaRef,
    /// Where each kept key's value is: (chunk, row).
    done: HashMap<Key, (u32, u32)>,
    chunks: Vec<ArrayRef>,
    pending: std::sync::Mutex<Pending>,
    next_chunk: AtomicU64,
    broken: AtomicBool,
}

#[derive(Debug, Default)]
struct Pending {
    keys: Vec<Key>,
    values: Vec<ArrayRef>,
    since: Option<Instant>,
}

impl Memo {
    /// Opens the memo in `dir` (created if missing) of UDF `name` whose params
    /// are the input columns `params` (encoded by `converter`) and whose
    /// output is `output`, reading every chunk in it. Blocking file work.
    pub fn open(
        dir: &Path,
        name: &str,
        params: Vec<usize>,
        converter: RowConverter,
        output: &Field,
    ) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir.display(), e))?;
        let schema = Arc::new(Schema::new(vec![
            Field::new("key", DataType::FixedSizeBinary(16), false),
            output.clone().with_name("value").with_nullable(true),
        ]));
        let mut memo = Self {
            dir: dir.to_path_buf(),
            name: name.to_string(),
            params,
            converter,
            schema,
            done: HashMap::new(),
            chunks: Vec::new(),
            pending: Default::default(),
            next_chunk: AtomicU64::new(0),
            broken: AtomicBool::new(false),
        };
        let mut names: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)
            .map_err(|e| Error::io(dir.display(), e))?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let n = e
                    .file_name()
                    .to_str()?
                    .strip_prefix("chunk-")?
                    .strip_suffix(".arrow")?
                    .parse()
                    .ok()?;
                Some((n, e.path()))
            })
            .collect();
        names.sort();
        let next = names.last().map_or(0, |(n, _)| n + 1);
        memo.next_chunk.store(next, Ordering::Relaxed);
        for (_, path) in names {
            if let Some(batch) = read_chunk(&path, &memo.schema) {
                memo.add_chunk(&batch);
            }
        }
        Ok(memo)
    }

    fn add_chunk(&mut self, batch: &RecordBatch) {
        let Some(keys) = batch
            .column(0)
            .as_any()
            .downcast_ref::<FixedSizeBinaryArray>()
        else {
            return;
        };
        let chunk = self.chunks.len() as u32;
        for row in 0..keys.len() {
            if let Ok(key) = Key::try_from(keys.value(row)) {
                self.done.insert(key, (chunk, row as u32));
            }
        }
        self.chunks.push(Arc::clone(batch.column(1)));
    }

    /// Results kept from earlier runs.
    pub fn kept(&self) -> usize {
        self.done.len()
    }

    /// The key of every row of `batch` (the UDF's input).
    pub fn keys(&self, batch: &RecordBatch) -> DfResult<Vec<Key>> {
        let columns: Vec<ArrayRef> = self
            .params
            .iter()
            .map(|&i| Arc::clone(batch.column(i)))
            .collect();
        let rows = self.converter.convert_columns(&columns)?;
        Ok((0..batch.num_rows())
            .map(|i| {
                let digest = Sha256::digest(rows.row(i).as_ref());
                let mut key = [0u8; 16];
                key.copy_from_slice(&digest[..16]);
                key
            })
            .collect())
    }

    /// Whether the result of the row named `key` is kept.
    pub fn contains(&self, key: &Key) -> bool {
        self.done.contains_key(key)
    }

    /// The kept values of `keys`, in order, if every one is kept.
    pub fn values(&self, keys: &[Key]) -> DfResult<Option<ArrayRef>> {
        let mut at = Vec::with_capacity(keys.len());
        for k in keys {
            match self.done.get(k) {
                Some(&(c, r)) => at.push((c as usize, r as usize)),
                None => return Ok(None),
            }
        }
        if let [(c, r)] = at[..] {
            // One row (a map's call): a slice, not a walk over every chunk.
            return Ok(Some(self.chunks[c].slice(r, 1)));
        }
        let arrays: Vec<&dyn Array> = self.chunks.iter().map(|c| c.as_ref()).collect();
        Ok(Some(datafusion::arrow::compute::interleave(&arrays, &at)?))
    }

    /// Keeps `values` (one per key) and writes a chunk when one is due.
    pub async fn record(self: &Arc<Self>, keys: Vec<Key>, values: ArrayRef) {
        if keys.is_empty() || self.broken.load(Ordering::Relaxed) {
            return;
        }
        let due = {
            let mut p = lock(&self.pending);
            p.keys.extend(keys);
            p.values.push(values);
            let since = *p.since.get_or_insert_with(Instant::now);
            if p.keys.len() >= CHUNK_ROWS || since.elapsed() >= CHUNK_AGE {
                Some(std::mem::take(&mut *p))
            } else {
                None
            }
        };
        if let Some(p) = due {
            let memo = Arc::clone(self);
            let _ = crate::runtime::blocking(move || {
                memo.write(p);
                Ok(())
            })
            .await;
        }
    }

    /// Writes `p` as the next chunk; a failure stops this memo's writes.
    fn write(&self, p: Pending) {
        if p.keys.is_empty() || self.broken.load(Ordering::Relaxed) {
            return;
        }
        let n = self.next_chunk.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = self.write_chunk(n, p)
            && !self.broken.swap(true, Ordering::Relaxed)
        {
            eprintln!(
                "warning: UDF {}: its checkpoint in {} is not written any more ({e}); the run goes on",
                self.name,
                self.dir.display()
            );
        }
    }

    fn write_chunk(&self, n: u64, p: Pending) -> std::result::Result<(), String> {
        let keys = FixedSizeBinaryArray::try_from_iter(p.keys.iter()).map_err(|e| e.to_string())?;
        let parts: Vec<&dyn Array> = p.values.iter().map(|v| v.as_ref()).collect();
        let values = datafusion::arrow::compute::concat(&parts).map_err(|e| e.to_string())?;
        let batch = RecordBatch::try_new(Arc::clone(&self.schema), vec![Arc::new(keys), values])
            .map_err(|e| e.to_string())?;
        let path = self.dir.join(format!("chunk-{n:08}.arrow"));
        let tmp = self.dir.join(format!(".chunk-{n:08}.arrow.tmp"));
        let write = || -> std::result::Result<(), Box<dyn std::error::Error>> {
            let file = std::fs::File::create(&tmp)?;
            let mut w = datafusion::arrow::ipc::writer::FileWriter::try_new(file, &self.schema)?;
            w.write(&batch)?;
            w.finish()?;
            durable::sync_file(&tmp)?;
            std::fs::rename(&tmp, &path)?;
            durable::sync_dir(&self.dir)?;
            Ok(())
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            e.to_string()
        })
    }
}

impl Drop for Memo {
    /// A failed or cancelled run keeps what it computed.
    fn drop(&mut self) {
        let p = std::mem::take(&mut *lock(&self.pending));
        self.write(p);
    }
}

/// The batch of a chunk file, if it reads back whole with `schema`.
fn read_chunk(path: &Path, schema: &SchemaRef) -> Option<RecordBatch> {
    let read = || -> std::result::Result<RecordBatch, Box<dyn std::error::Error>> {
        let file = std::fs::File::open(path)?;
        let reader = datafusion::arrow::ipc::reader::FileReader::try_new(file, None)?;
        if reader.schema().fields() != schema.fields() {
            return Err("another schema".into());
        }
        let batches = reader.collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(datafusion::arrow::compute::concat_batches(
            schema, &batches,
        )?)
    };
    // Hostile bytes may panic inside the IPC reader: an unreadable chunk.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(read))
        .ok()
        .and_then(|r| r.ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{StringArray, UInt64Array};
    use datafusion::arrow::row::SortField;

    fn batch(names: &[&str]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("n", DataType::Utf8, false)]));
        RecordBatch::try_new(schema, vec![Arc::new(StringArray::from(names.to_vec()))])
            .expect("test")
    }

    fn utf8_keys() -> RowConverter {
        RowConverter::new(vec![SortField::new(DataType::Utf8)]).expect("test")
    }

    fn out() -> Field {
        Field::new("len", DataType::UInt64, true)
    }

    #[tokio::test]
    async fn kept_results_read_back_and_a_torn_chunk_is_ignored() {
        let dir = tempfile::tempdir().expect("test");
        let memo =
            Arc::new(Memo::open(dir.path(), "len", vec![0], utf8_keys(), &out()).expect("test"));
        let b = batch(&["a", "bb", "ccc"]);
        let keys = memo.keys(&b).expect("test");
        assert_ne!(keys[0], keys[1]);
        memo.record(keys.clone(), Arc::new(UInt64Array::from(vec![1u64, 2, 3])))
            .await;
        drop(memo);
        // A chunk cut short, as by a crash of the disk: ignored.
        std::fs::write(
            dir.path().join("chunk-00000007.arrow"),
            b"ARROW1\0\0garbage",
        )
        .expect("test");
        let memo = Memo::open(dir.path(), "len", vec![0], utf8_keys(), &out()).expect("test");
        assert_eq!(memo.kept(), 3);
        let again = memo.keys(&batch(&["ccc", "a"])).expect("test");
        let values = memo.values(&again).expect("test").expect("both kept");
        let values = values.as_any().downcast_ref::<UInt64Array>().expect("test");
        assert_eq!(values.values().to_vec(), vec![3, 1]);
        assert!(
            memo.values(&memo.keys(&batch(&["dddd"])).expect("test"))
                .expect("test")
                .is_none()
        );
        // The next chunk is numbered after every existing one.
        assert_eq!(memo.next_chunk.load(Ordering::Relaxed), 8);
    }

    #[tokio::test]
    async fn another_output_type_reuses_nothing() {
        let dir = tempfile::tempdir().expect("test");
        let memo =
            Arc::new(Memo::open(dir.path(), "len", vec![0], utf8_keys(), &out()).expect("test"));
        let b = batch(&["a"]);
        memo.record(
            memo.keys(&b).expect("test"),
            Arc::new(UInt64Array::from(vec![1u64])),
        )
        .await;
        drop(memo);
        let utf8 = Field::new("len", DataType::Utf8, true);
        assert_eq!(
            Memo::open(dir.path(), "len", vec![0], utf8_keys(), &utf8)
                .expect("test")
                .kept(),
            0
        );
    }
}
