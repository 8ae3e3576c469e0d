//! Table schemas through Bigtable's table admin API: the gRPC client the Table controller uses,
//! behind a trait so reconciles can be tested without servers, and the pure translation between
//! a `Table` spec and admin API messages (what to create, which families to modify).

use std::collections::BTreeMap;
use std::time::Duration;

use admin::bigtable_table_admin_client::BigtableTableAdminClient;
use admin::gc_rule::Rule;
use admin::modify_column_families_request::{Modification, modification::Mod};
use admin::r#type::aggregate::Aggregator as A;
use admin::r#type::{Kind, aggregate, bytes as bytes_type, int64};
use basalt_control::{Deadlines, Dialer};
use bytes::Bytes;
use googleapis_tonic_google_bigtable_admin_v2::google::bigtable::admin::v2 as admin;
use tonic::{Code, Status};

use crate::crd::{self, ColumnFamily, DeletionPolicy, GcRule, GcRuleLeaf, GcRuleNested, Table};
use crate::rules::{GcNode, parse_duration};

/// The table admin operations the Table controller needs. `endpoint` is `host:port` of a
/// tablet server of the instance.
#[tonic::async_trait]
pub trait TableAdmin: Send + Sync {
    /// The table with its schema, or None if it does not exist.
    async fn get_table(&self, endpoint: &str, name: &str) -> Result<Option<admin::Table>, Status>;
    async fn create_table(
        &self,
        endpoint: &str,
        parent: &str,
        table_id: &str,
        table: admin::Table,
        splits: Vec<Bytes>,
    ) -> Result<admin::Table, Status>;
    async fn modify_column_families(
        &self,
        endpoint: &str,
        name: &str,
        modifications: Vec<Modification>,
    ) -> Result<admin::Table, Status>;
    async fn set_deletion_protection(
        &self,
        endpoint: &str,
        name: &str,
        on: bool,
    ) -> Result<(), Status>;
    async fn delete_table(&self, endpoint: &str, name: &str) -> Result<(), Status>;
}

/// The real client: a channel per endpoint from its [`Dialer`] (connected on the first call,
/// remade after a failure), `timeout` bounding connecting and each call.
pub struct GrpcTableAdmin {
    timeout: Duration,
    dialer: Dialer,
}

impl GrpcTableAdmin {
    /// Plaintext (an instance whose servers do not speak TLS).
    pub fn new(timeout: Duration) -> GrpcTableAdmin {
        GrpcTableAdmin::with_dialer(timeout, Dialer::default())
    }

    /// Through `dialer` (with TLS: the operator's certificate, an internal principal of the
    /// instance's servers).
    pub fn with_dialer(timeout: Duration, dialer: Dialer) -> GrpcTableAdmin {
        GrpcTableAdmin { timeout, dialer }
    }

    async fn client(
        &self,
        endpoint: &str,
    ) -> Result<BigtableTableAdminClient<tonic::transport::Channel>, Status> {
        let channel = self
            .dialer
            .channel_with(endpoint, Deadlines::both(self.timeout))
            .map_err(|e| Status::invalid_argument(format!("endpoint {endpoint}: {e}")))?;
        Ok(BigtableTableAdminClient::new(channel))
    }

    /// UpdateBackup of the one field `path` (its update mask), as `backup` has it.
    async fn update_backup(
        &self,
        endpoint: &str,
        backup: admin::Backup,
        path: &str,
    ) -> Result<admin::Backup, Status> {
        let mut client = self.client(endpoint).await?;
        Ok(client
            .update_backup(admin::UpdateBackupRequest {
                backup: Some(backup),
                update_mask: Some(prost_types::FieldMask {
                    paths: vec![path.into()],
                }),
            })
            .await?
            .into_inner())
    }
}

#[tonic::async_trait]
impl TableAdmin for GrpcTableAdmin {
    async fn get_table(&self, endpoint: &str, name: &str) -> Result<Option<admin::Table>, Status> {
        let mut client = self.client(endpoint).await?;
        match client
            .get_table(admin::GetTableRequest {
                name: name.into(),
                view: admin::table::View::Full as i32,
            })
            .await
        {
            Ok(r) => Ok(Some(r.into_inner())),
            Err(s) if s.code() == Code::NotFound => Ok(None),
            Err(s) => Err(s),
        }
    }

    async fn create_table(
        &self,
        endpoint: &str,
        parent: &str,
        table_id: &str,
        table: admin::Table,
        splits: Vec<Bytes>,
    ) -> Result<admin::Table, Status> {
        let mut client = self.client(endpoint).await?;
        Ok(client
            .create_table(admin::CreateTableRequest {
                parent: parent.into(),
                table_id: table_id.into(),
                table: Some(table),
                initial_splits: splits
                    .into_iter()
                    .map(|key| admin::create_table_request::Split { key })
                    .collect(),
            })
            .await?
            .into_inner())
    }

    async fn modify_column_families(
        &self,
        endpoint: &str,
        name: &str,
        modifications: Vec<Modification>,
    ) -> Result<admin::Table, Status> {
        let mut client = self.client(endpoint).await?;
        Ok(client
            .modify_column_families(admin::ModifyColumnFamiliesRequest {
                name: name.into(),
                modifications,
                ignore_warnings: false,
            })
            .await?
            .into_inner())
    }

    async fn set_deletion_protection(
        &self,
        endpoint: &str,
        name: &str,
        on: bool,
    ) -> Result<(), Status> {
        let mut client = self.client(endpoint).await?;
        client
            .update_table(admin::UpdateTableRequest {
                table: Some(admin::Table {
                    name: name.into(),
                    deletion_protection: on,
                    ..admin::Table::default()
                }),
                update_mask: Some(prost_types::FieldMask {
                    paths: vec!["deletion_protection".into()],
                }),
                ignore_warnings: false,
            })
            .await?;
        Ok(())
    }

    async fn delete_table(&self, endpoint: &str, name: &str) -> Result<(), Status> {
        let mut client = self.client(endpoint).await?;
        match client
            .delete_table(admin::DeleteTableRequest { name: name.into() })
            .await
        {
            Ok(_) => Ok(()),
            Err(s) if s.code() == Code::NotFound => Ok(()),
            Err(s) => Err(s),
        }
    }
}

/// The backup operations of Bigtable's table admin API that `Backup` and `BackupSchedule`
/// need (`endpoint` as for [`TableAdmin`]); a separate trait so the table reconciles' tests
/// need not fake them.
#[tonic::async_trait]
pub trait BackupAdmin: Send + Sync {
    /// Starts CreateBackup of `source_table` as `<cluster>/backups/<backup_id>` of
    /// `backup_type` (a HOT one turning STANDARD at `hot_to_standard_time`, if any); the
    /// backup is then CREATING until it is READY.
    #[allow(clippy::too_many_arguments)]
    async fn create_backup(
        &self,
        endpoint: &str,
        cluster: &str,
        backup_id: &str,
        source_table: &str,
        expire_time: prost_types::Timestamp,
        backup_type: admin::backup::BackupType,
        hot_to_standard_time: Option<prost_types::Timestamp>,
    ) -> Result<(), Status>;
    /// The backup, or None if it does not exist.
    async fn get_backup(&self, endpoint: &str, name: &str)
    -> Result<Option<admin::Backup>, Status>;
    /// Every backup of `cluster` (all pages).
    async fn list_backups(
        &self,
        endpoint: &str,
        cluster: &str,
    ) -> Result<Vec<admin::Backup>, Status>;
    async fn set_expire_time(
        &self,
        endpoint: &str,
        name: &str,
        expire_time: prost_types::Timestamp,
    ) -> Result<admin::Backup, Status>;
    /// Moves a HOT backup's `hot_to_standard_time` (None: unset, it stays HOT).
    async fn set_hot_to_standard_time(
        &self,
        endpoint: &str,
        name: &str,
        hot_to_standard_time: Option<prost_types::Timestamp>,
    ) -> Result<admin::Backup, Status>;
    /// Deletes the backup; one that does not exist is not an error.
    async fn delete_backup(&self, endpoint: &str, name: &str) -> Result<(), Status>;
}

#[tonic::async_trait]
impl BackupAdmin for GrpcTableAdmin {
    async fn create_backup(
        &self,
        endpoint: &str,
        cluster: &str,
        backup_id: &str,
        source_table: &str,
        expire_time: prost_types::Timestamp,
        backup_type: admin::backup::BackupType,
        hot_to_standard_time: Option<prost_types::Timestamp>,
    ) -> Result<(), Status> {
        let mut client = self.client(endpoint).await?;
        client
            .create_backup(admin::CreateBackupRequest {
                parent: cluster.into(),
                backup_id: backup_id.into(),
                backup: Some(admin::Backup {
                    source_table: source_table.into(),
                    expire_time: Some(expire_time),
                    backup_type: backup_type as i32,
                    hot_to_standard_time,
                    ..Default::default()
                }),
            })
            .await?;
        Ok(())
    }

    async fn get_backup(
        &self,
        endpoint: &str,
        name: &str,
    ) -> Result<Option<admin::Backup>, Status> {
        let mut client = self.client(endpoint).await?;
        match client
            .get_backup(admin::GetBackupRequest { name: name.into() })
            .await
        {
            Ok(r) => Ok(Some(r.into_inner())),
            Err(s) if s.code() == Code::NotFound => Ok(None),
            Err(s) => Err(s),
        }
    }

    async fn list_backups(
        &self,
        endpoint: &str,
        cluster: &str,
    ) -> Result<Vec<admin::Backup>, Status> {
        let mut client = self.client(endpoint).await?;
        let mut out = vec![];
        let mut page_token = String::new();
        loop {
            let page = client
                .list_backups(admin::ListBackupsRequest {
                    parent: cluster.into(),
                    page_token: page_token.clone(),
                    ..Default::default()
                })
                .await?
                .into_inner();
            out.extend(page.backups);
            if page.next_page_token.is_empty() {
                return Ok(out);
            }
            page_token = page.next_page_token;
        }
    }

    async fn set_expire_time(
        &self,
        endpoint: &str,
        name: &str,
        expire_time: prost_types::Timestamp,
    ) -> Result<admin::Backup, Status> {
        let backup = admin::Backup {
            name: name.into(),
            expire_time: Some(expire_time),
            ..Default::default()
        };
        self.update_backup(endpoint, backup, "expire_time").await
    }

    async fn set_hot_to_standard_time(
        &self,
        endpoint: &str,
        name: &str,
        hot_to_standard_time: Option<prost_types::Timestamp>,
    ) -> Result<admin::Backup, Status> {
        let backup = admin::Backup {
            name: name.into(),
            hot_to_standard_time,
            ..Default::default()
        };
        self.update_backup(endpoint, backup, "hot_to_standard_time")
            .await
    }

    async fn delete_backup(&self, endpoint: &str, name: &str) -> Result<(), Status> {
        let mut client = self.client(endpoint).await?;
        match client
            .delete_backup(admin::DeleteBackupRequest { name: name.into() })
            .await
        {
            Ok(_) => Ok(()),
            Err(s) if s.code() == Code::NotFound => Ok(()),
            Err(s) => Err(s),
        }
    }
}

// ------------------------------------------------------------------------------ translation

fn proto_duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

/// A GC rule node as the admin API expresses it. Only called on validated rules.
pub fn gc_rule_proto(node: &GcNode) -> admin::GcRule {
    let rule = match node {
        GcNode::MaxAge(age) => Rule::MaxAge(proto_duration(
            age.as_deref()
                .and_then(parse_duration)
                .unwrap_or(Duration::ZERO),
        )),
        GcNode::MaxNumVersions(n) => Rule::MaxNumVersions(*n),
        GcNode::Union(rules) => Rule::Union(admin::gc_rule::Union {
            rules: rules.iter().map(gc_rule_proto).collect(),
        }),
        GcNode::Intersection(rules) => Rule::Intersection(admin::gc_rule::Intersection {
            rules: rules.iter().map(gc_rule_proto).collect(),
        }),
        GcNode::Ambiguous(_) => return admin::GcRule::default(),
    };
    admin::GcRule { rule: Some(rule) }
}

/// `7d`, `12h`, `90m`, `30s`, `1500ms`: the largest unit that states the duration exactly.
pub fn format_duration(d: &prost_types::Duration) -> String {
    let ms = d.seconds as i128 * 1000 + d.nanos as i128 / 1_000_000;
    for (unit, len) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1000),
    ] {
        if ms > 0 && ms % len == 0 {
            return format!("{}{unit}", ms / len);
        }
    }
    format!("{ms}ms")
}

fn leaf(rule: &admin::GcRule) -> GcRuleLeaf {
    match &rule.rule {
        Some(Rule::MaxAge(d)) => GcRuleLeaf {
            max_age: Some(format_duration(d)),
            ..GcRuleLeaf::default()
        },
        Some(Rule::MaxNumVersions(n)) => GcRuleLeaf {
            max_num_versions: Some(*n),
            ..GcRuleLeaf::default()
        },
        // Deeper than the resource can show: reported as its version bound, if any.
        _ => GcRuleLeaf::default(),
    }
}

fn nested(rule: &admin::GcRule) -> GcRuleNested {
    match &rule.rule {
        Some(Rule::Union(u)) => GcRuleNested {
            union: Some(u.rules.iter().map(leaf).collect()),
            ..GcRuleNested::default()
        },
        Some(Rule::Intersection(i)) => GcRuleNested {
            intersection: Some(i.rules.iter().map(leaf).collect()),
            ..GcRuleNested::default()
        },
        _ => {
            let l = leaf(rule);
            GcRuleNested {
                max_age: l.max_age,
                max_num_versions: l.max_num_versions,
                ..GcRuleNested::default()
            }
        }
    }
}

/// The resource form of an admin API GC rule (None: no rule).
pub fn gc_rule_from_proto(rule: &admin::GcRule) -> Option<GcRule> {
    Some(match rule.rule.as_ref()? {
        Rule::Union(u) => GcRule {
            union: Some(u.rules.iter().map(nested).collect()),
            ..GcRule::default()
        },
        Rule::Intersection(i) => GcRule {
            intersection: Some(i.rules.iter().map(nested).collect()),
            ..GcRule::default()
        },
        _ => {
            let n = nested(rule);
            GcRule {
                max_age: n.max_age,
                max_num_versions: n.max_num_versions,
                ..GcRule::default()
            }
        }
    })
}

fn int64_big_endian() -> admin::Type {
    admin::Type {
        kind: Some(Kind::Int64Type(admin::r#type::Int64 {
            encoding: Some(int64::Encoding {
                encoding: Some(int64::encoding::Encoding::BigEndianBytes(
                    int64::encoding::BigEndianBytes::default(),
                )),
            }),
        })),
    }
}

/// The admin API value type of an aggregate family.
pub fn value_type_proto(aggregate: crd::Aggregate) -> admin::Type {
    let (aggregator, input) = match aggregate {
        crd::Aggregate::Sum => (A::Sum(aggregate::Sum {}), int64_big_endian()),
        crd::Aggregate::Min => (A::Min(aggregate::Min {}), int64_big_endian()),
        crd::Aggregate::Max => (A::Max(aggregate::Max {}), int64_big_endian()),
        crd::Aggregate::HyperLogLogPlusPlusUniqueCount => (
            A::HllppUniqueCount(aggregate::HyperLogLogPlusPlusUniqueCount {}),
            admin::Type {
                kind: Some(Kind::BytesType(admin::r#type::Bytes {
                    encoding: Some(bytes_type::Encoding {
                        encoding: Some(bytes_type::encoding::Encoding::Raw(
                            bytes_type::encoding::Raw::default(),
                        )),
                    }),
                })),
            },
        ),
    };
    admin::Type {
        kind: Some(Kind::AggregateType(Box::new(admin::r#type::Aggregate {
            input_type: Some(Box::new(input)),
            state_type: None,
            aggregator: Some(aggregator),
        }))),
    }
}

/// The aggregate of an admin API value type, if it is one.
pub fn aggregate_from_proto(t: &admin::Type) -> Option<crd::Aggregate> {
    let Some(Kind::AggregateType(agg)) = &t.kind else {
        return None;
    };
    match agg.aggregator.as_ref()? {
        A::Sum(_) => Some(crd::Aggregate::Sum),
        A::Min(_) => Some(crd::Aggregate::Min),
        A::Max(_) => Some(crd::Aggregate::Max),
        A::HllppUniqueCount(_) => Some(crd::Aggregate::HyperLogLogPlusPlusUniqueCount),
    }
}

/// A column family of the spec as the admin API expresses it.
pub fn family_proto(family: &ColumnFamily) -> admin::ColumnFamily {
    admin::ColumnFamily {
        gc_rule: family
            .gc_rule
            .as_ref()
            .map(|r| gc_rule_proto(&GcNode::from(r))),
        value_type: family
            .value_type
            .as_ref()
            .map(|v| value_type_proto(v.aggregate)),
    }
}

/// The families an instance reports, in the resource's form (for `status.columnFamilies`).
pub fn observed_families(table: &admin::Table) -> BTreeMap<String, ColumnFamily> {
    table
        .column_families
        .iter()
        .map(|(name, f)| {
            (
                name.clone(),
                ColumnFamily {
                    gc_rule: f.gc_rule.as_ref().and_then(gc_rule_from_proto),
                    value_type: f
                        .value_type
                        .as_ref()
                        .and_then(aggregate_from_proto)
                        .map(|aggregate| crd::ValueType { aggregate }),
                },
            )
        })
        .collect()
}

/// The CreateTable payload for a Table spec.
pub fn table_to_create(table: &Table) -> (admin::Table, Vec<Bytes>) {
    let families = table
        .spec
        .column_families
        .iter()
        .map(|(name, f)| (name.clone(), family_proto(f)))
        .collect();
    let splits = table
        .spec
        .initial_splits
        .iter()
        .map(|s| Bytes::copy_from_slice(s.as_bytes()))
        .collect();
    (
        admin::Table {
            column_families: families,
            granularity: admin::table::TimestampGranularity::Millis as i32,
            deletion_protection: table.spec.deletion_protection,
            ..admin::Table::default()
        },
        splits,
    )
}

/// What it takes to bring an existing table to the spec.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SchemaPlan {
    /// Family creations, GC rule updates and (only when the spec's column family deletion
    /// policy is Delete) drops, in one all-or-nothing ModifyColumnFamilies.
    pub modifications: Vec<Modification>,
    /// Some(on) when deletion protection must change.
    pub deletion_protection: Option<bool>,
    /// Changes the instance cannot make (a family's value type is immutable).
    pub refused: Vec<String>,
}

fn same_gc_rule(a: Option<&admin::GcRule>, b: Option<&admin::GcRule>) -> bool {
    let empty = admin::GcRule::default();
    a.unwrap_or(&empty) == b.unwrap_or(&empty)
}

/// Compares the spec with the table the instance has. Pure.
pub fn plan_schema(table: &Table, actual: &admin::Table) -> SchemaPlan {
    let mut plan = SchemaPlan::default();
    for (name, family) in &table.spec.column_families {
        let desired = family_proto(family);
        match actual.column_families.get(name) {
            None => plan.modifications.push(Modification {
                id: name.clone(),
                update_mask: None,
                r#mod: Some(Mod::Create(desired)),
            }),
            Some(existing) => {
                let have = existing.value_type.as_ref().and_then(aggregate_from_proto);
                let want = family.value_type.as_ref().map(|v| v.aggregate);
                if have != want {
                    plan.refused.push(format!(
                        "column family {name:?} has value type {have:?} in the instance and {want:?} in the spec; a family's value type cannot change (drop and re-create the family under a new name)"
                    ));
                    continue;
                }
                if !same_gc_rule(existing.gc_rule.as_ref(), desired.gc_rule.as_ref()) {
                    plan.modifications.push(Modification {
                        id: name.clone(),
                        update_mask: Some(prost_types::FieldMask {
                            paths: vec!["gc_rule".into()],
                        }),
                        r#mod: Some(Mod::Update(admin::ColumnFamily {
                            gc_rule: Some(desired.gc_rule.unwrap_or_default()),
                            value_type: None,
                        })),
                    });
                }
            }
        }
    }
    if table.spec.column_family_deletion_policy == DeletionPolicy::Delete {
        let mut extra: Vec<&String> = actual
            .column_families
            .keys()
            .filter(|k| !table.spec.column_families.contains_key(*k))
            .collect();
        extra.sort();
        for name in extra {
            plan.modifications.push(Modification {
                id: name.clone(),
                update_mask: None,
                r#mod: Some(Mod::Drop(true)),
            });
        }
    }
    if actual.deletion_protection != table.spec.deletion_protection {
        plan.deletion_protection = Some(table.spec.deletion_protection);
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(yaml: &str) -> Table {
        serde_norway::from_str(yaml).unwrap()
    }

    const SPEC: &str = r#"
metadata: {name: orders, namespace: shop}
spec:
  instanceRef: orders-prod
  columnFamilies:
    details:
      gcRule: {union: [{maxNumVersions: 3}, {intersection: [{maxAge: 30d}, {maxNumVersions: 1}]}]}
    stats:
      valueType: {aggregate: Sum}
    plain: {}
  initialSplits: ["m"]
  deletionProtection: true
"#;

    #[test]
    fn gc_rules_round_trip_through_the_admin_api_form() {
        let t = table(SPEC);
        let (create, splits) = table_to_create(&t);
        assert_eq!(splits, vec![Bytes::from_static(b"m")]);
        assert!(create.deletion_protection);
        let observed = observed_families(&create);
        assert_eq!(observed, t.spec.column_families);
        let details = &create.column_families["details"];
        let Some(Rule::Union(u)) = &details.gc_rule.as_ref().unwrap().rule else {
            panic!("{details:?}");
        };
        assert_eq!(u.rules[0].rule, Some(Rule::MaxNumVersions(3)));
        let Some(Rule::Intersection(i)) = &u.rules[1].rule else {
            panic!()
        };
        assert_eq!(
            i.rules[0].rule,
            Some(Rule::MaxAge(prost_types::Duration {
                seconds: 30 * 86400,
                nanos: 0
            }))
        );
    }

    #[test]
    fn durations_are_shown_in_their_largest_exact_unit() {
        let d = |seconds, nanos| format_duration(&prost_types::Duration { seconds, nanos });
        assert_eq!(d(86400 * 7, 0), "7d");
        assert_eq!(d(5400, 0), "90m");
        assert_eq!(d(1, 500_000_000), "1500ms");
        assert_eq!(d(3600, 0), "1h");
    }

    #[test]
    fn plans_create_update_and_only_explicit_drops() {
        let t = table(SPEC);
        let (mut actual, _) = table_to_create(&t);
        actual.deletion_protection = true;
        assert_eq!(plan_schema(&t, &actual), SchemaPlan::default());

        // Someone (cbt) changed a rule, dropped a family and added one.
        actual.column_families.remove("plain");
        actual.column_families.insert(
            "details".into(),
            admin::ColumnFamily {
                gc_rule: Some(admin::GcRule {
                    rule: Some(Rule::MaxNumVersions(1)),
                }),
                value_type: None,
            },
        );
        actual
            .column_families
            .insert("extra".into(), admin::ColumnFamily::default());
        actual.deletion_protection = false;
        let plan = plan_schema(&t, &actual);
        let ids: Vec<(&str, &str)> = plan
            .modifications
            .iter()
            .map(|m| {
                (
                    m.id.as_str(),
                    match m.r#mod {
                        Some(Mod::Create(_)) => "create",
                        Some(Mod::Update(_)) => "update",
                        Some(Mod::Drop(_)) => "drop",
                        None => "none",
                    },
                )
            })
            .collect();
        // "extra" is retained: the spec's column family deletion policy is Retain.
        assert_eq!(ids, [("details", "update"), ("plain", "create")]);
        assert_eq!(plan.deletion_protection, Some(true));

        let mut t2 = t.clone();
        t2.spec.column_family_deletion_policy = DeletionPolicy::Delete;
        let ids: Vec<String> = plan_schema(&t2, &actual)
            .modifications
            .iter()
            .map(|m| m.id.clone())
            .collect();
        assert_eq!(ids, ["details", "plain", "extra"]);
    }

    #[test]
    fn value_type_changes_are_refused() {
        let t = table(SPEC);
        let (mut actual, _) = table_to_create(&t);
        actual.column_families.get_mut("stats").unwrap().value_type =
            Some(value_type_proto(crd::Aggregate::Max));
        let plan = plan_schema(&t, &actual);
        assert_eq!(plan.refused.len(), 1, "{plan:?}");
        assert!(plan.refused[0].contains("\"stats\""), "{}", plan.refused[0]);
        assert!(plan.modifications.is_empty());
    }
}
