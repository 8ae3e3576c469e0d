//! A cluster's PodDisruptionBudget: voluntary evictions (node drains) take at most one tablet
//! server at a time.

use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{cluster_identity, cluster_selector, meta, owned_by};
use crate::crd::Cluster;

pub fn pod_disruption_budget(cluster: &Cluster) -> PodDisruptionBudget {
    let (name, namespace, labels) = cluster_identity(cluster);
    let selector = cluster_selector(&name);
    let mut pdb_meta = meta(name, &namespace, labels);
    pdb_meta.owner_references = Some(owned_by(cluster));
    PodDisruptionBudget {
        metadata: pdb_meta,
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(selector),
                ..LabelSelector::default()
            }),
            ..PodDisruptionBudgetSpec::default()
        }),
        ..PodDisruptionBudget::default()
    }
}
