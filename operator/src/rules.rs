//! Validation of specs, pure: the same rules the CRDs' OpenAPI constraints and CEL express,
//! checked again by the reconcilers (API servers before 1.25 ignore CEL, and some rules need
//! state the API server does not have, such as the clusters of an instance).

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use crate::crd::{
    AppProfile, Cluster, GcRule, GcRuleLeaf, GcRuleNested, Instance, StorageType, Table,
};

/// One thing wrong with a spec: where, and what was expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub field: String,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Joins problems into one condition message.
pub fn describe(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(Problem::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

fn problem(field: impl Into<String>, message: impl Into<String>) -> Problem {
    Problem {
        field: field.into(),
        message: message.into(),
    }
}

/// `[a-z][-a-z0-9]*[a-z0-9]` with a length in `min..=max`.
fn is_resource_id(id: &str, min: usize, max: usize) -> bool {
    let b = id.as_bytes();
    (min..=max).contains(&b.len())
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[b.len() - 1] != b'-'
}

/// Table and app profile ids: `[_a-zA-Z0-9][-_.a-zA-Z0-9]*`, at most 50 characters.
pub fn is_table_id(id: &str) -> bool {
    let b = id.as_bytes();
    (1..=50).contains(&b.len())
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// Column family names: `[-_.a-zA-Z0-9]+`, at most 64 characters.
pub fn is_family_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// Parses `30s`, `90m`, `12h`, `7d`, `1h30m`, `500ms`.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let mut total: u64 = 0;
    let mut rest = s;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let n: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (unit_ms, len) = if rest.starts_with("ms") {
            (1, 2)
        } else {
            match rest.as_bytes().first()? {
                b's' => (1_000, 1),
                b'm' => (60_000, 1),
                b'h' => (3_600_000, 1),
                b'd' => (86_400_000, 1),
                _ => return None,
            }
        };
        total = total.checked_add(n.checked_mul(unit_ms)?)?;
        rest = &rest[len..];
    }
    Some(Duration::from_millis(total))
}

/// A `backupStore.logBackup.retention`: a duration in whole seconds (`s`, `m`, `h`, `d`; at
/// most 9 digits a unit, 64 characters in all), longer than 0 — what the CRD's pattern and
/// CEL rule say.
pub fn log_backup_retention(text: &str) -> Result<Duration, String> {
    let whole_seconds = text.len() <= 64
        && !text.contains("ms")
        && text
            .split(|c: char| c.is_ascii_alphabetic())
            .all(|digits| digits.len() <= 9);
    let d = parse_duration(text)
        .filter(|_| whole_seconds)
        .ok_or_else(|| {
            format!(
                "{text:?} is not a duration in whole seconds such as 36h or 7d (units s, m, h, d)"
            )
        })?;
    if d.is_zero() {
        return Err(format!(
            "{text:?} is no time: the shipped log would never be kept"
        ));
    }
    Ok(d)
}

pub fn validate_instance(instance: &Instance) -> Vec<Problem> {
    let mut out = vec![];
    let name = instance.metadata.name.as_deref().unwrap_or_default();
    if !is_resource_id(name, 6, 33) {
        out.push(problem(
            "metadata.name",
            format!(
                "{name:?} is not a valid instance id: 6 to 33 characters of [a-z0-9-], starting with a letter and not ending with '-'"
            ),
        ));
    }
    let display = instance.spec.display_name.chars().count();
    if !(4..=30).contains(&display) {
        out.push(problem(
            "spec.displayName",
            format!("must be 4 to 30 characters, has {display}"),
        ));
    }
    if instance.spec.labels.len() > 64 {
        out.push(problem("spec.labels", "at most 64 labels"));
    }
    for (k, v) in &instance.spec.labels {
        let ok = |s: &str| {
            s.len() <= 63
                && s.bytes()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_' || c == b'-')
        };
        if k.is_empty() || !k.as_bytes()[0].is_ascii_lowercase() || !ok(k) || !ok(v) {
            out.push(problem(
                format!("spec.labels[{k}]"),
                "label keys and values are up to 63 characters of [a-z0-9_-], keys start with a letter",
            ));
        }
    }
    if let Some(store) = &instance.spec.metadata_store {
        if store.endpoints.is_empty() {
            out.push(problem(
                "spec.metadataStore.endpoints",
                "name at least one etcd client URL (http(s)://host:port), or leave metadataStore unset for the operator's own etcd",
            ));
        }
        for (i, e) in store.endpoints.iter().enumerate() {
            if !is_etcd_endpoint(e) {
                out.push(problem(
                    format!("spec.metadataStore.endpoints[{i}]"),
                    format!("{e:?} is not an etcd client URL: expected http(s)://host:port"),
                ));
            }
        }
    }
    if let Some(security) = &instance.spec.security {
        for (i, member) in security.admin_principals.iter().enumerate() {
            if !basalt_model::iam::valid_member(member) || member.starts_with("all") {
                out.push(problem(
                    format!("spec.security.adminPrincipals[{i}]"),
                    format!(
                        "{member:?} is not a principal: user:NAME, serviceAccount:NAME, group:NAME or domain:NAME"
                    ),
                ));
            }
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, identity) in security.identities.iter().enumerate() {
            let name = identity.name.as_str();
            let field = format!("spec.security.identities[{i}].name");
            if !is_resource_id(name, 1, 40) {
                out.push(problem(
                    field,
                    format!("{name:?} is not a DNS label of up to 40 characters ([a-z0-9-], starting with a letter)"),
                ));
            } else if name == crate::lifecycle::certificates::ADMIN_IDENTITY {
                out.push(problem(
                    field,
                    "the identity admin is always issued; name yours otherwise",
                ));
            } else if !seen.insert(name) {
                out.push(problem(field, format!("{name:?} is named twice")));
            }
        }
    }
    if let Some(log) = instance
        .spec
        .backup_store
        .as_ref()
        .and_then(|s| s.log_backup.as_ref())
    {
        if let Some(n) = log.interval_seconds
            && !(1..=600).contains(&n)
        {
            out.push(problem(
                "spec.backupStore.logBackup.intervalSeconds",
                format!("must be 1 to 600 seconds, is {n}"),
            ));
        }
        if let Err(why) = log_backup_retention(log.retention()) {
            out.push(problem("spec.backupStore.logBackup.retention", why));
        }
    }
    // The store the tablet servers already use cannot change under them: their tablet map and
    // the catalog live there (and an empty etcd would look like an empty instance).
    if let Some(in_use) = instance
        .status
        .as_ref()
        .and_then(|s| s.metadata_store.as_ref())
        .filter(|s| !s.endpoints.is_empty())
    {
        let spec = instance.spec.metadata_store.as_ref();
        let changed = match spec {
            None => in_use.external,
            Some(store) => !in_use.external || store.endpoints != in_use.endpoints,
        };
        if changed {
            out.push(problem(
                "spec.metadataStore",
                format!(
                    "is immutable: the instance keeps its metadata in {} ({}); set it back",
                    if in_use.external {
                        "an existing etcd"
                    } else {
                        "the operator's etcd"
                    },
                    in_use.endpoints.join(", ")
                ),
            ));
        }
    }
    out
}

/// `http(s)://host:port`: an etcd client URL (host names, IPv4 addresses; no path).
pub fn is_etcd_endpoint(url: &str) -> bool {
    basalt_transport::split_url(url).is_some_and(|(_, rest)| is_host_port(rest))
}

/// `host:port`: a host name or IPv4 address, a port from 1 to 65535 (no scheme, no path).
pub fn is_host_port(address: &str) -> bool {
    let Some((host, port)) = address.rsplit_once(':') else {
        return false;
    };
    !host.is_empty()
        && host
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'.' || c == b'-')
        && (1..=5).contains(&port.len())
        && port.bytes().all(|c| c.is_ascii_digit())
        && port.parse::<u32>().is_ok_and(|p| (1..=65535).contains(&p))
}

/// What the cluster's existing objects say about fields that cannot change.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterFacts {
    pub storage_type: Option<StorageType>,
    pub location: Option<Option<String>>,
    pub instance: Option<String>,
    /// The volume size and class of the StatefulSet's claim template (a StatefulSet's
    /// volumeClaimTemplates cannot change).
    pub storage_size: Option<String>,
    pub storage_class: Option<String>,
}

pub fn validate_cluster(cluster: &Cluster, existing: &ClusterFacts) -> Vec<Problem> {
    let mut out = vec![];
    let spec = &cluster.spec;
    let name = cluster.metadata.name.as_deref().unwrap_or_default();
    if !is_resource_id(name, 6, 30) {
        out.push(problem(
            "metadata.name",
            format!(
                "{name:?} is not a valid cluster id: 6 to 30 characters of [a-z0-9-], starting with a letter and not ending with '-'"
            ),
        ));
    }
    match (&spec.serve_nodes, &spec.autoscaling) {
        (Some(_), Some(_)) | (None, None) => out.push(problem(
            "spec",
            "set exactly one of serveNodes and autoscaling",
        )),
        (Some(n), None) if !(1..=1000).contains(n) => out.push(problem(
            "spec.serveNodes",
            format!("must be between 1 and 1000, is {n}"),
        )),
        _ => {}
    }
    if let Some(a) = &spec.autoscaling {
        if a.min_serve_nodes < 1 || a.max_serve_nodes > 1000 {
            out.push(problem(
                "spec.autoscaling",
                "minServeNodes and maxServeNodes must be between 1 and 1000",
            ));
        }
        if a.min_serve_nodes > a.max_serve_nodes {
            out.push(problem(
                "spec.autoscaling",
                format!(
                    "minServeNodes ({}) must not exceed maxServeNodes ({})",
                    a.min_serve_nodes, a.max_serve_nodes
                ),
            ));
        }
        if a.min_serve_nodes >= 1 && a.max_serve_nodes > a.min_serve_nodes.saturating_mul(10) {
            out.push(problem(
                "spec.autoscaling",
                format!(
                    "maxServeNodes ({}) must be at most 10 times minServeNodes ({}), as on Bigtable",
                    a.max_serve_nodes, a.min_serve_nodes
                ),
            ));
        }
        if !(10..=80).contains(&a.cpu_utilization_percent) {
            out.push(problem(
                "spec.autoscaling.cpuUtilizationPercent",
                format!(
                    "must be between 10 and 80, is {}",
                    a.cpu_utilization_percent
                ),
            ));
        }
    }
    if let Some(size) = &spec.storage_size
        && crate::quantity::parse_quantity_bytes(&size.0).is_none()
    {
        out.push(problem(
            "spec.storageSize",
            format!("{:?} is not a storage quantity such as 100Gi", size.0),
        ));
    }
    if let Some(endpoint) = &spec.peer_endpoint
        && !is_host_port(endpoint)
    {
        out.push(problem(
            "spec.peerEndpoint",
            format!(
                "{endpoint:?} is not host:port (a host name or IPv4 address and a port, e.g. orders-c1.example.com:443)"
            ),
        ));
    }
    if let Some(old) = existing.storage_type
        && old != spec.storage_type
    {
        out.push(problem(
            "spec.storageType",
            format!(
                "is immutable: the cluster runs on {old:?}; create a new cluster to change the storage type"
            ),
        ));
    }
    if let Some(old) = &existing.location
        && *old != spec.location
    {
        out.push(problem(
            "spec.location",
            format!("is immutable: the cluster runs in {old:?}"),
        ));
    }
    if let Some(old) = &existing.storage_size {
        let wanted = spec
            .storage_size
            .as_ref()
            .map(|q| q.0.clone())
            .unwrap_or_else(|| crate::crd::DEFAULT_STORAGE_SIZE.into());
        if crate::quantity::parse_quantity_bytes(old)
            != crate::quantity::parse_quantity_bytes(&wanted)
        {
            out.push(problem(
                "spec.storageSize",
                format!(
                    "cannot change from {old} to {wanted}: volumes keep the size they were created with (resizing is not supported yet)"
                ),
            ));
        }
    }
    if let (Some(old), Some(wanted)) = (&existing.storage_class, &spec.storage_class_name)
        && old != wanted
    {
        out.push(problem(
            "spec.storageClassName",
            format!("cannot change from {old:?} to {wanted:?}: volumes keep their storage class"),
        ));
    }
    if let Some(old) = &existing.instance
        && *old != spec.instance_ref
    {
        out.push(problem(
            "spec.instanceRef",
            format!("is immutable: the cluster belongs to instance {old:?}"),
        ));
    }
    out
}

/// The table id a Table resource declares (spec.tableId, else its name).
pub fn table_id(table: &Table) -> String {
    table
        .spec
        .table_id
        .clone()
        .unwrap_or_else(|| table.metadata.name.clone().unwrap_or_default())
}

pub fn validate_table(table: &Table) -> Vec<Problem> {
    let mut out = vec![];
    let id = table_id(table);
    if !is_table_id(&id) {
        out.push(problem(
            "spec.tableId",
            format!("{id:?} is not a valid table id: 1 to 50 characters of [-_.a-zA-Z0-9], not starting with '-' or '.'"),
        ));
    }
    for (name, family) in &table.spec.column_families {
        let field = format!("spec.columnFamilies[{name}]");
        if !is_family_name(name) {
            out.push(problem(
                &field,
                "column family names are 1 to 64 characters of [-_.a-zA-Z0-9]",
            ));
        }
        if let Some(rule) = &family.gc_rule {
            validate_gc_rule(&GcNode::from(rule), &format!("{field}.gcRule"), &mut out);
        }
    }
    let mut seen = BTreeSet::new();
    for (i, split) in table.spec.initial_splits.iter().enumerate() {
        if split.is_empty() {
            out.push(problem(
                format!("spec.initialSplits[{i}]"),
                "split keys must not be empty",
            ));
        }
        if !seen.insert(split) {
            out.push(problem(
                format!("spec.initialSplits[{i}]"),
                format!("duplicate split key {split:?}"),
            ));
        }
    }
    out
}

/// A GC rule at any nesting level, for validation and conversion.
#[derive(Debug, Clone, PartialEq)]
pub enum GcNode {
    MaxAge(Option<String>),
    MaxNumVersions(i32),
    Union(Vec<GcNode>),
    Intersection(Vec<GcNode>),
    /// No kind set, or more than one.
    Ambiguous(usize),
}

fn node(
    max_age: &Option<String>,
    max_num_versions: Option<i32>,
    union: Option<Vec<GcNode>>,
    intersection: Option<Vec<GcNode>>,
) -> GcNode {
    let kinds = usize::from(max_age.is_some())
        + usize::from(max_num_versions.is_some())
        + usize::from(union.is_some())
        + usize::from(intersection.is_some());
    if kinds != 1 {
        return GcNode::Ambiguous(kinds);
    }
    if let Some(a) = max_age {
        GcNode::MaxAge(Some(a.clone()))
    } else if let Some(n) = max_num_versions {
        GcNode::MaxNumVersions(n)
    } else if let Some(u) = union {
        GcNode::Union(u)
    } else {
        GcNode::Intersection(intersection.unwrap_or_default())
    }
}

impl From<&GcRuleLeaf> for GcNode {
    fn from(r: &GcRuleLeaf) -> Self {
        node(&r.max_age, r.max_num_versions, None, None)
    }
}

impl From<&GcRuleNested> for GcNode {
    fn from(r: &GcRuleNested) -> Self {
        node(
            &r.max_age,
            r.max_num_versions,
            r.union
                .as_ref()
                .map(|v| v.iter().map(GcNode::from).collect()),
            r.intersection
                .as_ref()
                .map(|v| v.iter().map(GcNode::from).collect()),
        )
    }
}

impl From<&GcRule> for GcNode {
    fn from(r: &GcRule) -> Self {
        node(
            &r.max_age,
            r.max_num_versions,
            r.union
                .as_ref()
                .map(|v| v.iter().map(GcNode::from).collect()),
            r.intersection
                .as_ref()
                .map(|v| v.iter().map(GcNode::from).collect()),
        )
    }
}

fn validate_gc_rule(rule: &GcNode, field: &str, out: &mut Vec<Problem>) {
    match rule {
        GcNode::Ambiguous(n) => out.push(problem(
            field,
            format!(
                "a GC rule sets exactly one of maxAge, maxNumVersions, union, intersection ({n} set)"
            ),
        )),
        GcNode::MaxAge(age) => {
            let age = age.as_deref().unwrap_or_default();
            match parse_duration(age) {
                None => out.push(problem(
                    format!("{field}.maxAge"),
                    format!("{age:?} is not a duration such as 30s, 12h, 7d or 1h30m"),
                )),
                Some(d) if d < Duration::from_millis(1) => out.push(problem(
                    format!("{field}.maxAge"),
                    "must be at least 1ms",
                )),
                Some(_) => {}
            }
        }
        GcNode::MaxNumVersions(n) if *n < 1 => out.push(problem(
            format!("{field}.maxNumVersions"),
            format!("must be at least 1, is {n}"),
        )),
        GcNode::MaxNumVersions(_) => {}
        GcNode::Union(rules) | GcNode::Intersection(rules) => {
            let kind = if matches!(rule, GcNode::Union(_)) {
                "union"
            } else {
                "intersection"
            };
            if rules.is_empty() {
                out.push(problem(
                    format!("{field}.{kind}"),
                    "must hold at least one rule",
                ));
            }
            for (i, r) in rules.iter().enumerate() {
                validate_gc_rule(r, &format!("{field}.{kind}[{i}]"), out);
            }
        }
    }
}

/// `clusters`: the ids of the instance's clusters.
pub fn validate_app_profile(profile: &AppProfile, clusters: &BTreeSet<String>) -> Vec<Problem> {
    let mut out = vec![];
    let id = profile.app_profile_id();
    if !is_table_id(&id) {
        out.push(problem(
            "spec.appProfileId",
            format!("{id:?} is not a valid app profile id: 1 to 50 characters of [-_.a-zA-Z0-9], not starting with '-' or '.'"),
        ));
    }
    let routing = &profile.spec.routing;
    match (
        &routing.single_cluster_routing,
        &routing.multi_cluster_routing_use_any,
    ) {
        (Some(single), None) => {
            if !clusters.contains(&single.cluster_id) {
                out.push(problem(
                    "spec.routing.singleClusterRouting.clusterId",
                    format!(
                        "instance {:?} has no cluster {:?} (clusters: {})",
                        profile.spec.instance_ref,
                        single.cluster_id,
                        list(clusters)
                    ),
                ));
            }
        }
        (None, Some(multi)) => {
            let mut seen = BTreeSet::new();
            for (i, c) in multi.cluster_ids.iter().enumerate() {
                if !seen.insert(c) {
                    out.push(problem(
                        format!("spec.routing.multiClusterRoutingUseAny.clusterIds[{i}]"),
                        format!("cluster {c:?} is listed twice"),
                    ));
                } else if !clusters.contains(c) {
                    out.push(problem(
                        format!("spec.routing.multiClusterRoutingUseAny.clusterIds[{i}]"),
                        format!(
                            "instance {:?} has no cluster {c:?} (clusters: {})",
                            profile.spec.instance_ref,
                            list(clusters)
                        ),
                    ));
                }
            }
        }
        _ => out.push(problem(
            "spec.routing",
            "set exactly one of singleClusterRouting and multiClusterRoutingUseAny",
        )),
    }
    out
}

fn list(clusters: &BTreeSet<String>) -> String {
    if clusters.is_empty() {
        "none".into()
    } else {
        clusters.iter().cloned().collect::<Vec<_>>().join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from_yaml<T: serde::de::DeserializeOwned>(yaml: &str) -> T {
        serde_norway::from_str(yaml).unwrap()
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s"), Some(Duration::from_secs(30)));
        assert_eq!(parse_duration("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_duration("7d"), Some(Duration::from_secs(7 * 86400)));
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("3 days"), None);
        assert_eq!(parse_duration("h"), None);
        assert_eq!(parse_duration(""), None);
        assert_eq!(parse_duration("10"), None);
        assert_eq!(parse_duration("99999999999999999999d"), None);
    }

    #[test]
    fn ids() {
        assert!(is_resource_id("orders-prod", 6, 33));
        assert!(!is_resource_id("short", 6, 33));
        assert!(!is_resource_id("Orders-prod", 6, 33));
        assert!(!is_resource_id("orders-", 6, 33));
        assert!(!is_resource_id("1orders", 6, 33));
        assert!(is_table_id("_my.Table-1"));
        assert!(!is_table_id("-t"));
        assert!(!is_table_id(&"t".repeat(51)));
        assert!(is_family_name("cf-1.x_y"));
        assert!(!is_family_name("cf:1"));
    }

    #[test]
    fn cluster_needs_exactly_one_sizing_and_keeps_its_storage_type() {
        let both: Cluster = from_yaml(
            "metadata: {name: orders-c1}\nspec:\n  instanceRef: orders\n  serveNodes: 3\n  autoscaling: {minServeNodes: 1, maxServeNodes: 3, cpuUtilizationPercent: 50}\n",
        );
        let p = validate_cluster(&both, &ClusterFacts::default());
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(
            p[0].message,
            "set exactly one of serveNodes and autoscaling"
        );

        let hdd: Cluster = from_yaml(
            "metadata: {name: orders-c1}\nspec: {instanceRef: orders, serveNodes: 3, storageType: HDD}\n",
        );
        assert!(validate_cluster(&hdd, &ClusterFacts::default()).is_empty());
        let facts = ClusterFacts {
            storage_type: Some(StorageType::Ssd),
            ..ClusterFacts::default()
        };
        let p = validate_cluster(&hdd, &facts);
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].field, "spec.storageType");
        assert!(p[0].message.starts_with("is immutable"), "{}", p[0]);

        let bad: Cluster = from_yaml(
            "metadata: {name: c1}\nspec:\n  instanceRef: orders\n  autoscaling: {minServeNodes: 5, maxServeNodes: 3, cpuUtilizationPercent: 90}\n  storageSize: lots\n  peerEndpoint: http://gw:443\n",
        );
        let fields: Vec<String> = validate_cluster(&bad, &ClusterFacts::default())
            .into_iter()
            .map(|p| p.field)
            .collect();
        assert_eq!(
            fields,
            [
                "metadata.name",
                "spec.autoscaling",
                "spec.autoscaling.cpuUtilizationPercent",
                "spec.storageSize",
                "spec.peerEndpoint"
            ]
        );

        // Bigtable's bound: max at most ten times min.
        let wide: Cluster = from_yaml(
            "metadata: {name: orders-c1}\nspec: {instanceRef: orders, autoscaling: {minServeNodes: 2, maxServeNodes: 21, cpuUtilizationPercent: 50}}\n",
        );
        let p = validate_cluster(&wide, &ClusterFacts::default());
        assert_eq!(p.len(), 1);
        assert_eq!(
            p[0].message,
            "maxServeNodes (21) must be at most 10 times minServeNodes (2), as on Bigtable"
        );
        let ten: Cluster = from_yaml(
            "metadata: {name: orders-c1}\nspec: {instanceRef: orders, autoscaling: {minServeNodes: 2, maxServeNodes: 20, cpuUtilizationPercent: 50}}\n",
        );
        assert!(validate_cluster(&ten, &ClusterFacts::default()).is_empty());
    }

    #[test]
    fn a_peer_endpoint_is_host_and_port() {
        for good in ["orders-c1.example.com:443", "10.0.0.7:8086", "gw:1"] {
            assert!(is_host_port(good), "{good}");
            let cluster: Cluster = from_yaml(&format!(
                "metadata: {{name: orders-c1}}\nspec: {{instanceRef: orders, serveNodes: 1, peerEndpoint: \"{good}\"}}\n"
            ));
            assert!(validate_cluster(&cluster, &ClusterFacts::default()).is_empty());
        }
        for bad in [
            "gw",
            "gw:",
            ":443",
            "gw:0",
            "gw:65536",
            "http://gw:443",
            "gw:443/x",
            "g w:1",
        ] {
            assert!(!is_host_port(bad), "{bad}");
        }
    }

    #[test]
    fn table_gc_rules_are_checked_at_every_level() {
        let t: Table = from_yaml(
            r#"
metadata: {name: orders}
spec:
  instanceRef: orders
  columnFamilies:
    ok:
      gcRule: {union: [{maxNumVersions: 3}, {intersection: [{maxAge: 7d}, {maxNumVersions: 1}]}]}
    "bad:name": {}
    both:
      gcRule: {maxAge: 1d, maxNumVersions: 2}
    deep:
      gcRule: {intersection: [{union: [{maxAge: "3 days"}]}, {maxNumVersions: 0}]}
  initialSplits: [a, a]
"#,
        );
        let p = validate_table(&t);
        let got: Vec<String> = p.iter().map(Problem::to_string).collect();
        assert_eq!(
            got,
            [
                "spec.columnFamilies[bad:name]: column family names are 1 to 64 characters of [-_.a-zA-Z0-9]",
                "spec.columnFamilies[both].gcRule: a GC rule sets exactly one of maxAge, maxNumVersions, union, intersection (2 set)",
                "spec.columnFamilies[deep].gcRule.intersection[0].union[0].maxAge: \"3 days\" is not a duration such as 30s, 12h, 7d or 1h30m",
                "spec.columnFamilies[deep].gcRule.intersection[1].maxNumVersions: must be at least 1, is 0",
                "spec.initialSplits[1]: duplicate split key \"a\"",
            ]
        );
        assert_eq!(table_id(&t), "orders");
    }

    #[test]
    fn app_profiles_must_name_clusters_of_their_instance() {
        let clusters: BTreeSet<String> = ["c1-east".to_string()].into();
        let single: AppProfile = from_yaml(
            "metadata: {name: batch}\nspec: {instanceRef: orders, routing: {singleClusterRouting: {clusterId: c9-west}}}\n",
        );
        let p = validate_app_profile(&single, &clusters);
        assert_eq!(
            describe(&p),
            "spec.routing.singleClusterRouting.clusterId: instance \"orders\" has no cluster \"c9-west\" (clusters: c1-east)"
        );
        let multi: AppProfile = from_yaml(
            "metadata: {name: serving}\nspec: {instanceRef: orders, routing: {multiClusterRoutingUseAny: {clusterIds: [c1-east, c1-east]}}}\n",
        );
        assert_eq!(
            describe(&validate_app_profile(&multi, &clusters)),
            "spec.routing.multiClusterRoutingUseAny.clusterIds[1]: cluster \"c1-east\" is listed twice"
        );
        let none: AppProfile =
            from_yaml("metadata: {name: x}\nspec: {instanceRef: orders, routing: {}}\n");
        assert_eq!(
            describe(&validate_app_profile(&none, &clusters)),
            "spec.routing: set exactly one of singleClusterRouting and multiClusterRoutingUseAny"
        );
        let any_cluster: AppProfile = from_yaml(
            "metadata: {name: serving}\nspec: {instanceRef: orders, routing: {multiClusterRoutingUseAny: {}}}\n",
        );
        assert!(validate_app_profile(&any_cluster, &clusters).is_empty());
    }

    #[test]
    fn instance_rules() {
        let i: Instance =
            from_yaml("metadata: {name: Orders}\nspec: {displayName: abc, labels: {Team: x}}\n");
        let fields: Vec<String> = validate_instance(&i).into_iter().map(|p| p.field).collect();
        assert_eq!(
            fields,
            ["metadata.name", "spec.displayName", "spec.labels[Team]"]
        );
    }

    #[test]
    fn log_backup_interval_and_retention_are_checked() {
        let spec = |log: &str| -> Instance {
            from_yaml(&format!(
                "metadata: {{name: orders}}\nspec: {{displayName: Orders, backupStore: {{url: 's3://basalt-backups', logBackup: {log}}}}}\n"
            ))
        };
        let problems = |log: &str| -> Vec<String> {
            validate_instance(&spec(log))
                .into_iter()
                .map(|p| format!("{}: {}", p.field, p.message))
                .collect()
        };
        for ok in [
            "{}",
            "{intervalSeconds: 1, retention: 36h}",
            "{intervalSeconds: 600, retention: 1d12h30m15s}",
            "{retention: 999999999d}",
        ] {
            assert_eq!(problems(ok), Vec::<String>::new(), "{ok}");
        }
        for (bad, why) in [
            (
                "{intervalSeconds: 0}",
                "spec.backupStore.logBackup.intervalSeconds: must be 1 to 600 seconds, is 0",
            ),
            (
                "{intervalSeconds: 601}",
                "spec.backupStore.logBackup.intervalSeconds: must be 1 to 600",
            ),
            (
                "{retention: 7 days}",
                "spec.backupStore.logBackup.retention: \"7 days\" is not a duration",
            ),
            ("{retention: 1500ms}", "is not a duration in whole seconds"),
            ("{retention: 1234567890s}", "is not a duration"),
            ("{retention: 0d0h}", "is no time"),
        ] {
            let found = problems(bad).join("; ");
            assert!(found.contains(why), "{bad}: {found}");
        }
        assert_eq!(log_backup_retention("7d"), Ok(Duration::from_secs(604_800)));
    }

    #[test]
    fn security_names_principals_and_identities_once() {
        let i: Instance = from_yaml(
            "metadata: {name: orders}\nspec: {displayName: Orders, security: {\
             adminPrincipals: ['user:alice@example.com', 'alice', 'allUsers'], \
             identities: [{name: checkout}, {name: admin}, {name: checkout}, {name: Bad_Name}]}}\n",
        );
        let problems = validate_instance(&i);
        let fields: Vec<&str> = problems.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.security.adminPrincipals[1]",
                "spec.security.adminPrincipals[2]",
                "spec.security.identities[1].name",
                "spec.security.identities[2].name",
                "spec.security.identities[3].name",
            ]
        );
        assert!(
            problems[3].message.contains("named twice"),
            "{}",
            problems[3].message
        );
        // Production is TLS unless said otherwise; Development is not unless said.
        assert!(i.spec.tls_enabled());
        let dev: Instance =
            from_yaml("metadata: {name: orders}\nspec: {displayName: Orders, type: Development}\n");
        assert!(!dev.spec.tls_enabled());
        let opted: Instance = from_yaml(
            "metadata: {name: orders}\nspec: {displayName: Orders, security: {tls: Disabled}}\n",
        );
        assert!(!opted.spec.tls_enabled());
    }

    #[test]
    fn metadata_store_endpoints_are_etcd_urls_and_cannot_change_once_used() {
        let spec = |store: &str| -> Instance {
            from_yaml(&format!(
                "metadata: {{name: orders}}\nspec: {{displayName: Orders{store}}}\n"
            ))
        };
        let fields = |i: &Instance| -> Vec<String> {
            validate_instance(i).into_iter().map(|p| p.field).collect()
        };
        assert!(fields(&spec("")).is_empty());
        let good = spec(
            ", metadataStore: {endpoints: ['http://etcd-0.etcd.infra.svc:2379', 'https://10.0.0.5:2379']}",
        );
        assert!(fields(&good).is_empty());
        let bad = spec(
            ", metadataStore: {endpoints: ['etcd:2379', 'http://etcd:2379/v3', 'http://etcd:99999']}",
        );
        assert_eq!(
            fields(&bad),
            [
                "spec.metadataStore.endpoints[0]",
                "spec.metadataStore.endpoints[1]",
                "spec.metadataStore.endpoints[2]"
            ]
        );
        assert_eq!(
            fields(&spec(", metadataStore: {endpoints: []}")),
            ["spec.metadataStore.endpoints"]
        );

        // In use: the operator's etcd. Naming another store afterwards is refused.
        let in_use = |external: bool, endpoints: &[&str]| crate::crd::InstanceStatus {
            metadata_store: Some(crate::crd::MetadataStoreStatus {
                endpoints: endpoints.iter().map(|e| e.to_string()).collect(),
                external,
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut moved = good.clone();
        moved.status = Some(in_use(
            false,
            &["http://orders-meta-0.orders-meta.shop.svc:2379"],
        ));
        let problems = validate_instance(&moved);
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].field, "spec.metadataStore");
        assert!(
            problems[0].message.contains("the operator's etcd"),
            "{}",
            problems[0].message
        );
        let mut same = good.clone();
        same.status = Some(in_use(
            true,
            &["http://etcd-0.etcd.infra.svc:2379", "https://10.0.0.5:2379"],
        ));
        assert!(validate_instance(&same).is_empty());
        let mut dropped = spec("");
        dropped.status = same.status.clone();
        assert_eq!(fields(&dropped), ["spec.metadataStore"]);
    }
}
