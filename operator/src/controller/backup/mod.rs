//! Backup and BackupSchedule → backups made through the instance's backup API
//! ([`crate::lifecycle::backups`], shared with the local runtime).
//!
//! A Backup's pipeline: the delete finalizer kept in step with `deletionPolicy` → [`found`]
//! (the Instance, its clusters, a ready tablet server) → the pure names
//! ([`backups::backup_target`]) → on deletion the backup deleted; otherwise one step
//! ([`backups::sync_backup`]: made once, its expire time kept at the retention) →
//! [`status`] (pure) → one status patch. While it is being made it is looked at every few
//! seconds; once ready, again before it expires.
//!
//! A BackupSchedule's: [`found`] → [`backups::schedule_target`] → one pass
//! ([`backups::run_schedule`]: the due backups asked for, the oldest beyond `keep` deleted) →
//! [`status`] → one status patch, and the next look at its next run. It has no finalizer:
//! deleting it leaves its backups until they expire.

pub mod status;

use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::controller::Action;

use super::finalizer::{self, Lifecycle};
use super::table::dereference::instance_endpoint;
use super::{Context, Note, Result, finish};
use crate::crd::{Backup, BackupSchedule, Cluster, DeletionPolicy, Instance};
use crate::lifecycle::backups::{self, Previous};

/// Present only on Backups whose deletion deletes the backup (deletionPolicy Delete).
pub const DELETE_FINALIZER: &str = "basalt.dev/delete-backup";

/// What the reads found for a Backup or a BackupSchedule.
#[derive(Debug, Clone, Default)]
pub struct Found {
    pub instance: Option<Instance>,
    /// The ids of the instance's clusters.
    pub clusters: Vec<String>,
    /// `host:port` of a ready tablet server of the instance.
    pub endpoint: Option<String>,
}

/// Every Kubernetes read a backup reconcile needs.
pub async fn found(ctx: &Context, namespace: &str, instance_ref: &str) -> Result<Found> {
    let instance = Api::<Instance>::namespaced(ctx.client.clone(), namespace)
        .get_opt(instance_ref)
        .await?;
    if instance.is_none() {
        return Ok(Found::default());
    }
    let mut clusters: Vec<String> = Api::<Cluster>::namespaced(ctx.client.clone(), namespace)
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|c| c.spec.instance_ref == instance_ref && c.metadata.deletion_timestamp.is_none())
        .map(|c| c.name_any())
        .collect();
    clusters.sort();
    let endpoint = instance_endpoint(ctx, namespace, instance_ref).await?;
    Ok(Found {
        instance,
        clusters,
        endpoint,
    })
}

pub async fn reconcile_backup(backup: Arc<Backup>, ctx: Arc<Context>) -> Result<Action> {
    super::reconciling(&ctx, "backup", &*backup, reconcile_one(&backup, &ctx)).await
}

async fn reconcile_one(backup: &Backup, ctx: &Context) -> Result<Action> {
    let ns = backup.namespace().unwrap_or_default();
    let api: Api<Backup> = Api::namespaced(ctx.client.clone(), &ns);
    let delete = backup.spec.deletion_policy == DeletionPolicy::Delete;
    let lifecycle = finalizer::sync(&api, backup, DELETE_FINALIZER, delete).await?;
    match lifecycle {
        Lifecycle::Live => {}
        Lifecycle::Changed | Lifecycle::Released => return Ok(Action::await_change()),
        Lifecycle::Deleting => {}
    }
    let found = found(ctx, &ns, &backup.spec.instance_ref).await?;
    let Some(instance) = &found.instance else {
        if lifecycle == Lifecycle::Deleting {
            // No instance, no backup API to delete it through.
            finalizer::release(&api, backup, DELETE_FINALIZER).await?;
            return Ok(Action::await_change());
        }
        return finish(ctx, &api, backup, status::instance_not_found(backup)).await;
    };
    let target = match backups::backup_target(backup, instance, &found.clusters) {
        Ok(target) => target,
        Err(why) if lifecycle == Lifecycle::Deleting => {
            tracing::warn!("the backup cannot be named ({why}); its deletion leaves it");
            finalizer::release(&api, backup, DELETE_FINALIZER).await?;
            return Ok(Action::await_change());
        }
        Err(why) => return finish(ctx, &api, backup, status::invalid(backup, why)).await,
    };
    let Some(endpoint) = &found.endpoint else {
        return finish(ctx, &api, backup, status::unavailable(backup)).await;
    };
    let transport = ctx.transport(instance)?;
    if lifecycle == Lifecycle::Deleting {
        transport
            .backups
            .delete_backup(endpoint, &target.name)
            .await?;
        let note = Note::normal(
            "BackupDeleted",
            "Delete",
            format!("deleted backup {} (deletionPolicy: Delete)", target.name),
        );
        ctx.publish(backup, &note).await;
        finalizer::release(&api, backup, DELETE_FINALIZER).await?;
        return Ok(Action::await_change());
    }
    let old = backup.status.clone().unwrap_or_default();
    let previous = Previous {
        phase: old.phase,
        expire_time: old.expire_time.as_ref().map(|t| t.0),
    };
    let outcome = match backups::sync_backup(
        &*transport.backups,
        endpoint,
        &target,
        previous,
        Timestamp::now(),
    )
    .await
    {
        Ok(synced) => status::synced(backup, &target, &synced),
        Err(failed) => status::failed(backup, &target, &failed),
    };
    finish(ctx, &api, backup, outcome).await
}

pub async fn reconcile_schedule(
    schedule: Arc<BackupSchedule>,
    ctx: Arc<Context>,
) -> Result<Action> {
    super::reconciling(
        &ctx,
        "backupschedule",
        &*schedule,
        reconcile_schedule_once(&schedule, &ctx),
    )
    .await
}

async fn reconcile_schedule_once(schedule: &BackupSchedule, ctx: &Context) -> Result<Action> {
    let ns = schedule.namespace().unwrap_or_default();
    let api: Api<BackupSchedule> = Api::namespaced(ctx.client.clone(), &ns);
    if schedule.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let found = found(ctx, &ns, &schedule.spec.instance_ref).await?;
    let Some(instance) = &found.instance else {
        return finish(
            ctx,
            &api,
            schedule,
            status::schedule_instance_not_found(schedule),
        )
        .await;
    };
    let target = match backups::schedule_target(schedule, instance, &found.clusters) {
        Ok(target) => target,
        Err(why) => {
            return finish(ctx, &api, schedule, status::schedule_invalid(schedule, why)).await;
        }
    };
    let Some(endpoint) = &found.endpoint else {
        return finish(ctx, &api, schedule, status::schedule_unavailable(schedule)).await;
    };
    let transport = ctx.transport(instance)?;
    let since = schedule
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0)
        .unwrap_or_else(Timestamp::now);
    let now = Timestamp::now();
    let outcome =
        match backups::run_schedule(&*transport.backups, endpoint, &target, since, now).await {
            Ok(run) => status::scheduled(schedule, &run, now),
            Err(failed) => status::schedule_failed(schedule, &failed),
        };
    finish(ctx, &api, schedule, outcome).await
}
