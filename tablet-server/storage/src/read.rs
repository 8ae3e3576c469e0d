//! The read path: row ranges become key ranges of the `data` column family, a [`RowStream`]
//! assembles each row from its raw entries (tombstones resolved, dropped families hidden, GC
//! rules applied), and a [`Scan`] runs the read's filter on each row where it is stored.

use std::collections::BTreeSet;

use basalt_model::hlc::{Version, now_micros};
use basalt_model::{Cell, CellFilter, Row, RowRange, RowSet, ScannedRow, TableSchema};
use bytes::Bytes;
use rocksdb::ReadOptions;

use crate::encoding::{self, ValueKind};
use crate::error::{Error, Result};
use crate::layout::{CF_DATA, SAMPLE_INTERVAL};
use crate::merge_operator::Parts;
use crate::store::Store;

/// A key range `[start, end)` of the `data` column family, aligned on row boundaries.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct KeyRange {
    pub(crate) start: Vec<u8>,
    pub(crate) end: Vec<u8>,
}

/// The keys of the `data` column family that hold the rows of `range` (row-aligned). A single
/// row maps to exactly its own keys, so that point reads seek with the row-prefix blooms.
pub(crate) fn key_range(table_id: u64, range: &RowRange) -> KeyRange {
    let start = if range.start.is_empty() {
        encoding::table_prefix(table_id)
    } else {
        encoding::row_prefix(table_id, &range.start)
    };
    let end = match &range.end {
        None => encoding::table_end(table_id),
        // `[.., k\0)` holds the rows up to and including `k`.
        Some(e) if e.last() == Some(&0) => encoding::row_end(table_id, &e[..e.len() - 1]),
        Some(e) => encoding::row_prefix(table_id, e),
    };
    KeyRange { start, end }
}

/// A pull-based scan: the rows with live cells of a list of key ranges, in key order or
/// reverse key order (see [`Store::rows`]). Holds a RocksDB iterator; stops after an error.
pub struct RowStream<'a> {
    table: &'a TableSchema,
    it: rocksdb::DBRawIterator<'a>,
    table_end: Vec<u8>,
    /// The ranges still to read, in scan order.
    ranges: std::vec::IntoIter<KeyRange>,
    /// The range being read; the iterator is positioned inside it.
    current: Option<KeyRange>,
    reversed: bool,
    /// The time GC rules are evaluated at: one instant for the whole scan.
    now: i64,
    entries: Vec<(Box<[u8]>, Bytes)>,
    failed: bool,
    /// Why this store cannot answer the read (see [`Store::rows`]): the stream's only item.
    refused: Option<Error>,
}

impl RowStream<'_> {
    /// Positions the iterator on the last key before `range.end` (reverse scans).
    fn seek_before_end(&mut self, range: &KeyRange) {
        // SeekForPrev at or past the iterate upper bound is not well defined in RocksDB;
        // SeekToLast honours the bound.
        if range.end >= self.table_end {
            self.it.seek_to_last();
        } else {
            self.it.seek_for_prev(&range.end);
        }
        if self.it.key().is_some_and(|k| k >= range.end.as_slice()) {
            self.it.prev();
        }
    }

    /// Reads the row whose keys start with `prefix`, the iterator being on its first key;
    /// leaves the iterator after the row.
    fn read_row(&mut self, prefix: &[u8], row: Vec<u8>) -> Result<Row> {
        self.entries.clear();
        while let (Some(k), Some(v)) = (self.it.key(), self.it.value()) {
            if !k.starts_with(prefix) {
                break;
            }
            self.entries.push((k.into(), Bytes::copy_from_slice(v)));
            self.it.next();
        }
        self.it.status()?;
        Ok(assemble_row(
            self.table,
            self.now,
            Bytes::from(row),
            &self.entries,
        ))
    }

    /// The next row (possibly one without live cells), or None at the end of every range.
    fn next_row(&mut self) -> Result<Option<Row>> {
        loop {
            if self.current.is_none() {
                let Some(r) = self.ranges.next() else {
                    return Ok(None);
                };
                if self.reversed {
                    self.seek_before_end(&r);
                } else {
                    self.it.seek(&r.start);
                }
                self.current = Some(r);
            }
            let range = self.current.as_ref().expect("set above");
            let row = match self.it.key() {
                Some(k) if !self.reversed && k < range.end.as_slice() => decode_row(k),
                Some(k) if self.reversed && k >= range.start.as_slice() => decode_row(k),
                _ => {
                    // The end of this range (or an error, which status reports).
                    self.it.status()?;
                    self.current = None;
                    continue;
                }
            };
            let Some(row) = row else {
                return Err(Error::Corrupt("undecodable key in data".into()));
            };
            let prefix = encoding::row_prefix(self.table.id, &row);
            if !self.reversed {
                return self.read_row(&prefix, row).map(Some);
            }
            // Reverse: read the row forwards from its first key, then step before it
            // (`prefix` itself is never a key, so this lands on the previous row).
            self.it.seek(&prefix);
            let r = self.read_row(&prefix, row)?;
            self.it.seek_for_prev(&prefix);
            return Ok(Some(r));
        }
    }
}

impl Iterator for RowStream<'_> {
    type Item = Result<Row>;

    fn next(&mut self) -> Option<Result<Row>> {
        if let Some(refused) = self.refused.take() {
            self.failed = true;
            return Some(Err(refused));
        }
        if self.failed {
            return None;
        }
        loop {
            match self.next_row() {
                Ok(Some(row)) if row.cells.is_empty() => continue,
                Ok(Some(row)) => return Some(Ok(row)),
                Ok(None) => return None,
                Err(e) => {
                    self.failed = true;
                    return Some(Err(e));
                }
            }
        }
    }
}

/// A [`RowStream`] through a pushed-down filter (see [`Store::scan`]).
pub struct Scan<'a> {
    rows: RowStream<'a>,
    filter: &'a dyn CellFilter,
}

impl Iterator for Scan<'_> {
    type Item = Result<ScannedRow>;

    fn next(&mut self) -> Option<Result<ScannedRow>> {
        let row = match self.rows.next()? {
            Ok(row) => row,
            Err(e) => return Some(Err(e)),
        };
        Some(match self.filter.apply(&row) {
            Ok(cells) => Ok(ScannedRow {
                cells_seen: row.cells.len(),
                key: row.key,
                cells,
            }),
            Err(e) => {
                // A filter that fails ends the scan (as a storage error ends it).
                self.rows.failed = true;
                Err(e.into())
            }
        })
    }
}

impl Store {
    /// Options of an iterator over a table in key order (scans).
    pub(crate) fn read_opts(&self, table_id: u64) -> ReadOptions {
        let mut opts = ReadOptions::default();
        opts.set_total_order_seek(true);
        opts.set_iterate_lower_bound(encoding::table_prefix(table_id));
        opts.set_iterate_upper_bound(encoding::table_end(table_id));
        opts
    }

    /// Options of an iterator whose every seek reads within one row: the seek uses the
    /// row-prefix bloom filters and the iterator ends at the end of the seek key's row.
    pub(crate) fn row_read_opts(&self) -> ReadOptions {
        let mut opts = ReadOptions::default();
        opts.set_prefix_same_as_start(true);
        opts
    }

    /// The rows of `rows` that have live cells, in key order (or reverse key order), as a
    /// stream the caller pulls from: the read path merges such streams and stops when it has
    /// what it needs. Rows are consistent: a row is never seen half-mutated.
    ///
    /// The stream reads one snapshot, taken here. When some of `rows` are not served by this
    /// store at that point (fenced for a move, or moved away: see [`crate::fences`]) its only
    /// item is the refusal ("moving" or "not owner", retryable): a read never ends early with
    /// the rows of a range that moved while it was on its way.
    pub fn rows<'a>(
        &'a self,
        table: &'a TableSchema,
        rows: &RowSet,
        reversed: bool,
    ) -> RowStream<'a> {
        let mut ranges: Vec<KeyRange> = rows
            .ranges()
            .iter()
            .map(|r| key_range(table.id, r))
            .collect();
        // Ranges of single rows (point reads, ReadRows of row keys, a row read before a
        // conditional write) seek row by row with the row-prefix bloom filters.
        let single_rows = !reversed && rows.ranges().iter().all(RowRange::is_single_row);
        let opts = if single_rows {
            self.row_read_opts()
        } else {
            self.read_opts(table.id)
        };
        if reversed {
            ranges.reverse();
        }
        // The order matters: the count of returns first, then the snapshot (the iterator),
        // then the check (a release fences before it deletes, see `Store::release`).
        let returns = self.fences.read().returns();
        let it = self.db.raw_iterator_cf_opt(self.data(), opts);
        let refused = self.fences.read().read_refusal(table, rows, returns);
        RowStream {
            table,
            it,
            table_end: encoding::table_end(table.id),
            ranges: ranges.into_iter(),
            current: None,
            reversed,
            now: now_micros(),
            entries: Vec::new(),
            failed: false,
            refused,
        }
    }

    /// A scan with the read's filter pushed down: each row of `rows` with live cells, in key
    /// order (or reverse key order), with the cells `filter` keeps and the number it had.
    pub fn scan<'a>(
        &'a self,
        table: &'a TableSchema,
        rows: &RowSet,
        reversed: bool,
        filter: &'a dyn CellFilter,
    ) -> Scan<'a> {
        Scan {
            rows: self.rows(table, rows, reversed),
            filter,
        }
    }

    /// Reads one row (all its live cells).
    pub fn read_row(&self, table: &TableSchema, row: &[u8]) -> Result<Row> {
        match self.rows(table, &RowSet::from_keys([row]), false).next() {
            Some(found) => found,
            None => Ok(Row {
                key: Bytes::copy_from_slice(row),
                cells: vec![],
            }),
        }
    }

    /// Row keys that split the table into parts, with the stored bytes before each; the last
    /// sample is the empty key with the table's total size. Tablet boundaries are always samples.
    pub fn sample_row_keys(&self, table: &TableSchema) -> Result<Vec<(Bytes, u64)>> {
        let (start, end) = (
            encoding::table_prefix(table.id),
            encoding::table_end(table.id),
        );
        let on_disk = self
            .db
            .get_approximate_sizes_cf(self.data(), &[rocksdb::Range::new(&start, &end)])[0];
        let mut samples: Vec<(Bytes, u64)> = Vec::new();
        let mut splits = table.splits.iter().peekable();
        if on_disk < self.sample_scan_limit {
            // Small table: walk it and count exact bytes (keys + values).
            let mut it = self
                .db
                .raw_iterator_cf_opt(self.data(), self.read_opts(table.id));
            it.seek(&start);
            let mut total: u64 = 0;
            let mut last_sample: u64 = 0;
            let mut current_row: Option<Vec<u8>> = None;
            while let (Some(k), Some(v)) = (it.key(), it.value()) {
                let starts_new_row = current_row
                    .as_ref()
                    .is_none_or(|r| !k.starts_with(&encoding::row_prefix(table.id, r)));
                if starts_new_row {
                    let row = decode_row(k)
                        .ok_or_else(|| Error::Corrupt("undecodable key in data".into()))?;
                    while let Some(split) = splits.next_if(|s| s.as_slice() <= row.as_slice()) {
                        samples.push((Bytes::copy_from_slice(split), total));
                        last_sample = total;
                    }
                    if total - last_sample >= SAMPLE_INTERVAL {
                        samples.push((Bytes::copy_from_slice(&row), total));
                        last_sample = total;
                    }
                    current_row = Some(row);
                }
                total += (k.len() + v.len()) as u64;
                it.next();
            }
            it.status()?;
            for split in splits {
                samples.push((Bytes::copy_from_slice(split), total));
            }
            samples.push((Bytes::new(), total));
        } else {
            // Large table: candidate keys from SST boundaries and tablet boundaries, offsets
            // from RocksDB's size estimates.
            let mut candidates: BTreeSet<Vec<u8>> = table.splits.iter().cloned().collect();
            for file in self.db.live_files()? {
                if file.column_family_name != CF_DATA {
                    continue;
                }
                if let Some(k) = file.end_key.as_deref()
                    && k >= start.as_slice()
                    && k < end.as_slice()
                    && let Some(row) = decode_row(k)
                {
                    candidates.insert(row);
                }
            }
            let prefixes: Vec<Vec<u8>> = candidates
                .iter()
                .map(|row| encoding::row_prefix(table.id, row))
                .collect();
            let ranges: Vec<rocksdb::Range> = prefixes
                .iter()
                .map(|p| rocksdb::Range::new(&start, p))
                .collect();
            let sizes = self.db.get_approximate_sizes_cf(self.data(), &ranges);
            let mut last_sample = 0u64;
            let mut running = 0u64;
            for (row, size) in candidates.iter().zip(sizes) {
                running = running.max(size);
                let is_split = table.splits.binary_search(row).is_ok();
                if is_split || running - last_sample >= SAMPLE_INTERVAL {
                    samples.push((Bytes::copy_from_slice(row), running));
                    last_sample = running;
                }
            }
            samples.push((Bytes::new(), on_disk.max(running)));
        }
        Ok(samples)
    }
}

pub(crate) fn decode_row(key: &[u8]) -> Option<Vec<u8>> {
    let rest = key.get(8..)?;
    encoding::unescape(rest).map(|(row, _)| row)
}

/// Builds the live view of one row from its raw entries (in key order): resolves tombstones by
/// version, hides dropped families and applies each family's GC rule.
/// The column `assemble_row` is in: its key parts (borrowed from the row's keys), its
/// tombstones, how many live versions it has shown, and the family and qualifier its cells
/// share once it has one.
#[derive(Default)]
struct ColumnState<'a> {
    column: Option<(&'a str, std::borrow::Cow<'a, [u8]>)>,
    tombs: Vec<(i64, i64, Version)>,
    index: usize,
    out: Option<(String, Bytes)>,
}

impl<'a> ColumnState<'a> {
    /// Moves to (family, qualifier) if that is not the current column.
    fn enter(&mut self, family: &'a str, qualifier: std::borrow::Cow<'a, [u8]>) {
        let same = self
            .column
            .as_ref()
            .is_some_and(|(f, q)| *f == family && q.as_ref() == qualifier.as_ref());
        if !same {
            *self = ColumnState {
                column: Some((family, qualifier)),
                tombs: std::mem::take(&mut self.tombs),
                ..Default::default()
            };
            self.tombs.clear();
        }
    }

    /// The family and qualifier of the current column's cells.
    fn names(&mut self) -> (String, Bytes) {
        let column = &self.column;
        self.out
            .get_or_insert_with(|| {
                let (f, q) = column.as_ref().expect("a column was entered");
                (f.to_string(), Bytes::copy_from_slice(q))
            })
            .clone()
    }
}

fn assemble_row(table: &TableSchema, now: i64, key: Bytes, entries: &[(Box<[u8]>, Bytes)]) -> Row {
    use encoding::KeyEntryRef;
    let mut cells = Vec::new();
    let mut row_tomb: Option<Version> = None;
    let mut family_tomb: Option<(&str, Version)> = None;
    let mut col = ColumnState::default();
    for (k, v) in entries {
        let (Some(entry), Some((version, kind, _))) =
            (encoding::decode_entry(k), encoding::decode_value(v))
        else {
            continue;
        };
        match entry {
            KeyEntryRef::RowTombstone => {
                row_tomb = row_tomb.max(Some(version));
            }
            KeyEntryRef::FamilyTombstone { family } => {
                family_tomb = Some((family, version));
            }
            KeyEntryRef::ColumnTombstone {
                family,
                qualifier,
                start,
                end,
            } => {
                col.enter(family, qualifier);
                col.tombs.push((start, end, version));
            }
            KeyEntryRef::Cell {
                family,
                qualifier,
                timestamp,
            } => {
                if !matches!(
                    kind,
                    ValueKind::Plain | ValueKind::Aggregate | ValueKind::AggregateParts
                ) {
                    continue;
                }
                let Some(schema) = table.families.get(family) else {
                    continue;
                };
                if table.dropped(family, version.hlc) {
                    continue;
                }
                col.enter(family, qualifier);
                let deleted = row_tomb.is_some_and(|t| version < t)
                    || family_tomb.is_some_and(|(f, t)| f == family && version < t)
                    || col
                        .tombs
                        .iter()
                        .any(|&(s, e, t)| s <= timestamp && timestamp < e && version < t);
                if deleted {
                    continue;
                }
                let index = col.index;
                col.index += 1;
                if let Some(rule) = &schema.gc_rule
                    && rule.eligible(Some(index), timestamp, now) == Some(true)
                {
                    continue;
                }
                let value = match (kind, schema.aggregate) {
                    (ValueKind::Aggregate | ValueKind::AggregateParts, Some(aggregator)) => {
                        let parts = Parts::of_value(Some(&v[..]));
                        aggregator.read_value(&Bytes::from(parts.combined(aggregator)))
                    }
                    _ => v.slice(encoding::VALUE_HEADER_LEN..),
                };
                let (family, qualifier) = col.names();
                cells.push(Cell {
                    family,
                    qualifier,
                    timestamp_micros: timestamp,
                    value,
                    labels: vec![],
                });
            }
        }
    }
    Row { key, cells }
}
