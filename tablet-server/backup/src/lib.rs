//! Basalt's backups (`docs/backups.md`): a table's entries as of one cut, cut into
//! content-addressed chunks that successive backups share, and a manifest per backup, kept in
//! an object store (S3-compatible, or a directory).
//!
//! * [`chunk`]: the chunk format and where chunks are cut (content-defined: a change to a few
//!   rows changes the chunks around them only);
//! * [`manifest`]: what a backup is (its source, times, schema and chunks), and backup names;
//! * [`store`]: the object store: chunks uploaded once, manifests written last (a backup
//!   without one was interrupted and is never listed), checksums verified on the way back;
//! * [`log`]: point-in-time recovery: the pieces of their change log tablet servers ship
//!   (checksummed segments, named by their sequence numbers and clock values so that a
//!   listing tells what each holds), and how far each server's log is shipped.
//!
//! No RocksDB and no gRPC: the tablet server reads the entries from its store and turns the
//! errors (the model's) into statuses.

pub mod chunk;
pub mod log;
pub mod manifest;
pub mod store;

pub use chunk::{Chunk, Chunker};
pub use log::{LogPosition, LogSegment, SegmentRef};
pub use manifest::{BackupName, BackupType, ChunkRef, Manifest, TabletBounds};
pub use store::BackupStore;
