//! The table catalog: one JSON schema per table in the `meta` column family under
//! `table/<name>` (see `docs/storage-format.md`), mirrored in memory by [`Catalog`] and shared
//! with the compaction filter (which needs each family's GC rule); and the table admin
//! operations on it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use basalt_model::hlc::now_micros;
use basalt_model::{FamilyChange, FamilySchema, TableSchema};
use parking_lot::RwLock;
use rocksdb::WriteBatch;

use crate::encoding;
use crate::error::{Error, Result};
use crate::store::{META_NEXT_TABLE_ID, META_TABLE_PREFIX, Store};

/// In-memory view of every table's schema, by name and by id.
#[derive(Debug, Default)]
pub struct Catalog {
    by_name: BTreeMap<String, Arc<TableSchema>>,
    by_id: HashMap<u64, Arc<TableSchema>>,
}

impl Catalog {
    pub fn insert(&mut self, schema: TableSchema) -> Arc<TableSchema> {
        let schema = Arc::new(schema);
        if let Some(old) = self.by_name.insert(schema.name.clone(), schema.clone()) {
            self.by_id.remove(&old.id);
        }
        self.by_id.insert(schema.id, schema.clone());
        schema
    }

    pub fn remove(&mut self, name: &str) -> Option<Arc<TableSchema>> {
        let old = self.by_name.remove(name)?;
        self.by_id.remove(&old.id);
        Some(old)
    }

    pub fn get(&self, name: &str) -> Option<&Arc<TableSchema>> {
        self.by_name.get(name)
    }

    pub fn by_id(&self, id: u64) -> Option<&Arc<TableSchema>> {
        self.by_id.get(&id)
    }

    /// Tablets of every table: each table is split into `splits + 1` key ranges.
    pub fn tablet_count(&self) -> usize {
        self.by_name.values().map(|t| t.splits.len() + 1).sum()
    }

    /// Tables of one instance (`projects/P/instances/I`), in name order.
    pub fn list(&self, instance: &str) -> impl Iterator<Item = &Arc<TableSchema>> {
        let prefix = format!("{instance}/tables/");
        self.by_name
            .range(prefix.clone()..)
            .take_while(move |(k, _)| k.starts_with(&prefix))
            .map(|(_, v)| v)
    }
}

/// The catalog shared with the compaction filter.
#[derive(Default)]
pub(crate) struct SharedCatalog {
    pub(crate) tables: RwLock<Catalog>,
    /// False until the catalog is loaded at open: the compaction filter keeps everything before.
    pub(crate) loaded: AtomicBool,
}

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
        self.catalog
            .tables
            .read()
            .by_name
            .values()
            .cloned()
            .collect()
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
        let _admin = self.admin.lock();
        if self.catalog.tables.read().get(name).is_some() {
            return Err(Error::already_exists(format!(
                "table {name} already exists"
            )));
        }
        let count = self.catalog.tables.read().list(instance).count();
        if count >= basalt_model::schema::MAX_TABLES_PER_INSTANCE {
            return Err(Error::failed_precondition(format!(
                "instance {instance} already has {count} tables, the maximum"
            )));
        }
        let id = self.meta_u64(META_NEXT_TABLE_ID)?.unwrap_or(1);
        let schema = TableSchema {
            id,
            name: name.to_string(),
            families,
            dropped_families: BTreeMap::new(),
            deletion_protection,
            splits,
            created_micros: now_micros(),
        };
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
        self.committer
            .commit_blocking(batch, self.clock.current())?;
        tables.remove(name);
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
        let (start, end) = match prefix {
            Some(p) => encoding::row_prefix_range(schema.id, p),
            None => (
                encoding::table_prefix(schema.id),
                encoding::table_end(schema.id),
            ),
        };
        let mut batch = WriteBatch::default();
        batch.delete_range_cf(self.data(), start, end);
        self.sync_write(batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_lists_one_instance() {
        let mut c = Catalog::default();
        for (id, name) in [
            (1, "projects/p/instances/i/tables/b"),
            (2, "projects/p/instances/i/tables/a"),
            (3, "projects/p/instances/i2/tables/a"),
        ] {
            c.insert(TableSchema {
                id,
                name: name.into(),
                families: BTreeMap::new(),
                dropped_families: BTreeMap::new(),
                deletion_protection: false,
                splits: vec![],
                created_micros: 0,
            });
        }
        let names: Vec<_> = c.list("projects/p/instances/i").map(|t| t.id).collect();
        assert_eq!(names, vec![2, 1]);
        assert_eq!(c.by_id(3).unwrap().name, "projects/p/instances/i2/tables/a");
        c.remove("projects/p/instances/i/tables/a");
        assert!(c.by_id(2).is_none());
    }
}
