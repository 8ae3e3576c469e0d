//! Removing a Cluster from a replicated instance, the same way on both runtimes: the cluster
//! may go only once every write its servers logged is durable in at least one cluster that
//! stays (Bigtable finishes replicating a removed cluster's writes first,
//! `shared/REPLICATION.md`). [`decide`] is the decision (pure), on the facts [`observe`] reads
//! from etcd: the cluster's servers (registered now or not, owning tablets or not) and their
//! `shipped/` records ([`ShippedRecord`]).
//!
//! Each server is judged on its own:
//!
//! * a server that is **registered** may still take writes, so only a report made after the
//!   removal began (`since`: client writes were routed away from it then) counts; it is done
//!   once one such report says a staying cluster acknowledged its whole log (an older report
//!   that says entries wait names them: they still do);
//! * a server that is **not registered** and **owns tablets** is down and may come back with
//!   writes logged after its last report — unless the runtime stopped it for good (`stopped`:
//!   its last report is its last word);
//! * any other server that is not registered counts with its last report;
//! * a server whose log is empty (`loggedSeq` 0) holds nothing.
//!
//! With no staying cluster (the whole instance goes), there is nothing to ship to: the cluster
//! may go at once.
//!
//! [`step`] (pure) is what a runtime does next once the cluster's client writes are routed
//! away: wait, stop its servers, wait for them to stop, start them again (they stopped with
//! writes not shipped), or release the replica. Both runtimes follow it: Kubernetes holds the
//! Cluster's deletion with a finalizer meanwhile (`controller::cluster::removal`), the local
//! runtime removes a cluster that a `local apply` leaves out the same way
//! (`local::runtime::removal`), and keeps a cluster left out of its manifests at start a
//! replica until it may go ([`super::records::declare_replicas`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use basalt_master::model::{Result, ServerId, TabletState};
use basalt_meta::routing::Policy;
use basalt_meta::{AppProfileRecord, Meta, ShippedRecord};

/// One server of the cluster being removed, as etcd knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    pub store_id: ServerId,
    /// Its name (the store id when it is not registered and was never seen).
    pub name: String,
    /// Registered now: it may take writes.
    pub registered: bool,
    /// Owns a tablet (not lost) of the cluster's tablet map.
    pub owns_tablets: bool,
}

/// What etcd says of a cluster being removed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Facts {
    pub cluster: String,
    /// Its servers: registered, owning tablets, or with a `shipped/` record.
    pub servers: Vec<Server>,
    /// The `shipped/` records of its servers (towards every peer).
    pub shipped: Vec<ShippedRecord>,
    /// The instance's app profiles.
    pub profiles: Vec<AppProfileRecord>,
}

/// Why one server holds the removal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holding {
    /// Its log has entries no staying cluster acknowledged: the fewest any staying cluster
    /// misses, and what each one misses (peer → entries).
    Unshipped {
        entries: u64,
        peers: BTreeMap<String, u64>,
    },
    /// Registered, but no report since the removal began (it may have taken writes until then).
    NoFreshReport,
    /// Owns tablets but is not registered (down, restarting): what it logged after its last
    /// report is known to its own log only.
    Down,
}

/// A server that holds the removal, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub server: String,
    pub why: Holding,
}

/// The removal is refused for now: the servers that hold it. Its `Display` is the message a
/// status condition (or `local status`) shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub cluster: String,
    /// App profiles that route only to it (single-cluster routing to it, or multi-cluster
    /// routing to a group of which no other cluster stays): Bigtable does not delete a cluster
    /// an app profile needs, so the removal waits until they change.
    pub profiles: Vec<String>,
    pub held: Vec<Held>,
}

impl Refused {
    /// The reason a status shows: `TargetedByAppProfile` while an app profile needs the
    /// cluster, else `UnshippedWrites`.
    pub fn reason(&self) -> &'static str {
        if self.profiles.is_empty() {
            "UnshippedWrites"
        } else {
            "TargetedByAppProfile"
        }
    }

    /// The change log entries waiting, summed over the servers (each counted for the staying
    /// cluster closest to having them).
    pub fn entries(&self) -> u64 {
        self.held
            .iter()
            .map(|h| match &h.why {
                Holding::Unshipped { entries, .. } => *entries,
                _ => 0,
            })
            .sum()
    }
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.profiles.is_empty() {
            write!(
                f,
                "app profile(s) {} route only to cluster {}: change their routing first",
                self.profiles.join(", "),
                self.cluster
            )?;
            if self.held.is_empty() {
                return Ok(());
            }
            f.write_str("; ")?;
        }
        write!(
            f,
            "cluster {} holds writes not yet in any other cluster: ",
            self.cluster
        )?;
        for (i, h) in self.held.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            match &h.why {
                Holding::Unshipped { peers, .. } => {
                    let each: Vec<String> = peers
                        .iter()
                        .map(|(peer, n)| format!("{n} to {peer}"))
                        .collect();
                    write!(
                        f,
                        "server {} has change log entries waiting ({})",
                        h.server,
                        each.join(", ")
                    )?;
                }
                Holding::NoFreshReport => write!(
                    f,
                    "server {} has not reported its change log since the removal began",
                    h.server
                )?,
                Holding::Down => write!(
                    f,
                    "server {} owns tablets but is not registered: its log is known only once it is back",
                    h.server
                )?,
            }
        }
        Ok(())
    }
}

/// Whether the cluster of `facts` may leave the instance, given `staying` (the clusters that
/// stay: its writes must be durable in one of them), `since_micros` (when client writes were
/// routed away from it: a registered server's report must be newer; None: no report of a
/// registered server is fresh) and `stopped` (the runtime stopped its servers for good: the last
/// report of one that owns tablets is final). Pure.
pub fn decide(
    facts: &Facts,
    staying: &[String],
    since_micros: Option<i64>,
    stopped: bool,
) -> Result<(), Refused> {
    let staying: BTreeSet<&str> = staying
        .iter()
        .map(String::as_str)
        .filter(|c| *c != facts.cluster)
        .collect();
    if staying.is_empty() {
        return Ok(());
    }
    let profiles = targeting(&facts.profiles, &facts.cluster, &staying);
    let mut held = Vec::new();
    for server in &facts.servers {
        let records: Vec<&ShippedRecord> = facts
            .shipped
            .iter()
            .filter(|r| r.store_id == server.store_id && staying.contains(r.peer.as_str()))
            .collect();
        let why = if server.registered {
            let fresh: Vec<&ShippedRecord> = records
                .iter()
                .copied()
                .filter(|r| since_micros.is_some_and(|s| r.reported_micros >= s))
                .collect();
            if !fresh.is_empty() && unshipped(&fresh).is_none() {
                None
            } else {
                // No fresh report says it is caught up. Entries its reports say are waiting
                // are waiting still (a shipper whose batch hangs on an unreachable peer does
                // not report until it fails); otherwise it has not spoken since.
                unshipped(&records)
                    .filter(|_| !records.is_empty())
                    .or(Some(Holding::NoFreshReport))
            }
        } else if server.owns_tablets && !stopped {
            Some(Holding::Down)
        } else {
            unshipped(&records)
        };
        if let Some(why) = why {
            held.push(Held {
                server: server.name.clone(),
                why,
            });
        }
    }
    if held.is_empty() && profiles.is_empty() {
        Ok(())
    } else {
        Err(Refused {
            cluster: facts.cluster.clone(),
            profiles,
            held,
        })
    }
}

/// The ids of the `profiles` that route only to `cluster` once it is gone: single-cluster
/// routing to it, or multi-cluster routing to a group that names it and no cluster of
/// `staying`.
fn targeting(
    profiles: &[AppProfileRecord],
    cluster: &str,
    staying: &BTreeSet<&str>,
) -> Vec<String> {
    profiles
        .iter()
        .filter(|p| match Policy::of(p) {
            Policy::Single { cluster: c, .. } => c == cluster,
            Policy::Multi { clusters, .. } => {
                clusters.iter().any(|c| c == cluster)
                    && !clusters.iter().any(|c| staying.contains(c.as_str()))
            }
            Policy::ReceivingCluster => false,
        })
        .map(|p| p.id.clone())
        .collect()
}

/// What a runtime does next about a cluster being removed, its client writes routed away.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Its servers run and hold writes no staying cluster has: wait (why).
    Wait(Refused),
    /// Every write is in a staying cluster: stop the servers.
    Stop,
    /// The servers are stopping: wait until none is registered.
    Stopping { registered: usize },
    /// Stopped with writes no staying cluster has (they came in after the decision and the
    /// servers could not ship them before they stopped): start the servers again.
    Restart(Refused),
    /// No server left, every write in a staying cluster: release the replica.
    Release,
}

/// The next step of the removal of the cluster of `facts`: `staying` are the clusters that
/// stay, `running` whether the runtime runs its servers (a StatefulSet's replicas above 0, the
/// local runtime's servers not stopped), `since_micros` when its client writes were routed
/// away ([`decide`]). Once the runtime stopped the servers, their last reports are final.
/// Pure.
pub fn step(facts: &Facts, staying: &[String], running: bool, since_micros: Option<i64>) -> Step {
    if running {
        return match decide(facts, staying, since_micros, false) {
            Ok(()) => Step::Stop,
            Err(refused) => Step::Wait(refused),
        };
    }
    let registered = facts.servers.iter().filter(|s| s.registered).count();
    if registered > 0 {
        return Step::Stopping { registered };
    }
    // Stopped: each server shipped what it could before it left (it waits a moment for
    // that), so its last reports are final. Writes that came in after the decision and did
    // not make it: the servers start again to ship them.
    match decide(facts, staying, None, true) {
        Ok(()) => Step::Release,
        Err(refused) => Step::Restart(refused),
    }
}

/// None when one of `records` (one server's, towards staying clusters) says its whole log is
/// acknowledged, or when the server never logged (no record, or all at `loggedSeq` 0).
fn unshipped(records: &[&ShippedRecord]) -> Option<Holding> {
    // A record at loggedSeq 0 has acknowledged everything (0 >= 0).
    if records.is_empty() || records.iter().any(|r| r.acked_seq >= r.logged_seq) {
        return None;
    }
    let peers: BTreeMap<String, u64> = records
        .iter()
        .map(|r| (r.peer.clone(), r.logged_seq - r.acked_seq))
        .collect();
    Some(Holding::Unshipped {
        entries: peers.values().copied().min().unwrap_or(0),
        peers,
    })
}

/// Step 1 in etcd, on both runtimes: marks `cluster` as being removed since `since_micros`
/// ([`Meta::mark_removing`]; kept if already marked). Its servers then send every client
/// request they receive to the clusters that stay (but those of an app profile that routes only
/// to it, which hold the removal), so it logs no more client writes and its log ships to its
/// end even while clients keep connections to it open. Released with the replica.
pub async fn route_away(meta: &Meta, cluster: &str, since_micros: i64) -> Result<()> {
    meta.mark_removing(cluster, since_micros).await
}

/// Reads what etcd says of `cluster`: its registered servers, its tablets' owners and its
/// servers' `shipped/` records. A server known only from a record or a tablet is named by its
/// store id.
pub async fn observe(meta: &Meta, cluster: &str) -> Result<Facts> {
    let (registered, _) = meta.servers(Some(cluster)).await?;
    let (tablets, _) = meta.tablets(cluster).await?;
    let shipped: Vec<ShippedRecord> = meta
        .shipped()
        .await?
        .into_iter()
        .filter(|r| r.cluster == cluster)
        .collect();
    let owners: BTreeSet<ServerId> = tablets
        .tables()
        .flat_map(|t| tablets.tablets(t).iter())
        .filter(|t| t.state != TabletState::Lost)
        .map(|t| t.owner.clone())
        .collect();
    let mut servers: BTreeMap<ServerId, Server> = BTreeMap::new();
    for r in registered {
        servers.insert(
            r.record.store_id.clone(),
            Server {
                store_id: r.record.store_id.clone(),
                name: r.record.name.clone(),
                registered: true,
                owns_tablets: false,
            },
        );
    }
    for id in owners.iter().chain(shipped.iter().map(|r| &r.store_id)) {
        servers.entry(id.clone()).or_insert_with(|| Server {
            store_id: id.clone(),
            name: id.clone(),
            registered: false,
            owns_tablets: false,
        });
    }
    for (id, server) in servers.iter_mut() {
        server.owns_tablets = owners.contains(id);
    }
    Ok(Facts {
        cluster: cluster.to_string(),
        servers: servers.into_values().collect(),
        shipped,
        profiles: meta.app_profiles().await?,
    })
}

/// The clusters that left the instance without being released yet: each has a number in etcd
/// but is not among `declared` (the Clusters the runtime knows), and none of its servers is
/// registered (the runtime stopped them: their last reports are final). With each, whether it
/// may go now ([`decide`], the declared clusters staying).
pub async fn departed(
    meta: &Meta,
    declared: &[String],
) -> Result<Vec<(String, Result<(), Refused>)>> {
    let numbers = meta.cluster_numbers().await?;
    let mut out = Vec::new();
    for gone in numbers.keys().filter(|c| !declared.contains(c)) {
        let facts = observe(meta, gone).await?;
        if facts.servers.iter().any(|s| s.registered) {
            continue;
        }
        out.push((gone.clone(), decide(&facts, declared, None, true)));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(name: &str, registered: bool, owns_tablets: bool) -> Server {
        Server {
            store_id: format!("st-{name}"),
            name: name.into(),
            registered,
            owns_tablets,
        }
    }

    fn shipped(server: &str, peer: &str, acked: u64, logged: u64, at: i64) -> ShippedRecord {
        ShippedRecord {
            store_id: format!("st-{server}"),
            cluster: "b".into(),
            peer: peer.into(),
            acked_seq: acked,
            logged_seq: logged,
            lag_micros: 0,
            reported_micros: at,
            acked_hlc: 0,
        }
    }

    fn facts(servers: Vec<Server>, shipped: Vec<ShippedRecord>) -> Facts {
        Facts {
            cluster: "b".into(),
            servers,
            shipped,
            profiles: vec![],
        }
    }

    fn staying(c: &[&str]) -> Vec<String> {
        c.iter().map(|c| c.to_string()).collect()
    }

    #[test]
    fn a_cluster_whose_every_write_is_in_another_cluster_may_go() {
        let f = facts(
            vec![server("b-0", true, true), server("b-1", true, true)],
            vec![
                shipped("b-0", "a", 10, 10, 200),
                shipped("b-1", "a", 7, 7, 200),
            ],
        );
        assert_eq!(decide(&f, &staying(&["a", "b"]), Some(100), false), Ok(()));
    }

    #[test]
    fn unshipped_entries_refuse_it_with_the_server_the_entries_and_the_peers() {
        let f = facts(
            vec![server("b-0", true, true), server("b-1", true, true)],
            vec![
                shipped("b-0", "a", 10, 10, 200),
                shipped("b-1", "a", 3, 15, 200),
                shipped("b-1", "c", 9, 15, 200),
            ],
        );
        let refused = decide(&f, &staying(&["a", "c"]), Some(100), false).unwrap_err();
        assert_eq!(refused.held.len(), 1);
        assert_eq!(refused.entries(), 6);
        assert_eq!(
            refused.to_string(),
            "cluster b holds writes not yet in any other cluster: server b-1 has change log \
             entries waiting (12 to a, 6 to c)"
        );
        // One staying cluster holding the whole log is enough.
        let mut f = f;
        f.shipped[2].acked_seq = 15;
        assert_eq!(decide(&f, &staying(&["a", "c"]), Some(100), false), Ok(()));
    }

    #[test]
    fn an_app_profile_that_routes_only_to_the_cluster_holds_its_removal() {
        use basalt_meta::{AppProfilePriority, AppProfileRouting};
        let profile = |id: &str, routing| AppProfileRecord {
            id: id.into(),
            description: String::new(),
            routing,
            priority: AppProfilePriority::High,
        };
        let multi = |ids: &[&str]| AppProfileRouting::MultiClusterRoutingUseAny {
            cluster_ids: ids.iter().map(|c| c.to_string()).collect(),
            row_affinity: false,
        };
        let mut f = facts(
            vec![server("b-0", true, true)],
            vec![shipped("b-0", "a", 10, 10, 200)],
        );
        f.profiles = vec![
            profile(
                "on-b",
                AppProfileRouting::SingleClusterRouting {
                    cluster_id: "b".into(),
                    allow_transactional_writes: true,
                },
            ),
            profile("only-b-and-c", multi(&["b", "c"])),
            // Not held: another cluster of the group stays; any cluster; another one.
            profile("b-or-a", multi(&["b", "a"])),
            profile("any", multi(&[])),
            profile(
                "on-a",
                AppProfileRouting::SingleClusterRouting {
                    cluster_id: "a".into(),
                    allow_transactional_writes: false,
                },
            ),
        ];
        let refused = decide(&f, &staying(&["a"]), Some(100), false).unwrap_err();
        assert_eq!(refused.profiles, ["on-b", "only-b-and-c"]);
        assert!(refused.held.is_empty());
        assert_eq!(refused.reason(), "TargetedByAppProfile");
        assert_eq!(
            refused.to_string(),
            "app profile(s) on-b, only-b-and-c route only to cluster b: change their routing first"
        );
        assert!(matches!(
            step(&f, &staying(&["a"]), true, Some(100)),
            Step::Wait(_)
        ));
        // With c staying too, the group has a cluster left.
        let refused = decide(&f, &staying(&["a", "c"]), Some(100), false).unwrap_err();
        assert_eq!(refused.profiles, ["on-b"]);
        // The profiles changed: it may go. The whole instance going: never held.
        f.profiles.truncate(0);
        assert_eq!(decide(&f, &staying(&["a"]), Some(100), false), Ok(()));
        f.profiles = vec![profile("any", multi(&["b"]))];
        assert_eq!(decide(&f, &staying(&[]), Some(100), false), Ok(()));
    }

    #[test]
    fn only_staying_clusters_count() {
        // b-0's log is all in c, but c is being removed too: a still misses 4 entries.
        let f = facts(
            vec![server("b-0", true, true)],
            vec![
                shipped("b-0", "a", 6, 10, 200),
                shipped("b-0", "c", 10, 10, 200),
            ],
        );
        let refused = decide(&f, &staying(&["a"]), Some(100), false).unwrap_err();
        assert_eq!(
            refused.held[0].why,
            Holding::Unshipped {
                entries: 4,
                peers: BTreeMap::from([("a".into(), 4)])
            }
        );
        // Nothing stays (the whole instance goes): nothing to wait for.
        assert_eq!(decide(&f, &staying(&["b"]), Some(100), false), Ok(()));
        assert_eq!(decide(&f, &[], None, false), Ok(()));
    }

    #[test]
    fn a_registered_server_needs_a_report_made_after_the_removal_began() {
        // Caught up at 50, but writes were routed to it until 100.
        let f = facts(
            vec![server("b-0", true, true)],
            vec![shipped("b-0", "a", 10, 10, 50)],
        );
        let refused = decide(&f, &staying(&["a"]), Some(100), false).unwrap_err();
        assert_eq!(refused.held[0].why, Holding::NoFreshReport);
        assert!(refused.to_string().contains("since the removal began"));
        assert!(decide(&f, &staying(&["a"]), None, false).is_err());
        // A report from before that says entries wait: they still do (a shipper whose batch
        // hangs on an unreachable peer does not report meanwhile).
        let f = facts(
            vec![server("b-0", true, true)],
            vec![shipped("b-0", "a", 8, 10, 50)],
        );
        let refused = decide(&f, &staying(&["a"]), Some(100), false).unwrap_err();
        assert!(
            matches!(refused.held[0].why, Holding::Unshipped { entries: 2, .. }),
            "{refused:?}"
        );
        // A registered server with no record at all has not said anything yet either.
        let f = facts(vec![server("b-0", true, false)], vec![]);
        assert!(decide(&f, &staying(&["a"]), Some(100), false).is_err());
    }

    #[test]
    fn a_server_that_never_logged_holds_nothing() {
        let f = facts(
            vec![server("b-0", true, true), server("b-1", false, false)],
            vec![shipped("b-0", "a", 0, 0, 200)],
        );
        assert_eq!(decide(&f, &staying(&["a"]), Some(100), false), Ok(()));
    }

    #[test]
    fn a_down_owner_holds_the_removal_unless_the_runtime_stopped_it() {
        // b-0 owns tablets and is not registered: it may come back with more.
        let f = facts(
            vec![server("b-0", false, true)],
            vec![shipped("b-0", "a", 10, 10, 50)],
        );
        let refused = decide(&f, &staying(&["a"]), Some(100), false).unwrap_err();
        assert_eq!(refused.held[0].why, Holding::Down);
        // Stopped for good by the runtime: its last report is final, whatever its age.
        assert_eq!(decide(&f, &staying(&["a"]), Some(100), true), Ok(()));
        let f = facts(
            vec![server("b-0", false, true)],
            vec![shipped("b-0", "a", 8, 10, 50)],
        );
        assert!(matches!(
            decide(&f, &staying(&["a"]), Some(100), true)
                .unwrap_err()
                .held[0]
                .why,
            Holding::Unshipped { entries: 2, .. }
        ));
        // Drained (owns nothing) and gone: its last report counts, old or not.
        let f = facts(
            vec![server("b-0", false, false)],
            vec![shipped("b-0", "a", 10, 10, 50)],
        );
        assert_eq!(decide(&f, &staying(&["a"]), Some(100), false), Ok(()));
    }
}
