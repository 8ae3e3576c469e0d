//! The health and latency table of the instance's clusters, as one server sees them: which
//! clusters have registered servers (etcd), which are being seeded, and how this server's
//! calls to each went. Pure: the caller passes the time.
//!
//! A cluster whose call failed before it was delivered (refused, unreachable), or did not
//! answer within its patience, is down for [`DOWN_FOR`]: multi-cluster requests skip it meanwhile, then one request tries it again. A
//! call that answers puts it back at once. Latency is a moving average of answered calls, per
//! method: the patience of a scan, whose first answer may take a while, is drawn from scans,
//! not from the point reads beside it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::decide::{ClusterView, Method};

/// How long a cluster that refused a call is skipped by multi-cluster routing.
pub const DOWN_FOR: Duration = Duration::from_secs(1);

/// The shortest and longest time a request that is safe to send again waits for a cluster
/// before it goes to the next one (see [`Health::patience`]).
pub const PATIENCE_MIN: Duration = Duration::from_millis(250);
pub const PATIENCE_MAX: Duration = Duration::from_secs(2);

#[derive(Clone, Debug, Default)]
struct Calls {
    down_until: Option<Instant>,
    latency: BTreeMap<Method, Duration>,
}

/// See the module.
#[derive(Clone, Debug, Default)]
pub struct Health {
    /// Registered servers per cluster (from etcd).
    registered: BTreeMap<String, usize>,
    seeding: BTreeSet<String>,
    removing: BTreeSet<String>,
    calls: BTreeMap<String, Calls>,
}

impl Health {
    /// The clusters of the instance now: `registered` servers per cluster (every cluster of
    /// the instance, with 0 for one without live servers), `seeding` the clusters still being
    /// copied, `removing` those leaving the instance.
    pub fn set_clusters(
        &mut self,
        registered: BTreeMap<String, usize>,
        seeding: BTreeSet<String>,
        removing: BTreeSet<String>,
    ) {
        self.calls.retain(|c, _| registered.contains_key(c));
        self.registered = registered;
        self.seeding = seeding;
        self.removing = removing;
    }

    /// Whether `cluster` is leaving the instance.
    pub fn removing(&self, cluster: &str) -> bool {
        self.removing.contains(cluster)
    }

    /// A call of `method` to `cluster` answered after `elapsed`.
    pub fn answered(&mut self, cluster: &str, method: Method, elapsed: Duration) {
        let calls = self.calls.entry(cluster.to_string()).or_default();
        calls.down_until = None;
        calls
            .latency
            .entry(method)
            .and_modify(|avg| *avg = (*avg * 4 + elapsed) / 5)
            .or_insert(elapsed);
    }

    /// A call to `cluster` was not delivered (refused, unreachable): skip it for a while.
    pub fn refused(&mut self, cluster: &str, now: Instant) {
        self.calls
            .entry(cluster.to_string())
            .or_default()
            .down_until = Some(now + DOWN_FOR);
    }

    /// A call to `cluster` took `waited` without an answer and went elsewhere: skipped for a
    /// while, as after a refusal (a partitioned cluster does not refuse, it is silent), and
    /// given more patience when tried again.
    pub fn slow(&mut self, cluster: &str, method: Method, waited: Duration, now: Instant) {
        let calls = self.calls.entry(cluster.to_string()).or_default();
        calls
            .latency
            .entry(method)
            .and_modify(|avg| *avg = (*avg).max(waited))
            .or_insert(waited);
        calls.down_until = Some(now + DOWN_FOR);
    }

    /// The clusters as [`super::decide::plan`] takes them.
    pub fn view(&self, now: Instant) -> Vec<ClusterView> {
        self.registered
            .iter()
            .map(|(name, &servers)| {
                let calls = self.calls.get(name);
                let refused = calls
                    .and_then(|c| c.down_until)
                    .is_some_and(|until| now < until);
                ClusterView {
                    name: name.clone(),
                    healthy: servers > 0 && !refused,
                    ready: !self.seeding.contains(name),
                    removing: self.removing.contains(name),
                    // How near it is: its fastest method's latency.
                    latency: calls.and_then(|c| c.latency.values().min().copied()),
                }
            })
            .collect()
    }

    /// How long a request of `method` that is safe to send again waits for `cluster` before
    /// trying the next one: a few times the method's recent latency there, within
    /// [`PATIENCE_MIN`, `PATIENCE_MAX`].
    pub fn patience(&self, cluster: &str, method: Method) -> Duration {
        let latency = self
            .calls
            .get(cluster)
            .and_then(|c| c.latency.get(&method).copied())
            .unwrap_or(PATIENCE_MIN);
        (latency * 5).clamp(PATIENCE_MIN, PATIENCE_MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health() -> Health {
        let mut h = Health::default();
        h.set_clusters(
            [
                ("a".to_string(), 2),
                ("b".to_string(), 1),
                ("c".to_string(), 0),
            ]
            .into(),
            ["b".to_string()].into(),
            BTreeSet::new(),
        );
        h
    }

    #[test]
    fn registrations_seeding_and_refusals_make_the_view() {
        let mut h = health();
        let t0 = Instant::now();
        let v = h.view(t0);
        assert_eq!(
            v.iter()
                .map(|c| (c.name.as_str(), c.healthy, c.ready))
                .collect::<Vec<_>>(),
            [("a", true, true), ("b", true, false), ("c", false, true)]
        );
        h.refused("a", t0);
        assert!(!h.view(t0 + DOWN_FOR / 2)[0].healthy);
        assert!(
            h.view(t0 + DOWN_FOR)[0].healthy,
            "tried again after a while"
        );
        h.refused("a", t0);
        h.answered("a", Method::MutateRow, Duration::from_millis(3));
        assert!(h.view(t0)[0].healthy, "an answer puts it back at once");
    }

    #[test]
    fn patience_follows_latency_within_bounds() {
        let mut h = health();
        let m = Method::MutateRow;
        assert_eq!(h.patience("a", m), PATIENCE_MIN * 5);
        h.answered("a", m, Duration::from_millis(1));
        assert_eq!(h.patience("a", m), PATIENCE_MIN);
        for _ in 0..20 {
            h.answered("a", m, Duration::from_millis(200));
        }
        let p = h.patience("a", m);
        assert!(
            p > Duration::from_millis(900) && p <= Duration::from_secs(1),
            "{p:?}"
        );
        let t0 = Instant::now();
        h.slow("a", m, Duration::from_secs(3), t0);
        assert_eq!(h.patience("a", m), PATIENCE_MAX);
        assert!(
            !h.view(t0)[0].healthy,
            "a silent cluster is skipped for a while"
        );
        assert_eq!(
            h.view(Instant::now())[0].latency,
            Some(Duration::from_secs(3))
        );
    }

    #[test]
    fn each_method_has_its_own_patience_and_the_fastest_says_how_near() {
        let mut h = health();
        for _ in 0..20 {
            h.answered("a", Method::ReadRows, Duration::from_millis(300));
            h.answered("a", Method::MutateRow, Duration::from_millis(2));
        }
        // Fast point writes do not make a scan that takes a while to answer look silent.
        let scans = h.patience("a", Method::ReadRows);
        assert!(scans >= Duration::from_millis(1400), "{scans:?}");
        assert_eq!(h.patience("a", Method::MutateRow), PATIENCE_MIN);
        // A method not called yet gets the starting patience.
        assert_eq!(h.patience("a", Method::SampleRowKeys), PATIENCE_MIN * 5);
        let near = h.view(Instant::now())[0].latency.unwrap();
        assert!(near < Duration::from_millis(3), "{near:?}");
    }
}
