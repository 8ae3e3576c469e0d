//! Unit and property tests of the filter language (compile, evaluate, RE2 translation).

use super::re2::*;
use super::*;
use bytes::Bytes;
use googleapis_tonic_google_bigtable_v2::google::bigtable::v2 as pb;
use pb::row_filter::Filter as F;
use pb::row_filter::{Chain, Condition, Interleave};
use proptest::prelude::*;

// ---------------------------------------------------------------- helpers

fn rf(f: F) -> pb::RowFilter {
    pb::RowFilter { filter: Some(f) }
}
fn unset() -> pb::RowFilter {
    pb::RowFilter { filter: None }
}
fn chain(filters: Vec<pb::RowFilter>) -> pb::RowFilter {
    rf(F::Chain(Chain { filters }))
}
fn interleave(filters: Vec<pb::RowFilter>) -> pb::RowFilter {
    rf(F::Interleave(Interleave { filters }))
}
fn condition(
    predicate: Option<pb::RowFilter>,
    on_true: Option<pb::RowFilter>,
    on_false: Option<pb::RowFilter>,
) -> pb::RowFilter {
    rf(F::Condition(Box::new(Condition {
        predicate_filter: predicate.map(Box::new),
        true_filter: on_true.map(Box::new),
        false_filter: on_false.map(Box::new),
    })))
}
fn pass() -> pb::RowFilter {
    rf(F::PassAllFilter(true))
}
fn block() -> pb::RowFilter {
    rf(F::BlockAllFilter(true))
}
fn sink() -> pb::RowFilter {
    rf(F::Sink(true))
}
fn strip() -> pb::RowFilter {
    rf(F::StripValueTransformer(true))
}
fn label(l: &str) -> pb::RowFilter {
    rf(F::ApplyLabelTransformer(l.to_string()))
}
fn family(re: &str) -> pb::RowFilter {
    rf(F::FamilyNameRegexFilter(re.to_string()))
}
fn qualifier(re: &[u8]) -> pb::RowFilter {
    rf(F::ColumnQualifierRegexFilter(Bytes::copy_from_slice(re)))
}
fn value(re: &[u8]) -> pb::RowFilter {
    rf(F::ValueRegexFilter(Bytes::copy_from_slice(re)))
}
fn key_regex(re: &[u8]) -> pb::RowFilter {
    rf(F::RowKeyRegexFilter(Bytes::copy_from_slice(re)))
}
fn row_limit(n: i32) -> pb::RowFilter {
    rf(F::CellsPerRowLimitFilter(n))
}
fn row_offset(n: i32) -> pb::RowFilter {
    rf(F::CellsPerRowOffsetFilter(n))
}
fn column_limit(n: i32) -> pb::RowFilter {
    rf(F::CellsPerColumnLimitFilter(n))
}
fn ts_range(start: i64, end: i64) -> pb::RowFilter {
    rf(F::TimestampRangeFilter(pb::TimestampRange {
        start_timestamp_micros: start,
        end_timestamp_micros: end,
    }))
}
fn sample(p: f64) -> pb::RowFilter {
    rf(F::RowSampleFilter(p))
}

fn b(s: &[u8]) -> Bytes {
    Bytes::copy_from_slice(s)
}

fn cell(family: &str, qualifier: &[u8], ts: i64, value: &[u8]) -> Cell {
    Cell {
        family: family.to_string(),
        qualifier: b(qualifier),
        timestamp_micros: ts,
        value: b(value),
        labels: vec![],
    }
}

fn row(key: &[u8], cells: Vec<Cell>) -> Row {
    Row { key: b(key), cells }
}

/// "family:qualifier@ts=value[labels]" with bytes escaped, for readable assertions.
fn show(cells: &[Cell]) -> Vec<String> {
    cells
        .iter()
        .map(|c| {
            format!(
                "{}:{}@{}={}[{}]",
                c.family,
                c.qualifier.escape_ascii(),
                c.timestamp_micros,
                c.value.escape_ascii(),
                c.labels.join(",")
            )
        })
        .collect()
}

fn compile(f: &pb::RowFilter) -> RowFilter {
    RowFilter::compile(f).unwrap_or_else(|e| panic!("{f:?} should compile: {e}"))
}

fn run(f: &pb::RowFilter, r: &Row) -> Vec<String> {
    show(&compile(f).apply_with_sampler(r, &mut || 0.5))
}

fn err(f: &pb::RowFilter) -> FilterError {
    match RowFilter::compile(f) {
        Ok(_) => panic!("{f:?} should be rejected"),
        Err(e) => e,
    }
}

/// A row with two families, several columns and versions, already in Bigtable order.
fn sample_row() -> Row {
    row(
        b"row-1",
        vec![
            cell("cf1", b"a", 3000, b"a3"),
            cell("cf1", b"a", 2000, b"a2"),
            cell("cf1", b"a", 1000, b"a1"),
            cell("cf1", b"b", 2000, b"b2"),
            cell("cf1", b"c", 1000, b""),
            cell("cf2", b"a", 5000, b"x"),
            cell("cf2", b"z", 4000, b"yy"),
        ],
    )
}

fn all_of(r: &Row) -> Vec<String> {
    show(&r.cells)
}

// ---------------------------------------------------------------- pass / block / unset

#[test]
fn pass_all_variants_return_every_cell() {
    let r = sample_row();
    assert_eq!(run(&pass(), &r), all_of(&r));
    assert_eq!(run(&unset(), &r), all_of(&r));
    assert_eq!(
        show(&RowFilter::pass_all().apply(&r)),
        all_of(&r),
        "pass_all()"
    );
    assert!(!RowFilter::pass_all().is_block_all());
    assert!(!compile(&unset()).is_block_all());
    // An unset filter nested in a chain also passes everything.
    assert_eq!(run(&chain(vec![unset(), unset()]), &r), all_of(&r));
}

#[test]
fn block_all_returns_nothing() {
    let r = sample_row();
    assert!(run(&block(), &r).is_empty());
    assert!(compile(&block()).is_block_all());
    assert!(!compile(&pass()).is_block_all());
}

#[test]
fn empty_row_gives_empty_output() {
    let r = row(b"k", vec![]);
    assert!(run(&pass(), &r).is_empty());
    assert!(run(&condition(None, None, Some(pass())), &r).is_empty());
}

// ---------------------------------------------------------------- chain

#[test]
fn chain_applies_filters_in_sequence() {
    let r = sample_row();
    // Each sub-filter sees the previous output: first cf1, then the newest per column,
    // then the first two cells of what is left.
    let f = chain(vec![family("cf1"), column_limit(1), row_limit(2)]);
    assert_eq!(run(&f, &r), ["cf1:a@3000=a3[]", "cf1:b@2000=b2[]"]);
    // Order matters: the row limit first keeps 2 cells, both in column cf1:a.
    let f = chain(vec![row_limit(2), column_limit(1)]);
    assert_eq!(run(&f, &r), ["cf1:a@3000=a3[]"]);
}

#[test]
fn chain_with_block_all_outputs_nothing() {
    let f = chain(vec![pass(), block()]);
    assert!(run(&f, &sample_row()).is_empty());
    assert!(compile(&f).is_block_all());
}

// ---------------------------------------------------------------- interleave

#[test]
fn interleave_merges_in_bigtable_order_and_keeps_duplicates() {
    let r = sample_row();
    let f = interleave(vec![
        chain(vec![family("cf2"), label("two")]),
        chain(vec![qualifier(b"a"), label("qa")]),
    ]);
    assert_eq!(
        run(&f, &r),
        [
            "cf1:a@3000=a3[qa]",
            "cf1:a@2000=a2[qa]",
            "cf1:a@1000=a1[qa]",
            // cf2:a@5000 is produced by both sub-filters: both copies are output, in
            // sub-filter order (the proto leaves their mutual order unspecified).
            "cf2:a@5000=x[two]",
            "cf2:a@5000=x[qa]",
            "cf2:z@4000=yy[two]",
        ]
    );
}

#[test]
fn interleave_identical_copies_are_all_output() {
    // Like the proto's "far,blah,5,x" #5 and #6: two sub-filters produce the same cell.
    let r = row(b"k", vec![cell("far", b"blah", 5000, b"x")]);
    let f = interleave(vec![pass(), pass(), block()]);
    assert_eq!(run(&f, &r), ["far:blah@5000=x[]", "far:blah@5000=x[]"]);
}

#[test]
fn interleave_proto_example_shape() {
    // The proto's example: f(0) and f(1) both produce foo:bar@10 (different values), f(1)
    // and f(2) both produce far:blah@5. Output is sorted; both copies of each are kept.
    let r = row(
        b"k",
        vec![
            cell("far", b"bar", 7000, b"a"),
            cell("far", b"blah", 5000, b"x"),
            cell("foo", b"bar", 10000, b"x"),
            cell("foo", b"blah", 11000, b"z"),
        ],
    );
    let f0 = family("foo");
    let f1 = interleave(vec![
        chain(vec![family("foo"), qualifier(b"bar"), value(b"x"), strip()]),
        chain(vec![family("far"), qualifier(b"blah")]),
    ]);
    let f2 = family("far");
    let out = run(&interleave(vec![f0, f1, f2]), &r);
    assert_eq!(
        out,
        [
            "far:bar@7000=a[]",
            "far:blah@5000=x[]",
            "far:blah@5000=x[]",
            "foo:bar@10000=x[]",
            "foo:bar@10000=[]",
            "foo:blah@11000=z[]",
        ]
    );
}

#[test]
fn interleave_then_limits_count_each_copy() {
    let r = row(
        b"k",
        vec![cell("f", b"q", 2000, b"new"), cell("f", b"q", 1000, b"old")],
    );
    let dup = interleave(vec![pass(), pass()]);
    assert_eq!(
        run(&chain(vec![dup.clone(), column_limit(2)]), &r),
        ["f:q@2000=new[]", "f:q@2000=new[]"]
    );
    assert_eq!(
        run(&chain(vec![dup.clone(), row_limit(3)]), &r),
        ["f:q@2000=new[]", "f:q@2000=new[]", "f:q@1000=old[]"]
    );
    assert_eq!(
        run(&chain(vec![dup, row_offset(1)]), &r),
        ["f:q@2000=new[]", "f:q@1000=old[]", "f:q@1000=old[]"]
    );
}

#[test]
fn interleave_block_alls_is_block_all() {
    assert!(compile(&interleave(vec![block(), block()])).is_block_all());
    assert!(!compile(&interleave(vec![block(), pass()])).is_block_all());
}

// ---------------------------------------------------------------- condition

#[test]
fn condition_picks_branch_on_predicate_output() {
    let r = sample_row();
    let f = condition(Some(family("cf2")), Some(strip()), Some(block()));
    let stripped: Vec<String> = r
        .cells
        .iter()
        .map(|c| {
            show(&[Cell {
                value: Bytes::new(),
                ..c.clone()
            }])[0]
                .clone()
        })
        .collect();
    assert_eq!(
        run(&f, &r),
        stripped,
        "true branch applies to the whole input row"
    );
    let f = condition(Some(family("nope")), Some(strip()), Some(row_limit(1)));
    assert_eq!(run(&f, &r), ["cf1:a@3000=a3[]"], "false branch");
}

#[test]
fn condition_missing_branch_outputs_nothing() {
    let r = sample_row();
    assert!(run(&condition(Some(pass()), None, Some(pass())), &r).is_empty());
    assert!(run(&condition(Some(block()), Some(pass()), None), &r).is_empty());
    assert_eq!(
        run(&condition(Some(pass()), Some(pass()), None), &r),
        all_of(&r)
    );
    assert!(compile(&condition(Some(pass()), None, None)).is_block_all());
}

#[test]
fn condition_without_predicate_is_true_for_non_empty_rows() {
    let r = sample_row();
    assert_eq!(
        run(&condition(None, Some(row_limit(1)), Some(block())), &r),
        ["cf1:a@3000=a3[]"]
    );
}

#[test]
fn condition_predicate_transformations_do_not_leak() {
    let r = sample_row();
    let f = condition(
        Some(chain(vec![strip(), label("pred"), row_limit(1)])),
        Some(pass()),
        None,
    );
    assert_eq!(run(&f, &r), all_of(&r));
    // A predicate that strips everything out (value regex on stripped values) is false.
    let f = condition(
        Some(chain(vec![strip(), value(b"a3")])),
        Some(pass()),
        Some(family("cf2")),
    );
    assert_eq!(run(&f, &r), ["cf2:a@5000=x[]", "cf2:z@4000=yy[]"]);
}

#[test]
fn condition_inside_chain_sees_intermediate_row() {
    let r = sample_row();
    let f = chain(vec![
        family("cf2"),
        condition(Some(qualifier(b"a")), Some(label("hit")), Some(block())),
    ]);
    assert_eq!(run(&f, &r), ["cf2:a@5000=x[hit]", "cf2:z@4000=yy[hit]"]);
}

// ---------------------------------------------------------------- sink

#[test]
fn sink_proto_example() {
    // Chain(FamilyRegex("A"), Interleave(All(), Chain(Label("foo"), Sink())),
    //       QualifierRegex("B")) from data.proto.
    let r = row(
        b"k",
        vec![
            cell("A", b"A", 1, b"w"),
            cell("A", b"B", 2, b"x"),
            cell("B", b"B", 4, b"z"),
        ],
    );
    let f = chain(vec![
        family("A"),
        interleave(vec![pass(), chain(vec![label("foo"), sink()])]),
        qualifier(b"B"),
    ]);
    assert_eq!(
        run(&f, &r),
        ["A:A@1=w[foo]", "A:B@2=x[foo]", "A:B@2=x[]"],
        "exactly the output drawn in the proto"
    );
    assert!(!compile(&f).is_block_all());
}

#[test]
fn sink_bypasses_later_filters_and_outputs_nothing_to_parent() {
    let r = sample_row();
    assert_eq!(run(&sink(), &r), all_of(&r), "top-level sink");
    // Everything after a sink in a chain sees an empty row.
    let f = chain(vec![family("cf2"), sink(), label("never")]);
    assert_eq!(run(&f, &r), ["cf2:a@5000=x[]", "cf2:z@4000=yy[]"]);
    // A sink branch passes nothing to the interleave: block_all after it changes nothing.
    let f = chain(vec![interleave(vec![sink(), family("cf1")]), block()]);
    assert_eq!(run(&f, &r), all_of(&r));
    assert!(!compile(&f).is_block_all());
    // A sink that can never be reached.
    assert!(compile(&chain(vec![block(), sink()])).is_block_all());
}

#[test]
fn sink_output_is_merged_in_bigtable_order() {
    let r = sample_row();
    let f = interleave(vec![
        chain(vec![family("cf2"), label("s"), sink()]),
        chain(vec![qualifier(b"a"), row_limit(1)]),
    ]);
    assert_eq!(
        run(&f, &r),
        ["cf1:a@3000=a3[]", "cf2:a@5000=x[s]", "cf2:z@4000=yy[s]"]
    );
}

#[test]
fn sink_in_condition_is_rejected() {
    for f in [
        condition(Some(sink()), Some(pass()), None),
        condition(Some(pass()), Some(sink()), None),
        condition(Some(pass()), None, Some(sink())),
        condition(
            Some(pass()),
            Some(chain(vec![pass(), interleave(vec![sink(), pass()])])),
            None,
        ),
        chain(vec![
            pass(),
            condition(Some(chain(vec![pass(), sink()])), None, None),
        ]),
    ] {
        assert_eq!(err(&f), FilterError::SinkInCondition, "{f:?}");
    }
}

// ---------------------------------------------------------------- row key regex

#[test]
fn row_key_regex_is_a_full_match() {
    let r = sample_row(); // key "row-1"
    assert_eq!(run(&key_regex(b"row-1"), &r), all_of(&r));
    assert_eq!(run(&key_regex(b"row-.*"), &r), all_of(&r));
    assert!(run(&key_regex(b"row"), &r).is_empty(), "prefix only");
    assert!(run(&key_regex(b"ow-1"), &r).is_empty(), "suffix only");
    assert!(run(&key_regex(b"row-1|x"), &r).len() == r.cells.len());
    assert!(
        run(&key_regex(b"x|row"), &r).is_empty(),
        "alternation anchored"
    );
}

#[test]
fn row_key_regex_dot_and_backslash_c() {
    let r = row(b"a\nb", vec![cell("f", b"q", 1, b"v")]);
    assert!(
        run(&key_regex(b"a.b"), &r).is_empty(),
        ". does not match \\n"
    );
    assert_eq!(run(&key_regex(b"a\\Cb"), &r).len(), 1, "\\C matches \\n");
    assert_eq!(run(&key_regex(b"\\C*"), &r).len(), 1);
    assert_eq!(
        run(&key_regex(b"(?s)a.b"), &r).len(),
        1,
        "(?s) lets . match \\n"
    );
    assert_eq!(run(&key_regex(b"a\\nb"), &r).len(), 1);
    let r = row(b"\xff\x00", vec![cell("f", b"q", 1, b"v")]);
    assert_eq!(
        run(&key_regex(b"\\C\\C"), &r).len(),
        1,
        "\\C matches any byte"
    );
    assert_eq!(
        run(&key_regex(b".."), &r).len(),
        1,
        ". matches non-UTF-8 bytes"
    );
    assert_eq!(
        run(&key_regex(b"\xff\\x00"), &r).len(),
        1,
        "raw Latin-1 byte"
    );
    assert!(
        run(&key_regex(b"."), &r).is_empty(),
        "one byte is one character"
    );
}

// ---------------------------------------------------------------- row sample

#[test]
fn row_sample_uses_the_sampler() {
    let r = sample_row();
    let f = compile(&sample(0.25));
    assert_eq!(f.apply_with_sampler(&r, &mut || 0.1).len(), r.cells.len());
    assert!(f.apply_with_sampler(&r, &mut || 0.25).is_empty());
    assert!(f.apply_with_sampler(&r, &mut || 0.9).is_empty());
    // The default sampler keeps roughly a quarter of the rows.
    let kept = (0..4000).filter(|_| !f.apply(&r).is_empty()).count();
    assert!((700..1300).contains(&kept), "kept {kept} of 4000");
}

#[test]
fn row_sample_draws_once_per_evaluation() {
    let r = sample_row();
    let f = compile(&interleave(vec![
        chain(vec![sample(0.5), label("one")]),
        chain(vec![sample(0.5), label("two")]),
    ]));
    let mut draws = [0.1, 0.9].into_iter();
    let out = f.apply_with_sampler(&r, &mut || draws.next().unwrap());
    assert!(out.iter().all(|c| c.labels == ["one"]));
    assert_eq!(out.len(), r.cells.len());
}

#[test]
fn row_sample_probability_must_be_strictly_between_0_and_1() {
    for p in [0.0, 1.0, -0.5, 1.5, f64::NAN, f64::INFINITY] {
        assert!(
            matches!(
                err(&sample(p)),
                FilterError::InvalidSampleProbability { .. }
            ),
            "{p}"
        );
    }
    compile(&sample(f64::MIN_POSITIVE));
    compile(&sample(0.999_999));
}

// ---------------------------------------------------------------- family regex

#[test]
fn family_name_regex() {
    let r = sample_row();
    assert_eq!(
        run(&family("cf2"), &r),
        ["cf2:a@5000=x[]", "cf2:z@4000=yy[]"]
    );
    assert!(run(&family("cf"), &r).is_empty(), "full match");
    assert_eq!(run(&family("cf[12]"), &r), all_of(&r));
    assert_eq!(run(&family(".*1"), &r).len(), 5);
}

#[test]
fn family_name_regex_rejects_colon() {
    for re in ["cf1:a", ":", "\\:", "[[:alpha:]]+", "\\x3a"] {
        let e = RowFilter::compile(&family(re));
        if re == "\\x3a" {
            // No ':' character in the pattern itself: allowed.
            assert!(e.is_ok());
        } else {
            assert!(
                matches!(e, Err(FilterError::ColonInFamilyRegex { .. })),
                "{re}"
            );
        }
    }
}

// ---------------------------------------------------------------- qualifier regex

#[test]
fn column_qualifier_regex_on_binary_qualifiers() {
    let r = row(
        b"k",
        vec![
            cell("f", b"", 1, b"empty"),
            cell("f", b"a\nb", 1, b"nl"),
            cell("f", b"ab", 1, b"ab"),
            cell("f", b"\x00\xff", 1, b"bin"),
        ],
    );
    assert_eq!(run(&qualifier(b""), &r), ["f:@1=empty[]"]);
    assert_eq!(run(&qualifier(b"a"), &r), Vec::<String>::new());
    assert_eq!(run(&qualifier(b"a.*"), &r), ["f:ab@1=ab[]"]);
    assert_eq!(
        run(&qualifier(b"a\\C*"), &r),
        ["f:a\\nb@1=nl[]", "f:ab@1=ab[]"]
    );
    assert_eq!(run(&qualifier(b"\\x00\\xff"), &r), ["f:\\x00\\xff@1=bin[]"]);
    assert_eq!(run(&qualifier(b"\\x00\xff"), &r), ["f:\\x00\\xff@1=bin[]"]);
    assert_eq!(run(&qualifier(b"[\\x00-\\x01][\x80-\xff]"), &r).len(), 1);
}

// ---------------------------------------------------------------- column range

fn column_range(
    fam: &str,
    start: Option<pb::column_range::StartQualifier>,
    end: Option<pb::column_range::EndQualifier>,
) -> pb::RowFilter {
    rf(F::ColumnRangeFilter(pb::ColumnRange {
        family_name: fam.to_string(),
        start_qualifier: start,
        end_qualifier: end,
    }))
}

#[test]
fn column_range_bounds() {
    use pb::column_range::{EndQualifier as E, StartQualifier as S};
    let r = sample_row(); // cf1: a a a b c, cf2: a z
    let quals = |f: pb::RowFilter| -> Vec<String> {
        compile(&f)
            .apply_with_sampler(&r, &mut || 0.0)
            .iter()
            .map(|c| format!("{}:{}", c.family, c.qualifier.escape_ascii()))
            .collect()
    };
    assert_eq!(
        quals(column_range("cf1", None, None)),
        ["cf1:a", "cf1:a", "cf1:a", "cf1:b", "cf1:c"]
    );
    assert_eq!(
        quals(column_range(
            "cf1",
            Some(S::StartQualifierClosed(b(b"b"))),
            None
        )),
        ["cf1:b", "cf1:c"]
    );
    assert_eq!(
        quals(column_range(
            "cf1",
            Some(S::StartQualifierOpen(b(b"b"))),
            None
        )),
        ["cf1:c"]
    );
    assert_eq!(
        quals(column_range(
            "cf1",
            None,
            Some(E::EndQualifierOpen(b(b"b")))
        )),
        ["cf1:a", "cf1:a", "cf1:a"]
    );
    assert_eq!(
        quals(column_range(
            "cf1",
            None,
            Some(E::EndQualifierClosed(b(b"b")))
        )),
        ["cf1:a", "cf1:a", "cf1:a", "cf1:b"]
    );
    assert_eq!(
        quals(column_range(
            "cf2",
            Some(S::StartQualifierOpen(b(b"a"))),
            Some(E::EndQualifierClosed(b(b"z")))
        )),
        ["cf2:z"]
    );
    // An open end at the empty string is infinity (as Bigtable reads ranges).
    assert_eq!(
        quals(column_range("cf2", None, Some(E::EndQualifierOpen(b(b""))))),
        ["cf2:a", "cf2:z"]
    );
    // A closed end at the empty string only matches the empty qualifier.
    assert!(
        quals(column_range(
            "cf2",
            None,
            Some(E::EndQualifierClosed(b(b"")))
        ))
        .is_empty()
    );
    // Reversed and empty ranges match nothing.
    let reversed = column_range(
        "cf1",
        Some(S::StartQualifierClosed(b(b"c"))),
        Some(E::EndQualifierClosed(b(b"a"))),
    );
    assert!(quals(reversed.clone()).is_empty());
    assert!(compile(&reversed).is_block_all());
    let empty = column_range(
        "cf1",
        Some(S::StartQualifierOpen(b(b"b"))),
        Some(E::EndQualifierClosed(b(b"b"))),
    );
    assert!(quals(empty).is_empty());
    // Only the named family.
    assert!(quals(column_range("cf3", None, None)).is_empty());
}

#[test]
fn column_range_requires_family() {
    assert_eq!(
        err(&column_range("", None, None)),
        FilterError::MissingColumnRangeFamily
    );
}

// ---------------------------------------------------------------- timestamp range

#[test]
fn timestamp_range_is_half_open_with_zero_end_meaning_infinity() {
    let r = sample_row(); // timestamps 3000 2000 1000 2000 1000 5000 4000
    let stamps = |f: pb::RowFilter| -> Vec<i64> {
        compile(&f)
            .apply_with_sampler(&r, &mut || 0.0)
            .iter()
            .map(|c| c.timestamp_micros)
            .collect()
    };
    assert_eq!(stamps(ts_range(2000, 4000)), [3000, 2000, 2000]);
    assert_eq!(stamps(ts_range(4000, 0)), [5000, 4000]);
    assert_eq!(
        stamps(ts_range(0, 0)),
        [3000, 2000, 1000, 2000, 1000, 5000, 4000]
    );
    assert_eq!(stamps(ts_range(0, 1000)), Vec::<i64>::new());
    assert!(stamps(ts_range(3000, 3000)).is_empty());
    assert!(compile(&ts_range(3000, 2000)).is_block_all());
    assert!(!compile(&ts_range(3000, 0)).is_block_all());
}

#[test]
fn timestamp_range_bounds_are_microseconds() {
    let r = row(
        b"k",
        vec![cell("f", b"q", 7000, b"a"), cell("f", b"q", 6999, b"b")],
    );
    let out = compile(&ts_range(7000, 7001)).apply(&r);
    assert_eq!(
        out.iter().map(|c| c.timestamp_micros).collect::<Vec<_>>(),
        [7000]
    );
    let out = compile(&ts_range(1, 7000)).apply(&r);
    assert_eq!(
        out.iter().map(|c| c.timestamp_micros).collect::<Vec<_>>(),
        [6999]
    );
}

#[test]
fn bounded_apply_stops_filters_that_multiply_rows() {
    let pass = rf(F::PassAllFilter(true));
    // Within the 20,480-byte limit, one interleave can copy every cell thousands of times.
    let wide = rf(F::Interleave(pb::row_filter::Interleave {
        filters: vec![pass.clone(); 3000],
    }));
    let compiled = compile(&wide);
    let r = row(
        b"k",
        vec![cell("f", b"q", 1000, b"v"), cell("f", b"r", 1000, b"w")],
    );
    assert_eq!(
        compiled.apply_bounded(&r, 1000).unwrap_err(),
        FilterError::OutputTooLarge { max_copies: 1000 }
    );
    assert_eq!(compiled.apply_bounded(&r, 6000).unwrap().len(), 6000);
    assert_eq!(compiled.apply(&r).len(), 6000);
    let sink = rf(F::Chain(pb::row_filter::Chain {
        filters: vec![rf(F::Sink(true)), pass.clone()],
    }));
    assert_eq!(compile(&sink).apply_bounded(&r, 2).unwrap().len(), 2);
    assert!(compile(&sink).apply_bounded(&r, 1).is_err());
}

#[test]
fn empty_row_key_regex_is_rejected() {
    assert_eq!(
        err(&rf(F::RowKeyRegexFilter(Bytes::new()))),
        FilterError::EmptyRegex {
            field: "row_key_regex_filter"
        }
    );
}

// ---------------------------------------------------------------- value regex / range

#[test]
fn value_regex_full_match() {
    let r = row(
        b"k",
        vec![
            cell("f", b"1", 1, b"a"),
            cell("f", b"2", 1, b"ab"),
            cell("f", b"3", 1, b"a\n"),
            cell("f", b"4", 1, b""),
            cell("f", b"5", 1, b"\xe9t\xe9"),
        ],
    );
    let quals = |re: &[u8]| -> Vec<String> {
        compile(&value(re))
            .apply_with_sampler(&r, &mut || 0.0)
            .iter()
            .map(|c| c.qualifier.escape_ascii().to_string())
            .collect()
    };
    assert_eq!(quals(b"a"), ["1"], "`a` must not match `ab`");
    assert_eq!(quals(b"a."), ["2"], "`.` does not match \\n");
    assert_eq!(quals(b"a\\C"), ["2", "3"]);
    assert_eq!(quals(b""), ["4"]);
    assert_eq!(quals(b"a?"), ["1", "4"]);
    assert_eq!(quals(b"\xe9t\xe9"), ["5"], "Latin-1 literal bytes");
    assert_eq!(quals(b"\\xe9.\\x{e9}"), ["5"]);
    assert_eq!(quals(b"..."), ["5"], "each byte is one character");
    assert_eq!(
        quals(b"a$"),
        ["1"],
        "$ is end of text, not before a final \\n"
    );
    assert_eq!(quals(b"(?m)a$\\n"), ["3"]);
}

fn value_range(
    start: Option<pb::value_range::StartValue>,
    end: Option<pb::value_range::EndValue>,
) -> pb::RowFilter {
    rf(F::ValueRangeFilter(pb::ValueRange {
        start_value: start,
        end_value: end,
    }))
}

#[test]
fn value_range_bounds() {
    use pb::value_range::{EndValue as E, StartValue as S};
    let r = row(
        b"k",
        vec![
            cell("f", b"1", 1, b""),
            cell("f", b"2", 1, b"a"),
            cell("f", b"3", 1, b"b"),
            cell("f", b"4", 1, b"b\x00"),
            cell("f", b"5", 1, b"c"),
        ],
    );
    let quals = |f: pb::RowFilter| -> String {
        compile(&f)
            .apply_with_sampler(&r, &mut || 0.0)
            .iter()
            .map(|c| c.qualifier.escape_ascii().to_string())
            .collect()
    };
    assert_eq!(quals(value_range(None, None)), "12345");
    assert_eq!(
        quals(value_range(Some(S::StartValueClosed(b(b"b"))), None)),
        "345"
    );
    assert_eq!(
        quals(value_range(Some(S::StartValueOpen(b(b"b"))), None)),
        "45"
    );
    assert_eq!(
        quals(value_range(Some(S::StartValueOpen(b(b""))), None)),
        "2345"
    );
    assert_eq!(
        quals(value_range(None, Some(E::EndValueOpen(b(b"b"))))),
        "12"
    );
    assert_eq!(
        quals(value_range(None, Some(E::EndValueClosed(b(b"b"))))),
        "123"
    );
    assert_eq!(
        quals(value_range(None, Some(E::EndValueOpen(b(b""))))),
        "12345"
    );
    assert_eq!(
        quals(value_range(None, Some(E::EndValueClosed(b(b""))))),
        "1"
    );
    assert_eq!(
        quals(value_range(
            Some(S::StartValueClosed(b(b"a"))),
            Some(E::EndValueOpen(b(b"c")))
        )),
        "234"
    );
    let reversed = value_range(
        Some(S::StartValueClosed(b(b"c"))),
        Some(E::EndValueOpen(b(b"a"))),
    );
    assert_eq!(quals(reversed.clone()), "");
    assert!(compile(&reversed).is_block_all());
}

// ---------------------------------------------------------------- limits and offsets

#[test]
fn cells_per_row_offset_and_limit() {
    let r = sample_row();
    let all = all_of(&r);
    assert_eq!(run(&row_offset(0), &r), all);
    assert_eq!(run(&row_offset(2), &r), all[2..]);
    assert!(run(&row_offset(7), &r).is_empty());
    assert!(run(&row_offset(i32::MAX), &r).is_empty());
    assert_eq!(run(&row_limit(3), &r), all[..3]);
    assert_eq!(run(&row_limit(100), &r), all);
    assert!(run(&row_limit(0), &r).is_empty());
    assert!(compile(&row_limit(0)).is_block_all());
    assert!(!compile(&row_offset(0)).is_block_all());
    assert_eq!(
        run(&chain(vec![row_offset(1), row_limit(2)]), &r),
        all[1..3]
    );
}

#[test]
fn cells_per_column_limit_counts_per_family_and_qualifier() {
    let r = sample_row();
    assert_eq!(
        run(&column_limit(1), &r),
        [
            "cf1:a@3000=a3[]",
            "cf1:b@2000=b2[]",
            "cf1:c@1000=[]",
            "cf2:a@5000=x[]",
            "cf2:z@4000=yy[]"
        ]
    );
    assert_eq!(run(&column_limit(2), &r).len(), 6);
    assert!(run(&column_limit(0), &r).is_empty());
    assert!(compile(&column_limit(0)).is_block_all());
    // Same qualifier in two families are two columns.
    let r = row(
        b"k",
        vec![
            cell("x", b"q", 2, b""),
            cell("x", b"q", 1, b""),
            cell("y", b"q", 2, b""),
            cell("y", b"q", 1, b""),
        ],
    );
    assert_eq!(run(&column_limit(1), &r), ["x:q@2=[]", "y:q@2=[]"]);
}

#[test]
fn negative_counts_are_rejected() {
    for (f, field) in [
        (row_offset(-1), "cells_per_row_offset_filter"),
        (row_limit(-1), "cells_per_row_limit_filter"),
        (column_limit(i32::MIN), "cells_per_column_limit_filter"),
    ] {
        assert!(matches!(err(&f), FilterError::NegativeCount { field: got, .. } if got == field));
    }
}

// ---------------------------------------------------------------- transformers

#[test]
fn strip_value_transformer_empties_values() {
    let r = sample_row();
    let out = compile(&strip()).apply(&r);
    assert_eq!(out.len(), r.cells.len());
    assert!(out.iter().all(|c| c.value.is_empty()));
    assert!(
        out.iter()
            .zip(&r.cells)
            .all(|(o, i)| o.order_key() == i.order_key())
    );
    // Filters after the strip see empty values.
    assert_eq!(
        run(&chain(vec![strip(), value(b"")]), &r).len(),
        r.cells.len()
    );
}

#[test]
fn apply_label_transformer_labels_cells() {
    let r = sample_row();
    let out = compile(&label("my-label-1")).apply(&r);
    assert!(out.iter().all(|c| c.labels == ["my-label-1"]));
    compile(&label("a"));
    compile(&label("0123456789abcde"));
    compile(&label("-"));
}

#[test]
fn invalid_labels_are_rejected() {
    for l in [
        "",
        "Upper",
        "under_score",
        "sp ace",
        "0123456789abcdef",
        "é",
        "a:b",
    ] {
        assert_eq!(
            err(&label(l)),
            FilterError::InvalidLabel {
                label: l.to_string()
            },
            "{l:?}"
        );
    }
}

#[test]
fn a_chain_may_contain_only_one_labelled_sub_filter() {
    assert_eq!(
        err(&chain(vec![label("a"), pass(), label("b")])),
        FilterError::MultipleLabelsInChain {
            first: 0,
            second: 2
        }
    );
    // Labels nested in different sub-filters of one chain count too.
    assert!(matches!(
        err(&chain(vec![
            interleave(vec![label("a"), pass()]),
            condition(Some(pass()), Some(label("b")), None),
        ])),
        FilterError::MultipleLabelsInChain { .. }
    ));
    // Deep inside, a chain of chains each with a label.
    assert!(matches!(
        err(&interleave(vec![
            pass(),
            chain(vec![chain(vec![label("a"), pass()]), label("b")]),
        ])),
        FilterError::MultipleLabelsInChain { .. }
    ));
    // Allowed: one labelled sub-filter per chain; labels side by side in an interleave;
    // a label in a condition predicate (its output never reaches the client).
    compile(&chain(vec![label("a"), pass()]));
    compile(&chain(vec![
        interleave(vec![label("a"), label("b")]),
        row_limit(1),
    ]));
    compile(&chain(vec![
        condition(Some(label("p")), Some(pass()), None),
        label("b"),
    ]));
    let f = chain(vec![
        condition(Some(label("p")), Some(pass()), None),
        label("b"),
    ]);
    assert!(
        compile(&f)
            .apply(&sample_row())
            .iter()
            .all(|c| c.labels == ["b"])
    );
}

// ---------------------------------------------------------------- structural validation

#[test]
fn chain_and_interleave_need_two_sub_filters() {
    for n in 0..2 {
        let subs = vec![pass(); n];
        assert_eq!(
            err(&chain(subs.clone())),
            FilterError::TooFewSubFilters {
                kind: "chain",
                count: n
            }
        );
        assert_eq!(
            err(&interleave(subs)),
            FilterError::TooFewSubFilters {
                kind: "interleave",
                count: n
            }
        );
    }
    // Also when nested.
    assert!(matches!(
        err(&condition(Some(pass()), Some(chain(vec![pass()])), None)),
        FilterError::TooFewSubFilters { .. }
    ));
}

#[test]
fn boolean_filters_must_be_true() {
    for (f, field) in [
        (rf(F::PassAllFilter(false)), "pass_all_filter"),
        (rf(F::BlockAllFilter(false)), "block_all_filter"),
        (rf(F::Sink(false)), "sink"),
        (
            rf(F::StripValueTransformer(false)),
            "strip_value_transformer",
        ),
    ] {
        assert_eq!(err(&f), FilterError::FlagFalse { field });
        assert_eq!(
            err(&chain(vec![pass(), f.clone()])),
            FilterError::FlagFalse { field }
        );
    }
}

/// `levels` composites nested in one another around a pass_all.
fn nested(levels: usize, wrap: fn(pb::RowFilter) -> pb::RowFilter) -> pb::RowFilter {
    (0..levels).fold(pass(), |f, _| wrap(f))
}

#[test]
fn nesting_deeper_than_20_is_rejected() {
    let wraps: [fn(pb::RowFilter) -> pb::RowFilter; 3] = [
        |f| chain(vec![f, pass()]),
        |f| interleave(vec![block(), f]),
        |f| condition(Some(pass()), Some(f), None),
    ];
    for wrap in wraps {
        let ok = nested(MAX_FILTER_DEPTH, wrap);
        assert_eq!(run(&ok, &sample_row()), all_of(&sample_row()));
        assert_eq!(
            err(&nested(MAX_FILTER_DEPTH + 1, wrap)),
            FilterError::TooDeep {
                max: MAX_FILTER_DEPTH
            }
        );
    }
    // Very deep filters are rejected without exhausting the stack.
    let deep = nested(5000, |f| chain(vec![f, pass()]));
    assert!(matches!(err(&deep), FilterError::TooDeep { .. }));
    // Predicates count as nesting as well.
    let in_predicate =
        (0..=MAX_FILTER_DEPTH).fold(pass(), |f, _| condition(Some(f), Some(pass()), None));
    assert!(matches!(err(&in_predicate), FilterError::TooDeep { .. }));
}

#[test]
fn filters_larger_than_20480_bytes_are_rejected() {
    // A value regex field costs 1 byte of tag plus its length varint (3 bytes here).
    let fits = value(&vec![b'a'; MAX_FILTER_SIZE_BYTES - 4]);
    assert_eq!(prost::Message::encoded_len(&fits), MAX_FILTER_SIZE_BYTES);
    compile(&fits);
    let too_big = value(&vec![b'a'; MAX_FILTER_SIZE_BYTES - 3]);
    assert_eq!(
        err(&too_big),
        FilterError::TooLarge {
            size: MAX_FILTER_SIZE_BYTES + 1,
            max: MAX_FILTER_SIZE_BYTES
        }
    );
    let many = chain(vec![family("cf1"); 3000]);
    assert!(matches!(err(&many), FilterError::TooLarge { .. }));
}

#[test]
fn errors_name_the_problem() {
    let msg = err(&chain(vec![pass()])).to_string();
    assert!(msg.contains("chain") && msg.contains("two"), "{msg}");
    let msg = err(&value(b"(")).to_string();
    assert!(msg.contains("value_regex_filter"), "{msg}");
    let msg = err(&label("BAD")).to_string();
    assert!(msg.contains("[a-z0-9\\-]+") && msg.contains("BAD"), "{msg}");
}

// ---------------------------------------------------------------- regex dialect

fn matches(re: &[u8], input: &[u8]) -> bool {
    compile_regex("value_regex_filter", re)
        .unwrap_or_else(|e| panic!("{}: {e}", re.escape_ascii()))
        .is_match(input)
}

fn rejects(re: &[u8]) -> bool {
    compile_regex("value_regex_filter", re).is_err()
}

#[test]
fn re2_literal_escapes() {
    assert!(matches(b"\\Q.*+?\\E", b".*+?"));
    assert!(!matches(b"\\Q.*\\E", b"ab"));
    assert!(
        matches(b"\\Qa.b", b"a.b"),
        "\\Q runs to the end without \\E"
    );
    assert!(matches(b"\\101\\0\\12", b"A\x00\n"), "octal escapes");
    assert!(rejects(b"\\1"), "backreferences are not supported");
    assert!(rejects(b"(a)\\1"));
    assert!(matches(b"\\x41\\x{42}\\x{0043}", b"ABC"));
    assert!(matches(b"\\x{ff}\\377", b"\xff\xff"));
    assert!(
        rejects(b"\\x{100}"),
        "Latin-1 mode rejects code points above 0xFF"
    );
    assert!(rejects(b"\\400"));
    assert!(rejects(b"[a-\\x{100}]"));
    assert!(matches(b"\\a\\f\\t\\n\\r\\v", b"\x07\x0c\t\n\r\x0b"));
    assert!(
        matches(b"\\.\\*\\<\\>\\-\\ ", b".*<>- "),
        "escaped punctuation"
    );
    assert!(matches(b"\\\\", b"\\"));
    for bad in [
        &b"\\"[..],
        b"\\q",
        b"\\E",
        b"\\8",
        b"\\x4",
        b"\\x{}",
        b"\\x{110000}",
        b"\\\xe9",
    ] {
        assert!(rejects(bad), "{}", bad.escape_ascii());
    }
}

#[test]
fn re2_perl_and_posix_classes() {
    assert!(matches(b"\\d+", b"0189"));
    assert!(!matches(b"\\d", b"a"));
    assert!(matches(b"\\w+", b"az_AZ09"));
    assert!(matches(b"\\s+", b" \t\n\r\x0c"));
    assert!(!matches(b"\\s", b"\x0b"), "RE2's \\s has no \\v");
    assert!(matches(b"\\S", b"\x0b"));
    assert!(matches(b"[[:space:]]", b"\x0b"), "[[:space:]] has \\v");
    assert!(matches(b"[[:alpha:][:digit:]]+", b"aZ9"));
    assert!(matches(b"[[:^alpha:]]", b"1"));
    assert!(!matches(b"[[:^alpha:]]", b"a"));
    assert!(matches(b"[[:word:]]+", b"a_1"));
    assert!(rejects(b"[[:nope:]]"));
    assert!(matches(b"[\\d-z]+", b"1-z"), "- after a class is a literal");
    assert!(
        matches(b"\\pL\\p{Greek}?", b"\xe9"),
        "Latin-1 letter via \\pL"
    );
    assert!(!matches(b"\\pL", b"1"));
    assert!(matches(b"\\PL", b"1"));
    assert!(matches(b"\\p{^L}", b"1"));
    assert!(matches(b"[\\pN]", b"5"));
    assert!(rejects(b"\\p{NoSuchClass}"));
    assert!(rejects(b"\\pm"), "RE2 class names are case-sensitive");
    assert!(rejects(b"\\p{greek}"));
    assert!(rejects(b"\\p{Letter}"), "long category names are not RE2");
    assert!(matches(b"\\p{Latin}+", b"a\xe9"));
    assert!(matches(b"\\p{Any}", b"\n"));
    assert!(!matches(b"\\d", b"\xb2"), "\\d is ASCII only");
}

#[test]
fn re2_bracket_classes() {
    assert!(matches(b"[]a]+", b"]a]"), "leading ] is a literal");
    assert!(matches(b"[^]a]", b"b"));
    assert!(matches(b"[a-]+", b"a-"));
    assert!(matches(b"[-a]+", b"-a"));
    assert!(matches(b"[[]", b"["), "[ inside a class is a literal");
    assert!(matches(b"[a&&b]+", b"a&b"), "&& is not an operator in RE2");
    assert!(matches(b"[a~~b]+", b"~"));
    assert!(matches(b"[^a]", b"\n"), "negated classes match \\n");
    assert!(matches(b"[\\x00-\\xff]", b"\xff"));
    assert!(
        matches(b"[\x80-\xff]", b"\xe9"),
        "raw Latin-1 bytes in a class"
    );
    assert!(matches(b"[(){}|*+?.$^]+", b"(){}|*+?.$^"));
    assert!(matches(b"[\\]\\\\]+", b"]\\"));
    assert!(rejects(b"[z-a]"));
    assert!(rejects(b"[a-\\d]"));
    assert!(rejects(b"[abc"));
    assert!(rejects(b"[]"));
    assert!(rejects(b"[\\C]"), "\\C is not allowed in a class");
    assert!(rejects(b"[\\b]"));
}

#[test]
fn re2_repetitions_and_braces() {
    assert!(matches(b"a{2}", b"aa"));
    assert!(matches(b"a{2,}", b"aaaa"));
    assert!(matches(b"a{2,3}?", b"aaa"));
    assert!(!matches(b"a{2,3}", b"a"));
    assert!(matches(b"a{1000}", &[b'a'; 1000]));
    assert!(rejects(b"a{1001}"));
    assert!(rejects(b"a{3,2}"));
    assert!(matches(b"((a{10}){10}){10}", &[b'a'; 1000]));
    assert!(
        rejects(b"((a{10}){10}){11}"),
        "nested counts multiply past 1000"
    );
    assert!(rejects(b"(a{2}){501}"));
    assert!(rejects(b"(a{2,}){501,}"));
    assert!(
        matches(b"(a*){1000}", b"aa"),
        "only counted repetitions count"
    );
    assert!(matches(b"a{", b"a{"), "an unfinished brace is a literal");
    assert!(matches(b"a{,2}", b"a{,2}"), "{{,n}} is a literal in RE2");
    assert!(matches(b"a{x}", b"a{x}"));
    assert!(matches(b"}", b"}"));
    assert!(matches(b"a*?b+?c??", b"aabbc"));
    for bad in [
        &b"a**"[..],
        b"a*+",
        b"a+*",
        b"a{2}{3}",
        b"a{2}*",
        b"a??*",
        b"*a",
        b"a|*",
    ] {
        assert!(rejects(bad), "{}", bad.escape_ascii());
    }
}

#[test]
fn re2_groups_and_flags() {
    assert!(matches(b"(?i)abc", b"AbC"));
    assert!(matches(b"(?i:a)b", b"Ab"));
    assert!(!matches(b"(?i:a)b", b"AB"));
    assert!(matches(b"(?s:.)", b"\n"));
    assert!(
        matches(b"(?U)a+", b"aaa"),
        "full match regardless of greediness"
    );
    assert!(matches(b"(?i-s:a.)", b"Ab"));
    assert!(matches(b"(?P<n>a)(?<m>b)", b"ab"));
    assert!(matches(b"(a|b)*", b"abba"));
    assert!(matches(b"(?:)", b""));
    assert!(
        matches(b"(?P<n>a)|(?P<n>b)", b"b"),
        "RE2 accepts duplicate names"
    );
    for bad in [
        &b"(a"[..],
        b"a)",
        b")(",
        b"a)|(b",
        b"(?x)a",
        b"(?u)a",
        b"(?=a)",
        b"(?!a)",
        b"(?<=a)",
        b"(?<!a)",
        b"(?-)a",
        b"(?i-)a",
        b"(?P=n)",
        b"(?P<>a)",
        b"(?P<a-b>a)",
        b"(?#comment)",
    ] {
        assert!(rejects(bad), "{}", bad.escape_ascii());
    }
}

#[test]
fn re2_case_folding() {
    assert!(
        matches(b"(?i)\xe9", b"\xc9"),
        "Latin-1 letters fold under (?i)"
    );
    assert!(matches(b"(?i)[\xe0-\xe9]", b"\xc9"));
    assert!(
        !matches(b"(?i)\xd7", b"\xf7"),
        "0xD7 and 0xF7 are not letters"
    );
    assert!(!matches(b"\xe9", b"\xc9"));
    assert!(!matches(b"(?i)[^a]", b"A"), "fold first, then negate");
    assert!(!matches(b"(?i)[^\xe9]", b"\xc9"));
    assert!(
        matches(b"(?i)\\p{Lu}", b"\xff"),
        "0xFF folds to U+0178, an Lu"
    );
    assert!(
        !matches(b"(?i)\\P{Lu}", b"\xb5"),
        "0xB5 folds to U+039C, an Lu"
    );
    assert!(matches(b"(?i:a)(?-i:b)", b"Ab"));
    assert!(!matches(b"(?i:a)(?-i:b)", b"AB"));
    assert!(matches(b"((?i)a)b", b"Ab"), "flags end with their group");
    assert!(!matches(b"((?i)a)b", b"AB"));
}

#[test]
fn re2_repetition_after_flags_applies_to_previous_atom() {
    assert!(matches(b"a(?i)*", b""), "a(?i)* is a*");
    assert!(matches(b"a(?i)*", b"aaa"));
    assert!(
        matches(b"b{2}(?i)?", b""),
        "b{{2}}(?i)? is (b{{2}})?, not a lazy b{{2}}"
    );
    assert!(matches(b"b{2}(?i)?", b"bb"));
    assert!(
        matches(b"a*(?i)+", b"aa"),
        "a stacked repetition is allowed after flags"
    );
    assert!(matches(b"a{2}(?s){3}", &[b'a'; 6]));
    assert!(
        matches(b"a\\Q\\E*", b"aaa"),
        "an empty quote is transparent"
    );
    assert!(rejects(b"(?i)*"), "missing argument");
    assert!(rejects(b"a|(?i)*"));
}

#[test]
fn re2_anchors_and_boundaries() {
    assert!(matches(b"^abc$", b"abc"));
    assert!(matches(b"\\Aabc\\z", b"abc"));
    assert!(matches(b"a\\b b", b"a b"));
    assert!(!matches(b"a\\bb", b"ab"));
    assert!(matches(b"a\\Bb", b"ab"));
    assert!(matches(b"(?m)a$\\n^b", b"a\nb"));
    assert!(
        !matches(b"a|b", b"ab"),
        "alternation is inside the full-match anchors"
    );
    assert!(rejects(b"\\Z"));
}

#[test]
fn invalid_regexes_are_rejected_for_every_regex_field() {
    for (f, field) in [
        (key_regex(b"("), "row_key_regex_filter"),
        (family("["), "family_name_regex_filter"),
        (qualifier(b"a**"), "column_qualifier_regex_filter"),
        (value(b"\\"), "value_regex_filter"),
    ] {
        assert!(
            matches!(err(&f), FilterError::InvalidRegex { field: got, .. } if got == field),
            "{field}"
        );
    }
}

// ---------------------------------------------------------------- misc

#[test]
fn unsorted_input_is_sorted_first() {
    let mut r = sample_row();
    r.cells.reverse();
    let out = compile(&column_limit(1)).apply(&r);
    assert_eq!(show(&out)[0], "cf1:a@3000=a3[]");
    assert!(out.is_sorted_by(|a, b| cell_order(a, b) != Ordering::Greater));
}

#[test]
fn row_filter_is_send_sync_clone() {
    fn check<T: Send + Sync + Clone + std::fmt::Debug>() {}
    check::<RowFilter>();
}

#[test]
fn default_sampler_is_uniform_in_unit_interval() {
    let draws: Vec<f64> = (0..10_000).map(|_| default_sample()).collect();
    assert!(draws.iter().all(|d| (0.0..1.0).contains(d)));
    let mean = draws.iter().sum::<f64>() / draws.len() as f64;
    assert!((0.45..0.55).contains(&mean), "mean {mean}");
}

// ---------------------------------------------------------------- property tests

/// The subset of the filter language the reference evaluator covers.
#[derive(Debug, Clone)]
enum Ref {
    Pass,
    Block,
    Chain(Vec<Ref>),
    Interleave(Vec<Ref>),
    RowLimit(i32),
    RowOffset(i32),
    ColumnLimit(i32),
    Family(&'static str),
    ColumnRange {
        family: &'static str,
        start: Option<(Vec<u8>, bool)>,
        end: Option<(Vec<u8>, bool)>,
    },
    Timestamps(i64, i64),
    ValueRange {
        start: Option<(Vec<u8>, bool)>,
        end: Option<(Vec<u8>, bool)>,
    },
    Strip,
    Label(&'static str),
}

impl Ref {
    fn to_pb(&self) -> pb::RowFilter {
        use pb::column_range::{EndQualifier as CE, StartQualifier as CS};
        use pb::value_range::{EndValue as VE, StartValue as VS};
        match self {
            Ref::Pass => pass(),
            Ref::Block => block(),
            Ref::Chain(fs) => chain(fs.iter().map(Ref::to_pb).collect()),
            Ref::Interleave(fs) => interleave(fs.iter().map(Ref::to_pb).collect()),
            Ref::RowLimit(n) => row_limit(*n),
            Ref::RowOffset(n) => row_offset(*n),
            Ref::ColumnLimit(n) => column_limit(*n),
            Ref::Family(f) => family(f),
            Ref::ColumnRange { family, start, end } => column_range(
                family,
                start.as_ref().map(|(q, closed)| {
                    if *closed {
                        CS::StartQualifierClosed(b(q))
                    } else {
                        CS::StartQualifierOpen(b(q))
                    }
                }),
                end.as_ref().map(|(q, closed)| {
                    if *closed {
                        CE::EndQualifierClosed(b(q))
                    } else {
                        CE::EndQualifierOpen(b(q))
                    }
                }),
            ),
            Ref::Timestamps(s, e) => ts_range(*s, *e),
            Ref::ValueRange { start, end } => value_range(
                start.as_ref().map(|(v, closed)| {
                    if *closed {
                        VS::StartValueClosed(b(v))
                    } else {
                        VS::StartValueOpen(b(v))
                    }
                }),
                end.as_ref().map(|(v, closed)| {
                    if *closed {
                        VE::EndValueClosed(b(v))
                    } else {
                        VE::EndValueOpen(b(v))
                    }
                }),
            ),
            Ref::Strip => strip(),
            Ref::Label(l) => label(l),
        }
    }

    fn has_label(&self) -> bool {
        match self {
            Ref::Label(_) => true,
            Ref::Chain(fs) | Ref::Interleave(fs) => fs.iter().any(Ref::has_label),
            _ => false,
        }
    }

    /// The one rule of the subset the generator does not avoid by construction.
    fn valid(&self) -> bool {
        match self {
            Ref::Chain(fs) => {
                fs.iter().filter(|f| f.has_label()).count() <= 1 && fs.iter().all(Ref::valid)
            }
            Ref::Interleave(fs) => fs.iter().all(Ref::valid),
            _ => true,
        }
    }

    /// Straight from the proto's definitions, on a sorted list of cells.
    fn eval(&self, cells: Vec<Cell>) -> Vec<Cell> {
        let in_range =
            |v: &[u8], start: &Option<(Vec<u8>, bool)>, end: &Option<(Vec<u8>, bool)>| {
                let lower_ok = match start {
                    None => true,
                    Some((s, true)) => v >= &s[..],
                    Some((s, false)) => v > &s[..],
                };
                let upper_ok = match end {
                    None => true,
                    Some((e, false)) if e.is_empty() => true, // open "" is infinity
                    Some((e, true)) => v <= &e[..],
                    Some((e, false)) => v < &e[..],
                };
                lower_ok && upper_ok
            };
        match self {
            Ref::Pass => cells,
            Ref::Block => vec![],
            Ref::Chain(fs) => fs.iter().fold(cells, |acc, f| f.eval(acc)),
            Ref::Interleave(fs) => {
                let mut out: Vec<Cell> = fs.iter().flat_map(|f| f.eval(cells.clone())).collect();
                out.sort_by_key(|c| {
                    (
                        c.family.clone(),
                        c.qualifier.to_vec(),
                        std::cmp::Reverse(c.timestamp_micros),
                    )
                });
                out
            }
            Ref::RowLimit(n) => cells.into_iter().take(*n as usize).collect(),
            Ref::RowOffset(n) => cells.into_iter().skip(*n as usize).collect(),
            Ref::ColumnLimit(n) => {
                let mut seen = std::collections::HashMap::<(String, Vec<u8>), i32>::new();
                cells
                    .into_iter()
                    .filter(|c| {
                        let k = seen
                            .entry((c.family.clone(), c.qualifier.to_vec()))
                            .or_default();
                        *k += 1;
                        *k <= *n
                    })
                    .collect()
            }
            Ref::Family(f) => cells.into_iter().filter(|c| c.family == *f).collect(),
            Ref::ColumnRange { family, start, end } => cells
                .into_iter()
                .filter(|c| c.family == *family && in_range(&c.qualifier, start, end))
                .collect(),
            Ref::Timestamps(s, e) => cells
                .into_iter()
                .filter(|c| c.timestamp_micros >= *s && (*e == 0 || c.timestamp_micros < *e))
                .collect(),
            Ref::ValueRange { start, end } => cells
                .into_iter()
                .filter(|c| in_range(&c.value, start, end))
                .collect(),
            Ref::Strip => cells
                .into_iter()
                .map(|c| Cell {
                    value: Bytes::new(),
                    ..c
                })
                .collect(),
            Ref::Label(l) => cells
                .into_iter()
                .map(|mut c| {
                    c.labels.push(l.to_string());
                    c
                })
                .collect(),
        }
    }
}

const FAMILIES: [&str; 3] = ["a", "b", "c"];
const QUALIFIERS: [&[u8]; 5] = [b"", b"q", b"q\n", b"r", b"\xffz"];
const VALUES: [&[u8]; 5] = [b"", b"v", b"v\n", b"w", b"\x00\xff"];

fn arb_row() -> impl Strategy<Value = Row> {
    let cell = (
        0..FAMILIES.len(),
        0..QUALIFIERS.len(),
        0i64..5,
        0..VALUES.len(),
    )
        .prop_map(|(f, q, t, v)| cell(FAMILIES[f], QUALIFIERS[q], t * 1000, VALUES[v]));
    (
        prop::collection::vec(cell, 0..14),
        prop::collection::vec(any::<u8>(), 1..4),
    )
        .prop_map(|(mut cells, key)| {
            cells.sort_by(cell_order);
            cells.dedup_by(|a, b| a.order_key() == b.order_key());
            Row {
                key: Bytes::from(key),
                cells,
            }
        })
}

fn arb_bound(values: &'static [&'static [u8]]) -> impl Strategy<Value = Option<(Vec<u8>, bool)>> {
    prop::option::of(
        (0..values.len(), any::<bool>()).prop_map(move |(i, c)| (values[i].to_vec(), c)),
    )
}

fn arb_ref() -> impl Strategy<Value = Ref> {
    let leaf = prop_oneof![
        Just(Ref::Pass),
        Just(Ref::Block),
        (0i32..5).prop_map(Ref::RowLimit),
        (0i32..5).prop_map(Ref::RowOffset),
        (0i32..4).prop_map(Ref::ColumnLimit),
        (0..FAMILIES.len()).prop_map(|i| Ref::Family(FAMILIES[i])),
        (
            0..FAMILIES.len(),
            arb_bound(&QUALIFIERS),
            arb_bound(&QUALIFIERS)
        )
            .prop_map(|(f, start, end)| Ref::ColumnRange {
                family: FAMILIES[f],
                start,
                end
            }),
        (0i64..6, 0i64..6).prop_map(|(s, e)| Ref::Timestamps(s * 1000, e * 1000)),
        (arb_bound(&VALUES), arb_bound(&VALUES))
            .prop_map(|(start, end)| Ref::ValueRange { start, end }),
        Just(Ref::Strip),
        prop_oneof![Just("x"), Just("y")].prop_map(Ref::Label),
    ];
    leaf.prop_recursive(4, 32, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 2..4).prop_map(Ref::Chain),
            prop::collection::vec(inner, 2..4).prop_map(Ref::Interleave),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 512,
        // Never write regression files next to the sources.
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn apply_matches_reference_evaluator(r in arb_ref(), row in arb_row()) {
        let wire = r.to_pb();
        match RowFilter::compile(&wire) {
            Ok(f) => {
                prop_assert!(r.valid(), "compiled an invalid filter: {:?}", r);
                let got = f.apply_with_sampler(&row, &mut || 0.5);
                let want = r.eval(row.cells.clone());
                prop_assert_eq!(show(&got), show(&want));
                if f.is_block_all() {
                    prop_assert!(got.is_empty());
                }
            }
            Err(e) => {
                prop_assert!(!r.valid(), "rejected a valid filter {:?}: {}", r, e);
                let is_label_error = matches!(e, FilterError::MultipleLabelsInChain { .. });
                prop_assert!(is_label_error, "{}", e);
            }
        }
    }
}

/// Any wire filter, including invalid ones.
fn arb_wire_filter() -> impl Strategy<Value = pb::RowFilter> {
    // Mostly plausible regexes, sometimes arbitrary metacharacter soup.
    let regex_bytes = prop_oneof![
        3 => prop::sample::select(vec![
            &b".*"[..], b"a.*", b"\\C*", b"[ab]+", b"(a|b)*", b"q", b"", b"v\\C*", b"[^a]*",
        ])
        .prop_map(Bytes::from_static),
        2 => prop::collection::vec(
            prop::sample::select(b"ab.*+?()[]{}|^$\\:-,0123CQExdswpPbz\n\xff".to_vec()),
            0..12,
        )
        .prop_map(Bytes::from),
    ];
    let text = prop_oneof![
        3 => prop::sample::select(vec!["a", "b", "c", "x", "lbl-1", ".*", "[ab]"])
            .prop_map(String::from),
        2 => prop::collection::vec(prop::sample::select(b"abz09-_:.*[]()\\A".to_vec()), 0..18)
            .prop_map(|v| String::from_utf8(v).unwrap_or_default()),
    ];
    let flag = prop_oneof![9 => Just(true), 1 => Just(false)];
    let small_bytes = prop::collection::vec(any::<u8>(), 0..3).prop_map(Bytes::from);
    let column_range = (
        text.clone(),
        prop::option::of(prop_oneof![
            small_bytes
                .clone()
                .prop_map(pb::column_range::StartQualifier::StartQualifierClosed),
            small_bytes
                .clone()
                .prop_map(pb::column_range::StartQualifier::StartQualifierOpen),
        ]),
        prop::option::of(prop_oneof![
            small_bytes
                .clone()
                .prop_map(pb::column_range::EndQualifier::EndQualifierClosed),
            small_bytes
                .clone()
                .prop_map(pb::column_range::EndQualifier::EndQualifierOpen),
        ]),
    )
        .prop_map(
            |(family_name, start_qualifier, end_qualifier)| pb::ColumnRange {
                family_name,
                start_qualifier,
                end_qualifier,
            },
        );
    let value_range = (
        prop::option::of(prop_oneof![
            small_bytes
                .clone()
                .prop_map(pb::value_range::StartValue::StartValueClosed),
            small_bytes
                .clone()
                .prop_map(pb::value_range::StartValue::StartValueOpen),
        ]),
        prop::option::of(prop_oneof![
            small_bytes
                .clone()
                .prop_map(pb::value_range::EndValue::EndValueClosed),
            small_bytes.prop_map(pb::value_range::EndValue::EndValueOpen),
        ]),
    )
        .prop_map(|(start_value, end_value)| pb::ValueRange {
            start_value,
            end_value,
        });
    let count = prop_oneof![-2i32..6, any::<i32>()];
    let leaf = prop_oneof![
        Just(unset()),
        flag.clone().prop_map(|v| rf(F::Sink(v))),
        flag.clone().prop_map(|v| rf(F::PassAllFilter(v))),
        flag.clone().prop_map(|v| rf(F::BlockAllFilter(v))),
        regex_bytes
            .clone()
            .prop_map(|v| rf(F::RowKeyRegexFilter(v))),
        prop_oneof![any::<f64>(), 0.0f64..1.0].prop_map(|v| rf(F::RowSampleFilter(v))),
        text.clone().prop_map(|v| rf(F::FamilyNameRegexFilter(v))),
        regex_bytes
            .clone()
            .prop_map(|v| rf(F::ColumnQualifierRegexFilter(v))),
        column_range.prop_map(|v| rf(F::ColumnRangeFilter(v))),
        (
            prop_oneof![any::<i64>(), (-3i64..6).prop_map(|t| t * 1000)],
            prop_oneof![any::<i64>(), (-3i64..6).prop_map(|t| t * 1000)]
        )
            .prop_map(|(s, e)| ts_range(s, e)),
        regex_bytes.prop_map(|v| rf(F::ValueRegexFilter(v))),
        value_range.prop_map(|v| rf(F::ValueRangeFilter(v))),
        count
            .clone()
            .prop_map(|v| rf(F::CellsPerRowOffsetFilter(v))),
        count.clone().prop_map(|v| rf(F::CellsPerRowLimitFilter(v))),
        count.prop_map(|v| rf(F::CellsPerColumnLimitFilter(v))),
        flag.clone().prop_map(|v| rf(F::StripValueTransformer(v))),
        text.prop_map(|v| rf(F::ApplyLabelTransformer(v))),
    ];
    leaf.prop_recursive(24, 96, 4, |inner| {
        prop_oneof![
            prop_oneof![
                9 => prop::collection::vec(inner.clone(), 2..4),
                1 => prop::collection::vec(inner.clone(), 0..2),
            ]
            .prop_map(chain),
            prop_oneof![
                9 => prop::collection::vec(inner.clone(), 2..4),
                1 => prop::collection::vec(inner.clone(), 0..2),
            ]
            .prop_map(interleave),
            (
                prop::option::of(inner.clone()),
                prop::option::of(inner.clone()),
                prop::option::of(inner),
            )
                .prop_map(|(p, t, f)| condition(p, t, f)),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 1024,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn compile_and_apply_never_panic(wire in arb_wire_filter(), row in arb_row(), draw in 0.0f64..1.0) {
        if let Ok(f) = RowFilter::compile(&wire) {
            let out = f.apply_with_sampler(&row, &mut || draw);
            prop_assert!(out.is_sorted_by(|a, b| cell_order(a, b) != Ordering::Greater));
            if f.is_block_all() {
                prop_assert!(out.is_empty());
            }
            // Without sinks or interleaves output cells come from the input.
            let _ = f.apply(&row);
        }
    }

    #[test]
    fn arbitrary_regex_bytes_never_panic(pattern in prop::collection::vec(any::<u8>(), 0..24), input in prop::collection::vec(any::<u8>(), 0..8)) {
        if let Ok(re) = compile_regex("value_regex_filter", &pattern) {
            let _ = re.is_match(&input);
        }
    }

    #[test]
    fn literal_patterns_match_only_themselves(lit in prop::collection::vec(any::<u8>(), 0..12), other in prop::collection::vec(any::<u8>(), 0..12)) {
        // \Q...\E quotes anything (as long as it holds no "\E").
        prop_assume!(!lit.windows(2).any(|w| w == b"\\E"));
        let mut pattern = b"\\Q".to_vec();
        pattern.extend_from_slice(&lit);
        pattern.extend_from_slice(b"\\E");
        let re = compile_regex("value_regex_filter", &pattern).unwrap();
        prop_assert!(re.is_match(&lit));
        prop_assert_eq!(re.is_match(&other), other == lit);
    }
}
