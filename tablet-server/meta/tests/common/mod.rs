//! The real etcd of the tests (`basalt-test-etcd`, shared by every crate), and its endpoints
//! as basalt-meta connects to them.

#![allow(dead_code, unused_imports)]

pub use basalt_test_etcd::{Etcd, eventually};

/// The endpoints of a test's etcd, as basalt-meta connects to them.
pub trait Endpoints {
    fn endpoints(&self) -> basalt_meta::EtcdEndpoints;
}

impl Endpoints for Etcd {
    fn endpoints(&self) -> basalt_meta::EtcdEndpoints {
        basalt_meta::EtcdEndpoints::plaintext(&[self.url()]).expect("an etcd URL")
    }
}
