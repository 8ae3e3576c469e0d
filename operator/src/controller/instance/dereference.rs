//! Instance, stage 1: every read the reconcile needs — the instance's Clusters, its metadata
//! store's StatefulSet as it is, and (with several clusters) how far each cluster's writes
//! reached the others, from the metadata store.

use std::time::Duration;

use basalt_meta::{Keys, Meta};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams};

use crate::build;
use crate::controller::{Context, Result};
use crate::crd::{Cluster, Instance};
use crate::lifecycle::replication::{self, Replication};

/// How long the reconcile waits for the metadata store before it reports without it.
const STORE_DEADLINE: Duration = Duration::from_secs(4);

/// What the reads found.
#[derive(Debug, Clone, Default)]
pub struct Dereferenced {
    /// The Clusters whose `instanceRef` names the instance.
    pub clusters: Vec<Cluster>,
    /// The StatefulSet of the instance's own etcd (None before it exists, or for an existing
    /// etcd): its member count cannot change, and its ready members make the store's status.
    pub metadata_store: Option<StatefulSet>,
    /// Replication between the instance's clusters, per ordered pair (None: one cluster, or
    /// the metadata store did not answer).
    pub replication: Option<Replication>,
}

pub async fn dereference(ctx: &Context, instance: &Instance) -> Result<Dereferenced> {
    let ns = instance.namespace().unwrap_or_default();
    let name = instance.name_any();
    let clusters: Vec<Cluster> = Api::<Cluster>::namespaced(ctx.client.clone(), &ns)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|c| c.spec.instance_ref == name)
        .collect();
    let metadata_store = Api::<StatefulSet>::namespaced(ctx.client.clone(), &ns)
        .get_opt(&build::etcd::name(&name))
        .await?;
    let replication = if clusters.len() > 1 {
        observe_replication(ctx, instance).await?
    } else {
        None
    };
    Ok(Dereferenced {
        clusters,
        metadata_store,
        replication,
    })
}

/// Where the operator reaches the instance's metadata store
/// ([`build::etcd::operator_urls`]): `spec.metadataStore.endpoints`, else the pod IPs of the
/// instance's etcd members.
pub async fn store_endpoints(ctx: &Context, instance: &Instance) -> Result<Vec<String>> {
    if instance.spec.metadata_store.is_some() {
        return Ok(build::etcd::operator_urls(instance, &[]));
    }
    let selector = build::selector_string(&build::etcd::selector(&instance.name_any()));
    let pods = Api::<Pod>::namespaced(
        ctx.client.clone(),
        &instance.namespace().unwrap_or_default(),
    )
    .list(&ListParams::default().labels(&selector))
    .await?;
    Ok(build::etcd::operator_urls(instance, &pods.items))
}

/// The replication pairs of the instance's replicas, from the positions its servers report
/// in the metadata store; None (logged) when it does not answer in time.
async fn observe_replication(ctx: &Context, instance: &Instance) -> Result<Option<Replication>> {
    let endpoints = store_endpoints(ctx, instance).await?;
    if endpoints.is_empty() {
        return Ok(None);
    }
    let keys = Keys::new(
        &instance.namespace().unwrap_or_default(),
        &instance.name_any(),
    );
    let transport = ctx.transport(instance)?;
    let read = async {
        let endpoints = basalt_meta::endpoints(&endpoints, &transport.etcd)?;
        let meta = Meta::connect(&endpoints, keys).await?;
        replication::observe(&meta).await
    };
    match tokio::time::timeout(STORE_DEADLINE, read).await {
        Ok(Ok(observed)) => Ok(Some(observed)),
        Ok(Err(error)) => {
            tracing::info!(%error, "the metadata store did not say how replication stands");
            Ok(None)
        }
        Err(_) => Ok(None),
    }
}
