//! Basalt's master, independent of Kubernetes: what it knows of a cluster ([`ClusterView`]) and
//! the two ways it acts on the world ([`NodeRuntime`], [`TabletControl`]).
//!
//! The master's decisions — where the tablets of a new table go ([`placement`]), which tablet
//! to move ([`balance`]) or split ([`split`]), which servers to drain before a scale-in
//! ([`drain`](mod@drain)), when a server is lost ([`failover`]), how many servers an
//! autoscaled cluster runs ([`autoscale`], from samples of its load) — are pure functions of a
//! [`ClusterView`], unit-tested on the fixtures of [`fixture`]; so is the order of a move's
//! steps, whatever each came to ([`moves`]). The operator builds the view (from etcd and the
//! servers' reports) and carries the decisions out through the traits: [`NodeRuntime`] starts
//! and stops tablet servers (a StatefulSet on Kubernetes, processes in the local runtime),
//! [`TabletControl`] talks to one tablet server over Basalt's control protocol (reports,
//! split points, its part of a move). See `../shared/DISTRIBUTED.md` for the design these
//! serve.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use basalt_model::{ServerId, Tablet, TabletMap};
use bytes::Bytes;

pub mod autoscale;
pub mod balance;
pub mod drain;
pub mod failover;
pub mod fixture;
pub mod moves;
pub mod placement;
pub mod split;

pub use balance::{BalanceContext, BalancePolicy, MovePlan, MoveReason, rebalance};
/// The model's types the decisions speak (tablets, ranges, server ids), for callers that
/// build views without depending on the model themselves.
pub use basalt_model as model;
pub use drain::{DrainBlocked, DrainPlan, drain};
pub use failover::{accepted_lost, lost_servers, mark_lost};
pub use moves::{Fence, MoveSpec, Received, StepError};
pub use placement::{accept_loss, assign_new_table};
pub use split::{SplitContext, SplitPlan, SplitPolicy, SplitReason, split_tablet, splits};

/// How loads, cool-downs and back-offs name a tablet: (table, start key). A tablet keeps its
/// key when it moves (only its owner and epoch change); a split gives the upper half a new one.
pub type TabletKey = (String, Bytes);

/// The key of `tablet`.
pub fn key_of(tablet: &Tablet) -> TabletKey {
    (tablet.table.clone(), tablet.range.start.clone())
}

/// What a tablet server last reported about itself.
#[derive(Clone, Debug, PartialEq)]
pub struct ServerState {
    pub id: ServerId,
    /// Where its gRPC APIs (data, admin, control) listen: `host:port`.
    pub address: String,
    /// Its ordinal in the cluster (the StatefulSet pod ordinal, or the local runtime's index):
    /// scale-in drains the highest ordinals.
    pub ordinal: u32,
    /// It holds its lease and serves the tablets it owns.
    pub ready: bool,
    /// Bytes stored on its volume.
    pub stored_bytes: u64,
    /// Bytes its volume can hold (None: unknown, e.g. no volume limit).
    pub capacity_bytes: Option<u64>,
}

/// Size and load of one tablet, as its owner last reported them (statistics stay in memory:
/// they are never written to etcd).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TabletLoad {
    /// Approximate bytes of the tablet's range.
    pub bytes: u64,
    /// Requests per second over the reporting window.
    pub requests_per_sec: f64,
}

/// The master's view of one cluster: its servers, the tablet map, and the tablets' loads.
/// Built by the operator; read by the pure decisions.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterView {
    pub cluster: String,
    pub servers: BTreeMap<ServerId, ServerState>,
    pub tablets: TabletMap,
    /// Keyed by (table, tablet start key); a tablet without a report counts as empty and idle.
    /// Shared: the runtime keeps the servers' last reports for several rounds and hands each
    /// round's view the same map (a million reports are over 100 MiB to copy).
    pub loads: Arc<BTreeMap<TabletKey, TabletLoad>>,
    /// What etcd says of each server the master knows of (registered now, or owning tablets
    /// and absent), keyed by store id.
    pub presence: BTreeMap<ServerId, Presence>,
    /// The servers' lease TTL: a registration disappears at most this long after the server
    /// last renewed it.
    pub lease_ttl: Duration,
}

/// A server's registration as the master saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Presence {
    /// Its name (pod name, `<cluster>-<ordinal>` in the local runtime): stable across
    /// restarts, also when its store id changes because its data directory was lost.
    pub name: String,
    /// None while it is registered; else since when the master has seen it absent. A master
    /// counts the absence of a server already missing when it was elected from its election:
    /// it cannot know more, and later is the safe side.
    pub absent_since: Option<Instant>,
}

impl Presence {
    pub fn registered(&self) -> bool {
        self.absent_since.is_none()
    }
}

/// Why a view cannot be decided on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ViewError {
    #[error("tablet {tablet} is owned by {owner:?}, which is not a server of cluster {cluster:?}")]
    UnknownOwner {
        cluster: String,
        tablet: String,
        owner: ServerId,
    },
}

impl ClusterView {
    /// Checks that every tablet's owner is a server of the cluster (a lost server stays in the
    /// view, not ready, until it is declared lost: its tablets must never look ownerless).
    pub fn check(&self) -> Result<(), ViewError> {
        for table in self.tablets.tables() {
            for t in self.tablets.tablets(table) {
                if !self.servers.contains_key(&t.owner) {
                    return Err(ViewError::UnknownOwner {
                        cluster: self.cluster.clone(),
                        tablet: t.to_string(),
                        owner: t.owner.clone(),
                    });
                }
            }
        }
        Ok(())
    }

    /// The load report of a tablet (zero without one).
    pub fn load(&self, tablet: &Tablet) -> TabletLoad {
        self.loads.get(&key_of(tablet)).copied().unwrap_or_default()
    }

    /// Every tablet with its load report (zero without one), in table and key order. The
    /// reports are keyed in that same order, so this walks the map and the reports side by
    /// side: no lookup and no allocation per tablet, which is what makes a pass over a
    /// million tablets cheap (a [`ClusterView::load`] per tablet builds a key and searches).
    pub fn tablets_with_loads(&self) -> impl Iterator<Item = (&Tablet, TabletLoad)> + '_ {
        let mut loads = self.loads.iter().peekable();
        self.tablets
            .tables()
            .flat_map(|table| self.tablets.tablets(table))
            .map(move |t| {
                let at = (t.table.as_str(), &t.range.start[..]);
                while let Some(((table, start), load)) = loads.peek() {
                    match (table.as_str(), &start[..]).cmp(&at) {
                        std::cmp::Ordering::Less => {
                            loads.next();
                        }
                        std::cmp::Ordering::Equal => return (t, **load),
                        std::cmp::Ordering::Greater => break,
                    }
                }
                (t, TabletLoad::default())
            })
    }

    /// The tablets `server` owns, over every table.
    pub fn tablets_of<'a>(&'a self, server: &'a str) -> impl Iterator<Item = &'a Tablet> + 'a {
        self.tablets.owned_by(server)
    }

    /// What `server` carries: its tablets' count, bytes and requests per second.
    pub fn server_load(&self, server: &str) -> ServerLoad {
        self.tablets_of(server)
            .fold(ServerLoad::default(), |mut acc, t| {
                let load = self.load(t);
                acc.tablets += 1;
                acc.bytes += load.bytes;
                acc.requests_per_sec += load.requests_per_sec;
                acc
            })
    }

    /// The servers in ordinal order.
    pub fn servers_by_ordinal(&self) -> Vec<&ServerState> {
        let mut servers: Vec<&ServerState> = self.servers.values().collect();
        servers.sort_by_key(|s| s.ordinal);
        servers
    }
}

/// The sum over a server's tablets.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ServerLoad {
    pub tablets: usize,
    pub bytes: u64,
    pub requests_per_sec: f64,
}

/// Starts and stops a cluster's tablet servers: a StatefulSet on Kubernetes, processes on
/// 127.0.0.1 in the local runtime. Failover restarts in place and never adds servers.
pub trait NodeRuntime: Send + Sync {
    type Error: std::error::Error + Send + Sync + 'static;

    /// Runs `servers` tablet servers for `cluster` (ordinals `0..servers`). Lowering the
    /// count removes the highest ordinals: the master calls it only once they own no tablet.
    fn set_servers(
        &self,
        cluster: &str,
        servers: u32,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Restarts one server on its own data (same volume, same identity).
    fn restart(
        &self,
        cluster: &str,
        ordinal: u32,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;
}

/// Talks to one tablet server over Basalt's control protocol (`basalt.control.v1`): its
/// report, where it would split a tablet, and its part of a tablet move.
///
/// In the master's words, not the wire's: the calls take and answer this crate's types
/// ([`ServerState`], [`MoveSpec`], [`Received`], [`Fence`], [`StepError`]), not the control
/// crate's messages, because `basalt-control` carries tonic and this crate must not depend
/// on it (`e2e/run-tests` checks it); the implementation over gRPC
/// (`basalt_operator::tablet_servers::GrpcTabletControl`) converts.
///
/// The move calls follow [`moves::Step`]: ReceiveTablet and FinishMove on the destination,
/// FenceTablet and ReleaseTablet on the source, AbortMove on either. Each takes the address
/// of the server it goes to (`host:port`) and the caller's `deadline`: the server gives up
/// past it, and so should the implementation (the master's driver also stops waiting soon
/// after, whatever the implementation does). Their error is this crate's [`StepError`], not
/// [`Self::Error`]: whatever the implementation, the driver must tell a step that did not
/// happen ([`StepError::Failed`]) from one that may have ([`StepError::Unknown`]).
pub trait TabletControl: Send + Sync {
    type Error: std::error::Error + Send + Sync + 'static;

    /// The server's report: its state and the size and load of each tablet it owns.
    fn report(
        &self,
        server: &ServerState,
    ) -> impl Future<Output = Result<ServerReport, Self::Error>> + Send;

    /// A row near the middle of `tablet`'s rows by size, where its owner `server` would split
    /// it (`table_name`: the table's resource name). None: no split point (one row, or too
    /// little data to tell). Metadata only: a split never moves data.
    fn split_point(
        &self,
        server: &ServerState,
        table_name: &str,
        tablet: &Tablet,
    ) -> impl Future<Output = Result<Option<Bytes>, Self::Error>> + Send;

    /// Destination `server`: copy the tablet of `spec` from the source at `source` (at most
    /// `rate_limit_bytes_per_sec`, 0: unlimited), check and ingest it, catch up with the
    /// source's writes; answers once caught up, and keeps applying them until
    /// [`finish_move`](Self::finish_move) or [`abort_move`](Self::abort_move).
    fn receive_tablet(
        &self,
        server: &str,
        spec: &MoveSpec,
        source: &str,
        rate_limit_bytes_per_sec: u64,
        deadline: Duration,
    ) -> impl Future<Output = Result<Received, StepError>> + Send;

    /// Source `server`: refuse the tablet's reads and writes (a retryable "moving"), wait for
    /// the writes in flight; answers the last sequence of its capture and its clock.
    fn fence_tablet(
        &self,
        server: &str,
        spec: &MoveSpec,
        deadline: Duration,
    ) -> impl Future<Output = Result<Fence, StepError>> + Send;

    /// Destination `server`: apply the source's writes through `fence.seq` and take
    /// `fence.clock` over.
    fn finish_move(
        &self,
        server: &str,
        spec: &MoveSpec,
        fence: Fence,
        deadline: Duration,
    ) -> impl Future<Output = Result<(), StepError>> + Send;

    /// Source `server`, once etcd names the destination the owner: forget the capture and
    /// delete the tablet's rows.
    fn release_tablet(
        &self,
        server: &str,
        spec: &MoveSpec,
        deadline: Duration,
    ) -> impl Future<Output = Result<(), StepError>> + Send;

    /// Either `server`, once the abort won in etcd: the source unfences and stops capturing,
    /// the destination drops what it copied.
    fn abort_move(
        &self,
        server: &str,
        spec: &MoveSpec,
        deadline: Duration,
    ) -> impl Future<Output = Result<(), StepError>> + Send;
}

/// What [`TabletControl::report`] returns.
#[derive(Clone, Debug, PartialEq)]
pub struct ServerReport {
    pub state: ServerState,
    /// Per tablet it owns, keyed by (table, start key).
    pub tablets: BTreeMap<(String, Bytes), TabletLoad>,
    /// Its CPU clock (None: the server does not report one).
    pub cpu: Option<autoscale::CpuReading>,
}

#[cfg(test)]
mod tests {
    use super::fixture::{ViewBuilder, tablet_key};
    use super::*;

    #[test]
    fn tablets_with_loads_pairs_each_tablet_with_its_report() {
        // Reports of tablets the map no longer holds (split, or of a deleted table) sit
        // between and after the real ones; two tables, some tablets without a report.
        let view = ViewBuilder::new("c1")
            .servers(2)
            .table("a", &["g", "p"], &[0, 1, 0])
            .table("b", &["m"], &[1, 0])
            .load("a", "", 1, 1.0)
            .load("a", "c", 99, 99.0)
            .load("a", "p", 3, 3.0)
            .load("aa", "", 77, 77.0)
            .load("b", "m", 5, 5.0)
            .load("c", "", 88, 88.0)
            .build();
        let paired: Vec<(String, u64)> = view
            .tablets_with_loads()
            .map(|(t, l)| {
                (
                    format!("{}/{}", t.table, String::from_utf8_lossy(&t.range.start)),
                    l.bytes,
                )
            })
            .collect();
        assert_eq!(
            paired,
            [("a/", 1), ("a/g", 0), ("a/p", 3), ("b/", 0), ("b/m", 5)]
                .map(|(k, b)| (k.to_string(), b))
        );
        // The same as a lookup per tablet.
        for (t, load) in view.tablets_with_loads() {
            assert_eq!(load, view.load(t));
        }
        let big = crate::fixture::Synthetic::new(30, 3_000).build();
        assert!(
            big.tablets_with_loads()
                .all(|(t, load)| load == big.load(t))
        );
    }

    #[test]
    fn server_loads_add_up_their_tablets() {
        let view = ViewBuilder::new("c1")
            .servers(3)
            .table("t", &["g", "p"], &[0, 1, 1])
            .load("t", "g", 100 << 20, 50.0)
            .load("t", "p", 300 << 20, 10.0)
            .build();
        view.check().unwrap();
        assert_eq!(
            view.server_load("s1"),
            ServerLoad {
                tablets: 2,
                bytes: 400 << 20,
                requests_per_sec: 60.0
            }
        );
        assert_eq!(view.server_load("s0").tablets, 1);
        assert_eq!(view.server_load("s2"), ServerLoad::default());
        let ordinals: Vec<u32> = view
            .servers_by_ordinal()
            .iter()
            .map(|s| s.ordinal)
            .collect();
        assert_eq!(ordinals, [0, 1, 2]);
        assert_eq!(
            view.load(&view.tablets.tablets("t")[0]),
            TabletLoad::default()
        );
        assert_eq!(
            tablet_key("t", "g"),
            ("t".to_string(), Bytes::from_static(b"g"))
        );
    }

    #[test]
    fn a_tablet_of_an_unknown_server_is_refused() {
        let mut view = ViewBuilder::new("c1")
            .servers(2)
            .table("t", &["m"], &[0, 1])
            .build();
        view.servers.remove("s1");
        assert!(matches!(
            view.check(),
            Err(ViewError::UnknownOwner { owner, .. }) if owner == "s1"
        ));
    }
}
