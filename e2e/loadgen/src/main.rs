//! `basalt-loadgen`: drives a Bigtable endpoint (Basalt, or anything speaking the Bigtable v2
//! API without TLS) with concurrent writes, point reads or scans, and prints throughput and
//! latency percentiles. Results go to `docs/benchmarks.md` with the machine size.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{Parser, ValueEnum};
use googleapis_tonic_google_bigtable_admin_v2::google::bigtable::admin::v2 as admin;
use googleapis_tonic_google_bigtable_v2::google::bigtable::v2 as pb;
use tonic::transport::Channel;

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq)]
enum Workload {
    /// MutateRow of one cell per row (each acknowledged write is fsynced by Basalt).
    Write,
    /// MutateRows batches of `--batch` rows.
    BatchWrite,
    /// ReadRows of one random row key.
    Read,
    /// ReadRows scans of `--scan-rows` consecutive rows from a random start.
    Scan,
}

#[derive(Debug, Parser)]
#[command(name = "basalt-loadgen")]
struct Args {
    /// Data endpoint, host:port (e.g. the server's --listen address).
    #[arg(long, default_value = "127.0.0.1:8086")]
    endpoint: String,
    /// Project/instance/table to use; the table is created (family `cf`) if it does not exist.
    #[arg(long, default_value = "projects/loadgen/instances/loadgen/tables/load")]
    table: String,
    #[arg(long, value_enum, default_value = "write")]
    workload: Workload,
    /// Number of distinct row keys (writes cycle over them; reads pick among them).
    #[arg(long, default_value_t = 100_000)]
    rows: u64,
    /// Bytes per cell value.
    #[arg(long, default_value_t = 1024)]
    value_size: usize,
    /// Concurrent requests in flight.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// How long to run, in seconds.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Rows per MutateRows request (batch-write).
    #[arg(long, default_value_t = 100)]
    batch: usize,
    /// Rows per scan (scan).
    #[arg(long, default_value_t = 100)]
    scan_rows: i64,
    /// GC rule of the table's family when the load generator creates it: keep this many
    /// versions (0: no GC rule).
    #[arg(long, default_value_t = 1)]
    max_versions: i32,
}

fn key(i: u64) -> Bytes {
    // Hash-spread keys avoid a sequential hotspot, as the schema guide recommends.
    let h = i.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(17);
    Bytes::from(format!("{:016x}#{i:010}", h))
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Arc::new(Args::parse());
    let channel = Channel::from_shared(format!("http://{}", args.endpoint))?
        .connect()
        .await?;
    ensure_table(channel.clone(), &args.table, args.max_versions).await?;

    let done = Arc::new(AtomicU64::new(0));
    let rows_done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for worker in 0..args.concurrency {
        let mut client = pb::bigtable_client::BigtableClient::new(channel.clone())
            .max_decoding_message_size(256 << 20)
            .max_encoding_message_size(256 << 20);
        let args = args.clone();
        let (done, rows_done, errors) = (done.clone(), rows_done.clone(), errors.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng(0x1234_5678_9abc_def1 ^ ((worker as u64 + 1) * 0x9E37));
            let value = Bytes::from(vec![b'v'; args.value_size]);
            let mut latencies = Vec::new();
            let mut seq = worker as u64;
            while Instant::now() < deadline {
                let t0 = Instant::now();
                let (ok, rows) = match args.workload {
                    Workload::Write => {
                        seq = (seq + args.concurrency as u64) % args.rows;
                        let r = client.mutate_row(pb::MutateRowRequest {
                            table_name: args.table.clone(),
                            row_key: key(seq),
                            mutations: vec![set_cell(value.clone())],
                            ..Default::default()
                        });
                        (r.await.is_ok(), 1)
                    }
                    Workload::BatchWrite => {
                        let entries = (0..args.batch)
                            .map(|_| {
                                seq = (seq + args.concurrency as u64) % args.rows;
                                pb::mutate_rows_request::Entry {
                                    row_key: key(seq),
                                    mutations: vec![set_cell(value.clone())],
                                    idempotency: None,
                                }
                            })
                            .collect();
                        let r = client
                            .mutate_rows(pb::MutateRowsRequest {
                                table_name: args.table.clone(),
                                entries,
                                ..Default::default()
                            })
                            .await;
                        let ok = match r {
                            Ok(resp) => {
                                let mut stream = resp.into_inner();
                                let mut all_ok = true;
                                while let Ok(Some(m)) = stream.message().await {
                                    all_ok &= m.entries.iter().all(|e| e.status.as_ref().is_none_or(|s| s.code == 0));
                                }
                                all_ok
                            }
                            Err(_) => false,
                        };
                        (ok, args.batch as u64)
                    }
                    Workload::Read | Workload::Scan => {
                        let start = key(rng.next() % args.rows);
                        let (rows, limit) = if args.workload == Workload::Read {
                            (pb::RowSet { row_keys: vec![start], row_ranges: vec![] }, 1)
                        } else {
                            (
                                pb::RowSet {
                                    row_keys: vec![],
                                    row_ranges: vec![pb::RowRange {
                                        start_key: Some(pb::row_range::StartKey::StartKeyClosed(start)),
                                        end_key: None,
                                    }],
                                },
                                args.scan_rows,
                            )
                        };
                        let r = client
                            .read_rows(pb::ReadRowsRequest {
                                table_name: args.table.clone(),
                                rows: Some(rows),
                                rows_limit: limit,
                                ..Default::default()
                            })
                            .await;
                        match r {
                            Ok(resp) => {
                                let mut stream = resp.into_inner();
                                let mut n = 0u64;
                                let mut ok = true;
                                loop {
                                    match stream.message().await {
                                        Ok(Some(m)) => {
                                            n += m
                                                .chunks
                                                .iter()
                                                .filter(|c| {
                                                    matches!(
                                                        c.row_status,
                                                        Some(pb::read_rows_response::cell_chunk::RowStatus::CommitRow(true))
                                                    )
                                                })
                                                .count() as u64
                                        }
                                        Ok(None) => break,
                                        Err(_) => {
                                            ok = false;
                                            break;
                                        }
                                    }
                                }
                                (ok, n)
                            }
                            Err(_) => (false, 0),
                        }
                    }
                };
                latencies.push(t0.elapsed());
                if ok {
                    done.fetch_add(1, Ordering::Relaxed);
                    rows_done.fetch_add(rows, Ordering::Relaxed);
                } else {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
            }
            latencies
        }));
    }
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await?);
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort();
    let pct = |p: f64| {
        latencies
            .get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)))
            .map(|d| d.as_secs_f64() * 1000.0)
            .unwrap_or(0.0)
    };
    println!(
        "workload={:?} concurrency={} value_size={} seconds={:.1}",
        args.workload, args.concurrency, args.value_size, elapsed
    );
    println!(
        "requests/s={:.0} rows/s={:.0} errors={} latency_ms p50={:.2} p99={:.2} max={:.2}",
        done.load(Ordering::Relaxed) as f64 / elapsed,
        rows_done.load(Ordering::Relaxed) as f64 / elapsed,
        errors.load(Ordering::Relaxed),
        pct(0.50),
        pct(0.99),
        pct(1.0)
    );
    Ok(())
}

fn set_cell(value: Bytes) -> pb::Mutation {
    pb::Mutation {
        mutation: Some(pb::mutation::Mutation::SetCell(pb::mutation::SetCell {
            family_name: "cf".into(),
            column_qualifier: Bytes::from_static(b"v"),
            timestamp_micros: -1,
            value,
        })),
    }
}

async fn ensure_table(
    channel: Channel,
    table: &str,
    max_versions: i32,
) -> Result<(), Box<dyn std::error::Error>> {
    let (parent, id) = table
        .rsplit_once("/tables/")
        .ok_or("--table must be projects/P/instances/I/tables/T")?;
    let mut client = admin::bigtable_table_admin_client::BigtableTableAdminClient::new(channel);
    let table = admin::Table {
        column_families: [(
            "cf".to_string(),
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
        Err(s) => Err(s.into()),
    }
}
