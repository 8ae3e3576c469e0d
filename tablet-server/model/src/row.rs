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

/// A row as a scan yields it, after the read's filter ran where the row is stored: its key,
/// the cells the filter kept (possibly none: the reader still learns how far the scan got) and
/// how many live cells the row had before filtering (the read's `cells_seen` statistic).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScannedRow {
    pub key: Bytes,
    pub cells: Vec<Cell>,
    pub cells_seen: usize,
}

/// A read's filter, pushed down to the rows' storage: the cells of `row` the read returns
/// (the API layer compiles Bigtable's RowFilter into one).
pub trait CellFilter: Send + Sync {
    fn apply(&self, row: &Row) -> Result<Vec<Cell>, crate::Error>;
}

/// Keeps every cell.
pub struct PassAll;

impl CellFilter for PassAll {
    fn apply(&self, row: &Row) -> Result<Vec<Cell>, crate::Error> {
        Ok(row.cells.clone())
    }
}
