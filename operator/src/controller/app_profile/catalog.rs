//! AppProfile, stage 3 (pure): the record the profile puts into its instance's catalog in
//! etcd (`app-profiles/<id>`, [`basalt_meta::AppProfileRecord`]), and which records a change
//! of id or a deletion leaves to remove.

use basalt_meta::{AppProfilePriority, AppProfileRecord, AppProfileRouting};

use crate::crd::{AppProfile, Priority};

/// The catalog's record of `profile` (a valid one: exactly one routing policy). Without a
/// policy (refused by the CRD's schema and by validation), the record routes to any cluster.
pub fn record(profile: &AppProfile) -> AppProfileRecord {
    record_of(&profile.app_profile_id(), &profile.spec)
}

/// The record of a profile of id `id` and `spec` (the local runtime keeps specs by id).
pub fn record_of(id: &str, spec: &crate::crd::AppProfileSpec) -> AppProfileRecord {
    let routing = match (
        &spec.routing.single_cluster_routing,
        &spec.routing.multi_cluster_routing_use_any,
    ) {
        (Some(single), _) => AppProfileRouting::SingleClusterRouting {
            cluster_id: single.cluster_id.clone(),
            allow_transactional_writes: single.allow_transactional_writes,
        },
        (None, Some(any)) => AppProfileRouting::MultiClusterRoutingUseAny {
            cluster_ids: any.cluster_ids.clone(),
            row_affinity: any.row_affinity,
        },
        (None, None) => AppProfileRouting::MultiClusterRoutingUseAny {
            cluster_ids: vec![],
            row_affinity: false,
        },
    };
    AppProfileRecord {
        id: id.to_string(),
        description: spec.description.clone().unwrap_or_default(),
        routing,
        priority: match spec.priority {
            Priority::High => AppProfilePriority::High,
            Priority::Medium => AppProfilePriority::Medium,
            Priority::Low => AppProfilePriority::Low,
        },
    }
}

/// The id the profile had before `spec.appProfileId` changed (the status's), if it differs
/// from the current one: its record is removed from the catalog.
pub fn previous_id(profile: &AppProfile) -> Option<String> {
    let old = profile.status.as_ref()?.app_profile_id.clone()?;
    (old != profile.app_profile_id()).then_some(old)
}

/// Every id whose record a deletion (or an invalid spec) removes: the current one, and the
/// previous one if the id changed (an id that names no single key has no record).
pub fn ids_to_remove(profile: &AppProfile) -> Vec<String> {
    let mut ids = vec![profile.app_profile_id()];
    ids.extend(previous_id(profile));
    ids.retain(|id| !id.is_empty() && !id.contains('/'));
    ids
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::AppProfileStatus;

    fn profile(spec: &str) -> AppProfile {
        serde_norway::from_str(&format!(
            "metadata: {{name: batch, namespace: shop}}\nspec: {spec}\n"
        ))
        .unwrap()
    }

    #[test]
    fn single_cluster_routing_becomes_the_record_with_every_field() {
        let p = profile(
            "{instanceRef: orders, appProfileId: batch-1, description: nightly jobs, priority: Low, routing: {singleClusterRouting: {clusterId: orders-c1, allowTransactionalWrites: true}}}",
        );
        assert_eq!(
            record(&p),
            AppProfileRecord {
                id: "batch-1".into(),
                description: "nightly jobs".into(),
                routing: AppProfileRouting::SingleClusterRouting {
                    cluster_id: "orders-c1".into(),
                    allow_transactional_writes: true,
                },
                priority: AppProfilePriority::Low,
            }
        );
    }

    #[test]
    fn multi_cluster_routing_and_the_defaults() {
        // The id defaults to the resource's name, the priority to High, no description.
        let p = profile(
            "{instanceRef: orders, routing: {multiClusterRoutingUseAny: {clusterIds: [c1, c2], rowAffinity: true}}}",
        );
        assert_eq!(
            record(&p),
            AppProfileRecord {
                id: "batch".into(),
                description: String::new(),
                routing: AppProfileRouting::MultiClusterRoutingUseAny {
                    cluster_ids: vec!["c1".into(), "c2".into()],
                    row_affinity: true,
                },
                priority: AppProfilePriority::High,
            }
        );
        let p = profile(
            "{instanceRef: orders, priority: Medium, routing: {multiClusterRoutingUseAny: {}}}",
        );
        let r = record(&p);
        assert_eq!(r.priority, AppProfilePriority::Medium);
        assert_eq!(
            r.routing,
            AppProfileRouting::MultiClusterRoutingUseAny {
                cluster_ids: vec![],
                row_affinity: false
            }
        );
        // The record's JSON has the CRD's shape.
        assert_eq!(
            String::from_utf8(r.encode()).unwrap(),
            r#"{"id":"batch","routing":{"multiClusterRoutingUseAny":{"rowAffinity":false}},"priority":"Medium"}"#
        );
    }

    #[test]
    fn a_changed_id_leaves_the_previous_record_to_remove() {
        let mut p = profile(
            "{instanceRef: orders, appProfileId: batch-2, routing: {singleClusterRouting: {clusterId: c1}}}",
        );
        assert_eq!(previous_id(&p), None);
        assert_eq!(ids_to_remove(&p), ["batch-2"]);
        p.status = Some(AppProfileStatus {
            app_profile_id: Some("batch-2".into()),
            ..Default::default()
        });
        assert_eq!(previous_id(&p), None);
        p.status = Some(AppProfileStatus {
            app_profile_id: Some("batch-1".into()),
            ..Default::default()
        });
        assert_eq!(previous_id(&p).as_deref(), Some("batch-1"));
        assert_eq!(ids_to_remove(&p), ["batch-2", "batch-1"]);
        p.spec.app_profile_id = Some("not/a/key".into());
        assert_eq!(ids_to_remove(&p), ["batch-1"]);
    }
}
