//! The [`Frontend`] itself: what its read and write paths share (the node, the local data
//! API, the peer pool) and the resolution of a request's table, made once per request.

use std::sync::Arc;
use std::time::Duration;

use googleapis_tonic_google_bigtable_v2::google::bigtable::v2 as pb;
use tonic::{Request, Status};

use basalt_model::TableSchema;
use basalt_model::schema::parse_table_name;
use basalt_storage::Store;

use crate::cluster::forwarding::{FailoverAfter, Peers, client_deadline, is_forwarded};
use crate::cluster::node::Node;
use crate::data_api::DataService;
use crate::error::{Error, Result, status};
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

    /// The dialer every connection to another server goes through.
    pub fn dialer(&self) -> &basalt_transport::Dialer {
        &self.node.dialer
    }

    /// The table a request names, after the checks a standalone server makes first: a valid
    /// name, of this cluster's instance (another instance is NOT_FOUND, as in Bigtable), of a
    /// table that exists — in this server's copy of the catalog, after catching up with etcd
    /// for a table created through another server (see [`crate::cluster::catalog::table`]) —
    /// and serves (no restore is filling it).
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
        schema.check_serving()?;
        Ok(ResolvedTable {
            schema,
            id: table.to_string(),
        })
    }
}

/// A request of the data API about a table (and maybe one of its authorized views).
pub(super) trait OnTable {
    /// Its table's and view's resource names (empty: none given).
    fn table(&self) -> (&str, &str);
}

macro_rules! on_table {
    ($($request:ty),*) => {$(
        impl OnTable for $request {
            fn table(&self) -> (&str, &str) {
                (&self.table_name, &self.authorized_view_name)
            }
        }
    )*};
}

on_table!(
    pb::ReadRowsRequest,
    pb::SampleRowKeysRequest,
    pb::MutateRowRequest,
    pb::MutateRowsRequest,
    pb::CheckAndMutateRowRequest,
    pb::ReadModifyWriteRowRequest
);

/// A request accepted by the frontend: whether another server forwarded it (`hop`), the
/// client's deadline, how long to wait for a row's owner (`failover`, from the router), the
/// request, and its table resolved once.
pub(super) struct Accepted<R> {
    pub hop: bool,
    pub deadline: Option<Duration>,
    pub failover: FailoverAfter,
    pub req: R,
    pub table: ResolvedTable,
}

impl Frontend {
    /// What every handler does first: reads the hop mark and the client's deadline, and
    /// resolves the request's table ([`Frontend::resolve`]).
    pub(super) async fn accept<R: OnTable>(
        &self,
        request: Request<R>,
    ) -> std::result::Result<Accepted<R>, Status> {
        let hop = is_forwarded(&request);
        let deadline = client_deadline(request.metadata());
        let failover = FailoverAfter::of(request.metadata());
        let req = request.into_inner();
        let (table_name, view_name) = req.table();
        let table = self.resolve(table_name, view_name).await.map_err(status)?;
        Ok(Accepted {
            hop,
            deadline,
            failover,
            req,
            table,
        })
    }
}
