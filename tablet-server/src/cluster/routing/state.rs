//! What routing reads on every request, kept current from etcd by [`follow`]: the instance's
//! app profiles, the addresses at which every other cluster is reached, and the health table
//! ([`Health`]) that the calls themselves update.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use basalt_meta::AppProfileRecord;
use parking_lot::RwLock;
use tracing::{info, warn};

use super::decide::{self, ClusterView, Method, Plan};
use super::health::Health;
use crate::cluster::Node;

/// How often app profiles and registrations are read: a changed profile takes effect on every
/// server within about this long.
pub const FOLLOW_EVERY: Duration = Duration::from_millis(300);

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

    /// Reads etcd now and then every [`FOLLOW_EVERY`], until the server ends.
    pub fn spawn(self: &Arc<Self>) {
        let routing = self.clone();
        tokio::spawn(async move {
            let mut failing = false;
            loop {
                match routing.read().await {
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
                }
                tokio::time::sleep(FOLLOW_EVERY).await;
            }
        });
    }

    /// Reads etcd now (between two of [`FOLLOW_EVERY`]'s reads).
    pub async fn refresh(&self) -> basalt_model::Result<()> {
        self.read().await
    }

    async fn read(&self) -> basalt_model::Result<()> {
        let profiles = self.node.meta.app_profiles().await?;
        let (servers, _) = self.node.meta.servers(None).await?;
        let mut addresses: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut registered: BTreeMap<String, usize> = BTreeMap::new();
        let own = &self.node.config.cluster;
        // The instance's clusters as etcd says now (the shippers' copy may be older).
        for c in self.node.meta.cluster_numbers().await?.into_keys() {
            registered.insert(c, 0);
        }
        registered.entry(own.clone()).or_insert(0);
        for s in servers {
            if !registered.contains_key(&s.cluster) {
                // Registered, but not (or no longer) a replica of the instance.
                continue;
            }
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
        let seeding: BTreeSet<String> = self.node.seeding.read().keys().cloned().collect();
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

    pub fn answered(&self, cluster: &str, elapsed: Duration) {
        self.health.write().answered(cluster, elapsed);
    }

    pub fn refused(&self, cluster: &str) {
        self.health.write().refused(cluster, Instant::now());
    }

    pub fn slow(&self, cluster: &str, waited: Duration) {
        self.health.write().slow(cluster, waited, Instant::now());
    }

    pub fn patience(&self, cluster: &str) -> Duration {
        self.health.read().patience(cluster)
    }

    pub fn own(&self) -> &str {
        &self.node.config.cluster
    }
}
