//! Table → the table and its column families in the instance, through the table admin API.
//! Families and tables are only ever dropped when the spec says so explicitly.
//!
//! [`reconcile`] is the pipeline: the drop finalizer kept in step with `deletionPolicy`, then
//! [`dereference`] (the Instance, a ready tablet server of it) → [`validate`] (pure: a
//! [`ValidatedTable`] with its resource name and endpoint, or why not) → on deletion the
//! table dropped ([`apply::drop_table`]); otherwise build and apply together
//! ([`apply::sync_schema`]: the pure plans [`crate::admin::table_to_create`] and
//! [`crate::admin::plan_schema`], carried out through the admin API) → [`status`] (pure
//! condition builders) → one status patch.

pub mod apply;
pub mod dereference;
pub mod status;
pub mod validate;

use std::sync::Arc;

use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;

use self::validate::Refused;
use super::finalizer::{self, Lifecycle};
use super::{Context, Result, finish};
use crate::crd::{DeletionPolicy, Table};

pub use validate::ValidatedTable;

/// Present only on Tables whose deletion drops the table (deletionPolicy Delete).
pub const DROP_FINALIZER: &str = "basalt.dev/drop-table";

pub async fn reconcile(table: Arc<Table>, ctx: Arc<Context>) -> Result<Action> {
    super::reconciling(&ctx, "table", &*table, reconcile_table(&table, &ctx)).await
}

async fn reconcile_table(table: &Table, ctx: &Context) -> Result<Action> {
    let api: Api<Table> =
        Api::namespaced(ctx.client.clone(), &table.namespace().unwrap_or_default());

    let drop = table.spec.deletion_policy == DeletionPolicy::Delete;
    let lifecycle = finalizer::sync(&api, table, DROP_FINALIZER, drop).await?;
    if lifecycle == Lifecycle::Changed {
        return Ok(Action::await_change());
    }

    // Dropping a table needs its instance and a tablet server as much as creating it does.
    let found = dereference::dereference(ctx, table).await?;
    let validated = match validate::validate(table, &found, lifecycle.deleting()) {
        Ok(validated) => validated,
        Err(Refused::InstanceNotFound) if lifecycle == Lifecycle::Deleting => {
            // Nothing left to drop the table from.
            finalizer::release(&api, table, DROP_FINALIZER).await?;
            return Ok(Action::await_change());
        }
        Err(refused) => return finish(ctx, &api, table, status::refused(table, &refused)).await,
    };
    // Validated: the instance was found. Its servers are reached as it is secured.
    let admin = match &found.instance {
        Some(instance) => ctx.transport(instance)?.admin.clone(),
        None => ctx.admin.clone(),
    };
    match lifecycle {
        Lifecycle::Live => {}
        Lifecycle::Deleting => {
            return match apply::drop_table(ctx, &*admin, &validated).await? {
                apply::Dropped::Dropped => {
                    finalizer::release(&api, table, DROP_FINALIZER).await?;
                    Ok(Action::await_change())
                }
                apply::Dropped::Blocked(why) => {
                    finish(ctx, &api, table, status::deletion_blocked(table, why)).await
                }
            };
        }
        // Not held by the finalizer (deletionPolicy Retain): the table stays.
        Lifecycle::Changed | Lifecycle::Released => return Ok(Action::await_change()),
    }

    let synced = apply::sync_schema(ctx, &*admin, &validated).await?;
    finish(ctx, &api, table, status::synced(&validated, &synced)).await
}
