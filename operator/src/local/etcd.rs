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

/// etcd's client URL (plaintext on 127.0.0.1, as every local connection).
pub fn client_url(client_port: u16) -> String {
    Security::Plaintext.url(&format!("127.0.0.1:{client_port}"))
}

/// etcd's command line (without the program). Pure.
pub fn etcd_args(data_dir: &Path, client_port: u16, peer_port: u16) -> Vec<String> {
    let client = client_url(client_port);
    let peer = Security::Plaintext.url(&format!("127.0.0.1:{peer_port}"));
    [
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
    .collect()
}

/// The supervised etcd.
pub fn process_spec(data_dir: &Path, client_port: u16, peer_port: u16) -> ProcessSpec {
    ProcessSpec {
        name: "etcd".into(),
        program: etcd_bin(),
        args: etcd_args(data_dir, client_port, peer_port),
        log: data_dir.join("logs").join("etcd.log"),
        ready_probe: Some((
            SocketAddr::from(([127, 0, 0, 1], client_port)),
            "/health".into(),
        )),
        // etcd stops in well under a second; servers are stopped before it.
        grace: Duration::from_secs(10),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_member_on_the_remembered_ports() {
        let args = etcd_args(Path::new("/d"), 2379, 2380).join(" ");
        assert_eq!(
            args,
            "--name basalt-local --data-dir /d/etcd \
             --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
             --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
             --initial-cluster basalt-local=http://127.0.0.1:2380 --quota-backend-bytes 2147483648 \
             --auto-compaction-mode periodic --auto-compaction-retention 1h"
        );
        let spec = process_spec(Path::new("/d"), 2379, 2380);
        assert_eq!(spec.log, Path::new("/d/logs/etcd.log"));
        assert_eq!(
            spec.ready_probe,
            Some(("127.0.0.1:2379".parse().unwrap(), "/health".to_string()))
        );
    }
}
