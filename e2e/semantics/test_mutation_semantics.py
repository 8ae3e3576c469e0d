"""Data-model cases not covered by ``e2e/test_data.py``: unsigned byte order of keys and
qualifiers with binary bounds (forward and reversed), timestamp order, DeleteFromColumn time
range edges, deletes that must not shadow later writes or touch neighbours that share a prefix.

Reference: data.proto (``RowRange``, ``TimestampRange`` "start inclusive / end exclusive, end
empty = infinity", ``Mutation.DeleteFrom*``), bigtable.proto (``ReadRowsRequest.reversed``).
"""

import random

import pytest
from google.api_core import exceptions as gexc

from btlib import (
    Cell,
    Row,
    RowRange,
    delete_from_column,
    delete_from_family,
    delete_from_row,
    set_cell,
)

# ------------------------------------------------------------------ unsigned byte order

BIN_KEYS = sorted([
    b"\x00", b"\x00\x00", b"\x00\xff", b"\x01", b"\x7f", b"\x80", b"a", b"a\x00", b"a\x00\x00", b"a\x01",
    b"a\x7f", b"a\x80", b"a\xff", b"a\xff\x00", b"a\xff\xff", b"b", b"\xff", b"\xff\x00", b"\xff\xff",
])


def test_binary_keys_sort_as_unsigned_bytes(table):
    shuffled = BIN_KEYS[:]
    random.Random(7).shuffle(shuffled)
    for k in shuffled:
        table.write(k, ("cf1", b"q", 1000, k))
    assert table.read() == [Row(k, [Cell("cf1", b"q", 1000, k)]) for k in BIN_KEYS]
    assert table.keys(reversed=True) == BIN_KEYS[::-1]


@pytest.fixture
def binkeys(table):
    table.mutate_rows([(k, [set_cell("cf1", b"q", k, 1000)]) for k in BIN_KEYS])
    return table


def between(lo, hi, lo_open=False, hi_open=True):
    return [k for k in BIN_KEYS
            if (lo is None or (k > lo if lo_open else k >= lo)) and (hi is None or (k < hi if hi_open else k <= hi))]


BIN_RANGES = [
    (RowRange(start_key_closed=b"a", end_key_open=b"b"), between(b"a", b"b")),
    (RowRange(start_key_open=b"a", end_key_closed=b"a\xff"), between(b"a", b"a\xff", lo_open=True, hi_open=False)),
    (RowRange(start_key_closed=b"a\xff", end_key_open=b"b"), [b"a\xff", b"a\xff\x00", b"a\xff\xff"]),
    (RowRange(start_key_open=b"a\xff"), [b"a\xff\x00", b"a\xff\xff", b"b", b"\x7f", b"\x80", b"\xff", b"\xff\x00", b"\xff\xff"]),
    (RowRange(start_key_closed=b"\x00", end_key_open=b"\x01"), [b"\x00", b"\x00\x00", b"\x00\xff"]),
    (RowRange(start_key_open=b"\x7f", end_key_closed=b"\x80"), [b"\x80"]),
    (RowRange(start_key_closed=b"b", end_key_open=b"\xff"), [b"b", b"\x7f", b"\x80"]),
    (RowRange(start_key_closed=b"\xff"), [b"\xff", b"\xff\x00", b"\xff\xff"]),
    (RowRange(end_key_closed=b"\x00\x00"), [b"\x00", b"\x00\x00"]),
    (RowRange(start_key_closed=b"a\x00", end_key_open=b"a\x01"), [b"a\x00", b"a\x00\x00"]),
    (RowRange(start_key_open=b"a\x00", end_key_open=b"a\x00\x00\x00"), [b"a\x00\x00"]),
    (RowRange(start_key_closed=b"\xff\xff"), [b"\xff\xff"]),
]
BIN_RANGE_IDS = [
    "[a,b)", "(a,a-ff]", "[a-ff,b)", "(a-ff,inf)", "[00,01)", "(7f,80]", "[b,ff)", "[ff,inf)",
    "(-inf,00-00]", "[a-00,a-01)", "(a-00,a-00-00-00)", "[ff-ff,inf)",
]


@pytest.mark.parametrize("rng, expected", BIN_RANGES, ids=BIN_RANGE_IDS)
def test_binary_range_bounds(binkeys, rng, expected):
    assert binkeys.keys(ranges=[rng]) == expected


@pytest.mark.parametrize("rng, expected", BIN_RANGES, ids=BIN_RANGE_IDS)
def test_binary_range_bounds_reversed(binkeys, rng, expected):
    assert binkeys.keys(ranges=[rng], reversed=True) == expected[::-1]


@pytest.mark.parametrize(
    "keys, ranges, limit, expected",
    [
        ([b"\xff", b"\x00", b"a"], [], 0, [b"\xff", b"a", b"\x00"]),
        ([b"\xff", b"\x00", b"a", b"missing"], [], 2, [b"\xff", b"a"]),
        ([], [RowRange(start_key_open=b"a", end_key_closed=b"a\xff"), RowRange(start_key_closed=b"\xff")], 4,
         [b"\xff\xff", b"\xff\x00", b"\xff", b"a\xff"]),
        ([b"a\x01"], [RowRange(start_key_closed=b"a", end_key_open=b"a\x01"), RowRange(start_key_closed=b"a\x00", end_key_closed=b"a\x7f")], 0,
         [b"a\x7f", b"a\x01", b"a\x00\x00", b"a\x00", b"a"]),
        ([b"b"], [RowRange(end_key_open=b"\x01")], 0, [b"b", b"\x00\xff", b"\x00\x00", b"\x00"]),
        ([b"\x80"], [RowRange(start_key_open=b"\x7f", end_key_open=b"\x80")], 1, [b"\x80"]),
    ],
    ids=["keys-only", "keys-with-limit", "two-ranges-limit", "overlapping-ranges-and-key", "key-and-head-range", "empty-range-and-key"],
)
def test_reversed_reads_with_row_sets(binkeys, keys, ranges, limit, expected):
    assert binkeys.keys(keys=keys, ranges=ranges, limit=limit, reversed=True) == expected
    if not limit:  # the same set forwards
        assert binkeys.keys(keys=keys, ranges=ranges) == expected[::-1]


QUALIFIERS = sorted([b"", b"\x00", b"\x01", b"A", b"a", b"a\x00", b"aa", b"\x7f", b"\x80", b"\xff", b"\xff\xff"])


def test_qualifiers_sort_as_unsigned_bytes(table):
    shuffled = QUALIFIERS[:]
    random.Random(3).shuffle(shuffled)
    for q in shuffled[:5]:
        table.write(b"r", ("cf1", q, 1000, q))
    table.write(b"r", *[("cf1", q, 1000, q) for q in shuffled[5:]])
    assert table.read_row(b"r").cells == [Cell("cf1", q, 1000, q) for q in QUALIFIERS]


def test_timestamps_newest_first_across_magnitudes(table):
    stamps = [0, 1000, 999_000, 1_000_000, 2**40 * 1000, 2**62 - (2**62 % 1000)]
    for ts in stamps[::2]:
        table.write(b"r", ("cf1", b"q", ts, b"%d" % ts))
    table.write(b"r", *[("cf1", b"q", ts, b"%d" % ts) for ts in stamps[1::2]])
    assert table.read_row(b"r").cells == [Cell("cf1", b"q", ts, b"%d" % ts) for ts in sorted(stamps, reverse=True)]


# ------------------------------------------------------------- delete time range edges

STAMPS = [0, 1000, 2000, 3000]


@pytest.fixture
def stamped(table):
    table.write(b"r", *[("cf1", b"q", ts, b"v%d" % ts) for ts in STAMPS], ("cf1", b"other", 2000, b"o"))
    return table


@pytest.mark.parametrize(
    "start, end, remaining",
    [
        (1000, 2000, [3000, 2000, 0]),
        (0, 1000, [3000, 2000, 1000]),
        (None, 1000, [3000, 2000, 1000]),
        (2000, 3000, [3000, 1000, 0]),
        (3000, 4000, [2000, 1000, 0]),
        (2000, 0, [1000, 0]),
        (4000, 5000, [3000, 2000, 1000, 0]),
        (1000, 3000, [3000, 0]),
        (0, 0, []),
        (None, 3000 + 1000, []),
    ],
    ids=["start-inclusive-end-exclusive", "zero-start", "start-unset-is-zero", "middle", "newest", "end-zero-is-infinity",
         "after-all", "two-cells", "zero-to-infinity", "unset-to-past-newest"],
)
def test_delete_time_range_edges(stamped, start, end, remaining):
    stamped.mutate(b"r", delete_from_column("cf1", b"q", start=start, end=end))
    cells = stamped.read_row(b"r").cells
    assert cells == [Cell("cf1", b"other", 2000, b"o")] + [Cell("cf1", b"q", ts, b"v%d" % ts) for ts in remaining]


@pytest.mark.parametrize(
    "start, end",
    [(1500, 3000), (1000, 2500), (1, None), (3000, 2000)],
    ids=["start-not-millis", "end-not-millis", "start-1-micro", "start-after-end"],
)
def test_bad_delete_time_range_is_invalid_argument(stamped, start, end):
    before = stamped.read()
    with pytest.raises(gexc.InvalidArgument):
        stamped.mutate(b"r", delete_from_column("cf1", b"q", start=start, end=end))
    assert stamped.read() == before


# ----------------------------------------------------------------------- tombstones


@pytest.mark.parametrize(
    "delete",
    [
        delete_from_column("cf1", b"q"),
        delete_from_column("cf1", b"q", start=0, end=5000),
        delete_from_family("cf1"),
        delete_from_row(),
    ],
    ids=["column", "column-time-range", "family", "row"],
)
def test_deletes_do_not_shadow_later_writes(table, delete):
    table.write(b"r", ("cf1", b"q", 2000, b"first"))
    table.mutate(b"r", delete)
    assert table.read() == []
    table.write(b"r", ("cf1", b"q", 2000, b"again"), ("cf1", b"q", 1000, b"older"), ("cf1", b"q", 0, b"zero"))
    assert table.read() == [Row(b"r", [Cell("cf1", b"q", 2000, b"again"), Cell("cf1", b"q", 1000, b"older"), Cell("cf1", b"q", 0, b"zero")])]


def test_row_without_cells_disappears(table):
    table.write(b"a", ("cf1", b"q", 1000, b"v"), ("cf2", b"q", 1000, b"w"))
    table.write(b"b", ("cf1", b"q", 1000, b"v"))
    table.mutate(b"a", delete_from_column("cf1", b"q"), delete_from_family("cf2"))
    assert table.keys() == [b"b"]
    assert table.read(keys=[b"a"]) == []
    assert table.keys(reversed=True) == [b"b"]


# ------------------------------------------------------------ neighbours with a prefix


def test_delete_row_leaves_rows_sharing_its_prefix(table):
    keys = [b"a", b"a\x00", b"a\x01", b"ab", b"`\xff"]
    table.mutate_rows([(k, [set_cell("cf1", b"q", k, 1000)]) for k in keys])
    table.mutate(b"a", delete_from_row())
    assert table.keys() == sorted(k for k in keys if k != b"a")


def test_delete_column_leaves_qualifiers_sharing_its_prefix(table):
    quals = [b"", b"a", b"a\x00", b"ab", b"b"]
    table.write(b"r", *[("cf1", q, 1000, q) for q in quals], ("cf2", b"a", 1000, b"cf2"))
    table.mutate(b"r", delete_from_column("cf1", b"a"))
    assert table.read_row(b"r").cells == [Cell("cf1", q, 1000, q) for q in quals if q != b"a"] + [Cell("cf2", b"a", 1000, b"cf2")]
    table.mutate(b"r", delete_from_column("cf1", b""))
    assert [c.qualifier for c in table.read_row(b"r").cells] == [b"a\x00", b"ab", b"b", b"a"]


def test_delete_family_leaves_families_sharing_its_prefix(bt):
    t = bt.table(["cf", "cf1", "cf_"])
    t.write(b"r", ("cf", b"q", 1000, b"1"), ("cf1", b"q", 1000, b"2"), ("cf_", b"q", 1000, b"3"))
    t.mutate(b"r", delete_from_family("cf"))
    assert t.read() == [Row(b"r", [Cell("cf1", b"q", 1000, b"2"), Cell("cf_", b"q", 1000, b"3")])]


def test_family_names_are_case_sensitive(bt):
    t = bt.table(["cf", "CF"])
    t.write(b"r", ("cf", b"q", 1000, b"lower"), ("CF", b"q", 1000, b"upper"))
    assert t.read() == [Row(b"r", [Cell("CF", b"q", 1000, b"upper"), Cell("cf", b"q", 1000, b"lower")])]
    with pytest.raises(gexc.NotFound):
        t.write(b"r", ("Cf", b"q", 1000, b"x"))
    t.mutate(b"r", delete_from_family("CF"))
    assert t.read() == [Row(b"r", [Cell("cf", b"q", 1000, b"lower")])]


def test_delete_from_missing_family_fails_only_its_entry(table):
    statuses = table.mutate_rows([
        (b"a", [set_cell("cf1", b"q", b"v", 1000), delete_from_family("nope")]),
        (b"b", [delete_from_family("cf2"), set_cell("cf1", b"q", b"v", 1000)]),
        (b"c", [delete_from_column("nope", b"q")]),
    ])
    assert statuses == ["NOT_FOUND", "OK", "NOT_FOUND"]
    assert table.read() == [Row(b"b", [Cell("cf1", b"q", 1000, b"v")])]
