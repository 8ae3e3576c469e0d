//! Basalt's one transport seam: every process dials its peers, binds its gRPC listener and
//! reaches etcd through this crate, so that the connection policy (deadlines, keep-alive,
//! TCP_NODELAY) and the security of every connection are decided in one place.
//!
//! * [`Security`]: how connections are secured, and the URL scheme that follows from it
//!   (plaintext today);
//! * [`Dialer`]: a cache of lazily connected tonic channels by peer address, each built with
//!   the same policy, with a count of the channels made per peer;
//! * [`Security::server`] and [`incoming`]: a tonic server builder and a listener's incoming
//!   connections with the servers' side of the policy;
//! * `etcd` (feature `etcd`, used by `basalt-meta`): the etcd client URLs and connect options;
//! * [`filter`]: what tests put between a dialer and its peers (drop, delay, partition);
//!   production dialers have none.
//!
//! # TLS
//! [`Security::Tls`] holds the process's material ([`tls::Tls`], reloaded from its files when
//! they change, as TiKV's `SecurityManager` does). Then:
//! * [`Security::scheme`] answers `https`, so every URL built here changes at once;
//! * [`Dialer`] adds tonic's `ClientTlsConfig` (the CA, and this process's certificate as its
//!   client certificate) to each endpoint in [`Dialer::endpoint`], the one place an endpoint is
//!   built, and forgets its channels when the material was reloaded;
//! * [`incoming`] makes the handshake of every accepted connection with the material of that
//!   moment, and hands the client's certificate chain to the handlers ([`ConnInfo`]);
//! * [`EtcdEndpoints::connect_options`] gives etcd-client the same material (etcd's CA, and
//!   the certificate this process presents to etcd) when the etcd security is TLS.
//!
//! Nothing outside this crate writes a URL scheme: `e2e/run-tests` checks that no product code
//! spells `"http://"`.
//!
//! It depends on no RocksDB and no Kubernetes crate (`e2e/run-tests` checks it).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tonic::transport::{Channel, Endpoint, Server};

#[cfg(feature = "cli")]
pub mod cli;
#[cfg(feature = "etcd")]
pub mod etcd;
pub mod filter;
pub mod listener;
pub mod tls;

pub use filter::{Filter, Verdict};
pub use listener::{Conn, ConnInfo, Incoming, incoming};
pub use tls::{Tls, TlsError, TlsFiles};

/// The URL scheme of a plaintext connection (gRPC over HTTP/2 without TLS, etcd, HTTP).
const PLAINTEXT: &str = "http";
/// The URL scheme of a TLS connection.
const TLS: &str = "https";

/// How a process's connections are secured: the same for its clients and its servers.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub enum Security {
    /// No TLS, no client authentication: HTTP/2 in the clear. The process relies on its
    /// network (a Kubernetes namespace, 127.0.0.1 for the local runtime).
    #[default]
    Plaintext,
    /// TLS on every connection, with this material (see [`tls`]).
    Tls(Arc<Tls>),
}

impl PartialEq for Security {
    fn eq(&self, other: &Security) -> bool {
        match (self, other) {
            (Security::Plaintext, Security::Plaintext) => true,
            (Security::Tls(a), Security::Tls(b)) => a.files() == b.files(),
            _ => false,
        }
    }
}

impl Eq for Security {}

impl Security {
    /// TLS with the material in `files`, loaded now (an error names the file at fault).
    pub fn tls(files: TlsFiles) -> Result<Security, TlsError> {
        Ok(Security::Tls(Arc::new(Tls::load(files)?)))
    }

    /// The URL scheme of this process's connections: `http` (plaintext) or `https`.
    pub fn scheme(&self) -> &'static str {
        match self {
            Security::Plaintext => PLAINTEXT,
            Security::Tls(_) => TLS,
        }
    }

    /// The URL of `address` (`host:port`): `http://host:port`.
    pub fn url(&self, address: &str) -> String {
        format!("{}://{address}", self.scheme())
    }

    /// A tonic server builder with the servers' side of the policy: HTTP/2 keep-alive pings
    /// every [`KEEP_ALIVE_INTERVAL`] (a dead client's streams end instead of hanging). Serve
    /// it [`incoming`] connections: TCP_NODELAY (small replies must not wait for Nagle's
    /// algorithm) and the TLS handshake are theirs.
    pub fn server(&self) -> Server {
        Server::builder().http2_keepalive_interval(Some(KEEP_ALIVE_INTERVAL))
    }
}

/// A URL's scheme and what follows it (`host:port`, maybe a path): `Some(("http", "h:1"))` for
/// `http://h:1`, `None` for a URL of another scheme or none.
pub fn split_url(url: &str) -> Option<(&'static str, &str)> {
    [PLAINTEXT, TLS].into_iter().find_map(|scheme| {
        url.strip_prefix(scheme)
            .and_then(|rest| rest.strip_prefix("://"))
            .map(|rest| (scheme, rest))
    })
}

/// Why a peer cannot be dialled.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The address is not `host:port`.
    #[error("bad address {address:?}: {source}")]
    BadAddress {
        address: String,
        #[source]
        source: tonic::transport::Error,
    },
    /// A URL's scheme does not fit the process's security, or it is not a URL.
    #[error("bad URL {url:?}: {reason}")]
    BadUrl { url: String, reason: String },
    /// The TLS configuration does not apply to the endpoint.
    #[error("TLS to {address}: {source}")]
    Tls {
        address: String,
        #[source]
        source: tonic::transport::Error,
    },
}

/// How often an idle HTTP/2 connection is pinged, by clients and servers alike: a peer that
/// vanished (its host powered off, a network partition) is noticed within seconds instead of
/// at TCP's timeout, so a long stream (a tablet move, a scan) fails instead of hanging.
pub const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// How long a keep-alive ping may go unanswered before the connection is closed.
pub const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(20);
/// The connect timeout of [`Dialer::channel`].
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The deadlines of a channel: connecting, and optionally every call made on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Deadlines {
    /// How long a connection attempt may take.
    pub connect: Duration,
    /// How long each call may take (None: as long as the caller waits; a stream lasts as long
    /// as it needs, so callers of streams bound each call themselves).
    pub call: Option<Duration>,
}

impl Default for Deadlines {
    fn default() -> Self {
        Deadlines {
            connect: CONNECT_TIMEOUT,
            call: None,
        }
    }
}

impl Deadlines {
    /// `timeout` bounds connecting and each call.
    pub fn both(timeout: Duration) -> Deadlines {
        Deadlines {
            connect: timeout,
            call: Some(timeout),
        }
    }

    /// Only connecting is bounded.
    pub fn connect(timeout: Duration) -> Deadlines {
        Deadlines {
            connect: timeout,
            call: None,
        }
    }
}

/// How many channels a [`Dialer`] keeps before it forgets them all (addresses come and go with
/// pods; channels already handed out keep working).
pub const MAX_CHANNELS: usize = 1024;

/// Dials peers: one lazily connected channel per (address, deadlines), shared by every caller,
/// built with the process's [`Security`] and the one connection policy. Cheap to clone (the
/// clones share the cache).
///
/// A channel connects on its first call and reconnects after a failure. It belongs to the tokio
/// runtime it was made in: a `Dialer` must be used within one runtime (a process's, or a
/// test's).
#[derive(Clone, Debug, Default)]
pub struct Dialer {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    security: Security,
    /// Tests only: what happens to the traffic of this dialer's channels (None: nothing).
    filter: Option<Arc<dyn Filter>>,
    channels: Mutex<HashMap<(String, Deadlines), Channel>>,
    /// The generation of the TLS material the cached channels were built with.
    tls_generation: Mutex<u64>,
    /// The channels made per address (a cache miss is a dial).
    dials: Mutex<HashMap<String, u64>>,
}

/// A lock whose holder cannot leave the map inconsistent (a panic elsewhere is no reason to
/// stop dialling).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Dialer {
    pub fn new(security: Security) -> Dialer {
        Dialer {
            inner: Arc::new(Inner {
                security,
                ..Inner::default()
            }),
        }
    }

    /// A dialer whose channels' traffic `filter` passes, drops, delays or holds (tests: see
    /// [`filter`]). Its channels connect over TCP through the filter; otherwise they are
    /// built as [`Dialer::new`]'s are.
    pub fn with_filter(security: Security, filter: Arc<dyn Filter>) -> Dialer {
        Dialer {
            inner: Arc::new(Inner {
                security,
                filter: Some(filter),
                ..Inner::default()
            }),
        }
    }

    pub fn security(&self) -> &Security {
        &self.inner.security
    }

    /// The channel to the server at `address` (`host:port`) with the default [`Deadlines`]
    /// (connecting within [`CONNECT_TIMEOUT`], calls unbounded). Must be called inside a tokio
    /// runtime.
    pub fn channel(&self, address: &str) -> Result<Channel, TransportError> {
        self.channel_with(address, Deadlines::default())
    }

    /// The channel to the server at `address` with `deadlines`: the same channel for the same
    /// address and deadlines. Must be called inside a tokio runtime.
    pub fn channel_with(
        &self,
        address: &str,
        deadlines: Deadlines,
    ) -> Result<Channel, TransportError> {
        let key = (address.to_string(), deadlines);
        let mut channels = lock(&self.inner.channels);
        if let Security::Tls(tls) = self.security() {
            // Rotated material: new channels present the new certificate (the old ones,
            // handed out already, keep working until their callers drop them).
            let generation = tls.generation();
            let mut built = lock(&self.inner.tls_generation);
            if *built != generation {
                channels.clear();
                *built = generation;
            }
        }
        if let Some(channel) = channels.get(&key) {
            return Ok(channel.clone());
        }
        let endpoint = self.endpoint(address, deadlines)?;
        let channel = match &self.inner.filter {
            None => endpoint.connect_lazy(),
            Some(filter) => endpoint.connect_with_connector_lazy(filter::Connector {
                filter: filter.clone(),
                address: address.to_string(),
            }),
        };
        if channels.len() >= MAX_CHANNELS {
            channels.clear();
        }
        channels.insert(key, channel.clone());
        *lock(&self.inner.dials)
            .entry(address.to_string())
            .or_default() += 1;
        Ok(channel)
    }

    /// The endpoint of `address` with the policy: the scheme of the process's security,
    /// `deadlines`, TCP_NODELAY and HTTP/2 keep-alive (also while idle, so a long stream
    /// notices a dead peer), and with TLS the CA and this process's client certificate. The
    /// one place an endpoint is built.
    pub fn endpoint(
        &self,
        address: &str,
        deadlines: Deadlines,
    ) -> Result<Endpoint, TransportError> {
        let mut endpoint = Endpoint::from_shared(self.security().url(address))
            .map_err(|source| TransportError::BadAddress {
                address: address.to_string(),
                source,
            })?
            .connect_timeout(deadlines.connect)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
            .keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
            .keep_alive_while_idle(true);
        if let Some(call) = deadlines.call {
            endpoint = endpoint.timeout(call);
        }
        if let Security::Tls(tls) = self.security() {
            endpoint = endpoint
                .tls_config(tls.client_config().1)
                .map_err(|source| TransportError::Tls {
                    address: address.to_string(),
                    source,
                })?;
        }
        Ok(endpoint)
    }

    /// How many channels were made to `address` (the first call of each connects).
    pub fn dials(&self, address: &str) -> u64 {
        lock(&self.inner.dials).get(address).copied().unwrap_or(0)
    }

    /// The channels made per address, in address order.
    pub fn dials_by_peer(&self) -> Vec<(String, u64)> {
        let mut all: Vec<_> = lock(&self.inner.dials)
            .iter()
            .map(|(a, n)| (a.clone(), *n))
            .collect();
        all.sort();
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_same_address_and_deadlines_share_one_channel() {
        let dialer = Dialer::new(Security::Plaintext);
        dialer.channel("127.0.0.1:1").unwrap();
        dialer.channel("127.0.0.1:1").unwrap();
        assert_eq!(
            dialer.dials("127.0.0.1:1"),
            1,
            "the second call reuses the channel"
        );
        // Other deadlines are another channel; another address too.
        dialer
            .channel_with("127.0.0.1:1", Deadlines::both(Duration::from_secs(1)))
            .unwrap();
        dialer.channel("127.0.0.1:2").unwrap();
        // Clones share the cache.
        dialer.clone().channel("127.0.0.1:2").unwrap();
        assert_eq!(
            dialer.dials_by_peer(),
            [
                ("127.0.0.1:1".to_string(), 2),
                ("127.0.0.1:2".to_string(), 1)
            ]
        );
        assert!(matches!(
            dialer.channel("bad address"),
            Err(TransportError::BadAddress { .. })
        ));
    }

    #[test]
    fn plaintext_dials_http_urls() {
        let dialer = Dialer::new(Security::default());
        let endpoint = dialer
            .endpoint("10.0.0.1:50051", Deadlines::default())
            .unwrap();
        assert_eq!(endpoint.uri().scheme_str(), Some("http"));
        assert_eq!(endpoint.uri().authority().unwrap(), "10.0.0.1:50051");
        assert_eq!(Security::Plaintext.url("h:1"), "http://h:1");
        assert_eq!(split_url("http://h:1"), Some(("http", "h:1")));
        assert_eq!(split_url("https://h:1/p"), Some(("https", "h:1/p")));
        assert_eq!(split_url("h:1"), None);
        assert_eq!(split_url("httpx://h:1"), None);
    }
}
