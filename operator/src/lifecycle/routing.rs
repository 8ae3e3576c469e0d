//! Where an app profile routes requests now, as both runtimes show it (an AppProfile's status
//! on Kubernetes, `local.json`'s `appProfiles` locally): the same decision the tablet servers
//! make ([`basalt_meta::routing`]), on the clusters' health as etcd knows it — the servers each
//! cluster has registered, and which clusters are being seeded. (A server also counts its own
//! calls; from outside, a cluster with a live registration is healthy.)

use std::collections::{BTreeMap, BTreeSet};

use basalt_meta::routing::{self, ClusterView, Method, Policy};
use basalt_meta::{AppProfileRecord, Keys, Meta};

use super::records::DEADLINE;

/// Where a profile routes now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RoutesNow {
    /// The clusters its requests go to now, the preferred first (for a multi-cluster
    /// profile, a server routes to its own cluster first when it is one of these).
    pub routes_to: Vec<String>,
    /// The clusters it names (every cluster, for multi-cluster routing to any) that are not
    /// available: no live server, or still being seeded.
    pub unavailable: Vec<String>,
}

/// The clusters' view: every replica of the instance (`replicas`), with its live servers'
/// count (`registered`), whether it is being seeded and whether it is being removed. Pure.
pub fn views(
    replicas: &[String],
    registered: &BTreeMap<String, usize>,
    seeding: &BTreeSet<String>,
    removing: &BTreeSet<String>,
) -> Vec<ClusterView> {
    replicas
        .iter()
        .map(|c| ClusterView {
            name: c.clone(),
            healthy: registered.get(c).copied().unwrap_or(0) > 0,
            ready: !seeding.contains(c),
            removing: removing.contains(c),
            latency: None,
        })
        .collect()
}

/// Where `profile` routes on `clusters`. Pure.
pub fn routes_now(profile: &AppProfileRecord, clusters: &[ClusterView]) -> RoutesNow {
    let policy = Policy::of(profile);
    // A cluster being removed still takes the requests of a single-cluster profile naming it
    // (its removal waits for that profile to change), no others.
    let single = matches!(policy, Policy::Single { .. });
    let available = |c: &str| {
        clusters
            .iter()
            .any(|v| v.name == c && v.healthy && v.ready && (single || !v.removing))
    };
    let named: Vec<String> = match &policy {
        Policy::Single { cluster, .. } => vec![cluster.clone()],
        Policy::Multi {
            clusters: listed, ..
        } if !listed.is_empty() => listed.clone(),
        _ => clusters.iter().map(|c| c.name.clone()).collect(),
    };
    let routes_to = match routing::plan(&policy, Method::ReadRows, None, "", clusters) {
        Ok(plan) if plan.fails_over => plan.clusters.into_iter().filter(|c| available(c)).collect(),
        Ok(plan) => plan.clusters,
        Err(_) => vec![],
    };
    RoutesNow {
        routes_to,
        unavailable: named.into_iter().filter(|c| !available(c)).collect(),
    }
}

/// The clusters' view read from the instance's etcd at `endpoints` (reached with
/// `security`); None when it did not answer (within the runtimes' deadline).
pub async fn observe(
    endpoints: &[String],
    security: &basalt_meta::Security,
    keys: Keys,
) -> Option<Vec<ClusterView>> {
    if endpoints.is_empty() {
        return None;
    }
    let work = async {
        let endpoints = basalt_meta::endpoints(endpoints, security)?;
        let meta = Meta::connect(&endpoints, keys).await?;
        observe_with(&meta).await
    };
    tokio::time::timeout(DEADLINE, work).await.ok()?.ok()
}

/// [`observe`] on a connected store.
pub async fn observe_with(meta: &Meta) -> basalt_master::model::Result<Vec<ClusterView>> {
    let replicas: Vec<String> = meta.cluster_numbers().await?.into_keys().collect();
    let (servers, _) = meta.servers(None).await?;
    let mut registered: BTreeMap<String, usize> = BTreeMap::new();
    for s in servers {
        *registered.entry(s.cluster).or_default() += 1;
    }
    let seeding: BTreeSet<String> = meta.seeds().await?.into_keys().collect();
    let removing: BTreeSet<String> = meta.removing().await?.into_keys().collect();
    Ok(views(&replicas, &registered, &seeding, &removing))
}

#[cfg(test)]
mod tests {
    use super::*;
    use basalt_meta::{AppProfilePriority, AppProfileRouting};

    fn profile(routing: AppProfileRouting) -> AppProfileRecord {
        AppProfileRecord {
            id: "p".into(),
            description: String::new(),
            routing,
            priority: AppProfilePriority::High,
        }
    }

    #[test]
    fn a_profile_routes_to_its_available_clusters() {
        let replicas = ["a".to_string(), "b".to_string(), "c".to_string()];
        let clusters = views(
            &replicas,
            &[
                ("a".to_string(), 2),
                ("b".to_string(), 0),
                ("c".to_string(), 1),
            ]
            .into(),
            &["c".to_string()].into(),
            &BTreeSet::new(),
        );
        let any = profile(AppProfileRouting::MultiClusterRoutingUseAny {
            cluster_ids: vec![],
            row_affinity: false,
        });
        assert_eq!(
            routes_now(&any, &clusters),
            RoutesNow {
                routes_to: vec!["a".into()],
                unavailable: vec!["b".into(), "c".into()],
            }
        );
        let group = profile(AppProfileRouting::MultiClusterRoutingUseAny {
            cluster_ids: vec!["b".into()],
            row_affinity: true,
        });
        assert_eq!(
            routes_now(&group, &clusters),
            RoutesNow {
                routes_to: vec![],
                unavailable: vec!["b".into()],
            }
        );
        // A single-cluster profile goes to its cluster, available or not.
        let single = profile(AppProfileRouting::SingleClusterRouting {
            cluster_id: "b".into(),
            allow_transactional_writes: false,
        });
        assert_eq!(
            routes_now(&single, &clusters),
            RoutesNow {
                routes_to: vec!["b".into()],
                unavailable: vec!["b".into()],
            }
        );
        // A cluster being removed: multi-cluster profiles leave it out; a single-cluster
        // profile naming it still goes there (its removal waits for the profile).
        let clusters = views(
            &replicas,
            &[
                ("a".to_string(), 2),
                ("b".to_string(), 1),
                ("c".to_string(), 1),
            ]
            .into(),
            &BTreeSet::new(),
            &["a".to_string()].into(),
        );
        assert_eq!(
            routes_now(&any, &clusters),
            RoutesNow {
                routes_to: vec!["b".into(), "c".into()],
                unavailable: vec!["a".into()],
            }
        );
        let on_a = profile(AppProfileRouting::SingleClusterRouting {
            cluster_id: "a".into(),
            allow_transactional_writes: false,
        });
        assert_eq!(
            routes_now(&on_a, &clusters),
            RoutesNow {
                routes_to: vec!["a".into()],
                unavailable: vec![],
            }
        );
    }
}
