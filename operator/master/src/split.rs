//! Splits: which tablets have grown too big or too hot for one piece.
//!
//! A split is a metadata-only transaction on the owner's server (`../shared/DISTRIBUTED.md`):
//! the two halves stay where the tablet was, so the balancer can then move one of them. The
//! master only says which tablet and why; the owner picks the split key, since it knows its
//! rows (a size split from its approximate sizes, a load split from its sampled keys). When the
//! owner finds no split point — one hot row, one huge row — the runtime puts the tablet in
//! [`SplitContext::backing_off`] for a while, so a single hot row never causes a storm of
//! attempts.

use std::collections::BTreeSet;
use std::fmt;

use basalt_model::{Tablet, TabletState};
use bytes::Bytes;

use crate::{ClusterView, MovePlan, TabletKey, TabletLoad, key_of};

/// When a tablet is worth splitting.
#[derive(Clone, Debug, PartialEq)]
pub struct SplitPolicy {
    /// A tablet holding more bytes than this is split (size).
    pub max_tablet_bytes: u64,
    /// A tablet taking more requests per second than this, sustained over the reporting
    /// window, is split (load).
    pub hot_requests_per_sec: f64,
    /// Splits proposed by one pass.
    pub max_splits_per_pass: usize,
}

impl Default for SplitPolicy {
    fn default() -> Self {
        SplitPolicy {
            max_tablet_bytes: 512 << 20,
            hot_requests_per_sec: 2000.0,
            max_splits_per_pass: 4,
        }
    }
}

/// What the runtime knows beyond the view.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SplitContext {
    /// Tablets whose owner recently found no split point: not proposed again meanwhile.
    pub backing_off: BTreeSet<TabletKey>,
    /// The moves running now: their tablets are not split under them.
    pub in_flight: Vec<MovePlan>,
}

/// One tablet to split, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitPlan {
    pub tablet: Tablet,
    pub reason: SplitReason,
}

/// Why a tablet is split; its Display is the label of logs and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SplitReason {
    /// It holds more than [`SplitPolicy::max_tablet_bytes`].
    Size,
    /// It takes more than [`SplitPolicy::hot_requests_per_sec`].
    Load,
}

impl fmt::Display for SplitReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SplitReason::Size => "size",
            SplitReason::Load => "load",
        })
    }
}

/// The tablets to split now: the too big ones first (biggest first), then the too hot ones
/// (hottest first), at most `max_splits_per_pass`; a tablet both big and hot is split for its
/// size. Only Serving tablets of ready owners that are neither moving nor backing off, and
/// that hold more than one possible row.
pub fn splits(view: &ClusterView, ctx: &SplitContext, policy: &SplitPolicy) -> Vec<SplitPlan> {
    // The thresholds first: of a million tablets only the few past them are looked at further
    // (no key built, no set searched per tablet).
    let past: Vec<(&Tablet, TabletLoad)> = view
        .tablets_with_loads()
        .filter(|(_, load)| {
            load.bytes > policy.max_tablet_bytes
                || load.requests_per_sec > policy.hot_requests_per_sec
        })
        .collect();
    let moving: BTreeSet<TabletKey> = ctx.in_flight.iter().map(|m| key_of(&m.tablet)).collect();
    let candidates: Vec<(&Tablet, TabletLoad)> = past
        .into_iter()
        .filter(|(t, _)| splittable(view, t) && !moving.contains(&key_of(t)))
        .filter(|(t, _)| !ctx.backing_off.contains(&key_of(t)))
        .collect();
    let mut big: Vec<(u64, &Tablet)> = candidates
        .iter()
        .map(|&(t, load)| (load.bytes, t))
        .filter(|&(bytes, _)| bytes > policy.max_tablet_bytes)
        .collect();
    big.sort_by_key(|&(bytes, _)| std::cmp::Reverse(bytes));
    let mut hot: Vec<(f64, &Tablet)> = candidates
        .iter()
        .filter(|(_, load)| load.bytes <= policy.max_tablet_bytes)
        .map(|&(t, load)| (load.requests_per_sec, t))
        .filter(|&(rate, _)| rate > policy.hot_requests_per_sec)
        .collect();
    hot.sort_by(|a, b| b.0.total_cmp(&a.0));
    let by_size = big.into_iter().map(|(_, t)| (t, SplitReason::Size));
    let by_load = hot.into_iter().map(|(_, t)| (t, SplitReason::Load));
    by_size
        .chain(by_load)
        .take(policy.max_splits_per_pass)
        .map(|(t, reason)| SplitPlan {
            tablet: t.clone(),
            reason,
        })
        .collect()
}

/// Can `t`'s owner split it now? Serving, its owner ready, and more than one row possible.
fn splittable(view: &ClusterView, t: &Tablet) -> bool {
    t.state == TabletState::Serving
        && view.servers.get(&t.owner).is_some_and(|s| s.ready)
        && !t.range.is_single_row()
}

/// The two halves of `tablet` split at row `at`: `[start, at)` and `[at, end)`, both at the
/// next epoch (readers of the old record must see it changed), same owner and state. None when
/// `at` is not strictly inside the range (at its start, at or after its end, or empty): each
/// half must hold rows.
pub fn split_tablet(tablet: &Tablet, at: &Bytes) -> Option<(Tablet, Tablet)> {
    let inside = *at > tablet.range.start && tablet.range.end.as_ref().is_none_or(|end| at < end);
    if !inside {
        return None;
    }
    let half = |start: Bytes, end: Option<Bytes>| Tablet {
        range: basalt_model::RowRange::new(start, end),
        epoch: tablet.epoch + 1,
        ..tablet.clone()
    };
    Some((
        half(tablet.range.start.clone(), Some(at.clone())),
        half(at.clone(), tablet.range.end.clone()),
    ))
}

#[cfg(test)]
mod tests {
    use basalt_model::{RowRange, TabletMap};

    use super::*;
    use crate::MoveReason;
    use crate::fixture::{ViewBuilder, tablet_key};

    const MIB: u64 = 1 << 20;

    fn proposed(plans: &[SplitPlan]) -> Vec<(&str, String)> {
        plans
            .iter()
            .map(|p| {
                (
                    std::str::from_utf8(&p.tablet.range.start).unwrap(),
                    p.reason.to_string(),
                )
            })
            .collect()
    }

    /// Table "t" at a…f on s0, s1, s0, s1, s0, s1 (tablet "" first), with loads.
    fn view() -> ClusterView {
        ViewBuilder::new("c1")
            .servers(2)
            .table("t", &["a", "b", "c", "d", "e"], &[0, 1, 0, 1, 0, 1])
            .load("t", "", 100 * MIB, 50.0)
            .load("t", "a", 600 * MIB, 10.0)
            .load("t", "b", 2048 * MIB, 5000.0)
            .load("t", "c", 10 * MIB, 2500.0)
            .load("t", "d", 10 * MIB, 9000.0)
            .load("t", "e", 512 * MIB, 2000.0)
            .build()
    }

    #[test]
    fn size_comes_before_load() {
        let plans = splits(&view(), &SplitContext::default(), &SplitPolicy::default());
        // b is big and hot: split for its size. e is exactly at both limits: not split.
        assert_eq!(
            proposed(&plans),
            [
                ("b", "size".into()),
                ("a", "size".into()),
                ("d", "load".into()),
                ("c", "load".into())
            ]
        );
        assert_eq!(plans[0].tablet, view().tablets.tablets("t")[2]);
        let two = SplitPolicy {
            max_splits_per_pass: 2,
            ..SplitPolicy::default()
        };
        assert_eq!(
            proposed(&splits(&view(), &SplitContext::default(), &two)),
            [("b", "size".into()), ("a", "size".into())]
        );
    }

    #[test]
    fn moving_lost_and_unready_tablets_are_left_alone() {
        let v = view();
        let ctx = SplitContext {
            in_flight: vec![MovePlan {
                tablet: v.tablets.tablets("t")[2].clone(),
                from: "s1".into(),
                to: "s0".into(),
                reason: MoveReason::Balance,
            }],
            ..SplitContext::default()
        };
        let plans = splits(&v, &ctx, &SplitPolicy::default());
        assert!(
            plans.iter().all(|p| p.tablet.range.start != "b"),
            "{plans:?}"
        );
        // s1 down: only s0's tablets ("", b, d).
        let mut down = view();
        down.servers.get_mut("s1").unwrap().ready = false;
        let plans = splits(&down, &SplitContext::default(), &SplitPolicy::default());
        assert_eq!(
            proposed(&plans),
            [("b", "size".into()), ("d", "load".into())]
        );
        // s1's tablets Lost: same.
        let mut lost = ViewBuilder::new("c1")
            .servers(2)
            .table("t", &["a", "b", "c", "d", "e"], &[0, 1, 0, 1, 0, 1])
            .replace(1, std::time::Duration::from_secs(60))
            .lost(1)
            .build();
        lost.loads = view().loads;
        let plans = splits(&lost, &SplitContext::default(), &SplitPolicy::default());
        assert_eq!(
            proposed(&plans),
            [("b", "size".into()), ("d", "load".into())]
        );
    }

    #[test]
    fn a_hot_row_backs_off_instead_of_storming() {
        // One tablet, hot because of a single row: proposed once; the owner finds no split
        // point, the runtime backs off, and the next passes propose nothing.
        let view = ViewBuilder::new("c1")
            .servers(1)
            .table("t", &["m"], &[0, 0])
            .load("t", "m", 1024, 50_000.0)
            .build();
        let mut ctx = SplitContext::default();
        let first = splits(&view, &ctx, &SplitPolicy::default());
        assert_eq!(proposed(&first), [("m", "load".into())]);
        ctx.backing_off.insert(key_of(&first[0].tablet));
        for _ in 0..3 {
            assert!(splits(&view, &ctx, &SplitPolicy::default()).is_empty());
        }
        // Once the back-off is over, it may be tried again.
        ctx.backing_off.remove(&tablet_key("t", "m"));
        assert_eq!(splits(&view, &ctx, &SplitPolicy::default()).len(), 1);
    }

    #[test]
    fn a_single_row_tablet_is_never_proposed() {
        let row = RowRange::key(b"hot");
        let tablets = vec![
            Tablet {
                table: "t".into(),
                range: RowRange::new(Bytes::new(), Some(row.start.clone())),
                epoch: 1,
                owner: "s0".into(),
                state: TabletState::Serving,
            },
            Tablet {
                table: "t".into(),
                range: row.clone(),
                epoch: 1,
                owner: "s0".into(),
                state: TabletState::Serving,
            },
            Tablet {
                table: "t".into(),
                range: RowRange::new(row.end.clone().unwrap(), None),
                epoch: 1,
                owner: "s0".into(),
                state: TabletState::Serving,
            },
        ];
        let mut view = ViewBuilder::new("c1").servers(1).build();
        view.tablets = TabletMap::new(tablets).unwrap();
        std::sync::Arc::make_mut(&mut view.loads).insert(
            ("t".into(), row.start.clone()),
            crate::TabletLoad {
                bytes: 4 << 30,
                requests_per_sec: 1e6,
            },
        );
        assert!(splits(&view, &SplitContext::default(), &SplitPolicy::default()).is_empty());
    }

    #[test]
    fn nothing_to_split() {
        let empty = ViewBuilder::new("c1").build();
        assert!(splits(&empty, &SplitContext::default(), &SplitPolicy::default()).is_empty());
        let idle = ViewBuilder::new("c1")
            .servers(3)
            .table("t", &["m"], &[0, 1])
            .build();
        assert!(splits(&idle, &SplitContext::default(), &SplitPolicy::default()).is_empty());
        let none = SplitPolicy {
            max_splits_per_pass: 0,
            ..SplitPolicy::default()
        };
        assert!(splits(&view(), &SplitContext::default(), &none).is_empty());
    }

    #[test]
    fn split_tablet_makes_two_halves_at_the_next_epoch() {
        let view = ViewBuilder::new("c1")
            .servers(2)
            .table("t", &["g", "p"], &[0, 1, 0])
            .build();
        let middle = view.tablets.tablets("t")[1].clone();
        let (low, high) = split_tablet(&middle, &Bytes::from_static(b"k")).unwrap();
        assert_eq!(
            low.range,
            RowRange::new(Bytes::from_static(b"g"), Some(Bytes::from_static(b"k")))
        );
        assert_eq!(
            high.range,
            RowRange::new(Bytes::from_static(b"k"), Some(Bytes::from_static(b"p")))
        );
        for half in [&low, &high] {
            assert_eq!((half.epoch, half.owner.as_str()), (2, "s1"));
            assert_eq!(
                (half.table.as_str(), half.state),
                ("t", TabletState::Serving)
            );
        }
        // The halves replace the tablet in a valid map.
        let t = view.tablets.tablets("t");
        TabletMap::new([t[0].clone(), low, high, t[2].clone()]).unwrap();
        // The last tablet (no end) splits too; the first from just after its empty start.
        let last = &t[2];
        let (_, high) = split_tablet(last, &Bytes::from_static(b"z")).unwrap();
        assert_eq!(high.range.end, None);
        assert!(split_tablet(&t[0], &Bytes::from_static(b"\0")).is_some());
        // Not strictly inside: none.
        for at in ["", "g", "p", "q", "a"] {
            assert_eq!(
                split_tablet(&middle, &Bytes::copy_from_slice(at.as_bytes())),
                None,
                "{at:?}"
            );
        }
        assert_eq!(split_tablet(&t[0], &Bytes::new()), None);
    }

    #[test]
    fn reasons_read_well() {
        assert_eq!(SplitReason::Size.to_string(), "size");
        assert_eq!(SplitReason::Load.to_string(), "load");
    }
}
