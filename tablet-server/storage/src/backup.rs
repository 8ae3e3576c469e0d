//! The storage side of a backup: a consistent cut of a table read out entry by entry, and the
//! ingestion of a backup's entries into a new table (`docs/backups.md`).
//!
//! **The cut.** Under the catalog's write lock no write can take a version (a writer holds
//! the read lock from its versions to its queued batch, `write.rs`). There the store waits
//! for every queued write to commit ([`crate::committer::Committer::barrier`]) and takes a
//! RocksDB snapshot at the commit boundary: the snapshot holds every write with a version at
//! or below the clock's reading and none above it, so the backup is one point in time (its
//! `end_time`), with no row half-written. Writers wait for one group commit; the read that
//! follows runs on the snapshot, writes going on meanwhile.
//!
//! **Restore.** Entries come back in key order (the backup's order) under the new table's
//! id, are written into SST files and ingested at once: the table gets all of them or none.

use std::path::{Path, PathBuf};

use basalt_model::{RowRange, TableSchema};
use rocksdb::{ReadOptions, SstFileWriter};

use crate::error::{Error, Result};
use crate::options::data_cf_options;
use crate::ranges::SstFile;
use crate::read::key_range;
use crate::store::Store;

/// Largest SST file a restore writes before starting the next one.
const RESTORE_FILE_BYTES: u64 = 64 << 20;

/// Bytes of the table id at the front of every data key.
const TABLE_ID_BYTES: usize = 8;

/// What [`Store::backup_scan`] hands each entry to: the index of its range, its key (without
/// the table id) and its value.
pub type BackupEntry<'a> = dyn FnMut(usize, &[u8], &[u8]) -> Result<()> + 'a;

impl Store {
    /// Reads `ranges` of `table` as of one cut: `on_entry(range index, key, value)` for every
    /// entry (cells, tombstones, aggregate states merged), in key order, keys without the
    /// table's id. Returns the cut's clock value: every write at or below it is in what was
    /// read, none above it. Blocking (run it off the async runtime).
    ///
    /// `at`: the cut's clock value, chosen by the caller (the servers of a cluster cut at the
    /// same value). Refused when this store's clock is already past it, or a range is fenced
    /// for a move or not served here; otherwise the clock moves to it, so every later write
    /// is above it.
    pub fn backup_scan(
        &self,
        table: &TableSchema,
        ranges: &[RowRange],
        at: Option<u64>,
        on_entry: &mut BackupEntry<'_>,
    ) -> Result<u64> {
        let (snapshot, cut) = {
            let tables = self.catalog.tables.write();
            if tables.by_id(table.id).is_none() {
                return Err(Error::not_found(format!("table {} not found", table.name)));
            }
            if let Some(at) = at {
                let now = self.clock.current();
                if now > at {
                    return Err(Error::failed_precondition(format!(
                        "this server's clock ({now}) is past the backup's cut ({at})"
                    )));
                }
                let fences = self.fences.read();
                if let Some(refused) = ranges.iter().find_map(|r| fences.range_refusal(table, r)) {
                    return Err(refused);
                }
                self.clock.observe(at);
            }
            self.committer.barrier(self.clock.current())?;
            let cut = self
                .committer
                .at_boundary(|_| (self.db.snapshot(), at.unwrap_or(self.clock.current())));
            drop(tables);
            cut
        };
        for (index, range) in ranges.iter().enumerate() {
            let keys = key_range(table.id, range);
            if keys.start >= keys.end {
                continue;
            }
            let mut opts = ReadOptions::default();
            opts.set_total_order_seek(true);
            // A backup reads everything once: its blocks would only push the requests' hot
            // blocks out of the cache.
            opts.fill_cache(false);
            opts.set_snapshot(&snapshot);
            opts.set_iterate_lower_bound(keys.start.clone());
            opts.set_iterate_upper_bound(keys.end.clone());
            let mut it = self.db.raw_iterator_cf_opt(self.data(), opts);
            it.seek(&keys.start);
            while let (Some(k), Some(v)) = (it.key(), it.value()) {
                on_entry(index, &k[TABLE_ID_BYTES..], v)?;
                it.next();
            }
            it.status()?;
        }
        Ok(cut)
    }

    /// Writes restored entries of `table` (keys without the table id, ascending) into SST
    /// files in `dir`, for [`RestoreWriter::ingest`].
    pub fn restore_writer(&self, table: &TableSchema, dir: &Path) -> Result<RestoreWriter<'_>> {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::Io(format!("creating {}: {e}", dir.display())))?;
        Ok(RestoreWriter {
            store: self,
            prefix: table.id.to_be_bytes(),
            dir: dir.to_path_buf(),
            writer: None,
            files: Vec::new(),
            key: Vec::new(),
            last: None,
            max_version: 0,
        })
    }
}

/// The options restored SST files are written with (the data column family's).
fn writer_options() -> &'static rocksdb::Options {
    static OPTIONS: std::sync::OnceLock<rocksdb::Options> = std::sync::OnceLock::new();
    OPTIONS.get_or_init(|| data_cf_options(8 << 20))
}

/// SST files of a restore being written ([`Store::restore_writer`]).
pub struct RestoreWriter<'a> {
    store: &'a Store,
    prefix: [u8; TABLE_ID_BYTES],
    dir: PathBuf,
    writer: Option<(SstFileWriter<'static>, PathBuf, u64)>,
    files: Vec<SstFile>,
    key: Vec<u8>,
    last: Option<Vec<u8>>,
    max_version: u64,
}

impl RestoreWriter<'_> {
    /// Adds one entry; keys must come in ascending order.
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        if self.last.as_deref().is_some_and(|last| key <= last) {
            return Err(Error::Corrupt(
                "backup entries out of order (a chunk is damaged or misplaced)".into(),
            ));
        }
        self.last = Some(key.to_vec());
        if value.len() >= 8 {
            let version = u64::from_be_bytes(value[..8].try_into().expect("8 bytes"));
            self.max_version = self.max_version.max(version);
        }
        if self.writer.is_none() {
            let path = self
                .dir
                .join(format!("restore-{:06}.sst", self.files.len()));
            let w = SstFileWriter::create(writer_options());
            w.open(&path)?;
            self.writer = Some((w, path, 0));
        }
        let (w, _, entries) = self.writer.as_mut().expect("opened above");
        self.key.clear();
        self.key.extend_from_slice(&self.prefix);
        self.key.extend_from_slice(key);
        w.put(&self.key, value)?;
        *entries += 1;
        if w.file_size() >= RESTORE_FILE_BYTES {
            self.close()?;
        }
        Ok(())
    }

    fn close(&mut self) -> Result<()> {
        if let Some((mut w, path, entries)) = self.writer.take() {
            w.finish()?;
            let bytes = std::fs::metadata(&path)
                .map_err(|e| Error::Io(format!("{}: {e}", path.display())))?
                .len();
            self.files.push(SstFile {
                path,
                bytes,
                entries,
            });
        }
        Ok(())
    }

    /// Ingests every entry written, atomically; the store's clock moves past the newest
    /// version restored, so later writes are newer than every restored cell.
    pub fn ingest(mut self) -> Result<u64> {
        self.close()?;
        self.store.clock.observe(self.max_version);
        self.store.ingest(&self.files)?;
        Ok(self.files.iter().map(|f| f.entries).sum())
    }
}
