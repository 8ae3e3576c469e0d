//! Row ranges and row sets over *row keys* (never over storage keys): what a ReadRows request
//! asks for, what a tablet covers, and what a frontend routes.
//!
//! Bigtable's `RowRange` has four kinds of bound (closed or open start and end, each may be
//! unbounded). Over byte strings they all have one canonical form, the half-open
//! `[start, end)`: the smallest key after `k` is `k` followed by a zero byte, so an open start
//! `(k` is the closed start `[k\0`, and a closed end `k]` is the open end `k\0)`. The empty key
//! (never a row key: row keys are non-empty) stands for "from the first row". One form means
//! one comparison rule everywhere, and it is also the shape of a tablet (`[start, end)`, like
//! Bigtable's METADATA rows).

use std::ops::Bound;

use bytes::Bytes;

/// The keys `[start, end)`; `end: None` is "to the last row". May be empty (`end <= start`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RowRange {
    /// The first key in the range (inclusive); empty: from the first row.
    pub start: Bytes,
    /// The first key after the range (exclusive); `None`: to the last row.
    pub end: Option<Bytes>,
}

/// `key` followed by a zero byte: the smallest key greater than `key`.
fn successor(key: &[u8]) -> Bytes {
    let mut k = Vec::with_capacity(key.len() + 1);
    k.extend_from_slice(key);
    k.push(0);
    Bytes::from(k)
}

impl RowRange {
    /// Every row.
    pub fn all() -> RowRange {
        RowRange {
            start: Bytes::new(),
            end: None,
        }
    }

    /// `[start, end)`.
    pub fn new(start: impl Into<Bytes>, end: Option<Bytes>) -> RowRange {
        RowRange {
            start: start.into(),
            end,
        }
    }

    /// Exactly one row.
    pub fn key(key: &[u8]) -> RowRange {
        RowRange {
            start: Bytes::copy_from_slice(key),
            end: Some(successor(key)),
        }
    }

    /// From Bigtable's bounds (an empty key in a bound means unbounded, as the proto says).
    pub fn from_bounds(start: Bound<&[u8]>, end: Bound<&[u8]>) -> RowRange {
        let start = match start {
            Bound::Included(k) => Bytes::copy_from_slice(k),
            Bound::Excluded([]) => Bytes::new(),
            Bound::Excluded(k) => successor(k),
            Bound::Unbounded => Bytes::new(),
        };
        let end = match end {
            Bound::Included([]) | Bound::Excluded([]) => None,
            Bound::Included(k) => Some(successor(k)),
            Bound::Excluded(k) => Some(Bytes::copy_from_slice(k)),
            Bound::Unbounded => None,
        };
        RowRange { start, end }
    }

    /// True when the range holds exactly one possible row key (`[k, k\0)`).
    pub fn is_single_row(&self) -> bool {
        self.end.as_ref().is_some_and(|e| {
            e.len() == self.start.len() + 1 && e.starts_with(&self.start) && e.last() == Some(&0)
        })
    }

    /// True when no key is in the range.
    pub fn is_empty(&self) -> bool {
        self.end.as_ref().is_some_and(|e| *e <= self.start)
    }

    pub fn contains(&self, key: &[u8]) -> bool {
        key >= &self.start[..] && self.end.as_ref().is_none_or(|e| key < &e[..])
    }

    /// The keys in both (possibly empty).
    pub fn intersect(&self, other: &RowRange) -> RowRange {
        let start = self.start.clone().max(other.start.clone());
        let end = match (&self.end, &other.end) {
            (Some(a), Some(b)) => Some(a.clone().min(b.clone())),
            (Some(e), None) | (None, Some(e)) => Some(e.clone()),
            (None, None) => None,
        };
        RowRange { start, end }
    }

    /// True when the two ranges share a key.
    pub fn overlaps(&self, other: &RowRange) -> bool {
        !self.intersect(other).is_empty()
    }

    /// Orders ranges by where they end, "to the last row" last.
    fn end_cmp(a: &Option<Bytes>, b: &Option<Bytes>) -> std::cmp::Ordering {
        match (a, b) {
            (Some(a), Some(b)) => a.cmp(b),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (None, None) => std::cmp::Ordering::Equal,
        }
    }
}

/// A set of rows as sorted, disjoint, non-adjacent, non-empty ranges: each row of the set is
/// in exactly one range, so a scan over the ranges reads every row once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RowSet {
    ranges: Vec<RowRange>,
}

impl RowSet {
    /// Every row (what a ReadRows request without a row set reads).
    pub fn all() -> RowSet {
        RowSet {
            ranges: vec![RowRange::all()],
        }
    }

    /// The union of `ranges` (in any order, overlapping or empty).
    pub fn from_ranges(ranges: impl IntoIterator<Item = RowRange>) -> RowSet {
        let mut ranges: Vec<RowRange> = ranges.into_iter().filter(|r| !r.is_empty()).collect();
        ranges.sort_by(|a, b| a.start.cmp(&b.start));
        let mut out: Vec<RowRange> = Vec::with_capacity(ranges.len());
        for r in ranges {
            match out.last_mut() {
                // Overlapping or touching (the previous end is this start): one range.
                Some(last) if last.end.as_ref().is_none_or(|e| *e >= r.start) => {
                    if RowRange::end_cmp(&r.end, &last.end).is_gt() {
                        last.end = r.end;
                    }
                }
                _ => out.push(r),
            }
        }
        RowSet { ranges: out }
    }

    /// The rows with these keys.
    pub fn from_keys<'a>(keys: impl IntoIterator<Item = &'a [u8]>) -> RowSet {
        RowSet::from_ranges(keys.into_iter().map(RowRange::key))
    }

    pub fn ranges(&self) -> &[RowRange] {
        &self.ranges
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    pub fn contains(&self, key: &[u8]) -> bool {
        // The last range starting at or before the key is the only one that may hold it.
        let i = self.ranges.partition_point(|r| &r.start[..] <= key);
        i > 0 && self.ranges[i - 1].contains(key)
    }

    /// The rows of this set inside `range`.
    pub fn intersect(&self, range: &RowRange) -> RowSet {
        RowSet {
            ranges: self
                .ranges
                .iter()
                .map(|r| r.intersect(range))
                .filter(|r| !r.is_empty())
                .collect(),
        }
    }

    /// The rows of this set outside `range`.
    pub fn without(&self, range: &RowRange) -> RowSet {
        let before = RowRange::new(Bytes::new(), Some(range.start.clone()));
        let mut out: Vec<RowRange> = if range.start.is_empty() {
            vec![]
        } else {
            self.intersect(&before).ranges
        };
        if let Some(end) = &range.end {
            out.extend(self.intersect(&RowRange::new(end.clone(), None)).ranges);
        }
        RowSet::from_ranges(out)
    }

    /// The rows of either set.
    pub fn union(&self, other: &RowSet) -> RowSet {
        RowSet::from_ranges(self.ranges.iter().chain(&other.ranges).cloned())
    }

    /// The ranges in scan order: ascending, or descending for a reversed read.
    pub fn scan_order(&self, reversed: bool) -> Box<dyn Iterator<Item = &RowRange> + '_> {
        if reversed {
            Box::new(self.ranges.iter().rev())
        } else {
            Box::new(self.ranges.iter())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_taken_out_of_a_set_leaves_what_lies_on_either_side() {
        let r = |s: &str, e: Option<&str>| {
            RowRange::new(
                Bytes::copy_from_slice(s.as_bytes()),
                e.map(|e| Bytes::copy_from_slice(e.as_bytes())),
            )
        };
        let set = RowSet::from_ranges([r("b", Some("f")), r("k", None)]);
        assert_eq!(
            set.without(&r("d", Some("m"))),
            RowSet::from_ranges([r("b", Some("d")), r("m", None)])
        );
        assert_eq!(set.without(&RowRange::all()), RowSet::default());
        assert_eq!(
            set.without(&r("", Some("c"))),
            RowSet::from_ranges([r("c", Some("f")), r("k", None)])
        );
        assert_eq!(set.without(&r("g", Some("h"))), set);
        assert!(!set.without(&r("x", None)).contains(b"y"));
        assert!(set.without(&r("x", None)).contains(b"w"));
    }
    use proptest::prelude::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    fn r(start: &str, end: Option<&str>) -> RowRange {
        RowRange::new(b(start), end.map(b))
    }

    #[test]
    fn bounds_become_half_open() {
        use Bound::*;
        let k = |s: &'static str| s.as_bytes();
        assert_eq!(
            RowRange::from_bounds(Included(k("a")), Excluded(k("c"))),
            r("a", Some("c"))
        );
        assert_eq!(
            RowRange::from_bounds(Excluded(k("a")), Included(k("c"))),
            r("a\0", Some("c\0"))
        );
        // An empty key in a bound is unbounded, on either side.
        assert_eq!(
            RowRange::from_bounds(Excluded(k("")), Included(k(""))),
            RowRange::all()
        );
        assert_eq!(RowRange::from_bounds(Unbounded, Unbounded), RowRange::all());
        // (a, a] and [a, a) are empty; [a, a] is the row a; (a, a\0) is empty: nothing is
        // between a key and its successor.
        assert!(RowRange::from_bounds(Excluded(k("a")), Included(k("a"))).is_empty());
        assert!(RowRange::from_bounds(Included(k("a")), Excluded(k("a"))).is_empty());
        assert_eq!(
            RowRange::from_bounds(Included(k("a")), Included(k("a"))),
            RowRange::key(b"a")
        );
        assert!(RowRange::from_bounds(Excluded(k("a")), Excluded(k("a\0"))).is_empty());
        assert!(RowRange::key(b"a").is_single_row());
        assert!(RowRange::from_bounds(Included(k("a")), Included(k("a"))).is_single_row());
        assert!(!r("a", Some("b")).is_single_row());
        assert!(!r("a", Some("a\0\0")).is_single_row());
        assert!(!r("a", None).is_single_row());
    }

    #[test]
    fn row_sets_merge_overlaps_and_neighbours() {
        let set = RowSet::from_ranges([
            r("m", Some("p")),
            r("a", Some("c")),
            r("b", Some("d")),
            r("d", Some("e")), // touches [b, d): merged
            r("x", Some("x")), // empty: dropped
            r("z", None),
        ]);
        assert_eq!(
            set.ranges(),
            &[r("a", Some("e")), r("m", Some("p")), r("z", None)]
        );
        assert!(set.contains(b"a") && set.contains(b"d\xff") && !set.contains(b"e"));
        assert!(set.contains(b"zzz") && !set.contains(b"p") && !set.contains(b""));
        // Duplicate keys are one row.
        let keys = RowSet::from_keys([&b"k"[..], b"k", b"j"]);
        assert_eq!(keys.ranges(), &[RowRange::key(b"j"), RowRange::key(b"k")]);
        let rev: Vec<_> = keys.scan_order(true).cloned().collect();
        assert_eq!(rev, vec![RowRange::key(b"k"), RowRange::key(b"j")]);
    }

    #[test]
    fn intersections() {
        let set = RowSet::from_ranges([r("a", Some("c")), r("e", None)]);
        assert_eq!(
            set.intersect(&r("b", Some("f"))).ranges(),
            &[r("b", Some("c")), r("e", Some("f"))]
        );
        assert!(set.intersect(&r("c", Some("e"))).is_empty());
        assert_eq!(set.intersect(&RowRange::all()), set);
        assert!(!r("a", Some("b")).overlaps(&r("b", None)));
        assert!(r("a", None).overlaps(&r("zz", Some("zzz"))));
    }

    /// Keys over a small alphabet, so that random ranges overlap often.
    fn key() -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(prop_oneof![Just(0u8), Just(b'a'), Just(b'b')], 0..4)
    }

    fn range() -> impl Strategy<Value = RowRange> {
        (key(), proptest::option::of(key()))
            .prop_map(|(s, e)| RowRange::new(Bytes::from(s), e.map(Bytes::from)))
    }

    /// Every key of length < 5 over the alphabet (the probes).
    fn probes() -> Vec<Vec<u8>> {
        let mut out = vec![vec![]];
        for len in 1..5 {
            let mut next = Vec::new();
            for k in out.iter().filter(|k| k.len() == len - 1) {
                for c in [0u8, b'a', b'b'] {
                    let mut k = k.clone();
                    k.push(c);
                    next.push(k);
                }
            }
            out.extend(next);
        }
        out
    }

    proptest! {
        #[test]
        fn set_algebra_agrees_with_membership(
            a in proptest::collection::vec(range(), 0..5),
            b in proptest::collection::vec(range(), 0..5),
            cut in range(),
        ) {
            let sa = RowSet::from_ranges(a.clone());
            let sb = RowSet::from_ranges(b.clone());
            // Normal form: sorted, disjoint, not touching, none empty.
            for w in sa.ranges().windows(2) {
                prop_assert!(w[0].end.as_ref().is_some_and(|e| *e < w[1].start));
            }
            prop_assert!(sa.ranges().iter().all(|r| !r.is_empty()));
            let union = sa.union(&sb);
            let within = sa.intersect(&cut);
            for k in probes() {
                let in_a = a.iter().any(|r| r.contains(&k));
                let in_b = b.iter().any(|r| r.contains(&k));
                prop_assert_eq!(sa.contains(&k), in_a);
                prop_assert_eq!(union.contains(&k), in_a || in_b);
                prop_assert_eq!(within.contains(&k), in_a && cut.contains(&k));
            }
        }
    }
}
