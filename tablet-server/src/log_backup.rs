//! Log backup: this server's change log shipped to the backup location, so that a table can be
//! restored to any second after a backup of it (point-in-time recovery, `docs/backups.md`).
//!
//! While on (`--log-backup-interval-secs`), the store logs every write
//! ([`basalt_storage::changelog`]) and a consumer of its own, [`CONSUMER`], holds the log back:
//! every interval this server
//!
//! 1. takes the log's watermark ([`Store::log_watermark`]): a clock value below which every
//!    write of this store is in the log at or below a sequence;
//! 2. reads the log from its cursor through that sequence and uploads it as segments, one per
//!    instance and page ([`LogSegment`]: each row with the versions its write took, what
//!    replication ships to a peer cluster);
//! 3. writes its position for each instance ([`LogPosition`]): every write below the
//!    watermark's clock value is in a segment (`covered_hlc`), and since when it has logged
//!    (`since_hlc`);
//! 4. only then moves its cursor, so that the log's truncation frees what is shipped.
//!
//! A round that fails is done again from the same cursor: a segment uploaded twice holds the
//! same writes, and replaying a write twice changes nothing (versions decide). A server that
//! stops ships the rest and says so (`stopped`): it takes no write until it starts again, so a
//! restore need not wait for it. A restore replays the writes of every server's segments with
//! a version after the backup's cut and at most the time asked ([`crate::backups`]).
//!
//! **Since when.** The log must be on for every write the restore would replay. It is turned
//! on here before the server serves. A store that never held data logs from its first write
//! (`since_hlc` 0); a store that held data before its log backup began logs from then (its
//! earlier writes were never logged). The value is kept in the store beside the cursor
//! ([`SINCE_MARK`]), so a restart keeps it while the cursor lived on (the log was on
//! throughout). Starting a server without log backup drops both, so that turning it on again
//! starts a new `since_hlc`.
//!
//! **Before what the log does not hold.** DeleteTable and DropRowRange are not in the log:
//! the admin API ships this server's log first ([`LogBackup::ship_now`]), so that the values
//! logged by reference are read while the data still holds them, and an entry of a deleted
//! table still ships under the name it had.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use basalt_backup::{BackupStore, LogPosition, LogSegment};
use basalt_model::hlc::now_micros;
use basalt_model::schema::{parse_instance_name, parse_table_name};
use basalt_storage::{LogEntry, Store};
use bytes::Bytes;
use tokio::sync::Notify;
use tracing::{info, warn};

use crate::error::{Error, Result};

/// The name of log backup's cursor in the change log.
pub const CONSUMER: &str = "log-backup";
/// Not a reader: where the store keeps the clock value since which it logs for log backup
/// (as `u64::MAX` minus it, so that as a "cursor" it is past every sequence and never holds
/// the log back), kept with the cursor so that a server killed before it shipped anything
/// still knows it after a restart.
const SINCE_MARK: &str = "log-backup-since";
/// The most bytes of log one segment carries (about: values logged by reference count once
/// read).
const SEGMENT_BYTES: usize = 16 << 20;
/// How long a stopping server tries to ship the rest of its log.
pub const SHIP_ON_STOP: Duration = Duration::from_secs(10);

/// Log backup's settings (`--log-backup-interval-secs`, `--log-backup-retention-secs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogBackupConfig {
    /// How often the log is shipped: the recovery point is about this much.
    pub interval: Duration,
    /// How long shipped segments are kept (the sweeper of backups deletes older ones).
    pub retention: Duration,
}

/// This server's log backup (see the module docs).
pub struct LogBackup {
    store: Arc<Store>,
    location: BackupStore,
    cluster: String,
    /// The store's id: a server's segments and position are named by it.
    server: String,
    /// Cluster mode: the one instance this server serves (its position is written for it
    /// even before a write). Standalone: every instance with a table here.
    instance: Option<String>,
    since_hlc: u64,
    config: LogBackupConfig,
    /// Truncate the log here after each round (standalone; a cluster server's replication
    /// shipper truncates below every cursor).
    truncates: bool,
    /// One round at a time (the periodic one, one asked for, or the last one at stop).
    round: tokio::sync::Mutex<()>,
    /// The instances this server writes its position for: every one it held a table of or
    /// shipped writes of since it started (a position must keep moving after the instance's
    /// last table here is deleted, or restores to later times would wait for it).
    instances: parking_lot::Mutex<BTreeSet<String>>,
    /// The names of the tables by id, as last seen: an entry of a table deleted since it was
    /// seen still ships (a restore to a time before the deletion replays it).
    names: parking_lot::Mutex<std::collections::HashMap<u64, String>>,
    stopping: Notify,
}

impl LogBackup {
    /// Turns the change log on (before the server serves) and starts shipping it.
    pub async fn start(
        store: Arc<Store>,
        location: BackupStore,
        cluster: String,
        instance: Option<String>,
        config: LogBackupConfig,
        truncates: bool,
    ) -> Result<Arc<LogBackup>> {
        let server = blocking(&store, |s| s.store_id()).await?;
        let cursors = blocking(&store, |s| s.log_cursors()).await?;
        let since_hlc =
            if let (Some(_), Some(mark)) = (cursors.get(CONSUMER), cursors.get(SINCE_MARK)) {
                // The log was on since the cursor was made, and the mark says since when.
                u64::MAX - mark.seq
            } else if cursors.contains_key(CONSUMER) {
                // A cursor without its mark (made before the mark was): the last position knows.
                let mut known = None;
                for name in instances_of(&store, instance.as_deref()) {
                    let (project, id) = parse_instance_name(&name)?;
                    if let Some(p) = location
                        .log_positions(project, id)
                        .await?
                        .into_iter()
                        .find(|p| p.server == server)
                    {
                        known = Some(known.map_or(p.since_hlc, |k: u64| k.max(p.since_hlc)));
                    }
                }
                known.unwrap_or_else(|| store.log_watermark().hlc)
            } else {
                // The cursor first, at the log's end, then the log on: truncation never takes an
                // entry logged for this consumer before it ships it.
                let last = store.change_log_last_seq();
                blocking(&store, move |s| s.set_log_cursor(CONSUMER, last)).await?;
                let since = if blocking(&store, |s| s.holds_no_data()).await? {
                    0
                } else {
                    store.log_watermark().hlc
                };
                blocking(&store, move |s| {
                    s.set_log_cursor(SINCE_MARK, u64::MAX - since)
                })
                .await?;
                since
            };
        store.set_change_log(true);
        info!(
            location = %location.url(),
            interval_secs = config.interval.as_secs(),
            since_hlc,
            "log backup on: every write is shipped to the backup location"
        );
        let this = Arc::new(LogBackup {
            store,
            location,
            cluster,
            server,
            instance,
            since_hlc,
            config,
            truncates,
            round: tokio::sync::Mutex::new(()),
            instances: parking_lot::Mutex::default(),
            names: parking_lot::Mutex::default(),
            stopping: Notify::new(),
        });
        // A first round before the server serves: the position says at once that this server
        // is not stopped any more (a restore must wait for its new writes), and records since
        // when it logs (should it be killed before its first interval).
        if let Err(e) = this.ship(false).await {
            warn!(error = %e, "log backup: the first shipment failed; trying again every interval");
        }
        let weak = Arc::downgrade(&this);
        let interval = config.interval.max(Duration::from_secs(1));
        tokio::spawn(async move {
            loop {
                let Some(this) = weak.upgrade() else { return };
                tokio::select! {
                    _ = tokio::time::sleep(interval) => {}
                    _ = this.stopping.notified() => return,
                }
                if let Err(e) = this.ship(false).await {
                    warn!(error = %e, "log backup: shipping the change log failed; trying again");
                }
            }
        });
        Ok(this)
    }

    /// Drops the cursor of a log backup this server had before (started now without one):
    /// the log no longer waits for it, and turning it on again counts from then.
    pub async fn forget(store: &Arc<Store>) -> Result<()> {
        let cursors = blocking(store, |s| s.log_cursors()).await?;
        if cursors.contains_key(CONSUMER) || cursors.contains_key(SINCE_MARK) {
            blocking(store, |s| s.remove_log_cursor(CONSUMER)).await?;
            blocking(store, |s| s.remove_log_cursor(SINCE_MARK)).await?;
            info!("log backup off: its cursor is dropped");
        }
        Ok(())
    }

    /// Ships what is logged so far, now (before a DeleteTable or DropRowRange, which the log
    /// does not hold).
    pub async fn ship_now(&self) -> Result<()> {
        self.ship(false).await
    }

    /// Ships the rest of the log and says this server stopped (called once it takes no more
    /// writes). Bounded by [`SHIP_ON_STOP`].
    pub async fn stop(&self) {
        self.stopping.notify_waiters();
        match tokio::time::timeout(SHIP_ON_STOP, self.ship(true)).await {
            Ok(Ok(())) => info!("log backup: the whole change log is shipped"),
            Ok(Err(e)) => {
                warn!(error = %e, "log backup: stopping with part of the change log not shipped")
            }
            Err(_) => {
                warn!("log backup: stopping with part of the change log not shipped (timeout)")
            }
        }
    }

    /// One round (see the module docs).
    async fn ship(&self, stopped: bool) -> Result<()> {
        let _one = self.round.lock().await;
        let watermark = self.store.log_watermark();
        let mut cursor = blocking(&self.store, |s| s.log_cursors())
            .await?
            .get(CONSUMER)
            .map_or(0, |c| c.seq);
        {
            let mut names = self.names.lock();
            for t in self.store.all_tables() {
                names.insert(t.id, t.name.clone());
            }
        }
        self.instances
            .lock()
            .extend(instances_of(&self.store, self.instance.as_deref()));
        let mut shipped = 0usize;
        while cursor < watermark.seq {
            let after = cursor;
            let page = blocking(&self.store, move |s| {
                s.read_change_log(after, SEGMENT_BYTES)
            })
            .await?;
            let Some(&(last, _)) = page.last() else { break };
            for segment in self.segments(after + 1, last, &page) {
                self.instances.lock().insert(format!(
                    "projects/{}/instances/{}",
                    segment.project, segment.instance
                ));
                shipped += segment.tables.iter().map(|(_, r)| r.len()).sum::<usize>();
                self.location.put_log_segment(&segment).await?;
            }
            cursor = last;
        }
        let position = LogPosition {
            cluster: self.cluster.clone(),
            server: self.server.clone(),
            since_hlc: self.since_hlc,
            covered_hlc: watermark.hlc,
            last_seq: cursor,
            updated_micros: now_micros(),
            stopped,
        };
        let instances: Vec<String> = self.instances.lock().iter().cloned().collect();
        for name in &instances {
            let (project, id) = parse_instance_name(name)?;
            self.location
                .put_log_position(project, id, &position)
                .await?;
        }
        blocking(&self.store, move |s| s.set_log_cursor(CONSUMER, cursor)).await?;
        if self.truncates {
            blocking(&self.store, |s| {
                s.truncate_change_log(basalt_storage::changelog::DEFAULT_RETENTION)
                    .map(|_| ())
            })
            .await?;
        }
        if shipped > 0 {
            tracing::debug!(rows = shipped, through = cursor, "log backup: shipped");
        }
        Ok(())
    }

    /// The page's entries as segments, one per instance. An entry of a table deleted since
    /// ships under the name it had (a restore to a time before the deletion replays it),
    /// unless the table was created and deleted between two rounds.
    fn segments(&self, first_seq: u64, last_seq: u64, page: &[(u64, LogEntry)]) -> Vec<LogSegment> {
        let mut by_instance: BTreeMap<String, BTreeMap<String, Vec<Bytes>>> = BTreeMap::new();
        let mut hlcs: BTreeMap<String, (u64, u64)> = BTreeMap::new();
        let names = self.names.lock();
        for (_, entry) in page {
            let name = match self.store.table_by_id(entry.table_id) {
                Some(schema) => schema.name.clone(),
                None => match names.get(&entry.table_id) {
                    Some(name) => name.clone(),
                    None => continue,
                },
            };
            let Ok((instance, table)) = parse_table_name(&name) else {
                continue;
            };
            let rows = by_instance
                .entry(instance.to_string())
                .or_default()
                .entry(table.to_string())
                .or_default();
            let span = hlcs.entry(instance.to_string()).or_insert((u64::MAX, 0));
            for (first, row) in entry.rows_with_versions() {
                let n = row.mutations.len() as u64;
                span.0 = span.0.min(first.hlc);
                span.1 = span.1.max(first.hlc + n.saturating_sub(1));
                rows.push(crate::cluster::replication::encode_row(first, &row));
            }
        }
        by_instance
            .into_iter()
            .filter_map(|(instance, tables)| {
                let (project, id) = parse_instance_name(&instance).ok()?;
                let (min_hlc, max_hlc) = hlcs[&instance];
                (min_hlc <= max_hlc).then(|| LogSegment {
                    project: project.to_string(),
                    instance: id.to_string(),
                    cluster: self.cluster.clone(),
                    server: self.server.clone(),
                    first_seq,
                    last_seq,
                    min_hlc,
                    max_hlc,
                    tables: tables.into_iter().collect(),
                })
            })
            .collect()
    }

    /// Deletes the segments older than the retention (the backups' sweeper calls it).
    pub async fn sweep(&self) -> Result<u64> {
        let retention = i64::try_from(self.config.retention.as_micros()).unwrap_or(i64::MAX);
        let below = now_micros().saturating_sub(retention).max(0) as u64;
        let deleted = self.location.delete_log_segments_below(below).await?;
        if deleted > 0 {
            info!(deleted, "log backup: segments past the retention deleted");
        }
        Ok(deleted)
    }
}

/// The instances whose positions this server writes: its own (cluster mode), or those of its
/// tables (standalone).
fn instances_of(store: &Store, instance: Option<&str>) -> impl Iterator<Item = String> {
    let names: BTreeSet<String> = match instance {
        Some(i) => [i.to_string()].into(),
        None => store
            .all_tables()
            .iter()
            .filter_map(|t| parse_table_name(&t.name).ok().map(|(i, _)| i.to_string()))
            .collect(),
    };
    names.into_iter()
}

/// Runs `f` on the store off the async runtime.
async fn blocking<T: Send + 'static>(
    store: &Arc<Store>,
    f: impl FnOnce(&Store) -> basalt_storage::Result<T> + Send + 'static,
) -> Result<T> {
    let store = store.clone();
    tokio::task::spawn_blocking(move || f(&store))
        .await
        .map_err(|e| Error::Internal(format!("log backup task failed: {e}")))?
        .map_err(Error::from)
}
