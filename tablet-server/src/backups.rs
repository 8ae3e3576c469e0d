//! Bigtable's backups on a standalone server (`docs/backups.md`): CreateBackup, GetBackup,
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
//! The operations live in this process's memory: after a restart GetOperation no longer knows
//! them (the backups themselves are in the object store).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use basalt_backup::{BackupName, BackupStore, Chunk, ChunkRef, Chunker, Manifest, chunk};
use basalt_model::TableSchema;
use basalt_model::hlc::now_micros;
use basalt_model::schema::{parse_instance_name, parse_table_name, validate_table_id};
use basalt_storage::Store;
use futures::StreamExt;
use googleapis_tonic_google_bigtable_admin_v2::google::bigtable::admin::v2 as admin;
use googleapis_tonic_google_longrunning::google::longrunning as lro;
use parking_lot::Mutex;
use prost::Message;
use tracing::{info, warn};

use crate::catalog::Catalog;
use crate::error::{Error, Result, rpc_status};

/// Bigtable's bounds on a backup's `expire_time`, from the request's arrival.
const MIN_RETENTION_MICROS: i64 = 6 * 3600 * 1_000_000;
const MAX_RETENTION_MICROS: i64 = 90 * 24 * 3600 * 1_000_000;
/// Chunks held by no backup are deleted once they are this old (a backup being written has
/// uploaded chunks its manifest does not name yet).
const UNHELD_CHUNK_AGE: Duration = Duration::from_secs(3600);
/// Chunks uploaded or downloaded at once.
const TRANSFERS: usize = 4;

/// Where backups go and how often expired ones are swept.
#[derive(Clone, Debug)]
pub struct BackupConfig {
    /// `s3://bucket/prefix` or `file:///path`.
    pub url: String,
    pub sweep_interval: Duration,
    /// The most bytes per second a backup reads and uploads (0: no limit), so that a backup
    /// leaves the server's requests their latency.
    pub max_bytes_per_sec: u64,
}

pub struct Backups {
    store: Arc<Store>,
    catalog: Arc<dyn Catalog>,
    location: BackupStore,
    /// This server's cluster id: backups are made in it.
    cluster: String,
    /// Where a restore writes its SST files before they are ingested (the data directory).
    scratch: std::path::PathBuf,
    /// Backups being created (CREATING), by name.
    creating: Mutex<BTreeMap<String, admin::Backup>>,
    operations: Mutex<HashMap<String, lro::Operation>>,
    /// A backup's pace, in bytes per second (0: no limit).
    max_bytes_per_sec: u64,
    /// Held for reading while a backup uploads chunks and writes its manifest, for writing
    /// while unheld chunks are deleted.
    collecting: tokio::sync::RwLock<()>,
}

fn timestamp(micros: i64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: micros.div_euclid(1_000_000),
        nanos: (micros.rem_euclid(1_000_000) * 1000) as i32,
    }
}

fn micros_of(t: &prost_types::Timestamp) -> i64 {
    t.seconds
        .saturating_mul(1_000_000)
        .saturating_add(i64::from(t.nanos) / 1000)
}

fn any<M: Message>(type_name: &str, m: &M) -> prost_types::Any {
    prost_types::Any {
        type_url: format!("type.googleapis.com/google.bigtable.admin.v2.{type_name}"),
        value: m.encode_to_vec(),
    }
}

/// The expire time a request asks for, within Bigtable's 6 hours to 90 days from now.
fn expire_time(t: Option<&prost_types::Timestamp>) -> Result<i64> {
    let t = t.ok_or_else(|| Error::InvalidArgument("backup.expire_time is required".into()))?;
    let at = micros_of(t);
    let now = now_micros();
    if at < now + MIN_RETENTION_MICROS || at > now + MAX_RETENTION_MICROS {
        return Err(Error::InvalidArgument(format!(
            "expire_time {}s is out of range: a backup is kept at least 6 hours and at most 90 days from now",
            t.seconds
        )));
    }
    Ok(at)
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
        backup_type: admin::backup::BackupType::Standard as i32,
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

impl Backups {
    /// Opens the backup location (`config.url`) and starts the sweeper.
    pub fn start(
        store: Arc<Store>,
        catalog: Arc<dyn Catalog>,
        cluster: String,
        scratch: std::path::PathBuf,
        config: &BackupConfig,
    ) -> Result<Arc<Backups>> {
        let location = BackupStore::open(&config.url)?;
        info!(location = %config.url, "backups kept in");
        let backups = Arc::new(Backups {
            store,
            catalog,
            location,
            cluster,
            scratch,
            max_bytes_per_sec: config.max_bytes_per_sec,
            creating: Mutex::default(),
            operations: Mutex::default(),
            collecting: tokio::sync::RwLock::new(()),
        });
        let weak = Arc::downgrade(&backups);
        let interval = config.sweep_interval.max(Duration::from_secs(1));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(interval).await;
                let Some(backups) = weak.upgrade() else {
                    return;
                };
                if let Err(e) = backups.sweep().await {
                    warn!(error = %e, "sweeping expired backups failed; trying again later");
                }
            }
        });
        Ok(backups)
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

    fn finish_operation(&self, name: &str, result: lro::operation::Result) {
        if let Some(op) = self.operations.lock().get_mut(name) {
            op.done = true;
            op.result = Some(result);
        }
    }

    fn fail_operation(&self, name: &str, e: &Error) {
        self.finish_operation(name, lro::operation::Result::Error(rpc_status(e)));
    }

    pub fn get_operation(&self, name: &str) -> Result<lro::Operation> {
        self.operations
            .lock()
            .get(name)
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("operation {name} not found")))
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
        let expire = expire_time(backup.expire_time.as_ref())?;
        let full = name.full();
        let start = now_micros();
        {
            let mut creating = self.creating.lock();
            if creating.contains_key(&full) {
                return Err(Error::AlreadyExists(format!(
                    "backup {full} is being created"
                )));
            }
            creating.insert(
                full.clone(),
                admin::Backup {
                    name: full.clone(),
                    source_table: backup.source_table.clone(),
                    expire_time: Some(timestamp(expire)),
                    start_time: Some(timestamp(start)),
                    state: admin::backup::State::Creating as i32,
                    backup_type: admin::backup::BackupType::Standard as i32,
                    ..Default::default()
                },
            );
        }
        match self.location.manifest(&name).await {
            Err(Error::NotFound(_)) => {}
            Ok(_) => {
                self.creating.lock().remove(&full);
                return Err(Error::AlreadyExists(format!(
                    "backup {full} already exists"
                )));
            }
            Err(e) => {
                self.creating.lock().remove(&full);
                return Err(e);
            }
        }
        let op_name = format!("operations/{full}/operations/create-{start}");
        let metadata = admin::CreateBackupMetadata {
            name: full.clone(),
            source_table: backup.source_table.clone(),
            start_time: Some(timestamp(start)),
            end_time: None,
        };
        let op = self.operation(lro::Operation {
            name: op_name.clone(),
            metadata: Some(any("CreateBackupMetadata", &metadata)),
            done: false,
            result: None,
        });
        let this = self.clone();
        tokio::spawn(async move {
            let made = this.make(&full, &schema, start, expire).await;
            this.creating.lock().remove(&full);
            match made {
                Ok(manifest) => {
                    info!(backup = %full, bytes = manifest.size_bytes, uploaded = manifest.uploaded_bytes, "backup created");
                    if let Some(op) = this.operations.lock().get_mut(&op_name) {
                        let metadata = admin::CreateBackupMetadata {
                            end_time: Some(timestamp(now_micros())),
                            ..metadata
                        };
                        op.metadata = Some(any("CreateBackupMetadata", &metadata));
                    }
                    this.finish_operation(
                        &op_name,
                        lro::operation::Result::Response(any("Backup", &backup_proto(&manifest))),
                    );
                }
                Err(e) => {
                    warn!(backup = %full, error = %e, "backup failed");
                    this.fail_operation(&op_name, &e);
                }
            }
        });
        Ok(op)
    }

    /// Reads the table as of one cut, uploads the chunks the location lacks, then writes the
    /// manifest.
    async fn make(
        &self,
        name: &str,
        schema: &Arc<TableSchema>,
        start: i64,
        expire: i64,
    ) -> Result<Manifest> {
        let _uploading = self.collecting.read().await;
        let (tx, rx) = tokio::sync::mpsc::channel::<Chunk>(TRANSFERS);
        let store = self.store.clone();
        let table = schema.clone();
        let pace = self.max_bytes_per_sec;
        let scan = tokio::task::spawn_blocking(move || {
            let mut chunker = Chunker::new();
            let (began, mut sent) = (std::time::Instant::now(), 0u64);
            let mut send = |c: Chunk| {
                // Never ahead of the pace: a chunk waits until the bytes before it are due.
                sent += c.bytes.len() as u64;
                if pace > 0 {
                    let due = Duration::from_secs_f64(sent as f64 / pace as f64);
                    if let Some(wait) = due.checked_sub(began.elapsed()) {
                        std::thread::sleep(wait);
                    }
                }
                tx.blocking_send(c)
                    .map_err(|_| basalt_storage::Error::Io("the backup's upload stopped".into()))
            };
            let cut =
                store.backup_scan(
                    &table,
                    &table.tablet_ranges(),
                    &mut |range, k, v| match chunker.push(range, k, v) {
                        Some(c) => send(c),
                        None => Ok(()),
                    },
                )?;
            if let Some(c) = chunker.finish() {
                send(c)?;
            }
            Ok::<u64, basalt_storage::Error>(cut)
        });
        let location = self.location.clone();
        let uploads: Vec<Result<(ChunkRef, bool)>> =
            tokio_stream::wrappers::ReceiverStream::new(rx)
                .map(move |c| {
                    let location = location.clone();
                    async move {
                        let uploaded = location.put_chunk(&c).await?;
                        Ok((
                            ChunkRef {
                                sha256: c.sha256,
                                bytes: c.bytes.len() as u64,
                                entries: c.entries,
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
        let mut chunks = Vec::with_capacity(uploads.len());
        let mut uploaded_bytes = 0;
        for u in uploads {
            let (c, uploaded) = u?;
            if uploaded {
                uploaded_bytes += c.bytes;
            }
            chunks.push(c);
        }
        let cut = cut?;
        let manifest = Manifest {
            format: basalt_backup::manifest::MANIFEST_FORMAT,
            name: name.to_string(),
            source_table: schema.name.clone(),
            source_backup: None,
            schema: (**schema).clone(),
            start_time_micros: start,
            end_time_micros: cut as i64,
            expire_time_micros: expire,
            size_bytes: chunks.iter().map(|c| c.bytes).sum(),
            uploaded_bytes,
            chunks,
        };
        self.location.put_manifest(&manifest).await?;
        Ok(manifest)
    }

    pub async fn get(&self, name: &str) -> Result<admin::Backup> {
        let parsed = self.own(name)?;
        if let Some(b) = self.creating.lock().get(&parsed.full()) {
            return Ok(b.clone());
        }
        Ok(backup_proto(&self.location.manifest(&parsed).await?))
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
        let prefix = format!("projects/{p}/instances/{i}/clusters/");
        for (name, b) in self.creating.lock().iter() {
            if name.starts_with(&prefix) {
                all.insert(name.clone(), b.clone());
            }
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
        if paths != ["expire_time"] {
            return Err(Error::InvalidArgument(format!(
                "update_mask must be exactly [\"expire_time\"] (the only field of a backup that can change), not {paths:?}"
            )));
        }
        let expire = expire_time(backup.expire_time.as_ref())?;
        let mut manifest = self.location.manifest(&name).await?;
        manifest.expire_time_micros = expire;
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
        let _copying = self.collecting.read().await;
        let name = BackupName::parse(&format!("{}/backups/{}", req.parent, req.backup_id))?;
        let source = BackupName::parse(&req.source_backup)?;
        let expire = expire_time(req.expire_time.as_ref())?;
        let source_manifest = self.location.manifest(&source).await?;
        match self.location.manifest(&name).await {
            Err(Error::NotFound(_)) => {}
            Ok(_) => {
                return Err(Error::AlreadyExists(format!(
                    "backup {} already exists",
                    name.full()
                )));
            }
            Err(e) => return Err(e),
        }
        let start = now_micros();
        let copy = Manifest {
            name: name.full(),
            source_backup: Some(source.full()),
            expire_time_micros: expire,
            uploaded_bytes: 0,
            ..source_manifest.clone()
        };
        // The chunks are shared: a copy is its manifest.
        self.location.put_manifest(&copy).await?;
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
            name: format!("operations/{}/operations/copy-{start}", copy.name),
            metadata: Some(any("CopyBackupMetadata", &metadata)),
            done: true,
            result: Some(lro::operation::Result::Response(any(
                "Backup",
                &backup_proto(&copy),
            ))),
        }))
    }

    pub async fn restore(
        self: &Arc<Self>,
        req: admin::RestoreTableRequest,
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
        let manifest = self.location.manifest(&source).await?;
        let schema = self
            .catalog
            .create_table(
                &table,
                &req.parent,
                manifest.schema.families.clone(),
                manifest.schema.splits.clone(),
                false,
            )
            .await?;
        let start = now_micros();
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
        let op_name = format!("operations/{table}/operations/restore-{start}");
        let op = self.operation(lro::Operation {
            name: op_name.clone(),
            metadata: Some(any("RestoreTableMetadata", &metadata(0, None))),
            done: false,
            result: None,
        });
        let this = self.clone();
        tokio::spawn(async move {
            match this.fill(&schema, &manifest).await {
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
                        lro::operation::Result::Response(any("Table", &rendered)),
                    );
                }
                Err(e) => {
                    warn!(table = %table, backup = %source.full(), error = %e, "restore failed; deleting the new table");
                    if let Err(d) = this.catalog.delete_table(&table).await {
                        warn!(table = %table, error = %d, "deleting the table of a failed restore");
                    }
                    this.fail_operation(&op_name, &e);
                }
            }
        });
        Ok(op)
    }

    /// Downloads the backup's chunks (checked), writes them as SST files and ingests them
    /// at once into `schema`'s table. Returns the entries restored.
    async fn fill(&self, schema: &Arc<TableSchema>, manifest: &Manifest) -> Result<u64> {
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
        let names: Vec<String> = manifest.chunks.iter().map(|c| c.sha256.clone()).collect();
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

    /// Deletes the expired backups, then the chunks no backup holds.
    async fn sweep(&self) -> Result<()> {
        let now = now_micros();
        for m in self.location.all().await? {
            if m.expire_time_micros <= now {
                let name = BackupName::parse(&m.name)?;
                self.location.delete(&name).await?;
                info!(backup = %m.name, "expired backup deleted");
            }
        }
        let _collecting = self.collecting.write().await;
        let freed = self.location.collect_chunks(UNHELD_CHUNK_AGE).await?;
        if freed > 0 {
            info!(bytes = freed, "backup chunks no backup holds deleted");
        }
        Ok(())
    }
}
