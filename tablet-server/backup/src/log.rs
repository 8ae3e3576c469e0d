//! Point-in-time recovery's change logs: a tablet server with log backup on ships its change
//! log (the writes it logged, in the order of its sequence numbers) to the backup location in
//! segments, so that a restore can replay the writes made after a backup up to the time asked
//! for. Beside the backups' `chunks/` and `backups/`, under the location's prefix:
//!
//! * `logs/<project>/<instance>/<cluster>/<server>/<first_seq:020>-<last_seq:020>-<min_hlc:020>-<max_hlc:020>.seg`:
//!   one [`LogSegment`]. The name tells what the segment holds (its sequence numbers and the
//!   range of its writes' clock values), so that choosing the segments a restore needs, and
//!   deleting the ones no restore can need any more, take a listing and no download. The
//!   numbers are zero-padded to 20 digits (`u64::MAX` has 20) so that names sort as the
//!   numbers do.
//! * `logs/<project>/<instance>/<cluster>/<server>/position.json`: the server's
//!   [`LogPosition`], how far its log is shipped. The segments alone cannot tell it: a server
//!   that took no write for an hour ships nothing for that hour, and a segment being uploaded
//!   is not listed yet. The server writes its position after the segments it counts.
//!
//! The project, instance, cluster and server are directories: cluster and server ids are
//! path-safe names (`[-a-z0-9_.]`), and the project and instance hold no `/`.
//!
//! A segment's bytes: `BSLTLG01`; the project, instance, cluster and server (each a LEB128
//! length and UTF-8); `first_seq`, `last_seq`, `min_hlc`, `max_hlc` (LEB128); the number of
//! tables, then per table its id, its number of rows and its rows (each a LEB128 length and
//! the bytes, as the tablet server encoded it); and last the SHA-256 of everything before
//! it. An object store writes an object whole or not at all, but a segment is named by its
//! numbers and not by its hash (as chunks are): the checksum inside is what tells that its
//! bytes are the ones shipped. A damaged segment is DATA_LOSS, never replayed.

use basalt_model::{Error, Result};
use bytes::Bytes;
use futures::TryStreamExt;
use object_store::PutPayload;
use object_store::path::Path;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::chunk::{get_varint, put_varint, take_bytes};
use crate::store::{BackupStore, storage_error};

/// A segment's format mark; `BSLTLG` then the format's version.
const MAGIC: &[u8; 8] = b"BSLTLG01";
const MAGIC_FAMILY: &[u8; 6] = b"BSLTLG";
const CHECKSUM_BYTES: usize = 32;
const POSITION_FILE: &str = "position.json";
const SEGMENT_SUFFIX: &str = ".seg";

/// One shipped piece of a tablet server's change log (the writes it logged between two of its
/// sequence numbers), for one instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogSegment {
    pub project: String,
    pub instance: String,
    pub cluster: String,
    pub server: String,
    pub first_seq: u64,
    pub last_seq: u64,
    /// The least and greatest clock value (hlc) of the writes in it.
    pub min_hlc: u64,
    pub max_hlc: u64,
    /// By table id (the short id, e.g. "orders"), the rows as the tablet server encoded them
    /// (opaque bytes to this crate), in log order.
    pub tables: Vec<(String, Vec<Bytes>)>,
}

impl LogSegment {
    /// The segment's bytes (the format is in the module's documentation).
    pub fn encode(&self) -> Bytes {
        let rows: usize = self
            .tables
            .iter()
            .flat_map(|(_, rows)| rows.iter().map(|r| r.len() + 5))
            .sum();
        let mut buf = Vec::with_capacity(rows + 256);
        buf.extend_from_slice(MAGIC);
        for s in [&self.project, &self.instance, &self.cluster, &self.server] {
            put_bytes(&mut buf, s.as_bytes());
        }
        for v in [self.first_seq, self.last_seq, self.min_hlc, self.max_hlc] {
            put_varint(&mut buf, v);
        }
        put_varint(&mut buf, self.tables.len() as u64);
        for (table, rows) in &self.tables {
            put_bytes(&mut buf, table.as_bytes());
            put_varint(&mut buf, rows.len() as u64);
            for row in rows {
                put_bytes(&mut buf, row);
            }
        }
        let sum = Sha256::digest(&buf);
        buf.extend_from_slice(&sum);
        Bytes::from(buf)
    }

    /// Parses a segment's bytes (read from `path`, which errors name): DATA_LOSS when its
    /// checksum or its framing is wrong, FAILED_PRECONDITION when it is of another version of
    /// the format.
    pub fn decode(data: &[u8], path: &str) -> Result<LogSegment> {
        let damaged =
            |what: &str| Error::DataLoss(format!("log segment {path} is damaged: {what}"));
        if !data.starts_with(MAGIC) {
            let version = data
                .strip_prefix(MAGIC_FAMILY.as_slice())
                .map(|v| &v[..v.len().min(2)]);
            if let Some(v) = version.filter(|v| v.len() == 2 && v.iter().all(u8::is_ascii_digit)) {
                return Err(Error::FailedPrecondition(format!(
                    "log segment {path} has format {}, this server reads format {}",
                    String::from_utf8_lossy(v),
                    String::from_utf8_lossy(&MAGIC[MAGIC_FAMILY.len()..])
                )));
            }
            return Err(damaged(
                "it does not start with the log segment format's mark",
            ));
        }
        if data.len() < MAGIC.len() + CHECKSUM_BYTES {
            return Err(damaged("it is cut short"));
        }
        let (body, sum) = data.split_at(data.len() - CHECKSUM_BYTES);
        if Sha256::digest(body).as_slice() != sum {
            return Err(damaged("its SHA-256 does not match its bytes"));
        }
        // The checksum matched: what follows fails only for a segment written wrong.
        let mut r = Reader {
            rest: &body[MAGIC.len()..],
            damaged: &damaged,
        };
        let project = r.string("the project")?;
        let instance = r.string("the instance")?;
        let cluster = r.string("the cluster")?;
        let server = r.string("the server")?;
        let first_seq = r.varint("the first sequence number")?;
        let last_seq = r.varint("the last sequence number")?;
        let min_hlc = r.varint("the least clock value")?;
        let max_hlc = r.varint("the greatest clock value")?;
        let table_count = r.varint("the number of tables")?;
        let mut tables = Vec::new();
        for _ in 0..table_count {
            let table = r.string("a table id")?;
            let row_count = r.varint("a table's number of rows")?;
            let mut rows = Vec::new();
            for _ in 0..row_count {
                rows.push(Bytes::copy_from_slice(r.bytes("a row")?));
            }
            tables.push((table, rows));
        }
        if !r.rest.is_empty() {
            return Err(damaged("bytes follow its last table"));
        }
        Ok(LogSegment {
            project,
            instance,
            cluster,
            server,
            first_seq,
            last_seq,
            min_hlc,
            max_hlc,
            tables,
        })
    }

    /// Where the segment is, under the location's prefix (see the module's documentation).
    pub fn path(&self) -> String {
        format!(
            "{}/{}",
            server_dir(&self.project, &self.instance, &self.cluster, &self.server),
            segment_file(self.first_seq, self.last_seq, self.min_hlc, self.max_hlc)
        )
    }
}

/// What a listing tells of a segment without downloading it (parsed from its object name).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentRef {
    pub cluster: String,
    pub server: String,
    pub first_seq: u64,
    pub last_seq: u64,
    pub min_hlc: u64,
    pub max_hlc: u64,
    /// Relative to the location's prefix.
    pub path: String,
    /// The object's bytes.
    pub size: u64,
}

/// How far a server's log has been shipped for an instance (JSON).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogPosition {
    pub cluster: String,
    pub server: String,
    /// Writes of this server with a clock value at or above it are all logged (its log backup
    /// was on since).
    pub since_hlc: u64,
    /// Every write of this server with a clock value below it is in a shipped segment.
    pub covered_hlc: u64,
    pub last_seq: u64,
    pub updated_micros: i64,
    /// The server stopped after shipping its whole log: it takes no write until it writes a
    /// position again.
    pub stopped: bool,
}

impl LogPosition {
    fn path(&self, project: &str, instance: &str) -> String {
        format!(
            "{}/{POSITION_FILE}",
            server_dir(project, instance, &self.cluster, &self.server)
        )
    }
}

fn instance_dir(project: &str, instance: &str) -> String {
    format!("logs/{project}/{instance}")
}

fn server_dir(project: &str, instance: &str, cluster: &str, server: &str) -> String {
    format!("{}/{cluster}/{server}", instance_dir(project, instance))
}

fn segment_file(first_seq: u64, last_seq: u64, min_hlc: u64, max_hlc: u64) -> String {
    format!("{first_seq:020}-{last_seq:020}-{min_hlc:020}-{max_hlc:020}{SEGMENT_SUFFIX}")
}

/// `(first_seq, last_seq, min_hlc, max_hlc)` of a segment's file name; `None` for any other
/// name (the name [`segment_file`] writes, exactly: 20 digits each).
fn parse_segment_file(name: &str) -> Option<[u64; 4]> {
    let stem = name.strip_suffix(SEGMENT_SUFFIX)?;
    let mut out = [0; 4];
    let mut parts = stem.split('-');
    for slot in &mut out {
        let part = parts.next()?;
        if part.len() != 20 || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *slot = part.parse().ok()?;
    }
    parts.next().is_none().then_some(out)
}

/// Cluster and server ids are directories of the layout: `[-a-z0-9_.]`, not `.` or `..`.
fn check_id(what: &str, id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id != "."
        && id != ".."
        && id.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_' | b'.')
        });
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "invalid {what} id {id:?} for the log backup: letters a-z, digits, '-', '_' and '.'"
        )))
    }
}

/// The project and instance are directories of the layout too: one each, so no `/`.
fn check_instance(project: &str, instance: &str) -> Result<()> {
    for (what, name) in [("project", project), ("instance", instance)] {
        if name.is_empty() || name == "." || name == ".." || name.contains('/') {
            return Err(Error::InvalidArgument(format!(
                "invalid {what} {name:?} for the log backup: it must be a non-empty name without '/'"
            )));
        }
    }
    Ok(())
}

fn put_bytes(buf: &mut Vec<u8>, b: &[u8]) {
    put_varint(buf, b.len() as u64);
    buf.extend_from_slice(b);
}

/// Reads a segment's fields in order, every failure DATA_LOSS naming what was cut short.
struct Reader<'a, F: Fn(&str) -> Error> {
    rest: &'a [u8],
    damaged: &'a F,
}

impl<'a, F: Fn(&str) -> Error> Reader<'a, F> {
    fn varint(&mut self, what: &str) -> Result<u64> {
        let (v, rest) =
            get_varint(self.rest).ok_or_else(|| (self.damaged)(&format!("{what} is cut short")))?;
        self.rest = rest;
        Ok(v)
    }

    fn bytes(&mut self, what: &str) -> Result<&'a [u8]> {
        let (b, rest) =
            take_bytes(self.rest).ok_or_else(|| (self.damaged)(&format!("{what} is cut short")))?;
        self.rest = rest;
        Ok(b)
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let b = self.bytes(what)?;
        String::from_utf8(b.to_vec()).map_err(|_| (self.damaged)(&format!("{what} is not UTF-8")))
    }
}

impl BackupStore {
    /// Uploads `segment` (replacing a segment of the same name: a server shipping again after
    /// a failure ships the same writes). INVALID_ARGUMENT for ids that are not path-safe
    /// names, or sequence numbers or clock values out of order (its name would lie).
    pub async fn put_log_segment(&self, segment: &LogSegment) -> Result<()> {
        check_instance(&segment.project, &segment.instance)?;
        check_id("cluster", &segment.cluster)?;
        check_id("server", &segment.server)?;
        if segment.first_seq > segment.last_seq || segment.min_hlc > segment.max_hlc {
            return Err(Error::InvalidArgument(format!(
                "log segment of server {} has its sequence numbers ({}..{}) or clock values \
                 ({}..{}) out of order",
                segment.server,
                segment.first_seq,
                segment.last_seq,
                segment.min_hlc,
                segment.max_hlc
            )));
        }
        self.inner
            .put(
                &self.path(&segment.path()),
                PutPayload::from(segment.encode()),
            )
            .await
            .map_err(storage_error)?;
        Ok(())
    }

    /// Every segment of the instance (all clusters, all servers), sorted by (cluster, server,
    /// first_seq); objects whose names do not parse are skipped.
    pub async fn log_segments(&self, project: &str, instance: &str) -> Result<Vec<SegmentRef>> {
        check_instance(project, instance)?;
        let dir = instance_dir(project, instance);
        let base = self.path(&dir);
        let metas: Vec<_> = self
            .inner
            .list(Some(&base))
            .try_collect()
            .await
            .map_err(storage_error)?;
        let mut out = Vec::new();
        for meta in metas {
            let Some(parts) = meta.location.prefix_match(&base) else {
                continue;
            };
            let parts: Vec<_> = parts.collect();
            let [cluster, server, file] = parts.as_slice() else {
                continue;
            };
            let (cluster, server, file) = (cluster.as_ref(), server.as_ref(), file.as_ref());
            let Some([first_seq, last_seq, min_hlc, max_hlc]) = parse_segment_file(file) else {
                continue;
            };
            out.push(SegmentRef {
                cluster: cluster.to_string(),
                server: server.to_string(),
                first_seq,
                last_seq,
                min_hlc,
                max_hlc,
                path: format!("{dir}/{cluster}/{server}/{file}"),
                size: meta.size,
            });
        }
        out.sort_by(|a, b| {
            (&a.cluster, &a.server, a.first_seq, a.last_seq, &a.path).cmp(&(
                &b.cluster,
                &b.server,
                b.first_seq,
                b.last_seq,
                &b.path,
            ))
        });
        Ok(out)
    }

    /// Downloads and checks one segment; a missing one is DATA_LOSS (a listing named it, or a
    /// restore counts on it), a damaged one DATA_LOSS, and so is one whose content is not
    /// what its name says.
    pub async fn get_log_segment(&self, segment: &SegmentRef) -> Result<LogSegment> {
        let path = &segment.path;
        let bytes = self
            .inner
            .get(&self.path(path))
            .await
            .map_err(|e| match e {
                object_store::Error::NotFound { .. } => Error::DataLoss(format!(
                    "log segment {path} is missing from the backup storage"
                )),
                e => storage_error(e),
            })?
            .bytes()
            .await
            .map_err(storage_error)?;
        let got = LogSegment::decode(&bytes, path)?;
        if got.path() != *path {
            return Err(Error::DataLoss(format!(
                "log segment {path} is damaged: it holds segment {}",
                got.path()
            )));
        }
        Ok(got)
    }

    /// Writes (or replaces) a server's position for the instance: write it after the
    /// segments it counts. INVALID_ARGUMENT for ids that are not path-safe names.
    pub async fn put_log_position(
        &self,
        project: &str,
        instance: &str,
        position: &LogPosition,
    ) -> Result<()> {
        check_instance(project, instance)?;
        check_id("cluster", &position.cluster)?;
        check_id("server", &position.server)?;
        let json = serde_json::to_vec_pretty(position).expect("a log position serializes");
        self.inner
            .put(
                &self.path(&position.path(project, instance)),
                PutPayload::from(json),
            )
            .await
            .map_err(storage_error)?;
        Ok(())
    }

    /// Every server's position for the instance, sorted by (cluster, server). None is skipped:
    /// one that does not decode, or names another server than its path, is DATA_LOSS (a
    /// restore that missed a server's position would miss its writes).
    pub async fn log_positions(&self, project: &str, instance: &str) -> Result<Vec<LogPosition>> {
        check_instance(project, instance)?;
        let dir = instance_dir(project, instance);
        let base = self.path(&dir);
        let metas: Vec<_> = self
            .inner
            .list(Some(&base))
            .try_collect()
            .await
            .map_err(storage_error)?;
        let mut out = Vec::new();
        for meta in metas {
            let Some(parts) = meta.location.prefix_match(&base) else {
                continue;
            };
            let parts: Vec<_> = parts.collect();
            let [cluster, server, file] = parts.as_slice() else {
                continue;
            };
            if file.as_ref() != POSITION_FILE {
                continue;
            }
            let path = format!(
                "{dir}/{}/{}/{POSITION_FILE}",
                cluster.as_ref(),
                server.as_ref()
            );
            let bytes = match self.inner.get(&meta.location).await {
                Ok(got) => got.bytes().await.map_err(storage_error)?,
                // Deleted since it was listed.
                Err(object_store::Error::NotFound { .. }) => continue,
                Err(e) => return Err(storage_error(e)),
            };
            let position: LogPosition = serde_json::from_slice(&bytes)
                .map_err(|e| Error::DataLoss(format!("log position {path} is damaged: {e}")))?;
            if position.cluster != cluster.as_ref() || position.server != server.as_ref() {
                return Err(Error::DataLoss(format!(
                    "log position {path} is damaged: it is of server {} of cluster {}",
                    position.server, position.cluster
                )));
            }
            out.push(position);
        }
        out.sort_by(|a, b| (&a.cluster, &a.server).cmp(&(&b.cluster, &b.server)));
        Ok(out)
    }

    /// Deletes the segments (of every instance) whose max_hlc is below `below`: the writes in
    /// them are older than any time a restore may ask for. Returns how many it deleted.
    /// Positions stay.
    pub async fn delete_log_segments_below(&self, below: u64) -> Result<u64> {
        let base = self.path("logs");
        let metas: Vec<_> = self
            .inner
            .list(Some(&base))
            .try_collect()
            .await
            .map_err(storage_error)?;
        let mut deleted = 0;
        for meta in metas {
            if !is_old_segment(&meta.location, &base, below) {
                continue;
            }
            match self.inner.delete(&meta.location).await {
                Ok(()) => deleted += 1,
                // Deleted since it was listed (by another collection).
                Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(storage_error(e)),
            }
        }
        Ok(deleted)
    }
}

/// `location` is a segment (`<project>/<instance>/<cluster>/<server>/<segment file>` under
/// `logs`) whose writes are all older than `below`.
fn is_old_segment(location: &Path, logs: &Path, below: u64) -> bool {
    let Some(parts) = location.prefix_match(logs) else {
        return false;
    };
    let parts: Vec<_> = parts.collect();
    match parts.as_slice() {
        [_, _, _, _, file] => {
            parse_segment_file(file.as_ref()).is_some_and(|[.., max_hlc]| max_hlc < below)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::chunk::Chunker;

    fn segment(instance: &str, server: &str, first_seq: u64, hlc: u64) -> LogSegment {
        LogSegment {
            project: "p".into(),
            instance: instance.into(),
            cluster: "c1".into(),
            server: server.into(),
            first_seq,
            last_seq: first_seq + 2,
            min_hlc: hlc,
            max_hlc: hlc + 10,
            tables: vec![
                (
                    "orders".into(),
                    vec![Bytes::from_static(b"row-1"), Bytes::from(vec![0u8; 300])],
                ),
                ("empty".into(), vec![]),
                (
                    "users".into(),
                    vec![Bytes::from(format!("{server}@{first_seq}"))],
                ),
            ],
        }
    }

    fn position(cluster: &str, server: &str, covered_hlc: u64) -> LogPosition {
        LogPosition {
            cluster: cluster.into(),
            server: server.into(),
            since_hlc: 5,
            covered_hlc,
            last_seq: 42,
            updated_micros: 1_700_000_000_000_000,
            stopped: false,
        }
    }

    fn open() -> (tempfile::TempDir, BackupStore) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}/b", dir.path().display());
        let store = BackupStore::open(&url).unwrap();
        (dir, store)
    }

    #[test]
    fn segments_round_trip() {
        let s = segment("i", "server-0", 1, u64::MAX - 10);
        let bytes = s.encode();
        assert!(bytes.starts_with(MAGIC));
        assert_eq!(LogSegment::decode(&bytes, "x").unwrap(), s);
        let empty = LogSegment {
            tables: vec![],
            ..s.clone()
        };
        assert_eq!(LogSegment::decode(&empty.encode(), "x").unwrap(), empty);
        assert_eq!(
            s.path(),
            format!(
                "logs/p/i/c1/server-0/00000000000000000001-00000000000000000003-{}-{}.seg",
                u64::MAX - 10,
                u64::MAX
            )
        );
        assert_eq!(
            parse_segment_file(s.path().rsplit('/').next().unwrap()),
            Some([1, 3, u64::MAX - 10, u64::MAX])
        );
        for bad in [
            "1-2-3-4.seg",
            "00000000000000000001-00000000000000000003-00000000000000000001.seg",
            "00000000000000000001-00000000000000000003-00000000000000000001-00000000000000000002",
            "99999999999999999999-00000000000000000003-00000000000000000001-00000000000000000002.seg",
            "position.json",
        ] {
            assert_eq!(parse_segment_file(bad), None, "{bad}");
        }
    }

    #[test]
    fn damaged_segments_are_data_loss() {
        let bytes = segment("i", "s", 1, 100).encode();
        // Every single flipped byte: the mark, a field, a row or the checksum.
        for at in 0..bytes.len() {
            let mut flipped = bytes.to_vec();
            flipped[at] ^= 0xff;
            let err = LogSegment::decode(&flipped, "logs/p/i/c1/s/x.seg").unwrap_err();
            assert!(
                matches!(&err, Error::DataLoss(m) if m.contains("logs/p/i/c1/s/x.seg")),
                "byte {at}: {err}"
            );
        }
        for cut in [0, 5, 8, 20, bytes.len() - 1] {
            assert!(
                matches!(
                    LogSegment::decode(&bytes[..cut], "x"),
                    Err(Error::DataLoss(_))
                ),
                "cut at {cut}"
            );
        }
        // Framing that is wrong under a matching checksum (a segment written wrong).
        let mut body = MAGIC.to_vec();
        body.extend_from_slice(&[0x05, b'p']);
        let sum = Sha256::digest(&body);
        body.extend_from_slice(&sum);
        let err = LogSegment::decode(&body, "x").unwrap_err();
        assert!(
            matches!(&err, Error::DataLoss(m) if m.contains("cut short")),
            "{err}"
        );
        // Another version of the format is not damage.
        let mut other = bytes.to_vec();
        other[6..8].copy_from_slice(b"02");
        assert!(matches!(
            LogSegment::decode(&other, "x"),
            Err(Error::FailedPrecondition(_))
        ));
    }

    #[tokio::test]
    async fn segments_of_servers_and_instances() {
        let (_dir, store) = open();
        let mine = [
            segment("i", "s-b", 10, 300),
            segment("i", "s-a", 4, 200),
            segment("i", "s-a", 1, 100),
            LogSegment {
                cluster: "c0".into(),
                ..segment("i", "s-z", 1, 150)
            },
        ];
        // Another instance whose name starts with this one's.
        let theirs = segment("i2", "s-a", 1, 100);
        for s in mine.iter().chain([&theirs]) {
            store.put_log_segment(s).await.unwrap();
        }
        // Not segments: skipped by the listing.
        std::fs::write(
            store_dir(&_dir).join("logs/p/i/c1/s-a/notes.txt"),
            b"not a segment",
        )
        .unwrap();
        std::fs::create_dir_all(store_dir(&_dir).join("logs/p/i/c1/s-a/deeper")).unwrap();
        std::fs::write(
            store_dir(&_dir)
                .join("logs/p/i/c1/s-a/deeper")
                .join(mine[0].path().rsplit('/').next().unwrap()),
            b"misplaced",
        )
        .unwrap();

        let refs = store.log_segments("p", "i").await.unwrap();
        let order: Vec<_> = refs
            .iter()
            .map(|r| (r.cluster.as_str(), r.server.as_str(), r.first_seq))
            .collect();
        assert_eq!(
            order,
            [
                ("c0", "s-z", 1),
                ("c1", "s-a", 1),
                ("c1", "s-a", 4),
                ("c1", "s-b", 10)
            ]
        );
        for r in &refs {
            let s = mine
                .iter()
                .find(|s| s.server == r.server && s.first_seq == r.first_seq)
                .unwrap();
            assert_eq!(
                *r,
                SegmentRef {
                    cluster: s.cluster.clone(),
                    server: s.server.clone(),
                    first_seq: s.first_seq,
                    last_seq: s.last_seq,
                    min_hlc: s.min_hlc,
                    max_hlc: s.max_hlc,
                    path: s.path(),
                    size: s.encode().len() as u64,
                }
            );
            assert_eq!(store.get_log_segment(r).await.unwrap(), *s);
        }
        let other = store.log_segments("p", "i2").await.unwrap();
        assert_eq!(other.len(), 1);
        assert_eq!(store.get_log_segment(&other[0]).await.unwrap(), theirs);
        assert!(store.log_segments("p", "none").await.unwrap().is_empty());
        assert!(store.log_segments("q", "i").await.unwrap().is_empty());

        // A segment whose bytes changed is DATA_LOSS, naming it.
        let r = &refs[1];
        let file = store_dir(&_dir).join(&r.path);
        let mut bytes = std::fs::read(&file).unwrap();
        bytes[20] ^= 1;
        std::fs::write(&file, bytes).unwrap();
        let err = store.get_log_segment(r).await.unwrap_err();
        assert!(
            matches!(&err, Error::DataLoss(m) if m.contains(&r.path)),
            "{err}"
        );
        // So is one holding another segment than its name says.
        std::fs::write(&file, mine[0].encode()).unwrap();
        let err = store.get_log_segment(r).await.unwrap_err();
        assert!(
            matches!(&err, Error::DataLoss(m) if m.contains("holds")),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_missing_segment_is_data_loss() {
        let (_dir, store) = open();
        let s = segment("i", "s", 1, 100);
        store.put_log_segment(&s).await.unwrap();
        let r = store.log_segments("p", "i").await.unwrap().remove(0);
        std::fs::remove_file(store_dir(&_dir).join(&r.path)).unwrap();
        let err = store.get_log_segment(&r).await.unwrap_err();
        assert!(
            matches!(&err, Error::DataLoss(m) if m.contains(&r.path) && m.contains("missing")),
            "{err}"
        );
    }

    #[tokio::test]
    async fn bad_ids_are_rejected() {
        let (_dir, store) = open();
        for (cluster, server) in [
            ("c1", "S"),
            ("c1", "a/b"),
            ("c1", ""),
            ("c1", ".."),
            ("c 1", "s"),
            ("c1", "s%"),
        ] {
            let s = LogSegment {
                cluster: cluster.into(),
                ..segment("i", server, 1, 1)
            };
            assert!(
                matches!(
                    store.put_log_segment(&s).await,
                    Err(Error::InvalidArgument(_))
                ),
                "{cluster}/{server}"
            );
            assert!(
                matches!(
                    store
                        .put_log_position("p", "i", &position(cluster, server, 1))
                        .await,
                    Err(Error::InvalidArgument(_))
                ),
                "{cluster}/{server}"
            );
        }
        let s = segment("a/b", "s", 1, 1);
        assert!(matches!(
            store.put_log_segment(&s).await,
            Err(Error::InvalidArgument(_))
        ));
        let s = LogSegment {
            last_seq: 0,
            ..segment("i", "s", 1, 1)
        };
        assert!(matches!(
            store.put_log_segment(&s).await,
            Err(Error::InvalidArgument(_))
        ));
        assert!(store.log_segments("p", "i").await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn positions_round_trip() {
        let (_dir, store) = open();
        assert!(store.log_positions("p", "i").await.unwrap().is_empty());
        let b = position("c1", "s-b", 100);
        let a = LogPosition {
            stopped: true,
            ..position("c1", "s-a", 50)
        };
        let z = position("c0", "s-z", 70);
        for p in [&b, &a, &z] {
            store.put_log_position("p", "i", p).await.unwrap();
        }
        store
            .put_log_position("p", "i2", &position("c1", "s-a", 1))
            .await
            .unwrap();
        // A segment beside them is no position.
        store
            .put_log_segment(&segment("i", "s-a", 1, 1))
            .await
            .unwrap();
        assert_eq!(
            store.log_positions("p", "i").await.unwrap(),
            [z.clone(), a.clone(), b.clone()]
        );
        // Replaced.
        let a2 = position("c1", "s-a", 60);
        store.put_log_position("p", "i", &a2).await.unwrap();
        assert_eq!(
            store.log_positions("p", "i").await.unwrap(),
            [z.clone(), a2, b.clone()]
        );
        assert_eq!(store.log_positions("p", "i2").await.unwrap().len(), 1);

        // A damaged position is DATA_LOSS, not skipped.
        let file = store_dir(&_dir).join("logs/p/i/c1/s-b/position.json");
        std::fs::write(&file, b"{\"cluster\":").unwrap();
        let err = store.log_positions("p", "i").await.unwrap_err();
        assert!(
            matches!(&err, Error::DataLoss(m) if m.contains("logs/p/i/c1/s-b/position.json")),
            "{err}"
        );
        // So is one of another server than its path's.
        std::fs::write(&file, serde_json::to_vec(&z).unwrap()).unwrap();
        assert!(matches!(
            store.log_positions("p", "i").await,
            Err(Error::DataLoss(_))
        ));
    }

    #[tokio::test]
    async fn deleting_old_segments() {
        let (_dir, store) = open();
        // max_hlc = hlc + 10.
        let all = [
            segment("i", "s-a", 1, 100),  // max 110
            segment("i", "s-a", 4, 189),  // max 199
            segment("i", "s-a", 7, 190),  // max 200: not below 200
            segment("i", "s-b", 1, 300),  // max 310
            segment("i2", "s-a", 1, 50),  // max 60, another instance
            segment("i2", "s-a", 4, 250), // max 260
        ];
        for s in &all {
            store.put_log_segment(s).await.unwrap();
        }
        store
            .put_log_position("p", "i", &position("c1", "s-a", 1000))
            .await
            .unwrap();
        assert_eq!(store.delete_log_segments_below(200).await.unwrap(), 3);
        assert_eq!(
            left(&store, "i").await,
            [("s-a".to_string(), 7), ("s-b".to_string(), 1)]
        );
        assert_eq!(left(&store, "i2").await, [("s-a".to_string(), 4)]);
        assert_eq!(store.log_positions("p", "i").await.unwrap().len(), 1);
        assert_eq!(store.delete_log_segments_below(200).await.unwrap(), 0);
        assert_eq!(store.delete_log_segments_below(u64::MAX).await.unwrap(), 3);
        assert!(store.log_segments("p", "i").await.unwrap().is_empty());
        assert_eq!(store.log_positions("p", "i").await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn backups_leave_the_logs_alone() {
        let (_dir, store) = open();
        let s = segment("i", "s", 1, 100);
        store.put_log_segment(&s).await.unwrap();
        store
            .put_log_position("p", "i", &position("c1", "s", 111))
            .await
            .unwrap();
        // An unreferenced chunk, so that the collection has something to delete.
        let mut chunker = Chunker::new();
        chunker.push(0, b"k", b"v");
        let chunk = chunker.finish().unwrap();
        assert!(store.put_chunk(&chunk).await.unwrap());

        assert!(store.collect_chunks(Duration::ZERO).await.unwrap() > 0);
        assert!(matches!(
            store.get_chunk(&chunk.sha256).await,
            Err(Error::DataLoss(_))
        ));
        let refs = store.log_segments("p", "i").await.unwrap();
        assert_eq!(refs.len(), 1);
        assert_eq!(store.get_log_segment(&refs[0]).await.unwrap(), s);
        assert_eq!(store.log_positions("p", "i").await.unwrap().len(), 1);
        // Nor do backups' listings see them.
        assert!(store.all().await.unwrap().is_empty());
        assert!(store.list("p", "i", None).await.unwrap().is_empty());
        assert!(store.list("p", "i", Some("c1")).await.unwrap().is_empty());
    }

    async fn left(store: &BackupStore, instance: &str) -> Vec<(String, u64)> {
        store
            .log_segments("p", instance)
            .await
            .unwrap()
            .into_iter()
            .map(|r| (r.server, r.first_seq))
            .collect()
    }

    fn store_dir(dir: &tempfile::TempDir) -> std::path::PathBuf {
        dir.path().join("b")
    }
}
