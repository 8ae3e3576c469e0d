//! The runtime's one-member etcd (Debian's `etcd` 3.4, or `BASALT_ETCD_BIN`): the instances'
//! coordination store, as on Kubernetes, in `DIR/etcd` with its log in `DIR/logs/etcd.log`.
//!
//! Its client and peer ports are chosen free at the first start and kept in `ports.json`. A
//! restart on the same directory reuses the member with the same URLs. If a remembered port
//! is taken, the runtime refuses to start and says which: picking new ports would need
//! `--force-new-cluster`, which rewrites the member's cluster membership — not something to
//! do behind a user's back on the store that says who owns which tablet.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use basalt_transport::Security;

use super::process::ProcessSpec;

/// The environment variable that names another etcd binary.
pub const ETCD_BIN_ENV: &str = "BASALT_ETCD_BIN";
/// etcd's default binary.
pub const DEFAULT_ETCD_BIN: &str = "/usr/bin/etcd";
/// The member's name.
pub const MEMBER: &str = "basalt-local";
/// The backend quota: etcd's own default (2 GiB), stated so it does not change under us. The
/// catalog, tablet records and registrations of a local runtime stay far below it.
pub const QUOTA_BACKEND_BYTES: u64 = 2 * 1024 * 1024 * 1024;
/// How long etcd gets to answer `/health` after a start.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);

/// The etcd binary: `BASALT_ETCD_BIN`, else `/usr/bin/etcd`.
pub fn etcd_bin() -> PathBuf {
    std::env::var_os(ETCD_BIN_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_ETCD_BIN))
}

/// etcd's ports on 127.0.0.1: clients', its peer port (no peer ever connects: one member),
/// and, when clients speak TLS, a port of its own for `/health` and `/metrics` (plaintext, for
/// the readiness probe; otherwise they are on the client port). One port fewer to choose when
/// none is needed: a port chosen free can be taken by anything before etcd binds it.
/// client port speaks TLS).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EtcdPorts {
    pub client: u16,
    pub peer: u16,
    pub metrics: Option<u16>,
}

/// etcd's client URL on 127.0.0.1, with the scheme of `security` (how clients reach it).
pub fn client_url(client_port: u16, security: &Security) -> String {
    security.url(&format!("127.0.0.1:{client_port}"))
}

/// etcd's command line (without the program); `tls`: its TLS flags
/// ([`super::security::etcd_server_args`]), with `security` the clients' TLS. Pure.
pub fn etcd_args(
    data_dir: &Path,
    ports: EtcdPorts,
    security: &Security,
    tls: &[String],
) -> Vec<String> {
    let client = client_url(ports.client, security);
    let peer = Security::Plaintext.url(&format!("127.0.0.1:{}", ports.peer));
    let args: Vec<String> = [
        "--name",
        MEMBER,
        "--data-dir",
        &data_dir.join("etcd").display().to_string(),
        "--listen-client-urls",
        &client,
        "--advertise-client-urls",
        &client,
        "--listen-peer-urls",
        &peer,
        "--initial-advertise-peer-urls",
        &peer,
        "--initial-cluster",
        &format!("{MEMBER}={peer}"),
        "--quota-backend-bytes",
        &QUOTA_BACKEND_BYTES.to_string(),
        // Keep one hour of history: old revisions of tablet records are of no use.
        "--auto-compaction-mode",
        "periodic",
        "--auto-compaction-retention",
        "1h",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let metrics: Vec<String> = match ports.metrics {
        Some(port) => vec![
            "--listen-metrics-urls".into(),
            Security::Plaintext.url(&format!("127.0.0.1:{port}")),
        ],
        None => vec![],
    };
    [args, metrics, tls.to_vec()].concat()
}

/// The supervised etcd.
pub fn process_spec(
    data_dir: &Path,
    ports: EtcdPorts,
    security: &Security,
    tls: &[String],
) -> ProcessSpec {
    ProcessSpec {
        name: "etcd".into(),
        program: etcd_bin(),
        args: etcd_args(data_dir, ports, security, tls),
        log: data_dir.join("logs").join("etcd.log"),
        ready_probe: Some((
            SocketAddr::from(([127, 0, 0, 1], ports.metrics.unwrap_or(ports.client))),
            "/health".into(),
        )),
        // etcd stops in well under a second; servers are stopped before it.
        grace: Duration::from_secs(10),
        env: vec![],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_member_on_the_remembered_ports() {
        let ports = EtcdPorts {
            client: 2379,
            peer: 2380,
            metrics: None,
        };
        let args = etcd_args(Path::new("/d"), ports, &Security::Plaintext, &[]).join(" ");
        assert_eq!(
            args,
            "--name basalt-local --data-dir /d/etcd \
             --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
             --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
             --initial-cluster basalt-local=http://127.0.0.1:2380 --quota-backend-bytes 2147483648 \
             --auto-compaction-mode periodic --auto-compaction-retention 1h"
        );
        let spec = process_spec(Path::new("/d"), ports, &Security::Plaintext, &[]);
        assert_eq!(spec.log, Path::new("/d/logs/etcd.log"));
        assert_eq!(
            spec.ready_probe,
            Some(("127.0.0.1:2379".parse().unwrap(), "/health".to_string()))
        );
        // With TLS on the client port, /health is probed on a plaintext metrics port.
        let tls = EtcdPorts {
            metrics: Some(2381),
            ..ports
        };
        let args = etcd_args(Path::new("/d"), tls, &Security::Plaintext, &["--x".into()]);
        assert!(
            args.join(" ")
                .ends_with("--listen-metrics-urls http://127.0.0.1:2381 --x"),
            "{args:?}"
        );
        assert_eq!(
            process_spec(Path::new("/d"), tls, &Security::Plaintext, &[]).ready_probe,
            Some(("127.0.0.1:2381".parse().unwrap(), "/health".to_string()))
        );
    }
}
