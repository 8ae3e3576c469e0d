//! A server's own end of moves whose record is gone from etcd ([`reconcile`]): a master that
//! died mid-move never leaves a tablet fenced.

use std::sync::Arc;
use std::time::Instant;

use basalt_control::TabletMove;
use basalt_control::v1::{MoveSpec, ReleaseTabletRequest};
use basalt_model::TabletState;
use tonic::Request;
use tracing::warn;

use super::service::MoveService;
use crate::cluster::node::Node;

/// Ends, on this server, the moves etcd no longer lists (read now): their master committed
/// or aborted them, or died and its successor aborted them. A source whose tablet now has
/// another owner at a later epoch releases it (deletes the rows); one whose tablet is still
/// its own, serving, unfences. A destination drops its copy unless it owns the tablet. The
/// tablets of a move's table are read after its record was seen gone (a move that committed
/// shows its new owner in them). Nothing is read when this server takes part in no move.
pub async fn reconcile(node: &Arc<Node>) {
    if !node.moves.any() {
        return;
    }
    let since = Instant::now();
    let Ok(records) = node.meta.moves(&node.config.cluster).await else {
        return;
    };
    let orphans = node.moves.orphans(&records, since);
    if orphans.is_empty() {
        return;
    }
    let service = MoveService::new(node.clone());
    let me = node.router.me().to_string();
    for id in orphans {
        let source = node.moves.sources.lock().get(&id).cloned();
        let table = match &source {
            Some(m) => Some(m.table.name.clone()),
            None => (node.moves.destinations.lock().get(&id)).map(|m| m.table.name.clone()),
        };
        let Some(fresh) = (match &table {
            Some(name) => super::service::table_now(node, basalt_meta::table_id(name)).await,
            None => None,
        }) else {
            warn!(
                move_id = id,
                "cannot read the tablets of a move's table: its end waits for the next change"
            );
            continue;
        };
        if let Some(m) = source {
            let now = fresh.iter().find(|t| t.range == m.tablet.range).cloned();
            match now {
                Some(t) if t.owner != me && t.epoch > m.tablet.epoch => {
                    // Its own task: the release waits for this server's map to show the new
                    // owner, and this loop is what updates that map.
                    let spec = MoveSpec::of(&id, &m.table.name, &m.tablet);
                    let service = service.clone();
                    tokio::spawn(async move {
                        let _ = service
                            .release_tablet(Request::new(ReleaseTabletRequest {
                                r#move: Some(spec),
                            }))
                            .await;
                    });
                }
                Some(t)
                    if t.owner == me
                        && t.epoch == m.tablet.epoch
                        && t.state == TabletState::Serving =>
                {
                    warn!(move_id = id, "the move's record is gone: aborting it here");
                    service.abort_source(&id).await;
                }
                other => {
                    warn!(move_id = id, tablet = ?other, "a move's record is gone but its tablet is in neither state: keeping it fenced");
                }
            }
        }
        if let Err(e) = service.abort_destination(&id, Some(&fresh)).await {
            warn!(move_id = id, error = %e.message(), "cannot drop a copied tablet");
        }
    }
}
