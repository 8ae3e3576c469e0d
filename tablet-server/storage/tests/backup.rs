//! A backup's cut under concurrent writes and deletes, and its restore into a new table: every
//! write acknowledged before the cut is in the backup, none that started after it is, no row
//! is half-written, and the restore reads back what the cut held.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use basalt_model::{FamilySchema, Mutation, RowMutation, TableSchema};
use basalt_storage::{Store, StoreOptions};
use bytes::Bytes;

const INSTANCE: &str = "projects/p/instances/i";

fn table(store: &Store, name: &str, splits: Vec<Vec<u8>>) -> Arc<TableSchema> {
    let families: BTreeMap<String, FamilySchema> = ["a", "b"]
        .iter()
        .map(|f| {
            (
                f.to_string(),
                FamilySchema {
                    gc_rule: None,
                    aggregate: None,
                },
            )
        })
        .collect();
    store
        .create_table(
            &format!("{INSTANCE}/tables/{name}"),
            INSTANCE,
            families,
            splits,
            false,
        )
        .unwrap()
}

/// One row: three cells in two families, in one mutation.
fn put(store: &Store, t: &TableSchema, row: &str) {
    let set = |f: &str, q: &str| Mutation::SetCell {
        family: f.into(),
        qualifier: Bytes::copy_from_slice(q.as_bytes()),
        timestamp: 1000,
        value: Bytes::copy_from_slice(row.as_bytes()),
    };
    store
        .mutate(
            t,
            &[RowMutation {
                row: Bytes::copy_from_slice(row.as_bytes()),
                mutations: vec![set("a", "x"), set("a", "y"), set("b", "z")],
            }],
        )
        .unwrap();
}

fn delete(store: &Store, t: &TableSchema, row: &str) {
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

fn cell_count(store: &Store, t: &TableSchema, row: &str) -> usize {
    store.read_row(t, row.as_bytes()).unwrap().cells.len()
}

#[test]
fn a_cut_is_one_point_in_time_and_restores() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(dir.path(), StoreOptions::default()).unwrap());
    let source = table(&store, "src", vec![b"m".to_vec()]);
    for i in 0..300 {
        put(&store, &source, &format!("base{i:04}"));
    }
    let stop = Arc::new(AtomicBool::new(false));
    // (row, started, acknowledged) of every write and delete made while the cut is taken.
    let writers: Vec<_> = (0..3)
        .map(|w| {
            let (store, source, stop) = (store.clone(), source.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut done = Vec::new();
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    let row = if w == 2 {
                        let row = format!("base{i:04}");
                        delete(&store, &source, &row);
                        row
                    } else {
                        let row = format!("{}{w}-{i:06}", if i % 2 == 0 { "a" } else { "z" });
                        put(&store, &source, &row);
                        row
                    };
                    done.push((row, started, Instant::now()));
                    i += 1;
                    if w == 2 && i == 300 {
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_micros(200));
                }
                done
            })
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(30));
    let before = Instant::now();
    let mut entries: Vec<(usize, Vec<u8>, Vec<u8>)> = Vec::new();
    let cut = store
        .backup_scan(&source, &source.tablet_ranges(), None, &mut |r, k, v| {
            entries.push((r, k.to_vec(), v.to_vec()));
            Ok(())
        })
        .unwrap();
    let after = Instant::now();
    std::thread::sleep(std::time::Duration::from_millis(30));
    stop.store(true, Ordering::Relaxed);
    let done: Vec<_> = writers
        .into_iter()
        .enumerate()
        .flat_map(|(w, h)| h.join().unwrap().into_iter().map(move |d| (w, d)))
        .collect();

    // Every entry is at or below the cut; the ranges come in order.
    for (_, _, v) in &entries {
        let version = u64::from_be_bytes(v[..8].try_into().unwrap());
        assert!(version <= cut, "an entry above the cut");
    }
    assert!(
        entries
            .windows(2)
            .all(|w| w[0].0 <= w[1].0 && w[0].1 < w[1].1)
    );
    assert!(
        entries.iter().any(|e| e.0 == 1),
        "the second tablet is read"
    );

    let restored = table(&store, "restored", source.splits.clone());
    let work = dir.path().join("restore");
    let mut writer = store.restore_writer(&restored, &work).unwrap();
    for (_, k, v) in &entries {
        writer.put(k, v).unwrap();
    }
    writer.ingest().unwrap();

    let mut checked = (0, 0);
    for (w, (row, started, acked)) in &done {
        let cells = cell_count(&store, &restored, row);
        assert!(
            cells == 0 || cells == 3,
            "row {row} half-written: {cells} cells"
        );
        let deleting = *w == 2;
        if *acked < before {
            // Acknowledged before the cut was asked for: in the backup.
            assert_eq!(cells == 0, deleting, "{row} acknowledged before the cut");
            checked.0 += 1;
        } else if *started > after {
            // Started after the cut answered: not in the backup.
            assert_eq!(cells == 0, !deleting, "{row} started after the cut");
            checked.1 += 1;
        }
    }
    assert!(checked.0 > 10 && checked.1 > 10, "{checked:?}");
    // Rows written before the writers started are all there, unless deleted before the cut.
    let deleted_before: std::collections::HashSet<&str> = done
        .iter()
        .filter(|(w, (_, _, acked))| *w == 2 && *acked < before)
        .map(|(_, (row, _, _))| row.as_str())
        .collect();
    for i in 0..300 {
        let row = format!("base{i:04}");
        if !deleted_before.contains(row.as_str())
            && !done.iter().any(|(w, (r, _, _))| *w == 2 && *r == row)
        {
            assert_eq!(cell_count(&store, &restored, &row), 3, "{row}");
        }
    }
    // Later writes to the restored table are newer than every restored cell.
    put(&store, &restored, "base0000");
    assert_eq!(cell_count(&store, &restored, "base0000"), 3);
}

#[test]
fn entries_out_of_order_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    let t = table(&store, "t", vec![]);
    let mut writer = store.restore_writer(&t, &dir.path().join("r")).unwrap();
    writer.put(b"b", &[0; 12]).unwrap();
    assert!(writer.put(b"a", &[0; 12]).is_err());
}

#[test]
fn a_cut_at_a_chosen_value_moves_the_clock_and_refuses_a_past_one() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    let t = table(&store, "t", vec![]);
    put(&store, &t, "before");
    let at = store.clock_now() + 100_000;
    let mut rows = Vec::new();
    let cut = store
        .backup_scan(&t, &t.tablet_ranges(), Some(at), &mut |_, k, _| {
            rows.push(k.to_vec());
            Ok(())
        })
        .unwrap();
    assert_eq!(cut, at);
    assert_eq!(rows.len(), 3, "the row's three cells");
    // Every later write is above the cut.
    assert!(store.clock_now() >= at);
    put(&store, &t, "after");
    let past = store.clock_now() - 1;
    let refused = store.backup_scan(&t, &t.tablet_ranges(), Some(past), &mut |_, _, _| Ok(()));
    assert!(refused.is_err(), "a cut below the clock");
}

#[test]
fn a_restored_table_says_so_from_its_creation_until_its_restore_ends_and_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let name = format!("{INSTANCE}/tables/restored");
    let restore = basalt_model::RestoreInfo {
        backup: "projects/p/instances/i/clusters/c/backups/b".into(),
        source_table: format!("{INSTANCE}/tables/source"),
        source_backup: None,
        start_time_micros: 10,
        end_time_micros: 20,
        operation: Some("operations/restore-1".into()),
    };
    let id = {
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        let t = store
            .create_table_from(TableSchema {
                id: 0,
                name: name.clone(),
                families: BTreeMap::new(),
                dropped_families: BTreeMap::new(),
                deletion_protection: false,
                splits: vec![b"m".to_vec()],
                created_micros: 0,
                restore: Some(restore.clone()),
            })
            .unwrap();
        assert!(
            t.id > 0 && t.created_micros > 0,
            "the store gives the id and time"
        );
        assert_eq!(t.restoring(), Some("operations/restore-1"));
        t.id
    };
    // Written with the table: a server that stops mid-restore finds it again.
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    let t = store.table(&name).unwrap();
    assert_eq!(t.restore.as_ref(), Some(&restore));
    assert_eq!(t.splits, vec![b"m".to_vec()]);

    // Another table's id (the name deleted and created again meanwhile) is NOT_FOUND.
    let other = store.finish_restore(&name, id + 1).unwrap_err();
    assert_eq!(other.code(), basalt_model::Code::NotFound, "{other}");
    let done = store.finish_restore(&name, id).unwrap();
    assert_eq!(done.restoring(), None);
    assert_eq!(
        done.restore.as_ref().map(|r| r.backup.as_str()),
        Some(restore.backup.as_str()),
        "where it came from stays"
    );
    let again = store.finish_restore(&name, id).unwrap_err();
    assert_eq!(
        again.code(),
        basalt_model::Code::FailedPrecondition,
        "{again}"
    );
    drop(store);
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    assert_eq!(store.table(&name).unwrap().restoring(), None);
}
