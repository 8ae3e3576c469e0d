//! The values stored under the keys of [`crate::keys`] (JSON), and their translation to the
//! model's types.

use basalt_model::{Error, Result, RowRange, ServerId, Tablet, TabletState};
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::keys::{Keys, hex, unhex};

/// A tablet server's registration, bound to its lease: present while the server is alive.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServerRecord {
    /// The store id of its data directory: the identity tablets are owned by. A server that
    /// restarts on its data directory keeps it; one whose directory was lost gets a new one.
    pub store_id: ServerId,
    /// Its name (the pod name, or `<cluster>-<ordinal>` in the local runtime): stable across
    /// restarts, also when the store id changes.
    pub name: String,
    /// Where its gRPC APIs listen, `host:port`.
    pub address: String,
    /// Where its HTTP endpoints (/readyz, /metrics) listen, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_address: Option<String>,
    /// Its ordinal in the cluster (scale-in drains the highest), if its name has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordinal: Option<u32>,
    /// When this process started, microseconds since the epoch: tells restarts apart.
    pub incarnation: i64,
}

/// An app profile in the instance's catalog: `app-profiles/<id>`. How requests that name it
/// are routed to the instance's clusters (the frontends route by it once replication between
/// clusters exists) and at which priority. Mirrors the operator's AppProfile spec, without
/// Kubernetes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AppProfileRecord {
    /// The app profile id clients send (the last segment of its resource name).
    pub id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    pub routing: AppProfileRouting,
    #[serde(default)]
    pub priority: AppProfilePriority,
}

/// Exactly one routing policy: `{"singleClusterRouting": {...}}` or
/// `{"multiClusterRoutingUseAny": {...}}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum AppProfileRouting {
    /// Every request goes to one cluster; the only policy that may allow CheckAndMutateRow
    /// and ReadModifyWriteRow.
    #[serde(rename_all = "camelCase")]
    SingleClusterRouting {
        cluster_id: String,
        #[serde(default)]
        allow_transactional_writes: bool,
    },
    /// Requests go to the nearest available cluster, failing over to another.
    #[serde(rename_all = "camelCase")]
    MultiClusterRoutingUseAny {
        /// Clusters to route to; empty means all of the instance's clusters.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        cluster_ids: Vec<String>,
        /// Pin each row key to one cluster.
        #[serde(default)]
        row_affinity: bool,
    },
}

/// Request priority (standard isolation).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum AppProfilePriority {
    #[default]
    High,
    Medium,
    Low,
}

impl AppProfileRecord {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("an app profile record always encodes")
    }
}

/// A cluster's autoscaling settings, `clusters/<c>/autoscaling`: recorded by the operator (or
/// the local runtime) from the Cluster's `spec.autoscaling` for the master's autoscaler;
/// absent for a cluster with a fixed `serveNodes`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AutoscalingRecord {
    pub min_serve_nodes: u32,
    pub max_serve_nodes: u32,
    /// The CPU utilization target, 10 to 80 (percent).
    pub cpu_utilization_percent: u32,
    /// The storage target per node, in bytes (the spec's GiB, or the storage type's default).
    pub storage_utilization_bytes_per_node: u64,
    /// What one node's volume holds (None: unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_capacity_bytes: Option<u64>,
}

impl AutoscalingRecord {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("an autoscaling record always encodes")
    }
}

/// The autoscaler's decision for a cluster, `clusters/<c>/autoscaler`: written by the master
/// (fenced by its term) and read by the cluster's lifecycle, which runs `nodes` servers and
/// reports the rest in the Cluster's status.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AutoscalerRecord {
    /// The nodes the cluster should run now.
    pub nodes: u32,
    /// What the newest sample recommends, within the bounds.
    pub recommended_nodes: u32,
    /// What the newest sample recommends, without the bounds (None: no sample yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wanted_nodes: Option<u32>,
    /// The dimension behind the recommendation: `cpu` or `storage`.
    pub dimension: String,
    /// The newest sample's inputs: the cluster's mean CPU utilization (a fraction of its
    /// allocation), the bytes it stores, the nodes it ran, and the nodes each dimension wants.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_utilization: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampled_nodes: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_nodes: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_nodes: Option<u32>,
    /// Why `nodes` is not what the load wants, if it is not: a reason in CamelCase
    /// (`MaxServeNodesReached`, `CoolingDown`, …) and a sentence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_message: Option<String>,
    /// Where the samples come from: `prometheus` or `servers` (their own reports over the
    /// control protocol), and why not Prometheus when it is not.
    pub source: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_message: Option<String>,
    /// When the autoscaler last changed the node count (Unix milliseconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_change_unix_ms: Option<i64>,
}

impl AutoscalerRecord {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("an autoscaler record always encodes")
    }
}

/// A tablet move in progress: `clusters/<c>/moves/<id>`. Created by the master before the
/// copy starts; deleted by the transaction that commits the move (owner to the destination,
/// epoch + 1) or by the one that aborts it — both compare this record, so exactly one wins.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MoveRecord {
    pub id: String,
    pub table: String,
    /// The tablet's first row (hex) and end (hex; None: to the table's end).
    pub start: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<String>,
    /// The tablet's epoch when the move started.
    pub epoch: u64,
    pub from: ServerId,
    pub to: ServerId,
    pub phase: MovePhase,
    /// Why the master moves it ("balance", "drain").
    pub reason: String,
    /// When the move started, microseconds since the epoch.
    pub started_micros: i64,
}

/// How far a move got.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum MovePhase {
    /// The destination copies the snapshot and catches up; the source serves.
    Copying,
    /// The tablet is fenced (state Fencing): nobody serves it until commit or abort.
    Fencing,
}

impl MoveRecord {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a move record always encodes")
    }

    /// The tablet's range.
    pub fn range(&self) -> Result<RowRange> {
        let bad = || Error::Internal(format!("move record {}: bad key", self.id));
        let start = unhex(&self.start).ok_or_else(bad)?;
        let end = match &self.end {
            Some(e) => Some(Bytes::from(unhex(e).ok_or_else(bad)?)),
            None => None,
        };
        Ok(RowRange::new(Bytes::from(start), end))
    }
}

/// One tablet's record: `clusters/<c>/tablets/<table>/<end>`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TabletRecord {
    /// The first row key (hex).
    pub start: String,
    pub owner: ServerId,
    pub epoch: u64,
    pub state: TabletState,
}

impl TabletRecord {
    pub fn of(tablet: &Tablet) -> TabletRecord {
        TabletRecord {
            start: hex(&tablet.range.start),
            owner: tablet.owner.clone(),
            epoch: tablet.epoch,
            state: tablet.state,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a tablet record always encodes")
    }
}

/// The key and value of `tablet` in `cluster`.
pub fn encode_tablet(keys: &Keys, cluster: &str, tablet: &Tablet) -> (String, Vec<u8>) {
    (
        keys.tablet(cluster, &tablet.table, tablet.range.end.as_deref()),
        TabletRecord::of(tablet).encode(),
    )
}

/// The tablet of a key and value under `clusters/<c>/tablets/`.
pub fn decode_tablet(keys: &Keys, key: &str, value: &[u8]) -> Result<(String, Tablet)> {
    let (cluster, table, end) = keys.parse_tablet(key)?;
    let record: TabletRecord = serde_json::from_slice(value)
        .map_err(|e| Error::Internal(format!("tablet record {key}: {e}")))?;
    let start = unhex(&record.start)
        .ok_or_else(|| Error::Internal(format!("tablet record {key}: bad start key")))?;
    Ok((
        cluster,
        Tablet {
            table,
            range: RowRange::new(Bytes::from(start), end),
            epoch: record.epoch,
            owner: record.owner,
            state: record.state,
        },
    ))
}

pub fn decode<T: serde::de::DeserializeOwned>(key: &str, value: &[u8]) -> Result<T> {
    serde_json::from_slice(value).map_err(|e| Error::Internal(format!("etcd key {key}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn app_profile_records_have_the_crd_shape() {
        let single = AppProfileRecord {
            id: "batch".into(),
            description: "nightly jobs".into(),
            routing: AppProfileRouting::SingleClusterRouting {
                cluster_id: "c1".into(),
                allow_transactional_writes: true,
            },
            priority: AppProfilePriority::Low,
        };
        assert_eq!(
            String::from_utf8(single.encode()).unwrap(),
            r#"{"id":"batch","description":"nightly jobs","routing":{"singleClusterRouting":{"clusterId":"c1","allowTransactionalWrites":true}},"priority":"Low"}"#
        );
        let any = AppProfileRecord {
            id: "default".into(),
            description: String::new(),
            routing: AppProfileRouting::MultiClusterRoutingUseAny {
                cluster_ids: vec![],
                row_affinity: false,
            },
            priority: AppProfilePriority::High,
        };
        assert_eq!(
            String::from_utf8(any.encode()).unwrap(),
            r#"{"id":"default","routing":{"multiClusterRoutingUseAny":{"rowAffinity":false}},"priority":"High"}"#
        );
        for r in [&single, &any] {
            assert_eq!(&decode::<AppProfileRecord>("k", &r.encode()).unwrap(), r);
        }
        // Defaults: no description, High priority, no transactional writes, every cluster.
        let minimal: AppProfileRecord = decode(
            "k",
            br#"{"id":"x","routing":{"singleClusterRouting":{"clusterId":"c2"}}}"#,
        )
        .unwrap();
        assert_eq!(minimal.priority, AppProfilePriority::High);
        assert_eq!(
            minimal.routing,
            AppProfileRouting::SingleClusterRouting {
                cluster_id: "c2".into(),
                allow_transactional_writes: false
            }
        );
        let any: AppProfileRecord = decode(
            "k",
            br#"{"id":"y","routing":{"multiClusterRoutingUseAny":{}}}"#,
        )
        .unwrap();
        assert_eq!(
            any.routing,
            AppProfileRouting::MultiClusterRoutingUseAny {
                cluster_ids: vec![],
                row_affinity: false
            }
        );
        assert!(decode::<AppProfileRecord>("k", br#"{"id":"z","routing":{}}"#).is_err());
    }

    #[test]
    fn tablets_round_trip_through_their_key_and_record() {
        let keys = Keys::new("ns", "i");
        for (start, end) in [("", Some("g")), ("g", Some("p\u{0}")), ("p", None)] {
            let t = Tablet {
                table: "orders".into(),
                range: RowRange::new(
                    Bytes::copy_from_slice(start.as_bytes()),
                    end.map(|e| Bytes::copy_from_slice(e.as_bytes())),
                ),
                epoch: 7,
                owner: "store-a".into(),
                state: TabletState::Lost,
            };
            let (key, value) = encode_tablet(&keys, "c1", &t);
            assert_eq!(
                decode_tablet(&keys, &key, &value).unwrap(),
                ("c1".into(), t)
            );
        }
        let v = br#"{"start":"67","owner":"s","epoch":1,"state":"serving"}"#;
        let (_, t) = decode_tablet(&keys, &keys.tablet("c1", "t", None), v).unwrap();
        assert_eq!(t.state, TabletState::Serving);
        assert_eq!(&t.range.start[..], b"g");
        assert!(decode_tablet(&keys, &keys.tablet("c1", "t", None), b"{}").is_err());
    }
}
