//! Table schemas (the catalog) and Bigtable resource names.
//!
//! A table's schema is stored as JSON in the `meta` column family under `table/<name>` (see
//! `docs/storage-format.md`); the in-memory [`Catalog`] mirrors it and is shared with the
//! compaction filter, which needs each family's GC rule.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::aggregate::Aggregator;
use crate::error::{Error, Result};
use crate::gc::GcRule;

/// Maximum length of a table id.
pub const MAX_TABLE_ID_LEN: usize = 50;
/// Maximum length of a column family id.
pub const MAX_FAMILY_ID_LEN: usize = 64;
/// Maximum number of tables per instance.
pub const MAX_TABLES_PER_INSTANCE: usize = 1000;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FamilySchema {
    /// `None`: never collected.
    pub gc_rule: Option<GcRule>,
    /// Set for aggregate families (`value_type`); immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aggregate: Option<Aggregator>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableSchema {
    /// Internal id, the first 8 bytes of every data key of the table; never reused.
    pub id: u64,
    /// Full resource name, `projects/P/instances/I/tables/T`.
    pub name: String,
    pub families: BTreeMap<String, FamilySchema>,
    /// Families dropped from the schema, with the clock value of the drop: cells of that name
    /// written at or before it are dead even if the family is created again.
    #[serde(default)]
    pub dropped_families: BTreeMap<String, u64>,
    pub deletion_protection: bool,
    /// Tablet boundaries (row keys, ascending): the table's `initial_splits` for now.
    #[serde(default)]
    pub splits: Vec<Vec<u8>>,
    /// Creation time, microseconds since the epoch.
    pub created_micros: i64,
}

impl TableSchema {
    pub fn family(&self, family: &str) -> Result<&FamilySchema> {
        self.families.get(family).ok_or_else(|| {
            Error::NotFound(format!(
                "column family {family:?} does not exist in table {}",
                self.name
            ))
        })
    }

    /// Is a cell of `family` written at clock value `hlc` hidden by a drop of that family?
    pub fn dropped(&self, family: &str, hlc: u64) -> bool {
        self.dropped_families
            .get(family)
            .is_some_and(|&at| hlc <= at)
    }
}

/// In-memory view of every table's schema, by name and by id.
#[derive(Debug, Default)]
pub struct Catalog {
    by_name: BTreeMap<String, Arc<TableSchema>>,
    by_id: HashMap<u64, Arc<TableSchema>>,
}

impl Catalog {
    pub fn insert(&mut self, schema: TableSchema) -> Arc<TableSchema> {
        let schema = Arc::new(schema);
        if let Some(old) = self.by_name.insert(schema.name.clone(), schema.clone()) {
            self.by_id.remove(&old.id);
        }
        self.by_id.insert(schema.id, schema.clone());
        schema
    }

    pub fn remove(&mut self, name: &str) -> Option<Arc<TableSchema>> {
        let old = self.by_name.remove(name)?;
        self.by_id.remove(&old.id);
        Some(old)
    }

    pub fn get(&self, name: &str) -> Option<&Arc<TableSchema>> {
        self.by_name.get(name)
    }

    pub fn by_id(&self, id: u64) -> Option<&Arc<TableSchema>> {
        self.by_id.get(&id)
    }

    /// Tablets of every table: each table is split into `splits + 1` key ranges.
    pub fn tablet_count(&self) -> usize {
        self.by_name.values().map(|t| t.splits.len() + 1).sum()
    }

    /// Tables of one instance (`projects/P/instances/I`), in name order.
    pub fn list(&self, instance: &str) -> impl Iterator<Item = &Arc<TableSchema>> {
        let prefix = format!("{instance}/tables/");
        self.by_name
            .range(prefix.clone()..)
            .take_while(move |(k, _)| k.starts_with(&prefix))
            .map(|(_, v)| v)
    }
}

/// `projects/P/instances/I`, validated.
pub fn parse_instance_name(name: &str) -> Result<(&str, &str)> {
    let parts: Vec<&str> = name.split('/').collect();
    match parts.as_slice() {
        ["projects", p, "instances", i] if valid_segment(p) && valid_segment(i) => Ok((p, i)),
        _ => Err(Error::InvalidArgument(format!(
            "invalid instance name {name:?}: expected projects/<project>/instances/<instance>"
        ))),
    }
}

/// `projects/P/instances/I/tables/T`, validated; returns the instance name and the table id.
pub fn parse_table_name(name: &str) -> Result<(&str, &str)> {
    let err = || {
        Error::InvalidArgument(format!(
            "invalid table name {name:?}: expected projects/<project>/instances/<instance>/tables/<table>"
        ))
    };
    let (instance, table) = name.rsplit_once("/tables/").ok_or_else(err)?;
    parse_instance_name(instance).map_err(|_| err())?;
    validate_table_id(table).map_err(|_| err())?;
    Ok((instance, table))
}

fn valid_segment(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:~".contains(&b))
}

/// Is `b` one of Bigtable's id characters `[-_.a-zA-Z0-9]`?
fn id_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.'
}

/// Table ids: `[_a-zA-Z0-9][-_.a-zA-Z0-9]*`, at most 50 characters.
pub fn validate_table_id(id: &str) -> Result<()> {
    let first_ok = id
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_');
    if first_ok && id.len() <= MAX_TABLE_ID_LEN && id.bytes().all(id_char) {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "invalid table id {id:?}: must match [_a-zA-Z0-9][-_.a-zA-Z0-9]* and be at most {MAX_TABLE_ID_LEN} characters"
        )))
    }
}

/// Column family ids: `[-_.a-zA-Z0-9]+`, at most 64 characters.
pub fn validate_family_id(id: &str) -> Result<()> {
    if !id.is_empty() && id.len() <= MAX_FAMILY_ID_LEN && id.bytes().all(id_char) {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "invalid column family id {id:?}: must match [-_.a-zA-Z0-9]+ and be at most {MAX_FAMILY_ID_LEN} characters"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse() {
        assert_eq!(
            parse_table_name("projects/p/instances/i/tables/t-1.x").unwrap(),
            ("projects/p/instances/i", "t-1.x")
        );
        for bad in [
            "projects/p/instances/i/tables/",
            "projects/p/instances/i/tables/-x",
            "projects//instances/i/tables/t",
            "p/instances/i/tables/t",
            "projects/p/instances/i/tables/t/x",
            "",
        ] {
            assert!(parse_table_name(bad).is_err(), "{bad}");
        }
        assert!(parse_instance_name("projects/p/instances/i").is_ok());
        assert!(parse_instance_name("projects/p/instances").is_err());
    }

    #[test]
    fn ids_validate() {
        assert!(validate_table_id("_a").is_ok());
        assert!(validate_table_id(&"a".repeat(50)).is_ok());
        assert!(validate_table_id(&"a".repeat(51)).is_err());
        assert!(validate_table_id(".a").is_err());
        assert!(validate_table_id("a b").is_err());
        assert!(validate_family_id("-cf.1_x").is_ok());
        assert!(validate_family_id("").is_err());
        assert!(validate_family_id("cf:x").is_err());
        assert!(validate_family_id(&"f".repeat(65)).is_err());
    }

    #[test]
    fn catalog_lists_one_instance() {
        let mut c = Catalog::default();
        for (id, name) in [
            (1, "projects/p/instances/i/tables/b"),
            (2, "projects/p/instances/i/tables/a"),
            (3, "projects/p/instances/i2/tables/a"),
        ] {
            c.insert(TableSchema {
                id,
                name: name.into(),
                families: BTreeMap::new(),
                dropped_families: BTreeMap::new(),
                deletion_protection: false,
                splits: vec![],
                created_micros: 0,
            });
        }
        let names: Vec<_> = c.list("projects/p/instances/i").map(|t| t.id).collect();
        assert_eq!(names, vec![2, 1]);
        assert_eq!(c.by_id(3).unwrap().name, "projects/p/instances/i2/tables/a");
        c.remove("projects/p/instances/i/tables/a");
        assert!(c.by_id(2).is_none());
    }
}
