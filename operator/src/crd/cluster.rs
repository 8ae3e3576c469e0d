//! The `Cluster` resource: one cluster of an instance (tablet servers in one zone on one
//! storage type), its size or autoscaling bounds, its pod overrides and its status (nodes,
//! tablets, a scale-in under way).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Volume size per tablet server when a Cluster does not set `storageSize`.
pub const DEFAULT_STORAGE_SIZE: &str = "10Gi";

/// A cluster of an instance: tablet servers in one zone on one storage type. Its name is the
/// Bigtable cluster id.
// `printcolumn(...)` repeats `type_ = ...` per column, which clippy mistakes for duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "basalt.dev",
    version = "v1alpha1",
    kind = "Cluster",
    namespaced,
    status = "ClusterStatus",
    shortname = "btc",
    category = "basalt",
    doc = "A cluster of a Basalt instance: tablet servers in one zone on one storage type.",
    scale(
        spec_replicas_path = ".spec.serveNodes",
        status_replicas_path = ".status.serveNodes",
        label_selector_path = ".status.selector"
    ),
    printcolumn(name = "Instance", type_ = "string", json_path = ".spec.instanceRef"),
    printcolumn(name = "Location", type_ = "string", json_path = ".spec.location"),
    printcolumn(name = "Storage", type_ = "string", json_path = ".spec.storageType"),
    printcolumn(name = "Nodes", type_ = "integer", json_path = ".status.serveNodes"),
    printcolumn(name = "Ready nodes", type_ = "integer", json_path = ".status.readyNodes"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = Rule::new("self.metadata.name.size() >= 6 && self.metadata.name.size() <= 30 && self.metadata.name.matches('^[a-z][-a-z0-9]*[a-z0-9]$')").message("the Cluster name is the Bigtable cluster id: 6 to 30 characters, [a-z][-a-z0-9]*[a-z0-9]"),
)]
#[x_kube(
    validation = Rule::new("has(self.serveNodes) != has(self.autoscaling)").message("set exactly one of serveNodes and autoscaling"),
    validation = Rule::new("has(oldSelf.location) == has(self.location) && (!has(self.location) || self.location == oldSelf.location)").message("location is immutable"),
    validation = Rule::new("self.storageType == oldSelf.storageType").message("storageType is immutable: create a new cluster to change it"),
    validation = Rule::new("self.instanceRef == oldSelf.instanceRef").message("instanceRef is immutable"),
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSpec {
    /// Name of the Instance (same namespace) this cluster belongs to. Immutable.
    #[schemars(length(min = 1))]
    pub instance_ref: String,
    /// Zone (`topology.kubernetes.io/zone`) the tablet servers must run in. Immutable.
    /// Unset: any zone, spread over nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// Number of tablet servers (nodes). Exclusive with `autoscaling`; the scale subresource
    /// (`kubectl scale`, HorizontalPodAutoscaler) sets it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub serve_nodes: Option<i32>,
    /// Let the operator choose the node count between the bounds from CPU and storage use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<Autoscaling>,
    /// SSD (the default) or HDD. Immutable.
    #[serde(default)]
    pub storage_type: StorageType,
    /// StorageClass of the tablet servers' volumes. Unset: the operator's class for the
    /// storage type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
    /// Size of each tablet server's volume (default 10Gi).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_size: Option<Quantity>,
    /// What happens to the volumes when the Cluster is deleted: Retain (the default) keeps
    /// them and their data; Delete removes them.
    #[serde(default)]
    pub volume_reclaim_policy: VolumeReclaimPolicy,
    /// Tablet server image. Unset: the operator's default image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// CPU and memory of each tablet server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Overrides merged into the tablet servers' pod template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_template: Option<PodTemplateOverrides>,
    /// `host:port` at which the other Clusters of the instance reach this one (replication, a
    /// DropRowRange): a gateway or a LoadBalancer Service in front of this Cluster's tablet
    /// servers' gRPC port, when the Clusters live in different networks. Unset: they dial
    /// this Cluster's servers at their own addresses (pod IPs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[-.a-zA-Z0-9]+:[0-9]{1,5}$"))]
    pub peer_endpoint: Option<String>,
}

/// Autoscaling bounds and targets (Bigtable's cluster autoscaling): the operator's autoscaler
/// sets the node count within the bounds from CPU and storage use (docs/autoscaling.md).
/// Exclusive with `serveNodes`, so with an external autoscaler (HPA, KEDA, `kubectl scale`:
/// they set `serveNodes` through the scale subresource) too.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(
    validation = Rule::new("self.minServeNodes <= self.maxServeNodes").message("minServeNodes must not exceed maxServeNodes"),
    validation = Rule::new("self.maxServeNodes <= 10 * self.minServeNodes").message("maxServeNodes must be at most 10 times minServeNodes, as on Bigtable"),
)]
#[serde(rename_all = "camelCase")]
pub struct Autoscaling {
    #[schemars(range(min = 1, max = 1000))]
    pub min_serve_nodes: i32,
    #[schemars(range(min = 1, max = 1000))]
    pub max_serve_nodes: i32,
    /// Target average CPU utilisation, 10 to 80 percent.
    #[schemars(range(min = 10, max = 80))]
    pub cpu_utilization_percent: i32,
    /// Target storage per node in GiB (SSD 2560–5120, HDD 8192–16384 on Bigtable; any
    /// positive value here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub storage_utilization_gib_per_node: Option<i32>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum StorageType {
    #[default]
    #[serde(rename = "SSD")]
    Ssd,
    #[serde(rename = "HDD")]
    Hdd,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum VolumeReclaimPolicy {
    #[default]
    Retain,
    Delete,
}

/// The parts of the tablet servers' pod template a user may override.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodTemplateOverrides {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
    /// Seconds a tablet server gets to finish in-flight requests and flush (default 60).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub termination_grace_period_seconds: Option<i64>,
}

/// What the operator observed of a Cluster.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    #[serde(default)]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Tablet servers the StatefulSet runs (the scale subresource's replicas).
    #[serde(default)]
    pub serve_nodes: i32,
    /// Tablet servers that are ready.
    #[serde(default)]
    pub ready_nodes: i32,
    /// Label selector of the tablet server pods (the scale subresource's selector).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// The StorageClass the volumes use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
    /// Tablets the cluster's tablet servers serve (their status over the control protocol).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tablets: Option<i64>,
    /// Bytes the tablet servers store (SST files and memtables; their status over the control protocol).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_used_bytes: Option<i64>,
    /// The tablets each tablet server owns, from the cluster's tablet map in the metadata store
    /// (every registered server, and every owner of a tablet), by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<ClusterNodeStatus>,
    /// A scale-in in progress (the spec asks for fewer tablet servers than run): the leaving
    /// servers hand their tablets to the others, then their pods stop. Absent when none is in
    /// progress (raising `serveNodes` back cancels it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_in: Option<ClusterScaleInStatus>,
    /// With `spec.autoscaling`: the autoscaler's last decision and what it was made of (the
    /// `ScalingActive` and `ScalingLimited` conditions say what holds it back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaler: Option<ClusterAutoscalerStatus>,
}

/// The autoscaler's decision for a Cluster, as the instance's master recorded it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterAutoscalerStatus {
    /// The nodes the autoscaler decided the cluster runs.
    pub nodes: i32,
    /// What the newest sample of the load recommends, within the bounds.
    pub recommended_nodes: i32,
    /// The dimension behind the recommendation: `cpu` or `storage` (the larger wins).
    pub dimension: String,
    /// The newest sample: the cluster's mean CPU utilization in percent of its allocation…
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_utilization_percent: Option<i32>,
    /// …the bytes it stores…
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored_bytes: Option<i64>,
    /// …and the nodes each dimension wants, without the bounds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_nodes: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_nodes: Option<i32>,
    /// Where the samples come from: `prometheus`, or `servers` (their own reports).
    pub source: String,
    /// When the autoscaler last changed the node count (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale_time: Option<String>,
}

/// A scale-in in progress: what it goes from and to, and what is left.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterScaleInStatus {
    /// Tablet servers that ran when the scale-in began.
    pub from_nodes: i32,
    /// Tablet servers the spec asks for.
    pub to_nodes: i32,
    /// The pods of the leaving servers (the highest ordinals) that still run.
    #[serde(default)]
    pub draining_nodes: Vec<String>,
    /// Tablets the leaving servers still own, or that move to or from them (from the tablet
    /// map in the metadata store; unset while it has not been read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remaining_tablets: Option<i64>,
}

/// One tablet server of a cluster and the tablets it owns.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterNodeStatus {
    /// The server's name (its pod), or its store id when no live server has that store.
    pub name: String,
    /// The store id of its data directory: what tablets are owned by.
    pub store_id: String,
    /// Whether the server is registered (alive, holding its lease).
    pub registered: bool,
    /// Tablets it owns (every table, lost ones included).
    pub tablets: i64,
    /// Of those, tablets whose data is lost (state `lost` in the tablet map).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub lost_tablets: i64,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}
