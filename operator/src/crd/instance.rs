//! The `Instance` resource: a set of clusters with the same tables and app profiles, its
//! metadata store (the operator's etcd, or an existing one) and its status.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A Basalt instance: a set of clusters that replicate each other and hold the same tables and
/// app profiles. Clients reach it through the Service named in `status.endpoint`.
// `printcolumn(...)` repeats `type_ = ...` per column, which clippy mistakes for duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "basalt.dev",
    version = "v1alpha1",
    kind = "Instance",
    namespaced,
    status = "InstanceStatus",
    shortname = "bti",
    category = "basalt",
    doc = "A Basalt instance: clusters that replicate each other, holding tables and app profiles.",
    printcolumn(name = "Display name", type_ = "string", json_path = ".spec.displayName"),
    printcolumn(name = "Type", type_ = "string", json_path = ".spec.type"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Endpoint", type_ = "string", json_path = ".status.endpoint"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = Rule::new("self.metadata.name.size() >= 6 && self.metadata.name.size() <= 33 && self.metadata.name.matches('^[a-z][-a-z0-9]*[a-z0-9]$')").message("the Instance name is the Bigtable instance id: 6 to 33 characters, [a-z][-a-z0-9]*[a-z0-9]"),
)]
#[x_kube(
    validation = Rule::new("has(oldSelf.metadataStore) == has(self.metadataStore) && (!has(self.metadataStore) || self.metadataStore == oldSelf.metadataStore)").message("metadataStore is immutable: the tablet servers' tablet map and catalog live there"),
)]
#[serde(rename_all = "camelCase")]
pub struct InstanceSpec {
    /// Human-readable name, 4 to 30 characters (Bigtable's rule).
    #[schemars(length(min = 4, max = 30))]
    pub display_name: String,
    /// Production (the default) or Development.
    #[serde(default, rename = "type")]
    pub instance_type: InstanceType,
    /// Bigtable project id clients use in resource names (`projects/P/instances/I`).
    /// Defaults to the namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub project_id: Option<String>,
    /// Labels of the Bigtable instance (keys and values: up to 63 characters of
    /// `[a-z0-9_-]`, keys starting with a letter; at most 64 labels).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[x_kube(validation = Rule::new("self.size() <= 64").message("at most 64 labels"))]
    pub labels: BTreeMap<String, String>,
    /// While true, deleting the Instance is refused: it stays (with a DeletionBlocked
    /// condition) until this is set to false.
    #[serde(default)]
    pub deletion_protection: bool,
    /// An existing etcd to keep the instance's metadata in (tablet map, catalog, the master's
    /// election). Unset: the operator runs one for the instance, the StatefulSet
    /// `<instance>-meta` (3 members for Production, 1 for Development). Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata_store: Option<MetadataStore>,
    /// Byte-rate limits of replication between the instance's clusters (unset: none). They
    /// take effect within seconds of a change, with no restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication: Option<InstanceReplication>,
    /// TLS, authentication and authorization (docs/security.md). Unset: TLS for
    /// `Production`, plaintext for `Development`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security: Option<InstanceSecurity>,
    /// Where the backups of the instance's clusters are kept (Bigtable's backup API,
    /// docs/backups.md): one location every tablet server of every cluster reaches. On
    /// Kubernetes a change restarts the servers one by one (a rolling update). Unset on
    /// Kubernetes: no location, and the backup RPCs answer UNIMPLEMENTED; unset in the local
    /// runtime: `file://DIR/backups`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_store: Option<BackupStore>,
}

impl InstanceSpec {
    /// Whether the instance's servers check ServiceAccount tokens with TokenReviews: a
    /// secured instance whose `security.serviceAccountTokens` asks for it.
    pub fn token_review(&self) -> bool {
        self.tls_enabled()
            && self
                .security
                .as_ref()
                .is_some_and(|s| s.service_account_tokens)
    }

    /// Whether the instance's servers speak TLS and authenticate every request: as
    /// `security.tls` says, else on for `Production` and off for `Development`.
    pub fn tls_enabled(&self) -> bool {
        match self.security.as_ref().and_then(|s| s.tls) {
            Some(mode) => mode == TlsMode::Enabled,
            None => self.instance_type == InstanceType::Production,
        }
    }

    /// The limits the runtime records in the instance's metadata store, where the tablet
    /// servers' shippers and the master read them.
    pub fn replication_limits(&self) -> basalt_meta::ReplicationLimits {
        let r = self.replication.clone().unwrap_or_default();
        basalt_meta::ReplicationLimits {
            ship_bytes_per_second: r.ship_bytes_per_second,
            seed_bytes_per_second: r.seed_bytes_per_second,
        }
    }
}

/// Where an instance's backups are kept: an object store (S3 or S3-compatible) or a
/// directory, and how the tablet servers reach it. What the servers get from it: the flag
/// `--backup-url` (with `logBackup`, also the flags of point-in-time recovery), and the
/// environment the AWS tools read (`AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ALLOW_HTTP`, and on
/// Kubernetes `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN` from the
/// credentials Secret).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[x_kube(validation = Rule::new("self.url.startsWith('s3://') || (!has(self.endpoint) && !has(self.region) && !has(self.credentialsSecret))").message("endpoint, region and credentialsSecret are for an s3:// url only"))]
#[serde(rename_all = "camelCase")]
pub struct BackupStore {
    /// `s3://BUCKET/PREFIX` (backups under PREFIX in the bucket; the bucket must exist) or
    /// `file:///ABSOLUTE/DIR`. A directory serves the local runtime, whose servers share the
    /// machine; on Kubernetes each server's pod has a file system of its own, so use s3://.
    #[schemars(
        length(min = 8, max = 1024),
        regex(pattern = r"^(s3://[a-z0-9][-.a-z0-9]{1,61}[a-z0-9](/.*)?|file:///.*)$")
    )]
    pub url: String,
    /// The URL of an S3-compatible server other than AWS (SeaweedFS, MinIO, Ceph RGW,
    /// Garage), `http(s)://host[:port]`, reached with path-style requests (`AWS_ENDPOINT_URL`;
    /// an `http://` endpoint also sets `AWS_ALLOW_HTTP=true`). Unset: AWS S3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512), regex(pattern = r"^https?://[^\s/]+(/\S*)?$"))]
    pub endpoint: Option<String>,
    /// The bucket's region (`AWS_REGION`). Unset: the servers' environment's, else
    /// `us-east-1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64), regex(pattern = r"^[-_.a-zA-Z0-9]+$"))]
    pub region: Option<String>,
    /// A Secret in the instance's namespace whose keys `AWS_ACCESS_KEY_ID` and
    /// `AWS_SECRET_ACCESS_KEY` (and, if present, `AWS_SESSION_TOKEN`) the tablet servers get
    /// as environment variables. The operator never reads it: the kubelet does, and a server's
    /// pod waits until the Secret exists. Unset: no credentials are given (e.g. a ServiceAccount
    /// with a cloud identity). The local runtime has no Secrets: its servers take these
    /// variables from the runtime's own environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    pub credentials_secret: Option<String>,
    /// Point-in-time recovery. Present (even as `{}`): every tablet server ships the writes it
    /// logs to this location every `intervalSeconds`, so a table can be restored to any second
    /// the shipped log covers, not only to a backup's time; a lost cluster loses about the
    /// interval plus a few seconds of writes (its recovery point). The servers get
    /// `--log-backup-interval-secs` and `--log-backup-retention-secs`. Unset: off, restores
    /// reach backups' times only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_backup: Option<LogBackup>,
}

/// How often a log backup ships when `logBackup` names no interval, in seconds.
pub const DEFAULT_LOG_BACKUP_INTERVAL_SECONDS: u32 = 30;
/// How long the shipped log is kept when `logBackup` names no retention: a week.
pub const DEFAULT_LOG_BACKUP_RETENTION: &str = "7d";

/// The CEL rule (on `logBackup.retention`) that refuses a zero duration.
const LOG_BACKUP_RETENTION_RULE: &str = "!self.matches('^(0+[smhd])+$')";

/// Point-in-time recovery of an instance's tables: each tablet server ships its change log to
/// the instance's backup location, where it is kept for `retention`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct LogBackup {
    /// How often every server ships the writes it logged since its last shipment, 1 to 600
    /// seconds (default 30). The recovery point: about the interval plus a few seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 600))]
    pub interval_seconds: Option<u32>,
    /// How long shipped log segments are kept, as in `36h` or `7d` (whole seconds: `s`, `m`,
    /// `h`, `d`; default `7d`): restores can reach back that far, replaying the log from a
    /// backup made before the point in time asked for.
    // Whole seconds, at most 9 digits a unit (never overflowing): `rules::log_backup_retention`
    // checks the same where no API server does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        regex(pattern = r"^([0-9]{1,9}(s|m|h|d))+$"),
        length(min = 2, max = 64)
    )]
    #[x_kube(validation = Rule::new(LOG_BACKUP_RETENTION_RULE).message("logBackup.retention is longer than 0"))]
    pub retention: Option<String>,
}

impl LogBackup {
    /// `intervalSeconds`, else [`DEFAULT_LOG_BACKUP_INTERVAL_SECONDS`].
    pub fn interval_seconds(&self) -> u32 {
        self.interval_seconds
            .unwrap_or(DEFAULT_LOG_BACKUP_INTERVAL_SECONDS)
    }

    /// `retention`, else [`DEFAULT_LOG_BACKUP_RETENTION`].
    pub fn retention(&self) -> &str {
        self.retention
            .as_deref()
            .unwrap_or(DEFAULT_LOG_BACKUP_RETENTION)
    }
}

impl BackupStore {
    /// The environment the tablet servers need besides credentials: the endpoint (and plain
    /// HTTP allowed for an `http://` one) and the region, in a fixed order.
    pub fn env(&self) -> Vec<(String, String)> {
        let mut env = vec![];
        if let Some(endpoint) = &self.endpoint {
            env.push(("AWS_ENDPOINT_URL".to_string(), endpoint.clone()));
            let plaintext = basalt_transport::Security::Plaintext.scheme();
            if basalt_transport::split_url(endpoint).is_some_and(|(scheme, _)| scheme == plaintext)
            {
                env.push(("AWS_ALLOW_HTTP".to_string(), "true".to_string()));
            }
        }
        if let Some(region) = &self.region {
            env.push(("AWS_REGION".to_string(), region.clone()));
        }
        env
    }

    /// What the CRD's schema and CEL rule refuse, checked again where no API server does (the
    /// local runtime's manifests). Empty: valid.
    pub fn problems(&self) -> Vec<String> {
        let mut out = vec![];
        let s3 = self.url.strip_prefix("s3://");
        match s3.map(|rest| rest.split('/').next().unwrap_or_default()) {
            Some(bucket) => {
                let ok = (3..=63).contains(&bucket.len())
                    && bucket.bytes().all(|c| {
                        c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-' || c == b'.'
                    })
                    && !bucket.starts_with(['-', '.'])
                    && !bucket.ends_with(['-', '.']);
                if !ok {
                    out.push(format!(
                        "url {:?}: the bucket must be 3 to 63 characters of [a-z0-9.-]",
                        self.url
                    ));
                }
            }
            None if !self.url.starts_with("file:///") => out.push(format!(
                "url {:?} must be s3://BUCKET/PREFIX or file:///ABSOLUTE/DIR",
                self.url
            )),
            None => {
                if self.endpoint.is_some()
                    || self.region.is_some()
                    || self.credentials_secret.is_some()
                {
                    out.push(
                        "endpoint, region and credentialsSecret are for an s3:// url only".into(),
                    );
                }
            }
        }
        if let Some(endpoint) = &self.endpoint
            && basalt_transport::split_url(endpoint).is_none()
        {
            out.push(format!(
                "endpoint {endpoint:?} must be http(s)://host[:port]"
            ));
        }
        out
    }
}

/// Byte-rate limits of replication between an instance's clusters; an unset limit is none.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstanceReplication {
    /// The most bytes per second each cluster ships to each other cluster (the rows of its
    /// writes, as sent), shared evenly by its servers. A limit per destination cluster, not per
    /// table: every table's writes wait behind it in log order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub ship_bytes_per_second: Option<u64>,
    /// The most bytes per second the master copies into each cluster being seeded (a cluster
    /// that joined the instance with data, or is re-seeded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub seed_bytes_per_second: Option<u64>,
}

/// An instance's TLS, identities and first administrators.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(validation = Rule::new("self.identities.all(i, i.name != 'admin')").message("the identity admin is always issued; name yours otherwise"))]
#[x_kube(validation = Rule::new("self.identities.all(a, self.identities.exists_one(b, b.name == a.name))").message("identity names are unique"))]
#[serde(rename_all = "camelCase")]
pub struct InstanceSecurity {
    /// `Enabled`: every connection to the instance's tablet servers (clients, the master,
    /// the operator, other servers) speaks TLS with certificates the operator issues, and
    /// every request is authenticated (a client certificate or a bearer token) and
    /// authorized with Bigtable's IAM roles. `Disabled`: plaintext and open, as Bigtable's
    /// emulator. Unset: `Enabled` for `Production`, `Disabled` for `Development`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "tls_mode_schema")]
    pub tls: Option<TlsMode>,
    /// Members (`user:alice@example.com`, `serviceAccount:…`, `group:…`) that hold
    /// `roles/bigtable.admin` on the instance from the start, besides the issued `admin`
    /// identity. Others get roles through `SetIamPolicy`.
    #[serde(default)]
    #[schemars(length(max = 32))]
    pub admin_principals: Vec<String>,
    /// Application identities the operator issues a client certificate and a bearer token
    /// for (the identity `admin` is always issued). An identity's principal is
    /// `user:<name>@<instance>.<namespace>.basalt`; it holds no role until granted one.
    #[serde(default)]
    #[schemars(length(max = 64))]
    pub identities: Vec<SecurityIdentity>,
    /// Also accept the bearer tokens of Kubernetes ServiceAccounts (and of any user the API
    /// server authenticates): the tablet servers check each with a TokenReview. A
    /// ServiceAccount's member is `serviceAccount:system:serviceaccount:<namespace>:<name>`;
    /// it holds no role until granted one. The servers then run as the ServiceAccount
    /// `<instance>-tablet-server` (unless a Cluster names its own), which the operator binds
    /// to the chart's token-reviewer ClusterRole. Only with TLS.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub service_account_tokens: bool,
}

/// An application identity the operator issues credentials for.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecurityIdentity {
    /// A DNS label: lower-case letters, digits and `-`, starting with a letter.
    #[schemars(
        length(min = 1, max = 40),
        regex(pattern = r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
}

/// `tls`'s schema: the two values, no `null` among them (schemars would list `null` in the
/// enum of an optional enum, which API servers refuse; unset is simply absent).
fn tls_mode_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "enum": ["Enabled", "Disabled"],
    })
}

/// Whether an instance speaks TLS.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum TlsMode {
    Enabled,
    Disabled,
}

/// Pattern of an etcd client URL: `http(s)://host:port`.
pub const ETCD_ENDPOINT_PATTERN: &str = "^https?://[A-Za-z0-9.-]+:[0-9]{1,5}$";

/// Where an instance's metadata lives when it is not the operator's own etcd.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(validation = Rule::new("self.endpoints.all(e, e.matches('^https?://[A-Za-z0-9.-]+:[0-9]{1,5}$'))").message("metadataStore.endpoints are etcd client URLs, http(s)://host:port"))]
#[serde(rename_all = "camelCase")]
pub struct MetadataStore {
    /// Client URLs of the etcd cluster, `http(s)://host:port` (at least one). Every instance
    /// keeps its keys under `/basalt/v1/<namespace>/<instance>/`, so instances may share one
    /// etcd.
    #[schemars(length(min = 1, max = 9))]
    pub endpoints: Vec<String>,
}

/// Bigtable's instance types.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum InstanceType {
    #[default]
    Production,
    Development,
}

/// What the operator observed of an Instance.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstanceStatus {
    /// Ready, Degraded and Progressing, each with a reason and message.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `projects/<project>/instances/<instance>`: the resource name clients use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_name: Option<String>,
    /// `host:port` of the client-facing Service (set `BIGTABLE_EMULATOR_HOST` to it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// The instance's clusters, in name order.
    #[serde(default)]
    pub clusters: Vec<InstanceClusterStatus>,
    /// The metadata store (etcd) the instance's tablet servers and master use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata_store: Option<MetadataStoreStatus>,
    /// With several clusters: how far each cluster's writes reached each other cluster.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replication: Vec<ReplicationStatus>,
    /// Clusters that joined the instance with data and are being seeded with it (their
    /// tables are INITIALIZING until then).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub seeding: Vec<SeedingStatus>,
}

/// The seeding of a cluster that joined the instance.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SeedingStatus {
    /// The cluster being seeded.
    pub cluster: String,
    /// The cluster it is copied from; unset while every other server has yet to log for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Tables not yet copied completely.
    pub tables_left: u64,
    /// Stored entries (cells, tombstones) and bytes copied so far.
    pub entries_copied: u64,
    pub bytes_copied: u64,
}

/// Replication from one cluster of the instance to another.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicationStatus {
    /// The cluster whose writes are replicated.
    pub source: String,
    /// The cluster they are replicated to.
    pub destination: String,
    /// Age in seconds of the oldest write of the source the destination has not applied yet
    /// (0: caught up); Bigtable's `replication/max_delay`.
    pub max_delay_seconds: f64,
    /// Writes of the source the destination has not applied yet.
    pub pending_writes: u64,
}

/// The metadata store an Instance uses, as the operator set it up.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetadataStoreStatus {
    /// The etcd client URLs the tablet servers are given.
    #[serde(default)]
    pub endpoints: Vec<String>,
    /// True for an etcd named in `spec.metadataStore` (not run by the operator).
    #[serde(default)]
    pub external: bool,
    /// Members of the operator's etcd StatefulSet (unset for an external etcd).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub members: Option<i32>,
    /// Members that are ready (unset for an external etcd).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_members: Option<i32>,
}

/// One cluster as its Instance sees it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstanceClusterStatus {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    pub serve_nodes: i32,
    pub ready_nodes: i32,
    pub ready: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backup_store_problems_mirror_the_schema() {
        let store = |yaml: &str| -> BackupStore { serde_norway::from_str(yaml).unwrap() };
        for ok in [
            "{url: 's3://basalt-backups'}",
            "{url: 's3://basalt-backups/a/b', endpoint: 'http://seaweedfs:8333', region: us-east-1, credentialsSecret: creds}",
            "{url: 'file:///var/backups'}",
        ] {
            assert_eq!(store(ok).problems(), Vec::<String>::new(), "{ok}");
        }
        for (bad, why) in [
            (
                "{url: 'gs://bucket/x'}",
                "must be s3://BUCKET/PREFIX or file:///ABSOLUTE/DIR",
            ),
            ("{url: 'file://relative/dir'}", "must be s3://BUCKET/PREFIX"),
            (
                "{url: 's3://Bad_Bucket/x'}",
                "the bucket must be 3 to 63 characters",
            ),
            ("{url: 's3://'}", "the bucket must be"),
            (
                "{url: 'file:///d', endpoint: 'http://x:1'}",
                "endpoint, region and credentialsSecret are for an s3:// url only",
            ),
            (
                "{url: 's3://bucket', endpoint: 'seaweedfs:8333'}",
                "must be http(s)://host[:port]",
            ),
        ] {
            let found = store(bad).problems().join("; ");
            assert!(found.contains(why), "{bad}: {found}");
        }
    }
}
