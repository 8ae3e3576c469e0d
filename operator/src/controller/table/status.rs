//! Table, stage 5 (pure): the status, from the table as the instance reports it after the
//! admin calls — or from why the reconcile stopped, or a drop the instance refused.

use std::time::Duration;

use kube::ResourceExt;
use kube::runtime::controller::Action;

use super::apply::Synced;
use super::validate::{Refused, ValidatedTable};
use crate::admin::observed_families;
use crate::conditions::{self, Cond, DEGRADED, READY};
use crate::controller::{Note, Outcome, invalid_spec_warning};
use crate::crd::{Table, TableStatus};
use crate::rules;

/// How soon a table is compared with the instance again: clients may change its schema
/// through the admin API.
const RESYNC: Duration = Duration::from_secs(120);

/// The status with `conds` merged in at the table's generation; the rest as it was.
fn with_conditions(table: &Table, conds: &[Cond]) -> TableStatus {
    let old = table.status.clone().unwrap_or_default();
    TableStatus {
        conditions: conditions::merge(&old.conditions, conds, table.metadata.generation),
        observed_generation: table.metadata.generation,
        ..old
    }
}

/// The status of a table the reconcile could not apply: an invalid spec (with a warning event
/// when its message is new), a missing instance, or no ready tablet server to apply it
/// through.
pub fn refused(table: &Table, refused: &Refused) -> Outcome<TableStatus> {
    let instance = &table.spec.instance_ref;
    match refused {
        Refused::InvalidSpec(problems) => {
            let message = rules::describe(problems);
            let old = table.status.clone().unwrap_or_default();
            let events = invalid_spec_warning(&old.conditions, READY, &message);
            let conds = [
                Cond::new(READY, false, "InvalidSpec", message.clone()),
                Cond::new(DEGRADED, true, "InvalidSpec", message),
            ];
            Outcome {
                status: with_conditions(table, &conds),
                events,
                requeue: Action::await_change(),
            }
        }
        Refused::InstanceNotFound => {
            let cond = Cond::new(
                READY,
                false,
                "InstanceNotFound",
                format!(
                    "Instance {instance:?} does not exist in namespace {:?}",
                    table.namespace().unwrap_or_default()
                ),
            );
            Outcome {
                status: with_conditions(table, &[cond]),
                events: vec![],
                requeue: Action::requeue(Duration::from_secs(30)),
            }
        }
        Refused::InstanceUnavailable => {
            let cond = Cond::new(
                READY,
                false,
                "InstanceUnavailable",
                format!("no tablet server of instance {instance:?} is ready"),
            );
            Outcome {
                status: with_conditions(table, &[cond]),
                events: vec![],
                requeue: Action::requeue(Duration::from_secs(10)),
            }
        }
    }
}

/// The status of a table whose drop the instance refused (`why`), reported in a warning event
/// on every attempt.
pub fn deletion_blocked(table: &Table, why: String) -> Outcome<TableStatus> {
    let cond = Cond::new("DeletionBlocked", true, "DeletionProtection", why.clone());
    Outcome {
        status: with_conditions(table, &[cond]),
        events: vec![Note::warning("DeletionBlocked", "Delete", why)],
        requeue: Action::requeue(Duration::from_secs(60)),
    }
}

/// The status of a table brought to the spec: ready unless a change was refused (then also
/// a warning event), and the table as the instance reports it.
pub fn synced(validated: &ValidatedTable<'_>, synced: &Synced) -> Outcome<TableStatus> {
    let name = &validated.name;
    let (conds, events) = if synced.refused.is_empty() {
        let conds = vec![
            Cond::new(
                READY,
                true,
                "Synced",
                format!("table {name} matches the spec"),
            ),
            Cond::new(DEGRADED, false, "AsExpected", "the table matches the spec"),
        ];
        (conds, vec![])
    } else {
        let message = synced.refused.join("; ");
        let conds = vec![
            Cond::new(READY, false, "ChangeRefused", message.clone()),
            Cond::new(DEGRADED, true, "ChangeRefused", message.clone()),
        ];
        (
            conds,
            vec![Note::warning("ChangeRefused", "Update", message)],
        )
    };
    let status = TableStatus {
        table_id: Some(validated.table_id.clone()),
        resource_name: Some(name.clone()),
        column_families: observed_families(&synced.table),
        deletion_protection: Some(synced.table.deletion_protection),
        ..with_conditions(validated.table, &conds)
    };
    Outcome {
        status,
        events,
        requeue: Action::requeue(RESYNC),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use googleapis_tonic_google_bigtable_admin_v2::google::bigtable::admin::v2 as admin;

    use super::*;

    fn table(generation: i64, status: Option<TableStatus>) -> Table {
        let mut t: Table = serde_norway::from_str(
            "metadata: {name: orders, namespace: shop}\nspec: {instanceRef: orders-prod, columnFamilies: {cf: {}}}\n",
        )
        .unwrap();
        t.metadata.generation = Some(generation);
        t.status = status;
        t
    }

    fn cond<'a>(status: &'a TableStatus, type_: &str) -> (&'a str, &'a str, Option<i64>) {
        let c = conditions::find(&status.conditions, type_)
            .unwrap_or_else(|| panic!("no {type_} in {status:?}"));
        (c.status.as_str(), c.reason.as_str(), c.observed_generation)
    }

    fn validated(t: &Table) -> ValidatedTable<'_> {
        ValidatedTable {
            table: t,
            table_id: "orders".into(),
            parent: "projects/shop/instances/orders-prod".into(),
            name: "projects/shop/instances/orders-prod/tables/orders".into(),
            endpoint: "10.0.0.7:8086".into(),
        }
    }

    fn admin_table(protected: bool) -> admin::Table {
        admin::Table {
            column_families: HashMap::from([("cf".to_string(), admin::ColumnFamily::default())]),
            deletion_protection: protected,
            ..admin::Table::default()
        }
    }

    #[test]
    fn a_synced_table_reports_what_the_instance_has() {
        let t = table(2, None);
        let out = synced(
            &validated(&t),
            &Synced {
                table: admin_table(true),
                refused: vec![],
                ..Synced::default()
            },
        );
        let s = &out.status;
        assert_eq!(cond(s, READY), ("True", "Synced", Some(2)));
        assert_eq!(cond(s, DEGRADED), ("False", "AsExpected", Some(2)));
        assert_eq!(s.observed_generation, Some(2));
        assert_eq!(s.table_id.as_deref(), Some("orders"));
        assert_eq!(
            s.resource_name.as_deref(),
            Some("projects/shop/instances/orders-prod/tables/orders")
        );
        assert_eq!(s.column_families.keys().collect::<Vec<_>>(), ["cf"]);
        assert_eq!(s.deletion_protection, Some(true));
        assert!(out.events.is_empty());
        assert_eq!(out.requeue, Action::requeue(Duration::from_secs(120)));
    }

    #[test]
    fn a_refused_change_is_degraded_and_warned_about_on_every_sync() {
        let t = table(3, None);
        let out = synced(
            &validated(&t),
            &Synced {
                table: admin_table(false),
                refused: vec!["a".into(), "b".into()],
                ..Synced::default()
            },
        );
        assert_eq!(
            cond(&out.status, READY),
            ("False", "ChangeRefused", Some(3))
        );
        assert_eq!(
            cond(&out.status, DEGRADED),
            ("True", "ChangeRefused", Some(3))
        );
        assert_eq!(
            conditions::find(&out.status.conditions, READY)
                .unwrap()
                .message,
            "a; b"
        );
        assert_eq!(out.events.len(), 1);
        assert_eq!(
            (out.events[0].reason, out.events[0].note.as_str()),
            ("ChangeRefused", "a; b")
        );
    }

    #[test]
    fn refusals_say_why_and_when_to_look_again() {
        let t = table(1, None);
        let missing = refused(&t, &Refused::InstanceNotFound);
        assert_eq!(
            cond(&missing.status, READY),
            ("False", "InstanceNotFound", Some(1))
        );
        assert_eq!(
            conditions::find(&missing.status.conditions, READY)
                .unwrap()
                .message,
            "Instance \"orders-prod\" does not exist in namespace \"shop\""
        );
        assert_eq!(missing.requeue, Action::requeue(Duration::from_secs(30)));
        let down = refused(&t, &Refused::InstanceUnavailable);
        assert_eq!(
            cond(&down.status, READY),
            ("False", "InstanceUnavailable", Some(1))
        );
        assert_eq!(down.requeue, Action::requeue(Duration::from_secs(10)));
        assert!(missing.events.is_empty() && down.events.is_empty());

        let invalid = Refused::InvalidSpec(vec![crate::rules::Problem {
            field: "spec.initialSplits[1]".into(),
            message: "duplicate split key \"a\"".into(),
        }]);
        let out = refused(&t, &invalid);
        assert_eq!(
            cond(&out.status, DEGRADED),
            ("True", "InvalidSpec", Some(1))
        );
        assert_eq!(out.events.len(), 1);
        assert_eq!(out.requeue, Action::await_change());
        assert!(
            refused(&table(1, Some(out.status)), &invalid)
                .events
                .is_empty()
        );
    }

    #[test]
    fn a_refused_drop_is_reported_and_retried() {
        let old = TableStatus {
            resource_name: Some("projects/shop/instances/orders-prod/tables/orders".into()),
            ..TableStatus::default()
        };
        let out = deletion_blocked(
            &table(4, Some(old)),
            "the table is not deleted: protected".into(),
        );
        assert_eq!(
            cond(&out.status, "DeletionBlocked"),
            ("True", "DeletionProtection", Some(4))
        );
        assert_eq!(
            out.status.resource_name.as_deref(),
            Some("projects/shop/instances/orders-prod/tables/orders")
        );
        assert_eq!(out.events[0].reason, "DeletionBlocked");
        assert_eq!(out.requeue, Action::requeue(Duration::from_secs(60)));
    }
}
