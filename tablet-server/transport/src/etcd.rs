//! The way to etcd: its client URLs with the scheme of the process's [`Security`], and
//! etcd-client's connect options with the one policy. `basalt-meta`'s `Meta::connect` takes
//! [`EtcdEndpoints`].
//!
//! etcd-client takes endpoints as URLs (`http://h:p`, or `https://h:p` with its TLS feature and
//! `ConnectOptions::with_tls`) or as bare `h:p`, to which it adds `http://` unless TLS options
//! are given. Basalt normalises every endpoint here instead, so that the scheme is always the
//! one [`Security`] names and a mismatch is refused before dialling: with TLS,
//! [`EtcdEndpoints::connect_options`] adds etcd-client's `TlsOptions`.

use std::time::Duration;

use etcd_client::ConnectOptions;

use crate::{Security, TransportError, split_url};

/// How long connecting to an etcd member may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// etcd connections are pinged more often than peers': a lease's keep-alive must notice a dead
/// member well within a lease's time to live.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(2);
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(3);

/// An etcd cluster's client URLs, each with the scheme of the process's [`Security`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdEndpoints {
    urls: Vec<String>,
    security: Security,
}

impl EtcdEndpoints {
    /// `endpoints` (URLs, or bare `host:port` given the scheme of `security`). A URL whose
    /// scheme is not `security`'s is refused: an `https://` member needs TLS material (the
    /// CA etcd's certificate chains to, and the certificate this process presents to etcd).
    pub fn new<S: AsRef<str>>(
        endpoints: &[S],
        security: &Security,
    ) -> Result<EtcdEndpoints, TransportError> {
        let mut urls = Vec::with_capacity(endpoints.len());
        for endpoint in endpoints {
            let endpoint = endpoint.as_ref();
            let url = match split_url(endpoint) {
                Some((scheme, _)) if scheme == security.scheme() => endpoint.to_string(),
                Some((scheme, _)) => {
                    return Err(TransportError::BadUrl {
                        url: endpoint.to_string(),
                        reason: format!(
                            "the scheme {scheme} needs another transport security than {security:?}"
                        ),
                    });
                }
                None if endpoint.contains("://") => {
                    return Err(TransportError::BadUrl {
                        url: endpoint.to_string(),
                        reason: "an etcd client URL is http(s)://host:port".into(),
                    });
                }
                None => security.url(endpoint),
            };
            urls.push(url);
        }
        Ok(EtcdEndpoints {
            urls,
            security: security.clone(),
        })
    }

    /// Plaintext `endpoints` (see [`EtcdEndpoints::new`]).
    pub fn plaintext<S: AsRef<str>>(endpoints: &[S]) -> Result<EtcdEndpoints, TransportError> {
        EtcdEndpoints::new(endpoints, &Security::Plaintext)
    }

    /// The URLs, as etcd-client's `Client::connect` takes them.
    pub fn urls(&self) -> &[String] {
        &self.urls
    }

    /// etcd-client's options with the policy: connect timeout, HTTP/2 keep-alive also while
    /// idle (a watch or a lease's keep-alive stream notices a dead member within seconds). No
    /// request timeout: callers add theirs (`with_timeout`). With TLS, the material as its
    /// files hold it now: a connection made after a rotation presents the new certificate
    /// (etcd-client keeps a connection's TLS for its life).
    pub fn connect_options(&self) -> ConnectOptions {
        let options = ConnectOptions::new()
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_keep_alive(KEEP_ALIVE_INTERVAL, KEEP_ALIVE_TIMEOUT)
            .with_keep_alive_while_idle(true);
        match &self.security {
            Security::Plaintext => options,
            Security::Tls(tls) => options.with_tls(tls.client_config().1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_get_the_scheme_of_the_security() {
        let e = EtcdEndpoints::plaintext(&["http://10.0.0.1:2379", "etcd-0.svc:2379"]).unwrap();
        assert_eq!(e.urls(), ["http://10.0.0.1:2379", "http://etcd-0.svc:2379"]);
        assert!(matches!(
            EtcdEndpoints::plaintext(&["https://10.0.0.1:2379"]),
            Err(TransportError::BadUrl { .. })
        ));
        assert!(matches!(
            EtcdEndpoints::plaintext(&["unix://sock"]),
            Err(TransportError::BadUrl { .. })
        ));
    }
}
