//! Instance, stage 2 (pure): the spec's rules ([`crate::rules::validate_instance`]) and
//! the size of its metadata store (fixed once it exists).

use super::dereference::Dereferenced;
use crate::build;
use crate::crd::{Cluster, Instance};
use crate::rules::{self, Problem};

/// An Instance whose objects may be applied.
#[derive(Debug, Clone)]
pub struct ValidatedInstance<'a> {
    pub instance: &'a Instance,
    /// The instance's clusters.
    pub clusters: Vec<&'a Cluster>,
    /// Members of the instance's own etcd: the existing StatefulSet's count (membership does
    /// not change with the spec), else the count for the instance's type.
    pub etcd_members: i32,
    /// Replication between its clusters (None: one cluster, or not known).
    pub replication: Option<&'a crate::lifecycle::replication::Replication>,
}

/// Why the reconcile stops before applying anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    InvalidSpec(Vec<Problem>),
}

pub fn validate<'a>(
    instance: &'a Instance,
    found: &'a Dereferenced,
) -> Result<ValidatedInstance<'a>, Refused> {
    let problems = rules::validate_instance(instance);
    if !problems.is_empty() {
        return Err(Refused::InvalidSpec(problems));
    }
    Ok(ValidatedInstance {
        instance,
        clusters: found.clusters.iter().collect(),
        etcd_members: found
            .metadata_store
            .as_ref()
            .and_then(|s| s.spec.as_ref()?.replicas)
            .unwrap_or_else(|| build::etcd::members_for(instance.spec.instance_type)),
        replication: found.replication.as_ref(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from_yaml<T: serde::de::DeserializeOwned>(yaml: &str) -> T {
        serde_norway::from_str(yaml).unwrap()
    }

    #[test]
    fn a_valid_instance_keeps_its_clusters_and_its_stores_size() {
        let instance: Instance = from_yaml(
            "metadata: {name: orders-prod, namespace: shop}\nspec: {displayName: Orders}\n",
        );
        let found = Dereferenced {
            clusters: vec![from_yaml(
                "metadata: {name: orders-c1}\nspec: {instanceRef: orders-prod, serveNodes: 1}\n",
            )],
            metadata_store: None,
            replication: None,
        };
        let v = validate(&instance, &found).unwrap();
        assert_eq!(v.clusters.len(), 1);
        assert_eq!(
            v.etcd_members, 3,
            "a new Production store has three members"
        );

        // A Development instance's store was created with one member; becoming Production does
        // not resize it.
        let mut grown = found.clone();
        let dev: Instance = from_yaml(
            "metadata: {name: orders-prod, namespace: shop}\nspec: {displayName: Orders, type: Development}\n",
        );
        let objects = build::instance_objects(&dev, &Default::default(), 1);
        grown.metadata_store = Some(objects.metadata_store.unwrap().statefulset);
        assert_eq!(validate(&instance, &grown).unwrap().etcd_members, 1);

        let bad: Instance =
            from_yaml("metadata: {name: Orders, namespace: shop}\nspec: {displayName: Orders}\n");
        let Err(Refused::InvalidSpec(problems)) = validate(&bad, &found) else {
            panic!("an invalid instance id must be refused");
        };
        assert_eq!(problems[0].field, "metadata.name");
    }
}
