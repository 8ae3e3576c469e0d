//! The custom resources users declare: `Instance`, `Cluster`, `Table` and `AppProfile`
//! (group `basalt.dev`, version `v1alpha1`, namespaced).
//!
//! Field names follow Bigtable's admin API (and Config Connector where it has the field). The
//! OpenAPI constraints and CEL rules here are the static half of validation; the reconcilers run
//! the same checks (`crate::validate`) because API servers older than 1.25 ignore CEL.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Volume size per tablet server when a Cluster does not set `storageSize`.
pub const DEFAULT_STORAGE_SIZE: &str = "10Gi";

/// The API group of every Basalt resource.
pub const GROUP: &str = "basalt.dev";

/// Instance ids: `[a-z][a-z0-9-]+[a-z0-9]`, 6 to 33 characters (Bigtable's rule).
pub const INSTANCE_ID_PATTERN: &str = "^[a-z][-a-z0-9]{4,31}[a-z0-9]$";
/// Cluster ids: `[a-z][-a-z0-9]*`, 6 to 30 characters, ending in a letter or digit so the id is
/// also a valid Kubernetes object name.
pub const CLUSTER_ID_PATTERN: &str = "^[a-z][-a-z0-9]{4,28}[a-z0-9]$";
/// Table and app profile ids: `[_a-zA-Z0-9][-_.a-zA-Z0-9]*`, at most 50 characters.
pub const TABLE_ID_PATTERN: &str = "^[_a-zA-Z0-9][-_.a-zA-Z0-9]{0,49}$";
/// Column family names: `[-_.a-zA-Z0-9]+`, at most 64 characters.
pub const FAMILY_PATTERN: &str = "^[-_.a-zA-Z0-9]{1,64}$";
/// Durations as in `30s`, `90m`, `12h`, `7d`, `1h30m`, `500ms` (at least 1 ms).
pub const DURATION_PATTERN: &str = "^([0-9]+(ms|s|m|h|d))+$";

// ------------------------------------------------------------------------------ Instance

/// A Basalt instance: a set of clusters that replicate each other and hold the same tables and
/// app profiles. Clients reach it through the Service named in `status.endpoint`.
// `printcolumn(...)` repeats `type_ = ...` per column, which clippy mistakes for duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "basalt.dev",
    version = "v1alpha1",
    kind = "Instance",
    namespaced,
    status = "InstanceStatus",
    shortname = "bti",
    category = "basalt",
    doc = "A Basalt instance: clusters that replicate each other, holding tables and app profiles.",
    printcolumn(name = "Display name", type_ = "string", json_path = ".spec.displayName"),
    printcolumn(name = "Type", type_ = "string", json_path = ".spec.type"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Endpoint", type_ = "string", json_path = ".status.endpoint"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = Rule::new("self.metadata.name.size() >= 6 && self.metadata.name.size() <= 33 && self.metadata.name.matches('^[a-z][-a-z0-9]*[a-z0-9]$')").message("the Instance name is the Bigtable instance id: 6 to 33 characters, [a-z][-a-z0-9]*[a-z0-9]"),
)]
#[x_kube(
    validation = Rule::new("has(oldSelf.metadataStore) == has(self.metadataStore) && (!has(self.metadataStore) || self.metadataStore == oldSelf.metadataStore)").message("metadataStore is immutable: the tablet servers' tablet map and catalog live there"),
)]
#[serde(rename_all = "camelCase")]
pub struct InstanceSpec {
    /// Human-readable name, 4 to 30 characters (Bigtable's rule).
    #[schemars(length(min = 4, max = 30))]
    pub display_name: String,
    /// Production (the default) or Development.
    #[serde(default, rename = "type")]
    pub instance_type: InstanceType,
    /// Bigtable project id clients use in resource names (`projects/P/instances/I`).
    /// Defaults to the namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub project_id: Option<String>,
    /// Labels of the Bigtable instance (keys and values: up to 63 characters of
    /// `[a-z0-9_-]`, keys starting with a letter; at most 64 labels).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[x_kube(validation = Rule::new("self.size() <= 64").message("at most 64 labels"))]
    pub labels: BTreeMap<String, String>,
    /// While true, deleting the Instance is refused: it stays (with a DeletionBlocked
    /// condition) until this is set to false.
    #[serde(default)]
    pub deletion_protection: bool,
    /// An existing etcd to keep the instance's metadata in (tablet map, catalog, the master's
    /// election). Unset: the operator runs one for the instance, the StatefulSet
    /// `<instance>-meta` (3 members for Production, 1 for Development). Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata_store: Option<MetadataStore>,
}

/// Pattern of an etcd client URL: `http(s)://host:port`.
pub const ETCD_ENDPOINT_PATTERN: &str = "^https?://[A-Za-z0-9.-]+:[0-9]{1,5}$";

/// Where an instance's metadata lives when it is not the operator's own etcd.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(validation = Rule::new("self.endpoints.all(e, e.matches('^https?://[A-Za-z0-9.-]+:[0-9]{1,5}$'))").message("metadataStore.endpoints are etcd client URLs, http(s)://host:port"))]
#[serde(rename_all = "camelCase")]
pub struct MetadataStore {
    /// Client URLs of the etcd cluster, `http(s)://host:port` (at least one). Every instance
    /// keeps its keys under `/basalt/v1/<namespace>/<instance>/`, so instances may share one
    /// etcd.
    #[schemars(length(min = 1, max = 9))]
    pub endpoints: Vec<String>,
}

/// Bigtable's instance types.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum InstanceType {
    #[default]
    Production,
    Development,
}

/// What the operator observed of an Instance.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstanceStatus {
    /// Ready, Degraded and Progressing, each with a reason and message.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `projects/<project>/instances/<instance>`: the resource name clients use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_name: Option<String>,
    /// `host:port` of the client-facing Service (set `BIGTABLE_EMULATOR_HOST` to it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// The instance's clusters, in name order.
    #[serde(default)]
    pub clusters: Vec<InstanceClusterStatus>,
    /// The metadata store (etcd) the instance's tablet servers and master use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata_store: Option<MetadataStoreStatus>,
}

/// The metadata store an Instance uses, as the operator set it up.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetadataStoreStatus {
    /// The etcd client URLs the tablet servers are given.
    #[serde(default)]
    pub endpoints: Vec<String>,
    /// True for an etcd named in `spec.metadataStore` (not run by the operator).
    #[serde(default)]
    pub external: bool,
    /// Members of the operator's etcd StatefulSet (unset for an external etcd).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub members: Option<i32>,
    /// Members that are ready (unset for an external etcd).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_members: Option<i32>,
}

/// One cluster as its Instance sees it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstanceClusterStatus {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    pub serve_nodes: i32,
    pub ready_nodes: i32,
    pub ready: bool,
}

// ------------------------------------------------------------------------------- Cluster

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
}

/// Autoscaling bounds and targets (Bigtable's cluster autoscaling).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new("self.minServeNodes <= self.maxServeNodes").message("minServeNodes must not exceed maxServeNodes"))]
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

// --------------------------------------------------------------------------------- Table

/// A table of an instance, declared. The operator creates it and its column families through
/// the table admin API; tables created by clients directly need no Table resource.
// `printcolumn(...)` repeats `type_ = ...` per column, which clippy mistakes for duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "basalt.dev",
    version = "v1alpha1",
    kind = "Table",
    namespaced,
    status = "TableStatus",
    shortname = "btt",
    category = "basalt",
    doc = "A table of a Basalt instance, with its column families and GC rules.",
    printcolumn(name = "Instance", type_ = "string", json_path = ".spec.instanceRef"),
    printcolumn(name = "Table", type_ = "string", json_path = ".status.tableId"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(
    validation = Rule::new("self.instanceRef == oldSelf.instanceRef").message("instanceRef is immutable"),
    validation = Rule::new("has(oldSelf.tableId) == has(self.tableId) && (!has(self.tableId) || self.tableId == oldSelf.tableId)").message("tableId is immutable"),
    validation = Rule::new("self.initialSplits == oldSelf.initialSplits").message("initialSplits only apply when the table is created and cannot change"),
)]
#[serde(rename_all = "camelCase")]
pub struct TableSpec {
    /// Name of the Instance (same namespace). Immutable.
    #[schemars(length(min = 1))]
    pub instance_ref: String,
    /// Bigtable table id (`[_a-zA-Z0-9][-_.a-zA-Z0-9]*`, at most 50 characters). Defaults to
    /// the resource's name. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[_a-zA-Z0-9][-_.a-zA-Z0-9]{0,49}$"))]
    pub table_id: Option<String>,
    /// Column families by name, each with an optional GC rule and aggregate value type.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self.all(k, k.matches('^[-_.a-zA-Z0-9]{1,64}$'))").message("column family names are 1 to 64 characters of [-_.a-zA-Z0-9]"))]
    pub column_families: BTreeMap<String, ColumnFamily>,
    /// Row keys at which the table is split into tablets when it is created.
    #[serde(default)]
    pub initial_splits: Vec<String>,
    /// Timestamp granularity; only Millis exists.
    #[serde(default)]
    pub granularity: Granularity,
    /// Refuse DeleteTable (and dropping the table through this resource) while true.
    #[serde(default)]
    pub deletion_protection: bool,
    /// What deleting this resource does to the table: Retain (the default) leaves the table
    /// and its data; Delete drops the table.
    #[serde(default)]
    pub deletion_policy: DeletionPolicy,
    /// What happens to column families the instance has but the spec does not list: Retain
    /// (the default) leaves them; Delete drops them and their data.
    #[serde(default)]
    pub column_family_deletion_policy: DeletionPolicy,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(validation = Rule::new("!has(oldSelf.valueType) || (has(self.valueType) && self.valueType == oldSelf.valueType)").message("valueType is immutable"))]
#[serde(rename_all = "camelCase")]
pub struct ColumnFamily {
    /// Garbage-collection rule. Unset: keep every version forever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gc_rule: Option<GcRule>,
    /// Aggregate value type: the family holds counters written with AddToCell/MergeToCell.
    /// Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_type: Option<ValueType>,
}

/// A GC rule: exactly one of `maxAge`, `maxNumVersions`, `union`, `intersection`. Rules nest
/// two levels deep here (`union` of `intersection`s of leaves, and so on).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(validation = Rule::new("[has(self.maxAge), has(self.maxNumVersions), has(self.union), has(self.intersection)].filter(x, x).size() == 1").message("a GC rule sets exactly one of maxAge, maxNumVersions, union, intersection"))]
#[serde(rename_all = "camelCase")]
pub struct GcRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h|d))+$"))]
    pub max_age: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_num_versions: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub union: Option<Vec<GcRuleNested>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intersection: Option<Vec<GcRuleNested>>,
}

/// A GC rule inside a union or intersection.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(validation = Rule::new("[has(self.maxAge), has(self.maxNumVersions), has(self.union), has(self.intersection)].filter(x, x).size() == 1").message("a GC rule sets exactly one of maxAge, maxNumVersions, union, intersection"))]
#[serde(rename_all = "camelCase")]
pub struct GcRuleNested {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h|d))+$"))]
    pub max_age: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_num_versions: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub union: Option<Vec<GcRuleLeaf>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intersection: Option<Vec<GcRuleLeaf>>,
}

/// The innermost GC rule: an age or a version count.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(validation = Rule::new("has(self.maxAge) != has(self.maxNumVersions)").message("set exactly one of maxAge and maxNumVersions"))]
#[serde(rename_all = "camelCase")]
pub struct GcRuleLeaf {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h|d))+$"))]
    pub max_age: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_num_versions: Option<i32>,
}

/// The value type of an aggregate column family.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ValueType {
    /// The aggregate over Int64 (big-endian) inputs.
    pub aggregate: Aggregate,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Aggregate {
    Sum,
    Min,
    Max,
    HyperLogLogPlusPlusUniqueCount,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum Granularity {
    #[default]
    Millis,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum DeletionPolicy {
    #[default]
    Retain,
    Delete,
}

/// What the operator observed of a Table.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TableStatus {
    #[serde(default)]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The table id in the instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table_id: Option<String>,
    /// `projects/P/instances/I/tables/T`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_name: Option<String>,
    /// The column families the instance really has, with their GC rules and value types as
    /// the instance reports them.
    #[serde(default)]
    pub column_families: BTreeMap<String, ColumnFamily>,
    /// Deletion protection as the instance reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_protection: Option<bool>,
}

// ---------------------------------------------------------------------------- AppProfile

impl AppProfile {
    /// The app profile id clients send: `spec.appProfileId`, else the resource's name.
    pub fn app_profile_id(&self) -> String {
        self.spec
            .app_profile_id
            .clone()
            .unwrap_or_else(|| self.metadata.name.clone().unwrap_or_default())
    }
}

/// How an application's requests are routed to an instance's clusters.
// `printcolumn(...)` repeats `type_ = ...` per column, which clippy mistakes for duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "basalt.dev",
    version = "v1alpha1",
    kind = "AppProfile",
    namespaced,
    status = "AppProfileStatus",
    shortname = "btap",
    category = "basalt",
    doc = "An app profile: how requests that name it are routed to the instance's clusters.",
    printcolumn(name = "Instance", type_ = "string", json_path = ".spec.instanceRef"),
    printcolumn(name = "Priority", type_ = "string", json_path = ".spec.priority"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(validation = Rule::new("self.instanceRef == oldSelf.instanceRef").message("instanceRef is immutable"))]
#[serde(rename_all = "camelCase")]
pub struct AppProfileSpec {
    /// Name of the Instance (same namespace). Immutable.
    #[schemars(length(min = 1))]
    pub instance_ref: String,
    /// The app profile id clients send (`[_a-zA-Z0-9][-_.a-zA-Z0-9]*`, at most 50
    /// characters). Defaults to the resource's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[_a-zA-Z0-9][-_.a-zA-Z0-9]{0,49}$"))]
    pub app_profile_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub routing: Routing,
    /// Request priority (standard isolation): High (the default), Medium or Low.
    #[serde(default)]
    pub priority: Priority,
}

/// Exactly one routing policy.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(validation = Rule::new("has(self.singleClusterRouting) != has(self.multiClusterRoutingUseAny)").message("set exactly one of singleClusterRouting and multiClusterRoutingUseAny"))]
#[serde(rename_all = "camelCase")]
pub struct Routing {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub single_cluster_routing: Option<SingleClusterRouting>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multi_cluster_routing_use_any: Option<MultiClusterRoutingUseAny>,
}

/// Every request goes to one cluster; the only policy that may allow CheckAndMutateRow and
/// ReadModifyWriteRow.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SingleClusterRouting {
    pub cluster_id: String,
    #[serde(default)]
    pub allow_transactional_writes: bool,
}

/// Requests go to the nearest available cluster, failing over to another.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MultiClusterRoutingUseAny {
    /// Clusters to route to; empty means all of the instance's clusters.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cluster_ids: Vec<String>,
    /// Pin each row key to one cluster (read-your-writes in most cases).
    #[serde(default)]
    pub row_affinity: bool,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum Priority {
    #[default]
    High,
    Medium,
    Low,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppProfileStatus {
    #[serde(default)]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The app profile id clients send.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_profile_id: Option<String>,
}

/// The four CRDs, in the order `crds/` holds them.
pub fn all_crds()
-> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>
{
    use kube::CustomResourceExt;
    vec![
        Instance::crd(),
        Cluster::crd(),
        Table::crd(),
        AppProfile::crd(),
    ]
}

/// The CRDs as checked in under `crds/`: (file name, YAML).
pub fn crd_files() -> Result<Vec<(String, String)>, serde_norway::Error> {
    all_crds()
        .into_iter()
        .map(|crd| {
            let file = format!("{}.yaml", crd.metadata.name.as_deref().unwrap_or("crd"));
            let yaml = serde_norway::to_string(&crd)?;
            Ok((
                file,
                format!("# Generated by `basalt-operator crd --out crds`; do not edit.\n{yaml}"),
            ))
        })
        .collect()
}
