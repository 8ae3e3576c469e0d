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

use crate::crd::Instance;
use crate::lifecycle::certificates::{self, Leaf, Pem};
pub use crate::lifecycle::security::{
    CertFiles, IdentityFiles, InstanceCredentials, InstanceTls, client_security, etcd_server_args,
    master_args, server_args,
};
use crate::lifecycle::security::{
    admin_principals, ensure_issued, identity_names, internal_principals, token_file,
    write_file as write,
};

/// How often the runtime looks at its certificates for renewal.
pub const RENEW_INTERVAL: Duration = Duration::from_secs(3600);

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
        ensure_issued(&self.ca, leaf, &files, now)?;
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
            let mut tokens = vec![];
            let mut files = std::collections::BTreeMap::new();
            for identity in identity_names(instance) {
                let leaf = certificates::identity_leaf(namespace, name, &identity);
                let rel = base.join("clients").join(&identity);
                let cert = self.ensure(&rel, &leaf, now)?;
                let token_path = self.dir.join(&rel).join("token");
                let principal = certificates::principal(&certificates::identity_email(
                    namespace, name, &identity,
                ));
                tokens.push((token(&token_path)?, principal.clone()));
                files.insert(
                    identity,
                    IdentityFiles {
                        principal,
                        cert: cert.cert,
                        key: cert.key,
                        token: token_path,
                    },
                );
            }
            let path = self.dir.join(&base).join("tokens");
            let text = token_file(&tokens);
            if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
                write(&path, &text, true)?;
            }
            Some(InstanceTls {
                tokens: path,
                admin_principals: admin_principals(namespace, instance),
                internal_principals: internal_principals(namespace, name),
                token_review: instance.spec.token_review(),
                identities: files,
            })
        } else {
            None
        };
        Ok(InstanceCredentials {
            ca: self.ca_file(),
            server_name: certificates::server_common_name(namespace, name),
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
                 --auth-token-file {} --tls-server-name server.orders.default.basalt \
                 --admin-principal user:admin@orders.default.basalt \
                 --admin-principal user:alice@example.com \
                 --internal-principal user:master.orders.default.basalt \
                 --internal-principal user:operator.basalt \
                 --etcd-ca {} --etcd-cert {} --etcd-key {} --etcd-server-name etcd.basalt",
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
                "--tls-cert {} --tls-key {} --tls-ca {} --tls-server-name server.orders.default.basalt",
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
