//! A tablet move under a network partition, on the in-process test cluster of
//! `basalt-testkit` (a real etcd, three real tablet servers, the master's own move driver):
//! with the source and the destination partitioned from each other the move aborts within
//! seconds, naming the failure, and nothing is lost: the tablet is Serving at its source with
//! its epoch, no move record is left, no tablet has two owners, every acknowledged write is
//! there exactly once, a counter is exact; once healed, the same move succeeds.
//! Writers run through the Bigtable data API of the third server throughout.

mod in_process;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use basalt_master::model::{Tablet, TabletState};
use basalt_meta::Leadership;
use basalt_operator::master::moves::{self, Move, Outcome};
use basalt_operator::tablet_servers::{GrpcTabletControl, STATUS_DEADLINE};
use basalt_testkit::{CLUSTER, MASTER, TestCluster, eventually};
use bytes::Bytes;
use googleapis_tonic_google_bigtable_v2::google::bigtable::v2 as data;
use in_process::{Master, TABLE, channel, create_table, table_name};

/// What the writers had acknowledged.
#[derive(Debug, Default)]
struct Acked {
    /// Row key → the value written (one cell each).
    rows: BTreeMap<Bytes, Bytes>,
    failed_rows: u64,
    increments: i64,
    failed_increments: Vec<tonic::Status>,
}

/// Writes rows `k<writer>-<n>` (the moved tablet) and `x<writer>-<n>` (the other) with
/// MutateRow, and every fifth time increments `counter` (the moved tablet) with
/// ReadModifyWriteRow, until `stop`.
async fn write(writer: usize, address: String, stop: Arc<AtomicBool>) -> Acked {
    use data::bigtable_client::BigtableClient;
    use data::mutation::{Mutation as Kind, SetCell};
    use data::read_modify_write_rule::Rule;
    let mut client = BigtableClient::new(channel(&address).await);
    let mut acked = Acked::default();
    let mut n = 0u64;
    while !stop.load(Ordering::SeqCst) {
        n += 1;
        let tablet = if n.is_multiple_of(2) { 'k' } else { 'x' };
        let key = Bytes::from(format!("{tablet}{writer}-{n:06}"));
        let value = Bytes::from(n.to_string());
        let mut req = tonic::Request::new(data::MutateRowRequest {
            table_name: table_name(),
            row_key: key.clone(),
            mutations: vec![data::Mutation {
                mutation: Some(Kind::SetCell(SetCell {
                    family_name: "cf".into(),
                    column_qualifier: Bytes::from_static(b"q"),
                    timestamp_micros: -1,
                    value: value.clone(),
                })),
            }],
            ..Default::default()
        });
        req.set_timeout(Duration::from_secs(5));
        match client.mutate_row(req).await {
            Ok(_) => {
                acked.rows.insert(key, value);
            }
            Err(_) => acked.failed_rows += 1,
        }
        if n.is_multiple_of(5) {
            let mut req = tonic::Request::new(data::ReadModifyWriteRowRequest {
                table_name: table_name(),
                row_key: Bytes::from_static(b"counter"),
                rules: vec![data::ReadModifyWriteRule {
                    family_name: "cf".into(),
                    column_qualifier: Bytes::from_static(b"n"),
                    rule: Some(Rule::IncrementAmount(1)),
                }],
                ..Default::default()
            });
            req.set_timeout(Duration::from_secs(5));
            match client.read_modify_write_row(req).await {
                Ok(_) => acked.increments += 1,
                Err(s) => acked.failed_increments.push(s),
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    acked
}

/// Every cell of the table: row key → the values of its cells, in order.
async fn read_all(address: &str) -> HashMap<Bytes, Vec<Bytes>> {
    use data::bigtable_client::BigtableClient;
    let mut stream = BigtableClient::new(channel(address).await)
        .read_rows(data::ReadRowsRequest {
            table_name: table_name(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut rows: HashMap<Bytes, Vec<Bytes>> = HashMap::new();
    let (mut row, mut value) = (Bytes::new(), Vec::new());
    while let Some(resp) = stream.message().await.unwrap() {
        for chunk in resp.chunks {
            if !chunk.row_key.is_empty() {
                row = chunk.row_key.clone();
            }
            value.extend_from_slice(&chunk.value);
            if chunk.value_size == 0 {
                rows.entry(row.clone())
                    .or_default()
                    .push(Bytes::from(std::mem::take(&mut value)));
            }
        }
    }
    rows
}

async fn tablets(cluster: &TestCluster) -> Vec<Tablet> {
    let (map, _) = cluster.meta().tablets(CLUSTER).await.unwrap();
    map.tablets(TABLE).to_vec()
}

/// Which servers serve which tablet of `t` (start key → (store id, epoch)), by their control
/// API.
async fn served(cluster: &TestCluster) -> BTreeMap<Bytes, Vec<(String, u64)>> {
    let dialer = basalt_transport::Dialer::default();
    let mut served: BTreeMap<Bytes, Vec<(String, u64)>> = BTreeMap::new();
    for i in 0..cluster.len() {
        let mut client =
            basalt_control::client(&dialer, cluster.address(i), Duration::from_secs(5)).unwrap();
        let status = client
            .get_server_status(basalt_control::v1::GetServerStatusRequest {})
            .await
            .unwrap()
            .into_inner();
        for t in status
            .tablets
            .iter()
            .filter(|t| t.table_name == table_name())
        {
            served
                .entry(t.start_key.clone())
                .or_default()
                .push((cluster.store_id(i).to_string(), t.epoch));
        }
    }
    served
}

/// Every tablet of the map is Serving and served by exactly its owner, at its epoch.
async fn one_owner_each(cluster: &TestCluster) -> bool {
    let map = tablets(cluster).await;
    let served = served(cluster).await;
    map.len() == served.len()
        && map.iter().all(|t| {
            t.state == TabletState::Serving
                && served.get(&t.range.start[..]).map(Vec::as_slice)
                    == Some(&[(t.owner.to_string(), t.epoch)][..])
        })
}

fn the_move(cluster: &TestCluster, tablet: &Tablet, from: usize, to: usize) -> Move {
    Move {
        cluster: CLUSTER.into(),
        table_name: table_name(),
        tablet: tablet.clone(),
        to: cluster.store_id(to).to_string(),
        from_address: cluster.address(from).to_string(),
        to_address: cluster.address(to).to_string(),
        reason: "balance".into(),
        rate_limit_bytes_per_sec: 0,
    }
}

/// Moves hold fail points that are global to the process: one test at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Three servers with table `t` assigned (by the operator's master, which then steps down so
/// that the test drives the moves) and the test holding the master's role: the term of its
/// moves.
async fn setup() -> (TestCluster, Leadership) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let cluster = TestCluster::start(3).await;
    let master = Master::start(&cluster);
    create_table(cluster.address(0)).await;
    eventually(
        Duration::from_secs(15),
        "t's tablets are assigned",
        || async { tablets(&cluster).await.len() == 2 },
    )
    .await;
    master.stop().await;
    let leadership = cluster
        .meta()
        .campaign("the-test", Duration::from_secs(10))
        .await
        .unwrap();
    eventually(
        Duration::from_secs(10),
        "every tablet has one owner",
        || one_owner_each(&cluster),
    )
    .await;
    (cluster, leadership)
}

/// The tablet [, m): its record, its owner (the source of the moves), another server (their
/// destination) and the third.
async fn first_tablet(cluster: &TestCluster) -> (Tablet, usize, usize, usize) {
    let tablet = tablets(cluster)
        .await
        .into_iter()
        .find(|t| t.range.start.is_empty())
        .unwrap();
    let source = cluster.index_of(tablet.owner.as_str()).unwrap();
    (tablet, source, (source + 1) % 3, (source + 2) % 3)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_move_under_a_partition_aborts_cleanly_and_nothing_is_lost() {
    let _serial = SERIAL.lock().await;
    let (cluster, leadership) = setup().await;
    let term = leadership.term.clone();

    // The tablet [, m) moves from its owner to another server; the writers use the third.
    let (before, source, destination, front) = first_tablet(&cluster).await;
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..2)
        .map(|w| tokio::spawn(write(w, cluster.address(front).to_string(), stop.clone())))
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Partitioned: the destination cannot reach the source to copy the tablet.
    cluster.partition(source, destination);
    // The master's control of the servers, under the same filter as the servers' own calls.
    let dialer = GrpcTabletControl::new(cluster.dialer(MASTER), STATUS_DEADLINE);
    let started = Instant::now();
    let outcome = moves::run(
        cluster.meta(),
        &term,
        &dialer,
        &the_move(&cluster, &before, source, destination),
    )
    .await;
    let took = started.elapsed();
    let Outcome::Aborted(why) = &outcome else {
        panic!("the move under a partition did not abort: {outcome:?}");
    };
    assert!(
        why.contains("the destination could not copy the tablet"),
        "the reason names the failure: {why}"
    );
    assert!(took < Duration::from_secs(30), "the abort took {took:?}");
    eprintln!("aborted after {took:?}: {why}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    cluster.heal();

    // Nothing changed: Serving at the source with the same epoch, no move record, one owner.
    let after = tablets(&cluster).await;
    let tablet = after.iter().find(|t| t.range.start.is_empty()).unwrap();
    assert_eq!(tablet, &before);
    assert_eq!(
        (tablet.state, tablet.owner.as_str(), tablet.epoch),
        (TabletState::Serving, cluster.store_id(source), before.epoch)
    );
    assert!(cluster.meta().moves(CLUSTER).await.unwrap().is_empty());
    eventually(
        Duration::from_secs(10),
        "every tablet has one owner after the abort",
        || one_owner_each(&cluster),
    )
    .await;

    // Healed, the same move succeeds.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let outcome = moves::run(
        cluster.meta(),
        &term,
        &dialer,
        &the_move(&cluster, &before, source, destination),
    )
    .await;
    assert!(
        matches!(outcome, Outcome::Moved(_)),
        "the move after healing: {outcome:?}"
    );
    let moved = tablets(&cluster)
        .await
        .into_iter()
        .find(|t| t.range.start.is_empty())
        .unwrap();
    assert_eq!(
        (moved.state, moved.owner.as_str(), moved.epoch),
        (
            TabletState::Serving,
            cluster.store_id(destination),
            before.epoch + 1
        )
    );
    assert!(cluster.meta().moves(CLUSTER).await.unwrap().is_empty());
    eventually(
        Duration::from_secs(10),
        "every tablet has one owner after the move",
        || one_owner_each(&cluster),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Every acknowledged write is there exactly once; the counter is exact.
    stop.store(true, Ordering::SeqCst);
    let mut acked = Acked::default();
    for w in writers {
        let a = w.await.unwrap();
        acked.rows.extend(a.rows);
        acked.failed_rows += a.failed_rows;
        acked.increments += a.increments;
        acked.failed_increments.extend(a.failed_increments);
    }
    eprintln!(
        "acknowledged {} rows ({} failed) and {} increments ({} failed: {:?})",
        acked.rows.len(),
        acked.failed_rows,
        acked.increments,
        acked.failed_increments.len(),
        acked.failed_increments
    );
    assert!(acked.rows.len() > 100, "the writers wrote throughout");
    for reader in [front, source, destination] {
        let rows = read_all(cluster.address(reader)).await;
        for (key, value) in &acked.rows {
            assert_eq!(
                rows.get(key),
                Some(&vec![value.clone()]),
                "row {key:?} through server {reader}"
            );
        }
        // Each increment writes a new version of the cell; the newest (read first) counts.
        let counter = rows.get(&b"counter"[..]).expect("the counter row");
        let counter = i64::from_be_bytes(counter[0][..].try_into().unwrap());
        assert_eq!(
            counter,
            acked.increments,
            "the counter through server {reader} ({} increments failed)",
            acked.failed_increments.len()
        );
    }
    drop(leadership);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partition_while_the_snapshot_streams_ends_the_move_by_keep_alive() {
    let _serial = SERIAL.lock().await;
    let (cluster, leadership) = setup().await;
    let (before, source, destination, front) = first_tablet(&cluster).await;
    // Rows in the tablet, so that its snapshot has a file to stream.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn(write(0, cluster.address(front).to_string(), stop.clone()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::SeqCst);
    let acked = writer.await.unwrap();
    assert!(!acked.rows.is_empty());

    // The source holds the stream after its first chunk; meanwhile the partition comes: the
    // destination's established connection to the source hangs.
    fail::cfg("move-source-mid-stream", "return(120000)").unwrap();
    // The master's control of the servers, under the same filter as the servers' own calls.
    let dialer = GrpcTabletControl::new(cluster.dialer(MASTER), STATUS_DEADLINE);
    let m = the_move(&cluster, &before, source, destination);
    let started = Instant::now();
    let running = {
        let (meta, term, dialer) = (
            cluster.meta().clone(),
            leadership.term.clone(),
            dialer.clone(),
        );
        tokio::spawn(async move { moves::run(&meta, &term, &dialer, &m).await })
    };
    eventually(Duration::from_secs(10), "the move is copying", || async {
        !cluster.meta().moves(CLUSTER).await.unwrap().is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    cluster.partition(source, destination);
    let outcome = tokio::time::timeout(Duration::from_secs(90), running)
        .await
        .expect("the move ends within 90 s of the partition")
        .unwrap();
    let took = started.elapsed();
    fail::remove("move-source-mid-stream");
    eprintln!("a partition mid-stream ended the move after {took:?}: {outcome:?}");
    let Outcome::Aborted(why) = &outcome else {
        panic!("the move under a partition did not abort: {outcome:?}");
    };
    assert!(
        why.contains("the destination could not copy the tablet"),
        "the reason names the failure: {why}"
    );
    cluster.heal();
    let after = tablets(&cluster).await;
    assert_eq!(
        after.iter().find(|t| t.range.start.is_empty()),
        Some(&before)
    );
    assert!(cluster.meta().moves(CLUSTER).await.unwrap().is_empty());
    eventually(
        Duration::from_secs(10),
        "every tablet has one owner after the abort",
        || one_owner_each(&cluster),
    )
    .await;
    let rows = read_all(cluster.address(front)).await;
    for (key, value) in &acked.rows {
        assert_eq!(rows.get(key), Some(&vec![value.clone()]), "row {key:?}");
    }
}
