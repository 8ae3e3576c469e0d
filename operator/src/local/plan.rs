//! What `local apply` means, pure: the running runtime's desired state, the state after the
//! applied manifests are merged in, and the manifests themselves give the list of
//! [`Change`]s to carry out — or the reasons the whole apply is refused (nothing is changed
//! then).
//!
//! Refused, as on Kubernetes: what the operator's validation calls immutable (a cluster's
//! storage type, location, volume size, instance). Refused only here: a change of an
//! Instance's project (its servers run with `--project`), and a count change of a cluster
//! whose scale-in is under way other than a raise (a raise cancels it; lowering it further
//! waits until the drain is done — see [`super::scale_in`]).

use std::collections::BTreeMap;
use std::fmt;

use kube::ResourceExt;

use super::manifests::{LocalCluster, LocalInstance, Manifests};
use super::state::ScaleInState;
use crate::crd::{Cluster, DEFAULT_STORAGE_SIZE};
use crate::rules::{self, ClusterFacts};

/// One thing an apply does, in the order it is carried out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A new Instance: its endpoint, master and clusters start.
    InstanceAdded { instance: String },
    /// A new Cluster of an Instance (new or running): its servers start.
    ClusterAdded {
        instance: String,
        cluster: String,
        serve_nodes: i32,
    },
    /// More servers for a running cluster: ordinals `from..to` start.
    ScaledOut {
        instance: String,
        cluster: String,
        from: i32,
        to: i32,
    },
    /// Fewer servers for a running cluster: `to` is recorded in etcd, the servers of ordinal
    /// `to` and above drain, each stops once it owns no tablet.
    ScaledIn {
        instance: String,
        cluster: String,
        from: i32,
        to: i32,
    },
    /// The count of a cluster whose scale-in from `from` to `was` runs is raised to `to`: the
    /// drain of the servers below `to` is cancelled (those already stopped start again).
    ScaleInCancelled {
        instance: String,
        cluster: String,
        from: i32,
        was: i32,
        to: i32,
    },
    /// A running cluster's `spec.peerEndpoint` changed: recorded in etcd (the other clusters'
    /// servers read it within seconds).
    PeerEndpointChanged {
        instance: String,
        cluster: String,
        endpoint: Option<String>,
    },
    /// A Table to create or bring to its spec through the admin API (every Table in the
    /// applied manifests: the instance may have drifted from it, as the controller assumes).
    TableApplied { instance: String, table: String },
    /// An AppProfile recorded (new, or with a changed spec).
    AppProfileApplied {
        instance: String,
        app_profile: String,
    },
    /// A Backup or BackupSchedule declared (new, or with a changed spec): the instance's
    /// backup task makes it ([`crate::lifecycle::backups`]).
    BackupApplied {
        instance: String,
        kind: &'static str,
        name: String,
    },
    /// A running Instance's `spec.replication` changed: its limits are recorded in etcd.
    ReplicationLimitsApplied { instance: String },
    /// A running Cluster the applied manifests leave out of its Instance (they declare the
    /// Instance with its other Clusters): it is removed, as deleting it does on Kubernetes —
    /// out of the endpoint at once, its servers stopped once every write they logged is in a
    /// Cluster that stays, then released (`runtime::removal`).
    ClusterRemoved { instance: String, cluster: String },
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::InstanceAdded { instance } => write!(f, "instance {instance}: started"),
            Change::ClusterAdded {
                instance,
                cluster,
                serve_nodes,
            } => write!(
                f,
                "instance {instance}: cluster {cluster} started with {serve_nodes} server(s)"
            ),
            Change::ScaledOut {
                instance,
                cluster,
                from,
                to,
            } => write!(
                f,
                "instance {instance}: cluster {cluster} scaled out from {from} to {to} server(s)"
            ),
            Change::ScaledIn {
                instance,
                cluster,
                from,
                to,
            } => write!(
                f,
                "instance {instance}: cluster {cluster} scaling in from {from} to {to} server(s)"
            ),
            Change::ScaleInCancelled {
                instance,
                cluster,
                from,
                was,
                to,
            } => write!(
                f,
                "instance {instance}: cluster {cluster}: scale-in from {from} to {was} server(s) cancelled, serveNodes {to}"
            ),
            Change::PeerEndpointChanged {
                instance,
                cluster,
                endpoint,
            } => match endpoint {
                Some(endpoint) => write!(
                    f,
                    "instance {instance}: cluster {cluster}: the other clusters reach it at {endpoint}"
                ),
                None => write!(
                    f,
                    "instance {instance}: cluster {cluster}: the other clusters reach it at its servers"
                ),
            },
            Change::TableApplied { instance, table } => {
                write!(f, "instance {instance}: table {table} applied")
            }
            Change::AppProfileApplied {
                instance,
                app_profile,
            } => write!(f, "instance {instance}: app profile {app_profile} recorded"),
            Change::ReplicationLimitsApplied { instance } => {
                write!(f, "instance {instance}: replication limits recorded")
            }
            Change::BackupApplied {
                instance,
                kind,
                name,
            } => write!(
                f,
                "instance {instance}: {kind} {name} applied (`local status` shows its backups)"
            ),
            Change::ClusterRemoved { instance, cluster } => write!(
                f,
                "instance {instance}: cluster {cluster} removing: client connections no longer go to it; its servers stop once every write they logged is in a cluster that stays (`local status` says what it waits for)"
            ),
        }
    }
}

/// What the cluster as it runs says cannot change (the local counterpart of the facts the
/// Kubernetes controller reads from the StatefulSet).
pub fn facts(running: &Cluster) -> ClusterFacts {
    ClusterFacts {
        storage_type: Some(running.spec.storage_type),
        location: Some(running.spec.location.clone()),
        instance: Some(running.spec.instance_ref.clone()),
        storage_size: Some(
            running
                .spec
                .storage_size
                .as_ref()
                .map(|q| q.0.clone())
                .unwrap_or_else(|| DEFAULT_STORAGE_SIZE.into()),
        ),
        storage_class: running.spec.storage_class_name.clone(),
    }
}

/// What an instance's processes are given of its security: whether it speaks TLS, its first
/// administrators and its identities (an unset `spec.security` is the default one).
fn secured_as(instance: &crate::crd::Instance) -> (bool, Vec<String>, Vec<String>) {
    let security = instance.spec.security.clone().unwrap_or_default();
    (
        instance.spec.tls_enabled(),
        security.admin_principals,
        security.identities.into_iter().map(|i| i.name).collect(),
    )
}

/// Every reason an apply is refused, one per line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("refused:\n{}", .0.join("\n"))]
pub struct Refused(pub Vec<String>);

/// The changes that bring the runtime from `current` to `next` (= `current`'s manifests with
/// `applied` merged in, validated), or every reason to refuse. `scale_ins` are the scale-ins
/// under way, by cluster name; `removing` the clusters on their way out of their instance
/// (no longer in `current`, their servers still run).
pub fn plan(
    current: &[LocalInstance],
    next: &[LocalInstance],
    applied: &Manifests,
    scale_ins: &BTreeMap<String, ScaleInState>,
    removing: &[String],
) -> Result<Vec<Change>, Refused> {
    let mut problems = vec![];
    let mut changes = vec![];
    for instance in next {
        let old = current
            .iter()
            .find(|i| i.namespace == instance.namespace && i.name == instance.name);
        for gone in old
            .iter()
            .flat_map(|o| &o.clusters)
            .filter(|c| instance.cluster(&c.name).is_none())
        {
            if let Some(s) = scale_ins.get(&gone.name) {
                problems.push(format!(
                    "Cluster {}/{}: removing it refused: {}",
                    instance.namespace,
                    gone.name,
                    in_progress(&gone.name, s)
                ));
            } else {
                changes.push(Change::ClusterRemoved {
                    instance: instance.name.clone(),
                    cluster: gone.name.clone(),
                });
            }
        }
        for back in instance
            .clusters
            .iter()
            .filter(|c| removing.contains(&c.name))
        {
            problems.push(format!(
                "Cluster {}/{}: it is being removed from the instance: apply it again once it is gone (`local status`)",
                instance.namespace, back.name
            ));
        }
    }
    for instance in next {
        let old = current
            .iter()
            .find(|i| i.namespace == instance.namespace && i.name == instance.name);
        let name = instance.name.clone();
        match old {
            None => changes.push(Change::InstanceAdded {
                instance: name.clone(),
            }),
            Some(old) if old.project != instance.project => problems.push(format!(
                "Instance {instance}: spec.projectId cannot change from {:?} to {:?} while the runtime runs (its servers run with --project {}): stop the runtime and start it with the new manifests",
                old.project, instance.project, old.project
            )),
            Some(old) if secured_as(&old.instance) != secured_as(&instance.instance) => {
                problems.push(format!(
                    "Instance {instance}: spec.security (or the TLS its type implies) cannot change while the runtime runs (its servers and master run with the flags it gives): stop the runtime and start it with the new manifests"
                ))
            }
            Some(old) if old.instance.spec.backup_store != instance.instance.spec.backup_store => {
                problems.push(format!(
                    "Instance {instance}: spec.backupStore cannot change while the runtime runs (its servers run with the location it gives): stop the runtime and start it with the new manifests"
                ))
            }
            Some(old) if old.instance.spec.replication != instance.instance.spec.replication => {
                changes.push(Change::ReplicationLimitsApplied {
                    instance: name.clone(),
                })
            }
            Some(_) => {}
        }
        for cluster in &instance.clusters {
            match old.and_then(|o| o.cluster(&cluster.name)) {
                None => changes.push(Change::ClusterAdded {
                    instance: name.clone(),
                    cluster: cluster.name.clone(),
                    serve_nodes: cluster.serve_nodes,
                }),
                Some(running) => cluster_change(
                    &name,
                    running,
                    cluster,
                    scale_ins.get(&cluster.name),
                    &mut changes,
                    &mut problems,
                ),
            }
        }
        for table in &instance.tables {
            if applied.tables.iter().any(|t| same(t, table)) {
                changes.push(Change::TableApplied {
                    instance: name.clone(),
                    table: rules::table_id(table),
                });
            }
        }
        for backup in &instance.backups {
            let was = old.and_then(|o| o.backups.iter().find(|b| same(*b, backup)));
            if applied.backups.iter().any(|b| same(b, backup))
                && was.map(|b| &b.spec) != Some(&backup.spec)
            {
                changes.push(Change::BackupApplied {
                    instance: name.clone(),
                    kind: "Backup",
                    name: backup.name_any(),
                });
            }
        }
        for schedule in &instance.backup_schedules {
            let was = old.and_then(|o| o.backup_schedules.iter().find(|b| same(*b, schedule)));
            if applied.backup_schedules.iter().any(|b| same(b, schedule))
                && was.map(|b| &b.spec) != Some(&schedule.spec)
            {
                changes.push(Change::BackupApplied {
                    instance: name.clone(),
                    kind: "BackupSchedule",
                    name: schedule.name_any(),
                });
            }
        }
        for profile in &instance.app_profiles {
            let was = old.and_then(|o| o.app_profiles.iter().find(|p| same(*p, profile)));
            if applied.app_profiles.iter().any(|p| same(p, profile))
                && was.map(|p| &p.spec) != Some(&profile.spec)
            {
                changes.push(Change::AppProfileApplied {
                    instance: name.clone(),
                    app_profile: profile.app_profile_id(),
                });
            }
        }
    }
    if problems.is_empty() {
        Ok(changes)
    } else {
        Err(Refused(problems))
    }
}

fn same<K: ResourceExt>(a: &K, b: &K) -> bool {
    a.namespace() == b.namespace() && a.name_any() == b.name_any()
}

fn cluster_change(
    instance: &str,
    running: &LocalCluster,
    wanted: &LocalCluster,
    scale_in: Option<&ScaleInState>,
    changes: &mut Vec<Change>,
    problems: &mut Vec<String>,
) {
    let ns = wanted.cluster.namespace().unwrap_or_default();
    let id = format!("Cluster {ns}/{}", wanted.name);
    let found = rules::validate_cluster(&wanted.cluster, &facts(&running.cluster));
    if !found.is_empty() {
        problems.push(format!("{id}: {}", rules::describe(&found)));
        return;
    }
    let (from, to) = (running.serve_nodes, wanted.serve_nodes);
    let (instance, cluster) = (instance.to_string(), wanted.name.clone());
    if running.cluster.spec.peer_endpoint != wanted.cluster.spec.peer_endpoint {
        changes.push(Change::PeerEndpointChanged {
            instance: instance.clone(),
            cluster: cluster.clone(),
            endpoint: wanted.cluster.spec.peer_endpoint.clone(),
        });
    }
    if let Some(s) = scale_in {
        if to > from {
            changes.push(Change::ScaleInCancelled {
                instance,
                cluster,
                from: s.from,
                was: s.to,
                to,
            });
        } else if to < from {
            problems.push(format!(
                "{id}: serveNodes {from} → {to} refused: {}",
                in_progress(&cluster, s)
            ));
        }
    } else if to < from {
        changes.push(Change::ScaledIn {
            instance,
            cluster,
            from,
            to,
        });
    } else if to > from {
        changes.push(Change::ScaledOut {
            instance,
            cluster,
            from,
            to,
        });
    }
}

/// Why another count waits for the scale-in `s` of `cluster`.
pub fn in_progress(cluster: &str, s: &ScaleInState) -> String {
    let draining = if s.draining.is_empty() {
        String::new()
    } else {
        format!("draining {}; ", s.draining.join(", "))
    };
    let blocked = s
        .blocked
        .as_deref()
        .map(|b| format!("; blocked: {b}"))
        .unwrap_or_default();
    format!(
        "a scale-in of cluster {cluster} from {} to {} server(s) is in progress ({draining}{} tablet(s) left to move{blocked}): wait until it is done (`local status` shows its progress), or raise serveNodes to cancel it",
        s.from, s.to, s.remaining_tablets
    )
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::local::manifests::{desired, parse};

    const RUNNING: &str = r#"
apiVersion: basalt.dev/v1alpha1
kind: Instance
metadata: {name: quickstart}
spec: {displayName: Quickstart}
---
apiVersion: basalt.dev/v1alpha1
kind: Cluster
metadata: {name: quickstart-c1}
spec: {instanceRef: quickstart, serveNodes: 3}
---
apiVersion: basalt.dev/v1alpha1
kind: Table
metadata: {name: greetings}
spec: {instanceRef: quickstart, columnFamilies: {cf: {}}}
---
apiVersion: basalt.dev/v1alpha1
kind: AppProfile
metadata: {name: batch}
spec: {instanceRef: quickstart, routing: {multiClusterRoutingUseAny: {}}}
"#;

    /// The plan of applying `text` to a runtime running [`RUNNING`].
    fn apply(text: &str) -> Result<Vec<Change>, Vec<String>> {
        apply_during(text, None)
    }

    /// The same while `scale_in` runs in quickstart-c1 (its count is then `scale_in.to`).
    fn apply_during(
        text: &str,
        scale_in: Option<ScaleInState>,
    ) -> Result<Vec<Change>, Vec<String>> {
        let mut running = parse("running.yaml", RUNNING).unwrap();
        if let Some(s) = &scale_in {
            running.clusters[0].spec.serve_nodes = Some(s.to);
        }
        let current = desired(&running, &BTreeMap::new()).unwrap();
        let applied = parse("apply.yaml", text).unwrap();
        let next = desired(&running.merged(&applied), &BTreeMap::new()).unwrap();
        let scale_ins = scale_in
            .map(|s| BTreeMap::from([("quickstart-c1".to_string(), s)]))
            .unwrap_or_default();
        plan(&current, &next, &applied, &scale_ins, &[]).map_err(|Refused(p)| p)
    }

    /// A scale-in 3 → 1 under way in quickstart-c1.
    fn draining() -> ScaleInState {
        ScaleInState {
            from: 3,
            to: 1,
            draining: vec!["quickstart-c1-1".into(), "quickstart-c1-2".into()],
            stopped: vec![],
            remaining_tablets: 4,
            blocked: None,
        }
    }

    fn cluster(spec: &str) -> String {
        format!(
            "apiVersion: basalt.dev/v1alpha1\nkind: Cluster\nmetadata: {{name: quickstart-c1}}\nspec: {spec}\n"
        )
    }

    #[test]
    fn the_same_manifests_again_change_nothing_but_resync_their_tables() {
        let changes = apply(RUNNING).unwrap();
        assert_eq!(
            changes,
            [Change::TableApplied {
                instance: "quickstart".into(),
                table: "greetings".into()
            }]
        );
    }

    #[test]
    fn more_serve_nodes_start_more_servers() {
        let changes = apply(&cluster("{instanceRef: quickstart, serveNodes: 4}")).unwrap();
        assert_eq!(
            changes,
            [Change::ScaledOut {
                instance: "quickstart".into(),
                cluster: "quickstart-c1".into(),
                from: 3,
                to: 4
            }]
        );
        assert_eq!(
            changes[0].to_string(),
            "instance quickstart: cluster quickstart-c1 scaled out from 3 to 4 server(s)"
        );
    }

    #[test]
    fn a_changed_peer_endpoint_is_recorded() {
        let set = apply(&cluster(
            "{instanceRef: quickstart, serveNodes: 3, peerEndpoint: \"gw:8086\"}",
        ))
        .unwrap();
        assert_eq!(
            set,
            [Change::PeerEndpointChanged {
                instance: "quickstart".into(),
                cluster: "quickstart-c1".into(),
                endpoint: Some("gw:8086".into())
            }]
        );
        assert_eq!(
            set[0].to_string(),
            "instance quickstart: cluster quickstart-c1: the other clusters reach it at gw:8086"
        );
    }

    #[test]
    fn fewer_serve_nodes_start_a_scale_in() {
        let changes = apply(&cluster("{instanceRef: quickstart, serveNodes: 2}")).unwrap();
        assert_eq!(
            changes,
            [Change::ScaledIn {
                instance: "quickstart".into(),
                cluster: "quickstart-c1".into(),
                from: 3,
                to: 2
            }]
        );
        assert_eq!(
            changes[0].to_string(),
            "instance quickstart: cluster quickstart-c1 scaling in from 3 to 2 server(s)"
        );
    }

    #[test]
    fn during_a_scale_in_a_raise_cancels_it_and_lowering_further_waits() {
        // Back to 3 (or beyond): cancelled.
        for to in [3, 2, 5] {
            let changes = apply_during(
                &cluster(&format!("{{instanceRef: quickstart, serveNodes: {to}}}")),
                Some(draining()),
            )
            .unwrap();
            assert_eq!(
                changes,
                [Change::ScaleInCancelled {
                    instance: "quickstart".into(),
                    cluster: "quickstart-c1".into(),
                    from: 3,
                    was: 1,
                    to
                }]
            );
        }
        assert_eq!(
            apply_during(
                &cluster("{instanceRef: quickstart, serveNodes: 3}"),
                Some(draining())
            )
            .unwrap()[0]
                .to_string(),
            "instance quickstart: cluster quickstart-c1: scale-in from 3 to 1 server(s) cancelled, serveNodes 3"
        );
        // The same count again: nothing to do, the drain goes on.
        assert!(
            apply_during(
                &cluster("{instanceRef: quickstart, serveNodes: 1}"),
                Some(draining())
            )
            .unwrap()
            .is_empty()
        );
        // Lower still: refused, saying what runs.
        let mut blocked = draining();
        blocked.to = 2;
        blocked.draining.remove(0);
        blocked.blocked = Some("cannot drain st-2: it is not ready".into());
        let problems = apply_during(
            &cluster("{instanceRef: quickstart, serveNodes: 1}"),
            Some(blocked),
        )
        .unwrap_err();
        assert_eq!(
            problems,
            [
                "Cluster default/quickstart-c1: serveNodes 2 → 1 refused: a scale-in of cluster quickstart-c1 from 3 to 2 server(s) is in progress (draining quickstart-c1-2; 4 tablet(s) left to move; blocked: cannot drain st-2: it is not ready): wait until it is done (`local status` shows its progress), or raise serveNodes to cancel it"
            ]
        );
    }

    #[test]
    fn a_cluster_left_out_of_its_applied_instance_is_removed() {
        let c2 = "apiVersion: basalt.dev/v1alpha1\nkind: Cluster\nmetadata: {name: quickstart-c2}\nspec: {instanceRef: quickstart, serveNodes: 1}\n";
        let running = parse("running.yaml", &format!("{RUNNING}---\n{c2}")).unwrap();
        let current = desired(&running, &BTreeMap::new()).unwrap();
        let plan_of =
            |text: &str, scale_ins: &BTreeMap<String, ScaleInState>, removing: &[String]| {
                let applied = parse("apply.yaml", text).unwrap();
                let next = desired(&running.merged(&applied), &BTreeMap::new()).unwrap();
                plan(&current, &next, &applied, scale_ins, removing).map_err(|Refused(p)| p)
            };
        let instance = "apiVersion: basalt.dev/v1alpha1\nkind: Instance\nmetadata: {name: quickstart}\nspec: {displayName: Quickstart}\n";
        let c1 = cluster("{instanceRef: quickstart, serveNodes: 3}");
        let none = BTreeMap::new();
        // The Instance with c1 and without c2: c2 leaves.
        let without_c2 = format!("{instance}---\n{c1}");
        assert_eq!(
            plan_of(&without_c2, &none, &[]).unwrap(),
            [Change::ClusterRemoved {
                instance: "quickstart".into(),
                cluster: "quickstart-c2".into()
            }]
        );
        // The Instance alone, or c1 alone, says nothing of the other clusters.
        assert_eq!(plan_of(instance, &none, &[]).unwrap(), []);
        assert_eq!(plan_of(&c1, &none, &[]).unwrap(), []);
        // Not during c2's scale-in.
        let draining = BTreeMap::from([("quickstart-c2".to_string(), draining())]);
        let problems = plan_of(&without_c2, &draining, &[]).unwrap_err();
        assert!(problems[0].contains("removing it refused"), "{problems:?}");
        // Applied again while it is being removed: refused until it is gone.
        let problems = plan_of(
            &format!("{without_c2}---\n{c2}"),
            &none,
            &["quickstart-c2".into()],
        )
        .unwrap_err();
        assert!(problems[0].contains("being removed"), "{problems:?}");
    }

    #[test]
    fn immutable_fields_are_refused_with_the_operators_message() {
        let problems = apply(&cluster(
            "{instanceRef: quickstart, serveNodes: 3, storageType: HDD}",
        ))
        .unwrap_err();
        assert_eq!(problems.len(), 1);
        assert!(
            problems[0]
                .starts_with("Cluster default/quickstart-c1: spec.storageType: is immutable"),
            "{}",
            problems[0]
        );
    }

    #[test]
    fn a_running_instances_security_does_not_change() {
        for spec in [
            "{displayName: Quickstart, type: Development}",
            "{displayName: Quickstart, security: {identities: [{name: app}]}}",
        ] {
            let problems = apply(&format!(
                "apiVersion: basalt.dev/v1alpha1\nkind: Instance\nmetadata: {{name: quickstart}}\nspec: {spec}\n"
            ))
            .unwrap_err();
            assert_eq!(problems.len(), 1, "{problems:?}");
            assert!(
                problems[0].starts_with("Instance default/quickstart: spec.security"),
                "{}",
                problems[0]
            );
        }
        // Production is TLS whether it says so or not: no change.
        assert!(
            apply(
                "apiVersion: basalt.dev/v1alpha1\nkind: Instance\nmetadata: {name: quickstart}\nspec: {displayName: Quickstart, security: {tls: Enabled}}\n"
            )
            .is_ok()
        );
    }

    #[test]
    fn new_instances_clusters_tables_and_profiles_are_started_and_recorded() {
        let text = r#"
apiVersion: basalt.dev/v1alpha1
kind: Cluster
metadata: {name: quickstart-c2}
spec: {instanceRef: quickstart, serveNodes: 1}
---
apiVersion: basalt.dev/v1alpha1
kind: Instance
metadata: {name: second-one}
spec: {displayName: Second}
---
apiVersion: basalt.dev/v1alpha1
kind: Cluster
metadata: {name: second-c1}
spec: {instanceRef: second-one, serveNodes: 2}
---
apiVersion: basalt.dev/v1alpha1
kind: Table
metadata: {name: events}
spec: {instanceRef: second-one, tableId: events_v1}
---
apiVersion: basalt.dev/v1alpha1
kind: AppProfile
metadata: {name: batch}
spec: {instanceRef: quickstart, routing: {singleClusterRouting: {clusterId: quickstart-c2}}}
"#;
        let got: Vec<String> = apply(text)
            .unwrap()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            got,
            [
                "instance quickstart: cluster quickstart-c2 started with 1 server(s)",
                "instance quickstart: app profile batch recorded",
                "instance second-one: started",
                "instance second-one: cluster second-c1 started with 2 server(s)",
                "instance second-one: table events_v1 applied",
            ]
        );
    }

    #[test]
    fn a_project_change_is_refused() {
        let problems = apply(
            "apiVersion: basalt.dev/v1alpha1\nkind: Instance\nmetadata: {name: quickstart}\nspec: {displayName: Quickstart, projectId: acme}\n",
        )
        .unwrap_err();
        assert!(
            problems[0].starts_with(
                "Instance default/quickstart: spec.projectId cannot change from \"default\" to \"acme\""
            ),
            "{}",
            problems[0]
        );
    }
}
