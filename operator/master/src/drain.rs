//! Scale-in: emptying the servers that leave before the cluster shrinks.
//!
//! Lowering a cluster's server count to `serve_nodes` removes the highest ordinals
//! ([`crate::NodeRuntime::set_servers`]), and each server's tablets live on its own volume, so
//! the leaving servers (ordinal ≥ `serve_nodes`) first hand every tablet to a remaining one.
//! The runtime shrinks the StatefulSet only once [`DrainPlan::done`]: the leaving servers own no
//! tablet and none moves to or from them — never on a label or a guess (scylla-operator#3539
//! deleted a volume with data that way).
//!
//! A drain that cannot finish says so instead of retrying forever (cockroach#18029):
//! [`DrainBlocked`] names the reason — a leaving server that is down or holds a Lost tablet (its
//! data cannot be copied off), no ready server to receive, or not enough room on the remaining
//! volumes — and no move starts while it is blocked, so nothing is half done when the user
//! cancels. Cancelling is the runtime's job: raising the count back makes the leaving set empty,
//! and the plan with it (scylla-operator#1189, tidb-operator#4644).
//!
//! Moves go to the least loaded remaining server by [`crate::balance`]'s score, under the same
//! per-server and per-cluster limits, moves in flight counted. Cool-downs do not hold a drain
//! back: a tablet leaving a server that receives nothing cannot oscillate.

use std::collections::{BTreeSet, HashMap, HashSet};

use basalt_model::{ServerId, Tablet, TabletState};

use crate::balance::{Ledger, Role};
use crate::{BalanceContext, BalancePolicy, ClusterView, MovePlan, ServerState, TabletKey, key_of};

/// What a scale-in to `serve_nodes` servers needs now.
#[derive(Clone, Debug, PartialEq)]
pub struct DrainPlan {
    /// The leaving servers (ordinal ≥ `serve_nodes`), in ordinal order; empty when no server
    /// leaves (e.g. the count was raised back: the drain is cancelled).
    pub draining: Vec<ServerId>,
    /// The moves to start now (reason [`crate::MoveReason::Drain`]).
    pub moves: Vec<MovePlan>,
    /// Tablets the leaving servers still own, or that move to or from them.
    pub remaining_tablets: usize,
    /// Why the drain cannot go on; no move is planned meanwhile.
    pub blocked: Option<DrainBlocked>,
    /// The leaving servers own no tablet and none is moving to or from them: the cluster may
    /// shrink.
    pub done: bool,
}

/// Why a drain cannot go on, in a sentence for the user (numbers with their units).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct DrainBlocked {
    pub reason: String,
}

/// The plan for draining the servers of ordinal `serve_nodes` and above. Servers in
/// `ctx.draining` (e.g. another intent) receive nothing either.
pub fn drain(
    view: &ClusterView,
    serve_nodes: u32,
    ctx: &BalanceContext,
    policy: &BalancePolicy,
) -> DrainPlan {
    let leaving: Vec<&ServerState> = view
        .servers_by_ordinal()
        .into_iter()
        .filter(|s| s.ordinal >= serve_nodes)
        .collect();
    let owned = owned_by(view, &leaving);
    let remaining = remaining(ctx, &leaving, &owned);
    let mut plan = DrainPlan {
        draining: leaving.iter().map(|s| s.id.clone()).collect(),
        moves: Vec::new(),
        remaining_tablets: remaining.len(),
        blocked: None,
        done: remaining.is_empty(),
    };
    if plan.done {
        return plan;
    }
    let receivers: Vec<&ServerState> = view
        .servers_by_ordinal()
        .into_iter()
        .filter(|s| s.ordinal < serve_nodes && s.ready && !ctx.draining.contains(&s.id))
        .collect();
    let to_move = Departure {
        view,
        leaving: &leaving,
        owned: &owned,
        tablets: &remaining,
        serve_nodes,
    };
    plan.blocked = to_move
        .unreachable()
        .or_else(|| to_move.nobody_to_receive(&receivers))
        .or_else(|| to_move.no_room(&receivers, policy));
    if plan.blocked.is_none() {
        let receiving: HashSet<&str> = receivers.iter().map(|r| r.id.as_str()).collect();
        let mut ledger = Ledger::new(view, ctx, policy, |s| {
            if s.ordinal >= serve_nodes {
                Some(Role::Leaving)
            } else {
                receiving.contains(s.id.as_str()).then_some(Role::Member)
            }
        });
        ledger.plan_drain();
        plan.moves = ledger.into_plans();
    }
    plan
}

/// The tablets each leaving server owns, found in one walk of the map (not one per server:
/// a tenth of a thousand servers leaving must not mean a hundred walks of a million tablets).
fn owned_by<'a>(
    view: &'a ClusterView,
    leaving: &[&ServerState],
) -> HashMap<&'a str, Vec<&'a Tablet>> {
    let mut owned: HashMap<&str, Vec<&Tablet>> = HashMap::new();
    if leaving.is_empty() {
        return owned;
    }
    let leaves: HashSet<&str> = leaving.iter().map(|s| s.id.as_str()).collect();
    for table in view.tablets.tables() {
        for t in view.tablets.tablets(table) {
            if leaves.contains(t.owner.as_str()) {
                owned.entry(t.owner.as_str()).or_default().push(t);
            }
        }
    }
    owned
}

/// The tablets still tied to a leaving server: owned by one, or moving to or from one.
fn remaining(
    ctx: &BalanceContext,
    leaving: &[&ServerState],
    owned: &HashMap<&str, Vec<&Tablet>>,
) -> BTreeSet<TabletKey> {
    let leaves = |id: &str| leaving.iter().any(|s| s.id == id);
    let mut keys: BTreeSet<TabletKey> = owned.values().flatten().map(|t| key_of(t)).collect();
    for m in &ctx.in_flight {
        if leaves(&m.from) || leaves(&m.to) {
            keys.insert(key_of(&m.tablet));
        }
    }
    keys
}

/// What leaves: the servers and their tablets, for the pre-checks.
struct Departure<'a> {
    view: &'a ClusterView,
    leaving: &'a [&'a ServerState],
    /// What each leaving server owns.
    owned: &'a HashMap<&'a str, Vec<&'a Tablet>>,
    tablets: &'a BTreeSet<TabletKey>,
    serve_nodes: u32,
}

impl Departure<'_> {
    /// A leaving server whose data cannot be copied off: a Lost tablet (its data is gone), or
    /// the server is not ready (only a running server streams its tablets).
    fn unreachable(&self) -> Option<DrainBlocked> {
        for s in self.leaving {
            let owned: &[&Tablet] = self.owned.get(s.id.as_str()).map_or(&[], Vec::as_slice);
            if let Some(t) = owned.iter().find(|t| t.state == TabletState::Lost) {
                return blocked(format!(
                    "cannot drain {}: its tablet {t} is lost (its data is gone), so it cannot be \
                     copied to another server; restore it or accept the loss, or cancel the \
                     scale-in",
                    s.id
                ));
            }
            let owned = owned.len();
            if !s.ready && owned > 0 {
                return blocked(format!(
                    "cannot drain {}: it is not ready, and {} can only be copied off a running \
                     server; the drain goes on once it is ready again, or cancel the scale-in",
                    s.id,
                    count(owned, "tablet")
                ));
            }
        }
        None
    }

    /// No ready server would receive.
    fn nobody_to_receive(&self, receivers: &[&ServerState]) -> Option<DrainBlocked> {
        if !receivers.is_empty() {
            return None;
        }
        let staying = self
            .view
            .servers
            .values()
            .filter(|s| s.ordinal < self.serve_nodes)
            .count();
        let why = if staying == 0 {
            format!(
                "no server would remain (the count asked for is {})",
                self.serve_nodes
            )
        } else {
            format!(
                "none of the {} that remain is ready",
                count(staying, "server")
            )
        };
        blocked(format!(
            "cannot drain {}: {why} to take {}; start the remaining servers or cancel the \
             scale-in",
            self.names(),
            count(self.tablets.len(), "tablet")
        ))
    }

    /// The remaining ready servers cannot hold the leaving tablets' bytes and keep their
    /// headroom free. Unknown capacities (no volume limit) never block.
    fn no_room(&self, receivers: &[&ServerState], policy: &BalancePolicy) -> Option<DrainBlocked> {
        let mut free = 0u64;
        for s in receivers {
            // `?`: a volume without a known limit can take anything, so nothing to check.
            let usable = s.capacity_bytes? as f64 * (1.0 - policy.headroom);
            free = free.saturating_add((usable - s.stored_bytes as f64).max(0.0) as u64);
        }
        let need: u64 = self
            .tablets
            .iter()
            .filter_map(|key| self.view.loads.get(key))
            .map(|l| l.bytes)
            .fold(0, u64::saturating_add);
        if need <= free {
            return None;
        }
        let (their, hold) = match (self.leaving.len(), self.tablets.len()) {
            (1, 1) => ("its", "holds"),
            (1, _) => ("its", "hold"),
            (_, 1) => ("their", "holds"),
            _ => ("their", "hold"),
        };
        blocked(format!(
            "cannot drain {}: {their} {} {hold} {}, but the {} that remain have only {} free \
             while keeping {:.0} % of each volume free; give the remaining servers more room \
             (bigger volumes, less data) or cancel the scale-in",
            self.names(),
            count(self.tablets.len(), "tablet"),
            human_bytes(need),
            count(receivers.len(), "ready server"),
            human_bytes(free),
            policy.headroom * 100.0
        ))
    }

    /// "s3", "s3 and s4", "s3, s4 and s5".
    fn names(&self) -> String {
        let ids: Vec<&str> = self.leaving.iter().map(|s| s.id.as_str()).collect();
        match ids.split_last() {
            None => String::new(),
            Some((last, [])) => last.to_string(),
            Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
        }
    }
}

fn blocked(reason: String) -> Option<DrainBlocked> {
    Some(DrainBlocked { reason })
}

/// "1 tablet", "3 tablets".
fn count(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// Bytes for people: "512 bytes", "1.5 GiB".
fn human_bytes(bytes: u64) -> String {
    if bytes < 1024 {
        return format!("{bytes} bytes");
    }
    let mut value = bytes as f64;
    let mut unit = "";
    for u in ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"] {
        value /= 1024.0;
        unit = u;
        if value < 1024.0 {
            break;
        }
    }
    format!("{value:.1} {unit}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MoveReason;
    use crate::fixture::{ViewBuilder, apply_moves};

    const GIB: u64 = 1 << 30;

    /// Tablets per server, in ordinal order.
    fn counts(view: &ClusterView) -> Vec<usize> {
        view.servers_by_ordinal()
            .iter()
            .map(|s| view.server_load(&s.id).tablets)
            .collect()
    }

    /// Five servers, table "t" of 10 tablets spread 2 per server.
    fn five() -> ClusterView {
        ViewBuilder::new("c1")
            .servers(5)
            .table(
                "t",
                &["b", "c", "d", "e", "f", "g", "h", "i", "j"],
                &[0, 1, 2, 3, 4, 0, 1, 2, 3, 4],
            )
            .build()
    }

    #[test]
    fn leaving_servers_are_emptied_then_done() {
        let policy = BalancePolicy::default();
        let mut view = five();
        let first = drain(&view, 3, &BalanceContext::default(), &policy);
        assert_eq!(first.draining, ["s3", "s4"]);
        assert_eq!(first.remaining_tablets, 4);
        assert_eq!((first.blocked.clone(), first.done), (None, false));
        let pairs: Vec<(&str, &str)> = first
            .moves
            .iter()
            .map(|m| (m.from.as_str(), m.to.as_str()))
            .collect();
        assert_eq!(pairs, [("s3", "s0"), ("s4", "s1")]);
        assert!(first.moves.iter().all(|m| m.reason == MoveReason::Drain));
        // Apply pass after pass: never to a leaving server, within the limits, then done.
        for _ in 0..10 {
            let plan = drain(&view, 3, &BalanceContext::default(), &policy);
            if plan.done {
                assert!(plan.moves.is_empty());
                assert_eq!(plan.remaining_tablets, 0);
                break;
            }
            assert!(!plan.moves.is_empty() && plan.moves.len() <= 2);
            assert!(plan.moves.iter().all(|m| m.to != "s3" && m.to != "s4"));
            view = apply_moves(&view, &plan.moves);
        }
        assert_eq!(counts(&view), [4, 3, 3, 0, 0]);
    }

    #[test]
    fn moves_in_flight_are_counted_and_keep_the_drain_open() {
        let view = five();
        let policy = BalancePolicy::default();
        let first = drain(&view, 3, &BalanceContext::default(), &policy);
        let ctx = BalanceContext {
            in_flight: first.moves.clone(),
            ..BalanceContext::default()
        };
        // Both moves still run: the cluster's limit is used up, nothing new.
        let plan = drain(&view, 3, &ctx, &policy);
        assert!(plan.moves.is_empty());
        assert_eq!(plan.remaining_tablets, 4);
        // Committed (the records name the new owners) but still reported running: not done.
        let committed = apply_moves(&view, &first.moves);
        let plan = drain(&committed, 3, &ctx, &policy);
        assert_eq!((plan.remaining_tablets, plan.done), (4, false));
        // With looser limits: the running tablets count at s0 and s1 (3 each), so the next
        // goes to s2, then to s0 (3/3/3, lowest ordinal); the running ones are not planned
        // again.
        let wide = BalancePolicy {
            max_moves_per_cluster: 4,
            max_moves_per_server: 2,
            ..policy
        };
        let plan = drain(&view, 3, &ctx, &wide);
        let moves: Vec<(&[u8], &str)> = plan
            .moves
            .iter()
            .map(|m| (m.tablet.range.start.as_ref(), m.to.as_str()))
            .collect();
        assert_eq!(moves, [(&b"i"[..], "s2"), (&b"j"[..], "s0")], "{plan:?}");
        // A move towards a leaving server keeps it open too.
        let view = five();
        let inbound = MovePlan {
            tablet: view.tablets.tablets("t")[0].clone(),
            from: "s0".into(),
            to: "s4".into(),
            reason: MoveReason::Balance,
        };
        let ctx = BalanceContext {
            in_flight: vec![inbound],
            ..BalanceContext::default()
        };
        assert_eq!(drain(&view, 4, &ctx, &policy).remaining_tablets, 3);
    }

    #[test]
    fn scaling_back_up_mid_drain_cancels_it() {
        // Scale 5 → 3 started: two moves run. The count goes back to 5 (or above).
        let view = five();
        let policy = BalancePolicy::default();
        let started = drain(&view, 3, &BalanceContext::default(), &policy);
        let ctx = BalanceContext {
            in_flight: started.moves,
            ..BalanceContext::default()
        };
        for serve_nodes in [5, 7] {
            let plan = drain(&view, serve_nodes, &ctx, &policy);
            assert!(plan.draining.is_empty() && plan.moves.is_empty());
            assert_eq!(
                (plan.remaining_tablets, plan.blocked, plan.done),
                (0, None, true)
            );
        }
    }

    /// 4 servers of 100 GiB, each holding 60 GiB in two 30 GiB tablets.
    fn crowded() -> ClusterView {
        let mut b = ViewBuilder::new("c1").servers(4).table(
            "t",
            &["b", "c", "d", "e", "f", "g", "h"],
            &[0, 1, 2, 3, 0, 1, 2, 3],
        );
        for (i, start) in ["", "b", "c", "d", "e", "f", "g", "h"]
            .into_iter()
            .enumerate()
        {
            b = b
                .load("t", start, 30 * GIB, 1.0)
                .stored(i as u32 % 4, 60 * GIB);
        }
        b.build()
    }

    #[test]
    fn no_room_blocks_the_drain_with_the_reason() {
        // cockroach#18029: scale 4 → 2. The two remaining may fill to 80 GiB: 40 GiB free for
        // 120 GiB. Blocked from the start, nothing moves.
        let view = crowded();
        let plan = drain(
            &view,
            2,
            &BalanceContext::default(),
            &BalancePolicy::default(),
        );
        assert!(plan.moves.is_empty() && !plan.done);
        assert_eq!(plan.remaining_tablets, 4);
        assert_eq!(
            plan.blocked.expect("blocked").to_string(),
            "cannot drain s2 and s3: their 4 tablets hold 120.0 GiB, but the 2 ready servers \
             that remain have only 40.0 GiB free while keeping 20 % of each volume free; give \
             the remaining servers more room (bigger volumes, less data) or cancel the scale-in"
        );
        // One server leaving: the sentence still reads.
        let mut full = crowded();
        for s in ["s0", "s1", "s2"] {
            full.servers.get_mut(s).unwrap().stored_bytes = 80 * GIB;
        }
        let plan = drain(
            &full,
            3,
            &BalanceContext::default(),
            &BalancePolicy::default(),
        );
        let reason = plan.blocked.unwrap().reason;
        assert!(
            reason.starts_with(
                "cannot drain s3: its 2 tablets hold 60.0 GiB, but the 3 ready servers that \
                 remain have only 0 bytes free"
            ),
            "{reason}"
        );
        // Bigger volumes on the remaining servers: the drain goes on.
        let mut roomy = crowded();
        for s in ["s0", "s1"] {
            roomy.servers.get_mut(s).unwrap().capacity_bytes = Some(500 * GIB);
        }
        let plan = drain(
            &roomy,
            2,
            &BalanceContext::default(),
            &BalancePolicy::default(),
        );
        assert_eq!(plan.blocked, None);
        let to: Vec<&str> = plan.moves.iter().map(|m| m.to.as_str()).collect();
        assert_eq!(to, ["s0", "s1"]);
        // Room in all, but not on s1 for a 30 GiB tablet (60 + 30 > 80 GiB): s1 is skipped,
        // and s0 takes one move at a time.
        roomy.servers.get_mut("s1").unwrap().capacity_bytes = Some(100 * GIB);
        let plan = drain(
            &roomy,
            2,
            &BalanceContext::default(),
            &BalancePolicy::default(),
        );
        assert_eq!(plan.blocked, None);
        let to: Vec<&str> = plan.moves.iter().map(|m| m.to.as_str()).collect();
        assert_eq!(to, ["s0"]);
        // Unknown capacity on a receiver: no pre-check.
        let mut unknown = crowded();
        unknown.servers.get_mut("s1").unwrap().capacity_bytes = None;
        assert_eq!(
            drain(
                &unknown,
                2,
                &BalanceContext::default(),
                &BalancePolicy::default()
            )
            .blocked,
            None
        );
    }

    #[test]
    fn a_leaving_server_that_is_down_or_lost_blocks() {
        let down = ViewBuilder::new("c1")
            .servers(3)
            .table("t", &["m", "p"], &[0, 1, 2])
            .down(2)
            .build();
        let plan = drain(
            &down,
            2,
            &BalanceContext::default(),
            &BalancePolicy::default(),
        );
        assert!(plan.moves.is_empty());
        let reason = plan.blocked.unwrap().reason;
        assert!(
            reason.starts_with("cannot drain s2: it is not ready, and 1 tablet"),
            "{reason}"
        );
        let lost = ViewBuilder::new("c1")
            .servers(3)
            .table("t", &["m", "p"], &[0, 2, 2])
            .replace(2, std::time::Duration::from_secs(60))
            .lost(2)
            .build();
        let plan = drain(
            &lost,
            2,
            &BalanceContext::default(),
            &BalancePolicy::default(),
        );
        let reason = plan.blocked.unwrap().reason;
        assert!(
            reason.starts_with("cannot drain s2: its tablet t["),
            "{reason}"
        );
        assert!(reason.contains("is lost"), "{reason}");
        // A leaving server that is down but owns nothing is simply done.
        let empty = ViewBuilder::new("c1")
            .servers(3)
            .table("t", &["m"], &[0, 1])
            .down(2)
            .build();
        let plan = drain(
            &empty,
            2,
            &BalanceContext::default(),
            &BalancePolicy::default(),
        );
        assert_eq!(plan.draining, ["s2"]);
        assert!(plan.done && plan.blocked.is_none());
    }

    #[test]
    fn no_ready_server_to_receive_blocks() {
        let view = ViewBuilder::new("c1")
            .servers(3)
            .table("t", &["m"], &[1, 2])
            .down(0)
            .down(1)
            .build();
        let plan = drain(
            &view,
            2,
            &BalanceContext::default(),
            &BalancePolicy::default(),
        );
        assert_eq!(
            plan.blocked.unwrap().reason,
            "cannot drain s2: none of the 2 servers that remain is ready to take 1 tablet; start \
             the remaining servers or cancel the scale-in"
        );
        let plan = drain(
            &five(),
            0,
            &BalanceContext::default(),
            &BalancePolicy::default(),
        );
        assert_eq!(plan.draining.len(), 5);
        assert!(plan.blocked.unwrap().reason.starts_with(
            "cannot drain s0, s1, s2, s3 and s4: no server would remain (the count asked for is 0) \
             to take 10 tablets"
        ));
        // Servers another intent drains receive nothing.
        let view = ViewBuilder::new("c1")
            .servers(3)
            .table("t", &["m"], &[0, 2])
            .build();
        let ctx = BalanceContext {
            draining: ["s1".to_string()].into(),
            ..BalanceContext::default()
        };
        let plan = drain(&view, 2, &ctx, &BalancePolicy::default());
        assert_eq!(plan.moves.len(), 1);
        assert_eq!(plan.moves[0].to, "s0");
    }

    #[test]
    fn nothing_leaves_nothing_to_do() {
        let empty = ViewBuilder::new("c1").build();
        let plan = drain(
            &empty,
            3,
            &BalanceContext::default(),
            &BalancePolicy::default(),
        );
        assert!(plan.draining.is_empty() && plan.moves.is_empty() && plan.done);
        let plan = drain(
            &five(),
            5,
            &BalanceContext::default(),
            &BalancePolicy::default(),
        );
        assert!(plan.draining.is_empty() && plan.done);
        // One server, asked to keep it.
        let one = ViewBuilder::new("c1")
            .servers(1)
            .table("t", &[], &[0])
            .build();
        assert!(
            drain(
                &one,
                1,
                &BalanceContext::default(),
                &BalancePolicy::default()
            )
            .done
        );
    }

    #[test]
    fn bytes_read_well() {
        assert_eq!(human_bytes(0), "0 bytes");
        assert_eq!(human_bytes(1023), "1023 bytes");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(512 << 20), "512.0 MiB");
        assert_eq!(human_bytes(120 * GIB), "120.0 GiB");
        assert_eq!(human_bytes(3 << 40), "3.0 TiB");
        assert_eq!(count(1, "tablet"), "1 tablet");
        assert_eq!(count(0, "tablet"), "0 tablets");
    }

    #[test]
    fn a_tenth_of_a_big_cluster_drains_within_the_limits() {
        let view = crate::fixture::Synthetic::new(100, 10_000).build();
        let leaving: BTreeSet<&str> = view
            .servers
            .values()
            .filter(|s| s.ordinal >= 90)
            .map(|s| s.id.as_str())
            .collect();
        let owned = view
            .tablets
            .tables()
            .flat_map(|t| view.tablets.tablets(t))
            .filter(|t| leaving.contains(t.owner.as_str()))
            .count();
        let policy = BalancePolicy {
            max_moves_per_cluster: 8,
            ..BalancePolicy::default()
        };
        let plan = drain(&view, 90, &BalanceContext::default(), &policy);
        assert_eq!(plan.blocked, None);
        assert_eq!(plan.draining.len(), 10);
        assert_eq!(plan.remaining_tablets, owned);
        assert_eq!(plan.moves.len(), 8);
        for m in &plan.moves {
            assert!(leaving.contains(m.from.as_str()) && !leaving.contains(m.to.as_str()));
            assert_eq!(m.reason, MoveReason::Drain);
        }
        // A leaving server that is down blocks the drain, named.
        let mut down = view.clone();
        let id = down.servers_by_ordinal()[95].id.clone();
        down.servers.get_mut(&id).unwrap().ready = false;
        let plan = drain(&down, 90, &BalanceContext::default(), &policy);
        let blocked = plan.blocked.expect("blocked").reason;
        assert!(
            blocked.contains(&id) && blocked.contains("not ready"),
            "{blocked}"
        );
        assert!(plan.moves.is_empty());
    }
}
