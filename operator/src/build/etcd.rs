//! An instance's metadata store: the etcd cluster that holds its tablet map, catalog and the
//! master's election (`../shared/DISTRIBUTED.md`, "etcd plays Chubby") — a headless Service
//! `<instance>-meta`, a StatefulSet `<instance>-meta` (3 members for Production, 1 for
//! Development) with a volume per member, and a PodDisruptionBudget that keeps quorum. None of
//! it exists for an instance whose `spec.metadataStore.endpoints` names an existing etcd.
//!
//! Members find each other by their stable DNS names
//! (`<instance>-meta-<n>.<instance>-meta.<namespace>.svc`), which the headless Service publishes
//! before the members are ready (an etcd member is ready only once it has peers).
//!
//! The member count is fixed when the StatefulSet is created: changing a running etcd's
//! membership takes `etcdctl member add/remove` in step with the pods, which this operator does
//! not do. An Instance whose type changes keeps its store's size.

use std::collections::BTreeMap;

use basalt_transport::Security;
use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec, StatefulSetUpdateStrategy};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, Container, ContainerPort, HTTPGetAction, PersistentVolumeClaim,
    PersistentVolumeClaimSpec, Pod, PodAffinityTerm, PodAntiAffinity, PodSecurityContext, PodSpec,
    PodTemplateSpec, Probe, SeccompProfile, SecurityContext, Service, ServicePort, ServiceSpec,
    VolumeMount, VolumeResourceRequirements, WeightedPodAffinityTerm,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;

use super::secrets;
use super::statefulset::{env_from_field, secret_volume};
use super::{
    LABEL_BASALT_INSTANCE, LABEL_COMPONENT, LABEL_NAME, OperatorConfig, instance_labels, meta,
    owned_by,
};
use crate::crd::{Instance, InstanceType};

/// etcd's client port.
pub const CLIENT_PORT: i32 = 2379;
/// etcd's peer port.
pub const PEER_PORT: i32 = 2380;
/// etcd's plaintext `/health` and `/metrics` when its client port speaks TLS.
pub const METRICS_PORT: i32 = 2381;
/// The `app.kubernetes.io/component` of the metadata store's objects.
pub const COMPONENT: &str = "metadata-store";
/// Where a member's volume is mounted; etcd's data directory is `data/` below it.
pub const DATA_MOUNT: &str = "/var/lib/etcd";
/// Size of each member's volume. The backend quota (below) is half of it: the rest holds the
/// write-ahead log and snapshots.
pub const STORAGE_SIZE: &str = "4Gi";
/// etcd's backend quota, bytes.
pub const QUOTA_BACKEND_BYTES: u64 = 2 << 30;
/// The members' grace period: etcd stops in well under a second.
pub const GRACE_SECONDS: i64 = 30;

/// The name of the metadata store's StatefulSet, headless Service and PodDisruptionBudget.
pub fn name(instance: &str) -> String {
    super::metadata_store_name(instance)
}

/// Selects the metadata store's members of one instance (stable: a StatefulSet's selector is
/// immutable).
pub fn selector(instance: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_NAME.into(), "basalt".into()),
        (LABEL_COMPONENT.into(), COMPONENT.into()),
        (LABEL_BASALT_INSTANCE.into(), instance.into()),
    ])
}

/// Members of a new metadata store: 3 for Production (one may fail), 1 for Development.
pub fn members_for(instance_type: InstanceType) -> i32 {
    match instance_type {
        InstanceType::Production => 3,
        InstanceType::Development => 1,
    }
}

/// The stable DNS name of member `ordinal`: `<instance>-meta-<n>.<instance>-meta.<ns>.svc`.
pub fn member_host(instance: &str, namespace: &str, ordinal: i32) -> String {
    let set = name(instance);
    format!("{set}-{ordinal}.{set}.{namespace}.svc")
}

/// The etcd client URLs the instance's tablet servers are given: `spec.metadataStore.endpoints`,
/// or each member of the operator's store by its DNS name.
pub fn client_urls(instance: &Instance, members: i32) -> Vec<String> {
    if let Some(store) = &instance.spec.metadata_store {
        return store.endpoints.clone();
    }
    let name = instance.name_any();
    let ns = instance.namespace().unwrap_or_default();
    (0..members)
        .map(|n| {
            client_url(
                instance,
                &format!("{}:{CLIENT_PORT}", member_host(&name, &ns, n)),
            )
        })
        .collect()
}

/// The URL of a member of the instance's own store at `address`: https when it speaks TLS
/// ([`secrets::metadata_store_secured`]).
fn client_url(instance: &Instance, address: &str) -> String {
    scheme_url(secrets::metadata_store_secured(instance), address)
}

fn scheme_url(tls: bool, address: &str) -> String {
    if tls {
        format!("https://{address}")
    } else {
        Security::Plaintext.url(address)
    }
}

/// The etcd client URLs the operator itself uses for the instance (its master, the Cluster
/// status): `spec.metadataStore.endpoints`, or the pod IP of each member of the operator's store
/// that has one, in member order. Pod IPs rather than DNS names: the operator reaches the pod
/// network without depending on cluster DNS (and, run outside the cluster as in the tests,
/// cannot resolve `*.svc` names at all). Empty while no member has an IP. `pods` may hold
/// other pods; only the instance's members count.
pub fn operator_urls(instance: &Instance, pods: &[Pod]) -> Vec<String> {
    if let Some(store) = &instance.spec.metadata_store {
        return store.endpoints.clone();
    }
    let ns = instance.namespace().unwrap_or_default();
    let wanted = selector(&instance.name_any());
    let mut members: Vec<(String, String)> = pods
        .iter()
        .filter(|p| p.namespace().as_deref() == Some(ns.as_str()))
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            let labels = p.labels();
            wanted.iter().all(|(k, v)| labels.get(k) == Some(v))
        })
        .filter_map(|p| {
            let ip = p.status.as_ref()?.pod_ip.clone()?;
            Some((
                p.name_any(),
                client_url(instance, &format!("{ip}:{CLIENT_PORT}")),
            ))
        })
        .collect();
    members.sort();
    members.into_iter().map(|(_, url)| url).collect()
}

/// etcd's command line. `$(POD_NAME)` is expanded by the kubelet from the container's env.
/// With `tls`, its client port speaks TLS and verifies client certificates against the
/// operator's CA ([`crate::lifecycle::security::etcd_server_args`], its Secret mounted at
/// [`secrets::ETCD_TLS_MOUNT`]), and `/health` moves to a plaintext metrics port
/// ([`METRICS_PORT`]) for the kubelet's probe. The peer port stays plaintext (docs/security.md).
pub fn etcd_args(instance: &str, namespace: &str, members: i32, tls: bool) -> Vec<String> {
    let set = name(instance);
    let own = format!("$(POD_NAME).{set}.{namespace}.svc");
    let url = |address: String| Security::Plaintext.url(&address);
    let client_url = |address: String| scheme_url(tls, &address);
    let initial_cluster = (0..members)
        .map(|n| {
            format!(
                "{set}-{n}={}",
                url(format!(
                    "{}:{PEER_PORT}",
                    member_host(instance, namespace, n)
                ))
            )
        })
        .collect::<Vec<_>>()
        .join(",");
    vec![
        "--name=$(POD_NAME)".into(),
        format!("--data-dir={DATA_MOUNT}/data"),
        format!(
            "--listen-client-urls={}",
            client_url(format!("0.0.0.0:{CLIENT_PORT}"))
        ),
        format!(
            "--advertise-client-urls={}",
            client_url(format!("{own}:{CLIENT_PORT}"))
        ),
        format!("--listen-peer-urls={}", url(format!("0.0.0.0:{PEER_PORT}"))),
        format!(
            "--initial-advertise-peer-urls={}",
            url(format!("{own}:{PEER_PORT}"))
        ),
        format!("--initial-cluster={initial_cluster}"),
        // Only read when a member starts on an empty data directory.
        "--initial-cluster-state=new".into(),
        // Members of different instances' stores never join each other by mistake.
        format!("--initial-cluster-token={namespace}-{set}"),
        format!("--quota-backend-bytes={QUOTA_BACKEND_BYTES}"),
        // Old revisions of tablet records are of no use: keep one hour of history.
        "--auto-compaction-mode=periodic".into(),
        "--auto-compaction-retention=1h".into(),
    ]
    .into_iter()
    .chain(
        tls.then(|| {
            let (ca, files) = secrets::metadata_store_files();
            let mut args = crate::lifecycle::security::etcd_server_args(&ca, &files);
            args.push(format!(
                "--listen-metrics-urls={}",
                url(format!("0.0.0.0:{METRICS_PORT}"))
            ));
            args
        })
        .into_iter()
        .flatten(),
    )
    .collect()
}

/// The objects of an instance's own metadata store.
#[derive(Debug, Clone, PartialEq)]
pub struct MetadataStoreObjects {
    pub service: Service,
    pub statefulset: StatefulSet,
    pub pod_disruption_budget: PodDisruptionBudget,
    /// When the operator makes NetworkPolicies ([`super::network_policy`]).
    pub network_policy: Option<k8s_openapi::api::networking::v1::NetworkPolicy>,
}

/// Builds the metadata store of `instance` with `members` members, or None when
/// `spec.metadataStore` names an existing etcd.
pub fn metadata_store_objects(
    instance: &Instance,
    config: &OperatorConfig,
    members: i32,
) -> Option<MetadataStoreObjects> {
    if instance.spec.metadata_store.is_some() {
        return None;
    }
    Some(MetadataStoreObjects {
        service: headless_service(instance),
        statefulset: statefulset(instance, config, members),
        pod_disruption_budget: pod_disruption_budget(instance),
        // Added by [`super::instance_objects`] when the operator makes NetworkPolicies.
        network_policy: None,
    })
}

fn labels(instance: &str) -> BTreeMap<String, String> {
    let mut labels = instance_labels(instance);
    labels.insert(LABEL_COMPONENT.into(), COMPONENT.into());
    labels
}

fn port(name: &str, port: i32) -> ServicePort {
    ServicePort {
        name: Some(name.into()),
        // Server-side apply needs the list key (port, protocol) complete on API servers < 1.21.
        protocol: Some("TCP".into()),
        port,
        target_port: Some(IntOrString::String(name.into())),
        ..ServicePort::default()
    }
}

/// The headless Service that gives each member its DNS name, ready or not.
pub fn headless_service(instance: &Instance) -> Service {
    let instance_name = instance.name_any();
    let namespace = instance.namespace().unwrap_or_default();
    let mut svc_meta = meta(name(&instance_name), &namespace, labels(&instance_name));
    svc_meta.owner_references = Some(owned_by(instance));
    Service {
        metadata: svc_meta,
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            // Members must resolve each other before any is ready: a member is ready only once
            // the cluster has a leader.
            publish_not_ready_addresses: Some(true),
            selector: Some(selector(&instance_name)),
            ports: Some(vec![port("client", CLIENT_PORT), port("peer", PEER_PORT)]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

/// Voluntary evictions take one member at a time: three members keep their quorum.
pub fn pod_disruption_budget(instance: &Instance) -> PodDisruptionBudget {
    let instance_name = instance.name_any();
    let namespace = instance.namespace().unwrap_or_default();
    let mut pdb_meta = meta(name(&instance_name), &namespace, labels(&instance_name));
    pdb_meta.owner_references = Some(owned_by(instance));
    PodDisruptionBudget {
        metadata: pdb_meta,
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(selector(&instance_name)),
                ..LabelSelector::default()
            }),
            ..PodDisruptionBudgetSpec::default()
        }),
        ..PodDisruptionBudget::default()
    }
}

/// The members' StatefulSet.
pub fn statefulset(instance: &Instance, config: &OperatorConfig, members: i32) -> StatefulSet {
    let instance_name = instance.name_any();
    let namespace = instance.namespace().unwrap_or_default();
    let labels = labels(&instance_name);
    let selector = selector(&instance_name);
    let tls = secrets::metadata_store_secured(instance);

    let container_port = |name: &str, port: i32| ContainerPort {
        name: Some(name.into()),
        protocol: Some("TCP".into()),
        container_port: port,
        ..ContainerPort::default()
    };
    let container = Container {
        name: "etcd".into(),
        image: Some(config.etcd_image.clone()),
        command: Some(vec!["etcd".into()]),
        args: Some(etcd_args(&instance_name, &namespace, members, tls)),
        env: Some(vec![
            env_from_field("POD_NAME", "metadata.name"),
            env_from_field("POD_NAMESPACE", "metadata.namespace"),
        ]),
        ports: Some(
            [
                container_port("client", CLIENT_PORT),
                container_port("peer", PEER_PORT),
            ]
            .into_iter()
            .chain(tls.then(|| container_port("metrics", METRICS_PORT)))
            .collect(),
        ),
        // /health answers 200 once the member sees a leader (on the metrics port when the
        // client port wants a client certificate). No liveness probe: a member without
        // quorum must wait for its peers, not be restarted in a loop.
        readiness_probe: Some(Probe {
            http_get: Some(HTTPGetAction {
                path: Some("/health".into()),
                port: IntOrString::String(if tls { "metrics" } else { "client" }.into()),
                ..HTTPGetAction::default()
            }),
            period_seconds: Some(5),
            failure_threshold: Some(3),
            timeout_seconds: Some(3),
            ..Probe::default()
        }),
        volume_mounts: Some(
            [VolumeMount {
                name: "data".into(),
                mount_path: DATA_MOUNT.into(),
                ..VolumeMount::default()
            }]
            .into_iter()
            .chain(tls.then(|| VolumeMount {
                name: "tls".into(),
                mount_path: secrets::ETCD_TLS_MOUNT.into(),
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

    let pod_spec = PodSpec {
        containers: vec![container],
        termination_grace_period_seconds: Some(GRACE_SECONDS),
        affinity: Some(Affinity {
            pod_anti_affinity: Some(PodAntiAffinity {
                preferred_during_scheduling_ignored_during_execution: Some(vec![
                    WeightedPodAffinityTerm {
                        weight: 100,
                        pod_affinity_term: PodAffinityTerm {
                            label_selector: Some(LabelSelector {
                                match_labels: Some(selector.clone()),
                                ..LabelSelector::default()
                            }),
                            topology_key: "kubernetes.io/hostname".into(),
                            ..PodAffinityTerm::default()
                        },
                    },
                ]),
                ..PodAntiAffinity::default()
            }),
            ..Affinity::default()
        }),
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
        volumes: tls.then(|| {
            vec![secret_volume(
                "tls",
                secrets::metadata_store_secret_name(&instance_name),
            )]
        }),
        // etcd never calls the Kubernetes API.
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        ..PodSpec::default()
    };

    let claim = PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some("data".into()),
            labels: Some(labels.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: Some(
                config
                    .etcd_storage_class
                    .clone()
                    .unwrap_or_else(|| config.ssd_storage_class.clone()),
            ),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".into(),
                    Quantity(STORAGE_SIZE.into()),
                )])),
                ..VolumeResourceRequirements::default()
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        ..PersistentVolumeClaim::default()
    };

    let mut sts_meta = meta(name(&instance_name), &namespace, labels.clone());
    sts_meta.owner_references = Some(owned_by(instance));
    StatefulSet {
        metadata: sts_meta,
        spec: Some(StatefulSetSpec {
            replicas: Some(members),
            selector: LabelSelector {
                match_labels: Some(selector),
                ..LabelSelector::default()
            },
            service_name: Some(name(&instance_name)),
            // Members of a new cluster must all start to elect a leader: none waits for another.
            pod_management_policy: Some("Parallel".into()),
            update_strategy: Some(StatefulSetUpdateStrategy {
                type_: Some("RollingUpdate".into()),
                ..StatefulSetUpdateStrategy::default()
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..ObjectMeta::default()
                }),
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
    use k8s_openapi::api::core::v1::PodStatus;

    fn instance(spec: &str) -> Instance {
        let mut i: Instance = serde_norway::from_str(&format!(
            "metadata: {{name: orders, namespace: shop, uid: u-1}}\nspec: {spec}\n"
        ))
        .unwrap();
        i.metadata.uid = Some("u-1".into());
        i
    }

    fn config() -> OperatorConfig {
        OperatorConfig {
            etcd_image: "registry.example/etcd:3.5".into(),
            ..OperatorConfig::default()
        }
    }

    #[test]
    fn production_runs_three_members_that_know_each_other_by_dns_name() {
        let i = instance("{displayName: Orders}");
        assert_eq!(members_for(i.spec.instance_type), 3);
        let objects = metadata_store_objects(&i, &config(), 3).unwrap();
        let sts = &objects.statefulset;
        assert_eq!(sts.metadata.name.as_deref(), Some("orders-meta"));
        let spec = sts.spec.as_ref().unwrap();
        assert_eq!(spec.replicas, Some(3));
        assert_eq!(spec.service_name.as_deref(), Some("orders-meta"));
        assert_eq!(spec.pod_management_policy.as_deref(), Some("Parallel"));
        let pod = spec.template.spec.as_ref().unwrap();
        let c = &pod.containers[0];
        assert_eq!(c.image.as_deref(), Some("registry.example/etcd:3.5"));
        assert_eq!(c.command.as_deref(), Some(&["etcd".to_string()][..]));
        let args = c.args.as_ref().unwrap();
        assert!(args.contains(&"--name=$(POD_NAME)".to_string()));
        assert!(args.contains(&"--data-dir=/var/lib/etcd/data".to_string()));
        // Production is secured by default: clients over TLS with certificates of the
        // operator's CA, peers plaintext, /health on the plaintext metrics port.
        assert!(args.contains(&"--listen-client-urls=https://0.0.0.0:2379".to_string()));
        assert!(args.contains(
            &"--advertise-client-urls=https://$(POD_NAME).orders-meta.shop.svc:2379".to_string()
        ));
        let joined = args.join(" ");
        assert!(
            joined.contains(
                "--cert-file /var/run/etcd/tls/tls.crt --key-file /var/run/etcd/tls/tls.key \
                 --client-cert-auth --trusted-ca-file /var/run/etcd/tls/ca.crt \
                 --client-cert-allowed-hostname internal.basalt \
                 --listen-metrics-urls=http://0.0.0.0:2381"
            ),
            "{joined}"
        );
        let volumes = pod.volumes.as_ref().unwrap();
        assert_eq!(
            volumes[0].secret.as_ref().unwrap().secret_name.as_deref(),
            Some("orders-meta-tls")
        );
        assert!(
            args.contains(
                &"--initial-cluster=orders-meta-0=http://orders-meta-0.orders-meta.shop.svc:2380,\
              orders-meta-1=http://orders-meta-1.orders-meta.shop.svc:2380,\
              orders-meta-2=http://orders-meta-2.orders-meta.shop.svc:2380"
                    .to_string()
            )
        );
        assert!(args.contains(&"--initial-cluster-state=new".to_string()));
        let probe = c
            .readiness_probe
            .as_ref()
            .unwrap()
            .http_get
            .as_ref()
            .unwrap();
        assert_eq!(
            (probe.path.as_deref(), &probe.port),
            (Some("/health"), &IntOrString::String("metrics".into()))
        );
        assert!(c.liveness_probe.is_none());
        // The volume: the operator's SSD class unless an etcd class is configured.
        let claim = &spec.volume_claim_templates.as_ref().unwrap()[0];
        let claim_spec = claim.spec.as_ref().unwrap();
        assert_eq!(claim_spec.storage_class_name.as_deref(), Some("ssd"));
        let with_class = OperatorConfig {
            etcd_storage_class: Some("etcd-local".into()),
            ..config()
        };
        let sts = statefulset(&i, &with_class, 3);
        assert_eq!(
            sts.spec.unwrap().volume_claim_templates.unwrap()[0]
                .spec
                .as_ref()
                .unwrap()
                .storage_class_name
                .as_deref(),
            Some("etcd-local")
        );
        // Anti-affinity on the host, preferred.
        let anti = pod
            .affinity
            .as_ref()
            .unwrap()
            .pod_anti_affinity
            .as_ref()
            .unwrap();
        let term = &anti
            .preferred_during_scheduling_ignored_during_execution
            .as_ref()
            .unwrap()[0];
        assert_eq!(
            term.pod_affinity_term.topology_key,
            "kubernetes.io/hostname"
        );
        // Owned by the Instance; labelled as the metadata store.
        assert_eq!(
            sts.metadata.owner_references.as_ref().unwrap()[0].kind,
            "Instance"
        );
        assert_eq!(
            sts.metadata.labels.as_ref().unwrap()[LABEL_COMPONENT],
            "metadata-store"
        );

        let svc = objects.service.spec.unwrap();
        assert_eq!(svc.cluster_ip.as_deref(), Some("None"));
        assert_eq!(svc.publish_not_ready_addresses, Some(true));
        let ports: Vec<i32> = svc.ports.unwrap().iter().map(|p| p.port).collect();
        assert_eq!(ports, [2379, 2380]);
        assert_eq!(
            objects.pod_disruption_budget.spec.unwrap().max_unavailable,
            Some(IntOrString::Int(1))
        );
    }

    #[test]
    fn development_runs_one_member_and_an_existing_etcd_none() {
        let dev = instance("{displayName: Orders, type: Development}");
        assert_eq!(members_for(dev.spec.instance_type), 1);
        let sts = metadata_store_objects(&dev, &config(), 1)
            .unwrap()
            .statefulset;
        let args = sts.spec.unwrap().template.spec.unwrap().containers[0]
            .args
            .clone()
            .unwrap();
        assert!(
            args.contains(
                &"--initial-cluster=orders-meta-0=http://orders-meta-0.orders-meta.shop.svc:2380"
                    .to_string()
            )
        );
        assert_eq!(
            client_urls(&dev, 1),
            ["http://orders-meta-0.orders-meta.shop.svc:2379"]
        );

        let external = instance(
            "{displayName: Orders, metadataStore: {endpoints: ['http://etcd.infra.svc:2379']}}",
        );
        assert!(metadata_store_objects(&external, &config(), 3).is_none());
        assert_eq!(client_urls(&external, 3), ["http://etcd.infra.svc:2379"]);
        assert_eq!(
            operator_urls(&external, &[]),
            ["http://etcd.infra.svc:2379"]
        );
    }

    #[test]
    fn the_operator_reaches_its_members_by_pod_ip_in_member_order() {
        let i = instance("{displayName: Orders}");
        let pod = |ns: &str, name: &str, instance: &str, ip: Option<&str>| {
            let mut p = Pod::default();
            p.metadata.name = Some(name.into());
            p.metadata.namespace = Some(ns.into());
            p.metadata.labels = Some(selector(instance));
            p.status = Some(PodStatus {
                pod_ip: ip.map(String::from),
                ..PodStatus::default()
            });
            p
        };
        let pods = [
            pod("shop", "orders-meta-1", "orders", Some("10.1.0.9")),
            pod("shop", "orders-meta-0", "orders", Some("10.1.0.7")),
            pod("shop", "orders-meta-2", "orders", None),
            pod("other", "orders-meta-0", "orders", Some("10.2.0.1")),
            pod("shop", "users-meta-0", "users", Some("10.1.0.3")),
        ];
        assert_eq!(
            operator_urls(&i, &pods),
            ["https://10.1.0.7:2379", "https://10.1.0.9:2379"]
        );
        let plaintext = instance("{displayName: Orders, security: {tls: Disabled}}");
        assert_eq!(
            operator_urls(&plaintext, &pods),
            ["http://10.1.0.7:2379", "http://10.1.0.9:2379"]
        );
        assert!(operator_urls(&i, &[]).is_empty());
    }
}
