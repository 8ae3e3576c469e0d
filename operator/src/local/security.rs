//! The local runtime's certificates and tokens, as files under `DIR/tls/` (on Kubernetes the
//! same certificates go into Secrets). One CA per runtime ([`crate::lifecycle::certificates`]
//! issues everything); it signs:
//!
//! * `etcd/`: the runtime's etcd (its client port speaks TLS and verifies client
//!   certificates when any instance is secured);
//! * `operator/`: the runtime itself (an internal principal of every secured instance: it
//!   applies tables and asks the servers for their status), and its client certificate to
//!   etcd;
//! * per instance, `<namespace>/<instance>/server/` (every server of the instance: served to
//!   clients and presented to peers and etcd) and `master/` (the master's, internal);
//! * per identity of a secured instance, `<namespace>/<instance>/clients/<name>/` with
//!   `cert.pem`, `key.pem` and `token`: the identity `admin` (roles/bigtable.admin from the
//!   start) and those of `spec.security.identities`. `<namespace>/<instance>/tokens` is the
//!   servers' token file.
//!
//! Certificates are issued when missing, and again when [`certificates::renewal_reason`] says
//! so (a third of their life left, other names, another CA); the runtime looks at them at
//! start and every [`RENEW_INTERVAL`]. Processes read changed files at their next handshake,
//! so a renewal restarts nothing. Keys are written mode 0600, each file through a rename (a
//! reader never sees half a file).

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use crate::crd::Instance;
use crate::lifecycle::certificates::{self, Leaf, Pem};

/// How often the runtime looks at its certificates for renewal.
pub const RENEW_INTERVAL: Duration = Duration::from_secs(3600);

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

/// The runtime's CA and where its files go.
pub struct LocalPki {
    dir: PathBuf,
    ca: Pem,
}

/// The SANs of everything the runtime runs: it is all on 127.0.0.1.
fn local_names() -> (Vec<String>, Vec<IpAddr>) {
    (
        vec!["localhost".into()],
        vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
    )
}

impl LocalPki {
    /// `DIR/tls`.
    pub fn dir(data_dir: &Path) -> PathBuf {
        data_dir.join("tls")
    }

    /// The runtime's CA from `DIR/tls/ca.pem` and `ca-key.pem`, made (again) when missing or
    /// near its end (then every leaf is issued again, as none chains to it).
    pub fn open(data_dir: &Path, now: SystemTime) -> anyhow::Result<LocalPki> {
        let dir = LocalPki::dir(data_dir);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let (cert, key) = (dir.join("ca.pem"), dir.join("ca-key.pem"));
        let existing = match (
            std::fs::read_to_string(&cert),
            std::fs::read_to_string(&key),
        ) {
            (Ok(cert), Ok(key)) => Some(Pem { cert, key }),
            _ => None,
        };
        let why = match &existing {
            None => Some("there is none".to_string()),
            Some(ca) => certificates::ca_renewal_reason(&ca.cert, now),
        };
        let ca = match (existing, why) {
            (Some(ca), None) => ca,
            (_, why) => {
                let why = why.unwrap_or_default();
                tracing::info!(dir = %dir.display(), reason = %why, "making the runtime's certificate authority");
                let ca = certificates::new_ca("Basalt local runtime CA", now)?;
                write(&key, &ca.key, true)?;
                write(&cert, &ca.cert, false)?;
                ca
            }
        };
        Ok(LocalPki { dir, ca })
    }

    /// The CA certificate's file (clients verify the servers against it).
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// `leaf` under `DIR/tls/<rel>/`, issued if missing or due for renewal.
    fn ensure(&self, rel: &Path, leaf: &Leaf, now: SystemTime) -> anyhow::Result<CertFiles> {
        let dir = self.dir.join(rel);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let files = CertFiles {
            cert: dir.join("cert.pem"),
            key: dir.join("key.pem"),
        };
        let why = match std::fs::read_to_string(&files.cert) {
            Ok(existing) if files.key.is_file() => {
                certificates::renewal_reason(&existing, &self.ca.cert, leaf, now)
            }
            _ => Some("there is none".to_string()),
        };
        if let Some(why) = why {
            tracing::info!(cert = %files.cert.display(), reason = %why, "issuing a certificate");
            let issued = certificates::issue(&self.ca, leaf, now)?;
            // The key first: a process that reads the new certificate with the old key keeps
            // its previous material and reads both again at its next handshake.
            write(&files.key, &issued.key, true)?;
            write(&files.cert, &issued.cert, false)?;
        }
        Ok(files)
    }

    /// The etcd member's certificate (server and client: etcd dials itself).
    pub fn etcd(&self, now: SystemTime) -> anyhow::Result<CertFiles> {
        let (dns, ips) = local_names();
        self.ensure(Path::new("etcd"), &certificates::etcd_leaf(dns, ips), now)
    }

    /// Where the runtime's own client certificate is ([`LocalPki::operator`] issues it).
    pub fn operator_files(&self) -> CertFiles {
        CertFiles {
            cert: self.dir.join("operator").join("cert.pem"),
            key: self.dir.join("operator").join("key.pem"),
        }
    }

    /// The runtime's own client certificate.
    pub fn operator(&self, now: SystemTime) -> anyhow::Result<CertFiles> {
        self.ensure(Path::new("operator"), &certificates::operator_leaf(), now)
    }

    /// The certificates of `instance`'s servers and master, and with TLS its identities'
    /// certificates and tokens and the servers' token file.
    pub fn instance(
        &self,
        namespace: &str,
        instance: &Instance,
        now: SystemTime,
    ) -> anyhow::Result<InstanceCredentials> {
        let name = instance.metadata.name.as_deref().unwrap_or_default();
        let base = PathBuf::from(namespace).join(name);
        let (dns, ips) = local_names();
        let server = self.ensure(
            &base.join("server"),
            &certificates::server_leaf(namespace, name, dns, ips),
            now,
        )?;
        let master = self.ensure(
            &base.join("master"),
            &certificates::master_leaf(namespace, name),
            now,
        )?;
        let tls = if instance.spec.tls_enabled() {
            let security = instance.spec.security.clone().unwrap_or_default();
            let identities = std::iter::once(certificates::ADMIN_IDENTITY.to_string())
                .chain(security.identities.iter().map(|i| i.name.clone()));
            let mut lines = vec![
                "# Written by basalt-operator local from the Instance's spec.security: one token per identity.".to_string(),
            ];
            let mut files = std::collections::BTreeMap::new();
            for identity in identities {
                let leaf = certificates::identity_leaf(namespace, name, &identity);
                let rel = base.join("clients").join(&identity);
                let cert = self.ensure(&rel, &leaf, now)?;
                let token_file = self.dir.join(&rel).join("token");
                let token = token(&token_file)?;
                let principal = certificates::principal(&certificates::identity_email(
                    namespace, name, &identity,
                ));
                lines.push(format!("{token} {principal}"));
                files.insert(
                    identity,
                    IdentityFiles {
                        principal,
                        cert: cert.cert,
                        key: cert.key,
                        token: token_file,
                    },
                );
            }
            let tokens = self.dir.join(&base).join("tokens");
            let text = lines.join("\n") + "\n";
            if std::fs::read_to_string(&tokens).ok().as_deref() != Some(text.as_str()) {
                write(&tokens, &text, true)?;
            }
            let admin = certificates::identity_email(namespace, name, certificates::ADMIN_IDENTITY);
            Some(InstanceTls {
                tokens,
                admin_principals: std::iter::once(certificates::principal(&admin))
                    .chain(security.admin_principals.iter().cloned())
                    .collect(),
                internal_principals: vec![
                    certificates::principal(&certificates::master_common_name(namespace, name)),
                    certificates::principal(certificates::OPERATOR_COMMON_NAME),
                ],
                identities: files,
            })
        } else {
            None
        };
        Ok(InstanceCredentials {
            ca: self.ca_file(),
            server,
            master,
            tls,
        })
    }
}

/// The identity's token from `path`, made once.
fn token(path: &Path) -> anyhow::Result<String> {
    if let Ok(existing) = std::fs::read_to_string(path) {
        let existing = existing.trim();
        if !existing.is_empty() {
            return Ok(existing.to_string());
        }
    }
    let token = certificates::new_token()?;
    write(path, &format!("{token}\n"), true)?;
    Ok(token)
}

/// Writes `text` to `path` through a rename; `secret`: mode 0600.
fn write(path: &Path, text: &str, secret: bool) -> anyhow::Result<()> {
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

/// The tablet server's flags of an instance's security (pure): TLS on its gRPC port with
/// client certificates optional (token clients have none), its token file, its first
/// administrators and Basalt's own principals; and, when etcd speaks TLS, etcd's CA and the
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
        ]);
        for member in &tls.admin_principals {
            args.extend(["--admin-principal".into(), member.clone()]);
        }
        for member in &tls.internal_principals {
            args.extend(["--internal-principal".into(), member.clone()]);
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
        ]);
    }
    if etcd_tls {
        args.extend(etcd_args(&credentials.ca, &credentials.master));
    }
    args
}

fn etcd_args(ca: &Path, client: &CertFiles) -> [String; 6] {
    [
        "--etcd-ca".into(),
        ca.display().to_string(),
        "--etcd-cert".into(),
        client.cert.display().to_string(),
        "--etcd-key".into(),
        client.key.display().to_string(),
    ]
}

/// etcd's own flags for TLS on its client port (clients present a certificate of the CA);
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
    ]
}

/// A process's TLS towards peers that present `client`, verifying them against `ca`.
pub fn client_security(
    ca: &Path,
    client: &CertFiles,
) -> anyhow::Result<basalt_transport::Security> {
    Ok(basalt_transport::Security::tls(
        basalt_transport::TlsFiles {
            cert: client.cert.clone(),
            key: client.key.clone(),
            client_ca: None,
            client_certificates_optional: false,
            ca: Some(ca.to_path_buf()),
            server_name: None,
        },
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(24 * 3600);

    fn instance(yaml: &str) -> Instance {
        serde_norway::from_str(yaml).unwrap()
    }

    fn secured() -> Instance {
        instance(
            "{apiVersion: basalt.dev/v1alpha1, kind: Instance, metadata: {name: orders},
              spec: {displayName: Orders, security: {adminPrincipals: ['user:alice@example.com'],
                     identities: [{name: checkout}]}}}",
        )
    }

    #[test]
    fn a_secured_instance_gets_its_certificates_tokens_and_flags() {
        let dir = tempfile::tempdir().unwrap();
        let now = SystemTime::now();
        let pki = LocalPki::open(dir.path(), now).unwrap();
        let c = pki.instance("default", &secured(), now).unwrap();
        let tls = c.tls.clone().expect("Production: TLS");
        assert_eq!(
            tls.identities.keys().collect::<Vec<_>>(),
            ["admin", "checkout"]
        );
        assert_eq!(
            tls.identities["checkout"].principal,
            "user:checkout@orders.default.basalt"
        );
        assert_eq!(
            tls.admin_principals,
            ["user:admin@orders.default.basalt", "user:alice@example.com"]
        );
        assert_eq!(
            tls.internal_principals,
            ["user:master.orders.default.basalt", "user:operator.basalt"]
        );
        // The token file names each identity's token.
        let tokens = std::fs::read_to_string(&tls.tokens).unwrap();
        for identity in tls.identities.values() {
            let token = std::fs::read_to_string(&identity.token).unwrap();
            assert!(tokens.contains(&format!("{} {}", token.trim(), identity.principal)));
        }
        use std::os::unix::fs::PermissionsExt as _;
        for secret in [&c.server.key, &tls.tokens, &tls.identities["admin"].key] {
            let mode = std::fs::metadata(secret).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{}", secret.display());
        }
        let root = dir.path().join("tls");
        let p = |rel: &str| root.join(rel).display().to_string();
        assert_eq!(
            server_args(&c, true).join(" "),
            format!(
                "--tls-cert {} --tls-key {} --tls-client-ca {} --tls-client-certificates optional \
                 --auth-token-file {} --admin-principal user:admin@orders.default.basalt \
                 --admin-principal user:alice@example.com \
                 --internal-principal user:master.orders.default.basalt \
                 --internal-principal user:operator.basalt \
                 --etcd-ca {} --etcd-cert {} --etcd-key {}",
                p("default/orders/server/cert.pem"),
                p("default/orders/server/key.pem"),
                p("ca.pem"),
                p("default/orders/tokens"),
                p("ca.pem"),
                p("default/orders/server/cert.pem"),
                p("default/orders/server/key.pem"),
            )
        );
        assert_eq!(
            master_args(&c, false).join(" "),
            format!(
                "--tls-cert {} --tls-key {} --tls-ca {}",
                p("default/orders/master/cert.pem"),
                p("default/orders/master/key.pem"),
                p("ca.pem"),
            )
        );
    }

    #[test]
    fn a_development_instance_gets_only_what_etcd_needs() {
        let dir = tempfile::tempdir().unwrap();
        let now = SystemTime::now();
        let pki = LocalPki::open(dir.path(), now).unwrap();
        let dev = instance(
            "{apiVersion: basalt.dev/v1alpha1, kind: Instance, metadata: {name: quickstart},
              spec: {displayName: Quick, type: Development}}",
        );
        let c = pki.instance("default", &dev, now).unwrap();
        assert!(c.tls.is_none());
        assert!(server_args(&c, false).is_empty());
        assert_eq!(server_args(&c, true)[0], "--etcd-ca");
        assert!(master_args(&c, false).is_empty());
    }

    #[test]
    fn certificates_are_kept_until_due_and_tokens_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let now = SystemTime::now();
        let pki = LocalPki::open(dir.path(), now).unwrap();
        let first = pki.instance("default", &secured(), now).unwrap();
        let read = |p: &Path| std::fs::read_to_string(p).unwrap();
        let cert = read(&first.server.cert);
        let token = read(&first.tls.as_ref().unwrap().identities["admin"].token);
        // A restart 59 days on: nothing is due.
        let later = now + 59 * DAY;
        let pki = LocalPki::open(dir.path(), later).unwrap();
        pki.instance("default", &secured(), later).unwrap();
        assert_eq!(read(&first.server.cert), cert);
        // 61 days on, less than 30 are left: issued again, for 90 days from then; the tokens
        // stay.
        let due = now + 61 * DAY;
        let again = pki.instance("default", &secured(), due).unwrap();
        let renewed = read(&again.server.cert);
        assert_ne!(renewed, cert);
        let expires = certificates::not_after(&renewed).unwrap();
        assert!(expires > due + 89 * DAY, "{expires:?}");
        assert_eq!(
            read(&again.tls.as_ref().unwrap().identities["admin"].token),
            token
        );
        // A new CA (its last year) means every leaf again: none chains to it.
        let ca = read(&dir.path().join("tls/ca.pem"));
        let end = now + certificates::CA_LIFETIME - 100 * DAY;
        let pki = LocalPki::open(dir.path(), end).unwrap();
        assert_ne!(read(&dir.path().join("tls/ca.pem")), ca);
        let reissued = pki.instance("default", &secured(), end).unwrap();
        let leaf = read(&reissued.server.cert);
        assert_ne!(leaf, renewed);
        assert_eq!(
            certificates::renewal_reason(
                &leaf,
                &read(&dir.path().join("tls/ca.pem")),
                &certificates::server_leaf(
                    "default",
                    "orders",
                    vec!["localhost".into()],
                    vec![IpAddr::V4(Ipv4Addr::LOCALHOST)]
                ),
                end
            ),
            None
        );
    }
}
