//! An instance's endpoint: what a Kubernetes Service is to the instance's pods. A TCP proxy
//! on 127.0.0.1 that hands each accepted connection to the next ready server of the instance
//! (round robin over every cluster's servers); a server that is not ready, or whose port
//! refuses, is skipped. A gRPC client keeps its connection, so like a Service this spreads
//! connections, not requests — every server accepts every request and routes it itself.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};

use super::process::ProcessState;

/// How long a connection to one server may take before the next is tried.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// One server behind the endpoint.
#[derive(Debug, Clone)]
pub struct Backend {
    pub name: String,
    pub grpc: SocketAddr,
    pub state: Arc<ProcessState>,
}

/// The servers behind an endpoint; more are added when a cluster scales out or a cluster is
/// added, and a server leaves when a scale-in stops it.
#[derive(Debug, Default)]
pub struct Backends {
    servers: RwLock<Vec<Backend>>,
    next: AtomicUsize,
}

impl Backends {
    pub fn add(&self, backend: Backend) {
        self.servers
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(backend);
    }

    /// Takes server `name` out: no new connection goes to it.
    pub fn remove(&self, name: &str) {
        self.servers
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|b| b.name != name);
    }

    /// The ready servers in the order to try them for the next connection.
    fn candidates(&self) -> Vec<Backend> {
        let servers = self.servers.read().unwrap_or_else(|e| e.into_inner());
        let ready: Vec<bool> = servers.iter().map(|b| b.state.ready()).collect();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        round_robin(&ready, start)
            .into_iter()
            .map(|i| servers[i].clone())
            .collect()
    }
}

/// The indexes of the ready servers, starting with the first ready one at or after
/// `start % n` and wrapping around. Pure.
pub fn round_robin(ready: &[bool], start: usize) -> Vec<usize> {
    let n = ready.len();
    if n == 0 {
        return vec![];
    }
    (0..n)
        .map(|k| (start + k) % n)
        .filter(|&i| ready[i])
        .collect()
}

/// Accepts connections until the task is aborted.
pub async fn serve(listener: TcpListener, backends: Arc<Backends>) {
    loop {
        let (client, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(error) => {
                tracing::warn!(%error, "endpoint: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let backends = backends.clone();
        tokio::spawn(async move {
            let _ = client.set_nodelay(true);
            forward(client, peer, &backends).await;
        });
    }
}

async fn forward(mut client: TcpStream, peer: SocketAddr, backends: &Backends) {
    for backend in backends.candidates() {
        let connected =
            tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(backend.grpc)).await;
        match connected {
            Ok(Ok(mut server)) => {
                let _ = server.set_nodelay(true);
                tracing::debug!(%peer, server = %backend.name, "endpoint: connection forwarded");
                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                return;
            }
            _ => {
                tracing::debug!(%peer, server = %backend.name, "endpoint: server refused; trying the next")
            }
        }
    }
    // Like a Service without ready endpoints: the connection is closed.
    tracing::debug!(%peer, "endpoint: no ready server; connection closed");
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[test]
    fn round_robin_skips_servers_that_are_not_ready() {
        assert_eq!(round_robin(&[true, true, true], 0), [0, 1, 2]);
        assert_eq!(round_robin(&[true, true, true], 4), [1, 2, 0]);
        assert_eq!(round_robin(&[true, false, true], 1), [2, 0]);
        assert!(round_robin(&[false, false], 0).is_empty());
        assert!(round_robin(&[], 3).is_empty());
    }

    /// A server that answers every connection with its name.
    async fn named_server(name: &'static str) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (mut c, _) = l.accept().await.unwrap();
                c.write_all(name.as_bytes()).await.unwrap();
            }
        });
        addr
    }

    fn ready_state(ready: bool) -> Arc<ProcessState> {
        let s = ProcessState::default();
        s.set_ready(ready);
        Arc::new(s)
    }

    #[tokio::test]
    async fn connections_are_spread_over_ready_servers_and_refusing_ones_skipped() {
        let backends = Arc::new(Backends::default());
        let refused = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        backends.add(Backend {
            name: "a".into(),
            grpc: named_server("a").await,
            state: ready_state(true),
        });
        backends.add(Backend {
            name: "gone".into(),
            grpc: refused,
            state: ready_state(true),
        });
        backends.add(Backend {
            name: "b".into(),
            grpc: named_server("b").await,
            state: ready_state(true),
        });
        backends.add(Backend {
            name: "starting".into(),
            grpc: named_server("starting").await,
            state: ready_state(false),
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = listener.local_addr().unwrap();
        let task = tokio::spawn(serve(listener, backends.clone()));
        let mut seen = vec![];
        for _ in 0..4 {
            let mut c = TcpStream::connect(endpoint).await.unwrap();
            let mut buf = [0u8; 16];
            let n = c.read(&mut buf).await.unwrap();
            seen.push(String::from_utf8_lossy(&buf[..n]).to_string());
        }
        assert_eq!(seen, ["a", "b", "b", "a"]);
        // A server taken out receives nothing more.
        backends.remove("b");
        for _ in 0..3 {
            let mut c = TcpStream::connect(endpoint).await.unwrap();
            let mut buf = [0u8; 16];
            let n = c.read(&mut buf).await.unwrap();
            assert_eq!(&buf[..n], b"a");
        }
        task.abort();
    }
}
