//! Counts the gRPC requests in flight, so that a graceful shutdown can wait for them *before*
//! it starts closing connections.
//!
//! A request is in flight from the moment it arrives until its response body is dropped —
//! for a ReadRows stream, once the last message has been handed to HTTP/2 (or the client went
//! away). Shutting down by HTTP/2 GOAWAY alone proved racy: now and then a connection closed
//! right after the GOAWAY exchange with most of a 64 MiB scan still to send
//! (e2e `test_sigterm_lets_an_in_flight_read_finish`). So on SIGTERM the server first stops
//! being ready, waits here until nothing is in flight (bounded by `--shutdown-timeout-secs`),
//! and only then lets tonic close the connections. Requests that arrive while it drains are
//! answered UNAVAILABLE before they touch anything (what a GOAWAY would make of them), so a busy
//! server cannot keep the drain from ending.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};

use tokio::sync::Notify;
use tonic::codegen::http::{Request, Response};
use tonic::codegen::{Body, Service};
use tower_layer::Layer;

/// The number of requests in flight, shared by the layer and the shutdown.
#[derive(Clone, Default)]
pub struct InFlight {
    inner: Arc<Counter>,
}

#[derive(Default)]
struct Counter {
    count: AtomicUsize,
    idle: Notify,
    draining: AtomicBool,
}

impl InFlight {
    pub fn count(&self) -> usize {
        self.inner.count.load(Ordering::SeqCst)
    }

    /// From now on, new requests are refused with UNAVAILABLE.
    pub fn drain(&self) {
        self.inner.draining.store(true, Ordering::SeqCst);
    }

    /// Resolves once no request is in flight.
    pub async fn idle(&self) {
        loop {
            let notified = self.inner.idle.notified();
            if self.count() == 0 {
                return;
            }
            notified.await;
        }
    }

    fn enter(&self) -> Guard {
        self.inner.count.fetch_add(1, Ordering::SeqCst);
        Guard(self.inner.clone())
    }
}

/// One request in flight; leaving drops it.
struct Guard(Arc<Counter>);

impl Drop for Guard {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl<S> Layer<S> for InFlight {
    type Service = Tracked<S>;

    fn layer(&self, inner: S) -> Tracked<S> {
        Tracked {
            inner,
            in_flight: self.clone(),
        }
    }
}

/// A service whose requests are counted until their response bodies are dropped.
#[derive(Clone)]
pub struct Tracked<S> {
    inner: S,
    in_flight: InFlight,
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Tracked<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Future: Send + 'static,
    ResBody: Default + Send + 'static,
    S::Error: Send + 'static,
{
    type Response = Response<TrackedBody<ResBody>>;
    type Error = S::Error;
    type Future =
        Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send + 'static>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let guard = self.in_flight.enter();
        if self.in_flight.inner.draining.load(Ordering::SeqCst) {
            let refused = tonic::Status::unavailable("the tablet server is shutting down; retry")
                .into_http::<ResBody>();
            return Box::pin(async move { Ok(tracked(refused, guard)) });
        }
        let future = self.inner.call(request);
        Box::pin(async move { Ok(tracked(future.await?, guard)) })
    }
}

/// The response, its request in flight until the body is dropped.
fn tracked<B>(response: Response<B>, guard: Guard) -> Response<TrackedBody<B>> {
    response.map(|body| TrackedBody {
        inner: body,
        _guard: guard,
    })
}

/// A response body that keeps its request in flight until it is dropped.
pub struct TrackedBody<B> {
    inner: B,
    _guard: Guard,
}

impl<B: Body + Unpin> Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn idle_waits_for_every_guard() {
        let in_flight = InFlight::default();
        in_flight.idle().await; // nothing in flight: at once
        let a = in_flight.enter();
        let b = in_flight.enter();
        assert_eq!(in_flight.count(), 2);
        let waiter = tokio::spawn({
            let in_flight = in_flight.clone();
            async move { in_flight.idle().await }
        });
        drop(a);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "one request is still in flight");
        drop(b);
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("idle once the last guard is gone")
            .unwrap();
    }
}
