//! ServiceAccount tokens for a secured instance (`spec.security.serviceAccountTokens`): its
//! tablet servers run as the ServiceAccount `<instance>-tablet-server` (owned by the
//! Instance, its token mounted) and check bearer tokens with TokenReviews
//! (`--token-review`), which the ClusterRoleBinding `basalt:token-review:<ns>:<instance>`
//! allows them: it binds that ServiceAccount to the chart's token-reviewer ClusterRole
//! (`tokenreviews` create, nothing else). A binding is cluster-scoped, so the Instance cannot
//! own it; the Instance's finalizer `basalt.dev/token-review-binding` deletes it.

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;

use super::{instance_labels, meta, owned_by};
use crate::crd::Instance;

/// Present on an Instance while its token-review binding may exist.
pub const BINDING_FINALIZER: &str = "basalt.dev/token-review-binding";

/// The ServiceAccount an instance's tablet servers run as when they review tokens.
pub fn server_service_account_name(instance: &str) -> String {
    format!("{instance}-tablet-server")
}

/// The ClusterRoleBinding of an instance (unique across namespaces: `:` is in no namespace
/// or instance name).
pub fn binding_name(namespace: &str, instance: &str) -> String {
    format!("basalt:token-review:{namespace}:{instance}")
}

/// The tablet servers' ServiceAccount.
pub fn server_service_account(instance: &Instance) -> ServiceAccount {
    let name = instance.name_any();
    let namespace = instance.namespace().unwrap_or_default();
    ServiceAccount {
        metadata: ObjectMeta {
            owner_references: Some(owned_by(instance)),
            ..meta(
                server_service_account_name(&name),
                &namespace,
                instance_labels(&name),
            )
        },
        ..ServiceAccount::default()
    }
}

/// The binding of the servers' ServiceAccount to `cluster_role`.
pub fn binding(instance: &Instance, cluster_role: &str) -> ClusterRoleBinding {
    let name = instance.name_any();
    let namespace = instance.namespace().unwrap_or_default();
    let mut labels = instance_labels(&name);
    labels.insert(NAMESPACE_LABEL.into(), namespace.clone());
    ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(binding_name(&namespace, &name)),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: cluster_role.into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: server_service_account_name(&name),
            namespace: Some(namespace),
            ..Subject::default()
        }]),
    }
}

/// The label saying which namespace a cluster-scoped object of an instance belongs to.
pub const NAMESPACE_LABEL: &str = "basalt.dev/namespace";

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(tls: bool, tokens: bool) -> Instance {
        let kind = if tls { "Production" } else { "Development" };
        let mut i: Instance = serde_norway::from_str(&format!(
            "metadata: {{name: orders, namespace: shop, uid: uid-1}}\nspec: {{displayName: Orders, type: {kind}, security: {{serviceAccountTokens: {tokens}}}}}\n"
        ))
        .unwrap();
        i.metadata.uid = Some("uid-1".into());
        i
    }

    #[test]
    fn token_review_needs_tls_and_the_field() {
        assert!(instance(true, true).spec.token_review());
        assert!(!instance(true, false).spec.token_review());
        assert!(!instance(false, true).spec.token_review());
    }

    #[test]
    fn the_binding_names_the_servers_service_account_and_the_role() {
        let i = instance(true, true);
        let sa = server_service_account(&i);
        assert_eq!(sa.name_any(), "orders-tablet-server");
        assert_eq!(sa.namespace().as_deref(), Some("shop"));
        assert_eq!(sa.owner_references()[0].uid, "uid-1");
        let b = binding(&i, "basalt-operator-token-reviewer");
        assert_eq!(b.name_any(), "basalt:token-review:shop:orders");
        assert_eq!(b.role_ref.name, "basalt-operator-token-reviewer");
        assert_eq!(b.role_ref.kind, "ClusterRole");
        let subjects = b.subjects.unwrap();
        assert_eq!(subjects.len(), 1);
        assert_eq!(subjects[0].kind, "ServiceAccount");
        assert_eq!(subjects[0].name, "orders-tablet-server");
        assert_eq!(subjects[0].namespace.as_deref(), Some("shop"));
        assert_eq!(b.metadata.labels.unwrap()[NAMESPACE_LABEL], "shop");
        // Cluster-scoped: no owner the API server would refuse.
        assert!(b.metadata.owner_references.is_none());
        assert!(b.metadata.namespace.is_none());
    }
}
