//! Cluster, stage 5 (pure): the status, from the validated spec, the StatefulSet as applied
//! and what the tablet servers serve — or from why the reconcile stopped.

use std::time::Duration;

use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetStatus};
use kube::ResourceExt;
use kube::runtime::controller::Action;

use super::dereference::Serving;
use super::validate::{Refused, ValidatedCluster};
use crate::build::{self, OperatorConfig};
use crate::conditions::{self, Cond, DEGRADED, PROGRESSING, READY};
use crate::controller::{Note, Outcome, invalid_spec_warning};
use crate::crd::{Cluster, ClusterStatus};
use crate::validate;

/// Condition type that says whether the cluster's tablet servers form one database.
pub const SINGLE_DATABASE: &str = "SingleDatabase";

/// How soon a cluster is looked at again once its rollout has settled, and while it has not.
const SETTLED_REQUEUE: Duration = Duration::from_secs(300);
const ROLLING_REQUEUE: Duration = Duration::from_secs(10);
/// How soon a cluster whose Instance does not exist is looked at again.
const INSTANCE_REQUEUE: Duration = Duration::from_secs(30);

/// The status of a cluster the reconcile refused to apply. An invalid spec keeps `Ready` as
/// the running servers make it (they keep serving) and is `Degraded`; it is reported in a
/// warning event when its message is new.
pub fn refused(cluster: &Cluster, refused: &Refused) -> Outcome<ClusterStatus> {
    let generation = cluster.metadata.generation;
    let old = cluster.status.clone().unwrap_or_default();
    let (conds, events, requeue) = match refused {
        Refused::InvalidSpec(problems) => {
            let message = validate::describe(problems);
            let events = invalid_spec_warning(&old.conditions, READY, &message);
            let conds = vec![
                Cond::new(READY, old.ready_nodes > 0, "InvalidSpec", message.clone()),
                Cond::new(DEGRADED, true, "InvalidSpec", message),
            ];
            (conds, events, Action::await_change())
        }
        Refused::InstanceNotFound => {
            let message = format!(
                "Instance {:?} does not exist in namespace {:?}",
                cluster.spec.instance_ref,
                cluster.namespace().unwrap_or_default()
            );
            let conds = vec![Cond::new(READY, false, "InstanceNotFound", message)];
            (conds, vec![], Action::requeue(INSTANCE_REQUEUE))
        }
    };
    Outcome {
        status: ClusterStatus {
            conditions: conditions::merge(&old.conditions, &conds, generation),
            observed_generation: generation,
            ..old
        },
        events,
        requeue,
    }
}

/// The status of an applied cluster: its rollout (`statefulset` as the apply returned it),
/// what it serves, and the conditions about what this operator version does not do yet.
pub fn applied(
    validated: &ValidatedCluster<'_>,
    statefulset: &StatefulSet,
    serving: Serving,
    config: &OperatorConfig,
    pdb_supported: bool,
) -> Outcome<ClusterStatus> {
    let cluster = validated.cluster;
    let desired = validated.desired_nodes;
    let old = cluster.status.clone().unwrap_or_default();
    let observed = statefulset.status.clone().unwrap_or_default();

    let (settled, mut conds) = rollout(desired, &observed, statefulset.metadata.generation);
    conds.push(Cond::new(
        DEGRADED,
        false,
        "AsExpected",
        "the spec is valid and applied",
    ));
    conds.push(disruption_budget_condition(pdb_supported));
    let single = single_database_condition(desired);
    let was_single =
        conditions::find(&old.conditions, SINGLE_DATABASE).is_none_or(|c| c.status == "True");
    let mut events = vec![];
    if !single.status && was_single {
        events.push(Note::warning(
            single.reason,
            "Validate",
            single.message.clone(),
        ));
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

    let name = cluster.name_any();
    let status = ClusterStatus {
        conditions: conditions::merge(&old.conditions, &conds, cluster.metadata.generation),
        observed_generation: cluster.metadata.generation,
        serve_nodes: observed.replicas,
        ready_nodes: observed.ready_replicas.unwrap_or(0),
        selector: Some(build::selector_string(&build::cluster_selector(&name))),
        storage_class_name: Some(build::storage_class(cluster, config)),
        tablets: serving.tablets.or(old.tablets),
        storage_used_bytes: settled_storage(serving.bytes, old.storage_used_bytes),
    };
    Outcome {
        status,
        events,
        requeue: Action::requeue(if settled {
            SETTLED_REQUEUE
        } else {
            ROLLING_REQUEUE
        }),
    }
}

/// `Ready` and `Progressing` from the StatefulSet's rollout towards `desired` replicas, and
/// whether it has settled (every replica ready and updated, the latest generation observed).
/// The cluster is ready as soon as one tablet server is.
pub fn rollout(
    desired: i32,
    observed: &StatefulSetStatus,
    generation: Option<i64>,
) -> (bool, Vec<Cond>) {
    let ready = observed.ready_replicas.unwrap_or(0);
    let updated = observed.updated_replicas.unwrap_or(0);
    let settled = ready == desired
        && observed.replicas == desired
        && updated == desired
        && observed.observed_generation == generation;
    let ready_cond = if settled {
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
    };
    let progressing = Cond::new(
        PROGRESSING,
        !settled,
        if settled { "Stable" } else { "RollingOut" },
        format!(
            "{} running, {updated} updated, {ready} ready of {desired} desired",
            observed.replicas
        ),
    );
    (settled, vec![ready_cond, progressing])
}

/// Whether evictions are limited: the PodDisruptionBudget needs policy/v1.
pub fn disruption_budget_condition(pdb_supported: bool) -> Cond {
    if pdb_supported {
        Cond::new(
            "DisruptionBudget",
            true,
            "Applied",
            "at most one tablet server may be evicted at a time",
        )
    } else {
        Cond::new(
            "DisruptionBudget",
            false,
            "Unsupported",
            "the API server does not serve policy/v1 PodDisruptionBudgets (Kubernetes < 1.21): voluntary evictions are not limited",
        )
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::Problem;

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

    fn cluster(spec: &str, generation: i64, status: Option<ClusterStatus>) -> Cluster {
        let mut c: Cluster = serde_norway::from_str(&format!(
            "metadata: {{name: orders-c1, namespace: shop}}\nspec: {spec}\n"
        ))
        .unwrap();
        c.metadata.generation = Some(generation);
        c.status = status;
        c
    }

    fn sts(generation: i64, status: StatefulSetStatus) -> StatefulSet {
        let mut s = StatefulSet::default();
        s.metadata.generation = Some(generation);
        s.status = Some(status);
        s
    }

    fn rolled_out(n: i32, sts_generation: i64) -> StatefulSetStatus {
        StatefulSetStatus {
            replicas: n,
            ready_replicas: Some(n),
            updated_replicas: Some(n),
            observed_generation: Some(sts_generation),
            ..StatefulSetStatus::default()
        }
    }

    fn cond<'a>(status: &'a ClusterStatus, type_: &str) -> (&'a str, &'a str, Option<i64>) {
        let c = conditions::find(&status.conditions, type_)
            .unwrap_or_else(|| panic!("no {type_} in {status:?}"));
        (c.status.as_str(), c.reason.as_str(), c.observed_generation)
    }

    fn validated(cluster: &Cluster, current: Option<i32>) -> ValidatedCluster<'_> {
        ValidatedCluster {
            cluster,
            current_nodes: current,
            desired_nodes: build::desired_serve_nodes(cluster, current),
        }
    }

    #[test]
    fn a_settled_rollout_is_ready_stable_and_looked_at_rarely() {
        let c = cluster("{instanceRef: orders, serveNodes: 1}", 4, None);
        let out = applied(
            &validated(&c, Some(1)),
            &sts(2, rolled_out(1, 2)),
            Serving {
                tablets: Some(2),
                bytes: Some(4096),
            },
            &OperatorConfig::default(),
            true,
        );
        let s = &out.status;
        assert_eq!(cond(s, READY), ("True", "AllNodesReady", Some(4)));
        assert_eq!(cond(s, PROGRESSING), ("False", "Stable", Some(4)));
        assert_eq!(cond(s, DEGRADED), ("False", "AsExpected", Some(4)));
        assert_eq!(cond(s, "DisruptionBudget"), ("True", "Applied", Some(4)));
        assert_eq!(cond(s, SINGLE_DATABASE), ("True", "SingleNode", Some(4)));
        assert!(conditions::find(&s.conditions, "Autoscaling").is_none());
        assert_eq!(s.observed_generation, Some(4));
        assert_eq!((s.serve_nodes, s.ready_nodes), (1, 1));
        assert_eq!(
            s.selector.as_deref(),
            Some(
                "app.kubernetes.io/component=tablet-server,app.kubernetes.io/name=basalt,basalt.dev/cluster=orders-c1"
            )
        );
        assert_eq!(s.storage_class_name.as_deref(), Some("ssd"));
        assert_eq!((s.tablets, s.storage_used_bytes), (Some(2), Some(4096)));
        assert!(out.events.is_empty());
        assert_eq!(out.requeue, Action::requeue(Duration::from_secs(300)));
    }

    #[test]
    fn a_rollout_in_progress_is_ready_from_one_server_and_looked_at_soon() {
        let c = cluster("{instanceRef: orders, serveNodes: 3}", 1, None);
        let v = validated(&c, None);
        let starting = StatefulSetStatus {
            replicas: 3,
            ready_replicas: Some(0),
            ..StatefulSetStatus::default()
        };
        let cfg = OperatorConfig::default();
        let out = applied(&v, &sts(1, starting), Serving::default(), &cfg, true);
        assert_eq!(
            cond(&out.status, READY),
            ("False", "NodesStarting", Some(1))
        );
        assert_eq!(
            conditions::find(&out.status.conditions, READY)
                .unwrap()
                .message,
            "0/3 tablet servers ready"
        );
        assert_eq!(
            cond(&out.status, PROGRESSING),
            ("True", "RollingOut", Some(1))
        );
        assert_eq!(out.requeue, Action::requeue(Duration::from_secs(10)));

        let one_ready = StatefulSetStatus {
            replicas: 3,
            ready_replicas: Some(1),
            updated_replicas: Some(3),
            observed_generation: Some(1),
            ..StatefulSetStatus::default()
        };
        let out = applied(&v, &sts(1, one_ready), Serving::default(), &cfg, true);
        assert_eq!(cond(&out.status, READY), ("True", "NodesStarting", Some(1)));
        assert_eq!(
            conditions::find(&out.status.conditions, PROGRESSING)
                .unwrap()
                .message,
            "3 running, 3 updated, 1 ready of 3 desired"
        );
        // Every replica ready but the StatefulSet controller has not seen the latest spec.
        let stale = rolled_out(3, 1);
        let (settled, _) = rollout(3, &stale, Some(2));
        assert!(!settled);
    }

    #[test]
    fn independent_servers_are_warned_about_once_when_they_appear() {
        let c = cluster("{instanceRef: orders, serveNodes: 3}", 2, None);
        let cfg = OperatorConfig::default();
        let first = applied(
            &validated(&c, Some(1)),
            &sts(2, rolled_out(3, 2)),
            Serving::default(),
            &cfg,
            true,
        );
        assert_eq!(first.events.len(), 1);
        assert_eq!(
            (first.events[0].reason, first.events[0].type_),
            (
                "IndependentServers",
                kube::runtime::events::EventType::Warning
            )
        );
        assert_eq!(
            cond(&first.status, SINGLE_DATABASE),
            ("False", "IndependentServers", Some(2))
        );
        // The next reconcile sees the condition already False: no second warning.
        let again = cluster(
            "{instanceRef: orders, serveNodes: 3}",
            2,
            Some(first.status),
        );
        let second = applied(
            &validated(&again, Some(3)),
            &sts(2, rolled_out(3, 2)),
            Serving::default(),
            &cfg,
            true,
        );
        assert!(second.events.is_empty(), "{:?}", second.events);
    }

    #[test]
    fn no_policy_v1_and_autoscaling_are_reported_as_conditions() {
        let c = cluster(
            "{instanceRef: orders, storageType: HDD, autoscaling: {minServeNodes: 2, maxServeNodes: 5, cpuUtilizationPercent: 50}}",
            1,
            None,
        );
        let out = applied(
            &validated(&c, Some(7)),
            &sts(1, rolled_out(5, 1)),
            Serving::default(),
            &OperatorConfig::default(),
            false,
        );
        assert_eq!(
            cond(&out.status, "DisruptionBudget"),
            ("False", "Unsupported", Some(1))
        );
        assert_eq!(
            cond(&out.status, "Autoscaling"),
            ("False", "NotRunning", Some(1))
        );
        assert!(
            conditions::find(&out.status.conditions, "Autoscaling")
                .unwrap()
                .message
                .contains("runs 5 node(s), within [2, 5]")
        );
        assert_eq!(out.status.storage_class_name.as_deref(), Some("hdd"));
    }

    #[test]
    fn served_figures_fall_back_to_the_last_report_and_settle() {
        let old = ClusterStatus {
            tablets: Some(4),
            storage_used_bytes: Some(1_000_000_000),
            ..ClusterStatus::default()
        };
        let c = cluster("{instanceRef: orders, serveNodes: 1}", 1, Some(old));
        let v = validated(&c, Some(1));
        let cfg = OperatorConfig::default();
        let silent = applied(
            &v,
            &sts(1, rolled_out(1, 1)),
            Serving::default(),
            &cfg,
            true,
        );
        assert_eq!(
            (silent.status.tablets, silent.status.storage_used_bytes),
            (Some(4), Some(1_000_000_000))
        );
        let grown = Serving {
            tablets: Some(6),
            bytes: Some(1_005_000_000),
        };
        let out = applied(&v, &sts(1, rolled_out(1, 1)), grown, &cfg, true);
        assert_eq!(
            (out.status.tablets, out.status.storage_used_bytes),
            (Some(6), Some(1_000_000_000))
        );
    }

    #[test]
    fn an_invalid_spec_keeps_ready_as_the_servers_make_it_and_is_degraded() {
        let problems = vec![Problem {
            field: "spec.storageType".into(),
            message: "is immutable: the cluster runs on Ssd; create a new cluster to change the storage type".into(),
        }];
        let running = ClusterStatus {
            ready_nodes: 1,
            tablets: Some(3),
            ..ClusterStatus::default()
        };
        let c = cluster("{instanceRef: orders, serveNodes: 1}", 2, Some(running));
        let out = refused(&c, &Refused::InvalidSpec(problems.clone()));
        assert_eq!(cond(&out.status, READY), ("True", "InvalidSpec", Some(2)));
        assert_eq!(
            cond(&out.status, DEGRADED),
            ("True", "InvalidSpec", Some(2))
        );
        assert_eq!(
            conditions::find(&out.status.conditions, DEGRADED)
                .unwrap()
                .message,
            "spec.storageType: is immutable: the cluster runs on Ssd; create a new cluster to change the storage type"
        );
        assert_eq!(out.status.observed_generation, Some(2));
        assert_eq!(out.status.tablets, Some(3), "the rest of the status stays");
        assert_eq!(out.events.len(), 1);
        assert_eq!(out.events[0].reason, "InvalidSpec");
        assert_eq!(out.requeue, Action::await_change());
        // The same problem again: no second event.
        let again = cluster("{instanceRef: orders, serveNodes: 1}", 2, Some(out.status));
        assert!(
            refused(&again, &Refused::InvalidSpec(problems))
                .events
                .is_empty()
        );

        let idle = cluster("{instanceRef: orders, serveNodes: 1}", 2, None);
        let out = refused(&idle, &Refused::InvalidSpec(vec![]));
        assert_eq!(cond(&out.status, READY).0, "False");
    }

    #[test]
    fn a_missing_instance_is_not_ready_and_looked_at_again() {
        let c = cluster("{instanceRef: orders-prod, serveNodes: 1}", 1, None);
        let out = refused(&c, &Refused::InstanceNotFound);
        assert_eq!(
            cond(&out.status, READY),
            ("False", "InstanceNotFound", Some(1))
        );
        assert_eq!(
            conditions::find(&out.status.conditions, READY)
                .unwrap()
                .message,
            "Instance \"orders-prod\" does not exist in namespace \"shop\""
        );
        assert!(conditions::find(&out.status.conditions, DEGRADED).is_none());
        assert!(out.events.is_empty());
        assert_eq!(out.requeue, Action::requeue(Duration::from_secs(30)));
    }
}
