//! Group commit: one thread appends every batch queued while it was syncing the previous group
//! into one WriteBatch and writes that with `sync = true` (one WAL append, one fsync). A write
//! is acknowledged only once its group is on disk; writers wait on a channel, not in a thread
//! each.

use std::sync::Arc;

use rocksdb::{DB, WriteBatch, WriteOptions};

use crate::error::{Error, Result};
use crate::layout::{CF_META, META_CLOCK_FLOOR};
use crate::moves::{Captures, LogOp};

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
    /// The batch's operations on the data column family, given while a capture is active
    /// (see [`crate::moves`]); empty otherwise.
    ops: Vec<LogOp>,
    done: tokio::sync::oneshot::Sender<Result<()>>,
}

/// The group-commit thread of the data path (see the module docs).
pub(crate) struct Committer {
    tx: Option<std::sync::mpsc::Sender<CommitJob>>,
    worker: Option<std::thread::JoinHandle<()>>,
}

impl Committer {
    pub(crate) fn start(db: Arc<DB>, captures: Arc<Captures>) -> Result<Committer> {
        let (tx, rx) = std::sync::mpsc::channel::<CommitJob>();
        let worker = std::thread::Builder::new()
            .name("basalt-commit".into())
            .spawn(move || {
                while let Ok(first) = rx.recv() {
                    let mut bytes = first.batch.size_in_bytes();
                    let mut jobs = vec![first];
                    while bytes < GROUP_MAX_BYTES {
                        match rx.try_recv() {
                            Ok(job) => {
                                bytes += job.batch.size_in_bytes();
                                jobs.push(job);
                            }
                            Err(_) => break,
                        }
                    }
                    let ops: Vec<&[LogOp]> = jobs.iter().map(|j| j.ops.as_slice()).collect();
                    let result = captures.logged(&ops, || Self::write_group(&db, &jobs));
                    for job in jobs {
                        let _ = job.done.send(result.clone());
                    }
                }
            })
            .map_err(|e| Error::Internal(format!("cannot start the commit thread: {e}")))?;
        Ok(Committer {
            tx: Some(tx),
            worker: Some(worker),
        })
    }

    /// Writes the jobs' batches, and the highest clock floor among them, as one synced
    /// WriteBatch: all of them or (on a storage error) none.
    fn write_group(db: &DB, jobs: &[CommitJob]) -> Result<()> {
        let meta = db
            .cf_handle(CF_META)
            .ok_or_else(|| Error::Internal("meta column family missing".into()))?;
        let mut floor = WriteBatch::default();
        let clock_floor = jobs.iter().map(|j| j.clock_floor).max().unwrap_or(0);
        floor.put_cf(meta, META_CLOCK_FLOOR, clock_floor.to_be_bytes());
        let parts = jobs.iter().map(|j| &j.batch).chain(std::iter::once(&floor));
        let merged = append_batches(parts);
        let mut opts = WriteOptions::default();
        opts.set_sync(true);
        db.write_opt(merged, &opts)?;
        Ok(())
    }

    pub(crate) fn submit(
        &self,
        batch: WriteBatch,
        clock_floor: u64,
        ops: Vec<LogOp>,
    ) -> tokio::sync::oneshot::Receiver<Result<()>> {
        let (done, rx) = tokio::sync::oneshot::channel();
        let job = CommitJob {
            batch,
            clock_floor,
            ops,
            done,
        };
        // The receiving thread lives as long as the store; a failed send drops `done`, which
        // the waiter sees as an error.
        if let Some(tx) = &self.tx {
            let _ = tx.send(job);
        }
        rx
    }

    /// Queues a batch and waits until it is durable (outside the async runtime).
    pub(crate) fn commit_blocking(
        &self,
        batch: WriteBatch,
        clock_floor: u64,
        ops: Vec<LogOp>,
    ) -> Result<()> {
        self.submit(batch, clock_floor, ops)
            .blocking_recv()
            .unwrap_or_else(|_| Err(Error::Closing))
    }

    /// Returns once every batch queued before it is committed (the queue is first in, first
    /// out). Outside the async runtime.
    pub(crate) fn barrier(&self, clock_floor: u64) -> Result<()> {
        self.commit_blocking(WriteBatch::default(), clock_floor, vec![])
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
