//! The autoscaler, as the master runs it for every cluster whose lifecycle recorded autoscaling
//! settings (`clusters/<c>/autoscaling`, from the Cluster's `spec.autoscaling`): every
//! [`Timing::sample_every`] a sample of the cluster's load — from Prometheus when the master
//! has one ([`crate::prometheus`]), else (or when it does not answer) from the servers' own
//! reports over the control protocol — then the pure decision
//! ([`basalt_master::autoscale::decide`]) recorded in etcd (`clusters/<c>/autoscaler`, fenced
//! by the term). The cluster's lifecycle, on Kubernetes and in the local runtime alike, runs
//! the decided count through the same scale step as a changed `serveNodes`: a scale-in drains
//! first and never stops a server that owns tablets.
//!
//! The count the autoscaler reasons from is its own last decision: a decision the lifecycle
//! has not carried out yet (the count not recorded for the master, servers not all up, or
//! leaving ones still running) leaves the cluster unsettled, and nothing more is decided
//! until it has.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use basalt_master::autoscale::{
    CpuReading, Decision, Direction, Held, Policy, Sample, Timing, decide, utilization,
};
use basalt_master::model::{self, ServerId, TabletState};
use basalt_master::{ClusterView, key_of};
use basalt_meta::{AutoscalerRecord, AutoscalingRecord, Meta, Term};
use tracing::info;

use crate::prometheus::{ClusterQueries, Prometheus};

/// Where the autoscaler's samples come from.
pub const SOURCE_PROMETHEUS: &str = "prometheus";
pub const SOURCE_SERVERS: &str = "servers";

/// The autoscaler's timing from the environment (`docs/autoscaling.md`): the defaults are
/// Bigtable's; tests and demonstrations shorten them.
pub fn timing_from_env() -> Timing {
    let secs = |name: &str| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|v| *v > 0.0)
            .map(Duration::from_secs_f64)
    };
    let mut t = Timing::default();
    if let Some(v) = secs("BASALT_AUTOSCALE_SAMPLE_SECS") {
        t.sample_every = v;
    }
    if let Some(v) = secs("BASALT_AUTOSCALE_UP_WINDOW_SECS") {
        t.up_window = v;
    }
    if let Some(v) = secs("BASALT_AUTOSCALE_DOWN_WINDOW_SECS") {
        t.down_window = v;
    }
    if let Some(v) = secs("BASALT_AUTOSCALE_DOWN_COOLDOWN_SECS") {
        t.down_cooldown = v;
    }
    t
}

/// The autoscaler of one master term: its samples per cluster.
pub struct Autoscaler {
    timing: Timing,
    /// The Prometheus server to ask (Err: the configured URL is unusable, and why).
    prometheus: Option<Result<Prometheus, String>>,
    namespace: String,
    instance: String,
    clusters: HashMap<String, Samples>,
}

#[derive(Default)]
struct Samples {
    samples: VecDeque<Sample>,
    /// The servers' CPU clocks at the last sample (the fallback's utilization is the CPU used
    /// between two samples).
    readings: BTreeMap<ServerId, CpuReading>,
    last_sample: Option<Instant>,
    /// The decision as last written (or read, at the term's first pass).
    written: Option<AutoscalerRecord>,
    read: bool,
    /// Where the newest sample came from, and why not Prometheus.
    source: Option<(&'static str, Option<String>)>,
}

impl Autoscaler {
    /// `report_interval`: how often the master reads the servers' reports (the fallback's
    /// samples cannot come faster).
    pub fn new(
        namespace: &str,
        instance: &str,
        prometheus_url: Option<&str>,
        report_interval: Duration,
    ) -> Autoscaler {
        let mut timing = timing_from_env();
        timing.sample_every = timing.sample_every.max(report_interval);
        Autoscaler {
            timing,
            prometheus: prometheus_url
                .filter(|u| !u.trim().is_empty())
                .map(Prometheus::new),
            namespace: namespace.into(),
            instance: instance.into(),
            clusters: HashMap::new(),
        }
    }

    /// One look at `cluster`: a sample if one is due, the decision, and the decision recorded
    /// when it changed. `cpu`: the servers' CPU clocks from their latest reports.
    pub async fn run(
        &mut self,
        meta: &Meta,
        term: &Term,
        cluster: &str,
        view: &ClusterView,
        cpu: &BTreeMap<ServerId, CpuReading>,
    ) -> model::Result<()> {
        let labels = [self.namespace.as_str(), self.instance.as_str(), cluster];
        let Some(settings) = meta.autoscaling(cluster).await? else {
            if self.clusters.remove(cluster).is_some() {
                crate::metrics::autoscaler(labels, None);
            }
            return Ok(());
        };
        let policy = policy(&settings);
        let recorded = meta.serve_nodes(cluster).await?;
        let state = self.clusters.entry(cluster.to_string()).or_default();
        if !state.read {
            state.written = meta.autoscaler(cluster).await?;
            state.read = true;
        }
        let ready = view.servers.values().filter(|s| s.ready).count() as u32;
        let current = state
            .written
            .as_ref()
            .map(|w| w.nodes)
            .or(recorded)
            .unwrap_or(ready);
        let settled = settled(view, current, recorded);
        let now = Instant::now();
        let due = state
            .last_sample
            .is_none_or(|t| now.saturating_duration_since(t) >= self.timing.sample_every);
        // The fallback samples once the servers reported again since its last sample.
        let reported = *cpu != state.readings;
        if settled.is_ok() && due {
            let stored: u64 = view.servers.values().map(|s| s.stored_bytes).sum();
            let from_reports = utilization(&state.readings, cpu);
            if reported {
                state.readings = cpu.clone();
            }
            let from_reports = from_reports.filter(|_| reported);
            let queries = ClusterQueries::new(&self.namespace, &self.instance, cluster);
            let (sample, source) = match &self.prometheus {
                Some(Ok(p)) => match from_prometheus(p, &queries, now).await {
                    Ok(sample) => (Some(sample), (SOURCE_PROMETHEUS, None)),
                    Err(why) => (
                        reports_sample(from_reports, stored, now),
                        (SOURCE_SERVERS, Some(why)),
                    ),
                },
                Some(Err(why)) => (
                    reports_sample(from_reports, stored, now),
                    (SOURCE_SERVERS, Some(why.clone())),
                ),
                None => (
                    reports_sample(from_reports, stored, now),
                    (
                        SOURCE_SERVERS,
                        Some("no Prometheus is configured (--prometheus-url)".into()),
                    ),
                ),
            };
            if state.source.as_ref() != Some(&source) {
                match &source.1 {
                    Some(why) => info!(
                        cluster,
                        "the autoscaler samples the servers' own reports: {why}"
                    ),
                    None => info!(cluster, "the autoscaler samples Prometheus"),
                }
            }
            state.source = Some(source);
            let asked_prometheus = matches!(self.prometheus, Some(Ok(_)));
            if let Some(sample) = sample {
                state.samples.push_back(sample);
                state.last_sample = Some(now);
            } else if asked_prometheus {
                // Prometheus is asked once per interval, whatever it answered.
                state.last_sample = Some(now);
            } else if reported {
                // A first reading (or one of new processes): the next report makes a sample.
                state.last_sample = None;
            }
        }
        let keep = self.timing.down_window + self.timing.sample_every * 2;
        while state
            .samples
            .front()
            .is_some_and(|s| now.saturating_duration_since(s.at) > keep)
        {
            state.samples.pop_front();
        }
        let wall_now = unix_ms(SystemTime::now());
        let last_change = state
            .written
            .as_ref()
            .and_then(|w| w.last_change_unix_ms)
            .map(|ms| {
                now.checked_sub(Duration::from_millis(
                    wall_now.saturating_sub(ms).max(0) as u64
                ))
                .unwrap_or(now)
            });
        let samples: Vec<Sample> = state.samples.iter().copied().collect();
        let decision = decide(
            &policy,
            &self.timing,
            &samples,
            current,
            last_change,
            settled,
            now,
        );
        let (source, source_message) = state.source.clone().unwrap_or((SOURCE_SERVERS, None));
        let changed = decision.nodes != current;
        let record = record(
            &decision,
            &policy,
            &self.timing,
            source,
            source_message,
            if changed {
                Some(wall_now)
            } else {
                state.written.as_ref().and_then(|w| w.last_change_unix_ms)
            },
        );
        crate::metrics::autoscaler(labels, Some(gauges(&record, &policy)));
        if state.written.as_ref() == Some(&record) {
            return Ok(());
        }
        if meta.put_autoscaler(term, cluster, &record).await? {
            if changed {
                info!(
                    cluster,
                    from = current,
                    to = record.nodes,
                    dimension = record.dimension,
                    cpu = ?record.cpu_utilization,
                    stored_bytes = ?record.stored_bytes,
                    reason = ?record.held_reason,
                    "autoscaled"
                );
            }
            state.written = Some(record);
        }
        Ok(())
    }
}

/// The decision's policy from the recorded settings.
pub fn policy(s: &AutoscalingRecord) -> Policy {
    Policy {
        min_nodes: s.min_serve_nodes,
        max_nodes: s.max_serve_nodes,
        cpu_target: s.cpu_utilization_percent as f64 / 100.0,
        storage_target_bytes: s.storage_utilization_bytes_per_node,
        node_capacity_bytes: s.node_capacity_bytes,
    }
}

/// Whether `view` runs the `current` nodes decided, all ready, nothing lost (Err: why not).
/// Pure.
pub fn settled(view: &ClusterView, current: u32, recorded: Option<u32>) -> Result<(), String> {
    if let Some(s) = view.servers_by_ordinal().into_iter().find(|s| !s.ready) {
        let name = view.presence.get(&s.id).map_or(s.id.as_str(), |p| &p.name);
        return Err(format!("server {name} is not ready"));
    }
    let lost = view
        .tablets
        .tables()
        .flat_map(|t| view.tablets.tablets(t))
        .find(|t| t.state == TabletState::Lost);
    if let Some(t) = lost {
        return Err(format!("tablet {} is lost", key_of(t).0));
    }
    if recorded != Some(current) {
        return Err(format!(
            "the cluster has not taken the count of {current} node(s) yet (recorded: {})",
            recorded.map_or("none".into(), |n| n.to_string())
        ));
    }
    let running = view.servers.len() as u32;
    if running != current {
        return Err(format!(
            "{running} server(s) run where {current} are decided: a scale-out or a scale-in is under way"
        ));
    }
    Ok(())
}

fn reports_sample(from: Option<(f64, u32)>, stored: u64, at: Instant) -> Option<Sample> {
    from.map(|(cpu, nodes)| Sample {
        at,
        nodes,
        cpu,
        stored_bytes: stored,
    })
}

async fn from_prometheus(
    p: &Prometheus,
    q: &ClusterQueries,
    at: Instant,
) -> Result<Sample, String> {
    // The four queries together within one query's deadline: the master's pass waits.
    tokio::time::timeout(crate::prometheus::QUERY_TIMEOUT, query_prometheus(p, q, at))
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "Prometheus at {} did not answer within {:?}",
                p.url(),
                crate::prometheus::QUERY_TIMEOUT
            ))
        })
}

async fn query_prometheus(
    p: &Prometheus,
    q: &ClusterQueries,
    at: Instant,
) -> Result<Sample, String> {
    let used = p.scalar(&q.cpu_used).await?;
    let allocated = p.scalar(&q.cpu_allocated).await?;
    let nodes = p.scalar(&q.nodes).await?;
    let stored = p.scalar(&q.stored_bytes).await?;
    match (used, allocated, nodes) {
        (Some(used), Some(allocated), Some(nodes)) if allocated > 0.0 && nodes >= 1.0 => {
            Ok(Sample {
                at,
                nodes: nodes as u32,
                cpu: used / allocated,
                stored_bytes: stored.unwrap_or(0.0).max(0.0) as u64,
            })
        }
        _ => Err(format!(
            "Prometheus at {} has no CPU series of the cluster's servers yet (are they scraped? query: {})",
            p.url(),
            q.cpu_used
        )),
    }
}

/// The record of `decision`. Pure.
pub fn record(
    decision: &Decision,
    policy: &Policy,
    timing: &Timing,
    source: &str,
    source_message: Option<String>,
    last_change_unix_ms: Option<i64>,
) -> AutoscalerRecord {
    let (held_reason, held_message) = match &decision.held {
        Some(held) => {
            let (r, m) = explain(held, policy, timing);
            (Some(r.to_string()), Some(m))
        }
        None => (None, None),
    };
    let latest = decision.latest;
    AutoscalerRecord {
        nodes: decision.nodes,
        recommended_nodes: decision.recommended,
        wanted_nodes: latest.map(|(_, w)| w.nodes().0),
        dimension: decision.dimension.name().into(),
        cpu_utilization: latest.map(|(s, _)| (s.cpu * 1e4).round() / 1e4),
        stored_bytes: latest.map(|(s, _)| s.stored_bytes),
        sampled_nodes: latest.map(|(s, _)| s.nodes),
        cpu_nodes: latest.map(|(_, w)| w.cpu_nodes),
        storage_nodes: latest.map(|(_, w)| w.storage_nodes),
        held_reason,
        held_message,
        source: source.into(),
        source_message,
        last_change_unix_ms,
    }
}

/// A reason (CamelCase, for conditions) and a sentence for why the autoscaler holds. Pure.
pub fn explain(held: &Held, policy: &Policy, timing: &Timing) -> (&'static str, String) {
    let secs = |d: Duration| format!("{} s", d.as_secs());
    match held {
        Held::AtMax { wanted } => (
            "MaxServeNodesReached",
            format!(
                "the load wants {wanted} node(s); maxServeNodes is {}",
                policy.max_nodes
            ),
        ),
        Held::AtMin { wanted } => (
            "MinServeNodesReached",
            format!(
                "the load wants {wanted} node(s); minServeNodes is {}",
                policy.min_nodes
            ),
        ),
        Held::Waiting {
            direction: Direction::Up,
        } => (
            "WaitingForSustainedLoad",
            format!(
                "the load wants more nodes: a scale-up follows once every sample of {} wants more",
                secs(timing.up_window)
            ),
        ),
        Held::Waiting {
            direction: Direction::Down,
        } => (
            "WaitingToScaleDown",
            format!(
                "the load wants fewer nodes: a scale-down follows once every sample of {} wants fewer",
                secs(timing.down_window)
            ),
        ),
        Held::CoolingDown { remaining } => (
            "CoolingDown",
            format!(
                "no scale-down within {} of the last change ({} left)",
                secs(timing.down_cooldown),
                secs(*remaining)
            ),
        ),
        Held::Stepped { wanted } => (
            "ScaleDownStepLimited",
            format!(
                "the load wants {wanted} node(s); one scale-down removes at most {:.0} % of the nodes",
                timing.max_down_fraction * 100.0
            ),
        ),
        Held::NoMetrics => (
            "NoMetrics",
            "no sample of the cluster's load yet".to_string(),
        ),
        Held::Unsettled { reason } => ("Unsettled", format!("no decision while {reason}")),
    }
}

fn gauges(r: &AutoscalerRecord, p: &Policy) -> [Option<f64>; 7] {
    [
        Some(r.nodes as f64),
        Some(r.recommended_nodes as f64),
        r.wanted_nodes.map(|n| n as f64),
        Some(p.min_nodes as f64),
        Some(p.max_nodes as f64),
        Some(p.cpu_target),
        r.cpu_utilization,
    ]
}

fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use basalt_master::fixture::ViewBuilder;

    use super::*;

    #[test]
    fn a_cluster_is_settled_when_it_runs_the_decided_count_all_ready() {
        let view = ViewBuilder::new("c1")
            .servers(2)
            .table("t", &["m"], &[0, 1])
            .build();
        assert_eq!(settled(&view, 2, Some(2)), Ok(()));
        assert!(
            settled(&view, 3, Some(2))
                .unwrap_err()
                .contains("not taken the count of 3")
        );
        assert!(
            settled(&view, 3, Some(3))
                .unwrap_err()
                .contains("2 server(s) run where 3 are decided")
        );
        let mut down = view.clone();
        down.servers.get_mut("s1").unwrap().ready = false;
        assert!(
            settled(&down, 2, Some(2))
                .unwrap_err()
                .contains("not ready")
        );
    }

    #[test]
    fn records_explain_what_holds_the_autoscaler_back() {
        let policy = Policy {
            min_nodes: 1,
            max_nodes: 4,
            cpu_target: 0.5,
            storage_target_bytes: 2560 << 30,
            node_capacity_bytes: None,
        };
        let timing = Timing::default();
        let at = Instant::now();
        let sample = Sample {
            at,
            nodes: 4,
            cpu: 0.9,
            stored_bytes: 10,
        };
        let d = decide(&policy, &timing, &[sample], 4, None, Ok(()), at);
        let r = record(&d, &policy, &timing, SOURCE_PROMETHEUS, None, None);
        assert_eq!(r.nodes, 4);
        assert_eq!(r.recommended_nodes, 4);
        assert_eq!(r.wanted_nodes, Some(8));
        assert_eq!(r.held_reason.as_deref(), Some("MaxServeNodesReached"));
        assert_eq!(
            r.held_message.as_deref(),
            Some("the load wants 8 node(s); maxServeNodes is 4")
        );
        assert_eq!(r.cpu_utilization, Some(0.9));
        assert_eq!(r.dimension, "cpu");
        let g = gauges(&r, &policy);
        assert_eq!(g[2], Some(8.0));
        assert_eq!(g[4], Some(4.0));
    }
}
