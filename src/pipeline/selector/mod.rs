//! Selection strategies: informed of every sample (timestamp order) and of every
//! trigger, a strategy produces that trigger's training set, cut into partitions
//! of `maximum_keys_in_memory` keys, shuffled within each partition (seeded by
//! `seed + trigger_id`), with a weight per key. All state lives in the
//! pipeline's SQLite db (tables `sel_*`), so partitions can be read after a
//! restart and a fresh instance continues exactly.

mod coreset;
mod freshness;
mod label_balanced;
mod new_data;
mod rng;
mod store;

pub use coreset::CoresetStrategy;
pub use freshness::FreshnessStrategy;
pub use label_balanced::LabelBalancedStrategy;
pub use new_data::NewDataStrategy;

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;

use crate::pipeline::sample::Sample;
use crate::pipeline::trigger::{bad_setting, db_error};

/// The selection strategy's configuration (`selection:` in the pipeline YAML).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SelectionConfig {
    /// The strategy.
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
    /// The samples since the last trigger.
    NewData,
    /// The newest samples, older ones as space allows.
    Freshness,
    /// As many samples of each label as the limit allows.
    LabelBalanced,
    /// The best-scored samples (see [`ScoreFn`]).
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
    /// How the candidates are drawn.
    pub strategy: PresamplingKind,
    /// Share of the candidates kept, in (0, 1].
    pub ratio: f64,
}

/// coreset's presampling kinds.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum PresamplingKind {
    /// Uniformly at random.
    Random,
    /// The same number per label.
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
    /// The trigger's id.
    pub trigger_id: u64,
    /// Keys in the set.
    pub num_keys: u64,
    /// Keys per partition.
    pub partition_sizes: Vec<usize>,
}

/// coreset's scoring function over candidates (higher = more useful).
pub trait ScoreFn: Send + Sync {
    /// One score per candidate, higher is better.
    fn score(&self, candidates: &[Sample]) -> crate::Result<Vec<f64>>;
}

/// A selection strategy.
pub trait Strategy: Send {
    /// Creates the tables if missing and loads the state, as
    /// [`crate::pipeline::trigger::Trigger::open`]. Every strategy keeps its
    /// samples and built partitions in the shared `sel_*` tables of `store`.
    fn open(&mut self, db: &rusqlite::Connection) -> crate::Result<()> {
        store::open(db)
    }
    /// Informs the strategy of the next batch (timestamp order).
    fn inform(&mut self, db: &rusqlite::Connection, batch: &[Sample]) -> crate::Result<()> {
        store::insert(db, batch)
    }
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
    ) -> crate::Result<Vec<(u64, f64)>> {
        store::partition(db, trigger_id, partition)
    }
}

/// Builds the strategy a config describes, validating it: fields that do not
/// apply to the strategy are rejected, so a typo'd intent is not silently ignored.
pub fn build_strategy(
    cfg: &SelectionConfig,
    scores: Option<Arc<dyn ScoreFn>>,
) -> crate::Result<Box<dyn Strategy>> {
    use StrategyKind::*;
    let strategy = match cfg.strategy {
        NewData => "new_data",
        Freshness => "freshness",
        LabelBalanced => "label_balanced",
        Coreset => "coreset",
    };
    let only = |field: &str, set: bool, allowed: &[StrategyKind]| {
        if set && !allowed.contains(&cfg.strategy) {
            return Err(bad_setting(
                &format!("selection.{field}"),
                "(set)",
                &format!("does not apply to strategy {strategy}"),
            ));
        }
        Ok(())
    };
    if cfg.maximum_keys_in_memory == 0 {
        return Err(bad_setting(
            "selection.maximum_keys_in_memory",
            0,
            "must be at least 1",
        ));
    }
    if cfg.limit == Some(0) {
        return Err(bad_setting(
            "selection.limit",
            0,
            "must be at least 1 (omit it for no limit)",
        ));
    }
    only(
        "limit",
        cfg.limit.is_some(),
        &[NewData, Freshness, LabelBalanced],
    )?;
    only("limit_reset", cfg.limit_reset.is_some(), &[NewData])?;
    only("unused_ratio", cfg.unused_ratio.is_some(), &[Freshness])?;
    for (field, set) in [
        ("presampling", cfg.presampling.is_some()),
        ("score", cfg.score.is_some()),
        ("k", cfg.k.is_some()),
        ("sampling", cfg.sampling.is_some()),
        ("warmup_triggers", cfg.warmup_triggers.is_some()),
    ] {
        only(field, set, &[Coreset])?;
    }
    Ok(match cfg.strategy {
        NewData => Box::new(NewDataStrategy::new(cfg.clone())),
        Freshness => Box::new(FreshnessStrategy::new(cfg.clone())?),
        LabelBalanced => Box::new(LabelBalancedStrategy::new(cfg.clone())?),
        Coreset => Box::new(CoresetStrategy::new(cfg.clone(), scores)?),
    })
}

/// A ratio in (0, 1].
fn check_ratio(name: &str, r: f64) -> crate::Result<f64> {
    if r.is_finite() && r > 0.0 && r <= 1.0 {
        Ok(r)
    } else {
        Err(bad_setting(name, r, "must be in (0, 1]"))
    }
}

/// Shares `limit` keys equally between labels (as GDumb's class-balanced
/// memory): a label with fewer samples than its share keeps all of them and the
/// rest is shared again among the others; when the shares do not divide evenly
/// the labels with the smallest values get one more. `counts`: samples per label.
pub fn balanced_quotas(counts: &BTreeMap<i64, u64>, limit: u64) -> BTreeMap<i64, u64> {
    let mut by_count: Vec<(i64, u64)> = counts.iter().map(|(l, c)| (*l, *c)).collect();
    by_count.sort_by_key(|(l, c)| (*c, *l));
    let mut quotas = BTreeMap::new();
    let mut remaining = limit;
    let mut i = 0;
    while i < by_count.len() {
        let left = (by_count.len() - i) as u64;
        let share = remaining / left;
        let (label, count) = by_count[i];
        if count <= share {
            quotas.insert(label, count);
            remaining -= count;
            i += 1;
            continue;
        }
        // Every label left has more than its share: equal shares, the remainder
        // to the smallest label values.
        let mut rest: Vec<(i64, u64)> = by_count[i..].to_vec();
        rest.sort_by_key(|(l, _)| *l);
        let extra = remaining % left;
        for (j, (label, _)) in rest.into_iter().enumerate() {
            quotas.insert(label, share + u64::from((j as u64) < extra));
        }
        break;
    }
    quotas
}

/// Samples per label among the seq range.
fn label_counts(db: &rusqlite::Connection, range: (i64, i64)) -> crate::Result<BTreeMap<i64, u64>> {
    let mut counts = BTreeMap::new();
    store::scan(db, range, |r| {
        *counts.entry(r.label).or_insert(0) += 1;
        Ok(())
    })?;
    Ok(counts)
}

#[cfg(test)]
pub(crate) mod test_util {
    use super::*;

    pub fn db() -> rusqlite::Connection {
        rusqlite::Connection::open_in_memory().expect("in-memory db")
    }

    /// Samples with keys `keys.start..`, timestamp = key, label from `label`.
    pub fn samples(keys: std::ops::Range<u64>, label: impl Fn(u64) -> i64) -> Vec<Sample> {
        keys.map(|k| Sample {
            key: k,
            timestamp: k as i64,
            label: label(k),
            features: None,
        })
        .collect()
    }

    pub fn cfg(strategy: StrategyKind, max: usize) -> SelectionConfig {
        SelectionConfig {
            strategy,
            maximum_keys_in_memory: max,
            tail_triggers: None,
            limit: None,
            limit_reset: None,
            seed: None,
            unused_ratio: None,
            presampling: None,
            score: None,
            k: None,
            sampling: None,
            warmup_triggers: None,
        }
    }

    /// All partitions of a trigger, in order.
    pub fn parts(
        s: &dyn Strategy,
        db: &rusqlite::Connection,
        info: &TriggerInfo,
    ) -> Vec<Vec<(u64, f64)>> {
        (0..info.partition_sizes.len())
            .map(|p| s.partition(db, info.trigger_id, p).expect("ok"))
            .collect()
    }

    /// The keys of a trigger's set, sorted.
    pub fn keys(s: &dyn Strategy, db: &rusqlite::Connection, info: &TriggerInfo) -> Vec<u64> {
        let mut k: Vec<u64> = parts(s, db, info)
            .into_iter()
            .flatten()
            .map(|(k, _)| k)
            .collect();
        k.sort_unstable();
        k
    }
}

#[cfg(test)]
mod tests {
    use super::test_util::*;
    use super::*;

    #[test]
    fn quotas_by_hand() {
        let q = |c: &[(i64, u64)], l| {
            balanced_quotas(&c.iter().copied().collect(), l)
                .into_iter()
                .collect::<Vec<_>>()
        };
        // 10 between three large labels: 4, 3, 3 (the smallest label gets the extra one).
        assert_eq!(
            q(&[(0, 100), (1, 100), (2, 100)], 10),
            vec![(0, 4), (1, 3), (2, 3)]
        );
        // Label 5 has 2 < 10/3: keeps 2; 8 left between 1 and 9: 4 each.
        assert_eq!(
            q(&[(1, 50), (5, 2), (9, 7)], 10),
            vec![(1, 4), (5, 2), (9, 4)]
        );
        // Cascade: 3 then 4 keep all; 13 left for label 2 alone.
        assert_eq!(
            q(&[(0, 3), (1, 4), (2, 100)], 20),
            vec![(0, 3), (1, 4), (2, 13)]
        );
        // More room than data: everything.
        assert_eq!(q(&[(0, 3), (1, 4)], 100), vec![(0, 3), (1, 4)]);
        assert!(q(&[], 10).is_empty());
    }

    #[test]
    fn fields_of_another_strategy_are_rejected() {
        let mut c = cfg(StrategyKind::NewData, 10);
        c.unused_ratio = Some(0.5);
        let e = build_strategy(&c, None)
            .err()
            .expect("an error")
            .to_string();
        assert!(
            e.contains("selection.unused_ratio") && e.contains("new_data"),
            "{e}"
        );
        let mut c = cfg(StrategyKind::NewData, 0);
        assert!(
            build_strategy(&c, None)
                .err()
                .expect("ok")
                .to_string()
                .contains("maximum_keys_in_memory")
        );
        c.maximum_keys_in_memory = 1;
        c.limit = Some(0);
        assert!(build_strategy(&c, None).is_err());
        let c = cfg(StrategyKind::LabelBalanced, 10);
        assert!(
            build_strategy(&c, None)
                .err()
                .expect("ok")
                .to_string()
                .contains("selection.limit")
        );
        let mut c = cfg(StrategyKind::Freshness, 10);
        c.unused_ratio = Some(1.5);
        assert!(
            build_strategy(&c, None)
                .err()
                .expect("ok")
                .to_string()
                .contains("(0, 1]")
        );
    }

    #[test]
    fn yaml_shape_of_the_issue_deserializes() {
        let c: SelectionConfig = serde_json::from_str(
            r#"{"strategy": "new_data", "maximum_keys_in_memory": 1000, "tail_triggers": 0,
                "limit": 50, "limit_reset": "last", "seed": 0}"#,
        )
        .expect("ok");
        assert_eq!(c.limit_reset, Some(LimitReset::Last));
        let c: SelectionConfig = serde_json::from_str(
            r#"{"strategy": "coreset", "maximum_keys_in_memory": 10, "k": 5, "sampling": "proportional",
                "presampling": {"strategy": "label_balanced", "ratio": 0.5}, "score": "label_rarity", "warmup_triggers": 1}"#,
        )
        .expect("ok");
        assert_eq!(
            c.presampling.expect("ok").strategy,
            PresamplingKind::LabelBalanced
        );
        assert!(
            serde_json::from_str::<SelectionConfig>(
                r#"{"strategy": "new_data", "maximum_keys_in_memory": 1, "limt": 3}"#
            )
            .is_err()
        );
    }
}
