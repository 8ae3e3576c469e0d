//! Carrying out one tablet move (see `docs/cluster.md`, "Tablet moves"): the etcd
//! transactions, fenced by the master's term, around the tablet servers' steps, which it asks
//! through the master's [`TabletControl`] (`GrpcTabletControl` over gRPC; a fake in the
//! tests).
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
//! outcome of 6 is unknown, the tablet's record says which won. Which step follows which
//! answer is [`basalt_master::moves::next`] (pure, unit-tested there); [`run`] carries the
//! steps out.

use std::future::Future;
use std::time::{Duration, Instant};

use basalt_control::failpoints::hold;
use basalt_master::model::{Tablet, TabletState};
use basalt_master::moves::{Answer, Fenced, Step, next};
use basalt_master::{Fence, MoveSpec, Received, StepError, TabletControl};
use basalt_meta::{Meta, MovePhase, MoveRecord, Term, keys::hex};
use tracing::{debug, info, warn};

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
pub const RECEIVE_TIMEOUT: Duration = Duration::from_secs(600);
/// How long each of the short steps may take.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(15);
/// How long past a step's deadline the driver still waits for its answer: the server and the
/// [`TabletControl`] give up at the deadline and say so; this only bounds one that does not.
pub const BACKSTOP: Duration = Duration::from_secs(1);
/// The wait between two attempts at a transaction etcd did not answer.
const RETRY: Duration = Duration::from_millis(500);

/// The servers' deadlines of a move's steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadlines {
    /// ReceiveTablet: copy and catch up.
    pub receive: Duration,
    /// FenceTablet, FinishMove, ReleaseTablet, AbortMove.
    pub step: Duration,
}

impl Default for Deadlines {
    fn default() -> Self {
        Deadlines {
            receive: RECEIVE_TIMEOUT,
            step: STEP_TIMEOUT,
        }
    }
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

/// A server's step within `deadline` (and [`BACKSTOP`]): no answer by then is an unknown
/// outcome.
async fn within<T>(
    deadline: Duration,
    call: impl Future<Output = Result<T, StepError>>,
) -> Result<T, StepError> {
    match tokio::time::timeout(deadline + BACKSTOP, call).await {
        Ok(answer) => answer,
        Err(_) => Err(StepError::Unknown(format!("no answer within {deadline:?}"))),
    }
}

/// What an etcd transaction of the move came to.
fn written(result: basalt_master::model::Result<bool>) -> Answer {
    match result {
        Ok(true) => Answer::Done,
        Ok(false) => Answer::Refused("the records changed".into()),
        Err(e) => Answer::Unknown(e.to_string()),
    }
}

/// Carries out `m` as the master of `term`, with the default [`Deadlines`].
pub async fn run<C: TabletControl>(meta: &Meta, term: &Term, control: &C, m: &Move) -> Outcome {
    run_with(meta, term, control, m, Deadlines::default()).await
}

/// Carries out `m` as the master of `term`, the servers' steps within `deadlines`.
pub async fn run_with<C: TabletControl>(
    meta: &Meta,
    term: &Term,
    control: &C,
    m: &Move,
    deadlines: Deadlines,
) -> Outcome {
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
    let spec = MoveSpec {
        id: id.clone(),
        table_name: m.table_name.clone(),
        tablet: m.tablet.clone(),
    };
    let fenced_tablet = Tablet {
        state: TabletState::Fencing,
        ..m.tablet.clone()
    };
    let fenced_record = MoveRecord {
        phase: MovePhase::Fencing,
        ..record.clone()
    };
    let moved = Tablet {
        owner: m.to.clone(),
        epoch: m.tablet.epoch + 1,
        state: TabletState::Serving,
        ..m.tablet.clone()
    };
    let mut received = Received::default();
    let mut fence = Fence::default();
    let mut fence_started = started;
    let mut stats = Stats::default();
    let mut attempts = 0u32;
    let mut step = Step::Begin;
    loop {
        let answer = match &step {
            Step::Begin => {
                let answer = written(meta.begin_move(term, &m.cluster, &m.tablet, &record).await);
                if answer == Answer::Done {
                    info!(
                        move_id = id,
                        tablet = %m.tablet,
                        to = m.to,
                        reason = m.reason,
                        "moving a tablet"
                    );
                }
                answer
            }
            Step::Receive => {
                hold("move-before-snapshot").await;
                let call = control.receive_tablet(
                    &m.to_address,
                    &spec,
                    &m.from_address,
                    m.rate_limit_bytes_per_sec,
                    deadlines.receive,
                );
                match within(deadlines.receive, call).await {
                    Ok(r) => {
                        received = r;
                        Answer::Done
                    }
                    Err(e) => e.into(),
                }
            }
            Step::Fence => {
                hold("move-before-fence").await;
                written(meta.fence_move(term, &m.cluster, &m.tablet, &record).await)
            }
            Step::FenceSource => {
                fence_started = Instant::now();
                let call = control.fence_tablet(&m.from_address, &spec, deadlines.step);
                match within(deadlines.step, call).await {
                    Ok(f) => {
                        fence = f;
                        Answer::Done
                    }
                    Err(e) => e.into(),
                }
            }
            Step::Finish => {
                hold("move-after-fence").await;
                let call = control.finish_move(&m.to_address, &spec, fence, deadlines.step);
                within(deadlines.step, call)
                    .await
                    .map_or_else(Answer::from, |()| Answer::Done)
            }
            Step::Commit => {
                hold("move-before-commit").await;
                written(
                    meta.commit_move(term, &m.cluster, &fenced_tablet, &fenced_record, &moved)
                        .await,
                )
            }
            Step::ReadBack { .. } => committed(meta, m, &moved).await,
            Step::Release => {
                stats = Stats {
                    bytes: received.bytes,
                    seconds: started.elapsed().as_secs_f64(),
                    copy_seconds: received.copy_seconds,
                    fenced_seconds: fence_started.elapsed().as_secs_f64(),
                };
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
                release(control, m, &spec, deadlines).await
            }
            Step::Abort { fenced, .. } => {
                let answer = match fenced {
                    Fenced::No | Fenced::Maybe => {
                        written(meta.abort_move(term, &m.cluster, &record, None).await)
                    }
                    Fenced::Yes => written(
                        meta.abort_move(term, &m.cluster, &fenced_record, Some(&fenced_tablet))
                            .await,
                    ),
                };
                if let Answer::Unknown(e) = &answer {
                    // Tried until etcd answers (its term makes a stale master's attempt fail):
                    // given up, the tablet could stay fenced until the next master's term.
                    if attempts < 5 || attempts.is_multiple_of(20) {
                        warn!(
                            move_id = id,
                            attempt = attempts,
                            error = %e,
                            "cannot abort the move in etcd yet"
                        );
                    }
                    attempts += 1;
                    tokio::time::sleep(RETRY).await;
                }
                answer
            }
            Step::TellAbort { .. } => {
                abort(control, m, &spec, deadlines).await;
                Answer::Done
            }
            Step::Moved => return Outcome::Moved(stats),
            Step::Aborted(why) => {
                warn!(move_id = id, tablet = %m.tablet, why, "tablet move aborted");
                return Outcome::Aborted(why.clone());
            }
        };
        debug!(move_id = id, ?step, ?answer, "move step");
        step = next(step, answer);
    }
}

/// Whether the tablet's record is `moved` (the commit happened): Done if so, Refused if it
/// is not, Unknown if etcd could not be read.
async fn committed(meta: &Meta, m: &Move, moved: &Tablet) -> Answer {
    let mut error = String::new();
    for _ in 0..10 {
        match meta.tablets(&m.cluster).await {
            Ok((map, _)) => {
                let is = map.tablets(&moved.table).iter().any(|t| {
                    t.range == moved.range && t.owner == moved.owner && t.epoch == moved.epoch
                });
                return if is {
                    Answer::Done
                } else {
                    Answer::Refused("not committed".into())
                };
            }
            Err(e) => error = e.to_string(),
        }
        tokio::time::sleep(RETRY).await;
    }
    Answer::Unknown(error)
}

/// Tells the source to delete the rows it gave away (it also does on its own when it sees the
/// new owner): the move committed, whatever it answers.
async fn release<C: TabletControl>(
    control: &C,
    m: &Move,
    spec: &MoveSpec,
    deadlines: Deadlines,
) -> Answer {
    let call = control.release_tablet(&m.from_address, spec, deadlines.step);
    match within(deadlines.step, call).await {
        Ok(()) => Answer::Done,
        Err(e) => {
            warn!(move_id = spec.id, error = %e, "the source did not release the moved tablet yet");
            e.into()
        }
    }
}

/// Tells both servers, once the abort won in etcd, to drop their parts: the source unfences
/// and stops capturing, the destination drops its copy (each also does on its own when it
/// sees the record gone).
async fn abort<C: TabletControl>(control: &C, m: &Move, spec: &MoveSpec, deadlines: Deadlines) {
    for address in [&m.from_address, &m.to_address] {
        let call = control.abort_move(address, spec, deadlines.step);
        if let Err(e) = within(deadlines.step, call).await {
            debug!(move_id = spec.id, address, error = %e, "a server did not take the abort");
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
