//! Forwarding to the server that owns a row: the peer pool (Bigtable clients over the node's
//! [`Dialer`]), the [`FORWARDED`] mark and the client's deadline a forwarded call carries, and
//! the retry of a call while no server can take it or its owner refuses it with the typed
//! "not owner" / "moving" `ErrorInfo` ([`on_owner`]). And the one way to reach another cluster
//! of the instance: one of its servers, where the other clusters reach it ([`ask_cluster`]).
//!
//! A forwarded request carries the [`FORWARDED`] header: its receiver serves it only from its
//! own tablets and answers "not owner" (retryable UNAVAILABLE, nothing applied) for any other
//! row, so a request is never forwarded twice. The frontend retries "not owner" and tablet map
//! gaps (a tablet being assigned, an owner restarting) for a bounded time after refreshing its
//! map; an outcome it cannot know (the owner failed after receiving a write) is returned to
//! the client as UNAVAILABLE, never retried blindly.

use std::future::Future;
use std::time::Instant;

use basalt_transport::Dialer;
use bytes::Bytes;
use googleapis_tonic_google_bigtable_v2::google::bigtable::v2 as pb;
use pb::bigtable_client::BigtableClient;
use tokio::time::Duration;
use tonic::transport::Channel;
use tonic::{Request, Status};

use basalt_model::limits::MAX_MESSAGE_BYTES;

use super::tablet_router::{TabletRouter, Target};
use crate::error::{Error, Result, refusal, status};
use crate::metrics::Metrics;

/// The header of a request forwarded by another server's frontend.
pub const FORWARDED: &str = "x-basalt-forwarded";

/// How long a frontend keeps retrying a request that no server could take yet (a tablet
/// being assigned, its owner restarting or its lease lapsing) before answering UNAVAILABLE.
pub const RETRY_FOR: Duration = Duration::from_secs(8);
/// The header of a request that another cluster may still take (set by the router for a
/// multi-cluster write it cannot send twice): how long, in milliseconds, the frontend may
/// retry while no server of its cluster can take a row before refusing the request as not
/// delivered (see [`FailoverAfter`]), so the router sends it to the next cluster instead of
/// waiting [`RETRY_FOR`] for the master to reassign a dead owner's tablets.
pub const FAILOVER_AFTER: &str = "x-basalt-failover-after";

/// How long a frontend retries a request no server can take yet, and what it answers then.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailoverAfter {
    /// No other cluster takes the request: retried for [`RETRY_FOR`], then UNAVAILABLE.
    Never,
    /// Another cluster may take it: retried this long (at most [`RETRY_FOR`]), then refused
    /// as not delivered ("not owner", nothing applied).
    After(Duration),
}

impl FailoverAfter {
    /// The window a request's [`FAILOVER_AFTER`] header gives.
    pub fn of(metadata: &tonic::metadata::MetadataMap) -> FailoverAfter {
        metadata
            .get(FAILOVER_AFTER)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            .map_or(FailoverAfter::Never, |ms| {
                FailoverAfter::After(Duration::from_millis(ms).min(RETRY_FOR))
            })
    }

    /// How long to retry.
    pub fn retry_for(self) -> Duration {
        match self {
            FailoverAfter::Never => RETRY_FOR,
            FailoverAfter::After(d) => d,
        }
    }

    /// The header's value for a window of `d`.
    pub fn header(d: Duration) -> tonic::metadata::MetadataValue<tonic::metadata::Ascii> {
        tonic::metadata::MetadataValue::from(d.as_millis().min(u64::MAX as u128) as u64)
    }
}

/// How long to wait for a newer tablet map between retries.
pub const RETRY_WAIT: Duration = Duration::from_millis(200);

/// The deadline a forwarded single-row call gets when its client set none (streams keep
/// none: a long scan may take longer).
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(60);

/// The gRPC clients of the other servers: their channels come from the node's [`Dialer`]
/// (one per address, shared with the server's other peer calls); the clients keep Bigtable's
/// message-size limits.
pub struct Peers {
    dialer: Dialer,
}

impl Peers {
    pub fn new(dialer: Dialer) -> Peers {
        Peers { dialer }
    }

    fn get(&self, address: &str) -> Result<BigtableClient<Channel>> {
        let channel = self
            .dialer
            .channel(address)
            .map_err(|e| Error::Internal(format!("cannot dial server {address:?}: {e}")))?;
        Ok(BigtableClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES))
    }

    /// The client of a remote target.
    pub fn client(&self, target: &Target) -> Result<BigtableClient<Channel>, Status> {
        match target {
            Target::Remote { address, .. } => self.get(address).map_err(status),
            Target::Local => Err(Status::internal("a peer client of a local target")),
        }
    }
}

/// The request to send to another server: marked as forwarded, with the client's deadline
/// (so a frontend never waits on an owner longer than its client does).
pub fn forwarded<T>(msg: T, deadline: Option<Duration>) -> Request<T> {
    let mut req = Request::new(msg);
    req.metadata_mut()
        .insert(FORWARDED, tonic::metadata::MetadataValue::from_static("1"));
    if let Some(d) = deadline {
        req.set_timeout(d);
    }
    req
}

/// The client's deadline from the `grpc-timeout` header (`<digits><unit>`, unit one of
/// H M S m u n), if any.
pub fn client_deadline(metadata: &tonic::metadata::MetadataMap) -> Option<Duration> {
    let value = metadata.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Whether another server's frontend forwarded this request (it is served only from this
/// server's own tablets).
pub fn is_forwarded<T>(req: &Request<T>) -> bool {
    req.metadata().contains_key(FORWARDED)
}

/// The [`FORWARDED`] value of an administrative request another cluster of the instance sent
/// (a DropRowRange): carried out in this whole cluster, never sent on to other clusters.
pub const FROM_PEER_CLUSTER: &str = "peer-cluster";

/// Where an administrative request that changes rows must be carried out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// Sent by a client: every server of every cluster of the instance.
    Instance,
    /// Sent by another cluster: every server of this cluster.
    Cluster,
    /// Sent by a server of this cluster: this server's rows.
    Server,
}

/// The reach of `req` (see [`Reach`]).
pub fn reach<T>(req: &Request<T>) -> Reach {
    match req.metadata().get(FORWARDED) {
        None => Reach::Instance,
        Some(v) if v == FROM_PEER_CLUSTER => Reach::Cluster,
        Some(_) => Reach::Server,
    }
}

/// A "not owner" or "moving" answer (model `Error::NotOwner`, `Error::Moving`; read from the
/// status's `ErrorInfo`, see [`crate::error::refusal`]): the request was not applied.
pub fn is_not_owner(s: &Status) -> bool {
    refusal(s).is_some()
}

/// A failure that proves the request never reached the owner (safe to retry elsewhere).
pub fn not_delivered(s: &Status) -> bool {
    if is_not_owner(s) {
        return true;
    }
    if s.code() != tonic::Code::Unavailable {
        return false;
    }
    let text = format!("{s:?}").to_ascii_lowercase();
    text.contains("connection refused") || text.contains("tcp connect error")
}

/// A forwarded call's failure as its client should see it. A connection to the owner that
/// broke during the call comes from tonic as UNKNOWN ("transport error") or CANCELLED (the
/// stream reset), with the transport's error as its source: no server sent it. It is
/// UNAVAILABLE, naming the owner (a read is retried; a write's outcome is unknown, so it is
/// not). Any other status (the owner's answer, a deadline, a refused connection) is passed
/// on as it is.
pub fn from_owner(s: Status, owner: &str) -> Status {
    let broken = matches!(
        s.code(),
        tonic::Code::Unknown | tonic::Code::Cancelled | tonic::Code::Internal
    );
    if broken && std::error::Error::source(&s).is_some() {
        Status::unavailable(format!(
            "the connection to server {owner} broke during the call ({}); a write's outcome \
             is unknown",
            s.message()
        ))
    } else {
        s
    }
}

/// The refusal of a forwarded request for a row this server does not serve.
pub fn not_owner(table: &str, row: &[u8], owner: Option<String>) -> Error {
    Error::NotOwner {
        table: table.to_string(),
        row: Bytes::copy_from_slice(row),
        owner,
    }
}

/// Runs `call` against the server of `row` of `table` (the table id): here, or forwarded;
/// retried while no server can take it or its owner answers "not owner", for as long as
/// `failover` says. A forwarded request (`hop`) is served here or refused as not owned.
pub async fn on_owner<T, F, Fut>(
    router: &TabletRouter,
    metrics: &Metrics,
    (table, row): (&str, &[u8]),
    hop: bool,
    failover: FailoverAfter,
    call: F,
) -> Result<T, Status>
where
    F: Fn(Target) -> Fut,
    Fut: Future<Output = Result<T, Status>>,
{
    let deadline = Instant::now() + failover.retry_for();
    loop {
        let planned = router.state().revision;
        let last = match router.route_row(table, row) {
            // Fenced or moved away between the lookup in the tablet map and the call (the
            // store refuses it, see `basalt_storage::fences`): nothing was applied; wait for
            // the new owner.
            Ok((_, Target::Local)) => match call(Target::Local).await {
                Err(s) if !hop && is_not_owner(&s) => s.message().to_string(),
                other => return other,
            },
            Ok((_, Target::Remote { owner, .. })) if hop => {
                return Err(status(not_owner(table, row, Some(owner))));
            }
            Ok((_, remote)) => {
                metrics.forwarded();
                let owner = remote.address().to_string();
                match call(remote).await.map_err(|s| from_owner(s, &owner)) {
                    Err(s) if not_delivered(&s) => s.message().to_string(),
                    other => return other,
                }
            }
            Err(_) if hop => return Err(status(not_owner(table, row, None))),
            Err(e) => e.to_string(),
        };
        if Instant::now() >= deadline {
            return Err(match failover {
                FailoverAfter::Never => Status::unavailable(last),
                FailoverAfter::After(_) => status(not_owner(table, row, None)),
            });
        }
        router.newer_than(planned, RETRY_WAIT).await;
    }
}

/// What one server of another cluster made of a call ([`ask_cluster`]).
pub enum Reply<T> {
    Answered(T),
    /// It could not answer (unreachable, or not for the whole cluster): the next one may.
    Next(String),
    /// An answer no other server of that cluster would give otherwise: stop here.
    Final(Error),
}

/// Asks `cluster`, another cluster of the instance, where the other clusters reach it — its
/// peer endpoint, or its servers in turn ([`basalt_meta::Meta::peer_addresses`]) — until one
/// server answers: `ask(address)`. `Ok(Err(why))`, the last server's reason, when none did (the
/// caller says what could not be done); `Err` for etcd's error or a [`Reply::Final`].
pub async fn ask_cluster<T, F, Fut>(
    node: &super::Node,
    cluster: &str,
    mut ask: F,
) -> Result<std::result::Result<T, String>>
where
    F: FnMut(String) -> Fut,
    Fut: Future<Output = Reply<T>>,
{
    let mut why = format!("no server of cluster {cluster} is known");
    for address in node.meta.peer_addresses(cluster).await? {
        match ask(address).await {
            Reply::Answered(answer) => return Ok(Ok(answer)),
            Reply::Next(reason) => why = reason,
            Reply::Final(e) => return Err(e),
        }
    }
    Ok(Err(why))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clients_deadline_travels_with_a_forwarded_call() {
        let mut md = tonic::metadata::MetadataMap::new();
        assert_eq!(client_deadline(&md), None);
        for (v, d) in [
            ("20S", Duration::from_secs(20)),
            ("1500m", Duration::from_millis(1500)),
            ("2M", Duration::from_secs(120)),
            ("7u", Duration::from_micros(7)),
        ] {
            md.insert("grpc-timeout", v.parse().unwrap());
            assert_eq!(client_deadline(&md), Some(d), "{v}");
        }
        md.insert("grpc-timeout", "12x".parse().unwrap());
        assert_eq!(FailoverAfter::of(&md), FailoverAfter::Never);
        assert_eq!(FailoverAfter::Never.retry_for(), RETRY_FOR);
        md.insert(
            FAILOVER_AFTER,
            FailoverAfter::header(Duration::from_millis(300)),
        );
        assert_eq!(
            FailoverAfter::of(&md),
            FailoverAfter::After(Duration::from_millis(300))
        );
        md.insert(
            FAILOVER_AFTER,
            FailoverAfter::header(Duration::from_secs(60)),
        );
        assert_eq!(FailoverAfter::of(&md).retry_for(), RETRY_FOR);
        assert_eq!(client_deadline(&md), None);
        let req = forwarded((), Some(Duration::from_secs(3)));
        assert!(req.metadata().contains_key(FORWARDED));
        assert_eq!(
            client_deadline(req.metadata()),
            Some(Duration::from_secs(3))
        );
    }
}
