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
use std::time::{Duration, SystemTime};

use anyhow::{Context as _, bail};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

mod apply;
mod backups;
mod nodes;
mod ports;
mod removal;
mod report;
mod scale;

pub use apply::ApplyError;
pub use nodes::LocalNodes;
pub use ports::tail;
use ports::{bind_endpoint, endpoint_addr, etcd_ports};

use super::endpoint::{self, Backends};
use super::etcd;
use super::manifests::{self, LocalCluster, LocalInstance, ManifestError, Manifests};
use super::plan::{self, Change};
use super::process::{self, ProcessSpec, ProcessState};
use super::scale_in::{self, Observation};
use super::security::{self, InstanceCredentials, LocalPki};
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
    /// The Prometheus server the masters' autoscalers query (None: the servers' reports).
    pub prometheus_url: Option<String>,
}

/// What serves the runtime's control channel on a listener until aborted (the apply channel,
/// [`super::control::serve`]: given by [`super::run`], so the runtime does not depend on it).
pub type ControlServer = fn(
    TcpListener,
    Arc<Runtime>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Runs the manifests until SIGINT or SIGTERM; `serve_control` serves `local apply` and `local
/// status`.
pub async fn run(options: Options, serve_control: ControlServer) -> anyhow::Result<()> {
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
    for i in &desired {
        if let Some(notice) =
            servers::backup_store_notice(&i.name, i.instance.spec.backup_store.as_ref())
        {
            tracing::warn!("{notice}");
        }
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
    let etcd_ports = etcd_ports(
        &mut ports,
        desired.iter().any(|i| i.instance.spec.tls_enabled()),
    )?;
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

    // etcd speaks TLS when an instance of the manifests does (the runtime's CA signs its
    // certificate and every client's): decided at start, as etcd's URL is.
    let mut pki = None;
    let (etcd_security, etcd_tls) = if desired.iter().any(|i| i.instance.spec.tls_enabled()) {
        let now = SystemTime::now();
        let opened = LocalPki::open(&data_dir, now)?;
        let etcd_files = opened.etcd(now)?;
        let operator = opened.operator(now)?;
        let args = security::etcd_server_args(&opened.ca_file(), &etcd_files);
        let client = security::client_security(&opened.ca_file(), &operator, None)?;
        pki = Some(Arc::new(opened));
        (client, args)
    } else {
        (basalt_transport::Security::Plaintext, vec![])
    };

    // etcd first; everything else needs it.
    let etcd_state = Arc::new(ProcessState::default());
    let (stop_etcd, etcd_stop_rx) = watch::channel(false);
    let etcd_spec = etcd::process_spec(&data_dir, etcd_ports, &etcd_security, &etcd_tls);
    let etcd_log = etcd_spec.log.clone();
    let (stop_servers, _) = watch::channel(false);
    let runtime = Arc::new(Runtime {
        data_dir: data_dir.clone(),
        etcd_url: etcd::client_url(etcd_ports.client, &etcd_security),
        etcd_security,
        pki: Mutex::new(pki),
        etcd: etcd_state.clone(),
        control,
        first_endpoint,
        tablet_server_bin,
        prometheus_url: options.prometheus_url.clone(),
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
        keyviz: Arc::default(),
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
            // Before the servers start, so that they ship within the limit from the first.
            if let Err(why) = runtime.record_replication_limits(instance).await {
                bail!(
                    "instance {}: the replication limits are not recorded in etcd: {why}",
                    instance.name
                );
            }
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
        let control_task = tokio::spawn(serve_control(control_listener, runtime.clone()));
        let rt = runtime.clone();
        let renewal = tokio::spawn(async move {
            loop {
                tokio::time::sleep(security::RENEW_INTERVAL).await;
                if let Err(error) = rt.renew_certificates() {
                    tracing::warn!(%error, "certificates not renewed; trying again later");
                }
            }
        });
        lock(&runtime.listeners).extend([control_task, renewal]);
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

/// The running runtime.
pub struct Runtime {
    data_dir: PathBuf,
    etcd_url: String,
    /// How the runtime and every process reach etcd: TLS when an instance was secured at
    /// start (each with its own certificate), else plaintext.
    etcd_security: basalt_transport::Security,
    /// The runtime's CA and certificates (`DIR/tls`), once anything needs them (a renewed
    /// CA replaces it).
    pki: Mutex<Option<Arc<LocalPki>>>,
    etcd: Arc<ProcessState>,
    control: SocketAddr,
    first_endpoint: SocketAddr,
    tablet_server_bin: PathBuf,
    /// Given to the masters (`--prometheus-url`).
    prometheus_url: Option<String>,
    /// The table admin of plaintext instances (a secured one has its own).
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
    /// The instances the Key Visualizer shows (served on the control port).
    pub(super) keyviz: Arc<crate::keyviz::Sources>,
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
    /// Its certificates (with TLS, or when etcd speaks TLS), given to its processes.
    credentials: Option<InstanceCredentials>,
    /// Its tables are applied through it.
    admin: Arc<GrpcTableAdmin>,
    /// Its servers' security flags.
    server_args: Vec<String>,
    namespace: String,
    resource_name: String,
    endpoint: SocketAddr,
    backends: Arc<Backends>,
    /// The instance's master process.
    master: Arc<ProcessState>,
    /// Where it serves its metrics.
    master_metrics: SocketAddr,
    /// Tablets owned per server name, from etcd (see `follow_tablets`).
    tablets: Arc<Mutex<BTreeMap<String, u32>>>,
    /// How replication stands, from etcd (see `follow_tablets`): the pairs and the seeding.
    replication: Arc<Mutex<Replicated>>,
    clusters: BTreeMap<String, RunningCluster>,
    tables: BTreeMap<String, String>,
    app_profiles: BTreeMap<String, AppProfileSpec>,
    /// `Backup <name>` / `BackupSchedule <name>` → where it stands (its backup task's).
    backups: BTreeMap<String, String>,
}

/// What `local.json` shows of replication, and where each app profile routes now.
#[derive(Clone, Debug, Default, PartialEq)]
struct Replicated {
    pairs: Vec<crate::crd::ReplicationStatus>,
    seeding: Vec<crate::crd::SeedingStatus>,
    routing: BTreeMap<String, state::ProfileRoutes>,
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
    /// Left out by a `local apply`: on its way out of the instance ([`removal`]). Its servers
    /// are not behind the endpoint any more.
    removal: Option<removal::Removal>,
    /// With `autoscaling`: the autoscaler's last decision, as read from etcd.
    autoscaler: Option<basalt_meta::AutoscalerRecord>,
    /// Each server's CPU allocation ([`servers::cpu_millicores`]).
    cpu_millicores: Option<u64>,
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

impl Inner {
    /// The running cluster `cluster` of `instance`.
    fn cluster(&self, instance: &str, cluster: &str) -> anyhow::Result<&RunningCluster> {
        self.instances
            .get(instance)
            .and_then(|i| i.clusters.get(cluster))
            .with_context(|| format!("cluster {cluster} of instance {instance} is not running"))
    }
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
    /// The servers' security flags ([`security::server_args`]).
    security: Vec<String>,
    /// The instance's `spec.backupStore` ([`servers::backup_location`]).
    backup_store: Option<crate::crd::instance::BackupStore>,
}

impl Site {
    fn of(running: &RunningInstance) -> Site {
        Site {
            security: running.server_args.clone(),
            backup_store: running.instance.spec.backup_store.clone(),
            namespace: running.namespace.clone(),
            project: crate::build::project_id(&running.instance),
            backends: running.backends.clone(),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere cannot leave these maps half-updated in a way that matters more than
    // stopping the runtime would.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Runtime {
    /// etcd's client URL, as `basalt-meta` connects to it.
    fn etcd_endpoints(&self) -> basalt_master::model::Result<basalt_meta::EtcdEndpoints> {
        basalt_meta::endpoints(std::slice::from_ref(&self.etcd_url), &self.etcd_security)
    }

    /// Whether etcd speaks TLS.
    fn etcd_tls(&self) -> bool {
        matches!(self.etcd_security, basalt_transport::Security::Tls(_))
    }

    /// The runtime's CA, opened (made) the first time it is needed.
    fn pki(&self) -> anyhow::Result<Arc<LocalPki>> {
        let mut pki = lock(&self.pki);
        if let Some(pki) = pki.as_ref() {
            return Ok(pki.clone());
        }
        let opened = Arc::new(LocalPki::open(&self.data_dir, SystemTime::now())?);
        *pki = Some(opened.clone());
        Ok(opened)
    }

    /// `instance`'s certificates (None: it and etcd are plaintext) and its table admin (with
    /// TLS, dialling with the runtime's own certificate). A secured instance added by `local apply` to a runtime
    /// whose etcd is plaintext keeps etcd plaintext until the runtime restarts.
    fn instance_security(
        &self,
        instance: &LocalInstance,
    ) -> anyhow::Result<(Option<InstanceCredentials>, Arc<GrpcTableAdmin>)> {
        if !instance.instance.spec.tls_enabled() && !self.etcd_tls() {
            return Ok((None, self.admin.clone()));
        }
        let now = SystemTime::now();
        let pki = self.pki()?;
        let credentials = pki.instance(&instance.namespace, &instance.instance, now)?;
        if credentials.tls.is_none() {
            return Ok((Some(credentials), self.admin.clone()));
        }
        let security = security::client_security(&credentials.ca, &pki.operator(now)?, None)?;
        let admin = Arc::new(GrpcTableAdmin::with_dialer(
            ADMIN_TIMEOUT,
            basalt_control::Dialer::new(security),
        ));
        Ok((Some(credentials), admin))
    }

    /// Issues again every certificate due for renewal (the runtime's, and each running
    /// instance's): processes read the new files at their next handshake.
    fn renew_certificates(&self) -> anyhow::Result<()> {
        if lock(&self.pki).is_none() {
            return Ok(());
        }
        let now = SystemTime::now();
        // The CA itself first: a new one means every leaf again.
        let pki = Arc::new(LocalPki::open(&self.data_dir, now)?);
        *lock(&self.pki) = Some(pki.clone());
        if self.etcd_tls() {
            pki.etcd(now)?;
        }
        pki.operator(now)?;
        let instances: Vec<(String, Instance)> = lock(&self.inner)
            .instances
            .values()
            .filter(|i| i.credentials.is_some())
            .map(|i| (i.namespace.clone(), i.instance.clone()))
            .collect();
        for (namespace, instance) in instances {
            pki.instance(&namespace, &instance, now)?;
        }
        Ok(())
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
        self.keyviz.set(
            (instance.namespace.clone(), instance.name.clone()),
            crate::keyviz::Source {
                endpoints: vec![self.etcd_url.clone()],
                security: self.etcd_security.clone(),
            },
        );
        let (credentials, admin) = self.instance_security(instance)?;
        let master_args = credentials
            .as_ref()
            .map(|c| security::master_args(c, self.etcd_tls()))
            .unwrap_or_default();
        let server_args = credentials
            .as_ref()
            .map(|c| security::server_args(c, self.etcd_tls()))
            .unwrap_or_default();
        let backends = Arc::new(Backends::default());
        let master = Arc::new(ProcessState::default());
        let master_metrics = {
            let mut inner = lock(&self.inner);
            let port = inner
                .ports
                .master(&format!("{}/{}", instance.namespace, instance.name))?;
            inner.ports.save(&self.data_dir)?;
            SocketAddr::from(([127, 0, 0, 1], port))
        };
        let tablets = Arc::new(Mutex::new(BTreeMap::new()));
        let replication = Arc::new(Mutex::new(Replicated::default()));
        self.follow_tablets(instance, tablets.clone(), replication.clone());
        lock(&self.listeners).push(tokio::spawn(endpoint::serve(listener, backends.clone())));
        lock(&self.inner).instances.insert(
            instance.name.clone(),
            RunningInstance {
                instance: instance.instance.clone(),
                credentials,
                admin,
                server_args,
                namespace: instance.namespace.clone(),
                resource_name: instance.resource_name(),
                endpoint,
                backends,
                master: master.clone(),
                master_metrics,
                tablets: tablets.clone(),
                replication,
                clusters: BTreeMap::new(),
                tables: BTreeMap::new(),
                app_profiles: BTreeMap::new(),
                backups: BTreeMap::new(),
            },
        );
        self.keep_backups(&instance.name);
        self.spawn_master(
            MasterConfig {
                security: basalt_transport::Security::Plaintext,
                etcd_security: basalt_transport::Security::Plaintext,
                etcd_endpoints: vec![self.etcd_url.clone()],
                namespace: instance.namespace.clone(),
                instance: instance.name.clone(),
                identity: "local".into(),
                prometheus_url: self.prometheus_url.clone(),
            },
            master_metrics,
            master,
            master_args,
        );
        tracing::info!(instance = %instance.name, %endpoint, resource = %instance.resource_name(), "instance started");
        Ok(())
    }

    /// Runs the instance's master as a process of its own (`basalt-operator master`),
    /// supervised like the servers: restarted when it exits, so a killed master is replaced
    /// and the new one wins the election once the old one's lease is gone.
    fn spawn_master(
        self: &Arc<Self>,
        config: MasterConfig,
        metrics: SocketAddr,
        state: Arc<ProcessState>,
        security: Vec<String>,
    ) {
        let program = std::env::current_exe().unwrap_or_else(|_| "basalt-operator".into());
        let mut process =
            master_process_spec(&config, metrics, &program, &self.data_dir.join("logs"));
        process.args.extend(security);
        let rt = self.clone();
        lock(&self.masters).push(tokio::spawn(process::supervise(
            process,
            state,
            self.stop_servers.subscribe(),
            Arc::new(move || rt.write_state()),
        )));
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

/// The master of one instance as a process: `basalt-operator master …`.
fn master_process_spec(
    config: &MasterConfig,
    metrics: SocketAddr,
    program: &Path,
    logs: &Path,
) -> ProcessSpec {
    let mut args = vec!["--metrics-listen".to_string(), metrics.to_string()];
    if let Some(url) = &config.prometheus_url {
        args.extend(["--prometheus-url".to_string(), url.clone()]);
    }
    ProcessSpec {
        name: format!("{}-master", config.instance),
        program: program.to_path_buf(),
        args: [
            vec![
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
            args,
        ]
        .concat(),
        log: logs.join(format!("{}-master.log", config.instance)),
        ready_probe: None,
        grace: MASTER_STOP,
        env: vec![],
    }
}
