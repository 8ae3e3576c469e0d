//! Carrying out one tablet move (see `docs/cluster.md`, "Tablet moves"): the etcd
//! transactions, fenced by the master's term, around the tablet servers' steps.
//!
//! 1. `begin_move`: the move's record (phase Copying), if the tablet is still as planned;
//! 2. the destination's ReceiveTablet: snapshot copied and ingested, capture caught up;
//! 3. `fence_move`: tablet state Fencing, phase Fencing (nobody serves it from here on, also
//!    after a restart of its owner);
//! 4. the source's FenceTablet: last sequence and clock;
//! 5. the destination's FinishMove: applied through that sequence, clock taken over;
//! 6. `commit_move`: owner → destination, epoch + 1, Serving; the record deleted;
//! 7. the source's ReleaseTablet: its rows deleted.
//!
//! A failure before 6 aborts: `abort_move` deletes the record (and puts a fenced tablet back
//! to Serving at its owner) and only once that transaction won are the servers told to drop
//! their parts — so a destination never deletes rows of a move that committed. When the
//! outcome of 6 is unknown, the tablet's record says which won.

use std::time::{Duration, Instant};

use basalt_control::Dialer;
use basalt_control::failpoints::hold;
use basalt_control::v1::{
    AbortMoveRequest, FenceTabletRequest, FinishMoveRequest, MoveSpec, ReceiveTabletRequest,
    ReleaseTabletRequest,
};
use basalt_master::model::{Tablet, TabletState};
use basalt_meta::{Meta, MovePhase, MoveRecord, Term, keys::hex};
use tonic::Request;
use tracing::{info, warn};

/// How a move ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// The destination owns the tablet (epoch + 1).
    Moved(Stats),
    /// The tablet stayed at its source; why.
    Aborted(String),
}

/// What a committed move measured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    pub bytes: u64,
    /// From the start to the commit.
    pub seconds: f64,
    /// Copy (stream, checks, ingest) at the destination.
    pub copy_seconds: f64,
    /// From the fence transaction to the commit: the window in which the tablet refused
    /// reads and writes (plus the time until the servers see the new map).
    pub fenced_seconds: f64,
}

/// One move to carry out.
#[derive(Clone, Debug)]
pub struct Move {
    pub cluster: String,
    /// The table's resource name.
    pub table_name: String,
    pub tablet: Tablet,
    pub to: String,
    pub from_address: String,
    pub to_address: String,
    /// Why ("balance", "drain").
    pub reason: String,
    /// Most snapshot bytes per second (0: unlimited).
    pub rate_limit_bytes_per_sec: u64,
}

/// How long the destination may take to copy and catch up.
const RECEIVE_TIMEOUT: Duration = Duration::from_secs(600);
/// How long each of the short steps may take.
const STEP_TIMEOUT: Duration = Duration::from_secs(15);

fn timed<T>(msg: T, timeout: Duration) -> Request<T> {
    let mut r = Request::new(msg);
    r.set_timeout(timeout);
    r
}

fn new_move_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "m{:x}-{:x}-{}",
        basalt_master::model::hlc::now_micros(),
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Carries out `m` as the master of `term`.
pub async fn run(meta: &Meta, term: &Term, dialer: &Dialer, m: &Move) -> Outcome {
    let started = Instant::now();
    let id = new_move_id();
    let record = MoveRecord {
        id: id.clone(),
        table: m.tablet.table.clone(),
        start: hex(&m.tablet.range.start),
        end: m.tablet.range.end.as_ref().map(|e| hex(e)),
        epoch: m.tablet.epoch,
        from: m.tablet.owner.clone(),
        to: m.to.clone(),
        phase: MovePhase::Copying,
        reason: m.reason.clone(),
        started_micros: basalt_master::model::hlc::now_micros(),
    };
    match meta.begin_move(term, &m.cluster, &m.tablet, &record).await {
        Ok(true) => {}
        Ok(false) => return Outcome::Aborted("the tablet changed before the move began".into()),
        Err(e) => return Outcome::Aborted(format!("etcd: {e}")),
    }
    let spec = MoveSpec::of(&id, &m.table_name, &m.tablet);
    info!(move_id = id, tablet = %m.tablet, to = m.to, reason = m.reason, "moving a tablet");
    let fenced_tablet = Tablet {
        state: TabletState::Fencing,
        ..m.tablet.clone()
    };
    let fenced_record = MoveRecord {
        phase: MovePhase::Fencing,
        ..record.clone()
    };
    let mut fenced = false;
    let result: Result<Stats, String> = async {
        let mut to = basalt_control::move_client(dialer, &m.to_address, Duration::from_secs(5))
            .map_err(|e| e.to_string())?;
        let mut from = basalt_control::move_client(dialer, &m.from_address, Duration::from_secs(5))
            .map_err(|e| e.to_string())?;
        hold("move-before-snapshot").await;
        let received = to
            .receive_tablet(timed(
                ReceiveTabletRequest {
                    r#move: Some(spec.clone()),
                    source_address: m.from_address.clone(),
                    rate_limit_bytes_per_sec: m.rate_limit_bytes_per_sec,
                },
                RECEIVE_TIMEOUT,
            ))
            .await
            .map_err(|s| format!("the destination could not copy the tablet: {}", s.message()))?
            .into_inner();
        hold("move-before-fence").await;
        if !meta
            .fence_move(term, &m.cluster, &m.tablet, &record)
            .await
            .map_err(|e| format!("etcd: {e}"))?
        {
            return Err("the tablet or the move changed before the fence".into());
        }
        fenced = true;
        let fence_started = Instant::now();
        let fence = from
            .fence_tablet(timed(
                FenceTabletRequest {
                    r#move: Some(spec.clone()),
                },
                STEP_TIMEOUT,
            ))
            .await
            .map_err(|s| format!("the source could not fence the tablet: {}", s.message()))?
            .into_inner();
        hold("move-after-fence").await;
        to.finish_move(timed(
            FinishMoveRequest {
                r#move: Some(spec.clone()),
                seq: fence.seq,
                clock: fence.clock,
            },
            STEP_TIMEOUT,
        ))
        .await
        .map_err(|s| format!("the destination could not finish: {}", s.message()))?;
        hold("move-before-commit").await;
        let moved = Tablet {
            owner: m.to.clone(),
            epoch: m.tablet.epoch + 1,
            state: TabletState::Serving,
            ..m.tablet.clone()
        };
        match meta
            .commit_move(term, &m.cluster, &fenced_tablet, &fenced_record, &moved)
            .await
        {
            Ok(true) => {}
            Ok(false) => return Err("the move was aborted before its commit".into()),
            Err(e) => {
                // Unknown: the tablet's record says whether the commit happened.
                if committed(meta, m, &moved).await {
                } else {
                    return Err(format!("etcd: {e}"));
                }
            }
        }
        Ok(Stats {
            bytes: received.bytes,
            seconds: started.elapsed().as_secs_f64(),
            copy_seconds: received.copy_seconds,
            fenced_seconds: fence_started.elapsed().as_secs_f64(),
        })
    }
    .await;
    match result {
        Ok(stats) => {
            hold("move-after-commit").await;
            info!(
                move_id = id,
                tablet = %m.tablet,
                to = m.to,
                bytes = stats.bytes,
                seconds = stats.seconds,
                copy_seconds = stats.copy_seconds,
                fenced_seconds = stats.fenced_seconds,
                "tablet moved"
            );
            release(dialer, m, &spec).await;
            Outcome::Moved(stats)
        }
        Err(why) => {
            let (current, fenced_now) = if fenced {
                (&fenced_record, Some(&fenced_tablet))
            } else {
                (&record, None)
            };
            abort(meta, term, dialer, m, &spec, current, fenced_now).await;
            warn!(move_id = id, tablet = %m.tablet, why, "tablet move aborted");
            Outcome::Aborted(why)
        }
    }
}

/// Whether the tablet's record is `moved` (the commit happened).
async fn committed(meta: &Meta, m: &Move, moved: &Tablet) -> bool {
    for _ in 0..10 {
        if let Ok((map, _)) = meta.tablets(&m.cluster).await {
            return map.tablets(&moved.table).iter().any(|t| {
                t.range == moved.range && t.owner == moved.owner && t.epoch == moved.epoch
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    false
}

/// Tells the source to delete the rows it gave away (it also does on its own when it sees the
/// new owner).
async fn release(dialer: &Dialer, m: &Move, spec: &MoveSpec) {
    if let Ok(mut from) =
        basalt_control::move_client(dialer, &m.from_address, Duration::from_secs(5))
        && let Err(s) = from
            .release_tablet(timed(
                ReleaseTabletRequest {
                    r#move: Some(spec.clone()),
                },
                STEP_TIMEOUT,
            ))
            .await
    {
        warn!(move_id = spec.move_id, error = %s.message(), "the source did not release the moved tablet yet");
    }
}

/// Aborts in etcd, then (only if that won) tells both servers.
async fn abort(
    meta: &Meta,
    term: &Term,
    dialer: &Dialer,
    m: &Move,
    spec: &MoveSpec,
    record: &MoveRecord,
    fenced: Option<&Tablet>,
) {
    let mut won = false;
    for attempt in 0..5 {
        match meta.abort_move(term, &m.cluster, record, fenced).await {
            Ok(w) => {
                won = w;
                break;
            }
            Err(e) => {
                warn!(move_id = spec.move_id, attempt, error = %e, "cannot abort the move in etcd yet");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
    if !won {
        // Committed, or aborted by another master (the servers end it on their own when they
        // see its record gone).
        return;
    }
    for address in [&m.from_address, &m.to_address] {
        if let Ok(mut c) = basalt_control::move_client(dialer, address, Duration::from_secs(5)) {
            let _ = c
                .abort_move(timed(
                    AbortMoveRequest {
                        r#move: Some(spec.clone()),
                    },
                    STEP_TIMEOUT,
                ))
                .await;
        }
    }
}

/// Aborts every move a previous master left in `cluster`: the tablet stays at its source.
/// The servers end their parts when they see the records gone.
pub async fn abort_leftovers(
    meta: &Meta,
    term: &Term,
    cluster: &str,
) -> basalt_master::model::Result<()> {
    for record in meta.moves(cluster).await? {
        let fenced = match record.phase {
            MovePhase::Copying => None,
            MovePhase::Fencing => {
                let (map, _) = meta.tablets(cluster).await?;
                let range = record.range()?;
                map.tablets(&record.table)
                    .iter()
                    .find(|t| t.range == range && t.state == TabletState::Fencing)
                    .cloned()
            }
        };
        if meta
            .abort_move(term, cluster, &record, fenced.as_ref())
            .await?
        {
            warn!(
                cluster,
                move_id = record.id,
                "aborted a move a previous master left"
            );
        }
    }
    Ok(())
}

/// The moves in progress that `records` (etcd's) describe, as the master's decisions count
/// them (in flight: the tablet at its destination). Records whose tablet is no longer in
/// `tablets` are left out.
pub fn in_flight(
    records: &[MoveRecord],
    tablets: &basalt_master::model::TabletMap,
) -> Vec<basalt_master::MovePlan> {
    records
        .iter()
        .filter_map(|m| {
            let start = m.range().ok()?.start;
            let tablet = tablets
                .tablets(&m.table)
                .iter()
                .find(|t| t.range.start == start)?;
            Some(basalt_master::MovePlan {
                tablet: tablet.clone(),
                from: m.from.clone(),
                to: m.to.clone(),
                reason: if m.reason == "drain" {
                    basalt_master::MoveReason::Drain
                } else {
                    basalt_master::MoveReason::Balance
                },
            })
        })
        .collect()
}
