//! Cluster, stage 4: server-side apply of the built objects, the StatefulSet last through the
//! lifecycle's [`lifecycle::scale::resize`] (the requested server count recorded in the
//! metadata store first: what the master drains towards); and,
//! on deletion with `volumeReclaimPolicy: Delete`, the volume claims deleted.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams};

use super::dereference::Dereferenced;
use super::nodes::StatefulSetNodes;
use super::validate::ValidatedCluster;
use crate::build::{self, ClusterObjects};
use crate::controller::{Context, Error, Note, Result, apply as server_side_apply};
use crate::crd::Cluster;
use crate::lifecycle;
use crate::lifecycle::scale::ResizeError;

/// Applies the cluster's objects and reports a creation or a scaling in an event. The
/// StatefulSet goes last: its pods start once everything they rely on exists. Returns the
/// StatefulSet as the API server has it after the apply (its status is the rollout's).
pub async fn apply(
    ctx: &Context,
    validated: &ValidatedCluster<'_>,
    found: &Dereferenced,
    objects: &ClusterObjects,
) -> Result<StatefulSet> {
    let cluster = validated.cluster;
    let name = cluster.name_any();
    let ns = cluster.namespace().unwrap_or_default();
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
    server_side_apply(&services, &objects.headless_service).await?;
    if ctx.pdb_supported {
        let pdbs: Api<PodDisruptionBudget> = Api::namespaced(ctx.client.clone(), &ns);
        server_side_apply(&pdbs, &objects.pod_disruption_budget).await?;
    }
    // The count recorded for the master, then the StatefulSet with the servers to run: the
    // lifecycle's step, as the local runtime takes it.
    let nodes = StatefulSetNodes::new(ctx, &name, &ns, objects.statefulset.clone());
    match lifecycle::scale::resize(
        &nodes,
        found.store.as_ref().map(|s| &s.0),
        &name,
        &found.replicas,
        lifecycle::autoscaling::settings(&cluster.spec).as_ref(),
        &validated.size,
        validated.current_nodes,
        found.placement.as_ref().map(|p| p.serve_nodes),
    )
    .await
    {
        Ok(()) => {}
        Err(ResizeError::Record(why)) => {
            tracing::warn!(%why, "the StatefulSet keeps its replicas; trying again at the next reconcile")
        }
        Err(ResizeError::Runtime(error)) => return Err(error),
    }
    let sts = nodes
        .applied()
        .ok_or_else(|| Error::Misdirected("the StatefulSet was not applied".into()))?;
    let replicas = sts.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0);
    if let Some(note) = scale_event(validated.current_nodes, replicas, &sts.name_any()) {
        ctx.publish(cluster, &note).await;
    }
    Ok(sts)
}

/// Pure: the event for a StatefulSet applied with `desired` replicas where it had `current`
/// (None: it did not exist).
pub fn scale_event(current: Option<i32>, desired: i32, statefulset: &str) -> Option<Note> {
    match current {
        None => Some(Note::normal(
            "Created",
            "Create",
            format!("created StatefulSet {statefulset} with {desired} tablet server(s)"),
        )),
        Some(before) if before != desired => Some(Note::normal(
            "Scaled",
            "Scale",
            format!("scaled from {before} to {desired} tablet server(s)"),
        )),
        Some(_) => None,
    }
}

/// Deletes every volume claim of the cluster's tablet servers (the Cluster is being deleted
/// and its `volumeReclaimPolicy` is Delete), and says so in an event.
pub async fn delete_volumes(ctx: &Context, cluster: &Cluster) -> Result<()> {
    let pvcs: Api<PersistentVolumeClaim> =
        Api::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default());
    let selector = build::selector_string(&build::cluster_selector(&cluster.name_any()));
    let list = pvcs.list(&ListParams::default().labels(&selector)).await?;
    for pvc in &list.items {
        pvcs.delete(&pvc.name_any(), &DeleteParams::default())
            .await?;
    }
    let note = Note::normal(
        "VolumesDeleted",
        "Delete",
        format!(
            "deleted {} volume claim(s) (volumeReclaimPolicy: Delete)",
            list.items.len()
        ),
    );
    ctx.publish(cluster, &note).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creation_and_scaling_are_reported_and_nothing_else() {
        let created = scale_event(None, 3, "orders-c1").unwrap();
        assert_eq!(
            (created.reason, created.note.as_str()),
            (
                "Created",
                "created StatefulSet orders-c1 with 3 tablet server(s)"
            )
        );
        let scaled = scale_event(Some(3), 5, "orders-c1").unwrap();
        assert_eq!(
            (scaled.reason, scaled.note.as_str()),
            ("Scaled", "scaled from 3 to 5 tablet server(s)")
        );
        assert_eq!(scale_event(Some(5), 5, "orders-c1"), None);
    }
}
