//! Where table schemas change: the admin API's backend, chosen once at startup (see
//! [`crate::mode`]). A standalone server's catalog is its own store ([`LocalCatalog`]); a
//! cluster server's is the instance's catalog in etcd (`cluster::catalog::EtcdCatalog`),
//! mirrored into every server's store. Reads of schemas (GetTable, ListTables) always come
//! from this server's store.

use std::sync::Arc;

use basalt_model::iam::{self, Policy, PolicyError};
use basalt_model::{FamilyChange, TableSchema};
use basalt_storage::Store;
use bytes::Bytes;
use googleapis_tonic_google_bigtable_admin_v2::google::bigtable::admin::v2 as admin;

use crate::cluster::forwarding::Reach;
use crate::error::{Error, Result};

/// The schema changes of the admin API, and the instance they belong to.
#[tonic::async_trait]
pub trait Catalog: Send + Sync {
    /// NOT_FOUND for an instance this server does not serve (as Bigtable answers).
    fn check_instance(&self, instance: &str) -> Result<()>;

    /// Waits (bounded) until this server's copy of the catalog shows `table_name` when the
    /// catalog has it (a table created through another server); nothing otherwise.
    async fn catch_up(&self, table_name: &str);

    /// The IAM policy of the instance `instance` (`table` None) or of the table of that full
    /// name, as last set (None: never set).
    async fn iam_policy(&self, instance: &str, table: Option<&str>) -> Result<Option<Policy>>;

    /// Replaces the IAM policy by `new` (see [`iam::replace`]: the etag check), atomically
    /// against concurrent changes. NOT_FOUND for a table that does not exist.
    async fn set_iam_policy(
        &self,
        instance: &str,
        table: Option<&str>,
        new: Policy,
    ) -> Result<std::result::Result<Policy, PolicyError>>;

    /// A new table, as `schema` describes it (the catalog gives it its internal id and
    /// creation time). A restore's table has its `restore` set (`operation` too: it serves no
    /// data until [`Catalog::finish_restore`]) and may have `dropped_families`: cells of those
    /// families at or below their clock values are dead from the start, since the backup
    /// holds the source's dead cells.
    async fn create_table(&self, schema: TableSchema) -> Result<Arc<TableSchema>>;

    /// Ends the restore filling table `name`, if that table is still the one of internal id
    /// `id` and still being filled by `operation`; from then on it serves data requests.
    /// NOT_FOUND if it is gone or another table; FAILED_PRECONDITION if no such restore is
    /// filling it (it was taken for abandoned).
    async fn finish_restore(&self, name: &str, id: u64, operation: &str) -> Result<()>;

    /// Deletes table `name` if it is still the one of internal id `id`, still being filled by
    /// the restore `operation` (a restore that failed, or whose server stopped). False if it
    /// is not: that restore ended, or the table is another one.
    async fn delete_unfinished_restore(&self, name: &str, id: u64, operation: &str)
    -> Result<bool>;

    async fn set_deletion_protection(&self, name: &str, protect: bool) -> Result<Arc<TableSchema>>;

    async fn modify_column_families(
        &self,
        name: &str,
        changes: &[FamilyChange],
    ) -> Result<Arc<TableSchema>>;

    async fn delete_table(&self, name: &str) -> Result<()>;

    /// Drops the rows of table `name` (those under `prefix`, or all), as far as `reach` says:
    /// everywhere (a client's request), in this cluster (another cluster's), or only the rows
    /// held here (another server's of this cluster).
    async fn drop_row_range(
        &self,
        request: &admin::DropRowRangeRequest,
        prefix: Option<Bytes>,
        reach: Reach,
    ) -> Result<()>;

    /// The clusters that hold every table of the instance (empty: only this server's).
    fn replicas(&self) -> Vec<String>;

    /// The clusters of [`Catalog::replicas`] that are still being seeded with `table` (they
    /// joined the instance after it had data; `docs/replication.md`).
    fn initializing(&self, table: &TableSchema) -> Vec<String>;

    /// A consistency token of `table`: it covers every write acknowledged before the call.
    async fn consistency_token(&self, table: &TableSchema) -> Result<String>;

    /// Whether the reads `mode` names see every write `token` covers; None when `token` was
    /// not made by [`Catalog::consistency_token`] for `table`.
    async fn check_consistency(
        &self,
        table: &TableSchema,
        token: &str,
        mode: ConsistencyMode,
    ) -> Result<Option<bool>>;
}

/// Which reads must see the writes a consistency token covers (`CheckConsistencyRequest.mode`;
/// `docs/replication.md`, "Consistency tokens").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ConsistencyMode {
    /// `standard_read_remote_writes`, the default: "reads using an app profile with
    /// StandardIsolation can see all writes committed before the token was created, even if
    /// the read and write target different clusters" — every write, in every cluster.
    #[default]
    StandardReadRemoteWrites,
    /// `data_boost_read_local_writes`: reads "can see all writes committed before the token
    /// was created, but only if the read and write target the same cluster" — each write in
    /// the cluster that acknowledged it.
    DataBoostReadLocalWrites,
}

impl ConsistencyMode {
    /// The mode a request names (none: the default).
    pub fn of(mode: Option<admin::check_consistency_request::Mode>) -> ConsistencyMode {
        use admin::check_consistency_request::Mode;
        match mode {
            None | Some(Mode::StandardReadRemoteWrites(_)) => {
                ConsistencyMode::StandardReadRemoteWrites
            }
            Some(Mode::DataBoostReadLocalWrites(_)) => ConsistencyMode::DataBoostReadLocalWrites,
        }
    }
}

/// The form of a standalone server's consistency tokens: `basalt-ct1-<table id>-<clock>`.
const LOCAL_TOKEN_PREFIX: &str = "basalt-ct1";

/// A standalone server's catalog: its own store, every instance's tables.
pub struct LocalCatalog {
    store: Arc<Store>,
}

impl LocalCatalog {
    pub fn new(store: Arc<Store>) -> LocalCatalog {
        LocalCatalog { store }
    }
}

#[tonic::async_trait]
impl Catalog for LocalCatalog {
    fn check_instance(&self, _instance: &str) -> Result<()> {
        Ok(())
    }

    async fn catch_up(&self, _table_name: &str) {}

    async fn iam_policy(&self, instance: &str, table: Option<&str>) -> Result<Option<Policy>> {
        Ok(self.store.iam_policy(table.unwrap_or(instance))?)
    }

    async fn set_iam_policy(
        &self,
        instance: &str,
        table: Option<&str>,
        new: Policy,
    ) -> Result<std::result::Result<Policy, PolicyError>> {
        let (store, resource) = (self.store.clone(), table.unwrap_or(instance).to_string());
        let is_table = table.is_some();
        Ok(tokio::task::spawn_blocking(move || {
            store.update_iam_policy(&resource, is_table, |current| iam::replace(current, new))
        })
        .await
        .map_err(|e| Error::Internal(e.to_string()))??)
    }

    async fn create_table(&self, schema: TableSchema) -> Result<Arc<TableSchema>> {
        Ok(self.store.create_table_from(schema)?)
    }

    async fn finish_restore(&self, name: &str, id: u64, operation: &str) -> Result<()> {
        let table = self.store.table(name)?;
        if table.id == id && table.restoring() != Some(operation) {
            return Err(Error::FailedPrecondition(format!(
                "table {name} is not being restored by {operation}"
            )));
        }
        self.store.finish_restore(name, id)?;
        Ok(())
    }

    async fn delete_unfinished_restore(
        &self,
        name: &str,
        id: u64,
        operation: &str,
    ) -> Result<bool> {
        // Asked by the restore itself once it failed, or by the sweep for a restore not
        // running in this process (begun by one that stopped): checking, then deleting, does
        // not race with the restore's end.
        match self.store.table(name) {
            Ok(t) if t.id == id && t.restoring() == Some(operation) => {
                self.delete_table(name).await?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn set_deletion_protection(&self, name: &str, protect: bool) -> Result<Arc<TableSchema>> {
        Ok(self.store.set_deletion_protection(name, protect)?)
    }

    async fn modify_column_families(
        &self,
        name: &str,
        changes: &[FamilyChange],
    ) -> Result<Arc<TableSchema>> {
        Ok(self.store.modify_column_families(name, changes)?)
    }

    async fn delete_table(&self, name: &str) -> Result<()> {
        // Waits for the writes queued before it (see `Store::delete_table`): not on the
        // runtime's threads.
        let (store, name) = (self.store.clone(), name.to_string());
        Ok(
            tokio::task::spawn_blocking(move || store.delete_table(&name))
                .await
                .map_err(|e| Error::Internal(e.to_string()))??,
        )
    }

    async fn drop_row_range(
        &self,
        request: &admin::DropRowRangeRequest,
        prefix: Option<Bytes>,
        _reach: Reach,
    ) -> Result<()> {
        let (store, name) = (self.store.clone(), request.name.clone());
        Ok(
            tokio::task::spawn_blocking(move || store.drop_row_range(&name, prefix.as_deref()))
                .await
                .map_err(|e| Error::Internal(e.to_string()))??,
        )
    }

    fn replicas(&self) -> Vec<String> {
        vec![]
    }

    fn initializing(&self, _table: &TableSchema) -> Vec<String> {
        vec![]
    }

    /// One server holds every row: consistent once every write up to the token's clock
    /// reading is durable here.
    async fn consistency_token(&self, table: &TableSchema) -> Result<String> {
        // Every write acknowledged before this call has a version at or below `now`.
        let now = self.store.clock_now();
        Ok(format!("{LOCAL_TOKEN_PREFIX}-{}-{now}", table.id))
    }

    /// One server holds every row, and is the only cluster: every mode asks the same.
    async fn check_consistency(
        &self,
        table: &TableSchema,
        token: &str,
        _mode: ConsistencyMode,
    ) -> Result<Option<bool>> {
        let mut parts = token.rsplitn(3, '-');
        let (Some(at), Some(table_id), Some(prefix)) = (parts.next(), parts.next(), parts.next())
        else {
            return Ok(None);
        };
        let Ok(at) = at.parse::<u64>() else {
            return Ok(None);
        };
        if prefix != LOCAL_TOKEN_PREFIX || table_id != table.id.to_string() {
            return Ok(None);
        }
        Ok(Some(self.store.durable_through() >= at))
    }
}
