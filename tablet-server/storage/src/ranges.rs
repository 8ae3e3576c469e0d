//! Operations on the key range of a tablet, the building blocks of tablet moves: its size, a
//! consistent export as SST files, the ingestion of such files, and its deletion.
//!
//! Keys carry the table's internal id, so files exported from one store are ingested by a
//! store whose catalog gives the table the same id (the cluster issue makes ids instance-wide).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use basalt_model::{RowRange, TableSchema};
use bytes::Bytes;
use rocksdb::{IngestExternalFileOptions, ReadOptions, SstFileWriter};

use crate::encoding;
use crate::error::{Error, Result};
use crate::options::data_cf_options;
use crate::read::{KeyRange, decode_row, key_range};
use crate::store::Store;

/// Largest SST file an export writes before starting the next one.
const EXPORT_FILE_BYTES: u64 = 64 << 20;

/// One SST file of an export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SstFile {
    pub path: PathBuf,
    /// Its size on disk.
    pub bytes: u64,
    /// Entries (cells, tombstones, aggregate states) it holds.
    pub entries: u64,
}

impl Store {
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

    /// A row key near the middle of `range` of `table` by stored bytes, strictly after the
    /// range's first row (a split there leaves rows on both sides); None when the range holds
    /// fewer than two rows. Large ranges use SST file boundaries and RocksDB's size estimates;
    /// small ones are walked.
    pub fn split_point(&self, table: &TableSchema, range: &RowRange) -> Result<Option<Bytes>> {
        let keys = key_range(table.id, range);
        if keys.start >= keys.end {
            return Ok(None);
        }
        let on_disk = self
            .db
            .get_approximate_sizes_cf(self.data(), &[rocksdb::Range::new(&keys.start, &keys.end)])
            [0];
        let first_row = self.first_row(&keys)?;
        let after_first = |row: &[u8]| first_row.as_deref().is_some_and(|f| row > f);
        if on_disk >= self.sample_scan_limit {
            let mut candidates: BTreeSet<Vec<u8>> = BTreeSet::new();
            for file in self.db.live_files()? {
                if file.column_family_name != crate::layout::CF_DATA {
                    continue;
                }
                for k in [file.start_key.as_deref(), file.end_key.as_deref()]
                    .into_iter()
                    .flatten()
                {
                    if k >= keys.start.as_slice()
                        && k < keys.end.as_slice()
                        && let Some(row) = decode_row(k)
                        && after_first(&row)
                    {
                        candidates.insert(row);
                    }
                }
            }
            let prefixes: Vec<Vec<u8>> = candidates
                .iter()
                .map(|row| encoding::row_prefix(table.id, row))
                .collect();
            let ranges: Vec<rocksdb::Range> = prefixes
                .iter()
                .map(|p| rocksdb::Range::new(&keys.start, p))
                .collect();
            let sizes = self.db.get_approximate_sizes_cf(self.data(), &ranges);
            let half = on_disk / 2;
            if let Some((row, _)) = candidates
                .iter()
                .zip(sizes)
                .filter(|(_, size)| *size > 0 && *size < on_disk)
                .min_by_key(|(_, size)| size.abs_diff(half))
            {
                return Ok(Some(Bytes::copy_from_slice(row)));
            }
        }
        // Walk the range: the first row at or past half of its bytes.
        let mut rows: Vec<(Vec<u8>, u64)> = Vec::new();
        let mut total: u64 = 0;
        let mut it = self
            .db
            .raw_iterator_cf_opt(self.data(), self.read_opts(table.id));
        it.seek(&keys.start);
        while let (Some(k), Some(v)) = (it.key(), it.value()) {
            if k >= keys.end.as_slice() {
                break;
            }
            let starts_new_row = rows
                .last()
                .is_none_or(|(r, _)| !k.starts_with(&encoding::row_prefix(table.id, r)));
            if starts_new_row {
                let row = decode_row(k)
                    .ok_or_else(|| Error::Corrupt("undecodable key in data".into()))?;
                rows.push((row, total));
            }
            total += (k.len() + v.len()) as u64;
            it.next();
        }
        it.status()?;
        Ok(rows
            .iter()
            .skip(1)
            .find(|(_, before)| *before >= total / 2)
            .or_else(|| rows.get(1))
            .map(|(row, _)| Bytes::copy_from_slice(row)))
    }

    /// The first row stored in `keys`, if any.
    fn first_row(&self, keys: &KeyRange) -> Result<Option<Vec<u8>>> {
        let mut opts = ReadOptions::default();
        opts.set_iterate_upper_bound(keys.end.clone());
        let mut it = self.db.raw_iterator_cf_opt(self.data(), opts);
        it.seek(&keys.start);
        let row = it.key().and_then(decode_row);
        it.status()?;
        Ok(row)
    }

    /// The data keys `[start, end)` holding `range` of `table` (what a move's records must
    /// stay within).
    pub fn key_bounds(&self, table: &TableSchema, range: &RowRange) -> (Vec<u8>, Vec<u8>) {
        let keys = key_range(table.id, range);
        (keys.start, keys.end)
    }

    /// Writes every entry of `range` of `table`, as of one snapshot, into SST files in `dir`
    /// (created if missing), at most [`EXPORT_FILE_BYTES`] each, in key order. Aggregates are
    /// exported merged; tombstones are exported as they are, so deletes keep their versions.
    /// An empty range exports no file.
    pub fn export_range(
        &self,
        table: &TableSchema,
        range: &RowRange,
        dir: &Path,
    ) -> Result<Vec<SstFile>> {
        let keys = key_range(table.id, range);
        let snapshot = self.db.snapshot();
        self.export_snapshot(&snapshot, &keys, dir, EXPORT_FILE_BYTES, &mut |_| Ok(()))
    }

    /// [`Store::export_range`] of the keys `keys`, as `snapshot` sees them.
    /// Each file, once finished, is also handed to `on_file` (a move streams it while the next
    /// one is written); files hold at most `file_bytes`.
    pub(crate) fn export_snapshot(
        &self,
        snapshot: &rocksdb::Snapshot<'_>,
        keys: &KeyRange,
        dir: &Path,
        file_bytes: u64,
        on_file: &mut dyn FnMut(&SstFile) -> Result<()>,
    ) -> Result<Vec<SstFile>> {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::Io(format!("creating {}: {e}", dir.display())))?;
        if keys.start >= keys.end {
            return Ok(vec![]);
        }
        let mut opts = ReadOptions::default();
        opts.set_total_order_seek(true);
        opts.set_snapshot(snapshot);
        opts.set_iterate_lower_bound(keys.start.clone());
        opts.set_iterate_upper_bound(keys.end.clone());
        let mut it = self.db.raw_iterator_cf_opt(self.data(), opts);
        it.seek(&keys.start);
        let writer_opts = data_cf_options(8 << 20);
        let mut files = Vec::new();
        let mut writer: Option<(SstFileWriter, PathBuf, u64)> = None;
        while let (Some(k), Some(v)) = (it.key(), it.value()) {
            if writer.is_none() {
                let path = dir.join(format!("tablet-{:06}.sst", files.len()));
                let w = SstFileWriter::create(&writer_opts);
                w.open(&path)?;
                writer = Some((w, path, 0));
            }
            let (w, _, entries) = writer.as_mut().expect("opened above");
            w.put(k, v)?;
            *entries += 1;
            if w.file_size() >= file_bytes {
                let file = finish(writer.take().expect("opened above"))?;
                on_file(&file)?;
                files.push(file);
            }
            it.next();
        }
        it.status()?;
        if let Some(w) = writer {
            let file = finish(w)?;
            on_file(&file)?;
            files.push(file);
        }
        Ok(files)
    }

    /// Ingests SST files written by [`Store::export_range`] (of a table with the same id),
    /// atomically: all of them or none. The files are moved (hard-linked) into the store when
    /// they are on its file system. Their keys replace what the store holds at the same keys;
    /// delete the range first to make it an exact copy.
    pub fn ingest(&self, files: &[SstFile]) -> Result<()> {
        if files.is_empty() {
            return Ok(());
        }
        let mut opts = IngestExternalFileOptions::default();
        opts.set_move_files(true);
        let paths: Vec<&Path> = files.iter().map(|f| f.path.as_path()).collect();
        self.db
            .ingest_external_file_cf_opts(self.data(), &opts, paths)?;
        Ok(())
    }

    /// Deletes every entry of `range` of `table` (one synced range deletion; compactions
    /// reclaim the space).
    pub fn delete_range(&self, table: &TableSchema, range: &RowRange) -> Result<()> {
        let keys = key_range(table.id, range);
        if keys.start >= keys.end {
            return Ok(());
        }
        self.delete_keys(keys.start, keys.end)
    }
}

fn finish((mut writer, path, entries): (SstFileWriter, PathBuf, u64)) -> Result<SstFile> {
    writer.finish()?;
    let bytes = std::fs::metadata(&path)
        .map_err(|e| Error::Io(format!("{}: {e}", path.display())))?
        .len();
    Ok(SstFile {
        path,
        bytes,
        entries,
    })
}
