//! The Kubernetes [`NodeRuntime`]: a cluster's tablet servers are the pods of its StatefulSet.
//! Setting the count is a server-side apply of the StatefulSet the reconcile built, with that
//! many replicas (one field manager for the whole object, so nothing else competes for
//! `replicas`); the StatefulSet controller removes the highest ordinals first, as the
//! lifecycle expects. Restarting a server deletes its pod: the StatefulSet recreates it on the
//! same volume claim, under the same name.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};

use basalt_master::NodeRuntime;

use crate::build;
use crate::controller::{Context, Error, apply as server_side_apply};

/// One cluster's StatefulSet, as this reconcile built it.
pub struct StatefulSetNodes<'a> {
    ctx: &'a Context,
    cluster: String,
    namespace: String,
    built: StatefulSet,
    applied: std::sync::Mutex<Option<StatefulSet>>,
}

impl<'a> StatefulSetNodes<'a> {
    /// The nodes of `cluster` (in `namespace`), run by `built` with the replicas it is given.
    pub fn new(ctx: &'a Context, cluster: &str, namespace: &str, built: StatefulSet) -> Self {
        StatefulSetNodes {
            ctx,
            cluster: cluster.to_string(),
            namespace: namespace.to_string(),
            built,
            applied: std::sync::Mutex::new(None),
        }
    }

    /// The StatefulSet as the API server returned it from the last apply (its status is the
    /// rollout's); None before any.
    pub fn applied(&self) -> Option<StatefulSet> {
        self.applied
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn check(&self, cluster: &str) -> Result<(), Error> {
        if cluster == self.cluster {
            return Ok(());
        }
        Err(Error::Misdirected(format!(
            "the StatefulSet of cluster {} was asked for cluster {cluster}",
            self.cluster
        )))
    }
}

impl NodeRuntime for StatefulSetNodes<'_> {
    type Error = Error;

    async fn set_servers(&self, cluster: &str, servers: u32) -> Result<(), Error> {
        self.check(cluster)?;
        let mut sts = self.built.clone();
        sts.spec.get_or_insert_with(Default::default).replicas = Some(servers as i32);
        let api: Api<StatefulSet> = Api::namespaced(self.ctx.client.clone(), &self.namespace);
        let applied = server_side_apply(&api, &sts).await?;
        tracing::debug!(statefulset = %applied.name_any(), servers, "replicas applied");
        *self.applied.lock().unwrap_or_else(|e| e.into_inner()) = Some(applied);
        Ok(())
    }

    async fn restart(&self, cluster: &str, ordinal: u32) -> Result<(), Error> {
        self.check(cluster)?;
        let pod = format!("{}-{ordinal}", build::statefulset_name(cluster));
        let api: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &self.namespace);
        api.delete(&pod, &DeleteParams::default()).await?;
        tracing::info!(%pod, "pod deleted: the StatefulSet recreates it on its volume");
        Ok(())
    }
}
