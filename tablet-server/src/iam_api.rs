//! The IAM methods of Bigtable's admin APIs — `GetIamPolicy`, `SetIamPolicy` (with the etag
//! check) and `TestIamPermissions` — on tables (`BigtableTableAdmin`) and on the instance
//! (`BigtableInstanceAdmin`, of which Basalt serves these three and `ListHotTablets`, in
//! `crate::hot_tablets`: instances, clusters and
//! app profiles are Kubernetes resources). Policies are `google.iam.v1.Policy` without
//! conditions or audit configs; the rules are the model's [`basalt_model::iam`], the storage
//! the [`crate::catalog::Catalog`]'s. Who may call them is [`crate::access`]'s business.

use std::sync::Arc;

use basalt_model::iam::{self, Binding, Policy, PolicyError};
use basalt_model::schema::{parse_instance_name, parse_table_name};
use basalt_storage::Store;
use googleapis_tonic_google_bigtable_admin_v2::google::bigtable::admin::v2 as admin;
use googleapis_tonic_google_iam_v1::google::iam::v1 as iampb;
use tonic::{Request, Response, Status};

use crate::access::{Access, Resource};
use crate::error::status;
use crate::proto::bigtable_instance_admin_server::BigtableInstanceAdmin;

/// What a request's `resource` must name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Instance,
    Table,
}

/// The IAM methods over the catalog's policies.
pub struct IamApi {
    access: Arc<Access>,
    store: Arc<Store>,
}

impl IamApi {
    pub fn new(access: Arc<Access>, store: Arc<Store>) -> Arc<IamApi> {
        Arc::new(IamApi { access, store })
    }

    /// The resource a request names, checked: a well-formed name of the kind, on an instance
    /// this server serves, a table that exists.
    fn resource(&self, name: &str, kind: Kind) -> Result<Resource, Status> {
        let resource = match kind {
            Kind::Instance => {
                parse_instance_name(name).map_err(status)?;
                Resource::Instance(name.to_string())
            }
            Kind::Table => {
                if name.contains("/authorizedViews/") || name.contains("/backups/") {
                    return Err(Status::unimplemented(format!(
                        "IAM policies of authorized views and backups are not supported (resource {name})"
                    )));
                }
                let (instance, _) = parse_table_name(name).map_err(status)?;
                self.store.table(name).map_err(|e| status(e.into()))?;
                Resource::Table {
                    instance: instance.to_string(),
                    table: name.to_string(),
                }
            }
        };
        self.access
            .catalog()
            .check_instance(resource.instance())
            .map_err(status)?;
        Ok(resource)
    }

    pub async fn get(
        &self,
        request: Request<iampb::GetIamPolicyRequest>,
        kind: Kind,
    ) -> Result<Response<iampb::Policy>, Status> {
        let resource = self.resource(&request.get_ref().resource, kind)?;
        let policy = self
            .access
            .catalog()
            .iam_policy(resource.instance(), resource.table())
            .await
            .map_err(status)?
            .unwrap_or_else(iam::empty);
        Ok(Response::new(to_proto(&policy)))
    }

    pub async fn set(
        &self,
        request: Request<iampb::SetIamPolicyRequest>,
        kind: Kind,
    ) -> Result<Response<iampb::Policy>, Status> {
        let req = request.into_inner();
        let resource = self.resource(&req.resource, kind)?;
        if let Some(mask) = &req.update_mask
            && let Some(other) = mask
                .paths
                .iter()
                .find(|p| !matches!(p.as_str(), "bindings" | "etag"))
        {
            return Err(Status::invalid_argument(format!(
                "update_mask path {other:?} is not supported: a policy's bindings and etag can be set"
            )));
        }
        let new = from_proto(req.policy.unwrap_or_default())?;
        let set = self
            .access
            .catalog()
            .set_iam_policy(resource.instance(), resource.table(), new)
            .await
            .map_err(status)?;
        self.access.forget(resource.name());
        match set {
            Ok(policy) => Ok(Response::new(to_proto(&policy))),
            Err(PolicyError::Invalid(m)) => Err(Status::invalid_argument(m)),
            // Real IAM answers a stale etag ABORTED: read the policy again and retry.
            Err(PolicyError::Conflict(m)) => Err(Status::aborted(m)),
        }
    }

    pub async fn test(
        &self,
        request: Request<iampb::TestIamPermissionsRequest>,
        kind: Kind,
    ) -> Result<Response<iampb::TestIamPermissionsResponse>, Status> {
        let resource = self.resource(&request.get_ref().resource, kind)?;
        let permissions = self
            .access
            .granted(
                request.extensions(),
                &resource,
                &request.get_ref().permissions,
            )
            .await?;
        Ok(Response::new(iampb::TestIamPermissionsResponse {
            permissions,
        }))
    }
}

/// `google.iam.v1.Policy` → the model's, refusing what Basalt does not support.
pub fn from_proto(p: iampb::Policy) -> Result<Policy, Status> {
    if !p.audit_configs.is_empty() {
        return Err(Status::invalid_argument(
            "audit configs are not supported in Bigtable IAM policies",
        ));
    }
    let mut bindings = Vec::with_capacity(p.bindings.len());
    for b in p.bindings {
        if b.condition.is_some() {
            return Err(Status::invalid_argument(format!(
                "the binding of {} has a condition: conditional role bindings are not supported",
                b.role
            )));
        }
        bindings.push(Binding {
            role: b.role,
            members: b.members,
        });
    }
    Ok(Policy {
        version: p.version,
        bindings,
        etag: p.etag.to_vec(),
    })
}

pub fn to_proto(p: &Policy) -> iampb::Policy {
    iampb::Policy {
        version: p.version,
        bindings: p
            .bindings
            .iter()
            .map(|b| iampb::Binding {
                role: b.role.clone(),
                members: b.members.clone(),
                condition: None,
            })
            .collect(),
        audit_configs: vec![],
        etag: p.etag.clone().into(),
    }
}

/// `google.bigtable.admin.v2.BigtableInstanceAdmin`: its IAM methods.
pub struct InstanceAdminService {
    iam: Arc<IamApi>,
    /// Cluster mode: the instance's etcd, where the Key Visualizer's history is
    /// (`ListHotTablets`).
    meta: Option<basalt_meta::Meta>,
}

impl InstanceAdminService {
    pub fn new(iam: Arc<IamApi>, meta: Option<basalt_meta::Meta>) -> InstanceAdminService {
        InstanceAdminService { iam, meta }
    }
}

#[tonic::async_trait]
impl BigtableInstanceAdmin for InstanceAdminService {
    async fn get_iam_policy(
        &self,
        request: Request<iampb::GetIamPolicyRequest>,
    ) -> Result<Response<iampb::Policy>, Status> {
        self.iam.get(request, Kind::Instance).await
    }

    async fn set_iam_policy(
        &self,
        request: Request<iampb::SetIamPolicyRequest>,
    ) -> Result<Response<iampb::Policy>, Status> {
        self.iam.set(request, Kind::Instance).await
    }

    async fn test_iam_permissions(
        &self,
        request: Request<iampb::TestIamPermissionsRequest>,
    ) -> Result<Response<iampb::TestIamPermissionsResponse>, Status> {
        self.iam.test(request, Kind::Instance).await
    }

    async fn list_hot_tablets(
        &self,
        request: Request<admin::ListHotTabletsRequest>,
    ) -> Result<Response<admin::ListHotTabletsResponse>, Status> {
        let Some(meta) = &self.meta else {
            return Err(Status::unimplemented(
                "ListHotTablets needs a cluster: a standalone server keeps no Key Visualizer history (docs/key-visualizer.md)",
            ));
        };
        crate::hot_tablets::list(meta, request.into_inner())
            .await
            .map(Response::new)
    }
}
