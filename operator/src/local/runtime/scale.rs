//! The local runtime's clusters and their size: a cluster started, its count changed by
//! `local apply` ([`Runtime::set_count`]), and the instance's follower that reads etcd every
//! second, keeps the scale-ins' progress and resizes them ([`Runtime::watch_scale_ins`]) —
//! each size through the lifecycle ([`crate::lifecycle::scale`]), as on Kubernetes.

use super::*;
use crate::lifecycle::records::Replica;

impl Runtime {
    /// Keeps `counts` (tablets per server name over the instance's clusters) and `replicated`
    /// (with several clusters: the replication pairs and the seeding) in step with etcd,
    /// rewriting local.json when they change; and every second carries the instance's
    /// scale-ins on ([`Runtime::watch_scale_ins`]). When etcd cannot be read, nothing changes.
    pub(super) fn follow_tablets(
        self: &Arc<Self>,
        instance: &LocalInstance,
        counts: Arc<Mutex<BTreeMap<String, u32>>>,
        replicated: Arc<Mutex<Replicated>>,
    ) {
        let keys = basalt_meta::Keys::new(&instance.namespace, &instance.name);
        let etcd = vec![self.etcd_url.clone()];
        let etcd_security = self.etcd_security.clone();
        let mut stop = self.stop_servers.subscribe();
        let rt = self.clone();
        let name = instance.name.clone();
        tokio::spawn(async move {
            let mut meta = None;
            // Servers learnt from their registrations, by (cluster, store id): how a server
            // whose lease is gone is still named.
            let mut known = ServerBook::default();
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = stop.wait_for(|v| *v) => return,
                }
                if meta.is_none()
                    && let Ok(etcd) = basalt_meta::endpoints(&etcd, &etcd_security)
                {
                    meta = basalt_meta::Meta::connect(&etcd, keys.clone()).await.ok();
                }
                let Some(m) = &meta else { continue };
                let Ok(now) = tablet_counts(m).await else {
                    continue;
                };
                let mut changed = {
                    let mut c = lock(&counts);
                    let changed = *c != now;
                    *c = now;
                    changed
                };
                if let Ok(observed) = lifecycle::replication::observe(m).await {
                    let mut shown = Replicated::default();
                    if !observed.pairs.is_empty() {
                        shown.pairs = observed.shown_pairs();
                        shown.seeding = observed.shown_seeding();
                    }
                    if let Ok(clusters) = lifecycle::routing::observe_with(m).await {
                        shown.routing = rt.profile_routes(&name, &clusters);
                    }
                    let mut r = lock(&replicated);
                    changed |= *r != shown;
                    *r = shown;
                }
                let scale_ins = rt.watch_scale_ins(&name, m, &mut known).await;
                let autoscaled = rt.follow_autoscaler(&name, m).await;
                if changed || scale_ins || autoscaled {
                    rt.write_state();
                }
            }
        });
    }

    /// Carries out the autoscaler's decisions for `instance`'s autoscaled clusters, as the
    /// Kubernetes controller does (the count through [`Runtime::set_count`], the same scale
    /// step as a `local apply`), and keeps each decision for `local.json`. A cluster whose
    /// decision cannot be read is left as it is. True if anything shown changed.
    pub(super) async fn follow_autoscaler(
        self: &Arc<Self>,
        instance: &str,
        meta: &basalt_meta::Meta,
    ) -> bool {
        let clusters: Vec<(LocalCluster, i32)> = {
            let inner = lock(&self.inner);
            let Some(running) = inner.instances.get(instance) else {
                return false;
            };
            inner
                .desired
                .iter()
                .filter(|i| i.name == instance)
                .flat_map(|i| i.clusters.iter())
                .filter(|c| c.cluster.spec.autoscaling.is_some())
                .filter_map(|c| {
                    let rc = running.clusters.get(&c.name)?;
                    rc.removal.is_none().then(|| (c.clone(), rc.serve_nodes))
                })
                .collect()
        };
        let mut changed = false;
        for (cluster, count) in clusters {
            let read = tokio::time::timeout(ETCD_TIMEOUT, meta.autoscaler(&cluster.name)).await;
            let Ok(Ok(decision)) = read else {
                continue;
            };
            let to = crate::build::desired_serve_nodes(
                &cluster.cluster,
                Some(count),
                decision.as_ref().map(|d| d.nodes),
            );
            {
                let mut inner = lock(&self.inner);
                if let Some(rc) = inner
                    .instances
                    .get_mut(instance)
                    .and_then(|i| i.clusters.get_mut(&cluster.name))
                {
                    changed |= rc.autoscaler != decision;
                    rc.autoscaler = decision.clone();
                }
            }
            if to != count {
                let _one_apply = self.apply_lock.lock().await;
                tracing::info!(cluster = %cluster.name, from = count, to, "the autoscaler's decision: resizing");
                match self.set_count(instance, &cluster.name, to, None).await {
                    Ok(_) => changed = true,
                    Err(error) => {
                        tracing::warn!(cluster = %cluster.name, %error, "cannot carry out the autoscaler's decision yet")
                    }
                }
            }
        }
        changed
    }

    /// Where each app profile of `instance` routes on `clusters` (as an AppProfile's status
    /// says on Kubernetes: [`lifecycle::routing::routes_now`]).
    fn profile_routes(
        &self,
        instance: &str,
        clusters: &[basalt_meta::routing::ClusterView],
    ) -> BTreeMap<String, state::ProfileRoutes> {
        let inner = lock(&self.inner);
        let Some(running) = inner.instances.get(instance) else {
            return BTreeMap::new();
        };
        running
            .app_profiles
            .iter()
            .map(|(id, spec)| {
                let record = crate::controller::app_profile::catalog::record_of(id, spec);
                let now = lifecycle::routing::routes_now(&record, clusters);
                (
                    id.clone(),
                    state::ProfileRoutes {
                        routes_to: now.routes_to,
                        unavailable_clusters: now.unavailable,
                    },
                )
            })
            .collect()
    }

    /// One look at every scale-in of `instance`: reads etcd (registrations, move records, the
    /// tablet map), updates the progress, and runs the servers the lifecycle decides on it
    /// ([`Runtime::resize`]: the leaving servers stop once they own nothing). A cluster whose
    /// etcd reads fail is left as it is. True if anything changed.
    pub(super) async fn watch_scale_ins(
        self: &Arc<Self>,
        instance: &str,
        meta: &basalt_meta::Meta,
        known: &mut ServerBook,
    ) -> bool {
        let clusters: Vec<(String, i32)> = {
            let inner = lock(&self.inner);
            let Some(running) = inner.instances.get(instance) else {
                return false;
            };
            running
                .clusters
                .iter()
                .filter(|(_, c)| c.scale_in.is_some())
                .map(|(name, c)| (name.clone(), c.serve_nodes))
                .collect()
        };
        let mut changed = false;
        for (cluster, count) in clusters {
            let observed = match lifecycle::view::observe(meta, &cluster, known).await {
                Ok(observed) => observed,
                Err(error) => {
                    tracing::warn!(%cluster, %error, "cannot read the tablet map in etcd: no leaving server stops until it can be read");
                    continue;
                }
            };
            let observation = scale_in::observe(
                &cluster,
                count.max(0) as u32,
                &observed.servers,
                &observed.tablets,
                &observed.moves,
            );
            changed |= self.progress(instance, &cluster, count, observation);
            let placement = Placement::from(observed);
            if let Err(error) = self
                .resize(instance, &cluster, count, meta, Some(&placement))
                .await
            {
                tracing::warn!(%cluster, %error, "the scale-in waits");
            }
        }
        changed
    }

    /// Applies an observation of the drain of `cluster` to `count` servers, if the count is
    /// still the same: the progress, and the end of the scale-in once no leaving server is left.
    pub(super) fn progress(
        self: &Arc<Self>,
        instance: &str,
        cluster: &str,
        count: i32,
        observation: Observation,
    ) -> bool {
        let mut inner = lock(&self.inner);
        let Some(running) = inner.instances.get_mut(instance) else {
            return false;
        };
        let Some(c) = running.clusters.get_mut(cluster) else {
            return false;
        };
        if c.serve_nodes != count {
            return false; // the count changed since the reads began
        }
        let before = c.scale_in_state();
        let Some(s) = c.scale_in.as_mut() else {
            return false;
        };
        if s.blocked != observation.blocked {
            match &observation.blocked {
                Some(why) => {
                    tracing::warn!(%cluster, to = count, "the scale-in is blocked: {why}")
                }
                None if s.blocked.is_some() => {
                    tracing::info!(%cluster, to = count, "the scale-in goes on")
                }
                None => {}
            }
        }
        s.remaining_tablets = observation.remaining_tablets;
        s.blocked = observation.blocked;
        if c.leaving().is_empty() && c.scale_in.take().is_some() {
            tracing::info!(%cluster, to = count, "scale-in done");
        }
        c.scale_in_state() != before
    }

    /// The lifecycle's step for `cluster`'s size ([`lifecycle::scale::resize`], as on
    /// Kubernetes): `requested` recorded in etcd for the master when it holds another count,
    /// then the servers [`lifecycle::scale::size`] decides run ([`LocalNodes`]). `placement`:
    /// what etcd says of the cluster now (None: not read, so nothing stops).
    pub(super) async fn resize(
        self: &Arc<Self>,
        instance: &str,
        cluster: &str,
        requested: i32,
        meta: &basalt_meta::Meta,
        placement: Option<&Placement>,
    ) -> anyhow::Result<()> {
        let (current, settled, replicas, autoscaling) = {
            let inner = lock(&self.inner);
            let c = inner.cluster(instance, cluster)?;
            let settled = c
                .scale_in
                .as_ref()
                .is_some_and(|s| s.since.elapsed() >= lifecycle::scale::SCALE_IN_SETTLE);
            let replicas: Vec<Replica> = inner
                .desired
                .iter()
                .filter(|i| i.name == instance)
                .flat_map(LocalInstance::replicas)
                .collect();
            let autoscaling = inner
                .desired
                .iter()
                .filter(|i| i.name == instance)
                .flat_map(|i| &i.clusters)
                .find(|c| c.name == cluster)
                .and_then(|c| lifecycle::autoscaling::settings(&c.cluster.spec));
            (c.replicas as i32, settled, replicas, autoscaling)
        };
        let recorded = match placement {
            Some(p) => p.serve_nodes,
            None => tokio::time::timeout(ETCD_TIMEOUT, meta.serve_nodes(cluster))
                .await
                .map_err(|_| anyhow::anyhow!("etcd did not answer in {ETCD_TIMEOUT:?}"))?
                .map_err(|e| {
                    anyhow::anyhow!("cannot read serveNodes of cluster {cluster} in etcd: {e}")
                })?,
        };
        let size = lifecycle::scale::size(requested, Some(current), placement, settled);
        let nodes = LocalNodes {
            runtime: self.clone(),
            instance: instance.to_string(),
        };
        lifecycle::scale::resize(
            &nodes,
            Some(meta),
            cluster,
            &replicas,
            autoscaling.as_ref(),
            &size,
            Some(current),
            Some(recorded),
        )
        .await
        .map_err(|e| match e {
            ResizeError::Record(why) => anyhow::anyhow!(why),
            ResizeError::Runtime(e) => anyhow::anyhow!(e),
        })
    }

    /// The progress of a scale-in just asked for, read from etcd at once (nothing stops
    /// here); the tablets left to move, or None if etcd did not answer.
    pub(super) async fn observe_now(
        self: &Arc<Self>,
        instance: &str,
        cluster: &str,
    ) -> Option<usize> {
        let (namespace, count) = {
            let inner = lock(&self.inner);
            let running = inner.instances.get(instance)?;
            (
                running.namespace.clone(),
                running.clusters.get(cluster)?.serve_nodes,
            )
        };
        let keys = basalt_meta::Keys::new(&namespace, instance);
        let read = async {
            let meta = basalt_meta::Meta::connect(&self.etcd_endpoints()?, keys).await?;
            observe_drain(
                &meta,
                cluster,
                count.max(0) as u32,
                &mut ServerBook::default(),
            )
            .await
        };
        let observation = tokio::time::timeout(ETCD_TIMEOUT, read).await.ok()?.ok()?;
        let remaining = observation.remaining_tablets;
        if self.progress(instance, cluster, count, observation) {
            self.write_state();
        }
        Some(remaining)
    }

    /// A new cluster of a running instance: its servers `0..serveNodes`, and `extra` ones
    /// above (left by a previous run: they drain, a scale-in from `from`). Nothing runs if
    /// its count cannot be recorded in etcd.
    pub(super) async fn start_cluster(
        self: &Arc<Self>,
        instance: &str,
        cluster: &LocalCluster,
        extra: &[u32],
        from: i32,
    ) -> anyhow::Result<()> {
        {
            let mut inner = lock(&self.inner);
            let running = inner
                .instances
                .get_mut(instance)
                .with_context(|| format!("instance {instance} is not running"))?;
            running.clusters.insert(
                cluster.name.clone(),
                RunningCluster {
                    serve_nodes: 0,
                    replicas: 0,
                    servers: vec![],
                    scale_in: None,
                    removal: None,
                    autoscaler: None,
                    cpu_millicores: servers::cpu_millicores(&cluster.cluster.spec),
                },
            );
        }
        let started = async {
            if let Some(top) = extra.iter().max() {
                // As a StatefulSet would: every ordinal up to the highest left over runs.
                self.run_servers(instance, &cluster.name, top + 1)?;
            }
            self.set_count(instance, &cluster.name, cluster.serve_nodes, Some(from))
                .await
        };
        if let Err(error) = started.await {
            let stopped = {
                let mut inner = lock(&self.inner);
                inner
                    .instances
                    .get_mut(instance)
                    .and_then(|i| i.clusters.remove(&cluster.name))
            };
            for server in stopped.into_iter().flat_map(|c| c.servers) {
                let _ = server.stop.send(true);
            }
            return Err(error);
        }
        Ok(())
    }

    /// Brings a running cluster to `to` servers: the count recorded in etcd, then the servers
    /// the lifecycle decides run ([`Runtime::resize`]: those below `to` start, none stops yet);
    /// those at or above it drain (a scale-in, from `from` if one begins: else from the count
    /// before), or the scale-in ends when none is left above. Nothing changes if etcd does not
    /// take the count.
    pub(super) async fn set_count(
        self: &Arc<Self>,
        instance: &str,
        cluster: &str,
        to: i32,
        from: Option<i32>,
    ) -> anyhow::Result<CountChange> {
        let mut change = {
            let inner = lock(&self.inner);
            let c = inner.cluster(instance, cluster)?;
            let plan = scale_in::reconcile(to.max(0) as u32, &c.running(), &c.stopping());
            let mut change = CountChange {
                started: plan
                    .start
                    .iter()
                    .map(|o| servers::server_name(cluster, *o))
                    .collect(),
                ..CountChange::default()
            };
            for s in &c.servers {
                let ordinal = s.spec.ordinal as i32;
                if ordinal >= to {
                    change.draining.push(s.spec.name());
                } else if s.stopping {
                    change.restarting.push(s.spec.name());
                } else if ordinal >= c.serve_nodes {
                    change.kept.push(s.spec.name());
                }
            }
            change
        };
        let meta = self.meta(instance).await?;
        self.resize(instance, cluster, to, &meta, None).await?;

        let mut inner = lock(&self.inner);
        let running = inner
            .instances
            .get_mut(instance)
            .with_context(|| format!("instance {instance} is not running"))?;
        let counts = lock(&running.tablets).clone();
        let c = running
            .clusters
            .get_mut(cluster)
            .with_context(|| format!("cluster {cluster} is not running"))?;
        let old = c.serve_nodes;
        c.serve_nodes = to;
        change.draining = c
            .servers
            .iter()
            .filter(|s| s.spec.ordinal as i32 >= to)
            .map(|s| s.spec.name())
            .collect();
        if change.draining.is_empty() {
            if c.scale_in.take().is_some() {
                tracing::info!(%cluster, to, "scale-in cancelled");
            }
        } else {
            let remaining = change
                .draining
                .iter()
                .map(|n| counts.get(n).copied().unwrap_or(0) as usize)
                .sum();
            match c.scale_in.as_mut() {
                // A raise part way: the rest goes on.
                Some(s) => {
                    s.remaining_tablets = remaining;
                    s.blocked = None;
                }
                None => {
                    c.scale_in = Some(ScaleIn {
                        from: from.unwrap_or(old),
                        stopped: vec![],
                        remaining_tablets: remaining,
                        blocked: None,
                        since: std::time::Instant::now(),
                    });
                }
            }
            tracing::info!(%cluster, to, draining = %change.draining.join(", "), "scale-in: the leaving servers drain, then stop");
        }
        Ok(change)
    }
}

/// What a count change did to a cluster's servers, by name.
#[derive(Debug, Default)]
pub(super) struct CountChange {
    /// Started now (new, or again on their data directories).
    pub(super) started: Vec<String>,
    /// Being stopped when the count was raised over them: they start again once they exited.
    pub(super) restarting: Vec<String>,
    /// Leaving: they drain, then stop.
    pub(super) draining: Vec<String>,
    /// Below the count already before, and running.
    pub(super) kept: Vec<String>,
}

/// Tablets per server name over every cluster of an instance (owners by store id, named
/// through the registrations; a tablet of an unregistered owner counts for nobody).
pub(super) async fn tablet_counts(
    meta: &basalt_meta::Meta,
) -> basalt_master::model::Result<BTreeMap<String, u32>> {
    let (servers, _) = meta.servers(None).await?;
    let names: BTreeMap<String, String> = servers
        .into_iter()
        .map(|r| (r.record.store_id, r.record.name))
        .collect();
    let mut counts = BTreeMap::new();
    for cluster in meta.clusters().await? {
        let (map, _) = meta.tablets(&cluster).await?;
        for table in map.tables() {
            for t in map.tablets(table) {
                if let Some(name) = names.get(&t.owner) {
                    *counts.entry(name.clone()).or_insert(0) += 1;
                }
            }
        }
    }
    Ok(counts)
}

/// What etcd says of the drain of `cluster` to `count` servers ([`lifecycle::view::observe`]
/// then [`scale_in::observe`]); `book` keeps the servers seen registered before.
pub(super) async fn observe_drain(
    meta: &basalt_meta::Meta,
    cluster: &str,
    count: u32,
    book: &mut ServerBook,
) -> basalt_master::model::Result<Observation> {
    let o = lifecycle::view::observe(meta, cluster, book).await?;
    Ok(scale_in::observe(
        cluster, count, &o.servers, &o.tablets, &o.moves,
    ))
}
