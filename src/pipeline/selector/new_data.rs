//! `new_data`: the samples of the trigger's window (`tail_triggers`: none = all
//! data so far, 0 = since the last trigger, k = this and the k previous
//! triggers); with `limit` L below the candidates, the newest L (`last`) or a
//! uniform seeded draw of L (`uniform`, selection sampling in O(1) memory).
//! Weights are 1.

use super::rng::{Rng, Sampler};
use super::store::{self, PartitionWriter};
use super::{LimitReset, SelectionConfig, Strategy, TriggerInfo};

/// The `new_data` strategy.
#[derive(Debug)]
pub struct NewDataStrategy {
    cfg: SelectionConfig,
}

impl NewDataStrategy {
    pub fn new(cfg: SelectionConfig) -> Self {
        Self { cfg }
    }
}

impl Strategy for NewDataStrategy {
    fn trigger(
        &mut self,
        db: &rusqlite::Connection,
        trigger_id: u64,
    ) -> crate::Result<TriggerInfo> {
        store::check_new(db, trigger_id)?;
        let (lo, hi) = store::candidates(db, self.cfg.tail_triggers)?;
        let seed = self.cfg.seed.unwrap_or(0);
        let mut out = PartitionWriter::new(db, trigger_id, seed, self.cfg.maximum_keys_in_memory);
        let n = (hi - lo) as u64;
        match self.cfg.limit {
            Some(limit) if limit < n => match self.cfg.limit_reset.unwrap_or(LimitReset::Last) {
                LimitReset::Last => {
                    store::scan_keys(db, (hi - limit as i64, hi), |k| out.push(k, 1.0))?
                }
                LimitReset::Uniform => {
                    let mut rng = Rng::new(seed.wrapping_add(trigger_id)).fork(u64::MAX);
                    let mut pick = Sampler::new(limit, n);
                    store::scan_keys(db, (lo, hi), |k| {
                        if pick.take(&mut rng) {
                            out.push(k, 1.0)
                        } else {
                            Ok(())
                        }
                    })?
                }
            },
            _ => store::scan_keys(db, (lo, hi), |k| out.push(k, 1.0))?,
        }
        out.finish(hi)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::super::{StrategyKind, build_strategy};
    use super::*;

    fn strategy(
        tail: Option<u64>,
        limit: Option<u64>,
        reset: Option<LimitReset>,
        max: usize,
    ) -> Box<dyn Strategy> {
        let mut c = cfg(StrategyKind::NewData, max);
        c.tail_triggers = tail;
        c.limit = limit;
        c.limit_reset = reset;
        build_strategy(&c, None).expect("ok")
    }

    #[test]
    fn tail_triggers_none_zero_and_k() {
        for (tail, want) in [
            (
                None,
                vec![
                    (0..4).collect::<Vec<u64>>(),
                    (0..10).collect(),
                    (0..15).collect(),
                ],
            ),
            (
                Some(0),
                vec![(0..4).collect(), (4..10).collect(), (10..15).collect()],
            ),
            (
                Some(1),
                vec![(0..4).collect(), (0..10).collect(), (10..15).collect()],
            ),
        ] {
            let db = db();
            let mut s = strategy(tail, None, None, 100);
            s.open(&db).expect("ok");
            // Intervals: 0..4 (batches 0..3, 3..4), 4..10, then nothing, then 10..15.
            s.inform(&db, &samples(0..3, |_| 0)).expect("ok");
            s.inform(&db, &samples(3..4, |_| 0)).expect("ok");
            let t0 = s.trigger(&db, 0).expect("ok");
            s.inform(&db, &samples(4..10, |_| 0)).expect("ok");
            let t1 = s.trigger(&db, 1).expect("ok");
            // An empty interval: tail 0 gives an empty set with no partitions.
            let t2 = s.trigger(&db, 2).expect("ok");
            s.inform(&db, &samples(10..15, |_| 0)).expect("ok");
            let t3 = s.trigger(&db, 3).expect("ok");
            assert_eq!(keys(&*s, &db, &t0), want[0], "{tail:?}");
            assert_eq!(keys(&*s, &db, &t1), want[1], "{tail:?}");
            // With tail 1, trigger 3's window is interval 2 (empty) and 3.
            assert_eq!(keys(&*s, &db, &t3), want[2], "{tail:?}");
            match tail {
                Some(0) => assert_eq!((t2.num_keys, t2.partition_sizes.clone()), (0, vec![])),
                Some(1) => assert_eq!(keys(&*s, &db, &t2), (4..10).collect::<Vec<_>>()),
                _ => assert_eq!(t2.num_keys, 10),
            }
        }
    }

    #[test]
    fn partitions_are_shuffled_seeded_and_cover_the_set() {
        let db = db();
        let mut s = strategy(None, None, None, 4);
        s.open(&db).expect("ok");
        s.inform(&db, &samples(0..10, |_| 0)).expect("ok");
        let t = s.trigger(&db, 7).expect("ok");
        assert_eq!(
            t,
            TriggerInfo {
                trigger_id: 7,
                num_keys: 10,
                partition_sizes: vec![4, 4, 2]
            }
        );
        let p = parts(&*s, &db, &t);
        // Partition i holds the i-th run of 4 keys in informed order, shuffled.
        let sorted = |v: &Vec<(u64, f64)>| {
            let mut k: Vec<u64> = v.iter().map(|(k, _)| *k).collect();
            k.sort_unstable();
            k
        };
        assert_eq!(sorted(&p[0]), vec![0, 1, 2, 3]);
        assert_eq!(sorted(&p[1]), vec![4, 5, 6, 7]);
        assert_eq!(sorted(&p[2]), vec![8, 9]);
        assert!(p.iter().flatten().all(|(_, w)| *w == 1.0));
        // The same seed and trigger id give the same order; another seed another.
        let again = {
            let db = super::super::test_util::db();
            let mut s = strategy(None, None, None, 4);
            s.open(&db).expect("ok");
            s.inform(&db, &samples(0..10, |_| 0)).expect("ok");
            let t = s.trigger(&db, 7).expect("ok");
            parts(&*s, &db, &t)
        };
        assert_eq!(p, again);
        let mut orders = std::collections::HashSet::new();
        for seed in 0..5 {
            let db = super::super::test_util::db();
            let mut c = cfg(StrategyKind::NewData, 10);
            c.seed = Some(seed);
            let mut s = build_strategy(&c, None).expect("ok");
            s.open(&db).expect("ok");
            s.inform(&db, &samples(0..10, |_| 0)).expect("ok");
            let t = s.trigger(&db, 0).expect("ok");
            orders.insert(format!("{:?}", parts(&*s, &db, &t)));
        }
        assert!(orders.len() > 1, "the shuffle ignores the seed");
        // Out of range partitions and unknown triggers are errors; so is a repeated trigger id.
        assert!(
            s.partition(&db, 7, 3)
                .expect_err("an error")
                .to_string()
                .contains("no partition 3")
        );
        assert!(
            s.partition(&db, 8, 0)
                .expect_err("an error")
                .to_string()
                .contains("not built")
        );
        assert!(s.trigger(&db, 7).is_err());
    }

    #[test]
    fn limit_last_and_uniform() {
        for (limit, reset) in [
            (3, LimitReset::Last),
            (3, LimitReset::Uniform),
            (50, LimitReset::Last),
            (50, LimitReset::Uniform),
        ] {
            let db = db();
            let mut s = strategy(Some(0), Some(limit), Some(reset), 2);
            s.open(&db).expect("ok");
            s.inform(&db, &samples(0..5, |_| 0)).expect("ok");
            s.trigger(&db, 0).expect("ok");
            s.inform(&db, &samples(5..15, |_| 0)).expect("ok");
            let t = s.trigger(&db, 1).expect("ok");
            let k = keys(&*s, &db, &t);
            match (limit, reset) {
                // The newest 3 of interval 1, in partitions of 2.
                (3, LimitReset::Last) => {
                    assert_eq!(k, vec![12, 13, 14]);
                    assert_eq!(t.partition_sizes, vec![2, 1]);
                }
                (3, LimitReset::Uniform) => {
                    assert_eq!(k.len(), 3);
                    assert!(k.iter().all(|k| (5..15).contains(k)), "{k:?}");
                    assert_ne!(
                        k,
                        vec![12, 13, 14],
                        "seed 0 draws the newest by chance; pick another seed"
                    );
                }
                // A limit above the data keeps everything.
                _ => assert_eq!(k, (5..15).collect::<Vec<_>>()),
            }
        }
    }

    #[test]
    fn large_batches_take_the_multi_row_insert() {
        let db = db();
        let mut s = strategy(Some(0), Some(100), Some(LimitReset::Last), 64);
        s.open(&db).expect("ok");
        // 200 = 3 inserts of 64 rows + 8 single rows; then 70 = 64 + 6.
        s.inform(&db, &samples(0..200, |k| k as i64 % 5))
            .expect("ok");
        s.inform(&db, &samples(200..270, |k| k as i64 % 5))
            .expect("ok");
        let t = s.trigger(&db, 0).expect("ok");
        assert_eq!(keys(&*s, &db, &t), (170..270).collect::<Vec<_>>());
        assert_eq!(t.partition_sizes, vec![64, 36]);
        let rows: Vec<(i64, i64, i64, i64)> = db
            .prepare("SELECT seq, key, ts, label FROM sel_samples ORDER BY seq")
            .expect("ok")
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .expect("ok")
            .collect::<Result<_, _>>()
            .expect("ok");
        let want: Vec<(i64, i64, i64, i64)> = (0..270).map(|k| (k, k, k, k % 5)).collect();
        assert_eq!(rows, want);
    }

    #[test]
    fn a_new_instance_continues_identically() {
        let run = |restart: bool| {
            let db = db();
            let mut s = strategy(Some(0), Some(4), Some(LimitReset::Uniform), 3);
            s.open(&db).expect("ok");
            s.inform(&db, &samples(0..7, |_| 0)).expect("ok");
            let mut out = vec![{
                let t = s.trigger(&db, 0).expect("ok");
                parts(&*s, &db, &t)
            }];
            s.inform(&db, &samples(7..9, |_| 0)).expect("ok");
            if restart {
                s = strategy(Some(0), Some(4), Some(LimitReset::Uniform), 3);
                s.open(&db).expect("ok");
            }
            s.inform(&db, &samples(9..20, |_| 0)).expect("ok");
            out.push({
                let t = s.trigger(&db, 1).expect("ok");
                parts(&*s, &db, &t)
            });
            // Partitions of trigger 0 are still readable.
            out.push(vec![s.partition(&db, 0, 1).expect("ok")]);
            out
        };
        assert_eq!(run(false), run(true));
    }
}
