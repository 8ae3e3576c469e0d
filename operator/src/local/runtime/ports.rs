//! The ports the runtime settles before anything starts (etcd's, each instance's endpoint),
//! the endpoint's listener, and the log tail shown when a process fails to start.

use super::*;

/// The last `lines` lines of a log file.
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// etcd's ports (`tls`: it also gets a plaintext metrics port for its readiness probe).
pub(super) fn etcd_ports(ports: &mut PortBook, tls: bool) -> anyhow::Result<etcd::EtcdPorts> {
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
    let metrics = match (tls, ports.etcd_metrics) {
        (false, _) => None,
        (true, Some(p)) => Some(p),
        (true, None) => {
            let p = ports.free_port(&BTreeSet::new())?;
            ports.etcd_metrics = Some(p);
            Some(p)
        }
    };
    let named = [
        ("client", Some(client)),
        ("peer", Some(peer)),
        ("metrics", metrics),
    ];
    for (what, port) in named.into_iter().filter_map(|(w, p)| Some((w, p?))) {
        if state::port_in_use(port) {
            bail!(
                "etcd's {what} port 127.0.0.1:{port} (remembered in {}) is in use: stop what uses it. \
                 The runtime does not move etcd to new ports by itself: its member's URLs are part of its data.",
                state::PORTS_JSON
            );
        }
    }
    Ok(etcd::EtcdPorts {
        client,
        peer,
        metrics,
    })
}

pub(super) fn endpoint_addr(
    ports: &mut PortBook,
    instance: &LocalInstance,
) -> anyhow::Result<SocketAddr> {
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

pub(super) async fn bind_endpoint(
    addr: SocketAddr,
    instance: &LocalInstance,
) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr).await.with_context(|| {
        format!(
            "cannot listen on {addr} for instance {}'s endpoint (is a standalone basalt-tablet-server or another runtime using it? stop it, or pass --endpoint)",
            instance.name
        )
    })
}
