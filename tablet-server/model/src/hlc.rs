//! Write versions: a hybrid logical clock plus the id of the cluster that accepted the write.
//!
//! Every cell and every delete carries a [`Version`]. Versions order writes to the same row
//! (a delete hides exactly the cells whose version is older) and will decide conflicts between
//! replicated clusters (last writer wins, ties broken by cluster id), so every cluster converges
//! to the same state whatever order replicated writes arrive in.
//!
//! The clock value is in microseconds since the Unix epoch. It never goes backwards and never
//! repeats: each allocation takes `max(wall clock, last + 1)`, so under bursts the logical part
//! spills into the physical part (at most by the number of versions handed out ahead of the
//! wall clock) and catches up as soon as the burst ends.

use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Version {
    /// Hybrid logical clock, microseconds since the epoch.
    pub hlc: u64,
    /// Id of the cluster that accepted the write.
    pub cluster: u16,
}

/// Current wall-clock time in microseconds since the Unix epoch.
pub fn now_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

#[derive(Debug)]
pub struct HybridClock {
    last: AtomicU64,
    /// The cluster's number in its instance (the tiebreaker of equal clock values): fixed at
    /// creation, or set once a cluster server learns it ([`HybridClock::set_cluster`]).
    cluster: AtomicU16,
}

impl HybridClock {
    pub fn new(cluster: u16) -> Self {
        Self {
            last: AtomicU64::new(0),
            cluster: AtomicU16::new(cluster),
        }
    }

    /// Makes sure future versions are greater than `seen` (used at start-up with the highest
    /// version found on disk, so a clock that went backwards across a restart is harmless).
    pub fn observe(&self, seen: u64) {
        self.last.fetch_max(seen, Ordering::SeqCst);
    }

    /// Allocates `n` consecutive versions and returns the first; `n` must be at least 1.
    pub fn allocate(&self, n: u64) -> Version {
        let n = n.max(1);
        let wall = now_micros().max(0) as u64;
        let mut last = self.last.load(Ordering::SeqCst);
        loop {
            let first = wall.max(last + 1);
            match self.last.compare_exchange_weak(
                last,
                first + n - 1,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => {
                    return Version {
                        hlc: first,
                        cluster: self.cluster(),
                    };
                }
                Err(actual) => last = actual,
            }
        }
    }

    /// The current clock reading without allocating (every version handed out so far is ≤ it).
    pub fn current(&self) -> u64 {
        let wall = now_micros().max(0) as u64;
        wall.max(self.last.load(Ordering::SeqCst))
    }

    pub fn cluster(&self) -> u16 {
        self.cluster.load(Ordering::Relaxed)
    }

    /// Versions allocated from now on carry `cluster` (a cluster server sets its cluster's
    /// number, from the coordination store, before it serves).
    pub fn set_cluster(&self, cluster: u16) {
        self.cluster.store(cluster, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_unique_and_increasing() {
        let clock = HybridClock::new(3);
        let mut prev = clock.allocate(1);
        for n in [1, 5, 100_000, 1] {
            let v = clock.allocate(n);
            assert!(v.hlc > prev.hlc);
            assert_eq!(v.cluster, 3);
            prev = Version {
                hlc: v.hlc + n - 1,
                ..v
            };
        }
        assert!(clock.current() >= prev.hlc);
    }

    #[test]
    fn observe_moves_clock_past_seen_versions() {
        let clock = HybridClock::new(1);
        let future = (now_micros() as u64) + 10_000_000_000;
        clock.observe(future);
        assert!(clock.allocate(1).hlc > future);
    }

    #[test]
    fn concurrent_allocations_never_collide() {
        let clock = std::sync::Arc::new(HybridClock::new(0));
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let c = clock.clone();
                std::thread::spawn(move || {
                    (0..10_000).map(|_| c.allocate(2).hlc).collect::<Vec<_>>()
                })
            })
            .collect();
        let mut all: Vec<u64> = handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        all.sort();
        for w in all.windows(2) {
            assert!(w[1] >= w[0] + 2, "overlapping allocations");
        }
    }
}
