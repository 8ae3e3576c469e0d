//! Status conditions (`Ready`, `Progressing`, `Degraded`, …) with reasons, messages and the
//! generation they describe; a condition's `lastTransitionTime` only moves when its status does.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

pub const READY: &str = "Ready";
pub const PROGRESSING: &str = "Progressing";
pub const DEGRADED: &str = "Degraded";
/// Instance: its clusters replicate to each other (True with two or more).
pub const REPLICATING: &str = "Replicating";
/// Instance: a cluster's writes have waited too long for another cluster (with the reason).
pub const REPLICATION_DEGRADED: &str = "ReplicationDegraded";
/// A Cluster's: true while a scale-in is under way.
pub const SCALE_IN: &str = "ScaleIn";
/// A Cluster's: true while the master cannot finish a scale-in's drain, with the reason.
pub const DRAIN_BLOCKED: &str = "DrainBlocked";
/// A Cluster's: true while its deletion waits for its writes to reach another Cluster (with
/// the reason: `UnshippedWrites`, `StoppingServers`, `MetadataStoreUnreachable`).
pub const REMOVING: &str = "Removing";
/// A Cluster's, set by earlier operator versions (tablets could not move then); gone.
pub const SCALE_IN_BLOCKED: &str = "ScaleInBlocked";

/// A condition to set: type, status, reason, message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cond {
    pub type_: &'static str,
    pub status: bool,
    pub reason: &'static str,
    pub message: String,
}

impl Cond {
    pub fn new(
        type_: &'static str,
        status: bool,
        reason: &'static str,
        message: impl Into<String>,
    ) -> Self {
        Self {
            type_,
            status,
            reason,
            message: message.into(),
        }
    }
}

/// The new condition list: `wanted` replaces conditions of the same type (keeping
/// `lastTransitionTime` when the status did not change); other types are kept.
pub fn merge(existing: &[Condition], wanted: &[Cond], generation: Option<i64>) -> Vec<Condition> {
    let now = Time(Timestamp::now());
    let mut out: Vec<Condition> = existing
        .iter()
        .filter(|c| !wanted.iter().any(|w| w.type_ == c.type_))
        .cloned()
        .collect();
    for w in wanted {
        let status = if w.status { "True" } else { "False" }.to_string();
        let last_transition_time = existing
            .iter()
            .find(|c| c.type_ == w.type_ && c.status == status)
            .map(|c| c.last_transition_time.clone())
            .unwrap_or_else(|| now.clone());
        out.push(Condition {
            type_: w.type_.into(),
            status,
            reason: w.reason.into(),
            // Server-side apply on API servers before 1.21 turns an empty string into null,
            // which the status schema refuses: an empty message becomes the reason.
            message: if w.message.is_empty() {
                w.reason.to_string()
            } else {
                w.message.clone()
            },
            observed_generation: generation,
            last_transition_time,
        });
    }
    out.sort_by(|a, b| a.type_.cmp(&b.type_));
    out
}

/// The condition of a type, if present.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_time_moves_only_with_the_status() {
        let first = merge(
            &[],
            &[Cond::new(READY, false, "Creating", "0/3 nodes ready")],
            Some(1),
        );
        let t0 = first[0].last_transition_time.clone();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let second = merge(
            &first,
            &[Cond::new(READY, false, "Creating", "2/3 nodes ready")],
            Some(2),
        );
        assert_eq!(second[0].last_transition_time, t0);
        assert_eq!(second[0].message, "2/3 nodes ready");
        assert_eq!(second[0].observed_generation, Some(2));
        let third = merge(
            &second,
            &[Cond::new(READY, true, "Ready", "3/3 nodes ready")],
            Some(2),
        );
        assert_ne!(third[0].last_transition_time, t0);
        assert_eq!(third[0].status, "True");
        let kept = merge(
            &third,
            &[Cond::new(DEGRADED, false, "AsExpected", "")],
            Some(2),
        );
        assert_eq!(kept.len(), 2);
        assert_eq!(find(&kept, READY).unwrap().status, "True");
        // Never an empty message (API servers before 1.21 turn it into null).
        assert_eq!(find(&kept, DEGRADED).unwrap().message, "AsExpected");
    }
}
