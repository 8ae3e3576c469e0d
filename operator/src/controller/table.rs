//! Table → the table and its column families in the instance, through the table admin API.
//! Families and tables are only ever dropped when the spec says so explicitly.

use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use tonic::Code;

use super::{
    Context, Result, apply_status, has_finalizer, instance_endpoint, set_finalizers,
    with_finalizer, without_finalizer,
};
use crate::admin::{observed_families, plan_schema, table_to_create};
use crate::build;
use crate::conditions::{self, Cond, DEGRADED, READY};
use crate::crd::{DeletionPolicy, Instance, Table, TableStatus};
use crate::validate;

/// Present only on Tables whose deletion drops the table (deletionPolicy Delete).
pub const DROP_FINALIZER: &str = "basalt.dev/drop-table";

pub async fn reconcile(table: Arc<Table>, ctx: Arc<Context>) -> Result<Action> {
    super::measured(&ctx, "table", reconcile_inner(table, ctx.clone())).await
}

async fn set_status(
    api: &Api<Table>,
    table: &Table,
    conds: &[Cond],
    update: impl FnOnce(&mut TableStatus),
) -> Result<()> {
    let old = table.status.clone().unwrap_or_default();
    let mut status = TableStatus {
        conditions: conditions::merge(&old.conditions, conds, table.metadata.generation),
        observed_generation: table.metadata.generation,
        ..old
    };
    update(&mut status);
    if Some(&status) != table.status.as_ref() {
        apply_status(api, table, status).await?;
    }
    Ok(())
}

async fn reconcile_inner(table: Arc<Table>, ctx: Arc<Context>) -> Result<Action> {
    let ns = table.namespace().unwrap_or_default();
    let tables: Api<Table> = Api::namespaced(ctx.client.clone(), &ns);
    let instance_name = table.spec.instance_ref.clone();
    let table_id = validate::table_id(&table);

    let wants_finalizer = table.spec.deletion_policy == DeletionPolicy::Delete;
    if table.metadata.deletion_timestamp.is_none()
        && wants_finalizer != has_finalizer(&*table, DROP_FINALIZER)
    {
        let finalizers = if wants_finalizer {
            with_finalizer(&*table, DROP_FINALIZER)
        } else {
            without_finalizer(&*table, DROP_FINALIZER)
        };
        set_finalizers(&tables, &table, finalizers).await?;
        return Ok(Action::await_change());
    }

    let problems = validate::validate_table(&table);
    if !problems.is_empty() && table.metadata.deletion_timestamp.is_none() {
        let message = validate::describe(&problems);
        if conditions::find(&table.status.clone().unwrap_or_default().conditions, READY)
            .map(|c| &c.message)
            != Some(&message)
        {
            ctx.event(
                &*table,
                EventType::Warning,
                "InvalidSpec",
                "Validate",
                message.clone(),
            )
            .await;
        }
        set_status(
            &tables,
            &table,
            &[
                Cond::new(READY, false, "InvalidSpec", message.clone()),
                Cond::new(DEGRADED, true, "InvalidSpec", message),
            ],
            |_| {},
        )
        .await?;
        return Ok(Action::await_change());
    }

    let instance = Api::<Instance>::namespaced(ctx.client.clone(), &ns)
        .get_opt(&instance_name)
        .await?;
    let Some(instance) = instance else {
        if table.metadata.deletion_timestamp.is_some() && has_finalizer(&*table, DROP_FINALIZER) {
            // Nothing left to drop the table from.
            set_finalizers(&tables, &table, without_finalizer(&*table, DROP_FINALIZER)).await?;
            return Ok(Action::await_change());
        }
        set_status(
            &tables,
            &table,
            &[Cond::new(
                READY,
                false,
                "InstanceNotFound",
                format!("Instance {instance_name:?} does not exist in namespace {ns:?}"),
            )],
            |_| {},
        )
        .await?;
        return Ok(Action::requeue(Duration::from_secs(30)));
    };
    let parent = format!(
        "projects/{}/instances/{instance_name}",
        build::project_id(&instance)
    );
    let name = format!("{parent}/tables/{table_id}");

    let Some(endpoint) = instance_endpoint(&ctx, &ns, &instance_name).await? else {
        set_status(
            &tables,
            &table,
            &[Cond::new(
                READY,
                false,
                "InstanceUnavailable",
                format!("no tablet server of instance {instance_name:?} is ready"),
            )],
            |_| {},
        )
        .await?;
        return Ok(Action::requeue(Duration::from_secs(10)));
    };

    if table.metadata.deletion_timestamp.is_some() {
        if !has_finalizer(&*table, DROP_FINALIZER) {
            return Ok(Action::await_change());
        }
        // The spec may have turned protection off together with the deletion.
        if !table.spec.deletion_protection
            && let Some(actual) = ctx.admin.get_table(&endpoint, &name).await?
            && actual.deletion_protection
        {
            ctx.admin
                .set_deletion_protection(&endpoint, &name, false)
                .await?;
        }
        match ctx.admin.delete_table(&endpoint, &name).await {
            Ok(()) => {
                ctx.event(
                    &*table,
                    EventType::Normal,
                    "TableDeleted",
                    "Delete",
                    format!("deleted table {name} (deletionPolicy: Delete)"),
                )
                .await;
                set_finalizers(&tables, &table, without_finalizer(&*table, DROP_FINALIZER)).await?;
                return Ok(Action::await_change());
            }
            Err(s) if s.code() == Code::FailedPrecondition => {
                let message = format!("the table is not deleted: {}", s.message());
                set_status(
                    &tables,
                    &table,
                    &[Cond::new(
                        "DeletionBlocked",
                        true,
                        "DeletionProtection",
                        message.clone(),
                    )],
                    |_| {},
                )
                .await?;
                ctx.event(
                    &*table,
                    EventType::Warning,
                    "DeletionBlocked",
                    "Delete",
                    message,
                )
                .await;
                return Ok(Action::requeue(Duration::from_secs(60)));
            }
            Err(s) => return Err(s.into()),
        }
    }

    let actual = match ctx.admin.get_table(&endpoint, &name).await? {
        Some(actual) => actual,
        None => {
            let (create, splits) = table_to_create(&table);
            let created = ctx
                .admin
                .create_table(&endpoint, &parent, &table_id, create, splits)
                .await?;
            ctx.event(
                &*table,
                EventType::Normal,
                "TableCreated",
                "Create",
                format!(
                    "created table {name} with {} column famil(ies)",
                    created.column_families.len()
                ),
            )
            .await;
            ctx.admin
                .get_table(&endpoint, &name)
                .await?
                .unwrap_or(created)
        }
    };

    let plan = plan_schema(&table, &actual);
    let mut current = actual;
    if !plan.modifications.is_empty() {
        let ids: Vec<String> = plan.modifications.iter().map(|m| m.id.clone()).collect();
        current = ctx
            .admin
            .modify_column_families(&endpoint, &name, plan.modifications)
            .await?;
        ctx.event(
            &*table,
            EventType::Normal,
            "ColumnFamiliesModified",
            "Update",
            format!("modified column families {}", ids.join(", ")),
        )
        .await;
    }
    if let Some(on) = plan.deletion_protection {
        ctx.admin
            .set_deletion_protection(&endpoint, &name, on)
            .await?;
        current.deletion_protection = on;
        ctx.event(
            &*table,
            EventType::Normal,
            "DeletionProtectionChanged",
            "Update",
            format!("deletion protection {}", if on { "on" } else { "off" }),
        )
        .await;
    }

    let conds = if plan.refused.is_empty() {
        vec![
            Cond::new(
                READY,
                true,
                "Synced",
                format!("table {name} matches the spec"),
            ),
            Cond::new(DEGRADED, false, "AsExpected", "the table matches the spec"),
        ]
    } else {
        let message = plan.refused.join("; ");
        ctx.event(
            &*table,
            EventType::Warning,
            "ChangeRefused",
            "Update",
            message.clone(),
        )
        .await;
        vec![
            Cond::new(READY, false, "ChangeRefused", message.clone()),
            Cond::new(DEGRADED, true, "ChangeRefused", message),
        ]
    };
    set_status(&tables, &table, &conds, |s| {
        s.table_id = Some(table_id.clone());
        s.resource_name = Some(name.clone());
        s.column_families = observed_families(&current);
        s.deletion_protection = Some(current.deletion_protection);
    })
    .await?;
    // Re-check now and then: clients may change the schema through the admin API.
    Ok(Action::requeue(Duration::from_secs(120)))
}
