//! Storage-level tests: the store's write, delete, GC and read semantics on a real RocksDB.

use std::collections::BTreeMap;

use basalt_model::RowSet;
use basalt_model::gc::GcRule;
use basalt_model::{FamilyChange, FamilySchema, Mutation, RowMutation, TableSchema};
use basalt_storage::{Store, StoreOptions};
use bytes::Bytes;

const TABLE: &str = "projects/p/instances/i/tables/t";

fn open(dir: &std::path::Path) -> Store {
    Store::open(dir, StoreOptions::default()).expect("open store")
}

fn families(list: &[(&str, Option<GcRule>)]) -> BTreeMap<String, FamilySchema> {
    list.iter()
        .map(|(n, r)| {
            (
                n.to_string(),
                FamilySchema {
                    gc_rule: r.clone(),
                    aggregate: None,
                },
            )
        })
        .collect()
}

/// Creates TABLE with plain families (no GC rule, no value type).
fn plain_table(store: &Store, names: &[&str]) -> std::sync::Arc<TableSchema> {
    let list: Vec<(&str, Option<GcRule>)> = names.iter().map(|n| (*n, None)).collect();
    store
        .create_table(
            TABLE,
            "projects/p/instances/i",
            families(&list),
            vec![],
            false,
        )
        .unwrap()
}

/// ModifyColumnFamilies change creating a family without GC rule or value type.
fn create_plain(id: &str) -> FamilyChange {
    FamilyChange::Create {
        id: id.into(),
        family: FamilySchema {
            gc_rule: None,
            aggregate: None,
        },
    }
}

fn set(family: &str, q: &str, ts: i64, v: &str) -> Mutation {
    Mutation::SetCell {
        family: family.into(),
        qualifier: Bytes::copy_from_slice(q.as_bytes()),
        timestamp: ts,
        value: Bytes::copy_from_slice(v.as_bytes()),
    }
}

fn write(store: &Store, table: &TableSchema, row: &str, mutations: Vec<Mutation>) {
    store
        .mutate(
            table,
            &[RowMutation {
                row: Bytes::copy_from_slice(row.as_bytes()),
                mutations,
            }],
        )
        .expect("mutate");
}

/// (family, qualifier, timestamp, value) of every live cell of a row.
fn cells(store: &Store, table: &TableSchema, row: &str) -> Vec<(String, String, i64, String)> {
    store
        .read_row(table, row.as_bytes())
        .unwrap()
        .cells
        .into_iter()
        .map(|c| {
            (
                c.family,
                String::from_utf8(c.qualifier.to_vec()).unwrap(),
                c.timestamp_micros,
                String::from_utf8(c.value.to_vec()).unwrap(),
            )
        })
        .collect()
}

fn c(f: &str, q: &str, ts: i64, v: &str) -> (String, String, i64, String) {
    (f.into(), q.into(), ts, v.into())
}

fn row_keys(store: &Store, table: &TableSchema, reversed: bool) -> Vec<String> {
    let mut out = vec![];
    for r in store.rows(table, &RowSet::all(), reversed) {
        out.push(String::from_utf8(r.unwrap().key.to_vec()).unwrap());
    }
    out
}

#[test]
fn cells_come_back_in_bigtable_order_and_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path());
        let t = plain_table(&store, &["a", "b"]);
        write(
            &store,
            &t,
            "r1",
            vec![
                set("b", "x", 1000, "b-x"),
                set("a", "y", 1000, "a-y-old"),
                set("a", "y", 3000, "a-y-new"),
                set("a", "x", 2000, "a-x"),
            ],
        );
        write(&store, &t, "r0", vec![set("a", "", 0, "empty-qualifier")]);
    }
    let store = open(dir.path());
    let t = store.table(TABLE).unwrap();
    assert_eq!(
        cells(&store, &t, "r1"),
        vec![
            c("a", "x", 2000, "a-x"),
            c("a", "y", 3000, "a-y-new"),
            c("a", "y", 1000, "a-y-old"),
            c("b", "x", 1000, "b-x"),
        ]
    );
    assert_eq!(row_keys(&store, &t, false), vec!["r0", "r1"]);
    assert_eq!(row_keys(&store, &t, true), vec!["r1", "r0"]);
}

#[test]
fn deletes_hide_exactly_what_they_cover_and_later_mutations_win() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let t = plain_table(&store, &["a", "b"]);
    write(
        &store,
        &t,
        "r",
        vec![
            set("a", "q", 1000, "1"),
            set("a", "q", 2000, "2"),
            set("a", "q", 3000, "3"),
            set("a", "p", 1000, "p"),
            set("b", "q", 1000, "b"),
        ],
    );
    write(
        &store,
        &t,
        "r",
        vec![Mutation::DeleteFromColumn {
            family: "a".into(),
            qualifier: Bytes::from_static(b"q"),
            start: 2000,
            end: 3000,
        }],
    );
    assert_eq!(
        cells(&store, &t, "r"),
        vec![
            c("a", "p", 1000, "p"),
            c("a", "q", 3000, "3"),
            c("a", "q", 1000, "1"),
            c("b", "q", 1000, "b")
        ]
    );
    write(
        &store,
        &t,
        "r",
        vec![Mutation::DeleteFromFamily { family: "a".into() }],
    );
    assert_eq!(cells(&store, &t, "r"), vec![c("b", "q", 1000, "b")]);
    // Delete then set in one request: the set wins. Set then delete: the delete wins.
    write(
        &store,
        &t,
        "r",
        vec![Mutation::DeleteFromRow, set("a", "n", 5000, "new")],
    );
    assert_eq!(cells(&store, &t, "r"), vec![c("a", "n", 5000, "new")]);
    write(
        &store,
        &t,
        "r",
        vec![set("b", "z", 1000, "gone"), Mutation::DeleteFromRow],
    );
    assert!(cells(&store, &t, "r").is_empty());
    assert!(
        row_keys(&store, &t, false).is_empty(),
        "a row with only tombstones is not returned"
    );
    // Writing after a delete works (tombstone versions are older than new writes).
    write(&store, &t, "r", vec![set("a", "q", 1000, "again")]);
    assert_eq!(cells(&store, &t, "r"), vec![c("a", "q", 1000, "again")]);
}

#[test]
fn gc_rules_hide_cells_on_read_and_versions_are_trimmed_on_write() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let now = basalt_model::hlc::now_micros() / 1000 * 1000;
    let t = store
        .create_table(
            TABLE,
            "projects/p/instances/i",
            families(&[
                ("v2", Some(GcRule::MaxNumVersions(2))),
                ("age", Some(GcRule::MaxAgeMicros(60_000_000))),
            ]),
            vec![],
            false,
        )
        .unwrap();
    write(
        &store,
        &t,
        "r",
        vec![
            set("v2", "q", 1000, "1"),
            set("v2", "q", 2000, "2"),
            set("v2", "q", 3000, "3"),
            set("age", "old", now - 120_000_000, "old"),
            set("age", "new", now, "new"),
        ],
    );
    assert_eq!(
        cells(&store, &t, "r"),
        vec![
            c("age", "new", now, "new"),
            c("v2", "q", 3000, "3"),
            c("v2", "q", 2000, "2")
        ]
    );
    // The trimmed version is physically gone: loosening the rule does not bring it back.
    let t = store
        .modify_column_families(
            TABLE,
            &[FamilyChange::Update {
                id: "v2".into(),
                gc_rule: None,
                aggregate: None,
            }],
        )
        .unwrap();
    assert_eq!(
        cells(&store, &t, "r")
            .into_iter()
            .filter(|x| x.0 == "v2")
            .count(),
        2
    );
    // Age-expired cells are removed by the compaction filter.
    store.flush().unwrap();
    store.compact_all();
    let t = store
        .modify_column_families(
            TABLE,
            &[FamilyChange::Update {
                id: "age".into(),
                gc_rule: None,
                aggregate: None,
            }],
        )
        .unwrap();
    assert_eq!(
        cells(&store, &t, "r")
            .into_iter()
            .filter(|x| x.0 == "age")
            .collect::<Vec<_>>(),
        vec![c("age", "new", now, "new")]
    );
}

/// A family keeping one version: an update of a row whose older version is in an SST file
/// does not read it (only the memtable is trimmed on write); reads never return the older
/// version, and compaction removes it (loosening the rule afterwards shows one version).
#[test]
fn one_version_families_leave_older_versions_on_disk_to_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let loosen = |store: &Store| {
        store
            .modify_column_families(
                TABLE,
                &[FamilyChange::Update {
                    id: "v1".into(),
                    gc_rule: None,
                    aggregate: None,
                }],
            )
            .unwrap()
    };
    let t = store
        .create_table(
            TABLE,
            "projects/p/instances/i",
            families(&[("v1", Some(GcRule::MaxNumVersions(1)))]),
            vec![],
            false,
        )
        .unwrap();
    // In the memtable: trimmed on write.
    write(&store, &t, "hot", vec![set("v1", "q", 1000, "1")]);
    write(&store, &t, "hot", vec![set("v1", "q", 2000, "2")]);
    // On disk: left to compaction.
    write(&store, &t, "cold", vec![set("v1", "q", 1000, "1")]);
    store.flush().unwrap();
    write(&store, &t, "cold", vec![set("v1", "q", 2000, "2")]);
    for row in ["hot", "cold"] {
        assert_eq!(cells(&store, &t, row), vec![c("v1", "q", 2000, "2")]);
    }
    store.flush().unwrap();
    let t = {
        let loose = loosen(&store);
        assert_eq!(cells(&store, &loose, "hot").len(), 1, "trimmed on write");
        assert_eq!(cells(&store, &loose, "cold").len(), 2, "not yet compacted");
        store
            .modify_column_families(
                TABLE,
                &[FamilyChange::Update {
                    id: "v1".into(),
                    gc_rule: Some(GcRule::MaxNumVersions(1)),
                    aggregate: None,
                }],
            )
            .unwrap()
    };
    assert_eq!(cells(&store, &t, "cold"), vec![c("v1", "q", 2000, "2")]);
    store.compact_all();
    let loose = loosen(&store);
    assert_eq!(cells(&store, &loose, "cold"), vec![c("v1", "q", 2000, "2")]);
}

#[test]
fn dropped_family_data_never_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let t = plain_table(&store, &["a", "b"]);
    write(
        &store,
        &t,
        "r",
        vec![set("a", "q", 1000, "old"), set("b", "q", 1000, "keep")],
    );
    store
        .modify_column_families(TABLE, &[FamilyChange::Drop { id: "a".into() }])
        .unwrap();
    let t = store
        .modify_column_families(TABLE, &[create_plain("a")])
        .unwrap();
    assert_eq!(cells(&store, &t, "r"), vec![c("b", "q", 1000, "keep")]);
    write(&store, &t, "r", vec![set("a", "q", 2000, "new")]);
    store.flush().unwrap();
    store.compact_all();
    assert_eq!(
        cells(&store, &t, "r"),
        vec![c("a", "q", 2000, "new"), c("b", "q", 1000, "keep")]
    );
}

#[test]
fn drop_row_range_and_delete_table() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let t = plain_table(&store, &["a"]);
    for row in ["a", "ab", "ab\0x", "abc", "b"] {
        write(&store, &t, row, vec![set("a", "q", 0, row)]);
    }
    store.drop_row_range(TABLE, Some(b"ab")).unwrap();
    assert_eq!(row_keys(&store, &t, false), vec!["a", "b"]);
    store.drop_row_range(TABLE, None).unwrap();
    assert!(row_keys(&store, &t, false).is_empty());
    write(&store, &t, "x", vec![set("a", "q", 0, "x")]);
    store.delete_table(TABLE).unwrap();
    assert_eq!(
        store.table(TABLE).unwrap_err().code(),
        basalt_model::Code::NotFound
    );
    // A table created again under the same name starts empty.
    let t = plain_table(&store, &["a"]);
    assert!(row_keys(&store, &t, false).is_empty());
}

#[test]
fn read_modify_write_is_atomic_under_concurrency() {
    let dir = tempfile::tempdir().unwrap();
    let store = std::sync::Arc::new(open(dir.path()));
    let t = plain_table(&store, &["a"]);
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let store = store.clone();
            let t = t.clone();
            std::thread::spawn(move || {
                for _ in 0..50 {
                    store
                        .read_modify_write(&t, &Bytes::from_static(b"counter"), |row| {
                            let n = row
                                .cells
                                .first()
                                .map(|c| i64::from_be_bytes(c.value[..].try_into().unwrap()))
                                .unwrap_or(0);
                            let m = Mutation::SetCell {
                                family: "a".into(),
                                qualifier: Bytes::from_static(b"n"),
                                timestamp: 0,
                                value: Bytes::copy_from_slice(&(n + 1).to_be_bytes()),
                            };
                            Ok((vec![m], ()))
                        })
                        .unwrap();
                }
            })
        })
        .collect();
    for th in threads {
        th.join().unwrap();
    }
    let row = store.read_row(&t, b"counter").unwrap();
    assert_eq!(row.cells.len(), 1);
    assert_eq!(
        i64::from_be_bytes(row.cells[0].value[..].try_into().unwrap()),
        200
    );
}

#[test]
fn sample_row_keys_reports_splits_with_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let t = store
        .create_table(
            TABLE,
            "projects/p/instances/i",
            families(&[("a", None)]),
            vec![b"m".to_vec()],
            false,
        )
        .unwrap();
    let value = "x".repeat(10_000);
    for i in 0..10 {
        write(&store, &t, &format!("a{i}"), vec![set("a", "q", 0, &value)]);
        write(&store, &t, &format!("z{i}"), vec![set("a", "q", 0, &value)]);
    }
    let samples = store.sample_row_keys(&t).unwrap();
    assert_eq!(samples.len(), 2);
    assert_eq!(&samples[0].0[..], b"m");
    assert_eq!(&samples[1].0[..], b"");
    let half = samples[0].1;
    assert!((100_000..110_000).contains(&half), "offset of m: {half}");
    assert!(
        (200_000..220_000).contains(&samples[1].1),
        "total: {}",
        samples[1].1
    );
}

#[test]
fn aggregate_cells_fold_inputs_across_batches_flushes_and_deletes() {
    use basalt_model::aggregate::Aggregator;
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let mut fams = BTreeMap::new();
    for (name, agg) in [
        ("sum", Aggregator::Sum),
        ("min", Aggregator::Min),
        ("max", Aggregator::Max),
    ] {
        fams.insert(
            name.to_string(),
            FamilySchema {
                gc_rule: None,
                aggregate: Some(agg),
            },
        );
    }
    let t = store
        .create_table(TABLE, "projects/p/instances/i", fams, vec![], false)
        .unwrap();
    let add = |family: &str, input: i64| Mutation::Aggregate {
        family: family.into(),
        qualifier: Bytes::from_static(b"q"),
        timestamp: 1000,
        aggregator: match family {
            "sum" => Aggregator::Sum,
            "min" => Aggregator::Min,
            _ => Aggregator::Max,
        },
        input,
    };
    let value_of = |family: &str| -> Vec<i64> {
        store
            .read_row(&t, b"r")
            .unwrap()
            .cells
            .into_iter()
            .filter(|c| c.family == family)
            .map(|c| i64::from_be_bytes(c.value[..].try_into().unwrap()))
            .collect()
    };
    write(
        &store,
        &t,
        "r",
        vec![add("sum", 5), add("sum", -2), add("min", 4), add("max", 4)],
    );
    store.flush().unwrap();
    write(
        &store,
        &t,
        "r",
        vec![add("sum", 10), add("min", -9), add("max", 40)],
    );
    assert_eq!(value_of("sum"), vec![13]);
    assert_eq!(value_of("min"), vec![-9]);
    assert_eq!(value_of("max"), vec![40]);
    store.compact_all();
    assert_eq!(value_of("sum"), vec![13]);
    // A delete resets the cell; adds in the same batch after a delete start from zero.
    write(
        &store,
        &t,
        "r",
        vec![
            Mutation::DeleteFromColumn {
                family: "sum".into(),
                qualifier: Bytes::from_static(b"q"),
                start: 0,
                end: i64::MAX,
            },
            add("sum", 7),
            add("sum", 1),
        ],
    );
    assert_eq!(value_of("sum"), vec![8]);
    drop(store);
    let store = open(dir.path());
    let t = store.table(TABLE).unwrap();
    let row = store.read_row(&t, b"r").unwrap();
    let sum: Vec<i64> = row
        .cells
        .iter()
        .filter(|c| c.family == "sum")
        .map(|c| i64::from_be_bytes(c.value[..].try_into().unwrap()))
        .collect();
    assert_eq!(sum, vec![8]);
}

#[test]
fn sample_row_keys_of_large_tables_come_from_sst_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(
        dir.path(),
        StoreOptions {
            // Force the SST-based path with a small table.
            sample_scan_limit_bytes: 0,
            ..StoreOptions::default()
        },
    )
    .unwrap();
    let t = store
        .create_table(
            TABLE,
            "projects/p/instances/i",
            families(&[("a", None)]),
            vec![b"k0500".to_vec()],
            false,
        )
        .unwrap();
    // Incompressible values, flushed to SST files in several batches.
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for batch in 0..4 {
        for i in 0..250 {
            let value: String = (0..4000)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    char::from(b'a' + (seed % 26) as u8)
                })
                .collect();
            write(
                &store,
                &t,
                &format!("k{:04}", batch * 250 + i),
                vec![set("a", "q", 0, &value)],
            );
        }
        store.flush().unwrap();
    }
    let samples = store.sample_row_keys(&t).unwrap();
    let keys: Vec<&[u8]> = samples.iter().map(|(k, _)| &k[..]).collect();
    assert!(keys.contains(&&b"k0500"[..]), "{keys:?}");
    assert_eq!(keys.last(), Some(&&b""[..]));
    for w in samples.windows(2) {
        assert!(w[0].1 <= w[1].1, "offsets must not decrease: {samples:?}");
        assert!(
            w[1].0.is_empty() || w[0].0 < w[1].0,
            "keys must increase: {keys:?}"
        );
    }
    let total = samples.last().unwrap().1;
    let split = samples.iter().find(|(k, _)| &k[..] == b"k0500").unwrap().1;
    // ~4 MB of values: the split sits near the middle.
    assert!((3_000_000..6_000_000).contains(&total), "total {total}");
    assert!(
        split * 10 > total * 3 && split * 10 < total * 7,
        "split {split} of {total}"
    );
}

/// Writers on threads (the blocking path) and on the async runtime (the server's path) share
/// the committer's group commits: every write lands exactly once, with its own value, and
/// nothing is left in flight.
#[test]
fn group_commit_applies_every_concurrent_write_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = std::sync::Arc::new(open(dir.path()));
    let t = plain_table(&store, &["a"]);
    let row = |w: usize, i: usize| format!("w{w:02}-{i:03}");
    let threads: Vec<_> = (0..6)
        .map(|w| {
            let (store, t) = (store.clone(), t.clone());
            std::thread::spawn(move || {
                for i in 0..100 {
                    write(
                        &store,
                        &t,
                        &row(w, i),
                        vec![set("a", "q", 1000, &row(w, i))],
                    );
                }
            })
        })
        .collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let tasks: Vec<_> = (6..12)
            .map(|w| {
                let (store, t) = (store.clone(), t.clone());
                tokio::spawn(async move {
                    for i in 0..100 {
                        let rows = vec![RowMutation {
                            row: Bytes::from(row(w, i)),
                            mutations: vec![set("a", "q", 1000, &row(w, i))],
                        }];
                        store.mutate_async(t.clone(), rows).await.unwrap();
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
    });
    for th in threads {
        th.join().unwrap();
    }
    // Nothing left in flight: everything written so far counts as durable.
    let written = store.clock_now();
    assert!(store.durable_through() >= written);
    let check = |store: &Store| {
        let keys = row_keys(store, &t, false);
        assert_eq!(keys.len(), 1200);
        for w in 0..12 {
            for i in 0..100 {
                assert_eq!(
                    cells(store, &t, &row(w, i)),
                    vec![c("a", "q", 1000, &row(w, i))]
                );
            }
        }
    };
    check(&store);
    drop(store);
    check(&open(dir.path()));
}

#[test]
fn writes_validated_against_a_stale_schema_never_land_in_dropped_families_or_tables() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let stale = plain_table(&store, &["a", "b"]);
    store
        .modify_column_families(TABLE, &[FamilyChange::Drop { id: "a".into() }])
        .unwrap();
    let rows = [RowMutation {
        row: Bytes::from_static(b"r"),
        mutations: vec![set("b", "q", 0, "ok"), set("a", "q", 0, "late")],
    }];
    assert_eq!(
        store.mutate(&stale, &rows).unwrap_err().code(),
        basalt_model::Code::NotFound
    );
    // Nothing of the request was applied, and re-creating the family shows no data.
    let t = store
        .modify_column_families(TABLE, &[create_plain("a")])
        .unwrap();
    assert!(cells(&store, &t, "r").is_empty());
    store.delete_table(TABLE).unwrap();
    assert_eq!(
        store.mutate(&t, &rows).unwrap_err().code(),
        basalt_model::Code::NotFound
    );
}

mod model_based {
    //! Random request sequences against the store and against an obviously-correct in-memory
    //! model of Bigtable's data semantics; every read must agree.
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap as Map;

    type Key = (String, String, String, std::cmp::Reverse<i64>);
    /// Rows as a user sees them: key, then (family, qualifier, timestamp, value) per cell.
    type Rows = Vec<(String, Vec<(String, String, i64, String)>)>;

    #[derive(Debug, Clone)]
    enum Op {
        Write(Vec<(String, Vec<Mutation>)>),
        /// Memtables to SST files: later writes find older versions there, not in memory.
        Flush,
        Reopen {
            compact: bool,
        },
    }

    /// Versions kept per column of the families with a version rule: b keeps 2 (trimmed on
    /// write), c keeps 1 (trimmed in the memtable on write, by compaction otherwise).
    fn kept(family: &str) -> Option<usize> {
        match family {
            "b" => Some(2),
            "c" => Some(1),
            _ => None,
        }
    }

    fn arb_mutation() -> impl Strategy<Value = Mutation> {
        let family = prop_oneof![Just("a"), Just("b"), Just("c")];
        let qualifier = prop_oneof![Just(""), Just("x"), Just("y")];
        let ts = prop_oneof![Just(0i64), Just(1000), Just(2000), Just(3000)];
        prop_oneof![
            4 => (family.clone(), qualifier.clone(), ts.clone(), 0u8..4).prop_map(|(f, q, t, v)| set(f, q, t, &format!("v{v}"))),
            1 => (family.clone(), qualifier, ts.clone(), ts).prop_map(|(f, q, s, e)| Mutation::DeleteFromColumn {
                family: f.into(),
                qualifier: Bytes::copy_from_slice(q.as_bytes()),
                start: s.min(e),
                end: if s.max(e) == 0 { i64::MAX } else { s.max(e) },
            }),
            1 => family.prop_map(|f| Mutation::DeleteFromFamily { family: f.into() }),
            1 => Just(Mutation::DeleteFromRow),
        ]
    }

    fn arb_op() -> impl Strategy<Value = Op> {
        let row = prop_oneof![Just("r1"), Just("r2"), Just("r3")].prop_map(String::from);
        let entry = (row, proptest::collection::vec(arb_mutation(), 1..4));
        prop_oneof![
            8 => proptest::collection::vec(entry, 1..3).prop_map(Op::Write),
            1 => Just(Op::Flush),
            1 => any::<bool>().prop_map(|compact| Op::Reopen { compact }),
        ]
    }

    /// The model: applies mutations in order; reads apply family b's max_num_versions = 2.
    fn apply(model: &mut Map<Key, String>, row: &str, m: &Mutation) {
        match m {
            Mutation::SetCell {
                family,
                qualifier,
                timestamp,
                value,
            } => {
                model.insert(
                    (
                        row.into(),
                        family.clone(),
                        String::from_utf8(qualifier.to_vec()).unwrap(),
                        std::cmp::Reverse(*timestamp),
                    ),
                    String::from_utf8(value.to_vec()).unwrap(),
                );
            }
            Mutation::DeleteFromColumn {
                family,
                qualifier,
                start,
                end,
            } => {
                let q = String::from_utf8(qualifier.to_vec()).unwrap();
                model.retain(|(r, f, qq, t), _| {
                    !(r == row && f == family && *qq == q && *start <= t.0 && t.0 < *end)
                });
            }
            Mutation::DeleteFromFamily { family } => {
                model.retain(|(r, f, _, _), _| !(r == row && f == family))
            }
            Mutation::DeleteFromRow => model.retain(|(r, _, _, _), _| r != row),
            Mutation::Aggregate { .. } | Mutation::AggregateParts { .. } => {
                unreachable!("not generated")
            }
        }
    }

    /// Families b and c keep 2 and 1 versions: a row mutation that writes a column pushes its
    /// older versions out for good (a later delete of a newer version does not bring them
    /// back), as the store trims on write and Bigtable's GC may have run at any time after the
    /// write.
    fn trim_versions(model: &mut Map<Key, String>, row: &str, mutations: &[Mutation]) {
        for m in mutations {
            let Mutation::SetCell {
                family, qualifier, ..
            } = m
            else {
                continue;
            };
            let Some(keep) = kept(family) else {
                continue;
            };
            let q = String::from_utf8(qualifier.to_vec()).unwrap();
            let pushed_out: Vec<Key> = model
                .keys()
                .filter(|(r, f, qq, _)| r == row && f == family && *qq == q)
                .skip(keep)
                .cloned()
                .collect();
            for k in pushed_out {
                model.remove(&k);
            }
        }
    }

    fn expected(model: &Map<Key, String>) -> Rows {
        let mut rows: Map<String, Vec<(String, String, i64, String)>> = Map::new();
        let mut versions: Map<(String, String, String), usize> = Map::new();
        for ((r, f, q, t), v) in model {
            let n = versions
                .entry((r.clone(), f.clone(), q.clone()))
                .or_default();
            *n += 1;
            if kept(f).is_some_and(|keep| *n > keep) {
                continue;
            }
            rows.entry(r.clone())
                .or_default()
                .push((f.clone(), q.clone(), t.0, v.clone()));
        }
        rows.into_iter().collect()
    }

    fn actual(store: &Store, table: &TableSchema, reversed: bool) -> Rows {
        let mut out = vec![];
        for r in store.rows(table, &RowSet::all(), reversed) {
            let r = r.unwrap();
            let key = String::from_utf8(r.key.to_vec()).unwrap();
            let cells = r
                .cells
                .into_iter()
                .map(|c| {
                    (
                        c.family,
                        String::from_utf8(c.qualifier.to_vec()).unwrap(),
                        c.timestamp_micros,
                        String::from_utf8(c.value.to_vec()).unwrap(),
                    )
                })
                .collect();
            out.push((key, cells));
        }
        out
    }

    /// Runs `ops` against a fresh store and the model, comparing every read after every step.
    fn check(ops: Vec<Op>) -> Result<(), TestCaseError> {
        let dir = tempfile::tempdir().unwrap();
        let mut store = open(dir.path());
        let table = store
            .create_table(
                TABLE,
                "projects/p/instances/i",
                families(&[
                    ("a", None),
                    ("b", Some(GcRule::MaxNumVersions(2))),
                    ("c", Some(GcRule::MaxNumVersions(1))),
                ]),
                vec![],
                false,
            )
            .unwrap();
        let mut model = Map::new();
        for op in ops {
            match op {
                Op::Write(entries) => {
                    let rows: Vec<RowMutation> = entries
                        .iter()
                        .map(|(r, ms)| RowMutation {
                            row: Bytes::copy_from_slice(r.as_bytes()),
                            mutations: ms.clone(),
                        })
                        .collect();
                    store.mutate(&table, &rows).unwrap();
                    for (r, ms) in &entries {
                        for m in ms {
                            apply(&mut model, r, m);
                        }
                        trim_versions(&mut model, r, ms);
                    }
                }
                Op::Flush => store.flush().unwrap(),
                Op::Reopen { compact } => {
                    if compact {
                        store.flush().unwrap();
                        store.compact_all();
                    }
                    drop(store);
                    store = open(dir.path());
                }
            }
            let want = expected(&model);
            prop_assert_eq!(&actual(&store, &table, false), &want);
            let mut rev = want.clone();
            rev.reverse();
            prop_assert_eq!(actual(&store, &table, true), rev);
        }
        Ok(())
    }

    /// Found by the property test: a version pushed out by max_num_versions stays gone after
    /// the newer version that pushed it out is deleted.
    #[test]
    fn versions_pushed_out_stay_gone_after_a_delete() {
        let set_b = |ts| Op::Write(vec![("r1".into(), vec![set("b", "y", ts, "v0")])]);
        check(vec![
            set_b(0),
            set_b(2000),
            set_b(1000),
            Op::Write(vec![(
                "r1".into(),
                vec![Mutation::DeleteFromColumn {
                    family: "b".into(),
                    qualifier: Bytes::from_static(b"y"),
                    start: 1000,
                    end: 2000,
                }],
            )]),
        ])
        .unwrap();
    }

    /// Family c keeps one version: a version in an SST file, pushed out by a newer one that
    /// the write path did not trim (it trims the memtable only), stays gone after the newer
    /// one is deleted; an older version written after that delete stays, compaction included.
    #[test]
    fn a_version_pushed_out_on_disk_stays_gone_after_a_delete() {
        let set_c = |ts| Op::Write(vec![("r1".into(), vec![set("c", "y", ts, "v0")])]);
        let delete_c = |start, end| {
            Op::Write(vec![(
                "r1".into(),
                vec![Mutation::DeleteFromColumn {
                    family: "c".into(),
                    qualifier: Bytes::from_static(b"y"),
                    start,
                    end,
                }],
            )])
        };
        check(vec![
            set_c(1000),
            Op::Flush,
            set_c(2000),
            delete_c(2000, 3000),
        ])
        .unwrap();
        check(vec![
            set_c(2000),
            Op::Flush,
            delete_c(2000, 3000),
            set_c(1000),
            Op::Flush,
            Op::Reopen { compact: true },
        ])
        .unwrap();
    }

    proptest! {
        // 48 cases in CI; `PROPTEST_CASES=5000` for a long run.
        #![proptest_config(ProptestConfig {
            cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(48),
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        #[test]
        fn store_matches_the_model(ops in proptest::collection::vec(arb_op(), 1..25)) {
            check(ops)?;
        }
    }
}
