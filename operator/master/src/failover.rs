//! When a tablet server is gone for good, and what becomes of its tablets.
//!
//! A server that is merely down keeps its tablets: when it restarts on its data directory it
//! keeps its store id and serves them again, untouched. A server is **lost** only when its name
//! (pod name, `<cluster>-<ordinal>`) is registered again under a *different* store id — it came
//! back with a new data directory, so the old one is gone — and its old registration has been
//! absent for at least the lease TTL plus a margin larger than the servers' grace. By then the
//! old owner's serving deadline (last keep-alive + TTL + grace) has passed on its own clock
//! (`../shared/DISTRIBUTED.md`), so nobody serves its tablets any more.
//!
//! Its tablets then become Lost (same owner, same epoch): they answer UNAVAILABLE rather than
//! being handed out empty. Only an administrator turns them into empty tablets elsewhere
//! ([`crate::placement::accept_loss`]), after restoring what could be restored.

use std::time::{Duration, Instant};

use basalt_model::{ServerId, Tablet, TabletState};

use crate::ClusterView;

/// How long `server`'s registration has been absent at `now` (None: registered now, or not
/// known to the view).
fn absent_for(view: &ClusterView, server: &str, now: Instant) -> Option<Duration> {
    let since = view.presence.get(server)?.absent_since?;
    Some(now.saturating_duration_since(since))
}

/// Has `server` been absent long enough for its serving deadline to have passed for sure?
fn past_deadline(view: &ClusterView, server: &str, now: Instant, margin: Duration) -> bool {
    absent_for(view, server, now).is_some_and(|absent| absent >= view.lease_ttl + margin)
}

/// The servers that are gone for good: absent for at least the lease TTL + `margin` AND their
/// name registered now under another store id. `margin` must exceed the servers' grace.
/// Sorted by store id.
pub fn lost_servers(view: &ClusterView, now: Instant, margin: Duration) -> Vec<ServerId> {
    view.presence
        .iter()
        .filter(|(id, _)| past_deadline(view, id, now, margin))
        .filter(|(id, presence)| {
            view.presence.iter().any(|(other, p)| {
                other != *id && p.name == presence.name && p.absent_since.is_none()
            })
        })
        .map(|(id, _)| id.clone())
        .collect()
}

/// The servers among `accepted` (named by an administrator) that are absent for at least the
/// lease TTL + `margin`: lost because the administrator says so, even if their name never came
/// back (a pod deleted with its volume). A server registered now, or absent for less, is not.
pub fn accepted_lost(
    view: &ClusterView,
    accepted: &[ServerId],
    now: Instant,
    margin: Duration,
) -> Vec<ServerId> {
    accepted
        .iter()
        .filter(|id| past_deadline(view, id, now, margin))
        .cloned()
        .collect()
}

/// The tablets of the `lost` servers that are still Serving, each with its Lost record (same
/// owner and epoch): pairs of (record now, record to write), in table and key order.
pub fn mark_lost(view: &ClusterView, lost: &[ServerId]) -> Vec<(Tablet, Tablet)> {
    let mut changes = Vec::new();
    for table in view.tablets.tables() {
        for t in view.tablets.tablets(table) {
            if t.state == TabletState::Serving && lost.contains(&t.owner) {
                let new = Tablet {
                    state: TabletState::Lost,
                    ..t.clone()
                };
                changes.push((t.clone(), new));
            }
        }
    }
    changes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixture::{ViewBuilder, now};

    const MARGIN: Duration = Duration::from_secs(15);
    // The fixture's lease TTL is 10 s: lost after 25 s of absence.

    #[test]
    fn a_server_that_is_merely_down_is_never_lost() {
        let view = ViewBuilder::new("c1")
            .servers(3)
            .table("t", &["m"], &[0, 1])
            .absent(1, Duration::from_secs(3600))
            .build();
        assert!(lost_servers(&view, now(), MARGIN).is_empty());
    }

    #[test]
    fn a_replaced_server_is_lost_only_after_ttl_and_margin() {
        let lost_after = |absent: u64| {
            let view = ViewBuilder::new("c1")
                .servers(3)
                .table("t", &["m"], &[0, 1])
                .replace(1, Duration::from_secs(absent))
                .build();
            lost_servers(&view, now(), MARGIN)
        };
        assert!(
            lost_after(5).is_empty(),
            "replaced, but absent for only 5 s"
        );
        assert!(lost_after(24).is_empty(), "24 s < TTL 10 s + margin 15 s");
        assert_eq!(lost_after(25), ["s1"]);
        assert_eq!(lost_after(3600), ["s1"]);
    }

    #[test]
    fn a_new_master_counts_absence_from_its_own_start() {
        // The master was elected 2 s ago and found s1 missing and replaced: however long s1
        // was really gone, its absence is counted from the election.
        let elected = now() - Duration::from_secs(2);
        let mut view = ViewBuilder::new("c1")
            .servers(2)
            .table("t", &[], &[1])
            .replace(1, Duration::ZERO)
            .build();
        view.presence.get_mut("s1").unwrap().absent_since = Some(elected);
        assert!(lost_servers(&view, now(), MARGIN).is_empty());
        assert_eq!(
            lost_servers(&view, elected + Duration::from_secs(25), MARGIN),
            ["s1"]
        );
    }

    #[test]
    fn a_replacement_that_is_itself_absent_proves_nothing_yet() {
        // The name came back under s1-new, which is absent again now: the name is not
        // registered under another store id at the moment, so s1 is not declared lost.
        let mut view = ViewBuilder::new("c1")
            .servers(2)
            .table("t", &[], &[1])
            .replace(1, Duration::from_secs(600))
            .build();
        view.presence.get_mut("s1-new").unwrap().absent_since = Some(now());
        assert!(lost_servers(&view, now(), MARGIN).is_empty());
    }

    #[test]
    fn the_loss_of_a_server_that_never_came_back_is_accepted_after_its_deadline() {
        let view = ViewBuilder::new("c1")
            .servers(3)
            .absent(1, Duration::from_secs(60))
            .absent(2, Duration::from_secs(10))
            .build();
        let accepted = ["s0".to_string(), "s1".into(), "s2".into()];
        // s0 is registered, s2 absent for too short: only s1.
        assert_eq!(accepted_lost(&view, &accepted, now(), MARGIN), ["s1"]);
    }

    #[test]
    fn marking_lost_keeps_owner_and_epoch() {
        let view = ViewBuilder::new("c1")
            .servers(3)
            .table("t", &["g", "p"], &[1, 0, 1])
            .table("u", &[], &[1])
            .replace(1, Duration::from_secs(60))
            .build();
        let changes = mark_lost(&view, &["s1".to_string()]);
        assert_eq!(changes.len(), 3);
        for (old, new) in &changes {
            assert_eq!(old.state, TabletState::Serving);
            assert_eq!(new.state, TabletState::Lost);
            assert_eq!((&new.owner, new.epoch), (&old.owner, old.epoch));
            assert_eq!(new.range, old.range);
        }
        // Tablets already Lost are not written again.
        let marked = ViewBuilder::new("c1")
            .servers(2)
            .table("t", &["g"], &[1, 1])
            .replace(1, Duration::from_secs(60))
            .lost(1)
            .build();
        assert!(mark_lost(&marked, &["s1".to_string()]).is_empty());
        assert!(mark_lost(&view, &[]).is_empty());
    }
}
