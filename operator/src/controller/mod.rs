//! The controllers: one per kind, sharing a [`Context`].
//!
//! Every reconcile is the same pipeline, written out in its kind's `reconcile` (Stackable's
//! operators are the model), one file per stage:
//!
//! 1. `dereference.rs` — every Kubernetes API read, in one async function returning a plain
//!    struct;
//! 2. `validate.rs` — pure: the spec's rules and what the reads say, giving a `Validated…`
//!    value to build from, or why the reconcile stops here;
//! 3. build — pure, [`crate::build`] (one file per resource kind; a Table's schema plan is
//!    [`crate::admin::plan_schema`]);
//! 4. `apply.rs` — server-side apply of the built objects (the StatefulSet last), or the table
//!    admin calls; an event for each action taken;
//! 5. `status.rs` — pure condition builders: the new status, the events that report what was
//!    found, and when to look again ([`Outcome`]) from the validated input and what was
//!    applied or observed;
//! 6. [`finish`] — one status patch.
//!
//! Deletion comes first, through the one [`finalizer`] helper every kind with a finalizer
//! uses. Apart from the controllers, [`masters`] runs every Instance's master. Each reconcile runs in a span naming its object ([`reconciling`]); a failed one is
//! logged with the object by [`error_policy`] and retried after [`RETRY`].

pub mod app_profile;
pub mod backup;
pub mod cluster;
pub mod finalizer;
pub mod instance;
pub mod masters;
pub mod pki;
pub mod table;

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, Patch, PatchParams};
use kube::core::object::HasStatus;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::Instrument;

use crate::admin::{BackupAdmin, GrpcTableAdmin, TableAdmin};
use crate::build::{self, FIELD_MANAGER, OperatorConfig};
use crate::crd::{AppProfile, Backup, BackupSchedule, Cluster, Instance, Table};
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
    /// A runtime asked for what it does not run (a bug, not a state of the cluster).
    #[error("{0}")]
    Misdirected(String),
    /// The operator's certificates: none to reach a secured instance with, or one that does
    /// not load.
    #[error("certificates: {0}")]
    Certificates(String),
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
    /// The backup calls of the same admin API (`Backup`, `BackupSchedule`).
    pub backups: Arc<dyn BackupAdmin>,
    /// Whether the API server serves policy/v1 PodDisruptionBudgets (1.21+).
    pub pdb_supported: bool,
    /// The tablet servers' control clients (the Cluster status): one channel per server.
    pub dialer: basalt_control::Dialer,
    /// The operator's CA and certificate (None: the operator runs without one, and refuses
    /// secured instances).
    pub pki: Option<Arc<pki::OperatorPki>>,
    /// The deadline of each table admin call.
    pub admin_timeout: Duration,
    /// How each secured instance is reached, made on first use.
    transports: std::sync::Mutex<std::collections::HashMap<(String, String), Arc<Transport>>>,
}

/// How the operator reaches one instance's tablet servers (its dialer and table admin) and
/// metadata store.
pub struct Transport {
    /// Towards the instance's etcd.
    pub etcd: basalt_transport::Security,
    pub dialer: basalt_control::Dialer,
    pub admin: Arc<dyn TableAdmin>,
    pub backups: Arc<dyn BackupAdmin>,
}

impl Context {
    /// How to reach `instance`: plaintext, or TLS with the operator's certificate for a
    /// secured one ([`build::secrets::secured`]), etcd with TLS when its own store is secured.
    pub fn transport(&self, instance: &Instance) -> Result<Arc<Transport>> {
        use kube::ResourceExt as _;
        let plaintext = basalt_transport::Security::Plaintext;
        if !build::secrets::secured(instance) {
            return Ok(Arc::new(Transport {
                etcd: plaintext,
                dialer: self.dialer.clone(),
                admin: self.admin.clone(),
                backups: self.backups.clone(),
            }));
        }
        let key = (
            instance.namespace().unwrap_or_default(),
            instance.name_any(),
        );
        let mut transports = self.transports.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = transports.get(&key)
            && matches!(t.etcd, basalt_transport::Security::Tls(_))
                == build::secrets::metadata_store_secured(instance)
        {
            return Ok(t.clone());
        }
        let pki = self.pki.as_ref().ok_or_else(|| {
            Error::Certificates(format!(
                "instance {}/{} asks for TLS (spec.security), and this operator has no certificate authority",
                key.0, key.1
            ))
        })?;
        let (servers, etcd) = pki
            .towards_instance(
                &key.0,
                &key.1,
                build::secrets::metadata_store_secured(instance),
            )
            .map_err(|e| Error::Certificates(format!("{e:#}")))?;
        let dialer = basalt_control::Dialer::new(servers);
        let admin = Arc::new(GrpcTableAdmin::with_dialer(
            self.admin_timeout,
            dialer.clone(),
        ));
        let transport = Arc::new(Transport {
            etcd,
            admin: admin.clone(),
            backups: admin,
            dialer,
        });
        transports.insert(key, transport.clone());
        Ok(transport)
    }

    /// Publishes an event about `obj`; failures are logged, never fail the reconcile.
    pub async fn publish<K: Resource<DynamicType = ()>>(&self, obj: &K, note: &Note) {
        let event = Event {
            type_: note.type_,
            reason: note.reason.into(),
            note: Some(note.note.clone()),
            action: note.action.into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &obj.object_ref(&())).await {
            tracing::warn!(error = %e, reason = note.reason, "could not publish event");
        }
    }
}

/// A Kubernetes event to publish about the reconciled object: what the operator did
/// (`Created`, `TableDeleted`) or found (`InvalidSpec`, `DeletionBlocked`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    pub type_: EventType,
    pub reason: &'static str,
    pub action: &'static str,
    pub note: String,
}

impl Note {
    pub fn normal(reason: &'static str, action: &'static str, note: impl Into<String>) -> Self {
        Self {
            type_: EventType::Normal,
            reason,
            action,
            note: note.into(),
        }
    }

    pub fn warning(reason: &'static str, action: &'static str, note: impl Into<String>) -> Self {
        Self {
            type_: EventType::Warning,
            reason,
            action,
            note: note.into(),
        }
    }
}

/// The `InvalidSpec` warning event for `message`, unless the object's `condition` already
/// reports that message: the user is told once when a problem appears, not at every reconcile.
pub fn invalid_spec_warning(
    conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    condition: &str,
    message: &str,
) -> Vec<Note> {
    if crate::conditions::find(conditions, condition).map(|c| c.message.as_str()) == Some(message) {
        vec![]
    } else {
        vec![Note::warning("InvalidSpec", "Validate", message)]
    }
}

/// How a reconcile ends, as a pure status builder computes it: the status to write, the
/// events that report what it found, and when to reconcile again.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome<S> {
    pub status: S,
    pub events: Vec<Note>,
    pub requeue: Action,
}

/// The last stage of every pipeline: publishes the outcome's events, then writes its status
/// in one patch (none when the status would not change), and says when to look again.
pub async fn finish<K>(
    ctx: &Context,
    api: &Api<K>,
    obj: &K,
    outcome: Outcome<K::Status>,
) -> Result<Action>
where
    K: Resource<DynamicType = ()> + HasStatus + Clone + DeserializeOwned + Debug,
    K::Status: PartialEq + Serialize,
{
    for note in &outcome.events {
        ctx.publish(obj, note).await;
    }
    if obj.status() != Some(&outcome.status) {
        apply_status(api, obj, &outcome.status).await?;
    }
    Ok(outcome.requeue)
}

/// Applies `obj` with server-side apply as the operator's field manager (forcing ownership of
/// the fields it sets; fields other managers own stay theirs).
pub async fn apply<K>(api: &Api<K>, obj: &K) -> Result<K>
where
    K: Resource + Clone + Serialize + DeserializeOwned + Debug,
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
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
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

/// The span a reconcile of `obj` runs in: its kind, namespace and name on every line it logs.
pub fn reconcile_span<K: Resource<DynamicType = ()>>(obj: &K) -> tracing::Span {
    tracing::info_span!(
        "reconcile",
        kind = %K::kind(&()),
        namespace = %obj.namespace().unwrap_or_default(),
        name = %obj.name_any(),
    )
}

/// Runs one reconcile of `obj` in its [`reconcile_span`], recording its outcome and duration
/// under `controller`.
pub async fn reconciling<K, F>(
    ctx: &Context,
    controller: &'static str,
    obj: &K,
    reconcile: F,
) -> Result<Action>
where
    K: Resource<DynamicType = ()>,
    F: Future<Output = Result<Action>>,
{
    measured(ctx, controller, reconcile)
        .instrument(reconcile_span(obj))
        .await
}

/// Runs a reconcile, recording its outcome and duration.
pub async fn measured<F>(ctx: &Context, controller: &'static str, f: F) -> Result<Action>
where
    F: Future<Output = Result<Action>>,
{
    let start = Instant::now();
    let result = f.await;
    ctx.metrics
        .observe(controller, start.elapsed(), result.is_ok());
    result
}

/// Logs a failed reconcile with the object it was for, and retries it after [`RETRY`].
pub fn error_policy<K: Resource<DynamicType = ()>>(
    obj: Arc<K>,
    error: &Error,
    _ctx: Arc<Context>,
) -> Action {
    tracing::warn!(
        kind = %K::kind(&()),
        namespace = %obj.namespace().unwrap_or_default(),
        name = %obj.name_any(),
        %error,
        "reconcile failed; retrying"
    );
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
    admin_timeout: Duration,
    pdb_supported: bool,
    reporter_instance: Option<String>,
    pki: Option<Arc<pki::OperatorPki>>,
) -> Arc<Context> {
    let reporter = Reporter {
        controller: FIELD_MANAGER.into(),
        instance: reporter_instance,
    };
    let admin = Arc::new(GrpcTableAdmin::new(admin_timeout));
    Arc::new(Context {
        recorder: Recorder::new(client.clone(), reporter),
        client,
        config,
        metrics,
        admin: admin.clone(),
        backups: admin,
        pdb_supported,
        // Plaintext: the instances without TLS ([`Context::transport`] dials the others).
        dialer: basalt_control::Dialer::default(),
        pki,
        admin_timeout,
        transports: Default::default(),
    })
}

/// Runs the six controllers until `shutdown` resolves.
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
    // The metadata store's StatefulSet: its members' readiness is the instance's status.
    .owns(Api::<StatefulSet>::all(client.clone()), managed.clone())
    .watches(
        Api::<Cluster>::all(client.clone()),
        watcher::Config::default(),
        |c: Cluster| {
            Some(ObjectRef::new(&c.spec.instance_ref).within(&c.namespace().unwrap_or_default()))
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

    let backups = Controller::new(
        Api::<Backup>::all(client.clone()),
        watcher::Config::default(),
    )
    .graceful_shutdown_on(stop(&tx))
    .run(backup::reconcile_backup, error_policy, ctx.clone())
    .for_each(|_| futures::future::ready(()));

    let schedules = Controller::new(
        Api::<BackupSchedule>::all(client.clone()),
        watcher::Config::default(),
    )
    .graceful_shutdown_on(stop(&tx))
    .run(backup::reconcile_schedule, error_policy, ctx.clone())
    .for_each(|_| futures::future::ready(()));

    let all = futures::future::join(
        futures::future::join4(clusters, instances, tables, profiles),
        futures::future::join(backups, schedules),
    );
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
    use std::sync::Mutex;

    use super::*;

    /// What a `tracing` subscriber printed, for assertions on log lines.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Captured {
        fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync + 'static {
            let out = self.clone();
            tracing_subscriber::fmt()
                .with_writer(move || out.clone())
                .with_ansi(false)
                .finish()
        }
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    /// A context whose client talks to a mock service nobody answers (nothing here calls it).
    fn context_without_api() -> Arc<Context> {
        let (service, _handle) = tower_test::mock::pair::<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
        >();
        context(
            Client::new(service, "default"),
            OperatorConfig::default(),
            Arc::new(Metrics::new()),
            Duration::from_secs(1),
            true,
            None,
            None,
        )
    }

    fn cluster() -> Cluster {
        serde_norway::from_str(
            "metadata: {name: orders-c1, namespace: shop}\nspec: {instanceRef: orders, serveNodes: 1}\n",
        )
        .unwrap()
    }

    #[tokio::test]
    async fn a_reconcile_logs_in_a_span_naming_its_object_and_is_counted() {
        let ctx = context_without_api();
        let logs = Captured::default();
        let _guard = tracing::subscriber::set_default(logs.subscriber());
        let action = reconciling(&ctx, "cluster", &cluster(), async {
            tracing::info!("applied");
            Ok(Action::await_change())
        })
        .await
        .unwrap();
        assert_eq!(action, Action::await_change());
        let text = logs.text();
        assert!(
            text.contains("reconcile{kind=Cluster namespace=shop name=orders-c1}"),
            "{text}"
        );
        assert!(text.contains("applied"), "{text}");
        assert!(
            ctx.metrics
                .render()
                .contains("basalt_operator_reconciles_total{controller=\"cluster\"} 1"),
            "{}",
            ctx.metrics.render()
        );
    }

    #[tokio::test]
    async fn a_failed_reconcile_is_logged_with_its_object_and_retried() {
        let ctx = context_without_api();
        let logs = Captured::default();
        let error = Error::Admin(tonic::Status::unavailable("no tablet server answered"));
        let action = tracing::subscriber::with_default(logs.subscriber(), || {
            error_policy(Arc::new(cluster()), &error, ctx)
        });
        assert_eq!(action, Action::requeue(RETRY));
        let text = logs.text();
        assert!(text.contains("reconcile failed; retrying"), "{text}");
        assert!(
            text.contains("kind=Cluster namespace=shop name=orders-c1"),
            "{text}"
        );
        assert!(text.contains("no tablet server answered"), "{text}");
    }
}
