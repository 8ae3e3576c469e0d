//! The Secrets of a secured instance (`spec.security`, TLS on): its servers' certificate and
//! token file, its metadata store's certificate, and one Secret per identity for the
//! applications — all issued by the operator's CA ([`crate::lifecycle::certificates`]), each
//! owned by the Instance (collected with it):
//!
//! * `<instance>-server-tls`: `tls.crt`, `tls.key`, `ca.crt` and `tokens` (the servers'
//!   `--auth-token-file`), mounted at [`SERVER_TLS_MOUNT`] in every tablet server;
//! * `<instance>-meta-tls`: `tls.crt`, `tls.key`, `ca.crt`, mounted at [`ETCD_TLS_MOUNT`] in
//!   the instance's etcd members (none for an etcd the spec names);
//! * `<instance>-identity-<name>` (type `kubernetes.io/tls`): `tls.crt`, `tls.key`, `ca.crt`,
//!   `token` and `principal`, for `admin` and each of `spec.security.identities`.
//!
//! What is already in a Secret is kept while [`certificates::renewal_reason`] finds nothing
//! due (and a token forever): building the desired Secrets issues only what is missing or due,
//! so it is not pure — keys are generated here — but it reads nothing but its arguments.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;

use super::{instance_labels, instance_service_name, meta, owned_by};
use crate::crd::Instance;
use crate::lifecycle::certificates::{self, Leaf, Pem, PkiError};
use crate::lifecycle::security::{
    CertFiles, InstanceCredentials, InstanceTls, admin_principals, identity_names,
    internal_principals, token_file,
};

/// Where a tablet server's Secret is mounted.
pub const SERVER_TLS_MOUNT: &str = "/var/run/basalt/tls";
/// Where an etcd member's Secret is mounted.
pub const ETCD_TLS_MOUNT: &str = "/var/run/etcd/tls";
/// The certificate's key in each Secret (as in a `kubernetes.io/tls` Secret).
pub const CERT: &str = "tls.crt";
/// The private key's key.
pub const KEY: &str = "tls.key";
/// The CA certificate's key.
pub const CA: &str = "ca.crt";
/// The servers' token file's key.
pub const TOKENS: &str = "tokens";
/// An identity's bearer token's key.
pub const TOKEN: &str = "token";
/// An identity's principal's key (`user:<name>@<instance>.<namespace>.basalt`).
pub const PRINCIPAL: &str = "principal";

pub fn server_secret_name(instance: &str) -> String {
    format!("{instance}-server-tls")
}

pub fn metadata_store_secret_name(instance: &str) -> String {
    format!("{instance}-meta-tls")
}

pub fn identity_secret_name(instance: &str, identity: &str) -> String {
    format!("{instance}-identity-{identity}")
}

/// Whether the instance's servers speak TLS and authenticate their callers.
pub fn secured(instance: &Instance) -> bool {
    instance.spec.tls_enabled()
}

/// Whether the instance's own metadata store speaks TLS: that of a secured instance whose
/// spec names no existing etcd (an existing etcd is reached as its URLs say).
pub fn metadata_store_secured(instance: &Instance) -> bool {
    secured(instance) && instance.spec.metadata_store.is_none()
}

/// What a tablet server of a secured instance is given, as paths in its container: its
/// Secret at [`SERVER_TLS_MOUNT`]. (The master runs inside the operator on Kubernetes; it
/// dials with the operator's certificate, so `master` names the servers' files, unused.)
pub fn server_credentials(instance: &Instance) -> InstanceCredentials {
    let name = instance.name_any();
    let namespace = instance.namespace().unwrap_or_default();
    let file = |key: &str| Path::new(SERVER_TLS_MOUNT).join(key);
    let server = CertFiles {
        cert: file(CERT),
        key: file(KEY),
    };
    InstanceCredentials {
        ca: file(CA),
        server_name: certificates::server_common_name(&namespace, &name),
        server: server.clone(),
        master: server,
        tls: Some(InstanceTls {
            tokens: file(TOKENS),
            admin_principals: admin_principals(&namespace, instance),
            internal_principals: internal_principals(&namespace, &name),
            token_review: instance.spec.token_review(),
            identities: BTreeMap::new(),
        }),
    }
}

/// etcd's files in its container.
pub fn metadata_store_files() -> (PathBuf, CertFiles) {
    let file = |key: &str| Path::new(ETCD_TLS_MOUNT).join(key);
    (
        file(CA),
        CertFiles {
            cert: file(CERT),
            key: file(KEY),
        },
    )
}

/// A desired Secret, and why its certificate was issued now (None: kept as it was).
#[derive(Debug, Clone)]
pub struct DesiredSecret {
    pub secret: Secret,
    pub issued: Option<String>,
}

/// The Secrets of `instance` (none unless it is secured), keeping what `existing` (by name)
/// holds unless due.
pub fn instance_secrets(
    instance: &Instance,
    ca: &Pem,
    existing: &BTreeMap<String, Secret>,
    now: SystemTime,
) -> Result<Vec<DesiredSecret>, PkiError> {
    if !secured(instance) {
        return Ok(vec![]);
    }
    let name = instance.name_any();
    let namespace = instance.namespace().unwrap_or_default();
    let mut desired = vec![];
    let mut tokens = vec![];
    for identity in identity_names(instance) {
        let secret_name = identity_secret_name(&name, &identity);
        let before = existing.get(&secret_name);
        let leaf = certificates::identity_leaf(&namespace, &name, &identity);
        let (pair, issued) = keep_or_issue(before, ca, &leaf, now)?;
        let token = match text(before, TOKEN).filter(|t| !t.trim().is_empty()) {
            Some(token) => token.trim().to_string(),
            None => certificates::new_token()?,
        };
        let principal =
            certificates::principal(&certificates::identity_email(&namespace, &name, &identity));
        tokens.push((token.clone(), principal.clone()));
        let data = BTreeMap::from([
            (CERT, pair.cert),
            (KEY, pair.key),
            (CA, ca.cert.clone()),
            (TOKEN, token),
            (PRINCIPAL, principal),
        ]);
        desired.push(DesiredSecret {
            secret: secret(instance, secret_name, Some("kubernetes.io/tls"), data),
            issued,
        });
    }

    let service = instance_service_name(&name);
    let mut dns = vec![
        service.clone(),
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
    ];
    dns.push("localhost".into());
    let leaf = certificates::server_leaf(&namespace, &name, dns, loopback());
    let secret_name = server_secret_name(&name);
    let (pair, issued) = keep_or_issue(existing.get(&secret_name), ca, &leaf, now)?;
    let data = BTreeMap::from([
        (CERT, pair.cert),
        (KEY, pair.key),
        (CA, ca.cert.clone()),
        (TOKENS, token_file(&tokens)),
    ]);
    desired.push(DesiredSecret {
        secret: secret(instance, secret_name, None, data),
        issued,
    });

    if metadata_store_secured(instance) {
        let set = super::metadata_store_name(&name);
        let leaf = certificates::etcd_leaf(
            vec![
                format!("*.{set}.{namespace}.svc"),
                format!("*.{set}.{namespace}.svc.cluster.local"),
                "localhost".into(),
            ],
            loopback(),
        );
        let secret_name = metadata_store_secret_name(&name);
        let (pair, issued) = keep_or_issue(existing.get(&secret_name), ca, &leaf, now)?;
        let data = BTreeMap::from([(CERT, pair.cert), (KEY, pair.key), (CA, ca.cert.clone())]);
        desired.push(DesiredSecret {
            secret: secret(instance, secret_name, None, data),
            issued,
        });
    }
    Ok(desired)
}

fn loopback() -> Vec<IpAddr> {
    vec![IpAddr::V4(Ipv4Addr::LOCALHOST)]
}

/// The certificate and key in `existing` if nothing is due, else new ones and why.
fn keep_or_issue(
    existing: Option<&Secret>,
    ca: &Pem,
    leaf: &Leaf,
    now: SystemTime,
) -> Result<(Pem, Option<String>), PkiError> {
    let why = match (text(existing, CERT), text(existing, KEY)) {
        (Some(cert), Some(key)) => match certificates::renewal_reason(&cert, &ca.cert, leaf, now) {
            None => return Ok((Pem { cert, key }, None)),
            Some(why) => why,
        },
        _ => "there is none".to_string(),
    };
    Ok((certificates::issue(ca, leaf, now)?, Some(why)))
}

/// The UTF-8 text of `key` in the Secret.
pub fn text(secret: Option<&Secret>, key: &str) -> Option<String> {
    let bytes = secret?.data.as_ref()?.get(key)?;
    String::from_utf8(bytes.0.clone()).ok()
}

fn secret(
    instance: &Instance,
    name: String,
    type_: Option<&str>,
    data: BTreeMap<&str, String>,
) -> Secret {
    let mut metadata = meta(
        name,
        &instance.namespace().unwrap_or_default(),
        instance_labels(&instance.name_any()),
    );
    metadata.owner_references = Some(owned_by(instance));
    Secret {
        metadata,
        type_: type_.map(str::to_string),
        data: Some(
            data.into_iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.into_bytes())))
                .collect(),
        ),
        ..Secret::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(yaml: &str) -> Instance {
        serde_norway::from_str(yaml).unwrap()
    }

    fn secured_instance() -> Instance {
        instance(
            "{apiVersion: basalt.dev/v1alpha1, kind: Instance,
              metadata: {name: orders, namespace: shop, uid: u1},
              spec: {displayName: Orders, security: {adminPrincipals: ['user:alice@example.com'],
                     identities: [{name: checkout}]}}}",
        )
    }

    fn by_name(secrets: &[DesiredSecret]) -> BTreeMap<String, Secret> {
        secrets
            .iter()
            .map(|d| (d.secret.name_any(), d.secret.clone()))
            .collect()
    }

    #[test]
    fn a_development_instance_has_no_secrets() {
        let now = SystemTime::now();
        let ca = certificates::new_ca("test CA", now).unwrap();
        let dev = instance(
            "{apiVersion: basalt.dev/v1alpha1, kind: Instance, metadata: {name: q, namespace: d},
              spec: {displayName: Q, type: Development}}",
        );
        assert!(
            instance_secrets(&dev, &ca, &BTreeMap::new(), now)
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn a_secured_instance_gets_its_secrets_and_keeps_them_until_due() {
        let now = SystemTime::now();
        let ca = certificates::new_ca("test CA", now).unwrap();
        let i = secured_instance();
        let first = instance_secrets(&i, &ca, &BTreeMap::new(), now).unwrap();
        let names: Vec<String> = first.iter().map(|d| d.secret.name_any()).collect();
        assert_eq!(
            names,
            [
                "orders-identity-admin",
                "orders-identity-checkout",
                "orders-server-tls",
                "orders-meta-tls"
            ]
        );
        assert!(first.iter().all(|d| d.issued.is_some()));
        let secrets = by_name(&first);
        let checkout = Some(&secrets["orders-identity-checkout"]);
        assert_eq!(
            text(checkout, PRINCIPAL).unwrap(),
            "user:checkout@orders.shop.basalt"
        );
        assert_eq!(text(checkout, CA).unwrap(), ca.cert);
        let token = text(checkout, TOKEN).unwrap();
        assert_eq!(token.len(), 64);
        // The servers' token file names every identity's token.
        let tokens = text(Some(&secrets["orders-server-tls"]), TOKENS).unwrap();
        assert!(tokens.contains(&format!("{token} user:checkout@orders.shop.basalt\n")));
        // Each is owned by the Instance.
        let owner = &secrets["orders-meta-tls"]
            .metadata
            .owner_references
            .as_ref()
            .unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str()),
            ("Instance", "orders")
        );

        // Read back, nothing is due: kept as is, tokens too.
        let again = instance_secrets(&i, &ca, &secrets, now).unwrap();
        assert!(again.iter().all(|d| d.issued.is_none()));
        assert_eq!(by_name(&again), secrets);

        // 61 days on, the leaves are issued again; the tokens stay.
        let due = now + std::time::Duration::from_secs(61 * 24 * 3600);
        let renewed = instance_secrets(&i, &ca, &secrets, due).unwrap();
        assert!(renewed.iter().all(|d| d.issued.is_some()));
        let renewed = by_name(&renewed);
        assert_ne!(
            text(Some(&renewed["orders-server-tls"]), CERT),
            text(Some(&secrets["orders-server-tls"]), CERT)
        );
        assert_eq!(
            text(Some(&renewed["orders-identity-checkout"]), TOKEN).unwrap(),
            token
        );
    }

    #[test]
    fn servers_are_given_their_mounted_files_and_names() {
        let c = server_credentials(&secured_instance());
        let args = crate::lifecycle::security::server_args(&c, true).join(" ");
        assert_eq!(
            args,
            "--tls-cert /var/run/basalt/tls/tls.crt --tls-key /var/run/basalt/tls/tls.key \
             --tls-client-ca /var/run/basalt/tls/ca.crt --tls-client-certificates optional \
             --auth-token-file /var/run/basalt/tls/tokens \
             --tls-server-name server.orders.shop.basalt \
             --admin-principal user:admin@orders.shop.basalt \
             --admin-principal user:alice@example.com \
             --internal-principal user:master.orders.shop.basalt \
             --internal-principal user:operator.basalt \
             --etcd-ca /var/run/basalt/tls/ca.crt --etcd-cert /var/run/basalt/tls/tls.crt \
             --etcd-key /var/run/basalt/tls/tls.key --etcd-server-name etcd.basalt"
        );
    }
}
