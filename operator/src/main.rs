//! `basalt-operator`: runs the controllers (leader-elected), writes the CRDs, or runs
//! manifests locally as processes (`local`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use basalt_operator::build::OperatorConfig;
use basalt_operator::controller;
use basalt_operator::metrics::Metrics;
use clap::{Parser, Subcommand, ValueEnum};
use kube_lease_manager::LeaseManagerBuilder;

#[derive(Parser)]
#[command(
    name = "basalt-operator",
    version,
    about = "Basalt's Kubernetes operator"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the controllers for Instances, Clusters, Tables and AppProfiles in every namespace,
    /// and every Instance's master. Replicas elect one leader of the controllers through a
    /// Lease; every replica runs the masters, which elect one per Instance in its etcd.
    Run(RunArgs),
    /// Write the CustomResourceDefinitions as YAML: one file per CRD into --out, or all to stdout.
    Crd {
        /// Directory to write `<plural>.basalt.dev.yaml` files into.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Run Instance, Cluster, Table, AppProfile, Backup and BackupSchedule manifests as
    /// processes on 127.0.0.1: one
    /// etcd, every cluster's tablet servers, each instance's master, and an endpoint per
    /// instance (the first on 127.0.0.1:8086). Ctrl-C stops everything.
    /// `local apply` changes the running runtime; `local status` shows it.
    Local(LocalArgs),
    /// Run the master of one Instance: tablet assignment and lost servers, decided while it
    /// leads the instance's election in etcd (several may run; one acts). The local runtime
    /// runs one per instance; on Kubernetes `run` carries it.
    Master(MasterArgs),
    /// Accept that a lost server's data is gone for good: the master re-creates its Lost
    /// tablets empty on live servers (their rows are gone). Only for a server whose data
    /// directory cannot be restored; the Cluster's DataLoss condition (or a client's
    /// UNAVAILABLE "tablet … is lost") names its store id.
    AcceptDataLoss(AcceptDataLossArgs),
}

#[derive(clap::Args)]
struct AcceptDataLossArgs {
    /// etcd client URLs of the instance's metadata store, comma-separated (on Kubernetes,
    /// e.g. through `kubectl port-forward svc/<instance>-meta 2379`).
    #[arg(long, value_delimiter = ',', required_unless_present = "data_dir")]
    etcd: Vec<String>,
    /// A local runtime's directory: its etcd from DIR/local.json (instead of --etcd).
    #[arg(long, value_name = "DIR", conflicts_with = "etcd")]
    data_dir: Option<PathBuf>,
    /// The Instance's namespace.
    #[arg(long, default_value = "default")]
    namespace: String,
    /// The Instance's name.
    #[arg(long)]
    instance: String,
    /// The Cluster's name.
    #[arg(long)]
    cluster: String,
    /// The lost server's store id (`st-…`, the owner of the Lost tablets).
    #[arg(long, value_name = "STORE_ID")]
    store_id: String,
}

#[derive(clap::Args)]
struct MasterArgs {
    /// etcd client URLs, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    etcd: Vec<String>,
    /// The Instance's namespace (part of the etcd prefix).
    #[arg(long, default_value = "default")]
    namespace: String,
    /// The Instance's name.
    #[arg(long)]
    instance: String,
    /// This candidate's name in the election.
    #[arg(long, default_value = "master")]
    identity: String,
    /// The Prometheus server (`http://host:port`) the autoscaler queries (docs/autoscaling.md).
    /// Unset: it uses the servers' own reports over the control protocol.
    #[arg(long, env = "BASALT_PROMETHEUS_URL")]
    prometheus_url: Option<String>,
    /// Where to serve the master's Prometheus metrics (`/metrics`). Unset: nowhere.
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    /// Log filter (tracing's EnvFilter syntax; default: RUST_LOG, else info).
    #[arg(long)]
    log_level: Option<String>,
    #[command(flatten)]
    tls: TlsArgs,
}

/// How the master reaches the tablet servers and etcd when they speak TLS (the flags of the
/// tablet server's own, docs/security.md).
#[derive(clap::Args)]
struct TlsArgs {
    /// The certificate (PEM) presented to the tablet servers, whose TLS certificates are
    /// verified against --tls-ca; read again when it changes. Requires --tls-key and --tls-ca.
    #[arg(long, value_name = "PEM", env = "BASALT_TLS_CERT", requires_all = ["tls_key", "tls_ca"])]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(
        long,
        value_name = "PEM",
        env = "BASALT_TLS_KEY",
        requires = "tls_cert"
    )]
    tls_key: Option<PathBuf>,
    /// The CA (PEM) the tablet servers' certificates chain to.
    #[arg(long, value_name = "PEM", env = "BASALT_TLS_CA", requires = "tls_cert")]
    tls_ca: Option<PathBuf>,
    /// The name the servers' certificates are checked against (default: the host dialled).
    #[arg(
        long,
        value_name = "NAME",
        env = "BASALT_TLS_SERVER_NAME",
        requires = "tls_cert"
    )]
    tls_server_name: Option<String>,
    #[command(flatten)]
    etcd: basalt_transport::cli::EtcdTlsArgs,
}

impl TlsArgs {
    /// The security towards the tablet servers, and towards etcd.
    fn securities(
        &self,
    ) -> anyhow::Result<(basalt_transport::Security, basalt_transport::Security)> {
        let servers = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => {
                let mut files = basalt_transport::TlsFiles::client(
                    cert.clone(),
                    key.clone(),
                    self.tls_ca.clone(),
                );
                files.server_name = self.tls_server_name.clone();
                basalt_transport::Security::tls(files)?
            }
            _ => basalt_transport::Security::Plaintext,
        };
        Ok((servers, self.etcd.security()?))
    }
}

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
struct LocalArgs {
    #[command(subcommand)]
    action: Option<LocalAction>,
    /// Manifest files, or directories of *.yaml/*.yml files (read in name order); repeatable.
    #[arg(short = 'f', long = "filename", value_name = "PATH", required = true)]
    files: Vec<PathBuf>,
    /// The runtime's directory: etcd's and the servers' data, logs, local.json.
    #[arg(long, value_name = "DIR", default_value = basalt_operator::local::DEFAULT_DATA_DIR)]
    data_dir: PathBuf,
    /// The first instance's endpoint (the others get free ports).
    #[arg(long, value_name = "HOST:PORT", default_value = basalt_operator::local::DEFAULT_ENDPOINT)]
    endpoint: SocketAddr,
    /// Log level filter (tracing's EnvFilter syntax).
    #[arg(long, env = "RUST_LOG", default_value = "info")]
    log_level: String,
    /// The Prometheus server (`http://host:port`) the autoscaler queries; it should scrape
    /// the targets the runtime lists in DIR/prometheus-targets.json (docs/autoscaling.md).
    /// Unset: the autoscaler uses the servers' own reports.
    #[arg(long, env = "BASALT_PROMETHEUS_URL")]
    prometheus_url: Option<String>,
}

#[derive(Subcommand)]
enum LocalAction {
    /// Apply manifests to the runtime running on --data-dir: new tables and families, more
    /// serve nodes, new clusters and instances. Prints what changed.
    Apply {
        /// Manifest files or directories, as for `local`.
        #[arg(short = 'f', long = "filename", value_name = "PATH", required = true)]
        files: Vec<PathBuf>,
        /// The running runtime's directory (its local.json says where to reach it).
        #[arg(long, value_name = "DIR", default_value = basalt_operator::local::DEFAULT_DATA_DIR)]
        data_dir: PathBuf,
    },
    /// Restart one tablet server of the runtime on --data-dir on its data (its process ends and
    /// starts again, like a deleted pod of a StatefulSet).
    Restart {
        /// The server's name, as `local status` lists it (e.g. quickstart-c1-0).
        server: String,
        /// The running runtime's directory.
        #[arg(long, value_name = "DIR", default_value = basalt_operator::local::DEFAULT_DATA_DIR)]
        data_dir: PathBuf,
    },
    /// Show the runtime on --data-dir: its processes and addresses from local.json, and each
    /// server's readiness and tablet count as it reports them.
    Status {
        /// The runtime's directory.
        #[arg(long, value_name = "DIR", default_value = basalt_operator::local::DEFAULT_DATA_DIR)]
        data_dir: PathBuf,
    },
}

#[derive(clap::Args)]
struct RunArgs {
    /// Image of the tablet servers, unless a Cluster sets its own.
    #[arg(long, env = "BASALT_TABLET_SERVER_IMAGE", default_value_t = OperatorConfig::default().tablet_server_image)]
    tablet_server_image: String,
    /// StorageClass of SSD clusters' volumes.
    #[arg(long, env = "BASALT_SSD_STORAGE_CLASS", default_value = "ssd")]
    ssd_storage_class: String,
    /// StorageClass of HDD clusters' volumes.
    #[arg(long, env = "BASALT_HDD_STORAGE_CLASS", default_value = "hdd")]
    hdd_storage_class: String,
    /// Image of the instances' metadata stores (etcd, run as `etcd` with flags).
    #[arg(long, env = "BASALT_ETCD_IMAGE", default_value = basalt_operator::build::DEFAULT_ETCD_IMAGE)]
    etcd_image: String,
    /// StorageClass of the metadata stores' volumes (default: the SSD class).
    #[arg(long, env = "BASALT_ETCD_STORAGE_CLASS")]
    etcd_storage_class: Option<String>,
    /// Give every Instance's metadata store a NetworkPolicy: etcd's client port only from the
    /// instance's tablet servers and this operator's pods (in --lease-namespace), its peer
    /// port only from its members (docs/security.md).
    #[arg(long, env = "BASALT_METADATA_STORE_NETWORK_POLICIES")]
    metadata_store_network_policies: bool,
    /// The ClusterRole allowing `tokenreviews` create (the chart's token reviewer): the
    /// operator binds to it the tablet servers of Instances with
    /// `spec.security.serviceAccountTokens` (it needs `bind` on that role). Unset: it binds
    /// nothing and those servers' ServiceAccount must be granted it otherwise.
    #[arg(long, env = "BASALT_TOKEN_REVIEWER_CLUSTER_ROLE")]
    token_reviewer_cluster_role: Option<String>,
    /// Address of the HTTP server for /metrics and /healthz.
    #[arg(long, default_value = "0.0.0.0:8080")]
    metrics_listen: SocketAddr,
    /// Address of the Key Visualizer's page and API (`/keyviz`). It shows row keys, so by
    /// default only the pod itself listens: reach it with `kubectl port-forward`. Set
    /// `0.0.0.0:8081` to expose it (then restrict who reaches it).
    #[arg(
        long,
        env = "BASALT_KEY_VISUALIZER_LISTEN",
        default_value = "127.0.0.1:8081"
    )]
    key_visualizer_listen: SocketAddr,
    /// The Prometheus server (`http://host:port`) the autoscalers of the Instances' masters
    /// query for the tablet servers' CPU and storage (docs/autoscaling.md). Unset: they use
    /// the servers' own reports over the control protocol.
    #[arg(long, env = "BASALT_PROMETHEUS_URL")]
    prometheus_url: Option<String>,
    /// Namespace of the leader-election Lease (default: the pod's namespace, POD_NAMESPACE).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    lease_namespace: String,
    /// Name of the leader-election Lease.
    #[arg(long, default_value = "basalt-operator")]
    lease_name: String,
    /// This replica's identity in the Lease and in events (default: the pod name, POD_NAME).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Seconds a lease lasts without renewal before another replica may take over.
    #[arg(long, default_value_t = 15)]
    lease_duration_secs: u64,
    /// Where the operator writes its own client certificate and the CA for its TLS clients
    /// (default: $TMPDIR/basalt-operator-tls-<pid>).
    #[arg(long, value_name = "DIR", env = "BASALT_TLS_DIR")]
    tls_dir: Option<PathBuf>,
    /// Deadline of each table admin call to a tablet server.
    #[arg(long, default_value_t = 10)]
    admin_timeout_secs: u64,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Log level filter (tracing's EnvFilter syntax, e.g. `info` or `basalt_operator=debug`).
    #[arg(long, env = "RUST_LOG", default_value = "info")]
    log_level: String,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn main() -> ExitCode {
    // Fail points of tablet moves, from FAILPOINTS (tests only; see docs/cluster.md).
    let _fail_points = fail::FailScenario::setup();
    let cli = Cli::parse();
    match execute(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // The message and its causes on one line (`{:#}`), not anyhow's Debug form that
            // returning the error from `main` would print: with RUST_BACKTRACE set, that adds a
            // backtrace of `main` to what is usually a user's mistake (a bad manifest, a data
            // directory without a runtime).
            eprintln!("Error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn execute(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Crd { out } => write_crds(out),
        Command::Run(args) => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
            .block_on(run(args)),
        Command::AcceptDataLoss(args) => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
            .block_on(accept_data_loss(args)),
        Command::Master(args) => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
            .block_on(master(args)),
        Command::Local(args) => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
            .block_on(local(args)),
    }
}

async fn accept_data_loss(args: AcceptDataLossArgs) -> anyhow::Result<()> {
    let etcd = match &args.data_dir {
        Some(dir) => {
            let path = dir.join("local.json");
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            let state: basalt_operator::local::state::LocalState = serde_json::from_str(&text)
                .with_context(|| format!("{} is not a local runtime's state", path.display()))?;
            let security = basalt_operator::local::status::etcd_security(&state);
            (vec![state.etcd], security)
        }
        None => (args.etcd.clone(), basalt_meta::Security::Plaintext),
    };
    let keys = basalt_meta::Keys::new(&args.namespace, &args.instance);
    let etcd = basalt_meta::endpoints(&etcd.0, &etcd.1)?;
    let meta = basalt_meta::Meta::connect(&etcd, keys)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let (servers, _) = meta
        .servers(Some(&args.cluster))
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    if let Some(live) = servers.iter().find(|s| s.record.store_id == args.store_id) {
        anyhow::bail!(
            "server {} ({}) is registered now: a live server's data is not lost",
            live.record.name,
            args.store_id
        );
    }
    meta.accept_loss(&args.cluster, &args.store_id)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    println!(
        "accepted the loss of {} in cluster {}: the master re-creates its tablets empty",
        args.store_id, args.cluster
    );
    Ok(())
}

async fn master(args: MasterArgs) -> anyhow::Result<()> {
    let filter = match &args.log_level {
        Some(level) => tracing_subscriber::EnvFilter::try_new(level)
            .with_context(|| format!("invalid --log-level {level:?}"))?,
        None => tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    if let Some(addr) = args.metrics_listen {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        tokio::spawn(basalt_operator::http::serve_master(listener));
    }
    let (security, etcd_security) = args.tls.securities()?;
    basalt_operator::master::run(
        basalt_operator::master::MasterConfig {
            security,
            etcd_security,
            etcd_endpoints: args.etcd,
            namespace: args.namespace,
            instance: args.instance,
            identity: args.identity,
            prometheus_url: args.prometheus_url,
        },
        shutdown_signal(),
    )
    .await
}

async fn local(args: LocalArgs) -> anyhow::Result<()> {
    match args.action {
        Some(LocalAction::Apply { files, data_dir }) => {
            for line in basalt_operator::local::control::apply_remote(&data_dir, &files).await? {
                println!("{line}");
            }
            Ok(())
        }
        Some(LocalAction::Restart { server, data_dir }) => {
            for line in basalt_operator::local::control::restart_remote(&data_dir, &server).await? {
                println!("{line}");
            }
            Ok(())
        }
        Some(LocalAction::Status { data_dir }) => {
            print!(
                "{}",
                basalt_operator::local::status::status(&data_dir).await?
            );
            Ok(())
        }
        None => {
            let filter = tracing_subscriber::EnvFilter::try_new(&args.log_level)
                .with_context(|| format!("invalid --log-level {:?}", args.log_level))?;
            tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_writer(std::io::stderr)
                .init();
            basalt_operator::local::run(basalt_operator::local::Options {
                files: args.files,
                data_dir: args.data_dir,
                endpoint: Some(args.endpoint),
                prometheus_url: args.prometheus_url,
            })
            .await
        }
    }
}

fn write_crds(out: Option<PathBuf>) -> anyhow::Result<()> {
    let files = basalt_operator::crd::crd_files()?;
    match out {
        Some(dir) => {
            std::fs::create_dir_all(&dir)?;
            for (file, yaml) in files {
                std::fs::write(dir.join(file), yaml)?;
            }
        }
        None => {
            for (_, yaml) in files {
                print!("---\n{yaml}");
            }
        }
    }
    Ok(())
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(&args.log_level)
        .with_context(|| format!("invalid --log-level {:?}", args.log_level))?;
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match args.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }

    let metrics = Arc::new(Metrics::new());
    let http = tokio::net::TcpListener::bind(args.metrics_listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.metrics_listen))?;
    tokio::spawn(basalt_operator::http::serve(http, metrics.clone()));
    // The Key Visualizer shows the Instances whose masters run here (the supervisor keeps the
    // list).
    let keyviz = Arc::new(basalt_operator::keyviz::Sources::default());
    let keyviz_listener = tokio::net::TcpListener::bind(args.key_visualizer_listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.key_visualizer_listen))?;
    tokio::spawn(basalt_operator::keyviz::api::serve(
        keyviz_listener,
        keyviz.clone(),
    ));

    let client = kube::Client::try_default()
        .await
        .context("cannot reach the Kubernetes API (in-cluster config or KUBECONFIG)")?;
    let identity = args
        .identity
        .clone()
        .unwrap_or_else(|| format!("basalt-operator-{}", std::process::id()));
    let config = OperatorConfig {
        tablet_server_image: args.tablet_server_image.clone(),
        ssd_storage_class: args.ssd_storage_class.clone(),
        hdd_storage_class: args.hdd_storage_class.clone(),
        etcd_image: args.etcd_image.clone(),
        etcd_storage_class: args.etcd_storage_class.clone(),
        network_policy_operator_namespace: args
            .metadata_store_network_policies
            .then(|| args.lease_namespace.clone()),
        token_reviewer_cluster_role: args.token_reviewer_cluster_role.clone(),
    };

    // The operator's CA (a Secret in its namespace) and its own certificate: secured
    // Instances' certificates come from it, and the operator dials their servers with it.
    let pki = match controller::pki::OperatorPki::load(
        client.clone(),
        &args.lease_namespace,
        args.tls_dir
            .clone()
            .unwrap_or_else(controller::pki::default_dir),
        std::time::SystemTime::now(),
    )
    .await
    {
        Ok(pki) => {
            let pki = Arc::new(pki);
            tokio::spawn(controller::pki::renew_forever(pki.clone()));
            Some(pki)
        }
        Err(error) => {
            tracing::error!(error = %format!("{error:#}"), secret = controller::pki::CA_SECRET, namespace = %args.lease_namespace, "no certificate authority: Instances with TLS (spec.security) cannot be run");
            None
        }
    };

    // Every replica runs the Instances' masters: etcd elects one per Instance, independently of
    // the controllers' Lease (docs/operator.md).
    let (masters_stop, masters_stopped) = tokio::sync::oneshot::channel::<()>();
    let masters_task = tokio::spawn(controller::masters::supervise(
        client.clone(),
        identity.clone(),
        args.prometheus_url.clone(),
        pki.clone(),
        keyviz,
        async move {
            let _ = masters_stopped.await;
        },
    ));
    let mut masters = Some((masters_stop, masters_task));

    let leases = LeaseManagerBuilder::new(client.clone(), &args.lease_name)
        .with_namespace(&args.lease_namespace)
        .with_identity(&identity)
        .with_duration(args.lease_duration_secs)
        .with_grace(args.lease_duration_secs.div_ceil(3).max(1))
        .build()
        .await
        .context("leader election")?;
    let (mut leading, lease_task) = leases.watch().await;
    tracing::info!(%identity, lease = %args.lease_name, namespace = %args.lease_namespace, "waiting for leadership");

    let mut terminate = Box::pin(shutdown_signal());
    loop {
        // Wait to lead (or for a signal).
        while !*leading.borrow_and_update() {
            tokio::select! {
                changed = leading.changed() => changed.context("leader election stopped")?,
                _ = &mut terminate => {
                    stop_masters(&mut masters).await;
                    drop(leading);
                    let _ = lease_task.await;
                    return Ok(());
                }
            }
        }
        tracing::info!(%identity, "leading: starting controllers");
        metrics.leader.set(1);
        let pdb_supported = controller::discover_pdb_support(&client).await;
        let ctx = controller::context(
            client.clone(),
            config.clone(),
            metrics.clone(),
            Duration::from_secs(args.admin_timeout_secs),
            pdb_supported,
            Some(identity.clone()),
            pki.clone(),
        );
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let controllers = tokio::spawn(controller::run(ctx, async move {
            let _ = stop_rx.await;
        }));
        let mut lost = false;
        tokio::select! {
            _ = async {
                while *leading.borrow_and_update() {
                    if leading.changed().await.is_err() { break; }
                }
            } => { lost = true; }
            _ = &mut terminate => {}
        }
        let _ = stop_tx.send(());
        let _ = controllers.await;
        metrics.leader.set(0);
        if !lost {
            tracing::info!(
                "terminating: controllers stopped, stopping the masters, releasing the lease"
            );
            stop_masters(&mut masters).await;
            drop(leading);
            let _ = lease_task.await;
            return Ok(());
        }
        tracing::warn!(%identity, "lost leadership: controllers stopped; waiting to lead again");
    }
}

type Masters = (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
);

/// Stops the Instances' masters (they resign, so another replica's take over at once).
async fn stop_masters(masters: &mut Option<Masters>) {
    if let Some((stop, task)) = masters.take() {
        let _ = stop.send(());
        let _ = task.await;
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
