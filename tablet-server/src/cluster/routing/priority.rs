//! Request priorities (Bigtable's standard isolation: an app profile's HIGH, MEDIUM or LOW):
//! admission at the server that received a request. HIGH requests are always admitted. While
//! the server is busy with HIGH traffic (a HIGH request in flight, or one finished within
//! [`Limits::busy_window`]), at most [`Limits::medium_when_busy`] MEDIUM and
//! [`Limits::low_when_busy`] LOW requests run at once on it, and LOW also yields to MEDIUM; the
//! others wait. So a LOW batch job slows down before HIGH traffic does, and runs at full speed
//! when nothing else does. A request holds its admission until its response is complete (a
//! stream: until it ends), wherever it is served.

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
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            busy_window: Duration::from_millis(200),
            medium_when_busy: 8,
            low_when_busy: 2,
        }
    }
}

/// Requests in flight by priority, and when the last HIGH one finished.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InFlight {
    pub high: usize,
    pub medium: usize,
    pub low: usize,
    pub high_done: Option<Instant>,
}

impl InFlight {
    fn busy(&self, now: Instant, limits: &Limits) -> bool {
        self.high > 0
            || self
                .high_done
                .is_some_and(|t| now.saturating_duration_since(t) < limits.busy_window)
    }
}

/// Whether a request of `priority` may start now. Pure.
pub fn admits(inflight: &InFlight, priority: Priority, now: Instant, limits: &Limits) -> bool {
    let busy = inflight.busy(now, limits);
    match priority {
        Priority::High => true,
        Priority::Medium => !busy || inflight.medium < limits.medium_when_busy,
        Priority::Low => {
            let pressed = busy || inflight.medium > 0;
            !pressed || inflight.low < limits.low_when_busy
        }
    }
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

    /// Waits until a request of `priority` may start; how long it waited (zero when it was
    /// admitted at once).
    pub async fn admit(self: &Arc<Self>, priority: Priority) -> (Admitted, Duration) {
        let started = Instant::now();
        let mut first = true;
        loop {
            // Registered before the check, so a release between the check and the wait is
            // not missed; the busy window also ends by time, hence the timeout.
            let freed = self.freed.notified();
            {
                let mut f = self.inflight.lock();
                if admits(&f, priority, Instant::now(), &self.limits) {
                    match priority {
                        Priority::High => f.high += 1,
                        Priority::Medium => f.medium += 1,
                        Priority::Low => f.low += 1,
                    }
                    let waited = if first {
                        Duration::ZERO
                    } else {
                        started.elapsed()
                    };
                    return (
                        Admitted {
                            admission: self.clone(),
                            priority,
                        },
                        waited,
                    );
                }
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

    #[tokio::test]
    async fn a_waiting_low_request_starts_when_high_traffic_ends() {
        let limits = Limits {
            busy_window: Duration::from_millis(40),
            medium_when_busy: 1,
            low_when_busy: 1,
        };
        let admission = Admission::new(limits);
        let (high, _) = admission.admit(Priority::High).await;
        let (low, waited) = admission.admit(Priority::Low).await;
        assert_eq!(waited.as_millis(), 0, "the first LOW one runs");
        let a = admission.clone();
        let second = tokio::spawn(async move { a.admit(Priority::Low).await.1 });
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
