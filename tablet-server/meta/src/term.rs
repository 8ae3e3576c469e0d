//! A leader's term (see [`crate::election`]): the comparison that fences every transaction of
//! the master that holds it.

use etcd_client::{Compare, CompareOp};

/// A leader's term: its transactions succeed only while its leader key still exists with
/// this create revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Term {
    pub revision: i64,
    pub key: Vec<u8>,
}

impl Term {
    /// The comparison every transaction of this leader carries.
    pub fn compare(&self) -> Compare {
        Compare::create_revision(self.key.clone(), CompareOp::Equal, self.revision)
    }
}
