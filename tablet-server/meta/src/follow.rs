//! A cluster's tablet map kept up to date from etcd's watch events, instead of read again
//! after each change.
//!
//! Each server follows its instance's prefix with one watch. A full read of a cluster's map
//! costs in proportion to its tablets (5 s and 222 MB for a million, docs/scale.md); a change
//! — a move, a split, a merge — touches one to three tablet records. [`TabletFollower`]
//! starts from a [`TabletSnapshot`] and applies each watch response's tablet records in
//! place ([`TabletMap::apply`]), and says what else the response changed (schemas,
//! registrations, moves), so that its owner reads only those again.
//!
//! etcd sends all of a transaction's events in one response, so the map holds after each
//! response. A table whose tablets are written in batches ([`Meta::assign_table`]) stays out
//! of the map until its assignment marker goes; then it is read whole
//! ([`Meta::table_tablets_at`]). Changes that do not fit the map (a watch resumed in the
//! wrong place, a bug) are refused: read everything again. Events at or before the revision the
//! follower is at are skipped, so a watch may start before the snapshot is read.
//!
//! [`Meta::assign_table`]: crate::Meta::assign_table
//! [`Meta::table_tablets_at`]: crate::Meta::table_tablets_at

use std::collections::{BTreeMap, BTreeSet};

use basalt_model::{Error, Result, Tablet, TabletMap};
use bytes::Bytes;
use etcd_client::{Event, EventType};

/// One event of a watch ([`crate::Meta::watch`]).
pub type WatchEvent = Event;

/// What the stream of a watch gives next ([`crate::Meta::watch`]: `WatchStream::message`).
pub type WatchMessage = std::result::Result<Option<etcd_client::WatchResponse>, etcd_client::Error>;

use crate::client::{Meta, TabletSnapshot};
use crate::keys::Keys;
use crate::records::decode_tablet;

/// One cluster's tablet map, following the watch of its instance's prefix.
#[derive(Clone, Debug)]
pub struct TabletFollower {
    keys: Keys,
    cluster: String,
    map: TabletMap,
    /// Tables whose tablets are still being written: out of the map until the marker goes.
    assigning: BTreeSet<String>,
    revision: i64,
}

/// What one watch response changed besides the map.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Followed {
    /// Tables whose tablets changed in the map (applied already).
    pub tables: BTreeSet<String>,
    /// Tables whose assignment ended or that were deleted mid-assignment: read them whole
    /// at [`Followed::revision`] ([`crate::Meta::table_tablets_at`]) and give them to
    /// [`TabletFollower::install`].
    pub to_read: BTreeSet<String>,
    /// A table schema changed (the catalog).
    pub schemas: bool,
    /// A registration of the cluster's servers changed.
    pub servers: bool,
    /// A move record of the cluster changed.
    pub moves: bool,
    /// The newest revision among the events (0: none).
    pub revision: i64,
}

impl TabletFollower {
    pub fn new(keys: Keys, cluster: &str, snapshot: TabletSnapshot) -> TabletFollower {
        TabletFollower {
            keys,
            cluster: cluster.to_string(),
            map: snapshot.map,
            assigning: snapshot.assigning,
            revision: snapshot.revision,
        }
    }

    pub fn map(&self) -> &TabletMap {
        &self.map
    }

    /// The revision the map is at: the snapshot's, then the newest event applied.
    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// Applies one watch response's events (every event of a transaction is in the same
    /// response) and says what else they changed. An error: they do not fit the map; the
    /// follower is out of step (some tables may have changed, others not): read everything
    /// again and start a new one.
    pub fn apply(&mut self, events: &[Event]) -> Result<Followed> {
        let mut followed = Followed::default();
        let tablets_prefix = self.keys.tablets(&self.cluster);
        let servers_prefix = self.keys.servers(&self.cluster);
        let moves_prefix = self.keys.moves(&self.cluster);
        let schemas_prefix = self.keys.schemas();
        type Change = (Option<Bytes>, Option<Tablet>);
        let mut changes: BTreeMap<String, Vec<Change>> = BTreeMap::new();
        for event in events {
            let Some(kv) = event.kv() else { continue };
            if kv.mod_revision() <= self.revision {
                continue; // in the snapshot already (a watch started before it was read)
            }
            followed.revision = followed.revision.max(kv.mod_revision());
            let key = kv
                .key_str()
                .map_err(|e| Error::Internal(format!("watched key: {e}")))?;
            let put = event.event_type() == EventType::Put;
            if key.starts_with(&tablets_prefix) {
                if let Some(table) = self.keys.assigning_table(key) {
                    if put {
                        self.assigning.insert(table.to_string());
                    } else {
                        self.assigning.remove(table);
                        followed.to_read.insert(table.to_string());
                    }
                    continue;
                }
                let (_, table, end) = self.keys.parse_tablet(key)?;
                let tablet = if put {
                    Some(decode_tablet(&self.keys, key, kv.value())?.1)
                } else {
                    None
                };
                changes.entry(table).or_default().push((end, tablet));
            } else if key.starts_with(&servers_prefix) {
                followed.servers = true;
            } else if key.starts_with(&moves_prefix) {
                followed.moves = true;
            } else if key.starts_with(&schemas_prefix) {
                followed.schemas = true;
            }
        }
        // Tables being written, or to be read whole at the newest revision: their records
        // are not applied one by one.
        changes.retain(|table, _| {
            !self.assigning.contains(table) && !followed.to_read.contains(table)
        });
        for (table, changes) in changes {
            self.map.apply(&table, changes).map_err(|e| {
                Error::Internal(format!(
                    "the tablet map's changes do not fit this server's copy: {e}"
                ))
            })?;
            followed.tables.insert(table);
        }
        self.revision = self.revision.max(followed.revision);
        Ok(followed)
    }

    /// Puts `table` as read whole ([`crate::Meta::table_tablets_at`]): its tablets, or None
    /// while they are still being written (the table stays out of the map).
    pub fn install(&mut self, table: &str, tablets: Option<Vec<Tablet>>) -> Result<()> {
        let broken = |e| Error::Internal(format!("the tablet map in etcd is broken: {e}"));
        let Some(tablets) = tablets else {
            self.assigning.insert(table.to_string());
            return Ok(());
        };
        self.assigning.remove(table);
        self.map.set_table(table, tablets).map_err(broken)
    }

    /// Reads whole, at the response's revision, the tables `followed` says to read
    /// ([`Followed::to_read`]) and installs them.
    pub async fn read_whole(&mut self, meta: &Meta, followed: &Followed) -> Result<()> {
        for table in &followed.to_read {
            let tablets = (meta)
                .table_tablets_at(&self.cluster, table, followed.revision)
                .await?;
            self.install(table, tablets)?;
        }
        Ok(())
    }

    /// A revision newer than every event (a progress notice of the watch: nothing under the
    /// prefix changed up to it).
    pub fn advance(&mut self, revision: i64) {
        self.revision = self.revision.max(revision);
    }
}
