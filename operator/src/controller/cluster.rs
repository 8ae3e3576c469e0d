//! Cluster → a StatefulSet of tablet servers, a headless Service and a PodDisruptionBudget.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use super::{
    Context, Result, apply, apply_status, has_finalizer, set_finalizers, with_finalizer,
    without_finalizer,
};
use crate::build::{self, ANNOTATION_LOCATION, LABEL_BASALT_INSTANCE, LABEL_STORAGE_TYPE};
use crate::conditions::{self, Cond, DEGRADED, PROGRESSING, READY};
use crate::crd::{Cluster, ClusterStatus, Instance, StorageType, VolumeReclaimPolicy};
use crate::validate::{self, ClusterFacts};

/// Present only on Clusters whose volumes are deleted with them (volumeReclaimPolicy Delete).
pub const VOLUME_FINALIZER: &str = "basalt.dev/delete-volumes";

/// What the existing StatefulSet says about fields that cannot change.
pub fn facts(sts: Option<&StatefulSet>) -> ClusterFacts {
    let Some(sts) = sts else {
        return ClusterFacts::default();
    };
    let labels = sts.labels();
    let claim = sts
        .spec
        .as_ref()
        .and_then(|s| s.volume_claim_templates.as_ref()?.first())
        .and_then(|c| c.spec.as_ref());
    ClusterFacts {
        storage_type: labels
            .get(LABEL_STORAGE_TYPE)
            .and_then(|t| match t.as_str() {
                "SSD" => Some(StorageType::Ssd),
                "HDD" => Some(StorageType::Hdd),
                _ => None,
            }),
        location: sts
            .annotations()
            .get(ANNOTATION_LOCATION)
            .map(|l| (!l.is_empty()).then(|| l.clone())),
        instance: labels.get(LABEL_BASALT_INSTANCE).cloned(),
        storage_size: claim
            .and_then(|c| c.resources.as_ref()?.requests.as_ref()?.get("storage"))
            .map(|q| q.0.clone()),
        storage_class: claim.and_then(|c| c.storage_class_name.clone()),
    }
}

/// What the cluster's tablet servers report on their `/metrics`: tablets owned, and bytes
/// stored (SST files and memtables). None when no tablet server answered.
async fn served(ctx: &Context, ns: &str, cluster: &str) -> Result<(Option<i64>, Option<i64>)> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let selector = build::selector_string(&build::cluster_selector(cluster));
    let list = pods.list(&ListParams::default().labels(&selector)).await?;
    let (mut tablets, mut bytes) = (None, None);
    for ip in list
        .items
        .iter()
        .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
    {
        let Some(text) = super::scrape_metrics(&ip).await else {
            continue;
        };
        let gauge = |name| super::parse_gauge(&text, name);
        if let Some(t) = gauge("basalt_tablets") {
            *tablets.get_or_insert(0i64) += t as i64;
        }
        if let Some(sst) = gauge("basalt_storage_bytes") {
            *bytes.get_or_insert(0i64) +=
                (sst + gauge("basalt_memtable_bytes").unwrap_or(0.0)) as i64;
        }
    }
    Ok((tablets, bytes))
}

/// The storage figure to report: the new reading, unless it moved by less than 1 MiB or 1 %
/// from the reported one (memtables grow with every write; status should not churn with them).
pub fn settled_storage(new: Option<i64>, old: Option<i64>) -> Option<i64> {
    match (new, old) {
        (Some(n), Some(o)) if (n - o).abs() < (1 << 20).max(o / 100) => Some(o),
        (Some(n), _) => Some(n),
        (None, o) => o,
    }
}

/// Condition type that says whether the cluster's tablet servers form one database.
pub const SINGLE_DATABASE: &str = "SingleDatabase";

/// Until tablets are spread over a cluster's servers, each tablet server is a database of
/// its own behind the cluster's Service: with more than one node, a read through one server
/// does not see writes made through another. Pure.
pub fn single_database_condition(nodes: i32) -> Cond {
    if nodes <= 1 {
        Cond::new(
            SINGLE_DATABASE,
            true,
            "SingleNode",
            "one tablet server serves every tablet",
        )
    } else {
        Cond::new(
            SINGLE_DATABASE,
            false,
            "IndependentServers",
            format!(
                "serveNodes is {nodes}, but this operator version does not spread tablets over \
                 tablet servers yet: each of the {nodes} servers is a separate database behind the \
                 Service, so a read through one does not see writes made through another; \
                 use serveNodes: 1 until multi-node clusters are supported"
            ),
        )
    }
}

pub async fn reconcile(cluster: Arc<Cluster>, ctx: Arc<Context>) -> Result<Action> {
    super::measured(&ctx, "cluster", reconcile_inner(cluster, ctx.clone())).await
}

async fn reconcile_inner(cluster: Arc<Cluster>, ctx: Arc<Context>) -> Result<Action> {
    let ns = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    let clusters: Api<Cluster> = Api::namespaced(ctx.client.clone(), &ns);
    let statefulsets: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), &ns);
    let generation = cluster.metadata.generation;
    let old_status = cluster.status.clone().unwrap_or_default();

    // Deletion: owner references remove the StatefulSet and Services; volumes only go when
    // the user opted in (the finalizer is there only then).
    if cluster.metadata.deletion_timestamp.is_some() {
        if has_finalizer(&*cluster, VOLUME_FINALIZER) {
            let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
            let selector = build::selector_string(&build::cluster_selector(&name));
            let list = pvcs.list(&ListParams::default().labels(&selector)).await?;
            for pvc in &list.items {
                pvcs.delete(&pvc.name_any(), &DeleteParams::default())
                    .await?;
            }
            ctx.event(
                &*cluster,
                EventType::Normal,
                "VolumesDeleted",
                "Delete",
                format!(
                    "deleted {} volume claim(s) (volumeReclaimPolicy: Delete)",
                    list.items.len()
                ),
            )
            .await;
            set_finalizers(
                &clusters,
                &cluster,
                without_finalizer(&*cluster, VOLUME_FINALIZER),
            )
            .await?;
        }
        return Ok(Action::await_change());
    }
    let wants_finalizer = cluster.spec.volume_reclaim_policy == VolumeReclaimPolicy::Delete;
    if wants_finalizer != has_finalizer(&*cluster, VOLUME_FINALIZER) {
        let finalizers = if wants_finalizer {
            with_finalizer(&*cluster, VOLUME_FINALIZER)
        } else {
            without_finalizer(&*cluster, VOLUME_FINALIZER)
        };
        set_finalizers(&clusters, &cluster, finalizers).await?;
        // The change triggers another reconcile with the new object.
        return Ok(Action::await_change());
    }

    let existing = statefulsets
        .get_opt(&build::statefulset_name(&name))
        .await?;
    let problems = validate::validate_cluster(&cluster, &facts(existing.as_ref()));
    if !problems.is_empty() {
        let message = validate::describe(&problems);
        if conditions::find(&old_status.conditions, READY).map(|c| &c.message) != Some(&message) {
            ctx.event(
                &*cluster,
                EventType::Warning,
                "InvalidSpec",
                "Validate",
                message.clone(),
            )
            .await;
        }
        let status = ClusterStatus {
            conditions: conditions::merge(
                &old_status.conditions,
                &[
                    Cond::new(
                        READY,
                        old_status.ready_nodes > 0,
                        "InvalidSpec",
                        message.clone(),
                    ),
                    Cond::new(DEGRADED, true, "InvalidSpec", message),
                ],
                generation,
            ),
            observed_generation: generation,
            ..old_status
        };
        apply_status(&clusters, &cluster, status).await?;
        return Ok(Action::await_change());
    }

    let instances: Api<Instance> = Api::namespaced(ctx.client.clone(), &ns);
    if instances
        .get_opt(&cluster.spec.instance_ref)
        .await?
        .is_none()
    {
        let message = format!(
            "Instance {:?} does not exist in namespace {ns:?}",
            cluster.spec.instance_ref
        );
        let status = ClusterStatus {
            conditions: conditions::merge(
                &old_status.conditions,
                &[Cond::new(READY, false, "InstanceNotFound", message)],
                generation,
            ),
            observed_generation: generation,
            ..old_status
        };
        apply_status(&clusters, &cluster, status).await?;
        return Ok(Action::requeue(Duration::from_secs(30)));
    }

    let current = existing.as_ref().and_then(|s| s.spec.as_ref()?.replicas);
    let objects = build::cluster_objects(&cluster, &ctx.config, current);
    let desired = objects
        .statefulset
        .spec
        .as_ref()
        .and_then(|s| s.replicas)
        .unwrap_or(0);

    let services: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
    apply(&services, &objects.headless_service).await?;
    if ctx.pdb_supported {
        let pdbs: Api<PodDisruptionBudget> = Api::namespaced(ctx.client.clone(), &ns);
        apply(&pdbs, &objects.pod_disruption_budget).await?;
    }
    // The StatefulSet last: its pods start once everything they rely on exists.
    let sts = apply(&statefulsets, &objects.statefulset).await?;
    match current {
        None => {
            ctx.event(
                &*cluster,
                EventType::Normal,
                "Created",
                "Create",
                format!(
                    "created StatefulSet {} with {desired} tablet server(s)",
                    sts.name_any()
                ),
            )
            .await
        }
        Some(before) if before != desired => {
            ctx.event(
                &*cluster,
                EventType::Normal,
                "Scaled",
                "Scale",
                format!("scaled from {before} to {desired} tablet server(s)"),
            )
            .await
        }
        _ => {}
    }

    let observed = sts.status.clone().unwrap_or_default();
    let ready = observed.ready_replicas.unwrap_or(0);
    let updated = observed.updated_replicas.unwrap_or(0);
    let settled = ready == desired
        && observed.replicas == desired
        && updated == desired
        && observed.observed_generation == sts.metadata.generation;
    let mut conds = vec![
        if settled {
            Cond::new(
                READY,
                true,
                "AllNodesReady",
                format!("{ready}/{desired} tablet servers ready"),
            )
        } else if ready > 0 {
            Cond::new(
                READY,
                true,
                "NodesStarting",
                format!("{ready}/{desired} tablet servers ready"),
            )
        } else {
            Cond::new(
                READY,
                false,
                "NodesStarting",
                format!("0/{desired} tablet servers ready"),
            )
        },
        Cond::new(
            PROGRESSING,
            !settled,
            if settled { "Stable" } else { "RollingOut" },
            format!(
                "{} running, {updated} updated, {ready} ready of {desired} desired",
                observed.replicas
            ),
        ),
        Cond::new(
            DEGRADED,
            false,
            "AsExpected",
            "the spec is valid and applied",
        ),
    ];
    conds.push(if ctx.pdb_supported {
        Cond::new("DisruptionBudget", true, "Applied", "at most one tablet server may be evicted at a time")
    } else {
        Cond::new(
            "DisruptionBudget",
            false,
            "Unsupported",
            "the API server does not serve policy/v1 PodDisruptionBudgets (Kubernetes < 1.21): voluntary evictions are not limited",
        )
    });
    let single = single_database_condition(desired);
    let was_single = conditions::find(&old_status.conditions, SINGLE_DATABASE)
        .is_none_or(|c| c.status == "True");
    if !single.status && was_single {
        ctx.event(
            &*cluster,
            EventType::Warning,
            single.reason,
            "Validate",
            single.message.clone(),
        )
        .await;
    }
    conds.push(single);
    if let Some(a) = &cluster.spec.autoscaling {
        conds.push(Cond::new(
            "Autoscaling",
            false,
            "NotRunning",
            format!(
                "the autoscaler is not part of this operator version: the cluster runs {desired} node(s), within [{}, {}]",
                a.min_serve_nodes, a.max_serve_nodes
            ),
        ));
    }
    let (tablets, storage_used_bytes) = served(&ctx, &ns, &name).await?;
    let status = ClusterStatus {
        conditions: conditions::merge(&old_status.conditions, &conds, generation),
        observed_generation: generation,
        serve_nodes: observed.replicas,
        ready_nodes: ready,
        selector: Some(build::selector_string(&build::cluster_selector(&name))),
        storage_class_name: Some(build::storage_class(&cluster, &ctx.config)),
        tablets: tablets.or(old_status.tablets),
        storage_used_bytes: settled_storage(storage_used_bytes, old_status.storage_used_bytes),
    };
    if Some(&status) != cluster.status.as_ref() {
        apply_status(&clusters, &cluster, status).await?;
    }
    Ok(if settled {
        Action::requeue(Duration::from_secs(300))
    } else {
        Action::requeue(Duration::from_secs(10))
    })
}

#[cfg(test)]
mod tests {
    use super::{SINGLE_DATABASE, settled_storage, single_database_condition};

    #[test]
    fn more_than_one_node_is_flagged_as_independent_servers() {
        let one = single_database_condition(1);
        assert_eq!(
            (one.type_, one.status, one.reason),
            (SINGLE_DATABASE, true, "SingleNode")
        );
        let three = single_database_condition(3);
        assert_eq!((three.status, three.reason), (false, "IndependentServers"));
        assert!(
            three.message.contains("serveNodes is 3"),
            "{}",
            three.message
        );
        assert!(three.message.contains("serveNodes: 1"), "{}", three.message);
    }

    #[test]
    fn storage_reports_move_only_by_a_mebibyte_or_a_percent() {
        assert_eq!(settled_storage(Some(5_000), None), Some(5_000));
        assert_eq!(
            settled_storage(Some(5_000 + 1000), Some(5_000)),
            Some(5_000)
        );
        assert_eq!(settled_storage(Some(3 << 20), Some(1 << 20)), Some(3 << 20));
        assert_eq!(
            settled_storage(Some(1_009_000_000), Some(1_000_000_000)),
            Some(1_000_000_000)
        );
        assert_eq!(
            settled_storage(Some(1_020_000_000), Some(1_000_000_000)),
            Some(1_020_000_000)
        );
        assert_eq!(settled_storage(None, Some(7)), Some(7));
    }
}
