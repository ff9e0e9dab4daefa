//! The selector's tables: every informed sample in `sel_samples` (rowid = the
//! order informed, which is timestamp order, so the data of a trigger interval
//! or of the last k intervals is one rowid range and no index is needed), one
//! row per built trigger in `sel_triggers` (its interval's end), and each
//! trigger's partitions in `sel_partitions` (keys and weights packed as
//! little-endian blobs, so building a set of 10M keys writes ~80 MB, not 10M
//! rows). `sel_stage` holds a trigger's intermediate picks (freshness's newly
//! used samples, coreset's scored candidates) and is empty between calls.
//! Nothing is cached in memory: every call reads what it needs.

use rusqlite::{Connection, OptionalExtension, params};

use super::rng::Rng;
use super::{TriggerInfo, db_error};

/// Rows per multi-row INSERT of `inform`.
const INSERT_CHUNK: usize = 64;

pub(crate) fn open(db: &Connection) -> crate::Result<()> {
    db.execute_batch(
        "CREATE TABLE IF NOT EXISTS sel_samples (
             seq INTEGER PRIMARY KEY, key INTEGER NOT NULL, ts INTEGER NOT NULL,
             label INTEGER NOT NULL, used INTEGER NOT NULL DEFAULT 0);
         CREATE TABLE IF NOT EXISTS sel_triggers (
             ordinal INTEGER PRIMARY KEY, trigger_id INTEGER NOT NULL UNIQUE,
             end_seq INTEGER NOT NULL, num_keys INTEGER NOT NULL, partition_sizes TEXT NOT NULL);
         CREATE TABLE IF NOT EXISTS sel_partitions (
             trigger_id INTEGER NOT NULL, partition INTEGER NOT NULL,
             keys BLOB NOT NULL, weights BLOB, PRIMARY KEY (trigger_id, partition));
         CREATE TABLE IF NOT EXISTS sel_stage (
             seq INTEGER PRIMARY KEY, key INTEGER NOT NULL, ts INTEGER, label INTEGER,
             score REAL, rank REAL);",
    )
    .map_err(|e| db_error(db, e))
}

/// The next sample's seq (= samples informed so far).
pub(crate) fn next_seq(db: &Connection) -> crate::Result<i64> {
    db.prepare_cached("SELECT coalesce(max(seq) + 1, 0) FROM sel_samples")
        .and_then(|mut s| s.query_row([], |r| r.get(0)))
        .map_err(|e| db_error(db, e))
}

/// Appends a batch (batched prepared inserts inside the caller's transaction).
pub(crate) fn insert(
    db: &Connection,
    batch: &[crate::pipeline::sample::Sample],
) -> crate::Result<()> {
    let mut seq = next_seq(db)?;
    let mut chunks = batch.chunks_exact(INSERT_CHUNK);
    if batch.len() >= INSERT_CHUNK {
        let sql = format!(
            "INSERT INTO sel_samples (seq, key, ts, label) VALUES {}",
            vec!["(?,?,?,?)"; INSERT_CHUNK].join(",")
        );
        let mut stmt = db.prepare_cached(&sql).map_err(|e| db_error(db, e))?;
        for chunk in &mut chunks {
            for (i, s) in chunk.iter().enumerate() {
                let at = i * 4 + 1;
                let bind = (|| {
                    stmt.raw_bind_parameter(at, seq + i as i64)?;
                    stmt.raw_bind_parameter(at + 1, s.key as i64)?;
                    stmt.raw_bind_parameter(at + 2, s.timestamp)?;
                    stmt.raw_bind_parameter(at + 3, s.label)
                })();
                bind.map_err(|e| db_error(db, e))?;
            }
            stmt.raw_execute().map_err(|e| db_error(db, e))?;
            seq += INSERT_CHUNK as i64;
        }
    }
    let mut one = db
        .prepare_cached("INSERT INTO sel_samples (seq, key, ts, label) VALUES (?1, ?2, ?3, ?4)")
        .map_err(|e| db_error(db, e))?;
    for s in chunks.remainder() {
        one.execute(params![seq, s.key as i64, s.timestamp, s.label])
            .map_err(|e| db_error(db, e))?;
        seq += 1;
    }
    Ok(())
}

/// Triggers built so far.
pub(crate) fn triggers_done(db: &Connection) -> crate::Result<u64> {
    db.prepare_cached("SELECT count(*) FROM sel_triggers")
        .and_then(|mut s| s.query_row([], |r| r.get::<_, i64>(0)))
        .map(|n| n as u64)
        .map_err(|e| db_error(db, e))
}

/// The candidates of the next trigger as a seq range [lo, hi): all data so far
/// (`tail` None), since the last trigger (0), or since the trigger k before
/// the last (k).
pub(crate) fn candidates(db: &Connection, tail: Option<u64>) -> crate::Result<(i64, i64)> {
    let hi = next_seq(db)?;
    let Some(k) = tail else { return Ok((0, hi)) };
    let done = triggers_done(db)? as i64;
    // The interval of the trigger being built starts at the end of ordinal done-1.
    let first = done - 1 - k.min(i64::MAX as u64 / 2) as i64;
    if first < 0 {
        return Ok((0, hi));
    }
    let lo = db
        .prepare_cached("SELECT end_seq FROM sel_triggers WHERE ordinal = ?1")
        .and_then(|mut s| s.query_row([first], |r| r.get(0)))
        .map_err(|e| db_error(db, e))?;
    Ok((lo, hi))
}

/// Fails if `trigger_id` was built already.
pub(crate) fn check_new(db: &Connection, trigger_id: u64) -> crate::Result<()> {
    let seen: Option<i64> = db
        .prepare_cached("SELECT ordinal FROM sel_triggers WHERE trigger_id = ?1")
        .and_then(|mut s| s.query_row([trigger_id as i64], |r| r.get(0)).optional())
        .map_err(|e| db_error(db, e))?;
    match seen {
        Some(_) => Err(crate::Error::internal(format!(
            "trigger {trigger_id} was built already; trigger ids must be new"
        ))),
        None => Ok(()),
    }
}

/// Cuts a stream of (key, weight) into partitions of `max` keys, shuffles each
/// (seeded by seed + trigger_id and the partition's index) and stores them.
/// Holds at most `max` keys.
pub(crate) struct PartitionWriter<'a> {
    db: &'a Connection,
    trigger_id: u64,
    seed: u64,
    max: usize,
    keys: Vec<u64>,
    weights: Vec<f64>,
    sizes: Vec<usize>,
}

impl<'a> PartitionWriter<'a> {
    pub(crate) fn new(db: &'a Connection, trigger_id: u64, seed: u64, max: usize) -> Self {
        Self {
            db,
            trigger_id,
            seed,
            max,
            keys: Vec::with_capacity(max.min(1 << 20)),
            weights: Vec::with_capacity(max.min(1 << 20)),
            sizes: Vec::new(),
        }
    }

    pub(crate) fn push(&mut self, key: u64, weight: f64) -> crate::Result<()> {
        self.keys.push(key);
        self.weights.push(weight);
        if self.keys.len() >= self.max {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> crate::Result<()> {
        if self.keys.is_empty() {
            return Ok(());
        }
        let part = self.sizes.len();
        let mut rng = Rng::new(self.seed.wrapping_add(self.trigger_id)).fork(part as u64);
        // Fisher–Yates over both vectors together.
        for i in (1..self.keys.len()).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            self.keys.swap(i, j);
            self.weights.swap(i, j);
        }
        let keys: Vec<u8> = self.keys.iter().flat_map(|k| k.to_le_bytes()).collect();
        let weights: Option<Vec<u8>> = (!self.weights.iter().all(|w| *w == 1.0))
            .then(|| self.weights.iter().flat_map(|w| w.to_le_bytes()).collect());
        self.db
            .prepare_cached("INSERT INTO sel_partitions (trigger_id, partition, keys, weights) VALUES (?1, ?2, ?3, ?4)")
            .and_then(|mut s| s.execute(params![self.trigger_id as i64, part as i64, keys, weights]))
            .map_err(|e| db_error(self.db, e))?;
        self.sizes.push(self.keys.len());
        self.keys.clear();
        self.weights.clear();
        Ok(())
    }

    /// Stores the last partition and the trigger's row; `end_seq` ends its interval.
    pub(crate) fn finish(mut self, end_seq: i64) -> crate::Result<TriggerInfo> {
        self.flush()?;
        let ordinal = triggers_done(self.db)? as i64;
        let num_keys: usize = self.sizes.iter().sum();
        let sizes = serde_json::to_string(&self.sizes)
            .map_err(|e| crate::Error::internal(e.to_string()))?;
        self.db
            .prepare_cached("INSERT INTO sel_triggers (ordinal, trigger_id, end_seq, num_keys, partition_sizes) VALUES (?1, ?2, ?3, ?4, ?5)")
            .and_then(|mut s| s.execute(params![ordinal, self.trigger_id as i64, end_seq, num_keys as i64, sizes]))
            .map_err(|e| db_error(self.db, e))?;
        Ok(TriggerInfo {
            trigger_id: self.trigger_id,
            num_keys: num_keys as u64,
            partition_sizes: self.sizes,
        })
    }
}

/// A built trigger's partition: (key, weight) in training order.
pub(crate) fn partition(
    db: &Connection,
    trigger_id: u64,
    partition: usize,
) -> crate::Result<Vec<(u64, f64)>> {
    let row: Option<(Vec<u8>, Option<Vec<u8>>)> = db
        .prepare_cached(
            "SELECT keys, weights FROM sel_partitions WHERE trigger_id = ?1 AND partition = ?2",
        )
        .and_then(|mut s| {
            s.query_row(params![trigger_id as i64, partition as i64], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()
        })
        .map_err(|e| db_error(db, e))?;
    let Some((keys, weights)) = row else {
        let sizes: Option<String> = db
            .prepare_cached("SELECT partition_sizes FROM sel_triggers WHERE trigger_id = ?1")
            .and_then(|mut s| s.query_row([trigger_id as i64], |r| r.get(0)).optional())
            .map_err(|e| db_error(db, e))?;
        return Err(crate::Error::Dataset(match sizes {
            None => format!("trigger {trigger_id} has no training set (not built)"),
            Some(s) => {
                format!("trigger {trigger_id} has no partition {partition} (partition sizes {s})")
            }
        }));
    };
    let word = |c: &[u8]| <[u8; 8]>::try_from(c).unwrap_or_default();
    let keys = keys.chunks_exact(8).map(|c| u64::from_le_bytes(word(c)));
    Ok(match weights {
        None => keys.map(|k| (k, 1.0)).collect(),
        Some(w) => keys
            .zip(w.chunks_exact(8).map(|c| f64::from_le_bytes(word(c))))
            .collect(),
    })
}

/// One candidate row.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Row {
    pub seq: i64,
    pub key: u64,
    pub ts: i64,
    pub label: i64,
    pub used: bool,
}

/// Streams the samples with seq in [lo, hi), in seq order.
pub(crate) fn scan(
    db: &Connection,
    (lo, hi): (i64, i64),
    mut f: impl FnMut(Row) -> crate::Result<()>,
) -> crate::Result<()> {
    let mut stmt = db
        .prepare_cached("SELECT seq, key, ts, label, used FROM sel_samples WHERE seq >= ?1 AND seq < ?2 ORDER BY seq")
        .map_err(|e| db_error(db, e))?;
    let mut rows = stmt.query(params![lo, hi]).map_err(|e| db_error(db, e))?;
    while let Some(r) = rows.next().map_err(|e| db_error(db, e))? {
        let row = (|| {
            Ok(Row {
                seq: r.get(0)?,
                key: r.get::<_, i64>(1)? as u64,
                ts: r.get(2)?,
                label: r.get(3)?,
                used: r.get::<_, i64>(4)? != 0,
            })
        })()
        .map_err(|e| db_error(db, e))?;
        f(row)?;
    }
    Ok(())
}

/// Streams only the keys with seq in [lo, hi) (the cheapest scan, for new_data).
pub(crate) fn scan_keys(
    db: &Connection,
    (lo, hi): (i64, i64),
    mut f: impl FnMut(u64) -> crate::Result<()>,
) -> crate::Result<()> {
    let mut stmt = db
        .prepare_cached("SELECT key FROM sel_samples WHERE seq >= ?1 AND seq < ?2 ORDER BY seq")
        .map_err(|e| db_error(db, e))?;
    let mut rows = stmt.query(params![lo, hi]).map_err(|e| db_error(db, e))?;
    while let Some(r) = rows.next().map_err(|e| db_error(db, e))? {
        f(r.get::<_, i64>(0).map_err(|e| db_error(db, e))? as u64)?;
    }
    Ok(())
}
