//! The master's runtime: campaigns for the instance's master role in etcd and, while it leads,
//! carries out the pure decisions of `basalt-master` as etcd transactions fenced by its term:
//!
//! * every table without tablets in a cluster that has a ready server gets them
//!   ([`basalt_master::assign_new_table`]);
//! * the tablets of a server gone for good (its name came back under another store id, past its
//!   serving deadline) become Lost ([`basalt_master::lost_servers`], [`basalt_master::mark_lost`]);
//! * the Lost tablets of a server whose loss an administrator accepted (the key
//!   `clusters/<c>/accept-loss/<store-id>`) are given, empty, to live servers at the next epoch
//!   ([`basalt_master::accept_loss`]), and the key is deleted.
//!
//! * tablets move ([`moves`]): off the servers above the Cluster's `serveNodes` (recorded in
//!   etcd by the operator or the local runtime; [`basalt_master::drain`]), and from the most to
//!   the least loaded server ([`basalt_master::rebalance`]); moves a previous master left are
//!   aborted when a term begins;
//! * tablets larger than the split size are split, metadata only, at a row near their middle
//!   ([`basalt_master::splits`]);
//! * a cluster that joined the instance with data is seeded: every table copied into it from a
//!   READY cluster ([`seeding`]);
//! * the servers' Key Visualizer samples are gathered every minute into each table's history
//!   ([`crate::keyviz::collector`]).
//!
//! It acts every [`MasterTiming::interval`] and on every change under the instance's prefix.
//! etcd being down never ends it: it retries with back-off. It stops acting the moment its
//! leadership is lost (etcd also refuses every transaction of an old term) and campaigns again.
//! See `docs/master.md`.

pub mod autoscaler;
pub mod moves;
pub mod seeding;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use basalt_control::Dialer;
use basalt_master::model::{self, ServerId, Tablet, TabletMap};
use basalt_master::{
    BalanceContext, BalancePolicy, ClusterView, MovePlan, Presence, ServerState, SplitContext,
    SplitPolicy, TabletControl, TabletKey, TabletLoad, accept_loss, accepted_lost,
    assign_new_table, drain, key_of, lost_servers, mark_lost, rebalance, split_tablet, splits,
};
use basalt_meta::{
    EtcdEndpoints, Keys, Leadership, LeaseTiming, Meta, ServerRecord, StoredSchema, TabletFollower,
    Term, WatchMessage, table_id,
};
use tracing::{info, warn};

use crate::lifecycle;
use crate::lifecycle::view::ServerBook;
use crate::tablet_servers::{GrpcTabletControl, STATUS_DEADLINE};

/// Which instance's master this is and how to reach its etcd.
#[derive(Clone, Debug)]
pub struct MasterConfig {
    /// etcd client URLs, e.g. `http://127.0.0.1:2379`.
    pub etcd_endpoints: Vec<String>,
    /// The Kubernetes namespace of the Instance (`default` in the local runtime unless the
    /// manifest names one): part of the etcd prefix `/basalt/v1/<namespace>/<instance>/`.
    pub namespace: String,
    /// The Instance's name.
    pub instance: String,
    /// This candidate's name in the election (pod name, or `local`).
    pub identity: String,
    /// The Prometheus server the autoscaler asks (`http://host:port`); None: it samples the
    /// servers' own reports ([`autoscaler`]).
    pub prometheus_url: Option<String>,
    /// How the master dials the tablet servers (control protocol, moves): plaintext, or TLS
    /// with the instance's CA and the master's certificate (an internal principal).
    pub security: basalt_transport::Security,
    /// How it reaches etcd (its URLs' scheme must agree).
    pub etcd_security: basalt_transport::Security,
}

/// The master's timings.
#[derive(Clone, Copy, Debug)]
pub struct MasterTiming {
    /// The tablet servers' lease timing (their registrations' TTL and their grace).
    pub servers: LeaseTiming,
    /// How long past the lease TTL a server must have been absent before it may be declared
    /// lost. Must exceed `servers.grace`: by then the server stopped serving on its own.
    pub margin: Duration,
    /// The TTL of the master's own lease: how long a master that stops renewing (crashed, cut
    /// off) keeps the role before another candidate is elected.
    pub master_ttl: Duration,
    /// How often the leader looks at the instance when nothing changes.
    pub interval: Duration,
    /// The longest wait between two attempts to reach etcd.
    pub max_backoff: Duration,
    /// How long a moved tablet stays where it went before it may move again.
    pub move_cooldown: Duration,
    /// How often the servers' reports (tablet sizes and loads) are read.
    pub report_interval: Duration,
}

impl Default for MasterTiming {
    fn default() -> Self {
        MasterTiming {
            servers: LeaseTiming::default(),
            margin: Duration::from_secs(15),
            master_ttl: Duration::from_secs(10),
            interval: Duration::from_millis(500),
            max_backoff: Duration::from_secs(5),
            move_cooldown: Duration::from_secs(30),
            report_interval: Duration::from_secs(5),
        }
    }
}

/// Runs the master for one instance until `shutdown` resolves, with the default timings.
pub async fn run(
    config: MasterConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    run_with(config, MasterTiming::default(), shutdown).await
}

/// Runs the master for one instance until `shutdown` resolves: then it resigns (if it leads)
/// and returns Ok. Errors only on timings that would be unsafe.
pub async fn run_with(
    config: MasterConfig,
    timing: MasterTiming,
    shutdown: impl Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        timing.margin > timing.servers.grace,
        "the master's margin ({:?}) must exceed the servers' grace ({:?}): a server could still \
         be serving the tablets the master gives away",
        timing.margin,
        timing.servers.grace
    );
    let mut shutdown = std::pin::pin!(shutdown);
    let keys = Keys::new(&config.namespace, &config.instance);
    // Every connection of the master (etcd, the servers' control and move services) goes
    // through basalt-transport.
    let dialer = Dialer::new(config.security.clone());
    let etcd = EtcdEndpoints::new(&config.etcd_endpoints, &config.etcd_security)?;
    let mut backoff = Backoff::new(timing.max_backoff);
    let meta = loop {
        tokio::select! {
            _ = &mut shutdown => return Ok(()),
            meta = Meta::connect(&etcd, keys.clone()) => match meta {
                Ok(meta) => break meta,
                Err(e) => {
                    warn!(error = %e, "the master cannot reach etcd yet; retrying");
                    if backoff.wait(&mut shutdown).await {
                        return Ok(());
                    }
                }
            },
        }
    };
    // Names outlive terms: a server's name, learnt while it was registered, is how a later
    // term recognises its replacement.
    let mut names = ServerBook::default();
    loop {
        let leadership = tokio::select! {
            _ = &mut shutdown => return Ok(()),
            elected = meta.campaign(&config.identity, timing.master_ttl) => elected,
        };
        let leadership = match leadership {
            Ok(leadership) => leadership,
            Err(e) => {
                warn!(error = %e, "campaign for the master role failed; retrying");
                if backoff.wait(&mut shutdown).await {
                    return Ok(());
                }
                continue;
            }
        };
        backoff.reset();
        crate::metrics::master_leader(&config.namespace, &config.instance, true);
        info!(
            identity = config.identity,
            term = leadership.term.revision,
            "leading the instance"
        );
        // The Key Visualizer's collector runs while this term leads.
        let collector = tokio::spawn(crate::keyviz::collector::run(
            meta.clone(),
            dialer.clone(),
            leadership.term.clone(),
        ));
        let mut leader = Leader {
            meta: meta.clone(),
            dialer: dialer.clone(),
            timing,
            term: leadership.term.clone(),
            absent_since: HashMap::new(),
            names: &mut names,
            warned: HashSet::new(),
            moving: Arc::new(parking_lot::Mutex::new(HashMap::new())),
            cooling: Arc::new(parking_lot::Mutex::new(HashMap::new())),
            cleaned: HashSet::new(),
            reports: HashMap::new(),
            backing_off: HashMap::new(),
            policy: MovePolicy::from_env(),
            seeding: HashMap::new(),
            autoscaler: autoscaler::Autoscaler::new(
                &config.namespace,
                &config.instance,
                config.prometheus_url.as_deref(),
                timing.report_interval,
            ),
            labels: [config.namespace.clone(), config.instance.clone()],
            maps: HashMap::new(),
        };
        let ended = leader.lead(leadership, &mut shutdown).await;
        collector.abort();
        crate::metrics::master_leader(&config.namespace, &config.instance, false);
        // A copy task of this term must not outlive it (its writes are fenced anyway).
        for (_, task) in leader.seeding.drain() {
            task.abort();
        }
        match ended {
            Ended::Shutdown => return Ok(()),
            Ended::Lost => warn!("the master role was lost; campaigning again"),
        }
    }
}

/// Exponential back-off between attempts to reach etcd.
struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(100);

    fn new(max: Duration) -> Backoff {
        Backoff {
            next: Self::FIRST,
            max,
        }
    }

    fn reset(&mut self) {
        self.next = Self::FIRST;
    }

    /// Waits the next delay; true if `shutdown` came first.
    async fn wait(&mut self, shutdown: &mut (impl Future<Output = ()> + Unpin)) -> bool {
        let delay = self.next;
        self.next = (self.next * 2).min(self.max);
        tokio::select! {
            _ = shutdown => true,
            _ = tokio::time::sleep(delay) => false,
        }
    }
}

enum Ended {
    Shutdown,
    Lost,
}

/// One term of leadership.
struct Leader<'a> {
    meta: Meta,
    /// The servers' control and move clients.
    dialer: Dialer,
    timing: MasterTiming,
    term: Term,
    /// Since when each (cluster, store id) owning tablets has been seen unregistered in this
    /// term: a new leader starts every clock at its election (later is the safe side).
    absent_since: HashMap<(String, ServerId), Instant>,
    /// The servers seen registered (a server that went away keeps its name and ordinal).
    names: &'a mut ServerBook,
    /// Accepted losses already reported as not (yet) applicable.
    warned: HashSet<(String, ServerId)>,
    /// Moves running now, by (cluster, tablet).
    moving: Arc<parking_lot::Mutex<HashMap<(String, TabletKey), MovePlan>>>,
    /// When each recently moved tablet arrived, by (cluster, tablet).
    cooling: Arc<parking_lot::Mutex<HashMap<(String, TabletKey), Instant>>>,
    /// Clusters whose leftover moves this term has aborted.
    cleaned: HashSet<String>,
    /// The last reports per cluster: when, tablet loads, per-server stored and capacity bytes.
    reports: HashMap<String, Reports>,
    /// Tablets that had no split point, until when.
    backing_off: HashMap<(String, TabletKey), Instant>,
    policy: MovePolicy,
    /// The copy tasks of clusters being seeded, by cluster ([`seeding`]).
    seeding: HashMap<String, tokio::task::JoinHandle<()>>,
    /// The autoscaler's samples and decisions ([`autoscaler`]).
    autoscaler: autoscaler::Autoscaler,
    /// The instance's namespace and name, for the metrics' labels.
    labels: [String; 2],
    /// Each cluster's tablet map, read once and followed from the instance's watch.
    maps: HashMap<String, TabletFollower>,
}

/// What the servers of a cluster last reported.
struct Reports {
    at: Instant,
    loads: Arc<BTreeMap<TabletKey, TabletLoad>>,
    servers: HashMap<ServerId, (u64, Option<u64>)>,
    /// Their CPU clocks (the autoscaler's fallback source).
    cpu: BTreeMap<ServerId, basalt_master::autoscale::CpuReading>,
}

/// The master's move, split and balance settings (environment variables override the
/// defaults; see `docs/master.md`).
#[derive(Clone, Debug)]
struct MovePolicy {
    balance: BalancePolicy,
    split: SplitPolicy,
    /// Most snapshot bytes per second a move streams (0: unlimited).
    rate_limit_bytes_per_sec: u64,
    /// How long a tablet without a split point is not proposed again.
    split_backoff: Duration,
}

impl MovePolicy {
    fn from_env() -> MovePolicy {
        let num = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<f64>().ok());
        let mut p = MovePolicy {
            balance: BalancePolicy::default(),
            split: SplitPolicy::default(),
            rate_limit_bytes_per_sec: 256 << 20,
            split_backoff: Duration::from_secs(300),
        };
        if let Some(v) = num("BASALT_SPLIT_BYTES") {
            p.split.max_tablet_bytes = v as u64;
        }
        if let Some(v) = num("BASALT_SPLIT_REQUESTS_PER_SEC") {
            p.split.hot_requests_per_sec = v;
        }
        if let Some(v) = num("BASALT_MOVE_RATE_BYTES_PER_SEC") {
            p.rate_limit_bytes_per_sec = v as u64;
        }
        if let Some(v) = num("BASALT_BALANCE_TOLERANCE") {
            p.balance.tolerance = v;
        }
        if let Some(v) = num("BASALT_MOVES_PER_CLUSTER") {
            p.balance.max_moves_per_cluster = v as usize;
        }
        p
    }
}

impl Leader<'_> {
    async fn lead(
        &mut self,
        mut leadership: Leadership,
        shutdown: &mut (impl Future<Output = ()> + Unpin),
    ) -> Ended {
        let prefix = self.meta.keys().prefix().to_string();
        let mut changes = None;
        let mut tick = tokio::time::interval(self.timing.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if changes.is_none() {
                // From the current revision: a pass follows at once and reads everything.
                // The maps followed so far missed what happened meanwhile: read them again.
                self.maps.clear();
                changes = self.meta.watch(&prefix, 0).await.ok();
            }
            // Every change already delivered goes into the followed maps before the pass.
            while let Some(stream) = changes.as_mut() {
                match tokio::time::timeout(Duration::ZERO, stream.message()).await {
                    Err(_) => break,
                    Ok(message) => {
                        if !self.follow(message).await {
                            changes = None;
                        }
                    }
                }
            }
            let pass = async {
                if let Err(e) = self.pass().await {
                    warn!(error = %e, "the master's pass failed; retrying");
                }
            };
            tokio::select! {
                _ = &mut *shutdown => {
                    leadership.resign().await;
                    return Ended::Shutdown;
                }
                _ = leadership.lost() => return Ended::Lost,
                _ = pass => {}
            }
            let changed = async {
                match changes.as_mut() {
                    Some(stream) => stream.message().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = &mut *shutdown => {
                    leadership.resign().await;
                    return Ended::Shutdown;
                }
                _ = leadership.lost() => return Ended::Lost,
                _ = tick.tick() => {}
                message = changed => {
                    if !self.follow(message).await {
                        changes = None;
                    }
                }
            }
        }
    }

    /// Applies one message of the instance's watch to the followed tablet maps. False when
    /// the watch ended (broken, cancelled, compacted away): watch again and read the maps.
    /// A map its changes do not fit is dropped (read again at the next pass).
    async fn follow(&mut self, message: WatchMessage) -> bool {
        let resp = match message {
            Ok(Some(resp)) if !resp.canceled() && resp.compact_revision() == 0 => resp,
            _ => {
                self.maps.clear();
                return false;
            }
        };
        if resp.events().is_empty() {
            return true;
        }
        let mut broken = Vec::new();
        for (cluster, follower) in self.maps.iter_mut() {
            let result = match follower.apply(resp.events()) {
                Ok(followed) => follower.read_whole(&self.meta, &followed).await,
                Err(e) => Err(e),
            };
            if let Err(e) = result {
                warn!(cluster, error = %e, "cannot follow the tablet map: reading it again");
                broken.push(cluster.clone());
            }
        }
        for cluster in broken {
            self.maps.remove(&cluster);
        }
        true
    }

    /// Reads the instance and carries out every decision due.
    async fn pass(&mut self) -> model::Result<()> {
        let (schemas, _) = self.meta.tables().await?;
        let (servers, _) = self.meta.servers(None).await?;
        for cluster in self.meta.clusters().await? {
            let registered: Vec<ServerRecord> = servers
                .iter()
                .filter(|s| s.cluster == cluster)
                .map(|s| s.record.clone())
                .collect();
            self.cluster(&cluster, &registered, &schemas).await?;
        }
        let table_ids: Vec<String> = schemas
            .iter()
            .map(|s| table_id(&s.schema.name).to_string())
            .collect();
        seeding::pass(
            &self.meta,
            &self.term,
            &self.dialer,
            &table_ids,
            &servers,
            &mut self.seeding,
        )
        .await?;
        Ok(())
    }

    /// The view of one cluster ([`lifecycle::view::cluster_view`]): its registered servers
    /// (ready) and the absent owners of its tablets (not ready), with their presence; an
    /// absent server's clock runs from when this term first saw it absent.
    fn view(
        &mut self,
        cluster: &str,
        registered: &[ServerRecord],
        tablets: TabletMap,
    ) -> ClusterView {
        let known = self.names.update(cluster, registered);
        let now = Instant::now();
        let mut view = lifecycle::view::cluster_view(
            cluster,
            &known,
            tablets,
            &[],
            self.timing.servers.ttl,
            now,
        );
        for (id, presence) in view.presence.iter_mut() {
            let key = (cluster.to_string(), id.clone());
            match presence.absent_since.as_mut() {
                None => {
                    self.absent_since.remove(&key);
                }
                Some(since) => *since = *self.absent_since.entry(key).or_insert(now),
            }
        }
        view
    }

    async fn cluster(
        &mut self,
        cluster: &str,
        registered: &[ServerRecord],
        schemas: &[StoredSchema],
    ) -> model::Result<()> {
        let tablets = match self.maps.get(cluster) {
            Some(follower) => follower.map().clone(),
            None => {
                // Read once, then followed from the watch (`lead`): a pass no longer reads
                // the whole map (5 s for a million tablets, docs/scale.md).
                let snapshot = self.meta.tablet_snapshot(cluster).await?;
                let follower = TabletFollower::new(self.meta.keys().clone(), cluster, snapshot);
                let map = follower.map().clone();
                self.maps.insert(cluster.to_string(), follower);
                map
            }
        };
        let mut view = self.view(cluster, registered, tablets);
        self.seen(cluster, &view);

        // New tables: each placed counting the tablets of those placed before it.
        for stored in schemas {
            let table = table_id(&stored.schema.name);
            if !view.tablets.tablets(table).is_empty() {
                continue;
            }
            let tablets = assign_new_table(&view, table, &stored.schema.tablet_ranges());
            if tablets.is_empty() {
                break; // no ready server: wait for one
            }
            let term = &self.term;
            if !self
                .meta
                .assign_table(term, cluster, table, stored.create_revision, &tablets)
                .await?
            {
                // Deleted, assigned by someone else, or no longer our term: read again.
                return Ok(());
            }
            info!(
                cluster,
                table,
                tablets = tablets.len(),
                "assigned a new table's tablets"
            );
            let all: Vec<Tablet> = view
                .tablets
                .tables()
                .flat_map(|t| view.tablets.tablets(t).iter().cloned())
                .chain(tablets)
                .collect();
            view.tablets = TabletMap::new(all)
                .map_err(|e| model::Error::Internal(format!("placement: {e}")))?;
        }

        // Lost servers: replaced by a new identity, or named by an administrator.
        let now = Instant::now();
        let accepted = self.meta.accepted_losses(cluster).await?;
        let mut lost = lost_servers(&view, now, self.timing.margin);
        lost.extend(accepted_lost(&view, &accepted, now, self.timing.margin));
        lost.sort();
        lost.dedup();
        let marks = mark_lost(&view, &lost);
        if !self
            .write(cluster, &marks, "lost: its data directory is gone")
            .await?
        {
            return Ok(());
        }
        if marks.is_empty() {
            self.split_and_move(cluster, &mut view, schemas).await?;
            let cpu = self
                .reports
                .get(cluster)
                .map(|r| r.cpu.clone())
                .unwrap_or_default();
            self.autoscaler
                .run(&self.meta, &self.term, cluster, &view, &cpu)
                .await?;
        }
        if !marks.is_empty() {
            return Ok(()); // read again
        }
        if self.reseed(cluster, &view, &lost).await? {
            return Ok(());
        }
        if accepted.is_empty() {
            return Ok(());
        }

        // Accepted losses: Lost tablets re-created empty elsewhere, then the key deleted.
        let moves = accept_loss(&view, &accepted);
        if !self
            .write(
                cluster,
                &moves,
                "re-created empty (an administrator accepted the loss)",
            )
            .await?
        {
            return Ok(());
        }
        for store in &accepted {
            let still_owns = view
                .tablets_of(store)
                .any(|t| !moves.iter().any(|(old, _)| old == t));
            let key = (cluster.to_string(), store.clone());
            if view.presence.get(store).is_some_and(Presence::registered) {
                if self.warned.insert(key) {
                    warn!(
                        cluster,
                        store, "an accepted loss names a registered server: nothing is done"
                    );
                }
            } else if still_owns {
                if self.warned.insert(key) {
                    info!(
                        cluster,
                        store, "an accepted loss waits for the server's deadline or a ready server"
                    );
                }
            } else if self
                .meta
                .clear_accepted_loss(&self.term, cluster, store)
                .await?
            {
                info!(cluster, store, "accepted loss carried out");
            }
        }
        Ok(())
    }

    /// With another cluster READY to copy from: the Lost tablets of the `lost` servers (gone
    /// for good) are re-created on live servers at their next epoch, as an accepted loss does,
    /// but re-seeded from that cluster first (`seeds/<cluster>` ranges: the copy and
    /// INITIALIZING, [`seeding`]); the lost servers' log positions are forgotten (what they
    /// logged and had not shipped is gone with their data). True when something was written
    /// (read again).
    async fn reseed(
        &self,
        cluster: &str,
        view: &ClusterView,
        lost: &[ServerId],
    ) -> model::Result<bool> {
        if lost.is_empty() {
            return Ok(false);
        }
        let numbers = self.meta.cluster_numbers().await?;
        let seeds = self.meta.seeds().await?;
        let Some(source) = seeding::ready_source(cluster, None, &numbers, &seeds) else {
            return Ok(false);
        };
        let moves = accept_loss(view, lost);
        if moves.is_empty() {
            return Ok(false);
        }
        let ranges = moves
            .iter()
            .map(|(old, _)| basalt_meta::SeedRange {
                table: old.table.clone(),
                next: basalt_meta::keys::hex(&old.range.start),
                end: old.range.end.as_deref().map(basalt_meta::keys::hex),
            })
            .collect();
        if !self
            .meta
            .add_seed_ranges(&self.term, cluster, &source, ranges)
            .await?
        {
            return Ok(true);
        }
        let why =
            format!("re-created, re-seeded from cluster {source} (their server lost its data)");
        if !self.write(cluster, &moves, &why).await? {
            return Ok(true);
        }
        for store in lost {
            self.meta.forget_shipped(store).await?;
        }
        warn!(
            cluster,
            source,
            tablets = moves.len(),
            lost = ?lost,
            "tablets of servers that lost their data re-created and re-seeded from another cluster; writes those servers had not shipped are lost"
        );
        Ok(true)
    }

    /// Splits tablets that grew too large or too busy, drains the servers above the Cluster's
    /// serveNodes, and evens out the rest: each move runs as its own task (at most
    /// [`BalancePolicy::max_moves_per_cluster`] at once). Nothing moves while a server of the
    /// cluster is not ready or a tablet is lost: decisions on a cluster in trouble would rest
    /// on what cannot be known.
    async fn split_and_move(
        &mut self,
        cluster: &str,
        view: &mut ClusterView,
        schemas: &[StoredSchema],
    ) -> model::Result<()> {
        if !self.cleaned.contains(cluster) {
            moves::abort_leftovers(&self.meta, &self.term, cluster).await?;
            self.cleaned.insert(cluster.to_string());
            return Ok(()); // read again
        }
        if view.servers.values().any(|s| !s.ready)
            || view.tablets.tables().any(|t| {
                view.tablets
                    .tablets(t)
                    .iter()
                    .any(|t| t.state == model::TabletState::Lost)
            })
        {
            return Ok(());
        }
        self.refresh_reports(cluster, view).await;
        let now = Instant::now();
        let in_flight: Vec<MovePlan> = self
            .moving
            .lock()
            .iter()
            .filter(|((c, _), _)| c == cluster)
            .map(|(_, p)| p.clone())
            .collect();

        // Splits: metadata only, on the owner.
        self.backing_off.retain(|_, until| *until > now);
        let split_ctx = SplitContext {
            backing_off: self
                .backing_off
                .keys()
                .filter(|(c, _)| c == cluster)
                .map(|(_, k)| k.clone())
                .collect(),
            in_flight: in_flight.clone(),
        };
        for plan in splits(view, &split_ctx, &self.policy.split) {
            let Some(name) = table_name(schemas, &plan.tablet.table) else {
                continue;
            };
            let Some(owner) = view.servers.get(&plan.tablet.owner) else {
                continue;
            };
            let control = GrpcTabletControl::new(self.dialer.clone(), STATUS_DEADLINE);
            let at = control
                .split_point(owner, &name, &plan.tablet)
                .await
                .ok()
                .flatten();
            match at.and_then(|at| split_tablet(&plan.tablet, &at)) {
                Some((left, right)) => {
                    if self
                        .meta
                        .split_tablet(&self.term, cluster, &plan.tablet, &left, &right)
                        .await?
                    {
                        info!(cluster, tablet = %plan.tablet, at = ?left.range.end, reason = %plan.reason, "split a tablet");
                        crate::metrics::tablet_split(
                            self.cluster_labels(cluster),
                            &plan.reason.to_string(),
                        );
                    }
                    return Ok(()); // read the map again
                }
                None => {
                    info!(cluster, tablet = %plan.tablet, reason = %plan.reason, "no split point: backing off");
                    self.backing_off.insert(
                        (cluster.to_string(), key_of(&plan.tablet)),
                        now + self.policy.split_backoff,
                    );
                }
            }
        }

        let cooldown = self.timing.move_cooldown;
        self.cooling
            .lock()
            .retain(|_, since| now.duration_since(*since) < cooldown);
        let mut ctx = BalanceContext {
            in_flight,
            cooling: self
                .cooling
                .lock()
                .keys()
                .filter(|(c, _)| c == cluster)
                .map(|(_, k)| k.clone())
                .collect(),
            draining: BTreeSet::new(),
        };
        let mut plans = Vec::new();
        if let Some(serve_nodes) = self.meta.serve_nodes(cluster).await? {
            let plan = drain(view, serve_nodes, &ctx, &self.policy.balance);
            if let Some(blocked) = &plan.blocked {
                let key = (cluster.to_string(), format!("drain:{blocked}"));
                if self.warned.insert(key) {
                    warn!(cluster, reason = %blocked, "the drain is blocked");
                }
            }
            crate::metrics::drain_remaining(self.cluster_labels(cluster), plan.remaining_tablets);
            ctx.draining = plan.draining.iter().cloned().collect();
            plans.extend(plan.moves);
        } else {
            crate::metrics::drain_remaining(self.cluster_labels(cluster), 0);
        }
        if plans.is_empty() {
            plans.extend(rebalance(view, &ctx, &self.policy.balance));
        }
        for plan in plans {
            self.start_move(cluster, view, schemas, plan);
        }
        Ok(())
    }

    /// Reads the servers' reports (sizes and loads of their tablets) at most every
    /// [`MasterTiming::report_interval`] and puts them into `view`.
    async fn refresh_reports(&mut self, cluster: &str, view: &mut ClusterView) {
        let due = self
            .reports
            .get(cluster)
            .is_none_or(|r| r.at.elapsed() >= self.timing.report_interval);
        if due {
            let control = crate::tablet_servers::GrpcTabletControl::new(
                self.dialer.clone(),
                crate::tablet_servers::STATUS_DEADLINE,
            );
            let mut loads = BTreeMap::new();
            let mut servers = HashMap::new();
            let mut cpu = BTreeMap::new();
            for server in view.servers.values() {
                // A server reports under its name (pod name, `<cluster>-<ordinal>`): asked by
                // that name, a stale address cannot pass another server's tablets off as its.
                let Some(presence) = view.presence.get(&server.id) else {
                    continue;
                };
                let named = ServerState {
                    id: presence.name.clone(),
                    ..server.clone()
                };
                if let Ok(report) = control.report(&named).await {
                    servers.insert(
                        server.id.clone(),
                        (report.state.stored_bytes, report.state.capacity_bytes),
                    );
                    loads.extend(report.tablets);
                    if let Some(reading) = report.cpu {
                        cpu.insert(server.id.clone(), reading);
                    }
                }
            }
            self.reports.insert(
                cluster.to_string(),
                Reports {
                    at: Instant::now(),
                    loads: Arc::new(loads),
                    servers,
                    cpu,
                },
            );
        }
        if let Some(r) = self.reports.get(cluster) {
            view.loads = r.loads.clone();
            for (id, (stored, capacity)) in &r.servers {
                if let Some(s) = view.servers.get_mut(id) {
                    s.stored_bytes = *stored;
                    s.capacity_bytes = *capacity;
                }
            }
        }
    }

    /// The labels of `cluster`'s series in the master's metrics.
    fn cluster_labels<'a>(&'a self, cluster: &'a str) -> [&'a str; 3] {
        [&self.labels[0], &self.labels[1], cluster]
    }

    /// What the master sees of `cluster`, for its metrics.
    fn seen(&self, cluster: &str, view: &ClusterView) {
        let ready = view.servers.values().filter(|s| s.ready).count();
        let mut tablets = BTreeMap::new();
        for table in view.tablets.tables() {
            for t in view.tablets.tablets(table) {
                let state = match t.state {
                    model::TabletState::Serving => "serving",
                    model::TabletState::Lost => "lost",
                    model::TabletState::Fencing => "fencing",
                };
                *tablets.entry(state).or_insert(0) += 1;
            }
        }
        let [ns, instance] = &self.labels;
        crate::metrics::cluster_seen(
            [ns, instance, cluster],
            ready,
            view.servers.len() - ready,
            &tablets,
        );
    }

    /// Runs `plan` as a task of its own; the tablet cools down once it ends.
    fn start_move(
        &self,
        cluster: &str,
        view: &ClusterView,
        schemas: &[StoredSchema],
        plan: MovePlan,
    ) {
        let key = (cluster.to_string(), key_of(&plan.tablet));
        if self.moving.lock().contains_key(&key) {
            return;
        }
        let (Some(from), Some(to), Some(table_name)) = (
            view.servers.get(&plan.from),
            view.servers.get(&plan.to),
            table_name(schemas, &plan.tablet.table),
        ) else {
            return;
        };
        let m = moves::Move {
            cluster: cluster.to_string(),
            table_name,
            tablet: plan.tablet.clone(),
            to: plan.to.clone(),
            from_address: from.address.clone(),
            to_address: to.address.clone(),
            reason: plan.reason.to_string(),
            rate_limit_bytes_per_sec: self.policy.rate_limit_bytes_per_sec,
        };
        self.moving.lock().insert(key.clone(), plan);
        let (meta, term, control, moving, cooling) = (
            self.meta.clone(),
            self.term.clone(),
            GrpcTabletControl::new(self.dialer.clone(), STATUS_DEADLINE),
            self.moving.clone(),
            self.cooling.clone(),
        );
        tokio::spawn(async move {
            let outcome = moves::run(&meta, &term, &control, &m).await;
            let keys = meta.keys();
            let labels = [keys.namespace(), keys.instance(), m.cluster.as_str()];
            crate::metrics::tablet_move(labels, &m.reason, &outcome);
            moving.lock().remove(&key);
            cooling.lock().insert(key, Instant::now());
        });
    }

    /// Writes tablet changes; false (stop, read again) at the first that etcd refused.
    async fn write(
        &self,
        cluster: &str,
        changes: &[(Tablet, Tablet)],
        why: &str,
    ) -> model::Result<bool> {
        for (old, new) in changes {
            if !self
                .meta
                .change_tablet(&self.term, cluster, old, new)
                .await?
            {
                return Ok(false);
            }
            info!(cluster, from = %old, to = %new, why, "tablet changed");
        }
        Ok(true)
    }
}

/// The resource name of table `id` (the last segment of its name).
fn table_name(schemas: &[StoredSchema], id: &str) -> Option<String> {
    schemas
        .iter()
        .find(|s| table_id(&s.schema.name) == id)
        .map(|s| s.schema.name.clone())
}
