//! Table, stage 4: the admin calls — the table created if it is missing, then brought to the
//! spec by the pure plan [`plan_schema`] (families modified, deletion protection set), or, on
//! deletion with `deletionPolicy: Delete`, dropped. Each call that changes the table is
//! reported in an event as soon as it succeeds.

use googleapis_tonic_google_bigtable_admin_v2::google::bigtable::admin::v2 as admin;
use tonic::Code;

use super::validate::ValidatedTable;
use crate::admin::{plan_schema, table_to_create};
use crate::controller::{Context, Note, Result};

/// The table as the instance reports it after the calls, and the spec changes that were
/// refused (a value type cannot change, for one).
#[derive(Debug, Clone, PartialEq)]
pub struct Synced {
    pub table: admin::Table,
    pub refused: Vec<String>,
}

pub async fn sync_schema(ctx: &Context, validated: &ValidatedTable<'_>) -> Result<Synced> {
    let ValidatedTable {
        table,
        endpoint,
        name,
        ..
    } = validated;
    let actual = match ctx.admin.get_table(endpoint, name).await? {
        Some(actual) => actual,
        None => {
            let (create, splits) = table_to_create(table);
            let created = ctx
                .admin
                .create_table(
                    endpoint,
                    &validated.parent,
                    &validated.table_id,
                    create,
                    splits,
                )
                .await?;
            let note = Note::normal(
                "TableCreated",
                "Create",
                format!(
                    "created table {name} with {} column famil(ies)",
                    created.column_families.len()
                ),
            );
            ctx.publish(*table, &note).await;
            ctx.admin
                .get_table(endpoint, name)
                .await?
                .unwrap_or(created)
        }
    };

    let plan = plan_schema(table, &actual);
    let mut current = actual;
    if !plan.modifications.is_empty() {
        let ids: Vec<String> = plan.modifications.iter().map(|m| m.id.clone()).collect();
        current = ctx
            .admin
            .modify_column_families(endpoint, name, plan.modifications)
            .await?;
        let note = Note::normal(
            "ColumnFamiliesModified",
            "Update",
            format!("modified column families {}", ids.join(", ")),
        );
        ctx.publish(*table, &note).await;
    }
    if let Some(on) = plan.deletion_protection {
        ctx.admin
            .set_deletion_protection(endpoint, name, on)
            .await?;
        current.deletion_protection = on;
        let note = Note::normal(
            "DeletionProtectionChanged",
            "Update",
            format!("deletion protection {}", if on { "on" } else { "off" }),
        );
        ctx.publish(*table, &note).await;
    }
    Ok(Synced {
        table: current,
        refused: plan.refused,
    })
}

/// What became of a drop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dropped {
    Dropped,
    /// The instance refused (the table's deletion protection is on): why.
    Blocked(String),
}

/// Drops the table, first turning its deletion protection off if the spec turned it off
/// together with the deletion.
pub async fn drop_table(ctx: &Context, validated: &ValidatedTable<'_>) -> Result<Dropped> {
    let ValidatedTable {
        table,
        endpoint,
        name,
        ..
    } = validated;
    if !table.spec.deletion_protection
        && let Some(actual) = ctx.admin.get_table(endpoint, name).await?
        && actual.deletion_protection
    {
        ctx.admin
            .set_deletion_protection(endpoint, name, false)
            .await?;
    }
    match ctx.admin.delete_table(endpoint, name).await {
        Ok(()) => {
            let note = Note::normal(
                "TableDeleted",
                "Delete",
                format!("deleted table {name} (deletionPolicy: Delete)"),
            );
            ctx.publish(*table, &note).await;
            Ok(Dropped::Dropped)
        }
        Err(s) if s.code() == Code::FailedPrecondition => Ok(Dropped::Blocked(format!(
            "the table is not deleted: {}",
            s.message()
        ))),
        Err(s) => Err(s.into()),
    }
}
