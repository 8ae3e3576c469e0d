//! A cluster's size, the same on both runtimes: how many tablet servers run now
//! ([`size`], pure), and the step that carries it out ([`resize`]) through a
//! [`NodeRuntime`] — a StatefulSet on Kubernetes
//! (`controller::cluster::nodes::StatefulSetNodes`), processes on 127.0.0.1 in the local runtime
//! (`local::nodes::LocalNodes`).
//!
//! Lowering `serveNodes` is two steps. The requested count is recorded in the instance's
//! metadata store first (`clusters/<c>/serve-nodes`, [`records`]): the master drains the servers
//! of that ordinal and above. The runtime then keeps every server that owns a tablet or takes
//! part in a move ([`scale_in_floor`]); it runs fewer only once the store holds the count and the
//! scale-in has lasted [`SCALE_IN_SETTLE`] ([`shrink_floor`]). A raised count cancels: it is
//! recorded at once, and no server stops.

use std::time::Duration;

use basalt_master::NodeRuntime;
use basalt_master::model::TabletState;
use basalt_meta::Meta;

use super::records;
use super::view::Placement;

/// How long a scale-in has been under way before any server stops: the master's passes that
/// were running when the count was lowered have recorded their moves by then (a move to a
/// leaving server is seen in its record and holds that server), and a scale-in reverted at
/// once stops nothing.
pub const SCALE_IN_SETTLE: Duration = Duration::from_secs(5);

/// How many servers a cluster runs now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Size {
    /// What the spec asks for (`serveNodes`, or with autoscaling the count within bounds): the
    /// count recorded for the master.
    pub requested: i32,
    /// The servers to run (ordinals `0..servers`): the requested count, but never fewer than
    /// the servers that own tablets ([`scale_in_floor`]), and during a scale-in's first moments
    /// the count that runs ([`shrink_floor`]).
    pub servers: i32,
    /// Why more servers run than requested, when they do.
    pub kept_because: Option<String>,
}

/// The servers to run when the spec asks for `requested` and `current` run (None: none yet),
/// with `placement` what the metadata store says (None: it could not be read) and `settled`
/// whether the scale-in has lasted [`SCALE_IN_SETTLE`]. Pure.
pub fn size(
    requested: i32,
    current: Option<i32>,
    placement: Option<&Placement>,
    settled: bool,
) -> Size {
    let (floor, why) = shrink_floor(requested, current, placement, settled);
    let servers = requested.max(floor.min(current.unwrap_or(0)));
    Size {
        requested,
        servers,
        kept_because: (servers > requested).then_some(why),
    }
}

/// The fewest servers (ordinals `0..n`) the cluster may shrink to without stopping a server
/// that owns tablets (in any state but lost), takes part in a move in progress or holds
/// writes another cluster has not acknowledged yet (replication), with the
/// reason when it is more than zero. Pure. Without the tablet map (the metadata store could
/// not be read), or with a tablet owned by (or moving to or from) a server that is not
/// registered now (its ordinal unknown), it is the current count: never decide from missing
/// facts what data may go.
pub fn scale_in_floor(current: Option<i32>, placement: Option<&Placement>) -> (i32, String) {
    let Some(current) = current else {
        return (0, String::new());
    };
    let Some(placement) = placement else {
        return (
            current,
            "the tablet map in the metadata store could not be read".into(),
        );
    };
    let owned = placement
        .tablets
        .iter()
        .filter(|t| t.state != TabletState::Lost)
        .map(|t| (t.owner.as_str(), format!("owns tablets (e.g. {t})")));
    let moving = placement.moves.iter().flat_map(|m| {
        let what = format!("takes part in the move {} of table {}", m.id, m.table);
        [(m.from.as_str(), what.clone()), (m.to.as_str(), what)]
    });
    // With replication, a server leaves only once the other clusters hold its writes.
    let unshipped = placement.unshipped.iter().map(|(store, peer)| {
        (
            store.as_str(),
            format!("has writes not yet shipped to cluster {peer}"),
        )
    });
    let mut floor = 0i32;
    let mut why = String::new();
    for (store, what) in owned.chain(moving).chain(unshipped) {
        let server = placement.servers.iter().find(|s| s.store_id == store);
        match server.and_then(|s| s.ordinal.map(|o| (s, o))) {
            Some((s, ordinal)) => {
                let needed = ordinal as i32 + 1;
                if needed > floor {
                    floor = needed;
                    why = format!("server {} {what}", s.name);
                }
            }
            None => {
                return (
                    current,
                    format!("store {store} {what} but is not registered now (restarting?)"),
                );
            }
        }
    }
    (floor, why)
}

/// The fewest servers that may run now when the spec asks for `requested` and `current` run,
/// and why (see [`scale_in_floor`]). Before any server stops, the metadata store must hold
/// the requested count as it was read — the master drains towards it and plans no move to the
/// leaving servers — and the scale-in must have `settled` (lasted [`SCALE_IN_SETTLE`]). Pure.
pub fn shrink_floor(
    requested: i32,
    current: Option<i32>,
    placement: Option<&Placement>,
    settled: bool,
) -> (i32, String) {
    let held = current.filter(|&c| requested < c);
    // The metadata store holds the count the master drains towards: the request, or — while an
    // earlier scale-in finishes (a lower request waits, see `records::serve_nodes_to_record`)
    // — that scale-in's target, above the request and below what runs.
    let draining_towards = |p: &Placement, c: i32| {
        p.serve_nodes
            .and_then(|n| i32::try_from(n).ok())
            .is_some_and(|n| n >= requested && n < c)
    };
    match (held, placement) {
        (Some(c), Some(p)) if !draining_towards(p, c) => (
            c,
            "the new count is recorded in the metadata store first (the master drains towards \
             it)"
            .into(),
        ),
        (Some(c), Some(_)) if !settled => (
            c,
            format!(
                "no server stops in the first {} s of a scale-in",
                SCALE_IN_SETTLE.as_secs()
            ),
        ),
        _ => scale_in_floor(current, placement),
    }
}

/// Why a [`resize`] did not happen.
#[derive(Debug, thiserror::Error)]
pub enum ResizeError<E: std::error::Error + 'static> {
    /// The requested count could not be recorded in the metadata store: the servers that run
    /// keep running (none starts for the master to drain at once, none stops), and the next
    /// reconcile tries again.
    #[error("{0}")]
    Record(String),
    /// The runtime could not run the servers.
    #[error(transparent)]
    Runtime(E),
}

/// The lifecycle's step for a cluster's size, the same on both runtimes: the requested count
/// recorded for the master first (when `recorded`, what `store` held as it was read, differs:
/// [`records::serve_nodes_to_record`]), then `runtime` runs `size.servers` servers. A count
/// that cannot be recorded changes nothing: `runtime` runs `current` (or, for a cluster that
/// runs none yet, the size: there is nothing for the master to drain then).
///
/// `replicas` are the clusters of the instance the runtime knows (this one among them): they
/// are declared replicas first ([`records::declare_replicas`]: numbers and peer endpoints), so
/// the servers about to start log their writes for the others from the first one. The
/// cluster's `autoscaling` settings (None: a fixed count) are recorded for the master's
/// autoscaler after the count ([`super::autoscaling::record`]).
#[allow(clippy::too_many_arguments)]
pub async fn resize<R: NodeRuntime>(
    runtime: &R,
    store: Option<&Meta>,
    cluster: &str,
    replicas: &[records::Replica],
    autoscaling: Option<&basalt_meta::AutoscalingRecord>,
    size: &Size,
    current: Option<i32>,
    recorded: Option<Option<u32>>,
) -> Result<(), ResizeError<R::Error>> {
    let record = records::serve_nodes_to_record(recorded, size.requested, current);
    let failed = match store {
        Some(store) => match records::declare_replicas(store, replicas).await {
            Err(why) => Some(why),
            Ok(()) => {
                let counted = match record {
                    Some(count) => records::record_serve_nodes(store, cluster, count).await,
                    None => Ok(()),
                };
                match counted {
                    Err(why) => Some(why),
                    Ok(()) => super::autoscaling::record(store, cluster, autoscaling)
                        .await
                        .err(),
                }
            }
        },
        None => None,
    };
    let servers = match (&failed, current) {
        (Some(_), Some(current)) => current,
        _ => size.servers,
    };
    runtime
        .set_servers(cluster, servers.max(0) as u32)
        .await
        .map_err(ResizeError::Runtime)?;
    match failed {
        Some(why) => Err(ResizeError::Record(why)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use basalt_master::model::{RowRange, Tablet};
    use basalt_meta::ServerRecord;
    use bytes::Bytes;

    use super::*;

    fn tablet(start: &str, owner: &str, state: TabletState) -> Tablet {
        Tablet {
            table: "t".into(),
            range: RowRange {
                start: Bytes::copy_from_slice(start.as_bytes()),
                end: None,
            },
            epoch: 1,
            owner: owner.into(),
            state,
        }
    }

    fn server(ordinal: u32) -> ServerRecord {
        ServerRecord {
            store_id: format!("st-{ordinal}"),
            name: format!("c1-{ordinal}"),
            address: format!("127.0.0.1:{}", 4000 + ordinal),
            http_address: None,
            ordinal: Some(ordinal),
            incarnation: 1,
        }
    }

    /// Four servers registered; tablets on the given ordinals; `recorded` in the store.
    fn placement(owners: &[u32], recorded: Option<u32>) -> Placement {
        Placement {
            tablets: owners
                .iter()
                .map(|o| tablet(&o.to_string(), &format!("st-{o}"), TabletState::Serving))
                .collect(),
            servers: (0..4).map(server).collect(),
            serve_nodes: recorded,
            ..Placement::default()
        }
    }

    #[test]
    fn a_scale_out_or_a_new_cluster_runs_the_request_at_once() {
        assert_eq!(size(3, None, None, false).servers, 3);
        let p = placement(&[0, 1], Some(2));
        assert_eq!(size(4, Some(2), Some(&p), false).servers, 4);
        assert_eq!(size(4, Some(2), None, false).servers, 4);
    }

    #[test]
    fn a_scale_in_stops_nothing_until_recorded_and_settled_then_keeps_the_owners() {
        // Not recorded yet: all four stay.
        let p = placement(&[0, 3], Some(4));
        let s = size(2, Some(4), Some(&p), true);
        assert_eq!(s.servers, 4);
        assert!(s.kept_because.unwrap().contains("recorded"));
        // Recorded, not settled.
        let p = placement(&[0, 3], Some(2));
        let s = size(2, Some(4), Some(&p), false);
        assert_eq!(s.servers, 4);
        assert!(s.kept_because.unwrap().contains("first 5 s"));
        // Settled: server 3 still owns a tablet.
        let s = size(2, Some(4), Some(&p), true);
        assert_eq!(s.servers, 4);
        assert!(s.kept_because.unwrap().contains("c1-3 owns tablets"));
        // Server 2 owns one: 3 may run.
        let p = placement(&[0, 2], Some(2));
        assert_eq!(size(2, Some(4), Some(&p), true).servers, 3);
        // Empty above the count: down to it.
        let p = placement(&[0, 1], Some(2));
        let s = size(2, Some(4), Some(&p), true);
        assert_eq!((s.servers, s.kept_because), (2, None));
        // The store unread: what runs.
        assert_eq!(size(2, Some(4), None, true).servers, 4);
    }

    #[test]
    fn a_lost_tablet_holds_nobody_and_an_unregistered_owner_holds_everyone() {
        let mut p = placement(&[0], Some(1));
        p.tablets.push(tablet("x", "st-3", TabletState::Lost));
        assert_eq!(size(1, Some(4), Some(&p), true).servers, 1);
        p.tablets.push(tablet("y", "st-9", TabletState::Serving));
        let s = size(1, Some(4), Some(&p), true);
        assert_eq!(s.servers, 4);
        assert!(s.kept_because.unwrap().contains("not registered"));
    }

    #[test]
    fn a_server_with_writes_not_yet_shipped_to_another_cluster_stays() {
        // Server 3 owns nothing, but cluster c2 has not acknowledged all of its log.
        let mut p = placement(&[0, 1], Some(2));
        p.unshipped.insert("st-3".into(), "c2".into());
        let s = size(2, Some(4), Some(&p), true);
        assert_eq!(s.servers, 4);
        assert!(
            s.kept_because
                .unwrap()
                .contains("c1-3 has writes not yet shipped to cluster c2")
        );
        // Shipped: down to the count.
        p.unshipped.clear();
        assert_eq!(size(2, Some(4), Some(&p), true).servers, 2);
    }

    /// A runtime that records what it was asked.
    #[derive(Default)]
    struct Recorder(Mutex<Vec<u32>>);

    impl NodeRuntime for Recorder {
        type Error = std::io::Error;
        async fn set_servers(&self, _: &str, servers: u32) -> Result<(), Self::Error> {
            self.0.lock().unwrap().push(servers);
            Ok(())
        }
        async fn restart(&self, _: &str, _: u32) -> Result<(), Self::Error> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn without_a_store_the_size_is_carried_out_as_decided() {
        let nodes = Recorder::default();
        let size = size(3, Some(2), None, false);
        resize(&nodes, None, "c1", &[], None, &size, Some(2), None)
            .await
            .unwrap();
        assert_eq!(*nodes.0.lock().unwrap(), vec![3]);
    }
}
