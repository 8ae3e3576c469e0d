//! The operator's HTTP port: `/healthz` (the process is alive) and Prometheus `/metrics`.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

use crate::metrics::Metrics;

pub fn router(metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/metrics", get(render))
        .with_state(metrics)
}

async fn render(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        m.render(),
    )
}

/// Serves until the process ends.
pub async fn serve(listener: tokio::net::TcpListener, metrics: Arc<Metrics>) {
    if let Err(e) = axum::serve(listener, router(metrics)).await {
        tracing::error!(error = %e, "metrics server stopped");
    }
}
