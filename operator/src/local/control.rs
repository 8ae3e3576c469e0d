//! The apply channel: the runtime's control HTTP server (on 127.0.0.1 only, its address in
//! `local.json`'s `control`) and the client `local apply` uses.
//!
//! `POST /v1/apply` with manifests as the body (multi-document YAML, `application/yaml`)
//! answers JSON:
//!
//! * 200 `{"changes": ["...", ...]}`: what was done, one line each (`unchanged` if nothing);
//! * 400 `{"error": "..."}`: the manifests do not parse or are invalid;
//! * 409 `{"error": "..."}`: valid, but refused (a scale-in, an immutable field);
//! * 500 `{"error": "..."}`: starting something failed part way (what started stays);
//! * 503 `{"error": "..."}`: the runtime is stopping.
//!
//! `POST /v1/restart` with a server's name as the body restarts that tablet server on its data
//! (its process ends, its supervisor starts it again: the local runtime's
//! [`basalt_master::NodeRuntime::restart`]); it answers like an apply: 200 with what was done,
//! 404 for a name the runtime does not run.
//!
//! `GET /v1/state` answers `local.json`'s content as it is now.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};

use super::runtime::{APPLY_TABLE_WAIT, ApplyError, Runtime};
use super::{http, manifests, state};

/// The apply's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyResponse {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

pub fn router(runtime: Arc<Runtime>) -> Router {
    Router::new()
        .route("/v1/apply", post(apply))
        .route("/v1/restart", post(restart))
        .route("/v1/state", get(current_state))
        .with_state(runtime.clone())
        .merge(crate::keyviz::api::router(runtime.keyviz.clone()))
}

/// Serves until the task is aborted.
pub async fn serve(listener: tokio::net::TcpListener, runtime: Arc<Runtime>) {
    if let Err(error) = axum::serve(listener, router(runtime)).await {
        tracing::error!(%error, "control server stopped");
    }
}

fn json(status: StatusCode, body: &ApplyResponse) -> axum::response::Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_string(body).unwrap_or_default(),
    )
        .into_response()
}

async fn apply(State(runtime): State<Arc<Runtime>>, body: String) -> axum::response::Response {
    match runtime.apply(&body).await {
        Ok(changes) => {
            for line in &changes {
                tracing::info!("apply: {line}");
            }
            json(
                StatusCode::OK,
                &ApplyResponse {
                    changes,
                    error: None,
                },
            )
        }
        Err(error) => {
            let status = match &error {
                ApplyError::Invalid(_) => StatusCode::BAD_REQUEST,
                ApplyError::Refused(_) => StatusCode::CONFLICT,
                ApplyError::Stopping => StatusCode::SERVICE_UNAVAILABLE,
                ApplyError::Failed(_) => StatusCode::INTERNAL_SERVER_ERROR,
            };
            tracing::warn!(%error, "apply refused");
            json(
                status,
                &ApplyResponse {
                    changes: vec![],
                    error: Some(error.to_string()),
                },
            )
        }
    }
}

async fn restart(State(runtime): State<Arc<Runtime>>, body: String) -> axum::response::Response {
    let name = body.trim();
    match runtime.restart_server(name).await {
        Ok(line) => {
            tracing::info!("restart: {line}");
            json(
                StatusCode::OK,
                &ApplyResponse {
                    changes: vec![line],
                    error: None,
                },
            )
        }
        Err(error) => json(
            StatusCode::NOT_FOUND,
            &ApplyResponse {
                changes: vec![],
                error: Some(format!("{error:#}")),
            },
        ),
    }
}

async fn current_state(State(runtime): State<Arc<Runtime>>) -> axum::response::Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_string_pretty(&runtime.snapshot()).unwrap_or_default(),
    )
        .into_response()
}

/// `local apply`: reads the manifests (files and directories, like `-f` of the runtime),
/// posts them to the runtime on `data_dir` and returns the lines it answered.
pub async fn apply_remote(data_dir: &Path, files: &[PathBuf]) -> anyhow::Result<Vec<String>> {
    // Parsed here first so a typo is reported with its file name and document.
    let texts = manifests::read_paths(files)?;
    for (name, text) in &texts {
        manifests::parse(name, text)?;
    }
    let body = texts
        .iter()
        .map(|(_, text)| text.as_str())
        .collect::<Vec<_>>()
        .join("\n---\n");
    // The runtime may wait for its tables' servers before it answers.
    let timeout = APPLY_TABLE_WAIT + Duration::from_secs(60);
    post_to_runtime(data_dir, "/v1/apply", &body, timeout, "apply").await
}

/// `local restart`: asks the runtime on `data_dir` to restart the tablet server `server` on its
/// data; the line it answered.
pub async fn restart_remote(data_dir: &Path, server: &str) -> anyhow::Result<Vec<String>> {
    post_to_runtime(
        data_dir,
        "/v1/restart",
        server,
        Duration::from_secs(30),
        "restart",
    )
    .await
}

/// Posts `body` to the control channel of the runtime running on `data_dir` (its address in
/// `local.json`); the lines it answered, or why not (`what`: the request, in the error).
async fn post_to_runtime(
    data_dir: &Path,
    path: &str,
    body: &str,
    timeout: Duration,
    what: &str,
) -> anyhow::Result<Vec<String>> {
    let local = state::read(data_dir)?;
    let not_running = || {
        anyhow::anyhow!(
            "the runtime on {} is not running (local.json records no running runtime); start it with `basalt-operator local -f MANIFESTS --data-dir {}`",
            data_dir.display(),
            data_dir.display()
        )
    };
    let control: SocketAddr = local.control.as_deref().ok_or_else(not_running)?.parse()?;
    if local.pid.is_none_or(|pid| !state::is_runtime(pid)) {
        return Err(not_running());
    }
    let response = http::request(control, "POST", path, body, timeout)
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "the runtime on {} does not answer at {control}: {e}",
                data_dir.display()
            )
        })?;
    let answer: ApplyResponse = serde_json::from_str(&response.body).map_err(|e| {
        anyhow::anyhow!(
            "unexpected answer from the runtime (HTTP {}): {e}: {}",
            response.status,
            response.body
        )
    })?;
    match answer.error {
        Some(error) => anyhow::bail!("the runtime refused the {what}: {error}"),
        None if response.status != 200 => {
            anyhow::bail!("the runtime answered HTTP {}", response.status)
        }
        None => Ok(answer.changes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_serialize_as_documented() {
        let ok = ApplyResponse {
            changes: vec!["unchanged".into()],
            error: None,
        };
        assert_eq!(
            serde_json::to_string(&ok).unwrap(),
            r#"{"changes":["unchanged"]}"#
        );
        let refused: ApplyResponse = serde_json::from_str(r#"{"error":"no"}"#).unwrap();
        assert_eq!(refused.error.as_deref(), Some("no"));
        assert!(refused.changes.is_empty());
    }

    #[tokio::test]
    async fn apply_without_a_runtime_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let manifest = dir.path().join("m.yaml");
        std::fs::write(
            &manifest,
            "apiVersion: basalt.dev/v1alpha1\nkind: Instance\nmetadata: {name: quickstart}\nspec: {displayName: Quickstart}\n",
        )
        .unwrap();
        let err = apply_remote(dir.path(), std::slice::from_ref(&manifest))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("local.json"), "{err}");
        // A stopped runtime's local.json: no control address, no pid.
        state::write_json_atomic(
            &dir.path().join(state::LOCAL_JSON),
            &state::LocalState::default(),
        )
        .unwrap();
        let err = apply_remote(dir.path(), &[manifest])
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("is not running"), "{err}");
    }
}
