//! The control protocol end to end: a real tablet server (in process, on a loopback address of
//! its own), a table with initial splits, rows written and read through the Bigtable data API,
//! and the server's report and a tablet's split point through the operator's `TabletControl`
//! implementation and `observe_servers`.

use std::time::Duration;

use basalt_master::model::{RowRange, Tablet, TabletState};
use basalt_master::{MoveSpec, ServerState, StepError, TabletControl};
use basalt_operator::tablet_servers::{
    ControlError, GrpcTabletControl, STATUS_DEADLINE, Serving, observe_servers,
};
use bytes::Bytes;
use googleapis_tonic_google_bigtable_admin_v2::google::bigtable::admin::v2 as admin;
use googleapis_tonic_google_bigtable_v2::google::bigtable::v2 as data;

const IP: &str = "127.0.0.81";
const TABLE: &str = "projects/p/instances/i/tables/orders";

fn address() -> String {
    format!("{IP}:8086")
}

/// A real tablet server on `IP:8086` over `dir`, stopped by [`Server::stop`].
struct Server {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    async fn start(dir: &std::path::Path) -> Server {
        let config = basalt_tablet_server::server::Config {
            backup: None,
            data_dir: dir.join("data"),
            listen: address().parse().unwrap(),
            http_listen: format!("{IP}:8087").parse().unwrap(),
            cluster_id: "orders-c1".into(),
            tombstone_grace: Duration::from_secs(3600),
            block_cache_bytes: 8 << 20,
            shutdown_timeout: Duration::from_secs(5),
            cpu_allocation_millicores: None,
            identity: basalt_tablet_server::control_api::Identity {
                server_id: Some("orders-c1-0".into()),
                advertise_address: Some(address()),
                instance: Some("orders-prod".into()),
            },
            cluster: None,
            security: basalt_transport::Security::Plaintext,
            filter: None,
            store_slot: None,
            auth: Default::default(),
        };
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            basalt_tablet_server::server::run(config, async move {
                let _ = rx.await;
            })
            .await
            .unwrap();
        });
        for _ in 0..200 {
            if tokio::net::TcpStream::connect(address()).await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Server { stop, task }
    }

    /// Stops it gracefully (the store is flushed: tablet sizes count the rows afterwards).
    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap();
    }
}

async fn channel() -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{}", address()))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// Table `orders` split at "g" and "p": tablets [, g), [g, p), [p, ).
async fn create_table() {
    use admin::bigtable_table_admin_client::BigtableTableAdminClient;
    let mut client = BigtableTableAdminClient::new(channel().await);
    client
        .create_table(admin::CreateTableRequest {
            parent: "projects/p/instances/i".into(),
            table_id: "orders".into(),
            table: Some(admin::Table {
                column_families: [("cf".to_string(), admin::ColumnFamily::default())].into(),
                ..admin::Table::default()
            }),
            initial_splits: ["g", "p"]
                .iter()
                .map(|k| admin::create_table_request::Split {
                    key: Bytes::from_static(k.as_bytes()),
                })
                .collect(),
        })
        .await
        .unwrap();
}

/// 32 KiB that do not compress (a xorshift sequence seeded by `seed`): sizes on disk follow
/// the bytes written.
fn value(seed: u64) -> Bytes {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(VALUE_BYTES);
    while out.len() < VALUE_BYTES {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    Bytes::from(out)
}

const VALUE_BYTES: usize = 32 << 10;

/// Writes `rows` (one cell of [`value`] each) with one MutateRows, then reads `read` back.
async fn write_and_read(rows: &[&str], read: &str) {
    use data::bigtable_client::BigtableClient;
    use data::mutation::{Mutation as Kind, SetCell};
    let mut client = BigtableClient::new(channel().await);
    let entries = rows
        .iter()
        .enumerate()
        .map(|(i, row)| data::mutate_rows_request::Entry {
            row_key: Bytes::copy_from_slice(row.as_bytes()),
            mutations: vec![data::Mutation {
                mutation: Some(Kind::SetCell(SetCell {
                    family_name: "cf".into(),
                    column_qualifier: Bytes::from_static(b"q"),
                    timestamp_micros: -1,
                    value: value(i as u64),
                })),
            }],
            idempotency: None,
        })
        .collect();
    let mut stream = client
        .mutate_rows(data::MutateRowsRequest {
            table_name: TABLE.into(),
            entries,
            ..data::MutateRowsRequest::default()
        })
        .await
        .unwrap()
        .into_inner();
    while let Some(resp) = stream.message().await.unwrap() {
        assert!(
            resp.entries
                .iter()
                .all(|e| e.status.as_ref().unwrap().code == 0)
        );
    }
    let mut stream = client
        .read_rows(data::ReadRowsRequest {
            table_name: TABLE.into(),
            rows: Some(data::RowSet {
                row_keys: vec![Bytes::copy_from_slice(read.as_bytes())],
                row_ranges: vec![],
            }),
            ..data::ReadRowsRequest::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut chunks = 0;
    while let Some(resp) = stream.message().await.unwrap() {
        chunks += resp.chunks.len();
    }
    assert!(chunks > 0, "row {read} was read back");
}

fn server_state() -> ServerState {
    ServerState {
        id: "orders-c1-0".into(),
        address: address(),
        ordinal: 0,
        ready: false,
        stored_bytes: 0,
        capacity_bytes: None,
    }
}

fn key(start: &'static str) -> (String, Bytes) {
    ("orders".to_string(), Bytes::from_static(start.as_bytes()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tablet_server_reports_its_tablets_their_load_and_its_storage() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path()).await;
    create_table().await;
    // Ten rows in the first tablet, five in the second, none in the last; one read in the
    // second.
    let first: Vec<String> = (0..10).map(|i| format!("a{i:02}")).collect();
    let second: Vec<String> = (0..5).map(|i| format!("h{i:02}")).collect();
    let rows: Vec<&str> = first.iter().chain(&second).map(String::as_str).collect();
    write_and_read(&rows, "h01").await;

    // The raw report: identity, readiness, and the tablets with their ranges.
    let dialer = basalt_control::Dialer::default();
    let mut client = basalt_control::client(&dialer, &address(), Duration::from_secs(5)).unwrap();
    let status = client
        .get_server_status(basalt_control::GetServerStatusRequest {})
        .await
        .unwrap()
        .into_inner();
    let identity = status.server.clone().unwrap();
    assert_eq!(identity.server_id, "orders-c1-0");
    assert_eq!(identity.address, address());
    assert_eq!(identity.instance, "orders-prod");
    assert_eq!(identity.cluster, "orders-c1");
    assert!(!identity.version.is_empty());
    assert!(status.ready);
    assert_eq!(status.load_window_seconds, 60);
    // Each tablet's [start, end): the empty end is "to the last row".
    let ranges: Vec<(&str, &[u8], &[u8])> = status
        .tablets
        .iter()
        .map(|t| (t.table_name.as_str(), &t.start_key[..], &t.end_key[..]))
        .collect();
    assert_eq!(
        ranges,
        [
            (TABLE, &b""[..], &b"g"[..]),
            (TABLE, b"g", b"p"),
            (TABLE, b"p", b""),
        ]
    );
    let loads: Vec<(u64, u64)> = status
        .tablets
        .iter()
        .map(|t| {
            let l = t.load.unwrap();
            (l.read_requests, l.write_requests)
        })
        .collect();
    assert_eq!(loads, [(0, 10), (1, 5), (0, 0)]);
    let storage = status.storage.unwrap();
    assert!(storage.capacity_bytes.is_some_and(|c| c > 0));
    // Its CPU: the time the process used serving (and starting), against an allocation of
    // at most the machine's cores.
    let cpu = status.cpu.unwrap();
    assert!(cpu.cpu_seconds > 0.0, "{cpu:?}");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    assert!(
        cpu.allocation_cores > 0.0 && cpu.allocation_cores <= cores,
        "{cpu:?}"
    );

    // Through the master's trait: the same tablets, with a rate on those that got requests.
    let control = GrpcTabletControl::new(basalt_control::Dialer::default(), STATUS_DEADLINE);
    let report = control.report(&server_state()).await.unwrap();
    assert!(report.state.ready);
    assert!(report.state.stored_bytes > 0, "{:?}", report.state);
    assert_eq!(report.state.capacity_bytes, storage.capacity_bytes);
    let keys: Vec<&(String, Bytes)> = report.tablets.keys().collect();
    assert_eq!(keys, [&key(""), &key("g"), &key("p")]);
    assert!(report.tablets[&key("")].requests_per_sec > 0.0);
    assert!(report.tablets[&key("g")].requests_per_sec > 0.0);
    assert_eq!(report.tablets[&key("p")].requests_per_sec, 0.0);
    // Another server's name at this address is refused.
    let other = ServerState {
        id: "orders-c1-1".into(),
        ..server_state()
    };
    assert!(matches!(
        control.report(&other).await,
        Err(ControlError::WrongServer { .. })
    ));

    // The Cluster status' sums: one server answering out of two addresses.
    let serving = observe_servers(
        &basalt_control::Dialer::default(),
        &[address(), format!("{IP}:1")],
    )
    .await;
    assert_eq!(serving.tablets, Some(3));
    assert!(serving.bytes.is_some_and(|b| b > 0), "{serving:?}");

    // After a restart (the store flushed its memtables into SST files), the tablets' sizes
    // count their rows: about 320 KiB and 160 KiB; the loads started again from zero.
    server.stop().await;
    let server = Server::start(dir.path()).await;
    let report = control.report(&server_state()).await.unwrap();
    let bytes = |start| report.tablets[&key(start)].bytes;
    let written = |rows: u64| rows * VALUE_BYTES as u64;
    assert!(
        (written(8)..written(12)).contains(&bytes("")),
        "{:?}",
        report.tablets
    );
    assert!(
        (written(4)..written(6)).contains(&bytes("g")),
        "{:?}",
        report.tablets
    );
    assert_eq!(bytes("p"), 0);
    assert!(report.tablets.values().all(|t| t.requests_per_sec == 0.0));

    // Where the master would split a tablet: a row among those written into it; the empty
    // tablet has no split point.
    let tablet = |start: &'static str, end: Option<&'static str>| Tablet {
        table: "orders".into(),
        range: RowRange::new(
            Bytes::from_static(start.as_bytes()),
            end.map(|e| Bytes::from_static(e.as_bytes())),
        ),
        epoch: 0,
        owner: "orders-c1-0".into(),
        state: TabletState::Serving,
    };
    let at = control
        .split_point(&server_state(), TABLE, &tablet("", Some("g")))
        .await
        .unwrap();
    assert!(
        at.as_ref()
            .is_some_and(|row| row[..] > b"a00"[..] && row[..] <= b"a09"[..]),
        "{at:?}"
    );
    assert_eq!(
        control
            .split_point(&server_state(), TABLE, &tablet("p", None))
            .await
            .unwrap(),
        None
    );
    // A standalone server serves no moves: a move's step is refused, not of unknown outcome.
    let spec = MoveSpec {
        id: "m1".into(),
        table_name: TABLE.into(),
        tablet: tablet("", Some("g")),
    };
    assert!(matches!(
        control
            .abort_move(&address(), &spec, Duration::from_secs(5))
            .await,
        Err(StepError::Failed(_))
    ));
    server.stop().await;

    // Nobody answering: nothing is known.
    assert_eq!(
        observe_servers(&basalt_control::Dialer::default(), &[address()]).await,
        Serving::default()
    );
    assert!(matches!(
        control
            .fence_tablet(&address(), &spec, Duration::from_secs(5))
            .await,
        Err(StepError::Unknown(_))
    ));
}
