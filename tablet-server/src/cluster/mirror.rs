//! The catalog mirror: keeps this server's copy of the instance's catalog (the schemas, in its
//! store) and its view of the cluster's tablet map
//! ([`TabletRouter`](super::tablet_router::TabletRouter)) in step with etcd, and ends the
//! moves etcd no longer lists.
//!
//! One full read at start (and whenever the watch breaks), then the watch of the instance's
//! prefix: the tablet records each response changes are applied to the map in place
//! ([`TabletFollower`]), and only what else changed is read again — the schemas after a
//! schema changed, the registrations after one changed. A million-tablet map is read once,
//! not once per change (docs/scale.md).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use basalt_meta::{Followed, ServerRecord, StoredSchema, TabletFollower, WatchEvent};
use basalt_model::{ServerId, TabletMap};
use tracing::{info, warn};

use super::moves::reconcile::reconcile;
use super::node::Node;
use super::tablet_router::ClusterState;

/// How long a quiet watch waits before it asks etcd for a progress notice; as long again
/// without any answer and the watch is taken as stalled: read everything and watch again.
const QUIET: Duration = Duration::from_secs(5);

/// Follows etcd from now on (until the process ends).
pub fn spawn(node: Arc<Node>) {
    tokio::spawn(follow(node));
}

/// What this server last read or followed.
struct Mirror {
    follower: TabletFollower,
    schemas: Vec<StoredSchema>,
    servers: HashMap<ServerId, ServerRecord>,
}

async fn follow(node: Arc<Node>) {
    loop {
        let mut mirror = match Mirror::read(&node).await {
            Ok(mirror) => mirror,
            Err(e) => {
                warn!(error = %e, "cannot read the catalog and tablet map; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let mut stream = match node
            .meta
            .watch(node.meta.keys().prefix(), mirror.follower.revision() + 1)
            .await
        {
            Ok(stream) => stream,
            Err(e) => {
                warn!(error = %e, "cannot watch the coordination store; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        // Until the watch ends (etcd restarted, the stream broke, history compacted away, no
        // answer to a progress request), or a change does not fit: then read and watch again.
        let mut asked = false;
        loop {
            let resp = match tokio::time::timeout(QUIET, stream.message()).await {
                Err(_) if !asked => {
                    // Quiet: is the watch still there? Its answer also moves the revision on.
                    asked = stream.request_progress().await.is_ok();
                    reconcile(&node).await;
                    if asked {
                        continue;
                    }
                    break;
                }
                Err(_) => {
                    warn!("the watch of the coordination store stalled: reading everything again");
                    break;
                }
                Ok(Ok(Some(resp))) => resp,
                Ok(Ok(None)) | Ok(Err(_)) => break,
            };
            asked = false;
            if resp.canceled() || resp.compact_revision() > 0 {
                break;
            }
            if resp.events().is_empty() {
                // A progress notice: nothing under the prefix changed up to its revision.
                // (The first answer, "created", says nothing about revisions.)
                if !resp.created()
                    && let Some(header) = resp.header()
                {
                    mirror.follower.advance(header.revision());
                    mirror.publish(&node);
                }
                continue;
            }
            match mirror.apply(&node, resp.events()).await {
                Ok(moves) => {
                    if moves {
                        // Moves whose record is gone (committed, aborted, or their master
                        // died) end here.
                        reconcile(&node).await;
                    }
                }
                Err(e) => {
                    warn!(error = %e, "cannot follow the catalog and tablet map: reading everything again");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    break;
                }
            }
        }
    }
}

impl Mirror {
    /// Everything read again: the map first (the watch starts after its revision; the
    /// schemas and registrations, read after it, are read again when their events replay).
    async fn read(node: &Node) -> basalt_model::Result<Mirror> {
        let snapshot = node.meta.tablet_snapshot(&node.config.cluster).await?;
        let follower =
            TabletFollower::new(node.meta.keys().clone(), &node.config.cluster, snapshot);
        let (schemas, _) = node.meta.tables().await?;
        let mut mirror = Mirror {
            follower,
            schemas,
            servers: HashMap::new(),
        };
        mirror.read_servers(node).await?;
        sync_store(node, &mirror.schemas, mirror.follower.map(), None).await?;
        mirror.publish(node);
        Ok(mirror)
    }

    async fn read_servers(&mut self, node: &Node) -> basalt_model::Result<()> {
        let (servers, _) = node.meta.servers(Some(&node.config.cluster)).await?;
        self.servers = servers
            .into_iter()
            .map(|r| (r.record.store_id.clone(), r.record))
            .collect();
        Ok(())
    }

    /// One watch response: the map's changes applied, what else changed read again, the
    /// store brought in step. True if a move record changed.
    async fn apply(&mut self, node: &Node, events: &[WatchEvent]) -> basalt_model::Result<bool> {
        let followed = self.follower.apply(events)?;
        self.follower.read_whole(&node.meta, &followed).await?;
        let Followed {
            mut tables,
            to_read,
            schemas,
            servers,
            moves,
            ..
        } = followed;
        tables.extend(to_read);
        if schemas {
            self.schemas = node.meta.tables().await?.0;
        }
        if servers {
            self.read_servers(node).await?;
        }
        if schemas {
            sync_store(node, &self.schemas, self.follower.map(), None).await?;
        } else if !tables.is_empty() {
            sync_store(node, &self.schemas, self.follower.map(), Some(&tables)).await?;
        }
        self.publish(node);
        Ok(moves)
    }

    fn publish(&self, node: &Node) {
        node.router.publish(ClusterState {
            map: self.follower.map().clone(),
            servers: self.servers.clone(),
            revision: self.follower.revision(),
        });
    }
}

/// Brings the store in step with the catalog and the map, for every table or only `tables`
/// (ids): installs changed schemas, serves the ranges the map gives this server, and (every
/// table) removes deleted tables. Before the map is published, so that the router never
/// sends a request to a range the store still refuses.
async fn sync_store(
    node: &Node,
    schemas: &[StoredSchema],
    map: &TabletMap,
    tables: Option<&BTreeSet<String>>,
) -> basalt_model::Result<()> {
    let instance = node.config.instance_name();
    let store = node.store.clone();
    let only = |id: &str| tables.is_none_or(|t| t.contains(id));
    // This server's copy of a table takes its splits from the cluster's tablet map (after
    // splits they are no longer the table's initial ones): requests are counted, samples cut
    // and tablets reported by the tablets that exist.
    let prefix = format!("{instance}/tables/");
    let wanted: HashMap<String, basalt_model::TableSchema> = schemas
        .iter()
        .filter(|s| s.schema.name.starts_with(&prefix))
        .filter(|s| only(basalt_meta::table_id(&s.schema.name)))
        .map(|s| {
            let mut schema = s.schema.clone();
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
    // released before (a tablet back after a move, or reassigned after an accepted loss).
    let me = node.router.me().to_string();
    let owned: Vec<(String, basalt_model::RowRange)> = match tables {
        None => map.owned_by(&me).collect::<Vec<_>>(),
        Some(tables) => tables
            .iter()
            .flat_map(|t| map.tablets(t))
            .filter(|t| t.owner == me)
            .collect(),
    }
    .into_iter()
    .filter(|t| t.state == basalt_model::TabletState::Serving)
    .map(|t| (format!("{prefix}{}", t.table), t.range.clone()))
    .collect();
    let remove_deleted = tables.is_none();
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
        if remove_deleted {
            for table in store.list_tables(&instance) {
                if !wanted.contains_key(&table.name) {
                    info!(table = table.name, "table deleted: removing its data");
                    store.remove_table(&table.name)?;
                }
            }
        }
        Ok(())
    })
    .await
    .map_err(|e| basalt_model::Error::Internal(e.to_string()))?
}
