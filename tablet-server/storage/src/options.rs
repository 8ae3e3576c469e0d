//! RocksDB options of the store, and the store's own settings.

use rocksdb::{BlockBasedOptions, DBCompressionType, Options};

use crate::encoding;

#[derive(Debug, Clone)]
pub struct StoreOptions {
    pub cluster_id: u16,
    /// How long tombstones are kept at least before compaction may drop them. With
    /// replication they are also kept until every peer cluster acknowledged past them (the
    /// safe point, [`crate::safe_point`]).
    pub tombstone_grace_micros: i64,
    /// Whether the store keeps every tombstone from its opening until the replication code
    /// sets the safe point ([`Store::set_tombstone_safe_point`](crate::Store)): a cluster
    /// server's store, which may have peers. False: the grace alone decides until told
    /// otherwise (standalone, tests).
    pub await_tombstone_safe_point: bool,
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
            await_tombstone_safe_point: false,
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
    // Every group commit also writes the tiny `meta` column family (the clock floor), whose
    // memtable therefore holds a record of every WAL file and would keep them all until
    // RocksDB's default cap (4 × the memtables, ~2 GiB here) forced a flush. Past this size
    // RocksDB flushes the column families pinning the oldest WAL files (the `meta` one: a few
    // bytes), so the WAL stays bounded and a restart after kill -9 replays little.
    db_opts.set_max_total_wal_size(MAX_TOTAL_WAL_BYTES);
    db_opts
}

/// The WAL size past which RocksDB flushes the column families that pin the oldest WAL files.
pub const MAX_TOTAL_WAL_BYTES: u64 = 256 << 20;

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

/// RocksDB options of the `log` column family (the change log, [`crate::changelog`]). Its
/// entries are written once, in key order, read by the shippers soon after and deleted in
/// ranges once every peer has them. Not compressed: its files are mostly values the data
/// column family compresses already, and compressing them again at flush would cost CPU on
/// every write's bytes for files that are deleted once the peers have them.
pub fn log_cf_options() -> Options {
    let mut log_opts = Options::default();
    log_opts.set_compression_type(DBCompressionType::None);
    log_opts.set_write_buffer_size(64 << 20);
    log_opts
}
