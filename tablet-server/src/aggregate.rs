//! Aggregate column families: cells that combine inputs at write time (Sum, Min, Max over
//! 64-bit big-endian integers), stored with a RocksDB merge operator.
//!
//! An AddToCell or MergeToCell becomes a merge operand on the cell's key; RocksDB folds the
//! operands into the stored state (on reads, flushes and compactions) with [`full_merge`], the
//! same function the write path uses to fold operands into a value written earlier in the
//! same batch. Reads see the state: an 8-byte big-endian signed integer.

use serde::{Deserialize, Serialize};

use crate::encoding::{self, ValueKind};
use crate::hlc::Version;

/// The aggregation function of a family (its `value_type`), immutable once created.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Aggregator {
    Sum,
    Min,
    Max,
}

impl Aggregator {
    fn code(self) -> u8 {
        match self {
            Aggregator::Sum => 1,
            Aggregator::Min => 2,
            Aggregator::Max => 3,
        }
    }

    fn from_code(code: u8) -> Option<Aggregator> {
        match code {
            1 => Some(Aggregator::Sum),
            2 => Some(Aggregator::Min),
            3 => Some(Aggregator::Max),
            _ => None,
        }
    }

    pub fn combine(self, a: i64, b: i64) -> i64 {
        match self {
            // Bigtable's Sum wraps on overflow like two's-complement int64 arithmetic.
            Aggregator::Sum => a.wrapping_add(b),
            Aggregator::Min => a.min(b),
            Aggregator::Max => a.max(b),
        }
    }
}

/// A merge operand: `version | kind=MergeOperand | aggregator:u8 | input:i64be`.
pub fn operand(version: Version, aggregator: Aggregator, input: i64) -> Vec<u8> {
    let mut payload = [0u8; 9];
    payload[0] = aggregator.code();
    payload[1..].copy_from_slice(&input.to_be_bytes());
    encoding::encode_value(version, ValueKind::MergeOperand, &payload)
}

fn decode_operand(v: &[u8]) -> Option<(Version, Aggregator, i64)> {
    let (version, kind, payload) = encoding::decode_value(v)?;
    if kind != ValueKind::MergeOperand || payload.len() != 9 {
        return None;
    }
    let aggregator = Aggregator::from_code(payload[0])?;
    let input = i64::from_be_bytes(payload[1..].try_into().ok()?);
    Some((version, aggregator, input))
}

/// The state held by a stored value, if it is a live aggregate (or an 8-byte plain value).
fn decode_state(v: &[u8]) -> Option<(Version, i64)> {
    let (version, kind, payload) = encoding::decode_value(v)?;
    match kind {
        ValueKind::Aggregate | ValueKind::Plain => {
            Some((version, i64::from_be_bytes(payload.try_into().ok()?)))
        }
        ValueKind::Tombstone | ValueKind::MergeOperand => None,
    }
}

/// Folds `operands` (oldest first) into `existing`. Returns the new stored value. Operands
/// that cannot be decoded are skipped (they cannot be produced by this server).
pub fn full_merge<'a>(
    existing: Option<&[u8]>,
    operands: impl IntoIterator<Item = &'a [u8]>,
) -> Vec<u8> {
    let mut state = existing.and_then(decode_state);
    for op in operands {
        let Some((version, aggregator, input)) = decode_operand(op) else {
            continue;
        };
        state = Some(match state {
            None => (version, input),
            Some((v, s)) => (v.max(version), aggregator.combine(s, input)),
        });
    }
    let (version, value) = state.unwrap_or_default();
    encoding::encode_value(version, ValueKind::Aggregate, &value.to_be_bytes())
}

/// Combines operands (oldest first) into one operand, when they agree on the aggregator.
pub fn partial_merge<'a>(operands: impl IntoIterator<Item = &'a [u8]>) -> Option<Vec<u8>> {
    let mut acc: Option<(Version, Aggregator, i64)> = None;
    for op in operands {
        let (version, aggregator, input) = decode_operand(op)?;
        acc = Some(match acc {
            None => (version, aggregator, input),
            Some((v, a, s)) if a == aggregator => (v.max(version), a, a.combine(s, input)),
            Some(_) => return None,
        });
    }
    acc.map(|(v, a, s)| operand(v, a, s))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(hlc: u64) -> Version {
        Version { hlc, cluster: 0 }
    }

    fn state(value: &[u8]) -> (Version, i64) {
        decode_state(value).unwrap()
    }

    #[test]
    fn sum_min_max_fold() {
        let ops = [
            operand(v(1), Aggregator::Sum, 5),
            operand(v(2), Aggregator::Sum, -7),
        ];
        let out = full_merge(None, ops.iter().map(Vec::as_slice));
        assert_eq!(state(&out), (v(2), -2));
        let more = [operand(v(3), Aggregator::Sum, 10)];
        assert_eq!(
            state(&full_merge(Some(&out), more.iter().map(Vec::as_slice))),
            (v(3), 8)
        );

        let ops = [
            operand(v(1), Aggregator::Min, 5),
            operand(v(2), Aggregator::Min, -7),
            operand(v(3), Aggregator::Min, 3),
        ];
        assert_eq!(
            state(&full_merge(None, ops.iter().map(Vec::as_slice))).1,
            -7
        );
        let ops = [
            operand(v(1), Aggregator::Max, 5),
            operand(v(2), Aggregator::Max, -7),
        ];
        assert_eq!(state(&full_merge(None, ops.iter().map(Vec::as_slice))).1, 5);
        let wrap = [
            operand(v(1), Aggregator::Sum, i64::MAX),
            operand(v(2), Aggregator::Sum, 1),
        ];
        assert_eq!(
            state(&full_merge(None, wrap.iter().map(Vec::as_slice))).1,
            i64::MIN
        );
    }

    #[test]
    fn partial_merge_matches_full_merge() {
        let ops = [
            operand(v(1), Aggregator::Sum, 5),
            operand(v(4), Aggregator::Sum, 6),
            operand(v(2), Aggregator::Sum, 7),
        ];
        let combined = partial_merge(ops.iter().map(Vec::as_slice)).unwrap();
        let direct = full_merge(None, ops.iter().map(Vec::as_slice));
        assert_eq!(full_merge(None, [combined.as_slice()]), direct);
        let mixed = [
            operand(v(1), Aggregator::Sum, 5),
            operand(v(2), Aggregator::Max, 6),
        ];
        assert_eq!(partial_merge(mixed.iter().map(Vec::as_slice)), None);
    }

    #[test]
    fn merging_after_a_tombstone_starts_from_zero() {
        let tomb = encoding::encode_value(v(9), ValueKind::Tombstone, &[]);
        let ops = [operand(v(10), Aggregator::Sum, 3)];
        assert_eq!(
            state(&full_merge(Some(&tomb), ops.iter().map(Vec::as_slice))),
            (v(10), 3)
        );
    }
}
