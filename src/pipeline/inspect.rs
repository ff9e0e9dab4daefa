//! A pipeline's recorded state, read without running it: the pipelines under
//! a root with their counts, one pipeline's stored config and triggers, and
//! the keys of one trigger's training set (what `udfchain pipeline ls|show|keys`
//! print).
//!
//! Guarantees: only reads the state dbs, opened read-only (nothing is created
//! or synced, and a running supervisor's writes never wait on a reader; a name
//! that does not exist is an [`Error::Pipeline`] naming the root and the
//! closest pipeline name); a trigger's keys come in the set's (shuffled) order,
//! partition by partition, as the training loop reads them.

use std::path::Path;

use crate::error::{Error, Result};
use crate::pipeline::config::{Format, PipelineConfig};
use crate::pipeline::selector::build_strategy;
use crate::pipeline::state::{self, TriggerRecord};
use crate::pipeline::supervisor::{FileRow, set_rows};

/// One pipeline under a root, as `udfchain pipeline ls` lists it.
#[derive(Clone, Debug, PartialEq)]
pub struct PipelineSummary {
    /// The pipeline's name.
    pub name: String,
    /// Triggers recorded as done or skipped.
    pub finished: usize,
    /// Triggers recorded but not finished (a run was stopped in one).
    pub pending: usize,
    /// Samples read from storage so far.
    pub samples: i64,
}

/// Every pipeline under `root`, by name.
pub fn pipelines(root: &Path) -> Result<Vec<PipelineSummary>> {
    let mut out = Vec::new();
    for name in state::pipeline_names(root)? {
        let path = state::pipeline_dir(root, &name).join(state::DB_FILE);
        let (db, sql) = state::open_read(&name, &path)?;
        let triggers = state::triggers(&db, &sql, None)?;
        let finished = triggers.iter().filter(|t| t.status != "pending").count();
        let samples = state::get_i64(&db, &sql, "next_key", 0)?;
        out.push(PipelineSummary {
            pending: triggers.len() - finished,
            name,
            finished,
            samples,
        });
    }
    Ok(out)
}

/// A pipeline's config as stored by its last run, and its triggers so far.
#[derive(Clone, Debug)]
pub struct StoredPipeline {
    /// The YAML text of the config.
    pub yaml: String,
    /// The triggers in id order.
    pub triggers: Vec<TriggerRecord>,
}

/// The stored config and triggers of pipeline `name` under `root`.
pub fn stored(root: &Path, name: &str) -> Result<StoredPipeline> {
    let (db, sql, yaml, _) = open_existing(root, name)?;
    let triggers = state::triggers(&db, &sql, None)?;
    Ok(StoredPipeline { yaml, triggers })
}

/// The rows of trigger `trigger`'s training set (only partition `partition`
/// when given), in the order the set is read. The `file` of a row is filled
/// for the `single_sample` format only.
pub fn trigger_keys(
    root: &Path,
    name: &str,
    trigger: u64,
    partition: Option<usize>,
) -> Result<Vec<FileRow>> {
    let (db, sql, _, config) = open_existing(root, name)?;
    let t = state::triggers(&db, &sql, None)?
        .into_iter()
        .find(|t| t.trigger_id == trigger)
        .ok_or_else(|| Error::Pipeline {
            pipeline: name.to_string(),
            reason: format!("no trigger {trigger}"),
            source: None,
        })?;
    if let Some(p) = partition
        && p >= t.num_partitions
    {
        return Err(Error::Pipeline {
            pipeline: name.to_string(),
            reason: format!(
                "trigger {trigger} has {} partition(s), no partition {p}",
                t.num_partitions
            ),
            source: None,
        });
    }
    let mut strategy = build_strategy(&config.selection, None)?;
    strategy.open(&db)?;
    let with_file = matches!(config.data.format, Format::SingleSample(_));
    let rows = set_rows(
        &db,
        &sql,
        strategy.as_ref(),
        trigger,
        t.num_partitions,
        with_file,
    )?;
    Ok(rows
        .into_iter()
        .filter(|r| partition.is_none_or(|p| r.partition == p as u64))
        .collect())
}

/// The state db, stored YAML and config of an existing pipeline.
fn open_existing(
    root: &Path,
    name: &str,
) -> Result<(rusqlite::Connection, state::SqlErr, String, PipelineConfig)> {
    let path = state::pipeline_dir(root, name).join(state::DB_FILE);
    if !path.is_file() {
        let known = state::pipeline_names(root)?;
        let hint = crate::util::closest(name, known.iter().map(String::as_str))
            .map(|c| format!(" (did you mean {c}?)"))
            .unwrap_or_default();
        return Err(Error::Pipeline {
            pipeline: name.to_string(),
            reason: format!("no such pipeline under {}{hint}", root.display()),
            source: None,
        });
    }
    let (db, sql) = state::open_read(name, &path)?;
    let yaml = state::get_text(&db, &sql, "config")?.ok_or_else(|| Error::Pipeline {
        pipeline: name.to_string(),
        reason: "its state holds no config (it never ran)".into(),
        source: None,
    })?;
    let config = PipelineConfig::from_yaml(&yaml, "the stored config")?;
    Ok((db, sql, yaml, config))
}
