//! One tablet move as the master drives it (`docs/cluster.md`, "Tablet moves"): what it asks
//! of the two servers through [`TabletControl`](crate::TabletControl) ([`MoveSpec`],
//! [`Received`], [`Fence`], [`StepError`]) and the order of its steps ([`Step`], [`next`]).
//!
//! [`next`] is the move's whole decision logic — which step follows what the last one came
//! to — as a pure function: every failure's consequence (abort or not, with which records,
//! whether the servers are told) is unit-tested here without etcd or servers. The operator's
//! driver (`operator/src/master/moves.rs`) carries each step out (etcd transactions fenced
//! by the master's term, calls to the servers within their deadlines) and feeds the answer
//! back.
//!
//! The rules it encodes:
//! * nothing is undone before the abort has won in etcd, and the servers are told to drop
//!   their parts only once it has — so a destination never deletes the rows of a move that
//!   committed;
//! * an etcd write whose answer was lost may have happened: the fence is then aborted as
//!   either (the record as it was, else as fenced), and the commit is read back;
//! * once the commit is written the tablet has moved, whatever the release answers;
//! * an abort that etcd does not answer is tried again: given up, it would leave a fenced
//!   tablet that nobody serves until the next master's term.

use basalt_model::Tablet;

/// The tablet a move is about, as both servers are told.
#[derive(Clone, Debug, PartialEq)]
pub struct MoveSpec {
    /// The move's id (its record in etcd: `clusters/<c>/moves/<id>`).
    pub id: String,
    /// The table's resource name (`projects/P/instances/I/tables/T`).
    pub table_name: String,
    /// The tablet as the source owns it (its range and epoch identify it).
    pub tablet: Tablet,
}

/// What the destination answers once it has copied the tablet and caught up.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Received {
    /// Bytes of the snapshot.
    pub bytes: u64,
    /// How long the copy took (stream, checks, ingest).
    pub copy_seconds: f64,
}

/// What the source answers once it has fenced the tablet: the destination must apply
/// through `seq` and take `clock` over before the move commits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fence {
    /// Every write the source accepted into the tablet is in its capture at or below this
    /// sequence.
    pub seq: u64,
    /// The source's clock: every version it gave is below it.
    pub clock: u64,
}

/// Why a server's step of a move did not succeed. The two cases differ in what they claim,
/// not in what the driver does (it aborts on both: an abort is safe whatever the server did);
/// the difference shows in the move's reason.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StepError {
    /// The server answered that it did not do the step (the tablet is not as the move says,
    /// a check failed, …), or the call never left (no such address).
    #[error("{0}")]
    Failed(String),
    /// No answer: the deadline passed or the connection broke after the call left. The step
    /// may have happened or not.
    #[error("{0} (outcome unknown)")]
    Unknown(String),
}

/// What a step came to, as [`next`] reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Done: the transaction was written, the server did it, the commit is in the tablet's
    /// record.
    Done,
    /// Not done, for sure: etcd refused (a record is not as the transaction compared it), the
    /// server answered an error, the tablet's record shows no commit.
    Refused(String),
    /// Nobody can tell: etcd or the server did not answer.
    Unknown(String),
}

impl From<StepError> for Answer {
    fn from(e: StepError) -> Answer {
        match e {
            StepError::Failed(why) => Answer::Refused(why),
            StepError::Unknown(_) => Answer::Unknown(e.to_string()),
        }
    }
}

/// Which records an abort in etcd compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fenced {
    /// The move's record as begun (phase Copying); the tablet untouched.
    No,
    /// The move's record as fenced and the tablet as fenced (it goes back to Serving).
    Yes,
    /// The fence's answer was lost: as begun first, then (refused) as fenced.
    Maybe,
}

/// Where a move stands: the step to take next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// etcd: the move's record (phase Copying), if the tablet is still as planned.
    Begin,
    /// The destination copies the tablet and catches up (ReceiveTablet).
    Receive,
    /// etcd: the tablet's state Fencing and the move's phase Fencing (nobody serves the
    /// tablet from here on, also after a restart of its owner).
    Fence,
    /// The source fences the tablet (FenceTablet): its last sequence and clock.
    FenceSource,
    /// The destination applies through the fence and takes the clock over (FinishMove).
    Finish,
    /// etcd: owner → destination, epoch + 1, Serving; the move's record deleted.
    Commit,
    /// The commit's answer was lost: the tablet's record says whether it happened. `why`: the
    /// reason if it did not.
    ReadBack { why: String },
    /// The source deletes the rows it gave away (ReleaseTablet). The move committed: a
    /// failure changes nothing (the source also releases on its own when it sees the new
    /// owner).
    Release,
    /// etcd: the move's record deleted (and a fenced tablet back to Serving at its owner).
    Abort { fenced: Fenced, why: String },
    /// The abort won: both servers drop their parts (AbortMove: the source unfences and
    /// stops capturing, the destination drops its copy). Their failure changes nothing
    /// (they also end a move on their own when they see its record gone).
    TellAbort { why: String },
    /// Ended: the destination owns the tablet at epoch + 1.
    Moved,
    /// Ended: the tablet stayed at its source; why.
    Aborted(String),
}

impl Step {
    /// Whether the move has ended.
    pub fn ended(&self) -> bool {
        matches!(self, Step::Moved | Step::Aborted(_))
    }
}

/// The step after `step`, given what it came to. Pure.
pub fn next(step: Step, answer: Answer) -> Step {
    use Answer::{Done, Refused, Unknown};
    let abort = |fenced, why: String| Step::Abort { fenced, why };
    match (step, answer) {
        (Step::Begin, Done) => Step::Receive,
        // Nothing was written: nothing to undo, nobody to tell.
        (Step::Begin, Refused(_)) => {
            Step::Aborted("the tablet changed before the move began".into())
        }
        // The record may have been written: delete it if it was.
        (Step::Begin, Unknown(e)) => abort(Fenced::No, format!("etcd: {e}")),

        (Step::Receive, Done) => Step::Fence,
        (Step::Receive, Refused(e) | Unknown(e)) => abort(
            Fenced::No,
            format!("the destination could not copy the tablet: {e}"),
        ),

        (Step::Fence, Done) => Step::FenceSource,
        (Step::Fence, Refused(_)) => abort(
            Fenced::No,
            "the tablet or the move changed before the fence".into(),
        ),
        (Step::Fence, Unknown(e)) => abort(Fenced::Maybe, format!("etcd: {e}")),

        (Step::FenceSource, Done) => Step::Finish,
        (Step::FenceSource, Refused(e) | Unknown(e)) => abort(
            Fenced::Yes,
            format!("the source could not fence the tablet: {e}"),
        ),

        (Step::Finish, Done) => Step::Commit,
        (Step::Finish, Refused(e) | Unknown(e)) => abort(
            Fenced::Yes,
            format!("the destination could not finish: {e}"),
        ),

        (Step::Commit, Done) => Step::Release,
        // Another master aborted it (or its term ended): the abort below finds the records
        // changed and tells nobody.
        (Step::Commit, Refused(_)) => {
            abort(Fenced::Yes, "the move was aborted before its commit".into())
        }
        (Step::Commit, Unknown(e)) => Step::ReadBack {
            why: format!("etcd: {e}"),
        },

        (Step::ReadBack { .. }, Done) => Step::Release,
        // Not committed, or unreadable: the abort compares the records as fenced, so it
        // cannot undo a commit that did happen.
        (Step::ReadBack { why }, Refused(_) | Unknown(_)) => abort(Fenced::Yes, why),

        (Step::Release, _) => Step::Moved,

        (Step::Abort { why, .. }, Done) => Step::TellAbort { why },
        (
            Step::Abort {
                fenced: Fenced::Maybe,
                why,
            },
            Refused(_),
        ) => abort(Fenced::Yes, why),
        // The move committed, or another master aborted it: the servers end their parts
        // when they see its record gone.
        (Step::Abort { why, .. }, Refused(_)) => Step::Aborted(why),
        (Step::Abort { fenced, why }, Unknown(_)) => abort(fenced, why),

        (Step::TellAbort { why }, _) => Step::Aborted(why),

        (ended @ (Step::Moved | Step::Aborted(_)), _) => ended,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done() -> Answer {
        Answer::Done
    }
    fn refused() -> Answer {
        Answer::Refused("no".into())
    }
    fn unknown() -> Answer {
        Answer::Unknown("lost".into())
    }

    /// The steps a move takes when its steps answer `answers` in turn (the first is Begin's),
    /// up to its end.
    fn walk(answers: impl IntoIterator<Item = Answer>) -> Vec<Step> {
        let mut step = Step::Begin;
        let mut steps = vec![step.clone()];
        for answer in answers {
            step = next(step, answer);
            steps.push(step.clone());
            if step.ended() {
                break;
            }
        }
        steps
    }

    fn abort(fenced: Fenced, why: &str) -> Step {
        Step::Abort {
            fenced,
            why: why.into(),
        }
    }

    fn tell(why: &str) -> Step {
        Step::TellAbort { why: why.into() }
    }

    #[test]
    fn a_move_without_failures_commits_then_releases() {
        use Step::*;
        assert_eq!(
            walk(std::iter::repeat_n(done(), 7)),
            [
                Begin,
                Receive,
                Fence,
                FenceSource,
                Finish,
                Commit,
                Release,
                Moved
            ]
        );
    }

    #[test]
    fn a_failed_release_does_not_undo_the_commit() {
        for release in [refused(), unknown()] {
            assert_eq!(next(Step::Release, release), Step::Moved);
        }
    }

    #[test]
    fn each_servers_step_that_fails_aborts_with_the_records_as_they_stand() {
        let copy = "the destination could not copy the tablet";
        let fence = "the source could not fence the tablet";
        let finish = "the destination could not finish";
        // Before the fence the records are as begun; after it, as fenced. Failed or unknown,
        // the same abort.
        for (step, fenced, why) in [
            (Step::Receive, Fenced::No, copy),
            (Step::FenceSource, Fenced::Yes, fence),
            (Step::Finish, Fenced::Yes, finish),
        ] {
            assert_eq!(
                next(step.clone(), refused()),
                abort(fenced, &format!("{why}: no"))
            );
            assert_eq!(
                next(step.clone(), unknown()),
                abort(fenced, &format!("{why}: lost"))
            );
        }
        // A server's unknown outcome says so in the reason.
        assert_eq!(
            next(Step::Receive, StepError::Unknown("deadline".into()).into()),
            abort(Fenced::No, &format!("{copy}: deadline (outcome unknown)"))
        );
        assert_eq!(
            next(Step::Receive, StepError::Failed("checksum".into()).into()),
            abort(Fenced::No, &format!("{copy}: checksum"))
        );
    }

    #[test]
    fn the_servers_are_told_only_once_the_abort_won() {
        use Step::*;
        // The copy fails; the abort wins: both servers are told, then it ends.
        let why = "the destination could not copy the tablet: no";
        assert_eq!(
            walk([done(), refused(), done(), done()]),
            [
                Begin,
                Receive,
                abort(Fenced::No, why),
                tell(why),
                Aborted(why.into())
            ]
        );
        // The abort loses (the move committed, or another master aborted it): nobody is told.
        assert_eq!(
            walk([done(), refused(), refused()]),
            [Begin, Receive, abort(Fenced::No, why), Aborted(why.into())]
        );
        // Whatever the servers answer, it ends.
        for told in [done(), refused(), unknown()] {
            assert_eq!(next(tell(why), told), Aborted(why.into()));
        }
    }

    #[test]
    fn an_abort_etcd_does_not_answer_is_tried_again() {
        for fenced in [Fenced::No, Fenced::Yes, Fenced::Maybe] {
            assert_eq!(next(abort(fenced, "x"), unknown()), abort(fenced, "x"));
        }
    }

    #[test]
    fn a_move_etcd_refuses_to_begin_ends_without_an_abort() {
        assert_eq!(
            walk([refused()]),
            [
                Step::Begin,
                Step::Aborted("the tablet changed before the move began".into())
            ]
        );
    }

    #[test]
    fn a_begin_whose_answer_was_lost_is_aborted_in_case_it_was_written() {
        assert_eq!(
            next(Step::Begin, unknown()),
            abort(Fenced::No, "etcd: lost")
        );
    }

    #[test]
    fn a_fence_whose_answer_was_lost_is_aborted_as_either() {
        // Refused: the records changed under the move (not fenced by it).
        assert_eq!(
            next(Step::Fence, refused()),
            abort(
                Fenced::No,
                "the tablet or the move changed before the fence"
            )
        );
        // Unknown: as begun first; refused so, as fenced.
        let maybe = next(Step::Fence, unknown());
        assert_eq!(maybe, abort(Fenced::Maybe, "etcd: lost"));
        assert_eq!(
            next(maybe.clone(), refused()),
            abort(Fenced::Yes, "etcd: lost")
        );
        assert_eq!(next(maybe, done()), tell("etcd: lost"));
        assert_eq!(
            next(abort(Fenced::Yes, "etcd: lost"), refused()),
            Step::Aborted("etcd: lost".into())
        );
    }

    #[test]
    fn a_commit_whose_answer_was_lost_is_read_back() {
        let read_back = next(Step::Commit, unknown());
        assert_eq!(
            read_back,
            Step::ReadBack {
                why: "etcd: lost".into()
            }
        );
        // Committed: released as after any commit.
        assert_eq!(next(read_back.clone(), done()), Step::Release);
        // Not committed, or unreadable: aborted as fenced (which cannot undo a commit).
        for answer in [refused(), unknown()] {
            assert_eq!(
                next(read_back.clone(), answer),
                abort(Fenced::Yes, "etcd: lost")
            );
        }
    }

    #[test]
    fn a_commit_refused_was_aborted_by_someone_else() {
        use Step::*;
        let why = "the move was aborted before its commit";
        assert_eq!(
            walk([done(), done(), done(), done(), done(), refused(), refused()]),
            [
                Begin,
                Receive,
                Fence,
                FenceSource,
                Finish,
                Commit,
                abort(Fenced::Yes, why),
                Aborted(why.into())
            ]
        );
    }

    #[test]
    fn an_ended_move_stays_ended() {
        for end in [Step::Moved, Step::Aborted("x".into())] {
            assert!(end.ended());
            assert_eq!(next(end.clone(), done()), end);
        }
        assert!(!Step::Release.ended());
    }
}
