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

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use basalt_model::{RowRange, TableSchema};
use parking_lot::Mutex;
use rocksdb::WriteBatch;

use crate::error::{Error, Result};
use crate::observer::{CommitObserver, CommittedGroup};
use crate::ranges::SstFile;
use crate::read::key_range;
use crate::store::Store;

/// Most bytes of log records a capture keeps for its destination before it gives up (the
/// destination fell too far behind; the move is aborted).
pub const MAX_CAPTURE_BYTES: usize = 256 << 20;

/// One physical operation on the data column family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogOp {
    Put {
        key: Vec<u8>,
        value: Vec<u8>,
    },
    Delete {
        key: Vec<u8>,
    },
    /// An aggregate operand.
    Merge {
        key: Vec<u8>,
        value: Vec<u8>,
    },
    /// Every key in `[start, end)` (DropRowRange, a table deleted).
    DeleteRange {
        start: Vec<u8>,
        end: Vec<u8>,
    },
}

impl LogOp {
    /// The bytes of its keys and values.
    pub fn bytes(&self) -> usize {
        match self {
            LogOp::Put { key, value } | LogOp::Merge { key, value } => key.len() + value.len(),
            LogOp::Delete { key } => key.len(),
            LogOp::DeleteRange { start, end } => start.len() + end.len(),
        }
    }

    /// The part of this operation inside `[start, end)`, if any.
    fn clipped(&self, start: &[u8], end: &[u8]) -> Option<LogOp> {
        let inside = |k: &[u8]| k >= start && k < end;
        match self {
            LogOp::Put { key, .. } | LogOp::Merge { key, .. } | LogOp::Delete { key }
                if inside(key) =>
            {
                Some(self.clone())
            }
            LogOp::DeleteRange { start: s, end: e } => {
                let s = s.as_slice().max(start);
                let e = e.as_slice().min(end);
                (s < e).then(|| LogOp::DeleteRange {
                    start: s.to_vec(),
                    end: e.to_vec(),
                })
            }
            _ => None,
        }
    }
}

/// Largest SST file of a move's snapshot: small enough that the first file travels while the
/// next ones are written.
pub const MOVE_FILE_BYTES: u64 = 8 << 20;

/// The operations of one group write that fell into a captured range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogRecord {
    /// 1, 2, … in commit order, per capture.
    pub seq: u64,
    pub ops: Vec<LogOp>,
}

/// A capture's identity.
pub type CaptureId = u64;

/// What [`Store::fence`] returns: every write accepted into the range is in the log at or
/// below `seq`, and every version given so far is below `clock`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fenced {
    pub seq: u64,
    pub clock: u64,
}

struct Capture {
    id: CaptureId,
    start: Vec<u8>,
    end: Vec<u8>,
    /// The last sequence given.
    seq: u64,
    records: VecDeque<LogRecord>,
    bytes: usize,
    overflowed: bool,
    notify: Arc<tokio::sync::Notify>,
}

/// The captures of a store: its first commit observer ([`crate::observer`]). The committer
/// hands it every committed group under the commit boundary, and [`Store::start_capture`]
/// registers a capture and takes its snapshot at the boundary: the snapshot sees exactly the
/// writes committed before the capture's first record.
#[derive(Default)]
pub(crate) struct Captures {
    list: Mutex<Vec<Capture>>,
    next_id: std::sync::atomic::AtomicU64,
    /// Captures started or starting: while non-zero, writes build their operations for the
    /// committer.
    pub(crate) active: AtomicUsize,
}

impl Captures {
    pub(crate) fn capturing(&self) -> bool {
        self.active.load(Ordering::Acquire) > 0
    }
}

impl CommitObserver for Captures {
    fn wants_ops(&self) -> bool {
        self.capturing()
    }

    /// Appends the group's operations to every capture whose range they touch.
    fn committed(&self, group: &CommittedGroup<'_>) {
        // A registered capture is counted as active until it is dropped from the list.
        if !self.capturing() {
            return;
        }
        let mut list = self.list.lock();
        for capture in list.iter_mut() {
            let mine: Vec<LogOp> = group
                .jobs
                .iter()
                .flat_map(|job| job.ops.iter())
                .filter_map(|op| op.clipped(&capture.start, &capture.end))
                .collect();
            if mine.is_empty() || capture.overflowed {
                continue;
            }
            capture.seq += 1;
            capture.bytes += mine.iter().map(LogOp::bytes).sum::<usize>();
            if capture.bytes > MAX_CAPTURE_BYTES {
                capture.overflowed = true;
                capture.records.clear();
            } else {
                capture.records.push_back(LogRecord {
                    seq: capture.seq,
                    ops: mine,
                });
            }
            capture.notify.notify_one();
        }
    }
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
            self.captures.active.fetch_add(1, Ordering::AcqRel);
        }
        let started = (|| {
            // 2. Every write queued before (without operations) is committed.
            self.committer.barrier(self.clock.current())?;
            // 3. Register the capture and take the snapshot between two groups (at the commit
            //    boundary): the groups the snapshot holds are observed before the capture
            //    exists, every later one after.
            let id = self.captures.next_id.fetch_add(1, Ordering::Relaxed) + 1;
            let snapshot = self.committer.at_boundary(|_| {
                self.captures.list.lock().push(Capture {
                    id,
                    start: keys.start.clone(),
                    end: keys.end.clone(),
                    seq: 0,
                    records: VecDeque::new(),
                    bytes: 0,
                    overflowed: false,
                    notify: Arc::new(tokio::sync::Notify::new()),
                });
                self.db.snapshot()
            });
            match self.export_snapshot(&snapshot, &keys, dir, MOVE_FILE_BYTES, on_file) {
                Ok(files) => Ok((id, files)),
                Err(e) => {
                    self.drop_capture(id);
                    Err(e)
                }
            }
        })();
        if started.is_err() {
            self.captures.active.fetch_sub(1, Ordering::AcqRel);
        }
        started
    }

    /// Removes capture `id` from the list (its `active` count is released by
    /// [`Store::end_capture`]).
    fn drop_capture(&self, id: CaptureId) -> bool {
        let mut list = self.captures.list.lock();
        let before = list.len();
        list.retain(|c| c.id != id);
        list.len() != before
    }

    /// Stops capture `id` and forgets its records. Idempotent.
    pub fn end_capture(&self, id: CaptureId) {
        if self.drop_capture(id) {
            self.captures.active.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// The records of capture `id` after sequence `after` (at most about `max_bytes`), removed
    /// from the capture's memory; an empty list when there are none yet. An error when the
    /// capture is unknown or fell behind by more than [`MAX_CAPTURE_BYTES`].
    pub fn take_log(&self, id: CaptureId, after: u64, max_bytes: usize) -> Result<Vec<LogRecord>> {
        let mut list = self.captures.list.lock();
        let capture = list
            .iter_mut()
            .find(|c| c.id == id)
            .ok_or_else(|| Error::Internal(format!("no capture {id} (ended)")))?;
        if capture.overflowed {
            return Err(Error::Internal(format!(
                "capture {id}: the destination fell more than {} MiB behind",
                MAX_CAPTURE_BYTES >> 20
            )));
        }
        let mut out = Vec::new();
        let mut bytes = 0;
        while let Some(r) = capture.records.front() {
            if r.seq <= after {
                capture.records.pop_front();
                continue;
            }
            if !out.is_empty() && bytes >= max_bytes {
                break;
            }
            let r = capture.records.pop_front().expect("front exists");
            let b: usize = r.ops.iter().map(LogOp::bytes).sum();
            bytes += b;
            capture.bytes = capture.bytes.saturating_sub(b);
            out.push(r);
        }
        Ok(out)
    }

    /// What wakes a reader of capture `id` when it has new records.
    pub fn capture_notify(&self, id: CaptureId) -> Option<Arc<tokio::sync::Notify>> {
        self.captures
            .list
            .lock()
            .iter()
            .find(|c| c.id == id)
            .map(|c| c.notify.clone())
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
        let list = self.captures.list.lock();
        let capture = list
            .iter()
            .find(|c| c.id == id)
            .ok_or_else(|| Error::Internal(format!("no capture {id} (ended)")))?;
        if capture.overflowed {
            return Err(Error::Internal(format!(
                "capture {id}: the destination fell more than {} MiB behind",
                MAX_CAPTURE_BYTES >> 20
            )));
        }
        Ok(Fenced {
            seq: capture.seq,
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
