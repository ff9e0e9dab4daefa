//! `freshness`: a trigger's set mixes never-used samples (share `unused_ratio`)
//! with used ones, drawn uniformly (seeded) within each group from the
//! trigger's window (`tail_triggers`). With `limit` L the set has min(L, all)
//! keys: round(L·r) unused (fewer if fewer exist, the used ones filling up) and
//! the rest used (fewer if fewer exist, the unused ones filling up). Without a
//! limit: every unused sample and round(U·(1−r)/r) used ones. The unused
//! samples selected are marked used at the trigger. Weights are 1.

use super::rng::{Rng, Sampler};
use super::store::{self, PartitionWriter};
use super::{SelectionConfig, Strategy, TriggerInfo, check_ratio, db_error};

/// The `freshness` strategy.
#[derive(Debug)]
pub struct FreshnessStrategy {
    cfg: SelectionConfig,
    ratio: f64,
}

impl FreshnessStrategy {
    pub fn new(cfg: SelectionConfig) -> crate::Result<Self> {
        let ratio = cfg.unused_ratio.ok_or_else(|| {
            super::bad_setting(
                "selection.unused_ratio",
                "(missing)",
                "is required by strategy freshness",
            )
        })?;
        let ratio = check_ratio("selection.unused_ratio", ratio)?;
        Ok(Self { cfg, ratio })
    }

    /// (unused, used) to take of `unused` and `used` available.
    pub fn shares(&self, unused: u64, used: u64) -> (u64, u64) {
        let r = self.ratio;
        match self.cfg.limit {
            Some(limit) => {
                let total = limit.min(unused + used);
                let mut u = ((total as f64 * r).round() as u64).min(unused);
                let s = (total - u).min(used);
                u = (total - s).min(unused);
                (u, s)
            }
            None => (
                unused,
                ((unused as f64 * (1.0 - r) / r).round() as u64).min(used),
            ),
        }
    }
}

impl Strategy for FreshnessStrategy {
    fn trigger(
        &mut self,
        db: &rusqlite::Connection,
        trigger_id: u64,
    ) -> crate::Result<TriggerInfo> {
        store::check_new(db, trigger_id)?;
        let range = store::candidates(db, self.cfg.tail_triggers)?;
        let (mut unused, mut used) = (0, 0);
        store::scan(db, range, |r| {
            if r.used {
                used += 1
            } else {
                unused += 1
            }
            Ok(())
        })?;
        let (take_unused, take_used) = self.shares(unused, used);
        let seed = self.cfg.seed.unwrap_or(0);
        let rng = Rng::new(seed.wrapping_add(trigger_id));
        let (mut rng_u, mut rng_s) = (rng.fork(u64::MAX), rng.fork(u64::MAX - 1));
        let (mut pick_u, mut pick_s) = (
            Sampler::new(take_unused, unused),
            Sampler::new(take_used, used),
        );
        let mut out = PartitionWriter::new(db, trigger_id, seed, self.cfg.maximum_keys_in_memory);
        let mut mark = db
            .prepare_cached("INSERT INTO sel_stage (seq, key) VALUES (?1, ?2)")
            .map_err(|e| db_error(db, e))?;
        store::scan(db, range, |r| {
            let take = if r.used {
                pick_s.take(&mut rng_s)
            } else {
                pick_u.take(&mut rng_u)
            };
            if !take {
                return Ok(());
            }
            if !r.used {
                mark.execute(rusqlite::params![r.seq, r.key as i64])
                    .map_err(|e| db_error(db, e))?;
            }
            out.push(r.key, 1.0)
        })?;
        db.execute_batch(
            "UPDATE sel_samples SET used = 1 WHERE seq IN (SELECT seq FROM sel_stage); DELETE FROM sel_stage;",
        )
        .map_err(|e| db_error(db, e))?;
        out.finish(range.1)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::super::{StrategyKind, build_strategy};
    use super::*;

    fn config(ratio: f64, limit: Option<u64>) -> SelectionConfig {
        let mut c = cfg(StrategyKind::Freshness, 3);
        c.unused_ratio = Some(ratio);
        c.limit = limit;
        c
    }

    #[test]
    fn shares_by_hand() {
        let s = |r, l, u, d| {
            FreshnessStrategy::new(config(r, l))
                .expect("ok")
                .shares(u, d)
        };
        // Limit 10, r = 0.3: 3 unused + 7 used when both suffice.
        assert_eq!(s(0.3, Some(10), 20, 20), (3, 7));
        // Only 4 used: 6 unused fill up.
        assert_eq!(s(0.3, Some(10), 20, 4), (6, 4));
        // Only 1 unused: 9 used.
        assert_eq!(s(0.3, Some(10), 1, 20), (1, 9));
        // Limit above the data: everything.
        assert_eq!(s(0.3, Some(100), 5, 6), (5, 6));
        // No limit, r = 0.25: every unused (6) and 6·0.75/0.25 = 18 used, capped at 10.
        assert_eq!(s(0.25, None, 6, 10), (6, 10));
        assert_eq!(s(0.5, None, 6, 10), (6, 6));
        assert_eq!(s(1.0, None, 6, 10), (6, 0));
    }

    #[test]
    fn unused_samples_are_used_once_then_mixed() {
        let db = db();
        let mut s = build_strategy(&config(0.5, Some(4)), None).expect("ok");
        s.open(&db).expect("ok");
        s.inform(&db, &samples(0..4, |_| 0)).expect("ok");
        // Nothing used yet: 4 unused (the used share is empty, unused fill up).
        let t0 = s.trigger(&db, 0).expect("ok");
        assert_eq!(keys(&*s, &db, &t0), vec![0, 1, 2, 3]);
        s.inform(&db, &samples(4..10, |_| 0)).expect("ok");
        // 2 of the 6 unused (4..10) + 2 of the 4 used (0..4).
        let t1 = s.trigger(&db, 1).expect("ok");
        let k1 = keys(&*s, &db, &t1);
        assert_eq!(k1.iter().filter(|k| **k < 4).count(), 2, "{k1:?}");
        assert_eq!(k1.iter().filter(|k| **k >= 4).count(), 2, "{k1:?}");
        // A restart: the 4 never-used samples left are exactly those not in t1.
        let mut s = build_strategy(&config(1.0, None), None).expect("ok");
        s.open(&db).expect("ok");
        let t2 = s.trigger(&db, 2).expect("ok");
        let fresh: Vec<u64> = (4..10).filter(|k| !k1.contains(k)).collect();
        assert_eq!(keys(&*s, &db, &t2), fresh);
        // Now everything is used: ratio 1 without limit selects nothing.
        assert_eq!(s.trigger(&db, 3).expect("ok").num_keys, 0);
    }
}
