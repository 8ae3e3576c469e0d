//! Consistency tokens of a cluster server (GenerateConsistencyToken, CheckConsistency).
//!
//! A token records, for every server of every cluster of the instance, the last sequence of
//! its change log when the token was made: every write acknowledged anywhere before the call
//! is at or below it. The servers of this server's cluster are asked directly; each other
//! cluster is asked where other clusters reach it, as the shippers do (its peer endpoint if it
//! has one, else any of its servers), and the server answering there asks its own cluster's
//! servers (GetClusterLogPositions). So a token needs every cluster reachable: while one is
//! cut off, GenerateConsistencyToken fails (UNAVAILABLE, try again) rather than leave out
//! writes acknowledged there. CheckConsistency is true once each of those servers' logs reached every
//! other cluster through that sequence — as the shipped positions in etcd say (one read, so
//! polling is cheap). A write is "reached" when the peer cluster made it durable: a read
//! through any cluster then returns it (mode `standard_read_remote_writes`, the default).
//!
//! In mode `data_boost_read_local_writes` the question is only whether each write reached the
//! cluster that acknowledged it ("if the read and write target the same cluster"): a write is
//! acknowledged once durable on its owner there, and reads there go to that owner, so the
//! answer is true at once — also during a partition, or while a cluster is being seeded (a
//! seed carries other clusters' writes).
//!
//! A server that is not registered when the token is made but still owns tablets (it is
//! restarting, or down) fails the call (UNAVAILABLE, try again): the writes it acknowledged
//! since its last report are in its log alone, so no position known elsewhere covers them. A
//! server that owns no tablet any more (drained away by a scale-in, or its tablets lost with its
//! data) counts with the last position it reported. With one cluster, no log is kept: every
//! acknowledged write is durable, and the token is consistent at once.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use basalt_control::replication_client;
use basalt_control::v1::{
    ClusterServer, GetClusterLogPositionsRequest, GetLogPositionRequest, GetLogPositionResponse,
};
use basalt_meta::ShippedRecord;
use basalt_model::{Error, Result, TabletMap, TabletState};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};

use crate::catalog::ConsistencyMode;
use crate::cluster::Node;
use crate::cluster::forwarding::{Reply, ask_cluster};

const PREFIX: &str = "basalt-ct2.";
/// How long reading one server's log position may take.
const POSITION_TIMEOUT: Duration = Duration::from_secs(5);

/// What a token holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Token {
    /// The table id it was made for.
    pub table: String,
    /// Each server's log position: (store id, its cluster, last sequence).
    pub positions: Vec<Position>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    pub store: String,
    pub cluster: String,
    pub seq: u64,
}

impl Token {
    pub fn encode(&self) -> String {
        let json = serde_json::to_vec(self).expect("a token serializes");
        format!("{PREFIX}{}", URL_SAFE_NO_PAD.encode(json))
    }

    /// The token of `text` if it is one of this form.
    pub fn decode(text: &str) -> Option<Token> {
        let data = URL_SAFE_NO_PAD.decode(text.strip_prefix(PREFIX)?).ok()?;
        serde_json::from_slice(&data).ok()
    }

    /// Whether every write the token covers reached every cluster of `clusters` other than
    /// its own, by the shipped positions (pure).
    pub fn reached(&self, clusters: &[String], shipped: &[ShippedRecord]) -> bool {
        let acked: HashMap<(&str, &str), u64> = shipped
            .iter()
            .map(|r| ((r.store_id.as_str(), r.peer.as_str()), r.acked_seq))
            .collect();
        // A server of a cluster that left the instance no longer counts.
        let mut replicas = self
            .positions
            .iter()
            .filter(|p| p.seq > 0 && clusters.contains(&p.cluster));
        replicas.all(|p| {
            clusters.iter().filter(|c| **c != p.cluster).all(|peer| {
                acked
                    .get(&(p.store.as_str(), peer.as_str()))
                    .is_some_and(|a| *a >= p.seq)
            })
        })
    }
}

/// The owners of tablets (of any table: the log holds the writes of every table) in `maps`
/// (cluster, its tablet map) that are not in `registered`, as (cluster, store id). A Lost
/// tablet's owner does not count: its data, log included, is gone. Pure.
pub(super) fn unregistered_owners(
    maps: &[(String, TabletMap)],
    registered: &BTreeSet<&str>,
) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for (cluster, map) in maps {
        for table in map.tables() {
            for tablet in map.tablets(table) {
                if tablet.state != TabletState::Lost && !registered.contains(tablet.owner.as_str())
                {
                    out.insert((cluster.clone(), tablet.owner.to_string()));
                }
            }
        }
    }
    out
}

/// A token of table `table` (its id): the log position of every server of the instance.
pub async fn generate(node: &Node, table: &str) -> Result<String> {
    let (servers, _) = node.meta.servers(None).await?;
    // A server that owns tablets but is not registered (restarting, or down) may have
    // acknowledged writes after its last report: nothing outside its log knows its position.
    // (With one cluster nothing is replicated: the token is consistent at once anyway.)
    let registered: BTreeSet<&str> = servers.iter().map(|s| s.record.store_id.as_str()).collect();
    let clusters = node.meta.cluster_numbers().await?;
    let mut maps = Vec::new();
    if clusters.len() > 1 {
        for cluster in clusters.into_keys() {
            let (map, _) = node.meta.tablets(&cluster).await?;
            maps.push((cluster, map));
        }
    }
    if let Some((cluster, store)) = unregistered_owners(&maps, &registered).into_iter().next() {
        return Err(Error::Unavailable(format!(
            "server {store} of cluster {cluster} owns tablets and is not registered (restarting, \
             or down): the writes it acknowledged are not known until it is back; try again"
        )));
    }
    // This cluster's servers are asked directly; each other cluster's through its peer
    // endpoint (or any of its servers), which asks its own servers within its cluster.
    let mut by_cluster: BTreeMap<&str, Vec<Member>> = BTreeMap::new();
    for s in &servers {
        by_cluster
            .entry(s.cluster.as_str())
            .or_default()
            .push(Member {
                name: s.record.name.clone(),
                store: s.record.store_id.clone(),
                address: s.record.address.clone(),
            });
    }
    let own = node.config.cluster.as_str();
    let asked = futures::future::try_join_all(by_cluster.into_iter().map(
        |(cluster, members)| async move {
            if cluster == own {
                cluster_positions(node, cluster, &members).await
            } else {
                remote_positions(node, cluster, &members).await
            }
        },
    ))
    .await?;
    let asked = asked.into_iter().flatten();
    let mut positions: BTreeMap<String, Position> =
        asked.into_iter().map(|p| (p.store.clone(), p)).collect();
    // Servers not registered now (they own no tablet): the last position they reported.
    for record in node.meta.shipped().await? {
        let entry = positions
            .entry(record.store_id.clone())
            .or_insert_with(|| Position {
                store: record.store_id.clone(),
                cluster: record.cluster.clone(),
                seq: 0,
            });
        if !servers.iter().any(|s| s.record.store_id == record.store_id) {
            entry.seq = entry.seq.max(record.logged_seq);
        }
    }
    Ok(Token {
        table: table.to_string(),
        positions: positions.into_values().collect(),
    }
    .encode())
}

/// A registered server of a cluster, as a token asks it for its log position.
#[derive(Debug, Clone)]
pub(super) struct Member {
    pub name: String,
    pub store: String,
    pub address: String,
}

impl From<ClusterServer> for Member {
    fn from(s: ClusterServer) -> Member {
        Member {
            name: s.name,
            store: s.store_id,
            address: s.address,
        }
    }
}

impl From<&Member> for ClusterServer {
    fn from(m: &Member) -> ClusterServer {
        ClusterServer {
            store_id: m.store.clone(),
            address: m.address.clone(),
            name: m.name.clone(),
        }
    }
}

impl From<GetLogPositionResponse> for Position {
    fn from(p: GetLogPositionResponse) -> Position {
        Position {
            store: p.store_id,
            cluster: p.cluster,
            seq: p.last_seq,
        }
    }
}

impl From<Position> for GetLogPositionResponse {
    fn from(p: Position) -> GetLogPositionResponse {
        GetLogPositionResponse {
            store_id: p.store,
            cluster: p.cluster,
            last_seq: p.seq,
        }
    }
}

/// The log positions of `members`, servers of this server's cluster `cluster`, each asked
/// directly (this server answers for itself). Each must answer as the store it is named: a
/// server restarted on other data at the same address does not stand for the one it replaced.
pub(super) async fn cluster_positions(
    node: &Node,
    cluster: &str,
    members: &[Member],
) -> Result<Vec<Position>> {
    let me = node.router.me().to_string();
    futures::future::try_join_all(members.iter().map(|m| {
        let me = me.clone();
        async move {
            let failed = |why: String| {
                Error::Unavailable(format!(
                    "cannot read the change log position of server {} (cluster {cluster}): {why}",
                    m.name
                ))
            };
            if m.store == me {
                return Ok(Position {
                    store: me,
                    cluster: cluster.to_string(),
                    seq: node.store.change_log_last_seq(),
                });
            }
            let mut client = replication_client(&node.dialer, &m.address, POSITION_TIMEOUT)
                .map_err(|e| failed(e.to_string()))?;
            let position = client
                .get_log_position(GetLogPositionRequest {})
                .await
                .map_err(|st| failed(st.message().to_string()))?
                .into_inner();
            if position.store_id != m.store {
                return Err(failed(format!(
                    "store {} answers at {} (restarted on other data?)",
                    position.store_id, m.address
                )));
            }
            Ok(position.into())
        }
    }))
    .await
}

/// The log positions of `members`, the servers of another cluster `cluster`, asked of that
/// cluster where other clusters reach it (its peer endpoint, else its servers in turn).
async fn remote_positions(node: &Node, cluster: &str, members: &[Member]) -> Result<Vec<Position>> {
    let request = GetClusterLogPositionsRequest {
        servers: members.iter().map(ClusterServer::from).collect(),
    };
    let answered = ask_cluster(node, cluster, |address| {
        let request = request.clone();
        async move {
            let mut client = match replication_client(&node.dialer, &address, POSITION_TIMEOUT) {
                Ok(client) => client,
                Err(e) => return Reply::Next(format!("{address}: {e}")),
            };
            let positions: Vec<Position> = match client.get_cluster_log_positions(request).await {
                Ok(response) => response
                    .into_inner()
                    .positions
                    .into_iter()
                    .map(Position::from)
                    .collect(),
                Err(s) => return Reply::Next(format!("{address}: {}", s.message())),
            };
            let answered: BTreeSet<&str> = positions
                .iter()
                .filter(|p| p.cluster == cluster)
                .map(|p| p.store.as_str())
                .collect();
            match members
                .iter()
                .find(|m| !answered.contains(m.store.as_str()))
            {
                Some(m) => Reply::Next(format!("{address} did not answer for server {}", m.name)),
                None => Reply::Answered(positions),
            }
        }
    })
    .await?;
    answered.map_err(|why| {
        Error::Unavailable(format!(
            "cannot read the change log positions of cluster {cluster}: {why}"
        ))
    })
}

/// Whether the writes `token` covers reached the clusters `mode` asks about: every cluster
/// (the default), or each the cluster that acknowledged it (at once: see the module docs).
/// With the default, never while a cluster is still being seeded with the table (the writes
/// made before it joined reach it through the seed).
pub async fn check(node: &Node, token: &Token, mode: ConsistencyMode) -> Result<bool> {
    if mode == ConsistencyMode::DataBoostReadLocalWrites {
        return Ok(true);
    }
    if node
        .meta
        .seeds()
        .await?
        .values()
        .any(|s| s.covers(&token.table))
    {
        return Ok(false);
    }
    let clusters: Vec<String> = node.meta.cluster_numbers().await?.into_keys().collect();
    if token.positions.iter().all(|p| p.seq == 0) {
        return Ok(true);
    }
    let shipped = node.meta.shipped().await?;
    Ok(token.reached(&clusters, &shipped))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shipped(store: &str, cluster: &str, peer: &str, acked: u64) -> ShippedRecord {
        ShippedRecord {
            store_id: store.into(),
            cluster: cluster.into(),
            peer: peer.into(),
            acked_seq: acked,
            logged_seq: acked,
            lag_micros: 0,
            reported_micros: 0,
            acked_hlc: 0,
        }
    }

    fn token(positions: &[(&str, &str, u64)]) -> Token {
        Token {
            table: "t".into(),
            positions: positions
                .iter()
                .map(|(s, c, q)| Position {
                    store: s.to_string(),
                    cluster: c.to_string(),
                    seq: *q,
                })
                .collect(),
        }
    }

    #[test]
    fn an_unregistered_server_counts_only_while_it_owns_tablets_it_has_not_lost() {
        use basalt_model::{RowRange, Tablet};
        let tablet = |start: &[u8], end: &[u8], owner: &str, state| Tablet {
            table: "t".into(),
            range: RowRange::new(
                bytes::Bytes::copy_from_slice(start),
                (!end.is_empty()).then(|| bytes::Bytes::copy_from_slice(end)),
            ),
            epoch: 1,
            owner: owner.into(),
            state,
        };
        let a = TabletMap::new([
            tablet(b"", b"m", "s1", TabletState::Serving),
            tablet(b"m", b"", "s2", TabletState::Lost),
        ])
        .unwrap();
        let b = TabletMap::new([tablet(b"", b"", "s3", TabletState::Serving)]).unwrap();
        let maps = vec![("a".to_string(), a), ("b".to_string(), b)];
        let everyone = BTreeSet::from(["s1", "s2", "s3"]);
        assert!(unregistered_owners(&maps, &everyone).is_empty());
        // s2 lost its tablet with its data: only s1 and s3 count.
        assert_eq!(
            unregistered_owners(&maps, &BTreeSet::new()),
            BTreeSet::from([
                ("a".to_string(), "s1".to_string()),
                ("b".to_string(), "s3".to_string())
            ])
        );
        // A server that owns nothing (drained, gone) is not looked for.
        assert!(unregistered_owners(&maps, &BTreeSet::from(["s1", "s3"])).is_empty());
    }

    #[test]
    fn a_token_round_trips_and_refuses_other_text() {
        let t = token(&[("s1", "a", 7), ("s2", "b", 0)]);
        assert_eq!(Token::decode(&t.encode()), Some(t));
        assert_eq!(Token::decode("basalt-ct1-3-12"), None);
        assert_eq!(Token::decode("basalt-ct2.!!"), None);
    }

    #[test]
    fn consistent_once_every_server_reached_every_other_cluster() {
        let clusters = vec!["a".to_string(), "b".to_string(), "c".to_string()];
        let t = token(&[("s1", "a", 7), ("s2", "b", 3), ("s3", "c", 0)]);
        let mut records = vec![
            shipped("s1", "a", "b", 7),
            shipped("s1", "a", "c", 6),
            shipped("s2", "b", "a", 3),
            shipped("s2", "b", "c", 9),
        ];
        assert!(!t.reached(&clusters, &records), "s1 has not reached c");
        records[1].acked_seq = 7;
        assert!(t.reached(&clusters, &records));
        // A server that logged nothing before the token needs nothing.
        records.retain(|r| r.store_id != "s3");
        assert!(t.reached(&clusters, &records));
        // A cluster with no record of a server's progress has not received its writes.
        let four = [clusters.clone(), vec!["d".to_string()]].concat();
        assert!(!t.reached(&four, &records));
        // Cluster b left the instance (its servers' records are gone): its positions no longer
        // count, and nobody waits to ship to it.
        let without_b = vec!["a".to_string(), "c".to_string()];
        let records: Vec<ShippedRecord> =
            records.into_iter().filter(|r| r.cluster != "b").collect();
        assert!(t.reached(&without_b, &records));
    }
}
