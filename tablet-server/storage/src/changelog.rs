//! The change log: a durable, logical record of every write of the data path, for the
//! consumers that must see each write once more elsewhere — peer clusters (replication), later
//! log backup and change streams.
//!
//! **Logical, not physical.** An entry is what the client asked, with the versions the write
//! took: the table, the first [`Version`] (the write's mutations took consecutive clock values
//! from it, in request order: row by row, mutation by mutation) and the rows' mutations. Not the
//! RocksDB WAL and not the move capture's key operations: a `DeleteFromRow` replayed as the key
//! deletes it made here would erase cells another cluster wrote later; replayed as a deletion at
//! its version, it hides only older cells (`../shared/DISTRIBUTED.md`, "The change log").
//!
//! **In the data's own write.** The committer puts each logged job's entry into the column
//! family `log` under the next sequence number (1, 2, …, big-endian: key order is log order) in
//! the same synced WriteBatch as the group's data: an acknowledged write is a logged write, and a
//! write that failed left neither. Sequence numbers follow commit order and are never reused; the
//! next one is found again at open from the last key.
//!
//! **Long values by reference.** A SetCell whose value is over [`INLINE_VALUE_MAX`] bytes is
//! logged without it ([`LogEntry::encode_logged`]): the same batch writes the value into the
//! data cell the mutation names, with the mutation's version. [`Store::read_change_log`] reads
//! it back from there; a cell that holds another version by then, or nothing, was decided by a
//! later write or delete, which is what its consumers get instead
//! ([`LogEntry::unresolved`]). A range this store gives up is deleted only after the values
//! its entries refer to there are copied into them ([`Store::release`]).
//!
//! **Only while on.** Writers encode an entry only while the log is on
//! ([`Store::set_change_log`]; off by default: a single cluster needs none), read when the write
//! is built. A consumer that starts from a snapshot turns the log on first and takes its snapshot
//! once the writes built before are committed (as the move capture does with its operations).
//!
//! **Consumers and truncation.** Each consumer keeps a durable cursor in the store
//! ([`Store::set_log_cursor`]): the last sequence it has made durable elsewhere. Cursors only move
//! forward. [`Store::truncate_change_log`] deletes the entries at or below every cursor — never
//! one a consumer has not acknowledged; with no consumer, nothing is waiting and everything
//! logged may go. A consumer not heard from for longer than the retention (the caller's; 7 days
//! by default, [`DEFAULT_RETENTION`]) no longer holds the log back: it is reported stale and must
//! be re-seeded — the log's size is watched ([`Store::change_log_bytes`]), never bounded by
//! dropping what a live consumer still needs.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::Duration;

use basalt_model::aggregate::Aggregator;
use basalt_model::hlc::{Version, now_micros};
use basalt_model::{Mutation, RowMutation, RowRange};
use bytes::Bytes;
use rocksdb::{Direction, IteratorMode, WriteBatch};

use crate::encoding::{self, ValueKind};
use crate::error::{Error, Result};
use crate::layout::{CF_LOG, META_LOG_CURSOR_PREFIX, META_LOG_TRUNCATED, log_seq_of as seq_of};
use crate::store::Store;

/// How long a consumer may go unheard before it stops holding the log back.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// The format of an encoded entry (its first byte).
const ENTRY_FORMAT: u8 = 1;

/// One write of the data path, as logged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogEntry {
    /// The table written (its id in this store's catalog).
    pub table_id: u64,
    /// The version of the write's first mutation; the others follow in request order.
    pub first: Version,
    pub rows: Vec<RowMutation>,
    /// The SetCells (row index, mutation index, ascending) logged by reference whose values
    /// are not in `rows` (left empty there). [`LogEntry::decode`] lists every SetCell logged
    /// by reference; [`Store::read_change_log`] fills in the values the data still holds at
    /// the version the write took and leaves listed only those overwritten or deleted since:
    /// a later write (logged after it here, or with a greater version elsewhere) decides those
    /// cells, so they are not to be replicated ([`LogEntry::rows_with_versions`] leaves them
    /// out).
    pub unresolved: Vec<(usize, usize)>,
}

impl LogEntry {
    /// The version of each mutation, in request order: (row index, mutation index, version).
    pub fn versions(&self) -> impl Iterator<Item = (usize, usize, Version)> + '_ {
        self.rows
            .iter()
            .enumerate()
            .flat_map(|(r, row)| (0..row.mutations.len()).map(move |m| (r, m)))
            .zip(0u64..)
            .map(|((r, m), i)| {
                (
                    r,
                    m,
                    Version {
                        hlc: self.first.hlc + i,
                        cluster: self.first.cluster,
                    },
                )
            })
    }

    /// The entry as logged: the SetCells of `unresolved` by reference, the rest in full.
    pub fn encode(&self) -> Vec<u8> {
        Self::encode_with(self.table_id, self.first, &self.rows, |r, m| {
            self.unresolved.binary_search(&(r, m)).is_ok()
        })
    }

    /// The entry of a write of `rows` to table `table_id` whose versions start at `first`,
    /// encoded straight from the request (no copy of its rows), every value in full: what a
    /// replicated row carries.
    pub fn encode_write(table_id: u64, first: Version, rows: &[RowMutation]) -> Vec<u8> {
        Self::encode_with(table_id, first, rows, |_, _| false)
    }

    /// As [`LogEntry::encode_write`], for the change log: a SetCell whose value is longer than
    /// [`INLINE_VALUE_MAX`] is logged by reference (family, qualifier, timestamp; the entry's
    /// version names the write): the value is in the same batch's data, and the shippers read
    /// it from there. Every value would otherwise go through the WAL and the memtables twice.
    pub fn encode_logged(table_id: u64, first: Version, rows: &[RowMutation]) -> Vec<u8> {
        Self::encode_with(
            table_id,
            first,
            rows,
            |r, m| matches!(&rows[r].mutations[m], Mutation::SetCell { value, .. } if value.len() > INLINE_VALUE_MAX),
        )
    }

    /// `rows` encoded, the SetCells for which `by_reference(row index, mutation index)` holds
    /// by reference (any other mutation it names is written in full).
    fn encode_with(
        table_id: u64,
        first: Version,
        rows: &[RowMutation],
        by_reference: impl Fn(usize, usize) -> bool,
    ) -> Vec<u8> {
        // Sized once: a 100-row batch of 1 KiB values would otherwise grow (and copy) its
        // buffer a dozen times on the writer's thread.
        let mut out = Vec::with_capacity(encoded_bound(rows, &by_reference));
        out.push(ENTRY_FORMAT);
        varint(&mut out, table_id);
        varint(&mut out, first.hlc);
        varint(&mut out, u64::from(first.cluster));
        varint(&mut out, rows.len() as u64);
        for (r, row) in rows.iter().enumerate() {
            bytes(&mut out, &row.row);
            varint(&mut out, row.mutations.len() as u64);
            for (i, m) in row.mutations.iter().enumerate() {
                match m {
                    Mutation::SetCell {
                        family,
                        qualifier,
                        timestamp,
                        ..
                    } if by_reference(r, i) => {
                        out.push(SET_CELL_REF);
                        bytes(&mut out, family.as_bytes());
                        bytes(&mut out, qualifier);
                        out.extend_from_slice(&timestamp.to_le_bytes());
                    }
                    m => mutation(&mut out, m),
                }
            }
        }
        out
    }

    /// Every row with the version of its first mutation, without the unresolved SetCells: a
    /// row that has some is cut around them, each piece with the version of its own first
    /// mutation (the versions stay those the write took).
    pub fn rows_with_versions(&self) -> impl Iterator<Item = (Version, Cow<'_, RowMutation>)> {
        let mut hlc = self.first.hlc;
        let cluster = self.first.cluster;
        self.rows.iter().enumerate().flat_map(move |(r, row)| {
            let first = hlc;
            hlc += row.mutations.len() as u64;
            let version = |i: usize| Version {
                hlc: first + i as u64,
                cluster,
            };
            let lo = self.unresolved.partition_point(|&(ur, _)| ur < r);
            let hi = self.unresolved.partition_point(|&(ur, _)| ur <= r);
            let skipped = self.unresolved[lo..hi].iter().map(|&(_, m)| m);
            let pieces: Vec<(Version, Cow<'_, RowMutation>)> = if lo == hi {
                vec![(version(0), Cow::Borrowed(row))]
            } else {
                let mut pieces = Vec::new();
                let mut start = 0;
                for end in skipped.chain([row.mutations.len()]) {
                    if end > start {
                        pieces.push((
                            version(start),
                            Cow::Owned(RowMutation {
                                row: row.row.clone(),
                                mutations: row.mutations[start..end].to_vec(),
                            }),
                        ));
                    }
                    start = end + 1;
                }
                pieces
            };
            pieces
        })
    }

    pub fn decode(data: &[u8]) -> Result<LogEntry> {
        let mut r = Reader { data, at: 0 };
        let format = r.u8()?;
        if format != ENTRY_FORMAT {
            return Err(corrupt(format!("unknown change log entry format {format}")));
        }
        let table_id = r.varint()?;
        let hlc = r.varint()?;
        let cluster = u16::try_from(r.varint()?).map_err(|_| corrupt("cluster id over 16 bits"))?;
        let n = r.len()?;
        let mut rows = Vec::with_capacity(n.min(1 << 16));
        let mut unresolved = Vec::new();
        for ri in 0..n {
            let row = r.bytes()?;
            let m = r.len()?;
            let mut mutations = Vec::with_capacity(m.min(1 << 16));
            for mi in 0..m {
                let (mutation, by_reference) = r.mutation()?;
                if by_reference {
                    unresolved.push((ri, mi));
                }
                mutations.push(mutation);
            }
            rows.push(RowMutation { row, mutations });
        }
        if r.at != data.len() {
            return Err(corrupt("bytes after the entry"));
        }
        Ok(LogEntry {
            table_id,
            first: Version { hlc, cluster },
            rows,
            unresolved,
        })
    }
}

const SET_CELL: u8 = 1;
const DELETE_FROM_COLUMN: u8 = 2;
const DELETE_FROM_FAMILY: u8 = 3;
const DELETE_FROM_ROW: u8 = 4;
const AGGREGATE: u8 = 5;
const AGGREGATE_PARTS: u8 = 6;
/// A SetCell without its value: the cell of the data at the entry's version holds it.
const SET_CELL_REF: u8 = 7;

/// About the most bytes of entries [`Store::copy_referenced_values`] rewrites in one batch.
const COPY_BATCH_BYTES: usize = 32 << 20;

/// The longest value a SetCell's log entry carries; longer ones are logged by reference
/// ([`LogEntry::encode_logged`]). Below it, the reference would save little and cost a read.
pub const INLINE_VALUE_MAX: usize = 64;

fn aggregator_tag(a: Aggregator) -> u8 {
    match a {
        Aggregator::Sum => 1,
        Aggregator::Min => 2,
        Aggregator::Max => 3,
        Aggregator::Hll => 4,
    }
}

fn mutation(out: &mut Vec<u8>, m: &Mutation) {
    match m {
        Mutation::SetCell {
            family,
            qualifier,
            timestamp,
            value,
        } => {
            out.push(SET_CELL);
            bytes(out, family.as_bytes());
            bytes(out, qualifier);
            out.extend_from_slice(&timestamp.to_le_bytes());
            bytes(out, value);
        }
        Mutation::DeleteFromColumn {
            family,
            qualifier,
            start,
            end,
        } => {
            out.push(DELETE_FROM_COLUMN);
            bytes(out, family.as_bytes());
            bytes(out, qualifier);
            out.extend_from_slice(&start.to_le_bytes());
            out.extend_from_slice(&end.to_le_bytes());
        }
        Mutation::DeleteFromFamily { family } => {
            out.push(DELETE_FROM_FAMILY);
            bytes(out, family.as_bytes());
        }
        Mutation::DeleteFromRow => out.push(DELETE_FROM_ROW),
        Mutation::Aggregate {
            family,
            qualifier,
            timestamp,
            aggregator,
            input,
        } => {
            out.push(AGGREGATE);
            bytes(out, family.as_bytes());
            bytes(out, qualifier);
            out.extend_from_slice(&timestamp.to_le_bytes());
            out.push(aggregator_tag(*aggregator));
            out.extend_from_slice(&input.to_le_bytes());
        }
        Mutation::AggregateParts {
            family,
            qualifier,
            timestamp,
            parts,
        } => {
            out.push(AGGREGATE_PARTS);
            bytes(out, family.as_bytes());
            bytes(out, qualifier);
            out.extend_from_slice(&timestamp.to_le_bytes());
            bytes(out, parts);
        }
    }
}

/// At least the bytes [`LogEntry::encode_with`] writes for `rows`.
fn encoded_bound(rows: &[RowMutation], by_reference: &impl Fn(usize, usize) -> bool) -> usize {
    let rows_len = rows.iter().enumerate().map(|(r, row)| {
        20 + row.row.len()
            + row
                .mutations
                .iter()
                .enumerate()
                .map(|(i, m)| encoded_len(m, by_reference(r, i)))
                .sum::<usize>()
    });
    41 + rows_len.sum::<usize>()
}

/// At least the bytes [`mutation`] writes for `m` (varints counted at their longest); a
/// SetCell `by_reference` without its value.
fn encoded_len(m: &Mutation, by_reference: bool) -> usize {
    const VARINT: usize = 10;
    1 + match m {
        Mutation::SetCell {
            family,
            qualifier,
            value,
            ..
        } => {
            3 * VARINT
                + family.len()
                + qualifier.len()
                + 8
                + if by_reference { 0 } else { value.len() }
        }
        Mutation::DeleteFromColumn {
            family, qualifier, ..
        } => 2 * VARINT + family.len() + qualifier.len() + 16,
        Mutation::DeleteFromFamily { family } => VARINT + family.len(),
        Mutation::DeleteFromRow => 0,
        Mutation::Aggregate {
            family, qualifier, ..
        } => 2 * VARINT + family.len() + qualifier.len() + 8 + 1 + 8,
        Mutation::AggregateParts {
            family,
            qualifier,
            parts,
            ..
        } => 3 * VARINT + family.len() + qualifier.len() + 8 + parts.len(),
    }
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn bytes(out: &mut Vec<u8>, b: &[u8]) {
    varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

fn corrupt(why: impl Into<String>) -> Error {
    Error::Internal(format!("corrupt change log entry: {}", why.into()))
}

struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8]> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.data.len())
            .ok_or_else(|| corrupt("truncated"))?;
        let out = &self.data[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    fn i64(&mut self) -> Result<i64> {
        let b: [u8; 8] = self.take(8)?.try_into().expect("8 bytes");
        Ok(i64::from_le_bytes(b))
    }

    fn varint(&mut self) -> Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(corrupt("varint over 64 bits"))
    }

    fn len(&mut self) -> Result<usize> {
        usize::try_from(self.varint()?).map_err(|_| corrupt("length over usize"))
    }

    fn bytes(&mut self) -> Result<Bytes> {
        let n = self.len()?;
        Ok(Bytes::copy_from_slice(self.take(n)?))
    }

    fn string(&mut self) -> Result<String> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| corrupt("a family name not UTF-8"))
    }

    /// The next mutation, and whether it is a SetCell logged by reference (its value empty).
    fn mutation(&mut self) -> Result<(Mutation, bool)> {
        let tag = self.u8()?;
        if tag == SET_CELL_REF {
            let m = Mutation::SetCell {
                family: self.string()?,
                qualifier: self.bytes()?,
                timestamp: self.i64()?,
                value: Bytes::new(),
            };
            return Ok((m, true));
        }
        Ok((self.inline_mutation(tag)?, false))
    }

    fn inline_mutation(&mut self, tag: u8) -> Result<Mutation> {
        Ok(match tag {
            SET_CELL => Mutation::SetCell {
                family: self.string()?,
                qualifier: self.bytes()?,
                timestamp: self.i64()?,
                value: self.bytes()?,
            },
            DELETE_FROM_COLUMN => Mutation::DeleteFromColumn {
                family: self.string()?,
                qualifier: self.bytes()?,
                start: self.i64()?,
                end: self.i64()?,
            },
            DELETE_FROM_FAMILY => Mutation::DeleteFromFamily {
                family: self.string()?,
            },
            DELETE_FROM_ROW => Mutation::DeleteFromRow,
            AGGREGATE => Mutation::Aggregate {
                family: self.string()?,
                qualifier: self.bytes()?,
                timestamp: self.i64()?,
                aggregator: match self.u8()? {
                    1 => Aggregator::Sum,
                    2 => Aggregator::Min,
                    3 => Aggregator::Max,
                    4 => Aggregator::Hll,
                    t => return Err(corrupt(format!("unknown aggregator {t}"))),
                },
                input: self.i64()?,
            },
            AGGREGATE_PARTS => Mutation::AggregateParts {
                family: self.string()?,
                qualifier: self.bytes()?,
                timestamp: self.i64()?,
                parts: self.bytes()?,
            },
            t => return Err(corrupt(format!("unknown mutation {t}"))),
        })
    }
}

fn cursor_key(consumer: &str) -> Vec<u8> {
    format!("{META_LOG_CURSOR_PREFIX}{consumer}").into_bytes()
}

impl Store {
    /// Turns the change log on or off for the writes built from now on (see the module docs).
    pub fn set_change_log(&self, on: bool) {
        self.change_log.set_on(on);
    }

    /// Whether writes are logged now.
    pub fn change_log_on(&self) -> bool {
        self.change_log.on()
    }

    /// The entries after sequence `after`, in order, until about `max_bytes` of entries and
    /// the values they refer to (at least one entry if there is one). The values logged by
    /// reference are read from the data: those it still holds at the version the write took
    /// are filled in, the others stay [`LogEntry::unresolved`].
    pub fn read_change_log(&self, after: u64, max_bytes: usize) -> Result<Vec<(u64, LogEntry)>> {
        // A range released meanwhile copies its referenced values into the log before it
        // deletes them ([`Store::copy_referenced_values`]): not between the read of an entry
        // and the read of its values.
        let _values = self.change_log.referenced.read();
        let start = after.saturating_add(1).to_be_bytes();
        let mut out = Vec::new();
        let mut bytes = 0usize;
        for item in self.db.iterator_cf(
            self.cf(CF_LOG),
            IteratorMode::From(&start, Direction::Forward),
        ) {
            let (key, value) = item?;
            if !out.is_empty() && bytes + value.len() > max_bytes {
                break;
            }
            let mut entry = LogEntry::decode(&value)?;
            bytes += value.len() + self.resolve(&mut entry, |_| true)?;
            out.push((seq_of(&key)?, entry));
        }
        Ok(out)
    }

    /// Fills in the values of `entry`'s unresolved SetCells whose row `wanted` names and that
    /// the data holds at the version the write took (a plain value); returns their bytes.
    fn resolve(&self, entry: &mut LogEntry, wanted: impl Fn(&[u8]) -> bool) -> Result<usize> {
        if entry.unresolved.is_empty() {
            return Ok(0);
        }
        // The clock value of each row's first mutation, relative to the entry's first.
        let row_first: Vec<u64> = entry
            .rows
            .iter()
            .scan(0u64, |n, row| {
                let first = *n;
                *n += row.mutations.len() as u64;
                Some(first)
            })
            .collect();
        let mut asked = Vec::new();
        let mut keys = Vec::new();
        for &(r, m) in &entry.unresolved {
            let row = &entry.rows[r];
            if !wanted(&row.row) {
                continue;
            }
            if let Mutation::SetCell {
                family,
                qualifier,
                timestamp,
                ..
            } = &row.mutations[m]
            {
                asked.push((r, m));
                keys.push(encoding::cell_key(
                    entry.table_id,
                    &row.row,
                    family,
                    qualifier,
                    *timestamp,
                ));
            }
        }
        let data = self.data();
        let found = self
            .db
            .batched_multi_get_cf(data, keys.iter().map(Vec::as_slice), false);
        let mut bytes = 0;
        let mut resolved = Vec::new();
        for ((r, m), value) in asked.into_iter().zip(found) {
            let Some(value) = value? else { continue };
            let wrote = Version {
                hlc: entry.first.hlc + row_first[r] + m as u64,
                cluster: entry.first.cluster,
            };
            if let Some((version, ValueKind::Plain, payload)) = encoding::decode_value(&value)
                && version == wrote
                && let Mutation::SetCell { value, .. } = &mut entry.rows[r].mutations[m]
            {
                *value = Bytes::copy_from_slice(payload);
                bytes += payload.len();
                resolved.push((r, m));
            }
        }
        entry
            .unresolved
            .retain(|p| resolved.binary_search(p).is_err());
        Ok(bytes)
    }

    /// Copies into the log the values its entries refer to in `range` of `table`, which this
    /// server gives up ([`Store::release`]): its shippers may still have to send them after
    /// the rows are deleted here. Call with the lock that keeps the shippers from reading
    /// references (`change_log.referenced`, for writing) held until the rows are deleted.
    pub(crate) fn copy_referenced_values(&self, table_id: u64, range: &RowRange) -> Result<()> {
        let mut batch = WriteBatch::default();
        for item in self.db.iterator_cf(self.cf(CF_LOG), IteratorMode::Start) {
            let (key, value) = item?;
            let mut entry = LogEntry::decode(&value)?;
            if entry.table_id != table_id || entry.unresolved.is_empty() {
                continue;
            }
            let before = entry.unresolved.len();
            self.resolve(&mut entry, |row| range.contains(row))?;
            if entry.unresolved.len() < before {
                batch.put_cf(self.cf(CF_LOG), key, entry.encode());
                if batch.size_in_bytes() >= COPY_BATCH_BYTES {
                    self.sync_write(std::mem::take(&mut batch))?;
                }
            }
        }
        if !batch.is_empty() {
            self.sync_write(batch)?;
        }
        Ok(())
    }

    /// The schema of the table a log entry names (None: the table is gone).
    pub fn table_by_id(&self, table_id: u64) -> Option<std::sync::Arc<basalt_model::TableSchema>> {
        self.catalog.tables.read().by_id(table_id).cloned()
    }

    /// The last sequence the log took (0: nothing logged yet). Every write acknowledged while
    /// the log was on is at or below it, also after the log was truncated.
    pub fn change_log_last_seq(&self) -> u64 {
        self.change_log.last_seq()
    }

    /// The first and last sequence the log holds; None when it is empty.
    pub fn change_log_bounds(&self) -> Result<Option<(u64, u64)>> {
        let cf = self.cf(CF_LOG);
        let first = self.db.iterator_cf(cf, IteratorMode::Start).next();
        let last = self.db.iterator_cf(cf, IteratorMode::End).next();
        match (first, last) {
            (Some(first), Some(last)) => Ok(Some((seq_of(&first?.0)?, seq_of(&last?.0)?))),
            _ => Ok(None),
        }
    }

    /// Records durably that `consumer` has made every entry through `seq` durable elsewhere,
    /// and that it was heard from now (a consumer with nothing new to acknowledge says so with
    /// its current cursor: it stays fresh, see [`Store::truncate_change_log`]). A cursor only
    /// moves forward: an older `seq` leaves it where it is. Returns the cursor.
    pub fn set_log_cursor(&self, consumer: &str, seq: u64) -> Result<u64> {
        let _one_at_a_time = self.admin.lock();
        let key = cursor_key(consumer);
        let current = self
            .db
            .get_cf(self.meta(), &key)?
            .map(|v| LogCursor::decode(&v))
            .transpose()?;
        let seq = current.map_or(seq, |c| c.seq.max(seq));
        let cursor = LogCursor {
            seq,
            heard_micros: now_micros().max(0) as u64,
        };
        let mut batch = WriteBatch::default();
        batch.put_cf(self.meta(), key, cursor.encode());
        self.sync_write(batch)?;
        Ok(seq)
    }

    /// Forgets `consumer`'s cursor (a peer removed): the log no longer waits for it.
    pub fn remove_log_cursor(&self, consumer: &str) -> Result<()> {
        let _one_at_a_time = self.admin.lock();
        let mut batch = WriteBatch::default();
        batch.delete_cf(self.meta(), cursor_key(consumer));
        self.sync_write(batch)
    }

    /// Every consumer's cursor.
    pub fn log_cursors(&self) -> Result<BTreeMap<String, LogCursor>> {
        let prefix = META_LOG_CURSOR_PREFIX.as_bytes();
        let mut out = BTreeMap::new();
        for item in self
            .db
            .iterator_cf(self.meta(), IteratorMode::From(prefix, Direction::Forward))
        {
            let (key, value) = item?;
            let Some(name) = key.strip_prefix(prefix) else {
                break;
            };
            out.insert(
                String::from_utf8_lossy(name).into_owned(),
                LogCursor::decode(&value)?,
            );
        }
        Ok(out)
    }

    /// Deletes the entries every consumer has acknowledged: at or below the lowest cursor of
    /// the consumers heard from within `retention` (all of them when there is none). A
    /// consumer not heard from for longer no longer holds the log back: it is named in
    /// [`Truncated::stale`] when entries it had not acknowledged go, and needs a re-seed (a
    /// snapshot, then the log from there) before it may follow the log again. The same as
    /// [`Store::change_log_truncation`] then [`Store::truncate_change_log_through`].
    pub fn truncate_change_log(&self, retention: Duration) -> Result<Truncated> {
        let plan = self.change_log_truncation(retention)?;
        self.truncate_change_log_through(plan.through)?;
        Ok(plan)
    }

    /// What [`Store::truncate_change_log`] would delete now, without deleting it: the caller
    /// first arranges a re-seed of the consumers it names stale (their entries are about to
    /// go), then truncates through the returned sequence — still safe later, as cursors only
    /// move forward.
    pub fn change_log_truncation(&self, retention: Duration) -> Result<Truncated> {
        let cursors = self.log_cursors()?;
        let oldest = (now_micros().max(0) as u64)
            .saturating_sub(u64::try_from(retention.as_micros()).unwrap_or(u64::MAX));
        let (fresh, stale): (Vec<_>, Vec<_>) = cursors
            .into_iter()
            .partition(|(_, c)| c.heard_micros >= oldest);
        let Some((first, last)) = self.change_log_bounds()? else {
            return Ok(Truncated::default());
        };
        let through = fresh
            .iter()
            .map(|(_, c)| c.seq)
            .min()
            .unwrap_or(last)
            .min(last);
        if through < first {
            return Ok(Truncated::default());
        }
        let stale = stale
            .into_iter()
            .filter(|(_, c)| c.seq < through)
            .map(|(name, _)| name)
            .collect();
        Ok(Truncated { through, stale })
    }

    /// Deletes the entries through `through` (nothing for 0).
    pub fn truncate_change_log_through(&self, through: u64) -> Result<()> {
        let Some((first, _)) = self.change_log_bounds()? else {
            return Ok(());
        };
        if through < first {
            return Ok(());
        }
        let mut batch = WriteBatch::default();
        batch.delete_range_cf(
            self.cf(CF_LOG),
            first.to_be_bytes(),
            (through + 1).to_be_bytes(),
        );
        batch.put_cf(self.meta(), META_LOG_TRUNCATED, through.to_be_bytes());
        // Not synced: the next synced write (every commit group) makes it durable, and if the
        // machine fails before that, the entries come back and are shipped again, which
        // replicated writes tolerate (applying one twice changes nothing).
        self.db.write(batch)?;
        Ok(())
    }

    /// About how many bytes the change log takes (RocksDB's estimate: memtables and files);
    /// what a size alarm watches.
    pub fn change_log_bytes(&self) -> Result<u64> {
        let cf = self.cf(CF_LOG);
        let mut total = 0u64;
        for property in [
            "rocksdb.estimate-live-data-size",
            "rocksdb.cur-size-all-mem-tables",
        ] {
            total += self.db.property_int_value_cf(cf, property)?.unwrap_or(0);
        }
        Ok(total)
    }
}

/// A consumer's cursor: the last sequence it acknowledged, and when it was last heard from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogCursor {
    pub seq: u64,
    /// Microseconds since the epoch.
    pub heard_micros: u64,
}

impl LogCursor {
    fn encode(&self) -> [u8; 16] {
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&self.seq.to_be_bytes());
        out[8..].copy_from_slice(&self.heard_micros.to_be_bytes());
        out
    }

    fn decode(b: &[u8]) -> Result<LogCursor> {
        let b: [u8; 16] = b
            .try_into()
            .map_err(|_| Error::Internal("a change log cursor is not 16 bytes".into()))?;
        Ok(LogCursor {
            seq: u64::from_be_bytes(b[..8].try_into().expect("8 bytes")),
            heard_micros: u64::from_be_bytes(b[8..].try_into().expect("8 bytes")),
        })
    }
}

/// What a truncation did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Truncated {
    /// The entries through this sequence are gone (0: none was deleted).
    pub through: u64,
    /// The consumers not heard from within the retention whose unacknowledged entries go:
    /// they held nothing back, and need a re-seed.
    pub stale: Vec<String>,
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn any_bytes() -> impl Strategy<Value = Bytes> {
        proptest::collection::vec(any::<u8>(), 0..20).prop_map(Bytes::from)
    }

    fn any_mutation() -> impl Strategy<Value = Mutation> {
        let family = "[a-z_]{1,8}";
        prop_oneof![
            (family, any_bytes(), any::<i64>(), any_bytes()).prop_map(|(f, q, t, v)| {
                Mutation::SetCell {
                    family: f,
                    qualifier: q,
                    timestamp: t,
                    value: v,
                }
            }),
            (family, any_bytes(), any::<i64>(), any::<i64>()).prop_map(|(f, q, s, e)| {
                Mutation::DeleteFromColumn {
                    family: f,
                    qualifier: q,
                    start: s,
                    end: e,
                }
            }),
            family.prop_map(|f| Mutation::DeleteFromFamily { family: f }),
            Just(Mutation::DeleteFromRow),
            (
                family,
                any_bytes(),
                any::<i64>(),
                prop_oneof![
                    Just(Aggregator::Sum),
                    Just(Aggregator::Min),
                    Just(Aggregator::Max),
                    Just(Aggregator::Hll)
                ],
                any::<i64>()
            )
                .prop_map(|(f, q, t, a, i)| Mutation::Aggregate {
                    family: f,
                    qualifier: q,
                    timestamp: t,
                    aggregator: a,
                    input: i,
                }),
            (family, any_bytes(), any::<i64>(), any_bytes()).prop_map(|(f, q, t, p)| {
                Mutation::AggregateParts {
                    family: f,
                    qualifier: q,
                    timestamp: t,
                    parts: p,
                }
            }),
        ]
    }

    fn any_entry() -> impl Strategy<Value = LogEntry> {
        (
            any::<u64>(),
            any::<u64>(),
            any::<u16>(),
            proptest::collection::vec(
                (any_bytes(), proptest::collection::vec(any_mutation(), 0..5)),
                0..5,
            ),
        )
            .prop_map(|(table_id, hlc, cluster, rows)| {
                // Some SetCells logged by reference: those whose value is empty.
                let rows: Vec<RowMutation> = rows
                    .into_iter()
                    .map(|(row, mutations)| RowMutation { row, mutations })
                    .collect();
                let unresolved = rows
                    .iter()
                    .enumerate()
                    .flat_map(|(r, row)| {
                        row.mutations.iter().enumerate().filter_map(move |(m, x)| {
                            matches!(x, Mutation::SetCell { value, .. } if value.is_empty())
                                .then_some((r, m))
                        })
                    })
                    .collect();
                LogEntry {
                    table_id,
                    first: Version { hlc, cluster },
                    rows,
                    unresolved,
                }
            })
    }

    proptest! {
        #[test]
        fn an_entry_decodes_to_itself(entry in any_entry()) {
            let encoded = entry.encode();
            let by_reference = |r, m| entry.unresolved.contains(&(r, m));
            prop_assert!(encoded.len() <= encoded_bound(&entry.rows, &by_reference));
            prop_assert_eq!(LogEntry::decode(&encoded).unwrap(), entry);
        }

        #[test]
        fn a_cut_or_extended_entry_is_refused_not_misread(entry in any_entry(), cut in any::<prop::sample::Index>()) {
            let bytes = entry.encode();
            let at = cut.index(bytes.len());
            prop_assert!(LogEntry::decode(&bytes[..at]).is_err());
            let mut longer = bytes.clone();
            longer.push(0);
            prop_assert!(LogEntry::decode(&longer).is_err());
        }
    }

    #[test]
    fn versions_follow_request_order() {
        let entry = LogEntry {
            table_id: 7,
            first: Version {
                hlc: 100,
                cluster: 2,
            },
            rows: vec![
                RowMutation {
                    row: Bytes::from_static(b"a"),
                    mutations: vec![Mutation::DeleteFromRow, Mutation::DeleteFromRow],
                },
                RowMutation {
                    row: Bytes::from_static(b"b"),
                    mutations: vec![Mutation::DeleteFromRow],
                },
            ],
            unresolved: vec![],
        };
        let v: Vec<(usize, usize, u64)> = entry.versions().map(|(r, m, v)| (r, m, v.hlc)).collect();
        assert_eq!(v, vec![(0, 0, 100), (0, 1, 101), (1, 0, 102)]);
        assert!(entry.versions().all(|(_, _, v)| v.cluster == 2));
    }

    fn set_cell(value: &[u8]) -> Mutation {
        Mutation::SetCell {
            family: "cf".into(),
            qualifier: Bytes::from_static(b"q"),
            timestamp: 1,
            value: Bytes::copy_from_slice(value),
        }
    }

    #[test]
    fn long_values_are_logged_by_reference_and_short_ones_in_full() {
        let long = vec![7u8; INLINE_VALUE_MAX + 1];
        let rows = vec![RowMutation {
            row: Bytes::from_static(b"r"),
            mutations: vec![set_cell(b"short"), set_cell(&long)],
        }];
        let first = Version { hlc: 5, cluster: 1 };
        let logged = LogEntry::encode_logged(3, first, &rows);
        let full = LogEntry::encode_write(3, first, &rows);
        assert_eq!(
            full.len() - logged.len(),
            long.len() + 1,
            "only the value is left out"
        );
        let entry = LogEntry::decode(&logged).unwrap();
        assert_eq!(entry.unresolved, vec![(0, 1)]);
        assert_eq!(entry.rows[0].mutations[0], set_cell(b"short"));
        assert_eq!(entry.rows[0].mutations[1], set_cell(b""));
        assert_eq!(LogEntry::decode(&full).unwrap().unresolved, vec![]);
    }

    #[test]
    fn rows_are_cut_around_unresolved_set_cells_and_keep_their_versions() {
        let m = |v: &[u8]| set_cell(v);
        let entry = LogEntry {
            table_id: 1,
            first: Version {
                hlc: 10,
                cluster: 4,
            },
            rows: vec![
                RowMutation {
                    row: Bytes::from_static(b"a"),
                    mutations: vec![m(b"0"), m(b""), m(b"2"), m(b"3"), m(b"")],
                },
                RowMutation {
                    row: Bytes::from_static(b"b"),
                    mutations: vec![m(b"")],
                },
                RowMutation {
                    row: Bytes::from_static(b"c"),
                    mutations: vec![m(b"7")],
                },
            ],
            unresolved: vec![(0, 1), (0, 4), (1, 0)],
        };
        let pieces: Vec<(u64, &[u8], usize)> = entry
            .rows_with_versions()
            .map(|(v, row)| {
                assert_eq!(v.cluster, 4);
                let row_key: &'static [u8] = match &row.row[..] {
                    b"a" => b"a",
                    b"b" => b"b",
                    _ => b"c",
                };
                (v.hlc, row_key, row.mutations.len())
            })
            .collect();
        assert_eq!(
            pieces,
            vec![(10, &b"a"[..], 1), (12, &b"a"[..], 2), (16, &b"c"[..], 1)]
        );
    }
}
