//! The frontend's write path: single-row writes (MutateRow, CheckAndMutateRow,
//! ReadModifyWriteRow) on their row's owner, and MutateRows split by owner, each group sent
//! concurrently, the entries refused as not owned sent again by a newer map.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use basalt_model::TableSchema;
use googleapis_tonic_google_bigtable_v2::google::bigtable::v2::bigtable_client::BigtableClient;
use tonic::transport::Channel;

use googleapis_tonic_google_bigtable_v2::google::bigtable::v2 as pb;
use googleapis_tonic_google_rpc::google::rpc::Status as RpcStatus;
use pb::mutate_rows_response::Entry;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::state::{Accepted, Frontend, OnTable};
use crate::cluster::forwarding::{
    FORWARD_TIMEOUT, FailoverAfter, RETRY_WAIT, forwarded, from_owner, not_delivered, not_owner,
    on_owner,
};
use crate::cluster::tablet_router::Target;
use crate::error::{Error, rpc_refusal, rpc_status, status};

pub(super) type MutateRowsStream = ReceiverStream<Result<pb::MutateRowsResponse, Status>>;

impl Frontend {
    /// MutateRow on the row's owner.
    pub(super) async fn mutate_row(
        &self,
        request: Request<pb::MutateRowRequest>,
    ) -> Result<Response<pb::MutateRowResponse>, Status> {
        self.on_the_rows_owner(
            request,
            |schema, req| self.local.mutate_row_in(schema, req, Instant::now()),
            |mut owner, req| async move { owner.mutate_row(req).await },
        )
        .await
    }

    /// MutateRows: the entries grouped by the owner of their row, each group sent at once;
    /// entries refused as not owned are sent again by a newer map.
    pub(super) async fn mutate_rows(
        &self,
        request: Request<pb::MutateRowsRequest>,
    ) -> Result<Response<MutateRowsStream>, Status> {
        let Accepted {
            hop,
            deadline,
            failover,
            req,
            table,
        } = self.accept(request).await?;
        let prepared = (|| {
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
            Ok(())
        })();
        prepared.map_err(status)?;
        let n = req.entries.len();
        let mut results: Vec<Option<RpcStatus>> = vec![None; n];
        let mut pending: Vec<usize> = (0..n).collect();
        let retry_until = Instant::now() + failover.retry_for();
        while !pending.is_empty() {
            let planned = self.node.router.state().revision;
            // Group the pending entries by the server of their row.
            let mut groups: Vec<(Target, Vec<usize>)> = Vec::new();
            let mut unroutable: Vec<(usize, Error)> = Vec::new();
            for &i in &pending {
                let row = &req.entries[i].row_key;
                match self.node.router.route_row(&table.id, row) {
                    Ok((_, target)) => {
                        if hop && target != Target::Local {
                            let owner = match &target {
                                Target::Remote { owner, .. } => Some(owner.clone()),
                                Target::Local => None,
                            };
                            results[i] = Some(rpc_status(&not_owner(&table.id, row, owner)));
                            continue;
                        }
                        match groups.iter_mut().find(|(t, _)| *t == target) {
                            Some((_, idx)) => idx.push(i),
                            None => groups.push((target, vec![i])),
                        }
                    }
                    Err(e) if hop => {
                        let _ = e;
                        results[i] = Some(rpc_status(&not_owner(&table.id, row, None)));
                    }
                    Err(e) => unroutable.push((i, e)),
                }
            }
            let schema = &table.schema;
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
                                    .mutate_rows_in(schema.clone(), sub, Instant::now())
                                    .await?
                                    .into_inner(),
                            ),
                            remote => {
                                self.metrics.forwarded();
                                let owner = remote.address().to_string();
                                let stream = self
                                    .peers
                                    .client(remote)?
                                    .mutate_rows(forwarded(sub, deadline.or(Some(FORWARD_TIMEOUT))))
                                    .await
                                    .map_err(|s| from_owner(s, &owner))?
                                    .into_inner();
                                Box::pin(stream.map(move |r| r.map_err(|s| from_owner(s, &owner))))
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
                if failover != FailoverAfter::Never && pending.len() == n {
                    // Nothing was applied: another cluster may take the whole batch.
                    let first = &req.entries[pending[0]].row_key;
                    return Err(status(not_owner(&table.id, first, None)));
                }
                for &i in &pending {
                    results[i] = Some(RpcStatus {
                        code: tonic::Code::Unavailable as i32,
                        message: last_error.clone(),
                        details: vec![],
                    });
                }
                break;
            }
            self.node.router.newer_than(planned, RETRY_WAIT).await;
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

    /// CheckAndMutateRow on the row's owner.
    pub(super) async fn check_and_mutate_row(
        &self,
        request: Request<pb::CheckAndMutateRowRequest>,
    ) -> Result<Response<pb::CheckAndMutateRowResponse>, Status> {
        self.on_the_rows_owner(
            request,
            |schema, req| {
                self.local
                    .check_and_mutate_row_in(schema, req, Instant::now())
            },
            |mut owner, req| async move { owner.check_and_mutate_row(req).await },
        )
        .await
    }

    /// ReadModifyWriteRow on the row's owner.
    pub(super) async fn read_modify_write_row(
        &self,
        request: Request<pb::ReadModifyWriteRowRequest>,
    ) -> Result<Response<pb::ReadModifyWriteRowResponse>, Status> {
        self.on_the_rows_owner(
            request,
            |schema, req| {
                self.local
                    .read_modify_write_row_in(schema, req, Instant::now())
            },
            |mut owner, req| async move { owner.read_modify_write_row(req).await },
        )
        .await
    }

    /// A request about one row, served by the row's owner ([`on_owner`]: retried on a newer
    /// map while the owner changes): here through `local` with the table's schema, resolved
    /// once, or forwarded to the owner through `remote` with the client's deadline.
    async fn on_the_rows_owner<Req, Resp, L, LF, R, RF>(
        &self,
        request: Request<Req>,
        local: L,
        remote: R,
    ) -> Result<Response<Resp>, Status>
    where
        Req: OneRow,
        L: Fn(Arc<TableSchema>, Req) -> LF,
        LF: Future<Output = Result<Response<Resp>, Status>>,
        R: Fn(BigtableClient<Channel>, Request<Req>) -> RF,
        RF: Future<Output = Result<Response<Resp>, Status>>,
    {
        let Accepted {
            hop,
            deadline,
            failover,
            req,
            table,
        } = self.accept(request).await?;
        let (local, remote) = (&local, &remote);
        on_owner(
            &self.node.router,
            &self.metrics,
            (&table.id, req.row()),
            hop,
            failover,
            |target| {
                let req = req.clone();
                let schema = table.schema.clone();
                async move {
                    match target {
                        Target::Local => local(schema, req).await,
                        owner => {
                            let client = self.peers.client(&owner)?;
                            remote(client, forwarded(req, deadline.or(Some(FORWARD_TIMEOUT)))).await
                        }
                    }
                }
            },
        )
        .await
    }
}

/// A request about one row of a table: its row key.
trait OneRow: OnTable + Clone {
    fn row(&self) -> &[u8];
}

macro_rules! one_row {
    ($($request:ty),*) => {$(
        impl OneRow for $request {
            fn row(&self) -> &[u8] {
                &self.row_key
            }
        }
    )*};
}

one_row!(
    pb::MutateRowRequest,
    pb::CheckAndMutateRowRequest,
    pb::ReadModifyWriteRowRequest
);

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
