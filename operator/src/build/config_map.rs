//! An instance's ConfigMap, mounted in its tablet servers at `/etc/basalt`: the instance's
//! identity (`instance.json`).
//!
//! App profiles are not in it: they are published one way, as records in the instance's
//! catalog in etcd (`app-profiles/<id>`, put by the AppProfile controller).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;

use super::{
    LABEL_COMPONENT, instance_config_map_name, instance_labels, meta, owned_by, project_id,
};
use crate::crd::Instance;

pub fn instance_config_map(instance: &Instance) -> ConfigMap {
    let name = instance.metadata.name.clone().unwrap_or_default();
    let namespace = instance.metadata.namespace.clone().unwrap_or_default();
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
        data: Some(BTreeMap::from([(
            "instance.json".into(),
            serde_json::to_string_pretty(&instance_json).expect("plain JSON"),
        )])),
        ..ConfigMap::default()
    }
}
