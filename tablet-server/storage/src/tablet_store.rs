//! [`TabletStore`]: what the layers above need from the storage of tablets, in the model's
//! types. The server's implementation is [`Store`] on RocksDB; the API layer is written
//! against the trait, so a frontend can put another owner's tablets behind it.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use basalt_model::{
    CellFilter, Mutation, Row, RowMutation, RowRange, RowSet, ScannedRow, TableSchema,
};
use bytes::Bytes;

use crate::error::Result;
use crate::ranges::SstFile;
use crate::read::{RowStream, Scan};
use crate::store::Store;

pub trait TabletStore: Send + Sync + 'static {
    /// The rows of a read, in scan order (see [`TabletStore::rows`]).
    type Rows<'a>: Iterator<Item = Result<Row>> + 'a
    where
        Self: 'a;
    /// The rows of a filtered scan (see [`TabletStore::scan`]).
    type Scan<'a>: Iterator<Item = Result<ScannedRow>> + 'a
    where
        Self: 'a;

    /// The schema of a table, or NOT_FOUND.
    fn table(&self, name: &str) -> Result<Arc<TableSchema>>;

    /// Applies the mutations of every row, each row atomically, and returns once they are
    /// durable. The caller has validated them against `table`'s schema.
    fn mutate(
        self: &Arc<Self>,
        table: Arc<TableSchema>,
        rows: Vec<RowMutation>,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Reads `row` and applies the mutations `decide` returns for it under the row's lock
    /// (CheckAndMutateRow, ReadModifyWriteRow); durable on return. Blocking.
    fn read_modify_write<T>(
        &self,
        table: &TableSchema,
        row: &Bytes,
        decide: impl FnOnce(Row) -> basalt_model::Result<(Vec<Mutation>, T)>,
    ) -> Result<T>;

    /// The rows of `rows` with live cells, in key order or reverse key order, as a stream the
    /// caller pulls from. Rows are consistent: never seen half-mutated.
    fn rows<'a>(&'a self, table: &'a TableSchema, rows: &RowSet, reversed: bool) -> Self::Rows<'a>;

    /// [`TabletStore::rows`] with the read's filter applied where the rows are stored.
    fn scan<'a>(
        &'a self,
        table: &'a TableSchema,
        rows: &RowSet,
        reversed: bool,
        filter: &'a dyn CellFilter,
    ) -> Self::Scan<'a>;

    /// Row keys that split the table into parts of similar size, with the bytes before each;
    /// the last sample is the empty key with the table's size.
    fn sample_row_keys(&self, table: &TableSchema) -> Result<Vec<(Bytes, u64)>>;

    /// Every write with a version at or below this clock value is durable.
    fn durable_through(&self) -> u64;

    /// Approximate bytes of `range` of `table` on disk.
    fn approximate_size(&self, table: &TableSchema, range: &RowRange) -> u64;

    /// A consistent copy of `range` of `table` as SST files in `dir`.
    fn export_range(
        &self,
        table: &TableSchema,
        range: &RowRange,
        dir: &Path,
    ) -> Result<Vec<SstFile>>;

    /// Ingests files of [`TabletStore::export_range`], all or none.
    fn ingest(&self, files: &[SstFile]) -> Result<()>;

    /// Deletes every entry of `range` of `table`.
    fn delete_range(&self, table: &TableSchema, range: &RowRange) -> Result<()>;
}

impl TabletStore for Store {
    type Rows<'a> = RowStream<'a>;
    type Scan<'a> = Scan<'a>;

    fn table(&self, name: &str) -> Result<Arc<TableSchema>> {
        Store::table(self, name)
    }

    fn mutate(
        self: &Arc<Self>,
        table: Arc<TableSchema>,
        rows: Vec<RowMutation>,
    ) -> impl Future<Output = Result<()>> + Send {
        self.mutate_async(table, rows)
    }

    fn read_modify_write<T>(
        &self,
        table: &TableSchema,
        row: &Bytes,
        decide: impl FnOnce(Row) -> basalt_model::Result<(Vec<Mutation>, T)>,
    ) -> Result<T> {
        Store::read_modify_write(self, table, row, decide)
    }

    fn rows<'a>(&'a self, table: &'a TableSchema, rows: &RowSet, reversed: bool) -> RowStream<'a> {
        Store::rows(self, table, rows, reversed)
    }

    fn scan<'a>(
        &'a self,
        table: &'a TableSchema,
        rows: &RowSet,
        reversed: bool,
        filter: &'a dyn CellFilter,
    ) -> Scan<'a> {
        Store::scan(self, table, rows, reversed, filter)
    }

    fn sample_row_keys(&self, table: &TableSchema) -> Result<Vec<(Bytes, u64)>> {
        Store::sample_row_keys(self, table)
    }

    fn durable_through(&self) -> u64 {
        Store::durable_through(self)
    }

    fn approximate_size(&self, table: &TableSchema, range: &RowRange) -> u64 {
        Store::approximate_size(self, table, range)
    }

    fn export_range(
        &self,
        table: &TableSchema,
        range: &RowRange,
        dir: &Path,
    ) -> Result<Vec<SstFile>> {
        Store::export_range(self, table, range, dir)
    }

    fn ingest(&self, files: &[SstFile]) -> Result<()> {
        Store::ingest(self, files)
    }

    fn delete_range(&self, table: &TableSchema, range: &RowRange) -> Result<()> {
        Store::delete_range(self, table, range)
    }
}
