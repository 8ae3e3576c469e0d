//! Every Instance's master, run by the operator on Kubernetes: one [`crate::master::run`] per
//! Instance, started when the Instance appears (once a member of its metadata store has an
//! address), restarted with the new endpoints when the store's addresses change, and stopped
//! (it resigns) when the Instance is deleted.
//!
//! Every operator replica runs them, not only the holder of the controllers' Kubernetes Lease:
//! each master campaigns in the instance's etcd, which elects exactly one and fences every
//! decision by its term (`docs/master.md`). A standby replica's masters take over as soon as
//! the leader's etcd lease expires, whether or not the Kubernetes Lease has moved.
//!
//! The supervisor looks every [`INTERVAL`]: it lists the Instances and the metadata stores'
//! pods and carries out [`plan`] (pure) — simple and cheap at the number of Instances an
//! operator runs.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::build;
use crate::crd::Instance;
use crate::master::{self, MasterConfig};

/// How often the supervisor looks at the Instances.
pub const INTERVAL: Duration = Duration::from_secs(3);
/// How long a master that failed waits before it runs again.
pub const RESTART_DELAY: Duration = Duration::from_secs(5);
/// How long a stopping master gets to resign.
pub const STOP_DEADLINE: Duration = Duration::from_secs(10);

/// An Instance: (namespace, name).
pub type InstanceKey = (String, String);

/// What the supervisor does to converge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Start the instance's master with these etcd endpoints.
    Start(InstanceKey, Vec<String>),
    /// Stop the running master and start it again with other endpoints.
    Restart(InstanceKey, Vec<String>),
    /// Stop the master: its Instance is gone.
    Stop(InstanceKey),
}

/// The etcd endpoints the operator uses for each Instance (see
/// [`build::etcd::operator_urls`]); an instance whose store has no address yet maps to none.
/// An Instance whose deletion is held (deletion protection) keeps its master: its tablet
/// servers still serve.
pub fn desired(instances: &[Instance], store_pods: &[Pod]) -> BTreeMap<InstanceKey, Vec<String>> {
    instances
        .iter()
        .map(|i| {
            (
                (i.namespace().unwrap_or_default(), i.name_any()),
                build::etcd::operator_urls(i, store_pods),
            )
        })
        .collect()
}

/// The steps from the `running` masters (their endpoints) to the `desired` ones. An instance
/// whose store has no address right now (its members restarting) keeps its running master:
/// the master rides out an etcd outage on its own. Pure.
pub fn plan(
    running: &BTreeMap<InstanceKey, Vec<String>>,
    desired: &BTreeMap<InstanceKey, Vec<String>>,
) -> Vec<Step> {
    let mut steps = vec![];
    for (key, endpoints) in desired {
        if endpoints.is_empty() {
            continue;
        }
        match running.get(key) {
            None => steps.push(Step::Start(key.clone(), endpoints.clone())),
            Some(now) if now != endpoints => {
                steps.push(Step::Restart(key.clone(), endpoints.clone()))
            }
            Some(_) => {}
        }
    }
    for key in running.keys() {
        if !desired.contains_key(key) {
            steps.push(Step::Stop(key.clone()));
        }
    }
    steps
}

/// A running master task.
struct Running {
    endpoints: Vec<String>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Running {
    fn start(
        key: &InstanceKey,
        endpoints: Vec<String>,
        identity: &str,
        prometheus_url: Option<&str>,
    ) -> Running {
        let (stop, stopped) = watch::channel(false);
        let config = MasterConfig {
            security: basalt_transport::Security::Plaintext,
            etcd_security: basalt_transport::Security::Plaintext,
            etcd_endpoints: endpoints.clone(),
            namespace: key.0.clone(),
            instance: key.1.clone(),
            identity: identity.to_string(),
            prometheus_url: prometheus_url.map(str::to_string),
        };
        tracing::info!(namespace = %key.0, instance = %key.1, ?endpoints, "starting the instance's master");
        let task = tokio::spawn(run_until_stopped(config, stopped));
        Running {
            endpoints,
            stop,
            task,
        }
    }

    async fn stop(self, key: &InstanceKey) {
        let _ = self.stop.send(true);
        let mut task = self.task;
        if tokio::time::timeout(STOP_DEADLINE, &mut task)
            .await
            .is_err()
        {
            tracing::warn!(namespace = %key.0, instance = %key.1, "the master did not stop in time; aborted");
            task.abort();
        }
    }
}

/// Runs a master until `stopped` turns true, again after [`RESTART_DELAY`] whenever it fails.
async fn run_until_stopped(config: MasterConfig, stopped: watch::Receiver<bool>) {
    loop {
        let mut s = stopped.clone();
        let shutdown = async move {
            let _ = s.wait_for(|v| *v).await;
        };
        let result = master::run(config.clone(), shutdown).await;
        if *stopped.borrow() {
            return;
        }
        match result {
            Ok(()) => {
                tracing::warn!(instance = %config.instance, "the master returned; running it again")
            }
            Err(error) => {
                tracing::error!(instance = %config.instance, error = format!("{error:#}"), "the master failed; running it again")
            }
        }
        let mut s = stopped.clone();
        tokio::select! {
            _ = tokio::time::sleep(RESTART_DELAY) => {}
            _ = s.wait_for(|v| *v) => return,
        }
    }
}

/// Runs every Instance's master until `shutdown` resolves; then stops them all (they resign).
/// `identity` is this replica's name in the masters' elections (the operator's pod name);
/// `prometheus_url` the Prometheus server their autoscalers ask (None: the servers' reports).
pub async fn supervise(
    client: Client,
    identity: String,
    prometheus_url: Option<String>,
    shutdown: impl Future<Output = ()>,
) {
    let instances: Api<Instance> = Api::all(client.clone());
    let pods: Api<Pod> = Api::all(client);
    let store_pods = ListParams::default().labels(&format!(
        "{}=basalt,{}={}",
        build::LABEL_NAME,
        build::LABEL_COMPONENT,
        build::etcd::COMPONENT
    ));
    let mut running: BTreeMap<InstanceKey, Running> = BTreeMap::new();
    tokio::pin!(shutdown);
    loop {
        match (
            instances.list(&ListParams::default()).await,
            pods.list(&store_pods).await,
        ) {
            (Ok(instances), Ok(pods)) => {
                let want = desired(&instances.items, &pods.items);
                let now: BTreeMap<InstanceKey, Vec<String>> = running
                    .iter()
                    .map(|(k, r)| (k.clone(), r.endpoints.clone()))
                    .collect();
                for step in plan(&now, &want) {
                    match step {
                        Step::Start(key, endpoints) => {
                            let r = Running::start(
                                &key,
                                endpoints,
                                &identity,
                                prometheus_url.as_deref(),
                            );
                            running.insert(key, r);
                        }
                        Step::Restart(key, endpoints) => {
                            if let Some(old) = running.remove(&key) {
                                old.stop(&key).await;
                            }
                            let r = Running::start(
                                &key,
                                endpoints,
                                &identity,
                                prometheus_url.as_deref(),
                            );
                            running.insert(key, r);
                        }
                        Step::Stop(key) => {
                            if let Some(old) = running.remove(&key) {
                                tracing::info!(namespace = %key.0, instance = %key.1, "the Instance is gone: stopping its master");
                                old.stop(&key).await;
                            }
                        }
                    }
                }
            }
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!(error = %e, "cannot list Instances or their metadata stores' pods; masters unchanged");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(INTERVAL) => {}
            _ = &mut shutdown => break,
        }
    }
    let stops = running.into_iter().map(|(key, r)| async move {
        r.stop(&key).await;
    });
    futures::future::join_all(stops).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> InstanceKey {
        ("shop".into(), name.into())
    }

    fn map(entries: &[(&str, &[&str])]) -> BTreeMap<InstanceKey, Vec<String>> {
        entries
            .iter()
            .map(|(n, e)| (key(n), e.iter().map(|s| s.to_string()).collect()))
            .collect()
    }

    #[test]
    fn masters_start_restart_on_new_addresses_and_stop_with_their_instance() {
        let running = map(&[
            ("orders", &["http://10.0.0.1:2379"]),
            ("users", &["http://10.0.0.2:2379"]),
            ("gone", &["http://10.0.0.3:2379"]),
            ("restarting", &["http://10.0.0.4:2379"]),
        ]);
        let desired = map(&[
            ("orders", &["http://10.0.0.1:2379"]),
            ("users", &["http://10.0.0.9:2379"]),
            ("new", &["http://10.0.0.5:2379"]),
            ("starting", &[]),
            ("restarting", &[]),
        ]);
        assert_eq!(
            plan(&running, &desired),
            [
                Step::Start(key("new"), vec!["http://10.0.0.5:2379".into()]),
                Step::Restart(key("users"), vec!["http://10.0.0.9:2379".into()]),
                Step::Stop(key("gone")),
            ]
        );
        assert!(plan(&running, &running).is_empty());
    }

    #[test]
    fn an_instance_without_store_addresses_has_no_endpoints_to_start_with() {
        let fresh: Instance = serde_norway::from_str(
            "metadata: {name: orders, namespace: shop}\nspec: {displayName: Orders}\n",
        )
        .unwrap();
        assert_eq!(desired(&[fresh], &[]), map(&[("orders", &[])]));
        let external: Instance = serde_norway::from_str(
            "metadata: {name: users, namespace: shop}\nspec: {displayName: Users, metadataStore: {endpoints: ['http://etcd:2379']}}\n",
        )
        .unwrap();
        assert_eq!(
            desired(&[external], &[]),
            map(&[("users", &["http://etcd:2379"])])
        );
    }
}
