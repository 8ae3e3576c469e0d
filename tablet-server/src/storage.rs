//! The tablet server's store: one RocksDB holding every tablet's rows and the table catalog.
//!
//! * Column family `data` holds cells and tombstones in the key format of [`crate::encoding`];
//!   a table (and each of its tablets) is a contiguous key range.
//! * Column family `meta` holds the format version, the table-id counter, a clock floor and
//!   one JSON schema per table.
//!
//! Writes lock their rows (striped locks), take versions from the hybrid clock, build one
//! `WriteBatch` — an atomic unit in RocksDB — and hand it to the `Committer`: one thread that
//! appends every batch queued while it was syncing the previous group into one WriteBatch and
//! writes that with `sync = true` (one WAL append, one fsync). A write is acknowledged only once
//! its group is on disk. Writers wait on a channel, not in a thread each. Deletes write a
//! tombstone *and* physically remove the cells they cover (under the row lock), so reads stay
//! cheap; reads still resolve tombstones by version, which is what replication will rely on.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CStr;
use std::hash::{Hash, Hasher};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use parking_lot::{Mutex, RwLock};
use rocksdb::compaction_filter::{CompactionFilter, Decision};
use rocksdb::compaction_filter_factory::{CompactionFilterContext, CompactionFilterFactory};
use rocksdb::{
    BlockBasedOptions, ColumnFamilyDescriptor, DB, DBCompressionType, Options, ReadOptions,
    WriteBatch, WriteOptions,
};

use crate::aggregate::{self, Aggregator};
use crate::encoding::{self, KeyEntry, ValueKind};
use crate::error::{Error, Result};
use crate::gc::GcRule;
use crate::schema::{Catalog, FamilySchema, TableSchema};
use basalt_model::hlc::{HybridClock, Version, now_micros};
use basalt_model::{Cell, Row, RowRange, RowSet};

const CF_DATA: &str = "data";
const CF_META: &str = "meta";
const META_FORMAT: &[u8] = b"format_version";
const META_NEXT_TABLE_ID: &[u8] = b"next_table_id";
const META_CLOCK_FLOOR: &[u8] = b"clock_floor";
const META_TABLE_PREFIX: &str = "table/";
const ROW_LOCK_STRIPES: usize = 4096;
/// Distance between intermediate SampleRowKeys samples.
const SAMPLE_INTERVAL: u64 = 16 << 20;

/// One validated mutation of a row, as storage applies it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mutation {
    SetCell {
        family: String,
        qualifier: Bytes,
        /// Resolved timestamp (never -1 here).
        timestamp: i64,
        value: Bytes,
    },
    /// Deletes cells with `start <= timestamp < end`.
    DeleteFromColumn {
        family: String,
        qualifier: Bytes,
        start: i64,
        end: i64,
    },
    DeleteFromFamily {
        family: String,
    },
    DeleteFromRow,
    /// AddToCell / MergeToCell into an aggregate family (Sum/Min/Max: input = state type).
    Aggregate {
        family: String,
        qualifier: Bytes,
        timestamp: i64,
        aggregator: Aggregator,
        input: i64,
    },
}

impl Mutation {
    /// The family the mutation writes or deletes in, if it names one.
    pub fn family(&self) -> Option<&str> {
        match self {
            Mutation::SetCell { family, .. }
            | Mutation::DeleteFromColumn { family, .. }
            | Mutation::DeleteFromFamily { family }
            | Mutation::Aggregate { family, .. } => Some(family),
            Mutation::DeleteFromRow => None,
        }
    }
}

/// The mutations of one row, applied atomically and in order.
#[derive(Debug, Clone)]
pub struct RowMutation {
    pub row: Bytes,
    pub mutations: Vec<Mutation>,
}

/// A key range `[start, end)` of the `data` column family, aligned on row boundaries.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct KeyRange {
    start: Vec<u8>,
    end: Vec<u8>,
}

/// The keys of the `data` column family that hold the rows of `range` (row-aligned). A single
/// row maps to exactly its own keys, so that point reads seek with the row-prefix blooms.
fn key_range(table_id: u64, range: &RowRange) -> KeyRange {
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
                return Err(Error::Internal("undecodable key in data".into()));
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

/// A sorted change to the schema requested by ModifyColumnFamilies.
#[derive(Debug, Clone)]
pub enum FamilyChange {
    Create {
        id: String,
        family: FamilySchema,
    },
    /// Replaces the GC rule. `aggregate`, when given, must equal the family's (value types
    /// are immutable).
    Update {
        id: String,
        gc_rule: Option<GcRule>,
        aggregate: Option<Aggregator>,
    },
    Drop {
        id: String,
    },
}

#[derive(Debug, Clone)]
pub struct StoreOptions {
    pub cluster_id: u16,
    /// How long tombstones are kept before compaction may drop them (replication needs them
    /// until every cluster has seen the delete).
    pub tombstone_grace_micros: i64,
    /// Tables smaller than this (on disk) are sampled by scanning them (exact offsets); larger
    /// ones from SST metadata and RocksDB's size estimates.
    pub sample_scan_limit_bytes: u64,
    /// Size of the block cache of the `data` column family (uncompressed SST blocks).
    pub block_cache_bytes: usize,
}

/// Default block cache: enough to keep the hot index and data blocks of a small node without
/// claiming much of a pod's memory (the flag `--block-cache-mib` sets it).
pub const DEFAULT_BLOCK_CACHE_BYTES: usize = 256 << 20;

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            cluster_id: 0,
            tombstone_grace_micros: 24 * 3600 * 1_000_000,
            sample_scan_limit_bytes: 64 << 20,
            block_cache_bytes: DEFAULT_BLOCK_CACHE_BYTES,
        }
    }
}

/// Store-wide numbers exported as metrics.
#[derive(Debug, Clone, Copy, Default)]
pub struct StorageStats {
    pub sst_bytes: u64,
    pub memtable_bytes: u64,
    pub pending_compaction_bytes: u64,
    pub running_compactions: u64,
}

/// RocksDB options of the database (shared by its column families' WAL and background work).
/// Public so that benchmarks can open a plain RocksDB configured exactly like the store.
pub fn db_options() -> Options {
    let mut db_opts = Options::default();
    db_opts.create_if_missing(true);
    db_opts.create_missing_column_families(true);
    db_opts.set_max_background_jobs(4);
    db_opts.set_keep_log_file_num(5);
    db_opts.set_bytes_per_sync(1 << 20);
    db_opts
}

/// The `data` column family's prefix extractor: a key's row prefix (table id and escaped row
/// key). SST files and memtables keep bloom filters of row prefixes, so reading one row (a
/// point read, or a write looking up a column's older versions) skips every file and memtable
/// that holds nothing of that row. The name is recorded in each SST file; files written under
/// another extractor (or none) are simply read without their prefix filter.
fn row_prefix_extractor() -> rocksdb::SliceTransform {
    fn transform(key: &[u8]) -> &[u8] {
        &key[..encoding::row_prefix_len(key).unwrap_or(key.len())]
    }
    fn in_domain(key: &[u8]) -> bool {
        encoding::row_prefix_len(key).is_some()
    }
    rocksdb::SliceTransform::create("basalt.row_prefix.v1", transform, Some(in_domain))
}

/// RocksDB options of the `data` column family with a block cache of `block_cache_bytes`,
/// without Basalt's merge operator and GC compaction filter (which [`Store::open`] adds).
///
/// With a prefix extractor set, an iterator must say how it seeks: Basalt's iterators use
/// either `total_order_seek` (scans) or `prefix_same_as_start` (reads within one row).
pub fn data_cf_options(block_cache_bytes: usize) -> Options {
    let mut data_opts = Options::default();
    data_opts.set_prefix_extractor(row_prefix_extractor());
    data_opts.set_memtable_prefix_bloom_ratio(0.05);
    data_opts.set_compression_type(DBCompressionType::Lz4);
    data_opts.set_write_buffer_size(64 << 20);
    data_opts.set_level_compaction_dynamic_level_bytes(true);
    let mut table_opts = BlockBasedOptions::default();
    table_opts.set_bloom_filter(10.0, false);
    table_opts.set_block_size(16 << 10);
    // HyperClockCache (RocksDB's own default kind, lock-free lookups), sized by the caller.
    table_opts.set_block_cache(&rocksdb::Cache::new_hyper_clock_cache(block_cache_bytes, 0));
    data_opts.set_block_based_table_factory(&table_opts);
    data_opts
}

pub struct Store {
    db: Arc<DB>,
    /// Group commit of the data path's writes.
    committer: Committer,
    catalog: Arc<SharedCatalog>,
    clock: HybridClock,
    /// Striped row locks: shared for blind writes, exclusive for writes that read the row.
    /// Held until the write is durable, across awaits on the async path (hence tokio's).
    row_locks: Vec<tokio::sync::RwLock<()>>,
    /// First versions of writes that are allocated but not yet durable (→ consistency tokens).
    inflight: Mutex<BTreeMap<u64, usize>>,
    /// Serialises schema changes.
    admin: Mutex<()>,
    sample_scan_limit: u64,
}

/// A write queued at the committer.
struct SubmittedWrite {
    /// Answered once the batch is durable (or failed).
    done: tokio::sync::oneshot::Receiver<Result<()>>,
    /// Its first version (registered as in flight).
    first: u64,
}

fn committer_gone() -> Error {
    Error::Unavailable("the store is closing".into())
}

/// A held row-lock stripe.
enum RowLock<'a> {
    Shared(#[allow(dead_code)] tokio::sync::RwLockReadGuard<'a, ()>),
    Exclusive(#[allow(dead_code)] tokio::sync::RwLockWriteGuard<'a, ()>),
}

/// Most bytes of batches appended into one group write.
const GROUP_MAX_BYTES: usize = 32 << 20;
/// Length of a WriteBatch's header in RocksDB's batch format: sequence (fixed64) and record
/// count (fixed32), both little-endian, then the records.
const BATCH_HEADER_LEN: usize = 12;

/// One batch waiting for the committer.
struct CommitJob {
    batch: WriteBatch,
    /// The clock value to persist as floor with it (≥ every version in the batch).
    clock_floor: u64,
    done: tokio::sync::oneshot::Sender<Result<()>>,
}

/// The group-commit thread of the data path (see the module docs).
struct Committer {
    tx: Option<std::sync::mpsc::Sender<CommitJob>>,
    worker: Option<std::thread::JoinHandle<()>>,
}

impl Committer {
    fn start(db: Arc<DB>) -> Result<Committer> {
        let (tx, rx) = std::sync::mpsc::channel::<CommitJob>();
        let worker = std::thread::Builder::new()
            .name("basalt-commit".into())
            .spawn(move || {
                while let Ok(first) = rx.recv() {
                    let mut bytes = first.batch.size_in_bytes();
                    let mut jobs = vec![first];
                    while bytes < GROUP_MAX_BYTES {
                        match rx.try_recv() {
                            Ok(job) => {
                                bytes += job.batch.size_in_bytes();
                                jobs.push(job);
                            }
                            Err(_) => break,
                        }
                    }
                    let result = Self::write_group(&db, &jobs);
                    for job in jobs {
                        let _ = job.done.send(result.clone());
                    }
                }
            })
            .map_err(|e| Error::Internal(format!("cannot start the commit thread: {e}")))?;
        Ok(Committer {
            tx: Some(tx),
            worker: Some(worker),
        })
    }

    /// Writes the jobs' batches, and the highest clock floor among them, as one synced
    /// WriteBatch: all of them or (on a storage error) none.
    fn write_group(db: &DB, jobs: &[CommitJob]) -> Result<()> {
        let meta = db
            .cf_handle(CF_META)
            .ok_or_else(|| Error::Internal("meta column family missing".into()))?;
        let mut floor = WriteBatch::default();
        let clock_floor = jobs.iter().map(|j| j.clock_floor).max().unwrap_or(0);
        floor.put_cf(meta, META_CLOCK_FLOOR, clock_floor.to_be_bytes());
        let parts = jobs.iter().map(|j| &j.batch).chain(std::iter::once(&floor));
        let merged = append_batches(parts);
        let mut opts = WriteOptions::default();
        opts.set_sync(true);
        db.write_opt(merged, &opts)?;
        Ok(())
    }

    fn submit(
        &self,
        batch: WriteBatch,
        clock_floor: u64,
    ) -> tokio::sync::oneshot::Receiver<Result<()>> {
        let (done, rx) = tokio::sync::oneshot::channel();
        let job = CommitJob {
            batch,
            clock_floor,
            done,
        };
        // The receiving thread lives as long as the store; a failed send drops `done`, which
        // the waiter sees as an error.
        if let Some(tx) = &self.tx {
            let _ = tx.send(job);
        }
        rx
    }

    /// Queues a batch and waits until it is durable (outside the async runtime).
    fn commit_blocking(&self, batch: WriteBatch, clock_floor: u64) -> Result<()> {
        self.submit(batch, clock_floor)
            .blocking_recv()
            .unwrap_or_else(|_| Err(committer_gone()))
    }
}

impl Drop for Committer {
    fn drop(&mut self) {
        // Closing the channel ends the thread once it has answered every queued job.
        self.tx.take();
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

/// Appends WriteBatches into one, in order (RocksDB's batch format: a 12-byte header whose
/// count covers the records that follow it).
fn append_batches<'b>(parts: impl Iterator<Item = &'b WriteBatch>) -> WriteBatch {
    let mut data = vec![0u8; BATCH_HEADER_LEN];
    let mut count: u32 = 0;
    for part in parts {
        let d = part.data();
        if d.len() > BATCH_HEADER_LEN {
            count += part.len() as u32;
            data.extend_from_slice(&d[BATCH_HEADER_LEN..]);
        }
    }
    data[8..12].copy_from_slice(&count.to_le_bytes());
    WriteBatch::from_data(&data)
}

/// The catalog shared with the compaction filter.
#[derive(Default)]
struct SharedCatalog {
    tables: RwLock<Catalog>,
    /// False until the catalog is loaded at open: the compaction filter keeps everything before.
    loaded: AtomicBool,
}

impl Store {
    pub fn open(dir: &Path, options: StoreOptions) -> Result<Store> {
        let catalog = Arc::new(SharedCatalog::default());

        let db_opts = db_options();
        let mut data_opts = data_cf_options(options.block_cache_bytes);
        data_opts.set_merge_operator(
            "basalt-aggregate",
            |_key: &[u8], existing: Option<&[u8]>, operands: &rocksdb::MergeOperands| {
                Some(aggregate::full_merge(existing, operands))
            },
            |_key: &[u8], _existing: Option<&[u8]>, operands: &rocksdb::MergeOperands| {
                aggregate::partial_merge(operands)
            },
        );
        data_opts.set_compaction_filter_factory(GcFilterFactory {
            catalog: catalog.clone(),
            grace_micros: options.tombstone_grace_micros,
        });

        let cfs = vec![
            ColumnFamilyDescriptor::new(CF_DATA, data_opts),
            ColumnFamilyDescriptor::new(CF_META, Options::default()),
        ];
        let db = Arc::new(DB::open_cf_descriptors(&db_opts, dir, cfs)?);

        let store = Store {
            committer: Committer::start(db.clone())?,
            db,
            catalog,
            clock: HybridClock::new(options.cluster_id),
            row_locks: (0..ROW_LOCK_STRIPES)
                .map(|_| tokio::sync::RwLock::new(()))
                .collect(),
            inflight: Mutex::new(BTreeMap::new()),
            admin: Mutex::new(()),
            sample_scan_limit: options.sample_scan_limit_bytes,
        };
        store.check_format()?;
        store.load_catalog()?;
        if let Some(floor) = store.meta_u64(META_CLOCK_FLOOR)? {
            store.clock.observe(floor);
        }
        Ok(store)
    }

    fn cf(&self, name: &str) -> &rocksdb::ColumnFamily {
        self.db
            .cf_handle(name)
            .expect("column families are created at open")
    }

    fn data(&self) -> &rocksdb::ColumnFamily {
        self.cf(CF_DATA)
    }

    fn meta(&self) -> &rocksdb::ColumnFamily {
        self.cf(CF_META)
    }

    fn sync_write(&self, batch: WriteBatch) -> Result<()> {
        let mut opts = WriteOptions::default();
        opts.set_sync(true);
        self.db.write_opt(batch, &opts)?;
        Ok(())
    }

    fn meta_u64(&self, key: &[u8]) -> Result<Option<u64>> {
        Ok(self
            .db
            .get_pinned_cf(self.meta(), key)?
            .and_then(|v| v.as_ref().try_into().ok().map(u64::from_be_bytes)))
    }

    fn check_format(&self) -> Result<()> {
        match self.db.get_cf(self.meta(), META_FORMAT)? {
            None => {
                let mut batch = WriteBatch::default();
                batch.put_cf(
                    self.meta(),
                    META_FORMAT,
                    encoding::FORMAT_VERSION.to_string(),
                );
                self.sync_write(batch)
            }
            Some(v) if v == encoding::FORMAT_VERSION.to_string().as_bytes() => Ok(()),
            Some(v) => Err(Error::Internal(format!(
                "data directory has on-disk format version {}, this server reads version {}",
                String::from_utf8_lossy(&v),
                encoding::FORMAT_VERSION
            ))),
        }
    }

    fn load_catalog(&self) -> Result<()> {
        let mut tables = self.catalog.tables.write();
        let it = self.db.prefix_iterator_cf(self.meta(), META_TABLE_PREFIX);
        for item in it {
            let (k, v) = item?;
            if !k.starts_with(META_TABLE_PREFIX.as_bytes()) {
                break;
            }
            let schema: TableSchema = serde_json::from_slice(&v).map_err(|e| {
                Error::Internal(format!(
                    "corrupt schema {:?}: {e}",
                    String::from_utf8_lossy(&k)
                ))
            })?;
            self.clock
                .observe(schema.dropped_families.values().copied().max().unwrap_or(0));
            tables.insert(schema);
        }
        self.catalog.loaded.store(true, Ordering::SeqCst);
        Ok(())
    }

    // ---------------------------------------------------------------- schema (table admin)

    /// The schema of a table, or NOT_FOUND.
    pub fn table(&self, name: &str) -> Result<Arc<TableSchema>> {
        self.catalog
            .tables
            .read()
            .get(name)
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("table {name} not found")))
    }

    /// Tablets this server owns (every table's, in standalone mode).
    pub fn tablet_count(&self) -> usize {
        self.catalog.tables.read().tablet_count()
    }

    pub fn list_tables(&self, instance: &str) -> Vec<Arc<TableSchema>> {
        self.catalog.tables.read().list(instance).cloned().collect()
    }

    fn put_schema(&self, batch: &mut WriteBatch, schema: &TableSchema) -> Result<()> {
        let json = serde_json::to_vec(schema)
            .map_err(|e| Error::Internal(format!("encoding schema: {e}")))?;
        batch.put_cf(
            self.meta(),
            format!("{META_TABLE_PREFIX}{}", schema.name),
            json,
        );
        Ok(())
    }

    pub fn create_table(
        &self,
        name: &str,
        instance: &str,
        families: BTreeMap<String, FamilySchema>,
        splits: Vec<Vec<u8>>,
        deletion_protection: bool,
    ) -> Result<Arc<TableSchema>> {
        let _admin = self.admin.lock();
        if self.catalog.tables.read().get(name).is_some() {
            return Err(Error::AlreadyExists(format!("table {name} already exists")));
        }
        let count = self.catalog.tables.read().list(instance).count();
        if count >= crate::schema::MAX_TABLES_PER_INSTANCE {
            return Err(Error::FailedPrecondition(format!(
                "instance {instance} already has {count} tables, the maximum"
            )));
        }
        let id = self.meta_u64(META_NEXT_TABLE_ID)?.unwrap_or(1);
        let schema = TableSchema {
            id,
            name: name.to_string(),
            families,
            dropped_families: BTreeMap::new(),
            deletion_protection,
            splits,
            created_micros: now_micros(),
        };
        let mut batch = WriteBatch::default();
        batch.put_cf(self.meta(), META_NEXT_TABLE_ID, (id + 1).to_be_bytes());
        self.put_schema(&mut batch, &schema)?;
        // A fresh id never held data, but clear its range anyway: cheap, and it makes the
        // invariant "a table's range holds only that table's data" independent of history.
        batch.delete_range_cf(
            self.data(),
            encoding::table_prefix(id),
            encoding::table_end(id),
        );
        self.sync_write(batch)?;
        Ok(self.catalog.tables.write().insert(schema))
    }

    pub fn set_deletion_protection(&self, name: &str, protect: bool) -> Result<Arc<TableSchema>> {
        let _admin = self.admin.lock();
        let mut schema = (*self.table(name)?).clone();
        schema.deletion_protection = protect;
        let mut batch = WriteBatch::default();
        self.put_schema(&mut batch, &schema)?;
        self.sync_write(batch)?;
        Ok(self.catalog.tables.write().insert(schema))
    }

    pub fn delete_table(&self, name: &str) -> Result<()> {
        let _admin = self.admin.lock();
        let schema = self.table(name)?;
        if schema.deletion_protection {
            return Err(Error::FailedPrecondition(format!(
                "table {name} is protected against deletion; disable deletion_protection first"
            )));
        }
        let mut batch = WriteBatch::default();
        batch.delete_cf(self.meta(), format!("{META_TABLE_PREFIX}{name}"));
        batch.delete_range_cf(
            self.data(),
            encoding::table_prefix(schema.id),
            encoding::table_end(schema.id),
        );
        // Writers hold the catalog from their check until their batch is queued at the
        // committer (see `submit_write`). With the catalog locked until the table is gone no
        // new write can start, and the range delete queues behind every write that did: none
        // lands after it.
        let mut tables = self.catalog.tables.write();
        self.committer
            .commit_blocking(batch, self.clock.current())?;
        tables.remove(name);
        Ok(())
    }

    /// Applies every change in order, or none of them.
    pub fn modify_column_families(
        &self,
        name: &str,
        changes: &[FamilyChange],
    ) -> Result<Arc<TableSchema>> {
        let _admin = self.admin.lock();
        // Held until the new schema is visible: a writer either took its versions before the
        // drop marker (its cells are dead) or sees the new schema (see `write_locked`).
        let mut tables = self.catalog.tables.write();
        let mut schema = TableSchema::clone(
            tables
                .get(name)
                .ok_or_else(|| Error::NotFound(format!("table {name} not found")))?,
        );
        for change in changes {
            match change {
                FamilyChange::Create { id, family } => {
                    if schema.families.contains_key(id) {
                        return Err(Error::AlreadyExists(format!(
                            "column family {id:?} already exists in table {name}"
                        )));
                    }
                    schema.families.insert(id.clone(), family.clone());
                }
                FamilyChange::Update {
                    id,
                    gc_rule,
                    aggregate,
                } => {
                    let family = schema.families.get_mut(id).ok_or_else(|| {
                        Error::NotFound(format!("column family {id:?} not found in table {name}"))
                    })?;
                    if aggregate.is_some() && *aggregate != family.aggregate {
                        return Err(Error::InvalidArgument(format!(
                            "column family {id:?}: value_type cannot be changed after creation"
                        )));
                    }
                    family.gc_rule = gc_rule.clone();
                }
                FamilyChange::Drop { id } => {
                    if schema.deletion_protection {
                        return Err(Error::FailedPrecondition(format!(
                            "table {name} is protected against deletion; its column families cannot be dropped"
                        )));
                    }
                    if schema.families.remove(id).is_none() {
                        return Err(Error::NotFound(format!(
                            "column family {id:?} not found in table {name}"
                        )));
                    }
                    // Every cell written so far has a smaller version than this: they are all
                    // dead, even if a family of the same name is created again.
                    let at = self.clock.allocate(1).hlc;
                    schema.dropped_families.insert(id.clone(), at);
                }
            }
        }
        if schema.families.len() > basalt_model::limits::MAX_FAMILIES_PER_TABLE {
            return Err(Error::FailedPrecondition(format!(
                "table {name} would have {} column families; the maximum is {}",
                schema.families.len(),
                basalt_model::limits::MAX_FAMILIES_PER_TABLE
            )));
        }
        let mut batch = WriteBatch::default();
        self.put_schema(&mut batch, &schema)?;
        self.put_clock_floor(&mut batch);
        self.sync_write(batch)?;
        Ok(tables.insert(schema))
    }

    /// Deletes every row whose key starts with `prefix`, or every row when `prefix` is None.
    pub fn drop_row_range(&self, name: &str, prefix: Option<&[u8]>) -> Result<()> {
        let schema = self.table(name)?;
        let (start, end) = match prefix {
            Some(p) => encoding::row_prefix_range(schema.id, p),
            None => (
                encoding::table_prefix(schema.id),
                encoding::table_end(schema.id),
            ),
        };
        let mut batch = WriteBatch::default();
        batch.delete_range_cf(self.data(), start, end);
        self.sync_write(batch)
    }

    // ---------------------------------------------------------------- writes

    fn put_clock_floor(&self, batch: &mut WriteBatch) {
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
    fn lock_rows<'r>(
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

    async fn lock_rows_async<'r>(
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
    /// they see, so no older cell may commit after they looked. Other writes only share the
    /// locks and never wait for each other. (Their version-count trimming is safe under
    /// sharing: without concurrent deletes a cell's GC eligibility only grows, so deleting what
    /// a trimmer saw as eligible is right.)
    fn needs_exclusive(rows: &[RowMutation]) -> bool {
        rows.iter()
            .flat_map(|r| &r.mutations)
            .any(|m| !matches!(m, Mutation::SetCell { .. } | Mutation::Aggregate { .. }))
    }

    /// Applies the mutations of every row atomically and durably (one synced WriteBatch).
    /// The caller has validated them against `table`'s schema. For callers outside the async
    /// runtime; the server uses [`Store::mutate_async`].
    pub fn mutate(&self, table: &TableSchema, rows: &[RowMutation]) -> Result<()> {
        let _locks = self.lock_rows(
            table.id,
            rows.iter().map(|r| &r.row),
            Self::needs_exclusive(rows),
        );
        self.write_locked(table, rows)
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
            let _locks = store
                .lock_rows_async(
                    table.id,
                    rows.iter().map(|r| &r.row),
                    Self::needs_exclusive(&rows),
                )
                .await;
            match store.submit_write(&table, &rows)? {
                None => Ok(()),
                Some(write) => {
                    let result = write.done.await.unwrap_or_else(|_| Err(committer_gone()));
                    store.finish_write(write.first);
                    result
                }
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
        decide: impl FnOnce(Row) -> Result<(Vec<Mutation>, T)>,
    ) -> Result<T> {
        let _locks = self.lock_rows(table.id, std::iter::once(row), true);
        let current = self.read_row(table, row)?;
        let (mutations, out) = decide(current)?;
        self.write_locked(
            table,
            &[RowMutation {
                row: row.clone(),
                mutations,
            }],
        )?;
        Ok(out)
    }

    /// Writes rows whose locks the caller holds (outside the async runtime).
    fn write_locked(&self, table: &TableSchema, rows: &[RowMutation]) -> Result<()> {
        let Some(write) = self.submit_write(table, rows)? else {
            return Ok(());
        };
        let result = write
            .done
            .blocking_recv()
            .unwrap_or_else(|_| Err(committer_gone()));
        self.finish_write(write.first);
        result
    }

    /// Takes the versions of a write of locked rows, builds its batch and queues it at the
    /// committer; None when there is nothing to write. Until [`Store::finish_write`] the write
    /// counts as in flight (consistency tokens wait for it).
    fn submit_write(
        &self,
        table: &TableSchema,
        rows: &[RowMutation],
    ) -> Result<Option<SubmittedWrite>> {
        let total: usize = rows.iter().map(|r| r.mutations.len()).sum();
        if total == 0 {
            return Ok(None);
        }
        // The caller validated against a schema snapshot; a family dropped (or the table
        // deleted) since must not receive versions newer than its drop. The catalog stays
        // read-locked until the batch is queued, so a table deletion queues behind it.
        let tables = self.catalog.tables.read();
        let current = tables
            .by_id(table.id)
            .ok_or_else(|| Error::NotFound(format!("table {} not found", table.name)))?;
        for family in rows
            .iter()
            .flat_map(|r| &r.mutations)
            .filter_map(Mutation::family)
        {
            current.family(family)?;
        }
        let first = {
            let mut inflight = self.inflight.lock();
            let first = self.clock.allocate(total as u64);
            *inflight.entry(first.hlc).or_default() += 1;
            first
        };
        match self.build_batch(table, rows, first) {
            Ok(batch) => {
                let done = self.committer.submit(batch, self.clock.current());
                drop(tables);
                Ok(Some(SubmittedWrite {
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

    /// The batch of a write of locked rows whose versions start at `first`.
    fn build_batch(
        &self,
        table: &TableSchema,
        rows: &[RowMutation],
        first: Version,
    ) -> Result<WriteBatch> {
        let mut overlay = Overlay::new(self);
        let mut hlc = first.hlc;
        let now = now_micros();
        for row in rows {
            let mut touched: BTreeSet<(String, Bytes)> = BTreeSet::new();
            for m in &row.mutations {
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
                        overlay.merge(key, aggregate::operand(version, *aggregator, *input));
                        touched.insert((family.clone(), qualifier.clone()));
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
            // physical space follows the rule without waiting for a full compaction.
            for (family, qualifier) in touched {
                let Some(rule) = table
                    .families
                    .get(&family)
                    .and_then(|f| f.gc_rule.as_ref())
                    .filter(|r| r.counts_versions())
                else {
                    continue;
                };
                let prefix = encoding::column_prefix(table.id, &row.row, &family, &qualifier);
                let mut index = 0;
                for key in overlay.keys_with_prefix(&prefix)? {
                    if let Some(d) = encoding::decode_key(&key)
                        && let KeyEntry::Cell { timestamp, .. } = d.entry
                    {
                        if rule.eligible(Some(index), timestamp, now) == Some(true) {
                            overlay.delete(key);
                        }
                        index += 1;
                    }
                }
            }
        }
        Ok(overlay.into_batch())
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

    // ---------------------------------------------------------------- reads

    /// Options of an iterator over a table in key order (scans).
    fn read_opts(&self, table_id: u64) -> ReadOptions {
        let mut opts = ReadOptions::default();
        opts.set_total_order_seek(true);
        opts.set_iterate_lower_bound(encoding::table_prefix(table_id));
        opts.set_iterate_upper_bound(encoding::table_end(table_id));
        opts
    }

    /// Options of an iterator whose every seek reads within one row: the seek uses the
    /// row-prefix bloom filters and the iterator ends at the end of the seek key's row.
    fn row_read_opts(&self) -> ReadOptions {
        let mut opts = ReadOptions::default();
        opts.set_prefix_same_as_start(true);
        opts
    }

    /// Reads the rows of `rows` in key order — or reverse key order — and calls `emit` with
    /// each row that has live cells, until it returns false. Rows are consistent: a row is
    /// never seen half-mutated.
    pub fn scan(
        &self,
        table: &TableSchema,
        rows: &RowSet,
        reversed: bool,
        mut emit: impl FnMut(Row) -> bool,
    ) -> Result<()> {
        for row in self.rows(table, rows, reversed) {
            if !emit(row?) {
                break;
            }
        }
        Ok(())
    }

    /// The rows of `rows` that have live cells, in key order (or reverse key order), as a
    /// stream the caller pulls from: the read path merges such streams and stops when it has
    /// what it needs. Rows are consistent: a row is never seen half-mutated.
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
        RowStream {
            table,
            it: self.db.raw_iterator_cf_opt(self.data(), opts),
            table_end: encoding::table_end(table.id),
            ranges: ranges.into_iter(),
            current: None,
            reversed,
            now: now_micros(),
            entries: Vec::new(),
            failed: false,
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
                        .ok_or_else(|| Error::Internal("undecodable key in data".into()))?;
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

    /// Approximate bytes stored for `range` of `table` on disk (RocksDB's estimate from the SST
    /// files; writes still in memtables are not counted): what a tablet's size is reported as.
    pub fn approximate_size(&self, table: &TableSchema, range: &RowRange) -> u64 {
        let keys = key_range(table.id, range);
        if keys.start >= keys.end {
            return 0;
        }
        self.db
            .get_approximate_sizes_cf(self.data(), &[rocksdb::Range::new(&keys.start, &keys.end)])
            [0]
    }

    // ---------------------------------------------------------------- operations

    pub fn stats(&self) -> StorageStats {
        let prop = |name: &str| {
            self.db
                .property_int_value_cf(self.data(), name)
                .ok()
                .flatten()
                .unwrap_or(0)
        };
        StorageStats {
            sst_bytes: prop("rocksdb.total-sst-files-size"),
            memtable_bytes: prop("rocksdb.cur-size-all-mem-tables"),
            pending_compaction_bytes: prop("rocksdb.estimate-pending-compaction-bytes"),
            running_compactions: prop("rocksdb.num-running-compactions"),
        }
    }

    /// Flushes memtables and syncs the WAL (graceful shutdown).
    pub fn flush(&self) -> Result<()> {
        self.db.flush_wal(true)?;
        self.db.flush_cf(self.data())?;
        self.db.flush_cf(self.meta())?;
        Ok(())
    }

    /// Compacts the whole data column family (runs the GC compaction filter over everything).
    pub fn compact_all(&self) {
        self.db
            .compact_range_cf(self.data(), None::<&[u8]>, None::<&[u8]>);
    }
}

fn decode_row(key: &[u8]) -> Option<Vec<u8>> {
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
                if !matches!(kind, ValueKind::Plain | ValueKind::Aggregate) {
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
                let value = v.slice(encoding::VALUE_HEADER_LEN..);
                let value = match (kind, schema.aggregate) {
                    (ValueKind::Aggregate, Some(aggregator)) => aggregator.read_value(&value),
                    _ => value,
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

/// Pending writes of one batch, layered over the database so that later mutations of the same
/// request see earlier ones (e.g. SetCell then DeleteFromRow).
struct Overlay<'a> {
    store: &'a Store,
    pending: BTreeMap<Vec<u8>, Pending>,
    /// One iterator over the table for every lookup of the batch: creating a RocksDB iterator
    /// (a merged view of the memtables and every level) costs far more than a seek, and a
    /// version-trimming write looks up each column it writes. Its implicit snapshot is taken at
    /// the first lookup; the rows are locked by then (see [`Store::mutate`]).
    iter: Option<rocksdb::DBRawIterator<'a>>,
}

/// The batch's net effect on one key.
enum Pending {
    Put(Vec<u8>),
    Delete,
    /// Aggregate operands (oldest first) to merge into whatever the database holds.
    Merge(Vec<Vec<u8>>),
}

impl<'a> Overlay<'a> {
    fn new(store: &'a Store) -> Self {
        Self {
            store,
            pending: BTreeMap::new(),
            iter: None,
        }
    }

    fn put(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.pending.insert(key, Pending::Put(value));
    }

    fn delete(&mut self, key: Vec<u8>) {
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
    fn merge(&mut self, key: Vec<u8>, operand: Vec<u8>) {
        let next = match self.pending.remove(&key) {
            None => Pending::Merge(vec![operand]),
            Some(Pending::Merge(mut ops)) => {
                ops.push(operand);
                Pending::Merge(ops)
            }
            Some(Pending::Put(v)) => {
                Pending::Put(aggregate::full_merge(Some(&v), [operand.as_slice()]))
            }
            Some(Pending::Delete) => {
                Pending::Put(aggregate::full_merge(None, [operand.as_slice()]))
            }
        };
        self.pending.insert(key, next);
    }

    /// Live keys starting with `prefix`, in order, as the batch would leave them.
    fn keys_with_prefix(&mut self, prefix: &[u8]) -> Result<Vec<Vec<u8>>> {
        let end = encoding::prefix_successor(prefix);
        let mut keys: BTreeSet<Vec<u8>> = BTreeSet::new();
        let store = self.store;
        // Every prefix looked up here lies within one row (a column, a family or a row).
        debug_assert!(encoding::row_prefix_len(prefix).is_some());
        let it = self.iter.get_or_insert_with(|| {
            store
                .db
                .raw_iterator_cf_opt(store.data(), store.row_read_opts())
        });
        it.seek(prefix);
        while let Some(k) = it.key() {
            if !k.starts_with(prefix) {
                break;
            }
            keys.insert(k.to_vec());
            it.next();
        }
        it.status()?;
        let upper = match &end {
            Some(e) => std::ops::Bound::Excluded(e.clone()),
            None => std::ops::Bound::Unbounded,
        };
        for (k, v) in self
            .pending
            .range((std::ops::Bound::Included(prefix.to_vec()), upper))
        {
            match v {
                Pending::Put(_) | Pending::Merge(_) => keys.insert(k.clone()),
                Pending::Delete => keys.remove(k),
            };
        }
        Ok(keys.into_iter().collect())
    }

    fn into_batch(self) -> WriteBatch {
        let data = self.store.data();
        let mut batch = WriteBatch::default();
        for (k, v) in self.pending {
            match v {
                Pending::Put(v) => batch.put_cf(data, k, v),
                Pending::Delete => batch.delete_cf(data, k),
                Pending::Merge(ops) => {
                    for op in ops {
                        batch.merge_cf(data, &k, op);
                    }
                }
            }
        }
        batch
    }
}

// -------------------------------------------------------------------- compaction filter

struct GcFilterFactory {
    catalog: Arc<SharedCatalog>,
    grace_micros: i64,
}

impl CompactionFilterFactory for GcFilterFactory {
    type Filter = GcFilter;

    fn create(&mut self, _context: CompactionFilterContext) -> GcFilter {
        GcFilter {
            catalog: self.catalog.clone(),
            grace_micros: self.grace_micros,
            now: now_micros(),
        }
    }

    fn name(&self) -> &CStr {
        c"basalt-gc-factory"
    }
}

/// Physically removes what reads already hide: cells of dropped families, cells a family's GC
/// rule certainly collects (age-based; version counts are trimmed on the write path), and
/// tombstones older than the grace period. Unknown tables are kept: deleted tables are removed
/// by range deletion, and a table being created must never lose data to a race.
struct GcFilter {
    catalog: Arc<SharedCatalog>,
    grace_micros: i64,
    now: i64,
}

impl GcFilter {
    fn decide(&self, key: &[u8], value: &[u8]) -> Decision {
        if !self.catalog.loaded.load(Ordering::SeqCst) {
            return Decision::Keep;
        }
        let Some((table_id, family)) = encoding::peek_table_and_family(key) else {
            return Decision::Keep;
        };
        let Some((version, kind, _)) = encoding::decode_value(value) else {
            return Decision::Keep;
        };
        if kind == ValueKind::Tombstone {
            let expired = (version.hlc as i64).saturating_add(self.grace_micros) < self.now;
            return if expired {
                Decision::Remove
            } else {
                Decision::Keep
            };
        }
        // Never wait for the catalog: a schema change holds it across a synced write, and
        // that write may itself wait (write stall) for this compaction. Keeping is always safe.
        let Some(tables) = self.catalog.tables.try_read() else {
            return Decision::Keep;
        };
        let Some(table) = tables.by_id(table_id) else {
            return Decision::Keep;
        };
        let Some(family) = family.and_then(|f| std::str::from_utf8(f).ok()) else {
            return Decision::Keep;
        };
        if table.dropped(family, version.hlc) {
            return Decision::Remove;
        }
        let Some(schema) = table.families.get(family) else {
            // Not created yet by the catalog's view, or dropped: the drop marker decides.
            return Decision::Keep;
        };
        let Some(rule) = &schema.gc_rule else {
            return Decision::Keep;
        };
        if let Some(d) = encoding::decode_key(key)
            && let KeyEntry::Cell { timestamp, .. } = d.entry
            && rule.eligible(None, timestamp, self.now) == Some(true)
        {
            return Decision::Remove;
        }
        Decision::Keep
    }
}

impl CompactionFilter for GcFilter {
    fn filter(&mut self, _level: u32, key: &[u8], value: &[u8]) -> Decision {
        self.decide(key, value)
    }

    fn name(&self) -> &CStr {
        c"basalt-gc"
    }
}
