//! What routing reads on every request, kept current from etcd by [`Routing::spawn`]: the
//! instance's app profiles, the addresses at which every other cluster is reached, and the
//! health table ([`Health`]) that the calls themselves update.
//!
//! **Read on change.** A watch of the instance's keys says when something routing depends on
//! changed (an app profile, a registration, the instance's clusters, a peer endpoint, a
//! removal, a seed); only then, and every [`READ_AT_LEAST_EVERY`] in case a watch stalls
//! silently, are those keys read — each cluster's registrations, never its tablet map. The
//! other keys of the instance (tablets, moves, shipping reports) change all the time and
//! trigger nothing.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use basalt_meta::AppProfileRecord;
use basalt_meta::replication::routing_reads;
use parking_lot::RwLock;
use tracing::{info, warn};

use super::decide::{self, ClusterView, Method, Plan};
use super::health::Health;
use crate::cluster::Node;

/// How often app profiles and registrations are read when no change was seen.
pub const READ_AT_LEAST_EVERY: Duration = Duration::from_secs(5);

/// See the module.
pub struct Routing {
    pub(super) node: Arc<Node>,
    profiles: RwLock<HashMap<String, AppProfileRecord>>,
    /// Where each other cluster is reached: its peer endpoint, or its servers' addresses.
    addresses: RwLock<BTreeMap<String, Vec<String>>>,
    health: RwLock<Health>,
}

impl Routing {
    pub fn new(node: Arc<Node>) -> Arc<Routing> {
        Arc::new(Routing {
            node,
            profiles: RwLock::new(HashMap::new()),
            addresses: RwLock::new(BTreeMap::new()),
            health: RwLock::new(Health::default()),
        })
    }

    /// Reads etcd now, then again on every change that matters to routing (see the module
    /// docs), until the server ends.
    pub fn spawn(self: &Arc<Self>) {
        let routing = self.clone();
        tokio::spawn(async move {
            let mut failing = false;
            let mut read = async |routing: &Routing| match routing.read().await {
                Ok(()) if failing => {
                    info!("routing reads app profiles and clusters again");
                    failing = false;
                }
                Ok(()) => {}
                Err(e) if !failing => {
                    warn!(error = %e, "cannot read app profiles and clusters; routing keeps its last view");
                    failing = true;
                }
                Err(_) => {}
            };
            loop {
                // The watch starts before the read: a change after it is an event.
                let meta = &routing.node.meta;
                let watch = meta.watch(meta.keys().prefix(), 0).await;
                read(&routing).await;
                let Ok(mut stream) = watch else {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                };
                // Until the watch ends (etcd restarted, the stream broke): then watch again.
                loop {
                    match tokio::time::timeout(READ_AT_LEAST_EVERY, stream.message()).await {
                        Ok(Ok(Some(changes))) => {
                            let relevant = changes.events().iter().any(|e| {
                                e.kv()
                                    .and_then(|kv| kv.key_str().ok())
                                    .is_some_and(|key| routing_reads(routing.node.meta.keys(), key))
                            });
                            if relevant {
                                read(&routing).await;
                            }
                        }
                        Ok(_) => break,
                        Err(_) => read(&routing).await,
                    }
                }
            }
        });
    }

    /// Reads etcd now (between two reads [`Routing::spawn`] makes).
    pub async fn refresh(&self) -> basalt_model::Result<()> {
        self.read().await
    }

    async fn read(&self) -> basalt_model::Result<()> {
        let profiles = self.node.meta.app_profiles().await?;
        let mut addresses: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut registered: BTreeMap<String, usize> = BTreeMap::new();
        let own = &self.node.config.cluster;
        // The instance's clusters as etcd says now (the shippers' copy may be older). A
        // server registered in another cluster is not (or no longer) a replica of it.
        for c in self.node.meta.cluster_numbers().await?.into_keys() {
            registered.insert(c, 0);
        }
        registered.entry(own.clone()).or_insert(0);
        let mut servers = Vec::new();
        for cluster in registered.keys() {
            servers.extend(self.node.meta.servers(Some(cluster)).await?.0);
        }
        for s in servers {
            *registered.entry(s.cluster.clone()).or_default() += 1;
            addresses
                .entry(s.cluster)
                .or_default()
                .push(s.record.address);
        }
        // A cluster with a peer endpoint is reached there from the other clusters
        // (`basalt_meta::Meta::peer_addresses`; `docs/replication.md`).
        for (cluster, endpoint) in self.node.meta.peer_endpoints().await? {
            if cluster != *own && registered.contains_key(&cluster) {
                addresses.insert(cluster, vec![endpoint]);
            }
        }
        let seeding: BTreeSet<String> = self.node.meta.seeds().await?.into_keys().collect();
        let removing: BTreeSet<String> = self.node.meta.removing().await?.into_keys().collect();
        let changed = {
            let mut current = self.profiles.write();
            let fresh: HashMap<String, AppProfileRecord> =
                profiles.into_iter().map(|p| (p.id.clone(), p)).collect();
            let changed = *current != fresh;
            *current = fresh;
            changed
        };
        if changed {
            info!(
                profiles = self.profiles.read().len(),
                "app profiles changed"
            );
        }
        *self.addresses.write() = addresses;
        if removing.contains(own) && !self.health.read().removing(own) {
            info!("this cluster is being removed: client requests go to the clusters that stay");
        }
        self.health
            .write()
            .set_clusters(registered, seeding, removing);
        Ok(())
    }

    /// Where a request goes (see [`decide::plan`]).
    pub fn plan(
        &self,
        profile: &str,
        method: Method,
        row: Option<&[u8]>,
    ) -> basalt_model::Result<Plan> {
        let policy = decide::resolve(
            profile,
            &self.profiles.read(),
            &self.node.config.instance_name(),
        )?;
        let view: Vec<ClusterView> = self.health.read().view(Instant::now());
        decide::plan(&policy, method, row, &self.node.config.cluster, &view)
    }

    /// The priority of profile `id`'s requests (HIGH for the implicit default or an unknown
    /// profile, which is refused anyway).
    pub fn priority(&self, id: &str) -> basalt_meta::AppProfilePriority {
        self.profiles
            .read()
            .get(decide::profile_id(id))
            .map(|p| p.priority)
            .unwrap_or_default()
    }

    /// Where `cluster` is reached (its peer endpoint, or its servers' addresses, starting at
    /// a different one each call).
    pub fn addresses(&self, cluster: &str, turn: usize) -> Vec<String> {
        let mut a = self
            .addresses
            .read()
            .get(cluster)
            .cloned()
            .unwrap_or_default();
        if !a.is_empty() {
            let n = a.len();
            a.rotate_left(turn % n);
        }
        a
    }

    pub fn answered(&self, cluster: &str, method: Method, elapsed: Duration) {
        self.health.write().answered(cluster, method, elapsed);
    }

    pub fn refused(&self, cluster: &str) {
        self.health.write().refused(cluster, Instant::now());
    }

    pub fn slow(&self, cluster: &str, method: Method, waited: Duration) {
        self.health
            .write()
            .slow(cluster, method, waited, Instant::now());
    }

    pub fn patience(&self, cluster: &str, method: Method) -> Duration {
        self.health.read().patience(cluster, method)
    }

    pub fn own(&self) -> &str {
        &self.node.config.cluster
    }
}
