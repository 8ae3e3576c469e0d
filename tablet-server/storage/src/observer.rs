//! Commit observers: what sees every write the store commits, in commit order.
//!
//! The group committer ([`crate::committer`]) hands each group it wrote to every
//! [`CommitObserver`] of the store, before it acknowledges any write of the group — so a write
//! a client saw acknowledged has been observed. The observers are fixed when the store opens
//! ([`crate::Store::open_with_observers`]); the committer knows them only as `dyn
//! CommitObserver`.
//!
//! **The commit boundary.** The committer holds one lock from a group's write until every
//! observer has seen the group. Whatever runs under that lock
//! ([`crate::committer::Committer::at_boundary`]) sits between two groups: a RocksDB snapshot
//! taken there holds exactly the groups observed so far (sequence ≤ the one it is given) and
//! none of the later ones. A tablet move's capture relies on it for its exact snapshot
//! boundary (see [`crate::moves`]); a replication shipper or a log backup starting from a
//! snapshot will rely on it the same way.
//!
//! **Physical operations on demand.** Building a [`LogOp`] per key costs a copy of every key
//! and value, so writers build them only while some observer wants them
//! ([`CommitObserver::wants_ops`], read when the write is built): a job built while none did
//! carries no operations, but still its versions. An observer that starts wanting operations
//! must therefore make sure the jobs built before are committed before it relies on them
//! (the move capture raises its flag under the catalog lock, then waits on a barrier).
//!
//! **Only the committer's writes are observed.** Writes that bypass it — schemas and other
//! `meta` keys (`Store::sync_write`), a move destination's [`crate::Store::apply_log`], SST
//! files ingested — are not groups and reach no observer; a consumer that must see them
//! (replication on a move's destination, for one) has to route them through the committer
//! first.
//!
//! The first observer is the move capture ([`crate::moves`]). Replication (a durable logical
//! change log), consistency tokens (watermarks of versions), change streams and log backup
//! plug in here as further observers.

use std::sync::Arc;

use basalt_model::hlc::Version;

/// The versions a write of the data path took: `count` consecutive clock values from
/// `first`, given to its mutations in request order (row by row, mutation by mutation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Versions {
    /// The table written.
    pub table_id: u64,
    pub first: Version,
    pub count: u64,
}

impl Versions {
    /// The clock values taken, `[first, first + count)`.
    pub fn hlc_range(&self) -> std::ops::Range<u64> {
        self.first.hlc..self.first.hlc + self.count
    }
}

/// One job of a committed group: a write of the data path, an administrative write through
/// the committer (a range deletion, a schema installed), or a barrier (nothing).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CommittedJob {
    /// Its physical operations on the data column family, in the order they were applied;
    /// empty when no observer wanted operations as the job was built, or when it wrote no
    /// data.
    pub ops: Vec<LogOp>,
    /// The versions of a write of the data path; None for other jobs.
    pub versions: Option<Versions>,
    /// The sequence of its change log entry, when it was logged ([`crate::changelog`]).
    pub log_seq: Option<u64>,
}

/// A group the committer wrote (one synced RocksDB write) and observes.
#[derive(Clone, Copy, Debug)]
pub struct CommittedGroup<'a> {
    /// 1, 2, 3, … in commit order, one per group written since the store opened (a failed
    /// group takes no sequence and is not observed). Not persisted: an observer that needs a
    /// durable position keeps its own.
    pub seq: u64,
    /// The group's jobs, in the order they were queued.
    pub jobs: &'a [CommittedJob],
}

/// Sees every group the store commits. Called on the commit thread, under the commit
/// boundary (see the module docs): it delays every write of the store while it runs, so it
/// must be short, must not panic, and must never wait for the committer (a barrier or a
/// write of the same store would deadlock).
pub trait CommitObserver: Send + Sync {
    /// Whether writers should build the physical operations of their jobs now. Read on the
    /// write path of every write: keep it cheap (an atomic load).
    fn wants_ops(&self) -> bool;

    /// Group `group` is durable. Called once per group, in commit order.
    fn committed(&self, group: &CommittedGroup<'_>);
}

/// The observers of a store, fixed at open.
#[derive(Clone)]
pub(crate) struct Observers(Arc<[Arc<dyn CommitObserver>]>);

impl Observers {
    pub(crate) fn new(list: Vec<Arc<dyn CommitObserver>>) -> Self {
        Observers(list.into())
    }

    /// Whether any observer wants the physical operations of the writes built now.
    pub(crate) fn wants_ops(&self) -> bool {
        self.0.iter().any(|o| o.wants_ops())
    }

    pub(crate) fn committed(&self, group: &CommittedGroup<'_>) {
        for observer in self.0.iter() {
            observer.committed(group);
        }
    }
}

/// One physical operation on the data column family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogOp {
    Put {
        key: Vec<u8>,
        value: Vec<u8>,
    },
    Delete {
        key: Vec<u8>,
    },
    /// An aggregate operand.
    Merge {
        key: Vec<u8>,
        value: Vec<u8>,
    },
    /// Every key in `[start, end)` (DropRowRange, a table deleted).
    DeleteRange {
        start: Vec<u8>,
        end: Vec<u8>,
    },
}

impl LogOp {
    /// The bytes of its keys and values.
    pub fn bytes(&self) -> usize {
        match self {
            LogOp::Put { key, value } | LogOp::Merge { key, value } => key.len() + value.len(),
            LogOp::Delete { key } => key.len(),
            LogOp::DeleteRange { start, end } => start.len() + end.len(),
        }
    }

    /// The part of this operation inside `[start, end)`, if any.
    pub(crate) fn clipped(&self, start: &[u8], end: &[u8]) -> Option<LogOp> {
        let inside = |k: &[u8]| k >= start && k < end;
        match self {
            LogOp::Put { key, .. } | LogOp::Merge { key, .. } | LogOp::Delete { key }
                if inside(key) =>
            {
                Some(self.clone())
            }
            LogOp::DeleteRange { start: s, end: e } => {
                let s = s.as_slice().max(start);
                let e = e.as_slice().min(end);
                (s < e).then(|| LogOp::DeleteRange {
                    start: s.to_vec(),
                    end: e.to_vec(),
                })
            }
            _ => None,
        }
    }
}
