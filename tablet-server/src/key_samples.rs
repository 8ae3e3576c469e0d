//! The Key Visualizer's samples (`docs/key-visualizer.md`): what this server's tablets receive,
//! per table, per minute of the wall clock and per key range — reads, writes (rows), rows and
//! bytes read, bytes written — served as `GetKeySamples` of the control protocol, which the
//! instance's master gathers every minute.
//!
//! A table's minute is a [`Window`]: its ranges (the keys between its boundaries) and their
//! counters. Counting is a binary search over the boundaries and atomic additions, on every
//! request, where the tablet load is counted (at the owner, once). The ranges of the next
//! minute are cut from this one's: a range that took more than its share of the operations is
//! split at the quantiles of the keys requested in it (a reservoir sample of 1,024 per table and
//! minute, each request equally likely to be in it), the coldest neighbours are merged back to
//! at most [`MAX_RANGES`], and otherwise the boundaries stay: an even load keeps its ranges
//! minute after minute, a hot range is cut finer the minute after it turned hot. A table's
//! first minute is one range. The first range starts at the smallest key requested in it and
//! the last ends after the largest, so keys growing past every boundary (a sequential key) are
//! reported where they were.
//!
//! A minute closes when the first request or report of the next one comes; its counters are
//! read when it is reported (seconds later), so a request that was counting into it as it
//! closed is not lost. The last [`KEPT_MINUTES`] closed minutes are kept; nothing is written
//! to disk (a restart loses the open minute and the kept ones).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use basalt_control::v1::{GetKeySamplesResponse, KeyMinute, KeyRangeSample, TableKeySamples};
use basalt_model::{RowSet, TableSchema, splitmix};
use bytes::Bytes;
use parking_lot::{Mutex, RwLock};

/// Most ranges of one table in one minute.
pub const MAX_RANGES: usize = 64;
/// How many closed minutes are kept for the master.
pub const KEPT_MINUTES: i64 = 15;
/// Keys sampled per table and minute.
const RESERVOIR: usize = 1024;

/// The minute (since the Unix epoch) of the wall clock now.
pub fn minute_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
        .div_euclid(60)
}

/// Every table's samples.
#[derive(Default)]
pub struct KeySampler {
    /// By table id (ids are never reused).
    tables: RwLock<HashMap<u64, Arc<TableSampler>>>,
    /// Closed minutes, by minute: each table's window of that minute.
    closed: Closed,
}

/// Closed minutes, by minute: each table's (resource name) window of that minute.
type Closed = Mutex<BTreeMap<i64, Vec<(String, Arc<Window>)>>>;

struct TableSampler {
    name: String,
    window: RwLock<Arc<Window>>,
}

/// One table's minute.
struct Window {
    minute: i64,
    /// Range i is `[bounds[i - 1], bounds[i])`: the first from the table's first row, the last
    /// to its end.
    bounds: Vec<Bytes>,
    counters: Box<[Counters]>,
    /// Operations seen (the reservoir's count).
    seen: AtomicU64,
    reservoir: Mutex<Vec<Bytes>>,
    /// The smallest key of the first range and the largest of the last (only requests in
    /// those two ranges look at them).
    edges: Mutex<(Option<Bytes>, Option<Bytes>)>,
}

#[derive(Default)]
struct Counters {
    reads: AtomicU64,
    writes: AtomicU64,
    rows_read: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
}

impl Counters {
    fn ops(&self) -> u64 {
        self.reads.load(Ordering::Relaxed) + self.writes.load(Ordering::Relaxed)
    }
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

/// The reservoir's choices: a hash of the operation's number (SplitMix64's first number).
fn mix(z: u64) -> u64 {
    splitmix::mix(z.wrapping_add(splitmix::GAMMA))
}

impl Window {
    fn new(minute: i64, bounds: Vec<Bytes>) -> Window {
        let counters = (0..=bounds.len()).map(|_| Counters::default()).collect();
        Window {
            minute,
            bounds,
            counters,
            seen: AtomicU64::new(0),
            reservoir: Mutex::new(Vec::with_capacity(RESERVOIR)),
            edges: Mutex::new((None, None)),
        }
    }

    /// The range holding `key`.
    fn range(&self, key: &[u8]) -> &Counters {
        let i = self.bounds.partition_point(|b| b.as_ref() <= key);
        &self.counters[i]
    }

    /// The range holding a requested `key`, which moves the edges if it is beyond them.
    fn requested(&self, key: &[u8]) -> &Counters {
        let i = self.bounds.partition_point(|b| b.as_ref() <= key);
        if i == 0 || i == self.bounds.len() {
            let mut edges = self.edges.lock();
            if i == 0 && edges.0.as_ref().is_none_or(|low| key < low.as_ref()) {
                edges.0 = Some(Bytes::copy_from_slice(key));
            }
            if i == self.bounds.len() && edges.1.as_ref().is_none_or(|high| key > high.as_ref()) {
                edges.1 = Some(Bytes::copy_from_slice(key));
            }
        }
        &self.counters[i]
    }

    /// Puts `key` in the reservoir with the chance every operation has (algorithm R).
    fn sample(&self, key: &[u8]) {
        let n = self.seen.fetch_add(1, Ordering::Relaxed);
        if (n as usize) < RESERVOIR {
            let mut r = self.reservoir.lock();
            if r.len() < RESERVOIR {
                r.push(Bytes::copy_from_slice(key));
                return;
            }
        }
        let slot = mix(n ^ (self.minute as u64).rotate_left(32)) % (n + 1);
        if (slot as usize) < RESERVOIR {
            let mut r = self.reservoir.lock();
            if let Some(k) = r.get_mut(slot as usize) {
                *k = Bytes::copy_from_slice(key);
            }
        }
    }

    /// The boundaries of the minute after this one (see the module's comment).
    fn next_bounds(&self) -> Vec<Bytes> {
        let counts: Vec<u64> = self.counters.iter().map(Counters::ops).collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return self.bounds.clone();
        }
        let mut keys = self.reservoir.lock().clone();
        keys.sort();
        // (boundary, count of the range that ends at it) pieces, in key order.
        let mut bounds: Vec<Bytes> = Vec::with_capacity(MAX_RANGES * 2);
        let mut weights: Vec<f64> = Vec::with_capacity(MAX_RANGES * 2 + 1);
        for (i, count) in counts.iter().enumerate() {
            let start = i.checked_sub(1).map(|j| &self.bounds[j]);
            let end = self.bounds.get(i);
            let parts = ((*count as f64 / total as f64) * MAX_RANGES as f64).round() as usize;
            let inside: Vec<&Bytes> = keys
                .iter()
                .filter(|k| start.is_none_or(|s| *k > s) && end.is_none_or(|e| *k < e))
                .collect();
            let mut cuts: Vec<Bytes> = Vec::new();
            if parts >= 2 && inside.len() >= 2 {
                for p in 1..parts {
                    let k = inside[p * inside.len() / parts];
                    if cuts.last() != Some(k) && start.is_none_or(|s| k > s) {
                        cuts.push(k.clone());
                    }
                }
            }
            let share = *count as f64 / (cuts.len() + 1) as f64;
            for c in cuts {
                bounds.push(c);
                weights.push(share);
            }
            weights.push(share);
            if let Some(e) = end {
                bounds.push(e.clone());
            }
        }
        // The coldest neighbours merge (their boundary goes) down to MAX_RANGES.
        while weights.len() > MAX_RANGES {
            let (i, _) = weights
                .windows(2)
                .map(|w| w[0] + w[1])
                .enumerate()
                .min_by(|a, b| a.1.total_cmp(&b.1))
                .expect("two ranges at least");
            weights[i] += weights[i + 1];
            weights.remove(i + 1);
            bounds.remove(i);
        }
        bounds
    }

    /// The minute's ranges with their counts (the ones that received something).
    fn report(&self) -> Vec<KeyRangeSample> {
        let (lowest, highest) = self.edges.lock().clone();
        let last = self.counters.len() - 1;
        self.counters
            .iter()
            .enumerate()
            .filter(|(_, c)| {
                c.ops() > 0
                    || c.bytes_read.load(Ordering::Relaxed) > 0
                    || c.rows_read.load(Ordering::Relaxed) > 0
            })
            .map(|(i, c)| {
                let mut start = i
                    .checked_sub(1)
                    .map(|j| self.bounds[j].clone())
                    .unwrap_or_default();
                let mut end = self.bounds.get(i).cloned().unwrap_or_default();
                // The edge ranges reach only as far as the keys requested in them.
                if i == 0
                    && let Some(low) = &lowest
                    && (end.is_empty() || low < &end)
                {
                    start = low.clone();
                }
                if i == last
                    && let Some(high) = &highest
                    && high >= &start
                {
                    let mut after = high.to_vec();
                    after.push(0);
                    end = Bytes::from(after);
                }
                KeyRangeSample {
                    start_key: start,
                    end_key: end,
                    reads: c.reads.load(Ordering::Relaxed),
                    writes: c.writes.load(Ordering::Relaxed),
                    rows_read: c.rows_read.load(Ordering::Relaxed),
                    bytes_read: c.bytes_read.load(Ordering::Relaxed),
                    bytes_written: c.bytes_written.load(Ordering::Relaxed),
                    stored_bytes: 0,
                }
            })
            .collect()
    }
}

impl TableSampler {
    /// The window of `minute`, closing the previous one into `closed` if it is older.
    fn window(&self, minute: i64, closed: &Closed) {
        let mut w = self.window.write();
        if w.minute < minute {
            let next = Arc::new(Window::new(minute, w.next_bounds()));
            let old = std::mem::replace(&mut *w, next);
            // Its sample has served (the next minute's cut); only the counters are reported.
            *old.reservoir.lock() = Vec::new();
            let mut closed = closed.lock();
            closed
                .entry(old.minute)
                .or_default()
                .push((self.name.clone(), old));
            while closed
                .first_key_value()
                .is_some_and(|(m, _)| *m < minute - KEPT_MINUTES)
            {
                closed.pop_first();
            }
        }
    }
}

/// What a read returned, to be counted on the ranges of its rows ([`KeySampler::returned`]).
pub struct ReadCounter(Arc<Window>);

impl ReadCounter {
    /// A row of `bytes` returned.
    pub fn row(&self, key: &[u8], bytes: u64) {
        let c = self.0.range(key);
        add(&c.rows_read, 1);
        add(&c.bytes_read, bytes);
    }
}

impl KeySampler {
    pub fn new() -> KeySampler {
        KeySampler::default()
    }

    /// The current window of `table` at `minute`.
    fn current(&self, table: &TableSchema, minute: i64) -> Arc<Window> {
        let sampler = self.tables.read().get(&table.id).cloned();
        let sampler = match sampler {
            Some(s) => s,
            None => self
                .tables
                .write()
                .entry(table.id)
                .or_insert_with(|| {
                    Arc::new(TableSampler {
                        name: table.name.clone(),
                        window: RwLock::new(Arc::new(Window::new(minute, vec![]))),
                    })
                })
                .clone(),
        };
        {
            let w = sampler.window.read();
            // A clock that went back counts in the current minute.
            if w.minute >= minute {
                return w.clone();
            }
        }
        sampler.window(minute, &self.closed);
        sampler.window.read().clone()
    }

    /// Counts a read of `rows` of `table`: one read per row key and per row range, on the
    /// range holding its first row.
    pub fn read(&self, table: &TableSchema, rows: &RowSet) {
        self.read_at(table, rows, minute_now());
    }

    /// [`KeySampler::read`] at `minute` (by another clock: tests and benchmarks).
    pub fn read_at(&self, table: &TableSchema, rows: &RowSet, minute: i64) {
        let w = self.current(table, minute);
        for range in rows.ranges() {
            add(&w.requested(&range.start).reads, 1);
            w.sample(&range.start);
        }
    }

    /// A counter for the rows a read of `table` returns.
    pub fn returned(&self, table: &TableSchema) -> ReadCounter {
        self.returned_at(table, minute_now())
    }

    fn returned_at(&self, table: &TableSchema, minute: i64) -> ReadCounter {
        ReadCounter(self.current(table, minute))
    }

    /// Counts a row written: `bytes` of it (its key and its mutations').
    pub fn wrote(&self, table: &TableSchema, row: &[u8], bytes: u64) {
        self.wrote_at(table, [(row, bytes)], minute_now());
    }

    /// Counts the rows a MutateRows wrote.
    pub fn wrote_rows<'a>(
        &self,
        table: &TableSchema,
        rows: impl IntoIterator<Item = (&'a [u8], u64)>,
    ) {
        self.wrote_at(table, rows, minute_now());
    }

    /// [`KeySampler::wrote_rows`] at `minute` (by another clock: tests and benchmarks).
    pub fn wrote_at<'a>(
        &self,
        table: &TableSchema,
        rows: impl IntoIterator<Item = (&'a [u8], u64)>,
        minute: i64,
    ) {
        let w = self.current(table, minute);
        for (row, bytes) in rows {
            let c = w.requested(row);
            add(&c.writes, 1);
            add(&c.bytes_written, bytes);
            w.sample(row);
        }
    }

    /// Forgets the tables `keep` says no (deleted ones).
    pub fn retain(&self, keep: impl Fn(u64) -> bool) {
        let mut tables = self.tables.write();
        let gone: Vec<String> = tables
            .iter()
            .filter(|(id, _)| !keep(**id))
            .map(|(_, s)| s.name.clone())
            .collect();
        tables.retain(|id, _| keep(*id));
        drop(tables);
        let mut closed = self.closed.lock();
        for windows in closed.values_mut() {
            windows.retain(|(name, _)| !gone.contains(name));
        }
    }

    /// The closed minutes after `after_minute`, oldest first (every table's minute before now
    /// is closed first, also the idle ones').
    pub fn samples(&self, after_minute: i64, start_time_micros: i64) -> GetKeySamplesResponse {
        self.samples_at(after_minute, start_time_micros, minute_now())
    }

    /// [`KeySampler::samples`] at `minute` (by another clock: tests and benchmarks).
    pub fn samples_at(
        &self,
        after_minute: i64,
        start_time_micros: i64,
        minute: i64,
    ) -> GetKeySamplesResponse {
        let samplers: Vec<Arc<TableSampler>> = self.tables.read().values().cloned().collect();
        for s in samplers {
            s.window(minute, &self.closed);
        }
        let closed = self.closed.lock();
        let minutes = closed
            .range(after_minute + 1..minute)
            .map(|(m, windows)| KeyMinute {
                minute: *m,
                tables: windows
                    .iter()
                    .map(|(name, w)| TableKeySamples {
                        table_name: name.clone(),
                        ranges: w.report(),
                        tablets: vec![],
                    })
                    .filter(|t| !t.ranges.is_empty())
                    .collect(),
            })
            .filter(|m| !m.tables.is_empty())
            .collect();
        GetKeySamplesResponse {
            minutes,
            open_minute: minute,
            start_time_micros,
        }
    }
}

/// `response` with the sizes of the tablets this server holds now (`sizes()`: by table name,
/// each table's tablets in key order, each as a range with its `stored_bytes`; called only if
/// the response is to carry them) put into its
/// last closed minute, `open_minute - 1`, added if it has nothing else — unless the caller had
/// that minute already (`after_minute`). Earlier minutes get no sizes: they are being
/// collected late (a new master), and nothing says what the tablets held then.
pub fn with_tablet_sizes(
    mut response: GetKeySamplesResponse,
    after_minute: i64,
    sizes: impl FnOnce() -> BTreeMap<String, Vec<KeyRangeSample>>,
) -> GetKeySamplesResponse {
    let last = response.open_minute - 1;
    if last <= after_minute {
        return response;
    }
    let sizes = sizes();
    if sizes.is_empty() {
        return response;
    }
    if response.minutes.last().is_none_or(|m| m.minute != last) {
        response.minutes.push(KeyMinute {
            minute: last,
            tables: vec![],
        });
    }
    let minute = response.minutes.last_mut().expect("pushed");
    for (table_name, tablets) in sizes {
        match minute
            .tables
            .iter_mut()
            .find(|t| t.table_name == table_name)
        {
            Some(t) => t.tablets = tablets,
            None => minute.tables.push(TableKeySamples {
                table_name,
                ranges: vec![],
                tablets,
            }),
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use basalt_model::RowRange;

    fn table(id: u64) -> TableSchema {
        TableSchema {
            id,
            name: format!("projects/p/instances/i/tables/t{id}"),
            families: Default::default(),
            dropped_families: Default::default(),
            deletion_protection: false,
            splits: vec![],
            created_micros: 0,
            restore: None,
        }
    }

    fn ranges(r: &GetKeySamplesResponse, minute: i64) -> Vec<KeyRangeSample> {
        r.minutes
            .iter()
            .find(|m| m.minute == minute)
            .map(|m| m.tables[0].ranges.clone())
            .unwrap_or_default()
    }

    #[test]
    fn a_minute_closes_when_the_next_begins_and_counts_everything_once() {
        let s = KeySampler::new();
        let t = table(1);
        for i in 0..500u32 {
            s.wrote_at(&t, [(format!("k{i:04}").as_bytes(), 10)], 100);
        }
        s.read_at(&t, &RowSet::from_keys([&b"k0001"[..]]), 100);
        s.read_at(
            &t,
            &RowSet::from_ranges([RowRange {
                start: Bytes::from_static(b"k0100"),
                end: Some(Bytes::from_static(b"k0200")),
            }]),
            100,
        );
        s.returned_at(&t, 100).row(b"k0001", 33);
        // Minute 100 is open: nothing yet.
        assert!(s.samples_at(0, 1, 100).minutes.is_empty());
        let r = s.samples_at(0, 1, 101);
        assert_eq!(r.open_minute, 101);
        let got = ranges(&r, 100);
        // The first minute is one range, from the smallest key requested to after the largest.
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].writes, 500);
        assert_eq!(got[0].reads, 2);
        assert_eq!(got[0].bytes_written, 5000);
        assert_eq!((got[0].rows_read, got[0].bytes_read), (1, 33));
        assert_eq!(got[0].start_key, Bytes::from_static(b"k0000"));
        assert_eq!(got[0].end_key, Bytes::from_static(b"k0499\0"));
        // Asked again after it: nothing new.
        assert!(s.samples_at(100, 1, 101).minutes.is_empty());
    }

    #[test]
    fn the_next_minute_is_cut_where_the_requests_were() {
        let s = KeySampler::new();
        let t = table(2);
        // Minute 10: 90 % of writes in "hot-…", the rest spread over "bg-…".
        for i in 0..9000u32 {
            s.wrote_at(&t, [(format!("hot-{i:05}").as_bytes(), 1)], 10);
        }
        for i in 0..1000u32 {
            s.wrote_at(
                &t,
                [(format!("bg-{:05}", i * 97 % 10000).as_bytes(), 1)],
                10,
            );
        }
        s.wrote_at(&t, [(&b"bg-00001"[..], 1)], 11);
        let r = s.samples_at(0, 1, 12);
        let next = ranges(&r, 11);
        assert_eq!(next.len(), 1, "minute 11 counted one write in one range");
        // Minute 11's ranges: most boundaries are in the hot keys.
        let w = s.tables.read()[&2].window.read().clone();
        assert!(w.bounds.len() < MAX_RANGES);
        let hot = w.bounds.iter().filter(|b| b.starts_with(b"hot-")).count();
        assert!(
            hot >= 45,
            "{hot} of {} boundaries in the hot range",
            w.bounds.len()
        );
    }

    #[test]
    fn an_even_load_keeps_its_ranges_from_minute_to_minute() {
        let s = KeySampler::new();
        let t = table(3);
        let mut x = 7u64;
        let mut bounds = vec![];
        for minute in 0..6 {
            for _ in 0..20_000 {
                x = mix(x);
                s.wrote_at(
                    &t,
                    [(format!("u{:06}", x % 1_000_000).as_bytes(), 1)],
                    minute,
                );
            }
            s.samples_at(-1, 1, minute + 1);
            bounds.push(s.tables.read()[&3].window.read().bounds.clone());
        }
        // From the second cut on, few boundaries change between minutes.
        for pair in bounds[1..].windows(2) {
            let kept = pair[1].iter().filter(|b| pair[0].contains(b)).count();
            assert!(
                kept * 10 >= pair[1].len() * 8,
                "{kept} of {} kept",
                pair[1].len()
            );
        }
        assert!(bounds[1].len() >= 50);
    }

    #[test]
    fn fifteen_minutes_are_kept_and_dropped_tables_forgotten() {
        let s = KeySampler::new();
        let (a, b) = (table(4), table(5));
        for minute in 0..20 {
            s.wrote_at(&a, [(&b"x"[..], 1)], minute);
            s.wrote_at(&b, [(&b"y"[..], 1)], minute);
        }
        let r = s.samples_at(0, 1, 20);
        let minutes: Vec<i64> = r.minutes.iter().map(|m| m.minute).collect();
        assert_eq!(minutes, (5..20).collect::<Vec<_>>());
        s.retain(|id| id == 4);
        let r = s.samples_at(17, 1, 20);
        assert_eq!(r.minutes.len(), 2);
        assert!(r.minutes.iter().all(|m| m.tables.len() == 1));
        assert_eq!(r.minutes[0].tables[0].table_name, a.name);
    }

    #[test]
    fn the_sizes_go_into_the_last_closed_minute_only() {
        let s = KeySampler::new();
        let (a, b) = (table(6), table(7));
        s.wrote_at(&a, [(&b"x"[..], 1)], 30);
        s.wrote_at(&a, [(&b"x"[..], 1)], 31);
        let size = |start: &'static [u8], bytes| KeyRangeSample {
            start_key: Bytes::from_static(start),
            stored_bytes: bytes,
            ..KeyRangeSample::default()
        };
        let sizes = || {
            BTreeMap::from([
                (a.name.clone(), vec![size(b"", 10), size(b"m", 20)]),
                (b.name.clone(), vec![size(b"", 5)]),
            ])
        };
        // Minutes 30 and 31 closed: the sizes join minute 31, beside its counts; table b,
        // idle, is added.
        let r = with_tablet_sizes(s.samples_at(0, 1, 32), 0, sizes);
        assert_eq!(r.minutes.len(), 2);
        assert!(r.minutes[0].tables.iter().all(|t| t.tablets.is_empty()));
        let last = &r.minutes[1];
        assert_eq!(last.minute, 31);
        let of = |name: &str| last.tables.iter().find(|t| t.table_name == name).unwrap();
        assert_eq!(of(&a.name).ranges[0].writes, 1);
        assert_eq!(
            of(&a.name)
                .tablets
                .iter()
                .map(|t| t.stored_bytes)
                .sum::<u64>(),
            30
        );
        assert!(of(&b.name).ranges.is_empty());
        assert_eq!(of(&b.name).tablets[0].stored_bytes, 5);
        // An idle minute is added for them; a minute the caller had gets none, and the sizes
        // are not even read.
        let r = with_tablet_sizes(s.samples_at(31, 1, 33), 31, sizes);
        assert_eq!(r.minutes.len(), 1);
        assert_eq!(r.minutes[0].minute, 32);
        assert_eq!(r.minutes[0].tables.len(), 2);
        let r = with_tablet_sizes(s.samples_at(32, 1, 33), 32, || {
            panic!("sizes read for a minute the caller had")
        });
        assert!(r.minutes.is_empty());
    }
}
