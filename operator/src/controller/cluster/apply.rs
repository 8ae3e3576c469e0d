//! Cluster, stage 4: the requested server count recorded in the metadata store (what the
//! master drains towards), server-side apply of the built objects, the StatefulSet last; and,
//! on deletion with `volumeReclaimPolicy: Delete`, the volume claims deleted.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams};

use super::dereference::Dereferenced;
use super::validate::ValidatedCluster;
use crate::build::{self, ClusterObjects};
use crate::controller::{Context, Note, Result, apply as server_side_apply};
use crate::crd::Cluster;
use crate::lifecycle::records;

/// Applies the cluster's objects and reports a creation or a scaling in an event. The
/// StatefulSet goes last: its pods start once everything they rely on exists. Returns the
/// StatefulSet as the API server has it after the apply (its status is the rollout's).
pub async fn apply(
    ctx: &Context,
    validated: &ValidatedCluster<'_>,
    objects: &ClusterObjects,
) -> Result<StatefulSet> {
    let cluster = validated.cluster;
    let ns = cluster.namespace().unwrap_or_default();
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
    server_side_apply(&services, &objects.headless_service).await?;
    if ctx.pdb_supported {
        let pdbs: Api<PodDisruptionBudget> = Api::namespaced(ctx.client.clone(), &ns);
        server_side_apply(&pdbs, &objects.pod_disruption_budget).await?;
    }
    let statefulsets: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), &ns);
    let sts = server_side_apply(&statefulsets, &objects.statefulset).await?;
    if let Some(note) = scale_event(
        validated.current_nodes,
        validated.desired_nodes,
        &sts.name_any(),
    ) {
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

/// Records the requested server count in the instance's metadata store
/// (`clusters/<c>/serve-nodes`) when it differs from what the store held as this reconcile
/// read it ([`records::serve_nodes_to_record`]): the master drains the servers at and above
/// it, and a raised count cancels a drain. A failed write is logged; the StatefulSet does not
/// shrink until the store holds the count ([`super::validate::shrink_floor`]), and the next
/// reconcile writes again.
pub async fn record_serve_nodes(validated: &ValidatedCluster<'_>, found: &Dereferenced) {
    let (Some(store), Some(count)) = (
        &found.store,
        records::serve_nodes_to_record(
            found.placement.as_ref().map(|p| p.serve_nodes),
            validated.requested_nodes,
            validated.current_nodes,
        ),
    ) else {
        return;
    };
    if let Err(error) =
        records::record_serve_nodes(&store.0, &validated.cluster.name_any(), count).await
    {
        tracing::warn!(%error, "trying again at the next reconcile");
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
