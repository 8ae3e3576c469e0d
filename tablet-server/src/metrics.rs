//! Prometheus metrics of the tablet server (served on the HTTP port at `/metrics`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry, TextEncoder,
};

use basalt_storage::Store;

pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    latency: HistogramVec,
    rows_read: IntCounterVec,
    rows_written: IntCounterVec,
    bytes_read: IntCounterVec,
    bytes_written: IntCounterVec,
    storage_bytes: IntGauge,
    memtable_bytes: IntGauge,
    /// The data directory's volume: its size and what is free on it.
    storage_capacity: IntGauge,
    storage_available: IntGauge,
    compaction_pending: IntGauge,
    compactions_running: IntGauge,
    tablets: IntGauge,
    forwarded: prometheus::IntCounter,
    /// Client requests by (app profile, method, table): latency by code.
    app_profile_latency: HistogramVec,
    /// Multi-cluster requests sent on to another cluster, by (app profile, from, to).
    failovers: IntCounterVec,
    /// How long requests that waited for admission waited, by priority.
    admission_waits: HistogramVec,
    /// Tablet moves: snapshot bytes sent (as source) and received (as destination).
    move_bytes: IntCounterVec,
    /// Seconds a tablet refused writes for a move (source: from fence to release).
    move_fenced_seconds: prometheus::Histogram,
    lease_remaining: prometheus::Gauge,
    /// Replication, by (source cluster: this server's, peer cluster, table): commit-to-durable-
    /// in-the-peer latency of each shipped write, the age of the oldest write the peer has not
    /// acknowledged, entries shipped.
    replication_latency: HistogramVec,
    replication_max_delay: prometheus::GaugeVec,
    replication_entries: IntCounterVec,
    replication_bytes: IntCounterVec,
    replication_throttled: prometheus::CounterVec,
    /// The commit clock value of the oldest write not yet acknowledged, by (source, peer,
    /// table): the delay gauge is its age when the metrics are rendered, so it grows while a
    /// batch hangs.
    replication_oldest: parking_lot::Mutex<BTreeMap<[String; 3], u64>>,
    /// How far the replication safe point is behind the clock: tombstones younger than this
    /// are kept whatever the grace (0 without replication).
    tombstone_hold: prometheus::Gauge,
    /// Cluster mode: the tablets this server owns and the seconds left on its lease.
    cluster: parking_lot::Mutex<Option<ClusterGauges>>,
    /// The process's CPU time (see [`crate::cpu`]), brought up to date when rendered.
    cpu_seconds: prometheus::Counter,
    /// The CPU the server is allocated, in cores (`basalt_cpu_allocation_cores`, set once).
    cpu_allocated: f64,
    /// Held while `cpu_seconds` catches up with the process's clock (one caller at a time).
    cpu_update: parking_lot::Mutex<()>,
}

/// The labels every series of a cluster-mode server carries, so that one Prometheus tells the
/// clusters of every instance apart whatever its scrape configuration: `basalt_namespace`,
/// `basalt_instance`, `basalt_cluster`, `basalt_server` (the server's name). A standalone
/// server has none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerLabels {
    pub namespace: String,
    pub instance: String,
    pub cluster: String,
    pub server: String,
}

impl ServerLabels {
    /// A cluster-mode server's labels.
    pub fn cluster(namespace: &str, instance: &str, cluster: &str, server: &str) -> ServerLabels {
        ServerLabels {
            namespace: namespace.into(),
            instance: instance.into(),
            cluster: cluster.into(),
            server: server.into(),
        }
    }

    fn registry(&self) -> Registry {
        if self.cluster.is_empty() {
            return Registry::new();
        }
        let labels = std::collections::HashMap::from([
            ("basalt_namespace".to_string(), self.namespace.clone()),
            ("basalt_instance".to_string(), self.instance.clone()),
            ("basalt_cluster".to_string(), self.cluster.clone()),
            ("basalt_server".to_string(), self.server.clone()),
        ]);
        Registry::new_custom(None, Some(labels)).expect("valid constant labels")
    }
}

/// Reads the cluster-mode gauges when the metrics are rendered.
pub type ClusterGauges = Arc<dyn Fn() -> (i64, f64) + Send + Sync>;

impl Metrics {
    /// The server's metrics, with the CPU it is allocated
    /// ([`crate::cpu::this_servers_allocation`]).
    pub fn new(cpu_allocated: (f64, crate::cpu::Source), labels: &ServerLabels) -> Arc<Metrics> {
        let registry = labels.registry();
        let requests = IntCounterVec::new(
            Opts::new(
                "basalt_grpc_requests_total",
                "gRPC requests by RPC and status code",
            ),
            &["rpc", "code"],
        )
        .expect("valid metric");
        let latency = HistogramVec::new(
            HistogramOpts::new(
                "basalt_grpc_request_duration_seconds",
                "gRPC request latency by RPC and status code (streams: until the last message)",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0, 30.0,
            ]),
            &["rpc", "code"],
        )
        .expect("valid metric");
        let per_table = |name: &str, help: &str| {
            IntCounterVec::new(Opts::new(name, help), &["table"]).expect("valid metric")
        };
        let rows_read = per_table("basalt_rows_read_total", "Rows returned by ReadRows");
        let rows_written = per_table("basalt_rows_written_total", "Row mutations applied");
        let bytes_read = per_table("basalt_bytes_read_total", "Cell bytes returned by ReadRows");
        let bytes_written = per_table(
            "basalt_bytes_written_total",
            "Cell bytes written by SetCell",
        );
        let gauge = |name: &str, help: &str| IntGauge::new(name, help).expect("valid metric");
        let storage_bytes = gauge(
            "basalt_storage_bytes",
            "Size of the SST files of the data store",
        );
        let memtable_bytes = gauge(
            "basalt_memtable_bytes",
            "Size of the data store's memtables",
        );
        let compaction_pending = gauge(
            "basalt_compaction_pending_bytes",
            "RocksDB's estimate of bytes compaction still has to rewrite (compaction backlog)",
        );
        let compactions_running = gauge(
            "basalt_compactions_running",
            "Compactions running right now",
        );
        let storage_capacity = gauge(
            "basalt_storage_capacity_bytes",
            "Size of the volume that holds the server's data directory",
        );
        let storage_available = gauge(
            "basalt_storage_available_bytes",
            "Bytes still free on the volume that holds the server's data directory",
        );
        let tablets = gauge("basalt_tablets", "Tablets this server owns");
        let move_bytes = IntCounterVec::new(
            prometheus::Opts::new(
                "basalt_tablet_move_bytes_total",
                "Snapshot bytes of tablet moves, by direction (sent as source, received as destination)",
            ),
            &["direction"],
        )
        .expect("valid metric");
        let move_fenced_seconds = prometheus::Histogram::with_opts(
            prometheus::HistogramOpts::new(
                "basalt_tablet_move_fenced_seconds",
                "How long a moved tablet refused reads and writes at its source (fence to release)",
            )
            .buckets(vec![
                0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
            ]),
        )
        .expect("valid metric");
        let forwarded = prometheus::IntCounter::new(
            "basalt_requests_forwarded_total",
            "Requests (or parts of requests) this server forwarded to the owners of their tablets",
        )
        .expect("valid metric");
        let lease_remaining = prometheus::Gauge::new(
            "basalt_lease_remaining_seconds",
            "Cluster mode: seconds before this server must stop serving unless its lease is renewed",
        )
        .expect("valid metric");
        // Named after Bigtable's replication/latency and replication/max_delay.
        let replication_latency = HistogramVec::new(
            HistogramOpts::new(
                "basalt_replication_latency_seconds",
                "Replication: from a write's commit in this server to its durable application in the peer cluster",
            )
            .buckets(vec![
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
            ]),
            &["source_cluster", "peer_cluster", "table"],
        )
        .expect("valid metric");
        let replication_max_delay = prometheus::GaugeVec::new(
            Opts::new(
                "basalt_replication_max_delay_seconds",
                "Replication: age of the oldest write of this server the peer cluster has not acknowledged (0: caught up)",
            ),
            &["source_cluster", "peer_cluster", "table"],
        )
        .expect("valid metric");
        let tombstone_hold = prometheus::Gauge::new(
            "basalt_tombstone_safe_point_lag_seconds",
            "Replication: how far the safe point is behind this server's clock; tombstones written since are kept until every peer cluster acknowledged past them (0: no peer)",
        )
        .expect("valid metric");
        let replication_entries = IntCounterVec::new(
            Opts::new(
                "basalt_replication_entries_total",
                "Replication: change log entries this server shipped, acknowledged by the peer cluster",
            ),
            &["source_cluster", "peer_cluster", "table"],
        )
        .expect("valid metric");
        let app_profile_latency = HistogramVec::new(
            HistogramOpts::new(
                "basalt_app_profile_request_seconds",
                "Client requests by app profile, method, table, the cluster that served them (the \
                 last one tried) and status code, from their arrival at a frontend to the \
                 response (for a stream, its first message)",
            )
            .buckets(prometheus::exponential_buckets(0.0005, 2.0, 16).expect("valid buckets")),
            &["app_profile", "method", "table", "cluster", "code"],
        )
        .expect("valid metric");
        let failovers = IntCounterVec::new(
            Opts::new(
                "basalt_multi_cluster_failovers_total",
                "Multi-cluster requests that another cluster took after the first failed or was \
                 slow (Bigtable's server/multi_cluster_failovers_count)",
            ),
            &["app_profile", "from_cluster", "to_cluster"],
        )
        .expect("valid metric");
        let admission_waits = HistogramVec::new(
            HistogramOpts::new(
                "basalt_priority_wait_seconds",
                "Time client requests waited for admission behind higher-priority traffic, by \
                 their app profile's priority (only requests that waited)",
            )
            .buckets(prometheus::exponential_buckets(0.0005, 2.0, 16).expect("valid buckets")),
            &["priority"],
        )
        .expect("valid metric");
        let replication_bytes = IntCounterVec::new(
            Opts::new(
                "basalt_replication_bytes_total",
                "Replication: bytes of rows this server shipped (as sent), acknowledged by the peer cluster",
            ),
            &["source_cluster", "peer_cluster", "table"],
        )
        .expect("valid metric");
        let replication_throttled = prometheus::CounterVec::new(
            Opts::new(
                "basalt_replication_throttled_seconds_total",
                "Replication: seconds the table's writes waited for the instance's shipping rate limit (a batch's wait counts for every table in it)",
            ),
            &["source_cluster", "peer_cluster", "table"],
        )
        .expect("valid metric");
        let cpu_seconds = prometheus::Counter::new(
            "process_cpu_seconds_total",
            "CPU time the server's process used, every thread, in seconds",
        )
        .expect("valid metric");
        let cpu_allocation = prometheus::GaugeVec::new(
            Opts::new(
                "basalt_cpu_allocation_cores",
                "The CPU the server is allocated, in cores: --cpu-allocation-millicores (the pod's CPU request), else its cgroup's CPU limit, else the machine's cores (source); rate(process_cpu_seconds_total) over it is the CPU load",
            ),
            &["source"],
        )
        .expect("valid metric");
        let (cores, source) = cpu_allocated;
        cpu_allocation
            .with_label_values(&[source.name()])
            .set(cores);
        for c in [
            Box::new(requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(cpu_seconds.clone()),
            Box::new(cpu_allocation.clone()),
            Box::new(admission_waits.clone()),
            Box::new(app_profile_latency.clone()),
            Box::new(failovers.clone()),
            Box::new(replication_bytes.clone()),
            Box::new(replication_throttled.clone()),
            Box::new(replication_latency.clone()),
            Box::new(replication_max_delay.clone()),
            Box::new(replication_entries.clone()),
            Box::new(tombstone_hold.clone()),
            Box::new(latency.clone()),
            Box::new(rows_read.clone()),
            Box::new(rows_written.clone()),
            Box::new(bytes_read.clone()),
            Box::new(bytes_written.clone()),
            Box::new(storage_bytes.clone()),
            Box::new(memtable_bytes.clone()),
            Box::new(storage_capacity.clone()),
            Box::new(storage_available.clone()),
            Box::new(compaction_pending.clone()),
            Box::new(compactions_running.clone()),
            Box::new(tablets.clone()),
            Box::new(forwarded.clone()),
            Box::new(move_bytes.clone()),
            Box::new(move_fenced_seconds.clone()),
            Box::new(lease_remaining.clone()),
        ] {
            registry.register(c).expect("metric registered once");
        }
        Arc::new(Metrics {
            registry,
            requests,
            latency,
            rows_read,
            rows_written,
            bytes_read,
            bytes_written,
            storage_bytes,
            memtable_bytes,
            storage_capacity,
            storage_available,
            compaction_pending,
            compactions_running,
            tablets,
            forwarded,
            app_profile_latency,
            failovers,
            admission_waits,
            move_bytes,
            move_fenced_seconds,
            lease_remaining,
            replication_latency,
            replication_max_delay,
            replication_entries,
            replication_bytes,
            replication_throttled,
            replication_oldest: parking_lot::Mutex::new(BTreeMap::new()),
            tombstone_hold,
            cluster: parking_lot::Mutex::new(None),
            cpu_seconds,
            cpu_allocated: cores,
            cpu_update: parking_lot::Mutex::new(()),
        })
    }

    /// The CPU the server is allocated, in cores.
    pub fn cpu_allocation(&self) -> f64 {
        self.cpu_allocated
    }

    /// The process's CPU time now, also brought into `process_cpu_seconds_total`.
    pub fn cpu_seconds(&self) -> f64 {
        let _one_at_a_time = self.cpu_update.lock();
        let now = crate::cpu::cpu_seconds();
        let delta = now - self.cpu_seconds.get();
        if delta > 0.0 {
            self.cpu_seconds.inc_by(delta);
        }
        now
    }

    /// One client request routed by its app profile, finished (or its stream begun).
    pub fn app_profile_request(
        &self,
        profile: &str,
        method: &str,
        table: &str,
        cluster: &str,
        code: tonic::Code,
        elapsed: std::time::Duration,
    ) {
        self.app_profile_latency
            .with_label_values(&[profile, method, table, cluster, code_name(code)])
            .observe(elapsed.as_secs_f64());
    }

    /// A request of `priority` waited `waited` for admission.
    pub fn admission_wait(
        &self,
        priority: basalt_meta::AppProfilePriority,
        waited: std::time::Duration,
    ) {
        let name = match priority {
            basalt_meta::AppProfilePriority::High => "HIGH",
            basalt_meta::AppProfilePriority::Medium => "MEDIUM",
            basalt_meta::AppProfilePriority::Low => "LOW",
        };
        self.admission_waits
            .with_label_values(&[name])
            .observe(waited.as_secs_f64());
    }

    /// A multi-cluster request sent on from cluster `from` to cluster `to`.
    pub fn multi_cluster_failover(&self, profile: &str, from: &str, to: &str) {
        self.failovers.with_label_values(&[profile, from, to]).inc();
    }

    /// One request (or part of one) forwarded to another server.
    pub fn forwarded(&self) {
        self.forwarded.inc();
    }

    pub fn move_bytes_sent(&self, bytes: u64) {
        self.move_bytes.with_label_values(&["sent"]).inc_by(bytes);
    }

    pub fn move_bytes_received(&self, bytes: u64) {
        self.move_bytes
            .with_label_values(&["received"])
            .inc_by(bytes);
    }

    /// A moved tablet refused requests at this server (its source) for `seconds`.
    pub fn move_fenced(&self, seconds: f64) {
        self.move_fenced_seconds.observe(seconds);
    }

    /// Entries of `table` committed at `commit_micros` (each) are durable in `peer`.
    pub fn replicated(&self, source: &str, peer: &str, table: &str, commit_micros: &[u64]) {
        let now = basalt_model::hlc::now_micros().max(0) as u64;
        let labels = [source, peer, table];
        let latency = self.replication_latency.with_label_values(&labels);
        for c in commit_micros {
            latency.observe(now.saturating_sub(*c) as f64 / 1e6);
        }
        self.replication_entries
            .with_label_values(&labels)
            .inc_by(commit_micros.len() as u64);
    }

    /// `bytes` of rows of `table` are durable in `peer`.
    pub fn replicated_bytes(&self, source: &str, peer: &str, table: &str, bytes: u64) {
        self.replication_bytes
            .with_label_values(&[source, peer, table])
            .inc_by(bytes);
    }

    /// A batch holding writes of `table` waited `seconds` for the shipping rate limit.
    pub fn replication_throttled(&self, source: &str, peer: &str, table: &str, seconds: f64) {
        self.replication_throttled
            .with_label_values(&[source, peer, table])
            .inc_by(seconds);
    }

    /// The oldest write of `table` that `peer` has not acknowledged was committed at clock
    /// value `oldest` (None: none is waiting). The delay gauge shows its age at each scrape.
    pub fn replication_pending(&self, source: &str, peer: &str, table: &str, oldest: Option<u64>) {
        let key = [source.to_string(), peer.to_string(), table.to_string()];
        let mut pending = self.replication_oldest.lock();
        match oldest {
            Some(hlc) => {
                pending.insert(key, hlc);
            }
            None => {
                pending.remove(&key);
                self.replication_max_delay
                    .with_label_values(&[source, peer, table])
                    .set(0.0);
            }
        }
    }

    /// Cluster mode: where the tablet and lease gauges come from.
    pub fn set_cluster_gauges(&self, gauges: ClusterGauges) {
        *self.cluster.lock() = Some(gauges);
    }

    /// Records one finished RPC.
    pub fn observe(&self, rpc: &str, code: tonic::Code, started: Instant) {
        let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
        if matches!(
            code,
            tonic::Code::Internal | tonic::Code::Unknown | tonic::Code::DataLoss
        ) {
            tracing::warn!(
                rpc,
                code = code_name(code),
                elapsed_ms,
                "request failed on the server side"
            );
        } else {
            tracing::debug!(rpc, code = code_name(code), elapsed_ms, "request finished");
        }
        let code = code_name(code);
        self.requests.with_label_values(&[rpc, code]).inc();
        self.latency
            .with_label_values(&[rpc, code])
            .observe(started.elapsed().as_secs_f64());
    }

    pub fn read(&self, table: &str, rows: u64, bytes: u64) {
        self.rows_read.with_label_values(&[table]).inc_by(rows);
        self.bytes_read.with_label_values(&[table]).inc_by(bytes);
    }

    pub fn written(&self, table: &str, rows: u64, bytes: u64) {
        self.rows_written.with_label_values(&[table]).inc_by(rows);
        self.bytes_written.with_label_values(&[table]).inc_by(bytes);
    }

    /// Renders every metric in the Prometheus text format, refreshing storage gauges first.
    pub fn render(&self, store: &Store) -> String {
        self.cpu_seconds();
        if let Ok(v) = rustix::fs::statvfs(store.path()) {
            let bytes = |blocks: u64| blocks.saturating_mul(v.f_frsize).min(i64::MAX as u64) as i64;
            self.storage_capacity.set(bytes(v.f_blocks));
            self.storage_available.set(bytes(v.f_bavail));
        }
        let s = store.stats();
        self.storage_bytes.set(s.sst_bytes as i64);
        self.memtable_bytes.set(s.memtable_bytes as i64);
        self.compaction_pending
            .set(s.pending_compaction_bytes as i64);
        self.compactions_running.set(s.running_compactions as i64);
        let lag = store.tombstone_safe_point().map_or(0, |safe| {
            (basalt_model::hlc::now_micros().max(0) as u64).saturating_sub(safe)
        });
        self.tombstone_hold.set(lag as f64 / 1e6);
        let now = basalt_model::hlc::now_micros().max(0) as u64;
        for ([source, peer, table], hlc) in self.replication_oldest.lock().iter() {
            self.replication_max_delay
                .with_label_values(&[source.as_str(), peer.as_str(), table.as_str()])
                .set(now.saturating_sub(*hlc) as f64 / 1e6);
        }
        match self.cluster.lock().as_ref() {
            Some(gauges) => {
                let (tablets, lease) = gauges();
                self.tablets.set(tablets);
                self.lease_remaining.set(lease);
            }
            None => self.tablets.set(store.tablet_count() as i64),
        }
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("text encoding to a Vec cannot fail");
        String::from_utf8(buf).expect("prometheus text is UTF-8")
    }
}

/// The canonical upper-case gRPC code name (as in google.rpc.Code).
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}
