//! Aggregate column families: cells that combine inputs at write time (Sum, Min, Max over
//! 64-bit big-endian integers; HyperLogLog++ unique counts over any input), stored with a
//! RocksDB merge operator.
//!
//! **Parts per origin.** An aggregate cell is stored as its *parts*: one per origin — the store
//! (a tablet server's data directory, [`crate::Store::origin`]) whose clients' inputs it
//! holds — each with the version of the newest input it holds and its own state (an 8-byte
//! integer, or a sketch). A read combines the parts with the family's aggregator. Only the
//! origin itself ever adds inputs to its part, in version order, so a part at a greater version
//! holds everything the same origin's part at a lower version held. That is what makes
//! replication exact (`crate::replicated`): another cluster receives an origin's part, never
//! the bare input, and keeps per origin the part with the greater version — the same part
//! delivered twice, parts delivered in any order, a seed copied while inputs flow: one sum.
//! A store that lost its data comes back as a new origin, so its old part (kept by the other
//! clusters, and copied back by a re-seed) and its new one add up.
//!
//! An AddToCell or MergeToCell becomes a merge operand on the cell's key (the input, its
//! version and its origin); a replicated part arrives as an operand too (an
//! [`ValueKind::AggregateParts`] value). RocksDB folds the operands into the stored parts (on
//! reads, flushes and compactions) with [`full_merge`], the same function the write path uses
//! to fold operands into a value written earlier in the same batch. Reads see an 8-byte
//! big-endian signed integer: the combined state for Sum/Min/Max, the unique-count estimate
//! for HyperLogLog++ (the API's documented Int64 conversion of its state, whose own format the
//! public API leaves unspecified).
//!
//! Format version 1 stored one state per cell (kind [`ValueKind::Aggregate`]) and operands
//! without an origin; both are read as the part of origin [`LEGACY_ORIGIN`], and opening a
//! store of format 1 rewrites its cells as parts (`crate::migrate`).

use crate::encoding::{self, ValueKind};
use basalt_model::aggregate::Aggregator;
use basalt_model::hlc::Version;
use basalt_model::hll::Sketch;

/// The origin of what format version 1 stored (a state or an operand without an origin).
pub const LEGACY_ORIGIN: u64 = 0;

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

/// A merge operand of `origin`'s input:
/// `version | kind=MergeOperand | aggregator:u8 | input:i64be | origin:u64be`
/// (format 1's operands end after the input: origin [`LEGACY_ORIGIN`]).
pub fn operand(version: Version, aggregator: Aggregator, input: i64, origin: u64) -> Vec<u8> {
    let mut payload = [0u8; 17];
    payload[0] = code(aggregator);
    payload[1..9].copy_from_slice(&input.to_be_bytes());
    payload[9..].copy_from_slice(&origin.to_be_bytes());
    encoding::encode_value(version, ValueKind::MergeOperand, &payload)
}

struct Input {
    version: Version,
    aggregator: Aggregator,
    input: i64,
    origin: u64,
}

fn decode_operand(version: Version, payload: &[u8]) -> Option<Input> {
    let origin = match payload.len() {
        9 => LEGACY_ORIGIN,
        17 => u64::from_be_bytes(payload[9..].try_into().ok()?),
        _ => return None,
    };
    Some(Input {
        version,
        aggregator: from_code(payload[0])?,
        input: i64::from_be_bytes(payload[1..9].try_into().ok()?),
        origin,
    })
}

/// One origin's part of an aggregate cell.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    pub origin: u64,
    /// The version of the newest input the part holds.
    pub version: Version,
    /// An 8-byte big-endian integer (Sum, Min, Max), or a sketch (HyperLogLog++).
    pub state: Vec<u8>,
}

/// The parts of a cell, sorted by origin, one per origin.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Parts(pub Vec<Part>);

impl Parts {
    /// Parses the payload of an [`ValueKind::AggregateParts`] value:
    /// `(origin:u64be hlc:u64be cluster:u16be len:u32be state)*`.
    pub fn decode(mut payload: &[u8]) -> Option<Parts> {
        let mut parts = Parts::default();
        while !payload.is_empty() {
            if payload.len() < 22 {
                return None;
            }
            let origin = u64::from_be_bytes(payload[0..8].try_into().ok()?);
            let hlc = u64::from_be_bytes(payload[8..16].try_into().ok()?);
            let cluster = u16::from_be_bytes(payload[16..18].try_into().ok()?);
            let len = u32::from_be_bytes(payload[18..22].try_into().ok()?) as usize;
            let state = payload.get(22..22 + len)?.to_vec();
            payload = &payload[22 + len..];
            parts.keep_newer(Part {
                origin,
                version: Version { hlc, cluster },
                state,
            });
        }
        Some(parts)
    }

    /// The payload [`Parts::decode`] reads.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.0.iter().map(|p| 22 + p.state.len()).sum());
        for p in &self.0 {
            out.extend_from_slice(&p.origin.to_be_bytes());
            out.extend_from_slice(&p.version.hlc.to_be_bytes());
            out.extend_from_slice(&p.version.cluster.to_be_bytes());
            out.extend_from_slice(&(p.state.len() as u32).to_be_bytes());
            out.extend_from_slice(&p.state);
        }
        out
    }

    /// The parts a stored value holds: an [`ValueKind::AggregateParts`] value's; format 1's
    /// single state (or an 8-byte plain value) as the part of [`LEGACY_ORIGIN`]; none for
    /// anything else (a tombstone, no value).
    pub fn of_value(value: Option<&[u8]>) -> Parts {
        let Some((version, kind, payload)) = value.and_then(encoding::decode_value) else {
            return Parts::default();
        };
        match kind {
            ValueKind::AggregateParts => Parts::decode(payload).unwrap_or_default(),
            ValueKind::Aggregate | ValueKind::Plain => Parts(vec![Part {
                origin: LEGACY_ORIGIN,
                version,
                state: payload.to_vec(),
            }]),
            ValueKind::Tombstone | ValueKind::MergeOperand => Parts::default(),
        }
    }

    /// The stored value: the parts, at the version of the newest.
    pub fn to_value(&self) -> Vec<u8> {
        encoding::encode_value(
            self.version().unwrap_or_default(),
            ValueKind::AggregateParts,
            &self.encode(),
        )
    }

    /// The newest part's version.
    pub fn version(&self) -> Option<Version> {
        self.0.iter().map(|p| p.version).max()
    }

    /// `origin`'s part.
    pub fn of(&self, origin: u64) -> Option<&Part> {
        self.0.iter().find(|p| p.origin == origin)
    }

    /// Keeps `part` unless the part of its origin here is at least as new.
    pub fn keep_newer(&mut self, part: Part) {
        match self.0.binary_search_by_key(&part.origin, |p| p.origin) {
            Ok(i) if self.0[i].version >= part.version => {}
            Ok(i) => self.0[i] = part,
            Err(i) => self.0.insert(i, part),
        }
    }

    /// Drops the parts older than `version` (a delete at `version` hides them); whether any
    /// was dropped.
    pub fn drop_older(&mut self, version: Version) -> bool {
        let before = self.0.len();
        self.0.retain(|p| p.version >= version);
        self.0.len() != before
    }

    /// Adds an input of its origin to that origin's part.
    fn add(&mut self, input: &Input) {
        let i = match self.0.binary_search_by_key(&input.origin, |p| p.origin) {
            Ok(i) => i,
            Err(i) => {
                let state = match input.aggregator {
                    Aggregator::Hll => Sketch::default().encode(),
                    _ => input.input.to_be_bytes().to_vec(),
                };
                self.0.insert(
                    i,
                    Part {
                        origin: input.origin,
                        version: input.version,
                        state,
                    },
                );
                if input.aggregator != Aggregator::Hll {
                    return;
                }
                i
            }
        };
        let part = &mut self.0[i];
        part.version = part.version.max(input.version);
        part.state = match input.aggregator {
            Aggregator::Hll => {
                let mut sketch = Sketch::decode(&part.state).unwrap_or_default();
                sketch.insert(input.input as u64);
                sketch.encode()
            }
            aggregator => {
                let held = int(&part.state).unwrap_or(input.input);
                let combined = aggregator.combine(held, input.input).unwrap_or(held);
                combined.to_be_bytes().to_vec()
            }
        };
    }

    /// The cell's state as `aggregator` combines its parts: an 8-byte integer, or a sketch.
    pub fn combined(&self, aggregator: Aggregator) -> Vec<u8> {
        match aggregator {
            Aggregator::Hll => {
                let mut sketch = Sketch::default();
                for p in &self.0 {
                    if let Some(s) = Sketch::decode(&p.state) {
                        sketch.union(&s);
                    }
                }
                sketch.encode()
            }
            aggregator => self
                .0
                .iter()
                .filter_map(|p| int(&p.state))
                .reduce(|a, b| aggregator.combine(a, b).unwrap_or(a))
                .unwrap_or_default()
                .to_be_bytes()
                .to_vec(),
        }
    }
}

fn int(state: &[u8]) -> Option<i64> {
    Some(i64::from_be_bytes(state.try_into().ok()?))
}

/// Folds `operands` (oldest first) into `existing`: inputs into their origin's part, parts
/// (a replicated or seeded [`ValueKind::AggregateParts`] operand) kept per origin when newer.
/// Returns the new stored value. Operands that cannot be decoded are skipped (they cannot be
/// produced by this server).
pub fn full_merge<'a>(
    existing: Option<&[u8]>,
    operands: impl IntoIterator<Item = &'a [u8]>,
) -> Vec<u8> {
    let mut parts = Parts::of_value(existing);
    for op in operands {
        let Some((version, kind, payload)) = encoding::decode_value(op) else {
            continue;
        };
        match kind {
            ValueKind::MergeOperand => {
                if let Some(input) = decode_operand(version, payload) {
                    parts.add(&input);
                }
            }
            ValueKind::AggregateParts => {
                for part in Parts::decode(payload).unwrap_or_default().0 {
                    parts.keep_newer(part);
                }
            }
            _ => {}
        }
    }
    parts.to_value()
}

/// Combines operands (oldest first) into one operand, when they are inputs of one origin to
/// one numeric aggregator (the common case: a counter of one server); None otherwise (RocksDB
/// keeps them apart until a full merge).
pub fn partial_merge<'a>(operands: impl IntoIterator<Item = &'a [u8]>) -> Option<Vec<u8>> {
    let mut acc: Option<Input> = None;
    for op in operands {
        let (version, kind, payload) = encoding::decode_value(op)?;
        if kind != ValueKind::MergeOperand {
            return None;
        }
        let next = decode_operand(version, payload)?;
        acc = Some(match acc {
            None => next,
            Some(a) if a.aggregator == next.aggregator && a.origin == next.origin => Input {
                version: a.version.max(next.version),
                aggregator: a.aggregator,
                input: a.aggregator.combine(a.input, next.input)?,
                origin: a.origin,
            },
            Some(_) => return None,
        });
    }
    acc.map(|a| operand(a.version, a.aggregator, a.input, a.origin))
}

/// `value` without the parts older than `version` (a delete at `version` hides them), when
/// it is an aggregate cell holding some (None: nothing to change).
pub fn without_parts_older(value: &[u8], version: Version) -> Option<Vec<u8>> {
    let (_, kind, _) = encoding::decode_value(value)?;
    if !matches!(kind, ValueKind::AggregateParts | ValueKind::Aggregate) {
        return None;
    }
    let mut parts = Parts::of_value(Some(value));
    parts.drop_older(version).then(|| parts.to_value())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(hlc: u64) -> Version {
        Version { hlc, cluster: 0 }
    }

    fn read(value: &[u8], aggregator: Aggregator) -> (Version, i64) {
        let (version, kind, _) = encoding::decode_value(value).unwrap();
        assert_eq!(kind, ValueKind::AggregateParts);
        let state = Parts::of_value(Some(value)).combined(aggregator);
        (version, int(&state).unwrap())
    }

    fn merge(existing: Option<&[u8]>, ops: &[Vec<u8>]) -> Vec<u8> {
        full_merge(existing, ops.iter().map(Vec::as_slice))
    }

    #[test]
    fn sum_min_max_fold() {
        let ops = [
            operand(v(1), Aggregator::Sum, 5, 7),
            operand(v(2), Aggregator::Sum, -7, 7),
        ];
        let out = merge(None, &ops);
        assert_eq!(read(&out, Aggregator::Sum), (v(2), -2));
        let more = [operand(v(3), Aggregator::Sum, 10, 7)];
        assert_eq!(read(&merge(Some(&out), &more), Aggregator::Sum), (v(3), 8));

        let ops = [
            operand(v(1), Aggregator::Min, 5, 7),
            operand(v(2), Aggregator::Min, -7, 8),
            operand(v(3), Aggregator::Min, 3, 7),
        ];
        assert_eq!(read(&merge(None, &ops), Aggregator::Min).1, -7);
        let ops = [
            operand(v(1), Aggregator::Max, 5, 7),
            operand(v(2), Aggregator::Max, -7, 8),
        ];
        assert_eq!(read(&merge(None, &ops), Aggregator::Max).1, 5);
        let wrap = [
            operand(v(1), Aggregator::Sum, i64::MAX, 7),
            operand(v(2), Aggregator::Sum, 1, 8),
        ];
        assert_eq!(read(&merge(None, &wrap), Aggregator::Sum).1, i64::MIN);
    }

    #[test]
    fn each_origin_has_its_part_and_a_newer_part_replaces_an_older_one_only() {
        let local = merge(
            None,
            &[
                operand(v(1), Aggregator::Sum, 5, 1),
                operand(v(4), Aggregator::Sum, 6, 1),
            ],
        );
        let parts = Parts::of_value(Some(&local));
        assert_eq!(parts.of(1).unwrap().version, v(4));
        // Another cluster's parts arrive: origin 2 at 10 (holding 3), then at 12 (holding
        // 9), then the first again (a redelivery) — one part, the newest.
        let part = |hlc, n: i64| {
            Parts(vec![Part {
                origin: 2,
                version: Version { hlc, cluster: 2 },
                state: n.to_be_bytes().to_vec(),
            }])
            .to_value()
        };
        let merged = merge(Some(&local), &[part(10, 3), part(12, 9), part(10, 3)]);
        assert_eq!(read(&merged, Aggregator::Sum).1, 20);
        let reordered = merge(Some(&local), &[part(12, 9), part(10, 3)]);
        assert_eq!(reordered, merged);
        // A delete at 11 hides origin 1's part (4) and origin 2's older part, not the newer.
        let cut = without_parts_older(
            &merged,
            Version {
                hlc: 11,
                cluster: 0,
            },
        )
        .unwrap();
        assert_eq!(read(&cut, Aggregator::Sum).1, 9);
        assert_eq!(
            without_parts_older(
                &cut,
                Version {
                    hlc: 11,
                    cluster: 0
                }
            ),
            None
        );
    }

    #[test]
    fn partial_merge_matches_full_merge() {
        let ops = [
            operand(v(1), Aggregator::Sum, 5, 3),
            operand(v(4), Aggregator::Sum, 6, 3),
            operand(v(2), Aggregator::Sum, 7, 3),
        ];
        let combined = partial_merge(ops.iter().map(Vec::as_slice)).unwrap();
        let direct = merge(None, &ops);
        assert_eq!(merge(None, &[combined]), direct);
        let mixed = [
            operand(v(1), Aggregator::Sum, 5, 3),
            operand(v(2), Aggregator::Max, 6, 3),
        ];
        assert_eq!(partial_merge(mixed.iter().map(Vec::as_slice)), None);
        let two_origins = [
            operand(v(1), Aggregator::Sum, 5, 3),
            operand(v(2), Aggregator::Sum, 6, 4),
        ];
        assert_eq!(partial_merge(two_origins.iter().map(Vec::as_slice)), None);
    }

    #[test]
    fn hll_operands_fold_into_sketches_read_as_a_count() {
        let ops: Vec<Vec<u8>> = (0..50u64)
            .chain(0..50)
            .map(|i| {
                let hash = basalt_model::hll::hash(&i.to_be_bytes()) as i64;
                operand(v(i + 1), Aggregator::Hll, hash, 1 + i % 2)
            })
            .collect();
        let (first, second) = ops.split_at(30);
        let partial = merge(None, first);
        let whole = merge(Some(&partial), second);
        let (version, kind, _) = encoding::decode_value(&whole).unwrap();
        assert_eq!(kind, ValueKind::AggregateParts);
        assert_eq!(version, v(50));
        let state = Parts::of_value(Some(&whole)).combined(Aggregator::Hll);
        let read = Aggregator::Hll.read_value(&bytes::Bytes::from(state));
        assert_eq!(i64::from_be_bytes(read[..].try_into().unwrap()), 50);
        assert_eq!(partial_merge(ops.iter().map(Vec::as_slice)), None);
    }

    #[test]
    fn merging_after_a_tombstone_starts_from_zero() {
        let tomb = encoding::encode_value(v(9), ValueKind::Tombstone, &[]);
        let ops = [operand(v(10), Aggregator::Sum, 3, 1)];
        assert_eq!(read(&merge(Some(&tomb), &ops), Aggregator::Sum), (v(10), 3));
    }

    #[test]
    fn format_1_states_and_operands_are_the_legacy_origins_part() {
        let old_state = encoding::encode_value(v(3), ValueKind::Aggregate, &40i64.to_be_bytes());
        let mut old_operand = operand(v(4), Aggregator::Sum, 2, 0);
        old_operand.truncate(encoding::VALUE_HEADER_LEN + 9);
        let merged = merge(
            Some(&old_state),
            &[old_operand, operand(v(5), Aggregator::Sum, 1, 6)],
        );
        let parts = Parts::of_value(Some(&merged));
        assert_eq!(parts.of(LEGACY_ORIGIN).unwrap().state, 42i64.to_be_bytes());
        assert_eq!(read(&merged, Aggregator::Sum), (v(5), 43));
    }
}
