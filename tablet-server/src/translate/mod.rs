//! Request translation: Google's data-API messages checked against Bigtable's limits and the
//! table's schema, and turned into the model's types (row sets, mutations, read-modify-write
//! rules, GC rules). Pure: it decides what storage will do, or which status code and message
//! the client gets.
//!
//! * [`mutations`]: `Mutation`s of MutateRow(s) and CheckAndMutateRow;
//! * [`row_set`]: a ReadRows `RowSet` as a [`basalt_model::RowSet`] over row keys;
//! * [`read_modify_write`]: ReadModifyWriteRow's rules and their application to a row;
//! * [`gc_rule`]: the table admin API's GC rules.

use bytes::Bytes;

use crate::error::{Error, Result};
use basalt_model::TableSchema;
use basalt_model::hlc::now_micros;
use basalt_model::limits::{MAX_QUALIFIER_BYTES, MAX_ROW_KEY_BYTES, MILLIS};

pub mod gc_rule;
pub mod mutations;
pub mod read_modify_write;
pub mod row_set;

pub use mutations::{mutation_bytes, row_mutations};
pub use read_modify_write::{RmwOp, RmwRule, apply_read_modify_write, read_modify_write_rules};
pub use row_set::row_set;

pub fn validate_row_key(key: &[u8]) -> Result<()> {
    if key.is_empty() {
        // Bigtable's own wording, which clients and users match on.
        return Err(Error::InvalidArgument("Row keys must be non-empty".into()));
    }
    if key.len() > MAX_ROW_KEY_BYTES {
        return Err(Error::InvalidArgument(format!(
            "row key is {} bytes; the maximum is {MAX_ROW_KEY_BYTES} bytes",
            key.len()
        )));
    }
    Ok(())
}

fn validate_family(table: &TableSchema, family: &str) -> Result<()> {
    if family.is_empty() {
        return Err(Error::InvalidArgument(
            "mutation has an empty column family name".into(),
        ));
    }
    table.family(family).map(|_| ())
}

fn validate_qualifier(qualifier: &[u8]) -> Result<()> {
    if qualifier.len() > MAX_QUALIFIER_BYTES {
        return Err(Error::InvalidArgument(format!(
            "column qualifier is {} bytes; the maximum is {MAX_QUALIFIER_BYTES} bytes",
            qualifier.len()
        )));
    }
    Ok(())
}

fn validate_timestamp(what: &str, ts: i64) -> Result<()> {
    if ts < 0 {
        return Err(Error::InvalidArgument(format!(
            "{what} {ts} is negative; timestamps are microseconds since the epoch"
        )));
    }
    if ts % MILLIS != 0 {
        return Err(Error::InvalidArgument(format!(
            "{what} {ts} is not a multiple of 1000: the table's timestamp granularity is MILLIS"
        )));
    }
    Ok(())
}

/// The server time used for `timestamp_micros = -1`, aligned on the table's granularity.
pub fn server_timestamp() -> i64 {
    let now = now_micros();
    now - now % MILLIS
}

/// The row key as bytes for messages.
pub fn printable(key: &Bytes) -> String {
    String::from_utf8_lossy(key).into_owned()
}

#[cfg(test)]
pub(crate) mod fixture {
    use std::collections::BTreeMap;

    use basalt_model::{FamilySchema, TableSchema};

    /// A table with one plain family `cf`.
    pub fn table() -> TableSchema {
        let mut families = BTreeMap::new();
        families.insert(
            "cf".to_string(),
            FamilySchema {
                gc_rule: None,
                aggregate: None,
            },
        );
        TableSchema {
            id: 5,
            name: "projects/p/instances/i/tables/t".into(),
            families,
            dropped_families: BTreeMap::new(),
            deletion_protection: false,
            splits: vec![],
            created_micros: 0,
            restore: None,
        }
    }
}
