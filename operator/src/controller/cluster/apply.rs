//! Cluster, stage 4: the requested server count recorded in the metadata store (what the
//! master drains towards), server-side apply of the built objects, the StatefulSet last; and,
//! on deletion with `volumeReclaimPolicy: Delete`, the volume claims deleted.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams};

use super::dereference::{Dereferenced, Placement};
use super::validate::ValidatedCluster;
use crate::build::{self, ClusterObjects};
use crate::controller::{Context, Note, Result, apply as server_side_apply};
use crate::crd::Cluster;

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
/// read it: the master drains the servers at and above it, and a raised count cancels a
/// drain. A failed write is logged; the StatefulSet does not shrink until the store holds the
/// count ([`super::validate::shrink_floor`]), and the next reconcile writes again.
pub async fn record_serve_nodes(validated: &ValidatedCluster<'_>, found: &Dereferenced) {
    let (Some(store), Some(count)) = (
        &found.store,
        serve_nodes_to_record(
            found.placement.as_ref(),
            validated.requested_nodes,
            validated.current_nodes,
        ),
    ) else {
        return;
    };
    let cluster = validated.cluster.name_any();
    match store.0.set_serve_nodes(&cluster, count).await {
        Ok(()) => tracing::info!(
            cluster,
            serve_nodes = count,
            "recorded serveNodes in the metadata store"
        ),
        Err(error) => tracing::warn!(
            cluster,
            %error,
            "could not record serveNodes in the metadata store; trying again at the next reconcile"
        ),
    }
}

/// The count to write, if any: `requested` when the store was read and holds another — except
/// a count below one whose scale-in is still under way (`running`, the StatefulSet's replicas,
/// is above the recorded count): it waits until that drain is done and its servers are gone,
/// so one drain runs at a time. A higher count is written at once: it cancels the drain. Pure.
pub fn serve_nodes_to_record(
    placement: Option<&Placement>,
    requested: i32,
    running: Option<i32>,
) -> Option<u32> {
    let requested = u32::try_from(requested).ok()?;
    let placement = placement?;
    match placement.serve_nodes {
        Some(recorded) if recorded == requested => None,
        Some(recorded) if requested < recorded && running.is_some_and(|r| r > recorded as i32) => {
            None
        }
        _ => Some(requested),
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

    #[test]
    fn serve_nodes_are_written_only_when_the_store_holds_another_count() {
        let held = |n: Option<u32>| Placement {
            serve_nodes: n,
            ..Placement::default()
        };
        assert_eq!(
            serve_nodes_to_record(Some(&held(None)), 3, Some(3)),
            Some(3)
        );
        assert_eq!(
            serve_nodes_to_record(Some(&held(Some(4))), 3, Some(4)),
            Some(3)
        );
        assert_eq!(
            serve_nodes_to_record(Some(&held(Some(3))), 3, Some(3)),
            None
        );
        // The store could not be read: nothing to compare with, nothing written.
        assert_eq!(serve_nodes_to_record(None, 3, Some(3)), None);
        // A scale-in 5 → 3 is under way (5 servers still run): 2 waits for it to finish...
        assert_eq!(
            serve_nodes_to_record(Some(&held(Some(3))), 2, Some(5)),
            None
        );
        // ...and is written once the servers above 3 are gone.
        assert_eq!(
            serve_nodes_to_record(Some(&held(Some(3))), 2, Some(3)),
            Some(2)
        );
        // Raising the count cancels the drain at once.
        assert_eq!(
            serve_nodes_to_record(Some(&held(Some(3))), 4, Some(5)),
            Some(4)
        );
    }
}
