//! Writes replicated from other clusters (`Store::apply_replicated`): last writer wins by
//! version, whatever the order and however often the writes arrive.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use basalt_model::aggregate::Aggregator;
use basalt_model::gc::GcRule;
use basalt_model::hlc::Version;
use basalt_model::{FamilyChange, FamilySchema, Mutation, RowMutation, TableSchema};
use basalt_storage::merge_operator::Parts;
use basalt_storage::{LogEntry, ReplicatedRow, Store};
use bytes::Bytes;
use common::{TABLE, create, family, open};
use proptest::prelude::*;

fn v(hlc: u64, cluster: u16) -> Version {
    Version { hlc, cluster }
}

fn rr(first: Version, row: &str, mutations: Vec<Mutation>) -> ReplicatedRow {
    ReplicatedRow {
        first,
        row: RowMutation {
            row: Bytes::copy_from_slice(row.as_bytes()),
            mutations,
        },
    }
}

fn set(family: &str, q: &str, ts: i64, value: &str) -> Mutation {
    Mutation::SetCell {
        family: family.into(),
        qualifier: Bytes::copy_from_slice(q.as_bytes()),
        timestamp: ts,
        value: Bytes::copy_from_slice(value.as_bytes()),
    }
}

fn del_column(family: &str, q: &str, start: i64, end: i64) -> Mutation {
    Mutation::DeleteFromColumn {
        family: family.into(),
        qualifier: Bytes::copy_from_slice(q.as_bytes()),
        start,
        end,
    }
}

fn del_family(family: &str) -> Mutation {
    Mutation::DeleteFromFamily {
        family: family.into(),
    }
}

/// The row's visible cells as (family, qualifier, timestamp, value), in read order.
type Cells = Vec<(String, String, i64, String)>;

fn cells(store: &Store, table: &TableSchema, row: &str) -> Cells {
    store
        .read_row(table, row.as_bytes())
        .unwrap()
        .cells
        .into_iter()
        .map(|c| {
            (
                c.family,
                String::from_utf8_lossy(&c.qualifier).into_owned(),
                c.timestamp_micros,
                String::from_utf8_lossy(&c.value).into_owned(),
            )
        })
        .collect()
}

fn cell(family: &str, q: &str, ts: i64, value: &str) -> (String, String, i64, String) {
    (family.into(), q.into(), ts, value.into())
}

fn plain_store() -> (tempfile::TempDir, Store, Arc<TableSchema>) {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let table = create(&store, [family("a", None), family("b", None)], &[]);
    (dir, store, table)
}

#[test]
fn a_newer_set_cell_wins_an_older_one_is_ignored_an_equal_one_is_a_no_op() {
    let (_dir, store, t) = plain_store();
    let apply = |first, value| {
        store
            .apply_replicated(&t, &[rr(first, "r", vec![set("a", "q", 5, value)])])
            .unwrap()
    };
    apply(v(100, 1), "first");
    assert_eq!(cells(&store, &t, "r"), vec![cell("a", "q", 5, "first")]);
    // Older, from another cluster: ignored.
    apply(v(90, 2), "older");
    assert_eq!(cells(&store, &t, "r"), vec![cell("a", "q", 5, "first")]);
    // The same version again is the same write delivered again, whatever it says.
    apply(v(100, 1), "redelivered");
    assert_eq!(cells(&store, &t, "r"), vec![cell("a", "q", 5, "first")]);
    // Equal clock values: the cluster breaks the tie.
    apply(v(100, 2), "tie");
    assert_eq!(cells(&store, &t, "r"), vec![cell("a", "q", 5, "tie")]);
    apply(v(100, 1), "tie lost");
    assert_eq!(cells(&store, &t, "r"), vec![cell("a", "q", 5, "tie")]);
    apply(v(101, 1), "newer");
    assert_eq!(cells(&store, &t, "r"), vec![cell("a", "q", 5, "newer")]);
}

#[test]
fn a_replicated_delete_from_row_keeps_newer_cells() {
    let (_dir, store, t) = plain_store();
    store
        .apply_replicated(
            &t,
            &[
                rr(v(100, 1), "r", vec![set("a", "q", 1, "old")]),
                rr(v(300, 2), "r", vec![set("a", "q", 2, "newer")]),
                rr(v(100, 3), "r", vec![set("b", "q", 1, "old b")]),
            ],
        )
        .unwrap();
    // A local write: its version is the clock's (now), above every version seen so far.
    store
        .mutate(
            &t,
            &[RowMutation {
                row: Bytes::from_static(b"r"),
                mutations: vec![set("b", "local", 7, "local")],
            }],
        )
        .unwrap();
    let local = store.clock_now();
    store
        .apply_replicated(&t, &[rr(v(200, 3), "r", vec![Mutation::DeleteFromRow])])
        .unwrap();
    assert_eq!(
        cells(&store, &t, "r"),
        vec![cell("a", "q", 2, "newer"), cell("b", "local", 7, "local")]
    );
    // A cell older than the delete arriving after it stays deleted; a newer one is written.
    store
        .apply_replicated(
            &t,
            &[
                rr(v(150, 1), "r", vec![set("a", "late", 1, "late")]),
                rr(v(250, 1), "r", vec![set("a", "later", 1, "later")]),
            ],
        )
        .unwrap();
    assert_eq!(
        cells(&store, &t, "r"),
        vec![
            cell("a", "later", 1, "later"),
            cell("a", "q", 2, "newer"),
            cell("b", "local", 7, "local"),
        ]
    );
    // A delete newer than everything takes it all; redelivering it changes nothing.
    for _ in 0..2 {
        store
            .apply_replicated(
                &t,
                &[rr(v(local + 10, 2), "r", vec![Mutation::DeleteFromRow])],
            )
            .unwrap();
        assert_eq!(cells(&store, &t, "r"), vec![]);
    }
    // An older row delete arriving last does not bring anything back or take anything newer.
    store
        .apply_replicated(
            &t,
            &[rr(v(local + 20, 1), "r", vec![set("a", "q", 3, "x")])],
        )
        .unwrap();
    store
        .apply_replicated(
            &t,
            &[rr(v(local + 5, 1), "r", vec![Mutation::DeleteFromRow])],
        )
        .unwrap();
    assert_eq!(cells(&store, &t, "r"), vec![cell("a", "q", 3, "x")]);
}

#[test]
fn column_range_deletes_order_by_version() {
    let (_dir, store, t) = plain_store();
    let sets: Vec<Mutation> = (1..=3)
        .map(|ts| set("a", "q", ts, &format!("v{ts}")))
        .chain([set("a", "other", 2, "other")])
        .collect();
    store
        .apply_replicated(&t, &[rr(v(100, 1), "r", sets)])
        .unwrap();
    // Deletes timestamps [2, 3) of a:q at 200: only ts 2 goes.
    store
        .apply_replicated(&t, &[rr(v(200, 2), "r", vec![del_column("a", "q", 2, 3)])])
        .unwrap();
    assert_eq!(
        cells(&store, &t, "r"),
        vec![
            cell("a", "other", 2, "other"),
            cell("a", "q", 3, "v3"),
            cell("a", "q", 1, "v1"),
        ]
    );
    store
        .apply_replicated(
            &t,
            &[
                // Covered and older than the delete: not written.
                rr(v(150, 1), "r", vec![set("a", "q", 2, "late")]),
                // Not covered (timestamp 3 is outside [2, 3)): written, it is newer than v3.
                rr(v(160, 1), "r", vec![set("a", "q", 3, "v3 again")]),
            ],
        )
        .unwrap();
    assert_eq!(
        cells(&store, &t, "r"),
        vec![
            cell("a", "other", 2, "other"),
            cell("a", "q", 3, "v3 again"),
            cell("a", "q", 1, "v1"),
        ]
    );
    // Newer than the delete: written.
    store
        .apply_replicated(&t, &[rr(v(250, 3), "r", vec![set("a", "q", 2, "new")])])
        .unwrap();
    // An older range delete arriving last keeps the newer cells of its range.
    store
        .apply_replicated(&t, &[rr(v(120, 3), "r", vec![del_column("a", "q", 0, 10)])])
        .unwrap();
    assert_eq!(
        cells(&store, &t, "r"),
        vec![
            cell("a", "other", 2, "other"),
            cell("a", "q", 3, "v3 again"),
            cell("a", "q", 2, "new"),
        ]
    );
}

#[test]
fn family_deletes_order_by_version() {
    let (_dir, store, t) = plain_store();
    store
        .apply_replicated(
            &t,
            &[rr(
                v(100, 1),
                "r",
                vec![
                    set("a", "x", 1, "a1"),
                    set("a", "y", 1, "a2"),
                    set("b", "x", 1, "b"),
                ],
            )],
        )
        .unwrap();
    store
        .apply_replicated(&t, &[rr(v(300, 1), "r", vec![set("a", "z", 1, "newer")])])
        .unwrap();
    store
        .apply_replicated(&t, &[rr(v(200, 2), "r", vec![del_family("a")])])
        .unwrap();
    assert_eq!(
        cells(&store, &t, "r"),
        vec![cell("a", "z", 1, "newer"), cell("b", "x", 1, "b")]
    );
    store
        .apply_replicated(&t, &[rr(v(199, 3), "r", vec![set("a", "x", 1, "late")])])
        .unwrap();
    assert_eq!(
        cells(&store, &t, "r"),
        vec![cell("a", "z", 1, "newer"), cell("b", "x", 1, "b")]
    );
}

#[test]
fn mutations_of_one_row_see_each_other_in_order() {
    let (_dir, store, t) = plain_store();
    // As in one MutateRow: set, delete the row, set again (consecutive versions).
    store
        .apply_replicated(
            &t,
            &[rr(
                v(100, 1),
                "r",
                vec![
                    set("a", "q", 1, "gone"),
                    Mutation::DeleteFromRow,
                    set("a", "q", 2, "kept"),
                ],
            )],
        )
        .unwrap();
    assert_eq!(cells(&store, &t, "r"), vec![cell("a", "q", 2, "kept")]);
}

#[test]
fn local_writes_after_a_replicated_write_get_greater_versions() {
    let (_dir, store, t) = plain_store();
    let future = store.clock_now() + 60_000_000;
    store
        .apply_replicated(
            &t,
            &[rr(v(future, 2), "r", vec![set("a", "q", 1, "remote")])],
        )
        .unwrap();
    assert!(store.clock_now() >= future);
    store
        .mutate(
            &t,
            &[RowMutation {
                row: Bytes::from_static(b"r"),
                mutations: vec![set("a", "q", 1, "local")],
            }],
        )
        .unwrap();
    assert_eq!(cells(&store, &t, "r"), vec![cell("a", "q", 1, "local")]);
    // The remote write delivered again is older than the local one.
    store
        .apply_replicated(
            &t,
            &[rr(v(future, 2), "r", vec![set("a", "q", 1, "remote")])],
        )
        .unwrap();
    assert_eq!(cells(&store, &t, "r"), vec![cell("a", "q", 1, "local")]);
}

#[test]
fn dropped_and_unknown_families() {
    let (_dir, store, t) = plain_store();
    store
        .modify_column_families(TABLE, &[FamilyChange::Drop { id: "b".into() }])
        .unwrap();
    let dropped_at = store.table(TABLE).unwrap().dropped_families["b"];
    // Made before the drop: dead, skipped (the rest of the write applies).
    store
        .apply_replicated(
            &t,
            &[rr(
                v(dropped_at - 1, 2),
                "r",
                vec![set("b", "q", 1, "dead"), set("a", "q", 1, "ok")],
            )],
        )
        .unwrap();
    assert_eq!(cells(&store, &t, "r"), vec![cell("a", "q", 1, "ok")]);
    // Made after the drop, or in a family never seen: refused (the schema may not be here yet).
    for f in ["b", "nope"] {
        assert!(
            store
                .apply_replicated(
                    &t,
                    &[rr(v(dropped_at + 1, 2), "r", vec![set(f, "q", 1, "x")])]
                )
                .is_err()
        );
    }
    assert_eq!(cells(&store, &t, "r"), vec![cell("a", "q", 1, "ok")]);
}

fn add(family: &str, input: i64) -> Mutation {
    Mutation::Aggregate {
        family: family.into(),
        qualifier: Bytes::from_static(b"q"),
        timestamp: 0,
        aggregator: match family {
            "m" => Aggregator::Max,
            "h" => Aggregator::Hll,
            _ => Aggregator::Sum,
        },
        input: if family == "h" {
            basalt_model::hll::hash(&input.to_be_bytes()) as i64
        } else {
            input
        },
    }
}

fn row_of(row: &str, mutations: Vec<Mutation>) -> RowMutation {
    RowMutation {
        row: Bytes::copy_from_slice(row.as_bytes()),
        mutations,
    }
}

/// A store of a cluster numbered `cluster`, logging, with table t: families s (Sum), m (Max)
/// and h (HyperLogLog++).
fn aggregate_store(cluster: u16) -> (tempfile::TempDir, Store, Arc<TableSchema>) {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store.set_cluster_number(cluster);
    store.set_change_log(true);
    let table = create(
        &store,
        [
            family("s", Some(Aggregator::Sum)),
            family("m", Some(Aggregator::Max)),
            family("h", Some(Aggregator::Hll)),
        ],
        &[],
    );
    (dir, store, table)
}

/// The log entries of `store` after sequence `after`, as replicated rows, with the last
/// sequence.
fn logged_after(store: &Store, after: u64) -> (Vec<ReplicatedRow>, u64) {
    let entries = store.read_change_log(after, usize::MAX).unwrap();
    let last = entries.last().map_or(after, |(seq, _)| *seq);
    let rows = entries
        .iter()
        .flat_map(|(_, e)| e.replicated_rows())
        .collect();
    (rows, last)
}

/// The Int64 each aggregate cell of `row` reads as, by family.
fn sums(store: &Store, table: &TableSchema, row: &str) -> BTreeMap<String, i64> {
    store
        .read_row(table, row.as_bytes())
        .unwrap()
        .cells
        .into_iter()
        .map(|c| {
            (
                c.family,
                i64::from_be_bytes(c.value[..].try_into().unwrap()),
            )
        })
        .collect()
}

#[test]
fn an_aggregate_arrives_as_its_origins_part_and_a_redelivery_counts_once() {
    let (_a_dir, a, ta) = aggregate_store(1);
    let (_b_dir, b, tb) = aggregate_store(2);
    a.mutate(
        &ta,
        &[row_of("r", vec![add("s", 2), add("m", 5), add("h", 1)])],
    )
    .unwrap();
    a.mutate(&ta, &[row_of("r", vec![add("s", 3), add("h", 2)])])
        .unwrap();
    b.mutate(&tb, &[row_of("r", vec![add("s", 10), add("m", 1)])])
        .unwrap();
    let (from_a, _) = logged_after(&a, 0);
    let (from_b, _) = logged_after(&b, 0);
    // The log holds each input's origin part after it (2, then 5), never the bare input.
    let logged: Vec<&Mutation> = from_a.iter().flat_map(|r| &r.row.mutations).collect();
    assert!(
        logged
            .iter()
            .all(|m| matches!(m, Mutation::AggregateParts { .. })),
        "{logged:?}"
    );
    // a's entries delivered to b twice, the second before the first; b's to a once.
    b.apply_replicated(&tb, &from_a).unwrap();
    b.apply_replicated(&tb, &from_a[1..]).unwrap();
    b.apply_replicated(&tb, &from_a[..1]).unwrap();
    a.apply_replicated(&ta, &from_b).unwrap();
    let expected: BTreeMap<String, i64> =
        [("h".into(), 2), ("m".into(), 5), ("s".into(), 15)].into();
    assert_eq!(sums(&a, &ta, "r"), expected);
    assert_eq!(sums(&b, &tb, "r"), expected);
    // A newer row delete takes every part; a part older than the delete is not written.
    let delete = rr(v(u64::MAX / 2, 3), "r", vec![Mutation::DeleteFromRow]);
    for (store, table) in [(&a, &ta), (&b, &tb)] {
        store
            .apply_replicated(table, std::slice::from_ref(&delete))
            .unwrap();
        store.apply_replicated(table, &from_a).unwrap();
        assert!(store.read_row(table, b"r").unwrap().cells.is_empty());
    }
}

#[test]
fn a_delete_takes_the_parts_older_than_itself_only() {
    let (_a_dir, a, ta) = aggregate_store(1);
    let (_b_dir, b, tb) = aggregate_store(2);
    a.mutate(&ta, &[row_of("r", vec![add("s", 2)])]).unwrap();
    let (first, seq) = logged_after(&a, 0);
    // b deletes the column (it had not seen a's input), then a adds again: a's part now
    // holds 2 + 3 at a version newer than b's delete.
    b.mutate(&tb, &[row_of("r", vec![del_column("s", "q", 0, 1)])])
        .unwrap();
    let (delete, _) = logged_after(&b, 0);
    a.observe_clock(delete[0].first.hlc).unwrap();
    a.mutate(&ta, &[row_of("r", vec![add("s", 3)])]).unwrap();
    let (second, _) = logged_after(&a, seq);
    // Either order, either cluster: the delete hides a's first part, not its newer one.
    b.apply_replicated(&tb, &second).unwrap();
    b.apply_replicated(&tb, &first).unwrap();
    a.apply_replicated(&ta, &delete).unwrap();
    assert_eq!(sums(&a, &ta, "r"), sums(&b, &tb, "r"));
    assert_eq!(sums(&b, &tb, "r")["s"], 5);
}

#[test]
fn log_entries_give_each_row_its_versions() {
    let entry = LogEntry {
        table_id: 1,
        first: v(100, 4),
        rows: vec![
            RowMutation {
                row: Bytes::from_static(b"a"),
                mutations: vec![Mutation::DeleteFromRow, Mutation::DeleteFromRow],
            },
            RowMutation {
                row: Bytes::from_static(b"b"),
                mutations: vec![],
            },
            RowMutation {
                row: Bytes::from_static(b"c"),
                mutations: vec![Mutation::DeleteFromRow],
            },
        ],
        unresolved: vec![],
    };
    let rows = entry.replicated_rows();
    let firsts: Vec<Version> = rows.iter().map(|r| r.first).collect();
    assert_eq!(firsts, vec![v(100, 4), v(102, 4), v(102, 4)]);
    let from_rows: Vec<Version> = rows
        .iter()
        .flat_map(|r| (0..r.row.mutations.len()).map(|i| r.version(i)))
        .collect();
    let from_entry: Vec<Version> = entry.versions().map(|(_, _, v)| v).collect();
    assert_eq!(from_rows, from_entry);
}

#[test]
fn the_async_variant_applies_too() {
    let (_dir, store, t) = plain_store();
    let store = Arc::new(store);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        store
            .apply_replicated_async(
                t.clone(),
                vec![rr(v(100, 1), "r", vec![set("a", "q", 1, "x")])],
            )
            .await
            .unwrap();
        store
            .apply_replicated_async(
                t.clone(),
                vec![rr(v(99, 2), "r", vec![set("a", "q", 1, "y")])],
            )
            .await
            .unwrap();
    });
    assert_eq!(cells(&store, &t, "r"), vec![cell("a", "q", 1, "x")]);
}

/// Sees every committed job; always wants their operations (as a move's capture does).
#[derive(Default)]
struct Recorder(std::sync::Mutex<Vec<basalt_storage::CommittedJob>>);

impl basalt_storage::CommitObserver for Recorder {
    fn wants_ops(&self) -> bool {
        true
    }

    fn committed(&self, group: &basalt_storage::CommittedGroup<'_>) {
        self.0.lock().unwrap().extend(group.jobs.iter().cloned());
    }
}

#[test]
fn observers_see_replicated_writes_the_change_log_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let recorder = Arc::new(Recorder::default());
    let store = Store::open_with_observers(
        dir.path(),
        basalt_storage::StoreOptions::default(),
        vec![recorder.clone() as Arc<dyn basalt_storage::CommitObserver>],
    )
    .unwrap();
    let t = create(&store, [family("a", None)], &[]);
    store.set_change_log(true);
    let seen = recorder.0.lock().unwrap().len();
    let rows = [rr(v(100, 2), "r", vec![set("a", "q", 1, "x")])];
    store.apply_replicated(&t, &rows).unwrap();
    let jobs = recorder.0.lock().unwrap()[seen..].to_vec();
    assert_eq!(jobs.len(), 1);
    assert!(matches!(
        &jobs[0].ops[..],
        [basalt_storage::LogOp::Put { .. }]
    ));
    assert_eq!(jobs[0].versions, None);
    assert_eq!(jobs[0].log_seq, None);
    assert_eq!(store.change_log_last_seq(), 0);
    // Delivered again: nothing to write, nothing committed.
    store.apply_replicated(&t, &rows).unwrap();
    assert_eq!(recorder.0.lock().unwrap().len(), seen + 1);
}

// ---------------------------------------------------------------------------------------------
// Property: every store that received the same writes, in any order, any number of times,
// reads the same — and what a reference model of the rules says.

const ROWS: [&str; 2] = ["r0", "r1"];
const FAMILIES: [&str; 2] = ["a", "b"];
const QUALIFIERS: [&str; 2] = ["x", "y"];

fn any_mutation() -> impl Strategy<Value = Mutation> {
    let fam = prop::sample::select(FAMILIES.to_vec());
    let qual = prop::sample::select(QUALIFIERS.to_vec());
    prop_oneof![
        5 => (fam.clone(), qual.clone(), 1i64..=3, prop::sample::select(vec!["p", "q", "s"]))
            .prop_map(|(f, q, ts, value)| set(f, q, ts, value)),
        2 => (fam.clone(), qual, 0i64..=3, 1i64..=3)
            .prop_map(|(f, q, start, len)| del_column(f, q, start, start + len)),
        1 => fam.prop_map(del_family),
        1 => Just(Mutation::DeleteFromRow),
    ]
}

/// One write of a cluster: its rows (each with 1–3 mutations) and the clock gap before it.
fn any_write() -> impl Strategy<Value = (u64, Vec<(usize, Vec<Mutation>)>)> {
    (
        0u64..3,
        prop::collection::vec(
            (0..ROWS.len(), prop::collection::vec(any_mutation(), 1..=3)),
            1..=2,
        ),
    )
}

/// 2–3 clusters, each a sequence of writes: log entries with their versions. Clock values start
/// low and close together, so that clusters often take equal ones.
fn any_history() -> impl Strategy<Value = Vec<LogEntry>> {
    prop::collection::vec((1u64..4, prop::collection::vec(any_write(), 1..=5)), 2..=3).prop_map(
        |clusters| {
            let mut entries = Vec::new();
            for (c, (start, writes)) in clusters.into_iter().enumerate() {
                let mut hlc = start;
                for (gap, rows) in writes {
                    hlc += gap;
                    let rows: Vec<RowMutation> = rows
                        .into_iter()
                        .map(|(r, mutations)| RowMutation {
                            row: Bytes::from_static(ROWS[r].as_bytes()),
                            mutations,
                        })
                        .collect();
                    let n: u64 = rows.iter().map(|r| r.mutations.len() as u64).sum();
                    entries.push(LogEntry {
                        table_id: 0,
                        first: v(hlc, c as u16 + 1),
                        rows,
                        unresolved: vec![],
                    });
                    hlc += n;
                }
            }
            entries
        },
    )
}

/// A small deterministic generator for orders and duplicates.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// The deliveries of `entries` to one store: each entry once or twice, shuffled, grouped into
/// calls of 1–3 entries.
fn deliveries(entries: &[LogEntry], seed: u64) -> Vec<Vec<usize>> {
    let mut rng = Rng(seed | 1);
    let mut order: Vec<usize> = (0..entries.len()).collect();
    for i in 0..entries.len() {
        if rng.below(3) == 0 {
            order.push(i);
        }
    }
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i + 1));
    }
    let mut calls = Vec::new();
    let mut at = 0;
    while at < order.len() {
        let n = (1 + rng.below(3)).min(order.len() - at);
        calls.push(order[at..at + n].to_vec());
        at += n;
    }
    calls
}

/// The reference: each cell's newest SetCell, visible unless a covering delete is newer.
fn model(entries: &[LogEntry]) -> BTreeMap<String, Cells> {
    type Key = (String, String, String, i64);
    let mut sets: BTreeMap<Key, (Version, String)> = BTreeMap::new();
    let mut deletes: Vec<(String, &Mutation, Version)> = Vec::new();
    for e in entries {
        for (r, m, version) in e.versions() {
            let row = String::from_utf8(e.rows[r].row.to_vec()).unwrap();
            let m = &e.rows[r].mutations[m];
            match m {
                Mutation::SetCell {
                    family,
                    qualifier,
                    timestamp,
                    value,
                } => {
                    let key = (
                        row,
                        family.clone(),
                        String::from_utf8(qualifier.to_vec()).unwrap(),
                        *timestamp,
                    );
                    let value = String::from_utf8(value.to_vec()).unwrap();
                    if sets.get(&key).is_none_or(|(held, _)| *held < version) {
                        sets.insert(key, (version, value));
                    }
                }
                _ => deletes.push((row, m, version)),
            }
        }
    }
    let mut out: BTreeMap<String, Cells> = ROWS.iter().map(|r| (r.to_string(), vec![])).collect();
    for ((row, family, qualifier, ts), (version, value)) in sets {
        let hidden = deletes.iter().any(|(r, m, t)| {
            *r == row
                && *t > version
                && match m {
                    Mutation::DeleteFromRow => true,
                    Mutation::DeleteFromFamily { family: f } => *f == family,
                    Mutation::DeleteFromColumn {
                        family: f,
                        qualifier: q,
                        start,
                        end,
                    } => {
                        *f == family
                            && q.as_ref() == qualifier.as_bytes()
                            && *start <= ts
                            && ts < *end
                    }
                    _ => false,
                }
        });
        if !hidden {
            out.get_mut(&row)
                .unwrap()
                .push((family, qualifier, ts, value));
        }
    }
    // Read order: family, qualifier, newest timestamp first.
    for cells in out.values_mut() {
        cells.sort_by(|a, b| (&a.0, &a.1, -a.2).cmp(&(&b.0, &b.1, -b.2)));
    }
    out
}

/// The SetCells of `entries`, one replicated row each (with the version it took): what a
/// table whose families count versions receives in the agreement check.
fn set_cells_only(entries: &[LogEntry], calls: &[Vec<usize>]) -> Vec<Vec<ReplicatedRow>> {
    calls
        .iter()
        .map(|call| {
            call.iter()
                .flat_map(|&e| entries[e].replicated_rows())
                .flat_map(|r| {
                    r.row
                        .mutations
                        .iter()
                        .enumerate()
                        .filter(|(_, m)| matches!(m, Mutation::SetCell { .. }))
                        .map(|(i, m)| ReplicatedRow {
                            first: r.version(i),
                            row: RowMutation {
                                row: r.row.row.clone(),
                                mutations: vec![m.clone()],
                            },
                        })
                        .collect::<Vec<_>>()
                })
                .collect()
        })
        .collect()
}

fn counting_families() -> BTreeMap<String, FamilySchema> {
    FAMILIES
        .iter()
        .map(|f| {
            (
                f.to_string(),
                FamilySchema {
                    gc_rule: Some(GcRule::MaxNumVersions(2)),
                    aggregate: None,
                },
            )
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn stores_agree_whatever_the_order_and_duplicates(
        entries in any_history(),
        seeds in prop::collection::vec(any::<u64>(), 3),
    ) {
        let expected = model(&entries);
        let mut digests: Vec<(BTreeMap<String, Cells>, BTreeMap<String, Cells>)> = Vec::new();
        for seed in seeds {
            let dir = tempfile::tempdir().unwrap();
            let store = open(dir.path());
            let plain = create(&store, FAMILIES.iter().map(|f| family(f, None)), &[]);
            let counting = store
                .create_table(
                    "projects/p/instances/i/tables/counting",
                    "projects/p/instances/i",
                    counting_families(),
                    vec![],
                    false,
                )
                .unwrap();
            let calls = deliveries(&entries, seed);
            for call in &calls {
                let rows: Vec<ReplicatedRow> =
                    call.iter().flat_map(|&e| entries[e].replicated_rows()).collect();
                store.apply_replicated(&plain, &rows).unwrap();
            }
            for rows in set_cells_only(&entries, &calls) {
                store.apply_replicated(&counting, &rows).unwrap();
            }
            let read = |t: &TableSchema| -> BTreeMap<String, Cells> {
                ROWS.iter().map(|r| (r.to_string(), cells(&store, t, r))).collect()
            };
            let got = read(&plain);
            prop_assert_eq!(&got, &expected, "deliveries {:?}", calls);
            digests.push((got, read(&counting)));
        }
        let distinct: BTreeSet<_> = digests.iter().map(|(_, c)| c.clone()).collect();
        prop_assert_eq!(distinct.len(), 1, "the counting tables differ: {:?}", distinct);
    }
}

/// Every row of `table` in `store` as seed chunks of about `max_bytes`, following the resume
/// rows until the range is done.
fn seed_of(store: &Store, table: &TableSchema, max_bytes: usize) -> Vec<Vec<ReplicatedRow>> {
    let mut chunks = Vec::new();
    let mut range = basalt_model::RowRange {
        start: Bytes::new(),
        end: None,
    };
    loop {
        let chunk = store.seed_chunk(table, &range, max_bytes).unwrap();
        chunks.push(chunk.rows);
        match chunk.resume {
            Some(next) => {
                assert!(next > range.start, "a seed goes forward");
                range.start = next;
            }
            None => return chunks,
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// A cluster seeded from another that had received part of the writes, while the logs bring
    /// it every other write and some of those (in any order, before, between and after the
    /// seed's chunks), reads what the model says: the seed brings what the logs do not, and
    /// where they overlap no harm is done.
    #[test]
    fn a_seed_taken_at_any_point_and_the_logs_converge(
        entries in any_history(),
        seed in any::<u64>(),
        cut in 0usize..8,
        max_bytes in 1usize..400,
    ) {
        let expected = model(&entries);
        let source_dir = tempfile::tempdir().unwrap();
        let source = open(source_dir.path());
        let source_table = create(&source, FAMILIES.iter().map(|f| family(f, None)), &[]);
        let calls = deliveries(&entries, seed);
        let cut = cut.min(calls.len());
        for call in &calls[..cut] {
            let rows: Vec<ReplicatedRow> =
                call.iter().flat_map(|&e| entries[e].replicated_rows()).collect();
            source.apply_replicated(&source_table, &rows).unwrap();
        }
        let chunks = seed_of(&source, &source_table, max_bytes);

        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let table = create(&store, FAMILIES.iter().map(|f| family(f, None)), &[]);
        // What the logs carry: every write the source did not hold when it was read, and
        // some it did (a log's cursor may be anywhere below the seed's point).
        let mut rng = Rng(seed.rotate_left(29) | 1);
        let held: BTreeSet<usize> = calls[..cut].iter().flatten().copied().collect();
        let logs: Vec<Vec<usize>> = deliveries(&entries, seed.rotate_left(17))
            .into_iter()
            .map(|call| {
                call.into_iter()
                    .filter(|e| !held.contains(e) || rng.below(2) == 0)
                    .collect()
            })
            .collect();
        let (mut c, mut l) = (0, 0);
        while c < chunks.len() || l < logs.len() {
            if l == logs.len() || (c < chunks.len() && rng.below(2) == 0) {
                store.apply_replicated(&table, &chunks[c]).unwrap();
                c += 1;
            } else {
                let rows: Vec<ReplicatedRow> =
                    logs[l].iter().flat_map(|&e| entries[e].replicated_rows()).collect();
                store.apply_replicated(&table, &rows).unwrap();
                l += 1;
            }
        }
        let got: BTreeMap<String, Cells> =
            ROWS.iter().map(|r| (r.to_string(), cells(&store, &table, r))).collect();
        prop_assert_eq!(&got, &expected, "source got {:?}, seed {} chunks", &calls[..cut], chunks.len());
    }
}

#[test]
fn a_seed_carries_cells_tombstones_and_aggregate_states() {
    let (_dir, source, table) = plain_store();
    source
        .apply_replicated(
            &table,
            &[
                rr(
                    v(10, 1),
                    "r0",
                    vec![set("a", "x", 1, "old"), set("a", "y", 2, "kept")],
                ),
                rr(v(20, 1), "r0", vec![del_column("a", "x", 0, 5)]),
                rr(v(30, 2), "r1", vec![set("b", "x", 3, "v")]),
            ],
        )
        .unwrap();
    let chunks = seed_of(&source, &table, 1);
    assert!(chunks.len() >= 2, "one row at a time: {chunks:?}");
    let all: Vec<ReplicatedRow> = chunks.into_iter().flatten().collect();
    assert!(
        all.iter().any(|r| r.first == v(20, 1)
            && matches!(r.row.mutations[..], [Mutation::DeleteFromColumn { .. }])),
        "the column tombstone travels with its version: {all:?}"
    );
    let (_dir2, seeded, table2) = plain_store();
    // A write of the old cell arriving later through a log stays hidden by the seeded delete.
    seeded.apply_replicated(&table2, &all).unwrap();
    seeded
        .apply_replicated(
            &table2,
            &[rr(v(10, 1), "r0", vec![set("a", "x", 1, "old")])],
        )
        .unwrap();
    for row in ["r0", "r1"] {
        assert_eq!(cells(&seeded, &table2, row), cells(&source, &table, row));
    }
    assert_eq!(
        cells(&seeded, &table2, "r0"),
        vec![cell("a", "y", 2, "kept")]
    );

    // An aggregate family's state arrives as one input of that state.
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let sums = store
        .create_table(
            "projects/p/instances/i/tables/sums",
            "projects/p/instances/i",
            [(
                "s".to_string(),
                FamilySchema {
                    gc_rule: None,
                    aggregate: Some(Aggregator::Sum),
                },
            )]
            .into(),
            vec![],
            false,
        )
        .unwrap();
    store
        .mutate(&sums, &[row_of("c", vec![add("s", 3), add("s", 4)])])
        .unwrap();
    let seed: Vec<ReplicatedRow> = seed_of(&store, &sums, 1 << 20)
        .into_iter()
        .flatten()
        .collect();
    assert_eq!(seed.len(), 1, "{seed:?}");
    let [Mutation::AggregateParts { parts, .. }] = &seed[0].row.mutations[..] else {
        panic!("an aggregate cell is seeded as its parts: {seed:?}");
    };
    let parts = Parts::decode(parts).unwrap();
    assert_eq!(parts.0.len(), 1);
    assert_eq!(parts.0[0].origin, store.origin());
    assert_eq!(parts.0[0].state, 7i64.to_be_bytes());
}

// ---------------------------------------------------------------------------------------------
// Property: counters written in 2–3 clusters at once, shipped as their logs are (in pieces, out
// of order between origins, with redeliveries), and a cluster seeded from one of them at any
// point: every cluster reads the same, and without deletes the sums are the inputs' sums.

#[derive(Clone, Debug)]
enum Step {
    /// Cluster `c` writes `row` with these inputs (family, input).
    Write(usize, usize, Vec<(&'static str, i64)>),
    /// Cluster `c` deletes the column s:q of `row` (or the whole row).
    Delete(usize, usize, bool),
    /// Cluster `from`'s log, up to its next `n` entries past what `to` has, ships to `to`;
    /// `again`: the last batch shipped before is sent again first (an acknowledgement lost).
    Ship {
        from: usize,
        to: usize,
        n: usize,
        again: bool,
    },
}

fn any_step(deletes: bool) -> impl Strategy<Value = Step> {
    let input = (prop::sample::select(vec!["s", "m", "h"]), -5i64..20);
    prop_oneof![
        4 => (0..3usize, 0..ROWS.len(), prop::collection::vec(input, 1..=3))
            .prop_map(|(c, r, inputs)| Step::Write(c, r, inputs)),
        (if deletes { 1 } else { 0 }) => (0..3usize, 0..ROWS.len(), any::<bool>())
            .prop_map(|(c, r, row)| Step::Delete(c, r, row)),
        3 => (0..3usize, 0..3usize, 1..4usize, any::<bool>())
            .prop_map(|(from, to, n, again)| Step::Ship { from, to, n, again }),
    ]
}

fn run_counters(
    steps: &[Step],
    clusters: usize,
    seed_at: usize,
) -> std::result::Result<(), TestCaseError> {
    let stores: Vec<_> = (0..clusters)
        .map(|c| aggregate_store(c as u16 + 1))
        .collect();
    // What `to` has received of `from`'s log, and the last batch shipped.
    let mut shipped = vec![vec![(0u64, Vec::<ReplicatedRow>::new()); clusters]; clusters];
    let mut inputs: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    let mut seeded = None;
    for (i, step) in steps.iter().enumerate() {
        if i == seed_at {
            // A cluster joins: a seed of cluster 0 as it is now (in small chunks); every log
            // will also bring it everything, including what the seed already holds.
            let (dir, store, table) = aggregate_store(9);
            let (_, ref source, ref source_table) = stores[0];
            for chunk in seed_of(source, source_table, 64) {
                store.apply_replicated(&table, &chunk).unwrap();
            }
            seeded = Some((dir, store, table));
        }
        match step {
            Step::Write(c, r, adds) => {
                let c = c % clusters;
                let (_, store, table) = &stores[c];
                let mutations = adds.iter().map(|&(f, n)| add(f, n)).collect();
                store.mutate(table, &[row_of(ROWS[*r], mutations)]).unwrap();
                for &(f, n) in adds {
                    if f == "s" {
                        inputs.entry(ROWS[*r]).or_default().push(n);
                    }
                }
            }
            Step::Delete(c, r, whole) => {
                let (_, store, table) = &stores[c % clusters];
                let m = if *whole {
                    Mutation::DeleteFromRow
                } else {
                    del_column("s", "q", 0, 1)
                };
                store.mutate(table, &[row_of(ROWS[*r], vec![m])]).unwrap();
            }
            Step::Ship { from, to, n, again } => {
                let (from, to) = (from % clusters, to % clusters);
                if from == to {
                    continue;
                }
                let (_, source, _) = &stores[from];
                let (_, target, table) = &stores[to];
                let (after, last_batch) = &mut shipped[from][to];
                if *again {
                    target.apply_replicated(table, last_batch).unwrap();
                }
                let entries = source.read_change_log(*after, usize::MAX).unwrap();
                let entries = &entries[..(*n).min(entries.len())];
                let rows: Vec<ReplicatedRow> = entries
                    .iter()
                    .flat_map(|(_, e)| e.replicated_rows())
                    .collect();
                target.apply_replicated(table, &rows).unwrap();
                if let Some((seq, _)) = entries.last() {
                    *after = *seq;
                }
                *last_batch = rows;
            }
        }
    }
    // Everything left ships; every log goes to the seeded cluster whole, from the start.
    for from in 0..clusters {
        for to in 0..clusters {
            if from != to {
                let (_, target, table) = &stores[to];
                let (rows, _) = logged_after(&stores[from].1, shipped[from][to].0);
                target.apply_replicated(table, &rows).unwrap();
            }
        }
        if let Some((_, store, table)) = &seeded {
            let (rows, _) = logged_after(&stores[from].1, 0);
            store.apply_replicated(table, &rows).unwrap();
        }
    }
    let reads: Vec<BTreeMap<&str, BTreeMap<String, i64>>> = stores
        .iter()
        .map(|(_, s, t)| (s, t))
        .chain(seeded.as_ref().map(|(_, s, t)| (s, t)))
        .map(|(store, table)| ROWS.iter().map(|r| (*r, sums(store, table, r))).collect())
        .collect();
    for read in &reads[1..] {
        prop_assert_eq!(read, &reads[0]);
    }
    if !steps.iter().any(|s| matches!(s, Step::Delete(..))) {
        for row in ROWS {
            let total = inputs
                .get(row)
                .map(|v| v.iter().fold(0i64, |a, b| a.wrapping_add(*b)));
            prop_assert_eq!(reads[0][row].get("s").copied(), total, "row {}", row);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn counters_from_every_cluster_converge_exactly(
        steps in prop::collection::vec(any_step(false), 1..30),
        clusters in 2usize..=3,
        seed_at in 0usize..30,
    ) {
        run_counters(&steps, clusters, seed_at)?;
    }

    #[test]
    fn counters_with_deletes_converge(
        steps in prop::collection::vec(any_step(true), 1..30),
        clusters in 2usize..=3,
        seed_at in 0usize..30,
    ) {
        run_counters(&steps, clusters, seed_at)?;
    }
}
