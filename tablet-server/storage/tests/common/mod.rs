//! What the storage integration tests share: a store in a directory, a table, a row range and
//! a one-cell write.

#![allow(dead_code)] // each test binary uses its own part of it

use std::collections::BTreeMap;
use std::sync::Arc;

use basalt_model::aggregate::Aggregator;
use basalt_model::{FamilySchema, Mutation, RowMutation, RowRange, TableSchema};
use basalt_storage::{Store, StoreOptions};
use bytes::Bytes;

pub const TABLE: &str = "projects/p/instances/i/tables/t";

pub fn open(dir: &std::path::Path) -> Store {
    Store::open(dir, StoreOptions::default()).expect("open store")
}

/// A family without a GC rule; with `aggregate`, an aggregate family.
pub fn family(name: &str, aggregate: Option<Aggregator>) -> (String, FamilySchema) {
    (
        name.to_string(),
        FamilySchema {
            gc_rule: None,
            aggregate,
        },
    )
}

/// Creates table [`TABLE`] with `families`, split at `splits`.
pub fn create(
    store: &Store,
    families: impl IntoIterator<Item = (String, FamilySchema)>,
    splits: &[&str],
) -> Arc<TableSchema> {
    let families: BTreeMap<String, FamilySchema> = families.into_iter().collect();
    let splits = splits.iter().map(|s| s.as_bytes().to_vec()).collect();
    store
        .create_table(TABLE, "projects/p/instances/i", families, splits, false)
        .unwrap()
}

/// `cf:q` = `value` at timestamp 1000 in `row`.
pub fn set(row: &str, value: &str) -> RowMutation {
    RowMutation {
        row: Bytes::copy_from_slice(row.as_bytes()),
        mutations: vec![Mutation::SetCell {
            family: "cf".into(),
            qualifier: Bytes::from_static(b"q"),
            timestamp: 1000,
            value: Bytes::copy_from_slice(value.as_bytes()),
        }],
    }
}

pub fn range(start: &str, end: Option<&str>) -> RowRange {
    RowRange::new(
        Bytes::copy_from_slice(start.as_bytes()),
        end.map(|e| Bytes::copy_from_slice(e.as_bytes())),
    )
}
