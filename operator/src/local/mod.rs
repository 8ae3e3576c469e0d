//! `basalt-operator local`: the same manifests as on Kubernetes, run as processes on
//! 127.0.0.1 — one etcd, every Cluster's tablet servers in cluster mode, each Instance's
//! master (in this process) and an endpoint per Instance that spreads client connections over
//! its servers like a Service (the first on 127.0.0.1:8086, so `BIGTABLE_EMULATOR_HOST`
//! keeps its usual value). `docs/local-runtime.md` is the user's guide.
//!
//! The parts, each in its file:
//!
//! * [`manifests`] — multi-document YAML into the CRD types, validated with the operator's
//!   own rules and grouped by Instance (pure);
//! * [`plan`] — what an apply changes, or why it is refused (pure);
//! * [`scale_in`] — lowering a cluster's count in two steps: drain, then stop the servers
//!   etcd's tablet map says own nothing (the decisions, pure);
//! * [`process`] — one supervised child process: restarted when it exits, probed, stopped;
//! * [`etcd`], [`servers`] — the command lines of etcd and the tablet servers (pure) and
//!   their supervised processes;
//! * [`endpoint`] — the per-instance TCP proxy;
//! * the cluster lifecycle both runtimes share (tables, serve-nodes and app-profile records,
//!   the drain's view) is [`crate::lifecycle`]'s;
//! * [`state`] — `local.json` and the remembered ports;
//! * [`control`] — the apply channel (the runtime's HTTP server, `local apply`'s client);
//! * [`status`] — `local status`;
//! * [`runtime`] — the running whole: start, apply, stop.

pub mod control;
pub mod endpoint;
pub mod etcd;
pub mod http;
pub mod manifests;
pub mod plan;
pub mod process;
pub mod runtime;
pub mod scale_in;
pub mod security;
pub mod servers;
pub mod state;
pub mod status;

pub use runtime::{DEFAULT_ENDPOINT, Options};

/// Runs the manifests until SIGINT or SIGTERM, `local apply` and `local status` served by
/// [`control`].
pub async fn run(options: Options) -> anyhow::Result<()> {
    runtime::run(options, |listener, runtime| {
        Box::pin(control::serve(listener, runtime))
    })
    .await
}

/// `--data-dir`'s default.
pub const DEFAULT_DATA_DIR: &str = "./basalt-local";
