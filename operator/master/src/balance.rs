//! Rebalancing: which tablets to move so that every server carries about its share.
//!
//! A move copies the tablet's bytes (`../shared/DISTRIBUTED.md`, "Moving a tablet"), so the
//! balancer moves little and never in circles — the failure it guards against is a balancer
//! that oscillates or sends waves of moves on stale sizes (tikv/pd#11133):
//!
//! * **Score.** A server's score is a weighted sum of its *shares* of the cluster's bytes,
//!   requests per second and tablet count (shares, so the units do not matter). A term the
//!   cluster has nothing of (no bytes, no load) is skipped; with every load zero the tablet
//!   count alone decides. The scores of the balanced servers sum to 1, so the even share is
//!   1 / servers.
//! * **Moves in flight count as done**: their tablet counts at its destination, not its source,
//!   so a pass never plans again what a running move already fixes.
//! * **Tolerance.** Only a gap between two servers larger than `tolerance` × the even share is
//!   worth a move.
//! * **No overshoot.** A tablet moves from a more loaded server to a less loaded one only if the
//!   destination does not end up above the source. Each move then lowers the sum of the squared
//!   scores (moving `x` from `s` to `d` with `d + x <= s - x` lowers it by `2x(s - d - x) > 0`),
//!   so with unchanged loads repeated passes end, and no tablet goes back and forth: equal
//!   servers never trade, and a tablet too big to move without tipping the balance stays put.
//! * **Limits and cool-down.** At most `max_moves_per_server` moves involve a server and
//!   `max_moves_per_cluster` run in the cluster, in flight included; a tablet moved recently
//!   (the runtime owns the clock and passes the set) does not move again during its cool-down.
//!
//! Only ready servers that are not draining take part, as sources and destinations; a
//! draining server's tablets are [`crate::drain()`]'s business. Only Serving tablets move, never
//! one already in flight.

use std::cmp::Ordering;
use std::collections::{BTreeSet, HashMap};
use std::fmt;

use basalt_model::{ServerId, Tablet, TabletState};

use crate::{ClusterView, ServerState, TabletKey, TabletLoad, key_of};

/// One tablet to move.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MovePlan {
    /// The tablet as the view recorded it (owner `from`, its current epoch).
    pub tablet: Tablet,
    pub from: ServerId,
    pub to: ServerId,
    pub reason: MoveReason,
}

impl fmt::Display for MovePlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "move {} from {} to {} ({})",
            self.tablet, self.from, self.to, self.reason
        )
    }
}

/// Why a tablet moves; its Display is the label of logs and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MoveReason {
    /// To even out the servers' loads ([`rebalance`]).
    Balance,
    /// Off a server that leaves the cluster ([`crate::drain()`]).
    Drain,
}

impl fmt::Display for MoveReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MoveReason::Balance => "balance",
            MoveReason::Drain => "drain",
        })
    }
}

/// What the runtime knows beyond the view: the moves under way and the recent ones.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BalanceContext {
    /// The moves running now (copying, catching up or fencing).
    pub in_flight: Vec<MovePlan>,
    /// The tablets moved recently and still in their cool-down.
    pub cooling: BTreeSet<TabletKey>,
    /// Servers that must not receive tablets (leaving the cluster).
    pub draining: BTreeSet<ServerId>,
}

/// How eagerly to move.
#[derive(Clone, Debug, PartialEq)]
pub struct BalancePolicy {
    /// A gap between two servers' scores is worth a move only beyond this fraction of the even
    /// share.
    pub tolerance: f64,
    /// Moves (in flight and planned) one server may take part in, as source or destination.
    pub max_moves_per_server: usize,
    /// Moves (in flight and planned) in the whole cluster.
    pub max_moves_per_cluster: usize,
    /// Weight of a server's share of the cluster's bytes in its score.
    pub bytes_weight: f64,
    /// Weight of its share of the cluster's requests per second.
    pub requests_weight: f64,
    /// Weight of its share of the cluster's tablets: what they hold matters more than how many
    /// there are, but the count keeps one server from collecting every empty tablet.
    pub tablets_weight: f64,
    /// The fraction of each volume (of known capacity) kept free: no move fills a destination
    /// beyond `capacity × (1 − headroom)`, and a drain whose tablets would not fit so is
    /// blocked.
    pub headroom: f64,
}

impl Default for BalancePolicy {
    fn default() -> Self {
        BalancePolicy {
            tolerance: 0.10,
            max_moves_per_server: 1,
            max_moves_per_cluster: 2,
            bytes_weight: 1.0,
            requests_weight: 1.0,
            tablets_weight: 0.5,
            headroom: 0.20,
        }
    }
}

/// The moves that bring the ready, non-draining servers closer to an even load, in the order
/// planned (the most loaded server's first). Empty when the cluster is within tolerance, when
/// no move would help without overshooting, or when the limits are used up.
pub fn rebalance(
    view: &ClusterView,
    ctx: &BalanceContext,
    policy: &BalancePolicy,
) -> Vec<MovePlan> {
    let mut ledger = Ledger::new(view, ctx, policy, |s| {
        (s.ready && !ctx.draining.contains(&s.id)).then_some(Role::Member)
    });
    let members = ledger.slots.len();
    if members < 2 {
        return Vec::new();
    }
    let threshold = policy.tolerance / members as f64;
    while ledger.has_room() {
        let Some((tablet, from, to)) = next_move(&ledger, ctx, threshold) else {
            break;
        };
        ledger.plan(tablet, from, to, MoveReason::Balance);
    }
    ledger.into_plans()
}

/// The best move now: from the most loaded server (that may still move) towards the least
/// loaded one, falling back to the next pairs when no tablet of the first fits the gap.
fn next_move<'a>(
    ledger: &Ledger<'a>,
    ctx: &BalanceContext,
    threshold: f64,
) -> Option<(&'a Tablet, usize, usize)> {
    let sources = ledger.available(Ordering::Greater);
    let destinations = ledger.available(Ordering::Less);
    for &from in &sources {
        for &to in &destinations {
            let gap = ledger.score(from) - ledger.score(to);
            if gap <= threshold {
                // Destinations come least loaded first: the gaps only shrink from here.
                break;
            }
            if let Some(tablet) = best_tablet(ledger, ctx, from, to, gap) {
                return Some((tablet, from, to));
            }
        }
    }
    None
}

/// Floating-point slack when comparing scores (sums of shares, of order 1).
const EPSILON: f64 = 1e-9;

/// The movable tablet of `from` whose move to `to` narrows their `gap` the most without
/// overshooting: the largest share `x` with `2x <= gap` (the destination ends at most level
/// with the source), and that fits on `to`'s volume. The first in key order on a tie.
fn best_tablet<'a>(
    ledger: &Ledger<'a>,
    ctx: &BalanceContext,
    from: usize,
    to: usize,
    gap: f64,
) -> Option<&'a Tablet> {
    let mut best: Option<(f64, &Tablet)> = None;
    for &(t, load) in &ledger.slots[from].owned {
        let x = ledger.share(load);
        if x <= 0.0 || 2.0 * x > gap + EPSILON || !ledger.fits(to, load.bytes) {
            continue;
        }
        if !ledger.movable(t) || ctx.cooling.contains(&key_of(t)) {
            continue;
        }
        if best.is_none_or(|(b, _)| x > b) {
            best = Some((x, t));
        }
    }
    best.map(|(_, t)| t)
}

/// Count, bytes and requests per second, summed over tablets (as floats, for shares).
#[derive(Clone, Copy, Debug, Default)]
struct Amount {
    tablets: f64,
    bytes: f64,
    requests: f64,
}

impl Amount {
    /// One tablet with `load` (a negative or non-finite request rate counts as none).
    fn of(load: TabletLoad) -> Amount {
        let requests = load.requests_per_sec;
        Amount {
            tablets: 1.0,
            bytes: load.bytes as f64,
            requests: if requests.is_finite() && requests > 0.0 {
                requests
            } else {
                0.0
            },
        }
    }

    fn add(&mut self, other: Amount) {
        self.tablets += other.tablets;
        self.bytes += other.bytes;
        self.requests += other.requests;
    }

    fn sub(&mut self, other: Amount) {
        self.tablets -= other.tablets;
        self.bytes -= other.bytes;
        self.requests -= other.requests;
    }
}

/// Turns amounts into scores: each term is a share of the cluster's total times its weight,
/// the weights of the terms in use summing to 1. Linear, so a server's score is the sum of its
/// tablets' shares.
#[derive(Clone, Copy, Debug, Default)]
struct Scale {
    per_tablet: f64,
    per_byte: f64,
    per_request: f64,
}

impl Scale {
    fn new(policy: &BalancePolicy, total: Amount) -> Scale {
        let terms = [
            (policy.tablets_weight, total.tablets),
            (policy.bytes_weight, total.bytes),
            (policy.requests_weight, total.requests),
        ];
        let used = |(weight, total): (f64, f64)| weight > 0.0 && total > 0.0;
        let weights: f64 = terms.iter().filter(|&&t| used(t)).map(|t| t.0).sum();
        if weights <= 0.0 || !weights.is_finite() {
            // Nothing weighted to share (every load zero, or zero weights): count tablets.
            return Scale {
                per_tablet: if total.tablets > 0.0 {
                    1.0 / total.tablets
                } else {
                    0.0
                },
                ..Scale::default()
            };
        }
        let per = |term: (f64, f64)| {
            if used(term) {
                term.0 / weights / term.1
            } else {
                0.0
            }
        };
        Scale {
            per_tablet: per(terms[0]),
            per_byte: per(terms[1]),
            per_request: per(terms[2]),
        }
    }

    fn score(&self, a: Amount) -> f64 {
        a.tablets * self.per_tablet + a.bytes * self.per_byte + a.requests * self.per_request
    }
}

/// What part a server plays in a pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// Counted, may give and receive tablets.
    Member,
    /// Counted in the totals and may give tablets, never receives (draining).
    Leaving,
}

/// One server in a pass.
struct Slot<'a> {
    server: &'a ServerState,
    role: Role,
    /// What it carries, moves in flight and planned counted as done.
    amount: Amount,
    /// Moves in flight or planned with it on either side.
    busy: usize,
    /// Bytes of the moves in flight or planned towards it (maybe not on its volume yet).
    incoming: u64,
    /// The tablets its record names it owner of, with their loads, in table and key order.
    owned: Vec<(&'a Tablet, TabletLoad)>,
}

/// The servers of a pass with what they carry, the moves planned so far, and the limits: the
/// bookkeeping [`rebalance`] and [`crate::drain()`] share.
pub(crate) struct Ledger<'a> {
    view: &'a ClusterView,
    policy: &'a BalancePolicy,
    /// The counted servers, in ordinal order.
    slots: Vec<Slot<'a>>,
    /// Each counted server's place in `slots`, by store id.
    by_id: HashMap<&'a str, usize>,
    scale: Scale,
    /// Tablets moving (in flight or planned): they are not moved again.
    moving: BTreeSet<TabletKey>,
    in_flight: usize,
    plans: Vec<MovePlan>,
}

impl<'a> Ledger<'a> {
    /// The servers `role` names (None: not counted), with the tablets each carries once the
    /// moves in flight are done.
    pub(crate) fn new(
        view: &'a ClusterView,
        ctx: &BalanceContext,
        policy: &'a BalancePolicy,
        role: impl Fn(&ServerState) -> Option<Role>,
    ) -> Ledger<'a> {
        let slots: Vec<Slot<'a>> = view
            .servers_by_ordinal()
            .into_iter()
            .filter_map(|server| {
                role(server).map(|role| Slot {
                    server,
                    role,
                    amount: Amount::default(),
                    busy: 0,
                    incoming: 0,
                    owned: Vec::new(),
                })
            })
            .collect();
        let by_id = (0..slots.len())
            .map(|i| (slots[i].server.id.as_str(), i))
            .collect();
        let mut ledger = Ledger {
            view,
            policy,
            slots,
            by_id,
            scale: Scale::default(),
            moving: ctx.in_flight.iter().map(|m| key_of(&m.tablet)).collect(),
            in_flight: ctx.in_flight.len(),
            plans: Vec::new(),
        };
        ledger.count_in_flight(ctx);
        ledger.count_tablets(ctx);
        let mut total = Amount::default();
        for slot in &ledger.slots {
            total.add(slot.amount);
        }
        ledger.scale = Scale::new(policy, total);
        ledger
    }

    fn count_in_flight(&mut self, ctx: &BalanceContext) {
        for m in &ctx.in_flight {
            let from = self.index(&m.from);
            let to = self.index(&m.to).filter(|&to| Some(to) != from);
            for i in from.into_iter().chain(to) {
                self.slots[i].busy += 1;
            }
            if let Some(to) = self.index(&m.to) {
                let bytes = self.view.load(&m.tablet).bytes;
                self.slots[to].incoming = self.slots[to].incoming.saturating_add(bytes);
            }
        }
    }

    /// Each tablet counts at its owner, or at its destination while it moves. One walk of
    /// the map and the reports together (`ClusterView::tablets_with_loads`), servers found
    /// by id: linear in the tablets, so a pass over a million stays well under a second.
    fn count_tablets(&mut self, ctx: &BalanceContext) {
        let destination: HashMap<(&str, &[u8]), &str> = ctx
            .in_flight
            .iter()
            .map(|m| {
                (
                    (m.tablet.table.as_str(), &m.tablet.range.start[..]),
                    m.to.as_str(),
                )
            })
            .collect();
        let view = self.view;
        for (t, load) in view.tablets_with_loads() {
            let owner = self.index(&t.owner);
            let at = if destination.is_empty() {
                owner
            } else {
                match destination.get(&(t.table.as_str(), &t.range.start[..])) {
                    Some(to) => self.index(to),
                    None => owner,
                }
            };
            if let Some(i) = at {
                self.slots[i].amount.add(Amount::of(load));
            }
            if let Some(i) = owner {
                self.slots[i].owned.push((t, load));
            }
        }
    }

    fn index(&self, id: &str) -> Option<usize> {
        self.by_id.get(id).copied()
    }

    fn score(&self, i: usize) -> f64 {
        self.scale.score(self.slots[i].amount)
    }

    /// The part of the total score a tablet with `load` carries.
    fn share(&self, load: TabletLoad) -> f64 {
        self.scale.score(Amount::of(load))
    }

    /// May the cluster take one more move?
    pub(crate) fn has_room(&self) -> bool {
        self.in_flight + self.plans.len() < self.policy.max_moves_per_cluster
    }

    /// May server `i` take part in one more move?
    fn free(&self, i: usize) -> bool {
        self.slots[i].busy < self.policy.max_moves_per_server
    }

    /// Would a tablet of `bytes` fit on server `i` and leave its headroom free (always,
    /// capacity unknown)?
    fn fits(&self, i: usize, bytes: u64) -> bool {
        let slot = &self.slots[i];
        let Some(capacity) = slot.server.capacity_bytes else {
            return true;
        };
        let after = slot
            .server
            .stored_bytes
            .saturating_add(slot.incoming)
            .saturating_add(bytes);
        after as f64 <= capacity as f64 * (1.0 - self.policy.headroom)
    }

    /// A Serving tablet that is not moving yet.
    fn movable(&self, t: &Tablet) -> bool {
        t.state == TabletState::Serving && !self.moving.contains(&key_of(t))
    }

    /// The members that may take part in one more move, by score (`Greater`: most loaded
    /// first; `Less`: least loaded first), the lowest ordinal first on a tie.
    fn available(&self, order: Ordering) -> Vec<usize> {
        let mut members: Vec<usize> = (0..self.slots.len())
            .filter(|&i| self.slots[i].role == Role::Member && self.free(i))
            .collect();
        members.sort_by(|&a, &b| {
            let by_score = self.score(a).total_cmp(&self.score(b));
            if order == Ordering::Greater {
                by_score.reverse()
            } else {
                by_score
            }
        });
        members
    }

    /// The least loaded member that may receive a tablet of `bytes` now.
    fn least_loaded_for(&self, bytes: u64) -> Option<usize> {
        self.available(Ordering::Less)
            .into_iter()
            .find(|&i| self.fits(i, bytes))
    }

    /// Plans moving `t` from server `from` to `to` and counts it as done.
    fn plan(&mut self, t: &Tablet, from: usize, to: usize, reason: MoveReason) {
        let load = self.view.load(t);
        self.slots[from].amount.sub(Amount::of(load));
        self.slots[to].amount.add(Amount::of(load));
        self.slots[from].busy += 1;
        self.slots[to].busy += 1;
        self.slots[to].incoming = self.slots[to].incoming.saturating_add(load.bytes);
        self.moving.insert(key_of(t));
        self.plans.push(MovePlan {
            tablet: t.clone(),
            from: self.slots[from].server.id.clone(),
            to: self.slots[to].server.id.clone(),
            reason,
        });
    }

    /// Plans moving every movable tablet of the leaving servers (in ordinal, then table and
    /// key order) to the least loaded member that may receive it, within the limits.
    pub(crate) fn plan_drain(&mut self) {
        for from in 0..self.slots.len() {
            if self.slots[from].role != Role::Leaving {
                continue;
            }
            for i in 0..self.slots[from].owned.len() {
                if !self.has_room() {
                    return;
                }
                if !self.free(from) {
                    break;
                }
                let (t, load) = self.slots[from].owned[i];
                if !self.movable(t) {
                    continue;
                }
                if let Some(to) = self.least_loaded_for(load.bytes) {
                    self.plan(t, from, to, MoveReason::Drain);
                }
            }
        }
    }

    pub(crate) fn into_plans(self) -> Vec<MovePlan> {
        self.plans
    }

    /// Each counted server's score, in ordinal order (for tests).
    #[cfg(test)]
    fn scores(&self) -> Vec<f64> {
        (0..self.slots.len()).map(|i| self.score(i)).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::fixture::{ViewBuilder, apply_moves, tablet_key};

    /// The split keys of a table of `n` tablets: "k01" … "k{n-1}".
    fn splits(n: usize) -> Vec<String> {
        (1..n).map(|i| format!("k{i:02}")).collect()
    }

    /// A view of `servers` servers and one table "t" whose tablet `i` is on `owners[i]`.
    fn view_of(servers: u32, owners: &[u32]) -> ClusterView {
        let keys = splits(owners.len());
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        ViewBuilder::new("c1")
            .servers(servers)
            .table("t", &keys, owners)
            .build()
    }

    /// Tablets per server, in ordinal order.
    fn counts(view: &ClusterView) -> Vec<usize> {
        view.servers_by_ordinal()
            .iter()
            .map(|s| view.server_load(&s.id).tablets)
            .collect()
    }

    /// Runs passes, applying each pass's moves before the next (cool-downs off: the worst case
    /// for oscillation), until a pass plans nothing; returns the view and every move made.
    fn settle(mut view: ClusterView, policy: &BalancePolicy) -> (ClusterView, Vec<MovePlan>) {
        let mut all = Vec::new();
        for _ in 0..100 {
            let plans = rebalance(&view, &BalanceContext::default(), policy);
            if plans.is_empty() {
                return (view, all);
            }
            check_limits(&plans, policy);
            view = apply_moves(&view, &plans);
            all.extend(plans);
        }
        panic!("no fixpoint after 100 passes: {:?}", counts(&view));
    }

    fn check_limits(plans: &[MovePlan], policy: &BalancePolicy) {
        assert!(plans.len() <= policy.max_moves_per_cluster);
        let mut per_server: BTreeMap<&str, usize> = BTreeMap::new();
        for p in plans {
            assert_ne!(p.from, p.to);
            *per_server.entry(&p.from).or_default() += 1;
            *per_server.entry(&p.to).or_default() += 1;
        }
        assert!(
            per_server
                .values()
                .all(|&n| n <= policy.max_moves_per_server)
        );
    }

    #[test]
    fn new_servers_fill_up_until_every_server_has_its_share() {
        // 10 tablets on s0..s2 (4/3/3), then s3 and s4 join empty.
        let view = view_of(5, &[0, 1, 2, 0, 1, 2, 0, 1, 2, 0]);
        assert_eq!(counts(&view), [4, 3, 3, 0, 0]);
        let first = rebalance(&view, &BalanceContext::default(), &BalancePolicy::default());
        let pairs: Vec<(&str, &str)> = first
            .iter()
            .map(|p| (p.from.as_str(), p.to.as_str()))
            .collect();
        assert_eq!(pairs, [("s0", "s3"), ("s1", "s4")]);
        assert!(first.iter().all(|p| p.reason == MoveReason::Balance));
        let (view, moves) = settle(view, &BalancePolicy::default());
        assert_eq!(counts(&view), [2, 2, 2, 2, 2]);
        assert_eq!(moves.len(), 4, "no move more than needed: {moves:?}");
    }

    #[test]
    fn within_one_tablet_nothing_moves() {
        // 4/3/3: any move would leave the destination above the source.
        let view = view_of(3, &[0, 1, 2, 0, 1, 2, 0, 1, 2, 0]);
        assert!(rebalance(&view, &BalanceContext::default(), &BalancePolicy::default()).is_empty());
        // 5/5 with equal bytes: level, nothing to trade.
        let mut b = ViewBuilder::new("c1").servers(2).table(
            "t",
            &["b", "c", "d", "e", "f", "g", "h", "i", "j"],
            &[0, 1, 0, 1, 0, 1, 0, 1, 0, 1],
        );
        for start in ["", "b", "c", "d", "e", "f", "g", "h", "i", "j"] {
            b = b.load("t", start, 1 << 30, 10.0);
        }
        let view = b.build();
        assert!(rebalance(&view, &BalanceContext::default(), &BalancePolicy::default()).is_empty());
    }

    #[test]
    fn a_big_tablet_is_never_ping_ponged() {
        // Alone on s0, a 10 GiB tablet would only swap the imbalance: it stays.
        let lone = ViewBuilder::new("c1")
            .servers(2)
            .table("t", &[], &[0])
            .load("t", "", 10 << 30, 100.0)
            .build();
        assert!(rebalance(&lone, &BalanceContext::default(), &BalancePolicy::default()).is_empty());
        // One 10 GiB tablet and nine tiny ones on two servers.
        let mut b = ViewBuilder::new("c1").servers(2).table(
            "t",
            &["b", "c", "d", "e", "f", "g", "h", "i", "j"],
            &[0, 0, 0, 0, 0, 1, 1, 1, 1, 1],
        );
        b = b.load("t", "", 10 << 30, 5.0);
        for start in ["b", "c", "d", "e", "f", "g", "h", "i", "j"] {
            b = b.load("t", start, 1 << 20, 5.0);
        }
        let (view, moves) = settle(b.build(), &BalancePolicy::default());
        assert!(
            moves.iter().all(|m| !m.tablet.range.start.is_empty()),
            "the big tablet moved: {moves:?}"
        );
        // Three tiny ones left the big one's server, once each; then the two are within
        // tolerance, and everything stays put.
        assert_eq!(counts(&view), [2, 8]);
        assert_eq!(moves.len(), 3);
        let moved: BTreeSet<TabletKey> = moves.iter().map(|m| key_of(&m.tablet)).collect();
        assert_eq!(moved.len(), moves.len());
        // Same story on three servers.
        let mut b = ViewBuilder::new("c1").servers(3).table(
            "t",
            &["b", "c", "d", "e", "f", "g", "h", "i", "j"],
            &[0, 1, 2, 0, 1, 2, 0, 1, 2, 0],
        );
        b = b.load("t", "", 10 << 30, 0.0);
        for start in ["b", "c", "d", "e", "f", "g", "h", "i", "j"] {
            b = b.load("t", start, 1 << 20, 0.0);
        }
        let (view, moves) = settle(b.build(), &BalancePolicy::default());
        assert!(moves.iter().all(|m| !m.tablet.range.start.is_empty()));
        assert_eq!(view.tablets.tablets("t")[0].owner, "s0");
        assert_eq!(counts(&view), [1, 5, 4]);
    }

    #[test]
    fn bytes_and_requests_weigh_more_than_counts() {
        // 4/4 tablets, but s0's hold 1 GiB each and s1's nothing: a 1 GiB tablet moves.
        let mut b = ViewBuilder::new("c1").servers(2).table(
            "t",
            &["b", "c", "d", "e", "f", "g", "h"],
            &[0, 0, 0, 0, 1, 1, 1, 1],
        );
        for start in ["", "b", "c", "d"] {
            b = b.load("t", start, 1 << 30, 0.0);
        }
        let plans = rebalance(
            &b.build(),
            &BalanceContext::default(),
            &BalancePolicy::default(),
        );
        assert_eq!(plans.len(), 1, "{plans:?}");
        assert_eq!((plans[0].from.as_str(), plans[0].to.as_str()), ("s0", "s1"));
        assert_eq!(plans[0].tablet.range.start, "");
        // Same with requests: the hottest tablet that does not overshoot leaves s1.
        let view = ViewBuilder::new("c1")
            .servers(2)
            .table("t", &["b", "c", "d"], &[1, 1, 0, 0])
            .load("t", "", 0, 900.0)
            .load("t", "b", 0, 300.0)
            .load("t", "c", 0, 10.0)
            .load("t", "d", 0, 10.0)
            .build();
        let plans = rebalance(&view, &BalanceContext::default(), &BalancePolicy::default());
        assert_eq!(plans.len(), 1, "{plans:?}");
        assert_eq!(plans[0].from, "s1");
        assert_eq!(plans[0].tablet.range.start, "b");
    }

    #[test]
    fn moves_in_flight_count_as_done() {
        // 3/1, with a move s0 → s1 running: 2/2 already, nothing more.
        let view = view_of(2, &[0, 0, 0, 1]);
        let running = MovePlan {
            tablet: view.tablets.tablets("t")[0].clone(),
            from: "s0".into(),
            to: "s1".into(),
            reason: MoveReason::Balance,
        };
        let policy = BalancePolicy {
            max_moves_per_server: 5,
            max_moves_per_cluster: 5,
            ..BalancePolicy::default()
        };
        let ctx = BalanceContext {
            in_flight: vec![running.clone()],
            ..BalanceContext::default()
        };
        assert!(rebalance(&view, &ctx, &policy).is_empty());
        // The same once committed but still reported in flight (the record names s1).
        let committed = apply_moves(&view, std::slice::from_ref(&running));
        assert!(rebalance(&committed, &ctx, &policy).is_empty());
        // 5/1 with one running: one more, and never the running tablet.
        let view = view_of(2, &[0, 0, 0, 0, 0, 1]);
        let ctx = BalanceContext {
            in_flight: vec![MovePlan {
                tablet: view.tablets.tablets("t")[0].clone(),
                ..running
            }],
            ..BalanceContext::default()
        };
        let plans = rebalance(&view, &ctx, &policy);
        assert_eq!(plans.len(), 1);
        assert_eq!(plans[0].tablet.range.start, "k01");
    }

    #[test]
    fn limits_count_moves_in_flight() {
        // 6/0/0/0: s0 may take part in one move at a time, the cluster in two.
        let view = view_of(4, &[0, 0, 0, 0, 0, 0]);
        let policy = BalancePolicy::default();
        let plans = rebalance(&view, &BalanceContext::default(), &policy);
        assert_eq!(plans.len(), 1);
        assert_eq!((plans[0].from.as_str(), plans[0].to.as_str()), ("s0", "s1"));
        // With that move running, s0 is busy: nothing.
        let ctx = BalanceContext {
            in_flight: plans.clone(),
            ..BalanceContext::default()
        };
        assert!(rebalance(&view, &ctx, &policy).is_empty());
        // Two servers per move: at most two moves on 6/6/0/0.
        let view = view_of(4, &[0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1]);
        let plans = rebalance(&view, &BalanceContext::default(), &policy);
        assert_eq!(plans.len(), 2);
        // A move in flight elsewhere uses one of the cluster's two.
        let elsewhere = MovePlan {
            tablet: view.tablets.tablets("t")[0].clone(),
            from: "s9".into(),
            to: "s8".into(),
            reason: MoveReason::Drain,
        };
        let ctx = BalanceContext {
            in_flight: vec![elsewhere],
            ..BalanceContext::default()
        };
        assert_eq!(rebalance(&view, &ctx, &policy).len(), 1);
        let wide = BalancePolicy {
            max_moves_per_server: 3,
            max_moves_per_cluster: 10,
            ..policy
        };
        let plans = rebalance(&view, &BalanceContext::default(), &wide);
        assert_eq!(plans.len(), 6, "{plans:?}");
        assert_eq!(counts(&apply_moves(&view, &plans)), [3, 3, 3, 3]);
        assert!(
            rebalance(
                &view,
                &BalanceContext::default(),
                &BalancePolicy {
                    max_moves_per_server: 0,
                    ..BalancePolicy::default()
                }
            )
            .is_empty()
        );
    }

    #[test]
    fn only_ready_servers_that_are_not_draining_take_part() {
        // s1 down, s2 draining: s0's surplus goes to s3 only; s1's tablets stay.
        let view = ViewBuilder::new("c1")
            .servers(4)
            .table("t", &["b", "c", "d", "e", "f"], &[0, 0, 0, 0, 1, 1])
            .down(1)
            .build();
        let ctx = BalanceContext {
            draining: ["s2".to_string()].into(),
            ..BalanceContext::default()
        };
        let policy = BalancePolicy {
            max_moves_per_server: 4,
            max_moves_per_cluster: 4,
            ..BalancePolicy::default()
        };
        let plans = rebalance(&view, &ctx, &policy);
        assert_eq!(plans.len(), 2, "{plans:?}");
        assert!(plans.iter().all(|p| p.from == "s0" && p.to == "s3"));
        // A draining server is no source either: drain moves its tablets.
        let view = view_of(3, &[2, 2, 2, 2, 0, 1]);
        let ctx = BalanceContext {
            draining: ["s2".to_string()].into(),
            ..BalanceContext::default()
        };
        assert!(rebalance(&view, &ctx, &policy).is_empty());
    }

    #[test]
    fn lost_cooling_and_unready_tablets_stay() {
        // s1's tablets are Lost (s1 replaced), s0 has none: nothing can move.
        let view = ViewBuilder::new("c1")
            .servers(3)
            .table("t", &["b", "c", "d"], &[1, 1, 1, 1])
            .lost(1)
            .build();
        assert!(rebalance(&view, &BalanceContext::default(), &BalancePolicy::default()).is_empty());
        // Cooling tablets stay; the next one in key order goes instead.
        let view = view_of(2, &[0, 0, 0, 0]);
        let ctx = BalanceContext {
            cooling: [tablet_key("t", ""), tablet_key("t", "k01")].into(),
            ..BalanceContext::default()
        };
        let plans = rebalance(&view, &ctx, &BalancePolicy::default());
        assert_eq!(plans.len(), 1);
        assert_eq!(plans[0].tablet.range.start, "k02");
        let all: BTreeSet<TabletKey> = view.tablets.tablets("t").iter().map(key_of).collect();
        let ctx = BalanceContext {
            cooling: all,
            ..BalanceContext::default()
        };
        assert!(rebalance(&view, &ctx, &BalancePolicy::default()).is_empty());
    }

    #[test]
    fn full_volumes_receive_nothing() {
        // s1 is emptier by score, but its volume is past the headroom.
        let view = ViewBuilder::new("c1")
            .servers(2)
            .table("t", &["b", "c", "d"], &[0, 0, 0, 1])
            .stored(1, 90 << 30)
            .build();
        assert!(rebalance(&view, &BalanceContext::default(), &BalancePolicy::default()).is_empty());
        // Unknown capacity: no limit.
        let view = ViewBuilder::new("c1")
            .servers(2)
            .table("t", &["b", "c", "d"], &[0, 0, 0, 1])
            .stored(1, 90 << 30)
            .capacity(1, None)
            .build();
        assert_eq!(
            rebalance(&view, &BalanceContext::default(), &BalancePolicy::default()).len(),
            1
        );
    }

    #[test]
    fn tiny_clusters_plan_nothing() {
        let none = ViewBuilder::new("c1").build();
        assert!(rebalance(&none, &BalanceContext::default(), &BalancePolicy::default()).is_empty());
        let one = view_of(1, &[0, 0, 0]);
        assert!(rebalance(&one, &BalanceContext::default(), &BalancePolicy::default()).is_empty());
        let empty = ViewBuilder::new("c1").servers(3).build();
        assert!(
            rebalance(
                &empty,
                &BalanceContext::default(),
                &BalancePolicy::default()
            )
            .is_empty()
        );
        // Zero weights everywhere: tablet counts still decide.
        let policy = BalancePolicy {
            bytes_weight: 0.0,
            requests_weight: 0.0,
            tablets_weight: 0.0,
            ..BalancePolicy::default()
        };
        assert_eq!(
            rebalance(
                &view_of(2, &[0, 0, 0, 0]),
                &BalanceContext::default(),
                &policy
            )
            .len(),
            1
        );
    }

    #[test]
    fn reasons_and_plans_read_well() {
        assert_eq!(MoveReason::Balance.to_string(), "balance");
        assert_eq!(MoveReason::Drain.to_string(), "drain");
        let view = view_of(2, &[0, 0]);
        let plans = rebalance(&view, &BalanceContext::default(), &BalancePolicy::default());
        assert_eq!(
            plans[0].to_string(),
            format!("move {} from s0 to s1 (balance)", plans[0].tablet)
        );
    }

    /// The members' scores of `view` with nothing in flight.
    fn member_scores(view: &ClusterView) -> Vec<f64> {
        let ctx = BalanceContext::default();
        let policy = BalancePolicy::default();
        Ledger::new(view, &ctx, &policy, |s| s.ready.then_some(Role::Member)).scores()
    }

    #[test]
    fn a_big_skewed_cluster_comes_closer_to_even_with_every_pass() {
        // 200 servers, 20,000 tablets with heavy-tailed sizes and loads, the first tenth of
        // the servers overloaded and the last tenth nearly empty (fixture::Synthetic).
        let mut view = crate::fixture::Synthetic::new(200, 20_000).build();
        let policy = BalancePolicy {
            max_moves_per_cluster: 20,
            ..BalancePolicy::default()
        };
        let squares = |v: &ClusterView| member_scores(v).iter().map(|s| s * s).sum::<f64>();
        let spread = |v: &ClusterView| {
            let s = member_scores(v);
            s.iter().copied().fold(f64::MIN, f64::max) - s.iter().copied().fold(f64::MAX, f64::min)
        };
        let (first_squares, first_spread) = (squares(&view), spread(&view));
        for _ in 0..20 {
            let plans = rebalance(&view, &BalanceContext::default(), &policy);
            assert_eq!(plans.len(), 20, "a skewed cluster has work for every slot");
            check_limits(&plans, &policy);
            let before = squares(&view);
            view = apply_moves(&view, &plans);
            // No overshoot: every move lowers the sum of the squared scores.
            assert!(squares(&view) < before);
        }
        assert!(squares(&view) < first_squares);
        assert!(spread(&view) < first_spread, "the extremes came closer");
    }
}
