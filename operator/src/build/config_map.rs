//! An instance's ConfigMap: what its tablet servers read from `/etc/basalt` — the instance's
//! identity (`instance.json`) and its valid app profiles (`app-profiles.json`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use serde::Serialize;

use super::{
    LABEL_COMPONENT, instance_config_map_name, instance_labels, meta, owned_by, project_id,
};
use crate::crd::{AppProfile, Instance};

/// One app profile as published to the tablet servers (`app-profiles.json`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PublishedAppProfile {
    pub id: String,
    pub description: String,
    pub routing: crate::crd::Routing,
    pub priority: crate::crd::Priority,
}

/// `app_profiles` are the instance's valid AppProfiles; they are published sorted by id.
pub fn instance_config_map(instance: &Instance, app_profiles: &[&AppProfile]) -> ConfigMap {
    let name = instance.metadata.name.clone().unwrap_or_default();
    let namespace = instance.metadata.namespace.clone().unwrap_or_default();
    let mut profiles: Vec<PublishedAppProfile> = app_profiles
        .iter()
        .map(|p| PublishedAppProfile {
            id: p.app_profile_id(),
            description: p.spec.description.clone().unwrap_or_default(),
            routing: p.spec.routing.clone(),
            priority: p.spec.priority,
        })
        .collect();
    profiles.sort_by(|a, b| a.id.cmp(&b.id));
    let instance_json = serde_json::json!({
        "project": project_id(instance),
        "instance": name,
    });
    let mut labels = instance_labels(&name);
    labels.insert(LABEL_COMPONENT.into(), "config".into());
    let mut cm_meta = meta(instance_config_map_name(&name), &namespace, labels);
    cm_meta.owner_references = Some(owned_by(instance));
    ConfigMap {
        metadata: cm_meta,
        data: Some(BTreeMap::from([
            (
                "instance.json".into(),
                serde_json::to_string_pretty(&instance_json).expect("plain JSON"),
            ),
            (
                "app-profiles.json".into(),
                serde_json::to_string_pretty(&profiles).expect("plain JSON"),
            ),
        ])),
        ..ConfigMap::default()
    }
}
