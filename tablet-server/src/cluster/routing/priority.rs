//! Request priorities (Bigtable's standard isolation: an app profile's HIGH, MEDIUM or LOW):
//! admission at the server that received a request. HIGH requests are always admitted. While
//! the server is busy with HIGH traffic (a HIGH request in flight, or one finished within
//! [`Limits::busy_window`]):
//!
//! * at most [`Limits::medium_when_busy`] MEDIUM and [`Limits::low_when_busy`] LOW requests run
//!   at once on it, and LOW also yields to MEDIUM; the others wait;
//! * the bytes MEDIUM and LOW requests write are paced ([`Limits::medium_write_bytes_per_sec`],
//!   [`Limits::low_write_bytes_per_sec`]; LOW also while MEDIUM requests run): a write waits
//!   until the bytes written before it at its priority fit the rate ([`paced`]). Limiting how
//!   many run at once is not enough: a few LOW batches of 100 rows write megabytes a second, and
//!   the flushes and compactions that leave behind slow HIGH requests long after the batches
//!   were answered.
//!
//! So a LOW batch job slows down before HIGH traffic does, and runs at full speed when nothing
//! else does. A request holds its admission until its response is complete (a stream: until it
//! ends), wherever it is served.

use std::sync::Arc;
use std::time::{Duration, Instant};

use basalt_meta::AppProfilePriority as Priority;
use parking_lot::Mutex;
use tokio::sync::Notify;

/// See the module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub busy_window: Duration,
    pub medium_when_busy: usize,
    pub low_when_busy: usize,
    pub medium_write_bytes_per_sec: u64,
    pub low_write_bytes_per_sec: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            busy_window: Duration::from_millis(200),
            medium_when_busy: 8,
            low_when_busy: 2,
            medium_write_bytes_per_sec: 1 << 20,
            low_write_bytes_per_sec: 128 << 10,
        }
    }
}

impl Limits {
    /// The rate `priority`'s writes are paced to while the server is pressed (see the module);
    /// None for HIGH, never paced.
    fn write_rate(&self, priority: Priority) -> Option<u64> {
        match priority {
            Priority::High => None,
            Priority::Medium => Some(self.medium_write_bytes_per_sec),
            Priority::Low => Some(self.low_write_bytes_per_sec),
        }
    }
}

/// When a write of `bytes` paced to `rate` bytes a second may start, and when the next one
/// may (the new `next_free`), given the `next_free` the writes before it left: at once when
/// their bytes are done by `now`, else when they are. Pure.
pub fn paced(
    next_free: Option<Instant>,
    now: Instant,
    bytes: u64,
    rate: u64,
) -> (Instant, Instant) {
    let start = next_free.map_or(now, |t| t.max(now));
    let takes = Duration::from_secs_f64(bytes as f64 / rate.max(1) as f64);
    (start, start + takes)
}

/// Requests in flight by priority, when the last HIGH one finished, and when the bytes
/// MEDIUM and LOW requests wrote while paced are done ([`paced`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InFlight {
    pub high: usize,
    pub medium: usize,
    pub low: usize,
    pub high_done: Option<Instant>,
    pub medium_free: Option<Instant>,
    pub low_free: Option<Instant>,
}

impl InFlight {
    fn busy(&self, now: Instant, limits: &Limits) -> bool {
        self.high > 0
            || self
                .high_done
                .is_some_and(|t| now.saturating_duration_since(t) < limits.busy_window)
    }

    /// Whether requests of `priority` yield now: MEDIUM to HIGH traffic, LOW to either.
    fn pressed(&self, priority: Priority, now: Instant, limits: &Limits) -> bool {
        match priority {
            Priority::High => false,
            Priority::Medium => self.busy(now, limits),
            Priority::Low => self.busy(now, limits) || self.medium > 0,
        }
    }

    fn free(&mut self, priority: Priority) -> Option<&mut Option<Instant>> {
        match priority {
            Priority::High => None,
            Priority::Medium => Some(&mut self.medium_free),
            Priority::Low => Some(&mut self.low_free),
        }
    }
}

/// Whether a request of `priority` may start now. Pure.
pub fn admits(inflight: &InFlight, priority: Priority, now: Instant, limits: &Limits) -> bool {
    let pressed = inflight.pressed(priority, now, limits);
    match priority {
        Priority::High => true,
        Priority::Medium => !pressed || inflight.medium < limits.medium_when_busy,
        Priority::Low => !pressed || inflight.low < limits.low_when_busy,
    }
}

/// How long an admitted request of `priority` writing `bytes` waits for its pace, recording
/// its bytes in `inflight`. Pure: no pacing, and no debt carried on, while not pressed.
pub fn pace(
    inflight: &mut InFlight,
    priority: Priority,
    bytes: u64,
    now: Instant,
    limits: &Limits,
) -> Duration {
    let pressed = inflight.pressed(priority, now, limits);
    let (Some(rate), Some(free)) = (limits.write_rate(priority), inflight.free(priority)) else {
        return Duration::ZERO;
    };
    if !pressed {
        *free = None;
        return Duration::ZERO;
    }
    if bytes == 0 {
        return Duration::ZERO;
    }
    let (start, next) = paced(*free, now, bytes, rate);
    *free = Some(next);
    start.saturating_duration_since(now)
}

/// The admission of one server (see the module).
pub struct Admission {
    inflight: Mutex<InFlight>,
    freed: Notify,
    limits: Limits,
}

/// An admitted request: released when dropped.
pub struct Admitted {
    admission: Arc<Admission>,
    priority: Priority,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        {
            let mut f = self.admission.inflight.lock();
            match self.priority {
                Priority::High => {
                    f.high -= 1;
                    f.high_done = Some(Instant::now());
                }
                Priority::Medium => f.medium -= 1,
                Priority::Low => f.low -= 1,
            }
        }
        self.admission.freed.notify_waiters();
    }
}

impl Admission {
    pub fn new(limits: Limits) -> Arc<Admission> {
        Arc::new(Admission {
            inflight: Mutex::new(InFlight::default()),
            freed: Notify::new(),
            limits,
        })
    }

    /// Waits until a request of `priority` writing `bytes` may start (see the module); how
    /// long it waited (zero when it was admitted at once).
    pub async fn admit(self: &Arc<Self>, priority: Priority, bytes: u64) -> (Admitted, Duration) {
        let started = Instant::now();
        let mut first = true;
        loop {
            // Registered before the check, so a release between the check and the wait is
            // not missed; the busy window also ends by time, hence the timeout.
            let freed = self.freed.notified();
            let admitted = {
                let mut f = self.inflight.lock();
                let now = Instant::now();
                admits(&f, priority, now, &self.limits).then(|| {
                    match priority {
                        Priority::High => f.high += 1,
                        Priority::Medium => f.medium += 1,
                        Priority::Low => f.low += 1,
                    }
                    let pace = pace(&mut f, priority, bytes, now, &self.limits);
                    let admitted = Admitted {
                        admission: self.clone(),
                        priority,
                    };
                    (admitted, pace)
                })
            };
            if let Some((admitted, pace)) = admitted {
                if !pace.is_zero() {
                    tokio::time::sleep(pace).await;
                }
                let waited = if first && pace.is_zero() {
                    Duration::ZERO
                } else {
                    started.elapsed()
                };
                return (admitted, waited);
            }
            first = false;
            let _ = tokio::time::timeout(self.limits.busy_window / 4, freed).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn high_always_runs_and_low_yields_while_high_is_busy() {
        let limits = Limits::default();
        let now = Instant::now();
        let idle = InFlight::default();
        for p in [Priority::High, Priority::Medium, Priority::Low] {
            assert!(
                admits(&idle, p, now, &limits),
                "{p:?} runs on an idle server"
            );
        }
        let busy = InFlight {
            high: 1,
            low: limits.low_when_busy,
            medium: limits.medium_when_busy,
            ..InFlight::default()
        };
        assert!(admits(&busy, Priority::High, now, &limits));
        assert!(!admits(&busy, Priority::Medium, now, &limits));
        assert!(!admits(&busy, Priority::Low, now, &limits));
        // Many LOW requests alone run freely.
        let lows = InFlight {
            low: 50,
            ..InFlight::default()
        };
        assert!(admits(&lows, Priority::Low, now, &limits));
        // LOW yields to MEDIUM too.
        let mediums = InFlight {
            medium: 1,
            low: limits.low_when_busy,
            ..InFlight::default()
        };
        assert!(!admits(&mediums, Priority::Low, now, &limits));
        // Busy for a while after the last HIGH request finished.
        let after = InFlight {
            low: limits.low_when_busy,
            high_done: Some(now),
            ..InFlight::default()
        };
        assert!(!admits(
            &after,
            Priority::Low,
            now + limits.busy_window / 2,
            &limits
        ));
        assert!(admits(
            &after,
            Priority::Low,
            now + limits.busy_window,
            &limits
        ));
    }

    #[test]
    fn writes_are_paced_only_while_pressed() {
        let limits = Limits::default();
        let now = Instant::now();
        let mib = 1 << 20;
        // Alone, LOW writes run at once, however many bytes.
        let mut alone = InFlight::default();
        for _ in 0..10 {
            assert_eq!(
                pace(&mut alone, Priority::Low, 8 * mib, now, &limits),
                Duration::ZERO
            );
        }
        assert_eq!(alone.low_free, None, "no debt carried on");
        // Next to HIGH traffic, LOW's bytes go at its rate: the first write at once, each
        // next one once the bytes before it are done.
        let mut busy = InFlight {
            high: 1,
            ..InFlight::default()
        };
        let rate = limits.low_write_bytes_per_sec;
        assert_eq!(
            pace(&mut busy, Priority::Low, rate / 2, now, &limits),
            Duration::ZERO
        );
        let second = pace(&mut busy, Priority::Low, rate / 2, now, &limits);
        assert_eq!(second, Duration::from_millis(500));
        let third = pace(&mut busy, Priority::Low, rate, now, &limits);
        assert_eq!(third, Duration::from_secs(1));
        // A read (no bytes written) is not paced; HIGH never is.
        assert_eq!(
            pace(&mut busy, Priority::Low, 0, now, &limits),
            Duration::ZERO
        );
        assert_eq!(
            pace(&mut busy, Priority::High, 8 * mib, now, &limits),
            Duration::ZERO
        );
        // MEDIUM has its own, faster pace, and is not paced by MEDIUM traffic alone.
        let medium = pace(
            &mut busy,
            Priority::Medium,
            2 * limits.medium_write_bytes_per_sec,
            now,
            &limits,
        );
        assert_eq!(medium, Duration::ZERO);
        let medium = pace(&mut busy, Priority::Medium, 1, now, &limits);
        assert_eq!(medium, Duration::from_secs(2));
        let mut mediums = InFlight {
            medium: 3,
            ..InFlight::default()
        };
        assert_eq!(
            pace(&mut mediums, Priority::Medium, 8 * mib, now, &limits),
            Duration::ZERO
        );
        assert_eq!(
            pace(&mut mediums, Priority::Medium, 8 * mib, now, &limits),
            Duration::ZERO
        );
        // ... but LOW yields to MEDIUM.
        pace(&mut mediums, Priority::Low, rate, now, &limits);
        assert_eq!(
            pace(&mut mediums, Priority::Low, 1, now, &limits),
            Duration::from_secs(1)
        );
        // Time passing pays the debt off.
        let later = now + Duration::from_secs(5);
        assert_eq!(
            pace(&mut busy, Priority::Low, rate, later, &limits),
            Duration::ZERO
        );
    }

    #[test]
    fn paced_starts_when_the_bytes_before_are_done() {
        let now = Instant::now();
        let (start, next) = paced(None, now, 500, 1000);
        assert_eq!((start, next), (now, now + Duration::from_millis(500)));
        let (start, next) = paced(Some(next), now, 250, 1000);
        assert_eq!(start, now + Duration::from_millis(500));
        assert_eq!(next, now + Duration::from_millis(750));
        // Bytes done in the past leave no credit.
        let later = now + Duration::from_secs(10);
        assert_eq!(paced(Some(next), later, 0, 1000), (later, later));
    }

    #[tokio::test]
    async fn a_low_write_next_to_high_traffic_waits_for_its_pace() {
        let limits = Limits {
            low_write_bytes_per_sec: 1000,
            ..Limits::default()
        };
        let admission = Admission::new(limits);
        let (high, _) = admission.admit(Priority::High, 0).await;
        let (first, waited) = admission.admit(Priority::Low, 100).await;
        assert_eq!(waited, Duration::ZERO);
        drop(first);
        let (_second, waited) = admission.admit(Priority::Low, 100).await;
        assert!(waited >= Duration::from_millis(90), "{waited:?}");
        drop(high);
    }

    #[tokio::test]
    async fn a_waiting_low_request_starts_when_high_traffic_ends() {
        let limits = Limits {
            busy_window: Duration::from_millis(40),
            medium_when_busy: 1,
            low_when_busy: 1,
            ..Limits::default()
        };
        let admission = Admission::new(limits);
        let (high, _) = admission.admit(Priority::High, 0).await;
        let (low, waited) = admission.admit(Priority::Low, 0).await;
        assert_eq!(waited.as_millis(), 0, "the first LOW one runs");
        let a = admission.clone();
        let second = tokio::spawn(async move { a.admit(Priority::Low, 0).await.1 });
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(
            !second.is_finished(),
            "a second LOW one waits while HIGH runs"
        );
        drop(low);
        let waited = second.await.unwrap();
        assert!(waited >= Duration::from_millis(30), "{waited:?}");
        drop(high);
    }
}
