//! The NetworkPolicy of an instance's metadata store (`<instance>-meta`), made when the
//! operator is told to ([`super::OperatorConfig::network_policy_operator_namespace`]; the
//! chart's `networkPolicies.enabled`): etcd's client port admits only the instance's tablet
//! servers and the operator's pods (its controllers and the instance's master run there), its
//! peer port only the store's own members; its metrics port (a plaintext `/health` and
//! `/metrics` when the client port speaks TLS) stays open to probes and Prometheus. The
//! tablet servers' gRPC port is not restricted: it is the instance's endpoint, and a secured
//! instance authenticates every caller there (docs/security.md).
//!
//! A policy only holds where the cluster's network plugin enforces NetworkPolicies.

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;

use super::etcd::{CLIENT_PORT, METRICS_PORT, PEER_PORT};
use super::{
    LABEL_COMPONENT, LABEL_INSTANCE, LABEL_NAME, instance_labels, meta, metadata_store_name,
    owned_by,
};
use crate::crd::Instance;

/// The label every namespace carries with its name (Kubernetes 1.21+).
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";
/// The `app.kubernetes.io/name` of the operator's pods (the chart's).
pub const OPERATOR_NAME: &str = "basalt-operator";

/// The metadata store's policy; `operator_namespace` is where the operator's pods run.
pub fn metadata_store_network_policy(
    instance: &Instance,
    operator_namespace: &str,
) -> NetworkPolicy {
    let name = instance.name_any();
    let namespace = instance.namespace().unwrap_or_default();
    let selector = |labels: BTreeMap<String, String>| LabelSelector {
        match_labels: Some(labels),
        ..LabelSelector::default()
    };
    let members = super::etcd::selector(&name);
    // The instance's servers by labels their pods keep for life (`basalt.dev/instance` is
    // taken off the pods of a Cluster leaving a replicated instance, which still ship).
    let servers = BTreeMap::from([
        (LABEL_NAME.to_string(), "basalt".to_string()),
        (LABEL_COMPONENT.to_string(), "tablet-server".to_string()),
        (LABEL_INSTANCE.to_string(), name.clone()),
    ]);
    let operator = NetworkPolicyPeer {
        namespace_selector: Some(selector(BTreeMap::from([(
            NAMESPACE_NAME_LABEL.to_string(),
            operator_namespace.to_string(),
        )]))),
        pod_selector: Some(selector(BTreeMap::from([(
            LABEL_NAME.to_string(),
            OPERATOR_NAME.to_string(),
        )]))),
        ..NetworkPolicyPeer::default()
    };
    let pods = |labels: BTreeMap<String, String>| NetworkPolicyPeer {
        pod_selector: Some(selector(labels)),
        ..NetworkPolicyPeer::default()
    };
    let port = |port: i32| NetworkPolicyPort {
        port: Some(IntOrString::Int(port)),
        protocol: Some("TCP".into()),
        ..NetworkPolicyPort::default()
    };
    let mut policy_meta = meta(
        metadata_store_name(&name),
        &namespace,
        instance_labels(&name),
    );
    policy_meta.owner_references = Some(owned_by(instance));
    NetworkPolicy {
        metadata: policy_meta,
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(selector(members.clone())),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(vec![
                NetworkPolicyIngressRule {
                    from: Some(vec![pods(servers), operator]),
                    ports: Some(vec![port(CLIENT_PORT)]),
                },
                NetworkPolicyIngressRule {
                    from: Some(vec![pods(members)]),
                    ports: Some(vec![port(PEER_PORT), port(CLIENT_PORT)]),
                },
                NetworkPolicyIngressRule {
                    from: None,
                    ports: Some(vec![port(METRICS_PORT)]),
                },
            ]),
            ..NetworkPolicySpec::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_admits_its_servers_the_operator_and_its_peers() {
        let instance: Instance = serde_norway::from_str(
            "metadata: {name: orders, namespace: shop, uid: u1}\nspec: {displayName: Orders}\n",
        )
        .unwrap();
        let p = metadata_store_network_policy(&instance, "basalt-system");
        assert_eq!(p.metadata.name.as_deref(), Some("orders-meta"));
        assert_eq!(p.metadata.namespace.as_deref(), Some("shop"));
        assert_eq!(
            p.metadata.owner_references.as_ref().unwrap()[0].kind,
            "Instance"
        );
        let spec = serde_json::to_value(p.spec.unwrap()).unwrap();
        assert_eq!(
            spec["podSelector"]["matchLabels"]["app.kubernetes.io/component"],
            "metadata-store"
        );
        let ingress = spec["ingress"].as_array().unwrap();
        // Client port: the instance's servers and the operator's pods in its namespace.
        assert_eq!(ingress[0]["ports"][0]["port"], 2379);
        let from = &ingress[0]["from"];
        assert_eq!(
            from[0]["podSelector"]["matchLabels"]["app.kubernetes.io/instance"],
            "orders"
        );
        assert_eq!(
            from[0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"],
            "tablet-server"
        );
        assert_eq!(
            from[1]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
            "basalt-system"
        );
        assert_eq!(
            from[1]["podSelector"]["matchLabels"]["app.kubernetes.io/name"],
            "basalt-operator"
        );
        // Peers: only the members.
        assert_eq!(ingress[1]["ports"][0]["port"], 2380);
        assert_eq!(
            ingress[1]["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"],
            "metadata-store"
        );
        // Metrics: from anywhere.
        assert_eq!(ingress[2]["ports"][0]["port"], 2381);
        assert!(ingress[2].get("from").is_none());
    }
}
