//! What a backup is: its manifest (written last, so a backup without one was interrupted),
//! and Bigtable's backup names.

use basalt_model::{Error, Result, TableSchema};
use serde::{Deserialize, Serialize};

/// The manifest's format version.
pub const MANIFEST_FORMAT: u32 = 1;

/// One chunk a backup holds, in key order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkRef {
    pub sha256: String,
    pub bytes: u64,
    pub entries: u64,
    /// The index in [`Manifest::tablets`] of the tablet it holds entries of.
    #[serde(default)]
    pub tablet: u32,
}

/// A tablet's rows when the backup was taken: `[start, end)`, no end: to the table's end.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TabletBounds {
    pub start: Vec<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<Vec<u8>>,
}

/// Bigtable's backup types. Basalt keeps both kinds the same way (one format, one location);
/// the type is what the API shows, as Bigtable's: a HOT backup is reported HOT until its
/// `hot_to_standard_time`, STANDARD after.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum BackupType {
    #[default]
    Standard,
    Hot,
}

/// A finished backup (`backups/<project>/<instance>/<cluster>/<backup>/manifest.json`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    /// `projects/p/instances/i/clusters/c/backups/b`.
    pub name: String,
    /// `projects/p/instances/i/tables/t`.
    pub source_table: String,
    /// The backup this one is a copy of (CopyBackup), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_backup: Option<String>,
    /// A copy's CopyBackup start, microseconds since the epoch: the copy's operation is
    /// named by it (a copy's `start_time` is its source's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copied_micros: Option<i64>,
    /// The source table's schema when the backup was taken (families, rules, tablet splits).
    pub schema: TableSchema,
    /// When the backup was asked for, microseconds since the epoch.
    pub start_time_micros: i64,
    /// The cut: the backup holds every write at or below it and none above it.
    pub end_time_micros: i64,
    pub expire_time_micros: i64,
    /// The type asked for at creation (manifests written before types were kept: STANDARD).
    #[serde(default)]
    pub backup_type: BackupType,
    /// When a HOT backup becomes STANDARD (none: it stays HOT).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hot_to_standard_time_micros: Option<i64>,
    /// Bytes of the backup's chunks.
    pub size_bytes: u64,
    /// Bytes of chunks this backup uploaded (the others were in the store already).
    pub uploaded_bytes: u64,
    /// The source table's tablets when the backup was taken, in key order (a restored table
    /// starts with the same ones); empty: the schema's splits.
    #[serde(default)]
    pub tablets: Vec<TabletBounds>,
    /// The chunks, in key order.
    pub chunks: Vec<ChunkRef>,
}

/// A backup's name, parsed.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BackupName {
    pub project: String,
    pub instance: String,
    pub cluster: String,
    pub backup: String,
}

impl BackupName {
    /// `projects/p/instances/i/clusters/c/backups/b`; INVALID_ARGUMENT otherwise.
    pub fn parse(name: &str) -> Result<BackupName> {
        let parts: Vec<&str> = name.split('/').collect();
        match parts.as_slice() {
            ["projects", p, "instances", i, "clusters", c, "backups", b]
                if !p.is_empty() && !i.is_empty() && !c.is_empty() =>
            {
                validate_backup_id(b)?;
                Ok(BackupName {
                    project: p.to_string(),
                    instance: i.to_string(),
                    cluster: c.to_string(),
                    backup: b.to_string(),
                })
            }
            _ => Err(Error::InvalidArgument(format!(
                "invalid backup name {name:?}: expected projects/<project>/instances/<instance>/clusters/<cluster>/backups/<backup>"
            ))),
        }
    }

    /// `projects/p/instances/i/clusters/c`.
    pub fn cluster_name(&self) -> String {
        format!(
            "projects/{}/instances/{}/clusters/{}",
            self.project, self.instance, self.cluster
        )
    }

    pub fn full(&self) -> String {
        format!("{}/backups/{}", self.cluster_name(), self.backup)
    }

    /// The manifest's path under the store's prefix.
    pub fn manifest_path(&self) -> String {
        format!(
            "{}/{}/manifest.json",
            cluster_dir(&self.project, &self.instance, &self.cluster),
            self.backup
        )
    }
}

/// Where a cluster's manifests are, under the store's prefix.
pub fn cluster_dir(project: &str, instance: &str, cluster: &str) -> String {
    format!("backups/{project}/{instance}/{cluster}")
}

/// Bigtable's backup ids: 1 to 50 characters of `[_a-zA-Z0-9][-_.a-zA-Z0-9]*`.
pub fn validate_backup_id(id: &str) -> Result<()> {
    let ok = (1..=50).contains(&id.len())
        && id
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "invalid backup id {id:?}: 1 to 50 characters, letters, digits, '_', '-' and '.', not starting with '-' or '.'"
        )))
    }
}

impl Manifest {
    /// The backup's type at `now_micros`: HOT until its `hot_to_standard_time`.
    pub fn backup_type_at(&self, now_micros: i64) -> BackupType {
        match (self.backup_type, self.hot_to_standard_time_micros) {
            (BackupType::Hot, Some(at)) if now_micros >= at => BackupType::Standard,
            (t, _) => t,
        }
    }

    /// The split points a restored table starts with: the tablets' boundaries.
    pub fn splits(&self) -> Vec<Vec<u8>> {
        if self.tablets.is_empty() {
            return self.schema.splits.clone();
        }
        self.tablets
            .iter()
            .skip(1)
            .map(|t| t.start.clone())
            .collect()
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).expect("a manifest serializes")
    }

    pub fn decode(bytes: &[u8], path: &str) -> Result<Manifest> {
        let m: Manifest = serde_json::from_slice(bytes)
            .map_err(|e| Error::DataLoss(format!("backup manifest {path} is damaged: {e}")))?;
        if m.format != MANIFEST_FORMAT {
            return Err(Error::FailedPrecondition(format!(
                "backup manifest {path} has format {}, this server reads format {MANIFEST_FORMAT}",
                m.format
            )));
        }
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        let n = BackupName::parse("projects/p/instances/i/clusters/c/backups/b-1.x").unwrap();
        assert_eq!(n.manifest_path(), "backups/p/i/c/b-1.x/manifest.json");
        assert_eq!(n.full(), "projects/p/instances/i/clusters/c/backups/b-1.x");
        for bad in [
            "projects/p/instances/i/clusters/c/backups/-b",
            "projects/p/instances/i/clusters/c/backups/",
            "projects/p/instances/i/backups/b",
            "projects/p/instances/i/clusters/c/backups/a/b",
        ] {
            assert!(
                matches!(BackupName::parse(bad), Err(Error::InvalidArgument(_))),
                "{bad}"
            );
        }
        assert!(validate_backup_id(&"a".repeat(51)).is_err());
    }

    #[test]
    fn a_hot_backup_turns_standard_at_its_time_and_old_manifests_read_standard() {
        let json = r#"{"format":1,"name":"projects/p/instances/i/clusters/c/backups/b",
            "source_table":"projects/p/instances/i/tables/t","schema":{"id":0,
            "name":"projects/p/instances/i/tables/t","families":{},"deletion_protection":false,
            "splits":[],"created_micros":0},"start_time_micros":1,"end_time_micros":2,
            "expire_time_micros":3,"size_bytes":0,"uploaded_bytes":0,"chunks":[]}"#;
        let mut m = Manifest::decode(json.as_bytes(), "m").unwrap();
        assert_eq!(m.backup_type, BackupType::Standard);
        assert_eq!(m.backup_type_at(i64::MAX), BackupType::Standard);
        m.backup_type = BackupType::Hot;
        assert_eq!(m.backup_type_at(i64::MAX), BackupType::Hot);
        m.hot_to_standard_time_micros = Some(100);
        assert_eq!(m.backup_type_at(99), BackupType::Hot);
        assert_eq!(m.backup_type_at(100), BackupType::Standard);
        let back = Manifest::decode(&m.encode(), "m").unwrap();
        assert_eq!(back, m);
        assert!(
            String::from_utf8(m.encode())
                .unwrap()
                .contains(r#""backup_type": "HOT""#)
        );
    }
}
