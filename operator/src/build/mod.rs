//! The Kubernetes objects a Cluster and an Instance need, built without a client: pure
//! functions from specs (and the operator's configuration) to desired objects, applied by the
//! controllers with server-side apply.
//!
//! One file per resource kind: [`statefulset`] (the tablet servers, their pods and volume
//! claims), [`service`] (a cluster's headless Service, an instance's client Service),
//! [`pdb`] (a cluster's PodDisruptionBudget) and [`config_map`] (an instance's identity,
//! mounted in its tablet servers); [`etcd`] builds an instance's metadata store (its etcd
//! StatefulSet, headless Service and PodDisruptionBudget). This module holds what they share:
//! names, labels and selectors, the operator's configuration, and the two sets the
//! controllers apply ([`cluster_objects`], [`instance_objects`]).

pub mod config_map;
pub mod etcd;
pub mod network_policy;
pub mod pdb;
pub mod secrets;
pub mod service;
pub mod statefulset;
pub mod token_review;

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;

use crate::crd::{Cluster, Instance};

pub use etcd::MetadataStoreObjects;
pub use statefulset::{block_cache_mib, desired_serve_nodes, storage_class};

/// The port clients use (the Bigtable emulator's, so `BIGTABLE_EMULATOR_HOST` works).
pub const GRPC_PORT: i32 = 8086;
/// The tablet servers' HTTP port: `/metrics`, `/healthz`, `/readyz`.
pub const HTTP_PORT: i32 = 8087;
/// Where a tablet server's volume is mounted; RocksDB lives in `data/` below it.
pub const DATA_MOUNT: &str = "/var/lib/basalt";
/// Where the instance's ConfigMap (its identity, `instance.json`) is mounted.
pub const CONFIG_MOUNT: &str = "/etc/basalt";
/// The tablet servers' grace period when the Cluster does not set one.
pub const DEFAULT_GRACE_SECONDS: i64 = 60;

pub const LABEL_NAME: &str = "app.kubernetes.io/name";
pub const LABEL_INSTANCE: &str = "app.kubernetes.io/instance";
pub const LABEL_COMPONENT: &str = "app.kubernetes.io/component";
pub const LABEL_PART_OF: &str = "app.kubernetes.io/part-of";
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const LABEL_BASALT_INSTANCE: &str = "basalt.dev/instance";
pub const LABEL_BASALT_CLUSTER: &str = "basalt.dev/cluster";
/// On a StatefulSet: the storage type it was created with (immutable).
pub const LABEL_STORAGE_TYPE: &str = "basalt.dev/storage-type";
/// On a StatefulSet: the zone it was created for ("" for any).
pub const ANNOTATION_LOCATION: &str = "basalt.dev/location";
/// The field manager of everything the operator applies.
pub const FIELD_MANAGER: &str = "basalt-operator";

/// The etcd image of instances' metadata stores unless the operator is told otherwise.
pub const DEFAULT_ETCD_IMAGE: &str = "registry.k8s.io/etcd:3.5.21-0";

/// Operator-wide settings that shape the objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorConfig {
    pub tablet_server_image: String,
    pub ssd_storage_class: String,
    pub hdd_storage_class: String,
    /// Image of the instances' metadata stores (etcd).
    pub etcd_image: String,
    /// StorageClass of the metadata stores' volumes; None: `ssd_storage_class`.
    pub etcd_storage_class: Option<String>,
    /// Some: every metadata store gets a NetworkPolicy ([`network_policy`]) admitting the
    /// operator's pods from this namespace (the operator's own).
    pub network_policy_operator_namespace: Option<String>,
    /// The ClusterRole allowing `tokenreviews` create (the chart's token reviewer) that the
    /// operator binds the tablet servers of instances reviewing ServiceAccount tokens to
    /// ([`token_review`]); None: it binds nothing (the user grants it).
    pub token_reviewer_cluster_role: Option<String>,
}

impl Default for OperatorConfig {
    fn default() -> Self {
        Self {
            tablet_server_image: format!(
                "basalt/basalt-tablet-server:{}",
                env!("CARGO_PKG_VERSION")
            ),
            ssd_storage_class: "ssd".into(),
            hdd_storage_class: "hdd".into(),
            etcd_image: DEFAULT_ETCD_IMAGE.into(),
            etcd_storage_class: None,
            network_policy_operator_namespace: None,
            token_reviewer_cluster_role: None,
        }
    }
}

/// Labels every object of an instance carries.
pub fn instance_labels(instance: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_NAME.into(), "basalt".into()),
        (LABEL_INSTANCE.into(), instance.into()),
        (LABEL_PART_OF.into(), "basalt".into()),
        (LABEL_MANAGED_BY.into(), FIELD_MANAGER.into()),
        (LABEL_BASALT_INSTANCE.into(), instance.into()),
    ])
}

/// Selects the tablet servers of one cluster (stable: a StatefulSet's selector is immutable).
pub fn cluster_selector(cluster: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_NAME.into(), "basalt".into()),
        (LABEL_COMPONENT.into(), "tablet-server".into()),
        (LABEL_BASALT_CLUSTER.into(), cluster.into()),
    ])
}

/// Selects every tablet server of an instance.
pub fn instance_selector(instance: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_NAME.into(), "basalt".into()),
        (LABEL_COMPONENT.into(), "tablet-server".into()),
        (LABEL_BASALT_INSTANCE.into(), instance.into()),
    ])
}

/// `k=v,k=v` for label selectors in list calls and the scale subresource.
pub fn selector_string(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

pub fn statefulset_name(cluster: &str) -> String {
    cluster.to_string()
}

pub fn headless_service_name(cluster: &str) -> String {
    format!("{cluster}-nodes")
}

pub fn instance_service_name(instance: &str) -> String {
    instance.to_string()
}

/// The name of an instance's metadata store: its etcd StatefulSet, headless Service and
/// PodDisruptionBudget ([`etcd`]).
pub fn metadata_store_name(instance: &str) -> String {
    format!("{instance}-meta")
}

pub fn instance_config_map_name(instance: &str) -> String {
    format!("{instance}-config")
}

/// The etcd client URLs an instance's tablet servers are given: what its status says the
/// instance uses, else what it will use (`spec.metadataStore.endpoints`, or the members of the
/// operator's store for its type).
pub fn instance_etcd_endpoints(instance: &Instance) -> Vec<String> {
    instance
        .status
        .as_ref()
        .and_then(|s| s.metadata_store.as_ref())
        .map(|s| s.endpoints.clone())
        .filter(|e| !e.is_empty())
        .unwrap_or_else(|| {
            etcd::client_urls(instance, etcd::members_for(instance.spec.instance_type))
        })
}

/// The project id of an instance's resource names (spec.projectId, else the namespace).
pub fn project_id(instance: &Instance) -> String {
    instance
        .spec
        .project_id
        .clone()
        .unwrap_or_else(|| instance.metadata.namespace.clone().unwrap_or_default())
}

fn meta(name: String, namespace: &str, labels: BTreeMap<String, String>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some(namespace.to_string()),
        labels: Some(labels),
        ..ObjectMeta::default()
    }
}

/// The controller owner reference to `owner`: what it owns is garbage-collected with it.
fn owned_by<K: Resource<DynamicType = ()>>(owner: &K) -> Vec<OwnerReference> {
    owner.controller_owner_ref(&()).into_iter().collect()
}

/// A cluster's name and namespace, and the labels all its objects carry (the instance's and
/// the cluster's selector).
fn cluster_identity(cluster: &Cluster) -> (String, String, BTreeMap<String, String>) {
    let name = cluster.metadata.name.clone().unwrap_or_default();
    let namespace = cluster.metadata.namespace.clone().unwrap_or_default();
    let mut labels = instance_labels(&cluster.spec.instance_ref);
    labels.extend(cluster_selector(&name));
    (name, namespace, labels)
}

/// The objects of one cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterObjects {
    pub statefulset: StatefulSet,
    pub headless_service: Service,
    pub pod_disruption_budget: PodDisruptionBudget,
}

/// Builds a cluster's StatefulSet, headless Service and PodDisruptionBudget. The tablet
/// servers run in cluster mode against `instance`'s metadata store.
///
/// `replicas` is the StatefulSet's replica count as the Cluster's validation decided it: the
/// requested count ([`desired_serve_nodes`]), kept higher while a scale-in drains the servers
/// it stops (`controller::cluster::validate::shrink_floor`). It is passed in rather than the
/// validated Cluster itself because builders do not depend on the controllers. Every object
/// goes in the Cluster's namespace.
pub fn cluster_objects(
    cluster: &Cluster,
    instance: &Instance,
    config: &OperatorConfig,
    replicas: i32,
) -> ClusterObjects {
    ClusterObjects {
        statefulset: statefulset::statefulset(cluster, instance, config, replicas),
        headless_service: service::headless_service(cluster),
        pod_disruption_budget: pdb::pod_disruption_budget(cluster),
    }
}

/// The objects of one instance.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceObjects {
    pub service: Service,
    pub config_map: ConfigMap,
    /// The operator's etcd for the instance (None when the spec names an existing one).
    pub metadata_store: Option<MetadataStoreObjects>,
}

/// Builds the client-facing Service, the ConfigMap published to the tablet servers and the
/// metadata store with `etcd_members` members.
pub fn instance_objects(
    instance: &Instance,
    config: &OperatorConfig,
    etcd_members: i32,
) -> InstanceObjects {
    InstanceObjects {
        service: service::instance_service(instance),
        config_map: config_map::instance_config_map(instance),
        metadata_store: etcd::metadata_store_objects(instance, config, etcd_members).map(
            |mut store| {
                store.network_policy = config
                    .network_policy_operator_namespace
                    .as_deref()
                    .map(|ns| network_policy::metadata_store_network_policy(instance, ns));
                store
            },
        ),
    }
}
