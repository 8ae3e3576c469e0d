//! The master's runtime: campaigns for the instance's master role in etcd and, while it leads,
//! carries out the pure decisions of `basalt-master` (tablet assignment of new tables, lost
//! servers) as etcd transactions fenced by its term. Work in progress (issue 12): the loop is
//! being written; this module fixes the entry point the local runtime and `run` call.

use std::future::Future;

/// Which instance's master this is and how to reach its etcd.
#[derive(Clone, Debug)]
pub struct MasterConfig {
    /// etcd client URLs, e.g. `http://127.0.0.1:2379`.
    pub etcd_endpoints: Vec<String>,
    /// The Kubernetes namespace of the Instance (`default` in the local runtime unless the
    /// manifest names one): part of the etcd prefix `/basalt/v1/<namespace>/<instance>/`.
    pub namespace: String,
    /// The Instance's name.
    pub instance: String,
    /// This candidate's name in the election (pod name, or `local`).
    pub identity: String,
}

/// Runs the master for one instance until `shutdown` resolves.
pub async fn run(
    config: MasterConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    let _ = config;
    shutdown.await;
    Ok(())
}
