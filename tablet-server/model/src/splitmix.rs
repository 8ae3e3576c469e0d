//! SplitMix64 (Steele, Lea, Flood 2014): a small, fast generator and its finaliser, for what
//! needs numbers that look random but are reproducible (sampling choices, fixtures, test and
//! benchmark data). Not for anything secret.

/// The generator's increment (the golden ratio in 64 bits).
pub const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// SplitMix64's finaliser: a bijection on `u64` that spreads every input bit over the output.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The generator: its state moves by [`GAMMA`] per number, each number the state mixed.
#[derive(Clone, Debug)]
pub struct SplitMix(pub u64);

impl SplitMix {
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GAMMA);
        mix(self.0)
    }

    /// Below `n` (> 0); the modulo's bias is negligible for small `n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Uniform in (0, 1].
    pub fn unit(&mut self) -> f64 {
        ((self.next() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_sequence() {
        // SplitMix64 seeded with 0: the first outputs of the reference implementation.
        let mut g = SplitMix(0);
        assert_eq!(g.next(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(g.next(), 0x6e78_9e6a_a1b9_65f4);
        assert_eq!(mix(0), 0);
        let u = SplitMix(1).unit();
        assert!(u > 0.0 && u <= 1.0);
    }
}
