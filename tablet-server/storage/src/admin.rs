//! Table administration on the store: loading the catalog at open, creating, changing and
//! deleting tables (each change one synced write of the `meta` column family, then published in
//! the in-memory [`crate::catalog::Catalog`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use basalt_model::hlc::now_micros;
use basalt_model::{FamilyChange, FamilySchema, RowRange, TableSchema};
use bytes::Bytes;
use rocksdb::WriteBatch;

use crate::encoding;
use crate::error::{Error, Result};
use crate::layout::{META_IAM_PREFIX, META_NEXT_TABLE_ID, META_TABLE_PREFIX};
use crate::store::Store;

impl Store {
    pub(crate) fn load_catalog(&self) -> Result<()> {
        let mut tables = self.catalog.tables.write();
        let it = self.db.prefix_iterator_cf(self.meta(), META_TABLE_PREFIX);
        for item in it {
            let (k, v) = item?;
            if !k.starts_with(META_TABLE_PREFIX.as_bytes()) {
                break;
            }
            let schema: TableSchema = serde_json::from_slice(&v).map_err(|e| {
                Error::Corrupt(format!("schema {:?}: {e}", String::from_utf8_lossy(&k)))
            })?;
            self.clock
                .observe(schema.dropped_families.values().copied().max().unwrap_or(0));
            tables.insert(schema);
        }
        self.catalog.loaded.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// The schema of a table, or NOT_FOUND.
    pub fn table(&self, name: &str) -> Result<Arc<TableSchema>> {
        self.catalog
            .tables
            .read()
            .get(name)
            .cloned()
            .ok_or_else(|| Error::not_found(format!("table {name} not found")))
    }

    /// Tablets this server owns (every table's, in standalone mode).
    pub fn tablet_count(&self) -> usize {
        self.catalog.tables.read().tablet_count()
    }

    pub fn list_tables(&self, instance: &str) -> Vec<Arc<TableSchema>> {
        self.catalog.tables.read().list(instance).cloned().collect()
    }

    /// Every table of every instance, in name order (what a standalone server serves; the
    /// control protocol reports their tablets).
    pub fn all_tables(&self) -> Vec<Arc<TableSchema>> {
        self.catalog.tables.read().all().cloned().collect()
    }

    pub(crate) fn put_schema(&self, batch: &mut WriteBatch, schema: &TableSchema) -> Result<()> {
        let json = serde_json::to_vec(schema)
            .map_err(|e| Error::Internal(format!("encoding schema: {e}")))?;
        batch.put_cf(
            self.meta(),
            format!("{META_TABLE_PREFIX}{}", schema.name),
            json,
        );
        Ok(())
    }

    pub fn create_table(
        &self,
        name: &str,
        instance: &str,
        families: BTreeMap<String, FamilySchema>,
        splits: Vec<Vec<u8>>,
        deletion_protection: bool,
    ) -> Result<Arc<TableSchema>> {
        debug_assert!(name.starts_with(instance));
        self.create_table_from(TableSchema {
            id: 0,
            name: name.to_string(),
            families,
            dropped_families: BTreeMap::new(),
            deletion_protection,
            splits,
            created_micros: 0,
            restore: None,
        })
    }

    /// Creates the table `schema` describes; the store gives it its id and creation time. Its
    /// `dropped_families` may be set (a table restored from a backup taken after families were
    /// dropped, and maybe created again: the backup holds their dead cells), and its `restore`
    /// (a restore's table, marked as such in the same write: see [`Store::finish_restore`]).
    pub fn create_table_from(&self, mut schema: TableSchema) -> Result<Arc<TableSchema>> {
        let _admin = self.admin.lock();
        let name = schema.name.clone();
        if self.catalog.tables.read().get(&name).is_some() {
            return Err(Error::already_exists(format!(
                "table {name} already exists"
            )));
        }
        let instance = schema.instance();
        let count = self.catalog.tables.read().list(instance).count();
        if count >= basalt_model::schema::MAX_TABLES_PER_INSTANCE {
            return Err(Error::failed_precondition(format!(
                "instance {instance} already has {count} tables, the maximum"
            )));
        }
        let id = self.meta_u64(META_NEXT_TABLE_ID)?.unwrap_or(1);
        schema.id = id;
        schema.created_micros = now_micros();
        self.clock
            .observe(schema.dropped_families.values().copied().max().unwrap_or(0));
        let mut batch = WriteBatch::default();
        batch.put_cf(self.meta(), META_NEXT_TABLE_ID, (id + 1).to_be_bytes());
        self.put_schema(&mut batch, &schema)?;
        // A fresh id never held data, but clear its range anyway: cheap, and it makes the
        // invariant "a table's range holds only that table's data" independent of history.
        batch.delete_range_cf(
            self.data(),
            encoding::table_prefix(id),
            encoding::table_end(id),
        );
        self.sync_write(batch)?;
        Ok(self.catalog.tables.write().insert(schema))
    }

    /// Marks the restore filling table `name` as ended: the table (if it is still the one of
    /// internal id `id`, its restore not ended yet) serves data requests from now on.
    /// NOT_FOUND if the table is gone or is another one; FAILED_PRECONDITION if no restore
    /// is filling it.
    pub fn finish_restore(&self, name: &str, id: u64) -> Result<Arc<TableSchema>> {
        let _admin = self.admin.lock();
        let mut schema = (*self.table(name)?).clone();
        if schema.id != id {
            return Err(Error::not_found(format!(
                "table {name} was deleted during its restore"
            )));
        }
        match schema.restore.as_mut() {
            Some(r) if r.operation.is_some() => r.operation = None,
            _ => {
                return Err(Error::failed_precondition(format!(
                    "table {name} is not being restored"
                )));
            }
        }
        let mut batch = WriteBatch::default();
        self.put_schema(&mut batch, &schema)?;
        self.sync_write(batch)?;
        Ok(self.catalog.tables.write().insert(schema))
    }

    pub fn set_deletion_protection(&self, name: &str, protect: bool) -> Result<Arc<TableSchema>> {
        let _admin = self.admin.lock();
        let mut schema = (*self.table(name)?).clone();
        schema.deletion_protection = protect;
        let mut batch = WriteBatch::default();
        self.put_schema(&mut batch, &schema)?;
        self.sync_write(batch)?;
        Ok(self.catalog.tables.write().insert(schema))
    }

    pub fn delete_table(&self, name: &str) -> Result<()> {
        let _admin = self.admin.lock();
        let schema = self.table(name)?;
        if schema.deletion_protection {
            return Err(Error::failed_precondition(format!(
                "table {name} is protected against deletion; disable deletion_protection first"
            )));
        }
        let mut batch = WriteBatch::default();
        batch.delete_cf(self.meta(), format!("{META_TABLE_PREFIX}{name}"));
        // A table created again under the name starts without the old one's grants.
        batch.delete_cf(self.meta(), format!("{META_IAM_PREFIX}{name}"));
        batch.delete_range_cf(
            self.data(),
            encoding::table_prefix(schema.id),
            encoding::table_end(schema.id),
        );
        // Writers hold the catalog from their check until their batch is queued at the
        // committer (see `submit_write`). With the catalog locked until the table is gone no
        // new write can start, and the range delete queues behind every write that did: none
        // lands after it.
        let mut tables = self.catalog.tables.write();
        // Asked under the catalog lock, as a writer does: a capture that starts now either
        // waits for this deletion at its barrier or receives its operation.
        let ops = self.range_ops(
            encoding::table_prefix(schema.id),
            encoding::table_end(schema.id),
        );
        self.committer
            .commit_blocking(batch, self.clock.current(), ops)?;
        tables.remove(name);
        self.fences.write().forget(schema.id);
        Ok(())
    }

    /// Applies every change in order, or none of them (the legality check is the model's
    /// [`TableSchema::with_family_changes`]).
    pub fn modify_column_families(
        &self,
        name: &str,
        changes: &[FamilyChange],
    ) -> Result<Arc<TableSchema>> {
        let _admin = self.admin.lock();
        // Held until the new schema is visible: a writer either took its versions before the
        // drop marker (its cells are dead) or sees the new schema (see `submit_write`).
        let mut tables = self.catalog.tables.write();
        let current = tables
            .get(name)
            .ok_or_else(|| Error::not_found(format!("table {name} not found")))?;
        // Every cell written so far has a smaller version than a drop's: they are all dead,
        // even if a family of the same name is created again.
        let schema = current.with_family_changes(changes, || self.clock.allocate(1).hlc)?;
        let mut batch = WriteBatch::default();
        self.put_schema(&mut batch, &schema)?;
        self.put_clock_floor(&mut batch);
        self.sync_write(batch)?;
        Ok(tables.insert(schema))
    }

    /// Deletes every row whose key starts with `prefix`, or every row when `prefix` is None.
    pub fn drop_row_range(&self, name: &str, prefix: Option<&[u8]>) -> Result<()> {
        let schema = self.table(name)?;
        let ((start, end), rows) = match prefix {
            Some(p) => (
                encoding::row_prefix_range(schema.id, p),
                RowRange::new(
                    Bytes::copy_from_slice(p),
                    encoding::prefix_successor(p).map(Bytes::from),
                ),
            ),
            None => (
                (
                    encoding::table_prefix(schema.id),
                    encoding::table_end(schema.id),
                ),
                RowRange::all(),
            ),
        };
        // Not while a tablet of the range is fenced for a move: the deletion would land after
        // the fence's last record, and the destination (which may have dropped its rows
        // already) would keep the copy it took before. Checked under the catalog lock, as
        // writes are: a fence waits for a deletion that passed.
        let _tables = self.catalog.tables.read();
        if let Some(refused) = self.fences.read().range_refusal(&schema, &rows) {
            return Err(refused);
        }
        self.delete_keys(start, end)
    }

    /// The IAM policy of `resource` (an instance's or a table's name) as last set; None if
    /// never set (or its table was deleted since).
    pub fn iam_policy(&self, resource: &str) -> Result<Option<basalt_model::iam::Policy>> {
        match self
            .db
            .get_cf(self.meta(), format!("{META_IAM_PREFIX}{resource}"))?
        {
            None => Ok(None),
            Some(v) => serde_json::from_slice(&v)
                .map(Some)
                .map_err(|e| Error::Corrupt(format!("the IAM policy of {resource}: {e}"))),
        }
    }

    /// Sets `resource`'s IAM policy to `change(current)` (one synced write, under the admin
    /// lock: two changes never both pass the same etag). NOT_FOUND for a table that does not
    /// exist; `change`'s error as it is.
    pub fn update_iam_policy<E>(
        &self,
        resource: &str,
        table: bool,
        change: impl FnOnce(
            Option<&basalt_model::iam::Policy>,
        ) -> std::result::Result<basalt_model::iam::Policy, E>,
    ) -> Result<std::result::Result<basalt_model::iam::Policy, E>> {
        let _admin = self.admin.lock();
        if table {
            self.table(resource)?;
        }
        let current = self.iam_policy(resource)?;
        let policy = match change(current.as_ref()) {
            Ok(p) => p,
            Err(e) => return Ok(Err(e)),
        };
        let json = serde_json::to_vec(&policy)
            .map_err(|e| Error::Internal(format!("encoding an IAM policy: {e}")))?;
        let mut batch = WriteBatch::default();
        batch.put_cf(self.meta(), format!("{META_IAM_PREFIX}{resource}"), json);
        self.sync_write(batch)?;
        Ok(Ok(policy))
    }

    /// The identity of this store: created at the first open of its data directory and kept
    /// for its life. Tablets are owned by it (a server restarted on its directory keeps them;
    /// one whose directory was lost comes back with a new identity).
    pub fn store_id(&self) -> Result<String> {
        Ok(self.store_id.clone())
    }

    /// The directory the store was opened on (its volume is the server's storage).
    pub fn path(&self) -> &std::path::Path {
        self.db.path()
    }

    /// The origin of the aggregate inputs this store's clients write: a number of its own,
    /// from its identity (see [`crate::merge_operator`]; never
    /// [`crate::merge_operator::LEGACY_ORIGIN`]).
    pub fn origin(&self) -> u64 {
        self.origin
    }

    /// Installs a schema decided elsewhere (the instance's catalog in etcd, cluster mode) as
    /// it is, id included. A table of the same name with another id is a table that was
    /// deleted and created again: its data goes first.
    pub fn install_schema(&self, schema: TableSchema) -> Result<Arc<TableSchema>> {
        let _admin = self.admin.lock();
        let mut tables = self.catalog.tables.write();
        let mut batch = WriteBatch::default();
        let mut ops = vec![];
        if let Some(old) = tables.get(&schema.name)
            && old.id != schema.id
        {
            batch.delete_range_cf(
                self.data(),
                encoding::table_prefix(old.id),
                encoding::table_end(old.id),
            );
            ops = self.range_ops(encoding::table_prefix(old.id), encoding::table_end(old.id));
        }
        self.clock
            .observe(schema.dropped_families.values().copied().max().unwrap_or(0));
        self.put_schema(&mut batch, &schema)?;
        self.put_clock_floor(&mut batch);
        self.committer
            .commit_blocking(batch, self.clock.current(), ops)?;
        Ok(tables.insert(schema))
    }

    /// Removes a table deleted elsewhere (cluster mode) with its data; no protection check
    /// (the catalog in etcd decided). Nothing happens for an unknown table.
    pub fn remove_table(&self, name: &str) -> Result<()> {
        let _admin = self.admin.lock();
        let Some(schema) = self.catalog.tables.read().get(name).cloned() else {
            return Ok(());
        };
        let mut batch = WriteBatch::default();
        batch.delete_cf(self.meta(), format!("{META_TABLE_PREFIX}{name}"));
        // A table created again under the name starts without the old one's grants.
        batch.delete_cf(self.meta(), format!("{META_IAM_PREFIX}{name}"));
        batch.delete_range_cf(
            self.data(),
            encoding::table_prefix(schema.id),
            encoding::table_end(schema.id),
        );
        let mut tables = self.catalog.tables.write();
        // Under the catalog lock (see `delete_table`).
        let ops = self.range_ops(
            encoding::table_prefix(schema.id),
            encoding::table_end(schema.id),
        );
        self.committer
            .commit_blocking(batch, self.clock.current(), ops)?;
        tables.remove(name);
        self.fences.write().forget(schema.id);
        Ok(())
    }

    /// One small synced write: completes only if the disk still syncs (cluster mode stops
    /// renewing its lease when it does not).
    pub fn sync_probe(&self) -> Result<()> {
        let mut batch = WriteBatch::default();
        batch.put_cf(self.meta(), b"sync_probe", now_micros().to_be_bytes());
        self.sync_write(batch)
    }

    /// A clock value for a schema change decided elsewhere (a family drop's marker).
    pub fn allocate_version(&self) -> u64 {
        self.clock.allocate(1).hlc
    }
}
