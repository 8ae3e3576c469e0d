//! The operator's certificate authority, written once for both runtimes: the local runtime
//! writes what it makes to files, the Kubernetes controllers to Secrets; this module only
//! makes and judges certificates. It is pure except for randomness (keys, serial numbers and
//! tokens come from the operating system's generator): no file or network I/O.
//!
//! * [`new_ca`] makes a self-signed CA (ECDSA P-256, 10 years, path length 0: it signs
//!   leaves only). [`ca_renewal_reason`] says when it must be made anew — when less than a
//!   year is left of it; callers then issue every leaf again.
//! * [`issue`] signs a [`Leaf`] with the CA: a fresh ECDSA P-256 key, 90 days (never past the
//!   CA's own end), the extended key usages of its [`Usage`], a random serial number.
//!   [`renewal_reason`] says when an existing leaf must be issued again: it does not parse,
//!   the CA did not sign it, it names other identities than the leaf wants, or less than a
//!   third of its life is left ([`RENEW_BEFORE`]). Callers run it on every reconcile, so a
//!   leaf is reissued exactly when something changed or it is getting old.
//! * The naming of an instance's identities ([`server_leaf`], [`master_leaf`],
//!   [`identity_leaf`], ...) lives here too, so both runtimes name them alike; [`principal`]
//!   is the IAM member the tablet server derives from such a certificate (its email SAN
//!   first, else its common name), which is what IAM policies name.
//! * [`new_token`] makes a bearer token.
//!
//! Every time is given (`now`), never read from the clock, so the decisions are testable.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::string::{BmpString, Ia5String, PrintableString, TeletexString, UniversalString};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, DnValue,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyIdMethod, KeyPair, KeyUsagePurpose, PublicKeyData,
    SanType, SerialNumber,
};
use x509_parser::certificate::X509Certificate;
use x509_parser::der_parser::asn1_rs::Tag;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::x509::X509Name;

/// How long a leaf certificate the operator issues is valid.
pub const LEAF_LIFETIME: Duration = Duration::from_secs(90 * 24 * 3600);
/// A leaf is issued again when less than this is left of it (a third of its life).
pub const RENEW_BEFORE: Duration = Duration::from_secs(30 * 24 * 3600);
/// The CA's lifetime (10 years); it is renewed when less than [`CA_RENEW_BEFORE`] is left
/// (callers then re-issue every leaf).
pub const CA_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// The CA is made anew when less than this (a year) is left of it.
pub const CA_RENEW_BEFORE: Duration = Duration::from_secs(365 * 24 * 3600);
/// How far before `now` a certificate becomes valid, for clocks that lag behind the
/// operator's.
const CLOCK_SKEW: Duration = Duration::from_secs(3600);

/// The common name of the operator's own client certificate (it calls the tablet servers'
/// admin API with it); its principal is `user:operator.basalt`.
pub const OPERATOR_COMMON_NAME: &str = "operator.basalt";
/// The application identity every instance with TLS gets besides those its spec declares
/// (an Instance may not declare one of this name): `admin@<instance>.<namespace>.basalt`, an
/// admin principal of the instance.
pub const ADMIN_IDENTITY: &str = "admin";
/// The common name of the metadata store's (etcd's) certificate.
pub const ETCD_COMMON_NAME: &str = "etcd.basalt";
/// The DNS SAN every certificate of Basalt's own processes carries — tablet servers, masters,
/// the operator (or local runtime), etcd — and no application identity's: etcd admits only
/// client certificates naming it (`--client-cert-allowed-hostname`), so an identity issued
/// to an application cannot reach the metadata store.
pub const INTERNAL_NAME: &str = "internal.basalt";

/// A certificate and its private key: the PEM certificate (only the leaf itself for leaves,
/// no chain) and the PEM PKCS#8 private key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pem {
    /// The PEM certificate (`-----BEGIN CERTIFICATE-----`).
    pub cert: String,
    /// The PEM PKCS#8 private key (`-----BEGIN PRIVATE KEY-----`).
    pub key: String,
}

/// What a leaf is for (the extended key usages it gets).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Usage {
    /// A TLS server only (serverAuth).
    Server,
    /// A TLS client only (clientAuth).
    Client,
    /// Both (serverAuth and clientAuth): a server that also dials its peers.
    ServerAndClient,
}

/// A leaf the operator issues.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leaf {
    /// Subject common name.
    pub common_name: String,
    /// rfc822Name SAN (an application identity's principal comes from it), if any.
    pub email: Option<String>,
    /// DNS name SANs (the names a server is dialed by).
    pub dns_names: Vec<String>,
    /// IP address SANs (the addresses a server is dialed at).
    pub ip_addresses: Vec<IpAddr>,
    /// What the leaf is for.
    pub usage: Usage,
}

/// Why a certificate could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// The CA's certificate is not an X.509 certificate in PEM.
    #[error("the CA certificate does not parse: {0}")]
    CaCertificateParse(String),
    /// The CA's certificate parses but cannot sign leaves.
    #[error("the CA certificate cannot sign leaves: {0}")]
    CaUnusable(String),
    /// The CA's private key is not a PEM PKCS#8 key of a supported algorithm.
    #[error("the CA key does not parse: {0}")]
    CaKeyParse(String),
    /// The CA's private key is not the key of its certificate.
    #[error("the CA key is not the key of the CA certificate")]
    CaKeyMismatch,
    /// The CA's certificate is expired or not yet valid at the time of issuing.
    #[error("the CA certificate is not valid at the time of issuing: {0}")]
    CaNotValid(String),
    /// The leaf asks for something a certificate cannot hold.
    #[error("the certificate for {common_name:?} cannot be made: {reason}")]
    InvalidLeaf {
        /// The leaf's common name.
        common_name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A new CA cannot have this common name.
    #[error("a CA cannot be named {common_name:?}: {reason}")]
    InvalidCaName {
        /// The common name asked for.
        common_name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Generating a key pair failed.
    #[error("generating an ECDSA P-256 key failed: {0}")]
    KeyGeneration(String),
    /// Signing (or encoding) the certificate failed.
    #[error("signing the certificate failed: {0}")]
    Signing(String),
    /// The operating system's random number generator failed.
    #[error("the system's random number generator failed: {0}")]
    Randomness(String),
}

/// A new self-signed CA (ECDSA P-256) named `common_name`, valid from `now` - 1 hour (clock
/// skew) for [`CA_LIFETIME`]; basicConstraints CA:true with path length 0 (it signs leaves
/// only), keyUsage keyCertSign and cRLSign, a subject key identifier, a random serial number.
pub fn new_ca(common_name: &str, now: SystemTime) -> Result<Pem, PkiError> {
    if common_name.is_empty() {
        return Err(PkiError::InvalidCaName {
            common_name: common_name.to_string(),
            reason: "the common name is empty".into(),
        });
    }
    let key = generate_key()?;
    let (not_before, not_after) =
        validity(now, CA_LIFETIME).ok_or_else(|| PkiError::InvalidCaName {
            common_name: common_name.to_string(),
            reason: format!("its validity from {now:?} is out of range"),
        })?;
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.not_before = not_before.into();
    params.not_after = not_after.into();
    params.serial_number = Some(random_serial()?);
    let cert = params
        .self_signed(&key)
        .map_err(|e| PkiError::Signing(e.to_string()))?;
    Ok(Pem {
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

/// `leaf` signed by `ca` with a new ECDSA P-256 key: valid from `now` - 1 hour (clock skew)
/// for [`LEAF_LIFETIME`], but never past the CA's notAfter; keyUsage digitalSignature and
/// keyEncipherment, the extended key usages of `leaf.usage`, the authority key identifier of
/// the CA, a random serial number. The CA must be one [`new_ca`] made (or alike: a CA
/// certificate whose key is `ca.key`, valid at `now`).
pub fn issue(ca: &Pem, leaf: &Leaf, now: SystemTime) -> Result<Pem, PkiError> {
    let invalid = |reason: String| PkiError::InvalidLeaf {
        common_name: leaf.common_name.clone(),
        reason,
    };

    let ca_der = certificate_der(&ca.cert).map_err(PkiError::CaCertificateParse)?;
    let ca_cert = parse_certificate(&ca_der).map_err(PkiError::CaCertificateParse)?;
    if let Some(reason) = not_a_ca(&ca_cert) {
        return Err(PkiError::CaUnusable(reason));
    }
    let ca_key = KeyPair::from_pem(&ca.key).map_err(|e| PkiError::CaKeyParse(e.to_string()))?;
    if ca_key.subject_public_key_info() != ca_cert.public_key().raw {
        return Err(PkiError::CaKeyMismatch);
    }
    let ca_not_before = ca_cert.validity().not_before;
    let ca_not_after = ca_cert.validity().not_after;
    let now_secs = unix_seconds(now);
    if now_secs < ca_not_before.timestamp() {
        return Err(PkiError::CaNotValid(format!(
            "it is valid only from {ca_not_before}"
        )));
    }
    if now_secs >= ca_not_after.timestamp() {
        return Err(PkiError::CaNotValid(format!(
            "it expired at {ca_not_after}"
        )));
    }
    let issuer = Issuer::new(issuer_params(&ca_cert)?, ca_key);

    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    if !leaf.common_name.is_empty() {
        params
            .distinguished_name
            .push(DnType::CommonName, leaf.common_name.as_str());
    }
    let ia5 = |what: &str, value: &str| {
        if value.is_empty() {
            return Err(invalid(format!("its {what} is empty")));
        }
        Ia5String::try_from(value)
            .map_err(|e| invalid(format!("its {what} {value:?} is not ASCII: {e}")))
    };
    let mut sans = Vec::new();
    if let Some(email) = &leaf.email {
        sans.push(SanType::Rfc822Name(ia5("email", email)?));
    }
    for dns in &leaf.dns_names {
        sans.push(SanType::DnsName(ia5("DNS name", dns)?));
    }
    sans.extend(leaf.ip_addresses.iter().copied().map(SanType::IpAddress));
    if leaf.common_name.is_empty() && sans.is_empty() {
        return Err(invalid("it names nothing (no common name, no SAN)".into()));
    }
    params.subject_alt_names = sans;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = match leaf.usage {
        Usage::Server => vec![ExtendedKeyUsagePurpose::ServerAuth],
        Usage::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
        Usage::ServerAndClient => vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
    };
    params.use_authority_key_identifier_extension = true;
    let (not_before, not_after) = validity(now, LEAF_LIFETIME)
        .ok_or_else(|| invalid(format!("its validity from {now:?} is out of range")))?;
    let not_after = not_after.min(system_time(ca_not_after.timestamp()));
    params.not_before = not_before.into();
    params.not_after = not_after.into();
    params.serial_number = Some(random_serial()?);

    let key = generate_key()?;
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(|e| PkiError::Signing(e.to_string()))?;

    // The issuer name is rebuilt from the CA's subject: a client matches the two byte for
    // byte, so make sure they are the same.
    let (_, issued) = x509_parser::parse_x509_certificate(cert.der())
        .map_err(|e| PkiError::Signing(format!("the signed certificate does not parse: {e}")))?;
    if issued.issuer().as_raw() != ca_cert.subject().as_raw() {
        return Err(PkiError::CaUnusable(format!(
            "its subject {} cannot be written back identically as an issuer name",
            ca_cert.subject()
        )));
    }

    Ok(Pem {
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

/// Why an existing leaf (`existing_cert_pem`) must be issued again, or None if it is good:
/// it does not parse; `ca_cert_pem` (the current CA) did not sign it; its subject common
/// name, email SAN, DNS SANs or IP SANs differ from `leaf` (in any order); its extended key
/// usages are not those of `leaf.usage`; it is not yet valid, expired, or expires within
/// [`RENEW_BEFORE`] of `now`. Pure.
pub fn renewal_reason(
    existing_cert_pem: &str,
    ca_cert_pem: &str,
    leaf: &Leaf,
    now: SystemTime,
) -> Option<String> {
    let der = match certificate_der(existing_cert_pem) {
        Ok(der) => der,
        Err(e) => return Some(format!("the certificate does not parse: {e}")),
    };
    let cert = match parse_certificate(&der) {
        Ok(cert) => cert,
        Err(e) => return Some(format!("the certificate does not parse: {e}")),
    };
    let ca_der = match certificate_der(ca_cert_pem) {
        Ok(der) => der,
        Err(e) => return Some(format!("the CA certificate does not parse: {e}")),
    };
    let ca = match parse_certificate(&ca_der) {
        Ok(ca) => ca,
        Err(e) => return Some(format!("the CA certificate does not parse: {e}")),
    };

    if cert.issuer().as_raw() != ca.subject().as_raw() {
        return Some(format!(
            "it was issued by {}, not by the current CA {}",
            cert.issuer(),
            ca.subject()
        ));
    }
    if let Err(e) = cert.verify_signature(Some(ca.public_key())) {
        return Some(format!(
            "its signature does not verify with the current CA's key ({e}): another CA of the same name signed it"
        ));
    }

    let names = match Names::of(&cert) {
        Ok(names) => names,
        Err(e) => return Some(format!("its extensions do not parse: {e}")),
    };
    if names.common_name.as_deref() != Some(leaf.common_name.as_str()).filter(|cn| !cn.is_empty()) {
        return Some(format!(
            "its common name is {:?}, the leaf's is {:?}",
            names.common_name.unwrap_or_default(),
            leaf.common_name
        ));
    }
    let emails: BTreeSet<String> = leaf.email.iter().cloned().collect();
    if names.emails != emails {
        return Some(format!(
            "its email SANs are {:?}, the leaf's are {:?}",
            names.emails, emails
        ));
    }
    let dns_names: BTreeSet<String> = leaf.dns_names.iter().cloned().collect();
    if names.dns_names != dns_names {
        return Some(format!(
            "its DNS SANs are {:?}, the leaf's are {:?}",
            names.dns_names, dns_names
        ));
    }
    let ips: BTreeSet<IpAddr> = leaf.ip_addresses.iter().copied().collect();
    if names.ip_addresses != ips {
        return Some(format!(
            "its IP SANs are {:?}, the leaf's are {:?}",
            names.ip_addresses, ips
        ));
    }
    if names.usage != Some(leaf.usage) {
        return Some(match names.usage {
            Some(usage) => format!("it is for {usage:?}, the leaf is for {:?}", leaf.usage),
            None => format!(
                "its extended key usages are not those of {:?} (serverAuth and/or clientAuth)",
                leaf.usage
            ),
        });
    }

    validity_reason(&cert, now, RENEW_BEFORE)
}

/// Why the CA (`ca_cert_pem`) must be made anew, or None if it is good: it does not parse, it
/// is not a CA (basicConstraints CA:true, and keyCertSign if it has a keyUsage), it is not yet
/// valid, expired, or expires within [`CA_RENEW_BEFORE`] of `now`. Pure.
pub fn ca_renewal_reason(ca_cert_pem: &str, now: SystemTime) -> Option<String> {
    let der = match certificate_der(ca_cert_pem) {
        Ok(der) => der,
        Err(e) => return Some(format!("the CA certificate does not parse: {e}")),
    };
    let cert = match parse_certificate(&der) {
        Ok(cert) => cert,
        Err(e) => return Some(format!("the CA certificate does not parse: {e}")),
    };
    if let Some(reason) = not_a_ca(&cert) {
        return Some(reason);
    }
    validity_reason(&cert, now, CA_RENEW_BEFORE)
}

/// When the certificate expires (its notAfter); None when it does not parse. For status
/// reporting.
pub fn not_after(cert_pem: &str) -> Option<SystemTime> {
    let der = certificate_der(cert_pem).ok()?;
    let cert = parse_certificate(&der).ok()?;
    Some(system_time(cert.validity().not_after.timestamp()))
}

/// A new bearer token: 32 random bytes from the operating system's generator, in lowercase
/// hex (64 characters).
pub fn new_token() -> Result<String, PkiError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| PkiError::Randomness(e.to_string()))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The common name of the certificate of an instance's tablet servers:
/// `server.<instance>.<namespace>.basalt`. It has no email, so its principal (IAM member) is
/// `user:server.<instance>.<namespace>.basalt` ([`principal`]).
pub fn server_common_name(namespace: &str, instance: &str) -> String {
    format!("server.{instance}.{namespace}.basalt")
}

/// The common name of the client certificate of an instance's master:
/// `master.<instance>.<namespace>.basalt` (principal `user:master.<instance>.<namespace>.basalt`).
pub fn master_common_name(namespace: &str, instance: &str) -> String {
    format!("master.{instance}.{namespace}.basalt")
}

/// The email SAN (and common name) of an application identity `name` declared in the
/// Instance: `<name>@<instance>.<namespace>.basalt`; its principal is `user:` + that email.
pub fn identity_email(namespace: &str, instance: &str, name: &str) -> String {
    format!("{name}@{instance}.{namespace}.basalt")
}

/// `user:` + a common name or email: the principal (IAM member) the tablet server derives
/// from a certificate of this module (it takes the email SAN first, else the common name,
/// else the first DNS SAN).
pub fn principal(name_or_email: &str) -> String {
    format!("user:{name_or_email}")
}

/// The leaf of an instance's tablet servers: for server and client use (the servers dial
/// each other with it), common name [`server_common_name`], which is also its first DNS SAN
/// (what peers and Basalt's processes check), then the names and addresses clients dial.
pub fn server_leaf(
    namespace: &str,
    instance: &str,
    dns_names: Vec<String>,
    ip_addresses: Vec<IpAddr>,
) -> Leaf {
    let common_name = server_common_name(namespace, instance);
    Leaf {
        dns_names: [common_name.clone(), INTERNAL_NAME.to_string()]
            .into_iter()
            .chain(dns_names)
            .collect(),
        common_name,
        email: None,
        ip_addresses,
        usage: Usage::ServerAndClient,
    }
}

/// The client leaf of an instance's master, common name [`master_common_name`].
pub fn master_leaf(namespace: &str, instance: &str) -> Leaf {
    internal(client_leaf(master_common_name(namespace, instance), None))
}

/// The operator's client leaf, common name [`OPERATOR_COMMON_NAME`].
pub fn operator_leaf() -> Leaf {
    internal(client_leaf(OPERATOR_COMMON_NAME.to_string(), None))
}

/// A client leaf of one of Basalt's own processes: with [`INTERNAL_NAME`].
fn internal(mut leaf: Leaf) -> Leaf {
    leaf.dns_names.push(INTERNAL_NAME.into());
    leaf
}

/// The client leaf of an application identity `name` declared in the Instance: common name
/// and email SAN both [`identity_email`].
pub fn identity_leaf(namespace: &str, instance: &str, name: &str) -> Leaf {
    let email = identity_email(namespace, instance, name);
    client_leaf(email.clone(), Some(email))
}

/// The leaf of the metadata store (etcd): for server and client use (its members dial each
/// other), common name [`ETCD_COMMON_NAME`], which is also its first DNS SAN (what
/// Basalt's processes check), then the names and addresses it is dialed by.
pub fn etcd_leaf(dns_names: Vec<String>, ip_addresses: Vec<IpAddr>) -> Leaf {
    Leaf {
        common_name: ETCD_COMMON_NAME.to_string(),
        email: None,
        dns_names: [ETCD_COMMON_NAME.to_string(), INTERNAL_NAME.to_string()]
            .into_iter()
            .chain(dns_names)
            .collect(),
        ip_addresses,
        usage: Usage::ServerAndClient,
    }
}

fn client_leaf(common_name: String, email: Option<String>) -> Leaf {
    Leaf {
        common_name,
        email,
        dns_names: Vec::new(),
        ip_addresses: Vec::new(),
        usage: Usage::Client,
    }
}

/// The identities a certificate names.
struct Names {
    common_name: Option<String>,
    emails: BTreeSet<String>,
    dns_names: BTreeSet<String>,
    ip_addresses: BTreeSet<IpAddr>,
    /// None: its extended key usages are none of [`Usage`]'s.
    usage: Option<Usage>,
}

impl Names {
    fn of(cert: &X509Certificate<'_>) -> Result<Names, String> {
        let common_name = cert
            .subject()
            .iter_common_name()
            .next()
            .map(|cn| {
                cn.as_str()
                    .map(str::to_string)
                    .map_err(|e| format!("its common name is not a string: {e}"))
            })
            .transpose()?;
        let mut names = Names {
            common_name,
            emails: BTreeSet::new(),
            dns_names: BTreeSet::new(),
            ip_addresses: BTreeSet::new(),
            usage: None,
        };
        let sans = cert
            .subject_alternative_name()
            .map_err(|e| format!("subjectAltName: {e}"))?;
        for name in sans.iter().flat_map(|sans| &sans.value.general_names) {
            match name {
                GeneralName::RFC822Name(email) => {
                    names.emails.insert(email.to_string());
                }
                GeneralName::DNSName(dns) => {
                    names.dns_names.insert(dns.to_string());
                }
                GeneralName::IPAddress(bytes) => {
                    let ip = match bytes.len() {
                        4 => <[u8; 4]>::try_from(*bytes).map(IpAddr::from).ok(),
                        16 => <[u8; 16]>::try_from(*bytes).map(IpAddr::from).ok(),
                        _ => None,
                    };
                    let ip = ip.ok_or_else(|| {
                        format!("an IP SAN has {} bytes (4 or 16 expected)", bytes.len())
                    })?;
                    names.ip_addresses.insert(ip);
                }
                _ => {}
            }
        }
        let eku = cert
            .extended_key_usage()
            .map_err(|e| format!("extendedKeyUsage: {e}"))?;
        names.usage = eku.and_then(|eku| match (eku.value.server_auth, eku.value.client_auth) {
            (true, true) => Some(Usage::ServerAndClient),
            (true, false) => Some(Usage::Server),
            (false, true) => Some(Usage::Client),
            (false, false) => None,
        });
        Ok(names)
    }
}

/// Why a certificate is not valid at `now` or expires within `renew_before` of it.
fn validity_reason(
    cert: &X509Certificate<'_>,
    now: SystemTime,
    renew_before: Duration,
) -> Option<String> {
    let now_secs = unix_seconds(now);
    let not_before = cert.validity().not_before;
    let not_after = cert.validity().not_after;
    if now_secs < not_before.timestamp() {
        return Some(format!("it is not valid yet (from {not_before})"));
    }
    if now_secs >= not_after.timestamp() {
        return Some(format!("it expired at {not_after}"));
    }
    let renew_secs = i64::try_from(renew_before.as_secs()).unwrap_or(i64::MAX);
    if not_after.timestamp() - now_secs < renew_secs {
        return Some(format!(
            "it expires at {not_after}, in less than {} days",
            renew_before.as_secs() / (24 * 3600)
        ));
    }
    None
}

/// Why a certificate cannot sign leaves, or None.
fn not_a_ca(cert: &X509Certificate<'_>) -> Option<String> {
    match cert.basic_constraints() {
        Err(e) => return Some(format!("its basicConstraints do not parse: {e}")),
        Ok(Some(bc)) if bc.value.ca => {}
        Ok(_) => return Some("it is not a CA (no basicConstraints CA:true)".into()),
    }
    match cert.key_usage() {
        Err(e) => Some(format!("its keyUsage does not parse: {e}")),
        Ok(Some(ku)) if !ku.value.key_cert_sign() => {
            Some("its keyUsage does not allow keyCertSign".into())
        }
        Ok(_) => None,
    }
}

/// What rcgen needs of the CA to sign with it: its subject (written as the leaf's issuer)
/// and its subject key identifier (the leaf's authority key identifier).
fn issuer_params(ca: &X509Certificate<'_>) -> Result<CertificateParams, PkiError> {
    let mut params = CertificateParams::default();
    params.distinguished_name = distinguished_name(ca.subject()).map_err(PkiError::CaUnusable)?;
    let ski = ca
        .iter_extensions()
        .find_map(|ext| match ext.parsed_extension() {
            ParsedExtension::SubjectKeyIdentifier(id) => Some(id.0.to_vec()),
            _ => None,
        });
    if let Some(ski) = ski {
        params.key_identifier_method = KeyIdMethod::PreSpecified(ski);
    }
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    Ok(params)
}

/// An X.509 name as rcgen writes it (one attribute per RDN, the same string types).
fn distinguished_name(name: &X509Name<'_>) -> Result<DistinguishedName, String> {
    let mut dn = DistinguishedName::new();
    for rdn in name.iter() {
        let mut attributes = rdn.iter();
        let (Some(attribute), None) = (attributes.next(), attributes.next()) else {
            return Err(format!(
                "its subject {name} has a relative name of other than one attribute"
            ));
        };
        let oid = attribute
            .attr_type()
            .iter()
            .ok_or_else(|| format!("its subject {name} has an attribute type out of range"))?
            .collect::<Vec<u64>>();
        let value = attribute.attr_value();
        let bad = |e: &dyn std::fmt::Display| format!("its subject {name} has a bad string: {e}");
        let text = || std::str::from_utf8(value.data).map_err(|e| bad(&e));
        let value = match value.tag() {
            Tag::Utf8String => DnValue::Utf8String(text()?.to_string()),
            Tag::PrintableString => {
                DnValue::PrintableString(PrintableString::try_from(text()?).map_err(|e| bad(&e))?)
            }
            Tag::Ia5String => {
                DnValue::Ia5String(Ia5String::try_from(text()?).map_err(|e| bad(&e))?)
            }
            Tag::T61String => {
                DnValue::TeletexString(TeletexString::try_from(text()?).map_err(|e| bad(&e))?)
            }
            Tag::BmpString => DnValue::BmpString(
                BmpString::from_utf16be(value.data.to_vec()).map_err(|e| bad(&e))?,
            ),
            Tag::UniversalString => DnValue::UniversalString(
                UniversalString::from_utf32be(value.data.to_vec()).map_err(|e| bad(&e))?,
            ),
            tag => {
                return Err(format!(
                    "its subject {name} has a value of an unsupported type ({tag})"
                ));
            }
        };
        dn.push(DnType::from_oid(&oid), value);
    }
    Ok(dn)
}

/// The DER of the (first) certificate of a PEM text.
fn certificate_der(pem: &str) -> Result<Vec<u8>, String> {
    let (_, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes())
        .map_err(|e| format!("it is not PEM: {e}"))?;
    if block.label != "CERTIFICATE" {
        return Err(format!(
            "its PEM block is a {:?}, not a CERTIFICATE",
            block.label
        ));
    }
    Ok(block.contents)
}

fn parse_certificate(der: &[u8]) -> Result<X509Certificate<'_>, String> {
    let (rest, cert) =
        x509_parser::parse_x509_certificate(der).map_err(|e| format!("not X.509: {e}"))?;
    if !rest.is_empty() {
        return Err(format!(
            "{} bytes follow the certificate in its PEM block",
            rest.len()
        ));
    }
    Ok(cert)
}

fn generate_key() -> Result<KeyPair, PkiError> {
    KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(|e| PkiError::KeyGeneration(e.to_string()))
}

/// A random positive 128-bit serial number (RFC 5280 allows up to 20 bytes).
fn random_serial() -> Result<SerialNumber, PkiError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| PkiError::Randomness(e.to_string()))?;
    // Positive, and 16 bytes long once encoded.
    bytes[0] = (bytes[0] & 0x7f) | 0x40;
    Ok(SerialNumber::from_slice(&bytes))
}

/// From `now` - [`CLOCK_SKEW`] for `lifetime`, to whole seconds (what a certificate holds);
/// None if out of range.
fn validity(now: SystemTime, lifetime: Duration) -> Option<(SystemTime, SystemTime)> {
    let not_before = system_time(unix_seconds(now.checked_sub(CLOCK_SKEW)?));
    let not_after = not_before.checked_add(lifetime)?;
    Some((not_before, not_after))
}

/// Whole seconds since the Unix epoch (negative before it), rounded down.
fn unix_seconds(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => {
            let before = e.duration();
            let secs = i64::try_from(before.as_secs()).unwrap_or(i64::MAX);
            if before.subsec_nanos() > 0 {
                -secs - 1
            } else {
                -secs
            }
        }
    }
}

fn system_time(unix_seconds: i64) -> SystemTime {
    if unix_seconds >= 0 {
        UNIX_EPOCH + Duration::from_secs(unix_seconds.unsigned_abs())
    } else {
        UNIX_EPOCH - Duration::from_secs(unix_seconds.unsigned_abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    const DAY: Duration = Duration::from_secs(24 * 3600);

    /// A fixed, whole-second time (certificates hold whole seconds).
    fn t0() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_750_000_000)
    }

    fn der(pem: &str) -> Vec<u8> {
        certificate_der(pem).unwrap()
    }

    fn server() -> Leaf {
        server_leaf(
            "prod",
            "orders",
            vec!["orders-server.prod.svc".into(), "localhost".into()],
            vec![
                IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V6(Ipv6Addr::LOCALHOST),
            ],
        )
    }

    fn at(cert: &X509Certificate<'_>) -> (SystemTime, SystemTime) {
        (
            system_time(cert.validity().not_before.timestamp()),
            system_time(cert.validity().not_after.timestamp()),
        )
    }

    #[test]
    fn a_new_ca_is_a_self_signed_ca_for_ten_years() {
        let ca = new_ca("basalt-ca", t0()).unwrap();
        assert!(
            ca.key.starts_with("-----BEGIN PRIVATE KEY-----"),
            "{}",
            ca.key
        );
        let der = der(&ca.cert);
        let cert = parse_certificate(&der).unwrap();
        assert_eq!(cert.subject().to_string(), "CN=basalt-ca");
        assert_eq!(cert.issuer().as_raw(), cert.subject().as_raw());
        cert.verify_signature(None).unwrap();
        let bc = cert.basic_constraints().unwrap().unwrap();
        assert!(bc.critical);
        assert!(bc.value.ca);
        assert_eq!(bc.value.path_len_constraint, Some(0));
        let ku = cert.key_usage().unwrap().unwrap().value;
        assert!(ku.key_cert_sign() && ku.crl_sign());
        assert!(!ku.digital_signature());
        assert_eq!(
            at(&cert),
            (t0() - CLOCK_SKEW, t0() - CLOCK_SKEW + CA_LIFETIME)
        );
        // The key is the certificate's, and P-256.
        let key = KeyPair::from_pem(&ca.key).unwrap();
        assert_eq!(key.subject_public_key_info(), cert.public_key().raw);
        assert_eq!(key.algorithm(), &rcgen::PKCS_ECDSA_P256_SHA256);
        assert!(not_a_ca(&cert).is_none());
        // Another CA of the same name is another key.
        let other = new_ca("basalt-ca", t0()).unwrap();
        assert_ne!(other.key, ca.key);
        assert!(matches!(
            new_ca("", t0()),
            Err(PkiError::InvalidCaName { .. })
        ));
    }

    #[test]
    fn an_issued_leaf_is_signed_by_the_ca_and_names_what_was_asked() {
        let ca = new_ca("basalt-ca", t0()).unwrap();
        let ca_der = der(&ca.cert);
        let ca_cert = parse_certificate(&ca_der).unwrap();
        let now = t0() + 10 * DAY;
        let leaf = server();
        let issued = issue(&ca, &leaf, now).unwrap();
        assert!(issued.cert.starts_with("-----BEGIN CERTIFICATE-----"));
        assert_eq!(
            issued.cert.matches("BEGIN CERTIFICATE").count(),
            1,
            "the leaf only"
        );
        let der = der(&issued.cert);
        let cert = parse_certificate(&der).unwrap();

        assert_eq!(cert.issuer().as_raw(), ca_cert.subject().as_raw());
        cert.verify_signature(Some(ca_cert.public_key())).unwrap();
        assert!(cert.verify_signature(None).is_err(), "not self-signed");
        // The authority key identifier is the CA's subject key identifier.
        let ski = ca_cert
            .iter_extensions()
            .find_map(|e| match e.parsed_extension() {
                ParsedExtension::SubjectKeyIdentifier(id) => Some(id.0.to_vec()),
                _ => None,
            });
        let aki = cert
            .iter_extensions()
            .find_map(|e| match e.parsed_extension() {
                ParsedExtension::AuthorityKeyIdentifier(aki) => {
                    aki.key_identifier.as_ref().map(|id| id.0.to_vec())
                }
                _ => None,
            });
        assert!(ski.is_some());
        assert_eq!(aki, ski);

        assert_eq!(cert.subject().to_string(), "CN=server.orders.prod.basalt");
        let names = Names::of(&cert).unwrap();
        assert_eq!(
            names.common_name.as_deref(),
            Some("server.orders.prod.basalt")
        );
        assert!(names.emails.is_empty());
        assert_eq!(
            names.dns_names,
            BTreeSet::from([
                "server.orders.prod.basalt".to_string(),
                INTERNAL_NAME.to_string(),
                "localhost".to_string(),
                "orders-server.prod.svc".to_string()
            ])
        );
        assert_eq!(
            names.ip_addresses,
            BTreeSet::from([
                IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V6(Ipv6Addr::LOCALHOST)
            ])
        );
        let eku = cert.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.server_auth && eku.client_auth);
        let ku = cert.key_usage().unwrap().unwrap().value;
        assert!(ku.digital_signature() && ku.key_encipherment());
        assert!(!ku.key_cert_sign());
        assert!(!cert.is_ca());
        assert!(not_a_ca(&cert).is_some());

        let (not_before, not_after) = at(&cert);
        assert_eq!(not_before, now - CLOCK_SKEW);
        assert_eq!(not_after.duration_since(not_before).unwrap(), LEAF_LIFETIME);
        assert!(not_after <= at(&ca_cert).1);

        // The key is the certificate's, and P-256.
        assert!(issued.key.starts_with("-----BEGIN PRIVATE KEY-----"));
        let key = KeyPair::from_pem(&issued.key).unwrap();
        assert_eq!(key.subject_public_key_info(), cert.public_key().raw);
        assert_eq!(key.algorithm(), &rcgen::PKCS_ECDSA_P256_SHA256);

        // Issued again: another key, another (random, positive, 16-byte) serial number.
        let again = issue(&ca, &leaf, now).unwrap();
        assert_ne!(again.key, issued.key);
        let again_der = certificate_der(&again.cert).unwrap();
        let again_cert = parse_certificate(&again_der).unwrap();
        assert_ne!(again_cert.raw_serial(), cert.raw_serial());
        assert_eq!(cert.raw_serial().len(), 16);
        assert!(cert.raw_serial()[0] & 0x80 == 0);
    }

    #[test]
    fn each_usage_gets_its_extended_key_usages() {
        let ca = new_ca("basalt-ca", t0()).unwrap();
        for (usage, server_auth, client_auth) in [
            (Usage::Server, true, false),
            (Usage::Client, false, true),
            (Usage::ServerAndClient, true, true),
        ] {
            let leaf = Leaf { usage, ..server() };
            let issued = issue(&ca, &leaf, t0()).unwrap();
            let der = der(&issued.cert);
            let cert = parse_certificate(&der).unwrap();
            let eku = cert.extended_key_usage().unwrap().unwrap().value;
            assert_eq!(
                (eku.server_auth, eku.client_auth),
                (server_auth, client_auth),
                "{usage:?}"
            );
            assert_eq!(Names::of(&cert).unwrap().usage, Some(usage));
        }
    }

    #[test]
    fn a_leaf_never_outlives_its_ca() {
        let ca = new_ca("basalt-ca", t0()).unwrap();
        let ca_end = not_after(&ca.cert).unwrap();
        let now = ca_end - 10 * DAY;
        let issued = issue(&ca, &operator_leaf(), now).unwrap();
        assert_eq!(not_after(&issued.cert), Some(ca_end));
        // Its life is short, so it is renewed at once — with the CA, whose own renewal is due.
        assert!(renewal_reason(&issued.cert, &ca.cert, &operator_leaf(), now).is_some());
        assert!(ca_renewal_reason(&ca.cert, now).is_some());
    }

    #[test]
    fn issuing_says_what_is_wrong_with_the_ca_or_the_leaf() {
        let ca = new_ca("basalt-ca", t0()).unwrap();
        let other = new_ca("basalt-ca", t0()).unwrap();
        let leaf = operator_leaf();

        let garbage = Pem {
            cert: "not a certificate".into(),
            key: ca.key.clone(),
        };
        let e = issue(&garbage, &leaf, t0()).unwrap_err();
        assert!(matches!(e, PkiError::CaCertificateParse(_)), "{e}");
        assert!(
            e.to_string()
                .starts_with("the CA certificate does not parse: "),
            "{e}"
        );

        let bad_key = Pem {
            cert: ca.cert.clone(),
            key: "not a key".into(),
        };
        assert!(matches!(
            issue(&bad_key, &leaf, t0()),
            Err(PkiError::CaKeyParse(_))
        ));

        let mismatched = Pem {
            cert: ca.cert.clone(),
            key: other.key.clone(),
        };
        assert!(matches!(
            issue(&mismatched, &leaf, t0()),
            Err(PkiError::CaKeyMismatch)
        ));

        // A leaf cannot sign.
        let a_leaf = issue(&ca, &leaf, t0()).unwrap();
        let e = issue(&a_leaf, &leaf, t0()).unwrap_err();
        assert!(matches!(e, PkiError::CaUnusable(_)), "{e}");

        let expired = not_after(&ca.cert).unwrap() + DAY;
        let e = issue(&ca, &leaf, expired).unwrap_err();
        assert!(matches!(e, PkiError::CaNotValid(_)), "{e}");
        let e = issue(&ca, &leaf, t0() - DAY).unwrap_err();
        assert!(matches!(e, PkiError::CaNotValid(_)), "{e}");

        let bad_dns = Leaf {
            dns_names: vec!["bücher.example".into()],
            ..server()
        };
        let e = issue(&ca, &bad_dns, t0()).unwrap_err();
        assert!(matches!(e, PkiError::InvalidLeaf { .. }), "{e}");
        let nameless = Leaf {
            common_name: String::new(),
            email: None,
            dns_names: vec![],
            ip_addresses: vec![],
            usage: Usage::Client,
        };
        assert!(matches!(
            issue(&ca, &nameless, t0()),
            Err(PkiError::InvalidLeaf { .. })
        ));
    }

    #[test]
    fn a_fresh_leaf_needs_no_renewal_until_a_third_of_its_life_is_left() {
        let ca = new_ca("basalt-ca", t0()).unwrap();
        let leaf = server();
        let issued = issue(&ca, &leaf, t0()).unwrap();
        assert_eq!(renewal_reason(&issued.cert, &ca.cert, &leaf, t0()), None);
        // Its SANs in another order are the same SANs.
        let reordered = Leaf {
            dns_names: leaf.dns_names.iter().rev().cloned().collect(),
            ip_addresses: leaf.ip_addresses.iter().rev().copied().collect(),
            ..leaf.clone()
        };
        assert_eq!(
            renewal_reason(&issued.cert, &ca.cert, &reordered, t0()),
            None
        );
        // Valid from an hour ago (clock skew).
        assert_eq!(
            renewal_reason(&issued.cert, &ca.cert, &leaf, t0() - CLOCK_SKEW),
            None
        );
        assert_eq!(
            renewal_reason(&issued.cert, &ca.cert, &leaf, t0() + 59 * DAY),
            None
        );

        let reason = renewal_reason(&issued.cert, &ca.cert, &leaf, t0() + 61 * DAY).unwrap();
        assert!(reason.contains("in less than 30 days"), "{reason}");
        let reason = renewal_reason(&issued.cert, &ca.cert, &leaf, t0() + 91 * DAY).unwrap();
        assert!(reason.contains("expired"), "{reason}");
        let reason = renewal_reason(&issued.cert, &ca.cert, &leaf, t0() - 2 * CLOCK_SKEW).unwrap();
        assert!(reason.contains("not valid yet"), "{reason}");
    }

    #[test]
    fn a_leaf_of_another_ca_is_renewed() {
        let ca = new_ca("basalt-ca", t0()).unwrap();
        let leaf = master_leaf("prod", "orders");
        let issued = issue(&ca, &leaf, t0()).unwrap();

        // Another CA of the same name: only the signature tells them apart.
        let same_name = new_ca("basalt-ca", t0()).unwrap();
        let reason = renewal_reason(&issued.cert, &same_name.cert, &leaf, t0()).unwrap();
        assert!(reason.contains("signature does not verify"), "{reason}");

        let other_name = new_ca("other-ca", t0()).unwrap();
        let reason = renewal_reason(&issued.cert, &other_name.cert, &leaf, t0()).unwrap();
        assert!(reason.contains("issued by CN=basalt-ca"), "{reason}");
    }

    #[test]
    fn a_leaf_that_names_something_else_is_renewed() {
        let ca = new_ca("basalt-ca", t0()).unwrap();
        let leaf = server();
        let issued = issue(&ca, &leaf, t0()).unwrap();
        let reason = |wanted: &Leaf| renewal_reason(&issued.cert, &ca.cert, wanted, t0());

        let mut more_dns = leaf.clone();
        more_dns.dns_names.push("orders-server-0.prod.svc".into());
        assert!(reason(&more_dns).unwrap().contains("DNS SANs"));

        let mut fewer_dns = leaf.clone();
        fewer_dns.dns_names.pop();
        assert!(reason(&fewer_dns).unwrap().contains("DNS SANs"));

        let mut other_ip = leaf.clone();
        other_ip.ip_addresses[0] = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 7));
        assert!(reason(&other_ip).unwrap().contains("IP SANs"));

        let other_cn = server_leaf(
            "prod",
            "billing",
            leaf.dns_names.clone(),
            leaf.ip_addresses.clone(),
        );
        assert!(reason(&other_cn).unwrap().contains("common name"));

        let with_email = Leaf {
            email: Some("x@orders.prod.basalt".into()),
            ..leaf.clone()
        };
        assert!(reason(&with_email).unwrap().contains("email"));

        let client_only = Leaf {
            usage: Usage::Client,
            ..leaf.clone()
        };
        assert!(reason(&client_only).unwrap().contains("Client"));

        // And an identity whose name changes.
        let alice = identity_leaf("prod", "orders", "alice");
        let alice_cert = issue(&ca, &alice, t0()).unwrap();
        assert_eq!(
            renewal_reason(&alice_cert.cert, &ca.cert, &alice, t0()),
            None
        );
        let bob = identity_leaf("prod", "orders", "bob");
        assert!(renewal_reason(&alice_cert.cert, &ca.cert, &bob, t0()).is_some());
    }

    #[test]
    fn garbage_is_renewed() {
        let ca = new_ca("basalt-ca", t0()).unwrap();
        let leaf = operator_leaf();
        for garbage in [
            "",
            "garbage",
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
            ca.key.as_str(),
        ] {
            let reason = renewal_reason(garbage, &ca.cert, &leaf, t0()).unwrap();
            assert!(
                reason.starts_with("the certificate does not parse: "),
                "{reason}"
            );
        }
        let issued = issue(&ca, &leaf, t0()).unwrap();
        let reason = renewal_reason(&issued.cert, "garbage", &leaf, t0()).unwrap();
        assert!(
            reason.starts_with("the CA certificate does not parse: "),
            "{reason}"
        );
    }

    #[test]
    fn the_ca_is_renewed_when_less_than_a_year_is_left() {
        let ca = new_ca("basalt-ca", t0()).unwrap();
        assert_eq!(ca_renewal_reason(&ca.cert, t0()), None);
        assert_eq!(ca_renewal_reason(&ca.cert, t0() + 8 * 365 * DAY), None);
        let reason = ca_renewal_reason(&ca.cert, t0() + 3467 * DAY).unwrap(); // 9.5 years
        assert!(reason.contains("in less than 365 days"), "{reason}");
        let reason = ca_renewal_reason(&ca.cert, t0() + 11 * 365 * DAY).unwrap();
        assert!(reason.contains("expired"), "{reason}");

        let reason = ca_renewal_reason("garbage", t0()).unwrap();
        assert!(
            reason.starts_with("the CA certificate does not parse: "),
            "{reason}"
        );
        let leaf = issue(&ca, &operator_leaf(), t0()).unwrap();
        let reason = ca_renewal_reason(&leaf.cert, t0()).unwrap();
        assert!(reason.contains("not a CA"), "{reason}");
    }

    #[test]
    fn not_after_is_when_the_certificate_expires() {
        let ca = new_ca("basalt-ca", t0()).unwrap();
        assert_eq!(not_after(&ca.cert), Some(t0() - CLOCK_SKEW + CA_LIFETIME));
        let leaf = issue(&ca, &operator_leaf(), t0()).unwrap();
        assert_eq!(
            not_after(&leaf.cert),
            Some(t0() - CLOCK_SKEW + LEAF_LIFETIME)
        );
        assert_eq!(not_after("garbage"), None);
    }

    #[test]
    fn tokens_are_64_random_hex_characters() {
        let a = new_token().unwrap();
        let b = new_token().unwrap();
        assert_eq!(a.len(), 64);
        assert!(
            a.chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()),
            "{a}"
        );
        assert_ne!(a, b);
    }

    #[test]
    fn identities_are_named_per_instance() {
        assert_eq!(
            server_common_name("prod", "orders"),
            "server.orders.prod.basalt"
        );
        assert_eq!(
            master_common_name("prod", "orders"),
            "master.orders.prod.basalt"
        );
        assert_eq!(
            identity_email("prod", "orders", "alice"),
            "alice@orders.prod.basalt"
        );
        assert_eq!(
            principal(&server_common_name("prod", "orders")),
            "user:server.orders.prod.basalt"
        );

        let server = server_leaf("prod", "orders", vec!["a".into()], vec![]);
        assert_eq!(server.common_name, "server.orders.prod.basalt");
        assert_eq!(server.usage, Usage::ServerAndClient);
        // Its common name is its first DNS SAN: what peers check; then the name etcd admits
        // (Basalt's own processes carry it, applications' identities do not).
        assert_eq!(
            server.dns_names,
            [
                "server.orders.prod.basalt".to_string(),
                INTERNAL_NAME.to_string(),
                "a".to_string()
            ]
        );
        let master = master_leaf("prod", "orders");
        assert_eq!(master.common_name, "master.orders.prod.basalt");
        assert_eq!((master.email, master.usage), (None, Usage::Client));
        assert_eq!(master.dns_names, [INTERNAL_NAME]);
        let operator = operator_leaf();
        assert_eq!(operator.common_name, OPERATOR_COMMON_NAME);
        assert_eq!(operator.usage, Usage::Client);
        assert_eq!(operator.dns_names, [INTERNAL_NAME]);
        let alice = identity_leaf("prod", "orders", "alice");
        assert_eq!(alice.common_name, "alice@orders.prod.basalt");
        assert_eq!(alice.email.as_deref(), Some("alice@orders.prod.basalt"));
        assert_eq!(alice.usage, Usage::Client);
        assert!(alice.dns_names.is_empty());
        let etcd = etcd_leaf(vec!["etcd".into()], vec![IpAddr::V4(Ipv4Addr::LOCALHOST)]);
        assert_eq!(etcd.common_name, "etcd.basalt");
        assert_eq!(etcd.usage, Usage::ServerAndClient);
    }

    #[test]
    fn the_tablet_server_derives_the_documented_principals() {
        let ca = new_ca("basalt-ca", t0()).unwrap();
        for (leaf, expected) in [
            (
                identity_leaf("prod", "orders", "alice"),
                principal(&identity_email("prod", "orders", "alice")),
            ),
            (server(), principal(&server_common_name("prod", "orders"))),
            (
                master_leaf("prod", "orders"),
                principal(&master_common_name("prod", "orders")),
            ),
            (operator_leaf(), principal(OPERATOR_COMMON_NAME)),
        ] {
            let issued = issue(&ca, &leaf, t0()).unwrap();
            let der = der(&issued.cert);
            assert_eq!(
                basalt_tablet_server::auth::certificate_principal(&der),
                Some(expected)
            );
        }
    }
}
