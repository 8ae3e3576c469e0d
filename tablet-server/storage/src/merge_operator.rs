//! Aggregate column families: cells that combine inputs at write time (Sum, Min, Max over
//! 64-bit big-endian integers; HyperLogLog++ unique counts over any input), stored with a
//! RocksDB merge operator.
//!
//! An AddToCell or MergeToCell becomes a merge operand on the cell's key; RocksDB folds the
//! operands into the stored state (on reads, flushes and compactions) with [`full_merge`], the
//! same function the write path uses to fold operands into a value written earlier in the
//! same batch. Reads see an 8-byte big-endian signed integer: the state for Sum/Min/Max, the
//! unique-count estimate for HyperLogLog++ (the API's documented Int64 conversion of its state,
//! whose own format the public API leaves unspecified).

use crate::encoding::{self, ValueKind};
use basalt_model::aggregate::Aggregator;
use basalt_model::hlc::Version;
use basalt_model::hll::Sketch;

/// The aggregator's byte in a merge operand.
fn code(aggregator: Aggregator) -> u8 {
    match aggregator {
        Aggregator::Sum => 1,
        Aggregator::Min => 2,
        Aggregator::Max => 3,
        Aggregator::Hll => 4,
    }
}

fn from_code(code: u8) -> Option<Aggregator> {
    match code {
        1 => Some(Aggregator::Sum),
        2 => Some(Aggregator::Min),
        3 => Some(Aggregator::Max),
        4 => Some(Aggregator::Hll),
        _ => None,
    }
}

/// A merge operand: `version | kind=MergeOperand | aggregator:u8 | input:i64be`.
pub fn operand(version: Version, aggregator: Aggregator, input: i64) -> Vec<u8> {
    let mut payload = [0u8; 9];
    payload[0] = code(aggregator);
    payload[1..].copy_from_slice(&input.to_be_bytes());
    encoding::encode_value(version, ValueKind::MergeOperand, &payload)
}

fn decode_operand(v: &[u8]) -> Option<(Version, Aggregator, i64)> {
    let (version, kind, payload) = encoding::decode_value(v)?;
    if kind != ValueKind::MergeOperand || payload.len() != 9 {
        return None;
    }
    let aggregator = from_code(payload[0])?;
    let input = i64::from_be_bytes(payload[1..].try_into().ok()?);
    Some((version, aggregator, input))
}

/// The numeric state held by a stored value, if it is a live aggregate (or an 8-byte plain value).
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
    let operands: Vec<(Version, Aggregator, i64)> =
        operands.into_iter().filter_map(decode_operand).collect();
    if operands.first().is_some_and(|o| o.1 == Aggregator::Hll) {
        return merge_sketch(existing, &operands);
    }
    let mut state = existing.and_then(decode_state);
    for (version, aggregator, input) in operands {
        state = Some(match state {
            None => (version, input),
            Some((v, s)) => (v.max(version), aggregator.combine(s, input).unwrap_or(s)),
        });
    }
    let (version, value) = state.unwrap_or_default();
    encoding::encode_value(version, ValueKind::Aggregate, &value.to_be_bytes())
}

fn merge_sketch(existing: Option<&[u8]>, operands: &[(Version, Aggregator, i64)]) -> Vec<u8> {
    let (mut version, mut sketch) = existing
        .and_then(encoding::decode_value)
        .filter(|(_, kind, _)| *kind == ValueKind::Aggregate)
        .and_then(|(v, _, payload)| Some((v, Sketch::decode(payload)?)))
        .unwrap_or_default();
    for &(v, _, hash) in operands {
        version = version.max(v);
        sketch.insert(hash as u64);
    }
    encoding::encode_value(version, ValueKind::Aggregate, &sketch.encode())
}

/// Combines operands (oldest first) into one operand, when they agree on a numeric aggregator.
pub fn partial_merge<'a>(operands: impl IntoIterator<Item = &'a [u8]>) -> Option<Vec<u8>> {
    let mut acc: Option<(Version, Aggregator, i64)> = None;
    for op in operands {
        let (version, aggregator, input) = decode_operand(op)?;
        acc = Some(match acc {
            None => (version, aggregator, input),
            Some((v, a, s)) if a == aggregator => (v.max(version), a, a.combine(s, input)?),
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
    fn hll_operands_fold_into_a_sketch_read_as_a_count() {
        let ops: Vec<Vec<u8>> = (0..50u64)
            .chain(0..50)
            .map(|i| {
                operand(
                    v(i + 1),
                    Aggregator::Hll,
                    basalt_model::hll::hash(&i.to_be_bytes()) as i64,
                )
            })
            .collect();
        let (first, second) = ops.split_at(30);
        let partial = full_merge(None, first.iter().map(Vec::as_slice));
        let whole = full_merge(Some(&partial), second.iter().map(Vec::as_slice));
        let (version, kind, payload) = encoding::decode_value(&whole).unwrap();
        assert_eq!(kind, ValueKind::Aggregate);
        assert_eq!(version, v(50));
        let read = Aggregator::Hll.read_value(&bytes::Bytes::copy_from_slice(payload));
        assert_eq!(i64::from_be_bytes(read[..].try_into().unwrap()), 50);
        assert_eq!(partial_merge(ops.iter().map(Vec::as_slice)), None);
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
