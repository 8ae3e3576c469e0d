//! Chunks: a run of a table's entries in key order, encoded as `BSLTCH01` then, per entry, a
//! LEB128 key length, the key (without the table id), a LEB128 value length and the value.
//! A chunk is named by the SHA-256 of its bytes.
//!
//! Where chunks are cut depends on the entries alone: once the chunk holds at least
//! [`CHUNK_MIN_BYTES`], an entry ends it when its key's hash, modulo [`CUT_SPACING_BYTES`], is
//! below the entry's size (so an entry ends a chunk with a probability proportional to its
//! size, and chunks hold about `CHUNK_MIN_BYTES + CUT_SPACING_BYTES` whatever the entries'
//! sizes); a chunk always ends at [`CHUNK_MAX_BYTES`] and at every tablet boundary. So a second
//! backup after a few rows changed cuts the same chunks everywhere else, and uploads only the
//! chunks that changed.

use basalt_model::{Error, Result};
use bytes::Bytes;
use sha2::{Digest, Sha256};

/// A chunk is not cut before it holds this many bytes.
pub const CHUNK_MIN_BYTES: usize = 512 << 10;
/// A chunk is always cut once it holds this many bytes.
pub const CHUNK_MAX_BYTES: usize = 8 << 20;
/// Past the minimum, the bytes between two cuts on average.
pub const CUT_SPACING_BYTES: u64 = 512 << 10;

const MAGIC: &[u8; 8] = b"BSLTCH01";

/// One finished chunk.
#[derive(Clone, Debug)]
pub struct Chunk {
    pub bytes: Bytes,
    /// Lower-case hexadecimal SHA-256 of `bytes`: the chunk's name.
    pub sha256: String,
    pub entries: u64,
}

impl Chunk {
    fn seal(bytes: Vec<u8>, entries: u64) -> Chunk {
        Chunk {
            sha256: sha256_hex(&bytes),
            bytes: Bytes::from(bytes),
            entries,
        }
    }
}

/// Lower-case hexadecimal SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Cuts a stream of entries into chunks.
#[derive(Default)]
pub struct Chunker {
    buf: Vec<u8>,
    entries: u64,
    range: usize,
    /// The entry just added ended the chunk: the next one starts a new chunk.
    cut: bool,
}

impl Chunker {
    pub fn new() -> Chunker {
        Chunker::default()
    }

    /// Adds an entry of tablet `range` (entries in key order); returns the chunk it closed,
    /// if any.
    pub fn push(&mut self, range: usize, key: &[u8], value: &[u8]) -> Option<Chunk> {
        let closed = if self.entries > 0 && (self.cut || range != self.range) {
            self.take()
        } else {
            None
        };
        if self.entries == 0 {
            self.buf.extend_from_slice(MAGIC);
        }
        self.range = range;
        let before = self.buf.len();
        put_varint(&mut self.buf, key.len() as u64);
        self.buf.extend_from_slice(key);
        put_varint(&mut self.buf, value.len() as u64);
        self.buf.extend_from_slice(value);
        self.entries += 1;
        let size = (self.buf.len() - before) as u64;
        self.cut = self.buf.len() >= CHUNK_MAX_BYTES
            || (self.buf.len() >= CHUNK_MIN_BYTES && fnv1a(key) % CUT_SPACING_BYTES < size);
        closed
    }

    /// The last chunk, if any entry is left.
    pub fn finish(mut self) -> Option<Chunk> {
        (self.entries > 0).then(|| self.take()).flatten()
    }

    fn take(&mut self) -> Option<Chunk> {
        let chunk = Chunk::seal(std::mem::take(&mut self.buf), self.entries);
        self.entries = 0;
        self.cut = false;
        Some(chunk)
    }
}

/// The entries of a chunk's bytes, in order; a chunk that does not parse is DATA_LOSS.
pub fn entries(bytes: &[u8]) -> Result<Vec<(&[u8], &[u8])>> {
    let damaged = |what: &str| Error::DataLoss(format!("backup chunk is damaged: {what}"));
    let mut rest = bytes
        .strip_prefix(MAGIC.as_slice())
        .ok_or_else(|| damaged("it does not start with the chunk format's mark"))?;
    let mut out = Vec::new();
    while !rest.is_empty() {
        let (key, after) = take_bytes(rest).ok_or_else(|| damaged("a key is cut short"))?;
        let (value, after) = take_bytes(after).ok_or_else(|| damaged("a value is cut short"))?;
        out.push((key, value));
        rest = after;
    }
    Ok(out)
}

pub(crate) fn take_bytes(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let (len, rest) = get_varint(b)?;
    let len = usize::try_from(len).ok()?;
    (rest.len() >= len).then(|| rest.split_at(len))
}

pub(crate) fn put_varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

pub(crate) fn get_varint(b: &[u8]) -> Option<(u64, &[u8])> {
    let mut v = 0u64;
    for (i, byte) in b.iter().enumerate().take(10) {
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((v, &b[i + 1..]));
        }
    }
    None
}

fn fnv1a(key: &[u8]) -> u64 {
    key.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunks_of(rows: impl Iterator<Item = (usize, Vec<u8>, Vec<u8>)>) -> Vec<Chunk> {
        let mut chunker = Chunker::new();
        let mut out = Vec::new();
        for (range, k, v) in rows {
            out.extend(chunker.push(range, &k, &v));
        }
        out.extend(chunker.finish());
        out
    }

    fn rows(n: usize, changed: Option<usize>) -> impl Iterator<Item = (usize, Vec<u8>, Vec<u8>)> {
        (0..n).map(move |i| {
            let value = if Some(i) == changed {
                vec![b'y'; 200]
            } else {
                vec![b'x'; 200]
            };
            (0, format!("row{i:08}").into_bytes(), value)
        })
    }

    #[test]
    fn entries_come_back_in_order() {
        let chunks = chunks_of(rows(100_000, None));
        let back: Vec<Vec<u8>> = chunks
            .iter()
            .flat_map(|c| entries(&c.bytes).unwrap())
            .map(|(k, _)| k.to_vec())
            .collect();
        let sent: Vec<Vec<u8>> = rows(100_000, None).map(|(_, k, _)| k).collect();
        assert_eq!(back, sent);
        assert!(chunks.len() > 3, "{} chunks", chunks.len());
        // About CHUNK_MIN_BYTES + CUT_SPACING_BYTES each.
        let mean = chunks.iter().map(|c| c.bytes.len()).sum::<usize>() / chunks.len();
        assert!(
            (600 << 10..1600 << 10).contains(&mean),
            "{mean} bytes per chunk"
        );
        for c in &chunks {
            assert_eq!(c.sha256, sha256_hex(&c.bytes));
            assert!(c.bytes.len() <= CHUNK_MAX_BYTES + 300);
        }
    }

    #[test]
    fn a_changed_row_changes_one_chunk() {
        let before = chunks_of(rows(40_000, None));
        let after = chunks_of(rows(40_000, Some(20_000)));
        let names = |cs: &[Chunk]| {
            cs.iter()
                .map(|c| c.sha256.clone())
                .collect::<std::collections::BTreeSet<_>>()
        };
        let new: Vec<_> = names(&after).difference(&names(&before)).cloned().collect();
        assert_eq!(
            new.len(),
            1,
            "{} of {} chunks changed",
            new.len(),
            after.len()
        );
    }

    #[test]
    fn tablets_start_new_chunks() {
        let chunks = chunks_of((0..10).map(|i| (i / 5, vec![i as u8], vec![0])));
        assert_eq!(chunks.len(), 2);
        assert_eq!(chunks[0].entries, 5);
    }

    #[test]
    fn damaged_chunks_are_data_loss() {
        let chunk = chunks_of(rows(10, None)).remove(0);
        let mut cut = chunk.bytes.to_vec();
        cut.truncate(cut.len() - 3);
        assert!(matches!(entries(&cut), Err(Error::DataLoss(_))));
        assert!(matches!(entries(b"garbage"), Err(Error::DataLoss(_))));
    }
}
