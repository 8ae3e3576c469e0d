//! The data API of a cluster server: every server accepts every request. Rows of tablets it
//! owns are served by the local [`DataService`](crate::data_api::DataService); other rows are
//! forwarded to their owners (see [`crate::cluster::forwarding`]): single-row calls as they
//! are, MutateRows split by owner, ReadRows tablet by tablet in key order, SampleRowKeys
//! merged over every owner. A request's table is resolved once, then passed down.
//!
//! * [`state`]: the [`Frontend`] and the resolution of a request's table;
//! * [`reads`]: ReadRows and SampleRowKeys;
//! * [`writes`]: MutateRow, MutateRows, CheckAndMutateRow, ReadModifyWriteRow;
//! * [`service`]: the `Bigtable` service over them.

pub mod reads;
pub mod service;
pub mod state;
pub mod writes;

pub use state::Frontend;
