//! Replication between an instance's clusters as its status shows it, the same way on
//! Kubernetes (the Instance's status) and in the local runtime (`local status`): per pair of
//! clusters (source → destination), how far behind the destination is, from the positions the
//! source's servers report in etcd (`shipped/`, [`basalt_meta::ShippedRecord`]), and the
//! clusters still being seeded (`seeds/`, [`basalt_meta::SeedRecord`]). [`observe`] is the
//! one read of etcd; the rest is pure.

use std::time::Duration;

use basalt_meta::{Meta, SeedRecord, ShippedRecord};

/// A destination is degraded when a write of the source has waited this long for it.
pub const DEGRADED_AFTER: Duration = Duration::from_secs(60);

/// How one cluster's writes reach another.
#[derive(Debug, Clone, PartialEq)]
pub struct Pair {
    pub source: String,
    pub destination: String,
    /// The age of the oldest write of the source the destination has not acknowledged, in
    /// seconds (0: caught up), as of now.
    pub max_delay_seconds: f64,
    /// Change log entries of the source's servers the destination has not acknowledged.
    pub pending_entries: u64,
}

/// A cluster that joined the instance with data, being seeded.
#[derive(Debug, Clone, PartialEq)]
pub struct Seeding {
    pub cluster: String,
    /// The cluster it is copied from (None: waiting for every other server to log for it).
    pub source: Option<String>,
    /// Tables not yet copied completely.
    pub tables_left: usize,
    /// Rows (stored entries) and bytes copied so far.
    pub rows: u64,
    pub bytes: u64,
}

impl Seeding {
    pub fn of(record: &SeedRecord) -> Seeding {
        Seeding {
            cluster: record.cluster.clone(),
            source: record.source.clone(),
            tables_left: record.tables.len(),
            rows: record.rows,
            bytes: record.bytes,
        }
    }

    /// One line, e.g. "c: copying from a, 2 table(s) left, 1200 entries (3.1 MiB) copied".
    pub fn describe(&self) -> String {
        match &self.source {
            None => format!(
                "{}: initializing, waiting for every other server to log for it",
                self.cluster
            ),
            Some(source) => format!(
                "{}: initializing, copying from {source}, {} table(s) left, {} entries ({:.1} MiB) copied",
                self.cluster,
                self.tables_left,
                self.rows,
                self.bytes as f64 / (1u64 << 20) as f64
            ),
        }
    }
}

/// How replication stands in an instance.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Replication {
    pub pairs: Vec<Pair>,
    pub seeding: Vec<Seeding>,
    /// Clusters that left the runtime's manifests but stay replicas until their writes are in
    /// a cluster that stays: why each one is held ([`super::removal::departed`]). Filled by
    /// [`observe_leaving`].
    pub leaving: Vec<String>,
}

impl Replication {
    /// The pairs as a status shows them (delays to the millisecond): the Instance's status and
    /// `local.json`.
    pub fn shown_pairs(&self) -> Vec<crate::crd::ReplicationStatus> {
        self.pairs
            .iter()
            .map(|p| crate::crd::ReplicationStatus {
                source: p.source.clone(),
                destination: p.destination.clone(),
                max_delay_seconds: (p.max_delay_seconds * 1000.0).round() / 1000.0,
                pending_writes: p.pending_entries,
            })
            .collect()
    }

    /// The seeding as a status shows it.
    pub fn shown_seeding(&self) -> Vec<crate::crd::SeedingStatus> {
        self.seeding
            .iter()
            .map(|s| crate::crd::SeedingStatus {
                cluster: s.cluster.clone(),
                source: s.source.clone(),
                tables_left: s.tables_left as u64,
                entries_copied: s.rows,
                bytes_copied: s.bytes,
            })
            .collect()
    }
}

/// Reads how replication stands from etcd.
pub async fn observe(meta: &Meta) -> basalt_master::model::Result<Replication> {
    let clusters: Vec<String> = meta.cluster_numbers().await?.into_keys().collect();
    let shipped = meta.shipped().await?;
    let seeds = meta.seeds().await?;
    Ok(Replication {
        pairs: pairs(&clusters, &shipped, basalt_master::model::hlc::now_micros()),
        seeding: seeds.values().map(Seeding::of).collect(),
        leaving: Vec::new(),
    })
}

/// Puts into `replication` why each cluster that is not among `declared` (the Clusters the
/// runtime knows) and whose servers are gone is still a replica (the removal decision,
/// [`super::removal::departed`]).
pub async fn observe_leaving(
    meta: &Meta,
    declared: &[String],
    replication: &mut Replication,
) -> basalt_master::model::Result<()> {
    replication.leaving = super::removal::departed(meta, declared)
        .await?
        .into_iter()
        .filter_map(|(_, verdict)| verdict.err().map(|refused| refused.to_string()))
        .collect();
    Ok(())
}

/// Every ordered pair of `clusters` (the instance's replicas), from the servers' reports.
/// A report with entries pending ages with the time since it was made (a server that stopped
/// reporting while behind counts as ever more behind).
pub fn pairs(clusters: &[String], shipped: &[ShippedRecord], now_micros: i64) -> Vec<Pair> {
    let mut out = Vec::new();
    for source in clusters {
        for destination in clusters.iter().filter(|c| *c != source) {
            let mut pair = Pair {
                source: source.clone(),
                destination: destination.clone(),
                max_delay_seconds: 0.0,
                pending_entries: 0,
            };
            for r in shipped
                .iter()
                .filter(|r| r.cluster == *source && r.peer == *destination)
            {
                let pending = r.logged_seq.saturating_sub(r.acked_seq);
                if pending == 0 {
                    continue;
                }
                pair.pending_entries += pending;
                let since_report = (now_micros - r.reported_micros).max(0) as u64;
                let delay = (r.lag_micros + since_report) as f64 / 1e6;
                pair.max_delay_seconds = pair.max_delay_seconds.max(delay);
            }
            out.push(pair);
        }
    }
    out
}

/// The pairs whose destination has been behind for longer than `after`, as one message
/// (None: none is).
pub fn degraded(pairs: &[Pair], after: Duration) -> Option<String> {
    let behind: Vec<String> = pairs
        .iter()
        .filter(|p| p.max_delay_seconds > after.as_secs_f64())
        .map(|p| {
            format!(
                "{} → {}: {} write(s) waiting, the oldest for {:.0} s",
                p.source, p.destination, p.pending_entries, p.max_delay_seconds
            )
        })
        .collect();
    (!behind.is_empty()).then(|| behind.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(
        store: &str,
        cluster: &str,
        peer: &str,
        acked: u64,
        logged: u64,
        lag_s: u64,
        at_s: i64,
    ) -> ShippedRecord {
        ShippedRecord {
            store_id: store.into(),
            cluster: cluster.into(),
            peer: peer.into(),
            acked_seq: acked,
            logged_seq: logged,
            lag_micros: lag_s * 1_000_000,
            reported_micros: at_s * 1_000_000,
            acked_hlc: 0,
        }
    }

    #[test]
    fn each_direction_is_its_own_pair_and_ages_while_behind() {
        let clusters = vec!["a".to_string(), "b".to_string()];
        let shipped = vec![
            record("s1", "a", "b", 10, 10, 0, 100),
            record("s2", "a", "b", 5, 8, 2, 100),
            record("s3", "b", "a", 7, 7, 0, 50),
        ];
        let p = pairs(&clusters, &shipped, 103 * 1_000_000);
        assert_eq!(p.len(), 2);
        assert_eq!(
            (p[0].source.as_str(), p[0].destination.as_str()),
            ("a", "b")
        );
        assert_eq!(p[0].pending_entries, 3);
        // Reported 2 s behind, 3 s ago.
        assert!((p[0].max_delay_seconds - 5.0).abs() < 1e-9);
        // Caught up: an old report is no delay.
        assert_eq!((p[1].pending_entries, p[1].max_delay_seconds), (0, 0.0));
        assert_eq!(degraded(&p, Duration::from_secs(60)), None);
        let later = pairs(&clusters, &shipped, 200 * 1_000_000);
        let why = degraded(&later, Duration::from_secs(60)).unwrap();
        assert!(
            why.contains("a → b: 3 write(s) waiting, the oldest for 102 s"),
            "{why}"
        );
    }

    #[test]
    fn one_cluster_has_no_pair() {
        assert!(pairs(&["a".to_string()], &[], 0).is_empty());
    }
}
