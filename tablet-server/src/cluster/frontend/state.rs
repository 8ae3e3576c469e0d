//! The [`Frontend`] itself: what its read and write paths share (the node, the local data
//! API, the peer pool) and the resolution of a request's table, made once per request.

use std::sync::Arc;

use basalt_model::TableSchema;
use basalt_model::schema::parse_table_name;
use basalt_storage::Store;

use crate::cluster::forwarding::Peers;
use crate::cluster::node::Node;
use crate::data_api::DataService;
use crate::error::{Error, Result};
use crate::metrics::Metrics;

/// The data API of a cluster server (see [`super`]).
pub struct Frontend {
    pub(super) node: Arc<Node>,
    pub(super) local: Arc<DataService<Store>>,
    pub(super) peers: Peers,
    pub(super) metrics: Arc<Metrics>,
}

/// A request's table, resolved once: its schema in this server's copy of the catalog (what
/// the local data API serves it with) and its id (what the tablet map knows it by).
#[derive(Clone)]
pub(super) struct ResolvedTable {
    pub schema: Arc<TableSchema>,
    pub id: String,
}

impl Frontend {
    pub fn new(node: Arc<Node>, local: Arc<DataService<Store>>, metrics: Arc<Metrics>) -> Self {
        Frontend {
            peers: Peers::new(node.dialer.clone()),
            node,
            local,
            metrics,
        }
    }

    /// The table a request names, after the checks a standalone server makes first: a valid
    /// name, of this cluster's instance (another instance is NOT_FOUND, as in Bigtable), of a
    /// table that exists — in this server's copy of the catalog, after catching up with etcd
    /// for a table created through another server (see [`crate::cluster::catalog::table`]).
    pub(super) async fn resolve(&self, table_name: &str, view_name: &str) -> Result<ResolvedTable> {
        if table_name.is_empty() {
            if !view_name.is_empty() {
                return Err(Error::Unimplemented(
                    "authorized and materialized views are not supported by Basalt yet".into(),
                ));
            }
            return Err(Error::InvalidArgument("table_name is required".into()));
        }
        let (instance, table) = parse_table_name(table_name)?;
        if instance != self.node.config.instance_name() {
            return Err(Error::NotFound(format!("table {table_name} not found")));
        }
        let schema = crate::cluster::catalog::table(&self.node, table_name).await?;
        Ok(ResolvedTable {
            schema,
            id: table.to_string(),
        })
    }
}
