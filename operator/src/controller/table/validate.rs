//! Table, stage 2 (pure): the spec's rules ([`crate::rules::validate_table`]), then whether
//! there is an instance with a ready tablet server to apply it through.

use kube::ResourceExt;

use super::dereference::Dereferenced;
use crate::build;
use crate::crd::Table;
use crate::rules::{self, Problem};

/// A Table that may be applied (or dropped) through the admin API.
#[derive(Debug, Clone)]
pub struct ValidatedTable<'a> {
    pub table: &'a Table,
    /// The table id in the instance (`spec.tableId`, else the resource's name).
    pub table_id: String,
    /// The instance's resource name, `projects/P/instances/I`.
    pub parent: String,
    /// The table's resource name, `projects/P/instances/I/tables/T`.
    pub name: String,
    /// `host:port` of the tablet server the admin calls go to.
    pub endpoint: String,
}

/// Why the reconcile stops before the admin API is called.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    InvalidSpec(Vec<Problem>),
    /// `spec.instanceRef` names no Instance in the namespace.
    InstanceNotFound,
    /// The instance has no ready tablet server.
    InstanceUnavailable,
}

/// While the Table is being deleted (`deleting`) its spec is not checked: a spec that became
/// invalid does not keep the table from being dropped.
pub fn validate<'a>(
    table: &'a Table,
    found: &Dereferenced,
    deleting: bool,
) -> Result<ValidatedTable<'a>, Refused> {
    if !deleting {
        let problems = rules::validate_table(table);
        if !problems.is_empty() {
            return Err(Refused::InvalidSpec(problems));
        }
    }
    let Some(instance) = &found.instance else {
        return Err(Refused::InstanceNotFound);
    };
    let Some(endpoint) = &found.endpoint else {
        return Err(Refused::InstanceUnavailable);
    };
    let table_id = rules::table_id(table);
    let parent = format!(
        "projects/{}/instances/{}",
        build::project_id(instance),
        instance.name_any()
    );
    Ok(ValidatedTable {
        table,
        name: format!("{parent}/tables/{table_id}"),
        table_id,
        parent,
        endpoint: endpoint.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::Instance;

    fn from_yaml<T: serde::de::DeserializeOwned>(yaml: &str) -> T {
        serde_norway::from_str(yaml).unwrap()
    }

    #[test]
    fn resource_names_come_from_the_instance_and_the_table_id() {
        let table: Table = from_yaml(
            "metadata: {name: scratch, namespace: shop}\nspec: {instanceRef: orders-prod, tableId: scratch_1}\n",
        );
        let mut instance: Instance = from_yaml(
            "metadata: {name: orders-prod, namespace: shop}\nspec: {displayName: Orders}\n",
        );
        let found = |instance: &Instance| Dereferenced {
            instance: Some(instance.clone()),
            endpoint: Some("10.0.0.7:8086".into()),
        };
        let v = validate(&table, &found(&instance), false).unwrap();
        assert_eq!(v.parent, "projects/shop/instances/orders-prod");
        assert_eq!(
            v.name,
            "projects/shop/instances/orders-prod/tables/scratch_1"
        );
        assert_eq!(
            (v.table_id.as_str(), v.endpoint.as_str()),
            ("scratch_1", "10.0.0.7:8086")
        );
        instance.spec.project_id = Some("acme".into());
        let v = validate(&table, &found(&instance), false).unwrap();
        assert_eq!(
            v.name,
            "projects/acme/instances/orders-prod/tables/scratch_1"
        );
    }

    #[test]
    fn refusals_in_order_and_an_invalid_spec_does_not_hold_a_deletion() {
        let bad: Table = from_yaml(
            "metadata: {name: t, namespace: shop}\nspec: {instanceRef: orders-prod, initialSplits: [a, a]}\n",
        );
        let nothing = Dereferenced::default();
        assert!(matches!(
            validate(&bad, &nothing, false),
            Err(Refused::InvalidSpec(_))
        ));
        assert_eq!(
            validate(&bad, &nothing, true).unwrap_err(),
            Refused::InstanceNotFound
        );
        let no_server = Dereferenced {
            instance: Some(from_yaml(
                "metadata: {name: orders-prod, namespace: shop}\nspec: {displayName: Orders}\n",
            )),
            endpoint: None,
        };
        assert_eq!(
            validate(&bad, &no_server, true).unwrap_err(),
            Refused::InstanceUnavailable
        );
    }
}
