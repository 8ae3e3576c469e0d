//! The manifests the local runtime runs: the same multi-document YAML `kubectl apply -f` takes
//! (files and directories of `*.yaml`/`*.yml`), read into the operator's CRD types and
//! checked with the operator's own validation, so a bad manifest fails with the message the
//! Kubernetes controllers would put in its status.
//!
//! [`Manifests`] is what was declared, in document order; [`desired`] groups it by Instance
//! into [`LocalInstance`]s (the clusters with their node counts, the tables and app profiles),
//! refusing what the runtime cannot run.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::PathBuf;

use kube::ResourceExt;
use serde::Deserialize;

use crate::build;
use crate::crd::{AppProfile, Backup, BackupSchedule, Cluster, GROUP, Instance, Table};
use crate::lifecycle::backups;
use crate::lifecycle::records::Replica;
use crate::rules::{self, ClusterFacts};

/// The namespace of a manifest that names none (as `kubectl` without `-n`).
pub const DEFAULT_NAMESPACE: &str = "default";

/// The only API version the runtime reads.
pub const API_VERSION: &str = "basalt.dev/v1alpha1";

/// Why manifests cannot be read or run.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// Its cause, the I/O error, follows the message where it is printed (`{:#}`).
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: no *.yaml or *.yml file in the directory")]
    EmptyDirectory { path: PathBuf },
    #[error("{source_name}, document {document}: {message}")]
    Document {
        source_name: String,
        document: usize,
        message: String,
    },
    /// The manifests parse but break rules: every problem, one per line.
    #[error("invalid manifests:\n{}", .0.join("\n"))]
    Invalid(Vec<String>),
}

/// What the manifests declare, in document order, each object's namespace filled in.
#[derive(Debug, Clone, Default)]
pub struct Manifests {
    pub instances: Vec<Instance>,
    pub clusters: Vec<Cluster>,
    pub tables: Vec<Table>,
    pub app_profiles: Vec<AppProfile>,
    pub backups: Vec<Backup>,
    pub backup_schedules: Vec<BackupSchedule>,
}

impl Manifests {
    /// How many objects there are.
    pub fn len(&self) -> usize {
        self.instances.len()
            + self.clusters.len()
            + self.tables.len()
            + self.app_profiles.len()
            + self.backups.len()
            + self.backup_schedules.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `other` applied on top of `self`, as `kubectl apply` would: an object of the same kind,
    /// namespace and name is replaced in place, a new one appended — except the Clusters
    /// [`Manifests::left_out`] finds, which go.
    pub fn merged(&self, other: &Manifests) -> Manifests {
        let gone = self.left_out(other);
        Manifests {
            instances: upsert(&self.instances, &other.instances),
            clusters: upsert(&self.clusters, &other.clusters)
                .into_iter()
                .filter(|c| !gone.contains(&key(c)))
                .collect(),
            tables: upsert(&self.tables, &other.tables),
            app_profiles: upsert(&self.app_profiles, &other.app_profiles),
            backups: upsert(&self.backups, &other.backups),
            backup_schedules: upsert(&self.backup_schedules, &other.backup_schedules),
        }
    }

    /// The Clusters of `self` (namespace, name) that `applied` leaves out: an Instance applied
    /// with at least one of its Clusters comes with all of them, so its Clusters that `applied`
    /// does not name leave it. An Instance applied alone, or any other object, leaves the
    /// Clusters as they are (as `kubectl apply` leaves the objects it is not given).
    pub fn left_out(&self, applied: &Manifests) -> Vec<(String, String)> {
        let listed = |c: &Cluster| {
            applied.instances.iter().any(|i| {
                i.namespace() == c.namespace()
                    && i.name_any() == c.spec.instance_ref
                    && applied.clusters.iter().any(|a| {
                        a.namespace() == c.namespace() && a.spec.instance_ref == c.spec.instance_ref
                    })
            })
        };
        self.clusters
            .iter()
            .filter(|c| listed(c) && !applied.clusters.iter().any(|a| key(a) == key(*c)))
            .map(key)
            .collect()
    }
}

fn key<K: ResourceExt>(obj: &K) -> (String, String) {
    (obj.namespace().unwrap_or_default(), obj.name_any())
}

fn upsert<K: ResourceExt + Clone>(old: &[K], new: &[K]) -> Vec<K> {
    let mut out = old.to_vec();
    for obj in new {
        match out.iter_mut().find(|o| key(*o) == key(obj)) {
            Some(slot) => *slot = obj.clone(),
            None => out.push(obj.clone()),
        }
    }
    out
}

/// The files `-f` names: each file as given, each directory's `*.yaml` and `*.yml` files
/// (not recursive), sorted by name — as `kubectl apply -f DIR` reads them.
pub fn expand_paths(paths: &[PathBuf]) -> Result<Vec<PathBuf>, ManifestError> {
    let mut files = vec![];
    for path in paths {
        let read = |source| ManifestError::Read {
            path: path.clone(),
            source,
        };
        if path.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(read)?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
                .collect();
            if found.is_empty() {
                return Err(ManifestError::EmptyDirectory { path: path.clone() });
            }
            found.sort();
            files.extend(found);
        } else {
            std::fs::metadata(path).map_err(read)?;
            files.push(path.clone());
        }
    }
    Ok(files)
}

/// Reads every file `-f` names: (file name, text) in the order they are applied.
pub fn read_paths(paths: &[PathBuf]) -> Result<Vec<(String, String)>, ManifestError> {
    expand_paths(paths)?
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).map_err(|source| ManifestError::Read {
                path: path.clone(),
                source,
            })?;
            Ok((path.display().to_string(), text))
        })
        .collect()
}

/// Reads and parses every file `-f` names.
pub fn load(paths: &[PathBuf]) -> Result<Manifests, ManifestError> {
    let mut all = Manifests::default();
    for (name, text) in read_paths(paths)? {
        all = all.merged(&parse(&name, &text)?);
    }
    Ok(all)
}

/// Parses multi-document YAML (`---` between documents; empty documents are skipped).
/// `source_name` names the text in errors.
pub fn parse(source_name: &str, text: &str) -> Result<Manifests, ManifestError> {
    let mut out = Manifests::default();
    for (i, document) in serde_norway::Deserializer::from_str(text).enumerate() {
        let error = |message: String| ManifestError::Document {
            source_name: source_name.to_string(),
            document: i + 1,
            message,
        };
        let value = serde_json::Value::deserialize(document).map_err(|e| error(e.to_string()))?;
        if value.is_null() {
            continue;
        }
        let kind = value.get("kind").and_then(|k| k.as_str()).unwrap_or("");
        let api_version = value
            .get("apiVersion")
            .and_then(|k| k.as_str())
            .unwrap_or("");
        if api_version != API_VERSION {
            return Err(error(format!(
                "apiVersion {api_version:?} (kind {kind:?}): the local runtime runs Instance, Cluster, Table, AppProfile, Backup and BackupSchedule of {API_VERSION}"
            )));
        }
        match kind {
            "Instance" => out.instances.push(typed(value, &error)?),
            "Cluster" => out.clusters.push(typed(value, &error)?),
            "Table" => out.tables.push(typed(value, &error)?),
            "AppProfile" => out.app_profiles.push(typed(value, &error)?),
            "Backup" => out.backups.push(typed(value, &error)?),
            "BackupSchedule" => out.backup_schedules.push(typed(value, &error)?),
            other => {
                return Err(error(format!(
                    "kind {other:?} of {GROUP}: the local runtime runs Instance, Cluster, Table, AppProfile, Backup and BackupSchedule"
                )));
            }
        }
    }
    Ok(out)
}

fn typed<K: kube::Resource + serde::de::DeserializeOwned>(
    value: serde_json::Value,
    error: &impl Fn(String) -> ManifestError,
) -> Result<K, ManifestError> {
    let mut obj: K = serde_json::from_value(value).map_err(|e| error(e.to_string()))?;
    if obj.meta().name.as_deref().unwrap_or_default().is_empty() {
        return Err(error("metadata.name is required".into()));
    }
    if obj.meta().namespace.is_none() {
        obj.meta_mut().namespace = Some(DEFAULT_NAMESPACE.into());
    }
    Ok(obj)
}

// ----------------------------------------------------------------------------- desired state

/// One Instance as the runtime runs it.
#[derive(Debug, Clone)]
pub struct LocalInstance {
    pub instance: Instance,
    pub namespace: String,
    pub name: String,
    /// The project clients name (`spec.projectId`, else the namespace).
    pub project: String,
    pub clusters: Vec<LocalCluster>,
    pub tables: Vec<Table>,
    pub app_profiles: Vec<AppProfile>,
    /// Made through the backup API by the runtime's backup task
    /// ([`crate::lifecycle::backups`], as the Kubernetes controllers do).
    pub backups: Vec<Backup>,
    pub backup_schedules: Vec<BackupSchedule>,
}

impl LocalInstance {
    /// `projects/P/instances/I`.
    pub fn resource_name(&self) -> String {
        format!("projects/{}/instances/{}", self.project, self.name)
    }

    pub fn cluster(&self, name: &str) -> Option<&LocalCluster> {
        self.clusters.iter().find(|c| c.name == name)
    }

    /// Its Clusters as replicas of each other: every Cluster of the instance in the manifests
    /// replicates with the others, reached at its `spec.peerEndpoint` if it has one.
    pub fn replicas(&self) -> Vec<Replica> {
        self.clusters
            .iter()
            .map(|c| Replica {
                cluster: c.name.clone(),
                peer_endpoint: c.cluster.spec.peer_endpoint.clone(),
            })
            .collect()
    }
}

/// One Cluster as the runtime runs it.
#[derive(Debug, Clone)]
pub struct LocalCluster {
    pub cluster: Cluster,
    pub name: String,
    /// How many tablet servers run: `serveNodes`, or with autoscaling the current count held
    /// within its bounds (the local runtime does not autoscale).
    pub serve_nodes: i32,
}

impl fmt::Display for LocalInstance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Validates `manifests` and groups them by Instance, in the order the Instances are declared.
/// `current` gives each cluster's node count now (for autoscaling clusters) by
/// (namespace, cluster). Every problem is reported, not only the first.
pub fn desired(
    manifests: &Manifests,
    current: &BTreeMap<(String, String), i32>,
) -> Result<Vec<LocalInstance>, ManifestError> {
    let mut problems = vec![];
    let mut out: Vec<LocalInstance> = vec![];
    let mut instance_names: BTreeMap<String, String> = BTreeMap::new();
    for instance in &manifests.instances {
        let (ns, name) = key(instance);
        let found = rules::validate_instance(instance);
        if !found.is_empty() {
            problems.push(format!("Instance {ns}/{name}: {}", rules::describe(&found)));
        }
        // What an API server checks of spec.backupStore with the CRD's schema and CEL rule.
        if let Some(store) = &instance.spec.backup_store {
            for p in store.problems() {
                problems.push(format!("Instance {ns}/{name}: spec.backupStore: {p}"));
            }
        }
        // local.json, the logs and the endpoints are keyed by instance name alone.
        if let Some(other) = instance_names.insert(name.clone(), ns.clone()) {
            problems.push(format!(
                "Instance {ns}/{name}: instance {name:?} is also declared in namespace {other:?}; the local runtime needs instance names unique across namespaces"
            ));
        }
        out.push(LocalInstance {
            project: build::project_id(instance),
            instance: instance.clone(),
            namespace: ns,
            name,
            clusters: vec![],
            tables: vec![],
            app_profiles: vec![],
            backups: vec![],
            backup_schedules: vec![],
        });
    }
    let missing = |kind: &str, ns: &str, name: &str, instance: &str| {
        format!("{kind} {ns}/{name}: Instance {instance:?} does not exist in namespace {ns:?}")
    };
    let mut cluster_names: BTreeMap<String, String> = BTreeMap::new();
    for cluster in &manifests.clusters {
        let (ns, name) = key(cluster);
        let found = rules::validate_cluster(cluster, &ClusterFacts::default());
        if !found.is_empty() {
            problems.push(format!("Cluster {ns}/{name}: {}", rules::describe(&found)));
        }
        // Server names (and their logs) are `<cluster>-<ordinal>`.
        if let Some(other) = cluster_names.insert(name.clone(), ns.clone()) {
            problems.push(format!(
                "Cluster {ns}/{name}: cluster {name:?} is also declared in namespace {other:?}; the local runtime needs cluster names unique across namespaces"
            ));
        }
        let Some(instance) = out
            .iter_mut()
            .find(|i| i.namespace == ns && i.name == cluster.spec.instance_ref)
        else {
            problems.push(missing("Cluster", &ns, &name, &cluster.spec.instance_ref));
            continue;
        };
        let now = current.get(&(ns.clone(), name.clone())).copied();
        instance.clusters.push(LocalCluster {
            serve_nodes: build::desired_serve_nodes(cluster, now, None),
            cluster: cluster.clone(),
            name,
        });
    }
    for table in &manifests.tables {
        let (ns, name) = key(table);
        let found = rules::validate_table(table);
        if !found.is_empty() {
            problems.push(format!("Table {ns}/{name}: {}", rules::describe(&found)));
        }
        match out
            .iter_mut()
            .find(|i| i.namespace == ns && i.name == table.spec.instance_ref)
        {
            Some(instance) => instance.tables.push(table.clone()),
            None => problems.push(missing("Table", &ns, &name, &table.spec.instance_ref)),
        }
    }
    for profile in &manifests.app_profiles {
        let (ns, name) = key(profile);
        let Some(instance) = out
            .iter_mut()
            .find(|i| i.namespace == ns && i.name == profile.spec.instance_ref)
        else {
            problems.push(missing(
                "AppProfile",
                &ns,
                &name,
                &profile.spec.instance_ref,
            ));
            continue;
        };
        let clusters: BTreeSet<String> = instance.clusters.iter().map(|c| c.name.clone()).collect();
        let found = rules::validate_app_profile(profile, &clusters);
        if !found.is_empty() {
            problems.push(format!(
                "AppProfile {ns}/{name}: {}",
                rules::describe(&found)
            ));
        }
        instance.app_profiles.push(profile.clone());
    }
    let cluster_ids =
        |i: &LocalInstance| -> Vec<String> { i.clusters.iter().map(|c| c.name.clone()).collect() };
    for backup in &manifests.backups {
        let (ns, name) = key(backup);
        let Some(instance) = out
            .iter_mut()
            .find(|i| i.namespace == ns && i.name == backup.spec.instance_ref)
        else {
            problems.push(missing("Backup", &ns, &name, &backup.spec.instance_ref));
            continue;
        };
        if let Err(why) = backups::backup_target(backup, &instance.instance, &cluster_ids(instance))
        {
            problems.push(format!("Backup {ns}/{name}: {why}"));
        }
        instance.backups.push(backup.clone());
    }
    for schedule in &manifests.backup_schedules {
        let (ns, name) = key(schedule);
        let Some(instance) = out
            .iter_mut()
            .find(|i| i.namespace == ns && i.name == schedule.spec.instance_ref)
        else {
            problems.push(missing(
                "BackupSchedule",
                &ns,
                &name,
                &schedule.spec.instance_ref,
            ));
            continue;
        };
        if let Err(why) =
            backups::schedule_target(schedule, &instance.instance, &cluster_ids(instance))
        {
            problems.push(format!("BackupSchedule {ns}/{name}: {why}"));
        }
        instance.backup_schedules.push(schedule.clone());
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(ManifestError::Invalid(problems))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const EXAMPLE: &str = r#"
# a comment before the first document
apiVersion: basalt.dev/v1alpha1
kind: Instance
metadata: {name: quickstart}
spec: {displayName: Quickstart, type: Development}
---
apiVersion: basalt.dev/v1alpha1
kind: Cluster
metadata: {name: quickstart-c1}
spec: {instanceRef: quickstart, serveNodes: 2}
---
---
apiVersion: basalt.dev/v1alpha1
kind: Table
metadata: {name: greetings}
spec:
  instanceRef: quickstart
  columnFamilies: {cf: {gcRule: {maxNumVersions: 1}}}
---
apiVersion: basalt.dev/v1alpha1
kind: Instance
metadata: {name: orders-prod, namespace: shop}
spec: {displayName: Orders, projectId: acme}
---
apiVersion: basalt.dev/v1alpha1
kind: Cluster
metadata: {name: orders-c2, namespace: shop}
spec:
  instanceRef: orders-prod
  autoscaling: {minServeNodes: 2, maxServeNodes: 4, cpuUtilizationPercent: 50}
---
apiVersion: basalt.dev/v1alpha1
kind: AppProfile
metadata: {name: batch, namespace: shop}
spec:
  instanceRef: orders-prod
  routing: {singleClusterRouting: {clusterId: orders-c2}}
"#;

    fn instances(text: &str) -> Vec<LocalInstance> {
        desired(&parse("test.yaml", text).unwrap(), &BTreeMap::new()).unwrap()
    }

    fn problems(text: &str) -> Vec<String> {
        match desired(&parse("test.yaml", text).unwrap(), &BTreeMap::new()) {
            Err(ManifestError::Invalid(p)) => p,
            other => panic!("expected problems, got {other:?}"),
        }
    }

    #[test]
    fn documents_are_grouped_by_instance_in_declaration_order() {
        let m = parse("test.yaml", EXAMPLE).unwrap();
        assert_eq!(m.len(), 6);
        let got = instances(EXAMPLE);
        let names: Vec<String> = got.iter().map(ToString::to_string).collect();
        assert_eq!(names, ["default/quickstart", "shop/orders-prod"]);
        let quickstart = &got[0];
        assert_eq!(
            quickstart.resource_name(),
            "projects/default/instances/quickstart"
        );
        assert_eq!(quickstart.clusters[0].name, "quickstart-c1");
        assert_eq!(quickstart.clusters[0].serve_nodes, 2);
        assert_eq!(rules::table_id(&quickstart.tables[0]), "greetings");
        let orders = &got[1];
        assert_eq!(
            orders.resource_name(),
            "projects/acme/instances/orders-prod"
        );
        // Autoscaling starts at its minimum and keeps the current count within bounds.
        assert_eq!(orders.clusters[0].serve_nodes, 2);
        let current = BTreeMap::from([(("shop".to_string(), "orders-c2".to_string()), 9)]);
        let again = desired(&m, &current).unwrap();
        assert_eq!(again[1].clusters[0].serve_nodes, 4);
        assert_eq!(orders.app_profiles[0].app_profile_id(), "batch");
    }

    #[test]
    fn the_examples_directory_parses_and_validates() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
        let m = load(&[dir]).unwrap();
        let got = desired(&m, &BTreeMap::new()).unwrap();
        let names: Vec<&str> = got.iter().map(|i| i.name.as_str()).collect();
        // Files are read in name order: instance.yaml comes before quickstart.yaml.
        assert_eq!(names, ["orders-prod", "quickstart"]);
        assert_eq!(got[0].clusters.len(), 2);
        assert_eq!(got[0].app_profiles.len(), 2);
    }

    #[test]
    fn unknown_kinds_and_versions_are_refused_with_their_place() {
        let err = parse(
            "x.yaml",
            "apiVersion: basalt.dev/v1alpha1\nkind: Instance\nmetadata: {name: abcdef}\nspec: {displayName: abcd}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("x.yaml, document 2: apiVersion \"v1\""),
            "{err}"
        );
        let err = parse("x.yaml", "apiVersion: basalt.dev/v1alpha1\nkind: Restore\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("kind \"Restore\""), "{err}");
        let err = parse(
            "x.yaml",
            "apiVersion: basalt.dev/v1alpha1\nkind: Cluster\nmetadata: {name: abcdef}\nspec: {serveNodes: 1}\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("instanceRef"), "{err}");
    }

    #[test]
    fn invalid_manifests_fail_with_the_operators_messages() {
        let p = problems(
            "apiVersion: basalt.dev/v1alpha1\nkind: Instance\nmetadata: {name: Bad}\nspec: {displayName: Quickstart}\n---\napiVersion: basalt.dev/v1alpha1\nkind: Cluster\nmetadata: {name: lonely-c1}\nspec: {instanceRef: nowhere, serveNodes: 0}\n---\napiVersion: basalt.dev/v1alpha1\nkind: Table\nmetadata: {name: t}\nspec: {instanceRef: Bad, initialSplits: [a, a]}\n",
        );
        assert_eq!(p.len(), 4, "{p:#?}");
        assert!(
            p[0].starts_with(
                "Instance default/Bad: metadata.name: \"Bad\" is not a valid instance id"
            ),
            "{}",
            p[0]
        );
        assert_eq!(
            p[1],
            "Cluster default/lonely-c1: spec.serveNodes: must be between 1 and 1000, is 0"
        );
        assert_eq!(
            p[2],
            "Cluster default/lonely-c1: Instance \"nowhere\" does not exist in namespace \"default\""
        );
        assert_eq!(
            p[3],
            "Table default/t: spec.initialSplits[1]: duplicate split key \"a\""
        );
    }

    #[test]
    fn app_profiles_must_name_clusters_of_their_instance() {
        let text = EXAMPLE.replace("clusterId: orders-c2", "clusterId: orders-c9");
        let p = problems(&text);
        assert_eq!(p.len(), 1);
        assert!(
            p[0].starts_with("AppProfile shop/batch: spec.routing.singleClusterRouting.clusterId: instance \"orders-prod\" has no cluster \"orders-c9\""),
            "{}",
            p[0]
        );
    }

    #[test]
    fn names_the_runtime_keys_by_must_be_unique_across_namespaces() {
        let text = format!(
            "{EXAMPLE}---\napiVersion: basalt.dev/v1alpha1\nkind: Instance\nmetadata: {{name: quickstart, namespace: shop}}\nspec: {{displayName: Again}}\n"
        );
        let p = problems(&text);
        assert_eq!(p.len(), 1, "{p:#?}");
        assert!(p[0].contains("unique across namespaces"), "{}", p[0]);
    }

    #[test]
    fn apply_replaces_same_objects_and_appends_new_ones() {
        let base = parse("a.yaml", EXAMPLE).unwrap();
        let change = parse(
            "b.yaml",
            "apiVersion: basalt.dev/v1alpha1\nkind: Cluster\nmetadata: {name: quickstart-c1}\nspec: {instanceRef: quickstart, serveNodes: 3}\n---\napiVersion: basalt.dev/v1alpha1\nkind: Table\nmetadata: {name: more}\nspec: {instanceRef: quickstart}\n",
        )
        .unwrap();
        let merged = base.merged(&change);
        assert_eq!(merged.clusters.len(), 2);
        assert_eq!(merged.clusters[0].spec.serve_nodes, Some(3));
        let tables: Vec<String> = merged.tables.iter().map(|t| t.name_any()).collect();
        assert_eq!(tables, ["greetings", "more"]);
    }
}
