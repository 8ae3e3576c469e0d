//! Cluster, stage 1: every read the reconcile needs — the cluster's StatefulSet as it is, its
//! Instance, and what its tablet servers serve.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams};

use crate::build;
use crate::controller::{Context, Result};
use crate::crd::{Cluster, Instance};

/// What the reads found.
#[derive(Debug, Clone, Default)]
pub struct Dereferenced {
    /// The cluster's StatefulSet (None before the first apply): what cannot change any more,
    /// and the current node count.
    pub statefulset: Option<StatefulSet>,
    /// The Instance the cluster belongs to (None if it does not exist).
    pub instance: Option<Instance>,
    /// What the cluster's tablet servers serve.
    pub serving: Serving,
}

pub async fn dereference(ctx: &Context, cluster: &Cluster) -> Result<Dereferenced> {
    let ns = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    let statefulset = Api::<StatefulSet>::namespaced(ctx.client.clone(), &ns)
        .get_opt(&build::statefulset_name(&name))
        .await?;
    let instance = Api::<Instance>::namespaced(ctx.client.clone(), &ns)
        .get_opt(&cluster.spec.instance_ref)
        .await?;
    let serving = observe_servers(ctx, &ns, &name).await?;
    Ok(Dereferenced {
        statefulset,
        instance,
        serving,
    })
}

/// What the cluster's tablet servers serve (tablets, stored bytes), summed over those that
/// answered.
pub use crate::tablet_servers::Serving;

/// Asks the cluster's tablet servers what they serve, over Basalt's control protocol
/// (`GetServerStatus` on each pod's gRPC port, all at once, a short deadline each): the one
/// place the Cluster status learns it. A tablet server that does not answer is left out.
pub async fn observe_servers(ctx: &Context, ns: &str, cluster: &str) -> Result<Serving> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let selector = build::selector_string(&build::cluster_selector(cluster));
    let list = pods.list(&ListParams::default().labels(&selector)).await?;
    let addresses: Vec<String> = list
        .items
        .iter()
        .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
        .map(|ip| format!("{ip}:{}", build::GRPC_PORT))
        .collect();
    Ok(crate::tablet_servers::observe_servers(&addresses).await)
}
