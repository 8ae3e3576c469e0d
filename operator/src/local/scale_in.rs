//! Scale-in in the local runtime, the pure parts. Lowering a Cluster's `serveNodes` to `n`
//! takes two steps, as on Kubernetes:
//!
//! 1. the runtime records `n` in etcd (`clusters/<c>/serve-nodes`), and the master moves every
//!    tablet off the servers of ordinal `n` and above ([`basalt_master::drain`]); they keep
//!    running meanwhile;
//! 2. the runtime runs the servers the lifecycle decides ([`crate::lifecycle::scale::size`],
//!    the same decision as the StatefulSet's replicas on Kubernetes): a leaving server stops
//!    (SIGTERM) once no server at or above its ordinal owns a tablet or takes part in a move,
//!    the count is recorded and the scale-in has lasted 5 s — never on anything else: when
//!    etcd cannot be read, nothing stops.
//!
//! Raising the count again cancels the drain: the servers below the new count that still run
//! stay, those already stopped start again on their data directories. Lowering it further
//! waits until the scale-in is done ([`super::plan`] refuses it).
//!
//! Here: which servers to start or drain for a count ([`reconcile`]), what etcd says of the
//! drain ([`observe`]: the progress, and why it is blocked), and which servers a restarted
//! runtime must run again to finish a scale-in its previous run left ([`resume`]).

use std::collections::BTreeSet;

use basalt_master::model::TabletMap;
use basalt_meta::MoveRecord;

use crate::lifecycle;
use crate::lifecycle::drain::Reports;
pub use crate::lifecycle::view::{Known, ordinal};

use super::state::ClusterState;

/// What a count means for a cluster's servers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reconcile {
    /// Ordinals below the count that neither run nor are stopping: start them (on their data
    /// directories, kept from before if they ran).
    pub start: Vec<u32>,
    /// Ordinals at or above the count that run (and are not stopping yet): they drain.
    pub draining: Vec<u32>,
}

/// The servers to start and those that drain for `count`, given the ordinals that run and
/// those being stopped (a stopping server below the count is started again once it exited).
pub fn reconcile(count: u32, running: &BTreeSet<u32>, stopping: &BTreeSet<u32>) -> Reconcile {
    Reconcile {
        start: (0..count)
            .filter(|o| !running.contains(o) && !stopping.contains(o))
            .collect(),
        draining: running.iter().copied().filter(|o| *o >= count).collect(),
    }
}

/// What etcd says of a cluster's drain to `count` servers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observation {
    /// Tablets the leaving servers own, or that move to or from them.
    pub remaining_tablets: usize,
    /// Why the drain cannot go on (None while it can).
    pub blocked: Option<String>,
}

/// The drain to `count` servers as etcd tells it ([`lifecycle::drain::drain`], the same
/// decision the Kubernetes Cluster status reports): `servers` the cluster's servers
/// (registered ones are ready; no capacities are known here, so room never blocks), `tablets`
/// its tablet map and `moves` the move records read around it. Pure.
pub fn observe(
    cluster: &str,
    count: u32,
    servers: &[Known],
    tablets: &TabletMap,
    moves: &[MoveRecord],
) -> Observation {
    let drain =
        lifecycle::drain::drain(cluster, count, servers, tablets, moves, &Reports::default());
    Observation {
        remaining_tablets: drain.plan.remaining_tablets,
        blocked: drain.plan.blocked.map(|b| b.reason),
    }
}

/// What a start must add to the manifests' `count` servers of `cluster` to finish what the
/// previous run on the data directory left (its `local.json` entry for the cluster): the
/// servers it ran at or above the count (they may own tablets; they drain and stop like any
/// scale-in), and the count the scale-in began from. Empty when nothing is left over.
pub fn resume(cluster: &str, count: u32, previous: Option<&ClusterState>) -> (Vec<u32>, i32) {
    let Some(previous) = previous else {
        return (vec![], count as i32);
    };
    let extra: BTreeSet<u32> = previous
        .servers
        .iter()
        .filter_map(|s| ordinal(cluster, &s.name))
        .filter(|o| *o >= count)
        .collect();
    let top = extra.iter().next_back().map_or(0, |o| o + 1) as i32;
    let from = previous
        .scale_in
        .as_ref()
        .map_or(0, |s| s.from)
        .max(top)
        .max(count as i32);
    (extra.into_iter().collect(), from)
}

#[cfg(test)]
mod tests {
    use basalt_master::model::{RowRange, Tablet, TabletState};
    use basalt_meta::MovePhase;
    use bytes::Bytes;

    use super::*;
    use crate::local::state::{ScaleInState, ServerState as LocalServer};
    use basalt_meta::ServerRecord;

    fn record(name: &str, store: &str) -> ServerRecord {
        ServerRecord {
            store_id: store.into(),
            name: name.into(),
            address: format!("127.0.0.1:{}", 4000 + store.len()),
            http_address: None,
            ordinal: ordinal("c", name),
            incarnation: 1,
        }
    }

    fn known(name: &str, store: &str) -> Known {
        Known {
            record: record(name, store),
            registered: true,
        }
    }

    /// Tablets of table `t`, split at `a`, `b`, …, owned by the given stores in order.
    fn map(owners: &[&str]) -> TabletMap {
        let keys: Vec<Bytes> = (0..owners.len())
            .map(|i| {
                if i == 0 {
                    Bytes::new()
                } else {
                    Bytes::from(vec![b'a' + i as u8])
                }
            })
            .collect();
        TabletMap::new(owners.iter().enumerate().map(|(i, owner)| Tablet {
            table: "t".into(),
            range: RowRange::new(keys[i].clone(), keys.get(i + 1).cloned()),
            epoch: 1,
            owner: owner.to_string(),
            state: TabletState::Serving,
        }))
        .unwrap()
    }

    fn moving(start: &[u8], from: &str, to: &str) -> MoveRecord {
        MoveRecord {
            id: "m1".into(),
            table: "t".into(),
            start: start.iter().map(|b| format!("{b:02x}")).collect(),
            end: None,
            epoch: 1,
            from: from.into(),
            to: to.into(),
            phase: MovePhase::Copying,
            reason: "drain".into(),
            started_micros: 0,
        }
    }

    #[test]
    fn a_count_starts_the_missing_servers_below_it_and_drains_those_above() {
        let set = |v: &[u32]| v.iter().copied().collect::<BTreeSet<u32>>();
        // 5 → 2: three drain, nothing starts.
        assert_eq!(
            reconcile(2, &set(&[0, 1, 2, 3, 4]), &set(&[])),
            Reconcile {
                start: vec![],
                draining: vec![2, 3, 4]
            }
        );
        // Back to 5 while 2 was stopped and 3 is stopping: 2 starts again now, 3 once it
        // exited; nothing drains.
        assert_eq!(
            reconcile(5, &set(&[0, 1, 4]), &set(&[3])),
            Reconcile {
                start: vec![2],
                draining: vec![]
            }
        );
        // A scale-out beyond.
        assert_eq!(
            reconcile(4, &set(&[0, 1]), &set(&[])),
            Reconcile {
                start: vec![2, 3],
                draining: vec![]
            }
        );
        // Raised part way: 3 of 5 stay.
        assert_eq!(
            reconcile(3, &set(&[0, 1, 3, 4]), &set(&[])),
            Reconcile {
                start: vec![2],
                draining: vec![3, 4]
            }
        );
        assert_eq!(ordinal("c", "c-12"), Some(12));
        assert_eq!(ordinal("c", "cc-1"), None);
        assert_eq!(ordinal("c-1", "c-1-0"), Some(0));
    }

    #[test]
    fn the_drain_counts_what_the_leaving_servers_own() {
        let servers = [
            known("c-0", "s0"),
            known("c-1", "s1"),
            known("c-2", "s2"),
            known("c-3", "s3"),
        ];
        // s2 owns two tablets, s3 none; a move from s0 to s3 (started before the scale-in).
        let tablets = map(&["s0", "s2", "s1", "s2"]);
        let obs = observe("c", 2, &servers, &tablets, &[moving(b"", "s0", "s3")]);
        assert_eq!(obs.remaining_tablets, 3);
        assert_eq!(obs.blocked, None);
        // The move ended (to s0's peer s1), s2 still owns two: only c-3 is empty.
        let tablets = map(&["s1", "s2", "s1", "s2"]);
        let obs = observe("c", 2, &servers, &tablets, &[]);
        assert_eq!(obs.remaining_tablets, 2);
        // Everything moved off: both are empty.
        let tablets = map(&["s1", "s0", "s1", "s0"]);
        let obs = observe("c", 2, &servers, &tablets, &[]);
        assert_eq!(obs.remaining_tablets, 0);
    }

    #[test]
    fn a_leaving_server_that_is_down_or_a_cluster_without_receivers_blocks_the_drain() {
        let mut servers = vec![known("c-0", "s0"), known("c-1", "s1")];
        // c-1 leaves but is not registered (restarting): its tablets cannot be copied off.
        servers[1].registered = false;
        let tablets = map(&["s0", "s1"]);
        let obs = observe("c", 1, &servers, &tablets, &[]);
        let why = obs.blocked.unwrap();
        assert!(why.contains("cannot drain s1: it is not ready"), "{why}");
        assert_eq!(obs.remaining_tablets, 1);
        // An owner etcd knows nothing of (no name): counted as staying, and said to hold
        // everything back.
        let servers = [known("c-0", "s0"), known("c-1", "s1")];
        let tablets = map(&["s0", "s1", "gone"]);
        let obs = observe("c", 1, &servers, &tablets, &[]);
        let why = obs.blocked.unwrap();
        assert!(
            why.contains("store gone (1 tablet(s))") && why.contains("not registered"),
            "{why}"
        );
        // Scale-in to 0 of the registered servers: nobody receives.
        let obs = observe("c", 0, &servers, &map(&["s0", "s1"]), &[]);
        assert!(
            obs.blocked
                .as_deref()
                .unwrap_or("")
                .contains("no server would remain"),
            "{obs:?}"
        );
    }

    #[test]
    fn a_restart_runs_the_servers_its_previous_run_left_above_the_count() {
        let server = |name: &str| LocalServer {
            name: name.into(),
            ..Default::default()
        };
        let previous = ClusterState {
            serve_nodes: 2,
            servers: vec![server("c-0"), server("c-1"), server("c-3")],
            scale_in: Some(ScaleInState {
                from: 5,
                to: 2,
                draining: vec!["c-3".into()],
                ..Default::default()
            }),
            removing: None,
            autoscaler: None,
        };
        assert_eq!(resume("c", 2, Some(&previous)), (vec![3], 5));
        // The manifests raised it back meanwhile: nothing left over.
        assert_eq!(resume("c", 5, Some(&previous)), (vec![], 5));
        // Manifests edited from 3 to 1 between two runs: the servers above still drain.
        let edited = ClusterState {
            serve_nodes: 3,
            servers: vec![server("c-0"), server("c-1"), server("c-2")],
            scale_in: None,
            removing: None,
            autoscaler: None,
        };
        assert_eq!(resume("c", 1, Some(&edited)), (vec![1, 2], 3));
        assert_eq!(resume("c", 2, None), (vec![], 2));
    }
}
