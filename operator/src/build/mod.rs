//! The Kubernetes objects a Cluster and an Instance need, built without a client: pure
//! functions from specs (and the operator's configuration) to desired objects, applied by the
//! controllers with server-side apply.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec, StatefulSetUpdateStrategy};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EnvVar,
    EnvVarSource, HTTPGetAction, NodeAffinity, NodeSelector, NodeSelectorRequirement,
    NodeSelectorTerm, ObjectFieldSelector, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PodAffinityTerm, PodAntiAffinity, PodSecurityContext, PodSpec, PodTemplateSpec, Probe,
    ResourceRequirements, SeccompProfile, SecurityContext, Service, ServicePort, ServiceSpec,
    TopologySpreadConstraint, Volume, VolumeMount, VolumeResourceRequirements,
    WeightedPodAffinityTerm,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Resource;
use serde::Serialize;

use crate::crd::{AppProfile, Cluster, Instance, StorageType};

/// The port clients use (the Bigtable emulator's, so `BIGTABLE_EMULATOR_HOST` works).
pub const GRPC_PORT: i32 = 8086;
/// The tablet servers' HTTP port: `/metrics`, `/healthz`, `/readyz`.
pub const HTTP_PORT: i32 = 8087;
/// Where a tablet server's volume is mounted; RocksDB lives in `data/` below it.
pub const DATA_MOUNT: &str = "/var/lib/basalt";
/// Where the instance's configuration (app profiles) is mounted.
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

/// Operator-wide settings that shape the objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorConfig {
    pub tablet_server_image: String,
    pub ssd_storage_class: String,
    pub hdd_storage_class: String,
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

pub fn instance_config_map_name(instance: &str) -> String {
    format!("{instance}-config")
}

/// The tablet server's block cache for a pod with these resources, in MiB: a quarter of the
/// memory limit (or, without a limit, of the request), at least 16 MiB, leaving the rest for
/// memtables, request buffers and the operating system's page cache. None without a memory
/// figure: the server's default applies.
pub fn block_cache_mib(resources: Option<&ResourceRequirements>) -> Option<u64> {
    let r = resources?;
    let memory = r
        .limits
        .as_ref()
        .and_then(|l| l.get("memory"))
        .or_else(|| r.requests.as_ref().and_then(|l| l.get("memory")))?;
    let bytes = crate::quantity::parse_quantity_bytes(&memory.0)?;
    Some((bytes / 4 / (1 << 20)).max(16))
}

/// The node count a cluster should run: `serveNodes`, or with autoscaling the current count
/// kept within the bounds (the minimum to start with).
pub fn desired_serve_nodes(cluster: &Cluster, current: Option<i32>) -> i32 {
    match (&cluster.spec.serve_nodes, &cluster.spec.autoscaling) {
        (Some(n), _) => *n,
        (None, Some(a)) => current
            .unwrap_or(a.min_serve_nodes)
            .clamp(a.min_serve_nodes, a.max_serve_nodes),
        (None, None) => 1,
    }
}

pub fn storage_class(cluster: &Cluster, config: &OperatorConfig) -> String {
    cluster
        .spec
        .storage_class_name
        .clone()
        .unwrap_or_else(|| match cluster.spec.storage_type {
            StorageType::Ssd => config.ssd_storage_class.clone(),
            StorageType::Hdd => config.hdd_storage_class.clone(),
        })
}

/// The objects of one cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterObjects {
    pub statefulset: StatefulSet,
    pub headless_service: Service,
    pub pod_disruption_budget: PodDisruptionBudget,
}

fn meta(name: String, namespace: &str, labels: BTreeMap<String, String>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some(namespace.to_string()),
        labels: Some(labels),
        ..ObjectMeta::default()
    }
}

fn env_from_field(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                ..ObjectFieldSelector::default()
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

fn http_probe(path: &str, period: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("http".into()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        timeout_seconds: Some(3),
        ..Probe::default()
    }
}

fn ports() -> Vec<ServicePort> {
    vec![
        ServicePort {
            name: Some("grpc".into()),
            // Server-side apply needs the list key (port, protocol) complete: API servers
            // before 1.21 do not default it and refuse the patch.
            protocol: Some("TCP".into()),
            port: GRPC_PORT,
            target_port: Some(IntOrString::String("grpc".into())),
            app_protocol: Some("kubernetes.io/h2c".into()),
            ..ServicePort::default()
        },
        ServicePort {
            name: Some("http".into()),
            protocol: Some("TCP".into()),
            port: HTTP_PORT,
            target_port: Some(IntOrString::String("http".into())),
            ..ServicePort::default()
        },
    ]
}

/// Builds a cluster's StatefulSet, headless Service and PodDisruptionBudget.
///
/// `current_nodes` is the StatefulSet's current replica count (autoscaled clusters keep it
/// within bounds). `namespace` is the Cluster's.
pub fn cluster_objects(
    cluster: &Cluster,
    config: &OperatorConfig,
    current_nodes: Option<i32>,
) -> ClusterObjects {
    let name = cluster.metadata.name.clone().unwrap_or_default();
    let namespace = cluster.metadata.namespace.clone().unwrap_or_default();
    let instance = &cluster.spec.instance_ref;
    let spec = &cluster.spec;
    let overrides = spec.pod_template.clone().unwrap_or_default();
    let owner = cluster
        .controller_owner_ref(&())
        .into_iter()
        .collect::<Vec<_>>();
    let selector = cluster_selector(&name);

    let mut labels = instance_labels(instance);
    labels.extend(selector.clone());

    let mut pod_labels = overrides.labels.clone();
    pod_labels.extend(labels.clone());

    let grace = overrides
        .termination_grace_period_seconds
        .unwrap_or(DEFAULT_GRACE_SECONDS);
    // The server's own drain deadline leaves a margin before the kubelet's SIGKILL.
    let shutdown_secs = (grace - 5).max(1);
    let container = Container {
        name: "tablet-server".into(),
        image: Some(
            spec.image
                .clone()
                .unwrap_or_else(|| config.tablet_server_image.clone()),
        ),
        args: Some(
            [
                "--standalone".into(),
                format!("--data-dir={DATA_MOUNT}/data"),
                format!("--listen=0.0.0.0:{GRPC_PORT}"),
                format!("--http-listen=0.0.0.0:{HTTP_PORT}"),
                format!("--cluster-id={name}"),
                "--log-format=json".into(),
                format!("--shutdown-timeout-secs={shutdown_secs}"),
            ]
            .into_iter()
            .chain(
                block_cache_mib(spec.resources.as_ref())
                    .map(|mib| format!("--block-cache-mib={mib}")),
            )
            .collect(),
        ),
        env: Some(vec![
            env_from_field("POD_NAME", "metadata.name"),
            env_from_field("POD_NAMESPACE", "metadata.namespace"),
            EnvVar {
                name: "BASALT_INSTANCE".into(),
                value: Some(instance.clone()),
                ..EnvVar::default()
            },
        ]),
        ports: Some(vec![
            ContainerPort {
                name: Some("grpc".into()),
                protocol: Some("TCP".into()),
                container_port: GRPC_PORT,
                ..ContainerPort::default()
            },
            ContainerPort {
                name: Some("http".into()),
                protocol: Some("TCP".into()),
                container_port: HTTP_PORT,
                ..ContainerPort::default()
            },
        ]),
        // RocksDB recovery after a crash replays the WAL: give startup time before liveness.
        startup_probe: Some(http_probe("/healthz", 5, 120)),
        liveness_probe: Some(http_probe("/healthz", 10, 6)),
        readiness_probe: Some(http_probe("/readyz", 5, 3)),
        resources: spec.resources.clone(),
        volume_mounts: Some(vec![
            VolumeMount {
                name: "data".into(),
                mount_path: DATA_MOUNT.into(),
                ..VolumeMount::default()
            },
            VolumeMount {
                name: "config".into(),
                mount_path: CONFIG_MOUNT.into(),
                read_only: Some(true),
                ..VolumeMount::default()
            },
        ]),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Capabilities::default()
            }),
            ..SecurityContext::default()
        }),
        ..Container::default()
    };

    let anti_affinity = PodAntiAffinity {
        preferred_during_scheduling_ignored_during_execution: Some(vec![WeightedPodAffinityTerm {
            weight: 100,
            pod_affinity_term: PodAffinityTerm {
                label_selector: Some(LabelSelector {
                    match_labels: Some(selector.clone()),
                    ..LabelSelector::default()
                }),
                topology_key: "kubernetes.io/hostname".into(),
                ..PodAffinityTerm::default()
            },
        }]),
        ..PodAntiAffinity::default()
    };
    let node_affinity = spec.location.as_ref().map(|zone| NodeAffinity {
        required_during_scheduling_ignored_during_execution: Some(NodeSelector {
            node_selector_terms: vec![NodeSelectorTerm {
                match_expressions: Some(vec![NodeSelectorRequirement {
                    key: "topology.kubernetes.io/zone".into(),
                    operator: "In".into(),
                    values: Some(vec![zone.clone()]),
                }]),
                ..NodeSelectorTerm::default()
            }],
        }),
        ..NodeAffinity::default()
    });

    let mut pod_meta = ObjectMeta {
        labels: Some(pod_labels),
        ..ObjectMeta::default()
    };
    if !overrides.annotations.is_empty() {
        pod_meta.annotations = Some(overrides.annotations.clone());
    }

    let pod_spec = PodSpec {
        containers: vec![container],
        termination_grace_period_seconds: Some(grace),
        affinity: Some(Affinity {
            pod_anti_affinity: Some(anti_affinity),
            node_affinity,
            ..Affinity::default()
        }),
        topology_spread_constraints: Some(vec![TopologySpreadConstraint {
            max_skew: 1,
            topology_key: "kubernetes.io/hostname".into(),
            when_unsatisfiable: "ScheduleAnyway".into(),
            label_selector: Some(LabelSelector {
                match_labels: Some(selector.clone()),
                ..LabelSelector::default()
            }),
            ..TopologySpreadConstraint::default()
        }]),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(65532),
            run_as_group: Some(65532),
            fs_group: Some(65532),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..SeccompProfile::default()
            }),
            ..PodSecurityContext::default()
        }),
        volumes: Some(vec![Volume {
            name: "config".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: instance_config_map_name(instance),
                optional: Some(true),
                ..ConfigMapVolumeSource::default()
            }),
            ..Volume::default()
        }]),
        node_selector: (!overrides.node_selector.is_empty())
            .then(|| overrides.node_selector.clone()),
        tolerations: (!overrides.tolerations.is_empty()).then(|| overrides.tolerations.clone()),
        priority_class_name: overrides.priority_class_name.clone(),
        service_account_name: overrides.service_account_name.clone(),
        // Tablet servers never call the Kubernetes API.
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        ..PodSpec::default()
    };

    let storage_size = spec
        .storage_size
        .clone()
        .unwrap_or_else(|| Quantity(crate::crd::DEFAULT_STORAGE_SIZE.into()));
    let claim = PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some("data".into()),
            labels: Some(labels.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: Some(storage_class(cluster, config)),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".into(), storage_size)])),
                ..VolumeResourceRequirements::default()
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        ..PersistentVolumeClaim::default()
    };

    let mut sts_labels = labels.clone();
    sts_labels.insert(
        LABEL_STORAGE_TYPE.into(),
        match spec.storage_type {
            StorageType::Ssd => "SSD".into(),
            StorageType::Hdd => "HDD".into(),
        },
    );
    let mut sts_meta = meta(statefulset_name(&name), &namespace, sts_labels);
    sts_meta.owner_references = Some(owner.clone());
    sts_meta.annotations = Some(BTreeMap::from([(
        ANNOTATION_LOCATION.into(),
        spec.location.clone().unwrap_or_default(),
    )]));

    let statefulset = StatefulSet {
        metadata: sts_meta,
        spec: Some(StatefulSetSpec {
            replicas: Some(desired_serve_nodes(cluster, current_nodes)),
            selector: LabelSelector {
                match_labels: Some(selector.clone()),
                ..LabelSelector::default()
            },
            service_name: Some(headless_service_name(&name)),
            // Tablet servers start independently; no need to wait for ordinals in turn.
            pod_management_policy: Some("Parallel".into()),
            update_strategy: Some(StatefulSetUpdateStrategy {
                type_: Some("RollingUpdate".into()),
                ..StatefulSetUpdateStrategy::default()
            }),
            template: PodTemplateSpec {
                metadata: Some(pod_meta),
                spec: Some(pod_spec),
            },
            volume_claim_templates: Some(vec![claim]),
            ..StatefulSetSpec::default()
        }),
        ..StatefulSet::default()
    };

    let mut svc_meta = meta(headless_service_name(&name), &namespace, labels.clone());
    svc_meta.owner_references = Some(owner.clone());
    let headless_service = Service {
        metadata: svc_meta,
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            // Peers and the operator find every tablet server, ready or not.
            publish_not_ready_addresses: Some(true),
            selector: Some(selector.clone()),
            ports: Some(ports()),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    };

    let mut pdb_meta = meta(name.clone(), &namespace, labels);
    pdb_meta.owner_references = Some(owner);
    let pod_disruption_budget = PodDisruptionBudget {
        metadata: pdb_meta,
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(selector),
                ..LabelSelector::default()
            }),
            ..PodDisruptionBudgetSpec::default()
        }),
        ..PodDisruptionBudget::default()
    };

    ClusterObjects {
        statefulset,
        headless_service,
        pod_disruption_budget,
    }
}

/// One app profile as published to the tablet servers (`app-profiles.json`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PublishedAppProfile {
    pub id: String,
    pub description: String,
    pub routing: crate::crd::Routing,
    pub priority: crate::crd::Priority,
}

/// The objects of one instance.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceObjects {
    pub service: Service,
    pub config_map: ConfigMap,
}

/// The project id of an instance's resource names (spec.projectId, else the namespace).
pub fn project_id(instance: &Instance) -> String {
    instance
        .spec
        .project_id
        .clone()
        .unwrap_or_else(|| instance.metadata.namespace.clone().unwrap_or_default())
}

/// Builds the client-facing Service and the configuration published to the tablet servers.
/// `app_profiles` are the instance's valid AppProfiles.
pub fn instance_objects(instance: &Instance, app_profiles: &[&AppProfile]) -> InstanceObjects {
    let name = instance.metadata.name.clone().unwrap_or_default();
    let namespace = instance.metadata.namespace.clone().unwrap_or_default();
    let owner = instance
        .controller_owner_ref(&())
        .into_iter()
        .collect::<Vec<_>>();
    let mut labels = instance_labels(&name);
    labels.insert(LABEL_COMPONENT.into(), "endpoint".into());

    let mut svc_meta = meta(instance_service_name(&name), &namespace, labels.clone());
    svc_meta.owner_references = Some(owner.clone());
    let service = Service {
        metadata: svc_meta,
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            selector: Some(instance_selector(&name)),
            ports: Some(vec![ports().remove(0)]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    };

    let mut profiles: Vec<PublishedAppProfile> = app_profiles
        .iter()
        .map(|p| PublishedAppProfile {
            id: p.app_profile_id(),
            description: p.spec.description.clone().unwrap_or_default(),
            routing: p.spec.routing.clone(),
            priority: p.spec.priority,
        })
        .collect();
    profiles.sort_by(|a, b| a.id.cmp(&b.id));
    let instance_json = serde_json::json!({
        "project": project_id(instance),
        "instance": name,
    });
    let mut labels = instance_labels(&name);
    labels.insert(LABEL_COMPONENT.into(), "config".into());
    let mut cm_meta = meta(instance_config_map_name(&name), &namespace, labels);
    cm_meta.owner_references = Some(owner);
    let config_map = ConfigMap {
        metadata: cm_meta,
        data: Some(BTreeMap::from([
            (
                "instance.json".into(),
                serde_json::to_string_pretty(&instance_json).expect("plain JSON"),
            ),
            (
                "app-profiles.json".into(),
                serde_json::to_string_pretty(&profiles).expect("plain JSON"),
            ),
        ])),
        ..ConfigMap::default()
    };
    InstanceObjects {
        service,
        config_map,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_cache_follows_pod_memory() {
        let memory = |limit: Option<&str>, request: Option<&str>| ResourceRequirements {
            limits: limit.map(|q| [("memory".to_string(), Quantity(q.into()))].into()),
            requests: request.map(|q| [("memory".to_string(), Quantity(q.into()))].into()),
            ..ResourceRequirements::default()
        };
        assert_eq!(block_cache_mib(None), None);
        assert_eq!(block_cache_mib(Some(&memory(None, None))), None);
        assert_eq!(
            block_cache_mib(Some(&memory(Some("8Gi"), Some("4Gi")))),
            Some(2048)
        );
        assert_eq!(block_cache_mib(Some(&memory(None, Some("2Gi")))), Some(512));
        assert_eq!(block_cache_mib(Some(&memory(Some("32Mi"), None))), Some(16));
        assert_eq!(block_cache_mib(Some(&memory(Some("lots"), None))), None);
    }
}
