//! `local apply`: manifests merged into what runs, planned ([`super::plan`]) and carried out
//! change by change; tables brought to their spec and app profiles recorded, as the
//! Kubernetes controllers do ([`crate::lifecycle`]).

use super::*;

impl Runtime {
    /// Records `profiles` (valid ones: the manifests were validated) in local.json's
    /// `appProfiles` and puts them into the instance's catalog in etcd
    /// ([`lifecycle::records::put_all`], as the Kubernetes controller does); why etcd did not
    /// take them, if it did not.
    pub(super) async fn record_app_profiles(
        &self,
        instance: &str,
        profiles: &[crate::crd::AppProfile],
    ) -> Result<(), String> {
        {
            let mut inner = lock(&self.inner);
            let Some(running) = inner.instances.get_mut(instance) else {
                return Err(format!("instance {instance} is not running"));
            };
            for p in profiles {
                running
                    .app_profiles
                    .insert(p.app_profile_id(), p.spec.clone());
            }
        }
        if profiles.is_empty() {
            return Ok(());
        }
        let records: Vec<_> = profiles
            .iter()
            .map(crate::controller::app_profile::catalog::record)
            .collect();
        let urls = std::slice::from_ref(&self.etcd_url);
        match lifecycle::records::put_all(urls, &self.etcd_security, self.keys(instance)?, &records)
            .await
        {
            lifecycle::records::Catalog::Unreachable(why) => Err(why),
            _ => Ok(()),
        }
    }

    /// Records the instance's replication limits (`spec.replication`) in etcd, where its
    /// servers' shippers and its master read them ([`lifecycle::records::put_replication_limits`],
    /// as the Kubernetes controller does); why etcd did not take them, if it did not.
    pub(super) async fn record_replication_limits(
        &self,
        instance: &LocalInstance,
    ) -> Result<(), String> {
        let urls = std::slice::from_ref(&self.etcd_url);
        let limits = instance.instance.spec.replication_limits();
        match lifecycle::records::put_replication_limits(
            urls,
            &self.etcd_security,
            self.keys(&instance.name)?,
            &limits,
        )
        .await
        {
            lifecycle::records::Catalog::Unreachable(why) => Err(why),
            _ => Ok(()),
        }
    }

    pub(super) fn set_table_status(&self, instance: &str, table_id: &str, status: String) {
        {
            let mut inner = lock(&self.inner);
            if let Some(running) = inner.instances.get_mut(instance) {
                running.tables.insert(table_id.to_string(), status);
            }
        }
        self.write_state();
    }

    pub(super) fn instance_and_endpoint(
        &self,
        instance: &str,
    ) -> Option<(Instance, String, Arc<GrpcTableAdmin>)> {
        let inner = lock(&self.inner);
        let running = inner.instances.get(instance)?;
        Some((
            running.instance.clone(),
            running.endpoint.to_string(),
            running.admin.clone(),
        ))
    }

    /// Syncs `table` (retrying until `deadline`, or until the runtime stops when None); the
    /// line to report.
    pub(super) async fn sync_table(
        &self,
        instance: &str,
        table: &Table,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<String, String> {
        let id = crate::rules::table_id(table);
        let Some((inst, endpoint, admin)) = self.instance_and_endpoint(instance) else {
            return Err(format!("table {id}: instance {instance} is not running"));
        };
        let validated = match tables::validated(table, &inst, &endpoint) {
            Ok(v) => v,
            Err(why) => {
                self.set_table_status(instance, &id, format!("refused: {why}"));
                return Err(format!("table {id}: {why}"));
            }
        };
        self.set_table_status(instance, &id, "pending: waiting for a ready server".into());
        let logged = |s: &tonic::Status| tracing::debug!(table = %validated.name, status = %s, "table admin call failed; retrying");
        let mut stop = self.stop_servers.subscribe();
        let result = tokio::select! {
            r = tables::sync_with_retries(&*admin, &validated, deadline, &logged) => r,
            _ = stop.wait_for(|v| *v) => Err(tonic::Status::cancelled("the runtime is stopping")),
        };
        match result {
            Ok(synced) => {
                let status = if synced.refused.is_empty() {
                    "synced".to_string()
                } else {
                    format!("refused: {}", synced.refused.join("; "))
                };
                self.set_table_status(instance, &id, status);
                tracing::info!(instance, "{synced}");
                Ok(synced.to_string())
            }
            Err(s) => {
                let why = format!("{:?}: {}", s.code(), s.message());
                self.set_table_status(instance, &id, format!("pending: {why}"));
                Err(format!("table {}: not applied yet ({why})", validated.name))
            }
        }
    }

    /// Syncs the tables one after the other in a task, retrying until the runtime stops.
    pub(super) fn sync_tables_in_background(self: &Arc<Self>, instance: &str, tables: Vec<Table>) {
        if tables.is_empty() {
            return;
        }
        let rt = self.clone();
        let instance = instance.to_string();
        tokio::spawn(async move {
            for table in tables {
                if let Err(why) = rt.sync_table(&instance, &table, None).await {
                    tracing::warn!(%instance, "{why}");
                }
            }
        });
    }

    /// Applies manifests posted to the control server: the lines to print, or why nothing
    /// was changed.
    pub async fn apply(self: &Arc<Self>, text: &str) -> Result<Vec<String>, ApplyError> {
        let _one_at_a_time = self.apply_lock.lock().await;
        let applied =
            manifests::parse("the applied manifests", text).map_err(ApplyError::Invalid)?;
        if applied.is_empty() {
            return Err(ApplyError::Invalid(ManifestError::Invalid(vec![
                "no manifests to apply".into(),
            ])));
        }
        let (mut current, merged, counts, scale_ins, removing) = {
            let inner = lock(&self.inner);
            if inner.stopped {
                return Err(ApplyError::Stopping);
            }
            let counts: BTreeMap<(String, String), i32> = inner
                .instances
                .values()
                .flat_map(|i| {
                    i.clusters
                        .iter()
                        .map(|(c, rc)| ((i.namespace.clone(), c.clone()), rc.serve_nodes))
                })
                .collect();
            let scale_ins: BTreeMap<String, ScaleInState> = inner
                .instances
                .values()
                .flat_map(|i| {
                    i.clusters
                        .iter()
                        .filter_map(|(c, rc)| Some((c.clone(), rc.scale_in_state()?)))
                })
                .collect();
            let removing: Vec<String> = inner
                .instances
                .values()
                .flat_map(|i| i.clusters.iter())
                .filter(|(_, c)| c.removal.is_some())
                .map(|(name, _)| name.clone())
                .collect();
            (
                inner.desired.clone(),
                inner.manifests.merged(&applied),
                counts,
                scale_ins,
                removing,
            )
        };
        // The counts as they run (an apply that failed part way may have changed some).
        for instance in &mut current {
            for cluster in &mut instance.clusters {
                if let Some(n) = counts.get(&(instance.namespace.clone(), cluster.name.clone())) {
                    cluster.serve_nodes = *n;
                }
            }
        }
        let next = manifests::desired(&merged, &counts).map_err(ApplyError::Invalid)?;
        let changes = plan::plan(&current, &next, &applied, &scale_ins, &removing)
            .map_err(ApplyError::Refused)?;

        // The runtime has no Secrets: say where a backupStore's credentials come from.
        let mut lines: Vec<String> = applied
            .instances
            .iter()
            .filter_map(|i| {
                servers::backup_store_notice(
                    &kube::ResourceExt::name_any(i),
                    i.spec.backup_store.as_ref(),
                )
            })
            .collect();
        let mut to_sync = vec![];
        for change in &changes {
            match change {
                Change::InstanceAdded { instance } => {
                    let li = find(&next, instance);
                    let addr = {
                        let mut inner = lock(&self.inner);
                        let addr =
                            endpoint_addr(&mut inner.ports, li).map_err(ApplyError::Failed)?;
                        inner
                            .ports
                            .save(&self.data_dir)
                            .map_err(|e| ApplyError::Failed(e.into()))?;
                        addr
                    };
                    let listener = bind_endpoint(addr, li).await.map_err(ApplyError::Failed)?;
                    self.start_instance(li, listener)
                        .map_err(ApplyError::Failed)?;
                    if let Err(why) = self.record_replication_limits(li).await {
                        lines.push(format!("{change}; replication limits not in etcd: {why}"));
                        continue;
                    }
                    lines.push(format!(
                        "{change} (endpoint {addr}, {})",
                        li.resource_name()
                    ));
                    continue;
                }
                Change::ClusterAdded {
                    instance, cluster, ..
                } => {
                    let li = find(&next, instance);
                    let lc = li.cluster(cluster).expect("planned from next");
                    self.start_cluster(instance, lc, &[], lc.serve_nodes)
                        .await
                        .map_err(ApplyError::Failed)?;
                }
                Change::ScaledOut {
                    instance,
                    cluster,
                    to,
                    ..
                }
                | Change::ScaledIn {
                    instance,
                    cluster,
                    to,
                    ..
                }
                | Change::ScaleInCancelled {
                    instance,
                    cluster,
                    to,
                    ..
                } => {
                    let done = self
                        .set_count(instance, cluster, *to, None)
                        .await
                        .map_err(ApplyError::Failed)?;
                    match change {
                        Change::ScaledIn { .. } => {
                            let left = match self.observe_now(instance, cluster).await {
                                Some(n) => format!(" ({n} tablet(s) to move)"),
                                None => String::new(),
                            };
                            lines.push(format!(
                                "{change}: {} drain(s){left} — the master moves their tablets away; each stops once the tablet map in etcd says it owns no tablet (`local status` shows the progress; raise serveNodes again to cancel)",
                                done.draining.join(", ")
                            ));
                        }
                        Change::ScaleInCancelled { .. } => {
                            let mut parts = vec![];
                            for (what, names) in [
                                ("kept running", &done.kept),
                                ("started again", &done.started),
                                ("started again once stopped", &done.restarting),
                                ("still draining", &done.draining),
                            ] {
                                if !names.is_empty() {
                                    parts.push(format!("{what}: {}", names.join(", ")));
                                }
                            }
                            lines.push(format!("{change}; {}", parts.join("; ")));
                        }
                        _ => lines.push(change.to_string()),
                    }
                    continue;
                }
                Change::PeerEndpointChanged { instance, .. } => {
                    let replicas = find(&next, instance).replicas();
                    let meta = self.meta(instance).await.map_err(ApplyError::Failed)?;
                    lifecycle::records::declare_replicas(&meta, &replicas)
                        .await
                        .map_err(|why| ApplyError::Failed(anyhow::anyhow!(why)))?;
                }
                Change::TableApplied { instance, table } => {
                    let li = find(&next, instance);
                    let t = li
                        .tables
                        .iter()
                        .find(|t| crate::rules::table_id(t) == *table)
                        .expect("planned from next");
                    to_sync.push((instance.clone(), t.clone()));
                    continue;
                }
                Change::ClusterRemoved { instance, cluster } => {
                    self.remove_cluster(instance, cluster)
                        .map_err(ApplyError::Failed)?;
                }
                Change::ReplicationLimitsApplied { instance } => {
                    if let Err(why) = self.record_replication_limits(find(&next, instance)).await {
                        return Err(ApplyError::Failed(anyhow::anyhow!(
                            "instance {instance}: the replication limits are not recorded in etcd: {why}"
                        )));
                    }
                }
                // The instance's backup task reads it from the manifests once they are set.
                Change::BackupApplied { .. } => {}
                Change::AppProfileApplied {
                    instance,
                    app_profile,
                } => {
                    let li = find(&next, instance);
                    let profiles: Vec<_> = li
                        .app_profiles
                        .iter()
                        .filter(|p| p.app_profile_id() == *app_profile)
                        .cloned()
                        .collect();
                    if let Err(why) = self.record_app_profiles(instance, &profiles).await {
                        lines.push(format!("{change}; not in the catalog in etcd: {why}"));
                        continue;
                    }
                }
            }
            lines.push(change.to_string());
        }
        self.set_manifests(merged, next);
        self.write_state();

        let deadline = tokio::time::Instant::now() + APPLY_TABLE_WAIT;
        for (instance, table) in to_sync {
            match self.sync_table(&instance, &table, Some(deadline)).await {
                Ok(line) => lines.push(format!("instance {instance}: {line}")),
                Err(why) => {
                    lines.push(format!(
                        "instance {instance}: {why}; retried in the background"
                    ));
                    self.sync_tables_in_background(&instance, vec![table]);
                }
            }
        }
        if lines.is_empty() {
            lines.push("unchanged".into());
        }
        Ok(lines)
    }
}

pub(super) fn find<'a>(instances: &'a [LocalInstance], name: &str) -> &'a LocalInstance {
    instances
        .iter()
        .find(|i| i.name == name)
        .expect("planned from the same instances")
}

/// Why an apply changed nothing (or stopped part way).
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The manifests do not parse or break a rule.
    #[error("{0}")]
    Invalid(ManifestError),
    /// The manifests are valid but ask for what the runtime refuses.
    #[error("{0}")]
    Refused(plan::Refused),
    #[error("the runtime is stopping")]
    Stopping,
    /// Starting something failed; what was started before stays.
    #[error("{0:#}")]
    Failed(anyhow::Error),
}
