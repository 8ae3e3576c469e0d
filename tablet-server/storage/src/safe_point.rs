//! What replication needs before a tombstone may be collected (`docs/replication.md`,
//! "Deletes and tombstones"): a tombstone hides the older writes that may still arrive from
//! another cluster, so it must stay until none can.
//!
//! * The shipping side: [`Store::log_watermark`] pairs a clock value with a change log
//!   sequence such that every write with a lower version is in the log at or below that
//!   sequence. Once a peer cluster acknowledged the log through the sequence, it holds every
//!   write of this server below the clock value, and every write this server makes later has
//!   a greater version: the shipper reports that value as its `acked_hlc`.
//! * The receiving side: the replication code computes, from those reports, the **safe
//!   point**: a clock value below which no write of any peer cluster can still arrive here. It
//!   sets it with [`Store::set_tombstone_safe_point`]; the compaction filter reads it for each
//!   tombstone it sees (`crate::compaction`). A tombstone goes once it is older than the grace
//!   *and* below the safe point.
//!
//! Without peers (a single cluster, a standalone server) there is no safe point: tombstones
//! go after the grace alone, as before replication.

use crate::store::Store;

/// A clock value and a change log sequence: every write with a version (hlc) below `hlc` is
/// in the log at or below `seq` (or was made before the log was on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogWatermark {
    pub hlc: u64,
    pub seq: u64,
}

impl Store {
    /// The log's watermark now (see [`LogWatermark`]). The clock value is the first version of
    /// the oldest write still in flight (allocated, not yet durable), or the clock's reading
    /// when none is; the clock is advanced to that reading, so every version allocated later
    /// is greater. A write leaves the in-flight set only once its group is committed, log
    /// entry included, and versions are allocated under the same lock: a write below the value
    /// is committed, so the sequence read afterwards covers it.
    pub fn log_watermark(&self) -> LogWatermark {
        let hlc = {
            let inflight = self.inflight.lock();
            let now = self.clock.current();
            self.clock.observe(now);
            inflight.keys().next().copied().unwrap_or(now)
        };
        LogWatermark {
            hlc,
            seq: self.change_log.last_seq(),
        }
    }

    /// Sets the replication safe point: tombstones whose version is at or above `hlc` are
    /// kept, however old (None: no peer cluster; the grace alone decides). Set by the
    /// replication code from what the peers acknowledged; `Some(0)` keeps every tombstone.
    pub fn set_tombstone_safe_point(&self, hlc: Option<u64>) {
        self.safe_point.set(hlc);
    }

    /// The replication safe point last set (None: none, the grace alone decides).
    pub fn tombstone_safe_point(&self) -> Option<u64> {
        self.safe_point.get()
    }
}
