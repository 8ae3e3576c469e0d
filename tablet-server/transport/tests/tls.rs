//! The TLS listener against real handshakes (tokio-rustls clients over 127.0.0.1): mutual TLS
//! accepted with a certificate the CA signed and refused without one or with a stranger's,
//! the client's certificate handed to the handlers, and a rotation of the files served to the
//! next connection while an established one keeps working.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use basalt_transport::{Conn, Incoming, Security, TlsFiles, incoming};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_stream::StreamExt;
use tonic::transport::server::Connected;

struct Ca {
    cert: rcgen::Certificate,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

fn ca(name: &str) -> Ca {
    let mut params = rcgen::CertificateParams::new(vec![]).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    Ca {
        cert,
        issuer: rcgen::Issuer::new(params, key),
    }
}

/// A leaf certificate and its key (PEM) signed by `ca`.
fn leaf(ca: &Ca, cn: &str, sans: Vec<String>) -> (String, String) {
    let mut params = rcgen::CertificateParams::new(sans).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &ca.issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

fn write(dir: &Path, name: &str, pem: &str) {
    // As a rotation does: a new file renamed into place.
    let tmp = dir.join(format!("{name}.tmp"));
    std::fs::write(&tmp, pem).unwrap();
    std::fs::rename(tmp, dir.join(name)).unwrap();
}

fn der(pem: &str) -> CertificateDer<'static> {
    use rustls::pki_types::pem::PemObject;
    CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
}

async fn listen(security: &Security) -> (String, Incoming) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    (address, incoming(listener, security))
}

/// A TLS client trusting `ca`, presenting `client` if given.
fn connector(ca: &Ca, client: Option<&(String, String)>) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.cert.der().clone()).unwrap();
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let mut config = match client {
        Some((cert, key)) => {
            use rustls::pki_types::pem::PemObject;
            builder
                .with_client_auth_cert(
                    vec![der(cert)],
                    PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
                )
                .unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// Connects, completes the handshake and exchanges a byte each way (TLS 1.3 reports a
/// refused client certificate at the first read); the certificate the server presented.
async fn exchange(
    address: &str,
    connector: &tokio_rustls::TlsConnector,
    incoming: &mut Incoming,
) -> Result<(CertificateDer<'static>, Conn), String> {
    let tcp = tokio::net::TcpStream::connect(address).await.unwrap();
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let client = async {
        let mut tls = connector
            .connect(name, tcp)
            .await
            .map_err(|e| e.to_string())?;
        tls.write_all(b"?").await.map_err(|e| e.to_string())?;
        let mut byte = [0u8; 1];
        tls.read_exact(&mut byte).await.map_err(|e| e.to_string())?;
        Ok::<_, String>(tls.get_ref().1.peer_certificates().unwrap()[0].clone())
    };
    let server = async {
        let conn = tokio::time::timeout(Duration::from_secs(2), incoming.next())
            .await
            .ok()
            .flatten()?
            .ok()?;
        let mut conn = conn;
        let mut byte = [0u8; 1];
        conn.read_exact(&mut byte).await.ok()?;
        conn.write_all(b"!").await.ok()?;
        Some(conn)
    };
    let (client, server) = tokio::join!(client, server);
    let served = client?;
    Ok((served, server.ok_or("the server yielded no connection")?))
}

#[tokio::test]
async fn mutual_tls_is_required_and_a_rotation_is_served_to_the_next_connection() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ca("test-ca");
    let stranger_ca = ca_stranger();
    let (cert, key) = leaf(&ca, "basalt-server", vec!["127.0.0.1".into()]);
    write(dir.path(), "server.pem", &cert);
    write(dir.path(), "server.key", &key);
    write(dir.path(), "ca.pem", &ca.cert.pem());
    let security = Security::tls(TlsFiles {
        cert: dir.path().join("server.pem"),
        key: dir.path().join("server.key"),
        client_certificates_optional: false,
        client_ca: Some(dir.path().join("ca.pem")),
        ca: None,
        server_name: None,
    })
    .unwrap();
    assert_eq!(security.scheme(), "https");
    let (address, mut incoming) = listen(&security).await;

    let alice = leaf(&ca, "alice@example.com", vec![]);
    let (served, conn) = exchange(&address, &connector(&ca, Some(&alice)), &mut incoming)
        .await
        .unwrap();
    assert_eq!(served, der(&cert));
    let info = conn.connect_info();
    assert_eq!(
        info.peer_certificates.as_ref().unwrap()[0],
        der(&alice.0),
        "the handlers see the client's certificate"
    );
    assert!(info.remote_addr.is_some());

    // No client certificate, or one another CA signed: refused.
    assert!(
        exchange(&address, &connector(&ca, None), &mut incoming)
            .await
            .is_err()
    );
    let mallory = leaf(&stranger_ca, "alice@example.com", vec![]);
    assert!(
        exchange(&address, &connector(&ca, Some(&mallory)), &mut incoming)
            .await
            .is_err()
    );

    // Rotation: the next connection gets the new certificate; the established one goes on.
    let mut established = conn;
    let (cert2, key2) = leaf(&ca, "basalt-server", vec!["127.0.0.1".into()]);
    write(dir.path(), "server.key", &key2);
    write(dir.path(), "server.pem", &cert2);
    let (served, _) = exchange(&address, &connector(&ca, Some(&alice)), &mut incoming)
        .await
        .unwrap();
    assert_eq!(served, der(&cert2));
    let Security::Tls(tls) = &security else {
        unreachable!()
    };
    assert_eq!(tls.generation(), 2);
    established.write_all(b"still here").await.unwrap();

    // A broken file keeps the previous material.
    write(dir.path(), "server.pem", "not a certificate");
    let (served, _) = exchange(&address, &connector(&ca, Some(&alice)), &mut incoming)
        .await
        .unwrap();
    assert_eq!(served, der(&cert2));
}

fn ca_stranger() -> Ca {
    ca("stranger-ca")
}

#[tokio::test]
async fn broken_material_is_refused_at_start_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ca("test-ca");
    let (cert, _) = leaf(&ca, "a", vec![]);
    let (_, other_key) = leaf(&ca, "b", vec![]);
    write(dir.path(), "cert.pem", &cert);
    write(dir.path(), "key.pem", &other_key);
    let files = |cert: &str, key: &str| TlsFiles {
        cert: dir.path().join(cert),
        key: dir.path().join(key),
        client_certificates_optional: false,
        client_ca: None,
        ca: None,
        server_name: None,
    };
    let e = Security::tls(files("cert.pem", "key.pem")).unwrap_err();
    assert!(
        e.to_string().contains("does not go with the certificate"),
        "{e}"
    );
    let e = Security::tls(files("missing.pem", "key.pem")).unwrap_err();
    assert!(e.to_string().contains("missing.pem"), "{e}");
    let e = Security::tls(files("key.pem", "key.pem")).unwrap_err();
    assert!(e.to_string().contains("no certificate"), "{e}");
}
