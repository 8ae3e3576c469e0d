//! The `AppProfile` resource: how requests that name it are routed to the instance's
//! clusters, and its status.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

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
    /// The clusters its requests go to now, the preferred first (a multi-cluster profile's
    /// available clusters; a server of one of them serves its own requests first).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes_to: Vec<String>,
    /// The clusters it names that are not available now (no live server, or being seeded).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unavailable_clusters: Vec<String>,
}
