//! A request whose deadline passes is answered DEADLINE_EXCEEDED, as Bigtable answers it.
//!
//! A gRPC client sends its deadline in the `grpc-timeout` header. tonic's server ends such a
//! request itself when it passes, but answers CANCELLED "Timeout expired" — a code a Bigtable
//! client reads as "the caller gave up", not as a deadline (seen in CI: a write routed through
//! a partitioned cluster's endpoint came back CANCELLED). This layer, inside tonic's, ends the
//! request [`MARGIN`] earlier with DEADLINE_EXCEEDED. Like tonic's, it bounds the time to the
//! response's head: a stream already answering goes on until the client's deadline ends it.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tonic::codegen::Service;
use tonic::codegen::http::{HeaderMap, Request, Response};
use tower_layer::Layer;

/// How long before tonic's own timeout this layer answers.
pub const MARGIN: Duration = Duration::from_millis(10);

/// The layer (see the module).
#[derive(Clone, Copy, Default)]
pub struct Deadline;

impl<S> Layer<S> for Deadline {
    type Service = Deadlined<S>;

    fn layer(&self, inner: S) -> Deadlined<S> {
        Deadlined { inner }
    }
}

#[derive(Clone)]
pub struct Deadlined<S> {
    inner: S,
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Deadlined<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Future: Send + 'static,
    ResBody: Default + Send + 'static,
    S::Error: Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future =
        Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send + 'static>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let timeout = grpc_timeout(request.headers());
        let future = self.inner.call(request);
        match timeout {
            None => Box::pin(future),
            Some(timeout) => {
                let ours = timeout.checked_sub(MARGIN).unwrap_or(timeout / 2);
                Box::pin(async move {
                    match tokio::time::timeout(ours, future).await {
                        Ok(answer) => answer,
                        Err(_) => Ok(tonic::Status::deadline_exceeded(format!(
                            "the request's deadline ({timeout:?}) passed before it was answered"
                        ))
                        .into_http()),
                    }
                })
            }
        }
    }
}

/// The request's deadline from its `grpc-timeout` header (`<up to 8 digits><unit>`, the unit
/// one of H M S m u n); None without one or when it does not parse. Pure.
pub fn grpc_timeout(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get("grpc-timeout")?.to_str().ok()?;
    if value.len() < 2 || value.len() > 9 {
        return None;
    }
    let (digits, unit) = value.split_at(value.len() - 1);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::codegen::http::HeaderValue;

    fn headers(timeout: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("grpc-timeout", HeaderValue::from_str(timeout).unwrap());
        h
    }

    #[test]
    fn the_grpc_timeout_header_parses_in_every_unit() {
        assert_eq!(grpc_timeout(&headers("3S")), Some(Duration::from_secs(3)));
        assert_eq!(
            grpc_timeout(&headers("2999m")),
            Some(Duration::from_millis(2999))
        );
        assert_eq!(
            grpc_timeout(&headers("1H")),
            Some(Duration::from_secs(3600))
        );
        assert_eq!(grpc_timeout(&headers("5M")), Some(Duration::from_secs(300)));
        assert_eq!(
            grpc_timeout(&headers("40u")),
            Some(Duration::from_micros(40))
        );
        assert_eq!(grpc_timeout(&headers("7n")), Some(Duration::from_nanos(7)));
        for bad in ["S", "12", "1x", "123456789S", "-1S"] {
            assert_eq!(grpc_timeout(&headers(bad)), None, "{bad}");
        }
        assert_eq!(grpc_timeout(&HeaderMap::new()), None);
    }

    #[tokio::test]
    async fn a_request_past_its_deadline_is_answered_deadline_exceeded() {
        let slow = tower::service_fn(|_: Request<()>| async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok::<_, std::convert::Infallible>(Response::new(()))
        });
        let mut service = Deadline.layer(slow);
        let mut request = Request::new(());
        request
            .headers_mut()
            .insert("grpc-timeout", HeaderValue::from_static("100m"));
        let started = std::time::Instant::now();
        let response = service.call(request).await.unwrap();
        assert!(started.elapsed() < Duration::from_secs(1));
        let status = tonic::Status::from_header_map(response.headers()).unwrap();
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
        // Without a deadline, the answer is the service's.
        let quick = tower::service_fn(|_: Request<()>| async {
            Ok::<_, std::convert::Infallible>(Response::new(()))
        });
        let response = Deadline.layer(quick).call(Request::new(())).await.unwrap();
        assert!(tonic::Status::from_header_map(response.headers()).is_none());
    }
}
