//! The object store backups are kept in: `chunks/<sha256>` (content-addressed, uploaded once,
//! shared by every backup that holds them) and `backups/<project>/<instance>/<cluster>/
//! <backup>/manifest.json` (written last). Point-in-time recovery's change logs are beside
//! them, under `logs/` ([`crate::log`]): `logs/<project>/<instance>/<cluster>/<server>/
//! <first_seq:020>-<last_seq:020>-<min_hlc:020>-<max_hlc:020>.seg` (a shipped log segment)
//! and `logs/<project>/<instance>/<cluster>/<server>/position.json` (how far the server's log
//! is shipped). Backups' listings and chunk collection read `backups/` and `chunks/` only:
//! they never see (nor delete) the logs.
//!
//! Locations: `s3://bucket/prefix` (credentials, region and endpoint from the environment as
//! the AWS tools read them: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`,
//! `AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP`), or `file:///path` (a directory, created if missing).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use basalt_model::{Error, Result};
use bytes::Bytes;
use futures::TryStreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectStore, PutPayload};

use crate::chunk::{Chunk, sha256_hex};
use crate::manifest::{BackupName, Manifest, cluster_dir};

/// A backup location.
#[derive(Clone)]
pub struct BackupStore {
    pub(crate) inner: Arc<dyn ObjectStore>,
    prefix: Path,
    url: String,
}

impl std::fmt::Debug for BackupStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackupStore")
            .field("url", &self.url)
            .finish()
    }
}

pub(crate) fn storage_error(e: object_store::Error) -> Error {
    match e {
        object_store::Error::NotFound { path, .. } => {
            Error::NotFound(format!("{path} is not in the backup storage"))
        }
        e => Error::Unavailable(format!("backup storage: {e}")),
    }
}

impl BackupStore {
    /// Opens `url` (`s3://bucket/prefix` or `file:///path`).
    pub fn open(url: &str) -> Result<BackupStore> {
        let parsed = url::Url::parse(url).map_err(|e| {
            Error::InvalidArgument(format!("backup location {url:?} is not a URL: {e}"))
        })?;
        let prefix = |p: &str| Path::from(p.trim_matches('/'));
        let (inner, prefix): (Arc<dyn ObjectStore>, Path) = match parsed.scheme() {
            "s3" => {
                let bucket = parsed.host_str().unwrap_or_default();
                if bucket.is_empty() {
                    return Err(Error::InvalidArgument(format!(
                        "backup location {url:?} names no bucket"
                    )));
                }
                let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
                // Path-style requests (`endpoint/bucket/key`): what S3-compatible servers
                // (SeaweedFS, MinIO, Ceph) answer without wildcard DNS.
                if std::env::var_os("AWS_ENDPOINT_URL").is_some()
                    || std::env::var_os("AWS_ENDPOINT").is_some()
                {
                    builder = builder.with_virtual_hosted_style_request(false);
                }
                if std::env::var_os("AWS_REGION").is_none()
                    && std::env::var_os("AWS_DEFAULT_REGION").is_none()
                {
                    builder = builder.with_region("us-east-1");
                }
                let s3 = builder
                    .build()
                    .map_err(|e| Error::InvalidArgument(format!("backup location {url}: {e}")))?;
                (Arc::new(s3), prefix(parsed.path()))
            }
            "file" => {
                let dir = parsed.to_file_path().map_err(|_| {
                    Error::InvalidArgument(format!("backup location {url:?} is not a local path"))
                })?;
                std::fs::create_dir_all(&dir).map_err(|e| {
                    Error::Unavailable(format!("creating backup directory {}: {e}", dir.display()))
                })?;
                let fs = LocalFileSystem::new_with_prefix(&dir).map_err(storage_error)?;
                (Arc::new(fs), Path::default())
            }
            other => {
                return Err(Error::InvalidArgument(format!(
                    "backup location {url:?}: scheme {other:?} is not supported (s3:// or file://)"
                )));
            }
        };
        Ok(BackupStore {
            inner,
            prefix,
            url: url.to_string(),
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// `rest` (`/`-separated) under the location's prefix.
    pub(crate) fn path(&self, rest: &str) -> Path {
        let mut p = self.prefix.clone();
        for part in rest.split('/').filter(|s| !s.is_empty()) {
            p = p.child(part);
        }
        p
    }

    fn chunk_path(&self, sha256: &str) -> Path {
        self.path(&format!("chunks/{sha256}"))
    }

    /// Uploads `chunk` unless the store holds it already; returns whether it uploaded.
    pub async fn put_chunk(&self, chunk: &Chunk) -> Result<bool> {
        let path = self.chunk_path(&chunk.sha256);
        match self.inner.head(&path).await {
            Ok(meta) if meta.size == chunk.bytes.len() as u64 => return Ok(false),
            Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(storage_error(e)),
        }
        self.inner
            .put(&path, PutPayload::from(chunk.bytes.clone()))
            .await
            .map_err(storage_error)?;
        Ok(true)
    }

    /// A chunk's bytes, checked against its name: a chunk that changed is DATA_LOSS.
    pub async fn get_chunk(&self, sha256: &str) -> Result<Bytes> {
        let path = self.chunk_path(sha256);
        let bytes = self
            .inner
            .get(&path)
            .await
            .map_err(|e| match e {
                object_store::Error::NotFound { .. } => Error::DataLoss(format!(
                    "backup chunk chunks/{sha256} is missing from the backup storage"
                )),
                e => storage_error(e),
            })?
            .bytes()
            .await
            .map_err(storage_error)?;
        let found = sha256_hex(&bytes);
        if found != sha256 {
            return Err(Error::DataLoss(format!(
                "backup chunk chunks/{sha256} is damaged: its SHA-256 is {found}"
            )));
        }
        Ok(bytes)
    }

    /// Writes (or replaces) a backup's manifest: the backup exists once this returns.
    pub async fn put_manifest(&self, manifest: &Manifest) -> Result<()> {
        let name = BackupName::parse(&manifest.name)?;
        self.inner
            .put(
                &self.path(&name.manifest_path()),
                PutPayload::from(manifest.encode()),
            )
            .await
            .map_err(storage_error)?;
        Ok(())
    }

    /// The manifest of backup `name`; NOT_FOUND when there is none.
    pub async fn manifest(&self, name: &BackupName) -> Result<Manifest> {
        let path = name.manifest_path();
        let bytes = match self.inner.get(&self.path(&path)).await {
            Ok(got) => got.bytes().await.map_err(storage_error)?,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(Error::NotFound(format!("backup {} not found", name.full())));
            }
            Err(e) => return Err(storage_error(e)),
        };
        Manifest::decode(&bytes, &path)
    }

    /// Every manifest under `dir` (the store's prefix joined with it).
    async fn manifests_under(&self, dir: &str) -> Result<Vec<Manifest>> {
        let metas: Vec<_> = self
            .inner
            .list(Some(&self.path(dir)))
            .try_collect()
            .await
            .map_err(storage_error)?;
        let mut out = Vec::new();
        for meta in metas {
            if meta.location.filename() != Some("manifest.json") {
                continue;
            }
            let bytes = match self.inner.get(&meta.location).await {
                Ok(got) => got.bytes().await.map_err(storage_error)?,
                // Deleted since it was listed.
                Err(object_store::Error::NotFound { .. }) => continue,
                Err(e) => return Err(storage_error(e)),
            };
            out.push(Manifest::decode(&bytes, meta.location.as_ref())?);
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// The backups of a cluster (`cluster` `None`: of every cluster of the instance).
    pub async fn list(
        &self,
        project: &str,
        instance: &str,
        cluster: Option<&str>,
    ) -> Result<Vec<Manifest>> {
        match cluster {
            Some(c) => {
                self.manifests_under(&cluster_dir(project, instance, c))
                    .await
            }
            None => {
                self.manifests_under(&format!("backups/{project}/{instance}"))
                    .await
            }
        }
    }

    /// Deletes backup `name`'s manifest (its chunks go in [`BackupStore::collect_chunks`]).
    pub async fn delete(&self, name: &BackupName) -> Result<()> {
        self.inner
            .delete(&self.path(&name.manifest_path()))
            .await
            .map_err(storage_error)
    }

    /// Every backup in the store, of every instance and cluster.
    pub async fn all(&self) -> Result<Vec<Manifest>> {
        self.manifests_under("backups").await
    }

    /// Deletes the chunks no manifest holds that are older than `min_age` (a backup being
    /// written has uploaded chunks its manifest does not name yet). Returns the bytes freed.
    pub async fn collect_chunks(&self, min_age: Duration) -> Result<u64> {
        let held: BTreeSet<String> = self
            .all()
            .await?
            .into_iter()
            .flat_map(|m| m.chunks.into_iter().map(|c| c.sha256))
            .collect();
        let metas: Vec<_> = self
            .inner
            .list(Some(&self.path("chunks")))
            .try_collect()
            .await
            .map_err(storage_error)?;
        let now = SystemTime::now();
        let mut freed = 0;
        for meta in metas {
            let Some(name) = meta.location.filename() else {
                continue;
            };
            let age = now
                .duration_since(SystemTime::from(meta.last_modified))
                .unwrap_or_default();
            if held.contains(name) || age < min_age {
                continue;
            }
            match self.inner.delete(&meta.location).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => freed += meta.size,
                Err(e) => return Err(storage_error(e)),
            }
        }
        Ok(freed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::Chunker;
    use crate::manifest::{ChunkRef, MANIFEST_FORMAT};

    fn manifest(name: &str, chunks: &[&Chunk]) -> Manifest {
        Manifest {
            format: MANIFEST_FORMAT,
            name: name.into(),
            source_table: "projects/p/instances/i/tables/t".into(),
            source_backup: None,
            copied_micros: None,
            schema: basalt_model::TableSchema {
                id: 1,
                name: "projects/p/instances/i/tables/t".into(),
                families: Default::default(),
                dropped_families: Default::default(),
                deletion_protection: false,
                splits: vec![],
                created_micros: 0,
                restore: None,
            },
            start_time_micros: 1,
            end_time_micros: 2,
            expire_time_micros: 3,
            backup_type: Default::default(),
            hot_to_standard_time_micros: None,
            size_bytes: 0,
            uploaded_bytes: 0,
            tablets: vec![],
            chunks: chunks
                .iter()
                .map(|c| ChunkRef {
                    sha256: c.sha256.clone(),
                    bytes: c.bytes.len() as u64,
                    entries: c.entries,
                    tablet: 0,
                })
                .collect(),
        }
    }

    fn chunk(v: u8) -> Chunk {
        let mut c = Chunker::new();
        c.push(0, b"k", &[v]);
        c.finish().unwrap()
    }

    #[tokio::test]
    async fn chunks_once_manifests_and_collection() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}/b", dir.path().display());
        let store = BackupStore::open(&url).unwrap();
        let (a, b) = (chunk(1), chunk(2));
        assert!(store.put_chunk(&a).await.unwrap());
        assert!(!store.put_chunk(&a).await.unwrap(), "uploaded twice");
        assert!(store.put_chunk(&b).await.unwrap());
        assert_eq!(store.get_chunk(&a.sha256).await.unwrap(), a.bytes);

        let name = "projects/p/instances/i/clusters/c/backups/one";
        let parsed = BackupName::parse(name).unwrap();
        assert!(matches!(
            store.manifest(&parsed).await,
            Err(Error::NotFound(_))
        ));
        store.put_manifest(&manifest(name, &[&a])).await.unwrap();
        assert_eq!(store.manifest(&parsed).await.unwrap().chunks.len(), 1);
        assert_eq!(store.list("p", "i", Some("c")).await.unwrap().len(), 1);
        assert_eq!(store.list("p", "i", Some("d")).await.unwrap().len(), 0);

        // b is held by no manifest: collected; a stays.
        store.collect_chunks(Duration::ZERO).await.unwrap();
        assert!(store.get_chunk(&a.sha256).await.is_ok());
        assert!(matches!(
            store.get_chunk(&b.sha256).await,
            Err(Error::DataLoss(_))
        ));

        // A chunk whose bytes changed is DATA_LOSS, naming it.
        std::fs::write(
            dir.path().join("b/chunks").join(&a.sha256),
            b"BSLTCH01\x01k\x01\x09",
        )
        .unwrap();
        let err = store.get_chunk(&a.sha256).await.unwrap_err();
        assert!(
            matches!(&err, Error::DataLoss(m) if m.contains(&a.sha256)),
            "{err}"
        );

        store.delete(&parsed).await.unwrap();
        assert!(store.list("p", "i", None).await.unwrap().is_empty());
    }
}
