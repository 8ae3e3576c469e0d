//! `basalt-bench`: a load generator for any endpoint speaking the Bigtable v2 gRPC API without
//! TLS (Basalt, the Bigtable emulator, a plain-text proxy to Cloud Bigtable).
//!
//! Workloads: YCSB A–F over 1 KB rows, bulk load through MutateRows batches, single-row writes,
//! point reads and range scans. Bounded by an operation count and/or a duration; prints a
//! progress line while it runs, then a table (throughput, p50/p90/p99/p99.9/max latency from an
//! HDR histogram, errors by status code) and the same figures as one JSON line.
//! Results and how they were measured: `docs/benchmarks.md`.

mod keys;
mod stats;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{Parser, ValueEnum};
use googleapis_tonic_google_bigtable_admin_v2::google::bigtable::admin::v2 as admin;
use googleapis_tonic_google_bigtable_v2::google::bigtable::v2 as pb;
use pb::bigtable_client::BigtableClient;
use pb::read_rows_response::cell_chunk::RowStatus;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use keys::{Distribution, KeyChooser, KeyOrder, Rng, row_key};
use stats::{Outcome, RunInfo, Stats};

const FAMILY: &str = "cf";

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
enum Workload {
    /// YCSB A: 50 % reads, 50 % updates (update-heavy).
    YcsbA,
    /// YCSB B: 95 % reads, 5 % updates (read-mostly).
    YcsbB,
    /// YCSB C: reads only.
    YcsbC,
    /// YCSB D: 95 % reads of the latest records, 5 % inserts of new records.
    YcsbD,
    /// YCSB E: 95 % short scans (1..=--scan-rows rows), 5 % inserts.
    YcsbE,
    /// YCSB F: 50 % reads, 50 % read-modify-write (read the row, write a field back).
    YcsbF,
    /// Bulk load: inserts records 0..--records once in MutateRows batches of --batch rows.
    Load,
    /// Single-row MutateRow writes of whole rows.
    Write,
    /// MutateRows batches of --batch whole rows.
    BatchWrite,
    /// Point reads (ReadRows of one row key).
    Read,
    /// Range scans of --scan-rows rows (ReadRows with a row range and rows_limit).
    Scan,
}

impl Workload {
    fn name(self) -> String {
        self.to_possible_value()
            .map(|v| v.get_name().to_string())
            .unwrap_or_default()
    }

    fn default_distribution(self) -> Distribution {
        match self {
            Workload::YcsbD => Distribution::Latest,
            Workload::YcsbA
            | Workload::YcsbB
            | Workload::YcsbC
            | Workload::YcsbE
            | Workload::YcsbF => Distribution::Zipfian,
            Workload::Load => Distribution::Sequential,
            Workload::Write | Workload::BatchWrite | Workload::Read | Workload::Scan => {
                Distribution::Uniform
            }
        }
    }
}

#[derive(Debug, Clone, Parser)]
#[command(name = "basalt-bench", version, about)]
struct Args {
    /// Data and admin endpoint: host:port or http://host:port (plain text unless --tls-ca).
    #[arg(long, default_value = "127.0.0.1:8086")]
    endpoint: String,
    /// Connect over TLS, trusting this CA (PEM) for the server's certificate.
    #[arg(long, value_name = "PEM")]
    tls_ca: Option<std::path::PathBuf>,
    /// The name the server's certificate is checked against (default: the endpoint's host).
    #[arg(long, value_name = "NAME", requires = "tls_ca")]
    tls_server_name: Option<String>,
    /// A bearer token sent with every request (`authorization: Bearer`), as the official
    /// clients' OAuth credentials send it.
    #[arg(long, value_name = "TOKEN")]
    token: Option<String>,
    /// Table to use; created with family `cf` if it does not exist (ALREADY_EXISTS is fine).
    #[arg(
        long,
        default_value = "projects/bench/instances/bench/tables/usertable"
    )]
    table: String,
    #[arg(long, value_enum, default_value = "ycsb-a")]
    workload: Workload,
    /// Run the load phase first: insert records 0..--records (MutateRows batches).
    #[arg(long)]
    load: bool,
    /// Records in the table (key space of reads and updates; what --load and `load` insert).
    #[arg(long, default_value_t = 100_000)]
    records: u64,
    /// Stop after this many operations (all workers together).
    #[arg(long)]
    operations: Option<u64>,
    /// Stop after this many seconds (default 10 when --operations is not given either).
    #[arg(long)]
    duration: Option<f64>,
    /// Requests in flight (one worker task per request).
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// gRPC connections (HTTP/2) the workers are spread over.
    #[arg(long, default_value_t = 2)]
    connections: usize,
    /// Bytes of cell values per row (split evenly over --columns).
    #[arg(long, default_value_t = 1024)]
    row_size: usize,
    /// Columns per row (`field0`, `field1`, …). YCSB updates write one column, inserts all.
    #[arg(long, default_value_t = 1)]
    columns: usize,
    /// Key choice; default: zipfian for YCSB A/B/C/E/F, latest for D, uniform otherwise.
    #[arg(long, value_enum)]
    distribution: Option<Distribution>,
    /// How record numbers become row keys.
    #[arg(long, value_enum, default_value = "hashed")]
    key_order: KeyOrder,
    /// Rows per MutateRows request (load, batch-write).
    #[arg(long, default_value_t = 100)]
    batch: usize,
    /// Rows per scan (scan); maximum scan length for YCSB E (uniform in 1..=N).
    #[arg(long, default_value_t = 100)]
    scan_rows: u64,
    /// GC rule of family `cf` when the table is created: keep N versions (0: no rule).
    #[arg(long, default_value_t = 1)]
    max_versions: i32,
    /// Seconds between progress lines on stderr (0: none).
    #[arg(long, default_value_t = 1.0)]
    progress: f64,
}

/// What every worker shares.
struct Ctx {
    args: Args,
    value_len: usize,
    qualifiers: Vec<Bytes>,
    /// Random bytes that values are sliced from (incompressible, like real data).
    random: Bytes,
    chooser: KeyChooser,
    /// Next record number an insert takes.
    next_insert: AtomicU64,
    /// Operations claimed (for --operations).
    claimed: AtomicU64,
    done: AtomicU64,
    failed: AtomicU64,
}

impl Ctx {
    fn key(&self, record: u64) -> Bytes {
        row_key(self.args.key_order, record)
    }

    fn value(&self, rng: &mut Rng) -> Bytes {
        let off = rng.below((self.random.len() - self.value_len) as u64) as usize;
        self.random.slice(off..off + self.value_len)
    }

    fn set_cell(&self, column: usize, rng: &mut Rng) -> pb::Mutation {
        pb::Mutation {
            mutation: Some(pb::mutation::Mutation::SetCell(pb::mutation::SetCell {
                family_name: FAMILY.into(),
                column_qualifier: self.qualifiers[column].clone(),
                timestamp_micros: -1,
                value: self.value(rng),
            })),
        }
    }

    fn whole_row(&self, rng: &mut Rng) -> Vec<pb::Mutation> {
        (0..self.qualifiers.len())
            .map(|c| self.set_cell(c, rng))
            .collect()
    }
}

fn failed(status: &tonic::Status) -> Outcome {
    Outcome::Failed(status.code())
}

/// ReadRows over `rows`; counts committed rows and value bytes.
async fn read_rows(
    client: &mut BigtableClient<Authed>,
    table: &str,
    rows: pb::RowSet,
    limit: i64,
) -> Outcome {
    let resp = client
        .read_rows(pb::ReadRowsRequest {
            table_name: table.to_string(),
            rows: Some(rows),
            rows_limit: limit,
            ..Default::default()
        })
        .await;
    let mut stream = match resp {
        Ok(r) => r.into_inner(),
        Err(s) => return failed(&s),
    };
    let (mut n, mut bytes) = (0u64, 0u64);
    loop {
        match stream.message().await {
            Ok(Some(m)) => {
                for c in &m.chunks {
                    bytes += c.value.len() as u64;
                    if matches!(c.row_status, Some(RowStatus::CommitRow(true))) {
                        n += 1;
                    }
                }
            }
            Ok(None) => break,
            Err(s) => return failed(&s),
        }
    }
    Outcome::Ok {
        rows: n,
        bytes,
        miss: n == 0,
    }
}

async fn point_read(ctx: &Ctx, client: &mut BigtableClient<Authed>, record: u64) -> Outcome {
    let rows = pb::RowSet {
        row_keys: vec![ctx.key(record)],
        row_ranges: vec![],
    };
    read_rows(client, &ctx.args.table, rows, 1).await
}

async fn scan(ctx: &Ctx, client: &mut BigtableClient<Authed>, record: u64, n: u64) -> Outcome {
    let rows = pb::RowSet {
        row_keys: vec![],
        row_ranges: vec![pb::RowRange {
            start_key: Some(pb::row_range::StartKey::StartKeyClosed(ctx.key(record))),
            end_key: None,
        }],
    };
    match read_rows(client, &ctx.args.table, rows, n as i64).await {
        // A scan near the end of the key space may return fewer rows; that is no miss.
        Outcome::Ok { rows, bytes, .. } => Outcome::Ok {
            rows,
            bytes,
            miss: false,
        },
        other => other,
    }
}

async fn mutate_row(
    ctx: &Ctx,
    client: &mut BigtableClient<Authed>,
    record: u64,
    mutations: Vec<pb::Mutation>,
) -> Outcome {
    let bytes = mutations.iter().map(set_cell_bytes).sum();
    let r = client
        .mutate_row(pb::MutateRowRequest {
            table_name: ctx.args.table.clone(),
            row_key: ctx.key(record),
            mutations,
            ..Default::default()
        })
        .await;
    match r {
        Ok(_) => Outcome::Ok {
            rows: 1,
            bytes,
            miss: false,
        },
        Err(s) => failed(&s),
    }
}

fn set_cell_bytes(m: &pb::Mutation) -> u64 {
    match &m.mutation {
        Some(pb::mutation::Mutation::SetCell(s)) => s.value.len() as u64,
        _ => 0,
    }
}

/// MutateRows of whole rows for `records`. Fails (with the first failing entry's code) if any
/// entry failed.
async fn mutate_rows(
    ctx: &Ctx,
    client: &mut BigtableClient<Authed>,
    records: impl Iterator<Item = u64>,
    rng: &mut Rng,
) -> Outcome {
    let entries: Vec<_> = records
        .map(|r| pb::mutate_rows_request::Entry {
            row_key: ctx.key(r),
            mutations: ctx.whole_row(rng),
            idempotency: None,
        })
        .collect();
    let rows = entries.len() as u64;
    let bytes = entries
        .iter()
        .flat_map(|e| &e.mutations)
        .map(set_cell_bytes)
        .sum();
    let r = client
        .mutate_rows(pb::MutateRowsRequest {
            table_name: ctx.args.table.clone(),
            entries,
            ..Default::default()
        })
        .await;
    let mut stream = match r {
        Ok(r) => r.into_inner(),
        Err(s) => return failed(&s),
    };
    let mut acknowledged = 0u64;
    loop {
        match stream.message().await {
            Ok(Some(m)) => {
                for e in &m.entries {
                    let code = e.status.as_ref().map_or(0, |s| s.code);
                    if code != 0 {
                        return Outcome::Failed(tonic::Code::from_i32(code));
                    }
                    acknowledged += 1;
                }
            }
            Ok(None) => break,
            Err(s) => return failed(&s),
        }
    }
    if acknowledged != rows {
        // Every entry must get a status; a missing one is a broken reply.
        return Outcome::Failed(tonic::Code::Unknown);
    }
    Outcome::Ok {
        rows,
        bytes,
        miss: false,
    }
}

/// Runs one operation of the workload; `None` when the workload has nothing left to do.
async fn operation(
    ctx: &Ctx,
    workload: Workload,
    client: &mut BigtableClient<Authed>,
    rng: &mut Rng,
) -> Option<(&'static str, Outcome)> {
    let args = &ctx.args;
    let roll = rng.below(100);
    let out = match workload {
        Workload::Load => {
            let batch = args.batch.max(1) as u64;
            let start = ctx.next_insert.fetch_add(batch, Ordering::Relaxed);
            if start >= args.records {
                return None;
            }
            let end = (start + batch).min(args.records);
            ("load", mutate_rows(ctx, client, start..end, rng).await)
        }
        Workload::Write => {
            let r = ctx.chooser.next(rng);
            let row = ctx.whole_row(rng);
            ("write", mutate_row(ctx, client, r, row).await)
        }
        Workload::BatchWrite => {
            let records: Vec<u64> = (0..args.batch.max(1))
                .map(|_| ctx.chooser.next(rng))
                .collect();
            (
                "batch-write",
                mutate_rows(ctx, client, records.into_iter(), rng).await,
            )
        }
        Workload::Read => {
            let r = ctx.chooser.next(rng);
            ("read", point_read(ctx, client, r).await)
        }
        Workload::Scan => {
            let r = ctx.chooser.next(rng);
            ("scan", scan(ctx, client, r, args.scan_rows.max(1)).await)
        }
        Workload::YcsbA | Workload::YcsbB | Workload::YcsbC => {
            let read_pct = match workload {
                Workload::YcsbA => 50,
                Workload::YcsbB => 95,
                _ => 100,
            };
            let r = ctx.chooser.next(rng);
            if roll < read_pct {
                ("read", point_read(ctx, client, r).await)
            } else {
                let column = rng.below(ctx.qualifiers.len() as u64) as usize;
                let m = vec![ctx.set_cell(column, rng)];
                ("update", mutate_row(ctx, client, r, m).await)
            }
        }
        Workload::YcsbD | Workload::YcsbE => {
            if roll < 95 {
                let r = ctx.chooser.next(rng);
                if workload == Workload::YcsbD {
                    ("read", point_read(ctx, client, r).await)
                } else {
                    let n = 1 + rng.below(args.scan_rows.max(1));
                    ("scan", scan(ctx, client, r, n).await)
                }
            } else {
                let r = ctx.next_insert.fetch_add(1, Ordering::Relaxed);
                let row = ctx.whole_row(rng);
                let out = mutate_row(ctx, client, r, row).await;
                if matches!(out, Outcome::Ok { .. }) {
                    // Readers may now choose it (approximately: inserts finish out of order).
                    ctx.chooser.inserted.fetch_max(r + 1, Ordering::Relaxed);
                }
                ("insert", out)
            }
        }
        Workload::YcsbF => {
            let r = ctx.chooser.next(rng);
            if roll < 50 {
                ("read", point_read(ctx, client, r).await)
            } else {
                // YCSB's read-modify-write: read the record, then write one field back; the
                // latency covers both requests.
                let out = match point_read(ctx, client, r).await {
                    Outcome::Ok { .. } => {
                        let column = rng.below(ctx.qualifiers.len() as u64) as usize;
                        let m = vec![ctx.set_cell(column, rng)];
                        mutate_row(ctx, client, r, m).await
                    }
                    f => f,
                };
                ("read-modify-write", out)
            }
        }
    };
    Some(out)
}

/// Runs `workload` with all workers until the bounds are reached; returns merged stats and
/// the elapsed seconds.
async fn run_phase(
    ctx: Arc<Ctx>,
    channels: &[Authed],
    workload: Workload,
    operations: Option<u64>,
    duration: Option<Duration>,
) -> (Stats, f64) {
    let started = Instant::now();
    let deadline = duration.map(|d| started + d);
    let finished = Arc::new(AtomicBool::new(false));
    let progress = (ctx.args.progress > 0.0).then(|| {
        let ctx = ctx.clone();
        let finished = finished.clone();
        let every = Duration::from_secs_f64(ctx.args.progress);
        tokio::spawn(async move {
            let mut last = (0u64, Instant::now());
            loop {
                tokio::time::sleep(every).await;
                if finished.load(Ordering::Relaxed) {
                    break;
                }
                let done = ctx.done.load(Ordering::Relaxed);
                let now = Instant::now();
                let rate = (done - last.0) as f64 / (now - last.1).as_secs_f64();
                last = (done, now);
                eprintln!(
                    "[{:>6.1} s] {:<12} ops {:>10}  {:>9.0} ops/s now  {:>9.0} ops/s avg  errors {}",
                    started.elapsed().as_secs_f64(),
                    workload.name(),
                    done,
                    rate,
                    done as f64 / started.elapsed().as_secs_f64(),
                    ctx.failed.load(Ordering::Relaxed)
                );
            }
        })
    });

    let mut tasks = Vec::new();
    for worker in 0..ctx.args.concurrency.max(1) {
        let ctx = ctx.clone();
        let mut client = BigtableClient::new(channels[worker % channels.len()].clone())
            .max_decoding_message_size(256 << 20)
            .max_encoding_message_size(256 << 20);
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng::new(worker as u64 * 7919 + 17);
            let mut stats = Stats::default();
            loop {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    break;
                }
                if let Some(max) = operations
                    && ctx.claimed.fetch_add(1, Ordering::Relaxed) >= max
                {
                    break;
                }
                let t0 = Instant::now();
                let Some((op, outcome)) = operation(&ctx, workload, &mut client, &mut rng).await
                else {
                    break;
                };
                stats.record(op, t0.elapsed().as_micros() as u64, &outcome);
                ctx.done.fetch_add(1, Ordering::Relaxed);
                if matches!(outcome, Outcome::Failed(_)) {
                    ctx.failed.fetch_add(1, Ordering::Relaxed);
                }
            }
            stats
        }));
    }
    let mut stats = Stats::default();
    for t in tasks {
        match t.await {
            Ok(s) => stats.merge(&s),
            Err(e) => panic!("worker failed: {e}"),
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    finished.store(true, Ordering::Relaxed);
    if let Some(p) = progress {
        p.abort();
    }
    (stats, seconds)
}

async fn ensure_table(channel: Authed, table: &str, max_versions: i32) -> Result<(), String> {
    let (parent, id) = table
        .rsplit_once("/tables/")
        .ok_or("--table must be projects/P/instances/I/tables/T")?;
    let mut client = admin::bigtable_table_admin_client::BigtableTableAdminClient::new(channel);
    let table = admin::Table {
        column_families: [(
            FAMILY.to_string(),
            admin::ColumnFamily {
                gc_rule: (max_versions > 0).then_some(admin::GcRule {
                    rule: Some(admin::gc_rule::Rule::MaxNumVersions(max_versions)),
                }),
                value_type: None,
            },
        )]
        .into(),
        ..Default::default()
    };
    match client
        .create_table(admin::CreateTableRequest {
            parent: parent.into(),
            table_id: id.into(),
            table: Some(table),
            initial_splits: vec![],
        })
        .await
    {
        Ok(_) => Ok(()),
        Err(s) if s.code() == tonic::Code::AlreadyExists => Ok(()),
        Err(s) => Err(format!("CreateTable failed: {s}")),
    }
}

/// A channel whose requests carry the bearer token, if any.
type Authed = InterceptedService<Channel, Token>;

/// Adds `authorization: Bearer <token>` to every request.
#[derive(Clone)]
struct Token(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl tonic::service::Interceptor for Token {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            request.metadata_mut().insert("authorization", v.clone());
        }
        Ok(request)
    }
}

async fn connect(args: &Args) -> Result<Authed, String> {
    let endpoint = &args.endpoint;
    let bare = endpoint
        .split_once("://")
        .map_or(endpoint.as_str(), |(_, a)| a);
    // The URL's scheme follows the security, as basalt-transport spells it.
    let url = if args.tls_ca.is_some() {
        format!("https://{bare}")
    } else {
        basalt_transport::Security::Plaintext.url(bare)
    };
    let mut e = Endpoint::from_shared(url)
        .map_err(|e| format!("bad --endpoint {endpoint}: {e}"))?
        .tcp_nodelay(true);
    if let Some(ca) = &args.tls_ca {
        let pem = std::fs::read(ca).map_err(|e| format!("--tls-ca {}: {e}", ca.display()))?;
        let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem));
        if let Some(name) = &args.tls_server_name {
            tls = tls.domain_name(name.clone());
        }
        e = e.tls_config(tls).map_err(|e| format!("TLS: {e}"))?;
    }
    let channel = e
        .connect()
        .await
        .map_err(|e| format!("cannot connect to {endpoint}: {e}"))?;
    let token = match &args.token {
        Some(t) => Some(
            format!("Bearer {t}")
                .parse()
                .map_err(|_| "--token: not a valid header value".to_string())?,
        ),
        None => None,
    };
    Ok(InterceptedService::new(channel, Token(token)))
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    if let Err(e) = run(args).await {
        eprintln!("basalt-bench: {e}");
        std::process::exit(2);
    }
}

async fn run(args: Args) -> Result<(), String> {
    if args.columns == 0 || args.row_size == 0 {
        return Err("--columns and --row-size must be positive".into());
    }
    let mut channels = Vec::new();
    for _ in 0..args.connections.max(1) {
        channels.push(connect(&args).await?);
    }
    ensure_table(channels[0].clone(), &args.table, args.max_versions).await?;

    let value_len = (args.row_size / args.columns).max(1);
    let mut random = vec![0u8; (1 << 20) + value_len];
    let mut rng = Rng::new(42);
    for b in random.chunks_mut(8) {
        let x = rng.next_u64().to_le_bytes();
        b.copy_from_slice(&x[..b.len()]);
    }
    let qualifiers = (0..args.columns)
        .map(|i| Bytes::from(format!("field{i}")))
        .collect();
    let distribution = args
        .distribution
        .unwrap_or_else(|| args.workload.default_distribution());
    let duration = match (args.duration, args.operations) {
        (Some(d), _) => Some(Duration::from_secs_f64(d)),
        (None, Some(_)) => None,
        (None, None) => Some(Duration::from_secs(10)),
    };
    let records = args.records;
    let new_ctx = |args: &Args, workload: Workload, dist: Distribution| {
        Arc::new(Ctx {
            value_len,
            qualifiers: Vec::clone(&qualifiers),
            random: Bytes::from(random.clone()),
            chooser: KeyChooser::new(dist, records, Arc::new(AtomicU64::new(records))),
            // Bulk load inserts records 0..; YCSB D/E insert new records after the loaded ones.
            next_insert: AtomicU64::new(if workload == Workload::Load {
                0
            } else {
                records
            }),
            claimed: AtomicU64::new(0),
            done: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            args: args.clone(),
        })
    };
    let report = |phase: &str, workload: Workload, dist: Distribution, stats: &Stats, secs| {
        stats::report(
            &RunInfo {
                phase,
                workload: &workload.name(),
                distribution: &format!("{dist:?}").to_lowercase(),
                concurrency: args.concurrency.max(1),
                connections: args.connections.max(1),
                records,
                row_size: value_len * args.columns,
                columns: args.columns,
                endpoint: &args.endpoint,
                table: &args.table,
            },
            stats,
            secs,
        )
    };

    let mut reports = Vec::new();
    if args.load && args.workload != Workload::Load {
        let dist = Distribution::Sequential;
        let ctx = new_ctx(&args, Workload::Load, dist);
        let (stats, secs) = run_phase(ctx, &channels, Workload::Load, None, None).await;
        reports.push(report("load", Workload::Load, dist, &stats, secs));
    }
    // The load workload ends when every record is in (or at an explicit bound).
    let duration = if args.workload == Workload::Load {
        args.duration.map(Duration::from_secs_f64)
    } else {
        duration
    };
    let ctx = new_ctx(&args, args.workload, distribution);
    let (stats, secs) = run_phase(ctx, &channels, args.workload, args.operations, duration).await;
    reports.push(report("run", args.workload, distribution, &stats, secs));
    // Machine-readable: one JSON object per phase, each on a line of its own, at the end.
    for r in reports {
        println!("{r}");
    }
    Ok(())
}
