//! Instance → the client-facing Service, the configuration published to its tablet servers
//! (app profiles), a finalizer that holds deletion while deletion protection is on, and a
//! status aggregated from its Clusters.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use super::{
    Context, Result, apply, apply_status, has_finalizer, set_finalizers, with_finalizer,
    without_finalizer,
};
use crate::build;
use crate::conditions::{self, Cond, DEGRADED, PROGRESSING, READY};
use crate::crd::{AppProfile, Cluster, Instance, InstanceClusterStatus, InstanceStatus};
use crate::validate;

/// Present while the Instance has deletion protection on.
pub const PROTECTION_FINALIZER: &str = "basalt.dev/deletion-protection";

/// The instance's clusters as its status shows them. Pure.
pub fn cluster_summaries(clusters: &[&Cluster]) -> Vec<InstanceClusterStatus> {
    let mut out: Vec<InstanceClusterStatus> = clusters
        .iter()
        .map(|c| {
            let s = c.status.clone().unwrap_or_default();
            let ready = conditions::find(&s.conditions, READY).is_some_and(|r| r.status == "True");
            InstanceClusterStatus {
                name: c.name_any(),
                location: c.spec.location.clone(),
                serve_nodes: s.serve_nodes,
                ready_nodes: s.ready_nodes,
                ready,
            }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Ready / Degraded from the clusters. Pure.
pub fn health(clusters: &[InstanceClusterStatus]) -> Vec<Cond> {
    let total = clusters.len();
    let ready = clusters.iter().filter(|c| c.ready).count();
    let not_ready: Vec<&str> = clusters
        .iter()
        .filter(|c| !c.ready)
        .map(|c| c.name.as_str())
        .collect();
    if total == 0 {
        return vec![
            Cond::new(
                READY,
                false,
                "NoClusters",
                "the instance has no Cluster yet",
            ),
            Cond::new(
                DEGRADED,
                false,
                "NoClusters",
                "the instance has no Cluster yet",
            ),
        ];
    }
    vec![
        if ready > 0 {
            Cond::new(
                READY,
                true,
                "ClustersReady",
                format!("{ready}/{total} clusters ready"),
            )
        } else {
            Cond::new(
                READY,
                false,
                "ClustersNotReady",
                format!("0/{total} clusters ready"),
            )
        },
        if ready > 0 && ready < total {
            Cond::new(
                DEGRADED,
                true,
                "ClustersNotReady",
                format!("not ready: {}", not_ready.join(", ")),
            )
        } else {
            Cond::new(DEGRADED, false, "AsExpected", "every cluster is ready")
        },
    ]
}

pub async fn reconcile(instance: Arc<Instance>, ctx: Arc<Context>) -> Result<Action> {
    super::measured(&ctx, "instance", reconcile_inner(instance, ctx.clone())).await
}

async fn reconcile_inner(instance: Arc<Instance>, ctx: Arc<Context>) -> Result<Action> {
    let ns = instance.namespace().unwrap_or_default();
    let name = instance.name_any();
    let instances: Api<Instance> = Api::namespaced(ctx.client.clone(), &ns);
    let generation = instance.metadata.generation;
    let old_status = instance.status.clone().unwrap_or_default();
    let protected = instance.spec.deletion_protection;

    if instance.metadata.deletion_timestamp.is_some() {
        if !has_finalizer(&*instance, PROTECTION_FINALIZER) {
            return Ok(Action::await_change());
        }
        if protected {
            let message = "deletion is blocked: spec.deletionProtection is true; set it to false to let the deletion finish".to_string();
            if conditions::find(&old_status.conditions, "DeletionBlocked").is_none() {
                ctx.event(
                    &*instance,
                    EventType::Warning,
                    "DeletionBlocked",
                    "Delete",
                    message.clone(),
                )
                .await;
            }
            let status = InstanceStatus {
                conditions: conditions::merge(
                    &old_status.conditions,
                    &[Cond::new(
                        "DeletionBlocked",
                        true,
                        "DeletionProtection",
                        message,
                    )],
                    generation,
                ),
                ..old_status
            };
            apply_status(&instances, &instance, status).await?;
            return Ok(Action::await_change());
        }
        set_finalizers(
            &instances,
            &instance,
            without_finalizer(&*instance, PROTECTION_FINALIZER),
        )
        .await?;
        return Ok(Action::await_change());
    }
    if protected != has_finalizer(&*instance, PROTECTION_FINALIZER) {
        let finalizers = if protected {
            with_finalizer(&*instance, PROTECTION_FINALIZER)
        } else {
            without_finalizer(&*instance, PROTECTION_FINALIZER)
        };
        set_finalizers(&instances, &instance, finalizers).await?;
        return Ok(Action::await_change());
    }

    let problems = validate::validate_instance(&instance);
    let all_clusters = Api::<Cluster>::namespaced(ctx.client.clone(), &ns)
        .list(&ListParams::default())
        .await?;
    let clusters: Vec<&Cluster> = all_clusters
        .items
        .iter()
        .filter(|c| c.spec.instance_ref == name)
        .collect();
    let summaries = cluster_summaries(&clusters);

    if !problems.is_empty() {
        let message = validate::describe(&problems);
        if conditions::find(&old_status.conditions, DEGRADED).map(|c| &c.message) != Some(&message)
        {
            ctx.event(
                &*instance,
                EventType::Warning,
                "InvalidSpec",
                "Validate",
                message.clone(),
            )
            .await;
        }
        let status = InstanceStatus {
            conditions: conditions::merge(
                &old_status.conditions,
                &[
                    Cond::new(READY, false, "InvalidSpec", message.clone()),
                    Cond::new(DEGRADED, true, "InvalidSpec", message),
                ],
                generation,
            ),
            observed_generation: generation,
            clusters: summaries,
            ..old_status
        };
        apply_status(&instances, &instance, status).await?;
        return Ok(Action::await_change());
    }

    let cluster_ids: BTreeSet<String> = clusters.iter().map(|c| c.name_any()).collect();
    let all_profiles = Api::<AppProfile>::namespaced(ctx.client.clone(), &ns)
        .list(&ListParams::default())
        .await?;
    let profiles: Vec<&AppProfile> = all_profiles
        .items
        .iter()
        .filter(|p| p.spec.instance_ref == name && p.metadata.deletion_timestamp.is_none())
        .filter(|p| validate::validate_app_profile(p, &cluster_ids).is_empty())
        .collect();

    let objects = build::instance_objects(&instance, &profiles);
    apply(
        &Api::<ConfigMap>::namespaced(ctx.client.clone(), &ns),
        &objects.config_map,
    )
    .await?;
    let svc = apply(
        &Api::<Service>::namespaced(ctx.client.clone(), &ns),
        &objects.service,
    )
    .await?;
    if old_status.endpoint.is_none() {
        ctx.event(
            &*instance,
            EventType::Normal,
            "EndpointCreated",
            "Create",
            format!(
                "clients connect to Service {} on port {}",
                svc.name_any(),
                build::GRPC_PORT
            ),
        )
        .await;
    }

    let mut conds = health(&summaries);
    conds.push(Cond::new(
        PROGRESSING,
        summaries.iter().any(|c| c.ready_nodes != c.serve_nodes),
        "Clusters",
        summaries
            .iter()
            .map(|c| {
                format!(
                    "{}: {}/{} nodes ready",
                    c.name, c.ready_nodes, c.serve_nodes
                )
            })
            .collect::<Vec<_>>()
            .join(", "),
    ));
    let status = InstanceStatus {
        conditions: conditions::merge(&old_status.conditions, &conds, generation)
            .into_iter()
            .filter(|c| c.type_ != "DeletionBlocked")
            .collect(),
        observed_generation: generation,
        resource_name: Some(format!(
            "projects/{}/instances/{name}",
            build::project_id(&instance)
        )),
        endpoint: Some(format!("{}.{ns}.svc:{}", svc.name_any(), build::GRPC_PORT)),
        clusters: summaries,
    };
    if Some(&status) != instance.status.as_ref() {
        apply_status(&instances, &instance, status).await?;
    }
    Ok(Action::requeue(Duration::from_secs(300)))
}
