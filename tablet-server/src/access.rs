//! Authorization with Bigtable's model: every RPC of the data and admin APIs needs one of
//! Bigtable's permissions on a resource — the table it names (an authorized view counts as its
//! table), or the instance — and the caller ([`Principal`], from [`crate::auth`]) must hold it
//! under the resource's IAM policies: the instance's, and for a table also the table's (a
//! table inherits its instance's grants), plus the `--admin-principal`s' bootstrap grant of
//! `roles/bigtable.admin` on every instance. The evaluation is the model's pure
//! [`basalt_model::iam`]; policies are kept by the [`Catalog`] (the store of a standalone
//! server, etcd for a cluster).
//!
//! [`Authorized`] wraps the services, so the check is written once for every mode (the
//! standalone data service, a cluster server's router): before a call reaches the service, or
//! is denied PERMISSION_DENIED naming the permission and the resource. A call from Basalt's own
//! processes (a request another server forwards, already checked there by the identity of
//! its original caller) passes.
//!
//! Policies are cached for [`CACHE_FOR`]: a policy set through another server of the cluster
//! takes effect there within it (IAM changes are not instantaneous on Bigtable either).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use basalt_model::iam::{self, Policy};
use basalt_model::schema::{parse_instance_name, parse_table_name};
use googleapis_tonic_google_bigtable_admin_v2::google::bigtable::admin::v2 as admin;
use googleapis_tonic_google_bigtable_v2::google::bigtable::v2 as pb;
use googleapis_tonic_google_iam_v1::google::iam::v1 as iampb;
use googleapis_tonic_google_longrunning::google::longrunning as lro;
use parking_lot::Mutex;
use tonic::{Request, Response, Status};

use crate::auth::Principal;
use crate::catalog::Catalog;
use crate::error::status;
use crate::proto::bigtable_instance_admin_server::BigtableInstanceAdmin;
use crate::proto::bigtable_server::Bigtable;
use crate::proto::bigtable_table_admin_server::BigtableTableAdmin;

/// How long a policy read is reused.
pub const CACHE_FOR: Duration = Duration::from_secs(2);

/// What a permission is checked on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resource {
    /// `projects/P/instances/I`.
    Instance(String),
    /// `projects/P/instances/I/tables/T` (and its instance).
    Table { instance: String, table: String },
}

impl Resource {
    /// The resource a data API request names: a table (or an authorized view's table), a
    /// materialized view's instance, or an instance. None for a name that does not parse
    /// (the service answers INVALID_ARGUMENT for it; there is nothing to grant on).
    pub fn of_name(name: &str) -> Option<Resource> {
        let name = name
            .split_once("/authorizedViews/")
            .map_or(name, |(t, _)| t);
        if let Some((instance, _)) = name.split_once("/materializedViews/") {
            return Resource::of_name(instance);
        }
        // A cluster's and its backups' permissions are granted on the instance.
        if let Some((instance, _)) = name.split_once("/clusters/") {
            return Resource::of_name(instance);
        }
        if name.contains("/tables/") {
            let (instance, _) = parse_table_name(name).ok()?;
            return Some(Resource::Table {
                instance: instance.to_string(),
                table: name.to_string(),
            });
        }
        parse_instance_name(name).ok()?;
        Some(Resource::Instance(name.to_string()))
    }

    pub fn name(&self) -> &str {
        match self {
            Resource::Instance(i) => i,
            Resource::Table { table, .. } => table,
        }
    }

    /// The instance's name (a table's instance).
    pub fn instance(&self) -> &str {
        match self {
            Resource::Instance(i) => i,
            Resource::Table { instance, .. } => instance,
        }
    }

    /// The table's name (None: the instance itself).
    pub fn table(&self) -> Option<&str> {
        match self {
            Resource::Instance(_) => None,
            Resource::Table { table, .. } => Some(table),
        }
    }
}

/// The first name a request carries that is set (a data request names a table, an authorized
/// view or a materialized view).
fn first_set<'a>(names: &[&'a str]) -> &'a str {
    names.iter().copied().find(|n| !n.is_empty()).unwrap_or("")
}

/// A policy read (None: never set) and when.
type Cached = (Instant, Option<Arc<Policy>>);

/// Checks callers' permissions (see the module's docs).
pub struct Access {
    enabled: bool,
    bootstrap: Arc<Policy>,
    catalog: Arc<dyn Catalog>,
    cache: Mutex<HashMap<String, Cached>>,
}

impl Access {
    /// `enabled`: whether requests are authenticated (otherwise nothing is checked);
    /// `admins`: the `--admin-principal`s.
    pub fn new(enabled: bool, admins: &[String], catalog: Arc<dyn Catalog>) -> Arc<Access> {
        Arc::new(Access {
            enabled,
            bootstrap: Arc::new(iam::bootstrap(admins)),
            catalog,
            cache: Mutex::new(HashMap::new()),
        })
    }

    pub fn catalog(&self) -> &Arc<dyn Catalog> {
        &self.catalog
    }

    /// The policy of `resource` as set (None: never set), through the cache.
    async fn policy(
        &self,
        instance: &str,
        table: Option<&str>,
    ) -> Result<Option<Arc<Policy>>, Status> {
        let key = table.unwrap_or(instance);
        if let Some((at, policy)) = self.cache.lock().get(key)
            && at.elapsed() < CACHE_FOR
        {
            return Ok(policy.clone());
        }
        let policy = self
            .catalog
            .iam_policy(instance, table)
            .await
            .map_err(status)?
            .map(Arc::new);
        let mut cache = self.cache.lock();
        if cache.len() > 10_000 {
            cache.clear();
        }
        cache.insert(key.to_string(), (Instant::now(), policy.clone()));
        Ok(policy)
    }

    /// Forgets the cached policy of the resource `name` names (it was just set, or its table
    /// deleted, through this server).
    pub fn forget(&self, name: &str) {
        self.cache.lock().remove(name);
    }

    /// Every policy that grants on `resource`: the bootstrap admins', the instance's, and a
    /// table's own.
    async fn policies(&self, resource: &Resource) -> Result<Vec<Arc<Policy>>, Status> {
        let mut all = vec![self.bootstrap.clone()];
        all.extend(self.policy(resource.instance(), None).await?);
        if let Some(table) = resource.table() {
            all.extend(self.policy(resource.instance(), Some(table)).await?);
        }
        Ok(all)
    }

    /// The caller of a request, when authentication is on (UNAUTHENTICATED without one: the
    /// authentication layer lets none through, so this is a request made in-process).
    fn principal<'r>(
        &self,
        extensions: &'r tonic::Extensions,
    ) -> Result<Option<&'r Principal>, Status> {
        if !self.enabled {
            return Ok(None);
        }
        extensions
            .get::<Principal>()
            .map(Some)
            .ok_or_else(|| Status::unauthenticated("the request carries no credentials"))
    }

    /// OK if the request's caller holds `permission` on the resource `name` names; otherwise
    /// PERMISSION_DENIED naming both (Bigtable's words).
    pub async fn check(
        &self,
        extensions: &tonic::Extensions,
        permission: &str,
        name: &str,
    ) -> Result<(), Status> {
        let Some(principal) = self.principal(extensions)? else {
            return Ok(());
        };
        if principal.internal {
            return Ok(());
        }
        // A name that does not parse: the service says what is wrong with it.
        let Some(resource) = Resource::of_name(name) else {
            return Ok(());
        };
        let policies = self.policies(&resource).await?;
        let refs: Vec<&Policy> = policies.iter().map(|p| p.as_ref()).collect();
        if iam::holds(&principal.members(), permission, &refs) {
            Ok(())
        } else {
            tracing::debug!(principal = %principal.member, permission, resource = %resource.name(), "permission denied");
            Err(Status::permission_denied(format!(
                "permission '{permission}' denied on resource '{}' (or it may not exist) for {}",
                resource.name(),
                principal.member
            )))
        }
    }

    /// TestIamPermissions: the asked permissions the caller holds on `resource` (all of them
    /// when authentication is off or for Basalt's own processes; unknown ones never).
    pub async fn granted(
        &self,
        extensions: &tonic::Extensions,
        resource: &Resource,
        asked: &[String],
    ) -> Result<Vec<String>, Status> {
        let known = |p: &String| iam::all_permissions().contains(&p.as_str());
        let principal = match self.principal(extensions)? {
            Some(p) if !p.internal => p,
            _ => {
                let mut seen = Vec::new();
                for p in asked.iter().filter(|p| known(p)) {
                    if !seen.contains(p) {
                        seen.push(p.clone());
                    }
                }
                return Ok(seen);
            }
        };
        let policies = self.policies(resource).await?;
        let refs: Vec<&Policy> = policies.iter().map(|p| p.as_ref()).collect();
        Ok(iam::granted(&principal.members(), asked, &refs))
    }

    /// Who made the request, for the audit log.
    pub fn who(extensions: &tonic::Extensions) -> String {
        extensions
            .get::<Principal>()
            .map_or_else(|| "unauthenticated".to_string(), |p| p.member.clone())
    }
}

/// A service whose every call is authorized first (see the module's docs).
pub struct Authorized<S> {
    inner: S,
    access: Arc<Access>,
}

impl<S> Authorized<S> {
    pub fn new(inner: S, access: Arc<Access>) -> Authorized<S> {
        Authorized { inner, access }
    }
}

#[tonic::async_trait]
impl<S: Bigtable> Bigtable for Authorized<S> {
    type ReadRowsStream = S::ReadRowsStream;
    type SampleRowKeysStream = S::SampleRowKeysStream;
    type MutateRowsStream = S::MutateRowsStream;

    async fn read_rows(
        &self,
        request: Request<pb::ReadRowsRequest>,
    ) -> Result<Response<Self::ReadRowsStream>, Status> {
        let r = request.get_ref();
        let name = first_set(&[
            &r.table_name,
            &r.authorized_view_name,
            &r.materialized_view_name,
        ]);
        self.access
            .check(request.extensions(), iam::READ_ROWS, name)
            .await?;
        self.inner.read_rows(request).await
    }

    async fn sample_row_keys(
        &self,
        request: Request<pb::SampleRowKeysRequest>,
    ) -> Result<Response<Self::SampleRowKeysStream>, Status> {
        let r = request.get_ref();
        let name = first_set(&[
            &r.table_name,
            &r.authorized_view_name,
            &r.materialized_view_name,
        ]);
        self.access
            .check(request.extensions(), iam::SAMPLE_ROW_KEYS, name)
            .await?;
        self.inner.sample_row_keys(request).await
    }

    async fn mutate_row(
        &self,
        request: Request<pb::MutateRowRequest>,
    ) -> Result<Response<pb::MutateRowResponse>, Status> {
        let r = request.get_ref();
        let name = first_set(&[&r.table_name, &r.authorized_view_name]);
        self.access
            .check(request.extensions(), iam::MUTATE_ROWS, name)
            .await?;
        self.inner.mutate_row(request).await
    }

    async fn mutate_rows(
        &self,
        request: Request<pb::MutateRowsRequest>,
    ) -> Result<Response<Self::MutateRowsStream>, Status> {
        let r = request.get_ref();
        let name = first_set(&[&r.table_name, &r.authorized_view_name]);
        self.access
            .check(request.extensions(), iam::MUTATE_ROWS, name)
            .await?;
        self.inner.mutate_rows(request).await
    }

    async fn check_and_mutate_row(
        &self,
        request: Request<pb::CheckAndMutateRowRequest>,
    ) -> Result<Response<pb::CheckAndMutateRowResponse>, Status> {
        let r = request.get_ref();
        let name = first_set(&[&r.table_name, &r.authorized_view_name]);
        self.access
            .check(request.extensions(), iam::MUTATE_ROWS, name)
            .await?;
        self.inner.check_and_mutate_row(request).await
    }

    async fn ping_and_warm(
        &self,
        request: Request<pb::PingAndWarmRequest>,
    ) -> Result<Response<pb::PingAndWarmResponse>, Status> {
        let name = request.get_ref().name.clone();
        self.access
            .check(request.extensions(), iam::PING, &name)
            .await?;
        self.inner.ping_and_warm(request).await
    }

    async fn read_modify_write_row(
        &self,
        request: Request<pb::ReadModifyWriteRowRequest>,
    ) -> Result<Response<pb::ReadModifyWriteRowResponse>, Status> {
        let r = request.get_ref();
        let name = first_set(&[&r.table_name, &r.authorized_view_name]);
        self.access
            .check(request.extensions(), iam::MUTATE_ROWS, name)
            .await?;
        self.inner.read_modify_write_row(request).await
    }
}

#[tonic::async_trait]
impl<S: BigtableTableAdmin> BigtableTableAdmin for Authorized<S> {
    async fn create_table(
        &self,
        request: Request<admin::CreateTableRequest>,
    ) -> Result<Response<admin::Table>, Status> {
        let parent = request.get_ref().parent.clone();
        self.access
            .check(request.extensions(), iam::TABLES_CREATE, &parent)
            .await?;
        let who = Access::who(request.extensions());
        let table = format!("{parent}/tables/{}", request.get_ref().table_id);
        let r = self.inner.create_table(request).await;
        audit(&who, "CreateTable", &table, &r);
        r
    }

    async fn list_tables(
        &self,
        request: Request<admin::ListTablesRequest>,
    ) -> Result<Response<admin::ListTablesResponse>, Status> {
        let parent = request.get_ref().parent.clone();
        self.access
            .check(request.extensions(), iam::TABLES_LIST, &parent)
            .await?;
        self.inner.list_tables(request).await
    }

    async fn get_table(
        &self,
        request: Request<admin::GetTableRequest>,
    ) -> Result<Response<admin::Table>, Status> {
        let name = request.get_ref().name.clone();
        self.access
            .check(request.extensions(), iam::TABLES_GET, &name)
            .await?;
        self.inner.get_table(request).await
    }

    async fn update_table(
        &self,
        request: Request<admin::UpdateTableRequest>,
    ) -> Result<Response<lro::Operation>, Status> {
        let name = request
            .get_ref()
            .table
            .as_ref()
            .map(|t| t.name.clone())
            .unwrap_or_default();
        self.access
            .check(request.extensions(), iam::TABLES_UPDATE, &name)
            .await?;
        let who = Access::who(request.extensions());
        let r = self.inner.update_table(request).await;
        audit(&who, "UpdateTable", &name, &r);
        r
    }

    async fn delete_table(
        &self,
        request: Request<admin::DeleteTableRequest>,
    ) -> Result<Response<()>, Status> {
        let name = request.get_ref().name.clone();
        self.access
            .check(request.extensions(), iam::TABLES_DELETE, &name)
            .await?;
        let who = Access::who(request.extensions());
        let r = self.inner.delete_table(request).await;
        if r.is_ok() {
            self.access.forget(&name);
        }
        audit(&who, "DeleteTable", &name, &r);
        r
    }

    async fn modify_column_families(
        &self,
        request: Request<admin::ModifyColumnFamiliesRequest>,
    ) -> Result<Response<admin::Table>, Status> {
        let name = request.get_ref().name.clone();
        self.access
            .check(request.extensions(), iam::TABLES_UPDATE, &name)
            .await?;
        let who = Access::who(request.extensions());
        let r = self.inner.modify_column_families(request).await;
        audit(&who, "ModifyColumnFamilies", &name, &r);
        r
    }

    async fn drop_row_range(
        &self,
        request: Request<admin::DropRowRangeRequest>,
    ) -> Result<Response<()>, Status> {
        let name = request.get_ref().name.clone();
        // Bigtable: mutateRows is "modify rows within a table, or truncate a table".
        self.access
            .check(request.extensions(), iam::MUTATE_ROWS, &name)
            .await?;
        let who = Access::who(request.extensions());
        let r = self.inner.drop_row_range(request).await;
        audit(&who, "DropRowRange", &name, &r);
        r
    }

    async fn create_backup(
        &self,
        request: Request<admin::CreateBackupRequest>,
    ) -> Result<Response<lro::Operation>, Status> {
        let parent = request.get_ref().parent.clone();
        self.access
            .check(request.extensions(), iam::BACKUPS_CREATE, &parent)
            .await?;
        let who = Access::who(request.extensions());
        let name = format!("{parent}/backups/{}", request.get_ref().backup_id);
        let r = self.inner.create_backup(request).await;
        audit(&who, "CreateBackup", &name, &r);
        r
    }

    async fn get_backup(
        &self,
        request: Request<admin::GetBackupRequest>,
    ) -> Result<Response<admin::Backup>, Status> {
        let name = request.get_ref().name.clone();
        self.access
            .check(request.extensions(), iam::BACKUPS_GET, &name)
            .await?;
        self.inner.get_backup(request).await
    }

    async fn list_backups(
        &self,
        request: Request<admin::ListBackupsRequest>,
    ) -> Result<Response<admin::ListBackupsResponse>, Status> {
        let parent = request.get_ref().parent.clone();
        self.access
            .check(request.extensions(), iam::BACKUPS_LIST, &parent)
            .await?;
        self.inner.list_backups(request).await
    }

    async fn update_backup(
        &self,
        request: Request<admin::UpdateBackupRequest>,
    ) -> Result<Response<admin::Backup>, Status> {
        let name = request
            .get_ref()
            .backup
            .as_ref()
            .map(|b| b.name.clone())
            .unwrap_or_default();
        self.access
            .check(request.extensions(), iam::BACKUPS_UPDATE, &name)
            .await?;
        let who = Access::who(request.extensions());
        let r = self.inner.update_backup(request).await;
        audit(&who, "UpdateBackup", &name, &r);
        r
    }

    async fn delete_backup(
        &self,
        request: Request<admin::DeleteBackupRequest>,
    ) -> Result<Response<()>, Status> {
        let name = request.get_ref().name.clone();
        self.access
            .check(request.extensions(), iam::BACKUPS_DELETE, &name)
            .await?;
        let who = Access::who(request.extensions());
        let r = self.inner.delete_backup(request).await;
        audit(&who, "DeleteBackup", &name, &r);
        r
    }

    async fn restore_table(
        &self,
        request: Request<admin::RestoreTableRequest>,
    ) -> Result<Response<lro::Operation>, Status> {
        let parent = request.get_ref().parent.clone();
        let backup = match &request.get_ref().source {
            Some(admin::restore_table_request::Source::Backup(b)) => b.clone(),
            None => String::new(),
        };
        // Bigtable: restoring needs bigtable.backups.restore on the backup and
        // bigtable.tables.create on the instance.
        self.access
            .check(request.extensions(), iam::BACKUPS_RESTORE, &backup)
            .await?;
        self.access
            .check(request.extensions(), iam::TABLES_CREATE, &parent)
            .await?;
        let who = Access::who(request.extensions());
        let table = format!("{parent}/tables/{}", request.get_ref().table_id);
        let r = self.inner.restore_table(request).await;
        audit(&who, "RestoreTable", &table, &r);
        r
    }

    async fn copy_backup(
        &self,
        request: Request<admin::CopyBackupRequest>,
    ) -> Result<Response<lro::Operation>, Status> {
        let parent = request.get_ref().parent.clone();
        let source = request.get_ref().source_backup.clone();
        self.access
            .check(request.extensions(), iam::BACKUPS_GET, &source)
            .await?;
        self.access
            .check(request.extensions(), iam::BACKUPS_CREATE, &parent)
            .await?;
        let who = Access::who(request.extensions());
        let name = format!("{parent}/backups/{}", request.get_ref().backup_id);
        let r = self.inner.copy_backup(request).await;
        audit(&who, "CopyBackup", &name, &r);
        r
    }

    async fn generate_consistency_token(
        &self,
        request: Request<admin::GenerateConsistencyTokenRequest>,
    ) -> Result<Response<admin::GenerateConsistencyTokenResponse>, Status> {
        let name = request.get_ref().name.clone();
        self.access
            .check(request.extensions(), iam::GENERATE_CONSISTENCY_TOKEN, &name)
            .await?;
        self.inner.generate_consistency_token(request).await
    }

    async fn check_consistency(
        &self,
        request: Request<admin::CheckConsistencyRequest>,
    ) -> Result<Response<admin::CheckConsistencyResponse>, Status> {
        let name = request.get_ref().name.clone();
        self.access
            .check(request.extensions(), iam::CHECK_CONSISTENCY, &name)
            .await?;
        self.inner.check_consistency(request).await
    }

    async fn get_iam_policy(
        &self,
        request: Request<iampb::GetIamPolicyRequest>,
    ) -> Result<Response<iampb::Policy>, Status> {
        let name = request.get_ref().resource.clone();
        self.access
            .check(request.extensions(), iam::TABLES_GET_IAM_POLICY, &name)
            .await?;
        self.inner.get_iam_policy(request).await
    }

    async fn set_iam_policy(
        &self,
        request: Request<iampb::SetIamPolicyRequest>,
    ) -> Result<Response<iampb::Policy>, Status> {
        let name = request.get_ref().resource.clone();
        self.access
            .check(request.extensions(), iam::TABLES_SET_IAM_POLICY, &name)
            .await?;
        let who = Access::who(request.extensions());
        let r = self.inner.set_iam_policy(request).await;
        audit(&who, "SetIamPolicy", &name, &r);
        r
    }

    async fn test_iam_permissions(
        &self,
        request: Request<iampb::TestIamPermissionsRequest>,
    ) -> Result<Response<iampb::TestIamPermissionsResponse>, Status> {
        // Needs no permission: it answers what the caller holds.
        self.inner.test_iam_permissions(request).await
    }
}

#[tonic::async_trait]
impl<S: BigtableInstanceAdmin> BigtableInstanceAdmin for Authorized<S> {
    async fn get_iam_policy(
        &self,
        request: Request<iampb::GetIamPolicyRequest>,
    ) -> Result<Response<iampb::Policy>, Status> {
        let name = request.get_ref().resource.clone();
        self.access
            .check(request.extensions(), iam::INSTANCES_GET_IAM_POLICY, &name)
            .await?;
        self.inner.get_iam_policy(request).await
    }

    async fn set_iam_policy(
        &self,
        request: Request<iampb::SetIamPolicyRequest>,
    ) -> Result<Response<iampb::Policy>, Status> {
        let name = request.get_ref().resource.clone();
        self.access
            .check(request.extensions(), iam::INSTANCES_SET_IAM_POLICY, &name)
            .await?;
        let who = Access::who(request.extensions());
        let r = self.inner.set_iam_policy(request).await;
        audit(&who, "SetIamPolicy", &name, &r);
        r
    }

    async fn test_iam_permissions(
        &self,
        request: Request<iampb::TestIamPermissionsRequest>,
    ) -> Result<Response<iampb::TestIamPermissionsResponse>, Status> {
        self.inner.test_iam_permissions(request).await
    }

    async fn list_hot_tablets(
        &self,
        request: Request<admin::ListHotTabletsRequest>,
    ) -> Result<Response<admin::ListHotTabletsResponse>, Status> {
        // Checked on the cluster's instance; a malformed name is the service's to refuse.
        let instance = crate::hot_tablets::parse_parent(&request.get_ref().parent)
            .map(|(instance, _)| instance.to_string())
            .unwrap_or_default();
        self.access
            .check(request.extensions(), iam::HOT_TABLETS_LIST, &instance)
            .await?;
        self.inner.list_hot_tablets(request).await
    }
}

/// The audit log: every admin change and IAM change, with who made it and how it ended
/// (target `basalt::audit`, which a log pipeline can route on its own).
fn audit<T>(who: &str, method: &str, resource: &str, result: &Result<T, Status>) {
    match result {
        Ok(_) => {
            tracing::info!(target: "basalt::audit", principal = %who, method, resource, "admin change")
        }
        Err(s) => {
            tracing::info!(target: "basalt::audit", principal = %who, method, resource, code = ?s.code(), message = s.message(), "admin change refused")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_name_their_table_or_instance() {
        let t = "projects/p/instances/i/tables/t";
        assert_eq!(
            Resource::of_name(t),
            Some(Resource::Table {
                instance: "projects/p/instances/i".into(),
                table: t.into()
            })
        );
        assert_eq!(
            Resource::of_name("projects/p/instances/i/tables/t/authorizedViews/v"),
            Resource::of_name(t)
        );
        assert_eq!(
            Resource::of_name("projects/p/instances/i/materializedViews/m"),
            Some(Resource::Instance("projects/p/instances/i".into()))
        );
        assert_eq!(
            Resource::of_name("projects/p/instances/i"),
            Some(Resource::Instance("projects/p/instances/i".into()))
        );
        assert_eq!(Resource::of_name("tables/t"), None);
        assert_eq!(first_set(&["", "b", "c"]), "b");
    }
}
