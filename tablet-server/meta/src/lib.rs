//! Basalt's coordination store: etcd plays the role Chubby plays for Bigtable
//! (`../shared/DISTRIBUTED.md`). Under one prefix per instance it holds the catalog (table
//! schemas, app profiles), each cluster's tablet servers (registrations bound to leases) and
//! tablets (owner, epoch, state), and the master's election.
//!
//! * [`keys`]: the key layout (pure);
//! * [`records`]: the values (JSON) and their translation to the model's tablets;
//! * [`client`]: [`Meta`], reads and transactions;
//! * [`follow`]: a cluster's tablet map kept up to date from watch events;
//! * [`registration`]: a server's lease and its serving deadline;
//! * [`election`]: the master's election and its fencing term;
//! * [`replication`]: cluster numbers and how far each server's change log reached each peer;
//! * [`keyviz`]: where the Key Visualizer's history is kept (beside the instance's prefix);
//! * [`routing`]: where an app profile sends a request (pure; the servers route by it, the
//!   operator shows it in an AppProfile's status).

pub mod client;
pub mod election;
pub mod follow;
pub mod held;
pub mod keys;
pub mod keyviz;
pub mod records;
pub mod registration;
pub mod replication;
pub mod routing;
pub mod term;

pub use client::{
    EtcdEndpoints, Meta, Registered, Security, StoredSchema, TabletSnapshot, endpoints, table_id,
};
pub use election::Leadership;
pub use follow::{Followed, TabletFollower, WatchEvent, WatchMessage};
pub use keys::Keys;
pub use records::{
    AppProfilePriority, AppProfileRecord, AppProfileRouting, AutoscalerRecord, AutoscalingRecord,
    MovePhase, MoveRecord, ServerRecord, TabletRecord,
};
pub use registration::{LeaseTiming, Liveness, Registration};
pub use replication::{ReplicationLimits, SeedRange, SeedRecord, ShippedRecord};
pub use term::Term;
