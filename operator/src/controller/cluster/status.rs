//! Cluster, stage 5 (pure): the status, from the validated spec, the StatefulSet as applied,
//! what the tablet servers serve and the tablet map in the metadata store — or from why the
//! reconcile stopped.

use std::collections::BTreeMap;
use std::time::Duration;

use basalt_master::model::TabletState;
use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetStatus};
use kube::ResourceExt;
use kube::runtime::controller::Action;

use super::dereference::{Placement, Serving};
use super::scale_in::{SCALE_IN_BLOCKED, scale_in};
use super::validate::{Refused, ValidatedCluster};
use crate::build::{self, OperatorConfig};
use crate::conditions::{self, Cond, DEGRADED, PROGRESSING, READY};
use crate::controller::{Note, Outcome, invalid_spec_warning};
use crate::crd::{Cluster, ClusterAutoscalerStatus, ClusterNodeStatus, ClusterStatus};
use crate::rules;

/// The condition that names the cluster's lost tablets (state `lost` in the tablet map).
pub const DATA_LOSS: &str = "DataLoss";
/// A condition earlier operator versions set (tablet servers were separate databases); gone.
const SINGLE_DATABASE: &str = "SingleDatabase";
/// How many lost tablets the DataLoss message names (the rest are counted).
const LOST_NAMED: usize = 10;

/// How soon a cluster is looked at again once its rollout has settled, and while it has not.
const SETTLED_REQUEUE: Duration = Duration::from_secs(300);
const ROLLING_REQUEUE: Duration = Duration::from_secs(10);
/// How soon a cluster is looked at again while a scale-in is under way (its drain progresses in
/// the metadata store, which the controller does not watch).
const SCALE_IN_REQUEUE: Duration = Duration::from_secs(3);
/// How soon an autoscaled cluster is looked at again: the autoscaler's decisions are recorded
/// in the metadata store, which the controller does not watch.
const AUTOSCALING_REQUEUE: Duration = Duration::from_secs(5);
/// The autoscaler's conditions (named as a HorizontalPodAutoscaler's).
pub const SCALING_ACTIVE: &str = "ScalingActive";
pub const SCALING_LIMITED: &str = "ScalingLimited";
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
            let message = rules::describe(problems);
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
/// what it serves, the tablets per node and lost tablets from the metadata store (`placement`;
/// None: not readable now, the status keeps what it said), a scale-in's progress
/// ([`scale_in`]), and the conditions about what this operator version does not do yet.
pub fn applied(
    validated: &ValidatedCluster<'_>,
    statefulset: &StatefulSet,
    serving: Serving,
    placement: Option<&Placement>,
    config: &OperatorConfig,
    pdb_supported: bool,
) -> Outcome<ClusterStatus> {
    let cluster = validated.cluster;
    let desired = validated.size.servers;
    let old = cluster.status.clone().unwrap_or_default();
    let observed = statefulset.status.clone().unwrap_or_default();

    let (settled, mut conds) = rollout(desired, &observed, statefulset.metadata.generation);
    let mut events = vec![];
    let loss = placement.map(|p| data_loss_condition(validated, p));
    match &loss {
        Some(loss) if loss.status => {
            conds.push(Cond::new(
                DEGRADED,
                true,
                "TabletsLost",
                loss.message.clone(),
            ));
            let was_lost =
                conditions::find(&old.conditions, DATA_LOSS).is_some_and(|c| c.status == "True");
            if !was_lost {
                events.push(Note::warning(
                    "TabletsLost",
                    "Observe",
                    loss.message.clone(),
                ));
            }
        }
        _ => conds.push(Cond::new(
            DEGRADED,
            false,
            "AsExpected",
            "the spec is valid and applied",
        )),
    }
    conds.extend(loss);
    let running = desired.max(observed.replicas);
    let scaling = scale_in(validated, running, placement, &old);
    conds.extend(scaling.conds.iter().cloned());
    events.extend(scaling.events.iter().cloned());
    conds.push(disruption_budget_condition(pdb_supported));
    let autoscaled = autoscaling(cluster, placement, &old);
    conds.extend(autoscaled.conds);
    events.extend(autoscaled.events);

    let name = cluster.name_any();
    let status = ClusterStatus {
        conditions: conditions::merge(&old.conditions, &conds, cluster.metadata.generation)
            .into_iter()
            .filter(|c| c.type_ != SINGLE_DATABASE && c.type_ != SCALE_IN_BLOCKED)
            .collect(),
        observed_generation: cluster.metadata.generation,
        serve_nodes: observed.replicas,
        ready_nodes: observed.ready_replicas.unwrap_or(0),
        selector: Some(build::selector_string(&build::cluster_selector(&name))),
        storage_class_name: Some(build::storage_class(cluster, config)),
        tablets: serving.tablets.or(old.tablets),
        storage_used_bytes: settled_storage(serving.bytes, old.storage_used_bytes),
        nodes: placement.map(nodes).unwrap_or(old.nodes),
        scale_in: scaling.status.clone(),
        autoscaler: autoscaled.status,
    };
    Outcome {
        status,
        events,
        requeue: Action::requeue(if scaling.in_progress() {
            SCALE_IN_REQUEUE
        } else if cluster.spec.autoscaling.is_some() {
            AUTOSCALING_REQUEUE
        } else if settled {
            SETTLED_REQUEUE
        } else {
            ROLLING_REQUEUE
        }),
    }
}

/// What the status says of the autoscaler.
pub struct Autoscaled {
    pub conds: Vec<Cond>,
    pub events: Vec<Note>,
    pub status: Option<ClusterAutoscalerStatus>,
}

/// The autoscaler's decision (as the master recorded it in the metadata store: `placement`;
/// None: not readable now, the status keeps what it said) in the status: the decision and its
/// inputs, `ScalingActive` (whether it decides, and from which metrics: Prometheus, or the
/// servers' own reports and why), `ScalingLimited` (the bounds hold it back), an event when
/// it changes the node count and a warning when it becomes limited. Nothing without
/// `spec.autoscaling`. Pure.
pub fn autoscaling(
    cluster: &Cluster,
    placement: Option<&Placement>,
    old: &ClusterStatus,
) -> Autoscaled {
    let mut out = Autoscaled {
        conds: vec![],
        events: vec![],
        status: None,
    };
    let Some(bounds) = &cluster.spec.autoscaling else {
        return out;
    };
    let record = match placement {
        Some(p) => p.autoscaler.as_ref(),
        None => {
            out.status = old.autoscaler.clone();
            return out;
        }
    };
    let Some(r) = record else {
        out.conds.push(Cond::new(
            SCALING_ACTIVE,
            false,
            "Pending",
            "the instance's master has not decided on this cluster's size yet",
        ));
        return out;
    };
    let held = r.held_reason.as_deref();
    let source = match r.source_message.as_deref() {
        Some(why) => format!("from the tablet servers' own reports ({why})"),
        None => "from Prometheus".to_string(),
    };
    match held {
        Some("NoMetrics") => out.conds.push(Cond::new(
            SCALING_ACTIVE,
            false,
            reason(held.unwrap_or_default()),
            r.held_message.clone().unwrap_or_default(),
        )),
        _ => out.conds.push(Cond::new(
            SCALING_ACTIVE,
            true,
            if r.source_message.is_some() {
                "ServerReports"
            } else {
                "Prometheus"
            },
            format!(
                "the autoscaler samples the cluster's load {source}{}",
                r.held_message
                    .as_deref()
                    .map(|m| format!("; {m}"))
                    .unwrap_or_default()
            ),
        )),
    }
    let limited = matches!(held, Some("MaxServeNodesReached" | "MinServeNodesReached"));
    let limited_message = r.held_message.clone().unwrap_or_default();
    out.conds.push(if limited {
        Cond::new(
            SCALING_LIMITED,
            true,
            reason(held.unwrap_or_default()),
            limited_message.clone(),
        )
    } else {
        Cond::new(
            SCALING_LIMITED,
            false,
            "DesiredWithinRange",
            format!(
                "the recommendation ({} node(s)) is within [{}, {}]",
                r.recommended_nodes, bounds.min_serve_nodes, bounds.max_serve_nodes
            ),
        )
    });
    let was_limited =
        conditions::find(&old.conditions, SCALING_LIMITED).is_some_and(|c| c.status == "True");
    // A cluster idle at its minimum is no news: a warning only when the load wants more.
    if limited && !was_limited && held == Some("MaxServeNodesReached") {
        out.events.push(Note::warning(
            "ScalingLimited",
            "Autoscale",
            limited_message,
        ));
    }
    let status = ClusterAutoscalerStatus {
        nodes: r.nodes as i32,
        recommended_nodes: r.recommended_nodes as i32,
        dimension: r.dimension.clone(),
        cpu_utilization_percent: r.cpu_utilization.map(|u| (u * 100.0).round() as i32),
        stored_bytes: r.stored_bytes.map(|b| b.min(i64::MAX as u64) as i64),
        cpu_nodes: r.cpu_nodes.map(|n| n as i32),
        storage_nodes: r.storage_nodes.map(|n| n as i32),
        source: r.source.clone(),
        last_scale_time: r.last_change_unix_ms.and_then(|ms| {
            k8s_openapi::jiff::Timestamp::from_millisecond(ms)
                .ok()
                .map(|t| t.to_string())
        }),
    };
    if let Some(before) = old.autoscaler.as_ref().map(|a| a.nodes)
        && before != status.nodes
    {
        let input = match r.dimension.as_str() {
            "storage" => format!("storage: {} bytes", r.stored_bytes.unwrap_or_default()),
            _ => format!(
                "CPU {} % against a target of {} %",
                status.cpu_utilization_percent.unwrap_or_default(),
                bounds.cpu_utilization_percent
            ),
        };
        out.events.push(Note::normal(
            "Autoscaled",
            "Autoscale",
            format!(
                "the autoscaler set the node count from {before} to {} ({input})",
                status.nodes
            ),
        ));
    }
    out.status = Some(status);
    out
}

/// A condition's reason for one the master recorded.
fn reason(recorded: &str) -> &'static str {
    match recorded {
        "MaxServeNodesReached" => "MaxServeNodesReached",
        "MinServeNodesReached" => "MinServeNodesReached",
        "NoMetrics" => "NoMetrics",
        "Unsettled" => "Unsettled",
        _ => "Held",
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

/// The tablets each server owns: every registered server (by its name, with none if it owns
/// none) and every owner of a tablet that is not registered now (by its store id), in name
/// order. Pure.
pub fn nodes(placement: &Placement) -> Vec<ClusterNodeStatus> {
    let mut by_store: BTreeMap<&str, ClusterNodeStatus> = BTreeMap::new();
    for s in &placement.servers {
        by_store.insert(
            s.store_id.as_str(),
            ClusterNodeStatus {
                name: s.name.clone(),
                store_id: s.store_id.clone(),
                registered: true,
                ..ClusterNodeStatus::default()
            },
        );
    }
    for t in &placement.tablets {
        let node = by_store
            .entry(t.owner.as_str())
            .or_insert_with(|| ClusterNodeStatus {
                name: t.owner.clone(),
                store_id: t.owner.clone(),
                registered: false,
                ..ClusterNodeStatus::default()
            });
        node.tablets += 1;
        if t.state == TabletState::Lost {
            node.lost_tablets += 1;
        }
    }
    let mut out: Vec<ClusterNodeStatus> = by_store.into_values().collect();
    out.sort_by(|a, b| (&a.name, &a.store_id).cmp(&(&b.name, &b.store_id)));
    out
}

/// A row key as a status message shows it: printable ASCII as is, other bytes as `\xNN`.
fn show_key(key: &[u8]) -> String {
    key.iter()
        .map(|&b| match b {
            b'"' | b'\\' => format!("\\{}", b as char),
            0x20..=0x7e => (b as char).to_string(),
            _ => format!("\\x{b:02x}"),
        })
        .collect()
}

/// `DataLoss`: True (reason `TabletsLost`) while tablets of the cluster are lost — their
/// server came back with an empty data directory — naming them (table and row range) and
/// how to accept the loss; False otherwise. Pure.
pub fn data_loss_condition(validated: &ValidatedCluster<'_>, placement: &Placement) -> Cond {
    let lost: Vec<_> = placement
        .tablets
        .iter()
        .filter(|t| t.state == TabletState::Lost)
        .collect();
    if lost.is_empty() {
        return Cond::new(
            DATA_LOSS,
            false,
            "NoLostTablets",
            "every tablet's data is on its owner",
        );
    }
    let mut stores: Vec<&str> = lost.iter().map(|t| t.owner.as_str()).collect();
    stores.sort();
    stores.dedup();
    let named: Vec<String> = lost
        .iter()
        .take(LOST_NAMED)
        .map(|t| {
            let end = match &t.range.end {
                Some(end) => format!("\"{}\")", show_key(end)),
                None => "end]".into(),
            };
            format!(
                "{} [\"{}\", {end} of store {}",
                t.table,
                show_key(&t.range.start),
                t.owner
            )
        })
        .collect();
    let more = match lost.len().saturating_sub(LOST_NAMED) {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    let cluster = validated.cluster;
    let accept = stores
        .iter()
        .map(|s| {
            format!(
                "basalt-operator accept-data-loss --etcd <the instance's etcd> --namespace {} \
                 --instance {} --cluster {} --store-id {s}",
                cluster.namespace().unwrap_or_default(),
                cluster.spec.instance_ref,
                cluster.name_any()
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    Cond::new(
        DATA_LOSS,
        true,
        "TabletsLost",
        format!(
            "{} tablet(s) lost with their server's data, unavailable until restored: {}{more}. \
             Restore the data (from another cluster or a backup), or accept the loss — the master \
             then serves them empty, their rows are gone for good: {accept} (docs/master.md)",
            lost.len(),
            named.join(", ")
        ),
    )
}

#[cfg(test)]
mod tests {
    use std::sync::LazyLock;

    use basalt_master::model::{RowRange, Tablet};
    use basalt_meta::ServerRecord;
    use bytes::Bytes;

    use super::*;
    use crate::crd::Instance;
    use crate::lifecycle;
    use crate::rules::Problem;

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

    static INSTANCE: LazyLock<Instance> = LazyLock::new(|| {
        serde_norway::from_str(
            "metadata: {name: orders, namespace: shop}\nspec: {displayName: Orders}\n",
        )
        .unwrap()
    });

    fn validated(cluster: &Cluster, current: Option<i32>) -> ValidatedCluster<'_> {
        ValidatedCluster {
            cluster,
            instance: &INSTANCE,
            current_nodes: current,
            size: lifecycle::scale::Size {
                requested: build::desired_serve_nodes(cluster, current, None),
                servers: build::desired_serve_nodes(cluster, current, None),
                kept_because: None,
            },
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
            None,
            &OperatorConfig::default(),
            true,
        );
        let s = &out.status;
        assert_eq!(cond(s, READY), ("True", "AllNodesReady", Some(4)));
        assert_eq!(cond(s, PROGRESSING), ("False", "Stable", Some(4)));
        assert_eq!(cond(s, DEGRADED), ("False", "AsExpected", Some(4)));
        assert_eq!(cond(s, "DisruptionBudget"), ("True", "Applied", Some(4)));
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
        let out = applied(&v, &sts(1, starting), Serving::default(), None, &cfg, true);
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
        let out = applied(&v, &sts(1, one_ready), Serving::default(), None, &cfg, true);
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

    fn tablet(table: &str, start: &str, end: Option<&str>, owner: &str, lost: bool) -> Tablet {
        Tablet {
            table: table.into(),
            range: RowRange {
                start: Bytes::copy_from_slice(start.as_bytes()),
                end: end.map(|e| Bytes::copy_from_slice(e.as_bytes())),
            },
            epoch: 1,
            owner: owner.into(),
            state: if lost {
                TabletState::Lost
            } else {
                TabletState::Serving
            },
        }
    }

    fn server(name: &str, store: &str) -> ServerRecord {
        ServerRecord {
            store_id: store.into(),
            name: name.into(),
            address: format!("{name}:8086"),
            http_address: None,
            ordinal: None,
            incarnation: 1,
        }
    }

    #[test]
    fn tablets_per_node_name_every_server_and_every_owner() {
        let placement = Placement {
            tablets: vec![
                tablet("greetings", "", Some("g"), "st-a", false),
                tablet("greetings", "g", Some("p"), "st-b", false),
                tablet("greetings", "p", None, "st-a", false),
                tablet("orders", "", None, "st-gone", true),
            ],
            servers: vec![
                server("orders-c1-1", "st-b"),
                server("orders-c1-0", "st-a"),
                server("orders-c1-2", "st-c"),
            ],
            ..Placement::default()
        };
        let n = nodes(&placement);
        let rows: Vec<(&str, &str, bool, i64, i64)> = n
            .iter()
            .map(|n| {
                (
                    n.name.as_str(),
                    n.store_id.as_str(),
                    n.registered,
                    n.tablets,
                    n.lost_tablets,
                )
            })
            .collect();
        assert_eq!(
            rows,
            [
                ("orders-c1-0", "st-a", true, 2, 0),
                ("orders-c1-1", "st-b", true, 1, 0),
                ("orders-c1-2", "st-c", true, 0, 0),
                ("st-gone", "st-gone", false, 1, 1),
            ]
        );
    }

    #[test]
    fn lost_tablets_are_named_with_how_to_accept_the_loss_and_warned_about_once() {
        let c = cluster("{instanceRef: orders, serveNodes: 3}", 2, None);
        let v = validated(&c, Some(3));
        let cfg = OperatorConfig::default();
        let placement = Placement {
            tablets: vec![
                tablet("greetings", "", Some("g\x01"), "st-old", true),
                tablet("greetings", "g\x01", None, "st-a", false),
            ],
            servers: vec![server("orders-c1-0", "st-a")],
            ..Placement::default()
        };
        let out = applied(
            &v,
            &sts(2, rolled_out(3, 2)),
            Serving::default(),
            Some(&placement),
            &cfg,
            true,
        );
        let loss = conditions::find(&out.status.conditions, DATA_LOSS).unwrap();
        assert_eq!(
            (loss.status.as_str(), loss.reason.as_str()),
            ("True", "TabletsLost")
        );
        assert!(
            loss.message.starts_with(
                "1 tablet(s) lost with their server's data, unavailable until restored: \
                 greetings [\"\", \"g\\x01\") of store st-old. "
            ),
            "{}",
            loss.message
        );
        assert!(
            loss.message.contains(
                "basalt-operator accept-data-loss --etcd <the instance's etcd> --namespace shop \
                 --instance orders --cluster orders-c1 --store-id st-old"
            ),
            "{}",
            loss.message
        );
        assert_eq!(
            cond(&out.status, DEGRADED),
            ("True", "TabletsLost", Some(2))
        );
        assert_eq!(out.events.len(), 1);
        assert_eq!(out.events[0].reason, "TabletsLost");
        assert_eq!(out.status.nodes.len(), 2);

        // Reported once; the store unreadable later keeps what the status said.
        let again = cluster("{instanceRef: orders, serveNodes: 3}", 2, Some(out.status));
        let v = validated(&again, Some(3));
        let second = applied(
            &v,
            &sts(2, rolled_out(3, 2)),
            Serving::default(),
            Some(&placement),
            &cfg,
            true,
        );
        assert!(second.events.is_empty(), "{:?}", second.events);
        let blind = applied(
            &v,
            &sts(2, rolled_out(3, 2)),
            Serving::default(),
            None,
            &cfg,
            true,
        );
        assert_eq!(cond(&blind.status, DATA_LOSS).0, "True");
        assert_eq!(blind.status.nodes.len(), 2);

        // Accepted (or restored): no lost tablet, the condition clears.
        let healed = Placement {
            tablets: vec![tablet("greetings", "", None, "st-a", false)],
            servers: vec![server("orders-c1-0", "st-a")],
            ..Placement::default()
        };
        let out = applied(
            &v,
            &sts(2, rolled_out(3, 2)),
            Serving::default(),
            Some(&healed),
            &cfg,
            true,
        );
        assert_eq!(
            cond(&out.status, DATA_LOSS),
            ("False", "NoLostTablets", Some(2))
        );
        assert_eq!(
            cond(&out.status, DEGRADED),
            ("False", "AsExpected", Some(2))
        );
    }

    #[test]
    fn the_single_database_condition_of_earlier_versions_goes_away() {
        let old = ClusterStatus {
            conditions: conditions::merge(
                &[],
                &[Cond::new(SINGLE_DATABASE, false, "IndependentServers", "x")],
                Some(1),
            ),
            ..ClusterStatus::default()
        };
        let c = cluster("{instanceRef: orders, serveNodes: 3}", 2, Some(old));
        let out = applied(
            &validated(&c, Some(3)),
            &sts(2, rolled_out(3, 2)),
            Serving::default(),
            None,
            &OperatorConfig::default(),
            true,
        );
        assert!(conditions::find(&out.status.conditions, SINGLE_DATABASE).is_none());
        assert!(conditions::find(&out.status.conditions, DATA_LOSS).is_none());
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
            None,
            &OperatorConfig::default(),
            false,
        );
        assert_eq!(
            cond(&out.status, "DisruptionBudget"),
            ("False", "Unsupported", Some(1))
        );
        // The metadata store not read: nothing said of the autoscaler.
        assert!(conditions::find(&out.status.conditions, SCALING_ACTIVE).is_none());
        assert_eq!(out.status.storage_class_name.as_deref(), Some("hdd"));
    }

    #[test]
    fn the_autoscalers_decision_its_inputs_and_its_limits_are_in_the_status() {
        let c = cluster(
            "{instanceRef: orders, autoscaling: {minServeNodes: 1, maxServeNodes: 4, cpuUtilizationPercent: 50}}",
            1,
            None,
        );
        let record = basalt_meta::AutoscalerRecord {
            nodes: 4,
            recommended_nodes: 4,
            wanted_nodes: Some(6),
            dimension: "cpu".into(),
            cpu_utilization: Some(0.7321),
            stored_bytes: Some(1 << 20),
            sampled_nodes: Some(4),
            cpu_nodes: Some(6),
            storage_nodes: Some(1),
            held_reason: Some("MaxServeNodesReached".into()),
            held_message: Some("the load wants 6 node(s); maxServeNodes is 4".into()),
            source: "servers".into(),
            source_message: Some("Prometheus at p:9090 did not answer".into()),
            last_change_unix_ms: Some(1_790_000_000_000),
        };
        let placement = Placement {
            autoscaler: Some(record.clone()),
            ..Placement::default()
        };
        let old = ClusterStatus {
            autoscaler: Some(ClusterAutoscalerStatus {
                nodes: 2,
                ..ClusterAutoscalerStatus::default()
            }),
            ..ClusterStatus::default()
        };
        let out = autoscaling(&c, Some(&placement), &old);
        let status = out.status.unwrap();
        assert_eq!(
            (
                status.nodes,
                status.recommended_nodes,
                status.cpu_utilization_percent
            ),
            (4, 4, Some(73))
        );
        assert_eq!(
            status.last_scale_time.as_deref(),
            Some("2026-09-21T14:13:20Z")
        );
        let by_type = |t: &str| out.conds.iter().find(|c| c.type_ == t).unwrap().clone();
        let active = by_type(SCALING_ACTIVE);
        assert!(active.status);
        assert_eq!(active.reason, "ServerReports");
        assert!(
            active.message.contains("did not answer"),
            "{}",
            active.message
        );
        let limited = by_type(SCALING_LIMITED);
        assert!(limited.status);
        assert_eq!(limited.reason, "MaxServeNodesReached");
        let reasons: Vec<&str> = out.events.iter().map(|e| e.reason).collect();
        assert_eq!(reasons, ["ScalingLimited", "Autoscaled"]);
        assert!(
            out.events[1]
                .note
                .contains("from 2 to 4 (CPU 73 % against a target of 50 %)")
        );

        // No decision yet: not active; without the store: what the status said.
        let none = autoscaling(&c, Some(&Placement::default()), &old);
        assert_eq!(none.conds[0].reason, "Pending");
        assert_eq!(autoscaling(&c, None, &old).status, old.autoscaler);
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
            None,
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
        let out = applied(&v, &sts(1, rolled_out(1, 1)), grown, None, &cfg, true);
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

    #[test]
    fn a_scale_in_is_in_the_status_and_looked_at_often_and_the_old_condition_goes() {
        let old = ClusterStatus {
            conditions: conditions::merge(
                &[],
                &[Cond::new(
                    SCALE_IN_BLOCKED,
                    true,
                    "ServersOwnTablets",
                    "tablets cannot move yet",
                )],
                Some(1),
            ),
            ..ClusterStatus::default()
        };
        let c = cluster("{instanceRef: orders, serveNodes: 2}", 2, Some(old));
        let mut v = validated(&c, Some(3));
        v.size.servers = 3;
        v.size.kept_because = Some("the tablet map in the metadata store could not be read".into());
        let out = applied(
            &v,
            &sts(2, rolled_out(3, 2)),
            Serving::default(),
            None,
            &OperatorConfig::default(),
            true,
        );
        assert!(conditions::find(&out.status.conditions, SCALE_IN_BLOCKED).is_none());
        assert_eq!(cond(&out.status, "ScaleIn"), ("True", "Draining", Some(2)));
        let scale_in = out.status.scale_in.clone().unwrap();
        assert_eq!(
            (
                scale_in.from_nodes,
                scale_in.to_nodes,
                scale_in.draining_nodes
            ),
            (3, 2, vec!["orders-c1-2".to_string()])
        );
        assert_eq!(scale_in.remaining_tablets, None);
        assert_eq!(out.events[0].reason, "ScaleInStarted");
        assert_eq!(out.requeue, Action::requeue(Duration::from_secs(3)));
    }
}
