//! Cluster mode: the server registers in its instance's coordination store (etcd), mirrors the
//! instance's catalog into its store, follows its cluster's tablet map, serves the tablets it
//! owns while its lease is current, and is a frontend for every other tablet (see
//! `../shared/DISTRIBUTED.md` and `docs/cluster.md`). One room per role:
//!
//! * [`node`]: the registered server's shared state ([`Node`]) and its registration;
//! * [`mirror`]: the catalog mirror, which keeps the store's schemas and the tablet map current;
//! * [`tablet_router`]: the tablet map seen from this server — which server serves a row;
//! * [`forwarding`]: the peer pool, the forwarded mark and deadlines, the retry on "not owner";
//! * [`frontend`]: the data API of a cluster server (its read and write paths);
//! * [`catalog`]: table administration through etcd;
//! * [`moves`]: the control services that move tablets (the move steps on this server);
//! * [`routing`]: routing requests to clusters by app profile, and failover;
//! * [`replication`]: shipping the change log to the other clusters, applying theirs, and
//!   consistency tokens.

pub mod catalog;
pub mod forwarding;
pub mod frontend;
pub mod mirror;
pub mod moves;
pub mod node;
pub mod replication;
pub mod routing;
pub mod tablet_router;

pub use node::{Advertised, ClusterConfig, Node};
