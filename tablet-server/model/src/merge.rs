//! Merging row streams in key order.
//!
//! A read gathers rows from several sources — the tablets of a table on one server, or, at a
//! frontend, the servers that own them — each a stream in key order (or reverse key order for
//! a reversed read). [`merge_rows`] interleaves them into one stream in that order. Sources
//! normally hold disjoint rows; should two yield the same key, the row is returned once with
//! the cells of both (in Bigtable order, exact duplicates once), so no row is ever sent twice.
//! The first error of any source ends the merge.

use bytes::Bytes;

use crate::row::{Cell, Row, ScannedRow};

/// What [`merge_rows`] merges: a row keyed by its row key, which absorbs another copy of
/// itself from a second source.
pub trait MergeItem {
    fn key(&self) -> &Bytes;
    /// Adds the cells of `other`, a copy of the same row from another source.
    fn absorb(&mut self, other: Self);
}

impl MergeItem for Row {
    fn key(&self) -> &Bytes {
        &self.key
    }

    fn absorb(&mut self, other: Row) {
        self.cells = merge_cells(std::mem::take(&mut self.cells), other.cells);
    }
}

impl MergeItem for ScannedRow {
    fn key(&self) -> &Bytes {
        &self.key
    }

    fn absorb(&mut self, other: ScannedRow) {
        self.cells = merge_cells(std::mem::take(&mut self.cells), other.cells);
        self.cells_seen += other.cells_seen;
    }
}

/// The rows of `sources` (each in key order, or reverse key order when `reversed`) as one
/// stream in that order.
pub fn merge_rows<I, R, E>(sources: Vec<I>, reversed: bool) -> MergedRows<I, R>
where
    I: Iterator<Item = Result<R, E>>,
    R: MergeItem,
{
    let heads = sources.iter().map(|_| None).collect();
    MergedRows {
        sources,
        heads,
        primed: false,
        reversed,
        done: false,
    }
}

pub struct MergedRows<I, R> {
    sources: Vec<I>,
    /// The next row of each source (None: the source is exhausted, or not read yet).
    heads: Vec<Option<R>>,
    primed: bool,
    reversed: bool,
    done: bool,
}

impl<I, R, E> MergedRows<I, R>
where
    I: Iterator<Item = Result<R, E>>,
    R: MergeItem,
{
    /// Reads the next row of source `i` into its head.
    fn advance(&mut self, i: usize) -> Result<(), E> {
        self.heads[i] = self.sources[i].next().transpose()?;
        Ok(())
    }

    fn next_row(&mut self) -> Result<Option<R>, E> {
        if !self.primed {
            self.primed = true;
            for i in 0..self.sources.len() {
                self.advance(i)?;
            }
        }
        // The sources whose head comes first (few sources: a linear pass is cheapest).
        let mut first: Vec<usize> = Vec::new();
        for (i, head) in self.heads.iter().enumerate() {
            let Some(row) = head else { continue };
            match first.first().and_then(|&f| self.heads[f].as_ref()) {
                None => first = vec![i],
                Some(best) => {
                    let order = row.key().cmp(best.key());
                    let order = if self.reversed {
                        order.reverse()
                    } else {
                        order
                    };
                    match order {
                        std::cmp::Ordering::Less => first = vec![i],
                        std::cmp::Ordering::Equal => first.push(i),
                        std::cmp::Ordering::Greater => {}
                    }
                }
            }
        }
        let Some((&only, rest)) = first.split_first() else {
            return Ok(None);
        };
        let mut row = self.heads[only].take().expect("a head was chosen");
        for &i in rest {
            let other = self.heads[i].take().expect("a head was chosen");
            row.absorb(other);
        }
        for &i in &first {
            self.advance(i)?;
        }
        Ok(Some(row))
    }
}

/// The cells of two copies of a row, in Bigtable order, exact duplicates once.
fn merge_cells(mut a: Vec<Cell>, b: Vec<Cell>) -> Vec<Cell> {
    a.extend(b);
    a.sort_by(|x, y| x.order_key().cmp(&y.order_key()));
    a.dedup();
    a
}

impl<I, R, E> Iterator for MergedRows<I, R>
where
    I: Iterator<Item = Result<R, E>>,
    R: MergeItem,
{
    type Item = Result<R, E>;

    fn next(&mut self) -> Option<Result<R, E>> {
        if self.done {
            return None;
        }
        match self.next_row() {
            Ok(Some(row)) => Some(Ok(row)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use proptest::prelude::*;

    fn row(key: &str, values: &[&str]) -> Row {
        Row {
            key: Bytes::copy_from_slice(key.as_bytes()),
            cells: values
                .iter()
                .map(|v| Cell {
                    family: "f".into(),
                    qualifier: Bytes::copy_from_slice(v.as_bytes()),
                    timestamp_micros: 1000,
                    value: Bytes::new(),
                    labels: vec![],
                })
                .collect(),
        }
    }

    fn source(rows: Vec<Row>) -> std::vec::IntoIter<Result<Row, String>> {
        rows.into_iter().map(Ok).collect::<Vec<_>>().into_iter()
    }

    fn keys(rows: impl Iterator<Item = Result<Row, String>>) -> Vec<String> {
        rows.map(|r| String::from_utf8(r.unwrap().key.to_vec()).unwrap())
            .collect()
    }

    #[test]
    fn interleaves_sources_forward_and_reversed() {
        let a = vec![row("a", &["1"]), row("d", &["1"]), row("e", &["1"])];
        let b = vec![row("b", &["1"]), row("c", &["1"]), row("f", &["1"])];
        let merged = merge_rows(vec![source(a.clone()), source(b.clone())], false);
        assert_eq!(keys(merged), ["a", "b", "c", "d", "e", "f"]);
        let rev = |v: Vec<Row>| source(v.into_iter().rev().collect());
        let merged = merge_rows(vec![rev(a), rev(b)], true);
        assert_eq!(keys(merged), ["f", "e", "d", "c", "b", "a"]);
        // No sources, empty sources.
        assert!(
            keys(merge_rows(
                Vec::<std::vec::IntoIter<Result<Row, String>>>::new(),
                false
            ))
            .is_empty()
        );
        assert!(keys(merge_rows(vec![source(vec![]), source(vec![])], false)).is_empty());
    }

    #[test]
    fn a_key_in_two_sources_is_one_row_with_the_cells_of_both() {
        let merged: Vec<Row> = merge_rows(
            vec![
                source(vec![row("a", &["x", "z"]), row("b", &["1"])]),
                source(vec![row("a", &["y", "z"])]),
            ],
            false,
        )
        .map(Result::unwrap)
        .collect();
        assert_eq!(merged, vec![row("a", &["x", "y", "z"]), row("b", &["1"])]);
    }

    #[test]
    fn the_first_error_ends_the_merge() {
        let failing = vec![Ok(row("b", &["1"])), Err("disk".to_string())].into_iter();
        let mut merged = merge_rows(vec![source(vec![row("a", &["1"])]), failing], false);
        assert_eq!(
            merged.next().unwrap().unwrap().key,
            Bytes::from_static(b"a")
        );
        // Reading b's successor fails: b is not returned after the error.
        assert_eq!(merged.next().unwrap().unwrap_err(), "disk");
        assert!(merged.next().is_none());
    }

    #[test]
    fn taking_a_limit_reads_no_further_than_needed() {
        let counted = std::cell::Cell::new(0);
        let lazy = (0..1000).map(|i| {
            counted.set(counted.get() + 1);
            Ok::<_, String>(row(&format!("k{i:04}"), &["1"]))
        });
        let first: Vec<_> = merge_rows(vec![lazy], false).take(10).collect();
        assert_eq!(first.len(), 10);
        assert!(counted.get() <= 11, "read {} rows for 10", counted.get());
    }

    #[test]
    fn scanned_rows_merge_with_their_statistics() {
        let scanned = |key: &'static str, kept: &[&str], seen| ScannedRow {
            key: Bytes::from_static(key.as_bytes()),
            cells: row(key, kept).cells,
            cells_seen: seen,
        };
        let a = vec![
            Ok::<_, String>(scanned("a", &["x"], 3)),
            Ok(scanned("c", &[], 2)),
        ];
        let b = vec![Ok(scanned("a", &["y"], 1)), Ok(scanned("b", &["z"], 1))];
        let merged: Vec<ScannedRow> = merge_rows(vec![a.into_iter(), b.into_iter()], false)
            .map(Result::unwrap)
            .collect();
        assert_eq!(
            merged,
            vec![
                scanned("a", &["x", "y"], 4),
                scanned("b", &["z"], 1),
                scanned("c", &[], 2)
            ]
        );
    }

    proptest! {
        #[test]
        fn any_sources_merge_into_their_sorted_union(
            sources in proptest::collection::vec(
                proptest::collection::btree_set("[a-e]{1,2}", 0..8), 0..5),
            reversed in any::<bool>(),
        ) {
            let streams = sources.iter().map(|keys| {
                let mut rows: Vec<Row> = keys.iter().map(|k| row(k, &["c"])).collect();
                if reversed { rows.reverse(); }
                source(rows)
            }).collect();
            let mut expected: Vec<String> = sources.iter().flatten().cloned().collect();
            expected.sort();
            expected.dedup();
            if reversed { expected.reverse(); }
            prop_assert_eq!(keys(merge_rows(streams, reversed)), expected);
        }
    }
}
