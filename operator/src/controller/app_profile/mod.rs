//! AppProfile → validated against its instance's clusters, and recorded in the instance's
//! catalog in etcd (`app-profiles/<id>`, the one truth every server and cluster reads): the
//! only place a profile is published.
//!
//! [`reconcile`] is the pipeline: the [`RECORD_FINALIZER`] kept on the profile, then
//! [`dereference`] (the Instance, its clusters, its metadata store's endpoints) → [`validate`]
//! (pure: a [`ValidatedAppProfile`], or why not) → [`catalog`] (pure: the record) → [`apply`]
//! (the record put into etcd; an invalid profile's removed) → [`status`] (pure condition
//! builders, `Recorded` among them) → one status patch.
//!
//! Deletion removes the record: the finalizer holds it until the record is gone. It is
//! released without etcd when the Instance is gone, and when the Instance is itself being
//! deleted and its store does not answer (the catalog goes with it). While the Instance
//! lives but its etcd does not answer, the deletion waits and `Recorded` says why; remove
//! the finalizer by hand to give up on the record.

pub mod catalog;
pub mod dereference;
pub mod status;
pub mod validate;

use std::sync::Arc;

use basalt_meta::{Keys, Security};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;

use self::validate::Refused;
use super::finalizer::{self, Lifecycle};
use super::{Context, Result, finish};
use crate::crd::AppProfile;
use crate::lifecycle::records::{self as apply, Catalog};

pub use validate::ValidatedAppProfile;

/// On every AppProfile: its deletion removes its record from the instance's catalog in etcd.
pub const RECORD_FINALIZER: &str = "basalt.dev/app-profile-record";

pub async fn reconcile(profile: Arc<AppProfile>, ctx: Arc<Context>) -> Result<Action> {
    super::reconciling(
        &ctx,
        "appprofile",
        &*profile,
        reconcile_app_profile(&profile, &ctx),
    )
    .await
}

async fn reconcile_app_profile(profile: &AppProfile, ctx: &Context) -> Result<Action> {
    let ns = profile.namespace().unwrap_or_default();
    let api: Api<AppProfile> = Api::namespaced(ctx.client.clone(), &ns);

    let lifecycle = finalizer::sync(&api, profile, RECORD_FINALIZER, true).await?;
    match lifecycle {
        // Wanted on every profile, so only ever added here: the profile as read is still
        // the one to record (the status patch carries no resourceVersion).
        Lifecycle::Live | Lifecycle::Changed | Lifecycle::Deleting => {}
        Lifecycle::Released => return Ok(Action::await_change()),
    }

    let found = dereference::dereference(ctx, profile).await?;
    let keys = Keys::new(&ns, &profile.spec.instance_ref);
    // How the instance's metadata store is reached (without the instance there is none).
    let etcd = match &found.instance {
        Some(instance) => ctx.transport(instance)?.etcd.clone(),
        None => Security::Plaintext,
    };

    if lifecycle == Lifecycle::Deleting {
        let Some(instance) = &found.instance else {
            // No instance, no catalog to remove the record from.
            finalizer::release(&api, profile, RECORD_FINALIZER).await?;
            return Ok(Action::await_change());
        };
        let ids = catalog::ids_to_remove(profile);
        let removed = apply::remove(&found.endpoints, &etcd, keys, &ids).await;
        if removed == Catalog::Removed || instance.metadata.deletion_timestamp.is_some() {
            finalizer::release(&api, profile, RECORD_FINALIZER).await?;
            return Ok(Action::await_change());
        }
        return finish(
            ctx,
            &api,
            profile,
            status::removal_pending(profile, &removed),
        )
        .await;
    }

    let outcome = match validate::validate(profile, &found) {
        Ok(validated) => {
            let record = catalog::record(profile);
            let previous = catalog::previous_id(profile);
            let recorded = apply::put(
                &found.endpoints,
                &etcd,
                keys.clone(),
                &record,
                previous.as_deref(),
            )
            .await;
            let routes = crate::lifecycle::routing::observe(&found.endpoints, &etcd, keys)
                .await
                .map(|clusters| crate::lifecycle::routing::routes_now(&record, &clusters));
            status::published(&validated, &recorded, routes.as_ref())
        }
        Err(refused @ Refused::InstanceNotFound) => status::refused(profile, &refused, None),
        Err(refused @ Refused::InvalidSpec(_)) => {
            let removed = apply::remove(
                &found.endpoints,
                &etcd,
                keys,
                &catalog::ids_to_remove(profile),
            )
            .await;
            status::refused(profile, &refused, Some(&removed))
        }
    };
    finish(ctx, &api, profile, outcome).await
}
