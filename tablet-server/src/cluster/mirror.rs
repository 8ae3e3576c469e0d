//! The catalog mirror: keeps this server's copy of the instance's catalog (the schemas, in its
//! store) and its view of the cluster's tablet map
//! ([`TabletRouter`](super::tablet_router::TabletRouter)) in step with etcd, and ends the
//! moves etcd no longer lists.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use super::moves::reconcile::reconcile;
use super::node::Node;
use super::tablet_router::ClusterState;

/// Follows etcd from now on (until the process ends).
pub fn spawn(node: Arc<Node>) {
    tokio::spawn(follow(node));
}

/// Keeps the store's catalog and the tablet map in step with etcd: a full read, then a
/// watch of the instance's prefix; every batch of events triggers another full read (small:
/// schemas, one cluster's tablets and servers). A read every few seconds anyway, in case a
/// watch silently stalls.
async fn follow(node: Arc<Node>) {
    loop {
        let revision = match sync(&node).await {
            Ok(revision) => revision,
            Err(e) => {
                warn!(error = %e, "cannot read the catalog and tablet map; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let mut stream = match node
            .meta
            .watch(node.meta.keys().prefix(), revision + 1)
            .await
        {
            Ok(stream) => stream,
            Err(e) => {
                warn!(error = %e, "cannot watch the coordination store; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        // Until the watch ends (etcd restarted, the stream broke): then read and watch again.
        while let Ok(Ok(Some(_))) | Err(_) =
            tokio::time::timeout(Duration::from_secs(5), stream.message()).await
        {
            if let Err(e) = sync(&node).await {
                warn!(error = %e, "cannot read the catalog and tablet map");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
            // Moves whose record is gone (committed, aborted, or their master died) end here.
            // The map is read after the records: a move missing from them that committed
            // shows its new owner in it.
            let since = std::time::Instant::now();
            if let Ok(records) = node.meta.moves(&node.config.cluster).await
                && let Ok((fresh, _)) = node.meta.tablets(&node.config.cluster).await
            {
                reconcile(&node, &records, &fresh, since).await;
            }
        }
    }
}

/// One full read: installs changed schemas, removes deleted tables, publishes the tablet map
/// and the registered servers. Returns the revision read.
async fn sync(node: &Node) -> basalt_model::Result<i64> {
    let (schemas, revision) = node.meta.tables().await?;
    let (map, tablets_revision) = node.meta.tablets(&node.config.cluster).await?;
    let instance = node.config.instance_name();
    let store = node.store.clone();
    // This server's copy of a table takes its splits from the cluster's tablet map (after
    // splits they are no longer the table's initial ones): requests are counted, samples cut
    // and tablets reported by the tablets that exist.
    let wanted: HashMap<String, basalt_model::TableSchema> = schemas
        .into_iter()
        .filter(|s| s.schema.name.starts_with(&format!("{instance}/tables/")))
        .map(|s| {
            let mut schema = s.schema;
            let tablets = map.tablets(basalt_meta::table_id(&schema.name));
            if !tablets.is_empty() {
                schema.splits = tablets
                    .iter()
                    .skip(1)
                    .map(|t| t.range.start.to_vec())
                    .collect();
            }
            (schema.name.clone(), schema)
        })
        .collect();
    // The ranges this server owns by the map: served here even if they were moved away and
    // released before (a tablet back after a move, or reassigned after an accepted loss). The
    // map is published after this, so the router never sends a request to a range the
    // store still refuses.
    let me = node.router.me().to_string();
    let owned: Vec<(String, basalt_model::RowRange)> = map
        .owned_by(&me)
        .filter(|t| t.state == basalt_model::TabletState::Serving)
        .map(|t| (format!("{instance}/tables/{}", t.table), t.range.clone()))
        .collect();
    tokio::task::spawn_blocking(move || -> basalt_model::Result<()> {
        for schema in wanted.values() {
            let current = store.table(&schema.name).ok();
            if current.as_deref() != Some(schema) {
                store.install_schema(schema.clone())?;
            }
        }
        for (name, range) in &owned {
            if let Ok(table) = store.table(name)
                && store.serve(&table, range)
            {
                info!(
                    table = name,
                    ?range,
                    "serving a range this server had moved away"
                );
            }
        }
        for table in store.list_tables(&instance) {
            if !wanted.contains_key(&table.name) {
                info!(table = table.name, "table deleted: removing its data");
                store.remove_table(&table.name)?;
            }
        }
        Ok(())
    })
    .await
    .map_err(|e| basalt_model::Error::Internal(e.to_string()))??;
    let (servers, servers_revision) = node.meta.servers(Some(&node.config.cluster)).await?;
    let servers = servers
        .into_iter()
        .map(|r| (r.record.store_id.clone(), r.record))
        .collect();
    let revision = revision.min(tablets_revision).min(servers_revision);
    node.router.publish(ClusterState {
        map,
        servers,
        revision,
    });
    Ok(revision)
}
