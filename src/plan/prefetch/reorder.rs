//! [`Reorder`]: under `ordered = true`, the rows of a `PrefetchExec`
//! partition that finished before their turn.
//!
//! Guarantees: the buffer is bounded by bytes: the file bytes of the rows it
//! holds, plus those of the rows in flight that may land in it (every row in
//! flight but the next one due), stay within [`REORDER_WINDOWS`] times the
//! window times the mean bytes of a row started so far (each row counting at
//! least one byte), capped at [`REORDER_MAX_BYTES`] (or two windows' bytes
//! when those are more); a row that would not fit is not admitted, except the
//! next row due, so a single row larger than the bound still proceeds; the
//! buffer's peak is the `reorder_peak_bytes` metric. With a
//! [`Handoff`](super::handoff::Handoff), rows
//! handed on before their turn count against the bound until the operator
//! above settles them.

use std::collections::{BTreeMap, BTreeSet};

use datafusion::physical_plan::metrics::Gauge;

use super::downloads::Fetched;

/// The reorder buffer may hold this many windows' worth of bytes: with a
/// window sized for the mean round trip (~30 ms under the bench's tail model),
/// 32 windows keep requests going through a 1 s stall of the row due. Four
/// windows held them for ~0.1 s of it, and ordered output lost most of each
/// stall to unordered output. The memory pool caps it like every prefetched byte.
pub(super) const REORDER_WINDOWS: usize = 32;

/// ... but no more than this many bytes once the window's own bytes are met
/// (DataFusion's default memory pool is unbounded): at the default
/// `max_connections` of 128 and rows of 256 KiB, 32 windows would be 1 GiB.
/// 256 MiB is still 32 windows of 64 KiB rows at 128 in flight; a window whose
/// own rows are larger keeps twice its bytes.
pub(super) const REORDER_MAX_BYTES: usize = 256 << 20;

/// `ordered = true`: the rows that finished before their turn.
#[derive(Default)]
pub(super) struct Reorder {
    /// The seq of the next row to hand on.
    next: u64,
    /// Finished rows by seq, each with the bytes it counts in `bytes` (0 for
    /// a row that finished in its turn).
    pub(super) done: BTreeMap<u64, (Fetched, usize)>,
    /// Bytes (at least one per row) of the rows in `done`.
    bytes: usize,
    /// Bytes of each row in flight, by seq.
    in_flight: BTreeMap<u64, usize>,
    /// Sum of `in_flight`.
    in_flight_bytes: usize,
    /// Bytes and rows started so far (for the mean row size).
    started_bytes: usize,
    started_rows: usize,
    /// With a handoff: rows handed on before their turn, by seq, with the
    /// bytes they count in `bytes` until the operator above settles them.
    out: BTreeMap<u64, usize>,
    /// With a handoff: rows after `next` that are done with (settled by
    /// the operator above, or dropped).
    settled: BTreeSet<u64>,
}

impl Reorder {
    /// Bytes the buffer may come to hold: what it holds plus every row in
    /// flight except the next one due (handed on as soon as it finishes).
    pub(super) fn committed(&self) -> usize {
        self.bytes + self.in_flight_bytes - self.in_flight.get(&self.next).copied().unwrap_or(0)
    }

    /// The bound on `committed` for a window of `window` rows.
    pub(super) fn limit(&self, window: usize) -> usize {
        let mean = self.started_bytes.div_ceil(self.started_rows.max(1)).max(1);
        let windows = REORDER_WINDOWS.saturating_mul(window).saturating_mul(mean);
        windows.min(REORDER_MAX_BYTES.max(window.saturating_mul(mean).saturating_mul(2)))
    }

    /// Whether row `seq` of `cost` bytes may start now.
    pub(super) fn admits(&self, seq: u64, cost: usize, window: usize) -> bool {
        seq == self.next || self.committed() + cost <= self.limit(window)
    }

    pub(super) fn started(&mut self, seq: u64, cost: usize) {
        self.in_flight.insert(seq, cost);
        self.in_flight_bytes += cost;
        self.started_bytes += cost;
        self.started_rows += 1;
    }

    /// Row `seq`, still in flight, turned out to cost `cost` (its files'
    /// sizes learned from their first responses).
    pub(super) fn resize(&mut self, seq: u64, cost: usize) {
        if let Some(old) = self.in_flight.insert(seq, cost) {
            self.in_flight_bytes = self.in_flight_bytes - old + cost;
            self.started_bytes = self.started_bytes - old + cost;
        }
    }

    /// A row finished: into the buffer (its turn comes out of `pop`).
    pub(super) fn finished(&mut self, f: Fetched, peak: &Gauge) {
        let mut counted = 0;
        if let Some(cost) = self.in_flight.remove(&f.seq) {
            self.in_flight_bytes -= cost;
            if f.seq != self.next {
                counted = cost;
                self.bytes += cost;
                peak.set_max(self.bytes);
            }
        }
        self.done.insert(f.seq, (f, counted));
    }

    /// The next row due, if it finished.
    pub(super) fn pop(&mut self) -> Option<Fetched> {
        let (f, counted) = self.done.remove(&self.next)?;
        self.next += 1;
        self.bytes -= counted;
        Some(f)
    }

    pub(super) fn head_ready(&self) -> bool {
        self.done.contains_key(&self.next)
    }

    /// With a handoff: row `seq` is handed on as it finished; unless it
    /// is the next row due, it counts in `bytes` until settled (as it would
    /// waiting in `done`).
    pub(super) fn handed_early(&mut self, seq: u64, peak: &Gauge) {
        if let Some(cost) = self.in_flight.remove(&seq) {
            self.in_flight_bytes -= cost;
            let counted = if seq == self.next { 0 } else { cost };
            self.bytes += counted;
            peak.set_max(self.bytes);
            self.out.insert(seq, counted);
        }
    }

    /// With a handoff: row `seq` was dropped here or settled above.
    pub(super) fn settle(&mut self, seq: u64) {
        if let Some(cost) = self.in_flight.remove(&seq) {
            self.in_flight_bytes -= cost;
        }
        if let Some(cost) = self.out.remove(&seq) {
            self.bytes -= cost;
        }
        if seq >= self.next {
            self.settled.insert(seq);
        }
        while self.settled.remove(&self.next) {
            self.next += 1;
        }
    }

    /// Whether rows were handed on early and not settled yet, or wait.
    pub(super) fn pending(&self) -> bool {
        !self.out.is_empty() || !self.done.is_empty()
    }
}

/// What a row counts against the reorder bound: its file bytes, at least one.
pub(super) fn cost_of(bytes: usize) -> usize {
    bytes.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fetched(seq: u64, bytes: usize) -> Fetched {
        Fetched {
            seq,
            base: seq,
            row: Ok(None),
            bytes,
            estimated: 0,
            unsized_files: 0,
            learned: 0,
        }
    }

    #[test]
    fn the_reorder_bound_is_capped_in_bytes_but_never_below_two_windows() {
        let mut r = Reorder::default();
        r.started(0, 256 << 10);
        // 32 windows of 128 rows of 256 KiB would be 1 GiB.
        assert_eq!(r.limit(128), REORDER_MAX_BYTES);
        // Small rows: 32 windows, under the cap.
        let mut small = Reorder::default();
        small.started(0, 1 << 10);
        assert_eq!(small.limit(128), 32 * 128 * (1 << 10));
        // Rows so large that two windows exceed the cap: two windows.
        let mut large = Reorder::default();
        large.started(0, 16 << 20);
        assert_eq!(large.limit(64), 2 * 64 * (16 << 20));
    }

    #[test]
    fn the_reorder_buffer_never_holds_more_than_its_bound() {
        // Window 2 of 10-byte rows: the bound is 32 x 2 x 10 = 640 bytes.
        let (mut r, peak) = (Reorder::default(), Gauge::new());
        let mut seq = 0;
        // Row 0 (the head) is slow; everything after it finishes at once.
        while r.admits(seq, 10, 2) {
            r.started(seq, 10);
            if seq > 0 {
                r.finished(fetched(seq, 10), &peak);
            }
            seq += 1;
            assert!(seq < 100, "admitted without bound");
        }
        assert_eq!(r.limit(2), 640);
        assert_eq!(seq, 65, "the head plus 64 rows of 10 bytes fill 640 bytes");
        assert_eq!(peak.value(), 640);
        assert!(r.pop().is_none(), "the head is still in flight");
        r.finished(fetched(0, 10), &peak);
        for want in 0..65 {
            assert_eq!(r.pop().map(|f| f.seq), Some(want));
        }
        assert_eq!((r.bytes, r.committed()), (0, 0));
        assert!(r.admits(seq, 1_000, 2), "the next row due always starts");
    }
}
