//! The `Backup` and `BackupSchedule` resources: a backup of a table declared once, and backups
//! of tables made on a cron schedule and pruned, both through Bigtable's backup API (the
//! backups live in the instance's backup location, beside those clients create; every one of
//! them appears in `ListBackups`).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::DeletionPolicy;

/// The retention of a backup when the spec names none: a week.
pub const DEFAULT_RETENTION: &str = "7d";

fn default_retention() -> String {
    DEFAULT_RETENTION.into()
}

/// One backup of a table, made once when the resource is created (Bigtable's CreateBackup:
/// one point in time across every tablet of the table). It is kept until its expire time
/// (`retention` after it started), which the spec can move.
// `printcolumn(...)` repeats `type_ = ...` per column, which clippy mistakes for duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "basalt.dev",
    version = "v1alpha1",
    kind = "Backup",
    namespaced,
    status = "BackupStatus",
    shortname = "btb",
    category = "basalt",
    doc = "A backup of a table of a Basalt instance, made once and kept until it expires.",
    printcolumn(name = "Instance", type_ = "string", json_path = ".spec.instanceRef"),
    printcolumn(name = "Table", type_ = "string", json_path = ".spec.table"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Size", type_ = "integer", json_path = ".status.sizeBytes"),
    printcolumn(name = "Expires", type_ = "date", json_path = ".status.expireTime"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(
    validation = Rule::new("self.instanceRef == oldSelf.instanceRef").message("instanceRef is immutable"),
    validation = Rule::new("self.table == oldSelf.table").message("table is immutable: a backup is of one table"),
    validation = Rule::new("has(oldSelf.cluster) == has(self.cluster) && (!has(self.cluster) || self.cluster == oldSelf.cluster)").message("cluster is immutable"),
    validation = Rule::new("has(oldSelf.backupId) == has(self.backupId) && (!has(self.backupId) || self.backupId == oldSelf.backupId)").message("backupId is immutable"),
    validation = Rule::new("!has(oldSelf.backupType) || !has(self.backupType) || self.backupType == oldSelf.backupType").message("backupType is immutable: a backup is made as one type"),
    validation = Rule::new(HOT_ONLY_RULE).message(HOT_ONLY_MESSAGE),
)]
#[serde(rename_all = "camelCase")]
pub struct BackupSpec {
    /// Name of the Instance (same namespace). Immutable.
    #[schemars(length(min = 1))]
    pub instance_ref: String,
    /// The Bigtable cluster id (the Cluster resource's name) the backup is made in. Defaults
    /// to the instance's first cluster by name. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$"))]
    pub cluster: Option<String>,
    /// The id of the table to back up. Immutable.
    #[schemars(regex(pattern = r"^[_a-zA-Z0-9][-_.a-zA-Z0-9]{0,49}$"))]
    pub table: String,
    /// The backup id (`[_a-zA-Z0-9][-_.a-zA-Z0-9]*`, at most 50 characters). Defaults to the
    /// resource's name. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[_a-zA-Z0-9][-_.a-zA-Z0-9]{0,49}$"))]
    pub backup_id: Option<String>,
    /// How long the backup is kept after it started: 6h to 90d (Bigtable's bounds), as in
    /// `36h` or `30d`. Changing it moves the backup's expire time.
    #[serde(default = "default_retention")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h|d))+$"))]
    pub retention: String,
    /// What deleting this resource does to the backup: Retain (the default) keeps it until
    /// it expires; Delete deletes it.
    #[serde(default)]
    pub deletion_policy: DeletionPolicy,
    /// Bigtable's backup type: Standard (the default) or Hot (for restores that serve at
    /// once; Basalt restores both the same way and records the type). Immutable.
    #[serde(default)]
    pub backup_type: BackupType,
    /// With `backupType: Hot` only: the backup turns Standard this long after it started
    /// (Bigtable's `hot_to_standard_time`), as in `3d`: at least 24h, and shorter than the
    /// retention. Changing it moves the backup's hot-to-standard time; removing it keeps the
    /// backup Hot (until it is Standard already). Unset: it stays Hot until it expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h|d))+$"), length(max = 64))]
    #[x_kube(validation = Rule::new(HOT_MINIMUM_RULE).message(HOT_MINIMUM_MESSAGE))]
    pub hot_to_standard_after: Option<String>,
}

/// The CEL rule (on a spec) that refuses `hotToStandardAfter` without `backupType: Hot`.
const HOT_ONLY_RULE: &str =
    "!has(self.hotToStandardAfter) || (has(self.backupType) && self.backupType == 'Hot')";
const HOT_ONLY_MESSAGE: &str = "hotToStandardAfter applies only to backupType: Hot (a Standard backup has no hot-to-standard time)";
/// The CEL rule (on `hotToStandardAfter`) that refuses less than 24 hours. CEL's `duration()`
/// has no `d` unit: a value with days is left to the operator, which refuses the rare one
/// still below 24h (`0d12h`) and one not shorter than the retention (which CEL cannot sum).
const HOT_MINIMUM_RULE: &str = "self.contains('d') || duration(self) >= duration('24h')";
const HOT_MINIMUM_MESSAGE: &str = "hotToStandardAfter is at least 24h: a Hot backup stays Hot at least 24 hours (Bigtable's minimum)";

/// Bigtable's `Backup.backup_type`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum BackupType {
    #[default]
    Standard,
    Hot,
}

/// Where a Backup stands.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum BackupPhase {
    /// Not started yet: the instance, its table or its backup location is not available.
    Pending,
    /// Being made.
    Creating,
    /// Made, and restorable until its expire time.
    Ready,
    /// It reached its expire time and the instance deleted it.
    Expired,
    /// Deleted before its expire time (through the API, or by hand): not made again, which
    /// would be another point in time.
    Deleted,
}

/// What the operator observed of a Backup.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupStatus {
    #[serde(default)]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<BackupPhase>,
    /// `projects/P/instances/I/clusters/C/backups/B`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_name: Option<String>,
    /// `projects/P/instances/I/tables/T`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_table: Option<String>,
    /// When the backup started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// The backup's point in time: it holds every write acknowledged before it and none
    /// after.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expire_time: Option<Time>,
    /// When a Hot backup turns Standard (Bigtable's `hot_to_standard_time`; none: it stays
    /// Hot, or it is a Standard backup).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hot_to_standard_time: Option<Time>,
    /// The size of the table's data in the backup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<i64>,
}

/// Backups of tables on a cron schedule, each kept for `retention` and the oldest pruned
/// beyond `keep` per table (CloudNativePG's ScheduledBackup, with Bigtable's backups).
// `printcolumn(...)` repeats `type_ = ...` per column, which clippy mistakes for duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "basalt.dev",
    version = "v1alpha1",
    kind = "BackupSchedule",
    namespaced,
    status = "BackupScheduleStatus",
    shortname = "btbs",
    category = "basalt",
    doc = "Backups of tables of a Basalt instance made on a cron schedule, kept for a retention and pruned.",
    printcolumn(name = "Instance", type_ = "string", json_path = ".spec.instanceRef"),
    printcolumn(name = "Schedule", type_ = "string", json_path = ".spec.schedule"),
    printcolumn(name = "Suspended", type_ = "boolean", json_path = ".spec.suspend"),
    printcolumn(name = "Last", type_ = "date", json_path = ".status.lastScheduleTime"),
    printcolumn(name = "Next", type_ = "date", json_path = ".status.nextScheduleTime"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    )
)]
#[x_kube(
    validation = Rule::new("self.instanceRef == oldSelf.instanceRef").message("instanceRef is immutable"),
    validation = Rule::new(HOT_ONLY_RULE).message(HOT_ONLY_MESSAGE),
)]
#[serde(rename_all = "camelCase")]
pub struct BackupScheduleSpec {
    /// Name of the Instance (same namespace). Immutable.
    #[schemars(length(min = 1))]
    pub instance_ref: String,
    /// The Bigtable cluster id the backups are made in. Defaults to the instance's first
    /// cluster by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$"))]
    pub cluster: Option<String>,
    /// The ids of the tables to back up, one backup of each per run.
    #[schemars(length(min = 1))]
    #[x_kube(validation = Rule::new("self.all(t, t.matches('^[_a-zA-Z0-9][-_.a-zA-Z0-9]{0,49}$'))").message("table ids are 1 to 50 characters of [-_.a-zA-Z0-9], not starting with - or ."))]
    pub tables: Vec<String>,
    /// When to back up, in UTC: a cron expression of 5 fields (`minute hour day-of-month
    /// month day-of-week`, as a CronJob's) or 6 with seconds first (as CloudNativePG's);
    /// lists, ranges, steps and names (`MON`, `JAN`) as in Vixie cron. A run missed while the
    /// operator was down is made once when it is back.
    #[schemars(length(min = 9))]
    pub schedule: String,
    /// How long each backup is kept after it started: 6h to 90d (Bigtable's bounds).
    #[serde(default = "default_retention")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h|d))+$"))]
    pub retention: String,
    /// Keep at most this many of the schedule's backups of each table, deleting the oldest
    /// (unset: only `retention` limits them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub keep: Option<u32>,
    /// While true, no backup is made (those made are still pruned).
    #[serde(default)]
    pub suspend: bool,
    /// The type of the backups made: Standard (the default) or Hot (Bigtable's backup types).
    #[serde(default)]
    pub backup_type: BackupType,
    /// With `backupType: Hot` only: each backup made turns Standard this long after it
    /// started (Bigtable's `hot_to_standard_time`), as in `3d`: at least 24h, and shorter than
    /// the retention. A change applies to the backups made after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h|d))+$"), length(max = 64))]
    #[x_kube(validation = Rule::new(HOT_MINIMUM_RULE).message(HOT_MINIMUM_MESSAGE))]
    pub hot_to_standard_after: Option<String>,
}

/// One backup a schedule made, as last observed.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScheduledBackup {
    /// `projects/P/instances/I/clusters/C/backups/B`.
    pub backup_name: String,
    /// The table's id.
    pub table: String,
    /// CREATING or READY.
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<i64>,
}

/// What the operator observed of a BackupSchedule.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupScheduleStatus {
    #[serde(default)]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The schedule time of the newest run made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_schedule_time: Option<Time>,
    /// When the next run is due (none while suspended).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_schedule_time: Option<Time>,
    /// The schedule's backups the instance holds, newest first.
    #[serde(default)]
    pub backups: Vec<ScheduledBackup>,
}
