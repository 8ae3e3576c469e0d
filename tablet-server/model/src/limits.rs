//! Bigtable's limits on what a request may carry (see `docs/semantics.md` for the codes).

/// Longest row key: 4 KiB.
pub const MAX_ROW_KEY_BYTES: usize = 4 * 1024;
/// Longest column qualifier: 16 KiB.
pub const MAX_QUALIFIER_BYTES: usize = 16 * 1024;
/// Largest cell value: 100 MiB.
pub const MAX_VALUE_BYTES: usize = 100 * 1024 * 1024;
/// Most mutations in one request (MutateRow, CheckAndMutateRow, all entries of MutateRows).
pub const MAX_MUTATIONS: usize = 100_000;
/// Largest gRPC message accepted or sent: Bigtable's 256 MiB request limit (a 100 MiB value
/// plus its mutation fits comfortably).
pub const MAX_MESSAGE_BYTES: usize = 256 << 20;
/// Hard cap on column families per table (Bigtable recommends at most 100).
pub const MAX_FAMILIES_PER_TABLE: usize = 1000;
/// Timestamp granularity of MILLIS tables, the only one Bigtable offers.
pub const MILLIS: i64 = 1000;
