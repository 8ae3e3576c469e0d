//! Where the Key Visualizer's history lives in etcd: one value per table, layer and column,
//! `/basalt/keyviz/v1/<namespace>/<instance>/<table>/<layer>/<start-minute>` (the start
//! minute in 12 digits, so keys sort by time). The values are opaque here (the operator's
//! encoding of a column).
//!
//! The history sits beside the instance's prefix, not under it: the master and every server
//! watch the instance's prefix, and a column written every minute per table is nothing they
//! need to see. Only the master writes it, fenced by its term; anyone may read it (the
//! Key Visualizer's page, served by every operator replica and by the local runtime).

use std::collections::BTreeMap;

use basalt_model::Result;
use basalt_model::keyviz::{Column, TableHistory};
use etcd_client::{GetOptions, Txn, TxnOp};
use tracing::warn;

use crate::client::{Meta, unavailable};
use crate::keys::prefix_end;
use crate::term::Term;

/// Most operations in one etcd transaction (etcd refuses more than 128 by default).
const OPS_PER_TXN: usize = 100;

/// One stored column's place: the table id, its layer and its first minute.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ColumnKey {
    pub table: String,
    pub layer: usize,
    pub start_minute: i64,
}

/// A write of the history: a column's new value, or its deletion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ColumnWrite {
    Put(ColumnKey, Vec<u8>),
    Delete(ColumnKey),
}

impl Meta {
    /// The prefix of the instance's Key Visualizer history (ends with `/`).
    pub fn keyviz_prefix(&self) -> String {
        format!(
            "/basalt/keyviz/v1/{}/{}/",
            self.keys().namespace(),
            self.keys().instance()
        )
    }

    fn keyviz_key(&self, key: &ColumnKey) -> String {
        format!(
            "{}{}/{}/{:012}",
            self.keyviz_prefix(),
            key.table,
            key.layer,
            key.start_minute
        )
    }

    /// Parses a key of the history back into its place.
    fn parse_keyviz_key(&self, key: &str) -> Option<ColumnKey> {
        let rest = key.strip_prefix(&self.keyviz_prefix())?;
        let mut parts = rest.rsplitn(3, '/');
        let start_minute = parts.next()?.parse().ok()?;
        let layer = parts.next()?.parse().ok()?;
        let table = parts.next()?.to_string();
        Some(ColumnKey {
            table,
            layer,
            start_minute,
        })
    }

    /// Every stored column of the instance (`table`: only that table's), in key order: per
    /// table, per layer, oldest first.
    pub async fn keyviz_columns(&self, table: Option<&str>) -> Result<Vec<(ColumnKey, Vec<u8>)>> {
        let prefix = match table {
            Some(table) => format!("{}{table}/", self.keyviz_prefix()),
            None => self.keyviz_prefix(),
        };
        let (kvs, _) = self.get_prefix(&prefix).await?;
        Ok(kvs
            .into_iter()
            .filter_map(|kv| {
                let key = self.parse_keyviz_key(kv.key_str().ok()?)?;
                Some((key, kv.value().to_vec()))
            })
            .collect())
    }

    /// The stored history by table id (`table`: only that table's), each column read back with
    /// `decode` (the operator's encoding); a column that does not decode (a newer master's
    /// format) is skipped with a warning.
    pub async fn keyviz_histories(
        &self,
        table: Option<&str>,
        decode: impl Fn(&[u8]) -> Option<Column>,
    ) -> Result<BTreeMap<String, TableHistory>> {
        let mut histories: BTreeMap<String, TableHistory> = BTreeMap::new();
        for (key, value) in self.keyviz_columns(table).await? {
            match decode(&value) {
                Some(column) => histories
                    .entry(key.table)
                    .or_default()
                    .restore(key.layer, column),
                None => warn!(table = %key.table, layer = key.layer, start = key.start_minute,
                    "a Key Visualizer column does not decode; skipped"),
            }
        }
        Ok(histories)
    }

    /// The tables that have a history (their ids).
    pub async fn keyviz_tables(&self) -> Result<Vec<String>> {
        let prefix = self.keyviz_prefix();
        let resp = self
            .client()
            .get(
                prefix.as_str(),
                Some(
                    GetOptions::new()
                        .with_range(prefix_end(&prefix))
                        .with_keys_only(),
                ),
            )
            .await
            .map_err(unavailable)?;
        let mut tables: Vec<String> = resp
            .kvs()
            .iter()
            .filter_map(|kv| Some(self.parse_keyviz_key(kv.key_str().ok()?)?.table))
            .collect();
        tables.dedup();
        Ok(tables)
    }

    /// Writes `writes` while `term` leads (in transactions of at most [`OPS_PER_TXN`]
    /// operations; each is fenced by the term). False if the term no longer leads (what was
    /// not yet written is not).
    pub async fn write_keyviz(&self, term: &Term, writes: Vec<ColumnWrite>) -> Result<bool> {
        for chunk in writes.chunks(OPS_PER_TXN) {
            let ops: Vec<TxnOp> = chunk
                .iter()
                .map(|w| match w {
                    ColumnWrite::Put(key, value) => {
                        TxnOp::put(self.keyviz_key(key), value.clone(), None)
                    }
                    ColumnWrite::Delete(key) => TxnOp::delete(self.keyviz_key(key), None),
                })
                .collect();
            if !self.fenced(term, [], ops).await? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Deletes a table's history (the table is gone), if `term` still leads.
    pub async fn delete_keyviz_table(&self, term: &Term, table: &str) -> Result<bool> {
        let prefix = format!("{}{table}/", self.keyviz_prefix());
        let txn = Txn::new().when([term.compare()]).and_then([TxnOp::delete(
            prefix.as_str(),
            Some(etcd_client::DeleteOptions::new().with_range(prefix_end(&prefix))),
        )]);
        let resp = self.client().txn(txn).await.map_err(unavailable)?;
        Ok(resp.succeeded())
    }
}
