//! `label_balanced` (GDumb's class-balanced memory): `limit` keys shared
//! equally between the labels of the trigger's window (`tail_triggers`, default
//! all data so far); a label with fewer samples than its share keeps all of
//! them and the rest is shared again among the others ([`super::balanced_quotas`]).
//! Within a label the keys are a uniform seeded draw. Weights are 1.

use std::collections::BTreeMap;

use super::rng::{Rng, Sampler};
use super::store::{self, PartitionWriter};
use super::{SelectionConfig, Strategy, TriggerInfo, balanced_quotas};

/// The `label_balanced` strategy.
#[derive(Debug)]
pub struct LabelBalancedStrategy {
    cfg: SelectionConfig,
    limit: u64,
}

impl LabelBalancedStrategy {
    pub fn new(cfg: SelectionConfig) -> crate::Result<Self> {
        let limit = cfg.limit.ok_or_else(|| {
            super::bad_setting(
                "selection.limit",
                "(missing)",
                "is required by strategy label_balanced",
            )
        })?;
        Ok(Self { cfg, limit })
    }
}

/// Streams a balanced draw of `total` keys of the range into `out`: per-label
/// quotas, then one seeded selection sampler per label (memory: one per label).
pub(crate) fn balanced_draw(
    db: &rusqlite::Connection,
    range: (i64, i64),
    total: u64,
    rng: Rng,
    mut out: impl FnMut(store::Row) -> crate::Result<()>,
) -> crate::Result<()> {
    let counts = super::label_counts(db, range)?;
    let quotas = balanced_quotas(&counts, total);
    let mut pickers: BTreeMap<i64, (Sampler, Rng)> = counts
        .iter()
        .map(|(label, n)| {
            (
                *label,
                (
                    Sampler::new(quotas.get(label).copied().unwrap_or(0), *n),
                    rng.fork(*label as u64),
                ),
            )
        })
        .collect();
    store::scan(db, range, |r| match pickers.get_mut(&r.label) {
        Some((pick, rng)) => {
            if pick.take(rng) {
                out(r)
            } else {
                Ok(())
            }
        }
        None => Ok(()),
    })
}

impl Strategy for LabelBalancedStrategy {
    fn trigger(
        &mut self,
        db: &rusqlite::Connection,
        trigger_id: u64,
    ) -> crate::Result<TriggerInfo> {
        store::check_new(db, trigger_id)?;
        let range = store::candidates(db, self.cfg.tail_triggers)?;
        let seed = self.cfg.seed.unwrap_or(0);
        let mut out = PartitionWriter::new(db, trigger_id, seed, self.cfg.maximum_keys_in_memory);
        let rng = Rng::new(seed.wrapping_add(trigger_id)).fork(u64::MAX);
        balanced_draw(db, range, self.limit, rng, |r| out.push(r.key, 1.0))?;
        out.finish(range.1)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::super::{StrategyKind, build_strategy};
    use super::*;

    fn strategy(limit: u64, max: usize) -> Box<dyn Strategy> {
        let mut c = cfg(StrategyKind::LabelBalanced, max);
        c.limit = Some(limit);
        build_strategy(&c, None).expect("ok")
    }

    fn per_label(k: &[u64], label: impl Fn(u64) -> i64) -> BTreeMap<i64, usize> {
        let mut m = BTreeMap::new();
        for key in k {
            *m.entry(label(*key)).or_insert(0) += 1;
        }
        m
    }

    #[test]
    fn a_short_label_keeps_all_and_the_rest_is_reshared() {
        // Keys 0..40: label 0 for keys < 2 (2 samples), label 1 for 2..12 (10),
        // label 2 for 12..40 (28). Limit 12: shares 4; label 0 keeps 2; 10 left
        // between labels 1 and 2: 5 each.
        let label = |k: u64| {
            if k < 2 {
                0
            } else if k < 12 {
                1
            } else {
                2
            }
        };
        let db = db();
        let mut s = strategy(12, 5);
        s.open(&db).expect("ok");
        s.inform(&db, &samples(0..25, label)).expect("ok");
        s.inform(&db, &samples(25..40, label)).expect("ok");
        let t = s.trigger(&db, 0).expect("ok");
        assert_eq!(t.partition_sizes, vec![5, 5, 2]);
        let k = keys(&*s, &db, &t);
        assert_eq!(
            per_label(&k, label),
            BTreeMap::from([(0, 2), (1, 5), (2, 5)])
        );
        assert!(k.contains(&0) && k.contains(&1));
        // A limit above the data keeps all 40.
        let mut s = strategy(100, 50);
        s.open(&db).expect("ok");
        assert_eq!(
            {
                let t = s.trigger(&db, 1).expect("ok");
                keys(&*s, &db, &t)
            },
            (0..40).collect::<Vec<_>>()
        );
    }

    #[test]
    fn seeded_draw_is_repeatable_across_instances() {
        let label = |k: u64| (k % 3) as i64;
        let run = || {
            let db = db();
            let mut s = strategy(6, 4);
            s.open(&db).expect("ok");
            s.inform(&db, &samples(0..30, label)).expect("ok");
            let t = s.trigger(&db, 0).expect("ok");
            parts(&*s, &db, &t)
        };
        let a = run();
        assert_eq!(a, run());
        let k: Vec<u64> = a.into_iter().flatten().map(|(k, _)| k).collect();
        assert_eq!(
            per_label(&k, label),
            BTreeMap::from([(0, 2), (1, 2), (2, 2)])
        );
    }
}
