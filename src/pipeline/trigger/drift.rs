//! `drift`: every `current_size` samples, the distance (KS or MMD²) between the
//! reference window and the current window (the last `current_size` samples)
//! is compared with `threshold`; above it, a trigger fires after the sample
//! that completed the window. The first evaluation always fires (there is no
//! reference yet, as in Modyn: the first model must be trained). At each
//! trigger the reference becomes the last `reference_size` samples.
//!
//! State in `db`: the last max(reference, current) feature vectors
//! (`trig_drift_recent`), the reference (`trig_drift_ref`), and in `trig_state`
//! the samples since the last evaluation and whether a trigger fired yet. The
//! in-memory windows are rebuilt by `open`.

use std::collections::VecDeque;
use std::sync::Arc;

use super::distance::{gaussian_mmd2, ks_statistic, median_bandwidth};
use super::{
    DriftConfig, DriftMetric, FeatureSource, Trigger, bad_setting, db_error, get_state, open_state,
    set_state,
};
use crate::pipeline::sample::Sample;

const SINCE: &str = "drift_since_eval";
const FIRED: &str = "drift_fired";
const NEXT_SEQ: &str = "drift_next_seq";

/// Fires when the current window drifts from the reference.
#[derive(Debug)]
pub struct DriftTrigger {
    cfg: DriftConfig,
    recent: VecDeque<Arc<[f32]>>,
    reference: Vec<Arc<[f32]>>,
    since_eval: usize,
    fired: bool,
    next_seq: i64,
}

impl DriftTrigger {
    pub fn new(cfg: DriftConfig) -> crate::Result<Self> {
        if cfg.reference_size == 0 {
            return Err(bad_setting(
                "trigger.drift.reference_size",
                0,
                "must be at least 1",
            ));
        }
        if cfg.current_size == 0 {
            return Err(bad_setting(
                "trigger.drift.current_size",
                0,
                "must be at least 1",
            ));
        }
        if !cfg.threshold.is_finite() || cfg.threshold < 0.0 {
            return Err(bad_setting(
                "trigger.drift.threshold",
                cfg.threshold,
                "must be a number >= 0",
            ));
        }
        if let Some(b) = cfg.bandwidth {
            if !(b.is_finite() && b > 0.0) {
                return Err(bad_setting(
                    "trigger.drift.bandwidth",
                    b,
                    "must be a number > 0",
                ));
            }
            if cfg.metric != DriftMetric::Mmd {
                return Err(bad_setting(
                    "trigger.drift.bandwidth",
                    b,
                    "applies to metric mmd only",
                ));
            }
        }
        Ok(Self {
            cfg,
            recent: VecDeque::new(),
            reference: Vec::new(),
            since_eval: 0,
            fired: false,
            next_seq: 0,
        })
    }

    fn keep(&self) -> usize {
        self.cfg.reference_size.max(self.cfg.current_size)
    }

    /// The distance between the reference and the last `current_size` samples.
    pub fn distance(&self) -> f64 {
        let reference: Vec<&[f32]> = self.reference.iter().map(|v| &v[..]).collect();
        let skip = self.recent.len().saturating_sub(self.cfg.current_size);
        let current: Vec<&[f32]> = self.recent.iter().skip(skip).map(|v| &v[..]).collect();
        match self.cfg.metric {
            DriftMetric::Ks => ks_statistic(&reference, &current),
            DriftMetric::Mmd => {
                let sigma = self
                    .cfg
                    .bandwidth
                    .unwrap_or_else(|| median_bandwidth(&reference, &current));
                gaussian_mmd2(&reference, &current, sigma)
            }
        }
    }
}

fn encode(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn decode(b: &[u8]) -> Arc<[f32]> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn load(db: &rusqlite::Connection, sql: &str) -> crate::Result<Vec<Arc<[f32]>>> {
    let mut stmt = db.prepare(sql).map_err(|e| db_error(db, e))?;
    let rows = stmt
        .query_map([], |r| r.get::<_, Vec<u8>>(0))
        .map_err(|e| db_error(db, e))?;
    rows.map(|r| r.map(|b| decode(&b)).map_err(|e| db_error(db, e)))
        .collect()
}

impl Trigger for DriftTrigger {
    fn open(&mut self, db: &rusqlite::Connection) -> crate::Result<()> {
        open_state(db)?;
        db.execute_batch(
            "CREATE TABLE IF NOT EXISTS trig_drift_recent (seq INTEGER PRIMARY KEY, features BLOB NOT NULL);
             CREATE TABLE IF NOT EXISTS trig_drift_ref (pos INTEGER PRIMARY KEY, features BLOB NOT NULL);",
        )
        .map_err(|e| db_error(db, e))?;
        self.recent = load(db, "SELECT features FROM trig_drift_recent ORDER BY seq")?.into();
        self.reference = load(db, "SELECT features FROM trig_drift_ref ORDER BY pos")?;
        self.since_eval = get_state(db, SINCE)?.unwrap_or(0) as usize;
        self.fired = get_state(db, FIRED)?.unwrap_or(0) != 0;
        self.next_seq = get_state(db, NEXT_SEQ)?.unwrap_or(0);
        Ok(())
    }

    fn inform(&mut self, db: &rusqlite::Connection, batch: &[Sample]) -> crate::Result<Vec<usize>> {
        let mut cuts = Vec::new();
        if batch.is_empty() {
            return Ok(cuts);
        }
        let keep = self.keep();
        for (i, s) in batch.iter().enumerate() {
            let f = s.features.clone().ok_or_else(|| {
                crate::Error::plan(format!(
                    "the drift trigger needs features ({:?}) but sample {} has none",
                    self.cfg.feature, s.key
                ))
            })?;
            db.prepare_cached("INSERT INTO trig_drift_recent (seq, features) VALUES (?1, ?2)")
                .and_then(|mut st| st.execute(rusqlite::params![self.next_seq, encode(&f)]))
                .map_err(|e| db_error(db, e))?;
            self.next_seq += 1;
            self.recent.push_back(f);
            if self.recent.len() > keep {
                self.recent.pop_front();
            }
            self.since_eval += 1;
            if self.since_eval < self.cfg.current_size {
                continue;
            }
            self.since_eval = 0;
            if self.fired && self.distance() <= self.cfg.threshold {
                continue;
            }
            cuts.push(i + 1);
            self.fired = true;
            let skip = self.recent.len().saturating_sub(self.cfg.reference_size);
            self.reference = self.recent.iter().skip(skip).cloned().collect();
            db.execute("DELETE FROM trig_drift_ref", [])
                .map_err(|e| db_error(db, e))?;
            let mut st = db
                .prepare_cached("INSERT INTO trig_drift_ref (pos, features) VALUES (?1, ?2)")
                .map_err(|e| db_error(db, e))?;
            for (pos, f) in self.reference.iter().enumerate() {
                st.execute(rusqlite::params![pos as i64, encode(f)])
                    .map_err(|e| db_error(db, e))?;
            }
        }
        db.execute(
            "DELETE FROM trig_drift_recent WHERE seq < ?1",
            [self.next_seq - keep as i64],
        )
        .map_err(|e| db_error(db, e))?;
        set_state(db, SINCE, self.since_eval as i64)?;
        set_state(db, FIRED, self.fired as i64)?;
        set_state(db, NEXT_SEQ, self.next_seq)?;
        Ok(cuts)
    }

    fn features(&self) -> Option<FeatureSource> {
        Some(self.cfg.feature.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{db, with_features};
    use super::*;

    fn cfg(
        metric: DriftMetric,
        reference_size: usize,
        current_size: usize,
        threshold: f64,
    ) -> DriftConfig {
        DriftConfig {
            reference_size,
            current_size,
            metric,
            threshold,
            feature: FeatureSource::Column(2),
            bandwidth: None,
        }
    }

    #[test]
    fn ks_fires_first_then_on_drift() {
        let db = db();
        let mut t = DriftTrigger::new(cfg(DriftMetric::Ks, 4, 4, 0.5)).expect("ok");
        t.open(&db).expect("ok");
        assert_eq!(t.features(), Some(FeatureSource::Column(2)));
        // Windows of 4 across batches of 3: the first evaluation (after the 4th sample) fires.
        assert_eq!(
            t.inform(&db, &with_features(&[1., 2., 3.])).expect("ok"),
            Vec::<usize>::new()
        );
        assert_eq!(
            t.inform(&db, &with_features(&[4., 1., 2.])).expect("ok"),
            vec![1]
        );
        // Reference {1,2,3,4}; current {1,2,3,4}: D = 0, no trigger.
        assert_eq!(
            t.inform(&db, &with_features(&[3., 4.])).expect("ok"),
            Vec::<usize>::new()
        );
        // current {3,4,5,6}: D = 0.5, not above 0.5.
        assert_eq!(
            t.inform(&db, &with_features(&[3., 4., 5., 6.]))
                .expect("ok"),
            Vec::<usize>::new()
        );
        // current {9,9,9,9}: D = 1 -> fires after the 4th; the reference becomes {9,9,9,9}.
        assert_eq!(
            t.inform(&db, &with_features(&[9., 9., 9., 9., 9.]))
                .expect("ok"),
            vec![4]
        );
        // The 5th 9 and these three complete a window {9,9,9,9}: D = 0.
        assert_eq!(
            t.inform(&db, &with_features(&[9., 9., 9.])).expect("ok"),
            Vec::<usize>::new()
        );
        assert_eq!(
            t.inform(&db, &with_features(&[9., 0., 0.])).expect("ok"),
            Vec::<usize>::new()
        );
        // A restart continues three samples into the window: with this 0 the
        // current window is {9,0,0,0}, D = 0.75 against the reference {9,9,9,9}.
        drop(t);
        let mut t = DriftTrigger::new(cfg(DriftMetric::Ks, 4, 4, 0.5)).expect("ok");
        t.open(&db).expect("ok");
        assert_eq!(
            t.inform(&db, &with_features(&[0., 5.])).expect("ok"),
            vec![1]
        );
    }

    #[test]
    fn mmd_with_configured_and_median_bandwidth() {
        let db = db();
        let mut c = cfg(DriftMetric::Mmd, 2, 2, 0.5);
        c.bandwidth = Some(1.0);
        let mut t = DriftTrigger::new(c).expect("ok");
        t.open(&db).expect("ok");
        assert_eq!(
            t.inform(&db, &with_features(&[0., 0.])).expect("ok"),
            vec![2]
        );
        // Reference {0,0}, current {1,1}: MMD² = 2 - 2e^-0.5 = 0.787 > 0.5.
        assert_eq!(
            t.inform(&db, &with_features(&[1., 1.])).expect("ok"),
            vec![2]
        );
        // Reference {1,1}, current {1.5,1.5}: 2 - 2e^-0.125 = 0.235, below.
        assert_eq!(
            t.inform(&db, &with_features(&[1.5, 1.5])).expect("ok"),
            Vec::<usize>::new()
        );
        // Median heuristic, reference_size 4 > current_size 2: the reference
        // after the first trigger holds the last 4 samples seen (only 2 exist).
        let db = super::super::test_util::db();
        let mut t = DriftTrigger::new(cfg(DriftMetric::Mmd, 4, 2, 0.1)).expect("ok");
        t.open(&db).expect("ok");
        assert_eq!(
            t.inform(&db, &with_features(&[0., 1., 0., 1.]))
                .expect("ok"),
            vec![2]
        );
        assert_eq!(t.reference.len(), 2);
        // Same distribution {0,1} vs {0,1}: 0. Then {10,11}: σ = median distance, far -> fires.
        assert_eq!(
            t.inform(&db, &with_features(&[10., 11.])).expect("ok"),
            vec![2]
        );
        assert_eq!(t.reference.len(), 4);
    }

    #[test]
    fn missing_features_and_bad_config_are_errors() {
        let db = db();
        let mut t = DriftTrigger::new(cfg(DriftMetric::Ks, 2, 2, 0.1)).expect("ok");
        t.open(&db).expect("ok");
        let e = t
            .inform(&db, &super::super::test_util::at(&[1]))
            .expect_err("an error")
            .to_string();
        assert!(e.contains("needs features"), "{e}");
        assert!(DriftTrigger::new(cfg(DriftMetric::Ks, 0, 2, 0.1)).is_err());
        assert!(DriftTrigger::new(cfg(DriftMetric::Ks, 2, 0, 0.1)).is_err());
        assert!(DriftTrigger::new(cfg(DriftMetric::Ks, 2, 2, f64::NAN)).is_err());
        let mut c = cfg(DriftMetric::Ks, 2, 2, 0.1);
        c.bandwidth = Some(1.0);
        assert!(
            DriftTrigger::new(c)
                .expect_err("an error")
                .to_string()
                .contains("mmd only")
        );
    }
}
