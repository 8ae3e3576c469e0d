//! What the runtime reports: `local.json` ([`Runtime::snapshot`], rewritten by
//! [`Runtime::write_state`]) and the summary printed once everything started.

use super::*;

impl Runtime {
    /// `local.json` as things are now.
    pub fn snapshot(&self) -> LocalState {
        let inner = lock(&self.inner);
        let running = !inner.stopped;
        LocalState {
            etcd: self.etcd_url.clone(),
            etcd_pid: self.etcd.pid(),
            control: running.then(|| self.control.to_string()),
            pid: running.then(std::process::id),
            instances: inner
                .instances
                .iter()
                .map(|(name, i)| {
                    let replicated = lock(&i.replication).clone();
                    let clusters = i
                        .clusters
                        .iter()
                        .map(|(c, rc)| {
                            let servers = rc
                                .servers
                                .iter()
                                .map(|s| ServerState {
                                    name: s.spec.name(),
                                    grpc: s.spec.grpc.to_string(),
                                    http: s.spec.http.to_string(),
                                    pid: s.state.pid(),
                                    data_dir: s.spec.data_dir.display().to_string(),
                                    restarts: s.state.restarts(),
                                    tablets: lock(&i.tablets)
                                        .get(&s.spec.name())
                                        .copied()
                                        .unwrap_or(0),
                                })
                                .collect();
                            (
                                c.clone(),
                                ClusterState {
                                    serve_nodes: rc.serve_nodes,
                                    servers,
                                    scale_in: rc.scale_in_state(),
                                    removing: rc.removal.as_ref().map(|r| r.state.clone()),
                                    autoscaler: rc.autoscaler.clone(),
                                },
                            )
                        })
                        .collect();
                    (
                        name.clone(),
                        InstanceState {
                            namespace: i.namespace.clone(),
                            endpoint: i.endpoint.to_string(),
                            resource_name: i.resource_name.clone(),
                            clusters,
                            tables: i.tables.clone(),
                            backups: i.backups.clone(),
                            app_profiles: i.app_profiles.clone(),
                            master: state::MasterState {
                                pid: i.master.pid(),
                                restarts: i.master.restarts(),
                                metrics: Some(i.master_metrics.to_string()),
                            },
                            replication: replicated.pairs,
                            seeding: replicated.seeding,
                            routing: replicated.routing,
                            security: i
                                .credentials
                                .as_ref()
                                .and_then(|c| Some((c, c.tls.as_ref()?)))
                                .map(|(c, tls)| state::InstanceSecurityState {
                                    ca: c.ca.clone(),
                                    identities: tls.identities.clone(),
                                }),
                        },
                    )
                })
                .collect(),
            tls: lock(&self.pki).as_ref().map(|pki| state::LocalTls {
                ca: pki.ca_file(),
                operator: pki.operator_files(),
            }),
        }
    }

    /// Rewrites `local.json` (atomically).
    pub fn write_state(&self) {
        let _one_writer = lock(&self.write_lock);
        let snapshot = self.snapshot();
        let path = self.data_dir.join(state::LOCAL_JSON);
        if let Err(error) = state::write_json_atomic(&path, &snapshot) {
            tracing::error!(path = %path.display(), %error, "cannot write the runtime's state");
        }
        let path = self.data_dir.join(state::PROMETHEUS_TARGETS_JSON);
        if let Err(error) = state::write_json_atomic(&path, &state::prometheus_targets(&snapshot)) {
            tracing::error!(path = %path.display(), %error, "cannot write the Prometheus targets");
        }
    }

    /// What a user needs to know once everything started.
    pub(super) fn summary(&self) -> String {
        let s = self.snapshot();
        let mut out = format!(
            "basalt local runtime (pid {}) on {}\n  etcd {}\n",
            std::process::id(),
            self.data_dir.display(),
            s.etcd
        );
        for (name, i) in &s.instances {
            let first = if i.endpoint == self.first_endpoint.to_string() {
                " (first instance)"
            } else {
                ""
            };
            out.push_str(&format!(
                "  instance {name}{first}: BIGTABLE_EMULATOR_HOST={} with {}\n",
                i.endpoint, i.resource_name
            ));
            for (c, cluster) in &i.clusters {
                let names: Vec<&str> = cluster.servers.iter().map(|s| s.name.as_str()).collect();
                out.push_str(&format!("    cluster {c}: {}\n", names.join(", ")));
                if let Some(s) = &cluster.scale_in {
                    out.push_str(&format!(
                        "      scale-in from {} to {} under way: {} drain(s)\n",
                        s.from,
                        s.to,
                        s.draining.join(", ")
                    ));
                }
            }
        }
        out.push_str(&format!(
            "  state in {}, logs in {}; Ctrl-C stops everything",
            self.data_dir.join(state::LOCAL_JSON).display(),
            self.data_dir.join("logs").display()
        ));
        out
    }
}
