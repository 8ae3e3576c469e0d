//! The Cloud Bigtable `RowFilter` language, as a pure function from a [`Row`] to the cells to send.
//!
//! [`RowFilter::compile`] validates a wire filter (every error is a gRPC `INVALID_ARGUMENT`) and
//! turns it into a tree that [`RowFilter::apply`] evaluates on one row at a time. Semantics follow
//! the comments of `google/bigtable/v2/data.proto` (message `RowFilter` and friends) and, where
//! the proto is silent, what the production service is known to do. The decisions that are not
//! spelled out by the proto, with their sources:
//!
//! * **Unset filter.** A `RowFilter` whose `filter` oneof is unset "returns all cells in the input
//!   row" (proto comment on `RowFilter.filter`), at the top level and wherever it is nested. A
//!   `Condition` without `predicate_filter` is treated the same way (proto3 reads an absent
//!   message as its default, i.e. an unset filter): the predicate is true iff the row has a cell.
//! * **Chain / Interleave need at least two sub-filters** and `pass_all_filter` /
//!   `block_all_filter` must be `true` when set: production rejects the others
//!   (googleapis/google-cloud-go#4201 and #4095, found by running the Go emulator's tests against
//!   production). `sink` and `strip_value_transformer` set to `false` are rejected the same way
//!   (as google-cloud-cpp's emulator does); a `false` flag is never a meaningful filter.
//! * **Interleave / Sink ordering.** Outputs are merged in Bigtable cell order (family, qualifier,
//!   timestamp descending). Cells with the same column and timestamp appear "in an unspecified
//!   mutual order" (proto); ours is deterministic: within an interleave, by sub-filter index; in
//!   the final merge, cells that reached a `sink` come before the filter's regular output, which
//!   is the order drawn in the proto's `sink` example. Identical copies are all kept.
//! * **Sink** sends its input to the final output and nothing to its parent (the proto's example
//!   shows the sink branch contributing nothing to the enclosing interleave). It may not appear
//!   anywhere below a `Condition` (predicate, true or false filter), as the proto says; production
//!   answers "sink cannot be nested in a condition filter" (quoted in google-cloud-cpp's emulator).
//! * **Labels.** At most 15 characters of `[a-z0-9-]`, at least one. "It is not currently possible
//!   to apply multiple labels to a cell. As a result, a Chain may have no more than one
//!   sub-filter which contains a `apply_label_transformer`" (proto): a chain with two such
//!   sub-filters is rejected. A label inside a condition's *predicate* does not count: predicate
//!   output never reaches the client. Interleaves may contain several labels.
//! * **row_sample_filter** must satisfy `0 < p < 1` (the Go emulator mirrors production's
//!   "row_sample_filter argument must be between 0.0 and 1.0"). A row passes when the sampler
//!   returns a value `< p`; each evaluation of the filter on a non-empty row draws once.
//! * **Counts.** Negative `cells_per_row_offset_filter`, `cells_per_row_limit_filter` and
//!   `cells_per_column_limit_filter` are rejected. Zero is accepted (offset 0 passes everything,
//!   a limit of 0 outputs nothing): no source shows production rejecting 0, both Google-maintained
//!   emulators accept it, and the HBase adapter forwards `ColumnCountGetFilter(0)` unchanged.
//! * **timestamp_range_filter** is `[start, end)`, `end == 0` meaning infinity, compared in
//!   microseconds. Production accepts any microsecond bound (the Java client sends `[t, t+1)`
//!   for an exact timestamp; google-cloud-go#9149 removed its emulator's stale "maximum
//!   precision is millisecond" check). A range with `start >= end` matches nothing.
//! * **row_key_regex_filter** must not be empty (production: "argument must not be empty",
//!   google-cloud-go#6519).
//! * **column_range_filter** requires a `family_name`. Qualifier and value ranges compare bytes;
//!   a missing start is the empty string, inclusive; a missing end is infinity. An *open end at
//!   the empty string* is read as infinity, as production does for ranges (google-cloud-cpp#404:
//!   "The CBT server reads the empty string on the right side of an open interval as the special
//!   value infinity"). Reversed ranges match nothing.
//! * **Regexes** are RE2 in Latin-1 (byte) mode, evaluated as full matches: `.` does not match
//!   `\n`, `\C` matches any byte, a pattern byte stands for itself. The RE2 syntax is translated
//!   to the `regex` crate's (see `translate_re2`), RE2's rejections included; the translation
//!   was checked against libre2 (Latin-1, `FullMatch`) on about a million random patterns. The
//!   family regex may not contain `:` at all (proto). `(?<name>re)` is accepted, as in current
//!   RE2 releases.
//! * **Limits**: the serialized filter must be at most 20,480 bytes and chains, interleaves and
//!   conditions may be nested at most 20 levels deep (the proto speaks of Chains and Interleaves;
//!   conditions nest the same way and are counted too, which also bounds recursion).
//!
//! There is no `value_bitmask` filter: it does not exist in the v2 proto.

use std::cmp::Ordering;
use std::fmt::Write as _;
use std::ops::Bound;

use bytes::Bytes;
use googleapis_tonic_google_bigtable_v2::google::bigtable::v2 as pb;
use pb::row_filter::Filter as F;
use regex::bytes::{Regex, RegexBuilder};

use crate::model::{Cell, Row};

/// Largest serialized `RowFilter` Bigtable accepts.
pub const MAX_FILTER_SIZE_BYTES: usize = 20_480;
/// Deepest nesting of chains, interleaves and conditions Bigtable accepts.
pub const MAX_FILTER_DEPTH: usize = 20;
/// Longest label `apply_label_transformer` accepts.
pub const MAX_LABEL_LEN: usize = 15;
/// RE2's largest counted repetition (`a{1000}`).
const MAX_REPEAT: u32 = 1000;

/// Why a filter was rejected. Every variant is an `INVALID_ARGUMENT` for gRPC.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FilterError {
    #[error(
        "row filter is {size} bytes when serialized; the maximum is {max} bytes (row filter exceeds maximum size)"
    )]
    TooLarge { size: usize, max: usize },
    #[error(
        "row filter is nested too deeply: chains, interleaves and conditions may be nested at most {max} levels deep"
    )]
    TooDeep { max: usize },
    #[error("{kind} must contain at least two RowFilters, but it has {count}")]
    TooFewSubFilters { kind: &'static str, count: usize },
    #[error("`{field}` must be true if set, but it is false")]
    FlagFalse { field: &'static str },
    #[error("`{field}` is not a valid RE2 regular expression: {reason} (pattern: {pattern:?})")]
    InvalidRegex {
        field: &'static str,
        pattern: String,
        reason: String,
    },
    #[error(
        "`family_name_regex_filter` must not contain the ':' character, even escaped or in a class, but got {pattern:?}"
    )]
    ColonInFamilyRegex { pattern: String },
    #[error(
        "`row_sample_filter` must be a probability strictly between 0.0 and 1.0, but got {value}"
    )]
    InvalidSampleProbability { value: f64 },
    #[error("`column_range_filter` must name a column family in `family_name`, but it is empty")]
    MissingColumnRangeFamily,
    #[error("`{field}` must not be empty")]
    EmptyRegex { field: &'static str },
    #[error(
        "the filter multiplies the row beyond {max_copies} cell copies (interleaves and sinks copy their input); simplify the filter"
    )]
    OutputTooLarge { max_copies: usize },
    #[error("`{field}` must not be negative, but got {value}")]
    NegativeCount { field: &'static str, value: i32 },
    #[error(
        "`apply_label_transformer` must be 1 to 15 characters matching [a-z0-9\\-]+, but got {label:?}"
    )]
    InvalidLabel { label: String },
    #[error(
        "a chain may have at most one sub-filter containing an `apply_label_transformer` (a cell cannot carry two labels), but sub-filters #{first} and #{second} both do"
    )]
    MultipleLabelsInChain { first: usize, second: usize },
    #[error(
        "sink cannot be nested in a condition filter (its predicate_filter, true_filter or false_filter)"
    )]
    SinkInCondition,
}

/// A validated, compiled row filter. Cheap to clone; `Send + Sync`.
#[derive(Debug, Clone)]
pub struct RowFilter {
    root: Node,
    block_all: bool,
}

impl RowFilter {
    /// Validates and compiles a filter from the wire. All errors map to gRPC INVALID_ARGUMENT.
    ///
    /// A filter whose oneof is unset passes every cell, as the proto documents.
    pub fn compile(filter: &pb::RowFilter) -> Result<RowFilter, FilterError> {
        // Depth first: it bounds the recursion of everything below (size and build).
        check_depth(filter, 0)?;
        let size = prost::Message::encoded_len(filter);
        if size > MAX_FILTER_SIZE_BYTES {
            return Err(FilterError::TooLarge {
                size,
                max: MAX_FILTER_SIZE_BYTES,
            });
        }
        let built = build(filter, false)?;
        let block_all = !built.node.may_emit() && !built.node.may_sink();
        Ok(RowFilter {
            root: built.node,
            block_all,
        })
    }

    /// The filter used when a request carries none.
    pub fn pass_all() -> RowFilter {
        RowFilter {
            root: Node::PassAll,
            block_all: false,
        }
    }

    /// True when the filter can never output a cell (e.g. block_all) — lets the reader skip work.
    ///
    /// Conservative: some filters that never match (e.g. an unsatisfiable regex) report false.
    pub fn is_block_all(&self) -> bool {
        self.block_all
    }

    /// Applies the filter to one row; returns the cells to send, in the order they must be sent.
    ///
    /// `row_sample_filter` draws from a per-thread xorshift generator seeded from the clock.
    pub fn apply(&self, row: &Row) -> Vec<Cell> {
        let mut sample = default_sample;
        self.apply_with_sampler(row, &mut sample)
    }

    /// Like [`RowFilter::apply`], with `sample` (returning values in `[0, 1)`) deciding
    /// `row_sample_filter`s: a row passes a sample filter of probability `p` when `sample() < p`.
    pub fn apply_with_sampler(&self, row: &Row, sample: &mut dyn FnMut() -> f64) -> Vec<Cell> {
        self.run(row, sample, usize::MAX).0
    }

    /// Like [`RowFilter::apply`], but refuses to produce more than `max_copies` cells beyond
    /// the row's own through interleaves and sinks (nested interleaves multiply a row: 20
    /// levels of `Interleave(pass, pass)` output every cell 2^20 times). The server uses this
    /// so that no filter can exhaust its memory.
    pub fn apply_bounded(&self, row: &Row, max_copies: usize) -> Result<Vec<Cell>, FilterError> {
        let mut sample = default_sample;
        match self.run(row, &mut sample, max_copies) {
            (cells, false) => Ok(cells),
            (_, true) => Err(FilterError::OutputTooLarge { max_copies }),
        }
    }

    /// Evaluates the filter; the flag says the copy budget ran out (the cells are then partial).
    fn run(&self, row: &Row, sample: &mut dyn FnMut() -> f64, budget: usize) -> (Vec<Cell>, bool) {
        if self.block_all || row.cells.is_empty() {
            return (Vec::new(), false);
        }
        let mut cells = row.cells.clone();
        // The filters rely on Bigtable order (per-column limits, merges); the model promises it,
        // but a stable sort of already sorted input is cheap insurance.
        if !cells.is_sorted_by(|a, b| cell_order(a, b) != Ordering::Greater) {
            cells.sort_by(cell_order);
        }
        let mut ctx = Ctx {
            sink: Vec::new(),
            sample,
            budget,
            exceeded: false,
        };
        let out = self.root.eval(&row.key, cells, &mut ctx);
        if ctx.exceeded {
            return (Vec::new(), true);
        }
        if ctx.sink.is_empty() {
            return (out, false);
        }
        // Sunk cells first, so that ties come out as in the proto's sink example.
        let mut all = ctx.sink;
        all.extend(out);
        all.sort_by(cell_order);
        (all, false)
    }
}

/// Bigtable cell order. Sorts using it are stable: ties keep the order they were produced in.
fn cell_order(a: &Cell, b: &Cell) -> Ordering {
    a.order_key().cmp(&b.order_key())
}

fn same_column(a: &Cell, b: &Cell) -> bool {
    a.family == b.family && a.qualifier == b.qualifier
}

// ------------------------------------------------------------------------------ compiled tree

#[derive(Debug, Clone)]
enum Node {
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
struct ByteRange {
    start: Bound<Bytes>,
    end: Bound<Bytes>,
}

impl ByteRange {
    fn contains(&self, v: &[u8]) -> bool {
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
    fn is_empty(&self) -> bool {
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

struct Ctx<'a> {
    /// Cells that reached a `sink`, in the order they got there.
    sink: Vec<Cell>,
    sample: &'a mut dyn FnMut() -> f64,
    /// Cell copies interleaves and sinks may still make.
    budget: usize,
    /// The budget ran out: evaluation stops producing cells.
    exceeded: bool,
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
    fn may_emit(&self) -> bool {
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
    fn may_sink(&self) -> bool {
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
    fn eval(&self, key: &[u8], mut cells: Vec<Cell>, ctx: &mut Ctx<'_>) -> Vec<Cell> {
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

// ------------------------------------------------------------------------------ validation

/// Rejects composites nested more than [`MAX_FILTER_DEPTH`] levels; `enclosing` is the number
/// of composites around `f`. Recursion stops at the limit.
fn check_depth(f: &pb::RowFilter, enclosing: usize) -> Result<(), FilterError> {
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

struct Built {
    node: Node,
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

fn build(f: &pb::RowFilter, in_condition: bool) -> Result<Built, FilterError> {
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

// ------------------------------------------------------------------------------ regexes

/// Compiles an RE2 (Latin-1) pattern for a full match against raw bytes.
fn compile_regex(field: &'static str, pattern: &[u8]) -> Result<Regex, FilterError> {
    let invalid = |reason: String| FilterError::InvalidRegex {
        field,
        pattern: String::from_utf8_lossy(pattern).into_owned(),
        reason,
    };
    let translated = translate_re2(pattern).map_err(invalid)?;
    RegexBuilder::new(&format!(r"\A(?:{translated})\z"))
        .unicode(false)
        .build()
        .map_err(|e| {
            // The `regex` crate's message quotes the translated pattern; keep only the cause.
            let msg = e.to_string();
            let reason = msg
                .lines()
                .find_map(|l| l.trim().strip_prefix("error: "))
                .unwrap_or(msg.lines().last().unwrap_or("invalid regular expression"))
                .to_string();
            invalid(reason)
        })
}

/// A set of bytes, for character classes.
#[derive(Clone, Copy)]
struct ByteSet([u64; 4]);

impl ByteSet {
    fn new() -> ByteSet {
        ByteSet([0; 4])
    }

    fn contains(&self, b: u8) -> bool {
        self.0[usize::from(b >> 6)] & (1 << (b & 63)) != 0
    }

    fn insert(&mut self, b: u8) {
        self.0[usize::from(b >> 6)] |= 1 << (b & 63);
    }

    fn add_range(&mut self, lo: u8, hi: u8) {
        for b in lo..=hi {
            self.insert(b);
        }
    }

    fn add_where(&mut self, mut pred: impl FnMut(u8) -> bool) {
        for b in 0..=255u8 {
            if pred(b) {
                self.insert(b);
            }
        }
    }

    fn union(&mut self, other: &ByteSet) {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a |= b;
        }
    }

    fn negate(&mut self) {
        for word in &mut self.0 {
            *word = !*word;
        }
    }

    /// Adds the case counterpart of every letter in the set.
    fn fold(&mut self) {
        let before = *self;
        for b in 0..=255u8 {
            if before.contains(b)
                && let Some(other) = latin1_case_counterpart(b)
            {
                self.insert(other);
            }
        }
    }

    /// RE2's order for a class under `(?i)`: fold the positive set, then negate it.
    fn finish(mut self, negated: bool, fold: bool) -> ByteSet {
        if fold {
            self.fold();
        }
        if negated {
            self.negate();
        }
        self
    }

    /// Emits the set as one `regex` atom matching exactly one byte of the set. Under `(?i)`
    /// (`fold`) the set is already folded and must not be folded again by `regex`.
    fn emit(&self, out: &mut String, fold: bool) {
        if self.0.iter().all(|w| *w == u64::MAX) {
            out.push_str("(?s:.)");
            return;
        }
        if self.0.iter().all(|w| *w == 0) {
            out.push_str(NEVER);
            return;
        }
        out.push_str(if fold { "(?-i:[" } else { "[" });
        let mut b = 0u16;
        while b < 256 {
            if !self.contains(b as u8) {
                b += 1;
                continue;
            }
            let lo = b;
            while b < 255 && self.contains((b + 1) as u8) {
                b += 1;
            }
            let _ = write!(out, "\\x{lo:02X}");
            if b > lo {
                let _ = write!(out, "-\\x{b:02X}");
            }
            b += 1;
        }
        out.push_str(if fold { "])" } else { "]" });
    }
}

/// An atom that never matches (a byte followed by the start of the text).
const NEVER: &str = r"(?:\x00\A)";

/// The other case of a Latin-1 letter under Unicode simple case folding, when it is Latin-1
/// too (`µ`, `ß` and `ÿ` fold only to code points above 0xFF).
fn latin1_case_counterpart(b: u8) -> Option<u8> {
    match b {
        b'A'..=b'Z' | 0xC0..=0xDE if b != 0xD7 => Some(b + 0x20),
        b'a'..=b'z' | 0xE0..=0xFE if b != 0xF7 => Some(b - 0x20),
        _ => None,
    }
}

/// The characters equal to Latin-1 character `b` under Unicode simple case folding.
fn case_orbit(b: u8) -> Vec<char> {
    let mut orbit = vec![char::from(b)];
    orbit.extend(latin1_case_counterpart(b).map(char::from));
    orbit.extend(match b {
        b'K' | b'k' => &['\u{212A}'][..],
        b'S' | b's' => &['\u{17F}'],
        0xB5 => &['\u{39C}', '\u{3BC}'],
        0xC5 | 0xE5 => &['\u{212B}'],
        0xDF => &['\u{1E9E}'],
        0xFF => &['\u{178}'],
        _ => &[],
    });
    orbit
}

/// RE2's `\s` (note: unlike `regex`, without `\v`).
fn is_re2_space(b: u8) -> bool {
    matches!(b, b'\t' | b'\n' | 0x0C | b'\r' | b' ')
}

/// The positive set of a Perl class escape letter (`d`, `D`, `s`, `S`, `w`, `W`) and whether
/// the escape negates it.
fn perl_class(letter: u8) -> Option<(ByteSet, bool)> {
    let mut set = ByteSet::new();
    match letter.to_ascii_lowercase() {
        b'd' => set.add_where(|b| b.is_ascii_digit()),
        b's' => set.add_where(is_re2_space),
        b'w' => set.add_where(|b| b.is_ascii_alphanumeric() || b == b'_'),
        _ => return None,
    }
    Some((set, letter.is_ascii_uppercase()))
}

/// The positive set of a POSIX class name such as `alpha` or `^digit` (from `[[:alpha:]]`) and
/// whether it is negated.
fn posix_class(name: &[u8]) -> Option<(ByteSet, bool)> {
    let (negated, name) = match name.strip_prefix(b"^") {
        Some(rest) => (true, rest),
        None => (false, name),
    };
    let pred: fn(u8) -> bool = match name {
        b"alnum" => |b| b.is_ascii_alphanumeric(),
        b"alpha" => |b| b.is_ascii_alphabetic(),
        b"ascii" => |b| b.is_ascii(),
        b"blank" => |b| b == b' ' || b == b'\t',
        b"cntrl" => |b| b < 0x20 || b == 0x7F,
        b"digit" => |b| b.is_ascii_digit(),
        b"graph" => |b| b.is_ascii_graphic(),
        b"lower" => |b| b.is_ascii_lowercase(),
        b"print" => |b| b.is_ascii_graphic() || b == b' ',
        b"punct" => |b| b.is_ascii_punctuation(),
        b"space" => |b| matches!(b, b'\t' | b'\n' | 0x0B | 0x0C | b'\r' | b' '),
        b"upper" => |b| b.is_ascii_uppercase(),
        b"word" => |b| b.is_ascii_alphanumeric() || b == b'_',
        b"xdigit" => |b| b.is_ascii_hexdigit(),
        _ => return None,
    };
    let mut set = ByteSet::new();
    set.add_where(pred);
    Some((set, negated))
}

/// The Unicode general categories RE2 accepts in `\pX` / `\p{Name}`.
const RE2_CATEGORIES: [&str; 36] = [
    "C", "Cc", "Cf", "Co", "Cs", "L", "Ll", "Lm", "Lo", "Lt", "Lu", "M", "Mc", "Me", "Mn", "N",
    "Nd", "Nl", "No", "P", "Pc", "Pd", "Pe", "Pf", "Pi", "Po", "Ps", "S", "Sc", "Sk", "Sm", "So",
    "Z", "Zl", "Zp", "Zs",
];

/// The positive Latin-1 set of a Unicode class escape `\pX`, `\p{Name}`, `\PX`, `\p{^Name}`
/// starting at `p[i]` (the backslash), whether it is negated, and the index after it. Under
/// `(?i)` (`fold`) the set is case-folded over all of Unicode, as RE2 does before negating: `ÿ`
/// is in `(?i)\p{Lu}` because `Ÿ` (U+0178) is.
fn unicode_class(p: &[u8], i: usize, fold: bool) -> Result<(ByteSet, bool, usize), String> {
    let mut negated = p[i + 1] == b'P';
    let (mut name, next) = match p.get(i + 2) {
        None => return Err("invalid character class: missing name after \\p".into()),
        Some(b'{') => {
            let close = p[i + 3..]
                .iter()
                .position(|&b| b == b'}')
                .ok_or("invalid character class: missing '}' after \\p{")?;
            (&p[i + 3..i + 3 + close], i + 4 + close)
        }
        Some(_) => (&p[i + 2..i + 3], i + 3),
    };
    if let Some(rest) = name.strip_prefix(b"^") {
        negated = !negated;
        name = rest;
    }
    if name.is_empty() || !name.iter().all(|b| b.is_ascii_alphabetic() || *b == b'_') {
        return Err(format!(
            "invalid character class range: \\p{{{}}}",
            String::from_utf8_lossy(name)
        ));
    }
    let name = std::str::from_utf8(name).map_err(|e| e.to_string())?;
    let unknown = || format!("invalid character class range: \\p{{{name}}}");
    // RE2 knows "Any", the general categories and the scripts, all spelled exactly; `regex`
    // matches names loosely, so only ask it about names RE2 could accept.
    let property = if name == "Any" {
        "Any".to_string()
    } else if RE2_CATEGORIES.contains(&name) {
        format!("gc={name}")
    } else if name.starts_with(|c: char| c.is_ascii_uppercase()) {
        format!("sc={name}")
    } else {
        return Err(unknown());
    };
    thread_local! {
        /// Latin-1 sets of the classes seen so far (only valid names get in: it stays small).
        static CACHE: std::cell::RefCell<std::collections::HashMap<(String, bool), ByteSet>> =
            Default::default();
    }
    let key = (property, fold);
    if let Some(set) = CACHE.with(|c| c.borrow().get(&key).copied()) {
        return Ok((set, negated, next));
    }
    // Evaluate the Unicode class on the 256 Latin-1 code points.
    let class = regex::Regex::new(&format!(r"\A\p{{{}}}\z", key.0)).map_err(|_| unknown())?;
    let mut set = ByteSet::new();
    let mut buf = [0u8; 4];
    set.add_where(|b| {
        let orbit = if fold {
            case_orbit(b)
        } else {
            vec![char::from(b)]
        };
        orbit
            .into_iter()
            .any(|c| class.is_match(c.encode_utf8(&mut buf)))
    });
    CACHE.with(|c| c.borrow_mut().insert(key, set));
    Ok((set, negated, next))
}

fn is_octal(b: &u8) -> bool {
    (b'0'..=b'7').contains(b)
}

/// Parses an escape denoting one character, starting at `p[i]` (the backslash); returns the
/// character and the index after the escape. In Latin-1 mode RE2 rejects code points above
/// 0xFF (`\x{100}`, `\400`).
fn literal_escape(p: &[u8], i: usize) -> Result<(u8, usize), String> {
    let (v, next) = escaped_code_point(p, i)?;
    match u8::try_from(v) {
        Ok(b) => Ok((b, next)),
        Err(_) => Err(format!(
            "invalid escape sequence: {} (not a Latin-1 character)",
            String::from_utf8_lossy(&p[i..next])
        )),
    }
}

fn escaped_code_point(p: &[u8], i: usize) -> Result<(u32, usize), String> {
    let Some(&c) = p.get(i + 1) else {
        return Err("trailing \\ at end of regular expression".into());
    };
    let simple = |v: u8| Ok((u32::from(v), i + 2));
    match c {
        b'a' => simple(0x07),
        b'f' => simple(0x0C),
        b't' => simple(b'\t'),
        b'n' => simple(b'\n'),
        b'r' => simple(b'\r'),
        b'v' => simple(0x0B),
        // Octal: \0 followed by up to two digits, or \1-\7 followed by one or two digits
        // (a lone \1-\7 would be a backreference, which RE2 does not support).
        b'0'..=b'7' => {
            if c != b'0' && !p.get(i + 2).is_some_and(is_octal) {
                return Err(format!(
                    "invalid escape sequence: \\{} (backreferences are not supported)",
                    c as char
                ));
            }
            let mut j = i + 2;
            let mut v = u32::from(c - b'0');
            while j < i + 4 && p.get(j).is_some_and(is_octal) {
                v = v * 8 + u32::from(p[j] - b'0');
                j += 1;
            }
            Ok((v, j))
        }
        b'x' => {
            let hex = |b: &u8| (*b as char).to_digit(16);
            if p.get(i + 2) == Some(&b'{') {
                let close = p[i + 3..]
                    .iter()
                    .position(|&b| b == b'}')
                    .ok_or("invalid escape sequence: missing '}' after \\x{")?;
                let digits = &p[i + 3..i + 3 + close];
                let mut v: u32 = 0;
                if digits.is_empty() {
                    return Err("invalid escape sequence: empty \\x{}".into());
                }
                for d in digits {
                    let d = hex(d).ok_or("invalid escape sequence: bad hex digit in \\x{}")?;
                    v = v.saturating_mul(16).saturating_add(d);
                }
                if v > 0x10FFFF {
                    return Err("invalid escape sequence: \\x{} code point too large".into());
                }
                Ok((v, i + 4 + close))
            } else {
                match (p.get(i + 2).and_then(hex), p.get(i + 3).and_then(hex)) {
                    (Some(h), Some(l)) => Ok((h * 16 + l, i + 4)),
                    _ => Err("invalid escape sequence: \\x needs two hex digits".into()),
                }
            }
        }
        // Escaped punctuation (and other non-word ASCII) stands for itself.
        _ if c.is_ascii() && !c.is_ascii_alphanumeric() => simple(c),
        _ => Err(format!(
            "invalid escape sequence: \\{}",
            String::from_utf8_lossy(&p[i + 1..i + 2])
        )),
    }
}

/// Emits a literal byte. Under `(?i)` (`fold`), `regex` folds ASCII letters itself; non-ASCII
/// Latin-1 letters are paired here.
fn push_literal(out: &mut String, b: u8, fold: bool) {
    if b.is_ascii_alphanumeric() {
        out.push(b as char);
    } else if fold && !b.is_ascii() && latin1_case_counterpart(b).is_some() {
        let mut set = ByteSet::new();
        set.insert(b);
        set.finish(false, true).emit(out, true);
    } else {
        let _ = write!(out, "\\x{b:02X}");
    }
}

/// Parses a counted repetition `{n}`, `{n,}` or `{n,m}` at the start of `p`; returns
/// `(n, m, has_comma, length)`. Anything else is not a repetition (RE2 then reads `{` as a
/// literal).
fn counted_repeat(p: &[u8]) -> Option<(u32, Option<u32>, bool, usize)> {
    let close = p.iter().position(|&b| b == b'}')?;
    let body = &p[1..close];
    let number = |s: &[u8]| -> Option<u32> {
        if s.is_empty() || !s.iter().all(u8::is_ascii_digit) {
            return None;
        }
        // Saturate: anything this large is rejected as too big anyway.
        Some(s.iter().fold(0u32, |v, d| {
            v.saturating_mul(10).saturating_add(u32::from(d - b'0'))
        }))
    };
    match body.iter().position(|&b| b == b',') {
        None => Some((number(body)?, None, false, close + 1)),
        Some(comma) => {
            let min = number(&body[..comma])?;
            let rest = &body[comma + 1..];
            if rest.is_empty() {
                Some((min, None, true, close + 1))
            } else {
                Some((min, Some(number(rest)?), true, close + 1))
            }
        }
    }
}

/// Translation state: the output, the `(?i)` state and the groups it is saved in.
struct Translation {
    out: String,
    /// Whether `(?i)` is in effect.
    fold: bool,
    /// For each open group: `fold` outside it and where it starts in `out`.
    groups: Vec<(bool, usize)>,
    /// Flag-only groups like `(?i)` not yet emitted. RE2 lets a repetition operator after one
    /// apply to the atom before it (`a(?i)*` is `a*` with `i` set), so they are emitted just
    /// before the next token that is not a repetition.
    pending_flags: String,
}

impl Translation {
    fn flush_flags(&mut self) {
        self.out.push_str(&self.pending_flags);
        self.pending_flags.clear();
    }
}

/// Translates an RE2 pattern (Latin-1 mode, Perl-like syntax as Bigtable configures it) into
/// the `regex` crate's syntax for a bytes regex with Unicode disabled.
///
/// Every literal byte and every class is emitted as `\xHH` escapes, so `regex`-only syntax
/// (nested classes, `&&`, `\<`, ...) can never be introduced by the input. RE2 constructs with
/// a different meaning in `regex` are rewritten: `\C` (any byte), `\Q...\E`, octal escapes,
/// `\s` (no `\v` in RE2), `[` and `{` as literals, Latin-1 `\pN` classes, case folding of
/// negated classes and of Latin-1 letters under `(?i)`, repetitions after flag groups.
/// Constructs RE2 rejects (stacked repetitions, `a{1001}`, lookaround, backreferences,
/// unbalanced parentheses, flags other than `imsU`) are rejected. The translation was checked
/// against libre2 (Latin-1, full match) on about a million random patterns.
fn translate_re2(p: &[u8]) -> Result<String, String> {
    let mut t = Translation {
        out: String::with_capacity(p.len() * 4 + 8),
        fold: false,
        groups: Vec::new(),
        pending_flags: String::new(),
    };
    let mut i = 0usize;
    // Where the last atom (what a repetition would apply to) starts in `t.out`.
    let mut atom: Option<usize> = None;
    // Whether the last token was a repetition, and whether flag groups came after it.
    let mut after_repeat = false;
    let mut flags_since_repeat = false;
    // RE2 caps the product of nested counted repetitions (`(a{10}){200}`) at 1000: the largest
    // product inside the last atom, inside the current group, and inside each enclosing group.
    let mut atom_product: u64 = 1;
    let mut group_product: u64 = 1;
    let mut enclosing_products: Vec<u64> = Vec::new();
    while i < p.len() {
        let c = p[i];
        let repeat = match c {
            b'*' | b'+' | b'?' => Some(((c as char).to_string(), 1, 1)),
            b'{' => match counted_repeat(&p[i..]) {
                Some((min, max, comma, len)) => {
                    if min > MAX_REPEAT || max.is_some_and(|m| m > MAX_REPEAT || m < min) {
                        return Err(format!(
                            "bad repetition operator: {}",
                            String::from_utf8_lossy(&p[i..i + len])
                        ));
                    }
                    let op = match (comma, max) {
                        (false, _) => format!("{{{min}}}"),
                        (true, None) => format!("{{{min},}}"),
                        (true, Some(max)) => format!("{{{min},{max}}}"),
                    };
                    Some((op, len, u64::from(max.unwrap_or(min))))
                }
                None => None,
            },
            _ => None,
        };
        if let Some((op, len, count)) = repeat {
            let Some(start) = atom else {
                return Err(format!("missing argument to repetition operator: {op}"));
            };
            if after_repeat {
                if !flags_since_repeat {
                    return Err(format!("bad repetition operator: {op}"));
                }
                // `a*(?i)+`: RE2 repeats the repetition; `regex` needs a group for that.
                t.out.insert_str(start, "(?:");
                t.out.push(')');
            }
            if count > 0 {
                atom_product = atom_product.saturating_mul(count);
                if atom_product > u64::from(MAX_REPEAT) {
                    return Err(format!("invalid repetition size: {op}"));
                }
                group_product = group_product.max(atom_product);
            }
            t.out.push_str(&op);
            i += len;
            if p.get(i) == Some(&b'?') {
                t.out.push('?');
                i += 1;
            }
            after_repeat = true;
            flags_since_repeat = false;
            continue;
        }
        if c == b'(' && translate_flag_group(p, &mut i, &mut t)? {
            flags_since_repeat = true;
            continue;
        }
        // An empty quote `\Q\E` is just as transparent.
        if p[i..].starts_with(b"\\Q") && (p[i + 2..].starts_with(b"\\E") || i + 2 == p.len()) {
            i = (i + 4).min(p.len());
            flags_since_repeat = true;
            continue;
        }
        after_repeat = false;
        t.flush_flags();
        let start = t.out.len();
        atom_product = 1;
        match c {
            b'\\' => {
                let (next, last) = translate_escape(p, i, &mut t)?;
                i = next;
                // `\Q...\E` emits several atoms (or none); a repetition applies to the last.
                atom = match last {
                    Some(last) => Some(last),
                    None if t.out.len() > start => Some(start),
                    None => atom,
                };
            }
            b'[' => {
                i = translate_class(p, i, &mut t)?;
                atom = Some(start);
            }
            b'(' => {
                i = translate_group(p, i, &mut t)?;
                enclosing_products.push(group_product);
                group_product = 1;
                atom = None;
            }
            b')' => {
                let (fold, group_start) = t
                    .groups
                    .pop()
                    .ok_or("unexpected ): unmatched parenthesis")?;
                t.fold = fold;
                t.out.push(')');
                i += 1;
                atom = Some(group_start);
                atom_product = group_product;
                group_product = enclosing_products.pop().unwrap_or(1).max(atom_product);
            }
            b'|' => {
                t.out.push('|');
                i += 1;
                atom = None;
            }
            b'^' | b'$' | b'.' => {
                t.out.push(c as char);
                i += 1;
                atom = Some(start);
            }
            _ => {
                push_literal(&mut t.out, c, t.fold);
                i += 1;
                atom = Some(start);
            }
        }
    }
    t.flush_flags();
    if !t.groups.is_empty() {
        return Err("missing ): unmatched parenthesis".into());
    }
    Ok(t.out)
}

/// A parsed `(?flags)` or `(?flags:` group opening.
struct FlagGroup {
    /// The flags in `regex` syntax (`im-s`): each flag once, last setting wins as in RE2.
    flags: String,
    /// The new `(?i)` state, if the group changes it.
    fold: Option<bool>,
    /// Whether it opens a group (`(?flags:`) rather than setting flags until the group ends.
    opens_group: bool,
    /// The index after the syntax.
    next: usize,
}

/// Parses `(?flags)` or `(?flags:` at `p[i]`; `None` when `p[i..]` is not a flags group.
fn parse_flags(p: &[u8], i: usize) -> Result<Option<FlagGroup>, String> {
    const FLAGS: [u8; 4] = [b'i', b'm', b's', b'U'];
    if p.get(i + 1) != Some(&b'?') {
        return Ok(None);
    }
    let mut j = i + 2;
    let mut negated = false;
    let mut flag_since_dash = false;
    let mut settings: [Option<bool>; 4] = [None; 4];
    loop {
        match p.get(j) {
            Some(&f) if FLAGS.contains(&f) => {
                let k = FLAGS.iter().position(|&x| x == f).unwrap_or(0);
                settings[k] = Some(!negated);
                flag_since_dash = true;
            }
            Some(b'-') if !negated => {
                negated = true;
                flag_since_dash = false;
            }
            Some(&end @ (b':' | b')')) => {
                if negated && !flag_since_dash {
                    return Err("invalid or unsupported Perl syntax: negation without flags".into());
                }
                let pick = |on: bool| -> String {
                    FLAGS
                        .iter()
                        .zip(settings)
                        .filter(|(_, s)| *s == Some(on))
                        .map(|(f, _)| *f as char)
                        .collect()
                };
                let (set, unset) = (pick(true), pick(false));
                let flags = if unset.is_empty() {
                    set
                } else {
                    format!("{set}-{unset}")
                };
                return Ok(Some(FlagGroup {
                    flags,
                    fold: settings[0],
                    opens_group: end == b':',
                    next: j + 1,
                }));
            }
            // Not a flags group: named groups and errors are handled by `translate_group`.
            _ => return Ok(None),
        }
        j += 1;
    }
}

/// Handles a flag-only group `(?flags)` at `p[*i]`: records it as pending and returns true.
fn translate_flag_group(p: &[u8], i: &mut usize, t: &mut Translation) -> Result<bool, String> {
    match parse_flags(p, *i)? {
        Some(group) if !group.opens_group => {
            if !group.flags.is_empty() {
                let _ = write!(t.pending_flags, "(?{})", group.flags);
            }
            if let Some(fold) = group.fold {
                t.fold = fold;
            }
            *i = group.next;
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// Translates a group opening at `p[i]` (`(`); returns the index after the opening syntax.
fn translate_group(p: &[u8], i: usize, t: &mut Translation) -> Result<usize, String> {
    let outer = (t.fold, t.out.len());
    // Captures are never used, so every group is emitted non-capturing; this also keeps
    // duplicate names (which RE2 accepts) out of `regex`.
    if p.get(i + 1) != Some(&b'?') {
        t.out.push_str("(?:");
        t.groups.push(outer);
        return Ok(i + 1);
    }
    if let Some(group) = parse_flags(p, i)? {
        let _ = write!(t.out, "(?{}:", group.flags);
        t.groups.push(outer);
        if let Some(fold) = group.fold {
            t.fold = fold;
        }
        return Ok(group.next);
    }
    let rest = &p[i + 2..];
    let name_start = if rest.starts_with(b"P<") {
        i + 4
    } else if rest.starts_with(b"<") && !rest.starts_with(b"<=") && !rest.starts_with(b"<!") {
        i + 3
    } else {
        let end = p[i..]
            .iter()
            .position(|&b| b == b')' || b == b':')
            .map_or(p.len(), |k| i + k + 1);
        return Err(format!(
            "invalid or unsupported Perl syntax: {}",
            String::from_utf8_lossy(&p[i..end])
        ));
    };
    let close = p[name_start..]
        .iter()
        .position(|&b| b == b'>')
        .ok_or("invalid named capture group: missing '>'")?;
    let name = &p[name_start..name_start + close];
    if name.is_empty() || !name.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'_') {
        return Err(format!(
            "invalid named capture group: {}",
            String::from_utf8_lossy(name)
        ));
    }
    t.out.push_str("(?:");
    t.groups.push(outer);
    Ok(name_start + close + 1)
}

/// Translates an escape outside a class; returns the index after it and, for `\\Q...\\E`,
/// where its last atom starts.
fn translate_escape(
    p: &[u8],
    i: usize,
    t: &mut Translation,
) -> Result<(usize, Option<usize>), String> {
    let Some(&c) = p.get(i + 1) else {
        return Err("trailing \\ at end of regular expression".into());
    };
    match c {
        b'C' => t.out.push_str("(?s:.)"),
        b'Q' => {
            let mut j = i + 2;
            let mut last = None;
            while j < p.len() {
                if p[j] == b'\\' && p.get(j + 1) == Some(&b'E') {
                    return Ok((j + 2, last));
                }
                last = Some(t.out.len());
                push_literal(&mut t.out, p[j], t.fold);
                j += 1;
            }
            return Ok((j, last));
        }
        b'b' | b'B' | b'A' | b'z' => {
            t.out.push('\\');
            t.out.push(c as char);
        }
        b'd' | b'D' | b's' | b'S' | b'w' | b'W' => {
            if let Some((set, negated)) = perl_class(c) {
                set.finish(negated, t.fold).emit(&mut t.out, t.fold);
            }
        }
        b'p' | b'P' => {
            let (set, negated, next) = unicode_class(p, i, t.fold)?;
            set.finish(negated, t.fold).emit(&mut t.out, t.fold);
            return Ok((next, None));
        }
        _ => {
            let (v, next) = literal_escape(p, i)?;
            push_literal(&mut t.out, v, t.fold);
            return Ok((next, None));
        }
    }
    Ok((i + 2, None))
}

/// One element of a character class: a single character (which may start a range) or a set.
enum ClassAtom {
    Char(u8),
    Set(ByteSet),
}

fn class_atom(p: &[u8], j: usize, fold: bool) -> Result<(ClassAtom, usize), String> {
    if p[j] != b'\\' {
        return Ok((ClassAtom::Char(p[j]), j + 1));
    }
    match p.get(j + 1) {
        Some(&c @ (b'd' | b'D' | b's' | b'S' | b'w' | b'W')) => match perl_class(c) {
            Some((set, negated)) => Ok((ClassAtom::Set(set.finish(negated, fold)), j + 2)),
            None => Err("invalid escape sequence in character class".into()),
        },
        Some(b'p' | b'P') => {
            let (set, negated, next) = unicode_class(p, j, fold)?;
            Ok((ClassAtom::Set(set.finish(negated, fold)), next))
        }
        _ => {
            let (v, next) = literal_escape(p, j)?;
            Ok((ClassAtom::Char(v), next))
        }
    }
}

/// Translates a character class starting at `p[i]` (`[`); returns the index after it.
fn translate_class(p: &[u8], i: usize, t: &mut Translation) -> Result<usize, String> {
    let mut j = i + 1;
    let negated = p.get(j) == Some(&b'^');
    if negated {
        j += 1;
    }
    let mut set = ByteSet::new();
    let mut first = true;
    loop {
        let Some(&c) = p.get(j) else {
            return Err("missing ]: unterminated character class".into());
        };
        // A ']' right after '[' or '[^' is a literal.
        if c == b']' && !first {
            j += 1;
            break;
        }
        first = false;
        // A POSIX class "[:name:]"; without a closing ":]" the '[' is a literal.
        if c == b'['
            && p.get(j + 1) == Some(&b':')
            && let Some(len) = p[j + 2..].windows(2).position(|w| w == b":]")
        {
            let name = &p[j + 2..j + 2 + len];
            let (class, class_negated) = posix_class(name).ok_or_else(|| {
                format!(
                    "invalid character class range: [:{}:]",
                    String::from_utf8_lossy(name)
                )
            })?;
            set.union(&class.finish(class_negated, t.fold));
            j += len + 4;
            continue;
        }
        let (atom, next) = class_atom(p, j, t.fold)?;
        j = next;
        match atom {
            ClassAtom::Set(class) => set.union(&class),
            ClassAtom::Char(lo) => {
                let is_range = p.get(j) == Some(&b'-') && p.get(j + 1).is_some_and(|&b| b != b']');
                if !is_range {
                    set.add_range(lo, lo);
                    continue;
                }
                let (hi, next) = class_atom(p, j + 1, t.fold)?;
                let ClassAtom::Char(hi) = hi else {
                    return Err("bad character class range: class escape as range end".into());
                };
                if hi < lo {
                    return Err(format!("bad character class range: {lo:#x}-{hi:#x}"));
                }
                set.add_range(lo, hi);
                j = next;
            }
        }
    }
    set.finish(negated, t.fold).emit(&mut t.out, t.fold);
    Ok(j)
}

// ------------------------------------------------------------------------------ sampling

/// A uniform value in `[0, 1)` from a per-thread xorshift64* generator seeded from the clock.
fn default_sample() -> f64 {
    thread_local! {
        static STATE: std::cell::Cell<u64> = std::cell::Cell::new(seed());
    }
    STATE.with(|state| {
        let mut x = state.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        state.set(x);
        let r = x.wrapping_mul(0x2545_F491_4F6C_DD1D);
        (r >> 11) as f64 / (1u64 << 53) as f64
    })
}

fn seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let local = 0u8;
    let addr = &local as *const u8 as u64;
    // splitmix64 finaliser; never zero (xorshift would stick at zero).
    let mut z = nanos ^ addr.rotate_left(32) ^ 0x9E37_79B9_7F4A_7C15;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) | 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use pb::row_filter::{Chain, Condition, Interleave};
    use proptest::prelude::*;

    // ---------------------------------------------------------------- helpers

    fn rf(f: F) -> pb::RowFilter {
        pb::RowFilter { filter: Some(f) }
    }
    fn unset() -> pb::RowFilter {
        pb::RowFilter { filter: None }
    }
    fn chain(filters: Vec<pb::RowFilter>) -> pb::RowFilter {
        rf(F::Chain(Chain { filters }))
    }
    fn interleave(filters: Vec<pb::RowFilter>) -> pb::RowFilter {
        rf(F::Interleave(Interleave { filters }))
    }
    fn condition(
        predicate: Option<pb::RowFilter>,
        on_true: Option<pb::RowFilter>,
        on_false: Option<pb::RowFilter>,
    ) -> pb::RowFilter {
        rf(F::Condition(Box::new(Condition {
            predicate_filter: predicate.map(Box::new),
            true_filter: on_true.map(Box::new),
            false_filter: on_false.map(Box::new),
        })))
    }
    fn pass() -> pb::RowFilter {
        rf(F::PassAllFilter(true))
    }
    fn block() -> pb::RowFilter {
        rf(F::BlockAllFilter(true))
    }
    fn sink() -> pb::RowFilter {
        rf(F::Sink(true))
    }
    fn strip() -> pb::RowFilter {
        rf(F::StripValueTransformer(true))
    }
    fn label(l: &str) -> pb::RowFilter {
        rf(F::ApplyLabelTransformer(l.to_string()))
    }
    fn family(re: &str) -> pb::RowFilter {
        rf(F::FamilyNameRegexFilter(re.to_string()))
    }
    fn qualifier(re: &[u8]) -> pb::RowFilter {
        rf(F::ColumnQualifierRegexFilter(Bytes::copy_from_slice(re)))
    }
    fn value(re: &[u8]) -> pb::RowFilter {
        rf(F::ValueRegexFilter(Bytes::copy_from_slice(re)))
    }
    fn key_regex(re: &[u8]) -> pb::RowFilter {
        rf(F::RowKeyRegexFilter(Bytes::copy_from_slice(re)))
    }
    fn row_limit(n: i32) -> pb::RowFilter {
        rf(F::CellsPerRowLimitFilter(n))
    }
    fn row_offset(n: i32) -> pb::RowFilter {
        rf(F::CellsPerRowOffsetFilter(n))
    }
    fn column_limit(n: i32) -> pb::RowFilter {
        rf(F::CellsPerColumnLimitFilter(n))
    }
    fn ts_range(start: i64, end: i64) -> pb::RowFilter {
        rf(F::TimestampRangeFilter(pb::TimestampRange {
            start_timestamp_micros: start,
            end_timestamp_micros: end,
        }))
    }
    fn sample(p: f64) -> pb::RowFilter {
        rf(F::RowSampleFilter(p))
    }

    fn b(s: &[u8]) -> Bytes {
        Bytes::copy_from_slice(s)
    }

    fn cell(family: &str, qualifier: &[u8], ts: i64, value: &[u8]) -> Cell {
        Cell {
            family: family.to_string(),
            qualifier: b(qualifier),
            timestamp_micros: ts,
            value: b(value),
            labels: vec![],
        }
    }

    fn row(key: &[u8], cells: Vec<Cell>) -> Row {
        Row { key: b(key), cells }
    }

    /// "family:qualifier@ts=value[labels]" with bytes escaped, for readable assertions.
    fn show(cells: &[Cell]) -> Vec<String> {
        cells
            .iter()
            .map(|c| {
                format!(
                    "{}:{}@{}={}[{}]",
                    c.family,
                    c.qualifier.escape_ascii(),
                    c.timestamp_micros,
                    c.value.escape_ascii(),
                    c.labels.join(",")
                )
            })
            .collect()
    }

    fn compile(f: &pb::RowFilter) -> RowFilter {
        RowFilter::compile(f).unwrap_or_else(|e| panic!("{f:?} should compile: {e}"))
    }

    fn run(f: &pb::RowFilter, r: &Row) -> Vec<String> {
        show(&compile(f).apply_with_sampler(r, &mut || 0.5))
    }

    fn err(f: &pb::RowFilter) -> FilterError {
        match RowFilter::compile(f) {
            Ok(_) => panic!("{f:?} should be rejected"),
            Err(e) => e,
        }
    }

    /// A row with two families, several columns and versions, already in Bigtable order.
    fn sample_row() -> Row {
        row(
            b"row-1",
            vec![
                cell("cf1", b"a", 3000, b"a3"),
                cell("cf1", b"a", 2000, b"a2"),
                cell("cf1", b"a", 1000, b"a1"),
                cell("cf1", b"b", 2000, b"b2"),
                cell("cf1", b"c", 1000, b""),
                cell("cf2", b"a", 5000, b"x"),
                cell("cf2", b"z", 4000, b"yy"),
            ],
        )
    }

    fn all_of(r: &Row) -> Vec<String> {
        show(&r.cells)
    }

    // ---------------------------------------------------------------- pass / block / unset

    #[test]
    fn pass_all_variants_return_every_cell() {
        let r = sample_row();
        assert_eq!(run(&pass(), &r), all_of(&r));
        assert_eq!(run(&unset(), &r), all_of(&r));
        assert_eq!(
            show(&RowFilter::pass_all().apply(&r)),
            all_of(&r),
            "pass_all()"
        );
        assert!(!RowFilter::pass_all().is_block_all());
        assert!(!compile(&unset()).is_block_all());
        // An unset filter nested in a chain also passes everything.
        assert_eq!(run(&chain(vec![unset(), unset()]), &r), all_of(&r));
    }

    #[test]
    fn block_all_returns_nothing() {
        let r = sample_row();
        assert!(run(&block(), &r).is_empty());
        assert!(compile(&block()).is_block_all());
        assert!(!compile(&pass()).is_block_all());
    }

    #[test]
    fn empty_row_gives_empty_output() {
        let r = row(b"k", vec![]);
        assert!(run(&pass(), &r).is_empty());
        assert!(run(&condition(None, None, Some(pass())), &r).is_empty());
    }

    // ---------------------------------------------------------------- chain

    #[test]
    fn chain_applies_filters_in_sequence() {
        let r = sample_row();
        // Each sub-filter sees the previous output: first cf1, then the newest per column,
        // then the first two cells of what is left.
        let f = chain(vec![family("cf1"), column_limit(1), row_limit(2)]);
        assert_eq!(run(&f, &r), ["cf1:a@3000=a3[]", "cf1:b@2000=b2[]"]);
        // Order matters: the row limit first keeps 2 cells, both in column cf1:a.
        let f = chain(vec![row_limit(2), column_limit(1)]);
        assert_eq!(run(&f, &r), ["cf1:a@3000=a3[]"]);
    }

    #[test]
    fn chain_with_block_all_outputs_nothing() {
        let f = chain(vec![pass(), block()]);
        assert!(run(&f, &sample_row()).is_empty());
        assert!(compile(&f).is_block_all());
    }

    // ---------------------------------------------------------------- interleave

    #[test]
    fn interleave_merges_in_bigtable_order_and_keeps_duplicates() {
        let r = sample_row();
        let f = interleave(vec![
            chain(vec![family("cf2"), label("two")]),
            chain(vec![qualifier(b"a"), label("qa")]),
        ]);
        assert_eq!(
            run(&f, &r),
            [
                "cf1:a@3000=a3[qa]",
                "cf1:a@2000=a2[qa]",
                "cf1:a@1000=a1[qa]",
                // cf2:a@5000 is produced by both sub-filters: both copies are output, in
                // sub-filter order (the proto leaves their mutual order unspecified).
                "cf2:a@5000=x[two]",
                "cf2:a@5000=x[qa]",
                "cf2:z@4000=yy[two]",
            ]
        );
    }

    #[test]
    fn interleave_identical_copies_are_all_output() {
        // Like the proto's "far,blah,5,x" #5 and #6: two sub-filters produce the same cell.
        let r = row(b"k", vec![cell("far", b"blah", 5000, b"x")]);
        let f = interleave(vec![pass(), pass(), block()]);
        assert_eq!(run(&f, &r), ["far:blah@5000=x[]", "far:blah@5000=x[]"]);
    }

    #[test]
    fn interleave_proto_example_shape() {
        // The proto's example: f(0) and f(1) both produce foo:bar@10 (different values), f(1)
        // and f(2) both produce far:blah@5. Output is sorted; both copies of each are kept.
        let r = row(
            b"k",
            vec![
                cell("far", b"bar", 7000, b"a"),
                cell("far", b"blah", 5000, b"x"),
                cell("foo", b"bar", 10000, b"x"),
                cell("foo", b"blah", 11000, b"z"),
            ],
        );
        let f0 = family("foo");
        let f1 = interleave(vec![
            chain(vec![family("foo"), qualifier(b"bar"), value(b"x"), strip()]),
            chain(vec![family("far"), qualifier(b"blah")]),
        ]);
        let f2 = family("far");
        let out = run(&interleave(vec![f0, f1, f2]), &r);
        assert_eq!(
            out,
            [
                "far:bar@7000=a[]",
                "far:blah@5000=x[]",
                "far:blah@5000=x[]",
                "foo:bar@10000=x[]",
                "foo:bar@10000=[]",
                "foo:blah@11000=z[]",
            ]
        );
    }

    #[test]
    fn interleave_then_limits_count_each_copy() {
        let r = row(
            b"k",
            vec![cell("f", b"q", 2000, b"new"), cell("f", b"q", 1000, b"old")],
        );
        let dup = interleave(vec![pass(), pass()]);
        assert_eq!(
            run(&chain(vec![dup.clone(), column_limit(2)]), &r),
            ["f:q@2000=new[]", "f:q@2000=new[]"]
        );
        assert_eq!(
            run(&chain(vec![dup.clone(), row_limit(3)]), &r),
            ["f:q@2000=new[]", "f:q@2000=new[]", "f:q@1000=old[]"]
        );
        assert_eq!(
            run(&chain(vec![dup, row_offset(1)]), &r),
            ["f:q@2000=new[]", "f:q@1000=old[]", "f:q@1000=old[]"]
        );
    }

    #[test]
    fn interleave_block_alls_is_block_all() {
        assert!(compile(&interleave(vec![block(), block()])).is_block_all());
        assert!(!compile(&interleave(vec![block(), pass()])).is_block_all());
    }

    // ---------------------------------------------------------------- condition

    #[test]
    fn condition_picks_branch_on_predicate_output() {
        let r = sample_row();
        let f = condition(Some(family("cf2")), Some(strip()), Some(block()));
        let stripped: Vec<String> = r
            .cells
            .iter()
            .map(|c| {
                show(&[Cell {
                    value: Bytes::new(),
                    ..c.clone()
                }])[0]
                    .clone()
            })
            .collect();
        assert_eq!(
            run(&f, &r),
            stripped,
            "true branch applies to the whole input row"
        );
        let f = condition(Some(family("nope")), Some(strip()), Some(row_limit(1)));
        assert_eq!(run(&f, &r), ["cf1:a@3000=a3[]"], "false branch");
    }

    #[test]
    fn condition_missing_branch_outputs_nothing() {
        let r = sample_row();
        assert!(run(&condition(Some(pass()), None, Some(pass())), &r).is_empty());
        assert!(run(&condition(Some(block()), Some(pass()), None), &r).is_empty());
        assert_eq!(
            run(&condition(Some(pass()), Some(pass()), None), &r),
            all_of(&r)
        );
        assert!(compile(&condition(Some(pass()), None, None)).is_block_all());
    }

    #[test]
    fn condition_without_predicate_is_true_for_non_empty_rows() {
        let r = sample_row();
        assert_eq!(
            run(&condition(None, Some(row_limit(1)), Some(block())), &r),
            ["cf1:a@3000=a3[]"]
        );
    }

    #[test]
    fn condition_predicate_transformations_do_not_leak() {
        let r = sample_row();
        let f = condition(
            Some(chain(vec![strip(), label("pred"), row_limit(1)])),
            Some(pass()),
            None,
        );
        assert_eq!(run(&f, &r), all_of(&r));
        // A predicate that strips everything out (value regex on stripped values) is false.
        let f = condition(
            Some(chain(vec![strip(), value(b"a3")])),
            Some(pass()),
            Some(family("cf2")),
        );
        assert_eq!(run(&f, &r), ["cf2:a@5000=x[]", "cf2:z@4000=yy[]"]);
    }

    #[test]
    fn condition_inside_chain_sees_intermediate_row() {
        let r = sample_row();
        let f = chain(vec![
            family("cf2"),
            condition(Some(qualifier(b"a")), Some(label("hit")), Some(block())),
        ]);
        assert_eq!(run(&f, &r), ["cf2:a@5000=x[hit]", "cf2:z@4000=yy[hit]"]);
    }

    // ---------------------------------------------------------------- sink

    #[test]
    fn sink_proto_example() {
        // Chain(FamilyRegex("A"), Interleave(All(), Chain(Label("foo"), Sink())),
        //       QualifierRegex("B")) from data.proto.
        let r = row(
            b"k",
            vec![
                cell("A", b"A", 1, b"w"),
                cell("A", b"B", 2, b"x"),
                cell("B", b"B", 4, b"z"),
            ],
        );
        let f = chain(vec![
            family("A"),
            interleave(vec![pass(), chain(vec![label("foo"), sink()])]),
            qualifier(b"B"),
        ]);
        assert_eq!(
            run(&f, &r),
            ["A:A@1=w[foo]", "A:B@2=x[foo]", "A:B@2=x[]"],
            "exactly the output drawn in the proto"
        );
        assert!(!compile(&f).is_block_all());
    }

    #[test]
    fn sink_bypasses_later_filters_and_outputs_nothing_to_parent() {
        let r = sample_row();
        assert_eq!(run(&sink(), &r), all_of(&r), "top-level sink");
        // Everything after a sink in a chain sees an empty row.
        let f = chain(vec![family("cf2"), sink(), label("never")]);
        assert_eq!(run(&f, &r), ["cf2:a@5000=x[]", "cf2:z@4000=yy[]"]);
        // A sink branch passes nothing to the interleave: block_all after it changes nothing.
        let f = chain(vec![interleave(vec![sink(), family("cf1")]), block()]);
        assert_eq!(run(&f, &r), all_of(&r));
        assert!(!compile(&f).is_block_all());
        // A sink that can never be reached.
        assert!(compile(&chain(vec![block(), sink()])).is_block_all());
    }

    #[test]
    fn sink_output_is_merged_in_bigtable_order() {
        let r = sample_row();
        let f = interleave(vec![
            chain(vec![family("cf2"), label("s"), sink()]),
            chain(vec![qualifier(b"a"), row_limit(1)]),
        ]);
        assert_eq!(
            run(&f, &r),
            ["cf1:a@3000=a3[]", "cf2:a@5000=x[s]", "cf2:z@4000=yy[s]"]
        );
    }

    #[test]
    fn sink_in_condition_is_rejected() {
        for f in [
            condition(Some(sink()), Some(pass()), None),
            condition(Some(pass()), Some(sink()), None),
            condition(Some(pass()), None, Some(sink())),
            condition(
                Some(pass()),
                Some(chain(vec![pass(), interleave(vec![sink(), pass()])])),
                None,
            ),
            chain(vec![
                pass(),
                condition(Some(chain(vec![pass(), sink()])), None, None),
            ]),
        ] {
            assert_eq!(err(&f), FilterError::SinkInCondition, "{f:?}");
        }
    }

    // ---------------------------------------------------------------- row key regex

    #[test]
    fn row_key_regex_is_a_full_match() {
        let r = sample_row(); // key "row-1"
        assert_eq!(run(&key_regex(b"row-1"), &r), all_of(&r));
        assert_eq!(run(&key_regex(b"row-.*"), &r), all_of(&r));
        assert!(run(&key_regex(b"row"), &r).is_empty(), "prefix only");
        assert!(run(&key_regex(b"ow-1"), &r).is_empty(), "suffix only");
        assert!(run(&key_regex(b"row-1|x"), &r).len() == r.cells.len());
        assert!(
            run(&key_regex(b"x|row"), &r).is_empty(),
            "alternation anchored"
        );
    }

    #[test]
    fn row_key_regex_dot_and_backslash_c() {
        let r = row(b"a\nb", vec![cell("f", b"q", 1, b"v")]);
        assert!(
            run(&key_regex(b"a.b"), &r).is_empty(),
            ". does not match \\n"
        );
        assert_eq!(run(&key_regex(b"a\\Cb"), &r).len(), 1, "\\C matches \\n");
        assert_eq!(run(&key_regex(b"\\C*"), &r).len(), 1);
        assert_eq!(
            run(&key_regex(b"(?s)a.b"), &r).len(),
            1,
            "(?s) lets . match \\n"
        );
        assert_eq!(run(&key_regex(b"a\\nb"), &r).len(), 1);
        let r = row(b"\xff\x00", vec![cell("f", b"q", 1, b"v")]);
        assert_eq!(
            run(&key_regex(b"\\C\\C"), &r).len(),
            1,
            "\\C matches any byte"
        );
        assert_eq!(
            run(&key_regex(b".."), &r).len(),
            1,
            ". matches non-UTF-8 bytes"
        );
        assert_eq!(
            run(&key_regex(b"\xff\\x00"), &r).len(),
            1,
            "raw Latin-1 byte"
        );
        assert!(
            run(&key_regex(b"."), &r).is_empty(),
            "one byte is one character"
        );
    }

    // ---------------------------------------------------------------- row sample

    #[test]
    fn row_sample_uses_the_sampler() {
        let r = sample_row();
        let f = compile(&sample(0.25));
        assert_eq!(f.apply_with_sampler(&r, &mut || 0.1).len(), r.cells.len());
        assert!(f.apply_with_sampler(&r, &mut || 0.25).is_empty());
        assert!(f.apply_with_sampler(&r, &mut || 0.9).is_empty());
        // The default sampler keeps roughly a quarter of the rows.
        let kept = (0..4000).filter(|_| !f.apply(&r).is_empty()).count();
        assert!((700..1300).contains(&kept), "kept {kept} of 4000");
    }

    #[test]
    fn row_sample_draws_once_per_evaluation() {
        let r = sample_row();
        let f = compile(&interleave(vec![
            chain(vec![sample(0.5), label("one")]),
            chain(vec![sample(0.5), label("two")]),
        ]));
        let mut draws = [0.1, 0.9].into_iter();
        let out = f.apply_with_sampler(&r, &mut || draws.next().unwrap());
        assert!(out.iter().all(|c| c.labels == ["one"]));
        assert_eq!(out.len(), r.cells.len());
    }

    #[test]
    fn row_sample_probability_must_be_strictly_between_0_and_1() {
        for p in [0.0, 1.0, -0.5, 1.5, f64::NAN, f64::INFINITY] {
            assert!(
                matches!(
                    err(&sample(p)),
                    FilterError::InvalidSampleProbability { .. }
                ),
                "{p}"
            );
        }
        compile(&sample(f64::MIN_POSITIVE));
        compile(&sample(0.999_999));
    }

    // ---------------------------------------------------------------- family regex

    #[test]
    fn family_name_regex() {
        let r = sample_row();
        assert_eq!(
            run(&family("cf2"), &r),
            ["cf2:a@5000=x[]", "cf2:z@4000=yy[]"]
        );
        assert!(run(&family("cf"), &r).is_empty(), "full match");
        assert_eq!(run(&family("cf[12]"), &r), all_of(&r));
        assert_eq!(run(&family(".*1"), &r).len(), 5);
    }

    #[test]
    fn family_name_regex_rejects_colon() {
        for re in ["cf1:a", ":", "\\:", "[[:alpha:]]+", "\\x3a"] {
            let e = RowFilter::compile(&family(re));
            if re == "\\x3a" {
                // No ':' character in the pattern itself: allowed.
                assert!(e.is_ok());
            } else {
                assert!(
                    matches!(e, Err(FilterError::ColonInFamilyRegex { .. })),
                    "{re}"
                );
            }
        }
    }

    // ---------------------------------------------------------------- qualifier regex

    #[test]
    fn column_qualifier_regex_on_binary_qualifiers() {
        let r = row(
            b"k",
            vec![
                cell("f", b"", 1, b"empty"),
                cell("f", b"a\nb", 1, b"nl"),
                cell("f", b"ab", 1, b"ab"),
                cell("f", b"\x00\xff", 1, b"bin"),
            ],
        );
        assert_eq!(run(&qualifier(b""), &r), ["f:@1=empty[]"]);
        assert_eq!(run(&qualifier(b"a"), &r), Vec::<String>::new());
        assert_eq!(run(&qualifier(b"a.*"), &r), ["f:ab@1=ab[]"]);
        assert_eq!(
            run(&qualifier(b"a\\C*"), &r),
            ["f:a\\nb@1=nl[]", "f:ab@1=ab[]"]
        );
        assert_eq!(run(&qualifier(b"\\x00\\xff"), &r), ["f:\\x00\\xff@1=bin[]"]);
        assert_eq!(run(&qualifier(b"\\x00\xff"), &r), ["f:\\x00\\xff@1=bin[]"]);
        assert_eq!(run(&qualifier(b"[\\x00-\\x01][\x80-\xff]"), &r).len(), 1);
    }

    // ---------------------------------------------------------------- column range

    fn column_range(
        fam: &str,
        start: Option<pb::column_range::StartQualifier>,
        end: Option<pb::column_range::EndQualifier>,
    ) -> pb::RowFilter {
        rf(F::ColumnRangeFilter(pb::ColumnRange {
            family_name: fam.to_string(),
            start_qualifier: start,
            end_qualifier: end,
        }))
    }

    #[test]
    fn column_range_bounds() {
        use pb::column_range::{EndQualifier as E, StartQualifier as S};
        let r = sample_row(); // cf1: a a a b c, cf2: a z
        let quals = |f: pb::RowFilter| -> Vec<String> {
            compile(&f)
                .apply_with_sampler(&r, &mut || 0.0)
                .iter()
                .map(|c| format!("{}:{}", c.family, c.qualifier.escape_ascii()))
                .collect()
        };
        assert_eq!(
            quals(column_range("cf1", None, None)),
            ["cf1:a", "cf1:a", "cf1:a", "cf1:b", "cf1:c"]
        );
        assert_eq!(
            quals(column_range(
                "cf1",
                Some(S::StartQualifierClosed(b(b"b"))),
                None
            )),
            ["cf1:b", "cf1:c"]
        );
        assert_eq!(
            quals(column_range(
                "cf1",
                Some(S::StartQualifierOpen(b(b"b"))),
                None
            )),
            ["cf1:c"]
        );
        assert_eq!(
            quals(column_range(
                "cf1",
                None,
                Some(E::EndQualifierOpen(b(b"b")))
            )),
            ["cf1:a", "cf1:a", "cf1:a"]
        );
        assert_eq!(
            quals(column_range(
                "cf1",
                None,
                Some(E::EndQualifierClosed(b(b"b")))
            )),
            ["cf1:a", "cf1:a", "cf1:a", "cf1:b"]
        );
        assert_eq!(
            quals(column_range(
                "cf2",
                Some(S::StartQualifierOpen(b(b"a"))),
                Some(E::EndQualifierClosed(b(b"z")))
            )),
            ["cf2:z"]
        );
        // An open end at the empty string is infinity (as Bigtable reads ranges).
        assert_eq!(
            quals(column_range("cf2", None, Some(E::EndQualifierOpen(b(b""))))),
            ["cf2:a", "cf2:z"]
        );
        // A closed end at the empty string only matches the empty qualifier.
        assert!(
            quals(column_range(
                "cf2",
                None,
                Some(E::EndQualifierClosed(b(b"")))
            ))
            .is_empty()
        );
        // Reversed and empty ranges match nothing.
        let reversed = column_range(
            "cf1",
            Some(S::StartQualifierClosed(b(b"c"))),
            Some(E::EndQualifierClosed(b(b"a"))),
        );
        assert!(quals(reversed.clone()).is_empty());
        assert!(compile(&reversed).is_block_all());
        let empty = column_range(
            "cf1",
            Some(S::StartQualifierOpen(b(b"b"))),
            Some(E::EndQualifierClosed(b(b"b"))),
        );
        assert!(quals(empty).is_empty());
        // Only the named family.
        assert!(quals(column_range("cf3", None, None)).is_empty());
    }

    #[test]
    fn column_range_requires_family() {
        assert_eq!(
            err(&column_range("", None, None)),
            FilterError::MissingColumnRangeFamily
        );
    }

    // ---------------------------------------------------------------- timestamp range

    #[test]
    fn timestamp_range_is_half_open_with_zero_end_meaning_infinity() {
        let r = sample_row(); // timestamps 3000 2000 1000 2000 1000 5000 4000
        let stamps = |f: pb::RowFilter| -> Vec<i64> {
            compile(&f)
                .apply_with_sampler(&r, &mut || 0.0)
                .iter()
                .map(|c| c.timestamp_micros)
                .collect()
        };
        assert_eq!(stamps(ts_range(2000, 4000)), [3000, 2000, 2000]);
        assert_eq!(stamps(ts_range(4000, 0)), [5000, 4000]);
        assert_eq!(
            stamps(ts_range(0, 0)),
            [3000, 2000, 1000, 2000, 1000, 5000, 4000]
        );
        assert_eq!(stamps(ts_range(0, 1000)), Vec::<i64>::new());
        assert!(stamps(ts_range(3000, 3000)).is_empty());
        assert!(compile(&ts_range(3000, 2000)).is_block_all());
        assert!(!compile(&ts_range(3000, 0)).is_block_all());
    }

    #[test]
    fn timestamp_range_bounds_are_microseconds() {
        let r = row(
            b"k",
            vec![cell("f", b"q", 7000, b"a"), cell("f", b"q", 6999, b"b")],
        );
        let out = compile(&ts_range(7000, 7001)).apply(&r);
        assert_eq!(
            out.iter().map(|c| c.timestamp_micros).collect::<Vec<_>>(),
            [7000]
        );
        let out = compile(&ts_range(1, 7000)).apply(&r);
        assert_eq!(
            out.iter().map(|c| c.timestamp_micros).collect::<Vec<_>>(),
            [6999]
        );
    }

    #[test]
    fn bounded_apply_stops_filters_that_multiply_rows() {
        let pass = rf(F::PassAllFilter(true));
        // Within the 20,480-byte limit, one interleave can copy every cell thousands of times.
        let wide = rf(F::Interleave(pb::row_filter::Interleave {
            filters: vec![pass.clone(); 3000],
        }));
        let compiled = compile(&wide);
        let r = row(
            b"k",
            vec![cell("f", b"q", 1000, b"v"), cell("f", b"r", 1000, b"w")],
        );
        assert_eq!(
            compiled.apply_bounded(&r, 1000).unwrap_err(),
            FilterError::OutputTooLarge { max_copies: 1000 }
        );
        assert_eq!(compiled.apply_bounded(&r, 6000).unwrap().len(), 6000);
        assert_eq!(compiled.apply(&r).len(), 6000);
        let sink = rf(F::Chain(pb::row_filter::Chain {
            filters: vec![rf(F::Sink(true)), pass.clone()],
        }));
        assert_eq!(compile(&sink).apply_bounded(&r, 2).unwrap().len(), 2);
        assert!(compile(&sink).apply_bounded(&r, 1).is_err());
    }

    #[test]
    fn empty_row_key_regex_is_rejected() {
        assert_eq!(
            err(&rf(F::RowKeyRegexFilter(Bytes::new()))),
            FilterError::EmptyRegex {
                field: "row_key_regex_filter"
            }
        );
    }

    // ---------------------------------------------------------------- value regex / range

    #[test]
    fn value_regex_full_match() {
        let r = row(
            b"k",
            vec![
                cell("f", b"1", 1, b"a"),
                cell("f", b"2", 1, b"ab"),
                cell("f", b"3", 1, b"a\n"),
                cell("f", b"4", 1, b""),
                cell("f", b"5", 1, b"\xe9t\xe9"),
            ],
        );
        let quals = |re: &[u8]| -> Vec<String> {
            compile(&value(re))
                .apply_with_sampler(&r, &mut || 0.0)
                .iter()
                .map(|c| c.qualifier.escape_ascii().to_string())
                .collect()
        };
        assert_eq!(quals(b"a"), ["1"], "`a` must not match `ab`");
        assert_eq!(quals(b"a."), ["2"], "`.` does not match \\n");
        assert_eq!(quals(b"a\\C"), ["2", "3"]);
        assert_eq!(quals(b""), ["4"]);
        assert_eq!(quals(b"a?"), ["1", "4"]);
        assert_eq!(quals(b"\xe9t\xe9"), ["5"], "Latin-1 literal bytes");
        assert_eq!(quals(b"\\xe9.\\x{e9}"), ["5"]);
        assert_eq!(quals(b"..."), ["5"], "each byte is one character");
        assert_eq!(
            quals(b"a$"),
            ["1"],
            "$ is end of text, not before a final \\n"
        );
        assert_eq!(quals(b"(?m)a$\\n"), ["3"]);
    }

    fn value_range(
        start: Option<pb::value_range::StartValue>,
        end: Option<pb::value_range::EndValue>,
    ) -> pb::RowFilter {
        rf(F::ValueRangeFilter(pb::ValueRange {
            start_value: start,
            end_value: end,
        }))
    }

    #[test]
    fn value_range_bounds() {
        use pb::value_range::{EndValue as E, StartValue as S};
        let r = row(
            b"k",
            vec![
                cell("f", b"1", 1, b""),
                cell("f", b"2", 1, b"a"),
                cell("f", b"3", 1, b"b"),
                cell("f", b"4", 1, b"b\x00"),
                cell("f", b"5", 1, b"c"),
            ],
        );
        let quals = |f: pb::RowFilter| -> String {
            compile(&f)
                .apply_with_sampler(&r, &mut || 0.0)
                .iter()
                .map(|c| c.qualifier.escape_ascii().to_string())
                .collect()
        };
        assert_eq!(quals(value_range(None, None)), "12345");
        assert_eq!(
            quals(value_range(Some(S::StartValueClosed(b(b"b"))), None)),
            "345"
        );
        assert_eq!(
            quals(value_range(Some(S::StartValueOpen(b(b"b"))), None)),
            "45"
        );
        assert_eq!(
            quals(value_range(Some(S::StartValueOpen(b(b""))), None)),
            "2345"
        );
        assert_eq!(
            quals(value_range(None, Some(E::EndValueOpen(b(b"b"))))),
            "12"
        );
        assert_eq!(
            quals(value_range(None, Some(E::EndValueClosed(b(b"b"))))),
            "123"
        );
        assert_eq!(
            quals(value_range(None, Some(E::EndValueOpen(b(b""))))),
            "12345"
        );
        assert_eq!(
            quals(value_range(None, Some(E::EndValueClosed(b(b""))))),
            "1"
        );
        assert_eq!(
            quals(value_range(
                Some(S::StartValueClosed(b(b"a"))),
                Some(E::EndValueOpen(b(b"c")))
            )),
            "234"
        );
        let reversed = value_range(
            Some(S::StartValueClosed(b(b"c"))),
            Some(E::EndValueOpen(b(b"a"))),
        );
        assert_eq!(quals(reversed.clone()), "");
        assert!(compile(&reversed).is_block_all());
    }

    // ---------------------------------------------------------------- limits and offsets

    #[test]
    fn cells_per_row_offset_and_limit() {
        let r = sample_row();
        let all = all_of(&r);
        assert_eq!(run(&row_offset(0), &r), all);
        assert_eq!(run(&row_offset(2), &r), all[2..]);
        assert!(run(&row_offset(7), &r).is_empty());
        assert!(run(&row_offset(i32::MAX), &r).is_empty());
        assert_eq!(run(&row_limit(3), &r), all[..3]);
        assert_eq!(run(&row_limit(100), &r), all);
        assert!(run(&row_limit(0), &r).is_empty());
        assert!(compile(&row_limit(0)).is_block_all());
        assert!(!compile(&row_offset(0)).is_block_all());
        assert_eq!(
            run(&chain(vec![row_offset(1), row_limit(2)]), &r),
            all[1..3]
        );
    }

    #[test]
    fn cells_per_column_limit_counts_per_family_and_qualifier() {
        let r = sample_row();
        assert_eq!(
            run(&column_limit(1), &r),
            [
                "cf1:a@3000=a3[]",
                "cf1:b@2000=b2[]",
                "cf1:c@1000=[]",
                "cf2:a@5000=x[]",
                "cf2:z@4000=yy[]"
            ]
        );
        assert_eq!(run(&column_limit(2), &r).len(), 6);
        assert!(run(&column_limit(0), &r).is_empty());
        assert!(compile(&column_limit(0)).is_block_all());
        // Same qualifier in two families are two columns.
        let r = row(
            b"k",
            vec![
                cell("x", b"q", 2, b""),
                cell("x", b"q", 1, b""),
                cell("y", b"q", 2, b""),
                cell("y", b"q", 1, b""),
            ],
        );
        assert_eq!(run(&column_limit(1), &r), ["x:q@2=[]", "y:q@2=[]"]);
    }

    #[test]
    fn negative_counts_are_rejected() {
        for (f, field) in [
            (row_offset(-1), "cells_per_row_offset_filter"),
            (row_limit(-1), "cells_per_row_limit_filter"),
            (column_limit(i32::MIN), "cells_per_column_limit_filter"),
        ] {
            assert!(
                matches!(err(&f), FilterError::NegativeCount { field: got, .. } if got == field)
            );
        }
    }

    // ---------------------------------------------------------------- transformers

    #[test]
    fn strip_value_transformer_empties_values() {
        let r = sample_row();
        let out = compile(&strip()).apply(&r);
        assert_eq!(out.len(), r.cells.len());
        assert!(out.iter().all(|c| c.value.is_empty()));
        assert!(
            out.iter()
                .zip(&r.cells)
                .all(|(o, i)| o.order_key() == i.order_key())
        );
        // Filters after the strip see empty values.
        assert_eq!(
            run(&chain(vec![strip(), value(b"")]), &r).len(),
            r.cells.len()
        );
    }

    #[test]
    fn apply_label_transformer_labels_cells() {
        let r = sample_row();
        let out = compile(&label("my-label-1")).apply(&r);
        assert!(out.iter().all(|c| c.labels == ["my-label-1"]));
        compile(&label("a"));
        compile(&label("0123456789abcde"));
        compile(&label("-"));
    }

    #[test]
    fn invalid_labels_are_rejected() {
        for l in [
            "",
            "Upper",
            "under_score",
            "sp ace",
            "0123456789abcdef",
            "é",
            "a:b",
        ] {
            assert_eq!(
                err(&label(l)),
                FilterError::InvalidLabel {
                    label: l.to_string()
                },
                "{l:?}"
            );
        }
    }

    #[test]
    fn a_chain_may_contain_only_one_labelled_sub_filter() {
        assert_eq!(
            err(&chain(vec![label("a"), pass(), label("b")])),
            FilterError::MultipleLabelsInChain {
                first: 0,
                second: 2
            }
        );
        // Labels nested in different sub-filters of one chain count too.
        assert!(matches!(
            err(&chain(vec![
                interleave(vec![label("a"), pass()]),
                condition(Some(pass()), Some(label("b")), None),
            ])),
            FilterError::MultipleLabelsInChain { .. }
        ));
        // Deep inside, a chain of chains each with a label.
        assert!(matches!(
            err(&interleave(vec![
                pass(),
                chain(vec![chain(vec![label("a"), pass()]), label("b")]),
            ])),
            FilterError::MultipleLabelsInChain { .. }
        ));
        // Allowed: one labelled sub-filter per chain; labels side by side in an interleave;
        // a label in a condition predicate (its output never reaches the client).
        compile(&chain(vec![label("a"), pass()]));
        compile(&chain(vec![
            interleave(vec![label("a"), label("b")]),
            row_limit(1),
        ]));
        compile(&chain(vec![
            condition(Some(label("p")), Some(pass()), None),
            label("b"),
        ]));
        let f = chain(vec![
            condition(Some(label("p")), Some(pass()), None),
            label("b"),
        ]);
        assert!(
            compile(&f)
                .apply(&sample_row())
                .iter()
                .all(|c| c.labels == ["b"])
        );
    }

    // ---------------------------------------------------------------- structural validation

    #[test]
    fn chain_and_interleave_need_two_sub_filters() {
        for n in 0..2 {
            let subs = vec![pass(); n];
            assert_eq!(
                err(&chain(subs.clone())),
                FilterError::TooFewSubFilters {
                    kind: "chain",
                    count: n
                }
            );
            assert_eq!(
                err(&interleave(subs)),
                FilterError::TooFewSubFilters {
                    kind: "interleave",
                    count: n
                }
            );
        }
        // Also when nested.
        assert!(matches!(
            err(&condition(Some(pass()), Some(chain(vec![pass()])), None)),
            FilterError::TooFewSubFilters { .. }
        ));
    }

    #[test]
    fn boolean_filters_must_be_true() {
        for (f, field) in [
            (rf(F::PassAllFilter(false)), "pass_all_filter"),
            (rf(F::BlockAllFilter(false)), "block_all_filter"),
            (rf(F::Sink(false)), "sink"),
            (
                rf(F::StripValueTransformer(false)),
                "strip_value_transformer",
            ),
        ] {
            assert_eq!(err(&f), FilterError::FlagFalse { field });
            assert_eq!(
                err(&chain(vec![pass(), f.clone()])),
                FilterError::FlagFalse { field }
            );
        }
    }

    /// `levels` composites nested in one another around a pass_all.
    fn nested(levels: usize, wrap: fn(pb::RowFilter) -> pb::RowFilter) -> pb::RowFilter {
        (0..levels).fold(pass(), |f, _| wrap(f))
    }

    #[test]
    fn nesting_deeper_than_20_is_rejected() {
        let wraps: [fn(pb::RowFilter) -> pb::RowFilter; 3] = [
            |f| chain(vec![f, pass()]),
            |f| interleave(vec![block(), f]),
            |f| condition(Some(pass()), Some(f), None),
        ];
        for wrap in wraps {
            let ok = nested(MAX_FILTER_DEPTH, wrap);
            assert_eq!(run(&ok, &sample_row()), all_of(&sample_row()));
            assert_eq!(
                err(&nested(MAX_FILTER_DEPTH + 1, wrap)),
                FilterError::TooDeep {
                    max: MAX_FILTER_DEPTH
                }
            );
        }
        // Very deep filters are rejected without exhausting the stack.
        let deep = nested(5000, |f| chain(vec![f, pass()]));
        assert!(matches!(err(&deep), FilterError::TooDeep { .. }));
        // Predicates count as nesting as well.
        let in_predicate =
            (0..=MAX_FILTER_DEPTH).fold(pass(), |f, _| condition(Some(f), Some(pass()), None));
        assert!(matches!(err(&in_predicate), FilterError::TooDeep { .. }));
    }

    #[test]
    fn filters_larger_than_20480_bytes_are_rejected() {
        // A value regex field costs 1 byte of tag plus its length varint (3 bytes here).
        let fits = value(&vec![b'a'; MAX_FILTER_SIZE_BYTES - 4]);
        assert_eq!(prost::Message::encoded_len(&fits), MAX_FILTER_SIZE_BYTES);
        compile(&fits);
        let too_big = value(&vec![b'a'; MAX_FILTER_SIZE_BYTES - 3]);
        assert_eq!(
            err(&too_big),
            FilterError::TooLarge {
                size: MAX_FILTER_SIZE_BYTES + 1,
                max: MAX_FILTER_SIZE_BYTES
            }
        );
        let many = chain(vec![family("cf1"); 3000]);
        assert!(matches!(err(&many), FilterError::TooLarge { .. }));
    }

    #[test]
    fn errors_name_the_problem() {
        let msg = err(&chain(vec![pass()])).to_string();
        assert!(msg.contains("chain") && msg.contains("two"), "{msg}");
        let msg = err(&value(b"(")).to_string();
        assert!(msg.contains("value_regex_filter"), "{msg}");
        let msg = err(&label("BAD")).to_string();
        assert!(msg.contains("[a-z0-9\\-]+") && msg.contains("BAD"), "{msg}");
    }

    // ---------------------------------------------------------------- regex dialect

    fn matches(re: &[u8], input: &[u8]) -> bool {
        compile_regex("value_regex_filter", re)
            .unwrap_or_else(|e| panic!("{}: {e}", re.escape_ascii()))
            .is_match(input)
    }

    fn rejects(re: &[u8]) -> bool {
        compile_regex("value_regex_filter", re).is_err()
    }

    #[test]
    fn re2_literal_escapes() {
        assert!(matches(b"\\Q.*+?\\E", b".*+?"));
        assert!(!matches(b"\\Q.*\\E", b"ab"));
        assert!(
            matches(b"\\Qa.b", b"a.b"),
            "\\Q runs to the end without \\E"
        );
        assert!(matches(b"\\101\\0\\12", b"A\x00\n"), "octal escapes");
        assert!(rejects(b"\\1"), "backreferences are not supported");
        assert!(rejects(b"(a)\\1"));
        assert!(matches(b"\\x41\\x{42}\\x{0043}", b"ABC"));
        assert!(matches(b"\\x{ff}\\377", b"\xff\xff"));
        assert!(
            rejects(b"\\x{100}"),
            "Latin-1 mode rejects code points above 0xFF"
        );
        assert!(rejects(b"\\400"));
        assert!(rejects(b"[a-\\x{100}]"));
        assert!(matches(b"\\a\\f\\t\\n\\r\\v", b"\x07\x0c\t\n\r\x0b"));
        assert!(
            matches(b"\\.\\*\\<\\>\\-\\ ", b".*<>- "),
            "escaped punctuation"
        );
        assert!(matches(b"\\\\", b"\\"));
        for bad in [
            &b"\\"[..],
            b"\\q",
            b"\\E",
            b"\\8",
            b"\\x4",
            b"\\x{}",
            b"\\x{110000}",
            b"\\\xe9",
        ] {
            assert!(rejects(bad), "{}", bad.escape_ascii());
        }
    }

    #[test]
    fn re2_perl_and_posix_classes() {
        assert!(matches(b"\\d+", b"0189"));
        assert!(!matches(b"\\d", b"a"));
        assert!(matches(b"\\w+", b"az_AZ09"));
        assert!(matches(b"\\s+", b" \t\n\r\x0c"));
        assert!(!matches(b"\\s", b"\x0b"), "RE2's \\s has no \\v");
        assert!(matches(b"\\S", b"\x0b"));
        assert!(matches(b"[[:space:]]", b"\x0b"), "[[:space:]] has \\v");
        assert!(matches(b"[[:alpha:][:digit:]]+", b"aZ9"));
        assert!(matches(b"[[:^alpha:]]", b"1"));
        assert!(!matches(b"[[:^alpha:]]", b"a"));
        assert!(matches(b"[[:word:]]+", b"a_1"));
        assert!(rejects(b"[[:nope:]]"));
        assert!(matches(b"[\\d-z]+", b"1-z"), "- after a class is a literal");
        assert!(
            matches(b"\\pL\\p{Greek}?", b"\xe9"),
            "Latin-1 letter via \\pL"
        );
        assert!(!matches(b"\\pL", b"1"));
        assert!(matches(b"\\PL", b"1"));
        assert!(matches(b"\\p{^L}", b"1"));
        assert!(matches(b"[\\pN]", b"5"));
        assert!(rejects(b"\\p{NoSuchClass}"));
        assert!(rejects(b"\\pm"), "RE2 class names are case-sensitive");
        assert!(rejects(b"\\p{greek}"));
        assert!(rejects(b"\\p{Letter}"), "long category names are not RE2");
        assert!(matches(b"\\p{Latin}+", b"a\xe9"));
        assert!(matches(b"\\p{Any}", b"\n"));
        assert!(!matches(b"\\d", b"\xb2"), "\\d is ASCII only");
    }

    #[test]
    fn re2_bracket_classes() {
        assert!(matches(b"[]a]+", b"]a]"), "leading ] is a literal");
        assert!(matches(b"[^]a]", b"b"));
        assert!(matches(b"[a-]+", b"a-"));
        assert!(matches(b"[-a]+", b"-a"));
        assert!(matches(b"[[]", b"["), "[ inside a class is a literal");
        assert!(matches(b"[a&&b]+", b"a&b"), "&& is not an operator in RE2");
        assert!(matches(b"[a~~b]+", b"~"));
        assert!(matches(b"[^a]", b"\n"), "negated classes match \\n");
        assert!(matches(b"[\\x00-\\xff]", b"\xff"));
        assert!(
            matches(b"[\x80-\xff]", b"\xe9"),
            "raw Latin-1 bytes in a class"
        );
        assert!(matches(b"[(){}|*+?.$^]+", b"(){}|*+?.$^"));
        assert!(matches(b"[\\]\\\\]+", b"]\\"));
        assert!(rejects(b"[z-a]"));
        assert!(rejects(b"[a-\\d]"));
        assert!(rejects(b"[abc"));
        assert!(rejects(b"[]"));
        assert!(rejects(b"[\\C]"), "\\C is not allowed in a class");
        assert!(rejects(b"[\\b]"));
    }

    #[test]
    fn re2_repetitions_and_braces() {
        assert!(matches(b"a{2}", b"aa"));
        assert!(matches(b"a{2,}", b"aaaa"));
        assert!(matches(b"a{2,3}?", b"aaa"));
        assert!(!matches(b"a{2,3}", b"a"));
        assert!(matches(b"a{1000}", &[b'a'; 1000]));
        assert!(rejects(b"a{1001}"));
        assert!(rejects(b"a{3,2}"));
        assert!(matches(b"((a{10}){10}){10}", &[b'a'; 1000]));
        assert!(
            rejects(b"((a{10}){10}){11}"),
            "nested counts multiply past 1000"
        );
        assert!(rejects(b"(a{2}){501}"));
        assert!(rejects(b"(a{2,}){501,}"));
        assert!(
            matches(b"(a*){1000}", b"aa"),
            "only counted repetitions count"
        );
        assert!(matches(b"a{", b"a{"), "an unfinished brace is a literal");
        assert!(matches(b"a{,2}", b"a{,2}"), "{{,n}} is a literal in RE2");
        assert!(matches(b"a{x}", b"a{x}"));
        assert!(matches(b"}", b"}"));
        assert!(matches(b"a*?b+?c??", b"aabbc"));
        for bad in [
            &b"a**"[..],
            b"a*+",
            b"a+*",
            b"a{2}{3}",
            b"a{2}*",
            b"a??*",
            b"*a",
            b"a|*",
        ] {
            assert!(rejects(bad), "{}", bad.escape_ascii());
        }
    }

    #[test]
    fn re2_groups_and_flags() {
        assert!(matches(b"(?i)abc", b"AbC"));
        assert!(matches(b"(?i:a)b", b"Ab"));
        assert!(!matches(b"(?i:a)b", b"AB"));
        assert!(matches(b"(?s:.)", b"\n"));
        assert!(
            matches(b"(?U)a+", b"aaa"),
            "full match regardless of greediness"
        );
        assert!(matches(b"(?i-s:a.)", b"Ab"));
        assert!(matches(b"(?P<n>a)(?<m>b)", b"ab"));
        assert!(matches(b"(a|b)*", b"abba"));
        assert!(matches(b"(?:)", b""));
        assert!(
            matches(b"(?P<n>a)|(?P<n>b)", b"b"),
            "RE2 accepts duplicate names"
        );
        for bad in [
            &b"(a"[..],
            b"a)",
            b")(",
            b"a)|(b",
            b"(?x)a",
            b"(?u)a",
            b"(?=a)",
            b"(?!a)",
            b"(?<=a)",
            b"(?<!a)",
            b"(?-)a",
            b"(?i-)a",
            b"(?P=n)",
            b"(?P<>a)",
            b"(?P<a-b>a)",
            b"(?#comment)",
        ] {
            assert!(rejects(bad), "{}", bad.escape_ascii());
        }
    }

    #[test]
    fn re2_case_folding() {
        assert!(
            matches(b"(?i)\xe9", b"\xc9"),
            "Latin-1 letters fold under (?i)"
        );
        assert!(matches(b"(?i)[\xe0-\xe9]", b"\xc9"));
        assert!(
            !matches(b"(?i)\xd7", b"\xf7"),
            "0xD7 and 0xF7 are not letters"
        );
        assert!(!matches(b"\xe9", b"\xc9"));
        assert!(!matches(b"(?i)[^a]", b"A"), "fold first, then negate");
        assert!(!matches(b"(?i)[^\xe9]", b"\xc9"));
        assert!(
            matches(b"(?i)\\p{Lu}", b"\xff"),
            "0xFF folds to U+0178, an Lu"
        );
        assert!(
            !matches(b"(?i)\\P{Lu}", b"\xb5"),
            "0xB5 folds to U+039C, an Lu"
        );
        assert!(matches(b"(?i:a)(?-i:b)", b"Ab"));
        assert!(!matches(b"(?i:a)(?-i:b)", b"AB"));
        assert!(matches(b"((?i)a)b", b"Ab"), "flags end with their group");
        assert!(!matches(b"((?i)a)b", b"AB"));
    }

    #[test]
    fn re2_repetition_after_flags_applies_to_previous_atom() {
        assert!(matches(b"a(?i)*", b""), "a(?i)* is a*");
        assert!(matches(b"a(?i)*", b"aaa"));
        assert!(
            matches(b"b{2}(?i)?", b""),
            "b{{2}}(?i)? is (b{{2}})?, not a lazy b{{2}}"
        );
        assert!(matches(b"b{2}(?i)?", b"bb"));
        assert!(
            matches(b"a*(?i)+", b"aa"),
            "a stacked repetition is allowed after flags"
        );
        assert!(matches(b"a{2}(?s){3}", &[b'a'; 6]));
        assert!(
            matches(b"a\\Q\\E*", b"aaa"),
            "an empty quote is transparent"
        );
        assert!(rejects(b"(?i)*"), "missing argument");
        assert!(rejects(b"a|(?i)*"));
    }

    #[test]
    fn re2_anchors_and_boundaries() {
        assert!(matches(b"^abc$", b"abc"));
        assert!(matches(b"\\Aabc\\z", b"abc"));
        assert!(matches(b"a\\b b", b"a b"));
        assert!(!matches(b"a\\bb", b"ab"));
        assert!(matches(b"a\\Bb", b"ab"));
        assert!(matches(b"(?m)a$\\n^b", b"a\nb"));
        assert!(
            !matches(b"a|b", b"ab"),
            "alternation is inside the full-match anchors"
        );
        assert!(rejects(b"\\Z"));
    }

    #[test]
    fn invalid_regexes_are_rejected_for_every_regex_field() {
        for (f, field) in [
            (key_regex(b"("), "row_key_regex_filter"),
            (family("["), "family_name_regex_filter"),
            (qualifier(b"a**"), "column_qualifier_regex_filter"),
            (value(b"\\"), "value_regex_filter"),
        ] {
            assert!(
                matches!(err(&f), FilterError::InvalidRegex { field: got, .. } if got == field),
                "{field}"
            );
        }
    }

    // ---------------------------------------------------------------- misc

    #[test]
    fn unsorted_input_is_sorted_first() {
        let mut r = sample_row();
        r.cells.reverse();
        let out = compile(&column_limit(1)).apply(&r);
        assert_eq!(show(&out)[0], "cf1:a@3000=a3[]");
        assert!(out.is_sorted_by(|a, b| cell_order(a, b) != Ordering::Greater));
    }

    #[test]
    fn row_filter_is_send_sync_clone() {
        fn check<T: Send + Sync + Clone + std::fmt::Debug>() {}
        check::<RowFilter>();
    }

    #[test]
    fn default_sampler_is_uniform_in_unit_interval() {
        let draws: Vec<f64> = (0..10_000).map(|_| default_sample()).collect();
        assert!(draws.iter().all(|d| (0.0..1.0).contains(d)));
        let mean = draws.iter().sum::<f64>() / draws.len() as f64;
        assert!((0.45..0.55).contains(&mean), "mean {mean}");
    }

    // ---------------------------------------------------------------- property tests

    /// The subset of the filter language the reference evaluator covers.
    #[derive(Debug, Clone)]
    enum Ref {
        Pass,
        Block,
        Chain(Vec<Ref>),
        Interleave(Vec<Ref>),
        RowLimit(i32),
        RowOffset(i32),
        ColumnLimit(i32),
        Family(&'static str),
        ColumnRange {
            family: &'static str,
            start: Option<(Vec<u8>, bool)>,
            end: Option<(Vec<u8>, bool)>,
        },
        Timestamps(i64, i64),
        ValueRange {
            start: Option<(Vec<u8>, bool)>,
            end: Option<(Vec<u8>, bool)>,
        },
        Strip,
        Label(&'static str),
    }

    impl Ref {
        fn to_pb(&self) -> pb::RowFilter {
            use pb::column_range::{EndQualifier as CE, StartQualifier as CS};
            use pb::value_range::{EndValue as VE, StartValue as VS};
            match self {
                Ref::Pass => pass(),
                Ref::Block => block(),
                Ref::Chain(fs) => chain(fs.iter().map(Ref::to_pb).collect()),
                Ref::Interleave(fs) => interleave(fs.iter().map(Ref::to_pb).collect()),
                Ref::RowLimit(n) => row_limit(*n),
                Ref::RowOffset(n) => row_offset(*n),
                Ref::ColumnLimit(n) => column_limit(*n),
                Ref::Family(f) => family(f),
                Ref::ColumnRange { family, start, end } => column_range(
                    family,
                    start.as_ref().map(|(q, closed)| {
                        if *closed {
                            CS::StartQualifierClosed(b(q))
                        } else {
                            CS::StartQualifierOpen(b(q))
                        }
                    }),
                    end.as_ref().map(|(q, closed)| {
                        if *closed {
                            CE::EndQualifierClosed(b(q))
                        } else {
                            CE::EndQualifierOpen(b(q))
                        }
                    }),
                ),
                Ref::Timestamps(s, e) => ts_range(*s, *e),
                Ref::ValueRange { start, end } => value_range(
                    start.as_ref().map(|(v, closed)| {
                        if *closed {
                            VS::StartValueClosed(b(v))
                        } else {
                            VS::StartValueOpen(b(v))
                        }
                    }),
                    end.as_ref().map(|(v, closed)| {
                        if *closed {
                            VE::EndValueClosed(b(v))
                        } else {
                            VE::EndValueOpen(b(v))
                        }
                    }),
                ),
                Ref::Strip => strip(),
                Ref::Label(l) => label(l),
            }
        }

        fn has_label(&self) -> bool {
            match self {
                Ref::Label(_) => true,
                Ref::Chain(fs) | Ref::Interleave(fs) => fs.iter().any(Ref::has_label),
                _ => false,
            }
        }

        /// The one rule of the subset the generator does not avoid by construction.
        fn valid(&self) -> bool {
            match self {
                Ref::Chain(fs) => {
                    fs.iter().filter(|f| f.has_label()).count() <= 1 && fs.iter().all(Ref::valid)
                }
                Ref::Interleave(fs) => fs.iter().all(Ref::valid),
                _ => true,
            }
        }

        /// Straight from the proto's definitions, on a sorted list of cells.
        fn eval(&self, cells: Vec<Cell>) -> Vec<Cell> {
            let in_range =
                |v: &[u8], start: &Option<(Vec<u8>, bool)>, end: &Option<(Vec<u8>, bool)>| {
                    let lower_ok = match start {
                        None => true,
                        Some((s, true)) => v >= &s[..],
                        Some((s, false)) => v > &s[..],
                    };
                    let upper_ok = match end {
                        None => true,
                        Some((e, false)) if e.is_empty() => true, // open "" is infinity
                        Some((e, true)) => v <= &e[..],
                        Some((e, false)) => v < &e[..],
                    };
                    lower_ok && upper_ok
                };
            match self {
                Ref::Pass => cells,
                Ref::Block => vec![],
                Ref::Chain(fs) => fs.iter().fold(cells, |acc, f| f.eval(acc)),
                Ref::Interleave(fs) => {
                    let mut out: Vec<Cell> =
                        fs.iter().flat_map(|f| f.eval(cells.clone())).collect();
                    out.sort_by_key(|c| {
                        (
                            c.family.clone(),
                            c.qualifier.to_vec(),
                            std::cmp::Reverse(c.timestamp_micros),
                        )
                    });
                    out
                }
                Ref::RowLimit(n) => cells.into_iter().take(*n as usize).collect(),
                Ref::RowOffset(n) => cells.into_iter().skip(*n as usize).collect(),
                Ref::ColumnLimit(n) => {
                    let mut seen = std::collections::HashMap::<(String, Vec<u8>), i32>::new();
                    cells
                        .into_iter()
                        .filter(|c| {
                            let k = seen
                                .entry((c.family.clone(), c.qualifier.to_vec()))
                                .or_default();
                            *k += 1;
                            *k <= *n
                        })
                        .collect()
                }
                Ref::Family(f) => cells.into_iter().filter(|c| c.family == *f).collect(),
                Ref::ColumnRange { family, start, end } => cells
                    .into_iter()
                    .filter(|c| c.family == *family && in_range(&c.qualifier, start, end))
                    .collect(),
                Ref::Timestamps(s, e) => cells
                    .into_iter()
                    .filter(|c| c.timestamp_micros >= *s && (*e == 0 || c.timestamp_micros < *e))
                    .collect(),
                Ref::ValueRange { start, end } => cells
                    .into_iter()
                    .filter(|c| in_range(&c.value, start, end))
                    .collect(),
                Ref::Strip => cells
                    .into_iter()
                    .map(|c| Cell {
                        value: Bytes::new(),
                        ..c
                    })
                    .collect(),
                Ref::Label(l) => cells
                    .into_iter()
                    .map(|mut c| {
                        c.labels.push(l.to_string());
                        c
                    })
                    .collect(),
            }
        }
    }

    const FAMILIES: [&str; 3] = ["a", "b", "c"];
    const QUALIFIERS: [&[u8]; 5] = [b"", b"q", b"q\n", b"r", b"\xffz"];
    const VALUES: [&[u8]; 5] = [b"", b"v", b"v\n", b"w", b"\x00\xff"];

    fn arb_row() -> impl Strategy<Value = Row> {
        let cell = (
            0..FAMILIES.len(),
            0..QUALIFIERS.len(),
            0i64..5,
            0..VALUES.len(),
        )
            .prop_map(|(f, q, t, v)| cell(FAMILIES[f], QUALIFIERS[q], t * 1000, VALUES[v]));
        (
            prop::collection::vec(cell, 0..14),
            prop::collection::vec(any::<u8>(), 1..4),
        )
            .prop_map(|(mut cells, key)| {
                cells.sort_by(cell_order);
                cells.dedup_by(|a, b| a.order_key() == b.order_key());
                Row {
                    key: Bytes::from(key),
                    cells,
                }
            })
    }

    fn arb_bound(
        values: &'static [&'static [u8]],
    ) -> impl Strategy<Value = Option<(Vec<u8>, bool)>> {
        prop::option::of(
            (0..values.len(), any::<bool>()).prop_map(move |(i, c)| (values[i].to_vec(), c)),
        )
    }

    fn arb_ref() -> impl Strategy<Value = Ref> {
        let leaf = prop_oneof![
            Just(Ref::Pass),
            Just(Ref::Block),
            (0i32..5).prop_map(Ref::RowLimit),
            (0i32..5).prop_map(Ref::RowOffset),
            (0i32..4).prop_map(Ref::ColumnLimit),
            (0..FAMILIES.len()).prop_map(|i| Ref::Family(FAMILIES[i])),
            (
                0..FAMILIES.len(),
                arb_bound(&QUALIFIERS),
                arb_bound(&QUALIFIERS)
            )
                .prop_map(|(f, start, end)| Ref::ColumnRange {
                    family: FAMILIES[f],
                    start,
                    end
                }),
            (0i64..6, 0i64..6).prop_map(|(s, e)| Ref::Timestamps(s * 1000, e * 1000)),
            (arb_bound(&VALUES), arb_bound(&VALUES))
                .prop_map(|(start, end)| Ref::ValueRange { start, end }),
            Just(Ref::Strip),
            prop_oneof![Just("x"), Just("y")].prop_map(Ref::Label),
        ];
        leaf.prop_recursive(4, 32, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 2..4).prop_map(Ref::Chain),
                prop::collection::vec(inner, 2..4).prop_map(Ref::Interleave),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 512,
            // Never write regression files next to the sources.
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        #[test]
        fn apply_matches_reference_evaluator(r in arb_ref(), row in arb_row()) {
            let wire = r.to_pb();
            match RowFilter::compile(&wire) {
                Ok(f) => {
                    prop_assert!(r.valid(), "compiled an invalid filter: {:?}", r);
                    let got = f.apply_with_sampler(&row, &mut || 0.5);
                    let want = r.eval(row.cells.clone());
                    prop_assert_eq!(show(&got), show(&want));
                    if f.is_block_all() {
                        prop_assert!(got.is_empty());
                    }
                }
                Err(e) => {
                    prop_assert!(!r.valid(), "rejected a valid filter {:?}: {}", r, e);
                    let is_label_error = matches!(e, FilterError::MultipleLabelsInChain { .. });
                    prop_assert!(is_label_error, "{}", e);
                }
            }
        }
    }

    /// Any wire filter, including invalid ones.
    fn arb_wire_filter() -> impl Strategy<Value = pb::RowFilter> {
        // Mostly plausible regexes, sometimes arbitrary metacharacter soup.
        let regex_bytes = prop_oneof![
            3 => prop::sample::select(vec![
                &b".*"[..], b"a.*", b"\\C*", b"[ab]+", b"(a|b)*", b"q", b"", b"v\\C*", b"[^a]*",
            ])
            .prop_map(Bytes::from_static),
            2 => prop::collection::vec(
                prop::sample::select(b"ab.*+?()[]{}|^$\\:-,0123CQExdswpPbz\n\xff".to_vec()),
                0..12,
            )
            .prop_map(Bytes::from),
        ];
        let text = prop_oneof![
            3 => prop::sample::select(vec!["a", "b", "c", "x", "lbl-1", ".*", "[ab]"])
                .prop_map(String::from),
            2 => prop::collection::vec(prop::sample::select(b"abz09-_:.*[]()\\A".to_vec()), 0..18)
                .prop_map(|v| String::from_utf8(v).unwrap_or_default()),
        ];
        let flag = prop_oneof![9 => Just(true), 1 => Just(false)];
        let small_bytes = prop::collection::vec(any::<u8>(), 0..3).prop_map(Bytes::from);
        let column_range = (
            text.clone(),
            prop::option::of(prop_oneof![
                small_bytes
                    .clone()
                    .prop_map(pb::column_range::StartQualifier::StartQualifierClosed),
                small_bytes
                    .clone()
                    .prop_map(pb::column_range::StartQualifier::StartQualifierOpen),
            ]),
            prop::option::of(prop_oneof![
                small_bytes
                    .clone()
                    .prop_map(pb::column_range::EndQualifier::EndQualifierClosed),
                small_bytes
                    .clone()
                    .prop_map(pb::column_range::EndQualifier::EndQualifierOpen),
            ]),
        )
            .prop_map(
                |(family_name, start_qualifier, end_qualifier)| pb::ColumnRange {
                    family_name,
                    start_qualifier,
                    end_qualifier,
                },
            );
        let value_range = (
            prop::option::of(prop_oneof![
                small_bytes
                    .clone()
                    .prop_map(pb::value_range::StartValue::StartValueClosed),
                small_bytes
                    .clone()
                    .prop_map(pb::value_range::StartValue::StartValueOpen),
            ]),
            prop::option::of(prop_oneof![
                small_bytes
                    .clone()
                    .prop_map(pb::value_range::EndValue::EndValueClosed),
                small_bytes.prop_map(pb::value_range::EndValue::EndValueOpen),
            ]),
        )
            .prop_map(|(start_value, end_value)| pb::ValueRange {
                start_value,
                end_value,
            });
        let count = prop_oneof![-2i32..6, any::<i32>()];
        let leaf = prop_oneof![
            Just(unset()),
            flag.clone().prop_map(|v| rf(F::Sink(v))),
            flag.clone().prop_map(|v| rf(F::PassAllFilter(v))),
            flag.clone().prop_map(|v| rf(F::BlockAllFilter(v))),
            regex_bytes
                .clone()
                .prop_map(|v| rf(F::RowKeyRegexFilter(v))),
            prop_oneof![any::<f64>(), 0.0f64..1.0].prop_map(|v| rf(F::RowSampleFilter(v))),
            text.clone().prop_map(|v| rf(F::FamilyNameRegexFilter(v))),
            regex_bytes
                .clone()
                .prop_map(|v| rf(F::ColumnQualifierRegexFilter(v))),
            column_range.prop_map(|v| rf(F::ColumnRangeFilter(v))),
            (
                prop_oneof![any::<i64>(), (-3i64..6).prop_map(|t| t * 1000)],
                prop_oneof![any::<i64>(), (-3i64..6).prop_map(|t| t * 1000)]
            )
                .prop_map(|(s, e)| ts_range(s, e)),
            regex_bytes.prop_map(|v| rf(F::ValueRegexFilter(v))),
            value_range.prop_map(|v| rf(F::ValueRangeFilter(v))),
            count
                .clone()
                .prop_map(|v| rf(F::CellsPerRowOffsetFilter(v))),
            count.clone().prop_map(|v| rf(F::CellsPerRowLimitFilter(v))),
            count.prop_map(|v| rf(F::CellsPerColumnLimitFilter(v))),
            flag.clone().prop_map(|v| rf(F::StripValueTransformer(v))),
            text.prop_map(|v| rf(F::ApplyLabelTransformer(v))),
        ];
        leaf.prop_recursive(24, 96, 4, |inner| {
            prop_oneof![
                prop_oneof![
                    9 => prop::collection::vec(inner.clone(), 2..4),
                    1 => prop::collection::vec(inner.clone(), 0..2),
                ]
                .prop_map(chain),
                prop_oneof![
                    9 => prop::collection::vec(inner.clone(), 2..4),
                    1 => prop::collection::vec(inner.clone(), 0..2),
                ]
                .prop_map(interleave),
                (
                    prop::option::of(inner.clone()),
                    prop::option::of(inner.clone()),
                    prop::option::of(inner),
                )
                    .prop_map(|(p, t, f)| condition(p, t, f)),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 1024,
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        #[test]
        fn compile_and_apply_never_panic(wire in arb_wire_filter(), row in arb_row(), draw in 0.0f64..1.0) {
            if let Ok(f) = RowFilter::compile(&wire) {
                let out = f.apply_with_sampler(&row, &mut || draw);
                prop_assert!(out.is_sorted_by(|a, b| cell_order(a, b) != Ordering::Greater));
                if f.is_block_all() {
                    prop_assert!(out.is_empty());
                }
                // Without sinks or interleaves output cells come from the input.
                let _ = f.apply(&row);
            }
        }

        #[test]
        fn arbitrary_regex_bytes_never_panic(pattern in prop::collection::vec(any::<u8>(), 0..24), input in prop::collection::vec(any::<u8>(), 0..8)) {
            if let Ok(re) = compile_regex("value_regex_filter", &pattern) {
                let _ = re.is_match(&input);
            }
        }

        #[test]
        fn literal_patterns_match_only_themselves(lit in prop::collection::vec(any::<u8>(), 0..12), other in prop::collection::vec(any::<u8>(), 0..12)) {
            // \Q...\E quotes anything (as long as it holds no "\E").
            prop_assume!(!lit.windows(2).any(|w| w == b"\\E"));
            let mut pattern = b"\\Q".to_vec();
            pattern.extend_from_slice(&lit);
            pattern.extend_from_slice(b"\\E");
            let re = compile_regex("value_regex_filter", &pattern).unwrap();
            prop_assert!(re.is_match(&lit));
            prop_assert_eq!(re.is_match(&other), other == lit);
        }
    }
}
