//! The `Table` resource: a table of an instance declared with its column families, their GC
//! rules and value types, and its status.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A table of an instance, declared. The operator creates it and its column families through
/// the table admin API; tables created by clients directly need no Table resource.
// `printcolumn(...)` repeats `type_ = ...` per column, which clippy mistakes for duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "basalt.dev",
    version = "v1alpha1",
    kind = "Table",
    namespaced,
    status = "TableStatus",
    shortname = "btt",
    category = "basalt",
    doc = "A table of a Basalt instance, with its column families and GC rules.",
    printcolumn(name = "Instance", type_ = "string", json_path = ".spec.instanceRef"),
    printcolumn(name = "Table", type_ = "string", json_path = ".status.tableId"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(
    validation = Rule::new("self.instanceRef == oldSelf.instanceRef").message("instanceRef is immutable"),
    validation = Rule::new("has(oldSelf.tableId) == has(self.tableId) && (!has(self.tableId) || self.tableId == oldSelf.tableId)").message("tableId is immutable"),
    validation = Rule::new("self.initialSplits == oldSelf.initialSplits").message("initialSplits only apply when the table is created and cannot change"),
)]
#[serde(rename_all = "camelCase")]
pub struct TableSpec {
    /// Name of the Instance (same namespace). Immutable.
    #[schemars(length(min = 1))]
    pub instance_ref: String,
    /// Bigtable table id (`[_a-zA-Z0-9][-_.a-zA-Z0-9]*`, at most 50 characters). Defaults to
    /// the resource's name. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[_a-zA-Z0-9][-_.a-zA-Z0-9]{0,49}$"))]
    pub table_id: Option<String>,
    /// Column families by name, each with an optional GC rule and aggregate value type.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self.all(k, k.matches('^[-_.a-zA-Z0-9]{1,64}$'))").message("column family names are 1 to 64 characters of [-_.a-zA-Z0-9]"))]
    pub column_families: BTreeMap<String, ColumnFamily>,
    /// Row keys at which the table is split into tablets when it is created.
    #[serde(default)]
    pub initial_splits: Vec<String>,
    /// Timestamp granularity; only Millis exists.
    #[serde(default)]
    pub granularity: Granularity,
    /// Refuse DeleteTable (and dropping the table through this resource) while true.
    #[serde(default)]
    pub deletion_protection: bool,
    /// What deleting this resource does to the table: Retain (the default) leaves the table
    /// and its data; Delete drops the table.
    #[serde(default)]
    pub deletion_policy: DeletionPolicy,
    /// What happens to column families the instance has but the spec does not list: Retain
    /// (the default) leaves them; Delete drops them and their data.
    #[serde(default)]
    pub column_family_deletion_policy: DeletionPolicy,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(validation = Rule::new("!has(oldSelf.valueType) || (has(self.valueType) && self.valueType == oldSelf.valueType)").message("valueType is immutable"))]
#[serde(rename_all = "camelCase")]
pub struct ColumnFamily {
    /// Garbage-collection rule. Unset: keep every version forever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gc_rule: Option<GcRule>,
    /// Aggregate value type: the family holds counters written with AddToCell/MergeToCell.
    /// Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_type: Option<ValueType>,
}

/// A GC rule: exactly one of `maxAge`, `maxNumVersions`, `union`, `intersection`. Rules nest
/// two levels deep here (`union` of `intersection`s of leaves, and so on).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(validation = Rule::new("[has(self.maxAge), has(self.maxNumVersions), has(self.union), has(self.intersection)].filter(x, x).size() == 1").message("a GC rule sets exactly one of maxAge, maxNumVersions, union, intersection"))]
#[serde(rename_all = "camelCase")]
pub struct GcRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h|d))+$"))]
    pub max_age: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_num_versions: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub union: Option<Vec<GcRuleNested>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intersection: Option<Vec<GcRuleNested>>,
}

/// A GC rule inside a union or intersection.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(validation = Rule::new("[has(self.maxAge), has(self.maxNumVersions), has(self.union), has(self.intersection)].filter(x, x).size() == 1").message("a GC rule sets exactly one of maxAge, maxNumVersions, union, intersection"))]
#[serde(rename_all = "camelCase")]
pub struct GcRuleNested {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h|d))+$"))]
    pub max_age: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_num_versions: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub union: Option<Vec<GcRuleLeaf>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intersection: Option<Vec<GcRuleLeaf>>,
}

/// The innermost GC rule: an age or a version count.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(validation = Rule::new("has(self.maxAge) != has(self.maxNumVersions)").message("set exactly one of maxAge and maxNumVersions"))]
#[serde(rename_all = "camelCase")]
pub struct GcRuleLeaf {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h|d))+$"))]
    pub max_age: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_num_versions: Option<i32>,
}

/// The value type of an aggregate column family.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ValueType {
    /// The aggregate over Int64 (big-endian) inputs.
    pub aggregate: Aggregate,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Aggregate {
    Sum,
    Min,
    Max,
    HyperLogLogPlusPlusUniqueCount,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum Granularity {
    #[default]
    Millis,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum DeletionPolicy {
    #[default]
    Retain,
    Delete,
}

/// What the operator observed of a Table.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TableStatus {
    #[serde(default)]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The table id in the instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table_id: Option<String>,
    /// `projects/P/instances/I/tables/T`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_name: Option<String>,
    /// The column families the instance really has, with their GC rules and value types as
    /// the instance reports them.
    #[serde(default)]
    pub column_families: BTreeMap<String, ColumnFamily>,
    /// Deletion protection as the instance reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_protection: Option<bool>,
}
