//! The control services of a cluster server that move tablets: both ends of a move as the
//! `basalt.control.v1.TabletMove` service (see `docs/cluster.md`, "Tablet moves"). The server's
//! status is `crate::control_api`'s (standalone and cluster alike).
//!
//! * [`service`]: the move steps on this server (source and destination);
//! * [`transfer`]: the tablet's data on the wire (snapshot files and log records);
//! * [`registry`]: the moves this server takes part in;
//! * [`reconcile`]: the end, here, of moves whose record is gone from etcd.

pub mod reconcile;
pub mod registry;
pub mod service;
pub mod transfer;
