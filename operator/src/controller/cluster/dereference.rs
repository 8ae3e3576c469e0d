//! Cluster, stage 1: every read the reconcile needs — the cluster's StatefulSet as it is, its
//! Instance, and what its tablet servers serve.

use std::time::Duration;

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

/// What a cluster's tablet servers serve, summed over the servers that answered: tablets
/// owned, and bytes stored (SST files and memtables). None when no server reported it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Serving {
    pub tablets: Option<i64>,
    pub bytes: Option<i64>,
}

impl Serving {
    /// Adds one tablet server's `/metrics` (Prometheus' text format).
    pub fn add_metrics(&mut self, exposition: &str) {
        let gauge = |name| parse_gauge(exposition, name);
        if let Some(t) = gauge("basalt_tablets") {
            *self.tablets.get_or_insert(0) += t as i64;
        }
        if let Some(sst) = gauge("basalt_storage_bytes") {
            *self.bytes.get_or_insert(0) +=
                (sst + gauge("basalt_memtable_bytes").unwrap_or(0.0)) as i64;
        }
    }
}

/// Asks the cluster's tablet servers what they serve. The one place this comes from: today
/// the `/metrics` of every pod of the cluster, scraped over HTTP; a tablet server that does
/// not answer is left out.
pub async fn observe_servers(ctx: &Context, ns: &str, cluster: &str) -> Result<Serving> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let selector = build::selector_string(&build::cluster_selector(cluster));
    let list = pods.list(&ListParams::default().labels(&selector)).await?;
    let mut serving = Serving::default();
    for ip in list
        .items
        .iter()
        .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
    {
        if let Some(text) = scrape_metrics(&ip).await {
            serving.add_metrics(&text);
        }
    }
    Ok(serving)
}

/// A tablet server's `/metrics` (plain HTTP/1.0 on its HTTP port), with a short deadline; None
/// if it does not answer.
pub async fn scrape_metrics(ip: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fetch = async {
        let mut conn = tokio::net::TcpStream::connect((ip, build::HTTP_PORT as u16))
            .await
            .ok()?;
        conn.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {ip}\r\n\r\n").as_bytes())
            .await
            .ok()?;
        let mut body = String::new();
        conn.read_to_string(&mut body).await.ok()?;
        Some(body)
    };
    tokio::time::timeout(Duration::from_secs(2), fetch)
        .await
        .ok()?
}

/// The value of an unlabelled sample in Prometheus' text format.
pub fn parse_gauge(exposition: &str, metric: &str) -> Option<f64> {
    exposition.lines().find_map(|line| {
        let rest = line.strip_prefix(metric)?.strip_prefix(' ')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gauges_are_read_from_the_text_format() {
        let text = "# HELP basalt_storage_bytes Size\n# TYPE basalt_storage_bytes gauge\nbasalt_storage_bytes 12345\nbasalt_storage_bytes_other 9\n";
        assert_eq!(parse_gauge(text, "basalt_storage_bytes"), Some(12345.0));
        assert_eq!(parse_gauge(text, "basalt_memtable_bytes"), None);
    }

    #[test]
    fn serving_sums_the_servers_that_report() {
        let mut serving = Serving::default();
        assert_eq!(
            serving,
            Serving {
                tablets: None,
                bytes: None
            }
        );
        serving
            .add_metrics("basalt_tablets 2\nbasalt_storage_bytes 1000\nbasalt_memtable_bytes 24\n");
        // A server without the storage gauges adds tablets only; memtables alone are not
        // counted without the SST figure.
        serving.add_metrics("basalt_tablets 3\nbasalt_memtable_bytes 999\n");
        serving.add_metrics("basalt_storage_bytes 500\n");
        assert_eq!(
            serving,
            Serving {
                tablets: Some(5),
                bytes: Some(1524)
            }
        );
        let mut silent = Serving::default();
        silent.add_metrics("# nothing Basalt reports\n");
        assert_eq!(silent, Serving::default());
    }
}
