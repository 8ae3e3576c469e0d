//! A cluster that a `local apply` leaves out of a running instance leaves it as a deleted
//! Cluster does on Kubernetes (`controller::cluster::removal`), step by step on the
//! lifecycle's decision ([`lifecycle::removal::step`], the same for both runtimes):
//!
//! 1. **Route away.** Its servers leave the instance's endpoint: new client connections go to
//!    the clusters that stay; etcd marks the cluster as being removed
//!    ([`removal::route_away`]), so its servers send the requests of connections still open to
//!    the clusters that stay; and a running server's report counts only if it is newer than this moment. `local.json` shows
//!    the cluster `removing`, with the reason and message Kubernetes puts in the Cluster's
//!    `Removing` condition.
//! 2. **Wait** while the decision refuses: the message names each server, the entries it holds
//!    and for which clusters.
//! 3. **Stop** its servers (SIGTERM: each gives its shippers a moment to ship the rest of its
//!    log, so its last report covers every write it acknowledged).
//! 4. Once none is registered, decide again on their last reports: **release** the replica (its
//!    number and `shipped/` records go from etcd; the other clusters stop shipping to it) and
//!    the cluster leaves `local.json`; or, if writes came in after the decision (a request
//!    another cluster routed there before it saw the mark) and were not shipped, **start** its servers again (still out of the endpoint)
//!    and wait again.
//!
//! A runtime stopped meanwhile starts without the cluster (it is no longer in its manifests),
//! and releases it at start once its last reports allow ([`lifecycle::records::declare_replicas`]).

use super::*;
use crate::lifecycle::removal::{self, Step};
use crate::local::state::RemovingState;

/// How often a removal looks again.
const POLL: Duration = Duration::from_secs(1);

/// A cluster on its way out of its instance.
pub(super) struct Removal {
    /// When its servers left the endpoint (microseconds since the epoch).
    since_micros: i64,
    /// The runtime stopped its servers (step 3).
    stopped: bool,
    /// What `local.json` shows.
    pub(super) state: RemovingState,
}

fn shown(reason: &str, message: impl Into<String>) -> RemovingState {
    RemovingState {
        reason: reason.into(),
        message: message.into(),
    }
}

impl Runtime {
    /// Begins the removal of `cluster` from `instance` (step 1), and carries it on in a task.
    pub(super) fn remove_cluster(
        self: &Arc<Self>,
        instance: &str,
        cluster: &str,
    ) -> anyhow::Result<()> {
        {
            let mut inner = lock(&self.inner);
            let running = inner
                .instances
                .get_mut(instance)
                .with_context(|| format!("instance {instance} is not running"))?;
            let backends = running.backends.clone();
            let c = running
                .clusters
                .get_mut(cluster)
                .with_context(|| format!("cluster {cluster} is not running"))?;
            for server in &c.servers {
                backends.remove(&server.spec.name());
            }
            c.removal = Some(Removal {
                since_micros: basalt_master::model::hlc::now_micros(),
                stopped: false,
                state: shown(
                    "UnshippedWrites",
                    "client connections routed away; waiting for the servers' next reports",
                ),
            });
        }
        tracing::info!(%instance, %cluster, "removing the cluster: client connections routed away; its servers stop once every write they logged is in a cluster that stays");
        self.write_state();
        let (rt, instance, cluster) = (self.clone(), instance.to_string(), cluster.to_string());
        tokio::spawn(async move { rt.carry_removal(&instance, &cluster).await });
        Ok(())
    }

    /// Steps 2 to 4, every [`POLL`], until the cluster is released or the runtime stops.
    async fn carry_removal(self: Arc<Self>, instance: &str, cluster: &str) {
        let mut stop = self.stop_servers.subscribe();
        let mut meta = None;
        let mut marked = false;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(POLL) => {}
                _ = stop.wait_for(|v| *v) => return,
            }
            if meta.is_none() {
                meta = self.meta(instance).await.ok();
            }
            let Some(m) = &meta else {
                self.set_removing(instance, cluster, |r| {
                    r.state = shown(
                        "MetadataStoreUnreachable",
                        "etcd did not answer: the removal waits for it",
                    )
                });
                continue;
            };
            let Some((staying, since, stopped, serve_nodes)) =
                self.removal_facts(instance, cluster)
            else {
                return;
            };
            if !marked {
                match tokio::time::timeout(ETCD_TIMEOUT, removal::route_away(m, cluster, since))
                    .await
                {
                    Ok(Ok(())) => marked = true,
                    _ => {
                        meta = None;
                        continue;
                    }
                }
            }
            let facts = match tokio::time::timeout(ETCD_TIMEOUT, removal::observe(m, cluster)).await
            {
                Ok(Ok(facts)) => facts,
                _ => {
                    meta = None;
                    continue;
                }
            };
            match removal::step(&facts, &staying, !stopped, Some(since)) {
                Step::Wait(refused) => self.set_removing(instance, cluster, |r| {
                    r.state = shown(refused.reason(), refused.to_string())
                }),
                Step::Stop => {
                    tracing::info!(%cluster, "every write of the cluster is in another cluster: stopping its servers");
                    self.set_removing(instance, cluster, |r| {
                        r.stopped = true;
                        r.state = shown(
                            "StoppingServers",
                            "every write of the cluster is in another cluster: its servers stop",
                        );
                    });
                    if let Err(error) = self.run_servers(instance, cluster, 0) {
                        tracing::warn!(%cluster, %error, "cannot stop the servers");
                    }
                }
                Step::Stopping { registered } => self.set_removing(instance, cluster, |r| {
                    r.state = shown(
                        "StoppingServers",
                        format!("every write of the cluster is in another cluster: {registered} server(s) still registered"),
                    )
                }),
                Step::Restart(refused) => {
                    tracing::info!(%cluster, %refused, "the servers stopped with writes not yet shipped: starting them again");
                    self.set_removing(instance, cluster, |r| {
                        r.stopped = false;
                        r.state = shown(refused.reason(), refused.to_string());
                    });
                    if let Err(error) = self.run_servers(instance, cluster, serve_nodes) {
                        tracing::warn!(%cluster, %error, "cannot start the servers again");
                    }
                }
                Step::Release => {
                    if self.still_has_processes(instance, cluster) {
                        continue; // their exits are not reaped yet
                    }
                    match tokio::time::timeout(ETCD_TIMEOUT, m.remove_replica(cluster)).await {
                        Ok(Ok(())) => {}
                        _ => continue,
                    }
                    {
                        let mut inner = lock(&self.inner);
                        if let Some(running) = inner.instances.get_mut(instance) {
                            running.clusters.remove(cluster);
                        }
                    }
                    tracing::info!(%instance, %cluster, staying = %staying.join(", "), "the cluster left the instance: every write it logged is in a cluster that stays, its servers stopped, no more replication to it");
                    self.write_state();
                    return;
                }
            }
        }
    }

    /// The clusters that stay, when client connections were routed away, whether the servers
    /// were stopped, and how many the cluster ran; None once the cluster is no longer being
    /// removed.
    fn removal_facts(
        &self,
        instance: &str,
        cluster: &str,
    ) -> Option<(Vec<String>, i64, bool, u32)> {
        let inner = lock(&self.inner);
        let staying = inner
            .desired
            .iter()
            .filter(|i| i.name == instance)
            .flat_map(|i| i.clusters.iter().map(|c| c.name.clone()))
            .collect();
        let c = inner.instances.get(instance)?.clusters.get(cluster)?;
        let r = c.removal.as_ref()?;
        Some((
            staying,
            r.since_micros,
            r.stopped,
            c.serve_nodes.max(1) as u32,
        ))
    }

    fn still_has_processes(&self, instance: &str, cluster: &str) -> bool {
        let inner = lock(&self.inner);
        inner
            .instances
            .get(instance)
            .and_then(|i| i.clusters.get(cluster))
            .is_some_and(|c| !c.servers.is_empty())
    }

    /// Changes the removal's record; `local.json` is rewritten when what it shows changed.
    fn set_removing(&self, instance: &str, cluster: &str, change: impl FnOnce(&mut Removal)) {
        let changed = {
            let mut inner = lock(&self.inner);
            let Some(r) = inner
                .instances
                .get_mut(instance)
                .and_then(|i| i.clusters.get_mut(cluster))
                .and_then(|c| c.removal.as_mut())
            else {
                return;
            };
            let before = r.state.clone();
            change(r);
            if r.state != before {
                tracing::info!(%cluster, reason = %r.state.reason, "removing: {}", r.state.message);
            }
            r.state != before
        };
        if changed {
            self.write_state();
        }
    }
}
