//! The running runtime: etcd, then per Instance its endpoint, its master and its clusters'
//! servers, then its tables; `local apply` changes it through [`Runtime::apply`]; a signal
//! stops it in order (endpoints and control server, then servers and masters, then etcd).
//!
//! [`Runtime`] holds what runs (behind one lock that is never held across an await) and
//! rewrites `local.json` whenever any of it changes.
//!
//! A cluster's size goes through the lifecycle, as on Kubernetes
//! ([`crate::lifecycle::scale::resize`]): its count is recorded in etcd
//! (`clusters/<c>/serve-nodes`) before its servers start or change (the master drains the
//! servers at or above it), then the servers the lifecycle decides run through
//! [`LocalNodes`] (`nodes`). A scale-in ([`super::scale_in`]) keeps the leaving servers
//! running; the instance's follower task (every second) reads the tablet map, keeps the
//! progress current and resizes again: the leaving servers stop once etcd says they own
//! nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

mod nodes;

pub use nodes::LocalNodes;

use super::endpoint::{self, Backends};
use super::etcd;
use super::manifests::{self, LocalCluster, LocalInstance, ManifestError, Manifests};
use super::plan::{self, Change};
use super::process::{self, ProcessSpec, ProcessState};
use super::scale_in::{self, Observation};
use super::servers::{self, ServerSpec};
use super::state::{
    self, ClusterState, InstanceState, LocalState, PortBook, ScaleInState, ServerState,
};
use crate::admin::GrpcTableAdmin;
use crate::crd::{AppProfileSpec, Instance, Table};
use crate::lifecycle;
use crate::lifecycle::scale::ResizeError;
use crate::lifecycle::tables;
use crate::lifecycle::view::{Placement, ServerBook};
use crate::master::MasterConfig;

/// The first instance's endpoint unless `--endpoint` says otherwise: the port
/// `BIGTABLE_EMULATOR_HOST` usually names.
pub const DEFAULT_ENDPOINT: &str = "127.0.0.1:8086";
/// How long `local apply` waits for its tables before it leaves them to a background retry.
pub const APPLY_TABLE_WAIT: Duration = Duration::from_secs(60);
/// How long a stopping master gets.
pub const MASTER_STOP: Duration = Duration::from_secs(10);
/// Deadline of each table admin call.
pub const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);
/// Deadline of a write of a cluster's count to etcd.
pub const ETCD_TIMEOUT: Duration = Duration::from_secs(10);

/// `basalt-operator local`'s options.
#[derive(Debug, Clone)]
pub struct Options {
    pub files: Vec<PathBuf>,
    pub data_dir: PathBuf,
    /// The first instance's endpoint (default [`DEFAULT_ENDPOINT`]).
    pub endpoint: Option<SocketAddr>,
}

/// Runs the manifests until SIGINT or SIGTERM.
pub async fn run(options: Options) -> anyhow::Result<()> {
    // Registered before anything starts, so a signal during the start is not lost.
    let mut interrupt = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;

    std::fs::create_dir_all(&options.data_dir)
        .with_context(|| format!("cannot create {}", options.data_dir.display()))?;
    let data_dir = std::fs::canonicalize(&options.data_dir)?;
    let previous = state::read(&data_dir).ok();
    if let Some(previous) = &previous {
        let left = state::leftovers(&data_dir, previous);
        if !left.is_empty() {
            bail!(
                "{} still run(s) on {} from a previous start: stop them first (Ctrl-C the runtime, or kill the pids) — two processes must never share a data directory",
                left.join(", "),
                data_dir.display()
            );
        }
    }

    let manifests = manifests::load(&options.files)?;
    let desired = manifests::desired(&manifests, &BTreeMap::new())?;
    if desired.is_empty() {
        bail!("the manifests declare no Instance: nothing to run");
    }

    // Every port is settled before anything starts: a conflict fails the start cleanly.
    let mut ports = PortBook::load(&data_dir)?;
    let first_endpoint = match options.endpoint {
        Some(addr) => addr,
        None => DEFAULT_ENDPOINT.parse()?,
    };
    let mut listeners = BTreeMap::new();
    for (i, instance) in desired.iter().enumerate() {
        let addr = if i == 0 {
            first_endpoint
        } else {
            endpoint_addr(&mut ports, instance)?
        };
        listeners.insert(instance.name.clone(), bind_endpoint(addr, instance).await?);
    }
    let (client_port, peer_port) = etcd_ports(&mut ports)?;
    // Per cluster: the servers a previous run left at or above the count (a scale-in to finish)
    // and the count it began from.
    let mut resumed = BTreeMap::new();
    for instance in &desired {
        for cluster in &instance.clusters {
            let before = previous
                .as_ref()
                .and_then(|p| p.instances.get(&instance.name))
                .filter(|i| i.namespace == instance.namespace)
                .and_then(|i| i.clusters.get(&cluster.name));
            let (extra, from) =
                scale_in::resume(&cluster.name, cluster.serve_nodes.max(0) as u32, before);
            for ordinal in (0..cluster.serve_nodes.max(0) as u32).chain(extra.iter().copied()) {
                let key = format!(
                    "{}/{}",
                    instance.namespace,
                    servers::server_name(&cluster.name, ordinal)
                );
                if let Some(p) = ports.servers.get(&key) {
                    for port in [p.grpc, p.http] {
                        if state::port_in_use(port) {
                            bail!(
                                "port 127.0.0.1:{port} of server {key} (remembered in {}) is in use: stop what uses it, then start again",
                                data_dir.join(state::PORTS_JSON).display()
                            );
                        }
                    }
                }
            }
            resumed.insert(cluster.name.clone(), (extra, from));
        }
    }
    ports.save(&data_dir)?;

    let tablet_server_bin = servers::tablet_server_bin();
    let tablet_server_bin = state::find_program(&tablet_server_bin).with_context(|| {
        format!(
            "no tablet server binary {}: build it (cargo build --release -p basalt-tablet-server), put it next to basalt-operator, or set {}",
            tablet_server_bin.display(),
            servers::TABLET_SERVER_BIN_ENV
        )
    })?;
    if state::find_program(&etcd::etcd_bin()).is_none() {
        bail!(
            "no etcd binary {}: install Debian's etcd-server (apt-get install etcd-server), or set {}",
            etcd::etcd_bin().display(),
            etcd::ETCD_BIN_ENV
        );
    }
    let control_listener = TcpListener::bind("127.0.0.1:0").await?;
    let control = control_listener.local_addr()?;

    // etcd first; everything else needs it.
    let etcd_state = Arc::new(ProcessState::default());
    let (stop_etcd, etcd_stop_rx) = watch::channel(false);
    let etcd_spec = etcd::process_spec(&data_dir, client_port, peer_port);
    let etcd_log = etcd_spec.log.clone();
    let (stop_servers, _) = watch::channel(false);
    let runtime = Arc::new(Runtime {
        data_dir: data_dir.clone(),
        etcd_url: etcd::client_url(client_port),
        etcd: etcd_state.clone(),
        control,
        first_endpoint,
        tablet_server_bin,
        admin: Arc::new(GrpcTableAdmin::new(ADMIN_TIMEOUT)),
        stop_servers,
        inner: Mutex::new(Inner {
            manifests: Manifests::default(),
            desired: vec![],
            ports,
            instances: BTreeMap::new(),
            stopped: false,
        }),
        apply_lock: tokio::sync::Mutex::new(()),
        write_lock: Mutex::new(()),
        supervised: Mutex::new(vec![]),
        masters: Mutex::new(vec![]),
        listeners: Mutex::new(vec![]),
    });
    let etcd_task = {
        let rt = runtime.clone();
        tokio::spawn(process::supervise(
            etcd_spec,
            etcd_state.clone(),
            etcd_stop_rx,
            Arc::new(move || rt.write_state()),
        ))
    };
    tracing::info!(url = %runtime.etcd_url, "waiting for etcd");
    let deadline = tokio::time::Instant::now() + etcd::START_TIMEOUT;
    while !etcd_state.ready() {
        if tokio::time::Instant::now() > deadline || etcd_state.restarts() > 0 {
            let _ = stop_etcd.send(true);
            let _ = etcd_task.await;
            bail!(
                "etcd ({}) did not become healthy at {}/health within {:?}; its log {} ends with:\n{}",
                etcd::etcd_bin().display(),
                runtime.etcd_url,
                etcd::START_TIMEOUT,
                etcd_log.display(),
                tail(&etcd_log, 20)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tracing::info!(url = %runtime.etcd_url, "etcd is healthy");

    let started = async {
        runtime.set_manifests(manifests, desired.clone());
        for instance in &desired {
            let listener = listeners.remove(&instance.name).expect("bound above");
            runtime.start_instance(instance, listener)?;
            for cluster in &instance.clusters {
                let (extra, from) = resumed.remove(&cluster.name).unwrap_or_default();
                if !extra.is_empty() {
                    let names: Vec<String> = extra
                        .iter()
                        .map(|o| servers::server_name(&cluster.name, *o))
                        .collect();
                    tracing::info!(cluster = %cluster.name, servers = %names.join(", "), to = cluster.serve_nodes,
                        "the previous run left servers above the count: they run again and drain (scale-in)");
                }
                runtime
                    .start_cluster(&instance.name, cluster, &extra, from)
                    .await?;
            }
        }
        runtime.write_state();
        for instance in &desired {
            if let Err(why) = runtime
                .record_app_profiles(&instance.name, &instance.app_profiles)
                .await
            {
                tracing::warn!(instance = %instance.name, "app profiles not in the catalog: {why}");
            }
            runtime.sync_tables_in_background(&instance.name, instance.tables.clone());
        }
        let control_task = tokio::spawn(super::control::serve(control_listener, runtime.clone()));
        runtime
            .listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(control_task);
        anyhow::Ok(())
    };
    if let Err(error) = started.await {
        runtime.stop(stop_etcd, etcd_task).await;
        return Err(error);
    }
    runtime.write_state();
    println!("{}", runtime.summary());

    tokio::select! {
        _ = interrupt.recv() => tracing::info!("interrupted: stopping"),
        _ = terminate.recv() => tracing::info!("terminated: stopping"),
    }
    runtime.stop(stop_etcd, etcd_task).await;
    println!("stopped; the data stays in {}", data_dir.display());
    Ok(())
}

/// The last `lines` lines of a log file.
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn etcd_ports(ports: &mut PortBook) -> anyhow::Result<(u16, u16)> {
    let client = match ports.etcd_client {
        Some(p) => p,
        None => {
            let p = ports.free_port(&BTreeSet::new())?;
            ports.etcd_client = Some(p);
            p
        }
    };
    let peer = match ports.etcd_peer {
        Some(p) => p,
        None => {
            let p = ports.free_port(&BTreeSet::new())?;
            ports.etcd_peer = Some(p);
            p
        }
    };
    for (what, port) in [("client", client), ("peer", peer)] {
        if state::port_in_use(port) {
            bail!(
                "etcd's {what} port 127.0.0.1:{port} (remembered in {}) is in use: stop what uses it. \
                 The runtime does not move etcd to new ports by itself: its member's URLs are part of its data.",
                state::PORTS_JSON
            );
        }
    }
    Ok((client, peer))
}

fn endpoint_addr(ports: &mut PortBook, instance: &LocalInstance) -> anyhow::Result<SocketAddr> {
    let key = format!("{}/{}", instance.namespace, instance.name);
    let port = match ports.endpoints.get(&key) {
        Some(p) => *p,
        None => {
            let p = ports.free_port(&BTreeSet::new())?;
            ports.endpoints.insert(key, p);
            p
        }
    };
    Ok(SocketAddr::from(([127, 0, 0, 1], port)))
}

async fn bind_endpoint(addr: SocketAddr, instance: &LocalInstance) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr).await.with_context(|| {
        format!(
            "cannot listen on {addr} for instance {}'s endpoint (is a standalone basalt-tablet-server or another runtime using it? stop it, or pass --endpoint)",
            instance.name
        )
    })
}

/// The running runtime.
pub struct Runtime {
    data_dir: PathBuf,
    etcd_url: String,
    etcd: Arc<ProcessState>,
    control: SocketAddr,
    first_endpoint: SocketAddr,
    tablet_server_bin: PathBuf,
    admin: Arc<GrpcTableAdmin>,
    /// Turns true to stop the servers, the masters and the tables' retries.
    stop_servers: watch::Sender<bool>,
    inner: Mutex<Inner>,
    /// One apply at a time.
    apply_lock: tokio::sync::Mutex<()>,
    /// One writer of local.json at a time.
    write_lock: Mutex<()>,
    /// The servers' supervisors: awaited when stopping.
    supervised: Mutex<Vec<JoinHandle<()>>>,
    masters: Mutex<Vec<JoinHandle<()>>>,
    /// Endpoints and the control server: aborted when stopping.
    listeners: Mutex<Vec<JoinHandle<()>>>,
}

struct Inner {
    /// Everything applied so far, merged.
    manifests: Manifests,
    desired: Vec<LocalInstance>,
    ports: PortBook,
    instances: BTreeMap<String, RunningInstance>,
    stopped: bool,
}

struct RunningInstance {
    instance: Instance,
    namespace: String,
    resource_name: String,
    endpoint: SocketAddr,
    backends: Arc<Backends>,
    /// The instance's master process.
    master: Arc<ProcessState>,
    /// Tablets owned per server name, from etcd (see `follow_tablets`).
    tablets: Arc<Mutex<BTreeMap<String, u32>>>,
    clusters: BTreeMap<String, RunningCluster>,
    tables: BTreeMap<String, String>,
    app_profiles: BTreeMap<String, AppProfileSpec>,
}

struct RunningCluster {
    /// The count asked for (during a scale-in: the count it shrinks to).
    serve_nodes: i32,
    /// The servers the lifecycle last said to run (ordinals `0..replicas`, [`LocalNodes`]):
    /// during a scale-in, more than `serve_nodes` until the leaving servers are empty.
    replicas: u32,
    /// In ordinal order; during a scale-in also the leaving servers until they stop.
    servers: Vec<RunningServer>,
    scale_in: Option<ScaleIn>,
}

struct RunningServer {
    spec: ServerSpec,
    state: Arc<ProcessState>,
    /// Turns true to stop this server alone (a scale-in); the runtime's stop turns it too.
    stop: watch::Sender<bool>,
    /// Turns true once its supervisor returned (the process is gone).
    exited: watch::Receiver<bool>,
    /// A scale-in stopped it; it leaves the cluster once it exited.
    stopping: bool,
}

/// A scale-in under way (its target is the cluster's `serve_nodes`).
struct ScaleIn {
    from: i32,
    stopped: Vec<String>,
    remaining_tablets: usize,
    blocked: Option<String>,
    /// When it began: no server stops in its first [`lifecycle::scale::SCALE_IN_SETTLE`].
    since: std::time::Instant,
}

impl RunningCluster {
    fn running(&self) -> BTreeSet<u32> {
        self.servers
            .iter()
            .filter(|s| !s.stopping)
            .map(|s| s.spec.ordinal)
            .collect()
    }

    fn stopping(&self) -> BTreeSet<u32> {
        self.servers
            .iter()
            .filter(|s| s.stopping)
            .map(|s| s.spec.ordinal)
            .collect()
    }

    /// The servers at or above the count that still run (stopping ones included).
    fn leaving(&self) -> Vec<String> {
        self.servers
            .iter()
            .filter(|s| s.spec.ordinal as i32 >= self.serve_nodes)
            .map(|s| s.spec.name())
            .collect()
    }

    /// The scale-in as `local.json` and the plan see it.
    fn scale_in_state(&self) -> Option<ScaleInState> {
        self.scale_in.as_ref().map(|s| ScaleInState {
            from: s.from,
            to: self.serve_nodes,
            draining: self.leaving(),
            stopped: s.stopped.clone(),
            remaining_tablets: s.remaining_tablets,
            blocked: s.blocked.clone(),
        })
    }
}

/// What starting a server of an instance needs of it.
struct Site {
    namespace: String,
    project: String,
    backends: Arc<Backends>,
}

impl Site {
    fn of(running: &RunningInstance) -> Site {
        Site {
            namespace: running.namespace.clone(),
            project: crate::build::project_id(&running.instance),
            backends: running.backends.clone(),
        }
    }
}

/// What a count change did to a cluster's servers, by name.
#[derive(Debug, Default)]
struct CountChange {
    /// Started now (new, or again on their data directories).
    started: Vec<String>,
    /// Being stopped when the count was raised over them: they start again once they exited.
    restarting: Vec<String>,
    /// Leaving: they drain, then stop.
    draining: Vec<String>,
    /// Below the count already before, and running.
    kept: Vec<String>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere cannot leave these maps half-updated in a way that matters more than
    // stopping the runtime would.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Runtime {
    /// etcd's client URL, as `basalt-meta` connects to it.
    fn etcd_endpoints(&self) -> basalt_master::model::Result<basalt_meta::EtcdEndpoints> {
        basalt_meta::endpoints(
            std::slice::from_ref(&self.etcd_url),
            &basalt_meta::Security::Plaintext,
        )
    }

    fn set_manifests(&self, manifests: Manifests, desired: Vec<LocalInstance>) {
        let mut inner = lock(&self.inner);
        inner.manifests = manifests;
        inner.desired = desired;
    }

    /// The endpoint and the master of a new instance (its clusters start separately).
    fn start_instance(
        self: &Arc<Self>,
        instance: &LocalInstance,
        listener: TcpListener,
    ) -> anyhow::Result<()> {
        let endpoint = listener.local_addr()?;
        let backends = Arc::new(Backends::default());
        let master = Arc::new(ProcessState::default());
        let tablets = Arc::new(Mutex::new(BTreeMap::new()));
        self.follow_tablets(instance, tablets.clone());
        lock(&self.listeners).push(tokio::spawn(endpoint::serve(listener, backends.clone())));
        lock(&self.inner).instances.insert(
            instance.name.clone(),
            RunningInstance {
                instance: instance.instance.clone(),
                namespace: instance.namespace.clone(),
                resource_name: instance.resource_name(),
                endpoint,
                backends,
                master: master.clone(),
                tablets: tablets.clone(),
                clusters: BTreeMap::new(),
                tables: BTreeMap::new(),
                app_profiles: BTreeMap::new(),
            },
        );
        self.spawn_master(
            MasterConfig {
                etcd_endpoints: vec![self.etcd_url.clone()],
                namespace: instance.namespace.clone(),
                instance: instance.name.clone(),
                identity: "local".into(),
            },
            master,
        );
        tracing::info!(instance = %instance.name, %endpoint, resource = %instance.resource_name(), "instance started");
        Ok(())
    }

    /// Keeps `counts` (tablets per server name over the instance's clusters) in step with etcd,
    /// rewriting local.json when they change; and every second carries the instance's
    /// scale-ins on ([`Runtime::watch_scale_ins`]). When etcd cannot be read, nothing changes.
    fn follow_tablets(
        self: &Arc<Self>,
        instance: &LocalInstance,
        counts: Arc<Mutex<BTreeMap<String, u32>>>,
    ) {
        let keys = basalt_meta::Keys::new(&instance.namespace, &instance.name);
        let etcd = vec![self.etcd_url.clone()];
        let mut stop = self.stop_servers.subscribe();
        let rt = self.clone();
        let name = instance.name.clone();
        tokio::spawn(async move {
            let mut meta = None;
            // Servers learnt from their registrations, by (cluster, store id): how a server
            // whose lease is gone is still named.
            let mut known = ServerBook::default();
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = stop.wait_for(|v| *v) => return,
                }
                if meta.is_none()
                    && let Ok(etcd) =
                        basalt_meta::endpoints(&etcd, &basalt_meta::Security::Plaintext)
                {
                    meta = basalt_meta::Meta::connect(&etcd, keys.clone()).await.ok();
                }
                let Some(m) = &meta else { continue };
                let Ok(now) = tablet_counts(m).await else {
                    continue;
                };
                let changed = {
                    let mut c = lock(&counts);
                    let changed = *c != now;
                    *c = now;
                    changed
                };
                let scale_ins = rt.watch_scale_ins(&name, m, &mut known).await;
                if changed || scale_ins {
                    rt.write_state();
                }
            }
        });
    }

    /// One look at every scale-in of `instance`: reads etcd (registrations, move records, the
    /// tablet map), updates the progress, and runs the servers the lifecycle decides on it
    /// ([`Runtime::resize`]: the leaving servers stop once they own nothing). A cluster whose
    /// etcd reads fail is left as it is. True if anything changed.
    async fn watch_scale_ins(
        self: &Arc<Self>,
        instance: &str,
        meta: &basalt_meta::Meta,
        known: &mut ServerBook,
    ) -> bool {
        let clusters: Vec<(String, i32)> = {
            let inner = lock(&self.inner);
            let Some(running) = inner.instances.get(instance) else {
                return false;
            };
            running
                .clusters
                .iter()
                .filter(|(_, c)| c.scale_in.is_some())
                .map(|(name, c)| (name.clone(), c.serve_nodes))
                .collect()
        };
        let mut changed = false;
        for (cluster, count) in clusters {
            let observed = match lifecycle::view::observe(meta, &cluster, known).await {
                Ok(observed) => observed,
                Err(error) => {
                    tracing::warn!(%cluster, %error, "cannot read the tablet map in etcd: no leaving server stops until it can be read");
                    continue;
                }
            };
            let observation = scale_in::observe(
                &cluster,
                count.max(0) as u32,
                &observed.servers,
                &observed.tablets,
                &observed.moves,
            );
            changed |= self.progress(instance, &cluster, count, observation);
            let placement = Placement::from(observed);
            if let Err(error) = self
                .resize(instance, &cluster, count, meta, Some(&placement))
                .await
            {
                tracing::warn!(%cluster, %error, "the scale-in waits");
            }
        }
        changed
    }

    /// Applies an observation of the drain of `cluster` to `count` servers, if the count is
    /// still the same: the progress, and the end of the scale-in once no leaving server is left.
    fn progress(
        self: &Arc<Self>,
        instance: &str,
        cluster: &str,
        count: i32,
        observation: Observation,
    ) -> bool {
        let mut inner = lock(&self.inner);
        let Some(running) = inner.instances.get_mut(instance) else {
            return false;
        };
        let Some(c) = running.clusters.get_mut(cluster) else {
            return false;
        };
        if c.serve_nodes != count {
            return false; // the count changed since the reads began
        }
        let before = c.scale_in_state();
        let Some(s) = c.scale_in.as_mut() else {
            return false;
        };
        if s.blocked != observation.blocked {
            match &observation.blocked {
                Some(why) => {
                    tracing::warn!(%cluster, to = count, "the scale-in is blocked: {why}")
                }
                None if s.blocked.is_some() => {
                    tracing::info!(%cluster, to = count, "the scale-in goes on")
                }
                None => {}
            }
        }
        s.remaining_tablets = observation.remaining_tablets;
        s.blocked = observation.blocked;
        if c.leaving().is_empty() && c.scale_in.take().is_some() {
            tracing::info!(%cluster, to = count, "scale-in done");
        }
        c.scale_in_state() != before
    }

    /// The lifecycle's step for `cluster`'s size ([`lifecycle::scale::resize`], as on
    /// Kubernetes): `requested` recorded in etcd for the master when it holds another count,
    /// then the servers [`lifecycle::scale::size`] decides run ([`LocalNodes`]). `placement`:
    /// what etcd says of the cluster now (None: not read, so nothing stops).
    async fn resize(
        self: &Arc<Self>,
        instance: &str,
        cluster: &str,
        requested: i32,
        meta: &basalt_meta::Meta,
        placement: Option<&Placement>,
    ) -> anyhow::Result<()> {
        let (current, settled) = {
            let inner = lock(&self.inner);
            let c = inner
                .instances
                .get(instance)
                .and_then(|i| i.clusters.get(cluster))
                .with_context(|| format!("cluster {cluster} is not running"))?;
            let settled = c
                .scale_in
                .as_ref()
                .is_some_and(|s| s.since.elapsed() >= lifecycle::scale::SCALE_IN_SETTLE);
            (c.replicas as i32, settled)
        };
        let recorded = match placement {
            Some(p) => p.serve_nodes,
            None => tokio::time::timeout(ETCD_TIMEOUT, meta.serve_nodes(cluster))
                .await
                .map_err(|_| anyhow::anyhow!("etcd did not answer in {ETCD_TIMEOUT:?}"))?
                .map_err(|e| {
                    anyhow::anyhow!("cannot read serveNodes of cluster {cluster} in etcd: {e}")
                })?,
        };
        let size = lifecycle::scale::size(requested, Some(current), placement, settled);
        let nodes = LocalNodes {
            runtime: self.clone(),
            instance: instance.to_string(),
        };
        lifecycle::scale::resize(
            &nodes,
            Some(meta),
            cluster,
            &size,
            Some(current),
            Some(recorded),
        )
        .await
        .map_err(|e| match e {
            ResizeError::Record(why) => anyhow::anyhow!(why),
            ResizeError::Runtime(e) => anyhow::anyhow!(e),
        })
    }

    /// The progress of a scale-in just asked for, read from etcd at once (nothing stops
    /// here); the tablets left to move, or None if etcd did not answer.
    async fn observe_now(self: &Arc<Self>, instance: &str, cluster: &str) -> Option<usize> {
        let (namespace, count) = {
            let inner = lock(&self.inner);
            let running = inner.instances.get(instance)?;
            (
                running.namespace.clone(),
                running.clusters.get(cluster)?.serve_nodes,
            )
        };
        let keys = basalt_meta::Keys::new(&namespace, instance);
        let read = async {
            let meta = basalt_meta::Meta::connect(&self.etcd_endpoints()?, keys).await?;
            observe_drain(
                &meta,
                cluster,
                count.max(0) as u32,
                &mut ServerBook::default(),
            )
            .await
        };
        let observation = tokio::time::timeout(ETCD_TIMEOUT, read).await.ok()?.ok()?;
        let remaining = observation.remaining_tablets;
        if self.progress(instance, cluster, count, observation) {
            self.write_state();
        }
        Some(remaining)
    }

    /// Runs the instance's master as a process of its own (`basalt-operator master`),
    /// supervised like the servers: restarted when it exits, so a killed master is replaced
    /// and the new one wins the election once the old one's lease is gone.
    fn spawn_master(self: &Arc<Self>, config: MasterConfig, state: Arc<ProcessState>) {
        let program = std::env::current_exe().unwrap_or_else(|_| "basalt-operator".into());
        let process = master_process_spec(&config, &program, &self.data_dir.join("logs"));
        let rt = self.clone();
        lock(&self.masters).push(tokio::spawn(process::supervise(
            process,
            state,
            self.stop_servers.subscribe(),
            Arc::new(move || rt.write_state()),
        )));
    }

    /// A new cluster of a running instance: its servers `0..serveNodes`, and `extra` ones
    /// above (left by a previous run: they drain, a scale-in from `from`). Nothing runs if
    /// its count cannot be recorded in etcd.
    async fn start_cluster(
        self: &Arc<Self>,
        instance: &str,
        cluster: &LocalCluster,
        extra: &[u32],
        from: i32,
    ) -> anyhow::Result<()> {
        {
            let mut inner = lock(&self.inner);
            let running = inner
                .instances
                .get_mut(instance)
                .with_context(|| format!("instance {instance} is not running"))?;
            running.clusters.insert(
                cluster.name.clone(),
                RunningCluster {
                    serve_nodes: 0,
                    replicas: 0,
                    servers: vec![],
                    scale_in: None,
                },
            );
        }
        let started = async {
            if let Some(top) = extra.iter().max() {
                // As a StatefulSet would: every ordinal up to the highest left over runs.
                self.run_servers(instance, &cluster.name, top + 1)?;
            }
            self.set_count(instance, &cluster.name, cluster.serve_nodes, Some(from))
                .await
        };
        if let Err(error) = started.await {
            let stopped = {
                let mut inner = lock(&self.inner);
                inner
                    .instances
                    .get_mut(instance)
                    .and_then(|i| i.clusters.remove(&cluster.name))
            };
            for server in stopped.into_iter().flat_map(|c| c.servers) {
                let _ = server.stop.send(true);
            }
            return Err(error);
        }
        Ok(())
    }

    /// Brings a running cluster to `to` servers: the count recorded in etcd, then the servers
    /// the lifecycle decides run ([`Runtime::resize`]: those below `to` start, none stops yet);
    /// those at or above it drain (a scale-in, from `from` if one begins: else from the count
    /// before), or the scale-in ends when none is left above. Nothing changes if etcd does not
    /// take the count.
    async fn set_count(
        self: &Arc<Self>,
        instance: &str,
        cluster: &str,
        to: i32,
        from: Option<i32>,
    ) -> anyhow::Result<CountChange> {
        let mut change = {
            let inner = lock(&self.inner);
            let c = inner
                .instances
                .get(instance)
                .and_then(|i| i.clusters.get(cluster))
                .with_context(|| format!("cluster {cluster} is not running"))?;
            let plan = scale_in::reconcile(to.max(0) as u32, &c.running(), &c.stopping());
            let mut change = CountChange {
                started: plan
                    .start
                    .iter()
                    .map(|o| servers::server_name(cluster, *o))
                    .collect(),
                ..CountChange::default()
            };
            for s in &c.servers {
                let ordinal = s.spec.ordinal as i32;
                if ordinal >= to {
                    change.draining.push(s.spec.name());
                } else if s.stopping {
                    change.restarting.push(s.spec.name());
                } else if ordinal >= c.serve_nodes {
                    change.kept.push(s.spec.name());
                }
            }
            change
        };
        let meta = self.meta(instance).await?;
        self.resize(instance, cluster, to, &meta, None).await?;

        let mut inner = lock(&self.inner);
        let running = inner
            .instances
            .get_mut(instance)
            .with_context(|| format!("instance {instance} is not running"))?;
        let counts = lock(&running.tablets).clone();
        let c = running
            .clusters
            .get_mut(cluster)
            .with_context(|| format!("cluster {cluster} is not running"))?;
        let old = c.serve_nodes;
        c.serve_nodes = to;
        change.draining = c
            .servers
            .iter()
            .filter(|s| s.spec.ordinal as i32 >= to)
            .map(|s| s.spec.name())
            .collect();
        if change.draining.is_empty() {
            if c.scale_in.take().is_some() {
                tracing::info!(%cluster, to, "scale-in cancelled");
            }
        } else {
            let remaining = change
                .draining
                .iter()
                .map(|n| counts.get(n).copied().unwrap_or(0) as usize)
                .sum();
            match c.scale_in.as_mut() {
                // A raise part way: the rest goes on.
                Some(s) => {
                    s.remaining_tablets = remaining;
                    s.blocked = None;
                }
                None => {
                    c.scale_in = Some(ScaleIn {
                        from: from.unwrap_or(old),
                        stopped: vec![],
                        remaining_tablets: remaining,
                        blocked: None,
                        since: std::time::Instant::now(),
                    });
                }
            }
            tracing::info!(%cluster, to, draining = %change.draining.join(", "), "scale-in: the leaving servers drain, then stop");
        }
        Ok(change)
    }

    /// A connection to etcd with `instance`'s keys, within [`ETCD_TIMEOUT`].
    async fn meta(&self, instance: &str) -> anyhow::Result<basalt_meta::Meta> {
        let keys = self.keys(instance).map_err(|e| anyhow::anyhow!(e))?;
        let endpoints = self.etcd_endpoints()?;
        match tokio::time::timeout(ETCD_TIMEOUT, basalt_meta::Meta::connect(&endpoints, keys)).await
        {
            Ok(Ok(meta)) => Ok(meta),
            Ok(Err(e)) => bail!("etcd at {}: {e}", self.etcd_url),
            Err(_) => bail!(
                "etcd at {} did not answer in {ETCD_TIMEOUT:?}",
                self.etcd_url
            ),
        }
    }

    /// The etcd keys of `instance`.
    fn keys(&self, instance: &str) -> Result<basalt_meta::Keys, String> {
        lock(&self.inner)
            .instances
            .get(instance)
            .map(|i| basalt_meta::Keys::new(&i.namespace, instance))
            .ok_or_else(|| format!("instance {instance} is not running"))
    }

    /// Records `profiles` (valid ones: the manifests were validated) in local.json's
    /// `appProfiles` and puts them into the instance's catalog in etcd
    /// ([`lifecycle::records::put_all`], as the Kubernetes controller does); why etcd did not
    /// take them, if it did not.
    async fn record_app_profiles(
        &self,
        instance: &str,
        profiles: &[crate::crd::AppProfile],
    ) -> Result<(), String> {
        {
            let mut inner = lock(&self.inner);
            let Some(running) = inner.instances.get_mut(instance) else {
                return Err(format!("instance {instance} is not running"));
            };
            for p in profiles {
                running
                    .app_profiles
                    .insert(p.app_profile_id(), p.spec.clone());
            }
        }
        if profiles.is_empty() {
            return Ok(());
        }
        let records: Vec<_> = profiles
            .iter()
            .map(crate::controller::app_profile::catalog::record)
            .collect();
        let urls = std::slice::from_ref(&self.etcd_url);
        match lifecycle::records::put_all(urls, self.keys(instance)?, &records).await {
            lifecycle::records::Catalog::Unreachable(why) => Err(why),
            _ => Ok(()),
        }
    }

    fn set_table_status(&self, instance: &str, table_id: &str, status: String) {
        {
            let mut inner = lock(&self.inner);
            if let Some(running) = inner.instances.get_mut(instance) {
                running.tables.insert(table_id.to_string(), status);
            }
        }
        self.write_state();
    }

    fn instance_and_endpoint(&self, instance: &str) -> Option<(Instance, String)> {
        let inner = lock(&self.inner);
        let running = inner.instances.get(instance)?;
        Some((running.instance.clone(), running.endpoint.to_string()))
    }

    /// Syncs `table` (retrying until `deadline`, or until the runtime stops when None); the
    /// line to report.
    async fn sync_table(
        &self,
        instance: &str,
        table: &Table,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<String, String> {
        let id = crate::rules::table_id(table);
        let Some((inst, endpoint)) = self.instance_and_endpoint(instance) else {
            return Err(format!("table {id}: instance {instance} is not running"));
        };
        let validated = match tables::validated(table, &inst, &endpoint) {
            Ok(v) => v,
            Err(why) => {
                self.set_table_status(instance, &id, format!("refused: {why}"));
                return Err(format!("table {id}: {why}"));
            }
        };
        self.set_table_status(instance, &id, "pending: waiting for a ready server".into());
        let logged = |s: &tonic::Status| tracing::debug!(table = %validated.name, status = %s, "table admin call failed; retrying");
        let mut stop = self.stop_servers.subscribe();
        let result = tokio::select! {
            r = tables::sync_with_retries(&*self.admin, &validated, deadline, &logged) => r,
            _ = stop.wait_for(|v| *v) => Err(tonic::Status::cancelled("the runtime is stopping")),
        };
        match result {
            Ok(synced) => {
                let status = if synced.refused.is_empty() {
                    "synced".to_string()
                } else {
                    format!("refused: {}", synced.refused.join("; "))
                };
                self.set_table_status(instance, &id, status);
                tracing::info!(instance, "{synced}");
                Ok(synced.to_string())
            }
            Err(s) => {
                let why = format!("{:?}: {}", s.code(), s.message());
                self.set_table_status(instance, &id, format!("pending: {why}"));
                Err(format!("table {}: not applied yet ({why})", validated.name))
            }
        }
    }

    /// Syncs the tables one after the other in a task, retrying until the runtime stops.
    fn sync_tables_in_background(self: &Arc<Self>, instance: &str, tables: Vec<Table>) {
        if tables.is_empty() {
            return;
        }
        let rt = self.clone();
        let instance = instance.to_string();
        tokio::spawn(async move {
            for table in tables {
                if let Err(why) = rt.sync_table(&instance, &table, None).await {
                    tracing::warn!(%instance, "{why}");
                }
            }
        });
    }

    /// Applies manifests posted to the control server: the lines to print, or why nothing
    /// was changed.
    pub async fn apply(self: &Arc<Self>, text: &str) -> Result<Vec<String>, ApplyError> {
        let _one_at_a_time = self.apply_lock.lock().await;
        let applied =
            manifests::parse("the applied manifests", text).map_err(ApplyError::Invalid)?;
        if applied.is_empty() {
            return Err(ApplyError::Invalid(ManifestError::Invalid(vec![
                "no manifests to apply".into(),
            ])));
        }
        let (mut current, merged, counts, scale_ins) = {
            let inner = lock(&self.inner);
            if inner.stopped {
                return Err(ApplyError::Stopping);
            }
            let counts: BTreeMap<(String, String), i32> = inner
                .instances
                .values()
                .flat_map(|i| {
                    i.clusters
                        .iter()
                        .map(|(c, rc)| ((i.namespace.clone(), c.clone()), rc.serve_nodes))
                })
                .collect();
            let scale_ins: BTreeMap<String, ScaleInState> = inner
                .instances
                .values()
                .flat_map(|i| {
                    i.clusters
                        .iter()
                        .filter_map(|(c, rc)| Some((c.clone(), rc.scale_in_state()?)))
                })
                .collect();
            (
                inner.desired.clone(),
                inner.manifests.merged(&applied),
                counts,
                scale_ins,
            )
        };
        // The counts as they run (an apply that failed part way may have changed some).
        for instance in &mut current {
            for cluster in &mut instance.clusters {
                if let Some(n) = counts.get(&(instance.namespace.clone(), cluster.name.clone())) {
                    cluster.serve_nodes = *n;
                }
            }
        }
        let next = manifests::desired(&merged, &counts).map_err(ApplyError::Invalid)?;
        let changes =
            plan::plan(&current, &next, &applied, &scale_ins).map_err(ApplyError::Refused)?;

        let mut lines = vec![];
        let mut to_sync = vec![];
        for change in &changes {
            match change {
                Change::InstanceAdded { instance } => {
                    let li = find(&next, instance);
                    let addr = {
                        let mut inner = lock(&self.inner);
                        let addr =
                            endpoint_addr(&mut inner.ports, li).map_err(ApplyError::Failed)?;
                        inner
                            .ports
                            .save(&self.data_dir)
                            .map_err(|e| ApplyError::Failed(e.into()))?;
                        addr
                    };
                    let listener = bind_endpoint(addr, li).await.map_err(ApplyError::Failed)?;
                    self.start_instance(li, listener)
                        .map_err(ApplyError::Failed)?;
                    lines.push(format!(
                        "{change} (endpoint {addr}, {})",
                        li.resource_name()
                    ));
                    continue;
                }
                Change::ClusterAdded {
                    instance, cluster, ..
                } => {
                    let li = find(&next, instance);
                    let lc = li.cluster(cluster).expect("planned from next");
                    self.start_cluster(instance, lc, &[], lc.serve_nodes)
                        .await
                        .map_err(ApplyError::Failed)?;
                }
                Change::ScaledOut {
                    instance,
                    cluster,
                    to,
                    ..
                } => {
                    self.set_count(instance, cluster, *to, None)
                        .await
                        .map_err(ApplyError::Failed)?;
                }
                Change::ScaledIn {
                    instance,
                    cluster,
                    to,
                    ..
                } => {
                    let done = self
                        .set_count(instance, cluster, *to, None)
                        .await
                        .map_err(ApplyError::Failed)?;
                    let left = match self.observe_now(instance, cluster).await {
                        Some(n) => format!(" ({n} tablet(s) to move)"),
                        None => String::new(),
                    };
                    lines.push(format!(
                        "{change}: {} drain(s){left} — the master moves their tablets away; each stops once the tablet map in etcd says it owns no tablet (`local status` shows the progress; raise serveNodes again to cancel)",
                        done.draining.join(", ")
                    ));
                    continue;
                }
                Change::ScaleInCancelled {
                    instance,
                    cluster,
                    to,
                    ..
                } => {
                    let done = self
                        .set_count(instance, cluster, *to, None)
                        .await
                        .map_err(ApplyError::Failed)?;
                    let mut parts = vec![];
                    for (what, names) in [
                        ("kept running", &done.kept),
                        ("started again", &done.started),
                        ("started again once stopped", &done.restarting),
                        ("still draining", &done.draining),
                    ] {
                        if !names.is_empty() {
                            parts.push(format!("{what}: {}", names.join(", ")));
                        }
                    }
                    lines.push(format!("{change}; {}", parts.join("; ")));
                    continue;
                }
                Change::TableApplied { instance, table } => {
                    let li = find(&next, instance);
                    let t = li
                        .tables
                        .iter()
                        .find(|t| crate::rules::table_id(t) == *table)
                        .expect("planned from next");
                    to_sync.push((instance.clone(), t.clone()));
                    continue;
                }
                Change::AppProfileApplied {
                    instance,
                    app_profile,
                } => {
                    let li = find(&next, instance);
                    let profiles: Vec<_> = li
                        .app_profiles
                        .iter()
                        .filter(|p| p.app_profile_id() == *app_profile)
                        .cloned()
                        .collect();
                    if let Err(why) = self.record_app_profiles(instance, &profiles).await {
                        lines.push(format!("{change}; not in the catalog in etcd: {why}"));
                        continue;
                    }
                }
            }
            lines.push(change.to_string());
        }
        self.set_manifests(merged, next);
        self.write_state();

        let deadline = tokio::time::Instant::now() + APPLY_TABLE_WAIT;
        for (instance, table) in to_sync {
            match self.sync_table(&instance, &table, Some(deadline)).await {
                Ok(line) => lines.push(format!("instance {instance}: {line}")),
                Err(why) => {
                    lines.push(format!(
                        "instance {instance}: {why}; retried in the background"
                    ));
                    self.sync_tables_in_background(&instance, vec![table]);
                }
            }
        }
        if lines.is_empty() {
            lines.push("unchanged".into());
        }
        Ok(lines)
    }

    /// `local.json` as things are now.
    pub fn snapshot(&self) -> LocalState {
        let inner = lock(&self.inner);
        let running = !inner.stopped;
        LocalState {
            etcd: self.etcd_url.clone(),
            etcd_pid: self.etcd.pid(),
            control: running.then(|| self.control.to_string()),
            pid: running.then(std::process::id),
            instances: inner
                .instances
                .iter()
                .map(|(name, i)| {
                    let clusters = i
                        .clusters
                        .iter()
                        .map(|(c, rc)| {
                            let servers = rc
                                .servers
                                .iter()
                                .map(|s| ServerState {
                                    name: s.spec.name(),
                                    grpc: s.spec.grpc.to_string(),
                                    http: s.spec.http.to_string(),
                                    pid: s.state.pid(),
                                    data_dir: s.spec.data_dir.display().to_string(),
                                    restarts: s.state.restarts(),
                                    tablets: lock(&i.tablets)
                                        .get(&s.spec.name())
                                        .copied()
                                        .unwrap_or(0),
                                })
                                .collect();
                            (
                                c.clone(),
                                ClusterState {
                                    serve_nodes: rc.serve_nodes,
                                    servers,
                                    scale_in: rc.scale_in_state(),
                                },
                            )
                        })
                        .collect();
                    (
                        name.clone(),
                        InstanceState {
                            namespace: i.namespace.clone(),
                            endpoint: i.endpoint.to_string(),
                            resource_name: i.resource_name.clone(),
                            clusters,
                            tables: i.tables.clone(),
                            app_profiles: i.app_profiles.clone(),
                            master: state::MasterState {
                                pid: i.master.pid(),
                                restarts: i.master.restarts(),
                            },
                        },
                    )
                })
                .collect(),
        }
    }

    /// Rewrites `local.json` (atomically).
    pub fn write_state(&self) {
        let _one_writer = lock(&self.write_lock);
        let snapshot = self.snapshot();
        let path = self.data_dir.join(state::LOCAL_JSON);
        if let Err(error) = state::write_json_atomic(&path, &snapshot) {
            tracing::error!(path = %path.display(), %error, "cannot write the runtime's state");
        }
    }

    /// What a user needs to know once everything started.
    fn summary(&self) -> String {
        let s = self.snapshot();
        let mut out = format!(
            "basalt local runtime (pid {}) on {}\n  etcd {}\n",
            std::process::id(),
            self.data_dir.display(),
            s.etcd
        );
        for (name, i) in &s.instances {
            let first = if i.endpoint == self.first_endpoint.to_string() {
                " (first instance)"
            } else {
                ""
            };
            out.push_str(&format!(
                "  instance {name}{first}: BIGTABLE_EMULATOR_HOST={} with {}\n",
                i.endpoint, i.resource_name
            ));
            for (c, cluster) in &i.clusters {
                let names: Vec<&str> = cluster.servers.iter().map(|s| s.name.as_str()).collect();
                out.push_str(&format!("    cluster {c}: {}\n", names.join(", ")));
                if let Some(s) = &cluster.scale_in {
                    out.push_str(&format!(
                        "      scale-in from {} to {} under way: {} drain(s)\n",
                        s.from,
                        s.to,
                        s.draining.join(", ")
                    ));
                }
            }
        }
        out.push_str(&format!(
            "  state in {}, logs in {}; Ctrl-C stops everything",
            self.data_dir.join(state::LOCAL_JSON).display(),
            self.data_dir.join("logs").display()
        ));
        out
    }

    /// Stops everything, in order: endpoints and the control server; the servers (SIGTERM,
    /// SIGKILL after their grace period) and the masters; etcd last.
    async fn stop(&self, stop_etcd: watch::Sender<bool>, etcd_task: JoinHandle<()>) {
        for task in lock(&self.listeners).drain(..) {
            task.abort();
        }
        let _ = self.stop_servers.send(true);
        let supervised: Vec<_> = lock(&self.supervised).drain(..).collect();
        for task in supervised {
            let _ = task.await;
        }
        let masters: Vec<_> = lock(&self.masters).drain(..).collect();
        for task in masters {
            let _ = tokio::time::timeout(MASTER_STOP + Duration::from_secs(5), task).await;
        }
        let _ = stop_etcd.send(true);
        let _ = etcd_task.await;
        lock(&self.inner).stopped = true;
        self.write_state();
    }
}

fn find<'a>(instances: &'a [LocalInstance], name: &str) -> &'a LocalInstance {
    instances
        .iter()
        .find(|i| i.name == name)
        .expect("planned from the same instances")
}

/// Why an apply changed nothing (or stopped part way).
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The manifests do not parse or break a rule.
    #[error("{0}")]
    Invalid(ManifestError),
    /// The manifests are valid but ask for what the runtime refuses.
    #[error("{0}")]
    Refused(plan::Refused),
    #[error("the runtime is stopping")]
    Stopping,
    /// Starting something failed; what was started before stays.
    #[error("{0:#}")]
    Failed(anyhow::Error),
}

/// The master of one instance as a process: `basalt-operator master …`.
fn master_process_spec(config: &MasterConfig, program: &Path, logs: &Path) -> ProcessSpec {
    ProcessSpec {
        name: format!("{}-master", config.instance),
        program: program.to_path_buf(),
        args: vec![
            "master".into(),
            "--etcd".into(),
            config.etcd_endpoints.join(","),
            "--namespace".into(),
            config.namespace.clone(),
            "--instance".into(),
            config.instance.clone(),
            "--identity".into(),
            config.identity.clone(),
        ],
        log: logs.join(format!("{}-master.log", config.instance)),
        ready_probe: None,
        grace: MASTER_STOP,
    }
}

/// Tablets per server name over every cluster of an instance (owners by store id, named
/// through the registrations; a tablet of an unregistered owner counts for nobody).
async fn tablet_counts(
    meta: &basalt_meta::Meta,
) -> basalt_master::model::Result<BTreeMap<String, u32>> {
    let (servers, _) = meta.servers(None).await?;
    let names: BTreeMap<String, String> = servers
        .into_iter()
        .map(|r| (r.record.store_id, r.record.name))
        .collect();
    let mut counts = BTreeMap::new();
    for cluster in meta.clusters().await? {
        let (map, _) = meta.tablets(&cluster).await?;
        for table in map.tables() {
            for t in map.tablets(table) {
                if let Some(name) = names.get(&t.owner) {
                    *counts.entry(name.clone()).or_insert(0) += 1;
                }
            }
        }
    }
    Ok(counts)
}

/// What etcd says of the drain of `cluster` to `count` servers ([`lifecycle::view::observe`]
/// then [`scale_in::observe`]); `book` keeps the servers seen registered before.
async fn observe_drain(
    meta: &basalt_meta::Meta,
    cluster: &str,
    count: u32,
    book: &mut ServerBook,
) -> basalt_master::model::Result<Observation> {
    let o = lifecycle::view::observe(meta, cluster, book).await?;
    Ok(scale_in::observe(
        cluster, count, &o.servers, &o.tablets, &o.moves,
    ))
}
