//! The HTTP port: `/healthz` (the process is alive), `/readyz` (it serves requests) and
//! Prometheus `/metrics`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::metrics::Metrics;
use basalt_storage::Store;

#[derive(Clone)]
pub struct HttpState {
    pub store: Arc<Store>,
    pub metrics: Arc<Metrics>,
    /// True while the gRPC server accepts requests (false before start-up and during shutdown).
    pub ready: Arc<AtomicBool>,
}

pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
}

async fn readyz(State(s): State<HttpState>) -> impl IntoResponse {
    if s.ready.load(Ordering::SeqCst) {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}

async fn metrics(State(s): State<HttpState>) -> impl IntoResponse {
    let body = tokio::task::spawn_blocking(move || s.metrics.render(&s.store))
        .await
        .unwrap_or_default();
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body)
}
