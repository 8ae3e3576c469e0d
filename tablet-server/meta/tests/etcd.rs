//! basalt-meta against a real etcd (Debian's `/usr/bin/etcd`): the catalog's transactions, the
//! tablet map's fencing by the master's term, registrations and their serving deadline through
//! etcd pauses and lease expiry, and the master's election. Short TTLs (2 s) keep the file fast;
//! every wait is bounded.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use basalt_meta::{
    AppProfilePriority, AppProfileRecord, AppProfileRouting, Keys, LeaseTiming, Meta, ServerRecord,
    TabletFollower,
};
use basalt_model::{Error, TableSchema, Tablet, TabletState};
use common::{Endpoints, Etcd, eventually};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(2);
const TIMING: LeaseTiming = LeaseTiming {
    ttl: TTL,
    grace: Duration::from_secs(1),
};

async fn meta(etcd: &Etcd) -> Meta {
    Meta::connect(&etcd.endpoints(), Keys::new("ns", "inst"))
        .await
        .expect("connects to etcd")
}

fn schema(table: &str, splits: &[&str]) -> TableSchema {
    TableSchema {
        id: 0,
        name: format!("projects/p/instances/inst/tables/{table}"),
        families: Default::default(),
        dropped_families: Default::default(),
        deletion_protection: false,
        splits: splits.iter().map(|s| s.as_bytes().to_vec()).collect(),
        created_micros: 0,
        restore: None,
    }
}

/// The tablets of `schema` in a new table, all on `owner`.
fn tablets(schema: &TableSchema, owner: &str) -> Vec<Tablet> {
    let table = basalt_meta::table_id(&schema.name).to_string();
    schema
        .tablet_ranges()
        .into_iter()
        .map(|range| Tablet {
            table: table.clone(),
            range,
            epoch: 1,
            owner: owner.into(),
            state: TabletState::Serving,
        })
        .collect()
}

fn record(store_id: &str, name: &str) -> ServerRecord {
    ServerRecord {
        store_id: store_id.into(),
        name: name.into(),
        address: "127.0.0.1:1".into(),
        http_address: None,
        ordinal: Some(0),
        incarnation: 1,
    }
}

fn always() -> Arc<dyn Fn() -> bool + Send + Sync> {
    Arc::new(|| true)
}

async fn registered(meta: &Meta, store_id: &str) -> Option<i64> {
    let (servers, _) = meta.servers(Some("c1")).await.unwrap();
    servers
        .iter()
        .find(|s| s.record.store_id == store_id)
        .map(|s| s.lease)
}

// --- the catalog ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_table_assigns_increasing_ids_and_refuses_a_duplicate() {
    let etcd = Etcd::start().await;
    let meta = meta(&etcd).await;
    let a = meta.create_table(schema("a", &[])).await.unwrap();
    let b = meta.create_table(schema("b", &["m"])).await.unwrap();
    assert_eq!((a.schema.id, b.schema.id), (1, 2));
    assert!(b.create_revision > a.create_revision);
    let again = meta.create_table(schema("a", &["x"])).await;
    assert!(matches!(again, Err(Error::AlreadyExists(_))), "{again:?}");
    // The refused creation changed nothing and used no id.
    let (tables, _) = meta.tables().await.unwrap();
    assert_eq!(tables.len(), 2);
    assert_eq!(
        meta.table("a").await.unwrap().unwrap().schema.splits.len(),
        0
    );
    let c = meta.create_table(schema("c", &[])).await.unwrap();
    assert_eq!(c.schema.id, 3);
    assert_eq!(
        meta.table("b").await.unwrap().unwrap().schema.splits,
        vec![b"m".to_vec()]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creations_get_distinct_ids() {
    let etcd = Etcd::start().await;
    let meta = meta(&etcd).await;
    let creations = (0..12).map(|i| {
        let meta = meta.clone();
        tokio::spawn(async move { meta.create_table(schema(&format!("t{i}"), &[])).await })
    });
    let mut ids = Vec::new();
    for c in creations {
        ids.push(c.await.unwrap().unwrap().schema.id);
    }
    ids.sort();
    assert_eq!(ids, (1..=12).collect::<Vec<u64>>());
    // Racing creations of one table: exactly one wins.
    let same = (0..6).map(|_| {
        let meta = meta.clone();
        tokio::spawn(async move { meta.create_table(schema("same", &[])).await })
    });
    let mut won = 0;
    for c in same {
        match c.await.unwrap() {
            Ok(_) => won += 1,
            Err(Error::AlreadyExists(_)) => {}
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(won, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_updates_lose_nothing() {
    let etcd = Etcd::start().await;
    let meta = meta(&etcd).await;
    meta.create_table(schema("t", &[])).await.unwrap();
    // Each update appends one split: a lost update would lose its split.
    let updates = (0..10).map(|i| {
        let meta = meta.clone();
        tokio::spawn(async move {
            meta.update_table("t", |s| {
                let mut s = s.clone();
                s.splits.push(format!("k{i:02}").into_bytes());
                Ok(s)
            })
            .await
        })
    });
    for u in updates {
        u.await.unwrap().unwrap();
    }
    let mut splits = meta.table("t").await.unwrap().unwrap().schema.splits;
    splits.sort();
    let want: Vec<Vec<u8>> = (0..10).map(|i| format!("k{i:02}").into_bytes()).collect();
    assert_eq!(splits, want);
    // The change's own error comes back as is and changes nothing; a missing table is NOT_FOUND.
    let refused = meta
        .update_table("t", |_| Err(Error::FailedPrecondition("no".into())))
        .await;
    assert!(matches!(refused, Err(Error::FailedPrecondition(_))));
    let missing = meta.update_table("nope", |s| Ok(s.clone())).await;
    assert!(matches!(missing, Err(Error::NotFound(_))), "{missing:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_table_removes_the_schema_and_the_tablets_of_every_cluster() {
    let etcd = Etcd::start().await;
    let meta = meta(&etcd).await;
    let leader = meta.campaign("m1", TTL).await.unwrap();
    let mut t = schema("t", &["g"]);
    t.deletion_protection = true;
    let t = meta.create_table(t).await.unwrap();
    let other = meta.create_table(schema("other", &[])).await.unwrap();
    for cluster in ["c1", "c2"] {
        for s in [&t, &other] {
            let table = basalt_meta::table_id(&s.schema.name);
            let ok = meta
                .assign_table(
                    &leader.term,
                    cluster,
                    table,
                    s.create_revision,
                    &tablets(&s.schema, "s0"),
                )
                .await
                .unwrap();
            assert!(ok);
        }
    }
    // `check` refuses (deletion protection): nothing is deleted.
    let protected = |s: &TableSchema| {
        if s.deletion_protection {
            Err(Error::FailedPrecondition("deletion protection".into()))
        } else {
            Ok(())
        }
    };
    let refused = meta.delete_table("t", protected).await;
    assert!(matches!(refused, Err(Error::FailedPrecondition(_))));
    assert_eq!(meta.tablets("c1").await.unwrap().0.tablets("t").len(), 2);
    meta.update_table("t", |s| {
        let mut s = s.clone();
        s.deletion_protection = false;
        Ok(s)
    })
    .await
    .unwrap();
    meta.delete_table("t", protected).await.unwrap();
    assert!(meta.table("t").await.unwrap().is_none());
    for cluster in ["c1", "c2"] {
        let (map, _) = meta.tablets(cluster).await.unwrap();
        assert!(map.tablets("t").is_empty(), "{cluster}");
        assert_eq!(map.tablets("other").len(), 1, "{cluster}");
    }
    let again = meta.delete_table("t", |_| Ok(())).await;
    assert!(matches!(again, Err(Error::NotFound(_))));
    leader.resign().await;
}

fn app_profile(id: &str, description: &str) -> AppProfileRecord {
    AppProfileRecord {
        id: id.into(),
        description: description.into(),
        routing: AppProfileRouting::SingleClusterRouting {
            cluster_id: "c1".into(),
            allow_transactional_writes: true,
        },
        priority: AppProfilePriority::Medium,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn app_profiles_are_put_replaced_listed_and_deleted_per_instance() {
    let etcd = Etcd::start().await;
    let meta = meta(&etcd).await;
    let other = Meta::connect(&etcd.endpoints(), Keys::new("ns", "other-inst"))
        .await
        .unwrap();
    assert!(meta.app_profiles().await.unwrap().is_empty());
    assert_eq!(meta.app_profile("batch").await.unwrap(), None);

    let batch = app_profile("batch", "nightly jobs");
    let mut any = app_profile("default", "");
    any.routing = AppProfileRouting::MultiClusterRoutingUseAny {
        cluster_ids: vec!["c1".into(), "c2".into()],
        row_affinity: true,
    };
    meta.put_app_profile(&batch).await.unwrap();
    meta.put_app_profile(&any).await.unwrap();
    other
        .put_app_profile(&app_profile("elsewhere", ""))
        .await
        .unwrap();
    // In id order, this instance's only; stored under app-profiles/<id>.
    assert_eq!(
        meta.app_profiles().await.unwrap(),
        vec![batch.clone(), any.clone()]
    );
    let raw = meta
        .client()
        .get(meta.keys().app_profile("batch"), None)
        .await
        .unwrap();
    assert_eq!(raw.kvs()[0].value(), batch.encode().as_slice());

    // A put replaces.
    let changed = app_profile("batch", "nightly jobs, now low priority");
    meta.put_app_profile(&AppProfileRecord {
        priority: AppProfilePriority::Low,
        ..changed.clone()
    })
    .await
    .unwrap();
    let read = meta.app_profile("batch").await.unwrap().unwrap();
    assert_eq!(read.description, "nightly jobs, now low priority");
    assert_eq!(read.priority, AppProfilePriority::Low);
    assert_eq!(meta.app_profiles().await.unwrap().len(), 2);

    // A delete says whether there was one; the other instance's profile stays.
    assert!(meta.delete_app_profile("batch").await.unwrap());
    assert!(!meta.delete_app_profile("batch").await.unwrap());
    assert_eq!(meta.app_profiles().await.unwrap(), vec![any]);
    assert_eq!(other.app_profiles().await.unwrap().len(), 1);

    // An id that is no single key is refused.
    for bad in ["", "a/b"] {
        let refused = meta.put_app_profile(&app_profile(bad, "")).await;
        assert!(
            matches!(refused, Err(Error::InvalidArgument(_))),
            "{refused:?}"
        );
        assert!(meta.delete_app_profile(bad).await.is_err());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn app_profile_calls_fail_unavailable_while_etcd_is_down() {
    let mut etcd = Etcd::start().await;
    let meta = meta(&etcd).await;
    meta.put_app_profile(&app_profile("batch", ""))
        .await
        .unwrap();
    etcd.kill();
    let put = meta.put_app_profile(&app_profile("other", "")).await;
    assert!(matches!(put, Err(Error::Unavailable(_))), "{put:?}");
    let list = meta.app_profiles().await;
    assert!(matches!(list, Err(Error::Unavailable(_))), "{list:?}");
    etcd.restart().await;
    eventually(
        Duration::from_secs(10),
        "the profile read after a restart",
        || {
            let meta = meta.clone();
            async move { meta.app_profiles().await.is_ok_and(|p| p.len() == 1) }
        },
    )
    .await;
}

// --- the tablet map, fenced by the master's term -------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assign_table_is_fenced_by_the_term_and_the_table_itself() {
    let etcd = Etcd::start().await;
    let meta = meta(&etcd).await;
    let first = meta.campaign("m1", TTL).await.unwrap();
    let t = meta.create_table(schema("t", &["g", "p"])).await.unwrap();
    let ts = tablets(&t.schema, "s0");
    assert!(
        meta.assign_table(&first.term, "c1", "t", t.create_revision, &ts)
            .await
            .unwrap()
    );
    let (map, _) = meta.tablets("c1").await.unwrap();
    assert_eq!(map.tablets("t"), &ts[..]);
    // A second assignment (e.g. by a racing leader's stale view) is refused.
    let elsewhere = tablets(&t.schema, "s1");
    assert!(
        !meta
            .assign_table(&first.term, "c1", "t", t.create_revision, &elsewhere)
            .await
            .unwrap()
    );
    assert_eq!(meta.tablets("c1").await.unwrap().0.tablets("t"), &ts[..]);

    // A stale term: the first leader resigned, a second was elected.
    let stale = first.term.clone();
    first.resign().await;
    let second = meta.campaign("m2", TTL).await.unwrap();
    assert!(second.term.revision > stale.revision);
    let u = meta.create_table(schema("u", &[])).await.unwrap();
    let us = tablets(&u.schema, "s0");
    assert!(
        !meta
            .assign_table(&stale, "c1", "u", u.create_revision, &us)
            .await
            .unwrap()
    );
    assert!(meta.tablets("c1").await.unwrap().0.tablets("u").is_empty());

    // The table was deleted and created again: the old creation's assignment is refused.
    meta.delete_table("u", |_| Ok(())).await.unwrap();
    let u2 = meta.create_table(schema("u", &["k"])).await.unwrap();
    assert!(
        !meta
            .assign_table(&second.term, "c1", "u", u.create_revision, &us)
            .await
            .unwrap()
    );
    let u2s = tablets(&u2.schema, "s1");
    assert!(
        meta.assign_table(&second.term, "c1", "u", u2.create_revision, &u2s)
            .await
            .unwrap()
    );
    assert_eq!(meta.tablets("c1").await.unwrap().0.tablets("u"), &u2s[..]);
    second.resign().await;
}

/// Splits named so that their order is their numeric order.
fn many_splits(n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("row{i:05}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_of_more_tablets_than_one_transaction_takes_is_assigned_whole() {
    let etcd = Etcd::start().await;
    let meta = meta(&etcd).await;
    let leader = meta.campaign("m1", TTL).await.unwrap();
    let small = meta.create_table(schema("small", &["m"])).await.unwrap();
    let smalls = tablets(&small.schema, "s0");
    assert!(
        meta.assign_table(&leader.term, "c1", "small", small.create_revision, &smalls)
            .await
            .unwrap()
    );

    // 1,000 initial splits: 1,001 tablets, eleven batches (etcd takes 128 operations).
    let splits = many_splits(1000);
    let splits: Vec<&str> = splits.iter().map(String::as_str).collect();
    let big = meta.create_table(schema("big", &splits)).await.unwrap();
    let bigs = tablets(&big.schema, "s1");
    assert_eq!(bigs.len(), 1001);
    assert!(bigs.len() > 10 * basalt_meta::client::ASSIGN_BATCH);
    assert!(
        meta.assign_table(&leader.term, "c1", "big", big.create_revision, &bigs)
            .await
            .unwrap()
    );
    let (map, _) = meta.tablets("c1").await.unwrap();
    assert_eq!(map.tablets("big"), &bigs[..]);
    assert_eq!(map.tablets("small"), &smalls[..]);
    assert_eq!(
        map.tablet_for("big", b"row00500x")
            .unwrap()
            .range
            .start
            .as_ref(),
        b"row00500"
    );
    // Assigned once: a second assignment is refused and changes nothing.
    let elsewhere = tablets(&big.schema, "s2");
    assert!(
        !meta
            .assign_table(&leader.term, "c1", "big", big.create_revision, &elsewhere)
            .await
            .unwrap()
    );
    assert_eq!(
        meta.tablets("c1").await.unwrap().0.tablets("big"),
        &bigs[..]
    );

    // What a leader that died between two batches leaves: the marker and some tablets. The
    // map's readers do not see the half-covered table (the rest of the map reads as before),
    // and the next assignment replaces it whole.
    let half = meta.create_table(schema("half", &splits)).await.unwrap();
    let halfs = tablets(&half.schema, "s1");
    let keys = Keys::new("ns", "inst");
    let mut raw = etcd_client::Client::connect([etcd.url()], None)
        .await
        .unwrap();
    raw.put(keys.tablets_assigning("c1", "half"), "1", None)
        .await
        .unwrap();
    for t in &halfs[..150] {
        let (key, value) = basalt_meta::records::encode_tablet(&keys, "c1", t);
        raw.put(key, value, None).await.unwrap();
    }
    let (map, _) = meta.tablets("c1").await.unwrap();
    assert!(map.tablets("half").is_empty());
    assert_eq!(map.tablets("big"), &bigs[..]);
    let again = tablets(&half.schema, "s2");
    assert!(
        meta.assign_table(&leader.term, "c1", "half", half.create_revision, &again)
            .await
            .unwrap()
    );
    let (map, _) = meta.tablets("c1").await.unwrap();
    assert_eq!(map.tablets("half"), &again[..]);
    let left = raw
        .get(keys.tablets_assigning("c1", "half"), None)
        .await
        .unwrap();
    assert!(
        left.kvs().is_empty(),
        "the marker is removed with the last batch"
    );

    // Deleting the table deletes its tablets (and a marker, were one left).
    meta.delete_table("big", |_| Ok(())).await.unwrap();
    assert!(
        meta.tablets("c1")
            .await
            .unwrap()
            .0
            .tablets("big")
            .is_empty()
    );
    leader.resign().await;
}

/// Follows the watch until etcd's progress notice says every change so far was seen (tables
/// whose assignment ended read whole, as the mirror does); what the responses changed
/// besides the map, merged.
async fn catch_up(
    meta: &Meta,
    follower: &mut TabletFollower,
    stream: &mut etcd_client::WatchStream,
) -> basalt_meta::Followed {
    let mut seen = basalt_meta::Followed::default();
    stream.request_progress().await.unwrap();
    loop {
        let resp = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .expect("the watch answers")
            .unwrap()
            .expect("the watch goes on");
        if resp.events().is_empty() {
            if resp.created() {
                continue;
            }
            follower.advance(resp.header().unwrap().revision());
            return seen;
        }
        let f = follower
            .apply(resp.events())
            .expect("the changes fit the map");
        follower.read_whole(meta, &f).await.unwrap();
        seen.tables.extend(f.tables);
        seen.to_read.extend(f.to_read);
        seen.schemas |= f.schemas;
        seen.servers |= f.servers;
        seen.moves |= f.moves;
        seen.revision = seen.revision.max(f.revision);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_of_the_watch_keeps_the_map_a_full_read_gives() {
    let etcd = Etcd::start().await;
    let meta = meta(&etcd).await;
    let leader = meta.campaign("m1", TTL).await.unwrap();
    let t = meta.create_table(schema("t", &["g", "p"])).await.unwrap();
    let ts = tablets(&t.schema, "s0");
    assert!(
        meta.assign_table(&leader.term, "c1", "t", t.create_revision, &ts)
            .await
            .unwrap()
    );
    let snapshot = meta.tablet_snapshot("c1").await.unwrap();
    let mut follower = TabletFollower::new(Keys::new("ns", "inst"), "c1", snapshot.clone());
    let mut stream = meta
        .watch(meta.keys().prefix(), snapshot.revision + 1)
        .await
        .unwrap();
    let same = |follower: &TabletFollower, map: &basalt_model::TabletMap| {
        assert_eq!(
            follower.map(),
            map,
            "the follower's map is the one etcd holds"
        );
    };

    // A move (new owner, epoch + 1), then a split of the moved tablet.
    let moved = Tablet {
        owner: "s1".into(),
        epoch: 2,
        ..ts[1].clone()
    };
    assert!(
        meta.change_tablet(&leader.term, "c1", &ts[1], &moved)
            .await
            .unwrap()
    );
    let (left, right) = (
        Tablet {
            range: basalt_model::RowRange::new(
                bytes::Bytes::from("g"),
                Some(bytes::Bytes::from("k")),
            ),
            epoch: 3,
            ..moved.clone()
        },
        Tablet {
            range: basalt_model::RowRange::new(
                bytes::Bytes::from("k"),
                Some(bytes::Bytes::from("p")),
            ),
            epoch: 3,
            ..moved.clone()
        },
    );
    assert!(
        meta.split_tablet(&leader.term, "c1", &moved, &left, &right)
            .await
            .unwrap()
    );
    let seen = catch_up(&meta, &mut follower, &mut stream).await;
    assert_eq!(seen.tables.iter().collect::<Vec<_>>(), ["t"]);
    assert!(!seen.schemas && !seen.servers);
    let (map, revision) = meta.tablets("c1").await.unwrap();
    same(&follower, &map);
    assert_eq!(map.tablets("t").len(), 4);
    assert!(follower.revision() >= revision);

    // A new table of 1,001 tablets, written in batches under its marker: the follower has
    // it whole once the last batch is written.
    let splits = many_splits(1000);
    let splits: Vec<&str> = splits.iter().map(String::as_str).collect();
    let big = meta.create_table(schema("big", &splits)).await.unwrap();
    let bigs = tablets(&big.schema, "s1");
    assert!(
        meta.assign_table(&leader.term, "c1", "big", big.create_revision, &bigs)
            .await
            .unwrap()
    );
    let seen = catch_up(&meta, &mut follower, &mut stream).await;
    assert!(seen.schemas, "a table was created");
    assert!(seen.to_read.contains("big"));
    same(&follower, &meta.tablets("c1").await.unwrap().0);
    assert_eq!(follower.map().tablets("big"), &bigs[..]);

    // Half a table left by a dead leader: not in the map; then assigned whole.
    let half = meta.create_table(schema("half", &splits)).await.unwrap();
    let keys = Keys::new("ns", "inst");
    let mut raw = etcd_client::Client::connect([etcd.url()], None)
        .await
        .unwrap();
    raw.put(keys.tablets_assigning("c1", "half"), "1", None)
        .await
        .unwrap();
    for t in &tablets(&half.schema, "s1")[..150] {
        let (key, value) = basalt_meta::records::encode_tablet(&keys, "c1", t);
        raw.put(key, value, None).await.unwrap();
    }
    catch_up(&meta, &mut follower, &mut stream).await;
    same(&follower, &meta.tablets("c1").await.unwrap().0);
    assert!(follower.map().tablets("half").is_empty());
    let halfs = tablets(&half.schema, "s2");
    assert!(
        meta.assign_table(&leader.term, "c1", "half", half.create_revision, &halfs)
            .await
            .unwrap()
    );
    catch_up(&meta, &mut follower, &mut stream).await;
    same(&follower, &meta.tablets("c1").await.unwrap().0);
    assert_eq!(follower.map().tablets("half"), &halfs[..]);

    // A registration: the servers changed, not the map.
    let registration = meta
        .register("c1", record("s9", "srv-9"), TIMING, always())
        .await
        .unwrap();
    let seen = catch_up(&meta, &mut follower, &mut stream).await;
    assert!(seen.servers && seen.tables.is_empty() && !seen.schemas);
    registration.unregister().await;

    // Tables deleted (one split, one of a thousand tablets): they leave the map.
    meta.delete_table("t", |_| Ok(())).await.unwrap();
    meta.delete_table("big", |_| Ok(())).await.unwrap();
    let seen = catch_up(&meta, &mut follower, &mut stream).await;
    assert!(seen.schemas);
    let (map, _) = meta.tablets("c1").await.unwrap();
    same(&follower, &map);
    assert_eq!(map.tables().collect::<Vec<_>>(), ["half"]);
    leader.resign().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn change_tablet_refuses_when_the_record_changed() {
    let etcd = Etcd::start().await;
    let meta = meta(&etcd).await;
    let leader = meta.campaign("m1", TTL).await.unwrap();
    let t = meta.create_table(schema("t", &["g"])).await.unwrap();
    let ts = tablets(&t.schema, "s0");
    assert!(
        meta.assign_table(&leader.term, "c1", "t", t.create_revision, &ts)
            .await
            .unwrap()
    );
    let old = ts[1].clone();
    let lost = Tablet {
        state: TabletState::Lost,
        ..old.clone()
    };
    assert!(
        meta.change_tablet(&leader.term, "c1", &old, &lost)
            .await
            .unwrap()
    );
    // A second change from the same (now stale) record is refused.
    let moved = Tablet {
        owner: "s1".into(),
        epoch: 2,
        ..old.clone()
    };
    assert!(
        !meta
            .change_tablet(&leader.term, "c1", &old, &moved)
            .await
            .unwrap()
    );
    let (map, _) = meta.tablets("c1").await.unwrap();
    assert_eq!(map.tablets("t")[1], lost);
    assert_eq!(map.tablets("t")[0], ts[0]);
    // Two different tablets cannot be swapped for one another.
    assert!(
        meta.change_tablet(&leader.term, "c1", &ts[0], &lost)
            .await
            .is_err()
    );
    // A stale term changes nothing.
    let term = leader.term.clone();
    leader.resign().await;
    let back = Tablet {
        state: TabletState::Serving,
        ..lost.clone()
    };
    assert!(!meta.change_tablet(&term, "c1", &lost, &back).await.unwrap());
    assert_eq!(meta.tablets("c1").await.unwrap().0.tablets("t")[1], lost);
}

// --- registrations and the serving deadline ------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_that_stops_renewing_stops_serving_then_disappears() {
    let etcd = Etcd::start().await;
    let meta = meta(&etcd).await;
    let renewing = Arc::new(AtomicBool::new(true));
    let can_renew = {
        let renewing = renewing.clone();
        Arc::new(move || renewing.load(Ordering::SeqCst))
    };
    let reg = meta
        .register("c1", record("st-1", "c1-0"), TIMING, can_renew)
        .await
        .unwrap();
    let live = reg.liveness();
    assert_ne!(live.lease, 0);
    assert!(live.serving(Instant::now()));
    assert_eq!(registered(&meta, "st-1").await, Some(live.lease));
    let (servers, _) = meta.servers(None).await.unwrap();
    assert_eq!(servers[0].cluster, "c1");
    assert_eq!(servers[0].record, record("st-1", "c1-0"));

    // Renewing keeps it serving well past one TTL.
    tokio::time::sleep(TTL * 2).await;
    assert!(reg.liveness().serving(Instant::now()));
    assert_eq!(registered(&meta, "st-1").await, Some(live.lease));

    // It can no longer renew (a stalled disk): it stops serving on its own by its deadline,
    // which is at most TTL + grace after the last renewal; etcd deletes the key after the TTL.
    renewing.store(false, Ordering::SeqCst);
    let stopped = Instant::now();
    let deadline = reg.liveness().serving_until.unwrap();
    assert!(deadline <= stopped + TIMING.ttl + TIMING.grace + Duration::from_millis(50));
    eventually(TTL * 3, "the deadline passes", || async {
        !reg.liveness().serving(Instant::now())
    })
    .await;
    eventually(TTL * 3, "etcd deletes the registration", || async {
        registered(&meta, "st-1").await.is_none()
    })
    .await;
    // The deadline never comes after etcd's expiry plus the grace.
    assert!(deadline <= Instant::now() + TIMING.grace);

    // Dropping a registration stops renewing it too.
    let reg2 = meta
        .register("c1", record("st-2", "c1-1"), TIMING, always())
        .await
        .unwrap();
    drop(reg2);
    assert!(registered(&meta, "st-2").await.is_some());
    eventually(TTL * 3, "a dropped registration expires", || async {
        registered(&meta, "st-2").await.is_none()
    })
    .await;
    drop(reg);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unregister_deletes_the_key_now() {
    let etcd = Etcd::start().await;
    let meta = meta(&etcd).await;
    let reg = meta
        .register("c1", record("st-1", "c1-0"), TIMING, always())
        .await
        .unwrap();
    assert!(registered(&meta, "st-1").await.is_some());
    reg.unregister().await;
    assert!(registered(&meta, "st-1").await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_etcd_pause_stops_nothing() {
    let etcd = Etcd::start().await;
    let meta = meta(&etcd).await;
    // A 3 s lease renewed every second: a pause of 1.5 s ends before it can expire.
    let timing = LeaseTiming {
        ttl: Duration::from_secs(3),
        ..TIMING
    };
    let reg = meta
        .register("c1", record("st-1", "c1-0"), timing, always())
        .await
        .unwrap();
    let lease = reg.liveness().lease;
    // Pause etcd right after a renewal, for less than the TTL.
    let mut changes = reg.subscribe();
    changes.borrow_and_update();
    tokio::time::timeout(Duration::from_secs(3), changes.changed())
        .await
        .expect("a renewal within a TTL")
        .unwrap();
    etcd.pause();
    let paused = Instant::now();
    let before = reg.liveness().serving_until.unwrap();
    while paused.elapsed() < Duration::from_millis(1500) {
        assert!(
            reg.liveness().serving(Instant::now()),
            "stopped serving during a short pause"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    etcd.resume();
    eventually(TTL * 3, "renews after etcd resumed", || async {
        reg.liveness().serving_until.unwrap() > before + Duration::from_millis(500)
    })
    .await;
    assert!(reg.liveness().serving(Instant::now()));
    assert_eq!(reg.liveness().lease, lease, "the same lease, renewed");
    assert_eq!(registered(&meta, "st-1").await, Some(lease));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_its_lease_expired_a_server_registers_again_under_a_new_lease() {
    let etcd = Etcd::start().await;
    let meta = meta(&etcd).await;
    let reg = meta
        .register("c1", record("st-1", "c1-0"), TIMING, always())
        .await
        .unwrap();
    let lease = reg.liveness().lease;
    // etcd paused for longer than TTL + grace: the server stops serving by its deadline and
    // the lease expires in etcd's eyes (its clock ran on) as soon as etcd resumes.
    etcd.pause();
    eventually(TTL * 3, "stops serving while etcd is paused", || async {
        !reg.liveness().serving(Instant::now())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    etcd.resume();
    eventually(
        Duration::from_secs(10),
        "registers again under a new lease",
        || async { reg.liveness().lease != lease && reg.liveness().serving(Instant::now()) },
    )
    .await;
    let new = reg.liveness().lease;
    eventually(TTL * 2, "the key is bound to the new lease", || async {
        registered(&meta, "st-1").await == Some(new)
    })
    .await;
    // And it keeps renewing the new one.
    tokio::time::sleep(TTL * 2).await;
    assert_eq!(registered(&meta, "st-1").await, Some(new));
    assert!(reg.liveness().serving(Instant::now()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrations_survive_an_etcd_restart() {
    let mut etcd = Etcd::start().await;
    let meta = meta(&etcd).await;
    let reg = meta
        .register("c1", record("st-1", "c1-0"), TIMING, always())
        .await
        .unwrap();
    let t = meta.create_table(schema("t", &[])).await.unwrap();
    etcd.restart().await;
    // The same client reconnects; the data and the lease survived.
    eventually(
        Duration::from_secs(10),
        "reads after the restart",
        || async {
            matches!(meta.table("t").await, Ok(Some(s)) if s.create_revision == t.create_revision)
        },
    )
    .await;
    eventually(TTL * 3, "the registration is still there", || async {
        matches!(meta.servers(Some("c1")).await, Ok((s, _)) if s.len() == 1)
    })
    .await;
    assert!(reg.liveness().serving(Instant::now()));
}

// --- the master's election -----------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_candidate_waits_for_the_first_to_resign() {
    let etcd = Etcd::start().await;
    let meta = meta(&etcd).await;
    let first = meta.campaign("m1", TTL).await.unwrap();
    let second = {
        let meta = meta.clone();
        tokio::spawn(async move { meta.campaign("m2", TTL).await })
    };
    // It waits while the first leads and renews, beyond the client's request timeout.
    tokio::time::sleep(Duration::from_secs(6)).await;
    if second.is_finished() {
        panic!(
            "two leaders at once: {:?}",
            second.await.unwrap().map(|l| l.term.clone())
        );
    }
    assert!(!first.is_lost());
    let term = first.term.clone();
    first.resign().await;
    let second = tokio::time::timeout(Duration::from_secs(5), second)
        .await
        .expect("elected soon after the first resigned")
        .unwrap()
        .unwrap();
    assert!(second.term.revision > term.revision);
    second.resign().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_stops_renewing_is_replaced_after_its_ttl() {
    let etcd = Etcd::start().await;
    let meta = meta(&etcd).await;
    let first = meta.campaign("m1", TTL).await.unwrap();
    let term = first.term.clone();
    // Dropping the leadership stops renewing without resigning: like a crashed master.
    drop(first);
    let started = Instant::now();
    let second = tokio::time::timeout(TTL * 4, meta.campaign("m2", TTL))
        .await
        .expect("elected once the first lease expired")
        .unwrap();
    assert!(
        started.elapsed() >= TTL / 2,
        "elected before the first lease expired"
    );
    assert!(second.term.revision > term.revision);
    // The first term's transactions are fenced off.
    let t = meta.create_table(schema("t", &[])).await.unwrap();
    let ts = tablets(&t.schema, "s0");
    assert!(
        !meta
            .assign_table(&term, "c1", "t", t.create_revision, &ts)
            .await
            .unwrap()
    );
    assert!(
        meta.assign_table(&second.term, "c1", "t", t.create_revision, &ts)
            .await
            .unwrap()
    );
    second.resign().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_etcd_learns_it_lost() {
    let etcd = Etcd::start().await;
    let meta = meta(&etcd).await;
    let mut leader = meta.campaign("m1", TTL).await.unwrap();
    etcd.pause();
    tokio::time::timeout(TTL * 4, leader.lost())
        .await
        .expect("the leadership is reported lost within a few TTLs");
    assert!(leader.is_lost());
    etcd.resume();
    // Another candidate is elected (the old lease expired meanwhile).
    let next = tokio::time::timeout(TTL * 4, meta.campaign("m2", TTL))
        .await
        .expect("a new leader")
        .unwrap();
    assert_ne!(next.term, leader.term);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepted_losses_are_listed_per_cluster_and_cleared_by_the_leader_only() {
    let etcd = Etcd::start().await;
    let meta = meta(&etcd).await;
    meta.accept_loss("c1", "st-1").await.unwrap();
    meta.accept_loss("c1", "st-2").await.unwrap();
    meta.accept_loss("c2", "st-9").await.unwrap();
    assert_eq!(meta.accepted_losses("c1").await.unwrap(), ["st-1", "st-2"]);
    assert_eq!(meta.accepted_losses("c2").await.unwrap(), ["st-9"]);
    assert!(meta.accepted_losses("c3").await.unwrap().is_empty());
    // They are neither servers nor tablets.
    assert!(meta.servers(None).await.unwrap().0.is_empty());
    assert!(
        meta.tablets("c1")
            .await
            .unwrap()
            .0
            .tables()
            .next()
            .is_none()
    );
    let leader = meta.campaign("m1", TTL).await.unwrap();
    assert!(
        meta.clear_accepted_loss(&leader.term, "c1", "st-1")
            .await
            .unwrap()
    );
    assert_eq!(meta.accepted_losses("c1").await.unwrap(), ["st-2"]);
    let stale = leader.term.clone();
    leader.resign().await;
    assert!(
        !meta
            .clear_accepted_loss(&stale, "c1", "st-2")
            .await
            .unwrap()
    );
    assert_eq!(meta.accepted_losses("c1").await.unwrap(), ["st-2"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_campaign_leaves_no_candidate_behind() {
    let etcd = Etcd::start().await;
    let meta = meta(&etcd).await;
    let first = meta.campaign("m1", TTL).await.unwrap();
    // A second candidate gives up waiting (its future is dropped).
    let gave_up = tokio::time::timeout(Duration::from_secs(1), meta.campaign("m2", TTL)).await;
    assert!(gave_up.is_err());
    first.resign().await;
    // The next candidate is elected at once: nobody queued before it is left.
    let third = tokio::time::timeout(Duration::from_secs(2), meta.campaign("m3", TTL))
        .await
        .expect("elected without waiting for the cancelled candidate's lease")
        .unwrap();
    third.resign().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_cluster_is_reached_at_its_peer_endpoint_else_at_its_servers() {
    let etcd = Etcd::start().await;
    let meta = meta(&etcd).await;
    let address = |store: &str, name: &str, port: u16| ServerRecord {
        address: format!("127.0.0.1:{port}"),
        ..record(store, name)
    };
    let _a = meta
        .register("c1", address("st-1", "c1-0", 4001), TIMING, always())
        .await
        .unwrap();
    let _b = meta
        .register("c10", address("st-2", "c10-0", 4002), TIMING, always())
        .await
        .unwrap();
    // No endpoint: the cluster's own servers (not those of a cluster whose name extends it).
    assert_eq!(meta.peer_addresses("c1").await.unwrap(), ["127.0.0.1:4001"]);
    assert!(meta.peer_addresses("c2").await.unwrap().is_empty());
    meta.set_peer_endpoint("c1", Some("gw-c1:443"))
        .await
        .unwrap();
    assert_eq!(meta.peer_addresses("c1").await.unwrap(), ["gw-c1:443"]);
    assert_eq!(
        meta.peer_addresses("c10").await.unwrap(),
        ["127.0.0.1:4002"]
    );
    assert_eq!(
        meta.peer_endpoints().await.unwrap(),
        [("c1".to_string(), "gw-c1:443".to_string())].into()
    );
    meta.set_peer_endpoint("c1", None).await.unwrap();
    assert_eq!(meta.peer_addresses("c1").await.unwrap(), ["127.0.0.1:4001"]);
    // A cluster that leaves the instance loses its endpoint.
    meta.set_peer_endpoint("c10", Some("gw-c10:443"))
        .await
        .unwrap();
    // Its removal mark too: the first mark stands (a runtime marks it again each pass).
    meta.mark_removing("c10", 5).await.unwrap();
    meta.mark_removing("c10", 9).await.unwrap();
    assert_eq!(
        meta.removing().await.unwrap(),
        [("c10".to_string(), 5)].into()
    );
    meta.remove_replica("c10").await.unwrap();
    assert_eq!(meta.peer_endpoint("c10").await.unwrap(), None);
    assert!(meta.removing().await.unwrap().is_empty());
}
