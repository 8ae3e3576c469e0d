//! `google.bigtable.v2.Bigtable`: the data API.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use googleapis_tonic_google_bigtable_v2::google::bigtable::v2 as pb;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use basalt_model::schema::{parse_instance_name, parse_table_name};
use basalt_model::{
    Cell, CellFilter, Row, RowMutation, RowSet, ScannedRow, TableSchema, merge_rows,
};
use basalt_storage::TabletStore;

use crate::error::{Error, Result, code_of, status};
use crate::filter::RowFilter;
use crate::key_samples::{KeySampler, ReadCounter};
use crate::load::TabletLoads;
use crate::metrics::Metrics;
use crate::proto::bigtable_server::Bigtable;
use crate::translate;

/// Largest piece of a cell value sent in one CellChunk.
const CHUNK_VALUE_BYTES: usize = 1 << 20;
/// Cell copies a filter may make of one row (interleaves, sinks) beyond this many plus three
/// per cell of the row: bounds the memory a single filter can claim (RESOURCE_EXHAUSTED).
const FILTER_COPY_BUDGET: usize = 1_000_000;

/// A request's filter as storage runs it on each row (pushed down): within the copy budget.
impl CellFilter for RowFilter {
    fn apply(&self, row: &Row) -> Result<Vec<Cell>> {
        let budget = FILTER_COPY_BUDGET.saturating_add(row.cells.len().saturating_mul(3));
        Ok(self.apply_bounded(row, budget)?)
    }
}

/// After this many consecutive rows scanned without output, an empty response carrying
/// `last_scanned_row_key` tells the client how far the scan got (as Bigtable does): a sparse
/// filter over a big table keeps the stream alive, and a retry resumes after that key.
const HEARTBEAT_ROWS: u64 = 1000;

/// Whole rows are packed into one ReadRowsResponse while it stays within this many bytes; a
/// row larger than this travels alone.
const RESPONSE_TARGET_BYTES: usize = 1 << 20;

/// Packs rows into ReadRowsResponses. **Every response ends on a committed row**: a row,
/// however large, is never continued in the next response.
///
/// The v2 proto would allow a row to continue in the next message, but the official clients
/// do not accept it: Python's data client resets its row state per response ("row keys should
/// be strictly increasing"), Go's chunk reader (cbt) fails with "invalid state for end of
/// stream", and Cloud Bigtable itself never does it. A large value is still split over
/// several CellChunks (of [`CHUNK_VALUE_BYTES`]), all inside the row's one response.
///
/// Rows are added while the response stays within [`RESPONSE_TARGET_BYTES`]; the rows
/// gathered so far are sent before a row that would not fit, so a response is at most the
/// target or one row, whichever is larger. Streams of rows smaller than ~4 MiB thus stay
/// under gRPC's default 4 MiB receive limit (which the Python data client keeps when it
/// talks to an emulator host).
#[derive(Default)]
struct ResponsePacker {
    chunks: Vec<pb::read_rows_response::CellChunk>,
    bytes: usize,
}

impl ResponsePacker {
    /// Adds one row (with at least one cell), pushing every response it completes to `out`.
    /// Returns the row's value bytes.
    fn push_row(
        &mut self,
        key: &Bytes,
        cells: Vec<Cell>,
        out: &mut Vec<pb::ReadRowsResponse>,
    ) -> usize {
        use prost::Message;
        let mut row = Vec::new();
        let value_bytes = push_row_chunks(key, cells, &mut row);
        let size: usize = row.iter().map(|c| c.encoded_len() + 4).sum();
        if !self.chunks.is_empty() && self.bytes + size > RESPONSE_TARGET_BYTES {
            out.extend(self.flush());
        }
        self.chunks.append(&mut row);
        self.bytes += size;
        if self.bytes >= RESPONSE_TARGET_BYTES {
            out.extend(self.flush());
        }
        value_bytes
    }

    /// The response holding the rows added since the last one, if any.
    fn flush(&mut self) -> Option<pb::ReadRowsResponse> {
        if self.chunks.is_empty() {
            return None;
        }
        self.bytes = 0;
        Some(pb::ReadRowsResponse {
            chunks: std::mem::take(&mut self.chunks),
            ..Default::default()
        })
    }
}

/// What a read saw and returned, for `request_stats_view: REQUEST_STATS_FULL` (a cluster
/// frontend sums the per-tablet reads' stats into one with [`ReadStats::add`]).
#[derive(Default)]
pub(crate) struct ReadStats {
    rows_seen: i64,
    rows_returned: i64,
    cells_seen: i64,
    cells_returned: i64,
}

impl ReadStats {
    fn saw(&mut self, row: &ScannedRow) {
        self.rows_seen += 1;
        self.cells_seen += row.cells_seen as i64;
    }

    fn returned(&mut self, cells: usize) {
        self.rows_returned += 1;
        self.cells_returned += cells as i64;
    }

    /// Adds the stats another read reported.
    pub(crate) fn add(&mut self, stats: &pb::RequestStats) {
        if let Some(pb::request_stats::StatsView::FullReadStatsView(v)) = &stats.stats_view
            && let Some(i) = &v.read_iteration_stats
        {
            self.rows_seen += i.rows_seen_count;
            self.rows_returned += i.rows_returned_count;
            self.cells_seen += i.cells_seen_count;
            self.cells_returned += i.cells_returned_count;
        }
    }

    /// The stream's last message: the request stats (Bigtable sends them even when the read
    /// returned nothing).
    pub(crate) fn response(&self, started: Instant) -> pb::ReadRowsResponse {
        let latency = started.elapsed();
        pb::ReadRowsResponse {
            request_stats: Some(pb::RequestStats {
                stats_view: Some(pb::request_stats::StatsView::FullReadStatsView(
                    pb::FullReadStatsView {
                        read_iteration_stats: Some(pb::ReadIterationStats {
                            rows_seen_count: self.rows_seen,
                            rows_returned_count: self.rows_returned,
                            cells_seen_count: self.cells_seen,
                            cells_returned_count: self.cells_returned,
                        }),
                        request_latency_stats: Some(pb::RequestLatencyStats {
                            frontend_server_latency: Some(prost_types::Duration {
                                seconds: latency.as_secs() as i64,
                                nanos: latency.subsec_nanos() as i32,
                            }),
                        }),
                    },
                )),
            }),
            ..Default::default()
        }
    }
}

/// One ReadRows request, validated: what to read and how. Point reads and scans run the same
/// plan ([`ReadPlan::run`]); they differ only in where it runs and where responses go.
struct ReadPlan {
    table: Arc<TableSchema>,
    filter: RowFilter,
    rows: RowSet,
    reversed: bool,
    limit: u64,
    want_stats: bool,
    started: Instant,
}

/// How a read ended.
#[derive(Default)]
struct ReadOutcome {
    rows: u64,
    bytes: u64,
    /// The client went away (a send failed).
    disconnected: bool,
    error: Option<Error>,
}

impl ReadPlan {
    /// Runs the read: the rows of the table's sources, each filtered where it is stored
    /// (within the filter's copy budget), merged in key order (forward or reversed), counted
    /// against the limit, packed into responses of whole rows (with heartbeats through long runs of
    /// filtered-out rows, and the request stats last) handed to `send`, which returns false
    /// once the client is gone.
    fn run<S: TabletStore>(
        &self,
        store: &S,
        send: &mut dyn FnMut(pb::ReadRowsResponse) -> bool,
        returned: &ReadCounter,
    ) -> ReadOutcome {
        let mut out = ReadOutcome::default();
        let mut stats = ReadStats::default();
        let mut packer = ResponsePacker::default();
        let mut ready = Vec::new();
        let mut skipped = 0u64;
        // Today one source: this server's store holds every tablet of the table. With tablets
        // spread over servers, a frontend merges one stream per owner here.
        let sources = if self.filter.is_block_all() {
            vec![]
        } else {
            vec![store.scan(&self.table, &self.rows, self.reversed, &self.filter)]
        };
        let mut merged = merge_rows(sources, self.reversed);
        let result = loop {
            if out.rows >= self.limit {
                break Ok(());
            }
            let row = match merged.next() {
                None => break Ok(()),
                Some(Err(e)) => break Err(Error::from(e)),
                Some(Ok(row)) => row,
            };
            stats.saw(&row);
            let ScannedRow { key, cells, .. } = row;
            if cells.is_empty() {
                skipped += 1;
                if skipped >= HEARTBEAT_ROWS {
                    skipped = 0;
                    // Rows before the scanned key go first.
                    let heartbeat = pb::ReadRowsResponse {
                        last_scanned_row_key: key,
                        ..Default::default()
                    };
                    if !packer
                        .flush()
                        .into_iter()
                        .chain([heartbeat])
                        .all(&mut *send)
                    {
                        out.disconnected = true;
                        break Ok(());
                    }
                }
                continue;
            }
            skipped = 0;
            stats.returned(cells.len());
            let bytes = packer.push_row(&key, cells, &mut ready) as u64;
            returned.row(&key, bytes);
            out.bytes += bytes;
            out.rows += 1;
            if !ready.drain(..).all(&mut *send) {
                out.disconnected = true;
                break Ok(());
            }
        };
        match result {
            Ok(()) if !out.disconnected => {
                let tail = packer.flush().into_iter();
                let stats = self.want_stats.then(|| stats.response(self.started));
                out.disconnected = !tail.chain(stats).all(&mut *send);
            }
            Ok(()) => {}
            Err(e) => {
                // Complete rows go first; the client retries after the last one.
                if !out.disconnected {
                    let _ = packer.flush().into_iter().all(&mut *send);
                }
                out.error = Some(e);
            }
        }
        out
    }
}

impl ReadOutcome {
    /// Records the read in the metrics and hands an error to `fail` (as the stream's last
    /// message).
    fn finish(self, plan: &ReadPlan, metrics: &Metrics, fail: impl FnOnce(Status)) {
        let code = match self.error {
            Some(e) => {
                let code = code_of(&e);
                fail(status(e));
                code
            }
            None if self.disconnected => tonic::Code::Cancelled,
            None => tonic::Code::Ok,
        };
        metrics.read(&plan.table.name, self.rows, self.bytes);
        metrics.observe("ReadRows", code, plan.started);
    }
}

/// The data API over any [`TabletStore`] (the server's is RocksDB's `Store`).
pub struct DataService<S> {
    store: Arc<S>,
    metrics: Arc<Metrics>,
    loads: Arc<TabletLoads>,
    /// The Key Visualizer's samples: counted where the load is, once per request served here.
    key_samples: Arc<KeySampler>,
}

impl<S: TabletStore> DataService<S> {
    pub fn new(
        store: Arc<S>,
        metrics: Arc<Metrics>,
        loads: Arc<TabletLoads>,
        key_samples: Arc<KeySampler>,
    ) -> Self {
        Self {
            store,
            metrics,
            loads,
            key_samples,
        }
    }

    /// Resolves the table a data request names; UNAVAILABLE while a restore fills it (its
    /// data would be incomplete, and a write could be overwritten by the restore). Authorized
    /// and materialized views are not supported yet.
    fn table(&self, table_name: &str, view_name: &str) -> Result<Arc<TableSchema>> {
        if table_name.is_empty() {
            if !view_name.is_empty() {
                return Err(Error::Unimplemented(
                    "authorized and materialized views are not supported by Basalt yet".into(),
                ));
            }
            return Err(Error::InvalidArgument("table_name is required".into()));
        }
        parse_table_name(table_name)?;
        let table = self.store.table(table_name)?;
        table.check_serving()?;
        Ok(table)
    }

    fn finish<T>(&self, rpc: &str, started: Instant, r: Result<T>) -> Result<T, Status> {
        let code = match &r {
            Ok(_) => tonic::Code::Ok,
            Err(e) => code_of(e),
        };
        self.metrics.observe(rpc, code, started);
        r.map_err(status)
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Internal(format!("worker failed: {e}")))?
}

/// Appends the CellChunks of one row. Returns the number of value bytes.
fn push_row_chunks(
    key: &Bytes,
    cells: Vec<Cell>,
    out: &mut Vec<pb::read_rows_response::CellChunk>,
) -> usize {
    use pb::read_rows_response::{CellChunk, cell_chunk::RowStatus};
    let mut bytes = 0;
    let n = cells.len();
    let mut prev: Option<(String, Bytes)> = None;
    for (i, cell) in cells.into_iter().enumerate() {
        bytes += cell.value.len();
        let family_changed = prev.as_ref().is_none_or(|(f, _)| *f != cell.family);
        let column_changed =
            family_changed || prev.as_ref().is_none_or(|(_, q)| *q != cell.qualifier);
        let total = cell.value.len();
        let mut first = CellChunk {
            row_key: if i == 0 { key.clone() } else { Bytes::new() },
            family_name: family_changed.then(|| cell.family.clone()),
            qualifier: column_changed.then(|| cell.qualifier.to_vec()),
            timestamp_micros: cell.timestamp_micros,
            labels: cell.labels,
            value: Bytes::new(),
            value_size: 0,
            row_status: None,
        };
        prev = Some((cell.family, cell.qualifier));
        if total <= CHUNK_VALUE_BYTES {
            first.value = cell.value;
            out.push(first);
        } else {
            // A split value: every chunk but the last carries the total size.
            let mut offset = 0;
            let mut chunk = first;
            loop {
                let end = (offset + CHUNK_VALUE_BYTES).min(total);
                chunk.value = cell.value.slice(offset..end);
                chunk.value_size = if end < total { total as i32 } else { 0 };
                out.push(chunk);
                offset = end;
                if offset >= total {
                    break;
                }
                chunk = CellChunk::default();
            }
        }
        if i + 1 == n
            && let Some(last) = out.last_mut()
        {
            last.row_status = Some(RowStatus::CommitRow(true));
        }
    }
    bytes
}

type ReadStream = ReceiverStream<Result<pb::ReadRowsResponse, Status>>;
type SampleStream = ReceiverStream<Result<pb::SampleRowKeysResponse, Status>>;
type MutateRowsStream = ReceiverStream<Result<pb::MutateRowsResponse, Status>>;

#[tonic::async_trait]
impl<S: TabletStore> Bigtable for DataService<S> {
    type ReadRowsStream = ReadStream;
    type SampleRowKeysStream = SampleStream;
    type MutateRowsStream = MutateRowsStream;

    async fn read_rows(
        &self,
        request: Request<pb::ReadRowsRequest>,
    ) -> Result<Response<ReadStream>, Status> {
        let started = Instant::now();
        let req = request.into_inner();
        let table = self.resolved(
            "ReadRows",
            started,
            self.table(&req.table_name, &req.authorized_view_name),
        )?;
        self.read_rows_in(table, req, started)
    }

    async fn sample_row_keys(
        &self,
        request: Request<pb::SampleRowKeysRequest>,
    ) -> Result<Response<SampleStream>, Status> {
        let started = Instant::now();
        let req = request.into_inner();
        let table = self.resolved(
            "SampleRowKeys",
            started,
            self.table(&req.table_name, &req.authorized_view_name),
        )?;
        self.sample_row_keys_in(table, started).await
    }

    async fn mutate_row(
        &self,
        request: Request<pb::MutateRowRequest>,
    ) -> Result<Response<pb::MutateRowResponse>, Status> {
        let started = Instant::now();
        let req = request.into_inner();
        let table = self.resolved(
            "MutateRow",
            started,
            self.table(&req.table_name, &req.authorized_view_name),
        )?;
        self.mutate_row_in(table, req, started).await
    }

    async fn mutate_rows(
        &self,
        request: Request<pb::MutateRowsRequest>,
    ) -> Result<Response<MutateRowsStream>, Status> {
        let started = Instant::now();
        let req = request.into_inner();
        let table = self.resolved(
            "MutateRows",
            started,
            self.table(&req.table_name, &req.authorized_view_name),
        )?;
        self.mutate_rows_in(table, req, started).await
    }

    async fn check_and_mutate_row(
        &self,
        request: Request<pb::CheckAndMutateRowRequest>,
    ) -> Result<Response<pb::CheckAndMutateRowResponse>, Status> {
        let started = Instant::now();
        let req = request.into_inner();
        let table = self.resolved(
            "CheckAndMutateRow",
            started,
            self.table(&req.table_name, &req.authorized_view_name),
        )?;
        self.check_and_mutate_row_in(table, req, started).await
    }

    async fn ping_and_warm(
        &self,
        request: Request<pb::PingAndWarmRequest>,
    ) -> Result<Response<pb::PingAndWarmResponse>, Status> {
        let started = Instant::now();
        let req = request.into_inner();
        let r = parse_instance_name(&req.name).map(|_| pb::PingAndWarmResponse {});
        self.finish("PingAndWarm", started, r).map(Response::new)
    }

    async fn read_modify_write_row(
        &self,
        request: Request<pb::ReadModifyWriteRowRequest>,
    ) -> Result<Response<pb::ReadModifyWriteRowResponse>, Status> {
        let started = Instant::now();
        let req = request.into_inner();
        let table = self.resolved(
            "ReadModifyWriteRow",
            started,
            self.table(&req.table_name, &req.authorized_view_name),
        )?;
        self.read_modify_write_row_in(table, req, started).await
    }
}

/// Groups cells (in Bigtable order) into the nested `Row` message.
fn to_pb_row(key: Bytes, cells: Vec<Cell>) -> pb::Row {
    let mut families: Vec<pb::Family> = Vec::new();
    for cell in cells {
        if families.last().is_none_or(|f| f.name != cell.family) {
            families.push(pb::Family {
                name: cell.family.clone(),
                columns: vec![],
            });
        }
        let family = families.last_mut().expect("pushed above");
        if family
            .columns
            .last()
            .is_none_or(|c| c.qualifier != cell.qualifier)
        {
            family.columns.push(pb::Column {
                qualifier: cell.qualifier.clone(),
                cells: vec![],
            });
        }
        family
            .columns
            .last_mut()
            .expect("pushed above")
            .cells
            .push(pb::Cell {
                timestamp_micros: cell.timestamp_micros,
                value: cell.value,
                labels: cell.labels,
            });
    }
    pb::Row { key, families }
}

/// The data API's calls on a table already resolved: a cluster frontend resolves a request's
/// table once and serves its own rows through these (the `Bigtable` calls above resolve the
/// table, then call them).
impl<S: TabletStore> DataService<S> {
    /// ReadRows of a table already resolved.
    pub(crate) fn read_rows_in(
        &self,
        table: Arc<TableSchema>,
        req: pb::ReadRowsRequest,
        started: Instant,
    ) -> Result<Response<ReadStream>, Status> {
        let prepared = (|| {
            if !req.materialized_view_name.is_empty() {
                return Err(Error::Unimplemented(
                    "materialized views are not supported by Basalt yet".into(),
                ));
            }
            if req.rows_limit < 0 {
                return Err(Error::InvalidArgument(format!(
                    "rows_limit must not be negative, got {}",
                    req.rows_limit
                )));
            }
            let filter = match &req.filter {
                Some(f) => RowFilter::compile(f)?,
                None => RowFilter::pass_all(),
            };
            Ok(ReadPlan {
                rows: translate::row_set(req.rows.as_ref())?,
                table,
                filter,
                reversed: req.reversed,
                limit: if req.rows_limit == 0 {
                    u64::MAX
                } else {
                    req.rows_limit as u64
                },
                want_stats: req.request_stats_view
                    == pb::read_rows_request::RequestStatsView::RequestStatsFull as i32,
                started,
            })
        })();
        let plan = self.finish_prepare("ReadRows", started, prepared)?;
        self.loads.read(&plan.table, &plan.rows);
        self.key_samples.read(&plan.table, &plan.rows);
        let returned = self.key_samples.returned(&plan.table);

        // One row key (a point read): run the read right here and answer from memory, without
        // the hand-off to a blocking thread and the channel that streaming scans need.
        let point = req
            .rows
            .as_ref()
            .is_some_and(|s| s.row_ranges.is_empty() && s.row_keys.len() == 1);
        if point {
            let mut responses = Vec::new();
            let outcome = plan.run(
                &*self.store,
                &mut |resp| {
                    responses.push(Ok(resp));
                    true
                },
                &returned,
            );
            outcome.finish(&plan, &self.metrics, |status| responses.push(Err(status)));
            let (tx, rx) = mpsc::channel(responses.len().max(1));
            for r in responses {
                let _ = tx.try_send(r);
            }
            return Ok(Response::new(ReceiverStream::new(rx)));
        }

        let (tx, rx) = mpsc::channel(4);
        let store = self.store.clone();
        let metrics = self.metrics.clone();
        tokio::task::spawn_blocking(move || {
            let outcome = plan.run(
                &*store,
                &mut |resp| tx.blocking_send(Ok(resp)).is_ok(),
                &returned,
            );
            outcome.finish(&plan, &metrics, |status| {
                let _ = tx.blocking_send(Err(status));
            });
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    /// SampleRowKeys of a table already resolved.
    pub(crate) async fn sample_row_keys_in(
        &self,
        table: Arc<TableSchema>,
        started: Instant,
    ) -> Result<Response<SampleStream>, Status> {
        let store = self.store.clone();
        let result = blocking(move || Ok(store.sample_row_keys(&table)?)).await;
        let samples = self.finish("SampleRowKeys", started, result)?;
        let (tx, rx) = mpsc::channel(samples.len().max(1));
        for (row_key, offset) in samples {
            let _ = tx.try_send(Ok(pb::SampleRowKeysResponse {
                row_key,
                offset_bytes: offset as i64,
            }));
        }
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    /// MutateRow of a table already resolved.
    pub(crate) async fn mutate_row_in(
        &self,
        table: Arc<TableSchema>,
        req: pb::MutateRowRequest,
        started: Instant,
    ) -> Result<Response<pb::MutateRowResponse>, Status> {
        let result = async {
            self.loads.write(&table, &req.row_key);
            let mutations = translate::row_mutations(
                &table,
                &req.row_key,
                &req.mutations,
                translate::server_timestamp(),
            )?;
            let bytes = translate::mutation_bytes(&mutations);
            let row = req.row_key.clone();
            let rows = vec![RowMutation {
                row: req.row_key,
                mutations,
            }];
            self.store.mutate(table.clone(), rows).await?;
            self.metrics.written(&table.name, 1, bytes);
            self.key_samples
                .wrote(&table, &row, row.len() as u64 + bytes);
            Ok(pb::MutateRowResponse {})
        }
        .await;
        self.finish("MutateRow", started, result).map(Response::new)
    }

    /// MutateRows of a table already resolved.
    pub(crate) async fn mutate_rows_in(
        &self,
        table: Arc<TableSchema>,
        req: pb::MutateRowsRequest,
        started: Instant,
    ) -> Result<Response<MutateRowsStream>, Status> {
        use pb::mutate_rows_response::Entry;
        let result = async {
            self.loads
                .write_rows(&table, req.entries.iter().map(|e| &e.row_key[..]));
            if req.entries.is_empty() {
                return Err(Error::InvalidArgument(
                    "MutateRows needs at least one entry".into(),
                ));
            }
            let total: usize = req.entries.iter().map(|e| e.mutations.len()).sum();
            if total > basalt_model::limits::MAX_MUTATIONS {
                return Err(Error::InvalidArgument(format!(
                    "{total} mutations given across all entries; the maximum is {}",
                    basalt_model::limits::MAX_MUTATIONS
                )));
            }
            let server_ts = translate::server_timestamp();
            let mut statuses: Vec<Option<Error>> = Vec::with_capacity(req.entries.len());
            let mut valid = Vec::new();
            let mut bytes = 0;
            let mut sampled: Vec<(bytes::Bytes, u64)> = Vec::new();
            for entry in req.entries {
                match translate::row_mutations(&table, &entry.row_key, &entry.mutations, server_ts)
                {
                    Ok(mutations) => {
                        let b = translate::mutation_bytes(&mutations);
                        bytes += b;
                        sampled.push((entry.row_key.clone(), entry.row_key.len() as u64 + b));
                        statuses.push(None);
                        valid.push(RowMutation {
                            row: entry.row_key,
                            mutations,
                        });
                    }
                    Err(e) => statuses.push(Some(e)),
                }
            }
            let applied = valid.len() as u64;
            if !valid.is_empty() {
                if let Err(e) = self.store.mutate(table.clone(), valid).await {
                    // Nothing of the batch was written: every valid entry fails with the cause.
                    for s in statuses.iter_mut().filter(|s| s.is_none()) {
                        *s = Some(Error::from(e.clone()));
                    }
                } else {
                    self.metrics.written(&table.name, applied, bytes);
                    self.key_samples
                        .wrote_rows(&table, sampled.iter().map(|(row, b)| (row.as_ref(), *b)));
                }
            }
            let entries = statuses
                .into_iter()
                .enumerate()
                .map(|(index, s)| Entry {
                    index: index as i64,
                    status: Some(match s {
                        None => googleapis_tonic_google_rpc::google::rpc::Status::default(),
                        Some(e) => crate::error::rpc_status(&e),
                    }),
                })
                .collect();
            Ok(pb::MutateRowsResponse {
                entries,
                rate_limit_info: None,
            })
        }
        .await;
        let resp = self.finish("MutateRows", started, result)?;
        let (tx, rx) = mpsc::channel(1);
        let _ = tx.try_send(Ok(resp));
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    /// CheckAndMutateRow of a table already resolved.
    pub(crate) async fn check_and_mutate_row_in(
        &self,
        table: Arc<TableSchema>,
        req: pb::CheckAndMutateRowRequest,
        started: Instant,
    ) -> Result<Response<pb::CheckAndMutateRowResponse>, Status> {
        let result = async {
            self.loads.write(&table, &req.row_key);
            translate::validate_row_key(&req.row_key)?;
            if req.true_mutations.is_empty() && req.false_mutations.is_empty() {
                return Err(Error::InvalidArgument(
                    "No mutations provided: CheckAndMutateRow needs true_mutations or false_mutations"
                        .into(),
                ));
            }
            let total = req.true_mutations.len() + req.false_mutations.len();
            if total > basalt_model::limits::MAX_MUTATIONS {
                return Err(Error::InvalidArgument(format!(
                    "{total} mutations given; the maximum is {}",
                    basalt_model::limits::MAX_MUTATIONS
                )));
            }
            let server_ts = translate::server_timestamp();
            let convert = |list: &[pb::Mutation]| {
                if list.is_empty() {
                    Ok(Vec::new())
                } else {
                    translate::row_mutations(&table, &req.row_key, list, server_ts)
                }
            };
            let on_true = convert(&req.true_mutations)?;
            let on_false = convert(&req.false_mutations)?;
            // No predicate: "does the row have any cell at all".
            let predicate = match &req.predicate_filter {
                Some(f) => RowFilter::compile(f)?,
                None => RowFilter::pass_all(),
            };
            let store = self.store.clone();
            let t = table.clone();
            let row = req.row_key.clone();
            let (matched, bytes) = blocking(move || {
                Ok(store.read_modify_write(&t, &row, |current| {
                    let matched = !CellFilter::apply(&predicate, &current)?.is_empty();
                    let chosen = if matched { on_true } else { on_false };
                    let bytes = translate::mutation_bytes(&chosen);
                    Ok((chosen, (matched, bytes)))
                })?)
            })
            .await?;
            self.metrics.written(&table.name, 1, bytes);
            self.key_samples.wrote(
                &table,
                &req.row_key,
                req.row_key.len() as u64 + bytes,
            );
            Ok(pb::CheckAndMutateRowResponse {
                predicate_matched: matched,
            })
        }
        .await;
        self.finish("CheckAndMutateRow", started, result)
            .map(Response::new)
    }

    /// ReadModifyWriteRow of a table already resolved.
    pub(crate) async fn read_modify_write_row_in(
        &self,
        table: Arc<TableSchema>,
        req: pb::ReadModifyWriteRowRequest,
        started: Instant,
    ) -> Result<Response<pb::ReadModifyWriteRowResponse>, Status> {
        let result = async {
            self.loads.write(&table, &req.row_key);
            let rules = translate::read_modify_write_rules(&table, &req.row_key, &req.rules)?;
            let store = self.store.clone();
            let t = table.clone();
            let row = req.row_key.clone();
            let cells = blocking(move || {
                Ok(store.read_modify_write(&t, &row, |current| {
                    let cells = translate::apply_read_modify_write(
                        &current,
                        &rules,
                        translate::server_timestamp(),
                    )?;
                    let mutations = cells
                        .iter()
                        .map(|c| basalt_model::Mutation::SetCell {
                            family: c.family.clone(),
                            qualifier: c.qualifier.clone(),
                            timestamp: c.timestamp_micros,
                            value: c.value.clone(),
                        })
                        .collect::<Vec<_>>();
                    Ok((mutations, cells))
                })?)
            })
            .await?;
            let bytes = cells.iter().map(|c| c.value.len() as u64).sum();
            self.metrics.written(&table.name, 1, bytes);
            self.key_samples
                .wrote(&table, &req.row_key, req.row_key.len() as u64 + bytes);
            Ok(pb::ReadModifyWriteRowResponse {
                row: Some(to_pb_row(req.row_key, cells)),
            })
        }
        .await;
        self.finish("ReadModifyWriteRow", started, result)
            .map(Response::new)
    }
}

impl<S: TabletStore> DataService<S> {
    /// The table a call resolved; a failure is recorded as the call's outcome (a success is
    /// recorded when the call ends).
    fn resolved(
        &self,
        rpc: &str,
        started: Instant,
        table: Result<Arc<TableSchema>>,
    ) -> Result<Arc<TableSchema>, Status> {
        self.finish_prepare(rpc, started, table)
    }

    /// Like [`DataService::finish`] for the validation step of a stream: records failures only
    /// (a successful stream is recorded when it ends).
    fn finish_prepare<T>(&self, rpc: &str, started: Instant, r: Result<T>) -> Result<T, Status> {
        r.map_err(|e| {
            self.metrics.observe(rpc, code_of(&e), started);
            status(e)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pb::read_rows_response::cell_chunk::RowStatus;

    fn cell(f: &str, q: &str, ts: i64, v: Bytes) -> Cell {
        Cell {
            family: f.into(),
            qualifier: Bytes::copy_from_slice(q.as_bytes()),
            timestamp_micros: ts,
            value: v,
            labels: vec![],
        }
    }

    #[test]
    fn chunks_carry_names_only_on_change() {
        let mut out = Vec::new();
        let cells = vec![
            cell("a", "x", 2000, Bytes::from_static(b"1")),
            cell("a", "x", 1000, Bytes::from_static(b"2")),
            cell("a", "y", 1000, Bytes::from_static(b"3")),
            cell("b", "y", 1000, Bytes::from_static(b"4")),
        ];
        push_row_chunks(&Bytes::from_static(b"row"), cells, &mut out);
        assert_eq!(out.len(), 4);
        assert_eq!(&out[0].row_key[..], b"row");
        assert!(out[1].row_key.is_empty());
        assert_eq!(out[0].family_name.as_deref(), Some("a"));
        assert_eq!(out[1].family_name, None);
        assert_eq!(out[1].qualifier, None);
        assert_eq!(out[2].qualifier.as_deref(), Some(&b"y"[..]));
        assert_eq!(out[3].family_name.as_deref(), Some("b"));
        assert_eq!(out[3].qualifier.as_deref(), Some(&b"y"[..]));
        assert!(out[..3].iter().all(|c| c.row_status.is_none()));
        assert_eq!(out[3].row_status, Some(RowStatus::CommitRow(true)));
    }

    /// Rows of `cells` cells of `value` bytes each, keyed r00000, r00001, ...
    fn rows(shapes: &[(usize, usize)]) -> Vec<(Bytes, Vec<Cell>)> {
        // One shared buffer: the values are slices of it, so big shapes cost no copies.
        let largest = shapes.iter().map(|s| s.1).max().unwrap_or(0);
        let buffer = Bytes::from(vec![b'v'; largest]);
        shapes
            .iter()
            .enumerate()
            .map(|(i, &(cells, value))| {
                let key = Bytes::from(format!("r{i:05}"));
                let cells = (0..cells)
                    .map(|c| cell("f", &format!("q{c}"), 1000, buffer.slice(..value)))
                    .collect();
                (key, cells)
            })
            .collect()
    }

    /// Packs `rows` as the read path does; checks that every response ends on a committed
    /// row, that each row sits in exactly one response, in order, with all its value bytes,
    /// and that a response exceeds the target only when it holds a single row.
    fn pack_and_check(rows: Vec<(Bytes, Vec<Cell>)>) -> Vec<pb::ReadRowsResponse> {
        let expected: Vec<(Bytes, usize)> = rows
            .iter()
            .map(|(k, cells)| (k.clone(), cells.iter().map(|c| c.value.len()).sum()))
            .collect();
        let mut packer = ResponsePacker::default();
        let mut out = Vec::new();
        for (key, cells) in rows {
            packer.push_row(&key, cells, &mut out);
        }
        out.extend(packer.flush());
        let mut seen = Vec::new();
        for resp in &out {
            use prost::Message;
            let last = resp.chunks.last().expect("no empty responses");
            assert_eq!(
                last.row_status,
                Some(RowStatus::CommitRow(true)),
                "a response must end on a committed row"
            );
            let mut rows_here = 0;
            for chunk in &resp.chunks {
                if !chunk.row_key.is_empty() {
                    seen.push((chunk.row_key.clone(), 0usize));
                    rows_here += 1;
                }
                seen.last_mut().expect("first chunk has a key").1 += chunk.value.len();
            }
            assert!(
                rows_here == 1 || resp.encoded_len() <= RESPONSE_TARGET_BYTES + 64,
                "{rows_here} rows in a response of {} bytes",
                resp.encoded_len()
            );
        }
        assert_eq!(seen, expected);
        out
    }

    #[test]
    fn responses_end_on_row_boundaries() {
        // 10,000 rows x 5 small cells: many responses, each of whole rows.
        let out = pack_and_check(rows(&vec![(5, 20); 10_000]));
        assert!(out.len() > 1);
        // A small row, then one with a 3 MiB cell, then small ones again: the big row travels
        // alone, in one response, its value split into 1 MiB chunks.
        let out = pack_and_check(rows(&[(1, 10), (1, 3 << 20), (2, 10), (2, 10)]));
        assert_eq!(out.len(), 3);
        assert_eq!(out[1].chunks.len(), 3);
        // Rows larger than the target (many cells), a 20 MiB cell after small rows.
        pack_and_check(rows(&[
            (3, 100),
            (2000, 1000),
            (1, 20 << 20),
            (1, 1),
            (1, 1 << 20),
        ]));
    }

    proptest::proptest! {
        #[test]
        fn any_row_shapes_pack_into_whole_rows(
            shapes in proptest::collection::vec((1usize..40, 0usize..300_000), 1..40)
        ) {
            pack_and_check(rows(&shapes));
        }
    }

    #[test]
    fn large_values_are_split() {
        let total = CHUNK_VALUE_BYTES * 2 + 10;
        let value = Bytes::from(vec![7u8; total]);
        let mut out = Vec::new();
        push_row_chunks(
            &Bytes::from_static(b"r"),
            vec![cell("f", "q", 0, value)],
            &mut out,
        );
        assert_eq!(out.len(), 3);
        assert_eq!(out[0].value_size, total as i32);
        assert_eq!(out[1].value_size, total as i32);
        assert_eq!(out[2].value_size, 0);
        assert_eq!(out[0].family_name.as_deref(), Some("f"));
        assert_eq!(out[1].family_name, None);
        assert_eq!(out.iter().map(|c| c.value.len()).sum::<usize>(), total);
        assert_eq!(out[2].row_status, Some(RowStatus::CommitRow(true)));
    }
}
