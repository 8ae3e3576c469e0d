"""Data API: writes, timestamps, reads (row sets, ranges, limits, reversed), cell order,
MutateRows statuses, atomicity, deletes, mutation order, basic filters.
Also round trips through the classic and the new data client."""

import time

import pytest
from google.api_core import exceptions as gexc

import btlib

from btlib import (
    SERVER_TIME,
    Cell,
    Row,
    RowRange,
    delete_from_column,
    delete_from_family,
    delete_from_row,
    f_block_all,
    f_cells_per_column,
    f_chain,
    f_pass_all,
    mutate_row,
    mutate_rows,
    now_micros,
    read_rows,
    set_cell,
    table_name,
)

# ----------------------------------------------------------------------- writing


def test_set_cell_explicit_timestamp(table):
    table.write(b"r1", ("cf1", b"q", 1_000, b"v1"))
    assert table.read() == [Row(b"r1", [Cell("cf1", b"q", 1_000, b"v1")])]


def test_set_cell_server_timestamp(table):
    before = now_micros()
    table.write(b"r1", ("cf1", b"q", SERVER_TIME, b"v"))
    after = now_micros() + 1000
    (row,) = table.read()
    (cell,) = row.cells
    assert (cell.family, cell.qualifier, cell.value) == ("cf1", b"q", b"v")
    assert cell.ts % 1000 == 0, "server timestamps must be millisecond-aligned"
    assert before - 1_000_000 <= cell.ts <= after + 1_000_000  # same clock, 1 s of slack


def test_server_timestamps_of_successive_writes_do_not_go_back(table):
    for i in range(3):
        table.write(b"r", ("cf1", b"q%d" % i, SERVER_TIME, b"v"))
        time.sleep(0.002)
    ts = [c.ts for c in table.read_row(b"r").cells]
    assert ts == sorted(ts)


@pytest.mark.parametrize("ts", [0, 1000, 2**62 - (2**62 % 1000)])
def test_timestamp_edges_accepted(table, ts):
    table.write(b"r", ("cf1", b"q", ts, b"v"))
    assert table.read_row(b"r").cells == [Cell("cf1", b"q", ts, b"v")]


@pytest.mark.parametrize("ts", [1, 999, 1001, 1_234_567, -2, -1000])
def test_bad_timestamp_is_invalid_argument(table, ts):
    with pytest.raises(gexc.InvalidArgument):
        table.write(b"r", ("cf1", b"ok", 1000, b"v"), ("cf1", b"q", ts, b"v"))
    assert table.read() == []


def test_overwrite_same_timestamp_replaces_value(table):
    table.write(b"r", ("cf1", b"q", 5000, b"old"))
    table.write(b"r", ("cf1", b"q", 5000, b"new"))
    assert table.read_row(b"r").cells == [Cell("cf1", b"q", 5000, b"new")]


def test_empty_qualifier_and_empty_value(table):
    table.write(b"r", ("cf1", b"", 1000, b""), ("cf1", b"q", 1000, b""))
    assert table.read_row(b"r").cells == [Cell("cf1", b"", 1000, b""), Cell("cf1", b"q", 1000, b"")]


def test_binary_keys_qualifiers_values(table):
    everything = bytes(range(256))
    table.write(everything, ("cf1", everything, 1000, everything * 3))
    table.write(b"\x00", ("cf1", b"\xff", 1000, b"\x00"))
    table.write(b"\xff", ("cf1", b"\x00", 1000, b"\xff"))
    assert table.read() == [
        Row(b"\x00", [Cell("cf1", b"\xff", 1000, b"\x00")]),
        Row(everything, [Cell("cf1", everything, 1000, everything * 3)]),
        Row(b"\xff", [Cell("cf1", b"\x00", 1000, b"\xff")]),
    ]


# ----------------------------------------------------------------------- errors


def test_unknown_table_is_not_found(bt):
    name = table_name("no-such-table")
    with pytest.raises(gexc.NotFound):
        mutate_row(bt.data, name, b"r", [set_cell("cf", b"q", b"v", 1000)])
    with pytest.raises(gexc.NotFound):
        read_rows(bt.data, name)
    with pytest.raises(gexc.NotFound):
        mutate_rows(bt.data, name, [(b"r", [set_cell("cf", b"q", b"v", 1000)])])


@pytest.mark.parametrize("name", ["garbage", "projects/p/instances/i/tables/", "projects/p/instances/i/tables/bad id"])
def test_malformed_table_name_is_invalid_argument(bt, name):
    with pytest.raises(gexc.InvalidArgument):
        mutate_row(bt.data, name, b"r", [set_cell("cf", b"q", b"v", 1000)])
    with pytest.raises(gexc.InvalidArgument):
        read_rows(bt.data, name)


def test_unknown_family_is_not_found(table):
    with pytest.raises(gexc.NotFound):
        table.write(b"r", ("nope", b"q", 1000, b"v"))
    for m in (delete_from_family("nope"), delete_from_column("nope", b"q")):
        with pytest.raises(gexc.NotFound):
            table.mutate(b"r", m)
    assert table.read() == []


def test_empty_mutation_list_is_invalid_argument(table):
    with pytest.raises(gexc.InvalidArgument):
        table.mutate(b"r")
    # in MutateRows an entry without mutations fails alone
    statuses = table.mutate_rows([(b"r", []), (b"ok", [set_cell("cf1", b"q", b"v", 1000)])])
    assert statuses == ["INVALID_ARGUMENT", "OK"]
    assert table.keys() == [b"ok"]


def test_mutate_rows_without_entries_is_invalid_argument(table):
    with pytest.raises(gexc.InvalidArgument):
        table.mutate_rows([])


# ------------------------------------------------------------------------ reads


KEYS = [b"a", b"a\x00", b"ab", b"b", b"c", b"d", b"e", b"\xff"]


@pytest.fixture
def keyed(table):
    """A table with one cell in each row of KEYS (value = key)."""
    table.mutate_rows([(k, [set_cell("cf1", b"q", k, 1000)]) for k in KEYS])
    return table


def test_full_scan_returns_rows_in_byte_order(keyed):
    assert keyed.read() == [Row(k, [Cell("cf1", b"q", 1000, k)]) for k in KEYS]


def test_read_by_keys(keyed):
    assert keyed.keys(keys=[b"d", b"a", b"missing", b"a\x00"]) == [b"a", b"a\x00", b"d"]
    assert keyed.keys(keys=[b"missing"]) == []


@pytest.mark.parametrize(
    "rng, expected",
    [
        (RowRange(start_key_closed=b"b", end_key_open=b"d"), [b"b", b"c"]),
        (RowRange(start_key_closed=b"b", end_key_closed=b"d"), [b"b", b"c", b"d"]),
        (RowRange(start_key_open=b"b", end_key_open=b"d"), [b"c"]),
        (RowRange(start_key_open=b"b", end_key_closed=b"d"), [b"c", b"d"]),
        (RowRange(end_key_open=b"b"), [b"a", b"a\x00", b"ab"]),
        (RowRange(end_key_closed=b"b"), [b"a", b"a\x00", b"ab", b"b"]),
        (RowRange(start_key_closed=b"d"), [b"d", b"e", b"\xff"]),
        (RowRange(start_key_open=b"d"), [b"e", b"\xff"]),
        (RowRange(), KEYS),
        (RowRange(start_key_open=b"a", end_key_open=b"ab"), [b"a\x00"]),
        (RowRange(start_key_closed=b"a", end_key_open=b"a\x00"), [b"a"]),
        (RowRange(start_key_closed=b"c", end_key_closed=b"c"), [b"c"]),
        (RowRange(start_key_closed=b"bb", end_key_open=b"bc"), []),
        (RowRange(start_key_closed=b"\x00", end_key_closed=b"\xff"), KEYS),
        (RowRange(start_key_open=b"e"), [b"\xff"]),
    ],
    ids=[
        "closed-open", "closed-closed", "open-open", "open-closed",
        "unbounded-open", "unbounded-closed", "closed-unbounded", "open-unbounded",
        "unbounded-unbounded", "open-open-prefix", "closed-open-successor", "point",
        "empty-gap", "binary-bounds", "open-start-high-byte",
    ],
)
def test_range_bounds(keyed, rng, expected):
    assert keyed.keys(ranges=[rng]) == expected


def test_duplicate_and_overlapping_row_sets_return_each_row_once(keyed):
    got = keyed.read(
        keys=[b"c", b"c", b"a", b"e"],
        ranges=[
            RowRange(start_key_closed=b"a", end_key_closed=b"c"),
            RowRange(start_key_closed=b"b", end_key_open=b"d"),
            RowRange(start_key_closed=b"b", end_key_open=b"d"),
        ],
    )
    assert [r.key for r in got] == [b"a", b"a\x00", b"ab", b"b", b"c", b"e"]
    assert all(r.cells == [Cell("cf1", b"q", 1000, r.key)] for r in got)


def test_keys_and_ranges_combined(keyed):
    got = keyed.keys(keys=[b"\xff", b"a"], ranges=[RowRange(start_key_open=b"b", end_key_closed=b"c")])
    assert got == [b"a", b"c", b"\xff"]


@pytest.mark.parametrize("limit, expected", [(1, KEYS[:1]), (3, KEYS[:3]), (len(KEYS), KEYS), (100, KEYS)])
def test_rows_limit(keyed, limit, expected):
    assert keyed.keys(limit=limit) == expected


def test_rows_limit_with_row_set(keyed):
    got = keyed.keys(keys=[b"e", b"a"], ranges=[RowRange(start_key_closed=b"c")], limit=3)
    assert got == [b"a", b"c", b"d"]


def test_reversed_full_scan(keyed):
    got = keyed.read(reversed=True)
    assert got == [Row(k, [Cell("cf1", b"q", 1000, k)]) for k in reversed(KEYS)]


def test_reversed_with_limit(keyed):
    assert keyed.keys(reversed=True, limit=3) == [b"\xff", b"e", b"d"]


@pytest.mark.parametrize(
    "rng, expected",
    [
        (RowRange(start_key_closed=b"b", end_key_closed=b"d"), [b"d", b"c", b"b"]),
        (RowRange(start_key_open=b"b", end_key_open=b"d"), [b"c"]),
        (RowRange(end_key_open=b"b"), [b"ab", b"a\x00", b"a"]),
        (RowRange(start_key_open=b"d"), [b"\xff", b"e"]),
    ],
    ids=["closed-closed", "open-open", "unbounded-open", "open-unbounded"],
)
def test_reversed_with_ranges(keyed, rng, expected):
    assert keyed.keys(ranges=[rng], reversed=True) == expected


def test_reversed_with_keys_ranges_and_limit(keyed):
    got = keyed.keys(
        keys=[b"a", b"\xff", b"a"],
        ranges=[RowRange(start_key_closed=b"b", end_key_open=b"e"), RowRange(start_key_closed=b"c", end_key_closed=b"c")],
        reversed=True,
        limit=4,
    )
    assert got == [b"\xff", b"d", b"c", b"b"]


def test_reversed_keeps_cell_order_within_row(table):
    cells = [("cf1", b"a", 2000, b"1"), ("cf1", b"a", 1000, b"2"), ("cf1", b"b", 1000, b"3"), ("cf2", b"a", 1000, b"4")]
    for key in (b"r1", b"r2"):
        table.write(key, *reversed(cells))
    expected = [Cell(f, q, ts, v) for f, q, ts, v in cells]
    assert table.read(reversed=True) == [Row(b"r2", expected), Row(b"r1", expected)]


def test_many_rows_stream(table):
    # 1,000 rows x 1 KiB: more than one ReadRowsResponse's worth
    keys = [b"row%05d" % i for i in range(1000)]
    table.mutate_rows([(k, [set_cell("cf1", b"q", k * 128, 1000)]) for k in keys])
    got = table.read()
    assert [r.key for r in got] == keys
    assert all(r.cells == [Cell("cf1", b"q", 1000, r.key * 128)] for r in got)
    assert table.keys(reversed=True) == keys[::-1]


# ------------------------------------------------------------------ cell order


def test_cell_order_within_row(bt):
    t = bt.table(["zeta", "alpha", "mid"])
    # written in scrambled order, in several requests
    t.write(b"r", ("zeta", b"q", 1000, b"z1"), ("mid", b"b", 1000, b"m1"))
    t.write(b"r", ("alpha", b"\xff", 3000, b"a1"), ("alpha", b"b", 1000, b"a2"), ("alpha", b"b", 3000, b"a3"))
    t.write(b"r", ("alpha", b"b", 2000, b"a4"), ("alpha", b"B", 1000, b"a5"), ("mid", b"a", 5000, b"m2"))
    t.write(b"r", ("alpha", b"", 7000, b"a6"), ("alpha", b"b\x00", 1000, b"a7"))
    assert t.read_row(b"r").cells == [
        Cell("alpha", b"", 7000, b"a6"),
        Cell("alpha", b"B", 1000, b"a5"),
        Cell("alpha", b"b", 3000, b"a3"),
        Cell("alpha", b"b", 2000, b"a4"),
        Cell("alpha", b"b", 1000, b"a2"),
        Cell("alpha", b"b\x00", 1000, b"a7"),
        Cell("alpha", b"\xff", 3000, b"a1"),
        Cell("mid", b"a", 5000, b"m2"),
        Cell("mid", b"b", 1000, b"m1"),
        Cell("zeta", b"q", 1000, b"z1"),
    ]


# ------------------------------------------------------------------- MutateRows


def test_mutate_rows_per_entry_statuses(table):
    statuses = table.mutate_rows(
        [
            (b"r1", [set_cell("cf1", b"q", b"v1", 1000)]),
            (b"r2", [set_cell("cf1", b"q", b"v2", 1000), set_cell("nope", b"q", b"x", 1000)]),
            (b"r3", [set_cell("cf2", b"q", b"v3", 1000)]),
            (b"r4", [set_cell("cf1", b"q", b"v4", 1000), set_cell("cf1", b"q2", b"x", 1001)]),
            (b"", [set_cell("cf1", b"q", b"empty key", 1000)]),
            (b"r5", [set_cell("cf1", b"q", b"v5", SERVER_TIME)]),
        ]
    )
    assert statuses == ["OK", "NOT_FOUND", "OK", "INVALID_ARGUMENT", "INVALID_ARGUMENT", "OK"]
    rows = table.read()
    assert [r.key for r in rows] == [b"r1", b"r3", b"r5"]
    assert rows[0].cells == [Cell("cf1", b"q", 1000, b"v1")]
    assert rows[1].cells == [Cell("cf2", b"q", 1000, b"v3")]


def test_mutate_rows_same_row_twice(table):
    statuses = table.mutate_rows(
        [
            (b"r", [set_cell("cf1", b"a", b"1", 1000)]),
            (b"r", [set_cell("cf1", b"b", b"2", 1000)]),
        ]
    )
    assert statuses == ["OK", "OK"]
    assert table.read_row(b"r").cells == [Cell("cf1", b"a", 1000, b"1"), Cell("cf1", b"b", 1000, b"2")]


def test_data_client_bulk_mutate_reports_failed_entries(table):
    from google.cloud.bigtable.data.exceptions import MutationsExceptionGroup
    from google.cloud.bigtable.data.mutations import RowMutationEntry, SetCell

    entries = [
        RowMutationEntry(b"a", [SetCell("cf1", b"q", b"1", timestamp_micros=1000)]),
        RowMutationEntry(b"b", [SetCell("missing", b"q", b"2", timestamp_micros=1000)]),
        RowMutationEntry(b"c", [SetCell("cf2", b"q", b"3", timestamp_micros=1000)]),
    ]
    with pytest.raises(MutationsExceptionGroup) as err:
        table.data_table.bulk_mutate_rows(entries)
    failed = err.value.exceptions
    assert [e.index for e in failed] == [1]
    assert isinstance(failed[0].__cause__, gexc.NotFound)
    assert table.keys() == [b"a", b"c"]


# -------------------------------------------------------------------- atomicity


@pytest.mark.parametrize(
    "bad, error",
    [
        (set_cell("nope", b"q", b"v", 1000), gexc.NotFound),
        (set_cell("cf1", b"q", b"v", 1500), gexc.InvalidArgument),
        (delete_from_family("nope"), gexc.NotFound),
    ],
    ids=["unknown-family", "bad-timestamp", "delete-unknown-family"],
)
def test_mutate_row_is_atomic(table, bad, error):
    table.write(b"r", ("cf1", b"keep", 1000, b"original"))
    with pytest.raises(error):
        table.mutate(
            b"r",
            delete_from_row(),
            set_cell("cf1", b"new", b"x", 2000),
            set_cell("cf2", b"new", b"y", 2000),
            bad,
            set_cell("cf1", b"after", b"z", 2000),
        )
    assert table.read() == [Row(b"r", [Cell("cf1", b"keep", 1000, b"original")])]


# ---------------------------------------------------------------------- deletes


@pytest.fixture
def versions(table):
    """Row r: cf1:q at 1000..5000 (values v1..v5), cf1:other at 1000, cf2:q at 1000."""
    table.write(
        b"r",
        *[("cf1", b"q", i * 1000, b"v%d" % i) for i in range(1, 6)],
        ("cf1", b"other", 1000, b"o"),
        ("cf2", b"q", 1000, b"f2"),
    )
    return table


def _ts(row, family, qualifier):
    return [c.ts for c in row.cells if (c.family, c.qualifier) == (family, qualifier)]


def test_delete_from_column_all_versions(versions):
    versions.mutate(b"r", delete_from_column("cf1", b"q"))
    assert versions.read_row(b"r").cells == [Cell("cf1", b"other", 1000, b"o"), Cell("cf2", b"q", 1000, b"f2")]


@pytest.mark.parametrize(
    "start, end, remaining",
    [
        (2000, 4000, [5000, 4000, 1000]),
        (3000, None, [2000, 1000]),
        (None, 3000, [5000, 4000, 3000]),
        (0, None, []),
        (1000, 1000, [5000, 4000, 3000, 2000, 1000]),
        (6000, 9000, [5000, 4000, 3000, 2000, 1000]),
        (5000, 6000, [4000, 3000, 2000, 1000]),
    ],
    ids=["[2000,4000)", "[3000,inf)", "[0,3000)", "[0,inf)", "empty", "after-all", "newest-only"],
)
def test_delete_from_column_time_range(versions, start, end, remaining):
    versions.mutate(b"r", delete_from_column("cf1", b"q", start=start, end=end))
    row = versions.read_row(b"r")
    assert _ts(row, "cf1", b"q") == remaining
    assert [c.value for c in row.cells if c.qualifier == b"q" and c.family == "cf1"] == [
        b"v%d" % (t // 1000) for t in remaining
    ]
    assert _ts(row, "cf1", b"other") == [1000]
    assert _ts(row, "cf2", b"q") == [1000]


def test_delete_from_family(versions):
    versions.mutate(b"r", delete_from_family("cf1"))
    assert versions.read() == [Row(b"r", [Cell("cf2", b"q", 1000, b"f2")])]


def test_delete_from_row(versions):
    versions.write(b"other-row", ("cf1", b"q", 1000, b"x"))
    versions.mutate(b"r", delete_from_row())
    assert versions.keys() == [b"other-row"]


def test_deleting_missing_data_is_ok(table):
    table.mutate(b"ghost", delete_from_row())
    table.mutate(b"ghost", delete_from_family("cf1"), delete_from_column("cf2", b"q", start=0, end=5000))
    assert table.read() == []


# --------------------------------------------------------------- mutation order


def test_delete_row_then_set_cell_in_one_request(versions):
    versions.mutate(b"r", delete_from_row(), set_cell("cf2", b"new", b"fresh", 1000))
    assert versions.read() == [Row(b"r", [Cell("cf2", b"new", 1000, b"fresh")])]


def test_set_cell_then_delete_column_in_one_request(table):
    table.mutate(b"r", set_cell("cf1", b"q", b"gone", 1000), set_cell("cf1", b"k", b"kept", 1000), delete_from_column("cf1", b"q"))
    assert table.read() == [Row(b"r", [Cell("cf1", b"k", 1000, b"kept")])]


def test_set_cell_then_delete_family_then_set_cell(table):
    table.mutate(
        b"r",
        set_cell("cf1", b"a", b"1", 1000),
        set_cell("cf2", b"b", b"2", 1000),
        delete_from_family("cf1"),
        set_cell("cf1", b"c", b"3", 1000),
    )
    assert table.read_row(b"r").cells == [Cell("cf1", b"c", 1000, b"3"), Cell("cf2", b"b", 1000, b"2")]


def test_same_cell_twice_in_one_request_last_wins(table):
    table.mutate(b"r", set_cell("cf1", b"q", b"first", 1000), set_cell("cf1", b"q", b"second", 1000))
    assert table.read() == [Row(b"r", [Cell("cf1", b"q", 1000, b"second")])]


# ---------------------------------------------------------------------- filters


@pytest.fixture
def filtered(table):
    """r1: cf1:a @3000,2000,1000; cf1:b @1000; cf2:a @5000,4000. r2: cf1:a @1000."""
    table.write(
        b"r1",
        ("cf1", b"a", 1000, b"a1"), ("cf1", b"a", 2000, b"a2"), ("cf1", b"a", 3000, b"a3"),
        ("cf1", b"b", 1000, b"b1"), ("cf2", b"a", 4000, b"c4"), ("cf2", b"a", 5000, b"c5"),
    )
    table.write(b"r2", ("cf1", b"a", 1000, b"x"))
    return table


R1_ALL = [
    Cell("cf1", b"a", 3000, b"a3"), Cell("cf1", b"a", 2000, b"a2"), Cell("cf1", b"a", 1000, b"a1"),
    Cell("cf1", b"b", 1000, b"b1"), Cell("cf2", b"a", 5000, b"c5"), Cell("cf2", b"a", 4000, b"c4"),
]
R2_ALL = [Cell("cf1", b"a", 1000, b"x")]


def test_no_filter_and_pass_all(filtered):
    expected = [Row(b"r1", R1_ALL), Row(b"r2", R2_ALL)]
    assert filtered.read() == expected
    assert filtered.read(filter=f_pass_all()) == expected


def test_block_all(filtered):
    assert filtered.read(filter=f_block_all()) == []
    assert filtered.read(filter=f_block_all(), keys=[b"r1"], limit=1) == []


@pytest.mark.parametrize(
    "n, expected_r1",
    [
        (1, [R1_ALL[0], R1_ALL[3], R1_ALL[4]]),
        (2, [R1_ALL[0], R1_ALL[1], R1_ALL[3], R1_ALL[4], R1_ALL[5]]),
        (3, R1_ALL),
        (100, R1_ALL),
    ],
)
def test_cells_per_column_limit(filtered, n, expected_r1):
    assert filtered.read(filter=f_cells_per_column(n)) == [Row(b"r1", expected_r1), Row(b"r2", R2_ALL)]


@pytest.mark.parametrize(
    "flt, expected",
    [
        (f_chain(f_pass_all(), f_cells_per_column(1)), [Row(b"r1", [R1_ALL[0], R1_ALL[3], R1_ALL[4]]), Row(b"r2", R2_ALL)]),
        (f_chain(f_cells_per_column(2), f_cells_per_column(1)), [Row(b"r1", [R1_ALL[0], R1_ALL[3], R1_ALL[4]]), Row(b"r2", R2_ALL)]),
        (f_chain(f_cells_per_column(2), f_pass_all()), [Row(b"r1", [R1_ALL[i] for i in (0, 1, 3, 4, 5)]), Row(b"r2", R2_ALL)]),
        (f_chain(f_pass_all(), f_block_all()), []),
        (f_chain(f_block_all(), f_pass_all()), []),
        (f_chain(f_chain(f_pass_all(), f_cells_per_column(2)), f_chain(f_cells_per_column(1), f_pass_all())), [Row(b"r1", [R1_ALL[0], R1_ALL[3], R1_ALL[4]]), Row(b"r2", R2_ALL)]),
    ],
    ids=["pass+limit1", "limit2+limit1", "limit2+pass", "pass+block", "block+pass", "nested"],
)
def test_chain(filtered, flt, expected):
    assert filtered.read(filter=flt) == expected


def test_chain_of_one_filter_is_invalid_argument(filtered):
    # like Cloud Bigtable (and the Go emulator): a chain needs at least two filters
    with pytest.raises(gexc.InvalidArgument):
        filtered.read(filter=f_chain(f_cells_per_column(1)))


def test_filter_with_reversed_and_limit(filtered):
    assert filtered.read(filter=f_cells_per_column(1), reversed=True, limit=1) == [Row(b"r2", R2_ALL)]


# ------------------------------------------------------------ other client APIs


def test_data_client_round_trip(table):
    from google.cloud.bigtable.data import ReadRowsQuery, RowRange as DRowRange
    from google.cloud.bigtable.data.mutations import DeleteAllFromRow, RowMutationEntry, SetCell
    from google.cloud.bigtable.data.row_filters import CellsColumnLimitFilter

    t = table.data_table
    t.mutate_row(b"k1", [SetCell("cf1", b"q", b"v1", timestamp_micros=1000), SetCell("cf1", b"q", b"v2", timestamp_micros=2000)])
    t.bulk_mutate_rows([RowMutationEntry(b"k2", SetCell("cf2", b"q", b"w", timestamp_micros=1000)),
                        RowMutationEntry(b"k3", SetCell("cf2", b"q", b"x", timestamp_micros=1000))])
    row = t.read_row(b"k1")
    assert [(c.family, c.qualifier, c.timestamp_micros, c.value) for c in row.cells] == [
        ("cf1", b"q", 2000, b"v2"), ("cf1", b"q", 1000, b"v1"),
    ]
    latest = t.read_row(b"k1", row_filter=CellsColumnLimitFilter(1))
    assert [c.value for c in latest.cells] == [b"v2"]
    rows = t.read_rows(ReadRowsQuery(row_ranges=[DRowRange(start_key=b"k2")]))
    assert [r.row_key for r in rows] == [b"k2", b"k3"]
    rows = t.read_rows(ReadRowsQuery(row_keys=[b"k3", b"k1"], limit=1))
    assert [r.row_key for r in rows] == [b"k1"]
    assert t.read_row(b"nope") is None
    t.mutate_row(b"k2", DeleteAllFromRow())
    assert [r.row_key for r in t.read_rows(ReadRowsQuery())] == [b"k1", b"k3"]
    # and the GAPIC view agrees
    assert table.keys() == [b"k1", b"k3"]


def test_data_client_server_side_timestamp(table):
    from google.cloud.bigtable.data.mutations import SetCell

    before = now_micros()
    table.data_table.mutate_row(b"k", SetCell("cf1", b"q", b"v", timestamp_micros=SERVER_TIME))
    (cell,) = table.read_row(b"k").cells
    assert cell.ts % 1000 == 0 and before - 1_000_000 <= cell.ts <= now_micros() + 1_000_000


def test_classic_client_round_trip(table):
    import datetime

    from google.cloud.bigtable.row_filters import CellsColumnLimitFilter
    from google.cloud.bigtable.row_set import RowSet

    ct = table.classic_table
    ts = datetime.datetime(2024, 1, 2, 3, 4, 5, 678000, tzinfo=datetime.timezone.utc)
    row = ct.direct_row(b"c1")
    row.set_cell("cf1", b"q", b"hello", timestamp=ts)
    row.set_cell("cf2", b"n", 42, timestamp=ts)
    status = row.commit()
    assert status.code == 0

    got = ct.read_row(b"c1")
    assert got.row_key == b"c1"
    assert got.cells["cf1"][b"q"][0].value == b"hello"
    assert got.cells["cf1"][b"q"][0].timestamp == ts
    assert got.cells["cf2"][b"n"][0].value == (42).to_bytes(8, "big")

    rows = [ct.direct_row(b"c%d" % i) for i in (2, 3)]
    for r in rows:
        r.set_cell("cf1", b"q", b"bulk", timestamp=ts)
    assert [s.code for s in ct.mutate_rows(rows)] == [0, 0]

    bad = ct.direct_row(b"c4")
    bad.set_cell("missing-family", b"q", b"x", timestamp=ts)
    assert bad.commit().code == 5  # NOT_FOUND

    rs = RowSet()
    rs.add_row_key(b"c3")
    rs.add_row_range_from_keys(start_key=b"c1", end_key=b"c2", end_inclusive=True)
    assert [r.row_key for r in ct.read_rows(row_set=rs)] == [b"c1", b"c2", b"c3"]
    assert [r.row_key for r in ct.read_rows(start_key=b"c2", limit=5)] == [b"c2", b"c3"]
    assert [r.row_key for r in ct.read_rows(filter_=CellsColumnLimitFilter(1), limit=1)] == [b"c1"]

    d = ct.direct_row(b"c1")
    d.delete_cell("cf2", b"n")
    d.commit()
    assert list(ct.read_row(b"c1").cells) == ["cf1"]


# ------------------------------------------------------------------ sparse scans: heartbeats


def test_sparse_filtered_scans_report_last_scanned_row_key(bt):
    """After 1,000 consecutive rows without output the server sends an empty response with
    `last_scanned_row_key` (as Bigtable does), rows before it first; clients accept it."""
    from google.cloud.bigtable.data import ReadRowsQuery, row_filters
    from google.cloud.bigtable_v2 import types as v2

    from btlib import f_value

    t = bt.table(["cf"])
    keys = [b"r%04d" % i for i in range(2500)]
    statuses = t.mutate_rows([(k, [set_cell("cf", b"q", b"match" if k == b"r1500" else b"no", 1000)]) for k in keys])
    assert statuses == ["OK"] * len(keys)

    def raw(reversed_):
        req = v2.ReadRowsRequest(table_name=t.name, filter=f_value(b"match"), reversed=reversed_)
        out = []
        for resp in t.env.data.read_rows(request=req, retry=None, timeout=60):
            rows = [c.row_key for c in resp.chunks if c.row_key]
            out.append(("rows", rows) if rows else ("scanned", resp.last_scanned_row_key))
        return out

    assert raw(False) == [("scanned", b"r0999"), ("rows", [b"r1500"])]
    assert raw(True) == [("rows", [b"r1500"]), ("scanned", b"r0500")]

    # The high-level client handles the heartbeat transparently.
    table = bt.data_client.get_table(btlib.INSTANCE, t.id)
    rows = table.read_rows(ReadRowsQuery(row_filter=row_filters.ValueRegexFilter(b"match")))
    assert [r.row_key for r in rows] == [b"r1500"]


def test_request_stats_full_view(bt):
    """`request_stats_view: REQUEST_STATS_FULL` adds the read's iteration stats and its
    server latency to the stream's last message, even when nothing is returned; without it
    no stats are sent."""
    from google.cloud.bigtable_v2 import types as v2

    t = bt.table(["cf"])
    for i in range(5):
        t.write(b"r%d" % i, ("cf", b"a", 1000, b"x"), ("cf", b"b", 1000, b"y"), ("cf", b"b", 2000, b"z"))
    full = v2.ReadRowsRequest.RequestStatsView.REQUEST_STATS_FULL

    def raw(**kw):
        req = v2.ReadRowsRequest(table_name=t.name, **kw)
        return list(t.env.data.read_rows(request=req, retry=None, timeout=60))

    def stats(responses):
        assert all(not r._pb.HasField("request_stats") for r in responses[:-1])
        last = responses[-1]
        assert last._pb.HasField("request_stats") and not last.chunks
        view = last.request_stats.full_read_stats_view
        it = view.read_iteration_stats
        latency = view.request_latency_stats.frontend_server_latency
        assert latency.total_seconds() < 60
        return (it.rows_seen_count, it.rows_returned_count, it.cells_seen_count, it.cells_returned_count)

    assert stats(raw(request_stats_view=full)) == (5, 5, 15, 15)
    # a filter: every row and cell is seen, one cell per row returned
    assert stats(raw(request_stats_view=full, filter=btlib.f_row_limit(1))) == (5, 5, 15, 5)
    # rows_limit stops the scan
    assert stats(raw(request_stats_view=full, rows_limit=2)) == (2, 2, 6, 6)
    # a point read, and a read that finds nothing
    assert stats(raw(request_stats_view=full, rows=v2.RowSet(row_keys=[b"r3"]))) == (1, 1, 3, 3)
    assert stats(raw(request_stats_view=full, rows=v2.RowSet(row_keys=[b"nope"]))) == (0, 0, 0, 0)
    # rows whose cells the filter drops are seen but not returned
    assert stats(raw(request_stats_view=full, filter=btlib.f_value(b"nothing"))) == (5, 0, 15, 0)
    # not asked for: no stats
    responses = raw()
    assert responses and all(not r._pb.HasField("request_stats") for r in responses)
    assert raw(request_stats_view=v2.ReadRowsRequest.RequestStatsView.REQUEST_STATS_NONE)[-1].chunks
