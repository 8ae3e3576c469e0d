//! The storage side of a tablet move on real RocksDB stores: a capture's snapshot and log
//! together hold every write exactly once (no write in both, none in neither) while writers
//! keep writing; a fence refuses new writes with a retryable "moving" and returns the last
//! sequence; the destination, after ingesting the snapshot and applying the log, holds exactly
//! what the source holds — cells, deletions and aggregate sums.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use basalt_model::aggregate::Aggregator;
use basalt_model::{Mutation, RowMutation, RowRange, RowSet, TableSchema};
use basalt_storage::Store;
use bytes::Bytes;
use common::{TABLE, family, open, range, set};

fn create(store: &Store) -> Arc<TableSchema> {
    common::create(
        store,
        [family("cf", None), family("sum", Some(Aggregator::Sum))],
        &[],
    )
}

fn add(row: &str, input: i64) -> RowMutation {
    RowMutation {
        row: Bytes::copy_from_slice(row.as_bytes()),
        mutations: vec![Mutation::Aggregate {
            family: "sum".into(),
            qualifier: Bytes::from_static(b"n"),
            timestamp: 0,
            aggregator: Aggregator::Sum,
            input,
        }],
    }
}

/// Every cell of `range`: (row, family, value).
fn dump(store: &Store, t: &TableSchema, range: &RowRange) -> Vec<(Bytes, String, Bytes)> {
    store
        .rows(t, &RowSet::from_ranges([range.clone()]), false)
        .flat_map(|r| {
            let r = r.unwrap();
            r.cells
                .into_iter()
                .map(move |c| (r.key.clone(), c.family.to_string(), c.value))
        })
        .collect()
}

#[test]
fn snapshot_and_log_hold_every_write_exactly_once_while_writers_write() {
    let (a_dir, b_dir, files) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let a = Arc::new(open(a_dir.path()));
    let b = open(b_dir.path());
    let ta = create(&a);
    let tb = b.install_schema((*ta).clone()).unwrap();
    let moving = range("k", Some("p"));
    for i in 0..300 {
        a.mutate(&ta, &[set(&format!("k{i:03}"), "before")])
            .unwrap();
    }

    // Writers: sets (rows inside and outside the range), deletes and increments, until the
    // fence refuses them.
    let stop = Arc::new(AtomicBool::new(false));
    let acked_sum = Arc::new(AtomicU64::new(0));
    let writers: Vec<_> = (0..3)
        .map(|w| {
            let (a, ta, stop, acked_sum) = (a.clone(), ta.clone(), stop.clone(), acked_sum.clone());
            std::thread::spawn(move || {
                let mut refused = 0;
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let row = format!("{}{:03}", ["k", "m", "z"][w], i % 400);
                    let result = if i.is_multiple_of(7) {
                        a.mutate(
                            &ta,
                            &[RowMutation {
                                row: Bytes::from(row.clone()),
                                mutations: vec![Mutation::DeleteFromRow],
                            }],
                        )
                    } else {
                        a.mutate(&ta, &[set(&row, &format!("w{w}-{i}"))])
                    };
                    if let Err(e) = &result {
                        assert!(e.to_string().contains("moves to another server"), "{e}");
                        refused += 1;
                    }
                    match a.mutate(&ta, &[add("m-counter", 1)]) {
                        Ok(()) => {
                            acked_sum.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            assert!(e.to_string().contains("moves to another server"), "{e}");
                            refused += 1;
                        }
                    }
                }
                refused
            })
        })
        .collect();

    std::thread::sleep(std::time::Duration::from_millis(50));
    let (capture, sst) = a
        .start_capture(&ta, &moving, files.path(), &mut |_| Ok(()))
        .unwrap();
    assert!(!sst.is_empty());
    b.delete_range(&tb, &moving).unwrap();
    b.ingest(&sst).unwrap();
    // Catch up while the writers write.
    let mut applied = 0;
    for _ in 0..20 {
        let records = a.take_log(capture, applied, 1 << 20).unwrap();
        if let Some(last) = records.last() {
            assert_eq!(
                records[0].seq,
                applied + 1,
                "records come in order, none missing"
            );
            applied = last.seq;
        }
        b.apply_log(&records).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let fenced = a.fence(capture, &ta, &moving, "t[k..p)").unwrap();
    // A fenced range refuses writes, retryably; other rows are still written.
    let e = a
        .mutate(&ta, &[set("k001", "after the fence")])
        .unwrap_err();
    assert_eq!(e.code(), basalt_model::Code::Unavailable);
    a.mutate(&ta, &[set("z999", "outside")]).unwrap();
    let rest = a.take_log(capture, applied, usize::MAX).unwrap();
    assert!(rest.last().is_none_or(|r| r.seq == fenced.seq));
    b.apply_log(&rest).unwrap();
    b.observe_clock(fenced.clock).unwrap();
    stop.store(true, Ordering::Relaxed);
    let refused: usize = writers.into_iter().map(|w| w.join().unwrap()).sum();
    assert!(refused > 0, "the writers ran into the fence");

    assert!(fenced.seq > 0, "writes were captured");
    // A fenced range refuses reads too (its owner is about to change).
    let e = a.read_row(&ta, b"k001").unwrap_err();
    assert_eq!(e.code(), basalt_model::Code::Unavailable);
    // No writer is left: the fence is lifted to compare both sides.
    a.unfence(&ta, &moving);
    let source = dump(&a, &ta, &moving);
    let destination = dump(&b, &tb, &moving);
    assert_eq!(source.len(), destination.len());
    assert_eq!(source, destination, "the destination is an exact copy");
    // The counter: every acknowledged increment counted exactly once on both sides.
    let counter = |s: &Store, t: &TableSchema| {
        let row = s.read_row(t, b"m-counter").unwrap();
        i64::from_be_bytes(row.cells[0].value[..].try_into().unwrap())
    };
    assert_eq!(counter(&a, &ta), acked_sum.load(Ordering::Relaxed) as i64);
    assert_eq!(counter(&b, &tb), acked_sum.load(Ordering::Relaxed) as i64);
    // Nothing outside the range went to the destination.
    assert!(dump(&b, &tb, &range("p", None)).is_empty());

    // The source gives the range up. A read whose snapshot was taken before still sees every
    // row; anything routed here afterwards (by an older tablet map) is refused, never applied
    // to or answered from the deleted range.
    let before = a.rows(&ta, &RowSet::from_ranges([moving.clone()]), false);
    a.fence(capture, &ta, &moving, "t[k..p)").unwrap();
    a.end_capture(capture);
    a.release(&ta, &moving).unwrap();
    let seen: Vec<Bytes> = before.map(|r| r.unwrap().key).collect();
    assert_eq!(
        seen.len(),
        source
            .iter()
            .map(|c| &c.0)
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        "the earlier snapshot reads the released rows"
    );
    for e in [
        a.mutate(&ta, &[set("k001", "after the release")])
            .unwrap_err(),
        a.read_row(&ta, b"k001").unwrap_err(),
        a.read_modify_write(&ta, &Bytes::from("k001"), |_| Ok((vec![], ())))
            .unwrap_err(),
    ] {
        assert_eq!(e.code(), basalt_model::Code::Unavailable);
        assert!(
            e.to_string().starts_with("this server does not serve row"),
            "{e}"
        );
    }
    assert!(a.read_row(&ta, b"z999").is_ok(), "other rows are served");
    // The tablet map names this server again (the tablet came back, or a loss was accepted).
    assert!(a.serve(&ta, &moving));
    assert!(dump(&a, &ta, &moving).is_empty());
    a.mutate(&ta, &[set("k001", "writable again")]).unwrap();
    assert!(a.take_log(capture, 0, 1).is_err(), "the capture ended");
}

#[test]
fn an_aborted_capture_leaves_the_source_as_it_was() {
    let (a_dir, files) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = open(a_dir.path());
    let ta = create(&a);
    a.mutate(&ta, &[set("k1", "v")]).unwrap();
    let moving = range("", None);
    let (capture, _sst) = a
        .start_capture(&ta, &moving, files.path(), &mut |_| Ok(()))
        .unwrap();
    a.mutate(&ta, &[set("k2", "v")]).unwrap();
    a.drop_row_range(TABLE, Some(b"k1")).unwrap();
    let log = a.take_log(capture, 0, usize::MAX).unwrap();
    assert_eq!(log.len(), 2, "the write and the range deletion are logged");
    a.fence(capture, &ta, &moving, "t").unwrap();
    assert!(a.mutate(&ta, &[set("k3", "v")]).is_err());
    a.end_capture(capture);
    a.unfence(&ta, &moving);
    a.mutate(&ta, &[set("k3", "v")]).unwrap();
    let rows: Vec<Bytes> = dump(&a, &ta, &moving).into_iter().map(|c| c.0).collect();
    assert_eq!(rows, [Bytes::from("k2"), Bytes::from("k3")]);
}
