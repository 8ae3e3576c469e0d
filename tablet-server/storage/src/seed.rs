//! Reading a range for the seeding of a cluster that joined the instance
//! (`docs/replication.md`, "Adding a cluster").
//!
//! A seed carries what this store holds of a row range as it is stored: every entry of the
//! range (cells, aggregate cells and tombstones, each with the version it took) becomes a
//! one-mutation [`ReplicatedRow`] at that version — a cell a `SetCell`, an aggregate cell its
//! parts per origin (`AggregateParts`, HyperLogLog++ sketches included), a row, family or
//! column tombstone the delete that wrote it. The seeded cluster applies them like any
//! replicated write ([`Store::apply_replicated`]): last write wins on the version, a delete
//! hides exactly the older cells, an aggregate keeps each origin's newer part. So a seed needs
//! no snapshot consistency with the change log: an entry that is both in the seed and in a log
//! shipped to the same cluster is applied once in effect, whatever the order.
//!
//! Nothing is interpreted here: entries hidden by a tombstone travel with the tombstone, a
//! dropped family's cells are skipped by the applying side's schema, GC rules run there too.

use basalt_model::hlc::Version;
use basalt_model::{Mutation, RowMutation, RowRange, RowSet, TableSchema};
use bytes::Bytes;

use crate::encoding::{self, KeyEntryRef, ValueKind};
use crate::error::{Error, Result};
use crate::merge_operator::Parts;
use crate::read::key_range;
use crate::replicated::ReplicatedRow;
use crate::store::Store;

/// One piece of a range's seed.
#[derive(Debug, Default)]
pub struct SeedChunk {
    /// The entries read, in key order.
    pub rows: Vec<ReplicatedRow>,
    /// The stored bytes they came from (keys and values).
    pub bytes: u64,
    /// The row to go on from (the range's start of the next chunk); None: the range is done.
    pub resume: Option<Bytes>,
}

impl Store {
    /// The entries of `range` of `table`, whole rows at a time, until about `max_bytes` of
    /// them (at least one row): see the module docs. Refused ("not owner" or "moving",
    /// retryable) when this store does not serve all of `range` after taking its snapshot, as
    /// reads are.
    pub fn seed_chunk(
        &self,
        table: &TableSchema,
        range: &RowRange,
        max_bytes: usize,
    ) -> Result<SeedChunk> {
        let rows = RowSet::from_ranges([range.clone()]);
        let keys = key_range(table.id, range);
        let mut opts = self.read_opts(table.id);
        opts.set_iterate_upper_bound(keys.end.clone());
        // As `Store::rows`: the returns count, then the snapshot, then the check.
        let returns = self.fences.read().returns();
        let mut it = self.db.raw_iterator_cf_opt(self.data(), opts);
        if let Some(refused) = self.fences.read().read_refusal(table, &rows, returns) {
            return Err(refused);
        }
        it.seek(&keys.start);
        let mut chunk = SeedChunk::default();
        let mut current: Option<Vec<u8>> = None;
        while it.valid() {
            let (Some(key), Some(value)) = (it.key(), it.value()) else {
                break;
            };
            let row = encoding::decode_key(key)
                .ok_or_else(|| Error::Corrupt("a data key does not decode".into()))?
                .row;
            if current.as_deref() != Some(&row[..]) {
                if chunk.bytes >= max_bytes as u64 {
                    chunk.resume = Some(Bytes::from(row));
                    return Ok(chunk);
                }
                current = Some(row.clone());
            }
            chunk.bytes += (key.len() + value.len()) as u64;
            if let Some(r) = seed_row(table, &row, key, value)? {
                chunk.rows.push(r);
            }
            it.next();
        }
        it.status().map_err(Error::from)?;
        Ok(chunk)
    }
}

/// The replicated write that would store `value` under `key` (of row `row`); None for what no
/// mutation writes (an unmerged operand, an HLL state, a cell of a family no longer there).
fn seed_row(
    table: &TableSchema,
    row: &[u8],
    key: &[u8],
    value: &[u8],
) -> Result<Option<ReplicatedRow>> {
    let entry = encoding::decode_entry(key)
        .ok_or_else(|| Error::Corrupt("a data key does not decode".into()))?;
    let (version, kind, payload): (Version, ValueKind, &[u8]) = encoding::decode_value(value)
        .ok_or_else(|| Error::Corrupt("a data value does not decode".into()))?;
    let mutation = match entry {
        KeyEntryRef::RowTombstone => Mutation::DeleteFromRow,
        KeyEntryRef::FamilyTombstone { family } => Mutation::DeleteFromFamily {
            family: family.to_string(),
        },
        KeyEntryRef::ColumnTombstone {
            family,
            qualifier,
            start,
            end,
        } => Mutation::DeleteFromColumn {
            family: family.to_string(),
            qualifier: Bytes::copy_from_slice(&qualifier),
            start,
            end,
        },
        KeyEntryRef::Cell {
            family,
            qualifier,
            timestamp,
        } => {
            let Some(schema) = table.families.get(family) else {
                return Ok(None);
            };
            match (kind, schema.aggregate) {
                (ValueKind::Plain, _) => Mutation::SetCell {
                    family: family.to_string(),
                    qualifier: Bytes::copy_from_slice(&qualifier),
                    timestamp,
                    value: Bytes::copy_from_slice(payload),
                },
                (ValueKind::Aggregate | ValueKind::AggregateParts, Some(_)) => {
                    Mutation::AggregateParts {
                        family: family.to_string(),
                        qualifier: Bytes::copy_from_slice(&qualifier),
                        timestamp,
                        parts: Parts::of_value(Some(value)).encode().into(),
                    }
                }
                _ => return Ok(None),
            }
        }
    };
    Ok(Some(ReplicatedRow {
        first: version,
        row: RowMutation {
            row: Bytes::copy_from_slice(row),
            mutations: vec![mutation],
        },
    }))
}
