//! AppProfile → validated against its instance's clusters; the Instance controller publishes
//! the valid ones to the tablet servers (the instance's ConfigMap, mounted in every pod).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use super::{Context, Result, apply_status};
use crate::build;
use crate::conditions::{self, Cond, DEGRADED, READY};
use crate::crd::{AppProfile, AppProfileStatus, Cluster, Instance};
use crate::validate;

pub async fn reconcile(profile: Arc<AppProfile>, ctx: Arc<Context>) -> Result<Action> {
    super::measured(&ctx, "appprofile", reconcile_inner(profile, ctx.clone())).await
}

async fn reconcile_inner(profile: Arc<AppProfile>, ctx: Arc<Context>) -> Result<Action> {
    if profile.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let ns = profile.namespace().unwrap_or_default();
    let profiles: Api<AppProfile> = Api::namespaced(ctx.client.clone(), &ns);
    let instance_name = &profile.spec.instance_ref;
    let old = profile.status.clone().unwrap_or_default();
    let id = profile.app_profile_id();

    let instance = Api::<Instance>::namespaced(ctx.client.clone(), &ns)
        .get_opt(instance_name)
        .await?;
    let (conds, retry) = if instance.is_none() {
        (
            vec![Cond::new(
                READY,
                false,
                "InstanceNotFound",
                format!("Instance {instance_name:?} does not exist in namespace {ns:?}"),
            )],
            Some(Duration::from_secs(30)),
        )
    } else {
        let clusters: BTreeSet<String> = Api::<Cluster>::namespaced(ctx.client.clone(), &ns)
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|c| &c.spec.instance_ref == instance_name)
            .map(|c| c.name_any())
            .collect();
        let problems = validate::validate_app_profile(&profile, &clusters);
        if problems.is_empty() {
            (
                vec![
                    Cond::new(
                        READY,
                        true,
                        "Published",
                        format!(
                            "app profile {id:?} is published to the tablet servers of instance {instance_name:?} (ConfigMap {})",
                            build::instance_config_map_name(instance_name)
                        ),
                    ),
                    Cond::new(DEGRADED, false, "AsExpected", "the profile is valid"),
                ],
                None,
            )
        } else {
            let message = validate::describe(&problems);
            if conditions::find(&old.conditions, READY).map(|c| &c.message) != Some(&message) {
                ctx.event(
                    &*profile,
                    EventType::Warning,
                    "InvalidSpec",
                    "Validate",
                    message.clone(),
                )
                .await;
            }
            (
                vec![
                    Cond::new(READY, false, "InvalidSpec", message.clone()),
                    Cond::new(DEGRADED, true, "InvalidSpec", message),
                ],
                // Clusters named by the profile may be created later.
                Some(Duration::from_secs(30)),
            )
        }
    };
    let status = AppProfileStatus {
        conditions: conditions::merge(&old.conditions, &conds, profile.metadata.generation),
        observed_generation: profile.metadata.generation,
        app_profile_id: Some(id),
    };
    if Some(&status) != profile.status.as_ref() {
        apply_status(&profiles, &profile, status).await?;
    }
    Ok(match retry {
        Some(d) => Action::requeue(d),
        None => Action::requeue(Duration::from_secs(300)),
    })
}
