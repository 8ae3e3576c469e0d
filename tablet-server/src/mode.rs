//! The server's mode, chosen once at startup: standalone (its store holds every table of
//! every instance) or a cluster server (registered in its instance's etcd, serving the tablets
//! it owns and a frontend for all others). The [`Mode`] provides the backends the handlers
//! call — the admin API's [`Catalog`], the `Bigtable` service, the tablets the control service
//! reports, the readiness — so no handler asks which mode it runs in.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use basalt_model::limits::MAX_MESSAGE_BYTES;
use basalt_storage::Store;
use basalt_transport::Dialer;
use tonic::service::RoutesBuilder;

use crate::access::{Access, Authorized};
use crate::catalog::{Catalog, LocalCatalog};
use crate::cluster::catalog::EtcdCatalog;
use crate::cluster::frontend::Frontend;
use crate::cluster::moves::service::MoveService;
use crate::cluster::replication::service::ReplicationService;
use crate::cluster::{Advertised, ClusterConfig, Node};
use crate::control_api::ControlService;
use crate::data_api::DataService;
use crate::error::Result;
use crate::metrics::Metrics;
use crate::proto::bigtable_server::BigtableServer;

/// Largest message of the tablet-move and replication services (SST chunks and log batches).
const MOVE_MESSAGE_BYTES: usize = 64 << 20;

pub enum Mode {
    /// No coordination store: this server's store is the catalog and holds every row.
    Standalone,
    /// A registered server of a cluster.
    Cluster(Arc<Node>),
}

impl Mode {
    /// Standalone without a `cluster`; otherwise registers in the cluster's etcd (retrying
    /// while it is unreachable) and starts following the catalog and the tablet map. Every
    /// connection to etcd and to the other servers goes through `dialer`.
    pub async fn start(
        cluster: Option<&ClusterConfig>,
        dialer: Dialer,
        store: &Arc<Store>,
        me: impl FnOnce() -> Advertised,
        data_dir: &Path,
        metrics: &Arc<Metrics>,
    ) -> Result<Mode> {
        let Some(cluster) = cluster else {
            return Ok(Mode::Standalone);
        };
        let node = Node::register(
            cluster.clone(),
            dialer,
            store.clone(),
            me(),
            data_dir,
            metrics.clone(),
        )
        .await?;
        crate::cluster::mirror::spawn(node.clone());
        crate::cluster::replication::shipper::spawn(node.clone());
        // Weak: the node holds the metrics (a strong reference back would keep the node, and
        // with it the store, alive after the server ended).
        let gauges_node = Arc::downgrade(&node);
        metrics.set_cluster_gauges(Arc::new(move || {
            gauges_node.upgrade().map_or((0, 0.0), |node| {
                (
                    node.router.owned().len() as i64,
                    node.lease_remaining().as_secs_f64(),
                )
            })
        }));
        Ok(Mode::Cluster(node))
    }

    /// The cluster this server reports being (`standalone`: a standalone server's).
    pub fn cluster_name(&self, standalone: &str) -> String {
        match self {
            Mode::Standalone => standalone.to_string(),
            Mode::Cluster(node) => node.config.cluster.clone(),
        }
    }

    /// Where the admin API changes schemas.
    pub fn catalog(&self, store: &Arc<Store>) -> Arc<dyn Catalog> {
        match self {
            Mode::Standalone => Arc::new(LocalCatalog::new(store.clone())),
            Mode::Cluster(node) => Arc::new(EtcdCatalog::new(node.clone())),
        }
    }

    /// The instance's etcd, in cluster mode.
    pub fn meta(&self) -> Option<basalt_meta::Meta> {
        match self {
            Mode::Standalone => None,
            Mode::Cluster(node) => Some(node.meta.clone()),
        }
    }

    /// The control service, reporting (in cluster mode) only the tablets this server owns.
    /// The cluster node (cluster mode).
    pub fn node(&self) -> Option<Arc<Node>> {
        match self {
            Mode::Standalone => None,
            Mode::Cluster(node) => Some(node.clone()),
        }
    }

    pub fn control(&self, service: ControlService) -> ControlService {
        match self {
            Mode::Standalone => service,
            Mode::Cluster(node) => {
                let node = node.clone();
                service.with_owned(Arc::new(move || node.router.owned()))
            }
        }
    }

    /// Adds the mode's gRPC services: the `Bigtable` service (the local data API, or in
    /// cluster mode the frontend in front of it) and, in cluster mode, the tablet-move service.
    pub fn add_services(
        &self,
        routes: &mut RoutesBuilder,
        local: DataService<Store>,
        metrics: &Arc<Metrics>,
        access: &Arc<Access>,
    ) {
        match self {
            Mode::Standalone => {
                routes.add_service(
                    BigtableServer::new(Authorized::new(local, access.clone()))
                        .max_decoding_message_size(MAX_MESSAGE_BYTES)
                        .max_encoding_message_size(MAX_MESSAGE_BYTES),
                );
            }
            Mode::Cluster(node) => {
                routes.add_service(
                    basalt_control::ReplicationServer::new(ReplicationService::new(node.clone()))
                        .max_decoding_message_size(MOVE_MESSAGE_BYTES)
                        .max_encoding_message_size(MOVE_MESSAGE_BYTES),
                );
                routes.add_service(
                    basalt_control::TabletMoveServer::new(MoveService::new(node.clone()))
                        .max_decoding_message_size(MOVE_MESSAGE_BYTES)
                        .max_encoding_message_size(MOVE_MESSAGE_BYTES),
                );
                let frontend = Arc::new(Frontend::new(
                    node.clone(),
                    Arc::new(local),
                    metrics.clone(),
                ));
                let routing = crate::cluster::routing::Routing::new(node.clone());
                routing.spawn();
                let routed = Arc::new(crate::cluster::routing::Routed::new(
                    frontend,
                    routing,
                    metrics.clone(),
                    node.config.priority,
                ));
                routes.add_service(
                    BigtableServer::new(Authorized::new(routed, access.clone()))
                        .max_decoding_message_size(MAX_MESSAGE_BYTES)
                        .max_encoding_message_size(MAX_MESSAGE_BYTES),
                );
            }
        }
    }

    /// Keeps `ready` true while the server can serve: at once for a standalone server; for a
    /// cluster server while it is registered with a current lease and has read the tablet
    /// map (the task returned updates it until aborted).
    pub fn spawn_readiness(&self, ready: Arc<AtomicBool>) -> Option<tokio::task::JoinHandle<()>> {
        match self {
            Mode::Standalone => {
                ready.store(true, Ordering::SeqCst);
                None
            }
            Mode::Cluster(node) => {
                let node = node.clone();
                Some(tokio::spawn(async move {
                    loop {
                        ready.store(node.ready(), Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }))
            }
        }
    }

    /// Leaves the cluster cleanly (a standalone server has nothing to leave).
    pub async fn stop(self) {
        if let Mode::Cluster(node) = self {
            node.stop().await;
        }
    }
}
