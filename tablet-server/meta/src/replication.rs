//! Replication between the clusters of an instance, as recorded in etcd:
//!
//! ```text
//! /basalt/v1/<namespace>/<instance>/
//!   cluster-numbers/<c>                 the cluster's number (u16, decimal): the tiebreaker of its
//!                                       writes' versions; its presence makes <c> a replica
//!   cluster-number-owners/<n>           <c>: the cluster that took number n (kept when it
//!                                       leaves: a number is never given twice)
//!   shipped/<store-id>/<peer>           how far a server's change log reached cluster <peer>
//!   seeds/<c>                           cluster <c> joined an instance that had clusters
//!                                       already: it is being seeded with their data (a
//!                                       `SeedRecord`); gone once <c> holds it all (READY)
//!   replication-limits                  the Instance's byte-rate limits for shipping and
//!                                       seeding (a `ReplicationLimits`; absent: unlimited)
//!   peer-endpoints/<c>                  `host:port`: where the other clusters reach <c> (its
//!                                       Cluster's `spec.peerEndpoint`); absent: at its
//!                                       servers' registered addresses
//! ```
//!
//! **Reaching another cluster.** Clusters may live in different networks, where the other
//! clusters reach a cluster only through a gateway or a load balancer in front of its servers:
//! its *peer endpoint*. Every call a server makes into another cluster that any of its servers
//! can take (a replication batch, a DropRowRange carried out there) dials
//! [`Meta::peer_addresses`]: the peer endpoint when the runtime recorded one, else the
//! servers' own addresses.
//!
//! **Seeding.** A cluster that gets its number while other clusters have one must first receive
//! what they hold. Its seed record starts `waiting`: until every server of the other clusters
//! has logged for it (their `shipped/<store>/<c>` record exists, written once its log is on
//! with a cursor for <c>), a write could still land unlogged. Then the master lists the tables
//! and copies each from one source cluster, row range by row range, recording where it is
//! (`copying`), and deletes the record when the last table is copied. Every write made from the
//! moment the logs were on reaches <c> through them; every write before is in the copy.
//!
//! A cluster gets its number when the runtime declares it (before its servers start; a
//! server asks for it too, in case), and keeps it until it leaves the instance. Every cluster with a
//! number receives every other one's writes. The `shipped` records are durable (no lease): a
//! consistency token compares them with the log positions it recorded, also after the server
//! that wrote them is gone.

use std::collections::BTreeMap;

use basalt_model::{Error, Result};
use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};
use serde::{Deserialize, Serialize};

use crate::client::{Meta, unavailable};
use crate::keys::Keys;

// The prefixes of the replication keys under the instance's (see the module docs).
const SEEDS: &str = "seeds/";
const CLUSTER_NUMBERS: &str = "cluster-numbers/";
const PEER_ENDPOINTS: &str = "peer-endpoints/";
const REMOVING: &str = "removing/";

/// Whether `key` is one app-profile routing reads: an app profile, a server's registration,
/// the instance's clusters (their numbers), a peer endpoint, a removal mark or a seed. A
/// change to one of these may change where requests go; to any other key (tablets, moves,
/// shipping reports), not.
pub fn routing_reads(keys: &Keys, key: &str) -> bool {
    let Some(rest) = key.strip_prefix(keys.prefix()) else {
        return false;
    };
    key.starts_with(&keys.app_profiles())
        || [SEEDS, CLUSTER_NUMBERS, PEER_ENDPOINTS, REMOVING]
            .iter()
            .any(|p| rest.starts_with(p))
        || keys.parse_server(key).is_some()
}
use crate::term::Term;

/// How far one server's change log reached one peer cluster: `shipped/<store>/<peer>`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShippedRecord {
    /// The server's store id and cluster.
    pub store_id: String,
    pub cluster: String,
    /// The peer cluster.
    pub peer: String,
    /// Every entry of the server's log up to this sequence is durable in the peer cluster.
    pub acked_seq: u64,
    /// The last sequence the server had logged when it last reported (acked_seq == logged_seq:
    /// nothing is waiting).
    pub logged_seq: u64,
    /// How old the oldest entry not yet acknowledged by the peer was when the server last
    /// reported, in microseconds (0: nothing waits).
    pub lag_micros: u64,
    /// When the server last reported (microseconds since the epoch).
    pub reported_micros: i64,
    /// Every write of the server with a version (hlc) below this is durable in the peer
    /// cluster, and so is every write it makes later, whose version will be greater: no write
    /// of the server older than it can still arrive there. 0: not known yet (a shipper that
    /// just started, a record of a server of an older version). What the peer's tombstones
    /// wait for (`docs/replication.md`, "Deletes and tombstones").
    #[serde(default)]
    pub acked_hlc: u64,
}

/// The Instance's replication limits (`spec.replication` of its manifest), written by the
/// runtime (the Kubernetes controller or the local runtime): `replication-limits`. The servers'
/// shippers and the master read it every second or so, so a change takes effect without a
/// restart. An absent record, or an absent field, is no limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicationLimits {
    /// The most bytes per second one cluster ships to each other cluster, shared evenly by its
    /// registered servers (each server ships its own change log).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ship_bytes_per_second: Option<u64>,
    /// The most bytes per second the master copies into each cluster being seeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed_bytes_per_second: Option<u64>,
}

/// Where the seeding of a cluster that joined the instance stands: `seeds/<c>`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SeedRecord {
    /// The cluster being seeded.
    pub cluster: String,
    /// Copying from this cluster; None while waiting for every other server to log for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// The tables still to copy (table id → the row key to go on from, hex; empty: from the
    /// first row). Empty while waiting.
    #[serde(default)]
    pub tables: BTreeMap<String, String>,
    /// Row ranges to copy after the tables (a re-seed of tablets whose server lost its data),
    /// in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranges: Vec<SeedRange>,
    /// Rows and bytes copied so far.
    #[serde(default)]
    pub rows: u64,
    #[serde(default)]
    pub bytes: u64,
    /// When the cluster joined (microseconds since the epoch).
    pub started_micros: i64,
    /// The record's etcd mod revision when read (not stored): what a fenced update compares.
    #[serde(skip)]
    pub mod_revision: i64,
}

/// A row range of a table to copy: `[next, end)`, keys in hex (`end` None: to the table's end).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SeedRange {
    pub table: String,
    pub next: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<String>,
}

impl SeedRecord {
    /// A new record for `cluster`, started now, waiting for the other clusters' logs.
    pub fn waiting_for(cluster: &str) -> SeedRecord {
        SeedRecord {
            cluster: cluster.to_string(),
            source: None,
            tables: BTreeMap::new(),
            ranges: Vec::new(),
            rows: 0,
            bytes: 0,
            started_micros: basalt_model::hlc::now_micros(),
            mod_revision: 0,
        }
    }

    /// Still waiting for the other clusters' logs (no table listed yet).
    pub fn waiting(&self) -> bool {
        self.source.is_none()
    }

    /// Whether `table` (its id) is not yet complete in the seeded cluster.
    pub fn covers(&self, table: &str) -> bool {
        self.waiting()
            || self.tables.contains_key(table)
            || self.ranges.iter().any(|r| r.table == table)
    }

    /// Nothing is left to copy (and the tables were listed).
    pub fn done(&self) -> bool {
        !self.waiting() && self.tables.is_empty() && self.ranges.is_empty()
    }
}

impl Meta {
    fn seeds_prefix(&self) -> String {
        format!("{}{SEEDS}", self.keys().prefix())
    }

    fn cluster_numbers_prefix(&self) -> String {
        format!("{}{CLUSTER_NUMBERS}", self.keys().prefix())
    }

    fn number_owner(&self, number: u16) -> String {
        format!("{}cluster-number-owners/{number}", self.keys().prefix())
    }

    fn shipped_prefix(&self) -> String {
        format!("{}shipped/", self.keys().prefix())
    }

    fn replication_limits_key(&self) -> String {
        format!("{}replication-limits", self.keys().prefix())
    }

    /// The instance's replication limits (the default, no limit, when none are recorded).
    pub async fn replication_limits(&self) -> Result<ReplicationLimits> {
        let key = self.replication_limits_key();
        let resp = self
            .client()
            .get(key.as_str(), None)
            .await
            .map_err(unavailable)?;
        match resp.kvs().first() {
            Some(kv) => serde_json::from_slice(kv.value())
                .map_err(|e| Error::Internal(format!("{key} does not decode: {e}"))),
            None => Ok(ReplicationLimits::default()),
        }
    }

    /// Records the instance's replication limits (the runtime's; the last write wins).
    pub async fn put_replication_limits(&self, limits: &ReplicationLimits) -> Result<()> {
        let value = serde_json::to_string(limits).map_err(|e| Error::Internal(e.to_string()))?;
        self.client()
            .put(self.replication_limits_key(), value, None)
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    fn peer_endpoints_prefix(&self) -> String {
        format!("{}{PEER_ENDPOINTS}", self.keys().prefix())
    }

    fn peer_endpoint_key(&self, cluster: &str) -> String {
        format!("{}{cluster}", self.peer_endpoints_prefix())
    }

    /// Every peer endpoint recorded, by cluster.
    pub async fn peer_endpoints(&self) -> Result<BTreeMap<String, String>> {
        let mut endpoints = self.by_cluster(&self.peer_endpoints_prefix()).await?;
        endpoints.retain(|_, endpoint| !endpoint.is_empty());
        Ok(endpoints)
    }

    /// The values under `prefix` (trimmed), by the rest of their key (a cluster's name).
    async fn by_cluster(&self, prefix: &str) -> Result<BTreeMap<String, String>> {
        let resp = self
            .client()
            .get(prefix, Some(GetOptions::new().with_prefix()))
            .await
            .map_err(unavailable)?;
        Ok(resp
            .kvs()
            .iter()
            .filter_map(|kv| {
                let cluster = kv.key_str().ok()?.strip_prefix(prefix)?;
                Some((cluster.to_string(), kv.value_str().ok()?.trim().to_string()))
            })
            .collect())
    }

    /// The peer endpoint recorded for `cluster` (`host:port`), if any.
    pub async fn peer_endpoint(&self, cluster: &str) -> Result<Option<String>> {
        let resp = self
            .client()
            .get(self.peer_endpoint_key(cluster), None)
            .await
            .map_err(unavailable)?;
        Ok(resp
            .kvs()
            .first()
            .and_then(|kv| kv.value_str().ok())
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty()))
    }

    /// Records where the other clusters reach `cluster` (None: at its servers' addresses). The
    /// runtimes write it from the Cluster's `spec.peerEndpoint`.
    pub async fn set_peer_endpoint(&self, cluster: &str, endpoint: Option<&str>) -> Result<()> {
        let key = self.peer_endpoint_key(cluster);
        let mut client = self.client();
        match endpoint {
            Some(endpoint) => client.put(key, endpoint, None).await.map(drop),
            None => client.delete(key, None).await.map(drop),
        }
        .map_err(unavailable)
    }

    /// The addresses (`host:port`) to dial to reach `cluster` from another cluster of the
    /// instance: its peer endpoint when one is recorded, else the addresses its servers
    /// registered (empty when none is registered). Any of them takes a call meant for the
    /// whole cluster (a replication batch, a DropRowRange), and carries it out in its cluster.
    pub async fn peer_addresses(&self, cluster: &str) -> Result<Vec<String>> {
        if let Some(endpoint) = self.peer_endpoint(cluster).await? {
            return Ok(vec![endpoint]);
        }
        let (servers, _) = self.servers(Some(cluster)).await?;
        Ok(servers.into_iter().map(|s| s.record.address).collect())
    }

    /// The number of `cluster` in the instance, given to it now if it has none: the smallest
    /// number from 1 up that no cluster ever took (a cluster that left keeps its number taken,
    /// so no two writes of different clusters ever carry the same version).
    pub async fn cluster_number(&self, cluster: &str) -> Result<u16> {
        let key = format!("{}{cluster}", self.cluster_numbers_prefix());
        for _ in 0..64 {
            let numbers = self.cluster_numbers().await?;
            if let Some(n) = numbers.get(cluster) {
                return Ok(*n);
            }
            let taken = self.taken_numbers().await?;
            let number = (1..=u16::MAX)
                .find(|n| !taken.contains(n))
                .ok_or_else(|| Error::FailedPrecondition("no cluster number left".into()))?;
            let owner = self.number_owner(number);
            let mut ops = vec![
                TxnOp::put(key.as_str(), number.to_string(), None),
                TxnOp::put(owner.as_str(), cluster, None),
            ];
            // Joining clusters that may hold data: seeded before it is READY.
            if !numbers.is_empty() {
                let seed = SeedRecord::waiting_for(cluster);
                ops.push(TxnOp::put(
                    format!("{}{cluster}", self.seeds_prefix()),
                    serde_json::to_vec(&seed).map_err(|e| Error::Internal(e.to_string()))?,
                    None,
                ));
            }
            let txn = Txn::new()
                .when([
                    Compare::create_revision(key.as_str(), CompareOp::Equal, 0),
                    Compare::create_revision(owner.as_str(), CompareOp::Equal, 0),
                ])
                .and_then(ops);
            let done = self.txn(txn).await?.succeeded();
            if done {
                return Ok(number);
            }
        }
        Err(Error::Unavailable(format!(
            "could not give cluster {cluster} a number: too many concurrent attempts"
        )))
    }

    /// Every number a cluster ever took.
    async fn taken_numbers(&self) -> Result<std::collections::BTreeSet<u16>> {
        let prefix = format!("{}cluster-number-owners/", self.keys().prefix());
        let resp = self
            .client()
            .get(
                prefix.as_str(),
                Some(GetOptions::new().with_prefix().with_keys_only()),
            )
            .await
            .map_err(unavailable)?;
        Ok(resp
            .kvs()
            .iter()
            .filter_map(|kv| kv.key_str().ok()?.strip_prefix(&prefix)?.parse().ok())
            .collect())
    }

    /// The clusters of the instance that replicate (those with a number), by name.
    pub async fn cluster_numbers(&self) -> Result<BTreeMap<String, u16>> {
        let prefix = self.cluster_numbers_prefix();
        let resp = self
            .client()
            .get(prefix.as_str(), Some(GetOptions::new().with_prefix()))
            .await
            .map_err(unavailable)?;
        let mut out = BTreeMap::new();
        for kv in resp.kvs() {
            let (Ok(key), Ok(value)) = (kv.key_str(), kv.value_str()) else {
                continue;
            };
            let (Some(cluster), Ok(n)) = (key.strip_prefix(&prefix), value.trim().parse()) else {
                continue;
            };
            out.insert(cluster.to_string(), n);
        }
        Ok(out)
    }

    /// `cluster` no longer replicates (it left the instance): it loses its number (which no
    /// other cluster will take) and its peer endpoint, and the positions of its servers' logs and of every log
    /// towards it are forgotten (the other clusters then stop shipping to it and release
    /// their cursors).
    pub async fn remove_replica(&self, cluster: &str) -> Result<()> {
        let mut ops = vec![
            TxnOp::delete(format!("{}{cluster}", self.cluster_numbers_prefix()), None),
            TxnOp::delete(format!("{}{cluster}", self.seeds_prefix()), None),
            TxnOp::delete(self.peer_endpoint_key(cluster), None),
            TxnOp::delete(format!("{}{cluster}", self.removing_prefix()), None),
        ];
        for record in self.shipped().await? {
            if record.cluster == cluster || record.peer == cluster {
                ops.push(TxnOp::delete(
                    format!(
                        "{}{}/{}",
                        self.shipped_prefix(),
                        record.store_id,
                        record.peer
                    ),
                    None,
                ));
            }
        }
        self.client()
            .txn(Txn::new().and_then(ops))
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    /// Records how far a server's log reached a peer cluster.
    pub async fn put_shipped(&self, record: &ShippedRecord) -> Result<()> {
        let key = format!(
            "{}{}/{}",
            self.shipped_prefix(),
            record.store_id,
            record.peer
        );
        let value = serde_json::to_string(record).map_err(|e| Error::Internal(e.to_string()))?;
        self.client()
            .put(key, value, None)
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    /// Every server's progress towards every peer cluster.
    pub async fn shipped(&self) -> Result<Vec<ShippedRecord>> {
        let resp = self
            .client()
            .get(self.shipped_prefix(), Some(GetOptions::new().with_prefix()))
            .await
            .map_err(unavailable)?;
        Ok(resp
            .kvs()
            .iter()
            .filter_map(|kv| serde_json::from_slice(kv.value()).ok())
            .collect())
    }

    /// The clusters being seeded, by name.
    pub async fn seeds(&self) -> Result<BTreeMap<String, SeedRecord>> {
        let resp = self
            .client()
            .get(self.seeds_prefix(), Some(GetOptions::new().with_prefix()))
            .await
            .map_err(unavailable)?;
        let mut out = BTreeMap::new();
        for kv in resp.kvs() {
            if let Ok(mut record) = serde_json::from_slice::<SeedRecord>(kv.value()) {
                record.mod_revision = kv.mod_revision();
                out.insert(record.cluster.clone(), record);
            }
        }
        Ok(out)
    }

    /// The master records a seed's progress (`record` as read, changed): written only if the
    /// term still leads and nobody changed the record since it was read. With `done`, the
    /// record goes: the cluster holds everything.
    pub async fn update_seed(&self, term: &Term, record: &SeedRecord, done: bool) -> Result<bool> {
        let key = format!("{}{}", self.seeds_prefix(), record.cluster);
        let when = [Compare::mod_revision(
            key.as_str(),
            CompareOp::Equal,
            record.mod_revision,
        )];
        let op = if done {
            TxnOp::delete(key.as_str(), None)
        } else {
            let value = serde_json::to_vec(record).map_err(|e| Error::Internal(e.to_string()))?;
            TxnOp::put(key.as_str(), value, None)
        };
        self.fenced(term, when, [op]).await
    }

    /// The master records that `ranges` of `cluster` are to be copied from `source` (added to
    /// its seed record, created if there is none): written only if the term still leads and the
    /// record did not change since it was read. False: read again.
    pub async fn add_seed_ranges(
        &self,
        term: &Term,
        cluster: &str,
        source: &str,
        ranges: Vec<SeedRange>,
    ) -> Result<bool> {
        let key = format!("{}{cluster}", self.seeds_prefix());
        let (record, when) = match self.seeds().await?.remove(cluster) {
            Some(mut record) => {
                let when =
                    Compare::mod_revision(key.as_str(), CompareOp::Equal, record.mod_revision);
                if record.source.is_none() {
                    // Still waiting: the tables listed later cover these ranges.
                    return Ok(true);
                }
                record.ranges.extend(ranges);
                (record, when)
            }
            None => (
                SeedRecord {
                    source: Some(source.to_string()),
                    ranges,
                    ..SeedRecord::waiting_for(cluster)
                },
                Compare::create_revision(key.as_str(), CompareOp::Equal, 0),
            ),
        };
        let value = serde_json::to_vec(&record).map_err(|e| Error::Internal(e.to_string()))?;
        self.fenced(term, [when], [TxnOp::put(key.as_str(), value, None)])
            .await
    }

    /// Asks for `cluster` to be seeded again (a server is about to drop change-log entries it
    /// never acknowledged: not heard from within the retention): its seed record is created,
    /// waiting, unless it has one already or no longer replicates. The master then copies
    /// every table into it from a READY cluster, as for a cluster that joins. True when a
    /// record was created.
    pub async fn request_seed(&self, cluster: &str) -> Result<bool> {
        let key = format!("{}{cluster}", self.seeds_prefix());
        let number = format!("{}{cluster}", self.cluster_numbers_prefix());
        let seed = SeedRecord::waiting_for(cluster);
        let value = serde_json::to_vec(&seed).map_err(|e| Error::Internal(e.to_string()))?;
        let txn = Txn::new()
            .when([
                Compare::create_revision(key.as_str(), CompareOp::Equal, 0),
                Compare::create_revision(number.as_str(), CompareOp::Greater, 0),
            ])
            .and_then([TxnOp::put(key.as_str(), value, None)]);
        Ok(self.txn(txn).await?.succeeded())
    }

    fn removing_prefix(&self) -> String {
        format!("{}{REMOVING}", self.keys().prefix())
    }

    /// Marks `cluster` as leaving the instance (its removal began at `since_micros`; a mark
    /// already there is kept). Its servers then send every client request to the clusters
    /// that stay, so that it logs no more client writes and its log can be shipped to its end
    /// (`docs/replication.md`, "Removing a cluster"). [`Meta::remove_replica`] clears it.
    pub async fn mark_removing(&self, cluster: &str, since_micros: i64) -> Result<()> {
        let key = format!("{}{cluster}", self.removing_prefix());
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.as_str(), since_micros.to_string(), None)]);
        self.txn(txn).await?;
        Ok(())
    }

    /// The clusters being removed, with when their removal began (microseconds).
    pub async fn removing(&self) -> Result<BTreeMap<String, i64>> {
        Ok(self
            .by_cluster(&self.removing_prefix())
            .await?
            .into_iter()
            .filter_map(|(cluster, since)| Some((cluster, since.parse().ok()?)))
            .collect())
    }

    /// Forgets the positions of a server that is gone for good (its data directory lost): no
    /// consistency token or status waits for what it logged any more.
    pub async fn forget_shipped(&self, store_id: &str) -> Result<()> {
        let prefix = format!("{}{store_id}/", self.shipped_prefix());
        self.client()
            .delete(
                prefix.as_str(),
                Some(etcd_client::DeleteOptions::new().with_prefix()),
            )
            .await
            .map_err(unavailable)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_reads_profiles_registrations_and_the_instances_clusters_only() {
        let keys = Keys::new("ns", "inst");
        let p = keys.prefix();
        for key in [
            keys.app_profile("batch"),
            keys.server("c1", "store-1"),
            format!("{p}{CLUSTER_NUMBERS}c2"),
            format!("{p}{PEER_ENDPOINTS}c2"),
            format!("{p}{REMOVING}c2"),
            format!("{p}{SEEDS}c3"),
        ] {
            assert!(routing_reads(&keys, &key), "{key}");
        }
        for key in [
            keys.tablet("c1", "7", Some(b"m")),
            keys.move_record("c1", "m-1"),
            keys.serve_nodes("c1"),
            format!("{p}shipped/store-1/c2"),
            format!("{p}schema/7"),
            // Another instance's profile.
            Keys::new("ns", "other").app_profile("batch"),
        ] {
            assert!(!routing_reads(&keys, &key), "{key}");
        }
    }
}
