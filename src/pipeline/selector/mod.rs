//! Selection strategies: informed of every sample (timestamp order) and of every
//! trigger, a strategy produces that trigger's training set, cut into partitions
//! of `maximum_keys_in_memory` keys, shuffled within each partition (seeded by
//! `seed + trigger_id`), with a weight per key. All state lives in the
//! pipeline's SQLite db (tables `sel_*`), so partitions can be read after a
//! restart and a fresh instance continues exactly.

use std::sync::Arc;

use serde::Deserialize;

use crate::pipeline::sample::Sample;

/// The selection strategy's configuration (`selection:` in the pipeline YAML).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SelectionConfig {
    pub strategy: StrategyKind,
    /// Keys per partition of a trigger's set.
    pub maximum_keys_in_memory: usize,
    /// None: all data so far; 0: data since the last trigger; k: data of this
    /// and the k previous triggers.
    #[serde(default)]
    pub tail_triggers: Option<u64>,
    /// Keys per trigger's set.
    #[serde(default)]
    pub limit: Option<u64>,
    /// How `limit` picks keys (default `last`).
    #[serde(default)]
    pub limit_reset: Option<LimitReset>,
    /// Seed of every random choice (default 0).
    #[serde(default)]
    pub seed: Option<u64>,
    /// freshness: share of never-used samples in a trigger's set, in (0, 1].
    #[serde(default)]
    pub unused_ratio: Option<f64>,
    /// coreset: the candidates the score is computed on.
    #[serde(default)]
    pub presampling: Option<Presampling>,
    /// coreset: a built-in score (`recency`, `label_rarity`); a Rust
    /// [`ScoreFn`] given to [`build_strategy`] takes its place.
    #[serde(default)]
    pub score: Option<String>,
    /// coreset: keys selected at each trigger.
    #[serde(default)]
    pub k: Option<u64>,
    /// coreset: how the k keys are picked (default `top_k`).
    #[serde(default)]
    pub sampling: Option<CoresetSampling>,
    /// coreset: triggers that use the presampled set as is.
    #[serde(default)]
    pub warmup_triggers: Option<u64>,
}

/// The strategies.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum StrategyKind {
    NewData,
    Freshness,
    LabelBalanced,
    Coreset,
}

/// How a `limit` picks keys among more candidates.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum LimitReset {
    /// The newest.
    Last,
    /// Uniformly at random (seeded).
    Uniform,
}

/// coreset's presampling.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Presampling {
    pub strategy: PresamplingKind,
    /// Share of the candidates kept, in (0, 1].
    pub ratio: f64,
}

/// coreset's presampling kinds.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum PresamplingKind {
    Random,
    LabelBalanced,
}

/// coreset's offline selection.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum CoresetSampling {
    /// The k best scores, weight 1.
    TopK,
    /// k keys drawn with probability proportional to score, weight 1/(n·p).
    Proportional,
}

/// A trigger's training set, as built.
#[derive(Clone, Debug, PartialEq)]
pub struct TriggerInfo {
    pub trigger_id: u64,
    pub num_keys: u64,
    pub partition_sizes: Vec<usize>,
}

/// coreset's scoring function over candidates (higher = more useful).
pub trait ScoreFn: Send + Sync {
    fn score(&self, candidates: &[Sample]) -> crate::Result<Vec<f64>>;
}

/// A selection strategy.
pub trait Strategy: Send {
    /// Creates the tables if missing and loads the state, as [`crate::pipeline::trigger::Trigger::open`].
    fn open(&mut self, db: &rusqlite::Connection) -> crate::Result<()>;
    /// Informs the strategy of the next batch (timestamp order).
    fn inform(&mut self, db: &rusqlite::Connection, batch: &[Sample]) -> crate::Result<()>;
    /// The trigger's training set: selected, cut into partitions of
    /// maximum_keys_in_memory keys, shuffled within each partition (seeded by
    /// seed + trigger_id), a weight per key, persisted in `db` (so partition()
    /// works after a restart). Memory bounded by maximum_keys_in_memory, not by
    /// the data.
    fn trigger(&mut self, db: &rusqlite::Connection, trigger_id: u64)
    -> crate::Result<TriggerInfo>;
    /// One partition of a built trigger's set: (key, weight) in training order.
    fn partition(
        &self,
        db: &rusqlite::Connection,
        trigger_id: u64,
        partition: usize,
    ) -> crate::Result<Vec<(u64, f64)>>;
}

/// Builds the strategy a config describes, validating it.
pub fn build_strategy(
    cfg: &SelectionConfig,
    scores: Option<Arc<dyn ScoreFn>>,
) -> crate::Result<Box<dyn Strategy>> {
    let _ = scores;
    Err(crate::Error::Setting {
        name: "selection.strategy".into(),
        value: format!("{:?}", cfg.strategy),
        reason: "is not implemented yet".into(),
    })
}
