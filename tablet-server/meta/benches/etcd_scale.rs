//! etcd at scale (issue 30), against a real etcd (Debian's, started like every test's by
//! `basalt-test-etcd`): the tablet map of a big cluster written in Basalt's layout
//! (`clusters/<c>/tablets/<table>/<end>`, one record per tablet), the registrations of its
//! servers bound to leases and renewed as `Meta::register` renews them, then
//!
//! * the database's size and the rate the records were written at;
//! * a frontend's cold load of the whole map (`Meta::tablets`, what every server does at start);
//! * one ownership change fanned out to many watchers of the instance's prefix (what every
//!   server's catalog mirror watches): the delay until each watcher has it (p50, p99, max);
//! * etcd's CPU (seconds of CPU per second of wall clock) while the leases are renewed, and
//!   during the fan-out.
//!
//! Not a criterion benchmark: each figure is one long measurement.
//!
//! ```sh
//! cargo bench -p basalt-meta --bench etcd_scale        # 100,000 tablets, 1,000 servers, 1,000 watchers
//! BASALT_SCALE_TABLETS=1000000 cargo bench -p basalt-meta --bench etcd_scale
//! ```
//! Also `BASALT_SCALE_SERVERS`, `BASALT_SCALE_WATCHERS`, `BASALT_SCALE_CHANGES` (ownership
//! changes fanned out, default 20).

use std::sync::Arc;
use std::time::{Duration, Instant};

use basalt_meta::keys::Keys;
use basalt_meta::records::encode_tablet;
use basalt_meta::{
    LeaseTiming, Meta, Registration, Security, ServerRecord, TabletFollower, endpoints,
};
use basalt_model::{RowRange, Tablet, TabletState};
use basalt_test_etcd::Etcd;
use bytes::Bytes;
use etcd_client::{Client, StatusResponse, Txn, TxnOp};
use tokio::sync::mpsc;

const CLUSTER: &str = "c1";
const MIB: f64 = (1 << 20) as f64;

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let tablets = setting("BASALT_SCALE_TABLETS", 100_000);
    let servers = setting("BASALT_SCALE_SERVERS", 1_000);
    let watchers = setting("BASALT_SCALE_WATCHERS", 1_000);
    let changes = setting("BASALT_SCALE_CHANGES", 20);
    println!(
        "\n## etcd: {tablets} tablets, {servers} servers, {watchers} watchers, {changes} changes\n"
    );
    let etcd = Etcd::start().await;
    let cpu = EtcdCpu::find(etcd.port());
    let urls = [etcd.url()];
    let eps = endpoints(&urls, &Security::Plaintext).expect("endpoints");
    let keys = Keys::new("default", "scale");
    let meta = Meta::connect(&eps, keys.clone()).await.expect("connect");
    let mut client = meta.client();

    // etcd refuses more than 128 operations in one transaction (--max-txn-ops), which is why
    // Meta::assign_table writes a new table of more than ASSIGN_BATCH tablets in batches.
    let big: Vec<TxnOp> = (0..1_000)
        .map(|i| TxnOp::put(format!("{}probe/{i}", keys.prefix()), "x", None))
        .collect();
    match client.txn(Txn::new().and_then(big)).await {
        Ok(_) => println!("- a transaction of 1,000 puts (a new table of 1,000 tablets): accepted"),
        Err(e) => {
            println!("- a transaction of 1,000 puts (a new table of 1,000 tablets): refused: {e}")
        }
    }

    // The map: 100 tables as the master's benchmark shapes them, written in transactions of
    // 100 records, 8 at a time.
    let records = map_records(&keys, tablets, servers);
    let bytes: usize = records.iter().map(|(k, v)| k.len() + v.len()).sum();
    let cpu_before = cpu.seconds();
    let started = Instant::now();
    let records = Arc::new(records);
    let mut tasks = Vec::new();
    for worker in 0..8 {
        let records = records.clone();
        let mut client = client.clone();
        tasks.push(tokio::spawn(async move {
            for chunk in records.chunks(100).skip(worker).step_by(8) {
                let ops: Vec<TxnOp> = chunk
                    .iter()
                    .map(|(k, v)| TxnOp::put(k.as_str(), v.as_slice(), None))
                    .collect();
                client
                    .txn(Txn::new().and_then(ops))
                    .await
                    .expect("a batch of records");
            }
        }));
    }
    for t in tasks {
        t.await.expect("writer");
    }
    let wrote = started.elapsed();
    let write_cpu = cpu.seconds() - cpu_before;
    println!(
        "- wrote {tablets} tablet records ({:.1} MiB of keys and values) in {:.1} s: {:.0} records/s, etcd CPU {:.2} s/s",
        bytes as f64 / MIB,
        wrote.as_secs_f64(),
        tablets as f64 / wrote.as_secs_f64(),
        write_cpu / wrote.as_secs_f64()
    );

    // Registrations, renewed by Meta::register's own task (a keep-alive every TTL / 3).
    let started = Instant::now();
    let mut registrations: Vec<Registration> = Vec::with_capacity(servers);
    for i in 0..servers {
        let record = ServerRecord {
            store_id: format!("st-{:016x}", i as u64 * 0x9e37_79b9),
            name: format!("{CLUSTER}-{i}"),
            address: format!("10.0.{}.{}:8086", i / 256, i % 256),
            http_address: Some(format!("10.0.{}.{}:8087", i / 256, i % 256)),
            ordinal: Some(i as u32),
            incarnation: 1,
        };
        registrations.push(
            meta.register(CLUSTER, record, LeaseTiming::default(), Arc::new(|| true))
                .await
                .expect("registered"),
        );
    }
    println!(
        "- registered {servers} servers with leases in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let status = status(&mut client).await;
    println!(
        "- database: {:.1} MiB ({:.1} MiB in use), {:.0} bytes per tablet",
        status.db_size() as f64 / MIB,
        status.raft_used_db_size() as f64 / MIB,
        status.db_size() as f64 / tablets as f64
    );
    let window = Duration::from_secs(10);
    let before = cpu.seconds();
    tokio::time::sleep(window).await;
    println!(
        "- etcd CPU while {servers} leases are renewed (nothing else): {:.2} s/s",
        (cpu.seconds() - before) / window.as_secs_f64()
    );

    // What Meta::tablets did before it read in pages: everything in one answer.
    let started = Instant::now();
    let whole = client
        .get(
            keys.tablets(CLUSTER),
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await;
    println!(
        "- one read of the whole map in one answer (before pages): {} after {:.2} s",
        match &whole {
            Ok(resp) => format!("{} records", resp.kvs().len()),
            Err(e) => format!("failed: {e}"),
        },
        started.elapsed().as_secs_f64()
    );
    drop(whole);

    // A frontend's cold load of the whole map.
    let started = Instant::now();
    match meta.tablets(CLUSTER).await {
        Ok((map, _)) => println!(
            "- cold load of the map (Meta::tablets): {:.2} s for {} tablets",
            started.elapsed().as_secs_f64(),
            map.tables().map(|t| map.tablets(t).len()).sum::<usize>()
        ),
        Err(e) => println!(
            "- cold load of the map (Meta::tablets): failed after {:.2} s: {e}",
            started.elapsed().as_secs_f64()
        ),
    }

    follow(&keys, &meta, &records, changes).await;
    fan_out(&eps, &keys, &meta, &records, watchers, changes, &cpu).await;
    for r in registrations {
        r.unregister().await;
    }
}

/// What each server's catalog mirror and the master do now instead of reading the map again
/// after each change: a [`TabletFollower`] from one read, the changed records applied from
/// the watch, and the map published (a clone, sharing the tables it did not change).
async fn follow(keys: &Keys, meta: &Meta, records: &[(String, Vec<u8>)], changes: usize) {
    let snapshot = meta.tablet_snapshot(CLUSTER).await.expect("snapshot");
    let mut stream = meta
        .watch(keys.prefix(), snapshot.revision + 1)
        .await
        .expect("watch");
    let mut follower = TabletFollower::new(keys.clone(), CLUSTER, snapshot);
    let mut published = follower.map().clone();
    let mut client = meta.client();
    let (mut delays, mut work) = (Vec::new(), Vec::new());
    for change in 0..changes {
        let (key, value) = &records[(change * 7919 + 13) % records.len()];
        let value = String::from_utf8(value.clone())
            .expect("JSON")
            .replace(EPOCH_1, &format!("\"epoch\":{}", change + 1000));
        let sent = Instant::now();
        client.put(key.as_str(), value, None).await.expect("change");
        loop {
            let resp = tokio::time::timeout(Duration::from_secs(30), stream.message())
                .await
                .expect("the change arrives")
                .expect("watch")
                .expect("watch goes on");
            if resp.events().is_empty() {
                continue;
            }
            let started = Instant::now();
            let followed = follower.apply(resp.events()).expect("fits");
            published = follower.map().clone();
            work.push(started.elapsed());
            if !followed.tables.is_empty() {
                break;
            }
        }
        delays.push(sent.elapsed());
    }
    let tablets: usize = published.tables().map(|t| published.tablets(t).len()).sum();
    delays.sort();
    work.sort();
    println!(
        "- a follower of the map ({tablets} tablets), {changes} ownership changes: from the write to the map applied and published p50 {:.2} ms, max {:.2} ms; applying and publishing alone p50 {:.3} ms, max {:.3} ms",
        quantile_ms(&delays, 0.5),
        quantile_ms(&delays, 1.0),
        quantile_ms(&work, 0.5),
        quantile_ms(&work, 1.0),
    );
}

/// Opens `watchers` watches of the instance's prefix over 10 connections, changes the owner
/// of one tablet `changes` times, and reports how long each watcher took to see each change.
async fn fan_out(
    eps: &basalt_meta::EtcdEndpoints,
    keys: &Keys,
    meta: &Meta,
    records: &[(String, Vec<u8>)],
    watchers: usize,
    changes: usize,
    cpu: &EtcdCpu,
) {
    let (seen_tx, mut seen) = mpsc::unbounded_channel::<(usize, Instant)>();
    let mut connections = Vec::new();
    for _ in 0..10 {
        connections.push(Meta::connect(eps, keys.clone()).await.expect("connect"));
    }
    let revision = status(&mut meta.client())
        .await
        .header()
        .map_or(0, |h| h.revision());
    let started = Instant::now();
    for w in 0..watchers {
        let mut stream = connections[w % 10]
            .watch(keys.prefix(), revision + 1)
            .await
            .expect("watch");
        let seen_tx = seen_tx.clone();
        tokio::spawn(async move {
            while let Ok(Some(resp)) = stream.message().await {
                if !resp.events().is_empty() && seen_tx.send((w, Instant::now())).is_err() {
                    return;
                }
            }
        });
    }
    println!(
        "- opened {watchers} watches of the instance's prefix in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    while seen.try_recv().is_ok() {}
    let mut client = meta.client();
    let mut delays: Vec<Duration> = Vec::new();
    let mut everyone: Vec<Duration> = Vec::new();
    let before = cpu.seconds();
    let phase = Instant::now();
    for change in 0..changes {
        let (key, value) = &records[(change * 7919) % records.len()];
        let mut value = String::from_utf8(value.clone()).expect("JSON");
        value = value.replace(EPOCH_1, &format!("\"epoch\":{}", change + 2));
        let sent = Instant::now();
        client.put(key.as_str(), value, None).await.expect("change");
        let mut got = 0;
        let mut last = sent;
        while got < watchers {
            match tokio::time::timeout(Duration::from_secs(30), seen.recv()).await {
                Ok(Some((_, at))) => {
                    delays.push(at - sent);
                    last = last.max(at);
                    got += 1;
                }
                _ => break,
            }
        }
        if got < watchers {
            println!("  change {change}: only {got} of {watchers} watchers within 30 s");
        }
        everyone.push(last - sent);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let cpu_per_s = (cpu.seconds() - before) / phase.elapsed().as_secs_f64();
    delays.sort();
    everyone.sort();
    println!(
        "- one ownership change to {watchers} watchers: delay per watcher p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; until every watcher had it p50 {:.1} ms, max {:.1} ms; etcd CPU {:.2} s/s over the phase (a change every ~0.2 s)",
        quantile_ms(&delays, 0.5),
        quantile_ms(&delays, 0.99),
        quantile_ms(&delays, 1.0),
        quantile_ms(&everyone, 0.5),
        quantile_ms(&everyone, 1.0),
        cpu_per_s
    );
}

/// The epoch of every tablet record `map_records` writes, as it stands in the JSON: a change
/// raises it.
const EPOCH_1: &str = "\"epoch\":1";

/// The `q` quantile of sorted `v`, in milliseconds (NaN if empty).
fn quantile_ms(v: &[Duration], q: f64) -> f64 {
    v.get(((v.len() as f64 * q) as usize).min(v.len().saturating_sub(1)))
        .map_or(f64::NAN, |d| d.as_secs_f64() * 1e3)
}

async fn status(client: &mut Client) -> StatusResponse {
    client.status().await.expect("etcd status")
}

/// The records of `tablets` tablets over 100 tables (table `i` weighted `1 / (i + 1)`), split
/// at `user<16 hex digits>` keys, owned by `servers` servers with store ids of real length.
fn map_records(keys: &Keys, tablets: usize, servers: usize) -> Vec<(String, Vec<u8>)> {
    let tables = 100.min(tablets);
    let weights: Vec<f64> = (0..tables).map(|i| 1.0 / (i + 1) as f64).collect();
    let total: f64 = weights.iter().sum();
    let spare = tablets - tables;
    let mut sizes: Vec<usize> = weights
        .iter()
        .map(|w| 1 + (spare as f64 * w / total) as usize)
        .collect();
    sizes[0] += tablets - sizes.iter().sum::<usize>();
    let row = |x: u64| Bytes::from(format!("user{x:016x}"));
    let mut records = Vec::with_capacity(tablets);
    let mut n = 0u64;
    for (table, count) in sizes.into_iter().enumerate() {
        let step = u64::MAX / count as u64;
        for i in 0..count {
            let tablet = Tablet {
                table: format!("table-{table:05}"),
                range: RowRange::new(
                    if i == 0 {
                        Bytes::new()
                    } else {
                        row(step * i as u64)
                    },
                    (i + 1 < count).then(|| row(step * (i + 1) as u64)),
                ),
                epoch: 1,
                owner: format!("st-{:016x}", (n % servers as u64) * 0x9e37_79b9),
                state: TabletState::Serving,
            };
            n += 1;
            records.push(encode_tablet(keys, CLUSTER, &tablet));
        }
    }
    records
}

/// etcd's CPU clock, read from /proc (the process found by its client port).
struct EtcdCpu {
    stat: Option<std::path::PathBuf>,
}

impl EtcdCpu {
    fn find(port: u16) -> EtcdCpu {
        let wanted = format!("127.0.0.1:{port}");
        let stat = std::fs::read_dir("/proc").ok().and_then(|dir| {
            dir.flatten().find_map(|entry| {
                let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
                let cmdline = String::from_utf8_lossy(&cmdline);
                (cmdline.contains("etcd") && cmdline.contains(&wanted))
                    .then(|| entry.path().join("stat"))
            })
        });
        EtcdCpu { stat }
    }

    /// User and system CPU seconds so far (NaN when unknown).
    fn seconds(&self) -> f64 {
        let Some(stat) = &self.stat else {
            return f64::NAN;
        };
        let Ok(text) = std::fs::read_to_string(stat) else {
            return f64::NAN;
        };
        // Fields after the command's closing parenthesis; utime and stime are the 14th and
        // 15th of the line, in clock ticks (100 per second on Linux).
        let rest = text.rsplit_once(')').map_or("", |(_, r)| r);
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<f64>().ok())
                .unwrap_or(f64::NAN)
        };
        (ticks(11) + ticks(12)) / 100.0
    }
}
