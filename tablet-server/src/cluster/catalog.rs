//! Table administration in cluster mode: the schemas live in the instance's catalog in etcd
//! (one truth for every server); each change is an etcd transaction, and the call returns once
//! this server's own copy of the catalog shows it, so the caller can use the table through
//! this server at once (and through any other as soon as it has caught up, normally within
//! milliseconds). [`EtcdCatalog`] is the admin API's [`Catalog`] in cluster mode; the
//! frontend and the move service find a request's table with [`table`].

use std::sync::Arc;
use std::time::Duration;

use basalt_model::hlc::now_micros;
use basalt_model::{FamilyChange, TableSchema};
use googleapis_tonic_google_bigtable_admin_v2::google::bigtable::admin::v2 as admin;
use tonic::Request;

use crate::catalog::{Catalog, ConsistencyMode};
use crate::cluster::forwarding::{FORWARDED, FROM_PEER_CLUSTER, Reach, Reply, ask_cluster};
use crate::cluster::node::Node;
use crate::error::{Error, Refusal, Result, refusal};

/// How long a schema change waits for this server's copy of the catalog (and a new table for
/// its tablets to be assigned) before returning anyway.
const VISIBLE_WITHIN: Duration = Duration::from_secs(10);

fn table_id(name: &str) -> &str {
    basalt_meta::table_id(name)
}

/// A table created through another server may not be in this server's copy of the catalog
/// yet (its etcd watch follows within milliseconds): when etcd has the table, wait (bounded)
/// until the copy shows it, so that a table created through any server is usable through
/// every server at once. Nothing happens for a table this server knows, or one etcd does not.
pub async fn catch_up(node: &Node, table_name: &str) {
    if node.store.table(table_name).is_ok() {
        return;
    }
    catch_up_now(node, table_name).await;
}

/// The schema of `table_name` in this server's copy of the catalog, once caught up with etcd
/// (see [`catch_up`]): one lookup when the copy has it. A copy that shows a restore still
/// filling the table is caught up too: the restore may have ended through another server a
/// moment ago (its operation done), and the table serves from then on through every server.
pub async fn table(node: &Node, table_name: &str) -> Result<Arc<TableSchema>> {
    if let Ok(schema) = node.store.table(table_name)
        && schema.restoring().is_none()
    {
        return Ok(schema);
    }
    catch_up_now(node, table_name).await;
    Ok(node.store.table(table_name)?)
}

/// Waits (bounded) until this server's copy of the catalog shows `table_name` as etcd has it
/// now ([`catch_up`] for a table the copy does not have).
async fn catch_up_now(node: &Node, table_name: &str) {
    let Ok((instance, table)) = basalt_model::schema::parse_table_name(table_name) else {
        return;
    };
    if instance != node.config.instance_name() {
        return;
    }
    if let Ok(Some(stored)) = node.meta.table(table).await
        && stored.schema.name == table_name
    {
        node.router
            .wait_for_revision(stored.mod_revision, Duration::from_secs(5))
            .await;
    }
}

async fn create_table(node: &Node, mut schema: TableSchema) -> Result<Arc<TableSchema>> {
    schema.created_micros = now_micros();
    let name = schema.name.clone();
    let name = name.as_str();
    let stored = node.meta.create_table(schema).await?;
    node.router
        .wait_for_revision(stored.mod_revision, VISIBLE_WITHIN)
        .await;
    // Usable at once: wait (bounded) for the master to assign the tablets in this cluster.
    let id = table_id(name).to_string();
    let deadline = tokio::time::Instant::now() + VISIBLE_WITHIN;
    while node.router.state().map.tablets(&id).is_empty() && tokio::time::Instant::now() < deadline
    {
        node.router.changed(Duration::from_millis(200)).await;
    }
    Ok(node
        .store
        .table(name)
        .unwrap_or_else(|_| Arc::new(stored.schema)))
}

async fn updated(node: &Node, stored: basalt_meta::StoredSchema) -> Arc<TableSchema> {
    node.router
        .wait_for_revision(stored.mod_revision, VISIBLE_WITHIN)
        .await;
    match node.store.table(&stored.schema.name) {
        Ok(s) if *s == stored.schema => s,
        _ => Arc::new(stored.schema),
    }
}

async fn set_deletion_protection(
    node: &Node,
    name: &str,
    protect: bool,
) -> Result<Arc<TableSchema>> {
    let stored = node
        .meta
        .update_table(table_id(name), |s| {
            let mut s = s.clone();
            s.deletion_protection = protect;
            Ok(s)
        })
        .await
        .map_err(|e| not_found_by_name(e, name))?;
    Ok(updated(node, stored).await)
}

async fn modify_column_families(
    node: &Node,
    name: &str,
    changes: &[FamilyChange],
) -> Result<Arc<TableSchema>> {
    let store = node.store.clone();
    let stored = node
        .meta
        .update_table(table_id(name), |s| {
            s.with_family_changes(changes, || store.allocate_version())
        })
        .await
        .map_err(|e| not_found_by_name(e, name))?;
    Ok(updated(node, stored).await)
}

async fn delete_table(node: &Node, name: &str) -> Result<()> {
    node.meta
        .delete_table(table_id(name), |s| {
            if s.deletion_protection {
                return Err(Error::FailedPrecondition(format!(
                    "table {name} is protected against deletion; disable deletion_protection first"
                )));
            }
            Ok(())
        })
        .await
        .map_err(|e| not_found_by_name(e, name))?;
    let deadline = tokio::time::Instant::now() + VISIBLE_WITHIN;
    while node.store.table(name).is_ok() && tokio::time::Instant::now() < deadline {
        node.router.changed(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// DropRowRange: every server of the cluster drops the rows it holds (a forwarded request
/// only its own). A server refuses while a tablet of the range is fenced for a move (see
/// `basalt_storage::fences`); the frontend then drops again everywhere once the map changed —
/// the move's destination too, which may have dropped its rows before it took the snapshot's
/// copy. Dropping is idempotent.
async fn drop_row_range(
    node: &Node,
    req: admin::DropRowRangeRequest,
    prefix: Option<bytes::Bytes>,
    reach: Reach,
) -> Result<()> {
    let hop = reach == Reach::Server;
    let deadline = tokio::time::Instant::now() + DROP_RETRY_FOR;
    loop {
        let planned = node.router.state().revision;
        match drop_everywhere(node, &req, prefix.clone(), hop).await {
            Err(e @ (Error::Moving { .. } | Error::NotOwner { .. }))
                if !hop && tokio::time::Instant::now() < deadline =>
            {
                tracing::debug!(error = %e, "DropRowRange meets a moving tablet: again");
                node.router
                    .newer_than(planned, Duration::from_millis(200))
                    .await;
            }
            Err(e) => return Err(e),
            Ok(()) => break,
        }
    }
    if reach == Reach::Instance {
        drop_in_other_clusters(node, &req).await?;
    }
    Ok(())
}

/// A client's DropRowRange reaches every cluster of the instance: one server of each other
/// cluster, reached where the other clusters reach it ([`basalt_meta::Meta::peer_addresses`]),
/// carries it out in its cluster.
async fn drop_in_other_clusters(node: &Node, req: &admin::DropRowRangeRequest) -> Result<()> {
    let peers: Vec<String> = node
        .replicas
        .read()
        .iter()
        .filter(|c| **c != node.config.cluster)
        .cloned()
        .collect();
    for peer in peers {
        let answered = ask_cluster(node, &peer, |address| async move {
            let channel = match node.dialer.channel(&address) {
                Ok(channel) => channel,
                Err(e) => return Reply::Next(format!("cannot dial {address}: {e}")),
            };
            let mut client =
                admin::bigtable_table_admin_client::BigtableTableAdminClient::new(channel);
            let mut request = Request::new(req.clone());
            request.metadata_mut().insert(
                FORWARDED,
                tonic::metadata::MetadataValue::from_static(FROM_PEER_CLUSTER),
            );
            match client.drop_row_range(request).await {
                Ok(_) => Reply::Answered(()),
                Err(s) => Reply::Next(format!("{address}: {}", s.message())),
            }
        })
        .await?;
        if let Err(last) = answered {
            return Err(Error::Unavailable(format!(
                "the rows were dropped in cluster {} but not yet in cluster {peer} ({last}); send the request again",
                node.config.cluster
            )));
        }
    }
    Ok(())
}

/// How long a DropRowRange waits for the moves of its range to end.
const DROP_RETRY_FOR: Duration = Duration::from_secs(20);

async fn drop_everywhere(
    node: &Node,
    req: &admin::DropRowRangeRequest,
    prefix: Option<bytes::Bytes>,
    hop: bool,
) -> Result<()> {
    let store = node.store.clone();
    let name = req.name.clone();
    tokio::task::spawn_blocking(move || store.drop_row_range(&name, prefix.as_deref()))
        .await
        .map_err(|e| Error::Internal(e.to_string()))??;
    if hop {
        return Ok(());
    }
    let state = node.router.state();
    for (id, server) in &state.servers {
        if id == node.router.me() {
            continue;
        }
        // A server that cannot be reached fails the call below (UNAVAILABLE).
        let channel = node.dialer.channel(&server.address).map_err(|e| {
            Error::Internal(format!(
                "cannot dial server {} to drop its rows: {e}",
                server.name
            ))
        })?;
        let mut client = admin::bigtable_table_admin_client::BigtableTableAdminClient::new(channel);
        let mut request = Request::new(req.clone());
        request
            .metadata_mut()
            .insert(FORWARDED, tonic::metadata::MetadataValue::from_static("1"));
        client.drop_row_range(request).await.map_err(|s| {
            if refusal(&s) == Some(Refusal::Moving) {
                Error::Moving {
                    tablet: format!("of table {} on server {}", req.name, server.name),
                }
            } else {
                Error::Unavailable(format!(
                    "server {} could not drop its rows: {}",
                    server.name,
                    s.message()
                ))
            }
        })?;
    }
    Ok(())
}

/// The instance's catalog in etcd, as the admin API's [`Catalog`] in cluster mode.
pub struct EtcdCatalog {
    node: Arc<Node>,
}

impl EtcdCatalog {
    pub fn new(node: Arc<Node>) -> EtcdCatalog {
        EtcdCatalog { node }
    }
}

#[tonic::async_trait]
impl Catalog for EtcdCatalog {
    /// NOT_FOUND unless `instance` is this cluster's (as Bigtable answers for another
    /// instance).
    fn check_instance(&self, instance: &str) -> Result<()> {
        if instance != self.node.config.instance_name() {
            return Err(Error::NotFound(format!("instance {instance} not found")));
        }
        Ok(())
    }

    async fn catch_up(&self, table_name: &str) {
        catch_up(&self.node, table_name).await;
    }

    async fn create_table(&self, schema: TableSchema) -> Result<Arc<TableSchema>> {
        create_table(&self.node, schema).await
    }

    async fn finish_restore(&self, name: &str, id: u64, operation: &str) -> Result<()> {
        let stored = self
            .node
            .meta
            .update_table(table_id(name), |s| {
                if s.id != id {
                    return Err(Error::NotFound(format!(
                        "table {name} was deleted during its restore"
                    )));
                }
                if s.restoring() != Some(operation) {
                    return Err(Error::FailedPrecondition(format!(
                        "table {name} is not being restored by {operation}"
                    )));
                }
                let mut s = s.clone();
                if let Some(r) = s.restore.as_mut() {
                    r.operation = None;
                }
                Ok(s)
            })
            .await
            .map_err(|e| not_found_by_name(e, name))?;
        updated(&self.node, stored).await;
        Ok(())
    }

    async fn delete_unfinished_restore(
        &self,
        name: &str,
        id: u64,
        operation: &str,
    ) -> Result<bool> {
        // The check runs in the deletion's transaction (on the schema's revision): a restore
        // that ended meanwhile changed the schema, so its table stays.
        let gone = self
            .node
            .meta
            .delete_table(table_id(name), |s| {
                if s.id == id && s.restoring() == Some(operation) {
                    Ok(())
                } else {
                    Err(Error::FailedPrecondition(
                        "not the abandoned restore's table".into(),
                    ))
                }
            })
            .await;
        match gone {
            Ok(()) => {}
            Err(Error::FailedPrecondition(_) | Error::NotFound(_)) => {
                return Ok(false);
            }
            Err(e) => return Err(e),
        }
        let deadline = tokio::time::Instant::now() + VISIBLE_WITHIN;
        while self.node.store.table(name).is_ok() && tokio::time::Instant::now() < deadline {
            self.node.router.changed(Duration::from_millis(200)).await;
        }
        Ok(true)
    }

    async fn set_deletion_protection(&self, name: &str, protect: bool) -> Result<Arc<TableSchema>> {
        set_deletion_protection(&self.node, name, protect).await
    }

    async fn modify_column_families(
        &self,
        name: &str,
        changes: &[FamilyChange],
    ) -> Result<Arc<TableSchema>> {
        modify_column_families(&self.node, name, changes).await
    }

    async fn delete_table(&self, name: &str) -> Result<()> {
        delete_table(&self.node, name).await
    }

    async fn iam_policy(
        &self,
        _instance: &str,
        table: Option<&str>,
    ) -> Result<Option<basalt_model::iam::Policy>> {
        Ok(self.node.meta.iam_policy(table.map(table_id)).await?)
    }

    async fn set_iam_policy(
        &self,
        _instance: &str,
        table: Option<&str>,
        new: basalt_model::iam::Policy,
    ) -> Result<std::result::Result<basalt_model::iam::Policy, basalt_model::iam::PolicyError>>
    {
        let name = table.unwrap_or_default();
        self.node
            .meta
            .update_iam_policy(table.map(table_id), |current| {
                basalt_model::iam::replace(current, new.clone())
            })
            .await
            .map_err(|e| not_found_by_name(e, name))
    }

    /// Every server of the cluster drops the rows it holds, once this server knows the table;
    /// then (a client's request) every other cluster of the instance does.
    async fn drop_row_range(
        &self,
        request: &admin::DropRowRangeRequest,
        prefix: Option<bytes::Bytes>,
        reach: Reach,
    ) -> Result<()> {
        table(&self.node, &request.name).await?;
        drop_row_range(&self.node, request.clone(), prefix, reach).await
    }

    fn replicas(&self) -> Vec<String> {
        self.node.replicas.read().clone()
    }

    fn initializing(&self, table: &TableSchema) -> Vec<String> {
        let id = basalt_control::table_id(&table.name);
        self.node
            .seeding
            .read()
            .values()
            .filter(|s| s.covers(id))
            .map(|s| s.cluster.clone())
            .collect()
    }

    /// Covers every server of every cluster (see `super::replication::tokens`).
    async fn consistency_token(&self, table: &TableSchema) -> Result<String> {
        super::replication::tokens::generate(&self.node, basalt_control::table_id(&table.name))
            .await
    }

    async fn check_consistency(
        &self,
        table: &TableSchema,
        token: &str,
        mode: ConsistencyMode,
    ) -> Result<Option<bool>> {
        let Some(token) = super::replication::tokens::Token::decode(token) else {
            return Ok(None);
        };
        if token.table != basalt_control::table_id(&table.name) {
            return Ok(None);
        }
        super::replication::tokens::check(&self.node, &token, mode)
            .await
            .map(Some)
    }
}

/// etcd's NOT_FOUND names the table id; clients see the full name, as from a standalone server.
fn not_found_by_name(e: Error, name: &str) -> Error {
    match e {
        Error::NotFound(_) => Error::NotFound(format!("table {name} not found")),
        e => e,
    }
}
