//! `coreset`: an offline selection computed at the trigger. The trigger's
//! window (`tail_triggers`) is presampled (`random` or `label_balanced`,
//! ceil(ratio·n) keys, default all), the candidates are scored by a
//! [`ScoreFn`] (a Rust callback) or a built-in score, `maximum_keys_in_memory`
//! candidates at a time, and `k` keys are kept: the k best scores (`top_k`,
//! weight 1) or k keys drawn without replacement with probability
//! proportional to score (`proportional`, Efraimidis–Spirakis keys u^(1/s),
//! weight 1/(n·p) with p = s/Σs over the n candidates). During the first
//! `warmup_triggers` triggers the presampled set is the training set as is.
//! Candidates and scores are staged in `sel_stage`, so memory is bounded by
//! `maximum_keys_in_memory`, not by n or k.
//!
//! Built-in scores: `recency` (timestamp − first candidate's timestamp + 1:
//! newer samples score higher) and `label_rarity` (1 / the number of
//! candidates with the sample's label: rare labels score higher).

use std::collections::HashMap;
use std::sync::Arc;

use rusqlite::params;

use super::label_balanced::balanced_draw;
use super::rng::{Rng, Sampler};
use super::store::{self, PartitionWriter};
use super::{
    CoresetSampling, PresamplingKind, ScoreFn, SelectionConfig, Strategy, TriggerInfo, bad_setting,
    check_ratio, db_error,
};
use crate::pipeline::sample::Sample;

/// The built-in scores, by their YAML names.
pub const BUILTIN_SCORES: &[&str] = &["recency", "label_rarity"];

enum Scorer {
    Callback(Arc<dyn ScoreFn>),
    Recency,
    LabelRarity,
}

/// The `coreset` strategy.
pub struct CoresetStrategy {
    cfg: SelectionConfig,
    k: u64,
    scorer: Scorer,
}

impl std::fmt::Debug for CoresetStrategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoresetStrategy")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

impl CoresetStrategy {
    pub fn new(cfg: SelectionConfig, scores: Option<Arc<dyn ScoreFn>>) -> crate::Result<Self> {
        let k = cfg.k.ok_or_else(|| {
            bad_setting(
                "selection.k",
                "(missing)",
                "is required by strategy coreset",
            )
        })?;
        if k == 0 {
            return Err(bad_setting("selection.k", 0, "must be at least 1"));
        }
        if let Some(p) = &cfg.presampling {
            check_ratio("selection.presampling.ratio", p.ratio)?;
        }
        let scorer = match (scores, cfg.score.as_deref()) {
            (Some(_), Some(name)) => {
                return Err(bad_setting(
                    "selection.score",
                    name,
                    "is set but a Rust score function was given too",
                ));
            }
            (Some(f), None) => Scorer::Callback(f),
            (None, Some("recency")) => Scorer::Recency,
            (None, Some("label_rarity")) => Scorer::LabelRarity,
            (None, Some(other)) => {
                return Err(bad_setting(
                    "selection.score",
                    other,
                    &format!("is not a built-in score ({})", BUILTIN_SCORES.join(", ")),
                ));
            }
            (None, None) => {
                return Err(bad_setting(
                    "selection.score",
                    "(missing)",
                    &format!(
                        "is required by strategy coreset ({}), unless a Rust score function is given",
                        BUILTIN_SCORES.join(", ")
                    ),
                ));
            }
        };
        Ok(Self { cfg, k, scorer })
    }

    /// Presamples the window into `sel_stage`; returns the number staged.
    fn presample(
        &self,
        db: &rusqlite::Connection,
        (lo, hi): (i64, i64),
        rng: &Rng,
    ) -> crate::Result<u64> {
        let n = (hi - lo) as u64;
        let (kind, ratio) = self
            .cfg
            .presampling
            .as_ref()
            .map_or((PresamplingKind::Random, 1.0), |p| (p.strategy, p.ratio));
        let take = ((n as f64 * ratio).ceil() as u64).min(n);
        let mut stage = db
            .prepare_cached("INSERT INTO sel_stage (seq, key, ts, label) VALUES (?1, ?2, ?3, ?4)")
            .map_err(|e| db_error(db, e))?;
        let mut staged = 0;
        let mut put = |r: store::Row| {
            staged += 1;
            stage
                .execute(params![r.seq, r.key as i64, r.ts, r.label])
                .map(|_| ())
                .map_err(|e| db_error(db, e))
        };
        match kind {
            PresamplingKind::Random => {
                let mut rng = rng.fork(u64::MAX - 2);
                let mut pick = Sampler::new(take, n);
                store::scan(db, (lo, hi), |r| {
                    if pick.take(&mut rng) { put(r) } else { Ok(()) }
                })?;
            }
            PresamplingKind::LabelBalanced => {
                balanced_draw(db, (lo, hi), take, rng.fork(u64::MAX - 3), &mut put)?
            }
        }
        Ok(staged)
    }

    /// Scores the staged candidates, M at a time; returns Σ score.
    fn score(&self, db: &rusqlite::Connection, rng: &Rng) -> crate::Result<f64> {
        let e = |e| db_error(db, e);
        let max = self.cfg.maximum_keys_in_memory;
        let proportional = self.cfg.sampling == Some(CoresetSampling::Proportional);
        let first_ts: i64 = db
            .query_row("SELECT coalesce(min(ts), 0) FROM sel_stage", [], |r| {
                r.get(0)
            })
            .map_err(e)?;
        let mut label_counts = HashMap::new();
        if matches!(self.scorer, Scorer::LabelRarity) {
            let mut st = db
                .prepare("SELECT label, count(*) FROM sel_stage GROUP BY label")
                .map_err(e)?;
            let rows = st
                .query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)))
                .map_err(e)?;
            for row in rows {
                let (label, n) = row.map_err(e)?;
                label_counts.insert(label, n as f64);
            }
        }
        let mut rng = rng.fork(u64::MAX - 4);
        let (mut after, mut total) = (i64::MIN, 0.0);
        loop {
            let chunk: Vec<(i64, Sample)> = {
                let mut st = db
                    .prepare_cached("SELECT seq, key, ts, label FROM sel_stage WHERE seq > ?1 ORDER BY seq LIMIT ?2")
                    .map_err(e)?;
                let rows = st
                    .query_map(params![after, max as i64], |r| {
                        Ok((
                            r.get(0)?,
                            Sample {
                                key: r.get::<_, i64>(1)? as u64,
                                timestamp: r.get(2)?,
                                label: r.get(3)?,
                                features: None,
                            },
                        ))
                    })
                    .map_err(e)?;
                rows.collect::<Result<_, _>>().map_err(e)?
            };
            let Some((last, _)) = chunk.last() else { break };
            after = *last;
            let samples: Vec<Sample> = chunk.iter().map(|(_, s)| s.clone()).collect();
            let scores = match &self.scorer {
                Scorer::Callback(f) => f.score(&samples)?,
                Scorer::Recency => samples
                    .iter()
                    .map(|s| (s.timestamp - first_ts) as f64 + 1.0)
                    .collect(),
                Scorer::LabelRarity => samples
                    .iter()
                    .map(|s| 1.0 / label_counts.get(&s.label).copied().unwrap_or(1.0))
                    .collect(),
            };
            if scores.len() != samples.len() {
                return Err(crate::Error::plan(format!(
                    "the coreset score function returned {} scores for {} candidates",
                    scores.len(),
                    samples.len()
                )));
            }
            let mut put = db
                .prepare_cached("UPDATE sel_stage SET score = ?2, rank = ?3 WHERE seq = ?1")
                .map_err(e)?;
            for ((seq, s), score) in chunk.iter().zip(scores) {
                if !score.is_finite() || (proportional && score < 0.0) {
                    return Err(crate::Error::plan(format!(
                        "the coreset score of sample {} is {score}; scores must be finite{}",
                        s.key,
                        if proportional {
                            " and >= 0 for proportional sampling"
                        } else {
                            ""
                        }
                    )));
                }
                total += score;
                // Efraimidis–Spirakis: the k largest u^(1/s), compared as ln(u)/s.
                let rank = if !proportional {
                    Some(score)
                } else if score > 0.0 {
                    Some(rng.unit().ln() / score)
                } else {
                    None
                };
                put.execute(params![seq, score, rank]).map_err(e)?;
            }
        }
        Ok(total)
    }
}

impl Strategy for CoresetStrategy {
    fn trigger(
        &mut self,
        db: &rusqlite::Connection,
        trigger_id: u64,
    ) -> crate::Result<TriggerInfo> {
        store::check_new(db, trigger_id)?;
        let e = |e| db_error(db, e);
        let range = store::candidates(db, self.cfg.tail_triggers)?;
        let seed = self.cfg.seed.unwrap_or(0);
        let rng = Rng::new(seed.wrapping_add(trigger_id));
        db.execute("DELETE FROM sel_stage", []).map_err(e)?;
        let n = self.presample(db, range, &rng)?;
        let mut out = PartitionWriter::new(db, trigger_id, seed, self.cfg.maximum_keys_in_memory);
        if store::triggers_done(db)? < self.cfg.warmup_triggers.unwrap_or(0) {
            let mut st = db
                .prepare("SELECT key FROM sel_stage ORDER BY seq")
                .map_err(e)?;
            let mut rows = st.query([]).map_err(e)?;
            while let Some(r) = rows.next().map_err(e)? {
                out.push(r.get::<_, i64>(0).map_err(e)? as u64, 1.0)?;
            }
        } else {
            let total = self.score(db, &rng)?;
            let proportional = self.cfg.sampling == Some(CoresetSampling::Proportional);
            if proportional && n > 0 && total <= 0.0 {
                return Err(crate::Error::plan(
                    "every coreset score is 0: proportional sampling has nothing to draw from",
                ));
            }
            let mut st = db
                .prepare("SELECT key, score FROM sel_stage WHERE rank IS NOT NULL ORDER BY rank DESC, seq LIMIT ?1")
                .map_err(e)?;
            let mut rows = st.query([self.k.min(i64::MAX as u64) as i64]).map_err(e)?;
            while let Some(r) = rows.next().map_err(e)? {
                let key = r.get::<_, i64>(0).map_err(e)? as u64;
                let score: f64 = r.get(1).map_err(e)?;
                out.push(
                    key,
                    if proportional {
                        total / (n as f64 * score)
                    } else {
                        1.0
                    },
                )?;
            }
        }
        db.execute("DELETE FROM sel_stage", []).map_err(e)?;
        out.finish(range.1)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::super::{Presampling, StrategyKind, build_strategy};
    use super::*;

    /// Scores from a table keyed by sample key.
    struct Table(Vec<f64>);
    impl ScoreFn for Table {
        fn score(&self, c: &[Sample]) -> crate::Result<Vec<f64>> {
            Ok(c.iter().map(|s| self.0[s.key as usize]).collect())
        }
    }

    fn config(k: u64, sampling: CoresetSampling, max: usize) -> SelectionConfig {
        let mut c = cfg(StrategyKind::Coreset, max);
        c.k = Some(k);
        c.sampling = Some(sampling);
        c
    }

    fn weighted(s: &dyn Strategy, db: &rusqlite::Connection, t: &TriggerInfo) -> Vec<(u64, f64)> {
        let mut v: Vec<(u64, f64)> = parts(s, db, t).into_iter().flatten().collect();
        v.sort_by_key(|(k, _)| *k);
        v
    }

    #[test]
    fn top_k_by_a_callback_over_several_chunks() {
        let db = db();
        // Scores peak at keys 2, 7, 5; candidates scored 3 at a time.
        let scores = vec![0.1, 0.2, 9.0, 0.3, 0.0, 5.0, 0.4, 7.0, 0.5, 0.6];
        let mut s = build_strategy(
            &config(3, CoresetSampling::TopK, 3),
            Some(Arc::new(Table(scores))),
        )
        .expect("ok");
        s.open(&db).expect("ok");
        s.inform(&db, &samples(0..10, |_| 0)).expect("ok");
        let t = s.trigger(&db, 0).expect("ok");
        assert_eq!(t.partition_sizes, vec![3]);
        assert_eq!(weighted(&*s, &db, &t), vec![(2, 1.0), (5, 1.0), (7, 1.0)]);
        // k above the candidates keeps them all.
        let mut s = build_strategy(
            &config(50, CoresetSampling::TopK, 4),
            Some(Arc::new(Table(vec![1.0; 10]))),
        )
        .expect("ok");
        s.open(&db).expect("ok");
        assert_eq!(
            s.trigger(&db, 1).expect("ok").partition_sizes,
            vec![4, 4, 2]
        );
    }

    #[test]
    fn proportional_weights_are_one_over_n_p() {
        let db = db();
        // n = 3, Σs = 4: weights 4/(3·1), 4/(3·1), 4/(3·2); k = 3 takes all.
        let mut s = build_strategy(
            &config(3, CoresetSampling::Proportional, 2),
            Some(Arc::new(Table(vec![1.0, 1.0, 2.0]))),
        )
        .expect("ok");
        s.open(&db).expect("ok");
        s.inform(&db, &samples(0..3, |_| 0)).expect("ok");
        let t = s.trigger(&db, 0).expect("ok");
        let w = weighted(&*s, &db, &t);
        let want = [(0, 4.0 / 3.0), (1, 4.0 / 3.0), (2, 2.0 / 3.0)];
        assert_eq!(w.len(), 3);
        for ((k, w), (wk, ww)) in w.iter().zip(want) {
            assert_eq!(*k, wk);
            assert!((w - ww).abs() < 1e-12, "{w} vs {ww}");
        }
        // Only key 3 has a score: k = 1 draws it, weight Σs/(n·s) = 1/(4·1).
        let db = super::super::test_util::db();
        let mut s = build_strategy(
            &config(1, CoresetSampling::Proportional, 2),
            Some(Arc::new(Table(vec![0.0, 0.0, 0.0, 1.0]))),
        )
        .expect("ok");
        s.open(&db).expect("ok");
        s.inform(&db, &samples(0..4, |_| 0)).expect("ok");
        let t = s.trigger(&db, 0).expect("ok");
        assert_eq!(weighted(&*s, &db, &t), vec![(3, 0.25)]);
        // All zero: a clear error; a negative score too.
        let db = super::super::test_util::db();
        let mut s = build_strategy(
            &config(1, CoresetSampling::Proportional, 2),
            Some(Arc::new(Table(vec![0.0, -1.0]))),
        )
        .expect("ok");
        s.open(&db).expect("ok");
        s.inform(&db, &samples(0..2, |_| 0)).expect("ok");
        assert!(
            s.trigger(&db, 0)
                .expect_err("an error")
                .to_string()
                .contains(">= 0")
        );
    }

    #[test]
    fn warmup_uses_the_presampled_set_then_scores() {
        let db = db();
        let mut c = config(2, CoresetSampling::TopK, 10);
        c.presampling = Some(Presampling {
            strategy: PresamplingKind::Random,
            ratio: 0.5,
        });
        c.warmup_triggers = Some(1);
        c.tail_triggers = Some(0);
        c.score = Some("recency".into());
        let mut s = build_strategy(&c, None).expect("ok");
        s.open(&db).expect("ok");
        s.inform(&db, &samples(0..10, |_| 0)).expect("ok");
        // Warm-up: ceil(0.5·10) = 5 presampled keys of 0..10, weight 1.
        let t0 = s.trigger(&db, 0).expect("ok");
        let w0 = weighted(&*s, &db, &t0);
        assert_eq!(w0.len(), 5);
        assert!(w0.iter().all(|(k, w)| *k < 10 && *w == 1.0));
        // After warm-up: of 5 presampled among 10..20, the 2 newest (recency).
        s.inform(&db, &samples(10..20, |_| 0)).expect("ok");
        let t1 = s.trigger(&db, 1).expect("ok");
        let k1 = keys(&*s, &db, &t1);
        assert_eq!(k1.len(), 2);
        assert!(k1.iter().all(|k| (10..20).contains(k)), "{k1:?}");
        // The stage is empty between triggers.
        let staged: i64 = db
            .query_row("SELECT count(*) FROM sel_stage", [], |r| r.get(0))
            .expect("ok");
        assert_eq!(staged, 0);
    }

    #[test]
    fn label_balanced_presampling_and_label_rarity() {
        let db = db();
        // Labels: keys 0..6 label 0, keys 6..8 label 1.
        let label = |k: u64| i64::from(k >= 6);
        let mut c = config(2, CoresetSampling::TopK, 10);
        c.presampling = Some(Presampling {
            strategy: PresamplingKind::LabelBalanced,
            ratio: 0.5,
        });
        c.warmup_triggers = Some(1);
        c.score = Some("label_rarity".into());
        let mut s = build_strategy(&c, None).expect("ok");
        s.open(&db).expect("ok");
        s.inform(&db, &samples(0..8, label)).expect("ok");
        // Warm-up: 4 presampled, 2 per label (label 1 keeps both of its samples).
        let k0 = {
            let t = s.trigger(&db, 0).expect("ok");
            keys(&*s, &db, &t)
        };
        assert_eq!(k0.len(), 4);
        assert!(k0.contains(&6) && k0.contains(&7), "{k0:?}");
        // Without presampling, label_rarity's top 2 are the two label-1 samples.
        let mut c = config(2, CoresetSampling::TopK, 10);
        c.score = Some("label_rarity".into());
        let mut s = build_strategy(&c, None).expect("ok");
        s.open(&db).expect("ok");
        assert_eq!(
            {
                let t = s.trigger(&db, 1).expect("ok");
                keys(&*s, &db, &t)
            },
            vec![6, 7]
        );
    }

    #[test]
    fn score_config_errors() {
        let mut c = config(2, CoresetSampling::TopK, 10);
        assert!(
            build_strategy(&c, None)
                .err()
                .expect("ok")
                .to_string()
                .contains("recency, label_rarity")
        );
        c.score = Some("loss".into());
        assert!(
            build_strategy(&c, None)
                .err()
                .expect("ok")
                .to_string()
                .contains("not a built-in")
        );
        c.score = Some("recency".into());
        assert!(build_strategy(&c, Some(Arc::new(Table(vec![])))).is_err());
        c.k = Some(0);
        assert!(build_strategy(&c, None).is_err());
    }
}
