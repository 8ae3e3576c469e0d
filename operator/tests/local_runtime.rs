//! `basalt-operator local` end to end: the real binary on a temporary directory with an
//! Instance, a Cluster of two servers and a Table, against Debian's etcd and the real
//! `basalt-tablet-server` (`$BASALT_BIN`, else `$CARGO_TARGET_DIR/release/basalt-tablet-server`,
//! else `target/release/…`; build it first with `cargo build --release -p basalt-tablet-server`).
//!
//! What a user sees: local.json with etcd and the servers' pids, etcd healthy, the servers
//! ready, the table listed through the instance's endpoint, a killed server restarted with a
//! new pid, the AppProfile in the instance's catalog in etcd, `local apply` adding a third
//! server and changing the profile's description (and refusing a scale-in), `local status`
//! listing the servers, and Ctrl-C (SIGINT) stopping every process with exit code 0. Every
//! wait is bounded; on failure the runtime's output and every process log are printed.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use basalt_meta::{AppProfilePriority, AppProfileRecord, AppProfileRouting, Keys, Meta};
use basalt_operator::local::http;
use basalt_operator::local::state::{self, LocalState};
use googleapis_tonic_google_bigtable_admin_v2::google::bigtable::admin::v2 as admin;

const WAIT: Duration = Duration::from_secs(60);
const INSTANCE: &str = "local-test";
const CLUSTER: &str = "local-test-c1";

fn manifest(serve_nodes: u32, description: &str) -> String {
    format!(
        r#"apiVersion: basalt.dev/v1alpha1
kind: Instance
metadata:
  name: {INSTANCE}
spec:
  displayName: Local test
  # Plaintext, as the emulator: a secured instance is e2e/test_security_local.py's.
  type: Development
---
apiVersion: basalt.dev/v1alpha1
kind: Cluster
metadata:
  name: {CLUSTER}
spec:
  instanceRef: {INSTANCE}
  serveNodes: {serve_nodes}
---
apiVersion: basalt.dev/v1alpha1
kind: Table
metadata:
  name: greetings
spec:
  instanceRef: {INSTANCE}
  columnFamilies:
    cf:
      gcRule:
        maxNumVersions: 1
---
apiVersion: basalt.dev/v1alpha1
kind: AppProfile
metadata:
  name: batch
spec:
  instanceRef: {INSTANCE}
  description: {description}
  priority: Low
  routing:
    singleClusterRouting:
      clusterId: {CLUSTER}
      allowTransactionalWrites: true
"#
    )
}

/// The app profiles in the instance's catalog in etcd.
async fn catalog_app_profiles(etcd: &str) -> Option<Vec<AppProfileRecord>> {
    let endpoints = basalt_meta::EtcdEndpoints::plaintext(&[etcd]).ok()?;
    let meta = Meta::connect(&endpoints, Keys::new("default", INSTANCE))
        .await
        .ok()?;
    meta.app_profiles().await.ok()
}

fn tablet_server_bin() -> PathBuf {
    let bin = if let Some(bin) = std::env::var_os("BASALT_BIN") {
        PathBuf::from(bin)
    } else if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        PathBuf::from(dir).join("release/basalt-tablet-server")
    } else {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release/basalt-tablet-server")
    };
    assert!(
        bin.is_file(),
        "{} does not exist: build it with `cargo build --release -p basalt-tablet-server`, or point BASALT_BIN at it",
        bin.display()
    );
    bin
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn alive(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    !stat.is_empty()
        && !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
}

fn signal(pid: u32, name: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .stderr(Stdio::null())
        .status();
}

/// The runtime under test; on a failed test it prints every log, and it never leaves a
/// process behind.
struct Runtime {
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Runtime {
    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn start(files: &Path, endpoint: SocketAddr) -> Runtime {
        let dir = tempfile::tempdir().unwrap();
        let out = std::fs::File::create(dir.path().join("runtime.out")).unwrap();
        let err = std::fs::File::create(dir.path().join("runtime.err")).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_basalt-operator"))
            .args(["local", "-f"])
            .arg(files)
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .arg("--endpoint")
            .arg(endpoint.to_string())
            .env("BASALT_TABLET_SERVER_BIN", tablet_server_bin())
            .env("RUST_LOG", "info,basalt_operator=debug")
            .env("NO_COLOR", "1")
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap();
        Runtime {
            dir,
            child: Some(child),
        }
    }

    fn state(&self) -> Option<LocalState> {
        state::read(&self.data_dir()).ok()
    }

    /// `basalt-operator local <args> --data-dir DIR`: (success, stdout + stderr).
    fn cli(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new(env!("CARGO_BIN_EXE_basalt-operator"))
            .arg("local")
            .args(args)
            .arg("--data-dir")
            .arg(self.data_dir())
            .env("RUST_BACKTRACE", "0")
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }

    fn print_logs(&self) {
        let mut files = vec![
            self.dir.path().join("runtime.out"),
            self.dir.path().join("runtime.err"),
        ];
        if let Ok(entries) = std::fs::read_dir(self.data_dir().join("logs")) {
            let mut logs: Vec<PathBuf> = entries.filter_map(|e| Some(e.ok()?.path())).collect();
            logs.sort();
            files.extend(logs);
        }
        files.push(self.data_dir().join("local.json"));
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap_or_else(|e| format!("({e})"));
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(80)..].join("\n");
            eprintln!("===== {} (last 80 lines)\n{tail}", f.display());
        }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.print_logs();
        }
        let pids: Vec<u32> = self
            .state()
            .map(|s| {
                s.servers()
                    .filter_map(|(_, _, server)| server.pid)
                    .chain(s.etcd_pid)
                    .collect()
            })
            .unwrap_or_default();
        if let Some(mut child) = self.child.take() {
            signal(child.id(), "INT");
            let deadline = Instant::now() + Duration::from_secs(40);
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        for pid in pids {
            if alive(pid) {
                signal(pid, "KILL");
            }
        }
    }
}

/// Polls `f` until it gives a value, for at most [`WAIT`].
async fn wait_for<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {WAIT:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn ready(http_addr: &str) -> bool {
    match http_addr.parse() {
        Ok(addr) => http::get(addr, "/readyz", Duration::from_secs(2))
            .await
            .is_ok_and(|r| r.status == 200),
        Err(_) => false,
    }
}

/// The test cluster's servers (none before the runtime recorded them).
fn servers(state: &LocalState) -> Vec<state::ServerState> {
    state
        .instances
        .get(INSTANCE)
        .and_then(|i| i.clusters.get(CLUSTER))
        .map(|c| c.servers.clone())
        .unwrap_or_default()
}

async fn list_tables(endpoint: SocketAddr, parent: &str) -> Result<Vec<String>, String> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{endpoint}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| e.to_string())?;
    let mut client = admin::bigtable_table_admin_client::BigtableTableAdminClient::new(channel);
    let tables = client
        .list_tables(admin::ListTablesRequest {
            parent: parent.into(),
            ..Default::default()
        })
        .await
        .map_err(|s| s.to_string())?
        .into_inner()
        .tables;
    Ok(tables.into_iter().map(|t| t.name).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_runtime_runs_restarts_scales_and_stops_the_manifests() {
    let manifests = tempfile::tempdir().unwrap();
    let file = manifests.path().join("instance.yaml");
    std::fs::write(&file, manifest(2, "batch jobs")).unwrap();
    let endpoint = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let mut rt = Runtime::start(&file, endpoint);

    // local.json: etcd and two servers with pids.
    let first = wait_for("local.json with etcd and two running servers", || {
        let s = rt.state();
        async move {
            let s = s?;
            let servers = servers(&s);
            (s.etcd_pid.is_some() && servers.len() == 2 && servers.iter().all(|x| x.pid.is_some()))
                .then_some(s)
        }
    })
    .await;
    assert_eq!(first.pid, Some(rt.child.as_ref().unwrap().id()));
    let instance = &first.instances[INSTANCE];
    assert_eq!(instance.endpoint, endpoint.to_string());
    assert_eq!(
        instance.resource_name,
        format!("projects/default/instances/{INSTANCE}")
    );
    let names: Vec<String> = servers(&first).iter().map(|s| s.name.clone()).collect();
    assert_eq!(names, [format!("{CLUSTER}-0"), format!("{CLUSTER}-1")]);

    // etcd answers healthy.
    let etcd: SocketAddr = first.etcd.strip_prefix("http://").unwrap().parse().unwrap();
    let health = http::get(etcd, "/health", Duration::from_secs(2))
        .await
        .unwrap();
    assert!(health.body.contains(r#""health":"true""#), "{health:?}");

    // Both servers become ready.
    for server in servers(&first) {
        wait_for(
            &format!("{} ready at {}/readyz", server.name, server.http),
            || {
                let http = server.http.clone();
                async move { ready(&http).await.then_some(()) }
            },
        )
        .await;
    }

    // The table is there, through the instance's endpoint.
    let parent = instance.resource_name.clone();
    let table = format!("{parent}/tables/greetings");
    wait_for("the table listed through the endpoint", || {
        let (parent, table) = (parent.clone(), table.clone());
        async move {
            list_tables(endpoint, &parent)
                .await
                .ok()
                .filter(|listed| listed.contains(&table))
        }
    })
    .await;

    // The app profile is in the instance's catalog in etcd.
    let expected = AppProfileRecord {
        id: "batch".into(),
        description: "batch jobs".into(),
        routing: AppProfileRouting::SingleClusterRouting {
            cluster_id: CLUSTER.into(),
            allow_transactional_writes: true,
        },
        priority: AppProfilePriority::Low,
    };
    let recorded = wait_for("the app profile in etcd", || {
        let etcd = first.etcd.clone();
        async move { catalog_app_profiles(&etcd).await.filter(|p| !p.is_empty()) }
    })
    .await;
    assert_eq!(recorded.len(), 1);
    assert_eq!(recorded[0], expected);

    // kill -9 of a server: restarted on its data dir and ports, with a new pid, ready again.
    let victim = servers(&first)[1].clone();
    let old_pid = victim.pid.unwrap();
    signal(old_pid, "KILL");
    let restarted = wait_for("the killed server restarted with a new pid", || {
        let server = rt
            .state()
            .and_then(|s| servers(&s).into_iter().find(|x| x.name == victim.name));
        async move { server.filter(|x| x.pid.is_some_and(|p| p != old_pid)) }
    })
    .await;
    assert!(restarted.restarts >= 1, "{restarted:?}");
    assert_eq!(
        (&restarted.grpc, &restarted.http, &restarted.data_dir),
        (&victim.grpc, &victim.http, &victim.data_dir)
    );
    wait_for("the restarted server ready again", || {
        let http = restarted.http.clone();
        async move { ready(&http).await.then_some(()) }
    })
    .await;

    // local apply: serveNodes 3 starts a third server; the app profile's new description
    // replaces its record in etcd.
    std::fs::write(&file, manifest(3, "nightly batch jobs")).unwrap();
    let (ok, out) = rt.cli(&["apply", "-f", file.to_str().unwrap()]);
    assert!(ok, "local apply failed:\n{out}");
    assert!(out.contains("scaled out from 2 to 3"), "{out}");
    assert!(out.contains("app profile batch recorded"), "{out}");
    assert!(!out.contains("not in the catalog"), "{out}");
    assert_eq!(
        catalog_app_profiles(&first.etcd).await.unwrap(),
        [AppProfileRecord {
            description: "nightly batch jobs".into(),
            ..expected
        }]
    );
    let third = wait_for("a third server in local.json", || {
        let s = rt.state();
        async move {
            let servers = servers(&s?);
            let third = servers.get(2)?.clone();
            third.pid.map(|_| third)
        }
    })
    .await;
    assert_eq!(third.name, format!("{CLUSTER}-2"));
    wait_for("the third server ready", || {
        let http = third.http.clone();
        async move { ready(&http).await.then_some(()) }
    })
    .await;

    // A scale-in is accepted as an intent (the master drains, then the servers stop); raised
    // back at once, it is cancelled and all three servers stay.
    std::fs::write(&file, manifest(1, "nightly batch jobs")).unwrap();
    let (ok, out) = rt.cli(&["apply", "-f", file.to_str().unwrap()]);
    assert!(ok, "a scale-in is accepted:\n{out}");
    assert!(out.contains("scaling in from 3 to 1 server(s)"), "{out}");
    std::fs::write(&file, manifest(3, "nightly batch jobs")).unwrap();
    let (ok, out) = rt.cli(&["apply", "-f", file.to_str().unwrap()]);
    assert!(ok, "raising serveNodes back is accepted:\n{out}");
    assert!(out.contains("cancelled"), "{out}");
    wait_for("three servers running again", || {
        let s = rt.state();
        async move {
            let servers = servers(&s?);
            (servers.len() == 3 && servers.iter().all(|s| s.pid.is_some())).then_some(())
        }
    })
    .await;

    // local status lists every server.
    let (ok, out) = rt.cli(&["status"]);
    assert!(ok, "local status failed:\n{out}");
    assert!(out.contains("running (pid"), "{out}");
    for i in 0..3 {
        assert!(out.contains(&format!("{CLUSTER}-{i}")), "{out}");
    }

    // Ctrl-C: exit 0, every server and etcd gone.
    let last = rt.state().unwrap();
    let mut pids: Vec<u32> = servers(&last).iter().filter_map(|s| s.pid).collect();
    pids.extend(last.etcd_pid);
    assert_eq!(pids.len(), 4);
    let mut child = rt.child.take().unwrap();
    signal(child.id(), "INT");
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the runtime did not stop within {WAIT:?} of SIGINT");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(status.success(), "the runtime exited with {status}");
    for pid in pids {
        assert!(
            !alive(pid),
            "pid {pid} still runs after the runtime stopped"
        );
    }
    assert!(
        http::get(etcd, "/health", Duration::from_secs(2))
            .await
            .is_err(),
        "etcd still answers"
    );
    let stopped = rt.state().unwrap();
    assert_eq!(stopped.pid, None);
    assert!(servers(&stopped).iter().all(|s| s.pid.is_none()));
}
