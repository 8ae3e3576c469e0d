//! Instance, stage 5 (pure): the status, aggregated from the instance's Clusters, with its
//! resource name, client endpoint, metadata store and the replication between its clusters —
//! or from why the reconcile stopped, or a deletion held by protection.

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use kube::ResourceExt;
use kube::runtime::controller::Action;

use super::apply::Applied;
use super::validate::{Refused, ValidatedInstance};
use crate::build;
use crate::conditions::{
    self, Cond, DEGRADED, PROGRESSING, READY, REPLICATING, REPLICATION_DEGRADED,
};
use crate::controller::{Note, Outcome, invalid_spec_warning};
use crate::crd::{
    Cluster, Instance, InstanceClusterStatus, InstanceStatus, MetadataStoreStatus,
    ReplicationStatus, SeedingStatus,
};
use crate::lifecycle::replication::{self, Replication};
use crate::rules;

/// The condition a protected instance's deletion is reported by while it waits.
pub const DELETION_BLOCKED: &str = "DeletionBlocked";
/// The condition that follows the metadata store's members.
pub const METADATA_STORE_READY: &str = "MetadataStoreReady";

/// The metadata store as the status shows it, and `MetadataStoreReady`: for the operator's
/// etcd (`statefulset` as applied, `members` of it) ready while a quorum of members is ready;
/// an existing etcd is not checked (its endpoints are reported).
pub fn metadata_store(
    instance: &Instance,
    members: i32,
    statefulset: Option<&StatefulSet>,
) -> (MetadataStoreStatus, Cond) {
    let endpoints = build::etcd::client_urls(instance, members);
    if instance.spec.metadata_store.is_some() {
        let cond = Cond::new(
            METADATA_STORE_READY,
            true,
            "ExistingEtcd",
            format!(
                "the instance uses the etcd at {} (spec.metadataStore; not run or checked by the operator)",
                endpoints.join(", ")
            ),
        );
        let status = MetadataStoreStatus {
            endpoints,
            external: true,
            ..MetadataStoreStatus::default()
        };
        return (status, cond);
    }
    let ready = statefulset
        .and_then(|s| s.status.as_ref()?.ready_replicas)
        .unwrap_or(0);
    let quorum = members / 2 + 1;
    let name = build::etcd::name(&instance.name_any());
    let cond = if ready >= members {
        Cond::new(
            METADATA_STORE_READY,
            true,
            "AllMembersReady",
            format!("{ready}/{members} etcd members of {name} ready"),
        )
    } else if ready >= quorum {
        Cond::new(
            METADATA_STORE_READY,
            true,
            "QuorumReady",
            format!(
                "{ready}/{members} etcd members of {name} ready: the store works, with less margin (quorum {quorum})"
            ),
        )
    } else {
        Cond::new(
            METADATA_STORE_READY,
            false,
            "NoQuorum",
            format!(
                "{ready}/{members} etcd members of {name} ready, {quorum} needed: tablet servers cannot register or change tablets until then"
            ),
        )
    };
    let status = MetadataStoreStatus {
        endpoints,
        external: false,
        members: Some(members),
        ready_members: Some(ready),
    };
    (status, cond)
}

/// How soon an instance is looked at again (its Clusters trigger it sooner).
const REQUEUE: Duration = Duration::from_secs(300);
/// How soon while its metadata store has no quorum.
const STARTING_REQUEUE: Duration = Duration::from_secs(10);

/// The instance's clusters as its status shows them, sorted by name.
pub fn cluster_summaries<'a>(
    clusters: impl IntoIterator<Item = &'a Cluster>,
) -> Vec<InstanceClusterStatus> {
    let mut out: Vec<InstanceClusterStatus> = clusters
        .into_iter()
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

/// Ready / Degraded from the clusters: ready with one ready cluster, degraded while some but
/// not all are.
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

/// `Progressing` while a cluster has fewer ready nodes than it serves.
pub fn progressing(clusters: &[InstanceClusterStatus]) -> Cond {
    Cond::new(
        PROGRESSING,
        clusters.iter().any(|c| c.ready_nodes != c.serve_nodes),
        "Clusters",
        clusters
            .iter()
            .map(|c| {
                format!(
                    "{}: {}/{} nodes ready",
                    c.name, c.ready_nodes, c.serve_nodes
                )
            })
            .collect::<Vec<_>>()
            .join(", "),
    )
}

/// The status of an applied instance, from what the apply left (its client Service, its
/// metadata store's StatefulSet). A deletion that was blocked and then cancelled leaves no
/// `DeletionBlocked` behind.
pub fn applied(validated: &ValidatedInstance<'_>, applied: &Applied) -> Outcome<InstanceStatus> {
    let instance = validated.instance;
    let service = &applied.service;
    let generation = instance.metadata.generation;
    let old = instance.status.clone().unwrap_or_default();
    let summaries = cluster_summaries(validated.clusters.iter().copied());
    let mut conds = health(&summaries);
    conds.push(progressing(&summaries));
    let (store, store_cond) = metadata_store(
        instance,
        validated.etcd_members,
        applied.metadata_store.as_ref(),
    );
    let store_ready = store_cond.status;
    conds.push(store_cond);
    let shown = replication_status(&old, validated.clusters.len(), validated.replication);
    conds.extend(shown.conds);
    let events = shown.events;
    let status = InstanceStatus {
        conditions: conditions::merge(&old.conditions, &conds, generation)
            .into_iter()
            .filter(|c| c.type_ != DELETION_BLOCKED)
            .collect(),
        observed_generation: generation,
        resource_name: Some(format!(
            "projects/{}/instances/{}",
            build::project_id(instance),
            instance.name_any()
        )),
        endpoint: Some(format!(
            "{}.{}.svc:{}",
            service.name_any(),
            instance.namespace().unwrap_or_default(),
            build::GRPC_PORT
        )),
        clusters: summaries,
        metadata_store: Some(store),
        replication: shown.pairs,
        seeding: shown.seeding,
    };
    let replicated = validated.clusters.len() > 1;
    Outcome {
        status,
        events,
        // The etcd StatefulSet's changes trigger a reconcile too; this is the safety net.
        // Replication's progress changes nothing in Kubernetes: it is looked at every 30 s.
        requeue: Action::requeue(if !store_ready {
            STARTING_REQUEUE
        } else if replicated {
            REPLICATION_REQUEUE
        } else {
            REQUEUE
        }),
    }
}

/// How soon an instance of several clusters is looked at again (its replication lag).
const REPLICATION_REQUEUE: Duration = Duration::from_secs(30);

/// What the status shows of replication ([`replication_status`]).
#[derive(Debug, Default)]
pub struct ReplicationShown {
    pub conds: Vec<Cond>,
    pub pairs: Vec<ReplicationStatus>,
    pub seeding: Vec<SeedingStatus>,
    pub events: Vec<Note>,
}

/// `Replicating` and `ReplicationDegraded` from `observed` (None: not known now, the
/// conditions, pairs and seeding stay as they were), the pairs and seeding as the status shows
/// them, a warning event when the instance's replication becomes degraded, and an event when a
/// cluster's seeding begins or ends. Pure.
pub fn replication_status(
    old: &InstanceStatus,
    clusters: usize,
    observed: Option<&Replication>,
) -> ReplicationShown {
    if clusters < 2 {
        let one = "the instance has one cluster: nothing to replicate";
        return ReplicationShown {
            conds: vec![
                Cond::new(REPLICATING, false, "SingleCluster", one),
                Cond::new(REPLICATION_DEGRADED, false, "SingleCluster", one),
            ],
            ..ReplicationShown::default()
        };
    }
    let Some(observed) = observed else {
        // The conditions of another type are kept by the merge.
        return ReplicationShown {
            pairs: old.replication.clone(),
            seeding: old.seeding.clone(),
            ..ReplicationShown::default()
        };
    };
    let pairs = &observed.pairs;
    let shown = observed.shown_pairs();
    let seeding = observed.shown_seeding();
    let mut events = vec![];
    for s in &observed.seeding {
        if !old.seeding.iter().any(|o| o.cluster == s.cluster) {
            events.push(Note::normal(
                "Seeding",
                "Replicate",
                format!(
                    "cluster {} joined an instance with data: copying every table into it ({})",
                    s.cluster,
                    s.describe()
                ),
            ));
        }
    }
    for o in &old.seeding {
        if !observed.seeding.iter().any(|s| s.cluster == o.cluster) {
            events.push(Note::normal(
                "Seeded",
                "Replicate",
                format!(
                    "cluster {} holds every table: READY ({} entries copied)",
                    o.cluster, o.entries_copied
                ),
            ));
        }
    }
    let worst = pairs
        .iter()
        .map(|p| p.max_delay_seconds)
        .fold(0.0f64, f64::max);
    let mut message =
        format!("{clusters} clusters replicate to each other; the longest wait is {worst:.1} s");
    for s in &observed.seeding {
        message.push_str("; ");
        message.push_str(&s.describe());
    }
    let mut conds = vec![Cond::new(REPLICATING, true, "Replicating", message)];
    match replication::degraded(pairs, replication::DEGRADED_AFTER) {
        Some(why) => {
            let was = conditions::find(&old.conditions, REPLICATION_DEGRADED)
                .is_some_and(|c| c.status == "True");
            if !was {
                events.push(Note::warning(
                    "ReplicationDegraded",
                    "Replicate",
                    why.clone(),
                ));
            }
            conds.push(Cond::new(REPLICATION_DEGRADED, true, "Behind", why));
        }
        None => conds.push(Cond::new(
            REPLICATION_DEGRADED,
            false,
            "AsExpected",
            format!(
                "every cluster has every other cluster's writes older than {} s",
                replication::DEGRADED_AFTER.as_secs()
            ),
        )),
    }
    ReplicationShown {
        conds,
        pairs: shown,
        seeding,
        events,
    }
}

/// The status of an instance whose spec is refused: not ready, degraded, its clusters still
/// shown; a warning event when the message is new.
pub fn refused(
    instance: &Instance,
    clusters: &[Cluster],
    refused: &Refused,
) -> Outcome<InstanceStatus> {
    let Refused::InvalidSpec(problems) = refused;
    let generation = instance.metadata.generation;
    let old = instance.status.clone().unwrap_or_default();
    let message = rules::describe(problems);
    let events = invalid_spec_warning(&old.conditions, DEGRADED, &message);
    let conds = [
        Cond::new(READY, false, "InvalidSpec", message.clone()),
        Cond::new(DEGRADED, true, "InvalidSpec", message),
    ];
    Outcome {
        status: InstanceStatus {
            conditions: conditions::merge(&old.conditions, &conds, generation),
            observed_generation: generation,
            clusters: cluster_summaries(clusters),
            ..old
        },
        events,
        requeue: Action::await_change(),
    }
}

/// The status of a protected instance being deleted: `DeletionBlocked` (and a warning event
/// the first time) until the spec turns protection off; the rest of the status stays as it
/// was.
pub fn deletion_blocked(instance: &Instance) -> Outcome<InstanceStatus> {
    let old = instance.status.clone().unwrap_or_default();
    let message = "deletion is blocked: spec.deletionProtection is true; set it to false to let the deletion finish";
    let events = if conditions::find(&old.conditions, DELETION_BLOCKED).is_none() {
        vec![Note::warning(DELETION_BLOCKED, "Delete", message)]
    } else {
        vec![]
    };
    let conds = [Cond::new(
        DELETION_BLOCKED,
        true,
        "DeletionProtection",
        message,
    )];
    Outcome {
        status: InstanceStatus {
            conditions: conditions::merge(&old.conditions, &conds, instance.metadata.generation),
            ..old
        },
        events,
        requeue: Action::await_change(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::ClusterStatus;
    use crate::lifecycle::replication::{Pair, Seeding};
    use crate::rules::Problem;
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn instance(generation: i64, status: Option<InstanceStatus>) -> Instance {
        let mut i: Instance = serde_norway::from_str(
            "metadata: {name: orders-prod, namespace: shop}\nspec: {displayName: Orders, deletionProtection: true}\n",
        )
        .unwrap();
        i.metadata.generation = Some(generation);
        i.status = status;
        i
    }

    fn cluster(name: &str, ready: bool, serve: i32, ready_nodes: i32) -> Cluster {
        let mut c: Cluster = serde_norway::from_str(&format!(
            "metadata: {{name: {name}, namespace: shop}}\nspec: {{instanceRef: orders-prod, serveNodes: {serve}, location: europe-west1-b}}\n"
        ))
        .unwrap();
        c.status = Some(ClusterStatus {
            conditions: conditions::merge(&[], &[Cond::new(READY, ready, "x", "x")], Some(1)),
            serve_nodes: serve,
            ready_nodes,
            ..ClusterStatus::default()
        });
        c
    }

    fn service() -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some("orders-prod".into()),
                ..ObjectMeta::default()
            },
            ..Service::default()
        }
    }

    /// What the apply left: the client Service and an etcd StatefulSet with `ready` members
    /// ready.
    fn applied_with(ready: i32) -> Applied {
        let sts = StatefulSet {
            status: Some(k8s_openapi::api::apps::v1::StatefulSetStatus {
                replicas: 3,
                ready_replicas: Some(ready),
                ..Default::default()
            }),
            ..StatefulSet::default()
        };
        Applied {
            service: service(),
            metadata_store: Some(sts),
        }
    }

    fn cond<'a>(status: &'a InstanceStatus, type_: &str) -> (&'a str, &'a str, &'a str) {
        let c = conditions::find(&status.conditions, type_)
            .unwrap_or_else(|| panic!("no {type_} in {status:?}"));
        (c.status.as_str(), c.reason.as_str(), c.message.as_str())
    }

    #[test]
    fn replication_is_reported_per_pair_and_a_degraded_one_warns_once() {
        let pair = |delay: f64, pending: u64| Replication {
            pairs: vec![Pair {
                source: "c1".into(),
                destination: "c2".into(),
                max_delay_seconds: delay,
                pending_entries: pending,
            }],
            seeding: vec![],
            leaving: vec![],
        };
        let old = InstanceStatus::default();
        let shown = replication_status(&old, 1, None);
        assert_eq!(
            (shown.conds[0].status, shown.conds[0].reason),
            (false, "SingleCluster")
        );
        assert!(shown.pairs.is_empty() && shown.events.is_empty());

        let fine = pair(0.2, 3);
        let shown = replication_status(&old, 2, Some(&fine));
        let conds = &shown.conds;
        assert_eq!((conds[0].type_, conds[0].status), (REPLICATING, true));
        assert_eq!(
            (conds[1].type_, conds[1].status),
            (REPLICATION_DEGRADED, false)
        );
        assert_eq!(
            (
                shown.pairs[0].max_delay_seconds,
                shown.pairs[0].pending_writes
            ),
            (0.2, 3)
        );
        assert!(shown.events.is_empty());

        let behind = pair(75.0, 40);
        let shown = replication_status(&old, 2, Some(&behind));
        let conds = shown.conds;
        assert_eq!((conds[1].status, conds[1].reason), (true, "Behind"));
        assert!(
            conds[1].message.contains("c1 → c2: 40 write(s) waiting"),
            "{}",
            conds[1].message
        );
        assert_eq!(shown.events.len(), 1);
        // Already degraded: no second warning.
        let degraded = InstanceStatus {
            conditions: conditions::merge(&[], &conds, Some(1)),
            ..InstanceStatus::default()
        };
        assert!(
            replication_status(&degraded, 2, Some(&behind))
                .events
                .is_empty()
        );
        // Not known now: the pairs shown stay, no condition is rewritten.
        let shown_before = InstanceStatus {
            replication: vec![ReplicationStatus {
                source: "c1".into(),
                destination: "c2".into(),
                max_delay_seconds: 1.0,
                pending_writes: 1,
            }],
            ..InstanceStatus::default()
        };
        let shown = replication_status(&shown_before, 2, None);
        assert!(shown.conds.is_empty());
        assert_eq!(shown.pairs, shown_before.replication);
    }

    #[test]
    fn a_seeded_cluster_is_shown_with_an_event_when_it_begins_and_ends() {
        let seeding = Replication {
            pairs: vec![],
            seeding: vec![Seeding {
                cluster: "c3".into(),
                source: Some("c1".into()),
                tables_left: 2,
                rows: 10,
                bytes: 100,
            }],
            leaving: vec![],
        };
        let old = InstanceStatus::default();
        let shown = replication_status(&old, 3, Some(&seeding));
        assert_eq!(shown.seeding.len(), 1);
        assert_eq!(shown.seeding[0].tables_left, 2);
        assert!(
            shown.conds[0]
                .message
                .contains("c3: initializing, copying from c1"),
            "{}",
            shown.conds[0].message
        );
        assert_eq!(shown.events.len(), 1);
        assert_eq!(shown.events[0].reason, "Seeding");
        let during = InstanceStatus {
            seeding: shown.seeding.clone(),
            ..InstanceStatus::default()
        };
        assert!(
            replication_status(&during, 3, Some(&seeding))
                .events
                .is_empty()
        );
        let done = replication_status(&during, 3, Some(&Replication::default()));
        assert!(done.seeding.is_empty());
        assert_eq!(done.events.len(), 1);
        assert_eq!(done.events[0].reason, "Seeded");
    }

    #[test]
    fn health_is_ready_with_one_ready_cluster_and_degraded_while_some_are_not() {
        let none = health(&[]);
        assert_eq!((none[0].status, none[0].reason), (false, "NoClusters"));
        assert_eq!((none[1].status, none[1].reason), (false, "NoClusters"));
        let half = health(&cluster_summaries(&[
            cluster("orders-c2", false, 1, 0),
            cluster("orders-c1", true, 1, 1),
        ]));
        assert_eq!(
            (half[0].status, half[0].reason, half[0].message.as_str()),
            (true, "ClustersReady", "1/2 clusters ready")
        );
        assert_eq!(
            (half[1].status, half[1].message.as_str()),
            (true, "not ready: orders-c2")
        );
        let down = health(&cluster_summaries(&[cluster("orders-c1", false, 1, 0)]));
        assert_eq!(
            (down[0].status, down[0].reason),
            (false, "ClustersNotReady")
        );
        assert_eq!((down[1].status, down[1].reason), (false, "AsExpected"));
    }

    #[test]
    fn an_applied_instance_reports_its_endpoint_clusters_and_progress() {
        // A deletion that was blocked, then cancelled by removing deletionTimestamp's cause.
        let blocked = deletion_blocked(&instance(1, None)).status;
        let i = instance(3, Some(blocked));
        let clusters = [
            cluster("orders-c2", true, 3, 1),
            cluster("orders-c1", true, 1, 1),
        ];
        let v = ValidatedInstance {
            instance: &i,
            clusters: clusters.iter().collect(),
            etcd_members: 3,
            replication: None,
        };
        let out = applied(&v, &applied_with(3));
        let s = &out.status;
        assert_eq!(s.endpoint.as_deref(), Some("orders-prod.shop.svc:8086"));
        assert_eq!(
            s.resource_name.as_deref(),
            Some("projects/shop/instances/orders-prod")
        );
        assert_eq!(s.observed_generation, Some(3));
        let names: Vec<&str> = s.clusters.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["orders-c1", "orders-c2"]);
        assert_eq!(s.clusters[0].location.as_deref(), Some("europe-west1-b"));
        assert_eq!(
            cond(s, PROGRESSING),
            (
                "True",
                "Clusters",
                "orders-c1: 1/1 nodes ready, orders-c2: 1/3 nodes ready"
            )
        );
        assert_eq!(cond(s, READY).1, "ClustersReady");
        assert!(conditions::find(&s.conditions, DELETION_BLOCKED).is_none());
        assert!(
            s.conditions
                .iter()
                .all(|c| c.observed_generation == Some(3))
        );
        assert!(out.events.is_empty());
        // Two clusters: looked at every 30 s for their replication.
        assert_eq!(out.requeue, Action::requeue(Duration::from_secs(30)));
        assert_eq!(
            cond(s, METADATA_STORE_READY),
            (
                "True",
                "AllMembersReady",
                "3/3 etcd members of orders-prod-meta ready"
            )
        );
        let store = s.metadata_store.as_ref().unwrap();
        assert_eq!(
            store.endpoints,
            [
                "https://orders-prod-meta-0.orders-prod-meta.shop.svc:2379",
                "https://orders-prod-meta-1.orders-prod-meta.shop.svc:2379",
                "https://orders-prod-meta-2.orders-prod-meta.shop.svc:2379"
            ]
        );
        assert_eq!(
            (store.external, store.members, store.ready_members),
            (false, Some(3), Some(3))
        );
    }

    #[test]
    fn the_metadata_store_is_ready_with_a_quorum_of_members() {
        let i = instance(1, None);
        let v = ValidatedInstance {
            instance: &i,
            clusters: vec![],
            etcd_members: 3,
            replication: None,
        };
        let two = applied(&v, &applied_with(2));
        assert_eq!(cond(&two.status, METADATA_STORE_READY).1, "QuorumReady");
        assert_eq!(cond(&two.status, METADATA_STORE_READY).0, "True");
        let one = applied(&v, &applied_with(1));
        assert_eq!(
            cond(&one.status, METADATA_STORE_READY),
            (
                "False",
                "NoQuorum",
                "1/3 etcd members of orders-prod-meta ready, 2 needed: tablet servers cannot register or change tablets until then"
            )
        );
        assert_eq!(one.requeue, Action::requeue(Duration::from_secs(10)));

        // An existing etcd: its endpoints, not checked.
        let mut external = instance(1, None);
        external.spec.metadata_store = Some(crate::crd::MetadataStore {
            endpoints: vec!["http://etcd.infra.svc:2379".into()],
        });
        let (store, c) = metadata_store(&external, 3, None);
        assert_eq!((c.status, c.reason), (true, "ExistingEtcd"));
        assert_eq!(store.endpoints, ["http://etcd.infra.svc:2379"]);
        assert!(store.external && store.members.is_none());
    }

    #[test]
    fn an_invalid_instance_is_degraded_warned_about_once_and_keeps_its_endpoint() {
        let old = InstanceStatus {
            endpoint: Some("orders-prod.shop.svc:8086".into()),
            ..InstanceStatus::default()
        };
        let problems = Refused::InvalidSpec(vec![Problem {
            field: "spec.displayName".into(),
            message: "must be 4 to 30 characters, has 3".into(),
        }]);
        let clusters = [cluster("orders-c1", true, 1, 1)];
        let out = refused(&instance(2, Some(old)), &clusters, &problems);
        let message = "spec.displayName: must be 4 to 30 characters, has 3";
        assert_eq!(cond(&out.status, READY), ("False", "InvalidSpec", message));
        assert_eq!(
            cond(&out.status, DEGRADED),
            ("True", "InvalidSpec", message)
        );
        assert_eq!(out.status.observed_generation, Some(2));
        assert_eq!(out.status.clusters.len(), 1);
        assert_eq!(
            out.status.endpoint.as_deref(),
            Some("orders-prod.shop.svc:8086")
        );
        assert_eq!(out.events.len(), 1);
        assert_eq!(out.requeue, Action::await_change());
        let again = refused(&instance(2, Some(out.status)), &clusters, &problems);
        assert!(again.events.is_empty());
    }

    #[test]
    fn a_protected_deletion_is_reported_once_and_observes_no_new_generation() {
        let old = InstanceStatus {
            observed_generation: Some(1),
            ..InstanceStatus::default()
        };
        let out = deletion_blocked(&instance(2, Some(old)));
        assert_eq!(
            cond(&out.status, DELETION_BLOCKED),
            (
                "True",
                "DeletionProtection",
                "deletion is blocked: spec.deletionProtection is true; set it to false to let the deletion finish"
            )
        );
        assert_eq!(out.status.observed_generation, Some(1));
        assert_eq!(out.events.len(), 1);
        assert_eq!(out.events[0].reason, "DeletionBlocked");
        assert_eq!(out.requeue, Action::await_change());
        assert!(
            deletion_blocked(&instance(2, Some(out.status)))
                .events
                .is_empty()
        );
    }
}
