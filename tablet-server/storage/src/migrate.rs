//! Opening a data directory of an older on-disk format (`docs/storage-format.md`).
//!
//! Format 1 → 2: aggregate cells become parts per origin ([`crate::merge_operator`]). Every
//! aggregate cell of format 1 — a state, or a state with operands RocksDB had not merged yet
//! (they carry no origin) — is rewritten as one part of the legacy origin. Cells are read
//! merged, so no format-1 operand is left behind a rewritten cell. The rewrite goes in synced
//! batches and the format is raised last: a crash in the middle leaves format 1, and the
//! migration runs again (rewriting a cell twice gives the same cell).
//!
//! Format 2 → 3: the change log refers to long SetCell values instead of carrying them (its
//! tag 7). Entries of format 2 read as they are: nothing is rewritten, the format is raised
//! so that a server of format 2, which could not read the new entries, refuses the directory.

use rocksdb::{IteratorMode, WriteBatch};

use crate::encoding::{self, ValueKind};
use crate::error::Result;
use crate::layout::META_FORMAT;
use crate::merge_operator::Parts;
use crate::store::Store;

/// Cells rewritten per synced batch.
const BATCH: usize = 4096;

impl Store {
    /// Rewrites a format-1 directory's aggregate cells (see the module docs).
    pub(crate) fn migrate_from_format_1(&self) -> Result<()> {
        let store = self;
        let mut batch = WriteBatch::default();
        for item in store.db.iterator_cf(store.data(), IteratorMode::Start) {
            let (key, value) = item?;
            let Some((_, kind, _)) = encoding::decode_value(&value) else {
                continue;
            };
            // Format 1 never wrote parts: those read here are format-1 operands merged on read.
            if matches!(kind, ValueKind::Aggregate | ValueKind::AggregateParts) {
                batch.put_cf(store.data(), &key, Parts::of_value(Some(&value)).to_value());
                if batch.len() >= BATCH {
                    store.sync_write(std::mem::take(&mut batch))?;
                }
            }
        }
        store.put_format(&mut batch);
        store.sync_write(batch)
    }

    /// Raises a format-2 directory to the current format (see the module docs).
    pub(crate) fn migrate_from_format_2(&self) -> Result<()> {
        let mut batch = WriteBatch::default();
        self.put_format(&mut batch);
        self.sync_write(batch)
    }

    /// Puts the current format version into `batch` (the directory is of it once written).
    pub(crate) fn put_format(&self, batch: &mut WriteBatch) {
        batch.put_cf(
            self.meta(),
            META_FORMAT,
            encoding::FORMAT_VERSION.to_string(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::merge_operator::LEGACY_ORIGIN;
    use crate::options::StoreOptions;
    use basalt_model::aggregate::Aggregator;
    use basalt_model::hlc::Version;
    use basalt_model::{FamilySchema, Mutation, RowMutation};
    use bytes::Bytes;

    fn v(hlc: u64) -> Version {
        Version { hlc, cluster: 1 }
    }

    /// A format-1 operand: aggregator and input, no origin.
    fn old_operand(version: Version, input: i64) -> Vec<u8> {
        let mut payload = vec![1u8];
        payload.extend_from_slice(&input.to_be_bytes());
        encoding::encode_value(version, ValueKind::MergeOperand, &payload)
    }

    #[test]
    fn a_format_2_directory_keeps_its_log_and_is_raised() {
        let dir = tempfile::tempdir().unwrap();
        let table = {
            let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
            let family = FamilySchema {
                gc_rule: None,
                aggregate: None,
            };
            let table = store
                .create_table(
                    "projects/p/instances/i/tables/t",
                    "projects/p/instances/i",
                    [("cf".to_string(), family)].into(),
                    vec![],
                    false,
                )
                .unwrap();
            store.set_change_log(true);
            let long = Bytes::from(vec![b'x'; 300]);
            let write = RowMutation {
                row: Bytes::from_static(b"r"),
                mutations: vec![Mutation::SetCell {
                    family: "cf".into(),
                    qualifier: Bytes::from_static(b"q"),
                    timestamp: 1000,
                    value: long.clone(),
                }],
            };
            store.mutate(&table, std::slice::from_ref(&write)).unwrap();
            // What a format-2 server left: the same write's entry with its value in full.
            let entry = store.read_change_log(0, usize::MAX).unwrap().remove(0).1;
            let mut batch = WriteBatch::default();
            batch.put_cf(
                store.cf(crate::layout::CF_LOG),
                1u64.to_be_bytes(),
                crate::LogEntry::encode_write(entry.table_id, entry.first, &entry.rows),
            );
            batch.put_cf(store.meta(), META_FORMAT, "2");
            store.sync_write(batch).unwrap();
            table
        };
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        let format = store.db.get_cf(store.meta(), META_FORMAT).unwrap().unwrap();
        assert_eq!(format, encoding::FORMAT_VERSION.to_string().as_bytes());
        let logged = store.read_change_log(0, usize::MAX).unwrap();
        assert_eq!(logged.len(), 1);
        assert!(logged[0].1.unresolved.is_empty());
        assert_eq!(logged[0].1.table_id, table.id);
        let Mutation::SetCell { value, .. } = &logged[0].1.rows[0].mutations[0] else {
            panic!("{logged:?}");
        };
        assert_eq!(value.len(), 300);
    }

    #[test]
    fn format_1_aggregate_cells_become_the_legacy_part_and_keep_counting() {
        let dir = tempfile::tempdir().unwrap();
        let family = FamilySchema {
            gc_rule: None,
            aggregate: Some(Aggregator::Sum),
        };
        let (table, origin) = {
            let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
            let table = store
                .create_table(
                    "projects/p/instances/i/tables/t",
                    "projects/p/instances/i",
                    [("s".to_string(), family)].into(),
                    vec![],
                    false,
                )
                .unwrap();
            // What a format-1 server left: a state with operands not merged yet, a state
            // alone, a plain cell; and the format marker.
            let key = |row: &str| encoding::cell_key(table.id, row.as_bytes(), "s", b"n", 0);
            let state =
                |n: i64| encoding::encode_value(v(10), ValueKind::Aggregate, &n.to_be_bytes());
            let mut batch = WriteBatch::default();
            batch.put_cf(store.data(), key("a"), state(40));
            batch.merge_cf(store.data(), key("a"), old_operand(v(11), 2));
            batch.put_cf(store.data(), key("b"), state(7));
            batch.merge_cf(store.data(), key("c"), old_operand(v(12), 5));
            batch.put_cf(store.meta(), META_FORMAT, "1");
            store.sync_write(batch).unwrap();
            (table, store.origin())
        };
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        assert_eq!(store.origin(), origin, "the identity stays");
        let format = store.db.get_cf(store.meta(), META_FORMAT).unwrap().unwrap();
        assert_eq!(format, encoding::FORMAT_VERSION.to_string().as_bytes());
        let read = |row: &str| {
            let cells = store.read_row(&table, row.as_bytes()).unwrap().cells;
            assert_eq!(cells.len(), 1, "{row}");
            i64::from_be_bytes(cells[0].value[..].try_into().unwrap())
        };
        assert_eq!((read("a"), read("b"), read("c")), (42, 7, 5));
        for row in ["a", "b", "c"] {
            let key = encoding::cell_key(table.id, row.as_bytes(), "s", b"n", 0);
            let raw = store.db.get_cf(store.data(), &key).unwrap().unwrap();
            let (_, kind, _) = encoding::decode_value(&raw).unwrap();
            assert_eq!(kind, ValueKind::AggregateParts, "{row}");
            let parts = Parts::of_value(Some(&raw));
            assert_eq!(parts.0.len(), 1);
            assert_eq!(parts.0[0].origin, LEGACY_ORIGIN);
        }
        // New inputs go to this store's own part, beside the legacy one.
        store
            .mutate(
                &table,
                &[RowMutation {
                    row: Bytes::from_static(b"a"),
                    mutations: vec![Mutation::Aggregate {
                        family: "s".into(),
                        qualifier: Bytes::from_static(b"n"),
                        timestamp: 0,
                        aggregator: Aggregator::Sum,
                        input: 8,
                    }],
                }],
            )
            .unwrap();
        assert_eq!(read("a"), 50);
        let key = encoding::cell_key(table.id, b"a", "s", b"n", 0);
        let raw = store.db.get_cf(store.data(), &key).unwrap().unwrap();
        let parts = Parts::of_value(Some(&raw));
        assert_eq!(parts.of(origin).unwrap().state, 8i64.to_be_bytes());
        assert_eq!(parts.of(LEGACY_ORIGIN).unwrap().state, 42i64.to_be_bytes());
    }
}
