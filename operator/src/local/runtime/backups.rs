//! An instance's `Backup` and `BackupSchedule` manifests, made by one task per instance
//! through the backup API at its endpoint ([`lifecycle::backups`], as the Kubernetes
//! controllers do). What each stands at is kept in memory (a Backup's phase and expire time,
//! a schedule's first sight) and shown by `local status`; a schedule's runs are read back
//! from `ListBackups`, so a restarted runtime goes on where it was.

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::*;
use crate::crd::BackupPhase;
use crate::lifecycle::backups::{self, Previous};

/// How often the task looks at the instance's backups.
const TICK: Duration = Duration::from_millis(500);
/// How often a ready backup is looked at again (it may be deleted or changed through the
/// API).
const READY_RECHECK: Duration = Duration::from_secs(10);

/// What the task knows of one object.
#[derive(Default)]
struct Seen {
    previous: Previous,
    /// When the manifest was first seen: a schedule's runs before it are not made.
    since: Option<Timestamp>,
    /// Not looked at again before this.
    next: Option<tokio::time::Instant>,
}

impl Runtime {
    /// Starts the instance's backup task (it ends when the runtime stops or the instance
    /// goes).
    pub(super) fn keep_backups(self: &Arc<Self>, instance: &str) {
        let rt = self.clone();
        let instance = instance.to_string();
        let mut stop = self.stop_servers.subscribe();
        tokio::spawn(async move {
            let mut seen: BTreeMap<(&'static str, String), Seen> = BTreeMap::new();
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(TICK) => {}
                    _ = stop.wait_for(|v| *v) => return,
                }
                let Some(li) = rt.desired_instance(&instance) else {
                    return;
                };
                if li.backups.is_empty() && li.backup_schedules.is_empty() {
                    continue;
                }
                let Some((inst, endpoint, admin)) = rt.instance_and_endpoint(&instance) else {
                    return;
                };
                let clusters: Vec<String> = li.clusters.iter().map(|c| c.name.clone()).collect();
                for backup in &li.backups {
                    let name = backup.name_any();
                    let s = seen.entry(("Backup", name.clone())).or_default();
                    if s.next.is_some_and(|n| n > tokio::time::Instant::now()) {
                        continue;
                    }
                    let line = match backups::backup_target(backup, &inst, &clusters) {
                        Err(why) => format!("refused: {why}"),
                        Ok(target) => {
                            match backups::sync_backup(
                                &*admin,
                                &endpoint,
                                &target,
                                s.previous,
                                Timestamp::now(),
                            )
                            .await
                            {
                                Ok(synced) => {
                                    s.previous = Previous {
                                        phase: Some(synced.phase),
                                        expire_time: synced
                                            .backup
                                            .as_ref()
                                            .and_then(|b| b.expire_time.as_ref())
                                            .and_then(|t| Timestamp::new(t.seconds, t.nanos).ok())
                                            .or(s.previous.expire_time),
                                    };
                                    s.next = match synced.phase {
                                        BackupPhase::Ready => {
                                            Some(tokio::time::Instant::now() + READY_RECHECK)
                                        }
                                        BackupPhase::Expired | BackupPhase::Deleted => Some(
                                            tokio::time::Instant::now()
                                                + Duration::from_secs(86400 * 365),
                                        ),
                                        _ => None,
                                    };
                                    if synced.created {
                                        tracing::info!(%instance, backup = %target.name, "backup started");
                                    }
                                    describe_backup(&target.name, &synced)
                                }
                                Err(s) => {
                                    format!("{}: {:?}: {}", target.name, s.code(), s.message())
                                }
                            }
                        }
                    };
                    rt.set_backup_status(&instance, &format!("Backup {name}"), line);
                }
                for schedule in &li.backup_schedules {
                    let name = schedule.name_any();
                    let s = seen.entry(("BackupSchedule", name.clone())).or_default();
                    let since = *s.since.get_or_insert_with(Timestamp::now);
                    if s.next.is_some_and(|n| n > tokio::time::Instant::now()) {
                        continue;
                    }
                    let line = match backups::schedule_target(schedule, &inst, &clusters) {
                        Err(why) => format!("refused: {why}"),
                        Ok(target) => {
                            let now = Timestamp::now();
                            match backups::run_schedule(&*admin, &endpoint, &target, since, now)
                                .await
                            {
                                Ok(run) => {
                                    for made in &run.made {
                                        tracing::info!(%instance, schedule = %name, backup = %made, "scheduled backup started");
                                    }
                                    for pruned in &run.pruned {
                                        tracing::info!(%instance, schedule = %name, backup = %pruned, "scheduled backup pruned (keep)");
                                    }
                                    s.next = Some(
                                        tokio::time::Instant::now()
                                            + backups::recheck_after(&run, now),
                                    );
                                    describe_run(&run)
                                }
                                Err(s) => format!("{:?}: {}", s.code(), s.message()),
                            }
                        }
                    };
                    rt.set_backup_status(&instance, &format!("BackupSchedule {name}"), line);
                }
                seen.retain(|(kind, name), _| match *kind {
                    "Backup" => li.backups.iter().any(|b| &b.name_any() == name),
                    _ => li.backup_schedules.iter().any(|b| &b.name_any() == name),
                });
            }
        });
    }

    /// The instance as the manifests now declare it.
    fn desired_instance(&self, instance: &str) -> Option<LocalInstance> {
        let inner = lock(&self.inner);
        if inner.stopped {
            return None;
        }
        inner.desired.iter().find(|i| i.name == instance).cloned()
    }

    fn set_backup_status(&self, instance: &str, key: &str, line: String) {
        let changed = {
            let mut inner = lock(&self.inner);
            let Some(running) = inner.instances.get_mut(instance) else {
                return;
            };
            running.backups.insert(key.to_string(), line.clone()) != Some(line)
        };
        if changed {
            self.write_state();
        }
    }
}

/// A Backup in one line, for `local status`.
fn describe_backup(name: &str, synced: &backups::BackupSynced) -> String {
    let b = synced.backup.as_ref();
    let t = |t: Option<&prost_types::Timestamp>| {
        t.and_then(|t| Timestamp::new(t.seconds, t.nanos).ok())
            .map(|t| t.to_string())
            .unwrap_or_default()
    };
    let mut line = match synced.phase {
        BackupPhase::Ready => format!(
            "{name}: Ready, {} bytes as of {}{}, expires {}",
            b.map(|b| b.size_bytes).unwrap_or_default(),
            t(b.and_then(|b| b.end_time.as_ref())),
            b.and_then(|b| b.hot_to_standard_time.as_ref())
                .map(|h| format!(", Hot until {}", t(Some(h))))
                .unwrap_or_default(),
            t(b.and_then(|b| b.expire_time.as_ref())),
        ),
        phase => format!("{name}: {phase:?}"),
    };
    for why in [&synced.refused, &synced.hot_refused].into_iter().flatten() {
        line.push_str(&format!(" ({why})"));
    }
    line
}

/// A schedule's pass in one line, for `local status`.
fn describe_run(run: &backups::ScheduleRun) -> String {
    let mut parts = vec![];
    match run.next {
        Some(next) => parts.push(format!("next at {next}")),
        None => parts.push("suspended".into()),
    }
    let ready = run.backups.iter().filter(|o| o.ready()).count();
    parts.push(format!(
        "{} backup(s), {ready} ready{}",
        run.backups.len(),
        run.backups
            .first()
            .map(|o| format!(", the newest {}", o.backup.name))
            .unwrap_or_default()
    ));
    for (table, s) in &run.failed {
        parts.push(format!(
            "table {table} failed: {:?}: {}",
            s.code(),
            s.message()
        ));
    }
    parts.join("; ")
}
