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

use googleapis_tonic_google_bigtable_v2::google::bigtable::v2 as pb;

use basalt_model::{Cell, Row};

mod compile;
mod evaluate;
mod re2;
#[cfg(test)]
mod tests;

use compile::{build, check_depth};
use evaluate::{Ctx, Node};

/// Largest serialized `RowFilter` Bigtable accepts.
pub const MAX_FILTER_SIZE_BYTES: usize = 20_480;
/// Deepest nesting of chains, interleaves and conditions Bigtable accepts.
pub const MAX_FILTER_DEPTH: usize = 20;
/// Longest label `apply_label_transformer` accepts.
pub const MAX_LABEL_LEN: usize = 15;

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
