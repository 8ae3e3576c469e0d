//! Runs a tablet server: opens the store, starts its [`Mode`] (standalone or a cluster
//! server), serves gRPC and HTTP with the mode's backends, shuts down cleanly.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use basalt_transport::{Dialer, Filter, Security};
use tokio::net::TcpListener;
use tonic::service::RoutesBuilder;
use tracing::{error, info, warn};

use crate::access::{Access, Authorized};
use crate::admin_api::AdminService;
use crate::admin_api::OperationsService;
use crate::auth::{Authenticate, Authenticator, TokenFile};
use crate::backups::Backups;
use crate::cluster::{Advertised, ClusterConfig};
use crate::control_api::{self, ControlService, Identity};
use crate::data_api::DataService;
use crate::error::{Error, Result};
use crate::http::{self, HttpState};
use crate::iam_api::{IamApi, InstanceAdminService};
use crate::inflight::InFlight;
use crate::key_samples::KeySampler;
use crate::load::TabletLoads;
use crate::log_backup::LogBackup;
use crate::metrics::Metrics;
use crate::mode::Mode;
use crate::proto::bigtable_instance_admin_server::BigtableInstanceAdminServer;
use crate::proto::bigtable_table_admin_server::BigtableTableAdminServer;
use crate::proto::operations_server::OperationsServer;
use basalt_control::TabletServerControlServer;
use basalt_model::limits::MAX_MESSAGE_BYTES;
use basalt_storage::{Store, StoreOptions};

#[derive(Debug, Clone)]
pub struct Config {
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    pub http_listen: SocketAddr,
    pub cluster_id: String,
    pub tombstone_grace: Duration,
    pub block_cache_bytes: usize,
    pub shutdown_timeout: Duration,
    /// `--cpu-allocation-millicores` (see [`crate::cpu`]).
    pub cpu_allocation_millicores: Option<u64>,
    /// Who the server says it is over the control protocol (defaults: see [`Identity`]).
    pub identity: Identity,
    /// Cluster mode (None: standalone).
    pub cluster: Option<ClusterConfig>,
    /// How the server's listener and its connections to peers and etcd are secured.
    pub security: Security,
    /// Tests only (the in-process test cluster of `basalt-testkit`): what happens to the
    /// traffic of the server's connections to its peers. None: nothing (production).
    pub filter: Option<Arc<dyn Filter>>,
    /// Tests only (the in-process test cluster): where the server puts its store once it is
    /// open, so that a test can act on it (force a compaction). None: nowhere (production).
    pub store_slot: Option<StoreSlot>,
    /// Who may call the server (see [`crate::auth`] and [`crate::access`]).
    pub auth: AuthConfig,
    /// Backups (standalone mode): where they are kept; None: no backups.
    pub backup: Option<crate::backups::BackupConfig>,
}

/// Authentication and authorization settings (the default: none — every caller may do
/// everything, as with the Bigtable emulator).
#[derive(Debug, Clone, Default)]
pub struct AuthConfig {
    /// `--auth-token-file`: bearer tokens, one `<token> <member>` per line.
    pub token_file: Option<PathBuf>,
    /// `--admin-principal`: members holding roles/bigtable.admin on every instance.
    pub admin_principals: Vec<String>,
    /// `--internal-principal`: members that are Basalt's own processes (besides the one this
    /// server's own certificate names).
    pub internal_principals: Vec<String>,
    /// `--token-review`: bearer tokens the token file does not list are asked of the
    /// Kubernetes API server (TokenReview), for these audiences (`--token-review-audience`;
    /// empty: the API server's own). None: off.
    pub token_review: Option<Vec<String>>,
}

/// Where a server started by an in-process test puts its store (see [`Config::store_slot`]).
/// The server empties it when it ends; a test must not keep the store longer (a store open
/// twice cannot start again on its directory).
#[derive(Clone, Default)]
pub struct StoreSlot(Arc<parking_lot::Mutex<Option<Arc<Store>>>>);

impl StoreSlot {
    /// The store of the running server, if it runs.
    pub fn get(&self) -> Option<Arc<Store>> {
        self.0.lock().clone()
    }

    /// Lets the store go (the server ended, or was dropped where it was).
    pub fn clear(&self) {
        self.put(None);
    }

    fn put(&self, store: Option<Arc<Store>>) {
        *self.0.lock() = store;
    }
}

impl std::fmt::Debug for StoreSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.lock().is_some() {
            "StoreSlot(open)"
        } else {
            "StoreSlot(empty)"
        })
    }
}

/// Serves until `shutdown` resolves, then drains in-flight requests and flushes the store.
pub async fn run(config: Config, shutdown: impl std::future::Future<Output = ()>) -> Result<()> {
    let started = std::time::SystemTime::now();
    std::fs::create_dir_all(&config.data_dir).map_err(|e| {
        Error::Internal(format!(
            "cannot create data dir {}: {e}",
            config.data_dir.display()
        ))
    })?;
    let store = {
        let dir = config.data_dir.clone();
        let options = StoreOptions {
            tombstone_grace_micros: config.tombstone_grace.as_micros() as i64,
            block_cache_bytes: config.block_cache_bytes,
            // A cluster server may have peers: its tombstones wait for the safe point.
            await_tombstone_safe_point: config.cluster.is_some(),
            ..StoreOptions::default()
        };
        tokio::task::spawn_blocking(move || Store::open(&dir, options))
            .await
            .map_err(|e| Error::Internal(e.to_string()))??
    };
    let store = Arc::new(store);
    if let Some(slot) = &config.store_slot {
        slot.put(Some(store.clone()));
    }
    let labels = match &config.cluster {
        Some(c) => crate::metrics::ServerLabels::cluster(
            &c.namespace,
            &c.instance,
            &c.cluster,
            &config.identity.resolved_server_id(),
        ),
        None => crate::metrics::ServerLabels::default(),
    };
    let metrics = Metrics::new(
        crate::cpu::this_servers_allocation(config.cpu_allocation_millicores),
        &labels,
    );
    let ready = Arc::new(AtomicBool::new(false));

    let grpc_listener = TcpListener::bind(config.listen)
        .await
        .map_err(|e| Error::Internal(format!("cannot listen on {}: {e}", config.listen)))?;
    let http_listener = TcpListener::bind(config.http_listen)
        .await
        .map_err(|e| Error::Internal(format!("cannot listen on {}: {e}", config.http_listen)))?;
    let grpc_bound = grpc_listener
        .local_addr()
        .map_err(|e| Error::Internal(e.to_string()))?;
    let http_bound = http_listener
        .local_addr()
        .map_err(|e| Error::Internal(e.to_string()))?;
    info!(
        grpc = %grpc_bound,
        http = %http_bound,
        data_dir = %config.data_dir.display(),
        mode = if config.cluster.is_some() { "cluster" } else { "standalone" },
        "basalt tablet server starting"
    );

    let http_state = HttpState {
        store: store.clone(),
        metrics: metrics.clone(),
        ready: ready.clone(),
    };
    let http_task = tokio::spawn(async move {
        if let Err(e) = axum::serve(http_listener, http::router(http_state)).await {
            error!(error = %e, "HTTP server failed");
        }
    });

    let loads = Arc::new(TabletLoads::new());
    let key_samples = Arc::new(KeySampler::new());
    // The mode is chosen here, once: it provides the backends the handlers call.
    let dialer = match &config.filter {
        None => Dialer::new(config.security.clone()),
        Some(filter) => Dialer::with_filter(config.security.clone(), filter.clone()),
    };
    let advertised = || Advertised {
        name: config.identity.resolved_server_id(),
        address: config
            .identity
            .advertise_address
            .clone()
            .unwrap_or_else(|| grpc_bound.to_string()),
        http_address: http_bound.to_string(),
    };
    let mode = Mode::start(
        config.cluster.as_ref(),
        dialer,
        &store,
        advertised,
        &config.data_dir,
        &metrics,
    )
    .await?;
    let cluster_name = mode.cluster_name(&config.cluster_id);
    let local = DataService::new(
        store.clone(),
        metrics.clone(),
        loads.clone(),
        key_samples.clone(),
    );
    let authenticator = Arc::new(authenticator(&config).await?);
    let catalog = mode.catalog(&store);
    let access = Access::new(
        authenticator.enabled(),
        &config.auth.admin_principals,
        catalog.clone(),
    );
    let iam = IamApi::new(access.clone(), store.clone());
    // Backups (docs/backups.md): a cluster's servers reach one location and the server asked
    // coordinates the others.
    let backups = match &config.backup {
        Some(backup) => Some(Backups::start(
            store.clone(),
            catalog.clone(),
            cluster_name.clone(),
            config.data_dir.clone(),
            mode.node(),
            backup,
        )?),
        None => None,
    };
    // Point-in-time recovery (docs/backups.md): the change log on before the server serves.
    let log_backup = match (&backups, config.backup.as_ref().and_then(|b| b.log_backup)) {
        (Some(backups), Some(log)) => Some(
            LogBackup::start(
                store.clone(),
                backups.location().clone(),
                cluster_name.clone(),
                mode.node().map(|n| n.config.instance_name()),
                log,
                config.cluster.is_none(),
            )
            .await?,
        ),
        _ => {
            LogBackup::forget(&store).await?;
            None
        }
    };
    if let (Some(backups), Some(log)) = (&backups, &log_backup) {
        backups.set_log_backup(log.clone());
    }
    let operations = OperationsServer::new(OperationsService::new(backups.clone()));
    let admin = BigtableTableAdminServer::new(Authorized::new(
        AdminService::new(
            store.clone(),
            catalog,
            metrics.clone(),
            cluster_name.clone(),
            iam.clone(),
        )
        .with_backups(backups.clone()),
        access.clone(),
    ))
    .max_decoding_message_size(MAX_MESSAGE_BYTES)
    .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let instance_admin = BigtableInstanceAdminServer::new(Authorized::new(
        InstanceAdminService::new(iam, mode.meta()),
        access.clone(),
    ));

    let identity =
        control_api::server_identity(&config.identity, &cluster_name, grpc_bound, started);
    let control = TabletServerControlServer::new(mode.control(ControlService::new(
        store.clone(),
        loads,
        key_samples,
        metrics.clone(),
        ready.clone(),
        identity,
        config.data_dir.clone(),
    )));

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let ready_flag = ready.clone();
    // The listener's policy (TCP_NODELAY, keep-alive, TLS) is basalt-transport's.
    let incoming = basalt_transport::incoming(grpc_listener, &config.security);
    let in_flight = InFlight::default();
    let mut services = RoutesBuilder::default();
    services
        .add_service(admin)
        .add_service(instance_admin)
        .add_service(operations)
        .add_service(control);
    if let Some(backups) = backups.as_ref().filter(|_| config.cluster.is_some()) {
        services.add_service(basalt_control::TabletBackupServer::new(
            crate::backups::BackupService::new(backups.clone()),
        ));
    }
    mode.add_services(&mut services, local, &metrics, &access);
    let router = config
        .security
        .server()
        .layer(in_flight.clone())
        .layer(crate::deadline::Deadline)
        .layer(Authenticate(authenticator))
        .add_routes(services.routes());
    let grpc = router.serve_with_incoming_shutdown(incoming, async move {
        let _ = stop_rx.await;
    });
    let grpc_task = tokio::spawn(grpc);
    // Ready: serving gRPC, and in cluster mode registered with a current lease and the tablet
    // map read.
    let readiness = mode.spawn_readiness(ready.clone());
    info!("basalt tablet server serving");

    shutdown.await;
    info!(
        in_flight = in_flight.count(),
        "shutdown requested: no new requests; finishing in-flight ones"
    );
    if let Some(task) = readiness {
        task.abort();
    }
    ready_flag.store(false, Ordering::SeqCst);
    // In-flight requests finish before any connection is closed (see `inflight`).
    let deadline = tokio::time::Instant::now() + config.shutdown_timeout;
    in_flight.drain();
    if tokio::time::timeout_at(deadline, in_flight.idle())
        .await
        .is_err()
    {
        warn!(
            in_flight = in_flight.count(),
            "requests still in flight at the shutdown timeout; closing connections anyway"
        );
    }
    let _ = stop_tx.send(());
    match tokio::time::timeout_at(deadline, grpc_task).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => error!(error = %e, "gRPC server failed"),
        Ok(Err(e)) => error!(error = %e, "gRPC server task failed"),
        Err(_) => warn!(
            timeout = ?config.shutdown_timeout,
            "in-flight requests did not finish in time; stopping anyway (acknowledged writes are durable)"
        ),
    }
    http_task.abort();
    // No write comes any more: the log backup ships its last entries.
    if let Some(log) = &log_backup {
        log.stop().await;
    }
    mode.stop().await;
    if let Some(slot) = &config.store_slot {
        slot.put(None);
    }
    let flush_store = store.clone();
    tokio::task::spawn_blocking(move || flush_store.flush())
        .await
        .map_err(|e| Error::Internal(e.to_string()))??;
    info!("store flushed; bye");
    Ok(())
}

/// The server's authenticator from its configuration: tokens from the token file, client
/// certificates when the TLS material has a client CA; Basalt's own processes are the
/// principal this server's certificate names and `--internal-principal`s.
async fn authenticator(config: &Config) -> Result<Authenticator> {
    let tokens = match &config.auth.token_file {
        Some(path) => Some(TokenFile::load(path).map_err(Error::InvalidArgument)?),
        None => None,
    };
    let mut internal = config.auth.internal_principals.clone();
    let mut client_certificates = false;
    if let Security::Tls(tls) = &config.security {
        client_certificates = tls.verifies_client_certificates();
        let own = tls
            .own_certificate()
            .map_err(|e| Error::InvalidArgument(e.to_string()))?;
        internal.extend(crate::auth::certificate_principal(&own));
    }
    let authenticator = Authenticator::new(tokens, client_certificates, internal);
    Ok(match &config.auth.token_review {
        Some(audiences) => authenticator.with_token_review(
            crate::token_review::TokenReviewer::connect(audiences.clone())
                .await
                .map_err(Error::InvalidArgument)?,
        ),
        None => authenticator,
    })
}
