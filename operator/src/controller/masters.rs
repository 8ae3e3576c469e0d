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

use super::pki::OperatorPki;
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

/// What an instance's master is started with: its etcd endpoints, and whether the instance
/// is secured (the master then dials its servers, and its own etcd, with the operator's
/// certificate).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Target {
    pub endpoints: Vec<String>,
    pub secured: bool,
}

/// What the supervisor does to converge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Start the instance's master with these etcd endpoints.
    Start(InstanceKey, Target),
    /// Stop the running master and start it again with other endpoints or security.
    Restart(InstanceKey, Target),
    /// Stop the master: its Instance is gone.
    Stop(InstanceKey),
}

/// The etcd endpoints the operator uses for each Instance (see
/// [`build::etcd::operator_urls`]); an instance whose store has no address yet maps to none.
/// An Instance whose deletion is held (deletion protection) keeps its master: its tablet
/// servers still serve.
pub fn desired(instances: &[Instance], store_pods: &[Pod]) -> BTreeMap<InstanceKey, Target> {
    instances
        .iter()
        .map(|i| {
            (
                (i.namespace().unwrap_or_default(), i.name_any()),
                Target {
                    endpoints: build::etcd::operator_urls(i, store_pods),
                    secured: build::secrets::secured(i),
                },
            )
        })
        .collect()
}

/// The steps from the `running` masters (their endpoints) to the `desired` ones. An instance
/// whose store has no address right now (its members restarting) keeps its running master:
/// the master rides out an etcd outage on its own. Pure.
pub fn plan(
    running: &BTreeMap<InstanceKey, Target>,
    desired: &BTreeMap<InstanceKey, Target>,
) -> Vec<Step> {
    let mut steps = vec![];
    for (key, target) in desired {
        if target.endpoints.is_empty() {
            continue;
        }
        match running.get(key) {
            None => steps.push(Step::Start(key.clone(), target.clone())),
            Some(now) if now != target => steps.push(Step::Restart(key.clone(), target.clone())),
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
    target: Target,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Running {
    fn start(
        key: &InstanceKey,
        target: Target,
        identity: &str,
        prometheus_url: Option<&str>,
        pki: Option<&OperatorPki>,
        keyviz: &crate::keyviz::Sources,
    ) -> Running {
        let (stop, stopped) = watch::channel(false);
        let plaintext = basalt_transport::Security::Plaintext;
        // A secured instance's master dials with the operator's certificate; without a CA
        // (or with one that does not load) it runs plaintext and fails to reach the servers,
        // as the Instance's status reports.
        let (security, etcd_security) = match (target.secured, pki) {
            (true, Some(pki)) => {
                let etcd_tls = target.endpoints.iter().any(|e| e.starts_with("https://"));
                match pki.towards_instance(&key.0, &key.1, etcd_tls) {
                    Ok(securities) => securities,
                    Err(error) => {
                        tracing::warn!(error = %format!("{error:#}"), namespace = %key.0, instance = %key.1, "the operator's certificate does not load");
                        (plaintext.clone(), plaintext)
                    }
                }
            }
            _ => (plaintext.clone(), plaintext),
        };
        let endpoints = target.endpoints.clone();
        let config = MasterConfig {
            security,
            etcd_security,
            etcd_endpoints: endpoints.clone(),
            namespace: key.0.clone(),
            instance: key.1.clone(),
            identity: identity.to_string(),
            prometheus_url: prometheus_url.map(str::to_string),
        };
        tracing::info!(namespace = %key.0, instance = %key.1, ?endpoints, "starting the instance's master");
        keyviz.set(
            key.clone(),
            crate::keyviz::Source {
                endpoints: endpoints.clone(),
                security: config.etcd_security.clone(),
            },
        );
        let task = tokio::spawn(run_until_stopped(config, stopped));
        Running { target, stop, task }
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
    pki: Option<std::sync::Arc<OperatorPki>>,
    keyviz: std::sync::Arc<crate::keyviz::Sources>,
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
                let now: BTreeMap<InstanceKey, Target> = running
                    .iter()
                    .map(|(k, r)| (k.clone(), r.target.clone()))
                    .collect();
                for step in plan(&now, &want) {
                    match step {
                        Step::Start(key, target) => {
                            let r = Running::start(
                                &key,
                                target,
                                &identity,
                                prometheus_url.as_deref(),
                                pki.as_deref(),
                                &keyviz,
                            );
                            running.insert(key, r);
                        }
                        Step::Restart(key, target) => {
                            if let Some(old) = running.remove(&key) {
                                old.stop(&key).await;
                            }
                            let r = Running::start(
                                &key,
                                target,
                                &identity,
                                prometheus_url.as_deref(),
                                pki.as_deref(),
                                &keyviz,
                            );
                            running.insert(key, r);
                        }
                        Step::Stop(key) => {
                            if let Some(old) = running.remove(&key) {
                                tracing::info!(namespace = %key.0, instance = %key.1, "the Instance is gone: stopping its master");
                                keyviz.remove(&key);
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

    fn target(endpoints: &[&str]) -> Target {
        Target {
            endpoints: endpoints.iter().map(|s| s.to_string()).collect(),
            secured: false,
        }
    }

    fn map(entries: &[(&str, &[&str])]) -> BTreeMap<InstanceKey, Target> {
        entries.iter().map(|(n, e)| (key(n), target(e))).collect()
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
                Step::Start(key("new"), target(&["http://10.0.0.5:2379"])),
                Step::Restart(key("users"), target(&["http://10.0.0.9:2379"])),
                Step::Stop(key("gone")),
            ]
        );
        assert!(plan(&running, &running).is_empty());
        // An instance secured since its master started: started again, with the operator's
        // certificate.
        let mut secured = running.clone();
        secured.get_mut(&key("orders")).unwrap().secured = true;
        assert_eq!(
            plan(&running, &secured),
            [Step::Restart(
                key("orders"),
                Target {
                    endpoints: vec!["http://10.0.0.1:2379".into()],
                    secured: true
                }
            )]
        );
    }

    #[test]
    fn an_instance_without_store_addresses_has_no_endpoints_to_start_with() {
        let fresh: Instance = serde_norway::from_str(
            "metadata: {name: orders, namespace: shop}\nspec: {displayName: Orders}\n",
        )
        .unwrap();
        // Production: secured by default.
        assert_eq!(
            desired(&[fresh], &[]),
            BTreeMap::from([(
                key("orders"),
                Target {
                    endpoints: vec![],
                    secured: true
                }
            )])
        );
        let external: Instance = serde_norway::from_str(
            "metadata: {name: users, namespace: shop}\nspec: {displayName: Users, metadataStore: {endpoints: ['http://etcd:2379']}}\n",
        )
        .unwrap();
        assert_eq!(
            desired(&[external], &[]),
            BTreeMap::from([(
                key("users"),
                Target {
                    endpoints: vec!["http://etcd:2379".into()],
                    secured: true
                }
            )])
        );
    }
}
