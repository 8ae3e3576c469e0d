//! Cluster, stage 2 (pure): the spec's rules ([`crate::rules::validate_cluster`]),
//! checked against what the existing StatefulSet says cannot change, then whether the
//! Instance exists. The result is what build and status work from.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::dereference::{Dereferenced, Placement};
use crate::build::{self, ANNOTATION_LOCATION, LABEL_BASALT_INSTANCE, LABEL_STORAGE_TYPE};
use crate::conditions::{self, SCALE_IN};
use crate::crd::{Cluster, Instance, StorageType};
use crate::lifecycle;
use crate::rules::{self, ClusterFacts, Problem};

/// A Cluster that may be applied.
#[derive(Debug, Clone)]
pub struct ValidatedCluster<'a> {
    pub cluster: &'a Cluster,
    /// The Instance the cluster belongs to: its metadata store and project.
    pub instance: &'a Instance,
    /// The StatefulSet's replica count now (None before it exists).
    pub current_nodes: Option<i32>,
    /// The size the lifecycle decided ([`lifecycle::scale::size`]): what the spec asks for
    /// (`size.requested`: `serveNodes`, or with autoscaling the current count within bounds;
    /// recorded in the metadata store, the master drains the servers above it), the replica
    /// count to apply (`size.servers`: never fewer than the servers that own tablets, see
    /// [`scale_in_floor`], and during a scale-in's first moments the count that runs, see
    /// [`shrink_floor`]) and why it keeps more than requested (`size.kept_because`).
    pub size: lifecycle::scale::Size,
}

pub use crate::lifecycle::scale::{SCALE_IN_SETTLE, scale_in_floor};

/// Whether the scale-in has been under way long enough for a pod to stop: its `ScaleIn`
/// condition has been True for [`SCALE_IN_SETTLE`] at `now`. Pure.
pub fn scale_in_settled(cluster: &Cluster, now: Timestamp) -> bool {
    let since = cluster
        .status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, SCALE_IN))
        .filter(|c| c.status == "True")
        .map(|c| c.last_transition_time.0);
    since.is_some_and(|t| {
        std::time::Duration::try_from(now.duration_since(t)).is_ok_and(|d| d >= SCALE_IN_SETTLE)
    })
}

/// The fewest servers the StatefulSet may run now ([`lifecycle::scale::shrink_floor`]), the
/// scale-in settled when its `ScaleIn` condition has been True for [`SCALE_IN_SETTLE`] at
/// `now` ([`scale_in_settled`]). Pure.
pub fn shrink_floor(
    cluster: &Cluster,
    requested: i32,
    current: Option<i32>,
    placement: Option<&Placement>,
    now: Timestamp,
) -> (i32, String) {
    lifecycle::scale::shrink_floor(
        requested,
        current,
        placement,
        scale_in_settled(cluster, now),
    )
}

/// Why the reconcile stops before applying anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// The spec breaks a rule, or changes what cannot change.
    InvalidSpec(Vec<Problem>),
    /// `spec.instanceRef` names no Instance in the namespace.
    InstanceNotFound,
}

pub fn validate<'a>(
    cluster: &'a Cluster,
    found: &'a Dereferenced,
) -> Result<ValidatedCluster<'a>, Refused> {
    let mut problems = rules::validate_cluster(cluster, &facts(found.statefulset.as_ref()));
    let metadata_store = build::etcd::name(&cluster.spec.instance_ref);
    if cluster.name_any() == metadata_store {
        problems.push(Problem {
            field: "metadata.name".into(),
            message: format!(
                "{metadata_store:?} is the name of the instance's metadata store (its etcd StatefulSet): choose another cluster id"
            ),
        });
    }
    if !problems.is_empty() {
        return Err(Refused::InvalidSpec(problems));
    }
    let Some(instance) = &found.instance else {
        return Err(Refused::InstanceNotFound);
    };
    let current_nodes = found
        .statefulset
        .as_ref()
        .and_then(|s| s.spec.as_ref()?.replicas);
    let autoscaled = found
        .placement
        .as_ref()
        .and_then(|p| p.autoscaler.as_ref())
        .map(|a| a.nodes);
    let requested = build::desired_serve_nodes(cluster, current_nodes, autoscaled);
    let size = lifecycle::scale::size(
        requested,
        current_nodes,
        found.placement.as_ref(),
        scale_in_settled(cluster, found.now),
    );
    Ok(ValidatedCluster {
        cluster,
        instance,
        current_nodes,
        size,
    })
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::OperatorConfig;
    use crate::crd::Instance;

    fn cluster(spec: &str) -> Cluster {
        serde_norway::from_str(&format!(
            "metadata: {{name: orders-c1, namespace: shop}}\nspec: {spec}\n"
        ))
        .unwrap()
    }

    fn instance() -> Instance {
        serde_norway::from_str(
            "metadata: {name: orders, namespace: shop}\nspec: {displayName: Orders}\n",
        )
        .unwrap()
    }

    /// The world after `applied` was applied, its StatefulSet since scaled to `replicas`.
    fn found_after(applied: &Cluster, replicas: i32) -> Dereferenced {
        let sts =
            build::cluster_objects(applied, &instance(), &OperatorConfig::default(), replicas)
                .statefulset;
        Dereferenced {
            statefulset: Some(sts),
            instance: Some(instance()),
            ..Dereferenced::default()
        }
    }

    #[test]
    fn facts_read_back_what_the_statefulset_was_built_with() {
        let c = cluster(
            "{instanceRef: orders, serveNodes: 3, storageType: HDD, location: europe-west1-b, storageSize: 100Gi, storageClassName: slow}",
        );
        let sts =
            build::cluster_objects(&c, &instance(), &OperatorConfig::default(), 3).statefulset;
        assert_eq!(
            facts(Some(&sts)),
            ClusterFacts {
                storage_type: Some(StorageType::Hdd),
                location: Some(Some("europe-west1-b".into())),
                instance: Some("orders".into()),
                storage_size: Some("100Gi".into()),
                storage_class: Some("slow".into()),
            }
        );
        // No zone is recorded as "any zone", which is a fact too.
        let anywhere = cluster("{instanceRef: orders, serveNodes: 1}");
        let sts = build::cluster_objects(&anywhere, &instance(), &OperatorConfig::default(), 1)
            .statefulset;
        assert_eq!(facts(Some(&sts)).location, Some(None));
        assert_eq!(facts(None), ClusterFacts::default());
    }

    #[test]
    fn an_unchanged_spec_passes_and_sizes_from_the_current_count() {
        let c = cluster(
            "{instanceRef: orders, autoscaling: {minServeNodes: 2, maxServeNodes: 5, cpuUtilizationPercent: 50}}",
        );
        let mut found = found_after(&c, 7);
        // Without the tablet map the operator does not know who owns tablets: it keeps 7.
        let v = validate(&c, &found).unwrap();
        assert_eq!((v.current_nodes, v.size.servers), (Some(7), 7));
        assert_eq!(v.size.requested, 5);
        assert!(v.size.kept_because.unwrap().contains("could not be read"));
        // The map says no server owns a tablet, but the metadata store does not hold the new
        // count yet: still 7 (the reconcile records it).
        found.placement = Some(Placement::default());
        let v = validate(&c, &found).unwrap();
        assert_eq!((v.current_nodes, v.size.servers), (Some(7), 7));
        // Recorded, and the scale-in under way for long enough: down to the autoscaling
        // maximum.
        found.placement = Some(Placement {
            serve_nodes: Some(5),
            ..Placement::default()
        });
        let mut c = c;
        let mut conds = crate::conditions::merge(
            &[],
            &[crate::conditions::Cond::new(
                SCALE_IN, true, "Draining", "x",
            )],
            Some(1),
        );
        conds[0].last_transition_time.0 = found.now - SCALE_IN_SETTLE;
        c.status = Some(crate::crd::ClusterStatus {
            conditions: conds,
            ..Default::default()
        });
        let v = validate(&c, &found).unwrap();
        assert_eq!((v.current_nodes, v.size.servers), (Some(7), 5));
        let first = Dereferenced {
            instance: Some(instance()),
            ..Dereferenced::default()
        };
        let v = validate(&c, &first).unwrap();
        assert_eq!((v.current_nodes, v.size.servers), (None, 2));
    }

    #[test]
    fn spec_problems_come_before_a_missing_instance() {
        let before = cluster("{instanceRef: orders, serveNodes: 1}");
        let after = cluster("{instanceRef: orders, serveNodes: 1, storageType: HDD}");
        let mut found = found_after(&before, 1);
        let Err(Refused::InvalidSpec(problems)) = validate(&after, &found) else {
            panic!("a storage type change must be refused");
        };
        assert_eq!(problems[0].field, "spec.storageType");
        found.instance = None;
        assert!(matches!(
            validate(&after, &found),
            Err(Refused::InvalidSpec(_))
        ));
        assert_eq!(
            validate(&before, &found).unwrap_err(),
            Refused::InstanceNotFound
        );
    }

    #[test]
    fn a_cluster_may_not_take_the_metadata_stores_name() {
        let c: Cluster = serde_norway::from_str(
            "metadata: {name: orders-meta, namespace: shop}\nspec: {instanceRef: orders, serveNodes: 1}\n",
        )
        .unwrap();
        let found = Dereferenced {
            instance: Some(instance()),
            ..Dereferenced::default()
        };
        let Err(Refused::InvalidSpec(problems)) = validate(&c, &found) else {
            panic!("the store's name must be refused");
        };
        assert_eq!(problems[0].field, "metadata.name");
    }
}
