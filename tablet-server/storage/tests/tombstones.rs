//! Tombstones and replication on a real RocksDB: compaction collects a tombstone only once it is
//! older than the grace and below the replication safe point, so a write made in another
//! cluster before the delete, and arriving after it, stays hidden; and the log's watermark
//! (what a shipper reports as acknowledged) covers exactly the writes logged below it.

mod common;

use basalt_model::hlc::{Version, now_micros};
use basalt_model::{Mutation, RowMutation, TableSchema};
use basalt_storage::{ReplicatedRow, Store, StoreOptions};
use bytes::Bytes;
use common::{create, family, range, set};

fn open(dir: &std::path::Path, await_safe_point: bool) -> Store {
    Store::open(
        dir,
        StoreOptions {
            // Every tombstone is past the grace: the safe point alone decides.
            tombstone_grace_micros: 0,
            await_tombstone_safe_point: await_safe_point,
            ..StoreOptions::default()
        },
    )
    .expect("open store")
}

fn row(first: Version, mutation: Mutation) -> ReplicatedRow {
    ReplicatedRow {
        first,
        row: RowMutation {
            row: Bytes::from_static(b"r"),
            mutations: vec![mutation],
        },
    }
}

/// The values of row `r` as a read returns them (the cell `before` was deleted).
fn values(store: &Store, table: &TableSchema) -> Vec<String> {
    store
        .read_row(table, b"r")
        .unwrap()
        .cells
        .into_iter()
        .map(|c| String::from_utf8_lossy(&c.value).into_owned())
        .collect()
}

/// The versions of the row tombstones of the table as stored (what a seed would carry).
fn tombstones(store: &Store, table: &TableSchema) -> Vec<Version> {
    store
        .seed_chunk(table, &range("", None), usize::MAX)
        .unwrap()
        .rows
        .into_iter()
        .filter(|r| matches!(r.row.mutations[..], [Mutation::DeleteFromRow]))
        .map(|r| r.first)
        .collect()
}

fn compact(store: &Store) {
    store.flush().unwrap();
    store.compact_all();
}

fn late_cell(at: Version) -> ReplicatedRow {
    row(
        at,
        Mutation::SetCell {
            family: "cf".into(),
            qualifier: Bytes::from_static(b"late"),
            timestamp: 2000,
            value: Bytes::from_static(b"late"),
        },
    )
}

#[test]
fn a_tombstone_stays_until_every_peer_acknowledged_past_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), true);
    let table = create(&store, [family("cf", None)], &[]);
    // A cluster server's store keeps every tombstone until the safe point is known.
    assert_eq!(store.tombstone_safe_point(), Some(0));

    // Cluster 2 deleted row r at `deleted`; cluster 1 wrote a cell of r just before, and that
    // write has not arrived yet (a partition).
    let deleted = (now_micros() - 10_000_000) as u64;
    store
        .apply_replicated(
            &table,
            &[ReplicatedRow {
                first: Version {
                    hlc: deleted - 100,
                    cluster: 1,
                },
                row: set("r", "before"),
            }],
        )
        .unwrap();
    store
        .apply_replicated(
            &table,
            &[row(
                Version {
                    hlc: deleted,
                    cluster: 2,
                },
                Mutation::DeleteFromRow,
            )],
        )
        .unwrap();
    compact(&store);
    assert_eq!(
        tombstones(&store, &table).len(),
        1,
        "held before any safe point"
    );

    // Cluster 1 acknowledged only up to before its write: the tombstone stays, and the write,
    // when it arrives, is hidden as in every other cluster.
    store.set_tombstone_safe_point(Some(deleted - 5));
    compact(&store);
    assert_eq!(
        tombstones(&store, &table),
        vec![Version {
            hlc: deleted,
            cluster: 2
        }]
    );
    store
        .apply_replicated(
            &table,
            &[late_cell(Version {
                hlc: deleted - 1,
                cluster: 1,
            })],
        )
        .unwrap();
    assert!(values(&store, &table).is_empty());

    // At the safe point itself: still kept (a write at the same clock value of a lower
    // cluster is older and may still arrive).
    store.set_tombstone_safe_point(Some(deleted));
    compact(&store);
    assert_eq!(tombstones(&store, &table).len(), 1);

    // Every peer acknowledged past it: collected.
    store.set_tombstone_safe_point(Some(deleted + 1));
    compact(&store);
    assert!(tombstones(&store, &table).is_empty());
    // (Which is why it must wait: a write older than the delete arriving now would show.)
    store
        .apply_replicated(
            &table,
            &[late_cell(Version {
                hlc: deleted - 2,
                cluster: 1,
            })],
        )
        .unwrap();
    assert_eq!(values(&store, &table), vec!["late".to_string()]);
}

#[test]
fn without_replication_the_grace_alone_decides() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), false);
    let table = create(&store, [family("cf", None)], &[]);
    assert_eq!(store.tombstone_safe_point(), None);
    store.mutate(&table, &[set("r", "x")]).unwrap();
    store
        .mutate(
            &table,
            &[RowMutation {
                row: Bytes::from_static(b"r"),
                mutations: vec![Mutation::DeleteFromRow],
            }],
        )
        .unwrap();
    assert_eq!(tombstones(&store, &table).len(), 1);
    compact(&store);
    assert!(tombstones(&store, &table).is_empty());
}

#[test]
fn the_log_watermark_covers_every_write_below_it_and_none_after() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), true);
    let table = create(&store, [family("cf", None)], &[]);
    store.set_change_log(true);
    for i in 0..20 {
        store.mutate(&table, &[set(&format!("r{i}"), "v")]).unwrap();
    }
    let mark = store.log_watermark();
    let log = store.read_change_log(0, usize::MAX).unwrap();
    assert_eq!(log.last().unwrap().0, mark.seq);
    assert!(log.iter().all(|(_, e)| e.first.hlc < mark.hlc + 1));
    // Every write made afterwards takes a greater version and a later sequence.
    store.mutate(&table, &[set("after", "v")]).unwrap();
    let log = store.read_change_log(mark.seq, usize::MAX).unwrap();
    assert_eq!(log.len(), 1);
    assert!(log[0].1.first.hlc > mark.hlc);
}
