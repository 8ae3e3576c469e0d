//! Where a row is served: the cluster's tablet map and registered servers as this server last
//! read them from etcd, and the serving rule for its own tablets.

use std::collections::HashMap;
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
    /// The etcd revision this state was read at (0: not read yet).
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

pub struct Routing {
    me: ServerId,
    cluster: String,
    state: watch::Sender<Arc<ClusterState>>,
    liveness: watch::Receiver<Liveness>,
}

impl Routing {
    pub fn new(me: ServerId, cluster: String, liveness: watch::Receiver<Liveness>) -> Routing {
        Routing {
            me,
            cluster,
            state: watch::channel(Arc::new(ClusterState::default())).0,
            liveness,
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
