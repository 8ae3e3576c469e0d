//! Garbage-collection rules of column families and their evaluation.
//!
//! Reads hide every cell a family's rule makes eligible (GC is logically immediate); storage's
//! compaction filter and write path remove such cells physically. Both use [`GcRule::eligible`].

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GcRule {
    /// Keep only the newest `n` cells of each column.
    MaxNumVersions(u32),
    /// Delete cells whose timestamp is older than now minus this many microseconds.
    MaxAgeMicros(i64),
    /// Delete cells that every sub-rule would delete.
    Intersection(Vec<GcRule>),
    /// Delete cells that any sub-rule would delete.
    Union(Vec<GcRule>),
}

/// Deepest nesting of union/intersection accepted (Bigtable's limit).
pub const MAX_GC_RULE_DEPTH: usize = 20;

impl GcRule {
    /// Is the cell eligible for collection?
    ///
    /// `index` is the cell's position among the live cells of its column, newest first, when
    /// known. Without it (the compaction filter sees one key at a time) version-count rules are
    /// *unknown*, and the answer is three-valued: `Some(true)` only when the rule certainly
    /// collects the cell, so physical removal never takes a cell a read would still return.
    pub fn eligible(
        &self,
        index: Option<usize>,
        timestamp_micros: i64,
        now_micros: i64,
    ) -> Option<bool> {
        match self {
            GcRule::MaxNumVersions(n) => index.map(|i| i >= *n as usize),
            GcRule::MaxAgeMicros(age) => Some(timestamp_micros.saturating_add(*age) < now_micros),
            GcRule::Union(rules) => {
                let mut unknown = false;
                for r in rules {
                    match r.eligible(index, timestamp_micros, now_micros) {
                        Some(true) => return Some(true),
                        None => unknown = true,
                        Some(false) => {}
                    }
                }
                if unknown { None } else { Some(false) }
            }
            GcRule::Intersection(rules) => {
                // An empty intersection collects nothing (never "everything": that would
                // silently delete a family's data).
                if rules.is_empty() {
                    return Some(false);
                }
                let mut unknown = false;
                for r in rules {
                    match r.eligible(index, timestamp_micros, now_micros) {
                        Some(false) => return Some(false),
                        None => unknown = true,
                        Some(true) => {}
                    }
                }
                if unknown { None } else { Some(true) }
            }
        }
    }

    /// Does the rule depend on the number of versions (so the write path should trim columns)?
    pub fn counts_versions(&self) -> bool {
        match self {
            GcRule::MaxNumVersions(_) => true,
            GcRule::MaxAgeMicros(_) => false,
            GcRule::Union(rs) | GcRule::Intersection(rs) => rs.iter().any(GcRule::counts_versions),
        }
    }

    /// Does the rule collect every cell but the newest of a column, whatever its age (keep one
    /// version, alone or in a union)? For such rules a cell is collected as soon as a cell with
    /// a newer timestamp is written after it, whatever happens to that newer cell later — which
    /// lets storage leave the older cell's physical removal to compaction.
    pub fn keeps_only_newest(&self) -> bool {
        // The youngest possible cell at the earliest possible time: no age rule collects it.
        self.eligible(Some(1), i64::MAX, i64::MIN) == Some(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_000_000_000_000;
    const SECOND: i64 = 1_000_000;

    #[test]
    fn keeps_only_newest_whatever_the_age() {
        let one = GcRule::MaxNumVersions(1);
        let week = GcRule::MaxAgeMicros(7 * 24 * 3600 * SECOND);
        assert!(one.keeps_only_newest());
        assert!(GcRule::Union(vec![week.clone(), one.clone()]).keeps_only_newest());
        assert!(!GcRule::MaxNumVersions(2).keeps_only_newest());
        assert!(!week.keeps_only_newest());
        // An intersection keeps an older version while it is young.
        assert!(!GcRule::Intersection(vec![one.clone(), week.clone()]).keeps_only_newest());
        assert!(
            GcRule::Intersection(vec![one.clone(), GcRule::Union(vec![one, week])])
                .keeps_only_newest()
        );
    }

    #[test]
    fn max_versions_keeps_newest() {
        let r = GcRule::MaxNumVersions(2);
        assert_eq!(r.eligible(Some(0), 0, NOW), Some(false));
        assert_eq!(r.eligible(Some(1), 0, NOW), Some(false));
        assert_eq!(r.eligible(Some(2), 0, NOW), Some(true));
        assert_eq!(r.eligible(None, 0, NOW), None);
        assert!(r.counts_versions());
    }

    #[test]
    fn max_age_and_cell_level_ttl() {
        let r = GcRule::MaxAgeMicros(SECOND);
        // Timestamp = expiry time: visible until one second after it.
        assert_eq!(r.eligible(None, NOW, NOW + SECOND - 1), Some(false));
        assert_eq!(r.eligible(None, NOW, NOW + SECOND), Some(false));
        assert_eq!(r.eligible(None, NOW, NOW + SECOND + 1), Some(true));
        assert_eq!(r.eligible(None, NOW + 60 * SECOND, NOW), Some(false));
        assert!(!r.counts_versions());
    }

    #[test]
    fn union_and_intersection_are_three_valued() {
        let union = GcRule::Union(vec![
            GcRule::MaxNumVersions(1),
            GcRule::MaxAgeMicros(10 * SECOND),
        ]);
        assert_eq!(union.eligible(Some(1), NOW, NOW), Some(true));
        assert_eq!(union.eligible(Some(0), NOW - 11 * SECOND, NOW), Some(true));
        assert_eq!(union.eligible(Some(0), NOW, NOW), Some(false));
        assert_eq!(union.eligible(None, NOW - 11 * SECOND, NOW), Some(true));
        assert_eq!(union.eligible(None, NOW, NOW), None);

        let inter = GcRule::Intersection(vec![
            GcRule::MaxNumVersions(1),
            GcRule::MaxAgeMicros(10 * SECOND),
        ]);
        assert_eq!(inter.eligible(Some(1), NOW - 11 * SECOND, NOW), Some(true));
        assert_eq!(inter.eligible(Some(1), NOW, NOW), Some(false));
        assert_eq!(inter.eligible(Some(0), NOW - 11 * SECOND, NOW), Some(false));
        assert_eq!(inter.eligible(None, NOW - 11 * SECOND, NOW), None);
        assert_eq!(inter.eligible(None, NOW, NOW), Some(false));
        // An empty intersection collects nothing.
        assert_eq!(
            GcRule::Intersection(vec![]).eligible(Some(5), 0, NOW),
            Some(false)
        );
    }
}
