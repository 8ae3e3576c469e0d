//! The storage side of a tablet move (see `../shared/DISTRIBUTED.md`, "Moving a tablet", and
//! `docs/cluster.md`):
//!
//! * **Capture** ([`Store::start_capture`]): from a point on, every write into the tablet's
//!   key range is also recorded as a [`LogRecord`] of the physical operations it applied. The
//!   captures are the store's first commit observer ([`crate::observer`]): the group
//!   committer hands them each group it wrote before it acknowledges any write of it, so an
//!   acknowledged write is a logged write. The snapshot exported with a capture is taken at
//!   the commit boundary: every write is either in the snapshot or in the log, never both and
//!   never neither.
//! * **Fence** ([`Store::fence`]): new writes into the range are refused with a retryable
//!   "moving"; the writes already accepted are committed (and logged); the answer is the
//!   last log sequence and the clock.
//! * **Apply** ([`Store::apply_log`]): the destination, which ingested the snapshot, applies
//!   the records in order. The destination holds an exact copy of the range, so the physical
//!   operations (puts, deletes, aggregate operands, range deletions) leave it exactly as the
//!   source: replaying them is not a merge of two histories (replication between clusters,
//!   where that would be wrong, uses a logical log).
//!
//! The capture log lives in memory, bounded ([`MAX_CAPTURE_BYTES`]): it only matters while
//! both processes live. If either fails before the move commits, the move is aborted and the
//! tablet stays where it was.

use std::sync::Arc;

use basalt_model::{RowRange, TableSchema};
use rocksdb::WriteBatch;

pub use crate::capture::{CaptureId, LogRecord, MAX_CAPTURE_BYTES};
use crate::error::Result;
pub use crate::observer::LogOp;
use crate::ranges::SstFile;
use crate::read::key_range;
use crate::store::Store;

/// Largest SST file of a move's snapshot: small enough that the first file travels while the
/// next ones are written.
pub const MOVE_FILE_BYTES: u64 = 8 << 20;

/// What [`Store::fence`] returns: every write accepted into the range is in the log at or
/// below `seq`, and every version given so far is below `clock`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fenced {
    pub seq: u64,
    pub clock: u64,
}

impl Store {
    /// Starts capturing the writes into `range` of `table` and exports the range, as of the
    /// capture's start, into SST files in `dir`: the files hold every write before the
    /// capture's first record, the log every write after. Each file, once written, is handed
    /// to `on_file` (a move streams it while the next is written).
    pub fn start_capture(
        &self,
        table: &TableSchema,
        range: &RowRange,
        dir: &std::path::Path,
        on_file: &mut dyn FnMut(&SstFile) -> Result<()>,
    ) -> Result<(CaptureId, Vec<SstFile>)> {
        let keys = key_range(table.id, range);
        // 1. From now on every write queued at the committer carries its operations: a
        //    writer checks the catalog (read lock) until its batch is queued.
        {
            let _tables = self.catalog.tables.write();
            self.captures.begin();
        }
        let started = (|| {
            // 2. Every write queued before (without operations) is committed.
            self.committer.barrier(self.clock.current())?;
            // 3. Register the capture and take the snapshot between two groups (at the commit
            //    boundary): the groups the snapshot holds are observed before the capture
            //    exists, every later one after.
            let id = self.captures.next_id();
            let snapshot = self.committer.at_boundary(|_| {
                self.captures
                    .register(id, keys.start.clone(), keys.end.clone());
                self.db.snapshot()
            });
            match self.export_snapshot(&snapshot, &keys, dir, MOVE_FILE_BYTES, on_file) {
                Ok(files) => Ok((id, files)),
                Err(e) => {
                    self.captures.remove(id);
                    Err(e)
                }
            }
        })();
        if started.is_err() {
            self.captures.abandon();
        }
        started
    }

    /// Stops capture `id` and forgets its records. Idempotent.
    pub fn end_capture(&self, id: CaptureId) {
        self.captures.end(id);
    }

    /// The records of capture `id` after sequence `after` (at most about `max_bytes`), removed
    /// from the capture's memory; an empty list when there are none yet. An error when the
    /// capture is unknown or fell behind by more than [`MAX_CAPTURE_BYTES`].
    pub fn take_log(&self, id: CaptureId, after: u64, max_bytes: usize) -> Result<Vec<LogRecord>> {
        self.captures.take(id, after, max_bytes)
    }

    /// What wakes a reader of capture `id` when it has new records.
    pub fn capture_notify(&self, id: CaptureId) -> Option<Arc<tokio::sync::Notify>> {
        self.captures.notify(id)
    }

    /// Fences `range` of `table` (`tablet` names it in the "moving" answer): refuses new
    /// reads and writes of it, waits until every write accepted before is committed, and
    /// returns the last sequence of capture `id` and the clock.
    pub fn fence(
        &self,
        id: CaptureId,
        table: &TableSchema,
        range: &RowRange,
        tablet: &str,
    ) -> Result<Fenced> {
        {
            // Under the catalog lock: a write checks the fences under it (`submit_write`), so
            // every write either passed before (and the barrier below waits for it) or is
            // refused.
            let _tables = self.catalog.tables.write();
            self.fences.write().fence(table.id, range, tablet);
        }
        self.committer.barrier(self.clock.current())?;
        let seq = self.captures.last_seq(id)?;
        Ok(Fenced {
            seq,
            clock: self.clock.current(),
        })
    }

    /// Lifts the fence of `range` of `table` (a move aborted: the range is served here again).
    /// Idempotent.
    pub fn unfence(&self, table: &TableSchema, range: &RowRange) {
        self.fences.write().unfence(table.id, range);
    }

    /// Gives `range` of `table` up (its move committed: another server owns it): refuses it
    /// from now on, then deletes its rows. A request routed here by an older tablet map is
    /// refused as "not owner" — never applied to, or answered from, the deleted range — until
    /// this server owns the range again ([`Store::serve`]).
    pub fn release(&self, table: &TableSchema, range: &RowRange) -> Result<()> {
        {
            let _tables = self.catalog.tables.write();
            self.fences.write().release(table.id, range);
        }
        // The log may still refer to values of the range that its shippers have not sent.
        let _values = self.change_log.referenced.write();
        self.copy_referenced_values(table.id, range)?;
        self.delete_range(table, range)
    }

    /// This server owns `range` of `table` (the tablet map names it): serves what it had
    /// released of it again. True when something was released.
    pub fn serve(&self, table: &TableSchema, range: &RowRange) -> bool {
        let fences = self.fences.upgradable_read();
        if fences.is_empty() {
            return false;
        }
        let mut fences = parking_lot::RwLockUpgradableReadGuard::upgrade(fences);
        fences.serve(table.id, range)
    }

    /// Applies log records of a move's source, in order, as one synced write (the destination
    /// holds the snapshot the records follow).
    pub fn apply_log(&self, records: &[LogRecord]) -> Result<()> {
        let mut batch = WriteBatch::default();
        for op in records.iter().flat_map(|r| &r.ops) {
            match op {
                LogOp::Put { key, value } => batch.put_cf(self.data(), key, value),
                LogOp::Delete { key } => batch.delete_cf(self.data(), key),
                LogOp::Merge { key, value } => batch.merge_cf(self.data(), key, value),
                LogOp::DeleteRange { start, end } => batch.delete_range_cf(self.data(), start, end),
            }
        }
        if batch.is_empty() {
            return Ok(());
        }
        self.sync_write(batch)
    }

    /// Takes over a move's source clock: every version given here from now on is above
    /// every version the source gave (persisted as the clock floor).
    pub fn observe_clock(&self, clock: u64) -> Result<()> {
        self.clock.observe(clock);
        let mut batch = WriteBatch::default();
        self.put_clock_floor(&mut batch);
        self.sync_write(batch)
    }
}
