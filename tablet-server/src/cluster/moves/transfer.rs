//! The data of a tablet move on the wire: the source's stream (the snapshot's SST files, then
//! the capture's log records) and, on the destination, the ingest of the files and the
//! application of the records.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use basalt_control::failpoints::hold;
use basalt_control::v1::{
    LogBatch, SnapshotDone, SstChunk, SstFileInfo, TabletChunk, log_op, tablet_chunk,
};
use basalt_model::{RowRange, TableSchema, Tablet};
use basalt_storage::{CaptureId, LogOp, LogRecord, SstFile};
use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tonic::Status;
use tracing::info;

use super::registry::{DestinationMove, SourceMove};
use crate::cluster::node::Node;
use crate::metrics::Metrics;

/// Bytes of SST data per chunk of the stream.
const CHUNK_BYTES: usize = 1 << 20;
/// Most bytes of log records per message.
const LOG_BATCH_BYTES: usize = 4 << 20;
/// How long the source waits for new records before telling the destination it is caught up.
const IDLE_HEARTBEAT: Duration = Duration::from_millis(200);

pub(super) fn internal(e: impl std::fmt::Display) -> Status {
    Status::internal(e.to_string())
}

pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> basalt_storage::Result<T> + Send + 'static,
) -> Result<T, Status> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(internal)?
        .map_err(|e| crate::error::status(e.into()))
}

pub(super) fn to_wire(r: &LogRecord) -> basalt_control::v1::LogRecord {
    use basalt_control::v1::LogOp as W;
    let op = |kind: log_op::Kind, key: &[u8], value: &[u8]| W {
        kind: kind as i32,
        key: Bytes::copy_from_slice(key),
        value: Bytes::copy_from_slice(value),
    };
    basalt_control::v1::LogRecord {
        seq: r.seq,
        ops: r
            .ops
            .iter()
            .map(|o| match o {
                LogOp::Put { key, value } => op(log_op::Kind::Put, key, value),
                LogOp::Delete { key } => op(log_op::Kind::Delete, key, &[]),
                LogOp::Merge { key, value } => op(log_op::Kind::Merge, key, value),
                LogOp::DeleteRange { start, end } => op(log_op::Kind::DeleteRange, start, end),
            })
            .collect(),
    }
}

pub(super) fn from_wire(
    r: basalt_control::v1::LogRecord,
    range: (&[u8], &[u8]),
) -> Result<LogRecord, Status> {
    let ops = r
        .ops
        .into_iter()
        .map(|o| {
            let (key, value) = (o.key.to_vec(), o.value.to_vec());
            // Every key must lie in the tablet's keys: a record never writes elsewhere.
            let inside = |k: &[u8]| k >= range.0 && k < range.1;
            let op = match log_op::Kind::try_from(o.kind) {
                Ok(log_op::Kind::Put) if inside(&key) => LogOp::Put { key, value },
                Ok(log_op::Kind::Delete) if inside(&key) => LogOp::Delete { key },
                Ok(log_op::Kind::Merge) if inside(&key) => LogOp::Merge { key, value },
                Ok(log_op::Kind::DeleteRange)
                    if key.as_slice() >= range.0 && value.as_slice() <= range.1 =>
                {
                    LogOp::DeleteRange {
                        start: key,
                        end: value,
                    }
                }
                _ => {
                    return Err(Status::data_loss(format!(
                        "record {} holds an operation outside the tablet",
                        r.seq
                    )));
                }
            };
            Ok(op)
        })
        .collect::<Result<Vec<_>, Status>>()?;
    Ok(LogRecord { seq: r.seq, ops })
}

/// What the source's stream needs to know of its move.
pub(super) struct Streaming {
    pub move_id: String,
    pub table: Arc<TableSchema>,
    pub tablet: Tablet,
}

/// Sends the snapshot's files as the export finishes them (`files`), then — once the export
/// is done and the move registered — the capture's records until the capture ends or the
/// destination hangs up.
pub(super) async fn stream_source(
    node: Arc<Node>,
    metrics: Arc<Metrics>,
    m: Streaming,
    export: tokio::task::JoinHandle<basalt_storage::Result<(CaptureId, Vec<SstFile>)>>,
    mut files: mpsc::UnboundedReceiver<SstFile>,
    rate: u64,
    tx: mpsc::Sender<Result<TabletChunk, Status>>,
) {
    let started = Instant::now();
    let mut sent: u64 = 0;
    let mut infos = Vec::new();
    // Streams the files; false when the destination went away or a file could not be read.
    let streamed = async {
        let mut i = 0usize;
        while let Some(file) = files.recv().await {
            let path = file.path.clone();
            let read = tokio::task::spawn_blocking(move || {
                let data = std::fs::read(&path);
                let _ = std::fs::remove_file(&path);
                data
            })
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)));
            let data = match read {
                Ok(d) => d,
                Err(e) => {
                    let _ = tx
                        .send(Err(Status::internal(format!(
                            "reading {}: {e}",
                            file.path.display()
                        ))))
                        .await;
                    return false;
                }
            };
            let crc = crc32fast::hash(&data);
            for (k, piece) in data.chunks(CHUNK_BYTES).enumerate() {
                let chunk = TabletChunk {
                    chunk: Some(tablet_chunk::Chunk::Sst(SstChunk {
                        file: i as u32,
                        offset: (k * CHUNK_BYTES) as u64,
                        data: Bytes::copy_from_slice(piece),
                    })),
                };
                if tx.send(Ok(chunk)).await.is_err() {
                    return false;
                }
                hold("move-source-mid-stream").await;
                sent += piece.len() as u64;
                metrics.move_bytes_sent(piece.len() as u64);
                if rate > 0 {
                    let due = Duration::from_secs_f64(sent as f64 / rate as f64);
                    let elapsed = started.elapsed();
                    if due > elapsed {
                        tokio::time::sleep(due - elapsed).await;
                    }
                }
            }
            infos.push(SstFileInfo {
                file: i as u32,
                bytes: data.len() as u64,
                crc32: crc,
                entries: file.entries,
            });
            i += 1;
        }
        true
    }
    .await;
    let exported = export.await;
    if !streamed {
        // The capture must not outlive a stream nobody reads.
        if let Ok(Ok((capture, _))) = exported {
            node.store.end_capture(capture);
        }
        return;
    }
    let capture = match exported {
        Ok(Ok((capture, exported))) if exported.len() == infos.len() => capture,
        Ok(Ok((capture, exported))) => {
            node.store.end_capture(capture);
            let _ = tx
                .send(Err(Status::internal(format!(
                    "the export wrote {} files, {} were streamed",
                    exported.len(),
                    infos.len()
                ))))
                .await;
            return;
        }
        Ok(Err(e)) => {
            let _ = tx.send(Err(crate::error::status(e.into()))).await;
            return;
        }
        Err(e) => {
            let _ = tx.send(Err(internal(e))).await;
            return;
        }
    };
    node.moves.sources.lock().insert(
        m.move_id.clone(),
        Arc::new(SourceMove {
            capture,
            table: m.table,
            tablet: m.tablet.clone(),
            started,
            fenced_at: Mutex::new(None),
        }),
    );
    info!(move_id = m.move_id, tablet = %m.tablet, files = infos.len(), bytes = sent, "streamed a tablet's snapshot");
    let done = TabletChunk {
        chunk: Some(tablet_chunk::Chunk::SnapshotDone(SnapshotDone {
            files: infos,
        })),
    };
    if tx.send(Ok(done)).await.is_err() {
        return;
    }
    let mut after = 0;
    loop {
        let Some(notify) = node.store.capture_notify(capture) else {
            return; // released or aborted
        };
        let notified = notify.notified();
        let records = match node.store.take_log(capture, after, LOG_BATCH_BYTES) {
            Ok(r) => r,
            Err(e) => {
                let _ = tx.send(Err(Status::aborted(e.to_string()))).await;
                return;
            }
        };
        // Less than a full batch: nothing more was pending.
        let caught_up = records
            .iter()
            .flat_map(|r| &r.ops)
            .map(LogOp::bytes)
            .sum::<usize>()
            < LOG_BATCH_BYTES;
        if let Some(last) = records.last() {
            after = last.seq;
        }
        let batch = TabletChunk {
            chunk: Some(tablet_chunk::Chunk::Log(LogBatch {
                records: records.iter().map(to_wire).collect(),
                caught_up,
            })),
        };
        if tx.send(Ok(batch)).await.is_err() {
            return;
        }
        if records.is_empty() || caught_up {
            let _ = tokio::time::timeout(IDLE_HEARTBEAT, notified).await;
        }
    }
}

/// Receives a source's stream into `dir`: the files (checked), then ingests them; returns
/// the stream for the records and what was copied.
pub(super) async fn receive_snapshot(
    node: &Node,
    metrics: &Metrics,
    table: &Arc<TableSchema>,
    range: &RowRange,
    stream: &mut tonic::Streaming<TabletChunk>,
    dir: &Path,
) -> Result<(u64, u32, u64), Status> {
    std::fs::create_dir_all(dir).map_err(internal)?;
    let mut open: Option<(u32, std::fs::File, crc32fast::Hasher, u64)> = None;
    let mut written: Vec<(u32, u64, u32)> = Vec::new();
    let done = loop {
        let chunk = stream
            .message()
            .await?
            .ok_or_else(|| Status::aborted("the source ended the stream before the snapshot"))?;
        match chunk.chunk {
            Some(tablet_chunk::Chunk::Sst(c)) => {
                if open.as_ref().is_none_or(|(f, ..)| *f != c.file) {
                    if let Some((f, mut file, hasher, bytes)) = open.take() {
                        file.flush().map_err(internal)?;
                        written.push((f, bytes, hasher.finalize()));
                    }
                    let path = dir.join(format!("tablet-{:06}.sst", c.file));
                    open = Some((
                        c.file,
                        std::fs::File::create(&path).map_err(internal)?,
                        crc32fast::Hasher::new(),
                        0,
                    ));
                }
                let (_, file, hasher, bytes) = open.as_mut().expect("opened above");
                if c.offset != *bytes {
                    return Err(Status::data_loss(format!(
                        "file {}: chunk at {} after {} bytes",
                        c.file, c.offset, bytes
                    )));
                }
                file.write_all(&c.data).map_err(internal)?;
                hasher.update(&c.data);
                *bytes += c.data.len() as u64;
                metrics.move_bytes_received(c.data.len() as u64);
            }
            Some(tablet_chunk::Chunk::SnapshotDone(d)) => break d,
            _ => {
                return Err(Status::data_loss(
                    "the source sent records before its snapshot was complete",
                ));
            }
        }
    };
    if let Some((f, file, hasher, bytes)) = open.take() {
        file.sync_all().map_err(internal)?;
        written.push((f, bytes, hasher.finalize()));
    }
    if written.len() != done.files.len() {
        return Err(Status::data_loss(format!(
            "the snapshot has {} files, {} arrived",
            done.files.len(),
            written.len()
        )));
    }
    let mut files = Vec::new();
    let (mut bytes, mut entries) = (0, 0);
    for (info, (f, size, crc)) in done.files.iter().zip(&written) {
        if info.file != *f || info.bytes != *size || info.crc32 != *crc {
            return Err(Status::data_loss(format!(
                "snapshot file {}: {} bytes with CRC-32 {:08x} arrived, {} bytes with {:08x} were sent",
                info.file, size, crc, info.bytes, info.crc32
            )));
        }
        bytes += size;
        entries += info.entries;
        files.push(SstFile {
            path: dir.join(format!("tablet-{:06}.sst", f)),
            bytes: *size,
            entries: info.entries,
        });
    }
    let n = files.len() as u32;
    let (store, table, range) = (node.store.clone(), table.clone(), range.clone());
    blocking(move || {
        store.delete_range(&table, &range)?;
        store.ingest(&files)
    })
    .await?;
    Ok((bytes, n, entries))
}

/// Applies the records of the stream until it ends; signals `caught_up` at the first batch
/// the source sent with nothing more pending.
pub(super) async fn apply_records(
    node: Arc<Node>,
    m: Arc<DestinationMove>,
    mut stream: tonic::Streaming<TabletChunk>,
    caught_up: tokio::sync::oneshot::Sender<()>,
) {
    let keys = node.store.key_bounds(&m.table, &m.range);
    let mut caught_up = Some(caught_up);
    let mut held = false;
    loop {
        let batch = match stream.message().await {
            Ok(Some(TabletChunk {
                chunk: Some(tablet_chunk::Chunk::Log(b)),
            })) => b,
            Ok(Some(_)) => {
                *m.failed.lock() = Some("the source sent snapshot data after its records".into());
                return;
            }
            Ok(None) => {
                *m.failed.lock() = Some("the source ended the stream".into());
                return;
            }
            Err(s) => {
                *m.failed.lock() = Some(format!("the source's stream failed: {}", s.message()));
                return;
            }
        };
        let mut records = Vec::with_capacity(batch.records.len());
        let first = *m.applied.borrow() + 1;
        for (due, r) in (first..).zip(batch.records) {
            if r.seq != due {
                *m.failed.lock() = Some(format!("record {} arrived, {} was due", r.seq, due));
                return;
            }
            match from_wire(r, (&keys.0, &keys.1)) {
                Ok(r) => records.push(r),
                Err(s) => {
                    *m.failed.lock() = Some(s.message().to_string());
                    return;
                }
            }
        }
        // Held once, at the first batch (whether or not it carries records): every move
        // passes this point, written to while it was copied or not, and a held destination
        // does not fall behind a written tablet batch after batch.
        if !std::mem::replace(&mut held, true) {
            hold("move-destination-catch-up").await;
        }
        if let Some(last) = records.last().map(|r| r.seq) {
            let store = node.store.clone();
            if let Err(s) = blocking(move || store.apply_log(&records)).await {
                *m.failed.lock() = Some(format!("applying records: {}", s.message()));
                return;
            }
            m.applied.send_replace(last);
        }
        if batch.caught_up
            && let Some(tx) = caught_up.take()
        {
            let _ = tx.send(());
        }
    }
}
