//! Table, stage 1: every Kubernetes read the reconcile needs — the Instance, and a ready
//! tablet server of it to send admin calls to. (The table itself is read through the admin
//! API when it is applied: it is planned against the table as it is after creation.)

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams};

use crate::build;
use crate::controller::{Context, Result};
use crate::crd::{Instance, Table};

/// What the reads found.
#[derive(Debug, Clone, Default)]
pub struct Dereferenced {
    /// The Instance the table belongs to (None if it does not exist).
    pub instance: Option<Instance>,
    /// `host:port` of a ready tablet server of the instance (None without the instance, or
    /// while none is ready).
    pub endpoint: Option<String>,
}

pub async fn dereference(ctx: &Context, table: &Table) -> Result<Dereferenced> {
    let ns = table.namespace().unwrap_or_default();
    let instance = Api::<Instance>::namespaced(ctx.client.clone(), &ns)
        .get_opt(&table.spec.instance_ref)
        .await?;
    let endpoint = match &instance {
        Some(_) => instance_endpoint(ctx, &ns, &table.spec.instance_ref).await?,
        None => None,
    };
    Ok(Dereferenced { instance, endpoint })
}

/// `host:port` of a ready tablet server of the instance, for admin calls (the lowest pod IP:
/// the same server while the set of ready ones stays the same).
pub async fn instance_endpoint(
    ctx: &Context,
    namespace: &str,
    instance: &str,
) -> Result<Option<String>> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
    let selector = build::selector_string(&build::instance_selector(instance));
    let list = pods.list(&ListParams::default().labels(&selector)).await?;
    let mut ready: Vec<String> = list
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            p.status.as_ref().is_some_and(|s| {
                s.conditions
                    .as_ref()
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
        })
        .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
        .collect();
    ready.sort();
    Ok(ready.first().map(|ip| format!("{ip}:{}", build::GRPC_PORT)))
}
