//! The intents a runtime writes into the instance's metadata store for the master and the
//! frontends, the same way on Kubernetes and in the local runtime:
//!
//! * a cluster's serve-nodes count (`clusters/<c>/serve-nodes`): the master drains the servers
//!   at and above it ([`serve_nodes_to_record`], [`record_serve_nodes`]);
//! * the instance's replicas (`cluster-numbers/<c>`): every Cluster of the instance the runtime
//!   knows gets its number before any of their servers starts ([`declare_replicas`]), so each
//!   server logs its writes for the other clusters from its first one; a Cluster that left is
//!   released once its servers are gone; and where the other clusters reach each one
//!   (`peer-endpoints/<c>`, the Cluster's `spec.peerEndpoint`);
//! * the instance's app profiles (`app-profiles/<id>`): [`put`], [`put_all`], [`remove`].
//!   Never an error of a reconcile: what happened is reported ([`Catalog`]) and the AppProfile
//!   status (or `local apply`) says it;
//! * the instance's replication limits (`replication-limits`, from `spec.replication`):
//!   [`put_replication_limits`], read by the servers' shippers and the master.

use std::collections::BTreeMap;
use std::time::Duration;

use basalt_meta::{AppProfileRecord, Keys, Meta, ReplicationLimits, Security};

use super::removal;

/// How long a runtime waits for the metadata store.
pub const DEADLINE: Duration = Duration::from_secs(6);

/// Where the profile's record stands in the catalog after this reconcile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Catalog {
    /// The record is in the catalog, as the spec says.
    Recorded,
    /// The profile's record(s) are not in the catalog (removed, or never there).
    Removed,
    /// No member of the instance's metadata store has an address yet.
    NoEndpoints,
    /// The metadata store did not answer (in time): why.
    Unreachable(String),
}

/// Puts `record` into the catalog, after removing the record of the profile's `previous` id.
pub async fn put(
    endpoints: &[String],
    security: &Security,
    keys: Keys,
    record: &AppProfileRecord,
    previous: Option<&str>,
) -> Catalog {
    with_store(
        endpoints,
        security,
        keys,
        Catalog::Recorded,
        |meta| async move {
            if let Some(previous) = previous {
                meta.delete_app_profile(previous).await?;
            }
            meta.put_app_profile(record).await
        },
    )
    .await
}

/// Puts every record of `records` into the catalog (the local runtime's manifests).
pub async fn put_all(
    endpoints: &[String],
    security: &Security,
    keys: Keys,
    records: &[AppProfileRecord],
) -> Catalog {
    with_store(
        endpoints,
        security,
        keys,
        Catalog::Recorded,
        |meta| async move {
            for record in records {
                meta.put_app_profile(record).await?;
            }
            Ok(())
        },
    )
    .await
}

/// Removes the records of `ids` from the catalog (absent ones are fine).
pub async fn remove(
    endpoints: &[String],
    security: &Security,
    keys: Keys,
    ids: &[String],
) -> Catalog {
    with_store(
        endpoints,
        security,
        keys,
        Catalog::Removed,
        |meta| async move {
            for id in ids {
                meta.delete_app_profile(id).await?;
            }
            Ok(())
        },
    )
    .await
}

/// Records the instance's replication limits (the Instance's `spec.replication`).
pub async fn put_replication_limits(
    endpoints: &[String],
    security: &Security,
    keys: Keys,
    limits: &ReplicationLimits,
) -> Catalog {
    with_store(
        endpoints,
        security,
        keys,
        Catalog::Recorded,
        |meta| async move { meta.put_replication_limits(limits).await },
    )
    .await
}

/// `endpoints` reached with `security` (plaintext, or TLS with etcd's CA and a client
/// certificate).
async fn with_store<F, Fut>(
    endpoints: &[String],
    security: &Security,
    keys: Keys,
    done: Catalog,
    f: F,
) -> Catalog
where
    F: FnOnce(Meta) -> Fut,
    Fut: Future<Output = Result<(), basalt_master::model::Error>>,
{
    if endpoints.is_empty() {
        return Catalog::NoEndpoints;
    }
    let work = async {
        let endpoints = basalt_meta::endpoints(endpoints, security)?;
        let meta = Meta::connect(&endpoints, keys).await?;
        f(meta).await
    };
    match tokio::time::timeout(DEADLINE, work).await {
        Ok(Ok(())) => done,
        Ok(Err(error)) => {
            tracing::info!(%error, ?endpoints, "the metadata store did not take the record");
            Catalog::Unreachable(format!("etcd at {}: {error}", endpoints.join(",")))
        }
        Err(_) => Catalog::Unreachable(format!(
            "etcd at {} did not answer within {DEADLINE:?}",
            endpoints.join(",")
        )),
    }
}

/// The count to write, if any: `requested` when the store was read (`recorded`: Some(what it
/// holds), None inside: never recorded) and holds another — except a count below one whose
/// scale-in is still under way (`running`, the servers that run, is above the recorded count):
/// it waits until that drain is done and its servers are gone, so one drain runs at a time. A
/// higher count is written at once: it cancels the drain. Pure.
pub fn serve_nodes_to_record(
    recorded: Option<Option<u32>>,
    requested: i32,
    running: Option<i32>,
) -> Option<u32> {
    let requested = u32::try_from(requested).ok()?;
    match recorded? {
        Some(recorded) if recorded == requested => None,
        Some(recorded) if requested < recorded && running.is_some_and(|r| r > recorded as i32) => {
            None
        }
        _ => Some(requested),
    }
}

/// A Cluster of an instance as [`declare_replicas`] records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replica {
    /// The Cluster's name.
    pub cluster: String,
    /// Where the other clusters reach it (`spec.peerEndpoint`); None: at its servers.
    pub peer_endpoint: Option<String>,
}

impl Replica {
    /// A Cluster reached at its servers.
    pub fn named(cluster: impl Into<String>) -> Replica {
        Replica {
            cluster: cluster.into(),
            peer_endpoint: None,
        }
    }
}

/// The peer endpoints to write, given those `recorded` in etcd: each replica's, where it
/// differs (None: delete the recorded one). Pure.
pub fn peer_endpoints_to_record<'a>(
    recorded: &BTreeMap<String, String>,
    replicas: &'a [Replica],
) -> Vec<(&'a str, Option<&'a str>)> {
    replicas
        .iter()
        .filter(|r| recorded.get(&r.cluster) != r.peer_endpoint.as_ref())
        .map(|r| (r.cluster.as_str(), r.peer_endpoint.as_deref()))
        .collect()
}

/// Makes the instance's replicas the clusters of `clusters` (every Cluster of the instance
/// the runtime knows) within [`DEADLINE`]: each gets its number (kept once given) and its
/// peer endpoint as its spec says ([`Replica::peer_endpoint`]), and a
/// cluster that has one but is no longer declared and has no registered server left the
/// instance: it is released ([`Meta::remove_replica`]) once every write its servers logged is
/// in a declared cluster ([`removal::departed`]); until then it stays a replica (logged as a
/// warning; `local status` shows why). Why not, if not. (Nothing is read for an empty
/// `clusters`: the runtime knows no Cluster then.)
pub async fn declare_replicas(meta: &Meta, replicas: &[Replica]) -> Result<(), String> {
    if replicas.is_empty() {
        return Ok(());
    }
    let clusters: Vec<String> = replicas.iter().map(|r| r.cluster.clone()).collect();
    let clusters = clusters.as_slice();
    let work = async {
        let numbers = meta.cluster_numbers().await.map_err(|e| e.to_string())?;
        for cluster in clusters {
            if !numbers.contains_key(cluster) {
                meta.cluster_number(cluster).await.map_err(|e| {
                    format!("cannot record cluster {cluster} as a replica in etcd: {e}")
                })?;
            }
        }
        let recorded = meta.peer_endpoints().await.map_err(|e| e.to_string())?;
        for (cluster, endpoint) in peer_endpoints_to_record(&recorded, replicas) {
            meta.set_peer_endpoint(cluster, endpoint)
                .await
                .map_err(|e| {
                    format!("cannot record the peer endpoint of cluster {cluster} in etcd: {e}")
                })?;
            tracing::info!(
                cluster,
                ?endpoint,
                "recorded where the other clusters reach the cluster"
            );
        }
        if numbers.keys().all(|c| clusters.contains(c)) {
            return Ok(());
        }
        let departed = removal::departed(meta, clusters)
            .await
            .map_err(|e| e.to_string())?;
        for (gone, verdict) in departed {
            match verdict {
                Ok(()) => {
                    meta.remove_replica(&gone)
                        .await
                        .map_err(|e| e.to_string())?;
                    tracing::info!(cluster = %gone, "the cluster left the instance: no more replication to it");
                }
                Err(refused) => {
                    tracing::warn!(cluster = %gone, %refused, "the cluster left the manifests but stays a replica until its writes are shipped")
                }
            }
        }
        Ok(())
    };
    tokio::time::timeout(DEADLINE, work)
        .await
        .unwrap_or_else(|_| Err(format!("etcd did not answer in {DEADLINE:?}")))
}

/// Records `count` as `cluster`'s serve-nodes within [`DEADLINE`]; why not, if not.
pub async fn record_serve_nodes(meta: &Meta, cluster: &str, count: u32) -> Result<(), String> {
    match tokio::time::timeout(DEADLINE, meta.set_serve_nodes(cluster, count)).await {
        Ok(Ok(())) => {
            tracing::info!(
                cluster,
                serve_nodes = count,
                "recorded serveNodes in the metadata store"
            );
            Ok(())
        }
        Ok(Err(e)) => Err(format!(
            "cannot record serveNodes {count} of cluster {cluster} in etcd: {e}"
        )),
        Err(_) => Err(format!(
            "cannot record serveNodes {count} of cluster {cluster}: etcd did not answer in {DEADLINE:?}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_endpoints_are_written_only_where_etcd_holds_another() {
        let recorded: BTreeMap<String, String> = [
            ("a".to_string(), "gw-a:443".to_string()),
            ("b".to_string(), "gw-b:443".to_string()),
        ]
        .into();
        let replicas = [
            Replica {
                cluster: "a".into(),
                peer_endpoint: Some("gw-a:443".into()),
            },
            Replica::named("b"),
            Replica {
                cluster: "c".into(),
                peer_endpoint: Some("gw-c:443".into()),
            },
            Replica::named("d"),
        ];
        assert_eq!(
            peer_endpoints_to_record(&recorded, &replicas),
            [("b", None), ("c", Some("gw-c:443"))]
        );
    }

    #[test]
    fn serve_nodes_are_written_only_when_the_store_holds_another_count() {
        assert_eq!(serve_nodes_to_record(Some(None), 3, Some(3)), Some(3));
        assert_eq!(serve_nodes_to_record(Some(Some(4)), 3, Some(4)), Some(3));
        assert_eq!(serve_nodes_to_record(Some(Some(3)), 3, Some(3)), None);
        // The store could not be read: nothing to compare with, nothing written.
        assert_eq!(serve_nodes_to_record(None, 3, Some(3)), None);
        // A scale-in 5 → 3 is under way (5 servers still run): 2 waits for it to finish...
        assert_eq!(serve_nodes_to_record(Some(Some(3)), 2, Some(5)), None);
        // ...and is written once the servers above 3 are gone.
        assert_eq!(serve_nodes_to_record(Some(Some(3)), 2, Some(3)), Some(2));
        // Raising the count cancels the drain at once.
        assert_eq!(serve_nodes_to_record(Some(Some(3)), 4, Some(5)), Some(4));
    }
}
