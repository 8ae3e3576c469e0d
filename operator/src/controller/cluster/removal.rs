//! Deleting one Cluster of a replicated Instance: its servers run until every write they
//! logged is in a Cluster that stays ([`lifecycle::removal`], the decision both runtimes take),
//! then stop, and the cluster is released as a replica. The finalizer [`REMOVAL_FINALIZER`]
//! holds the deletion meanwhile; it is on a Cluster only while its Instance has two or more
//! Clusters (with one, deleting it is Kubernetes' business alone, as before).
//!
//! Each pass is the reconcile's pipeline: [`dereference`] (the Instance, the Clusters that
//! stay, the StatefulSet, the pods, what etcd says of the cluster) → [`plan`] (pure: a
//! [`Step`]) → [`remove`] (the step, its condition and events). In order:
//!
//! 1. **Route away.** The cluster's pods lose the label `basalt.dev/instance`: the Instance's
//!    Service selects by it, so new client connections go to the other clusters; and etcd marks
//!    the cluster as being removed ([`removal::route_away`]), so its servers send the requests
//!    of connections still open to the clusters that stay. The condition `Removing` turns
//!    true (reason `UnshippedWrites`) and the event `Removing` says so. Its
//!    `lastTransitionTime` marks when writes were routed away: a running server's report counts
//!    only if newer.
//! 2. **Wait.** While the decision refuses, the condition's message names each server, the
//!    entries it still holds and for which clusters; looked at again every [`POLL`]. While an
//!    AppProfile routes only to the cluster (single-cluster routing to it), the reason is
//!    `TargetedByAppProfile` and the message names the profiles: Bigtable does not delete a
//!    cluster an app profile needs.
//! 3. **Stop.** Once it may go, the StatefulSet goes to 0 replicas (reason `StoppingServers`).
//!    Each server, as it stops, gives its shippers a moment to ship the rest of its log
//!    (`shipper::ship_the_rest`): its last report then covers every write it acknowledged.
//! 4. **Release.** Once no server of the cluster is registered and their last reports say
//!    a staying cluster holds every write (else the StatefulSet is scaled back up and the
//!    removal waits again: writes that came in after the decision), its number and `shipped/`
//!    records are deleted from etcd (the other clusters stop shipping to it and drop their
//!    cursors), the event `Removed` is published and the finalizer removed.
//!
//! The whole Instance going (deleted, being deleted) or no Cluster staying: nothing is left to
//! ship to, and the finalizer goes at once — deleting an Instance with its Clusters is never
//! held.

use std::time::Duration;

use basalt_meta::{Keys, Meta};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;

use super::dereference::Store;
use crate::build::{self, LABEL_BASALT_INSTANCE};
use crate::conditions::{self, Cond, REMOVING};
use crate::controller::finalizer;
use crate::controller::{Context, Note, Result, apply as server_side_apply, apply_status};
use crate::crd::{Cluster, ClusterStatus, Instance};
use crate::lifecycle::removal::{self, Facts};

/// Present only on Clusters of an Instance with two or more Clusters: their deletion waits
/// until their writes are in another Cluster.
pub const REMOVAL_FINALIZER: &str = "basalt.dev/ship-before-removal";

/// How often a removal looks again while it waits.
pub const POLL: Duration = Duration::from_secs(2);

/// How long a pass waits for the metadata store.
const STORE_DEADLINE: Duration = Duration::from_secs(4);

/// Whether a Cluster carries [`REMOVAL_FINALIZER`]: `replicas` are the Clusters of its
/// Instance that are not being deleted (itself included when it is not). Pure.
pub fn wanted(replicas: &[String]) -> bool {
    replicas.len() >= 2
}

/// The Clusters of `cluster`'s Instance that are not being deleted (by name, sorted).
pub async fn replicas(ctx: &Context, cluster: &Cluster) -> Result<Vec<String>> {
    let mut names: Vec<String> =
        Api::<Cluster>::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default())
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|c| {
                c.spec.instance_ref == cluster.spec.instance_ref
                    && c.metadata.deletion_timestamp.is_none()
            })
            .map(|c| c.name_any())
            .collect();
    names.sort();
    Ok(names)
}

/// What a removal pass reads.
#[derive(Debug, Clone, Default)]
pub struct Found {
    /// The Instance, unless it is gone or being deleted.
    pub instance: Option<Instance>,
    /// The Clusters of the Instance that stay (not being deleted; this one is).
    pub staying: Vec<String>,
    /// The StatefulSet's replicas (None: no StatefulSet).
    pub replicas: Option<i32>,
    /// The cluster's pods that still carry the Instance's label (the Service routes to them).
    pub routed_pods: Vec<String>,
    /// What etcd says of the cluster (None: the metadata store did not answer).
    pub facts: Option<Facts>,
    /// The connection `facts` were read through.
    pub store: Option<Store>,
}

/// What a pass does.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Nothing to ship to (the Instance goes, or no Cluster stays): release at once.
    ReleaseNow { why: String },
    /// The metadata store could not be read: wait.
    StoreUnreachable,
    /// The lifecycle's step, as the local runtime takes it too ([`removal::step`]); after
    /// [`removal::Step::Release`], the finalizer goes.
    Removal(removal::Step),
}

/// When writes were routed away from the cluster: the `Removing` condition's
/// `lastTransitionTime` (set after the pods lost the label), rounded up to the next second
/// (the API keeps seconds), in microseconds. None before the first pass.
pub fn routed_away_since(conditions: &[Condition]) -> Option<i64> {
    let c = conditions::find(conditions, REMOVING).filter(|c| c.status == "True")?;
    Some(c.last_transition_time.0.as_microsecond() + 1_000_000)
}

/// The step of this pass. Pure.
pub fn plan(found: &Found, since_micros: Option<i64>) -> Step {
    let Some(_) = &found.instance else {
        return Step::ReleaseNow {
            why: "its Instance is deleted".into(),
        };
    };
    if found.staying.is_empty() {
        return Step::ReleaseNow {
            why: "no other Cluster of the Instance stays".into(),
        };
    }
    let Some(facts) = &found.facts else {
        return Step::StoreUnreachable;
    };
    let running = found.replicas.is_some_and(|n| n > 0);
    Step::Removal(removal::step(facts, &found.staying, running, since_micros))
}

/// Reads what a removal pass needs.
pub async fn dereference(ctx: &Context, cluster: &Cluster) -> Result<Found> {
    let ns = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    let instance = Api::<Instance>::namespaced(ctx.client.clone(), &ns)
        .get_opt(&cluster.spec.instance_ref)
        .await?
        .filter(|i| i.metadata.deletion_timestamp.is_none());
    let staying: Vec<String> = replicas(ctx, cluster)
        .await?
        .into_iter()
        .filter(|c| *c != name)
        .collect();
    let replicas = Api::<StatefulSet>::namespaced(ctx.client.clone(), &ns)
        .get_opt(&build::statefulset_name(&name))
        .await?
        .map(|s| s.spec.and_then(|s| s.replicas).unwrap_or(1));
    let selector = build::selector_string(&build::cluster_selector(&name));
    let routed_pods = Api::<Pod>::namespaced(ctx.client.clone(), &ns)
        .list(&ListParams::default().labels(&selector))
        .await?
        .items
        .iter()
        .filter(|p| p.labels().contains_key(LABEL_BASALT_INSTANCE))
        .map(|p| p.name_any())
        .collect();
    let (mut facts, mut store) = (None, None);
    if let Some(instance) = &instance {
        let endpoints =
            crate::controller::instance::dereference::store_endpoints(ctx, instance).await?;
        if !endpoints.is_empty() {
            let keys = Keys::new(&ns, &instance.name_any());
            let transport = ctx.transport(instance)?;
            let read = async {
                let endpoints = basalt_meta::endpoints(&endpoints, &transport.etcd)?;
                let meta = Meta::connect(&endpoints, keys).await?;
                let facts = removal::observe(&meta, &name).await?;
                Ok::<_, basalt_master::model::Error>((facts, meta))
            };
            match tokio::time::timeout(STORE_DEADLINE, read).await {
                Ok(Ok((f, m))) => (facts, store) = (Some(f), Some(Store(m))),
                Ok(Err(error)) => tracing::info!(%error, "the metadata store did not answer"),
                Err(_) => tracing::info!("the metadata store did not answer in time"),
            }
        }
    }
    Ok(Found {
        instance,
        staying,
        replicas,
        routed_pods,
        facts,
        store,
    })
}

/// One pass of a removal held by [`REMOVAL_FINALIZER`].
pub async fn remove(ctx: &Context, api: &Api<Cluster>, cluster: &Cluster) -> Result<Action> {
    let found = dereference(ctx, cluster).await?;
    let old = cluster.status.clone().unwrap_or_default();
    let started = conditions::find(&old.conditions, REMOVING).is_some_and(|c| c.status == "True");
    let step = plan(&found, routed_away_since(&old.conditions));
    let name = cluster.name_any();
    // Route new client connections away first, whatever the step: a restarted pod gets the
    // label back from its template.
    if !matches!(step, Step::ReleaseNow { .. }) {
        route_away(ctx, cluster, &found.routed_pods).await?;
        // And requests over connections still open: its servers send them to the Clusters
        // that stay once etcd marks the cluster as being removed.
        if let Some(Store(store)) = &found.store {
            let since = routed_away_since(&old.conditions)
                .unwrap_or_else(basalt_master::model::hlc::now_micros);
            match tokio::time::timeout(STORE_DEADLINE, removal::route_away(store, &name, since))
                .await
            {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::info!(error = %e, "cannot mark the cluster as being removed; trying again");
                    return Ok(Action::requeue(POLL));
                }
                Err(_) => return Ok(Action::requeue(POLL)),
            }
        }
    }
    if !started && !matches!(step, Step::ReleaseNow { .. }) {
        let note = Note::normal(
            "Removing",
            "Remove",
            format!(
                "client writes routed away; its servers stop once every write they logged is in \
                 {}",
                found.staying.join(" or ")
            ),
        );
        ctx.publish(cluster, &note).await;
    }
    let cond = match &step {
        Step::ReleaseNow { why } => {
            tracing::info!(%why, "nothing to ship to: the Cluster goes at once");
            let note = Note::normal("Removed", "Remove", format!("removed at once: {why}"));
            ctx.publish(cluster, &note).await;
            finalizer::release(api, cluster, REMOVAL_FINALIZER).await?;
            return Ok(Action::await_change());
        }
        Step::StoreUnreachable => Cond::new(
            REMOVING,
            true,
            "MetadataStoreUnreachable",
            "the instance's metadata store did not answer: the removal waits for it",
        ),
        Step::Removal(removal::Step::Wait(refused)) => {
            // The first pass has no report newer than the routing: say what it waits for.
            let message = if started || !refused.profiles.is_empty() {
                refused.to_string()
            } else {
                "client writes routed away; waiting for the servers' next reports".to_string()
            };
            Cond::new(REMOVING, true, refused.reason(), message)
        }
        Step::Removal(removal::Step::Stop) => {
            stop_servers(ctx, cluster, found.instance.as_ref()).await?;
            tracing::info!(
                "every write of the cluster is in another cluster: stopping its servers"
            );
            Cond::new(
                REMOVING,
                true,
                "StoppingServers",
                "every write of the cluster is in another cluster: its servers stop",
            )
        }
        Step::Removal(removal::Step::Restart(refused)) => {
            start_servers(ctx, cluster, found.instance.as_ref()).await?;
            tracing::info!(%refused, "the servers stopped with writes not yet shipped: starting them again");
            Cond::new(REMOVING, true, refused.reason(), refused.to_string())
        }
        Step::Removal(removal::Step::Stopping { registered }) => Cond::new(
            REMOVING,
            true,
            "StoppingServers",
            format!(
                "every write of the cluster is in another cluster: {registered} server(s) still registered"
            ),
        ),
        Step::Removal(removal::Step::Release) => {
            if let Some(Store(store)) = &found.store {
                match tokio::time::timeout(STORE_DEADLINE, store.remove_replica(&name)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        tracing::info!(error = %e, "the replica could not be released; trying again");
                        return Ok(Action::requeue(POLL));
                    }
                    Err(_) => return Ok(Action::requeue(POLL)),
                }
            }
            tracing::info!("the cluster left the instance: no more replication to it");
            let note = Note::normal(
                "Removed",
                "Remove",
                format!(
                    "every write of the cluster is in {}; its servers stopped and it is no longer a replica",
                    found.staying.join(" and ")
                ),
            );
            ctx.publish(cluster, &note).await;
            finalizer::release(api, cluster, REMOVAL_FINALIZER).await?;
            return Ok(Action::await_change());
        }
    };
    let status = ClusterStatus {
        conditions: conditions::merge(&old.conditions, &[cond], cluster.metadata.generation),
        ..old.clone()
    };
    if status != old {
        apply_status(api, cluster, &status).await?;
    }
    Ok(Action::requeue(POLL))
}

/// Takes the Instance's label off `pods`: its Service no longer routes to them.
async fn route_away(ctx: &Context, cluster: &Cluster, pods: &[String]) -> Result<()> {
    let api: Api<Pod> =
        Api::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default());
    let patch = serde_json::json!({"metadata": {"labels": {LABEL_BASALT_INSTANCE: null}}});
    for pod in pods {
        api.patch(pod, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        tracing::info!(%pod, "client writes routed away (label {LABEL_BASALT_INSTANCE} removed)");
    }
    Ok(())
}

/// Applies the cluster's StatefulSet with no replica.
async fn stop_servers(ctx: &Context, cluster: &Cluster, instance: Option<&Instance>) -> Result<()> {
    set_replicas(ctx, cluster, instance, 0).await
}

/// Applies the cluster's StatefulSet with the servers its spec asks for.
async fn start_servers(
    ctx: &Context,
    cluster: &Cluster,
    instance: Option<&Instance>,
) -> Result<()> {
    set_replicas(
        ctx,
        cluster,
        instance,
        build::desired_serve_nodes(cluster, None, None).max(1),
    )
    .await
}

async fn set_replicas(
    ctx: &Context,
    cluster: &Cluster,
    instance: Option<&Instance>,
    replicas: i32,
) -> Result<()> {
    let Some(instance) = instance else {
        return Ok(());
    };
    let sts = build::cluster_objects(cluster, instance, &ctx.config, replicas).statefulset;
    let api: Api<StatefulSet> =
        Api::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default());
    server_side_apply(&api, &sts).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use basalt_meta::ShippedRecord;

    use super::*;
    use crate::lifecycle::removal::Server;

    fn found(replicas: Option<i32>, registered: bool, acked: u64) -> Found {
        Found {
            instance: Some(
                serde_norway::from_str(
                    "metadata: {name: orders, namespace: shop}\nspec: {displayName: Orders}\n",
                )
                .unwrap(),
            ),
            staying: vec!["orders-a".into()],
            replicas,
            routed_pods: vec![],
            facts: Some(Facts {
                cluster: "orders-b".into(),
                servers: vec![Server {
                    store_id: "s0".into(),
                    name: "orders-b-0".into(),
                    registered,
                    owns_tablets: true,
                }],
                shipped: vec![ShippedRecord {
                    store_id: "s0".into(),
                    cluster: "orders-b".into(),
                    peer: "orders-a".into(),
                    acked_seq: acked,
                    logged_seq: 10,
                    lag_micros: 0,
                    reported_micros: 2_000_000,
                    acked_hlc: 0,
                }],
                profiles: vec![],
            }),
            store: None,
        }
    }

    #[test]
    fn the_finalizer_is_wanted_with_two_clusters_or_more() {
        assert!(!wanted(&["a".into()]));
        assert!(wanted(&["a".into(), "b".into()]));
    }

    #[test]
    fn a_removal_waits_for_the_writes_then_stops_the_servers_then_releases() {
        use removal::Step as R;
        // Writes waiting: refused with the reason.
        let step = plan(&found(Some(2), true, 4), Some(1_000_000));
        let Step::Removal(R::Wait(refused)) = step else {
            panic!("{step:?}")
        };
        assert!(refused.to_string().contains("orders-b-0"), "{refused}");
        // Caught up, reported after the routing: stop.
        assert_eq!(
            plan(&found(Some(2), true, 10), Some(1_000_000)),
            Step::Removal(R::Stop)
        );
        // A report older than the routing is not enough.
        assert!(matches!(
            plan(&found(Some(2), true, 10), Some(3_000_000)),
            Step::Removal(R::Wait(_))
        ));
        // Stopping: wait for the registrations to go, then release (not decided again: the
        // runtime stopped the servers).
        assert_eq!(
            plan(&found(Some(0), true, 10), None),
            Step::Removal(R::Stopping { registered: 1 })
        );
        assert_eq!(
            plan(&found(Some(0), false, 10), None),
            Step::Removal(R::Release)
        );
        // Stopped with writes that came in after the decision and were not shipped: the
        // servers start again.
        assert!(matches!(
            plan(&found(Some(0), false, 4), None),
            Step::Removal(R::Restart(_))
        ));
        // The store unread: wait.
        let mut f = found(Some(2), true, 10);
        f.facts = None;
        assert_eq!(plan(&f, Some(1_000_000)), Step::StoreUnreachable);
    }

    #[test]
    fn an_instance_going_or_no_cluster_staying_is_never_held() {
        let mut f = found(Some(2), true, 4);
        f.instance = None;
        assert!(matches!(plan(&f, None), Step::ReleaseNow { .. }));
        let mut f = found(Some(2), true, 4);
        f.staying.clear();
        assert!(matches!(plan(&f, None), Step::ReleaseNow { .. }));
    }
}
