//! On-disk key and value encoding (format version [`FORMAT_VERSION`]; see `docs/storage-format.md`).
//!
//! Every key of the `data` column family starts with the table's numeric id and the escaped row
//! key, so a row is one contiguous key range and a table (or a tablet: a row range of a table)
//! is one contiguous key range too. Inside a row, keys sort exactly as Bigtable returns cells:
//! family, then qualifier (bytes), then timestamp newest first. Tombstones sort before the cells
//! they cover, so a forward scan of a row meets every delete before the data it hides.
//!
//! ```text
//! key    := table_id:u64be  esc(row)  rest
//! rest   := 0x00                                         row tombstone   (DeleteFromRow)
//!         | 0x01 esc(family) 0x00                        family tombstone (DeleteFromFamily)
//!         | 0x01 esc(family) 0x01 esc(qualifier) 0x00 start:u64be end:u64be
//!                                                        column tombstone (DeleteFromColumn)
//!         | 0x01 esc(family) 0x01 esc(qualifier) 0x01 inv_ts:u64be
//!                                                        cell
//! esc(b) := b with every 0x00 written as 0x00 0xFF, then the terminator 0x00 0x01
//! inv_ts := !(ts as u64 ^ 1<<63)   (order-preserving for i64, then inverted: newest first)
//!
//! value  := version:u64be cluster:u16be kind:u8 payload
//! kind   := 0 tombstone | 1 plain value | 2 aggregate state (format 1) | 3 aggregate merge operand
//!         | 4 aggregate parts
//! ```
//! The version (hybrid logical clock + cluster id, [`basalt_model::hlc::Version`]) lives in the value
//! so that rewriting the same cell (same timestamp) replaces it in place; replication compares
//! versions before overwriting (last writer wins).

use std::borrow::Cow;

use basalt_model::hlc::Version;

/// The on-disk format version. Bump it, and write a migration, on any incompatible change.
pub const FORMAT_VERSION: u32 = 3;

const ESCAPE: u8 = 0x00;
const ESCAPED_ZERO: u8 = 0xFF;
const TERMINATOR: u8 = 0x01;

const TAG_ROW_TOMBSTONE: u8 = 0x00;
const TAG_FAMILY: u8 = 0x01;
const TAG_FAMILY_TOMBSTONE: u8 = 0x00;
const TAG_QUALIFIER: u8 = 0x01;
const TAG_COLUMN_TOMBSTONE: u8 = 0x00;
const TAG_CELL: u8 = 0x01;

/// Appends `bytes` escaped and terminated (order-preserving, prefix-free).
pub fn escape_into(out: &mut Vec<u8>, bytes: &[u8]) {
    escape_body_into(out, bytes);
    out.push(ESCAPE);
    out.push(TERMINATOR);
}

/// Appends `bytes` escaped but *not* terminated: the common prefix of every escaped string
/// that starts with `bytes` (used for prefix scans and DropRowRange by prefix).
pub fn escape_body_into(out: &mut Vec<u8>, bytes: &[u8]) {
    out.reserve(bytes.len() + 2);
    for &b in bytes {
        out.push(b);
        if b == ESCAPE {
            out.push(ESCAPED_ZERO);
        }
    }
}

/// Reads one escaped string from the front of `input`; returns it and the remaining input.
pub fn unescape(input: &[u8]) -> Option<(Vec<u8>, &[u8])> {
    let mut out = Vec::with_capacity(input.len().min(64));
    let mut i = 0;
    while i < input.len() {
        let b = input[i];
        if b == ESCAPE {
            match *input.get(i + 1)? {
                ESCAPED_ZERO => out.push(0),
                TERMINATOR => return Some((out, &input[i + 2..])),
                _ => return None,
            }
            i += 2;
        } else {
            out.push(b);
            i += 1;
        }
    }
    None
}

/// Skips one escaped string; returns the remaining input.
fn skip_escaped(input: &[u8]) -> Option<&[u8]> {
    let mut i = 0;
    while i + 1 < input.len() {
        if input[i] == ESCAPE {
            if input[i + 1] == TERMINATOR {
                return Some(&input[i + 2..]);
            }
            i += 2;
        } else {
            i += 1;
        }
    }
    None
}

pub fn table_prefix(table_id: u64) -> Vec<u8> {
    table_id.to_be_bytes().to_vec()
}

/// First key after every key of the table.
pub fn table_end(table_id: u64) -> Vec<u8> {
    (table_id + 1).to_be_bytes().to_vec()
}

/// Length of the row prefix (table id and escaped, terminated row key) that `key` starts
/// with, if it starts with a complete one. Every key of the `data` column family does; the
/// store's RocksDB prefix extractor (row-prefix bloom filters) is built on this.
pub fn row_prefix_len(key: &[u8]) -> Option<usize> {
    let mut i = 8;
    while i < key.len() {
        if key[i] == ESCAPE {
            match *key.get(i + 1)? {
                ESCAPED_ZERO => i += 2,
                TERMINATOR => return Some(i + 2),
                _ => return None,
            }
        } else {
            i += 1;
        }
    }
    None
}

/// Prefix shared by every key of `row`.
pub fn row_prefix(table_id: u64, row: &[u8]) -> Vec<u8> {
    let mut k = table_prefix(table_id);
    escape_into(&mut k, row);
    k
}

/// First key after every key of `row` (and before the next row's keys).
pub fn row_end(table_id: u64, row: &[u8]) -> Vec<u8> {
    let mut k = table_prefix(table_id);
    escape_body_into(&mut k, row);
    k.push(ESCAPE);
    k.push(TERMINATOR + 1);
    k
}

/// Range `[start, end)` of the keys of every row that starts with `prefix`.
pub fn row_prefix_range(table_id: u64, prefix: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let mut start = table_prefix(table_id);
    escape_body_into(&mut start, prefix);
    let end = prefix_successor(&start).unwrap_or_else(|| table_end(table_id));
    (start, end)
}

/// The smallest key greater than every key that starts with `prefix`, if any.
pub fn prefix_successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut out = prefix.to_vec();
    while let Some(last) = out.pop() {
        if last != 0xFF {
            out.push(last + 1);
            return Some(out);
        }
    }
    None
}

pub fn row_tombstone_key(table_id: u64, row: &[u8]) -> Vec<u8> {
    let mut k = row_prefix(table_id, row);
    k.push(TAG_ROW_TOMBSTONE);
    k
}

/// Prefix of every key of `family` in `row`.
pub fn family_prefix(table_id: u64, row: &[u8], family: &str) -> Vec<u8> {
    let mut k = row_prefix(table_id, row);
    k.push(TAG_FAMILY);
    escape_into(&mut k, family.as_bytes());
    k
}

pub fn family_tombstone_key(table_id: u64, row: &[u8], family: &str) -> Vec<u8> {
    let mut k = family_prefix(table_id, row, family);
    k.push(TAG_FAMILY_TOMBSTONE);
    k
}

/// Prefix of every key of one column (family + qualifier) in `row`.
pub fn column_prefix(table_id: u64, row: &[u8], family: &str, qualifier: &[u8]) -> Vec<u8> {
    let mut k = family_prefix(table_id, row, family);
    k.push(TAG_QUALIFIER);
    escape_into(&mut k, qualifier);
    k
}

pub fn column_tombstone_key(
    table_id: u64,
    row: &[u8],
    family: &str,
    qualifier: &[u8],
    start: i64,
    end: i64,
) -> Vec<u8> {
    let mut k = column_prefix(table_id, row, family, qualifier);
    k.push(TAG_COLUMN_TOMBSTONE);
    k.extend_from_slice(&order_i64(start).to_be_bytes());
    k.extend_from_slice(&order_i64(end).to_be_bytes());
    k
}

/// What a cell's key adds to its column's prefix: the cell tag and the timestamp.
pub const CELL_SUFFIX_LEN: usize = 1 + 8;

pub fn cell_key(table_id: u64, row: &[u8], family: &str, qualifier: &[u8], ts: i64) -> Vec<u8> {
    let mut k = column_prefix(table_id, row, family, qualifier);
    k.push(TAG_CELL);
    k.extend_from_slice(&(!order_i64(ts)).to_be_bytes());
    k
}

/// Maps i64 to u64 preserving order.
fn order_i64(v: i64) -> u64 {
    (v as u64) ^ (1 << 63)
}

fn unorder_i64(v: u64) -> i64 {
    (v ^ (1 << 63)) as i64
}

/// A decoded `data` key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedKey {
    pub table_id: u64,
    pub row: Vec<u8>,
    pub entry: KeyEntry,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyEntry {
    RowTombstone,
    FamilyTombstone {
        family: String,
    },
    ColumnTombstone {
        family: String,
        qualifier: Vec<u8>,
        start: i64,
        end: i64,
    },
    Cell {
        family: String,
        qualifier: Vec<u8>,
        timestamp: i64,
    },
}

impl KeyEntry {
    pub fn family(&self) -> Option<&str> {
        match self {
            KeyEntry::RowTombstone => None,
            KeyEntry::FamilyTombstone { family }
            | KeyEntry::ColumnTombstone { family, .. }
            | KeyEntry::Cell { family, .. } => Some(family),
        }
    }
}

fn read_u64(input: &[u8]) -> Option<(u64, &[u8])> {
    let (head, rest) = input.split_first_chunk::<8>()?;
    Some((u64::from_be_bytes(*head), rest))
}

/// A `data` key's entry borrowed from the key: the qualifier is copied only when it holds 0x00
/// bytes (which the encoding escapes). The read path decodes every key it reads with this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyEntryRef<'a> {
    RowTombstone,
    FamilyTombstone {
        family: &'a str,
    },
    ColumnTombstone {
        family: &'a str,
        qualifier: Cow<'a, [u8]>,
        start: i64,
        end: i64,
    },
    Cell {
        family: &'a str,
        qualifier: Cow<'a, [u8]>,
        timestamp: i64,
    },
}

impl KeyEntryRef<'_> {
    pub fn into_owned(self) -> KeyEntry {
        match self {
            KeyEntryRef::RowTombstone => KeyEntry::RowTombstone,
            KeyEntryRef::FamilyTombstone { family } => KeyEntry::FamilyTombstone {
                family: family.to_string(),
            },
            KeyEntryRef::ColumnTombstone {
                family,
                qualifier,
                start,
                end,
            } => KeyEntry::ColumnTombstone {
                family: family.to_string(),
                qualifier: qualifier.into_owned(),
                start,
                end,
            },
            KeyEntryRef::Cell {
                family,
                qualifier,
                timestamp,
            } => KeyEntry::Cell {
                family: family.to_string(),
                qualifier: qualifier.into_owned(),
                timestamp,
            },
        }
    }
}

/// Reads one escaped string from the front of `input`, borrowed unless it holds escaped zeros.
fn unescape_ref(input: &[u8]) -> Option<(Cow<'_, [u8]>, &[u8])> {
    let i = input.iter().position(|&b| b == ESCAPE)?;
    match *input.get(i + 1)? {
        TERMINATOR => Some((Cow::Borrowed(&input[..i]), &input[i + 2..])),
        ESCAPED_ZERO => unescape(input).map(|(v, rest)| (Cow::Owned(v), rest)),
        _ => None,
    }
}

/// Decodes the entry of a `data` key (what follows its table id and row) without copying;
/// `None` for bytes that are not a valid key of this format.
pub fn decode_entry(key: &[u8]) -> Option<KeyEntryRef<'_>> {
    let (_, rest) = read_u64(key)?;
    decode_entry_after_row(skip_escaped(rest)?)
}

fn decode_entry_after_row(rest: &[u8]) -> Option<KeyEntryRef<'_>> {
    let (&tag, rest) = rest.split_first()?;
    let entry = match tag {
        TAG_ROW_TOMBSTONE if rest.is_empty() => KeyEntryRef::RowTombstone,
        TAG_FAMILY => {
            // Family ids never contain 0x00: an escaped family is not a valid key.
            let (Cow::Borrowed(family), rest) = unescape_ref(rest)? else {
                return None;
            };
            let family = std::str::from_utf8(family).ok()?;
            let (&tag, rest) = rest.split_first()?;
            match tag {
                TAG_FAMILY_TOMBSTONE if rest.is_empty() => KeyEntryRef::FamilyTombstone { family },
                TAG_QUALIFIER => {
                    let (qualifier, rest) = unescape_ref(rest)?;
                    let (&tag, rest) = rest.split_first()?;
                    match tag {
                        TAG_COLUMN_TOMBSTONE => {
                            let (start, rest) = read_u64(rest)?;
                            let (end, rest) = read_u64(rest)?;
                            if !rest.is_empty() {
                                return None;
                            }
                            KeyEntryRef::ColumnTombstone {
                                family,
                                qualifier,
                                start: unorder_i64(start),
                                end: unorder_i64(end),
                            }
                        }
                        TAG_CELL => {
                            let (inv, rest) = read_u64(rest)?;
                            if !rest.is_empty() {
                                return None;
                            }
                            KeyEntryRef::Cell {
                                family,
                                qualifier,
                                timestamp: unorder_i64(!inv),
                            }
                        }
                        _ => return None,
                    }
                }
                _ => return None,
            }
        }
        _ => return None,
    };
    Some(entry)
}

/// Decodes a `data` key; `None` for bytes that are not a valid key of this format.
pub fn decode_key(key: &[u8]) -> Option<DecodedKey> {
    let (table_id, rest) = read_u64(key)?;
    let (row, rest) = unescape(rest)?;
    let entry = decode_entry_after_row(rest)?.into_owned();
    Some(DecodedKey {
        table_id,
        row,
        entry,
    })
}

/// Cheap partial decode for the compaction filter: table id and family (if any) without
/// allocating the row key.
pub fn peek_table_and_family(key: &[u8]) -> Option<(u64, Option<&[u8]>)> {
    let (table_id, rest) = read_u64(key)?;
    let rest = skip_escaped(rest)?;
    let (&tag, rest) = rest.split_first()?;
    if tag != TAG_FAMILY {
        return Some((table_id, None));
    }
    // Families are `[-_.a-zA-Z0-9]+`: never contain 0x00, so the body ends at the terminator.
    let end = rest.iter().position(|&b| b == ESCAPE)?;
    Some((table_id, Some(&rest[..end])))
}

/// Kind of a stored value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ValueKind {
    /// A tombstone: the payload is empty.
    Tombstone = 0,
    /// A plain cell value: the payload is the value bytes.
    Plain = 1,
    /// Format 1's state of an aggregate cell (an 8-byte big-endian integer, or a sketch);
    /// read as one part ([`crate::merge_operator::LEGACY_ORIGIN`]), never written.
    Aggregate = 2,
    /// An AddToCell/MergeToCell input awaiting a merge: aggregator code, 8-byte input and
    /// origin (see [`crate::merge_operator`]). Reads never see it: RocksDB merges it into the
    /// cell's parts.
    MergeOperand = 3,
    /// An aggregate cell: its parts per origin ([`crate::merge_operator::Parts`]).
    AggregateParts = 4,
}

pub const VALUE_HEADER_LEN: usize = 11;

pub fn encode_value(version: Version, kind: ValueKind, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(VALUE_HEADER_LEN + payload.len());
    v.extend_from_slice(&version.hlc.to_be_bytes());
    v.extend_from_slice(&version.cluster.to_be_bytes());
    v.push(kind as u8);
    v.extend_from_slice(payload);
    v
}

/// Splits a stored value into its version, kind and payload.
pub fn decode_value(value: &[u8]) -> Option<(Version, ValueKind, &[u8])> {
    if value.len() < VALUE_HEADER_LEN {
        return None;
    }
    let hlc = u64::from_be_bytes(value[0..8].try_into().ok()?);
    let cluster = u16::from_be_bytes(value[8..10].try_into().ok()?);
    let kind = match value[10] {
        0 => ValueKind::Tombstone,
        1 => ValueKind::Plain,
        2 => ValueKind::Aggregate,
        3 => ValueKind::MergeOperand,
        4 => ValueKind::AggregateParts,
        _ => return None,
    };
    Some((Version { hlc, cluster }, kind, &value[VALUE_HEADER_LEN..]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn cells_sort_like_bigtable() {
        let t = 7;
        let keys = [
            row_tombstone_key(t, b"r"),
            family_tombstone_key(t, b"r", "a"),
            column_tombstone_key(t, b"r", "a", b"", 0, i64::MAX),
            cell_key(t, b"r", "a", b"", 3000),
            cell_key(t, b"r", "a", b"", 1000),
            column_tombstone_key(t, b"r", "a", b"q", 0, 5),
            cell_key(t, b"r", "a", b"q", 9000),
            cell_key(t, b"r", "a", b"q\0", 9000),
            cell_key(t, b"r", "a", b"q\x01", 9000),
            family_tombstone_key(t, b"r", "b"),
            cell_key(t, b"r", "b", b"", 0),
            cell_key(t, b"r\0", "a", b"", 0),
            cell_key(t, b"r\0\0", "a", b"", 0),
            cell_key(t, b"r\x01", "a", b"", 0),
            cell_key(t, b"s", "a", b"", 0),
            cell_key(t + 1, b"", "a", b"", 0),
        ];
        for w in keys.windows(2) {
            assert!(w[0] < w[1], "{:?} !< {:?}", w[0], w[1]);
        }
    }

    #[test]
    fn row_bounds_enclose_exactly_the_row() {
        let t = 1;
        let start = row_prefix(t, b"ab");
        let end = row_end(t, b"ab");
        assert!(start <= cell_key(t, b"ab", "f", b"q", 0));
        assert!(cell_key(t, b"ab", "zz", &[0xFF; 10], i64::MIN) < end);
        assert!(end <= row_prefix(t, b"ab\0"));
        assert!(end <= row_prefix(t, b"ab\x00\x00"));
        assert!(row_prefix(t, b"a") < start);
        assert!(row_end(t, b"a") <= start);
    }

    #[test]
    fn prefix_range_selects_rows_with_prefix() {
        let t = 3;
        let (s, e) = row_prefix_range(t, b"ab");
        for row in [&b"ab"[..], b"ab\0", b"abz", b"ab\xff\xff"] {
            let k = cell_key(t, row, "f", b"", 0);
            assert!(s <= k && k < e, "{row:?}");
        }
        for row in [&b"aa"[..], b"a", b"ac", b"b"] {
            let k = cell_key(t, row, "f", b"", 0);
            assert!(!(s <= k && k < e), "{row:?}");
        }
        let (s, e) = row_prefix_range(t, b"\xff");
        assert!(s <= cell_key(t, b"\xff\xff", "f", b"", 0));
        assert_eq!(e, table_end(t));
        assert_eq!(prefix_successor(&[1, 0xFF]), Some(vec![2]));
        assert_eq!(prefix_successor(&[0xFF]), None);
    }

    #[test]
    fn peek_finds_table_and_family() {
        let k = cell_key(9, b"r\0w", "fam", b"q", 5);
        assert_eq!(peek_table_and_family(&k), Some((9, Some(&b"fam"[..]))));
        assert_eq!(
            peek_table_and_family(&row_tombstone_key(4, b"x")),
            Some((4, None))
        );
        assert_eq!(peek_table_and_family(b"\x00"), None);
    }

    #[test]
    fn values_round_trip() {
        let v = Version {
            hlc: 123456789,
            cluster: 7,
        };
        let enc = encode_value(v, ValueKind::Plain, b"hello");
        assert_eq!(
            decode_value(&enc),
            Some((v, ValueKind::Plain, &b"hello"[..]))
        );
        assert_eq!(decode_value(b"short"), None);
    }

    proptest! {
        #[test]
        fn escape_preserves_order(a in proptest::collection::vec(any::<u8>(), 0..12),
                                  b in proptest::collection::vec(any::<u8>(), 0..12)) {
            let (mut ea, mut eb) = (Vec::new(), Vec::new());
            escape_into(&mut ea, &a);
            escape_into(&mut eb, &b);
            prop_assert_eq!(a.cmp(&b), ea.cmp(&eb));
            let (back, rest) = unescape(&ea).unwrap();
            prop_assert_eq!(back, a);
            prop_assert!(rest.is_empty());
        }

        #[test]
        fn keys_round_trip(table in any::<u64>().prop_map(|t| t >> 1),
                           row in proptest::collection::vec(any::<u8>(), 1..16),
                           qual in proptest::collection::vec(any::<u8>(), 0..16),
                           ts in any::<i64>(), start in any::<i64>(), end in any::<i64>()) {
            let fam = "cf-1.x_Y";
            let cases = [
                (row_tombstone_key(table, &row), KeyEntry::RowTombstone),
                (family_tombstone_key(table, &row, fam), KeyEntry::FamilyTombstone { family: fam.into() }),
                (column_tombstone_key(table, &row, fam, &qual, start, end), KeyEntry::ColumnTombstone { family: fam.into(), qualifier: qual.clone(), start, end }),
                (cell_key(table, &row, fam, &qual, ts), KeyEntry::Cell { family: fam.into(), qualifier: qual.clone(), timestamp: ts }),
            ];
            let prefix = row_prefix(table, &row);
            prop_assert_eq!(row_prefix_len(&prefix), Some(prefix.len()));
            prop_assert_eq!(row_prefix_len(&row_end(table, &row)), None);
            for (key, entry) in cases {
                prop_assert_eq!(row_prefix_len(&key), Some(prefix.len()));
                prop_assert_eq!(decode_entry(&key).map(KeyEntryRef::into_owned), Some(entry.clone()));
                let d = decode_key(&key).unwrap();
                prop_assert_eq!(d.table_id, table);
                prop_assert_eq!(&d.row, &row);
                prop_assert_eq!(d.entry, entry);
                prop_assert!(row_prefix(table, &row) <= key && key < row_end(table, &row));
            }
        }

        #[test]
        fn timestamps_sort_newest_first(a in any::<i64>(), b in any::<i64>()) {
            let ka = cell_key(1, b"r", "f", b"q", a);
            let kb = cell_key(1, b"r", "f", b"q", b);
            prop_assert_eq!(ka.cmp(&kb), b.cmp(&a));
        }
    }
}
