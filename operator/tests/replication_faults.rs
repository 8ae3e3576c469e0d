//! Replication between the clusters of one instance under faults, on the in-process test
//! cluster of `basalt-testkit` (a real etcd, real tablet servers in two or three clusters,
//! declared replicas by the operator's `declare_replicas` before their servers start, tablets
//! assigned by the operator's master). Clients write through the Bigtable data API of servers
//! of the clusters throughout; what is checked is what a user sees: once a consistency token
//! made after the writes turns consistent (CheckConsistency, polled through another cluster),
//! every server of every cluster reads the same table (every cell with its timestamp), every
//! acknowledged SetCell is there exactly once (one cell, its value and timestamp), every row
//! whose DeleteFromRow was acknowledged is gone, and the cells both clusters wrote hold one
//! value everywhere.
//!
//! * a partition between the clusters, then a heal;
//! * with three clusters, one cut off from the two others, which keep replicating to each
//!   other, then a heal: the one cut off catches up;
//! * a slow peer next to a fast one: the lag to the fast one stays small while the slow one is
//!   behind (etcd's `shipped/` records, as the Instance's status reads them, and the server's
//!   delay gauge per source, destination and table), and the slow one catches up once the
//!   delay is lifted;
//! * a receiver killed while a batch is half applied in its cluster, then restarted;
//! * a shipper killed with writes it has not shipped yet, then restarted on its data;
//! * tablets moved in both clusters (the master's move driver) while writes flow;
//! * a consistency token asked for while a server is down, just after it acknowledged a write
//!   it had not reported in etcd: no token (UNAVAILABLE), or one that is not consistent before
//!   that write reached the other cluster;
//! * a scale-in while the leaving server's last write, acknowledged just after its shipper
//!   reported itself caught up, is held by a slow peer: the server is kept;
//! * a token checked in both modes while a's calls into b are lost: `data_boost_read_local_writes` (each
//!   write in its own cluster) is consistent at once, `standard_read_remote_writes` only once
//!   the partition healed;
//! * a delete in one cluster, compacted past its grace while the other cluster's older write
//!   of the row is held by a partition: the tombstone stays until that write arrived (the row
//!   does not come back), then goes.
//! * a Cluster's removal while its writes cannot reach the other cluster: refused with the
//!   server, the entries and the peer named, also once its server stopped (the release path
//!   keeps it a replica); it goes once they are shipped, and the other cluster reads them.
//!
//! The tests run one at a time (about a minute in all).

mod in_process;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use basalt_master::model::{Tablet, TabletState};
use basalt_meta::Leadership;
use basalt_operator::lifecycle::records::{Replica, declare_replicas};
use basalt_operator::lifecycle::replication::{Pair, pairs};
use basalt_operator::master::moves::{self, Move, Outcome};
use basalt_operator::tablet_servers::{GrpcTabletControl, STATUS_DEADLINE};
use basalt_testkit::{MASTER, TestCluster, eventually};
use basalt_transport::Verdict;
use bytes::Bytes;
use googleapis_tonic_google_bigtable_admin_v2::google::bigtable::admin::v2 as admin;
use googleapis_tonic_google_bigtable_v2::google::bigtable::v2 as data;
use in_process::{Master, TABLE, admin_client, channel, create_table, table_name};
use tonic::transport::Channel;

/// Rows the writers of every cluster write (the same cell, at one timestamp): conflicts.
const SHARED_ROWS: u64 = 8;
/// How long the clusters may take to converge once the faults are over.
const CONVERGE: Duration = Duration::from_secs(30);

async fn tablets(cluster: &TestCluster, name: &str) -> Vec<Tablet> {
    let (map, _) = cluster.meta().tablets(name).await.unwrap();
    map.tablets(TABLE).to_vec()
}

/// Every tablet of `t` in every cluster is Serving and served by exactly its owner, at its
/// epoch (by the servers' control API).
async fn one_owner_each(cluster: &TestCluster) -> bool {
    let dialer = basalt_transport::Dialer::default();
    for name in cluster.clusters() {
        let map = tablets(cluster, &name).await;
        let mut served: BTreeMap<Bytes, Vec<(String, u64)>> = BTreeMap::new();
        for i in cluster.servers_of(&name) {
            if !cluster.is_running(i) {
                return false;
            }
            let Ok(mut client) =
                basalt_control::client(&dialer, cluster.address(i), Duration::from_secs(5))
            else {
                return false;
            };
            let Ok(status) = client
                .get_server_status(basalt_control::v1::GetServerStatusRequest {})
                .await
            else {
                return false;
            };
            for t in status
                .into_inner()
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
        let ok = map.len() == 2
            && map.len() == served.len()
            && map.iter().all(|t| {
                t.state == TabletState::Serving
                    && served.get(&t.range.start[..]).map(Vec::as_slice)
                        == Some(&[(t.owner.to_string(), t.epoch)][..])
            });
        if !ok {
            return false;
        }
    }
    true
}

/// The tests run one at a time (each runs several servers; the timings of the slow peer's
/// assume the machine is not shared with another of them).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The clusters of `layout` declared replicas by the operator's own function, then their
/// servers started; table `t` created and its tablets assigned in every cluster by the
/// operator's master (one per instance: it places the tablets of every cluster, and seeds the
/// clusters declared after the first), which then steps down (the tablet maps stay as they are
/// unless a test moves a tablet).
async fn setup(layout: &[(&str, usize)]) -> TestCluster {
    setup_with_grace(layout, None).await
}

/// [`setup`], the servers keeping tombstones for `grace` at least (the kit's default: an hour).
async fn setup_with_grace(layout: &[(&str, usize)], grace: Option<Duration>) -> TestCluster {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let mut cluster = TestCluster::configure(layout).await;
    if let Some(grace) = grace {
        cluster.set_tombstone_grace(grace);
    }
    let names: Vec<String> = layout.iter().map(|(c, _)| c.to_string()).collect();
    let replicas: Vec<Replica> = names.iter().map(Replica::named).collect();
    declare_replicas(cluster.meta(), &replicas).await.unwrap();
    cluster.start_all().await;
    let numbers = cluster.meta().cluster_numbers().await.unwrap();
    assert_eq!(numbers.keys().cloned().collect::<Vec<_>>(), {
        let mut sorted = names.clone();
        sorted.sort();
        sorted
    });

    let master = Master::start(&cluster);
    create_table(cluster.address(0)).await;
    eventually(
        Duration::from_secs(20),
        "t's tablets are assigned and served in every cluster",
        || one_owner_each(&cluster),
    )
    .await;
    // The clusters declared after the first are seeded by the master (an empty table here):
    // until then their tables are INITIALIZING and no token is consistent.
    eventually(
        Duration::from_secs(20),
        "every cluster seeded (no seed record left)",
        || async { cluster.meta().seeds().await.is_ok_and(|s| s.is_empty()) },
    )
    .await;
    master.stop().await;
    cluster
}

/// What one writer did.
#[derive(Debug, Default)]
struct Written {
    /// Its rows whose last acknowledged write is a SetCell: row → (timestamp, value).
    present: BTreeMap<Bytes, (i64, Bytes)>,
    /// Its rows whose last acknowledged write is a DeleteFromRow.
    deleted: BTreeSet<Bytes>,
    /// Its rows whose last write failed (it may or may not have been applied).
    unsure: BTreeSet<Bytes>,
    /// The values it wrote (or tried to) into the shared rows.
    shared: BTreeSet<Bytes>,
    /// The writes that failed: (row, status).
    errors: Vec<(Bytes, tonic::Status)>,
}

impl Written {
    /// What the writers did, for the test's output.
    fn report(&self) {
        eprintln!(
            "{} rows present, {} deleted, {} shared values; {} errors",
            self.present.len(),
            self.deleted.len(),
            self.shared.len(),
            self.errors.len()
        );
    }

    fn merge(&mut self, other: Written) {
        self.present.extend(other.present);
        self.deleted.extend(other.deleted);
        self.unsure.extend(other.unsure);
        self.shared.extend(other.shared);
        self.errors.extend(other.errors);
    }
}

/// The writers of a test: each a client of one server.
struct Writers {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<Written>>,
}

impl Writers {
    /// One writer per address of `addresses` (named `w<k>`).
    fn start(addresses: Vec<String>) -> Writers {
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = addresses
            .into_iter()
            .enumerate()
            .map(|(k, address)| tokio::spawn(write(k, address, stop.clone())))
            .collect();
        Writers { stop, tasks }
    }

    async fn stop(self) -> Written {
        self.stop.store(true, Ordering::SeqCst);
        let mut all = Written::default();
        for task in self.tasks {
            all.merge(task.await.unwrap());
        }
        all
    }
}

async fn mutate(
    client: &mut data::bigtable_client::BigtableClient<Channel>,
    row: &Bytes,
    mutation: data::mutation::Mutation,
) -> Result<(), tonic::Status> {
    let mut req = tonic::Request::new(data::MutateRowRequest {
        table_name: table_name(),
        row_key: row.clone(),
        mutations: vec![data::Mutation {
            mutation: Some(mutation),
        }],
        ..Default::default()
    });
    req.set_timeout(Duration::from_secs(5));
    client.mutate_row(req).await.map(|_| ())
}

fn set_cell(qualifier: &'static [u8], timestamp: i64, value: Bytes) -> data::mutation::Mutation {
    data::mutation::Mutation::SetCell(data::mutation::SetCell {
        family_name: "cf".into(),
        column_qualifier: Bytes::from_static(qualifier),
        timestamp_micros: timestamp,
        value,
    })
}

/// The value of `writer`'s write `n`: two writes in three longer than a change log entry
/// carries (logged by reference, read back from the data to be shipped), the third short.
fn value_of(writer: usize, n: u64) -> Bytes {
    let pad = if n.is_multiple_of(3) { 0 } else { 120 };
    Bytes::from(format!("w{writer}-{n}-{}", "v".repeat(pad)))
}

/// Writes through `address` until `stop`: rows `k<w>-<n>` and `x<w>-<n>` (both tablets), one
/// SetCell each at an explicit timestamp unique to the write; every seventh time a
/// DeleteFromRow of one of its rows written before; every fifth time a SetCell of the cell
/// (`cf:s`, timestamp 1000) of one of the [`SHARED_ROWS`] rows every writer writes.
async fn write(writer: usize, address: String, stop: Arc<AtomicBool>) -> Written {
    let mut client = data::bigtable_client::BigtableClient::new(channel(&address).await);
    let mut out = Written::default();
    let mut n = 0u64;
    while !stop.load(Ordering::SeqCst) {
        n += 1;
        let tablet = if n.is_multiple_of(2) { 'k' } else { 'x' };
        let row = Bytes::from(format!("{tablet}{writer}-{n:06}"));
        let value = value_of(writer, n);
        // Distinct per write across writers: the same timestamp must come back everywhere.
        let timestamp = ((writer as i64 + 1) * 1_000_000_000 + n as i64) * 1000;
        match mutate(&mut client, &row, set_cell(b"q", timestamp, value.clone())).await {
            Ok(()) => {
                out.present.insert(row, (timestamp, value));
            }
            Err(s) => {
                out.unsure.insert(row.clone());
                out.errors.push((row, s));
            }
        }
        if n.is_multiple_of(7) {
            // A row of this writer written a little earlier (same tablet: n - 4).
            let victim = Bytes::from(format!("{tablet}{writer}-{:06}", n - 4));
            let delete = data::mutation::Mutation::DeleteFromRow(data::mutation::DeleteFromRow {});
            match mutate(&mut client, &victim, delete).await {
                Ok(()) => {
                    out.present.remove(&victim);
                    out.unsure.remove(&victim);
                    out.deleted.insert(victim);
                }
                Err(s) => {
                    out.present.remove(&victim);
                    out.unsure.insert(victim.clone());
                    out.errors.push((victim, s));
                }
            }
        }
        if n.is_multiple_of(5) {
            let row = Bytes::from(format!("shared-{}", n / 5 % SHARED_ROWS));
            let value = value_of(writer, n);
            out.shared.insert(value.clone());
            if let Err(s) = mutate(&mut client, &row, set_cell(b"s", 1000, value)).await {
                out.errors.push((row, s));
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    out
}

/// One cell as a reader sees it: (family, qualifier, timestamp, value).
type Cell = (String, Bytes, i64, Bytes);

/// Every cell of the table through the server at `address`, by row.
async fn read_all(address: &str) -> BTreeMap<Bytes, Vec<Cell>> {
    let mut stream = data::bigtable_client::BigtableClient::new(channel(address).await)
        .read_rows(data::ReadRowsRequest {
            table_name: table_name(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut rows: BTreeMap<Bytes, Vec<Cell>> = BTreeMap::new();
    let (mut row, mut family, mut qualifier, mut timestamp) =
        (Bytes::new(), String::new(), Bytes::new(), 0i64);
    let mut value = Vec::new();
    while let Some(resp) = stream.message().await.unwrap() {
        for chunk in resp.chunks {
            if !chunk.row_key.is_empty() {
                row = chunk.row_key.clone();
            }
            if let Some(f) = chunk.family_name {
                family = f;
            }
            if let Some(q) = chunk.qualifier {
                qualifier = Bytes::from(q);
                timestamp = chunk.timestamp_micros;
            }
            value.extend_from_slice(&chunk.value);
            if chunk.value_size == 0 {
                rows.entry(row.clone()).or_default().push((
                    family.clone(),
                    qualifier.clone(),
                    timestamp,
                    Bytes::from(std::mem::take(&mut value)),
                ));
            }
        }
    }
    rows
}

/// A short digest of a table's cells (for the messages).
fn digest(rows: &BTreeMap<Bytes, Vec<Cell>>) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    rows.hash(&mut h);
    let cells: usize = rows.values().map(Vec::len).sum();
    format!(
        "{} rows, {cells} cells, digest {:016x}",
        rows.len(),
        h.finish()
    )
}

/// A consistency token made through `from` (after the writes), polled with CheckConsistency
/// through `check` until consistent; how long that took.
async fn wait_consistent(from: &str, check: &str) -> Duration {
    let started = Instant::now();
    let token = loop {
        // A server may still be restarting: the token asks every registered server.
        match admin_client(channel(from).await)
            .generate_consistency_token(admin::GenerateConsistencyTokenRequest {
                name: table_name(),
            })
            .await
        {
            Ok(r) => break r.into_inner().consistency_token,
            Err(s) => {
                assert!(
                    started.elapsed() < CONVERGE,
                    "no consistency token within {CONVERGE:?}: {s}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    let mut checker = admin_client(channel(check).await);
    loop {
        let consistent = checker
            .check_consistency(admin::CheckConsistencyRequest {
                name: table_name(),
                consistency_token: token.clone(),
                mode: None,
            })
            .await
            .unwrap()
            .into_inner()
            .consistent;
        if consistent {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < CONVERGE,
            "the clusters did not converge within {CONVERGE:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every server of every cluster reads the same cells, and they are what the writers
/// acknowledged: each acknowledged SetCell exactly once (one cell: its timestamp and value),
/// each acknowledged delete's row absent, the shared rows one value each (one of those
/// written).
async fn check_converged(cluster: &TestCluster, written: &Written) {
    let mut first: Option<(usize, BTreeMap<Bytes, Vec<Cell>>)> = None;
    for i in 0..cluster.len() {
        let rows = read_all(cluster.address(i)).await;
        eprintln!("through {}: {}", cluster.name(i), digest(&rows));
        for (row, (timestamp, value)) in &written.present {
            let expected = vec![(
                "cf".to_string(),
                Bytes::from_static(b"q"),
                *timestamp,
                value.clone(),
            )];
            assert_eq!(
                rows.get(row),
                Some(&expected),
                "acknowledged row {row:?} through {} (cluster {})",
                cluster.name(i),
                cluster.cluster_of(i)
            );
        }
        for row in &written.deleted {
            assert_eq!(
                rows.get(row),
                None,
                "deleted row {row:?} through {} (cluster {})",
                cluster.name(i),
                cluster.cluster_of(i)
            );
        }
        for (row, cells) in
            rows.range(Bytes::from_static(b"shared-")..Bytes::from_static(b"shared."))
        {
            assert_eq!(cells.len(), 1, "shared row {row:?}: {cells:?}");
            assert!(
                written.shared.contains(&cells[0].3),
                "shared row {row:?} holds a value nobody wrote: {cells:?}"
            );
        }
        // Nothing else: every row read is one the writers wrote.
        for row in rows.keys() {
            assert!(
                row.starts_with(b"shared-")
                    || written.present.contains_key(row)
                    || written.unsure.contains(row),
                "row {row:?} through {} was never acknowledged",
                cluster.name(i)
            );
        }
        match &first {
            None => first = Some((i, rows)),
            Some((j, expected)) => {
                if &rows != expected {
                    let differs = rows
                        .iter()
                        .zip(expected.iter())
                        .find(|(a, b)| a != b)
                        .map(|(a, b)| format!("{a:?} vs {b:?}"));
                    panic!(
                        "{} ({}) and {} ({}) differ: {}; first difference: {differs:?}",
                        cluster.name(i),
                        digest(&rows),
                        cluster.name(*j),
                        digest(expected),
                        if rows.len() == expected.len() {
                            "same rows"
                        } else {
                            "row counts"
                        }
                    );
                }
            }
        }
    }
    assert!(first.is_some(), "no server to read through");
}

/// The addresses of the servers of `clusters`, each as often as given (the writers' targets).
fn addresses(cluster: &TestCluster, clusters: &[&str]) -> Vec<String> {
    clusters
        .iter()
        .flat_map(|c| cluster.servers_of(c))
        .map(|i| cluster.address(i).to_string())
        .collect()
}

fn assert_no_errors(written: &Written) {
    assert!(
        written.errors.is_empty(),
        "{} writes failed, e.g. {:?}",
        written.errors.len(),
        written.errors.iter().take(3).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partition_between_two_clusters_heals_and_they_converge() {
    let _serial = SERIAL.lock().await;
    let started = Instant::now();
    let cluster = setup(&[("a", 2), ("b", 2)]).await;
    // Four writers, one per server: two clients of each cluster.
    let writers = Writers::start(addresses(&cluster, &["a", "b"]));
    tokio::time::sleep(Duration::from_secs(2)).await;

    cluster.partition_clusters("a", "b");
    tokio::time::sleep(Duration::from_secs(4)).await;
    // While partitioned each cluster takes writes but does not see the other's new ones.
    let a = read_all(cluster.address(0)).await;
    let b = read_all(cluster.address(2)).await;
    assert_ne!(a, b, "the partition separated the clusters");
    cluster.heal();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let written = writers.stop().await;
    written.report();
    // The partition is between the clusters: every client reached its own cluster.
    assert_no_errors(&written);
    assert!(written.present.len() > 200, "the writers wrote throughout");
    assert!(!written.deleted.is_empty());

    let took = wait_consistent(cluster.address(0), cluster.address(3)).await;
    eprintln!("consistent {took:?} after the writers stopped");
    check_converged(&cluster, &written).await;
    eprintln!("the test took {:?}", started.elapsed());
}

/// The cells of `row` through the server at `address` (none: the row is not there).
async fn read_row(address: &str, row: &[u8]) -> Vec<Cell> {
    read_all(address).await.remove(row).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_cut_off_from_two_others_catches_up_and_they_keep_replicating() {
    let _serial = SERIAL.lock().await;
    let started = Instant::now();
    let cluster = setup(&[("a", 1), ("b", 1), ("c", 1)]).await;
    let [a, b, c] = [0, 1, 2].map(|i| cluster.address(i).to_string());
    assert_eq!(
        [0, 1, 2].map(|i| cluster.cluster_of(i).to_string()),
        ["a", "b", "c"]
    );
    let writers = Writers::start(addresses(&cluster, &["a", "b", "c"]));
    tokio::time::sleep(Duration::from_secs(2)).await;

    // c is cut off from both others; a and b still reach each other.
    cluster.partition_clusters("a", "c");
    cluster.partition_clusters("b", "c");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut client = data::bigtable_client::BigtableClient::new(channel(&a).await);
    let probe = Bytes::from_static(b"probe-during-cut");
    mutate(
        &mut client,
        &probe,
        set_cell(b"q", 5_000, Bytes::from_static(b"from a")),
    )
    .await
    .expect("a takes writes while c is cut off");
    eventually(
        Duration::from_secs(10),
        "a's write made during the cut reaches b",
        || async { !read_row(&b, &probe).await.is_empty() },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        read_row(&c, &probe).await.is_empty(),
        "c, cut off, reads a's write made during the cut"
    );
    cluster.heal();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let written = writers.stop().await;
    written.report();
    // The cut is between clusters: every client reached its own.
    assert_no_errors(&written);
    assert!(written.present.len() > 200, "the writers wrote throughout");

    // Checked through the cluster that was cut off, the token made through another.
    let took = wait_consistent(&b, &c).await;
    eprintln!("consistent {took:?} after the writers stopped");
    for address in [&a, &b, &c] {
        assert_eq!(
            read_row(address, &probe).await,
            vec![(
                "cf".to_string(),
                Bytes::from_static(b"q"),
                5_000,
                Bytes::from_static(b"from a")
            )],
            "the probe through {address}"
        );
    }
    let mut written = written;
    written
        .present
        .insert(probe, (5_000, Bytes::from_static(b"from a")));
    check_converged(&cluster, &written).await;
    eprintln!("the test took {:?}", started.elapsed());
}

/// The value of the series of `name` with exactly `labels` and `table` (its label `table`) in
/// server `i`'s `/metrics`.
async fn metric(
    cluster: &TestCluster,
    i: usize,
    name: &str,
    labels: &[(&str, &str)],
    table: &str,
) -> Option<f64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(cluster.http_address(i))
        .await
        .unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).await.unwrap();
    let mut want: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    want.push(format!("table=\"{table}\""));
    text.lines().find_map(|line| {
        let (series, value) = line.rsplit_once(' ')?;
        let inner = series
            .strip_prefix(name)?
            .strip_prefix('{')?
            .strip_suffix('}')?;
        // The asked labels, besides the server's own (basalt_cluster, …).
        let have: Vec<&str> = inner
            .split(',')
            .filter(|l| !l.starts_with("basalt_"))
            .collect();
        let found = want.len() == have.len() && want.iter().all(|w| have.contains(&w.as_str()));
        found.then(|| value.parse().ok()).flatten()
    })
}

/// The pairs of clusters as the Instance's status shows them, from etcd's `shipped/`.
async fn replication_pairs(cluster: &TestCluster) -> Vec<Pair> {
    let shipped = cluster.meta().shipped().await.unwrap();
    pairs(&cluster.clusters(), &shipped, now_micros())
}

fn now_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}

fn pair<'a>(pairs: &'a [Pair], source: &str, destination: &str) -> &'a Pair {
    pairs
        .iter()
        .find(|p| p.source == source && p.destination == destination)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_peer_delays_only_itself_and_catches_up() {
    let _serial = SERIAL.lock().await;
    let started = Instant::now();
    let cluster = setup(&[("a", 1), ("b", 1), ("c", 1)]).await;
    let (a, b, c) = (
        cluster.address(0).to_string(),
        cluster.address(1).to_string(),
        cluster.address(2).to_string(),
    );
    // Every call of a's server into c waits 4 s (each write on the connection).
    const DELAY: Duration = Duration::from_secs(4);
    cluster.set_between("a", "c", Verdict::Delay(DELAY));
    let writers = Writers::start(vec![a.clone(), a.clone()]);
    tokio::time::sleep(Duration::from_secs(1)).await;

    // For 6 s, the pairs a → b and a → c as etcd's shipped records say.
    let (mut worst_b, mut worst_c) = (0f64, 0f64);
    let watch = Instant::now();
    while watch.elapsed() < Duration::from_secs(6) {
        let p = replication_pairs(&cluster).await;
        worst_b = worst_b.max(pair(&p, "a", "b").max_delay_seconds);
        worst_c = worst_c.max(pair(&p, "a", "c").max_delay_seconds);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("the longest delays seen: a → b {worst_b:.2} s, a → c {worst_c:.2} s");
    assert!(worst_b < 2.0, "a → b stays close: {worst_b:.2} s");
    assert!(worst_c > 3.0, "a → c falls behind: {worst_c:.2} s");
    // The server's own metrics say the same per (source, destination, table).
    let delay = |peer: &'static str| {
        let cluster = &cluster;
        async move {
            let labels = [("peer_cluster", peer), ("source_cluster", "a")];
            let name = table_name();
            metric(
                cluster,
                0,
                "basalt_replication_max_delay_seconds",
                &labels,
                &name,
            )
            .await
            .unwrap_or_else(|| panic!("a delay towards {peer} for table t"))
        }
    };
    let (to_b, to_c) = (delay("b").await, delay("c").await);
    eprintln!("a's max delay gauges for table t: to b {to_b:.2} s, to c {to_c:.2} s");
    assert!(
        to_b < 2.0 && to_c > 2.0,
        "to b {to_b:.2} s, to c {to_c:.2} s"
    );

    // What a user sees: a row written through a shows in b at once, not yet in c.
    let marker = Bytes::from_static(b"marker");
    let mut client = data::bigtable_client::BigtableClient::new(channel(&a).await);
    mutate(
        &mut client,
        &marker,
        set_cell(b"q", 1000, Bytes::from_static(b"m")),
    )
    .await
    .unwrap();
    let written_at = Instant::now();
    eventually(Duration::from_secs(2), "the marker reaches b", || async {
        read_all(&b).await.contains_key(&marker)
    })
    .await;
    let in_b = written_at.elapsed();
    assert!(
        !read_all(&c).await.contains_key(&marker),
        "the marker reached c through a {DELAY:?} delay within {in_b:?}"
    );
    eprintln!("the marker was in b after {in_b:?}, not in c");

    let mut written = writers.stop().await;
    written
        .present
        .insert(marker, (1000, Bytes::from_static(b"m")));
    assert_no_errors(&written);
    // The delay lifted, c catches up.
    cluster.heal();
    let took = wait_consistent(&a, &c).await;
    eprintln!("consistent {took:?} after the delay was lifted");
    check_converged(&cluster, &written).await;
    let p = replication_pairs(&cluster).await;
    for destination in ["b", "c"] {
        assert_eq!(pair(&p, "a", destination).pending_entries, 0, "{p:?}");
    }
    eprintln!("the test took {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_receiver_killed_mid_batch_restarts_and_nothing_is_lost() {
    let _serial = SERIAL.lock().await;
    let started = Instant::now();
    let mut cluster = setup(&[("a", 2), ("b", 2)]).await;
    // b0: the owner in b of the tablet [, m) (it is killed), b1 the other server of b.
    let (_, b0, b1) = first_tablet(&cluster, "b").await;
    let writers = Writers::start(addresses(&cluster, &["a"]));
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Within b, routing a batch's rows to their owner takes a second: a batch that reaches
    // a server of b is applied there for its own rows and waits for the others.
    cluster.set(cluster.name(b0), b1, Verdict::Delay(Duration::from_secs(1)));
    cluster.set(cluster.name(b1), b0, Verdict::Delay(Duration::from_secs(1)));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    cluster.kill(b0).await;
    // Meanwhile a's writes wait for b: the rows of the killed server's tablet cannot be applied.
    let mut pending = 0;
    let down = Instant::now();
    while down.elapsed() < Duration::from_secs(3) {
        let p = replication_pairs(&cluster).await;
        pending = pending.max(pair(&p, "a", "b").pending_entries);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        pending > 0,
        "a's shipping to b waited for the killed server"
    );
    cluster.heal();
    cluster.start_server(b0).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let written = writers.stop().await;
    // The clients write to a, whose servers all ran.
    assert_no_errors(&written);

    let took = wait_consistent(cluster.address(0), cluster.address(b0)).await;
    eprintln!("consistent {took:?} after the writers stopped");
    check_converged(&cluster, &written).await;
    eprintln!("the test took {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_shipper_killed_with_writes_not_shipped_restarts_and_ships_them() {
    let _serial = SERIAL.lock().await;
    let started = Instant::now();
    let mut cluster = setup(&[("a", 2), ("b", 2)]).await;
    // a0: the owner in a of the tablet [, m): the writes it logs are its own to ship.
    let (_, a0, _) = first_tablet(&cluster, "a").await;
    let writers = Writers::start(addresses(&cluster, &["a"]));
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Partitioned, a's servers hold their writes for b in their logs.
    cluster.partition_clusters("a", "b");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let written = writers.stop().await;
    assert_no_errors(&written);
    // The owner crashes with entries b has not acknowledged; the partition ends while it is down.
    cluster.kill(a0).await;
    cluster.heal();
    let b = cluster.address(cluster.servers_of("b")[0]).to_string();
    eventually(
        Duration::from_secs(10),
        "the other server of a shipped its writes to b",
        || async {
            // Only the killed server's entries are pending.
            let shipped = cluster.meta().shipped().await.unwrap();
            shipped
                .iter()
                .filter(|r| r.peer == "b" && r.store_id != cluster.store_id(a0))
                .all(|r| r.acked_seq == r.logged_seq)
        },
    )
    .await;
    let rows = read_all(&b).await;
    let missing = written
        .present
        .keys()
        .filter(|r| !rows.contains_key(*r))
        .count();
    eprintln!("with the owner down, b lacks {missing} acknowledged rows");
    assert!(
        missing > 0,
        "the killed server held writes b had not received"
    );

    cluster.start_server(a0).await;
    let took = wait_consistent(cluster.address(a0), &b).await;
    eprintln!("consistent {took:?} after the owner restarted");
    check_converged(&cluster, &written).await;
    eprintln!("the test took {:?}", started.elapsed());
}

/// The tablet [, m) of `name`: its record, its owner and the other server of the cluster.
async fn first_tablet(cluster: &TestCluster, name: &str) -> (Tablet, usize, usize) {
    let tablet = tablets(cluster, name)
        .await
        .into_iter()
        .find(|t| t.range.start.is_empty())
        .unwrap();
    let source = cluster.index_of(tablet.owner.as_str()).unwrap();
    let other = *cluster
        .servers_of(name)
        .iter()
        .find(|i| **i != source)
        .unwrap();
    (tablet, source, other)
}

async fn move_first_tablet(cluster: &TestCluster, leadership: &Leadership, name: &str) {
    let (tablet, from, to) = first_tablet(cluster, name).await;
    let dialer = GrpcTabletControl::new(cluster.dialer(MASTER), STATUS_DEADLINE);
    let the_move = Move {
        cluster: name.into(),
        table_name: table_name(),
        tablet: tablet.clone(),
        to: cluster.store_id(to).to_string(),
        from_address: cluster.address(from).to_string(),
        to_address: cluster.address(to).to_string(),
        reason: "balance".into(),
        rate_limit_bytes_per_sec: 0,
    };
    let outcome = moves::run(cluster.meta(), &leadership.term, &dialer, &the_move).await;
    assert!(
        matches!(outcome, Outcome::Moved(_)),
        "the move in cluster {name}: {outcome:?}"
    );
    let moved = tablets(cluster, name)
        .await
        .into_iter()
        .find(|t| t.range.start.is_empty())
        .unwrap();
    assert_eq!(moved.owner.as_str(), cluster.store_id(to));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tablets_moved_in_both_clusters_while_writes_flow_lose_nothing() {
    let _serial = SERIAL.lock().await;
    let started = Instant::now();
    let cluster = setup(&[("a", 2), ("b", 2)]).await;
    let leadership = cluster
        .meta()
        .campaign("the-test", Duration::from_secs(10))
        .await
        .unwrap();
    let writers = Writers::start(addresses(&cluster, &["a", "b"]));
    tokio::time::sleep(Duration::from_secs(1)).await;
    // A tablet of the shipping side moves (its writes are logged by one server, then by the
    // other) while the clusters are cut off from each other: its source gives the tablet up
    // with writes to it not yet shipped, whose values (logged by reference) it must still
    // send once the partition heals. Then one of the receiving side moves (rows routed to an
    // owner that changes).
    cluster.partition_clusters("a", "b");
    tokio::time::sleep(Duration::from_secs(1)).await;
    move_first_tablet(&cluster, &leadership, "a").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    cluster.heal();
    move_first_tablet(&cluster, &leadership, "b").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let written = writers.stop().await;
    // A write that reached a moving tablet's source while it was fenced may fail: those are
    // the only errors a client sees.
    for (row, status) in &written.errors {
        assert!(
            matches!(
                status.code(),
                tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Aborted
            ),
            "row {row:?}: {status:?}"
        );
    }
    eprintln!(
        "{} rows present, {} errors",
        written.present.len(),
        written.errors.len()
    );
    eventually(
        Duration::from_secs(10),
        "every tablet has one owner",
        || one_owner_each(&cluster),
    )
    .await;
    let took = wait_consistent(cluster.address(0), cluster.address(3)).await;
    eprintln!("consistent {took:?} after the writers stopped");
    check_converged(&cluster, &written).await;
    drop(leadership);
    eprintln!("the test took {:?}", started.elapsed());
}

/// Whether a consistency token made now (through `from`) is reported consistent through
/// `check` within `within`; Err when no token could be made.
async fn token_turns_consistent(
    from: &str,
    check: &str,
    within: Duration,
) -> Result<bool, tonic::Status> {
    let token = admin_client(channel(from).await)
        .generate_consistency_token(admin::GenerateConsistencyTokenRequest { name: table_name() })
        .await?
        .into_inner()
        .consistency_token;
    let mut checker = admin_client(channel(check).await);
    let started = Instant::now();
    while started.elapsed() < within {
        if checker
            .check_consistency(admin::CheckConsistencyRequest {
                name: table_name(),
                consistency_token: token.clone(),
                mode: None,
            })
            .await?
            .into_inner()
            .consistent
        {
            return Ok(true);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(false)
}

/// The record of how far `store`'s log reached cluster `peer`.
async fn shipped_record(
    cluster: &TestCluster,
    store: &str,
    peer: &str,
) -> Option<basalt_meta::ShippedRecord> {
    cluster
        .meta()
        .shipped()
        .await
        .unwrap()
        .into_iter()
        .find(|r| r.store_id == store && r.peer == peer)
}

/// Waits for an idle heartbeat of `store`'s shipper to cluster b saying b has its whole log,
/// then at once writes `row` (cf:q at 1000, "w") through `client` (a client of `store`'s
/// server, which owns the row). The shipper reported at most every 100 ms and only between
/// batches: this write came after a report that claimed the log shipped, before the next.
async fn write_after_heartbeat(
    cluster: &TestCluster,
    store: &str,
    client: &mut data::bigtable_client::BigtableClient<Channel>,
    row: &Bytes,
) {
    let before = shipped_record(cluster, store, "b").await.unwrap();
    let heartbeat = loop {
        let r = shipped_record(cluster, store, "b").await.unwrap();
        if r.reported_micros != before.reported_micros && r.acked_seq == r.logged_seq {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    mutate(client, row, set_cell(b"q", 1000, Bytes::from_static(b"w")))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = shipped_record(cluster, store, "b").await.unwrap();
    eprintln!(
        "after the write, the shipper's report {}",
        if after.logged_seq == heartbeat.logged_seq {
            "still claims b has its whole log"
        } else {
            "shows it pending"
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_token_made_while_a_server_is_down_covers_the_writes_it_acknowledged() {
    let _serial = SERIAL.lock().await;
    let started = Instant::now();
    let mut cluster = setup(&[("a", 2), ("b", 1)]).await;
    // The owner in a of the tablet [, m) takes the writes; the other server of a makes the
    // token.
    let (_, owner, other) = first_tablet(&cluster, "a").await;
    let store = cluster.store_id(owner).to_string();
    let b = cluster.address(cluster.servers_of("b")[0]).to_string();
    let mut client =
        data::bigtable_client::BigtableClient::new(channel(cluster.address(owner)).await);
    let mut written = Written::default();
    let first = Bytes::from_static(b"k-first");
    mutate(
        &mut client,
        &first,
        set_cell(b"q", 1000, Bytes::from_static(b"1")),
    )
    .await
    .unwrap();
    written
        .present
        .insert(first, (1000, Bytes::from_static(b"1")));
    wait_consistent(cluster.address(other), &b).await;

    // A write acknowledged right after the owner's shipper reported itself caught up (an
    // idle heartbeat, every 2 s), while a is partitioned from b: its batch hangs.
    cluster.partition_clusters("a", "b");
    let row = Bytes::from_static(b"k-window");
    write_after_heartbeat(&cluster, &store, &mut client, &row).await;
    written
        .present
        .insert(row.clone(), (1000, Bytes::from_static(b"w")));
    // The owner crashes; the partition ends; its registration expires.
    cluster.kill(owner).await;
    cluster.heal();
    eventually(
        Duration::from_secs(15),
        "the owner's registration expired",
        || async {
            let (servers, _) = cluster.meta().servers(Some("a")).await.unwrap();
            servers.iter().all(|s| s.record.store_id != store)
        },
    )
    .await;
    assert!(
        !read_all(&b).await.contains_key(&row),
        "{row:?} reached b before its server crashed"
    );
    // A token made now covers that acknowledged write: it may not be made (UNAVAILABLE: try
    // again), but it must not turn consistent while the write cannot reach b.
    match token_turns_consistent(cluster.address(other), &b, Duration::from_secs(3)).await {
        Ok(consistent) => assert!(
            !consistent,
            "a token made after {row:?} was acknowledged turned consistent while it is missing \
             in b (its server is down)"
        ),
        Err(status) => {
            eprintln!("no token while the owner is down: {status:?}");
            assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        }
    }
    cluster.start_server(owner).await;
    let took = wait_consistent(cluster.address(other), &b).await;
    eprintln!("consistent {took:?} after the owner restarted");
    check_converged(&cluster, &written).await;
    eprintln!("the test took {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_scale_in_keeps_a_server_whose_last_write_is_still_shipping() {
    use basalt_operator::lifecycle::scale::scale_in_floor;
    use basalt_operator::lifecycle::view::{Placement, ServerBook, observe};
    let _serial = SERIAL.lock().await;
    let started = Instant::now();
    let cluster = setup(&[("a", 2), ("b", 1)]).await;
    let leadership = cluster
        .meta()
        .campaign("the-test", Duration::from_secs(10))
        .await
        .unwrap();
    // a-1 (the highest ordinal: the one a scale-in to one server removes) owns [, m).
    let (a0, a1) = (cluster.servers_of("a")[0], cluster.servers_of("a")[1]);
    let (_, owner, _) = first_tablet(&cluster, "a").await;
    if owner != a1 {
        move_first_tablet(&cluster, &leadership, "a").await;
    }
    let store = cluster.store_id(a1).to_string();
    let b = cluster.address(cluster.servers_of("b")[0]).to_string();
    let mut client = data::bigtable_client::BigtableClient::new(channel(cluster.address(a1)).await);
    let mut written = Written::default();

    // A write acknowledged by a-1 right after its shipper reported itself caught up (an idle
    // heartbeat, every 2 s), while b has become slow (every call into it waits 10 s): the
    // batch carrying it hangs.
    cluster.set_between("a", "b", Verdict::Delay(Duration::from_secs(10)));
    let row = Bytes::from_static(b"k-last");
    write_after_heartbeat(&cluster, &store, &mut client, &row).await;
    written
        .present
        .insert(row.clone(), (1000, Bytes::from_static(b"w")));
    // The scale-in's drain: a-1's tablets move to a-0.
    for t in tablets(&cluster, "a").await {
        if t.owner == store {
            let dialer = GrpcTabletControl::new(cluster.dialer(MASTER), STATUS_DEADLINE);
            let the_move = Move {
                cluster: "a".into(),
                table_name: table_name(),
                tablet: t.clone(),
                to: cluster.store_id(a0).to_string(),
                from_address: cluster.address(a1).to_string(),
                to_address: cluster.address(a0).to_string(),
                reason: "drain".into(),
                rate_limit_bytes_per_sec: 0,
            };
            let outcome = moves::run(cluster.meta(), &leadership.term, &dialer, &the_move).await;
            assert!(matches!(outcome, Outcome::Moved(_)), "{outcome:?}");
        }
    }
    assert!(
        !read_all(&b).await.contains_key(&row),
        "{row:?} reached b through the delay"
    );
    // What the runtimes decide a scale-in to one server may stop: a-1 holds a write b has not
    // received, so it must stay.
    let observed = observe(cluster.meta(), "a", &mut ServerBook::default())
        .await
        .unwrap();
    let (floor, why) = scale_in_floor(Some(2), Some(&Placement::from(observed)));
    assert_eq!(
        floor, 2,
        "a scale-in may stop a-1 ({why:?}) while {row:?}, which it acknowledged, has not \
         reached b"
    );
    eprintln!("a-1 is kept: {why}");
    cluster.heal();
    let took = wait_consistent(cluster.address(a0), &b).await;
    eprintln!("consistent {took:?} after the delay was lifted");
    check_converged(&cluster, &written).await;
    drop(leadership);
    eprintln!("the test took {:?}", started.elapsed());
}

/// The row tombstones of `row` as server `i` stores them (what a seed of its range would
/// copy), by version: read through its `Replication.ReadSeed`.
async fn row_tombstones(
    cluster: &TestCluster,
    i: usize,
    row: &Bytes,
) -> Vec<basalt_master::model::hlc::Version> {
    let mut client = basalt_control::replication_client(
        &basalt_transport::Dialer::default(),
        cluster.address(i),
        Duration::from_secs(5),
    )
    .unwrap();
    let mut end = row.to_vec();
    end.push(0);
    let chunk = client
        .read_seed(basalt_control::v1::ReadSeedRequest {
            table: TABLE.into(),
            start_key: row.clone(),
            end_key: Bytes::from(end),
            max_bytes: 0,
        })
        .await
        .unwrap()
        .into_inner();
    chunk
        .rows
        .iter()
        .map(|r| basalt_tablet_server::cluster::replication::decode_row(r).unwrap())
        .filter(|r| {
            matches!(
                r.row.mutations[..],
                [basalt_master::model::Mutation::DeleteFromRow]
            )
        })
        .map(|r| r.first)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tombstone_outlives_its_grace_until_the_peer_acknowledged_past_it() {
    let _serial = SERIAL.lock().await;
    let started = Instant::now();
    // Tombstones are past their grace after 100 ms: only the safe point can keep them.
    let cluster = setup_with_grace(&[("a", 1), ("b", 1)], Some(Duration::from_millis(100))).await;
    let (a, b) = (
        cluster.address(0).to_string(),
        cluster.address(1).to_string(),
    );
    let mut client_a = data::bigtable_client::BigtableClient::new(channel(&a).await);
    let mut client_b = data::bigtable_client::BigtableClient::new(channel(&b).await);
    let row = Bytes::from_static(b"k-deleted");
    mutate(
        &mut client_a,
        &row,
        set_cell(b"q", 1000, Bytes::from_static(b"first")),
    )
    .await
    .unwrap();
    wait_consistent(&a, &b).await;

    // Partitioned: a writes a cell of the row that it cannot ship; then b deletes the row (a
    // later version: the delete hides that cell wherever both are).
    cluster.partition_clusters("a", "b");
    mutate(
        &mut client_a,
        &row,
        set_cell(b"late", 2000, Bytes::from_static(b"late")),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let delete = data::mutation::Mutation::DeleteFromRow(data::mutation::DeleteFromRow {});
    mutate(&mut client_b, &row, delete).await.unwrap();
    let deleted = row_tombstones(&cluster, 1, &row).await;
    assert_eq!(deleted.len(), 1, "b stores the delete's tombstone");
    let deleted = deleted[0];

    // b knows how far a acknowledged: not past the delete (a's write waits). The tombstone
    // passes its grace, and b compacts everything.
    eventually(
        Duration::from_secs(10),
        "b computed its replication safe point",
        || async { cluster.tombstone_safe_point(1).is_some_and(|p| p > 0) },
    )
    .await;
    let point = cluster.tombstone_safe_point(1).unwrap();
    assert!(
        point < deleted.hlc,
        "b's safe point {point} passed the delete at {deleted:?}"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    cluster.compact(1).await;

    // Healed, a's older write reaches b: it must stay hidden there, as in a.
    cluster.heal();
    let took = wait_consistent(&a, &b).await;
    eprintln!("consistent {took:?} after the heal");
    let (in_a, in_b) = (read_all(&a).await, read_all(&b).await);
    assert_eq!(in_a.get(&row), None, "the delete holds in a");
    assert_eq!(
        in_b.get(&row),
        None,
        "the row came back in b: its tombstone was collected before a's older write arrived"
    );
    assert_eq!(in_a, in_b);

    // Once a acknowledged past the delete, the tombstone goes at b's next compaction.
    eventually(
        Duration::from_secs(15),
        "b's safe point passed the delete",
        || async {
            cluster
                .tombstone_safe_point(1)
                .is_some_and(|p| p > deleted.hlc)
        },
    )
    .await;
    cluster.compact(1).await;
    assert_eq!(row_tombstones(&cluster, 1, &row).await, vec![], "collected");
    assert_eq!(read_all(&b).await.get(&row), None);
    eprintln!("the test took {:?}", started.elapsed());
}

/// CheckConsistency of `token` through `address` in `mode` (None: the default).
async fn consistent_in(
    address: &str,
    token: &str,
    mode: Option<admin::check_consistency_request::Mode>,
) -> bool {
    admin_client(channel(address).await)
        .check_consistency(admin::CheckConsistencyRequest {
            name: table_name(),
            consistency_token: token.to_string(),
            mode,
        })
        .await
        .unwrap()
        .into_inner()
        .consistent
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn data_boost_consistency_asks_only_for_local_writes() {
    use admin::check_consistency_request::Mode;
    let _serial = SERIAL.lock().await;
    let started = Instant::now();
    let cluster = setup(&[("a", 1), ("b", 1)]).await;
    let (a, b) = (
        cluster.address(0).to_string(),
        cluster.address(1).to_string(),
    );
    // A write through a that cannot reach b: a's calls into b are lost (one way: the token,
    // made through b, asks a's server for its log position).
    cluster.set_between("a", "b", Verdict::BlackHole);
    let row = Bytes::from_static(b"k-local");
    let mut client = data::bigtable_client::BigtableClient::new(channel(&a).await);
    mutate(
        &mut client,
        &row,
        set_cell(b"q", 1000, Bytes::from_static(b"v")),
    )
    .await
    .unwrap();
    let token = admin_client(channel(&b).await)
        .generate_consistency_token(admin::GenerateConsistencyTokenRequest { name: table_name() })
        .await
        .unwrap()
        .into_inner()
        .consistency_token;
    let standard = Some(Mode::StandardReadRemoteWrites(
        admin::StandardReadRemoteWrites {},
    ));
    let data_boost = Some(Mode::DataBoostReadLocalWrites(
        admin::DataBoostReadLocalWrites {},
    ));
    // Reads in a see the write (it was made there): consistent for Data Boost, through any
    // cluster. Reads in b do not: not consistent in the default mode, named or not.
    assert!(read_all(&a).await.contains_key(&row));
    for through in [&a, &b] {
        assert!(
            consistent_in(through, &token, data_boost).await,
            "data boost through {through}"
        );
        assert!(
            !consistent_in(through, &token, None).await,
            "default through {through}"
        );
        assert!(
            !consistent_in(through, &token, standard).await,
            "standard through {through}"
        );
    }
    assert!(!read_all(&b).await.contains_key(&row));
    // Once a reaches b again, the write arrives: consistent in the default mode too.
    cluster.heal();
    eventually(
        Duration::from_secs(30),
        "the token turns consistent",
        || async { consistent_in(&b, &token, standard).await },
    )
    .await;
    assert!(read_all(&b).await.contains_key(&row));
    eprintln!("the test took {:?}", started.elapsed());
}
/// The removal decision (`lifecycle::removal`, what both runtimes decide a Cluster's removal
/// on) for cluster `b`, with `a` staying and writes routed away from `b` since `since`.
async fn removal_of_b(
    cluster: &TestCluster,
    since: i64,
) -> Result<(), basalt_operator::lifecycle::removal::Refused> {
    use basalt_operator::lifecycle::removal::{decide, observe};
    let facts = observe(cluster.meta(), "b").await.unwrap();
    decide(&facts, &["a".to_string()], Some(since), false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_removal_is_refused_while_the_cluster_holds_writes_no_other_has() {
    use basalt_operator::lifecycle::removal::Holding;
    let _serial = SERIAL.lock().await;
    let started = Instant::now();
    let mut cluster = setup(&[("a", 1), ("b", 1)]).await;
    let b0 = cluster.servers_of("b")[0];
    // b takes writes, the last ones while a is unreachable from it.
    let writers = Writers::start(addresses(&cluster, &["b"]));
    tokio::time::sleep(Duration::from_millis(500)).await;
    cluster.partition_clusters("a", "b");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let written = writers.stop().await;
    assert_no_errors(&written);
    // The removal begins: no more writes reach b from now on.
    let since = basalt_master::model::hlc::now_micros();
    // Refused, with the reason a condition shows, once b's server has reported since.
    let refused = eventually_value(
        Duration::from_secs(10),
        "a refusal naming the entries",
        || async {
            match removal_of_b(&cluster, since).await {
                Err(r) if matches!(r.held[0].why, Holding::Unshipped { .. }) => Some(r),
                _ => None,
            }
        },
    )
    .await;
    eprintln!("refused: {refused}");
    let message = refused.to_string();
    assert!(refused.entries() > 0, "{message}");
    assert!(
        message.contains(cluster.name(b0)) && message.contains("to a)"),
        "{message}"
    );
    // b's server stops while a is unreachable: it cannot ship the rest, and the runtimes'
    // release path (declare_replicas with b left out) keeps b a replica.
    cluster.stop(b0).await;
    declare_replicas(cluster.meta(), &[Replica::named("a")])
        .await
        .unwrap();
    assert!(
        cluster
            .meta()
            .cluster_numbers()
            .await
            .unwrap()
            .contains_key("b"),
        "b was released with writes a does not have"
    );
    // The partition heals and b's server runs again: it ships, the removal may go.
    cluster.heal();
    cluster.start_server(b0).await;
    let since = basalt_master::model::hlc::now_micros();
    eventually(Duration::from_secs(20), "the removal may go", || async {
        removal_of_b(&cluster, since).await.is_ok()
    })
    .await;
    cluster.stop(b0).await;
    declare_replicas(cluster.meta(), &[Replica::named("a")])
        .await
        .unwrap();
    let numbers = cluster.meta().cluster_numbers().await.unwrap();
    assert_eq!(numbers.keys().collect::<Vec<_>>(), ["a"]);
    // Every write b acknowledged reads back through a.
    let rows = read_all(cluster.address(cluster.servers_of("a")[0])).await;
    let missing: Vec<_> = written
        .present
        .keys()
        .filter(|r| !rows.contains_key(*r))
        .collect();
    assert!(
        missing.is_empty(),
        "a lacks {} rows b acknowledged, e.g. {:?}",
        missing.len(),
        missing.first()
    );
    eprintln!("the test took {:?}", started.elapsed());
}

/// Polls `f` every 100 ms until it gives a value, for at most `within`.
async fn eventually_value<T, F, Fut>(within: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
