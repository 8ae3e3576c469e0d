//! Routing by app profile (`docs/app-profiles.md`): every server reads the instance's app
//! profiles and routes each client request to the cluster its profile names — single-cluster
//! routing to one cluster wherever the request arrived, multi-cluster routing to the nearest
//! healthy cluster with failover — and gates single-row transactions. One room per role:
//!
//! * [`decide`]: the decision, pure (profile, transactions, the clusters to try in order,
//!   row affinity): `basalt_meta::routing`, which the operator shares;
//! * [`health`]: the health and latency table of the clusters, pure;
//! * [`priority`]: admission by the profile's priority (HIGH, MEDIUM, LOW);
//! * [`state`]: what routing reads, kept current from etcd;
//! * [`service`]: the `Bigtable` service that carries the decision out, in front of the
//!   cluster's [`Frontend`](crate::cluster::frontend::Frontend).

pub use basalt_meta::routing as decide;
pub mod health;
pub mod priority;
pub mod service;
pub mod state;

pub use service::Routed;
pub use state::Routing;
