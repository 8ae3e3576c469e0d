"""RowFilter semantics through ReadRows, table-driven.

Reference: the comments of ``google/bigtable/v2/data.proto`` (message ``RowFilter``; readable in
``google/cloud/bigtable_v2/types/data.py`` of the client). Most cases read one shared table,
``MAIN`` below, and compare with a cell spec (see ``semlib``): each cell's value is its own
``row:family:qualifier@ts`` text, ``#label`` marks a label, ``!`` a stripped value.

Adding a case = adding one ``pytest.param(filter, "expected spec", id=...)`` line to a table.
"""

import datetime

import pytest
from google.api_core import exceptions as gexc
from google.cloud.bigtable_v2 import types as v2

import btlib
from btlib import (
    Cell,
    Row,
    f_block_all,
    f_cells_per_column,
    f_chain,
    f_column_range,
    f_condition,
    f_family,
    f_interleave,
    f_label,
    f_pass_all,
    f_qualifier,
    f_row_key,
    f_row_limit,
    f_row_offset,
    f_sample,
    f_sink,
    f_strip,
    f_timestamp_range,
    f_value,
    f_value_range,
    set_cell,
)
from semlib import SharedTable, canon, spec_map, spec_rows, write_spec

# --------------------------------------------------------------------------- dataset

# Bigtable order: rows by key; in a row families (cf1 < cf2), qualifiers by bytes, newest first.
MAIN = (
    "r1:cf1:a@3 r1:cf1:a@2 r1:cf1:a@1 r1:cf1:b@1 r1:cf1:c@2 r1:cf2:a@4 r1:cf2:d@1 "
    "r2:cf1:a@1 r2:cf2:b@2 "
    "r3:cf2:c@5 "
    "r4:cf1:ab@1 r4:cf1:b@7"
)
R1 = "r1:cf1:a@3 r1:cf1:a@2 r1:cf1:a@1 r1:cf1:b@1 r1:cf1:c@2 r1:cf2:a@4 r1:cf2:d@1"
R2 = "r2:cf1:a@1 r2:cf2:b@2"
R3 = "r3:cf2:c@5"
R4 = "r4:cf1:ab@1 r4:cf1:b@7"
CF1 = "r1:cf1:a@3 r1:cf1:a@2 r1:cf1:a@1 r1:cf1:b@1 r1:cf1:c@2 r2:cf1:a@1 r4:cf1:ab@1 r4:cf1:b@7"
CF2 = "r1:cf2:a@4 r1:cf2:d@1 r2:cf2:b@2 r3:cf2:c@5"
QUAL_A = "r1:cf1:a@3 r1:cf1:a@2 r1:cf1:a@1 r1:cf2:a@4 r2:cf1:a@1"
TS_1 = "r1:cf1:a@1 r1:cf1:b@1 r1:cf2:d@1 r2:cf1:a@1 r4:cf1:ab@1"
LATEST = "r1:cf1:a@3 r1:cf1:b@1 r1:cf1:c@2 r1:cf2:a@4 r1:cf2:d@1 r2:cf1:a@1 r2:cf2:b@2 r3:cf2:c@5 r4:cf1:ab@1 r4:cf1:b@7"


def twice(spec: str, a: str = "", b: str = "") -> str:
    """Every cell of ``spec`` twice in a row (suffix ``a`` on one copy, ``b`` on the other)."""
    return " ".join(f"{t}{a} {t}{b}" for t in spec.split())


@pytest.fixture(scope="module")
def main(basalt_server, gapic):
    t = SharedTable(gapic, "filters", ["cf1", "cf2"])
    write_spec(t.data, t.name, MAIN)
    yield t
    t.drop()


def check(table, flt, expected: str, **kw):
    got = table.read(filter=flt, **kw)
    assert canon(got) == canon(spec_rows(expected))


def test_dataset_as_written(main):
    assert main.read() == spec_rows(MAIN)


# ------------------------------------------------------------------- simple filters

SIMPLE = [
    # pass / block
    pytest.param(f_pass_all(), MAIN, id="pass_all"),
    pytest.param(f_block_all(), "", id="block_all"),
    # row_key_regex_filter: RE2, full match against the whole key
    pytest.param(f_row_key(b"r1"), R1, id="key-literal"),
    pytest.param(f_row_key(b"r"), "", id="key-prefix-is-not-a-match"),
    pytest.param(f_row_key(b"1"), "", id="key-substring-is-not-a-match"),
    pytest.param(f_row_key(b"r[12]"), f"{R1} {R2}", id="key-class"),
    pytest.param(f_row_key(b"r.*"), MAIN, id="key-dot-star"),
    pytest.param(f_row_key(b".*1"), R1, id="key-suffix"),
    pytest.param(f_row_key(b"r1|r3"), f"{R1} {R3}", id="key-alternation"),
    pytest.param(f_row_key(b"R1"), "", id="key-case-sensitive"),
    pytest.param(f_row_key(b"(?i)R1"), R1, id="key-case-insensitive-flag"),
    pytest.param(f_row_key(b"r\\d"), MAIN, id="key-digit-class"),
    pytest.param(f_row_key(b"^r2$"), R2, id="key-anchors"),
    pytest.param(f_row_key(b"r[^1-3]"), R4, id="key-negated-class"),
    # family_name_regex_filter
    pytest.param(f_family("cf1"), CF1, id="family-literal"),
    pytest.param(f_family("cf"), "", id="family-prefix-is-not-a-match"),
    pytest.param(f_family("c"), "", id="family-substring-is-not-a-match"),
    pytest.param(f_family("cf."), MAIN, id="family-dot"),
    pytest.param(f_family("cf2|nope"), CF2, id="family-alternation"),
    pytest.param(f_family("[a-z]+2"), CF2, id="family-class"),
    pytest.param(f_family(".*1"), CF1, id="family-suffix"),
    pytest.param(f_family("CF1"), "", id="family-case-sensitive"),
    # column_qualifier_regex_filter
    pytest.param(f_qualifier(b"a"), QUAL_A, id="qualifier-literal-not-ab"),
    pytest.param(f_qualifier(b"a.*"), f"{QUAL_A} r4:cf1:ab@1", id="qualifier-prefix-pattern"),
    pytest.param(f_qualifier(b"b"), "r1:cf1:b@1 r2:cf2:b@2 r4:cf1:b@7", id="qualifier-in-both-families"),
    pytest.param(f_qualifier(b"[cd]"), "r1:cf1:c@2 r1:cf2:d@1 r3:cf2:c@5", id="qualifier-class"),
    pytest.param(f_qualifier(b"ab|c"), "r1:cf1:c@2 r3:cf2:c@5 r4:cf1:ab@1", id="qualifier-alternation"),
    pytest.param(f_qualifier(b".b"), "r4:cf1:ab@1", id="qualifier-dot"),
    # value_regex_filter
    pytest.param(f_value(b"r1:cf1:a@3"), "r1:cf1:a@3", id="value-literal"),
    pytest.param(f_value(b"r1"), "", id="value-prefix-is-not-a-match"),
    pytest.param(f_value(b".*@1"), TS_1, id="value-suffix"),
    pytest.param(f_value(b".*@[67]"), "r4:cf1:b@7", id="value-class"),
    pytest.param(f_value(b"r2:.*"), R2, id="value-prefix-pattern"),
    # column_range_filter: one family; start/end closed, open or unbounded
    pytest.param(f_column_range("cf1", start_closed=b"a", end_closed=b"b"),
                 "r1:cf1:a@3 r1:cf1:a@2 r1:cf1:a@1 r1:cf1:b@1 r2:cf1:a@1 r4:cf1:ab@1 r4:cf1:b@7", id="colrange-closed-closed"),
    pytest.param(f_column_range("cf1", start_closed=b"a", end_open=b"b"),
                 "r1:cf1:a@3 r1:cf1:a@2 r1:cf1:a@1 r2:cf1:a@1 r4:cf1:ab@1", id="colrange-closed-open"),
    pytest.param(f_column_range("cf1", start_open=b"a", end_closed=b"b"),
                 "r1:cf1:b@1 r4:cf1:ab@1 r4:cf1:b@7", id="colrange-open-closed"),
    pytest.param(f_column_range("cf1", start_open=b"a", end_open=b"b"), "r4:cf1:ab@1", id="colrange-open-open"),
    pytest.param(f_column_range("cf1", end_closed=b"ab"),
                 "r1:cf1:a@3 r1:cf1:a@2 r1:cf1:a@1 r2:cf1:a@1 r4:cf1:ab@1", id="colrange-unbounded-closed"),
    pytest.param(f_column_range("cf1", end_open=b"ab"),
                 "r1:cf1:a@3 r1:cf1:a@2 r1:cf1:a@1 r2:cf1:a@1", id="colrange-unbounded-open"),
    pytest.param(f_column_range("cf1", start_closed=b"b"), "r1:cf1:b@1 r1:cf1:c@2 r4:cf1:b@7", id="colrange-closed-unbounded"),
    pytest.param(f_column_range("cf1", start_open=b"b"), "r1:cf1:c@2", id="colrange-open-unbounded"),
    pytest.param(f_column_range("cf1"), CF1, id="colrange-whole-family"),
    pytest.param(f_column_range("cf2", start_closed=b"b", end_open=b"d"), "r2:cf2:b@2 r3:cf2:c@5", id="colrange-other-family"),
    pytest.param(f_column_range("cf1", start_closed=b"a", end_closed=b"a"),
                 "r1:cf1:a@3 r1:cf1:a@2 r1:cf1:a@1 r2:cf1:a@1", id="colrange-single-column"),
    pytest.param(f_column_range("nope", start_closed=b"a"), "", id="colrange-unknown-family"),
    # timestamp_range_filter: [start, end), end 0 or unset = infinity
    pytest.param(f_timestamp_range(2000, 4000), "r1:cf1:a@3 r1:cf1:a@2 r1:cf1:c@2 r2:cf2:b@2", id="ts-start-end"),
    pytest.param(f_timestamp_range(start=2000),
                 "r1:cf1:a@3 r1:cf1:a@2 r1:cf1:c@2 r1:cf2:a@4 r2:cf2:b@2 r3:cf2:c@5 r4:cf1:b@7", id="ts-start-only"),
    pytest.param(f_timestamp_range(end=2000), TS_1, id="ts-end-only"),
    pytest.param(f_timestamp_range(4000, 5000), "r1:cf2:a@4", id="ts-end-exclusive"),
    pytest.param(f_timestamp_range(3000, 0), "r1:cf1:a@3 r1:cf2:a@4 r3:cf2:c@5 r4:cf1:b@7", id="ts-end-zero-is-infinity"),
    pytest.param(f_timestamp_range(8000, 9000), "", id="ts-after-everything"),
    # Microsecond bounds, as the official Java client sends them: exact(t) = [t, t+1),
    # startOpen(t) = [t+1, ..), endClosed(t) = [.., t+1). See the report: current Bigtable
    # accepts them (googleapis/google-cloud-go#9149, #9414).
    pytest.param(f_timestamp_range(7000, 7001), "r4:cf1:b@7", id="ts-micros-java-exact"),
    pytest.param(f_timestamp_range(3001, 4001), "r1:cf2:a@4", id="ts-micros-java-open-start-closed-end"),
    pytest.param(f_timestamp_range(1, 1000), "", id="ts-micros-below-first-millisecond"),
    # cells_per_row_offset_filter / cells_per_row_limit_filter (cells in row order)
    pytest.param(f_row_offset(0), MAIN, id="offset-0"),
    pytest.param(f_row_offset(1), "r1:cf1:a@2 r1:cf1:a@1 r1:cf1:b@1 r1:cf1:c@2 r1:cf2:a@4 r1:cf2:d@1 r2:cf2:b@2 r4:cf1:b@7", id="offset-1"),
    pytest.param(f_row_offset(2), "r1:cf1:a@1 r1:cf1:b@1 r1:cf1:c@2 r1:cf2:a@4 r1:cf2:d@1", id="offset-2"),
    pytest.param(f_row_offset(6), "r1:cf2:d@1", id="offset-all-but-one"),
    pytest.param(f_row_offset(7), "", id="offset-whole-row"),
    pytest.param(f_row_limit(1), "r1:cf1:a@3 r2:cf1:a@1 r3:cf2:c@5 r4:cf1:ab@1", id="limit-1"),
    pytest.param(f_row_limit(2), "r1:cf1:a@3 r1:cf1:a@2 r2:cf1:a@1 r2:cf2:b@2 r3:cf2:c@5 r4:cf1:ab@1 r4:cf1:b@7", id="limit-2"),
    pytest.param(f_row_limit(100), MAIN, id="limit-more-than-cells"),
    # cells_per_column_limit_filter
    pytest.param(f_cells_per_column(1), LATEST, id="column-limit-1"),
    pytest.param(f_cells_per_column(2), MAIN.replace("r1:cf1:a@1 ", ""), id="column-limit-2"),
    # transformers
    pytest.param(f_strip(), spec_map(MAIN, "!"), id="strip-value"),
    pytest.param(f_label("foo"), spec_map(MAIN, "#foo"), id="label"),
    pytest.param(f_label("abcdefghijklmno"), spec_map(MAIN, "#abcdefghijklmno"), id="label-15-chars"),
    pytest.param(f_label("0-9-z"), spec_map(MAIN, "#0-9-z"), id="label-digits-and-dashes"),
]


@pytest.mark.parametrize("flt, expected", SIMPLE)
def test_simple_filter(main, flt, expected):
    check(main, flt, expected)


# ----------------------------------------------------------------- chain / interleave

COMPOSITE = [
    # chain: each filter narrows the previous one's output, in order
    pytest.param(f_chain(f_family("cf1"), f_qualifier(b"a")), "r1:cf1:a@3 r1:cf1:a@2 r1:cf1:a@1 r2:cf1:a@1", id="chain-family-qualifier"),
    pytest.param(f_chain(f_family("cf1"), f_qualifier(b"a"), f_cells_per_column(1)), "r1:cf1:a@3 r2:cf1:a@1", id="chain-three"),
    pytest.param(f_chain(f_cells_per_column(1), f_timestamp_range(end=2000)), "r1:cf1:b@1 r1:cf2:d@1 r2:cf1:a@1 r4:cf1:ab@1", id="chain-limit-then-ts"),
    pytest.param(f_chain(f_timestamp_range(end=2000), f_cells_per_column(1)), TS_1, id="chain-ts-then-limit"),
    pytest.param(f_chain(f_row_offset(1), f_row_limit(2)), "r1:cf1:a@2 r1:cf1:a@1 r2:cf2:b@2 r4:cf1:b@7", id="chain-offset-then-limit"),
    pytest.param(f_chain(f_row_limit(2), f_row_offset(1)), "r1:cf1:a@2 r2:cf2:b@2 r4:cf1:b@7", id="chain-limit-then-offset"),
    pytest.param(f_chain(f_row_key(b"r1"), f_block_all()), "", id="chain-block"),
    pytest.param(f_chain(f_qualifier(b"a"), f_strip()), spec_map(QUAL_A, "!"), id="chain-then-strip"),
    pytest.param(f_chain(f_strip(), f_value(b".*@1")), "", id="chain-strip-then-value-regex"),
    pytest.param(f_chain(f_value(b".*@1"), f_strip()), spec_map(TS_1, "!"), id="chain-value-regex-then-strip"),
    pytest.param(f_chain(f_chain(f_family("cf2"), f_pass_all()), f_chain(f_row_key(b"r[13]"), f_label("x"))),
                 "r1:cf2:a@4#x r1:cf2:d@1#x r3:cf2:c@5#x", id="chain-nested"),
    # interleave: each sub-filter sees the whole input; outputs merged in cell order, duplicates kept
    pytest.param(f_interleave(f_family("cf1"), f_family("cf2")), MAIN, id="interleave-disjoint"),
    pytest.param(f_interleave(f_qualifier(b"a"), f_timestamp_range(end=2000)),
                 "r1:cf1:a@3 r1:cf1:a@2 r1:cf1:a@1 r1:cf1:a@1 r1:cf1:b@1 r1:cf2:a@4 r1:cf2:d@1 "
                 "r2:cf1:a@1 r2:cf1:a@1 r4:cf1:ab@1", id="interleave-overlap-keeps-duplicates"),
    pytest.param(f_interleave(f_block_all(), f_block_all()), "", id="interleave-block-block"),
    pytest.param(f_interleave(f_pass_all(), f_block_all()), MAIN, id="interleave-pass-block"),
    pytest.param(f_interleave(f_pass_all(), f_pass_all()), twice(MAIN), id="interleave-pass-pass"),
    pytest.param(f_interleave(f_chain(f_family("cf1"), f_label("one")), f_chain(f_family("cf2"), f_label("two"))),
                 " ".join(t + ("#one" if ":cf1:" in t else "#two") for t in MAIN.split()), id="interleave-labels-per-branch"),
    pytest.param(f_interleave(f_label("x"), f_label("y")), twice(MAIN, "#x", "#y"), id="interleave-two-labels"),
    pytest.param(f_interleave(f_row_key(b"r1"), f_row_key(b"r3")), f"{R1} {R3}", id="interleave-row-keys"),
    pytest.param(f_interleave(f_row_key(b"r2"), f_qualifier(b"b")),
                 "r1:cf1:b@1 r2:cf1:a@1 r2:cf2:b@2 r2:cf2:b@2 r4:cf1:b@7", id="interleave-key-and-qualifier"),
    pytest.param(f_interleave(f_pass_all(), f_pass_all(), f_pass_all()),
                 " ".join(f"{t} {t} {t}" for t in MAIN.split()), id="interleave-three"),
    # counting filters count every copy of a duplicated cell
    pytest.param(f_chain(f_interleave(f_pass_all(), f_pass_all()), f_row_limit(3)),
                 "r1:cf1:a@3 r1:cf1:a@3 r1:cf1:a@2 r2:cf1:a@1 r2:cf1:a@1 r2:cf2:b@2 r3:cf2:c@5 r3:cf2:c@5 "
                 "r4:cf1:ab@1 r4:cf1:ab@1 r4:cf1:b@7", id="duplicates-count-for-row-limit"),
    pytest.param(f_chain(f_interleave(f_pass_all(), f_pass_all()), f_cells_per_column(1)), LATEST, id="duplicates-count-for-column-limit-1"),
    pytest.param(f_chain(f_interleave(f_pass_all(), f_pass_all()), f_cells_per_column(2)), twice(LATEST), id="duplicates-count-for-column-limit-2"),
    pytest.param(f_chain(f_interleave(f_pass_all(), f_pass_all()), f_row_offset(11)),
                 "r1:cf2:a@4 r1:cf2:d@1 r1:cf2:d@1", id="duplicates-count-for-row-offset"),
]


@pytest.mark.parametrize("flt, expected", COMPOSITE)
def test_chain_and_interleave(main, flt, expected):
    check(main, flt, expected)


# ---------------------------------------------------------------------- condition

CONDITION = [
    pytest.param(f_condition(f_value(b".*@3"), f_pass_all(), f_block_all()), R1, id="true-branch-gets-whole-row"),
    pytest.param(f_condition(f_value(b".*@3"), f_pass_all()), R1, id="no-false-branch"),
    pytest.param(f_condition(f_qualifier(b"d"), f_family("cf1"), f_family("cf2")),
                 "r1:cf1:a@3 r1:cf1:a@2 r1:cf1:a@1 r1:cf1:b@1 r1:cf1:c@2 r2:cf2:b@2 r3:cf2:c@5", id="both-branches-per-row"),
    pytest.param(f_condition(f_chain(f_family("cf2"), f_qualifier(b"b")), f_strip()), spec_map(R2, "!"), id="chained-predicate"),
    pytest.param(f_condition(f_qualifier(b"b"), None, f_label("nob")), "r3:cf2:c@5#nob", id="no-true-branch"),
    pytest.param(f_condition(f_chain(f_label("p"), f_strip()), f_pass_all()), MAIN, id="predicate-transformers-do-not-leak"),
    pytest.param(f_condition(f_block_all(), f_label("t"), f_label("f")), spec_map(MAIN, "#f"), id="predicate-block-all"),
    pytest.param(f_condition(f_pass_all(), f_label("t"), f_label("f")), spec_map(MAIN, "#t"), id="predicate-pass-all"),
    pytest.param(f_condition(f_row_offset(1), f_pass_all()), f"{R1} {R2} {R4}", id="predicate-rows-with-two-cells"),
    pytest.param(f_condition(f_value(b"r2:cf2:b@2"), f_chain(f_qualifier(b"a"), f_label("t"))),
                 "r2:cf1:a@1#t", id="true-branch-not-limited-to-matching-cells"),
    pytest.param(f_chain(f_family("cf1"), f_condition(f_qualifier(b"d"), f_pass_all())), "", id="predicate-sees-parent-output-only"),
    pytest.param(f_chain(f_family("cf1"), f_condition(f_qualifier(b"b"), f_pass_all(), f_label("f"))),
                 "r1:cf1:a@3 r1:cf1:a@2 r1:cf1:a@1 r1:cf1:b@1 r1:cf1:c@2 r2:cf1:a@1#f r4:cf1:ab@1 r4:cf1:b@7", id="condition-in-chain"),
    pytest.param(f_condition(f_condition(f_qualifier(b"c"), f_pass_all()), f_label("yes"), f_label("no")),
                 f"{spec_map(R1, '#yes')} {spec_map(R2, '#no')} {spec_map(R3, '#yes')} {spec_map(R4, '#no')}", id="condition-as-predicate"),
    pytest.param(f_interleave(f_condition(f_qualifier(b"d"), f_label("has-d")), f_family("cf1")),
                 "r1:cf1:a@3#has-d r1:cf1:a@3 r1:cf1:a@2#has-d r1:cf1:a@2 r1:cf1:a@1#has-d r1:cf1:a@1 "
                 "r1:cf1:b@1#has-d r1:cf1:b@1 r1:cf1:c@2#has-d r1:cf1:c@2 r1:cf2:a@4#has-d r1:cf2:d@1#has-d "
                 "r2:cf1:a@1 r4:cf1:ab@1 r4:cf1:b@7", id="condition-in-interleave"),
]


@pytest.mark.parametrize("flt, expected", CONDITION)
def test_condition(main, flt, expected):
    check(main, flt, expected)


# --------------------------------------------------------------------------- sink

SINK = [
    pytest.param(f_sink(), MAIN, id="top-level"),
    pytest.param(f_chain(f_label("s"), f_sink()), spec_map(MAIN, "#s"), id="label-then-sink"),
    pytest.param(f_chain(f_family("cf1"), f_chain(f_label("s"), f_sink()), f_strip()), spec_map(CF1, "#s"), id="nothing-after-sink-in-chain"),
    pytest.param(f_chain(f_sink(), f_block_all()), MAIN, id="sink-bypasses-later-block"),
    pytest.param(f_chain(f_sink(), f_label("late")), MAIN, id="sink-bypasses-later-label"),
    pytest.param(f_chain(f_row_key(b"r2"), f_sink()), R2, id="filters-before-sink-apply"),
    pytest.param(f_interleave(f_chain(f_family("cf2"), f_label("x"), f_sink()), f_family("cf1")),
                 " ".join(t + ("#x" if ":cf2:" in t else "") for t in MAIN.split()), id="sink-in-interleave"),
    pytest.param(f_chain(f_interleave(f_chain(f_label("s"), f_sink()), f_pass_all()), f_block_all()), spec_map(MAIN, "#s"), id="sink-survives-block-of-parent"),
    pytest.param(f_chain(f_interleave(f_chain(f_label("s"), f_sink()), f_pass_all()), f_row_limit(1)),
                 " ".join(
                     (f"{t}#s {t}" if t in ("r1:cf1:a@3", "r2:cf1:a@1", "r3:cf2:c@5", "r4:cf1:ab@1") else f"{t}#s")
                     for t in MAIN.split()
                 ), id="sink-copy-not-counted-by-parent-limit"),
]


@pytest.mark.parametrize("flt, expected", SINK)
def test_sink(main, flt, expected):
    check(main, flt, expected)


def test_sink_proto_worked_example(bt):
    """The example in the comment of RowFilter.sink (data.proto), timestamps scaled to ms."""
    t = bt.table(["A", "B"])
    t.write(b"r", ("A", b"A", 1000, b"w"), ("A", b"B", 2000, b"x"), ("B", b"B", 4000, b"z"))
    flt = f_chain(
        f_family("A"),
        f_interleave(f_pass_all(), f_chain(f_label("foo"), f_sink())),
        f_qualifier(b"B"),
    )
    got = t.read(filter=flt)
    assert canon(got) == canon([Row(b"r", [
        Cell("A", b"A", 1000, b"w", ("foo",)),
        Cell("A", b"B", 2000, b"x", ("foo",)),
        Cell("A", b"B", 2000, b"x"),
    ])])


def test_interleave_output_is_sorted_and_keeps_duplicates(bt):
    """Interleave output is "pooled, sorted, and combined": cells come in column order
    whatever sub-filter produced them, identical copies kept (data.proto, Interleave)."""
    t = bt.table(["fam"])
    t.write(b"r", ("fam", b"bar", 10_000, b"x"), ("fam", b"blah", 11_000, b"z"), ("fam", b"bar", 7_000, b"a"), ("fam", b"blah", 5_000, b"y"))
    flt = f_interleave(
        f_qualifier(b"blah"),                        # blah@11, blah@5
        f_timestamp_range(end=8_000),                # bar@7, blah@5
        f_chain(f_qualifier(b"bar"), f_label("b")),  # bar@10, bar@7 (labelled)
    )
    got = t.read(filter=flt)
    assert canon(got) == canon([Row(b"r", [
        Cell("fam", b"bar", 10_000, b"x", ("b",)),
        Cell("fam", b"bar", 7_000, b"a", ("b",)),
        Cell("fam", b"bar", 7_000, b"a"),
        Cell("fam", b"blah", 11_000, b"z"),
        Cell("fam", b"blah", 5_000, b"y"),
        Cell("fam", b"blah", 5_000, b"y"),
    ])])


# ------------------------------------------------------ filters with other read options


def test_rows_limit_counts_rows_after_filtering(main):
    # rows without any cell left by the filter are not returned and do not count
    check(main, f_family("cf2"), "r1:cf2:a@4 r1:cf2:d@1 r2:cf2:b@2", limit=2)
    check(main, f_row_key(b"r[34]"), R3, limit=1)


def test_reversed_read_with_filter_keeps_cell_order(main):
    check(main, f_row_limit(2), "r4:cf1:ab@1 r4:cf1:b@7 r3:cf2:c@5 r2:cf1:a@1 r2:cf2:b@2 r1:cf1:a@3 r1:cf1:a@2", reversed=True)
    check(main, f_family("cf2"), "r3:cf2:c@5 r2:cf2:b@2", reversed=True, limit=2)


def test_filter_with_row_set(main):
    check(main, f_qualifier(b"b"), "r2:cf2:b@2 r4:cf1:b@7", keys=[b"r4", b"r2", b"r3"])


# ------------------------------------------------------------------ regex details

# one row, family cf1, qualifier b"%02d" % i, value VALS[i]
VALS = [b"", b"\x00", b"A", b"a", b"a\nb", b"ab", b"b", b"ba", b"c", b"xab", b"\x7f", b"\x80",
        b"\xc3\xa9", b"\xe9", b"\xff", b"\xff\xff"]


@pytest.fixture(scope="module")
def values_table(basalt_server, gapic):
    t = SharedTable(gapic, "values", ["cf1"])
    btlib.mutate_row(t.data, t.name, b"v", [set_cell("cf1", b"%02d" % i, v, 1000) for i, v in enumerate(VALS)])
    yield t
    t.drop()


def matched_values(table, flt) -> list[bytes]:
    rows = table.read(filter=flt)
    if not rows:
        return []
    (row,) = rows
    for c in row.cells:  # the cell is untouched, only selected
        assert (c.family, c.ts, c.labels) == ("cf1", 1000, ()) and c.value == VALS[int(c.qualifier)]
    return [c.value for c in row.cells]


def in_order(*vals):
    return sorted(vals, key=VALS.index)


VALUE_REGEX = [
    pytest.param(b"a", [b"a"], id="literal-full-match"),
    pytest.param(b"a.*", [b"a", b"ab"], id="dot-does-not-match-newline"),
    pytest.param(b"a\\C*", [b"a", b"a\nb", b"ab"], id="backslash-C-matches-newline"),
    pytest.param(b"(?s)a.*", [b"a", b"a\nb", b"ab"], id="s-flag"),
    pytest.param(b".*", [v for v in VALS if b"\n" not in v], id="dot-star"),
    pytest.param(b"\\C*", VALS, id="any-bytes"),
    pytest.param(b".+", [v for v in VALS if v and b"\n" not in v], id="dot-plus-not-empty"),
    pytest.param(b".", [v for v in VALS if len(v) == 1], id="dot-is-one-byte"),
    pytest.param(b"..", [b"ab", b"ba", b"\xc3\xa9", b"\xff\xff"], id="two-bytes-latin1-not-utf8"),
    pytest.param(b"\\xff", [b"\xff"], id="hex-escape"),
    pytest.param(b"\\xff+", [b"\xff", b"\xff\xff"], id="hex-escape-repeated"),
    pytest.param(b"\xff", [b"\xff"], id="raw-high-byte"),
    pytest.param(b"\xe9", [b"\xe9"], id="raw-latin1-byte-not-utf8"),
    pytest.param(b"\xc3\xa9", [b"\xc3\xa9"], id="raw-utf8-bytes-are-two-chars"),
    pytest.param(b"[\\x80-\\xff]+", [b"\x80", b"\xc3\xa9", b"\xe9", b"\xff", b"\xff\xff"], id="high-byte-class"),
    pytest.param(b"\\x00", [b"\x00"], id="nul-escape"),
    pytest.param(b"(?i)a", [b"A", b"a"], id="case-insensitive"),
    pytest.param(b"a|ab", [b"a", b"ab"], id="alternation-is-anchored-as-a-whole"),
    pytest.param(b"^a$", [b"a"], id="explicit-anchors"),
    pytest.param(b"\\w+", [b"A", b"a", b"ab", b"b", b"ba", b"c", b"xab"], id="word-class-is-ascii"),
    pytest.param(b"[^a]", [b"\x00", b"A", b"b", b"c", b"\x7f", b"\x80", b"\xe9", b"\xff"], id="negated-class"),
    pytest.param(b"x?ab", [b"ab", b"xab"], id="optional"),
    pytest.param(b"a\nb", [b"a\nb"], id="literal-newline"),
    pytest.param(b"a\\nb", [b"a\nb"], id="escaped-newline"),
]


@pytest.mark.parametrize("regex, expected", VALUE_REGEX)
def test_value_regex_semantics(values_table, regex, expected):
    assert matched_values(values_table, f_value(regex)) == in_order(*expected)


# Byte order: b"" < \x00 < A < a < a\nb < ab < b < ba < c < xab < \x7f < \x80 < \xc3\xa9 < \xe9 < \xff < \xff\xff
VALUE_RANGE = [
    pytest.param(dict(start_closed=b"a", end_closed=b"b"), [b"a", b"a\nb", b"ab", b"b"], id="closed-closed"),
    pytest.param(dict(start_closed=b"a", end_open=b"b"), [b"a", b"a\nb", b"ab"], id="closed-open"),
    pytest.param(dict(start_open=b"a", end_closed=b"b"), [b"a\nb", b"ab", b"b"], id="open-closed"),
    pytest.param(dict(start_open=b"a", end_open=b"b"), [b"a\nb", b"ab"], id="open-open"),
    pytest.param(dict(end_open=b"A"), [b"", b"\x00"], id="unbounded-open"),
    pytest.param(dict(end_closed=b"A"), [b"", b"\x00", b"A"], id="unbounded-closed"),
    pytest.param(dict(start_closed=b"\x80"), [b"\x80", b"\xc3\xa9", b"\xe9", b"\xff", b"\xff\xff"], id="closed-unbounded-high-bytes-unsigned"),
    pytest.param(dict(start_open=b"\xff"), [b"\xff\xff"], id="open-unbounded"),
    pytest.param(dict(), VALS, id="unbounded-both"),
    pytest.param(dict(start_closed=b"", end_open=b"\x00"), [b""], id="empty-value-only"),
    pytest.param(dict(start_closed=b"c", end_closed=b"c"), [b"c"], id="single-value"),
    pytest.param(dict(start_closed=b"b", end_open=b"b\x00"), [b"b"], id="successor-bound"),
]


@pytest.mark.parametrize("bounds, expected", VALUE_RANGE)
def test_value_range_bounds(values_table, bounds, expected):
    assert matched_values(values_table, f_value_range(**bounds)) == in_order(*expected)


BIN_KEYS = [b"k\x00", b"k\n", b"k\x80", b"k\xff"]
BIN_QUALIFIERS = [b"", b"\x00", b"\n", b"a\nb", b"abc", b"\x80abc", b"\xff"]  # byte order


@pytest.fixture(scope="module")
def binary_table(basalt_server, gapic):
    t = SharedTable(gapic, "binary", ["cf1"])
    entries = [(k, [set_cell("cf1", q, b"v", 1000) for q in BIN_QUALIFIERS]) for k in BIN_KEYS]
    assert btlib.mutate_rows(t.data, t.name, entries) == ["OK"] * len(BIN_KEYS)
    yield t
    t.drop()


@pytest.mark.parametrize(
    "regex, expected",
    [
        (b"k.", [b"k\x00", b"k\x80", b"k\xff"]),
        (b"k\\C", BIN_KEYS),
        (b"k\\n", [b"k\n"]),
        (b"k[\\x00\\xff]", [b"k\x00", b"k\xff"]),
        (b"k\x80", [b"k\x80"]),
    ],
    ids=["dot", "backslash-C", "newline-escape", "binary-class", "raw-byte"],
)
def test_row_key_regex_on_binary_keys(binary_table, regex, expected):
    rows = binary_table.read(filter=f_row_key(regex))
    assert [r.key for r in rows] == expected
    assert all([c.qualifier for c in r.cells] == BIN_QUALIFIERS for r in rows)


@pytest.mark.parametrize(
    "regex, expected",
    [
        (b"\\C*", BIN_QUALIFIERS),
        (b".*", [b"", b"\x00", b"abc", b"\x80abc", b"\xff"]),
        (b"(?s).*", BIN_QUALIFIERS),
        (b"\\x00", [b"\x00"]),
        (b"\\xff", [b"\xff"]),
        (b"\\x80.*", [b"\x80abc"]),
        (b".*abc", [b"abc", b"\x80abc"]),
        (b"a\\Cb", [b"a\nb"]),
    ],
    ids=["any-bytes", "dot-star", "s-flag", "nul", "ff", "high-byte-prefix", "suffix", "backslash-C-newline"],
)
def test_qualifier_regex_on_binary_qualifiers(binary_table, regex, expected):
    rows = binary_table.read(filter=f_qualifier(regex), keys=[b"k\x00"])
    assert [c.qualifier for r in rows for c in r.cells] == expected


@pytest.mark.parametrize(
    "bounds, expected",
    [
        (dict(start_closed=b"", end_open=b"\x00"), [b""]),
        (dict(start_open=b"", end_open=b"\x01"), [b"\x00"]),
        (dict(start_closed=b"a\nb", end_closed=b"abc"), [b"a\nb", b"abc"]),
        (dict(start_open=b"abc"), [b"\x80abc", b"\xff"]),
        (dict(start_closed=b"\n", end_open=b"a\nb"), [b"\n"]),
    ],
    ids=["empty-qualifier-only", "open-after-empty", "binary-closed-closed", "high-bytes-after", "newline-qualifier"],
)
def test_column_range_on_binary_qualifiers(binary_table, bounds, expected):
    rows = binary_table.read(filter=f_column_range("cf1", **bounds), keys=[b"k\xff"])
    assert [c.qualifier for r in rows for c in r.cells] == expected


def test_filters_on_values_split_across_chunks(bt):
    """Values over 1 MiB come in several CellChunks; labels are set on the first chunk only
    and filters see (and strip) the whole value."""
    t = bt.table(["cf1"])
    big = bytes(range(256)) * (10 * 1024)  # 2.5 MiB, every byte value
    t.write(b"r", ("cf1", b"big", 2000, big), ("cf1", b"small", 1000, b"s"))
    (row,) = t.read(filter=f_chain(f_qualifier(b"big"), f_label("big")))
    assert [(c.qualifier, c.ts, c.labels, btlib.digest(c.value)) for c in row.cells] == [(b"big", 2000, ("big",), btlib.digest(big))]
    (row,) = t.read(filter=f_interleave(f_label("a"), f_chain(f_value(b"\\C*"), f_label("b"))))
    assert sorted((c.qualifier, c.labels, btlib.digest(c.value)) for c in row.cells) == [
        (b"big", ("a",), btlib.digest(big)), (b"big", ("b",), btlib.digest(big)), (b"small", ("a",), btlib.digest(b"s")),
        (b"small", ("b",), btlib.digest(b"s")),
    ]
    assert t.read(filter=f_strip()) == [Row(b"r", [Cell("cf1", b"big", 2000, b""), Cell("cf1", b"small", 1000, b"")])]
    rows = t.read(filter=f_value(b"\\x00\\x01\\C*"))
    assert [(r.key, [(c.qualifier, btlib.digest(c.value)) for c in r.cells]) for r in rows] == [(b"r", [(b"big", btlib.digest(big))])]


# ------------------------------------------------------------------------ row_sample


@pytest.fixture(scope="module")
def sample_table(basalt_server, gapic):
    t = SharedTable(gapic, "sample", ["cf1", "cf2"])
    entries = [
        (b"s%04d" % i, [set_cell("cf1", b"a", b"1", 1000), set_cell("cf1", b"b", b"2", 1000), set_cell("cf2", b"c", b"3", 1000)])
        for i in range(400)
    ]
    assert set(btlib.mutate_rows(t.data, t.name, entries)) == {"OK"}
    yield t
    t.drop()


WHOLE_ROW = [Cell("cf1", b"a", 1000, b"1"), Cell("cf1", b"b", 1000, b"2"), Cell("cf2", b"c", 1000, b"3")]


@pytest.mark.parametrize(
    "p, low, high",
    [(0.5, 120, 280), (0.05, 1, 50), (0.95, 340, 399)],
    ids=["half", "five-percent", "ninety-five-percent"],
)
def test_row_sample_is_per_row_and_statistical(sample_table, p, low, high):
    rows = sample_table.read(filter=f_sample(p))
    # binomial(400, p): these bounds are > 5 standard deviations from the mean
    assert low <= len(rows) <= high, f"{len(rows)} rows sampled with p={p}"
    assert all(r.cells == WHOLE_ROW for r in rows), "sampled rows must be whole"
    assert len({r.key for r in rows}) == len(rows)


def test_row_sample_in_chain_keeps_rows_whole(sample_table):
    rows = sample_table.read(filter=f_chain(f_family("cf1"), f_sample(0.5)))
    assert 120 <= len(rows) <= 280
    assert all(r.cells == WHOLE_ROW[:2] for r in rows)


# ------------------------------------------------------------------------ validation


def nested(kind, depth: int) -> v2.RowFilter:
    """``depth`` levels of chain / interleave, two filters each, around pass_all."""
    f = f_pass_all()
    for _ in range(depth):
        f = kind(f, f_pass_all())
    return f


def sized_value_regex(total: int) -> v2.RowFilter:
    """A value_regex_filter whose serialized RowFilter is exactly ``total`` bytes."""
    n = total - 4
    while True:
        f = f_value(b"a" * n)
        size = len(v2.RowFilter.pb(f).SerializeToString())
        if size == total:
            return f
        n += total - size


INVALID = [
    pytest.param(f_chain(), id="chain-of-0"),
    pytest.param(f_chain(f_pass_all()), id="chain-of-1"),
    pytest.param(f_interleave(), id="interleave-of-0"),
    pytest.param(f_interleave(f_pass_all()), id="interleave-of-1"),
    pytest.param(f_chain(f_pass_all(), f_interleave(f_pass_all())), id="nested-interleave-of-1"),
    # family regex may not contain ':' at all
    pytest.param(f_family("cf1:"), id="family-colon"),
    pytest.param(f_family("[:]"), id="family-colon-in-class"),
    pytest.param(f_family("cf1|a:b"), id="family-colon-in-alternative"),
    # invalid RE2
    pytest.param(f_row_key(b"("), id="key-regex-unbalanced"),
    pytest.param(f_row_key(b"[a"), id="key-regex-open-class"),
    pytest.param(f_row_key(b""), id="key-regex-empty"),
    pytest.param(f_family("*cf"), id="family-regex-missing-repeat-arg"),
    pytest.param(f_qualifier(b"a{2,1}"), id="qualifier-regex-bad-repeat"),
    pytest.param(f_value(b"(?=a)"), id="value-regex-lookahead"),
    pytest.param(f_value(b"(a)\\1"), id="value-regex-backreference"),
    pytest.param(f_value(b"a{1001}"), id="value-regex-repeat-over-1000"),
    # labels: at most 15 characters of [a-z0-9-]
    pytest.param(f_label("abcdefghijklmnop"), id="label-16-chars"),
    pytest.param(f_label("Foo"), id="label-uppercase"),
    pytest.param(f_label("foo_bar"), id="label-underscore"),
    pytest.param(f_label("foo bar"), id="label-space"),
    pytest.param(f_label(""), id="label-empty"),
    pytest.param(f_label("f\u00f6o"), id="label-non-ascii"),
    # nesting and size
    pytest.param(nested(f_chain, 25), id="chain-nested-25-deep"),
    pytest.param(nested(f_interleave, 25), id="interleave-nested-25-deep"),
    pytest.param(sized_value_regex(20_481), id="serialized-20481-bytes"),
    pytest.param(f_interleave(*[f_value(b"x" * 800) for _ in range(30)]), id="interleave-over-20480-bytes"),
    # sink may not appear in a condition
    pytest.param(f_condition(f_sink(), f_pass_all()), id="sink-in-predicate"),
    pytest.param(f_condition(f_pass_all(), f_chain(f_label("x"), f_sink())), id="sink-in-true-filter"),
    pytest.param(f_condition(f_pass_all(), f_pass_all(), f_sink()), id="sink-in-false-filter"),
    pytest.param(f_condition(f_pass_all(), f_interleave(f_pass_all(), f_chain(f_label("x"), f_sink()))), id="sink-deep-in-condition"),
    # negative counts
    pytest.param(f_row_offset(-1), id="negative-row-offset"),
    pytest.param(f_row_limit(-1), id="negative-row-limit"),
    pytest.param(f_cells_per_column(-1), id="negative-column-limit"),
    # row_sample_filter must be in the open interval (0, 1)
    pytest.param(f_sample(0.0), id="sample-0"),
    pytest.param(f_sample(1.0), id="sample-1"),
    pytest.param(f_sample(-0.5), id="sample-negative"),
    pytest.param(f_sample(1.5), id="sample-above-1"),
    # boolean filters set to false
    pytest.param(v2.RowFilter(pass_all_filter=False), id="pass-all-false"),
    pytest.param(v2.RowFilter(block_all_filter=False), id="block-all-false"),
]


@pytest.mark.parametrize("flt", INVALID)
def test_invalid_filter_is_invalid_argument(main, flt):
    with pytest.raises(gexc.InvalidArgument):
        main.read(filter=flt)
    with pytest.raises(gexc.InvalidArgument):  # also when nested in a valid interleave
        main.read(filter=f_interleave(f_block_all(), flt))


def raw_nested(into, kind: str, depth: int):
    """Fills the raw RowFilter ``into`` with ``depth`` levels of chain / interleave / condition
    (as predicate) around pass_all. Built in place: the Python protobuf runtime refuses to
    *parse* messages deeper than 100 levels, which building them from parts does, but a
    client may still send them."""
    cur = into
    for _ in range(depth):
        if kind == "condition":
            cur.condition.true_filter.pass_all_filter = True
            cur = cur.condition.predicate_filter
        else:
            group = getattr(cur, kind)
            inner = group.filters.add()
            group.filters.add().pass_all_filter = True
            cur = inner
    cur.pass_all_filter = True


@pytest.mark.parametrize("kind", ["chain", "interleave", "condition"])
@pytest.mark.parametrize("depth", [21, 49, 50, 60, 200])
def test_too_deep_a_filter_is_invalid_argument_and_says_so(main, kind, depth):
    """Past protobuf's recursion limit (100 messages, two per level, so ~50 levels) as well as
    below it: INVALID_ARGUMENT with a message about the nesting, never INTERNAL."""
    req = v2.ReadRowsRequest.pb()(table_name=main.name)
    raw_nested(req.filter, kind, depth)
    with pytest.raises(gexc.InvalidArgument, match="deep"):
        list(main.data.read_rows(request=v2.ReadRowsRequest.wrap(req), retry=None, timeout=30))
    # CheckAndMutateRow's predicate goes through the same decoder and validation.
    req = v2.CheckAndMutateRowRequest.pb()(table_name=main.name, row_key=b"r1")
    req.true_mutations.add().set_cell.family_name = "cf1"
    raw_nested(req.predicate_filter, kind, depth)
    with pytest.raises(gexc.InvalidArgument, match="deep"):
        main.data.check_and_mutate_row(request=v2.CheckAndMutateRowRequest.wrap(req), retry=None, timeout=30)


@pytest.mark.parametrize(
    "flt, expected",
    [
        pytest.param(nested(f_chain, 19), MAIN, id="chain-nested-19-deep"),
        pytest.param(nested(f_interleave, 19), " ".join(" ".join([t] * 20) for t in MAIN.split()), id="interleave-nested-19-deep"),
        pytest.param(sized_value_regex(20_480), "", id="serialized-exactly-20480-bytes"),
        pytest.param(f_value(b"a{1000}"), "", id="repeat-1000"),
    ],
)
def test_filters_at_the_limits_are_accepted(main, flt, expected):
    check(main, flt, expected)


# -------------------------------------------------------------- high-level clients


EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def cells_of(row_cells: dict) -> list[tuple]:
    """Classic PartialRowData.cells -> [(family, qualifier, ts_micros, value, labels)]."""
    out = []
    for fam, cols in row_cells.items():
        for q, cells in cols.items():
            for c in cells:
                ts = (c.timestamp - EPOCH) // datetime.timedelta(microseconds=1)
                out.append((fam, q, ts, c.value, tuple(c.labels)))
    return sorted(out, key=lambda x: (x[0], x[1], -x[2]))


def test_classic_client_row_filters(main, classic_client):
    from google.cloud.bigtable import row_filters as rf

    ct = classic_client.instance(btlib.INSTANCE).table(main.id)
    chain = rf.RowFilterChain(filters=[rf.FamilyNameRegexFilter("cf1"), rf.ColumnQualifierRegexFilter(b"a"), rf.CellsColumnLimitFilter(1)])
    rows = {r.row_key: cells_of(r.cells) for r in ct.read_rows(filter_=chain)}
    assert rows == {
        b"r1": [("cf1", b"a", 3000, b"r1:cf1:a@3", ())],
        b"r2": [("cf1", b"a", 1000, b"r2:cf1:a@1", ())],
    }

    union = rf.RowFilterUnion(filters=[
        rf.RowFilterChain(filters=[rf.FamilyNameRegexFilter("cf2"), rf.ApplyLabelFilter("two")]),
        rf.RowFilterChain(filters=[rf.ValueRegexFilter(b".*@7"), rf.ApplyLabelFilter("seven")]),
    ])
    rows = {r.row_key: cells_of(r.cells) for r in ct.read_rows(filter_=union)}
    assert rows == {
        b"r1": [("cf2", b"a", 4000, b"r1:cf2:a@4", ("two",)), ("cf2", b"d", 1000, b"r1:cf2:d@1", ("two",))],
        b"r2": [("cf2", b"b", 2000, b"r2:cf2:b@2", ("two",))],
        b"r3": [("cf2", b"c", 5000, b"r3:cf2:c@5", ("two",))],
        b"r4": [("cf1", b"b", 7000, b"r4:cf1:b@7", ("seven",))],
    }

    cond = rf.ConditionalRowFilter(
        base_filter=rf.ColumnQualifierRegexFilter(b"d"),
        true_filter=rf.StripValueTransformerFilter(True),
        false_filter=rf.BlockAllFilter(True),
    )
    rows = {r.row_key: [(c[0], c[1], c[3]) for c in cells_of(r.cells)] for r in ct.read_rows(filter_=cond)}
    assert rows == {b"r1": [("cf1", b"a", b""), ("cf1", b"a", b""), ("cf1", b"a", b""), ("cf1", b"b", b""),
                            ("cf1", b"c", b""), ("cf2", b"a", b""), ("cf2", b"d", b"")]}

    ts = rf.TimestampRangeFilter(rf.TimestampRange(start=EPOCH + datetime.timedelta(microseconds=2000),
                                                   end=EPOCH + datetime.timedelta(microseconds=3000)))
    rows = {r.row_key: cells_of(r.cells) for r in ct.read_rows(filter_=ts)}
    assert rows == {
        b"r1": [("cf1", b"a", 2000, b"r1:cf1:a@2", ()), ("cf1", b"c", 2000, b"r1:cf1:c@2", ())],
        b"r2": [("cf2", b"b", 2000, b"r2:cf2:b@2", ())],
    }

    limit = rf.RowFilterChain(filters=[rf.CellsRowOffsetFilter(1), rf.CellsRowLimitFilter(1)])
    row = ct.read_row(b"r1", filter_=limit)
    assert cells_of(row.cells) == [("cf1", b"a", 2000, b"r1:cf1:a@2", ())]


def data_cells(row) -> list[tuple]:
    return [(c.family, c.qualifier, c.timestamp_micros, c.value, tuple(c.labels)) for c in row.cells]


def test_data_client_row_filters(main, data_client):
    from google.cloud.bigtable.data import ReadRowsQuery
    from google.cloud.bigtable.data import row_filters as drf

    t = data_client.get_table(btlib.INSTANCE, main.id)

    rows = t.read_rows(ReadRowsQuery(row_filter=drf.ValueRangeFilter(start_value=b"r2", end_value=b"r3", inclusive_end=False)))
    assert [(r.row_key, data_cells(r)) for r in rows] == [
        (b"r2", [("cf1", b"a", 1000, b"r2:cf1:a@1", ()), ("cf2", b"b", 2000, b"r2:cf2:b@2", ())]),
    ]

    union = drf.RowFilterUnion(filters=[
        drf.RowFilterChain(filters=[drf.RowKeyRegexFilter(b"r3"), drf.ApplyLabelFilter("three")]),
        drf.RowFilterChain(filters=[drf.ColumnRangeFilter("cf1", start_qualifier=b"ab", end_qualifier=b"b", inclusive_end=False), drf.ApplyLabelFilter("ab")]),
    ])
    rows = t.read_rows(ReadRowsQuery(row_filter=union))
    assert [(r.row_key, data_cells(r)) for r in rows] == [
        (b"r3", [("cf2", b"c", 5000, b"r3:cf2:c@5", ("three",))]),
        (b"r4", [("cf1", b"ab", 1000, b"r4:cf1:ab@1", ("ab",))]),
    ]

    cond = drf.ConditionalRowFilter(
        predicate_filter=drf.ColumnQualifierRegexFilter(b"ab"),
        true_filter=drf.RowFilterChain(filters=[drf.CellsRowLimitFilter(1), drf.StripValueTransformerFilter(True)]),
        false_filter=drf.BlockAllFilter(True),
    )
    rows = t.read_rows(ReadRowsQuery(row_filter=cond))
    assert [(r.row_key, data_cells(r)) for r in rows] == [(b"r4", [("cf1", b"ab", 1000, b"", ())])]

    row = t.read_row(b"r1", row_filter=drf.RowFilterChain(filters=[drf.FamilyNameRegexFilter("cf2"), drf.CellsColumnLimitFilter(1), drf.TimestampRangeFilter(end=None)]))
    assert data_cells(row) == [("cf2", b"a", 4000, b"r1:cf2:a@4", ()), ("cf2", b"d", 1000, b"r1:cf2:d@1", ())]


@pytest.mark.parametrize(
    "value",
    [b"a.b*c", b"a\nb", b"x y-z:@#!", b"\x00\x01\xff", b"(?i)[]{}|\\^$"],
    ids=["regex-metachars", "newline", "punctuation", "binary", "more-metachars"],
)
def test_data_client_literal_value_filter(bt, value):
    """LiteralValueFilter escapes the value the way RE2::QuoteMeta does (a backslash before
    every non-word ASCII byte, \\x00 for NUL); the server must read it back as the literal."""
    from google.cloud.bigtable.data import ReadRowsQuery
    from google.cloud.bigtable.data import row_filters as drf

    t = bt.table(["cf1"])
    decoys = [b"axb", value + b"x", b"x" + value, value[:-1]]
    t.write(b"r", ("cf1", b"hit", 1000, value), *[("cf1", b"decoy%d" % i, 1000, d) for i, d in enumerate(decoys)])
    rows = t.data_table.read_rows(ReadRowsQuery(row_filter=drf.LiteralValueFilter(value)))
    assert [data_cells(r) for r in rows] == [[("cf1", b"hit", 1000, value, ())]]


def test_data_client_literal_int_value_filter(bt):
    """LiteralValueFilter(int) matches the 8-byte big-endian encoding (a counter's value)."""
    from google.cloud.bigtable.data import ReadRowsQuery
    from google.cloud.bigtable.data import row_filters as drf

    t = bt.table(["cf1"])
    t.write(b"r", *[("cf1", b"n%d" % n, 1000, btlib.i64(n)) for n in (-1, 0, 5, 10, 2**40)])
    for n in (-1, 0, 5, 2**40):
        rows = t.data_table.read_rows(ReadRowsQuery(row_filter=drf.LiteralValueFilter(n)))
        assert [data_cells(r) for r in rows] == [[("cf1", b"n%d" % n, 1000, btlib.i64(n), ())]]
