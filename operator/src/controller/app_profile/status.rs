//! AppProfile, stage 5 (pure): published and recorded in the instance's catalog, or why not.

use std::time::Duration;

use kube::ResourceExt;
use kube::runtime::controller::Action;

use super::catalog;
use super::validate::{Refused, ValidatedAppProfile};
use crate::conditions::{self, Cond, DEGRADED, READY};
use crate::controller::Note;
use crate::controller::{Outcome, invalid_spec_warning};
use crate::crd::{AppProfile, AppProfileStatus};
use crate::lifecycle::records::Catalog;
use crate::lifecycle::routing::RoutesNow;
use crate::rules;

/// Whether the profile's record is in its instance's catalog in etcd (`app-profiles/<id>`).
pub const RECORDED: &str = "Recorded";
/// Whether every cluster the profile names has live servers and holds the data.
pub const CLUSTERS_AVAILABLE: &str = "ClustersAvailable";
/// How soon a published profile is looked at again while its clusters are watched: a cluster
/// that goes down is reported within about this long.
const WATCH_CLUSTERS: Duration = Duration::from_secs(10);

/// How soon a refused profile is looked at again: the Instance, or the clusters it names,
/// may be created later.
const RETRY_REFUSED: Duration = Duration::from_secs(30);
/// How soon a profile whose record could not be written (or removed) is tried again.
const RETRY_CATALOG: Duration = Duration::from_secs(15);
const REQUEUE: Duration = Duration::from_secs(300);

/// The status with `conds`. Its `appProfileId` is the current id, except while the record of
/// a previous id could not be removed (the store did not answer): then the previous one, so
/// that the next reconcile removes it.
fn status(
    profile: &AppProfile,
    conds: &[Cond],
    catalog: Option<&Catalog>,
    routes: Option<&RoutesNow>,
) -> AppProfileStatus {
    let old = profile.status.clone().unwrap_or_default();
    let id = match catalog {
        Some(Catalog::NoEndpoints | Catalog::Unreachable(_)) => catalog::previous_id(profile),
        _ => None,
    };
    AppProfileStatus {
        conditions: conditions::merge(&old.conditions, conds, profile.metadata.generation),
        observed_generation: profile.metadata.generation,
        app_profile_id: Some(id.unwrap_or_else(|| profile.app_profile_id())),
        routes_to: routes.map(|r| r.routes_to.clone()).unwrap_or_default(),
        unavailable_clusters: routes.map(|r| r.unavailable.clone()).unwrap_or_default(),
    }
}

/// The ClustersAvailable condition and the events of a change of it (`routes`: where the
/// profile routes now, None when etcd did not say).
fn clusters_available(profile: &AppProfile, routes: Option<&RoutesNow>) -> (Cond, Vec<Note>) {
    let id = profile.app_profile_id();
    let Some(routes) = routes else {
        return (
            Cond::new(
                CLUSTERS_AVAILABLE,
                false,
                "Unknown",
                "the instance's metadata store did not say which clusters are available",
            ),
            vec![],
        );
    };
    let was = profile
        .status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, CLUSTERS_AVAILABLE))
        .map(|c| (c.status == "True", c.message.clone()));
    if routes.unavailable.is_empty() {
        let message = format!(
            "app profile {id:?} routes to {}",
            routes.routes_to.join(", ")
        );
        let events = match was {
            Some((false, _)) => vec![Note::normal("ClusterAvailable", "Route", message.clone())],
            _ => vec![],
        };
        (
            Cond::new(CLUSTERS_AVAILABLE, true, "Available", message),
            events,
        )
    } else {
        let message = format!(
            "cluster(s) {} of app profile {id:?} unavailable (no live server, or being seeded); {}",
            routes.unavailable.join(", "),
            if routes.routes_to.is_empty() {
                "its requests fail until one is back".to_string()
            } else {
                format!("its requests go to {}", routes.routes_to.join(", "))
            }
        );
        let events = match &was {
            Some((false, m)) if *m == message => vec![],
            _ => vec![Note::warning(
                "ClusterUnavailable",
                "Route",
                message.clone(),
            )],
        };
        (
            Cond::new(CLUSTERS_AVAILABLE, false, "ClusterUnavailable", message),
            events,
        )
    }
}

fn requeue(catalog: &Catalog, otherwise: Duration) -> Action {
    match catalog {
        Catalog::Recorded | Catalog::Removed => Action::requeue(otherwise),
        Catalog::NoEndpoints | Catalog::Unreachable(_) => Action::requeue(RETRY_CATALOG),
    }
}

/// The Recorded condition when the store could not be reached; `what` failed.
fn unreachable(profile: &AppProfile, catalog: &Catalog, what: &str) -> Option<Cond> {
    let instance = &profile.spec.instance_ref;
    match catalog {
        Catalog::NoEndpoints => Some(Cond::new(
            RECORDED,
            false,
            "MetadataStoreNotReady",
            format!(
                "no member of instance {instance:?}'s metadata store (etcd) has an address yet: {what}; retrying every {}s",
                RETRY_CATALOG.as_secs()
            ),
        )),
        Catalog::Unreachable(why) => Some(Cond::new(
            RECORDED,
            false,
            "MetadataStoreUnreachable",
            format!(
                "instance {instance:?}'s metadata store did not answer ({why}): {what}; retrying every {}s",
                RETRY_CATALOG.as_secs()
            ),
        )),
        Catalog::Recorded | Catalog::Removed => None,
    }
}

pub fn published(
    validated: &ValidatedAppProfile<'_>,
    catalog: &Catalog,
    routes: Option<&RoutesNow>,
) -> Outcome<AppProfileStatus> {
    let profile = validated.profile;
    let instance = &profile.spec.instance_ref;
    let id = profile.app_profile_id();
    let recorded = unreachable(profile, catalog, &format!("app profile {id:?} not recorded"))
        .unwrap_or_else(|| {
            Cond::new(
                RECORDED,
                true,
                "Recorded",
                format!(
                    "app profile {id:?} is in the catalog of instance {instance:?} (etcd key app-profiles/{id})"
                ),
            )
        });
    let (available, events) = clusters_available(profile, routes);
    let conds = [
        Cond::new(
            READY,
            true,
            "Published",
            format!(
                "app profile {id:?} is valid for instance {instance:?}; it is published through the instance's catalog in etcd (condition {RECORDED})"
            ),
        ),
        Cond::new(DEGRADED, false, "AsExpected", "the profile is valid"),
        recorded,
        available,
    ];
    Outcome {
        status: status(profile, &conds, Some(catalog), routes),
        events,
        requeue: requeue(catalog, WATCH_CLUSTERS.min(REQUEUE)),
    }
}

/// Not ready; an invalid spec is also degraded and reported in a warning event when its
/// message is new, and its record is removed from the catalog (`catalog`: how that went).
pub fn refused(
    profile: &AppProfile,
    refused: &Refused,
    catalog: Option<&Catalog>,
) -> Outcome<AppProfileStatus> {
    let (conds, events) = match refused {
        Refused::InstanceNotFound => {
            let message = format!(
                "Instance {:?} does not exist in namespace {:?}",
                profile.spec.instance_ref,
                profile.namespace().unwrap_or_default()
            );
            (
                vec![
                    Cond::new(READY, false, "InstanceNotFound", message.clone()),
                    Cond::new(RECORDED, false, "InstanceNotFound", message),
                ],
                vec![],
            )
        }
        Refused::InvalidSpec(problems) => {
            let message = rules::describe(problems);
            let old = profile.status.clone().unwrap_or_default();
            let events = invalid_spec_warning(&old.conditions, READY, &message);
            let recorded = catalog
                .and_then(|c| {
                    unreachable(
                        profile,
                        c,
                        "the invalid profile's record may still be in the catalog",
                    )
                })
                .unwrap_or_else(|| {
                    Cond::new(
                        RECORDED,
                        false,
                        "InvalidSpec",
                        "the profile is invalid: it is not in the instance's catalog",
                    )
                });
            let conds = vec![
                Cond::new(READY, false, "InvalidSpec", message.clone()),
                Cond::new(DEGRADED, true, "InvalidSpec", message),
                recorded,
            ];
            (conds, events)
        }
    };
    let requeue = match catalog {
        Some(c) => requeue(c, RETRY_REFUSED),
        None => Action::requeue(RETRY_REFUSED),
    };
    Outcome {
        status: status(profile, &conds, catalog, None),
        events,
        requeue,
    }
}

/// Being deleted, and the record could not be removed from the catalog yet: the deletion
/// waits (the finalizer), and is tried again.
pub fn removal_pending(profile: &AppProfile, catalog: &Catalog) -> Outcome<AppProfileStatus> {
    let what = format!(
        "the deletion waits until the record of app profile {:?} is removed from the catalog (finalizer {})",
        profile.app_profile_id(),
        super::RECORD_FINALIZER
    );
    let cond = unreachable(profile, catalog, &what)
        .unwrap_or_else(|| Cond::new(RECORDED, false, "Removed", "removed from the catalog"));
    Outcome {
        status: status(profile, &[cond], Some(catalog), None),
        events: vec![],
        requeue: requeue(catalog, RETRY_CATALOG),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::controller::app_profile::dereference::Dereferenced;
    use crate::controller::app_profile::validate::validate;
    use crate::crd::Instance;

    fn profile(generation: i64, cluster: &str) -> AppProfile {
        let mut p: AppProfile = serde_norway::from_str(&format!(
            "metadata: {{name: batch, namespace: shop}}\nspec: {{instanceRef: orders-prod, appProfileId: batch-1, routing: {{singleClusterRouting: {{clusterId: {cluster}}}}}}}\n"
        ))
        .unwrap();
        p.metadata.generation = Some(generation);
        p
    }

    fn found(instance: bool) -> Dereferenced {
        Dereferenced {
            instance: instance.then(|| {
                serde_norway::from_str::<Instance>(
                    "metadata: {name: orders-prod, namespace: shop}\nspec: {displayName: Orders}\n",
                )
                .unwrap()
            }),
            clusters: BTreeSet::from(["orders-c1".to_string()]),
            endpoints: vec![],
        }
    }

    fn ready(status: &AppProfileStatus) -> (&str, &str, &str, Option<i64>) {
        let c = conditions::find(&status.conditions, READY).unwrap();
        (
            c.status.as_str(),
            c.reason.as_str(),
            c.message.as_str(),
            c.observed_generation,
        )
    }

    #[test]
    fn a_valid_profile_is_published() {
        let p = profile(2, "orders-c1");
        let routes = RoutesNow {
            routes_to: vec!["orders-c1".into()],
            unavailable: vec![],
        };
        let out = published(
            &validate(&p, &found(true)).unwrap(),
            &Catalog::Recorded,
            Some(&routes),
        );
        assert_eq!(
            ready(&out.status),
            (
                "True",
                "Published",
                "app profile \"batch-1\" is valid for instance \"orders-prod\"; it is published through the instance's catalog in etcd (condition Recorded)",
                Some(2)
            )
        );
        assert_eq!(out.status.app_profile_id.as_deref(), Some("batch-1"));
        assert_eq!(out.status.observed_generation, Some(2));
        assert!(out.events.is_empty());
        assert_eq!(out.requeue, Action::requeue(Duration::from_secs(10)));
        assert_eq!(out.status.routes_to, ["orders-c1"]);
        assert_eq!(cond(&out.status, CLUSTERS_AVAILABLE).1, "Available");
        assert_eq!(
            cond(&out.status, RECORDED),
            (
                "True".into(),
                "Recorded".into(),
                "app profile \"batch-1\" is in the catalog of instance \"orders-prod\" (etcd key app-profiles/batch-1)".into()
            )
        );
    }

    fn cond(status: &AppProfileStatus, type_: &str) -> (String, String, String) {
        let c = conditions::find(&status.conditions, type_).unwrap();
        (c.status.clone(), c.reason.clone(), c.message.clone())
    }

    #[test]
    fn an_unreachable_store_is_reported_and_retried_soon() {
        let p = profile(2, "orders-c1");
        let validated = validate(&p, &found(true)).unwrap();
        let out = published(
            &validated,
            &Catalog::Unreachable("etcd at http://10.0.0.1:2379: timed out".into()),
            None,
        );
        // Still valid and published to the tablet servers; not in the catalog.
        assert_eq!(ready(&out.status).1, "Published");
        assert_eq!(
            cond(&out.status, RECORDED),
            (
                "False".into(),
                "MetadataStoreUnreachable".into(),
                "instance \"orders-prod\"'s metadata store did not answer (etcd at http://10.0.0.1:2379: timed out): app profile \"batch-1\" not recorded; retrying every 15s".into()
            )
        );
        assert_eq!(out.requeue, Action::requeue(Duration::from_secs(15)));
        let out = published(&validated, &Catalog::NoEndpoints, None);
        assert_eq!(cond(&out.status, RECORDED).1, "MetadataStoreNotReady");
        assert_eq!(out.requeue, Action::requeue(Duration::from_secs(15)));
    }

    #[test]
    fn a_changed_id_keeps_the_previous_one_in_status_until_its_record_is_removed() {
        let mut p = profile(3, "orders-c1");
        p.status = Some(AppProfileStatus {
            app_profile_id: Some("batch-0".into()),
            ..Default::default()
        });
        let validated = validate(&p, &found(true)).unwrap();
        let out = published(&validated, &Catalog::Unreachable("down".into()), None);
        assert_eq!(out.status.app_profile_id.as_deref(), Some("batch-0"));
        let out = published(&validated, &Catalog::Recorded, None);
        assert_eq!(out.status.app_profile_id.as_deref(), Some("batch-1"));
    }

    #[test]
    fn an_unavailable_cluster_is_a_condition_and_one_event_each_way() {
        let mut p = profile(1, "orders-c1");
        let down = RoutesNow {
            routes_to: vec!["orders-c1".into()],
            unavailable: vec!["orders-c1".into()],
        };
        let validated = validate(&p, &found(true)).unwrap();
        let out = published(&validated, &Catalog::Recorded, Some(&down));
        let (status, reason, message) = cond(&out.status, CLUSTERS_AVAILABLE);
        assert_eq!(
            (status.as_str(), reason.as_str()),
            ("False", "ClusterUnavailable")
        );
        assert!(message.contains("orders-c1"), "{message}");
        assert_eq!(out.status.unavailable_clusters, ["orders-c1"]);
        assert_eq!(out.events.len(), 1);
        assert_eq!(out.events[0].reason, "ClusterUnavailable");
        // Reported once while it stays down.
        p.status = Some(out.status.clone());
        let validated = validate(&p, &found(true)).unwrap();
        assert!(
            published(&validated, &Catalog::Recorded, Some(&down))
                .events
                .is_empty()
        );
        // Back: the condition turns true, with one event.
        let up = RoutesNow {
            routes_to: vec!["orders-c1".into()],
            unavailable: vec![],
        };
        let out = published(&validated, &Catalog::Recorded, Some(&up));
        assert_eq!(cond(&out.status, CLUSTERS_AVAILABLE).0, "True");
        assert_eq!(out.events.len(), 1);
        assert_eq!(out.events[0].reason, "ClusterAvailable");
    }

    #[test]
    fn a_deletion_waiting_for_the_store_says_so() {
        let p = profile(1, "orders-c1");
        let out = removal_pending(&p, &Catalog::Unreachable("down".into()));
        let (status, reason, message) = cond(&out.status, RECORDED);
        assert_eq!(
            (status.as_str(), reason.as_str()),
            ("False", "MetadataStoreUnreachable")
        );
        assert!(
            message.contains("the deletion waits until the record of app profile \"batch-1\" is removed from the catalog (finalizer basalt.dev/app-profile-record)"),
            "{message}"
        );
        assert_eq!(out.requeue, Action::requeue(Duration::from_secs(15)));
    }

    #[test]
    fn a_missing_instance_comes_before_the_profile_rules() {
        let p = profile(1, "orders-c9");
        let refusal = validate(&p, &found(false)).unwrap_err();
        assert_eq!(refusal, Refused::InstanceNotFound);
        let out = refused(&p, &refusal, None);
        assert_eq!(cond(&out.status, RECORDED).1, "InstanceNotFound");
        assert_eq!(
            ready(&out.status),
            (
                "False",
                "InstanceNotFound",
                "Instance \"orders-prod\" does not exist in namespace \"shop\"",
                Some(1)
            )
        );
        assert!(out.events.is_empty());
        assert_eq!(out.requeue, Action::requeue(Duration::from_secs(30)));
    }

    #[test]
    fn an_invalid_profile_is_warned_about_once_and_retried() {
        let mut p = profile(1, "orders-c9");
        let refusal = validate(&p, &found(true)).unwrap_err();
        let out = refused(&p, &refusal, Some(&Catalog::Removed));
        assert_eq!(ready(&out.status).1, "InvalidSpec");
        assert_eq!(
            cond(&out.status, RECORDED),
            (
                "False".into(),
                "InvalidSpec".into(),
                "the profile is invalid: it is not in the instance's catalog".into()
            )
        );
        assert_eq!(
            conditions::find(&out.status.conditions, DEGRADED)
                .unwrap()
                .status,
            "True"
        );
        assert_eq!(out.events.len(), 1);
        assert_eq!(out.requeue, Action::requeue(Duration::from_secs(30)));
        p.status = Some(out.status);
        assert!(
            refused(&p, &refusal, Some(&Catalog::Removed))
                .events
                .is_empty()
        );
        let out = refused(&p, &refusal, Some(&Catalog::NoEndpoints));
        assert_eq!(cond(&out.status, RECORDED).1, "MetadataStoreNotReady");
        assert_eq!(out.requeue, Action::requeue(Duration::from_secs(15)));
    }
}
