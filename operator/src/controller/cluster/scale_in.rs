//! Cluster, stage 5 (pure), the scale-in part of the status.
//!
//! Lowering `serveNodes` is carried out in two steps. The operator records the new count in the
//! instance's metadata store (`clusters/<c>/serve-nodes`), where the master reads it and moves
//! every tablet off the leaving servers — the highest ordinals ([`basalt_master::drain()`]).
//! The StatefulSet shrinks only as far as no server that owns a tablet stops
//! ([`super::validate::scale_in_floor`]), so the pods go once their servers are empty. Raising
//! the count back cancels: the master stops draining (moves under way finish), no pod stops.
//!
//! While it lasts, the status says how far it got ([`ClusterScaleInStatus`], the `ScaleIn`
//! condition) and whether the master can finish it: `DrainBlocked`, from the same decision the
//! master makes, on a view built from the tablet map and the servers' reports ([`drain_plan`]).

use std::collections::BTreeMap;

use basalt_master::DrainPlan;
use basalt_master::model::TabletMap;

use super::dereference::Placement;
use super::validate::ValidatedCluster;
use crate::build;
use crate::conditions::{self, Cond};
use crate::controller::Note;
use crate::crd::{ClusterScaleInStatus, ClusterStatus};
use crate::lifecycle;
use crate::lifecycle::drain::Reports;
use crate::lifecycle::view::Known;

pub use crate::conditions::{DRAIN_BLOCKED, SCALE_IN, SCALE_IN_BLOCKED};

/// The scale-in part of a Cluster's status.
#[derive(Debug, Clone, PartialEq)]
pub struct ScaleInReport {
    /// `status.scaleIn`: Some while a scale-in is under way.
    pub status: Option<ClusterScaleInStatus>,
    /// `ScaleIn`, and `DrainBlocked` when known.
    pub conds: Vec<Cond>,
    /// A drain started, completed, was cancelled or blocked.
    pub events: Vec<Note>,
}

impl ScaleInReport {
    pub fn in_progress(&self) -> bool {
        self.status.is_some()
    }
}

/// The scale-in's status, conditions and events. `running` is how many servers the
/// StatefulSet runs (the larger of its replicas as applied and the pods it still has);
/// `placement` the metadata store's view (None: not readable now, the remaining tablets and
/// `DrainBlocked` keep what they said); `old` the status as it was. Pure.
pub fn scale_in(
    validated: &ValidatedCluster<'_>,
    running: i32,
    placement: Option<&Placement>,
    old: &ClusterStatus,
) -> ScaleInReport {
    let cluster = validated.cluster;
    let to = validated.size.requested;
    let name = cluster.metadata.name.clone().unwrap_or_default();
    let mut events = vec![];
    let mut conds = vec![];
    if validated.current_nodes.is_none() || to >= running {
        let (reason, message) = ended(validated, old);
        if let Some(was) = &old.scale_in {
            events.push(if reason == "Cancelled" {
                Note::normal(
                    "ScaleInCancelled",
                    "Scale",
                    format!(
                        "serveNodes raised to {to}: the scale-in from {} to {} is cancelled; no \
                         tablet server stops, moves under way finish and the rebalancer evens \
                         out the servers",
                        was.from_nodes, was.to_nodes
                    ),
                )
            } else {
                Note::normal(
                    "ScaleInCompleted",
                    "Scale",
                    format!(
                        "scaled in from {} to {} tablet server(s): the leaving servers handed \
                         their tablets over before their pods stopped; their volume claims are \
                         kept (volumeReclaimPolicy applies when the Cluster is deleted)",
                        was.from_nodes, was.to_nodes
                    ),
                )
            });
        }
        conds.push(Cond::new(SCALE_IN, false, reason, message));
        conds.push(Cond::new(
            DRAIN_BLOCKED,
            false,
            "NoScaleIn",
            "no scale-in in progress",
        ));
        return ScaleInReport {
            status: None,
            conds,
            events,
        };
    }

    let sts = build::statefulset_name(&name);
    let draining: Vec<String> = (to..running).map(|i| format!("{sts}-{i}")).collect();
    let plan = placement.and_then(|p| drain_plan(p, &name, to.max(0) as u32));
    let remaining = match &plan {
        Some(plan) => Some(plan.remaining_tablets as i64),
        None => old.scale_in.as_ref().and_then(|s| s.remaining_tablets),
    };
    let from = old
        .scale_in
        .as_ref()
        .map_or(running, |s| s.from_nodes.max(running));
    let status = ClusterScaleInStatus {
        from_nodes: from,
        to_nodes: to,
        draining_nodes: draining.clone(),
        remaining_tablets: remaining,
    };
    let names = join(&draining);
    let progress = match remaining {
        Some(0) => format!("{names} own no tablet any more: their pods stop"),
        Some(n) => format!(
            "draining {names}: {n} tablet(s) still to move off; their pods stop once they own \
             none"
        ),
        None => format!("draining {names}"),
    };
    let kept = match &validated.size.kept_because {
        Some(why) => format!(
            " (the StatefulSet keeps {} for now: {why})",
            validated.size.servers
        ),
        None => String::new(),
    };
    conds.push(Cond::new(
        SCALE_IN,
        true,
        "Draining",
        format!("scaling in from {from} to {to} tablet server(s): {progress}{kept}"),
    ));
    if old.scale_in.is_none() {
        events.push(Note::normal(
            "ScaleInStarted",
            "Scale",
            format!(
                "serveNodes lowered to {to}: draining {names}{} before their pods stop",
                remaining.map_or(String::new(), |n| format!(" ({n} tablet(s) to move)"))
            ),
        ));
    }

    let known = conditions::find(&old.conditions, DRAIN_BLOCKED)
        .is_some_and(|c| c.reason == "CannotDrain" || c.reason == "CanDrain");
    if plan.is_none() && !known {
        conds.push(Cond::new(
            DRAIN_BLOCKED,
            false,
            "NotKnownYet",
            "the tablet map in the metadata store has not been read yet",
        ));
    }
    if let Some(plan) = &plan {
        match &plan.blocked {
            Some(blocked) => {
                let reason = readable(&blocked.reason, placement);
                let was_blocked = conditions::find(&old.conditions, DRAIN_BLOCKED)
                    .is_some_and(|c| c.status == "True");
                if !was_blocked {
                    events.push(Note::warning("DrainBlocked", "Scale", reason.clone()));
                }
                conds.push(Cond::new(DRAIN_BLOCKED, true, "CannotDrain", reason));
            }
            None => conds.push(Cond::new(
                DRAIN_BLOCKED,
                false,
                "CanDrain",
                "the remaining servers can take the leaving servers' tablets",
            )),
        }
    }
    ScaleInReport {
        status: Some(status),
        conds,
        events,
    }
}

/// `ScaleIn=False`: why no scale-in is under way — it just completed or was cancelled (and
/// says so until another begins), or there was none.
fn ended(validated: &ValidatedCluster<'_>, old: &ClusterStatus) -> (&'static str, String) {
    let to = validated.size.requested;
    if let Some(was) = &old.scale_in {
        return if to > was.to_nodes {
            (
                "Cancelled",
                format!(
                    "the scale-in from {} to {} tablet server(s) was cancelled: serveNodes is {to}",
                    was.from_nodes, was.to_nodes
                ),
            )
        } else {
            (
                "Completed",
                format!(
                    "scaled in from {} to {} tablet server(s)",
                    was.from_nodes, was.to_nodes
                ),
            )
        };
    }
    match conditions::find(&old.conditions, SCALE_IN) {
        Some(c) if c.status == "False" && c.reason == "Cancelled" => {
            ("Cancelled", c.message.clone())
        }
        Some(c) if c.status == "False" && c.reason == "Completed" => {
            ("Completed", c.message.clone())
        }
        _ => (
            "NoScaleIn",
            "the StatefulSet runs the tablet servers the spec asks for".into(),
        ),
    }
}

/// The drain the master makes towards `serve_nodes` servers, as both runtimes report it
/// ([`lifecycle::drain::drain`]) on `placement`: the registered servers with what they
/// reported of their volumes and tablets, the tablet map and the moves in progress. None when
/// the tablet map is not consistent (e.g. read mid-change). Pure.
pub fn drain_plan(placement: &Placement, cluster: &str, serve_nodes: u32) -> Option<DrainPlan> {
    let tablets = TabletMap::new(placement.tablets.iter().cloned()).ok()?;
    let servers: Vec<Known> = placement
        .servers
        .iter()
        .map(|record| Known {
            record: record.clone(),
            registered: true,
        })
        .collect();
    let reports = Reports {
        volumes: placement.volumes.clone(),
        loads: placement.loads.clone(),
    };
    let drain = lifecycle::drain::drain(
        cluster,
        serve_nodes,
        &servers,
        &tablets,
        &placement.moves,
        &reports,
    );
    Some(drain.plan)
}

/// `reason` with each registered server's store id followed by its pod name.
fn readable(reason: &str, placement: Option<&Placement>) -> String {
    let mut out = reason.to_string();
    let servers = placement.map_or(&[][..], |p| &p.servers[..]);
    let by_store: BTreeMap<&str, &str> = servers
        .iter()
        .filter(|s| s.store_id != s.name)
        .map(|s| (s.store_id.as_str(), s.name.as_str()))
        .collect();
    for (store, name) in by_store {
        out = out.replace(store, &format!("{name} (store {store})"));
    }
    out
}

/// "a", "a and b", "a, b and c".
fn join(names: &[String]) -> String {
    match names.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use basalt_master::model::{RowRange, Tablet, TabletState};
    use basalt_meta::{MovePhase, MoveRecord, ServerRecord, keys::hex};
    use bytes::Bytes;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::{SignedDuration, Timestamp};

    use super::super::dereference::Dereferenced;
    use super::super::validate::{
        SCALE_IN_SETTLE, scale_in_floor, scale_in_settled, shrink_floor, validate,
    };
    use super::*;
    use crate::build::OperatorConfig;
    use crate::crd::{Cluster, Instance};

    const GIB: u64 = 1 << 30;

    fn instance() -> Instance {
        serde_norway::from_str(
            "metadata: {name: orders, namespace: shop}\nspec: {displayName: Orders}\n",
        )
        .unwrap()
    }

    fn cluster(serve_nodes: i32, status: Option<ClusterStatus>) -> Cluster {
        let mut c: Cluster = serde_norway::from_str(&format!(
            "metadata: {{name: orders-c1, namespace: shop, generation: 3}}\n\
             spec: {{instanceRef: orders, serveNodes: {serve_nodes}}}\n"
        ))
        .unwrap();
        c.status = status;
        c
    }

    fn tablet(start: &str, end: Option<&str>, owner: &str, state: TabletState) -> Tablet {
        Tablet {
            table: "greetings".into(),
            range: RowRange {
                start: Bytes::copy_from_slice(start.as_bytes()),
                end: end.map(|e| Bytes::copy_from_slice(e.as_bytes())),
            },
            epoch: 1,
            owner: owner.into(),
            state,
        }
    }

    fn server(ordinal: u32) -> ServerRecord {
        ServerRecord {
            store_id: format!("st-{ordinal}"),
            name: format!("orders-c1-{ordinal}"),
            address: format!("10.0.0.{ordinal}:8086"),
            http_address: None,
            ordinal: Some(ordinal),
            incarnation: 1,
        }
    }

    /// Four servers; table greetings in four tablets on servers 0, 1, 2, 3; the metadata
    /// store holds `recorded`.
    fn four(recorded: Option<u32>) -> Placement {
        Placement {
            tablets: vec![
                tablet("", Some("g"), "st-0", TabletState::Serving),
                tablet("g", Some("n"), "st-1", TabletState::Serving),
                tablet("n", Some("t"), "st-2", TabletState::Serving),
                tablet("t", None, "st-3", TabletState::Serving),
            ],
            servers: (0..4).map(server).collect(),
            serve_nodes: recorded,
            ..Placement::default()
        }
    }

    fn record(start: &str, end: Option<&str>, from: &str, to: &str) -> MoveRecord {
        MoveRecord {
            id: "m1".into(),
            table: "greetings".into(),
            start: hex(start.as_bytes()),
            end: end.map(|e| hex(e.as_bytes())),
            epoch: 1,
            from: from.into(),
            to: to.into(),
            phase: MovePhase::Copying,
            reason: "drain".into(),
            started_micros: 0,
        }
    }

    /// The world after a StatefulSet of `replicas` was applied for `c`, read at `now`.
    fn found(
        c: &Cluster,
        replicas: i32,
        placement: Option<Placement>,
        now: Timestamp,
    ) -> Dereferenced {
        let sts = build::cluster_objects(c, &instance(), &OperatorConfig::default(), replicas)
            .statefulset;
        Dereferenced {
            statefulset: Some(sts),
            instance: Some(instance()),
            placement,
            now,
            ..Dereferenced::default()
        }
    }

    /// A status whose ScaleIn condition turned True at `since`, with `scale_in`.
    fn draining_since(since: Timestamp, scale_in: ClusterScaleInStatus) -> ClusterStatus {
        let mut conds =
            conditions::merge(&[], &[Cond::new(SCALE_IN, true, "Draining", "x")], Some(3));
        conds[0].last_transition_time = Time(since);
        ClusterStatus {
            conditions: conds,
            scale_in: Some(scale_in),
            ..ClusterStatus::default()
        }
    }

    fn find<'a>(r: &'a ScaleInReport, type_: &str) -> Option<&'a Cond> {
        r.conds.iter().find(|c| c.type_ == type_)
    }

    fn now() -> Timestamp {
        Timestamp::from_second(1_800_000_000).unwrap()
    }

    fn later(t: Timestamp, d: Duration) -> Timestamp {
        t + SignedDuration::try_from(d).unwrap()
    }

    #[test]
    fn a_scale_in_never_stops_a_server_that_owns_tablets_or_takes_part_in_a_move() {
        let mut placement = four(Some(2));
        placement.tablets[3].owner = "st-0".into();
        placement.tablets[2].state = TabletState::Fencing;
        // A lost tablet's owner is gone: it does not hold a server back.
        placement.tablets.push(Tablet {
            table: "orders".into(),
            ..tablet("", None, "st-gone", TabletState::Lost)
        });
        // Server 2 owns a tablet (fenced mid-move: still its own): 4 → 3 may go, not lower.
        let (floor, why) = scale_in_floor(Some(4), Some(&placement));
        assert_eq!(floor, 3);
        assert!(why.contains("orders-c1-2"), "{why}");
        // A move towards server 3 holds it too.
        placement.moves.push(record("g", Some("n"), "st-1", "st-3"));
        let (floor, why) = scale_in_floor(Some(4), Some(&placement));
        assert_eq!(floor, 4);
        assert!(
            why.contains("orders-c1-3 takes part in the move m1"),
            "{why}"
        );
        // No tablet map (etcd unreadable): keep what runs.
        assert_eq!(scale_in_floor(Some(4), None).0, 4);
        // A tablet of a store not registered now (its ordinal unknown): keep what runs.
        let mut down = four(Some(2));
        down.servers.retain(|s| s.store_id != "st-1");
        let (floor, why) = scale_in_floor(Some(4), Some(&down));
        assert_eq!(floor, 4);
        assert!(why.contains("st-1"), "{why}");
        // Before the StatefulSet exists there is nothing to keep.
        assert_eq!(scale_in_floor(None, Some(&placement)).0, 0);
    }

    #[test]
    fn no_pod_stops_before_the_count_is_recorded_and_the_scale_in_has_settled() {
        let t0 = now();
        let empty_three = || {
            let mut p = four(None);
            p.tablets[3].owner = "st-0".into();
            p
        };
        let c = cluster(3, None);
        // First reconcile: the store holds nothing yet (or the old count): keep 4.
        let (floor, why) = shrink_floor(&c, 3, Some(4), Some(&empty_three()), t0);
        assert_eq!(floor, 4);
        assert!(
            why.contains("recorded in the metadata store first"),
            "{why}"
        );
        // Recorded, but the ScaleIn condition is not True (or not for long): keep 4.
        let recorded = Placement {
            serve_nodes: Some(3),
            ..empty_three()
        };
        assert_eq!(shrink_floor(&c, 3, Some(4), Some(&recorded), t0).0, 4);
        let status = draining_since(t0, ClusterScaleInStatus::default());
        let c = cluster(3, Some(status));
        assert!(!scale_in_settled(&c, later(t0, Duration::from_secs(2))));
        let (floor, why) = shrink_floor(
            &c,
            3,
            Some(4),
            Some(&recorded),
            later(t0, Duration::from_secs(2)),
        );
        assert_eq!(floor, 4);
        assert!(why.contains("first 5 s"), "{why}");
        // Settled: down to what owns tablets (server 3 owns none).
        let settled = later(t0, SCALE_IN_SETTLE);
        assert!(scale_in_settled(&c, settled));
        assert_eq!(shrink_floor(&c, 3, Some(4), Some(&recorded), settled).0, 3);
        // A lower request (2) while the drain to 3 runs waits (the store keeps 3): the
        // StatefulSet still shrinks to what the drain to 3 allows.
        assert_eq!(shrink_floor(&c, 2, Some(4), Some(&recorded), settled).0, 3);
        // A scale-out needs none of it.
        assert_eq!(shrink_floor(&c, 5, Some(4), Some(&empty_three()), t0).0, 3);
    }

    #[test]
    fn validate_keeps_the_servers_until_drained() {
        let t0 = now();
        let settled = later(t0, Duration::from_secs(30));
        let status = draining_since(t0, ClusterScaleInStatus::default());
        // 4 → 2 recorded and settled; servers 2 and 3 still own tablets: keep 4.
        let c = cluster(2, Some(status));
        let f = found(&c, 4, Some(four(Some(2))), settled);
        let v = validate(&c, &f).unwrap();
        assert_eq!((v.size.requested, v.size.servers), (2, 4));
        assert!(
            v.size
                .kept_because
                .unwrap()
                .contains("orders-c1-3 owns tablets")
        );
        // Server 3 drained: 3 runs.
        let mut p = four(Some(2));
        p.tablets[3].owner = "st-0".into();
        let f = found(&c, 4, Some(p.clone()), settled);
        assert_eq!(validate(&c, &f).unwrap().size.servers, 3);
        // Both drained: 2.
        p.tablets[2].owner = "st-1".into();
        let f = found(&c, 3, Some(p), settled);
        let v = validate(&c, &f).unwrap();
        assert_eq!((v.size.servers, v.size.kept_because), (2, None));
        // Without the tablet map nothing stops.
        let f = found(&c, 4, None, settled);
        assert_eq!(validate(&c, &f).unwrap().size.servers, 4);
    }

    /// The validated cluster as the reconcile would make it.
    fn validated<'a>(c: &'a Cluster, f: &'a Dereferenced) -> ValidatedCluster<'a> {
        validate(c, f).unwrap()
    }

    #[test]
    fn a_drain_in_progress_is_reported_with_its_progress_and_an_event_once() {
        let t0 = now();
        // 4 → 3 just asked for: the store holds the old count, nothing stops yet.
        let c = cluster(3, None);
        let f = found(&c, 4, Some(four(Some(4))), t0);
        let v = validated(&c, &f);
        let r = scale_in(&v, 4, f.placement.as_ref(), &ClusterStatus::default());
        assert_eq!(
            r.status,
            Some(ClusterScaleInStatus {
                from_nodes: 4,
                to_nodes: 3,
                draining_nodes: vec!["orders-c1-3".into()],
                remaining_tablets: Some(1),
            })
        );
        let cond = find(&r, SCALE_IN).unwrap();
        assert_eq!((cond.status, cond.reason), (true, "Draining"));
        assert!(
            cond.message.starts_with(
                "scaling in from 4 to 3 tablet server(s): draining orders-c1-3: 1 tablet(s) \
                 still to move off"
            ),
            "{}",
            cond.message
        );
        assert!(cond.message.contains("keeps 4 for now"), "{}", cond.message);
        let blocked = find(&r, DRAIN_BLOCKED).unwrap();
        assert_eq!((blocked.status, blocked.reason), (false, "CanDrain"));
        assert_eq!(r.events.len(), 1);
        assert_eq!(r.events[0].reason, "ScaleInStarted");
        assert!(
            r.events[0]
                .note
                .contains("draining orders-c1-3 (1 tablet(s) to move)"),
            "{}",
            r.events[0].note
        );

        // Next reconcile: the same, no second event; `fromNodes` stays.
        let old = ClusterStatus {
            conditions: conditions::merge(&[], &r.conds, Some(3)),
            scale_in: r.status.clone(),
            ..ClusterStatus::default()
        };
        let c = cluster(3, Some(old.clone()));
        let f = found(
            &c,
            4,
            Some(four(Some(3))),
            later(t0, Duration::from_secs(1)),
        );
        let v = validated(&c, &f);
        let again = scale_in(&v, 4, f.placement.as_ref(), &old);
        assert!(again.events.is_empty(), "{:?}", again.events);
        assert_eq!(again.status.as_ref().unwrap().from_nodes, 4);

        // The store cannot be read: the remaining count and DrainBlocked keep what they said.
        let f = found(&c, 4, None, later(t0, Duration::from_secs(1)));
        let v = validated(&c, &f);
        let blind = scale_in(&v, 4, None, &old);
        assert_eq!(blind.status.as_ref().unwrap().remaining_tablets, Some(1));
        assert!(find(&blind, DRAIN_BLOCKED).is_none());
        assert_eq!(
            find(&blind, SCALE_IN).unwrap().message,
            "scaling in from 4 to 3 tablet server(s): draining orders-c1-3: 1 tablet(s) still \
             to move off; their pods stop once they own none (the StatefulSet keeps 4 for now: \
             the tablet map in the metadata store could not be read)"
        );
        // Never read during this scale-in: DrainBlocked says it does not know yet.
        let first = scale_in(&v, 4, None, &ClusterStatus::default());
        assert_eq!(
            find(&first, DRAIN_BLOCKED).map(|c| (c.status, c.reason)),
            Some((false, "NotKnownYet"))
        );
    }

    #[test]
    fn a_drained_server_is_reported_stopping_then_the_scale_in_completes() {
        let t0 = now();
        let status = draining_since(
            t0,
            ClusterScaleInStatus {
                from_nodes: 4,
                to_nodes: 3,
                draining_nodes: vec!["orders-c1-3".into()],
                remaining_tablets: Some(1),
            },
        );
        let mut p = four(Some(3));
        p.tablets[3].owner = "st-0".into();
        let c = cluster(3, Some(status.clone()));
        let f = found(&c, 4, Some(p.clone()), later(t0, Duration::from_secs(20)));
        let v = validated(&c, &f);
        assert_eq!(v.size.servers, 3);
        // Applied with 3 replicas; the fourth pod still terminates.
        let r = scale_in(&v, 4, Some(&p), &status);
        assert_eq!(r.status.as_ref().unwrap().remaining_tablets, Some(0));
        assert!(
            find(&r, SCALE_IN)
                .unwrap()
                .message
                .contains("orders-c1-3 own no tablet any more: their pods stop"),
            "{:?}",
            r.conds
        );
        assert!(r.events.is_empty());
        // The pod is gone: completed, said once.
        let f = found(&c, 3, Some(p.clone()), later(t0, Duration::from_secs(30)));
        let v = validated(&c, &f);
        let done = scale_in(&v, 3, Some(&p), &status);
        assert_eq!(done.status, None);
        let cond = find(&done, SCALE_IN).unwrap();
        assert_eq!((cond.status, cond.reason), (false, "Completed"));
        assert_eq!(cond.message, "scaled in from 4 to 3 tablet server(s)");
        assert_eq!(find(&done, DRAIN_BLOCKED).unwrap().reason, "NoScaleIn");
        assert_eq!(done.events.len(), 1);
        assert_eq!(done.events[0].reason, "ScaleInCompleted");
        let after = ClusterStatus {
            conditions: conditions::merge(&status.conditions, &done.conds, Some(3)),
            ..ClusterStatus::default()
        };
        let quiet = scale_in(&v, 3, Some(&p), &after);
        assert!(quiet.events.is_empty());
        assert_eq!(find(&quiet, SCALE_IN).unwrap().reason, "Completed");
    }

    #[test]
    fn raising_the_count_back_cancels_the_scale_in() {
        let t0 = now();
        let status = draining_since(
            t0,
            ClusterScaleInStatus {
                from_nodes: 3,
                to_nodes: 1,
                draining_nodes: vec!["orders-c1-1".into(), "orders-c1-2".into()],
                remaining_tablets: Some(2),
            },
        );
        // A move off server 2 is under way when the count goes back to 3.
        let mut p = four(Some(1));
        p.tablets.truncate(3);
        p.tablets[2].range.end = None;
        p.servers.truncate(3);
        p.moves.push(record("n", None, "st-2", "st-0"));
        let c = cluster(3, Some(status.clone()));
        let f = found(&c, 3, Some(p.clone()), later(t0, Duration::from_secs(2)));
        let v = validated(&c, &f);
        assert_eq!((v.size.requested, v.size.servers), (3, 3));
        let r = scale_in(&v, 3, Some(&p), &status);
        assert_eq!(r.status, None);
        let cond = find(&r, SCALE_IN).unwrap();
        assert_eq!((cond.status, cond.reason), (false, "Cancelled"));
        assert_eq!(
            cond.message,
            "the scale-in from 3 to 1 tablet server(s) was cancelled: serveNodes is 3"
        );
        assert_eq!(r.events.len(), 1);
        assert_eq!(r.events[0].reason, "ScaleInCancelled");
        assert!(!find(&r, DRAIN_BLOCKED).unwrap().status);
    }

    #[test]
    fn a_drain_the_remaining_servers_cannot_hold_is_blocked_with_the_reason() {
        let t0 = now();
        // 4 → 2; every server holds 60 GiB of 100 GiB in its tablet: the two that remain may
        // fill to 80 GiB, 40 GiB free for 120 GiB.
        let mut p = four(Some(2));
        for (i, t) in p.tablets.iter().enumerate() {
            p.loads.insert(
                basalt_master::key_of(t),
                basalt_master::TabletLoad {
                    bytes: 60 * GIB,
                    requests_per_sec: 0.0,
                },
            );
            p.volumes
                .insert(format!("st-{i}"), (60 * GIB, Some(100 * GIB)));
        }
        let plan = drain_plan(&p, "orders-c1", 2).unwrap();
        assert!(plan.moves.is_empty());
        assert!(plan.blocked.is_some());
        let status = draining_since(t0, ClusterScaleInStatus::default());
        let c = cluster(2, Some(status.clone()));
        let f = found(&c, 4, Some(p.clone()), later(t0, Duration::from_secs(60)));
        let v = validated(&c, &f);
        assert_eq!(v.size.servers, 4);
        let r = scale_in(&v, 4, Some(&p), &status);
        let blocked = find(&r, DRAIN_BLOCKED).unwrap();
        assert_eq!((blocked.status, blocked.reason), (true, "CannotDrain"));
        assert!(
            blocked.message.starts_with(
                "cannot drain orders-c1-2 (store st-2) and orders-c1-3 (store st-3): their 2 \
                 tablets hold 120.0 GiB, but the 2 ready servers that remain have only 40.0 GiB \
                 free"
            ),
            "{}",
            blocked.message
        );
        assert_eq!(r.status.as_ref().unwrap().remaining_tablets, Some(2));
        let warned: Vec<_> = r.events.iter().map(|e| e.reason).collect();
        assert_eq!(warned, ["DrainBlocked"]);
        // Warned once.
        let old = ClusterStatus {
            conditions: conditions::merge(&status.conditions, &r.conds, Some(3)),
            ..status
        };
        assert!(scale_in(&v, 4, Some(&p), &old).events.is_empty());
        // Unknown capacities never block.
        p.volumes.clear();
        assert_eq!(drain_plan(&p, "orders-c1", 2).unwrap().blocked, None);
    }

    #[test]
    fn what_stops_the_master_moving_anything_blocks_the_drain() {
        // A tablet owned by a store that is not registered.
        let mut p = four(Some(3));
        p.servers.retain(|s| s.store_id != "st-1");
        let plan = drain_plan(&p, "orders-c1", 3).unwrap();
        let reason = plan.blocked.unwrap().reason;
        assert!(
            reason.starts_with("store st-1 (1 tablet(s)) own(s) tablets")
                && reason.contains("not registered"),
            "{reason}"
        );
        assert!(plan.moves.is_empty());
        // A lost tablet.
        let mut p = four(Some(3));
        p.tablets[1].state = TabletState::Lost;
        let reason = drain_plan(&p, "orders-c1", 3)
            .unwrap()
            .blocked
            .unwrap()
            .reason;
        assert!(
            reason.starts_with("1 tablet(s) of the cluster are lost"),
            "{reason}"
        );
        // Nothing left to move: done, whatever else is wrong.
        let mut p = four(Some(3));
        p.tablets[3].owner = "st-0".into();
        p.tablets[1].state = TabletState::Lost;
        let plan = drain_plan(&p, "orders-c1", 3).unwrap();
        assert!(plan.done && plan.blocked.is_none());
        // Moves in progress count: one off server 3 keeps the drain open but plans nothing new
        // for that tablet.
        let mut p = four(Some(3));
        p.moves.push(record("t", None, "st-3", "st-0"));
        let plan = drain_plan(&p, "orders-c1", 3).unwrap();
        assert_eq!((plan.remaining_tablets, plan.done), (1, false));
        assert!(plan.moves.is_empty(), "{:?}", plan.moves);
    }
}
