//! The operator's Prometheus metrics: reconciles by controller and outcome, their durations,
//! and whether this replica leads.

use std::collections::BTreeMap;
use std::time::Duration;

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry, TextEncoder,
};

pub struct Metrics {
    registry: Registry,
    reconciles: IntCounterVec,
    failures: IntCounterVec,
    duration: HistogramVec,
    pub leader: IntGauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let reconciles = IntCounterVec::new(
            Opts::new(
                "basalt_operator_reconciles_total",
                "Reconciles run, by controller",
            ),
            &["controller"],
        )
        .expect("valid metric");
        let failures = IntCounterVec::new(
            Opts::new(
                "basalt_operator_reconcile_errors_total",
                "Reconciles that failed and will be retried, by controller",
            ),
            &["controller"],
        )
        .expect("valid metric");
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "basalt_operator_reconcile_duration_seconds",
                "Reconcile duration, by controller",
            )
            .buckets(vec![
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ]),
            &["controller"],
        )
        .expect("valid metric");
        let leader = IntGauge::new(
            "basalt_operator_leader",
            "1 while this replica holds the leader lease",
        )
        .expect("valid metric");
        registry
            .register(Box::new(reconciles.clone()))
            .expect("unique metric");
        registry
            .register(Box::new(failures.clone()))
            .expect("unique metric");
        registry
            .register(Box::new(duration.clone()))
            .expect("unique metric");
        registry
            .register(Box::new(leader.clone()))
            .expect("unique metric");
        Self {
            registry,
            reconciles,
            failures,
            duration,
            leader,
        }
    }

    pub fn observe(&self, controller: &str, took: Duration, ok: bool) {
        self.reconciles.with_label_values(&[controller]).inc();
        if !ok {
            self.failures.with_label_values(&[controller]).inc();
        }
        self.duration
            .with_label_values(&[controller])
            .observe(took.as_secs_f64());
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let mut families = self.registry.gather();
        families.extend(MASTER.registry.gather());
        TextEncoder::new()
            .encode(&families, &mut buf)
            .expect("text encoding");
        String::from_utf8(buf).expect("utf-8 exposition")
    }
}

/// The master's metrics (moves and splits), shared by every master this process runs.
struct MasterMetrics {
    registry: Registry,
    moves: IntCounterVec,
    move_seconds: HistogramVec,
    fenced_seconds: HistogramVec,
    move_bytes: IntCounterVec,
    splits: IntCounterVec,
    draining: prometheus::IntGaugeVec,
    seed_bytes: IntCounterVec,
    seed_throttled: prometheus::CounterVec,
    leader: prometheus::IntGaugeVec,
    servers: prometheus::IntGaugeVec,
    tablets: prometheus::IntGaugeVec,
    autoscaler: [prometheus::GaugeVec; 7],
}

/// The labels of the master's per-cluster series, as the tablet servers' own.
const CLUSTER_LABELS: [&str; 3] = ["basalt_namespace", "basalt_instance", "basalt_cluster"];

/// The autoscaler's gauges, in [`MasterMetrics::autoscaler`]'s order.
const AUTOSCALER_GAUGES: [(&str, &str); 7] = [
    (
        "basalt_autoscaler_nodes",
        "The nodes the autoscaler decided the cluster runs",
    ),
    (
        "basalt_autoscaler_recommended_nodes",
        "The nodes the newest sample recommends, within minServeNodes and maxServeNodes",
    ),
    (
        "basalt_autoscaler_wanted_nodes",
        "The nodes the newest sample recommends without the bounds (the larger of the CPU and storage dimensions)",
    ),
    ("basalt_autoscaler_min_nodes", "The cluster's minServeNodes"),
    ("basalt_autoscaler_max_nodes", "The cluster's maxServeNodes"),
    (
        "basalt_autoscaler_cpu_target",
        "The cluster's CPU utilization target (cpuUtilizationPercent), a fraction",
    ),
    (
        "basalt_autoscaler_cpu_utilization",
        "The cluster's mean CPU utilization against its allocation in the newest sample, a fraction",
    ),
];

static MASTER: std::sync::LazyLock<MasterMetrics> = std::sync::LazyLock::new(|| {
    let registry = Registry::new();
    let moves = IntCounterVec::new(
        Opts::new(
            "basalt_master_tablet_moves_total",
            "Tablet moves, by cluster, reason (balance, drain) and outcome (moved, aborted)",
        ),
        &[
            "basalt_namespace",
            "basalt_instance",
            "basalt_cluster",
            "reason",
            "outcome",
        ],
    )
    .expect("valid metric");
    let move_seconds = HistogramVec::new(
        HistogramOpts::new(
            "basalt_master_tablet_move_seconds",
            "How long committed tablet moves took, from their start to the owner switch",
        )
        .buckets(vec![0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0]),
        &[
            "basalt_namespace",
            "basalt_instance",
            "basalt_cluster",
            "reason",
        ],
    )
    .expect("valid metric");
    let fenced_seconds = HistogramVec::new(
        HistogramOpts::new(
            "basalt_master_tablet_move_fenced_seconds",
            "The window in which a moved tablet refused writes (fence to owner switch)",
        )
        .buckets(vec![0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0]),
        &[
            "basalt_namespace",
            "basalt_instance",
            "basalt_cluster",
            "reason",
        ],
    )
    .expect("valid metric");
    let move_bytes = IntCounterVec::new(
        Opts::new(
            "basalt_master_tablet_move_bytes_total",
            "Snapshot bytes of committed tablet moves",
        ),
        &[
            "basalt_namespace",
            "basalt_instance",
            "basalt_cluster",
            "reason",
        ],
    )
    .expect("valid metric");
    let splits = IntCounterVec::new(
        Opts::new(
            "basalt_master_tablet_splits_total",
            "Tablet splits, by cluster and reason (size, load)",
        ),
        &[
            "basalt_namespace",
            "basalt_instance",
            "basalt_cluster",
            "reason",
        ],
    )
    .expect("valid metric");
    let draining = prometheus::IntGaugeVec::new(
        Opts::new(
            "basalt_master_drain_remaining_tablets",
            "Tablets still owned by servers being drained before a scale-in, by cluster (0: no drain)",
        ),
        &["basalt_namespace", "basalt_instance", "basalt_cluster"],
    )
    .expect("valid metric");
    let seed_bytes = IntCounterVec::new(
        Opts::new(
            "basalt_master_seed_bytes_total",
            "Bytes of rows the master copied into a cluster being seeded (as applied there), by cluster and source cluster",
        ),
        &["basalt_namespace", "basalt_instance", "basalt_cluster", "source_cluster"],
    )
    .expect("valid metric");
    let seed_throttled = prometheus::CounterVec::new(
        Opts::new(
            "basalt_master_seed_throttled_seconds_total",
            "Seconds the seeding copy into a cluster waited for the instance's seeding rate limit, by cluster",
        ),
        &["basalt_namespace", "basalt_instance", "basalt_cluster"],
    )
    .expect("valid metric");
    let gauge_vec = |name: &str, help: &str, labels: &[&str]| {
        prometheus::IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric")
    };
    let leader = gauge_vec(
        "basalt_master_leader",
        "1 while this process leads the instance's master role, 0 while it campaigns",
        &CLUSTER_LABELS[..2],
    );
    let labels = [CLUSTER_LABELS.as_slice(), &["ready"]].concat();
    let servers = gauge_vec(
        "basalt_master_servers",
        "The cluster's tablet servers the master knows (registered, or owning tablets and absent), by whether they are ready",
        &labels,
    );
    let labels = [CLUSTER_LABELS.as_slice(), &["state"]].concat();
    let tablets = gauge_vec(
        "basalt_master_tablets",
        "The cluster's tablets by state (serving, lost: its data gone with its server, fencing: the last phase of a move)",
        &labels,
    );
    let autoscaler = AUTOSCALER_GAUGES.map(|(name, help)| {
        prometheus::GaugeVec::new(Opts::new(name, help), &CLUSTER_LABELS).expect("valid metric")
    });
    for g in &autoscaler {
        registry
            .register(Box::new(g.clone()))
            .expect("unique metric");
    }
    for c in [
        Box::new(leader.clone()) as Box<dyn prometheus::core::Collector>,
        Box::new(servers.clone()),
        Box::new(tablets.clone()),
        Box::new(draining.clone()),
        Box::new(seed_bytes.clone()),
        Box::new(seed_throttled.clone()),
        Box::new(moves.clone()),
        Box::new(move_seconds.clone()),
        Box::new(fenced_seconds.clone()),
        Box::new(move_bytes.clone()),
        Box::new(splits.clone()),
    ] {
        registry.register(c).expect("unique metric");
    }
    MasterMetrics {
        registry,
        moves,
        move_seconds,
        fenced_seconds,
        move_bytes,
        splits,
        draining,
        seed_bytes,
        seed_throttled,
        leader,
        servers,
        tablets,
        autoscaler,
    }
});

/// Whether this process leads the master role of `instance`.
pub fn master_leader(namespace: &str, instance: &str, leading: bool) {
    MASTER
        .leader
        .with_label_values(&[namespace, instance])
        .set(leading as i64);
}

/// What the master sees of a cluster: its servers, ready or not, and its tablets by state.
pub fn cluster_seen(
    labels: [&str; 3],
    ready: usize,
    not_ready: usize,
    tablets: &BTreeMap<&'static str, usize>,
) {
    for (flag, n) in [("true", ready), ("false", not_ready)] {
        let l = [labels[0], labels[1], labels[2], flag];
        MASTER.servers.with_label_values(&l).set(n as i64);
    }
    for state in ["serving", "lost", "fencing"] {
        let l = [labels[0], labels[1], labels[2], state];
        let n = tablets.get(state).copied().unwrap_or(0);
        MASTER.tablets.with_label_values(&l).set(n as i64);
    }
}

/// The autoscaler's numbers for a cluster, in [`AUTOSCALER_GAUGES`]' order (None: the
/// cluster does not autoscale, its series go; a value None: that series goes).
pub fn autoscaler(labels: [&str; 3], values: Option<[Option<f64>; 7]>) {
    for (i, gauge) in MASTER.autoscaler.iter().enumerate() {
        match values.and_then(|v| v[i]) {
            Some(v) => gauge.with_label_values(&labels).set(v),
            None => {
                let _ = gauge.remove_label_values(&labels);
            }
        }
    }
}

/// The master's metrics alone (the `basalt-operator master` process of the local runtime).
pub fn render_master() -> String {
    let mut buf = Vec::new();
    TextEncoder::new()
        .encode(&MASTER.registry.gather(), &mut buf)
        .expect("text encoding");
    String::from_utf8(buf).expect("utf-8 exposition")
}

/// `bytes` of rows copied from `source` were applied in `labels`' cluster, being seeded.
pub fn seed_copied(labels: [&str; 3], source: &str, bytes: u64) {
    let [ns, instance, cluster] = labels;
    MASTER
        .seed_bytes
        .with_label_values(&[ns, instance, cluster, source])
        .inc_by(bytes);
}

/// The seeding copy into `labels`' cluster waited `seconds` for the seeding rate limit.
pub fn seed_throttled(labels: [&str; 3], seconds: f64) {
    MASTER
        .seed_throttled
        .with_label_values(&labels)
        .inc_by(seconds);
}

/// How many tablets the draining servers of `labels`' cluster still own.
pub fn drain_remaining(labels: [&str; 3], tablets: usize) {
    MASTER
        .draining
        .with_label_values(&labels)
        .set(tablets as i64);
}

/// One tablet move of `labels`' cluster ended.
pub fn tablet_move(labels: [&str; 3], reason: &str, outcome: &crate::master::moves::Outcome) {
    use crate::master::moves::Outcome;
    let [ns, instance, cluster] = labels;
    let with = [ns, instance, cluster, reason];
    match outcome {
        Outcome::Moved(stats) => {
            MASTER
                .moves
                .with_label_values(&[ns, instance, cluster, reason, "moved"])
                .inc();
            MASTER
                .move_seconds
                .with_label_values(&with)
                .observe(stats.seconds);
            MASTER
                .fenced_seconds
                .with_label_values(&with)
                .observe(stats.fenced_seconds);
            MASTER
                .move_bytes
                .with_label_values(&with)
                .inc_by(stats.bytes);
        }
        Outcome::Aborted(_) => {
            MASTER
                .moves
                .with_label_values(&[ns, instance, cluster, reason, "aborted"])
                .inc();
        }
    }
}

/// One tablet of `labels`' cluster split.
pub fn tablet_split(labels: [&str; 3], reason: &str) {
    let [ns, instance, cluster] = labels;
    MASTER
        .splits
        .with_label_values(&[ns, instance, cluster, reason])
        .inc();
}
