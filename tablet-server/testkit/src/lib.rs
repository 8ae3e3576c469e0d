//! An in-process test cluster: a real etcd (Debian's `/usr/bin/etcd`, a child process on free
//! ports) and N real tablet servers (RocksDB on temporary directories) registered in one
//! cluster — or in several clusters of one instance, which replicate to each other — all in
//! the test's process, with a transport filter between them that drops, delays or partitions
//! their calls to each other (TiKV's `test_raftstore` is the model).
//!
//! ```no_run
//! # async fn f() {
//! use basalt_testkit::{MASTER, TestCluster};
//! let mut cluster = TestCluster::start(3).await;
//! cluster.partition(0, 1); // servers 0 and 1 no longer reach each other
//! let dialer = cluster.dialer(MASTER); // what the master's calls go through
//! cluster.heal();
//! cluster.restart(2).await; // same data directory, same address
//! # }
//! ```
//!
//! * [`TestCluster::start_clusters`] starts several clusters of the instance on the one etcd
//!   (`[("a", 2), ("b", 2)]`: servers `a-0`, `a-1`, `b-0`, `b-1`, numbered in that order
//!   across the clusters). Every cluster is declared a replica in etcd (its cluster number,
//!   `Meta::cluster_number`) before any server starts, as the operator's `declare_replicas`
//!   does, so every server logs its writes for the others from its first one;
//!   [`TestCluster::configure`] and [`TestCluster::start_all`] leave the declaration to the
//!   test (the operator's own function). [`TestCluster::partition_clusters`],
//!   [`TestCluster::delay_into`] and [`TestCluster::set_between`] set rules for every server of
//!   one cluster towards every server of another.
//! * Each server runs on a tokio runtime (and a thread) of its own, as a process would: stopping
//!   it ([`TestCluster::stop`], graceful; [`TestCluster::kill`], its tasks dropped at once)
//!   ends every task it started and closes its store, so it can start again on the same data
//!   directory ([`TestCluster::start_server`], [`TestCluster::restart`]).
//! * Every server's peer connections go through a `basalt_transport::Dialer` with a
//!   [`Filter`] naming the server (`Config::filter`); [`TestCluster::dialer`] gives the test
//!   (or an in-process master) a dialer under the same rules by another name ([`MASTER`]).
//!   A rule is one-way, from a dialling name to a server; [`TestCluster::partition`] and its
//!   siblings set both ways. etcd is never filtered.
//! * The kit runs no master: tests that need tablets assigned or moved run the operator's
//!   (`basalt_operator::master::run_with` against [`TestCluster::etcd_urls`], or
//!   `master::moves::run` with a term of their own).
//! * Dropping the cluster stops the servers (abruptly) and etcd, and deletes every directory.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use basalt_meta::{EtcdEndpoints, Keys, LeaseTiming, Meta};
use basalt_tablet_server::cluster::ClusterConfig;
use basalt_tablet_server::control_api::Identity;
use basalt_tablet_server::server::{Config, StoreSlot};
use basalt_transport::{Dialer, Filter, Security, Verdict};
use tokio::sync::oneshot;
use tokio::time::Instant;

/// The project, namespace and instance of every test cluster (the etcd prefix
/// `/basalt/v1/ns/inst/`).
pub const PROJECT: &str = "p";
pub const NAMESPACE: &str = "ns";
pub const INSTANCE: &str = "inst";
/// The cluster's name in [`TestCluster::start`]; server `i` is `c1-<i>`.
pub const CLUSTER: &str = "c1";
/// The name under which [`TestCluster::dialer`] dials for a master (or the test itself).
pub const MASTER: &str = "master";

/// `projects/p/instances/inst`: the instance's resource name.
pub fn instance_name() -> String {
    format!("projects/{PROJECT}/instances/{INSTANCE}")
}

/// The servers' lease timing: short, so a stopped server's lease ends within seconds.
pub const LEASE: LeaseTiming = LeaseTiming {
    ttl: Duration::from_secs(3),
    grace: Duration::from_secs(1),
};

/// How long a server may take to start (open its store, register, read the map).
const START_TIMEOUT: Duration = Duration::from_secs(30);

pub use basalt_test_etcd::eventually;
use basalt_test_etcd::{Etcd, free_port};

/// The filter rules of a cluster: a verdict per (dialling name, server address); Pass
/// otherwise.
#[derive(Debug, Default)]
struct Rules {
    verdicts: parking_lot::Mutex<HashMap<(String, String), Verdict>>,
}

/// The filter of one dialling side (a server or [`MASTER`]).
#[derive(Debug)]
struct Side {
    name: String,
    rules: Arc<Rules>,
}

impl Filter for Side {
    fn verdict(&self, address: &str) -> Verdict {
        self.rules
            .verdicts
            .lock()
            .get(&(self.name.clone(), address.to_string()))
            .copied()
            .unwrap_or(Verdict::Pass)
    }
}

/// The endpoints of the cluster's etcd, as basalt-meta connects to them.
fn endpoints(etcd: &Etcd) -> EtcdEndpoints {
    EtcdEndpoints::plaintext(&[etcd.url()]).expect("an etcd URL")
}

/// How a running server is told to end.
enum End {
    /// Graceful: drain, flush, unregister.
    Stop,
    /// Its tasks are dropped where they are (a crash, as far as etcd and the peers can tell;
    /// what RocksDB acknowledged is in its WAL).
    Kill,
}

/// A running server: its thread runs its runtime until told to end.
struct Running {
    /// The server's store while it runs.
    store: StoreSlot,
    end: oneshot::Sender<End>,
    done: oneshot::Receiver<Result<(), String>>,
    thread: std::thread::JoinHandle<()>,
}

/// One server of the cluster: its name, ports and data directory outlive its runs.
struct Slot {
    /// The cluster it belongs to.
    cluster: String,
    name: String,
    address: String,
    http_address: String,
    dir: PathBuf,
    store_id: Option<String>,
    running: Option<Running>,
}

/// etcd and N tablet servers in one process (see the crate's documentation).
pub struct TestCluster {
    // Servers first: they end before etcd and their directories go.
    slots: Vec<Slot>,
    rules: Arc<Rules>,
    /// The servers' `--tombstone-grace-secs` (an hour unless a test sets it).
    tombstone_grace: Duration,
    meta: Meta,
    etcd: Etcd,
    dir: tempfile::TempDir,
}

impl TestCluster {
    /// Starts etcd and `n` servers (`c1-0` … `c1-<n-1>`) of one cluster, and waits until each
    /// is registered and ready.
    pub async fn start(n: usize) -> TestCluster {
        let mut cluster = TestCluster::configure(&[(CLUSTER, n)]).await;
        cluster.start_all().await;
        cluster
    }

    /// Starts etcd and the servers of several clusters of the instance (`(name, servers)`
    /// each; server `k` of cluster `c` is `c-<k>`, and the servers are numbered `0..` across
    /// the clusters in the order given). Every cluster is declared a replica in etcd (gets its
    /// cluster number) before any server starts, as the operator does; then every server
    /// starts and is waited for.
    pub async fn start_clusters(clusters: &[(&str, usize)]) -> TestCluster {
        let mut cluster = TestCluster::configure(clusters).await;
        for (name, _) in clusters {
            cluster
                .meta
                .cluster_number(name)
                .await
                .unwrap_or_else(|e| panic!("cluster {name} declared a replica: {e}"));
        }
        cluster.start_all().await;
        cluster
    }

    /// Starts etcd and lays out the servers of `clusters` (as [`TestCluster::start_clusters`])
    /// without starting any: the test declares the replicas (or not), then
    /// [`TestCluster::start_all`].
    pub async fn configure(clusters: &[(&str, usize)]) -> TestCluster {
        let etcd = Etcd::start().await;
        let meta = Meta::connect(&endpoints(&etcd), Keys::new(NAMESPACE, INSTANCE))
            .await
            .expect("etcd answers");
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut slots = Vec::new();
        for (cluster, n) in clusters {
            for k in 0..*n {
                // The single cluster's directories keep their names (`server-<i>`).
                let dir_name = if clusters.len() == 1 {
                    format!("server-{k}")
                } else {
                    format!("{cluster}-{k}")
                };
                slots.push(Slot {
                    cluster: cluster.to_string(),
                    name: format!("{cluster}-{k}"),
                    address: format!("127.0.0.1:{}", free_port()),
                    http_address: format!("127.0.0.1:{}", free_port()),
                    dir: dir.path().join(dir_name),
                    store_id: None,
                    running: None,
                });
            }
        }
        TestCluster {
            slots,
            rules: Arc::default(),
            tombstone_grace: Duration::from_secs(3600),
            meta,
            etcd,
            dir,
        }
    }

    /// Starts every server that does not run, one after the other, each waited for.
    pub async fn start_all(&mut self) {
        for i in 0..self.slots.len() {
            if self.slots[i].running.is_none() {
                self.start_server(i).await;
            }
        }
    }

    /// How many servers the cluster has (running or not).
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// etcd's client URLs (for a master: `MasterConfig::etcd_endpoints`).
    pub fn etcd_urls(&self) -> Vec<String> {
        vec![self.etcd.url()]
    }

    /// A client of the instance's records in etcd (unfiltered).
    pub fn meta(&self) -> &Meta {
        &self.meta
    }

    /// Server `i`'s name (`<cluster>-<k>`): the dialling name of its connections.
    pub fn name(&self, i: usize) -> &str {
        &self.slots[i].name
    }

    /// The cluster of server `i`.
    pub fn cluster_of(&self, i: usize) -> &str {
        &self.slots[i].cluster
    }

    /// The clusters' names, in the order they were given.
    pub fn clusters(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for slot in &self.slots {
            if !out.contains(&slot.cluster) {
                out.push(slot.cluster.clone());
            }
        }
        out
    }

    /// The servers of `cluster` (their numbers, in order).
    pub fn servers_of(&self, cluster: &str) -> Vec<usize> {
        (0..self.slots.len())
            .filter(|i| self.slots[*i].cluster == cluster)
            .collect()
    }

    /// Server `i`'s gRPC address (`host:port`): its data, admin, control and move APIs.
    pub fn address(&self, i: usize) -> &str {
        &self.slots[i].address
    }

    /// Server `i`'s HTTP address (`/readyz`, `/metrics`).
    pub fn http_address(&self, i: usize) -> &str {
        &self.slots[i].http_address
    }

    /// Server `i`'s store id (its id in the tablet map), known once it started.
    pub fn store_id(&self, i: usize) -> &str {
        self.slots[i]
            .store_id
            .as_deref()
            .expect("the server started once")
    }

    /// The server whose store id is `store_id`.
    pub fn index_of(&self, store_id: &str) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| s.store_id.as_deref() == Some(store_id))
    }

    /// Server `i`'s data directory.
    pub fn data_dir(&self, i: usize) -> &Path {
        &self.slots[i].dir
    }

    /// A dialer whose connections follow the rules of dialling name `name` ([`MASTER`], or a
    /// name of the test's own). Channels belong to the runtime they were made in: use it in
    /// the test's runtime.
    pub fn dialer(&self, name: &str) -> Dialer {
        Dialer::with_filter(Security::Plaintext, self.side(name))
    }

    fn side(&self, name: &str) -> Arc<dyn Filter> {
        Arc::new(Side {
            name: name.to_string(),
            rules: self.rules.clone(),
        })
    }

    /// Sets the verdict of every connection from dialling name `from` to server `to` (one
    /// way; [`Verdict::Pass`] removes the rule).
    pub fn set(&self, from: &str, to: usize, verdict: Verdict) {
        let key = (from.to_string(), self.slots[to].address.clone());
        let mut verdicts = self.rules.verdicts.lock();
        match verdict {
            Verdict::Pass => verdicts.remove(&key),
            v => verdicts.insert(key, v),
        };
    }

    fn both_ways(&self, a: usize, b: usize, verdict: Verdict) {
        self.set(&self.slots[a].name.clone(), b, verdict);
        self.set(&self.slots[b].name.clone(), a, verdict);
    }

    /// Servers `a` and `b` no longer reach each other: connecting hangs (until the connect
    /// timeout), established connections hang (until HTTP/2 keep-alive ends them).
    pub fn partition(&self, a: usize, b: usize) {
        self.both_ways(a, b, Verdict::BlackHole);
    }

    /// Calls between `a` and `b` fail at once (UNAVAILABLE); established connections are
    /// reset.
    pub fn drop_calls(&self, a: usize, b: usize) {
        self.both_ways(a, b, Verdict::Drop);
    }

    /// Connections between `a` and `b` are made after `d`, and every write on them waits `d`.
    pub fn delay(&self, a: usize, b: usize, d: Duration) {
        self.both_ways(a, b, Verdict::Delay(d));
    }

    /// Server `i` no longer reaches, and is no longer reached by, any other server nor
    /// [`MASTER`] (etcd still is).
    pub fn isolate(&self, i: usize) {
        for j in (0..self.slots.len()).filter(|j| *j != i) {
            self.partition(i, j);
        }
        self.set(MASTER, i, Verdict::BlackHole);
    }

    /// Sets the verdict of every connection from every server of cluster `from` to every
    /// server of cluster `to` (one way; [`Verdict::Pass`] removes the rules).
    pub fn set_between(&self, from: &str, to: &str, verdict: Verdict) {
        for i in self.servers_of(from) {
            for j in self.servers_of(to) {
                self.set(&self.slots[i].name.clone(), j, verdict);
            }
        }
    }

    /// No server of cluster `a` reaches any server of cluster `b`, nor the other way round
    /// (the calls within each cluster, and etcd, pass).
    pub fn partition_clusters(&self, a: &str, b: &str) {
        self.set_between(a, b, Verdict::BlackHole);
        self.set_between(b, a, Verdict::BlackHole);
    }

    /// Every call into cluster `to` from a server of another cluster waits `d` (connecting,
    /// and every write on a connection); the calls within `to` pass.
    pub fn delay_into(&self, to: &str, d: Duration) {
        for from in self.clusters().iter().filter(|c| *c != to) {
            self.set_between(from, to, Verdict::Delay(d));
        }
    }

    /// The rules between clusters `a` and `b` (both ways) removed; others stay.
    pub fn heal_clusters(&self, a: &str, b: &str) {
        self.set_between(a, b, Verdict::Pass);
        self.set_between(b, a, Verdict::Pass);
    }

    /// Every rule removed: everything passes again.
    pub fn heal(&self) {
        self.rules.verdicts.lock().clear();
    }

    /// How long the servers started from now on keep tombstones at least (an hour by
    /// default); with replication they also wait for the safe point.
    pub fn set_tombstone_grace(&mut self, grace: Duration) {
        self.tombstone_grace = grace;
    }

    /// Flushes server `i`'s store and compacts it whole (its compaction filter runs over every
    /// entry, collecting what it may). Panics if the server does not run.
    pub async fn compact(&self, i: usize) {
        let store = self.running_store(i);
        tokio::task::spawn_blocking(move || {
            store.flush().expect("the store flushes");
            store.compact_all();
        })
        .await
        .expect("the compaction ran");
    }

    /// The replication safe point server `i`'s store holds now (see
    /// `basalt_storage::safe_point`): None without replication, `Some(0)` until known.
    pub fn tombstone_safe_point(&self, i: usize) -> Option<u64> {
        self.running_store(i).tombstone_safe_point()
    }

    fn running_store(&self, i: usize) -> Arc<basalt_storage::Store> {
        self.slots[i]
            .running
            .as_ref()
            .and_then(|r| r.store.get())
            .unwrap_or_else(|| panic!("server {} does not run", self.slots[i].name))
    }

    fn config(&self, i: usize, store: StoreSlot) -> Config {
        let slot = &self.slots[i];
        let parse = |a: &str| a.parse::<SocketAddr>().expect("a socket address");
        Config {
            backup: None,
            data_dir: slot.dir.clone(),
            listen: parse(&slot.address),
            http_listen: parse(&slot.http_address),
            cluster_id: slot.cluster.clone(),
            tombstone_grace: self.tombstone_grace,
            block_cache_bytes: 8 << 20,
            shutdown_timeout: Duration::from_secs(5),
            cpu_allocation_millicores: None,
            identity: Identity {
                server_id: Some(slot.name.clone()),
                advertise_address: Some(slot.address.clone()),
                instance: Some(INSTANCE.into()),
            },
            cluster: Some(ClusterConfig {
                cluster: slot.cluster.clone(),
                etcd: self.etcd_urls(),
                etcd_security: Security::Plaintext,
                namespace: NAMESPACE.into(),
                instance: INSTANCE.into(),
                project: PROJECT.into(),
                timing: LEASE,
                change_log_retention: Duration::from_secs(7 * 24 * 3600),
                priority: Default::default(),
            }),
            security: Security::Plaintext,
            filter: Some(self.side(&slot.name)),
            store_slot: Some(store),
            auth: Default::default(),
        }
    }

    /// Starts server `i` (on its data directory and address) and waits until it is registered
    /// in etcd and ready. Panics if it is running.
    ///
    /// The ports were free when the cluster was laid out, but another connection may have
    /// taken one since (free ports and outgoing connections share the ephemeral range): a
    /// server's first start then takes new ports, up to three times.
    pub async fn start_server(&mut self, i: usize) {
        let mut attempts = 0;
        loop {
            attempts += 1;
            self.spawn(i);
            match self.wait_ready(i).await {
                Ok(()) => return,
                Err(why)
                    if why.contains("Address already in use")
                        && self.slots[i].store_id.is_none()
                        && attempts < 3 =>
                {
                    if let Some(Running { thread, .. }) = self.slots[i].running.take() {
                        let _ = thread.join();
                    }
                    let slot = &mut self.slots[i];
                    slot.address = format!("127.0.0.1:{}", free_port());
                    slot.http_address = format!("127.0.0.1:{}", free_port());
                }
                Err(why) => panic!("server {} ended while starting: {why}", self.slots[i].name),
            }
        }
    }

    /// Starts server `i`'s thread and runtime.
    fn spawn(&mut self, i: usize) {
        assert!(self.slots[i].running.is_none(), "server {i} is running");
        let store = StoreSlot::default();
        let config = self.config(i, store.clone());
        let (end_tx, end_rx) = oneshot::channel::<End>();
        let (done_tx, done_rx) = oneshot::channel();
        let name = self.slots[i].name.clone();
        let thread = std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .thread_name(name)
                    .enable_all()
                    .build()
                    .expect("a runtime");
                let result = runtime.block_on(async move {
                    let (stop_tx, stop_rx) = oneshot::channel::<()>();
                    let server = basalt_tablet_server::server::run(config, async move {
                        let _ = stop_rx.await;
                    });
                    let mut server = std::pin::pin!(server);
                    tokio::select! {
                        result = &mut server => result.map_err(|e| e.to_string()),
                        end = end_rx => match end {
                            Ok(End::Stop) | Err(_) => {
                                let _ = stop_tx.send(());
                                server.await.map_err(|e| e.to_string())
                            }
                            Ok(End::Kill) => Ok(()),
                        },
                    }
                });
                // Every task the server left (its follower, its lease keeper) ends here.
                runtime.shutdown_timeout(Duration::from_secs(5));
                let _ = done_tx.send(result);
            })
            .expect("a thread");
        self.slots[i].running = Some(Running {
            store,
            end: end_tx,
            done: done_rx,
            thread,
        });
    }

    /// Waits until server `i` answers its control API as ready and its registration is in
    /// etcd (then its store id is known); why not if it ended meanwhile.
    async fn wait_ready(&mut self, i: usize) -> Result<(), String> {
        let dialer = Dialer::default();
        let (name, address) = (self.slots[i].name.clone(), self.slots[i].address.clone());
        let cluster = self.slots[i].cluster.clone();
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(Running { done, .. }) = &mut self.slots[i].running
                && let Ok(result) = done.try_recv()
            {
                return Err(format!("{result:?}"));
            }
            let ready = match basalt_control::client(&dialer, &address, Duration::from_secs(2)) {
                Ok(mut c) => c
                    .get_server_status(basalt_control::v1::GetServerStatusRequest {})
                    .await
                    .is_ok_and(|s| s.into_inner().ready),
                Err(_) => false,
            };
            if ready
                && let Ok((servers, _)) = self.meta.servers(Some(&cluster)).await
                && let Some(r) = servers.iter().find(|r| r.record.name == name)
            {
                self.slots[i].store_id = Some(r.record.store_id.clone());
                return Ok(());
            }
            assert!(
                Instant::now() < deadline,
                "server {name} not ready within {START_TIMEOUT:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn end(&mut self, i: usize, how: End) -> Result<(), String> {
        let Running {
            store, end, done, ..
        } = self.slots[i]
            .running
            .take()
            .unwrap_or_else(|| panic!("server {i} is not running"));
        let _ = end.send(how);
        let result = done
            .await
            .unwrap_or_else(|_| Err("its thread panicked".into()));
        // A killed server did not get to let its store go.
        store.clear();
        result
    }

    /// Stops server `i` gracefully (in-flight requests finish, the store is flushed, the
    /// registration deleted) and waits until its runtime ended. Panics if the server failed.
    pub async fn stop(&mut self, i: usize) {
        if let Err(e) = self.end(i, End::Stop).await {
            panic!("server {} failed: {e}", self.slots[i].name);
        }
    }

    /// Ends server `i` at once: its tasks are dropped, its registration stays until its lease
    /// expires, its connections close.
    pub async fn kill(&mut self, i: usize) {
        let _ = self.end(i, End::Kill).await;
    }

    /// Stops server `i` gracefully and starts it again on the same data directory and address.
    pub async fn restart(&mut self, i: usize) {
        self.stop(i).await;
        self.start_server(i).await;
    }

    /// Whether server `i` runs.
    pub fn is_running(&self, i: usize) -> bool {
        self.slots[i].running.is_some()
    }

    /// Where the cluster keeps its directories (etcd's is elsewhere).
    pub fn root(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        // Each server is killed and its thread waited for (its runtime's shutdown is bounded)
        // before the directories go.
        let threads: Vec<_> = self
            .slots
            .iter_mut()
            .filter_map(|slot| slot.running.take())
            .map(
                |Running {
                     store, end, thread, ..
                 }| {
                    let _ = end.send(End::Kill);
                    store.clear();
                    thread
                },
            )
            .collect();
        for thread in threads {
            let _ = thread.join();
        }
    }
}
