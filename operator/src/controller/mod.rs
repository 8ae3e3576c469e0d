//! The controllers: one per kind, sharing a [`Context`]. Each reconcile reads what it needs,
//! validates (pure), builds the desired objects (pure), applies them with server-side apply and
//! writes status from what it observed.

pub mod app_profile;
pub mod cluster;
pub mod instance;
pub mod table;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::admin::TableAdmin;
use crate::build::{self, FIELD_MANAGER, OperatorConfig};
use crate::crd::{AppProfile, Cluster, Instance, Table};
use crate::metrics::Metrics;

/// Errors of one reconcile; the controller retries after [`RETRY`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("table admin API: {0}")]
    Admin(#[from] tonic::Status),
    #[error("serializing {0}")]
    Serialize(#[from] serde_json::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How soon a failed reconcile runs again.
pub const RETRY: Duration = Duration::from_secs(15);

/// Everything a reconcile needs besides the object.
pub struct Context {
    pub client: Client,
    pub config: OperatorConfig,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    pub admin: Arc<dyn TableAdmin>,
    /// Whether the API server serves policy/v1 PodDisruptionBudgets (1.21+).
    pub pdb_supported: bool,
}

impl Context {
    /// Publishes an event about `obj`; failures are logged, never fail the reconcile.
    pub async fn event<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: action.into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &obj.object_ref(&())).await {
            tracing::warn!(error = %e, reason, "could not publish event");
        }
    }
}

/// Applies `obj` with server-side apply as the operator's field manager (forcing ownership of
/// the fields it sets; fields other managers own stay theirs).
pub async fn apply<K>(api: &Api<K>, obj: &K) -> Result<K>
where
    K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    let name = obj.meta().name.clone().unwrap_or_default();
    Ok(api
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(obj),
        )
        .await?)
}

/// Writes `status` through the status subresource with server-side apply.
pub async fn apply_status<K>(api: &Api<K>, obj: &K, status: impl Serialize) -> Result<()>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let patch = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    api.patch_status(
        &obj.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await?;
    Ok(())
}

/// Sets the finalizer list to `finalizers`, guarded by the object's resourceVersion so a
/// concurrent change is never overwritten.
pub async fn set_finalizers<K>(api: &Api<K>, obj: &K, finalizers: Vec<String>) -> Result<()>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let patch = serde_json::json!({
        "metadata": {
            "resourceVersion": obj.meta().resource_version,
            "finalizers": finalizers,
        }
    });
    api.patch(
        &obj.meta().name.clone().unwrap_or_default(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}

pub fn has_finalizer<K: Resource>(obj: &K, finalizer: &str) -> bool {
    obj.meta()
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == finalizer))
}

pub fn with_finalizer<K: Resource>(obj: &K, finalizer: &str) -> Vec<String> {
    let mut f = obj.meta().finalizers.clone().unwrap_or_default();
    if !f.iter().any(|x| x == finalizer) {
        f.push(finalizer.into());
    }
    f
}

pub fn without_finalizer<K: Resource>(obj: &K, finalizer: &str) -> Vec<String> {
    obj.meta()
        .finalizers
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|x| x != finalizer)
        .collect()
}

/// `host:port` of a ready tablet server of the instance, for admin calls.
pub async fn instance_endpoint(
    ctx: &Context,
    namespace: &str,
    instance: &str,
) -> Result<Option<String>> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
    let selector = build::selector_string(&build::instance_selector(instance));
    let list = pods.list(&ListParams::default().labels(&selector)).await?;
    let mut ready: Vec<String> = list
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            p.status.as_ref().is_some_and(|s| {
                s.conditions
                    .as_ref()
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
        })
        .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
        .collect();
    ready.sort();
    Ok(ready.first().map(|ip| format!("{ip}:{}", build::GRPC_PORT)))
}

/// A tablet server's `/metrics` (plain HTTP/1.0 on its HTTP port), with a short deadline; None
/// if it does not answer.
pub async fn scrape_metrics(ip: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fetch = async {
        let mut conn = tokio::net::TcpStream::connect((ip, build::HTTP_PORT as u16))
            .await
            .ok()?;
        conn.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {ip}\r\n\r\n").as_bytes())
            .await
            .ok()?;
        let mut body = String::new();
        conn.read_to_string(&mut body).await.ok()?;
        Some(body)
    };
    tokio::time::timeout(Duration::from_secs(2), fetch)
        .await
        .ok()?
}

/// The value of an unlabelled sample in Prometheus' text format.
pub fn parse_gauge(exposition: &str, metric: &str) -> Option<f64> {
    exposition.lines().find_map(|line| {
        let rest = line.strip_prefix(metric)?.strip_prefix(' ')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// Runs a reconcile, recording its outcome and duration.
pub async fn measured<F>(ctx: &Context, controller: &'static str, f: F) -> Result<Action>
where
    F: std::future::Future<Output = Result<Action>>,
{
    let start = Instant::now();
    let result = f.await;
    ctx.metrics
        .observe(controller, start.elapsed(), result.is_ok());
    result
}

fn error_policy<K>(_obj: Arc<K>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, "reconcile failed; retrying");
    Action::requeue(RETRY)
}

/// Discovers whether policy/v1 is served (PodDisruptionBudgets need it).
pub async fn discover_pdb_support(client: &Client) -> bool {
    match client.list_api_group_resources("policy/v1").await {
        Ok(list) => list
            .resources
            .iter()
            .any(|r| r.name == "poddisruptionbudgets"),
        Err(e) => {
            tracing::info!(error = %e, "policy/v1 is not served: PodDisruptionBudgets are skipped");
            false
        }
    }
}

/// Builds the shared context.
pub fn context(
    client: Client,
    config: OperatorConfig,
    metrics: Arc<Metrics>,
    admin: Arc<dyn TableAdmin>,
    pdb_supported: bool,
    reporter_instance: Option<String>,
) -> Arc<Context> {
    let reporter = Reporter {
        controller: FIELD_MANAGER.into(),
        instance: reporter_instance,
    };
    Arc::new(Context {
        recorder: Recorder::new(client.clone(), reporter),
        client,
        config,
        metrics,
        admin,
        pdb_supported,
    })
}

/// Runs the four controllers until `shutdown` resolves.
pub async fn run(
    ctx: Arc<Context>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    let managed = watcher::Config::default().labels(&format!(
        "{}={}",
        build::LABEL_MANAGED_BY,
        FIELD_MANAGER
    ));
    let (tx, _) = tokio::sync::broadcast::channel::<()>(1);
    let stop = |tx: &tokio::sync::broadcast::Sender<()>| {
        let mut rx = tx.subscribe();
        async move {
            let _ = rx.recv().await;
        }
    };

    let clusters = Controller::new(
        Api::<Cluster>::all(client.clone()),
        watcher::Config::default(),
    )
    .owns(Api::<StatefulSet>::all(client.clone()), managed.clone())
    .graceful_shutdown_on(stop(&tx))
    .run(cluster::reconcile, error_policy, ctx.clone())
    .for_each(|_| futures::future::ready(()));

    let instances = Controller::new(
        Api::<Instance>::all(client.clone()),
        watcher::Config::default(),
    )
    .owns(Api::<Service>::all(client.clone()), managed.clone())
    .watches(
        Api::<Cluster>::all(client.clone()),
        watcher::Config::default(),
        |c: Cluster| {
            Some(ObjectRef::new(&c.spec.instance_ref).within(&c.namespace().unwrap_or_default()))
        },
    )
    .watches(
        Api::<AppProfile>::all(client.clone()),
        watcher::Config::default(),
        |p: AppProfile| {
            Some(ObjectRef::new(&p.spec.instance_ref).within(&p.namespace().unwrap_or_default()))
        },
    )
    .graceful_shutdown_on(stop(&tx))
    .run(instance::reconcile, error_policy, ctx.clone())
    .for_each(|_| futures::future::ready(()));

    let tables = Controller::new(
        Api::<Table>::all(client.clone()),
        watcher::Config::default(),
    )
    .graceful_shutdown_on(stop(&tx))
    .run(table::reconcile, error_policy, ctx.clone())
    .for_each(|_| futures::future::ready(()));

    let profiles = Controller::new(
        Api::<AppProfile>::all(client.clone()),
        watcher::Config::default(),
    )
    .graceful_shutdown_on(stop(&tx))
    .run(app_profile::reconcile, error_policy, ctx.clone())
    .for_each(|_| futures::future::ready(()));

    let all = futures::future::join4(clusters, instances, tables, profiles);
    tokio::pin!(all);
    tokio::select! {
        _ = &mut all => {}
        _ = shutdown => {
            let _ = tx.send(());
            all.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gauges_are_read_from_the_text_format() {
        let text = "# HELP basalt_storage_bytes Size\n# TYPE basalt_storage_bytes gauge\nbasalt_storage_bytes 12345\nbasalt_storage_bytes_other 9\n";
        assert_eq!(parse_gauge(text, "basalt_storage_bytes"), Some(12345.0));
        assert_eq!(parse_gauge(text, "basalt_memtable_bytes"), None);
    }
}
