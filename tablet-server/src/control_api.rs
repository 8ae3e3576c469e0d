//! `basalt.control.v1.TabletServerControl`: Basalt's own control protocol, served on the gRPC
//! port next to Google's APIs. The master (today the operator) asks a server who it is,
//! whether it serves, what its volume holds, and the size and load of each tablet it serves
//! (`docs/control-protocol.md`). Tablet control (assign, unassign, fence, split), moves,
//! forwarding and replication are added to this service or to sibling services of the same
//! package in the issues that build them.
//!
//! A standalone server serves every tablet of every table in its store: a table's tablets
//! are the ranges between its splits (`TableSchema::tablet_ranges`), their sizes RocksDB's
//! estimates of those ranges, their loads what [`crate::load`] counted.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Instant, SystemTime};

use basalt_control::v1::{
    GetKeySamplesRequest, GetKeySamplesResponse, GetSplitPointRequest, GetSplitPointResponse,
    KeyRangeSample,
};
use basalt_control::{
    CpuStatus, GetServerStatusRequest, GetServerStatusResponse, ServerIdentity, ServingMode,
    StorageStatus, TabletLoad, TabletServerControl, TabletStatus, micros_since_epoch,
};
use basalt_model::TableSchema;
use basalt_storage::Store;
use tonic::{Request, Response, Status};

use crate::key_samples::{KeySampler, with_tablet_sizes};
use crate::load::{LOAD_WINDOW, LoadReport, TabletLoads};
use crate::metrics::Metrics;

/// Who this server says it is. Every field has a default, so a server started without the
/// identity flags still answers.
#[derive(Debug, Clone, Default)]
pub struct Identity {
    /// Its name; None: the pod name (`POD_NAME`), else the host name.
    pub server_id: Option<String>,
    /// The `host:port` peers reach its gRPC APIs at; None: the address it is bound to.
    pub advertise_address: Option<String>,
    /// The Basalt instance it belongs to; None: unknown (a standalone server).
    pub instance: Option<String>,
}

impl Identity {
    /// `server_id`, else `POD_NAME` (set on Basalt's pods), else `HOSTNAME`, else the
    /// kernel's host name.
    pub fn resolved_server_id(&self) -> String {
        let env = |name| std::env::var(name).ok().filter(|v: &String| !v.is_empty());
        self.server_id
            .clone()
            .or_else(|| env("POD_NAME"))
            .or_else(|| env("HOSTNAME"))
            .or_else(|| {
                std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .ok()
                    .map(|h| h.trim().to_string())
                    .filter(|h| !h.is_empty())
            })
            .unwrap_or_else(|| "unknown".into())
    }
}

#[derive(Clone)]
pub struct ControlService {
    store: Arc<Store>,
    loads: Arc<TabletLoads>,
    key_samples: Arc<KeySampler>,
    metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
    identity: ServerIdentity,
    data_dir: PathBuf,
    /// Cluster mode: the tablets this server owns (it reports only those, at their epoch).
    owned: Option<OwnedTablets>,
}

/// The tablets a cluster server owns now.
pub type OwnedTablets = Arc<dyn Fn() -> Vec<basalt_model::Tablet> + Send + Sync>;

impl ControlService {
    /// `identity` as the server resolved it at start-up (see [`server_identity`]); `ready` is
    /// the flag `/readyz` reports; `data_dir` is where the store lives (its volume's size is
    /// reported).
    pub fn new(
        store: Arc<Store>,
        loads: Arc<TabletLoads>,
        key_samples: Arc<KeySampler>,
        metrics: Arc<Metrics>,
        ready: Arc<AtomicBool>,
        identity: ServerIdentity,
        data_dir: PathBuf,
    ) -> ControlService {
        ControlService {
            store,
            loads,
            key_samples,
            metrics,
            ready,
            identity,
            data_dir,
            owned: None,
        }
    }

    /// The report, from the store's catalog, its estimates and the counted loads. Blocking
    /// (RocksDB properties and the volume's statistics).
    /// In cluster mode: report only `owned()`'s tablets, at their epochs.
    pub fn with_owned(mut self, owned: OwnedTablets) -> Self {
        self.identity.mode = ServingMode::Cluster as i32;
        self.owned = Some(owned);
        self
    }

    /// The tablets this server holds now, as (table, range, epoch): in cluster mode those of
    /// the map it owns, standalone every table's ranges between its splits (epoch 0).
    fn held<'a>(
        &self,
        tables: &'a [Arc<TableSchema>],
    ) -> Vec<(&'a Arc<TableSchema>, basalt_model::RowRange, u64)> {
        let Some(owned) = &self.owned else {
            return tables
                .iter()
                .flat_map(|t| t.tablet_ranges().into_iter().map(move |r| (t, r, 0)))
                .collect();
        };
        let by_table: std::collections::HashMap<&str, &Arc<TableSchema>> = tables
            .iter()
            .map(|t| (basalt_meta::table_id(&t.name), t))
            .collect();
        owned()
            .into_iter()
            .filter_map(|o| Some((*by_table.get(o.table.as_str())?, o.range, o.epoch)))
            .collect()
    }

    /// The size of every tablet this server holds, by table name, in key order (the Key
    /// Visualizer's bytes stored; tablets of no bytes left out). Blocking (RocksDB's
    /// estimates).
    fn tablet_sizes(&self, tables: &[Arc<TableSchema>]) -> BTreeMap<String, Vec<KeyRangeSample>> {
        let mut sizes: BTreeMap<String, Vec<KeyRangeSample>> = BTreeMap::new();
        let mut held = self.held(tables);
        held.sort_by(|a, b| (&a.0.name, &a.1.start).cmp(&(&b.0.name, &b.1.start)));
        for (table, range, _) in held {
            let bytes = self.store.approximate_size(table, &range);
            if bytes > 0 {
                sizes
                    .entry(table.name.clone())
                    .or_default()
                    .push(KeyRangeSample {
                        start_key: range.start.clone(),
                        end_key: range.end.clone().unwrap_or_default(),
                        stored_bytes: bytes,
                        ..KeyRangeSample::default()
                    });
            }
        }
        for tablets in sizes.values_mut() {
            *tablets = at_most(std::mem::take(tablets), MAX_SIZE_RANGES);
        }
        sizes
    }

    fn status(&self) -> GetServerStatusResponse {
        let tables = self.store.all_tables();
        self.loads.retain(|id| tables.iter().any(|t| t.id == id));
        self.key_samples
            .retain(|id| tables.iter().any(|t| t.id == id));
        let stats = self.store.stats();
        let volume = rustix::fs::statvfs(&self.data_dir).ok();
        let storage = StorageStatus {
            sst_bytes: stats.sst_bytes,
            memtable_bytes: stats.memtable_bytes,
            capacity_bytes: volume
                .as_ref()
                .map(|v| v.f_blocks.saturating_mul(v.f_frsize)),
            available_bytes: volume
                .as_ref()
                .map(|v| v.f_bavail.saturating_mul(v.f_frsize)),
            pending_compaction_bytes: stats.pending_compaction_bytes,
        };
        let mut tablets: Vec<TabletStatus> = tables
            .iter()
            .flat_map(|table| {
                tablets(table, self.loads.report(table), |range| {
                    self.store.approximate_size(table, range)
                })
            })
            .collect();
        if self.owned.is_some() {
            // Cluster mode: the tablets of the map this server owns, at their epochs (after
            // splits and moves they need not match the table's initial splits; a tablet's load
            // is known only while its range is one of those).
            tablets = self
                .held(&tables)
                .into_iter()
                .map(|(table, range, epoch)| {
                    let load = tablets
                        .iter()
                        .find(|t| t.table_name == table.name && t.range() == range)
                        .and_then(|t| t.load);
                    TabletStatus {
                        approximate_bytes: self.store.approximate_size(table, &range),
                        load,
                        ..TabletStatus::new(table.name.clone(), &range, epoch)
                    }
                })
                .collect();
        }
        GetServerStatusResponse {
            server: Some(self.identity.clone()),
            ready: self.ready.load(Ordering::SeqCst),
            storage: Some(storage),
            tablets,
            load_window_seconds: LOAD_WINDOW.as_secs() as u32,
            report_time_micros: micros_since_epoch(SystemTime::now()),
            cpu: Some(CpuStatus {
                cpu_seconds: self.metrics.cpu_seconds(),
                allocation_cores: self.metrics.cpu_allocation(),
            }),
        }
    }
}

/// Most tablet sizes a table reports per minute (a column of the Key Visualizer holds 1,024
/// ranges at most; a server of 100,000 tablets would otherwise send megabytes a minute).
const MAX_SIZE_RANGES: usize = 1024;

/// `tablets` (in key order) as at most `max` ranges: runs of neighbours joined, from the
/// first one's start to the last one's end, their bytes summed. A run may span tablets of
/// other servers between them: its bytes are then spread over their keys too.
fn at_most(tablets: Vec<KeyRangeSample>, max: usize) -> Vec<KeyRangeSample> {
    if tablets.len() <= max {
        return tablets;
    }
    let per = tablets.len().div_ceil(max);
    tablets
        .chunks(per)
        .map(|run| KeyRangeSample {
            start_key: run[0].start_key.clone(),
            end_key: run[run.len() - 1].end_key.clone(),
            stored_bytes: run.iter().map(|t| t.stored_bytes).sum(),
            ..KeyRangeSample::default()
        })
        .collect()
}

/// The identity a server reports: `identity` resolved, with the cluster it was given and the
/// address its gRPC APIs are bound to. `started` is when the process started.
pub fn server_identity(
    identity: &Identity,
    cluster: &str,
    bound: std::net::SocketAddr,
    started: SystemTime,
) -> ServerIdentity {
    ServerIdentity {
        server_id: identity.resolved_server_id(),
        address: identity
            .advertise_address
            .clone()
            .unwrap_or_else(|| bound.to_string()),
        instance: identity.instance.clone().unwrap_or_default(),
        cluster: cluster.to_string(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        start_time_micros: micros_since_epoch(started),
        mode: ServingMode::Standalone as i32,
    }
}

/// The tablets of `table` as reported: one per range between its splits, in key order, with
/// `size` of its range and its load (`loads` in the same order). Standalone: epoch 0.
fn tablets(
    table: &TableSchema,
    loads: Vec<LoadReport>,
    size: impl Fn(&basalt_model::RowRange) -> u64,
) -> Vec<TabletStatus> {
    table
        .tablet_ranges()
        .iter()
        .zip(loads)
        .map(|(range, load)| TabletStatus {
            approximate_bytes: size(range),
            load: Some(TabletLoad {
                read_requests_per_sec: load.read_requests_per_sec,
                write_requests_per_sec: load.write_requests_per_sec,
                read_requests: load.read_requests,
                write_requests: load.write_requests,
            }),
            ..TabletStatus::new(table.name.clone(), range, 0)
        })
        .collect()
}

#[tonic::async_trait]
impl TabletServerControl for ControlService {
    async fn get_server_status(
        &self,
        _request: Request<GetServerStatusRequest>,
    ) -> Result<Response<GetServerStatusResponse>, Status> {
        let started = Instant::now();
        let service = self.clone();
        let result = tokio::task::spawn_blocking(move || service.status())
            .await
            .map_err(|e| Status::internal(format!("status worker failed: {e}")));
        let code = result
            .as_ref()
            .map_or_else(|s| s.code(), |_| tonic::Code::Ok);
        self.metrics.observe("GetServerStatus", code, started);
        result.map(Response::new)
    }

    async fn get_split_point(
        &self,
        request: Request<GetSplitPointRequest>,
    ) -> Result<Response<GetSplitPointResponse>, Status> {
        let req = request.into_inner();
        let table = self
            .store
            .table(&req.table_name)
            .map_err(|e| crate::error::status(e.into()))?;
        let range = basalt_control::keys_to_range(&req.start_key, &req.end_key);
        let store = self.store.clone();
        let (row, bytes) = tokio::task::spawn_blocking(move || {
            let bytes = store.approximate_size(&table, &range);
            store.split_point(&table, &range).map(|row| (row, bytes))
        })
        .await
        .map_err(|e| Status::internal(format!("split worker failed: {e}")))?
        .map_err(|e| crate::error::status(e.into()))?;
        Ok(Response::new(GetSplitPointResponse {
            row_key: row.unwrap_or_default(),
            approximate_bytes: bytes,
        }))
    }

    async fn get_key_samples(
        &self,
        request: Request<GetKeySamplesRequest>,
    ) -> Result<Response<GetKeySamplesResponse>, Status> {
        let after = request.into_inner().after_minute;
        let service = self.clone();
        let response = tokio::task::spawn_blocking(move || {
            let tables = service.store.all_tables();
            service
                .key_samples
                .retain(|id| tables.iter().any(|t| t.id == id));
            let samples = service
                .key_samples
                .samples(after, service.identity.start_time_micros);
            with_tablet_sizes(samples, after, || service.tablet_sizes(&tables))
        })
        .await
        .map_err(|e| Status::internal(format!("key samples worker failed: {e}")))?;
        Ok(Response::new(response))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use basalt_model::RowRange;
    use bytes::Bytes;

    #[test]
    fn a_table_is_reported_as_one_tablet_per_range_between_its_splits() {
        let table = TableSchema {
            id: 7,
            name: "projects/p/instances/i/tables/orders".into(),
            families: Default::default(),
            dropped_families: Default::default(),
            deletion_protection: false,
            splits: vec![b"g".to_vec(), b"p".to_vec()],
            created_micros: 0,
            restore: None,
        };
        let loads = vec![
            LoadReport::default(),
            LoadReport {
                read_requests_per_sec: 1.5,
                write_requests_per_sec: 0.5,
                read_requests: 90,
                write_requests: 30,
            },
            LoadReport::default(),
        ];
        let reported = tablets(&table, loads, |r| r.start.len() as u64 * 100 + 1);
        let ranges: Vec<RowRange> = reported.iter().map(TabletStatus::range).collect();
        let b = |s: &'static str| Bytes::from_static(s.as_bytes());
        assert_eq!(
            ranges,
            [
                RowRange::new(Bytes::new(), Some(b("g"))),
                RowRange::new(b("g"), Some(b("p"))),
                RowRange::new(b("p"), None),
            ]
        );
        assert!(
            reported
                .iter()
                .all(|t| t.table_id() == "orders" && t.epoch == 0)
        );
        assert_eq!(reported[0].approximate_bytes, 1);
        assert_eq!(reported[1].approximate_bytes, 101);
        let load = reported[1].load.unwrap();
        assert_eq!(load.requests_per_sec(), 2.0);
        assert_eq!(load.requests(), 120);
    }

    #[test]
    fn many_tablet_sizes_are_joined_into_at_most_the_ranges_a_column_keeps() {
        let key = |i: u32| Bytes::from(format!("k{i:06}"));
        let tablets: Vec<KeyRangeSample> = (0..2500u32)
            .map(|i| KeyRangeSample {
                start_key: if i == 0 { Bytes::new() } else { key(i) },
                end_key: if i == 2499 { Bytes::new() } else { key(i + 1) },
                stored_bytes: u64::from(i),
                ..KeyRangeSample::default()
            })
            .collect();
        let joined = at_most(tablets.clone(), 1024);
        assert!(joined.len() <= 1024, "{}", joined.len());
        let total = |t: &[KeyRangeSample]| t.iter().map(|s| s.stored_bytes).sum::<u64>();
        assert_eq!(total(&joined), total(&tablets));
        assert_eq!(joined[0].start_key, Bytes::new());
        assert_eq!(joined[joined.len() - 1].end_key, Bytes::new());
        for pair in joined.windows(2) {
            assert_eq!(pair[0].end_key, pair[1].start_key);
        }
        assert_eq!(at_most(tablets[..10].to_vec(), 1024).len(), 10);
    }

    #[test]
    fn identity_falls_back_to_the_bound_address_and_a_host_name() {
        let bound: std::net::SocketAddr = "127.0.0.1:8086".parse().unwrap();
        let id = server_identity(&Identity::default(), "c1", bound, SystemTime::UNIX_EPOCH);
        assert_eq!(id.address, "127.0.0.1:8086");
        assert_eq!(id.cluster, "c1");
        assert_eq!(id.instance, "");
        assert!(!id.server_id.is_empty());
        assert_eq!(id.mode(), ServingMode::Standalone);
        let given = Identity {
            server_id: Some("orders-c1-0".into()),
            advertise_address: Some("orders-c1-0.orders-c1:8086".into()),
            instance: Some("orders".into()),
        };
        let id = server_identity(&given, "c1", bound, SystemTime::UNIX_EPOCH);
        assert_eq!(
            (
                id.server_id.as_str(),
                id.address.as_str(),
                id.instance.as_str()
            ),
            ("orders-c1-0", "orders-c1-0.orders-c1:8086", "orders")
        );
    }
}
