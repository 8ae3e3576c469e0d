//! The one [`ClusterView`] built from what etcd says of a cluster: the master decides on it,
//! and the scale-in's status (Cluster status on Kubernetes, `local status` in the local
//! runtime) is computed from the same view by the same decision ([`super::drain`]).
//!
//! [`observe`] reads the facts (registrations, the tablet map, the moves read around it),
//! [`cluster_view`] turns them into the view (pure). A [`ServerBook`] remembers the servers
//! seen registered before, so a server that is down now still has its name and ordinal.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use basalt_master::model::{Result, ServerId, Tablet, TabletMap};
use basalt_master::{ClusterView, Presence, ServerState, TabletKey, TabletLoad};
use basalt_meta::{Meta, MoveRecord, ServerRecord};

/// A server known from etcd: its registration, and whether it is registered now (false: seen
/// registered earlier, its lease is gone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Known {
    pub record: ServerRecord,
    pub registered: bool,
}

/// The ordinal of server `name` of `cluster` (`<cluster>-<ordinal>`).
pub fn ordinal(cluster: &str, name: &str) -> Option<u32> {
    name.strip_prefix(cluster)?.strip_prefix('-')?.parse().ok()
}

/// A server's ordinal: recorded, else from its name.
pub fn ordinal_of(cluster: &str, record: &ServerRecord) -> Option<u32> {
    record.ordinal.or_else(|| ordinal(cluster, &record.name))
}

/// The servers seen registered, per (cluster, store id): what a runtime remembers between two
/// reads so that a server that went away keeps its name and ordinal.
#[derive(Debug, Clone, Default)]
pub struct ServerBook {
    seen: BTreeMap<(String, ServerId), ServerRecord>,
}

impl ServerBook {
    /// Remembers `registered` (the cluster's registrations now) and returns every server of
    /// `cluster` known: those registered now, then those seen before.
    pub fn update(&mut self, cluster: &str, registered: &[ServerRecord]) -> Vec<Known> {
        let now: BTreeSet<&str> = registered.iter().map(|r| r.store_id.as_str()).collect();
        for r in registered {
            self.seen
                .insert((cluster.to_string(), r.store_id.clone()), r.clone());
        }
        self.seen
            .iter()
            .filter(|((c, _), _)| c == cluster)
            .map(|((_, id), record)| Known {
                record: record.clone(),
                registered: now.contains(id.as_str()),
            })
            .collect()
    }
}

/// What etcd says of one cluster.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    pub cluster: String,
    /// Its servers: registered now, and (with a [`ServerBook`]) those seen before.
    pub servers: Vec<Known>,
    pub tablets: TabletMap,
    /// The move records read before and after the tablet map (a move that ends between the
    /// reads is still seen).
    pub moves: Vec<MoveRecord>,
    /// The server count recorded for the master to drain towards (None: never recorded).
    pub serve_nodes: Option<u32>,
    /// The autoscaler's last decision (None: none, or no autoscaling).
    pub autoscaler: Option<basalt_meta::AutoscalerRecord>,
    /// The cluster's servers whose change log another cluster has not acknowledged to its end
    /// (store id → that cluster), as they last reported it (replication).
    pub unshipped: BTreeMap<ServerId, String>,
}

/// A cluster's tablet map and registered (live) servers, as the metadata store holds them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Placement {
    /// Every tablet of every table in the cluster, with its owner and state.
    pub tablets: Vec<Tablet>,
    /// The registrations of the cluster's live servers.
    pub servers: Vec<ServerRecord>,
    /// The tablet moves in progress (the master records each before its copy starts).
    pub moves: Vec<MoveRecord>,
    /// The server count the master drains towards, as last recorded (None: never).
    pub serve_nodes: Option<u32>,
    /// The autoscaler's last decision (None: none, or no autoscaling).
    pub autoscaler: Option<basalt_meta::AutoscalerRecord>,
    /// What the registered servers reported about their volumes, by store id: bytes stored
    /// and capacity (None: unknown). Read only while a scale-in may be in progress.
    pub volumes: BTreeMap<String, (u64, Option<u64>)>,
    /// The tablets' sizes and loads as their owners reported them (same reports).
    pub loads: BTreeMap<TabletKey, TabletLoad>,
    /// The servers with writes not yet shipped to another cluster (store id → that cluster):
    /// a scale-in keeps them until their log is shipped.
    pub unshipped: BTreeMap<ServerId, String>,
}

impl From<Observed> for Placement {
    /// The registered servers only: a server seen before but gone now is not live.
    fn from(o: Observed) -> Placement {
        Placement {
            tablets: o
                .tablets
                .tables()
                .flat_map(|t| o.tablets.tablets(t).iter().cloned())
                .collect(),
            servers: o
                .servers
                .into_iter()
                .filter(|k| k.registered)
                .map(|k| k.record)
                .collect(),
            moves: o.moves,
            serve_nodes: o.serve_nodes,
            autoscaler: o.autoscaler,
            unshipped: o.unshipped,
            ..Placement::default()
        }
    }
}

/// Reads what etcd says of `cluster`; `book` remembers the servers seen registered.
pub async fn observe(meta: &Meta, cluster: &str, book: &mut ServerBook) -> Result<Observed> {
    let (registered, _) = meta.servers(Some(cluster)).await?;
    let mut moves = meta.moves(cluster).await?;
    let (tablets, _) = meta.tablets(cluster).await?;
    moves.extend(meta.moves(cluster).await?);
    let serve_nodes = meta.serve_nodes(cluster).await?;
    let autoscaler = meta.autoscaler(cluster).await?;
    let unshipped = meta
        .shipped()
        .await?
        .into_iter()
        .filter(|r| r.cluster == cluster && r.acked_seq < r.logged_seq)
        .map(|r| (r.store_id, r.peer))
        .collect();
    let records: Vec<ServerRecord> = registered.into_iter().map(|r| r.record).collect();
    Ok(Observed {
        cluster: cluster.to_string(),
        servers: book.update(cluster, &records),
        tablets,
        moves,
        serve_nodes,
        autoscaler,
        unshipped,
    })
}

/// The view of `cluster`: its registered servers (ready), and every owner of a tablet or
/// party to one of `moves` that is not registered (not ready; with its address and ordinal if
/// it was seen before, else ordinal 0 — counted as staying, the safe side). A server seen
/// before that owns nothing and takes part in no move is left out. Presence: each server's
/// name (`?<store id>` for one never seen) and `absent_at` for the absent ones.
pub fn cluster_view(
    cluster: &str,
    servers: &[Known],
    tablets: TabletMap,
    moves: &[MoveRecord],
    lease_ttl: Duration,
    absent_at: Instant,
) -> ClusterView {
    // The map is taken, not copied: a million tablets are some 170 MiB (docs/scale.md).
    let involved: BTreeSet<&str> = tablets
        .tables()
        .flat_map(|t| tablets.tablets(t).iter().map(|t| t.owner.as_str()))
        .chain(moves.iter().flat_map(|m| [m.from.as_str(), m.to.as_str()]))
        .collect();
    let involved: Vec<ServerId> = involved.into_iter().map(str::to_string).collect();
    let mut view = ClusterView {
        cluster: cluster.to_string(),
        tablets,
        lease_ttl,
        ..Default::default()
    };
    for s in servers.iter().filter(|s| s.registered) {
        let id = s.record.store_id.clone();
        view.servers
            .insert(id.clone(), state(cluster, &s.record, true));
        view.presence.insert(
            id,
            Presence {
                name: s.record.name.clone(),
                absent_since: None,
            },
        );
    }
    for id in involved {
        if view.servers.contains_key(&id) {
            continue;
        }
        let seen = servers
            .iter()
            .rev()
            .find(|s| s.record.store_id == id)
            .map(|s| &s.record);
        let state = match seen {
            Some(record) => state(cluster, record, false),
            None => ServerState {
                id: id.clone(),
                address: String::new(),
                ordinal: 0,
                ready: false,
                stored_bytes: 0,
                capacity_bytes: None,
            },
        };
        view.servers.insert(id.clone(), state);
        view.presence.insert(
            id.clone(),
            Presence {
                // A name never seen cannot match a replacement's.
                name: seen.map_or_else(|| format!("?{id}"), |r| r.name.clone()),
                absent_since: Some(absent_at),
            },
        );
    }
    view
}

/// Puts what the servers reported (volume bytes by store id; tablets' sizes and loads) into
/// `view`.
pub fn with_reports(
    view: &mut ClusterView,
    volumes: &BTreeMap<ServerId, (u64, Option<u64>)>,
    loads: &BTreeMap<TabletKey, TabletLoad>,
) {
    view.loads = Arc::new(loads.clone());
    for (id, (stored, capacity)) in volumes {
        if let Some(s) = view.servers.get_mut(id) {
            s.stored_bytes = *stored;
            s.capacity_bytes = *capacity;
        }
    }
}

fn state(cluster: &str, record: &ServerRecord, ready: bool) -> ServerState {
    ServerState {
        id: record.store_id.clone(),
        address: record.address.clone(),
        ordinal: ordinal_of(cluster, record).unwrap_or(0),
        ready,
        stored_bytes: 0,
        capacity_bytes: None,
    }
}

#[cfg(test)]
mod tests {
    use basalt_master::model::{RowRange, Tablet, TabletState};
    use basalt_meta::MovePhase;
    use bytes::Bytes;

    use super::*;

    fn record(name: &str, store: &str) -> ServerRecord {
        ServerRecord {
            store_id: store.into(),
            name: name.into(),
            address: format!("127.0.0.1:{}", 4000 + name.len()),
            http_address: None,
            ordinal: None,
            incarnation: 1,
        }
    }

    fn map(owners: &[&str]) -> TabletMap {
        let start = |i: usize| Bytes::from(if i == 0 { vec![] } else { vec![b'a' + i as u8] });
        TabletMap::new(owners.iter().enumerate().map(|(i, owner)| Tablet {
            table: "t".into(),
            range: RowRange::new(start(i), (i + 1 < owners.len()).then(|| start(i + 1))),
            epoch: 1,
            owner: owner.to_string(),
            state: TabletState::Serving,
        }))
        .unwrap()
    }

    #[test]
    fn registered_servers_are_ready_and_absent_owners_keep_what_was_seen_of_them() {
        let mut book = ServerBook::default();
        book.update(
            "c",
            &[
                record("c-0", "s0"),
                record("c-1", "s1"),
                record("c-2", "s2"),
            ],
        );
        // c-1 went away (owns a tablet); c-2 went away owning nothing; "gone" was never seen.
        let known = book.update("c", &[record("c-0", "s0")]);
        let at = Instant::now();
        let view = cluster_view(
            "c",
            &known,
            map(&["s0", "s1", "gone"]),
            &[],
            Duration::from_secs(10),
            at,
        );
        assert_eq!(view.lease_ttl, Duration::from_secs(10));
        let s0 = &view.servers["s0"];
        assert!(s0.ready && s0.ordinal == 0 && s0.address == "127.0.0.1:4003");
        // Its ordinal from its name, its address as registered, not ready, absent since `at`.
        let s1 = &view.servers["s1"];
        assert!(!s1.ready && s1.ordinal == 1 && s1.address == "127.0.0.1:4003");
        assert_eq!(view.presence["s1"].name, "c-1");
        assert_eq!(view.presence["s1"].absent_since, Some(at));
        assert!(!view.servers.contains_key("s2"), "{:?}", view.servers);
        let gone = &view.servers["gone"];
        assert!(!gone.ready && gone.ordinal == 0 && gone.address.is_empty());
        assert_eq!(view.presence["gone"].name, "?gone");
        assert!(view.check().is_ok());
        assert!(view.presence["s0"].registered());
    }

    #[test]
    fn a_party_to_a_move_is_in_the_view_even_when_it_owns_nothing() {
        let known = ServerBook::default().update("c", &[record("c-0", "s0")]);
        let moving = MoveRecord {
            id: "m".into(),
            table: "t".into(),
            start: String::new(),
            end: None,
            epoch: 1,
            from: "s0".into(),
            to: "s9".into(),
            phase: MovePhase::Copying,
            reason: "drain".into(),
            started_micros: 0,
        };
        let view = cluster_view(
            "c",
            &known,
            map(&["s0"]),
            &[moving],
            Duration::ZERO,
            Instant::now(),
        );
        assert!(!view.servers["s9"].ready);
    }

    #[test]
    fn a_recorded_ordinal_wins_over_the_name() {
        let mut r = record("db-7", "s");
        assert_eq!(ordinal_of("db", &r), Some(7));
        r.ordinal = Some(3);
        assert_eq!(ordinal_of("db", &r), Some(3));
        assert_eq!(ordinal("db", "other-1"), None);
    }
}
