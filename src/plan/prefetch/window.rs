//! The window policy of `prefetch = auto`, as pure logic over timestamps so it
//! is tested without a network: [`AutoWindow`] sizes the window from the rows
//! the UDF takes per round trip, [`RoundTrip`] estimates that round trip.
//!
//! Guarantees: the window stays within `1..=max`; it grows at once to `GAIN`
//! times the rows taken per *mean* round trip and shrinks by at most one per row
//! taken, so a stall (no row for many round trips) does not collapse it, and a
//! long-tailed latency (p99 several times p50) does not starve it: sized by
//! the median or the minimum round trip, the window would hold fewer requests
//! than Little's law needs and shrink as the rate it lets through falls.

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

/// The mean time to first byte of the last [`RoundTrip::SAMPLES`] downloads.
/// The mean, not the median or the minimum: by Little's law the requests in
/// flight a rate needs are that rate times the *mean* round trip, and under a
/// long-tailed latency (p99 several times p50, rare stalls) the mean is well
/// above the median and the minimum several times below it; a window sized by
/// the minimum starves and shrinks as it starves. Time to first byte, not the
/// whole download: when bandwidth is the limit a download takes longer the
/// more run at once, and a window sized by it would feed on itself.
#[derive(Debug, Default)]
pub struct RoundTrip {
    samples: VecDeque<Duration>,
    sum: Duration,
}

impl RoundTrip {
    pub const SAMPLES: usize = 128;

    pub fn observe(&mut self, took: Duration) {
        self.samples.push_back(took);
        self.sum += took;
        if self.samples.len() > Self::SAMPLES
            && let Some(old) = self.samples.pop_front()
        {
            self.sum -= old;
        }
    }

    pub fn get(&self) -> Option<Duration> {
        let n = u32::try_from(self.samples.len()).ok().filter(|&n| n > 0)?;
        Some(self.sum / n)
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
    fn round_trip_is_the_mean_of_the_recent_samples() {
        let mut r = RoundTrip::default();
        assert_eq!(r.get(), None);
        r.observe(Duration::from_millis(30));
        r.observe(Duration::from_millis(10));
        assert_eq!(r.get(), Some(Duration::from_millis(20)));
        // One 1 s stall among 127 samples of 20 ms weighs 1/128 of the mean.
        r.observe(Duration::from_secs(1));
        for _ in 0..(RoundTrip::SAMPLES * 2) {
            r.observe(Duration::from_millis(20));
        }
        assert_eq!(
            r.get(),
            Some(Duration::from_millis(20)),
            "old samples age out"
        );
    }

    /// Seeded lognormal round trips with p50 20 ms and p99 150 ms (the
    /// bench's tail model without its stalls), via xorshift and Box-Muller.
    fn lognormal(seed: u64) -> impl FnMut() -> Duration {
        let mut x = seed.max(1);
        let mut uniform = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        };
        let sigma = (150.0f64 / 20.0).ln() / 2.326;
        move || {
            let z = (-2.0 * uniform().ln()).sqrt() * (std::f64::consts::TAU * uniform()).cos();
            Duration::from_secs_f64(0.020 * (sigma * z).exp())
        }
    }

    /// Runs `rows` downloads through the policy: each row is taken as soon as
    /// its download finishes (downloads are the bottleneck; unordered), and
    /// `latency` draws each download's round trip. Returns the window after
    /// each row taken and the mean round trip drawn.
    fn simulate(
        max: usize,
        rows: usize,
        mut latency: impl FnMut(usize) -> Duration,
    ) -> (Vec<usize>, Duration) {
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;
        let t0 = Instant::now();
        let (mut auto, mut rtt) = (AutoWindow::new(max), RoundTrip::default());
        let mut window = auto.initial();
        let (mut started, mut drawn) = (0usize, Duration::ZERO);
        let mut in_flight: BinaryHeap<Reverse<(Duration, Duration)>> = BinaryHeap::new();
        let mut start = |at: Duration, heap: &mut BinaryHeap<_>, started: &mut usize| {
            let took = latency(*started);
            drawn += took;
            *started += 1;
            heap.push(Reverse((at + took, took)));
        };
        while started < window.min(rows) {
            start(Duration::ZERO, &mut in_flight, &mut started);
        }
        let mut seen = Vec::with_capacity(rows);
        while let Some(Reverse((at, took))) = in_flight.pop() {
            rtt.observe(took);
            window = auto.taken(t0 + at, rtt.get().expect("a sample"), window);
            seen.push(window);
            while in_flight.len() < window && started < rows {
                start(at, &mut in_flight, &mut started);
            }
        }
        (seen, drawn / rows as u32)
    }

    #[test]
    fn lognormal_round_trips_grow_the_window_to_the_cap_and_keep_it_there() {
        let mut draw = lognormal(42);
        let (seen, mean) = simulate(128, 4000, |_| draw());
        assert!(
            mean > Duration::from_millis(25),
            "the tail lifts the mean above the 20 ms median: {mean:?}"
        );
        let reached = seen
            .iter()
            .position(|&w| w == 128)
            .expect("reaches the cap");
        assert!(reached < 200, "cap reached after {reached} rows");
        let after = *seen[reached..].iter().min().expect("rows");
        assert!(
            after >= 120,
            "the window fell to {after} after reaching 128"
        );
    }

    #[test]
    fn a_one_second_stall_does_not_shrink_the_window_for_the_rest_of_the_run() {
        let mut draw = lognormal(7);
        // Download 2000 stalls for a second.
        let (seen, _) = simulate(64, 6000, |i| {
            if i == 2000 {
                Duration::from_secs(1)
            } else {
                draw()
            }
        });
        let before = seen[1500..2000].iter().copied().min().expect("rows");
        assert_eq!(before, 64, "at the cap before the stall");
        // Up to the last 200 rows, where the run drains and fewer are taken.
        let after = seen[2000..5800].iter().copied().min().expect("rows");
        assert!(after >= 63, "after the stall the window fell to {after}");
    }

    #[test]
    fn a_stall_in_the_middle_of_ordered_output_leaves_the_window_where_it_was() {
        // Ordered output: nothing is taken for a second, then the rows held
        // behind the stalled one come at once and the steady rate resumes.
        let (mut auto, mut rtt) = (AutoWindow::new(128), RoundTrip::default());
        let (mut t, mut window) = (Instant::now(), auto.initial());
        let mut draw = lognormal(3);
        let mut steady = |auto: &mut AutoWindow,
                          rtt: &mut RoundTrip,
                          t: &mut Instant,
                          window: &mut usize,
                          rounds: usize| {
            let mut lowest = usize::MAX;
            for _ in 0..rounds {
                let n = *window;
                for _ in 0..n {
                    rtt.observe(draw());
                    let mean = rtt.get().expect("a sample");
                    *t += mean / n as u32;
                    *window = auto.taken(*t, mean, *window);
                    lowest = lowest.min(*window);
                }
            }
            lowest
        };
        steady(&mut auto, &mut rtt, &mut t, &mut window, 20);
        assert_eq!(window, 128);
        rtt.observe(Duration::from_secs(1));
        t += Duration::from_secs(1);
        for _ in 0..100 {
            window = auto.taken(t, rtt.get().expect("a sample"), window);
        }
        let lowest = steady(&mut auto, &mut rtt, &mut t, &mut window, 50);
        assert!(lowest >= 127, "the window fell to {lowest} after the stall");
        assert_eq!(window, 128);
    }

    #[test]
    fn a_udf_bound_window_covers_the_mean_round_trip_not_the_median() {
        // The UDF takes 1000 rows/s; round trips are lognormal. Little's law
        // needs 1000/s x mean round trip in flight; the window must be above it.
        let (mut auto, mut rtt) = (AutoWindow::new(1000), RoundTrip::default());
        let (mut t, mut window) = (Instant::now(), auto.initial());
        let mut draw = lognormal(11);
        let (mut lowest, mut drawn) = (usize::MAX, Duration::ZERO);
        for i in 0..20_000 {
            let took = draw();
            drawn += took;
            rtt.observe(took);
            t += Duration::from_millis(1);
            window = auto.taken(t, rtt.get().expect("a sample"), window);
            if i > 1000 {
                lowest = lowest.min(window);
            }
        }
        let need = (1000.0 * (drawn / 20_000).as_secs_f64()).ceil() as usize;
        assert!(
            need > 20,
            "the mean is above the median: {need} in flight needed"
        );
        assert!(
            lowest >= need,
            "window {lowest} < {need} needed by Little's law"
        );
        assert!(
            lowest <= GAIN * 2 * need,
            "window {lowest} far above what is needed ({need})"
        );
    }
}
