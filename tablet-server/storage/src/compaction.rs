//! The GC compaction filter: physically removes what reads already hide.

use std::ffi::CStr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use basalt_model::hlc::now_micros;
use rocksdb::compaction_filter::{CompactionFilter, Decision};
use rocksdb::compaction_filter_factory::{CompactionFilterContext, CompactionFilterFactory};

use crate::catalog::SharedCatalog;
use crate::encoding::{self, KeyEntry, ValueKind};

pub(crate) struct GcFilterFactory {
    pub(crate) catalog: Arc<SharedCatalog>,
    pub(crate) grace_micros: i64,
}

impl CompactionFilterFactory for GcFilterFactory {
    type Filter = GcFilter;

    fn create(&mut self, _context: CompactionFilterContext) -> GcFilter {
        GcFilter {
            catalog: self.catalog.clone(),
            grace_micros: self.grace_micros,
            now: now_micros(),
        }
    }

    fn name(&self) -> &CStr {
        c"basalt-gc-factory"
    }
}

/// Physically removes what reads already hide: cells of dropped families, cells a family's GC
/// rule certainly collects (age-based; version counts are trimmed on the write path), and
/// tombstones older than the grace period. Unknown tables are kept: deleted tables are removed
/// by range deletion, and a table being created must never lose data to a race.
pub(crate) struct GcFilter {
    catalog: Arc<SharedCatalog>,
    grace_micros: i64,
    now: i64,
}

impl GcFilter {
    fn decide(&self, key: &[u8], value: &[u8]) -> Decision {
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
            let expired = (version.hlc as i64).saturating_add(self.grace_micros) < self.now;
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
        if let Some(d) = encoding::decode_key(key)
            && let KeyEntry::Cell { timestamp, .. } = d.entry
            && rule.eligible(None, timestamp, self.now) == Some(true)
        {
            return Decision::Remove;
        }
        Decision::Keep
    }
}

impl CompactionFilter for GcFilter {
    fn filter(&mut self, _level: u32, key: &[u8], value: &[u8]) -> Decision {
        self.decide(key, value)
    }

    fn name(&self) -> &CStr {
        c"basalt-gc"
    }
}
