//! TLS material read from PEM files and reloaded when they change, for both sides of a
//! connection:
//!
//! * a listener's side ([`Tls::server_config`]): this process's certificate and key, and, with
//!   a client CA, the requirement that every client presents a certificate that CA signed
//!   (mutual TLS; the chain reaches the handlers in [`ConnInfo`]);
//! * a dialler's side ([`Tls::client_config`]): the CA peers' certificates must chain to, and
//!   this process's certificate as its client certificate (so a peer that requires one gets it).
//!
//! **Rotation without a restart.** Every handshake first looks at the files' modification
//! times and sizes (a `stat` each; a Kubernetes Secret volume swaps a symlink, which changes
//! them) and builds the configuration again when they changed. New connections use the new
//! certificate; established ones keep theirs (a TLS session's certificate is only checked at
//! its handshake), so nothing in flight fails. Material that does not load (a file half
//! written, a key that does not match) is reported and the previous material kept; at start
//! it is an error.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

use crate::lock;

/// Where a process's TLS material is, as its flags name it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TlsFiles {
    /// This process's certificate chain (PEM), leaf first: served to clients, and presented
    /// to peers as the client certificate.
    pub cert: PathBuf,
    /// The private key of `cert` (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// Clients must present a certificate this CA (PEM, one or more certificates) signed.
    /// None: clients present none (they authenticate with tokens, or not at all).
    pub client_ca: Option<PathBuf>,
    /// With `client_ca`: a client may also come without a certificate (it then
    /// authenticates with a token); one that presents a certificate is still verified.
    pub client_certificates_optional: bool,
    /// The CA the certificates of the peers this process dials must chain to. None: the
    /// client CA (one CA for the whole deployment is the common case).
    pub ca: Option<PathBuf>,
    /// The name peers' certificates are checked against when dialling (None: the host
    /// dialled). Peers are dialled by address (a pod's IP); their certificates name a service.
    pub server_name: Option<String>,
}

impl TlsFiles {
    /// A process that only dials: it presents `cert` and verifies peers against `ca`.
    pub fn client(cert: PathBuf, key: PathBuf, ca: Option<PathBuf>) -> TlsFiles {
        TlsFiles {
            cert,
            key,
            client_ca: None,
            client_certificates_optional: false,
            ca,
            server_name: None,
        }
    }

    /// The files whose change means a reload.
    fn watched(&self) -> Vec<&Path> {
        let mut files = vec![self.cert.as_path(), self.key.as_path()];
        files.extend(self.client_ca.as_deref());
        files.extend(self.ca.as_deref());
        files
    }

    /// The CA peers are verified against.
    fn peer_ca(&self) -> Option<&Path> {
        self.ca.as_deref().or(self.client_ca.as_deref())
    }
}

/// Why TLS material cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {what}")]
    Bad { path: PathBuf, what: String },
}

/// When a file was last changed and its size (None: it cannot be read now): what tells a
/// credential file that changed (TLS material here, the tablet server's token file) from one
/// that did not, with one `stat`.
pub fn file_stamp(path: &Path) -> Option<(SystemTime, u64)> {
    std::fs::metadata(path)
        .ok()
        .map(|m| (m.modified().unwrap_or(SystemTime::UNIX_EPOCH), m.len()))
}

/// The stamps of the watched files.
type Stamp = Vec<Option<(SystemTime, u64)>>;

fn stamp(files: &TlsFiles) -> Stamp {
    files.watched().into_iter().map(file_stamp).collect()
}

/// How often [`Tls::generation`] looks at the files, at most: a dialler asks at every call it
/// makes, handshakes (rarer) look every time.
pub const GENERATION_RECHECK: Duration = Duration::from_millis(250);

/// One load of the files.
struct Loaded {
    stamp: Stamp,
    /// When the stamp was last compared.
    checked: Instant,
    /// Counts loads: a dialler drops its cached channels when it changes.
    generation: u64,
    server: Arc<ServerConfig>,
    client: ClientTlsConfig,
}

/// A process's TLS material, reloaded when its files change (see the module's docs).
pub struct Tls {
    files: TlsFiles,
    loaded: Mutex<Loaded>,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the key.
        f.debug_struct("Tls").field("files", &self.files).finish()
    }
}

impl Tls {
    /// Loads the material; an error names the file and what is wrong with it.
    pub fn load(files: TlsFiles) -> Result<Tls, TlsError> {
        let stamp = stamp(&files);
        let (server, client) = build(&files)?;
        Ok(Tls {
            files,
            loaded: Mutex::new(Loaded {
                stamp,
                checked: Instant::now(),
                generation: 1,
                server,
                client,
            }),
        })
    }

    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// This process's own certificate (DER; the first of its chain), as its file holds it now.
    pub fn own_certificate(&self) -> Result<Vec<u8>, TlsError> {
        let pem = read(&self.files.cert)?;
        Ok(certificates(&self.files.cert, &pem)?
            .swap_remove(0)
            .to_vec())
    }

    /// Whether clients' certificates are verified, and so name principals (required, or
    /// optional next to tokens).
    pub fn verifies_client_certificates(&self) -> bool {
        self.files.client_ca.is_some()
    }

    /// The listener's configuration for the next handshake (reloaded first if the files
    /// changed).
    pub fn server_config(&self) -> Arc<ServerConfig> {
        self.refresh(Duration::ZERO).server.clone()
    }

    /// The dialler's configuration and its generation (reloaded first if the files changed).
    pub fn client_config(&self) -> (u64, ClientTlsConfig) {
        let loaded = self.refresh(Duration::ZERO);
        (loaded.generation, loaded.client.clone())
    }

    /// How many times the material was loaded (1: never reloaded); the files are looked at if
    /// they were not within [`GENERATION_RECHECK`].
    pub fn generation(&self) -> u64 {
        self.refresh(GENERATION_RECHECK).generation
    }

    /// The material, loaded again first if the files changed (looked at unless they were
    /// within `recheck`).
    fn refresh(&self, recheck: Duration) -> std::sync::MutexGuard<'_, Loaded> {
        let mut loaded = lock(&self.loaded);
        if loaded.checked.elapsed() < recheck {
            return loaded;
        }
        loaded.checked = Instant::now();
        let now = stamp(&self.files);
        if now != loaded.stamp {
            match build(&self.files) {
                Ok((server, client)) => {
                    loaded.server = server;
                    loaded.client = client;
                    loaded.generation += 1;
                    tracing::info!(
                        cert = %self.files.cert.display(),
                        generation = loaded.generation,
                        "TLS material reloaded: new connections use it"
                    );
                }
                // Mid-rotation (one file written, not the other) or broken: keep serving with
                // what worked, and try again at the next handshake.
                Err(e) => {
                    tracing::warn!(error = %e, "TLS material changed but does not load; keeping the previous")
                }
            }
            loaded.stamp = now;
        }
        loaded
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn certificates(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Bad {
            path: path.to_path_buf(),
            what: format!("not PEM certificates: {e}"),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Bad {
            path: path.to_path_buf(),
            what: "no certificate (expected -----BEGIN CERTIFICATE-----)".into(),
        });
    }
    Ok(certs)
}

fn roots(path: &Path, pem: &[u8]) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(path, pem)? {
        roots.add(cert).map_err(|e| TlsError::Bad {
            path: path.to_path_buf(),
            what: format!("not a CA certificate: {e}"),
        })?;
    }
    Ok(roots)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn build(files: &TlsFiles) -> Result<(Arc<ServerConfig>, ClientTlsConfig), TlsError> {
    let cert_pem = read(&files.cert)?;
    let key_pem = read(&files.key)?;
    let chain = certificates(&files.cert, &cert_pem)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| TlsError::Bad {
        path: files.key.clone(),
        what: format!("not a PEM private key: {e}"),
    })?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Bad {
            path: files.cert.clone(),
            what: e.to_string(),
        })?;
    let builder = match &files.client_ca {
        Some(ca) => {
            let verifier = WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots(ca, &read(ca)?)?),
                provider(),
            );
            let verifier = if files.client_certificates_optional {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            let verifier = verifier.build().map_err(|e| TlsError::Bad {
                path: ca.clone(),
                what: e.to_string(),
            })?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut server = builder
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::Bad {
            path: files.key.clone(),
            what: format!(
                "does not go with the certificate {}: {e}",
                files.cert.display()
            ),
        })?;
    // gRPC is HTTP/2 only.
    server.alpn_protocols = vec![b"h2".to_vec()];

    let mut client =
        ClientTlsConfig::new().identity(Identity::from_pem(cert_pem.clone(), key_pem.clone()));
    if let Some(ca) = files.peer_ca() {
        let pem = read(ca)?;
        certificates(ca, &pem)?;
        client = client.ca_certificate(Certificate::from_pem(pem));
    }
    if let Some(name) = &files.server_name {
        client = client.domain_name(name.clone());
    }
    Ok((Arc::new(server), client))
}
