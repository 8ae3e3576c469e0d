//! The Key Visualizer's model (issue 29): what the master pays per table and minute to merge
//! the servers' samples into a column and age the history, and what the page's API pays to
//! make a heatmap of a window.
//!
//! ```sh
//! cargo bench -p basalt-model --bench keyviz
//! ```
//!
//! A table on 3 servers: each reports 64 ranges of its own cut per minute, plus the sizes of
//! its share of 1,000 tablets. A window of 6 hours is 360 one-minute columns of up to 1,024
//! ranges; the heatmap has 1,000 buckets.

use std::hint::black_box;

use basalt_model::keyviz::{Column, Counts, Metric, RangeCounts, TableHistory, hottest, matrix};
use basalt_model::splitmix::SplitMix;
use bytes::Bytes;
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};

/// SplitMix64's first number from `z`.
fn mix(z: u64) -> u64 {
    SplitMix(z).next()
}

fn key(n: u64) -> Bytes {
    Bytes::from(format!("user{n:016x}"))
}

/// One minute's samples of 3 servers (64 ranges each, cut at their own keys) and the sizes of
/// 1,000 tablets. `churn`: each cut moves every 10 minutes (a tenth of them each minute, as an
/// even load's cuts drift); without, every cut is new every minute (the worst case: a column's
/// boundaries all differ from the others').
fn samples(minute: u64, churn: bool) -> Vec<RangeCounts> {
    let mut out = Vec::new();
    for server in 0..3u64 {
        let mut cuts: Vec<u64> = (0..63)
            .map(|i| {
                let epoch = if churn { (minute + i) / 10 } else { minute };
                mix(epoch * 1000 + server * 100 + i)
            })
            .collect();
        cuts.sort();
        let mut start = Bytes::new();
        for (i, cut) in cuts.iter().enumerate() {
            out.push(RangeCounts {
                start: start.clone(),
                end: key(*cut),
                counts: Counts {
                    reads: (mix(i as u64) % 1000) as f64,
                    writes: (mix(i as u64 + 7) % 1000) as f64,
                    bytes_written: 1e5,
                    ..Counts::default()
                },
            });
            start = key(*cut);
        }
        out.push(RangeCounts {
            start,
            end: Bytes::new(),
            counts: Counts {
                writes: 10.0,
                ..Counts::default()
            },
        });
    }
    let step = u64::MAX / 1000;
    for t in 0..1000u64 {
        out.push(RangeCounts {
            start: if t == 0 { Bytes::new() } else { key(t * step) },
            end: if t == 999 {
                Bytes::new()
            } else {
                key((t + 1) * step)
            },
            counts: Counts {
                stored_bytes: 1e9,
                ..Counts::default()
            },
        });
    }
    out
}

fn keyviz(c: &mut Criterion) {
    let mut g = c.benchmark_group("keyviz");
    g.bench_function(
        "a minute's column from 3 servers and 1,000 tablet sizes",
        |b| {
            b.iter_batched(
                || samples(1, true),
                |s| black_box(Column::from_samples(1, s)),
                BatchSize::LargeInput,
            )
        },
    );
    for churn in [true, false] {
        let mut history = TableHistory::new();
        for m in 0..360 {
            history.add(Column::from_samples(m, samples(m as u64, churn)));
        }
        let cuts = if churn {
            "cuts drifting"
        } else {
            "every cut new each minute"
        };
        // Every ten minutes the oldest ten one-minute columns become one ten-minute column.
        g.bench_function(
            format!("add a minute, age ten minutes into a slot (6 h of history, {cuts})"),
            |b| {
                b.iter_batched(
                    || {
                        (
                            history.clone(),
                            Column::from_samples(360, samples(360, churn)),
                        )
                    },
                    |(mut h, column)| {
                        h.add(column);
                        black_box(h.age(370));
                    },
                    BatchSize::LargeInput,
                )
            },
        );
        let columns = history.window(0, 360);
        g.sample_size(10);
        g.bench_function(
            format!("heatmap of 6 hours (360 columns), 1,000 buckets ({cuts})"),
            |b| {
                b.iter(|| {
                    let m = matrix(&columns, Metric::Ops, 1000);
                    black_box(hottest(&m, 10))
                })
            },
        );
    }
    g.finish();
}

criterion_group!(benches, keyviz);
criterion_main!(benches);
