//! The operator's Prometheus metrics: reconciles by controller and outcome, their durations,
//! and whether this replica leads.

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
}

static MASTER: std::sync::LazyLock<MasterMetrics> = std::sync::LazyLock::new(|| {
    let registry = Registry::new();
    let moves = IntCounterVec::new(
        Opts::new(
            "basalt_master_tablet_moves_total",
            "Tablet moves, by reason (balance, drain) and outcome (moved, aborted)",
        ),
        &["reason", "outcome"],
    )
    .expect("valid metric");
    let move_seconds = HistogramVec::new(
        HistogramOpts::new(
            "basalt_master_tablet_move_seconds",
            "How long committed tablet moves took, from their start to the owner switch",
        )
        .buckets(vec![0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0]),
        &["reason"],
    )
    .expect("valid metric");
    let fenced_seconds = HistogramVec::new(
        HistogramOpts::new(
            "basalt_master_tablet_move_fenced_seconds",
            "The window in which a moved tablet refused writes (fence to owner switch)",
        )
        .buckets(vec![0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0]),
        &["reason"],
    )
    .expect("valid metric");
    let move_bytes = IntCounterVec::new(
        Opts::new(
            "basalt_master_tablet_move_bytes_total",
            "Snapshot bytes of committed tablet moves",
        ),
        &["reason"],
    )
    .expect("valid metric");
    let splits = IntCounterVec::new(
        Opts::new(
            "basalt_master_tablet_splits_total",
            "Tablet splits, by reason (size, load)",
        ),
        &["reason"],
    )
    .expect("valid metric");
    let draining = prometheus::IntGaugeVec::new(
        Opts::new(
            "basalt_master_drain_remaining_tablets",
            "Tablets still owned by servers being drained before a scale-in, by cluster (0: no drain)",
        ),
        &["cluster"],
    )
    .expect("valid metric");
    let seed_bytes = IntCounterVec::new(
        Opts::new(
            "basalt_master_seed_bytes_total",
            "Bytes of rows the master copied into a cluster being seeded (as applied there), by cluster and source cluster",
        ),
        &["cluster", "source_cluster"],
    )
    .expect("valid metric");
    let seed_throttled = prometheus::CounterVec::new(
        Opts::new(
            "basalt_master_seed_throttled_seconds_total",
            "Seconds the seeding copy into a cluster waited for the instance's seeding rate limit, by cluster",
        ),
        &["cluster"],
    )
    .expect("valid metric");
    for c in [
        Box::new(draining.clone()) as Box<dyn prometheus::core::Collector>,
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
    }
});

/// `bytes` of rows copied from `source` were applied in `cluster`, being seeded.
pub fn seed_copied(cluster: &str, source: &str, bytes: u64) {
    MASTER
        .seed_bytes
        .with_label_values(&[cluster, source])
        .inc_by(bytes);
}

/// The seeding copy into `cluster` waited `seconds` for the seeding rate limit.
pub fn seed_throttled(cluster: &str, seconds: f64) {
    MASTER
        .seed_throttled
        .with_label_values(&[cluster])
        .inc_by(seconds);
}

/// How many tablets the draining servers of `cluster` still own.
pub fn drain_remaining(cluster: &str, tablets: usize) {
    MASTER
        .draining
        .with_label_values(&[cluster])
        .set(tablets as i64);
}

/// One tablet move ended.
pub fn tablet_move(reason: &str, outcome: &crate::master::moves::Outcome) {
    use crate::master::moves::Outcome;
    match outcome {
        Outcome::Moved(stats) => {
            MASTER.moves.with_label_values(&[reason, "moved"]).inc();
            MASTER
                .move_seconds
                .with_label_values(&[reason])
                .observe(stats.seconds);
            MASTER
                .fenced_seconds
                .with_label_values(&[reason])
                .observe(stats.fenced_seconds);
            MASTER
                .move_bytes
                .with_label_values(&[reason])
                .inc_by(stats.bytes);
        }
        Outcome::Aborted(_) => {
            MASTER.moves.with_label_values(&[reason, "aborted"]).inc();
        }
    }
}

/// One tablet split.
pub fn tablet_split(reason: &str) {
    MASTER.splits.with_label_values(&[reason]).inc();
}
