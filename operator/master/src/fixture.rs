//! Cluster views for the master's unit tests, built in a line or two:
//!
//! ```
//! use basalt_master::fixture::ViewBuilder;
//! // Servers s0..s2; table t split at g and p, its tablets on s0, s1, s1; t's tablet at g
//! // holds 100 MiB and takes 50 requests/s.
//! let view = ViewBuilder::new("c1")
//!     .servers(3)
//!     .table("t", &["g", "p"], &[0, 1, 1])
//!     .load("t", "g", 100 << 20, 50.0)
//!     .build();
//! assert_eq!(view.server_load("s1").tablets, 2);
//! ```
//!
//! Big views — a thousand servers, a million tablets — come from [`Synthetic`], generated
//! deterministically with realistic sizes and skewed loads.

mod synthetic;

pub use synthetic::{Synthetic, even_ranges};

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bytes::Bytes;

use basalt_model::{RowRange, Tablet, TabletMap, TabletState};

use crate::{ClusterView, MovePlan, Presence, ServerState, TabletLoad, key_of};

/// The fixtures' "now": one instant per test process, an hour after its start so that instants
/// before it exist on every clock.
pub fn now() -> Instant {
    static NOW: OnceLock<Instant> = OnceLock::new();
    *NOW.get_or_init(|| Instant::now() + Duration::from_secs(3600))
}

/// The ranges of a table split at `splits` (ascending).
pub fn ranges(splits: &[&str]) -> Vec<RowRange> {
    let starts = std::iter::once("").chain(splits.iter().copied());
    let ends = splits.iter().map(|s| Some(*s)).chain([None]);
    starts
        .zip(ends)
        .map(|(start, end)| {
            RowRange::new(
                Bytes::copy_from_slice(start.as_bytes()),
                end.map(|e| Bytes::copy_from_slice(e.as_bytes())),
            )
        })
        .collect()
}

/// The key of a tablet's load report.
pub fn tablet_key(table: &str, start: &str) -> (String, Bytes) {
    (table.to_string(), Bytes::copy_from_slice(start.as_bytes()))
}

/// Builds a [`ClusterView`]: servers `s0…sN-1` (ordinals 0…N-1, named `<cluster>-<ordinal>`,
/// registered and ready, 100 GiB volumes; lease TTL 10 s), tables by split keys and owner
/// ordinals, loads per tablet.
pub struct ViewBuilder {
    view: ClusterView,
    tablets: Vec<Tablet>,
}

impl ViewBuilder {
    pub fn new(cluster: &str) -> ViewBuilder {
        ViewBuilder {
            view: ClusterView {
                cluster: cluster.into(),
                lease_ttl: Duration::from_secs(10),
                ..Default::default()
            },
            tablets: Vec::new(),
        }
    }

    /// `n` ready servers `s0…s{n-1}` (added to those there are).
    pub fn servers(mut self, n: u32) -> ViewBuilder {
        let first = self.view.servers.len() as u32;
        for ordinal in first..first + n {
            let id = format!("s{ordinal}");
            self.view.presence.insert(
                id.clone(),
                Presence {
                    name: format!("{}-{ordinal}", self.view.cluster),
                    absent_since: None,
                },
            );
            self.view.servers.insert(
                id.clone(),
                ServerState {
                    id,
                    address: format!("127.0.0.1:{}", 18000 + ordinal),
                    ordinal,
                    ready: true,
                    stored_bytes: 0,
                    capacity_bytes: Some(100 << 30),
                },
            );
        }
        self
    }

    /// A table split at `splits` (ascending); tablet `i` is owned by server `s{owners[i]}`.
    pub fn table(mut self, table: &str, splits: &[&str], owners: &[u32]) -> ViewBuilder {
        assert_eq!(
            owners.len(),
            splits.len() + 1,
            "one owner per tablet: {} splits make {} tablets",
            splits.len(),
            splits.len() + 1
        );
        for (range, owner) in ranges(splits).into_iter().zip(owners) {
            self.tablets.push(Tablet {
                table: table.into(),
                range,
                epoch: 1,
                owner: format!("s{owner}"),
                state: TabletState::Serving,
            });
        }
        self
    }

    /// The load report of `table`'s tablet starting at `start`.
    pub fn load(
        mut self,
        table: &str,
        start: &str,
        bytes: u64,
        requests_per_sec: f64,
    ) -> ViewBuilder {
        std::sync::Arc::make_mut(&mut self.view.loads).insert(
            tablet_key(table, start),
            TabletLoad {
                bytes,
                requests_per_sec,
            },
        );
        self
    }

    /// Server `s{ordinal}`'s volume holds `bytes`.
    pub fn stored(mut self, ordinal: u32, bytes: u64) -> ViewBuilder {
        if let Some(s) = self.view.servers.get_mut(&format!("s{ordinal}")) {
            s.stored_bytes = bytes;
        }
        self
    }

    /// Server `s{ordinal}`'s volume can hold `bytes` (None: unknown, no limit).
    pub fn capacity(mut self, ordinal: u32, bytes: Option<u64>) -> ViewBuilder {
        if let Some(s) = self.view.servers.get_mut(&format!("s{ordinal}")) {
            s.capacity_bytes = bytes;
        }
        self
    }

    /// Marks a server as not ready (its lease lapsed, or it is restarting).
    pub fn down(mut self, ordinal: u32) -> ViewBuilder {
        if let Some(s) = self.view.servers.get_mut(&format!("s{ordinal}")) {
            s.ready = false;
        }
        self
    }

    /// Server `s{ordinal}`'s registration has been absent for `absent` (at [`now`]): not
    /// ready.
    pub fn absent(mut self, ordinal: u32, absent: Duration) -> ViewBuilder {
        let id = format!("s{ordinal}");
        if let Some(s) = self.view.servers.get_mut(&id) {
            s.ready = false;
        }
        if let Some(p) = self.view.presence.get_mut(&id) {
            p.absent_since = Some(now() - absent);
        }
        self
    }

    /// Server `s{ordinal}` came back with a new data directory: absent for `absent` under its
    /// old store id, registered and ready under `s{ordinal}-new` with the same name and ordinal.
    pub fn replace(self, ordinal: u32, absent: Duration) -> ViewBuilder {
        let mut b = self.absent(ordinal, absent);
        let old = format!("s{ordinal}");
        let id = format!("{old}-new");
        let mut state = b.view.servers[&old].clone();
        state.id = id.clone();
        state.ready = true;
        let mut presence = b.view.presence[&old].clone();
        presence.absent_since = None;
        b.view.servers.insert(id.clone(), state);
        b.view.presence.insert(id, presence);
        b
    }

    /// Every tablet of server `s{ordinal}` so far is Lost.
    pub fn lost(mut self, ordinal: u32) -> ViewBuilder {
        let owner = format!("s{ordinal}");
        for t in self.tablets.iter_mut().filter(|t| t.owner == owner) {
            t.state = TabletState::Lost;
        }
        self
    }

    /// The view; panics on tablets that do not cover their tables exactly (a fixture bug).
    pub fn build(mut self) -> ClusterView {
        self.view.tablets = TabletMap::new(self.tablets).expect("fixture tablets cover each table");
        self.view
    }
}

/// `view` once `moves` committed: each tablet at its destination at the next epoch, its
/// reported bytes carried from the source's volume to the destination's. Moves of tablets the
/// view does not hold (any more) are skipped.
pub fn apply_moves(view: &ClusterView, moves: &[MovePlan]) -> ClusterView {
    let mut next = view.clone();
    let mut tablets: Vec<Tablet> = Vec::new();
    for table in view.tablets.tables() {
        tablets.extend(view.tablets.tablets(table).iter().cloned());
    }
    for m in moves {
        let Some(t) = tablets.iter_mut().find(|t| key_of(t) == key_of(&m.tablet)) else {
            continue;
        };
        t.owner = m.to.clone();
        t.epoch += 1;
        let bytes = view.load(t).bytes;
        if let Some(s) = next.servers.get_mut(&m.from) {
            s.stored_bytes = s.stored_bytes.saturating_sub(bytes);
        }
        if let Some(s) = next.servers.get_mut(&m.to) {
            s.stored_bytes = s.stored_bytes.saturating_add(bytes);
        }
    }
    next.tablets = TabletMap::new(tablets).expect("moves keep the tablets' ranges");
    next
}
