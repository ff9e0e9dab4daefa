//! `amount(n)`: a trigger fires after every n-th sample, counted across batch
//! boundaries. The count since the last trigger is the whole state
//! (`trig_state.amount_seen`).

use super::{FeatureSource, Trigger, bad_setting, get_state, open_state, set_state};
use crate::pipeline::sample::Sample;

const SEEN: &str = "amount_seen";

/// Fires after every `num_samples` samples.
#[derive(Debug)]
pub struct AmountTrigger {
    every: u64,
    seen: u64,
}

impl AmountTrigger {
    pub fn new(num_samples: u64) -> crate::Result<Self> {
        if num_samples == 0 {
            return Err(bad_setting(
                "trigger.amount.num_samples",
                0,
                "must be at least 1",
            ));
        }
        Ok(Self {
            every: num_samples,
            seen: 0,
        })
    }
}

impl Trigger for AmountTrigger {
    fn open(&mut self, db: &rusqlite::Connection) -> crate::Result<()> {
        open_state(db)?;
        self.seen = get_state(db, SEEN)?.unwrap_or(0) as u64;
        Ok(())
    }

    fn inform(&mut self, db: &rusqlite::Connection, batch: &[Sample]) -> crate::Result<Vec<usize>> {
        let mut cuts = Vec::new();
        // The first cut is where the count since the last trigger reaches n.
        let mut next = (self.every - self.seen) as usize;
        while next <= batch.len() {
            cuts.push(next);
            next += self.every as usize;
        }
        self.seen = (self.seen + batch.len() as u64) % self.every;
        set_state(db, SEEN, self.seen as i64)?;
        Ok(cuts)
    }

    fn features(&self) -> Option<FeatureSource> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{at, db};
    use super::*;

    #[test]
    fn every_n_across_batch_boundaries() {
        let db = db();
        let mut t = AmountTrigger::new(3).expect("ok");
        t.open(&db).expect("ok");
        // Samples 1..=10 in batches of 2, 4, 0, 1, 3: triggers after samples 3, 6, 9.
        assert_eq!(
            t.inform(&db, &at(&[1, 2])).expect("ok"),
            Vec::<usize>::new()
        );
        assert_eq!(t.inform(&db, &at(&[3, 4, 5, 6])).expect("ok"), vec![1, 4]);
        assert_eq!(t.inform(&db, &[]).expect("ok"), Vec::<usize>::new());
        assert_eq!(t.inform(&db, &at(&[7])).expect("ok"), Vec::<usize>::new());
        assert_eq!(t.inform(&db, &at(&[8, 9, 10])).expect("ok"), vec![2]);
        // n = 1 fires after every sample; a batch ending exactly on n cuts at its end.
        let mut one = AmountTrigger::new(1).expect("ok");
        let db1 = super::super::test_util::db();
        one.open(&db1).expect("ok");
        assert_eq!(
            one.inform(&db1, &at(&[1, 2, 3])).expect("ok"),
            vec![1, 2, 3]
        );
    }

    #[test]
    fn a_new_instance_continues_the_count() {
        let db = db();
        let mut t = AmountTrigger::new(4).expect("ok");
        t.open(&db).expect("ok");
        assert_eq!(t.inform(&db, &at(&[1, 2, 3, 4, 5])).expect("ok"), vec![4]);
        // A new instance over the same db (the old one is shadowed).
        let mut t = AmountTrigger::new(4).expect("ok");
        t.open(&db).expect("ok");
        // One sample counted since the trigger: the next fires after 3 more.
        assert_eq!(t.inform(&db, &at(&[6, 7, 8, 9])).expect("ok"), vec![3]);
    }

    #[test]
    fn zero_is_rejected() {
        let e = AmountTrigger::new(0).expect_err("an error").to_string();
        assert!(e.contains("num_samples") && e.contains("at least 1"), "{e}");
    }
}
