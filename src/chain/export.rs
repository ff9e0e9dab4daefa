//! `to_storage`: writes every file of a chain's `File` column to a local
//! directory or an object store (DataChain's `to_storage(output, signal,
//! placement, link_type)`).
//!
//! How: the chain runs once and its `File`s are collected with their
//! destination names; then the files still to write run through a map UDF
//! over them, so their bytes arrive exactly as a UDF's do: `PrefetchExec` in
//! front (the chain's `prefetch`, `parallel`, `cache`), the store's retries
//! and resumes, every read pinned to the ETag / version the listing saw.
//!
//! Guarantees:
//! - **No overwrite by collision**: two different files going to one name
//!   (typically `placement = "filename"`) fail the export before anything is
//!   written, naming both files. A file listed twice is written once; two
//!   files with one ETag under `placement = "etag"` are one content, written
//!   once.
//! - **Atomic names**: a file appears under its final name complete or not
//!   at all, whatever kills the process. Locally it is written (or linked) to
//!   a temp name in the destination's directory (`.udfchain-part-<hash>`,
//!   one per source and destination, so a rerun reuses and removes what a
//!   killed run left), fsynced, then renamed; in a store it is one PUT, or a
//!   multipart upload that becomes visible only when completed.
//! - **Reruns skip**: a destination that already exists with the file's size
//!   is skipped before any download (for `symlink`, a link to the same
//!   file); a store's output prefix is listed once for this, not asked per
//!   file. The name carries the content's identity under `placement =
//!   "etag"` (the ETag) and `"checksum"` (the SHA-256 of the bytes, read
//!   before naming: such files are read again on a rerun, not written).
//! - **Safe names**: a destination with an empty, `.` or `..` segment (a
//!   hostile key) is an error, never a write outside `output`.
//! - `link_type = "symlink"` links local source files (whole files, not
//!   archive members) into a local `output`; anything else fails before
//!   anything is written.
//!
//! Placement: `fullpath` is the file's path below its listed prefix for
//! local sources, and `host/prefix/path` for stores (DataChain puts the
//! bucket first too); `filename` its last segment; `etag` the ETag plus the
//! name's extension; `checksum` the hex SHA-256 of its bytes plus the
//! extension. An archive member (`File` with a location) is named by its
//! member name below the archive's path.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use datafusion::arrow::array::{Array, BooleanArray, RecordBatch, StringArray};
use datafusion::arrow::compute::filter_record_batch;
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::datasource::MemTable;
use datafusion::object_store::ObjectStore;
use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use udfchain_udfs::{BoxError, File};

use super::{Chain, Source, col};
use crate::error::{Error, Result};
use crate::storage::Location;

/// Where `to_storage` puts each file below `output`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Placement {
    /// The file's path (stores: `host/prefix/path`).
    #[default]
    FullPath,
    /// The file's path below its store (stores: `prefix/path`, the
    /// bucket left out; local files as `FullPath`).
    FilePath,
    /// The file's name only (a collision is an error).
    FileName,
    /// The file's ETag plus its extension.
    Etag,
    /// The SHA-256 of its bytes plus its extension.
    Checksum,
}

impl FromStr for Placement {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "fullpath" => Ok(Self::FullPath),
            "filepath" => Ok(Self::FilePath),
            "filename" => Ok(Self::FileName),
            "etag" => Ok(Self::Etag),
            "checksum" => Ok(Self::Checksum),
            other => Err(Error::plan(format!(
                "unknown placement {other:?}: use \"fullpath\", \"filepath\", \"filename\", \"etag\" or \"checksum\""
            ))),
        }
    }
}

/// How `to_storage` makes each file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum LinkType {
    /// Copies the bytes.
    #[default]
    Copy,
    /// A symbolic link to the source file (local sources and output only).
    Symlink,
}

impl FromStr for LinkType {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "copy" => Ok(Self::Copy),
            "symlink" => Ok(Self::Symlink),
            other => Err(Error::plan(format!(
                "unknown link_type {other:?}: use \"copy\" or \"symlink\""
            ))),
        }
    }
}

/// What one [`Chain::to_storage`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[non_exhaustive]
pub struct ExportSummary {
    /// Files written (copied or linked) by this call.
    pub written: u64,
    /// Files already present under their name with their size.
    pub skipped: u64,
}

impl Chain {
    /// Writes every file of column `signal` (a `File` column, usually
    /// `"file"`) below `output`, a local directory or an object store URI:
    /// see `chain/export.rs` for placement, atomicity, collisions and reruns.
    /// Reads go through the same prefetch, retries and version pinning as a
    /// UDF's. Null files are left out.
    ///
    /// # Cancel safety
    /// Dropping the future stops the export: files already renamed or
    /// uploaded stay, no partial file is visible under a final name (a
    /// local temp file may stay; the next export of that file reuses it).
    pub async fn to_storage(
        &self,
        output: &str,
        signal: &str,
        placement: Placement,
        link_type: LinkType,
    ) -> Result<ExportSummary> {
        let out = Arc::new(Output::open(self, output).await?);
        if link_type == LinkType::Symlink && !matches!(*out, Output::Local(_)) {
            return Err(Error::plan(format!(
                "to_storage(link_type=\"symlink\") needs a local output directory, not {}",
                crate::util::redact::redact(output)
            )));
        }
        // 1. The files, their names, collisions, what is already there.
        let mut stream = self
            .clone()
            .select([col(signal).alias("file")])
            .stream()
            .await?;
        let mut names: HashMap<String, String> = HashMap::new();
        // Per batch: its file column and each row's name (None: not written).
        let mut batches: Vec<(RecordBatch, Vec<Option<String>>)> = Vec::new();
        // (batch, row, name, file) of the files whose name is known.
        let mut candidates: Vec<(usize, usize, String, File)> = Vec::new();
        let mut skipped = 0u64;
        while let Some(batch) = stream.next().await {
            let batch = batch?;
            let column = batch.column(0);
            if !File::is_file_type(column.data_type()) {
                return Err(Error::plan(format!(
                    "to_storage: column {signal:?} is {}, not a File",
                    column.data_type()
                )));
            }
            let files = File::decode_array(column).map_err(|e| Error::plan(e.to_string()))?;
            let mut dests: Vec<Option<String>> = vec![None; files.len()];
            for (i, file) in files.into_iter().enumerate() {
                let Some(file) = file else { continue };
                if link_type == LinkType::Symlink {
                    local_source(&file)?;
                }
                let url = file.url();
                match destination(&file, placement)? {
                    Some(dest) => {
                        match names.get(&dest) {
                            Some(first) if *first == url || placement == Placement::Etag => {
                                continue;
                            }
                            Some(first) => {
                                return Err(Error::plan(format!(
                                    "to_storage: {first} and {url} both go to {dest:?} \
                                     (placement {placement:?}); nothing was written: use \
                                     placement=\"fullpath\" or remove one of them"
                                )));
                            }
                            None => {
                                names.insert(dest.clone(), url);
                            }
                        }
                        candidates.push((batches.len(), i, dest, file));
                    }
                    None => {
                        // Named by its bytes: the same source twice is one file.
                        if names.insert(url.clone(), url).is_some() {
                            continue;
                        }
                        dests[i] = Some(String::new());
                    }
                }
            }
            batches.push((batch, dests));
        }
        // What is already there (no download for those).
        // (Owned items: a future over borrowed ones is not `Send` for every lifetime.)
        let checks: Vec<(String, File)> = candidates
            .iter()
            .map(|(_, _, dest, file)| (dest.clone(), file.clone()))
            .collect();
        let present: Vec<bool> = futures::stream::iter(checks)
            .map(|(dest, file)| {
                let out = Arc::clone(&out);
                async move { out.present(&dest, &file, link_type).await }
            })
            .buffered(16)
            .try_collect()
            .await?;
        for ((b, i, dest, _), present) in candidates.into_iter().zip(present) {
            if present {
                skipped += 1;
            } else {
                batches[b].1[i] = Some(dest);
            }
        }
        let todo: Vec<RecordBatch> = batches
            .into_iter()
            .map(|(batch, dests)| {
                let keep =
                    BooleanArray::from(dests.iter().map(Option::is_some).collect::<Vec<_>>());
                filter_record_batch(&batch_with_dests(&batch, dests)?, &keep)
                    .map_err(|e| Error::from(datafusion::error::DataFusionError::from(e)))
            })
            .collect::<Result<_>>()?;
        let rows: usize = todo.iter().map(RecordBatch::num_rows).sum();
        if rows == 0 {
            return Ok(ExportSummary {
                written: 0,
                skipped,
            });
        }
        // 2. The writes, as a map UDF over the files (prefetch in front).
        let schema = todo[0].schema();
        let table = Arc::new(MemTable::try_new(schema, vec![todo])?);
        let writer = Arc::new(Writer {
            out,
            placement,
            link_type,
        });
        let results = Chain::with_source(Arc::clone(&self.session), Source::Table(table))
            .settings(self.settings.clone())
            .map_on(&["file", "dest"], "exported", move |row: Row| {
                let writer = Arc::clone(&writer);
                async move { writer.write(row).await }
            })
            .select([col("exported")])
            .collect()
            .await?;
        let mut summary = ExportSummary {
            written: 0,
            skipped,
        };
        for batch in &results {
            let done = batch
                .column(0)
                .as_any()
                .downcast_ref::<StringArray>()
                .ok_or_else(|| Error::internal("to_storage: a non-text result"))?;
            for s in done.iter().flatten() {
                match s {
                    WRITTEN => summary.written += 1,
                    _ => summary.skipped += 1,
                }
            }
        }
        Ok(summary)
    }
}

const WRITTEN: &str = "written";
const SKIPPED: &str = "skipped";

/// One file to write: the UDF's input.
#[derive(Debug, Deserialize)]
struct Row {
    file: File,
    /// The name below the output; empty for `checksum` (named once read).
    dest: String,
}

/// `batch` (one `file` column) with a `dest` column: `dests[i]`, null for
/// rows not to write.
fn batch_with_dests(batch: &RecordBatch, dests: Vec<Option<String>>) -> Result<RecordBatch> {
    let file = batch.schema().field(0).clone();
    let schema = Arc::new(Schema::new(vec![
        file,
        Field::new("dest", DataType::Utf8, true),
    ]));
    let dest = Arc::new(StringArray::from(dests));
    Ok(
        RecordBatch::try_new(schema, vec![Arc::clone(batch.column(0)), dest])
            .map_err(datafusion::error::DataFusionError::from)?,
    )
}

/// The path of `file` as its name is built from: the member's name below
/// the archive's path for an archive member.
fn file_path(file: &File) -> String {
    match file.member() {
        Some(m) => format!("{}/{}", file.path, m.name),
        None => file.path.clone(),
    }
}

/// `.ext` of the last segment of `path` (empty without one).
fn suffix(path: &str) -> String {
    let name = path.rsplit('/').next().unwrap_or(path);
    match name.rfind('.') {
        Some(i) if i > 0 => name[i..].to_string(),
        _ => String::new(),
    }
}

/// The name below `output` (`None`: named by its checksum once read).
fn destination(file: &File, placement: Placement) -> Result<Option<String>> {
    let path = file_path(file);
    let dest = match placement {
        Placement::FullPath | Placement::FilePath => {
            let loc = Location::of_source(&file.source)?;
            if loc.store_url.scheme() == "file" {
                path
            } else {
                let host = match placement {
                    Placement::FullPath => loc.store_url.host_str().unwrap_or_default(),
                    _ => "",
                };
                [host, loc.prefix.as_ref(), path.as_str()]
                    .iter()
                    .filter(|s| !s.is_empty())
                    .copied()
                    .collect::<Vec<_>>()
                    .join("/")
            }
        }
        Placement::FileName => path.rsplit('/').next().unwrap_or(&path).to_string(),
        Placement::Etag => {
            let etag = file
                .etag
                .as_deref()
                .filter(|e| !e.is_empty())
                .ok_or_else(|| {
                    Error::plan(format!(
                        "to_storage(placement=\"etag\"): {} has no ETag",
                        file.url()
                    ))
                })?;
            format!("{}{}", etag.trim_matches('"'), suffix(&path))
        }
        Placement::Checksum => return Ok(None),
    };
    check_dest(&dest, file)?;
    Ok(Some(dest))
}

/// Refuses names that would leave `output` or that no store can hold.
fn check_dest(dest: &str, file: &File) -> Result<()> {
    let bad = dest.is_empty()
        || dest.starts_with('/')
        || dest.contains('\\')
        || dest
            .split('/')
            .any(|s| s.is_empty() || s == "." || s == "..");
    if bad {
        return Err(Error::plan(format!(
            "to_storage: {} would be written as {dest:?}, which is not a plain relative name",
            file.url()
        )));
    }
    Ok(())
}

/// The local path of a local source file, for `symlink`.
fn local_source(file: &File) -> Result<PathBuf> {
    let refuse = |why: &str| {
        Error::plan(format!(
            "to_storage(link_type=\"symlink\") links local files only: {} {why}",
            file.url()
        ))
    };
    if file.member().is_some() {
        return Err(refuse("is an archive member"));
    }
    let loc = Location::of_source(&file.source)?;
    if loc.store_url.scheme() != "file" {
        return Err(refuse("is not a local file (use link_type=\"copy\")"));
    }
    let key = loc.child(&file.path)?;
    Ok(PathBuf::from("/").join(key.as_ref()))
}

/// Where the files go.
enum Output {
    Local(PathBuf),
    Store {
        store: Arc<dyn ObjectStore>,
        loc: Location,
        /// The objects below the output when the export started, key ->
        /// size: one listing instead of a HEAD per file.
        existing: HashMap<String, u64>,
    },
}

impl Output {
    async fn open(chain: &Chain, output: &str) -> Result<Self> {
        if let Some(dir) = local_dir(output) {
            return Ok(Self::Local(dir));
        }
        let loc = Location::parse_output(output)?;
        let store = crate::storage::open_store(
            chain.session.context().runtime_env().as_ref(),
            &loc,
            chain.settings.get_storage_options(),
        )?;
        let prefix = (!loc.prefix.as_ref().is_empty()).then_some(&loc.prefix);
        let existing = store
            .list(prefix)
            .map_ok(|m| (m.location.to_string(), m.size))
            .try_collect::<HashMap<_, _>>()
            .await
            .map_err(|e| Error::Storage {
                url: loc.source.clone(),
                source: Arc::new(e),
            })?;
        Ok(Self::Store {
            store,
            loc,
            existing,
        })
    }

    /// Whether `dest` already holds `file` (see the module header).
    async fn present(&self, dest: &str, file: &File, link_type: LinkType) -> Result<bool> {
        match self {
            Self::Local(dir) => {
                let path = dir.join(dest);
                if link_type == LinkType::Symlink {
                    let target = local_source(file)?;
                    return Ok(tokio::fs::read_link(&path).await.is_ok_and(|t| t == target));
                }
                match tokio::fs::symlink_metadata(&path).await {
                    Ok(m) => Ok(m.is_file() && file.size_known() && m.len() == file.size),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
                    Err(e) => Err(Error::io(path.display(), e)),
                }
            }
            Self::Store { loc, existing, .. } => {
                let key = loc.child(dest)?;
                Ok(file.size_known() && existing.get(key.as_ref()) == Some(&file.size))
            }
        }
    }
}

/// The local directory `output` names, if it is local.
fn local_dir(output: &str) -> Option<PathBuf> {
    match url::Url::parse(output) {
        Ok(u) if u.scheme() == "file" => u.to_file_path().ok(),
        Ok(u) if u.scheme().len() > 1 => None,
        _ => std::path::absolute(output).ok(),
    }
}

/// Writes one file (the UDF's body).
struct Writer {
    out: Arc<Output>,
    placement: Placement,
    link_type: LinkType,
}

impl Writer {
    async fn write(&self, row: Row) -> std::result::Result<String, BoxError> {
        let file = row.file;
        let dest = match self.placement {
            Placement::Checksum => {
                let name = format!("{}{}", sha256_of(&file).await?, suffix(&file_path(&file)));
                if self.out.present(&name, &file, self.link_type).await? {
                    return Ok(SKIPPED.to_string());
                }
                name
            }
            _ => row.dest,
        };
        match &*self.out {
            Output::Local(dir) => self.write_local(&file, &dir.join(&dest)).await?,
            Output::Store { store, loc, .. } => {
                let key = loc.child(&dest)?;
                write_store(&file, store, &key).await.map_err(|e| {
                    format!("writing {} to {}{key}: {e}", file.url(), loc.store_url)
                })?;
            }
        }
        Ok(WRITTEN.to_string())
    }

    async fn write_local(&self, file: &File, path: &Path) -> std::result::Result<(), BoxError> {
        let io = |p: &Path| {
            let p = p.display().to_string();
            move |e: std::io::Error| Error::io(p, e)
        };
        let dir = path.parent().ok_or("no parent dir")?;
        tokio::fs::create_dir_all(dir).await.map_err(io(dir))?;
        let tmp = dir.join(format!(".udfchain-part-{:016x}", temp_key(file, path)));
        match tokio::fs::remove_file(&tmp).await {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(&tmp)(e).into()),
            _ => {}
        }
        if self.link_type == LinkType::Symlink {
            let target = local_source(file)?;
            let (t, l) = (target.clone(), tmp.clone());
            crate::runtime::blocking(move || {
                std::os::unix::fs::symlink(&t, &l).map_err(|e| Error::io(l.display(), e))
            })
            .await?;
        } else {
            let mut reader = file.open().await?;
            let mut out = tokio::fs::File::create(&tmp).await.map_err(io(&tmp))?;
            let n = tokio::io::copy(&mut reader, &mut out)
                .await
                .map_err(|e| format!("copying {}: {e}", file.url()))?;
            check_size(file, n)?;
            out.sync_all().await.map_err(io(&tmp))?;
        }
        tokio::fs::rename(&tmp, path).await.map_err(io(path))?;
        let d = dir.to_path_buf();
        crate::runtime::blocking(move || {
            crate::util::durable::sync_dir(&d).map_err(|e| Error::io(d.display(), e))
        })
        .await?;
        Ok(())
    }
}

/// A read that gave another size than the listing's is an error, not a file.
fn check_size(file: &File, n: u64) -> std::result::Result<(), BoxError> {
    if file.size_known() && n != file.size {
        return Err(format!(
            "{} gave {n} bytes, the listing says {}",
            file.url(),
            file.size
        )
        .into());
    }
    Ok(())
}

/// Uploads `file` to `key`: one PUT, or a multipart upload completed at
/// the end (aborted on error), through object_store's `BufWriter`.
async fn write_store(
    file: &File,
    store: &Arc<dyn ObjectStore>,
    key: &datafusion::object_store::path::Path,
) -> std::result::Result<(), BoxError> {
    let mut reader = file.open().await?;
    let mut w = datafusion::object_store::buffered::BufWriter::new(Arc::clone(store), key.clone());
    let copied = tokio::io::copy(&mut reader, &mut w).await;
    let n = match copied {
        Ok(n) => n,
        Err(e) => {
            let _ = w.abort().await;
            return Err(e.into());
        }
    };
    if let Err(e) = check_size(file, n) {
        let _ = w.abort().await;
        return Err(e);
    }
    w.shutdown().await?;
    Ok(())
}

/// The SHA-256 of `file`'s bytes, hex.
async fn sha256_of(file: &File) -> std::result::Result<String, BoxError> {
    use sha2::Digest;
    let mut reader = file.open().await?;
    let mut hasher = sha2::Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = reader.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// One temp name per (source, destination).
fn temp_key(file: &File, path: &Path) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    file.url().hash(&mut h);
    path.hash(&mut h);
    h.finish()
}
