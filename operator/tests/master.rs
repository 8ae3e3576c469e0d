//! The master against a real etcd (Debian's `/usr/bin/etcd`), with tablet servers played by
//! plain registrations: a new table's tablets spread over the servers, two candidates that do
//! not double-assign, a take-over when the leader goes, a replaced server's tablets Lost after
//! its deadline and re-created empty elsewhere once an administrator accepts the loss, and a
//! master started before etcd.

mod etcd;

use std::sync::Arc;
use std::time::Duration;

use basalt_master::model::{TableSchema, Tablet, TabletState};
use basalt_meta::{Keys, LeaseTiming, Meta, Registration, ServerRecord};
use basalt_operator::master::{MasterConfig, MasterTiming, run_with};
use etcd::{Endpoints, Etcd, eventually};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

const SERVERS: LeaseTiming = LeaseTiming {
    ttl: Duration::from_secs(2),
    grace: Duration::from_secs(1),
};

fn timing() -> MasterTiming {
    MasterTiming {
        servers: SERVERS,
        margin: Duration::from_secs(2),
        master_ttl: Duration::from_secs(2),
        interval: Duration::from_millis(200),
        max_backoff: Duration::from_millis(500),
        ..MasterTiming::default()
    }
}

/// A running master: its task and the sender that shuts it down.
struct Master {
    task: JoinHandle<anyhow::Result<()>>,
    shutdown: oneshot::Sender<()>,
}

fn start_master(etcd: &Etcd, identity: &str) -> Master {
    let config = MasterConfig {
        security: basalt_transport::Security::Plaintext,
        etcd_security: basalt_transport::Security::Plaintext,
        etcd_endpoints: vec![etcd.url()],
        namespace: "ns".into(),
        instance: "inst".into(),
        identity: identity.into(),
        prometheus_url: None,
    };
    let (shutdown, rx) = oneshot::channel();
    let task = tokio::spawn(run_with(config, timing(), async {
        let _ = rx.await;
    }));
    Master { task, shutdown }
}

async fn meta(etcd: &Etcd) -> Meta {
    Meta::connect(&etcd.endpoints(), Keys::new("ns", "inst"))
        .await
        .unwrap()
}

async fn register(meta: &Meta, store_id: &str, ordinal: u32) -> Registration {
    let record = ServerRecord {
        store_id: store_id.into(),
        name: format!("c1-{ordinal}"),
        address: format!("127.0.0.1:{}", 19000 + ordinal),
        http_address: None,
        ordinal: Some(ordinal),
        incarnation: 1,
    };
    meta.register("c1", record, SERVERS, Arc::new(|| true))
        .await
        .unwrap()
}

fn schema(table: &str, splits: usize) -> TableSchema {
    TableSchema {
        id: 0,
        name: format!("projects/p/instances/inst/tables/{table}"),
        families: Default::default(),
        dropped_families: Default::default(),
        deletion_protection: false,
        splits: (1..=splits)
            .map(|i| format!("k{i:02}").into_bytes())
            .collect(),
        created_micros: 0,
        restore: None,
    }
}

async fn tablets(meta: &Meta, table: &str) -> Vec<Tablet> {
    meta.tablets("c1").await.unwrap().0.tablets(table).to_vec()
}

/// How many tablets of `tablets` each of `servers` owns.
fn counts(tablets: &[Tablet], servers: &[&str]) -> Vec<usize> {
    servers
        .iter()
        .map(|s| tablets.iter().filter(|t| t.owner == *s).count())
        .collect()
}

/// The identity of the current leader.
async fn leader(meta: &Meta) -> String {
    let resp = meta.client().leader(meta.keys().master()).await.unwrap();
    String::from_utf8(resp.kv().unwrap().value().to_vec()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_master_assigns_fails_over_and_handles_a_lost_server() {
    let etcd = Etcd::start().await;
    let meta = meta(&etcd).await;
    // Two candidates at once; one leads.
    let mut masters = vec![
        ("m-a", start_master(&etcd, "m-a")),
        ("m-b", start_master(&etcd, "m-b")),
    ];
    let _s0 = register(&meta, "st-0", 0).await;
    let s1 = register(&meta, "st-1", 1).await;
    let _s2 = register(&meta, "st-2", 2).await;
    let stores = ["st-0", "st-1", "st-2"];

    // A table with 7 splits: 8 tablets, 3/3/2 in ordinal order, epoch 1, Serving.
    meta.create_table(schema("t", 7)).await.unwrap();
    eventually(
        Duration::from_secs(10),
        "t's tablets are assigned",
        || async { tablets(&meta, "t").await.len() == 8 },
    )
    .await;
    let t = tablets(&meta, "t").await;
    assert_eq!(counts(&t, &stores), [3, 3, 2]);
    assert!(
        t.iter()
            .all(|t| t.epoch == 1 && t.state == TabletState::Serving)
    );
    // Nothing changes afterwards (the other candidate did not assign them again).
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(tablets(&meta, "t").await, t);

    // The leader goes away without resigning (its task is dropped, like a crash): the other
    // takes over after the master lease's TTL and assigns a new table.
    let first = leader(&meta).await;
    let i = masters.iter().position(|(id, _)| *id == first).unwrap();
    let (_, gone) = masters.remove(i);
    gone.task.abort();
    let _ = gone.task.await;
    meta.create_table(schema("u", 3)).await.unwrap();
    eventually(
        Duration::from_secs(15),
        "the other master assigns u",
        || async { tablets(&meta, "u").await.len() == 4 },
    )
    .await;
    assert_ne!(leader(&meta).await, first);
    let u = tablets(&meta, "u").await;
    // 12 tablets over 3 servers: 4 each (u fills the gaps t left).
    let mut all = t.clone();
    all.extend(u.iter().cloned());
    assert_eq!(counts(&all, &stores), [4, 4, 4]);

    // st-1's data directory is lost: the server comes back as c1-1 under a new store id and
    // its old registration expires. Its tablets stay Serving until TTL + margin has passed.
    drop(s1);
    let _s1b = register(&meta, "st-1b", 1).await;
    eventually(
        Duration::from_secs(10),
        "st-1's registration expires",
        || async {
            let (servers, _) = meta.servers(Some("c1")).await.unwrap();
            !servers.iter().any(|s| s.record.store_id == "st-1")
        },
    )
    .await;
    let gone_at = Instant::now();
    let owned = |ts: &[Tablet]| -> Vec<Tablet> {
        ts.iter().filter(|t| t.owner == "st-1").cloned().collect()
    };
    let before: Vec<Tablet> = [tablets(&meta, "t").await, tablets(&meta, "u").await].concat();
    assert_eq!(owned(&before).len(), 4);
    assert!(
        owned(&before)
            .iter()
            .all(|t| t.state == TabletState::Serving)
    );
    eventually(
        Duration::from_secs(15),
        "st-1's tablets become Lost",
        || async {
            let now: Vec<Tablet> = [tablets(&meta, "t").await, tablets(&meta, "u").await].concat();
            owned(&now).len() == 4 && owned(&now).iter().all(|t| t.state == TabletState::Lost)
        },
    )
    .await;
    // Not before the lease TTL + margin (counted from when the master saw it missing).
    assert!(
        gone_at.elapsed() >= Duration::from_secs(3),
        "declared lost only {:?} after the registration expired",
        gone_at.elapsed()
    );
    let lost: Vec<Tablet> = [tablets(&meta, "t").await, tablets(&meta, "u").await].concat();
    for t in owned(&lost) {
        assert_eq!(t.epoch, 1, "owner and epoch unchanged: {t}");
    }

    // An administrator accepts the loss: the tablets are re-created on live servers at epoch 2.
    meta.accept_loss("c1", "st-1").await.unwrap();
    eventually(
        Duration::from_secs(10),
        "the loss is carried out",
        || async { meta.accepted_losses("c1").await.unwrap().is_empty() },
    )
    .await;
    let after: Vec<Tablet> = [tablets(&meta, "t").await, tablets(&meta, "u").await].concat();
    assert!(owned(&after).is_empty());
    for old in owned(&lost) {
        let new = after
            .iter()
            .find(|t| t.table == old.table && t.range == old.range);
        let new = new.unwrap();
        assert_eq!((new.epoch, new.state), (2, TabletState::Serving), "{new}");
        assert!(
            ["st-0", "st-2", "st-1b"].contains(&new.owner.as_str()),
            "{new}"
        );
    }
    assert_eq!(counts(&after, &["st-0", "st-2", "st-1b"]), [4, 4, 4]);

    // The remaining master shuts down cleanly.
    let (_, last) = masters.pop().unwrap();
    let _ = last.shutdown.send(());
    tokio::time::timeout(Duration::from_secs(5), last.task)
        .await
        .expect("the master returns on shutdown")
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_started_before_etcd_waits_for_it() {
    let mut etcd = Etcd::new();
    let master = start_master(&etcd, "m-a");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !master.task.is_finished(),
        "the master gave up while etcd was down"
    );
    etcd.spawn().await;
    let meta = meta(&etcd).await;
    let _s0 = register(&meta, "st-0", 0).await;
    meta.create_table(schema("t", 1)).await.unwrap();
    eventually(Duration::from_secs(15), "t is assigned", || async {
        tablets(&meta, "t").await.len() == 2
    })
    .await;
    let _ = master.shutdown.send(());
    tokio::time::timeout(Duration::from_secs(5), master.task)
        .await
        .expect("the master returns on shutdown")
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn unsafe_timings_are_refused() {
    let config = MasterConfig {
        security: basalt_transport::Security::Plaintext,
        etcd_security: basalt_transport::Security::Plaintext,
        etcd_endpoints: vec!["http://127.0.0.1:1".into()],
        namespace: "ns".into(),
        instance: "inst".into(),
        identity: "m".into(),
        prometheus_url: None,
    };
    let unsafe_timing = MasterTiming {
        margin: SERVERS.grace,
        ..timing()
    };
    assert!(
        run_with(config, unsafe_timing, std::future::pending())
            .await
            .is_err()
    );
}
