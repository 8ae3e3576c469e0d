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
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("text encoding");
        String::from_utf8(buf).expect("utf-8 exposition")
    }
}
