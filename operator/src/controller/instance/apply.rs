//! Instance, stage 4: server-side apply of the ConfigMap, then the client Service.

use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::ResourceExt;
use kube::api::Api;

use super::validate::ValidatedInstance;
use crate::build::{self, InstanceObjects};
use crate::controller::{Context, Note, Result, apply as server_side_apply};

/// Applies the instance's objects; until the status reports an endpoint, an event says where
/// clients connect. Returns the Service as the API server has it.
pub async fn apply(
    ctx: &Context,
    validated: &ValidatedInstance<'_>,
    objects: &InstanceObjects,
) -> Result<Service> {
    let instance = validated.instance;
    let ns = instance.namespace().unwrap_or_default();
    server_side_apply(
        &Api::<ConfigMap>::namespaced(ctx.client.clone(), &ns),
        &objects.config_map,
    )
    .await?;
    let service = server_side_apply(
        &Api::<Service>::namespaced(ctx.client.clone(), &ns),
        &objects.service,
    )
    .await?;
    let reported = instance
        .status
        .as_ref()
        .is_some_and(|s| s.endpoint.is_some());
    if !reported {
        let note = Note::normal(
            "EndpointCreated",
            "Create",
            format!(
                "clients connect to Service {} on port {}",
                service.name_any(),
                build::GRPC_PORT
            ),
        );
        ctx.publish(instance, &note).await;
    }
    Ok(service)
}
