//! Where tablets go when nobody owns them yet: the tablets of a new table, and the tablets of a
//! server whose loss an administrator accepted.
//!
//! One rule for both: each tablet goes to the ready server that owns the fewest tablets (over
//! every table, counting the ones just placed), the lowest ordinal first on a tie. Placing
//! tablets one by one this way keeps the counts of the ready servers within one of each other
//! when they start so, so over many tables every server stays within one tablet of its share.
//! Sizes and loads are the balancer's business (moves), not the placement's: a new tablet is
//! empty, and an accepted loss re-creates its tablets empty.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use basalt_model::{RowRange, ServerId, Tablet, TabletState};

use crate::ClusterView;

/// The ready servers with the number of tablets each owns, in placement order.
struct Counts<'a> {
    /// (tablets owned, ordinal, store id) of each ready server, the least loaded on top.
    servers: BinaryHeap<Reverse<(usize, u32, &'a ServerId)>>,
}

impl<'a> Counts<'a> {
    /// One walk of the map; a heap keeps the next server at hand, so placing a table of many
    /// tablets on thousands of servers costs a logarithm per tablet, not a scan.
    fn of(view: &'a ClusterView) -> Counts<'a> {
        let mut owned: HashMap<&str, usize> = HashMap::with_capacity(view.servers.len());
        for table in view.tablets.tables() {
            for t in view.tablets.tablets(table) {
                *owned.entry(t.owner.as_str()).or_default() += 1;
            }
        }
        let servers = view
            .servers
            .values()
            .filter(|s| s.ready)
            .map(|s| {
                Reverse((
                    owned.get(s.id.as_str()).copied().unwrap_or(0),
                    s.ordinal,
                    &s.id,
                ))
            })
            .collect();
        Counts { servers }
    }

    /// The least loaded server (lowest ordinal, then store id, on a tie), now owning one more.
    fn take(&mut self) -> Option<ServerId> {
        let Reverse((owned, ordinal, id)) = self.servers.pop()?;
        self.servers.push(Reverse((owned + 1, ordinal, id)));
        Some(id.clone())
    }
}

/// The tablets of a new table `table` (one per range, in the order given), epoch 1, Serving,
/// spread over the cluster's ready servers. Empty when the cluster has no ready server: the
/// caller waits for one rather than assigning to a server that cannot serve.
pub fn assign_new_table(view: &ClusterView, table: &str, ranges: &[RowRange]) -> Vec<Tablet> {
    let mut counts = Counts::of(view);
    let mut tablets = Vec::with_capacity(ranges.len());
    for range in ranges {
        let Some(owner) = counts.take() else {
            return Vec::new();
        };
        tablets.push(Tablet {
            table: table.to_string(),
            range: range.clone(),
            epoch: 1,
            owner,
            state: TabletState::Serving,
        });
    }
    tablets
}

/// An administrator accepted that the data of the `accepted` servers is gone: each of their
/// Lost tablets is given, empty, to a ready server (spread like a new table's), at the next
/// epoch and Serving. Pairs of (record now, record to write), in table and key order.
///
/// Only Lost tablets move: a tablet becomes Lost only once its owner's serving deadline has
/// surely passed ([`crate::failover`]), so no server still serves the old epoch. Nothing moves
/// when the cluster has no ready server.
pub fn accept_loss(view: &ClusterView, accepted: &[ServerId]) -> Vec<(Tablet, Tablet)> {
    let mut counts = Counts::of(view);
    counts
        .servers
        .retain(|Reverse((_, _, id))| !accepted.contains(id));
    let mut changes = Vec::new();
    for table in view.tablets.tables() {
        for old in view.tablets.tablets(table) {
            if old.state != TabletState::Lost || !accepted.contains(&old.owner) {
                continue;
            }
            let Some(owner) = counts.take() else {
                return Vec::new();
            };
            let new = Tablet {
                owner,
                epoch: old.epoch + 1,
                state: TabletState::Serving,
                ..old.clone()
            };
            changes.push((old.clone(), new));
        }
    }
    changes
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;

    use super::*;
    use crate::fixture::{ViewBuilder, ranges};

    fn owners(tablets: &[Tablet]) -> Vec<&str> {
        tablets.iter().map(|t| t.owner.as_str()).collect()
    }

    #[test]
    fn a_new_table_is_spread_over_the_ready_servers() {
        let view = ViewBuilder::new("c1").servers(3).build();
        let r = ranges(&["b", "c", "d", "e", "f", "g", "h"]);
        let tablets = assign_new_table(&view, "t", &r);
        assert_eq!(
            owners(&tablets),
            ["s0", "s1", "s2", "s0", "s1", "s2", "s0", "s1"]
        );
        for (t, range) in tablets.iter().zip(&r) {
            assert_eq!(t.range, *range);
            assert_eq!((t.table.as_str(), t.epoch), ("t", 1));
            assert_eq!(t.state, TabletState::Serving);
        }
        // The result is a valid tablet map of the table.
        basalt_model::TabletMap::new(tablets).unwrap();
    }

    #[test]
    fn the_least_loaded_servers_come_first() {
        // s0 owns 3 tablets, s1 one, s2 none.
        let view = ViewBuilder::new("c1")
            .servers(3)
            .table("old", &["g", "p"], &[0, 0, 0])
            .table("other", &[], &[1])
            .build();
        let tablets = assign_new_table(&view, "t", &ranges(&["b", "c", "d"]));
        assert_eq!(owners(&tablets), ["s2", "s1", "s2", "s1"]);
    }

    #[test]
    fn servers_that_are_not_ready_get_nothing() {
        let view = ViewBuilder::new("c1").servers(3).down(0).build();
        let tablets = assign_new_table(&view, "t", &ranges(&["m"]));
        assert_eq!(owners(&tablets), ["s1", "s2"]);
        let none = ViewBuilder::new("c1").servers(2).down(0).down(1).build();
        assert!(assign_new_table(&none, "t", &ranges(&["m"])).is_empty());
        let empty = ViewBuilder::new("c1").build();
        assert!(assign_new_table(&empty, "t", &ranges(&[])).is_empty());
    }

    #[test]
    fn over_many_tables_every_server_stays_within_one_of_its_share() {
        // A deterministic mix of table sizes (1 to 13 tablets) over 5 servers, one of them
        // joining late (it starts empty and catches up).
        let mut view = ViewBuilder::new("c1").servers(4).build();
        let mut all: Vec<Tablet> = Vec::new();
        let mut seed = 7u64;
        for i in 0..60 {
            if i == 20 {
                view = ViewBuilder::new("c1").servers(5).build();
                view.tablets = basalt_model::TabletMap::new(all.clone()).unwrap();
            }
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let splits = (seed >> 33) % 13;
            let keys: Vec<String> = (0..splits).map(|k| format!("k{k:02}")).collect();
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            let table = format!("t{i}");
            let tablets = assign_new_table(&view, &table, &ranges(&keys));
            assert_eq!(tablets.len() as u64, splits + 1);
            all.extend(tablets);
            view.tablets = basalt_model::TabletMap::new(all.clone()).unwrap();
            if i >= 40 {
                let counts: Vec<usize> = view
                    .servers
                    .keys()
                    .map(|s| view.server_load(s).tablets)
                    .collect();
                let (min, max) = (counts.iter().min(), counts.iter().max());
                assert!(max.unwrap() - min.unwrap() <= 1, "table {i}: {counts:?}");
            }
        }
    }

    #[test]
    fn accepted_losses_are_reassigned_empty_at_the_next_epoch() {
        // s1's store was replaced by s1-new (same name), its tablets are Lost; s0 and s1-new
        // are ready.
        let view = ViewBuilder::new("c1")
            .servers(3)
            .table("t", &["d", "h", "m", "r"], &[0, 1, 1, 2, 1])
            .table("u", &[], &[1])
            .replace(1, Duration::from_secs(60))
            .down(2)
            .lost(1)
            .build();
        let changes = accept_loss(&view, &["s1".to_string()]);
        assert_eq!(changes.len(), 4);
        for (old, new) in &changes {
            assert_eq!(old.owner, "s1");
            assert_eq!(old.state, TabletState::Lost);
            assert_eq!(
                (new.table.as_str(), &new.range),
                (old.table.as_str(), &old.range)
            );
            assert_eq!(new.epoch, old.epoch + 1);
            assert_eq!(new.state, TabletState::Serving);
            assert!(new.owner == "s0" || new.owner == "s1-new", "{new}");
        }
        // s0 owned one tablet, s1-new none: 2 and 2 after.
        let to: Vec<&str> = changes.iter().map(|(_, n)| n.owner.as_str()).collect();
        assert_eq!(to, ["s1-new", "s0", "s1-new", "s0"]);
        assert_eq!(changes[0].0.range.start, Bytes::from_static(b"d"));
        // s2 is down, not lost: untouched. Nobody accepted s2's loss: nothing for it.
        assert!(accept_loss(&view, &["s2".to_string()]).is_empty());
        assert!(accept_loss(&view, &[]).is_empty());
    }

    #[test]
    fn only_lost_tablets_move_and_only_to_ready_servers() {
        // s1 is down but its tablets are not Lost: accepting does nothing yet.
        let view = ViewBuilder::new("c1")
            .servers(2)
            .table("t", &["m"], &[0, 1])
            .down(1)
            .build();
        assert!(accept_loss(&view, &["s1".to_string()]).is_empty());
        // Lost, but no ready server to take them: nothing moves.
        let view = ViewBuilder::new("c1")
            .servers(1)
            .table("t", &[], &[0])
            .down(0)
            .lost(0)
            .build();
        assert!(accept_loss(&view, &["s0".to_string()]).is_empty());
    }
}
