//! A listener's incoming connections with the servers' side of the policy: TCP_NODELAY, and
//! with TLS the handshake (each on its own task, bounded in time, so a slow or silent client
//! holds up no one) with the material of that moment (see [`crate::tls`]). What a connection
//! is — its peer address and, with mutual TLS, the client's certificate chain — reaches every
//! request's extensions as [`ConnInfo`].

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tonic::transport::server::Connected;

use crate::Security;
use crate::tls::Tls;

/// How long a client has to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// One accepted connection, in the clear or over TLS.
pub enum Conn {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

/// What a request knows of its connection (in its extensions: `request.extensions().get::<ConnInfo>()`).
#[derive(Clone, Debug, Default)]
pub struct ConnInfo {
    pub remote_addr: Option<SocketAddr>,
    /// The client's certificate chain, leaf first, verified against the client CA (mutual
    /// TLS only).
    pub peer_certificates: Option<Arc<Vec<CertificateDer<'static>>>>,
}

impl Connected for Conn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        match self {
            Conn::Plain(tcp) => ConnInfo {
                remote_addr: tcp.peer_addr().ok(),
                peer_certificates: None,
            },
            Conn::Tls(tls) => {
                let (tcp, session) = tls.get_ref();
                ConnInfo {
                    remote_addr: tcp.peer_addr().ok(),
                    peer_certificates: session
                        .peer_certificates()
                        .map(|c| Arc::new(c.iter().map(|c| c.clone().into_owned()).collect())),
                }
            }
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Plain(s) => s.is_write_vectored(),
            Conn::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_flush(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// The connections a listener accepts (a stream for tonic's `serve_with_incoming`). Accepting
/// stops, and the listener's port is released, when it is dropped.
pub struct Incoming {
    rx: mpsc::Receiver<Conn>,
}

impl tokio_stream::Stream for Incoming {
    type Item = io::Result<Conn>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx).map(|c| c.map(Ok))
    }
}

/// Accepts `listener`'s connections with `security` (see the module's docs). Must be called
/// inside a tokio runtime.
pub fn incoming(listener: TcpListener, security: &Security) -> Incoming {
    let (tx, rx) = mpsc::channel(64);
    let tls = match security {
        Security::Plaintext => None,
        Security::Tls(tls) => Some(tls.clone()),
    };
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                // The server is gone: let the port go.
                _ = tx.closed() => return,
            };
            let tcp = match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // Out of file descriptors and the like: the next accept may succeed.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            match &tls {
                None => {
                    if tx.send(Conn::Plain(tcp)).await.is_err() {
                        return;
                    }
                }
                Some(tls) => {
                    let (tls, tx) = (tls.clone(), tx.clone());
                    tokio::spawn(handshake(tls, tcp, tx));
                }
            }
        }
    });
    Incoming { rx }
}

async fn handshake(tls: Arc<Tls>, tcp: TcpStream, tx: mpsc::Sender<Conn>) {
    let peer = tcp.peer_addr().ok();
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.server_config());
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(stream)) => {
            let _ = tx.send(Conn::Tls(Box::new(stream))).await;
        }
        // A plaintext client, a certificate the CA did not sign, no certificate where one is
        // required: the client sees its handshake fail; the server carries on.
        Ok(Err(e)) => tracing::debug!(?peer, error = %e, "TLS handshake failed"),
        Err(_) => tracing::debug!(?peer, "TLS handshake timed out"),
    }
}
