//! The command-line flags of how a process reaches etcd over TLS, shared by every process that
//! does (the tablet server, `basalt-operator master`): one spelling and one environment
//! variable each (feature `cli`).

use std::path::PathBuf;

use crate::{Security, TlsError, TlsFiles};

/// `--etcd-ca`, `--etcd-cert`, `--etcd-key`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct EtcdTlsArgs {
    /// Reach etcd over TLS (https:// URLs), verifying its certificate against this CA (PEM)
    /// and presenting --etcd-cert (etcd's --client-cert-auth); the three go together. Read
    /// again when they change, for the next connection to etcd.
    #[arg(
        long,
        value_name = "PEM",
        env = "BASALT_ETCD_CA",
        requires_all = ["etcd_cert", "etcd_key"]
    )]
    pub etcd_ca: Option<PathBuf>,

    /// The certificate (PEM) this process presents to etcd.
    #[arg(
        long,
        value_name = "PEM",
        env = "BASALT_ETCD_CERT",
        requires_all = ["etcd_ca", "etcd_key"]
    )]
    pub etcd_cert: Option<PathBuf>,

    /// The private key of --etcd-cert (PEM).
    #[arg(
        long,
        value_name = "PEM",
        env = "BASALT_ETCD_KEY",
        requires = "etcd_cert"
    )]
    pub etcd_key: Option<PathBuf>,

    /// The name etcd's certificate is checked against (default: the host of each URL), for
    /// members dialled by an address their certificate cannot list (pod IPs).
    #[arg(
        long,
        value_name = "NAME",
        env = "BASALT_ETCD_SERVER_NAME",
        requires = "etcd_cert"
    )]
    pub etcd_server_name: Option<String>,
}

impl EtcdTlsArgs {
    /// TLS with the three files (loaded now: an error names the file at fault), else
    /// plaintext.
    pub fn security(&self) -> Result<Security, TlsError> {
        match (&self.etcd_ca, &self.etcd_cert, &self.etcd_key) {
            (Some(ca), Some(cert), Some(key)) => {
                let mut files = TlsFiles::client(cert.clone(), key.clone(), Some(ca.clone()));
                files.server_name = self.etcd_server_name.clone();
                Security::tls(files)
            }
            _ => Ok(Security::Plaintext),
        }
    }
}
