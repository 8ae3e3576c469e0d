//! Cluster, stage 1: every read the reconcile needs — the cluster's StatefulSet as it is, its
//! Instance, what its tablet servers serve (control protocol), and its tablet map, registered
//! servers, moves in progress and recorded serveNodes (the instance's metadata store).

use std::time::Duration;

use basalt_master::{ServerState, TabletControl};
use basalt_meta::{Keys, Meta};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ListParams};

use crate::build;
use crate::controller::{Context, Result};
use crate::crd::{Cluster, Instance};
use crate::lifecycle;
use crate::lifecycle::records::Replica;
use crate::lifecycle::view::ServerBook;

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
    /// The connection the placement was read through, for the one write the reconcile makes
    /// there (the cluster's serveNodes); None with the placement.
    pub store: Option<Store>,
    /// The Clusters of the same Instance (this one included), by name, with their peer
    /// endpoints: they replicate with each other.
    pub replicas: Vec<Replica>,
    /// When the reads were made (the scale-in's settle time is measured against it).
    pub now: Timestamp,
}

/// A connection to the instance's metadata store.
#[derive(Clone)]
pub struct Store(pub Meta);

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Store")
    }
}

pub use crate::lifecycle::view::Placement;

pub async fn dereference(ctx: &Context, cluster: &Cluster) -> Result<Dereferenced> {
    let ns = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    let statefulset = Api::<StatefulSet>::namespaced(ctx.client.clone(), &ns)
        .get_opt(&build::statefulset_name(&name))
        .await?;
    let instance = Api::<Instance>::namespaced(ctx.client.clone(), &ns)
        .get_opt(&cluster.spec.instance_ref)
        .await?;
    // How the instance's servers are reached (plaintext without the instance: there are none
    // to reach).
    let dialer = match &instance {
        Some(instance) => ctx.transport(instance)?.dialer.clone(),
        None => ctx.dialer.clone(),
    };
    let serving = observe_servers(ctx, &dialer, &ns, &name).await?;
    // The servers' volumes matter only to a drain: asked for while a scale-in may be under way.
    let current = statefulset.as_ref().and_then(|s| s.spec.as_ref()?.replicas);
    let scaling_in = current
        .is_some_and(|c| build::desired_serve_nodes(cluster, current, None) < c)
        || cluster
            .status
            .as_ref()
            .is_some_and(|s| s.scale_in.is_some());
    let (placement, store) = match &instance {
        Some(instance) => observe_placement(ctx, instance, &name, scaling_in).await?,
        None => (None, None),
    };
    let replica = |c: &Cluster| Replica {
        cluster: c.name_any(),
        peer_endpoint: c.spec.peer_endpoint.clone(),
    };
    let mut replicas: Vec<Replica> = Api::<Cluster>::namespaced(ctx.client.clone(), &ns)
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|c| {
            c.spec.instance_ref == cluster.spec.instance_ref
                && c.metadata.deletion_timestamp.is_none()
                && c.name_any() != name
        })
        .map(replica)
        .collect();
    // This one as this reconcile reads it (also when it is being deleted).
    replicas.push(replica(cluster));
    replicas.sort_by(|a, b| a.cluster.cmp(&b.cluster));
    Ok(Dereferenced {
        statefulset,
        instance,
        serving,
        placement,
        store,
        replicas,
        now: Timestamp::now(),
    })
}

/// What the cluster's tablet servers serve (tablets, stored bytes), summed over those that
/// answered.
pub use crate::tablet_servers::Serving;

/// Asks the cluster's tablet servers what they serve, over Basalt's control protocol
/// (`GetServerStatus` on each pod's gRPC port, all at once, a short deadline each): the one
/// place the Cluster status learns it. A tablet server that does not answer is left out.
pub async fn observe_servers(
    ctx: &Context,
    dialer: &basalt_control::Dialer,
    ns: &str,
    cluster: &str,
) -> Result<Serving> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let selector = build::selector_string(&build::cluster_selector(cluster));
    let list = pods.list(&ListParams::default().labels(&selector)).await?;
    let addresses: Vec<String> = list
        .items
        .iter()
        .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
        .map(|ip| format!("{ip}:{}", build::GRPC_PORT))
        .collect();
    Ok(crate::tablet_servers::observe_servers(dialer, &addresses).await)
}

/// Reads the cluster's tablet map, registrations, moves in progress and recorded serveNodes
/// from the instance's metadata store, reached as the operator reaches it
/// ([`build::etcd::operator_urls`]), and — with `volumes` — what the registered servers report
/// about their volumes and tablets. None, logged, when the store does not answer within
/// [`PLACEMENT_DEADLINE`]: the status keeps what it said. With the placement, the connection.
pub async fn observe_placement(
    ctx: &Context,
    instance: &Instance,
    cluster: &str,
    volumes: bool,
) -> Result<(Option<Placement>, Option<Store>)> {
    let ns = instance.namespace().unwrap_or_default();
    let endpoints =
        crate::controller::instance::dereference::store_endpoints(ctx, instance).await?;
    if endpoints.is_empty() {
        return Ok((None, None));
    }
    let keys = Keys::new(&ns, &instance.name_any());
    let transport = ctx.transport(instance)?;
    let read = async {
        let endpoints = basalt_meta::endpoints(&endpoints, &transport.etcd)?;
        let meta = Meta::connect(&endpoints, keys).await?;
        let observed = lifecycle::view::observe(&meta, cluster, &mut ServerBook::default()).await?;
        let placement = Placement::from(observed);
        Ok::<_, basalt_master::model::Error>((placement, Store(meta)))
    };
    let (mut placement, store) = match tokio::time::timeout(PLACEMENT_DEADLINE, read).await {
        Ok(Ok(read)) => read,
        Ok(Err(error)) => {
            tracing::info!(%error, ?endpoints, "the metadata store did not answer; tablets per node not updated");
            return Ok((None, None));
        }
        Err(_) => {
            tracing::info!(
                ?endpoints,
                "the metadata store did not answer in time; tablets per node not updated"
            );
            return Ok((None, None));
        }
    };
    if volumes {
        observe_volumes(&transport.dialer, &mut placement).await;
    }
    Ok((Some(placement), Some(store)))
}

/// Asks every registered server of `placement` for its report (control protocol, all at once,
/// each within [`crate::tablet_servers::STATUS_DEADLINE`]): its volume's stored and capacity
/// bytes, and its tablets' sizes and loads. A server that does not answer is left out (its
/// volume then counts as unknown, which never blocks a drain).
async fn observe_volumes(dialer: &basalt_control::Dialer, placement: &mut Placement) {
    let control = crate::tablet_servers::GrpcTabletControl::new(
        dialer.clone(),
        crate::tablet_servers::STATUS_DEADLINE,
    );
    let states: Vec<ServerState> = placement
        .servers
        .iter()
        .map(|s| ServerState {
            id: s.store_id.clone(),
            address: s.address.clone(),
            ordinal: s.ordinal.unwrap_or(0),
            ready: true,
            stored_bytes: 0,
            capacity_bytes: None,
        })
        .collect();
    let reports = futures::future::join_all(states.iter().map(|s| control.report(s))).await;
    for report in reports {
        match report {
            Ok(report) => {
                placement.volumes.insert(
                    report.state.id.clone(),
                    (report.state.stored_bytes, report.state.capacity_bytes),
                );
                placement.loads.extend(report.tablets);
            }
            Err(error) => tracing::debug!(%error, "tablet server did not report its volume"),
        }
    }
}
