//! Shipping this server's change log to the other clusters of the instance.
//!
//! [`spawn`] follows the instance's clusters (a cluster replicates once it has a number in
//! etcd), and keeps the store's replication safe point current ([`super::safe_point`]). While
//! there is a peer, the change log is on; each peer cluster gets its own task
//! ([`ship`]), with its own cursor in the store: a slow or unreachable peer delays only its
//! own shipping, and holds the log back only by its own cursor (bounded by the retention,
//! after which it needs a re-seed). A peer that leaves the instance loses its cursor.
//!
//! A task reads the log after its cursor, sends the entries (as rows with their versions) to
//! the peer cluster — at its peer endpoint if it has one, else to any of its servers
//! ([`basalt_meta::Meta::peer_addresses`]) — and moves the cursor only once the server that
//! took them answered that every row is durable in its cluster. Any error sends the same
//! entries again (to the next address): applying is idempotent. Idle, it reports its position
//! every few seconds (a heartbeat the consistency tokens and the lag metrics read), and tells
//! the store every minute that its peer is alive (the retention counts from then). Busy, it reports at most every 100 ms,
//! except that entries logged after a report that said the peer had them all are reported
//! before they are sent: no report claims the log shipped while a batch is on its way.
//!
//! **Rate limit.** The instance's `shipBytesPerSecond` (etcd's `replication-limits`, read with
//! the clusters) bounds what a cluster ships to each other cluster; each server takes an even
//! share of it ([`share`]) and paces each peer's batches with its own token bucket
//! ([`basalt_model::rate::TokenBucket`]). The limit is per destination cluster, not per table:
//! a peer's entries ship in log order behind one cursor, so a table held back alone would
//! hold back every table logged after it. The bytes and the time waited are counted per
//! table (`basalt_replication_bytes_total`, `basalt_replication_throttled_seconds_total`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use basalt_control::replication_client;
use basalt_control::v1::{ApplyRequest, ReplicatedTableRows};
use basalt_meta::ShippedRecord;
use basalt_model::hlc::now_micros;
use basalt_model::rate::TokenBucket;
use basalt_storage::{LogEntry, LogWatermark};
use prost::Message;
use tokio::time::Instant;
use tracing::{info, warn};

use super::safe_point::{self, SAFE_POINT_EVERY};
use super::{consumer, encode_row};
use crate::cluster::Node;

/// How often the instance's clusters are read.
const TOPOLOGY_EVERY: Duration = Duration::from_secs(1);
/// How often the log is truncated below every peer's cursor (more often with a retention
/// under 20 s, see [`truncate_every`]). Each truncation is one range deletion, which stays in
/// the log's memtable until it is flushed and which every read of the log (a shipper's poll)
/// steps over: far more often would pile thousands of them into the memtable of a server that
/// writes a little all the time.
const TRUNCATE_EVERY: Duration = Duration::from_secs(10);
/// How often a busy shipper reads again where its peer cluster is reached.
const ADDRESSES_EVERY: Duration = Duration::from_secs(10);
/// How long an idle shipper waits before it reads the log again.
const IDLE_POLL: Duration = Duration::from_millis(20);
/// The most encoded log bytes one batch carries (less under a rate limit: one second of it).
const BATCH_BYTES: u64 = 4 << 20;
/// How long one batch may take to be applied in the peer cluster.
const APPLY_TIMEOUT: Duration = Duration::from_secs(30);
/// Retry delays after a failed batch.
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// How often the position is written to etcd: at most this often while shipping, at least
/// this often (a heartbeat) while idle.
const REPORT_MIN: Duration = Duration::from_millis(100);
const HEARTBEAT: Duration = Duration::from_secs(2);
/// How often an idle shipper tells the store its peer is alive (the cursor, unchanged): a peer
/// not heard from within the retention stops holding the log back (more often with a
/// retention under 4 minutes, see [`cursor_refresh`]).
const CURSOR_REFRESH: Duration = Duration::from_secs(60);

fn truncate_every(retention: Duration) -> Duration {
    TRUNCATE_EVERY.min(retention / 2)
}

fn cursor_refresh(retention: Duration) -> Duration {
    CURSOR_REFRESH.min(retention / 4)
}

/// One server's share of the instance's shipping limit to each peer cluster, in bytes per
/// second (0: unlimited): the limit split evenly over the `servers` registered in its cluster,
/// so that together they never ship faster than the limit. Pure.
pub fn share(limit: Option<u64>, servers: usize) -> u64 {
    match limit {
        Some(limit) if limit > 0 => (limit / servers.max(1) as u64).max(1),
        _ => 0,
    }
}

/// Reads the instance's shipping limit and the servers of this cluster, and sets this
/// server's [`share`] of it.
async fn refresh_ship_rate(node: &Node) -> Result<(), String> {
    let limits = node
        .meta
        .replication_limits()
        .await
        .map_err(|e| e.to_string())?;
    let servers = match limits.ship_bytes_per_second {
        Some(_) => node
            .meta
            .servers(Some(&node.config.cluster))
            .await
            .map_err(|e| e.to_string())?
            .0
            .len(),
        None => 1,
    };
    let rate = share(limits.ship_bytes_per_second, servers);
    let before = node
        .ship_rate
        .swap(rate, std::sync::atomic::Ordering::Relaxed);
    if before != rate {
        info!(
            bytes_per_second = rate,
            servers, "this server's share of the shipping rate limit (0: unlimited)"
        );
    }
    Ok(())
}

/// This server's share of the shipping limit, as the follower last set it (None: unlimited).
fn ship_rate(node: &Node) -> Option<u64> {
    Some(node.ship_rate.load(std::sync::atomic::Ordering::Relaxed)).filter(|r| *r > 0)
}

/// Follows the instance's clusters and ships the log to each other one, until the server ends.
pub fn spawn(node: Arc<Node>) {
    tokio::spawn(truncating(node.clone()));
    tokio::spawn(follow(node));
}

/// Truncates the log below every peer's cursor, until the server ends.
async fn truncating(node: Arc<Node>) {
    loop {
        let retention = node.config.change_log_retention;
        tokio::time::sleep(truncate_every(retention)).await;
        if let Err(e) = truncate(&node, retention).await {
            warn!(error = %e, "cannot truncate the change log");
        }
    }
}

/// How long a server that stops waits for its shippers to bring every peer cluster its whole
/// log (see [`ship_the_rest`]).
pub const SHIP_ON_STOP: Duration = Duration::from_secs(3);

/// Waits, at most `within`, until every other cluster has acknowledged this server's log to
/// its end, as its reports in etcd say (the shippers go on meanwhile). Called when the server
/// stops, after it stopped taking requests: no entry is logged any more, so the last reports
/// then describe the whole log — what a Cluster's removal (and a scale-in) decides on. True
/// when they do (or nothing replicates).
pub async fn ship_the_rest(node: &Node, within: Duration) -> bool {
    if !node.store.change_log_on() {
        return true;
    }
    let me = node.router.me().to_string();
    let mine = node.config.cluster.clone();
    let last = node.store.change_log_last_seq();
    let deadline = Instant::now() + within;
    loop {
        let peers: Vec<String> = node
            .replicas
            .read()
            .iter()
            .filter(|c| **c != mine)
            .cloned()
            .collect();
        if let Ok(records) = node.meta.shipped().await {
            let done = peers.iter().all(|peer| {
                records.iter().any(|r| {
                    r.store_id == me
                        && r.peer == *peer
                        && r.logged_seq >= last
                        && r.acked_seq >= last
                })
            });
            if done {
                info!(
                    last,
                    "every other cluster holds this server's whole change log"
                );
                return true;
            }
        }
        if Instant::now() >= deadline {
            warn!(
                last,
                ?peers,
                "stopping with change log entries another cluster has not acknowledged yet"
            );
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn follow(node: Arc<Node>) {
    let mine = node.config.cluster.clone();
    let mut shippers: HashMap<String, tokio::task::JoinHandle<()>> = HashMap::new();
    let mut safe_point_at: Option<Instant> = None;
    loop {
        match node.meta.cluster_numbers().await {
            Ok(numbers) => {
                *node.replicas.write() = numbers.keys().cloned().collect();
                let peers: BTreeSet<String> = numbers.into_keys().filter(|c| *c != mine).collect();
                if !peers.is_empty() && !node.store.change_log_on() {
                    info!(
                        ?peers,
                        "other clusters replicate: logging every write for them"
                    );
                    node.store.set_change_log(true);
                }
                for peer in &peers {
                    if !shippers.contains_key(peer) {
                        info!(peer, "shipping the change log to cluster {peer}");
                        shippers
                            .insert(peer.clone(), tokio::spawn(ship(node.clone(), peer.clone())));
                    }
                }
                let gone: Vec<String> = shippers
                    .keys()
                    .filter(|p| !peers.contains(*p))
                    .cloned()
                    .collect();
                for peer in gone {
                    info!(
                        peer,
                        "cluster {peer} left the instance: no more shipping to it"
                    );
                    if let Some(task) = shippers.remove(&peer) {
                        task.abort();
                    }
                    let store = node.store.clone();
                    let name = consumer(&peer);
                    let _ =
                        tokio::task::spawn_blocking(move || store.remove_log_cursor(&name)).await;
                }
            }
            Err(e) => warn!(error = %e, "cannot read the instance's clusters"),
        }
        match node.meta.seeds().await {
            Ok(seeds) => *node.seeding.write() = seeds,
            Err(e) => warn!(error = %e, "cannot read the clusters being seeded"),
        }
        if let Err(e) = refresh_ship_rate(&node).await {
            warn!(error = %e, "cannot read the instance's replication limits");
        }
        if safe_point_at.is_none_or(|at| at.elapsed() >= SAFE_POINT_EVERY) {
            safe_point_at = Some(Instant::now());
            if let Err(e) = safe_point::refresh(&node).await {
                warn!(error = %e, "cannot compute the replication safe point; tombstones wait");
            }
        }
        tokio::time::sleep(TOPOLOGY_EVERY).await;
    }
}

/// Deletes the log entries every peer acknowledged. A peer not heard from within `retention`
/// no longer holds the log back: before entries it never acknowledged go, it is marked for a
/// re-seed (its seed record, in etcd; the master copies every table into it from a READY
/// cluster), and its cursor moves past them — what they held reaches it through the copy.
/// Nothing is deleted while the mark cannot be written.
async fn truncate(node: &Arc<Node>, retention: Duration) -> Result<(), String> {
    let store = node.store.clone();
    let plan = tokio::task::spawn_blocking(move || store.change_log_truncation(retention))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    for name in &plan.stale {
        let Some(peer) = name.strip_prefix(super::CONSUMER_PREFIX) else {
            continue;
        };
        let created = node
            .meta
            .request_seed(peer)
            .await
            .map_err(|e| e.to_string())?;
        warn!(
            peer,
            retention_secs = retention.as_secs(),
            created,
            "cluster {peer} was not heard from within the change log's retention: it is to be re-seeded, and the log no longer waits for it"
        );
        let (store, name, through) = (node.store.clone(), name.clone(), plan.through);
        tokio::task::spawn_blocking(move || store.set_log_cursor(&name, through))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
    }
    let (store, through) = (node.store.clone(), plan.through);
    tokio::task::spawn_blocking(move || store.truncate_change_log_through(through))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())
}

/// The first version of the first entry of each table (its full name) among `entries` (in
/// log order): the oldest of that table in them, up to writes committed out of order. Entries
/// of tables deleted since are left out.
fn first_by_table(node: &Node, entries: &[(u64, LogEntry)]) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for (_, entry) in entries {
        if let Some(schema) = node.store.table_by_id(entry.table_id) {
            out.entry(schema.name.clone()).or_insert(entry.first.hlc);
        }
    }
    out
}

/// The request carrying `entries` (those of tables that still exist), by table; and the
/// bytes of rows it carries of each table (by its full name).
fn batch(node: &Node, entries: &[(u64, LogEntry)]) -> (ApplyRequest, Vec<(String, u64)>) {
    let mut tables: BTreeMap<String, Vec<bytes::Bytes>> = BTreeMap::new();
    for (_, entry) in entries {
        // A table deleted since: its writes are gone in every cluster with it.
        let Some(schema) = node.store.table_by_id(entry.table_id) else {
            continue;
        };
        let rows = tables.entry(schema.name.clone()).or_default();
        rows.extend(
            entry
                .rows_with_versions()
                .map(|(first, row)| encode_row(first, &row)),
        );
    }
    let bytes = tables
        .iter()
        .map(|(name, rows)| (name.clone(), rows.iter().map(|r| r.len() as u64).sum()))
        .collect();
    let request = ApplyRequest {
        origin_cluster: node.config.cluster.clone(),
        tables: tables
            .into_iter()
            .map(|(name, rows)| ReplicatedTableRows {
                table: basalt_control::table_id(&name).to_string(),
                rows,
            })
            .collect(),
        routed: false,
    };
    (request, bytes)
}

/// Where a cursor for `peer` starts if there is none yet (see [`ship`]): 0 (the log's
/// beginning) unless `peer` is being seeded and still waiting for every server to log for it,
/// as etcd says now; then the log's end. An existing cursor stays where it is.
async fn new_cursor_start(node: &Node, peer: &str, name: &str) -> u64 {
    let exists = {
        let (store, name) = (node.store.clone(), name.to_string());
        tokio::task::spawn_blocking(move || store.log_cursors().map(|c| c.contains_key(&name)))
            .await
    };
    if !matches!(exists, Ok(Ok(false))) {
        return 0;
    }
    match node.meta.seeds().await {
        Ok(seeds) if seeds.get(peer).is_some_and(|s| s.waiting()) => {
            let end = node.store.change_log_last_seq();
            info!(
                peer,
                from = end,
                "cluster {peer} is being seeded: its copy holds what is logged so far"
            );
            end
        }
        _ => 0,
    }
}

/// Ships the log to `peer` for as long as the task runs.
async fn ship(node: Arc<Node>, peer: String) {
    let name = consumer(&peer);
    // The cursor holds the log back from now on. A new peer starts at the log's beginning;
    // but one that is being seeded and still waits for this server starts at the log's end:
    // every entry logged so far is committed, and the copy reads only after this server
    // reported its cursor, so the copy holds them all (sent again, an aggregate's input would
    // count twice there). The seed record is read before the log's end (see seeding).
    let start = new_cursor_start(&node, &peer, &name).await;
    let mut cursor = loop {
        let (store, name) = (node.store.clone(), name.clone());
        match tokio::task::spawn_blocking(move || store.set_log_cursor(&name, start)).await {
            Ok(Ok(seq)) => break seq,
            Ok(Err(e)) => warn!(error = %e, peer, "cannot record the peer's cursor"),
            Err(e) => warn!(error = %e, peer, "cannot record the peer's cursor"),
        }
        tokio::time::sleep(BACKOFF_MAX).await;
    };
    // Where the peer is reached: its peer endpoint, or its servers (`Meta::peer_addresses`),
    // read again after a failure and every ADDRESSES_EVERY (the endpoint may change).
    let mut addresses: Vec<String> = Vec::new();
    let mut addresses_read = Instant::now();
    // Servers of this cluster start at different addresses of the peer.
    let mut next_server = {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        node.router.me().hash(&mut h);
        h.finish() as usize
    };
    let mut backoff = BACKOFF_FIRST;
    let mut reported: Option<(u64, u64, Instant)> = None;
    let mut failures = 0u32;
    let mut refreshed = Instant::now();
    // The clock value below which the peer holds every write of this server (reported as
    // `acked_hlc`), and the log watermark taken last, acknowledged once the cursor reaches
    // its sequence (see `basalt_storage::safe_point`). Idle, each pass takes one that is
    // acknowledged at once: the reported value follows the clock.
    let mut acked_hlc = 0u64;
    // The tables with writes waiting for the peer, as last told to the metrics.
    let mut delayed: BTreeSet<String> = BTreeSet::new();
    let mine = node.config.cluster.as_str();
    let mut watermark: Option<LogWatermark> = None;
    let mut bucket = TokenBucket::new(ship_rate(&node), std::time::Instant::now());
    loop {
        bucket.set_rate(ship_rate(&node), std::time::Instant::now());
        if watermark.is_none() {
            watermark = Some(node.store.log_watermark());
        }
        if let Some(w) = watermark
            && w.seq <= cursor
        {
            acked_hlc = acked_hlc.max(w.hlc);
            watermark = None;
        }
        let entries = {
            let (store, max) = (node.store.clone(), bucket.batch_bytes(BATCH_BYTES) as usize);
            match tokio::task::spawn_blocking(move || store.read_change_log(cursor, max)).await {
                Ok(Ok(entries)) => entries,
                Ok(Err(e)) => {
                    warn!(error = %e, peer, "cannot read the change log");
                    tokio::time::sleep(BACKOFF_MAX).await;
                    continue;
                }
                Err(_) => return,
            }
        };
        let logged = node.store.change_log_last_seq().max(cursor);
        let now = now_micros().max(0) as u64;
        let lag = entries
            .first()
            .map_or(0, |(_, e)| now.saturating_sub(e.first.hlc));
        // The delay by table: from the oldest entry of each table this batch holds (the gauge
        // is its age at each scrape). A table with none left is caught up once the batch
        // reaches the log's end (beyond the batch, its oldest is what it was).
        let oldest = first_by_table(&node, &entries);
        let reaches_end = entries.last().is_none_or(|(seq, _)| *seq >= logged);
        for (table, hlc) in &oldest {
            node.metrics
                .replication_pending(mine, &peer, table, Some(*hlc));
        }
        if reaches_end {
            for table in delayed.iter().filter(|t| !oldest.contains_key(*t)) {
                node.metrics.replication_pending(mine, &peer, table, None);
            }
            delayed.clear();
        }
        delayed.extend(oldest.into_keys());
        // The last report said the peer had every entry logged then, and there are newer
        // ones: they are reported before they are sent. Otherwise that claim would stand for
        // as long as their batch takes (a slow peer: up to APPLY_TIMEOUT), and a scale-in,
        // which lets a server go once its reports say its log was shipped, could stop it
        // with them unshipped.
        let claimed_caught_up =
            reported.is_some_and(|(acked, at_log, _)| acked == at_log && logged > at_log);
        let due = match reported {
            None => true,
            Some((acked, at_log, at)) => {
                claimed_caught_up
                    || (acked != cursor || at_log != logged) && at.elapsed() >= REPORT_MIN
                    || at.elapsed() >= HEARTBEAT
            }
        };
        if due {
            let record = ShippedRecord {
                store_id: node.router.me().to_string(),
                cluster: node.config.cluster.clone(),
                peer: peer.clone(),
                acked_seq: cursor,
                logged_seq: logged,
                lag_micros: lag,
                reported_micros: now_micros(),
                acked_hlc,
            };
            match node.meta.put_shipped(&record).await {
                Ok(()) => reported = Some((cursor, logged, Instant::now())),
                Err(e) => {
                    warn!(error = %e, peer, "cannot report the replication position");
                    if claimed_caught_up {
                        // Not sent before the claim is withdrawn (see above).
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(BACKOFF_MAX);
                        continue;
                    }
                }
            }
        }
        let Some(&(last, _)) = entries.last() else {
            if refreshed.elapsed() >= cursor_refresh(node.config.change_log_retention) {
                let (store, n) = (node.store.clone(), name.clone());
                if let Ok(Ok(_)) =
                    tokio::task::spawn_blocking(move || store.set_log_cursor(&n, cursor)).await
                {
                    refreshed = Instant::now();
                }
            }
            tokio::time::sleep(IDLE_POLL).await;
            continue;
        };
        if addresses.is_empty() || addresses_read.elapsed() >= ADDRESSES_EVERY {
            match node.meta.peer_addresses(&peer).await {
                Ok(read) => {
                    addresses = read;
                    addresses_read = Instant::now();
                }
                Err(e) => warn!(error = %e, peer, "cannot read where the peer cluster is reached"),
            }
            if addresses.is_empty() {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
        }
        let address = addresses[next_server % addresses.len()].clone();
        // The limit counts the whole request as sent; the metrics, each table's rows.
        let (request, table_bytes) = batch(&node, &entries);
        let wait = bucket.take(request.encoded_len() as u64, std::time::Instant::now());
        if !wait.is_zero() {
            for (table, _) in &table_bytes {
                node.metrics
                    .replication_throttled(mine, &peer, table, wait.as_secs_f64());
            }
            tokio::time::sleep(wait).await;
        }
        let sent = async {
            let mut client = replication_client(&node.dialer, &address, APPLY_TIMEOUT)
                .map_err(|e| e.to_string())?;
            client
                .apply(request)
                .await
                .map_err(|s| s.message().to_string())
        };
        match sent.await {
            Ok(_) => {
                let (store, n) = (node.store.clone(), name.clone());
                match tokio::task::spawn_blocking(move || store.set_log_cursor(&n, last)).await {
                    Ok(Ok(seq)) => {
                        cursor = seq;
                        refreshed = Instant::now();
                    }
                    _ => {
                        // Not recorded: shipped again later (applying is idempotent).
                        warn!(peer, "cannot record the peer's cursor");
                        tokio::time::sleep(backoff).await;
                        continue;
                    }
                }
                let mut commits: BTreeMap<String, Vec<u64>> = BTreeMap::new();
                for (_, entry) in &entries {
                    if let Some(schema) = node.store.table_by_id(entry.table_id) {
                        commits
                            .entry(schema.name.clone())
                            .or_default()
                            .push(entry.first.hlc);
                    }
                }
                for (table, commits) in &commits {
                    node.metrics.replicated(mine, &peer, table, commits);
                }
                for (table, bytes) in &table_bytes {
                    node.metrics.replicated_bytes(mine, &peer, table, *bytes);
                }
                backoff = BACKOFF_FIRST;
                failures = 0;
            }
            Err(message) => {
                failures += 1;
                if failures == 1 || failures.is_power_of_two() {
                    warn!(
                        peer,
                        address,
                        failures,
                        error = message,
                        "a replication batch failed; sending it again"
                    );
                }
                next_server = next_server.wrapping_add(1);
                addresses.clear();
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_server_ships_an_even_share_of_the_limit() {
        assert_eq!(share(None, 3), 0);
        assert_eq!(share(Some(0), 3), 0);
        assert_eq!(share(Some(300), 3), 100);
        // Not registered yet (no server counted): the whole limit, never more.
        assert_eq!(share(Some(300), 0), 300);
        // A share never rounds down to "unlimited".
        assert_eq!(share(Some(2), 3), 1);
    }
}
