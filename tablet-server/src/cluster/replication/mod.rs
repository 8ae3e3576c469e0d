//! Replication between the clusters of an instance (`docs/replication.md`,
//! `../shared/DISTRIBUTED.md` "Replication between clusters"). Every cluster takes reads and
//! writes; each server's change log carries its writes to every other cluster, where they are
//! applied with the versions they took (last write wins on the version, so every cluster
//! converges whatever the order of arrival). One room per role:
//!
//! * [`shipper`]: follows the instance's clusters (etcd's cluster numbers), keeps the change
//!   log on while there is a peer, and ships the log to each peer cluster on its own task (a
//!   slow or unreachable peer never holds back the others), advancing each peer's cursor only
//!   on its durable acknowledgement;
//! * [`service`]: the `Replication` service: applies a peer's batch (any server of the cluster
//!   takes it and routes the rows to their owners), reports the log's position;
//! * [`tokens`]: consistency tokens: the log position of every server when the token was
//!   made, compared with how far each server's log reached every other cluster;
//! * [`safe_point`]: how far every other cluster's writes reached this one, below which
//!   compaction may collect this store's tombstones.

pub mod safe_point;
pub mod service;
pub mod shipper;
pub mod tokens;

use basalt_model::hlc::Version;
use basalt_model::{Error, Result, RowMutation};
use basalt_storage::LogEntry;
use basalt_storage::replicated::ReplicatedRow;
use bytes::Bytes;

/// What the names of peer clusters' cursors start with.
pub const CONSUMER_PREFIX: &str = "cluster/";

/// The name of a peer cluster's cursor in this server's change log.
pub fn consumer(peer: &str) -> String {
    format!("{CONSUMER_PREFIX}{peer}")
}

/// One row of a replicated write on the wire: a change log entry of that row alone (its table
/// id unused: tables travel by name).
pub fn encode_row(first: Version, row: &RowMutation) -> Bytes {
    LogEntry::encode_write(0, first, std::slice::from_ref(row)).into()
}

/// The row of [`encode_row`]'s bytes.
pub fn decode_row(data: &[u8]) -> Result<ReplicatedRow> {
    let entry = LogEntry::decode(data)
        .map_err(|e| Error::InvalidArgument(format!("a replicated row does not decode: {e}")))?;
    let first = entry.first;
    let mut rows = entry.rows.into_iter();
    match (rows.next(), rows.next()) {
        (Some(row), None) => Ok(ReplicatedRow { first, row }),
        _ => Err(Error::InvalidArgument(
            "a replicated row must hold exactly one row".into(),
        )),
    }
}
