//! Instance → the client-facing Service, the ConfigMap published to its tablet servers (the
//! instance's identity), its metadata store (an etcd StatefulSet, unless the spec names an
//! existing etcd), a finalizer that holds deletion while deletion protection is on, the
//! tablet servers' ServiceAccount and token-review binding when they review ServiceAccount
//! tokens (a finalizer deletes the binding, which is cluster-scoped), and a
//! status aggregated from its Clusters and its store's members. App profiles are not the
//! Instance's business: the AppProfile controller records them in the instance's catalog.
//!
//! [`reconcile`] is the pipeline: deletion through the protection finalizer, then
//! [`dereference`] (the instance's Clusters and etcd StatefulSet) → [`validate`] (pure: a
//! [`ValidatedInstance`] with the store's size, or why not) → build (pure: [`build::instance_objects`]) → [`apply`] (server-side apply, the etcd
//! StatefulSet last; the replication limits into the metadata store) → [`status`] (pure condition builders) → one status patch.
//!
//! The instance's master does not run here: [`crate::controller::masters`] runs one per
//! Instance in every operator replica.

pub mod apply;
pub mod dereference;
pub mod status;
pub mod validate;

use std::sync::Arc;

use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;

use super::finalizer::{self, Lifecycle};
use super::{Context, Result, finish};
use crate::build;
use crate::crd::Instance;

pub use status::{cluster_summaries, health};
pub use validate::ValidatedInstance;

/// Present while the Instance has deletion protection on.
pub const PROTECTION_FINALIZER: &str = "basalt.dev/deletion-protection";

pub async fn reconcile(instance: Arc<Instance>, ctx: Arc<Context>) -> Result<Action> {
    super::reconciling(
        &ctx,
        "instance",
        &*instance,
        reconcile_instance(&instance, &ctx),
    )
    .await
}

async fn reconcile_instance(instance: &Instance, ctx: &Context) -> Result<Action> {
    let api: Api<Instance> = Api::namespaced(
        ctx.client.clone(),
        &instance.namespace().unwrap_or_default(),
    );

    // Deletion waits while protection is on; the spec may turn it off after the deletion
    // began, which lets the deletion finish.
    let protected = instance.spec.deletion_protection;
    match finalizer::sync(&api, instance, PROTECTION_FINALIZER, protected).await? {
        Lifecycle::Live => {}
        Lifecycle::Deleting if protected => {
            return finish(ctx, &api, instance, status::deletion_blocked(instance)).await;
        }
        Lifecycle::Deleting => {
            finalizer::release(&api, instance, PROTECTION_FINALIZER).await?;
            return Ok(Action::await_change());
        }
        Lifecycle::Changed => return Ok(Action::await_change()),
        // Deleting, and not held by protection: on to the binding's finalizer.
        Lifecycle::Released => {}
    }

    // The token-review binding is cluster-scoped (the Instance cannot own it): its finalizer
    // is there while the binding may exist, and deletes it.
    let bound = apply::token_review_role(ctx, instance).is_some();
    let holds_binding = instance
        .finalizers()
        .iter()
        .any(|f| f == build::token_review::BINDING_FINALIZER);
    if !bound && holds_binding && instance.metadata.deletion_timestamp.is_none() {
        apply::delete_token_review_binding(ctx, instance).await?;
    }
    match finalizer::sync(
        &api,
        instance,
        build::token_review::BINDING_FINALIZER,
        bound,
    )
    .await?
    {
        Lifecycle::Live => {}
        Lifecycle::Deleting => {
            apply::delete_token_review_binding(ctx, instance).await?;
            finalizer::release(&api, instance, build::token_review::BINDING_FINALIZER).await?;
            return Ok(Action::await_change());
        }
        Lifecycle::Changed | Lifecycle::Released => return Ok(Action::await_change()),
    }

    let found = dereference::dereference(ctx, instance).await?;
    let validated = match validate::validate(instance, &found) {
        Ok(validated) => validated,
        Err(refused) => {
            let outcome = status::refused(instance, &found.clusters, &refused);
            return finish(ctx, &api, instance, outcome).await;
        }
    };
    let objects = build::instance_objects(instance, &ctx.config, validated.etcd_members);
    apply::apply_secrets(ctx, instance).await?;
    apply::apply_token_review(ctx, instance).await?;
    let applied = apply::apply(ctx, &validated, &objects).await?;
    apply::record_replication_limits(ctx, instance).await;
    finish(ctx, &api, instance, status::applied(&validated, &applied)).await
}
