//! Validation of a wire `RowFilter` (depth, size, Bigtable's rules) and its compilation into
//! the tree of [`super::evaluate`].

use std::ops::Bound;

use googleapis_tonic_google_bigtable_v2::google::bigtable::v2 as pb;
use pb::row_filter::Filter as F;

use super::evaluate::{ByteRange, Node};
use super::re2::compile_regex;
use super::{FilterError, MAX_FILTER_DEPTH, MAX_LABEL_LEN};

/// Rejects composites nested more than [`MAX_FILTER_DEPTH`] levels; `enclosing` is the number
/// of composites around `f`. Recursion stops at the limit.
pub(super) fn check_depth(f: &pb::RowFilter, enclosing: usize) -> Result<(), FilterError> {
    let children: Vec<&pb::RowFilter> = match &f.filter {
        Some(F::Chain(c)) => c.filters.iter().collect(),
        Some(F::Interleave(i)) => i.filters.iter().collect(),
        Some(F::Condition(c)) => [&c.predicate_filter, &c.true_filter, &c.false_filter]
            .into_iter()
            .flatten()
            .map(|b| b.as_ref())
            .collect(),
        _ => return Ok(()),
    };
    if enclosing + 1 > MAX_FILTER_DEPTH {
        return Err(FilterError::TooDeep {
            max: MAX_FILTER_DEPTH,
        });
    }
    children
        .into_iter()
        .try_for_each(|c| check_depth(c, enclosing + 1))
}

pub(super) struct Built {
    pub(super) node: Node,
    /// Whether an `apply_label_transformer` can label this node's output (predicates excluded).
    labels: bool,
}

impl Built {
    fn plain(node: Node) -> Built {
        Built {
            node,
            labels: false,
        }
    }
}

pub(super) fn build(f: &pb::RowFilter, in_condition: bool) -> Result<Built, FilterError> {
    let Some(filter) = &f.filter else {
        return Ok(Built::plain(Node::PassAll));
    };
    let node = match filter {
        F::Chain(chain) => {
            if chain.filters.len() < 2 {
                return Err(FilterError::TooFewSubFilters {
                    kind: "chain",
                    count: chain.filters.len(),
                });
            }
            let mut nodes = Vec::with_capacity(chain.filters.len());
            let mut labelled: Option<usize> = None;
            for (i, sub) in chain.filters.iter().enumerate() {
                let b = build(sub, in_condition)?;
                if b.labels {
                    if let Some(first) = labelled {
                        return Err(FilterError::MultipleLabelsInChain { first, second: i });
                    }
                    labelled = Some(i);
                }
                nodes.push(b.node);
            }
            return Ok(Built {
                node: Node::Chain(nodes),
                labels: labelled.is_some(),
            });
        }
        F::Interleave(interleave) => {
            if interleave.filters.len() < 2 {
                return Err(FilterError::TooFewSubFilters {
                    kind: "interleave",
                    count: interleave.filters.len(),
                });
            }
            let mut nodes = Vec::with_capacity(interleave.filters.len());
            let mut labels = false;
            for sub in &interleave.filters {
                let b = build(sub, in_condition)?;
                labels |= b.labels;
                nodes.push(b.node);
            }
            return Ok(Built {
                node: Node::Interleave(nodes),
                labels,
            });
        }
        F::Condition(cond) => {
            let predicate = match &cond.predicate_filter {
                Some(p) => build(p, true)?.node,
                None => Node::PassAll,
            };
            let on_true = cond
                .true_filter
                .as_deref()
                .map(|t| build(t, true))
                .transpose()?;
            let on_false = cond
                .false_filter
                .as_deref()
                .map(|f| build(f, true))
                .transpose()?;
            let labels = on_true.as_ref().is_some_and(|b| b.labels)
                || on_false.as_ref().is_some_and(|b| b.labels);
            return Ok(Built {
                node: Node::Condition {
                    predicate: Box::new(predicate),
                    on_true: on_true.map(|b| Box::new(b.node)),
                    on_false: on_false.map(|b| Box::new(b.node)),
                },
                labels,
            });
        }
        F::Sink(set) => {
            require_true(*set, "sink")?;
            if in_condition {
                return Err(FilterError::SinkInCondition);
            }
            Node::Sink
        }
        F::PassAllFilter(set) => {
            require_true(*set, "pass_all_filter")?;
            Node::PassAll
        }
        F::BlockAllFilter(set) => {
            require_true(*set, "block_all_filter")?;
            Node::BlockAll
        }
        F::RowKeyRegexFilter(re) => {
            // Production: "Error in field 'row_key_regex_filter' : argument must not be empty"
            // (google-cloud-go#6519).
            if re.is_empty() {
                return Err(FilterError::EmptyRegex {
                    field: "row_key_regex_filter",
                });
            }
            Node::RowKeyRegex(compile_regex("row_key_regex_filter", re)?)
        }
        F::RowSampleFilter(p) => {
            if !(*p > 0.0 && *p < 1.0) {
                return Err(FilterError::InvalidSampleProbability { value: *p });
            }
            Node::RowSample(*p)
        }
        F::FamilyNameRegexFilter(re) => {
            if re.contains(':') {
                return Err(FilterError::ColonInFamilyRegex {
                    pattern: re.clone(),
                });
            }
            Node::FamilyRegex(compile_regex("family_name_regex_filter", re.as_bytes())?)
        }
        F::ColumnQualifierRegexFilter(re) => {
            Node::QualifierRegex(compile_regex("column_qualifier_regex_filter", re)?)
        }
        F::ColumnRangeFilter(range) => {
            use pb::column_range::{EndQualifier as E, StartQualifier as S};
            if range.family_name.is_empty() {
                return Err(FilterError::MissingColumnRangeFamily);
            }
            let start = match &range.start_qualifier {
                None => Bound::Unbounded,
                Some(S::StartQualifierClosed(q)) => Bound::Included(q.clone()),
                Some(S::StartQualifierOpen(q)) => Bound::Excluded(q.clone()),
            };
            let end = match &range.end_qualifier {
                None => Bound::Unbounded,
                Some(E::EndQualifierClosed(q)) => Bound::Included(q.clone()),
                Some(E::EndQualifierOpen(q)) if q.is_empty() => Bound::Unbounded,
                Some(E::EndQualifierOpen(q)) => Bound::Excluded(q.clone()),
            };
            Node::ColumnRange {
                family: range.family_name.clone(),
                range: ByteRange { start, end },
            }
        }
        F::TimestampRangeFilter(range) => {
            // Bounds are compared at microsecond precision. Production Bigtable accepts any
            // microsecond bound (the official Java client sends [t, t+1) for an exact match;
            // google-cloud-go#9149 dropped its emulator's old "millisecond precision" check
            // for that reason).
            let (start, end) = (range.start_timestamp_micros, range.end_timestamp_micros);
            Node::TimestampRange {
                start,
                end: (end != 0).then_some(end),
            }
        }
        F::ValueRegexFilter(re) => Node::ValueRegex(compile_regex("value_regex_filter", re)?),
        F::ValueRangeFilter(range) => {
            use pb::value_range::{EndValue as E, StartValue as S};
            let start = match &range.start_value {
                None => Bound::Unbounded,
                Some(S::StartValueClosed(v)) => Bound::Included(v.clone()),
                Some(S::StartValueOpen(v)) => Bound::Excluded(v.clone()),
            };
            let end = match &range.end_value {
                None => Bound::Unbounded,
                Some(E::EndValueClosed(v)) => Bound::Included(v.clone()),
                Some(E::EndValueOpen(v)) if v.is_empty() => Bound::Unbounded,
                Some(E::EndValueOpen(v)) => Bound::Excluded(v.clone()),
            };
            Node::ValueRange(ByteRange { start, end })
        }
        F::CellsPerRowOffsetFilter(n) => {
            Node::CellsPerRowOffset(non_negative("cells_per_row_offset_filter", *n)?)
        }
        F::CellsPerRowLimitFilter(n) => {
            Node::CellsPerRowLimit(non_negative("cells_per_row_limit_filter", *n)?)
        }
        F::CellsPerColumnLimitFilter(n) => {
            Node::CellsPerColumnLimit(non_negative("cells_per_column_limit_filter", *n)?)
        }
        F::StripValueTransformer(set) => {
            require_true(*set, "strip_value_transformer")?;
            Node::StripValue
        }
        F::ApplyLabelTransformer(label) => {
            let valid = !label.is_empty()
                && label.len() <= MAX_LABEL_LEN
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
            if !valid {
                return Err(FilterError::InvalidLabel {
                    label: label.clone(),
                });
            }
            return Ok(Built {
                node: Node::ApplyLabel(label.clone()),
                labels: true,
            });
        }
    };
    Ok(Built::plain(node))
}

fn require_true(set: bool, field: &'static str) -> Result<(), FilterError> {
    if set {
        Ok(())
    } else {
        Err(FilterError::FlagFalse { field })
    }
}

fn non_negative(field: &'static str, value: i32) -> Result<usize, FilterError> {
    usize::try_from(value).map_err(|_| FilterError::NegativeCount { field, value })
}
