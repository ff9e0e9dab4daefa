//! The epoch plan's arithmetic: partitions of a row count, seeded permutations
//! and the split of a partition's rows among (rank, worker) consumers.
//!
//! Guarantees (all pure, unit-tested below):
//! - partitions cover `0..rows` in dataset order, each of `1..=partition_rows`
//!   rows, none empty;
//! - [`permutation`] is a permutation of `0..n`, a function of its seed only
//!   (splitmix64 + Fisher-Yates, no dependency whose output may change);
//! - [`share`] splits `n` rows among `w` consumers Modyn's way: consumer `c`
//!   gets a contiguous run, the first `n % w` consumers one row more than the
//!   others, an empty run when `n < w`; the runs of all consumers tile `0..n`.

use std::ops::Range;

/// Row ranges `[start, end)` of the partitions of `rows` rows, `size` at most each.
pub(crate) fn partitions(rows: usize, size: usize) -> Vec<Range<usize>> {
    (0..rows.div_ceil(size.max(1)))
        .map(|j| j * size..((j + 1) * size).min(rows))
        .collect()
}

/// The rows of `0..n` consumer `c` of `w` reads (Modyn's split).
pub(crate) fn share(n: usize, w: usize, c: usize) -> Range<usize> {
    let w = w.max(1);
    let (base, extra) = (n / w, n % w);
    let start = c * base + c.min(extra);
    start..start + base + usize::from(c < extra)
}

/// splitmix64: a well-mixed 64-bit step (Steele, Lea, Flood 2014).
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The seed of one shuffle: the loader's seed, the epoch and what is shuffled
/// (`u64::MAX` for the partition order, the source partition's number for its rows).
pub(crate) fn seed_of(seed: u64, epoch: u64, what: u64) -> u64 {
    let mut s = seed;
    let a = splitmix(&mut s);
    let mut s = a ^ epoch;
    let b = splitmix(&mut s);
    let mut s = b ^ what;
    splitmix(&mut s)
}

/// A permutation of `0..n` drawn from `seed`.
pub(crate) fn permutation(n: usize, seed: u64) -> Vec<usize> {
    let mut out: Vec<usize> = (0..n).collect();
    let mut state = seed;
    for i in (1..n).rev() {
        // Multiply-shift maps the 64-bit draw to 0..=i without modulo bias worth noting.
        let j = ((u128::from(splitmix(&mut state)) * (i as u128 + 1)) >> 64) as usize;
        out.swap(i, j);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_cover_rows_in_order() {
        assert_eq!(partitions(10, 4), vec![0..4, 4..8, 8..10]);
        assert_eq!(partitions(8, 4), vec![0..4, 4..8]);
        assert!(partitions(0, 4).is_empty());
        assert_eq!(partitions(3, 1000), vec![0..3]);
    }

    #[test]
    fn shares_tile_and_follow_modyn() {
        for n in 0..40 {
            for w in 1..9 {
                let runs: Vec<_> = (0..w).map(|c| share(n, w, c)).collect();
                let mut next = 0;
                for (c, r) in runs.iter().enumerate() {
                    assert_eq!(r.start, next, "n={n} w={w} c={c}");
                    let want = n / w + usize::from(c < n % w);
                    assert_eq!(r.len(), want);
                    next = r.end;
                }
                assert_eq!(next, n);
            }
        }
        assert_eq!(share(2, 5, 4), 2..2, "an empty share is valid");
    }

    #[test]
    fn permutations_are_permutations_and_seeded() {
        for n in [0, 1, 2, 7, 100] {
            let mut p = permutation(n, 42);
            p.sort_unstable();
            assert_eq!(p, (0..n).collect::<Vec<_>>());
        }
        assert_eq!(permutation(50, 1), permutation(50, 1));
        assert_ne!(permutation(50, 1), permutation(50, 2));
        assert_ne!(seed_of(7, 0, 3), seed_of(7, 1, 3));
        assert_ne!(seed_of(7, 0, 3), seed_of(7, 0, 4));
        assert_eq!(seed_of(7, 2, 3), seed_of(7, 2, 3));
    }
}
