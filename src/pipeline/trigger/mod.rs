//! Trigger policies: where, in the stream of samples (timestamp order), training
//! starts. A trigger answers each batch with cut points; all its state lives in
//! the pipeline's SQLite db (tables `trig_*`), so a fresh instance opened over
//! the same db continues exactly where the last one stopped.

mod amount;
mod distance;
mod drift;
mod time;

pub use amount::AmountTrigger;
pub use drift::DriftTrigger;
pub use time::{TimeTrigger, parse_every};

use rusqlite::OptionalExtension;
use serde::Deserialize;

use crate::pipeline::sample::Sample;

/// A trigger as configured (`trigger:` in the pipeline YAML).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum TriggerConfig {
    /// Every `num_samples` samples, across batch boundaries.
    Amount {
        /// Samples per trigger.
        num_samples: u64,
    },
    /// Every `every` of sample time ("30s", "5m", "2h", "1d", "1w"); the first
    /// boundary is the first sample's timestamp + `every`.
    Time {
        /// The interval of sample time.
        every: String,
    },
    /// A distance between a reference window and the current window.
    Drift(DriftConfig),
}

/// The drift trigger's configuration.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DriftConfig {
    /// Samples in the reference window: the last `reference_size` samples up to
    /// the last trigger.
    pub reference_size: usize,
    /// Samples in the current window; the distance is evaluated every
    /// `current_size` samples, over the last `current_size` samples.
    pub current_size: usize,
    /// The distance.
    pub metric: DriftMetric,
    /// The trigger fires when the distance is above this.
    pub threshold: f64,
    /// Where the features come from.
    pub feature: FeatureSource,
    /// MMD's Gaussian kernel bandwidth; omitted: the median heuristic.
    #[serde(default)]
    pub bandwidth: Option<f64>,
}

/// The drift distance.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum DriftMetric {
    /// Two-sample Kolmogorov–Smirnov statistic (largest over the feature's dimensions).
    Ks,
    /// Squared maximum mean discrepancy with a Gaussian kernel.
    Mmd,
}

/// Which features the supervisor fills into [`Sample::features`].
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FeatureSource {
    /// A numeric column of the sample's record (counted from 0): one value.
    Column(usize),
    /// The embedding a UDF of that name computes from the sample.
    Udf(String),
}

/// A trigger policy.
pub trait Trigger: Send {
    /// Creates this trigger's tables if missing and loads its state (all state
    /// lives in `db`; a fresh instance over the same db continues exactly).
    fn open(&mut self, db: &rusqlite::Connection) -> crate::Result<()>;
    /// Informs the trigger of the next batch (timestamp order). Returns cut
    /// points, ascending (repeats allowed: several time boundaries inside one
    /// gap each fire): `c` in `0..=batch.len()` means a trigger fires after
    /// `batch[..c]` (c = 0: before this batch's first sample). State changes are
    /// written through `db` (the supervisor wraps calls in its transaction).
    fn inform(&mut self, db: &rusqlite::Connection, batch: &[Sample]) -> crate::Result<Vec<usize>>;
    /// Which features the supervisor must fill into `Sample::features` (None
    /// for amount/time).
    fn features(&self) -> Option<FeatureSource>;
}

/// Builds the trigger a config describes, validating it (`every` parses,
/// sizes > 0, ...).
pub fn build_trigger(cfg: &TriggerConfig) -> crate::Result<Box<dyn Trigger>> {
    Ok(match cfg {
        TriggerConfig::Amount { num_samples } => Box::new(AmountTrigger::new(*num_samples)?),
        TriggerConfig::Time { every } => Box::new(TimeTrigger::new(parse_every(every)?)),
        TriggerConfig::Drift(d) => Box::new(DriftTrigger::new(d.clone())?),
    })
}

/// A SQLite error on the pipeline's state db, with the db's path.
pub(crate) fn db_error(db: &rusqlite::Connection, e: rusqlite::Error) -> crate::Error {
    crate::Error::Catalog {
        path: db
            .path()
            .filter(|p| !p.is_empty())
            .unwrap_or("pipeline state (in memory)")
            .to_string(),
        source: std::sync::Arc::new(e),
    }
}

/// A config value that is not accepted.
pub(crate) fn bad_setting(name: &str, value: impl std::fmt::Display, reason: &str) -> crate::Error {
    crate::Error::Setting {
        name: name.to_string(),
        value: value.to_string(),
        reason: reason.to_string(),
    }
}

/// The triggers' small state: one integer per name in `trig_state`.
pub(crate) fn open_state(db: &rusqlite::Connection) -> crate::Result<()> {
    db.execute_batch(
        "CREATE TABLE IF NOT EXISTS trig_state (name TEXT PRIMARY KEY, value INTEGER NOT NULL)",
    )
    .map_err(|e| db_error(db, e))
}

pub(crate) fn get_state(db: &rusqlite::Connection, name: &str) -> crate::Result<Option<i64>> {
    db.prepare_cached("SELECT value FROM trig_state WHERE name = ?1")
        .and_then(|mut s| s.query_row([name], |r| r.get(0)).optional())
        .map_err(|e| db_error(db, e))
}

pub(crate) fn set_state(db: &rusqlite::Connection, name: &str, value: i64) -> crate::Result<()> {
    db.prepare_cached("INSERT INTO trig_state (name, value) VALUES (?1, ?2) ON CONFLICT (name) DO UPDATE SET value = excluded.value")
        .and_then(|mut s| s.execute(rusqlite::params![name, value]))
        .map(|_| ())
        .map_err(|e| db_error(db, e))
}

#[cfg(test)]
pub(crate) mod test_util {
    use super::*;

    pub fn db() -> rusqlite::Connection {
        rusqlite::Connection::open_in_memory().expect("in-memory db")
    }

    pub fn at(timestamps: &[i64]) -> Vec<Sample> {
        timestamps
            .iter()
            .enumerate()
            .map(|(i, &t)| Sample {
                key: i as u64,
                timestamp: t,
                label: 0,
                features: None,
            })
            .collect()
    }

    pub fn with_features(values: &[f32]) -> Vec<Sample> {
        values
            .iter()
            .enumerate()
            .map(|(i, &v)| Sample {
                key: i as u64,
                timestamp: i as i64,
                label: 0,
                features: Some(vec![v].into()),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_deserialize_and_unknown_keys_are_rejected() {
        let parse = |s: &str| serde_json::from_str::<TriggerConfig>(s);
        assert_eq!(
            parse(r#"{"amount": {"num_samples": 100}}"#).expect("amount"),
            TriggerConfig::Amount { num_samples: 100 }
        );
        assert_eq!(
            parse(r#"{"time": {"every": "1d"}}"#).expect("time"),
            TriggerConfig::Time { every: "1d".into() }
        );
        let drift = parse(
            r#"{"drift": {"reference_size": 500, "current_size": 100, "metric": "mmd",
                "threshold": 0.2, "feature": {"udf": "embed"}, "bandwidth": 2.0}}"#,
        )
        .expect("drift");
        let TriggerConfig::Drift(d) = &drift else {
            panic!("{drift:?}")
        };
        assert_eq!(
            (d.metric, &d.feature, d.bandwidth),
            (
                DriftMetric::Mmd,
                &FeatureSource::Udf("embed".into()),
                Some(2.0)
            )
        );
        let t = build_trigger(&drift).expect("builds");
        assert_eq!(t.features(), Some(FeatureSource::Udf("embed".into())));
        assert!(parse(r#"{"amount": {"num_samples": 100, "every": "1d"}}"#).is_err());
        assert!(parse(r#"{"drift": {"reference_size": 5, "current_size": 5, "metric": "ks", "threshold": 0.2, "feature": {"column": 1}, "windw": 3}}"#).is_err());
        assert!(parse(r#"{"count": {"n": 1}}"#).is_err());
        assert!(build_trigger(&TriggerConfig::Time { every: "1y".into() }).is_err());
        assert!(build_trigger(&TriggerConfig::Amount { num_samples: 0 }).is_err());
    }
}
