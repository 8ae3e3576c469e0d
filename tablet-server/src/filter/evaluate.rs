//! The compiled filter tree ([`Node`]) and its evaluation on one row.

use std::ops::Bound;

use bytes::Bytes;
use regex::bytes::Regex;

use super::{cell_order, same_column};
use basalt_model::Cell;

#[derive(Debug, Clone)]
pub(super) enum Node {
    PassAll,
    BlockAll,
    Sink,
    Chain(Vec<Node>),
    Interleave(Vec<Node>),
    Condition {
        predicate: Box<Node>,
        on_true: Option<Box<Node>>,
        on_false: Option<Box<Node>>,
    },
    RowKeyRegex(Regex),
    RowSample(f64),
    FamilyRegex(Regex),
    QualifierRegex(Regex),
    ColumnRange {
        family: String,
        range: ByteRange,
    },
    TimestampRange {
        start: i64,
        /// Exclusive; `None` is infinity.
        end: Option<i64>,
    },
    ValueRegex(Regex),
    ValueRange(ByteRange),
    CellsPerRowOffset(usize),
    CellsPerRowLimit(usize),
    CellsPerColumnLimit(usize),
    StripValue,
    ApplyLabel(String),
}

/// A range of byte strings (qualifiers or values).
#[derive(Debug, Clone)]
pub(super) struct ByteRange {
    pub(super) start: Bound<Bytes>,
    pub(super) end: Bound<Bytes>,
}

impl ByteRange {
    pub(super) fn contains(&self, v: &[u8]) -> bool {
        let above_start = match &self.start {
            Bound::Unbounded => true,
            Bound::Included(s) => v >= s.as_ref(),
            Bound::Excluded(s) => v > s.as_ref(),
        };
        above_start
            && match &self.end {
                Bound::Unbounded => true,
                Bound::Included(e) => v <= e.as_ref(),
                Bound::Excluded(e) => v < e.as_ref(),
            }
    }

    /// True when no byte string can be in the range (conservative).
    pub(super) fn is_empty(&self) -> bool {
        match (&self.start, &self.end) {
            (Bound::Unbounded, Bound::Excluded(e)) => e.is_empty(),
            (Bound::Unbounded, _) | (_, Bound::Unbounded) => false,
            (Bound::Included(s), Bound::Included(e)) => s > e,
            (Bound::Included(s) | Bound::Excluded(s), Bound::Included(e) | Bound::Excluded(e)) => {
                s >= e
            }
        }
    }
}

pub(super) struct Ctx<'a> {
    /// Cells that reached a `sink`, in the order they got there.
    pub(super) sink: Vec<Cell>,
    pub(super) sample: &'a mut dyn FnMut() -> f64,
    /// Cell copies interleaves and sinks may still make.
    pub(super) budget: usize,
    /// The budget ran out: evaluation stops producing cells.
    pub(super) exceeded: bool,
}

impl Ctx<'_> {
    /// Takes `n` copies from the budget; false (and `exceeded`) when there are not enough.
    fn spend(&mut self, n: usize) -> bool {
        if self.exceeded || n > self.budget {
            self.exceeded = true;
            return false;
        }
        self.budget -= n;
        true
    }
}

impl Node {
    /// Whether the node may pass cells to its parent.
    pub(super) fn may_emit(&self) -> bool {
        match self {
            Node::BlockAll | Node::Sink => false,
            Node::Chain(fs) => fs.iter().all(Node::may_emit),
            Node::Interleave(fs) => fs.iter().any(Node::may_emit),
            Node::Condition {
                on_true, on_false, ..
            } => [on_true, on_false]
                .into_iter()
                .any(|b| b.as_ref().is_some_and(|b| b.may_emit())),
            Node::CellsPerRowLimit(n) | Node::CellsPerColumnLimit(n) => *n > 0,
            Node::TimestampRange { start, end } => end.is_none_or(|end| *start < end),
            Node::ColumnRange { range, .. } | Node::ValueRange(range) => !range.is_empty(),
            _ => true,
        }
    }

    /// Whether the node may send cells to a sink (which bypasses everything above it).
    pub(super) fn may_sink(&self) -> bool {
        match self {
            Node::Sink => true,
            Node::Chain(fs) => {
                // A sub-filter only sees input if every earlier one may emit.
                for f in fs {
                    if f.may_sink() {
                        return true;
                    }
                    if !f.may_emit() {
                        return false;
                    }
                }
                false
            }
            Node::Interleave(fs) => fs.iter().any(Node::may_sink),
            // Sinks are rejected below conditions.
            _ => false,
        }
    }

    /// Evaluates the node on `cells` (in Bigtable order); returns the cells passed to the
    /// parent, in Bigtable order. Cells reaching a sink are collected in `ctx`.
    pub(super) fn eval(&self, key: &[u8], mut cells: Vec<Cell>, ctx: &mut Ctx<'_>) -> Vec<Cell> {
        // No filter creates cells out of nothing: an empty input always gives an empty output.
        if cells.is_empty() {
            return cells;
        }
        match self {
            Node::PassAll => cells,
            Node::BlockAll => Vec::new(),
            Node::Sink => {
                if !ctx.spend(cells.len()) {
                    return Vec::new();
                }
                // Sunk cells bypass every parent: nothing is passed up.
                ctx.sink.append(&mut cells);
                cells
            }
            Node::Chain(filters) => {
                for f in filters {
                    cells = f.eval(key, cells, ctx);
                    if cells.is_empty() {
                        break;
                    }
                }
                cells
            }
            Node::Interleave(filters) => {
                let mut out = Vec::new();
                let last = filters.len().saturating_sub(1);
                for (i, f) in filters.iter().enumerate() {
                    let input = if i == last {
                        std::mem::take(&mut cells)
                    } else {
                        cells.clone()
                    };
                    let part = f.eval(key, input, ctx);
                    // Every sub-filter after the first adds copies of the input.
                    if ctx.exceeded || (i > 0 && !ctx.spend(part.len())) {
                        return Vec::new();
                    }
                    out.extend(part);
                }
                // Stable: equal cells keep sub-filter order. Duplicates are all kept.
                out.sort_by(cell_order);
                out
            }
            Node::Condition {
                predicate,
                on_true,
                on_false,
            } => {
                // The predicate works on a copy: its transformations never leak.
                let matched = !predicate.eval(key, cells.clone(), ctx).is_empty();
                match if matched { on_true } else { on_false } {
                    Some(branch) => branch.eval(key, cells, ctx),
                    None => Vec::new(),
                }
            }
            Node::RowKeyRegex(re) => {
                if re.is_match(key) {
                    cells
                } else {
                    Vec::new()
                }
            }
            Node::RowSample(p) => {
                if (ctx.sample)() < *p {
                    cells
                } else {
                    Vec::new()
                }
            }
            Node::FamilyRegex(re) => {
                cells.retain(|c| re.is_match(c.family.as_bytes()));
                cells
            }
            Node::QualifierRegex(re) => {
                cells.retain(|c| re.is_match(&c.qualifier));
                cells
            }
            Node::ColumnRange { family, range } => {
                cells.retain(|c| c.family == *family && range.contains(&c.qualifier));
                cells
            }
            Node::TimestampRange { start, end } => {
                cells.retain(|c| {
                    c.timestamp_micros >= *start && end.is_none_or(|end| c.timestamp_micros < end)
                });
                cells
            }
            Node::ValueRegex(re) => {
                cells.retain(|c| re.is_match(&c.value));
                cells
            }
            Node::ValueRange(range) => {
                cells.retain(|c| range.contains(&c.value));
                cells
            }
            Node::CellsPerRowOffset(n) => {
                cells.drain(..(*n).min(cells.len()));
                cells
            }
            Node::CellsPerRowLimit(n) => {
                cells.truncate(*n);
                cells
            }
            Node::CellsPerColumnLimit(n) => {
                // Columns are contiguous in Bigtable order; each copy of a duplicate counts.
                let mut keep = Vec::with_capacity(cells.len());
                let mut run = 0usize;
                for (i, c) in cells.iter().enumerate() {
                    if i == 0 || !same_column(&cells[i - 1], c) {
                        run = 0;
                    }
                    run += 1;
                    keep.push(run <= *n);
                }
                let mut keep = keep.into_iter();
                cells.retain(|_| keep.next().unwrap_or(false));
                cells
            }
            Node::StripValue => {
                for c in &mut cells {
                    c.value = Bytes::new();
                }
                cells
            }
            Node::ApplyLabel(label) => {
                for c in &mut cells {
                    c.labels.push(label.clone());
                }
                cells
            }
        }
    }
}
