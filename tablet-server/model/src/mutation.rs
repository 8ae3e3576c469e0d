//! Row mutations, validated, in the form storage applies them (column-family changes are in
//! [`crate::schema`]).

use bytes::Bytes;

use crate::aggregate::Aggregator;

/// One validated mutation of a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mutation {
    SetCell {
        family: String,
        qualifier: Bytes,
        /// Resolved timestamp (never -1 here).
        timestamp: i64,
        value: Bytes,
    },
    /// Deletes cells with `start <= timestamp < end`.
    DeleteFromColumn {
        family: String,
        qualifier: Bytes,
        start: i64,
        end: i64,
    },
    DeleteFromFamily {
        family: String,
    },
    DeleteFromRow,
    /// AddToCell / MergeToCell into an aggregate family (Sum/Min/Max: input = state type).
    Aggregate {
        family: String,
        qualifier: Bytes,
        timestamp: i64,
        aggregator: Aggregator,
        input: i64,
    },
    /// Never from a client: an aggregate cell's state as another cluster replicates it, the
    /// parts of the cell per origin (the stores that wrote it), each with its version, in the
    /// storage's encoding (`docs/storage-format.md`, "Aggregate cells"). Applying it keeps, per
    /// origin, the newer part: the same parts delivered twice or in any order give one state.
    AggregateParts {
        family: String,
        qualifier: Bytes,
        timestamp: i64,
        parts: Bytes,
    },
}

impl Mutation {
    /// The family the mutation writes or deletes in, if it names one.
    pub fn family(&self) -> Option<&str> {
        match self {
            Mutation::SetCell { family, .. }
            | Mutation::DeleteFromColumn { family, .. }
            | Mutation::DeleteFromFamily { family }
            | Mutation::Aggregate { family, .. }
            | Mutation::AggregateParts { family, .. } => Some(family),
            Mutation::DeleteFromRow => None,
        }
    }

    /// Does the mutation delete (as opposed to add cells or aggregate into them)?
    pub fn deletes(&self) -> bool {
        !matches!(
            self,
            Mutation::SetCell { .. } | Mutation::Aggregate { .. } | Mutation::AggregateParts { .. }
        )
    }
}

/// The mutations of one row, applied atomically and in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowMutation {
    pub row: Bytes,
    pub mutations: Vec<Mutation>,
}
