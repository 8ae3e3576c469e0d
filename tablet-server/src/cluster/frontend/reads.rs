//! The frontend's read path: ReadRows tablet by tablet in key order (either direction,
//! resuming after the last row sent when a tablet's owner changes), a point read of another
//! server's row in one round trip, and SampleRowKeys merged over every owner.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use googleapis_tonic_google_bigtable_v2::google::bigtable::v2 as pb;
use tokio::sync::mpsc;
use tokio::time::Duration;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use basalt_model::{RowRange, RowSet};

use super::state::{Accepted, Frontend, ResolvedTable};
use crate::cluster::forwarding::{
    RETRY_FOR, RETRY_WAIT, forwarded, from_owner, is_not_owner, not_owner,
};
use crate::cluster::tablet_router::Target;
use crate::data_api::ReadStats;
use crate::error::{Error, status};
use crate::translate;

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

pub(super) type SampleStream = ReceiverStream<Result<pb::SampleRowKeysResponse, Status>>;

/// A stream of ReadRowsResponses from a local or remote read.
pub(super) type BoxedReadStream = std::pin::Pin<
    Box<dyn tokio_stream::Stream<Item = Result<pb::ReadRowsResponse, Status>> + Send>,
>;

impl Frontend {
    /// ReadRows: from the local data API when this server serves every row asked for, else
    /// from each tablet's owner in scan order.
    pub(super) async fn read_rows(
        self: &Arc<Self>,
        request: Request<pb::ReadRowsRequest>,
    ) -> Result<Response<BoxedReadStream>, Status> {
        let Accepted {
            hop,
            deadline,
            req,
            table,
            ..
        } = self.accept(request).await?;
        let prepared = (|| {
            if req.rows_limit < 0 {
                return Err(Error::InvalidArgument(format!(
                    "rows_limit must not be negative, got {}",
                    req.rows_limit
                )));
            }
            translate::row_set(req.rows.as_ref())
        })();
        let rows = prepared.map_err(status)?;
        // All of it here (always so for a forwarded read): the local read as is.
        let parts = self.node.router.route_rows(&table.id, &rows, req.reversed);
        let all_local = parts
            .as_ref()
            .is_ok_and(|p| p.iter().all(|(_, _, t)| matches!(t, Ok(Target::Local))));
        if all_local {
            let mut stream = self
                .local
                .read_rows_in(table.schema.clone(), req.clone(), Instant::now())?
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
            return Err(status(not_owner(&table.id, &row, None)));
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
            && let Some(answer) = self
                .point_read(&table, &target, req.clone(), deadline)
                .await?
        {
            return Ok(Response::new(Box::pin(tokio_stream::iter(answer))));
        }
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(read_across(self.clone(), table, req, rows, deadline, tx));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    /// SampleRowKeys: every owner's samples of the table, merged.
    pub(super) async fn sample_row_keys(
        &self,
        request: Request<pb::SampleRowKeysRequest>,
    ) -> Result<Response<SampleStream>, Status> {
        let Accepted {
            hop,
            deadline,
            req,
            table,
            ..
        } = self.accept(request).await?;
        if hop {
            return self
                .local
                .sample_row_keys_in(table.schema, Instant::now())
                .await;
        }
        // Every server that holds tablets of the table, by the newest map; a tablet without
        // one (being assigned, its owner restarting) is waited for, as other requests are.
        let retry_until = Instant::now() + RETRY_FOR;
        let (owners, boundaries) = loop {
            let state = self.node.router.state();
            let mut owners: Vec<Target> = Vec::new();
            let mut boundaries = Vec::new();
            let mut missing = None;
            for t in state.map.tablets(&table.id) {
                if let Some(end) = &t.range.end {
                    boundaries.push(end.clone());
                }
                match self.node.router.holder(&state, t) {
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
                        .router
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
                        .sample_row_keys_in(table.schema.clone(), Instant::now())
                        .await?
                        .into_inner(),
                ),
                remote => Box::pin(
                    self.peers
                        .client(remote)?
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

    async fn open_read(
        &self,
        table: &ResolvedTable,
        target: &Target,
        req: pb::ReadRowsRequest,
        deadline: Option<Duration>,
    ) -> Result<BoxedReadStream, Status> {
        match target {
            Target::Local => Ok(Box::pin(
                self.local
                    .read_rows_in(table.schema.clone(), req, Instant::now())?
                    .into_inner(),
            )),
            remote => {
                self.metrics.forwarded();
                let owner = remote.address().to_string();
                let stream = self
                    .peers
                    .client(remote)?
                    .read_rows(forwarded(req, deadline))
                    .await
                    .map_err(|s| from_owner(s, &owner))?
                    .into_inner();
                Ok(Box::pin(
                    stream.map(move |item| item.map_err(|s| from_owner(s, &owner))),
                ))
            }
        }
    }
    /// A point read forwarded to `target`: its whole answer, or None when the owner refused it
    /// before answering (UNAVAILABLE without a row: safe to retry elsewhere, reads being
    /// idempotent).
    async fn point_read(
        &self,
        table: &ResolvedTable,
        target: &Target,
        req: pb::ReadRowsRequest,
        deadline: Option<Duration>,
    ) -> Result<Option<Vec<Result<pb::ReadRowsResponse, Status>>>, Status> {
        let mut stream = match self.open_read(table, target, req, deadline).await {
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
    table: ResolvedTable,
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
        let planned = fe.node.router.state().revision;
        let parts = match fe.node.router.route_rows(&table.id, &rows, reversed) {
            Ok(parts) => parts,
            Err(e) => {
                if Instant::now() >= retry_until {
                    let _ = tx.send(Err(status(e))).await;
                    return;
                }
                fe.node.router.newer_than(planned, RETRY_WAIT).await;
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
                    fe.node.router.newer_than(planned, RETRY_WAIT).await;
                    continue 'plan;
                }
            };
            let mut sub = req.clone();
            sub.rows = Some(row_set_proto(&part));
            sub.rows_limit = limit.unwrap_or(0);
            let mut stream = match fe.open_read(&table, &target, sub, deadline).await {
                Ok(s) => s,
                Err(s) if s.code() == tonic::Code::Unavailable && Instant::now() < retry_until => {
                    fe.node.router.newer_than(planned, RETRY_WAIT).await;
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
                        fe.node.router.newer_than(planned, RETRY_WAIT).await;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
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
