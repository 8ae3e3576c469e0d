//! Cluster → a StatefulSet of tablet servers, a headless Service and a PodDisruptionBudget.
//!
//! [`reconcile`] is the pipeline: deletion through the removal finalizer (one Cluster of several
//! waits for its writes to reach another, [`removal`]) and the volume finalizer, then
//! [`dereference`] (the StatefulSet, the Instance, what the tablet servers serve, the tablet
//! map, moves and recorded serveNodes in the metadata store) →
//! [`validate`] (pure: a [`ValidatedCluster`], or why not; its size decided by the lifecycle)
//! → build (pure: [`build::cluster_objects`]) → [`apply`] (server-side apply, the StatefulSet
//! last through the lifecycle's resize and the [`nodes::StatefulSetNodes`] runtime: serveNodes
//! recorded in the metadata store first) → [`status`] (pure condition builders, the
//! scale-in's in [`scale_in`]) → one status patch.
//!
//! Scale-in is two steps: the master moves the leaving servers' tablets to the others, then
//! the StatefulSet shrinks past them ([`scale_in`]).

pub mod apply;
pub mod dereference;
pub mod nodes;
pub mod removal;
pub mod scale_in;
pub mod status;
pub mod validate;

use std::sync::Arc;

use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;

use super::finalizer::{self, Lifecycle};
use super::{Context, Result, finish};
use crate::build;
use crate::crd::{Cluster, VolumeReclaimPolicy};

pub use status::{DATA_LOSS, data_loss_condition, nodes, settled_storage};
pub use validate::{ValidatedCluster, facts};

/// Present only on Clusters whose volumes are deleted with them (volumeReclaimPolicy Delete).
pub const VOLUME_FINALIZER: &str = "basalt.dev/delete-volumes";

pub async fn reconcile(cluster: Arc<Cluster>, ctx: Arc<Context>) -> Result<Action> {
    super::reconciling(
        &ctx,
        "cluster",
        &*cluster,
        reconcile_cluster(&cluster, &ctx),
    )
    .await
}

async fn reconcile_cluster(cluster: &Cluster, ctx: &Context) -> Result<Action> {
    let api: Api<Cluster> =
        Api::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default());

    // Deletion of one Cluster of several: its servers run until every write they logged is
    // in a Cluster that stays (the finalizer is there only while the Instance has two or
    // more), then stop, and the replica is released.
    let replicas = removal::replicas(ctx, cluster).await?;
    match finalizer::sync(
        &api,
        cluster,
        removal::REMOVAL_FINALIZER,
        removal::wanted(&replicas),
    )
    .await?
    {
        Lifecycle::Live | Lifecycle::Released => {}
        Lifecycle::Deleting => return removal::remove(ctx, &api, cluster).await,
        Lifecycle::Changed => return Ok(Action::await_change()),
    }

    // Deletion: owner references remove the StatefulSet and Services; volumes only go when
    // the user opted in (the finalizer is there only then).
    let delete_volumes = cluster.spec.volume_reclaim_policy == VolumeReclaimPolicy::Delete;
    match finalizer::sync(&api, cluster, VOLUME_FINALIZER, delete_volumes).await? {
        Lifecycle::Live => {}
        Lifecycle::Deleting => {
            apply::delete_volumes(ctx, cluster).await?;
            finalizer::release(&api, cluster, VOLUME_FINALIZER).await?;
            return Ok(Action::await_change());
        }
        Lifecycle::Changed | Lifecycle::Released => return Ok(Action::await_change()),
    }

    let found = dereference::dereference(ctx, cluster).await?;
    let validated = match validate::validate(cluster, &found) {
        Ok(validated) => validated,
        Err(refused) => {
            return finish(ctx, &api, cluster, status::refused(cluster, &refused)).await;
        }
    };
    // A scale-in keeps the servers that own tablets until the master has drained them
    // (lifecycle::scale::size): the replica count built is the one validation decided, and
    // apply records the count requested before it applies it.
    let objects = build::cluster_objects(
        cluster,
        validated.instance,
        &ctx.config,
        validated.size.servers,
    );
    let statefulset = apply::apply(ctx, &validated, &found, &objects).await?;
    let outcome = status::applied(
        &validated,
        &statefulset,
        found.serving,
        found.placement.as_ref(),
        &ctx.config,
        ctx.pdb_supported,
    );
    finish(ctx, &api, cluster, outcome).await
}
