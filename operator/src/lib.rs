//! The Basalt operator: the `Instance`, `Cluster`, `Table` and `AppProfile` custom resources and
//! the controllers that turn them into tablet servers, Services and table schemas.

pub mod crd;
