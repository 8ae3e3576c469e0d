//! `basalt-tablet-server`: the Basalt tablet server binary.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use tracing::error;

use basalt_meta::LeaseTiming;
use basalt_tablet_server::cluster::ClusterConfig;
use basalt_tablet_server::cluster::routing::priority;
use basalt_tablet_server::control_api::Identity;
use basalt_tablet_server::server::{self, AuthConfig, Config};

/// Whether clients must present a certificate (`--tls-client-certificates`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ClientCertificates {
    /// Every client presents one (mutual TLS).
    Required,
    /// A client may come without one (and authenticate with a token).
    Optional,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line (for log collectors).
    Json,
}

/// Basalt tablet server: serves Google's Bigtable data API (google.bigtable.v2.Bigtable) and
/// table admin API (google.bigtable.admin.v2.BigtableTableAdmin) over gRPC, storing rows
/// durably in RocksDB. Point any Bigtable client at it with
/// BIGTABLE_EMULATOR_HOST=<listen address>.
#[derive(Debug, Parser)]
#[command(name = "basalt-tablet-server", version)]
struct Args {
    /// Run one server that owns every table and tablet (the embedded default; a durable
    /// drop-in for the Bigtable emulator). One of --standalone and --cluster is required.
    #[arg(long, conflicts_with = "cluster")]
    standalone: bool,

    /// Run as a tablet server of this Cluster (cluster mode): tablets spread over the
    /// cluster's servers through the instance's coordination store (--etcd); this server
    /// serves the tablets it owns and forwards requests for the others.
    #[arg(
        long,
        value_name = "CLUSTER",
        env = "BASALT_CLUSTER",
        requires = "etcd"
    )]
    cluster: Option<String>,

    /// Cluster mode: etcd client URLs, comma-separated (e.g. http://127.0.0.1:2379).
    #[arg(long, value_name = "URLS", env = "BASALT_ETCD", value_delimiter = ',')]
    etcd: Vec<String>,

    /// Cluster mode: etcd over TLS.
    #[command(flatten)]
    etcd_tls: basalt_transport::cli::EtcdTlsArgs,

    /// Cluster mode: the namespace of the Instance (part of the etcd prefix
    /// /basalt/v1/<namespace>/<instance>/).
    #[arg(
        long,
        value_name = "NS",
        env = "POD_NAMESPACE",
        default_value = "default"
    )]
    namespace: String,

    /// Cluster mode: the project of the instance's resource name projects/<project>/instances/<instance>
    /// (default: the namespace).
    #[arg(long, value_name = "PROJECT", env = "BASALT_PROJECT")]
    project: Option<String>,

    /// Cluster mode: the lease TTL in seconds; the server stops serving on its own when it
    /// could not renew its lease for this long plus --lease-grace-secs.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 10,
        env = "BASALT_LEASE_TTL_SECS"
    )]
    lease_ttl_secs: u64,

    /// Cluster mode: how long past the lease TTL the server still serves (the master waits
    /// longer than this before it may declare the server lost).
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 5,
        env = "BASALT_LEASE_GRACE_SECS"
    )]
    lease_grace_secs: u64,

    /// Directory holding the server's RocksDB store; created if missing. Reuse it to keep
    /// the data across restarts.
    #[arg(long, value_name = "DIR", env = "BASALT_DATA_DIR")]
    data_dir: PathBuf,

    /// Address for the gRPC APIs (data and table admin, one port). Any project and instance
    /// name is accepted in standalone mode.
    #[arg(
        long,
        value_name = "ADDR",
        default_value = "127.0.0.1:8086",
        env = "BASALT_LISTEN"
    )]
    listen: SocketAddr,

    /// Address for HTTP: /healthz (alive), /readyz (serving) and /metrics (Prometheus).
    #[arg(
        long,
        value_name = "ADDR",
        default_value = "127.0.0.1:8087",
        env = "BASALT_HTTP_LISTEN"
    )]
    http_listen: SocketAddr,

    /// Where backups are kept, `s3://BUCKET/PREFIX` (credentials, region and endpoint from
    /// AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ENDPOINT_URL, AWS_ALLOW_HTTP)
    /// or `file:///DIR`; in cluster mode a location every server of the cluster reaches.
    /// Default (standalone): a `backups` directory beside the data directory — on the same
    /// disk, so not a real backup (docs/backups.md). Cluster mode without it: no backups.
    #[arg(long, value_name = "URL", env = "BASALT_BACKUP_URL")]
    backup_url: Option<String>,

    /// Point-in-time recovery: ship this server's writes to the backup location every SECS
    /// seconds (its change log, in segments), so that a restore can replay them up to any
    /// second covered (docs/backups.md). 0: off.
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = 0,
        env = "BASALT_LOG_BACKUP_INTERVAL_SECS"
    )]
    log_backup_interval_secs: u64,

    /// How long shipped log segments are kept: how far after a backup a restore can reach.
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = 7 * 24 * 3600,
        env = "BASALT_LOG_BACKUP_RETENTION_SECS"
    )]
    log_backup_retention_secs: u64,

    /// How often expired backups are deleted, and the chunks no backup holds collected.
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = 60,
        env = "BASALT_BACKUP_SWEEP_INTERVAL_SECS"
    )]
    backup_sweep_interval_secs: u64,

    /// The most MB (10^6 bytes) per second a backup reads and uploads, so that requests keep
    /// their latency while it runs; 0: no limit.
    #[arg(
        long,
        value_name = "MB",
        default_value_t = 64,
        env = "BASALT_BACKUP_MAX_MB_PER_SEC"
    )]
    backup_max_mb_per_sec: u64,

    /// Standalone mode: the name of this cluster, as reported in tables' cluster_states
    /// (GetTable REPLICATION_VIEW). In cluster mode the name given to --cluster.
    #[arg(long, value_name = "ID", default_value = "local")]
    cluster_id: String,

    /// This server's name in the control protocol's reports (default: the pod name from
    /// POD_NAME, else the host name).
    #[arg(long, value_name = "ID", env = "BASALT_SERVER_ID")]
    server_id: Option<String>,

    /// The host:port other processes reach the gRPC APIs at, as the control protocol reports
    /// it (default: the address --listen bound).
    #[arg(long, value_name = "HOST:PORT", env = "BASALT_ADVERTISE_ADDRESS")]
    advertise_address: Option<String>,

    /// The Basalt instance this server belongs to, as the control protocol reports it (the
    /// operator sets BASALT_INSTANCE on its pods).
    #[arg(long, value_name = "NAME", env = "BASALT_INSTANCE")]
    instance: Option<String>,

    /// How long delete markers (tombstones) are kept before compaction may drop them. Deleted
    /// cells are removed at once; the markers only matter to replication.
    #[arg(long, value_name = "SECONDS", default_value_t = 86_400)]
    tombstone_grace_secs: u64,

    /// Cluster mode, several clusters: how long the change log keeps the writes a peer cluster
    /// has not acknowledged while that peer is not heard from. Past it the log no longer waits
    /// for the peer, which is re-seeded (`docs/replication.md`). Default: 7 days.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 7 * 24 * 3600,
        env = "BASALT_CHANGE_LOG_RETENTION_SECS"
    )]
    change_log_retention_secs: u64,

    /// The CPU this server is allocated, in millicores: the CPU load it reports (for the
    /// autoscaler, `docs/operations.md`) is its CPU use against it. Unset or 0: its cgroup's
    /// CPU limit, else the machine's cores. On Kubernetes the operator sets it to the pod's
    /// CPU request.
    #[arg(
        long,
        value_name = "MILLICORES",
        env = "BASALT_CPU_ALLOCATION_MILLICORES"
    )]
    cpu_allocation_millicores: Option<u64>,

    /// Cluster mode: while this server serves requests of HIGH-priority app profiles, the
    /// bytes LOW-priority requests it received may write, per second (KiB); it paces them
    /// (`docs/app-profiles.md`, Priorities).
    #[arg(
        long,
        value_name = "KIB",
        default_value_t = 128,
        env = "BASALT_LOW_PRIORITY_WRITE_KIB_PER_SEC"
    )]
    low_priority_write_kib_per_sec: u64,

    /// Cluster mode: likewise for MEDIUM-priority requests (KiB per second).
    #[arg(
        long,
        value_name = "KIB",
        default_value_t = 1024,
        env = "BASALT_MEDIUM_PRIORITY_WRITE_KIB_PER_SEC"
    )]
    medium_priority_write_kib_per_sec: u64,

    /// Size of the block cache (uncompressed SST blocks of table data), in MiB. Reads of
    /// blocks not cached go to the operating system's page cache or the disk.
    #[arg(
        long,
        value_name = "MIB",
        default_value_t = 256,
        env = "BASALT_BLOCK_CACHE_MIB"
    )]
    block_cache_mib: usize,

    /// On SIGTERM/SIGINT, how long to wait for in-flight requests before stopping anyway.
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    shutdown_timeout_secs: u64,

    /// Serve gRPC over TLS with this certificate chain (PEM, leaf first); read again when
    /// the file changes (a rotation needs no restart). Requires --tls-key. The server also
    /// presents it as its client certificate to the peers it dials.
    #[arg(
        long,
        value_name = "PEM",
        env = "BASALT_TLS_CERT",
        requires = "tls_key"
    )]
    tls_cert: Option<PathBuf>,

    /// The private key of --tls-cert (PEM).
    #[arg(
        long,
        value_name = "PEM",
        env = "BASALT_TLS_KEY",
        requires = "tls_cert"
    )]
    tls_key: Option<PathBuf>,

    /// Verify clients' certificates against this CA (PEM) (mutual TLS; required unless
    /// --tls-client-certificates optional); a certificate names the caller
    /// (docs/security.md). Requires --tls-cert.
    #[arg(
        long,
        value_name = "PEM",
        env = "BASALT_TLS_CLIENT_CA",
        requires = "tls_cert"
    )]
    tls_client_ca: Option<PathBuf>,

    /// With --tls-client-ca: `required` (every client presents a certificate) or `optional`
    /// (a client may come without one and authenticate with a token; one it presents is
    /// still verified).
    #[arg(
        long,
        value_enum,
        value_name = "WHEN",
        env = "BASALT_TLS_CLIENT_CERTIFICATES",
        default_value = "required",
        requires = "tls_client_ca"
    )]
    tls_client_certificates: ClientCertificates,

    /// The CA the certificates of the peers this server dials (other tablet servers) must
    /// chain to (default: --tls-client-ca).
    #[arg(long, value_name = "PEM", env = "BASALT_TLS_CA", requires = "tls_cert")]
    tls_ca: Option<PathBuf>,

    /// The name peers' certificates are checked against when this server dials them (default:
    /// the host dialled).
    #[arg(
        long,
        value_name = "NAME",
        env = "BASALT_TLS_SERVER_NAME",
        requires = "tls_cert"
    )]
    tls_server_name: Option<String>,

    /// Bearer tokens clients may authenticate with: one `<token> <member>` per line (e.g.
    /// `s3cr3t user:alice@example.com`), `#` comments; read again when it changes. With this
    /// or --tls-client-ca every request must be authenticated and is authorized with
    /// Bigtable's IAM roles (docs/security.md).
    #[arg(long, value_name = "FILE", env = "BASALT_AUTH_TOKEN_FILE")]
    auth_token_file: Option<PathBuf>,

    /// Also accept bearer tokens the Kubernetes API server accepts — ServiceAccount tokens —
    /// checking each with a TokenReview (answers cached a minute; the server reaches the API
    /// server through KUBECONFIG or its pod's ServiceAccount, which must be allowed to create
    /// tokenreviews). A ServiceAccount's member is
    /// `serviceAccount:system:serviceaccount:<namespace>:<name>`, another user's `user:<name>`.
    #[arg(long, env = "BASALT_TOKEN_REVIEW")]
    token_review: bool,

    /// With --token-review: the audience a token must be meant for (repeatable; default: the
    /// API server's own), e.g. `basalt` for projected tokens made for Basalt.
    #[arg(
        long = "token-review-audience",
        value_name = "AUDIENCE",
        env = "BASALT_TOKEN_REVIEW_AUDIENCES",
        value_delimiter = ',',
        requires = "token_review"
    )]
    token_review_audiences: Vec<String>,

    /// A member (e.g. user:alice@example.com) that holds roles/bigtable.admin on every
    /// instance from the start, so a fresh secured server can be administered (repeatable).
    #[arg(
        long = "admin-principal",
        value_name = "MEMBER",
        env = "BASALT_ADMIN_PRINCIPALS",
        value_delimiter = ','
    )]
    admin_principals: Vec<String>,

    /// A member that is one of Basalt's own processes (master, operator, another server):
    /// it may call the control protocol and forward requests (repeatable). The member this
    /// server's own certificate names always is.
    #[arg(
        long = "internal-principal",
        value_name = "MEMBER",
        env = "BASALT_INTERNAL_PRINCIPALS",
        value_delimiter = ','
    )]
    internal_principals: Vec<String>,

    /// Log format. The level comes from RUST_LOG (default: info).
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormat,
}

fn main() -> ExitCode {
    // Fail points of tablet moves, from FAILPOINTS (tests only; see docs/cluster.md).
    let _fail_points = fail::FailScenario::setup();
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match args.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    if !args.standalone && args.cluster.is_none() {
        error!("pass --standalone (one server, no etcd) or --cluster NAME --etcd URLS");
        return ExitCode::from(2);
    }
    let cluster = match &args.cluster {
        Some(name) => {
            let Some(instance) = args.instance.clone() else {
                error!("cluster mode needs --instance (the Instance's name)");
                return ExitCode::from(2);
            };
            let etcd_security = match args.etcd_tls.security() {
                Ok(security) => security,
                Err(e) => {
                    error!(error = %e, "the etcd TLS material does not load");
                    return ExitCode::from(2);
                }
            };
            Some(ClusterConfig {
                cluster: name.clone(),
                etcd: args.etcd.clone(),
                etcd_security,
                project: args
                    .project
                    .clone()
                    .unwrap_or_else(|| args.namespace.clone()),
                namespace: args.namespace.clone(),
                instance,
                timing: LeaseTiming {
                    ttl: Duration::from_secs(args.lease_ttl_secs.max(2)),
                    grace: Duration::from_secs(args.lease_grace_secs),
                },
                change_log_retention: Duration::from_secs(args.change_log_retention_secs.max(1)),
                priority: priority::Limits {
                    low_write_bytes_per_sec: args.low_priority_write_kib_per_sec.max(1) << 10,
                    medium_write_bytes_per_sec: args.medium_priority_write_kib_per_sec.max(1) << 10,
                    ..priority::Limits::default()
                },
            })
        }
        None => None,
    };
    for member in args
        .admin_principals
        .iter()
        .chain(&args.internal_principals)
    {
        if !basalt_model::iam::valid_member(member) || member.starts_with("all") {
            error!(
                member,
                "--admin-principal/--internal-principal: not a principal (user:NAME, serviceAccount:NAME, group:NAME or domain:NAME)"
            );
            return ExitCode::from(2);
        }
    }
    let security = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            match basalt_transport::Security::tls(basalt_transport::TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: args.tls_client_ca.clone(),
                client_certificates_optional: args.tls_client_certificates
                    == ClientCertificates::Optional,
                ca: args.tls_ca.clone(),
                server_name: args.tls_server_name.clone(),
            }) {
                Ok(security) => security,
                Err(e) => {
                    error!(error = %e, "the TLS material does not load");
                    return ExitCode::from(2);
                }
            }
        }
        _ => basalt_transport::Security::Plaintext,
    };
    // A standalone server keeps backups beside its data directory unless told otherwise; the
    // servers of a cluster need one location they all reach (--backup-url).
    let backup_url = args.backup_url.clone().or_else(|| {
        args.standalone.then(|| {
            let data = std::path::absolute(&args.data_dir).unwrap_or(args.data_dir.clone());
            let beside = data.parent().unwrap_or(&data).join("backups");
            format!("file://{}", beside.display())
        })
    });
    let backup = backup_url.map(|url| basalt_tablet_server::backups::BackupConfig {
        url,
        sweep_interval: Duration::from_secs(args.backup_sweep_interval_secs),
        max_bytes_per_sec: args.backup_max_mb_per_sec.saturating_mul(1_000_000),
        log_backup: (args.log_backup_interval_secs > 0).then(|| {
            basalt_tablet_server::log_backup::LogBackupConfig {
                interval: Duration::from_secs(args.log_backup_interval_secs),
                retention: Duration::from_secs(args.log_backup_retention_secs),
            }
        }),
    });
    let config = Config {
        backup,
        data_dir: args.data_dir,
        listen: args.listen,
        http_listen: args.http_listen,
        cluster_id: args.cluster.clone().unwrap_or(args.cluster_id),
        tombstone_grace: Duration::from_secs(args.tombstone_grace_secs),
        block_cache_bytes: args.block_cache_mib.saturating_mul(1 << 20),
        shutdown_timeout: Duration::from_secs(args.shutdown_timeout_secs),
        cpu_allocation_millicores: args.cpu_allocation_millicores,
        identity: Identity {
            server_id: args.server_id,
            advertise_address: args.advertise_address,
            instance: args.instance,
        },
        cluster,
        security,
        filter: None,
        store_slot: None,
        auth: AuthConfig {
            token_file: args.auth_token_file,
            admin_principals: args.admin_principals,
            internal_principals: args.internal_principals,
            token_review: args.token_review.then_some(args.token_review_audiences),
        },
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            error!(error = %e, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(server::run(config, shutdown_signal())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!(error = %e, "tablet server failed");
            ExitCode::FAILURE
        }
    }
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("install SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("install SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
