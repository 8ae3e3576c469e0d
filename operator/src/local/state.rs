//! The files the runtime keeps in its data directory:
//!
//! * `local.json` ([`LocalState`]): what runs where, for people and tools (`local apply`,
//!   `local status`, tests). Rewritten atomically (temporary file + rename) on every change:
//!   a server started or restarted, an apply. After a clean stop it stays, with every `pid`
//!   null and no `control` address.
//! * `ports.json` ([`PortBook`]): the ports chosen at first start, so that a restarted
//!   runtime keeps etcd's member URLs and every server its addresses (the tablet map in etcd
//!   holds server addresses).
//!
//! Every field is documented here; both files are JSON with camelCase keys.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::TcpListener;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The name of the state file in the data directory.
pub const LOCAL_JSON: &str = "local.json";
/// The name of the port assignments in the data directory.
pub const PORTS_JSON: &str = "ports.json";
/// What a Prometheus server scrapes (`file_sd_configs`): every tablet server's and master's
/// metrics address, rewritten with `local.json`.
pub const PROMETHEUS_TARGETS_JSON: &str = "prometheus-targets.json";

/// `local.json`.
/// Where an app profile routes now ([`crate::lifecycle::routing::RoutesNow`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProfileRoutes {
    pub routes_to: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unavailable_clusters: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LocalState {
    /// etcd's client URL, `http://127.0.0.1:C`.
    pub etcd: String,
    /// etcd's pid (null while it is down).
    pub etcd_pid: Option<u32>,
    /// `127.0.0.1:K`, the control HTTP server `local apply` posts to (null once stopped).
    pub control: Option<String>,
    /// The runtime's pid (null once stopped).
    pub pid: Option<u32>,
    /// By instance name.
    pub instances: BTreeMap<String, InstanceState>,
    /// The runtime's CA and its own certificate (null: nothing speaks TLS). With it, etcd's
    /// URL is `https://` when etcd speaks TLS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<LocalTls>,
}

/// The runtime's TLS material, as `local status` dials with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LocalTls {
    /// The CA certificate every certificate of the runtime chains to.
    pub ca: PathBuf,
    /// The runtime's own client certificate.
    pub operator: super::security::CertFiles,
}

/// A secured instance's credentials for its clients.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceSecurityState {
    /// The CA the servers' certificates chain to (a client's root of trust).
    pub ca: PathBuf,
    /// Each identity's principal, certificate, key and token file, by name.
    pub identities: BTreeMap<String, super::security::IdentityFiles>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceState {
    pub namespace: String,
    /// `127.0.0.1:P`: set `BIGTABLE_EMULATOR_HOST` to it.
    pub endpoint: String,
    /// `projects/P/instances/I`.
    pub resource_name: String,
    /// By cluster name.
    pub clusters: BTreeMap<String, ClusterState>,
    /// Table id → how its last sync went (`synced`, `pending: <why>`, `refused: <why>`).
    #[serde(default)]
    pub tables: BTreeMap<String, String>,
    /// `Backup <name>` / `BackupSchedule <name>` → where it stands (`Ready, N bytes as of T`,
    /// a schedule's next run and backups).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub backups: BTreeMap<String, String>,
    /// App profile id → its spec as declared.
    #[serde(default)]
    pub app_profiles: BTreeMap<String, crate::crd::AppProfileSpec>,
    /// App profile id → where it routes now (as an AppProfile's status says on Kubernetes),
    /// read from etcd every second.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub routing: BTreeMap<String, ProfileRoutes>,
    /// The instance's master process (`basalt-operator master`).
    #[serde(default)]
    pub master: MasterState,
    /// With several clusters: how far each cluster's writes reached each other cluster, as
    /// read from etcd every second (as in the Instance's status).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replication: Vec<crate::crd::ReplicationStatus>,
    /// Clusters being seeded (as in the Instance's status).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub seeding: Vec<crate::crd::SeedingStatus>,
    /// With TLS (`spec.security`): the credentials clients connect with (null: plaintext,
    /// no authentication).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security: Option<InstanceSecurityState>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MasterState {
    /// The process now (null between an exit and its restart, and once stopped).
    pub pid: Option<u32>,
    /// How many times the runtime restarted it after it exited.
    pub restarts: u32,
    /// Where it serves its Prometheus metrics (`/metrics`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterState {
    /// How many servers the cluster keeps (during a scale-in: the count it shrinks to).
    pub serve_nodes: i32,
    /// The servers running, in ordinal order (during a scale-in also the draining ones).
    pub servers: Vec<ServerState>,
    /// The scale-in under way (null when none is).
    #[serde(default)]
    pub scale_in: Option<ScaleInState>,
    /// The cluster is being removed from its instance (null when it is not).
    #[serde(default)]
    pub removing: Option<RemovingState>,
    /// With `autoscaling`: the autoscaler's last decision, as the master recorded it (the
    /// nodes, the recommendation, its dimension and inputs, what holds it back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaler: Option<basalt_meta::AutoscalerRecord>,
}

/// A cluster a `local apply` left out, on its way out of the instance: its servers run until
/// every write they logged is in a cluster that stays, then stop, then it is released. The
/// reasons are those of the Kubernetes Cluster's `Removing` condition.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RemovingState {
    /// `UnshippedWrites` (its servers hold writes no staying cluster has, or have not
    /// reported since their client writes were routed away), `StoppingServers`, or
    /// `MetadataStoreUnreachable`.
    pub reason: String,
    /// What it waits for, in words (which server holds which entries for which cluster).
    pub message: String,
}

/// A scale-in under way: the servers of ordinal `to` and above give their tablets away
/// (moved by the master), and each is stopped once the cluster's tablet map in etcd says it
/// owns none.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScaleInState {
    /// The server count when the scale-in began.
    pub from: i32,
    /// The count it shrinks to (`serveNodes`).
    pub to: i32,
    /// The leaving servers still running, by name (they stop once they own no tablet).
    pub draining: Vec<String>,
    /// The leaving servers already stopped.
    #[serde(default)]
    pub stopped: Vec<String>,
    /// Tablets the leaving servers still own or that move to or from them (refreshed every
    /// second).
    pub remaining_tablets: usize,
    /// Why the drain cannot go on now (null while it can).
    pub blocked: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServerState {
    /// `<cluster>-<ordinal>`, also its `--server-id`.
    pub name: String,
    /// `127.0.0.1:G`: data, admin and control APIs.
    pub grpc: String,
    /// `127.0.0.1:H`: /readyz, /healthz, /metrics.
    pub http: String,
    /// The process now (null between an exit and its restart, and once stopped).
    pub pid: Option<u32>,
    pub data_dir: String,
    /// How many times the runtime restarted it after it exited.
    pub restarts: u32,
    /// Tablets it owns, as the cluster's tablet map in etcd says (refreshed every second).
    #[serde(default)]
    pub tablets: u32,
}

impl LocalState {
    /// Every server, with its instance and cluster.
    pub fn servers(&self) -> impl Iterator<Item = (&str, &str, &ServerState)> {
        self.instances.iter().flat_map(|(i, inst)| {
            inst.clusters.iter().flat_map(move |(c, cluster)| {
                cluster
                    .servers
                    .iter()
                    .map(move |s| (i.as_str(), c.as_str(), s))
            })
        })
    }
}

/// Reads `DIR/local.json`.
pub fn read(data_dir: &Path) -> anyhow::Result<LocalState> {
    let path = data_dir.join(LOCAL_JSON);
    let text = std::fs::read_to_string(&path).map_err(|e| {
        anyhow::anyhow!(
            "cannot read {}: {e} (is a runtime running on this --data-dir? start one with `basalt-operator local -f MANIFESTS --data-dir {}`)",
            path.display(),
            data_dir.display()
        )
    })?;
    serde_json::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{} is not a runtime's state: {e}", path.display()))
}

/// Writes `value` as pretty JSON to `path` atomically: a reader sees the old file or the new
/// one, never a part.
pub fn write_json_atomic<T: Serialize>(path: &Path, value: &T) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut text = serde_json::to_string_pretty(value).map_err(io::Error::other)?;
    text.push('\n');
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

// ------------------------------------------------------------------------------- ports.json

/// A server's two ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerPorts {
    pub grpc: u16,
    pub http: u16,
}

/// `ports.json`: every port the runtime chose, kept across restarts of the runtime.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortBook {
    /// etcd's client port.
    pub etcd_client: Option<u16>,
    /// etcd's peer port: part of the member's identity in its data directory.
    pub etcd_peer: Option<u16>,
    /// etcd's `/health` and `/metrics` port (plaintext).
    #[serde(default)]
    pub etcd_metrics: Option<u16>,
    /// The endpoints of instances other than the first (the first is 127.0.0.1:8086 or
    /// `--endpoint`), by `<namespace>/<instance>`.
    #[serde(default)]
    pub endpoints: BTreeMap<String, u16>,
    /// By `<namespace>/<server name>`.
    #[serde(default)]
    pub servers: BTreeMap<String, ServerPorts>,
    /// The masters' metrics ports, by `<namespace>/<instance>`.
    #[serde(default)]
    pub masters: BTreeMap<String, u16>,
}

impl PortBook {
    pub fn load(data_dir: &Path) -> anyhow::Result<PortBook> {
        let path = data_dir.join(PORTS_JSON);
        match std::fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text)
                .map_err(|e| anyhow::anyhow!("{} is damaged: {e}", path.display())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(PortBook::default()),
            Err(e) => Err(anyhow::anyhow!("cannot read {}: {e}", path.display())),
        }
    }

    pub fn save(&self, data_dir: &Path) -> io::Result<()> {
        write_json_atomic(&data_dir.join(PORTS_JSON), self)
    }

    /// Every port in the book.
    pub fn used(&self) -> BTreeSet<u16> {
        let mut out: BTreeSet<u16> = self.endpoints.values().copied().collect();
        out.extend(self.etcd_client);
        out.extend(self.etcd_peer);
        out.extend(self.etcd_metrics);
        for s in self.servers.values() {
            out.insert(s.grpc);
            out.insert(s.http);
        }
        out.extend(self.masters.values());
        out
    }

    /// The metrics port of an instance's master, chosen now if it has none yet.
    pub fn master(&mut self, key: &str) -> io::Result<u16> {
        if let Some(p) = self.masters.get(key) {
            return Ok(*p);
        }
        let port = self.free_port(&BTreeSet::new())?;
        self.masters.insert(key.to_string(), port);
        Ok(port)
    }

    /// A free port on 127.0.0.1 the book does not hold yet (and `also_taken` does not list).
    pub fn free_port(&self, also_taken: &BTreeSet<u16>) -> io::Result<u16> {
        let used = self.used();
        for _ in 0..100 {
            let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
            if !used.contains(&port) && !also_taken.contains(&port) {
                return Ok(port);
            }
        }
        Err(io::Error::other("no free port on 127.0.0.1"))
    }

    /// The server's ports, chosen now if it has none yet.
    pub fn server(&mut self, key: &str) -> io::Result<ServerPorts> {
        if let Some(p) = self.servers.get(key) {
            return Ok(*p);
        }
        let grpc = self.free_port(&BTreeSet::new())?;
        let http = self.free_port(&BTreeSet::from([grpc]))?;
        let ports = ServerPorts { grpc, http };
        self.servers.insert(key.to_string(), ports);
        Ok(ports)
    }
}

/// One group of Prometheus's file-based service discovery.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetGroup {
    pub targets: Vec<String>,
    pub labels: BTreeMap<String, String>,
}

/// The Prometheus targets of `state` (`DIR/prometheus-targets.json`): per instance, its
/// master (`job="basalt-master"`) and each tablet server (`job="basalt-tablet-server"`),
/// labelled with the instance's namespace and name, and a server with its cluster and name —
/// the labels the servers put on their own series, so `up` names the server too (scrape with
/// `honor_labels: true`). Pure.
pub fn prometheus_targets(state: &LocalState) -> Vec<TargetGroup> {
    let mut groups = vec![];
    for (name, i) in &state.instances {
        let labels = |job: &str| {
            BTreeMap::from([
                ("job".to_string(), job.to_string()),
                ("basalt_namespace".to_string(), i.namespace.clone()),
                ("basalt_instance".to_string(), name.clone()),
            ])
        };
        if let Some(metrics) = &i.master.metrics {
            groups.push(TargetGroup {
                targets: vec![metrics.clone()],
                labels: labels("basalt-master"),
            });
        }
        for (cluster, c) in &i.clusters {
            for server in &c.servers {
                let mut labels = labels("basalt-tablet-server");
                labels.insert("basalt_cluster".into(), cluster.clone());
                labels.insert("basalt_server".into(), server.name.clone());
                groups.push(TargetGroup {
                    targets: vec![server.http.clone()],
                    labels,
                });
            }
        }
    }
    groups
}

/// Whether something listens on (or holds) `127.0.0.1:port`: a bind fails.
pub fn port_in_use(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_err()
}

// -------------------------------------------------------------------------------- processes

/// Whether `pid` is a live (not zombie) process whose command line contains `needle`
/// (Linux `/proc`; elsewhere: false).
pub fn process_matches(pid: u32, needle: &str) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The state follows the parenthesised command name.
    let zombie = stat
        .rsplit_once(')')
        .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
    if stat.is_empty() || zombie {
        return false;
    }
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    cmdline.contains(needle)
}

/// Whether `pid` is a live `basalt-operator local` runtime.
pub fn is_runtime(pid: u32) -> bool {
    process_matches(pid, "basalt-operator") && process_matches(pid, " local ")
}

/// `program` as the runtime would start it: a path with a directory must be a file; a bare
/// name is looked up in PATH.
pub fn find_program(program: &Path) -> Option<PathBuf> {
    if program.components().count() > 1 {
        return program.is_file().then(|| program.to_path_buf());
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// Processes a previous run on `data_dir` left behind (the runtime itself, etcd, servers),
/// as told by its `local.json`: starting again over them would put two processes on one
/// data directory.
pub fn leftovers(data_dir: &Path, previous: &LocalState) -> Vec<String> {
    let dir = data_dir.display().to_string();
    let mut out = vec![];
    if let Some(pid) = previous.pid
        && pid != std::process::id()
        && is_runtime(pid)
    {
        out.push(format!("the runtime (pid {pid})"));
    }
    if let Some(pid) = previous.etcd_pid
        && process_matches(pid, &dir)
    {
        out.push(format!("etcd (pid {pid})"));
    }
    for (name, instance) in &previous.instances {
        if let Some(pid) = instance.master.pid
            && process_matches(pid, &format!("master --etcd {} ", previous.etcd))
        {
            out.push(format!("the master of {name} (pid {pid})"));
        }
    }
    for (_, _, server) in previous.servers() {
        if let Some(pid) = server.pid
            && process_matches(pid, &server.data_dir)
        {
            out.push(format!("server {} (pid {pid})", server.name));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_json_has_the_documented_shape() {
        let state = LocalState {
            etcd: "http://127.0.0.1:2379".into(),
            etcd_pid: Some(10),
            control: Some("127.0.0.1:4000".into()),
            pid: Some(9),
            instances: BTreeMap::from([(
                "quickstart".to_string(),
                InstanceState {
                    namespace: "default".into(),
                    endpoint: "127.0.0.1:8086".into(),
                    resource_name: "projects/default/instances/quickstart".into(),
                    clusters: BTreeMap::from([(
                        "quickstart-c1".to_string(),
                        ClusterState {
                            serve_nodes: 1,
                            servers: vec![ServerState {
                                name: "quickstart-c1-0".into(),
                                grpc: "127.0.0.1:4001".into(),
                                http: "127.0.0.1:4002".into(),
                                pid: Some(1234),
                                data_dir: "/d/servers/default/quickstart-c1-0".into(),
                                restarts: 0,
                                tablets: 3,
                            }],
                            scale_in: None,
                            removing: None,
                            autoscaler: None,
                        },
                    )]),
                    tables: BTreeMap::from([("greetings".to_string(), "synced".to_string())]),
                    backups: BTreeMap::new(),
                    app_profiles: BTreeMap::new(),
                    routing: BTreeMap::new(),
                    master: MasterState {
                        pid: Some(1300),
                        restarts: 1,
                        metrics: None,
                    },
                    replication: vec![crate::crd::ReplicationStatus {
                        source: "quickstart-c1".into(),
                        destination: "quickstart-c2".into(),
                        max_delay_seconds: 0.25,
                        pending_writes: 3,
                    }],
                    seeding: vec![],
                    security: Some(InstanceSecurityState {
                        ca: "/d/tls/ca.pem".into(),
                        identities: BTreeMap::from([(
                            "admin".to_string(),
                            super::super::security::IdentityFiles {
                                principal: "user:admin@quickstart.default.basalt".into(),
                                cert: "/d/tls/default/quickstart/clients/admin/cert.pem".into(),
                                key: "/d/tls/default/quickstart/clients/admin/key.pem".into(),
                                token: "/d/tls/default/quickstart/clients/admin/token".into(),
                            },
                        )]),
                    }),
                },
            )]),
            tls: Some(LocalTls {
                ca: "/d/tls/ca.pem".into(),
                operator: super::super::security::CertFiles {
                    cert: "/d/tls/operator/cert.pem".into(),
                    key: "/d/tls/operator/key.pem".into(),
                },
            }),
        };
        let json = serde_json::to_value(&state).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "etcd": "http://127.0.0.1:2379",
                "etcdPid": 10,
                "control": "127.0.0.1:4000",
                "pid": 9,
                "instances": {"quickstart": {
                    "namespace": "default",
                    "endpoint": "127.0.0.1:8086",
                    "resourceName": "projects/default/instances/quickstart",
                    "clusters": {"quickstart-c1": {"serveNodes": 1, "servers": [{
                        "name": "quickstart-c1-0", "grpc": "127.0.0.1:4001",
                        "http": "127.0.0.1:4002", "pid": 1234,
                        "dataDir": "/d/servers/default/quickstart-c1-0", "restarts": 0,
                        "tablets": 3
                    }], "scaleIn": null, "removing": null}},
                    "tables": {"greetings": "synced"},
                    "appProfiles": {},
                    "master": {"pid": 1300, "restarts": 1},
                    "replication": [{"source": "quickstart-c1", "destination": "quickstart-c2",
                                     "maxDelaySeconds": 0.25, "pendingWrites": 3}],
                    "security": {"ca": "/d/tls/ca.pem", "identities": {"admin": {
                        "principal": "user:admin@quickstart.default.basalt",
                        "cert": "/d/tls/default/quickstart/clients/admin/cert.pem",
                        "key": "/d/tls/default/quickstart/clients/admin/key.pem",
                        "token": "/d/tls/default/quickstart/clients/admin/token"}}}
                }},
                "tls": {"ca": "/d/tls/ca.pem", "operator": {
                    "cert": "/d/tls/operator/cert.pem", "key": "/d/tls/operator/key.pem"}}
            })
        );
        let servers: Vec<(&str, &str, &str)> = state
            .servers()
            .map(|(i, c, s)| (i, c, s.name.as_str()))
            .collect();
        assert_eq!(
            servers,
            [("quickstart", "quickstart-c1", "quickstart-c1-0")]
        );
    }

    #[test]
    fn a_scale_in_is_recorded_with_its_progress() {
        let cluster = ClusterState {
            serve_nodes: 2,
            servers: vec![],
            scale_in: Some(ScaleInState {
                from: 5,
                to: 2,
                draining: vec!["c-3".into(), "c-4".into()],
                stopped: vec!["c-2".into()],
                remaining_tablets: 4,
                blocked: None,
            }),
            removing: None,
            autoscaler: None,
        };
        let json = serde_json::to_value(&cluster).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "serveNodes": 2, "servers": [],
                "scaleIn": {"from": 5, "to": 2, "draining": ["c-3", "c-4"], "stopped": ["c-2"],
                            "remainingTablets": 4, "blocked": null},
                "removing": null
            })
        );
        // local.json of a runtime from before scale-ins existed still reads.
        let old: ClusterState =
            serde_json::from_value(serde_json::json!({"serveNodes": 1, "servers": []})).unwrap();
        assert_eq!(old.scale_in, None);
    }

    #[test]
    fn files_are_replaced_whole_and_ports_are_remembered() {
        let dir = tempfile::tempdir().unwrap();
        let mut book = PortBook::default();
        let a = book.server("default/c-0").unwrap();
        let b = book.server("default/c-1").unwrap();
        assert_ne!(a.grpc, a.http);
        assert!(![b.grpc, b.http].contains(&a.grpc) && ![b.grpc, b.http].contains(&a.http));
        assert_eq!(book.server("default/c-0").unwrap(), a);
        book.save(dir.path()).unwrap();
        assert_eq!(PortBook::load(dir.path()).unwrap(), book);
        assert!(!dir.path().join("ports.json.tmp").exists());
        assert_eq!(
            PortBook::load(&dir.path().join("nowhere")).unwrap(),
            PortBook::default()
        );
    }

    #[test]
    fn only_live_processes_with_the_data_dir_are_leftovers() {
        let me = std::process::id();
        let exe = std::env::current_exe().unwrap().display().to_string();
        assert!(process_matches(me, &exe));
        assert!(!process_matches(me, "/no/such/dir"));
        assert!(!process_matches(u32::MAX, ""));
        let state = LocalState {
            pid: Some(me),
            ..LocalState::default()
        };
        // The runtime itself is never its own leftover.
        assert!(leftovers(Path::new("/no/such/dir"), &state).is_empty());
        assert!(!is_runtime(me));
        assert_eq!(
            find_program(Path::new("sh")).map(|p| p.is_file()),
            Some(true)
        );
        assert_eq!(find_program(Path::new("/no/such/program")), None);
        assert_eq!(find_program(Path::new("no-such-program-anywhere")), None);
    }
}
