//! AppProfile, stage 5 (pure): published, or why not.

use std::time::Duration;

use kube::ResourceExt;
use kube::runtime::controller::Action;

use super::validate::{Refused, ValidatedAppProfile};
use crate::build;
use crate::conditions::{self, Cond, DEGRADED, READY};
use crate::controller::{Outcome, invalid_spec_warning};
use crate::crd::{AppProfile, AppProfileStatus};
use crate::validate;

/// How soon a refused profile is looked at again: the Instance, or the clusters it names,
/// may be created later.
const RETRY_REFUSED: Duration = Duration::from_secs(30);
const REQUEUE: Duration = Duration::from_secs(300);

fn status(profile: &AppProfile, conds: &[Cond]) -> AppProfileStatus {
    let old = profile.status.clone().unwrap_or_default();
    AppProfileStatus {
        conditions: conditions::merge(&old.conditions, conds, profile.metadata.generation),
        observed_generation: profile.metadata.generation,
        app_profile_id: Some(profile.app_profile_id()),
    }
}

pub fn published(validated: &ValidatedAppProfile<'_>) -> Outcome<AppProfileStatus> {
    let profile = validated.profile;
    let instance = &profile.spec.instance_ref;
    let conds = [
        Cond::new(
            READY,
            true,
            "Published",
            format!(
                "app profile {:?} is published to the tablet servers of instance {instance:?} (ConfigMap {})",
                profile.app_profile_id(),
                build::instance_config_map_name(instance)
            ),
        ),
        Cond::new(DEGRADED, false, "AsExpected", "the profile is valid"),
    ];
    Outcome {
        status: status(profile, &conds),
        events: vec![],
        requeue: Action::requeue(REQUEUE),
    }
}

/// Not ready; an invalid spec is also degraded and reported in a warning event when its
/// message is new.
pub fn refused(profile: &AppProfile, refused: &Refused) -> Outcome<AppProfileStatus> {
    let (conds, events) = match refused {
        Refused::InstanceNotFound => {
            let message = format!(
                "Instance {:?} does not exist in namespace {:?}",
                profile.spec.instance_ref,
                profile.namespace().unwrap_or_default()
            );
            (
                vec![Cond::new(READY, false, "InstanceNotFound", message)],
                vec![],
            )
        }
        Refused::InvalidSpec(problems) => {
            let message = validate::describe(problems);
            let old = profile.status.clone().unwrap_or_default();
            let events = invalid_spec_warning(&old.conditions, READY, &message);
            let conds = vec![
                Cond::new(READY, false, "InvalidSpec", message.clone()),
                Cond::new(DEGRADED, true, "InvalidSpec", message),
            ];
            (conds, events)
        }
    };
    Outcome {
        status: status(profile, &conds),
        events,
        requeue: Action::requeue(RETRY_REFUSED),
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
        let out = published(&validate(&p, &found(true)).unwrap());
        assert_eq!(
            ready(&out.status),
            (
                "True",
                "Published",
                "app profile \"batch-1\" is published to the tablet servers of instance \"orders-prod\" (ConfigMap orders-prod-config)",
                Some(2)
            )
        );
        assert_eq!(out.status.app_profile_id.as_deref(), Some("batch-1"));
        assert_eq!(out.status.observed_generation, Some(2));
        assert!(out.events.is_empty());
        assert_eq!(out.requeue, Action::requeue(Duration::from_secs(300)));
    }

    #[test]
    fn a_missing_instance_comes_before_the_profile_rules() {
        let p = profile(1, "orders-c9");
        let refusal = validate(&p, &found(false)).unwrap_err();
        assert_eq!(refusal, Refused::InstanceNotFound);
        let out = refused(&p, &refusal);
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
        let out = refused(&p, &refusal);
        assert_eq!(ready(&out.status).1, "InvalidSpec");
        assert_eq!(
            conditions::find(&out.status.conditions, DEGRADED)
                .unwrap()
                .status,
            "True"
        );
        assert_eq!(out.events.len(), 1);
        assert_eq!(out.requeue, Action::requeue(Duration::from_secs(30)));
        p.status = Some(out.status);
        assert!(refused(&p, &refusal).events.is_empty());
    }
}
