//! `time(every)`: boundaries on sample timestamps. The first boundary is the
//! first sample's timestamp + every; a sample whose timestamp is >= the next
//! boundary fires a trigger before it (so a trigger can fall before a batch's
//! first sample), once per boundary passed: several boundaries inside one gap
//! each fire. The next boundary is the whole state (`trig_state.time_next`).

use super::{FeatureSource, Trigger, bad_setting, get_state, open_state, set_state};
use crate::pipeline::sample::Sample;

const NEXT: &str = "time_next";

/// Parses "30s", "5m", "2h", "1d", "1w" into seconds (> 0).
pub fn parse_every(text: &str) -> crate::Result<i64> {
    let bad = |reason: &str| bad_setting("trigger.time.every", text, reason);
    let t = text.trim();
    let split = t.char_indices().last().map_or(0, |(i, _)| i);
    let (digits, unit) = (&t[..split], &t[split..]);
    let unit = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 604_800,
        _ => {
            return Err(bad(
                "must be a number with a unit s, m, h, d or w (e.g. \"30s\", \"1d\")",
            ));
        }
    };
    let n: i64 = digits
        .parse()
        .map_err(|_| bad("must be a number with a unit s, m, h, d or w (e.g. \"30s\", \"1d\")"))?;
    if n <= 0 {
        return Err(bad("must be more than 0"));
    }
    n.checked_mul(unit).ok_or_else(|| bad("is too large"))
}

/// Fires at every `every` seconds of sample time.
#[derive(Debug)]
pub struct TimeTrigger {
    every: i64,
    next: Option<i64>,
}

impl TimeTrigger {
    /// `every` in seconds, > 0 (see [`parse_every`]).
    pub fn new(every: i64) -> Self {
        Self {
            every: every.max(1),
            next: None,
        }
    }
}

impl Trigger for TimeTrigger {
    fn open(&mut self, db: &rusqlite::Connection) -> crate::Result<()> {
        open_state(db)?;
        self.next = get_state(db, NEXT)?;
        Ok(())
    }

    fn inform(&mut self, db: &rusqlite::Connection, batch: &[Sample]) -> crate::Result<Vec<usize>> {
        let mut cuts = Vec::new();
        for (i, s) in batch.iter().enumerate() {
            let mut next = *self
                .next
                .get_or_insert(s.timestamp.saturating_add(self.every));
            while s.timestamp >= next {
                cuts.push(i);
                next = next.saturating_add(self.every);
            }
            self.next = Some(next);
        }
        if let Some(next) = self.next {
            set_state(db, NEXT, next)?;
        }
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
    fn units_parse() {
        assert_eq!(parse_every("30s").expect("ok"), 30);
        assert_eq!(parse_every("5m").expect("ok"), 300);
        assert_eq!(parse_every("2h").expect("ok"), 7200);
        assert_eq!(parse_every("1d").expect("ok"), 86_400);
        assert_eq!(parse_every("1w").expect("ok"), 604_800);
        for bad in [
            "",
            "s",
            "10",
            "0s",
            "-1h",
            "1y",
            "1.5h",
            "1µ",
            "µ",
            "99999999999999999w",
        ] {
            let e = parse_every(bad).expect_err("an error").to_string();
            assert!(e.starts_with("trigger.time.every"), "{bad}: {e}");
        }
    }

    #[test]
    fn boundaries_from_the_first_timestamp() {
        let db = db();
        let mut t = TimeTrigger::new(10);
        t.open(&db).expect("ok");
        // First boundary 100 + 10 = 110. 110 itself belongs to the next interval.
        assert_eq!(
            t.inform(&db, &at(&[100, 105, 109, 110, 115])).expect("ok"),
            vec![3]
        );
        // Next boundary 120: it falls before this batch's first sample.
        assert_eq!(t.inform(&db, &at(&[121, 125])).expect("ok"), vec![0]);
        // An empty batch changes nothing.
        assert_eq!(t.inform(&db, &[]).expect("ok"), Vec::<usize>::new());
        // A gap over boundaries 130, 140, 150: three triggers before 155.
        assert_eq!(
            t.inform(&db, &at(&[129, 155, 156])).expect("ok"),
            vec![1, 1, 1]
        );
    }

    #[test]
    fn a_new_instance_continues_from_the_next_boundary() {
        let db = db();
        let mut t = TimeTrigger::new(60);
        t.open(&db).expect("ok");
        assert_eq!(
            t.inform(&db, &at(&[0, 30])).expect("ok"),
            Vec::<usize>::new()
        );
        // A new instance over the same db (the old one is shadowed).
        let mut t = TimeTrigger::new(60);
        t.open(&db).expect("ok");
        // Boundary 60 (not 30 + 60): the first timestamp was seen before the restart.
        assert_eq!(
            t.inform(&db, &at(&[59, 60, 119, 120])).expect("ok"),
            vec![1, 3]
        );
    }
}
