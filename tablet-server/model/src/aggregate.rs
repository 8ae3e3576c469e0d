//! Aggregate kinds of column families: cells that combine inputs at write time (Sum, Min, Max
//! over 64-bit big-endian integers; HyperLogLog++ unique counts over any input). How the
//! inputs are stored and folded is storage's business (its merge operator); this is what they
//! mean.

use serde::{Deserialize, Serialize};

use crate::hll::Sketch;

/// The aggregation function of a family (its `value_type`), immutable once created.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Aggregator {
    Sum,
    Min,
    Max,
    /// HyperLogLog++ unique count; operands carry the 64-bit hash of an input.
    Hll,
}

impl Aggregator {
    /// Combines two numeric states (Sum/Min/Max); None for HyperLogLog++, whose operands are
    /// hashes folded into a sketch instead.
    pub fn combine(self, a: i64, b: i64) -> Option<i64> {
        match self {
            // Bigtable's Sum wraps on overflow like two's-complement int64 arithmetic.
            Aggregator::Sum => Some(a.wrapping_add(b)),
            Aggregator::Min => Some(a.min(b)),
            Aggregator::Max => Some(a.max(b)),
            Aggregator::Hll => None,
        }
    }

    /// What a read returns for a stored state payload: the 8-byte big-endian Int64.
    pub fn read_value(self, state: &bytes::Bytes) -> bytes::Bytes {
        match self {
            Aggregator::Hll => {
                let count = Sketch::decode(state).map(|s| s.estimate()).unwrap_or(0);
                bytes::Bytes::copy_from_slice(&(count as i64).to_be_bytes())
            }
            _ => state.clone(),
        }
    }
}
