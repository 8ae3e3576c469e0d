//! A ReadRows `RowSet` as a [`RowSet`] over row keys.

use googleapis_tonic_google_bigtable_v2::google::bigtable::v2 as pb;

use crate::error::{Error, Result};
use basalt_model::{RowRange, RowSet};

/// The rows a request's RowSet names, over row keys. No RowSet, or one without keys and
/// ranges, means the whole table; duplicates and overlaps are merged, so each row is read once.
pub fn row_set(rows: Option<&pb::RowSet>) -> Result<RowSet> {
    let Some(set) = rows.filter(|s| !s.row_keys.is_empty() || !s.row_ranges.is_empty()) else {
        return Ok(RowSet::all());
    };
    let mut ranges = Vec::with_capacity(set.row_keys.len() + set.row_ranges.len());
    for key in &set.row_keys {
        if key.is_empty() {
            return Err(Error::InvalidArgument(
                "Row keys must be non-empty (row_keys contains an empty key)".into(),
            ));
        }
        ranges.push(RowRange::key(key));
    }
    use pb::row_range::{EndKey, StartKey};
    use std::ops::Bound;
    for r in &set.row_ranges {
        if let (Some(s), Some(e)) = (start_key_bytes(&r.start_key), end_key_bytes(&r.end_key))
            && s > e
        {
            return Err(Error::InvalidArgument(format!(
                "row range start key {:?} is after its end key {:?}",
                String::from_utf8_lossy(s),
                String::from_utf8_lossy(e)
            )));
        }
        // RowRange::from_bounds reads an empty key in a bound as unbounded, as the proto says.
        let start = match &r.start_key {
            None => Bound::Unbounded,
            Some(StartKey::StartKeyClosed(k)) => Bound::Included(&k[..]),
            Some(StartKey::StartKeyOpen(k)) => Bound::Excluded(&k[..]),
        };
        let end = match &r.end_key {
            None => Bound::Unbounded,
            Some(EndKey::EndKeyClosed(k)) => Bound::Included(&k[..]),
            Some(EndKey::EndKeyOpen(k)) => Bound::Excluded(&k[..]),
        };
        ranges.push(RowRange::from_bounds(start, end));
    }
    Ok(RowSet::from_ranges(ranges))
}

fn start_key_bytes(k: &Option<pb::row_range::StartKey>) -> Option<&[u8]> {
    use pb::row_range::StartKey;
    match k {
        Some(StartKey::StartKeyClosed(k)) | Some(StartKey::StartKeyOpen(k)) if !k.is_empty() => {
            Some(k)
        }
        _ => None,
    }
}

fn end_key_bytes(k: &Option<pb::row_range::EndKey>) -> Option<&[u8]> {
    use pb::row_range::EndKey;
    match k {
        Some(EndKey::EndKeyClosed(k)) | Some(EndKey::EndKeyOpen(k)) if !k.is_empty() => Some(k),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use pb::row_range::{EndKey, StartKey};

    fn range(s: Option<StartKey>, e: Option<EndKey>) -> pb::RowRange {
        pb::RowRange {
            start_key: s,
            end_key: e,
        }
    }

    #[test]
    fn row_sets_merge() {
        let b = |s: &str| Bytes::copy_from_slice(s.as_bytes());
        let set = pb::RowSet {
            row_keys: vec![b("c"), b("a"), b("c")],
            row_ranges: vec![
                range(
                    Some(StartKey::StartKeyClosed(b("b"))),
                    Some(EndKey::EndKeyOpen(b("d"))),
                ),
                range(Some(StartKey::StartKeyOpen(b("x"))), None),
            ],
        };
        let r = row_set(Some(&set)).unwrap();
        assert_eq!(
            r.ranges(),
            &[
                RowRange::key(b"a"),
                RowRange::new(b("b"), Some(b("d"))),
                RowRange::new(b("x\0"), None)
            ]
        );
        assert_eq!(row_set(None).unwrap(), RowSet::all());
        let empty_range = pb::RowSet {
            row_keys: vec![],
            row_ranges: vec![range(
                Some(StartKey::StartKeyOpen(b("a"))),
                Some(EndKey::EndKeyOpen(b("a"))),
            )],
        };
        assert!(row_set(Some(&empty_range)).unwrap().is_empty());
        let inverted = pb::RowSet {
            row_keys: vec![],
            row_ranges: vec![range(
                Some(StartKey::StartKeyClosed(b("z"))),
                Some(EndKey::EndKeyOpen(b("a"))),
            )],
        };
        assert_eq!(
            row_set(Some(&inverted)).unwrap_err().code(),
            basalt_model::Code::InvalidArgument
        );
    }
}
