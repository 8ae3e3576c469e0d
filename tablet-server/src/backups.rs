//! Bigtable's backups (`docs/backups.md`): CreateBackup, GetBackup,
//! ListBackups, UpdateBackup, DeleteBackup, RestoreTable and CopyBackup, their long-running
//! operations (`google.longrunning.Operations/GetOperation`), and the sweeper that deletes
//! expired backups and the chunks no backup holds.
//!
//! A backup is the table as of one cut of the store ([`Store::backup_scan`]), cut into
//! content-addressed chunks and uploaded with `basalt-backup` (chunks the location holds
//! already are not uploaded again); its manifest is written last, so an interrupted backup
//! never appears. A restore downloads the chunks, checks each one's SHA-256, and ingests them
//! all at once into a new table, or deletes the new table on any failure.
//!
//! In a cluster the server asked coordinates: every server that owns a tablet of the table
//! cuts its tablets at the same clock value and uploads their chunks
//! (`basalt.control.v1.TabletBackup`, [`BackupService`]), and a restore's tablets, once the
//! master placed them, are filled by their owners.
//!
//! A standalone server keeps its operations in memory: after a restart GetOperation no longer
//! knows them (the backups themselves are in the object store). A cluster's servers also
//! record in etcd ([`InFlight`]) every backup, copy and restore in flight, under a lease the
//! server running it keeps alive, and each finished operation for an hour: any server of the
//! cluster answers GetBackup, ListBackups and GetOperation for them, a second CreateBackup of
//! the same name on another server is refused, and the collection of unheld chunks is
//! coordinated with them (see [`InFlight`] for why neither side can miss the other).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use basalt_backup::{
    BackupName, BackupStore, BackupType, Chunk, ChunkRef, Chunker, Manifest, TabletBounds, chunk,
};
use basalt_control::v1;
use basalt_meta::Meta;
use basalt_meta::held::Held;
use basalt_meta::keys::BackupLocationKeys;
use basalt_model::hlc::now_micros;
use basalt_model::schema::{parse_instance_name, parse_table_name, validate_table_id};
use basalt_model::{RestoreInfo, RowRange, TableSchema, Tablet};
use basalt_storage::Store;
use futures::StreamExt;
use googleapis_tonic_google_bigtable_admin_v2::google::bigtable::admin::v2 as admin;
use googleapis_tonic_google_longrunning::google::longrunning as lro;
use parking_lot::Mutex;
use prost::Message;
use serde::{Deserialize, Serialize};
use tracing::{debug, info, warn};

use crate::catalog::Catalog;
use crate::cluster::Node;
use crate::cluster::forwarding::{Reply, ask_cluster};
use crate::error::{Error, Result, rpc_status};
use crate::log_backup::LogBackup;
use crate::proto_time::{any, micros_of, timestamp};

/// Bigtable's bounds on a backup's `expire_time`, from the request's arrival.
const MIN_RETENTION_MICROS: i64 = 6 * 3600 * 1_000_000;
const MAX_RETENTION_MICROS: i64 = 90 * 24 * 3600 * 1_000_000;
/// A copy of a backup is kept at most 30 days (CopyBackupRequest.expire_time).
const MAX_COPY_RETENTION_MICROS: i64 = 30 * 24 * 3600 * 1_000_000;
/// A HOT backup turns STANDARD at least 24 hours after it was created.
const MIN_HOT_MICROS: i64 = 24 * 3600 * 1_000_000;
/// How far a requested time may fall short of a minimum counted from now: the caller counted
/// it from its own clock a moment before the request arrived (a `Backup` resource kept
/// exactly its minimum of 6 hours, or turning STANDARD exactly 24 hours after it started).
const CLOCK_SLACK_MICROS: i64 = 60 * 1_000_000;
/// Chunks held by no backup are deleted once they are this old (a backup being written has
/// uploaded chunks its manifest does not name yet).
const UNHELD_CHUNK_AGE: Duration = Duration::from_secs(3600);
/// Chunks uploaded or downloaded at once.
const TRANSFERS: usize = 4;
/// How far ahead of the coordinator's clock a cluster's cut is set at first (each retry four
/// times further).
const CUT_MARGIN_MICROS: u64 = 50_000;
const CUT_ATTEMPTS: usize = 5;
/// A peer's part of a backup or restore reads and uploads (downloads) a server's tablets.
const PEER_CALL_TIMEOUT: Duration = Duration::from_secs(6 * 3600);
/// How long a restore waits for the master to place the new table's tablets.
const PLACEMENT_TIMEOUT: Duration = Duration::from_secs(120);
/// The lease of a backup, copy or restore in flight (and of a collection) in etcd: a server
/// that dies leaves its records for at most this long.
const IN_FLIGHT_TTL: Duration = Duration::from_secs(10);
/// What a holder keeps to spare before its lease could expire: with less left, a backup or
/// copy no longer writes its manifest and a collection stops deleting, so that a request sent
/// before lands before another server can take over (it takes far less than this).
const HOLD_MARGIN: Duration = Duration::from_secs(3);
/// How long a finished operation stays answerable by every server of a cluster.
const FINISHED_TTL: Duration = Duration::from_secs(3600);
/// How long a backup, copy or restore waits for a collection of unheld chunks to end before
/// it is refused (UNAVAILABLE).
const COLLECTION_WAIT: Duration = Duration::from_secs(10);
/// The admin API's protobuf package (the types its operations carry).
const ADMIN: &str = "google.bigtable.admin.v2";

/// Where backups go and how often expired ones are swept.
#[derive(Clone, Debug)]
pub struct BackupConfig {
    /// `s3://bucket/prefix` or `file:///path`.
    pub url: String,
    pub sweep_interval: Duration,
    /// The most bytes per second a backup reads and uploads (0: no limit), so that a backup
    /// leaves the server's requests their latency.
    pub max_bytes_per_sec: u64,
    /// Point-in-time recovery: the change log shipped to the location (None: off).
    pub log_backup: Option<crate::log_backup::LogBackupConfig>,
}

pub struct Backups {
    store: Arc<Store>,
    catalog: Arc<dyn Catalog>,
    location: BackupStore,
    /// This server's cluster id: backups are made in it.
    cluster: String,
    /// Where a restore writes its SST files before they are ingested (the data directory).
    scratch: std::path::PathBuf,
    /// The cluster this server belongs to (cluster mode): a backup or restore it is asked
    /// for involves every server that owns a tablet of the table.
    node: Option<Arc<Node>>,
    /// Cluster mode: the records of backups, copies and restores in flight in etcd.
    in_flight: Option<InFlight>,
    /// Backups this server is creating (CREATING), by name.
    creating: Mutex<BTreeMap<String, admin::Backup>>,
    operations: Mutex<HashMap<String, lro::Operation>>,
    /// A backup's pace, in bytes per second (0: no limit).
    max_bytes_per_sec: u64,
    /// Held for reading while a backup uploads chunks and writes its manifest, for writing
    /// while unheld chunks are deleted.
    collecting: tokio::sync::RwLock<()>,
    /// Point-in-time recovery's shipping of this server's log, when on.
    log_backup: std::sync::OnceLock<Arc<LogBackup>>,
}

/// `m`, a message of the admin API named `type_name`, packed in an `Any`.
fn admin_any<M: Message>(type_name: &str, m: &M) -> prost_types::Any {
    any(&format!("{ADMIN}.{type_name}"), m)
}

/// The expire time a request asks for, within Bigtable's 6 hours to 90 days from now.
fn expire_time(t: Option<&prost_types::Timestamp>) -> Result<i64> {
    expire_within(
        t,
        MAX_RETENTION_MICROS,
        "a backup is kept at least 6 hours and at most 90 days from now",
    )
}

/// The expire time of a copy (CopyBackup), within Bigtable's 6 hours to 30 days from now.
fn copy_expire_time(t: Option<&prost_types::Timestamp>) -> Result<i64> {
    expire_within(
        t,
        MAX_COPY_RETENTION_MICROS,
        "a copy of a backup is kept at least 6 hours and at most 30 days from now",
    )
}

fn expire_within(t: Option<&prost_types::Timestamp>, max: i64, rule: &str) -> Result<i64> {
    let t = t.ok_or_else(|| Error::InvalidArgument("backup.expire_time is required".into()))?;
    let at = micros_of(t);
    let now = now_micros();
    if at < now + MIN_RETENTION_MICROS - CLOCK_SLACK_MICROS || at > now + max {
        return Err(Error::InvalidArgument(format!(
            "expire_time {}s is out of range: {rule}",
            t.seconds
        )));
    }
    Ok(at)
}

/// The type a CreateBackup asks for (unspecified: STANDARD) and when a HOT one turns STANDARD.
fn backup_type(b: &admin::Backup, created_micros: i64) -> Result<(BackupType, Option<i64>)> {
    use admin::backup::BackupType as Proto;
    let kind = match Proto::try_from(b.backup_type) {
        Ok(Proto::Unspecified | Proto::Standard) => BackupType::Standard,
        Ok(Proto::Hot) => BackupType::Hot,
        Err(_) => {
            return Err(Error::InvalidArgument(format!(
                "backup_type {} is not a backup type (STANDARD or HOT)",
                b.backup_type
            )));
        }
    };
    let hot = hot_to_standard_time(kind, b.hot_to_standard_time.as_ref(), created_micros)?;
    Ok((kind, hot))
}

/// Bigtable's rules for `hot_to_standard_time`: only for a HOT backup, and at least 24 hours
/// after the backup's creation.
fn hot_to_standard_time(
    kind: BackupType,
    at: Option<&prost_types::Timestamp>,
    created_micros: i64,
) -> Result<Option<i64>> {
    match (kind, at) {
        (_, None) => Ok(None),
        (BackupType::Standard, Some(_)) => Err(Error::InvalidArgument(
            "hot_to_standard_time applies only to a HOT backup".into(),
        )),
        (BackupType::Hot, Some(t)) => {
            let at = micros_of(t);
            if at < created_micros + MIN_HOT_MICROS - CLOCK_SLACK_MICROS {
                return Err(Error::InvalidArgument(format!(
                    "hot_to_standard_time {}s is too early: a HOT backup stays HOT at least 24 hours after it was created",
                    t.seconds
                )));
            }
            Ok(Some(at))
        }
    }
}

fn backup_type_proto(kind: BackupType) -> i32 {
    match kind {
        BackupType::Standard => admin::backup::BackupType::Standard as i32,
        BackupType::Hot => admin::backup::BackupType::Hot as i32,
    }
}

/// A backup as the API shows it.
fn backup_proto(m: &Manifest) -> admin::Backup {
    admin::Backup {
        name: m.name.clone(),
        source_table: m.source_table.clone(),
        source_backup: m.source_backup.clone().unwrap_or_default(),
        expire_time: Some(timestamp(m.expire_time_micros)),
        start_time: Some(timestamp(m.start_time_micros)),
        end_time: Some(timestamp(m.end_time_micros)),
        size_bytes: m.size_bytes as i64,
        state: admin::backup::State::Ready as i32,
        backup_type: backup_type_proto(m.backup_type_at(now_micros())),
        hot_to_standard_time: m.hot_to_standard_time_micros.map(timestamp),
        ..Default::default()
    }
}

fn parse_cluster_name(name: &str) -> Result<(String, String, String)> {
    match name.split('/').collect::<Vec<_>>().as_slice() {
        ["projects", p, "instances", i, "clusters", c]
            if !p.is_empty() && !i.is_empty() && !c.is_empty() =>
        {
            Ok((p.to_string(), i.to_string(), c.to_string()))
        }
        _ => Err(Error::InvalidArgument(format!(
            "invalid cluster name {name:?}: expected projects/<project>/instances/<instance>/clusters/<cluster>"
        ))),
    }
}

/// What etcd holds of a backup being created, while its coordinator's lease lives: what
/// GetBackup shows of it (CREATING) and its operation.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct CreatingRecord {
    name: String,
    source_table: String,
    start_time_micros: i64,
    expire_time_micros: i64,
    operation: String,
    /// The store id of the coordinating server.
    server: String,
    #[serde(default)]
    backup_type: BackupType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hot_to_standard_time_micros: Option<i64>,
}

impl CreatingRecord {
    fn backup(&self) -> admin::Backup {
        admin::Backup {
            name: self.name.clone(),
            source_table: self.source_table.clone(),
            expire_time: Some(timestamp(self.expire_time_micros)),
            start_time: Some(timestamp(self.start_time_micros)),
            state: admin::backup::State::Creating as i32,
            backup_type: backup_type_proto(self.backup_type),
            hot_to_standard_time: self.hot_to_standard_time_micros.map(timestamp),
            ..Default::default()
        }
    }
}

/// What etcd holds of a copy or a restore in flight: its operation and what it reads.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct InFlightRecord {
    /// The copy (a backup's name) or the table being restored.
    name: String,
    /// The backup read (the copy's source, the restore's backup).
    backup: String,
    start_time_micros: i64,
    operation: String,
    server: String,
}

fn encode<T: Serialize>(record: &T) -> Vec<u8> {
    serde_json::to_vec(record).expect("a backup record always encodes")
}

fn decode<'a, T: Deserialize<'a>>(key: &str, bytes: &'a [u8]) -> Result<T> {
    serde_json::from_slice(bytes)
        .map_err(|e| Error::Internal(format!("{key} in the coordination store: {e}")))
}

/// An operation's name: `operations/<resource>/operations/<kind>-<start micros>`.
fn parse_operation_name(name: &str) -> Option<(&str, &str, i64)> {
    let (resource, last) = name
        .strip_prefix("operations/")?
        .rsplit_once("/operations/")?;
    let (kind, start) = last.split_once('-')?;
    Some((resource, kind, start.parse().ok()?))
}

/// A cluster's backups, copies and restores in flight, recorded in etcd so that every server
/// of the cluster sees them, and the collection of unheld chunks coordinated with them.
///
/// Each operation in flight writes, in **one transaction** and under one lease its server
/// keeps alive, its record under the instance's prefix (`backups/creating|copying|restoring/`,
/// what the other servers show) and a key under its backup location's `in-flight/` prefix —
/// **if** the location's `collecting` key does not exist (nor its own record: one backup of a
/// name at a time). A collection writes `collecting`, in one transaction under a lease of its
/// own, **if** `collecting` does not exist and no key exists under `in-flight/`. etcd runs
/// transactions one after the other, so of an operation and a collection the later one sees
/// the earlier one's key and does not start: neither can miss the other. Each keeps its key
/// for as long as it runs, and stops before its lease could expire without it (a backup does
/// not write its manifest, a collection stops deleting, with [`HOLD_MARGIN`] to spare), so
/// no collection ever deletes a chunk while an operation that may rely on it — a backup that
/// found it present and did not upload it, a copy, a restore — is in flight. Chunks uploaded
/// less than [`UNHELD_CHUNK_AGE`] ago are never collected either.
///
/// The keys of a location (`/basalt/backup-locations/<digest of its URL>/`) are shared by
/// every instance whose servers reach the same etcd and keep backups at the same URL (the
/// local runtime gives all its instances one): their chunks are shared too.
struct InFlight {
    meta: Meta,
    location: BackupLocationKeys,
    /// This server's store id (who runs an operation).
    server: String,
}

/// What a collection found in its way.
enum Collection {
    Done(u64),
    /// Another collection, or an operation in flight (the key found).
    NotNow(String),
}

impl InFlight {
    fn new(node: &Node, url: &str) -> InFlight {
        let digest = chunk::sha256_hex(url.trim_end_matches('/').as_bytes());
        InFlight {
            meta: node.meta.clone(),
            location: BackupLocationKeys::new(&digest[..32]),
            server: node.router.me().to_string(),
        }
    }

    /// Records an operation in flight: `record` at the instance's `key` and on the location
    /// (as `kind`/`id`), under one kept-alive lease — unless `key` or a key of `also_absent`
    /// exists (`taken()`: ALREADY_EXISTS), or a collection of unheld chunks runs (waited for
    /// up to [`COLLECTION_WAIT`], then UNAVAILABLE).
    async fn begin(
        &self,
        kind: &str,
        id: &str,
        key: String,
        record: Vec<u8>,
        also_absent: &[String],
        taken: impl Fn() -> Error,
    ) -> Result<Held> {
        let collecting = self.location.collecting();
        let puts = [
            (key.clone(), record.clone()),
            (
                self.location.in_flight_of(self.meta.keys(), kind, id),
                record,
            ),
        ];
        let mut absent = vec![key, collecting.clone()];
        absent.extend_from_slice(also_absent);
        let deadline = tokio::time::Instant::now() + COLLECTION_WAIT;
        loop {
            match self.meta.hold(&puts, &absent, &[], IN_FLIGHT_TTL).await? {
                Ok(held) => return Ok(held),
                Err(k) if k == collecting => {
                    if tokio::time::Instant::now() >= deadline {
                        return Err(Error::Unavailable(format!(
                            "the backup location's unheld chunks are being collected (a sweep, for more than {COLLECTION_WAIT:?}); try again shortly"
                        )));
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(_) => return Err(taken()),
            }
        }
    }

    /// Collects the location's unheld chunks older than [`UNHELD_CHUNK_AGE`], if no other
    /// collection runs and nothing is in flight; stops when its record might expire.
    async fn collect(&self, location: &BackupStore) -> Result<Collection> {
        let collecting = self.location.collecting();
        let held = match self
            .meta
            .hold(
                &[(collecting.clone(), self.server.clone().into_bytes())],
                std::slice::from_ref(&collecting),
                &[self.location.in_flight()],
                IN_FLIGHT_TTL,
            )
            .await?
        {
            Ok(held) => held,
            Err(k) => return Ok(Collection::NotNow(k)),
        };
        let collected = tokio::select! {
            r = location.collect_chunks(UNHELD_CHUNK_AGE) => r,
            _ = held.lapsed(HOLD_MARGIN) => Err(Error::Unavailable(
                "stopped collecting unheld chunks: its record in the coordination store could not be kept (etcd unreachable?)".into(),
            )),
        };
        held.release().await;
        collected.map(Collection::Done)
    }

    /// Keeps a finished operation for the other servers to answer (for [`FINISHED_TTL`]).
    async fn finished(&self, op: &lro::Operation) {
        let key = self.meta.keys().backup_operation(&op.name);
        if let Err(e) = self
            .meta
            .put_expiring(&key, op.encode_to_vec(), FINISHED_TTL)
            .await
        {
            warn!(operation = %op.name, error = %e, "recording a finished operation failed; only this server knows its outcome");
        }
    }

    /// The backups being created in `cluster` (every cluster: None).
    async fn creating(&self, cluster: Option<&str>) -> Result<Vec<CreatingRecord>> {
        self.meta
            .values_under(&self.meta.keys().backups_creating(cluster))
            .await?
            .iter()
            .map(|(k, v)| decode(k, v))
            .collect()
    }

    async fn record<T: for<'a> Deserialize<'a>>(&self, key: &str) -> Result<Option<T>> {
        self.meta
            .value(key)
            .await?
            .map(|v| decode(key, &v))
            .transpose()
    }

    /// An operation another server of the cluster runs or ran (None: not one of the
    /// backups'): as it recorded it once finished; else not done while its record in flight
    /// exists; else as the backup location tells (a backup whose manifest has its start
    /// time, a copy whose manifest exists); else failed, its server having stopped.
    async fn operation(
        &self,
        name: &str,
        location: &BackupStore,
    ) -> Result<Option<lro::Operation>> {
        let Some((resource, kind, start)) = parse_operation_name(name) else {
            return Ok(None);
        };
        let keys = self.meta.keys();
        if let Some(bytes) = self.meta.value(&keys.backup_operation(name)).await? {
            return lro::Operation::decode(bytes.as_slice())
                .map(Some)
                .map_err(|e| {
                    Error::Internal(format!("operation {name} in the coordination store: {e}"))
                });
        }
        let running = |metadata| lro::Operation {
            name: name.to_string(),
            metadata: Some(metadata),
            done: false,
            result: None,
        };
        let done = |result| lro::Operation {
            name: name.to_string(),
            metadata: None,
            done: true,
            result: Some(result),
        };
        let stopped = |what: String| {
            lro::operation::Result::Error(rpc_status(&Error::Unavailable(format!(
                "{what} did not finish: it failed, or the server running it stopped; start it again"
            ))))
        };
        match kind {
            "create" => {
                let backup = BackupName::parse(resource)?;
                let key = keys.backup_creating(&backup.cluster, &backup.backup);
                if let Some(r) = self.record::<CreatingRecord>(&key).await?
                    && r.operation == name
                {
                    let metadata = admin::CreateBackupMetadata {
                        name: r.name.clone(),
                        source_table: r.source_table.clone(),
                        start_time: Some(timestamp(r.start_time_micros)),
                        end_time: None,
                    };
                    return Ok(Some(running(admin_any("CreateBackupMetadata", &metadata))));
                }
                match location.manifest(&backup).await {
                    Ok(m) if m.start_time_micros == start => Ok(Some(done(
                        lro::operation::Result::Response(admin_any("Backup", &backup_proto(&m))),
                    ))),
                    Ok(_) | Err(Error::NotFound(_)) => {
                        Ok(Some(done(stopped(format!("backup {resource}")))))
                    }
                    Err(e) => Err(e),
                }
            }
            "restore" => {
                let key = keys.backup_restoring(basalt_control::table_id(resource));
                if let Some(r) = self.record::<InFlightRecord>(&key).await?
                    && r.operation == name
                {
                    let metadata = admin::RestoreTableMetadata {
                        name: r.name.clone(),
                        source_type: admin::RestoreSourceType::Backup as i32,
                        progress: Some(admin::OperationProgress {
                            progress_percent: 0,
                            start_time: Some(timestamp(r.start_time_micros)),
                            end_time: None,
                        }),
                        source_info: Some(admin::restore_table_metadata::SourceInfo::BackupInfo(
                            admin::BackupInfo {
                                backup: r.backup.clone(),
                                ..Default::default()
                            },
                        )),
                        ..Default::default()
                    };
                    return Ok(Some(running(admin_any("RestoreTableMetadata", &metadata))));
                }
                Ok(Some(done(stopped(format!(
                    "the restore of table {resource} (check the table before using it)"
                )))))
            }
            "copy" => {
                let copy = BackupName::parse(resource)?;
                let key = keys.backup_copying(&copy.cluster, &copy.backup);
                if let Some(r) = self.record::<InFlightRecord>(&key).await?
                    && r.operation == name
                {
                    let metadata = admin::CopyBackupMetadata {
                        name: r.name.clone(),
                        ..Default::default()
                    };
                    return Ok(Some(running(admin_any("CopyBackupMetadata", &metadata))));
                }
                // Done with the copy its operation made (copies made before the copy's start
                // was kept: any copy of that name).
                match location.manifest(&copy).await {
                    Ok(m)
                        if m.source_backup.is_some()
                            && m.copied_micros.is_none_or(|t| t == start) =>
                    {
                        Ok(Some(done(lro::operation::Result::Response(admin_any(
                            "Backup",
                            &backup_proto(&m),
                        )))))
                    }
                    Ok(_) | Err(Error::NotFound(_)) => {
                        Ok(Some(done(stopped(format!("the copy {resource}")))))
                    }
                    Err(e) => Err(e),
                }
            }
            _ => Ok(None),
        }
    }
}

/// A connection to the TabletBackup service of `owner` (a store id) as `state` registers it,
/// and its address.
fn peer(
    node: &Node,
    state: &crate::cluster::tablet_router::ClusterState,
    owner: &str,
) -> Result<(
    String,
    basalt_control::TabletBackupClient<tonic::transport::Channel>,
)> {
    let address = state
        .servers
        .get(owner)
        .map(|r| r.address.clone())
        .ok_or_else(|| Error::Unavailable(format!("server {owner} is not registered")))?;
    let client = basalt_control::backup_client(&node.dialer, &address, PEER_CALL_TIMEOUT)
        .map_err(|e| Error::Unavailable(format!("{address}: {e}")))?;
    Ok((address, client))
}

impl Backups {
    /// Opens the backup location (`config.url`) and starts the sweeper.
    pub fn start(
        store: Arc<Store>,
        catalog: Arc<dyn Catalog>,
        cluster: String,
        scratch: std::path::PathBuf,
        node: Option<Arc<Node>>,
        config: &BackupConfig,
    ) -> Result<Arc<Backups>> {
        let location = BackupStore::open(&config.url)?;
        info!(location = %config.url, "backups kept in");
        let in_flight = node.as_deref().map(|n| InFlight::new(n, &config.url));
        let backups = Arc::new(Backups {
            in_flight,
            store,
            catalog,
            location,
            cluster,
            scratch,
            node,
            max_bytes_per_sec: config.max_bytes_per_sec,
            creating: Mutex::default(),
            operations: Mutex::default(),
            collecting: tokio::sync::RwLock::new(()),
            log_backup: std::sync::OnceLock::new(),
        });
        let weak = Arc::downgrade(&backups);
        let interval = config.sweep_interval.max(Duration::from_secs(1));
        tokio::spawn(async move {
            // A first sweep at once: a restore this server was running when it stopped left
            // a table that serves nothing until the sweep deletes it.
            loop {
                let Some(backups) = weak.upgrade() else {
                    return;
                };
                if let Err(e) = backups.sweep().await {
                    warn!(error = %e, "sweeping expired backups failed; trying again later");
                }
                drop(backups);
                tokio::time::sleep(interval).await;
            }
        });
        Ok(backups)
    }

    /// The backup location.
    pub fn location(&self) -> &BackupStore {
        &self.location
    }

    /// This server's log backup, when on.
    pub fn log_backup(&self) -> Option<&Arc<LogBackup>> {
        self.log_backup.get()
    }

    /// This server's log backup: its segments past the retention go with the sweep.
    pub fn set_log_backup(&self, log: Arc<LogBackup>) {
        let _ = self.log_backup.set(log);
    }

    /// A backup name of this server's cluster.
    fn own(&self, name: &str) -> Result<BackupName> {
        let parsed = BackupName::parse(name)?;
        self.check_cluster(&parsed.cluster_name())?;
        Ok(parsed)
    }

    fn check_cluster(&self, cluster_name: &str) -> Result<(String, String, String)> {
        let (p, i, c) = parse_cluster_name(cluster_name)?;
        self.catalog
            .check_instance(&format!("projects/{p}/instances/{i}"))?;
        if c != self.cluster && c != "-" {
            return Err(Error::NotFound(format!(
                "cluster {cluster_name} not found (this server's cluster is {})",
                self.cluster
            )));
        }
        Ok((p, i, c))
    }

    fn operation(&self, op: lro::Operation) -> lro::Operation {
        self.operations.lock().insert(op.name.clone(), op.clone());
        op
    }

    /// Ends an operation of this server: in a cluster, its outcome is recorded for the other
    /// servers, then its record in flight deleted (in that order: the operation is never
    /// without both).
    async fn conclude(&self, name: &str, held: Option<Held>) {
        let op = self.operations.lock().get(name).cloned();
        if let (Some(in_flight), Some(op)) = (&self.in_flight, op) {
            in_flight.finished(&op).await;
        }
        if let Some(held) = held {
            held.release().await;
        }
    }

    fn finish_operation(&self, name: &str, result: lro::operation::Result) {
        if let Some(op) = self.operations.lock().get_mut(name) {
            op.done = true;
            op.result = Some(result);
        }
    }

    fn fail_operation(&self, name: &str, e: &Error) {
        self.finish_operation(name, lro::operation::Result::Error(rpc_status(e)));
    }

    /// An operation of this server, or (in a cluster) of another one.
    pub async fn get_operation(&self, name: &str) -> Result<lro::Operation> {
        let known = self.operations.lock().get(name).cloned();
        if let Some(op) = known {
            return Ok(op);
        }
        let other = match &self.in_flight {
            Some(in_flight) => in_flight.operation(name, &self.location).await?,
            None => None,
        };
        other.ok_or_else(|| Error::NotFound(format!("operation {name} not found")))
    }

    pub async fn create(
        self: &Arc<Self>,
        req: admin::CreateBackupRequest,
    ) -> Result<lro::Operation> {
        if self.check_cluster(&req.parent)?.2 == "-" {
            return Err(Error::InvalidArgument(
                "CreateBackup needs a cluster, not '-'".into(),
            ));
        }
        let name = BackupName::parse(&format!("{}/backups/{}", req.parent, req.backup_id))?;
        let backup = req
            .backup
            .ok_or_else(|| Error::InvalidArgument("backup is required".into()))?;
        let (instance, _) = parse_table_name(&backup.source_table)?;
        if instance != format!("projects/{}/instances/{}", name.project, name.instance) {
            return Err(Error::InvalidArgument(format!(
                "source_table {} is not in the backup's instance",
                backup.source_table
            )));
        }
        let schema = self.store.table(&backup.source_table)?;
        if let Some(operation) = schema.restoring() {
            return Err(Error::FailedPrecondition(format!(
                "table {} is being restored from a backup (operation {operation}): back it up once the restore is done",
                backup.source_table
            )));
        }
        let expire = expire_time(backup.expire_time.as_ref())?;
        let full = name.full();
        let start = now_micros();
        let kind = backup_type(&backup, start)?;
        let op_name = format!("operations/{full}/operations/create-{start}");
        let being_created = || Error::AlreadyExists(format!("backup {full} is being created"));
        let record = CreatingRecord {
            name: full.clone(),
            source_table: backup.source_table.clone(),
            start_time_micros: start,
            expire_time_micros: expire,
            operation: op_name.clone(),
            server: self
                .in_flight
                .as_ref()
                .map(|f| f.server.clone())
                .unwrap_or_default(),
            backup_type: kind.0,
            hot_to_standard_time_micros: kind.1,
        };
        {
            let mut creating = self.creating.lock();
            if creating.contains_key(&full) {
                return Err(being_created());
            }
            creating.insert(full.clone(), record.backup());
        }
        let held = match &self.in_flight {
            None => None,
            Some(in_flight) => {
                let keys = in_flight.meta.keys();
                let begun = in_flight
                    .begin(
                        "creating",
                        &format!("{}/{}", name.cluster, name.backup),
                        keys.backup_creating(&name.cluster, &name.backup),
                        encode(&record),
                        &[keys.backup_copying(&name.cluster, &name.backup)],
                        being_created,
                    )
                    .await;
                match begun {
                    Ok(held) => Some(held),
                    Err(e) => {
                        self.creating.lock().remove(&full);
                        return Err(e);
                    }
                }
            }
        };
        let exists = match self.location.manifest(&name).await {
            Err(Error::NotFound(_)) => None,
            Ok(_) => Some(Error::AlreadyExists(format!(
                "backup {full} already exists"
            ))),
            Err(e) => Some(e),
        };
        if let Some(e) = exists {
            self.creating.lock().remove(&full);
            if let Some(held) = held {
                held.release().await;
            }
            return Err(e);
        }
        let metadata = admin::CreateBackupMetadata {
            name: full.clone(),
            source_table: backup.source_table.clone(),
            start_time: Some(timestamp(start)),
            end_time: None,
        };
        let op = self.operation(lro::Operation {
            name: op_name.clone(),
            metadata: Some(admin_any("CreateBackupMetadata", &metadata)),
            done: false,
            result: None,
        });
        let this = self.clone();
        tokio::spawn(async move {
            let made = this
                .make(&full, &schema, start, expire, kind, held.as_ref())
                .await;
            this.creating.lock().remove(&full);
            match made {
                Ok(manifest) => {
                    info!(backup = %full, bytes = manifest.size_bytes, uploaded = manifest.uploaded_bytes, "backup created");
                    if let Some(op) = this.operations.lock().get_mut(&op_name) {
                        let metadata = admin::CreateBackupMetadata {
                            end_time: Some(timestamp(now_micros())),
                            ..metadata
                        };
                        op.metadata = Some(admin_any("CreateBackupMetadata", &metadata));
                    }
                    this.finish_operation(
                        &op_name,
                        lro::operation::Result::Response(admin_any(
                            "Backup",
                            &backup_proto(&manifest),
                        )),
                    );
                }
                Err(e) => {
                    warn!(backup = %full, error = %e, "backup failed");
                    this.fail_operation(&op_name, &e);
                }
            }
            this.conclude(&op_name, held).await;
        });
        Ok(op)
    }

    /// Reads the table as of one cut (on every server that owns a tablet of it, in a
    /// cluster), uploads the chunks the location lacks, then writes the manifest — in a
    /// cluster, only while its record in flight (`held`) surely lives.
    async fn make(
        &self,
        name: &str,
        schema: &Arc<TableSchema>,
        start: i64,
        expire: i64,
        (backup_type, hot_to_standard_time_micros): (BackupType, Option<i64>),
        held: Option<&Held>,
    ) -> Result<Manifest> {
        let _uploading = self.collecting.read().await;
        let (tablets, exported, cut) = match &self.node {
            None => {
                let ranges = schema.tablet_ranges();
                let (exported, cut) = self.export(schema.clone(), ranges.clone(), None).await?;
                (ranges, exported, cut)
            }
            Some(node) => self.export_cluster(node, schema).await?,
        };
        let mut chunks = Vec::new();
        let mut uploaded_bytes = 0;
        for (c, uploaded) in exported {
            if uploaded {
                uploaded_bytes += c.bytes;
            }
            chunks.push(c);
        }
        let manifest = Manifest {
            format: basalt_backup::manifest::MANIFEST_FORMAT,
            name: name.to_string(),
            source_table: schema.name.clone(),
            source_backup: None,
            copied_micros: None,
            schema: (**schema).clone(),
            start_time_micros: start,
            end_time_micros: cut as i64,
            expire_time_micros: expire,
            backup_type,
            hot_to_standard_time_micros,
            size_bytes: chunks.iter().map(|c| c.bytes).sum(),
            uploaded_bytes,
            tablets: tablets
                .iter()
                .map(|r| TabletBounds {
                    start: r.start.to_vec(),
                    end: r.end.as_ref().map(|e| e.to_vec()),
                })
                .collect(),
            chunks,
        };
        check_held(held, name)?;
        self.location.put_manifest(&manifest).await?;
        Ok(manifest)
    }

    /// Reads `ranges` of `schema`'s table from this server's store as of one cut (`at`, or
    /// now) and uploads their chunks; each chunk names the index of its range. Returns the
    /// chunks in key order, whether each was uploaded, and the cut.
    pub async fn export(
        &self,
        schema: Arc<TableSchema>,
        ranges: Vec<RowRange>,
        at: Option<u64>,
    ) -> Result<(Vec<(ChunkRef, bool)>, u64)> {
        let (tx, rx) = tokio::sync::mpsc::channel::<(usize, Chunk)>(TRANSFERS);
        let store = self.store.clone();
        let pace = self.max_bytes_per_sec;
        // Reading, chunking and hashing at the lowest CPU priority: requests come first.
        let scan = crate::background::spawn("backup-scan", move || {
            let mut chunker = Chunker::new();
            let mut range_of_chunk = 0;
            let (began, mut sent) = (std::time::Instant::now(), 0u64);
            let mut send = |range: usize, c: Chunk| {
                // Never ahead of the pace: a chunk waits until the bytes before it are due.
                sent += c.bytes.len() as u64;
                if pace > 0 {
                    let due = Duration::from_secs_f64(sent as f64 / pace as f64);
                    if let Some(wait) = due.checked_sub(began.elapsed()) {
                        std::thread::sleep(wait);
                    }
                }
                tx.blocking_send((range, c))
                    .map_err(|_| basalt_storage::Error::Io("the backup's upload stopped".into()))
            };
            let cut = store.backup_scan(&schema, &ranges, at, &mut |range, k, v| {
                // A chunk closed by this entry holds the previous entries' range.
                let closed = chunker.push(range, k, v);
                let previous = std::mem::replace(&mut range_of_chunk, range);
                match closed {
                    Some(c) => send(previous, c),
                    None => Ok(()),
                }
            })?;
            if let Some(c) = chunker.finish() {
                send(range_of_chunk, c)?;
            }
            Ok::<u64, basalt_storage::Error>(cut)
        });
        let location = self.location.clone();
        let uploads: Vec<Result<(ChunkRef, bool)>> =
            tokio_stream::wrappers::ReceiverStream::new(rx)
                .map(move |(range, c)| {
                    let location = location.clone();
                    async move {
                        let uploaded = location.put_chunk(&c).await?;
                        Ok((
                            ChunkRef {
                                sha256: c.sha256,
                                bytes: c.bytes.len() as u64,
                                entries: c.entries,
                                tablet: range as u32,
                            },
                            uploaded,
                        ))
                    }
                })
                .buffered(TRANSFERS)
                .collect()
                .await;
        let cut = scan
            .await
            .map_err(|e| Error::Internal(format!("backup scan: {e}")))?;
        let uploads = uploads.into_iter().collect::<Result<Vec<_>>>()?;
        Ok((uploads, cut?))
    }

    /// A cluster's backup: one cut at the same clock value on every server that owns a
    /// tablet of the table, each uploading its tablets' chunks. Tried again with a new cut
    /// when a server's clock was past it, a tablet moved meanwhile, or a server did not answer.
    async fn export_cluster(
        &self,
        node: &Arc<Node>,
        schema: &Arc<TableSchema>,
    ) -> Result<(Vec<RowRange>, Vec<(ChunkRef, bool)>, u64)> {
        let id = basalt_control::table_id(&schema.name).to_string();
        let mut margin = CUT_MARGIN_MICROS;
        let mut last = String::new();
        for attempt in 0..CUT_ATTEMPTS {
            let state = node.router.state();
            let tablets: Vec<Tablet> = state.map.tablets(&id).to_vec();
            if tablets.is_empty() {
                return Err(Error::Unavailable(format!(
                    "table {} has no tablets yet; try again",
                    schema.name
                )));
            }
            let mut by_owner: BTreeMap<String, Vec<usize>> = BTreeMap::new();
            for (i, t) in tablets.iter().enumerate() {
                by_owner.entry(t.owner.to_string()).or_default().push(i);
            }
            let cut = self.store.clock_now() + margin;
            let calls = by_owner.iter().map(|(owner, indexes)| {
                let peer = peer(node, &state, owner);
                let ranges = indexes
                    .iter()
                    .map(|&i| {
                        let (start_key, end_key) = basalt_control::range_to_keys(&tablets[i].range);
                        v1::BackupRange { start_key, end_key }
                    })
                    .collect();
                let request = v1::BackupTabletsRequest {
                    table_name: schema.name.clone(),
                    cut,
                    ranges,
                };
                async move {
                    let (address, mut client) = peer.map_err(|e| e.to_string())?;
                    client
                        .backup_tablets(request)
                        .await
                        .map(|r| r.into_inner())
                        .map_err(|s| format!("{address}: {}", s.message()))
                }
            });
            let answers = futures::future::join_all(calls).await;
            let mut per_tablet: Vec<Option<Vec<(ChunkRef, bool)>>> = vec![None; tablets.len()];
            let mut failed = None;
            for ((_, indexes), answer) in by_owner.iter().zip(answers) {
                match answer {
                    Ok(r) if r.tablets.len() == indexes.len() => {
                        for (&i, t) in indexes.iter().zip(r.tablets) {
                            per_tablet[i] = Some(
                                t.chunks
                                    .into_iter()
                                    .map(|c| {
                                        (
                                            ChunkRef {
                                                sha256: c.sha256,
                                                bytes: c.bytes,
                                                entries: c.entries,
                                                tablet: i as u32,
                                            },
                                            c.uploaded,
                                        )
                                    })
                                    .collect(),
                            );
                        }
                    }
                    Ok(_) => failed = Some("a server answered for other tablets".to_string()),
                    Err(e) => failed = Some(e),
                }
            }
            // The tablets must be the same ones, with the same owners, after the cut: a
            // tablet that moved meanwhile may have taken writes below the cut elsewhere.
            let after = node.router.state();
            let unchanged = after.map.tablets(&id) == tablets.as_slice();
            match failed {
                None if unchanged => {
                    let chunks = per_tablet.into_iter().flatten().flatten().collect();
                    let ranges = tablets.iter().map(|t| t.range.clone()).collect();
                    return Ok((ranges, chunks, cut));
                }
                None => last = "a tablet moved during the backup".into(),
                Some(e) => last = e,
            }
            warn!(table = %schema.name, reason = %last, "a backup's cut did not hold; taking it again");
            margin = margin.saturating_mul(4);
            // Longer each time (0.5 s to 8 s): a server that stopped may be back, or its
            // tablets moved, by the next attempt.
            if attempt + 1 < CUT_ATTEMPTS {
                tokio::time::sleep(Duration::from_millis(500 << attempt)).await;
            }
        }
        Err(Error::Unavailable(format!(
            "backup of {} failed {CUT_ATTEMPTS} times; the last: {last}",
            schema.name
        )))
    }

    pub async fn get(&self, name: &str) -> Result<admin::Backup> {
        let parsed = self.own(name)?;
        if let Some(b) = self.creating.lock().get(&parsed.full()) {
            return Ok(b.clone());
        }
        match self.location.manifest(&parsed).await {
            Ok(m) => Ok(backup_proto(&m)),
            Err(Error::NotFound(e)) => {
                // Being created by another server of the cluster?
                if let Some(in_flight) = &self.in_flight {
                    let key = in_flight
                        .meta
                        .keys()
                        .backup_creating(&parsed.cluster, &parsed.backup);
                    if let Some(r) = in_flight.record::<CreatingRecord>(&key).await? {
                        return Ok(r.backup());
                    }
                }
                Err(Error::NotFound(e))
            }
            Err(e) => Err(e),
        }
    }

    pub async fn list(&self, req: admin::ListBackupsRequest) -> Result<admin::ListBackupsResponse> {
        let (p, i, c) = self.check_cluster(&req.parent)?;
        if !req.filter.is_empty() {
            return Err(Error::Unimplemented(
                "ListBackups filters are not supported by Basalt yet".into(),
            ));
        }
        let cluster = (c != "-").then_some(c.as_str());
        let mut all: BTreeMap<String, admin::Backup> = self
            .location
            .list(&p, &i, cluster)
            .await?
            .iter()
            .map(|m| (m.name.clone(), backup_proto(m)))
            .collect();
        // A backup being created: this server's, or (in a cluster) another one's. Once its
        // manifest is written it is READY, even while its record is still there.
        let prefix = match cluster {
            Some(c) => format!("projects/{p}/instances/{i}/clusters/{c}/"),
            None => format!("projects/{p}/instances/{i}/clusters/"),
        };
        let mut creating: Vec<admin::Backup> = self
            .creating
            .lock()
            .iter()
            .filter(|(name, _)| name.starts_with(&prefix))
            .map(|(_, b)| b.clone())
            .collect();
        if let Some(in_flight) = &self.in_flight {
            creating.extend(
                in_flight
                    .creating(cluster)
                    .await?
                    .iter()
                    .filter(|r| r.name.starts_with(&prefix))
                    .map(CreatingRecord::backup),
            );
        }
        for b in creating {
            all.entry(b.name.clone()).or_insert(b);
        }
        let size = if req.page_size > 0 {
            req.page_size as usize
        } else {
            100
        };
        let mut backups: Vec<admin::Backup> = all
            .into_values()
            .filter(|b| req.page_token.is_empty() || b.name > req.page_token)
            .take(size + 1)
            .collect();
        let next_page_token = if backups.len() > size {
            backups.truncate(size);
            backups.last().map(|b| b.name.clone()).unwrap_or_default()
        } else {
            String::new()
        };
        Ok(admin::ListBackupsResponse {
            backups,
            next_page_token,
        })
    }

    pub async fn update(&self, req: admin::UpdateBackupRequest) -> Result<admin::Backup> {
        let backup = req
            .backup
            .ok_or_else(|| Error::InvalidArgument("backup is required".into()))?;
        let name = self.own(&backup.name)?;
        let paths = req.update_mask.map(|m| m.paths).unwrap_or_default();
        if paths.is_empty()
            || paths
                .iter()
                .any(|p| p != "expire_time" && p != "hot_to_standard_time")
        {
            return Err(Error::InvalidArgument(format!(
                "update_mask must name expire_time, hot_to_standard_time or both (the fields of a backup that can change), not {paths:?}"
            )));
        }
        let mut manifest = self.location.manifest(&name).await?;
        if paths.iter().any(|p| p == "expire_time") {
            manifest.expire_time_micros = expire_time(backup.expire_time.as_ref())?;
        }
        if paths.iter().any(|p| p == "hot_to_standard_time") {
            if manifest.backup_type_at(now_micros()) == BackupType::Standard {
                return Err(Error::InvalidArgument(format!(
                    "backup {} is a STANDARD backup: hot_to_standard_time applies only to a HOT backup",
                    name.full()
                )));
            }
            // Unset in the request: the backup stays HOT.
            manifest.hot_to_standard_time_micros = hot_to_standard_time(
                BackupType::Hot,
                backup.hot_to_standard_time.as_ref(),
                manifest.start_time_micros,
            )?;
        }
        self.location.put_manifest(&manifest).await?;
        Ok(backup_proto(&manifest))
    }

    pub async fn delete(&self, name: &str) -> Result<()> {
        let parsed = self.own(name)?;
        self.location.manifest(&parsed).await?;
        self.location.delete(&parsed).await?;
        info!(backup = %parsed.full(), "backup deleted");
        Ok(())
    }

    pub async fn copy(&self, req: admin::CopyBackupRequest) -> Result<lro::Operation> {
        if self.check_cluster(&req.parent)?.2 == "-" {
            return Err(Error::InvalidArgument(
                "CopyBackup needs a cluster, not '-'".into(),
            ));
        }
        let name = BackupName::parse(&format!("{}/backups/{}", req.parent, req.backup_id))?;
        let source = BackupName::parse(&req.source_backup)?;
        let expire = copy_expire_time(req.expire_time.as_ref())?;
        let start = now_micros();
        let op_name = format!("operations/{}/operations/copy-{start}", name.full());
        let held = match &self.in_flight {
            None => None,
            Some(in_flight) => {
                let keys = in_flight.meta.keys();
                let record = InFlightRecord {
                    name: name.full(),
                    backup: source.full(),
                    start_time_micros: start,
                    operation: op_name.clone(),
                    server: in_flight.server.clone(),
                };
                Some(
                    in_flight
                        .begin(
                            "copying",
                            &format!("{}/{}", name.cluster, name.backup),
                            keys.backup_copying(&name.cluster, &name.backup),
                            encode(&record),
                            &[keys.backup_creating(&name.cluster, &name.backup)],
                            || {
                                Error::AlreadyExists(format!(
                                    "backup {} is being created or copied",
                                    name.full()
                                ))
                            },
                        )
                        .await?,
                )
            }
        };
        let copied = self
            .copy_manifest(&name, &source, expire, start, held.as_ref())
            .await;
        let op = match copied {
            Ok((source_manifest, copy)) => {
                let metadata = admin::CopyBackupMetadata {
                    name: copy.name.clone(),
                    source_backup_info: Some(admin::BackupInfo {
                        backup: source.full(),
                        start_time: Some(timestamp(source_manifest.start_time_micros)),
                        end_time: Some(timestamp(source_manifest.end_time_micros)),
                        source_table: source_manifest.source_table.clone(),
                        source_backup: source_manifest.source_backup.clone().unwrap_or_default(),
                    }),
                    progress: Some(admin::OperationProgress {
                        progress_percent: 100,
                        start_time: Some(timestamp(start)),
                        end_time: Some(timestamp(now_micros())),
                    }),
                };
                Ok(self.operation(lro::Operation {
                    name: op_name.clone(),
                    metadata: Some(admin_any("CopyBackupMetadata", &metadata)),
                    done: true,
                    result: Some(lro::operation::Result::Response(admin_any(
                        "Backup",
                        &backup_proto(&copy),
                    ))),
                }))
            }
            Err(e) => Err(e),
        };
        if op.is_ok() {
            self.conclude(&op_name, held).await;
        } else if let Some(held) = held {
            held.release().await;
        }
        op
    }

    /// Writes the manifest of `name`, a copy of `source` (the chunks are shared: a copy is
    /// its manifest). Returns the source's manifest and the copy's.
    async fn copy_manifest(
        &self,
        name: &BackupName,
        source: &BackupName,
        expire: i64,
        start: i64,
        held: Option<&Held>,
    ) -> Result<(Manifest, Manifest)> {
        let _copying = self.collecting.read().await;
        let source_manifest = self.location.manifest(source).await?;
        match self.location.manifest(name).await {
            Err(Error::NotFound(_)) => {}
            Ok(_) => {
                return Err(Error::AlreadyExists(format!(
                    "backup {} already exists",
                    name.full()
                )));
            }
            Err(e) => return Err(e),
        }
        let copy = Manifest {
            name: name.full(),
            source_backup: Some(source.full()),
            copied_micros: Some(start),
            expire_time_micros: expire,
            uploaded_bytes: 0,
            // A copy is a STANDARD backup (CopyBackup asks for no type).
            backup_type: BackupType::Standard,
            hot_to_standard_time_micros: None,
            ..source_manifest.clone()
        };
        check_held(held, &copy.name)?;
        self.location.put_manifest(&copy).await?;
        Ok((source_manifest, copy))
    }

    /// RestoreTable; `to`: point-in-time recovery to that time (microseconds), the backup's
    /// writes and those the log backup shipped after the backup's cut up to it.
    pub async fn restore(
        self: &Arc<Self>,
        req: admin::RestoreTableRequest,
        to: Option<i64>,
    ) -> Result<lro::Operation> {
        parse_instance_name(&req.parent)?;
        self.catalog.check_instance(&req.parent)?;
        validate_table_id(&req.table_id)?;
        let Some(admin::restore_table_request::Source::Backup(backup)) = req.source else {
            return Err(Error::InvalidArgument(
                "RestoreTable needs a backup to restore from".into(),
            ));
        };
        let source = BackupName::parse(&backup)?;
        let table = format!("{}/tables/{}", req.parent, req.table_id);
        if self.store.table(&table).is_ok() {
            return Err(Error::AlreadyExists(format!(
                "table {table} already exists"
            )));
        }
        let start = now_micros();
        let op_name = format!("operations/{table}/operations/restore-{start}");
        let held = match &self.in_flight {
            None => None,
            Some(in_flight) => {
                let record = InFlightRecord {
                    name: table.clone(),
                    backup: source.full(),
                    start_time_micros: start,
                    operation: op_name.clone(),
                    server: in_flight.server.clone(),
                };
                Some(
                    in_flight
                        .begin(
                            "restoring",
                            &req.table_id,
                            in_flight.meta.keys().backup_restoring(&req.table_id),
                            encode(&record),
                            &[],
                            || Error::AlreadyExists(format!("table {table} is being restored")),
                        )
                        .await?,
                )
            }
        };
        let planned = async {
            let manifest = self.location.manifest(&source).await?;
            let replay = match to {
                Some(to) => Some(self.plan_replay(&manifest, to).await?),
                None => None,
            };
            Ok::<_, Error>((manifest, replay))
        }
        .await;
        let (manifest, replay) = match planned {
            Ok(planned) => planned,
            Err(e) => {
                if let Some(held) = held {
                    held.release().await;
                }
                return Err(e);
            }
        };
        let info = admin::BackupInfo {
            backup: source.full(),
            start_time: Some(timestamp(manifest.start_time_micros)),
            end_time: Some(timestamp(manifest.end_time_micros)),
            source_table: manifest.source_table.clone(),
            source_backup: manifest.source_backup.clone().unwrap_or_default(),
        };
        let metadata = {
            let table = table.clone();
            move |percent: i32, end: Option<i64>| admin::RestoreTableMetadata {
                name: table.clone(),
                source_type: admin::RestoreSourceType::Backup as i32,
                optimize_table_operation_name: String::new(),
                progress: Some(admin::OperationProgress {
                    progress_percent: percent,
                    start_time: Some(timestamp(start)),
                    end_time: end.map(timestamp),
                }),
                source_info: Some(admin::restore_table_metadata::SourceInfo::BackupInfo(
                    info.clone(),
                )),
            }
        };
        // The operation runs here before its table exists: the sweep never takes a table
        // this server is filling for abandoned.
        let op = self.operation(lro::Operation {
            name: op_name.clone(),
            metadata: Some(admin_any("RestoreTableMetadata", &metadata(0, None))),
            done: false,
            result: None,
        });
        // The table says, from its creation (one write), which restore fills it: until that
        // restore ends it serves no data, and should this server stop first, a sweep (of any
        // server, or of this one when it starts again) deletes it.
        let created = self
            .catalog
            .create_table(TableSchema {
                id: 0,
                name: table.clone(),
                families: manifest.schema.families.clone(),
                // The backup holds the source's dead cells of dropped families (until a
                // compaction removes them): dead in the restored table too.
                dropped_families: manifest.schema.dropped_families.clone(),
                deletion_protection: false,
                splits: manifest.splits(),
                created_micros: 0,
                restore: Some(RestoreInfo {
                    backup: source.full(),
                    source_table: manifest.source_table.clone(),
                    source_backup: manifest.source_backup.clone(),
                    start_time_micros: manifest.start_time_micros,
                    end_time_micros: manifest.end_time_micros,
                    operation: Some(op_name.clone()),
                }),
            })
            .await;
        let schema = match created {
            Ok(schema) => schema,
            Err(e) => {
                self.operations.lock().remove(&op_name);
                if let Some(held) = held {
                    held.release().await;
                }
                return Err(e);
            }
        };
        let this = self.clone();
        tokio::spawn(async move {
            basalt_control::failpoints::hold("restore-before-fill").await;
            let mut filled = this.fill(&schema, &manifest, &op_name).await;
            if let (Ok(_), Some(replay)) = (&filled, &replay)
                && let Err(e) = this.replay(&schema, replay).await
            {
                filled = Err(e);
            }
            // The restore ends here (its table serves from now on), unless the table is not
            // its own any more: deleted, or taken for abandoned by another server's sweep when
            // this server's record in flight lapsed.
            if filled.is_ok()
                && let Err(e) = this
                    .catalog
                    .finish_restore(&table, schema.id, &op_name)
                    .await
            {
                filled = Err(match e {
                    Error::NotFound(_) | Error::FailedPrecondition(_) => {
                        Error::Unavailable(format!(
                            "table {table} was deleted before its restore ended (by DeleteTable, or by a server that took the restore for abandoned when this server's record in the coordination store lapsed); restore again"
                        ))
                    }
                    e => e,
                });
            }
            match filled {
                Ok(entries) => {
                    info!(table = %table, backup = %source.full(), entries, "table restored");
                    if let Some(op) = this.operations.lock().get_mut(&op_name) {
                        op.metadata = Some(any(
                            "RestoreTableMetadata",
                            &metadata(100, Some(now_micros())),
                        ));
                    }
                    let rendered = admin::Table {
                        name: table.clone(),
                        ..Default::default()
                    };
                    this.finish_operation(
                        &op_name,
                        lro::operation::Result::Response(admin_any("Table", &rendered)),
                    );
                }
                Err(e) => {
                    warn!(table = %table, backup = %source.full(), error = %e, "restore failed; deleting the new table");
                    if let Err(d) = this
                        .catalog
                        .delete_unfinished_restore(&table, schema.id, &op_name)
                        .await
                    {
                        warn!(table = %table, error = %d, "deleting the table of a failed restore; a sweep will");
                    }
                    this.fail_operation(&op_name, &e);
                }
            }
            this.conclude(&op_name, held).await;
        });
        Ok(op)
    }

    /// What a point-in-time restore of `manifest`'s table to `to` (microseconds) replays: the
    /// segments of the source's instance that hold writes after the backup's cut and at most
    /// `to`. Refused when `to` is before the cut or in the future (INVALID_ARGUMENT), or when
    /// the shipped log does not cover it: a server's log backup began after the cut, or has not
    /// shipped through `to` yet (FAILED_PRECONDITION, naming the server and how far it is).
    async fn plan_replay(&self, manifest: &Manifest, to: i64) -> Result<Replay> {
        let cut = manifest.end_time_micros;
        let when = |micros: i64| crate::proto_time::rfc3339(micros);
        if to < cut {
            return Err(Error::InvalidArgument(format!(
                "the restore time {} is before backup {}'s end_time {}: restore from an older backup",
                when(to),
                manifest.name,
                when(cut)
            )));
        }
        if to > now_micros() {
            return Err(Error::InvalidArgument(format!(
                "the restore time {} is in the future",
                when(to)
            )));
        }
        let (instance, table) = parse_table_name(&manifest.source_table)?;
        let (project, instance_id) = parse_instance_name(instance)?;
        let positions = self.location.log_positions(project, instance_id).await?;
        if positions.is_empty() {
            return Err(Error::FailedPrecondition(format!(
                "no log backup of instance {instance} is in the backup location: a restore to a point in time needs log backup on (spec.backupStore.logBackup, or --log-backup-interval-secs)"
            )));
        }
        let segments = self.location.log_segments(project, instance_id).await?;
        let (cut, to) = (cut.max(0) as u64, to.max(0) as u64);
        for p in &positions {
            if p.since_hlc > cut {
                return Err(Error::FailedPrecondition(format!(
                    "server {} of cluster {} ships its writes only since {}, after backup {}'s end_time {}: restore from a later backup",
                    p.server,
                    p.cluster,
                    when(p.since_hlc as i64),
                    manifest.name,
                    when(cut as i64)
                )));
            }
            if !p.stopped && p.covered_hlc <= to {
                return Err(Error::FailedPrecondition(format!(
                    "server {} of cluster {} has shipped its writes up to {} only (last heard {}): restore to an earlier time, or wait for its log backup",
                    p.server,
                    p.cluster,
                    when(p.covered_hlc as i64),
                    when(p.updated_micros)
                )));
            }
        }
        if let Some(s) = segments.iter().find(|s| {
            !positions
                .iter()
                .any(|p| p.server == s.server && p.cluster == s.cluster)
        }) {
            return Err(Error::FailedPrecondition(format!(
                "server {} of cluster {} shipped log segments but no position: its log cannot be known complete",
                s.server, s.cluster
            )));
        }
        Ok(Replay {
            table: table.to_string(),
            cut,
            to,
            segments: segments
                .into_iter()
                .filter(|s| s.max_hlc > cut && s.min_hlc <= to)
                .collect(),
        })
    }

    /// Replays `replay`'s writes into the restored table of `schema`, in every cluster of the
    /// instance, at the versions they took (as replication applies them: any order, and
    /// twice, gives the same table).
    async fn replay(&self, schema: &Arc<TableSchema>, replay: &Replay) -> Result<()> {
        let mut rows_replayed = 0usize;
        for segment in &replay.segments {
            let data = self.location.get_log_segment(segment).await?;
            let mut rows = Vec::new();
            for (table, encoded) in &data.tables {
                if *table != replay.table {
                    continue;
                }
                for bytes in encoded {
                    let row = crate::cluster::replication::decode_row(bytes).map_err(|e| {
                        Error::DataLoss(format!("log segment {}: {e}", segment.path))
                    })?;
                    rows.extend(within(row, replay.cut, replay.to));
                }
            }
            for batch in rows.chunks(REPLAY_BATCH_ROWS) {
                rows_replayed += batch.len();
                self.apply_everywhere(schema, batch.to_vec()).await?;
            }
        }
        info!(table = %schema.name, rows = rows_replayed, segments = replay.segments.len(), "log backup replayed");
        Ok(())
    }

    /// Applies replayed rows to the table of `schema`: here (standalone), or through the
    /// replication service in this cluster and in each other cluster of the instance.
    async fn apply_everywhere(
        &self,
        schema: &Arc<TableSchema>,
        rows: Vec<basalt_storage::ReplicatedRow>,
    ) -> Result<()> {
        let Some(node) = &self.node else {
            return self
                .store
                .apply_replicated_async(schema.clone(), rows)
                .await
                .map_err(Error::from);
        };
        let table = basalt_control::table_id(&schema.name).to_string();
        let request = v1::ApplyRequest {
            origin_cluster: node.config.cluster.clone(),
            tables: vec![v1::ReplicatedTableRows {
                table: table.clone(),
                rows: rows
                    .iter()
                    .map(|r| crate::cluster::replication::encode_row(r.first, &r.row))
                    .collect(),
            }],
            routed: false,
        };
        let peers: Vec<String> = self
            .catalog
            .replicas()
            .into_iter()
            .filter(|c| *c != node.config.cluster)
            .collect();
        let here = crate::cluster::replication::service::apply_rows(
            node,
            &node.config.cluster,
            &table,
            rows,
            false,
        );
        let there = futures::future::try_join_all(peers.iter().map(|peer| {
            let request = &request;
            async move {
                let answered = ask_cluster(node, peer, |address| async move {
                    let mut client = match basalt_control::replication_client(
                        &node.dialer,
                        &address,
                        PEER_CALL_TIMEOUT,
                    ) {
                        Ok(client) => client,
                        Err(e) => return Reply::Next(format!("{address}: {e}")),
                    };
                    match client.apply(request.clone()).await {
                        Ok(_) => Reply::Answered(()),
                        Err(s) => Reply::Next(format!("{address}: {}", s.message())),
                    }
                })
                .await?;
                answered.map_err(|last| {
                    Error::Unavailable(format!(
                        "the log could not be replayed into {} in cluster {peer} ({last})",
                        schema.name
                    ))
                })
            }
        }));
        let (here, there) = tokio::join!(here, there);
        here?;
        there?;
        Ok(())
    }

    /// Fills the new table of `schema` with the backup's entries: here, or in a cluster on
    /// the servers the master placed its tablets on — in every cluster of the instance, each
    /// holding the whole table. Returns the entries restored (in this cluster).
    async fn fill(
        &self,
        schema: &Arc<TableSchema>,
        manifest: &Manifest,
        operation: &str,
    ) -> Result<u64> {
        match &self.node {
            None => {
                let names = manifest.chunks.iter().map(|c| c.sha256.clone()).collect();
                self.ingest_chunks(schema.clone(), names).await
            }
            Some(node) => {
                let (here, others) = futures::join!(
                    self.fill_cluster(node, schema, manifest),
                    self.fill_other_clusters(node, schema, operation)
                );
                others?;
                here
            }
        }
    }

    /// Has one server of each other cluster of the instance fill the table in its cluster
    /// (`FillRestoredTable`), reached where the other clusters reach it (its peer endpoint,
    /// or its servers: [`basalt_meta::Meta::peer_addresses`]). The ingested data is not in
    /// the change log: without this the other clusters would hold an empty table.
    async fn fill_other_clusters(
        &self,
        node: &Arc<Node>,
        schema: &Arc<TableSchema>,
        operation: &str,
    ) -> Result<()> {
        let peers: Vec<String> = self
            .catalog
            .replicas()
            .into_iter()
            .filter(|c| *c != node.config.cluster)
            .collect();
        let request = v1::FillRestoredTableRequest {
            table_name: schema.name.clone(),
            operation: operation.to_string(),
        };
        let fills = peers.iter().map(|peer| {
            let request = &request;
            async move {
                let answered = ask_cluster(node, peer, |address| async move {
                    let mut client = match basalt_control::backup_client(
                        &node.dialer,
                        &address,
                        PEER_CALL_TIMEOUT,
                    ) {
                        Ok(client) => client,
                        Err(e) => return Reply::Next(format!("{address}: {e}")),
                    };
                    match client.fill_restored_table(request.clone()).await {
                        Ok(_) => Reply::Answered(()),
                        Err(s) if s.code() == tonic::Code::Unimplemented => {
                            Reply::Final(Error::FailedPrecondition(format!(
                                "cluster {peer} keeps no backups (its servers have no backup location), so the table cannot be restored there"
                            )))
                        }
                        // The table is not that restore's any more, or the backup is
                        // damaged: no other server of that cluster would do better.
                        Err(s)
                            if matches!(
                                s.code(),
                                tonic::Code::FailedPrecondition
                                    | tonic::Code::DataLoss
                                    | tonic::Code::NotFound
                            ) =>
                        {
                            Reply::Final(error_of_status(&address, &s))
                        }
                        Err(s) => Reply::Next(format!("{address}: {}", s.message())),
                    }
                })
                .await?;
                answered.map_err(|last| {
                    Error::Unavailable(format!(
                        "table {} was not restored in cluster {peer} ({last})",
                        schema.name
                    ))
                })
            }
        });
        for filled in futures::future::join_all(fills).await {
            filled?;
        }
        Ok(())
    }

    /// A cluster's restore: once the master placed the new table's tablets (the backup's
    /// tablets) and no move of them is in progress, each owner downloads and ingests its
    /// tablets' chunks. Ingested files do not follow a move whose snapshot was taken before
    /// them: when a tablet moved or began moving meanwhile, the fill is done again (ingesting
    /// the same entries twice leaves the same cells).
    async fn fill_cluster(
        &self,
        node: &Arc<Node>,
        schema: &Arc<TableSchema>,
        manifest: &Manifest,
    ) -> Result<u64> {
        let id = basalt_control::table_id(&schema.name).to_string();
        let wanted = manifest.tablets.len().max(1);
        let placed = node
            .router
            .wait_for(
                |state| {
                    let tablets = state.map.tablets(&id);
                    tablets.len() == wanted
                        && tablets
                            .iter()
                            .all(|t| state.servers.contains_key(t.owner.as_str()))
                },
                PLACEMENT_TIMEOUT,
            )
            .await;
        if !placed {
            return Err(Error::Unavailable(format!(
                "the tablets of {} were not placed on servers within {PLACEMENT_TIMEOUT:?}",
                schema.name
            )));
        }
        for _ in 0..CUT_ATTEMPTS {
            let tablets = settled_tablets(node, &id, wanted).await?;
            let entries = self.fill_tablets(node, schema, manifest, &tablets).await?;
            // Moves first, then the map: a move still going on shows in the first, one that
            // ended since the fill began in the second.
            if moving(node, &id).await?.is_none() && current_tablets(node, &id).await? == tablets {
                return Ok(entries);
            }
            warn!(table = %schema.name, "a tablet of a table being restored moved meanwhile; filling it again");
        }
        Err(Error::Unavailable(format!(
            "the tablets of {} kept moving while they were restored ({CUT_ATTEMPTS} times)",
            schema.name
        )))
    }

    /// Has the owner of each of `tablets` ingest its chunks of the backup.
    async fn fill_tablets(
        &self,
        node: &Arc<Node>,
        schema: &Arc<TableSchema>,
        manifest: &Manifest,
        tablets: &[Tablet],
    ) -> Result<u64> {
        let state = node.router.state();
        let mut by_owner: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for c in &manifest.chunks {
            let start = manifest
                .tablets
                .get(c.tablet as usize)
                .map(|t| t.start.as_slice())
                .unwrap_or_default();
            let tablet = tablets
                .iter()
                .find(|t| t.range.start.as_ref() == start)
                .ok_or_else(|| {
                    Error::Internal(format!(
                        "the restored table has no tablet starting at {start:?}"
                    ))
                })?;
            by_owner
                .entry(tablet.owner.to_string())
                .or_default()
                .push(c.sha256.clone());
        }
        let calls = by_owner.into_iter().map(|(owner, chunks)| {
            let peer = peer(node, &state, &owner);
            let request = v1::RestoreTabletsRequest {
                table_name: schema.name.clone(),
                chunks,
            };
            async move {
                let (address, mut client) = peer?;
                client
                    .restore_tablets(request)
                    .await
                    .map(|r| r.into_inner().entries)
                    .map_err(|s| error_of_status(&address, &s))
            }
        });
        let mut entries = 0;
        for answer in futures::future::join_all(calls).await {
            entries += answer?;
        }
        Ok(entries)
    }

    /// Downloads chunks (checked), writes them as SST files and ingests them at once into
    /// `schema`'s table in this server's store. Returns the entries restored.
    pub async fn ingest_chunks(&self, schema: Arc<TableSchema>, names: Vec<String>) -> Result<u64> {
        // The chunks stay while they are read, even if the backup is deleted meanwhile.
        let _reading = self.collecting.read().await;
        let (tx, mut rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(TRANSFERS);
        let store = self.store.clone();
        let table = schema.clone();
        let dir = self
            .scratch
            .join(format!("restore-{}-{}", schema.id, now_micros()));
        let work = dir.clone();
        let writer = tokio::task::spawn_blocking(move || -> Result<u64> {
            let mut w = store.restore_writer(&table, &work)?;
            while let Some(bytes) = rx.blocking_recv() {
                for (k, v) in chunk::entries(&bytes)? {
                    w.put(k, v)?;
                }
            }
            Ok(w.ingest()?)
        });
        let location = self.location.clone();
        let mut downloads = futures::stream::iter(names)
            .map(move |name| {
                let location = location.clone();
                async move { location.get_chunk(&name).await }
            })
            .buffered(TRANSFERS);
        let mut failed = None;
        while let Some(got) = downloads.next().await {
            match got {
                Ok(bytes) => {
                    if tx.send(bytes).await.is_err() {
                        break;
                    }
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        drop(tx);
        let written = writer
            .await
            .map_err(|e| Error::Internal(format!("restore: {e}")));
        let _ = std::fs::remove_dir_all(&dir);
        if let Some(e) = failed {
            return Err(e);
        }
        written?
    }

    /// Restores that will never end: their table still says a restore fills it, but no
    /// server runs that restore — not this one, and (in a cluster) no other, whose record in
    /// flight would be there while its lease lives. Each such table is deleted (only if it is
    /// still that restore's: one sweep of one server does it, and a restore that ended
    /// meanwhile keeps its table), and in a cluster its operation recorded as failed, so that
    /// nobody goes on reading a table that holds part of a backup.
    async fn abandoned_restores(&self) -> Result<()> {
        for table in self.store.all_tables() {
            let Some(op) = table.restoring() else {
                continue;
            };
            if self.operations.lock().get(op).is_some_and(|o| !o.done) {
                continue; // running here
            }
            if let Some(in_flight) = &self.in_flight {
                let id = basalt_control::table_id(&table.name);
                let key = in_flight.meta.keys().backup_restoring(id);
                if in_flight.meta.value(&key).await?.is_some() {
                    continue; // running on another server
                }
            }
            if !self
                .catalog
                .delete_unfinished_restore(&table.name, table.id, op)
                .await?
            {
                continue; // ended meanwhile, or taken by another server
            }
            let backup = table.restore.as_ref().map_or("", |r| r.backup.as_str());
            let e = Error::Unavailable(format!(
                "restore of table {} from backup {backup} did not finish: the server running it stopped, and its half-restored table was deleted; restore again",
                table.name
            ));
            warn!(table = %table.name, %backup, operation = op, "a restore's server stopped before it ended; its table deleted");
            if let Some(in_flight) = &self.in_flight {
                in_flight
                    .finished(&lro::Operation {
                        name: op.to_string(),
                        metadata: None,
                        done: true,
                        result: Some(lro::operation::Result::Error(rpc_status(&e))),
                    })
                    .await;
            }
        }
        Ok(())
    }

    /// Deletes the tables of abandoned restores, the expired backups, then the chunks no
    /// backup holds.
    async fn sweep(&self) -> Result<()> {
        if let Err(e) = self.abandoned_restores().await {
            warn!(error = %e, "looking for abandoned restores failed; trying again at the next sweep");
        }
        let now = now_micros();
        for m in self.location.all().await? {
            if m.expire_time_micros <= now {
                let name = BackupName::parse(&m.name)?;
                match self.location.delete(&name).await {
                    // Another server of the cluster swept it first.
                    Ok(()) | Err(Error::NotFound(_)) => {}
                    Err(e) => return Err(e),
                }
                info!(backup = %m.name, "expired backup deleted");
            }
        }
        if let Some(log) = self.log_backup.get()
            && let Err(e) = log.sweep().await
        {
            warn!(error = %e, "deleting log segments past the retention failed; trying again at the next sweep");
        }
        let _collecting = self.collecting.write().await;
        let freed = match &self.in_flight {
            None => self.location.collect_chunks(UNHELD_CHUNK_AGE).await?,
            // A cluster's servers share the location: one collection at a time, and none
            // while a backup, copy or restore is in flight on any server (see InFlight).
            Some(in_flight) => match in_flight.collect(&self.location).await? {
                Collection::Done(freed) => freed,
                Collection::NotNow(in_the_way) => {
                    debug!(%in_the_way, "not collecting unheld backup chunks now");
                    0
                }
            },
        };
        if freed > 0 {
            info!(bytes = freed, "backup chunks no backup holds deleted");
        }
        Ok(())
    }
}

/// Rows replayed per apply.
const REPLAY_BATCH_ROWS: usize = 1000;

/// The metadata key a RestoreTable request names its point in time with (RFC 3339).
pub const RESTORE_TIME_HEADER: &str = "x-basalt-restore-time";

/// The point in time a RestoreTable request asks for (`x-basalt-restore-time`, RFC 3339), in
/// microseconds; None for a plain restore of the backup.
pub fn restore_time(metadata: &tonic::metadata::MetadataMap) -> Result<Option<i64>> {
    let Some(value) = metadata.get(RESTORE_TIME_HEADER) else {
        return Ok(None);
    };
    let text = value
        .to_str()
        .map_err(|_| Error::InvalidArgument(format!("{RESTORE_TIME_HEADER} is not text")))?;
    let t: prost_types::Timestamp = text.trim().parse().map_err(|_| {
        Error::InvalidArgument(format!(
            "{RESTORE_TIME_HEADER} {text:?} is not an RFC 3339 time (e.g. 2026-11-29T19:40:05Z)"
        ))
    })?;
    Ok(Some(micros_of(&t)))
}

/// A point-in-time restore's replay (see [`Backups::plan_replay`]).
struct Replay {
    /// The source table's id: its rows in the segments.
    table: String,
    cut: u64,
    to: u64,
    segments: Vec<basalt_backup::SegmentRef>,
}

/// The part of `row` whose versions are after `cut` and at most `to` (its mutations' versions
/// are consecutive: a slice of them).
fn within(
    row: basalt_storage::ReplicatedRow,
    cut: u64,
    to: u64,
) -> Option<basalt_storage::ReplicatedRow> {
    let n = row.row.mutations.len() as u64;
    let first = row.first.hlc;
    let lo = cut.saturating_add(1).max(first);
    let hi = to.min(first.saturating_add(n).saturating_sub(1));
    if n == 0 || lo > hi {
        return None;
    }
    let (a, b) = ((lo - first) as usize, (hi - first) as usize + 1);
    Some(basalt_storage::ReplicatedRow {
        first: basalt_model::hlc::Version {
            hlc: lo,
            cluster: row.first.cluster,
        },
        row: basalt_model::RowMutation {
            row: row.row.row,
            mutations: row.row.mutations[a..b].to_vec(),
        },
    })
}

/// The tablets of table `id` as etcd has them now (not as this server last heard).
async fn current_tablets(node: &Node, id: &str) -> Result<Vec<Tablet>> {
    let (map, _) = node.meta.tablets(&node.config.cluster).await?;
    Ok(map.tablets(id).to_vec())
}

/// A move of a tablet of table `id` in progress (its id), as etcd has them now.
async fn moving(node: &Node, id: &str) -> Result<Option<String>> {
    Ok(node
        .meta
        .moves(&node.config.cluster)
        .await?
        .into_iter()
        .find(|m| m.table == id)
        .map(|m| m.id))
}

/// The `wanted` tablets of table `id` once none of them is moving (up to
/// [`PLACEMENT_TIMEOUT`]).
async fn settled_tablets(node: &Node, id: &str, wanted: usize) -> Result<Vec<Tablet>> {
    let deadline = tokio::time::Instant::now() + PLACEMENT_TIMEOUT;
    loop {
        let busy = moving(node, id).await?;
        if busy.is_none() {
            let tablets = current_tablets(node, id).await?;
            if tablets.len() == wanted {
                return Ok(tablets);
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::Unavailable(format!(
                "the tablets of table {id} did not stop moving within {PLACEMENT_TIMEOUT:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A backup or copy writes its manifest only while its record in flight surely lives: with
/// the record gone, a collection may have deleted chunks it found present ([`InFlight`]).
fn check_held(held: Option<&Held>, name: &str) -> Result<()> {
    match held {
        Some(held) if !held.holds(HOLD_MARGIN) => Err(Error::Unavailable(format!(
            "backup {name}: its record in the coordination store could not be kept alive (etcd unreachable?), so chunks it relies on may have been collected; its manifest was not written, create it again"
        ))),
        _ => Ok(()),
    }
}

/// A peer's failure as this server's: the peer's code where it says what happened to the
/// data (DATA_LOSS, NOT_FOUND), else UNAVAILABLE naming the peer.
fn error_of_status(address: &str, s: &tonic::Status) -> Error {
    match s.code() {
        tonic::Code::DataLoss => Error::DataLoss(s.message().to_string()),
        tonic::Code::NotFound => Error::NotFound(s.message().to_string()),
        _ => Error::Unavailable(format!("{address}: {}", s.message())),
    }
}

/// `basalt.control.v1.TabletBackup`: this server's part of a cluster's backup or restore,
/// asked by the server coordinating it.
pub struct BackupService {
    backups: Arc<Backups>,
}

impl BackupService {
    pub fn new(backups: Arc<Backups>) -> Self {
        Self { backups }
    }

    /// The table `name`, once this server's catalog mirror has it (a restore's new table was
    /// just created through etcd).
    async fn table(&self, name: &str) -> Result<Arc<TableSchema>> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            match self.backups.store.table(name) {
                Ok(t) => return Ok(t),
                Err(_) if tokio::time::Instant::now() < deadline => {
                    self.backups.catalog.catch_up(name).await;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

#[tonic::async_trait]
impl basalt_control::TabletBackup for BackupService {
    async fn backup_tablets(
        &self,
        request: tonic::Request<v1::BackupTabletsRequest>,
    ) -> Result<tonic::Response<v1::BackupTabletsResponse>, tonic::Status> {
        let req = request.into_inner();
        let r = async {
            let schema = self.table(&req.table_name).await?;
            let ranges: Vec<RowRange> = req
                .ranges
                .iter()
                .map(|r| basalt_control::keys_to_range(&r.start_key, &r.end_key))
                .collect();
            let count = ranges.len();
            let (chunks, _) = self.backups.export(schema, ranges, Some(req.cut)).await?;
            let mut tablets = vec![v1::TabletChunks::default(); count];
            for (c, uploaded) in chunks {
                tablets[c.tablet as usize].chunks.push(v1::BackupChunkRef {
                    sha256: c.sha256,
                    bytes: c.bytes,
                    entries: c.entries,
                    uploaded,
                });
            }
            Ok(v1::BackupTabletsResponse { tablets })
        }
        .await;
        r.map(tonic::Response::new).map_err(crate::error::status)
    }

    async fn restore_tablets(
        &self,
        request: tonic::Request<v1::RestoreTabletsRequest>,
    ) -> Result<tonic::Response<v1::RestoreTabletsResponse>, tonic::Status> {
        let req = request.into_inner();
        let r = async {
            let schema = self.table(&req.table_name).await?;
            let entries = self.backups.ingest_chunks(schema, req.chunks).await?;
            Ok(v1::RestoreTabletsResponse { entries })
        }
        .await;
        r.map(tonic::Response::new).map_err(crate::error::status)
    }

    async fn fill_restored_table(
        &self,
        request: tonic::Request<v1::FillRestoredTableRequest>,
    ) -> Result<tonic::Response<v1::FillRestoredTableResponse>, tonic::Status> {
        let req = request.into_inner();
        let r = async {
            let schema = self.table(&req.table_name).await?;
            let (Some(node), Some(restore)) = (&self.backups.node, &schema.restore) else {
                return Err(Error::FailedPrecondition(format!(
                    "table {} is not being restored here",
                    req.table_name
                )));
            };
            if schema.restoring() != Some(req.operation.as_str()) {
                return Err(Error::FailedPrecondition(format!(
                    "table {} is not being restored by {}",
                    req.table_name, req.operation
                )));
            }
            let manifest = self
                .backups
                .location
                .manifest(&BackupName::parse(&restore.backup)?)
                .await?;
            let entries = self.backups.fill_cluster(node, &schema, &manifest).await?;
            Ok(v1::FillRestoredTableResponse { entries })
        }
        .await;
        r.map(tonic::Response::new).map_err(crate::error::status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(first: u64, n: usize) -> basalt_storage::ReplicatedRow {
        basalt_storage::ReplicatedRow {
            first: basalt_model::hlc::Version {
                hlc: first,
                cluster: 3,
            },
            row: basalt_model::RowMutation {
                row: bytes::Bytes::from_static(b"r"),
                mutations: (0..n)
                    .map(|i| basalt_model::Mutation::DeleteFromColumn {
                        family: "cf".into(),
                        qualifier: bytes::Bytes::from(vec![i as u8]),
                        start: 0,
                        end: 0,
                    })
                    .collect(),
            },
        }
    }

    #[test]
    fn a_replayed_row_keeps_the_mutations_after_the_cut_and_at_most_the_time_asked() {
        // Mutations at 10, 11, 12, 13.
        let qualifiers = |r: Option<basalt_storage::ReplicatedRow>| {
            r.map(|r| {
                let first = r.first.hlc;
                let q = r
                    .row
                    .mutations
                    .iter()
                    .map(|m| match m {
                        basalt_model::Mutation::DeleteFromColumn { qualifier, .. } => qualifier[0],
                        _ => unreachable!(),
                    })
                    .collect::<Vec<u8>>();
                (first, q)
            })
        };
        assert_eq!(
            qualifiers(within(row(10, 4), 0, 100)),
            Some((10, vec![0, 1, 2, 3]))
        );
        assert_eq!(qualifiers(within(row(10, 4), 11, 12)), Some((12, vec![2])));
        assert_eq!(
            qualifiers(within(row(10, 4), 10, 13)),
            Some((11, vec![1, 2, 3]))
        );
        assert_eq!(qualifiers(within(row(10, 4), 9, 10)), Some((10, vec![0])));
        assert_eq!(qualifiers(within(row(10, 4), 13, 100)), None);
        assert_eq!(qualifiers(within(row(10, 4), 0, 9)), None);
        assert_eq!(qualifiers(within(row(10, 0), 0, 100)), None);
        assert_eq!(within(row(10, 4), 11, 12).unwrap().first.cluster, 3);
    }

    #[test]
    fn the_restore_time_is_rfc_3339_in_the_requests_metadata() {
        let mut md = tonic::metadata::MetadataMap::new();
        assert_eq!(restore_time(&md).unwrap(), None);
        md.insert(
            RESTORE_TIME_HEADER,
            "2026-11-29T14:02:59.5Z".parse().unwrap(),
        );
        assert_eq!(restore_time(&md).unwrap(), Some(1_795_960_979_500_000));
        md.insert(RESTORE_TIME_HEADER, "yesterday".parse().unwrap());
        let e = restore_time(&md).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument(m) if m.contains("yesterday")),
            "{e}"
        );
    }

    #[test]
    fn operation_names_name_their_resource_kind_and_start() {
        assert_eq!(
            parse_operation_name(
                "operations/projects/p/instances/i/clusters/c/backups/b/operations/create-17"
            ),
            Some(("projects/p/instances/i/clusters/c/backups/b", "create", 17))
        );
        assert_eq!(
            parse_operation_name("operations/projects/p/instances/i/tables/t/operations/restore-5"),
            Some(("projects/p/instances/i/tables/t", "restore", 5))
        );
        assert_eq!(
            parse_operation_name("operations/x/operations/create-soon"),
            None
        );
        assert_eq!(parse_operation_name("projects/p/operations/create-1"), None);
        assert_eq!(parse_operation_name("operations/x"), None);
    }

    #[test]
    fn a_creating_record_shows_a_creating_backup() {
        let r = CreatingRecord {
            name: "projects/p/instances/i/clusters/c/backups/b".into(),
            source_table: "projects/p/instances/i/tables/t".into(),
            start_time_micros: 1_500_000,
            expire_time_micros: 9_000_000,
            operation:
                "operations/projects/p/instances/i/clusters/c/backups/b/operations/create-1500000"
                    .into(),
            server: "st-1".into(),
            backup_type: BackupType::Hot,
            hot_to_standard_time_micros: None,
        };
        let back: CreatingRecord = decode("k", &encode(&r)).unwrap();
        let b = back.backup();
        assert_eq!(b.name, r.name);
        assert_eq!(b.state, admin::backup::State::Creating as i32);
        assert_eq!(b.start_time, Some(timestamp(1_500_000)));
        assert_eq!(b.expire_time, Some(timestamp(9_000_000)));
        assert_eq!(b.backup_type, admin::backup::BackupType::Hot as i32);
        assert_eq!(b.end_time, None);
    }

    #[test]
    fn expire_times_are_6_hours_to_90_days_from_now_counted_from_the_callers_clock() {
        let hour = 3600 * 1_000_000;
        let at = |micros: i64| Some(timestamp(now_micros() + micros));
        // A caller that counted 6 hours from its clock a second ago is within the rule.
        assert!(expire_time(at(6 * hour - 1_000_000).as_ref()).is_ok());
        assert!(expire_time(at(90 * 24 * hour - 1_000_000).as_ref()).is_ok());
        for short in [6 * hour - 2 * CLOCK_SLACK_MICROS, hour, 91 * 24 * hour] {
            match expire_time(at(short).as_ref()) {
                Err(Error::InvalidArgument(m)) => assert!(m.contains("at least 6 hours"), "{m}"),
                other => panic!("{other:?}"),
            }
        }
        assert!(copy_expire_time(at(31 * 24 * hour).as_ref()).is_err());
    }

    #[test]
    fn backup_types_follow_bigtables_rules() {
        use admin::backup::BackupType as Proto;
        let day = 24 * 3600 * 1_000_000;
        let created = 1_000 * day;
        let asked = |kind: Proto, hot: Option<i64>| admin::Backup {
            backup_type: kind as i32,
            hot_to_standard_time: hot.map(timestamp),
            ..Default::default()
        };
        assert_eq!(
            backup_type(&asked(Proto::Unspecified, None), created).unwrap(),
            (BackupType::Standard, None)
        );
        assert_eq!(
            backup_type(&asked(Proto::Hot, None), created).unwrap(),
            (BackupType::Hot, None)
        );
        assert_eq!(
            backup_type(&asked(Proto::Hot, Some(created + day)), created).unwrap(),
            (BackupType::Hot, Some(created + day))
        );
        // Counted from the caller's clock a moment before: within the slack.
        let just_short = created + day - 1_000_000;
        assert_eq!(
            backup_type(&asked(Proto::Hot, Some(just_short)), created).unwrap(),
            (BackupType::Hot, Some(just_short))
        );
        for (bad, why) in [
            (
                asked(Proto::Hot, Some(created + day - CLOCK_SLACK_MICROS - 1)),
                "at least 24 hours",
            ),
            (
                asked(Proto::Standard, Some(created + 2 * day)),
                "only to a HOT",
            ),
            (
                admin::Backup {
                    backup_type: 7,
                    ..Default::default()
                },
                "not a backup type",
            ),
        ] {
            match backup_type(&bad, created) {
                Err(Error::InvalidArgument(m)) => assert!(m.contains(why), "{m}"),
                other => panic!("{other:?}"),
            }
        }
        // A copy's expire time: at most 30 days, where a backup's may be 90.
        let in_days = |d: i64| timestamp(now_micros() + d * day);
        assert!(copy_expire_time(Some(&in_days(29))).is_ok());
        assert!(copy_expire_time(Some(&in_days(31))).is_err());
        assert!(expire_time(Some(&in_days(31))).is_ok());
    }
}
