//! The database's layout: its column families and the keys of the `meta` column family (see
//! `docs/storage-format.md`), and the store's fixed sizes.

pub(crate) const CF_DATA: &str = "data";
pub(crate) const CF_META: &str = "meta";
/// The change log ([`crate::changelog`]): entries keyed by sequence, big-endian.
pub(crate) const CF_LOG: &str = "log";
/// A change log consumer's cursor: `log-cursor/<consumer>` → the last sequence it acknowledged.
pub(crate) const META_LOG_CURSOR_PREFIX: &str = "log-cursor/";
/// The last change log sequence a truncation deleted: the sequence goes on above it also when
/// the log is empty (sequences are never reused).
pub(crate) const META_LOG_TRUNCATED: &[u8] = b"log_truncated_through";
pub(crate) const META_FORMAT: &[u8] = b"format_version";
pub(crate) const META_NEXT_TABLE_ID: &[u8] = b"next_table_id";
pub(crate) const META_CLOCK_FLOOR: &[u8] = b"clock_floor";
pub(crate) const META_TABLE_PREFIX: &str = "table/";
/// A resource's IAM policy (standalone servers): `iam/<resource name>` → the policy (JSON).
pub(crate) const META_IAM_PREFIX: &str = "iam/";
/// The store's identity (see [`crate::Store::store_id`]).
pub(crate) const META_STORE_ID: &[u8] = b"store_id";
pub(crate) const ROW_LOCK_STRIPES: usize = 4096;
/// Distance between intermediate SampleRowKeys samples.
pub(crate) const SAMPLE_INTERVAL: u64 = 16 << 20;

/// The sequence a change log key holds (see [`CF_LOG`]).
pub(crate) fn log_seq_of(key: &[u8]) -> crate::error::Result<u64> {
    let b: [u8; 8] = key
        .try_into()
        .map_err(|_| crate::error::Error::Internal("a change log key is not 8 bytes".into()))?;
    Ok(u64::from_be_bytes(b))
}
