//! AppProfile, stage 1: every read the reconcile needs — the Instance, the names of its
//! clusters, and where the operator reaches its metadata store (etcd).

use std::collections::BTreeSet;

use kube::ResourceExt;
use kube::api::{Api, ListParams};

use crate::controller::{Context, Result};
use crate::crd::{AppProfile, Cluster, Instance};

/// What the reads found.
#[derive(Debug, Clone, Default)]
pub struct Dereferenced {
    /// The Instance the profile belongs to (None if it does not exist).
    pub instance: Option<Instance>,
    /// The ids of the instance's clusters (empty without the instance).
    pub clusters: BTreeSet<String>,
    /// The etcd endpoints of the instance's catalog, as the operator reaches them (empty
    /// without the instance, or while no member of its store has an address).
    pub endpoints: Vec<String>,
}

pub async fn dereference(ctx: &Context, profile: &AppProfile) -> Result<Dereferenced> {
    let ns = profile.namespace().unwrap_or_default();
    let instance_name = &profile.spec.instance_ref;
    let instance = Api::<Instance>::namespaced(ctx.client.clone(), &ns)
        .get_opt(instance_name)
        .await?;
    let clusters = match &instance {
        None => BTreeSet::new(),
        Some(_) => Api::<Cluster>::namespaced(ctx.client.clone(), &ns)
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|c| &c.spec.instance_ref == instance_name)
            .map(|c| c.name_any())
            .collect(),
    };
    let endpoints = match &instance {
        None => vec![],
        Some(instance) => {
            crate::controller::instance::dereference::store_endpoints(ctx, instance).await?
        }
    };
    Ok(Dereferenced {
        instance,
        clusters,
        endpoints,
    })
}
