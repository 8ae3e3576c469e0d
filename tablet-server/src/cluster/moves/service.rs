//! `basalt.control.v1.TabletMove`: both ends of a tablet move (see `docs/cluster.md`, "Tablet
//! moves", and `../shared/DISTRIBUTED.md`). The master drives a move; this module carries out
//! each step on one server:
//!
//! * **source** — [`StreamTablet`](TabletMove::stream_tablet) starts a capture of the tablet's
//!   range and streams its snapshot (SST files, CRC-32 per file, rate-limited), then the
//!   capture's records as they are committed; [`FenceTablet`](TabletMove::fence_tablet)
//!   refuses the tablet's reads and writes ("moving", retryable) and returns the last
//!   sequence and the clock; [`ReleaseTablet`](TabletMove::release_tablet) deletes the range
//!   once the owner switched, and the store refuses it from then on;
//! * **destination** — [`ReceiveTablet`](TabletMove::receive_tablet) pulls that stream,
//!   verifies and ingests the files (after deleting whatever the range held), applies the
//!   records and answers once caught up; [`FinishMove`](TabletMove::finish_move) applies the
//!   rest and takes over the source's clock;
//! * either side — [`AbortMove`](TabletMove::abort_move) before the switch leaves the tablet
//!   where it was. A server also aborts on its own a move whose record is gone from etcd
//!   ([`reconcile`](super::reconcile::reconcile)): a master that died mid-move never leaves a
//!   tablet fenced.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use basalt_control::failpoints::hold;
use basalt_control::v1::{
    AbortMoveRequest, AbortMoveResponse, FenceTabletRequest, FenceTabletResponse,
    FinishMoveRequest, FinishMoveResponse, LogBatch, MoveSpec, ReceiveTabletRequest,
    ReceiveTabletResponse, ReleaseTabletRequest, ReleaseTabletResponse, SnapshotDone, SstChunk,
    SstFileInfo, StreamTabletRequest, TabletChunk, log_op, tablet_chunk,
};
use basalt_control::{TabletMove, move_client};
use basalt_model::{RowRange, TableSchema, Tablet, TabletState};
use basalt_storage::{CaptureId, LogOp, LogRecord, SstFile};
use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use super::registry::{DestinationMove, SourceMove};
use crate::cluster::node::Node;
use crate::metrics::Metrics;

/// Bytes of SST data per chunk of the stream.
const CHUNK_BYTES: usize = 1 << 20;
/// Most bytes of log records per message.
const LOG_BATCH_BYTES: usize = 4 << 20;
/// How long the source waits for new records before telling the destination it is caught up.
const IDLE_HEARTBEAT: Duration = Duration::from_millis(200);
/// How long ReceiveTablet waits for the first "caught up".
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(120);
/// How long FinishMove waits for the records through the fence's sequence.
const FINISH_TIMEOUT: Duration = Duration::from_secs(10);

/// The tablet-move service of a cluster server.
#[derive(Clone)]
pub struct MoveService {
    node: Arc<Node>,
    metrics: Arc<Metrics>,
}

impl MoveService {
    pub fn new(node: Arc<Node>) -> MoveService {
        let metrics = node.metrics.clone();
        MoveService { node, metrics }
    }
}

fn internal(e: impl std::fmt::Display) -> Status {
    Status::internal(e.to_string())
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> basalt_storage::Result<T> + Send + 'static,
) -> Result<T, Status> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(internal)?
        .map_err(|e| crate::error::status(e.into()))
}

/// The move's directory under the server's data directory.
fn move_dir(node: &Node, id: &str) -> Result<PathBuf, Status> {
    if id.is_empty() || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        return Err(Status::invalid_argument(format!("bad move id {id:?}")));
    }
    Ok(node.moves_dir.join(id))
}

fn spec(spec: Option<MoveSpec>) -> Result<MoveSpec, Status> {
    spec.ok_or_else(|| Status::invalid_argument("the request names no move"))
}

/// The table of a move (waiting briefly for this server's copy of the catalog).
async fn table_of(node: &Node, spec: &MoveSpec) -> Result<Arc<TableSchema>, Status> {
    crate::cluster::catalog::catch_up(node, &spec.table_name).await;
    node.store
        .table(&spec.table_name)
        .map_err(|e| crate::error::status(e.into()))
}

/// The tablet of the map with exactly the spec's range (any epoch).
fn mapped(node: &Node, table: &TableSchema, range: &RowRange) -> Option<Tablet> {
    mapped_in(&node.router.state().map, table, range)
}

/// The tablet of `map` with exactly `range`.
fn mapped_in(
    map: &basalt_model::TabletMap,
    table: &TableSchema,
    range: &RowRange,
) -> Option<Tablet> {
    map.tablets(basalt_meta::table_id(&table.name))
        .iter()
        .find(|t| t.range == *range)
        .cloned()
}

fn to_wire(r: &LogRecord) -> basalt_control::v1::LogRecord {
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

fn from_wire(r: basalt_control::v1::LogRecord, range: (&[u8], &[u8])) -> Result<LogRecord, Status> {
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
struct Streaming {
    move_id: String,
    table: Arc<TableSchema>,
    tablet: Tablet,
}

/// Sends the snapshot's files as the export finishes them (`files`), then — once the export
/// is done and the move registered — the capture's records until the capture ends or the
/// destination hangs up.
async fn stream_source(
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
async fn receive_snapshot(
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
async fn apply_records(
    node: Arc<Node>,
    m: Arc<DestinationMove>,
    mut stream: tonic::Streaming<TabletChunk>,
    caught_up: tokio::sync::oneshot::Sender<()>,
) {
    let keys = node.store.key_bounds(&m.table, &m.range);
    let mut caught_up = Some(caught_up);
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
        if let Some(last) = records.last().map(|r| r.seq) {
            hold("move-destination-catch-up").await;
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

impl MoveService {
    /// Source side of an abort (or of a move whose record vanished): stop capturing and serve
    /// the tablet again. The data stays.
    pub(super) async fn abort_source(&self, id: &str) {
        let Some(m) = self.node.moves.sources.lock().remove(id) else {
            return;
        };
        self.node.store.end_capture(m.capture);
        self.node.store.unfence(&m.table, &m.tablet.range);
        self.node.router.unfence(&m.tablet);
        info!(move_id = id, tablet = %m.tablet, "move aborted: serving the tablet again");
    }

    /// Destination side of an abort: stop applying and drop what was copied — unless this
    /// server owns the tablet now (then the move committed and the data is its own). Whether
    /// it does is read from etcd now (`fresh`: a map read after the move's record was seen
    /// gone); without it, or without an answer, the rows are left in place (they are never
    /// served: a later move of the tablet here deletes the range before ingesting).
    pub(super) async fn abort_destination(
        &self,
        id: &str,
        fresh: Option<&basalt_model::TabletMap>,
    ) -> Result<(), Status> {
        let Some(m) = self.node.moves.destinations.lock().remove(id) else {
            return Ok(());
        };
        if let Some(task) = m.task.lock().take() {
            task.abort();
        }
        let _ = std::fs::remove_dir_all(&m.dir);
        let read;
        let map = match fresh {
            Some(map) => Some(map),
            None => {
                read = self.node.meta.tablets(&self.node.config.cluster).await.ok();
                read.as_ref().map(|(map, _)| map)
            }
        };
        let Some(map) = map else {
            warn!(
                move_id = id,
                "cannot read the tablet map: the copied rows stay until a later move"
            );
            return Ok(());
        };
        let table_id = basalt_meta::table_id(&m.table.name);
        let owned = map
            .tablets(table_id)
            .iter()
            .any(|t| t.range == m.range && t.owner == self.node.router.me());
        if !owned {
            let (store, table, range) = (self.node.store.clone(), m.table.clone(), m.range.clone());
            blocking(move || store.delete_range(&table, &range)).await?;
            info!(move_id = id, "move aborted: dropped the copied rows");
        }
        Ok(())
    }
}

#[tonic::async_trait]
impl TabletMove for MoveService {
    type StreamTabletStream = ReceiverStream<Result<TabletChunk, Status>>;

    async fn stream_tablet(
        &self,
        request: Request<StreamTabletRequest>,
    ) -> Result<Response<Self::StreamTabletStream>, Status> {
        let req = request.into_inner();
        let spec = spec(req.r#move)?;
        let dir = move_dir(&self.node, &spec.move_id)?.join("out");
        let table = table_of(&self.node, &spec).await?;
        let range = spec.range();
        let tablet = mapped(&self.node, &table, &range)
            .filter(|t| {
                t.owner == self.node.router.me()
                    && t.epoch == spec.epoch
                    && t.state == TabletState::Serving
            })
            .ok_or_else(|| {
                Status::failed_precondition(format!(
                    "this server does not serve tablet {}[{range:?}) at epoch {}",
                    spec.table_name, spec.epoch
                ))
            })?;
        if self.node.moves.sources.lock().contains_key(&spec.move_id) {
            return Err(Status::already_exists(format!(
                "move {} is already streaming",
                spec.move_id
            )));
        }
        let (store, t, r, d) = (
            self.node.store.clone(),
            table.clone(),
            range.clone(),
            dir.clone(),
        );
        // The export runs on a blocking thread and hands over each file as it is finished:
        // the first travels while the next is written.
        let (files_tx, files_rx) = mpsc::unbounded_channel();
        let export = tokio::task::spawn_blocking(move || {
            store.start_capture(&t, &r, &d, &mut |file| {
                let _ = files_tx.send(file.clone());
                Ok(())
            })
        });
        info!(move_id = spec.move_id, %tablet, "streaming a tablet to its new owner");
        let (tx, rx) = mpsc::channel(8);
        tokio::spawn(stream_source(
            self.node.clone(),
            self.metrics.clone(),
            Streaming {
                move_id: spec.move_id.clone(),
                table,
                tablet,
            },
            export,
            files_rx,
            req.rate_limit_bytes_per_sec,
            tx,
        ));
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn receive_tablet(
        &self,
        request: Request<ReceiveTabletRequest>,
    ) -> Result<Response<ReceiveTabletResponse>, Status> {
        let req = request.into_inner();
        let spec = spec(req.r#move)?;
        let dir = move_dir(&self.node, &spec.move_id)?.join("in");
        let table = table_of(&self.node, &spec).await?;
        let range = spec.range();
        if mapped(&self.node, &table, &range).is_some_and(|t| t.owner == self.node.router.me()) {
            return Err(Status::failed_precondition(format!(
                "this server owns tablet {}[{range:?}) already",
                spec.table_name
            )));
        }
        let started = Instant::now();
        info!(
            move_id = spec.move_id,
            table = spec.table_name,
            source = req.source_address,
            "receiving a tablet"
        );
        let m = Arc::new(DestinationMove {
            table: table.clone(),
            range: range.clone(),
            applied: watch::channel(0).0,
            failed: Mutex::new(None),
            task: Mutex::new(None),
            dir: dir.clone(),
            started,
        });
        {
            let mut destinations = self.node.moves.destinations.lock();
            if destinations.contains_key(&spec.move_id) {
                return Err(Status::already_exists(format!(
                    "move {} is already being received",
                    spec.move_id
                )));
            }
            destinations.insert(spec.move_id.clone(), m.clone());
        }
        let outcome = async {
            let mut client = move_client(
                &self.node.dialer,
                &req.source_address,
                Duration::from_secs(5),
            )
            .map_err(internal)?;
            let mut stream = client
                .stream_tablet(StreamTabletRequest {
                    r#move: Some(spec.clone()),
                    rate_limit_bytes_per_sec: req.rate_limit_bytes_per_sec,
                })
                .await?
                .into_inner();
            let copied =
                receive_snapshot(&self.node, &self.metrics, &table, &range, &mut stream, &dir)
                    .await?;
            let copy_seconds = started.elapsed().as_secs_f64();
            let (tx, rx) = tokio::sync::oneshot::channel();
            let task = tokio::spawn(apply_records(self.node.clone(), m.clone(), stream, tx));
            *m.task.lock() = Some(task.abort_handle());
            tokio::time::timeout(CATCH_UP_TIMEOUT, rx)
                .await
                .map_err(|_| Status::deadline_exceeded("the destination did not catch up"))?
                .map_err(|_| {
                    Status::aborted(
                        m.failed
                            .lock()
                            .clone()
                            .unwrap_or_else(|| "applying the records stopped".into()),
                    )
                })?;
            Ok::<_, Status>(ReceiveTabletResponse {
                bytes: copied.0,
                files: copied.1,
                entries: copied.2,
                copy_seconds,
                applied_seq: *m.applied.borrow(),
            })
        }
        .await;
        match outcome {
            Ok(resp) => {
                info!(
                    move_id = spec.move_id,
                    bytes = resp.bytes,
                    seconds = resp.copy_seconds,
                    "copied a tablet's snapshot and caught up"
                );
                Ok(Response::new(resp))
            }
            Err(s) => {
                warn!(move_id = spec.move_id, error = %s.message(), "receiving a tablet failed");
                let _ = self.abort_destination(&spec.move_id, None).await;
                Err(s)
            }
        }
    }

    async fn fence_tablet(
        &self,
        request: Request<FenceTabletRequest>,
    ) -> Result<Response<FenceTabletResponse>, Status> {
        let spec = spec(request.into_inner().r#move)?;
        let m = self
            .node
            .moves
            .sources
            .lock()
            .get(&spec.move_id)
            .cloned()
            .ok_or_else(|| {
                Status::failed_precondition(format!("no move {} streams here", spec.move_id))
            })?;
        self.node.router.fence(&m.tablet);
        *m.fenced_at.lock() = Some(Instant::now());
        let name = format!("{}", m.tablet);
        let (store, table, range, capture) = (
            self.node.store.clone(),
            m.table.clone(),
            m.tablet.range.clone(),
            m.capture,
        );
        let fenced = blocking(move || store.fence(capture, &table, &range, &name)).await?;
        hold("move-source-after-fence").await;
        info!(
            move_id = spec.move_id,
            seq = fenced.seq,
            "fenced the tablet for its move"
        );
        Ok(Response::new(FenceTabletResponse {
            seq: fenced.seq,
            clock: fenced.clock,
        }))
    }

    async fn finish_move(
        &self,
        request: Request<FinishMoveRequest>,
    ) -> Result<Response<FinishMoveResponse>, Status> {
        let req = request.into_inner();
        let spec = spec(req.r#move)?;
        let m = self
            .node
            .moves
            .destinations
            .lock()
            .get(&spec.move_id)
            .cloned()
            .ok_or_else(|| {
                Status::failed_precondition(format!("no move {} is received here", spec.move_id))
            })?;
        let mut applied = m.applied.subscribe();
        let reached = tokio::time::timeout(FINISH_TIMEOUT, applied.wait_for(|a| *a >= req.seq));
        if !matches!(reached.await, Ok(Ok(_))) {
            let why = m.failed.lock().clone().unwrap_or_else(|| {
                format!(
                    "applied through record {} of {}",
                    *m.applied.borrow(),
                    req.seq
                )
            });
            return Err(Status::aborted(format!(
                "move {}: the destination did not apply the source's last records: {why}",
                spec.move_id
            )));
        }
        let store = self.node.store.clone();
        blocking(move || store.observe_clock(req.clock)).await?;
        // The destination has everything: stop reading the source (it is fenced).
        if let Some(task) = m.task.lock().take() {
            task.abort();
        }
        let _ = std::fs::remove_dir_all(&m.dir);
        Ok(Response::new(FinishMoveResponse {}))
    }

    async fn release_tablet(
        &self,
        request: Request<ReleaseTabletRequest>,
    ) -> Result<Response<ReleaseTabletResponse>, Status> {
        let spec = spec(request.into_inner().r#move)?;
        let table = table_of(&self.node, &spec).await?;
        let range = spec.range();
        // Only once etcd names another owner at a later epoch: the rows are someone else's.
        // (The predicate reads the state it is given: the tablet router's watch is borrowed
        // while it runs.)
        let me = self.node.router.me().to_string();
        let moved = |map: &basalt_model::TabletMap| {
            mapped_in(map, &table, &range).is_some_and(|t| t.owner != me && t.epoch > spec.epoch)
        };
        if !self
            .node
            .router
            .wait_for(|state| moved(&state.map), Duration::from_secs(5))
            .await
        {
            return Err(Status::failed_precondition(format!(
                "tablet {}[{range:?}) has not moved away from this server (epoch {})",
                spec.table_name, spec.epoch
            )));
        }
        let source = self.node.moves.sources.lock().remove(&spec.move_id);
        if let Some(m) = source {
            self.node.store.end_capture(m.capture);
            // The map names the new owner at a later epoch now: the fence of the old epoch
            // has nothing left to refuse.
            self.node.router.unfence(&m.tablet);
            if let Some(at) = *m.fenced_at.lock() {
                self.metrics.move_fenced(at.elapsed().as_secs_f64());
            }
            info!(
                move_id = spec.move_id,
                seconds = m.started.elapsed().as_secs_f64(),
                "tablet moved away"
            );
        }
        // The store refuses the range from now on (a request routed here by an older map is
        // answered "not owner" and retried on the new owner), then deletes its rows.
        let (store, t, r) = (self.node.store.clone(), table.clone(), range.clone());
        blocking(move || store.release(&t, &r)).await?;
        if let Ok(dir) = move_dir(&self.node, &spec.move_id) {
            let _ = std::fs::remove_dir_all(dir);
        }
        Ok(Response::new(ReleaseTabletResponse {}))
    }

    async fn abort_move(
        &self,
        request: Request<AbortMoveRequest>,
    ) -> Result<Response<AbortMoveResponse>, Status> {
        let spec = spec(request.into_inner().r#move)?;
        // The master asks only after its abort won in etcd: the tablet stays at the source.
        self.abort_source(&spec.move_id).await;
        self.abort_destination(&spec.move_id, None).await?;
        if let Ok(dir) = move_dir(&self.node, &spec.move_id) {
            let _ = std::fs::remove_dir_all(dir);
        }
        Ok(Response::new(AbortMoveResponse {}))
    }
}
