"""ReadModifyWriteRow: append / increment on the latest cell, rule order, response contents,
timestamps, errors, and concurrent increments.

Reference: ``ReadModifyWriteRule`` (data.proto): a missing cell counts as the empty string /
zero; an increment needs an 8-byte big-endian signed integer "or the entire request will
fail"; ``ReadModifyWriteRowRequest`` (bigtable.proto): rules "applied in order, meaning that
earlier rules will affect the results of later ones", 1 to 100,000 of them; the response
"contains the new contents of all cells modified by the request". The client libraries document
the new timestamp as "the greater of the existing timestamp or the current server time".
On a non-8-byte value Cloud Bigtable answers FAILED_PRECONDITION "Cannot increment value ...
The increment operation can only be performed on 64-bit values" (googleapis/google-cloud-go#1455).
"""


import pytest
from google.api_core import exceptions as gexc
from google.cloud.bigtable_v2 import types as v2

from semlib import run_threads
from btlib import (
    MAX_MUTATIONS,
    MAX_ROW_KEY,
    Cell,
    Row,
    i64,
    now_micros,
    read_modify_write,
    rmw_append,
    rmw_increment,
    table_name,
)

NOW = None  # expected timestamp placeholder: "the server's current time"


def check_rmw(t, key, initial, rules, expected):
    """Writes ``initial`` cells, runs the rules, and checks the response (``expected`` =
    [(family, qualifier, ts or NOW, value)]) and the row read back afterwards (initial cells
    plus the new ones)."""
    if initial:
        t.write(key, *initial)
    before = now_micros()
    got = t.read_modify_write(key, *rules)
    after = now_micros() + 1000
    assert got.key == key
    assert [(c.family, c.qualifier, c.value, c.labels) for c in got.cells] == [(f, q, v, ()) for f, q, _, v in expected]
    new_cells = []
    for c, (_, _, ts, _) in zip(got.cells, expected):
        if ts is NOW:
            assert c.ts % 1000 == 0, f"timestamp {c.ts} is not millisecond-aligned"
            assert before - 1_000_000 <= c.ts <= after + 1_000_000, f"timestamp {c.ts} is not 'now' ({before})"
        else:
            assert c.ts == ts
        new_cells.append(c)
    # the modified cells are new versions; everything else in the row is untouched
    stored = {(f, q, ts): Cell(f, q, ts, v) for f, q, ts, v in initial}
    for c in new_cells:
        stored[(c.family, c.qualifier, c.ts)] = Cell(c.family, c.qualifier, c.ts, c.value)
    expected_row = sorted(stored.values(), key=lambda c: (c.family, c.qualifier, -c.ts))
    assert t.read(keys=[key]) == [Row(key, expected_row)]
    return got


OTHER = ("cf2", b"other", 1000, b"untouched")

CASES = [
    # id, initial cells, rules, expected response cells
    ("append-to-missing", [], [rmw_append("cf1", b"a", b"xy")], [("cf1", b"a", NOW, b"xy")]),
    ("append-to-existing", [("cf1", b"a", 1000, b"ab")], [rmw_append("cf1", b"a", b"cd")], [("cf1", b"a", NOW, b"abcd")]),
    ("append-reads-latest-version", [("cf1", b"a", 1000, b"old"), ("cf1", b"a", 2000, b"new")],
     [rmw_append("cf1", b"a", b"!")], [("cf1", b"a", NOW, b"new!")]),
    ("append-nothing", [("cf1", b"a", 1000, b"ab")], [rmw_append("cf1", b"a", b"")], [("cf1", b"a", NOW, b"ab")]),
    ("append-binary", [("cf1", b"a", 1000, b"\xff\x00")], [rmw_append("cf1", b"a", b"\x00\xff")], [("cf1", b"a", NOW, b"\xff\x00\x00\xff")]),
    ("append-empty-qualifier", [], [rmw_append("cf1", b"", b"v")], [("cf1", b"", NOW, b"v")]),
    ("increment-missing-is-zero", [], [rmw_increment("cf1", b"n", 5)], [("cf1", b"n", NOW, i64(5))]),
    ("increment-existing", [("cf1", b"n", 1000, i64(10))], [rmw_increment("cf1", b"n", 5)], [("cf1", b"n", NOW, i64(15))]),
    ("increment-negative-amount", [("cf1", b"n", 1000, i64(10))], [rmw_increment("cf1", b"n", -15)], [("cf1", b"n", NOW, i64(-5))]),
    ("increment-negative-value", [("cf1", b"n", 1000, i64(-3))], [rmw_increment("cf1", b"n", 1)], [("cf1", b"n", NOW, i64(-2))]),
    ("increment-missing-by-negative", [], [rmw_increment("cf1", b"n", -1)], [("cf1", b"n", NOW, b"\xff" * 8)]),
    ("increment-by-zero-still-writes", [("cf1", b"n", 1000, i64(7))], [rmw_increment("cf1", b"n", 0)], [("cf1", b"n", NOW, i64(7))]),
    ("increment-large", [("cf1", b"n", 1000, i64(2**40))], [rmw_increment("cf1", b"n", 2**40)], [("cf1", b"n", NOW, i64(2**41))]),
    ("increment-reads-latest-version", [("cf1", b"n", 1000, i64(100)), ("cf1", b"n", 3000, i64(1))],
     [rmw_increment("cf1", b"n", 1)], [("cf1", b"n", NOW, i64(2))]),
    ("increments-accumulate-in-order", [], [rmw_increment("cf1", b"n", 1), rmw_increment("cf1", b"n", 2), rmw_increment("cf1", b"n", 3)],
     [("cf1", b"n", NOW, i64(6))]),
    ("appends-accumulate-in-order", [("cf1", b"a", 1000, b"0")], [rmw_append("cf1", b"a", b"1"), rmw_append("cf1", b"a", b"2")],
     [("cf1", b"a", NOW, b"012")]),
    ("append-then-increment-same-column", [], [rmw_append("cf1", b"n", b"\x00" * 7 + b"\x01"), rmw_increment("cf1", b"n", 1)],
     [("cf1", b"n", NOW, i64(2))]),
    ("increment-then-append-same-column", [], [rmw_increment("cf1", b"n", 1), rmw_append("cf1", b"n", b"!")],
     [("cf1", b"n", NOW, i64(1) + b"!")]),
    ("response-in-bigtable-order", [], [rmw_increment("cf2", b"z", 1), rmw_append("cf1", b"b", b"x"), rmw_append("cf1", b"a", b"y")],
     [("cf1", b"a", NOW, b"y"), ("cf1", b"b", NOW, b"x"), ("cf2", b"z", NOW, i64(1))]),
    ("response-has-only-modified-cells", [("cf1", b"a", 1000, b"x"), OTHER], [rmw_append("cf1", b"a", b"y")], [("cf1", b"a", NOW, b"xy")]),
    ("same-qualifier-two-families", [], [rmw_append("cf2", b"q", b"2"), rmw_append("cf1", b"q", b"1")],
     [("cf1", b"q", NOW, b"1"), ("cf2", b"q", NOW, b"2")]),
]


@pytest.mark.parametrize("initial, rules, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_rules(bt, initial, rules, expected):
    check_rmw(bt.table(["cf1", "cf2"]), b"row", initial, rules, expected)


def test_new_timestamp_keeps_a_future_latest_timestamp(bt):
    """New timestamp = max(latest cell's timestamp, now): a cell far in the future keeps its
    timestamp, so the new value replaces it (same row, column and timestamp)."""
    t = bt.table(["cf1"])
    future = now_micros() + 10 * 24 * 3600 * 1_000_000
    check_rmw(t, b"row", [("cf1", b"n", 1000, i64(100)), ("cf1", b"n", future, i64(1))],
              [rmw_increment("cf1", b"n", 1)], [("cf1", b"n", future, i64(2))])
    assert [c.ts for c in t.read_row(b"row").cells] == [future, 1000]
    check_rmw(t, b"row2", [("cf1", b"a", future, b"x")], [rmw_append("cf1", b"a", b"y")], [("cf1", b"a", future, b"xy")])


def test_new_timestamp_is_now_for_past_cells(bt):
    t = bt.table(["cf1"])
    past = now_micros() - 3600 * 1_000_000
    got = check_rmw(t, b"row", [("cf1", b"a", past, b"x")], [rmw_append("cf1", b"a", b"y")], [("cf1", b"a", NOW, b"xy")])
    assert got.cells[0].ts > past


def test_successive_increments_do_not_go_back_in_time(bt):
    t = bt.table(["cf1"])
    stamps = [t.read_modify_write(b"row", rmw_increment("cf1", b"n", 1)).cells[0].ts for _ in range(5)]
    assert stamps == sorted(stamps)
    assert t.read(filter=v2.RowFilter(cells_per_column_limit_filter=1))[0].cells[0].value == i64(5)


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "value",
    [b"", b"1234", b"\x00" * 7, b"\x00" * 9, b"10"],
    ids=["empty", "4-bytes", "7-bytes", "9-bytes", "ascii-digits"],
)
def test_increment_non_64_bit_value_is_failed_precondition(bt, value):
    t = bt.table(["cf1"])
    t.write(b"row", ("cf1", b"n", 1000, value))
    with pytest.raises(gexc.FailedPrecondition):
        t.read_modify_write(b"row", rmw_increment("cf1", b"n", 1))
    assert t.read() == [Row(b"row", [Cell("cf1", b"n", 1000, value)])]


@pytest.mark.parametrize(
    "rules",
    [
        [rmw_increment("cf1", b"ok", 1), rmw_append("cf1", b"a", b"x"), rmw_increment("cf1", b"bad", 1)],
        [rmw_append("cf1", b"x", b"abc"), rmw_increment("cf1", b"x", 1)],
        [rmw_increment("cf1", b"ok", 1), rmw_append("cf1", b"ok", b"!"), rmw_increment("cf1", b"ok", 1)],
    ],
    ids=["other-column-bad", "append-made-it-bad", "own-append-made-it-bad"],
)
def test_failed_increment_fails_the_whole_request(bt, rules):
    t = bt.table(["cf1"])
    t.write(b"row", ("cf1", b"bad", 1000, b"abc"))
    with pytest.raises(gexc.FailedPrecondition):
        t.read_modify_write(b"row", *rules)
    assert t.read() == [Row(b"row", [Cell("cf1", b"bad", 1000, b"abc")])]


def test_no_rules_is_invalid_argument(bt):
    t = bt.table(["cf1"])
    with pytest.raises(gexc.InvalidArgument):
        t.read_modify_write(b"row")


def test_rule_without_operation_is_invalid_argument(bt):
    t = bt.table(["cf1"])
    with pytest.raises(gexc.InvalidArgument):
        t.read_modify_write(b"row", v2.ReadModifyWriteRule(family_name="cf1", column_qualifier=b"q"))
    assert t.read() == []


def test_more_than_100000_rules_is_invalid_argument(bt):
    t = bt.table(["cf1"])
    pb_rule = v2.ReadModifyWriteRule.pb()
    rules = [pb_rule(family_name="cf1", column_qualifier=b"q", increment_amount=1)] * (MAX_MUTATIONS + 1)
    with pytest.raises(gexc.InvalidArgument):
        t.read_modify_write(b"row", *rules)
    assert t.read() == []


def test_unknown_family_is_not_found(bt):
    t = bt.table(["cf1"])
    with pytest.raises(gexc.NotFound):
        t.read_modify_write(b"row", rmw_increment("nope", b"n", 1))
    with pytest.raises(gexc.NotFound):
        t.read_modify_write(b"row", rmw_append("cf1", b"a", b"x"), rmw_append("nope", b"a", b"x"))
    assert t.read() == []


def test_unknown_table_is_not_found(bt):
    with pytest.raises(gexc.NotFound):
        read_modify_write(bt.data, table_name("no-such-table"), b"row", [rmw_increment("cf1", b"n", 1)])


@pytest.mark.parametrize("key", [b"", b"k" * (MAX_ROW_KEY + 1)], ids=["empty", "4097-bytes"])
def test_bad_row_key_is_invalid_argument(bt, key):
    t = bt.table(["cf1"])
    with pytest.raises(gexc.InvalidArgument):
        t.read_modify_write(key, rmw_increment("cf1", b"n", 1))
    assert t.read() == []


# ---------------------------------------------------------------- high-level clients


def test_data_client_read_modify_write(bt):
    from google.cloud.bigtable.data.read_modify_write_rules import AppendValueRule, IncrementRule

    t = bt.table(["cf1", "cf2"])
    dt = t.data_table
    row = dt.read_modify_write_row(b"k", [IncrementRule("cf1", b"hits"), IncrementRule("cf1", b"hits", 41), AppendValueRule("cf2", "log", "a")])
    assert row.row_key == b"k"
    assert [(c.family, c.qualifier, c.value) for c in row.cells] == [("cf1", b"hits", i64(42)), ("cf2", b"log", b"a")]
    row = dt.read_modify_write_row("k", AppendValueRule("cf2", b"log", b"bc"))
    assert [(c.family, c.qualifier, c.value) for c in row.cells] == [("cf2", b"log", b"abc")]
    assert int.from_bytes(dt.read_row(b"k").cells[0].value, "big", signed=True) == 42


def test_classic_client_append_row(bt):
    t = bt.table(["cf1"])
    row = t.classic_table.append_row(b"k")
    row.increment_cell_value("cf1", b"n", 3)
    row.append_cell_value("cf1", b"s", b"hello")
    row.increment_cell_value("cf1", b"n", -1)
    result = row.commit()
    assert {fam: {q: [v for v, _ in cells] for q, cells in cols.items()} for fam, cols in result.items()} == {
        "cf1": {b"n": [i64(2)], b"s": [b"hello"]}
    }


# ----------------------------------------------------------------------- concurrency


def test_concurrent_increments_through_data_client(bt):
    """8 threads x 50 increments of one counter: the final value is exactly 400 and every
    response saw a distinct intermediate value (1..400)."""
    from google.cloud.bigtable.data.read_modify_write_rules import IncrementRule

    threads, per_thread = 8, 50
    t = bt.table(["cf1"])
    dt = t.data_table
    seen = [[] for _ in range(threads)]

    def worker(i):
        for _ in range(per_thread):
            row = dt.read_modify_write_row(b"counter", IncrementRule("cf1", b"n", 1))
            seen[i].append(int.from_bytes(row.cells[0].value, "big", signed=True))

    run_threads(threads, worker)
    total = threads * per_thread
    assert sorted(v for s in seen for v in s) == list(range(1, total + 1))
    assert all(s == sorted(s) for s in seen), "a thread saw the counter go backwards"
    latest = t.read(filter=v2.RowFilter(cells_per_column_limit_filter=1))
    assert latest == [Row(b"counter", [Cell("cf1", b"n", latest[0].cells[0].ts, i64(total))])]


def test_concurrent_appends_lose_nothing(bt):
    threads, per_thread = 4, 25
    t = bt.table(["cf1"])

    def worker(i):
        for j in range(per_thread):
            t.read_modify_write(b"log", rmw_append("cf1", b"l", b"[%d.%02d]" % (i, j)))

    run_threads(threads, worker)
    value = t.read(filter=v2.RowFilter(cells_per_column_limit_filter=1))[0].cells[0].value
    entries = value.split(b"]")[:-1]
    assert sorted(entries) == sorted(b"[%d.%02d" % (i, j) for i in range(threads) for j in range(per_thread))
    for i in range(threads):  # each thread's appends stay in its own order
        mine = [e for e in entries if e.startswith(b"[%d." % i)]
        assert mine == sorted(mine)
