//! [`Store`]: the RocksDB database of one tablet server, opened with its merge operator and
//! compaction filter; its write path, read path, catalog and range operations live in their
//! own modules.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use basalt_model::hlc::HybridClock;
use parking_lot::Mutex;
use rocksdb::{ColumnFamilyDescriptor, DB, IteratorMode, Options, WriteBatch, WriteOptions};

use crate::capture::Captures;
use crate::catalog::SharedCatalog;
use crate::committer::{ChangeLog, Committer};
use crate::compaction::{GcFilterFactory, SharedSafePoint};
use crate::encoding;
use crate::error::{Error, Result};
use crate::fences::Fences;
use crate::layout::{CF_DATA, CF_LOG, CF_META, META_CLOCK_FLOOR, META_FORMAT, ROW_LOCK_STRIPES};
use crate::merge_operator;
use crate::observer::LogOp;
use crate::observer::{CommitObserver, Observers};
use crate::options::{StorageStats, StoreOptions, data_cf_options, db_options, log_cf_options};

pub struct Store {
    pub(crate) db: Arc<DB>,
    /// Group commit of the data path's writes.
    pub(crate) committer: Committer,
    pub(crate) catalog: Arc<SharedCatalog>,
    pub(crate) clock: HybridClock,
    /// Striped row locks: shared for blind writes, exclusive for writes that read the row.
    /// Held until the write is durable, across awaits on the async path (hence tokio's).
    pub(crate) row_locks: Vec<tokio::sync::RwLock<()>>,
    /// First versions of writes that are allocated but not yet durable (→ consistency tokens).
    pub(crate) inflight: Mutex<BTreeMap<u64, usize>>,
    /// Serialises schema changes.
    pub(crate) admin: Mutex<()>,
    pub(crate) sample_scan_limit: u64,
    /// This store's identity ([`Store::store_id`]), created at the first open of its directory.
    pub(crate) store_id: String,
    /// The origin its clients' aggregate inputs are kept under ([`Store::origin`]).
    pub(crate) origin: u64,
    /// Tablet moves in progress from this store (see [`crate::moves`]); the first of
    /// `observers`.
    pub(crate) captures: Arc<Captures>,
    /// What sees every committed group (see [`crate::observer`]); writers ask them whether
    /// to build their physical operations.
    pub(crate) observers: Observers,
    /// Ranges not served here (fenced for a move, or moved away): reads and writes of them are
    /// refused.
    pub(crate) fences: parking_lot::RwLock<Fences>,
    /// Whether writes are logged, and the log's next sequence (see [`crate::changelog`]).
    pub(crate) change_log: Arc<ChangeLog>,
    /// The replication safe point the compaction filter reads (see [`crate::safe_point`]).
    pub(crate) safe_point: Arc<SharedSafePoint>,
}

impl Store {
    pub fn open(dir: &Path, options: StoreOptions) -> Result<Store> {
        Self::open_with_observers(dir, options, vec![])
    }

    /// Opens the store with `observers` seeing every group it commits, after its own (the
    /// captures of tablet moves); see [`crate::observer`].
    pub fn open_with_observers(
        dir: &Path,
        options: StoreOptions,
        observers: Vec<Arc<dyn CommitObserver>>,
    ) -> Result<Store> {
        let catalog = Arc::new(SharedCatalog::default());
        // A store that will replicate keeps every tombstone until told how far its peers
        // acknowledged (compactions may run as soon as it opens).
        let safe_point = Arc::new(SharedSafePoint::new(
            options.await_tombstone_safe_point.then_some(0),
        ));

        let db_opts = db_options();
        let mut data_opts = data_cf_options(options.block_cache_bytes);
        data_opts.set_merge_operator(
            "basalt-aggregate",
            |_key: &[u8], existing: Option<&[u8]>, operands: &rocksdb::MergeOperands| {
                Some(merge_operator::full_merge(existing, operands))
            },
            |_key: &[u8], _existing: Option<&[u8]>, operands: &rocksdb::MergeOperands| {
                merge_operator::partial_merge(operands)
            },
        );
        data_opts.set_compaction_filter_factory(GcFilterFactory {
            catalog: catalog.clone(),
            grace_micros: options.tombstone_grace_micros,
            safe_point: safe_point.clone(),
        });

        let cfs = vec![
            ColumnFamilyDescriptor::new(CF_DATA, data_opts),
            ColumnFamilyDescriptor::new(CF_META, Options::default()),
            ColumnFamilyDescriptor::new(CF_LOG, log_cf_options()),
        ];
        let db = Arc::new(DB::open_cf_descriptors(&db_opts, dir, cfs)?);
        let store_id = open_store_id(&db)?;

        let change_log = Arc::new(ChangeLog::open(&db)?);
        let captures = Arc::new(Captures::default());
        let observers = Observers::new(
            std::iter::once(captures.clone() as Arc<dyn CommitObserver>)
                .chain(observers)
                .collect(),
        );
        let store = Store {
            committer: Committer::start(db.clone(), observers.clone(), change_log.clone())?,
            change_log,
            captures,
            observers,
            fences: parking_lot::RwLock::new(Fences::default()),
            db,
            catalog,
            clock: HybridClock::new(options.cluster_id),
            row_locks: (0..ROW_LOCK_STRIPES)
                .map(|_| tokio::sync::RwLock::new(()))
                .collect(),
            inflight: Mutex::new(BTreeMap::new()),
            admin: Mutex::new(()),
            sample_scan_limit: options.sample_scan_limit_bytes,
            origin: origin_of(&store_id),
            store_id,
            safe_point,
        };
        store.check_format()?;
        store.load_catalog()?;
        if let Some(floor) = store.meta_u64(META_CLOCK_FLOOR)? {
            store.clock.observe(floor);
        }
        Ok(store)
    }

    /// The number of this store's cluster in its instance: the tiebreaker of the versions of
    /// its writes from now on (a cluster server sets it from etcd before it serves).
    pub fn set_cluster_number(&self, number: u16) {
        self.clock.set_cluster(number);
    }

    /// The number of this store's cluster (0 until set).
    pub fn cluster_number(&self) -> u16 {
        self.clock.cluster()
    }

    pub(crate) fn cf(&self, name: &str) -> &rocksdb::ColumnFamily {
        self.db
            .cf_handle(name)
            .expect("column families are created at open")
    }

    pub(crate) fn data(&self) -> &rocksdb::ColumnFamily {
        self.cf(CF_DATA)
    }

    pub(crate) fn meta(&self) -> &rocksdb::ColumnFamily {
        self.cf(CF_META)
    }

    pub(crate) fn sync_write(&self, batch: WriteBatch) -> Result<()> {
        let mut opts = WriteOptions::default();
        opts.set_sync(true);
        self.db.write_opt(batch, &opts)?;
        Ok(())
    }

    /// Deletes the data keys `[start, end)` through the committer (so that the observers see
    /// the deletion, e.g. a capture of an overlapping range).
    pub(crate) fn delete_keys(&self, start: Vec<u8>, end: Vec<u8>) -> Result<()> {
        let mut batch = WriteBatch::default();
        batch.delete_range_cf(self.data(), &start, &end);
        let ops = self.range_ops(start, end);
        self.committer
            .commit_blocking(batch, self.clock.current(), ops)
    }

    /// The physical operations of a range deletion, while an observer wants them.
    pub(crate) fn range_ops(&self, start: Vec<u8>, end: Vec<u8>) -> Vec<LogOp> {
        if self.observers.wants_ops() {
            vec![LogOp::DeleteRange { start, end }]
        } else {
            vec![]
        }
    }

    pub(crate) fn meta_u64(&self, key: &[u8]) -> Result<Option<u64>> {
        Ok(self
            .db
            .get_pinned_cf(self.meta(), key)?
            .and_then(|v| v.as_ref().try_into().ok().map(u64::from_be_bytes)))
    }

    fn check_format(&self) -> Result<()> {
        match self.db.get_cf(self.meta(), META_FORMAT)? {
            None => {
                let mut batch = WriteBatch::default();
                self.put_format(&mut batch);
                self.sync_write(batch)
            }
            Some(v) if v == encoding::FORMAT_VERSION.to_string().as_bytes() => Ok(()),
            Some(v) if v == b"1" => self.migrate_from_format_1(),
            Some(v) if v == b"2" => self.migrate_from_format_2(),
            Some(v) => Err(Error::Corrupt(format!(
                "data directory has on-disk format version {}, this server reads version {}",
                String::from_utf8_lossy(&v),
                encoding::FORMAT_VERSION
            ))),
        }
    }

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

    /// Whether the store holds no data at all (no key of any table): a store that never took
    /// a write. Point-in-time recovery counts such a store's log from its beginning.
    pub fn holds_no_data(&self) -> Result<bool> {
        match self.db.iterator_cf(self.data(), IteratorMode::Start).next() {
            None => Ok(true),
            Some(item) => item.map(|_| false).map_err(Into::into),
        }
    }

    /// Compacts the whole data column family (runs the GC compaction filter over everything).
    pub fn compact_all(&self) {
        self.db
            .compact_range_cf(self.data(), None::<&[u8]>, None::<&[u8]>);
    }
}

/// The store id kept in `db`, created (and synced) at its first open.
pub(crate) fn open_store_id(db: &rocksdb::DB) -> Result<String> {
    let meta = db
        .cf_handle(crate::layout::CF_META)
        .expect("column families are created at open");
    if let Some(id) = db.get_cf(meta, crate::layout::META_STORE_ID)? {
        return String::from_utf8(id)
            .map_err(|_| Error::Corrupt("the store id is not UTF-8".into()));
    }
    let id = new_store_id();
    let mut batch = WriteBatch::default();
    batch.put_cf(meta, crate::layout::META_STORE_ID, id.as_bytes());
    let mut opts = rocksdb::WriteOptions::default();
    opts.set_sync(true);
    db.write_opt(batch, &opts)?;
    Ok(id)
}

/// The origin number of a store id: its 64 random bits (`st-` and 16 hex digits), or a hash
/// of an id of another shape; never the legacy origin.
pub(crate) fn origin_of(store_id: &str) -> u64 {
    let n = store_id
        .strip_prefix("st-")
        .filter(|hex| hex.len() == 16)
        .and_then(|hex| u64::from_str_radix(hex, 16).ok())
        .unwrap_or_else(|| basalt_model::hll::hash(store_id.as_bytes()));
    if n == crate::merge_operator::LEGACY_ORIGIN {
        1
    } else {
        n
    }
}

/// A fresh store id: `st-` and 16 hex digits from the system's random source, falling back to
/// the time and process id.
fn new_store_id() -> String {
    use std::io::Read;
    let mut bytes = [0u8; 8];
    let random = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .is_ok();
    if !random {
        let seed = (basalt_model::hlc::now_micros() as u64) ^ ((std::process::id() as u64) << 32);
        bytes = seed.to_be_bytes();
    }
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("st-{hex}")
}
