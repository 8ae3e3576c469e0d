//! Instance, stage 4: server-side apply of the ConfigMap, the client Service, then the
//! metadata store (its headless Service, its PodDisruptionBudget, its StatefulSet last); then
//! the replication limits recorded in the metadata store, as the local runtime records them
//! ([`crate::lifecycle::records::put_replication_limits`]).

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::ResourceExt;
use kube::api::Api;

use super::validate::ValidatedInstance;
use crate::build::{self, InstanceObjects};
use crate::controller::{Context, Note, Result, apply as server_side_apply};
use crate::crd::Instance;
use crate::lifecycle::records::{self, Catalog};
use basalt_meta::Keys;

/// What the apply left on the API server.
#[derive(Debug, Clone)]
pub struct Applied {
    /// The client Service.
    pub service: Service,
    /// The metadata store's StatefulSet (None for an existing etcd); its status is the
    /// members' readiness.
    pub metadata_store: Option<StatefulSet>,
}

/// Applies the instance's objects; until the status reports an endpoint, an event says where
/// clients connect, and an event reports the creation of the metadata store.
pub async fn apply(
    ctx: &Context,
    validated: &ValidatedInstance<'_>,
    objects: &InstanceObjects,
) -> Result<Applied> {
    let instance = validated.instance;
    let ns = instance.namespace().unwrap_or_default();
    server_side_apply(
        &Api::<ConfigMap>::namespaced(ctx.client.clone(), &ns),
        &objects.config_map,
    )
    .await?;
    let services = Api::<Service>::namespaced(ctx.client.clone(), &ns);
    let service = server_side_apply(&services, &objects.service).await?;
    let reported = instance
        .status
        .as_ref()
        .is_some_and(|s| s.endpoint.is_some());
    if !reported {
        let note = Note::normal(
            "EndpointCreated",
            "Create",
            format!(
                "clients connect to Service {} on port {}",
                service.name_any(),
                build::GRPC_PORT
            ),
        );
        ctx.publish(instance, &note).await;
    }

    let Some(store) = &objects.metadata_store else {
        return Ok(Applied {
            service,
            metadata_store: None,
        });
    };
    server_side_apply(&services, &store.service).await?;
    if ctx.pdb_supported {
        let pdbs: Api<PodDisruptionBudget> = Api::namespaced(ctx.client.clone(), &ns);
        server_side_apply(&pdbs, &store.pod_disruption_budget).await?;
    }
    if let Some(policy) = &store.network_policy {
        let policies: Api<NetworkPolicy> = Api::namespaced(ctx.client.clone(), &ns);
        server_side_apply(&policies, policy).await?;
    }
    let statefulsets: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), &ns);
    let existed = statefulsets
        .get_opt(&store.statefulset.name_any())
        .await?
        .is_some();
    let sts = server_side_apply(&statefulsets, &store.statefulset).await?;
    if !existed {
        let note = Note::normal(
            "MetadataStoreCreated",
            "Create",
            format!(
                "created the metadata store: etcd StatefulSet {} with {} member(s)",
                sts.name_any(),
                validated.etcd_members
            ),
        );
        ctx.publish(instance, &note).await;
    }
    Ok(Applied {
        service,
        metadata_store: Some(sts),
    })
}

/// A secured instance's Secrets ([`build::secrets`]): read, issued where missing or due,
/// applied; an event for each certificate issued. Before the StatefulSets, whose pods mount
/// them.
pub async fn apply_secrets(ctx: &Context, instance: &Instance) -> Result<()> {
    if !build::secrets::secured(instance) {
        return Ok(());
    }
    let Some(pki) = &ctx.pki else {
        // The same refusal the transport gives.
        ctx.transport(instance)?;
        return Ok(());
    };
    let ns = instance.namespace().unwrap_or_default();
    let name = instance.name_any();
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let mut names: Vec<String> = crate::lifecycle::security::identity_names(instance)
        .iter()
        .map(|i| build::secrets::identity_secret_name(&name, i))
        .collect();
    names.push(build::secrets::server_secret_name(&name));
    names.push(build::secrets::metadata_store_secret_name(&name));
    let mut existing = std::collections::BTreeMap::new();
    for secret_name in names {
        if let Some(secret) = secrets.get_opt(&secret_name).await? {
            existing.insert(secret_name, secret);
        }
    }
    let desired = build::secrets::instance_secrets(
        instance,
        pki.ca(),
        &existing,
        std::time::SystemTime::now(),
    )
    .map_err(|e| crate::controller::Error::Certificates(e.to_string()))?;
    for d in desired {
        server_side_apply(&secrets, &d.secret).await?;
        if let Some(why) = d.issued {
            let note = Note::normal(
                "CertificateIssued",
                "Issue",
                format!(
                    "issued the certificate in Secret {} ({why})",
                    d.secret.name_any()
                ),
            );
            ctx.publish(instance, &note).await;
        }
    }
    Ok(())
}

/// The ClusterRole the instance's servers are bound to for TokenReviews: the operator's
/// `--token-reviewer-cluster-role`, for an instance reviewing ServiceAccount tokens.
pub fn token_review_role<'a>(ctx: &'a Context, instance: &Instance) -> Option<&'a str> {
    ctx.config
        .token_reviewer_cluster_role
        .as_deref()
        .filter(|_| instance.spec.token_review())
}

/// The tablet servers' ServiceAccount and its binding to the token reviewer's ClusterRole
/// ([`build::token_review`]), for an instance reviewing ServiceAccount tokens.
pub async fn apply_token_review(ctx: &Context, instance: &Instance) -> Result<()> {
    if !instance.spec.token_review() {
        return Ok(());
    }
    let ns = instance.namespace().unwrap_or_default();
    server_side_apply(
        &Api::<ServiceAccount>::namespaced(ctx.client.clone(), &ns),
        &build::token_review::server_service_account(instance),
    )
    .await?;
    match token_review_role(ctx, instance) {
        Some(role) => {
            let bindings: Api<ClusterRoleBinding> = Api::all(ctx.client.clone());
            server_side_apply(&bindings, &build::token_review::binding(instance, role)).await?;
        }
        None => {
            let note = Note::warning(
                "TokenReviewNotBound",
                "Bind",
                format!(
                    "the operator has no --token-reviewer-cluster-role: grant ServiceAccount {} the right to create tokenreviews, or its servers refuse every ServiceAccount token (UNAVAILABLE)",
                    build::token_review::server_service_account_name(&instance.name_any())
                ),
            );
            ctx.publish(instance, &note).await;
        }
    }
    Ok(())
}

/// Deletes the instance's token-review binding, if there is one.
pub async fn delete_token_review_binding(ctx: &Context, instance: &Instance) -> Result<()> {
    let bindings: Api<ClusterRoleBinding> = Api::all(ctx.client.clone());
    let name = build::token_review::binding_name(
        &instance.namespace().unwrap_or_default(),
        &instance.name_any(),
    );
    match bindings.delete(&name, &Default::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Records `spec.replication` in the instance's metadata store, where the tablet servers'
/// shippers and the master read it. Not an error of the reconcile: while the store has no
/// member or does not answer, the next reconcile writes it (the servers ship and seed without
/// a limit until then, as they did before the limit was set).
pub async fn record_replication_limits(ctx: &Context, instance: &Instance) {
    let endpoints = match super::dereference::store_endpoints(ctx, instance).await {
        Ok(endpoints) => endpoints,
        Err(error) => {
            tracing::info!(%error, "cannot find the metadata store to record the replication limits");
            return;
        }
    };
    let keys = Keys::new(
        &instance.namespace().unwrap_or_default(),
        &instance.name_any(),
    );
    let limits = instance.spec.replication_limits();
    let transport = match ctx.transport(instance) {
        Ok(transport) => transport,
        Err(error) => {
            tracing::info!(%error, "cannot reach the metadata store to record the replication limits");
            return;
        }
    };
    match records::put_replication_limits(&endpoints, &transport.etcd, keys, &limits).await {
        Catalog::Recorded => {}
        not => tracing::info!(?not, ?limits, "the replication limits are not recorded yet"),
    }
}
