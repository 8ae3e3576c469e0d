//! The cluster lifecycle, written once for both runtimes: what the Kubernetes controllers and
//! the local runtime (`basalt-operator local`) both do to an instance's metadata store and
//! tablet servers. Each runtime keeps only what is its own — Kubernetes objects, events and
//! status subresources; processes, the endpoint and `local.json` — and calls these:
//!
//! * [`view`]: the one [`basalt_master::ClusterView`] built from etcd (the master decides on
//!   it; the scale-in's status is computed from it);
//! * [`autoscaling`]: a Cluster's autoscaling settings recorded for the master's autoscaler,
//!   whose decision is the count the cluster requests;
//! * [`backups`]: `Backup` and `BackupSchedule` manifests carried out through the backup API
//!   (what a backup does next, when a schedule runs, which of its backups it prunes), and the
//!   tablet servers' point-in-time recovery flags;
//! * [`certificates`]: the operator's certificate authority — the CA, the leaves of an
//!   instance's processes and identities (and how they are named), when each must be issued
//!   again — and its bearer tokens;
//! * [`drain`](mod@drain): a scale-in's drain as both runtimes report it;
//! * [`scale`]: how many servers a cluster runs, and the step that records the count for the
//!   master and runs them through a [`basalt_master::NodeRuntime`];
//! * [`records`]: the intents a runtime writes for the master — a cluster's serve-nodes count,
//!   the instance's replicas, the instance's app profiles;
//! * [`replication`]: how far behind each cluster of an instance is of each other one;
//! * [`routing`]: where an app profile routes now (the servers' decision, on etcd's view of
//!   the clusters);
//! * [`removal`]: whether a cluster may leave the instance (every write it logged is in a
//!   cluster that stays);
//! * [`security`]: what a secured instance's processes are given (files, flags, first
//!   administrators, Basalt's own principals);
//! * [`tables`]: a `Table` manifest brought to its spec through the table admin API;

pub mod autoscaling;
pub mod backups;
pub mod certificates;
pub mod drain;
pub mod records;
pub mod removal;
pub mod replication;
pub mod routing;
pub mod scale;
pub mod security;
pub mod tables;
pub mod view;
