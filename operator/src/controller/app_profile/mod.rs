//! AppProfile → validated against its instance's clusters; the Instance controller publishes
//! the valid ones to the tablet servers (the instance's ConfigMap, mounted in every pod).
//!
//! [`reconcile`] is the pipeline: [`dereference`] (the Instance, its clusters) → [`validate`]
//! (pure: a [`ValidatedAppProfile`], or why not) → [`status`] (pure condition builders) → one
//! status patch. There is nothing to build or apply here, and no finalizer: the Instance
//! controller stops publishing a profile once it is being deleted.

pub mod dereference;
pub mod status;
pub mod validate;

use std::sync::Arc;

use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;

use super::{Context, Result, finish};
use crate::crd::AppProfile;

pub use validate::ValidatedAppProfile;

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
    if profile.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let api: Api<AppProfile> =
        Api::namespaced(ctx.client.clone(), &profile.namespace().unwrap_or_default());

    let found = dereference::dereference(ctx, profile).await?;
    let outcome = match validate::validate(profile, &found) {
        Ok(validated) => status::published(&validated),
        Err(refused) => status::refused(profile, &refused),
    };
    finish(ctx, &api, profile, outcome).await
}
