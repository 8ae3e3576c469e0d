//! Table schemas and Bigtable resource names: what a table is (its column families, their GC
//! rules and aggregate kinds, its tablet boundaries), the pure legality check of
//! ModifyColumnFamilies, and the checks of table and family ids.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::aggregate::Aggregator;
use crate::error::{Error, Result};
use crate::gc::GcRule;
use crate::limits::MAX_FAMILIES_PER_TABLE;
use crate::range::RowRange;

/// Maximum length of a table id.
pub const MAX_TABLE_ID_LEN: usize = 50;
/// Maximum length of a column family id.
pub const MAX_FAMILY_ID_LEN: usize = 64;
/// Maximum number of tables per instance.
pub const MAX_TABLES_PER_INSTANCE: usize = 1000;

/// One change of ModifyColumnFamilies; a request's changes apply in order, all or none (see
/// [`TableSchema::with_family_changes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FamilyChange {
    Create {
        id: String,
        family: FamilySchema,
    },
    /// Replaces the GC rule. `aggregate`, when given, must equal the family's (value types
    /// are immutable).
    Update {
        id: String,
        gc_rule: Option<GcRule>,
        aggregate: Option<Aggregator>,
    },
    Drop {
        id: String,
    },
}

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
    /// Set on a table restored from a backup: where it came from, and whether its restore is
    /// still filling it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<RestoreInfo>,
}

/// Where a table restored from a backup came from (Bigtable's `Table.restore_info`), written
/// with the table's creation: a restore that never ended is recognised by its table alone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoreInfo {
    /// The backup restored, `projects/P/instances/I/clusters/C/backups/B`.
    pub backup: String,
    /// The table the backup was made of.
    pub source_table: String,
    /// The backup `backup` is a copy of, if it is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_backup: Option<String>,
    /// The backup's `start_time` and `end_time` (its point in time), microseconds.
    pub start_time_micros: i64,
    pub end_time_micros: i64,
    /// The restore's long-running operation while it is filling the table; None once it
    /// ended. Until then the table serves no data request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<String>,
}

impl TableSchema {
    /// The operation of the restore still filling this table, if one is.
    pub fn restoring(&self) -> Option<&str> {
        self.restore.as_ref().and_then(|r| r.operation.as_deref())
    }

    /// UNAVAILABLE while a restore fills the table: its data is not all there yet, and a
    /// write could be overwritten by the restore. Checked by every data request.
    pub fn check_serving(&self) -> Result<()> {
        match self.restoring() {
            None => Ok(()),
            Some(operation) => Err(Error::Unavailable(format!(
                "table {} is being restored from a backup (operation {operation}); it serves reads and writes once the restore is done",
                self.name
            ))),
        }
    }

    /// The instance of the table, `projects/P/instances/I` (its name up to `/tables/`).
    pub fn instance(&self) -> &str {
        self.name
            .rsplit_once("/tables/")
            .map_or(self.name.as_str(), |(instance, _)| instance)
    }

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

    /// The row ranges of the table's tablets, in key order: `splits + 1` ranges that cover
    /// every row key.
    pub fn tablet_ranges(&self) -> Vec<RowRange> {
        let mut ranges = Vec::with_capacity(self.splits.len() + 1);
        let mut start = bytes::Bytes::new();
        for split in &self.splits {
            let end = bytes::Bytes::copy_from_slice(split);
            ranges.push(RowRange::new(start, Some(end.clone())));
            start = end;
        }
        ranges.push(RowRange::new(start, None));
        ranges
    }

    /// The schema after ModifyColumnFamilies' `changes`, applied in order, or the error of the
    /// first illegal one (nothing applies then): creating an existing family, updating or
    /// dropping a missing one, changing a family's value type, dropping a family of a
    /// deletion-protected table, or ending with more families than a table may have.
    /// `drop_version` gives the clock value of each drop: cells of the family written at or
    /// before it stay dead even if a family of that name is created again.
    pub fn with_family_changes(
        &self,
        changes: &[FamilyChange],
        mut drop_version: impl FnMut() -> u64,
    ) -> Result<TableSchema> {
        let name = &self.name;
        let mut schema = self.clone();
        for change in changes {
            match change {
                FamilyChange::Create { id, family } => {
                    if schema.families.contains_key(id) {
                        return Err(Error::AlreadyExists(format!(
                            "column family {id:?} already exists in table {name}"
                        )));
                    }
                    schema.families.insert(id.clone(), family.clone());
                }
                FamilyChange::Update {
                    id,
                    gc_rule,
                    aggregate,
                } => {
                    let family = schema.families.get_mut(id).ok_or_else(|| {
                        Error::NotFound(format!("column family {id:?} not found in table {name}"))
                    })?;
                    if aggregate.is_some() && *aggregate != family.aggregate {
                        return Err(Error::InvalidArgument(format!(
                            "column family {id:?}: value_type cannot be changed after creation"
                        )));
                    }
                    family.gc_rule = gc_rule.clone();
                }
                FamilyChange::Drop { id } => {
                    if schema.deletion_protection {
                        return Err(Error::FailedPrecondition(format!(
                            "table {name} is protected against deletion; its column families cannot be dropped"
                        )));
                    }
                    if schema.families.remove(id).is_none() {
                        return Err(Error::NotFound(format!(
                            "column family {id:?} not found in table {name}"
                        )));
                    }
                    schema.dropped_families.insert(id.clone(), drop_version());
                }
            }
        }
        if schema.families.len() > MAX_FAMILIES_PER_TABLE {
            return Err(Error::FailedPrecondition(format!(
                "table {name} would have {} column families; the maximum is {}",
                schema.families.len(),
                MAX_FAMILIES_PER_TABLE
            )));
        }
        Ok(schema)
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

    fn table(families: &[&str], protected: bool) -> TableSchema {
        TableSchema {
            id: 1,
            name: "projects/p/instances/i/tables/t".into(),
            families: families
                .iter()
                .map(|f| {
                    (
                        f.to_string(),
                        FamilySchema {
                            gc_rule: None,
                            aggregate: None,
                        },
                    )
                })
                .collect(),
            dropped_families: BTreeMap::new(),
            deletion_protection: protected,
            splits: vec![],
            created_micros: 0,
            restore: None,
        }
    }

    fn create(id: &str) -> FamilyChange {
        FamilyChange::Create {
            id: id.into(),
            family: FamilySchema {
                gc_rule: None,
                aggregate: None,
            },
        }
    }

    #[test]
    fn family_changes_apply_in_order_or_not_at_all() {
        let t = table(&["a"], false);
        let mut drops = 100;
        let changed = t
            .with_family_changes(
                &[
                    create("b"),
                    FamilyChange::Update {
                        id: "b".into(),
                        gc_rule: Some(GcRule::MaxNumVersions(1)),
                        aggregate: None,
                    },
                    FamilyChange::Drop { id: "a".into() },
                    create("a"),
                ],
                || {
                    drops += 1;
                    drops
                },
            )
            .unwrap();
        assert_eq!(changed.families.len(), 2);
        assert_eq!(
            changed.families["b"].gc_rule,
            Some(GcRule::MaxNumVersions(1))
        );
        assert_eq!(changed.dropped_families["a"], 101);
        // Cells of the old `a` stay dead although a family `a` exists again.
        assert!(changed.dropped("a", 101) && !changed.dropped("a", 102));

        let fail = |changes: &[FamilyChange], t: &TableSchema| {
            t.with_family_changes(changes, || 1).unwrap_err()
        };
        assert!(matches!(fail(&[create("a")], &t), Error::AlreadyExists(_)));
        assert!(matches!(
            fail(&[FamilyChange::Drop { id: "x".into() }], &t),
            Error::NotFound(_)
        ));
        // A later illegal change fails the whole request.
        assert!(matches!(
            fail(&[create("b"), create("b")], &t),
            Error::AlreadyExists(_)
        ));
        assert!(matches!(
            fail(
                &[FamilyChange::Drop { id: "a".into() }],
                &table(&["a"], true)
            ),
            Error::FailedPrecondition(_)
        ));
        let aggregate = FamilyChange::Update {
            id: "a".into(),
            gc_rule: None,
            aggregate: Some(Aggregator::Sum),
        };
        assert!(matches!(fail(&[aggregate], &t), Error::InvalidArgument(_)));
        let many: Vec<FamilyChange> = (0..MAX_FAMILIES_PER_TABLE)
            .map(|i| create(&format!("f{i}")))
            .collect();
        assert!(matches!(fail(&many, &t), Error::FailedPrecondition(_)));
    }

    #[test]
    fn tablet_ranges_cover_the_table() {
        let mut t = table(&[], false);
        assert_eq!(t.tablet_ranges(), vec![RowRange::all()]);
        t.splits = vec![b"g".to_vec(), b"p".to_vec()];
        let r = t.tablet_ranges();
        assert_eq!(r.len(), 3);
        assert_eq!(
            r[0],
            RowRange::new(bytes::Bytes::new(), Some(bytes::Bytes::from_static(b"g")))
        );
        assert_eq!(r[2], RowRange::new(bytes::Bytes::from_static(b"p"), None));
    }
}
