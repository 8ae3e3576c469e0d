//! An instance's security as its processes are given it, written once for both runtimes:
//! which files they read (certificates, the servers' token file) and the flags that name them,
//! the first administrators and Basalt's own principals. The local runtime writes the files
//! under `DIR/tls` ([`crate::local::security`]); on Kubernetes they are Secrets mounted into
//! the pods ([`crate::build::secrets`]). Certificates themselves come from
//! [`super::certificates`].
//!
//! Every process dials a tablet server checking the name [`certificates::server_common_name`]
//! (`--tls-server-name`), and etcd checking [`certificates::ETCD_COMMON_NAME`]
//! (`--etcd-server-name`): peers are dialled by pod IP on Kubernetes, which no certificate
//! can list in advance.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::certificates::{self, Leaf, Pem};
use crate::crd::Instance;

/// A certificate and its key, as files.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// What a secured instance's processes are given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceCredentials {
    /// The CA every certificate chains to.
    pub ca: PathBuf,
    /// The name the servers' certificate is checked against when they are dialled
    /// ([`certificates::server_common_name`]).
    pub server_name: String,
    /// The servers' certificate (TLS on their gRPC port, presented to peers and etcd).
    pub server: CertFiles,
    /// The master's client certificate.
    pub master: CertFiles,
    /// With TLS: the servers' token file, and the members holding roles/bigtable.admin from
    /// the start and those of Basalt's own processes.
    pub tls: Option<InstanceTls>,
}

/// The authentication of a secured instance's servers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceTls {
    pub tokens: PathBuf,
    pub admin_principals: Vec<String>,
    pub internal_principals: Vec<String>,
    /// The identities' credentials, by name (`admin` first).
    pub identities: std::collections::BTreeMap<String, IdentityFiles>,
    /// `spec.security.serviceAccountTokens`: the servers also review bearer tokens with the
    /// Kubernetes API server (`--token-review`).
    pub token_review: bool,
}

/// An identity's credentials as `local.json` shows them: its principal, its client
/// certificate and key, and the file of its bearer token.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IdentityFiles {
    pub principal: String,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub token: PathBuf,
}

/// The identities a secured instance issues: `admin` first, then those of its spec.
pub fn identity_names(instance: &Instance) -> Vec<String> {
    std::iter::once(certificates::ADMIN_IDENTITY.to_string())
        .chain(
            instance
                .spec
                .security
                .iter()
                .flat_map(|s| s.identities.iter().map(|i| i.name.clone())),
        )
        .collect()
}

/// The members holding roles/bigtable.admin on a secured instance from the start: its
/// `admin` identity, then the spec's `adminPrincipals`.
pub fn admin_principals(namespace: &str, instance: &Instance) -> Vec<String> {
    let name = instance.metadata.name.as_deref().unwrap_or_default();
    let admin = certificates::identity_email(namespace, name, certificates::ADMIN_IDENTITY);
    std::iter::once(certificates::principal(&admin))
        .chain(
            instance
                .spec
                .security
                .iter()
                .flat_map(|s| s.admin_principals.iter().cloned()),
        )
        .collect()
}

/// Basalt's own principals on an instance's servers: its master and the operator.
pub fn internal_principals(namespace: &str, instance: &str) -> Vec<String> {
    vec![
        certificates::principal(&certificates::master_common_name(namespace, instance)),
        certificates::principal(certificates::OPERATOR_COMMON_NAME),
    ]
}

/// The servers' token file (`--auth-token-file`): one `token principal` line per identity.
pub fn token_file(tokens: &[(String, String)]) -> String {
    let mut text =
        "# Written by basalt-operator from the Instance's spec.security: one token per identity.\n"
            .to_string();
    for (token, principal) in tokens {
        text.push_str(&format!("{token} {principal}\n"));
    }
    text
}

/// The tablet server's flags of an instance's security (pure): TLS on its gRPC port with
/// client certificates optional (token clients have none), its token file, its first
/// administrators and Basalt's own principals, token review when asked for; and, when etcd speaks TLS, etcd's CA and the
/// certificate it presents there.
pub fn server_args(credentials: &InstanceCredentials, etcd_tls: bool) -> Vec<String> {
    let path = |p: &Path| p.display().to_string();
    let mut args = vec![];
    if let Some(tls) = &credentials.tls {
        args.extend([
            "--tls-cert".into(),
            path(&credentials.server.cert),
            "--tls-key".into(),
            path(&credentials.server.key),
            "--tls-client-ca".into(),
            path(&credentials.ca),
            "--tls-client-certificates".into(),
            "optional".into(),
            "--auth-token-file".into(),
            path(&tls.tokens),
            "--tls-server-name".into(),
            credentials.server_name.clone(),
        ]);
        for member in &tls.admin_principals {
            args.extend(["--admin-principal".into(), member.clone()]);
        }
        for member in &tls.internal_principals {
            args.extend(["--internal-principal".into(), member.clone()]);
        }
        if tls.token_review {
            args.push("--token-review".into());
        }
    }
    if etcd_tls {
        args.extend(etcd_args(&credentials.ca, &credentials.server));
    }
    args
}

/// The master's flags (pure): its certificate towards the servers of a TLS instance, and
/// towards etcd when etcd speaks TLS.
pub fn master_args(credentials: &InstanceCredentials, etcd_tls: bool) -> Vec<String> {
    let path = |p: &Path| p.display().to_string();
    let mut args = vec![];
    if credentials.tls.is_some() {
        args.extend([
            "--tls-cert".into(),
            path(&credentials.master.cert),
            "--tls-key".into(),
            path(&credentials.master.key),
            "--tls-ca".into(),
            path(&credentials.ca),
            "--tls-server-name".into(),
            credentials.server_name.clone(),
        ]);
    }
    if etcd_tls {
        args.extend(etcd_args(&credentials.ca, &credentials.master));
    }
    args
}

fn etcd_args(ca: &Path, client: &CertFiles) -> [String; 8] {
    [
        "--etcd-ca".into(),
        ca.display().to_string(),
        "--etcd-cert".into(),
        client.cert.display().to_string(),
        "--etcd-key".into(),
        client.key.display().to_string(),
        "--etcd-server-name".into(),
        certificates::ETCD_COMMON_NAME.into(),
    ]
}

/// etcd's own flags for TLS on its client port (clients present a certificate of the CA
/// naming [`certificates::INTERNAL_NAME`]: Basalt's processes, not applications);
/// its peer port stays on 127.0.0.1 with no peer (a one-member cluster).
pub fn etcd_server_args(ca: &Path, etcd: &CertFiles) -> Vec<String> {
    vec![
        "--cert-file".into(),
        etcd.cert.display().to_string(),
        "--key-file".into(),
        etcd.key.display().to_string(),
        "--client-cert-auth".into(),
        "--trusted-ca-file".into(),
        ca.display().to_string(),
        // Basalt's own processes only, not the applications' identities of the same CA.
        // (etcd 3.4's JSON gateway then answers 503: it dials etcd without verifying, and
        // this check fails on an unverified chain; gRPC clients are unaffected.)
        "--client-cert-allowed-hostname".into(),
        certificates::INTERNAL_NAME.into(),
    ]
}

/// A process's TLS towards peers that present `client`, verifying them against `ca`.
pub fn client_security(
    ca: &Path,
    client: &CertFiles,
    server_name: Option<&str>,
) -> anyhow::Result<basalt_transport::Security> {
    Ok(basalt_transport::Security::tls(
        basalt_transport::TlsFiles {
            cert: client.cert.clone(),
            key: client.key.clone(),
            client_ca: None,
            client_certificates_optional: false,
            ca: Some(ca.to_path_buf()),
            server_name: server_name.map(str::to_string),
        },
    )?)
}

/// Writes `text` to `path` through a rename; `secret`: mode 0600.
pub fn write_file(path: &Path, text: &str, secret: bool) -> anyhow::Result<()> {
    use anyhow::Context as _;
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(if secret { 0o600 } else { 0o644 })
        .open(&tmp)
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    file.write_all(text.as_bytes())
        .and_then(|_| file.sync_all())
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// `leaf` at `files`, issued by `ca` (key first, then certificate) when missing or when
/// [`certificates::renewal_reason`] says so; kept otherwise.
pub fn ensure_issued(
    ca: &Pem,
    leaf: &Leaf,
    files: &CertFiles,
    now: std::time::SystemTime,
) -> anyhow::Result<()> {
    let why = match std::fs::read_to_string(&files.cert) {
        Ok(existing) if files.key.is_file() => {
            certificates::renewal_reason(&existing, &ca.cert, leaf, now)
        }
        _ => Some("there is none".to_string()),
    };
    if let Some(why) = why {
        tracing::info!(cert = %files.cert.display(), reason = %why, "issuing a certificate");
        let issued = certificates::issue(ca, leaf, now)?;
        // The key first: a process that reads the new certificate with the old key keeps
        // its previous material and reads both again at its next handshake.
        write_file(&files.key, &issued.key, true)?;
        write_file(&files.cert, &issued.cert, false)?;
    }
    Ok(())
}
