//! Runs a standalone tablet server: opens the store, serves gRPC and HTTP, shuts down cleanly.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tracing::{error, info, warn};

use crate::admin_api::AdminService;
use crate::control_api::{self, ControlService, Identity};
use crate::data_api::DataService;
use crate::error::{Error, Result};
use crate::http::{self, HttpState};
use crate::inflight::InFlight;
use crate::load::TabletLoads;
use crate::metrics::Metrics;
use crate::proto::bigtable_server::BigtableServer;
use crate::proto::bigtable_table_admin_server::BigtableTableAdminServer;
use basalt_control::TabletServerControlServer;
use basalt_storage::{Store, StoreOptions};

/// Largest gRPC message accepted or sent: Bigtable's 256 MiB request limit (a 100 MiB value
/// plus its mutation fits comfortably).
pub const MAX_MESSAGE_BYTES: usize = 256 << 20;

#[derive(Debug, Clone)]
pub struct Config {
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    pub http_listen: SocketAddr,
    pub cluster_id: String,
    pub tombstone_grace: Duration,
    pub block_cache_bytes: usize,
    pub shutdown_timeout: Duration,
    /// Who the server says it is over the control protocol (defaults: see [`Identity`]).
    pub identity: Identity,
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
            ..StoreOptions::default()
        };
        tokio::task::spawn_blocking(move || Store::open(&dir, options))
            .await
            .map_err(|e| Error::Internal(e.to_string()))??
    };
    let store = Arc::new(store);
    let metrics = Metrics::new();
    let ready = Arc::new(AtomicBool::new(false));

    let grpc_listener = TcpListener::bind(config.listen)
        .await
        .map_err(|e| Error::Internal(format!("cannot listen on {}: {e}", config.listen)))?;
    let http_listener = TcpListener::bind(config.http_listen)
        .await
        .map_err(|e| Error::Internal(format!("cannot listen on {}: {e}", config.http_listen)))?;
    info!(
        grpc = %grpc_listener.local_addr().map_err(|e| Error::Internal(e.to_string()))?,
        http = %http_listener.local_addr().map_err(|e| Error::Internal(e.to_string()))?,
        data_dir = %config.data_dir.display(),
        "basalt tablet server serving (standalone)"
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
    let data = BigtableServer::new(DataService::new(
        store.clone(),
        metrics.clone(),
        loads.clone(),
    ))
    .max_decoding_message_size(MAX_MESSAGE_BYTES)
    .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let admin = BigtableTableAdminServer::new(AdminService::new(
        store.clone(),
        metrics.clone(),
        config.cluster_id.clone(),
    ))
    .max_decoding_message_size(MAX_MESSAGE_BYTES)
    .max_encoding_message_size(MAX_MESSAGE_BYTES);

    let bound = grpc_listener
        .local_addr()
        .map_err(|e| Error::Internal(e.to_string()))?;
    let identity =
        control_api::server_identity(&config.identity, &config.cluster_id, bound, started);
    let control = TabletServerControlServer::new(ControlService::new(
        store.clone(),
        loads,
        metrics.clone(),
        ready.clone(),
        identity,
        config.data_dir.clone(),
    ));

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let ready_flag = ready.clone();
    // Small replies (point reads, mutations) must not wait for Nagle's algorithm: with a
    // custom incoming stream the builder's tcp_nodelay does not apply, so set it here.
    let incoming = TcpIncoming::from(grpc_listener).with_nodelay(Some(true));
    let in_flight = InFlight::default();
    let grpc = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .layer(in_flight.clone())
        .add_service(data)
        .add_service(admin)
        .add_service(control)
        .serve_with_incoming_shutdown(incoming, async move {
            let _ = stop_rx.await;
        });
    let grpc_task = tokio::spawn(grpc);
    ready.store(true, Ordering::SeqCst);

    shutdown.await;
    info!(
        in_flight = in_flight.count(),
        "shutdown requested: no new requests; finishing in-flight ones"
    );
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
    let flush_store = store.clone();
    tokio::task::spawn_blocking(move || flush_store.flush())
        .await
        .map_err(|e| Error::Internal(e.to_string()))??;
    info!("store flushed; bye");
    Ok(())
}
