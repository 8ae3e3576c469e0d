//! The tablet servers as the operator sees them: their reports over Basalt's control protocol
//! (`basalt.control.v1`, crate `basalt-control`).
//!
//! * [`GrpcTabletControl`] is the master's [`TabletControl`] over gRPC: one server's report
//!   (its state and the size and load of each tablet it serves), converted to the master's
//!   types by [`server_report`] (pure).
//! * [`observe_servers`] asks every server of a cluster at once, each within
//!   [`STATUS_DEADLINE`], and sums what they serve for the Cluster's status.

use std::collections::BTreeMap;
use std::time::Duration;

use basalt_control::{
    Dialer, GetServerStatusRequest, GetServerStatusResponse, TabletServerControlClient,
};
use basalt_master::{ServerReport, ServerState, TabletControl, TabletLoad};
use tonic::transport::Channel;

/// How long one server has to answer (connecting included).
pub const STATUS_DEADLINE: Duration = Duration::from_secs(2);

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

/// [`TabletControl`] over gRPC. Its [`Dialer`] keeps one channel per address (HTTP/2
/// connections are reused across reports, and remade after a failure).
pub struct GrpcTabletControl {
    timeout: Duration,
    dialer: Dialer,
}

impl GrpcTabletControl {
    /// `timeout` bounds connecting and each call.
    pub fn new(dialer: Dialer, timeout: Duration) -> GrpcTabletControl {
        GrpcTabletControl { timeout, dialer }
    }

    fn client(&self, address: &str) -> Result<TabletServerControlClient<Channel>, ControlError> {
        Ok(basalt_control::client(&self.dialer, address, self.timeout)?)
    }
}

impl TabletControl for GrpcTabletControl {
    type Error = ControlError;

    async fn report(&self, server: &ServerState) -> Result<ServerReport, ControlError> {
        let client = self.client(&server.address)?;
        let status = get_status(client, &server.address, self.timeout).await?;
        server_report(server, status)
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
