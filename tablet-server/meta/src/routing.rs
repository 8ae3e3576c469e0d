//! The routing decision, pure: which app profile a request names, whether that profile allows
//! the request, and the clusters to try in order (the first is the target, the rest where a
//! multi-cluster request fails over). No I/O: the caller brings the instance's app profiles
//! and its view of the clusters' health (a tablet server's `cluster::routing::health`, or
//! the operator's view from etcd's registrations).

use std::collections::HashMap;
use std::time::Duration;

use basalt_model::Error;

use crate::records::{AppProfileRecord, AppProfileRouting};

/// The profile an empty `app_profile_id` names.
pub const DEFAULT_PROFILE: &str = "default";

/// Bigtable's answer to a single-row transaction through a profile that does not allow it.
pub const TRANSACTIONS_NOT_ALLOWED: &str =
    "Single-row transactions are not allowed by this app profile";

/// The data API's methods, as routing sees them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Method {
    ReadRows,
    SampleRowKeys,
    MutateRow,
    MutateRows,
    CheckAndMutateRow,
    ReadModifyWriteRow,
    PingAndWarm,
}

impl Method {
    /// Its name in metrics (the RPC's).
    pub fn name(self) -> &'static str {
        match self {
            Method::ReadRows => "ReadRows",
            Method::SampleRowKeys => "SampleRowKeys",
            Method::MutateRow => "MutateRow",
            Method::MutateRows => "MutateRows",
            Method::CheckAndMutateRow => "CheckAndMutateRow",
            Method::ReadModifyWriteRow => "ReadModifyWriteRow",
            Method::PingAndWarm => "PingAndWarm",
        }
    }

    /// Whether it writes (its bytes are paced by priority).
    pub fn writes(self) -> bool {
        matches!(
            self,
            Method::MutateRow
                | Method::MutateRows
                | Method::CheckAndMutateRow
                | Method::ReadModifyWriteRow
        )
    }

    /// A single-row transaction: allowed only through a single-cluster profile with
    /// transactional writes.
    pub fn transactional(self) -> bool {
        matches!(self, Method::CheckAndMutateRow | Method::ReadModifyWriteRow)
    }
}

/// How a profile routes, resolved from its record (or the implicit default).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Every request to one cluster.
    Single {
        cluster: String,
        transactional: bool,
    },
    /// The nearest healthy cluster of `clusters` (empty: every cluster of the instance),
    /// failing over to the others; with `row_affinity`, a row key sticks to one cluster.
    Multi {
        clusters: Vec<String>,
        row_affinity: bool,
    },
    /// The instance's implicit default (no AppProfile `default` declared): the cluster of the
    /// server that took the request, with single-row transactions — Bigtable's default for an
    /// instance of one cluster, which stays so when clusters are added.
    ReceivingCluster,
}

impl Policy {
    pub fn of(record: &AppProfileRecord) -> Policy {
        match &record.routing {
            AppProfileRouting::SingleClusterRouting {
                cluster_id,
                allow_transactional_writes,
            } => Policy::Single {
                cluster: cluster_id.clone(),
                transactional: *allow_transactional_writes,
            },
            AppProfileRouting::MultiClusterRoutingUseAny {
                cluster_ids,
                row_affinity,
            } => Policy::Multi {
                clusters: cluster_ids.clone(),
                row_affinity: *row_affinity,
            },
        }
    }

    pub fn is_multi(&self) -> bool {
        matches!(self, Policy::Multi { .. })
    }
}

/// The id a request names: `app_profile_id` (from the request, or else from its
/// `x-goog-request-params` header); empty is [`DEFAULT_PROFILE`].
pub fn profile_id(id: &str) -> &str {
    if id.is_empty() { DEFAULT_PROFILE } else { id }
}

/// The policy of profile `id` among the instance's `profiles`: NOT_FOUND for an unknown one
/// (but `default`, which is implicit until declared).
pub fn resolve(
    id: &str,
    profiles: &HashMap<String, AppProfileRecord>,
    instance: &str,
) -> Result<Policy, Error> {
    let id = profile_id(id);
    match profiles.get(id) {
        Some(record) => Ok(Policy::of(record)),
        None if id == DEFAULT_PROFILE => Ok(Policy::ReceivingCluster),
        None => Err(Error::NotFound(format!(
            "app profile {instance}/appProfiles/{id} not found"
        ))),
    }
}

/// One cluster of the instance as routing sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterView {
    pub name: String,
    /// Has registered servers and answered its last call (see [`super::health`]).
    pub healthy: bool,
    /// Holds the instance's data (not being seeded).
    pub ready: bool,
    /// Leaving the instance (`Meta::removing`): client requests go to the clusters that stay.
    pub removing: bool,
    /// Recent latency of calls to it from this server (none: not called yet).
    pub latency: Option<Duration>,
}

/// The clusters to try, in order, and whether the request may go to the next one when one
/// fails (multi-cluster routing).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub clusters: Vec<String>,
    pub fails_over: bool,
}

/// Where a request goes: `own` is the receiving server's cluster, `clusters` the instance's,
/// `row` the one row the request is about (if it is about one).
pub fn plan(
    policy: &Policy,
    method: Method,
    row: Option<&[u8]>,
    own: &str,
    clusters: &[ClusterView],
) -> Result<Plan, Error> {
    if method.transactional() {
        let allowed = match policy {
            Policy::Single { transactional, .. } => *transactional,
            Policy::ReceivingCluster => true,
            Policy::Multi { .. } => false,
        };
        if !allowed {
            return Err(Error::FailedPrecondition(TRANSACTIONS_NOT_ALLOWED.into()));
        }
    }
    // A cluster being removed takes no more client requests but those of a single-cluster
    // profile naming it (its removal waits until none does): its log must reach its end.
    let staying: Vec<&ClusterView> = clusters.iter().filter(|c| !c.removing).collect();
    let own_removing = clusters.iter().any(|c| c.name == own && c.removing);
    match policy {
        Policy::ReceivingCluster if own_removing && !staying.is_empty() => Ok(Plan {
            clusters: nearest(staying, own),
            fails_over: true,
        }),
        Policy::ReceivingCluster => Ok(Plan {
            clusters: vec![own.to_string()],
            fails_over: false,
        }),
        Policy::Single { cluster, .. } => {
            if !clusters.iter().any(|c| &c.name == cluster) {
                return Err(Error::FailedPrecondition(format!(
                    "this app profile routes to cluster {cluster:?}, which is not a cluster of \
                     the instance"
                )));
            }
            Ok(Plan {
                clusters: vec![cluster.clone()],
                fails_over: false,
            })
        }
        Policy::Multi {
            clusters: listed,
            row_affinity,
        } => {
            let mut eligible: Vec<&ClusterView> = clusters
                .iter()
                .filter(|c| listed.is_empty() || listed.contains(&c.name))
                .collect();
            if eligible.is_empty() {
                return Err(Error::FailedPrecondition(format!(
                    "none of the clusters this app profile routes to ({}) is a cluster of the \
                     instance",
                    listed.join(", ")
                )));
            }
            if eligible.iter().any(|c| !c.removing) {
                eligible.retain(|c| !c.removing);
            }
            let clusters = match (row_affinity, row) {
                (true, Some(row)) => {
                    eligible.sort_by_key(|c| {
                        (
                            rank(c),
                            std::cmp::Reverse(affinity_weight(row, &c.name)),
                            c.name.clone(),
                        )
                    });
                    eligible.into_iter().map(|c| c.name.clone()).collect()
                }
                _ => nearest(eligible, own),
            };
            Ok(Plan {
                clusters,
                fails_over: true,
            })
        }
    }
}

/// Healthy and holding the data first, then healthy, then the rest: a request still goes
/// somewhere when every cluster looks down.
fn rank(c: &ClusterView) -> u8 {
    match (c.healthy, c.ready) {
        (true, true) => 0,
        (true, false) => 1,
        (false, true) => 2,
        (false, false) => 3,
    }
}

/// `clusters` in the order a request tries them: by [`rank`], then the own cluster, then the
/// fastest.
fn nearest(mut clusters: Vec<&ClusterView>, own: &str) -> Vec<String> {
    clusters.sort_by_key(|c| {
        (
            rank(c),
            c.name != own,
            c.latency.unwrap_or(Duration::MAX),
            c.name.clone(),
        )
    });
    clusters.into_iter().map(|c| c.name.clone()).collect()
}

/// The weight of `cluster` for row `row` (rendezvous hashing: a row goes to the cluster of
/// greatest weight, so adding a cluster moves only the rows it wins, and removing one only
/// its own). Stable across servers and restarts (FNV-1a, then a 64-bit finaliser).
pub fn affinity_weight(row: &[u8], cluster: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in cluster
        .as_bytes()
        .iter()
        .chain([0xffu8].iter())
        .chain(row.iter())
    {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // splitmix64's finaliser: FNV's low bits alone spread poorly.
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::AppProfilePriority;

    fn view(name: &str, healthy: bool, latency_ms: Option<u64>) -> ClusterView {
        ClusterView {
            name: name.into(),
            healthy,
            ready: true,
            removing: false,
            latency: latency_ms.map(Duration::from_millis),
        }
    }

    fn record(id: &str, routing: AppProfileRouting) -> AppProfileRecord {
        AppProfileRecord {
            id: id.into(),
            description: String::new(),
            routing,
            priority: AppProfilePriority::High,
        }
    }

    fn single(cluster: &str, transactional: bool) -> Policy {
        Policy::Single {
            cluster: cluster.into(),
            transactional,
        }
    }

    fn multi(clusters: &[&str], row_affinity: bool) -> Policy {
        Policy::Multi {
            clusters: clusters.iter().map(|c| c.to_string()).collect(),
            row_affinity,
        }
    }

    const INSTANCE: &str = "projects/p/instances/i";

    #[test]
    fn an_empty_id_is_the_default_profile_and_an_unknown_one_is_not_found() {
        let mut profiles = HashMap::new();
        assert_eq!(
            resolve("", &profiles, INSTANCE).unwrap(),
            Policy::ReceivingCluster
        );
        assert_eq!(
            resolve("default", &profiles, INSTANCE).unwrap(),
            Policy::ReceivingCluster
        );
        let err = resolve("batch", &profiles, INSTANCE).unwrap_err();
        assert_eq!(err.code(), basalt_model::error::Code::NotFound);
        assert!(
            err.to_string()
                .contains("projects/p/instances/i/appProfiles/batch"),
            "{err}"
        );
        profiles.insert(
            "default".into(),
            record(
                "default",
                AppProfileRouting::MultiClusterRoutingUseAny {
                    cluster_ids: vec![],
                    row_affinity: false,
                },
            ),
        );
        profiles.insert(
            "batch".into(),
            record(
                "batch",
                AppProfileRouting::SingleClusterRouting {
                    cluster_id: "b".into(),
                    allow_transactional_writes: true,
                },
            ),
        );
        assert_eq!(resolve("", &profiles, INSTANCE).unwrap(), multi(&[], false));
        assert_eq!(
            resolve("batch", &profiles, INSTANCE).unwrap(),
            single("b", true)
        );
    }

    #[test]
    fn single_cluster_routing_goes_to_its_cluster_wherever_the_request_arrived() {
        let clusters = [view("a", true, None), view("b", false, None)];
        let p = plan(&single("b", false), Method::ReadRows, None, "a", &clusters).unwrap();
        assert_eq!(
            p,
            Plan {
                clusters: vec!["b".into()],
                fails_over: false
            },
            "no failover, even to a healthy cluster"
        );
        let err = plan(&single("c", false), Method::MutateRow, None, "a", &clusters).unwrap_err();
        assert_eq!(err.code(), basalt_model::error::Code::FailedPrecondition);
        let p = plan(
            &Policy::ReceivingCluster,
            Method::MutateRow,
            None,
            "b",
            &clusters,
        )
        .unwrap();
        assert_eq!(p.clusters, vec!["b".to_string()]);
    }

    #[test]
    fn transactions_need_a_single_cluster_profile_that_allows_them() {
        let clusters = [view("a", true, None), view("b", true, None)];
        for method in [Method::CheckAndMutateRow, Method::ReadModifyWriteRow] {
            for policy in [multi(&[], false), multi(&["a"], true), single("a", false)] {
                let err = plan(&policy, method, Some(b"r"), "a", &clusters).unwrap_err();
                assert_eq!(err.code(), basalt_model::error::Code::FailedPrecondition);
                assert_eq!(err.to_string(), TRANSACTIONS_NOT_ALLOWED);
            }
            assert!(plan(&single("b", true), method, Some(b"r"), "a", &clusters).is_ok());
            assert!(plan(&Policy::ReceivingCluster, method, None, "a", &clusters).is_ok());
        }
        // AddToCell and MergeToCell are ordinary writes: MutateRow goes anywhere.
        assert!(plan(&multi(&[], false), Method::MutateRow, None, "a", &clusters).is_ok());
    }

    #[test]
    fn a_cluster_being_removed_sends_its_client_requests_to_the_clusters_that_stay() {
        let removing = |mut v: ClusterView| {
            v.removing = true;
            v
        };
        let clusters = [
            removing(view("a", true, Some(1))),
            view("b", true, Some(7)),
            view("c", true, Some(3)),
        ];
        // Received by a server of the removed cluster: the nearest staying cluster, failing
        // over to the other; transactions too (they go to one cluster all the same).
        for method in [Method::MutateRow, Method::ReadModifyWriteRow] {
            let p = plan(&Policy::ReceivingCluster, method, None, "a", &clusters).unwrap();
            assert_eq!(p.clusters, ["c", "b"]);
            assert!(p.fails_over);
        }
        // Received elsewhere: the receiving cluster, as ever.
        let p = plan(
            &Policy::ReceivingCluster,
            Method::MutateRow,
            None,
            "b",
            &clusters,
        )
        .unwrap();
        assert_eq!(p.clusters, ["b"]);
        // Multi-cluster routing leaves it out, with or without row affinity.
        for affinity in [false, true] {
            let p = plan(
                &multi(&[], affinity),
                Method::MutateRow,
                Some(b"r"),
                "a",
                &clusters,
            )
            .unwrap();
            assert!(!p.clusters.contains(&"a".to_string()), "{p:?}");
            assert_eq!(p.clusters.len(), 2);
        }
        // A profile that names it alone still reaches it (its removal waits for the profile).
        let p = plan(
            &multi(&["a"], false),
            Method::ReadRows,
            None,
            "b",
            &clusters,
        )
        .unwrap();
        assert_eq!(p.clusters, ["a"]);
        let p = plan(&single("a", false), Method::ReadRows, None, "a", &clusters).unwrap();
        assert_eq!(p.clusters, ["a"]);
        // Every cluster going (the whole instance): requests are served where they arrive.
        let all = [
            removing(view("a", true, None)),
            removing(view("b", true, None)),
        ];
        let p = plan(
            &Policy::ReceivingCluster,
            Method::MutateRow,
            None,
            "a",
            &all,
        )
        .unwrap();
        assert_eq!(p.clusters, ["a"]);
    }

    #[test]
    fn multi_cluster_routing_prefers_the_own_cluster_then_the_fastest_healthy_one() {
        let clusters = [
            view("a", true, Some(9)),
            view("b", true, Some(2)),
            view("c", true, Some(5)),
        ];
        let p = plan(&multi(&[], false), Method::ReadRows, None, "a", &clusters).unwrap();
        assert_eq!(p.clusters, ["a", "b", "c"]);
        assert!(p.fails_over);
        // The own cluster down: the others by latency, the down one last.
        let clusters = [
            view("a", false, Some(1)),
            view("b", true, Some(7)),
            view("c", true, Some(3)),
        ];
        let p = plan(&multi(&[], false), Method::MutateRow, None, "a", &clusters).unwrap();
        assert_eq!(p.clusters, ["c", "b", "a"]);
        // A listed group: only its clusters, even when the own one is healthy.
        let p = plan(
            &multi(&["b"], false),
            Method::ReadRows,
            None,
            "c",
            &clusters,
        )
        .unwrap();
        assert_eq!(p.clusters, ["b"]);
        // A cluster being seeded is used only when nothing else is healthy.
        let mut seeding = view("c", true, Some(1));
        seeding.ready = false;
        let clusters = [view("a", true, Some(5)), seeding];
        let p = plan(&multi(&[], false), Method::ReadRows, None, "c", &clusters).unwrap();
        assert_eq!(p.clusters, ["a", "c"]);
        let err = plan(
            &multi(&["x"], false),
            Method::ReadRows,
            None,
            "a",
            &clusters,
        )
        .unwrap_err();
        assert_eq!(err.code(), basalt_model::error::Code::FailedPrecondition);
    }

    #[test]
    fn row_affinity_is_stable_spread_and_moves_only_rows_a_new_cluster_wins() {
        let two = [view("a", true, Some(1)), view("b", true, Some(1))];
        let three = [
            view("a", true, Some(1)),
            view("b", true, Some(1)),
            view("c", true, Some(1)),
        ];
        let target = |clusters: &[ClusterView], own: &str, row: &[u8]| {
            plan(
                &multi(&[], true),
                Method::MutateRow,
                Some(row),
                own,
                clusters,
            )
            .unwrap()
            .clusters[0]
                .clone()
        };
        let mut counts: HashMap<String, usize> = HashMap::new();
        let mut moved = 0;
        for i in 0..3000 {
            let row = format!("user#{i:05}");
            let t = target(&two, "a", row.as_bytes());
            // The same wherever the request arrived.
            assert_eq!(t, target(&two, "b", row.as_bytes()));
            let t3 = target(&three, "a", row.as_bytes());
            if t3 != t {
                assert_eq!(t3, "c", "{row} moved between two old clusters");
                moved += 1;
            }
            *counts.entry(t).or_default() += 1;
        }
        assert!(counts["a"] > 1200 && counts["b"] > 1200, "{counts:?}");
        assert!((700..1300).contains(&moved), "{moved} rows moved to c");
        // Its cluster down: the row goes elsewhere, and comes back once it is healthy.
        let row = b"user#00001";
        let home = target(&two, "a", row);
        let down: Vec<ClusterView> = two
            .iter()
            .map(|c| view(&c.name, c.name != home, Some(1)))
            .collect();
        assert_ne!(target(&down, "a", row), home);
        assert_eq!(target(&two, "a", row), home);
        // Without a single row, the nearest cluster.
        let p = plan(&multi(&[], true), Method::ReadRows, None, "b", &two).unwrap();
        assert_eq!(p.clusters[0], "b");
    }
}
