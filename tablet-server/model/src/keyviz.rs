//! The Key Visualizer's model (`docs/key-visualizer.md`), pure: what a table's load per key
//! range and minute is, how a history of it is kept, and how a window of it becomes a heatmap.
//!
//! * A [`Column`] is one table's load over some minutes: key ranges in key order, each with its
//!   [`Counts`]. The tablet servers report, per minute, ranges of their own choosing (cut where
//!   the requests were); [`Column::from_samples`] merges those of every server into one column.
//! * Where ranges differ, a range's counts are **spread** over the finer ranges it covers in
//!   proportion to their share of its keys ([`key_fraction`]: the keys read as numbers in the
//!   alphabet they use — digits, letters or bytes). That is an approximation: nothing says where
//!   inside a range its requests fell.
//! * A column holds at most [`MAX_RANGES`] ranges: beyond, the adjacent pair with the fewest
//!   operations is merged first, so hot ranges stay apart while cold ones merge, as TiDB
//!   Dashboard's Key Visualizer keeps hot regions apart.
//! * [`TableHistory`] keeps a table's columns in [`LAYERS`], Spanner's Key Visualizer's time
//!   axis: 1-minute columns for 6 hours, 10-minute ones for 4 days, hourly ones for 28 days. A
//!   column older than its layer's span is merged into the next layer's (whole slots at a time,
//!   so columns never overlap in time, and every minute's counts are in exactly one column).
//! * [`matrix`] makes a window's heatmap: buckets cut at every boundary of the window's
//!   columns, then merged (coldest adjacent pair first) down to at most `max_buckets`;
//!   [`hottest`] names the runs of hot buckets; [`hot_tablets`] the tablets that took most of
//!   their server's requests (Bigtable's `ListHotTablets`).

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::ops::{Add, AddAssign};

use bytes::Bytes;

/// What the heatmap shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Metric {
    /// Reads + writes.
    Ops,
    Reads,
    Writes,
    RowsRead,
    /// Bytes read + bytes written.
    Bytes,
    BytesRead,
    BytesWritten,
    /// The bytes stored: a level, not a flow (its cells are averages over their minutes).
    StoredBytes,
}

impl Metric {
    pub const ALL: [Metric; 8] = [
        Metric::Ops,
        Metric::Reads,
        Metric::Writes,
        Metric::RowsRead,
        Metric::Bytes,
        Metric::BytesRead,
        Metric::BytesWritten,
        Metric::StoredBytes,
    ];

    /// The metric a name (as [`Metric::name`]) names.
    pub fn parse(name: &str) -> Option<Metric> {
        Metric::ALL.into_iter().find(|m| m.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            Metric::Ops => "ops",
            Metric::Reads => "reads",
            Metric::Writes => "writes",
            Metric::RowsRead => "rows_read",
            Metric::Bytes => "bytes",
            Metric::BytesRead => "bytes_read",
            Metric::BytesWritten => "bytes_written",
            Metric::StoredBytes => "stored_bytes",
        }
    }

    /// The unit of a heatmap cell.
    pub fn unit(self) -> &'static str {
        match self {
            Metric::Ops => "operations/min",
            Metric::Reads => "reads/min",
            Metric::Writes => "writes/min",
            Metric::RowsRead => "rows read/min",
            Metric::Bytes => "bytes/min",
            Metric::BytesRead => "bytes read/min",
            Metric::BytesWritten => "bytes written/min",
            Metric::StoredBytes => "bytes stored",
        }
    }

    /// Whether it is a level (the bytes stored) rather than something counted per minute: a
    /// level's value over a window is its average, not its sum.
    pub fn is_level(self) -> bool {
        matches!(self, Metric::StoredBytes)
    }
}

/// What one key range received. Fractional once spread over finer ranges.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Counts {
    /// Read operations.
    pub reads: f64,
    /// Rows written.
    pub writes: f64,
    pub rows_read: f64,
    pub bytes_read: f64,
    pub bytes_written: f64,
    /// Bytes stored, summed over the minutes sampled (a column of ten minutes holds ten
    /// samples of its tablets' sizes): divided by the minutes, the average size.
    pub stored_bytes: f64,
}

impl Counts {
    pub fn get(&self, metric: Metric) -> f64 {
        match metric {
            Metric::Ops => self.reads + self.writes,
            Metric::Reads => self.reads,
            Metric::Writes => self.writes,
            Metric::RowsRead => self.rows_read,
            Metric::Bytes => self.bytes_read + self.bytes_written,
            Metric::BytesRead => self.bytes_read,
            Metric::BytesWritten => self.bytes_written,
            Metric::StoredBytes => self.stored_bytes,
        }
    }

    pub fn scale(&self, by: f64) -> Counts {
        Counts {
            reads: self.reads * by,
            writes: self.writes * by,
            rows_read: self.rows_read * by,
            bytes_read: self.bytes_read * by,
            bytes_written: self.bytes_written * by,
            stored_bytes: self.stored_bytes * by,
        }
    }

    pub fn is_zero(&self) -> bool {
        *self == Counts::default()
    }

    /// What merging prefers to keep apart: operations first, bytes to break ties.
    fn weight(&self) -> f64 {
        (self.reads + self.writes) * 1e6 + (self.bytes_read + self.bytes_written).min(1e6)
    }
}

impl Add for Counts {
    type Output = Counts;
    fn add(mut self, o: Counts) -> Counts {
        self += o;
        self
    }
}

impl AddAssign for Counts {
    fn add_assign(&mut self, o: Counts) {
        self.reads += o.reads;
        self.writes += o.writes;
        self.rows_read += o.rows_read;
        self.bytes_read += o.bytes_read;
        self.bytes_written += o.bytes_written;
        self.stored_bytes += o.stored_bytes;
    }
}

/// One key range `[start, end)` and what it received; an empty `start` is the table's first
/// row, an empty `end` its last.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RangeCounts {
    pub start: Bytes,
    pub end: Bytes,
    pub counts: Counts,
}

/// One table's load over `minutes` minutes from `start_minute` (minutes since the Unix
/// epoch): ranges in key order, not overlapping.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Column {
    pub start_minute: i64,
    pub minutes: u32,
    pub ranges: Vec<RangeCounts>,
}

/// Most ranges of one column.
pub const MAX_RANGES: usize = 1024;

impl Column {
    /// One minute from every server's samples (which may overlap: a tablet moved during the
    /// minute): cut at every boundary, spread, summed; ranges with nothing dropped; at most
    /// [`MAX_RANGES`].
    pub fn from_samples(minute: i64, samples: Vec<RangeCounts>) -> Column {
        let samples: Vec<&RangeCounts> = samples.iter().collect();
        Column {
            start_minute: minute,
            minutes: 1,
            ranges: combine(&samples, MAX_RANGES),
        }
    }

    /// Several columns as one covering `minutes` from `start_minute` (a layer's slot).
    pub fn merge(start_minute: i64, minutes: u32, columns: &[&Column]) -> Column {
        let ranges: Vec<&RangeCounts> = columns.iter().flat_map(|c| c.ranges.iter()).collect();
        Column {
            start_minute,
            minutes,
            ranges: combine(&ranges, MAX_RANGES),
        }
    }

    /// The first minute after the column.
    pub fn end_minute(&self) -> i64 {
        self.start_minute + i64::from(self.minutes)
    }

    /// Everything the column counted.
    pub fn total(&self) -> Counts {
        self.ranges
            .iter()
            .fold(Counts::default(), |a, r| a + r.counts)
    }
}

// --- key positions ----------------------------------------------------------------------

/// How many symbols after the common prefix a key's position reads.
const POSITION_DIGITS: usize = 8;

/// The alphabets keys are read in (a byte outside its position's alphabet is clamped to it).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Alphabet {
    Digits,
    Lower,
    Upper,
    /// `0-9`, `A-Z`, `a-z` in byte order.
    Alnum,
    /// 0x20..=0x7e.
    Printable,
    Bytes,
}

impl Alphabet {
    fn of(b: u8) -> Alphabet {
        match b {
            b'0'..=b'9' => Alphabet::Digits,
            b'a'..=b'z' => Alphabet::Lower,
            b'A'..=b'Z' => Alphabet::Upper,
            0x20..=0x7e => Alphabet::Printable,
            _ => Alphabet::Bytes,
        }
    }

    /// The smallest alphabet holding both.
    fn join(self, other: Alphabet) -> Alphabet {
        use Alphabet::*;
        match (self, other) {
            (a, b) if a == b => a,
            (Bytes, _) | (_, Bytes) => Bytes,
            (Printable, _) | (_, Printable) => Printable,
            _ => Alnum,
        }
    }

    fn size(self) -> u32 {
        match self {
            Alphabet::Digits => 10,
            Alphabet::Lower | Alphabet::Upper => 26,
            Alphabet::Alnum => 62,
            Alphabet::Printable => 95,
            Alphabet::Bytes => 256,
        }
    }

    /// The byte's rank in the alphabet (clamped: monotone in the byte).
    fn rank(self, b: u8) -> u32 {
        let clamp = |lo: u8, hi: u8| u32::from(b.clamp(lo, hi) - lo);
        match self {
            Alphabet::Digits => clamp(b'0', b'9'),
            Alphabet::Lower => clamp(b'a', b'z'),
            Alphabet::Upper => clamp(b'A', b'Z'),
            Alphabet::Alnum => match b {
                ..=b'9' => clamp(b'0', b'9'),
                b':'..=b'Z' => 10 + clamp(b'A', b'Z'),
                b'['..=b'`' => 36,
                _ => 36 + clamp(b'a', b'z'),
            },
            Alphabet::Printable => clamp(0x20, 0x7e),
            Alphabet::Bytes => u32::from(b),
        }
    }
}

/// Where `key` lies in `[start, end)`, from 0 to 1: the bytes after the common prefix of
/// `start` and `end` read as a number whose digits are in the alphabet `start` and `end` use at
/// each position (digits, letters, printable or any byte), so keys made of digits spread as
/// their numbers do. An empty `end` is the end of the key space. Monotone in `key`.
pub fn key_fraction(start: &[u8], end: &[u8], key: &[u8]) -> f64 {
    Fraction::new(start, end).at(key)
}

/// [`key_fraction`] of one range, ready for many keys (the alphabets and bounds read once).
struct Fraction<'a> {
    start: &'a [u8],
    end: &'a [u8],
    prefix: usize,
    alphabets: [Alphabet; POSITION_DIGITS],
    low: f64,
    high: f64,
}

impl<'a> Fraction<'a> {
    fn new(start: &'a [u8], end: &'a [u8]) -> Fraction<'a> {
        let prefix = if end.is_empty() {
            0
        } else {
            start.iter().zip(end).take_while(|(a, b)| a == b).count()
        };
        // Each position's alphabet from the bounds' bytes there (the previous one's where
        // neither has a byte).
        let mut alphabets = [Alphabet::Printable; POSITION_DIGITS];
        let mut previous = Alphabet::Printable;
        for (i, slot) in alphabets.iter_mut().enumerate() {
            let a = start.get(prefix + i).copied();
            let b = if end.is_empty() {
                None
            } else {
                end.get(prefix + i).copied()
            };
            let alphabet = match (a, b) {
                (None, None) => previous,
                (Some(x), None) | (None, Some(x)) => Alphabet::of(x),
                (Some(x), Some(y)) => Alphabet::of(x).join(Alphabet::of(y)),
            };
            *slot = alphabet;
            previous = alphabet;
        }
        let mut f = Fraction {
            start,
            end,
            prefix,
            alphabets,
            low: 0.0,
            high: 1.0,
        };
        f.low = f.position(start);
        if !end.is_empty() {
            f.high = f.position(end);
        }
        f
    }

    /// A missing byte (a shorter key) sorts before every symbol: digit 0, symbols 1..=size.
    fn position(&self, k: &[u8]) -> f64 {
        let mut value = 0.0;
        let mut scale = 1.0;
        for (i, alphabet) in self.alphabets.iter().enumerate() {
            let radix = f64::from(alphabet.size() + 1);
            scale /= radix;
            let digit = k.get(self.prefix + i).map_or(0, |b| alphabet.rank(*b) + 1);
            value += f64::from(digit) * scale;
        }
        value
    }

    fn at(&self, key: &[u8]) -> f64 {
        if key <= self.start {
            return 0.0;
        }
        if !self.end.is_empty() && key >= self.end {
            return 1.0;
        }
        if self.high <= self.low {
            return 0.0;
        }
        ((self.position(key) - self.low) / (self.high - self.low)).clamp(0.0, 1.0)
    }

    /// Where the end of a part of the range lies: 1 for the range's end (or beyond).
    fn at_end(&self, to: &[u8]) -> f64 {
        if to.is_empty() || (!self.end.is_empty() && to >= self.end) {
            1.0
        } else {
            self.at(to)
        }
    }
}

/// The share of `[start, end)`'s keys that `[from, to)` (inside it) holds.
fn share(start: &[u8], end: &[u8], from: &[u8], to: &[u8]) -> f64 {
    let f = Fraction::new(start, end);
    (f.at_end(to) - f.at(from)).max(0.0)
}

// --- cutting and merging ----------------------------------------------------------------

/// Every boundary of `ranges` (their starts and non-empty ends) with the empty key first: the
/// elementary ranges are `[b[i], b[i + 1])` and `[b[last], "")`.
fn boundaries<'a>(ranges: impl IntoIterator<Item = &'a RangeCounts>) -> Vec<Bytes> {
    let mut set: BTreeSet<Bytes> = BTreeSet::new();
    set.insert(Bytes::new());
    for r in ranges {
        set.insert(r.start.clone());
        if !r.end.is_empty() {
            set.insert(r.end.clone());
        }
    }
    set.into_iter().collect()
}

/// Spreads `range` over the elementary ranges of `bounds` it covers, calling `add(index,
/// counts)` for each.
fn spread(range: &RangeCounts, bounds: &[Bytes], mut add: impl FnMut(usize, Counts)) {
    let first = bounds
        .partition_point(|b| b.as_ref() <= range.start.as_ref())
        .saturating_sub(1);
    let last = if range.end.is_empty() {
        bounds.len()
    } else {
        bounds.partition_point(|b| b.as_ref() < range.end.as_ref())
    };
    if last <= first + 1 {
        add(first, range.counts);
        return;
    }
    let fraction = Fraction::new(&range.start, &range.end);
    let mut given = 0.0;
    let mut shares = Vec::with_capacity(last - first);
    // Each part ends where the next begins: one position per boundary.
    let mut at_from = fraction.at(&range.start);
    for i in first..last {
        let to = bounds.get(i + 1).filter(|_| i + 1 < last);
        let at_to = match to {
            Some(t) => fraction.at_end(t),
            None => fraction.at_end(&range.end),
        };
        let s = (at_to - at_from).max(0.0);
        at_from = at_to;
        given += s;
        shares.push(s);
    }
    if given <= 0.0 {
        add(first, range.counts);
        return;
    }
    // Normalised, so the counts are conserved exactly.
    for (i, s) in (first..last).zip(shares) {
        if s > 0.0 {
            add(i, range.counts.scale(s / given));
        }
    }
}

/// `ranges` (overlapping or not) cut at all their boundaries and summed, empty ones dropped,
/// then merged down to `max`.
fn combine(ranges: &[&RangeCounts], max: usize) -> Vec<RangeCounts> {
    let bounds = boundaries(ranges.iter().copied());
    let mut sums = vec![Counts::default(); bounds.len()];
    for r in ranges {
        spread(r, &bounds, |i, c| sums[i] += c);
    }
    let cut: Vec<RangeCounts> = sums
        .into_iter()
        .enumerate()
        .filter(|(_, c)| !c.is_zero())
        .map(|(i, counts)| RangeCounts {
            start: bounds[i].clone(),
            end: bounds.get(i + 1).cloned().unwrap_or_default(),
            counts,
        })
        .collect();
    merge_coldest(cut, max, |c| c.weight())
}

/// An `f64` ordered totally (for the heap).
#[derive(Clone, Copy, PartialEq)]
struct Key(f64);

impl Eq for Key {}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Key {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// Merges neighbours of `ranges` (in key order), the pair of least combined `weight` first,
/// until at most `max` remain. Neighbours with a gap between them merge over it. O(n log n).
fn merge_coldest(
    ranges: Vec<RangeCounts>,
    max: usize,
    weight: impl Fn(&Counts) -> f64,
) -> Vec<RangeCounts> {
    let n = ranges.len();
    let max = max.max(1);
    if n <= max {
        return ranges;
    }
    let mut items: Vec<Option<RangeCounts>> = ranges.into_iter().map(Some).collect();
    let mut next: Vec<usize> = (1..=n).collect();
    let mut prev: Vec<Option<usize>> = (0..n).map(|i| i.checked_sub(1)).collect();
    let mut version = vec![0u32; n];
    let mut heap = BinaryHeap::new();
    let pair_weight = |items: &[Option<RangeCounts>], a: usize, b: usize| {
        let (Some(x), Some(y)) = (&items[a], &items[b]) else {
            return f64::INFINITY;
        };
        weight(&(x.counts + y.counts))
    };
    for i in 0..n - 1 {
        heap.push(std::cmp::Reverse((
            Key(pair_weight(&items, i, i + 1)),
            i,
            version[i],
            i + 1,
            version[i + 1],
        )));
    }
    let mut alive = n;
    while alive > max {
        let Some(std::cmp::Reverse((_, a, va, b, vb))) = heap.pop() else {
            break;
        };
        if version[a] != va || version[b] != vb || items[a].is_none() || items[b].is_none() {
            continue;
        }
        let right = items[b].take().expect("alive");
        let left = items[a].as_mut().expect("alive");
        left.end = right.end;
        left.counts += right.counts;
        version[a] += 1;
        alive -= 1;
        next[a] = next[b];
        if next[a] < n {
            prev[next[a]] = Some(a);
            heap.push(std::cmp::Reverse((
                Key(pair_weight(&items, a, next[a])),
                a,
                version[a],
                next[a],
                version[next[a]],
            )));
        }
        if let Some(p) = prev[a] {
            heap.push(std::cmp::Reverse((
                Key(pair_weight(&items, p, a)),
                p,
                version[p],
                a,
                version[a],
            )));
        }
    }
    items.into_iter().flatten().collect()
}

// --- the history ------------------------------------------------------------------------

/// A layer of the history: columns of `minutes` minutes, kept for `span_minutes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layer {
    pub minutes: u32,
    pub span_minutes: i64,
}

/// Spanner's Key Visualizer's time axis: 1-minute columns for 6 hours, 10-minute columns for
/// 4 days, hourly columns for 28 days.
pub const LAYERS: [Layer; 3] = [
    Layer {
        minutes: 1,
        span_minutes: 6 * 60,
    },
    Layer {
        minutes: 10,
        span_minutes: 4 * 24 * 60,
    },
    Layer {
        minutes: 60,
        span_minutes: 28 * 24 * 60,
    },
];

/// What [`TableHistory::add`] or [`TableHistory::age`] changed: columns (layer, start minute)
/// to write, and to delete.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Changed {
    pub written: Vec<(usize, i64)>,
    pub deleted: Vec<(usize, i64)>,
}

impl Changed {
    fn write(&mut self, at: (usize, i64)) {
        self.deleted.retain(|d| *d != at);
        if !self.written.contains(&at) {
            self.written.push(at);
        }
    }

    fn delete(&mut self, at: (usize, i64)) {
        self.written.retain(|w| *w != at);
        if !self.deleted.contains(&at) {
            self.deleted.push(at);
        }
    }

    /// Both changes, as one.
    pub fn and(mut self, more: Changed) -> Changed {
        for w in more.written {
            self.write(w);
        }
        for d in more.deleted {
            self.delete(d);
        }
        self
    }
}

/// One table's history: per layer, its columns by start minute.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TableHistory {
    layers: [BTreeMap<i64, Column>; 3],
}

impl TableHistory {
    pub fn new() -> TableHistory {
        TableHistory::default()
    }

    /// Puts back a column read from storage (at start-up).
    pub fn restore(&mut self, layer: usize, column: Column) {
        if let Some(l) = self.layers.get_mut(layer) {
            l.insert(column.start_minute, column);
        }
    }

    /// Adds one minute's column to the first layer (merged with what that minute has already).
    pub fn add(&mut self, column: Column) -> Changed {
        let at = column.start_minute;
        let merged = match self.layers[0].get(&at) {
            Some(old) => Column::merge(at, 1, &[old, &column]),
            None => column,
        };
        self.layers[0].insert(at, merged);
        let mut changed = Changed::default();
        changed.write((0, at));
        changed
    }

    /// Moves what is older than a layer's span into the next layer, a whole slot of the next
    /// layer at a time; drops what the last layer no longer keeps.
    pub fn age(&mut self, now_minute: i64) -> Changed {
        let mut changed = Changed::default();
        for (layer, this) in LAYERS.iter().enumerate() {
            let cutoff = now_minute - this.span_minutes;
            let Some(next) = LAYERS.get(layer + 1) else {
                let old: Vec<i64> = self.layers[layer]
                    .range(..cutoff)
                    .filter(|(_, c)| c.end_minute() <= cutoff)
                    .map(|(s, _)| *s)
                    .collect();
                for start in old {
                    self.layers[layer].remove(&start);
                    changed.delete((layer, start));
                }
                continue;
            };
            let slot_minutes = i64::from(next.minutes);
            let moving: Vec<i64> = self.layers[layer]
                .keys()
                .copied()
                .filter(|s| s - s.rem_euclid(slot_minutes) + slot_minutes <= cutoff)
                .collect();
            let mut slots: BTreeMap<i64, Vec<Column>> = BTreeMap::new();
            for start in moving {
                let column = self.layers[layer].remove(&start).expect("listed");
                changed.delete((layer, start));
                slots
                    .entry(start - start.rem_euclid(slot_minutes))
                    .or_default()
                    .push(column);
            }
            for (slot, columns) in slots {
                let mut all: Vec<&Column> = columns.iter().collect();
                let existing = self.layers[layer + 1].remove(&slot);
                if let Some(e) = &existing {
                    all.push(e);
                }
                let merged = Column::merge(slot, next.minutes, &all);
                self.layers[layer + 1].insert(slot, merged);
                changed.write((layer + 1, slot));
            }
        }
        changed
    }

    /// The columns overlapping `[start_minute, end_minute)`, oldest first (they never overlap
    /// each other: a minute's counts are in one column only).
    pub fn window(&self, start_minute: i64, end_minute: i64) -> Vec<&Column> {
        let mut columns: Vec<&Column> = self
            .layers
            .iter()
            .flat_map(|l| l.values())
            .filter(|c| c.start_minute < end_minute && c.end_minute() > start_minute)
            .collect();
        columns.sort_by_key(|c| c.start_minute);
        columns
    }

    pub fn column(&self, layer: usize, start_minute: i64) -> Option<&Column> {
        self.layers.get(layer)?.get(&start_minute)
    }

    /// The last minute of the first layer, if it has any.
    pub fn latest_minute(&self) -> Option<i64> {
        self.layers[0].keys().next_back().copied()
    }

    pub fn is_empty(&self) -> bool {
        self.layers.iter().all(BTreeMap::is_empty)
    }

    /// How many columns each layer holds.
    pub fn columns_per_layer(&self) -> [usize; 3] {
        [
            self.layers[0].len(),
            self.layers[1].len(),
            self.layers[2].len(),
        ]
    }
}

// --- the view ---------------------------------------------------------------------------

/// A window's heatmap of one metric.
#[derive(Clone, Debug, PartialEq)]
pub struct Matrix {
    /// Bucket `b` is `[bounds[b], bounds[b + 1])`; the first bound and the last are empty (the
    /// table's first row, its end).
    pub bounds: Vec<Bytes>,
    /// Each column's (start minute, minutes).
    pub times: Vec<(i64, u32)>,
    /// `values[t][b]`: the metric per minute in column `t`, bucket `b` (a level's average).
    pub values: Vec<Vec<f64>>,
    /// Per bucket, the metric over the whole window (not per minute); a level's average over
    /// the window's minutes.
    pub totals: Vec<f64>,
    pub metric: Metric,
}

/// The heatmap of `metric` over `columns`.
pub fn matrix(columns: &[&Column], metric: Metric, max_buckets: usize) -> Matrix {
    let all: Vec<&RangeCounts> = columns.iter().flat_map(|c| c.ranges.iter()).collect();
    let bounds = boundaries(all.iter().copied());
    let mut sums = vec![Counts::default(); bounds.len()];
    for r in &all {
        spread(r, &bounds, |i, c| sums[i] += c);
    }
    let elementary: Vec<RangeCounts> = sums
        .into_iter()
        .enumerate()
        .map(|(i, counts)| RangeCounts {
            start: bounds[i].clone(),
            end: bounds.get(i + 1).cloned().unwrap_or_default(),
            counts,
        })
        .collect();
    let buckets = merge_coldest(elementary, max_buckets, |c| c.get(metric));
    let mut bounds: Vec<Bytes> = buckets.iter().map(|b| b.start.clone()).collect();
    bounds.push(Bytes::new());
    let cut = &bounds[..bounds.len() - 1];
    let mut values = Vec::with_capacity(columns.len());
    let mut totals = vec![0.0; buckets.len()];
    for column in columns {
        let mut row = vec![0.0; buckets.len()];
        for r in &column.ranges {
            spread(r, cut, |i, c| row[i] += c.get(metric));
        }
        for (t, v) in totals.iter_mut().zip(row.iter_mut()) {
            *t += *v;
            *v /= f64::from(column.minutes.max(1));
        }
        values.push(row);
    }
    if metric.is_level() {
        let minutes: f64 = columns.iter().map(|c| f64::from(c.minutes.max(1))).sum();
        for t in &mut totals {
            *t /= minutes.max(1.0);
        }
    }
    Matrix {
        bounds,
        times: columns
            .iter()
            .map(|c| (c.start_minute, c.minutes))
            .collect(),
        values,
        totals,
        metric,
    }
}

/// A run of hot buckets.
#[derive(Clone, Debug, PartialEq)]
pub struct HotRange {
    pub start: Bytes,
    /// Empty: to the table's end.
    pub end: Bytes,
    /// The metric over the window.
    pub value: f64,
    /// Of the window's total.
    pub share: f64,
}

/// Up to `n` hottest runs of adjacent hot buckets, hottest first. A bucket is hot when, in some
/// column of the window, it received more than twice the mean cell (the window's total per
/// minute over its buckets): a load that moves through the keys (a sequential key) is hot
/// where it was, minute by minute, though over the window each range holds its part. A run
/// extends over its neighbours that got more than the mean cell in some column (hysteresis, so
/// a narrow range between two minutes' cuts does not split a hot run), and holds at least one
/// hot bucket. A run's value is its total over the window; its share, of the window's total.
/// For a level (the bytes stored) read "average" for "total": the largest ranges.
pub fn hottest(matrix: &Matrix, n: usize) -> Vec<HotRange> {
    let total: f64 = matrix.totals.iter().sum();
    let buckets = matrix.totals.len();
    if total <= 0.0 || buckets == 0 || matrix.values.is_empty() {
        return vec![];
    }
    let minutes: f64 = matrix.times.iter().map(|(_, m)| f64::from(*m)).sum();
    let per_minute = if matrix.metric.is_level() {
        total
    } else {
        total / minutes.max(1.0)
    };
    let mean_cell = per_minute / buckets as f64;
    let peak: Vec<f64> = (0..buckets)
        .map(|b| matrix.values.iter().map(|row| row[b]).fold(0.0, f64::max))
        .collect();
    let mut runs: Vec<HotRange> = Vec::new();
    let mut open: Option<(HotRange, bool)> = None;
    for (b, p) in peak.iter().enumerate() {
        if *p > mean_cell {
            let (run, hot) = open.get_or_insert_with(|| {
                (
                    HotRange {
                        start: matrix.bounds[b].clone(),
                        end: Bytes::new(),
                        value: 0.0,
                        share: 0.0,
                    },
                    false,
                )
            });
            run.value += matrix.totals[b];
            run.end = matrix.bounds[b + 1].clone();
            *hot |= *p > 2.0 * mean_cell;
        } else if let Some((run, hot)) = open.take()
            && hot
        {
            runs.push(run);
        }
    }
    if let Some((run, true)) = open {
        runs.push(run);
    }
    for r in &mut runs {
        r.share = r.value / total;
    }
    runs.sort_by(|a, b| b.value.total_cmp(&a.value));
    runs.truncate(n);
    runs
}

/// A tablet as [`hot_tablets`] sees it: a range of a table and the server holding it now.
#[derive(Clone, Debug, PartialEq)]
pub struct TabletRange {
    pub table: String,
    pub start: Bytes,
    /// Empty: to the table's end.
    pub end: Bytes,
    pub server: String,
}

/// A tablet that took most of its server's operations during one column.
#[derive(Clone, Debug, PartialEq)]
pub struct HotTablet {
    /// Index into the tablets given.
    pub tablet: usize,
    pub start_minute: i64,
    pub minutes: u32,
    /// Its share of its server's operations then, 0 to 1.
    pub share: f64,
    /// Its operations per minute then.
    pub ops_per_minute: f64,
}

/// Bigtable's hot tablets from the history: for each column of each table, the operations of
/// each tablet (by the tablets' ranges now), and its share of the operations of the server that
/// holds it (the tablets' server now); hot when the share is at least `min_share` and the
/// tablet took at least `min_ops_per_minute`. Of the hot entries of one tablet within one
/// 15-minute slot only the one of the highest share is kept (as Bigtable does). Highest share
/// first.
pub fn hot_tablets(
    tablets: &[TabletRange],
    columns: &BTreeMap<String, Vec<&Column>>,
    min_share: f64,
    min_ops_per_minute: f64,
) -> Vec<HotTablet> {
    // Per column time: each tablet's operations.
    let mut by_time: BTreeMap<(i64, u32), Vec<f64>> = BTreeMap::new();
    for (t, tablet) in tablets.iter().enumerate() {
        for column in columns.get(&tablet.table).into_iter().flatten() {
            let ops = by_time
                .entry((column.start_minute, column.minutes))
                .or_insert_with(|| vec![0.0; tablets.len()]);
            for r in &column.ranges {
                let from = r.start.as_ref().max(tablet.start.as_ref());
                let to_end = |e: &Bytes| e.is_empty();
                let to: &[u8] = match (to_end(&r.end), to_end(&tablet.end)) {
                    (true, true) => &[],
                    (true, false) => &tablet.end,
                    (false, true) => &r.end,
                    (false, false) => r.end.as_ref().min(tablet.end.as_ref()),
                };
                if !to.is_empty() && from >= to {
                    continue;
                }
                ops[t] += r.counts.get(Metric::Ops) * share(&r.start, &r.end, from, to);
            }
        }
    }
    let mut best: BTreeMap<(usize, i64), HotTablet> = BTreeMap::new();
    for ((start_minute, minutes), ops) in by_time {
        let mut per_server: BTreeMap<&str, f64> = BTreeMap::new();
        for (t, tablet) in tablets.iter().enumerate() {
            *per_server.entry(tablet.server.as_str()).or_default() += ops[t];
        }
        for (t, tablet) in tablets.iter().enumerate() {
            let server = per_server[tablet.server.as_str()];
            let per_minute = ops[t] / f64::from(minutes.max(1));
            if server <= 0.0 || per_minute < min_ops_per_minute {
                continue;
            }
            let share = ops[t] / server;
            if share < min_share {
                continue;
            }
            let hot = HotTablet {
                tablet: t,
                start_minute,
                minutes,
                share,
                ops_per_minute: per_minute,
            };
            let slot = (t, start_minute - start_minute.rem_euclid(15));
            if best.get(&slot).is_none_or(|b| b.share < share) {
                best.insert(slot, hot);
            }
        }
    }
    let mut hot: Vec<HotTablet> = best.into_values().collect();
    hot.sort_by(|a, b| {
        b.share
            .total_cmp(&a.share)
            .then(b.ops_per_minute.total_cmp(&a.ops_per_minute))
    });
    hot
}

/// A key as the page shows it: bytes 0x20..=0x7e except `\` as themselves, others `\xNN`.
pub fn printable(key: &[u8]) -> String {
    let mut s = String::with_capacity(key.len());
    for &b in key {
        if (0x20..=0x7e).contains(&b) && b != b'\\' {
            s.push(b as char);
        } else {
            s.push_str(&format!("\\x{b:02x}"));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    fn writes(start: &str, end: &str, n: f64) -> RangeCounts {
        RangeCounts {
            start: b(start),
            end: b(end),
            counts: Counts {
                writes: n,
                ..Counts::default()
            },
        }
    }

    fn total_writes(ranges: &[RangeCounts]) -> f64 {
        ranges.iter().map(|r| r.counts.writes).sum()
    }

    use crate::splitmix::SplitMix as Rng;

    #[test]
    fn key_fraction_is_bounded_and_monotone() {
        let (s, e) = (b"user#100", b"user#900");
        let mut last = 0.0;
        for n in (100..900).step_by(7) {
            let f = key_fraction(s, e, format!("user#{n}").as_bytes());
            assert!((0.0..=1.0).contains(&f));
            assert!(f >= last, "{n}: {f} < {last}");
            last = f;
        }
        assert_eq!(key_fraction(s, e, b"user#0"), 0.0);
        assert_eq!(key_fraction(s, e, b"user#999"), 1.0);
        assert!(key_fraction(b"a", b"", b"\xff\xff") > 0.99);
        assert!(key_fraction(b"a", b"", b"m") > key_fraction(b"a", b"", b"b"));
    }

    #[test]
    fn decimal_keys_spread_as_their_numbers() {
        // "bg-199999" is about half-way between bg-000000 and bg-400000 by number, and so it
        // is by key fraction (read in base 256 it would be 1/4 off).
        let f = key_fraction(b"bg-000000", b"bg-400000", b"bg-200000");
        assert!((f - 0.5).abs() < 0.03, "{f}");
        let f = key_fraction(b"bg-123456", b"bg-345678", b"bg-234567");
        assert!((f - 0.5).abs() < 0.03, "{f}");
    }

    #[test]
    fn overlapping_samples_from_two_servers_are_cut_and_summed_conserving_counts() {
        let column = Column::from_samples(
            7,
            vec![
                writes("", "m", 100.0),
                writes("m", "", 50.0),
                writes("g", "t", 30.0),
            ],
        );
        let bounds: Vec<&[u8]> = column.ranges.iter().map(|r| r.start.as_ref()).collect();
        assert_eq!(bounds, vec![&b""[..], b"g", b"m", b"t"]);
        assert!((total_writes(&column.ranges) - 180.0).abs() < 1e-9);
        // [g, m) holds part of the first sample and half of the third (g..m is about half of
        // g..t).
        let gm = column.ranges[1].counts.writes;
        assert!(gm > 15.0 && gm < 100.0, "{gm}");
    }

    #[test]
    fn the_range_cap_keeps_a_hot_narrow_range_apart_while_cold_ones_merge() {
        let mut samples = Vec::new();
        for i in 0..2000u32 {
            let n = if i == 1234 { 1_000_000.0 } else { 1.0 };
            samples.push(writes(&format!("k{i:05}"), &format!("k{:05}", i + 1), n));
        }
        let column = Column::from_samples(0, samples);
        assert!(column.ranges.len() <= MAX_RANGES);
        assert!((total_writes(&column.ranges) - 1_001_999.0).abs() < 1e-6);
        let hot = column
            .ranges
            .iter()
            .find(|r| r.start.as_ref() == b"k01234")
            .expect("the hot range kept");
        assert_eq!(hot.end, b("k01235"));
        assert_eq!(hot.counts.writes, 1_000_000.0);
    }

    #[test]
    fn aging_moves_minutes_into_slots_and_slots_into_hours_conserving_counts() {
        let mut h = TableHistory::new();
        for m in 0..130 {
            h.add(Column::from_samples(m, vec![writes("a", "b", 1.0)]));
        }
        // Six hours later, minutes 0..129 leave the first layer: 13 ten-minute slots.
        let changed = h.age(130 + 360);
        assert_eq!(h.columns_per_layer(), [0, 13, 0]);
        assert_eq!(changed.deleted.len(), 130);
        assert_eq!(changed.written.len(), 13);
        assert!(changed.written.contains(&(1, 120)));
        let slot = h.column(1, 120).unwrap();
        assert_eq!(slot.minutes, 10);
        assert_eq!(slot.total().writes, 10.0);
        // Four days on, whole hours move on; the partial hour [120, 180) waits for its end.
        // Four days on, the slots move into hours: [0, 60), [60, 120), [120, 180).
        let changed = h.age(130 + 360 + 5760);
        assert_eq!(h.columns_per_layer(), [0, 0, 3]);
        assert!(changed.written.contains(&(2, 0)) && changed.written.contains(&(2, 120)));
        assert_eq!(changed.deleted.len(), 13);
        assert_eq!(h.column(2, 60).unwrap().total().writes, 60.0);
        assert_eq!(h.column(2, 120).unwrap().total().writes, 10.0);
        let all: f64 = h.window(0, 200).iter().map(|c| c.total().writes).sum();
        assert_eq!(all, 130.0);
        // After 28 days everything is gone.
        h.age(200 + 40320 + 5760 + 360);
        assert!(h.is_empty());
    }

    #[test]
    fn a_window_counts_every_minute_once_across_layers() {
        let mut h = TableHistory::new();
        for m in 0..1000 {
            h.add(Column::from_samples(m, vec![writes("a", "z", 2.0)]));
            h.age(m);
        }
        h.age(1000);
        let [l0, l1, _] = h.columns_per_layer();
        assert!(l0 > 0 && l1 > 0);
        let columns = h.window(300, 1000);
        for pair in columns.windows(2) {
            assert!(pair[0].end_minute() <= pair[1].start_minute);
        }
        let total: f64 = columns.iter().map(|c| c.total().writes).sum();
        assert_eq!(total, 2.0 * 700.0);
        assert_eq!(h.latest_minute(), Some(999));
    }

    fn stored(start: &str, end: &str, bytes: f64) -> RangeCounts {
        RangeCounts {
            start: b(start),
            end: b(end),
            counts: Counts {
                stored_bytes: bytes,
                ..Counts::default()
            },
        }
    }

    #[test]
    fn the_bytes_stored_read_as_averages_over_minutes_and_windows() {
        // Tablet [a, m) grows from 1000 to 2000 bytes over 20 minutes; [m, "") holds 100.
        // Writes land in [a, c) only: the sizes are cut and spread with them.
        let mut h = TableHistory::new();
        for m in 0..20 {
            let size = 1000.0 + 50.0 * m as f64;
            h.add(Column::from_samples(
                m,
                vec![
                    stored("a", "m", size),
                    stored("m", "", 100.0),
                    writes("a", "c", 5.0),
                ],
            ));
        }
        let column = h.column(0, 3).unwrap();
        assert!((column.total().stored_bytes - 1250.0).abs() < 1e-6);
        assert_eq!(column.total().writes, 5.0);
        // Ten minutes later the first ten are one slot: its cells average their minutes.
        h.age(10 + 360);
        let slot = h.column(1, 0).unwrap();
        assert_eq!(slot.minutes, 10);
        let m = matrix(&[slot], Metric::StoredBytes, 10);
        let per_minute: f64 = m.values[0].iter().sum();
        let average = (0..10).map(|i| 1100.0 + 50.0 * i as f64).sum::<f64>() / 10.0;
        assert!(
            (per_minute - average).abs() < 1e-6,
            "{per_minute} vs {average}"
        );
        // Over a window, a level's total is its average (with 100 bytes more beyond m), and
        // the largest range is the bulk of [a, m): [c, m), [a, c) holding 2/12 of its keys.
        let columns = h.window(0, 20);
        let m = matrix(&columns, Metric::StoredBytes, 10);
        let over_window: f64 = m.totals.iter().sum();
        let expected = (0..20).map(|i| 1100.0 + 50.0 * i as f64).sum::<f64>() / 20.0;
        assert!(
            (over_window - expected).abs() < 1e-6,
            "{over_window} vs {expected}"
        );
        let largest = hottest(&m, 3);
        assert_eq!(largest.len(), 1, "{largest:?}");
        assert_eq!((&largest[0].start, &largest[0].end), (&b("c"), &b("m")));
        assert!((largest[0].share - 10.0 / 12.0 * (expected - 100.0) / expected).abs() < 0.02);
        // Counted metrics are not touched by the sizes.
        let w = matrix(&columns, Metric::Writes, 10);
        assert!((w.totals.iter().sum::<f64>() - 100.0).abs() < 1e-9);
    }

    /// Quantiles of 3000 uniform keys: how a server cuts an even load.
    fn uniform_cuts(rng: &mut Rng, cuts: usize) -> Vec<u64> {
        let mut sample: Vec<u64> = (0..1024).map(|_| rng.below(1_000_000)).collect();
        sample.sort();
        let mut cut: Vec<u64> = sample
            .into_iter()
            .skip(1024 / cuts)
            .step_by(1024 / cuts)
            .collect();
        cut.dedup();
        cut
    }

    /// One server's minute: 3000 writes on uniform keys, counted in the ranges between `cuts`.
    fn uniform_minute(rng: &mut Rng, minute: i64, cuts: &[u64]) -> Column {
        let key = |n: u64| format!("bg-{n:06}");
        let mut counts = vec![0.0; cuts.len() + 1];
        for _ in 0..3000 {
            let k = rng.below(1_000_000);
            counts[cuts.partition_point(|c| *c <= k)] += 1.0;
        }
        let mut bounds: Vec<String> = vec![String::new()];
        bounds.extend(cuts.iter().map(|n| key(*n)));
        bounds.push(String::new());
        let ranges = bounds
            .windows(2)
            .zip(counts)
            .map(|(w, n)| writes(&w[0], &w[1], n))
            .collect();
        Column::from_samples(minute, ranges)
    }

    #[test]
    fn a_uniform_load_shows_no_bucket_above_three_times_the_mean() {
        // The servers keep their cuts while the load stays even; one minute moved a few.
        let mut rng = Rng(29);
        let cuts = uniform_cuts(&mut rng, 64);
        let mut moved = cuts.clone();
        for c in moved.iter_mut().step_by(16) {
            *c += 3000;
        }
        moved.sort();
        let columns: Vec<Column> = [&cuts, &cuts, &moved]
            .iter()
            .enumerate()
            .map(|(m, c)| uniform_minute(&mut rng, m as i64, c))
            .collect();
        let refs: Vec<&Column> = columns.iter().collect();
        let m = matrix(&refs, Metric::Writes, 1000);
        // The first bucket and the last hold the keys before the first cut and after the last.
        let inner: Vec<f64> = m.totals[1..m.totals.len() - 1].to_vec();
        let mean = inner.iter().sum::<f64>() / inner.len() as f64;
        let max = inner.iter().cloned().fold(0.0, f64::max);
        let worst = inner.iter().position(|v| *v == max).unwrap() + 1;
        assert!(
            max <= 3.0 * mean,
            "max {max} mean {mean} at {:?}..{:?} of {}",
            m.bounds[worst],
            m.bounds[worst + 1],
            inner.len()
        );
        assert!((m.totals.iter().sum::<f64>() - 9000.0).abs() < 1e-6);
        assert!(hottest(&m, 10).iter().all(|h| h.share < 0.2));
    }

    #[test]
    fn sequential_writes_next_to_a_uniform_background_are_the_hottest_range() {
        let mut rng = Rng(7);
        let mut columns = Vec::new();
        for minute in 0..3i64 {
            let cuts = uniform_cuts(&mut rng, 8);
            let mut c = uniform_minute(&mut rng, minute, &cuts);
            // 27,000 sequential writes this minute, reported in one range beyond the last cut
            // plus a few within the previous minute's keys.
            let first = minute as u64 * 27_000;
            c = Column::merge(
                minute,
                1,
                &[
                    &c,
                    &Column::from_samples(
                        minute,
                        vec![writes(
                            &format!("seq-{first:010}"),
                            &format!("seq-{:010}", first + 27_000),
                            27_000.0,
                        )],
                    ),
                ],
            );
            columns.push(c);
        }
        let refs: Vec<&Column> = columns.iter().collect();
        let m = matrix(&refs, Metric::Writes, 1000);
        let hot = hottest(&m, 10);
        let covered = |k: &[u8]| {
            hot.iter()
                .any(|h| h.start.as_ref() <= k && (h.end.is_empty() || k < h.end.as_ref()))
        };
        assert!(
            covered(b"seq-0000000000") && covered(b"seq-0000080999"),
            "{hot:?}"
        );
        let share: f64 = hot.iter().map(|h| h.share).sum();
        assert!(share >= 0.8, "{share}");
        assert_eq!(m.values.len(), 3);
        let per_minute: f64 = m.values[0].iter().sum();
        assert!((per_minute - 30_000.0).abs() < 1e-6, "{per_minute}");
    }

    #[test]
    fn a_narrow_cooler_range_between_two_hot_ones_does_not_split_the_hot_run() {
        // Ten cold ranges, then three busy ones of which the middle got a bit over the mean.
        let mut ranges: Vec<RangeCounts> = (0..10)
            .map(|i| writes(&format!("a{i}"), &format!("a{}", i + 1), 10.0))
            .collect();
        ranges.push(writes("b0", "b1", 1000.0));
        ranges.push(writes("b1", "b2", 150.0));
        ranges.push(writes("b2", "b3", 1000.0));
        let column = Column::from_samples(0, ranges);
        let m = matrix(&[&column], Metric::Writes, 1000);
        let hot = hottest(&m, 10);
        assert_eq!(hot.len(), 1, "{hot:?}");
        assert_eq!(
            (hot[0].start.as_ref(), hot[0].end.as_ref()),
            (&b"b0"[..], &b"b3"[..])
        );
        assert!((hot[0].share - 2150.0 / 2250.0).abs() < 1e-9);
    }

    #[test]
    fn a_matrix_of_many_ranges_has_at_most_the_buckets_asked_and_conserves_totals() {
        let ranges: Vec<RangeCounts> = (0..5000)
            .map(|i| {
                writes(
                    &format!("r{i:05}"),
                    &format!("r{:05}", i + 1),
                    (i % 7) as f64,
                )
            })
            .collect();
        let column = Column {
            start_minute: 0,
            minutes: 10,
            ranges,
        };
        let m = matrix(&[&column], Metric::Writes, 1000);
        assert!(m.totals.len() <= 1000);
        assert_eq!(m.bounds.len(), m.totals.len() + 1);
        assert!(m.bounds.first().unwrap().is_empty() && m.bounds.last().unwrap().is_empty());
        let expected: f64 = (0..5000).map(|i| (i % 7) as f64).sum();
        assert!((m.totals.iter().sum::<f64>() - expected).abs() < 1e-6);
        // Per minute: the 10-minute column's values are a tenth of its totals.
        assert!((m.values[0].iter().sum::<f64>() * 10.0 - expected).abs() < 1e-6);
    }

    #[test]
    fn an_empty_window_is_one_empty_bucket() {
        let m = matrix(&[], Metric::Ops, 1000);
        assert_eq!(m.bounds, vec![Bytes::new(), Bytes::new()]);
        assert!(m.times.is_empty() && m.values.is_empty());
        assert!(hottest(&m, 10).is_empty());
    }

    #[test]
    fn the_hot_tablet_is_the_one_taking_most_of_its_servers_operations() {
        let tablets = vec![
            TabletRange {
                table: "t".into(),
                start: b(""),
                end: b("m"),
                server: "s0".into(),
            },
            TabletRange {
                table: "t".into(),
                start: b("m"),
                end: b("p"),
                server: "s1".into(),
            },
            TabletRange {
                table: "t".into(),
                start: b("p"),
                end: b(""),
                server: "s1".into(),
            },
        ];
        let minutes: Vec<Column> = (0..20)
            .map(|m| {
                Column::from_samples(
                    m,
                    vec![
                        writes("a", "c", 100.0),
                        writes("n", "o", 900.0),
                        writes("q", "z", 100.0),
                    ],
                )
            })
            .collect();
        let mut columns = BTreeMap::new();
        columns.insert("t".to_string(), minutes.iter().collect::<Vec<_>>());
        let hot = hot_tablets(&tablets, &columns, 0.5, 60.0);
        // s0's only tablet took all of s0's 100 ops/min: hot too; [m, p) took 90 % of s1's.
        assert!(hot.iter().all(|h| h.tablet != 2), "{hot:?}");
        let middle: Vec<&HotTablet> = hot.iter().filter(|h| h.tablet == 1).collect();
        // One per 15-minute slot: minutes 0..15 and 15..20.
        assert_eq!(middle.len(), 2);
        assert!((middle[0].share - 0.9).abs() < 1e-9);
        assert_eq!(middle[0].ops_per_minute, 900.0);
        assert!(hot_tablets(&tablets, &columns, 0.5, 1000.0).is_empty());
    }

    #[test]
    fn metrics_and_keys_read_as_the_page_shows_them() {
        for m in Metric::ALL {
            assert_eq!(Metric::parse(m.name()), Some(m));
        }
        assert_eq!(Metric::parse("cpu"), None);
        assert_eq!(printable(b"user#1\x00\\\xff"), "user#1\\x00\\x5c\\xff");
    }
}
