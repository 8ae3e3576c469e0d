//! A `Table` manifest brought to its spec through the table admin API at its instance's
//! endpoint, by both runtimes: the table created if it is missing, then the pure plan
//! ([`crate::admin::table_to_create`], [`crate::admin::plan_schema`]; resource names from
//! [`crate::controller::table::validate`]) carried out. The Kubernetes controller reports each
//! change in an event and the status; the local runtime in `local apply`'s answer and
//! `local status`, retrying while the instance's servers are not ready yet ([`retryable`]).

use std::fmt;
use std::time::Duration;

use googleapis_tonic_google_bigtable_admin_v2::google::bigtable::admin::v2 as admin;
use tonic::{Code, Status};

use crate::admin::{TableAdmin, plan_schema, table_to_create};
use crate::controller::table::ValidatedTable;
use crate::controller::table::dereference::Dereferenced;
use crate::controller::table::validate::{Refused, validate};
use crate::crd::{Instance, Table};
use crate::rules::describe;

/// The first delay between attempts while the instance is unavailable; doubles up to
/// [`MAX_RETRY_DELAY`].
pub const FIRST_RETRY_DELAY: Duration = Duration::from_millis(500);
pub const MAX_RETRY_DELAY: Duration = Duration::from_secs(5);

/// What a sync did to the table.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Synced {
    /// The table as the instance reports it after the calls.
    pub table: admin::Table,
    /// The table's resource name.
    pub name: String,
    /// It did not exist and was created (with this many families).
    pub created: Option<usize>,
    /// Families created, updated or dropped.
    pub modified: Vec<String>,
    /// Deletion protection turned on or off.
    pub deletion_protection: Option<bool>,
    /// Spec changes the instance cannot make (a family's value type).
    pub refused: Vec<String>,
}

impl fmt::Display for Synced {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = vec![];
        if let Some(n) = self.created {
            parts.push(format!("created with {n} column famil(ies)"));
        }
        if !self.modified.is_empty() {
            parts.push(format!(
                "modified column families {}",
                self.modified.join(", ")
            ));
        }
        if let Some(on) = self.deletion_protection {
            parts.push(format!(
                "deletion protection {}",
                if on { "on" } else { "off" }
            ));
        }
        if !self.refused.is_empty() {
            parts.push(format!("refused: {}", self.refused.join("; ")));
        }
        if parts.is_empty() {
            parts.push("unchanged".into());
        }
        write!(f, "table {}: {}", self.name, parts.join("; "))
    }
}

/// Whether a failed call may succeed later without a change of spec: the servers are
/// starting, or the endpoint has none ready yet. tonic reports its own deadline and a
/// connection the endpoint closed (no ready server) as CANCELLED. Retrying is safe: a sync
/// reads the table first, and a create that already happened answers ALREADY_EXISTS.
pub fn retryable(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Cancelled
            | Code::Unknown
            | Code::Aborted
    )
}

/// The table's resource names and endpoint, as the controller derives them; an invalid spec
/// is described with the controller's message.
pub fn validated<'a>(
    table: &'a Table,
    instance: &Instance,
    endpoint: &str,
) -> Result<ValidatedTable<'a>, String> {
    let found = Dereferenced {
        instance: Some(instance.clone()),
        endpoint: Some(endpoint.to_string()),
    };
    validate(table, &found, false).map_err(|refused| match refused {
        Refused::InvalidSpec(problems) => describe(&problems),
        Refused::InstanceNotFound => "the instance does not exist".into(),
        Refused::InstanceUnavailable => "no tablet server of the instance is ready".into(),
    })
}

/// One sync: create the table if missing, then apply the plan.
pub async fn sync_table(
    admin: &dyn TableAdmin,
    validated: &ValidatedTable<'_>,
) -> Result<Synced, Status> {
    let mut synced = Synced::default();
    sync_into(admin, validated, &mut synced).await?;
    Ok(synced)
}

/// [`sync_table`], saying in `synced` what it did also when a later call fails (each change
/// that succeeded is reported).
pub async fn sync_into(
    admin: &dyn TableAdmin,
    validated: &ValidatedTable<'_>,
    synced: &mut Synced,
) -> Result<(), Status> {
    let ValidatedTable {
        table,
        endpoint,
        name,
        ..
    } = validated;
    synced.name = name.clone();
    let actual = match admin.get_table(endpoint, name).await? {
        Some(actual) => actual,
        None => {
            let (create, splits) = table_to_create(table);
            match admin
                .create_table(
                    endpoint,
                    &validated.parent,
                    &validated.table_id,
                    create,
                    splits,
                )
                .await
            {
                Ok(created) => synced.created = Some(created.column_families.len()),
                // Created meanwhile (an earlier attempt whose answer was lost): plan against it.
                Err(s) if s.code() == Code::AlreadyExists => {}
                Err(s) => return Err(s),
            }
            admin.get_table(endpoint, name).await?.ok_or_else(|| {
                Status::unavailable(format!("table {name} not found after CreateTable"))
            })?
        }
    };
    let plan = plan_schema(table, &actual);
    synced.table = actual;
    if !plan.modifications.is_empty() {
        let ids = plan.modifications.iter().map(|m| m.id.clone()).collect();
        synced.table = admin
            .modify_column_families(endpoint, name, plan.modifications)
            .await?;
        synced.modified = ids;
    }
    if let Some(on) = plan.deletion_protection {
        admin.set_deletion_protection(endpoint, name, on).await?;
        synced.table.deletion_protection = on;
        synced.deletion_protection = Some(on);
    }
    synced.refused = plan.refused;
    Ok(())
}

/// [`sync_table`], retried while it fails with a [`retryable`] status, until `deadline`
/// (None: until it succeeds or fails otherwise). `attempt_failed` hears of each retried
/// failure.
pub async fn sync_with_retries(
    admin: &dyn TableAdmin,
    validated: &ValidatedTable<'_>,
    deadline: Option<tokio::time::Instant>,
    attempt_failed: &(dyn Fn(&Status) + Send + Sync),
) -> Result<Synced, Status> {
    let mut delay = FIRST_RETRY_DELAY;
    loop {
        match sync_table(admin, validated).await {
            Err(s) if retryable(&s) => {
                attempt_failed(&s);
                if deadline.is_some_and(|d| tokio::time::Instant::now() + delay > d) {
                    return Err(s);
                }
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(MAX_RETRY_DELAY);
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use admin::modify_column_families_request::Modification;
    use admin::modify_column_families_request::modification::Mod;
    use bytes::Bytes;
    use googleapis_tonic_google_bigtable_admin_v2::google::bigtable::admin::v2 as admin;

    use super::*;

    /// An instance in memory that is unavailable for its first `down` calls.
    #[derive(Default)]
    struct FakeInstance {
        down: Mutex<u32>,
        tables: Mutex<HashMap<String, admin::Table>>,
        calls: Mutex<Vec<String>>,
    }

    impl FakeInstance {
        fn call(&self, what: String) -> Result<(), Status> {
            self.calls.lock().unwrap().push(what);
            let mut down = self.down.lock().unwrap();
            if *down > 0 {
                *down -= 1;
                return Err(Status::unavailable("no ready server"));
            }
            Ok(())
        }
    }

    #[tonic::async_trait]
    impl TableAdmin for FakeInstance {
        async fn get_table(&self, ep: &str, name: &str) -> Result<Option<admin::Table>, Status> {
            self.call(format!("get {ep} {name}"))?;
            Ok(self.tables.lock().unwrap().get(name).cloned())
        }
        async fn create_table(
            &self,
            ep: &str,
            parent: &str,
            id: &str,
            table: admin::Table,
            _splits: Vec<Bytes>,
        ) -> Result<admin::Table, Status> {
            self.call(format!("create {ep} {parent} {id}"))?;
            let name = format!("{parent}/tables/{id}");
            let mut tables = self.tables.lock().unwrap();
            if tables.contains_key(&name) {
                return Err(Status::already_exists(name));
            }
            tables.insert(name, table.clone());
            Ok(table)
        }
        async fn modify_column_families(
            &self,
            ep: &str,
            name: &str,
            mods: Vec<Modification>,
        ) -> Result<admin::Table, Status> {
            self.call(format!("modify {ep} {name}"))?;
            let mut tables = self.tables.lock().unwrap();
            let t = tables.get_mut(name).unwrap();
            for m in mods {
                match m.r#mod.unwrap() {
                    Mod::Create(f) | Mod::Update(f) => {
                        t.column_families.insert(m.id, f);
                    }
                    Mod::Drop(_) => {
                        t.column_families.remove(&m.id);
                    }
                }
            }
            Ok(t.clone())
        }
        async fn set_deletion_protection(
            &self,
            _: &str,
            name: &str,
            on: bool,
        ) -> Result<(), Status> {
            self.call(format!("protect {name} {on}"))?;
            self.tables
                .lock()
                .unwrap()
                .get_mut(name)
                .unwrap()
                .deletion_protection = on;
            Ok(())
        }
        async fn delete_table(&self, _: &str, _: &str) -> Result<(), Status> {
            unreachable!("the local runtime never drops tables")
        }
    }

    fn from_yaml<T: serde::de::DeserializeOwned>(yaml: &str) -> T {
        serde_norway::from_str(yaml).unwrap()
    }

    #[tokio::test]
    async fn a_table_is_created_once_the_instance_answers_then_brought_to_its_spec() {
        let instance: Instance = from_yaml(
            "metadata: {name: quickstart, namespace: default}\nspec: {displayName: Quickstart}\n",
        );
        let table: Table = from_yaml(
            "metadata: {name: greetings, namespace: default}\nspec: {instanceRef: quickstart, columnFamilies: {cf: {gcRule: {maxNumVersions: 1}}}}\n",
        );
        let fake = FakeInstance {
            down: Mutex::new(2),
            ..FakeInstance::default()
        };
        let v = validated(&table, &instance, "127.0.0.1:8086").unwrap();
        assert_eq!(
            v.name,
            "projects/default/instances/quickstart/tables/greetings"
        );
        let failures = Mutex::new(0);
        let synced = sync_with_retries(&fake, &v, None, &|_| *failures.lock().unwrap() += 1)
            .await
            .unwrap();
        assert_eq!(*failures.lock().unwrap(), 2);
        assert_eq!(synced.created, Some(1));
        assert_eq!(
            synced.to_string(),
            "table projects/default/instances/quickstart/tables/greetings: created with 1 column famil(ies)"
        );
        assert!(fake.calls.lock().unwrap().contains(
            &"create 127.0.0.1:8086 projects/default/instances/quickstart greetings".to_string()
        ));

        // The same spec again: nothing to do.
        let again = sync_table(&fake, &v).await.unwrap();
        assert_eq!(again.to_string(), format!("table {}: unchanged", v.name));

        // A new family and deletion protection: modified in place.
        let changed: Table = from_yaml(
            "metadata: {name: greetings, namespace: default}\nspec: {instanceRef: quickstart, deletionProtection: true, columnFamilies: {cf: {gcRule: {maxNumVersions: 1}}, more: {}}}\n",
        );
        let v2 = validated(&changed, &instance, "127.0.0.1:8086").unwrap();
        let synced = sync_table(&fake, &v2).await.unwrap();
        assert_eq!(synced.created, None);
        assert_eq!(synced.modified, ["more"]);
        assert_eq!(synced.deletion_protection, Some(true));
    }

    #[tokio::test]
    async fn retries_end_at_the_deadline_and_other_errors_at_once() {
        let instance: Instance = from_yaml(
            "metadata: {name: quickstart, namespace: default}\nspec: {displayName: Quickstart}\n",
        );
        let table: Table =
            from_yaml("metadata: {name: t, namespace: default}\nspec: {instanceRef: quickstart}\n");
        let v = validated(&table, &instance, "e").unwrap();
        let fake = FakeInstance {
            down: Mutex::new(1000),
            ..FakeInstance::default()
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
        let err = sync_with_retries(&fake, &v, Some(deadline), &|_| {})
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unavailable);
        assert!(!retryable(&Status::invalid_argument("bad family")));
        let bad: Table = from_yaml(
            "metadata: {name: t, namespace: default}\nspec: {instanceRef: quickstart, initialSplits: [a, a]}\n",
        );
        assert_eq!(
            validated(&bad, &instance, "e").unwrap_err(),
            "spec.initialSplits[1]: duplicate split key \"a\""
        );
    }
}
