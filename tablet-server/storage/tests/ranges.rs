//! The range operations tablet moves are built from, and the filtered scan, on real RocksDB
//! stores: export a tablet's range as SST files, ingest them into another store, delete the
//! range at the source; sizes of ranges; a filter pushed down into a scan.

mod common;

use basalt_model::{Cell, CellFilter, Mutation, Row, RowMutation, RowRange, RowSet, TableSchema};
use basalt_storage::{Store, TabletStore};
use bytes::Bytes;
use common::{TABLE, family, open, range};

fn table(store: &Store) -> std::sync::Arc<TableSchema> {
    common::create(store, [family("cf", None)], &["m"])
}

fn put(store: &Store, t: &TableSchema, row: &str, value: &str) {
    store.mutate(t, &[common::set(row, value)]).unwrap();
}

fn delete_row(store: &Store, t: &TableSchema, row: &str) {
    store
        .mutate(
            t,
            &[RowMutation {
                row: Bytes::copy_from_slice(row.as_bytes()),
                mutations: vec![Mutation::DeleteFromRow],
            }],
        )
        .unwrap();
}

/// (row, value) of every row of `range`.
fn contents(store: &Store, t: &TableSchema, range: RowRange) -> Vec<(String, String)> {
    store
        .rows(t, &RowSet::from_ranges([range]), false)
        .map(|r| {
            let r = r.unwrap();
            (
                String::from_utf8(r.key.to_vec()).unwrap(),
                String::from_utf8(r.cells[0].value.to_vec()).unwrap(),
            )
        })
        .collect()
}

#[test]
fn a_tablet_range_exported_and_ingested_elsewhere_is_an_exact_copy() {
    let (a_dir, b_dir, files_dir) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let a = open(a_dir.path());
    let ta = table(&a);
    for i in 0..500 {
        put(&a, &ta, &format!("k{i:03}"), &format!("v{i}"));
    }
    // A deleted row inside the range stays deleted at the destination.
    delete_row(&a, &ta, "k300");
    let tablet = range("k250", Some("k400"));
    let expected = contents(&a, &ta, tablet.clone());
    assert_eq!(expected.len(), 149);
    assert!(!expected.iter().any(|(k, _)| k == "k300"));

    let files = a.export_range(&ta, &tablet, files_dir.path()).unwrap();
    assert!(!files.is_empty());
    assert!(files.iter().all(|f| f.bytes > 0 && f.path.exists()));
    // 149 live rows and the row tombstone of k300.
    assert_eq!(files.iter().map(|f| f.entries).sum::<u64>(), 150);

    let b = open(b_dir.path());
    let tb = table(&b);
    assert_eq!(
        tb.id, ta.id,
        "a fresh store gives the first table the same id"
    );
    put(&b, &tb, "k001", "outside the range: kept");
    b.ingest(&files).unwrap();
    assert_eq!(contents(&b, &tb, tablet.clone()), expected);
    assert_eq!(
        contents(&b, &tb, range("k000", Some("k100"))),
        vec![("k001".to_string(), "outside the range: kept".to_string())]
    );
    // The copy survives a restart of the destination.
    drop(b);
    let b = open(b_dir.path());
    let tb = b.table(TABLE).unwrap();
    assert_eq!(contents(&b, &tb, tablet.clone()), expected);

    // The source deletes the range; its neighbours are untouched.
    a.delete_range(&ta, &tablet).unwrap();
    assert!(contents(&a, &ta, tablet.clone()).is_empty());
    assert_eq!(contents(&a, &ta, range("k000", Some("k250"))).len(), 250);
    assert_eq!(contents(&a, &ta, range("k400", None)).len(), 100);
    // An empty range exports nothing.
    assert!(
        a.export_range(&ta, &range("x", Some("a")), files_dir.path())
            .unwrap()
            .is_empty()
    );
}

#[test]
fn approximate_sizes_follow_the_data_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let t = table(&store);
    let value = "x".repeat(4000);
    for i in 0..2000 {
        put(&store, &t, &format!("a{i:04}"), &value);
    }
    store.flush().unwrap();
    let [left, right]: [RowRange; 2] = t.tablet_ranges().try_into().unwrap();
    let left_size = store.approximate_size(&t, &left);
    // The values are ~8 MB before compression; LZ4 shrinks repeated bytes a lot, but not to 0.
    assert!(left_size > 0, "left tablet: {left_size}");
    assert_eq!(
        store.approximate_size(&t, &right),
        0,
        "nothing at or after m"
    );
    assert_eq!(store.approximate_size(&t, &range("z", Some("a"))), 0);
}

/// Keeps the cells whose value starts with "keep".
struct KeepPrefix;

impl CellFilter for KeepPrefix {
    fn apply(&self, row: &Row) -> Result<Vec<Cell>, basalt_model::Error> {
        if row.key.as_ref() == b"bad" {
            return Err(basalt_model::Error::InvalidArgument("refused".into()));
        }
        Ok(row
            .cells
            .iter()
            .filter(|c| c.value.starts_with(b"keep"))
            .cloned()
            .collect())
    }
}

#[test]
fn a_filter_pushed_into_a_scan_sees_every_row_and_reports_what_it_saw() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let t = table(&store);
    put(&store, &t, "a", "keep 1");
    put(&store, &t, "b", "drop");
    put(&store, &t, "c", "keep 2");
    for reversed in [false, true] {
        let scanned: Vec<(String, usize, usize)> =
            TabletStore::scan(&store, &t, &RowSet::all(), reversed, &KeepPrefix)
                .map(|r| {
                    let r = r.unwrap();
                    (
                        String::from_utf8(r.key.to_vec()).unwrap(),
                        r.cells.len(),
                        r.cells_seen,
                    )
                })
                .collect();
        let mut expected = vec![
            ("a".to_string(), 1, 1),
            ("b".to_string(), 0, 1),
            ("c".to_string(), 1, 1),
        ];
        if reversed {
            expected.reverse();
        }
        assert_eq!(scanned, expected);
    }
    // A filter error ends the scan with that error.
    put(&store, &t, "bad", "keep");
    let results: Vec<_> = store.scan(&t, &RowSet::all(), false, &KeepPrefix).collect();
    assert_eq!(results.len(), 3, "a, b, then the error at bad");
    assert!(matches!(
        results[2],
        Err(basalt_storage::Error::Request(
            basalt_model::Error::InvalidArgument(_)
        ))
    ));
}
