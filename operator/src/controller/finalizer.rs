//! The operator's finalizers, handled one way by every controller that has one.
//!
//! Each finalizer of the operator is conditional: it is on an object only while its spec asks
//! for something at deletion — the Cluster's volumes deleted (`basalt.dev/delete-volumes`),
//! the Table dropped (`basalt.dev/drop-table`), the Instance's deletion held while protected
//! (`basalt.dev/deletion-protection`). Without it, deleting the object is Kubernetes' business
//! alone (owner references collect what the operator made). So, unlike
//! `kube::runtime::finalizer`, which always adds its finalizer, [`sync`] keeps it present
//! exactly when wanted, and tells the reconcile where the object stands ([`Lifecycle`]); once
//! the reconcile has done what the finalizer held the deletion for, [`release`] lets the
//! deletion finish.

use std::fmt::Debug;

use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use serde::de::DeserializeOwned;

use super::Result;

/// Where an object stands with respect to one finalizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifecycle {
    /// Not being deleted, and the finalizer is present exactly when wanted: run the pipeline.
    Live,
    /// The finalizer was just added or removed; that change triggers the next reconcile,
    /// which sees the new object.
    Changed,
    /// Being deleted and held by the finalizer: do what it held the deletion for, then
    /// [`release`] it.
    Deleting,
    /// Being deleted and not held by the finalizer: nothing of the operator's to do.
    Released,
}

impl Lifecycle {
    pub fn deleting(self) -> bool {
        matches!(self, Lifecycle::Deleting | Lifecycle::Released)
    }
}

/// What [`sync`] does, decided without I/O: stay where the object is, or set its finalizer
/// list to this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    Stay(Lifecycle),
    SetFinalizers(Vec<String>),
}

/// Pure: where `obj` stands with respect to `finalizer`, which it should carry while `wanted`
/// (a deletion in progress is never given a finalizer, nor has one taken away here).
pub fn plan<K: Resource>(obj: &K, finalizer: &str, wanted: bool) -> Plan {
    let present = obj
        .meta()
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == finalizer);
    if obj.meta().deletion_timestamp.is_some() {
        return Plan::Stay(if present {
            Lifecycle::Deleting
        } else {
            Lifecycle::Released
        });
    }
    match (wanted, present) {
        (true, false) => {
            let mut list = obj.meta().finalizers.clone().unwrap_or_default();
            list.push(finalizer.into());
            Plan::SetFinalizers(list)
        }
        (false, true) => Plan::SetFinalizers(without(obj, finalizer)),
        _ => Plan::Stay(Lifecycle::Live),
    }
}

/// Adds or removes `finalizer` so that `obj` carries it exactly while `wanted`, and says where
/// the object stands.
pub async fn sync<K>(api: &Api<K>, obj: &K, finalizer: &str, wanted: bool) -> Result<Lifecycle>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    match plan(obj, finalizer, wanted) {
        Plan::Stay(lifecycle) => Ok(lifecycle),
        Plan::SetFinalizers(list) => {
            set_finalizers(api, obj, list).await?;
            Ok(Lifecycle::Changed)
        }
    }
}

/// Removes `finalizer` from an object being deleted, once what it held the deletion for is
/// done.
pub async fn release<K>(api: &Api<K>, obj: &K, finalizer: &str) -> Result<()>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    set_finalizers(api, obj, without(obj, finalizer)).await
}

fn without<K: Resource>(obj: &K, finalizer: &str) -> Vec<String> {
    obj.meta()
        .finalizers
        .iter()
        .flatten()
        .filter(|f| *f != finalizer)
        .cloned()
        .collect()
}

/// Sets the finalizer list to `finalizers`, guarded by the object's resourceVersion so a
/// concurrent change is never overwritten.
async fn set_finalizers<K>(api: &Api<K>, obj: &K, finalizers: Vec<String>) -> Result<()>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let patch = serde_json::json!({
        "metadata": {
            "resourceVersion": obj.meta().resource_version,
            "finalizers": finalizers,
        }
    });
    api.patch(
        &obj.meta().name.clone().unwrap_or_default(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::Cluster;

    const MINE: &str = "basalt.dev/delete-volumes";

    fn cluster(finalizers: &[&str], deleting: bool) -> Cluster {
        let mut c: Cluster = serde_norway::from_str(
            "metadata: {name: orders-c1, namespace: shop}\nspec: {instanceRef: orders, serveNodes: 1}\n",
        )
        .unwrap();
        if !finalizers.is_empty() {
            c.metadata.finalizers = Some(finalizers.iter().map(|f| f.to_string()).collect());
        }
        if deleting {
            c.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::now(),
                ));
        }
        c
    }

    #[test]
    fn the_finalizer_is_added_and_removed_with_the_wish_keeping_others() {
        assert_eq!(
            plan(&cluster(&[], false), MINE, true),
            Plan::SetFinalizers(vec![MINE.into()])
        );
        assert_eq!(
            plan(&cluster(&["other/keep"], false), MINE, true),
            Plan::SetFinalizers(vec!["other/keep".into(), MINE.into()])
        );
        assert_eq!(
            plan(&cluster(&["other/keep", MINE], false), MINE, false),
            Plan::SetFinalizers(vec!["other/keep".into()])
        );
        assert_eq!(
            plan(&cluster(&[MINE], false), MINE, true),
            Plan::Stay(Lifecycle::Live)
        );
        assert_eq!(
            plan(&cluster(&["other/keep"], false), MINE, false),
            Plan::Stay(Lifecycle::Live)
        );
    }

    #[test]
    fn a_deletion_is_never_given_or_relieved_of_the_finalizer_here() {
        // Held: the reconcile cleans up, then releases (even if the spec no longer wants it:
        // the wish is read when the finalizer is added, the cleanup when it is released).
        assert_eq!(
            plan(&cluster(&[MINE], true), MINE, false),
            Plan::Stay(Lifecycle::Deleting)
        );
        assert_eq!(
            plan(&cluster(&["other/keep"], true), MINE, true),
            Plan::Stay(Lifecycle::Released)
        );
        assert!(Lifecycle::Deleting.deleting() && Lifecycle::Released.deleting());
        assert!(!Lifecycle::Live.deleting() && !Lifecycle::Changed.deleting());
    }

    #[test]
    fn release_removes_only_its_own_finalizer() {
        assert_eq!(
            without(&cluster(&["a/b", MINE, "c/d"], true), MINE),
            ["a/b", "c/d"]
        );
    }
}
