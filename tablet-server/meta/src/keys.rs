//! The key layout of one instance in etcd (pure: encode and decode, no I/O).
//!
//! ```text
//! /basalt/v1/<namespace>/<instance>/
//!   master                                  the master's election (leader key's create revision = term)
//!   next-table-id                           the next internal table id (u64, decimal)
//!   schema/<table>                          a table's schema (JSON TableSchema)
//!   app-profiles/<id>                       an app profile
//!   clusters/<c>/servers/<store-id>         a tablet server's registration, bound to its lease
//!   clusters/<c>/tablets/<table>/<end>      one tablet: {start, owner, epoch, state}
//!   clusters/<c>/accept-loss/<store-id>     an administrator accepts that a lost server's data is gone
//!   backups/creating/<c>/<backup-id>        a backup being created, bound to its coordinator's lease
//!   backups/copying/<c>/<backup-id>         a backup being copied (CopyBackup), likewise
//!   backups/restoring/<table>               a table being restored from a backup, likewise
//!   backups/finished/<operation>            a finished backup operation (its google.longrunning
//!                                           Operation), bound to a lease of an hour
//!
//! /basalt/backup-locations/<location>/     one backup location, whichever instances share it
//!   collecting                              the one collection of unheld chunks, leased
//!   in-flight/<namespace>/<instance>/<kind>/<id>   a backup, copy or restore in flight, leased
//! ```
//!
//! A backup location's chunks are shared by every backup in it, of any instance, so the
//! collection of unheld chunks and the operations that rely on chunks being there are
//! coordinated per location (`<location>`: a digest of its URL), not per instance.
//!
//! A tablet's key ends with its *end* row key, like Bigtable's METADATA rows, so the tablet
//! holding row `r` is the first key after `r` in that table's range. Row keys are arbitrary
//! bytes: `<end>` is their lowercase hex (which sorts exactly like the bytes), and the last
//! tablet of a table (no end) is `~`, which sorts after every hex digit.

use basalt_model::{Error, Result};
use bytes::Bytes;

/// The key of a table's last tablet (the one without an end key).
const LAST: &str = "~";
/// The last segment of the marker of a table whose tablets are being written in several
/// transactions ([`Keys::tablets_assigning`]); never a tablet's end (those are hex or `~`).
const ASSIGNING: &str = "assigning";

/// The keys of one instance: every key is under `/basalt/v1/<namespace>/<instance>/`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Keys {
    prefix: String,
    namespace: String,
    instance: String,
}

impl Keys {
    pub fn new(namespace: &str, instance: &str) -> Keys {
        Keys {
            prefix: format!("/basalt/v1/{namespace}/{instance}/"),
            namespace: namespace.into(),
            instance: instance.into(),
        }
    }

    /// The Instance's namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The Instance's name.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// The instance's prefix (ends with `/`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The name of the master's election.
    pub fn master(&self) -> String {
        format!("{}master", self.prefix)
    }

    pub fn next_table_id(&self) -> String {
        format!("{}next-table-id", self.prefix)
    }

    /// Prefix of every table's schema.
    pub fn schemas(&self) -> String {
        format!("{}schema/", self.prefix)
    }

    /// `table` is the table id (the last segment of its resource name).
    pub fn schema(&self, table: &str) -> String {
        format!("{}{table}", self.schemas())
    }

    /// The table id of a schema key.
    pub fn schema_table<'a>(&self, key: &'a str) -> Option<&'a str> {
        key.strip_prefix(&self.schemas())
    }

    /// The IAM policy of the instance (`table` None) or of one of its tables.
    pub fn iam_policy(&self, table: Option<&str>) -> String {
        match table {
            None => format!("{}iam/instance", self.prefix),
            Some(table) => format!("{}iam/tables/{table}", self.prefix),
        }
    }

    pub fn app_profiles(&self) -> String {
        format!("{}app-profiles/", self.prefix)
    }

    pub fn app_profile(&self, id: &str) -> String {
        format!("{}{id}", self.app_profiles())
    }

    /// Prefix of every cluster's keys.
    pub fn clusters(&self) -> String {
        format!("{}clusters/", self.prefix)
    }

    pub fn servers(&self, cluster: &str) -> String {
        format!("{}{cluster}/servers/", self.clusters())
    }

    pub fn server(&self, cluster: &str, store_id: &str) -> String {
        format!("{}{store_id}", self.servers(cluster))
    }

    /// The cluster and store id of a registration key.
    pub fn parse_server<'a>(&self, key: &'a str) -> Option<(&'a str, &'a str)> {
        let rest = key.strip_prefix(&self.clusters())?;
        let (cluster, rest) = rest.split_once('/')?;
        let store = rest.strip_prefix("servers/")?;
        (!store.is_empty() && !store.contains('/')).then_some((cluster, store))
    }

    /// Prefix of the accepted losses of a cluster.
    pub fn accepted_losses(&self, cluster: &str) -> String {
        format!("{}{cluster}/accept-loss/", self.clusters())
    }

    /// The key by which an administrator accepts that the data of server `store_id` is lost:
    /// the master then gives its Lost tablets, empty, to live servers.
    pub fn accept_loss(&self, cluster: &str, store_id: &str) -> String {
        format!("{}{store_id}", self.accepted_losses(cluster))
    }

    /// Prefix of the tablet moves in progress in a cluster.
    pub fn moves(&self, cluster: &str) -> String {
        format!("{}{cluster}/moves/", self.clusters())
    }

    /// The record of move `id` (phase, source, destination) while it is in progress.
    pub fn move_record(&self, cluster: &str, id: &str) -> String {
        format!("{}{id}", self.moves(cluster))
    }

    /// The scale-in intent of a cluster: how many servers it should keep (the highest
    /// ordinals above drain, then stop).
    pub fn serve_nodes(&self, cluster: &str) -> String {
        format!("{}{cluster}/serve-nodes", self.clusters())
    }

    /// A cluster's autoscaling settings (see [`crate::AutoscalingRecord`]).
    pub fn autoscaling(&self, cluster: &str) -> String {
        format!("{}{cluster}/autoscaling", self.clusters())
    }

    /// The autoscaler's decision for a cluster (see [`crate::AutoscalerRecord`]).
    pub fn autoscaler(&self, cluster: &str) -> String {
        format!("{}{cluster}/autoscaler", self.clusters())
    }

    /// Prefix of every tablet of a cluster.
    pub fn tablets(&self, cluster: &str) -> String {
        format!("{}{cluster}/tablets/", self.clusters())
    }

    /// Prefix of the tablets of one table in one cluster.
    pub fn table_tablets(&self, cluster: &str, table: &str) -> String {
        format!("{}{table}/", self.tablets(cluster))
    }

    /// The marker of a table of `cluster` whose tablets are still being written: a new table
    /// of more tablets than one etcd transaction takes (`--max-txn-ops`) is written in
    /// batches, the marker first and removed with the last batch. Readers of the map skip a
    /// table that has it; it lives under the table's prefix, so that a read of the map sees
    /// it at the same revision as the tablets, and deleting the table deletes it.
    pub fn tablets_assigning(&self, cluster: &str, table: &str) -> String {
        format!("{}{ASSIGNING}", self.table_tablets(cluster, table))
    }

    /// The table whose assignment marker `key` is (None: not a marker).
    pub fn assigning_table<'k>(&self, key: &'k str) -> Option<&'k str> {
        let rest = key.strip_prefix(&self.clusters())?;
        let (_, rest) = rest.split_once('/')?;
        let rest = rest.strip_prefix("tablets/")?;
        let (table, last) = rest.split_once('/')?;
        (last == ASSIGNING).then_some(table)
    }

    /// The key of the tablet of `table` ending at `end` (None: the table's last tablet).
    pub fn tablet(&self, cluster: &str, table: &str, end: Option<&[u8]>) -> String {
        let end = match end {
            Some(end) => hex(end),
            None => LAST.to_string(),
        };
        format!("{}{end}", self.table_tablets(cluster, table))
    }

    /// Prefix of the backups being created in `cluster` (every cluster: `None`).
    pub fn backups_creating(&self, cluster: Option<&str>) -> String {
        match cluster {
            Some(c) => format!("{}backups/creating/{c}/", self.prefix),
            None => format!("{}backups/creating/", self.prefix),
        }
    }

    /// The record of backup `id` of `cluster` while it is being created.
    pub fn backup_creating(&self, cluster: &str, id: &str) -> String {
        format!("{}{id}", self.backups_creating(Some(cluster)))
    }

    /// The record of backup `id` of `cluster` while it is being copied (CopyBackup).
    pub fn backup_copying(&self, cluster: &str, id: &str) -> String {
        format!("{}backups/copying/{cluster}/{id}", self.prefix)
    }

    /// The record of table `table` (its id) while it is being restored from a backup.
    pub fn backup_restoring(&self, table: &str) -> String {
        format!("{}backups/restoring/{table}", self.prefix)
    }

    /// A finished backup operation, by its name (`operations/...`).
    pub fn backup_operation(&self, operation: &str) -> String {
        let name = operation.strip_prefix("operations/").unwrap_or(operation);
        format!("{}backups/finished/{name}", self.prefix)
    }

    /// The cluster, table and end key of a tablet key.
    pub fn parse_tablet(&self, key: &str) -> Result<(String, String, Option<Bytes>)> {
        let bad = || Error::Internal(format!("not a tablet key of {}: {key:?}", self.prefix));
        let rest = key.strip_prefix(&self.clusters()).ok_or_else(bad)?;
        let (cluster, rest) = rest.split_once('/').ok_or_else(bad)?;
        let rest = rest.strip_prefix("tablets/").ok_or_else(bad)?;
        let (table, end) = rest.split_once('/').ok_or_else(bad)?;
        let end = if end == LAST {
            None
        } else {
            Some(Bytes::from(unhex(end).ok_or_else(bad)?))
        };
        Ok((cluster.to_string(), table.to_string(), end))
    }
}

/// The keys of one backup location (an `s3://` or `file://` URL), shared by every instance of
/// the etcd cluster whose servers keep backups there: who collects its unheld chunks, and
/// which backups, copies and restores that rely on its chunks are in flight.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackupLocationKeys {
    prefix: String,
}

impl BackupLocationKeys {
    /// `location`: an identifier of the location safe in a key (no `/`), e.g. a digest of its
    /// URL.
    pub fn new(location: &str) -> BackupLocationKeys {
        BackupLocationKeys {
            prefix: format!("/basalt/backup-locations/{location}/"),
        }
    }

    /// The collection of the location's unheld chunks in progress (one at a time).
    pub fn collecting(&self) -> String {
        format!("{}collecting", self.prefix)
    }

    /// Prefix of the operations in flight that rely on the location's chunks.
    pub fn in_flight(&self) -> String {
        format!("{}in-flight/", self.prefix)
    }

    /// One operation in flight: `kind` (`creating`, `copying`, `restoring`) and `id` (the
    /// backup's cluster and id, or the table) of instance `keys`.
    pub fn in_flight_of(&self, keys: &Keys, kind: &str, id: &str) -> String {
        format!(
            "{}{}/{}/{kind}/{id}",
            self.in_flight(),
            keys.namespace(),
            keys.instance()
        )
    }
}

/// Lowercase hex: sorts exactly like the bytes it encodes.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

/// The bytes of [`hex`] text (None if it is not).
pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    s.as_bytes()
        .chunks(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

/// The smallest key greater than every key starting with `prefix` (etcd's range end of a
/// prefix).
pub fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_sorts_like_the_bytes_and_round_trips() {
        let keys: Vec<&[u8]> = vec![
            b"",
            b"\x00",
            b"\x00\xff",
            b"a",
            b"a\x00",
            b"ab",
            b"b",
            b"\xff",
        ];
        for w in keys.windows(2) {
            assert!(hex(w[0]) < hex(w[1]), "{:?} {:?}", w[0], w[1]);
        }
        for k in &keys {
            assert_eq!(unhex(&hex(k)).unwrap(), k.to_vec());
            assert!(hex(k).as_str() < LAST);
        }
        assert_eq!(unhex("0"), None);
        assert_eq!(unhex("zz"), None);
        assert_eq!(unhex("AB"), None);
    }

    #[test]
    fn tablet_keys_encode_and_decode() {
        let k = Keys::new("ns", "inst");
        assert_eq!(k.prefix(), "/basalt/v1/ns/inst/");
        let key = k.tablet("c1", "orders", Some(b"g\x00"));
        assert_eq!(key, "/basalt/v1/ns/inst/clusters/c1/tablets/orders/6700");
        assert_eq!(
            k.parse_tablet(&key).unwrap(),
            (
                "c1".into(),
                "orders".into(),
                Some(Bytes::from_static(b"g\x00"))
            )
        );
        let last = k.tablet("c1", "orders", None);
        assert_eq!(last, "/basalt/v1/ns/inst/clusters/c1/tablets/orders/~");
        assert_eq!(k.parse_tablet(&last).unwrap().2, None);
        assert!(key.starts_with(&k.table_tablets("c1", "orders")));
        assert!(key.starts_with(&k.tablets("c1")));
        // The tablets of a table sort by end key, the last one last.
        let mut ks = [
            last.clone(),
            k.tablet("c1", "orders", Some(b"p")),
            key.clone(),
        ];
        ks.sort();
        assert_eq!(ks.last(), Some(&last));
        assert!(
            k.parse_tablet("/basalt/v1/ns/inst/clusters/c1/servers/x")
                .is_err()
        );
        assert!(
            k.parse_tablet("/basalt/v1/ns/other/clusters/c1/tablets/t/~")
                .is_err()
        );
        assert!(
            k.parse_tablet(&format!("{}zz", k.table_tablets("c1", "t")))
                .is_err()
        );
    }

    #[test]
    fn server_and_schema_keys() {
        let k = Keys::new("default", "quickstart");
        let s = k.server("c1", "st-1");
        assert_eq!(s, "/basalt/v1/default/quickstart/clusters/c1/servers/st-1");
        assert_eq!(k.parse_server(&s), Some(("c1", "st-1")));
        assert_eq!(k.parse_server(&k.tablet("c1", "t", None)), None);
        let accept = k.accept_loss("c1", "st-1");
        assert_eq!(
            accept,
            "/basalt/v1/default/quickstart/clusters/c1/accept-loss/st-1"
        );
        assert!(accept.starts_with(&k.accepted_losses("c1")));
        assert_eq!(k.parse_server(&accept), None);
        assert_eq!(k.schema_table(&k.schema("orders")), Some("orders"));
        assert_eq!(k.master(), "/basalt/v1/default/quickstart/master");
        assert_eq!(prefix_end("/a/"), b"/a0".to_vec());
        assert_eq!(prefix_end(""), vec![0]);
    }

    #[test]
    fn backup_keys() {
        let k = Keys::new("default", "quickstart");
        let creating = k.backup_creating("c1", "monday");
        assert_eq!(
            creating,
            "/basalt/v1/default/quickstart/backups/creating/c1/monday"
        );
        assert!(creating.starts_with(&k.backups_creating(Some("c1"))));
        assert!(creating.starts_with(&k.backups_creating(None)));
        // A cluster whose name extends another's is not under it.
        assert!(
            !k.backup_creating("c10", "x")
                .starts_with(&k.backups_creating(Some("c1")))
        );
        assert_eq!(
            k.backup_operation("operations/projects/p/instances/i/tables/t/operations/restore-7"),
            "/basalt/v1/default/quickstart/backups/finished/projects/p/instances/i/tables/t/operations/restore-7"
        );
        assert_eq!(
            k.backup_restoring("orders"),
            "/basalt/v1/default/quickstart/backups/restoring/orders"
        );
        let loc = BackupLocationKeys::new("ab12");
        assert_eq!(loc.collecting(), "/basalt/backup-locations/ab12/collecting");
        let held = loc.in_flight_of(&k, "creating", "c1/monday");
        assert_eq!(
            held,
            "/basalt/backup-locations/ab12/in-flight/default/quickstart/creating/c1/monday"
        );
        assert!(held.starts_with(&loc.in_flight()));
        // The collection's own key is not an operation in flight.
        assert!(!loc.collecting().starts_with(&loc.in_flight()));
    }
}
