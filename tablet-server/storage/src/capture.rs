//! The captures of a tablet move's source (see [`crate::moves`]): the store's first commit
//! observer ([`crate::observer`]). While a capture of a key range is registered, every group
//! the committer writes is handed to it under the commit boundary, and the operations that
//! fall into the range are kept, in commit order, as [`LogRecord`]s for the destination — in
//! memory, bounded by [`MAX_CAPTURE_BYTES`].

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::observer::{CommitObserver, CommittedGroup, LogOp};

/// Most bytes of log records a capture keeps for its destination before it gives up (the
/// destination fell too far behind; the move is aborted).
pub const MAX_CAPTURE_BYTES: usize = 256 << 20;

/// The operations of one group write that fell into a captured range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogRecord {
    /// 1, 2, … in commit order, per capture.
    pub seq: u64,
    pub ops: Vec<LogOp>,
}

/// A capture's identity.
pub type CaptureId = u64;

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
/// hands it every committed group under the commit boundary, and [`crate::Store::start_capture`]
/// registers a capture and takes its snapshot at the boundary: the snapshot sees exactly the
/// writes committed before the capture's first record.
#[derive(Default)]
pub(crate) struct Captures {
    list: Mutex<Vec<Capture>>,
    next_id: AtomicU64,
    /// Captures started or starting: while non-zero, writes build their operations for the
    /// committer.
    active: AtomicUsize,
}

impl Captures {
    pub(crate) fn capturing(&self) -> bool {
        self.active.load(Ordering::Acquire) > 0
    }

    /// A capture is starting: writes build their operations from now on. Balanced by
    /// [`Captures::end`] or [`Captures::abandon`].
    pub(crate) fn begin(&self) {
        self.active.fetch_add(1, Ordering::AcqRel);
    }

    /// A capture that began did not start.
    pub(crate) fn abandon(&self) {
        self.active.fetch_sub(1, Ordering::AcqRel);
    }

    /// The next capture's identity.
    pub(crate) fn next_id(&self) -> CaptureId {
        self.next_id.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Registers capture `id` of keys `[start, end)` (call at the commit boundary).
    pub(crate) fn register(&self, id: CaptureId, start: Vec<u8>, end: Vec<u8>) {
        self.list.lock().push(Capture {
            id,
            start,
            end,
            seq: 0,
            records: VecDeque::new(),
            bytes: 0,
            overflowed: false,
            notify: Arc::new(tokio::sync::Notify::new()),
        });
    }

    /// Removes capture `id` from the list (its `active` count stays until [`Captures::end`]).
    pub(crate) fn remove(&self, id: CaptureId) -> bool {
        let mut list = self.list.lock();
        let before = list.len();
        list.retain(|c| c.id != id);
        list.len() != before
    }

    /// Stops capture `id` and forgets its records. Idempotent.
    pub(crate) fn end(&self, id: CaptureId) {
        if self.remove(id) {
            self.abandon();
        }
    }

    /// The records of capture `id` after sequence `after` (at most about `max_bytes`), removed
    /// from memory.
    pub(crate) fn take(
        &self,
        id: CaptureId,
        after: u64,
        max_bytes: usize,
    ) -> Result<Vec<LogRecord>> {
        let mut list = self.list.lock();
        let capture = find(&mut list, id)?;
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

    /// The last sequence capture `id` gave.
    pub(crate) fn last_seq(&self, id: CaptureId) -> Result<u64> {
        Ok(find(&mut self.list.lock(), id)?.seq)
    }

    /// What wakes a reader of capture `id` when it has new records.
    pub(crate) fn notify(&self, id: CaptureId) -> Option<Arc<tokio::sync::Notify>> {
        self.list
            .lock()
            .iter()
            .find(|c| c.id == id)
            .map(|c| c.notify.clone())
    }
}

/// Capture `id`, unless it ended or fell behind by more than [`MAX_CAPTURE_BYTES`].
fn find(list: &mut [Capture], id: CaptureId) -> Result<&mut Capture> {
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
    Ok(capture)
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
