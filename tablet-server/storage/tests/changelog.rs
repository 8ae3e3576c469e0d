//! The change log on a real RocksDB: every write of the data path made while the log is on is
//! logged once, in commit order, with the versions it took, in the same write as its data; the
//! log survives a reopen and continues its sequence; truncation never passes a consumer's
//! cursor.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use basalt_model::{Mutation, RowMutation};
use basalt_storage::changelog::DEFAULT_RETENTION;
use basalt_storage::{LogEntry, Store};
use bytes::Bytes;
use common::{create, family, open, set};
use proptest::prelude::*;

fn log(store: &Store) -> Vec<(u64, LogEntry)> {
    store.read_change_log(0, usize::MAX).unwrap()
}

#[test]
fn every_write_while_the_log_is_on_is_logged_once_in_order_with_its_versions() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let table = create(&store, [family("cf", None)], &[]);

    store.mutate(&table, &[set("before", "x")]).unwrap();
    assert!(
        log(&store).is_empty(),
        "nothing is logged while the log is off"
    );

    store.set_change_log(true);
    let writes = vec![
        vec![set("a", "1")],
        vec![set("b", "2"), set("c", "3")],
        vec![RowMutation {
            row: Bytes::from_static(b"a"),
            mutations: vec![
                Mutation::DeleteFromColumn {
                    family: "cf".into(),
                    qualifier: Bytes::from_static(b"q"),
                    start: 0,
                    end: 2000,
                },
                Mutation::DeleteFromRow,
            ],
        }],
    ];
    for rows in &writes {
        store.mutate(&table, rows).unwrap();
    }
    // A refused write (no such family) logs nothing.
    let bad = RowMutation {
        row: Bytes::from_static(b"z"),
        mutations: vec![Mutation::DeleteFromFamily {
            family: "nope".into(),
        }],
    };
    assert!(store.mutate(&table, &[bad]).is_err());

    let logged = log(&store);
    assert_eq!(
        logged.iter().map(|(seq, _)| *seq).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    for ((_, entry), rows) in logged.iter().zip(&writes) {
        assert_eq!(entry.table_id, table.id);
        assert_eq!(&entry.rows, rows);
    }
    // Versions: consecutive within a write, increasing from write to write, all acknowledged.
    let versions: Vec<u64> = logged
        .iter()
        .flat_map(|(_, e)| e.versions().map(|(_, _, v)| v.hlc).collect::<Vec<_>>())
        .collect();
    assert_eq!(versions.len(), 5);
    assert!(versions.windows(2).all(|w| w[0] < w[1]), "{versions:?}");
    assert!(versions.iter().all(|v| *v <= store.durable_through()));
    assert_eq!(store.change_log_bounds().unwrap(), Some((1, 3)));
    // Reading after a sequence, and by size: at least one entry each time.
    assert_eq!(
        store
            .read_change_log(1, 1)
            .unwrap()
            .iter()
            .map(|(s, _)| *s)
            .collect::<Vec<_>>(),
        vec![2]
    );

    store.set_change_log(false);
    store.mutate(&table, &[set("after", "y")]).unwrap();
    assert_eq!(log(&store).len(), 3);
}

#[test]
fn the_log_survives_a_reopen_and_continues_its_sequence() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path());
        let table = create(&store, [family("cf", None)], &[]);
        store.set_change_log(true);
        store.mutate(&table, &[set("a", "1")]).unwrap();
        store.mutate(&table, &[set("b", "2")]).unwrap();
    }
    let store = open(dir.path());
    assert!(
        !store.change_log_on(),
        "the log is off after an open until turned on"
    );
    let logged = log(&store);
    assert_eq!(
        logged
            .iter()
            .map(|(s, e)| (*s, e.rows[0].row.clone()))
            .collect::<Vec<_>>(),
        vec![(1, Bytes::from_static(b"a")), (2, Bytes::from_static(b"b"))]
    );
    let table = store.table(common::TABLE).unwrap();
    store.set_change_log(true);
    store.mutate(&table, &[set("c", "3")]).unwrap();
    let last = log(&store).pop().unwrap();
    assert_eq!(last.0, 3);
    // A write after the reopen has a higher version than every write before it.
    assert!(last.1.first.hlc > logged[1].1.first.hlc);
}

#[test]
fn concurrent_writers_are_each_logged_once_with_contiguous_sequences() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(open(dir.path()));
    let table = create(&store, [family("cf", None)], &[]);
    store.set_change_log(true);
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (store, table) = (store.clone(), table.clone());
            std::thread::spawn(move || {
                for i in 0..50 {
                    store
                        .mutate(&table, &[set(&format!("t{t}-{i:02}"), "v")])
                        .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let logged = log(&store);
    assert_eq!(
        logged.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        (1..=200).collect::<Vec<_>>()
    );
    let rows: BTreeSet<Bytes> = logged.iter().map(|(_, e)| e.rows[0].row.clone()).collect();
    assert_eq!(rows.len(), 200, "every write logged once");
    // Log order is commit order: a writer's own writes appear in the order it made them.
    for t in 0..4 {
        let mine: Vec<Bytes> = logged
            .iter()
            .map(|(_, e)| e.rows[0].row.clone())
            .filter(|r| r.starts_with(format!("t{t}-").as_bytes()))
            .collect();
        let mut sorted = mine.clone();
        sorted.sort();
        assert_eq!(mine, sorted);
    }
}

#[derive(Clone, Debug)]
enum Op {
    Write,
    Cursor(usize, u64),
    Remove(usize),
    Truncate,
}

fn any_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => Just(Op::Write),
        2 => (0..3usize, 0..30u64).prop_map(|(c, s)| Op::Cursor(c, s)),
        1 => (0..3usize).prop_map(Op::Remove),
        2 => Just(Op::Truncate),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Whatever the writes, cursor moves and truncations: a cursor never moves back, and no
    /// entry above the lowest cursor is ever gone; a truncation removes exactly those at or
    /// below it (all, with no cursor).
    #[test]
    fn truncation_never_passes_a_cursor(ops in proptest::collection::vec(any_op(), 1..40)) {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let table = create(&store, [family("cf", None)], &[]);
        store.set_change_log(true);
        let mut written = 0u64;
        let mut cursors: BTreeMap<String, u64> = BTreeMap::new();
        let mut kept_from = 1u64;
        for (i, op) in ops.into_iter().enumerate() {
            match op {
                Op::Write => {
                    store.mutate(&table, &[set(&format!("r{i}"), "v")]).unwrap();
                    written += 1;
                }
                Op::Cursor(c, seq) => {
                    let name = format!("peer-{c}");
                    let now = store.set_log_cursor(&name, seq).unwrap();
                    let before = cursors.get(&name).copied();
                    prop_assert_eq!(now, before.map_or(seq, |b| b.max(seq)));
                    cursors.insert(name, now);
                }
                Op::Remove(c) => {
                    store.remove_log_cursor(&format!("peer-{c}")).unwrap();
                    cursors.remove(&format!("peer-{c}"));
                }
                Op::Truncate => {
                    let through = store.truncate_change_log(DEFAULT_RETENTION).unwrap().through;
                    let limit = cursors.values().min().copied().unwrap_or(written).min(written);
                    if written >= kept_from && limit >= kept_from {
                        prop_assert_eq!(through, limit);
                        kept_from = limit + 1;
                    } else {
                        prop_assert_eq!(through, 0);
                    }
                }
            }
            let now: BTreeMap<String, u64> = store
                .log_cursors()
                .unwrap()
                .into_iter()
                .map(|(name, c)| (name, c.seq))
                .collect();
            prop_assert_eq!(now, cursors.clone());
            let seqs: Vec<u64> = log(&store).into_iter().map(|(s, _)| s).collect();
            prop_assert_eq!(seqs, (kept_from..=written).collect::<Vec<_>>());
        }
    }
}

#[test]
fn a_consumer_not_heard_from_within_the_retention_holds_nothing_back_and_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let table = create(&store, [family("cf", None)], &[]);
    store.set_change_log(true);
    for i in 0..5 {
        store.mutate(&table, &[set(&format!("r{i}"), "v")]).unwrap();
    }
    store.set_log_cursor("slow", 1).unwrap();
    store.set_log_cursor("fast", 4).unwrap();
    // Both heard from just now: the slow one holds the log at 1.
    let t = store.truncate_change_log(DEFAULT_RETENTION).unwrap();
    assert_eq!((t.through, t.stale.is_empty()), (1, true));
    // Repeating its cursor keeps a consumer fresh; going back never moves it.
    assert_eq!(store.set_log_cursor("slow", 0).unwrap(), 1);
    std::thread::sleep(std::time::Duration::from_millis(50));
    store.set_log_cursor("fast", 4).unwrap();
    // With a retention shorter than the slow one's silence, only the fast one counts.
    let t = store
        .truncate_change_log(std::time::Duration::from_millis(20))
        .unwrap();
    assert_eq!(t.through, 4);
    assert_eq!(t.stale, vec!["slow".to_string()]);
    assert_eq!(
        log(&store).iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        vec![5]
    );
    assert!(store.change_log_bytes().unwrap() > 0);
}

#[test]
fn a_log_truncated_to_nothing_goes_on_above_it_after_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path());
        let table = create(&store, [family("cf", None)], &[]);
        store.set_change_log(true);
        for i in 0..3 {
            store.mutate(&table, &[set(&format!("r{i}"), "v")]).unwrap();
        }
        store.set_log_cursor("peer", 3).unwrap();
        assert_eq!(
            store
                .truncate_change_log(DEFAULT_RETENTION)
                .unwrap()
                .through,
            3
        );
        assert!(log(&store).is_empty());
        assert_eq!(store.change_log_last_seq(), 3);
    }
    let store = open(dir.path());
    let table = store
        .all_tables()
        .into_iter()
        .next()
        .expect("the table survives");
    assert_eq!(store.change_log_last_seq(), 3);
    store.set_change_log(true);
    store.mutate(&table, &[set("after", "v")]).unwrap();
    // Never sequence 1 again: the peer's cursor (3) would hide the new entry.
    assert_eq!(
        log(&store).iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        vec![4]
    );
}

/// The SetCells of `entry` as (row, value), without those left unresolved.
fn shipped_values(entry: &LogEntry) -> Vec<(String, String)> {
    entry
        .rows_with_versions()
        .flat_map(|(_, row)| {
            let name = String::from_utf8(row.row.to_vec()).unwrap();
            row.mutations
                .iter()
                .filter_map(|m| match m {
                    Mutation::SetCell { value, .. } => {
                        Some((name.clone(), String::from_utf8(value.to_vec()).unwrap()))
                    }
                    _ => None,
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn long_values_are_read_back_from_the_data_unless_a_later_write_decided_their_cell() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let table = create(&store, [family("cf", None)], &[]);
    store.set_change_log(true);
    let long = |tag: &str| format!("{tag}-{}", "v".repeat(200));

    store
        .mutate(
            &table,
            &[
                set("a", &long("a1")),
                set("b", &long("b1")),
                set("c", "short"),
            ],
        )
        .unwrap();
    // The same cell (timestamp 1000) of row a written again, row b's deleted.
    store.mutate(&table, &[set("a", &long("a2"))]).unwrap();
    let delete_b = RowMutation {
        row: Bytes::from_static(b"b"),
        mutations: vec![Mutation::DeleteFromRow],
    };
    store.mutate(&table, &[delete_b]).unwrap();

    let logged = log(&store);
    assert_eq!(
        shipped_values(&logged[0].1),
        vec![("c".to_string(), "short".to_string())],
        "a's first value was overwritten, b's deleted: later entries decide those cells"
    );
    assert_eq!(logged[0].1.unresolved, vec![(0, 0), (1, 0)]);
    assert_eq!(
        shipped_values(&logged[1].1),
        vec![("a".to_string(), long("a2"))]
    );
    assert!(logged[1].1.unresolved.is_empty());

    // Rows d and e written, then given up (their tablet moved away): the log still has their
    // values for the shippers, though the data is gone here.
    store
        .mutate(&table, &[set("d", &long("d1")), set("e", &long("e1"))])
        .unwrap();
    let after = logged.last().unwrap().0;
    store
        .release(&table, &common::range("d", Some("e")))
        .unwrap();
    assert!(
        store.read_row(&table, b"d").is_err(),
        "row d is not served here any more"
    );
    let logged = store.read_change_log(after, usize::MAX).unwrap();
    assert_eq!(
        shipped_values(&logged[0].1),
        vec![("d".to_string(), long("d1")), ("e".to_string(), long("e1"))]
    );
    // And after a reopen (the copy is durable).
    drop(logged);
    drop(store);
    let store = open(dir.path());
    let table = store.table(common::TABLE).unwrap();
    assert!(
        store.read_row(&table, b"d").unwrap().cells.is_empty(),
        "row d's data is deleted"
    );
    let logged = store.read_change_log(after, usize::MAX).unwrap();
    assert_eq!(shipped_values(&logged[0].1).len(), 2);
}
