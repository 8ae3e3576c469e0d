//! The Basalt operator: the `Instance`, `Cluster`, `Table` and `AppProfile` custom resources and
//! the controllers that turn them into tablet servers, Services and table schemas.
//!
//! Each reconcile follows one shape: read everything it needs → validate (pure,
//! [`rules`]) → build the desired objects (pure, [`build`], [`admin`]) → apply them with
//! server-side apply → write status from what was observed.

pub mod admin;
pub mod build;
pub mod conditions;
pub mod controller;
pub mod crd;
pub mod http;
pub mod keyviz;
pub mod lifecycle;
pub mod local;
pub mod master;
pub mod metrics;
pub mod prometheus;
pub mod quantity;
pub mod rules;
pub mod tablet_servers;
