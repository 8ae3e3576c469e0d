//! The Key Visualizer (`docs/key-visualizer.md`): where each table's load is, as a heatmap of
//! key ranges over time, Bigtable's and TiDB Dashboard's tool, for both runtimes.
//!
//! * every tablet server samples its requests per minute and key range
//!   (`tablet-server/src/key_samples.rs`, served as `GetKeySamples` of the control protocol);
//! * [`collector`]: the instance's master gathers them every minute into each table's layered
//!   history (`basalt_model::keyviz`, pure) and keeps it in the instance's etcd;
//! * [`api`]: the page and its JSON API, read from etcd, served by the operator's HTTP port
//!   on Kubernetes and by the local runtime's control port; [`Sources`] says which instances
//!   there are and how to reach their etcd;
//! * `basalt_control::keyviz`: the translations between the wire, the stored columns and the
//!   model.

pub mod api;
pub mod collector;

use std::collections::BTreeMap;

use basalt_meta::{EtcdEndpoints, Keys, Meta};
use parking_lot::RwLock;

/// An Instance: (namespace, name).
pub type InstanceKey = (String, String);

/// How to reach one instance's etcd.
#[derive(Clone, Debug)]
pub struct Source {
    pub endpoints: Vec<String>,
    pub security: basalt_transport::Security,
}

/// The instances the Key Visualizer can show, kept up to date by the runtime (the operator's
/// masters' supervisor; the local runtime's instances), with their etcd clients connected on
/// first use.
#[derive(Default)]
pub struct Sources {
    instances: RwLock<BTreeMap<InstanceKey, Source>>,
    connected: tokio::sync::Mutex<BTreeMap<InstanceKey, (Vec<String>, Meta)>>,
}

impl Sources {
    pub fn set(&self, key: InstanceKey, source: Source) {
        self.instances.write().insert(key, source);
    }

    pub fn remove(&self, key: &InstanceKey) {
        self.instances.write().remove(key);
    }

    /// The instances, in (namespace, name) order.
    pub fn instances(&self) -> Vec<InstanceKey> {
        self.instances.read().keys().cloned().collect()
    }

    /// A client of the instance's etcd (None: no such instance).
    pub async fn meta(&self, key: &InstanceKey) -> Option<anyhow::Result<Meta>> {
        let source = self.instances.read().get(key).cloned()?;
        let mut connected = self.connected.lock().await;
        if let Some((urls, meta)) = connected.get(key)
            && *urls == source.endpoints
        {
            return Some(Ok(meta.clone()));
        }
        let result = async {
            let endpoints = EtcdEndpoints::new(&source.endpoints, &source.security)?;
            let meta = Meta::connect(&endpoints, Keys::new(&key.0, &key.1)).await?;
            Ok::<_, anyhow::Error>(meta)
        }
        .await;
        if let Ok(meta) = &result {
            connected.insert(key.clone(), (source.endpoints.clone(), meta.clone()));
        }
        Some(result)
    }
}
