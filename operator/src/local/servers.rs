//! The tablet servers of the local runtime: `basalt-tablet-server` in cluster mode, one
//! process per server ordinal of each Cluster, with the identity, etcd prefix and addresses
//! the operator gives its pods on Kubernetes. Server `i` of cluster `c` is `c-i` (the pod
//! name a StatefulSet would give it), with its data in `DIR/servers/<namespace>/c-i` and its
//! log in `DIR/logs/c-i.log`. Its ports are remembered (`ports.json`), so a restarted server
//! comes back at the address etcd's tablet map knows.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::process::ProcessSpec;
use crate::crd::instance::BackupStore;

/// The environment variable that names the tablet server binary.
pub const TABLET_SERVER_BIN_ENV: &str = "BASALT_TABLET_SERVER_BIN";
/// The binary's name.
pub const TABLET_SERVER_BIN: &str = "basalt-tablet-server";
/// How long a stopping server gets after SIGTERM (its own default shutdown timeout is 30 s
/// for in-flight requests; then it flushes).
pub const STOP_GRACE: Duration = Duration::from_secs(30);

/// One tablet server as the runtime runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerSpec {
    pub namespace: String,
    pub instance: String,
    pub project: String,
    pub cluster: String,
    pub ordinal: u32,
    pub data_dir: PathBuf,
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    /// The CPU the server counts as its allocation (`--cpu-allocation-millicores`): the
    /// Cluster's `resources.requests.cpu` (else its limit), as on Kubernetes. None: the
    /// machine's cores.
    pub cpu_millicores: Option<u64>,
    /// Its TLS, authentication and etcd flags ([`super::security::server_args`]).
    pub security: Vec<String>,
    /// Where backups are kept (`--backup-url`, and the env that adds): one location every
    /// server of the instance reaches ([`backup_location`]).
    pub backup: BackupLocation,
}

impl ServerSpec {
    /// `<cluster>-<ordinal>`: its server id and log name.
    pub fn name(&self) -> String {
        server_name(&self.cluster, self.ordinal)
    }

    /// `<namespace>/<name>`: its key in `ports.json`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name())
    }
}

/// `<cluster>-<ordinal>`.
pub fn server_name(cluster: &str, ordinal: u32) -> String {
    format!("{cluster}-{ordinal}")
}

/// `DIR/servers/<namespace>/<cluster>-<ordinal>`.
pub fn server_data_dir(data_dir: &Path, namespace: &str, cluster: &str, ordinal: u32) -> PathBuf {
    data_dir
        .join("servers")
        .join(namespace)
        .join(server_name(cluster, ordinal))
}

/// The backup location of the runtime's servers: `DIR/backups`, shared by all of them
/// (docs/backups.md).
pub fn backup_url(data_dir: &Path) -> String {
    let dir = std::path::absolute(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
    format!("file://{}", dir.join("backups").display())
}

/// Where the servers of one instance keep its backups: the `--backup-url` they get, what
/// their environment adds for it, and whether they ship their log there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupLocation {
    pub url: String,
    /// `AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP`, `AWS_REGION` as the instance's `backupStore`
    /// says; the rest of the environment (credentials above all) is the runtime's own.
    pub env: Vec<(String, String)>,
    /// The point-in-time recovery flags of `backupStore.logBackup`, as on Kubernetes
    /// ([`crate::lifecycle::backups::log_backup_flags`]); empty without it.
    pub log_backup: Vec<(&'static str, String)>,
}

/// The backup location of an instance's servers: its `spec.backupStore` (the URL, with the
/// endpoint and region as env, and its log backup), else [`backup_url`], `DIR/backups`. Pure.
pub fn backup_location(data_dir: &Path, store: Option<&BackupStore>) -> BackupLocation {
    let log_backup = crate::lifecycle::backups::log_backup_flags(store);
    match store {
        Some(store) => BackupLocation {
            url: store.url.clone(),
            env: store.env(),
            log_backup,
        },
        None => BackupLocation {
            url: backup_url(data_dir),
            env: vec![],
            log_backup,
        },
    }
}

/// What the user should know of a `backupStore` the runtime cannot follow to the letter:
/// its `credentialsSecret` names a Kubernetes Secret, and the runtime has none to read, so the
/// servers take the credentials from the runtime's own environment. None: nothing to say.
pub fn backup_store_notice(instance: &str, store: Option<&BackupStore>) -> Option<String> {
    let secret = store?.credentials_secret.as_ref()?;
    let missing: Vec<&str> = ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]
        .into_iter()
        .filter(|k| std::env::var_os(k).is_none())
        .collect();
    Some(format!(
        "instance {instance}: backupStore.credentialsSecret {secret:?} is a Kubernetes Secret; \
         the local runtime's servers take AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and \
         AWS_SESSION_TOKEN from the runtime's own environment instead{}",
        if missing.is_empty() {
            String::new()
        } else {
            format!(" (not set there: {})", missing.join(", "))
        }
    ))
}

/// The tablet server's command line (without the program). Pure.
pub fn server_args(spec: &ServerSpec, etcd_url: &str) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "--cluster".into(),
        spec.cluster.clone(),
        "--etcd".into(),
        etcd_url.into(),
        "--namespace".into(),
        spec.namespace.clone(),
        "--instance".into(),
        spec.instance.clone(),
        "--project".into(),
        spec.project.clone(),
        "--server-id".into(),
        spec.name(),
        "--data-dir".into(),
        spec.data_dir.display().to_string(),
        "--listen".into(),
        spec.grpc.to_string(),
        "--http-listen".into(),
        spec.http.to_string(),
        "--advertise-address".into(),
        spec.grpc.to_string(),
        "--backup-url".into(),
        spec.backup.url.clone(),
    ];
    for (flag, value) in &spec.backup.log_backup {
        args.extend([flag.to_string(), value.clone()]);
    }
    if let Some(m) = spec.cpu_millicores {
        args.extend(["--cpu-allocation-millicores".into(), m.to_string()]);
    }
    args.extend(spec.security.iter().cloned());
    args
}

/// The CPU allocation of a Cluster's servers in millicores: `resources.requests.cpu`, else
/// `resources.limits.cpu` (None: neither). Pure.
pub fn cpu_millicores(spec: &crate::crd::ClusterSpec) -> Option<u64> {
    let r = spec.resources.as_ref()?;
    let get = |m: &Option<
        std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    >| {
        m.as_ref()?
            .get("cpu")
            .and_then(|q| crate::quantity::parse_cpu_millicores(&q.0))
    };
    get(&r.requests).or_else(|| get(&r.limits))
}

/// The tablet server binary: `BASALT_TABLET_SERVER_BIN` if set, else `basalt-tablet-server`
/// next to this executable (as cargo and a release archive place them), else the one on PATH.
pub fn tablet_server_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os(TABLET_SERVER_BIN_ENV) {
        return PathBuf::from(bin);
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join(TABLET_SERVER_BIN)))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(TABLET_SERVER_BIN))
}

/// The supervised server.
pub fn process_spec(spec: &ServerSpec, etcd_url: &str, logs: &Path, program: &Path) -> ProcessSpec {
    ProcessSpec {
        name: spec.name(),
        program: program.to_path_buf(),
        args: server_args(spec, etcd_url),
        log: logs.join(format!("{}.log", spec.name())),
        ready_probe: Some((spec.http, "/readyz".into())),
        grace: STOP_GRACE,
        env: spec.backup.env.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_the_contract() {
        let spec = ServerSpec {
            namespace: "shop".into(),
            instance: "orders-prod".into(),
            project: "acme".into(),
            cluster: "orders-c1".into(),
            ordinal: 2,
            data_dir: server_data_dir(Path::new("/d"), "shop", "orders-c1", 2),
            grpc: "127.0.0.1:4001".parse().unwrap(),
            http: "127.0.0.1:4002".parse().unwrap(),
            cpu_millicores: None,
            security: vec![],
            backup: backup_location(Path::new("/d"), None),
        };
        assert_eq!(
            server_args(&spec, "http://127.0.0.1:2379").join(" "),
            "--cluster orders-c1 --etcd http://127.0.0.1:2379 --namespace shop --instance orders-prod \
             --project acme --server-id orders-c1-2 --data-dir /d/servers/shop/orders-c1-2 \
             --listen 127.0.0.1:4001 --http-listen 127.0.0.1:4002 --advertise-address 127.0.0.1:4001 \
             --backup-url file:///d/backups"
        );
        assert_eq!(spec.key(), "shop/orders-c1-2");
        let allocated = ServerSpec {
            cpu_millicores: Some(250),
            ..spec.clone()
        };
        assert!(
            server_args(&allocated, "http://127.0.0.1:2379")
                .join(" ")
                .ends_with("--backup-url file:///d/backups --cpu-allocation-millicores 250")
        );
        let cluster: crate::crd::ClusterSpec = serde_norway::from_str(
            "{instanceRef: i, serveNodes: 1, resources: {requests: {cpu: 250m}, limits: {cpu: '2'}}}",
        )
        .unwrap();
        assert_eq!(cpu_millicores(&cluster), Some(250));
        let limited: crate::crd::ClusterSpec = serde_norway::from_str(
            "{instanceRef: i, serveNodes: 1, resources: {limits: {cpu: '2'}}}",
        )
        .unwrap();
        assert_eq!(cpu_millicores(&limited), Some(2000));
        let p = process_spec(
            &spec,
            "http://127.0.0.1:2379",
            Path::new("/d/logs"),
            Path::new("/bin/ts"),
        );
        assert_eq!(p.log, Path::new("/d/logs/orders-c1-2.log"));
        assert_eq!(p.ready_probe, Some((spec.http, "/readyz".to_string())));
        assert!(p.env.is_empty());
    }

    #[test]
    fn an_instances_backup_store_overrides_the_runtimes_directory() {
        let default = backup_location(Path::new("/d"), None);
        assert_eq!(
            default,
            BackupLocation {
                url: "file:///d/backups".into(),
                env: vec![],
                log_backup: vec![],
            }
        );
        let store: BackupStore = serde_norway::from_str(
            "{url: 's3://basalt-backups/orders', endpoint: 'http://127.0.0.1:8333', region: eu-west-1, credentialsSecret: creds}",
        )
        .unwrap();
        let located = backup_location(Path::new("/d"), Some(&store));
        assert_eq!(located.url, "s3://basalt-backups/orders");
        assert_eq!(
            located.env,
            [
                ("AWS_ENDPOINT_URL", "http://127.0.0.1:8333"),
                ("AWS_ALLOW_HTTP", "true"),
                ("AWS_REGION", "eu-west-1"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string()))
        );
        // No Secret to read locally: the user is told where the credentials come from.
        let notice = backup_store_notice("orders", Some(&store)).unwrap();
        assert!(
            notice.starts_with("instance orders: backupStore.credentialsSecret \"creds\"")
                && notice.contains("runtime's own environment"),
            "{notice}"
        );
        let without = BackupStore {
            credentials_secret: None,
            ..store
        };
        assert_eq!(backup_store_notice("orders", Some(&without)), None);
        assert_eq!(backup_store_notice("orders", None), None);
    }

    #[test]
    fn log_backup_adds_the_point_in_time_recovery_flags() {
        let spec = |store: Option<&str>| {
            let store: Option<BackupStore> = store.map(|s| serde_norway::from_str(s).unwrap());
            ServerSpec {
                namespace: "shop".into(),
                instance: "orders-prod".into(),
                project: "acme".into(),
                cluster: "orders-c1".into(),
                ordinal: 0,
                data_dir: server_data_dir(Path::new("/d"), "shop", "orders-c1", 0),
                grpc: "127.0.0.1:4001".parse().unwrap(),
                http: "127.0.0.1:4002".parse().unwrap(),
                cpu_millicores: Some(250),
                security: vec![],
                backup: backup_location(Path::new("/d"), store.as_ref()),
            }
        };
        let line =
            |store: Option<&str>| server_args(&spec(store), "http://127.0.0.1:2379").join(" ");
        assert!(
            line(Some("{url: 'file:///b', logBackup: {}}")).ends_with(
                "--backup-url file:///b --log-backup-interval-secs 30 \
                 --log-backup-retention-secs 604800 --cpu-allocation-millicores 250"
            ),
            "{}",
            line(Some("{url: 'file:///b', logBackup: {}}"))
        );
        assert!(
            line(Some(
                "{url: 'file:///b', logBackup: {intervalSeconds: 5, retention: 2h}}"
            ))
            .contains("--log-backup-interval-secs 5 --log-backup-retention-secs 7200")
        );
        // Without logBackup (or without a backupStore at all): no flag, the servers' default.
        for store in [Some("{url: 'file:///b'}"), None] {
            assert!(!line(store).contains("--log-backup"), "{store:?}");
        }
    }
}
