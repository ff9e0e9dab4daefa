//! The pipeline's own tables in its state db (`<root>/pipelines/<name>/state.db`,
//! SQLite in WAL mode), next to the trigger's (`trig_*`) and the strategy's
//! (`sel_*`) tables, so that one transaction covers all three.
//!
//! - `pl_meta(name, value)`: the config (YAML), the next key, the cursor (the
//!   last key informed), the storage watermark (the largest file timestamp
//!   ingested), the next trigger id, the timestamp of the last sample informed.
//! - `pl_files(path, ...)`: every file ingested, with what a `File` needs.
//! - `pl_samples(key, path, idx, timestamp, label, features)`: keys are
//!   assigned once, in (timestamp, path, index) order within one discovery,
//!   and never change.
//! - `pl_triggers(trigger_id, ...)`: `pending` once the trigger's set is
//!   computed (same transaction as the batch that fired it), then `done` (hook
//!   succeeded) or `skipped` (empty set), each in its own commit.
//!
//! Guarantees: the schema is created if missing; every commit is fsynced
//! before it returns (`synchronous = FULL`), and the db's dir entries are
//! fsynced when it is opened; every SQLite failure is an [`Error::Pipeline`]
//! naming the pipeline and the db file.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};

use crate::error::{Error, Result};
use crate::util::durable;

/// The state dir of pipeline `name` under `root`.
pub fn pipeline_dir(root: &Path, name: &str) -> PathBuf {
    root.join("pipelines").join(name)
}

/// The names of the pipelines under `root` that have a state db, sorted.
pub fn pipeline_names(root: &Path) -> Result<Vec<String>> {
    let dir = root.join("pipelines");
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(dir.display(), e)),
    };
    let mut names: Vec<String> = entries
        .flatten()
        .filter(|e| e.path().join(DB_FILE).is_file())
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .collect();
    names.sort();
    Ok(names)
}

pub const DB_FILE: &str = "state.db";

/// One trigger as recorded.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TriggerRecord {
    /// The trigger's id (from 0).
    pub trigger_id: u64,
    /// The timestamp (seconds since the epoch) of the sample after which it fired.
    pub at: i64,
    /// Keys in its training set.
    pub num_keys: u64,
    /// Partitions of the set.
    pub num_partitions: usize,
    /// Keys per partition.
    pub partition_sizes: Vec<usize>,
    /// The dataset holding the set (`None` for an empty set: no training).
    pub dataset: Option<String>,
    /// `pending`, `done` or `skipped`.
    #[serde(skip)]
    pub status: String,
}

/// Maps SQLite errors of the state db of `pipeline` at `path`.
#[derive(Clone)]
pub struct SqlErr {
    pipeline: String,
    path: String,
}

impl SqlErr {
    pub fn new(pipeline: &str, path: &Path) -> Self {
        Self {
            pipeline: pipeline.to_string(),
            path: path.display().to_string(),
        }
    }

    pub fn err(&self, e: rusqlite::Error) -> Error {
        Error::Pipeline {
            pipeline: self.pipeline.clone(),
            reason: format!("state db {}: {e}", self.path),
            source: Some(Arc::new(e)),
        }
    }
}

/// Opens (creating) the state db at `path` with the `pl_*` tables.
pub fn open(pipeline: &str, path: &Path) -> Result<(Connection, SqlErr)> {
    let sql = SqlErr::new(pipeline, path);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir.display(), e))?;
    }
    let conn = Connection::open(path).map_err(|e| sql.err(e))?;
    conn.busy_timeout(Duration::from_secs(30))
        .map_err(|e| sql.err(e))?;
    conn.pragma_update(None, "journal_mode", "WAL")
        .map_err(|e| sql.err(e))?;
    // Every commit (a batch and the triggers it fired, a trigger done) is
    // fsynced before it returns: WAL's NORMAL survives a process kill but may
    // lose the last commits on a power loss, after the hook saw them.
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(|e| sql.err(e))?;
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS pl_meta (name TEXT PRIMARY KEY, value);
         CREATE TABLE IF NOT EXISTS pl_files (
             path TEXT PRIMARY KEY, source TEXT NOT NULL, size INTEGER NOT NULL,
             etag TEXT, version TEXT, last_modified INTEGER, timestamp INTEGER NOT NULL,
             samples INTEGER NOT NULL);
         CREATE TABLE IF NOT EXISTS pl_samples (
             key INTEGER PRIMARY KEY, path TEXT NOT NULL, idx INTEGER NOT NULL,
             timestamp INTEGER NOT NULL, label INTEGER NOT NULL, features BLOB);
         CREATE TABLE IF NOT EXISTS pl_triggers (
             trigger_id INTEGER PRIMARY KEY, at INTEGER NOT NULL, num_keys INTEGER NOT NULL,
             partition_sizes TEXT NOT NULL, status TEXT NOT NULL, dataset TEXT,
             hook TEXT, finished INTEGER);",
    )
    .map_err(|e| sql.err(e))?;
    // The db and its WAL exist now: their names on disk too.
    if let Some(dir) = path.parent() {
        durable::sync_dir(dir).map_err(|e| Error::io(dir.display(), e))?;
        if let Some(pipelines) = dir.parent() {
            durable::sync_dir(pipelines).map_err(|e| Error::io(pipelines.display(), e))?;
        }
    }
    Ok((conn, sql))
}

/// Opens the existing state db at `path` read-only, for commands that only
/// read it (`pipeline ls|show|keys`): no table, pragma or directory sync is
/// written, so reading never waits on a running supervisor's fsyncs nor
/// takes a write lock from it (WAL readers and the writer do not block each
/// other).
pub fn open_read(pipeline: &str, path: &Path) -> Result<(Connection, SqlErr)> {
    let sql = SqlErr::new(pipeline, path);
    let conn = Connection::open_with_flags(
        path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| sql.err(e))?;
    conn.busy_timeout(Duration::from_secs(30))
        .map_err(|e| sql.err(e))?;
    Ok((conn, sql))
}

/// An integer from `pl_meta`, or `default`.
pub fn get_i64(db: &Connection, sql: &SqlErr, name: &str, default: i64) -> Result<i64> {
    Ok(db
        .query_row(
            "SELECT value FROM pl_meta WHERE name = ?1",
            params![name],
            |r| r.get::<_, i64>(0),
        )
        .optional()
        .map_err(|e| sql.err(e))?
        .unwrap_or(default))
}

/// A text from `pl_meta`.
pub fn get_text(db: &Connection, sql: &SqlErr, name: &str) -> Result<Option<String>> {
    db.query_row(
        "SELECT value FROM pl_meta WHERE name = ?1",
        params![name],
        |r| r.get::<_, String>(0),
    )
    .optional()
    .map_err(|e| sql.err(e))
}

pub fn set(db: &Connection, sql: &SqlErr, name: &str, value: impl rusqlite::ToSql) -> Result<()> {
    db.execute(
        "INSERT INTO pl_meta (name, value) VALUES (?1, ?2)
         ON CONFLICT(name) DO UPDATE SET value = excluded.value",
        params![name, value],
    )
    .map_err(|e| sql.err(e))?;
    Ok(())
}

/// Triggers in id order, optionally only those with `status`.
pub fn triggers(db: &Connection, sql: &SqlErr, status: Option<&str>) -> Result<Vec<TriggerRecord>> {
    let mut stmt = db
        .prepare(
            "SELECT trigger_id, at, num_keys, partition_sizes, status, dataset FROM pl_triggers
             WHERE ?1 IS NULL OR status = ?1 ORDER BY trigger_id",
        )
        .map_err(|e| sql.err(e))?;
    let rows = stmt
        .query_map(params![status], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, String>(4)?,
                r.get::<_, Option<String>>(5)?,
            ))
        })
        .map_err(|e| sql.err(e))?;
    let mut out = Vec::new();
    for row in rows {
        let (id, at, n, sizes, status, dataset) = row.map_err(|e| sql.err(e))?;
        let partition_sizes: Vec<usize> = serde_json::from_str(&sizes).map_err(|e| {
            Error::internal(format!("trigger {id}: bad partition sizes {sizes:?}: {e}"))
        })?;
        out.push(TriggerRecord {
            trigger_id: id as u64,
            at,
            num_keys: n as u64,
            num_partitions: partition_sizes.len(),
            partition_sizes,
            dataset,
            status,
        });
    }
    Ok(out)
}

/// Encodes features as little-endian f32s.
pub fn encode_features(f: &[f32]) -> Vec<u8> {
    f.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Decodes [`encode_features`].
pub fn decode_features(b: &[u8]) -> Arc<[f32]> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn features_round_trip() {
        let f = [1.5f32, -2.0, 0.0];
        assert_eq!(&*decode_features(&encode_features(&f)), &f);
    }

    #[test]
    fn commits_are_synchronous_and_the_db_dir_is_synced() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state_dir = dir.path().join("pipelines").join("p");
        crate::util::durable::take_synced();
        let (db, _) = open("p", &state_dir.join("state.db")).expect("open");
        let level: i64 = db
            .query_row("PRAGMA synchronous", [], |r| r.get(0))
            .expect("pragma");
        assert_eq!(level, 2, "FULL: each commit fsyncs the WAL");
        let synced = crate::util::durable::take_synced();
        assert!(synced.contains(&state_dir), "{synced:?}");
        assert!(synced.contains(&dir.path().join("pipelines")), "{synced:?}");
    }

    #[test]
    fn meta_and_triggers() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (db, sql) = open("t", &dir.path().join("state.db")).expect("open");
        assert_eq!(get_i64(&db, &sql, "cursor", -1).expect("get"), -1);
        set(&db, &sql, "cursor", 7i64).expect("set");
        set(&db, &sql, "cursor", 9i64).expect("set");
        assert_eq!(get_i64(&db, &sql, "cursor", -1).expect("get"), 9);
        db.execute(
            "INSERT INTO pl_triggers (trigger_id, at, num_keys, partition_sizes, status)
             VALUES (0, 5, 3, '[2,1]', 'pending')",
            [],
        )
        .expect("insert");
        let t = triggers(&db, &sql, Some("pending")).expect("triggers");
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].partition_sizes, vec![2, 1]);
        assert!(triggers(&db, &sql, Some("done")).expect("t").is_empty());
    }
}
