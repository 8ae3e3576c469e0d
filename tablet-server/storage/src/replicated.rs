//! Applying writes replicated from another cluster of the instance.
//!
//! A peer cluster ships its change log ([`crate::changelog`]): each entry is what a client asked
//! there, with the versions the write took there. Applied here, such a write must give every
//! cluster the same data whatever order the entries arrive in, and however often one is
//! delivered again (a shipper retries what it is not sure arrived). So nothing is decided by
//! arrival order or by value: **the last write wins, by [`Version`]** `(hlc, cluster)` on each
//! (row, family, qualifier, timestamp), and a delete hides exactly the cells older than its
//! version — the rule the read path already applies ("a cell is hidden by a tombstone whose
//! scope covers it and whose version is greater", `docs/storage-format.md`).
//!
//! The local write path can be blind because its versions are the newest the row has seen: a
//! local `DeleteFromRow` removes every key of the row. A replicated write has no such
//! guarantee, so each mutation is compared with what the row holds (through the batch's
//! `Overlay`, so a row's later mutations see its earlier ones):
//!
//! * **SetCell at v** writes the cell unless its key already holds a version ≥ v (equal: the
//!   same write delivered again) or a tombstone covering it (the row's, the family's, or a
//!   column tombstone whose `[start, end)` holds the timestamp) has a version > v: the cell was
//!   deleted after it was written.
//! * **DeleteFromColumn / DeleteFromFamily / DeleteFromRow at v** remove only the keys of their
//!   scope whose version is below v (cells; and for the family and row deletes the tombstones
//!   they supersede) and write their tombstone unless its key already holds a version ≥ v. A
//!   replicated `DeleteFromRow` must not erase cells written later elsewhere (or here): those
//!   have a greater version and stay, exactly as if the delete had arrived first.
//! * **Aggregates** arrive as parts (`AggregateParts`: the origin store's part of the cell
//!   after its input, see [`crate::merge_operator`]), never as bare inputs. Each part is kept
//!   unless the cell holds a part of the same origin at least as new, or a tombstone covering
//!   the cell is newer than the part. A part at a greater version holds everything its origin
//!   added before, so a part delivered twice, parts in any order, and a seed's copy of the
//!   same cell all give one state. A delete at v removes the parts older than v and keeps the
//!   newer ones — per origin, the delete and the origin's later inputs order by version as a
//!   delete and a cell do. (A bare input, `Aggregate`, comes only from a change log written
//!   before format 2: it is added to the legacy origin's part, as format 1 did.)
//! * Families that count versions (GC rules) are trimmed after the row's mutations as the local
//!   path does. With deletes arriving out of order this can differ from one cluster to another
//!   (a cell trimmed here, because a newer one existed when it arrived, may be visible there
//!   once the newer one is deleted); counting GC is eventual in Bigtable too.
//! * A mutation of a family the schema dropped at or after the mutation's clock value is
//!   skipped (its cells are dead); a family the schema does not know (not yet created here) is
//!   refused with the local path's error, and the shipper retries later.
//!
//! Otherwise it is a write like a local one: rows locked (exclusively: it reads them), fences
//! honoured, one synced batch through the committer (so the commit observers — a tablet move's
//! capture — see it), and the clock observes the write's versions so that later local writes
//! get greater ones. It is never logged in this cluster's change log: its origin logged it.

use std::collections::BTreeSet;
use std::sync::Arc;

use basalt_model::hlc::{Version, now_micros};
use basalt_model::{Mutation, RowMutation, TableSchema};
use bytes::Bytes;
use rocksdb::WriteBatch;

use crate::changelog::LogEntry;
use crate::encoding::{self, KeyEntry, ValueKind};
use crate::error::{Error, Result};
use crate::merge_operator::{self, Parts};
use crate::observer::{CommittedJob, LogOp};
use crate::store::Store;
use crate::write::{Overlay, Tier, version_rule};

/// One row of a write made in another cluster: its mutations with the versions they took there
/// (mutation i has hlc first.hlc + i, cluster first.cluster).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicatedRow {
    pub first: Version,
    pub row: RowMutation,
}

impl ReplicatedRow {
    /// The version of the row's mutation `i`.
    pub fn version(&self, i: usize) -> Version {
        Version {
            hlc: self.first.hlc + i as u64,
            cluster: self.first.cluster,
        }
    }

    /// The clock value of its last mutation; None without mutations.
    fn last_hlc(&self) -> Option<u64> {
        let n = self.row.mutations.len() as u64;
        (n > 0).then(|| self.first.hlc + n - 1)
    }
}

impl LogEntry {
    /// The entry's rows with their versions, as [`LogEntry::rows_with_versions`] cuts them.
    pub fn replicated_rows(&self) -> Vec<ReplicatedRow> {
        self.rows_with_versions()
            .map(|(first, row)| ReplicatedRow {
                first,
                row: row.into_owned(),
            })
            .collect()
    }
}

impl Store {
    /// Applies rows written in another cluster, durably (one synced batch through the
    /// committer, like a local write), idempotently and order-independently: see the module
    /// docs for the rules. Aggregate mutations are the exception: their operands are merged
    /// again when delivered again. For callers outside the async runtime; see
    /// [`Store::apply_replicated_async`].
    pub fn apply_replicated(&self, table: &TableSchema, rows: &[ReplicatedRow]) -> Result<()> {
        let _locks = self.lock_rows(table.id, rows.iter().map(|r| &r.row.row), true);
        let Some(done) = self.submit_replicated(table, rows)? else {
            return Ok(());
        };
        done.blocking_recv().unwrap_or_else(|_| Err(Error::Closing))
    }

    /// [`Store::apply_replicated`] on the async runtime; runs as its own task so that a
    /// cancelled caller cannot release the row locks before the batch is written.
    pub async fn apply_replicated_async(
        self: &Arc<Self>,
        table: Arc<TableSchema>,
        rows: Vec<ReplicatedRow>,
    ) -> Result<()> {
        let store = self.clone();
        tokio::spawn(async move {
            let _locks = store
                .lock_rows_async(table.id, rows.iter().map(|r| &r.row.row), true)
                .await;
            match store.submit_replicated(&table, &rows)? {
                None => Ok(()),
                Some(done) => done.await.unwrap_or_else(|_| Err(Error::Closing)),
            }
        })
        .await
        .map_err(|e| Error::Internal(format!("replicated write task failed: {e}")))?
    }

    /// Builds the batch of replicated rows whose locks the caller holds and queues it at the
    /// committer; None when there is nothing to write (no mutation, or everything already
    /// applied: what the batch would have written is on disk, as every data write is synced).
    fn submit_replicated(
        &self,
        table: &TableSchema,
        rows: &[ReplicatedRow],
    ) -> Result<Option<tokio::sync::oneshot::Receiver<Result<()>>>> {
        let Some(max_hlc) = rows.iter().filter_map(ReplicatedRow::last_hlc).max() else {
            return Ok(None);
        };
        // As in `Store::submit_write`: the catalog stays read-locked until the batch is queued
        // (a table deletion or a family drop queues behind it), and the current schema decides.
        let tables = self.catalog.tables.read();
        let current = tables
            .by_id(table.id)
            .ok_or_else(|| Error::not_found(format!("table {} not found", table.name)))?;
        for r in rows {
            for (i, m) in r.row.mutations.iter().enumerate() {
                if let Some(family) = m.family()
                    && !current.dropped(family, r.version(i).hlc)
                {
                    current.family(family)?;
                }
            }
        }
        if let Some(refused) = self
            .fences
            .read()
            .write_refusal(table, rows.iter().map(|r| &r.row.row[..]))
        {
            return Err(refused);
        }
        // Read under the catalog lock, as the local path does (see `Store::submit_write`): the
        // move capture must see replicated writes too.
        let with_ops = self.observers.wants_ops();
        // Local writes of these rows from now on get greater versions (they allocate under the
        // row locks we hold, so none of them can be older and commit after this write).
        self.clock.observe(max_hlc);
        let Some((batch, ops)) = self.build_replicated(current, rows, with_ops)? else {
            return Ok(None);
        };
        // `versions` describes a run of consecutive clock values this store allocated: the
        // consistency tokens' in-flight tracking (`Store::durable_through`) and the observers
        // reason about this cluster's own writes. A replicated write took its versions
        // elsewhere (possibly several runs, possibly far below the clock), and the caller waits
        // for its durability itself (the shipper acknowledges only after this returns), so it
        // is neither registered in flight nor described by versions.
        let observed = CommittedJob {
            ops,
            versions: None,
            log_seq: None,
        };
        // No change log entry: the write was logged in its origin cluster.
        let done = self
            .committer
            .submit(batch, self.clock.current(), observed, None);
        drop(tables);
        Ok(Some(done))
    }

    /// The batch applying `rows` (see the module docs), and (when `with_ops`) its physical
    /// operations; None when it would write nothing.
    fn build_replicated(
        &self,
        table: &TableSchema,
        rows: &[ReplicatedRow],
        with_ops: bool,
    ) -> Result<Option<(WriteBatch, Vec<LogOp>)>> {
        let mut overlay = Overlay::new(self);
        let now = now_micros();
        for r in rows {
            let row = &r.row.row;
            // Mutations of a family dropped after they were made: their cells are dead.
            let live = |i: usize, m: &Mutation| {
                m.family()
                    .is_none_or(|f| !table.dropped(f, r.version(i).hlc))
            };
            // As in `Store::build_batch`: a column whose family keeps only its newest cell may
            // hold older cells left for compaction; deleting its newer cells must not bring
            // them back.
            for (i, m) in r.row.mutations.iter().enumerate() {
                if let Mutation::DeleteFromColumn {
                    family, qualifier, ..
                } = m
                    && live(i, m)
                    && let Some(rule) = version_rule(table, family)
                    && rule.keeps_only_newest()
                {
                    let prefix = encoding::column_prefix(table.id, row, family, qualifier);
                    overlay.trim(&prefix, rule, now, Tier::All)?;
                }
            }
            let mut touched: BTreeSet<(String, Bytes)> = BTreeSet::new();
            for (i, m) in r.row.mutations.iter().enumerate() {
                if !live(i, m) {
                    continue;
                }
                let version = r.version(i);
                match m {
                    Mutation::SetCell {
                        family,
                        qualifier,
                        timestamp,
                        value,
                    } => {
                        let key = encoding::cell_key(table.id, row, family, qualifier, *timestamp);
                        let held = version_of(overlay.value(&key)?.as_deref());
                        if held.is_some_and(|held| held >= version)
                            || deleted_after(
                                &mut overlay,
                                table.id,
                                row,
                                family,
                                qualifier,
                                *timestamp,
                                version,
                            )?
                        {
                            continue;
                        }
                        overlay.put(
                            key,
                            encoding::encode_value(version, ValueKind::Plain, value),
                        );
                        touched.insert((family.clone(), qualifier.clone()));
                    }
                    Mutation::Aggregate {
                        family,
                        qualifier,
                        timestamp,
                        aggregator,
                        input,
                    } => {
                        if deleted_after(
                            &mut overlay,
                            table.id,
                            row,
                            family,
                            qualifier,
                            *timestamp,
                            version,
                        )? {
                            continue;
                        }
                        let key = encoding::cell_key(table.id, row, family, qualifier, *timestamp);
                        let legacy = merge_operator::LEGACY_ORIGIN;
                        let operand = merge_operator::operand(version, *aggregator, *input, legacy);
                        overlay.merge(key, operand);
                        touched.insert((family.clone(), qualifier.clone()));
                    }
                    Mutation::AggregateParts {
                        family,
                        qualifier,
                        timestamp,
                        parts,
                    } => {
                        let mut parts = Parts::decode(parts).ok_or_else(|| {
                            Error::Internal("replicated aggregate parts do not decode".into())
                        })?;
                        if let Some(deleted) = newest_tombstone(
                            &mut overlay,
                            table.id,
                            row,
                            family,
                            qualifier,
                            *timestamp,
                        )? {
                            parts.drop_older(deleted);
                        }
                        if parts.0.is_empty() {
                            continue;
                        }
                        let key = encoding::cell_key(table.id, row, family, qualifier, *timestamp);
                        overlay.merge(key, parts.to_value());
                        touched.insert((family.clone(), qualifier.clone()));
                    }
                    Mutation::DeleteFromColumn {
                        family,
                        qualifier,
                        start,
                        end,
                    } => {
                        let prefix = encoding::column_prefix(table.id, row, family, qualifier);
                        for (key, value) in overlay.entries_with_prefix(&prefix)? {
                            if let Some(d) = encoding::decode_key(&key)
                                && let KeyEntry::Cell { timestamp, .. } = d.entry
                                && *start <= timestamp
                                && timestamp < *end
                            {
                                hide_older(&mut overlay, key, &value, version);
                            }
                        }
                        let key = encoding::column_tombstone_key(
                            table.id, row, family, qualifier, *start, *end,
                        );
                        put_tombstone(&mut overlay, key, version)?;
                    }
                    Mutation::DeleteFromFamily { family } => {
                        let prefix = encoding::family_prefix(table.id, row, family);
                        delete_older(&mut overlay, &prefix, version)?;
                        let key = encoding::family_tombstone_key(table.id, row, family);
                        put_tombstone(&mut overlay, key, version)?;
                    }
                    Mutation::DeleteFromRow => {
                        let prefix = encoding::row_prefix(table.id, row);
                        delete_older(&mut overlay, &prefix, version)?;
                        let key = encoding::row_tombstone_key(table.id, row);
                        put_tombstone(&mut overlay, key, version)?;
                    }
                }
            }
            // As in `Store::build_batch`: trim the columns written in families that count
            // versions.
            for (family, qualifier) in touched {
                let Some(rule) = version_rule(table, &family) else {
                    continue;
                };
                let tier = if rule.keeps_only_newest() {
                    Tier::Memtable
                } else {
                    Tier::All
                };
                let prefix = encoding::column_prefix(table.id, row, &family, &qualifier);
                overlay.trim(&prefix, rule, now, tier)?;
            }
        }
        if overlay.is_empty() {
            return Ok(None);
        }
        Ok(Some(overlay.into_batch(with_ops)))
    }
}

/// The version a stored value carries (None: no value, or one that does not decode).
fn version_of(value: Option<&[u8]>) -> Option<Version> {
    value
        .and_then(encoding::decode_value)
        .map(|(version, _, _)| version)
}

/// Whether a tombstone covering cell (`family`, `qualifier`, `timestamp`) of `row` has a
/// version greater than `version`: a cell written at `version` is deleted.
fn deleted_after(
    overlay: &mut Overlay<'_>,
    table_id: u64,
    row: &[u8],
    family: &str,
    qualifier: &[u8],
    timestamp: i64,
    version: Version,
) -> Result<bool> {
    let newest = newest_tombstone(overlay, table_id, row, family, qualifier, timestamp)?;
    Ok(newest.is_some_and(|t| t > version))
}

/// The version of the newest tombstone covering cell (`family`, `qualifier`, `timestamp`) of
/// `row`: the row's, the family's, or a column tombstone whose range holds the timestamp.
fn newest_tombstone(
    overlay: &mut Overlay<'_>,
    table_id: u64,
    row: &[u8],
    family: &str,
    qualifier: &[u8],
    timestamp: i64,
) -> Result<Option<Version>> {
    let mut newest = version_of(
        overlay
            .value(&encoding::row_tombstone_key(table_id, row))?
            .as_deref(),
    );
    let family_key = encoding::family_tombstone_key(table_id, row, family);
    newest = newest.max(version_of(overlay.value(&family_key)?.as_deref()));
    // The column's tombstones: its prefix and the tombstone tag (they sort before its cells).
    let column = encoding::column_prefix(table_id, row, family, qualifier).len();
    let any_tombstone = encoding::column_tombstone_key(table_id, row, family, qualifier, 0, 0);
    let tombstones = &any_tombstone[..column + 1];
    for (key, value) in overlay.entries_with_prefix(tombstones)? {
        if let Some(d) = encoding::decode_key(&key)
            && let KeyEntry::ColumnTombstone { start, end, .. } = d.entry
            && start <= timestamp
            && timestamp < end
        {
            newest = newest.max(version_of(Some(&value)));
        }
    }
    Ok(newest)
}

/// Deletes the keys under `prefix` (cells and tombstones) whose version is below `version`.
fn delete_older(overlay: &mut Overlay<'_>, prefix: &[u8], version: Version) -> Result<()> {
    for (key, value) in overlay.entries_with_prefix(prefix)? {
        hide_older(overlay, key, &value, version);
    }
    Ok(())
}

/// What a delete at `version` does to an entry in its scope: removes it if older; keeps it if
/// not, less the parts older than `version` of an aggregate cell.
fn hide_older(overlay: &mut Overlay<'_>, key: Vec<u8>, value: &[u8], version: Version) {
    if version_of(Some(value)).is_none_or(|v| v < version) {
        overlay.delete(key);
    } else if let Some(kept) = merge_operator::without_parts_older(value, version) {
        overlay.put(key, kept);
    }
}

/// Writes a tombstone at `version` unless `key` already holds one at least as new.
fn put_tombstone(overlay: &mut Overlay<'_>, key: Vec<u8>, version: Version) -> Result<()> {
    if version_of(overlay.value(&key)?.as_deref()).is_some_and(|v| v >= version) {
        return Ok(());
    }
    overlay.put(
        key,
        encoding::encode_value(version, ValueKind::Tombstone, &[]),
    );
    Ok(())
}
