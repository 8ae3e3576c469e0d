//! Table administration in cluster mode: the schemas live in the instance's catalog in etcd
//! (one truth for every server); each change is an etcd transaction, and the call returns once
//! this server's own copy of the catalog shows it, so the caller can use the table through
//! this server at once (and through any other as soon as it has caught up, normally within
//! milliseconds).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use basalt_model::hlc::now_micros;
use basalt_model::{FamilyChange, FamilySchema, TableSchema};
use googleapis_tonic_google_bigtable_admin_v2::google::bigtable::admin::v2 as admin;
use tonic::Request;

use super::Node;
use super::frontend::FORWARDED;
use crate::error::{Error, Refusal, Result, refusal};

/// How long a schema change waits for this server's copy of the catalog (and a new table for
/// its tablets to be assigned) before returning anyway.
const VISIBLE_WITHIN: Duration = Duration::from_secs(10);

/// NOT_FOUND unless `instance` is this cluster's (as Bigtable answers for another instance).
pub fn check_instance(node: &Node, instance: &str) -> Result<()> {
    if instance != node.config.instance_name() {
        return Err(Error::NotFound(format!("instance {instance} not found")));
    }
    Ok(())
}

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
    let Ok((instance, table)) = basalt_model::schema::parse_table_name(table_name) else {
        return;
    };
    if instance != node.config.instance_name() {
        return;
    }
    if let Ok(Some(stored)) = node.meta.table(table).await
        && stored.schema.name == table_name
    {
        node.routing
            .wait_for_revision(stored.mod_revision, Duration::from_secs(5))
            .await;
    }
}

pub async fn create_table(
    node: &Node,
    name: &str,
    families: BTreeMap<String, FamilySchema>,
    splits: Vec<Vec<u8>>,
    deletion_protection: bool,
) -> Result<Arc<TableSchema>> {
    let schema = TableSchema {
        id: 0,
        name: name.to_string(),
        families,
        dropped_families: BTreeMap::new(),
        deletion_protection,
        splits,
        created_micros: now_micros(),
    };
    let stored = node.meta.create_table(schema).await?;
    node.routing
        .wait_for_revision(stored.mod_revision, VISIBLE_WITHIN)
        .await;
    // Usable at once: wait (bounded) for the master to assign the tablets in this cluster.
    let id = table_id(name).to_string();
    let deadline = tokio::time::Instant::now() + VISIBLE_WITHIN;
    while node.routing.state().map.tablets(&id).is_empty() && tokio::time::Instant::now() < deadline
    {
        node.routing.changed(Duration::from_millis(200)).await;
    }
    Ok(node
        .store
        .table(name)
        .unwrap_or_else(|_| Arc::new(stored.schema)))
}

async fn updated(node: &Node, stored: basalt_meta::StoredSchema) -> Arc<TableSchema> {
    node.routing
        .wait_for_revision(stored.mod_revision, VISIBLE_WITHIN)
        .await;
    match node.store.table(&stored.schema.name) {
        Ok(s) if *s == stored.schema => s,
        _ => Arc::new(stored.schema),
    }
}

pub async fn set_deletion_protection(
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

pub async fn modify_column_families(
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

pub async fn delete_table(node: &Node, name: &str) -> Result<()> {
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
        node.routing.changed(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// DropRowRange: every server of the cluster drops the rows it holds (a forwarded request
/// only its own). A server refuses while a tablet of the range is fenced for a move (see
/// `basalt_storage::fences`); the frontend then drops again everywhere once the map changed —
/// the move's destination too, which may have dropped its rows before it took the snapshot's
/// copy. Dropping is idempotent.
pub async fn drop_row_range(
    node: &Node,
    req: admin::DropRowRangeRequest,
    prefix: Option<bytes::Bytes>,
    hop: bool,
) -> Result<()> {
    let deadline = tokio::time::Instant::now() + DROP_RETRY_FOR;
    loop {
        let planned = node.routing.state().revision;
        match drop_everywhere(node, &req, prefix.clone(), hop).await {
            Err(e @ (Error::Moving { .. } | Error::NotOwner { .. }))
                if !hop && tokio::time::Instant::now() < deadline =>
            {
                tracing::debug!(error = %e, "DropRowRange meets a moving tablet: again");
                node.routing
                    .newer_than(planned, Duration::from_millis(200))
                    .await;
            }
            other => return other,
        }
    }
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
    let state = node.routing.state();
    for (id, server) in &state.servers {
        if id == node.routing.me() {
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

/// etcd's NOT_FOUND names the table id; clients see the full name, as from a standalone server.
fn not_found_by_name(e: Error, name: &str) -> Error {
    match e {
        Error::NotFound(_) => Error::NotFound(format!("table {name} not found")),
        e => e,
    }
}
