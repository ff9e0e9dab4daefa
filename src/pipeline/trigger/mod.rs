//! Trigger policies: where, in the stream of samples (timestamp order), training
//! starts. A trigger answers each batch with cut points; all its state lives in
//! the pipeline's SQLite db (tables `trig_*`), so a fresh instance opened over
//! the same db continues exactly where the last one stopped.

use serde::Deserialize;

use crate::pipeline::sample::Sample;

/// A trigger as configured (`trigger:` in the pipeline YAML).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum TriggerConfig {
    /// Every `num_samples` samples, across batch boundaries.
    Amount { num_samples: u64 },
    /// Every `every` of sample time ("30s", "5m", "2h", "1d", "1w"); the first
    /// boundary is the first sample's timestamp + `every`.
    Time { every: String },
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
    Err(crate::Error::Setting {
        name: "trigger".into(),
        value: format!("{cfg:?}"),
        reason: "is not implemented yet".into(),
    })
}
