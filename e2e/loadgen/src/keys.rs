//! Row keys and the key-choice distributions (uniform, zipfian, sequential, latest), after YCSB.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use clap::ValueEnum;

/// How record numbers map to row keys.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum KeyOrder {
    /// `user<16 hex digits>` of a bijective hash of the record number: consecutive records
    /// land far apart (YCSB's default "hashed" insert order; no write hotspot).
    Hashed,
    /// `user<16 decimal digits>`: records in key order, so sequential inserts all land at the
    /// end of the table (the hotspotting pattern Bigtable's schema guide warns about).
    Ordered,
}

/// A bijection on u64 (splitmix64's finaliser): distinct records get distinct keys.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

pub fn row_key(order: KeyOrder, record: u64) -> Bytes {
    match order {
        KeyOrder::Hashed => Bytes::from(format!("user{:016x}", mix(record))),
        KeyOrder::Ordered => Bytes::from(format!("user{record:016}")),
    }
}

/// Fast per-worker PRNG (xorshift64*); not for cryptography.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(mix(seed.wrapping_add(0x9E37_79B9_7F4A_7C15)) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [0, n) (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
}

/// YCSB's ZipfianGenerator (Gray et al., "Quickly generating billion-record synthetic
/// databases"), constant 0.99: item 0 is the most popular.
pub struct Zipfian {
    items: u64,
    theta: f64,
    alpha: f64,
    zetan: f64,
    eta: f64,
}

impl Zipfian {
    pub const THETA: f64 = 0.99;

    pub fn new(items: u64) -> Self {
        let items = items.max(1);
        let theta = Self::THETA;
        let zetan: f64 = (1..=items).map(|i| 1.0 / (i as f64).powf(theta)).sum();
        let zeta2 = 1.0 + 0.5f64.powf(theta);
        let eta = (1.0 - (2.0 / items as f64).powf(1.0 - theta)) / (1.0 - zeta2 / zetan);
        Zipfian {
            items,
            theta,
            alpha: 1.0 / (1.0 - theta),
            zetan,
            eta,
        }
    }

    pub fn sample(&self, rng: &mut Rng) -> u64 {
        let u = rng.next_f64();
        let uz = u * self.zetan;
        if uz < 1.0 {
            return 0;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return 1.min(self.items - 1);
        }
        let v = (self.items as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64;
        v.min(self.items - 1)
    }
}

/// How an operation picks the record it touches.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum Distribution {
    /// Every record equally likely.
    Uniform,
    /// Zipfian (constant 0.99), popular records scattered over the key space (YCSB's
    /// "scrambled zipfian").
    Zipfian,
    /// Records in order, one after the other, shared by all workers (wraps around).
    Sequential,
    /// The most recently inserted records are the most popular (YCSB "latest", workload D).
    Latest,
}

/// Chooses records among `[0, inserted)`; `inserted` grows as insert operations run.
pub struct KeyChooser {
    dist: Distribution,
    zipf: Option<Zipfian>,
    sequence: AtomicU64,
    /// Records that exist (the loaded ones plus inserts made so far).
    pub inserted: Arc<AtomicU64>,
}

impl KeyChooser {
    pub fn new(dist: Distribution, records: u64, inserted: Arc<AtomicU64>) -> Self {
        let zipf = matches!(dist, Distribution::Zipfian | Distribution::Latest)
            .then(|| Zipfian::new(records.max(1)));
        KeyChooser {
            dist,
            zipf,
            sequence: AtomicU64::new(0),
            inserted,
        }
    }

    pub fn next(&self, rng: &mut Rng) -> u64 {
        let n = self.inserted.load(Ordering::Relaxed).max(1);
        match self.dist {
            Distribution::Uniform => rng.below(n),
            Distribution::Zipfian => {
                let z = self.zipf.as_ref().expect("built for zipfian").sample(rng);
                mix(z) % n
            }
            Distribution::Sequential => self.sequence.fetch_add(1, Ordering::Relaxed) % n,
            Distribution::Latest => {
                let z = self.zipf.as_ref().expect("built for latest").sample(rng);
                n - 1 - z.min(n - 1)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_distinct_and_ordered_keys_sort_by_record() {
        let hashed: std::collections::BTreeSet<Bytes> =
            (0..10_000).map(|i| row_key(KeyOrder::Hashed, i)).collect();
        assert_eq!(hashed.len(), 10_000);
        assert!(row_key(KeyOrder::Ordered, 9) < row_key(KeyOrder::Ordered, 10));
    }

    #[test]
    fn zipfian_prefers_small_items_and_stays_in_range() {
        let z = Zipfian::new(1000);
        let mut rng = Rng::new(1);
        let mut counts = vec![0u32; 1000];
        for _ in 0..100_000 {
            counts[z.sample(&mut rng) as usize] += 1;
        }
        assert!(counts[0] > counts[10] && counts[10] > counts[900]);
        assert!(counts[0] > 10_000, "item 0 drew {}", counts[0]);
    }

    #[test]
    fn latest_prefers_recent_records() {
        let inserted = Arc::new(AtomicU64::new(1000));
        let chooser = KeyChooser::new(Distribution::Latest, 1000, inserted);
        let mut rng = Rng::new(2);
        let recent = (0..10_000)
            .filter(|_| chooser.next(&mut rng) >= 900)
            .count();
        assert!(recent > 5_000, "{recent}");
    }

    #[test]
    fn uniform_below_is_in_range() {
        let mut rng = Rng::new(3);
        assert!((0..10_000).all(|_| rng.below(7) < 7));
    }
}
