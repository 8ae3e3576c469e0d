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

/// The master process's port (`basalt-operator master --metrics-listen`): `/healthz` and the
/// master's own `/metrics`.
pub async fn serve_master(listener: tokio::net::TcpListener) {
    let router = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/metrics",
            get(|| async {
                (
                    [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                    crate::metrics::render_master(),
                )
            }),
        );
    if let Err(e) = axum::serve(listener, router).await {
        tracing::error!(error = %e, "metrics server stopped");
    }
}

/// Serves until the process ends.
pub async fn serve(listener: tokio::net::TcpListener, metrics: Arc<Metrics>) {
    if let Err(e) = axum::serve(listener, router(metrics)).await {
        tracing::error!(error = %e, "metrics server stopped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: std::net::SocketAddr, path: &str) -> String {
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        conn.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut out = String::new();
        conn.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn healthz_and_metrics_with_reconcile_counts() {
        let metrics = Arc::new(Metrics::new());
        metrics.observe("cluster", Duration::from_millis(3), true);
        metrics.observe("cluster", Duration::from_millis(5), false);
        metrics.leader.set(1);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, metrics));
        let health = get(addr, "/healthz").await;
        assert!(
            health.starts_with("HTTP/1.0 200") || health.starts_with("HTTP/1.1 200"),
            "{health}"
        );
        let text = get(addr, "/metrics").await;
        assert!(
            text.contains("basalt_operator_reconciles_total{controller=\"cluster\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("basalt_operator_reconcile_errors_total{controller=\"cluster\"} 1"),
            "{text}"
        );
        assert!(
            text.contains(
                "basalt_operator_reconcile_duration_seconds_count{controller=\"cluster\"} 2"
            ),
            "{text}"
        );
        assert!(text.contains("basalt_operator_leader 1"), "{text}");
    }
}
