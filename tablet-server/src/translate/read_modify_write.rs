//! ReadModifyWriteRow: its rules, checked against the schema, and their application to the
//! current row (under the row's lock, in storage).

use bytes::Bytes;
use googleapis_tonic_google_bigtable_v2::google::bigtable::v2 as pb;

use super::{validate_family, validate_qualifier, validate_row_key};
use crate::error::{Error, Result};
use basalt_model::limits::{MAX_MUTATIONS, MAX_VALUE_BYTES};
use basalt_model::{Cell, Row, TableSchema};

/// One validated ReadModifyWriteRow rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RmwRule {
    pub family: String,
    pub qualifier: Bytes,
    pub op: RmwOp,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RmwOp {
    Append(Bytes),
    Increment(i64),
}

pub fn read_modify_write_rules(
    table: &TableSchema,
    row_key: &[u8],
    rules: &[pb::ReadModifyWriteRule],
) -> Result<Vec<RmwRule>> {
    use pb::read_modify_write_rule::Rule;
    validate_row_key(row_key)?;
    if rules.is_empty() {
        return Err(Error::InvalidArgument(
            "ReadModifyWriteRow needs at least one rule".into(),
        ));
    }
    if rules.len() > MAX_MUTATIONS {
        return Err(Error::InvalidArgument(format!(
            "{} rules given; the maximum is {MAX_MUTATIONS}",
            rules.len()
        )));
    }
    rules
        .iter()
        .enumerate()
        .map(|(i, r)| {
            validate_family(table, &r.family_name)?;
            if table.family(&r.family_name)?.aggregate.is_some() {
                return Err(Error::InvalidArgument(format!(
                    "column family {:?} is an aggregate family: use AddToCell instead of ReadModifyWriteRow",
                    r.family_name
                )));
            }
            validate_qualifier(&r.column_qualifier)?;
            let op = match &r.rule {
                Some(Rule::AppendValue(v)) => RmwOp::Append(v.clone()),
                Some(Rule::IncrementAmount(n)) => RmwOp::Increment(*n),
                None => {
                    return Err(Error::InvalidArgument(format!(
                        "rule {i} sets neither append_value nor increment_amount"
                    )));
                }
            };
            Ok(RmwRule {
                family: r.family_name.clone(),
                qualifier: r.column_qualifier.clone(),
                op,
            })
        })
        .collect()
}

/// Applies ReadModifyWriteRow rules, in order, to the latest cell of each column of `row`.
/// Returns the new cells (one per modified column, in Bigtable order): a missing cell counts
/// as empty / zero, the new timestamp is max(latest cell's timestamp, `now`).
pub fn apply_read_modify_write(row: &Row, rules: &[RmwRule], now: i64) -> Result<Vec<Cell>> {
    let mut columns: std::collections::BTreeMap<(String, Bytes), Cell> =
        std::collections::BTreeMap::new();
    for rule in rules {
        let key = (rule.family.clone(), rule.qualifier.clone());
        let current = match columns.get(&key) {
            Some(c) => Some(c.clone()),
            // Cells are newest first: the first one of the column is the latest.
            None => row
                .cells
                .iter()
                .find(|c| c.family == rule.family && c.qualifier == rule.qualifier)
                .cloned(),
        };
        let (old_value, old_ts) = match &current {
            Some(c) => (c.value.clone(), c.timestamp_micros),
            None => (Bytes::new(), i64::MIN),
        };
        let value = match &rule.op {
            RmwOp::Append(suffix) => {
                let mut v = Vec::with_capacity(old_value.len() + suffix.len());
                v.extend_from_slice(&old_value);
                v.extend_from_slice(suffix);
                if v.len() > MAX_VALUE_BYTES {
                    return Err(Error::InvalidArgument(format!(
                        "appending would make the cell {} bytes; the maximum is {MAX_VALUE_BYTES}",
                        v.len()
                    )));
                }
                Bytes::from(v)
            }
            RmwOp::Increment(delta) => {
                let old = if current.is_none() {
                    0
                } else {
                    let bytes: [u8; 8] = old_value.as_ref().try_into().map_err(|_| {
                        Error::FailedPrecondition(format!(
                            "cannot increment value of {} bytes (family={}, qualifier={}): increment needs a 64-bit big-endian integer (8 bytes)",
                            old_value.len(),
                            rule.family,
                            String::from_utf8_lossy(&rule.qualifier)
                        ))
                    })?;
                    i64::from_be_bytes(bytes)
                };
                Bytes::copy_from_slice(&old.wrapping_add(*delta).to_be_bytes())
            }
        };
        columns.insert(
            key,
            Cell {
                family: rule.family.clone(),
                qualifier: rule.qualifier.clone(),
                timestamp_micros: old_ts.max(now),
                value,
                labels: vec![],
            },
        );
    }
    Ok(columns.into_values().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::fixture::table;

    #[test]
    fn read_modify_write_rules_apply_in_order() {
        let t = table();
        let rule = |q: &str, op: RmwOp| RmwRule {
            family: "cf".into(),
            qualifier: Bytes::copy_from_slice(q.as_bytes()),
            op,
        };
        let row = Row {
            key: Bytes::from_static(b"r"),
            cells: vec![
                Cell {
                    family: "cf".into(),
                    qualifier: Bytes::from_static(b"n"),
                    timestamp_micros: 9_000_000,
                    value: Bytes::copy_from_slice(&5i64.to_be_bytes()),
                    labels: vec![],
                },
                Cell {
                    family: "cf".into(),
                    qualifier: Bytes::from_static(b"n"),
                    timestamp_micros: 1_000,
                    value: Bytes::from_static(b"old"),
                    labels: vec![],
                },
            ],
        };
        let out = apply_read_modify_write(
            &row,
            &[
                rule("n", RmwOp::Increment(2)),
                rule("s", RmwOp::Append(Bytes::from_static(b"ab"))),
                rule("n", RmwOp::Increment(-10)),
                rule("s", RmwOp::Append(Bytes::from_static(b"c"))),
            ],
            5_000_000,
        )
        .unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(&out[0].qualifier[..], b"n");
        assert_eq!(out[0].value[..], (-3i64).to_be_bytes());
        assert_eq!(out[0].timestamp_micros, 9_000_000, "max(existing, now)");
        assert_eq!(&out[1].value[..], b"abc");
        assert_eq!(out[1].timestamp_micros, 5_000_000);
        let bad = Row {
            key: Bytes::from_static(b"r"),
            cells: vec![Cell {
                family: "cf".into(),
                qualifier: Bytes::from_static(b"n"),
                timestamp_micros: 0,
                value: Bytes::from_static(b"1"),
                labels: vec![],
            }],
        };
        let err = apply_read_modify_write(&bad, &[rule("n", RmwOp::Increment(1))], 0).unwrap_err();
        assert_eq!(err.code(), basalt_model::Code::FailedPrecondition);
        assert_eq!(
            read_modify_write_rules(&t, b"r", &[]).unwrap_err().code(),
            basalt_model::Code::InvalidArgument
        );
    }
}
