//! Cluster mode: the server registers in its instance's coordination store (etcd), mirrors the
//! instance's catalog into its store, follows its cluster's tablet map, serves the tablets it
//! owns while its lease is current, and is a frontend for every other tablet (see
//! `../shared/DISTRIBUTED.md` and `docs/cluster.md`).
//!
//! * [`routing`]: the tablet map and the serving rule;
//! * [`frontend`]: the data API of a cluster server (local, forwarded or fanned out);
//! * [`catalog`]: table administration through etcd.

pub mod catalog;
pub mod frontend;
pub mod moves;
pub mod routing;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use basalt_meta::{EtcdEndpoints, Keys, LeaseTiming, Meta, Registration, ServerRecord};
use basalt_model::hlc::now_micros;
use basalt_storage::Store;
use basalt_transport::Dialer;
use tracing::{info, warn};

use crate::error::{Error, Result};
use routing::{ClusterState, Routing};

/// Where a cluster server belongs.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// The Cluster's name.
    pub cluster: String,
    /// etcd client URLs.
    pub etcd: Vec<String>,
    /// The namespace and instance: the etcd prefix `/basalt/v1/<namespace>/<instance>/`.
    pub namespace: String,
    pub instance: String,
    /// The project of the instance's resource name `projects/<project>/instances/<instance>`.
    pub project: String,
    pub timing: LeaseTiming,
}

impl ClusterConfig {
    /// `projects/<project>/instances/<instance>`: the only instance this server serves.
    pub fn instance_name(&self) -> String {
        format!("projects/{}/instances/{}", self.project, self.instance)
    }
}

/// A registered cluster server's shared state.
pub struct Node {
    pub config: ClusterConfig,
    pub meta: Meta,
    /// Every connection to another server (forwarding, fan-out, moves) is made through it.
    pub dialer: Dialer,
    pub routing: Arc<Routing>,
    pub store: Arc<Store>,
    pub metrics: Arc<crate::metrics::Metrics>,
    /// The tablet moves this server takes part in.
    pub moves: moves::Moves,
    /// Where moves keep their files (under the data directory).
    pub moves_dir: std::path::PathBuf,
    /// Taken by [`Node::stop`].
    registration: parking_lot::Mutex<Option<Registration>>,
}

/// How long the disk may go without a completed fsync before the server stops renewing its
/// lease (a stalled disk must not keep tablets).
const DISK_STALL: Duration = Duration::from_secs(5);

/// Who a server says it is in its registration.
#[derive(Clone, Debug)]
pub struct Advertised {
    /// Its name (the pod's, `<cluster>-<ordinal>`).
    pub name: String,
    /// Where its gRPC port is reached (`host:port`).
    pub address: String,
    /// Where its HTTP port is reached (`host:port`).
    pub http_address: String,
}

impl Node {
    /// Connects to etcd (retrying while it is unreachable, until `give_up`), registers, and
    /// starts following the catalog and the tablet map. Every connection it makes to etcd
    /// and to the other servers goes through `dialer`.
    pub async fn start(
        config: ClusterConfig,
        dialer: Dialer,
        store: Arc<Store>,
        me: Advertised,
        data_dir: &std::path::Path,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> Result<Arc<Node>> {
        let Advertised {
            name,
            address,
            http_address,
        } = me;
        let keys = Keys::new(&config.namespace, &config.instance);
        let etcd = EtcdEndpoints::new(&config.etcd, dialer.security())
            .map_err(|e| Error::InvalidArgument(format!("--etcd: {e}")))?;
        let meta = loop {
            match Meta::connect(&etcd, keys.clone()).await {
                Ok(meta) => break meta,
                Err(e) => {
                    warn!(error = %e, etcd = ?config.etcd, "cannot reach etcd yet; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        };
        let store_id = {
            let store = store.clone();
            tokio::task::spawn_blocking(move || store.store_id())
                .await
                .map_err(|e| Error::Internal(e.to_string()))??
        };
        let last_sync = Arc::new(AtomicI64::new(now_micros()));
        spawn_disk_probe(store.clone(), last_sync.clone());
        let can_renew = {
            let last_sync = last_sync.clone();
            Arc::new(move || {
                now_micros() - last_sync.load(Ordering::Relaxed) < DISK_STALL.as_micros() as i64
            })
        };
        let record = ServerRecord {
            store_id: store_id.clone(),
            ordinal: name.rsplit('-').next().and_then(|o| o.parse().ok()),
            name,
            address,
            http_address: Some(http_address),
            incarnation: now_micros(),
        };
        let registration = loop {
            match meta
                .register(
                    &config.cluster,
                    record.clone(),
                    config.timing,
                    can_renew.clone(),
                )
                .await
            {
                Ok(r) => break r,
                Err(e) => {
                    warn!(error = %e, "cannot register yet; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        };
        info!(
            store_id,
            cluster = config.cluster,
            "registered in the coordination store"
        );
        let routing = Arc::new(Routing::new(
            store_id,
            config.cluster.clone(),
            registration.subscribe(),
        ));
        let node = Arc::new(Node {
            config,
            meta,
            dialer,
            routing,
            store,
            metrics,
            moves: moves::Moves::default(),
            moves_dir: data_dir.join("moves"),
            registration: parking_lot::Mutex::new(Some(registration)),
        });
        // Files of moves a previous process did not finish (they were aborted with it).
        let _ = std::fs::remove_dir_all(&node.moves_dir);
        tokio::spawn(follow(node.clone()));
        Ok(node)
    }

    /// Registered, the lease current and the catalog and tablet map read at least once.
    pub fn ready(&self) -> bool {
        self.routing.serving() && self.routing.state().revision > 0
    }

    /// Seconds left before this server must stop serving without a lease renewal.
    pub fn lease_remaining(&self) -> Duration {
        self.routing
            .liveness()
            .remaining(tokio::time::Instant::now())
    }

    /// Leaves the cluster cleanly (the registration is deleted at once, so the master and the
    /// other servers see it gone without waiting for its lease to expire).
    pub async fn stop(self: Arc<Self>) {
        let registration = self.registration.lock().take();
        if let Some(registration) = registration {
            registration.unregister().await;
        }
    }
}

/// Every second, one synced write: the time of the last one that completed tells whether
/// the disk still syncs.
fn spawn_disk_probe(store: Arc<Store>, last_sync: Arc<AtomicI64>) {
    tokio::spawn(async move {
        loop {
            let s = store.clone();
            if let Ok(Ok(())) = tokio::task::spawn_blocking(move || s.sync_probe()).await {
                last_sync.store(now_micros(), Ordering::Relaxed);
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
}

/// Keeps the store's catalog and the routing state in step with etcd: a full read, then a
/// watch of the instance's prefix; every batch of events triggers another full read (small:
/// schemas, one cluster's tablets and servers). A read every few seconds anyway, in case a
/// watch silently stalls.
async fn follow(node: Arc<Node>) {
    loop {
        let revision = match sync(&node).await {
            Ok(revision) => revision,
            Err(e) => {
                warn!(error = %e, "cannot read the catalog and tablet map; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let mut stream = match node
            .meta
            .watch(node.meta.keys().prefix(), revision + 1)
            .await
        {
            Ok(stream) => stream,
            Err(e) => {
                warn!(error = %e, "cannot watch the coordination store; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        // Until the watch ends (etcd restarted, the stream broke): then read and watch again.
        while let Ok(Ok(Some(_))) | Err(_) =
            tokio::time::timeout(Duration::from_secs(5), stream.message()).await
        {
            if let Err(e) = sync(&node).await {
                warn!(error = %e, "cannot read the catalog and tablet map");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
            // Moves whose record is gone (committed, aborted, or their master died) end here.
            // The map is read after the records: a move missing from them that committed
            // shows its new owner in it.
            let since = std::time::Instant::now();
            if let Ok(records) = node.meta.moves(&node.config.cluster).await
                && let Ok((fresh, _)) = node.meta.tablets(&node.config.cluster).await
            {
                moves::reconcile(&node, &records, &fresh, since).await;
            }
        }
    }
}

/// One full read: installs changed schemas, removes deleted tables, publishes the tablet map
/// and the registered servers. Returns the revision read.
async fn sync(node: &Node) -> basalt_model::Result<i64> {
    let (schemas, revision) = node.meta.tables().await?;
    let (map, tablets_revision) = node.meta.tablets(&node.config.cluster).await?;
    let instance = node.config.instance_name();
    let store = node.store.clone();
    // This server's copy of a table takes its splits from the cluster's tablet map (after
    // splits they are no longer the table's initial ones): requests are counted, samples cut
    // and tablets reported by the tablets that exist.
    let wanted: HashMap<String, basalt_model::TableSchema> = schemas
        .into_iter()
        .filter(|s| s.schema.name.starts_with(&format!("{instance}/tables/")))
        .map(|s| {
            let mut schema = s.schema;
            let tablets = map.tablets(basalt_meta::table_id(&schema.name));
            if !tablets.is_empty() {
                schema.splits = tablets
                    .iter()
                    .skip(1)
                    .map(|t| t.range.start.to_vec())
                    .collect();
            }
            (schema.name.clone(), schema)
        })
        .collect();
    // The ranges this server owns by the map: served here even if they were moved away and
    // released before (a tablet back after a move, or reassigned after an accepted loss). The
    // map is published after this, so the routing never sends a request to a range the
    // store still refuses.
    let me = node.routing.me().to_string();
    let owned: Vec<(String, basalt_model::RowRange)> = map
        .owned_by(&me)
        .filter(|t| t.state == basalt_model::TabletState::Serving)
        .map(|t| (format!("{instance}/tables/{}", t.table), t.range.clone()))
        .collect();
    tokio::task::spawn_blocking(move || -> basalt_model::Result<()> {
        for schema in wanted.values() {
            let current = store.table(&schema.name).ok();
            if current.as_deref() != Some(schema) {
                store.install_schema(schema.clone())?;
            }
        }
        for (name, range) in &owned {
            if let Ok(table) = store.table(name)
                && store.serve(&table, range)
            {
                info!(
                    table = name,
                    ?range,
                    "serving a range this server had moved away"
                );
            }
        }
        for table in store.list_tables(&instance) {
            if !wanted.contains_key(&table.name) {
                info!(table = table.name, "table deleted: removing its data");
                store.remove_table(&table.name)?;
            }
        }
        Ok(())
    })
    .await
    .map_err(|e| basalt_model::Error::Internal(e.to_string()))??;
    let (servers, servers_revision) = node.meta.servers(Some(&node.config.cluster)).await?;
    let servers = servers
        .into_iter()
        .map(|r| (r.record.store_id.clone(), r.record))
        .collect();
    let revision = revision.min(tablets_revision).min(servers_revision);
    node.routing.publish(ClusterState {
        map,
        servers,
        revision,
    });
    Ok(revision)
}
