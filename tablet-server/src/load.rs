//! Per-tablet request load: how many reads and writes each tablet of this server receives, as
//! totals and as decaying rates. The control service reports it (`TabletLoad` of
//! `basalt.control.v1`); the master balances tablets on it. Statistics stay in memory: a
//! restart starts them again from zero (DISTRIBUTED.md: load is never written to etcd).
//!
//! A request counts once per tablet it touches: a row read or written (each entry of a
//! MutateRows, each row key of a ReadRows) counts on the tablet holding the row, and a row
//! range read counts on each tablet it overlaps. A row is mapped to its tablet by the table's
//! splits (its tablets are the `splits + 1` ranges between them), so counting is a binary
//! search and two atomic additions: it runs on every request.
//!
//! Rates are exponentially weighted moving averages with a time constant of [`LOAD_WINDOW`]
//! (like a one-minute load average): steady traffic of r requests/s reads as r after a few
//! windows, and a tablet that stops receiving requests decays towards zero. They are folded
//! lazily — by the request path at most once per [`FOLD_EVERY`] per tablet, and by each
//! report — so no background task runs per tablet.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use basalt_model::{RowSet, TableSchema};
use parking_lot::{Mutex, RwLock};

/// The time constant of the request rates.
pub const LOAD_WINDOW: Duration = Duration::from_secs(60);

/// How often the request path folds a tablet's recent requests into its rate.
pub const FOLD_EVERY: Duration = Duration::from_secs(1);

/// The load of every tablet this server served requests for, by table.
pub struct TabletLoads {
    /// The origin of the nanosecond clock of the rates.
    origin: Instant,
    /// By table id (ids are never reused, so a table deleted and created again under the same
    /// name starts from zero).
    tables: RwLock<HashMap<u64, Arc<TableLoad>>>,
}

/// The counters of one table's tablets, by tablet index (tablet i holds the rows from split
/// i - 1 to split i). A table's splits do not change today (they are its `initial_splits`);
/// counters are rebuilt if their number changes.
struct TableLoad {
    tablets: Box<[TabletCounters]>,
}

#[derive(Default)]
struct TabletCounters {
    reads: Rate,
    writes: Rate,
}

/// What one tablet received: the values a report carries.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LoadReport {
    pub read_requests_per_sec: f64,
    pub write_requests_per_sec: f64,
    /// Since the server started.
    pub read_requests: u64,
    pub write_requests: u64,
}

impl Default for TabletLoads {
    fn default() -> Self {
        TabletLoads::new()
    }
}

impl TabletLoads {
    pub fn new() -> TabletLoads {
        TabletLoads {
            origin: Instant::now(),
            tables: RwLock::new(HashMap::new()),
        }
    }

    /// Counts a read of `rows` of `table`: one per row key, one per tablet a range overlaps.
    pub fn read(&self, table: &TableSchema, rows: &RowSet) {
        self.read_at(table, rows, Instant::now());
    }

    /// Counts a write of `row` of `table`.
    pub fn write(&self, table: &TableSchema, row: &[u8]) {
        self.write_at(table, [row], Instant::now());
    }

    /// Counts a write of each row of `rows` (the entries of a MutateRows).
    pub fn write_rows<'a>(&self, table: &TableSchema, rows: impl IntoIterator<Item = &'a [u8]>) {
        self.write_at(table, rows, Instant::now());
    }

    /// The load of each tablet of `table`, in key order (`splits + 1` reports; zeros for a
    /// table without requests).
    pub fn report(&self, table: &TableSchema) -> Vec<LoadReport> {
        self.report_at(table, Instant::now())
    }

    /// Forgets the tables `keep` says no (deleted ones), so their counters do not pile up.
    pub fn retain(&self, keep: impl Fn(u64) -> bool) {
        self.tables.write().retain(|id, _| keep(*id));
    }

    fn read_at(&self, table: &TableSchema, rows: &RowSet, now: Instant) {
        let now = self.nanos(now);
        let load = self.table(table);
        let splits = &table.splits;
        for range in rows.ranges() {
            // The tablet holding the range's first row, to the one holding its last: tablet i
            // starts at split i - 1, and overlaps the range when it starts before its end.
            let first = splits.partition_point(|s| s.as_slice() <= &range.start[..]);
            let last = match &range.end {
                Some(end) => splits.partition_point(|s| s.as_slice() < &end[..]),
                None => splits.len(),
            };
            for tablet in load.tablets.get(first..=last).unwrap_or_default() {
                tablet.reads.add(1, now);
            }
        }
    }

    fn write_at<'a>(
        &self,
        table: &TableSchema,
        rows: impl IntoIterator<Item = &'a [u8]>,
        now: Instant,
    ) {
        let now = self.nanos(now);
        let load = self.table(table);
        for row in rows {
            let tablet = table.splits.partition_point(|s| s.as_slice() <= row);
            if let Some(t) = load.tablets.get(tablet) {
                t.writes.add(1, now);
            }
        }
    }

    fn report_at(&self, table: &TableSchema, now: Instant) -> Vec<LoadReport> {
        let now = self.nanos(now);
        let tablets = table.splits.len() + 1;
        let load = self.tables.read().get(&table.id).cloned();
        match load {
            Some(load) if load.tablets.len() == tablets => load
                .tablets
                .iter()
                .map(|t| LoadReport {
                    read_requests_per_sec: t.reads.per_sec(now),
                    write_requests_per_sec: t.writes.per_sec(now),
                    read_requests: t.reads.total(),
                    write_requests: t.writes.total(),
                })
                .collect(),
            _ => vec![LoadReport::default(); tablets],
        }
    }

    /// The counters of `table`'s tablets, created on its first request.
    fn table(&self, table: &TableSchema) -> Arc<TableLoad> {
        let tablets = table.splits.len() + 1;
        if let Some(load) = self.tables.read().get(&table.id)
            && load.tablets.len() == tablets
        {
            return load.clone();
        }
        let mut tables = self.tables.write();
        let load = tables
            .entry(table.id)
            .or_insert_with(|| TableLoad::new(tablets));
        if load.tablets.len() != tablets {
            *load = TableLoad::new(tablets);
        }
        load.clone()
    }

    fn nanos(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.origin).as_nanos()).unwrap_or(u64::MAX)
    }
}

impl TableLoad {
    fn new(tablets: usize) -> Arc<TableLoad> {
        Arc::new(TableLoad {
            tablets: (0..tablets).map(|_| TabletCounters::default()).collect(),
        })
    }
}

/// A count of events with its exponentially weighted rate. Adding is two relaxed atomic
/// additions (plus, once per [`FOLD_EVERY`], a fold under a lock no adder waits for).
#[derive(Default)]
struct Rate {
    total: AtomicU64,
    /// Events not yet folded into `ewma`.
    pending: AtomicU64,
    /// When the request path should fold next (nanoseconds of the loads' clock).
    next_fold: AtomicU64,
    ewma: Mutex<Ewma>,
}

#[derive(Default)]
struct Ewma {
    per_sec: f64,
    /// When it was last folded (nanoseconds of the loads' clock).
    at: u64,
}

impl Rate {
    fn add(&self, n: u64, now: u64) {
        self.total.fetch_add(n, Ordering::Relaxed);
        // Fold before counting: the events pending are those since the last fold, so the
        // first request after an idle spell is not spread over the spell.
        if now >= self.next_fold.load(Ordering::Relaxed)
            && let Some(mut ewma) = self.ewma.try_lock()
        {
            self.fold(&mut ewma, now);
        }
        self.pending.fetch_add(n, Ordering::Relaxed);
    }

    fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// The rate at `now`: the events since the last fold folded in, the rest decayed.
    fn per_sec(&self, now: u64) -> f64 {
        let mut ewma = self.ewma.lock();
        self.fold(&mut ewma, now);
        ewma.per_sec
    }

    /// Folds the pending events, taken as spread evenly since the last fold, into the rate:
    /// `rate' = rate·e^(-dt/τ) + count·(1 - e^(-dt/τ))/dt`, which tends to `count/τ` as dt
    /// goes to zero and keeps a steady rate r at r whatever the spacing of the folds.
    fn fold(&self, ewma: &mut Ewma, now: u64) {
        let count = self.pending.swap(0, Ordering::Relaxed) as f64;
        let tau = LOAD_WINDOW.as_secs_f64();
        let dt = now.saturating_sub(ewma.at) as f64 / 1e9;
        let gain = if dt > 0.0 {
            -(-dt / tau).exp_m1() / dt
        } else {
            1.0 / tau
        };
        ewma.per_sec = ewma.per_sec * (-dt / tau).exp() + count * gain;
        ewma.at = ewma.at.max(now);
        let next = ewma.at.saturating_add(FOLD_EVERY.as_nanos() as u64);
        self.next_fold.store(next, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use basalt_model::RowRange;
    use bytes::Bytes;

    fn table(id: u64, splits: &[&str]) -> TableSchema {
        TableSchema {
            id,
            name: format!("projects/p/instances/i/tables/t{id}"),
            families: Default::default(),
            dropped_families: Default::default(),
            deletion_protection: false,
            splits: splits.iter().map(|s| s.as_bytes().to_vec()).collect(),
            created_micros: 0,
            restore: None,
        }
    }

    fn totals(loads: &TabletLoads, t: &TableSchema) -> Vec<(u64, u64)> {
        loads
            .report(t)
            .iter()
            .map(|r| (r.read_requests, r.write_requests))
            .collect()
    }

    fn range(start: &str, end: Option<&str>) -> RowRange {
        RowRange::new(
            Bytes::copy_from_slice(start.as_bytes()),
            end.map(|e| Bytes::copy_from_slice(e.as_bytes())),
        )
    }

    #[test]
    fn requests_count_on_the_tablets_holding_their_rows() {
        let loads = TabletLoads::new();
        let t = table(1, &["g", "p"]);
        // Writes: "a" and "f" in the first tablet, "g" (a split starts its tablet) and "o"
        // in the second, "p" and "z" in the last.
        loads.write(&t, b"a");
        loads.write_rows(&t, [&b"f"[..], b"g", b"o", b"p"]);
        loads.write(&t, b"z");
        assert_eq!(totals(&loads, &t), [(0, 2), (0, 2), (0, 2)]);

        // Reads: two keys of the first tablet count twice there; a range counts once on each
        // tablet it overlaps, and its exclusive end is not a row of the next tablet.
        let loads = TabletLoads::new();
        loads.read(&t, &RowSet::from_keys([&b"a"[..], b"b"]));
        loads.read(&t, &RowSet::from_ranges([range("c", Some("g"))]));
        assert_eq!(totals(&loads, &t), [(3, 0), (0, 0), (0, 0)]);
        loads.read(&t, &RowSet::from_ranges([range("f", Some("g\0"))]));
        assert_eq!(totals(&loads, &t), [(4, 0), (1, 0), (0, 0)]);
        loads.read(&t, &RowSet::all());
        loads.read(&t, &RowSet::from_ranges([range("q", None)]));
        assert_eq!(totals(&loads, &t), [(5, 0), (2, 0), (2, 0)]);
    }

    #[test]
    fn tables_are_counted_apart_and_forgotten_when_dropped() {
        let loads = TabletLoads::new();
        let (a, b) = (table(1, &[]), table(2, &["m"]));
        loads.write(&a, b"x");
        loads.write(&b, b"x");
        assert_eq!(totals(&loads, &a), [(0, 1)]);
        assert_eq!(totals(&loads, &b), [(0, 0), (0, 1)]);
        // A table without requests reports zeros for each tablet.
        assert_eq!(totals(&loads, &table(3, &["k"])), [(0, 0), (0, 0)]);
        loads.retain(|id| id != 1);
        assert_eq!(totals(&loads, &a), [(0, 0)]);
        assert_eq!(totals(&loads, &b), [(0, 0), (0, 1)]);
        // The same id with other splits starts again (never today: splits are fixed).
        loads.write(&table(2, &["c", "m"]), b"a");
        assert_eq!(
            totals(&loads, &table(2, &["c", "m"])),
            [(0, 1), (0, 0), (0, 0)]
        );
    }

    #[test]
    fn a_steady_rate_is_reported_as_it_is_and_decays_when_requests_stop() {
        let loads = TabletLoads::new();
        let t = table(1, &["m"]);
        let start = loads.origin;
        let at = |secs: f64| start + Duration::from_secs_f64(secs);
        // 50 writes/s on the first tablet for ten windows, 10 reads/s on the second.
        let steps = 100 * LOAD_WINDOW.as_secs();
        for step in 0..steps {
            let clock = step as f64 / 10.0;
            for i in 0..5 {
                loads.write_at(&t, [&b"a"[..]], at(clock + i as f64 * 0.02));
            }
            loads.read_at(&t, &RowSet::from_keys([&b"x"[..]]), at(clock));
        }
        let clock = steps as f64 / 10.0;
        let report = loads.report_at(&t, at(clock));
        let close = |x: f64, want: f64| (x - want).abs() <= want * 0.02;
        assert!(close(report[0].write_requests_per_sec, 50.0), "{report:?}");
        assert!(close(report[1].read_requests_per_sec, 10.0), "{report:?}");
        assert_eq!(report[0].read_requests_per_sec, 0.0);
        assert_eq!(report[0].write_requests, 5 * steps);

        // One window without requests: the rate falls to about e^-1 of what it was; the
        // totals stay.
        let later = loads.report_at(&t, at(clock + LOAD_WINDOW.as_secs_f64()));
        let ratio = later[0].write_requests_per_sec / report[0].write_requests_per_sec;
        assert!((ratio - (-1.0f64).exp()).abs() < 0.01, "{ratio}");
        assert_eq!(later[0].write_requests, report[0].write_requests);
    }

    #[test]
    fn a_burst_reads_as_its_share_of_the_window_however_often_it_is_reported() {
        // 600 requests at once: right after, the rate is 600/τ = 10/s whether or not a report
        // or the request path folded in between.
        for fold_in_between in [false, true] {
            let loads = TabletLoads::new();
            let t = table(1, &[]);
            let at = |secs: f64| loads.origin + Duration::from_secs_f64(secs);
            if fold_in_between {
                loads.report_at(&t, at(5.0));
            }
            for _ in 0..600 {
                loads.write_at(&t, [&b"k"[..]], at(10.0));
            }
            let rate = loads.report_at(&t, at(10.0))[0].write_requests_per_sec;
            assert!((rate - 10.0).abs() < 1e-9, "{rate}");
        }
    }
}
