//! Instance, stage 1: every read the reconcile needs — the instance's Clusters, and its
//! metadata store's StatefulSet as it is.

use k8s_openapi::api::apps::v1::StatefulSet;
use kube::ResourceExt;
use kube::api::{Api, ListParams};

use crate::build;
use crate::controller::{Context, Result};
use crate::crd::{Cluster, Instance};

/// What the reads found.
#[derive(Debug, Clone, Default)]
pub struct Dereferenced {
    /// The Clusters whose `instanceRef` names the instance.
    pub clusters: Vec<Cluster>,
    /// The StatefulSet of the instance's own etcd (None before it exists, or for an existing
    /// etcd): its member count cannot change, and its ready members make the store's status.
    pub metadata_store: Option<StatefulSet>,
}

pub async fn dereference(ctx: &Context, instance: &Instance) -> Result<Dereferenced> {
    let ns = instance.namespace().unwrap_or_default();
    let name = instance.name_any();
    let clusters = Api::<Cluster>::namespaced(ctx.client.clone(), &ns)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|c| c.spec.instance_ref == name)
        .collect();
    let metadata_store = Api::<StatefulSet>::namespaced(ctx.client.clone(), &ns)
        .get_opt(&build::etcd::name(&name))
        .await?;
    Ok(Dereferenced {
        clusters,
        metadata_store,
    })
}
