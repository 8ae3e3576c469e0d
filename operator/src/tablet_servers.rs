//! The tablet servers as the operator sees them: their reports over Basalt's control protocol
//! (`basalt.control.v1`, crate `basalt-control`).
//!
//! * [`GrpcTabletControl`] is the master's [`TabletControl`] over gRPC: one server's report
//!   (its state and the size and load of each tablet it serves), converted to the master's
//!   types by [`server_report`] (pure); a tablet's split point; the servers' steps of a move
//!   (`TabletMove`), within the deadlines the move driver gives.
//! * [`observe_servers`] asks every server of a cluster at once, each within
//!   [`STATUS_DEADLINE`], and sums what they serve for the Cluster's status.

use std::collections::BTreeMap;
use std::time::Duration;

use basalt_control::v1::{
    AbortMoveRequest, FenceTabletRequest, FinishMoveRequest, GetSplitPointRequest,
    ReceiveTabletRequest, ReleaseTabletRequest,
};
use basalt_control::{
    Dialer, GetServerStatusRequest, GetServerStatusResponse, TabletMoveClient,
    TabletServerControlClient,
};
use basalt_master::model::Tablet;
use basalt_master::{
    Fence, MoveSpec, Received, ServerReport, ServerState, StepError, TabletControl, TabletLoad,
};
use bytes::Bytes;
use tonic::transport::Channel;

/// How long one server has to answer (connecting included).
pub const STATUS_DEADLINE: Duration = Duration::from_secs(2);

/// How long a server has to find a split point (connecting included).
pub const SPLIT_POINT_DEADLINE: Duration = Duration::from_secs(30);

/// How long connecting to a server for a move's step may take (each step has its own
/// deadline besides).
pub const MOVE_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a server's report could not be had.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error(transparent)]
    Address(#[from] basalt_control::TransportError),
    /// The call failed: unreachable, timed out, or answered with an error.
    #[error("tablet server at {address}: {status}")]
    Rpc {
        address: String,
        status: Box<tonic::Status>,
    },
    /// Another server answers at the address (e.g. a pod IP now used by another pod): its
    /// report must not be taken for the expected server's.
    #[error("tablet server at {address} is {actual:?}, not {expected:?}")]
    WrongServer {
        address: String,
        expected: String,
        actual: String,
    },
}

/// [`TabletControl`] over gRPC. Its [`Dialer`] keeps one channel per address and deadlines
/// (HTTP/2 connections are reused across calls, and remade after a failure).
#[derive(Clone)]
pub struct GrpcTabletControl {
    timeout: Duration,
    dialer: Dialer,
}

impl GrpcTabletControl {
    /// `timeout` bounds connecting and each report. A split point has
    /// [`SPLIT_POINT_DEADLINE`]; a move's steps connect within [`MOVE_CONNECT_TIMEOUT`] and
    /// take the deadline their caller gives.
    pub fn new(dialer: Dialer, timeout: Duration) -> GrpcTabletControl {
        GrpcTabletControl { timeout, dialer }
    }

    fn client(&self, address: &str) -> Result<TabletServerControlClient<Channel>, ControlError> {
        Ok(basalt_control::client(&self.dialer, address, self.timeout)?)
    }

    /// The move service of the server at `address`: the call never leaves if the address is
    /// not one.
    fn move_client(&self, address: &str) -> Result<TabletMoveClient<Channel>, StepError> {
        basalt_control::move_client(&self.dialer, address, MOVE_CONNECT_TIMEOUT)
            .map_err(|e| StepError::Failed(e.to_string()))
    }
}

/// A request with a gRPC deadline: the server gives up past it, and so does the channel
/// (tonic's client applies the request's `grpc-timeout`).
fn timed<T>(msg: T, deadline: Duration) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.set_timeout(deadline);
    r
}

/// A move's wire spec.
fn wire(spec: &MoveSpec) -> Option<basalt_control::v1::MoveSpec> {
    Some(basalt_control::v1::MoveSpec::of(
        &spec.id,
        &spec.table_name,
        &spec.tablet,
    ))
}

/// What a failed move call claims. Only the codes a server's handler answers on purpose say
/// the step was not done; a deadline, a broken connection, or a transport error leave it
/// unknown (when in doubt, unknown: it claims less).
fn step_error(status: &tonic::Status) -> StepError {
    use tonic::Code;
    let message = status.message().to_string();
    match status.code() {
        Code::InvalidArgument
        | Code::NotFound
        | Code::AlreadyExists
        | Code::PermissionDenied
        | Code::FailedPrecondition
        | Code::Aborted
        | Code::OutOfRange
        | Code::Unimplemented
        | Code::DataLoss
        | Code::Unauthenticated => StepError::Failed(message),
        Code::Ok
        | Code::Cancelled
        | Code::Unknown
        | Code::DeadlineExceeded
        | Code::ResourceExhausted
        | Code::Internal
        | Code::Unavailable => StepError::Unknown(message),
    }
}

impl TabletControl for GrpcTabletControl {
    type Error = ControlError;

    async fn report(&self, server: &ServerState) -> Result<ServerReport, ControlError> {
        let client = self.client(&server.address)?;
        let status = get_status(client, &server.address, self.timeout).await?;
        server_report(server, status)
    }

    async fn split_point(
        &self,
        server: &ServerState,
        table_name: &str,
        tablet: &Tablet,
    ) -> Result<Option<Bytes>, ControlError> {
        let mut client =
            basalt_control::client(&self.dialer, &server.address, SPLIT_POINT_DEADLINE)?;
        let (start_key, end_key) = basalt_control::range_to_keys(&tablet.range);
        let resp = client
            .get_split_point(GetSplitPointRequest {
                table_name: table_name.to_string(),
                start_key,
                end_key,
            })
            .await
            .map_err(|status| ControlError::Rpc {
                address: server.address.clone(),
                status: Box::new(status),
            })?
            .into_inner();
        Ok((!resp.row_key.is_empty()).then_some(resp.row_key))
    }

    async fn receive_tablet(
        &self,
        server: &str,
        spec: &MoveSpec,
        source: &str,
        rate_limit_bytes_per_sec: u64,
        deadline: Duration,
    ) -> Result<Received, StepError> {
        let request = ReceiveTabletRequest {
            r#move: wire(spec),
            source_address: source.to_string(),
            rate_limit_bytes_per_sec,
        };
        let received = self
            .move_client(server)?
            .receive_tablet(timed(request, deadline))
            .await
            .map_err(|s| step_error(&s))?
            .into_inner();
        Ok(Received {
            bytes: received.bytes,
            copy_seconds: received.copy_seconds,
        })
    }

    async fn fence_tablet(
        &self,
        server: &str,
        spec: &MoveSpec,
        deadline: Duration,
    ) -> Result<Fence, StepError> {
        let request = FenceTabletRequest { r#move: wire(spec) };
        let fence = self
            .move_client(server)?
            .fence_tablet(timed(request, deadline))
            .await
            .map_err(|s| step_error(&s))?
            .into_inner();
        Ok(Fence {
            seq: fence.seq,
            clock: fence.clock,
        })
    }

    async fn finish_move(
        &self,
        server: &str,
        spec: &MoveSpec,
        fence: Fence,
        deadline: Duration,
    ) -> Result<(), StepError> {
        let request = FinishMoveRequest {
            r#move: wire(spec),
            seq: fence.seq,
            clock: fence.clock,
        };
        self.move_client(server)?
            .finish_move(timed(request, deadline))
            .await
            .map_err(|s| step_error(&s))?;
        Ok(())
    }

    async fn release_tablet(
        &self,
        server: &str,
        spec: &MoveSpec,
        deadline: Duration,
    ) -> Result<(), StepError> {
        let request = ReleaseTabletRequest { r#move: wire(spec) };
        self.move_client(server)?
            .release_tablet(timed(request, deadline))
            .await
            .map_err(|s| step_error(&s))?;
        Ok(())
    }

    async fn abort_move(
        &self,
        server: &str,
        spec: &MoveSpec,
        deadline: Duration,
    ) -> Result<(), StepError> {
        let request = AbortMoveRequest { r#move: wire(spec) };
        self.move_client(server)?
            .abort_move(timed(request, deadline))
            .await
            .map_err(|s| step_error(&s))?;
        Ok(())
    }
}

/// One server's status, within `timeout` (which the channel also applies; this bounds the
/// whole call whatever the channel does).
async fn get_status(
    mut client: TabletServerControlClient<Channel>,
    address: &str,
    timeout: Duration,
) -> Result<GetServerStatusResponse, ControlError> {
    let rpc = |status: tonic::Status| ControlError::Rpc {
        address: address.to_string(),
        status: Box::new(status),
    };
    let call = client.get_server_status(GetServerStatusRequest {});
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(response)) => Ok(response.into_inner()),
        Ok(Err(status)) => Err(rpc(status)),
        Err(_) => Err(rpc(tonic::Status::deadline_exceeded(format!(
            "no status within {timeout:?}"
        )))),
    }
}

/// The master's view of a report from `server` (what the caller knew of it: its id, address
/// and ordinal). Tablets are keyed by table id and start key; a standalone server holding
/// tables of the same id in two instances reports their sum under that key. Pure.
pub fn server_report(
    server: &ServerState,
    status: GetServerStatusResponse,
) -> Result<ServerReport, ControlError> {
    let identity = status.server.unwrap_or_default();
    if !server.id.is_empty() && identity.server_id != server.id {
        return Err(ControlError::WrongServer {
            address: server.address.clone(),
            expected: server.id.clone(),
            actual: identity.server_id,
        });
    }
    let storage = status.storage.unwrap_or_default();
    let mut tablets: BTreeMap<(String, bytes::Bytes), TabletLoad> = BTreeMap::new();
    for t in &status.tablets {
        let load = tablets
            .entry((t.table_id().to_string(), t.start_key.clone()))
            .or_default();
        load.bytes = load.bytes.saturating_add(t.approximate_bytes);
        load.requests_per_sec += t.load.map_or(0.0, |l| l.requests_per_sec());
    }
    Ok(ServerReport {
        state: ServerState {
            id: server.id.clone(),
            address: server.address.clone(),
            ordinal: server.ordinal,
            ready: status.ready,
            stored_bytes: storage.stored_bytes(),
            capacity_bytes: storage.capacity_bytes,
        },
        tablets,
        cpu: status.cpu.map(|cpu| basalt_master::autoscale::CpuReading {
            process_started_micros: identity.start_time_micros,
            at_micros: status.report_time_micros,
            cpu_seconds: cpu.cpu_seconds,
            allocation_cores: cpu.allocation_cores,
        }),
    })
}

/// What a cluster's tablet servers serve, summed over those that answered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Serving {
    /// Tablets served; None when no server answered.
    pub tablets: Option<i64>,
    /// Bytes stored (SST files and memtables); None when no server answered.
    pub bytes: Option<i64>,
}

/// Asks the servers at `addresses` (`host:port` of their gRPC port) for their status, all at
/// once, each within [`STATUS_DEADLINE`], and sums what those that answered serve. A server
/// that does not answer in time counts for nothing (it is logged at debug level).
pub async fn observe_servers(dialer: &Dialer, addresses: &[String]) -> Serving {
    let calls = addresses.iter().map(|address| async move {
        let client = basalt_control::client(dialer, address, STATUS_DEADLINE)?;
        get_status(client, address, STATUS_DEADLINE).await
    });
    let statuses = futures::future::join_all(calls).await;
    let mut serving = Serving::default();
    for status in statuses {
        match status {
            Ok(status) => add(&mut serving, &status),
            Err(error) => tracing::debug!(%error, "tablet server did not report its status"),
        }
    }
    serving
}

/// Adds one server's status to the sums. Pure.
fn add(serving: &mut Serving, status: &GetServerStatusResponse) {
    let stored = status.storage.unwrap_or_default().stored_bytes();
    let tablets = serving.tablets.get_or_insert(0);
    *tablets = tablets.saturating_add(status.tablets.len() as i64);
    let bytes = serving.bytes.get_or_insert(0);
    *bytes = bytes.saturating_add(i64::try_from(stored).unwrap_or(i64::MAX));
}

#[cfg(test)]
mod tests {
    use super::*;
    use basalt_control::{ServerIdentity, StorageStatus, TabletLoad as WireLoad, TabletStatus};
    use bytes::Bytes;

    fn state(id: &str) -> ServerState {
        ServerState {
            id: id.into(),
            address: "10.0.0.7:8086".into(),
            ordinal: 3,
            ready: false,
            stored_bytes: 0,
            capacity_bytes: None,
        }
    }

    fn tablet(table: &str, start: &str, end: Option<&str>, bytes: u64, rps: f64) -> TabletStatus {
        TabletStatus {
            table_name: format!("projects/p/instances/i/tables/{table}"),
            start_key: Bytes::copy_from_slice(start.as_bytes()),
            end_key: Bytes::copy_from_slice(end.unwrap_or_default().as_bytes()),
            epoch: 0,
            approximate_bytes: bytes,
            load: Some(WireLoad {
                read_requests_per_sec: rps / 2.0,
                write_requests_per_sec: rps / 2.0,
                read_requests: 0,
                write_requests: 0,
            }),
        }
    }

    fn status(server_id: &str) -> GetServerStatusResponse {
        GetServerStatusResponse {
            server: Some(ServerIdentity {
                server_id: server_id.into(),
                ..ServerIdentity::default()
            }),
            ready: true,
            storage: Some(StorageStatus {
                sst_bytes: 1000,
                memtable_bytes: 24,
                capacity_bytes: Some(1 << 30),
                ..StorageStatus::default()
            }),
            tablets: vec![
                tablet("orders", "", Some("m"), 600, 4.0),
                tablet("orders", "m", None, 400, 1.0),
                tablet("users", "", None, 0, 0.0),
            ],
            ..GetServerStatusResponse::default()
        }
    }

    #[test]
    fn a_status_becomes_the_masters_report() {
        let report = server_report(&state("s3"), status("s3")).unwrap();
        assert_eq!(
            report.state,
            ServerState {
                ready: true,
                stored_bytes: 1024,
                capacity_bytes: Some(1 << 30),
                ..state("s3")
            }
        );
        let key = |t: &str, s: &'static str| (t.to_string(), Bytes::from_static(s.as_bytes()));
        assert_eq!(
            report.tablets,
            BTreeMap::from([
                (
                    key("orders", ""),
                    TabletLoad {
                        bytes: 600,
                        requests_per_sec: 4.0
                    }
                ),
                (
                    key("orders", "m"),
                    TabletLoad {
                        bytes: 400,
                        requests_per_sec: 1.0
                    }
                ),
                (key("users", ""), TabletLoad::default()),
            ])
        );
    }

    #[test]
    fn a_report_from_another_server_at_the_address_is_refused() {
        assert!(matches!(
            server_report(&state("s3"), status("s4")),
            Err(ControlError::WrongServer { expected, actual, .. }) if expected == "s3" && actual == "s4"
        ));
        // A caller that does not know the id yet takes whoever answers.
        assert!(server_report(&state(""), status("s4")).is_ok());
    }

    #[test]
    fn the_same_table_id_in_two_instances_adds_up() {
        let mut s = status("s3");
        let mut other = tablet("orders", "", Some("m"), 5, 1.0);
        other.table_name = "projects/q/instances/j/tables/orders".into();
        s.tablets.push(other);
        let report = server_report(&state("s3"), s).unwrap();
        assert_eq!(
            report.tablets[&("orders".to_string(), Bytes::new())],
            TabletLoad {
                bytes: 605,
                requests_per_sec: 5.0
            }
        );
    }

    #[test]
    fn serving_sums_what_the_servers_answered() {
        let mut serving = Serving::default();
        add(&mut serving, &status("s0"));
        add(&mut serving, &status("s1"));
        assert_eq!(
            serving,
            Serving {
                tablets: Some(6),
                bytes: Some(2048)
            }
        );
    }

    #[test]
    fn a_move_step_is_unknown_unless_the_server_refused_it() {
        let failed = |m: &str| StepError::Failed(m.into());
        let unknown = |m: &str| StepError::Unknown(m.into());
        for (status, expected) in [
            (
                tonic::Status::failed_precondition("not the owner"),
                failed("not the owner"),
            ),
            (
                tonic::Status::aborted("stream ended"),
                failed("stream ended"),
            ),
            (
                tonic::Status::data_loss("bad checksum"),
                failed("bad checksum"),
            ),
            (tonic::Status::unimplemented("no moves"), failed("no moves")),
            (tonic::Status::deadline_exceeded("late"), unknown("late")),
            (tonic::Status::unavailable("reset"), unknown("reset")),
            (tonic::Status::cancelled("gone"), unknown("gone")),
            (tonic::Status::internal("h2"), unknown("h2")),
        ] {
            assert_eq!(step_error(&status), expected, "{status:?}");
        }
    }

    #[tokio::test]
    async fn a_move_step_to_a_bad_address_never_leaves() {
        let control = GrpcTabletControl::new(Dialer::default(), STATUS_DEADLINE);
        let spec = MoveSpec {
            id: "m1".into(),
            table_name: "projects/p/instances/i/tables/t".into(),
            tablet: Tablet {
                table: "t".into(),
                range: basalt_master::model::RowRange::all(),
                epoch: 1,
                owner: "s0".into(),
                state: basalt_master::model::TabletState::Serving,
            },
        };
        assert!(matches!(
            control
                .abort_move("bad address", &spec, Duration::from_secs(1))
                .await,
            Err(StepError::Failed(_))
        ));
    }

    #[tokio::test]
    async fn no_server_answering_is_none_and_does_not_wait_past_the_deadline() {
        // Nothing listens on port 1 of a loopback address; a bad address fails at once.
        let started = std::time::Instant::now();
        let dialer = Dialer::default();
        let serving = observe_servers(
            &dialer,
            &["127.0.0.1:1".to_string(), "bad address".to_string()],
        )
        .await;
        assert_eq!(serving, Serving::default());
        assert!(started.elapsed() < STATUS_DEADLINE + Duration::from_secs(1));
        assert_eq!(observe_servers(&dialer, &[]).await, Serving::default());
    }
}
