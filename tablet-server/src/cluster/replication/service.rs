//! The `Replication` service of a cluster server: applies the writes another cluster shipped
//! (routing each row to its owner in this cluster) and reports this server's log position.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use basalt_control::v1::{
    ApplyRequest, ApplyResponse, GetClusterLogPositionsRequest, GetClusterLogPositionsResponse,
    GetLogPositionRequest, GetLogPositionResponse, ReadSeedRequest, ReadSeedResponse,
    ReplicatedTableRows,
};
use basalt_control::{Replication, replication_client};
use basalt_model::{Error, Result};
use basalt_storage::replicated::ReplicatedRow;
use tonic::{Request, Response, Status};

use super::decode_row;
use super::tokens::{Member, cluster_positions};
use crate::cluster::Node;
use crate::cluster::forwarding::not_owner;
use crate::cluster::tablet_router::Target;
use crate::error::status;

/// How long routing a batch's rows to one owner may take.
const ROUTE_TIMEOUT: Duration = Duration::from_secs(30);
/// The most stored bytes one seed read returns (and the default when the caller names none).
const SEED_MAX_BYTES: u64 = 16 << 20;

pub struct ReplicationService {
    node: Arc<Node>,
}

impl ReplicationService {
    pub fn new(node: Arc<Node>) -> ReplicationService {
        ReplicationService { node }
    }
}

/// Applies `rows` of table `table` (its id): here the rows this server owns, the others
/// on their owners (`routed`: this is an owner, refuse what it does not own).
pub async fn apply_rows(
    node: &Node,
    origin: &str,
    table: &str,
    rows: Vec<ReplicatedRow>,
    routed: bool,
) -> Result<()> {
    let name = format!("{}/tables/{table}", node.config.instance_name());
    let schema = node.store.table(&name).map_err(|_| {
        Error::Unavailable(format!(
            "table {table} is not known here yet (the catalog mirror follows etcd)"
        ))
    })?;
    let mut local = Vec::new();
    let mut remote: HashMap<String, Vec<ReplicatedRow>> = HashMap::new();
    for row in rows {
        let (_, target) = node.router.route_row(table, &row.row.row)?;
        match target {
            Target::Local => local.push(row),
            Target::Remote { owner, .. } if routed => {
                return Err(not_owner(table, &row.row.row, Some(owner)));
            }
            Target::Remote { address, .. } => remote.entry(address).or_default().push(row),
        }
    }
    let here = async {
        if local.is_empty() {
            return Ok(());
        }
        node.store
            .apply_replicated_async(schema.clone(), local)
            .await
            .map_err(Error::from)
    };
    let there = futures::future::try_join_all(remote.into_iter().map(|(address, rows)| {
        let request = ApplyRequest {
            origin_cluster: origin.to_string(),
            tables: vec![ReplicatedTableRows {
                table: table.to_string(),
                rows: rows
                    .iter()
                    .map(|r| super::encode_row(r.first, &r.row))
                    .collect(),
            }],
            routed: true,
        };
        async move {
            let mut client = replication_client(&node.dialer, &address, ROUTE_TIMEOUT)
                .map_err(|e| Error::Unavailable(e.to_string()))?;
            client.apply(request).await.map_err(|s| {
                Error::Unavailable(format!(
                    "the owner at {address} did not apply replicated rows: {}",
                    s.message()
                ))
            })?;
            Ok::<(), Error>(())
        }
    }));
    let (here, there) = tokio::join!(here, there);
    here?;
    there?;
    Ok(())
}

#[tonic::async_trait]
impl Replication for ReplicationService {
    async fn apply(
        &self,
        request: Request<ApplyRequest>,
    ) -> Result<Response<ApplyResponse>, Status> {
        let req = request.into_inner();
        let mut work = Vec::with_capacity(req.tables.len());
        for table in req.tables {
            let rows = table
                .rows
                .iter()
                .map(|r| decode_row(r))
                .collect::<Result<Vec<_>>>()
                .map_err(status)?;
            work.push((table.table, rows));
        }
        let (origin, routed) = (&req.origin_cluster, req.routed);
        futures::future::try_join_all(work.into_iter().map(|(table, rows)| async move {
            apply_rows(&self.node, origin, &table, rows, routed).await
        }))
        .await
        .map_err(status)?;
        Ok(Response::new(ApplyResponse {}))
    }

    async fn get_log_position(
        &self,
        _request: Request<GetLogPositionRequest>,
    ) -> Result<Response<GetLogPositionResponse>, Status> {
        Ok(Response::new(GetLogPositionResponse {
            store_id: self.node.router.me().to_string(),
            cluster: self.node.config.cluster.clone(),
            last_seq: self.node.store.change_log_last_seq(),
        }))
    }

    async fn get_cluster_log_positions(
        &self,
        request: Request<GetClusterLogPositionsRequest>,
    ) -> Result<Response<GetClusterLogPositionsResponse>, Status> {
        let members: Vec<Member> = request
            .into_inner()
            .servers
            .into_iter()
            .map(Member::from)
            .collect();
        let cluster = self.node.config.cluster.clone();
        let positions = cluster_positions(&self.node, &cluster, &members)
            .await
            .map_err(status)?;
        Ok(Response::new(GetClusterLogPositionsResponse {
            positions: positions.into_iter().map(Into::into).collect(),
        }))
    }

    async fn read_seed(
        &self,
        request: Request<ReadSeedRequest>,
    ) -> Result<Response<ReadSeedResponse>, Status> {
        let req = request.into_inner();
        let name = format!("{}/tables/{}", self.node.config.instance_name(), req.table);
        let schema = self.node.store.table(&name).map_err(|_| {
            status(Error::Unavailable(format!(
                "table {} is not known here yet (the catalog mirror follows etcd)",
                req.table
            )))
        })?;
        let range = basalt_model::RowRange {
            start: req.start_key,
            end: (!req.end_key.is_empty()).then_some(req.end_key),
        };
        let max = match req.max_bytes {
            0 => SEED_MAX_BYTES,
            n => n.min(SEED_MAX_BYTES),
        } as usize;
        let store = self.node.store.clone();
        let chunk = tokio::task::spawn_blocking(move || store.seed_chunk(&schema, &range, max))
            .await
            .map_err(|e| Status::internal(format!("seed read task failed: {e}")))?
            .map_err(|e| status(Error::from(e)))?;
        Ok(Response::new(ReadSeedResponse {
            rows: chunk
                .rows
                .iter()
                .map(|r| super::encode_row(r.first, &r.row))
                .collect(),
            bytes: chunk.bytes,
            resume_key: chunk.resume,
        }))
    }
}
