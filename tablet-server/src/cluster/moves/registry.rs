//! The moves this server takes part in ([`Moves`], held by the
//! [`Node`](crate::cluster::node::Node)): for each move id, what its source or destination
//! side needs to go on, abort or finish.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use basalt_meta::MoveRecord;
use basalt_model::{RowRange, TableSchema, Tablet};
use basalt_storage::CaptureId;
use parking_lot::Mutex;
use tokio::sync::watch;

/// The moves this server takes part in, by move id.
#[derive(Default)]
pub struct Moves {
    pub(super) sources: Mutex<HashMap<String, Arc<SourceMove>>>,
    pub(super) destinations: Mutex<HashMap<String, Arc<DestinationMove>>>,
}

pub(super) struct SourceMove {
    pub(super) capture: CaptureId,
    pub(super) table: Arc<TableSchema>,
    pub(super) tablet: Tablet,
    pub(super) started: Instant,
    /// When it was fenced.
    pub(super) fenced_at: Mutex<Option<Instant>>,
}

pub(super) struct DestinationMove {
    pub(super) table: Arc<TableSchema>,
    pub(super) range: RowRange,
    /// The last record sequence applied (durably).
    pub(super) applied: watch::Sender<u64>,
    /// Why applying stopped, if it failed.
    pub(super) failed: Mutex<Option<String>>,
    pub(super) task: Mutex<Option<tokio::task::AbortHandle>>,
    pub(super) dir: PathBuf,
    pub(super) started: Instant,
}

impl Moves {
    /// Does this server take part in any move now?
    pub fn any(&self) -> bool {
        !self.sources.lock().is_empty() || !self.destinations.lock().is_empty()
    }

    /// The moves of this server that `records` (etcd's, read at or after `since`) no longer
    /// list and that started before `since`.
    pub(super) fn orphans(&self, records: &[MoveRecord], since: Instant) -> Vec<String> {
        let mut started: Vec<(String, Instant)> = (self.sources.lock().iter())
            .map(|(id, m)| (id.clone(), m.started))
            .collect();
        started.extend((self.destinations.lock().iter()).map(|(id, m)| (id.clone(), m.started)));
        started
            .into_iter()
            .filter(|(id, at)| *at < since && !records.iter().any(|r| &r.id == id))
            .map(|(id, _)| id)
            .collect()
    }
}
