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

use bytes::Bytes;

use basalt_model::{RowRange, Tablet, TabletMap};

use crate::{ClusterView, ServerState, TabletLoad};

/// The key of a tablet's load report.
pub fn tablet_key(table: &str, start: &str) -> (String, Bytes) {
    (table.to_string(), Bytes::copy_from_slice(start.as_bytes()))
}

/// Builds a [`ClusterView`]: servers `s0…sN-1` (ordinals 0…N-1, ready, 100 GiB volumes),
/// tables by split keys and owner ordinals, loads per tablet.
pub struct ViewBuilder {
    view: ClusterView,
    tablets: Vec<Tablet>,
}

impl ViewBuilder {
    pub fn new(cluster: &str) -> ViewBuilder {
        ViewBuilder {
            view: ClusterView {
                cluster: cluster.into(),
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
        let starts = std::iter::once("").chain(splits.iter().copied());
        let ends = splits.iter().map(|s| Some(*s)).chain([None]);
        for ((start, end), owner) in starts.zip(ends).zip(owners) {
            self.tablets.push(Tablet {
                table: table.into(),
                range: RowRange::new(
                    Bytes::copy_from_slice(start.as_bytes()),
                    end.map(|e| Bytes::copy_from_slice(e.as_bytes())),
                ),
                epoch: 1,
                owner: format!("s{owner}"),
                state: basalt_model::TabletState::Serving,
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
        self.view.loads.insert(
            tablet_key(table, start),
            TabletLoad {
                bytes,
                requests_per_sec,
            },
        );
        self
    }

    /// Marks a server as not ready (its lease lapsed, or it is restarting).
    pub fn down(mut self, ordinal: u32) -> ViewBuilder {
        if let Some(s) = self.view.servers.get_mut(&format!("s{ordinal}")) {
            s.ready = false;
        }
        self
    }

    /// The view; panics on tablets that do not cover their tables exactly (a fixture bug).
    pub fn build(mut self) -> ClusterView {
        self.view.tablets = TabletMap::new(self.tablets).expect("fixture tablets cover each table");
        self.view
    }
}
