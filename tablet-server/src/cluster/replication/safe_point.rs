//! The replication safe point of this server's store: the clock value below which no write of
//! another cluster can still arrive here, so that compaction may collect the tombstones below
//! it (`basalt_storage::safe_point`; `docs/replication.md`, "Deletes and tombstones").
//!
//! A tombstone hides the older writes of its scope. If it went while a peer still had such a
//! write on its way (a partition, a slow or stopped shipper), that write would be applied here
//! when it arrives, and hidden in every cluster that kept the delete: the clusters would differ
//! for good. So the safe point is the lowest `acked_hlc` that the servers of the other
//! clusters report in `shipped/<store>/<this cluster>`: each is a clock value below which
//! this cluster holds every write of that server (its log watermark, acknowledged). Every
//! server of every other cluster counts:
//!
//! * a registered server, and a server that is not registered but owns tablets that are not
//!   Lost (restarting, or down): with its record's `acked_hlc`, or 0 with no record (it may
//!   have logged writes it never reported);
//! * a server that is not registered and owns no tablet (drained by a scale-in, or its data
//!   lost): it takes no write any more; it counts only if its last report says writes were
//!   still waiting. (A Lost server's records are deleted with its data.)
//!
//! **Seeding.** While a cluster is being seeded (a `seeds/` record), no tombstone is collected
//! anywhere. The copy is the only carrier of the deletes made before the logs turned on for
//! the new cluster, while an older write of a third cluster may reach the new cluster through a
//! log: the source's tombstone must still be there when the copy reads its row, and any
//! `READY` cluster may become the source. The records are read *before* the seeds: a report
//! that lets the safe point pass a tombstone was written after the reporting server saw the
//! new cluster, so the seed record is seen too (etcd reads are linearizable).
//!
//! **Stale peers.** The safe point is never more than the change log's retention (7 days by
//! default, `--change-log-retention-secs`) behind the clock. A peer that has not acknowledged
//! for that long is stale: the log no longer waits for it and it is marked for a re-seed
//! (`shipper`); its own reports no longer hold tombstones, but its seed record does (above),
//! so the copy carries the deletes it missed from then on.
//!
//! The grace (`--tombstone-grace-secs`) still applies on top: within one cluster a tablet move
//! replays the source's log on the destination, and the grace covers it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use basalt_meta::ShippedRecord;
use basalt_model::Result;
use basalt_model::hlc::now_micros;

use super::tokens::unregistered_owners;
use crate::cluster::Node;

/// How often the safe point is computed from etcd.
pub const SAFE_POINT_EVERY: Duration = Duration::from_secs(3);

/// What the safe point of cluster `mine` is computed from, as read from etcd.
#[derive(Debug, Clone, Copy)]
pub struct Reports<'a> {
    /// Every server's progress towards every peer cluster (`shipped/`).
    pub shipped: &'a [ShippedRecord],
    /// Whether a cluster is being seeded (`seeds/`).
    pub seeding: bool,
    /// The clusters of the instance (those with a number), this one included.
    pub clusters: &'a BTreeSet<String>,
    /// The registered servers: store id → cluster.
    pub registered: &'a BTreeMap<String, String>,
    /// The servers that are not registered but own tablets that are not Lost: (cluster, store).
    pub down_owners: &'a BTreeSet<(String, String)>,
}

/// The safe point of cluster `mine` at `now` (see the module docs): None when no other cluster
/// replicates (the grace alone decides), else the clock value below which tombstones may go.
/// Pure.
pub fn safe_point(mine: &str, reports: &Reports, now: u64, retention: Duration) -> Option<u64> {
    let peers: BTreeSet<&str> = reports
        .clusters
        .iter()
        .map(String::as_str)
        .filter(|c| *c != mine)
        .collect();
    if peers.is_empty() {
        return None;
    }
    let floor = now.saturating_sub(u64::try_from(retention.as_micros()).unwrap_or(u64::MAX));
    if reports.seeding {
        return Some(floor);
    }
    let towards_me: BTreeMap<&str, &ShippedRecord> = reports
        .shipped
        .iter()
        .filter(|r| r.peer == mine && peers.contains(r.cluster.as_str()))
        .map(|r| (r.store_id.as_str(), r))
        .collect();
    // Every server of every peer cluster: registered, down with tablets, or with a record.
    let mut servers: BTreeSet<&str> = towards_me.keys().copied().collect();
    servers.extend(
        reports
            .registered
            .iter()
            .filter(|(_, c)| peers.contains(c.as_str()))
            .map(|(s, _)| s.as_str()),
    );
    servers.extend(
        reports
            .down_owners
            .iter()
            .filter(|(c, _)| peers.contains(c.as_str()))
            .map(|(_, s)| s.as_str()),
    );
    let down: BTreeSet<&str> = reports
        .down_owners
        .iter()
        .map(|(_, s)| s.as_str())
        .collect();
    let mut lowest = now;
    for store in servers {
        let live = reports.registered.contains_key(store) || down.contains(store);
        let acked = match towards_me.get(store) {
            // Gone, owning nothing, and every write it logged was acknowledged: no bound.
            Some(r) if !live && r.acked_seq >= r.logged_seq => continue,
            Some(r) => r.acked_hlc,
            None => 0,
        };
        lowest = lowest.min(acked);
    }
    Some(lowest.max(floor))
}

/// Computes the safe point from etcd and sets it on the store. On an error the store keeps
/// the value it has (a safe point stays true: it only lags).
pub async fn refresh(node: &Node) -> Result<Option<u64>> {
    let mine = node.config.cluster.as_str();
    // The records first, then the seeds (see the module docs).
    let shipped = node.meta.shipped().await?;
    let seeding = !node.meta.seeds().await?.is_empty();
    let clusters: BTreeSet<String> = node.meta.cluster_numbers().await?.into_keys().collect();
    let (servers, _) = node.meta.servers(None).await?;
    let registered: BTreeMap<String, String> = servers
        .into_iter()
        .map(|s| (s.record.store_id, s.cluster))
        .collect();
    let mut down_owners = BTreeSet::new();
    if clusters.len() > 1 && !seeding {
        let mut maps = Vec::new();
        for cluster in clusters.iter().filter(|c| c.as_str() != mine) {
            let (map, _) = node.meta.tablets(cluster).await?;
            maps.push((cluster.clone(), map));
        }
        let names: BTreeSet<&str> = registered.keys().map(String::as_str).collect();
        down_owners = unregistered_owners(&maps, &names);
    }
    let reports = Reports {
        shipped: &shipped,
        seeding,
        clusters: &clusters,
        registered: &registered,
        down_owners: &down_owners,
    };
    let point = safe_point(
        mine,
        &reports,
        now_micros().max(0) as u64,
        node.config.change_log_retention,
    );
    node.store.set_tombstone_safe_point(point);
    Ok(point)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_000_000_000_000;
    const DAY: Duration = Duration::from_secs(86_400);

    fn record(
        store: &str,
        cluster: &str,
        peer: &str,
        acked_hlc: u64,
        waiting: u64,
    ) -> ShippedRecord {
        ShippedRecord {
            store_id: store.into(),
            cluster: cluster.into(),
            peer: peer.into(),
            acked_seq: 10,
            logged_seq: 10 + waiting,
            lag_micros: 0,
            reported_micros: 0,
            acked_hlc,
        }
    }

    fn set(items: &[&str]) -> BTreeSet<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    fn registered(items: &[(&str, &str)]) -> BTreeMap<String, String> {
        items
            .iter()
            .map(|(s, c)| (s.to_string(), c.to_string()))
            .collect()
    }

    #[test]
    fn the_lowest_acknowledgement_of_any_server_of_another_cluster() {
        let clusters = set(&["a", "b", "c"]);
        let shipped = vec![
            record("b1", "b", "a", NOW - 500, 0),
            record("b2", "b", "a", NOW - 900, 3),
            record("c1", "c", "a", NOW - 100, 0),
            // Towards other clusters, and a's own servers: not a's concern.
            record("b1", "b", "c", NOW - 5_000, 0),
            record("a1", "a", "b", NOW - 7_000, 0),
        ];
        let up = registered(&[("a1", "a"), ("b1", "b"), ("b2", "b"), ("c1", "c")]);
        let none = BTreeSet::new();
        let reports = Reports {
            shipped: &shipped,
            seeding: false,
            clusters: &clusters,
            registered: &up,
            down_owners: &none,
        };
        assert_eq!(safe_point("a", &reports, NOW, DAY), Some(NOW - 900));
        // A registered server of a peer that has not reported towards a yet: hold.
        let up = registered(&[
            ("a1", "a"),
            ("b1", "b"),
            ("b2", "b"),
            ("c1", "c"),
            ("c2", "c"),
        ]);
        let reports = Reports {
            registered: &up,
            ..reports
        };
        assert_eq!(
            safe_point("a", &reports, NOW, DAY),
            Some(NOW - DAY.as_micros() as u64)
        );
    }

    #[test]
    fn without_another_cluster_there_is_none() {
        let clusters = set(&["a"]);
        let (nobody, none) = (BTreeMap::new(), BTreeSet::new());
        let reports = Reports {
            shipped: &[],
            seeding: false,
            clusters: &clusters,
            registered: &nobody,
            down_owners: &none,
        };
        assert_eq!(safe_point("a", &reports, NOW, DAY), None);
    }

    #[test]
    fn servers_that_left_count_only_while_they_may_still_ship() {
        let clusters = set(&["a", "b"]);
        let shipped = vec![
            record("b1", "b", "a", NOW - 100, 0),
            // Drained and gone, caught up: no bound.
            record("b-drained", "b", "a", NOW - 80_000, 0),
            // Gone while writes were waiting: it will ship them when it is back.
            record("b-behind", "b", "a", NOW - 60_000, 2),
        ];
        let up = registered(&[("b1", "b")]);
        let none = BTreeSet::new();
        let reports = Reports {
            shipped: &shipped,
            seeding: false,
            clusters: &clusters,
            registered: &up,
            down_owners: &none,
        };
        assert_eq!(safe_point("a", &reports, NOW, DAY), Some(NOW - 60_000));
        // Down but owning tablets: its last report, caught up or not (it may have acknowledged
        // writes since).
        let shipped = vec![
            record("b1", "b", "a", NOW - 100, 0),
            record("b-down", "b", "a", NOW - 40_000, 0),
        ];
        let down = BTreeSet::from([("b".to_string(), "b-down".to_string())]);
        let reports = Reports {
            shipped: &shipped,
            down_owners: &down,
            ..reports
        };
        assert_eq!(safe_point("a", &reports, NOW, DAY), Some(NOW - 40_000));
        // Down with tablets and never reported: hold (up to the retention).
        let down = BTreeSet::from([("b".to_string(), "b-new".to_string())]);
        let reports = Reports {
            down_owners: &down,
            ..reports
        };
        assert_eq!(
            safe_point("a", &reports, NOW, DAY),
            Some(NOW - DAY.as_micros() as u64)
        );
    }

    #[test]
    fn a_seed_holds_every_tombstone_and_a_stale_peer_only_for_the_retention() {
        let clusters = set(&["a", "b"]);
        let shipped = vec![record("b1", "b", "a", NOW - 100, 0)];
        let up = registered(&[("b1", "b")]);
        let none = BTreeSet::new();
        let reports = Reports {
            shipped: &shipped,
            seeding: true,
            clusters: &clusters,
            registered: &up,
            down_owners: &none,
        };
        let floor = NOW - DAY.as_micros() as u64;
        assert_eq!(safe_point("a", &reports, NOW, DAY), Some(floor));
        // A peer stuck for longer than the retention (it needs a re-seed) holds no more.
        let shipped = vec![record("b1", "b", "a", NOW - 3 * DAY.as_micros() as u64, 5)];
        let reports = Reports {
            shipped: &shipped,
            seeding: false,
            ..reports
        };
        assert_eq!(safe_point("a", &reports, NOW, DAY), Some(floor));
        // A peer cluster with no server at all (declared, not started): nothing older can come.
        let nobody = BTreeMap::new();
        let reports = Reports {
            shipped: &[],
            registered: &nobody,
            ..reports
        };
        assert_eq!(safe_point("a", &reports, NOW, DAY), Some(NOW));
    }
}
