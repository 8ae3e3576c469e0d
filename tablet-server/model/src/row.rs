//! The logical data model every part of the read path shares: a row as Bigtable returns it.
//!
//! Storage decodes a row into a [`Row`] (tombstones resolved, GC applied), filters transform
//! its cells, and the ReadRows encoder turns the result into `CellChunk`s. Keeping one plain
//! representation lets the filter language stay pure and testable without RocksDB.

use bytes::Bytes;

/// One cell version as a client sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cell {
    /// Column family name.
    pub family: String,
    /// Column qualifier (any bytes, may be empty).
    pub qualifier: Bytes,
    /// Cell timestamp in microseconds.
    pub timestamp_micros: i64,
    /// Cell value (may be empty, e.g. after `strip_value_transformer`).
    pub value: Bytes,
    /// Labels applied by `apply_label_transformer`, in the order they were applied.
    pub labels: Vec<String>,
}

/// A row: its key and its cells in Bigtable order — families ascending, then qualifiers in
/// byte order, then timestamps newest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Row {
    pub key: Bytes,
    pub cells: Vec<Cell>,
}

impl Cell {
    /// Bigtable's cell order key: (family, qualifier, timestamp descending).
    pub fn order_key(&self) -> (&str, &[u8], std::cmp::Reverse<i64>) {
        (
            self.family.as_str(),
            self.qualifier.as_ref(),
            std::cmp::Reverse(self.timestamp_micros),
        )
    }
}
