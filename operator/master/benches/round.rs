//! The master's decisions at scale (issue 30): every pure decision a round of the master makes
//! (`operator/src/master/mod.rs`, `Leader::cluster` and `split_and_move`), timed on generated
//! views of up to thousands of servers and a million tablets
//! ([`basalt_master::fixture::Synthetic`]), with the memory of the view and the extra memory
//! each decision allocates at its peak. Not a criterion benchmark: one decision over a
//! million tablets takes long enough to time directly, and criterion's many samples would
//! take minutes per size.
//!
//! ```sh
//! cargo bench -p basalt-master --bench round                 # 100×10^4, 1,000×10^5, 1,000×10^6
//! BASALT_SCALE_SIZES=all cargo bench -p basalt-master --bench round   # {100,1000,5000}×{10^4,10^5,10^6}
//! BASALT_SCALE_SIZES=5000x1000000 BASALT_SCALE_REPS=5 cargo bench -p basalt-master --bench round
//! ```
//!
//! Each decision runs `BASALT_SCALE_REPS` times (default 3); the table gives the median and the
//! fastest. "round" sums the medians of what one round of a healthy cluster decides: a new
//! table placed, lost servers looked for and their tablets marked, splits, a drain of one
//! server and a rebalance (the runtime rebalances only when the drain plans nothing: the sum
//! is the worst case). The runtime's reading of etcd and the servers' reports is not in it
//! (`cargo run -p basalt-meta --example scale` measures etcd; docs/scale.md).

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use basalt_master::fixture::{Synthetic, even_ranges};
use basalt_master::model::{Tablet, TabletMap, TabletState};
use basalt_master::{
    BalanceContext, BalancePolicy, ClusterView, MovePlan, MoveReason, SplitContext, SplitPolicy,
    accept_loss, assign_new_table, drain, key_of, lost_servers, mark_lost, rebalance, splits,
};

/// Counts the bytes allocated and live, and their peak: the memory of a view, and what a
/// decision allocates on top of it.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                let grown = new_size - layout.size();
                let live = LIVE.fetch_add(grown, Ordering::Relaxed) + grown;
                PEAK.fetch_max(live, Ordering::Relaxed);
            } else {
                LIVE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const MIB: f64 = (1 << 20) as f64;

fn main() {
    // `cargo bench` passes `--bench`; a filter argument is not supported.
    let sizes = std::env::var("BASALT_SCALE_SIZES").unwrap_or_default();
    let sizes: Vec<(u32, usize)> = match sizes.as_str() {
        "" => vec![(100, 10_000), (1_000, 100_000), (1_000, 1_000_000)],
        "all" => [100, 1_000, 5_000]
            .into_iter()
            .flat_map(|s| [10_000, 100_000, 1_000_000].map(|t| (s, t)))
            .collect(),
        list => list
            .split(',')
            .map(|size| {
                let (s, t) = size
                    .split_once('x')
                    .expect("BASALT_SCALE_SIZES: SERVERSxTABLETS,… or all");
                (
                    s.trim().parse().expect("servers"),
                    t.trim().parse().expect("tablets"),
                )
            })
            .collect(),
    };
    let reps: usize = std::env::var("BASALT_SCALE_REPS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3)
        .max(1);
    for (servers, tablets) in sizes {
        measure(servers, tablets, reps);
    }
}

/// One timed decision: its median and fastest run, the extra memory at its peak, and what it
/// decided (for the reader: a decision that found nothing to do is quick for that reason).
struct Row {
    name: &'static str,
    median: Duration,
    fastest: Duration,
    peak_extra: usize,
    outcome: String,
}

fn time<T>(
    name: &'static str,
    reps: usize,
    mut decide: impl FnMut() -> T,
    outcome: impl Fn(&T) -> String,
) -> Row {
    let mut runs = Vec::with_capacity(reps);
    let mut peak_extra = 0;
    let mut last = None;
    for _ in 0..reps {
        drop(last.take());
        let base = LIVE.load(Ordering::Relaxed);
        PEAK.store(base, Ordering::Relaxed);
        let started = Instant::now();
        let result = std::hint::black_box(decide());
        runs.push(started.elapsed());
        peak_extra = peak_extra.max(PEAK.load(Ordering::Relaxed).saturating_sub(base));
        last = Some(result);
    }
    runs.sort();
    Row {
        name,
        median: runs[runs.len() / 2],
        fastest: runs[0],
        peak_extra,
        outcome: outcome(last.as_ref().expect("at least one run")),
    }
}

fn measure(servers: u32, tablets: usize, reps: usize) {
    println!("\n## {servers} servers, {tablets} tablets ({reps} runs each)\n");
    let before = LIVE.load(Ordering::Relaxed);
    let started = Instant::now();
    let mut view = Synthetic::new(servers, tablets).build();
    let generated = started.elapsed();
    let view_bytes = LIVE.load(Ordering::Relaxed) - before;
    let before = LIVE.load(Ordering::Relaxed);
    let map = view.tablets.clone();
    let map_bytes = LIVE.load(Ordering::Relaxed) - before;
    drop(map);
    println!(
        "view: {:.1} MiB ({:.0} bytes per tablet), of which the tablet map {:.1} MiB; generated in {:.2} s\n",
        view_bytes as f64 / MIB,
        view_bytes as f64 / tablets as f64,
        map_bytes as f64 / MIB,
        generated.as_secs_f64()
    );

    let ctx = balance_context(&view);
    let split_ctx = SplitContext {
        backing_off: ctx.cooling.iter().take(10).cloned().collect(),
        in_flight: ctx.in_flight.clone(),
    };
    let policy = BalancePolicy::default();
    let new_table = even_ranges(1_000);
    let mut rows = Vec::new();

    rows.push(time(
        "check (not part of a round)",
        reps,
        || view.check(),
        |r| format!("{:?}", r.as_ref().map(|_| "ok")),
    ));
    rows.push(time(
        "placement: a new table of 1,000 tablets",
        reps,
        || assign_new_table(&view, "table-new", &new_table),
        |t| format!("{} placed", t.len()),
    ));
    rows.push(time(
        "splits",
        reps,
        || splits(&view, &split_ctx, &SplitPolicy::default()),
        |p| format!("{} proposed", p.len()),
    ));
    let one = servers - 1;
    rows.push(time(
        "drain: 1 server",
        reps,
        || drain(&view, one, &ctx, &policy),
        drained,
    ));
    let tenth = servers - servers.div_ceil(10);
    rows.push(time(
        "drain: a tenth of the servers",
        reps,
        || drain(&view, tenth, &ctx, &policy),
        drained,
    ));
    rows.push(time(
        "rebalance",
        reps,
        || rebalance(&view, &ctx, &policy),
        |p| format!("{} moves", p.len()),
    ));
    // What a big cluster needs to move at all at its size (docs/scale.md): 1 move per server,
    // up to a tenth of the servers at once.
    let wide = BalancePolicy {
        max_moves_per_cluster: (servers as usize / 10).max(2),
        ..policy.clone()
    };
    rows.push(time(
        "rebalance, moves per cluster = servers / 10",
        reps,
        || rebalance(&view, &ctx, &wide),
        |p| format!("{} moves", p.len()),
    ));

    // Failover: the server of ordinal 1 came back under a new store id an hour ago.
    let now = Instant::now() + Duration::from_secs(7200);
    let old = view
        .servers
        .values()
        .find(|s| s.ordinal == 1)
        .expect("ordinal 1")
        .id
        .clone();
    replace(&mut view, &old, now - Duration::from_secs(3600));
    let margin = Duration::from_secs(15);
    rows.push(time(
        "failover: lost servers",
        reps,
        || lost_servers(&view, now, margin),
        |l| format!("{} lost", l.len()),
    ));
    let lost = vec![old.clone()];
    rows.push(time(
        "failover: mark lost",
        reps,
        || mark_lost(&view, &lost),
        |m| format!("{} marked", m.len()),
    ));
    let marked = with_lost(&view, &old);
    rows.push(time(
        "failover: accept the loss",
        reps,
        || accept_loss(&marked, &lost),
        |m| format!("{} re-created", m.len()),
    ));
    drop(marked);

    println!("| decision | median ms | fastest ms | extra MiB at peak | decided |");
    println!("| --- | ---: | ---: | ---: | --- |");
    let mut round = Duration::ZERO;
    for row in &rows {
        let extra = [
            "check",
            "drain: a tenth",
            "failover: accept",
            "rebalance, moves",
        ];
        if !extra.iter().any(|e| row.name.starts_with(e)) {
            round += row.median;
        }
        println!(
            "| {} | {:.2} | {:.2} | {:.1} | {} |",
            row.name,
            row.median.as_secs_f64() * 1e3,
            row.fastest.as_secs_f64() * 1e3,
            row.peak_extra as f64 / MIB,
            row.outcome
        );
    }
    println!(
        "| **round** (placement, splits, drain of 1, rebalance, lost, mark lost) | **{:.1}** | | | |",
        round.as_secs_f64() * 1e3
    );
}

fn drained(plan: &basalt_master::DrainPlan) -> String {
    match &plan.blocked {
        Some(b) => format!("blocked: {}", b.reason.chars().take(60).collect::<String>()),
        None => format!(
            "{} moves, {} tablets to go",
            plan.moves.len(),
            plan.remaining_tablets
        ),
    }
}

/// One move in flight (of the default limit of two per cluster), off the most loaded
/// server's first tablet, and a hundred tablets cooling down after earlier moves.
fn balance_context(view: &ClusterView) -> BalanceContext {
    let by_ordinal = view.servers_by_ordinal();
    let last = by_ordinal.len() - 1;
    let mut in_flight = Vec::new();
    if last > 0 {
        let from = &by_ordinal[0].id;
        if let Some(t) = view.tablets_of(from).next() {
            in_flight.push(MovePlan {
                tablet: t.clone(),
                from: from.clone(),
                to: by_ordinal[last].id.clone(),
                reason: MoveReason::Balance,
            });
        }
    }
    let mut cooling = BTreeSet::new();
    for table in view.tablets.tables().take(10) {
        cooling.extend(view.tablets.tablets(table).iter().take(10).map(key_of));
    }
    BalanceContext {
        in_flight,
        cooling,
        draining: BTreeSet::new(),
    }
}

/// `old` absent since `since`, its name registered now under a new store id.
fn replace(view: &mut ClusterView, old: &str, since: Instant) {
    let mut state = view.servers[old].clone();
    let mut presence = view.presence[old].clone();
    view.servers.get_mut(old).expect("old").ready = false;
    view.presence.get_mut(old).expect("old").absent_since = Some(since);
    state.id = format!("{old}-new");
    presence.absent_since = None;
    view.servers.insert(state.id.clone(), state.clone());
    view.presence.insert(state.id, presence);
}

/// `view` with every tablet of `owner` Lost.
fn with_lost(view: &ClusterView, owner: &str) -> ClusterView {
    let tablets: Vec<Tablet> = view
        .tablets
        .tables()
        .flat_map(|t| view.tablets.tablets(t).iter().cloned())
        .map(|mut t| {
            if t.owner == owner {
                t.state = TabletState::Lost;
            }
            t
        })
        .collect();
    ClusterView {
        tablets: TabletMap::new(tablets).expect("same ranges"),
        ..view.clone()
    }
}
