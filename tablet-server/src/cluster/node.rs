//! A registered cluster server's shared state ([`Node`]): where it belongs, its registration
//! under a lease in the instance's coordination store (etcd), its view of the tablet map, its
//! store, the moves it takes part in, and the [`Dialer`] every peer connection goes through.
//! The other rooms of `cluster` take a `Node`; the catalog mirror ([`super::mirror`]) keeps it
//! current.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use basalt_meta::{EtcdEndpoints, Keys, LeaseTiming, Meta, Registration, ServerRecord};
use basalt_model::hlc::now_micros;
use basalt_storage::Store;
use basalt_transport::Dialer;
use tracing::{info, warn};

use super::moves::registry::Moves;
use super::tablet_router::TabletRouter;
use crate::error::{Error, Result};

/// Where a cluster server belongs.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// The Cluster's name.
    pub cluster: String,
    /// etcd client URLs.
    pub etcd: Vec<String>,
    /// How etcd is reached: plaintext (`http://` URLs), or TLS with the CA etcd's
    /// certificate chains to and the client certificate this server presents to it
    /// (`--etcd-ca`, `--etcd-cert`, `--etcd-key`; `https://` URLs).
    pub etcd_security: basalt_transport::Security,
    /// The namespace and instance: the etcd prefix `/basalt/v1/<namespace>/<instance>/`.
    pub namespace: String,
    pub instance: String,
    /// The project of the instance's resource name `projects/<project>/instances/<instance>`.
    pub project: String,
    pub timing: LeaseTiming,
    /// How long the change log waits for a peer cluster not heard from (then it is
    /// re-seeded): `--change-log-retention-secs`.
    pub change_log_retention: std::time::Duration,
    /// Admission by app-profile priority: `--low-priority-write-kib-per-sec` and
    /// `--medium-priority-write-kib-per-sec` (see [`crate::cluster::routing::priority`]).
    pub priority: crate::cluster::routing::priority::Limits,
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
    pub router: Arc<TabletRouter>,
    pub store: Arc<Store>,
    pub metrics: Arc<crate::metrics::Metrics>,
    /// The tablet moves this server takes part in.
    pub moves: Moves,
    /// Where moves keep their files (under the data directory).
    pub moves_dir: std::path::PathBuf,
    /// The clusters of the instance that replicate (this one included), as last read from etcd
    /// (`super::replication::shipper` keeps it current).
    pub replicas: parking_lot::RwLock<Vec<String>>,
    /// The clusters being seeded (`seeds/` in etcd), as the shipper last read them.
    pub seeding: parking_lot::RwLock<std::collections::BTreeMap<String, basalt_meta::SeedRecord>>,
    /// This server's share of the instance's shipping limit to each peer cluster, in bytes per
    /// second (0: unlimited), as the shipper last computed it from etcd.
    pub ship_rate: std::sync::atomic::AtomicU64,
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
    /// Connects to etcd (retrying while it is unreachable) and registers; the catalog mirror
    /// ([`super::mirror::follow`]) then keeps the catalog and the tablet map current. Every
    /// connection it makes to etcd and to the other servers goes through `dialer`.
    pub async fn register(
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
        let etcd = EtcdEndpoints::new(&config.etcd, &config.etcd_security)
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
        // The cluster's number is the tiebreaker of its writes' versions: known before the
        // server serves, as is whether other clusters replicate (then every write is logged
        // for them from the first; see `super::replication`).
        let number = loop {
            match meta.cluster_number(&config.cluster).await {
                Ok(n) => break n,
                Err(e) => {
                    warn!(error = %e, "cannot read the cluster's number yet; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        };
        store.set_cluster_number(number);
        let replicas: Vec<String> = loop {
            match meta.cluster_numbers().await {
                Ok(numbers) => break numbers.into_keys().collect(),
                Err(e) => {
                    warn!(error = %e, "cannot read the instance's clusters yet; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        };
        if replicas.len() > 1 {
            store.set_change_log(true);
        } else {
            // No other cluster: tombstones go after the grace (the shipper's follower holds
            // them again if one joins).
            store.set_tombstone_safe_point(None);
        }
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
        let router = Arc::new(TabletRouter::new(
            store_id,
            config.cluster.clone(),
            registration.subscribe(),
        ));
        let node = Arc::new(Node {
            config,
            meta,
            dialer,
            router,
            store,
            metrics,
            moves: Moves::default(),
            moves_dir: data_dir.join("moves"),
            replicas: parking_lot::RwLock::new(replicas),
            seeding: parking_lot::RwLock::new(Default::default()),
            ship_rate: std::sync::atomic::AtomicU64::new(0),
            registration: parking_lot::Mutex::new(Some(registration)),
        });
        // Files of moves a previous process did not finish (they were aborted with it).
        let _ = std::fs::remove_dir_all(&node.moves_dir);
        Ok(node)
    }

    /// Registered, the lease current and the catalog and tablet map read at least once.
    pub fn ready(&self) -> bool {
        self.router.serving() && self.router.state().revision > 0
    }

    /// Seconds left before this server must stop serving without a lease renewal.
    pub fn lease_remaining(&self) -> Duration {
        self.router
            .liveness()
            .remaining(tokio::time::Instant::now())
    }

    /// Leaves the cluster cleanly: first its shippers get up to
    /// [`SHIP_ON_STOP`](super::replication::shipper::SHIP_ON_STOP) to bring the other clusters
    /// the rest of its log (no write comes in any more), so its last reports cover every write
    /// it acknowledged; then the registration is deleted at once, so the master and the other
    /// servers see it gone without waiting for its lease to expire.
    pub async fn stop(self: Arc<Self>) {
        super::replication::shipper::ship_the_rest(
            &self,
            super::replication::shipper::SHIP_ON_STOP,
        )
        .await;
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
