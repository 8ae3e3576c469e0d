//! Operations on the key range of a tablet, the building blocks of tablet moves: its size, a
//! consistent export as SST files, the ingestion of such files, and its deletion.
//!
//! Keys carry the table's internal id, so files exported from one store are ingested by a
//! store whose catalog gives the table the same id (the cluster issue makes ids instance-wide).

use std::path::{Path, PathBuf};

use basalt_model::{RowRange, TableSchema};
use rocksdb::{IngestExternalFileOptions, ReadOptions, SstFileWriter, WriteBatch};

use crate::error::{Error, Result};
use crate::options::data_cf_options;
use crate::read::key_range;
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
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::Io(format!("creating {}: {e}", dir.display())))?;
        if keys.start >= keys.end {
            return Ok(vec![]);
        }
        let snapshot = self.db.snapshot();
        let mut opts = ReadOptions::default();
        opts.set_total_order_seek(true);
        opts.set_snapshot(&snapshot);
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
            if w.file_size() >= EXPORT_FILE_BYTES {
                files.push(finish(writer.take().expect("opened above"))?);
            }
            it.next();
        }
        it.status()?;
        if let Some(w) = writer {
            files.push(finish(w)?);
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
        let mut batch = WriteBatch::default();
        batch.delete_range_cf(self.data(), keys.start, keys.end);
        self.sync_write(batch)
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
