//! Storage-path benchmarks: Basalt's `Store` next to a plain RocksDB opened with the same
//! options (`storage::db_options`, `storage::data_cf_options`), doing the same work, so the
//! cost of Basalt's key/value encoding, row locks, versions, version trimming and GC-aware row
//! assembly shows as a ratio.
//!
//! Run (the release profile, as every build of the project):
//!
//! ```sh
//! cargo bench -p basalt-tablet-server --bench storage
//! ```
//!
//! Data: 1 KiB incompressible values, hash-spread row keys, flushed to SST files before the
//! reads. Writes are synced (`sync = true`) on both sides, as the server acknowledges them.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;

use basalt_model::gc::GcRule;
use basalt_model::hlc::now_micros;
use basalt_model::splitmix::mix;
use basalt_model::{
    FamilyChange, FamilySchema, Mutation, RowMutation, RowRange, RowSet, TableSchema,
};
use basalt_storage::{self as storage, Store, StoreOptions};
use bytes::Bytes;
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use rocksdb::{ColumnFamilyDescriptor, DB, ReadOptions, WriteBatch, WriteOptions};

const TABLE: &str = "projects/bench/instances/bench/tables/t";
const ROWS: u64 = 20_000;
const VALUE: usize = 1024;
const BATCH: u64 = 100;
const SCAN: usize = 100;

fn row_key(i: u64) -> Bytes {
    Bytes::from(format!("user{:016x}", mix(i)))
}

/// Incompressible bytes to slice values from.
fn random_bytes() -> Bytes {
    let mut out = Vec::with_capacity((1 << 20) + VALUE);
    let mut x = 1u64;
    while out.len() < (1 << 20) + VALUE {
        x = mix(x);
        out.extend_from_slice(&x.to_le_bytes());
    }
    Bytes::from(out)
}

fn value(random: &Bytes, i: u64) -> Bytes {
    let off = (mix(i ^ 0xabcdef) % (1 << 20)) as usize;
    random.slice(off..off + VALUE)
}

/// Plain key-order iteration (the data column family has a prefix extractor).
fn total_order() -> ReadOptions {
    let mut opts = ReadOptions::default();
    opts.set_total_order_seek(true);
    opts
}

struct Next(u64);
impl Next {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = mix(self.0.wrapping_add(1));
        self.0 % n
    }
}

// ------------------------------------------------------------------------------ Basalt

fn basalt(dir: &Path, gc: Option<GcRule>) -> (Store, Arc<TableSchema>) {
    let store = Store::open(dir, StoreOptions::default()).expect("open store");
    let families: BTreeMap<String, FamilySchema> = [(
        "cf".to_string(),
        FamilySchema {
            gc_rule: gc,
            aggregate: None,
        },
    )]
    .into();
    let table = store
        .create_table(
            TABLE,
            "projects/bench/instances/bench",
            families,
            vec![],
            false,
        )
        .expect("create table");
    (store, table)
}

fn set_cell(v: Bytes, ts: i64) -> Mutation {
    Mutation::SetCell {
        family: "cf".into(),
        qualifier: Bytes::from_static(b"field0"),
        timestamp: ts,
        value: v,
    }
}

fn basalt_rows(random: &Bytes, rows: impl Iterator<Item = u64>, ts: i64) -> Vec<RowMutation> {
    rows.map(|i| RowMutation {
        row: row_key(i),
        mutations: vec![set_cell(value(random, i), ts)],
    })
    .collect()
}

fn basalt_load(store: &Store, table: &TableSchema, random: &Bytes, versions: i64) {
    for v in 0..versions {
        let ts = 1_000_000 + v * 1000;
        for start in (0..ROWS).step_by(1000) {
            store
                .mutate(table, &basalt_rows(random, start..start + 1000, ts))
                .expect("load");
        }
    }
    store.flush().expect("flush");
}

// ------------------------------------------------------------------------------ RocksDB

fn raw(dir: &Path) -> DB {
    let cfs = vec![ColumnFamilyDescriptor::new(
        "data",
        storage::data_cf_options(storage::DEFAULT_BLOCK_CACHE_BYTES),
    )];
    DB::open_cf_descriptors(&storage::db_options(), dir, cfs).expect("open rocksdb")
}

fn synced() -> WriteOptions {
    let mut o = WriteOptions::default();
    o.set_sync(true);
    o
}

fn raw_write(db: &DB, random: &Bytes, rows: impl Iterator<Item = u64>) {
    let cf = db.cf_handle("data").unwrap();
    let mut batch = WriteBatch::default();
    for i in rows {
        batch.put_cf(cf, row_key(i), value(random, i));
    }
    db.write_opt(batch, &synced()).expect("write");
}

/// Raw layout for the GC-filtered read: `versions` keys per row (row key + inverted
/// timestamp), the newest first, as a row-and-version store would lay them out.
fn raw_versioned_key(i: u64, v: i64) -> Vec<u8> {
    let mut k = row_key(i).to_vec();
    k.push(0);
    k.extend_from_slice(&(!(v as u64)).to_be_bytes());
    k
}

fn raw_load(db: &DB, random: &Bytes, versions: i64) {
    let cf = db.cf_handle("data").unwrap();
    for v in 0..versions {
        for start in (0..ROWS).step_by(1000) {
            let mut batch = WriteBatch::default();
            for i in start..start + 1000 {
                if versions == 1 {
                    batch.put_cf(cf, row_key(i), value(random, i));
                } else {
                    batch.put_cf(cf, raw_versioned_key(i, v), value(random, i));
                }
            }
            db.write_opt(batch, &synced()).expect("load");
        }
    }
    db.flush_cf(cf).expect("flush");
}

// ------------------------------------------------------------------------------ benches

fn writes(c: &mut Criterion) {
    let random = random_bytes();
    let dir = tempfile::tempdir().unwrap();
    let (store, table) = basalt(&dir.path().join("basalt"), Some(GcRule::MaxNumVersions(1)));
    let plain_dir = dir.path().join("basalt-no-gc");
    let (plain_store, plain_table) = basalt(&plain_dir, None);
    // The same as `basalt`, with the change log on: each write also logged, in the same batch.
    let (logged_store, logged_table) = basalt(
        &dir.path().join("basalt-logged"),
        Some(GcRule::MaxNumVersions(1)),
    );
    logged_store.set_change_log(true);
    let db = raw(&dir.path().join("rocksdb"));
    let mut next = Next(1);

    let mut g = c.benchmark_group("write_1row_sync");
    g.throughput(Throughput::Elements(1));
    g.sample_size(30);
    g.bench_function("basalt", |b| {
        b.iter(|| {
            let i = next.next(ROWS);
            store
                .mutate(&table, &basalt_rows(&random, i..i + 1, now_micros()))
                .unwrap()
        })
    });
    g.bench_function("basalt_change_log", |b| {
        b.iter(|| {
            let i = next.next(ROWS);
            logged_store
                .mutate(&logged_table, &basalt_rows(&random, i..i + 1, now_micros()))
                .unwrap()
        })
    });
    g.bench_function("rocksdb", |b| {
        b.iter(|| {
            let i = next.next(ROWS);
            raw_write(&db, &random, i..i + 1)
        })
    });
    g.finish();

    let mut g = c.benchmark_group("write_batch100_sync");
    g.throughput(Throughput::Elements(BATCH));
    g.sample_size(20);
    g.bench_function("basalt", |b| {
        b.iter(|| {
            let rows: Vec<u64> = (0..BATCH).map(|_| next.next(ROWS)).collect();
            store
                .mutate(
                    &table,
                    &basalt_rows(&random, rows.into_iter(), now_micros()),
                )
                .unwrap()
        })
    });
    g.bench_function("basalt_change_log", |b| {
        b.iter(|| {
            let rows: Vec<u64> = (0..BATCH).map(|_| next.next(ROWS)).collect();
            logged_store
                .mutate(
                    &logged_table,
                    &basalt_rows(&random, rows.into_iter(), now_micros()),
                )
                .unwrap()
        })
    });
    // A family without a version rule: no per-column lookup to trim older versions.
    g.bench_function("basalt_no_gc_rule", |b| {
        b.iter(|| {
            let rows: Vec<u64> = (0..BATCH).map(|_| next.next(ROWS)).collect();
            plain_store
                .mutate(
                    &plain_table,
                    &basalt_rows(&random, rows.into_iter(), now_micros()),
                )
                .unwrap()
        })
    });
    g.bench_function("rocksdb", |b| {
        b.iter(|| {
            let rows: Vec<u64> = (0..BATCH).map(|_| next.next(ROWS)).collect();
            raw_write(&db, &random, rows.into_iter())
        })
    });
    g.finish();
}

fn reads(c: &mut Criterion) {
    let random = random_bytes();
    let dir = tempfile::tempdir().unwrap();
    let (store, table) = basalt(&dir.path().join("basalt"), Some(GcRule::MaxNumVersions(1)));
    basalt_load(&store, &table, &random, 1);
    let db = raw(&dir.path().join("rocksdb"));
    raw_load(&db, &random, 1);
    let cf = db.cf_handle("data").unwrap();
    let mut next = Next(2);

    let mut g = c.benchmark_group("point_read");
    g.throughput(Throughput::Elements(1));
    g.bench_function("basalt", |b| {
        b.iter(|| {
            let row = store.read_row(&table, &row_key(next.next(ROWS))).unwrap();
            assert_eq!(row.cells.len(), 1);
            black_box(row)
        })
    });
    g.bench_function("rocksdb_get", |b| {
        b.iter(|| {
            let v = db
                .get_pinned_cf(cf, row_key(next.next(ROWS)))
                .unwrap()
                .expect("present");
            black_box(Bytes::copy_from_slice(&v))
        })
    });
    g.finish();

    let mut g = c.benchmark_group("scan_100rows");
    g.throughput(Throughput::Elements(SCAN as u64));
    g.bench_function("basalt", |b| {
        b.iter(|| {
            let start = row_key(next.next(ROWS));
            let rows = RowSet::from_ranges([RowRange::new(start, None)]);
            let mut n = 0;
            for r in store.rows(&table, &rows, false).take(SCAN) {
                black_box(r.unwrap());
                n += 1;
            }
            n
        })
    });
    g.bench_function("rocksdb", |b| {
        b.iter(|| {
            let mut it = db.raw_iterator_cf_opt(cf, total_order());
            it.seek(row_key(next.next(ROWS)));
            let mut n = 0;
            while let (Some(k), Some(v)) = (it.key(), it.value()) {
                black_box((Bytes::copy_from_slice(k), Bytes::copy_from_slice(v)));
                n += 1;
                if n == SCAN {
                    break;
                }
                it.next();
            }
            n
        })
    });
    g.finish();
}

/// Reads of rows holding three versions of a cell in a family whose rule keeps one: Basalt
/// hides the two collectable versions at read time (before any compaction).
fn gc_filtered_reads(c: &mut Criterion) {
    let random = random_bytes();
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = basalt(&dir.path().join("basalt"), None);
    let plain = store.table(TABLE).unwrap();
    basalt_load(&store, &plain, &random, 3);
    let table = store
        .modify_column_families(
            TABLE,
            &[FamilyChange::Update {
                id: "cf".into(),
                gc_rule: Some(GcRule::MaxNumVersions(1)),
                aggregate: None,
            }],
        )
        .unwrap();
    let db = raw(&dir.path().join("rocksdb"));
    raw_load(&db, &random, 3);
    let cf = db.cf_handle("data").unwrap();
    let mut next = Next(3);

    let mut g = c.benchmark_group("gc_filtered_read");
    g.throughput(Throughput::Elements(1));
    g.bench_function("basalt", |b| {
        b.iter(|| {
            let row = store.read_row(&table, &row_key(next.next(ROWS))).unwrap();
            assert_eq!(row.cells.len(), 1);
            black_box(row)
        })
    });
    g.bench_function("rocksdb", |b| {
        // Seek to the row's newest version and read it; skip the older ones.
        b.iter_batched(
            || row_key(next.next(ROWS)),
            |row| {
                let mut it = db.raw_iterator_cf_opt(cf, total_order());
                it.seek(&row);
                let (k, v) = (it.key().unwrap(), it.value().unwrap());
                assert!(k.starts_with(&row));
                black_box(Bytes::copy_from_slice(v))
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group!(benches, writes, reads, gc_filtered_reads);
criterion_main!(benches);
