//! The mutations of MutateRow, MutateRows and CheckAndMutateRow: checked against the limits
//! and the schema, converted to [`basalt_model::Mutation`]s.

use googleapis_tonic_google_bigtable_v2::google::bigtable::v2 as pb;

use super::{validate_family, validate_qualifier, validate_row_key, validate_timestamp};
use crate::error::{Error, Result};
use basalt_model::aggregate::Aggregator;
use basalt_model::limits::{MAX_MUTATIONS, MAX_VALUE_BYTES};
use basalt_model::{Mutation, TableSchema};

/// Validates and converts the mutations of one row. `server_ts` replaces `-1` timestamps so
/// that every server-timestamped cell of a request gets the same time.
pub fn row_mutations(
    table: &TableSchema,
    row_key: &[u8],
    mutations: &[pb::Mutation],
    server_ts: i64,
) -> Result<Vec<Mutation>> {
    validate_row_key(row_key)?;
    if mutations.is_empty() {
        return Err(Error::InvalidArgument(
            "No mutations provided: a row mutation needs at least one mutation".into(),
        ));
    }
    if mutations.len() > MAX_MUTATIONS {
        return Err(Error::InvalidArgument(format!(
            "{} mutations given; the maximum is {MAX_MUTATIONS}",
            mutations.len()
        )));
    }
    use pb::mutation::Mutation as M;
    let mut out = Vec::with_capacity(mutations.len());
    for (i, m) in mutations.iter().enumerate() {
        let converted = match &m.mutation {
            None => {
                return Err(Error::InvalidArgument(format!(
                    "mutation {i} is empty: set one of set_cell, delete_from_column, delete_from_family, delete_from_row"
                )));
            }
            Some(M::SetCell(s)) => {
                validate_family(table, &s.family_name)?;
                if table.family(&s.family_name)?.aggregate.is_some() {
                    return Err(Error::InvalidArgument(format!(
                        "column family {:?} is an aggregate family: write it with AddToCell or MergeToCell, not SetCell",
                        s.family_name
                    )));
                }
                validate_qualifier(&s.column_qualifier)?;
                if s.value.len() > MAX_VALUE_BYTES {
                    return Err(Error::InvalidArgument(format!(
                        "cell value is {} bytes; the maximum is {MAX_VALUE_BYTES} bytes",
                        s.value.len()
                    )));
                }
                let timestamp = if s.timestamp_micros == -1 {
                    server_ts
                } else {
                    validate_timestamp("timestamp_micros", s.timestamp_micros)?;
                    s.timestamp_micros
                };
                Mutation::SetCell {
                    family: s.family_name.clone(),
                    qualifier: s.column_qualifier.clone(),
                    timestamp,
                    value: s.value.clone(),
                }
            }
            Some(M::DeleteFromColumn(d)) => {
                validate_family(table, &d.family_name)?;
                validate_qualifier(&d.column_qualifier)?;
                let (start, end) = match &d.time_range {
                    None => (0, i64::MAX),
                    Some(r) => {
                        validate_timestamp(
                            "time_range.start_timestamp_micros",
                            r.start_timestamp_micros,
                        )?;
                        validate_timestamp(
                            "time_range.end_timestamp_micros",
                            r.end_timestamp_micros,
                        )?;
                        let end = if r.end_timestamp_micros == 0 {
                            i64::MAX
                        } else {
                            r.end_timestamp_micros
                        };
                        if r.start_timestamp_micros > end {
                            return Err(Error::InvalidArgument(format!(
                                "time_range start {} is after its end {}",
                                r.start_timestamp_micros, r.end_timestamp_micros
                            )));
                        }
                        (r.start_timestamp_micros, end)
                    }
                };
                Mutation::DeleteFromColumn {
                    family: d.family_name.clone(),
                    qualifier: d.column_qualifier.clone(),
                    start,
                    end,
                }
            }
            Some(M::DeleteFromFamily(d)) => {
                validate_family(table, &d.family_name)?;
                Mutation::DeleteFromFamily {
                    family: d.family_name.clone(),
                }
            }
            Some(M::DeleteFromRow(_)) => Mutation::DeleteFromRow,
            Some(M::AddToCell(a)) => aggregate_mutation(
                table,
                "AddToCell",
                &a.family_name,
                &a.column_qualifier,
                &a.timestamp,
                &a.input,
                server_ts,
            )?,
            Some(M::MergeToCell(a)) => {
                if a.input.as_ref().is_none_or(|v| v.kind.is_none()) {
                    // Merging NULL is allowed and has no effect.
                    aggregate_target(table, "MergeToCell", &a.family_name)?;
                    continue;
                }
                aggregate_mutation(
                    table,
                    "MergeToCell",
                    &a.family_name,
                    &a.column_qualifier,
                    &a.timestamp,
                    &a.input,
                    server_ts,
                )?
            }
        };
        out.push(converted);
    }
    Ok(out)
}

/// The aggregator of `family`, which must be an aggregate family.
fn aggregate_target(table: &TableSchema, what: &str, family: &str) -> Result<Aggregator> {
    validate_family(table, family)?;
    table.family(family)?.aggregate.ok_or_else(|| {
        Error::InvalidArgument(format!(
            "{what} needs an aggregate column family; {family:?} is not one"
        ))
    })
}

/// Converts an AddToCell / MergeToCell (their fields have the same shape; for Sum, Min and Max
/// the state type equals the input type, Int64).
fn aggregate_mutation(
    table: &TableSchema,
    what: &str,
    family: &str,
    qualifier: &Option<pb::Value>,
    timestamp: &Option<pb::Value>,
    input: &Option<pb::Value>,
    server_ts: i64,
) -> Result<Mutation> {
    use pb::value::Kind;
    let aggregator = aggregate_target(table, what, family)?;
    let qualifier = match qualifier.as_ref().and_then(|v| v.kind.as_ref()) {
        Some(Kind::RawValue(q)) => q.clone(),
        _ => {
            return Err(Error::InvalidArgument(format!(
                "{what}: column_qualifier must be a raw_value"
            )));
        }
    };
    validate_qualifier(&qualifier)?;
    let timestamp = match timestamp.as_ref().and_then(|v| v.kind.as_ref()) {
        Some(Kind::RawTimestampMicros(-1)) => server_ts,
        Some(Kind::RawTimestampMicros(ts)) => {
            validate_timestamp("timestamp", *ts)?;
            *ts
        }
        _ => {
            return Err(Error::InvalidArgument(format!(
                "{what}: timestamp must be a raw_timestamp_micros"
            )));
        }
    };
    if aggregator == Aggregator::Hll {
        if what == "MergeToCell" {
            return Err(Error::InvalidArgument(format!(
                "MergeToCell into HyperLogLog++ family {family:?}: its state has no public format to merge; use AddToCell"
            )));
        }
        // Any input counts; its bytes are hashed (an int_value as its 8 big-endian bytes, so
        // the same number sent raw or as an int counts once).
        let hashed = match input.as_ref().and_then(|v| v.kind.as_ref()) {
            Some(Kind::RawValue(b)) | Some(Kind::BytesValue(b)) => basalt_model::hll::hash(b),
            Some(Kind::StringValue(s)) => basalt_model::hll::hash(s.as_bytes()),
            Some(Kind::IntValue(n)) => basalt_model::hll::hash(&n.to_be_bytes()),
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "{what}: input for HyperLogLog++ family {family:?} must be a raw, bytes, string or int value"
                )));
            }
        };
        return Ok(Mutation::Aggregate {
            family: family.to_string(),
            qualifier,
            timestamp,
            aggregator,
            input: hashed as i64,
        });
    }
    let input = match input.as_ref().and_then(|v| v.kind.as_ref()) {
        Some(Kind::IntValue(n)) => *n,
        // MergeToCell carries the accumulator state; for Sum/Min/Max that is the encoded Int64
        // (8 bytes big-endian), which clients send as raw or bytes values (the Go client's
        // MergeBytesToCell uses raw_value).
        Some(Kind::RawValue(b)) | Some(Kind::BytesValue(b))
            if what == "MergeToCell" && b.len() == 8 =>
        {
            i64::from_be_bytes(b[..].try_into().expect("length checked"))
        }
        _ => {
            return Err(Error::InvalidArgument(format!(
                "{what}: input must be an int_value (MergeToCell: or the 8-byte big-endian state) for the {aggregator:?} aggregate of family {family:?}"
            )));
        }
    };
    Ok(Mutation::Aggregate {
        family: family.to_string(),
        qualifier,
        timestamp,
        aggregator,
        input,
    })
}

/// Bytes a mutation list adds to the store (for metrics).
pub fn mutation_bytes(mutations: &[Mutation]) -> u64 {
    mutations
        .iter()
        .map(|m| match m {
            Mutation::SetCell {
                family,
                qualifier,
                value,
                ..
            } => (family.len() + qualifier.len() + value.len() + 8) as u64,
            Mutation::Aggregate {
                family, qualifier, ..
            } => (family.len() + qualifier.len() + 16) as u64,
            _ => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::fixture::table;
    use crate::translate::server_timestamp;
    use basalt_model::FamilySchema;
    use bytes::Bytes;
    use pb::mutation::{self, Mutation as M};

    fn set(family: &str, q: &[u8], ts: i64, v: &[u8]) -> pb::Mutation {
        pb::Mutation {
            mutation: Some(M::SetCell(mutation::SetCell {
                family_name: family.into(),
                column_qualifier: Bytes::copy_from_slice(q),
                timestamp_micros: ts,
                value: Bytes::copy_from_slice(v),
            })),
        }
    }

    fn code(r: Result<Vec<Mutation>>) -> basalt_model::Code {
        r.unwrap_err().code()
    }

    #[test]
    fn limits_and_bad_input() {
        let t = table();
        let ok = [set("cf", b"q", 1000, b"v")];
        assert!(row_mutations(&t, b"r", &ok, 0).is_ok());
        assert_eq!(
            code(row_mutations(&t, b"", &ok, 0)),
            basalt_model::Code::InvalidArgument
        );
        assert!(row_mutations(&t, &[b'k'; 4096], &ok, 0).is_ok());
        assert_eq!(
            code(row_mutations(&t, &[b'k'; 4097], &ok, 0)),
            basalt_model::Code::InvalidArgument
        );
        assert_eq!(
            code(row_mutations(&t, b"r", &[], 0)),
            basalt_model::Code::InvalidArgument
        );
        assert_eq!(
            code(row_mutations(&t, b"r", &[set("nope", b"q", 1000, b"v")], 0)),
            basalt_model::Code::NotFound
        );
        assert_eq!(
            code(row_mutations(&t, b"r", &[set("cf", b"q", 1001, b"v")], 0)),
            basalt_model::Code::InvalidArgument
        );
        assert_eq!(
            code(row_mutations(&t, b"r", &[set("cf", b"q", -2, b"v")], 0)),
            basalt_model::Code::InvalidArgument
        );
        assert!(row_mutations(&t, b"r", &[set("cf", &[0; 16384], 0, b"")], 0).is_ok());
        assert_eq!(
            code(row_mutations(
                &t,
                b"r",
                &[set("cf", &[0; 16385], 0, b"")],
                0
            )),
            basalt_model::Code::InvalidArgument
        );
        let many = vec![set("cf", b"q", 0, b""); MAX_MUTATIONS + 1];
        assert_eq!(
            code(row_mutations(&t, b"r", &many, 0)),
            basalt_model::Code::InvalidArgument
        );
        assert_eq!(
            code(row_mutations(
                &t,
                b"r",
                &[pb::Mutation { mutation: None }],
                0
            )),
            basalt_model::Code::InvalidArgument
        );
    }

    #[test]
    fn server_timestamps_are_replaced() {
        let t = table();
        let m = row_mutations(&t, b"r", &[set("cf", b"q", -1, b"v")], 42_000).unwrap();
        assert!(matches!(
            &m[0],
            Mutation::SetCell {
                timestamp: 42_000,
                ..
            }
        ));
        assert_eq!(server_timestamp() % 1000, 0);
    }

    #[test]
    fn delete_ranges_are_checked() {
        let t = table();
        let del = |s, e| pb::Mutation {
            mutation: Some(M::DeleteFromColumn(mutation::DeleteFromColumn {
                family_name: "cf".into(),
                column_qualifier: Bytes::from_static(b"q"),
                time_range: Some(pb::TimestampRange {
                    start_timestamp_micros: s,
                    end_timestamp_micros: e,
                }),
            })),
        };
        let m = row_mutations(&t, b"r", &[del(1000, 0)], 0).unwrap();
        assert!(matches!(
            &m[0],
            Mutation::DeleteFromColumn {
                start: 1000,
                end: i64::MAX,
                ..
            }
        ));
        assert_eq!(
            code(row_mutations(&t, b"r", &[del(5000, 2000)], 0)),
            basalt_model::Code::InvalidArgument
        );
        assert_eq!(
            code(row_mutations(&t, b"r", &[del(1500, 0)], 0)),
            basalt_model::Code::InvalidArgument
        );
    }

    #[test]
    fn aggregate_mutations_are_checked() {
        use basalt_model::aggregate::Aggregator;
        let mut t = table();
        t.families.insert(
            "agg".into(),
            FamilySchema {
                gc_rule: None,
                aggregate: Some(Aggregator::Sum),
            },
        );
        let raw = |b: &'static [u8]| {
            Some(pb::Value {
                kind: Some(pb::value::Kind::RawValue(Bytes::from_static(b))),
                ..Default::default()
            })
        };
        let ts = |t: i64| {
            Some(pb::Value {
                kind: Some(pb::value::Kind::RawTimestampMicros(t)),
                ..Default::default()
            })
        };
        let int = |n: i64| {
            Some(pb::Value {
                kind: Some(pb::value::Kind::IntValue(n)),
                ..Default::default()
            })
        };
        let add = |family: &str, q, t, input| pb::Mutation {
            mutation: Some(M::AddToCell(mutation::AddToCell {
                family_name: family.into(),
                column_qualifier: q,
                timestamp: t,
                input,
            })),
        };
        let m = row_mutations(&t, b"r", &[add("agg", raw(b"q"), ts(2000), int(5))], 0).unwrap();
        assert_eq!(
            m,
            vec![Mutation::Aggregate {
                family: "agg".into(),
                qualifier: Bytes::from_static(b"q"),
                timestamp: 2000,
                aggregator: Aggregator::Sum,
                input: 5
            }]
        );
        for bad in [
            add("cf", raw(b"q"), ts(2000), int(5)),
            add("agg", None, ts(2000), int(5)),
            add("agg", raw(b"q"), ts(2001), int(5)),
            add("agg", raw(b"q"), ts(2000), raw(b"12345678")),
            set("agg", b"q", 1000, b"v"),
        ] {
            assert_eq!(
                code(row_mutations(&t, b"r", &[bad], 0)),
                basalt_model::Code::InvalidArgument
            );
        }
        assert_eq!(
            code(row_mutations(
                &t,
                b"r",
                &[add("nope", raw(b"q"), ts(0), int(1))],
                0
            )),
            basalt_model::Code::NotFound
        );
        let merge_null = pb::Mutation {
            mutation: Some(M::MergeToCell(mutation::MergeToCell {
                family_name: "agg".into(),
                column_qualifier: raw(b"q"),
                timestamp: ts(0),
                input: Some(pb::Value::default()),
            })),
        };
        assert_eq!(row_mutations(&t, b"r", &[merge_null], 0).unwrap(), vec![]);
    }

    fn arb_value() -> impl proptest::strategy::Strategy<Value = Option<pb::Value>> {
        use pb::value::Kind;
        use proptest::prelude::*;
        prop_oneof![
            Just(None),
            any::<i64>().prop_map(|n| Some(pb::Value {
                kind: Some(Kind::IntValue(n)),
                ..Default::default()
            })),
            proptest::collection::vec(any::<u8>(), 0..20).prop_map(|b| Some(pb::Value {
                kind: Some(Kind::RawValue(b.into())),
                ..Default::default()
            })),
            prop_oneof![Just(-1i64), Just(0), Just(1000), Just(1001), any::<i64>()].prop_map(|t| {
                Some(pb::Value {
                    kind: Some(Kind::RawTimestampMicros(t)),
                    ..Default::default()
                })
            }),
        ]
    }

    fn arb_mutation() -> impl proptest::strategy::Strategy<Value = pb::Mutation> {
        use proptest::prelude::*;
        let family = prop_oneof![
            Just("cf".to_string()),
            Just("agg".to_string()),
            Just("".to_string()),
            "[a-z:]{1,3}"
        ];
        let bytes = proptest::collection::vec(any::<u8>(), 0..24).prop_map(Bytes::from);
        let ts = prop_oneof![
            Just(-1i64),
            Just(0),
            Just(5000),
            Just(1001),
            Just(-7),
            any::<i64>()
        ];
        prop_oneof![
            (family.clone(), bytes.clone(), ts.clone(), bytes.clone()).prop_map(|(f, q, t, v)| {
                pb::Mutation {
                    mutation: Some(M::SetCell(mutation::SetCell {
                        family_name: f,
                        column_qualifier: q,
                        timestamp_micros: t,
                        value: v,
                    })),
                }
            }),
            (
                family.clone(),
                bytes.clone(),
                proptest::option::of((ts.clone(), ts))
            )
                .prop_map(|(f, q, r)| pb::Mutation {
                    mutation: Some(M::DeleteFromColumn(mutation::DeleteFromColumn {
                        family_name: f,
                        column_qualifier: q,
                        time_range: r.map(|(s, e)| pb::TimestampRange {
                            start_timestamp_micros: s,
                            end_timestamp_micros: e
                        }),
                    })),
                }),
            family.clone().prop_map(|f| pb::Mutation {
                mutation: Some(M::DeleteFromFamily(mutation::DeleteFromFamily {
                    family_name: f
                })),
            }),
            Just(pb::Mutation {
                mutation: Some(M::DeleteFromRow(mutation::DeleteFromRow {}))
            }),
            Just(pb::Mutation { mutation: None }),
            (family.clone(), arb_value(), arb_value(), arb_value()).prop_map(|(f, q, t, i)| {
                pb::Mutation {
                    mutation: Some(M::AddToCell(mutation::AddToCell {
                        family_name: f,
                        column_qualifier: q,
                        timestamp: t,
                        input: i,
                    })),
                }
            }),
            (family, arb_value(), arb_value(), arb_value()).prop_map(|(f, q, t, i)| pb::Mutation {
                mutation: Some(M::MergeToCell(mutation::MergeToCell {
                    family_name: f,
                    column_qualifier: q,
                    timestamp: t,
                    input: i
                })),
            }),
        ]
    }

    proptest::proptest! {
        /// Mutation validation never panics, and whatever it accepts satisfies the storage
        /// layer's invariants (known families of the right kind, aligned non-negative
        /// timestamps, resolved server time, sane ranges, limits).
        #[test]
        fn validation_accepts_only_well_formed_mutations(
            key in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..8),
            muts in proptest::collection::vec(arb_mutation(), 0..6),
        ) {
            use basalt_model::aggregate::Aggregator;
            let mut t = table();
            t.families.insert("agg".into(), FamilySchema { gc_rule: None, aggregate: Some(Aggregator::Max) });
            let server_ts = 7_000;
            match row_mutations(&t, &key, &muts, server_ts) {
                Err(e) => proptest::prop_assert!(matches!(
                    e.code(),
                    basalt_model::Code::InvalidArgument | basalt_model::Code::NotFound
                )),
                Ok(out) => {
                    proptest::prop_assert!(!key.is_empty());
                    proptest::prop_assert!(out.len() <= muts.len());
                    for m in out {
                        match m {
                            Mutation::SetCell { family, timestamp, .. } => {
                                proptest::prop_assert_eq!(family.as_str(), "cf");
                                proptest::prop_assert!(timestamp >= 0 && timestamp % 1000 == 0);
                            }
                            Mutation::Aggregate { family, timestamp, aggregator, .. } => {
                                proptest::prop_assert_eq!(family.as_str(), "agg");
                                proptest::prop_assert_eq!(aggregator, Aggregator::Max);
                                proptest::prop_assert!(timestamp >= 0 && timestamp % 1000 == 0);
                            }
                            Mutation::DeleteFromColumn { family, start, end, .. } => {
                                proptest::prop_assert!(t.families.contains_key(&family));
                                proptest::prop_assert!(0 <= start && start <= end);
                            }
                            Mutation::DeleteFromFamily { family } => {
                                proptest::prop_assert!(t.families.contains_key(&family));
                            }
                            Mutation::DeleteFromRow => {}
                            Mutation::AggregateParts { .. } => {
                                proptest::prop_assert!(false, "a client never sends parts");
                            }
                        }
                    }
                }
            }
        }
    }
}
