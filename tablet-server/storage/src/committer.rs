//! Group commit: one thread appends every batch queued while it was syncing the previous group
//! into one WriteBatch and writes that with `sync = true` (one WAL append, one fsync). A write
//! is acknowledged only once its group is on disk and the store's commit observers
//! ([`crate::observer`]) have seen it; writers wait on a channel, not in a thread each.
//!
//! The committer holds the commit boundary lock from a group's write until its observers have
//! seen it; [`Committer::at_boundary`] runs code between two groups.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::{Mutex, RwLock};
use rocksdb::{DB, IteratorMode, WriteBatch, WriteOptions};

use crate::error::{Error, Result};
use crate::layout::{CF_LOG, CF_META, META_CLOCK_FLOOR, log_seq_of};
use crate::observer::{CommittedGroup, CommittedJob, LogOp, Observers};

/// Most bytes of batches appended into one group write.
const GROUP_MAX_BYTES: usize = 32 << 20;
/// Length of a WriteBatch's header in RocksDB's batch format: sequence (fixed64) and record
/// count (fixed32), both little-endian, then the records.
const BATCH_HEADER_LEN: usize = 12;

/// One batch waiting for the committer.
struct CommitJob {
    batch: WriteBatch,
    /// The clock value to persist as floor with it (≥ every version in the batch).
    clock_floor: u64,
    /// What the observers see of it (taken out when the job joins a group).
    observed: CommittedJob,
    /// Its change log entry, encoded (only while the log is on, see [`crate::changelog`]).
    log_entry: Option<Vec<u8>>,
    done: tokio::sync::oneshot::Sender<Result<()>>,
}

impl CommitJob {
    /// Adds the job to a group (what the observers see of it to `observed`); its bytes.
    fn join(mut self, jobs: &mut Vec<CommitJob>, observed: &mut Vec<CommittedJob>) -> usize {
        observed.push(std::mem::take(&mut self.observed));
        let bytes = self.batch.size_in_bytes();
        jobs.push(self);
        bytes
    }
}

/// The group-commit thread of the data path (see the module docs).
pub(crate) struct Committer {
    tx: Option<std::sync::mpsc::Sender<CommitJob>>,
    worker: Option<std::thread::JoinHandle<()>>,
    /// The commit boundary: held by the commit thread from a group's write until its
    /// observers have seen it. Holds the sequence of the last group observed.
    boundary: Arc<Mutex<u64>>,
}

impl Committer {
    pub(crate) fn start(
        db: Arc<DB>,
        observers: Observers,
        change_log: Arc<ChangeLog>,
    ) -> Result<Committer> {
        let (tx, rx) = std::sync::mpsc::channel::<CommitJob>();
        let boundary = Arc::new(Mutex::new(0u64));
        let last_seq = boundary.clone();
        let worker = std::thread::Builder::new()
            .name("basalt-commit".into())
            .spawn(move || {
                // Reused from group to group: no allocation per group once they are grown.
                let mut jobs: Vec<CommitJob> = Vec::new();
                let mut observed: Vec<CommittedJob> = Vec::new();
                while let Ok(first) = rx.recv() {
                    let mut bytes = first.join(&mut jobs, &mut observed);
                    while bytes < GROUP_MAX_BYTES {
                        match rx.try_recv() {
                            Ok(job) => bytes += job.join(&mut jobs, &mut observed),
                            Err(_) => break,
                        }
                    }
                    let result = {
                        let mut seq = last_seq.lock();
                        let result = Self::write_group(&db, &jobs, &change_log);
                        if let Ok(first_entry) = result {
                            let mut next_entry = first_entry;
                            for (job, seen) in jobs.iter().zip(observed.iter_mut()) {
                                if job.log_entry.is_some() {
                                    seen.log_seq = Some(next_entry);
                                    next_entry += 1;
                                }
                            }
                            change_log.committed(first_entry, next_entry - first_entry);
                            *seq += 1;
                            observers.committed(&CommittedGroup {
                                seq: *seq,
                                jobs: &observed,
                            });
                        }
                        result.map(|_| ())
                    };
                    observed.clear();
                    for job in jobs.drain(..) {
                        let _ = job.done.send(result.clone());
                    }
                }
            })
            .map_err(|e| Error::Internal(format!("cannot start the commit thread: {e}")))?;
        Ok(Committer {
            tx: Some(tx),
            worker: Some(worker),
            boundary,
        })
    }

    /// Runs `f` between two groups, with the sequence of the last group observed: a RocksDB
    /// snapshot taken in `f` holds exactly the groups at or below it. `f` must not wait for
    /// the committer.
    pub(crate) fn at_boundary<T>(&self, f: impl FnOnce(u64) -> T) -> T {
        let seq = self.boundary.lock();
        f(*seq)
    }

    /// Writes the jobs' batches, their change log entries and the highest clock floor among
    /// them, as one synced WriteBatch: all of them or (on a storage error) none. Returns the
    /// sequence of the first log entry written (the next one, if none was).
    fn write_group(db: &DB, jobs: &[CommitJob], change_log: &ChangeLog) -> Result<u64> {
        let meta = db
            .cf_handle(CF_META)
            .ok_or_else(|| Error::Internal("meta column family missing".into()))?;
        let mut merged = append_batches(jobs.iter().map(|j| &j.batch));
        let clock_floor = jobs.iter().map(|j| j.clock_floor).max().unwrap_or(0);
        merged.put_cf(meta, META_CLOCK_FLOOR, clock_floor.to_be_bytes());
        let first_entry = change_log.append(
            db,
            &mut merged,
            jobs.iter().filter_map(|j| j.log_entry.as_deref()),
        )?;
        let mut opts = WriteOptions::default();
        opts.set_sync(true);
        db.write_opt(merged, &opts)?;
        Ok(first_entry)
    }

    /// Queues a batch; `observed` is what the observers will see of it, `log_entry` its
    /// change log entry (encoded). The receiver answers once the batch is durable and observed
    /// (or failed).
    pub(crate) fn submit(
        &self,
        batch: WriteBatch,
        clock_floor: u64,
        observed: CommittedJob,
        log_entry: Option<Vec<u8>>,
    ) -> tokio::sync::oneshot::Receiver<Result<()>> {
        let (done, rx) = tokio::sync::oneshot::channel();
        let job = CommitJob {
            batch,
            clock_floor,
            observed,
            log_entry,
            done,
        };
        // The receiving thread lives as long as the store; a failed send drops `done`, which
        // the waiter sees as an error.
        if let Some(tx) = &self.tx {
            let _ = tx.send(job);
        }
        rx
    }

    /// Queues a batch that is not a write of the data path (no versions) with its operations,
    /// and waits until it is durable and observed (outside the async runtime).
    pub(crate) fn commit_blocking(
        &self,
        batch: WriteBatch,
        clock_floor: u64,
        ops: Vec<LogOp>,
    ) -> Result<()> {
        let observed = CommittedJob {
            ops,
            ..CommittedJob::default()
        };
        self.submit(batch, clock_floor, observed, None)
            .blocking_recv()
            .unwrap_or_else(|_| Err(Error::Closing))
    }

    /// Returns once every batch queued before it is committed and observed (the queue is first
    /// in, first out). Outside the async runtime.
    pub(crate) fn barrier(&self, clock_floor: u64) -> Result<()> {
        self.commit_blocking(WriteBatch::default(), clock_floor, vec![])
    }
}

/// The change log's state in a store ([`crate::changelog`]): whether writes are logged, and
/// the next sequence (owned by the committer thread, the only writer of the log).
#[derive(Default)]
pub(crate) struct ChangeLog {
    on: AtomicBool,
    next: Mutex<u64>,
    /// Held for reading while entries' references are resolved ([`Store::read_change_log`]),
    /// for writing while a released range's referenced values are copied into the log and the
    /// range deleted ([`Store::release`]).
    ///
    /// [`Store::read_change_log`]: crate::Store::read_change_log
    /// [`Store::release`]: crate::Store::release
    pub(crate) referenced: RwLock<()>,
}

impl ChangeLog {
    /// The state of the log found in `db`: the next sequence follows the last entry.
    pub(crate) fn open(db: &DB) -> Result<ChangeLog> {
        let cf = db
            .cf_handle(CF_LOG)
            .ok_or_else(|| Error::Internal("log column family missing".into()))?;
        let last = match db.iterator_cf(cf, IteratorMode::End).next() {
            Some(item) => log_seq_of(&item?.0)?,
            None => 0,
        };
        // A log truncated to nothing goes on above what it deleted.
        let meta = db
            .cf_handle(crate::layout::CF_META)
            .ok_or_else(|| Error::Internal("meta column family missing".into()))?;
        let truncated = match db.get_cf(meta, crate::layout::META_LOG_TRUNCATED)? {
            Some(v) => log_seq_of(&v)?,
            None => 0,
        };
        let last = last.max(truncated);
        Ok(ChangeLog {
            on: AtomicBool::new(false),
            next: Mutex::new(last + 1),
            referenced: RwLock::new(()),
        })
    }

    pub(crate) fn on(&self) -> bool {
        self.on.load(Ordering::Acquire)
    }

    pub(crate) fn set_on(&self, on: bool) {
        self.on.store(on, Ordering::Release);
    }

    /// Puts `entries` into `batch` under the next sequences; returns the first one taken. The
    /// caller writes the batch, then [`ChangeLog::committed`] or [`ChangeLog::failed`].
    pub(crate) fn append<'e>(
        &self,
        db: &DB,
        batch: &mut WriteBatch,
        entries: impl Iterator<Item = &'e [u8]>,
    ) -> Result<u64> {
        let cf = db
            .cf_handle(CF_LOG)
            .ok_or_else(|| Error::Internal("log column family missing".into()))?;
        let next = *self.next.lock();
        for (seq, entry) in (next..).zip(entries) {
            batch.put_cf(cf, seq.to_be_bytes(), entry);
        }
        Ok(next)
    }

    /// The last sequence taken (0: none yet): every write logged so far is at or below it.
    pub(crate) fn last_seq(&self) -> u64 {
        *self.next.lock() - 1
    }

    /// The group holding `count` entries from `first` is on disk.
    pub(crate) fn committed(&self, first: u64, count: u64) {
        let mut next = self.next.lock();
        debug_assert_eq!(*next, first);
        *next = first + count;
    }
}

impl Drop for Committer {
    fn drop(&mut self) {
        // Closing the channel ends the thread once it has answered every queued job.
        self.tx.take();
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

/// Appends WriteBatches into one, in order (RocksDB's batch format: a 12-byte header whose
/// count covers the records that follow it).
fn append_batches<'b>(parts: impl Iterator<Item = &'b WriteBatch>) -> WriteBatch {
    let mut data = vec![0u8; BATCH_HEADER_LEN];
    let mut count: u32 = 0;
    for part in parts {
        let d = part.data();
        if d.len() > BATCH_HEADER_LEN {
            count += part.len() as u32;
            data.extend_from_slice(&d[BATCH_HEADER_LEN..]);
        }
    }
    data[8..12].copy_from_slice(&count.to_le_bytes());
    WriteBatch::from_data(&data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::CF_DATA;
    use crate::observer::CommitObserver;

    /// Keeps every group it sees: (sequence, the jobs' operations).
    #[derive(Default)]
    struct Recorder(Mutex<Vec<(u64, Vec<Vec<LogOp>>)>>);

    impl CommitObserver for Recorder {
        fn wants_ops(&self) -> bool {
            true
        }

        fn committed(&self, group: &CommittedGroup<'_>) {
            let ops = group.jobs.iter().map(|j| j.ops.clone()).collect();
            self.0.lock().push((group.seq, ops));
        }
    }

    fn put(key: &str) -> LogOp {
        LogOp::Put {
            key: key.as_bytes().to_vec(),
            value: b"v".to_vec(),
        }
    }

    /// A batch that RocksDB refuses to apply: a put into column family 99, which does not
    /// exist.
    fn unwritable() -> WriteBatch {
        let mut data = vec![0u8; BATCH_HEADER_LEN];
        data[8..12].copy_from_slice(&1u32.to_le_bytes());
        // kTypeColumnFamilyValue, column family 99, key "k", value "v".
        data.extend_from_slice(&[0x05, 99, 1, b'k', 1, b'v']);
        WriteBatch::from_data(&data)
    }

    #[test]
    fn observers_see_each_written_group_once_in_order_and_never_a_failed_one() {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = rocksdb::Options::default();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        let db = Arc::new(DB::open_cf(&opts, dir.path(), [CF_DATA, CF_META, CF_LOG]).unwrap());
        let recorder = Arc::new(Recorder::default());
        let committer = Committer::start(
            db.clone(),
            Observers::new(vec![recorder.clone() as Arc<dyn CommitObserver>]),
            Arc::new(ChangeLog::open(&db).unwrap()),
        )
        .unwrap();
        let data = db.cf_handle(CF_DATA).unwrap();
        let write = |key: &str| {
            let mut batch = WriteBatch::default();
            batch.put_cf(data, key, "v");
            committer.commit_blocking(batch, 1, vec![put(key)])
        };

        write("a").unwrap();
        write("b").unwrap();
        assert_eq!(committer.at_boundary(|seq| seq), 2);
        assert!(
            committer
                .commit_blocking(unwritable(), 1, vec![put("k")])
                .is_err()
        );
        // The failed group took no sequence and was not observed.
        assert_eq!(committer.at_boundary(|seq| seq), 2);
        assert_eq!(
            *recorder.0.lock(),
            vec![(1, vec![vec![put("a")]]), (2, vec![vec![put("b")]])]
        );
    }
}
