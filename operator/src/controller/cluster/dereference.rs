//! Cluster, stage 1: every read the reconcile needs — the cluster's StatefulSet as it is, its
//! Instance, what its tablet servers serve (control protocol), and its tablet map and
//! registered servers (the instance's metadata store).

use std::time::Duration;

use basalt_master::model::Tablet;
use basalt_meta::{Keys, Meta, ServerRecord};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams};

use crate::build;
use crate::controller::{Context, Result};
use crate::crd::{Cluster, Instance};

/// How long the reconcile waits for the metadata store before it reports without it.
const PLACEMENT_DEADLINE: Duration = Duration::from_secs(4);

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
    /// The cluster's tablets and servers in the metadata store (None when it could not be
    /// read: no member reachable yet, or no Instance).
    pub placement: Option<Placement>,
}

/// A cluster's tablet map and registered (live) servers, as the metadata store holds them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Placement {
    /// Every tablet of every table in the cluster, with its owner and state.
    pub tablets: Vec<Tablet>,
    /// The registrations of the cluster's live servers.
    pub servers: Vec<ServerRecord>,
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
    let placement = match &instance {
        Some(instance) => observe_placement(ctx, instance, &name).await?,
        None => None,
    };
    Ok(Dereferenced {
        statefulset,
        instance,
        serving,
        placement,
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

/// Reads the cluster's tablet map and registrations from the instance's metadata store,
/// reached as the operator reaches it ([`build::etcd::operator_urls`]). None, logged, when
/// the store does not answer within [`PLACEMENT_DEADLINE`]: the status keeps what it said.
pub async fn observe_placement(
    ctx: &Context,
    instance: &Instance,
    cluster: &str,
) -> Result<Option<Placement>> {
    let ns = instance.namespace().unwrap_or_default();
    let endpoints = if instance.spec.metadata_store.is_some() {
        build::etcd::operator_urls(instance, &[])
    } else {
        let selector = build::selector_string(&build::etcd::selector(&instance.name_any()));
        let pods = Api::<Pod>::namespaced(ctx.client.clone(), &ns)
            .list(&ListParams::default().labels(&selector))
            .await?;
        build::etcd::operator_urls(instance, &pods.items)
    };
    if endpoints.is_empty() {
        return Ok(None);
    }
    let keys = Keys::new(&ns, &instance.name_any());
    let read = async {
        let meta = Meta::connect(&endpoints, keys).await?;
        let (map, _) = meta.tablets(cluster).await?;
        let (servers, _) = meta.servers(Some(cluster)).await?;
        let tablets = map
            .tables()
            .flat_map(|t| map.tablets(t).iter().cloned())
            .collect();
        let servers = servers.into_iter().map(|r| r.record).collect();
        Ok::<_, basalt_master::model::Error>(Placement { tablets, servers })
    };
    match tokio::time::timeout(PLACEMENT_DEADLINE, read).await {
        Ok(Ok(placement)) => Ok(Some(placement)),
        Ok(Err(error)) => {
            tracing::info!(%error, ?endpoints, "the metadata store did not answer; tablets per node not updated");
            Ok(None)
        }
        Err(_) => {
            tracing::info!(
                ?endpoints,
                "the metadata store did not answer in time; tablets per node not updated"
            );
            Ok(None)
        }
    }
}
