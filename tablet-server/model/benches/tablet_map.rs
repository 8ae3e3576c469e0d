//! The frontend's tablet map at scale (issue 30): routing a row to its tablet, splitting a
//! `RowSet` by tablet, applying one change of the map in place, and rebuilding the whole map
//! (what a server's catalog mirror does today after every batch of etcd events), over one
//! table of up to a million tablets (the worst case for a lookup: every tablet in the table
//! searched). The map's memory is printed before each size's benchmarks.
//!
//! ```sh
//! cargo bench -p basalt-model --bench tablet_map                       # 10^4, 10^5, 10^6 tablets
//! BASALT_SCALE_TABLETS=1000000 cargo bench -p basalt-model --bench tablet_map -- tablet_for
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use basalt_model::splitmix::SplitMix as Keys;
use basalt_model::{RowRange, RowSet, Tablet, TabletMap, TabletState};
use bytes::Bytes;
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};

/// Counts the bytes live, for the map's memory.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size, Ordering::Relaxed);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Row keys as a client writes them: `user` and 16 hex digits.
fn row(x: u64) -> Bytes {
    Bytes::from(format!("user{x:016x}"))
}

/// One table of `n` tablets split at evenly spread keys, owned round-robin by 1,000 servers
/// with store ids of the real length.
fn tablets(n: usize) -> Vec<Tablet> {
    let step = u64::MAX / n as u64;
    (0..n)
        .map(|i| Tablet {
            table: "table-00000".into(),
            range: RowRange::new(
                if i == 0 {
                    Bytes::new()
                } else {
                    row(step * i as u64)
                },
                (i + 1 < n).then(|| row(step * (i + 1) as u64)),
            ),
            epoch: 1,
            owner: format!("st-{:016x}", (i % 1000) as u64 * 0x9e37_79b9),
            state: TabletState::Serving,
        })
        .collect()
}

/// The tablet of `table-00000` holding row `x`, moved to `owner` (its epoch raised).
fn moved_tablet(map: &TabletMap, x: u64, owner: &str) -> Tablet {
    let mut t = map
        .tablet_for("table-00000", &row(x))
        .expect("covered")
        .clone();
    t.epoch += 1;
    t.owner = owner.into();
    t
}

fn sizes() -> Vec<usize> {
    match std::env::var("BASALT_SCALE_TABLETS") {
        Ok(list) if !list.is_empty() => list
            .split(',')
            .map(|n| n.trim().parse().expect("BASALT_SCALE_TABLETS: N,N,…"))
            .collect(),
        _ => vec![10_000, 100_000, 1_000_000],
    }
}

fn tablet_map(c: &mut Criterion) {
    for n in sizes() {
        let all = tablets(n);
        let before = LIVE.load(Ordering::Relaxed);
        let map = TabletMap::new(all.clone()).expect("covers the table");
        let bytes = LIVE.load(Ordering::Relaxed) - before;
        eprintln!(
            "tablet map of {n} tablets: {:.1} MiB, {:.0} bytes per tablet",
            bytes as f64 / (1 << 20) as f64,
            bytes as f64 / n as f64
        );
        let mut group = c.benchmark_group(format!("tablet_map/{n}"));
        group
            .warm_up_time(Duration::from_secs(1))
            .measurement_time(Duration::from_secs(3));

        // MutateRow, ReadRow: one row to its tablet.
        let mut keys = Keys(7);
        group.bench_function("tablet_for", |b| {
            b.iter_batched(
                || row(keys.next()),
                |r| black_box(map.tablet_for("table-00000", &r).map(|t| t.epoch)),
                BatchSize::SmallInput,
            )
        });

        // MutateRows of 100 rows: the rows by tablet.
        let mut keys = Keys(8);
        group.bench_function("split_100_rows", |b| {
            b.iter_batched(
                || {
                    let rows: Vec<Bytes> = (0..100).map(|_| row(keys.next())).collect();
                    RowSet::from_keys(rows.iter().map(|r| &r[..]))
                },
                |set| black_box(map.split("table-00000", &set, false).len()),
                BatchSize::SmallInput,
            )
        });

        // A scan over about ten tablets.
        let mut keys = Keys(9);
        let span = u64::MAX / n as u64 * 10;
        group.bench_function("split_range_10_tablets", |b| {
            b.iter_batched(
                || {
                    let start = keys.next() % (u64::MAX - span);
                    RowSet::from_ranges([RowRange::new(row(start), Some(row(start + span)))])
                },
                |set| black_box(map.split("table-00000", &set, false).len()),
                BatchSize::SmallInput,
            )
        });

        // A move arrives: the tablet in place, same count.
        let mut moved = map.clone();
        let mut keys = Keys(10);
        group.bench_function("replace_move", |b| {
            b.iter_batched(
                || moved_tablet(&map, keys.next(), "st-0000000000000001"),
                |t| moved.replace(vec![t]).expect("fits"),
                BatchSize::SmallInput,
            )
        });

        // A split arrives and, to keep the size, the merge of its halves: two changes that
        // shift the table's later tablets.
        let mut split = map.clone();
        let mut keys = Keys(11);
        group.bench_function("replace_split_then_merge", |b| {
            b.iter_batched(
                || {
                    // The original map's tablets: each iteration leaves `split` as it was.
                    let t = map
                        .tablet_for("table-00000", &row(keys.next()))
                        .expect("covered")
                        .clone();
                    let mut at = t.range.start.to_vec();
                    at.push(0);
                    let at = Bytes::from(at);
                    let left = Tablet {
                        range: RowRange::new(t.range.start.clone(), Some(at.clone())),
                        ..t.clone()
                    };
                    let right = Tablet {
                        range: RowRange::new(at, t.range.end.clone()),
                        ..t.clone()
                    };
                    (t, left, right)
                },
                |(whole, left, right)| {
                    split.replace(vec![left, right]).expect("halves fit");
                    split.replace(vec![whole]).expect("merge fits");
                },
                BatchSize::SmallInput,
            )
        });

        // What a follower of the map does per move now (the catalog mirror, the master):
        // the changed record applied in place, then the map published — a clone that shares
        // every table, so the next change copies the table it changes (here the only one,
        // of all n tablets).
        let mut followed = map.clone();
        let mut published = followed.clone();
        let mut keys = Keys(12);
        group.sample_size(10);
        group.bench_function("apply_move_and_publish", |b| {
            b.iter_batched(
                || moved_tablet(&map, keys.next(), "st-0000000000000002"),
                |t| {
                    followed
                        .apply("table-00000", [(t.range.end.clone(), Some(t))])
                        .expect("fits");
                    published = black_box(followed.clone());
                },
                BatchSize::SmallInput,
            )
        });

        // What the catalog mirror did after every batch of etcd events before it followed
        // the map: the whole map anew (from tablets already decoded; reading and decoding
        // them from etcd came on top).
        group.bench_function("rebuild", |b| {
            b.iter_batched(
                || all.clone(),
                |tablets| black_box(TabletMap::new(tablets).expect("covers")),
                BatchSize::LargeInput,
            )
        });
        group.finish();
    }
}

criterion_group!(benches, tablet_map);
criterion_main!(benches);
