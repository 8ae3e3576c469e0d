//! Autoscaling in the cluster lifecycle, the same on both runtimes. The master's autoscaler
//! (`crate::master::autoscaler`) decides; the lifecycle gives it the Cluster's settings
//! ([`settings`], recorded by [`record`] as `clusters/<c>/autoscaling`) and takes its decision
//! back as the count the cluster requests ([`crate::build::desired_serve_nodes`]), which the
//! scale step ([`super::scale`]) carries out as it would a changed `serveNodes`.

use basalt_meta::{AutoscalingRecord, Meta};

use crate::crd::{ClusterSpec, DEFAULT_STORAGE_SIZE, StorageType};

/// Bigtable's default storage target per node: 2.5 TiB on SSD, 8 TiB on HDD.
pub const DEFAULT_SSD_GIB_PER_NODE: u64 = 2560;
pub const DEFAULT_HDD_GIB_PER_NODE: u64 = 8192;

const GIB: u64 = 1 << 30;

/// The settings the master's autoscaler needs from `spec` (None: a fixed `serveNodes`). Pure.
pub fn settings(spec: &ClusterSpec) -> Option<AutoscalingRecord> {
    let a = spec.autoscaling.as_ref()?;
    let per_node_gib = match a.storage_utilization_gib_per_node {
        Some(gib) => gib.max(1) as u64,
        None => match spec.storage_type {
            StorageType::Ssd => DEFAULT_SSD_GIB_PER_NODE,
            StorageType::Hdd => DEFAULT_HDD_GIB_PER_NODE,
        },
    };
    let size = spec
        .storage_size
        .as_ref()
        .map_or(DEFAULT_STORAGE_SIZE, |q| q.0.as_str());
    Some(AutoscalingRecord {
        min_serve_nodes: a.min_serve_nodes.max(1) as u32,
        max_serve_nodes: a.max_serve_nodes.max(1) as u32,
        cpu_utilization_percent: a.cpu_utilization_percent.clamp(1, 100) as u32,
        storage_utilization_bytes_per_node: per_node_gib.saturating_mul(GIB),
        node_capacity_bytes: crate::quantity::parse_quantity_bytes(size),
    })
}

/// Records `wanted` (the spec's [`settings`]) as `cluster`'s autoscaling settings when etcd
/// holds others (None deletes them, and the autoscaler's decision with them), within
/// [`super::records::DEADLINE`]; why not, if not.
pub async fn record(
    meta: &Meta,
    cluster: &str,
    wanted: Option<&AutoscalingRecord>,
) -> Result<(), String> {
    let work = async {
        let recorded = meta.autoscaling(cluster).await.map_err(|e| e.to_string())?;
        if recorded.as_ref() == wanted {
            return Ok(());
        }
        meta.set_autoscaling(cluster, wanted)
            .await
            .map_err(|e| e.to_string())?;
        match wanted {
            Some(s) => tracing::info!(
                cluster,
                min = s.min_serve_nodes,
                max = s.max_serve_nodes,
                cpu_percent = s.cpu_utilization_percent,
                "recorded the autoscaling settings in the metadata store"
            ),
            None => tracing::info!(
                cluster,
                "the cluster no longer autoscales: its settings and decision are deleted"
            ),
        }
        Ok(())
    };
    let deadline = super::records::DEADLINE;
    tokio::time::timeout(deadline, work)
        .await
        .unwrap_or_else(|_| Err(format!("etcd did not answer in {deadline:?}")))
        .map_err(|e: String| {
            format!("cannot record the autoscaling settings of cluster {cluster}: {e}")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> ClusterSpec {
        serde_norway::from_str(yaml).unwrap()
    }

    #[test]
    fn settings_carry_the_bounds_and_the_storage_types_defaults() {
        assert_eq!(settings(&spec("{instanceRef: i, serveNodes: 3}")), None);
        let s = settings(&spec(
            "{instanceRef: i, storageSize: 100Gi, autoscaling: {minServeNodes: 1, maxServeNodes: 4, cpuUtilizationPercent: 50}}",
        ))
        .unwrap();
        assert_eq!(
            s,
            AutoscalingRecord {
                min_serve_nodes: 1,
                max_serve_nodes: 4,
                cpu_utilization_percent: 50,
                storage_utilization_bytes_per_node: 2560 * GIB,
                node_capacity_bytes: Some(100 * GIB),
            }
        );
        let hdd = settings(&spec(
            "{instanceRef: i, storageType: HDD, autoscaling: {minServeNodes: 2, maxServeNodes: 6, cpuUtilizationPercent: 70}}",
        ))
        .unwrap();
        assert_eq!(hdd.storage_utilization_bytes_per_node, 8192 * GIB);
        assert_eq!(hdd.node_capacity_bytes, Some(10 * GIB));
        let own = settings(&spec(
            "{instanceRef: i, autoscaling: {minServeNodes: 2, maxServeNodes: 6, cpuUtilizationPercent: 70, storageUtilizationGibPerNode: 3000}}",
        ))
        .unwrap();
        assert_eq!(own.storage_utilization_bytes_per_node, 3000 * GIB);
    }
}
