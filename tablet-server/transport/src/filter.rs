//! A transport filter: what tests put between a [`Dialer`](crate::Dialer) and its peers to
//! drop, delay or partition the traffic (TiKV's `transport_simulate` is the model). Production
//! dialers have none: their channels connect as plain tonic channels do.
//!
//! A filtered dialer's channels connect through [`Connector`], which asks the filter at every
//! connection attempt and wraps the TCP stream in [`Filtered`], which asks it again at every
//! read, write and flush. So a verdict applies to new connections and to established ones
//! (an HTTP/2 connection made before a partition is cut by it too):
//!
//! | verdict | a new connection | an established one |
//! |---|---|---|
//! | [`Verdict::Pass`] | connects | passes |
//! | [`Verdict::Drop`] | fails at once (refused: `UNAVAILABLE`) | is reset (its calls fail) |
//! | [`Verdict::Delay`] | connects after the delay | each write waits the delay |
//! | [`Verdict::BlackHole`] | hangs until healed (the connect timeout ends it) | reads and writes hang until healed (HTTP/2 keep-alive ends it) |
//!
//! The filter is asked about the dialling side's connections only: a partition between two
//! processes is a filter on each side's dialer (what one side's dialer holds it neither sends
//! nor reads).

use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Sleep;
use tonic::transport::Uri;

/// What happens now to the traffic of a dialer to one address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// As without a filter.
    Pass,
    /// Fails fast: connecting is refused, an established connection is reset.
    Drop,
    /// Connecting, and every write on a connection, waits this long first.
    Delay(Duration),
    /// A partition: connecting and established connections hang (nothing is sent or read)
    /// until the verdict changes.
    BlackHole,
}

/// Decides the fate of a dialer's traffic. One filter belongs to one dialer, so it knows the
/// dialling side (a test gives each process's dialer a filter that names the process).
pub trait Filter: Send + Sync + fmt::Debug + 'static {
    /// The verdict for traffic to `address` (`host:port`, as dialled) at this moment.
    fn verdict(&self, address: &str) -> Verdict;
}

/// How often a held connection asks the filter again (a heal is noticed within it).
const RECHECK: Duration = Duration::from_millis(20);

/// The connector of a filtered channel to one address: consults the filter, then connects
/// over TCP with TCP_NODELAY (the policy of unfiltered channels).
#[derive(Clone, Debug)]
pub(crate) struct Connector {
    pub(crate) filter: Arc<dyn Filter>,
    pub(crate) address: String,
}

impl tower_service::Service<Uri> for Connector {
    type Response = TokioIo<Filtered>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<TokioIo<Filtered>>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        let (filter, address) = (self.filter.clone(), self.address.clone());
        Box::pin(async move {
            loop {
                match filter.verdict(&address) {
                    Verdict::Pass => break,
                    Verdict::Delay(d) => {
                        tokio::time::sleep(d).await;
                        break;
                    }
                    Verdict::Drop => {
                        return Err(dropped(&address, io::ErrorKind::ConnectionRefused));
                    }
                    Verdict::BlackHole => tokio::time::sleep(RECHECK).await,
                }
            }
            let tcp = TcpStream::connect(&address).await?;
            tcp.set_nodelay(true)?;
            Ok(TokioIo::new(Filtered {
                inner: tcp,
                filter,
                address,
                read_hold: None,
                write_hold: None,
                delayed: false,
            }))
        })
    }
}

fn dropped(address: &str, kind: io::ErrorKind) -> io::Error {
    io::Error::new(
        kind,
        format!("the transport filter drops the traffic to {address}"),
    )
}

/// A TCP connection whose reads and writes the filter holds, delays or cuts.
pub struct Filtered {
    inner: TcpStream,
    filter: Arc<dyn Filter>,
    address: String,
    /// The timer a held read waits on.
    read_hold: Option<Pin<Box<Sleep>>>,
    /// The timer a held or delayed write waits on.
    write_hold: Option<Pin<Box<Sleep>>>,
    /// The pending write waited its delay already.
    delayed: bool,
}

impl fmt::Debug for Filtered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Filtered")
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

/// Waits on `timer` (made with `d` if there is none); Ready once it fired (and forgets it).
fn hold(timer: &mut Option<Pin<Box<Sleep>>>, cx: &mut Context<'_>, d: Duration) -> Poll<()> {
    let t = timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(d)));
    ready!(t.as_mut().poll(cx));
    *timer = None;
    Poll::Ready(())
}

impl Filtered {
    /// Ready(Ok) when a write (`delaying`: it waits a delay verdict's delay) or a flush may go
    /// now.
    fn admit_write(&mut self, cx: &mut Context<'_>, delaying: bool) -> Poll<io::Result<()>> {
        loop {
            match self.filter.verdict(&self.address) {
                Verdict::Drop => {
                    return Poll::Ready(Err(dropped(
                        &self.address,
                        io::ErrorKind::ConnectionReset,
                    )));
                }
                Verdict::BlackHole => ready!(hold(&mut self.write_hold, cx, RECHECK)),
                Verdict::Delay(d) if delaying && !self.delayed => {
                    ready!(hold(&mut self.write_hold, cx, d));
                    self.delayed = true;
                }
                Verdict::Pass | Verdict::Delay(_) => {
                    self.write_hold = None;
                    return Poll::Ready(Ok(()));
                }
            }
        }
    }
}

impl AsyncRead for Filtered {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            match this.filter.verdict(&this.address) {
                Verdict::Drop => {
                    return Poll::Ready(Err(dropped(
                        &this.address,
                        io::ErrorKind::ConnectionReset,
                    )));
                }
                Verdict::BlackHole => ready!(hold(&mut this.read_hold, cx, RECHECK)),
                Verdict::Pass | Verdict::Delay(_) => {
                    this.read_hold = None;
                    return Pin::new(&mut this.inner).poll_read(cx, buf);
                }
            }
        }
    }
}

impl AsyncWrite for Filtered {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.admit_write(cx, true))?;
        let written = ready!(Pin::new(&mut this.inner).poll_write(cx, buf));
        this.delayed = false;
        Poll::Ready(written)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.admit_write(cx, false))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Instant;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;
    use tower_service::Service;

    use super::*;

    /// One verdict for every address, changed by the test.
    #[derive(Debug)]
    struct Switch(Mutex<Verdict>);

    impl Switch {
        fn set(&self, v: Verdict) {
            *self.0.lock().unwrap() = v;
        }
    }

    impl Filter for Switch {
        fn verdict(&self, _address: &str) -> Verdict {
            *self.0.lock().unwrap()
        }
    }

    /// A TCP server that echoes what it reads, on a free loopback port.
    async fn echo() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        address
    }

    async fn connect(switch: &Arc<Switch>, address: &str) -> io::Result<Filtered> {
        let mut connector = Connector {
            filter: switch.clone(),
            address: address.to_string(),
        };
        let uri: Uri = format!("http://{address}").parse().unwrap();
        connector.call(uri).await.map(TokioIo::into_inner)
    }

    async fn round_trip(c: &mut Filtered, byte: u8) -> io::Result<u8> {
        c.write_all(&[byte]).await?;
        let mut b = [0u8; 1];
        c.read_exact(&mut b).await?;
        Ok(b[0])
    }

    const HELD: Duration = Duration::from_millis(300);

    #[tokio::test]
    async fn verdicts_apply_to_new_and_established_connections() {
        let address = echo().await;
        let switch = Arc::new(Switch(Mutex::new(Verdict::Pass)));
        let mut c = connect(&switch, &address).await.unwrap();
        assert_eq!(round_trip(&mut c, 1).await.unwrap(), 1);

        // Delay: each write waits.
        switch.set(Verdict::Delay(Duration::from_millis(100)));
        let t = Instant::now();
        assert_eq!(round_trip(&mut c, 2).await.unwrap(), 2);
        assert!(
            t.elapsed() >= Duration::from_millis(100),
            "{:?}",
            t.elapsed()
        );

        // A partition holds the established connection (nothing sent, nothing read) and new
        // connection attempts, until it heals.
        switch.set(Verdict::BlackHole);
        assert!(
            tokio::time::timeout(HELD, round_trip(&mut c, 3))
                .await
                .is_err(),
            "a partitioned connection hangs"
        );
        let attempt = tokio::spawn({
            let (switch, address) = (switch.clone(), address.clone());
            async move { connect(&switch, &address).await }
        });
        tokio::time::sleep(HELD).await;
        assert!(
            !attempt.is_finished(),
            "connecting hangs during a partition"
        );
        switch.set(Verdict::Pass);
        let mut b = [0u8; 1];
        // The byte held by the partition arrives after the heal (the round trip above was
        // cancelled after its write was held, so nothing was sent yet).
        assert_eq!(round_trip(&mut c, 4).await.unwrap(), 4);
        let mut d = attempt.await.unwrap().unwrap();
        assert_eq!(round_trip(&mut d, 5).await.unwrap(), 5);

        // Drop: connecting is refused at once, established connections are reset.
        switch.set(Verdict::Drop);
        let t = Instant::now();
        let refused = connect(&switch, &address).await.unwrap_err();
        assert_eq!(refused.kind(), io::ErrorKind::ConnectionRefused);
        assert!(t.elapsed() < HELD);
        let reset = d.read(&mut b).await.unwrap_err();
        assert_eq!(reset.kind(), io::ErrorKind::ConnectionReset);
        assert!(c.write_all(&[6]).await.is_err());
    }
}
