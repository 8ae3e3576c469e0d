//! Basalt's storage of tablets: the [`TabletStore`] trait in the model's types, and [`Store`],
//! its implementation on one RocksDB per tablet server. No gRPC here: storage returns its own
//! [`Error`], which the API layer alone maps to status codes (`e2e/run-tests` checks that this
//! crate depends on no tonic).
//!
//! * Column family `data` holds cells and tombstones in the key format of [`encoding`]; a
//!   table (and each of its tablets) is a contiguous key range.
//! * Column family `meta` holds the format version, the table-id counter, a clock floor,
//!   one JSON schema per table ([`catalog`]) and the change log consumers' cursors.
//! * Column family `log` holds the change log ([`changelog`]): each write of the data path,
//!   logically, in the same WriteBatch as its data (only while the log is on).
//!
//! By concern: [`options`] (RocksDB options), [`layout`] (column families, meta keys),
//! [`encoding`] (keys and values), [`committer`] (group commit), [`catalog`] (table schemas in
//! memory), [`admin`] (table administration), [`write`] (row locks, versions,
//! batches), [`read`] (row streams, filtered scans, samples), [`compaction`] (the GC
//! compaction filter), [`merge_operator`] (aggregates), [`ranges`] (size, export, ingest and
//! deletion of a tablet's range), [`observer`] (what sees every committed group: the hook of
//! moves' captures, and later of replication, change streams and log backup), [`moves`]
//! (capture, fence and apply of a tablet move), [`fences`] (the ranges this store must not
//! serve), [`replicated`] (applying writes replicated from another cluster), [`seed`] (a
//! range read for the seeding of a cluster that joined), [`safe_point`] (when replication lets
//! compaction collect a tombstone).

pub mod admin;
pub mod backup;
pub mod capture;
pub mod catalog;
pub mod changelog;
pub mod committer;
pub mod compaction;
pub mod encoding;
pub mod error;
pub mod fences;
pub mod layout;
pub mod merge_operator;
mod migrate;
pub mod moves;
pub mod observer;
pub mod options;
pub mod ranges;
pub mod read;
pub mod replicated;
pub mod safe_point;
pub mod seed;
pub mod store;
pub mod tablet_store;
pub mod write;

pub use backup::RestoreWriter;
pub use catalog::Catalog;
pub use changelog::{LogCursor, LogEntry, Truncated};
pub use error::{Error, Result};
pub use moves::{CaptureId, Fenced, LogOp, LogRecord};
pub use observer::{CommitObserver, CommittedGroup, CommittedJob, Versions};
pub use options::{
    DEFAULT_BLOCK_CACHE_BYTES, StorageStats, StoreOptions, data_cf_options, db_options,
};
pub use ranges::SstFile;
pub use read::{RowStream, Scan};
pub use replicated::ReplicatedRow;
pub use safe_point::LogWatermark;
pub use seed::SeedChunk;
pub use store::Store;
pub use tablet_store::TabletStore;
