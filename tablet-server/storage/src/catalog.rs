//! The table catalog in memory: one schema per table (persisted as JSON in the `meta` column
//! family under `table/<name>`, see `docs/storage-format.md`, by [`crate::admin`]), shared with
//! the compaction filter, which needs each family's GC rule.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use basalt_model::TableSchema;
use parking_lot::RwLock;

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

    /// Every table, in name order.
    pub fn all(&self) -> impl Iterator<Item = &Arc<TableSchema>> {
        self.by_name.values()
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
                restore: None,
            });
        }
        let names: Vec<_> = c.list("projects/p/instances/i").map(|t| t.id).collect();
        assert_eq!(names, vec![2, 1]);
        assert_eq!(c.by_id(3).unwrap().name, "projects/p/instances/i2/tables/a");
        c.remove("projects/p/instances/i/tables/a");
        assert!(c.by_id(2).is_none());
    }
}
