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

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use basalt_control::failpoints::hold;
use basalt_control::v1::{
    AbortMoveRequest, AbortMoveResponse, FenceTabletRequest, FenceTabletResponse,
    FinishMoveRequest, FinishMoveResponse, MoveSpec, ReceiveTabletRequest, ReceiveTabletResponse,
    ReleaseTabletRequest, ReleaseTabletResponse, StreamTabletRequest, TabletChunk,
};
use basalt_control::{TabletMove, move_client};
use basalt_model::{RowRange, TableSchema, Tablet, TabletState};
use parking_lot::Mutex;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use super::registry::DestinationMove;
use super::transfer::{
    Streaming, apply_records, blocking, internal, receive_snapshot, stream_source,
};
use crate::cluster::node::Node;
use crate::metrics::Metrics;

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
    /// it does is read from etcd now (`fresh`: the tablets of its table read after the move's
    /// record was seen gone); without an answer, the rows are left in place (they are never
    /// served: a later move of the tablet here deletes the range before ingesting).
    pub(super) async fn abort_destination(
        &self,
        id: &str,
        fresh: Option<&[basalt_model::Tablet]>,
    ) -> Result<(), Status> {
        let Some(m) = self.node.moves.destinations.lock().remove(id) else {
            return Ok(());
        };
        if let Some(task) = m.task.lock().take() {
            task.abort();
        }
        let _ = std::fs::remove_dir_all(&m.dir);
        let table_id = basalt_meta::table_id(&m.table.name);
        let read = match fresh {
            Some(tablets) => Some(tablets.to_vec()),
            None => table_now(&self.node, table_id).await,
        };
        let Some(tablets) = read else {
            warn!(
                move_id = id,
                "cannot read the tablet map: the copied rows stay until a later move"
            );
            return Ok(());
        };
        let owned = tablets
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

/// The tablets of table `id` now, read from etcd (None: no answer, or still being assigned).
pub(super) async fn table_now(
    node: &crate::cluster::node::Node,
    id: &str,
) -> Option<Vec<basalt_model::Tablet>> {
    (node.meta)
        .table_tablets_at(&node.config.cluster, id, 0)
        .await
        .ok()
        .flatten()
}
