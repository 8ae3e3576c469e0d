//! The write path: rows are locked (striped locks), versions come from the hybrid clock, one
//! `WriteBatch` — an atomic unit in RocksDB — per request goes to the group committer, and the
//! write is acknowledged once its group is synced. Deletes write a tombstone *and* physically
//! remove the cells they cover (under the row lock), so reads stay cheap; reads still resolve
//! tombstones by version, which is what replication will rely on.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use basalt_model::gc::GcRule;
use basalt_model::hlc::{Version, now_micros};
use basalt_model::{Mutation, Row, RowMutation, TableSchema};
use bytes::Bytes;
use rocksdb::WriteBatch;

use crate::changelog::LogEntry;
use crate::encoding::{self, KeyEntry, ValueKind};
use crate::error::{Error, Result};
use crate::layout::{META_CLOCK_FLOOR, ROW_LOCK_STRIPES};
use crate::merge_operator::{self, Parts};
use crate::observer::LogOp;
use crate::observer::{CommittedJob, Versions};
use crate::store::Store;

/// A write queued at the committer.
struct SubmittedWrite {
    /// Answered once the batch is durable (or failed).
    done: tokio::sync::oneshot::Receiver<Result<()>>,
    /// Its first version (registered as in flight).
    first: u64,
}

/// What [`Store::submit_write`] did.
enum Submitted {
    /// Nothing to write.
    Nothing,
    /// Queued at the committer.
    Queued(SubmittedWrite),
    /// Not written: the change log came on after the rows were locked for sharing, and the
    /// write has aggregate inputs; lock them exclusively and submit again.
    Again,
}

/// A built batch: the batch, its physical operations, and the rows to log if not the
/// request's.
type BuiltBatch = (WriteBatch, Vec<LogOp>, Option<Vec<RowMutation>>);

/// Whether a mutation is an aggregate input.
fn is_aggregate(m: &Mutation) -> bool {
    matches!(m, Mutation::Aggregate { .. })
}

/// A held row-lock stripe.
pub(crate) enum RowLock<'a> {
    Shared(#[allow(dead_code)] tokio::sync::RwLockReadGuard<'a, ()>),
    Exclusive(#[allow(dead_code)] tokio::sync::RwLockWriteGuard<'a, ()>),
}

impl Store {
    pub(crate) fn put_clock_floor(&self, batch: &mut WriteBatch) {
        batch.put_cf(
            self.meta(),
            META_CLOCK_FLOOR,
            self.clock.current().to_be_bytes(),
        );
    }

    /// The row-lock stripes of `rows`, in ascending order: two writers never wait on each
    /// other in a cycle.
    fn stripes<'r>(&self, table_id: u64, rows: impl Iterator<Item = &'r Bytes>) -> BTreeSet<usize> {
        rows.map(|row| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            table_id.hash(&mut h);
            row.hash(&mut h);
            (h.finish() as usize) % ROW_LOCK_STRIPES
        })
        .collect()
    }

    /// Locks rows from a thread outside the async runtime.
    pub(crate) fn lock_rows<'r>(
        &self,
        table_id: u64,
        rows: impl Iterator<Item = &'r Bytes>,
        exclusive: bool,
    ) -> Vec<RowLock<'_>> {
        self.stripes(table_id, rows)
            .into_iter()
            .map(|i| {
                if exclusive {
                    RowLock::Exclusive(self.row_locks[i].blocking_write())
                } else {
                    RowLock::Shared(self.row_locks[i].blocking_read())
                }
            })
            .collect()
    }

    pub(crate) async fn lock_rows_async<'r>(
        &self,
        table_id: u64,
        rows: impl Iterator<Item = &'r Bytes>,
        exclusive: bool,
    ) -> Vec<RowLock<'_>> {
        let mut locks = Vec::new();
        for i in self.stripes(table_id, rows) {
            locks.push(if exclusive {
                RowLock::Exclusive(self.row_locks[i].write().await)
            } else {
                RowLock::Shared(self.row_locks[i].read().await)
            });
        }
        locks
    }

    /// Whether a write of `rows` must lock them exclusively. Deletes do: they remove the cells
    /// they see, so no older cell may commit after they looked. So do aggregates while the
    /// change log is on: the log records the origin's part after the input
    /// ([`crate::merge_operator`]), read from the cell, so no other input of the row may commit
    /// between the read and the write. Other writes only share the locks and never wait for
    /// each other. (Their version-count trimming is safe under sharing: without concurrent
    /// deletes a cell's GC eligibility only grows, so deleting what a trimmer saw as eligible
    /// is right.)
    fn needs_exclusive(&self, rows: &[RowMutation]) -> bool {
        let mut mutations = rows.iter().flat_map(|r| &r.mutations);
        mutations.any(|m| m.deletes() || (is_aggregate(m) && self.change_log.on()))
    }

    /// Applies the mutations of every row atomically and durably (one synced WriteBatch).
    /// The caller has validated them against `table`'s schema. For callers outside the async
    /// runtime; the server uses [`Store::mutate_async`].
    pub fn mutate(&self, table: &TableSchema, rows: &[RowMutation]) -> Result<()> {
        loop {
            let exclusive = self.needs_exclusive(rows);
            let _locks = self.lock_rows(table.id, rows.iter().map(|r| &r.row), exclusive);
            if let Some(done) = self.write_locked(table, rows, exclusive)? {
                return Ok(done);
            }
        }
    }

    /// [`Store::mutate`] on the async runtime: the rows' locks are awaited, the batch is built
    /// on the calling task and the task waits for the committer's fsync without holding a
    /// thread. Runs as its own task so that a cancelled request cannot release the row locks
    /// before its batch is written.
    pub async fn mutate_async(
        self: &Arc<Self>,
        table: Arc<TableSchema>,
        rows: Vec<RowMutation>,
    ) -> Result<()> {
        let store = self.clone();
        tokio::spawn(async move {
            loop {
                let exclusive = store.needs_exclusive(&rows);
                let _locks = store
                    .lock_rows_async(table.id, rows.iter().map(|r| &r.row), exclusive)
                    .await;
                return match store.submit_write(&table, &rows, exclusive)? {
                    Submitted::Nothing => Ok(()),
                    Submitted::Again => continue,
                    Submitted::Queued(write) => {
                        let result = write.done.await.unwrap_or_else(|_| Err(Error::Closing));
                        store.finish_write(write.first);
                        result
                    }
                };
            }
        })
        .await
        .map_err(|e| Error::Internal(format!("write task failed: {e}")))?
    }

    /// Reads `row` and applies the mutations `decide` returns for it, atomically with respect
    /// to every other write of the row (CheckAndMutateRow, ReadModifyWriteRow).
    pub fn read_modify_write<T>(
        &self,
        table: &TableSchema,
        row: &Bytes,
        decide: impl FnOnce(Row) -> basalt_model::Result<(Vec<Mutation>, T)>,
    ) -> Result<T> {
        let _locks = self.lock_rows(table.id, std::iter::once(row), true);
        let current = self.read_row(table, row)?;
        let (mutations, out) = decide(current)?;
        let rows = [RowMutation {
            row: row.clone(),
            mutations,
        }];
        self.write_locked(table, &rows, true)?;
        Ok(out)
    }

    /// Writes rows whose locks the caller holds (outside the async runtime); None: the write
    /// needs the locks exclusively now (see [`Submitted::Again`]).
    fn write_locked(
        &self,
        table: &TableSchema,
        rows: &[RowMutation],
        exclusive: bool,
    ) -> Result<Option<()>> {
        let write = match self.submit_write(table, rows, exclusive)? {
            Submitted::Nothing => return Ok(Some(())),
            Submitted::Again => return Ok(None),
            Submitted::Queued(write) => write,
        };
        let result = write
            .done
            .blocking_recv()
            .unwrap_or_else(|_| Err(Error::Closing));
        self.finish_write(write.first);
        result.map(Some)
    }

    /// Takes the versions of a write of locked rows (`exclusive`: locked exclusively), builds
    /// its batch and queues it at the committer. Until [`Store::finish_write`] the write counts
    /// as in flight (consistency tokens wait for it).
    fn submit_write(
        &self,
        table: &TableSchema,
        rows: &[RowMutation],
        exclusive: bool,
    ) -> Result<Submitted> {
        let total: usize = rows.iter().map(|r| r.mutations.len()).sum();
        if total == 0 {
            return Ok(Submitted::Nothing);
        }
        // The caller validated against a schema snapshot; a family dropped (or the table
        // deleted) since must not receive versions newer than its drop. The catalog stays
        // read-locked until the batch is queued, so a table deletion queues behind it.
        let tables = self.catalog.tables.read();
        let current = tables
            .by_id(table.id)
            .ok_or_else(|| Error::not_found(format!("table {} not found", table.name)))?;
        for family in rows
            .iter()
            .flat_map(|r| &r.mutations)
            .filter_map(Mutation::family)
        {
            current.family(family)?;
        }
        // A tablet fenced for a move, or moved away, takes no more writes (checked under the
        // catalog lock: a fence waits for every write that passed this point, see
        // `Store::fence`).
        if let Some(refused) = self
            .fences
            .read()
            .write_refusal(table, rows.iter().map(|r| &r.row[..]))
        {
            return Err(refused);
        }
        // Read under the catalog lock: an observer that starts wanting operations raises its
        // flag under the catalog's write lock, then waits for the writes queued before.
        let with_ops = self.observers.wants_ops();
        let first = {
            let mut inflight = self.inflight.lock();
            let first = self.clock.allocate(total as u64);
            *inflight.entry(first.hlc).or_default() += 1;
            first
        };
        // Read after the versions are taken: a consumer that turns the log on waits for the
        // writes in flight then (see `crate::changelog`).
        let logged = self.change_log.on();
        if logged && !exclusive && rows.iter().flat_map(|r| &r.mutations).any(is_aggregate) {
            // The log came on since the rows were locked for sharing (`needs_exclusive`).
            self.finish_write(first.hlc);
            return Ok(Submitted::Again);
        }
        match self.build_batch(table, rows, first, with_ops, logged) {
            Ok((batch, ops, logged_rows)) => {
                let observed = CommittedJob {
                    ops,
                    versions: Some(Versions {
                        table_id: table.id,
                        first,
                        count: total as u64,
                    }),
                    log_seq: None,
                };
                let log_entry = logged.then(|| {
                    LogEntry::encode_logged(table.id, first, logged_rows.as_deref().unwrap_or(rows))
                });
                let done = self
                    .committer
                    .submit(batch, self.clock.current(), observed, log_entry);
                drop(tables);
                Ok(Submitted::Queued(SubmittedWrite {
                    done,
                    first: first.hlc,
                }))
            }
            Err(e) => {
                self.finish_write(first.hlc);
                Err(e)
            }
        }
    }

    /// The write that took versions from `first` is durable or failed.
    fn finish_write(&self, first: u64) {
        let mut inflight = self.inflight.lock();
        if let Some(n) = inflight.get_mut(&first) {
            *n -= 1;
            if *n == 0 {
                inflight.remove(&first);
            }
        }
    }

    /// The batch of a write of locked rows whose versions start at `first`, (when
    /// `with_ops`) its physical operations for the commit observers, and (when `logged` and the
    /// write has aggregates) the rows to log instead of `rows`: each aggregate input replaced
    /// by this store's part of the cell after it (see [`crate::merge_operator`]).
    fn build_batch(
        &self,
        table: &TableSchema,
        rows: &[RowMutation],
        first: Version,
        with_ops: bool,
        logged: bool,
    ) -> Result<BuiltBatch> {
        let mut overlay = Overlay::new(self);
        let mut logged_rows: Option<Vec<RowMutation>> = None;
        let mut hlc = first.hlc;
        let now = now_micros();
        for (r, row) in rows.iter().enumerate() {
            // A column whose family keeps only its newest cell may hold older cells that
            // earlier writes left for compaction (below). Deleting its newer cells must not
            // bring them back: they go first, as if they had been trimmed when pushed out.
            for m in &row.mutations {
                if let Mutation::DeleteFromColumn {
                    family, qualifier, ..
                } = m
                    && let Some(rule) = version_rule(table, family)
                    && rule.keeps_only_newest()
                {
                    let prefix = encoding::column_prefix(table.id, &row.row, family, qualifier);
                    overlay.trim(&prefix, rule, now, Tier::All)?;
                }
            }
            let mut touched: BTreeSet<(String, Bytes)> = BTreeSet::new();
            for (i, m) in row.mutations.iter().enumerate() {
                let version = Version {
                    hlc,
                    cluster: first.cluster,
                };
                hlc += 1;
                let tombstone = || encoding::encode_value(version, ValueKind::Tombstone, &[]);
                match m {
                    Mutation::SetCell {
                        family,
                        qualifier,
                        timestamp,
                        value,
                    } => {
                        let key =
                            encoding::cell_key(table.id, &row.row, family, qualifier, *timestamp);
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
                        let key =
                            encoding::cell_key(table.id, &row.row, family, qualifier, *timestamp);
                        let operand =
                            merge_operator::operand(version, *aggregator, *input, self.origin);
                        overlay.merge(key.clone(), operand);
                        touched.insert((family.clone(), qualifier.clone()));
                        if logged {
                            let parts = Parts::of_value(overlay.value(&key)?.as_deref());
                            let own = Parts(parts.of(self.origin).cloned().into_iter().collect());
                            let log = logged_rows.get_or_insert_with(|| rows.to_vec());
                            log[r].mutations[i] = Mutation::AggregateParts {
                                family: family.clone(),
                                qualifier: qualifier.clone(),
                                timestamp: *timestamp,
                                parts: own.encode().into(),
                            };
                        }
                    }
                    Mutation::AggregateParts { .. } => {
                        return Err(Error::Internal(
                            "aggregate parts come from another cluster, not from a client".into(),
                        ));
                    }
                    Mutation::DeleteFromColumn {
                        family,
                        qualifier,
                        start,
                        end,
                    } => {
                        let prefix = encoding::column_prefix(table.id, &row.row, family, qualifier);
                        for key in overlay.keys_with_prefix(&prefix)? {
                            if let Some(d) = encoding::decode_key(&key)
                                && let KeyEntry::Cell { timestamp, .. } = d.entry
                                && *start <= timestamp
                                && timestamp < *end
                            {
                                overlay.delete(key);
                            }
                        }
                        let key = encoding::column_tombstone_key(
                            table.id, &row.row, family, qualifier, *start, *end,
                        );
                        overlay.put(key, tombstone());
                    }
                    Mutation::DeleteFromFamily { family } => overlay.delete_scope(
                        &encoding::family_prefix(table.id, &row.row, family),
                        encoding::family_tombstone_key(table.id, &row.row, family),
                        tombstone(),
                    )?,
                    Mutation::DeleteFromRow => overlay.delete_scope(
                        &encoding::row_prefix(table.id, &row.row),
                        encoding::row_tombstone_key(table.id, &row.row),
                        tombstone(),
                    )?,
                }
            }
            // Families that keep N versions: drop the versions the write pushed out now, so
            // physical space follows the rule without waiting for a full compaction. A family
            // that keeps only the newest cell drops those still in the memtable (hot rows,
            // found without reading SST files); the compaction filter removes the others, as a
            // cell written after them with a newer timestamp shows them collected, and reads
            // never return them meanwhile.
            for (family, qualifier) in touched {
                let Some(rule) = version_rule(table, &family) else {
                    continue;
                };
                let tier = if rule.keeps_only_newest() {
                    Tier::Memtable
                } else {
                    Tier::All
                };
                let prefix = encoding::column_prefix(table.id, &row.row, &family, &qualifier);
                overlay.trim(&prefix, rule, now, tier)?;
            }
        }
        let (batch, ops) = overlay.into_batch(with_ops);
        Ok((batch, ops, logged_rows))
    }

    /// Every write with a version at or below the returned clock value is durable.
    pub fn durable_through(&self) -> u64 {
        let inflight = self.inflight.lock();
        match inflight.keys().next() {
            Some(&first) => first - 1,
            None => self.clock.current(),
        }
    }

    /// The current clock value: every write acknowledged so far has a version below it.
    pub fn clock_now(&self) -> u64 {
        self.clock.current()
    }
}

/// Pending writes of one batch, layered over the database so that later mutations of the same
/// request see earlier ones (e.g. SetCell then DeleteFromRow).
pub(crate) struct Overlay<'a> {
    store: &'a Store,
    pending: BTreeMap<Vec<u8>, Pending>,
    /// One iterator over the table for every lookup of the batch: creating a RocksDB iterator
    /// (a merged view of the memtables and every level) costs far more than a seek, and a
    /// version-trimming write looks up each column it writes. Its implicit snapshot is taken at
    /// the first lookup; the rows are locked by then (see [`Store::mutate`]).
    iter: Option<rocksdb::DBRawIterator<'a>>,
    /// The same over the memtables alone ([`Tier::Memtable`]).
    memtable_iter: Option<rocksdb::DBRawIterator<'a>>,
}

/// What a lookup of the write path reads: everything, or only the memtables (no SST file).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tier {
    All,
    Memtable,
}

/// The family's GC rule when it counts versions (the write path trims columns of it).
pub(crate) fn version_rule<'t>(table: &'t TableSchema, family: &str) -> Option<&'t GcRule> {
    table
        .families
        .get(family)
        .and_then(|f| f.gc_rule.as_ref())
        .filter(|r| r.counts_versions())
}

/// The batch's net effect on one key.
enum Pending {
    Put(Vec<u8>),
    Delete,
    /// Aggregate operands (oldest first) to merge into whatever the database holds.
    Merge(Vec<Vec<u8>>),
}

impl<'a> Overlay<'a> {
    pub(crate) fn new(store: &'a Store) -> Self {
        Self {
            store,
            pending: BTreeMap::new(),
            iter: None,
            memtable_iter: None,
        }
    }

    /// Deletes the cells of the column at `prefix` that `rule` collects, counting versions
    /// among what `tier` holds (the batch's own writes included).
    pub(crate) fn trim(
        &mut self,
        prefix: &[u8],
        rule: &GcRule,
        now: i64,
        tier: Tier,
    ) -> Result<()> {
        let mut index = 0;
        for key in self.keys_in(prefix, tier)? {
            if let Some(d) = encoding::decode_key(&key)
                && let KeyEntry::Cell { timestamp, .. } = d.entry
            {
                if rule.eligible(Some(index), timestamp, now) == Some(true) {
                    self.delete(key);
                }
                index += 1;
            }
        }
        Ok(())
    }

    pub(crate) fn put(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.pending.insert(key, Pending::Put(value));
    }

    pub(crate) fn delete(&mut self, key: Vec<u8>) {
        self.pending.insert(key, Pending::Delete);
    }

    /// Deletes every key of a scope (a family of a row, or a row), older tombstones included,
    /// and writes the scope's new tombstone.
    fn delete_scope(
        &mut self,
        prefix: &[u8],
        tombstone_key: Vec<u8>,
        tombstone: Vec<u8>,
    ) -> Result<()> {
        for key in self.keys_with_prefix(prefix)? {
            self.delete(key);
        }
        self.put(tombstone_key, tombstone);
        Ok(())
    }

    /// Adds an aggregate operand. After a put or delete in the same batch the result is
    /// computed here (the database's value no longer matters); otherwise RocksDB merges it.
    pub(crate) fn merge(&mut self, key: Vec<u8>, operand: Vec<u8>) {
        let next = match self.pending.remove(&key) {
            None => Pending::Merge(vec![operand]),
            Some(Pending::Merge(mut ops)) => {
                ops.push(operand);
                Pending::Merge(ops)
            }
            Some(Pending::Put(v)) => {
                Pending::Put(merge_operator::full_merge(Some(&v), [operand.as_slice()]))
            }
            Some(Pending::Delete) => {
                Pending::Put(merge_operator::full_merge(None, [operand.as_slice()]))
            }
        };
        self.pending.insert(key, next);
    }

    /// Live keys starting with `prefix`, in order, as the batch would leave them.
    pub(crate) fn keys_with_prefix(&mut self, prefix: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.keys_in(prefix, Tier::All)
    }

    /// Keys starting with `prefix` that `tier` holds, in order, as the batch would leave them.
    fn keys_in(&mut self, prefix: &[u8], tier: Tier) -> Result<Vec<Vec<u8>>> {
        let mut keys: BTreeSet<Vec<u8>> = BTreeSet::new();
        // Every prefix looked up here lies within one row (a column, a family or a row).
        debug_assert!(encoding::row_prefix_len(prefix).is_some());
        let it = self.iterator(tier);
        it.seek(prefix);
        while let Some(k) = it.key() {
            if !k.starts_with(prefix) {
                break;
            }
            keys.insert(k.to_vec());
            it.next();
        }
        it.status()?;
        for (k, v) in self.pending_with_prefix(prefix) {
            match v {
                Pending::Put(_) | Pending::Merge(_) => keys.insert(k.clone()),
                Pending::Delete => keys.remove(k),
            };
        }
        Ok(keys.into_iter().collect())
    }

    /// The batch's own writes of keys starting with `prefix`, in key order.
    fn pending_with_prefix(&self, prefix: &[u8]) -> impl Iterator<Item = (&Vec<u8>, &Pending)> {
        let upper = match encoding::prefix_successor(prefix) {
            Some(e) => std::ops::Bound::Excluded(e),
            None => std::ops::Bound::Unbounded,
        };
        self.pending
            .range((std::ops::Bound::Included(prefix.to_vec()), upper))
    }

    /// The batch's iterator over what `tier` holds (created at its first use).
    fn iterator(&mut self, tier: Tier) -> &mut rocksdb::DBRawIterator<'a> {
        let store = self.store;
        match tier {
            Tier::All => self.iter.get_or_insert_with(|| {
                store
                    .db
                    .raw_iterator_cf_opt(store.data(), store.row_read_opts())
            }),
            Tier::Memtable => self.memtable_iter.get_or_insert_with(|| {
                let mut opts = store.row_read_opts();
                opts.set_read_tier(rocksdb::ReadTier::Memtable);
                store.db.raw_iterator_cf_opt(store.data(), opts)
            }),
        }
    }

    /// Whether the batch writes nothing.
    pub(crate) fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// The value of `key` as the batch would leave it: the batch's own write if it wrote the
    /// key (its aggregate operands merged into the database's value), else the database's.
    pub(crate) fn value(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        if let Some(Pending::Put(v)) = self.pending.get(key) {
            return Ok(Some(v.clone()));
        }
        if let Some(Pending::Delete) = self.pending.get(key) {
            return Ok(None);
        }
        debug_assert!(encoding::row_prefix_len(key).is_some());
        let it = self.iterator(Tier::All);
        it.seek(key);
        let stored = match (it.key(), it.value()) {
            (Some(k), Some(v)) if k == key => Some(v.to_vec()),
            _ => None,
        };
        it.status()?;
        Ok(match self.pending.get(key) {
            Some(Pending::Merge(ops)) => Some(merge_operator::full_merge(
                stored.as_deref(),
                ops.iter().map(Vec::as_slice),
            )),
            _ => stored,
        })
    }

    /// Live keys starting with `prefix` with their values, in key order, as the batch would
    /// leave them (see [`Overlay::value`]).
    pub(crate) fn entries_with_prefix(&mut self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        debug_assert!(encoding::row_prefix_len(prefix).is_some());
        let mut entries: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        let it = self.iterator(Tier::All);
        it.seek(prefix);
        while let (Some(k), Some(v)) = (it.key(), it.value()) {
            if !k.starts_with(prefix) {
                break;
            }
            entries.insert(k.to_vec(), v.to_vec());
            it.next();
        }
        it.status()?;
        for (k, v) in self.pending_with_prefix(prefix) {
            match v {
                Pending::Put(v) => {
                    entries.insert(k.clone(), v.clone());
                }
                Pending::Delete => {
                    entries.remove(k);
                }
                Pending::Merge(ops) => {
                    let merged = merge_operator::full_merge(
                        entries.get(k).map(Vec::as_slice),
                        ops.iter().map(Vec::as_slice),
                    );
                    entries.insert(k.clone(), merged);
                }
            }
        }
        Ok(entries.into_iter().collect())
    }

    /// The batch, and (when `with_ops`) the same operations for the commit observers.
    pub(crate) fn into_batch(self, with_ops: bool) -> (WriteBatch, Vec<LogOp>) {
        let data = self.store.data();
        let mut batch = WriteBatch::default();
        let mut log = Vec::new();
        for (k, v) in self.pending {
            match v {
                Pending::Put(v) => {
                    batch.put_cf(data, &k, &v);
                    if with_ops {
                        log.push(LogOp::Put { key: k, value: v });
                    }
                }
                Pending::Delete => {
                    batch.delete_cf(data, &k);
                    if with_ops {
                        log.push(LogOp::Delete { key: k });
                    }
                }
                Pending::Merge(ops) => {
                    for op in ops {
                        batch.merge_cf(data, &k, &op);
                        if with_ops {
                            log.push(LogOp::Merge {
                                key: k.clone(),
                                value: op,
                            });
                        }
                    }
                }
            }
        }
        (batch, log)
    }
}
