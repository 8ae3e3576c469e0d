//! Seeding a cluster that joined an instance with data (`docs/replication.md`, "Adding a
//! cluster"): the master copies every table from one READY cluster into it, while both take
//! writes, then the new cluster is READY.
//!
//! The record `seeds/<c>` (written with the cluster's number, `basalt_meta::SeedRecord`) says
//! where it stands, and [`next_step`] (pure) decides on it:
//!
//! 1. **waiting** until every registered server of the other clusters has logged for `<c>`
//!    (its `shipped/<store>/<c>` record exists: its change log is on with a cursor for `<c>`).
//!    From then on every write anywhere reaches `<c>` through the logs.
//! 2. **listing**: the tables that exist then are recorded, each to be copied from the first
//!    row, from a source cluster (a replica that is itself READY).
//! 3. **copying**, one task per seeded cluster ([`copy`]): table after table, tablet after
//!    tablet of the source's map, the tablet's owner reads a few MiB of rows as stored
//!    (`ReadSeed`) and any server of `<c>` applies them (`Apply`, routed to the owners there),
//!    then the record moves past them. A failure retries from the record, so the copy resumes
//!    where it was after a master failover. Rows copied and also shipped by a log are applied
//!    once in effect (last write wins on the version).
//! 4. **done**: the record is deleted; GetTable shows the cluster READY for every table and
//!    consistency tokens can turn true.
//!
//! The instance's `seedBytesPerSecond` (etcd's `replication-limits`, read at every step) paces
//! each cluster's copy with a token bucket ([`basalt_master::model::rate::TokenBucket`]): a
//! step reads at most one second of it, and waits before applying what it read.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use basalt_control::replication_client;
use basalt_control::v1::{ApplyRequest, ReadSeedRequest, ReplicatedTableRows};
use basalt_master::model::rate::TokenBucket;
use basalt_meta::keys::{hex, unhex};
use basalt_meta::{Meta, Registered, SeedRecord, ShippedRecord, Term};
use basalt_transport::Dialer;
use tracing::{info, warn};

/// About how many stored bytes one copy step reads and applies.
pub const CHUNK_BYTES: u64 = 4 << 20;
/// How long one read or apply of a copy step may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

/// What the master does next about one seeded cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SeedStep {
    /// Nothing yet, and why.
    Wait(String),
    /// Record the tables to copy, from `source`.
    List { source: String },
    /// Copy (on), from `source` (a different one than recorded when that one left or is
    /// itself being seeded).
    Copy { source: String },
    /// Every table is copied: the cluster is READY.
    Done,
}

/// A cluster to copy into `target` from: `preferred` if it still is one, else the first in
/// name order that is a replica, not `target`, and not being seeded itself (READY). Pure.
pub fn ready_source(
    target: &str,
    preferred: Option<&String>,
    numbers: &BTreeMap<String, u16>,
    seeds: &BTreeMap<String, SeedRecord>,
) -> Option<String> {
    let ready = |c: &String| c != target && !seeds.contains_key(c);
    match preferred {
        Some(p) if numbers.contains_key(p) && ready(p) => Some(p.clone()),
        _ => numbers.keys().find(|c| ready(c)).cloned(),
    }
}

/// The next step of `record` (pure): `numbers` are the replicas, `seeds` every record,
/// `servers` the registered (cluster, store id)s, `shipped` the logs' positions.
pub fn next_step(
    record: &SeedRecord,
    numbers: &BTreeMap<String, u16>,
    seeds: &BTreeMap<String, SeedRecord>,
    servers: &[(String, String)],
    shipped: &[ShippedRecord],
) -> SeedStep {
    let target = &record.cluster;
    let source = |preferred: Option<&String>| ready_source(target, preferred, numbers, seeds);
    if record.waiting() {
        for (cluster, store) in servers {
            if cluster == target || !numbers.contains_key(cluster) {
                continue;
            }
            let logged = shipped
                .iter()
                .any(|s| &s.store_id == store && &s.peer == target);
            if !logged {
                return SeedStep::Wait(format!(
                    "server {store} of cluster {cluster} does not log for {target} yet"
                ));
            }
        }
        return match source(None) {
            Some(source) => SeedStep::List { source },
            None => SeedStep::Wait("no READY cluster to copy from".into()),
        };
    }
    if record.done() {
        return SeedStep::Done;
    }
    match source(record.source.as_ref()) {
        Some(source) => SeedStep::Copy { source },
        None => SeedStep::Wait("no READY cluster to copy from".into()),
    }
}

/// Carries out the seeds' steps; starts a copy task per seeded cluster that needs one
/// (`running` holds them; a task ends when its record is gone or no longer copying).
pub async fn pass(
    meta: &Meta,
    term: &Term,
    dialer: &Dialer,
    table_ids: &[String],
    servers: &[Registered],
    running: &mut HashMap<String, tokio::task::JoinHandle<()>>,
) -> basalt_master::model::Result<()> {
    running.retain(|_, task| !task.is_finished());
    let seeds = meta.seeds().await?;
    if seeds.is_empty() {
        return Ok(());
    }
    let numbers = meta.cluster_numbers().await?;
    let shipped = meta.shipped().await?;
    let registered: Vec<(String, String)> = servers
        .iter()
        .map(|s| (s.cluster.clone(), s.record.store_id.to_string()))
        .collect();
    for record in seeds.values() {
        match next_step(record, &numbers, &seeds, &registered, &shipped) {
            SeedStep::Wait(_) => {}
            SeedStep::List { source } => {
                let mut r = record.clone();
                r.tables = table_ids
                    .iter()
                    .map(|t| (t.clone(), String::new()))
                    .collect();
                r.source = Some(source.clone());
                let done = r.done();
                if meta.update_seed(term, &r, done).await? {
                    info!(
                        cluster = r.cluster,
                        source,
                        tables = r.tables.len(),
                        "every other server logs for the new cluster: copying its tables"
                    );
                }
            }
            SeedStep::Copy { source } => {
                if record.source.as_ref() != Some(&source) {
                    let mut r = record.clone();
                    r.source = Some(source.clone());
                    meta.update_seed(term, &r, false).await?;
                    continue; // the task reads the record again
                }
                if !running.contains_key(&record.cluster) {
                    let (meta, term, dialer, cluster) = (
                        meta.clone(),
                        term.clone(),
                        dialer.clone(),
                        record.cluster.clone(),
                    );
                    running.insert(
                        record.cluster.clone(),
                        tokio::spawn(async move { copy(&meta, &term, &dialer, &cluster).await }),
                    );
                }
            }
            SeedStep::Done => {
                if meta.update_seed(term, record, true).await? {
                    info!(
                        cluster = record.cluster,
                        rows = record.rows,
                        bytes = record.bytes,
                        "the cluster holds every table and range it was seeded with: READY"
                    );
                }
            }
        }
    }
    Ok(())
}

/// What one copy step did.
enum Stepped {
    /// The record moved on (or changed under us): go on.
    On,
    /// The record is gone or not copying: the task ends.
    Ended,
}

/// Copies `cluster`'s tables from its source until its record is done or gone.
async fn copy(meta: &Meta, term: &Term, dialer: &Dialer, cluster: &str) {
    let mut backoff = BACKOFF_FIRST;
    let mut failures = 0u32;
    let mut next_server = 0usize;
    let mut bucket = TokenBucket::new(None, std::time::Instant::now());
    loop {
        match copy_step(meta, term, dialer, cluster, &mut next_server, &mut bucket).await {
            Ok(Stepped::On) => {
                backoff = BACKOFF_FIRST;
                failures = 0;
            }
            Ok(Stepped::Ended) => return,
            Err(e) => {
                failures += 1;
                if failures == 1 || failures.is_power_of_two() {
                    warn!(cluster, failures, error = %e, "a seeding step failed; trying again");
                }
                next_server = next_server.wrapping_add(1);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
        }
    }
}

/// One step: the next rows of the first table left, from the source tablet that holds them,
/// applied in `cluster`; then the record moves past them (fenced by the term).
async fn copy_step(
    meta: &Meta,
    term: &Term,
    dialer: &Dialer,
    cluster: &str,
    next_server: &mut usize,
    bucket: &mut TokenBucket,
) -> Result<Stepped, String> {
    let e = |e: basalt_master::model::Error| e.to_string();
    let Some(mut record) = meta.seeds().await.map_err(e)?.remove(cluster) else {
        return Ok(Stepped::Ended);
    };
    let limits = meta.replication_limits().await.map_err(e)?;
    bucket.set_rate(limits.seed_bytes_per_second, std::time::Instant::now());
    let Some(source) = record.source.clone() else {
        return Ok(Stepped::Ended);
    };
    // The tables first (whole), then the ranges (a re-seed), each from where it stands.
    let (table, from, until) = match record.tables.iter().next() {
        Some((t, f)) => (t.clone(), f.clone(), None),
        None => match record.ranges.first() {
            Some(r) => (r.table.clone(), r.next.clone(), r.end.clone()),
            None => return Ok(Stepped::Ended),
        },
    };
    let whole = until.is_none() && record.tables.contains_key(&table);
    let until = match until {
        Some(end) => Some(unhex(&end).ok_or_else(|| format!("bad range end {end:?}"))?),
        None => None,
    };
    let start = unhex(&from).ok_or_else(|| format!("bad resume key {from:?}"))?;
    let finish = |record: &mut SeedRecord| {
        if whole {
            record.tables.remove(&table);
        } else if !record.ranges.is_empty() {
            record.ranges.remove(0);
        }
    };
    let moved_to = |record: &mut SeedRecord, next: &[u8]| {
        if whole {
            record.tables.insert(table.clone(), hex(next));
        } else if let Some(r) = record.ranges.first_mut() {
            r.next = hex(next);
        }
    };
    if meta.table(&table).await.map_err(e)?.is_none() {
        // Deleted since: nothing to copy (every cluster deletes it).
        finish(&mut record);
        let done = record.done();
        meta.update_seed(term, &record, done).await.map_err(e)?;
        return Ok(Stepped::On);
    }
    let (tablets, _) = meta.tablets(&source).await.map_err(e)?;
    let tablet = tablets
        .tablet_for(&table, &start)
        .cloned()
        .ok_or_else(|| format!("table {table} has no tablets in cluster {source} yet"))?;
    let (registered, _) = meta.servers(None).await.map_err(e)?;
    let owner = registered
        .iter()
        .find(|s| s.cluster == source && s.record.store_id == tablet.owner)
        .ok_or_else(|| format!("the owner of a tablet of {table} in {source} is not registered"))?;
    let targets: Vec<&Registered> = registered.iter().filter(|s| s.cluster == cluster).collect();
    if targets.is_empty() {
        return Err(format!("cluster {cluster} has no registered server yet"));
    }
    // The end of this read: the tablet's, or the range's if that comes first.
    let end = match (tablet.range.end.clone(), until.clone()) {
        (Some(t), Some(u)) => Some(if u < t { u.into() } else { t }),
        (t, None) => t,
        (None, Some(u)) => Some(u.into()),
    };
    let range_done_at_end = |end: &Option<bytes::Bytes>| match (end, &until) {
        (None, _) => true,
        (Some(e), Some(u)) => e[..] >= u[..],
        (Some(_), None) => false,
    };
    let read = replication_client(dialer, &owner.record.address, CALL_TIMEOUT)
        .map_err(|e| e.to_string())?
        .read_seed(ReadSeedRequest {
            table: table.clone(),
            start_key: start.into(),
            end_key: end.clone().unwrap_or_default(),
            max_bytes: bucket.batch_bytes(CHUNK_BYTES),
        })
        .await
        .map_err(|s| format!("reading from {}: {}", owner.record.address, s.message()))?
        .into_inner();
    let rows = read.rows.len() as u64;
    if rows > 0 {
        let sent: u64 = read.rows.iter().map(|r| r.len() as u64).sum();
        let wait = bucket.take(sent, std::time::Instant::now());
        if !wait.is_zero() {
            crate::metrics::seed_throttled(
                [meta.keys().namespace(), meta.keys().instance(), cluster],
                wait.as_secs_f64(),
            );
            tokio::time::sleep(wait).await;
        }
        let target = &targets[*next_server % targets.len()].record.address;
        replication_client(dialer, target, CALL_TIMEOUT)
            .map_err(|e| e.to_string())?
            .apply(ApplyRequest {
                origin_cluster: source.clone(),
                tables: vec![ReplicatedTableRows {
                    table: table.clone(),
                    rows: read.rows,
                }],
                routed: false,
            })
            .await
            .map_err(|s| format!("applying at {target}: {}", s.message()))?;
        crate::metrics::seed_copied(
            [meta.keys().namespace(), meta.keys().instance(), cluster],
            &source,
            sent,
        );
    }
    record.rows += rows;
    record.bytes += read.bytes;
    match read.resume_key {
        Some(resume) => moved_to(&mut record, &resume),
        None if range_done_at_end(&end) => {
            finish(&mut record);
            info!(cluster, %table, %source, "a table's rows are copied");
        }
        None => moved_to(&mut record, end.as_deref().unwrap_or_default()),
    }
    let done = record.done();
    // Refused: the term ended or the record changed (another source); read again.
    if meta.update_seed(term, &record, done).await.map_err(e)? && done {
        info!(
            cluster,
            rows = record.rows,
            bytes = record.bytes,
            seconds = (basalt_master::model::hlc::now_micros() - record.started_micros) / 1_000_000,
            "the cluster holds every table and range it was seeded with: READY"
        );
        return Ok(Stepped::Ended);
    }
    Ok(Stepped::On)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(cluster: &str, source: Option<&str>, tables: &[&str]) -> SeedRecord {
        SeedRecord {
            cluster: cluster.into(),
            source: source.map(String::from),
            tables: tables
                .iter()
                .map(|t| (t.to_string(), String::new()))
                .collect(),
            ranges: vec![],
            rows: 0,
            bytes: 0,
            started_micros: 0,
            mod_revision: 1,
        }
    }

    fn shipped(store: &str, cluster: &str, peer: &str) -> ShippedRecord {
        ShippedRecord {
            store_id: store.into(),
            cluster: cluster.into(),
            peer: peer.into(),
            acked_seq: 0,
            logged_seq: 0,
            lag_micros: 0,
            reported_micros: 0,
            acked_hlc: 0,
        }
    }

    fn numbers(clusters: &[&str]) -> BTreeMap<String, u16> {
        clusters
            .iter()
            .enumerate()
            .map(|(i, c)| (c.to_string(), i as u16 + 1))
            .collect()
    }

    fn servers(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(c, s)| (c.to_string(), s.to_string()))
            .collect()
    }

    #[test]
    fn a_new_cluster_waits_for_every_other_server_to_log_for_it() {
        let c = record("c", None, &[]);
        let seeds: BTreeMap<String, SeedRecord> = [("c".to_string(), c.clone())].into();
        let n = numbers(&["a", "b", "c"]);
        let s = servers(&[("a", "a0"), ("a", "a1"), ("b", "b0"), ("c", "c0")]);
        let mut logs = vec![shipped("a0", "a", "c"), shipped("b0", "b", "c")];
        assert!(matches!(
            next_step(&c, &n, &seeds, &s, &logs),
            SeedStep::Wait(why) if why.contains("a1")
        ));
        // A position towards another peer does not count.
        logs.push(shipped("a1", "a", "b"));
        assert!(matches!(
            next_step(&c, &n, &seeds, &s, &logs),
            SeedStep::Wait(_)
        ));
        logs.push(shipped("a1", "a", "c"));
        assert_eq!(
            next_step(&c, &n, &seeds, &s, &logs),
            SeedStep::List { source: "a".into() }
        );
    }

    #[test]
    fn the_source_is_a_ready_replica_and_changes_when_it_leaves() {
        let b = record("b", None, &[]);
        let c = record("c", Some("a"), &["1", "2"]);
        let seeds: BTreeMap<String, SeedRecord> =
            [("b".to_string(), b.clone()), ("c".to_string(), c.clone())].into();
        // b is being seeded itself: never a source.
        assert_eq!(
            next_step(&b, &numbers(&["a", "b", "c"]), &seeds, &[], &[]),
            SeedStep::List { source: "a".into() }
        );
        assert_eq!(
            next_step(&c, &numbers(&["a", "b", "c"]), &seeds, &[], &[]),
            SeedStep::Copy { source: "a".into() }
        );
        // a left the instance: c goes on from d.
        assert_eq!(
            next_step(&c, &numbers(&["b", "c", "d"]), &seeds, &[], &[]),
            SeedStep::Copy { source: "d".into() }
        );
        // Nobody READY: wait.
        assert!(matches!(
            next_step(&c, &numbers(&["b", "c"]), &seeds, &[], &[]),
            SeedStep::Wait(_)
        ));
        let done = record("c", Some("a"), &[]);
        assert_eq!(
            next_step(&done, &numbers(&["a", "c"]), &seeds, &[], &[]),
            SeedStep::Done
        );
        // A re-seed of ranges (no table left) is not done until the ranges are copied.
        let mut reseed = done.clone();
        reseed.ranges.push(basalt_meta::SeedRange {
            table: "1".into(),
            next: String::new(),
            end: Some("6d".into()),
        });
        assert!(reseed.covers("1") && !reseed.covers("2"));
        assert_eq!(
            next_step(&reseed, &numbers(&["a", "c"]), &seeds, &[], &[]),
            SeedStep::Copy { source: "a".into() }
        );
    }
}
