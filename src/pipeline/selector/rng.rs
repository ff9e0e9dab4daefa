//! The selector's seeded random numbers: SplitMix64, written out so a seed
//! gives the same sets on every platform and every version of the crate graph.

/// SplitMix64.
#[derive(Clone, Debug)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// An independent stream for `stream` (a partition, a label, a purpose).
    pub(crate) fn fork(&self, stream: u64) -> Self {
        let mut r = Self(self.0 ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03));
        Self(r.next_u64())
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in 0..n (n > 0), by multiply-shift.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Uniform in (0, 1].
    pub(crate) fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }
}

/// Selection sampling (Knuth's Algorithm S): offered `left` items one by one,
/// takes exactly `need` of them (if need <= left), each subset equally likely,
/// in O(1) memory.
#[derive(Clone, Debug)]
pub(crate) struct Sampler {
    pub need: u64,
    pub left: u64,
}

impl Sampler {
    pub(crate) fn new(need: u64, left: u64) -> Self {
        Self {
            need: need.min(left),
            left,
        }
    }

    pub(crate) fn take(&mut self, rng: &mut Rng) -> bool {
        if self.left == 0 {
            return false;
        }
        let take = self.need > 0 && (self.need == self.left || rng.below(self.left) < self.need);
        self.left -= 1;
        if take {
            self.need -= 1;
        }
        take
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampler_takes_exactly_need_and_is_seeded() {
        for (need, left) in [(0, 5), (3, 10), (10, 10), (12, 10)] {
            let mut rng = Rng::new(7);
            let mut s = Sampler::new(need, left);
            let taken: Vec<u64> = (0..left).filter(|_| s.take(&mut rng)).collect();
            assert_eq!(taken.len() as u64, need.min(left));
            let mut rng = Rng::new(7);
            let mut s = Sampler::new(need, left);
            assert_eq!(
                taken,
                (0..left).filter(|_| s.take(&mut rng)).collect::<Vec<_>>()
            );
        }
        // Each of 4 items is taken about half the time when 2 of 4 are needed.
        let mut rng = Rng::new(1);
        let mut hits = [0u32; 4];
        for _ in 0..4000 {
            let mut s = Sampler::new(2, 4);
            for h in &mut hits {
                *h += s.take(&mut rng) as u32;
            }
        }
        assert!(hits.iter().all(|h| (1800..2200).contains(h)), "{hits:?}");
    }
}
