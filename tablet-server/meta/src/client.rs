//! [`Meta`]: the instance's coordination store on etcd — the catalog, the tablet map, the
//! servers' registrations and the master's election. Every failure to reach etcd is a
//! retryable UNAVAILABLE.

use std::collections::BTreeSet;
use std::time::Duration;

use basalt_model::{Error, Result, ServerId, TableSchema, Tablet, TabletMap, TabletState};
use etcd_client::{
    Client, Compare, CompareOp, GetOptions, KeyValue, Txn, TxnOp, WatchOptions, WatchStream,
};
use tracing::debug;

pub use basalt_transport::Security;
pub use basalt_transport::etcd::EtcdEndpoints;

/// The etcd client URLs `urls` (or bare `host:port`) under `security`; a URL that does not fit
/// (another scheme, not a URL) is INVALID_ARGUMENT.
pub fn endpoints<S: AsRef<str>>(urls: &[S], security: &Security) -> Result<EtcdEndpoints> {
    EtcdEndpoints::new(urls, security).map_err(|e| Error::InvalidArgument(e.to_string()))
}

use crate::keys::{Keys, prefix_end};
use crate::records::{
    AppProfileRecord, AutoscalerRecord, AutoscalingRecord, MovePhase, MoveRecord, ServerRecord,
    decode, decode_tablet, encode_tablet,
};
use crate::term::Term;

/// The error a caller sees when etcd cannot be reached or refuses.
pub(crate) fn unavailable(e: etcd_client::Error) -> Error {
    Error::Unavailable(format!("the coordination store (etcd) did not answer: {e}"))
}

/// How long a request may take before the caller gets UNAVAILABLE.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// How many times an optimistic transaction is retried when another writer won the race.
const CAS_ATTEMPTS: usize = 64;

/// Most tablets [`Meta::assign_table`] writes in one transaction: etcd refuses a transaction
/// of more than 128 operations by default (`--max-txn-ops`), and a batch also puts or
/// deletes the table's assignment marker.
pub const ASSIGN_BATCH: usize = 100;

/// Keys per page of a read under a prefix. Big pages, because etcd (3.4) counts every key
/// left in the range for each page it answers, so a read in pages of `p` keys costs some
/// `keys² / p`: a million tablet records took 99 s in pages of 1,000 and 12 s in pages of
/// 10,000 (docs/scale.md). A page of tablet records is some 11 MiB.
const PAGE_KEYS: i64 = 50_000;

/// The largest answer a read under a prefix accepts (tonic's default is 4 MiB): room for
/// records twenty times the size of a tablet's (schemas with many splits).
const PAGE_BYTES: usize = 256 << 20;

/// A connection to one instance's keys in etcd. Cheap to clone.
#[derive(Clone)]
pub struct Meta {
    client: Client,
    keys: Keys,
    endpoints: EtcdEndpoints,
}

/// A cluster's tablet map as read at one revision ([`Meta::tablet_snapshot`]).
#[derive(Clone, Debug)]
pub struct TabletSnapshot {
    pub map: TabletMap,
    /// The tables whose tablets are still being written, left out of `map`.
    pub assigning: BTreeSet<String>,
    pub revision: i64,
}

/// A schema with the etcd revisions that identify its version.
#[derive(Clone, Debug)]
pub struct StoredSchema {
    pub schema: TableSchema,
    /// Changes with every update (compare-and-swap).
    pub mod_revision: i64,
    /// The table's creation (tells a table from a later one of the same name).
    pub create_revision: i64,
}

/// A registration as read from etcd.
#[derive(Clone, Debug)]
pub struct Registered {
    pub cluster: String,
    pub record: ServerRecord,
    /// The lease the key is bound to.
    pub lease: i64,
}

impl Meta {
    /// Connects to etcd at `endpoints` (their URLs and the connection policy come from
    /// `basalt-transport`).
    pub async fn connect(endpoints: &EtcdEndpoints, keys: Keys) -> Result<Meta> {
        let options = endpoints.connect_options().with_timeout(REQUEST_TIMEOUT);
        let client = Client::connect(endpoints.urls(), Some(options))
            .await
            .map_err(unavailable)?;
        Ok(Meta {
            client,
            keys,
            endpoints: endpoints.clone(),
        })
    }

    /// A connection without the request timeout, for calls that wait as long as it takes (a
    /// campaign waits for the leader to go). A dead connection still fails them: the HTTP/2
    /// keep-alive notices it within seconds.
    pub(crate) async fn waiting_client(&self) -> Result<Client> {
        Client::connect(
            self.endpoints.urls(),
            Some(self.endpoints.connect_options()),
        )
        .await
        .map_err(unavailable)
    }

    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// The etcd client (for leases, watches and elections).
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// Every key under `prefix` and the revision they were read at, in pages of
    /// [`PAGE_KEYS`] keys all read at that one revision (a consistent snapshot, as one read
    /// would be). One read of everything stops working as a cluster grows: the answer had to
    /// fit the client's 4 MiB message limit, some 19,000 tablet records (docs/scale.md).
    pub(crate) async fn get_prefix(&self, prefix: &str) -> Result<(Vec<KeyValue>, i64)> {
        self.get_prefix_paged(prefix, PAGE_KEYS, 0).await
    }

    /// The same at `revision` (0: now).
    async fn get_prefix_paged(
        &self,
        prefix: &str,
        page: i64,
        at: i64,
    ) -> Result<(Vec<KeyValue>, i64)> {
        let end = prefix_end(prefix);
        let mut from = prefix.as_bytes().to_vec();
        let mut revision = at;
        let mut kvs = Vec::new();
        loop {
            let mut options = GetOptions::new().with_range(end.clone()).with_limit(page);
            if revision > 0 {
                options = options.with_revision(revision);
            }
            let mut resp = self
                .client
                .kv_client()
                .max_decoding_message_size(PAGE_BYTES)
                .get(from.clone(), Some(options))
                .await
                .map_err(unavailable)?;
            if revision == 0 {
                revision = resp.header().map(|h| h.revision()).unwrap_or(0);
            }
            let more = resp.more();
            let page = resp.take_kvs();
            match page.last() {
                Some(last) if more => {
                    // The next page starts right after the last key read.
                    from = last.key().to_vec();
                    from.push(0);
                }
                _ => {
                    kvs.extend(page);
                    return Ok((kvs, revision));
                }
            }
            kvs.extend(page);
        }
    }

    pub(crate) async fn txn(&self, txn: Txn) -> Result<etcd_client::TxnResponse> {
        self.client.clone().txn(txn).await.map_err(unavailable)
    }

    /// The master's writes: `then` in one transaction, if `term` still leads and every
    /// comparison of `when` holds (the records are exactly as the master read them). True if
    /// it was written; false if anything changed meanwhile (nothing was written).
    pub(crate) async fn fenced(
        &self,
        term: &Term,
        when: impl IntoIterator<Item = Compare>,
        then: impl Into<Vec<TxnOp>>,
    ) -> Result<bool> {
        let when: Vec<Compare> = std::iter::once(term.compare()).chain(when).collect();
        let txn = Txn::new().when(when).and_then(then);
        Ok(self.txn(txn).await?.succeeded())
    }

    // --- the catalog -------------------------------------------------------------------

    /// Every table's schema, in table id order, and the revision they were read at.
    pub async fn tables(&self) -> Result<(Vec<StoredSchema>, i64)> {
        let (kvs, revision) = self.get_prefix(&self.keys.schemas()).await?;
        let tables = kvs.iter().map(stored_schema).collect::<Result<Vec<_>>>()?;
        Ok((tables, revision))
    }

    /// One table's schema (`table` is the table id).
    pub async fn table(&self, table: &str) -> Result<Option<StoredSchema>> {
        let mut resp = self
            .client
            .clone()
            .get(self.keys.schema(table), None)
            .await
            .map_err(unavailable)?;
        resp.take_kvs().first().map(stored_schema).transpose()
    }

    /// Creates a table: its internal id comes from the instance's counter, in the same
    /// transaction. ALREADY_EXISTS if a table of that id exists; FAILED_PRECONDITION past
    /// Bigtable's limit of tables per instance.
    pub async fn create_table(&self, mut schema: TableSchema) -> Result<StoredSchema> {
        let table = table_id(&schema.name).to_string();
        let schema_key = self.keys.schema(&table);
        let counter_key = self.keys.next_table_id();
        for _ in 0..CAS_ATTEMPTS {
            let (existing, _) = self.get_prefix(&self.keys.schemas()).await?;
            if existing.iter().any(|kv| kv.key() == schema_key.as_bytes()) {
                return Err(already_exists(&schema.name));
            }
            if existing.len() >= basalt_model::schema::MAX_TABLES_PER_INSTANCE {
                return Err(Error::FailedPrecondition(format!(
                    "the instance already has {} tables, the maximum",
                    existing.len()
                )));
            }
            let mut resp = self
                .client
                .clone()
                .get(counter_key.as_str(), None)
                .await
                .map_err(unavailable)?;
            let (next, counter_rev) = match resp.take_kvs().first() {
                Some(kv) => (
                    std::str::from_utf8(kv.value())
                        .ok()
                        .and_then(|v| v.parse::<u64>().ok())
                        .ok_or_else(|| Error::Internal(format!("bad {counter_key}")))?,
                    kv.mod_revision(),
                ),
                None => (1, 0),
            };
            schema.id = next;
            let value = serde_json::to_vec(&schema)
                .map_err(|e| Error::Internal(format!("encoding schema: {e}")))?;
            let txn = Txn::new()
                .when([
                    Compare::version(schema_key.as_str(), CompareOp::Equal, 0),
                    Compare::mod_revision(counter_key.as_str(), CompareOp::Equal, counter_rev),
                ])
                .and_then([
                    TxnOp::put(schema_key.as_str(), value, None),
                    TxnOp::put(counter_key.as_str(), (next + 1).to_string(), None),
                ]);
            let resp = self.txn(txn).await?;
            if resp.succeeded() {
                let revision = resp.header().map(|h| h.revision()).unwrap_or(0);
                return Ok(StoredSchema {
                    schema,
                    mod_revision: revision,
                    create_revision: revision,
                });
            }
            debug!(table, "table creation raced with another; retrying");
        }
        Err(Error::Unavailable(format!(
            "too much contention creating table {}; try again",
            schema.name
        )))
    }

    /// Replaces a table's schema by `change(current)`, atomically against concurrent changes
    /// (retried on a race). NOT_FOUND if the table does not exist; `change`'s error as is.
    pub async fn update_table(
        &self,
        table: &str,
        mut change: impl FnMut(&TableSchema) -> Result<TableSchema>,
    ) -> Result<StoredSchema> {
        let key = self.keys.schema(table);
        for _ in 0..CAS_ATTEMPTS {
            let current = self.table(table).await?.ok_or_else(|| not_found(table))?;
            let schema = change(&current.schema)?;
            let value = serde_json::to_vec(&schema)
                .map_err(|e| Error::Internal(format!("encoding schema: {e}")))?;
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    key.as_str(),
                    CompareOp::Equal,
                    current.mod_revision,
                )])
                .and_then([TxnOp::put(key.as_str(), value, None)]);
            let resp = self.txn(txn).await?;
            if resp.succeeded() {
                return Ok(StoredSchema {
                    schema,
                    mod_revision: resp.header().map(|h| h.revision()).unwrap_or(0),
                    create_revision: current.create_revision,
                });
            }
        }
        Err(Error::Unavailable(format!(
            "too much contention changing table {table}; try again"
        )))
    }

    /// Deletes a table's schema and its tablets in every cluster, if `check(current)` allows
    /// it (e.g. deletion protection). NOT_FOUND if it does not exist.
    pub async fn delete_table(
        &self,
        table: &str,
        check: impl Fn(&TableSchema) -> Result<()>,
    ) -> Result<()> {
        let key = self.keys.schema(table);
        for _ in 0..CAS_ATTEMPTS {
            let current = self.table(table).await?.ok_or_else(|| not_found(table))?;
            check(&current.schema)?;
            // The table's IAM policy goes with it: a table created again under the name
            // starts without the old one's grants.
            let mut ops = vec![
                TxnOp::delete(key.as_str(), None),
                TxnOp::delete(self.keys.iam_policy(Some(table)), None),
            ];
            for cluster in self.clusters().await? {
                ops.push(TxnOp::delete(
                    self.keys.table_tablets(&cluster, table),
                    Some(etcd_client::DeleteOptions::new().with_prefix()),
                ));
            }
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    key.as_str(),
                    CompareOp::Equal,
                    current.mod_revision,
                )])
                .and_then(ops);
            if self.txn(txn).await?.succeeded() {
                return Ok(());
            }
        }
        Err(Error::Unavailable(format!(
            "too much contention deleting table {table}; try again"
        )))
    }

    /// The IAM policy of the instance (`table` None) or of a table, as last set (None: never).
    pub async fn iam_policy(
        &self,
        table: Option<&str>,
    ) -> Result<Option<basalt_model::iam::Policy>> {
        self.record(self.keys.iam_policy(table)).await
    }

    /// Sets the IAM policy of the instance or a table to `change(current)`, atomically against
    /// concurrent changes (compare-and-swap on the key's revision, retried on a race).
    /// NOT_FOUND for a table that does not exist; `change`'s error as it is.
    pub async fn update_iam_policy<E>(
        &self,
        table: Option<&str>,
        mut change: impl FnMut(
            Option<&basalt_model::iam::Policy>,
        ) -> std::result::Result<basalt_model::iam::Policy, E>,
    ) -> Result<std::result::Result<basalt_model::iam::Policy, E>> {
        let key = self.keys.iam_policy(table);
        for _ in 0..CAS_ATTEMPTS {
            let mut when = Vec::new();
            if let Some(table) = table {
                let schema = self.table(table).await?.ok_or_else(|| not_found(table))?;
                // Not on a table deleted meanwhile.
                when.push(Compare::mod_revision(
                    self.keys.schema(table),
                    CompareOp::Equal,
                    schema.mod_revision,
                ));
            }
            let (current, revision) = self.record_at::<basalt_model::iam::Policy>(&key).await?;
            let policy = match change(current.as_ref()) {
                Ok(p) => p,
                Err(e) => return Ok(Err(e)),
            };
            let value = serde_json::to_vec(&policy)
                .map_err(|e| Error::Internal(format!("encoding an IAM policy: {e}")))?;
            when.push(Compare::mod_revision(
                key.as_str(),
                CompareOp::Equal,
                revision,
            ));
            let txn = Txn::new()
                .when(when)
                .and_then([TxnOp::put(key.as_str(), value, None)]);
            if self.txn(txn).await?.succeeded() {
                return Ok(Ok(policy));
            }
        }
        Err(Error::Unavailable(format!(
            "too much contention setting the IAM policy of {}; try again",
            table.unwrap_or("the instance")
        )))
    }

    /// Every app profile of the instance, in id order.
    pub async fn app_profiles(&self) -> Result<Vec<AppProfileRecord>> {
        let (kvs, _) = self.get_prefix(&self.keys.app_profiles()).await?;
        kvs.iter()
            .map(|kv| decode(kv.key_str().unwrap_or("<app profile>"), kv.value()))
            .collect()
    }

    /// One app profile (None if the catalog has none of that id).
    pub async fn app_profile(&self, id: &str) -> Result<Option<AppProfileRecord>> {
        check_app_profile_id(id)?;
        let key = self.keys.app_profile(id);
        let mut resp = self
            .client
            .clone()
            .get(key.as_str(), None)
            .await
            .map_err(unavailable)?;
        resp.take_kvs()
            .first()
            .map(|kv| decode(&key, kv.value()))
            .transpose()
    }

    /// Creates or replaces the app profile `profile.id` (the last write wins: the catalog's
    /// app profiles have one writer, the operator).
    pub async fn put_app_profile(&self, profile: &AppProfileRecord) -> Result<()> {
        check_app_profile_id(&profile.id)?;
        self.client
            .clone()
            .put(self.keys.app_profile(&profile.id), profile.encode(), None)
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    /// Deletes an app profile; whether there was one.
    pub async fn delete_app_profile(&self, id: &str) -> Result<bool> {
        check_app_profile_id(id)?;
        let resp = self
            .client
            .clone()
            .delete(self.keys.app_profile(id), None)
            .await
            .map_err(unavailable)?;
        Ok(resp.deleted() > 0)
    }

    // --- clusters, servers and tablets -------------------------------------------------

    /// The names of the clusters with keys in etcd (registrations or tablets).
    pub async fn clusters(&self) -> Result<Vec<String>> {
        let prefix = self.keys.clusters();
        let resp = self
            .client
            .clone()
            .get(
                prefix.as_str(),
                Some(GetOptions::new().with_prefix().with_keys_only()),
            )
            .await
            .map_err(unavailable)?;
        let mut clusters: Vec<String> = resp
            .kvs()
            .iter()
            .filter_map(|kv| {
                let key = std::str::from_utf8(kv.key()).ok()?;
                Some(key.strip_prefix(&prefix)?.split_once('/')?.0.to_string())
            })
            .collect();
        clusters.dedup();
        Ok(clusters)
    }

    /// The registered (live) servers of every cluster, or of one.
    pub async fn servers(&self, cluster: Option<&str>) -> Result<(Vec<Registered>, i64)> {
        // One cluster's: only its registrations are read (not its tablets).
        let prefix = match cluster {
            Some(cluster) => self.keys.servers(cluster),
            None => self.keys.clusters(),
        };
        let (kvs, revision) = self.get_prefix(&prefix).await?;
        let mut servers = Vec::new();
        for kv in &kvs {
            let Ok(key) = std::str::from_utf8(kv.key()) else {
                continue;
            };
            let Some((c, _)) = self.keys.parse_server(key) else {
                continue;
            };
            if cluster.is_some_and(|want| want != c) {
                continue;
            }
            servers.push(Registered {
                cluster: c.to_string(),
                record: decode(key, kv.value())?,
                lease: kv.lease(),
            });
        }
        Ok((servers, revision))
    }

    /// The tablet map of one cluster and the revision it was read at.
    pub async fn tablets(&self, cluster: &str) -> Result<(TabletMap, i64)> {
        let snapshot = self.tablet_snapshot(cluster).await?;
        Ok((snapshot.map, snapshot.revision))
    }

    /// The tablet map of `cluster`, the tables left out of it because their tablets are
    /// still being written, and the revision read: where a [`TabletFollower`] starts.
    ///
    /// [`TabletFollower`]: crate::follow::TabletFollower
    pub async fn tablet_snapshot(&self, cluster: &str) -> Result<TabletSnapshot> {
        let (kvs, revision) = self.get_prefix(&self.keys.tablets(cluster)).await?;
        let (tablets, assigning) = self.decode_tablets(&kvs)?;
        let map = TabletMap::new(tablets)
            .map_err(|e| Error::Internal(format!("the tablet map in etcd is broken: {e}")))?;
        Ok(TabletSnapshot {
            map,
            assigning,
            revision,
        })
    }

    /// The tablets of `table` in `cluster` at `revision`; None while they are still being
    /// written (its assignment marker is there).
    pub async fn table_tablets_at(
        &self,
        cluster: &str,
        table: &str,
        revision: i64,
    ) -> Result<Option<Vec<Tablet>>> {
        let prefix = self.keys.table_tablets(cluster, table);
        let (kvs, _) = self.get_prefix_paged(&prefix, PAGE_KEYS, revision).await?;
        let (tablets, assigning) = self.decode_tablets(&kvs)?;
        Ok(assigning.is_empty().then_some(tablets))
    }

    /// Tablet records as tablets, leaving out the tables still being written
    /// ([`Meta::assign_table`] in batches: not in the map until the last batch, so that no
    /// reader sees a table half covered), and those tables.
    fn decode_tablets(&self, kvs: &[KeyValue]) -> Result<(Vec<Tablet>, BTreeSet<String>)> {
        let mut tablets = Vec::with_capacity(kvs.len());
        let mut assigning = BTreeSet::new();
        for kv in kvs {
            let key = kv
                .key_str()
                .map_err(|e| Error::Internal(format!("tablet key: {e}")))?;
            if let Some(table) = self.keys.assigning_table(key) {
                assigning.insert(table.to_string());
                continue;
            }
            tablets.push(decode_tablet(&self.keys, key, kv.value())?.1);
        }
        if !assigning.is_empty() {
            tablets.retain(|t| !assigning.contains(&t.table));
        }
        Ok((tablets, assigning))
    }

    /// Records the tablets of a new table in `cluster`, if `term` still leads and the table
    /// (`schema_create_revision`) still exists and has no tablets there yet. False if any of
    /// that no longer holds.
    ///
    /// Up to [`ASSIGN_BATCH`] tablets go in one transaction. More (a table created with many
    /// initial splits, or restored from a backup of many tablets) exceed what etcd takes in
    /// one (`--max-txn-ops`, 128 by default), so they are written in batches under the
    /// table's assignment marker ([`Keys::tablets_assigning`]), which the last batch removes:
    /// until then readers of the map do not see the table's tablets. A batch refused (the
    /// term ended, the table was deleted) leaves the marker and the batches before it; the
    /// next assignment of the table (by this leader or the next) removes them first.
    pub async fn assign_table(
        &self,
        term: &Term,
        cluster: &str,
        table: &str,
        schema_create_revision: i64,
        tablets: &[Tablet],
    ) -> Result<bool> {
        let puts = |batch: &[Tablet]| -> Vec<TxnOp> {
            batch
                .iter()
                .map(|t| {
                    let (key, value) = encode_tablet(&self.keys, cluster, t);
                    TxnOp::put(key, value, None)
                })
                .collect()
        };
        let schema = || {
            Compare::create_revision(
                self.keys.schema(table),
                CompareOp::Equal,
                schema_create_revision,
            )
        };
        let prefix = self.keys.table_tablets(cluster, table);
        let marker = self.keys.tablets_assigning(cluster, table);
        let nothing_there = || {
            Compare::version(prefix.as_str(), CompareOp::Equal, 0).with_range(prefix_end(&prefix))
        };
        if tablets.len() <= ASSIGN_BATCH {
            return self
                .fenced(term, [schema(), nothing_there()], puts(tablets))
                .await;
        }
        // An assignment left half written (its marker still there): removed.
        self.fenced(
            term,
            [
                schema(),
                Compare::version(marker.as_str(), CompareOp::Greater, 0),
            ],
            [TxnOp::delete(
                prefix.as_str(),
                Some(etcd_client::DeleteOptions::new().with_prefix()),
            )],
        )
        .await?;
        let batches: Vec<&[Tablet]> = tablets.chunks(ASSIGN_BATCH).collect();
        for (i, batch) in batches.iter().enumerate() {
            let mut ops = puts(batch);
            let when = if i == 0 {
                ops.push(TxnOp::put(marker.as_str(), term.revision.to_string(), None));
                [schema(), nothing_there()]
            } else {
                [
                    schema(),
                    Compare::version(marker.as_str(), CompareOp::Greater, 0),
                ]
            };
            if i == batches.len() - 1 {
                ops.push(TxnOp::delete(marker.as_str(), None));
            }
            if !self.fenced(term, when, ops).await? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Replaces tablet `old` by `new` (same range) in `cluster`, if `term` still leads and
    /// the record is still exactly `old` (its owner, epoch and state). False otherwise.
    pub async fn change_tablet(
        &self,
        term: &Term,
        cluster: &str,
        old: &Tablet,
        new: &Tablet,
    ) -> Result<bool> {
        let (key, old_value) = encode_tablet(&self.keys, cluster, old);
        let (new_key, new_value) = encode_tablet(&self.keys, cluster, new);
        if key != new_key {
            return Err(Error::Internal(format!(
                "change_tablet: {old} and {new} are not the same tablet"
            )));
        }
        self.fenced(
            term,
            [Compare::value(key.as_str(), CompareOp::Equal, old_value)],
            [TxnOp::put(key.as_str(), new_value, None)],
        )
        .await
    }

    // --- moves and splits ----------------------------------------------------------------

    /// The moves in progress in `cluster`.
    pub async fn moves(&self, cluster: &str) -> Result<Vec<MoveRecord>> {
        let (kvs, _) = self.get_prefix(&self.keys.moves(cluster)).await?;
        kvs.iter()
            .map(|kv| decode(kv.key_str().unwrap_or("?"), kv.value()))
            .collect()
    }

    /// Records a new move of `tablet` (phase Copying), if `term` still leads, the tablet's
    /// record is still exactly `tablet` and no move of that id exists. False otherwise.
    pub async fn begin_move(
        &self,
        term: &Term,
        cluster: &str,
        tablet: &Tablet,
        record: &MoveRecord,
    ) -> Result<bool> {
        let (key, value) = encode_tablet(&self.keys, cluster, tablet);
        let move_key = self.keys.move_record(cluster, &record.id);
        self.fenced(
            term,
            [
                Compare::value(key.as_str(), CompareOp::Equal, value),
                Compare::create_revision(move_key.as_str(), CompareOp::Equal, 0),
            ],
            [TxnOp::put(move_key.as_str(), record.encode(), None)],
        )
        .await
    }

    /// Fences the tablet of a move: the tablet's state becomes Fencing and the move's phase
    /// Fencing, if `term` leads and both records are exactly `tablet` and `record`.
    pub async fn fence_move(
        &self,
        term: &Term,
        cluster: &str,
        tablet: &Tablet,
        record: &MoveRecord,
    ) -> Result<bool> {
        let (key, value) = encode_tablet(&self.keys, cluster, tablet);
        let fenced = Tablet {
            state: TabletState::Fencing,
            ..tablet.clone()
        };
        let (_, fenced_value) = encode_tablet(&self.keys, cluster, &fenced);
        let move_key = self.keys.move_record(cluster, &record.id);
        let next = MoveRecord {
            phase: MovePhase::Fencing,
            ..record.clone()
        };
        self.fenced(
            term,
            [
                Compare::value(key.as_str(), CompareOp::Equal, value),
                Compare::value(move_key.as_str(), CompareOp::Equal, record.encode()),
            ],
            [
                TxnOp::put(key.as_str(), fenced_value, None),
                TxnOp::put(move_key.as_str(), next.encode(), None),
            ],
        )
        .await
    }

    /// Commits a move: the fenced tablet `fenced` becomes `moved` (the destination, epoch + 1,
    /// Serving) and the move record goes, if `term` leads and both records are exactly as
    /// given. False otherwise (nothing written; an abort won).
    pub async fn commit_move(
        &self,
        term: &Term,
        cluster: &str,
        fenced: &Tablet,
        record: &MoveRecord,
        moved: &Tablet,
    ) -> Result<bool> {
        let (key, value) = encode_tablet(&self.keys, cluster, fenced);
        let (_, moved_value) = encode_tablet(&self.keys, cluster, moved);
        let move_key = self.keys.move_record(cluster, &record.id);
        self.fenced(
            term,
            [
                Compare::value(key.as_str(), CompareOp::Equal, value),
                Compare::value(move_key.as_str(), CompareOp::Equal, record.encode()),
            ],
            [
                TxnOp::put(key.as_str(), moved_value, None),
                TxnOp::delete(move_key.as_str(), None),
            ],
        )
        .await
    }

    /// Aborts a move: deletes its record and, when the tablet was fenced for it (its record
    /// is exactly `fenced`), puts it back to Serving at its owner — if `term` leads and the
    /// move record is exactly `record`. False otherwise (the move committed, or is gone).
    pub async fn abort_move(
        &self,
        term: &Term,
        cluster: &str,
        record: &MoveRecord,
        fenced: Option<&Tablet>,
    ) -> Result<bool> {
        let move_key = self.keys.move_record(cluster, &record.id);
        let mut when = vec![Compare::value(
            move_key.as_str(),
            CompareOp::Equal,
            record.encode(),
        )];
        let mut then = vec![TxnOp::delete(move_key.as_str(), None)];
        if let Some(fenced) = fenced {
            let (key, value) = encode_tablet(&self.keys, cluster, fenced);
            let serving = Tablet {
                state: TabletState::Serving,
                ..fenced.clone()
            };
            when.push(Compare::value(key.as_str(), CompareOp::Equal, value));
            then.push(TxnOp::put(
                key.as_str(),
                encode_tablet(&self.keys, cluster, &serving).1,
                None,
            ));
        }
        self.fenced(term, when, then).await
    }

    /// Splits `tablet` into `left` and `right` (same owner, epoch + 1): one transaction, if
    /// `term` leads, the record is exactly `tablet` and no move of it is in progress (its
    /// state is Serving). The left half gets a new key (its end); the right half keeps the
    /// tablet's key.
    pub async fn split_tablet(
        &self,
        term: &Term,
        cluster: &str,
        tablet: &Tablet,
        left: &Tablet,
        right: &Tablet,
    ) -> Result<bool> {
        let (key, value) = encode_tablet(&self.keys, cluster, tablet);
        let (left_key, left_value) = encode_tablet(&self.keys, cluster, left);
        let (right_key, right_value) = encode_tablet(&self.keys, cluster, right);
        if right_key != key || left_key == key {
            return Err(Error::Internal(format!(
                "split_tablet: {left} and {right} do not split {tablet}"
            )));
        }
        self.fenced(
            term,
            [
                Compare::value(key.as_str(), CompareOp::Equal, value),
                Compare::create_revision(left_key.as_str(), CompareOp::Equal, 0),
            ],
            [
                TxnOp::put(left_key.as_str(), left_value, None),
                TxnOp::put(key.as_str(), right_value, None),
            ],
        )
        .await
    }

    /// The number of servers `cluster` should keep, as the operator (or the local runtime)
    /// last recorded it from the Cluster's spec; None when never recorded.
    pub async fn serve_nodes(&self, cluster: &str) -> Result<Option<u32>> {
        let resp = self
            .client
            .clone()
            .get(self.keys.serve_nodes(cluster), None)
            .await
            .map_err(unavailable)?;
        Ok(resp
            .kvs()
            .first()
            .and_then(|kv| std::str::from_utf8(kv.value()).ok()?.trim().parse().ok()))
    }

    /// Records the number of servers `cluster` should keep (the Cluster's serveNodes).
    pub async fn set_serve_nodes(&self, cluster: &str, serve_nodes: u32) -> Result<()> {
        self.client
            .clone()
            .put(
                self.keys.serve_nodes(cluster),
                serve_nodes.to_string(),
                None,
            )
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    /// A single JSON record at `key` (None: absent).
    async fn record<T: serde::de::DeserializeOwned>(&self, key: String) -> Result<Option<T>> {
        Ok(self.record_at(&key).await?.0)
    }

    /// A single JSON record at `key` and the key's revision (0: absent), for a
    /// compare-and-swap.
    async fn record_at<T: serde::de::DeserializeOwned>(
        &self,
        key: &str,
    ) -> Result<(Option<T>, i64)> {
        let mut resp = self
            .client
            .clone()
            .get(key, None)
            .await
            .map_err(unavailable)?;
        match resp.take_kvs().first() {
            Some(kv) => Ok((
                Some(crate::records::decode(key, kv.value())?),
                kv.mod_revision(),
            )),
            None => Ok((None, 0)),
        }
    }

    /// `cluster`'s autoscaling settings as last recorded (None: a fixed `serveNodes`).
    pub async fn autoscaling(&self, cluster: &str) -> Result<Option<AutoscalingRecord>> {
        self.record(self.keys.autoscaling(cluster)).await
    }

    /// Records `cluster`'s autoscaling settings; None deletes them and the autoscaler's
    /// decision (the cluster's size is `serveNodes` again).
    pub async fn set_autoscaling(
        &self,
        cluster: &str,
        settings: Option<&AutoscalingRecord>,
    ) -> Result<()> {
        let mut client = self.client.clone();
        match settings {
            Some(s) => {
                client
                    .put(self.keys.autoscaling(cluster), s.encode(), None)
                    .await
                    .map_err(unavailable)?;
            }
            None => {
                let ops = [
                    TxnOp::delete(self.keys.autoscaling(cluster), None),
                    TxnOp::delete(self.keys.autoscaler(cluster), None),
                ];
                client
                    .txn(Txn::new().and_then(ops))
                    .await
                    .map_err(unavailable)?;
            }
        }
        Ok(())
    }

    /// The autoscaler's last decision for `cluster` (None: none yet, or no autoscaling).
    pub async fn autoscaler(&self, cluster: &str) -> Result<Option<AutoscalerRecord>> {
        self.record(self.keys.autoscaler(cluster)).await
    }

    /// Records the autoscaler's decision for `cluster`, if `term` still leads and the cluster
    /// still autoscales. False otherwise.
    pub async fn put_autoscaler(
        &self,
        term: &Term,
        cluster: &str,
        decision: &AutoscalerRecord,
    ) -> Result<bool> {
        let settings = self.keys.autoscaling(cluster);
        self.fenced(
            term,
            [Compare::create_revision(
                settings.as_str(),
                CompareOp::Greater,
                0,
            )],
            [TxnOp::put(
                self.keys.autoscaler(cluster).as_str(),
                decision.encode(),
                None,
            )],
        )
        .await
    }

    // --- accepted losses ---------------------------------------------------------------

    /// An administrator accepts that the data of server `store_id` of `cluster` is lost: once
    /// the server has been gone past its serving deadline, the master gives its tablets, empty,
    /// to live servers (at the next epoch) and deletes this key.
    pub async fn accept_loss(&self, cluster: &str, store_id: &str) -> Result<()> {
        self.client
            .clone()
            .put(self.keys.accept_loss(cluster, store_id), "{}", None)
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    /// The store ids whose loss was accepted in `cluster` and not yet carried out.
    pub async fn accepted_losses(&self, cluster: &str) -> Result<Vec<ServerId>> {
        let prefix = self.keys.accepted_losses(cluster);
        let (kvs, _) = self.get_prefix(&prefix).await?;
        Ok(kvs
            .iter()
            .filter_map(|kv| {
                let store = kv.key_str().ok()?.strip_prefix(&prefix)?;
                (!store.is_empty()).then(|| store.to_string())
            })
            .collect())
    }

    /// Deletes an accepted loss once carried out, if `term` still leads. False otherwise.
    pub async fn clear_accepted_loss(
        &self,
        term: &Term,
        cluster: &str,
        store_id: &str,
    ) -> Result<bool> {
        self.fenced(
            term,
            [],
            [TxnOp::delete(
                self.keys.accept_loss(cluster, store_id),
                None,
            )],
        )
        .await
    }

    /// Watches every key under `prefix` from `revision` on (the revision after a read).
    pub async fn watch(&self, prefix: &str, revision: i64) -> Result<WatchStream> {
        self.client
            .clone()
            .watch(
                prefix,
                Some(
                    WatchOptions::new()
                        .with_prefix()
                        .with_start_revision(revision),
                ),
            )
            .await
            .map_err(unavailable)
    }
}

impl Meta {
    /// The value at `key` (None: absent).
    pub async fn value(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let mut resp = self
            .client
            .clone()
            .get(key, None)
            .await
            .map_err(unavailable)?;
        Ok(resp.take_kvs().first().map(|kv| kv.value().to_vec()))
    }

    /// Every key under `prefix` with its value, in key order.
    pub async fn values_under(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        let (kvs, _) = self.get_prefix(prefix).await?;
        Ok(kvs
            .into_iter()
            .map(|kv| {
                (
                    String::from_utf8_lossy(kv.key()).into_owned(),
                    kv.value().to_vec(),
                )
            })
            .collect())
    }
}

fn stored_schema(kv: &KeyValue) -> Result<StoredSchema> {
    let key = kv.key_str().unwrap_or("<schema>");
    Ok(StoredSchema {
        schema: decode(key, kv.value())?,
        mod_revision: kv.mod_revision(),
        create_revision: kv.create_revision(),
    })
}

/// An app profile id names one key: not empty, no `/` (the operator's validation allows
/// `[_a-zA-Z0-9][-_.a-zA-Z0-9]*`).
fn check_app_profile_id(id: &str) -> Result<()> {
    if id.is_empty() || id.contains('/') {
        return Err(Error::InvalidArgument(format!(
            "app profile id {id:?}: must be non-empty and without '/'"
        )));
    }
    Ok(())
}

/// The table id of a table resource name (its last segment).
pub fn table_id(name: &str) -> &str {
    name.rsplit('/').next().unwrap_or(name)
}

fn already_exists(name: &str) -> Error {
    Error::AlreadyExists(format!("table {name} already exists"))
}

fn not_found(table: &str) -> Error {
    Error::NotFound(format!("table {table} not found"))
}

#[cfg(test)]
mod tests {
    use basalt_test_etcd::Etcd;

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_read_in_pages_returns_every_key_under_the_prefix() {
        let etcd = Etcd::start().await;
        let eps = endpoints(&[etcd.url()], &Security::Plaintext).unwrap();
        let meta = Meta::connect(&eps, Keys::new("default", "pages"))
            .await
            .unwrap();
        let mut client = meta.client();
        for i in 0..25 {
            client.put(format!("/p/k{i:02}"), "v", None).await.unwrap();
        }
        client.put("/o", "outside", None).await.unwrap();
        client.put("/q", "outside", None).await.unwrap();
        let (kvs, revision) = meta.get_prefix_paged("/p/", 7, 0).await.unwrap();
        let keys: Vec<&str> = kvs.iter().map(|kv| kv.key_str().unwrap()).collect();
        let expected: Vec<String> = (0..25).map(|i| format!("/p/k{i:02}")).collect();
        assert_eq!(keys, expected);
        assert!(revision > 0);
        // Exactly a page's worth, and fewer than a page.
        assert_eq!(
            meta.get_prefix_paged("/p/", 25, 0).await.unwrap().0.len(),
            25
        );
        assert_eq!(
            meta.get_prefix_paged("/p/k0", 4, 0).await.unwrap().0.len(),
            10
        );
        assert!(
            meta.get_prefix_paged("/none/", 7, 0)
                .await
                .unwrap()
                .0
                .is_empty()
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hold_is_exclusive_both_ways_and_goes_with_its_lease() {
        let etcd = Etcd::start().await;
        let eps = endpoints(&[etcd.url()], &Security::Plaintext).unwrap();
        let meta = Meta::connect(&eps, Keys::new("default", "holds"))
            .await
            .unwrap();
        let ttl = Duration::from_secs(2);
        let (collecting, in_flight) = ("/l/collecting".to_string(), "/l/in-flight/".to_string());
        let put = |k: &str| vec![(k.to_string(), b"{}".to_vec())];
        // An operation in flight: the collection cannot start.
        let op = meta
            .hold(
                &put("/l/in-flight/a"),
                std::slice::from_ref(&collecting),
                &[],
                ttl,
            )
            .await
            .unwrap()
            .unwrap();
        assert!(op.holds(Duration::ZERO));
        let blocked = meta
            .hold(
                &put(&collecting),
                std::slice::from_ref(&collecting),
                std::slice::from_ref(&in_flight),
                ttl,
            )
            .await
            .unwrap();
        assert_eq!(blocked.err().as_deref(), Some("/l/in-flight/a"));
        // The same key twice: the second is refused.
        let again = meta
            .hold(&put("/l/in-flight/a"), &["/l/in-flight/a".into()], &[], ttl)
            .await
            .unwrap();
        assert_eq!(again.err().as_deref(), Some("/l/in-flight/a"));
        // Kept alive past its TTL while held, gone once released.
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(meta.value("/l/in-flight/a").await.unwrap().is_some());
        op.release().await;
        assert!(meta.value("/l/in-flight/a").await.unwrap().is_none());
        // Now the collection starts, and operations wait for it.
        let gc = meta
            .hold(
                &put(&collecting),
                std::slice::from_ref(&collecting),
                std::slice::from_ref(&in_flight),
                ttl,
            )
            .await
            .unwrap()
            .unwrap();
        let refused = meta
            .hold(
                &put("/l/in-flight/b"),
                std::slice::from_ref(&collecting),
                &[],
                ttl,
            )
            .await
            .unwrap();
        assert_eq!(refused.err().as_deref(), Some(collecting.as_str()));
        assert!(meta.values_under(&in_flight).await.unwrap().is_empty());
        // Dropped without release (a dead process): gone within the TTL.
        drop(gc);
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(meta.value(&collecting).await.unwrap().is_none());
        meta.put_expiring("/l/finished", b"done".to_vec(), ttl)
            .await
            .unwrap();
        assert_eq!(meta.value("/l/finished").await.unwrap().unwrap(), b"done");
    }
}
