//! The supervisor: the one loop (Modyn's) that reads new data in timestamp
//! order, informs the trigger and the selector of it batch by batch, and at
//! each trigger has the selector build the training set, saves it as a dataset
//! and runs the training hook. Replay and live mode run the same steps.
//!
//! Steps, each ending in one commit of the state db:
//! 1. discover: list storage, read the new files, give their samples keys in
//!    (timestamp, path, index) order, raise the watermark;
//! 2. per batch of `selector_batch_size` samples after the cursor (key order):
//!    `trigger.inform(batch)` gives cut points; the selector is informed of the
//!    samples up to each cut, then `strategy.trigger(id)` builds that trigger's
//!    set, recorded `pending`; the rest of the batch is informed; the cursor
//!    moves to the batch's last key — all in ONE transaction;
//! 3. per pending trigger, in id order: save its set as dataset
//!    `<pipeline>-trigger-<id>` (an earlier save of the same trigger, done
//!    before a kill and not recorded, is removed first, so exactly one version
//!    is ever visible), run the hook, record `done` (an empty set: `skipped`,
//!    no dataset, no hook).
//!
//! Guarantees: a kill -9 anywhere loses or repeats no trigger: a batch and the
//! triggers it fired are committed together or not at all, and a pending
//! trigger is finished (saved again, hook run again) by the next run before any
//! new batch. A failing hook stops the run with an error naming the trigger and
//! leaves it pending. One process runs a pipeline at a time (a lock file).
//! `max_triggers` counts triggers finished by this run; triggers computed but
//! not finished stay pending for the next run. Every SQLite call of the loop
//! (the state db's transactions, the trigger's and the strategy's work inside
//! them) runs on tokio's blocking pool ([`crate::runtime::blocking`]), never
//! on an async worker, as the catalog's does; the state db commits with
//! `synchronous = FULL` (see `state.rs`), so a commit that makes a trigger
//! pending or done is on disk when it returns.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, TransactionBehavior, params};
use serde::{Deserialize, Serialize};

use crate::chain::Chain;
use crate::dataset::Catalog;
use crate::error::{Error, Result};
use crate::pipeline::config::{Format, PipelineConfig};
use crate::pipeline::hook::{CompletedCallback, Hook};
use crate::pipeline::sample::Sample;
use crate::pipeline::samples::{self, FeatureFn, Features};
use crate::pipeline::selector::{ScoreFn, Strategy, build_strategy};
use crate::pipeline::state::{self, SqlErr, TriggerRecord};
use crate::pipeline::trigger::{FeatureSource, Trigger, build_trigger};
use crate::runtime;
use crate::session::Session;
use crate::udfs::File;
use crate::util::lock::lock;

/// The dataset a trigger's set is saved as.
pub fn dataset_name(pipeline: &str, trigger_id: u64) -> String {
    format!("{pipeline}-trigger-{trigger_id}")
}

/// Stops a live run (or a replay) at its next consistent point.
#[derive(Clone, Debug, Default)]
pub struct StopHandle {
    stopped: Arc<AtomicBool>,
    notify: Arc<tokio::sync::Notify>,
}

impl StopHandle {
    /// A handle not yet stopped.
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks the run to stop; it returns after the step it is in.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    /// Whether [`stop`](Self::stop) was called.
    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// Sleeps for `d` or until stopped.
    async fn sleep(&self, d: std::time::Duration) {
        let notified = self.notify.notified();
        if self.is_stopped() {
            return;
        }
        let _ = tokio::time::timeout(d, notified).await;
    }
}

/// Which samples a run informs: timestamps in `[from, to]` (inclusive).
#[derive(Clone, Copy, Debug, Default)]
pub struct Range {
    /// Only samples with timestamps >= `from` (seconds since the epoch).
    pub from: Option<i64>,
    /// Only samples with timestamps <= `to`.
    pub to: Option<i64>,
}

/// The state db with the trigger and the strategy that work in its
/// transactions: what each step moves to the blocking pool.
struct Core {
    db: Connection,
    sql: SqlErr,
    trigger: Box<dyn Trigger>,
    strategy: Box<dyn Strategy>,
}

/// One running pipeline: its config, its state db, its trigger and strategy.
pub struct Supervisor {
    config: PipelineConfig,
    session: Arc<Session>,
    core: Arc<Mutex<Core>>,
    features: Option<Features>,
    hook: Hook,
    on_completed: Option<CompletedCallback>,
    // Held for as long as the supervisor lives: one run per pipeline.
    _lock: std::fs::File,
}

/// A sample being ingested: (timestamp, path, index in file, label, features).
type Ingested<'a> = (i64, &'a str, u64, i64, Option<&'a [f32]>);

impl Supervisor {
    /// Opens the pipeline's state under the session's root (creating it), checks
    /// that an existing state was made with the same data, trigger and
    /// selection config, and opens the trigger and the strategy on it.
    pub fn open(
        config: PipelineConfig,
        session: Arc<Session>,
        mut hook: Hook,
        scores: Option<Arc<dyn ScoreFn>>,
        feature_fns: &HashMap<String, FeatureFn>,
        on_completed: Option<CompletedCallback>,
    ) -> Result<Self> {
        config.check()?;
        let root = session.settings().get_root();
        let dir = state::pipeline_dir(&root, &config.name);
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(dir.display(), e))?;
        let lock = lock_run(&config.name, &dir.join("run.lock"))?;
        let (db, sql) = state::open(&config.name, &dir.join(state::DB_FILE))?;
        // The poll interval and the training hook may change between runs;
        // what decides the keys, the triggers and the sets may not.
        let mut data = config.data.clone();
        data.poll_interval = None;
        let fingerprint = format!("{:?}", (&data, &config.trigger, &config.selection));
        match state::get_text(&db, &sql, "fingerprint")? {
            Some(old) if old != fingerprint => {
                return Err(Error::Pipeline {
                    pipeline: config.name.clone(),
                    reason: format!(
                        "its state in {} was made with another data, trigger or selection \
                         config: use a new name (or remove that dir to start over)",
                        dir.display()
                    ),
                    source: None,
                });
            }
            Some(_) => {}
            None => state::set(&db, &sql, "fingerprint", fingerprint)?,
        }
        let mut trigger = build_trigger(&config.trigger)?;
        let mut strategy = build_strategy(&config.selection, scores)?;
        trigger.open(&db)?;
        strategy.open(&db)?;
        let features = match trigger.features() {
            None => None,
            Some(FeatureSource::Column(c)) if matches!(config.data.format, Format::Csv(_)) => {
                Some(Features::Column(c))
            }
            Some(FeatureSource::Column(_)) => {
                return Err(Error::Pipeline {
                    pipeline: config.name.clone(),
                    reason: "a trigger feature {column: N} needs the csv format".into(),
                    source: None,
                });
            }
            Some(FeatureSource::Udf(name)) => match feature_fns.get(&name) {
                Some(f) => Some(Features::Udf(Arc::clone(f))),
                None => {
                    let mut known: Vec<&str> = feature_fns.keys().map(String::as_str).collect();
                    known.sort_unstable();
                    return Err(Error::Pipeline {
                        pipeline: config.name.clone(),
                        reason: format!(
                            "the drift trigger's feature UDF {name:?} is not registered \
                             (Pipeline::feature_fn; registered: [{}])",
                            known.join(", ")
                        ),
                        source: None,
                    });
                }
            },
        };
        hook.pipeline = config.name.clone();
        hook.root = root;
        Ok(Self {
            config,
            session,
            core: Arc::new(Mutex::new(Core {
                db,
                sql,
                trigger,
                strategy,
            })),
            features,
            hook,
            on_completed,
            _lock: lock,
        })
    }

    /// Stores the config text (YAML) the first time, for `pipeline show` / `keys`.
    pub fn remember_config(&self, yaml: &str) -> Result<()> {
        let core = lock(&self.core);
        if state::get_text(&core.db, &core.sql, "config")?.is_none() {
            state::set(&core.db, &core.sql, "config", yaml)?;
        }
        Ok(())
    }

    /// Runs `step` on the state db (and the trigger and strategy) on tokio's
    /// blocking pool.
    ///
    /// # Cancel safety
    /// Dropping the future lets the step run to its commit or rollback.
    async fn step<T: Send + 'static>(
        &self,
        step: impl FnOnce(&mut Core) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let core = Arc::clone(&self.core);
        runtime::blocking(move || step(&mut lock(&core))).await
    }

    /// Replay: finishes pending triggers, ingests what storage holds, informs
    /// every sample in `range` (stopping at the first one after `range.to`),
    /// finishing each trigger as it fires, until the data is exhausted,
    /// `max_triggers` triggers are finished or `stop` is called.
    ///
    /// # Cancel safety
    /// Dropping the future loses nothing committed; a trigger whose hook was
    /// running stays pending and is finished by the next run.
    pub async fn replay(
        &mut self,
        range: Range,
        max_triggers: Option<u64>,
        stop: &StopHandle,
    ) -> Result<Vec<TriggerRecord>> {
        let mut done = Vec::new();
        self.finish_pending(&mut done, max_triggers, stop).await?;
        if reached(&done, max_triggers) || stop.is_stopped() {
            return Ok(done);
        }
        self.discover().await?;
        self.process(range, &mut done, max_triggers, stop).await?;
        Ok(done)
    }

    /// Live mode: the replay's steps again every `poll_interval` until `stop`
    /// (or `max_triggers`).
    ///
    /// # Cancel safety
    /// As [`replay`](Self::replay).
    pub async fn run_live(
        &mut self,
        max_triggers: Option<u64>,
        stop: &StopHandle,
    ) -> Result<Vec<TriggerRecord>> {
        let mut done = Vec::new();
        let interval = self.config.poll_interval();
        loop {
            self.finish_pending(&mut done, max_triggers, stop).await?;
            if reached(&done, max_triggers) || stop.is_stopped() {
                return Ok(done);
            }
            self.discover().await?;
            self.process(Range::default(), &mut done, max_triggers, stop)
                .await?;
            if reached(&done, max_triggers) || stop.is_stopped() {
                return Ok(done);
            }
            stop.sleep(interval).await;
        }
    }

    /// Ingests the new files (one commit); returns how many samples were added.
    pub async fn discover(&mut self) -> Result<usize> {
        let data = self.config.data.clone();
        let files = samples::list(&self.session, &data).await?;
        let (seen, watermark) = self
            .step(|c| {
                let seen: HashSet<String> = {
                    let mut stmt =
                        c.db.prepare("SELECT path FROM pl_files")
                            .map_err(|e| c.sql.err(e))?;
                    let rows = stmt
                        .query_map([], |r| r.get::<_, String>(0))
                        .map_err(|e| c.sql.err(e))?;
                    rows.collect::<std::result::Result<_, _>>()
                        .map_err(|e| c.sql.err(e))?
                };
                let watermark = state::get_i64(&c.db, &c.sql, "watermark", i64::MIN)?;
                Ok((seen, watermark))
            })
            .await?;
        let mut new = Vec::new();
        for f in files {
            if seen.contains(&f.path) {
                continue;
            }
            if samples::file_timestamp(&f)? >= watermark {
                new.push(f);
            }
        }
        if new.is_empty() {
            return Ok(0);
        }
        let read = samples::read_all(&self.session, &data, &new, self.features.clone()).await?;
        self.step(move |c| ingest(c, &new, &read, watermark)).await
    }

    /// Informs the samples after the cursor in batches, finishing the triggers
    /// each batch fires before the next batch.
    async fn process(
        &mut self,
        range: Range,
        done: &mut Vec<TriggerRecord>,
        max_triggers: Option<u64>,
        stop: &StopHandle,
    ) -> Result<()> {
        loop {
            if reached(done, max_triggers) || stop.is_stopped() {
                return Ok(());
            }
            let batch_size = self.config.data.selector_batch_size;
            let fired = self.step(move |c| next_batch(c, batch_size, range)).await?;
            match fired {
                None => return Ok(()),
                Some(0) => {}
                Some(_) => self.finish_pending(done, max_triggers, stop).await?,
            }
        }
    }

    /// Saves, trains and records the pending triggers in id order.
    async fn finish_pending(
        &mut self,
        done: &mut Vec<TriggerRecord>,
        max_triggers: Option<u64>,
        stop: &StopHandle,
    ) -> Result<()> {
        let pending = self
            .step(|c| state::triggers(&c.db, &c.sql, Some("pending")))
            .await?;
        for mut t in pending {
            if reached(done, max_triggers) || stop.is_stopped() {
                return Ok(());
            }
            let status = if t.num_keys == 0 {
                "skipped"
            } else {
                let name = dataset_name(&self.config.name, t.trigger_id);
                self.save(&t, &name).await?;
                t.dataset = Some(name);
                let (hook, record) = (self.hook.clone(), t.clone());
                let result = runtime::blocking(move || Ok(hook.run(&record))).await?;
                if let Err(err) = result {
                    let (id, msg, dataset) =
                        (t.trigger_id as i64, err.to_string(), t.dataset.clone());
                    self.step(move |c| {
                        c.db.execute(
                            "UPDATE pl_triggers SET hook = ?2, dataset = ?3 WHERE trigger_id = ?1",
                            params![id, msg, dataset],
                        )
                        .map_err(|x| c.sql.err(x))
                    })
                    .await?;
                    return Err(err);
                }
                "done"
            };
            t.status = status.to_string();
            let (id, dataset) = (t.trigger_id as i64, t.dataset.clone());
            self.step(move |c| {
                c.db.execute(
                    "UPDATE pl_triggers SET status = ?2, dataset = ?3, hook = 'ok',
                     finished = strftime('%s','now') WHERE trigger_id = ?1",
                    params![id, status, dataset],
                )
                .map_err(|x| c.sql.err(x))
            })
            .await?;
            if let Some(cb) = &self.on_completed {
                cb(&t);
            }
            done.push(t);
        }
        Ok(())
    }

    /// Saves trigger `t`'s set as dataset `name`, replacing a version an
    /// unrecorded earlier save left.
    async fn save(&mut self, t: &TriggerRecord, name: &str) -> Result<()> {
        let catalog = Catalog::open(self.session.settings().get_root()).await?;
        if catalog.get(name, None).await.is_ok() {
            catalog.remove(name, None).await?;
        }
        let with_file = matches!(self.config.data.format, Format::SingleSample(_));
        let (id, n) = (t.trigger_id, t.num_partitions);
        let rows = self
            .step(move |c| set_rows(&c.db, &c.sql, c.strategy.as_ref(), id, n, with_file))
            .await?;
        let chain = if with_file {
            Chain::from_values_in(Arc::clone(&self.session), &rows)
        } else {
            let rows: Vec<KeyRow> = rows.into_iter().map(KeyRow::from).collect();
            Chain::from_values_in(Arc::clone(&self.session), &rows)
        };
        chain.progress(false).save(name).await?;
        Ok(())
    }
}

/// Adds the new files and their samples (keys in (timestamp, path, index)
/// order) and raises the watermark, in one transaction.
fn ingest(
    c: &mut Core,
    new: &[File],
    read: &[Vec<samples::RawSample>],
    watermark: i64,
) -> Result<usize> {
    let mut samples: Vec<Ingested<'_>> = Vec::new();
    for (f, rows) in new.iter().zip(read) {
        for r in rows {
            samples.push((
                r.timestamp,
                f.path.as_str(),
                r.index,
                r.label,
                r.feature.as_deref(),
            ));
        }
    }
    samples.sort_by(|a, b| (a.0, a.1, a.2).cmp(&(b.0, b.1, b.2)));
    let sql = c.sql.clone();
    let e = |x| sql.err(x);
    let tx =
        c.db.transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(e)?;
    let mut next_key = state::get_i64(&tx, &sql, "next_key", 0)?;
    let mut top = watermark;
    {
        let mut put_file = tx
            .prepare(
                "INSERT INTO pl_files (path, source, size, etag, version, last_modified,
                 timestamp, samples) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )
            .map_err(e)?;
        for (f, rows) in new.iter().zip(read) {
            let ts = samples::file_timestamp(f)?;
            top = top.max(ts);
            put_file
                .execute(params![
                    f.path,
                    f.source,
                    f.size as i64,
                    f.etag,
                    f.version,
                    f.last_modified,
                    ts,
                    rows.len() as i64
                ])
                .map_err(e)?;
        }
        let mut put = tx
            .prepare(
                "INSERT INTO pl_samples (key, path, idx, timestamp, label, features)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )
            .map_err(e)?;
        for (ts, path, idx, label, feature) in &samples {
            let blob = feature.map(state::encode_features);
            put.execute(params![next_key, path, *idx as i64, ts, label, blob])
                .map_err(e)?;
            next_key += 1;
        }
    }
    state::set(&tx, &sql, "next_key", next_key)?;
    state::set(&tx, &sql, "watermark", top)?;
    tx.commit().map_err(e)?;
    Ok(samples.len())
}

/// One batch in one transaction; `None` when there is nothing left to inform.
fn next_batch(c: &mut Core, batch_size: usize, range: Range) -> Result<Option<usize>> {
    let sql = c.sql.clone();
    let e = |x| sql.err(x);
    let tx =
        c.db.transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(e)?;
    let cursor = state::get_i64(&tx, &sql, "cursor", -1)?;
    let rows: Vec<(i64, i64, i64, Option<Vec<u8>>)> = {
        let mut stmt = tx
            .prepare(
                "SELECT key, timestamp, label, features FROM pl_samples WHERE key > ?1
                 ORDER BY key LIMIT ?2",
            )
            .map_err(e)?;
        let rows = stmt
            .query_map(params![cursor, batch_size as i64], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })
            .map_err(e)?;
        rows.collect::<std::result::Result<_, _>>().map_err(e)?
    };
    let mut batch = Vec::with_capacity(rows.len());
    let mut last_key = cursor;
    for (key, timestamp, label, features) in rows {
        if range.to.is_some_and(|to| timestamp > to) {
            break;
        }
        last_key = key;
        if range.from.is_some_and(|from| timestamp < from) {
            continue;
        }
        batch.push(Sample {
            key: key as u64,
            timestamp,
            label,
            features: features.map(|b| state::decode_features(&b)),
        });
    }
    if last_key == cursor {
        return Ok(None);
    }
    let mut fired = 0;
    if !batch.is_empty() {
        let cuts = c.trigger.inform(&tx, &batch)?;
        let mut next_id = state::get_i64(&tx, &sql, "next_trigger", 0)? as u64;
        let mut last_ts = state::get_i64(&tx, &sql, "last_ts", i64::MIN)?;
        let mut prev = 0;
        for cut in cuts {
            let cut = cut.min(batch.len());
            if cut > prev {
                c.strategy.inform(&tx, &batch[prev..cut])?;
                last_ts = batch[cut - 1].timestamp;
                prev = cut;
            }
            let info = c.strategy.trigger(&tx, next_id)?;
            let sizes = serde_json::to_string(&info.partition_sizes)
                .map_err(|x| Error::internal(x.to_string()))?;
            tx.execute(
                "INSERT INTO pl_triggers (trigger_id, at, num_keys, partition_sizes, status)
                 VALUES (?1, ?2, ?3, ?4, 'pending')",
                params![next_id as i64, last_ts, info.num_keys as i64, sizes],
            )
            .map_err(e)?;
            next_id += 1;
            fired += 1;
        }
        if prev < batch.len() {
            c.strategy.inform(&tx, &batch[prev..])?;
        }
        if let Some(s) = batch.last() {
            last_ts = s.timestamp;
        }
        state::set(&tx, &sql, "next_trigger", next_id as i64)?;
        state::set(&tx, &sql, "last_ts", last_ts)?;
    }
    state::set(&tx, &sql, "cursor", last_key)?;
    tx.commit().map_err(e)?;
    Ok(Some(fired))
}

/// True once `max` triggers are finished.
fn reached(done: &[TriggerRecord], max: Option<u64>) -> bool {
    max.is_some_and(|m| done.len() as u64 >= m)
}

/// Takes the pipeline's run lock (without waiting).
fn lock_run(pipeline: &str, path: &std::path::Path) -> Result<std::fs::File> {
    use fs4::FileExt;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| Error::io(path.display(), e))?;
    match FileExt::try_lock(&file) {
        Ok(()) => Ok(file),
        Err(fs4::TryLockError::WouldBlock) => Err(Error::Pipeline {
            pipeline: pipeline.to_string(),
            reason: "it is running in another process".into(),
            source: None,
        }),
        Err(fs4::TryLockError::Error(e)) => Err(Error::io(path.display(), e)),
    }
}

/// A row of a saved training set with the sample's file (single_sample format).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FileRow {
    /// The sample's key (its position in ingestion order).
    pub key: u64,
    /// The file holding it, relative to the data URI.
    pub path: String,
    /// Its position in that file (0 for single_sample).
    pub index: u64,
    /// Its timestamp (seconds since the epoch).
    pub timestamp: i64,
    /// Its label.
    pub label: i64,
    /// Its weight in the set.
    pub weight: f64,
    /// The partition of the set it is in.
    pub partition: u64,
    /// The sample's file.
    pub file: File,
}

/// A row of a saved training set (csv and binary formats).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KeyRow {
    /// The sample's key (its position in ingestion order).
    pub key: u64,
    /// The file holding it, relative to the data URI.
    pub path: String,
    /// Its position in that file (0 for single_sample).
    pub index: u64,
    /// Its timestamp (seconds since the epoch).
    pub timestamp: i64,
    /// Its label.
    pub label: i64,
    /// Its weight in the set.
    pub weight: f64,
    /// The partition of the set it is in.
    pub partition: u64,
}

impl From<FileRow> for KeyRow {
    fn from(r: FileRow) -> Self {
        Self {
            key: r.key,
            path: r.path,
            index: r.index,
            timestamp: r.timestamp,
            label: r.label,
            weight: r.weight,
            partition: r.partition,
        }
    }
}

/// The rows of a trigger's set, partition by partition in the selector's
/// (shuffled) order; `file` is filled when `with_file`.
pub fn set_rows(
    db: &Connection,
    sql: &SqlErr,
    strategy: &dyn Strategy,
    trigger_id: u64,
    num_partitions: usize,
    with_file: bool,
) -> Result<Vec<FileRow>> {
    let e = |x| sql.err(x);
    let mut sample = db
        .prepare(
            "SELECT s.path, s.idx, s.timestamp, s.label, f.source, f.size, f.etag, f.version,
                    f.last_modified
             FROM pl_samples s JOIN pl_files f ON f.path = s.path WHERE s.key = ?1",
        )
        .map_err(e)?;
    let mut rows = Vec::new();
    for p in 0..num_partitions {
        for (key, weight) in strategy.partition(db, trigger_id, p)? {
            let row = sample
                .query_row(params![key as i64], |r| {
                    Ok(FileRow {
                        key,
                        path: r.get(0)?,
                        index: r.get::<_, i64>(1)? as u64,
                        timestamp: r.get(2)?,
                        label: r.get(3)?,
                        weight,
                        partition: p as u64,
                        file: if with_file {
                            File {
                                source: r.get(4)?,
                                path: r.get(0)?,
                                size: r.get::<_, i64>(5)? as u64,
                                etag: r.get(6)?,
                                version: r.get(7)?,
                                last_modified: r.get(8)?,
                                location: None,
                            }
                        } else {
                            File::default()
                        },
                    })
                })
                .map_err(e)?;
            rows.push(row);
        }
    }
    Ok(rows)
}
