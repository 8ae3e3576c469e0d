//! Basalt's vocabulary, in Bigtable's words, free of I/O: no RocksDB, no gRPC, no Kubernetes
//! (`e2e/run-tests` checks the dependency rule). Storage, the API layer, the frontends' routing
//! and the master all speak it.
//!
//! * [`row`]: a row and its cells as Bigtable returns them, a row as a scan yields it, and the
//!   filter a scan applies where rows are stored;
//! * [`mutation`]: row mutations and column-family changes;
//! * [`schema`]: table schemas, the legality of family changes, resource names and ids;
//! * [`gc`]: garbage-collection rules; [`aggregate`]: aggregate kinds of families;
//! * [`error`]: the error every layer speaks (a code, `retryable()`, `NotOwner`);
//! * [`range`]: [`RowRange`] and [`RowSet`] over row keys (bounds, intersection, union, scan
//!   order);
//! * [`tablet`]: [`Tablet`] and the [`TabletMap`] (lookup by row, split of a row set by tablet);
//! * [`merge`]: row streams merged in key order (forward or reversed);
//! * [`limits`]: Bigtable's limits on keys, qualifiers, values, mutations, families;
//! * [`hlc`]: write versions from a hybrid logical clock;
//! * [`hll`]: HyperLogLog++ sketches (the state of unique-count aggregates);
//! * [`rate`]: a byte-rate limit (a token bucket with the clock passed in);
//! * [`iam`]: IAM policies on the instance and tables, Bigtable's roles and permissions, the
//!   checks;
//! * [`keyviz`]: the Key Visualizer's load per key range and minute, its layered history, the
//!   heatmap of a window and the hot tablets.

pub mod aggregate;
pub mod error;
pub mod gc;
pub mod hlc;
pub mod hll;
pub mod iam;
pub mod keyviz;
pub mod limits;
pub mod merge;
pub mod mutation;
pub mod range;
pub mod rate;
pub mod row;
pub mod schema;
pub mod splitmix;
pub mod tablet;

pub use error::{Code, Error, Result};
pub use merge::{MergeItem, merge_rows};
pub use mutation::{Mutation, RowMutation};
pub use range::{RowRange, RowSet};
pub use row::{Cell, CellFilter, PassAll, Row, ScannedRow};
pub use schema::{FamilyChange, FamilySchema, RestoreInfo, TableSchema};
pub use tablet::{ServerId, Tablet, TabletMap, TabletMapError, TabletState};
