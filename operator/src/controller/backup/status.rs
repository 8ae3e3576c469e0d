//! Backup and BackupSchedule, last stage (pure): the status, the events and when to look
//! again, from what the backup API reported (or why the reconcile stopped).

use std::time::Duration;

use googleapis_tonic_google_bigtable_admin_v2::google::bigtable::admin::v2 as admin;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::controller::Action;

use crate::conditions::{self, Cond, READY};
use crate::controller::{Note, Outcome, invalid_spec_warning};
use crate::crd::{
    Backup, BackupPhase, BackupSchedule, BackupScheduleStatus, BackupStatus, ScheduledBackup,
};
use crate::lifecycle::backups::{BackupSynced, BackupTarget, ScheduleRun, recheck_after};

/// How often a backup being made is looked at.
const CREATING_POLL: Duration = Duration::from_secs(2);
/// How often a ready backup is looked at (it may be deleted or moved through the API).
const READY_RECHECK: Duration = Duration::from_secs(600);

fn time(t: Option<&prost_types::Timestamp>) -> Option<Time> {
    t.and_then(|t| Timestamp::new(t.seconds, t.nanos).ok())
        .map(Time)
}

fn backup_status(backup: &Backup, phase: BackupPhase, conds: &[Cond]) -> BackupStatus {
    let old = backup.status.clone().unwrap_or_default();
    BackupStatus {
        conditions: conditions::merge(&old.conditions, conds, backup.metadata.generation),
        observed_generation: backup.metadata.generation,
        phase: Some(phase),
        ..old
    }
}

/// The phase a Backup keeps while the reconcile cannot reach the instance.
fn kept_phase(backup: &Backup) -> BackupPhase {
    backup
        .status
        .as_ref()
        .and_then(|s| s.phase)
        .unwrap_or(BackupPhase::Pending)
}

/// Ready=False: `instance` (named by `obj`) does not exist in `obj`'s namespace.
fn instance_not_found_cond(obj: &impl ResourceExt, instance: &str) -> Cond {
    Cond::new(
        READY,
        false,
        "InstanceNotFound",
        format!(
            "Instance {instance:?} does not exist in namespace {:?}",
            obj.namespace().unwrap_or_default()
        ),
    )
}

/// Ready=False: no tablet server of `instance` is ready.
fn unavailable_cond(instance: &str) -> Cond {
    Cond::new(
        READY,
        false,
        "InstanceUnavailable",
        format!("no tablet server of instance {instance:?} is ready"),
    )
}

pub fn instance_not_found(backup: &Backup) -> Outcome<BackupStatus> {
    let cond = instance_not_found_cond(backup, &backup.spec.instance_ref);
    Outcome {
        status: backup_status(backup, kept_phase(backup), &[cond]),
        events: vec![],
        requeue: Action::requeue(Duration::from_secs(30)),
    }
}

pub fn invalid(backup: &Backup, why: String) -> Outcome<BackupStatus> {
    let old = backup.status.clone().unwrap_or_default();
    let events = invalid_spec_warning(&old.conditions, READY, &why);
    Outcome {
        status: backup_status(
            backup,
            kept_phase(backup),
            &[Cond::new(READY, false, "InvalidSpec", why)],
        ),
        events,
        // The instance's clusters may change.
        requeue: Action::requeue(Duration::from_secs(60)),
    }
}

pub fn unavailable(backup: &Backup) -> Outcome<BackupStatus> {
    let cond = unavailable_cond(&backup.spec.instance_ref);
    Outcome {
        status: backup_status(backup, kept_phase(backup), &[cond]),
        events: vec![],
        requeue: Action::requeue(Duration::from_secs(10)),
    }
}

/// The status of a backup the instance was asked about: its phase, its times and size as the
/// instance reports them, an event when it was asked for, became ready, or went.
pub fn synced(
    backup: &Backup,
    target: &BackupTarget,
    synced: &BackupSynced,
) -> Outcome<BackupStatus> {
    let name = &target.name;
    let before = backup.status.as_ref().and_then(|s| s.phase);
    let mut events = vec![];
    if synced.created {
        events.push(Note::normal(
            "BackupStarted",
            "Create",
            format!("backing up table {} as {name}", target.source_table),
        ));
    }
    let b = synced.backup.as_ref();
    let cond = match synced.phase {
        BackupPhase::Ready => {
            let size = b.map(|b| b.size_bytes).unwrap_or_default();
            let end = time(b.and_then(|b| b.end_time.as_ref()))
                .map(|t| t.0.to_string())
                .unwrap_or_default();
            if before != Some(BackupPhase::Ready) {
                events.push(Note::normal(
                    "BackupReady",
                    "Create",
                    format!("backup {name} is ready: {size} bytes as of {end}"),
                ));
            }
            match (&synced.refused, &synced.hot_refused) {
                (Some(why), _) => Cond::new(READY, true, "RetentionRefused", why.clone()),
                (None, Some(why)) => {
                    Cond::new(READY, true, "HotToStandardTimeRefused", why.clone())
                }
                (None, None) => Cond::new(
                    READY,
                    true,
                    "BackupReady",
                    format!("backup {name}: {size} bytes as of {end}"),
                ),
            }
        }
        BackupPhase::Creating | BackupPhase::Pending => Cond::new(
            READY,
            false,
            "Creating",
            format!("backup {name} is being made"),
        ),
        BackupPhase::Expired => Cond::new(
            READY,
            false,
            "Expired",
            format!("backup {name} reached its expire time and was deleted"),
        ),
        BackupPhase::Deleted => Cond::new(
            READY,
            false,
            "Deleted",
            format!("backup {name} was deleted before its expire time; it is not made again"),
        ),
    };
    if matches!(synced.phase, BackupPhase::Expired | BackupPhase::Deleted)
        && before != Some(synced.phase)
    {
        events.push(Note::warning("BackupGone", "Observe", cond.message.clone()));
    }
    if let Some(t) = synced.expire_time_set {
        events.push(Note::normal(
            "ExpireTimeChanged",
            "Update",
            format!("backup {name} now expires at {t}"),
        ));
    }
    if let Some(t) = synced.hot_to_standard_time_set {
        events.push(Note::normal(
            "HotToStandardTimeChanged",
            "Update",
            match t {
                Some(t) => format!("backup {name} now turns Standard at {t}"),
                None => format!("backup {name} now stays Hot (no hot-to-standard time)"),
            },
        ));
    }
    let mut status = backup_status(backup, synced.phase, &[cond]);
    status.backup_name = Some(name.clone());
    status.source_table = Some(target.source_table.clone());
    if let Some(b) = b {
        status.start_time = time(b.start_time.as_ref()).or(status.start_time);
        status.end_time = time(b.end_time.as_ref()).or(status.end_time);
        status.expire_time = time(b.expire_time.as_ref()).or(status.expire_time);
        status.hot_to_standard_time = time(b.hot_to_standard_time.as_ref());
        if b.state == admin::backup::State::Ready as i32 {
            status.size_bytes = Some(b.size_bytes);
        }
    }
    let requeue = match synced.phase {
        BackupPhase::Pending | BackupPhase::Creating => Action::requeue(CREATING_POLL),
        BackupPhase::Ready => {
            let until_expiry = status
                .expire_time
                .as_ref()
                .and_then(|e| Duration::try_from(e.0.duration_since(Timestamp::now())).ok())
                .unwrap_or(READY_RECHECK);
            Action::requeue(
                (until_expiry + Duration::from_secs(1))
                    .clamp(Duration::from_secs(1), READY_RECHECK),
            )
        }
        BackupPhase::Expired | BackupPhase::Deleted => Action::await_change(),
    };
    Outcome {
        status,
        events,
        requeue,
    }
}

/// A backup call failed: the phase stays, Ready says why, and it is tried again.
pub fn failed(
    backup: &Backup,
    target: &BackupTarget,
    failed: &tonic::Status,
) -> Outcome<BackupStatus> {
    let message = format!(
        "backup {}: {:?}: {}",
        target.name,
        failed.code(),
        failed.message()
    );
    let old = backup.status.clone().unwrap_or_default();
    let events = if conditions::find(&old.conditions, READY).map(|c| c.message.as_str())
        == Some(message.as_str())
    {
        vec![]
    } else {
        vec![Note::warning("BackupFailed", "Create", message.clone())]
    };
    let mut status = backup_status(
        backup,
        kept_phase(backup),
        &[Cond::new(READY, false, "BackupFailed", message)],
    );
    status.backup_name = Some(target.name.clone());
    status.source_table = Some(target.source_table.clone());
    Outcome {
        status,
        events,
        requeue: Action::requeue(Duration::from_secs(15)),
    }
}

// ------------------------------------------------------------------------------- schedules

fn schedule_status(schedule: &BackupSchedule, conds: &[Cond]) -> BackupScheduleStatus {
    let old = schedule.status.clone().unwrap_or_default();
    BackupScheduleStatus {
        conditions: conditions::merge(&old.conditions, conds, schedule.metadata.generation),
        observed_generation: schedule.metadata.generation,
        ..old
    }
}

pub fn schedule_instance_not_found(schedule: &BackupSchedule) -> Outcome<BackupScheduleStatus> {
    let cond = instance_not_found_cond(schedule, &schedule.spec.instance_ref);
    Outcome {
        status: schedule_status(schedule, &[cond]),
        events: vec![],
        requeue: Action::requeue(Duration::from_secs(30)),
    }
}

pub fn schedule_invalid(schedule: &BackupSchedule, why: String) -> Outcome<BackupScheduleStatus> {
    let old = schedule.status.clone().unwrap_or_default();
    let events = invalid_spec_warning(&old.conditions, READY, &why);
    Outcome {
        status: schedule_status(schedule, &[Cond::new(READY, false, "InvalidSpec", why)]),
        events,
        requeue: Action::requeue(Duration::from_secs(60)),
    }
}

pub fn schedule_unavailable(schedule: &BackupSchedule) -> Outcome<BackupScheduleStatus> {
    let cond = unavailable_cond(&schedule.spec.instance_ref);
    Outcome {
        status: schedule_status(schedule, &[cond]),
        events: vec![],
        requeue: Action::requeue(Duration::from_secs(10)),
    }
}

pub fn schedule_failed(
    schedule: &BackupSchedule,
    failed: &tonic::Status,
) -> Outcome<BackupScheduleStatus> {
    let message = format!("backup API: {:?}: {}", failed.code(), failed.message());
    Outcome {
        status: schedule_status(
            schedule,
            &[Cond::new(READY, false, "BackupFailed", message)],
        ),
        events: vec![],
        requeue: Action::requeue(Duration::from_secs(15)),
    }
}

/// The status after a pass: the runs, the backups the schedule holds, an event per backup
/// asked for or pruned, a warning per table that could not be backed up.
pub fn scheduled(
    schedule: &BackupSchedule,
    run: &ScheduleRun,
    now: Timestamp,
) -> Outcome<BackupScheduleStatus> {
    let mut events: Vec<Note> = run
        .made
        .iter()
        .map(|name| Note::normal("BackupStarted", "Create", format!("backing up as {name}")))
        .chain(run.pruned.iter().map(|name| {
            Note::normal(
                "BackupPruned",
                "Delete",
                format!(
                    "deleted backup {name}: more than keep={} of its table",
                    schedule.spec.keep.unwrap_or_default()
                ),
            )
        }))
        .collect();
    let cond = if run.failed.is_empty() {
        let message = if schedule.spec.suspend {
            "suspended: no backup is made".to_string()
        } else {
            match run.next {
                Some(next) => format!("the next backups are due at {next}"),
                None => "the schedule has no next time".to_string(),
            }
        };
        Cond::new(READY, true, "Scheduled", message)
    } else {
        let message = run
            .failed
            .iter()
            .map(|(table, s)| format!("table {table}: {:?}: {}", s.code(), s.message()))
            .collect::<Vec<_>>()
            .join("; ");
        events.push(Note::warning("BackupFailed", "Create", message.clone()));
        Cond::new(READY, false, "BackupFailed", message)
    };
    let mut status = schedule_status(schedule, &[cond]);
    status.last_schedule_time = run.last.map(Time);
    status.next_schedule_time = run.next.map(Time);
    status.backups = run
        .backups
        .iter()
        .map(|o| ScheduledBackup {
            backup_name: o.backup.name.clone(),
            table: o.table.clone(),
            state: if o.ready() { "READY" } else { "CREATING" }.into(),
            end_time: time(o.backup.end_time.as_ref()),
            size_bytes: o.ready().then_some(o.backup.size_bytes),
        })
        .collect();
    let requeue = if run.failed.is_empty() {
        recheck_after(run, now)
    } else {
        Duration::from_secs(15).min(recheck_after(run, now))
    };
    Outcome {
        status,
        events,
        requeue: Action::requeue(requeue),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::backups::Owned;

    fn from_yaml<T: serde::de::DeserializeOwned>(yaml: &str) -> T {
        serde_norway::from_str(yaml).unwrap()
    }

    fn target() -> BackupTarget {
        BackupTarget {
            cluster: "projects/p/instances/i/clusters/c".into(),
            backup_id: "b".into(),
            name: "projects/p/instances/i/clusters/c/backups/b".into(),
            source_table: "projects/p/instances/i/tables/t".into(),
            retention: Duration::from_secs(86400),
            backup_type: googleapis_tonic_google_bigtable_admin_v2::google::bigtable::admin::v2::backup::BackupType::Standard,
            hot_to_standard_after: None,
        }
    }

    fn ts(seconds: i64) -> prost_types::Timestamp {
        prost_types::Timestamp { seconds, nanos: 0 }
    }

    #[test]
    fn a_backup_reports_its_phase_times_and_size_with_one_event_per_change() {
        let backup: Backup = from_yaml(
            "metadata: {name: b, namespace: shop, generation: 2}\nspec: {instanceRef: orders-prod, table: t}\n",
        );
        let creating = BackupSynced {
            phase: BackupPhase::Creating,
            backup: None,
            created: true,
            expire_time_set: None,
            refused: None,
            hot_to_standard_time_set: None,
            hot_refused: None,
        };
        let out = synced(&backup, &target(), &creating);
        assert_eq!(out.status.phase, Some(BackupPhase::Creating));
        assert_eq!(out.events[0].reason, "BackupStarted");
        assert_eq!(out.requeue, Action::requeue(CREATING_POLL));
        let ready = BackupSynced {
            phase: BackupPhase::Ready,
            backup: Some(admin::Backup {
                state: admin::backup::State::Ready as i32,
                size_bytes: 1234,
                start_time: Some(ts(1_800_000_000)),
                end_time: Some(ts(1_800_000_010)),
                expire_time: Some(ts(1_800_086_400)),
                ..Default::default()
            }),
            created: false,
            expire_time_set: None,
            refused: None,
            hot_to_standard_time_set: None,
            hot_refused: None,
        };
        let mut backup = backup;
        backup.status = Some(out.status);
        let out = synced(&backup, &target(), &ready);
        assert_eq!(out.status.phase, Some(BackupPhase::Ready));
        assert_eq!(out.status.size_bytes, Some(1234));
        assert_eq!(
            out.status.end_time.as_ref().map(|t| t.0.as_second()),
            Some(1_800_000_010)
        );
        assert_eq!(out.status.observed_generation, Some(2));
        let ready_cond = conditions::find(&out.status.conditions, READY).unwrap();
        assert_eq!(
            (ready_cond.status.as_str(), ready_cond.reason.as_str()),
            ("True", "BackupReady")
        );
        assert_eq!(
            out.events.iter().map(|e| e.reason).collect::<Vec<_>>(),
            ["BackupReady"]
        );
        backup.status = Some(out.status);
        // Seen ready again: no new event.
        assert!(synced(&backup, &target(), &ready).events.is_empty());
    }

    #[test]
    fn a_hot_backup_reports_when_it_turns_standard_and_each_move() {
        let mut backup: Backup = from_yaml(
            "metadata: {name: b, namespace: shop, generation: 3}\nspec: {instanceRef: orders-prod, table: t, backupType: Hot, hotToStandardAfter: 3d}\n",
        );
        backup.status = Some(BackupStatus {
            phase: Some(BackupPhase::Ready),
            ..Default::default()
        });
        let ready = |hot: Option<i64>| admin::Backup {
            state: admin::backup::State::Ready as i32,
            start_time: Some(ts(1_800_000_000)),
            expire_time: Some(ts(1_802_592_000)),
            hot_to_standard_time: hot.map(ts),
            ..Default::default()
        };
        let moved = BackupSynced {
            phase: BackupPhase::Ready,
            backup: Some(ready(Some(1_800_259_200))),
            created: false,
            expire_time_set: None,
            refused: None,
            hot_to_standard_time_set: Some(Timestamp::new(1_800_259_200, 0).ok()),
            hot_refused: None,
        };
        let out = synced(&backup, &target(), &moved);
        assert_eq!(
            out.status
                .hot_to_standard_time
                .as_ref()
                .map(|t| t.0.as_second()),
            Some(1_800_259_200)
        );
        assert_eq!(out.events.len(), 1);
        assert_eq!(out.events[0].reason, "HotToStandardTimeChanged");
        assert!(
            out.events[0]
                .note
                .ends_with("now turns Standard at 2027-01-18T08:00:00Z"),
            "{}",
            out.events[0].note
        );
        // Unset: it stays Hot, and the status no longer shows a time.
        backup.status = Some(out.status);
        let cleared = BackupSynced {
            backup: Some(ready(None)),
            hot_to_standard_time_set: Some(None),
            ..moved.clone()
        };
        let out = synced(&backup, &target(), &cleared);
        assert_eq!(out.status.hot_to_standard_time, None);
        assert!(
            out.events[0]
                .note
                .ends_with("now stays Hot (no hot-to-standard time)")
        );
        // A Standard backup's time cannot move: Ready stays true, and says why.
        let refused = BackupSynced {
            hot_to_standard_time_set: None,
            hot_refused: Some("the backup is Standard since then".into()),
            ..moved
        };
        let out = synced(&backup, &target(), &refused);
        let cond = conditions::find(&out.status.conditions, READY).unwrap();
        assert_eq!(
            (cond.status.as_str(), cond.reason.as_str()),
            ("True", "HotToStandardTimeRefused")
        );
        assert!(out.events.is_empty());
    }

    #[test]
    fn a_schedule_reports_its_runs_and_backups() {
        let schedule: BackupSchedule = from_yaml(
            "metadata: {name: nightly, namespace: shop}\nspec: {instanceRef: orders-prod, tables: [t], schedule: '0 3 * * *', keep: 2}\n",
        );
        let at: Timestamp = "2026-11-29T03:00:00Z".parse().unwrap();
        let next: Timestamp = "2026-11-30T03:00:00Z".parse().unwrap();
        let run = ScheduleRun {
            made: vec!["projects/p/instances/i/clusters/c/backups/nightly-t-20261129030000".into()],
            pruned: vec![
                "projects/p/instances/i/clusters/c/backups/nightly-t-20261126030000".into(),
            ],
            failed: vec![],
            backups: vec![Owned {
                table: "t".into(),
                at,
                backup: admin::Backup {
                    name: "projects/p/instances/i/clusters/c/backups/nightly-t-20261129030000"
                        .into(),
                    state: admin::backup::State::Creating as i32,
                    ..Default::default()
                },
            }],
            last: Some(at),
            next: Some(next),
        };
        let out = scheduled(&schedule, &run, "2026-11-29T03:00:01Z".parse().unwrap());
        assert_eq!(out.status.last_schedule_time.map(|t| t.0), Some(at));
        assert_eq!(out.status.next_schedule_time.map(|t| t.0), Some(next));
        assert_eq!(out.status.backups.len(), 1);
        assert_eq!(out.status.backups[0].state, "CREATING");
        assert_eq!(
            out.events.iter().map(|e| e.reason).collect::<Vec<_>>(),
            ["BackupStarted", "BackupPruned"]
        );
        // A backup being made: looked at again within seconds.
        assert_eq!(out.requeue, Action::requeue(Duration::from_secs(2)));
    }
}
