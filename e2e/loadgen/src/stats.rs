//! Per-operation HDR latency histograms, error counts by status code, and the report (a
//! readable table plus one JSON line).

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use serde_json::{Value, json};

/// Latencies are recorded in microseconds, 1 µs to 10 minutes, 3 significant digits.
fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds")
}

/// What one operation kind did.
pub struct OpStats {
    pub latency_us: Histogram<u64>,
    /// Operations that succeeded.
    pub ok: u64,
    /// Rows written or returned by the successful operations.
    pub rows: u64,
    /// Cell value bytes written or returned.
    pub bytes: u64,
    /// Point reads that found no row (not an error: e.g. a key not loaded).
    pub misses: u64,
}

impl Default for OpStats {
    fn default() -> Self {
        OpStats {
            latency_us: histogram(),
            ok: 0,
            rows: 0,
            bytes: 0,
            misses: 0,
        }
    }
}

impl OpStats {
    fn merge(&mut self, other: &OpStats) {
        self.latency_us
            .add(&other.latency_us)
            .expect("histograms share bounds");
        self.ok += other.ok;
        self.rows += other.rows;
        self.bytes += other.bytes;
        self.misses += other.misses;
    }
}

/// Everything one worker (or all of them, merged) measured.
#[derive(Default)]
pub struct Stats {
    /// By operation name (read, update, insert, scan, read-modify-write, write, batch-write).
    pub ops: BTreeMap<&'static str, OpStats>,
    /// Failed operations by gRPC status code name (a MutateRows batch with failed entries
    /// counts once, under the first failing entry's code).
    pub errors: BTreeMap<String, u64>,
}

impl Stats {
    pub fn record(&mut self, op: &'static str, micros: u64, outcome: &Outcome) {
        let s = self.ops.entry(op).or_default();
        s.latency_us.saturating_record(micros.max(1));
        match outcome {
            Outcome::Ok { rows, bytes, miss } => {
                s.ok += 1;
                s.rows += rows;
                s.bytes += bytes;
                s.misses += u64::from(*miss);
            }
            Outcome::Failed(code) => *self.errors.entry(format!("{code:?}")).or_default() += 1,
        }
    }

    pub fn merge(&mut self, other: &Stats) {
        for (op, s) in &other.ops {
            self.ops.entry(op).or_default().merge(s);
        }
        for (code, n) in &other.errors {
            *self.errors.entry(code.clone()).or_default() += n;
        }
    }

    pub fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }
}

pub enum Outcome {
    Ok { rows: u64, bytes: u64, miss: bool },
    Failed(tonic::Code),
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

fn latency_json(h: &Histogram<u64>) -> Value {
    json!({
        "p50": ms(h.value_at_quantile(0.50)),
        "p90": ms(h.value_at_quantile(0.90)),
        "p99": ms(h.value_at_quantile(0.99)),
        "p999": ms(h.value_at_quantile(0.999)),
        "max": ms(h.max()),
        "mean": h.mean() / 1000.0,
    })
}

/// The settings a report describes.
pub struct RunInfo<'a> {
    pub phase: &'a str,
    pub workload: &'a str,
    pub distribution: &'a str,
    pub concurrency: usize,
    pub connections: usize,
    pub records: u64,
    pub row_size: usize,
    pub columns: usize,
    pub endpoint: &'a str,
    pub table: &'a str,
}

/// Prints the readable table and returns the JSON object of the run.
pub fn report(info: &RunInfo, stats: &Stats, seconds: f64) -> Value {
    let mut all = OpStats::default();
    for s in stats.ops.values() {
        all.merge(s);
    }
    let errors = stats.error_count();
    let total_ops = all.latency_us.len();
    let secs = seconds.max(1e-9);
    println!(
        "\n{} phase, workload {} — distribution {}, concurrency {} over {} connection(s), {} records of {} B in {} column(s), {:.1} s",
        info.phase,
        info.workload,
        info.distribution,
        info.concurrency,
        info.connections,
        info.records,
        info.row_size,
        info.columns,
        seconds
    );
    println!(
        "{:<18} {:>10} {:>10} {:>11} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9}",
        "operation",
        "ops",
        "ops/s",
        "rows/s",
        "MB/s",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "p99.9 ms",
        "max ms"
    );
    let line = |name: &str, s: &OpStats| {
        let h = &s.latency_us;
        println!(
            "{:<18} {:>10} {:>10.0} {:>11.0} {:>8.1} {:>8.2} {:>8.2} {:>8.2} {:>9.2} {:>9.2}",
            name,
            h.len(),
            h.len() as f64 / secs,
            s.rows as f64 / secs,
            s.bytes as f64 / secs / 1e6,
            ms(h.value_at_quantile(0.50)),
            ms(h.value_at_quantile(0.90)),
            ms(h.value_at_quantile(0.99)),
            ms(h.value_at_quantile(0.999)),
            ms(h.max()),
        );
    };
    for (op, s) in &stats.ops {
        line(op, s);
    }
    if stats.ops.len() > 1 {
        line("all", &all);
    }
    let misses: u64 = stats.ops.values().map(|s| s.misses).sum();
    println!(
        "errors: {errors}{}{}",
        if stats.errors.is_empty() {
            String::new()
        } else {
            format!(
                " ({})",
                stats
                    .errors
                    .iter()
                    .map(|(c, n)| format!("{c}: {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        },
        if misses > 0 {
            format!("; reads that found no row: {misses}")
        } else {
            String::new()
        }
    );

    let by_op: serde_json::Map<String, Value> = stats
        .ops
        .iter()
        .map(|(op, s)| {
            (
                op.to_string(),
                json!({
                    "ops": s.latency_us.len(),
                    "ok": s.ok,
                    "ops_per_s": s.latency_us.len() as f64 / secs,
                    "rows": s.rows,
                    "bytes": s.bytes,
                    "misses": s.misses,
                    "latency_ms": latency_json(&s.latency_us),
                }),
            )
        })
        .collect();
    json!({
        "phase": info.phase,
        "workload": info.workload,
        "distribution": info.distribution,
        "endpoint": info.endpoint,
        "table": info.table,
        "concurrency": info.concurrency,
        "connections": info.connections,
        "records": info.records,
        "row_size": info.row_size,
        "columns": info.columns,
        "seconds": seconds,
        "ops": total_ops,
        "ok": all.ok,
        "ops_per_s": total_ops as f64 / secs,
        "rows_per_s": all.rows as f64 / secs,
        "mb_per_s": all.bytes as f64 / secs / 1e6,
        "errors": errors,
        "errors_by_code": stats.errors,
        "misses": misses,
        "latency_ms": latency_json(&all.latency_us),
        "by_op": by_op,
    })
}
