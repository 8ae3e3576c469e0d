//! Table, stage 4: the admin calls — the table created if it is missing, then brought to the
//! spec by the pure plan [`crate::admin::plan_schema`] (families modified, deletion protection
//! set; [`crate::lifecycle::tables`], shared with the local runtime), or, on
//! deletion with `deletionPolicy: Delete`, dropped. Each call that changes the table is
//! reported in an event as soon as it succeeds.

use tonic::Code;

use super::validate::ValidatedTable;
use crate::admin::TableAdmin;
use crate::controller::{Context, Note, Result};
use crate::lifecycle::tables;
pub use crate::lifecycle::tables::Synced;

/// Brings the table to the spec ([`tables::sync_into`], as the local runtime does) and
/// reports each change that succeeded in an event, also when a later call failed.
pub async fn sync_schema(
    ctx: &Context,
    admin: &dyn TableAdmin,
    validated: &ValidatedTable<'_>,
) -> Result<Synced> {
    let mut synced = Synced::default();
    let result = tables::sync_into(admin, validated, &mut synced).await;
    let table = validated.table;
    let name = &validated.name;
    if let Some(families) = synced.created {
        let note = Note::normal(
            "TableCreated",
            "Create",
            format!("created table {name} with {families} column famil(ies)"),
        );
        ctx.publish(table, &note).await;
    }
    if !synced.modified.is_empty() {
        let note = Note::normal(
            "ColumnFamiliesModified",
            "Update",
            format!("modified column families {}", synced.modified.join(", ")),
        );
        ctx.publish(table, &note).await;
    }
    if let Some(on) = synced.deletion_protection {
        let note = Note::normal(
            "DeletionProtectionChanged",
            "Update",
            format!("deletion protection {}", if on { "on" } else { "off" }),
        );
        ctx.publish(table, &note).await;
    }
    result?;
    Ok(synced)
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
pub async fn drop_table(
    ctx: &Context,
    admin: &dyn TableAdmin,
    validated: &ValidatedTable<'_>,
) -> Result<Dropped> {
    let ValidatedTable {
        table,
        endpoint,
        name,
        ..
    } = validated;
    if !table.spec.deletion_protection
        && let Some(actual) = admin.get_table(endpoint, name).await?
        && actual.deletion_protection
    {
        admin.set_deletion_protection(endpoint, name, false).await?;
    }
    match admin.delete_table(endpoint, name).await {
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
