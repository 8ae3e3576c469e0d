//! The StatefulSet of a cluster's tablet servers: the pod (container, probes, affinity,
//! security context, the instance's configuration mounted), the volume claim template, and the
//! replica count.
//!
//! The servers run in cluster mode: each registers in the instance's metadata store (etcd)
//! under its pod name with its pod IP, serves the tablets the master assigns it and forwards
//! requests for the others, so any server answers for the whole cluster.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec, StatefulSetUpdateStrategy};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, ConfigMapVolumeSource, Container, ContainerPort, EnvVar, EnvVarSource,
    HTTPGetAction, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    ObjectFieldSelector, PersistentVolumeClaim, PersistentVolumeClaimSpec, PodAffinityTerm,
    PodAntiAffinity, PodSecurityContext, PodSpec, PodTemplateSpec, Probe, ResourceFieldSelector,
    ResourceRequirements, SeccompProfile, SecretKeySelector, SecretVolumeSource, SecurityContext,
    TopologySpreadConstraint, Volume, VolumeMount, VolumeResourceRequirements,
    WeightedPodAffinityTerm,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::secrets;
use super::token_review;
use super::{
    ANNOTATION_LOCATION, CONFIG_MOUNT, DATA_MOUNT, DEFAULT_GRACE_SECONDS, GRPC_PORT, HTTP_PORT,
    LABEL_STORAGE_TYPE, OperatorConfig, cluster_identity, cluster_selector, headless_service_name,
    instance_config_map_name, instance_etcd_endpoints, meta, owned_by, project_id,
    statefulset_name,
};
use crate::crd::{Cluster, Instance, StorageType};

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

/// The node count a cluster should run: `serveNodes`, or with autoscaling the count the
/// autoscaler decided (`autoscaled`, from its record in the metadata store), else the current
/// count — kept within the bounds (the minimum to start with).
pub fn desired_serve_nodes(
    cluster: &Cluster,
    current: Option<i32>,
    autoscaled: Option<u32>,
) -> i32 {
    match (&cluster.spec.serve_nodes, &cluster.spec.autoscaling) {
        (Some(n), _) => *n,
        (None, Some(a)) => autoscaled
            .map(|n| n.min(i32::MAX as u32) as i32)
            .or(current)
            .unwrap_or(a.min_serve_nodes)
            .clamp(a.min_serve_nodes, a.max_serve_nodes),
        (None, None) => 1,
    }
}

/// The storage class of the tablet servers' volumes: `spec.storageClassName`, else the
/// operator's class for the storage type.
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

/// An env var from the pod's own fields (downward API).
pub(super) fn env_from_field(name: &str, path: &str) -> EnvVar {
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

/// The tablet server's command line in cluster mode. `$(POD_NAME)` and `$(POD_IP)` are
/// expanded by the kubelet from the container's env (the downward API): each server registers
/// under its pod name and advertises its pod IP.
pub fn tablet_server_args(
    cluster: &Cluster,
    instance: &Instance,
    shutdown_secs: i64,
    block_cache_mib: Option<u64>,
) -> Vec<String> {
    let name = cluster.metadata.name.clone().unwrap_or_default();
    let namespace = cluster.metadata.namespace.clone().unwrap_or_default();
    [
        format!("--cluster={name}"),
        format!("--etcd={}", instance_etcd_endpoints(instance).join(",")),
        format!("--namespace={namespace}"),
        format!("--instance={}", cluster.spec.instance_ref),
        format!("--project={}", project_id(instance)),
        "--server-id=$(POD_NAME)".into(),
        format!("--advertise-address=$(POD_IP):{GRPC_PORT}"),
        format!("--data-dir={DATA_MOUNT}/data"),
        format!("--listen=0.0.0.0:{GRPC_PORT}"),
        format!("--http-listen=0.0.0.0:{HTTP_PORT}"),
        "--log-format=json".into(),
        format!("--shutdown-timeout-secs={shutdown_secs}"),
    ]
    .into_iter()
    .chain(block_cache_mib.map(|mib| format!("--block-cache-mib={mib}")))
    .chain(
        instance
            .spec
            .backup_store
            .as_ref()
            .map(|store| format!("--backup-url={}", store.url)),
    )
    .chain(
        crate::lifecycle::backups::log_backup_flags(instance.spec.backup_store.as_ref())
            .into_iter()
            .map(|(flag, value)| format!("{flag}={value}")),
    )
    .chain(security_args(instance))
    .collect()
}

/// The keys of `backupStore.credentialsSecret` the servers get as env, and whether each must
/// be there (a session token is for temporary credentials only).
pub const BACKUP_CREDENTIAL_KEYS: [(&str, bool); 3] = [
    ("AWS_ACCESS_KEY_ID", true),
    ("AWS_SECRET_ACCESS_KEY", true),
    ("AWS_SESSION_TOKEN", false),
];

/// The env through which the servers reach the instance's backup store: its endpoint and
/// region as values, and the credentials Secret's keys as references the kubelet resolves —
/// the operator never reads the Secret. Empty without a backup store.
pub fn backup_env(instance: &Instance) -> Vec<EnvVar> {
    let Some(store) = instance.spec.backup_store.as_ref() else {
        return vec![];
    };
    let values = store.env().into_iter().map(|(name, value)| EnvVar {
        name,
        value: Some(value),
        ..EnvVar::default()
    });
    let secrets = store.credentials_secret.iter().flat_map(|secret| {
        BACKUP_CREDENTIAL_KEYS.map(|(key, required)| EnvVar {
            name: key.into(),
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: secret.clone(),
                    key: key.into(),
                    optional: (!required).then_some(true),
                }),
                ..EnvVarSource::default()
            }),
            ..EnvVar::default()
        })
    });
    values.chain(secrets).collect()
}

/// A secured instance's TLS, authentication and etcd flags, naming the files of its
/// [`secrets::server_secret_name`] Secret where it is mounted (the same flags the local
/// runtime passes: [`crate::lifecycle::security::server_args`]).
fn security_args(instance: &Instance) -> Vec<String> {
    if !secrets::secured(instance) {
        return vec![];
    }
    crate::lifecycle::security::server_args(
        &secrets::server_credentials(instance),
        secrets::metadata_store_secured(instance),
    )
}

/// A Secret as a volume: its keys as files the pod's group (fsGroup) may read, rotated in
/// place by the kubelet when the Secret changes.
pub(super) fn secret_volume(name: &str, secret: String) -> Volume {
    Volume {
        name: name.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret),
            default_mode: Some(0o440),
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    }
}

/// Builds a cluster's StatefulSet of `replicas` tablet servers; they use `instance`'s
/// metadata store.
pub fn statefulset(
    cluster: &Cluster,
    instance: &Instance,
    config: &OperatorConfig,
    replicas: i32,
) -> StatefulSet {
    let (name, namespace, labels) = cluster_identity(cluster);
    let instance_name = &cluster.spec.instance_ref;
    let spec = &cluster.spec;
    let overrides = spec.pod_template.clone().unwrap_or_default();
    let owner = owned_by(cluster);
    let selector = cluster_selector(&name);

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
        args: Some(tablet_server_args(
            cluster,
            instance,
            shutdown_secs,
            block_cache_mib(spec.resources.as_ref()),
        )),
        env: Some(
            [
                env_from_field("POD_NAME", "metadata.name"),
                env_from_field("POD_NAMESPACE", "metadata.namespace"),
                env_from_field("POD_IP", "status.podIP"),
                // The CPU load the server reports is its use against the pod's CPU request (0,
                // no request: against its limit, else the node's cores).
                EnvVar {
                    name: "BASALT_CPU_ALLOCATION_MILLICORES".into(),
                    value_from: Some(EnvVarSource {
                        resource_field_ref: Some(ResourceFieldSelector {
                            resource: "requests.cpu".into(),
                            divisor: Some(Quantity("1m".into())),
                            ..ResourceFieldSelector::default()
                        }),
                        ..EnvVarSource::default()
                    }),
                    ..EnvVar::default()
                },
                EnvVar {
                    name: "BASALT_INSTANCE".into(),
                    value: Some(instance_name.clone()),
                    ..EnvVar::default()
                },
            ]
            .into_iter()
            .chain(backup_env(instance))
            .collect(),
        ),
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
        volume_mounts: Some(
            vec![
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
            ]
            .into_iter()
            .chain(secrets::secured(instance).then(|| VolumeMount {
                name: "tls".into(),
                mount_path: secrets::SERVER_TLS_MOUNT.into(),
                read_only: Some(true),
                ..VolumeMount::default()
            }))
            .collect(),
        ),
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
        volumes: Some(
            [Volume {
                name: "config".into(),
                config_map: Some(ConfigMapVolumeSource {
                    name: instance_config_map_name(instance_name),
                    optional: Some(true),
                    ..ConfigMapVolumeSource::default()
                }),
                ..Volume::default()
            }]
            .into_iter()
            .chain(
                secrets::secured(instance)
                    .then(|| secret_volume("tls", secrets::server_secret_name(instance_name))),
            )
            .collect(),
        ),
        node_selector: (!overrides.node_selector.is_empty())
            .then(|| overrides.node_selector.clone()),
        tolerations: (!overrides.tolerations.is_empty()).then(|| overrides.tolerations.clone()),
        priority_class_name: overrides.priority_class_name.clone(),
        // Tablet servers call the Kubernetes API only to review tokens
        // (`spec.security.serviceAccountTokens`), as their own ServiceAccount.
        service_account_name: overrides.service_account_name.clone().or_else(|| {
            instance
                .spec
                .token_review()
                .then(|| token_review::server_service_account_name(instance_name))
        }),
        automount_service_account_token: Some(instance.spec.token_review()),
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
    sts_meta.owner_references = Some(owner);
    sts_meta.annotations = Some(BTreeMap::from([(
        ANNOTATION_LOCATION.into(),
        spec.location.clone().unwrap_or_default(),
    )]));

    StatefulSet {
        metadata: sts_meta,
        spec: Some(StatefulSetSpec {
            replicas: Some(replicas),
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tablet_servers_run_in_cluster_mode_against_the_instances_etcd() {
        let cluster: Cluster = serde_norway::from_str(
            "metadata: {name: orders-c1, namespace: shop}\nspec: {instanceRef: orders, serveNodes: 3}\n",
        )
        .unwrap();
        let instance: Instance = serde_norway::from_str(
            "metadata: {name: orders, namespace: shop}\nspec: {displayName: Orders, type: Development, projectId: acme}\n",
        )
        .unwrap();
        assert_eq!(
            tablet_server_args(&cluster, &instance, 55, Some(512)).join(" "),
            "--cluster=orders-c1 --etcd=http://orders-meta-0.orders-meta.shop.svc:2379 \
             --namespace=shop --instance=orders --project=acme --server-id=$(POD_NAME) \
             --advertise-address=$(POD_IP):8086 --data-dir=/var/lib/basalt/data \
             --listen=0.0.0.0:8086 --http-listen=0.0.0.0:8087 --log-format=json \
             --shutdown-timeout-secs=55 --block-cache-mib=512"
        );
        // Production: three members; an existing etcd: its endpoints; the project defaults to
        // the namespace.
        let production: Instance = serde_norway::from_str(
            "metadata: {name: orders, namespace: shop}\nspec: {displayName: Orders}\n",
        )
        .unwrap();
        let args = tablet_server_args(&cluster, &production, 55, None);
        // Production is secured by default: etcd over TLS, and the server's TLS and
        // authentication flags name its mounted Secret (build::secrets).
        assert_eq!(
            args[1],
            "--etcd=https://orders-meta-0.orders-meta.shop.svc:2379,\
             https://orders-meta-1.orders-meta.shop.svc:2379,\
             https://orders-meta-2.orders-meta.shop.svc:2379"
        );
        assert_eq!(args[4], "--project=shop");
        assert_eq!(
            args[12..].join(" "),
            crate::lifecycle::security::server_args(
                &super::secrets::server_credentials(&production),
                true
            )
            .join(" ")
        );
        let sts = statefulset(&cluster, &production, &OperatorConfig::default(), 3);
        let pod = sts.spec.unwrap().template.spec.unwrap();
        let tls = pod
            .volumes
            .unwrap()
            .into_iter()
            .find(|v| v.name == "tls")
            .unwrap();
        assert_eq!(
            tls.secret.unwrap().secret_name.as_deref(),
            Some("orders-server-tls")
        );
        assert!(
            pod.containers[0]
                .volume_mounts
                .as_ref()
                .unwrap()
                .iter()
                .any(|m| m.name == "tls" && m.mount_path == "/var/run/basalt/tls")
        );
        let external: Instance = serde_norway::from_str(
            "metadata: {name: orders, namespace: shop}\nspec: {displayName: Orders, metadataStore: {endpoints: ['http://a:2379', 'http://b:2379']}}\n",
        )
        .unwrap();
        assert_eq!(
            tablet_server_args(&cluster, &external, 55, None)[1],
            "--etcd=http://a:2379,http://b:2379"
        );
        // The pod IP the server advertises comes from the downward API.
        let sts = statefulset(&cluster, &instance, &OperatorConfig::default(), 3);
        let env = sts.spec.unwrap().template.spec.unwrap().containers[0]
            .env
            .clone()
            .unwrap();
        let pod_ip = env.iter().find(|e| e.name == "POD_IP").unwrap();
        assert_eq!(
            pod_ip
                .value_from
                .as_ref()
                .unwrap()
                .field_ref
                .as_ref()
                .unwrap()
                .field_path,
            "status.podIP"
        );
    }

    #[test]
    fn servers_reviewing_tokens_run_as_their_service_account_with_its_token() {
        let cluster: Cluster = serde_norway::from_str(
            "metadata: {name: orders-c1, namespace: shop}\nspec: {instanceRef: orders, serveNodes: 3}\n",
        )
        .unwrap();
        let instance = |security: &str| -> Instance {
            serde_norway::from_str(&format!(
                "metadata: {{name: orders, namespace: shop}}\nspec: {{displayName: Orders, security: {security}}}\n"
            ))
            .unwrap()
        };
        let pod = |i: &Instance| {
            statefulset(&cluster, i, &OperatorConfig::default(), 3)
                .spec
                .unwrap()
                .template
                .spec
                .unwrap()
        };
        let reviewing = pod(&instance("{serviceAccountTokens: true}"));
        assert_eq!(
            reviewing.service_account_name.as_deref(),
            Some("orders-tablet-server")
        );
        assert_eq!(reviewing.automount_service_account_token, Some(true));
        let args = reviewing.containers[0].args.clone().unwrap();
        assert!(args.contains(&"--token-review".to_string()), "{args:?}");
        // Otherwise the servers never call the Kubernetes API: no token mounted.
        for security in ["{}", "{tls: Disabled, serviceAccountTokens: true}"] {
            let plain = pod(&instance(security));
            assert_eq!(plain.service_account_name, None, "{security}");
            assert_eq!(plain.automount_service_account_token, Some(false));
            assert!(
                !plain.containers[0]
                    .args
                    .as_ref()
                    .unwrap()
                    .contains(&"--token-review".to_string())
            );
        }
        // A Cluster naming its own ServiceAccount keeps it.
        let mut own = cluster.clone();
        own.spec.pod_template = Some(crate::crd::PodTemplateOverrides {
            service_account_name: Some("mine".into()),
            ..Default::default()
        });
        let sts = statefulset(
            &own,
            &instance("{serviceAccountTokens: true}"),
            &OperatorConfig::default(),
            3,
        );
        let spec = sts.spec.unwrap().template.spec.unwrap();
        assert_eq!(spec.service_account_name.as_deref(), Some("mine"));
    }

    #[test]
    fn servers_reach_the_instances_backup_store_through_flag_and_env() {
        let cluster: Cluster = serde_norway::from_str(
            "metadata: {name: orders-c1, namespace: shop}\nspec: {instanceRef: orders, serveNodes: 3}\n",
        )
        .unwrap();
        let instance = |extra: &str| -> Instance {
            serde_norway::from_str(&format!(
                "metadata: {{name: orders, namespace: shop}}\nspec: {{displayName: Orders, type: Development{extra}}}\n"
            ))
            .unwrap()
        };
        let template = |i: &Instance| {
            statefulset(&cluster, i, &OperatorConfig::default(), 3)
                .spec
                .unwrap()
                .template
        };
        let env_of = |t: &PodTemplateSpec| -> Vec<EnvVar> {
            t.spec.as_ref().unwrap().containers[0].env.clone().unwrap()
        };
        let aws = |env: &[EnvVar]| -> Vec<String> {
            env.iter()
                .filter(|e| e.name.starts_with("AWS_"))
                .map(|e| match (&e.value, &e.value_from) {
                    (Some(v), _) => format!("{}={v}", e.name),
                    (None, Some(from)) => {
                        let r = from.secret_key_ref.as_ref().unwrap();
                        format!(
                            "{}<-{}/{}{}",
                            e.name,
                            r.name,
                            r.key,
                            if r.optional == Some(true) { "?" } else { "" }
                        )
                    }
                    (None, None) => e.name.clone(),
                })
                .collect()
        };

        // Without a backup store: no location, no AWS_* env (backup RPCs are UNIMPLEMENTED).
        let plain = template(&instance(""));
        let args = plain.spec.as_ref().unwrap().containers[0]
            .args
            .clone()
            .unwrap();
        assert!(
            !args.iter().any(|a| a.starts_with("--backup-url")),
            "{args:?}"
        );
        assert!(aws(&env_of(&plain)).is_empty());

        let stored = instance(
            ", backupStore: {url: 's3://basalt-backups/orders', endpoint: 'http://seaweedfs.storage.svc:8333', \
             region: eu-west-1, credentialsSecret: backup-creds}",
        );
        let t = template(&stored);
        let pod = t.spec.as_ref().unwrap();
        let args = pod.containers[0].args.clone().unwrap();
        assert_eq!(
            args.iter()
                .filter(|a| a.starts_with("--backup-url"))
                .collect::<Vec<_>>(),
            ["--backup-url=s3://basalt-backups/orders"]
        );
        assert_eq!(
            aws(&env_of(&t)),
            [
                "AWS_ENDPOINT_URL=http://seaweedfs.storage.svc:8333",
                "AWS_ALLOW_HTTP=true",
                "AWS_REGION=eu-west-1",
                "AWS_ACCESS_KEY_ID<-backup-creds/AWS_ACCESS_KEY_ID",
                "AWS_SECRET_ACCESS_KEY<-backup-creds/AWS_SECRET_ACCESS_KEY",
                "AWS_SESSION_TOKEN<-backup-creds/AWS_SESSION_TOKEN?",
            ]
        );
        // The Secret reaches the servers through the kubelet only: no volume, and the
        // operator's own objects never carry its values.
        assert!(
            !pod.volumes
                .as_ref()
                .unwrap()
                .iter()
                .any(|v| v.secret.is_some())
        );

        // AWS itself over HTTPS: no endpoint, no plain HTTP, no credentials (a cloud identity).
        let aws_only = template(&instance(", backupStore: {url: 's3://acme-backups'}"));
        assert!(aws(&env_of(&aws_only)).is_empty());
        let https = template(&instance(
            ", backupStore: {url: 's3://b-1/p', endpoint: 'https://s3.example.com'}",
        ));
        assert_eq!(
            aws(&env_of(&https)),
            ["AWS_ENDPOINT_URL=https://s3.example.com"]
        );

        // Changing the store changes the pod template: the StatefulSet rolls the servers.
        let moved = instance(
            ", backupStore: {url: 's3://basalt-backups/orders-2', endpoint: 'http://seaweedfs.storage.svc:8333', \
             region: eu-west-1, credentialsSecret: backup-creds}",
        );
        assert_ne!(template(&moved), t);
        assert_ne!(t, plain);
    }

    #[test]
    fn log_backup_turns_on_point_in_time_recovery_in_the_servers() {
        let cluster: Cluster = serde_norway::from_str(
            "metadata: {name: orders-c1, namespace: shop}\nspec: {instanceRef: orders, serveNodes: 3}\n",
        )
        .unwrap();
        let log_args = |extra: &str| -> Vec<String> {
            let instance: Instance = serde_norway::from_str(&format!(
                "metadata: {{name: orders, namespace: shop}}\nspec: {{displayName: Orders, type: Development, \
                 backupStore: {{url: 's3://basalt-backups/orders'{extra}}}}}\n"
            ))
            .unwrap();
            let sts = statefulset(&cluster, &instance, &OperatorConfig::default(), 3);
            sts.spec.unwrap().template.spec.unwrap().containers[0]
                .args
                .clone()
                .unwrap()
                .into_iter()
                .filter(|a| a.starts_with("--log-backup"))
                .collect()
        };
        // Absent: off (the servers' default), no flag.
        assert!(log_args("").is_empty());
        assert_eq!(
            log_args(", logBackup: {}"),
            [
                "--log-backup-interval-secs=30",
                "--log-backup-retention-secs=604800"
            ]
        );
        assert_eq!(
            log_args(", logBackup: {intervalSeconds: 10, retention: 36h}"),
            [
                "--log-backup-interval-secs=10",
                "--log-backup-retention-secs=129600"
            ]
        );
    }

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
