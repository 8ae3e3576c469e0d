//! The Key Visualizer's translations between the wire and the model
//! (`basalt_model::keyviz`): a server's samples (`KeyRangeSample`) into [`RangeCounts`], and a
//! history column into the `StoredKeyColumn` the master keeps in etcd and back (the operator
//! writes and reads them, the tablet servers read them for `ListHotTablets`).

use prost::Message;

use crate::v1::{KeyRangeSample, StoredKeyColumn, StoredKeyRange};
use basalt_model::keyviz::{Column, Counts, RangeCounts};

/// A server's sample of one key range, as the model's counts.
pub fn range_counts(sample: KeyRangeSample) -> RangeCounts {
    RangeCounts {
        start: sample.start_key,
        end: sample.end_key,
        counts: Counts {
            reads: sample.reads as f64,
            writes: sample.writes as f64,
            rows_read: sample.rows_read as f64,
            bytes_read: sample.bytes_read as f64,
            bytes_written: sample.bytes_written as f64,
            stored_bytes: sample.stored_bytes as f64,
        },
    }
}

/// A column as stored in etcd.
pub fn encode(column: &Column) -> Vec<u8> {
    StoredKeyColumn {
        start_minute: column.start_minute,
        minutes: column.minutes,
        ranges: column
            .ranges
            .iter()
            .map(|r| StoredKeyRange {
                start_key: r.start.clone(),
                end_key: r.end.clone(),
                reads: r.counts.reads,
                writes: r.counts.writes,
                rows_read: r.counts.rows_read,
                bytes_read: r.counts.bytes_read,
                bytes_written: r.counts.bytes_written,
                stored_bytes: r.counts.stored_bytes,
            })
            .collect(),
    }
    .encode_to_vec()
}

/// A stored column read back; None if it does not decode (a newer master's format: skipped,
/// never fatal).
pub fn decode(value: &[u8]) -> Option<Column> {
    let stored = StoredKeyColumn::decode(value).ok()?;
    Some(Column {
        start_minute: stored.start_minute,
        minutes: stored.minutes.max(1),
        ranges: stored
            .ranges
            .into_iter()
            .map(|r| RangeCounts {
                start: r.start_key,
                end: r.end_key,
                counts: Counts {
                    reads: r.reads,
                    writes: r.writes,
                    rows_read: r.rows_read,
                    bytes_read: r.bytes_read,
                    bytes_written: r.bytes_written,
                    stored_bytes: r.stored_bytes,
                },
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn a_column_reads_back_as_it_was_stored() {
        let column = Column {
            start_minute: 29_000_000,
            minutes: 10,
            ranges: vec![
                RangeCounts {
                    start: Bytes::new(),
                    end: Bytes::from_static(b"m"),
                    counts: Counts {
                        reads: 1.5,
                        writes: 2.0,
                        rows_read: 3.0,
                        bytes_read: 4.0,
                        bytes_written: 5.25,
                        stored_bytes: 6e9,
                    },
                },
                RangeCounts {
                    start: Bytes::from_static(b"m"),
                    end: Bytes::new(),
                    counts: Counts {
                        writes: 7.0,
                        ..Counts::default()
                    },
                },
            ],
        };
        assert_eq!(decode(&encode(&column)), Some(column));
        assert_eq!(decode(b"\xff\xff\xff"), None);
    }

    #[test]
    fn a_sample_keeps_its_range_and_counts() {
        let counts = range_counts(KeyRangeSample {
            start_key: Bytes::from_static(b"a"),
            end_key: Bytes::from_static(b"b"),
            reads: 1,
            writes: 2,
            rows_read: 3,
            bytes_read: 4,
            bytes_written: 5,
            stored_bytes: 6,
        });
        assert_eq!(counts.start, Bytes::from_static(b"a"));
        assert_eq!(counts.end, Bytes::from_static(b"b"));
        assert_eq!(counts.counts.writes, 2.0);
        assert_eq!(counts.counts.bytes_written, 5.0);
        assert_eq!(counts.counts.stored_bytes, 6.0);
    }
}
