//! The tablet map, seen from one server: which server serves a row. It holds the cluster's
//! tablet map and registered servers as this server last read them from etcd, and the serving
//! rule for its own tablets (lease current, not fenced for a move). Decisions only: the
//! frontend forwards by them, the catalog mirror publishes what it read into them.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use basalt_meta::{Liveness, ServerRecord};
use basalt_model::{Error, Result, RowSet, ServerId, Tablet, TabletMap, TabletState};
use tokio::sync::watch;
use tokio::time::{Duration, Instant};

/// What this server knows of its cluster, as of an etcd revision.
#[derive(Debug, Default)]
pub struct ClusterState {
    pub map: TabletMap,
    /// The registered servers by store id.
    pub servers: HashMap<ServerId, ServerRecord>,
    /// The etcd revision this state is at: read there, or followed up to it from the watch
    /// (0: not read yet).
    pub revision: i64,
}

/// Who serves a tablet, from this server's point of view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// This server owns it and may serve it now.
    Local,
    /// Another server owns it: forward to `address`.
    Remote { owner: ServerId, address: String },
}

impl Target {
    /// The address a remote target is reached at (empty for this server).
    pub fn address(&self) -> &str {
        match self {
            Target::Remote { address, .. } => address,
            Target::Local => "",
        }
    }
}

/// This server's view of its cluster's tablet map: who serves which tablet, and whether this
/// server may serve its own.
pub struct TabletRouter {
    me: ServerId,
    cluster: String,
    state: watch::Sender<Arc<ClusterState>>,
    liveness: watch::Receiver<Liveness>,
    /// Own tablets fenced for a move, by (table, start, epoch): refused until the move
    /// aborts; after it commits the map names the new owner at a later epoch.
    fenced: parking_lot::Mutex<HashSet<(String, bytes::Bytes, u64)>>,
}

impl TabletRouter {
    pub fn new(me: ServerId, cluster: String, liveness: watch::Receiver<Liveness>) -> TabletRouter {
        TabletRouter {
            me,
            cluster,
            state: watch::channel(Arc::new(ClusterState::default())).0,
            liveness,
            fenced: parking_lot::Mutex::new(HashSet::new()),
        }
    }

    pub fn me(&self) -> &str {
        &self.me
    }

    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    pub fn state(&self) -> Arc<ClusterState> {
        self.state.borrow().clone()
    }

    pub fn publish(&self, state: ClusterState) {
        self.state.send_replace(Arc::new(state));
    }

    pub fn liveness(&self) -> Liveness {
        *self.liveness.borrow()
    }

    /// May this server serve its own tablets now (lease current)?
    pub fn serving(&self) -> bool {
        self.liveness().serving(Instant::now())
    }

    /// Waits (at most `timeout`) until the state was read at `revision` or later. False on
    /// timeout.
    pub async fn wait_for_revision(&self, revision: i64, timeout: Duration) -> bool {
        let mut rx = self.state.subscribe();
        tokio::time::timeout(timeout, rx.wait_for(|s| s.revision >= revision))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Refuses `tablet` (at its epoch) here from now on: it moves to another server.
    pub fn fence(&self, tablet: &Tablet) {
        self.fenced.lock().insert(fence_key(tablet));
    }

    /// Serves `tablet` again (its move was aborted).
    pub fn unfence(&self, tablet: &Tablet) {
        self.fenced.lock().remove(&fence_key(tablet));
    }

    /// Waits (at most `timeout`) until `ready` holds for the state (at once if it holds now).
    /// `ready` must judge the state it is given, not read this router's state again.
    pub async fn wait_for(&self, ready: impl Fn(&ClusterState) -> bool, timeout: Duration) -> bool {
        let mut rx = self.state.subscribe();
        tokio::time::timeout(timeout, rx.wait_for(|s| ready(s)))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Waits (at most `timeout`) for a state newer than `revision`: at once if this server
    /// already read one (a request refused by a stale route is sent again by the new map
    /// without a wait).
    pub async fn newer_than(&self, revision: i64, timeout: Duration) {
        let mut rx = self.state.subscribe();
        let _ = tokio::time::timeout(timeout, rx.wait_for(|s| s.revision > revision)).await;
    }

    /// Waits (at most `timeout`) for the next change of the state.
    pub async fn changed(&self, timeout: Duration) {
        let mut rx = self.state.subscribe();
        rx.mark_unchanged();
        let _ = tokio::time::timeout(timeout, rx.changed()).await;
    }

    /// The tablets this server owns.
    pub fn owned(&self) -> Vec<Tablet> {
        self.state().map.owned_by(&self.me).cloned().collect()
    }

    /// Who serves `tablet` (an error when nobody can now: lost, owner not registered, or this
    /// server's own lease is not current).
    pub fn target(&self, state: &ClusterState, tablet: &Tablet) -> Result<Target> {
        if tablet.state == TabletState::Lost {
            return Err(Error::Unavailable(format!(
                "tablet {tablet} is lost: the data directory of its server is gone (the Cluster reports DataLoss); it is unavailable until the data is restored or the loss is accepted"
            )));
        }
        if tablet.state == TabletState::Fencing
            || (tablet.owner == self.me && self.fenced.lock().contains(&fence_key(tablet)))
        {
            return Err(Error::Moving {
                tablet: tablet.to_string(),
            });
        }
        if tablet.owner == self.me {
            return if self.serving() {
                Ok(Target::Local)
            } else {
                Err(Error::Unavailable(format!(
                    "this server ({}) cannot renew its lease in the coordination store and stopped serving tablet {tablet}",
                    self.me
                )))
            };
        }
        match state.servers.get(&tablet.owner) {
            Some(server) => Ok(Target::Remote {
                owner: tablet.owner.clone(),
                address: server.address.clone(),
            }),
            None => Err(Error::Unavailable(format!(
                "the server owning tablet {tablet} is not registered (restarting?)"
            ))),
        }
    }

    /// Who holds `tablet`'s rows now, for an answer that may be approximate (SampleRowKeys):
    /// its owner even while the tablet is fenced for a move (the owner still holds every row
    /// until the move commits). An error when nobody does (lost, owner not registered).
    pub fn holder(&self, state: &ClusterState, tablet: &Tablet) -> Result<Target> {
        if tablet.state == TabletState::Fencing || self.fenced.lock().contains(&fence_key(tablet)) {
            if tablet.owner == self.me {
                return Ok(Target::Local);
            }
            if let Some(server) = state.servers.get(&tablet.owner) {
                return Ok(Target::Remote {
                    owner: tablet.owner.clone(),
                    address: server.address.clone(),
                });
            }
        }
        self.target(state, tablet)
    }

    /// The tablet of `row` of `table` (the table id) and who serves it.
    pub fn route_row(&self, table: &str, row: &[u8]) -> Result<(Tablet, Target)> {
        let state = self.state();
        let tablet = state.map.tablet_for(table, row).cloned().ok_or_else(|| {
            Error::Unavailable(format!(
                "table {table} has no tablets in cluster {} yet (the master assigns them)",
                self.cluster
            ))
        })?;
        let target = self.target(&state, &tablet)?;
        Ok((tablet, target))
    }

    /// The parts of `rows` of `table` by tablet, in scan order, with who serves each.
    pub fn route_rows(
        &self,
        table: &str,
        rows: &RowSet,
        reversed: bool,
    ) -> Result<Vec<(Tablet, RowSet, Result<Target>)>> {
        let state = self.state();
        if state.map.tablets(table).is_empty() {
            return Err(Error::Unavailable(format!(
                "table {table} has no tablets in cluster {} yet (the master assigns them)",
                self.cluster
            )));
        }
        Ok(state
            .map
            .split(table, rows, reversed)
            .into_iter()
            .map(|(t, part)| (t.clone(), part, self.target(&state, t)))
            .collect())
    }
}

fn fence_key(tablet: &Tablet) -> (String, bytes::Bytes, u64) {
    (
        tablet.table.clone(),
        tablet.range.start.clone(),
        tablet.epoch,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use basalt_model::{Code, RowRange};
    use bytes::Bytes;

    fn tablet(start: &str, end: Option<&str>, owner: &str, state: TabletState) -> Tablet {
        Tablet {
            table: "t".into(),
            range: RowRange::new(
                Bytes::copy_from_slice(start.as_bytes()),
                end.map(|e| Bytes::copy_from_slice(e.as_bytes())),
            ),
            epoch: 1,
            owner: owner.into(),
            state,
        }
    }

    fn record(id: &str) -> ServerRecord {
        ServerRecord {
            store_id: id.into(),
            name: format!("c1-{id}"),
            address: format!("{id}.local:8086"),
            http_address: None,
            ordinal: None,
            incarnation: 1,
        }
    }

    /// Table t split at g, m and s: [..g) on me, [g..m) on s2, [m..s) on s3 (not registered),
    /// [s..) lost.
    fn router(serving_until: Option<Instant>) -> (TabletRouter, watch::Sender<Liveness>) {
        let (tx, rx) = watch::channel(Liveness {
            lease: 7,
            serving_until,
        });
        let r = TabletRouter::new("me".into(), "c1".into(), rx);
        r.publish(ClusterState {
            map: TabletMap::new([
                tablet("", Some("g"), "me", TabletState::Serving),
                tablet("g", Some("m"), "s2", TabletState::Serving),
                tablet("m", Some("s"), "s3", TabletState::Serving),
                tablet("s", None, "me", TabletState::Lost),
            ])
            .unwrap(),
            servers: [("me", record("me")), ("s2", record("s2"))]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
            revision: 5,
        });
        (r, tx)
    }

    #[tokio::test]
    async fn a_server_serves_its_own_tablets_only_before_its_deadline() {
        let (r, tx) = router(Some(Instant::now() + Duration::from_secs(10)));
        assert_eq!(r.route_row("t", b"a").unwrap().1, Target::Local);
        assert_eq!(
            r.route_row("t", b"h").unwrap().1,
            Target::Remote {
                owner: "s2".into(),
                address: "s2.local:8086".into()
            }
        );
        // Past the deadline (no renewal): its own tablets are refused, retryably.
        tx.send_replace(Liveness {
            lease: 7,
            serving_until: Some(Instant::now() - Duration::from_millis(1)),
        });
        let e = r.route_row("t", b"a").unwrap_err();
        assert_eq!(e.code(), Code::Unavailable);
        assert!(e.to_string().contains("cannot renew its lease"), "{e}");
        assert!(!r.serving());
        // Others' tablets are still routed to them.
        assert!(matches!(
            r.route_row("t", b"h").unwrap().1,
            Target::Remote { .. }
        ));
        // Never registered: not serving either.
        let (never, _tx) = router(None);
        assert!(never.route_row("t", b"a").is_err());
    }

    #[tokio::test]
    async fn unregistered_owners_lost_tablets_and_unknown_tables_are_unavailable() {
        let (r, _tx) = router(Some(Instant::now() + Duration::from_secs(10)));
        let e = r.route_row("t", b"n").unwrap_err();
        assert!(e.to_string().contains("not registered"), "{e}");
        let e = r.route_row("t", b"x").unwrap_err();
        assert!(e.to_string().contains("lost"), "{e}");
        assert_eq!(e.code(), Code::Unavailable);
        let e = r.route_row("u", b"a").unwrap_err();
        assert!(e.to_string().contains("no tablets"), "{e}");
        // A scan is split by tablet in scan order, each part with its target.
        let parts = r.route_rows("t", &RowSet::all(), true).unwrap();
        let owners: Vec<_> = parts.iter().map(|(t, _, _)| t.owner.as_str()).collect();
        assert_eq!(owners, ["me", "s3", "s2", "me"]);
        assert!(parts[0].2.is_err() && parts[1].2.is_err());
        assert!(matches!(parts[2].2, Ok(Target::Remote { .. })));
        assert_eq!(parts[3].2, Ok(Target::Local));
        assert_eq!(r.owned().len(), 2);
        assert!(r.wait_for_revision(5, Duration::from_millis(10)).await);
        assert!(!r.wait_for_revision(6, Duration::from_millis(10)).await);
    }
}
