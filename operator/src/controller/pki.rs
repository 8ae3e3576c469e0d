//! The operator's certificate authority on Kubernetes and the operator's own client
//! certificate ([`crate::lifecycle::certificates`] issues both; the local runtime's twin is
//! [`crate::local::security::LocalPki`]).
//!
//! The CA lives in the Secret [`CA_SECRET`] in the operator's namespace (`ca.crt`, `ca.key`):
//! the first replica to start makes it, the others read it (a create that loses the race
//! reads the winner's). A CA in its last year is replaced at start, and every leaf is then
//! issued again by the Instance controller (none chains to the new CA).
//!
//! The operator's client certificate (principal `operator.basalt`, an internal principal of
//! every secured instance) is kept in memory and written, with the CA, under a directory of
//! the operator's (`$TMPDIR/basalt-operator-tls-<pid>`, the chart's `/tmp` emptyDir): the
//! operator's TLS clients read it from there and again when it changes. It is issued at start
//! and again when due ([`OperatorPki::renew`], every [`RENEW_INTERVAL`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};

use crate::build;
use crate::lifecycle::certificates::{self, Pem};
use crate::lifecycle::security::{CertFiles, client_security, ensure_issued, write_file};

/// The Secret of the operator's CA, in the operator's namespace.
pub const CA_SECRET: &str = "basalt-operator-ca";
const CA_CERT: &str = "ca.crt";
const CA_KEY: &str = "ca.key";
/// How often the operator looks at its own certificate for renewal.
pub const RENEW_INTERVAL: Duration = Duration::from_secs(3600);

/// The operator's CA and its own client certificate's files.
pub struct OperatorPki {
    ca: Pem,
    dir: PathBuf,
}

impl OperatorPki {
    /// The CA from [`CA_SECRET`] in `namespace` (made, or replaced near its end), and the
    /// operator's certificate written under `dir`.
    pub async fn load(
        client: Client,
        namespace: &str,
        dir: PathBuf,
        now: SystemTime,
    ) -> anyhow::Result<OperatorPki> {
        let secrets: Api<Secret> = Api::namespaced(client, namespace);
        let ca = loop {
            let existing = secrets.get_opt(CA_SECRET).await?;
            let pem = existing.as_ref().and_then(|s| {
                Some(Pem {
                    cert: build::secrets::text(Some(s), CA_CERT)?,
                    key: build::secrets::text(Some(s), CA_KEY)?,
                })
            });
            let why = match &pem {
                None => "there is none".to_string(),
                Some(ca) => match certificates::ca_renewal_reason(&ca.cert, now) {
                    None => break pem.expect("checked"),
                    Some(why) => why,
                },
            };
            tracing::info!(secret = CA_SECRET, %namespace, reason = %why, "making the operator's certificate authority");
            let ca = certificates::new_ca("Basalt operator CA", now)?;
            let secret = ca_secret(namespace, &ca, existing.as_ref());
            let written = match existing {
                None => secrets.create(&PostParams::default(), &secret).await,
                Some(_) => {
                    secrets
                        .replace(CA_SECRET, &PostParams::default(), &secret)
                        .await
                }
            };
            match written {
                Ok(_) => break ca,
                // Another replica wrote it first: read theirs.
                Err(kube::Error::Api(e)) if e.code == 409 => continue,
                Err(e) => return Err(e.into()),
            }
        };
        OperatorPki::new(ca, dir, now)
    }

    /// The operator's PKI with the CA `ca` (already kept somewhere), its certificate written
    /// under `dir`.
    pub fn new(ca: Pem, dir: PathBuf, now: SystemTime) -> anyhow::Result<OperatorPki> {
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let pki = OperatorPki { ca, dir };
        write_file(&pki.ca_file(), &pki.ca.cert, false)?;
        pki.renew(now)?;
        Ok(pki)
    }

    /// The CA (the Instance controller issues every instance's certificates with it).
    pub fn ca(&self) -> &Pem {
        &self.ca
    }

    fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    fn files(&self) -> CertFiles {
        CertFiles {
            cert: self.dir.join("operator.crt"),
            key: self.dir.join("operator.key"),
        }
    }

    /// Issues the operator's certificate again if it is missing or due.
    pub fn renew(&self, now: SystemTime) -> anyhow::Result<()> {
        ensure_issued(&self.ca, &certificates::operator_leaf(), &self.files(), now)
    }

    /// TLS towards the tablet servers of `instance` in `namespace`, with the operator's
    /// certificate.
    pub fn towards_servers(
        &self,
        namespace: &str,
        instance: &str,
    ) -> anyhow::Result<basalt_transport::Security> {
        client_security(
            &self.ca_file(),
            &self.files(),
            Some(&certificates::server_common_name(namespace, instance)),
        )
    }

    /// TLS towards a secured instance's servers, and towards its metadata store (TLS when
    /// `etcd_tls`, else plaintext), with the operator's certificate.
    pub fn towards_instance(
        &self,
        namespace: &str,
        instance: &str,
        etcd_tls: bool,
    ) -> anyhow::Result<(basalt_transport::Security, basalt_transport::Security)> {
        let etcd = if etcd_tls {
            self.towards_etcd()?
        } else {
            basalt_transport::Security::Plaintext
        };
        Ok((self.towards_servers(namespace, instance)?, etcd))
    }

    /// TLS towards a secured instance's metadata store, with the operator's certificate.
    pub fn towards_etcd(&self) -> anyhow::Result<basalt_transport::Security> {
        client_security(
            &self.ca_file(),
            &self.files(),
            Some(certificates::ETCD_COMMON_NAME),
        )
    }
}

/// Where the operator writes its certificate by default: a directory of this process's own
/// (replicas sharing a host do not overwrite each other's key).
pub fn default_dir() -> PathBuf {
    std::env::temp_dir().join(format!("basalt-operator-tls-{}", std::process::id()))
}

fn ca_secret(namespace: &str, ca: &Pem, existing: Option<&Secret>) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(CA_SECRET.into()),
            namespace: Some(namespace.into()),
            labels: Some(BTreeMap::from([
                (build::LABEL_NAME.into(), "basalt-operator".into()),
                (build::LABEL_PART_OF.into(), "basalt".into()),
                (build::LABEL_MANAGED_BY.into(), build::FIELD_MANAGER.into()),
            ])),
            resource_version: existing.and_then(|s| s.metadata.resource_version.clone()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([
            (CA_CERT.into(), ByteString(ca.cert.clone().into_bytes())),
            (CA_KEY.into(), ByteString(ca.key.clone().into_bytes())),
        ])),
        ..Secret::default()
    }
}

/// Keeps the operator's certificate renewed until the process ends.
pub async fn renew_forever(pki: std::sync::Arc<OperatorPki>) {
    loop {
        tokio::time::sleep(RENEW_INTERVAL).await;
        if let Err(error) = pki.renew(SystemTime::now()) {
            tracing::warn!(error = %format!("{error:#}"), "could not renew the operator's certificate");
        }
    }
}
