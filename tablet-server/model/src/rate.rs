//! A byte-rate limit: a token bucket that callers ask how long to wait before they send, with
//! the clock passed in (no I/O, no sleeping here). The replication shipper and the master's
//! seeding copy both pace their batches with it (`docs/replication.md`, "Rate limits").
//!
//! The bucket holds up to one second of the rate. A batch may be larger than that: taking it
//! leaves the bucket in debt, and the wait is how long the debt takes to be paid off. So
//! whatever the batch sizes, `n` bytes taken from a full bucket are all sent no sooner than
//! `(n - rate) / rate` seconds after the first: a lower bound callers (and tests) rely on.

use std::time::{Duration, Instant};

/// The smallest batch [`TokenBucket::batch_bytes`] suggests: a very low rate still sends
/// batches worth their overhead.
pub const MIN_BATCH_BYTES: u64 = 16 << 10;

/// A token bucket of bytes per second, or no limit.
#[derive(Clone, Debug)]
pub struct TokenBucket {
    /// Bytes per second; None: unlimited.
    rate: Option<u64>,
    /// Bytes that may be sent now (negative: a debt).
    tokens: f64,
    /// When `tokens` was last brought up to date.
    at: Instant,
}

impl TokenBucket {
    /// A full bucket of `rate` bytes per second (None or 0: unlimited) at `now`.
    pub fn new(rate: Option<u64>, now: Instant) -> TokenBucket {
        let rate = rate.filter(|r| *r > 0);
        TokenBucket {
            rate,
            tokens: rate.unwrap_or(0) as f64,
            at: now,
        }
    }

    /// The rate, None when unlimited.
    pub fn rate(&self) -> Option<u64> {
        self.rate
    }

    /// Changes the rate (None or 0: unlimited) at `now`; what was earned at the old rate stays
    /// (up to one second of the new one), and so does a debt.
    pub fn set_rate(&mut self, rate: Option<u64>, now: Instant) {
        let rate = rate.filter(|r| *r > 0);
        if rate == self.rate {
            return;
        }
        self.refill(now);
        self.rate = rate;
        match rate {
            Some(r) => self.tokens = self.tokens.min(r as f64),
            None => self.tokens = 0.0,
        }
    }

    /// Takes `bytes` at `now`, and says how long to wait before sending them (zero when
    /// unlimited or when the bucket holds them).
    pub fn take(&mut self, bytes: u64, now: Instant) -> Duration {
        let Some(rate) = self.rate else {
            return Duration::ZERO;
        };
        self.refill(now);
        self.tokens -= bytes as f64;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / rate as f64)
        }
    }

    /// How many bytes a batch should carry at most, given the caller's own `max`: one second
    /// of the rate (at least [`MIN_BATCH_BYTES`]), so a batch is never a long burst.
    pub fn batch_bytes(&self, max: u64) -> u64 {
        match self.rate {
            Some(r) => max.min(r.max(MIN_BATCH_BYTES)),
            None => max,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = self.at.max(now);
        if let Some(rate) = self.rate {
            self.tokens = (self.tokens + elapsed * rate as f64).min(rate as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// Equal within a microsecond (the bucket counts in floating point).
    fn near(got: Duration, want: Duration) {
        let diff = got.abs_diff(want);
        assert!(diff < Duration::from_micros(1), "{got:?} is not {want:?}");
    }

    #[test]
    fn unlimited_never_waits() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(None, t0);
        assert_eq!(b.take(u64::MAX / 2, t0), Duration::ZERO);
        assert_eq!(b.batch_bytes(4 << 20), 4 << 20);
        let mut zero = TokenBucket::new(Some(0), t0);
        assert_eq!(zero.rate(), None);
        assert_eq!(zero.take(1 << 30, t0), Duration::ZERO);
    }

    #[test]
    fn a_full_bucket_lends_one_second_then_paces() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(Some(1000), t0);
        assert_eq!(b.take(1000, t0), Duration::ZERO);
        // Empty: 500 bytes more are due in half a second.
        near(b.take(500, t0), 500 * MS);
        // 200 ms later the debt is 300 bytes, and 100 more make it 400.
        near(b.take(100, t0 + 200 * MS), 400 * MS);
    }

    #[test]
    fn a_batch_larger_than_the_bucket_is_a_debt() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(Some(1000), t0);
        near(b.take(3000, t0), 2000 * MS);
        // Sent after the wait: the next one waits for its own bytes only.
        near(b.take(1000, t0 + 2000 * MS), 1000 * MS);
    }

    #[test]
    fn an_idle_bucket_fills_up_to_one_second_only() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(Some(1000), t0);
        assert_eq!(b.take(1000, t0), Duration::ZERO);
        let later = t0 + Duration::from_secs(60);
        assert_eq!(b.take(1000, later), Duration::ZERO);
        near(b.take(1000, later), 1000 * MS);
    }

    #[test]
    fn a_clock_going_backwards_earns_nothing() {
        let t0 = Instant::now() + Duration::from_secs(10);
        let mut b = TokenBucket::new(Some(1000), t0);
        assert_eq!(b.take(1000, t0), Duration::ZERO);
        near(b.take(1000, t0 - Duration::from_secs(5)), 1000 * MS);
    }

    #[test]
    fn changing_the_rate_keeps_the_debt_and_caps_the_credit() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(Some(10_000), t0);
        b.set_rate(Some(1000), t0);
        // The credit was 10 000 bytes: only one second of the new rate is kept.
        near(b.take(2000, t0), 1000 * MS);
        b.set_rate(Some(2000), t0);
        // The debt of 1000 bytes stays: at the new rate it is paid in half a second.
        near(b.take(0, t0), 500 * MS);
        b.set_rate(None, t0);
        assert_eq!(b.take(1 << 20, t0), Duration::ZERO);
        b.set_rate(Some(1000), t0);
        near(b.take(500, t0), 500 * MS);
    }

    #[test]
    fn sending_n_bytes_takes_at_least_n_minus_one_second_over_the_rate() {
        // The bound the e2e tests rely on: whatever the batch sizes, sending each batch
        // after its wait, the last one leaves no sooner than (n - rate) / rate.
        for sizes in [vec![100u64; 50], vec![3000, 1, 2500, 700, 900], vec![7000]] {
            let t0 = Instant::now();
            let mut b = TokenBucket::new(Some(1000), t0);
            let mut now = t0;
            for size in &sizes {
                now += b.take(*size, now);
            }
            let n: u64 = sizes.iter().sum();
            let bound = Duration::from_secs_f64((n - 1000) as f64 / 1000.0);
            assert!(
                now - t0 >= bound - MS,
                "{sizes:?}: {:?} < {bound:?}",
                now - t0
            );
        }
    }

    #[test]
    fn batches_are_one_second_of_the_rate() {
        let t0 = Instant::now();
        assert_eq!(
            TokenBucket::new(Some(100 << 10), t0).batch_bytes(4 << 20),
            100 << 10
        );
        assert_eq!(
            TokenBucket::new(Some(1), t0).batch_bytes(4 << 20),
            MIN_BATCH_BYTES
        );
        assert_eq!(
            TokenBucket::new(Some(1 << 30), t0).batch_bytes(4 << 20),
            4 << 20
        );
    }
}
