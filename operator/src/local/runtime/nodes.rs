//! The local runtime's [`NodeRuntime`]: a cluster's tablet servers are supervised processes
//! on 127.0.0.1, each on its own data directory and ports (kept across runs). Like a
//! StatefulSet, the runtime runs ordinals `0..n`: [`LocalNodes::set_servers`] starts those
//! below `n` that do not run and stops (SIGTERM, then the stop grace) those at or above it; a
//! server stopped while the count is raised over it starts again on its data once it exited.
//! Restarting a server ends its process; its supervisor starts it again on the same data.
//!
//! What the count should be is the lifecycle's decision ([`crate::lifecycle::scale`]), the
//! same as on Kubernetes.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context as _, bail};
use basalt_master::NodeRuntime;
use tokio::sync::watch;

use super::{Inner, RunningCluster, RunningServer, Runtime, Site, lock};
use crate::crd::VolumeReclaimPolicy;
use crate::local::endpoint::Backend;
use crate::local::process::{self, ProcessState};
use crate::local::servers::{self, ServerSpec};
use crate::local::state::PortBook;

/// Why the servers could not be run as asked.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NodeError(String);

impl From<anyhow::Error> for NodeError {
    fn from(e: anyhow::Error) -> Self {
        NodeError(format!("{e:#}"))
    }
}

/// The servers of one instance's clusters.
pub struct LocalNodes {
    pub(super) runtime: Arc<Runtime>,
    pub(super) instance: String,
}

impl NodeRuntime for LocalNodes {
    type Error = NodeError;

    async fn set_servers(&self, cluster: &str, servers: u32) -> Result<(), NodeError> {
        Ok(self.runtime.run_servers(&self.instance, cluster, servers)?)
    }

    async fn restart(&self, cluster: &str, ordinal: u32) -> Result<(), NodeError> {
        let pid = {
            let inner = lock(&self.runtime.inner);
            let c = inner.cluster(&self.instance, cluster)?;
            let server = c
                .servers
                .iter()
                .find(|s| s.spec.ordinal == ordinal && !s.stopping)
                .with_context(|| format!("server {ordinal} of cluster {cluster} does not run"))?;
            server
                .state
                .pid()
                .with_context(|| format!("server {} has no process now", server.spec.name()))?
        };
        tracing::info!(%cluster, ordinal, pid, "restarting the server on its data");
        process::signal(pid, "TERM");
        Ok(())
    }
}

impl Runtime {
    /// Restarts the tablet server named `name` on its data ([`LocalNodes::restart`]); what
    /// was done, in a line.
    pub async fn restart_server(self: &Arc<Self>, name: &str) -> anyhow::Result<String> {
        let found = {
            let inner = lock(&self.inner);
            inner.instances.iter().find_map(|(instance, i)| {
                i.clusters.iter().find_map(|(cluster, c)| {
                    c.servers
                        .iter()
                        .find(|s| s.spec.name() == name)
                        .map(|s| (instance.clone(), cluster.clone(), s.spec.ordinal))
                })
            })
        };
        let (instance, cluster, ordinal) =
            found.with_context(|| format!("no tablet server named {name:?} runs here"))?;
        let nodes = LocalNodes {
            runtime: self.clone(),
            instance,
        };
        nodes.restart(&cluster, ordinal).await?;
        Ok(format!(
            "server {name} restarting on its data directory (cluster {cluster})"
        ))
    }

    /// Runs ordinals `0..servers` of `cluster`: starts those that neither run nor stop, stops
    /// those at or above. The count is remembered: a stopping server below it starts again
    /// once it exited.
    pub(super) fn run_servers(
        self: &Arc<Self>,
        instance: &str,
        cluster: &str,
        servers: u32,
    ) -> anyhow::Result<()> {
        let mut exits = vec![];
        let mut started = false;
        {
            let mut inner = lock(&self.inner);
            let Inner {
                ports, instances, ..
            } = &mut *inner;
            let running = instances
                .get_mut(instance)
                .with_context(|| format!("instance {instance} is not running"))?;
            let site = Site::of(running);
            let c = running
                .clusters
                .get_mut(cluster)
                .with_context(|| format!("cluster {cluster} is not running"))?;
            c.replicas = servers;
            let present: Vec<u32> = c.servers.iter().map(|s| s.spec.ordinal).collect();
            for ordinal in (0..servers).filter(|o| !present.contains(o)) {
                self.start_server(ports, &site, instance, cluster, c, ordinal)?;
                started = true;
            }
            for server in c.servers.iter_mut() {
                if server.spec.ordinal < servers || server.stopping {
                    continue;
                }
                let name = server.spec.name();
                tracing::info!(%cluster, server = %name, "stopping it: the cluster runs {servers} server(s)");
                site.backends.remove(&name);
                server.stopping = true;
                let _ = server.stop.send(true);
                exits.push((name, server.exited.clone()));
            }
            if started {
                ports.save(&self.data_dir)?;
            }
        }
        // Called every second during a scale-in: local.json is rewritten only on a change.
        let changed = started || !exits.is_empty();
        for (name, mut exited) in exits {
            let rt = self.clone();
            let (instance, cluster) = (instance.to_string(), cluster.to_string());
            tokio::spawn(async move {
                let _ = exited.wait_for(|v| *v).await;
                rt.server_exited(&instance, &cluster, &name);
            });
        }
        if changed {
            self.write_state();
        }
        Ok(())
    }

    /// Starts server `ordinal` of `cluster` (on its data directory, at its remembered ports)
    /// and puts it behind the instance's endpoint. Nothing starts once the runtime stops.
    pub(super) fn start_server(
        self: &Arc<Self>,
        ports: &mut PortBook,
        site: &Site,
        instance: &str,
        cluster: &str,
        c: &mut RunningCluster,
        ordinal: u32,
    ) -> anyhow::Result<()> {
        if *self.stop_servers.borrow() {
            bail!("the runtime is stopping");
        }
        let key = format!(
            "{}/{}",
            site.namespace,
            servers::server_name(cluster, ordinal)
        );
        let p = ports.server(&key)?;
        let spec = ServerSpec {
            namespace: site.namespace.clone(),
            instance: instance.to_string(),
            project: site.project.clone(),
            cluster: cluster.to_string(),
            ordinal,
            data_dir: servers::server_data_dir(&self.data_dir, &site.namespace, cluster, ordinal),
            grpc: SocketAddr::from(([127, 0, 0, 1], p.grpc)),
            http: SocketAddr::from(([127, 0, 0, 1], p.http)),
            cpu_millicores: c.cpu_millicores,
            security: site.security.clone(),
            backup: servers::backup_location(&self.data_dir, site.backup_store.as_ref()),
        };
        std::fs::create_dir_all(&spec.data_dir)
            .with_context(|| format!("cannot create {}", spec.data_dir.display()))?;
        let process = servers::process_spec(
            &spec,
            &self.etcd_url,
            &self.data_dir.join("logs"),
            &self.tablet_server_bin,
        );
        let state = Arc::new(ProcessState::default());
        // A cluster being removed runs its servers again only to ship their writes: clients
        // are not routed to them.
        if c.removal.is_none() {
            site.backends.add(Backend {
                name: spec.name(),
                grpc: spec.grpc,
                state: state.clone(),
            });
        }
        // Its own stop, turned by a scale-in or by the runtime's stop.
        let (stop, stop_rx) = watch::channel(false);
        let (exited_tx, exited) = watch::channel(false);
        let forward = stop.clone();
        let mut everything = self.stop_servers.subscribe();
        tokio::spawn(async move {
            let all = tokio::select! {
                _ = everything.wait_for(|v| *v) => true,
                _ = forward.closed() => false,
            };
            if all {
                let _ = forward.send(true);
            }
        });
        let rt = self.clone();
        let supervised = process::supervise(
            process,
            state.clone(),
            stop_rx,
            Arc::new(move || rt.write_state()),
        );
        lock(&self.supervised).push(tokio::spawn(async move {
            supervised.await;
            let _ = exited_tx.send(true);
        }));
        tracing::info!(server = %spec.name(), grpc = %spec.grpc, http = %spec.http, "server added");
        let at = c.servers.partition_point(|s| s.spec.ordinal < ordinal);
        c.servers.insert(
            at,
            RunningServer {
                spec,
                state,
                stop,
                exited,
                stopping: false,
            },
        );
        Ok(())
    }

    /// A server a scale-in stopped has exited: it leaves the cluster, and its data directory
    /// too if the Cluster's `volumeReclaimPolicy` is `Delete` — unless the count was raised over
    /// it meanwhile: then it starts again on its data.
    pub(super) fn server_exited(self: &Arc<Self>, instance: &str, cluster: &str, name: &str) {
        let mut delete = None;
        {
            let mut inner = lock(&self.inner);
            let policy = inner
                .desired
                .iter()
                .find(|i| i.name == instance)
                .and_then(|i| i.cluster(cluster))
                .map(|c| c.cluster.spec.volume_reclaim_policy)
                .unwrap_or_default();
            let Inner {
                ports, instances, ..
            } = &mut *inner;
            let Some(running) = instances.get_mut(instance) else {
                return;
            };
            let site = Site::of(running);
            let Some(c) = running.clusters.get_mut(cluster) else {
                return;
            };
            let Some(i) = c.servers.iter().position(|s| s.spec.name() == name) else {
                return;
            };
            let server = c.servers.remove(i);
            let ordinal = server.spec.ordinal;
            if ordinal < c.replicas {
                tracing::info!(%cluster, server = %name, "the count was raised while it stopped: starting it again");
                if let Err(error) = self.start_server(ports, &site, instance, cluster, c, ordinal) {
                    tracing::error!(%cluster, server = %name, %error, "cannot start it again");
                }
            } else {
                tracing::info!(%cluster, server = %name, "stopped and removed (scale-in)");
                if let Some(s) = c.scale_in.as_mut() {
                    s.stopped.push(name.to_string());
                }
                if policy == VolumeReclaimPolicy::Delete {
                    delete = Some(server.spec.data_dir.clone());
                }
                if c.leaving().is_empty() && c.scale_in.take().is_some() {
                    tracing::info!(%cluster, to = c.serve_nodes, "scale-in done");
                }
            }
        }
        if let Some(dir) = delete {
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => {
                    tracing::info!(server = %name, dir = %dir.display(), "data directory deleted (volumeReclaimPolicy: Delete)")
                }
                Err(error) => {
                    tracing::warn!(server = %name, dir = %dir.display(), %error, "cannot delete the data directory")
                }
            }
        }
        self.write_state();
    }
}
