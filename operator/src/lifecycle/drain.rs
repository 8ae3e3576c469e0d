//! The scale-in's drain as both runtimes report it: the master's own decision
//! ([`basalt_master::drain()`] with the default policy) on the one view of the cluster
//! ([`super::view::cluster_view`]), and before it what makes the master move no tablet at all
//! (a lost tablet, a server that owns tablets but is down). The Kubernetes Cluster status
//! (`status.scaleIn`, `DrainBlocked`) and the local runtime (`local status`, and which leaving
//! server may stop) read the same [`Drain`]. Pure.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use basalt_master::model::{ServerId, TabletMap, TabletState};
use basalt_master::{
    BalanceContext, BalancePolicy, DrainBlocked, DrainPlan, TabletKey, TabletLoad, drain as plan,
};
use basalt_meta::MoveRecord;

use super::view::{Known, cluster_view, with_reports};

/// The drain towards a server count, as etcd (and the servers' reports) tell it.
#[derive(Debug, Clone, PartialEq)]
pub struct Drain {
    /// The master's plan; `blocked` also says what stops the master moving anything (and
    /// `moves` is then empty).
    pub plan: DrainPlan,
}

/// What the servers reported, for the capacity checks (empty: unknown, which never blocks).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reports {
    pub volumes: BTreeMap<ServerId, (u64, Option<u64>)>,
    pub loads: BTreeMap<TabletKey, TabletLoad>,
}

/// The drain of `cluster` to `count` servers: `servers` its servers (registered now, and seen
/// before), `tablets` its map, `moves` the move records read around the map.
pub fn drain(
    cluster: &str,
    count: u32,
    servers: &[Known],
    tablets: &TabletMap,
    moves: &[MoveRecord],
    reports: &Reports,
) -> Drain {
    let mut view = cluster_view(
        cluster,
        servers,
        tablets.clone(),
        moves,
        Duration::ZERO,
        Instant::now(),
    );
    with_reports(&mut view, &reports.volumes, &reports.loads);
    let ctx = BalanceContext {
        in_flight: crate::master::moves::in_flight(moves, tablets),
        ..BalanceContext::default()
    };
    let mut plan = plan(&view, count, &ctx, &BalancePolicy::default());

    let lost = tablets
        .tables()
        .flat_map(|t| tablets.tablets(t))
        .filter(|t| t.state == TabletState::Lost)
        .count();
    let mut down: BTreeMap<ServerId, usize> = BTreeMap::new();
    for (id, s) in &view.servers {
        if !s.ready {
            down.insert(id.clone(), view.tablets_of(id).count());
        }
    }
    let name_of = |id: &str| {
        servers
            .iter()
            .find(|s| s.record.store_id == id && s.record.name != id)
            .map_or_else(
                || format!("store {id}"),
                |s| format!("{} (store {id})", s.record.name),
            )
    };
    let gate = if plan.done {
        None
    } else if lost > 0 {
        Some(format!(
            "{lost} tablet(s) of the cluster are lost (see the DataLoss condition), and the master \
             moves no tablet while that is so; restore them or accept the loss, or cancel the \
             scale-in"
        ))
    } else if plan.blocked.is_some() {
        None
    } else if !down.is_empty() {
        let who: Vec<String> = down
            .iter()
            .map(|(id, n)| format!("{} ({n} tablet(s))", name_of(id)))
            .collect();
        Some(format!(
            "{} own(s) tablets or take(s) part in a move but is not registered, and the master \
             moves no tablet while a server of the cluster is down; the drain goes on once it is \
             back, or cancel the scale-in",
            who.join(", ")
        ))
    } else {
        None
    };
    if let Some(reason) = gate {
        plan.moves.clear();
        plan.blocked = Some(DrainBlocked { reason });
    }

    Drain { plan }
}
