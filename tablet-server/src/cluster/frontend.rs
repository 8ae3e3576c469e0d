//! The data API of a cluster server: every server accepts every request. Rows of tablets it
//! owns are served by the local [`DataService`]; other rows are forwarded to their owners
//! (single-row calls), split by owner (MutateRows) or read tablet by tablet in key order
//! (ReadRows, either direction, resuming after the last row sent when a tablet's owner
//! changes); SampleRowKeys is merged over every owner.
//!
//! A forwarded request carries the [`FORWARDED`] header: its receiver serves it only from its
//! own tablets and answers "not owner" (retryable UNAVAILABLE, nothing applied) for any other
//! row, so a request is never forwarded twice. The frontend retries "not owner" and routing
//! gaps (a tablet being assigned, an owner restarting) for a bounded time after refreshing its
//! map; an outcome it cannot know (the owner failed after receiving a write) is returned to
//! the client as UNAVAILABLE, never retried blindly.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use basalt_transport::Dialer;
use bytes::Bytes;
use googleapis_tonic_google_bigtable_v2::google::bigtable::v2 as pb;
use pb::bigtable_client::BigtableClient;
use tokio::sync::mpsc;
use tokio::time::Duration;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use basalt_model::limits::MAX_MESSAGE_BYTES;
use basalt_model::schema::{parse_instance_name, parse_table_name};
use basalt_model::{RowRange, RowSet};
use basalt_storage::Store;

use super::Node;
use super::routing::Target;
use crate::data_api::{DataService, ReadStats};
use crate::error::{Error, Result, refusal, rpc_refusal, status};
use crate::metrics::Metrics;
use crate::proto::bigtable_server::Bigtable;
use crate::translate;

/// The header of a request forwarded by another server's frontend.
pub const FORWARDED: &str = "x-basalt-forwarded";

/// How long a frontend keeps retrying a request that no server could take yet (a tablet
/// being assigned, its owner restarting or its lease lapsing) before answering UNAVAILABLE.
const RETRY_FOR: Duration = Duration::from_secs(8);
/// How long to wait for a newer tablet map between retries.
const RETRY_WAIT: Duration = Duration::from_millis(200);

/// The gRPC clients of the other servers: their channels come from the node's [`Dialer`]
/// (one per address, shared with the server's other peer calls); the clients keep Bigtable's
/// message-size limits.
struct Peers {
    dialer: Dialer,
}

impl Peers {
    fn get(&self, address: &str) -> Result<BigtableClient<Channel>> {
        let channel = self
            .dialer
            .channel(address)
            .map_err(|e| Error::Internal(format!("cannot dial server {address:?}: {e}")))?;
        Ok(BigtableClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES))
    }
}

/// The request to send to another server: marked as forwarded, with the client's deadline
/// (so a frontend never waits on an owner longer than its client does).
fn forwarded<T>(msg: T, deadline: Option<Duration>) -> Request<T> {
    let mut req = Request::new(msg);
    req.metadata_mut()
        .insert(FORWARDED, tonic::metadata::MetadataValue::from_static("1"));
    if let Some(d) = deadline {
        req.set_timeout(d);
    }
    req
}

/// The deadline a forwarded single-row call gets when its client set none (streams keep
/// none: a long scan may take longer).
const FORWARD_TIMEOUT: Duration = Duration::from_secs(60);

/// The client's deadline from the `grpc-timeout` header (`<digits><unit>`, unit one of
/// H M S m u n), if any.
fn client_deadline(metadata: &tonic::metadata::MetadataMap) -> Option<Duration> {
    let value = metadata.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

fn is_forwarded<T>(req: &Request<T>) -> bool {
    req.metadata().contains_key(FORWARDED)
}

/// A "not owner" or "moving" answer (model `Error::NotOwner`, `Error::Moving`; read from the
/// status's `ErrorInfo`, see [`crate::error::refusal`]): the request was not applied.
fn is_not_owner(s: &Status) -> bool {
    refusal(s).is_some()
}

/// A failure that proves the request never reached the owner (safe to retry elsewhere).
fn not_delivered(s: &Status) -> bool {
    if is_not_owner(s) {
        return true;
    }
    if s.code() != tonic::Code::Unavailable {
        return false;
    }
    let text = format!("{s:?}").to_ascii_lowercase();
    text.contains("connection refused") || text.contains("tcp connect error")
}

pub struct Frontend {
    node: Arc<Node>,
    local: Arc<DataService<Store>>,
    peers: Peers,
    metrics: Arc<Metrics>,
}

impl Frontend {
    pub fn new(node: Arc<Node>, local: Arc<DataService<Store>>, metrics: Arc<Metrics>) -> Self {
        Frontend {
            peers: Peers {
                dialer: node.dialer.clone(),
            },
            node,
            local,
            metrics,
        }
    }

    /// The table id of a request's table, after the checks a standalone server makes first:
    /// a valid name, of this cluster's instance (another instance is NOT_FOUND, as in
    /// Bigtable), of a table that exists.
    fn table_id(&self, table_name: &str, view_name: &str) -> Result<String> {
        if table_name.is_empty() {
            if !view_name.is_empty() {
                return Err(Error::Unimplemented(
                    "authorized and materialized views are not supported by Basalt yet".into(),
                ));
            }
            return Err(Error::InvalidArgument("table_name is required".into()));
        }
        let (instance, table) = parse_table_name(table_name)?;
        if instance != self.node.config.instance_name() {
            return Err(Error::NotFound(format!("table {table_name} not found")));
        }
        self.node.store.table(table_name)?;
        Ok(table.to_string())
    }

    fn not_owner(&self, table: &str, row: &[u8], owner: Option<String>) -> Error {
        Error::NotOwner {
            table: table.to_string(),
            row: Bytes::copy_from_slice(row),
            owner,
        }
    }

    /// Runs `call` against the server of `row`: here, or forwarded; retried while no server
    /// can take it or its owner answers "not owner". A forwarded request (`hop`) is served
    /// here or refused as not owned.
    async fn on_owner<T, F, Fut>(
        &self,
        table: &str,
        row: &[u8],
        hop: bool,
        call: F,
    ) -> Result<T, Status>
    where
        F: Fn(Target) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        let deadline = Instant::now() + RETRY_FOR;
        loop {
            let planned = self.node.routing.state().revision;
            let last = match self.node.routing.route_row(table, row) {
                // Fenced or moved away between the routing and the call (the store refuses
                // it, see `basalt_storage::fences`): nothing was applied; wait for the new
                // owner.
                Ok((_, Target::Local)) => match call(Target::Local).await {
                    Err(s) if !hop && is_not_owner(&s) => s.message().to_string(),
                    other => return other,
                },
                Ok((_, Target::Remote { owner, .. })) if hop => {
                    return Err(status(self.not_owner(table, row, Some(owner))));
                }
                Ok((_, remote)) => {
                    self.metrics.forwarded();
                    match call(remote).await {
                        Err(s) if not_delivered(&s) => s.message().to_string(),
                        other => return other,
                    }
                }
                Err(_) if hop => return Err(status(self.not_owner(table, row, None))),
                Err(e) => e.to_string(),
            };
            if Instant::now() >= deadline {
                return Err(Status::unavailable(last));
            }
            self.node.routing.newer_than(planned, RETRY_WAIT).await;
        }
    }

    fn peer(&self, target: &Target) -> Result<BigtableClient<Channel>, Status> {
        match target {
            Target::Remote { address, .. } => self.peers.get(address).map_err(status),
            Target::Local => Err(Status::internal("peer() of a local target")),
        }
    }
}

/// The proto RowSet of a row set (single rows as keys, so point reads stay point reads).
fn row_set_proto(rows: &RowSet) -> pb::RowSet {
    use pb::row_range::{EndKey, StartKey};
    let mut set = pb::RowSet::default();
    for r in rows.ranges() {
        if r.is_single_row() {
            set.row_keys.push(r.start.clone());
            continue;
        }
        set.row_ranges.push(pb::RowRange {
            start_key: (!r.start.is_empty()).then(|| StartKey::StartKeyClosed(r.start.clone())),
            end_key: r.end.clone().map(EndKey::EndKeyOpen),
        });
    }
    set
}

/// What remains of `rows` after the rows up to `key` (inclusive) in scan order.
fn after(rows: &RowSet, key: &[u8], reversed: bool) -> RowSet {
    let rest = if reversed {
        RowRange::new(Bytes::new(), Some(Bytes::copy_from_slice(key)))
    } else {
        let mut start = key.to_vec();
        start.push(0);
        RowRange::new(Bytes::from(start), None)
    };
    rows.intersect(&rest)
}

/// What remains of `rows` after a whole tablet `range` in scan order.
fn after_range(rows: &RowSet, range: &RowRange, reversed: bool) -> RowSet {
    if reversed {
        rows.intersect(&RowRange::new(Bytes::new(), Some(range.start.clone())))
    } else {
        match &range.end {
            Some(end) => rows.intersect(&RowRange::new(end.clone(), None)),
            None => RowSet::from_ranges([]),
        }
    }
}

type SampleStream = ReceiverStream<Result<pb::SampleRowKeysResponse, Status>>;
type MutateRowsStream = ReceiverStream<Result<pb::MutateRowsResponse, Status>>;

/// A stream of ReadRowsResponses from a local or remote read.
type BoxedReadStream = std::pin::Pin<
    Box<dyn tokio_stream::Stream<Item = Result<pb::ReadRowsResponse, Status>> + Send>,
>;

impl Frontend {
    async fn open_read(
        &self,
        target: &Target,
        req: pb::ReadRowsRequest,
        deadline: Option<Duration>,
    ) -> Result<BoxedReadStream, Status> {
        match target {
            Target::Local => Ok(Box::pin(
                self.local.read_rows(Request::new(req)).await?.into_inner(),
            )),
            remote => {
                self.metrics.forwarded();
                Ok(Box::pin(
                    self.peer(remote)?
                        .read_rows(forwarded(req, deadline))
                        .await?
                        .into_inner(),
                ))
            }
        }
    }
}

impl Frontend {
    /// A point read forwarded to `target`: its whole answer, or None when the owner refused it
    /// before answering (UNAVAILABLE without a row: safe to retry elsewhere, reads being
    /// idempotent).
    async fn point_read(
        &self,
        target: &Target,
        req: pb::ReadRowsRequest,
        deadline: Option<Duration>,
    ) -> Result<Option<Vec<Result<pb::ReadRowsResponse, Status>>>, Status> {
        let mut stream = match self.open_read(target, req, deadline).await {
            Ok(stream) => stream,
            Err(s) if s.code() == tonic::Code::Unavailable => return Ok(None),
            Err(s) => return Err(s),
        };
        let mut answer = Vec::new();
        while let Some(item) = stream.next().await {
            match item {
                Err(s) if s.code() == tonic::Code::Unavailable && answer.is_empty() => {
                    return Ok(None);
                }
                Err(s) => {
                    answer.push(Err(s));
                    break;
                }
                Ok(resp) => answer.push(Ok(resp)),
            }
        }
        Ok(Some(answer))
    }
}

/// The ReadRows of a cluster frontend: tablet by tablet in scan order.
async fn read_across(
    fe: Arc<Frontend>,
    table: String,
    req: pb::ReadRowsRequest,
    mut rows: RowSet,
    deadline: Option<Duration>,
    tx: mpsc::Sender<Result<pb::ReadRowsResponse, Status>>,
) {
    let started = Instant::now();
    let reversed = req.reversed;
    let mut limit = if req.rows_limit == 0 {
        None
    } else {
        Some(req.rows_limit)
    };
    let want_stats =
        req.request_stats_view == pb::read_rows_request::RequestStatsView::RequestStatsFull as i32;
    let mut stats = ReadStats::default();
    let mut retry_until = Instant::now() + RETRY_FOR;
    'plan: while !rows.is_empty() && limit != Some(0) {
        // Each part is read by the owner this plan names; an owner that no longer serves it
        // (moved since: its store refuses the read before sending a row) sends the rest of
        // the read to a new plan, made from a newer map.
        let planned = fe.node.routing.state().revision;
        let parts = match fe.node.routing.route_rows(&table, &rows, reversed) {
            Ok(parts) => parts,
            Err(e) => {
                if Instant::now() >= retry_until {
                    let _ = tx.send(Err(status(e))).await;
                    return;
                }
                fe.node.routing.newer_than(planned, RETRY_WAIT).await;
                continue;
            }
        };
        for (tablet, part, target) in parts {
            let target = match target {
                Ok(t) => t,
                Err(e) => {
                    if Instant::now() >= retry_until {
                        let _ = tx.send(Err(status(e))).await;
                        return;
                    }
                    fe.node.routing.newer_than(planned, RETRY_WAIT).await;
                    continue 'plan;
                }
            };
            let mut sub = req.clone();
            sub.rows = Some(row_set_proto(&part));
            sub.rows_limit = limit.unwrap_or(0);
            let mut stream = match fe.open_read(&target, sub, deadline).await {
                Ok(s) => s,
                Err(s) if s.code() == tonic::Code::Unavailable && Instant::now() < retry_until => {
                    fe.node.routing.newer_than(planned, RETRY_WAIT).await;
                    continue 'plan;
                }
                Err(s) => {
                    let _ = tx.send(Err(s)).await;
                    return;
                }
            };
            let mut current_key = Bytes::new();
            while let Some(item) = stream.next().await {
                match item {
                    Ok(mut resp) => {
                        for chunk in &resp.chunks {
                            if !chunk.row_key.is_empty() {
                                current_key = chunk.row_key.clone();
                            }
                            if matches!(
                                chunk.row_status,
                                Some(pb::read_rows_response::cell_chunk::RowStatus::CommitRow(
                                    true
                                ))
                            ) {
                                rows = after(&rows, &current_key, reversed);
                                if let Some(l) = limit.as_mut() {
                                    *l -= 1;
                                }
                            }
                        }
                        if let Some(s) = resp.request_stats.take() {
                            stats.add(&s);
                        }
                        if resp.chunks.is_empty() && resp.last_scanned_row_key.is_empty() {
                            continue;
                        }
                        if tx.send(Ok(resp)).await.is_err() {
                            return; // the client went away
                        }
                    }
                    // The tablet moved or its owner failed: re-plan what is left (reads are
                    // idempotent; the rows sent are not sent again).
                    Err(s)
                        if s.code() == tonic::Code::Unavailable && Instant::now() < retry_until =>
                    {
                        fe.node.routing.newer_than(planned, RETRY_WAIT).await;
                        continue 'plan;
                    }
                    Err(s) => {
                        let _ = tx.send(Err(s)).await;
                        return;
                    }
                }
            }
            rows = after_range(&rows, &tablet.range, reversed);
            retry_until = Instant::now() + RETRY_FOR;
            if limit == Some(0) {
                break;
            }
        }
    }
    if want_stats {
        let _ = tx.send(Ok(stats.response(started))).await;
    }
}

/// Merges SampleRowKeys answers of several servers: each answer's offsets are cumulative over
/// that server's part of the table; the merge orders every sample key (and every tablet
/// boundary) and accumulates the bytes before each. The last sample is the empty key with the
/// table's total size.
fn merge_samples(answers: Vec<Vec<(Bytes, i64)>>, boundaries: Vec<Bytes>) -> Vec<(Bytes, i64)> {
    let mut sizes: BTreeMap<Bytes, i64> = BTreeMap::new();
    let mut tail = 0i64;
    for answer in answers {
        let mut before = 0i64;
        for (key, offset) in answer {
            let size = (offset - before).max(0);
            before = offset.max(before);
            if key.is_empty() {
                tail += size;
            } else {
                *sizes.entry(key).or_default() += size;
            }
        }
    }
    for b in boundaries {
        sizes.entry(b).or_default();
    }
    let mut total = 0i64;
    let mut out: Vec<(Bytes, i64)> = sizes
        .into_iter()
        .map(|(k, size)| {
            total += size;
            (k, total)
        })
        .collect();
    out.push((Bytes::new(), total + tail));
    out
}

#[tonic::async_trait]
impl Bigtable for Arc<Frontend> {
    type ReadRowsStream = BoxedReadStream;
    type SampleRowKeysStream = SampleStream;
    type MutateRowsStream = MutateRowsStream;

    async fn read_rows(
        &self,
        request: Request<pb::ReadRowsRequest>,
    ) -> Result<Response<BoxedReadStream>, Status> {
        let hop = is_forwarded(&request);
        let deadline = client_deadline(request.metadata());
        let req = request.into_inner();
        super::catalog::catch_up(&self.node, &req.table_name).await;
        let prepared = (|| {
            let table = self.table_id(&req.table_name, &req.authorized_view_name)?;
            if req.rows_limit < 0 {
                return Err(Error::InvalidArgument(format!(
                    "rows_limit must not be negative, got {}",
                    req.rows_limit
                )));
            }
            let rows = translate::row_set(req.rows.as_ref())?;
            Ok((table, rows))
        })();
        let (table, rows) = prepared.map_err(status)?;
        // All of it here (always so for a forwarded read): the local read as is.
        let parts = self.node.routing.route_rows(&table, &rows, req.reversed);
        let all_local = parts
            .as_ref()
            .is_ok_and(|p| p.iter().all(|(_, _, t)| matches!(t, Ok(Target::Local))));
        if all_local {
            let mut stream = self
                .local
                .read_rows(Request::new(req.clone()))
                .await?
                .into_inner();
            if hop {
                // The frontend that forwarded it retries a refusal on a newer map.
                return Ok(Response::new(Box::pin(stream)));
            }
            // The store refuses a read of rows it no longer serves before sending any (the map
            // this route came from was older than a move): that read goes tablet by tablet
            // below, on a newer map. Anything else is the answer.
            match stream.next().await {
                Some(Err(s)) if is_not_owner(&s) => {}
                first => {
                    return Ok(Response::new(Box::pin(
                        tokio_stream::iter(first).chain(stream),
                    )));
                }
            }
        } else if hop {
            let row = rows
                .ranges()
                .first()
                .map(|r| r.start.clone())
                .unwrap_or_default();
            return Err(status(self.not_owner(&table, &row, None)));
        }
        // A point read of another server's row: one round trip to the owner, its answer as is.
        let point = req
            .rows
            .as_ref()
            .is_some_and(|s| s.row_ranges.is_empty() && s.row_keys.len() == 1);
        let owner = match &parts {
            Ok(p) if p.len() == 1 => p[0].2.as_ref().ok().cloned(),
            _ => None,
        };
        // (When the owner refused it before answering, the general path below retries with
        // a fresh map.)
        if point
            && let Some(target @ Target::Remote { .. }) = owner
            && let Some(answer) = self.point_read(&target, req.clone(), deadline).await?
        {
            return Ok(Response::new(Box::pin(tokio_stream::iter(answer))));
        }
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(read_across(self.clone(), table, req, rows, deadline, tx));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn sample_row_keys(
        &self,
        request: Request<pb::SampleRowKeysRequest>,
    ) -> Result<Response<SampleStream>, Status> {
        let hop = is_forwarded(&request);
        let deadline = client_deadline(request.metadata());
        let req = request.into_inner();
        super::catalog::catch_up(&self.node, &req.table_name).await;
        let table = self
            .table_id(&req.table_name, &req.authorized_view_name)
            .map_err(status)?;
        if hop {
            return self.local.sample_row_keys(Request::new(req)).await;
        }
        // Every server that holds tablets of the table, by the newest map; a tablet without
        // one (being assigned, its owner restarting) is waited for, as other requests are.
        let retry_until = Instant::now() + RETRY_FOR;
        let (owners, boundaries) = loop {
            let state = self.node.routing.state();
            let mut owners: Vec<Target> = Vec::new();
            let mut boundaries = Vec::new();
            let mut missing = None;
            for t in state.map.tablets(&table) {
                if let Some(end) = &t.range.end {
                    boundaries.push(end.clone());
                }
                match self.node.routing.holder(&state, t) {
                    Ok(target) if !owners.contains(&target) => owners.push(target),
                    Ok(_) => {}
                    Err(e) => missing = Some(e),
                }
            }
            match missing {
                None => break (owners, boundaries),
                Some(e) if Instant::now() >= retry_until => return Err(status(e)),
                Some(_) => {
                    self.node
                        .routing
                        .newer_than(state.revision, RETRY_WAIT)
                        .await
                }
            }
        };
        let mut answers = Vec::new();
        for target in owners {
            let mut stream: std::pin::Pin<
                Box<
                    dyn tokio_stream::Stream<Item = Result<pb::SampleRowKeysResponse, Status>>
                        + Send,
                >,
            > = match &target {
                Target::Local => Box::pin(
                    self.local
                        .sample_row_keys(Request::new(req.clone()))
                        .await?
                        .into_inner(),
                ),
                remote => Box::pin(
                    self.peer(remote)?
                        .sample_row_keys(forwarded(req.clone(), deadline))
                        .await?
                        .into_inner(),
                ),
            };
            let mut answer = Vec::new();
            while let Some(s) = stream.next().await {
                let s = s?;
                answer.push((s.row_key, s.offset_bytes));
            }
            answers.push(answer);
        }
        let merged = merge_samples(answers, boundaries);
        let (tx, rx) = mpsc::channel(merged.len().max(1));
        for (row_key, offset_bytes) in merged {
            let _ = tx.try_send(Ok(pb::SampleRowKeysResponse {
                row_key,
                offset_bytes,
            }));
        }
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn mutate_row(
        &self,
        request: Request<pb::MutateRowRequest>,
    ) -> Result<Response<pb::MutateRowResponse>, Status> {
        let hop = is_forwarded(&request);
        let deadline = client_deadline(request.metadata());
        let req = request.into_inner();
        super::catalog::catch_up(&self.node, &req.table_name).await;
        let table = self
            .table_id(&req.table_name, &req.authorized_view_name)
            .map_err(status)?;
        let resp = self
            .on_owner(&table, &req.row_key, hop, |target| {
                let req = req.clone();
                async move {
                    match target {
                        Target::Local => self.local.mutate_row(Request::new(req)).await,
                        remote => {
                            self.peer(&remote)?
                                .mutate_row(forwarded(req, deadline.or(Some(FORWARD_TIMEOUT))))
                                .await
                        }
                    }
                }
            })
            .await?;
        Ok(Response::new(resp.into_inner()))
    }

    async fn mutate_rows(
        &self,
        request: Request<pb::MutateRowsRequest>,
    ) -> Result<Response<MutateRowsStream>, Status> {
        use googleapis_tonic_google_rpc::google::rpc::Status as RpcStatus;
        use pb::mutate_rows_response::Entry;
        let hop = is_forwarded(&request);
        let deadline = client_deadline(request.metadata());
        let req = request.into_inner();
        super::catalog::catch_up(&self.node, &req.table_name).await;
        let prepared = (|| {
            let table = self.table_id(&req.table_name, &req.authorized_view_name)?;
            if req.entries.is_empty() {
                return Err(Error::InvalidArgument(
                    "MutateRows needs at least one entry".into(),
                ));
            }
            let total: usize = req.entries.iter().map(|e| e.mutations.len()).sum();
            if total > basalt_model::limits::MAX_MUTATIONS {
                return Err(Error::InvalidArgument(format!(
                    "{total} mutations given across all entries; the maximum is {}",
                    basalt_model::limits::MAX_MUTATIONS
                )));
            }
            Ok(table)
        })();
        let table = prepared.map_err(status)?;
        let n = req.entries.len();
        let mut results: Vec<Option<RpcStatus>> = vec![None; n];
        let mut pending: Vec<usize> = (0..n).collect();
        let retry_until = Instant::now() + RETRY_FOR;
        while !pending.is_empty() {
            let planned = self.node.routing.state().revision;
            // Group the pending entries by the server of their row.
            let mut groups: Vec<(Target, Vec<usize>)> = Vec::new();
            let mut unroutable: Vec<(usize, Error)> = Vec::new();
            for &i in &pending {
                let row = &req.entries[i].row_key;
                match self.node.routing.route_row(&table, row) {
                    Ok((_, target)) => {
                        if hop && target != Target::Local {
                            let owner = match &target {
                                Target::Remote { owner, .. } => Some(owner.clone()),
                                Target::Local => None,
                            };
                            results[i] = Some(crate::error::rpc_status(
                                &self.not_owner(&table, row, owner),
                            ));
                            continue;
                        }
                        match groups.iter_mut().find(|(t, _)| *t == target) {
                            Some((_, idx)) => idx.push(i),
                            None => groups.push((target, vec![i])),
                        }
                    }
                    Err(e) if hop => {
                        let _ = e;
                        results[i] =
                            Some(crate::error::rpc_status(&self.not_owner(&table, row, None)));
                    }
                    Err(e) => unroutable.push((i, e)),
                }
            }
            let calls = groups.into_iter().map(|(target, idx)| {
                let sub = pb::MutateRowsRequest {
                    table_name: req.table_name.clone(),
                    authorized_view_name: req.authorized_view_name.clone(),
                    app_profile_id: req.app_profile_id.clone(),
                    entries: idx.iter().map(|&i| req.entries[i].clone()).collect(),
                };
                async move {
                    let outcome: Result<Vec<Entry>, Status> = async {
                        let mut stream: std::pin::Pin<
                            Box<
                                dyn tokio_stream::Stream<
                                        Item = Result<pb::MutateRowsResponse, Status>,
                                    > + Send,
                            >,
                        > = match &target {
                            Target::Local => Box::pin(
                                self.local
                                    .mutate_rows(Request::new(sub))
                                    .await?
                                    .into_inner(),
                            ),
                            remote => {
                                self.metrics.forwarded();
                                Box::pin(
                                    self.peer(remote)?
                                        .mutate_rows(forwarded(
                                            sub,
                                            deadline.or(Some(FORWARD_TIMEOUT)),
                                        ))
                                        .await?
                                        .into_inner(),
                                )
                            }
                        };
                        let mut entries = Vec::new();
                        while let Some(r) = stream.next().await {
                            entries.extend(r?.entries);
                        }
                        Ok(entries)
                    }
                    .await;
                    (idx, outcome)
                }
            });
            let outcomes = futures_join_all(calls).await;
            let mut retry = Vec::new();
            let mut last_error = String::new();
            for (idx, outcome) in outcomes {
                match outcome {
                    Ok(entries) => {
                        let mut seen = vec![false; idx.len()];
                        for e in entries {
                            let Some(&i) = usize::try_from(e.index).ok().and_then(|k| idx.get(k))
                            else {
                                continue;
                            };
                            seen[e.index as usize] = true;
                            let st = e.status.unwrap_or_default();
                            if !hop && rpc_refusal(&st).is_some() {
                                last_error = st.message.clone();
                                retry.push(i);
                            } else {
                                results[i] = Some(st);
                            }
                        }
                        for (k, &i) in idx.iter().enumerate() {
                            if !seen[k] {
                                results[i] = Some(RpcStatus {
                                    code: tonic::Code::Unavailable as i32,
                                    message: "the owner's answer did not include this entry".into(),
                                    details: vec![],
                                });
                            }
                        }
                    }
                    Err(s) if not_delivered(&s) && !hop => {
                        last_error = s.message().to_string();
                        retry.extend(idx);
                    }
                    Err(s) => {
                        for i in idx {
                            results[i] = Some(RpcStatus {
                                code: s.code() as i32,
                                message: s.message().to_string(),
                                details: vec![],
                            });
                        }
                    }
                }
            }
            for (i, e) in unroutable {
                last_error = e.to_string();
                retry.push(i);
            }
            pending = retry;
            if pending.is_empty() {
                break;
            }
            if Instant::now() >= retry_until {
                for &i in &pending {
                    results[i] = Some(RpcStatus {
                        code: tonic::Code::Unavailable as i32,
                        message: last_error.clone(),
                        details: vec![],
                    });
                }
                break;
            }
            self.node.routing.newer_than(planned, RETRY_WAIT).await;
        }
        let entries = results
            .into_iter()
            .enumerate()
            .map(|(index, s)| Entry {
                index: index as i64,
                status: Some(s.unwrap_or_default()),
            })
            .collect();
        let (tx, rx) = mpsc::channel(1);
        let _ = tx.try_send(Ok(pb::MutateRowsResponse {
            entries,
            rate_limit_info: None,
        }));
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn check_and_mutate_row(
        &self,
        request: Request<pb::CheckAndMutateRowRequest>,
    ) -> Result<Response<pb::CheckAndMutateRowResponse>, Status> {
        let hop = is_forwarded(&request);
        let deadline = client_deadline(request.metadata());
        let req = request.into_inner();
        super::catalog::catch_up(&self.node, &req.table_name).await;
        let table = self
            .table_id(&req.table_name, &req.authorized_view_name)
            .map_err(status)?;
        let resp = self
            .on_owner(&table, &req.row_key, hop, |target| {
                let req = req.clone();
                async move {
                    match target {
                        Target::Local => self.local.check_and_mutate_row(Request::new(req)).await,
                        remote => {
                            self.peer(&remote)?
                                .check_and_mutate_row(forwarded(
                                    req,
                                    deadline.or(Some(FORWARD_TIMEOUT)),
                                ))
                                .await
                        }
                    }
                }
            })
            .await?;
        Ok(Response::new(resp.into_inner()))
    }

    async fn ping_and_warm(
        &self,
        request: Request<pb::PingAndWarmRequest>,
    ) -> Result<Response<pb::PingAndWarmResponse>, Status> {
        let name = &request.get_ref().name;
        if let Ok((p, i)) = parse_instance_name(name)
            && format!("projects/{p}/instances/{i}") != self.node.config.instance_name()
        {
            return Err(Status::not_found(format!("instance {name} not found")));
        }
        self.local.ping_and_warm(request).await
    }

    async fn read_modify_write_row(
        &self,
        request: Request<pb::ReadModifyWriteRowRequest>,
    ) -> Result<Response<pb::ReadModifyWriteRowResponse>, Status> {
        let hop = is_forwarded(&request);
        let deadline = client_deadline(request.metadata());
        let req = request.into_inner();
        super::catalog::catch_up(&self.node, &req.table_name).await;
        let table = self
            .table_id(&req.table_name, &req.authorized_view_name)
            .map_err(status)?;
        let resp = self
            .on_owner(&table, &req.row_key, hop, |target| {
                let req = req.clone();
                async move {
                    match target {
                        Target::Local => self.local.read_modify_write_row(Request::new(req)).await,
                        remote => {
                            self.peer(&remote)?
                                .read_modify_write_row(forwarded(
                                    req,
                                    deadline.or(Some(FORWARD_TIMEOUT)),
                                ))
                                .await
                        }
                    }
                }
            })
            .await?;
        Ok(Response::new(resp.into_inner()))
    }
}

/// Runs the futures concurrently and returns their outputs in order.
async fn futures_join_all<F: Future>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let handles: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut out = Vec::with_capacity(handles.len());
    // Poll all of them together: start every call before awaiting any.
    let mut pending: Vec<_> = handles.into_iter().map(Some).collect();
    let mut results: Vec<Option<F::Output>> = (0..pending.len()).map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut done = true;
        for (slot, result) in pending.iter_mut().zip(results.iter_mut()) {
            if let Some(f) = slot {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => {
                        *result = Some(v);
                        *slot = None;
                    }
                    std::task::Poll::Pending => done = false,
                }
            }
        }
        if done {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    out.extend(
        results
            .into_iter()
            .map(|r| r.expect("every future completed")),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn the_clients_deadline_travels_with_a_forwarded_call() {
        let mut md = tonic::metadata::MetadataMap::new();
        assert_eq!(client_deadline(&md), None);
        for (v, d) in [
            ("20S", Duration::from_secs(20)),
            ("1500m", Duration::from_millis(1500)),
            ("2M", Duration::from_secs(120)),
            ("7u", Duration::from_micros(7)),
        ] {
            md.insert("grpc-timeout", v.parse().unwrap());
            assert_eq!(client_deadline(&md), Some(d), "{v}");
        }
        md.insert("grpc-timeout", "12x".parse().unwrap());
        assert_eq!(client_deadline(&md), None);
        let req = forwarded((), Some(Duration::from_secs(3)));
        assert!(req.metadata().contains_key(FORWARDED));
        assert_eq!(
            client_deadline(req.metadata()),
            Some(Duration::from_secs(3))
        );
    }

    #[test]
    fn samples_merge_in_key_order_with_tablet_boundaries() {
        // Server A holds [.., g) with samples at c (10 bytes before) and 30 in all; server B
        // holds [g, ..) with 50 bytes before x and 70 in all.
        let a = vec![(b("c"), 10), (b(""), 30)];
        let bb = vec![(b("x"), 50), (b(""), 70)];
        let merged = merge_samples(vec![a, bb], vec![b("g")]);
        assert_eq!(
            merged,
            vec![(b("c"), 10), (b("g"), 10), (b("x"), 60), (b(""), 100)]
        );
    }

    #[test]
    fn what_remains_after_a_row_in_either_direction() {
        let all = RowSet::all();
        let fwd = after(&all, b"k", false);
        assert!(!fwd.contains(b"k") && fwd.contains(b"k\0") && !fwd.contains(b"a"));
        let rev = after(&all, b"k", true);
        assert!(!rev.contains(b"k") && rev.contains(b"j") && !rev.contains(b"z"));
        let t = RowRange::new(b("g"), Some(b("p")));
        let rest = after_range(&all, &t, false);
        assert!(rest.contains(b"p") && !rest.contains(b"o"));
        let rest = after_range(&all, &t, true);
        assert!(rest.contains(b"f") && !rest.contains(b"g"));
        assert!(after_range(&all, &RowRange::new(b("p"), None), false).is_empty());
    }

    #[test]
    fn row_sets_round_trip_through_the_proto() {
        let set = RowSet::from_ranges([
            RowRange::key(b"a"),
            RowRange::new(b("c"), Some(b("f"))),
            RowRange::new(b("x"), None),
        ]);
        let proto = row_set_proto(&set);
        assert_eq!(proto.row_keys, vec![b("a")]);
        assert_eq!(translate::row_set(Some(&proto)).unwrap(), set);
        assert_eq!(
            translate::row_set(Some(&row_set_proto(&RowSet::all()))).unwrap(),
            RowSet::all()
        );
    }
}
