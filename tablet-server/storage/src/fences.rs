//! The key ranges this store must not serve, and the check every read and write makes against
//! them (see `docs/cluster.md`, "Tablet moves"):
//!
//! * **moving** — fenced for a move ([`crate::Store::fence`]): refused with a retryable
//!   "moving" until the move aborts (the range is served again) or commits (it becomes
//!   released);
//! * **released** — moved to another server ([`crate::Store::release`]) and deleted here:
//!   refused with a retryable "not owner" until this server owns the range again (the tablet
//!   map names it, [`crate::Store::serve`]).
//!
//! A frontend routes a request by the tablet map it last read and the local call runs a moment
//! later; the tablet may have moved in between. The storage check is what makes that moment
//! harmless: a write is checked under the catalog lock, the same lock a fence takes, and a read
//! after its snapshot is taken ([`Fences::read_refusal`]), so a request either runs on a
//! complete tablet or is refused with nothing applied — never applied to, or answered from, a
//! range whose rows were deleted by its release.

use std::collections::HashMap;

use basalt_model::{RowRange, RowSet, TableSchema};
use bytes::Bytes;

use crate::error::Error;

/// A range fenced for a move: the tablet's name for the "moving" answer.
#[derive(Clone, Debug)]
struct Moving {
    table_id: u64,
    range: RowRange,
    tablet: String,
}

/// The ranges of a store that it must not serve.
#[derive(Debug, Default)]
pub(crate) struct Fences {
    moving: Vec<Moving>,
    /// Ranges moved to other servers, by table id.
    released: HashMap<u64, RowSet>,
    /// How many times a released range was taken back ([`Fences::serve`]). A read compares it
    /// before and after its snapshot: a range released before the snapshot and taken back
    /// before the check would otherwise pass unseen.
    returns: u64,
}

impl Fences {
    pub(crate) fn is_empty(&self) -> bool {
        self.moving.is_empty() && self.released.is_empty()
    }

    /// Fences `range` for a move (idempotent).
    pub(crate) fn fence(&mut self, table_id: u64, range: &RowRange, tablet: &str) {
        if !self
            .moving
            .iter()
            .any(|m| m.table_id == table_id && m.range == *range)
        {
            self.moving.push(Moving {
                table_id,
                range: range.clone(),
                tablet: tablet.to_string(),
            });
        }
    }

    /// Lifts the move fence of `range` (the move aborted: the range is served again).
    pub(crate) fn unfence(&mut self, table_id: u64, range: &RowRange) {
        self.moving
            .retain(|m| !(m.table_id == table_id && m.range == *range));
    }

    /// `range` moved away: refused from now on, whether it was fenced or not.
    pub(crate) fn release(&mut self, table_id: u64, range: &RowRange) {
        self.unfence(table_id, range);
        let set = self.released.entry(table_id).or_default();
        *set = set.union(&RowSet::from_ranges([range.clone()]));
    }

    /// This server owns `range` again (the tablet map says so): what was released of it is
    /// served again. True when something was released.
    pub(crate) fn serve(&mut self, table_id: u64, range: &RowRange) -> bool {
        let Some(set) = self.released.get_mut(&table_id) else {
            return false;
        };
        if set.intersect(range).is_empty() {
            return false;
        }
        *set = set.without(range);
        if set.is_empty() {
            self.released.remove(&table_id);
        }
        self.returns += 1;
        true
    }

    /// Forgets a deleted table.
    pub(crate) fn forget(&mut self, table_id: u64) {
        self.moving.retain(|m| m.table_id != table_id);
        self.released.remove(&table_id);
    }

    /// The count a read takes before its snapshot (see [`Fences::read_refusal`]).
    pub(crate) fn returns(&self) -> u64 {
        self.returns
    }

    /// The refusal of a write to `rows` of `table`, if one of them is not served here.
    pub(crate) fn write_refusal<'r>(
        &self,
        table: &TableSchema,
        mut rows: impl Iterator<Item = &'r [u8]>,
    ) -> Option<Error> {
        if self.is_empty() {
            return None;
        }
        let released = self.released.get(&table.id);
        rows.find_map(|row| {
            if let Some(m) = self
                .moving
                .iter()
                .find(|m| m.table_id == table.id && m.range.contains(row))
            {
                return Some(moving(m));
            }
            released
                .filter(|set| set.contains(row))
                .map(|_| not_owner(table, row))
        })
    }

    /// The refusal of a deletion of `rows` of `table` (DropRowRange): only a range fenced for
    /// a move refuses it (a released range has nothing left to delete).
    pub(crate) fn range_refusal(&self, table: &TableSchema, rows: &RowRange) -> Option<Error> {
        self.moving
            .iter()
            .find(|m| m.table_id == table.id && m.range.overlaps(rows))
            .map(moving)
    }

    /// The refusal of a read of `rows` of `table` whose snapshot was taken after `returns` was
    /// read: some of the rows are fenced or released now, or a released range was taken back
    /// since (the snapshot may predate the copy). Without a refusal, the snapshot holds every
    /// row of `rows` this server acknowledged or received before the read began.
    pub(crate) fn read_refusal(
        &self,
        table: &TableSchema,
        rows: &RowSet,
        returns: u64,
    ) -> Option<Error> {
        let first_row = || rows.ranges().first().map(|r| r.start.clone());
        if self.returns != returns {
            return Some(not_owner(table, &first_row().unwrap_or_default()));
        }
        if self.is_empty() {
            return None;
        }
        for range in rows.ranges() {
            if let Some(m) = self
                .moving
                .iter()
                .find(|m| m.table_id == table.id && m.range.overlaps(range))
            {
                return Some(moving(m));
            }
            if let Some(set) = self.released.get(&table.id)
                && let Some(part) = set.intersect(range).ranges().first()
            {
                return Some(not_owner(table, &part.start));
            }
        }
        None
    }
}

fn moving(m: &Moving) -> Error {
    Error::Request(basalt_model::Error::Moving {
        tablet: m.tablet.clone(),
    })
}

fn not_owner(table: &TableSchema, row: &[u8]) -> Error {
    Error::Request(basalt_model::Error::NotOwner {
        table: table.name.clone(),
        row: Bytes::copy_from_slice(row),
        owner: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use basalt_model::Code;

    fn table() -> TableSchema {
        TableSchema {
            id: 7,
            name: "projects/p/instances/i/tables/t".into(),
            families: Default::default(),
            dropped_families: Default::default(),
            deletion_protection: false,
            splits: vec![],
            created_micros: 0,
            restore: None,
        }
    }

    fn range(start: &str, end: Option<&str>) -> RowRange {
        RowRange::new(
            Bytes::copy_from_slice(start.as_bytes()),
            end.map(|e| Bytes::copy_from_slice(e.as_bytes())),
        )
    }

    fn keys(rows: &[&str]) -> RowSet {
        RowSet::from_keys(rows.iter().map(|r| r.as_bytes()))
    }

    fn refused_write(f: &Fences, row: &str) -> Option<String> {
        f.write_refusal(&table(), std::iter::once(row.as_bytes()))
            .map(|e| e.to_string())
    }

    #[test]
    fn a_moving_range_refuses_writes_and_reads_until_its_move_aborts() {
        let t = table();
        let mut f = Fences::default();
        f.fence(t.id, &range("k", Some("p")), "t[k..p)");
        let refused = refused_write(&f, "m").expect("refused");
        assert!(refused.contains("while it moves"), "{refused}");
        assert_eq!(refused_write(&f, "p"), None);
        let e = f
            .read_refusal(&t, &RowSet::all(), 0)
            .expect("a scan over it");
        assert_eq!(e.code(), Code::Unavailable);
        assert!(f.read_refusal(&t, &keys(&["a", "q"]), 0).is_none());
        assert!(f.range_refusal(&t, &range("a", Some("l"))).is_some());
        assert!(f.range_refusal(&t, &range("p", None)).is_none());
        f.unfence(t.id, &range("k", Some("p")));
        assert!(f.is_empty());
        assert_eq!(refused_write(&f, "m"), None);
        assert!(f.read_refusal(&t, &RowSet::all(), 0).is_none());
    }

    #[test]
    fn a_released_range_stays_refused_until_this_server_owns_it_again() {
        let t = table();
        let mut f = Fences::default();
        f.fence(t.id, &range("k", Some("p")), "t[k..p)");
        f.release(t.id, &range("k", Some("p")));
        let refused = refused_write(&f, "m").expect("refused after the release");
        assert!(
            refused.starts_with("this server does not serve row"),
            "{refused}"
        );
        // Another table's rows are not concerned.
        let mut other = table();
        other.id = 8;
        assert!(f.read_refusal(&other, &RowSet::all(), 0).is_none());
        // The tablet was split elsewhere and half of it comes back.
        let before = f.returns();
        assert!(f.serve(t.id, &range("k", Some("m"))));
        assert_eq!(refused_write(&f, "l"), None);
        assert!(refused_write(&f, "n").is_some());
        // A read whose snapshot may predate the return is refused, a later one is not.
        assert!(f.read_refusal(&t, &keys(&["l"]), before).is_some());
        assert!(f.read_refusal(&t, &keys(&["l"]), f.returns()).is_none());
        assert!(
            !f.serve(t.id, &range("a", Some("b"))),
            "nothing released there"
        );
        assert!(f.serve(t.id, &range("m", Some("p"))));
        assert!(f.is_empty());
    }

    #[test]
    fn a_deleted_table_leaves_no_fence() {
        let t = table();
        let mut f = Fences::default();
        f.fence(t.id, &range("a", Some("b")), "t[a..b)");
        f.release(t.id, &range("c", None));
        f.forget(t.id);
        assert!(f.is_empty());
    }
}
