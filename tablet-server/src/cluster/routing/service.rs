//! The `google.bigtable.v2.Bigtable` service of a cluster server, routed by app profile: each
//! client request is planned ([`super::decide`]) and served by this server's frontend when
//! its cluster is the target, or sent whole to a server of the target cluster, marked
//! [`ROUTED`] (served there by its frontend, never routed again).
//!
//! A multi-cluster request goes to the next cluster of its plan when the target fails in a way
//! that proves nothing was applied (refused before delivery, "not owner", unavailable before
//! sending), or — only for requests that are safe to send twice (reads, writes whose every
//! mutation is idempotent) — when it does not answer within the cluster's patience
//! ([`super::health::Health::patience`]). A write that is not safe to send twice waits that
//! long only for a row's owner to be known and reachable ([`FAILOVER_AFTER`]), and is then
//! refused as not delivered. A write whose outcome is unknown is never sent again: its error
//! goes back to the client.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use googleapis_tonic_google_bigtable_v2::google::bigtable::v2 as pb;
use pb::bigtable_client::BigtableClient;
use pb::mutation::Mutation as M;
use tokio_stream::{Stream, StreamExt};
use tonic::metadata::MetadataMap;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use basalt_model::limits::MAX_MESSAGE_BYTES;

use super::decide::{Method, profile_id};
use super::priority::{Admission, Admitted, Limits};
use super::state::Routing;
use crate::cluster::forwarding::{
    FAILOVER_AFTER, FailoverAfter, client_deadline, from_owner, is_forwarded, not_delivered,
};
use crate::cluster::frontend::Frontend;
use crate::error::status;
use crate::metrics::Metrics;
use crate::proto::bigtable_server::Bigtable;

/// The header of a request another cluster's server routed here: served by this cluster as
/// it is (its value is the sending cluster).
pub const ROUTED: &str = "x-basalt-routed";

/// A stream of responses, whichever cluster serves it.
pub type Responses<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// The routed service (see the module).
pub struct Routed {
    frontend: Arc<Frontend>,
    routing: Arc<Routing>,
    metrics: Arc<Metrics>,
    admission: Arc<Admission>,
    turn: AtomicUsize,
}

impl Routed {
    pub fn new(
        frontend: Arc<Frontend>,
        routing: Arc<Routing>,
        metrics: Arc<Metrics>,
        priority: Limits,
    ) -> Routed {
        Routed {
            frontend,
            routing,
            metrics,
            admission: Admission::new(priority),
            turn: AtomicUsize::new(0),
        }
    }
}

/// What routing needs to know of a request.
pub trait Routable: prost::Message + Clone + Send + Sync + 'static {
    const METHOD: Method;
    fn app_profile_id(&self) -> &str;
    /// The table's resource name (or the instance's, for PingAndWarm).
    fn resource(&self) -> &str;
    /// The one row the request is about, if it is about one (for row affinity).
    fn row(&self) -> Option<&[u8]>;
    /// Whether sending it twice does no harm (it may go to another cluster after a timeout).
    fn idempotent(&self) -> bool;
    /// The bytes it writes, for pacing by priority (its encoded size; none for a read).
    fn write_bytes(&self) -> u64 {
        if Self::METHOD.writes() {
            prost::Message::encoded_len(self) as u64
        } else {
            0
        }
    }
}

fn idempotent_mutations(mutations: &[pb::Mutation]) -> bool {
    mutations.iter().all(|m| match &m.mutation {
        Some(M::SetCell(s)) => s.timestamp_micros != -1,
        Some(M::DeleteFromColumn(_) | M::DeleteFromFamily(_) | M::DeleteFromRow(_)) => true,
        _ => false,
    })
}

/// Implements [`Routable`] for a request with an `app_profile_id` field: its method, the
/// field holding its resource name, and, of the request bound to the given name, its one row
/// and whether it is idempotent.
macro_rules! routable {
    ($request:ty, $method:ident, $resource:ident,
     row: |$r:ident| $row:expr, idempotent: |$i:ident| $idempotent:expr $(,)?) => {
        impl Routable for $request {
            const METHOD: Method = Method::$method;
            fn app_profile_id(&self) -> &str {
                &self.app_profile_id
            }
            fn resource(&self) -> &str {
                &self.$resource
            }
            fn row(&self) -> Option<&[u8]> {
                let $r = self;
                $row
            }
            fn idempotent(&self) -> bool {
                let $i = self;
                $idempotent
            }
        }
    };
}

routable!(pb::ReadRowsRequest, ReadRows, table_name,
    row: |r| match &r.rows {
        Some(set) if set.row_ranges.is_empty() && set.row_keys.len() == 1 => Some(&set.row_keys[0]),
        _ => None,
    },
    idempotent: |_r| true,
);
routable!(pb::SampleRowKeysRequest, SampleRowKeys, table_name,
    row: |_r| None, idempotent: |_r| true);
routable!(pb::MutateRowRequest, MutateRow, table_name,
    row: |r| Some(&r.row_key), idempotent: |r| idempotent_mutations(&r.mutations));
// A batch of one row sticks to that row's cluster; a batch of several goes to the nearest
// cluster.
routable!(pb::MutateRowsRequest, MutateRows, table_name,
    row: |r| {
        let first = r.entries.first()?;
        r.entries.iter().all(|e| e.row_key == first.row_key).then_some(&first.row_key[..])
    },
    idempotent: |r| r.entries.iter().all(|e| idempotent_mutations(&e.mutations)),
);
routable!(pb::CheckAndMutateRowRequest, CheckAndMutateRow, table_name,
    row: |r| Some(&r.row_key), idempotent: |_r| false);
routable!(pb::ReadModifyWriteRowRequest, ReadModifyWriteRow, table_name,
    row: |r| Some(&r.row_key), idempotent: |_r| false);
routable!(pb::PingAndWarmRequest, PingAndWarm, name,
    row: |_r| None, idempotent: |_r| true);

/// The app profile a request names: its `app_profile_id`, or else the one in its
/// `x-goog-request-params` header (`table_name=…&app_profile_id=…`, URL-encoded).
pub fn named_profile<'a>(field: &'a str, metadata: &MetadataMap) -> std::borrow::Cow<'a, str> {
    if !field.is_empty() {
        return field.into();
    }
    let Some(params) = metadata
        .get("x-goog-request-params")
        .and_then(|v| v.to_str().ok())
    else {
        return "".into();
    };
    params
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == "app_profile_id")
        .map(|(_, v)| percent_decode(v).into())
        .unwrap_or_else(|| "".into())
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => match u8::from_str_radix(&s[i + 1..i + 3], 16) {
                Ok(b) => {
                    out.push(b);
                    i += 3;
                    continue;
                }
                Err(_) => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The last segment of a resource name (a table's id), for metrics.
fn short(resource: &str) -> &str {
    resource.rsplit('/').next().unwrap_or(resource)
}

/// How one attempt on one cluster ended, when it did not answer.
enum Attempt {
    /// Nothing was delivered to the cluster (refused, unreachable, no live server, "not
    /// owner"): the next cluster may take the request.
    NotDelivered(Status),
    /// No answer within the patience (only for requests safe to send twice).
    TimedOut(Duration),
    /// An answer that ends the request: an error of the request itself, or an unknown outcome.
    Failed(Status),
}

/// How long one attempt waits: the client's deadline; the patience of a request safe to send
/// twice; how long one that is not may wait for a row's owner ([`FAILOVER_AFTER`]).
struct Waits {
    deadline: Option<Duration>,
    patience: Option<Duration>,
    failover_after: Option<Duration>,
}

/// A stream whose first response (or end) has arrived: a failure before any response is an
/// attempt's failure, one after it the stream's.
async fn first_arrived<T: Send + 'static>(mut s: Responses<T>) -> Result<Responses<T>, Status> {
    match s.next().await {
        None => Ok(Box::pin(tokio_stream::empty())),
        Some(Err(e)) => Err(e),
        Some(Ok(first)) => Ok(Box::pin(tokio_stream::once(Ok(first)).chain(s))),
    }
}

impl Routed {
    fn client(&self, address: &str) -> Result<BigtableClient<Channel>, Status> {
        let channel = self
            .frontend
            .dialer()
            .channel(address)
            .map_err(|e| Status::unavailable(format!("cannot dial {address}: {e}")))?;
        Ok(BigtableClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES))
    }

    /// Routes one request (see the module), once admitted at its profile's priority
    /// ([`super::priority`]). `local` serves it with this server's frontend; `remote` sends it
    /// to another cluster's server. Both give the response once it has arrived (for a
    /// stream: its first message). The admission is returned with it, to be held until the
    /// response is complete (none for a request another server routed or forwarded here).
    async fn route<Req, Out, L, LF, R, RF>(
        &self,
        request: Request<Req>,
        local: L,
        remote: R,
    ) -> Result<(Out, Option<Admitted>), Status>
    where
        Req: Routable,
        L: Fn(Request<Req>) -> LF,
        LF: Future<Output = Result<Out, Status>>,
        R: Fn(BigtableClient<Channel>, Request<Req>) -> RF,
        RF: Future<Output = Result<Out, Status>>,
    {
        if is_forwarded(&request) || request.metadata().contains_key(ROUTED) {
            return Ok((local(request).await?, None));
        }
        let started = Instant::now();
        let deadline = client_deadline(request.metadata());
        let (metadata, _, req) = request.into_parts();
        let profile = profile_id(&named_profile(req.app_profile_id(), &metadata)).to_string();
        // A PingAndWarm (a client warming its channel) neither waits nor counts as traffic.
        let admitted = if Req::METHOD == Method::PingAndWarm {
            None
        } else {
            let priority = self.routing.priority(&profile);
            let (admitted, waited) = self.admission.admit(priority, req.write_bytes()).await;
            if !waited.is_zero() {
                self.metrics.admission_wait(priority, waited);
            }
            Some(admitted)
        };
        let mut cluster = String::new();
        let outcome = self
            .attempts(
                &profile,
                &metadata,
                deadline,
                &req,
                &local,
                &remote,
                &mut cluster,
            )
            .await;
        let code = match &outcome {
            Ok(_) => tonic::Code::Ok,
            Err(s) => s.code(),
        };
        self.metrics.app_profile_request(
            &profile,
            Req::METHOD.name(),
            short(req.resource()),
            &cluster,
            code,
            started.elapsed(),
        );
        outcome.map(|out| (out, admitted))
    }

    /// The attempts of one request, cluster after cluster of its plan; `tried` is set to the
    /// last cluster tried (the one that answered, if one did).
    #[allow(clippy::too_many_arguments)]
    async fn attempts<Req, Out, L, LF, R, RF>(
        &self,
        profile: &str,
        metadata: &MetadataMap,
        deadline: Option<Duration>,
        req: &Req,
        local: &L,
        remote: &R,
        tried: &mut String,
    ) -> Result<Out, Status>
    where
        Req: Routable,
        L: Fn(Request<Req>) -> LF,
        LF: Future<Output = Result<Out, Status>>,
        R: Fn(BigtableClient<Channel>, Request<Req>) -> RF,
        RF: Future<Output = Result<Out, Status>>,
    {
        let plan = self
            .routing
            .plan(profile, Req::METHOD, req.row())
            .map_err(status)?;
        let safe = req.idempotent();
        let own = self.routing.own().to_string();
        let mut last_error = None;
        for (k, cluster) in plan.clusters.iter().enumerate() {
            let last = !plan.fails_over || k + 1 == plan.clusters.len();
            tried.clone_from(cluster);
            if k > 0 {
                self.metrics
                    .multi_cluster_failover(profile, &plan.clusters[k - 1], cluster);
            }
            // A request that is safe to send twice waits for a cluster only as long as its
            // patience when another one may take it; its own cluster included (a tablet
            // whose server died answers once the master moved it: seconds).
            let patience = (safe && !last).then(|| self.routing.patience(cluster, Req::METHOD));
            // One that is not waits for a row's owner only as long, then is refused as not
            // delivered ([`FailoverAfter`]): never abandoned once it reached the owner.
            let failover_after =
                (!safe && !last).then(|| self.routing.patience(cluster, Req::METHOD));
            let attempt = if *cluster == own {
                let mut request = Request::new(req.clone());
                *request.metadata_mut() = metadata.clone();
                // The window is the router's to give, never a client's.
                request.metadata_mut().remove(FAILOVER_AFTER);
                if let Some(after) = failover_after {
                    request
                        .metadata_mut()
                        .insert(FAILOVER_AFTER, FailoverAfter::header(after));
                }
                let started = Instant::now();
                let answer = match patience {
                    Some(p) => tokio::time::timeout(p, local(request)).await.ok(),
                    None => Some(local(request).await),
                };
                match answer {
                    Some(Ok(out)) => {
                        self.routing
                            .answered(cluster, Req::METHOD, started.elapsed());
                        return Ok(out);
                    }
                    Some(Err(s)) if not_delivered(&s) => Attempt::NotDelivered(s),
                    Some(Err(s)) => Attempt::Failed(s),
                    None => {
                        let p = patience.unwrap_or_default();
                        self.routing.slow(cluster, Req::METHOD, p);
                        Attempt::TimedOut(p)
                    }
                }
            } else {
                let waits = Waits {
                    deadline,
                    patience,
                    failover_after,
                };
                match self.remote(cluster, req, waits, remote).await {
                    Ok(out) => return Ok(out),
                    Err(a) => a,
                }
            };
            match attempt {
                Attempt::Failed(s) => return Err(s),
                Attempt::NotDelivered(s) if last => return Err(s),
                Attempt::NotDelivered(s) => last_error = Some(s),
                Attempt::TimedOut(waited) => {
                    last_error = Some(Status::deadline_exceeded(format!(
                        "cluster {cluster} did not answer within {waited:?}"
                    )))
                }
            }
            if !plan.fails_over {
                break;
            }
        }
        Err(last_error.unwrap_or_else(|| Status::unavailable("no cluster could take the request")))
    }

    /// One attempt on another cluster: its servers in turn while they refuse.
    async fn remote<Req, Out, R, RF>(
        &self,
        cluster: &str,
        req: &Req,
        Waits {
            deadline,
            patience,
            failover_after,
        }: Waits,
        remote: &R,
    ) -> Result<Out, Attempt>
    where
        Req: Routable,
        R: Fn(BigtableClient<Channel>, Request<Req>) -> RF,
        RF: Future<Output = Result<Out, Status>>,
    {
        let turn = self.turn.fetch_add(1, Ordering::Relaxed);
        let mut addresses = self.routing.addresses(cluster, turn);
        if addresses.is_empty() {
            // The view may be older than the cluster's servers (this server just started, or
            // the cluster just joined): read etcd again before refusing.
            if self.routing.refresh().await.is_ok() {
                addresses = self.routing.addresses(cluster, turn);
            }
        }
        if addresses.is_empty() {
            self.routing.refused(cluster);
            return Err(Attempt::NotDelivered(Status::unavailable(format!(
                "cluster {cluster} has no live server"
            ))));
        }
        let mut refusal = None;
        for address in addresses {
            let client = match self.client(&address) {
                Ok(c) => c,
                Err(s) => {
                    refusal = Some(s);
                    continue;
                }
            };
            let mut request = Request::new(req.clone());
            if let Ok(v) = self.routing.own().parse() {
                request.metadata_mut().insert(ROUTED, v);
            }
            if let Some(d) = deadline {
                request.set_timeout(d);
            }
            if let Some(after) = failover_after {
                request
                    .metadata_mut()
                    .insert(FAILOVER_AFTER, FailoverAfter::header(after));
            }
            let started = Instant::now();
            let call = remote(client, request);
            let answer = match patience {
                Some(p) => match tokio::time::timeout(p, call).await {
                    Ok(answer) => answer,
                    Err(_) => {
                        self.routing.slow(cluster, Req::METHOD, p);
                        return Err(Attempt::TimedOut(p));
                    }
                },
                None => call.await,
            };
            match answer {
                Ok(out) => {
                    self.routing
                        .answered(cluster, Req::METHOD, started.elapsed());
                    return Ok(out);
                }
                Err(s) if not_delivered(&s) => refusal = Some(s),
                Err(s) => {
                    self.routing
                        .answered(cluster, Req::METHOD, started.elapsed());
                    return Err(Attempt::Failed(from_owner(s, &address)));
                }
            }
        }
        self.routing.refused(cluster);
        Err(Attempt::NotDelivered(refusal.unwrap_or_else(|| {
            Status::unavailable(format!("no server of cluster {cluster} took the request"))
        })))
    }
}

/// The stream, holding its admission until it ends.
fn held<T: Send + 'static>((stream, admitted): (Responses<T>, Option<Admitted>)) -> Responses<T> {
    Box::pin(stream.map(move |item| {
        let _ = &admitted;
        item
    }))
}

fn boxed<T, S>(s: S) -> Responses<T>
where
    S: Stream<Item = Result<T, Status>> + Send + 'static,
{
    Box::pin(s)
}

#[tonic::async_trait]
impl Bigtable for Arc<Routed> {
    type ReadRowsStream = Responses<pb::ReadRowsResponse>;
    type SampleRowKeysStream = Responses<pb::SampleRowKeysResponse>;
    type MutateRowsStream = Responses<pb::MutateRowsResponse>;

    async fn read_rows(
        &self,
        request: Request<pb::ReadRowsRequest>,
    ) -> Result<Response<Self::ReadRowsStream>, Status> {
        let stream = self
            .route(
                request,
                |r| async {
                    let s = Bigtable::read_rows(&self.frontend, r).await?.into_inner();
                    first_arrived(boxed(s)).await
                },
                |mut c, r| async move {
                    let s = c.read_rows(r).await?.into_inner();
                    first_arrived(boxed(s)).await
                },
            )
            .await?;
        Ok(Response::new(held(stream)))
    }

    async fn sample_row_keys(
        &self,
        request: Request<pb::SampleRowKeysRequest>,
    ) -> Result<Response<Self::SampleRowKeysStream>, Status> {
        let stream = self
            .route(
                request,
                |r| async {
                    let s = Bigtable::sample_row_keys(&self.frontend, r)
                        .await?
                        .into_inner();
                    first_arrived(boxed(s)).await
                },
                |mut c, r| async move {
                    let s = c.sample_row_keys(r).await?.into_inner();
                    first_arrived(boxed(s)).await
                },
            )
            .await?;
        Ok(Response::new(held(stream)))
    }

    async fn mutate_row(
        &self,
        request: Request<pb::MutateRowRequest>,
    ) -> Result<Response<pb::MutateRowResponse>, Status> {
        self.route(
            request,
            |r| Bigtable::mutate_row(&self.frontend, r),
            |mut c, r| async move { c.mutate_row(r).await },
        )
        .await
        .map(|(out, _)| out)
    }

    async fn mutate_rows(
        &self,
        request: Request<pb::MutateRowsRequest>,
    ) -> Result<Response<Self::MutateRowsStream>, Status> {
        let stream = self
            .route(
                request,
                |r| async {
                    let s = Bigtable::mutate_rows(&self.frontend, r).await?.into_inner();
                    first_arrived(boxed(s)).await
                },
                |mut c, r| async move {
                    let s = c.mutate_rows(r).await?.into_inner();
                    first_arrived(boxed(s)).await
                },
            )
            .await?;
        Ok(Response::new(held(stream)))
    }

    async fn check_and_mutate_row(
        &self,
        request: Request<pb::CheckAndMutateRowRequest>,
    ) -> Result<Response<pb::CheckAndMutateRowResponse>, Status> {
        self.route(
            request,
            |r| Bigtable::check_and_mutate_row(&self.frontend, r),
            |mut c, r| async move { c.check_and_mutate_row(r).await },
        )
        .await
        .map(|(out, _)| out)
    }

    async fn ping_and_warm(
        &self,
        request: Request<pb::PingAndWarmRequest>,
    ) -> Result<Response<pb::PingAndWarmResponse>, Status> {
        self.route(
            request,
            |r| Bigtable::ping_and_warm(&self.frontend, r),
            |mut c, r| async move { c.ping_and_warm(r).await },
        )
        .await
        .map(|(out, _)| out)
    }

    async fn read_modify_write_row(
        &self,
        request: Request<pb::ReadModifyWriteRowRequest>,
    ) -> Result<Response<pb::ReadModifyWriteRowResponse>, Status> {
        self.route(
            request,
            |r| Bigtable::read_modify_write_row(&self.frontend, r),
            |mut c, r| async move { c.read_modify_write_row(r).await },
        )
        .await
        .map(|(out, _)| out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_profile_comes_from_the_field_or_else_the_request_params_header() {
        let mut md = MetadataMap::new();
        assert_eq!(named_profile("", &md), "");
        md.insert(
            "x-goog-request-params",
            "table_name=projects%2Fp%2Finstances%2Fi%2Ftables%2Ft&app_profile_id=my%2Dbatch"
                .parse()
                .unwrap(),
        );
        assert_eq!(named_profile("", &md), "my-batch");
        assert_eq!(named_profile("given", &md), "given");
        md.insert(
            "x-goog-request-params",
            "name=projects/p/instances/i".parse().unwrap(),
        );
        assert_eq!(named_profile("", &md), "");
    }

    #[test]
    fn only_writes_of_explicit_versions_and_deletes_are_sent_twice() {
        let set = |ts| pb::Mutation {
            mutation: Some(M::SetCell(pb::mutation::SetCell {
                family_name: "f".into(),
                column_qualifier: b"q".to_vec().into(),
                timestamp_micros: ts,
                value: b"v".to_vec().into(),
            })),
        };
        let del = pb::Mutation {
            mutation: Some(M::DeleteFromRow(pb::mutation::DeleteFromRow {})),
        };
        let add = pb::Mutation {
            mutation: Some(M::AddToCell(pb::mutation::AddToCell::default())),
        };
        let row = |m: Vec<pb::Mutation>| pb::MutateRowRequest {
            row_key: b"r".to_vec().into(),
            mutations: m,
            ..Default::default()
        };
        assert!(row(vec![set(1000), del.clone()]).idempotent());
        assert!(!row(vec![set(-1)]).idempotent());
        assert!(!row(vec![set(1000), add]).idempotent());
        let batch = pb::MutateRowsRequest {
            entries: vec![
                pb::mutate_rows_request::Entry {
                    row_key: b"a".to_vec().into(),
                    mutations: vec![set(5)],
                    ..Default::default()
                },
                pb::mutate_rows_request::Entry {
                    row_key: b"a".to_vec().into(),
                    mutations: vec![del],
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        assert!(batch.idempotent());
        assert_eq!(batch.row(), Some(&b"a"[..]));
    }
}
