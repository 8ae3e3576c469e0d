//! Basalt tablet server: the Bigtable-compatible data plane.
//!
//! * [`data_api`] and [`admin_api`] serve Google's public gRPC APIs
//!   (`google.bigtable.v2.Bigtable`, `google.bigtable.admin.v2.BigtableTableAdmin`);
//! * [`validate`] and [`filter`] are the pure request semantics (limits, RowSets, RowFilters);
//! * [`storage`] keeps rows durably in RocksDB using the key format of [`encoding`], with
//!   write versions from `basalt_model::hlc` and garbage collection from [`gc`];
//! * [`control_api`] serves Basalt's own control protocol (`basalt.control.v1`): the server's
//!   identity, readiness, storage and tablets, with the per-tablet load [`load`] counts;
//! * [`codec`] is the gRPC codec of both (prost, with bad nesting as INVALID_ARGUMENT);
//! * [`mode`] is chosen once at startup, standalone or [`cluster`] (registration, the tablet
//!   router, forwarding, the frontend's read and write paths, the move services): it provides
//!   the backends the handlers call, such as the admin API's [`catalog`];
//! * [`auth`] authenticates every request (bearer tokens, client certificates), [`access`]
//!   authorizes it with Bigtable's IAM roles and permissions, and [`iam_api`] serves the IAM
//!   methods on tables and the instance (`docs/security.md`);
//! * [`backups`] serves Bigtable's backup API, and [`log_backup`] ships the change log to the
//!   backup location for point-in-time recovery (`docs/backups.md`);
//! * [`server`] wires it together with the HTTP endpoints of [`http`] and [`metrics`].

pub mod access;
pub mod admin_api;
pub mod auth;
pub mod background;
pub mod backups;
pub mod catalog;
pub mod cluster;
pub mod codec;
pub mod control_api;
pub mod cpu;
pub mod data_api;
pub mod deadline;
pub mod error;
pub mod filter;
pub mod hot_tablets;
pub mod http;
pub mod iam_api;
pub mod inflight;
pub mod key_samples;
pub mod load;
pub mod log_backup;
pub mod metrics;
pub mod mode;
pub mod proto;
mod proto_time;
pub mod server;
pub mod token_review;
pub mod translate;
