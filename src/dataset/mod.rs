//! Datasets: results saved as Parquet under `<root>/datasets/<name>/v<N>/` and
//! registered with a version in an embedded SQLite catalog (`<root>/catalog.sqlite`).
//!
//! Guarantees: a save is atomic — its data is written to a staging dir first,
//! and one SQLite `IMMEDIATE` transaction allocates the next version, renames the
//! staging dir into place and inserts the row; a failed or killed save leaves no
//! visible version, and its staging dir or an unregistered version dir is
//! removed by the next `Catalog::open`. Saves of one name from several threads
//! or processes get distinct, increasing versions.
//!
//! Versions are never reused: `dataset_seq` holds the highest version ever
//! issued per name, kept when versions (or the whole dataset) are removed, so a
//! version number (in `read_dataset`, a loader ticket, a pipeline record) always
//! means the data first saved under it. A save is durable before it is
//! visible: its Parquet files, its dir and the dirs naming it are fsynced
//! ([`crate::util::durable`]) before the transaction that inserts its row
//! commits, and catalog commits are themselves synchronous (`synchronous =
//! FULL`). A remove deletes exactly the dirs of the rows its own transaction
//! deleted, after that commit and under the write lock saves take (a kill in
//! between leaves unregistered dirs, which `open` sweeps); since versions are
//! never reused, those dirs are nobody else's.
//!
//! A staging dir belongs to the process holding its owner lock
//! ([`crate::util::owner`]) until the commit moves it into place, or until its
//! [`Staging`] guard is dropped (which removes it); `open` removes only staging
//! dirs whose lock it can take, so a save running in another process is never
//! disturbed, whatever the pid or the OS.
//!
//! SQLite work is blocking: the sync API is for sync callers, the `*_async`
//! wrappers run it on tokio's blocking pool for the engine.
//!
//! Rows hold version paths relative to the root (`datasets/<name>/v<N>`) and
//! [`DatasetInfo::path`] is resolved against the root as opened, so a root
//! reached through a symlink, through `..` or after being moved reads the same
//! versions. The sweep decides from catalog rows (name, version), never from how
//! a path is spelled: a committed version is never removed by `open`. Rows of
//! older catalogs holding absolute paths are rewritten to relative at open when
//! they lie under the root, and kept as they are otherwise.
//!
//! Errors: SQLite failures are [`Error::Catalog`] (the catalog file and the
//! `rusqlite` error); a missing dataset or version and a bad name are
//! [`Error::Dataset`] messages.

pub mod checkpoints;
mod lineage;

pub use lineage::LineageEntry;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use crate::error::{Error, Result};
use crate::runtime::blocking;
use crate::util::durable;
use crate::util::owner::{self, OwnerLock};

/// One version of a dataset.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DatasetInfo {
    /// The dataset's name.
    pub name: String,
    /// The version (from 1).
    pub version: u32,
    /// The directory holding the version's Parquet file(s), resolved against
    /// the root the catalog was opened with.
    pub path: PathBuf,
    /// One `name: type` per line.
    pub schema: String,
    /// Rows in this version.
    pub rows: u64,
    /// Bytes of its data files.
    pub bytes: u64,
    /// Seconds since the Unix epoch.
    pub created: i64,
    /// The plan or script that produced it.
    pub query: String,
}

/// The dataset catalog under a root dir.
#[derive(Debug, Clone)]
pub struct Catalog {
    root: PathBuf,
}

/// A staging dir a save writes into: owned (locked) by this process until
/// [`Catalog::commit`] moves it into place; dropping it uncommitted removes it.
#[derive(Debug)]
pub struct Staging {
    dir: PathBuf,
    lock: Option<OwnerLock>,
}

impl Staging {
    /// Where to write the version's files.
    pub fn path(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if let Some(lock) = self.lock.take() {
            // Removed while still locked, so no sweeper races with us.
            let _ = std::fs::remove_dir_all(&self.dir);
            drop(lock);
        }
    }
}

impl Catalog {
    /// [`Catalog::remove_stale_checkpoints`], on the calling thread.
    pub(crate) fn remove_stale_checkpoints_blocking(
        &self,
    ) -> Result<Vec<checkpoints::RemovedCheckpoint>> {
        checkpoints::gc(&self.root)
    }

    /// Removes every checkpoint under the root that no running save holds:
    /// the UDF results kept by saves that failed or were killed, which a run
    /// of the same statement would otherwise continue from (`udfchain
    /// datasets gc`). Costs work, never data.
    ///
    /// Runs on the blocking pool (SQLite blocks).
    pub async fn remove_stale_checkpoints(&self) -> Result<Vec<checkpoints::RemovedCheckpoint>> {
        let cat = self.clone();
        blocking(move || cat.remove_stale_checkpoints_blocking()).await
    }

    /// [`Catalog::open`], on the calling thread.
    pub(crate) fn open_blocking(root: &Path) -> Result<Self> {
        let root = std::path::absolute(root).map_err(|e| Error::io(root.display(), e))?;
        let cat = Self { root };
        std::fs::create_dir_all(cat.staging_root())
            .map_err(|e| Error::io(cat.staging_root().display(), e))?;
        let sql = cat.sql_err();
        let conn = cat.connect()?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS versions (
                name TEXT NOT NULL,
                version INTEGER NOT NULL,
                path TEXT NOT NULL,
                schema TEXT NOT NULL,
                rows INTEGER NOT NULL,
                bytes INTEGER NOT NULL,
                created INTEGER NOT NULL,
                query TEXT NOT NULL,
                PRIMARY KEY (name, version)
            );
            CREATE TABLE IF NOT EXISTS dataset_seq (
                name TEXT PRIMARY KEY,
                last INTEGER NOT NULL
            );",
        )
        .map_err(&sql)?;
        let mut conn = conn;
        lineage::migrate(&mut conn).map_err(&sql)?;
        cat.sweep(conn)?;
        Ok(cat)
    }

    /// Opens (creating) the catalog under `root`, then removes what failed or
    /// killed saves left behind.
    ///
    /// Runs on the blocking pool (SQLite blocks).
    ///
    /// # Cancel safety
    /// Dropping the future does not stop the open (and its sweep) once started.
    pub async fn open(root: impl Into<PathBuf>) -> Result<Self> {
        let root = root.into();
        blocking(move || Self::open_blocking(&root)).await
    }

    /// The catalog's SQLite file.
    pub fn db_path(&self) -> PathBuf {
        self.root.join("catalog.sqlite")
    }

    /// Maps a SQLite error to [`Error::Catalog`] naming this catalog's file.
    fn sql_err(&self) -> impl Fn(rusqlite::Error) -> Error + use<> {
        let path = self.db_path().display().to_string();
        move |e| Error::Catalog {
            path: path.clone(),
            source: Arc::new(e),
        }
    }

    /// The root dir as opened (absolute, not canonicalized).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// A row's path resolved against the root as opened; an absolute path (an
    /// older catalog's row outside the root) is kept as it is.
    fn resolve(&self, stored: &str) -> PathBuf {
        self.root.join(stored)
    }

    fn connect(&self) -> Result<Connection> {
        let sql = self.sql_err();
        let conn = Connection::open(self.db_path()).map_err(&sql)?;
        conn.busy_timeout(Duration::from_secs(30)).map_err(&sql)?;
        // Every commit reaches the disk before it returns (WAL's default
        // NORMAL would lose the last commits on a power loss).
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(&sql)?;
        // Switching to WAL takes an exclusive lock and can report SQLITE_BUSY
        // without waiting on the busy handler while another process opens the
        // same new catalog; retry for as long as the busy timeout.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            match conn.pragma_update(None, "journal_mode", "WAL") {
                Ok(()) => return Ok(conn),
                Err(rusqlite::Error::SqliteFailure(e, _))
                    if e.code == rusqlite::ErrorCode::DatabaseBusy
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(sql(e)),
            }
        }
    }

    fn datasets_root(&self) -> PathBuf {
        self.root.join("datasets")
    }

    fn staging_root(&self) -> PathBuf {
        self.datasets_root().join(".staging")
    }

    /// [`Catalog::staging_dir`], on the calling thread.
    pub(crate) fn staging_dir_blocking(&self) -> Result<Staging> {
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = self.staging_root().join(format!(
            "{}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let staging_root = self.staging_root();
        std::fs::create_dir_all(&staging_root).map_err(|e| Error::io(staging_root.display(), e))?;
        let lock = OwnerLock::create_dir(&dir).map_err(|e| Error::io(dir.display(), e))?;
        Ok(Staging {
            dir,
            lock: Some(lock),
        })
    }

    /// A new staging dir for a save by this process, locked by it until
    /// committed or dropped.
    ///
    /// Runs on the blocking pool (SQLite blocks).
    pub async fn staging_dir(&self) -> Result<Staging> {
        let cat = self.clone();
        blocking(move || cat.staging_dir_blocking()).await
    }

    /// [`Catalog::commit_with_lineage`], on the calling thread.
    pub(crate) fn commit_with_lineage_blocking(
        &self,
        name: &str,
        mut staging: Staging,
        schema: &str,
        rows: u64,
        query: &str,
        sources: &[LineageEntry],
    ) -> Result<DatasetInfo> {
        check_name(name)?;
        let sql = self.sql_err();
        // The files and their dir reach the disk before the row that makes them
        // visible (outside the write lock: fsync is slow).
        durable::sync_tree(&staging.dir).map_err(|e| Error::io(staging.dir.display(), e))?;
        let mut conn = self.connect()?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(&sql)?;
        // Above every version ever issued (rows of catalogs older than
        // `dataset_seq` count too), never MAX(version) + 1 of what is left.
        let version: u32 = tx
            .query_row(
                "SELECT MAX(
                    COALESCE((SELECT last FROM dataset_seq WHERE name = ?1), 0),
                    COALESCE((SELECT MAX(version) FROM versions WHERE name = ?1), 0)) + 1",
                params![name],
                |r| r.get(0),
            )
            .map_err(&sql)?;
        let relative = version_dir(name, version);
        let path = self.root.join(&relative);
        let parent = self.datasets_root().join(name);
        std::fs::create_dir_all(&parent).map_err(|e| Error::io(parent.display(), e))?;
        // A dir left there by a killed save that never committed is not a version.
        if path.exists() {
            std::fs::remove_dir_all(&path).map_err(|e| Error::io(path.display(), e))?;
        }
        // Under the write lock, which `open` sweeps staging dirs under too:
        // give the dir up (its lock file goes), then move it into place.
        let dir = staging.dir.clone();
        if let Some(lock) = staging.lock.take()
            && let Err(e) = lock.release()
        {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(Error::io(dir.display(), e));
        }
        let bytes = dir_bytes(&dir);
        if let Err(e) = std::fs::rename(&dir, &path) {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(Error::io(path.display(), e));
        }
        // The new name (and the dataset's dir, when new) on disk before the row.
        let named =
            durable::sync_dir(&parent).and_then(|()| durable::sync_dir(&self.datasets_root()));
        if let Err(e) = named {
            let _ = std::fs::remove_dir_all(&path);
            return Err(Error::io(parent.display(), e));
        }
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        let info = DatasetInfo {
            name: name.to_string(),
            version,
            path: path.clone(),
            schema: schema.to_string(),
            rows,
            bytes,
            created,
            query: query.to_string(),
        };
        let inserted = tx.execute(
            "INSERT INTO versions (name, version, path, schema, rows, bytes, created, query)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![
                name,
                version,
                relative,
                schema,
                rows as i64,
                bytes as i64,
                created,
                query
            ],
        );
        let issued = inserted
            .and_then(|_| {
                tx.execute(
                    "INSERT INTO dataset_seq (name, last) VALUES (?1, ?2)
                 ON CONFLICT(name) DO UPDATE SET last = excluded.last",
                    params![name, version],
                )
            })
            // A version number is never reused, so no older lineage rows
            // can be under (name, version); clear them anyway.
            .and_then(|_| lineage::delete(&tx, name, Some(version)))
            .and_then(|()| lineage::insert(&tx, name, version, sources));
        match issued.and_then(|_| tx.commit()) {
            Ok(()) => Ok(info),
            Err(e) => {
                let _ = std::fs::remove_dir_all(&path);
                Err(sql(e))
            }
        }
    }

    /// Registers the data in `staging` as the next version of `name`. On
    /// failure the staging dir is removed (with the guard).
    ///
    /// Runs on the blocking pool (SQLite blocks).
    ///
    /// # Cancel safety
    /// Once started, the commit runs to completion even if the future is
    /// dropped: the version then exists (or, on failure, the staging dir is gone).
    pub async fn commit(
        &self,
        name: &str,
        staging: Staging,
        schema: String,
        rows: u64,
        query: String,
    ) -> Result<DatasetInfo> {
        self.commit_with_lineage(name, staging, schema, rows, query, Vec::new())
            .await
    }

    /// [`Catalog::commit`], recording `sources` as what the version read
    /// (in the transaction that makes the version visible; see
    /// [`Catalog::lineage`]).
    ///
    /// Runs on the blocking pool (SQLite blocks).
    ///
    /// # Cancel safety
    /// As [`Catalog::commit`].
    pub async fn commit_with_lineage(
        &self,
        name: &str,
        staging: Staging,
        schema: String,
        rows: u64,
        query: String,
        sources: Vec<LineageEntry>,
    ) -> Result<DatasetInfo> {
        let (cat, name) = (self.clone(), name.to_string());
        blocking(move || {
            cat.commit_with_lineage_blocking(&name, staging, &schema, rows, &query, &sources)
        })
        .await
    }

    /// [`Catalog::lineage`], on the calling thread.
    pub(crate) fn lineage_blocking(
        &self,
        name: &str,
        version: Option<u32>,
    ) -> Result<Vec<LineageEntry>> {
        let info = self.get_blocking(name, version)?;
        let conn = self.connect()?;
        lineage::read(&conn, &info.name, info.version).map_err(self.sql_err())
    }

    /// What version `version` of `name` (default: its latest) read: storage
    /// URIs and dataset versions, in plan order, without duplicates. Empty
    /// for a version that read neither (values, a SQL `VALUES`) or that was
    /// saved by a udfchain older than lineage. A missing dataset or version
    /// is an [`Error::Dataset`], as in [`Catalog::get`].
    ///
    /// Runs on the blocking pool (SQLite blocks).
    pub async fn lineage(&self, name: &str, version: Option<u32>) -> Result<Vec<LineageEntry>> {
        let (cat, name) = (self.clone(), name.to_string());
        blocking(move || cat.lineage_blocking(&name, version)).await
    }

    /// [`Catalog::get`], on the calling thread.
    pub(crate) fn get_blocking(&self, name: &str, version: Option<u32>) -> Result<DatasetInfo> {
        let conn = self.connect()?;
        let query = "SELECT name, version, path, schema, rows, bytes, created, query FROM versions
                   WHERE name = ?1 AND (?2 IS NULL OR version = ?2) ORDER BY version DESC LIMIT 1";
        conn.query_row(query, params![name, version], |r| self.row_info(r))
            .optional()
            .map_err(self.sql_err())?
            .ok_or_else(|| {
                let known = self
                    .list_blocking()
                    .map(|l| l.into_iter().map(|i| i.name).collect::<Vec<_>>())
                    .unwrap_or_default();
                let what = match version {
                    Some(v) => format!("dataset {name:?} has no version {v}"),
                    None => format!("no dataset {name:?}"),
                };
                match crate::util::closest(name, known.iter().map(String::as_str)) {
                    Some(c) if version.is_none() => {
                        Error::Dataset(format!("{what} (did you mean {c:?}?)"))
                    }
                    _ => Error::Dataset(what),
                }
            })
    }

    /// Version `version` of `name`, or its latest.
    ///
    /// Runs on the blocking pool (SQLite blocks).
    pub async fn get(&self, name: &str, version: Option<u32>) -> Result<DatasetInfo> {
        let (cat, name) = (self.clone(), name.to_string());
        blocking(move || cat.get_blocking(&name, version)).await
    }

    /// [`Catalog::list`], on the calling thread.
    pub(crate) fn list_blocking(&self) -> Result<Vec<DatasetInfo>> {
        let sql = self.sql_err();
        let conn = self.connect()?;
        let mut stmt = conn
            .prepare("SELECT name, version, path, schema, rows, bytes, created, query FROM versions ORDER BY name, version")
            .map_err(&sql)?;
        let rows = stmt.query_map([], |r| self.row_info(r)).map_err(&sql)?;
        rows.collect::<Result<Vec<_>, _>>().map_err(&sql)
    }

    /// Every version of every dataset, by name then version.
    ///
    /// Runs on the blocking pool (SQLite blocks).
    pub async fn list(&self) -> Result<Vec<DatasetInfo>> {
        let cat = self.clone();
        blocking(move || cat.list_blocking()).await
    }

    /// [`Catalog::remove`], on the calling thread.
    pub(crate) fn remove_blocking(&self, name: &str, version: Option<u32>) -> Result<usize> {
        let sql = self.sql_err();
        let mut conn = self.connect()?;
        // Unlink: the rows this transaction deletes name the dirs to delete.
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(&sql)?;
        let paths: Vec<String> = {
            let mut stmt = tx
                .prepare(
                    "DELETE FROM versions WHERE name = ?1 AND (?2 IS NULL OR version = ?2)
                     RETURNING path",
                )
                .map_err(&sql)?;
            let rows = stmt
                .query_map(params![name, version], |r| r.get(0))
                .map_err(&sql)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(&sql)?
        };
        lineage::delete(&tx, name, version).map_err(&sql)?;
        if paths.is_empty() {
            drop(tx);
            return Err(self
                .get_blocking(name, version)
                .err()
                .unwrap_or_else(|| Error::Dataset(format!("no dataset {name:?}"))));
        }
        tx.commit().map_err(&sql)?;
        // Delete them under the write lock saves take, so no save is between
        // creating the dataset's dir and moving its version in when that dir
        // is removed (empty).
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(&sql)?;
        for p in &paths {
            let _ = std::fs::remove_dir_all(self.resolve(p));
        }
        let _ = std::fs::remove_dir(self.datasets_root().join(name));
        tx.commit().map_err(&sql)?;
        Ok(paths.len())
    }

    /// Removes one version of `name`, or all of them; returns how many. Their
    /// numbers are not issued again.
    ///
    /// Runs on the blocking pool (SQLite blocks).
    pub async fn remove(&self, name: &str, version: Option<u32>) -> Result<usize> {
        let (cat, name) = (self.clone(), name.to_string());
        blocking(move || cat.remove_blocking(&name, version)).await
    }

    /// Rewrites absolute row paths that lie under the root to relative ones,
    /// removes staging dirs whose owner lock is free and `v<N>` dirs with no
    /// catalog row for (name, N). Anything it cannot match is kept.
    fn sweep(&self, mut conn: Connection) -> Result<()> {
        let sql = self.sql_err();
        // Under the write lock, so no save is between giving up its staging
        // dir and its insert.
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(&sql)?;
        if let Ok(dirs) = std::fs::read_dir(self.staging_root()) {
            for d in dirs.flatten() {
                let _ = owner::remove_if_orphan(&d.path(), owner::GRACE);
            }
        }
        let rows: Vec<(String, u32, String)> = {
            let mut stmt = tx
                .prepare("SELECT name, version, path FROM versions")
                .map_err(&sql)?;
            let rows = stmt
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .map_err(&sql)?;
            rows.collect::<Result<_, _>>().map_err(&sql)?
        };
        for (name, version, path) in &rows {
            if let Some(relative) = self.migrated(name, *version, Path::new(path)) {
                tx.execute(
                    "UPDATE versions SET path = ?1 WHERE name = ?2 AND version = ?3",
                    params![relative, name, version],
                )
                .map_err(&sql)?;
            }
        }
        let known: HashSet<(&str, u32)> = rows.iter().map(|(n, v, _)| (n.as_str(), *v)).collect();
        if let Ok(names) = std::fs::read_dir(self.datasets_root()) {
            for n in names.flatten() {
                let Some(name) = n.file_name().to_str().map(str::to_string) else {
                    continue;
                };
                if name.starts_with('.') {
                    continue;
                }
                let Ok(versions) = std::fs::read_dir(n.path()) else {
                    continue;
                };
                for v in versions.flatten() {
                    let number = v
                        .file_name()
                        .to_str()
                        .and_then(|f| f.strip_prefix('v'))
                        .and_then(|n| n.parse::<u32>().ok());
                    let is_dir = v.file_type().is_ok_and(|t| t.is_dir());
                    if let Some(number) = number
                        && is_dir
                        && !known.contains(&(name.as_str(), number))
                    {
                        let _ = std::fs::remove_dir_all(v.path());
                    }
                }
            }
        }
        tx.commit().map_err(&sql)
    }

    /// The relative path to store for a row whose stored `path` is absolute and
    /// names this root's dir of (name, version) under any spelling: the same
    /// string prefix, the same dir through symlinks or `..`, or a root that was
    /// moved (the old path is gone, the version's dir is under this root).
    /// `None` for a relative path or a dir elsewhere.
    fn migrated(&self, name: &str, version: u32, path: &Path) -> Option<String> {
        if !path.is_absolute() {
            return None;
        }
        let relative = version_dir(name, version);
        let here = self.root.join(&relative);
        let under_root = path
            .strip_prefix(&self.root)
            .is_ok_and(|r| r == Path::new(&relative));
        let same_dir = match (std::fs::canonicalize(path), std::fs::canonicalize(&here)) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        };
        let moved = path.ends_with(&relative) && !path.exists() && here.is_dir();
        (under_root || same_dir || moved).then_some(relative)
    }

    fn row_info(&self, r: &rusqlite::Row<'_>) -> rusqlite::Result<DatasetInfo> {
        Ok(DatasetInfo {
            name: r.get(0)?,
            version: r.get(1)?,
            path: self.resolve(&r.get::<_, String>(2)?),
            schema: r.get(3)?,
            rows: r.get::<_, i64>(4)? as u64,
            bytes: r.get::<_, i64>(5)? as u64,
            created: r.get(6)?,
            query: r.get(7)?,
        })
    }
}

/// Where version `version` of `name` lives, relative to the root.
fn version_dir(name: &str, version: u32) -> String {
    format!("datasets/{name}/v{version}")
}

/// Checks `name` can be a dataset name (and a dir name): letters, digits,
/// `_`, `-`, `.`, not starting with a dot.
pub(crate) fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if ok {
        Ok(())
    } else {
        Err(Error::Dataset(format!(
            "invalid dataset name {name:?}: use letters, digits, '_', '-', '.'"
        )))
    }
}

/// Bytes of the files under `dir`, its subdirs included.
pub(crate) fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            Ok(_) => e.metadata().map(|m| m.len()).unwrap_or(0),
            Err(_) => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Commits a version of `name` holding one file.
    fn save(cat: &Catalog, name: &str) -> DatasetInfo {
        let staging = cat.staging_dir_blocking().expect("staging");
        std::fs::write(staging.path().join("part-0.parquet"), b"rows").expect("write");
        cat.commit_with_lineage_blocking(name, staging, "a: Int64", 1, "test", &[])
            .expect("commit")
    }

    #[test]
    fn versions_are_never_reused() {
        let root = tempfile::tempdir().expect("root");
        let cat = Catalog::open_blocking(root.path()).expect("open");
        assert_eq!(save(&cat, "x").version, 1);
        assert_eq!(save(&cat, "x").version, 2);
        assert_eq!(cat.remove_blocking("x", Some(2)).expect("rm 2"), 1);
        assert_eq!(save(&cat, "x").version, 3, "save, rm, save gives 3, not 2");
        assert_eq!(cat.remove_blocking("x", None).expect("rm all"), 2);
        let reopened = Catalog::open_blocking(root.path()).expect("reopen");
        assert_eq!(
            save(&reopened, "x").version,
            4,
            "across opens, after rm all"
        );
        assert_eq!(save(&reopened, "y").version, 1, "per name");
    }

    #[test]
    fn a_remove_deletes_only_the_dirs_of_the_rows_it_deleted() {
        let root = tempfile::tempdir().expect("root");
        let cat = Catalog::open_blocking(root.path()).expect("open");
        let (v1, v2) = (save(&cat, "x"), save(&cat, "x"));
        cat.remove_blocking("x", Some(1)).expect("rm 1");
        assert!(!v1.path.exists() && v2.path.join("part-0.parquet").is_file());
        let e = cat.remove_blocking("x", Some(1)).expect_err("gone");
        assert!(e.to_string().contains("no version 1"), "{e}");
        assert!(v2.path.is_dir(), "a failed remove deletes nothing");
        cat.remove_blocking("x", None).expect("rm all");
        assert!(!root.path().join("datasets").join("x").exists());
    }

    #[test]
    fn a_commit_fsyncs_its_files_and_the_dirs_naming_them() {
        let root = tempfile::tempdir().expect("root");
        let cat = Catalog::open_blocking(root.path()).expect("open");
        let staging = cat.staging_dir_blocking().expect("staging");
        let file = staging.path().join("part-0.parquet");
        std::fs::write(&file, b"rows").expect("write");
        let staged = staging.path().to_path_buf();
        durable::take_synced();
        let info = cat
            .commit_with_lineage_blocking("x", staging, "a: Int64", 1, "test", &[])
            .expect("commit");
        let synced = durable::take_synced();
        for want in [
            file,
            staged,
            info.path.parent().expect("parent").to_path_buf(),
            root.path().join("datasets"),
        ] {
            assert!(
                synced.contains(&want),
                "{} not in {synced:?}",
                want.display()
            );
        }
    }
}
