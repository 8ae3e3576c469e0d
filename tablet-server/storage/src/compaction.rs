//! The GC compaction filter: physically removes what reads already hide.

use std::ffi::CStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use basalt_model::hlc::now_micros;
use rocksdb::compaction_filter::{CompactionFilter, Decision};
use rocksdb::compaction_filter_factory::{CompactionFilterContext, CompactionFilterFactory};

use crate::catalog::SharedCatalog;
use crate::encoding::{self, KeyEntry, ValueKind};

/// No bound: nothing is replicated to this store (the stored value of `None`).
const UNBOUNDED: u64 = u64::MAX;

/// The replication safe point shared by the store and its compaction filters (set through
/// [`crate::safe_point`]).
#[derive(Debug)]
pub(crate) struct SharedSafePoint(AtomicU64);

impl SharedSafePoint {
    pub(crate) fn new(initial: Option<u64>) -> SharedSafePoint {
        SharedSafePoint(AtomicU64::new(initial.unwrap_or(UNBOUNDED)))
    }

    pub(crate) fn get(&self) -> Option<u64> {
        match self.0.load(Ordering::Acquire) {
            UNBOUNDED => None,
            hlc => Some(hlc),
        }
    }

    pub(crate) fn set(&self, safe_point: Option<u64>) {
        self.0
            .store(safe_point.unwrap_or(UNBOUNDED), Ordering::Release);
    }
}

pub(crate) struct GcFilterFactory {
    pub(crate) catalog: Arc<SharedCatalog>,
    pub(crate) grace_micros: i64,
    pub(crate) safe_point: Arc<SharedSafePoint>,
}

impl CompactionFilterFactory for GcFilterFactory {
    type Filter = GcFilter;

    fn create(&mut self, _context: CompactionFilterContext) -> GcFilter {
        GcFilter {
            catalog: self.catalog.clone(),
            grace_micros: self.grace_micros,
            safe_point: self.safe_point.clone(),
            now: now_micros(),
            last_column: LastColumn::default(),
        }
    }

    fn name(&self) -> &CStr {
        c"basalt-gc-factory"
    }
}

/// Physically removes what reads already hide: cells of dropped families, cells a family's GC
/// rule certainly collects, and tombstones no write can need any more ([`tombstone_expired`]:
/// older than the grace period and, with replication, below the safe point). Unknown tables are
/// kept: deleted tables are removed by range deletion, and a table being created must never
/// lose data to a race.
///
/// Version counts are trimmed on the write path, except in families that keep only the newest
/// cell ([`GcRule::keeps_only_newest`](basalt_model::gc::GcRule::keeps_only_newest)), where
/// the write path trims only the memtable. Here such a cell goes when this compaction saw, in
/// the same column, a cell with a newer timestamp written after it (a higher write version):
/// that write collected it, and deleting the newer cell later does not bring it back (a
/// delete of part of such a column first removes the column's collected cells). Cells of a
/// column arrive newest timestamp first; what this compaction does not see only makes it keep
/// more.
pub(crate) struct GcFilter {
    catalog: Arc<SharedCatalog>,
    grace_micros: i64,
    /// Read at each tombstone, not once per compaction: a long compaction must not act on a
    /// safe point the replication code has since lowered (a cluster began to be seeded).
    safe_point: Arc<SharedSafePoint>,
    now: i64,
    last_column: LastColumn,
}

/// The column (key prefix) of the last cell seen in a family keeping only the newest cell,
/// and the newest write version among that column's cells seen so far.
#[derive(Default)]
struct LastColumn {
    column: Vec<u8>,
    newest_write: u64,
}

impl LastColumn {
    /// Whether a cell (`key`, written at `written`) of a family keeping only the newest cell
    /// was collected by a newer cell of its column written after it.
    fn pushed_out(&mut self, key: &[u8], written: u64) -> bool {
        let column = &key[..key.len().saturating_sub(encoding::CELL_SUFFIX_LEN)];
        if column != self.column.as_slice() {
            self.column.clear();
            self.column.extend_from_slice(column);
            self.newest_write = written;
            return false;
        }
        if self.newest_write > written {
            return true;
        }
        self.newest_write = written;
        false
    }
}

impl GcFilter {
    fn decide(&mut self, key: &[u8], value: &[u8]) -> Decision {
        if !self.catalog.loaded.load(Ordering::SeqCst) {
            return Decision::Keep;
        }
        let Some((table_id, family)) = encoding::peek_table_and_family(key) else {
            return Decision::Keep;
        };
        let Some((version, kind, _)) = encoding::decode_value(value) else {
            return Decision::Keep;
        };
        if kind == ValueKind::Tombstone {
            let expired = tombstone_expired(
                version.hlc,
                self.grace_micros,
                self.now,
                self.safe_point.get(),
            );
            return if expired {
                Decision::Remove
            } else {
                Decision::Keep
            };
        }
        // Never wait for the catalog: a schema change holds it across a synced write, and
        // that write may itself wait (write stall) for this compaction. Keeping is always safe.
        let Some(tables) = self.catalog.tables.try_read() else {
            return Decision::Keep;
        };
        let Some(table) = tables.by_id(table_id) else {
            return Decision::Keep;
        };
        let Some(family) = family.and_then(|f| std::str::from_utf8(f).ok()) else {
            return Decision::Keep;
        };
        if table.dropped(family, version.hlc) {
            return Decision::Remove;
        }
        let Some(schema) = table.families.get(family) else {
            // Not created yet by the catalog's view, or dropped: the drop marker decides.
            return Decision::Keep;
        };
        let Some(rule) = &schema.gc_rule else {
            return Decision::Keep;
        };
        let Some(d) = encoding::decode_key(key) else {
            return Decision::Keep;
        };
        let KeyEntry::Cell { timestamp, .. } = d.entry else {
            return Decision::Keep;
        };
        let pushed_out = rule.keeps_only_newest() && self.last_column.pushed_out(key, version.hlc);
        if pushed_out || rule.eligible(None, timestamp, self.now) == Some(true) {
            return Decision::Remove;
        }
        Decision::Keep
    }
}

/// Whether a tombstone written at clock value `hlc` may be dropped at `now`: it is older than
/// the grace, and no write it hides can still arrive from another cluster — its version is
/// below the replication safe point (`safe_point`, None without replication: see
/// [`crate::safe_point`]). A tombstone at or above the safe point may still have to hide a
/// write made in a peer cluster before it and not yet received here; dropped, that write
/// would come back in this cluster alone. Pure.
pub(crate) fn tombstone_expired(
    hlc: u64,
    grace_micros: i64,
    now: i64,
    safe_point: Option<u64>,
) -> bool {
    (hlc as i64).saturating_add(grace_micros) < now && safe_point.is_none_or(|safe| hlc < safe)
}

impl CompactionFilter for GcFilter {
    fn filter(&mut self, _level: u32, key: &[u8], value: &[u8]) -> Decision {
        self.decide(key, value)
    }

    fn name(&self) -> &CStr {
        c"basalt-gc"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(row: &[u8], qualifier: &[u8], ts: i64) -> Vec<u8> {
        encoding::cell_key(1, row, "cf", qualifier, ts)
    }

    #[test]
    fn a_cell_goes_when_a_newer_cell_of_its_column_was_written_after_it() {
        let mut last = LastColumn::default();
        // Newest timestamp first, as compaction sees them: written at 20, 10, 30.
        assert!(!last.pushed_out(&cell(b"r", b"q", 3000), 20));
        assert!(last.pushed_out(&cell(b"r", b"q", 2000), 10));
        // Written after every newer cell (e.g. after they were deleted): kept.
        assert!(!last.pushed_out(&cell(b"r", b"q", 1000), 30));
        // Another column, another row: a fresh start.
        assert!(!last.pushed_out(&cell(b"r", b"p", 1000), 5));
        assert!(!last.pushed_out(&cell(b"s", b"p", 1000), 1));
        assert!(last.pushed_out(&cell(b"s", b"p", 500), 0));
    }

    #[test]
    fn a_tombstone_goes_after_the_grace_and_below_the_safe_point() {
        let (grace, now) = (1_000, 1_000_000);
        let old = 500_000u64;
        // Without replication the grace alone decides.
        assert!(tombstone_expired(old, grace, now, None));
        assert!(!tombstone_expired(now as u64 - 10, grace, now, None));
        // With replication, only below the safe point: every peer acknowledged past it.
        assert!(tombstone_expired(old, grace, now, Some(old + 1)));
        assert!(!tombstone_expired(old, grace, now, Some(old)));
        assert!(!tombstone_expired(old, grace, now, Some(100)));
        // Held until the safe point is known.
        assert!(!tombstone_expired(old, grace, now, Some(0)));
        // Below the safe point, but within the grace: kept.
        assert!(!tombstone_expired(
            now as u64 - 10,
            grace,
            now,
            Some(now as u64)
        ));
    }
}
