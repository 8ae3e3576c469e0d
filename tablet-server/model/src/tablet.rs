//! Tablets and the tablet map: which server owns which rows of which table.
//!
//! A tablet is a contiguous block of rows of one table, `[start, end)` like Bigtable's
//! METADATA rows, owned by one tablet server at an ownership `epoch` (every change of owner
//! raises it; see `../shared/DISTRIBUTED.md`). The tablets of a table cover all its rows
//! without gaps or overlaps; [`TabletMap::new`] refuses anything else, so a lookup always
//! finds exactly one tablet. Frontends route with it: a row to its tablet, a [`RowSet`] to the
//! part of it each tablet holds, in key order.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use bytes::Bytes;

use crate::range::{RowRange, RowSet};

/// A tablet server's identity (its store id; stable across restarts on the same data dir).
pub type ServerId = String;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tablet {
    /// The table id (not the full resource name).
    pub table: String,
    /// The rows it holds.
    pub range: RowRange,
    /// Raised by every change of owner; a server serves the tablet only at its current epoch.
    pub epoch: u64,
    pub owner: ServerId,
    pub state: TabletState,
}

/// Whether a tablet's data can be served.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "camelCase")]
pub enum TabletState {
    /// Its owner serves it (while it holds its lease).
    #[default]
    Serving,
    /// Its owner is gone for good with the data (its data directory was lost): the tablet is
    /// never handed out empty; it answers UNAVAILABLE until the data is restored or an
    /// administrator accepts the loss.
    Lost,
    /// A move's last phase: its owner stopped serving it (reads and writes answer a retryable
    /// "moving") while the destination applies the last changes; nobody serves it until the
    /// move commits (new owner, epoch + 1) or aborts (back to Serving). Recorded in etcd so
    /// that an owner restarted mid-move does not serve it again on its own.
    Fencing,
}

/// Why a set of tablets is not a tablet map.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TabletMapError {
    #[error("table {table:?}: no tablet starts at the first row")]
    NoFirstTablet { table: String },
    #[error("table {table:?}: the rows from {from:?} to {to:?} are in no tablet")]
    Gap {
        table: String,
        from: Bytes,
        to: Bytes,
    },
    #[error("table {table:?}: tablets overlap at {at:?}")]
    Overlap { table: String, at: Bytes },
    #[error("table {table:?}: no tablet holds the rows from {from:?} to the last row")]
    NoLastTablet { table: String, from: Bytes },
    #[error("table {table:?}: a tablet holds no rows ({start:?})")]
    EmptyTablet { table: String, start: Bytes },
}

/// The tablets of every table, each table's in key order.
///
/// Each table is shared (`Arc`): a clone of the map — a follower publishing the map it keeps
/// up to date — copies one pointer per table, and a change copies the one table it changes
/// (if a published clone still holds it), not the map.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TabletMap {
    tables: BTreeMap<String, Arc<Table>>,
}

/// One table's tablets, and the first bytes of each one's start key side by side.
///
/// A lookup is a binary search over the start keys. Over the tablets themselves, every step
/// reads a tablet (about 140 bytes) and then its key on the heap: two cache misses per step,
/// some 40 for a million tablets, 3.5 µs. Over `heads` — the first 16 bytes of each start
/// as one integer, in one array — a step is one read and one comparison, and only tablets
/// whose starts share those 16 bytes with the row are compared whole. `tops`, every
/// [`BLOCK`]th head, narrows the search to one block first: at a million tablets it is
/// 250 KB that stays in the cache, where the lower steps over all the heads (16 MB) each
/// missed it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Table {
    tablets: Vec<Tablet>,
    /// `head(start)` of each tablet, in the same order.
    heads: Vec<Head>,
    /// `heads[0]`, `heads[BLOCK]`, `heads[2 * BLOCK]`, …
    tops: Vec<Head>,
}

/// Heads per block of [`Table::tops`] (1 KiB of heads).
const BLOCK: usize = 64;

/// The first 16 bytes of a key, zero-padded, as a big-endian integer (so that integer order
/// is byte order). Order-preserving in the weak sense that matters: `a <= b` implies
/// `head(a) <= head(b)`, so a tablet whose head is below a row's starts before the row, one
/// whose head is above starts after it.
type Head = u128;

fn head(key: &[u8]) -> Head {
    let mut h = [0; 16];
    let n = key.len().min(16);
    h[..n].copy_from_slice(&key[..n]);
    u128::from_be_bytes(h)
}

impl Table {
    fn new(tablets: Vec<Tablet>) -> Table {
        let heads: Vec<Head> = tablets.iter().map(|t| head(&t.range.start)).collect();
        let tops = heads.iter().step_by(BLOCK).copied().collect();
        Table {
            tablets,
            heads,
            tops,
        }
    }

    /// How many heads are below `h`: a block by `tops`, then the heads of that block.
    fn below(&self, h: Head) -> usize {
        let j = self.tops.partition_point(|x| *x < h);
        let lo = j.saturating_sub(1) * BLOCK;
        let hi = (j * BLOCK).min(self.heads.len());
        lo + self.heads[lo..hi].partition_point(|x| *x < h)
    }

    /// How many heads from `from` on equal `h` (usually none: one read).
    fn run(&self, from: usize, h: Head) -> usize {
        let rest = &self.heads[from..];
        if rest.first() != Some(&h) {
            return 0;
        }
        let mut n = 1;
        while n < rest.len() && rest[n] == h {
            n *= 2;
        }
        let lo = n / 2;
        lo + rest[lo..n.min(rest.len())].partition_point(|x| *x == h)
    }

    /// How many tablets start at or before `row` (the one holding it is the last of them).
    fn up_to(&self, row: &[u8]) -> usize {
        let h = head(row);
        let below = self.below(h);
        let same = self.run(below, h);
        below + self.tablets[below..below + same].partition_point(|t| &t.range.start[..] <= row)
    }

    /// How many tablets start before `key`.
    fn before(&self, key: &[u8]) -> usize {
        let h = head(key);
        let below = self.below(h);
        let same = self.run(below, h);
        below + self.tablets[below..below + same].partition_point(|t| &t.range.start[..] < key)
    }

    /// The index of the tablet whose range ends at `end` (None: the last), if one does.
    fn ending_at(&self, end: &Option<Bytes>) -> Option<usize> {
        match end {
            None => self
                .tablets
                .last()
                .filter(|t| t.range.end.is_none())
                .map(|_| self.tablets.len() - 1),
            Some(e) => self
                .before(e)
                .checked_sub(1)
                .filter(|&i| self.tablets[i].range.end.as_ref() == Some(e)),
        }
    }

    /// Puts `tablets` in place of the tablets at `at`.
    fn splice(&mut self, at: std::ops::Range<usize>, tablets: Vec<Tablet>) {
        let heads: Vec<Head> = tablets.iter().map(|t| head(&t.range.start)).collect();
        let (from, same_count) = (at.start, tablets.len() == at.len());
        let to = at.start + tablets.len();
        self.heads.splice(at.clone(), heads);
        self.tablets.splice(at, tablets);
        // The tops of the blocks the change touched (a move: one), or from the first of them
        // on when the later tablets shifted.
        let first = from / BLOCK;
        if same_count {
            for block in first..to.div_ceil(BLOCK) {
                self.tops[block] = self.heads[block * BLOCK];
            }
        } else {
            self.tops.truncate(first);
            (self.tops).extend(self.heads[first * BLOCK..].iter().step_by(BLOCK).copied());
        }
    }
}

/// Checks that `tablets` (sorted by start) hold exactly the rows from `start` to `end`
/// (None: the last row), each some, one after another.
fn check_run(
    table: &str,
    tablets: &[Tablet],
    start: &Bytes,
    end: &Option<Bytes>,
) -> Result<(), TabletMapError> {
    let table = table.to_string();
    let Some(first) = tablets.first() else {
        return Err(TabletMapError::Gap {
            table,
            from: start.clone(),
            to: end.clone().unwrap_or_default(),
        });
    };
    if first.range.start != *start {
        return Err(TabletMapError::Overlap {
            table,
            at: first.range.start.clone(),
        });
    }
    if let Some(t) = tablets.iter().find(|t| t.range.is_empty()) {
        return Err(TabletMapError::EmptyTablet {
            table,
            start: t.range.start.clone(),
        });
    }
    for w in tablets.windows(2) {
        match &w[0].range.end {
            Some(e) if *e == w[1].range.start => {}
            Some(e) if *e < w[1].range.start => {
                return Err(TabletMapError::Gap {
                    table,
                    from: e.clone(),
                    to: w[1].range.start.clone(),
                });
            }
            _ => {
                return Err(TabletMapError::Overlap {
                    table,
                    at: w[1].range.start.clone(),
                });
            }
        }
    }
    let last = &tablets[tablets.len() - 1];
    if last.range.end != *end {
        return Err(match &last.range.end {
            Some(e) => TabletMapError::NoLastTablet {
                table,
                from: e.clone(),
            },
            None => TabletMapError::Overlap {
                table,
                at: last.range.start.clone(),
            },
        });
    }
    Ok(())
}

impl TabletMap {
    /// Checks that each table's tablets cover all its rows exactly once.
    pub fn new(tablets: impl IntoIterator<Item = Tablet>) -> Result<TabletMap, TabletMapError> {
        let mut by_table: BTreeMap<String, Vec<Tablet>> = BTreeMap::new();
        for t in tablets {
            by_table.entry(t.table.clone()).or_default().push(t);
        }
        let mut tables = BTreeMap::new();
        for (table, mut tablets) in by_table {
            tablets.sort_by(|a, b| a.range.start.cmp(&b.range.start));
            check_cover(&table, &tablets)?;
            tables.insert(table, Arc::new(Table::new(tablets)));
        }
        Ok(TabletMap { tables })
    }

    /// The tablets of `table`, in key order (empty for an unknown table).
    pub fn tablets(&self, table: &str) -> &[Tablet] {
        self.tables
            .get(table)
            .map(|t| t.tablets.as_slice())
            .unwrap_or(&[])
    }

    pub fn tables(&self) -> impl Iterator<Item = &str> {
        self.tables.keys().map(String::as_str)
    }

    /// The tablet holding `row` (None only for an unknown table).
    pub fn tablet_for(&self, table: &str, row: &[u8]) -> Option<&Tablet> {
        let table = self.tables.get(table)?;
        let i = table.up_to(row);
        i.checked_sub(1).map(|i| &table.tablets[i])
    }

    /// The part of `rows` each tablet holds, for the tablets that hold any, in scan order
    /// (ascending, or descending for a reversed read). The parts partition `rows`.
    ///
    /// Each range of `rows` finds its first tablet by binary search and walks on only while
    /// tablets start inside it: the cost grows with the ranges and the parts, not with the
    /// table's tablets (a MutateRows of a few rows over a table of a million tablets looks
    /// at a few tablets).
    pub fn split<'a>(
        &'a self,
        table: &str,
        rows: &RowSet,
        reversed: bool,
    ) -> Vec<(&'a Tablet, RowSet)> {
        let Some(index) = self.tables.get(table) else {
            return Vec::new();
        };
        let tablets = &index.tablets;
        // (tablet index, its part of one range), ascending: the ranges are sorted and
        // disjoint, so the indices never go down.
        let mut pieces: Vec<(usize, RowRange)> = Vec::new();
        for range in rows.ranges() {
            let first = index.up_to(&range.start).saturating_sub(1);
            for (i, t) in tablets.iter().enumerate().skip(first) {
                if range.end.as_ref().is_some_and(|end| t.range.start >= *end) {
                    break;
                }
                let piece = range.intersect(&t.range);
                if !piece.is_empty() {
                    pieces.push((i, piece));
                }
            }
        }
        let mut parts: Vec<(&Tablet, RowSet)> = Vec::new();
        let mut pieces = pieces.into_iter().peekable();
        while let Some((i, piece)) = pieces.next() {
            let mut ranges = vec![piece];
            while let Some((_, more)) = pieces.next_if(|(j, _)| *j == i) {
                ranges.push(more);
            }
            parts.push((&tablets[i], RowSet::from_ranges(ranges)));
        }
        if reversed {
            parts.reverse();
        }
        parts
    }

    /// Puts `tablets` (of one table, contiguous: a moved tablet, the halves of a split, the
    /// tablet merged from neighbours) in place of the tablets holding the same rows: the way
    /// a follower applies one change of the map without rebuilding it, at the cost of a
    /// binary search and the shift of the table's later tablets when their count changes.
    /// Refused, the map unchanged, when the new tablets are not contiguous or do not hold
    /// exactly the rows of whole tablets of the map (a change read out of order: read the
    /// whole map again).
    pub fn replace(&mut self, tablets: Vec<Tablet>) -> Result<(), TabletMapError> {
        let Some(first) = tablets.first() else {
            return Ok(());
        };
        let table = first.table.clone();
        let gap = |from: &Bytes, to: &Bytes| TabletMapError::Gap {
            table: table.clone(),
            from: from.clone(),
            to: to.clone(),
        };
        let mut tablets = tablets;
        tablets.sort_by(|a, b| a.range.start.cmp(&b.range.start));
        for w in tablets.windows(2) {
            if w[1].table != table || w[0].range.end.as_ref() != Some(&w[1].range.start) {
                return Err(gap(&w[0].range.start, &w[1].range.start));
            }
        }
        if let Some(t) = tablets.iter().find(|t| t.range.is_empty()) {
            return Err(TabletMapError::EmptyTablet {
                table,
                start: t.range.start.clone(),
            });
        }
        let start = tablets[0].range.start.clone();
        let end = tablets[tablets.len() - 1].range.end.clone();
        let Some(current) = self.tables.get_mut(&table) else {
            // A table new to the map comes whole.
            if start.is_empty() && end.is_none() {
                self.tables.insert(table, Arc::new(Table::new(tablets)));
                return Ok(());
            }
            return Err(TabletMapError::NoFirstTablet { table });
        };
        let from = current.before(&start);
        let to = match &end {
            Some(end) => current.before(end),
            None => current.tablets.len(),
        };
        let whole = from < to
            && current.tablets[from].range.start == start
            && current.tablets[to - 1].range.end == end;
        if !whole {
            return Err(TabletMapError::Overlap { table, at: start });
        }
        Arc::make_mut(current).splice(from..to, tablets);
        Ok(())
    }

    /// Puts `tablets` as the whole of `table` (none: the table leaves the map). Refused, the
    /// map unchanged, when they do not cover its rows exactly once.
    pub fn set_table(
        &mut self,
        table: &str,
        mut tablets: Vec<Tablet>,
    ) -> Result<(), TabletMapError> {
        if tablets.is_empty() {
            self.tables.remove(table);
            return Ok(());
        }
        tablets.sort_by(|a, b| a.range.start.cmp(&b.range.start));
        if let Some(t) = tablets.iter().find(|t| t.table != table) {
            return Err(TabletMapError::Overlap {
                table: table.to_string(),
                at: t.range.start.clone(),
            });
        }
        check_cover(table, &tablets)?;
        self.tables
            .insert(table.to_string(), Arc::new(Table::new(tablets)));
        Ok(())
    }

    /// Applies changes of `table`'s records as a follower of the coordination store sees
    /// them: one record per tablet, keyed by where its rows end (None: the table's last
    /// tablet), each change the record's new tablet or its deletion (None). Applied in order
    /// (the last change of a key wins), as key-value changes: a change seen again (a watch
    /// resumed from an older revision) leaves what it set. Only the tablets around the
    /// changed keys are touched. A table whose records are all deleted leaves the map; a table
    /// new to the map must come whole.
    ///
    /// Refused, the map unchanged, when the result would not cover the table's rows exactly
    /// once (changes out of step with the map: read the whole map again).
    pub fn apply(
        &mut self,
        table: &str,
        changes: impl IntoIterator<Item = (Option<Bytes>, Option<Tablet>)>,
    ) -> Result<(), TabletMapError> {
        let mut last: HashMap<Option<Bytes>, Option<Tablet>> = HashMap::new();
        for (end, tablet) in changes {
            last.insert(end, tablet);
        }
        let puts = || last.values().flatten().cloned();
        let Some(current) = self.tables.get(table) else {
            let mut tablets: Vec<Tablet> = puts().collect();
            if tablets.is_empty() {
                return Ok(());
            }
            tablets.sort_by(|a, b| a.range.start.cmp(&b.range.start));
            check_cover(table, &tablets)?;
            self.tables
                .insert(table.to_string(), Arc::new(Table::new(tablets)));
            return Ok(());
        };
        let old = &current.tablets;
        // The rows the changes touch: the tablets whose records changed, as they were and as
        // they are now.
        let mut start: Option<Bytes> = None;
        let mut end: Option<Option<Bytes>> = None;
        let mut widen = |range: &RowRange| {
            if start.as_ref().is_none_or(|s| range.start < *s) {
                start = Some(range.start.clone());
            }
            let later = match (&end, &range.end) {
                (None, _) | (Some(Some(_)), None) => true,
                (Some(Some(e)), Some(r)) => r > e,
                (Some(None), _) => false,
            };
            if later {
                end = Some(range.end.clone());
            }
        };
        for (key, tablet) in &last {
            if let Some(i) = current.ending_at(key) {
                widen(&old[i].range);
            }
            if let Some(t) = tablet {
                widen(&t.range);
            }
        }
        let (Some(start), Some(end)) = (start, end) else {
            return Ok(()); // only deletions of records the map does not have
        };
        // Whole tablets of the map around them, and what holds their rows now.
        let from = current.up_to(&start).saturating_sub(1);
        let to = match &end {
            None => old.len(),
            Some(e) => current.before(e),
        };
        let mut now: Vec<Tablet> = old[from..to]
            .iter()
            .filter(|t| !last.contains_key(&t.range.end))
            .cloned()
            .chain(puts())
            .collect();
        now.sort_by(|a, b| a.range.start.cmp(&b.range.start));
        if now.is_empty() && from == 0 && to == old.len() {
            self.tables.remove(table);
            return Ok(());
        }
        check_run(table, &now, &old[from].range.start, &old[to - 1].range.end)?;
        let current = self.tables.get_mut(table).expect("looked up above");
        Arc::make_mut(current).splice(from..to, now);
        Ok(())
    }

    /// The tablets owned by `server`, over every table.
    pub fn owned_by<'a>(&'a self, server: &'a str) -> impl Iterator<Item = &'a Tablet> + 'a {
        self.tables
            .values()
            .flat_map(|t| &t.tablets)
            .filter(move |t| t.owner == server)
    }
}

fn check_cover(table: &str, tablets: &[Tablet]) -> Result<(), TabletMapError> {
    let table = table.to_string();
    if tablets.first().is_none_or(|t| !t.range.start.is_empty()) {
        return Err(TabletMapError::NoFirstTablet { table });
    }
    for t in tablets {
        if t.range.is_empty() {
            return Err(TabletMapError::EmptyTablet {
                table,
                start: t.range.start.clone(),
            });
        }
    }
    for w in tablets.windows(2) {
        let (a, b) = (&w[0].range, &w[1].range);
        match &a.end {
            None => {
                return Err(TabletMapError::Overlap {
                    table,
                    at: b.start.clone(),
                });
            }
            Some(end) if *end < b.start => {
                return Err(TabletMapError::Gap {
                    table,
                    from: end.clone(),
                    to: b.start.clone(),
                });
            }
            Some(end) if *end > b.start => {
                return Err(TabletMapError::Overlap {
                    table,
                    at: b.start.clone(),
                });
            }
            Some(_) => {}
        }
    }
    let last = tablets.last().expect("checked non-empty above");
    if let Some(end) = &last.range.end {
        return Err(TabletMapError::NoLastTablet {
            table,
            from: end.clone(),
        });
    }
    Ok(())
}

impl fmt::Display for Tablet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let end = match &self.range.end {
            Some(e) => format!("{:?}", e),
            None => "end".into(),
        };
        write!(
            f,
            "{}[{:?}, {})@{} on {}",
            self.table, self.range.start, end, self.epoch, self.owner
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tablet(table: &str, start: &str, end: Option<&str>, owner: &str) -> Tablet {
        Tablet {
            table: table.into(),
            range: RowRange::new(
                Bytes::copy_from_slice(start.as_bytes()),
                end.map(|e| Bytes::copy_from_slice(e.as_bytes())),
            ),
            epoch: 1,
            owner: owner.into(),
            state: TabletState::Serving,
        }
    }

    #[test]
    fn replace_applies_a_move_a_split_and_a_merge_in_place() {
        let mut m = map();
        let before = m.clone();
        // A move: same rows, new owner.
        let mut moved = m.tablet_for("t", b"h").unwrap().clone();
        moved.owner = "s9".into();
        moved.epoch += 1;
        m.replace(vec![moved.clone()]).unwrap();
        assert_eq!(m.tablet_for("t", b"h").unwrap(), &moved);
        // A split of it at "j", then the halves merged back.
        let (lo, hi) = (
            tablet(
                "t",
                &String::from_utf8_lossy(&moved.range.start),
                Some("j"),
                "s9",
            ),
            tablet(
                "t",
                "j",
                moved
                    .range
                    .end
                    .as_deref()
                    .map(|e| std::str::from_utf8(e).unwrap()),
                "s9",
            ),
        );
        m.replace(vec![hi.clone(), lo.clone()]).unwrap();
        assert_eq!(m.tablet_for("t", b"i").unwrap(), &lo);
        assert_eq!(m.tablet_for("t", b"j").unwrap(), &hi);
        let rebuilt = TabletMap::new(
            m.tables()
                .flat_map(|t| m.tablets(t).to_vec())
                .collect::<Vec<_>>(),
        );
        assert_eq!(rebuilt.as_ref(), Ok(&m), "still a tablet map");
        m.replace(vec![before.tablet_for("t", b"h").unwrap().clone()])
            .unwrap();
        assert_eq!(m, before);
        // Out of step with the map: refused, nothing changed.
        let stray = tablet("t", "b", Some("i"), "s1");
        assert!(m.replace(vec![stray]).is_err());
        let holey = vec![
            tablet("t", "", Some("b"), "s1"),
            tablet("t", "c", None, "s1"),
        ];
        assert!(m.replace(holey).is_err());
        assert_eq!(m, before);
        // A new table's whole map; not part of one.
        assert!(m.replace(vec![tablet("w", "k", None, "s1")]).is_err());
        assert!(m.tablets("w").is_empty() && m.tables().count() == 2);
        m.replace(vec![tablet("v", "", None, "s1")]).unwrap();
        assert_eq!(m.tablet_for("v", b"x").unwrap().owner, "s1");
    }

    /// The record changes of tablets put (keyed by their ends) and of ends deleted.
    fn puts(tablets: &[Tablet]) -> Vec<(Option<Bytes>, Option<Tablet>)> {
        tablets
            .iter()
            .map(|t| (t.range.end.clone(), Some(t.clone())))
            .collect()
    }

    fn end(e: &str) -> Option<Bytes> {
        Some(Bytes::copy_from_slice(e.as_bytes()))
    }

    #[test]
    fn apply_follows_moves_splits_merges_and_deletions_as_record_changes() {
        let mut m = map();
        // A move: the record ending at p gets a new owner.
        let moved = Tablet {
            epoch: 2,
            ..tablet("t", "g", Some("p"), "s9")
        };
        m.apply("t", puts(std::slice::from_ref(&moved))).unwrap();
        assert_eq!(m.tablet_for("t", b"h"), Some(&moved));
        // A split at j: the record ending at p now starts at j, a new one ends at j.
        let (lo, hi) = (
            tablet("t", "g", Some("j"), "s9"),
            tablet("t", "j", Some("p"), "s9"),
        );
        m.apply("t", puts(&[hi.clone(), lo.clone()])).unwrap();
        assert_eq!(m.tablets("t").len(), 4);
        assert_eq!(m.tablet_for("t", b"i"), Some(&lo));
        // A merge of [, g) and [g, j): the record ending at g is deleted, the one ending at j
        // starts at the first row.
        let merged = tablet("t", "", Some("j"), "s1");
        m.apply("t", [(end("g"), None), (end("j"), Some(merged.clone()))])
            .unwrap();
        assert_eq!(m.tablets("t")[0], merged);
        assert_eq!(
            TabletMap::new(m.tables().flat_map(|t| m.tablets(t).to_vec())).as_ref(),
            Ok(&m),
            "still a tablet map"
        );
        // Changes out of step with the map are refused, the map unchanged: a tablet
        // overlapping one whose record did not change; a deletion leaving a gap.
        let before = m.clone();
        assert!(
            m.apply("t", puts(&[tablet("t", "a", Some("z"), "s1")]))
                .is_err()
        );
        assert!(m.apply("t", [(end("j"), None)]).is_err());
        assert!(m.apply("t", [(None, None)]).is_err());
        assert_eq!(m, before);
        // Deleting records the map does not have changes nothing.
        m.apply("t", [(end("q"), None)]).unwrap();
        m.apply("gone", [(None, None)]).unwrap();
        assert_eq!(m, before);
        // A new table comes whole; half of one is refused.
        assert!(m.apply("w", puts(&[tablet("w", "k", None, "s1")])).is_err());
        m.apply(
            "w",
            puts(&[
                tablet("w", "", Some("k"), "s1"),
                tablet("w", "k", None, "s2"),
            ]),
        )
        .unwrap();
        assert_eq!(m.tablet_for("w", b"m").unwrap().owner, "s2");
        // All of a table's records deleted: the table leaves the map.
        m.apply("w", [(end("k"), None), (None, None)]).unwrap();
        assert!(m.tablets("w").is_empty());
        assert_eq!(m, before);
        // A clone published before a change keeps what it had.
        let published = m.clone();
        m.apply("u", puts(&[tablet("u", "", None, "s7")])).unwrap();
        assert_eq!(published.tablet_for("u", b"a").unwrap().owner, "s1");
        assert_eq!(m.tablet_for("u", b"a").unwrap().owner, "s7");
    }

    proptest! {
        /// A follower applying the record changes of any run of splits, merges and moves,
        /// whole transactions grouped in any way (etcd's watch responses), has the map of the
        /// records after each group; and one that sees changes again (resumed from an older
        /// point than its copy) ends with the map of the records too.
        #[test]
        fn apply_agrees_with_the_records(
            ops in proptest::collection::vec((0u8..3, 0usize..64, "[a-z]{1,3}"), 1..40),
            cuts in proptest::collection::vec(1usize..6, 1..40),
            snapshot in 0usize..40,
            resume in 0usize..40,
        ) {
            type Change = (Option<Bytes>, Option<Tablet>);
            let map_of = |records: &BTreeMap<Option<Bytes>, Tablet>| {
                TabletMap::new(records.values().cloned()).unwrap()
            };
            // The store: one record per tablet, keyed by its end; its transactions, and the
            // map after each.
            // 131 tablets to begin with: more than two blocks of lookup heads.
            let mut starts: Vec<String> = vec![String::new()];
            starts.extend(('a'..='z').flat_map(|c| (0..5).map(move |d| format!("{c}{d}"))));
            let mut records: BTreeMap<Option<Bytes>, Tablet> = BTreeMap::new();
            for (i, start) in starts.iter().enumerate() {
                let t = tablet("t", start, starts.get(i + 1).map(String::as_str), "s0");
                records.insert(t.range.end.clone(), t);
            }
            let mut maps = vec![map_of(&records)];
            let mut txns: Vec<Vec<Change>> = Vec::new();
            for (n, (op, pick, key)) in ops.into_iter().enumerate() {
                let sorted = maps.last().unwrap().tablets("t").to_vec();
                let i = pick % sorted.len();
                let t = sorted[i].clone();
                let mut txn: Vec<Change> = Vec::new();
                match op {
                    0 => {
                        let moved = Tablet { owner: format!("s{n}"), epoch: t.epoch + 1, ..t };
                        txn.push((moved.range.end.clone(), Some(moved)));
                    }
                    1 => {
                        let at = Bytes::copy_from_slice(key.as_bytes());
                        if at > t.range.start && t.range.end.as_ref().is_none_or(|e| at < *e) {
                            let lo = Tablet {
                                range: RowRange::new(t.range.start.clone(), Some(at.clone())),
                                ..t.clone()
                            };
                            let hi = Tablet { range: RowRange::new(at, t.range.end.clone()), ..t };
                            txn.push((lo.range.end.clone(), Some(lo)));
                            txn.push((hi.range.end.clone(), Some(hi)));
                        }
                    }
                    _ => {
                        if let Some(next) = sorted.get(i + 1) {
                            let merged = Tablet {
                                range: RowRange::new(t.range.start.clone(), next.range.end.clone()),
                                ..next.clone()
                            };
                            txn.push((t.range.end.clone(), None));
                            txn.push((merged.range.end.clone(), Some(merged)));
                        }
                    }
                }
                for (key, tablet) in &txn {
                    match tablet {
                        Some(t) => records.insert(key.clone(), t.clone()),
                        None => records.remove(key),
                    };
                }
                txns.push(txn);
                maps.push(map_of(&records));
            }
            let expected = maps.last().unwrap().clone();
            // Whole transactions in groups, from the start.
            let mut m = maps[0].clone();
            let mut at = 0;
            for cut in cuts.iter().cycle() {
                if at >= txns.len() {
                    break;
                }
                let next = (at + cut).min(txns.len());
                m.apply("t", txns[at..next].concat()).unwrap();
                prop_assert_eq!(&m, &maps[next]);
                at = next;
            }
            prop_assert_eq!(&m, &expected);
            // A copy at transaction `snapshot`, changes from an older one on.
            let snapshot = snapshot.min(txns.len());
            let resume = resume.min(snapshot);
            let mut replayed = maps[snapshot].clone();
            replayed.apply("t", txns[resume..].concat()).unwrap();
            prop_assert_eq!(&replayed, &expected);
        }
    }

    /// Table t split at g and p over three servers; table u in one tablet.
    fn map() -> TabletMap {
        TabletMap::new([
            tablet("t", "p", None, "s3"),
            tablet("t", "", Some("g"), "s1"),
            tablet("t", "g", Some("p"), "s2"),
            tablet("u", "", None, "s1"),
        ])
        .unwrap()
    }

    #[test]
    fn lookups_find_the_one_tablet_holding_a_row() {
        let m = map();
        let owner = |row: &str| m.tablet_for("t", row.as_bytes()).unwrap().owner.clone();
        assert_eq!(owner("a"), "s1");
        assert_eq!(owner("f\u{ff}"), "s1");
        assert_eq!(owner("g"), "s2");
        assert_eq!(owner("o"), "s2");
        assert_eq!(owner("p"), "s3");
        assert_eq!(owner("zzz"), "s3");
        assert_eq!(m.tablet_for("u", b"x").unwrap().owner, "s1");
        assert!(m.tablet_for("nope", b"x").is_none());
        assert_eq!(m.owned_by("s1").count(), 2);
        assert_eq!(m.tables().collect::<Vec<_>>(), ["t", "u"]);
    }

    #[test]
    fn row_sets_split_by_tablet_in_scan_order() {
        let m = map();
        let set = RowSet::from_ranges([
            RowRange::key(b"a"),
            RowRange::new(Bytes::from_static(b"f"), Some(Bytes::from_static(b"h"))),
            RowRange::new(Bytes::from_static(b"x"), None),
        ]);
        let parts = m.split("t", &set, false);
        let owners: Vec<&str> = parts.iter().map(|(t, _)| t.owner.as_str()).collect();
        assert_eq!(owners, ["s1", "s2", "s3"]);
        assert_eq!(
            parts[0].1.ranges(),
            &[
                RowRange::key(b"a"),
                RowRange::new(Bytes::from_static(b"f"), Some(Bytes::from_static(b"g")))
            ]
        );
        assert_eq!(
            parts[1].1.ranges(),
            &[RowRange::new(
                Bytes::from_static(b"g"),
                Some(Bytes::from_static(b"h"))
            )]
        );
        let reversed: Vec<&str> = m
            .split("t", &set, true)
            .iter()
            .map(|(t, _)| t.owner.as_str())
            .collect();
        assert_eq!(reversed, ["s3", "s2", "s1"]);
        // Tablets holding none of the rows are left out.
        assert_eq!(
            m.split("t", &RowSet::from_keys([&b"h"[..]]), false).len(),
            1
        );
    }

    #[test]
    fn gaps_overlaps_and_missing_ends_are_refused() {
        let err = |tablets: Vec<Tablet>| TabletMap::new(tablets).unwrap_err();
        assert!(matches!(
            err(vec![tablet("t", "a", None, "s")]),
            TabletMapError::NoFirstTablet { .. }
        ));
        assert!(matches!(
            err(vec![tablet("t", "", Some("g"), "s")]),
            TabletMapError::NoLastTablet { .. }
        ));
        assert!(matches!(
            err(vec![
                tablet("t", "", Some("g"), "s"),
                tablet("t", "h", None, "s")
            ]),
            TabletMapError::Gap { .. }
        ));
        assert!(matches!(
            err(vec![
                tablet("t", "", Some("h"), "s"),
                tablet("t", "g", None, "s")
            ]),
            TabletMapError::Overlap { .. }
        ));
        assert!(matches!(
            err(vec![
                tablet("t", "", None, "s"),
                tablet("t", "g", None, "s")
            ]),
            TabletMapError::Overlap { .. }
        ));
        assert!(matches!(
            err(vec![
                tablet("t", "", Some("g"), "s"),
                tablet("t", "g", Some("g"), "s"),
                tablet("t", "g", None, "s")
            ]),
            TabletMapError::EmptyTablet { .. }
        ));
    }

    proptest! {
        /// Lookups through the 16-byte heads agree with a plain search over the tablets, also
        /// for keys sharing more than 16 bytes, keys of zero bytes and keys shorter than
        /// their neighbours' (the heads tie; the whole keys decide).
        #[test]
        fn lookups_agree_with_a_plain_search(
            prefix in 0usize..20,
            splits in proptest::collection::btree_set("[ab\\x00]{1,6}", 0..300),
            rows in proptest::collection::vec("[ab\\x00]{0,5}", 1..20),
        ) {
            let pad = |k: &str| {
                let mut v = vec![b'p'; prefix];
                v.extend_from_slice(k.as_bytes());
                Bytes::from(v)
            };
            let mut starts: Vec<Bytes> = vec![Bytes::new()];
            starts.extend(splits.iter().map(|k| pad(k)));
            starts.sort();
            starts.dedup();
            let tablets: Vec<Tablet> = starts.iter().enumerate().map(|(i, start)| Tablet {
                table: "t".into(),
                range: RowRange::new(start.clone(), starts.get(i + 1).cloned()),
                epoch: 1,
                owner: format!("s{i}"),
                state: TabletState::Serving,
            }).collect();
            let m = TabletMap::new(tablets.clone()).unwrap();
            for row in rows.iter().map(|r| pad(r)).chain(starts.iter().cloned()) {
                let plain = tablets.iter().rfind(|t| t.range.start <= row).unwrap();
                prop_assert_eq!(m.tablet_for("t", &row), Some(plain));
                prop_assert!(plain.range.contains(&row));
            }
        }

        /// Whatever the split points and the row set, the parts partition the set: every row
        /// of the set is in exactly one part, that of the tablet holding it.
        #[test]
        fn split_partitions_the_row_set(
            splits in proptest::collection::btree_set("[ab]{1,3}", 0..6),
            ranges in proptest::collection::vec(("[ab]{0,3}", proptest::option::of("[ab]{0,3}")), 0..5),
            reversed in any::<bool>(),
        ) {
            let mut bounds: Vec<Option<String>> = vec![None];
            bounds.extend(splits.iter().cloned().map(Some));
            let tablets = bounds.iter().enumerate().map(|(i, start)| {
                let start = start.clone().unwrap_or_default();
                let end = bounds.get(i + 1).cloned().flatten();
                tablet("t", &start, end.as_deref(), &format!("s{i}"))
            });
            let m = TabletMap::new(tablets).unwrap();
            let set = RowSet::from_ranges(ranges.iter().map(|(s, e)| RowRange::new(
                Bytes::from(s.clone()), e.clone().map(Bytes::from))));
            let parts = m.split("t", &set, reversed);
            // The same as intersecting the set with every tablet, in order.
            let mut naive: Vec<(&Tablet, RowSet)> = m.tablets("t").iter()
                .map(|t| (t, set.intersect(&t.range)))
                .filter(|(_, part)| !part.is_empty())
                .collect();
            if reversed { naive.reverse(); }
            prop_assert_eq!(&parts, &naive);
            let starts: Vec<&Bytes> = parts.iter().map(|(t, _)| &t.range.start).collect();
            let mut sorted = starts.clone();
            sorted.sort();
            if reversed { sorted.reverse(); }
            prop_assert_eq!(starts, sorted);
            for len in 0..5 {
                for n in 0..(1u32 << len) {
                    let k: Vec<u8> = (0..len).map(|i| if n >> i & 1 == 1 { b'b' } else { b'a' }).collect();
                    let holders: Vec<&Tablet> = parts.iter().filter(|(_, p)| p.contains(&k)).map(|(t, _)| *t).collect();
                    if set.contains(&k) {
                        prop_assert_eq!(holders, vec![m.tablet_for("t", &k).unwrap()]);
                    } else {
                        prop_assert!(holders.is_empty());
                    }
                }
            }
        }
    }
}
