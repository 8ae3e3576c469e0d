//! Basalt's vocabulary, in Bigtable's words, free of I/O: no RocksDB, no gRPC, no Kubernetes
//! (`e2e/run-tests` checks the dependency rule). Storage, the API layer, the frontends' routing
//! and the master all speak it.
//!
//! * [`row`]: a row and its cells as Bigtable returns them;
//! * [`range`]: [`RowRange`] and [`RowSet`] over row keys (bounds, intersection, union, scan
//!   order);
//! * [`tablet`]: [`Tablet`] and the [`TabletMap`] (lookup by row, split of a row set by tablet);
//! * [`merge`]: row streams merged in key order (forward or reversed);
//! * [`limits`]: Bigtable's limits on keys, qualifiers, values, mutations, families;
//! * [`hlc`]: write versions from a hybrid logical clock;
//! * [`hll`]: HyperLogLog++ sketches (the state of unique-count aggregates).

pub mod hlc;
pub mod hll;
pub mod limits;
pub mod merge;
pub mod range;
pub mod row;
pub mod tablet;

pub use merge::merge_rows;
pub use range::{RowRange, RowSet};
pub use row::{Cell, Row};
pub use tablet::{ServerId, Tablet, TabletMap, TabletMapError};
