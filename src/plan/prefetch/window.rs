//! The window policy of `prefetch = auto`, as pure logic over timestamps so it
//! is tested without a network: [`AutoWindow`] sizes the window from the rows
//! the UDF takes per round trip, [`RoundTrip`] estimates that round trip.
//!
//! Guarantees: the window stays within `1..=max`; it grows at once to `GAIN`
//! times the rows taken per round trip and shrinks by at most one per row taken,
//! so a stall (no row for many round trips) does not collapse it.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Round trips over which the mean rows-per-round-trip is taken.
const HORIZON: u32 = 4;
/// Window = `GAIN` x rows taken per round trip (Little's law with room to grow).
const GAIN: usize = 8;

/// `prefetch = auto`: the window becomes `GAIN` times the rows taken per round
/// trip, or shrinks by one when that is less. Rows per round trip is the larger
/// of the count in the last round trip (so a burst grows the window at once)
/// and the mean over the last `HORIZON` round trips (so the gap between two
/// bursts, when loaded round trips exceed the shortest one, does not read as a
/// slowdown: counted over the last round trip alone, the window shrank to 0.65
/// of the best fixed setting at 64 in flight).
///
/// A rule of "+1 whenever the UDF waited" grows by one per round trip, since
/// the rows of one round trip arrive together and only the first of them finds
/// the UDF waiting: 60 round trips to reach 64 in flight.
#[derive(Debug)]
pub struct AutoWindow {
    /// When the rows of the last `HORIZON` round trips were taken.
    taken: VecDeque<Instant>,
    max: usize,
}

impl AutoWindow {
    pub fn new(max: usize) -> Self {
        Self {
            taken: VecDeque::new(),
            max: max.max(1),
        }
    }

    /// The first window: DataChain's default of 2, within the cap.
    pub fn initial(&self) -> usize {
        2.min(self.max)
    }

    /// A row was taken at `now`; returns the new window given the current one
    /// and the round trip estimate `rtt`.
    pub fn taken(&mut self, now: Instant, rtt: Duration, window: usize) -> usize {
        self.taken.push_back(now);
        while self
            .taken
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) > rtt * HORIZON)
        {
            self.taken.pop_front();
        }
        let last = self.taken.len()
            - self
                .taken
                .partition_point(|t| now.saturating_duration_since(*t) > rtt);
        let mean = self.taken.len().div_ceil(HORIZON as usize);
        // Grow at once, shrink by one row at a time.
        let target = (GAIN * last.max(mean)).clamp(1, self.max);
        target.max(window.saturating_sub(1)).clamp(1, self.max)
    }
}

/// The shortest time to first byte of the last 64 to 128 downloads (a windowed
/// minimum kept as the minima of the current and the previous 64). Time to
/// first byte, not the whole download: when bandwidth is the limit a download
/// takes longer the more run at once, and a window sized by it would feed on
/// itself.
#[derive(Debug, Default)]
pub struct RoundTrip {
    current: Option<Duration>,
    previous: Option<Duration>,
    samples: usize,
}

impl RoundTrip {
    const EPOCH: usize = 64;

    pub fn observe(&mut self, took: Duration) {
        self.current = Some(self.current.map_or(took, |c| c.min(took)));
        self.samples += 1;
        if self.samples == Self::EPOCH {
            self.previous = self.current.take();
            self.samples = 0;
        }
    }

    pub fn get(&self) -> Option<Duration> {
        match (self.current, self.previous) {
            (Some(c), Some(p)) => Some(c.min(p)),
            (c, p) => c.or(p),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RTT: Duration = Duration::from_millis(20);

    /// Takes `n` rows spread evenly over one round trip starting at `t`.
    fn round(w: &mut AutoWindow, t: &mut Instant, window: &mut usize, n: usize) {
        for _ in 0..n {
            *t += RTT / n as u32;
            *window = w.taken(*t, RTT, *window);
        }
    }

    #[test]
    fn grows_eightfold_per_round_trip_while_every_row_is_taken() {
        let mut w = AutoWindow::new(128);
        let (mut t, mut window) = (Instant::now(), w.initial());
        assert_eq!(window, 2);
        let mut seen = vec![window];
        for _ in 0..4 {
            // Downloads are the bottleneck: the whole window arrives per round trip.
            let n = window;
            round(&mut w, &mut t, &mut window, n);
            seen.push(window);
        }
        assert_eq!(seen, vec![2, 16, 128, 128, 128], "{seen:?}");
    }

    #[test]
    fn settles_at_gain_times_what_the_udf_takes() {
        let mut w = AutoWindow::new(1000);
        let (mut t, mut window) = (Instant::now(), 500);
        // The UDF takes 4 rows per round trip, for long enough to shrink.
        for _ in 0..200 {
            round(&mut w, &mut t, &mut window, 4);
        }
        // 4 rows per round trip, 5 when one falls on the round trip's edge.
        assert!((GAIN * 4..=GAIN * 5).contains(&window), "{window}");
    }

    #[test]
    fn shrinks_by_at_most_one_per_row_and_a_stall_does_not_collapse_it() {
        let mut w = AutoWindow::new(128);
        let (mut t, mut window) = (Instant::now(), 2);
        for _ in 0..4 {
            let n = window;
            round(&mut w, &mut t, &mut window, n);
        }
        assert_eq!(window, 128);
        // A one-second stall: nothing is taken for 50 round trips.
        t += Duration::from_secs(1);
        let after = w.taken(t, RTT, window);
        assert_eq!(
            after, 127,
            "one row after a stall shrinks the window by one"
        );
    }

    #[test]
    fn stays_within_one_and_the_cap() {
        for max in [1, 2, 7, 64] {
            let mut w = AutoWindow::new(max);
            let (mut t, mut window) = (Instant::now(), w.initial());
            assert!((1..=max).contains(&window));
            for n in [1, 50, 3, 1000, 1] {
                round(&mut w, &mut t, &mut window, n);
                assert!((1..=max).contains(&window), "max {max}: {window}");
            }
        }
        assert_eq!(AutoWindow::new(0).initial(), 1);
    }

    #[test]
    fn round_trip_is_a_windowed_minimum() {
        let mut r = RoundTrip::default();
        assert_eq!(r.get(), None);
        r.observe(Duration::from_millis(30));
        r.observe(Duration::from_millis(20));
        assert_eq!(r.get(), Some(Duration::from_millis(20)));
        // 64 slower samples end the epoch; the old minimum is kept one more epoch.
        for _ in 0..62 {
            r.observe(Duration::from_millis(50));
        }
        assert_eq!(r.get(), Some(Duration::from_millis(20)));
        for _ in 0..64 {
            r.observe(Duration::from_millis(50));
        }
        assert_eq!(
            r.get(),
            Some(Duration::from_millis(50)),
            "a stale minimum ages out"
        );
    }
}
