//! The autoscaler's decision: how many nodes a cluster with `spec.autoscaling` should run, from
//! samples of its load. Pure: the operator gathers the samples (from Prometheus, or the
//! servers' own reports) and carries the count out through the same scale step as a changed
//! `serveNodes` (so a scale-in drains its servers first and never stops one that owns tablets).
//!
//! Bigtable's semantics (`../shared/OPERATIONS.md`):
//!
//! * Two dimensions, the larger wins. **CPU**: the nodes that would bring the cluster's mean
//!   CPU utilization to the target, `ceil(utilization × nodes / target)`; the product is the
//!   CPU work the cluster does, whichever node does it, so samples taken at different node
//!   counts (or while tablets are still moving to new nodes) compare. **Storage**: the nodes
//!   that keep the bytes stored per node at the storage target, and each node's volume at most
//!   [`STORAGE_HEADROOM`] full.
//! * The result is clamped to `[min, max]`.
//! * **Up optimistically, down pessimistically.** Up as soon as the load has wanted more nodes
//!   for [`Timing::up_window`] (every sample in it; to the least of them: a sustained level, not
//!   a spike). Down only on [`Timing::down_window`] of samples that all want fewer (to the most
//!   of them), never within [`Timing::down_cooldown`] of the last change, and at most
//!   [`Timing::max_down_fraction`] of the nodes per step. A load that oscillates faster than
//!   the down window scales up once and stays up: at most two changes of direction an hour.
//! * No change while the cluster is not settled (a server lost or not ready, a scale-in or
//!   drain under way): its numbers say little then, and a change would pile on the one in
//!   progress. Bounds the user changed are applied at once all the same.

use std::time::{Duration, Instant};

/// The most of a node's volume the storage dimension lets it fill.
pub const STORAGE_HEADROOM: f64 = 0.7;

/// A cluster's autoscaling settings (`spec.autoscaling`, with the storage type's defaults).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Policy {
    pub min_nodes: u32,
    pub max_nodes: u32,
    /// The CPU utilization target, a fraction (0.10 to 0.80).
    pub cpu_target: f64,
    /// The storage target in bytes per node.
    pub storage_target_bytes: u64,
    /// What one node's volume holds (None: unknown, no headroom rule).
    pub node_capacity_bytes: Option<u64>,
}

/// How fast the autoscaler moves.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timing {
    /// How often samples are taken: a window counts as covered when its samples span it but
    /// for one interval.
    pub sample_every: Duration,
    /// How long every sample must want more nodes before a scale-up.
    pub up_window: Duration,
    /// How long every sample must want fewer nodes before a scale-down.
    pub down_window: Duration,
    /// No scale-down within this long of the last change.
    pub down_cooldown: Duration,
    /// The most of the nodes one scale-down removes (at least one node).
    pub max_down_fraction: f64,
}

impl Default for Timing {
    fn default() -> Timing {
        Timing {
            sample_every: Duration::from_secs(15),
            up_window: Duration::from_secs(60),
            down_window: Duration::from_secs(30 * 60),
            down_cooldown: Duration::from_secs(10 * 60),
            max_down_fraction: 0.3,
        }
    }
}

/// One sample of the cluster's load.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    pub at: Instant,
    /// The nodes serving when it was taken.
    pub nodes: u32,
    /// Mean CPU utilization of those nodes against their allocation (1.0: all of it).
    pub cpu: f64,
    /// Bytes the cluster stores.
    pub stored_bytes: u64,
}

/// The dimension that decided a recommendation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dimension {
    Cpu,
    Storage,
}

impl Dimension {
    pub fn name(self) -> &'static str {
        match self {
            Dimension::Cpu => "cpu",
            Dimension::Storage => "storage",
        }
    }
}

/// What one sample asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wanted {
    pub cpu_nodes: u32,
    pub storage_nodes: u32,
}

impl Wanted {
    /// The larger dimension (CPU when they tie).
    pub fn nodes(self) -> (u32, Dimension) {
        if self.storage_nodes > self.cpu_nodes {
            (self.storage_nodes, Dimension::Storage)
        } else {
            (self.cpu_nodes, Dimension::Cpu)
        }
    }
}

/// Why the autoscaler runs another count than the load wants (or none at all).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Held {
    /// The load wants more than `maxServeNodes`.
    AtMax { wanted: u32 },
    /// The load wants fewer than `minServeNodes`.
    AtMin { wanted: u32 },
    /// Not enough samples yet for the change the load asks for.
    Waiting { direction: Direction },
    /// A scale-down waits for the cool-down after the last change.
    CoolingDown { remaining: Duration },
    /// A scale-down limited to a step.
    Stepped { wanted: u32 },
    /// No samples at all.
    NoMetrics,
    /// The cluster is not settled (see the module).
    Unsettled { reason: String },
}

/// Up or down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Up,
    Down,
}

/// The decision, with what it was made of (for the Cluster's status).
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// The nodes to run now.
    pub nodes: u32,
    /// What the newest sample recommends, clamped to the bounds (the current count without
    /// samples).
    pub recommended: u32,
    /// The dimension behind `recommended`.
    pub dimension: Dimension,
    /// The newest sample's inputs and what each dimension wants.
    pub latest: Option<(Sample, Wanted)>,
    /// Why `nodes` differs from what the load wants, if it does.
    pub held: Option<Held>,
}

/// One server's CPU clock, as its status report gave it (`CpuStatus` of the control
/// protocol).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CpuReading {
    /// When its process started (a new value: a restart, the clock started again).
    pub process_started_micros: i64,
    /// When the reading was taken, by the server's clock.
    pub at_micros: i64,
    /// CPU time its process used since it started.
    pub cpu_seconds: f64,
    /// The CPU it is allocated, in cores.
    pub allocation_cores: f64,
}

/// The mean CPU utilization of a cluster's servers between two readings of each: the CPU
/// time they used over the CPU they were allocated meanwhile, and how many servers it counts.
/// A server without two readings of the same process (new, restarted) is left out; None when
/// none has two. Pure.
pub fn utilization<'a, K: Ord + 'a>(
    before: &std::collections::BTreeMap<K, CpuReading>,
    after: impl IntoIterator<Item = (&'a K, &'a CpuReading)>,
) -> Option<(f64, u32)> {
    let (mut used, mut allocated, mut servers) = (0.0, 0.0, 0u32);
    for (server, now) in after {
        let Some(then) = before.get(server) else {
            continue;
        };
        let seconds = (now.at_micros - then.at_micros) as f64 / 1e6;
        if then.process_started_micros != now.process_started_micros || seconds <= 0.0 {
            continue;
        }
        used += (now.cpu_seconds - then.cpu_seconds).max(0.0);
        allocated += now.allocation_cores.max(0.001) * seconds;
        servers += 1;
    }
    (allocated > 0.0).then(|| (used / allocated, servers))
}

/// What one sample wants.
pub fn wanted(policy: &Policy, sample: &Sample) -> Wanted {
    let cpu_work = sample.cpu.max(0.0) * sample.nodes as f64;
    let cpu_nodes = ceil_nodes(cpu_work / policy.cpu_target.max(0.01));
    let mut storage = sample.stored_bytes as f64 / policy.storage_target_bytes.max(1) as f64;
    if let Some(capacity) = policy.node_capacity_bytes {
        storage = storage.max(sample.stored_bytes as f64 / (capacity as f64 * STORAGE_HEADROOM));
    }
    Wanted {
        cpu_nodes,
        storage_nodes: ceil_nodes(storage),
    }
}

/// `x` nodes rounded up, at least one (a hair over a whole number is that number: float
/// noise must not add a node).
fn ceil_nodes(x: f64) -> u32 {
    if !x.is_finite() || x <= 1.0 {
        return 1;
    }
    (x - 1e-9).ceil().min(u32::MAX as f64) as u32
}

/// The nodes to run now, given the samples (oldest first), the count running, when it last
/// changed, and whether the cluster is settled (`Err`: why not). Pure.
pub fn decide(
    policy: &Policy,
    timing: &Timing,
    samples: &[Sample],
    current: u32,
    last_change: Option<Instant>,
    settled: Result<(), String>,
    now: Instant,
) -> Decision {
    let (min, max) = (
        policy.min_nodes.max(1),
        policy.max_nodes.max(policy.min_nodes.max(1)),
    );
    let clamp = |n: u32| n.clamp(min, max);
    let latest = samples.last().map(|s| (*s, wanted(policy, s)));
    let (recommended, dimension) = match latest {
        Some((_, w)) => {
            let (n, d) = w.nodes();
            (clamp(n), d)
        }
        None => (clamp(current), Dimension::Cpu),
    };
    let decision = |nodes: u32, held: Option<Held>| Decision {
        nodes,
        recommended,
        dimension,
        latest,
        held,
    };
    // Bounds first: the user's word, applied whatever the load.
    if current < min || current > max {
        return decision(clamp(current), None);
    }
    if let Err(reason) = settled {
        return decision(current, Some(Held::Unsettled { reason }));
    }
    let Some((_, newest)) = latest else {
        return decision(current, Some(Held::NoMetrics));
    };
    let newest = newest.nodes().0;
    let window = |span: Duration| -> Option<Vec<u32>> {
        let inside: Vec<&Sample> = samples
            .iter()
            .filter(|s| now.saturating_duration_since(s.at) <= span)
            .collect();
        let (first, last) = (inside.first()?, inside.last()?);
        let covered = last.at.saturating_duration_since(first.at) + timing.sample_every >= span;
        covered.then(|| inside.iter().map(|s| wanted(policy, s).nodes().0).collect())
    };
    if newest > current {
        if current == max {
            return decision(current, Some(Held::AtMax { wanted: newest }));
        }
        return match window(timing.up_window) {
            Some(w) if w.iter().all(|&n| n > current) => {
                let sustained = w.into_iter().min().unwrap_or(current);
                let nodes = clamp(sustained);
                let held = (sustained > max).then_some(Held::AtMax { wanted: sustained });
                decision(nodes, held)
            }
            _ => decision(
                current,
                Some(Held::Waiting {
                    direction: Direction::Up,
                }),
            ),
        };
    }
    if newest < current {
        if current == min {
            return decision(current, Some(Held::AtMin { wanted: newest }));
        }
        if let Some(since) = last_change {
            let quiet = now.saturating_duration_since(since);
            if quiet < timing.down_cooldown {
                return decision(
                    current,
                    Some(Held::CoolingDown {
                        remaining: timing.down_cooldown - quiet,
                    }),
                );
            }
        }
        return match window(timing.down_window) {
            Some(w) if w.iter().all(|&n| n < current) => {
                let needed = clamp(w.into_iter().max().unwrap_or(current));
                let step = ((current as f64 * timing.max_down_fraction).floor() as u32).max(1);
                let nodes = needed.max(current.saturating_sub(step)).max(min);
                let held = (nodes > needed).then_some(Held::Stepped { wanted: needed });
                decision(nodes, held)
            }
            _ => decision(
                current,
                Some(Held::Waiting {
                    direction: Direction::Down,
                }),
            ),
        };
    }
    decision(current, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn policy(min: u32, max: u32, cpu: f64) -> Policy {
        Policy {
            min_nodes: min,
            max_nodes: max,
            cpu_target: cpu,
            storage_target_bytes: 2560 * GIB,
            node_capacity_bytes: None,
        }
    }

    /// Samples every 15 s from `start` for `span`, of the utilization `cpu(t)` at `nodes`.
    fn samples(
        start: Instant,
        span: Duration,
        nodes: u32,
        cpu: impl Fn(Duration) -> f64,
    ) -> Vec<Sample> {
        let mut out = Vec::new();
        let mut t = Duration::ZERO;
        while t <= span {
            out.push(Sample {
                at: start + t,
                nodes,
                cpu: cpu(t),
                stored_bytes: 0,
            });
            t += Duration::from_secs(15);
        }
        out
    }

    fn at(start: Instant, s: &[Sample]) -> Instant {
        s.last().map_or(start, |s| s.at)
    }

    #[test]
    fn utilization_is_the_cpu_used_over_the_cpu_allocated() {
        use std::collections::BTreeMap;
        let r = |started: i64, at_s: i64, cpu: f64, cores: f64| CpuReading {
            process_started_micros: started,
            at_micros: at_s * 1_000_000,
            cpu_seconds: cpu,
            allocation_cores: cores,
        };
        let before = BTreeMap::from([("a", r(1, 100, 50.0, 2.0)), ("b", r(1, 100, 10.0, 1.0))]);
        // Over 10 s: a used 10 of its 20 core-seconds, b 5 of 10: 15 of 30.
        let after = BTreeMap::from([("a", r(1, 110, 60.0, 2.0)), ("b", r(1, 110, 15.0, 1.0))]);
        assert_eq!(utilization(&before, &after), Some((0.5, 2)));
        // b restarted (a new process: its clock started again), c is new: a alone.
        let after = BTreeMap::from([
            ("a", r(1, 110, 60.0, 2.0)),
            ("b", r(2, 110, 1.0, 1.0)),
            ("c", r(1, 110, 9.0, 1.0)),
        ]);
        assert_eq!(utilization(&before, &after), Some((0.5, 1)));
        assert_eq!(
            utilization(&before, &BTreeMap::from([("b", r(2, 110, 1.0, 1.0))])),
            None
        );
        assert_eq!(utilization(&BTreeMap::new(), &after), None);
    }

    #[test]
    fn each_dimension_and_the_larger_wins() {
        let p = Policy {
            node_capacity_bytes: Some(1000 * GIB),
            ..policy(1, 100, 0.5)
        };
        let s = |cpu: f64, nodes: u32, stored: u64| Sample {
            at: Instant::now(),
            nodes,
            cpu,
            stored_bytes: stored,
        };
        // 4 nodes at 75 % against 50 %: 6 nodes of CPU work.
        assert_eq!(wanted(&p, &s(0.75, 4, 0)).cpu_nodes, 6);
        // Exactly at target: no extra node from float noise.
        assert_eq!(wanted(&p, &s(0.5, 4, 0)).cpu_nodes, 4);
        assert_eq!(wanted(&p, &s(0.0, 4, 0)).cpu_nodes, 1);
        // Storage: 5,000 GiB against 2,560 per node is 2 nodes, but the 1,000 GiB volumes
        // hold 700 GiB each with headroom: 8.
        let w = wanted(&p, &s(0.1, 4, 5000 * GIB));
        assert_eq!(w.storage_nodes, 8);
        assert_eq!(w.nodes(), (8, Dimension::Storage));
        assert_eq!(wanted(&p, &s(0.9, 4, 0)).nodes(), (8, Dimension::Cpu));
        let unbounded = policy(1, 100, 0.5);
        assert_eq!(wanted(&unbounded, &s(0.1, 4, 5000 * GIB)).storage_nodes, 2);
    }

    #[test]
    fn sustained_load_scales_up_within_the_up_window_to_the_sustained_level() {
        let p = policy(1, 10, 0.5);
        let t = Timing::default();
        let start = Instant::now();
        // 2 nodes at 40 % for two minutes, then 90 % (4 nodes of work) from 120 s.
        let s = samples(start, Duration::from_secs(240), 2, |t| {
            if t < Duration::from_secs(120) {
                0.4
            } else {
                0.9
            }
        });
        let upto = |secs: u64| -> Vec<Sample> {
            s.iter()
                .copied()
                .filter(|x| x.at <= start + Duration::from_secs(secs))
                .collect()
        };
        let d = decide(
            &p,
            &t,
            &upto(150),
            2,
            None,
            Ok(()),
            start + Duration::from_secs(150),
        );
        assert_eq!(d.nodes, 2, "30 s of load is not sustained yet");
        assert_eq!(d.recommended, 4);
        assert_eq!(
            d.held,
            Some(Held::Waiting {
                direction: Direction::Up
            })
        );
        let d = decide(
            &p,
            &t,
            &upto(180),
            2,
            None,
            Ok(()),
            start + Duration::from_secs(180),
        );
        assert_eq!((d.nodes, d.dimension, d.held), (4, Dimension::Cpu, None));
        // A spike in the window: up to the level every sample wanted, not the spike's.
        let mut spiky = upto(180);
        spiky[9].cpu = 2.0;
        let d = decide(
            &p,
            &t,
            &spiky,
            2,
            None,
            Ok(()),
            start + Duration::from_secs(180),
        );
        assert_eq!(d.nodes, 4);
        // One sample alone is never a sustained load.
        let one = [s[12]];
        let d = decide(&p, &t, &one, 2, None, Ok(()), one[0].at);
        assert_eq!(d.nodes, 2);
    }

    #[test]
    fn bounds_clamp_and_say_so() {
        let p = policy(2, 5, 0.5);
        let t = Timing::default();
        let start = Instant::now();
        let s = samples(start, Duration::from_secs(120), 4, |_| 1.0); // 8 nodes of work
        let now = at(start, &s);
        let d = decide(&p, &t, &s, 4, None, Ok(()), now);
        assert_eq!(d.nodes, 5);
        assert_eq!(d.recommended, 5);
        assert_eq!(d.held, Some(Held::AtMax { wanted: 8 }));
        let d = decide(&p, &t, &s, 5, None, Ok(()), now);
        assert_eq!((d.nodes, d.held), (5, Some(Held::AtMax { wanted: 8 })));
        // Idle at the minimum.
        let idle = samples(start, Duration::from_secs(3600), 2, |_| 0.0);
        let d = decide(&p, &t, &idle, 2, None, Ok(()), at(start, &idle));
        assert_eq!((d.nodes, d.held), (2, Some(Held::AtMin { wanted: 1 })));
        // Bounds changed under a running cluster apply at once, settled or not.
        let d = decide(
            &p,
            &t,
            &idle,
            9,
            None,
            Err("moving".into()),
            at(start, &idle),
        );
        assert_eq!(d.nodes, 5);
        let d = decide(&p, &t, &[], 1, None, Ok(()), start);
        assert_eq!(d.nodes, 2);
    }

    #[test]
    fn scale_down_waits_for_the_window_and_the_cool_down_and_goes_in_steps() {
        let p = policy(1, 20, 0.5);
        let t = Timing::default();
        let start = Instant::now();
        // 10 nodes at 10 %: 2 nodes of work, for 40 minutes.
        let s = samples(start, Duration::from_secs(40 * 60), 10, |_| 0.1);
        let upto = |mins: u64| -> Vec<Sample> {
            s.iter()
                .copied()
                .filter(|x| x.at <= start + Duration::from_secs(mins * 60))
                .collect()
        };
        let now = |mins: u64| start + Duration::from_secs(mins * 60);
        // 20 minutes of samples: not the 30 the window asks.
        let d = decide(&p, &t, &upto(20), 10, None, Ok(()), now(20));
        assert_eq!((d.nodes, d.recommended), (10, 2));
        assert_eq!(
            d.held,
            Some(Held::Waiting {
                direction: Direction::Down
            })
        );
        // 30 minutes: down, but by at most 30 % (3 of 10).
        let d = decide(&p, &t, &upto(30), 10, None, Ok(()), now(30));
        assert_eq!((d.nodes, d.held), (7, Some(Held::Stepped { wanted: 2 })));
        // Within 10 minutes of that change: nothing.
        let d = decide(&p, &t, &upto(35), 7, Some(now(30)), Ok(()), now(35));
        assert_eq!(d.nodes, 7);
        assert!(
            matches!(d.held, Some(Held::CoolingDown { remaining }) if remaining == Duration::from_secs(300))
        );
        // After it: the next step (30 % of 7 is 2).
        let d = decide(&p, &t, &upto(40), 7, Some(now(30)), Ok(()), now(40));
        assert_eq!(d.nodes, 5);
        // A minute of load in the window keeps it: down only when every sample wants fewer.
        let mut busy = upto(40);
        busy[100].cpu = 0.6;
        let d = decide(&p, &t, &busy, 7, Some(now(30)), Ok(()), now(40));
        assert_eq!(d.nodes, 7);
    }

    #[test]
    fn nothing_changes_while_the_cluster_is_not_settled_or_without_metrics() {
        let p = policy(1, 10, 0.5);
        let t = Timing::default();
        let start = Instant::now();
        let s = samples(start, Duration::from_secs(300), 2, |_| 1.0);
        let now = at(start, &s);
        let d = decide(
            &p,
            &t,
            &s,
            2,
            None,
            Err("server c-1 is not ready".into()),
            now,
        );
        assert_eq!(d.nodes, 2);
        assert_eq!(d.recommended, 4, "the recommendation is still shown");
        assert_eq!(
            d.held,
            Some(Held::Unsettled {
                reason: "server c-1 is not ready".into()
            })
        );
        let d = decide(&p, &t, &[], 2, None, Ok(()), now);
        assert_eq!((d.nodes, d.held), (2, Some(Held::NoMetrics)));
        // Old samples only (the source went quiet): a window is not covered by them.
        let d = decide(&p, &t, &s, 2, None, Ok(()), now + Duration::from_secs(600));
        assert_eq!(d.nodes, 2);
    }

    /// Simulates the autoscaler every 15 s over `hours` of a load that needs `work(t)` nodes
    /// of CPU at 50 %, the cluster answering at once; returns the node counts it ran.
    fn simulate(hours: u64, work: impl Fn(Duration) -> f64) -> Vec<(Duration, u32)> {
        let p = policy(1, 20, 0.5);
        let t = Timing::default();
        let start = Instant::now();
        let mut nodes = 2u32;
        let mut last_change = None;
        let mut history: Vec<Sample> = Vec::new();
        let mut out = vec![(Duration::ZERO, nodes)];
        let mut at = Duration::ZERO;
        while at <= Duration::from_secs(hours * 3600) {
            let now = start + at;
            history.push(Sample {
                at: now,
                nodes,
                cpu: work(at) * 0.5 / nodes as f64,
                stored_bytes: 0,
            });
            let d = decide(&p, &t, &history, nodes, last_change, Ok(()), now);
            if d.nodes != nodes {
                nodes = d.nodes;
                last_change = Some(now);
                out.push((at, nodes));
            }
            at += t.sample_every;
        }
        out
    }

    fn direction_changes(counts: &[(Duration, u32)]) -> usize {
        let mut changes = 0;
        let mut last: Option<bool> = None;
        for w in counts.windows(2) {
            let up = w[1].1 > w[0].1;
            if last.is_some_and(|l| l != up) {
                changes += 1;
            }
            last = Some(up);
        }
        changes
    }

    #[test]
    fn an_oscillating_load_changes_direction_at_most_twice_an_hour() {
        // 20 minutes at 8 nodes of work, 20 minutes at 2, for four hours.
        let counts = simulate(4, |t| {
            if (t.as_secs() / 1200) % 2 == 0 {
                8.0
            } else {
                2.0
            }
        });
        assert_eq!(counts[1].1, 8, "up to the load: {counts:?}");
        assert!(counts[1].0 <= Duration::from_secs(60), "{counts:?}");
        assert!(direction_changes(&counts) <= 2 * 4, "{counts:?}");
        // It stays up: 20 minutes of quiet never make the 30-minute window.
        assert!(counts[1..].iter().all(|&(_, n)| n >= 8), "{counts:?}");
        // A slow oscillation (two hours up, two hours down) follows the load, down in steps
        // of at most 30 %, 10 minutes apart.
        let counts = simulate(8, |t| {
            if (t.as_secs() / 7200) % 2 == 0 {
                8.0
            } else {
                2.0
            }
        });
        assert!(counts.iter().any(|&(_, n)| n == 2), "{counts:?}");
        assert!(direction_changes(&counts) <= 2 * 8, "{counts:?}");
        for w in counts.windows(2) {
            if w[1].1 < w[0].1 {
                assert!(w[0].1 - w[1].1 <= (w[0].1 as f64 * 0.3).floor().max(1.0) as u32);
            }
        }
    }
}
