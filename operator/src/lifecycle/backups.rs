//! `Backup` and `BackupSchedule` manifests carried out through Bigtable's backup API at their
//! instance's endpoint, by both runtimes. The decisions are pure — the names ([`backup_target`],
//! [`schedule_target`], [`scheduled_backup_id`]), what a Backup does next ([`plan_backup`]),
//! when a schedule runs ([`due`], [`next_run`]) and which of its backups go ([`to_prune`]) —
//! and [`sync_backup`] / [`run_schedule`] make the calls. A schedule keeps no state of its
//! own: its backups are recognised by their ids (`<schedule>-<table>-<UTC time>`), so the
//! last run is read from `ListBackups` after any restart, in either runtime.
//!
//! A Hot backup's `hot_to_standard_time` follows `hotToStandardAfter` the same way: asked for
//! when it is made ([`hot_to_standard_at_creation`]), then kept at its start plus the duration
//! on a Backup ([`plan_hot_to_standard`]).
//!
//! Point-in-time recovery (an Instance's `backupStore.logBackup`) is the tablet servers' own
//! work: both runtimes start them with the same flags ([`log_backup_flags`]).
//!
//! The Kubernetes controllers (`crate::controller::backup`) report the outcome in the
//! resources' status and events; the local runtime in `local status` and its log.

use std::collections::BTreeMap;
use std::time::Duration;

use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use googleapis_tonic_google_bigtable_admin_v2::google::bigtable::admin::v2 as admin;
use k8s_openapi::jiff::tz::TimeZone;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use tonic::{Code, Status};

use admin::backup::BackupType;

use crate::admin::BackupAdmin;
use crate::build;
use crate::crd::instance::{BackupStore, DEFAULT_LOG_BACKUP_RETENTION};
use crate::crd::{Backup, BackupPhase, BackupSchedule, Instance};
use crate::rules::{log_backup_retention, parse_duration};

/// Bigtable keeps a backup at least this long after it is created or updated …
pub const MIN_RETENTION: Duration = Duration::from_secs(6 * 3600);
/// … and at most this long.
pub const MAX_RETENTION: Duration = Duration::from_secs(90 * 86400);
/// A Hot backup stays Hot at least this long after it is created (Bigtable's rule for
/// `hot_to_standard_time`).
pub const MIN_HOT: Duration = Duration::from_secs(24 * 3600);
/// When a backup is asked for, its start (the server's clock) is not known yet but comes
/// after `now`: a `hot_to_standard_time` this much beyond the 24 hours is surely allowed.
const HOT_CREATION_MARGIN: Duration = Duration::from_secs(600);
/// A backup id is at most this long (Bigtable's rule).
const MAX_BACKUP_ID: usize = 50;
/// `YYYYMMDDhhmmss`, the UTC time of the run a scheduled backup belongs to.
const TIME_DIGITS: usize = 14;

/// Where one backup goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupTarget {
    /// `projects/P/instances/I/clusters/C`.
    pub cluster: String,
    pub backup_id: String,
    /// `<cluster>/backups/<backup_id>`.
    pub name: String,
    /// `projects/P/instances/I/tables/T`.
    pub source_table: String,
    pub retention: Duration,
    pub backup_type: BackupType,
    /// A Hot backup turns Standard this long after its start (None: it stays Hot).
    pub hot_to_standard_after: Option<Duration>,
}

/// A resource's backup type as Bigtable's admin API names it.
pub fn proto_backup_type(t: crate::crd::BackupType) -> BackupType {
    match t {
        crate::crd::BackupType::Standard => BackupType::Standard,
        crate::crd::BackupType::Hot => BackupType::Hot,
    }
}

/// The instance's resource name.
fn instance_name(instance: &Instance) -> String {
    format!(
        "projects/{}/instances/{}",
        build::project_id(instance),
        instance.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The cluster a backup is made in: the one named, which must be the instance's, else the
/// first of `clusters` (the instance's cluster ids) by name.
fn pick_cluster(named: Option<&str>, clusters: &[String]) -> Result<String, String> {
    match named {
        Some(c) if clusters.iter().any(|x| x == c) => Ok(c.to_string()),
        Some(c) => Err(format!(
            "cluster {c:?} is not a cluster of the instance (it has {})",
            if clusters.is_empty() {
                "none".to_string()
            } else {
                clusters.join(", ")
            }
        )),
        None => clusters
            .iter()
            .min()
            .cloned()
            .ok_or_else(|| "the instance has no cluster to make backups in".to_string()),
    }
}

/// A retention within Bigtable's bounds.
fn retention(text: &str) -> Result<Duration, String> {
    let d = parse_duration(text)
        .ok_or_else(|| format!("retention {text:?} is not a duration such as 36h or 30d"))?;
    if !(MIN_RETENTION..=MAX_RETENTION).contains(&d) {
        return Err(format!(
            "retention {text:?} is out of range: a backup is kept 6h to 90d"
        ));
    }
    Ok(d)
}

/// A `hotToStandardAfter`: only with `backupType: Hot`, at least 24 hours (Bigtable's
/// minimum), and shorter than the retention (a backup expiring first would never turn
/// Standard: more likely a mistake than a wish).
fn hot_to_standard_after(
    text: Option<&str>,
    backup_type: crate::crd::BackupType,
    retention: Duration,
    retention_text: &str,
) -> Result<Option<Duration>, String> {
    let Some(text) = text else {
        return Ok(None);
    };
    let d = parse_duration(text).ok_or_else(|| {
        format!("hotToStandardAfter {text:?} is not a duration such as 36h or 3d")
    })?;
    if backup_type != crate::crd::BackupType::Hot {
        return Err(format!(
            "hotToStandardAfter {text:?} applies only to backupType: Hot (a Standard backup has no hot-to-standard time)"
        ));
    }
    if d < MIN_HOT {
        return Err(format!(
            "hotToStandardAfter {text:?} is too short: a Hot backup stays Hot at least 24h (Bigtable's minimum)"
        ));
    }
    if d >= retention {
        return Err(format!(
            "hotToStandardAfter {text:?} is not shorter than the retention {retention_text:?}: the backup would expire before it turned Standard"
        ));
    }
    Ok(Some(d))
}

fn valid_backup_id(id: &str) -> bool {
    let mut chars = id.chars();
    id.len() <= MAX_BACKUP_ID
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// The names of a Backup in its instance, or why it cannot be made (`clusters`: the
/// instance's cluster ids).
pub fn backup_target(
    backup: &Backup,
    instance: &Instance,
    clusters: &[String],
) -> Result<BackupTarget, String> {
    let backup_id = backup
        .spec
        .backup_id
        .clone()
        .unwrap_or_else(|| backup.metadata.name.clone().unwrap_or_default());
    if !valid_backup_id(&backup_id) {
        return Err(format!(
            "backup id {backup_id:?} is not 1 to 50 characters of [-_.a-zA-Z0-9] starting with a letter, a digit or _"
        ));
    }
    let retention = retention(&backup.spec.retention)?;
    let hot_to_standard_after = hot_to_standard_after(
        backup.spec.hot_to_standard_after.as_deref(),
        backup.spec.backup_type,
        retention,
        &backup.spec.retention,
    )?;
    let instance_name = instance_name(instance);
    let cluster = format!(
        "{instance_name}/clusters/{}",
        pick_cluster(backup.spec.cluster.as_deref(), clusters)?
    );
    Ok(BackupTarget {
        name: format!("{cluster}/backups/{backup_id}"),
        cluster,
        backup_id,
        source_table: format!("{instance_name}/tables/{}", backup.spec.table),
        retention,
        backup_type: proto_backup_type(backup.spec.backup_type),
        hot_to_standard_after,
    })
}

/// A Backup as it was last observed (its status).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Previous {
    pub phase: Option<BackupPhase>,
    /// Its expire time as last observed.
    pub expire_time: Option<Timestamp>,
}

/// What to do for a Backup, from what it was and what the instance has now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackupStep {
    /// Make it, kept until `expire_time`.
    Create { expire_time: Timestamp },
    /// It is ready: move its expire time to the spec's retention after its start.
    SetExpireTime(Timestamp),
    /// Nothing to call; the phase is this.
    Observe(BackupPhase),
    /// The spec's retention would expire it less than 6 hours from now: refused.
    Refuse(String),
}

fn timestamp_of(t: &prost_types::Timestamp) -> Timestamp {
    Timestamp::new(t.seconds, t.nanos).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// A protobuf timestamp.
pub fn proto_timestamp(t: Timestamp) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: t.as_second(),
        nanos: t.subsec_nanosecond(),
    }
}

fn after(t: Timestamp, d: Duration) -> Timestamp {
    t.checked_add(SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX))
        .unwrap_or(Timestamp::MAX)
}

/// The next step of a Backup: made once (again only if its making was interrupted before it
/// was ever ready), its expire time kept at `retention` after its start, and never made
/// again once it was ready and is gone (another point in time would not be the backup the
/// resource recorded).
pub fn plan_backup(
    previous: Previous,
    found: Option<&admin::Backup>,
    retention: Duration,
    now: Timestamp,
) -> BackupStep {
    use admin::backup::State;
    let Some(found) = found else {
        return match previous.phase {
            None | Some(BackupPhase::Pending) | Some(BackupPhase::Creating) => BackupStep::Create {
                expire_time: after(now, retention),
            },
            Some(BackupPhase::Ready) | Some(BackupPhase::Expired)
                if previous.expire_time.is_some_and(|e| e <= now) =>
            {
                BackupStep::Observe(BackupPhase::Expired)
            }
            Some(BackupPhase::Expired) => BackupStep::Observe(BackupPhase::Expired),
            Some(BackupPhase::Ready) | Some(BackupPhase::Deleted) => {
                BackupStep::Observe(BackupPhase::Deleted)
            }
        };
    };
    if found.state != State::Ready as i32 {
        return BackupStep::Observe(BackupPhase::Creating);
    }
    let Some(start) = found.start_time.as_ref().map(timestamp_of) else {
        return BackupStep::Observe(BackupPhase::Ready);
    };
    let wanted = after(start, retention);
    let has = found.expire_time.as_ref().map(timestamp_of);
    if has.is_some_and(|h| h.duration_since(wanted).abs() < SignedDuration::from_secs(1)) {
        return BackupStep::Observe(BackupPhase::Ready);
    }
    if wanted < after(now, MIN_RETENTION) {
        return BackupStep::Refuse(format!(
            "the retention would expire the backup at {wanted}, less than 6 hours from now (Bigtable's minimum); its expire time stays {}",
            has.map(|h| h.to_string()).unwrap_or_default()
        ));
    }
    BackupStep::SetExpireTime(wanted.min(after(now, MAX_RETENTION)))
}

/// The `hot_to_standard_time` to ask for when a backup is made `now`: its start plus `after`
/// as nearly as can be told before the start is known, and never within 24 hours of it (the
/// server's start comes after `now`; a Backup's is set exactly once it is ready).
pub fn hot_to_standard_at_creation(now: Timestamp, after_start: Duration) -> Timestamp {
    after(now, after_start.max(MIN_HOT + HOT_CREATION_MARGIN))
}

/// What to do about a ready backup's `hot_to_standard_time`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HotStep {
    /// It is as the spec asks (or the backup is Standard and the spec asks nothing).
    Keep,
    /// Move it to this: the spec's `hotToStandardAfter` after the backup's start.
    Set(Timestamp),
    /// The spec no longer names one: the backup stays Hot.
    Clear,
    /// The backup is Standard already: it cannot become Hot again, nor its time move.
    Refuse(String),
}

/// Keeps a ready Hot backup's `hot_to_standard_time` at `after_start` (the spec's
/// `hotToStandardAfter`) after its start, or unset when the spec has none — the way
/// [`plan_backup`] keeps its expire time at the retention. A time already past is not
/// moved: the backup is Standard from then on.
pub fn plan_hot_to_standard(
    found: &admin::Backup,
    after_start: Option<Duration>,
    now: Timestamp,
) -> HotStep {
    let Some(start) = found.start_time.as_ref().map(timestamp_of) else {
        return HotStep::Keep;
    };
    let wanted = after_start.map(|d| after(start, d));
    let has = found.hot_to_standard_time.as_ref().map(timestamp_of);
    let same = match (wanted, has) {
        (Some(w), Some(h)) => h.duration_since(w).abs() < SignedDuration::from_secs(1),
        (None, None) => true,
        _ => false,
    };
    if same {
        return HotStep::Keep;
    }
    // A backup that is Standard (its time passed, or made so) has no way back to Hot.
    let turned = has.filter(|h| *h <= now);
    let standard = turned.is_some() || found.backup_type == BackupType::Standard as i32;
    match (wanted, standard) {
        (Some(w), false) => HotStep::Set(w),
        (None, false) => HotStep::Clear,
        (None, true) => HotStep::Keep,
        (Some(_), true) => HotStep::Refuse(format!(
            "the backup is Standard{}: hotToStandardAfter no longer changes it",
            turned.map(|t| format!(" since {t}")).unwrap_or_default()
        )),
    }
}

/// What [`sync_backup`] did and found.
#[derive(Debug, Clone, PartialEq)]
pub struct BackupSynced {
    pub phase: BackupPhase,
    /// The backup as the instance reports it (None while it is not visible).
    pub backup: Option<admin::Backup>,
    /// It was asked for in this sync.
    pub created: bool,
    /// Its expire time was moved to this.
    pub expire_time_set: Option<Timestamp>,
    /// Why the spec's retention was not applied.
    pub refused: Option<String>,
    /// Its `hot_to_standard_time` was moved to this (`Some(None)`: unset, it stays Hot).
    pub hot_to_standard_time_set: Option<Option<Timestamp>>,
    /// Why the spec's `hotToStandardAfter` was not applied.
    pub hot_refused: Option<String>,
}

/// Brings a Backup one step along ([`plan_backup`]) through the admin API at `endpoint`.
pub async fn sync_backup(
    admin: &dyn BackupAdmin,
    endpoint: &str,
    target: &BackupTarget,
    previous: Previous,
    now: Timestamp,
) -> Result<BackupSynced, Status> {
    let found = admin.get_backup(endpoint, &target.name).await?;
    let mut synced = BackupSynced {
        phase: BackupPhase::Pending,
        backup: found.clone(),
        created: false,
        expire_time_set: None,
        refused: None,
        hot_to_standard_time_set: None,
        hot_refused: None,
    };
    match plan_backup(previous, found.as_ref(), target.retention, now) {
        BackupStep::Create { expire_time } => {
            match admin
                .create_backup(
                    endpoint,
                    &target.cluster,
                    &target.backup_id,
                    &target.source_table,
                    proto_timestamp(expire_time),
                    target.backup_type,
                    target
                        .hot_to_standard_after
                        .map(|d| proto_timestamp(hot_to_standard_at_creation(now, d))),
                )
                .await
            {
                Ok(()) => synced.created = true,
                // Made meanwhile (by an earlier run of this sync whose answer was lost).
                Err(s) if s.code() == Code::AlreadyExists => {}
                Err(s) => return Err(s),
            }
            synced.backup = admin.get_backup(endpoint, &target.name).await?;
            synced.phase = match &synced.backup {
                Some(b) if b.state == admin::backup::State::Ready as i32 => BackupPhase::Ready,
                _ => BackupPhase::Creating,
            };
        }
        BackupStep::SetExpireTime(t) => {
            synced.backup = Some(
                admin
                    .set_expire_time(endpoint, &target.name, proto_timestamp(t))
                    .await?,
            );
            synced.expire_time_set = Some(t);
            synced.phase = BackupPhase::Ready;
        }
        BackupStep::Observe(phase) => synced.phase = phase,
        BackupStep::Refuse(why) => {
            synced.phase = BackupPhase::Ready;
            synced.refused = Some(why);
        }
    }
    if synced.phase != BackupPhase::Ready {
        return Ok(synced);
    }
    let Some(ready) = synced.backup.as_ref() else {
        return Ok(synced);
    };
    let at = match plan_hot_to_standard(ready, target.hot_to_standard_after, now) {
        HotStep::Keep => return Ok(synced),
        HotStep::Refuse(why) => {
            synced.hot_refused = Some(why);
            return Ok(synced);
        }
        HotStep::Set(t) => Some(t),
        HotStep::Clear => None,
    };
    synced.backup = Some(
        admin
            .set_hot_to_standard_time(endpoint, &target.name, at.map(proto_timestamp))
            .await?,
    );
    synced.hot_to_standard_time_set = Some(at);
    Ok(synced)
}

// ------------------------------------------------------------------------------- schedules

/// Parses a schedule: 5 fields, or 6 with seconds first; no year field.
pub fn parse_cron(text: &str) -> Result<Cron, String> {
    let fields = text.split_whitespace().count();
    if !(5..=6).contains(&fields) {
        return Err(format!(
            "schedule {text:?} has {fields} fields: a cron expression has 5 (minute hour day-of-month month day-of-week) or 6 (seconds first)"
        ));
    }
    CronParser::builder()
        .seconds(Seconds::Optional)
        .year(Year::Disallowed)
        .build()
        .parse(text)
        .map_err(|e| format!("schedule {text:?} is not a cron expression: {e}"))
}

/// The newest time of the schedule in `(since, now]`: a run is due (runs missed in between
/// are made once).
pub fn due(cron: &Cron, since: Timestamp, now: Timestamp) -> Option<Timestamp> {
    let run = cron
        .find_previous_occurrence(&now.to_zoned(TimeZone::UTC), true)
        .ok()?
        .timestamp();
    (run > since).then_some(run)
}

/// The schedule's first time after `now`.
pub fn next_run(cron: &Cron, now: Timestamp) -> Option<Timestamp> {
    Some(
        cron.find_next_occurrence(&now.to_zoned(TimeZone::UTC), false)
            .ok()?
            .timestamp(),
    )
}

/// FNV-1a, 32 bits: a short stable tag for names too long to keep whole.
fn fnv32(text: &str) -> u32 {
    text.bytes().fold(0x811c_9dc5, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// `<schedule>-<table>`, cut to leave room for `-<time>` in 50 characters (a cut one ends in
/// a hash of the whole, so two long names stay apart).
fn id_base(schedule: &str, table: &str) -> String {
    let base = format!("{schedule}-{table}");
    let room = MAX_BACKUP_ID - TIME_DIGITS - 1;
    if base.len() <= room {
        return base;
    }
    let tag = format!("-{:08x}", fnv32(&base));
    let keep: String = base.chars().take(room - tag.len()).collect();
    format!("{keep}{tag}")
}

/// The id of the backup of `table` made by `schedule`'s run at `at`:
/// `<schedule>-<table>-<YYYYMMDDhhmmss>` (UTC).
pub fn scheduled_backup_id(schedule: &str, table: &str, at: Timestamp) -> String {
    format!(
        "{}-{}",
        id_base(schedule, table),
        at.strftime("%Y%m%d%H%M%S")
    )
}

/// The run time of `id` if it is the id of a backup of `table` made by `schedule`.
pub fn scheduled_time(schedule: &str, table: &str, id: &str) -> Option<Timestamp> {
    let base = id_base(schedule, table);
    let digits = id.strip_prefix(&base)?.strip_prefix('-')?;
    if digits.len() != TIME_DIGITS || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let at = k8s_openapi::jiff::civil::DateTime::strptime("%Y%m%d%H%M%S", digits)
        .ok()?
        .to_zoned(TimeZone::UTC)
        .ok()?
        .timestamp();
    (scheduled_backup_id(schedule, table, at) == id).then_some(at)
}

/// Where a schedule's backups go.
#[derive(Debug, Clone)]
pub struct ScheduleTarget {
    /// The resource's name: the ids' prefix.
    pub schedule: String,
    /// `projects/P/instances/I/clusters/C`.
    pub cluster: String,
    /// `projects/P/instances/I`.
    pub instance: String,
    pub tables: Vec<String>,
    pub cron: Cron,
    pub retention: Duration,
    pub keep: Option<u32>,
    pub suspend: bool,
    pub backup_type: BackupType,
    /// Each backup made turns Standard this long after it is made (None: it stays Hot).
    pub hot_to_standard_after: Option<Duration>,
}

/// The names and rules of a BackupSchedule, or why it cannot run.
pub fn schedule_target(
    schedule: &BackupSchedule,
    instance: &Instance,
    clusters: &[String],
) -> Result<ScheduleTarget, String> {
    let spec = &schedule.spec;
    if spec.tables.is_empty() {
        return Err("tables: name at least one table".into());
    }
    let mut seen = std::collections::BTreeSet::new();
    for t in &spec.tables {
        if !valid_backup_id(t) {
            return Err(format!("table id {t:?} is not valid"));
        }
        if !seen.insert(t) {
            return Err(format!("table {t:?} is listed twice"));
        }
    }
    let instance_name = instance_name(instance);
    let cluster = format!(
        "{instance_name}/clusters/{}",
        pick_cluster(spec.cluster.as_deref(), clusters)?
    );
    let cron = parse_cron(&spec.schedule)?;
    let retention = retention(&spec.retention)?;
    let hot_to_standard_after = hot_to_standard_after(
        spec.hot_to_standard_after.as_deref(),
        spec.backup_type,
        retention,
        &spec.retention,
    )?;
    Ok(ScheduleTarget {
        schedule: schedule.metadata.name.clone().unwrap_or_default(),
        cluster,
        instance: instance_name,
        tables: spec.tables.clone(),
        cron,
        retention,
        keep: spec.keep,
        suspend: spec.suspend,
        backup_type: proto_backup_type(spec.backup_type),
        hot_to_standard_after,
    })
}

/// One of a schedule's backups.
#[derive(Debug, Clone, PartialEq)]
pub struct Owned {
    pub table: String,
    /// The run it belongs to.
    pub at: Timestamp,
    pub backup: admin::Backup,
}

impl Owned {
    pub fn ready(&self) -> bool {
        self.backup.state == admin::backup::State::Ready as i32
    }
}

/// The schedule's backups among a cluster's, newest first.
pub fn owned(target: &ScheduleTarget, backups: &[admin::Backup]) -> Vec<Owned> {
    let mut out: Vec<Owned> = backups
        .iter()
        .filter_map(|b| {
            let id = b.name.rsplit('/').next()?;
            target.tables.iter().find_map(|table| {
                let at = scheduled_time(&target.schedule, table, id)?;
                Some(Owned {
                    table: table.clone(),
                    at,
                    backup: b.clone(),
                })
            })
        })
        .collect();
    out.sort_by(|a, b| b.at.cmp(&a.at).then_with(|| a.table.cmp(&b.table)));
    out
}

/// The backups to delete so that each table keeps its `keep` newest ready ones (backups
/// still being made are left alone, and do not count).
pub fn to_prune(owned: &[Owned], keep: Option<u32>) -> Vec<String> {
    let Some(keep) = keep else {
        return vec![];
    };
    let mut per_table: BTreeMap<&str, u32> = BTreeMap::new();
    let mut out = vec![];
    let mut newest_first: Vec<&Owned> = owned.iter().filter(|o| o.ready()).collect();
    newest_first.sort_by_key(|o| std::cmp::Reverse(o.at));
    for o in newest_first {
        let kept = per_table.entry(&o.table).or_default();
        if *kept < keep {
            *kept += 1;
        } else {
            out.push(o.backup.name.clone());
        }
    }
    out
}

/// What one pass of a schedule did and found.
#[derive(Debug, Clone, Default)]
pub struct ScheduleRun {
    /// Backups asked for in this pass.
    pub made: Vec<String>,
    /// Backups deleted by `keep`.
    pub pruned: Vec<String>,
    /// Tables whose backup could not be asked for, and why.
    pub failed: Vec<(String, Status)>,
    /// The schedule's backups the instance holds after the pass, newest first.
    pub backups: Vec<Owned>,
    /// The newest run time any of its backups belongs to.
    pub last: Option<Timestamp>,
    /// When the next run is due (None while suspended).
    pub next: Option<Timestamp>,
}

/// One pass of a schedule: each table whose newest backup is older than the schedule's newest
/// time up to `now` (and newer than `since`, when the schedule was declared) is backed up,
/// then the oldest are pruned beyond `keep`.
pub async fn run_schedule(
    admin: &dyn BackupAdmin,
    endpoint: &str,
    target: &ScheduleTarget,
    since: Timestamp,
    now: Timestamp,
) -> Result<ScheduleRun, Status> {
    let mut run = ScheduleRun::default();
    let before = owned(
        target,
        &admin.list_backups(endpoint, &target.cluster).await?,
    );
    if !target.suspend {
        for table in &target.tables {
            let last = before.iter().find(|o| &o.table == table).map(|o| o.at);
            let Some(at) = due(&target.cron, last.unwrap_or(since).max(since), now) else {
                continue;
            };
            let id = scheduled_backup_id(&target.schedule, table, at);
            let source = format!("{}/tables/{table}", target.instance);
            match admin
                .create_backup(
                    endpoint,
                    &target.cluster,
                    &id,
                    &source,
                    proto_timestamp(after(now, target.retention)),
                    target.backup_type,
                    target
                        .hot_to_standard_after
                        .map(|d| proto_timestamp(hot_to_standard_at_creation(now, d))),
                )
                .await
            {
                Ok(()) => run.made.push(format!("{}/backups/{id}", target.cluster)),
                Err(s) if s.code() == Code::AlreadyExists => {}
                Err(s) => run.failed.push((table.clone(), s)),
            }
        }
    }
    let mut backups = owned(
        target,
        &admin.list_backups(endpoint, &target.cluster).await?,
    );
    for name in to_prune(&backups, target.keep) {
        admin.delete_backup(endpoint, &name).await?;
        run.pruned.push(name);
    }
    backups.retain(|o| !run.pruned.contains(&o.backup.name));
    run.last = backups.iter().map(|o| o.at).max();
    run.next = (!target.suspend)
        .then(|| next_run(&target.cron, now))
        .flatten();
    run.backups = backups;
    Ok(run)
}

/// How long until a schedule should be looked at again: its next run (within a minute, to
/// notice backups made or deleted through the API, and sooner while a backup is being made).
pub fn recheck_after(run: &ScheduleRun, now: Timestamp) -> Duration {
    let creating = run.backups.iter().any(|o| !o.ready());
    let cap = if creating {
        Duration::from_secs(2)
    } else {
        Duration::from_secs(60)
    };
    run.next
        .map(|n| Duration::try_from(n.duration_since(now)).unwrap_or(Duration::ZERO))
        .unwrap_or(cap)
        .clamp(Duration::from_millis(200), cap)
}

/// The tablet server flags that turn point-in-time recovery on, as (flag, value) pairs each
/// runtime writes its own way (`--flag=value` in a pod's args, `--flag value` locally): the
/// shipping interval and the shipped log's retention in seconds, defaults filled in. None
/// without `logBackup` (the servers' default: off). Pure.
pub fn log_backup_flags(store: Option<&BackupStore>) -> Vec<(&'static str, String)> {
    let Some(log) = store.and_then(|s| s.log_backup.as_ref()) else {
        return vec![];
    };
    // A retention the schema (or `rules::validate_instance`) refuses never gets this far;
    // were it to, the default applies rather than no log backup at all.
    let retention = log_backup_retention(log.retention())
        .or_else(|_| log_backup_retention(DEFAULT_LOG_BACKUP_RETENTION))
        .unwrap_or_default();
    vec![
        (
            "--log-backup-interval-secs",
            log.interval_seconds().to_string(),
        ),
        (
            "--log-backup-retention-secs",
            retention.as_secs().to_string(),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_backup_flags_fill_in_the_defaults_and_need_log_backup() {
        let store = |yaml: &str| -> BackupStore { from_yaml(yaml) };
        let flags = |yaml: &str| -> Vec<String> {
            log_backup_flags(Some(&store(yaml)))
                .into_iter()
                .map(|(flag, value)| format!("{flag}={value}"))
                .collect()
        };
        assert!(log_backup_flags(None).is_empty());
        assert!(flags("{url: 's3://basalt-backups'}").is_empty());
        assert_eq!(
            flags("{url: 's3://basalt-backups', logBackup: {}}"),
            [
                "--log-backup-interval-secs=30",
                "--log-backup-retention-secs=604800"
            ]
        );
        assert_eq!(
            flags(
                "{url: 's3://basalt-backups', logBackup: {intervalSeconds: 5, retention: 1d12h}}"
            ),
            [
                "--log-backup-interval-secs=5",
                "--log-backup-retention-secs=129600"
            ]
        );
    }

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn from_yaml<T: serde::de::DeserializeOwned>(yaml: &str) -> T {
        serde_norway::from_str(yaml).unwrap()
    }

    fn instance() -> Instance {
        from_yaml("metadata: {name: orders-prod, namespace: shop}\nspec: {displayName: Orders}\n")
    }

    #[test]
    fn a_backup_is_made_in_the_named_cluster_or_the_first() {
        let clusters = vec!["orders-c2".to_string(), "orders-c1".to_string()];
        let b: Backup = from_yaml(
            "metadata: {name: nightly, namespace: shop}\nspec: {instanceRef: orders-prod, table: events}\n",
        );
        let t = backup_target(&b, &instance(), &clusters).unwrap();
        assert_eq!(
            t.name,
            "projects/shop/instances/orders-prod/clusters/orders-c1/backups/nightly"
        );
        assert_eq!(
            t.source_table,
            "projects/shop/instances/orders-prod/tables/events"
        );
        assert_eq!(t.retention, Duration::from_secs(7 * 86400));
        assert_eq!(t.backup_type, BackupType::Standard);
        let b: Backup = from_yaml(
            "metadata: {name: nightly}\nspec: {instanceRef: orders-prod, table: events, backupType: Hot}\n",
        );
        let t = backup_target(&b, &instance(), &clusters).unwrap();
        assert_eq!(t.backup_type, BackupType::Hot);
        let b: Backup = from_yaml(
            "metadata: {name: nightly}\nspec: {instanceRef: orders-prod, table: events, cluster: orders-c3, retention: 1h}\n",
        );
        let err = backup_target(&b, &instance(), &clusters).unwrap_err();
        assert!(err.contains("retention \"1h\" is out of range"), "{err}");
        let b: Backup = from_yaml(
            "metadata: {name: nightly}\nspec: {instanceRef: orders-prod, table: events, cluster: orders-c3}\n",
        );
        let err = backup_target(&b, &instance(), &clusters).unwrap_err();
        assert_eq!(
            err,
            "cluster \"orders-c3\" is not a cluster of the instance (it has orders-c2, orders-c1)"
        );
        assert!(backup_target(&b, &instance(), &[]).is_err());
    }

    #[test]
    fn a_schedule_makes_backups_of_its_type() {
        let clusters = vec!["orders-c1".to_string()];
        let yaml = |extra: &str| {
            format!(
                "metadata: {{name: nightly}}\nspec: {{instanceRef: orders-prod, tables: [events], schedule: '0 3 * * *'{extra}}}\n"
            )
        };
        let s: BackupSchedule = from_yaml(&yaml(""));
        let t = schedule_target(&s, &instance(), &clusters).unwrap();
        assert_eq!(t.backup_type, BackupType::Standard);
        let s: BackupSchedule = from_yaml(&yaml(", backupType: Hot"));
        let t = schedule_target(&s, &instance(), &clusters).unwrap();
        assert_eq!(t.backup_type, BackupType::Hot);
        assert_eq!(t.hot_to_standard_after, None);
    }

    #[test]
    fn hot_to_standard_after_is_refused_outside_a_hot_backups_life() {
        let clusters = vec!["orders-c1".to_string()];
        let backup = |extra: &str| -> Result<Option<Duration>, String> {
            let b: Backup = from_yaml(&format!(
                "metadata: {{name: nightly}}\nspec: {{instanceRef: orders-prod, table: events{extra}}}\n"
            ));
            backup_target(&b, &instance(), &clusters).map(|t| t.hot_to_standard_after)
        };
        let schedule = |extra: &str| -> Result<Option<Duration>, String> {
            let s: BackupSchedule = from_yaml(&format!(
                "metadata: {{name: nightly}}\nspec: {{instanceRef: orders-prod, tables: [events], schedule: '0 3 * * *'{extra}}}\n"
            ));
            schedule_target(&s, &instance(), &clusters).map(|t| t.hot_to_standard_after)
        };
        let day = Duration::from_secs(86400);
        for target in [&backup as &dyn Fn(&str) -> _, &schedule] {
            assert_eq!(target(", backupType: Hot"), Ok(None));
            assert_eq!(
                target(", backupType: Hot, hotToStandardAfter: 3d"),
                Ok(Some(3 * day))
            );
            // Bigtable's minimum, exactly, in any unit.
            assert_eq!(
                target(", backupType: Hot, hotToStandardAfter: 1440m"),
                Ok(Some(day))
            );
            assert_eq!(
                target(", backupType: Standard, hotToStandardAfter: 3d"),
                Err("hotToStandardAfter \"3d\" applies only to backupType: Hot (a Standard backup has no hot-to-standard time)".into())
            );
            // The type's default is Standard.
            assert!(target(", hotToStandardAfter: 3d").is_err());
            assert_eq!(
                target(", backupType: Hot, hotToStandardAfter: 23h59m"),
                Err("hotToStandardAfter \"23h59m\" is too short: a Hot backup stays Hot at least 24h (Bigtable's minimum)".into())
            );
            // Not before it expires (the retention's default is 7d).
            assert_eq!(
                target(", backupType: Hot, hotToStandardAfter: 7d"),
                Err("hotToStandardAfter \"7d\" is not shorter than the retention \"7d\": the backup would expire before it turned Standard".into())
            );
            assert_eq!(
                target(", backupType: Hot, hotToStandardAfter: 7d, retention: 30d"),
                Ok(Some(7 * day))
            );
            assert!(
                target(", backupType: Hot, hotToStandardAfter: 3 days")
                    .unwrap_err()
                    .contains("is not a duration")
            );
        }
    }

    #[test]
    fn a_hot_backup_is_asked_for_with_its_time_never_within_a_day_of_its_start() {
        let now = ts("2026-11-29T12:00:00Z");
        let day = Duration::from_secs(86400);
        assert_eq!(
            hot_to_standard_at_creation(now, 3 * day),
            ts("2026-12-02T12:00:00Z")
        );
        // The start comes after now (the server's clock): exactly a day from now could be
        // less than a day after it, which Bigtable refuses.
        assert_eq!(
            hot_to_standard_at_creation(now, day),
            ts("2026-11-30T12:10:00Z")
        );
    }

    fn hot(start: &str, hot_until: Option<&str>, reported: BackupType) -> admin::Backup {
        admin::Backup {
            backup_type: reported as i32,
            hot_to_standard_time: hot_until.map(|t| proto_timestamp(ts(t))),
            ..backup(admin::backup::State::Ready, start, "2026-12-29T11:59:00Z")
        }
    }

    #[test]
    fn a_hot_backups_time_follows_hot_to_standard_after_from_its_start() {
        let now = ts("2026-11-29T12:00:00Z");
        let start = "2026-11-29T11:59:00Z";
        let day = Duration::from_secs(86400);
        // Exactly a day: asked for with the creation's margin, then moved to start + 1d.
        let made = hot(start, Some("2026-11-30T12:09:00Z"), BackupType::Hot);
        assert_eq!(
            plan_hot_to_standard(&made, Some(day), now),
            HotStep::Set(ts("2026-11-30T11:59:00Z"))
        );
        // Within a second of start + 3d (asked for at `now`, just before the start): kept,
        // as an expire time is.
        let made = hot(start, Some("2026-12-02T11:58:59.990Z"), BackupType::Hot);
        assert_eq!(
            plan_hot_to_standard(&made, Some(3 * day), now),
            HotStep::Keep
        );
        // hotToStandardAfter changed: moved.
        assert_eq!(
            plan_hot_to_standard(&made, Some(5 * day), now),
            HotStep::Set(ts("2026-12-04T11:59:00Z"))
        );
        // hotToStandardAfter removed: the backup stays Hot.
        assert_eq!(plan_hot_to_standard(&made, None, now), HotStep::Clear);
        // Hot with none, none asked for; and a Standard backup: nothing to do.
        let forever = hot(start, None, BackupType::Hot);
        assert_eq!(plan_hot_to_standard(&forever, None, now), HotStep::Keep);
        assert_eq!(
            plan_hot_to_standard(&forever, Some(day), now),
            HotStep::Set(ts("2026-11-30T11:59:00Z"))
        );
        let standard = hot(start, None, BackupType::Standard);
        assert_eq!(plan_hot_to_standard(&standard, None, now), HotStep::Keep);
        assert!(matches!(
            plan_hot_to_standard(&standard, Some(day), now),
            HotStep::Refuse(_)
        ));
        // Its time passed: it is Standard for good, neither moved nor unset.
        let later = ts("2026-12-03T00:00:00Z");
        let turned = hot(start, Some("2026-12-02T11:59:00Z"), BackupType::Standard);
        assert_eq!(
            plan_hot_to_standard(&turned, Some(5 * day), later),
            HotStep::Refuse(
                "the backup is Standard since 2026-12-02T11:59:00Z: hotToStandardAfter no longer changes it"
                    .into()
            )
        );
        assert_eq!(plan_hot_to_standard(&turned, None, later), HotStep::Keep);
        assert_eq!(
            plan_hot_to_standard(&turned, Some(3 * day), later),
            HotStep::Keep
        );
    }

    fn backup(state: admin::backup::State, start: &str, expire: &str) -> admin::Backup {
        admin::Backup {
            name: "b".into(),
            state: state as i32,
            start_time: Some(proto_timestamp(ts(start))),
            expire_time: Some(proto_timestamp(ts(expire))),
            ..Default::default()
        }
    }

    #[test]
    fn a_backup_is_made_once_and_its_expire_time_follows_the_retention() {
        use admin::backup::State;
        let now = ts("2026-11-29T12:00:00Z");
        let week = Duration::from_secs(7 * 86400);
        let new = Previous::default();
        assert_eq!(
            plan_backup(new, None, week, now),
            BackupStep::Create {
                expire_time: ts("2026-12-06T12:00:00Z")
            }
        );
        // Interrupted before it was ever ready: made again.
        let creating = Previous {
            phase: Some(BackupPhase::Creating),
            expire_time: None,
        };
        assert!(matches!(
            plan_backup(creating, None, week, now),
            BackupStep::Create { .. }
        ));
        let b = backup(
            State::Creating,
            "2026-11-29T11:59:00Z",
            "2026-12-06T11:59:00Z",
        );
        assert_eq!(
            plan_backup(creating, Some(&b), week, now),
            BackupStep::Observe(BackupPhase::Creating)
        );
        let b = backup(State::Ready, "2026-11-29T11:59:00Z", "2026-12-06T11:59:00Z");
        assert_eq!(
            plan_backup(creating, Some(&b), week, now),
            BackupStep::Observe(BackupPhase::Ready)
        );
        // The retention changed: the expire time moves.
        assert_eq!(
            plan_backup(creating, Some(&b), Duration::from_secs(30 * 86400), now),
            BackupStep::SetExpireTime(ts("2026-12-29T11:59:00Z"))
        );
        // Shortened below what Bigtable allows from now: refused.
        assert!(matches!(
            plan_backup(creating, Some(&b), Duration::from_secs(6 * 3600), now),
            BackupStep::Refuse(_)
        ));
        // Ready once, then gone: expired, or deleted; never made again.
        let ready = Previous {
            phase: Some(BackupPhase::Ready),
            expire_time: Some(ts("2026-11-29T11:00:00Z")),
        };
        assert_eq!(
            plan_backup(ready, None, week, now),
            BackupStep::Observe(BackupPhase::Expired)
        );
        let ready = Previous {
            phase: Some(BackupPhase::Ready),
            expire_time: Some(ts("2026-12-01T00:00:00Z")),
        };
        assert_eq!(
            plan_backup(ready, None, week, now),
            BackupStep::Observe(BackupPhase::Deleted)
        );
    }

    #[test]
    fn cron_expressions_of_five_or_six_fields() {
        let c = parse_cron("0 3 * * *").unwrap();
        let now = ts("2026-11-29T12:00:00Z");
        assert_eq!(
            due(&c, ts("2026-11-29T00:00:00Z"), now),
            Some(ts("2026-11-29T03:00:00Z"))
        );
        assert_eq!(due(&c, ts("2026-11-29T03:00:00Z"), now), None);
        assert_eq!(next_run(&c, now), Some(ts("2026-11-30T03:00:00Z")));
        let c = parse_cron("*/10 * * * * *").unwrap();
        assert_eq!(
            due(&c, ts("2026-11-29T11:00:00Z"), ts("2026-11-29T12:00:05Z")),
            Some(ts("2026-11-29T12:00:00Z"))
        );
        assert_eq!(
            next_run(&c, ts("2026-11-29T12:00:05Z")),
            Some(ts("2026-11-29T12:00:10Z"))
        );
        let c = parse_cron("0 2 * * MON").unwrap();
        assert_eq!(next_run(&c, now), Some(ts("2026-11-30T02:00:00Z")));
        for bad in ["* * * *", "0 0 0 * * * 2026", "61 * * * *", "every day"] {
            assert!(parse_cron(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn scheduled_ids_carry_the_run_time_and_fit_fifty_characters() {
        let at = ts("2026-11-29T03:00:00Z");
        let id = scheduled_backup_id("nightly", "events", at);
        assert_eq!(id, "nightly-events-20261129030000");
        assert_eq!(scheduled_time("nightly", "events", &id), Some(at));
        assert_eq!(scheduled_time("nightly", "event", &id), None);
        assert_eq!(
            scheduled_time("nightly", "events", "nightly-events-2026112903000"),
            None
        );
        let long = "t".repeat(50);
        let id = scheduled_backup_id("a-very-long-schedule-name", &long, at);
        assert_eq!(id.len(), 50);
        assert!(valid_backup_id(&id));
        assert_eq!(
            scheduled_time("a-very-long-schedule-name", &long, &id),
            Some(at)
        );
        let other = scheduled_backup_id("a-very-long-schedule-name", &"u".repeat(50), at);
        assert_ne!(id, other);
    }

    /// An instance's backups, in memory: CreateBackup makes a READY backup starting at
    /// `start`, UpdateBackup applies its mask.
    struct FakeBackups {
        start: Timestamp,
        backups: std::sync::Mutex<BTreeMap<String, admin::Backup>>,
        updates: std::sync::Mutex<Vec<String>>,
    }

    impl FakeBackups {
        fn new(start: &str) -> Self {
            FakeBackups {
                start: ts(start),
                backups: Default::default(),
                updates: Default::default(),
            }
        }

        fn get(&self, name: &str) -> admin::Backup {
            self.backups.lock().unwrap()[name].clone()
        }
    }

    #[tonic::async_trait]
    impl BackupAdmin for FakeBackups {
        async fn create_backup(
            &self,
            _endpoint: &str,
            cluster: &str,
            backup_id: &str,
            source_table: &str,
            expire_time: prost_types::Timestamp,
            backup_type: BackupType,
            hot_to_standard_time: Option<prost_types::Timestamp>,
        ) -> Result<(), Status> {
            let name = format!("{cluster}/backups/{backup_id}");
            let b = admin::Backup {
                name: name.clone(),
                source_table: source_table.into(),
                state: admin::backup::State::Ready as i32,
                start_time: Some(proto_timestamp(self.start)),
                expire_time: Some(expire_time),
                backup_type: backup_type as i32,
                hot_to_standard_time,
                ..Default::default()
            };
            self.backups.lock().unwrap().insert(name, b);
            Ok(())
        }

        async fn get_backup(
            &self,
            _endpoint: &str,
            name: &str,
        ) -> Result<Option<admin::Backup>, Status> {
            Ok(self.backups.lock().unwrap().get(name).cloned())
        }

        async fn list_backups(
            &self,
            _endpoint: &str,
            _cluster: &str,
        ) -> Result<Vec<admin::Backup>, Status> {
            Ok(self.backups.lock().unwrap().values().cloned().collect())
        }

        async fn set_expire_time(
            &self,
            _endpoint: &str,
            name: &str,
            expire_time: prost_types::Timestamp,
        ) -> Result<admin::Backup, Status> {
            self.updates.lock().unwrap().push("expire_time".into());
            let mut all = self.backups.lock().unwrap();
            let b = all.get_mut(name).unwrap();
            b.expire_time = Some(expire_time);
            Ok(b.clone())
        }

        async fn set_hot_to_standard_time(
            &self,
            _endpoint: &str,
            name: &str,
            hot_to_standard_time: Option<prost_types::Timestamp>,
        ) -> Result<admin::Backup, Status> {
            self.updates
                .lock()
                .unwrap()
                .push("hot_to_standard_time".into());
            let mut all = self.backups.lock().unwrap();
            let b = all.get_mut(name).unwrap();
            b.hot_to_standard_time = hot_to_standard_time;
            Ok(b.clone())
        }

        async fn delete_backup(&self, _endpoint: &str, name: &str) -> Result<(), Status> {
            self.backups.lock().unwrap().remove(name);
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_hot_backup_is_made_with_its_time_and_moved_by_update_backup() {
        let b: Backup = from_yaml(
            "metadata: {name: nightly}\nspec: {instanceRef: orders-prod, table: events, backupType: Hot, hotToStandardAfter: 3d}\n",
        );
        let mut target = backup_target(&b, &instance(), &["orders-c1".to_string()]).unwrap();
        let now = ts("2026-11-29T12:00:00Z");
        // The server's start, a little after the operator's now.
        let fake = FakeBackups::new("2026-11-29T12:00:00.020Z");
        let made = sync_backup(&fake, "e", &target, Previous::default(), now)
            .await
            .unwrap();
        assert!(made.created);
        assert_eq!(made.phase, BackupPhase::Ready);
        let asked = fake.get(&target.name);
        assert_eq!(asked.backup_type, BackupType::Hot as i32);
        assert_eq!(
            asked.hot_to_standard_time,
            Some(proto_timestamp(ts("2026-12-02T12:00:00Z")))
        );
        // Within a second of start + 3d: left as it is.
        let previous = Previous {
            phase: Some(made.phase),
            expire_time: None,
        };
        let again = sync_backup(&fake, "e", &target, previous, now)
            .await
            .unwrap();
        assert_eq!(again.hot_to_standard_time_set, None);
        assert!(fake.updates.lock().unwrap().is_empty());
        // The spec says 5d: UpdateBackup moves it to start + 5d, and nothing else.
        target.hot_to_standard_after = Some(Duration::from_secs(5 * 86400));
        let moved = sync_backup(&fake, "e", &target, previous, now)
            .await
            .unwrap();
        let at = ts("2026-12-04T12:00:00.020Z");
        assert_eq!(moved.hot_to_standard_time_set, Some(Some(at)));
        assert_eq!(
            moved.backup.unwrap().hot_to_standard_time,
            Some(proto_timestamp(at))
        );
        assert_eq!(*fake.updates.lock().unwrap(), ["hot_to_standard_time"]);
        // Removed from the spec: unset, the backup stays Hot.
        target.hot_to_standard_after = None;
        let cleared = sync_backup(&fake, "e", &target, previous, now)
            .await
            .unwrap();
        assert_eq!(cleared.hot_to_standard_time_set, Some(None));
        assert_eq!(fake.get(&target.name).hot_to_standard_time, None);
    }

    #[tokio::test]
    async fn a_schedule_asks_for_its_hot_backups_time() {
        let s: BackupSchedule = from_yaml(
            "metadata: {name: nightly}\nspec: {instanceRef: orders-prod, tables: [events], schedule: '0 3 * * *', backupType: Hot, hotToStandardAfter: 2d}\n",
        );
        let target = schedule_target(&s, &instance(), &["orders-c1".to_string()]).unwrap();
        let fake = FakeBackups::new("2026-11-29T03:00:01Z");
        let now = ts("2026-11-29T03:00:00.500Z");
        let run = run_schedule(&fake, "e", &target, ts("2026-11-28T12:00:00Z"), now)
            .await
            .unwrap();
        assert_eq!(run.made.len(), 1);
        let made = fake.get(&run.made[0]);
        assert_eq!(made.backup_type, BackupType::Hot as i32);
        assert_eq!(
            made.hot_to_standard_time,
            Some(proto_timestamp(ts("2026-12-01T03:00:00.500Z")))
        );
    }

    fn target(keep: Option<u32>) -> ScheduleTarget {
        ScheduleTarget {
            schedule: "nightly".into(),
            cluster: "projects/p/instances/i/clusters/c".into(),
            instance: "projects/p/instances/i".into(),
            tables: vec!["a".into(), "b".into()],
            cron: parse_cron("0 3 * * *").unwrap(),
            retention: Duration::from_secs(86400),
            keep,
            suspend: false,
            backup_type: BackupType::Standard,
            hot_to_standard_after: None,
        }
    }

    fn listed(id: &str, ready: bool) -> admin::Backup {
        admin::Backup {
            name: format!("projects/p/instances/i/clusters/c/backups/{id}"),
            state: if ready {
                admin::backup::State::Ready
            } else {
                admin::backup::State::Creating
            } as i32,
            ..Default::default()
        }
    }

    #[test]
    fn keep_prunes_the_oldest_ready_backups_of_each_table() {
        let t = target(Some(2));
        let all = vec![
            listed("nightly-a-20261126030000", true),
            listed("nightly-a-20261127030000", true),
            listed("nightly-a-20261128030000", true),
            listed("nightly-a-20261129030000", false),
            listed("nightly-b-20261128030000", true),
            listed("other-a-20261101030000", true),
            listed("nightly-a-manual", true),
        ];
        let mine = owned(&t, &all);
        assert_eq!(mine.len(), 5);
        assert_eq!(mine[0].at, ts("2026-11-29T03:00:00Z"));
        assert_eq!(
            to_prune(&mine, t.keep),
            vec!["projects/p/instances/i/clusters/c/backups/nightly-a-20261126030000"]
        );
        assert!(to_prune(&mine, None).is_empty());
    }
}
