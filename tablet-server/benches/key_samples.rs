//! The Key Visualizer's sampling on the request path (issue 29): what counting one request
//! costs a tablet server, next to the tablet-load counting every request already pays
//! (`load::TabletLoads`), and what closing and reporting a minute costs.
//!
//! ```sh
//! cargo bench -p basalt-tablet-server --bench key_samples
//! ```
//!
//! A table's window is in its steady state: 64 ranges cut from the previous minute's keys (a
//! table's first minute is one range), the reservoir full (every request after the 1,024th
//! draws a slot). Keys are hash-spread `user…` keys, so every range is requested.

use std::hint::black_box;
use std::time::Instant;

use basalt_model::splitmix::SplitMix;
use basalt_model::{RowSet, TableSchema};
use basalt_tablet_server::key_samples::KeySampler;
use basalt_tablet_server::load::TabletLoads;
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};

/// SplitMix64's first number from `z`.
fn mix(z: u64) -> u64 {
    SplitMix(z).next()
}

fn key(i: u64) -> Vec<u8> {
    format!("user{:016x}", mix(i)).into_bytes()
}

fn table() -> TableSchema {
    TableSchema {
        id: 1,
        name: "projects/bench/instances/bench/tables/t".into(),
        families: Default::default(),
        dropped_families: Default::default(),
        deletion_protection: false,
        splits: (1..16u64)
            .map(|i| format!("user{:016x}", i << 60).into_bytes())
            .collect(),
        created_micros: 0,
        restore: None,
    }
}

/// A sampler whose window of minute 2 has the ranges cut from minute 1's 20,000 writes, and
/// a full reservoir.
fn steady(t: &TableSchema) -> KeySampler {
    let s = KeySampler::new();
    for minute in 0..2 {
        for i in 0..20_000u64 {
            s.wrote_at(t, [(key(i).as_slice(), 100)], minute);
        }
    }
    s
}

fn counting(c: &mut Criterion) {
    let t = table();
    let s = steady(&t);
    let loads = TabletLoads::new();
    let keys: Vec<Vec<u8>> = (0..4096).map(key).collect();
    let mut g = c.benchmark_group("count");
    let mut i = 0usize;
    g.bench_function("tablet load: a row written", |b| {
        b.iter(|| {
            i = (i + 1) & 4095;
            loads.write(&t, black_box(&keys[i]));
        })
    });
    g.bench_function("key samples: a row written", |b| {
        b.iter(|| {
            i = (i + 1) & 4095;
            s.wrote_at(&t, [(black_box(keys[i].as_slice()), 100)], 2);
        })
    });
    let reads: Vec<RowSet> = keys
        .iter()
        .map(|k| RowSet::from_keys([k.as_slice()]))
        .collect();
    g.bench_function("key samples: a row key read", |b| {
        b.iter(|| {
            i = (i + 1) & 4095;
            s.read_at(&t, black_box(&reads[i]), 2);
        })
    });
    g.bench_function("key samples: a MutateRows of 100 rows", |b| {
        b.iter(|| {
            i = (i + 100) & 4095;
            let rows = keys[i..(i + 100).min(4096)]
                .iter()
                .map(|k| (k.as_slice(), 100));
            s.wrote_at(&t, rows, 2);
        })
    });
    g.finish();

    // Two threads writing at once (the atomics and the reservoir's lock shared): each counts
    // 200,000 rows of keys made beforehand.
    let s = steady(&t);
    let per_thread: Vec<Vec<Vec<u8>>> = (0..2u64)
        .map(|n| (0..200_000u64).map(|i| key(i * 2 + n)).collect())
        .collect();
    let started = Instant::now();
    std::thread::scope(|scope| {
        for keys in &per_thread {
            let (s, t) = (&s, &t);
            scope.spawn(move || {
                for k in keys {
                    s.wrote_at(t, [(k.as_slice(), 100)], 2);
                }
            });
        }
    });
    let wall = started.elapsed().as_nanos() as f64;
    println!(
        "count/key samples, 2 threads at once: {:.0} ns per row of each thread",
        wall / 200_000.0
    );
}

fn closing(c: &mut Criterion) {
    let t = table();
    let mut g = c.benchmark_group("minute");
    g.bench_function("close and report a table's minute (64 ranges)", |b| {
        b.iter_batched(
            || steady(&t),
            |s| black_box(s.samples_at(0, 1, 3)),
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

criterion_group!(benches, counting, closing);
criterion_main!(benches);
