"""CheckAndMutateRow: predicate evaluation, branch selection, atomicity, validation, and a race.

Reference: ``CheckAndMutateRowRequest`` in ``google/bigtable/v2/bigtable.proto``: the predicate
is applied to the row; ``true_mutations`` run if it yields at least one cell, ``false_mutations``
otherwise; an unset predicate "checks that the row contains any values at all";
``predicate_matched`` reports which branch ran. Each list has at most 100,000 entries and at
least one of them must be non-empty.
"""

import functools
import threading

import pytest
from google.api_core import exceptions as gexc
from google.cloud.bigtable_v2 import types as v2

import btlib
from semlib import run_threads
from btlib import (
    MAX_MUTATIONS,
    MAX_ROW_KEY,
    SERVER_TIME,
    Cell,
    Row,
    check_and_mutate,
    delete_from_column,
    delete_from_family,
    delete_from_row,
    f_block_all,
    f_cells_per_column,
    f_chain,
    f_condition,
    f_family,
    f_label,
    f_pass_all,
    f_qualifier,
    f_row_key,
    f_row_offset,
    f_sink,
    f_strip,
    f_timestamp_range,
    f_value,
    now_micros,
    raw_set_cells,
    set_cell,
    table_name,
)

BASE = [("cf1", b"a", 2000, b"new"), ("cf1", b"a", 1000, b"old"), ("cf2", b"b", 1000, b"x")]
TRUE_CELL = ("cf1", b"t", 9000, b"T")
FALSE_CELL = ("cf1", b"f", 9000, b"F")
T = set_cell(*TRUE_CELL[:2], TRUE_CELL[3], TRUE_CELL[2])
F = set_cell(*FALSE_CELL[:2], FALSE_CELL[3], FALSE_CELL[2])


def ordered(cells) -> list[Cell]:
    """Cells in Bigtable order (family, qualifier, newest first)."""
    return [Cell(f, q, ts, v) for f, q, ts, v in sorted(cells, key=lambda c: (c[0], c[1], -c[2]))]


# id, initial cells of row "r", predicate, true mutations, false mutations, matched
CASES = [
    ("no-predicate-missing-row", [], None, [T], [F], False),
    ("no-predicate-row-with-cells", BASE, None, [T], [F], True),
    ("value-matches", BASE, f_value(b"new"), [T], [F], True),
    ("value-does-not-match", BASE, f_value(b"nope"), [T], [F], False),
    ("value-regex-is-a-full-match", BASE, f_value(b"ne"), [T], [F], False),
    ("older-version-matches", BASE, f_chain(f_qualifier(b"a"), f_value(b"old")), [T], [F], True),
    ("latest-version-only", BASE, f_chain(f_qualifier(b"a"), f_cells_per_column(1), f_value(b"old")), [T], [F], False),
    ("other-family", BASE, f_chain(f_family("cf2"), f_qualifier(b"b")), [T], [F], True),
    ("absent-column", BASE, f_chain(f_family("cf2"), f_qualifier(b"a")), [T], [F], False),
    ("block-all", BASE, f_block_all(), [T], [F], False),
    ("pass-all-on-missing-row", [], f_pass_all(), [T], [F], False),
    ("pass-all-on-row", BASE, f_pass_all(), [T], [F], True),
    ("stripped-values-still-match", BASE, f_chain(f_qualifier(b"b"), f_strip()), [T], [F], True),
    ("label-in-predicate", BASE, f_chain(f_qualifier(b"a"), f_label("p")), [T], [F], True),
    ("row-key-regex-matches", BASE, f_row_key(b"r"), [T], [F], True),
    ("row-key-regex-does-not-match", BASE, f_row_key(b"x"), [T], [F], False),
    ("row-offset-beyond-cells", BASE, f_row_offset(3), [T], [F], False),
    ("row-offset-within-cells", BASE, f_row_offset(2), [T], [F], True),
    ("timestamp-range-hit", BASE, f_timestamp_range(2000, 3000), [T], [F], True),
    ("timestamp-range-miss", BASE, f_timestamp_range(start=3000), [T], [F], False),
    ("condition-predicate", BASE, f_condition(f_qualifier(b"b"), f_block_all(), f_pass_all()), [T], [F], False),
    ("only-true-list-not-matched", BASE, f_value(b"nope"), [T], [], False),
    ("only-false-list-matched", BASE, f_value(b"x"), [], [F], True),
    ("only-true-list-matched", BASE, f_value(b"x"), [T], [], True),
    ("only-false-list-not-matched", [], None, [], [F], False),
]


@pytest.mark.parametrize("initial, predicate, true, false, matched", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_branch_selection(bt, initial, predicate, true, false, matched):
    t = bt.table(["cf1", "cf2"])
    if initial:
        t.write(b"r", *[(f, q, ts, v) for f, q, ts, v in initial])
    assert t.check_and_mutate(b"r", predicate, true=true, false=false) is matched
    applied = (true if matched else false)
    added = [TRUE_CELL] if T in applied else [FALSE_CELL] if F in applied else []
    cells = ordered(initial + added)
    assert t.read() == ([Row(b"r", cells)] if cells else [])


@pytest.mark.parametrize(
    "mutations, expected",
    [
        ([delete_from_row(), set_cell("cf2", b"c", b"fresh", 5000)], [("cf2", b"c", 5000, b"fresh")]),
        ([delete_from_family("cf1"), set_cell("cf1", b"z", b"z", 1000)], [("cf1", b"z", 1000, b"z"), ("cf2", b"b", 1000, b"x")]),
        ([delete_from_column("cf1", b"a", start=2000)], [("cf1", b"a", 1000, b"old"), ("cf2", b"b", 1000, b"x")]),
        ([set_cell("cf1", b"a", b"over", 2000), set_cell("cf1", b"a", b"last", 2000)],
         [("cf1", b"a", 2000, b"last"), ("cf1", b"a", 1000, b"old"), ("cf2", b"b", 1000, b"x")]),
        ([set_cell("cf1", b"n", b"1", 1000), delete_from_column("cf1", b"n")], BASE),
    ],
    ids=["delete-row-then-set", "delete-family-then-set", "delete-time-range", "same-cell-last-wins", "set-then-delete"],
)
def test_mutations_apply_in_order(bt, mutations, expected):
    t = bt.table(["cf1", "cf2"])
    t.write(b"r", *BASE)
    assert t.check_and_mutate(b"r", f_value(b"x"), true=mutations) is True
    assert t.read() == [Row(b"r", ordered(expected))]


def test_server_timestamp_in_mutations(bt):
    t = bt.table(["cf1"])
    before = now_micros()
    assert t.check_and_mutate(b"r", None, false=[set_cell("cf1", b"q", b"v", SERVER_TIME)]) is False
    (cell,) = t.read_row(b"r").cells
    assert (cell.family, cell.qualifier, cell.value) == ("cf1", b"q", b"v")
    assert cell.ts % 1000 == 0 and before - 1_000_000 <= cell.ts <= now_micros() + 1_000_000


def test_predicate_reads_only_its_own_row(bt):
    t = bt.table(["cf1"])
    t.write(b"other", ("cf1", b"q", 1000, b"v"))
    assert t.check_and_mutate(b"r", None, true=[T], false=[F]) is False
    assert t.keys() == [b"other", b"r"]
    assert t.read_row(b"r").cells == ordered([FALSE_CELL])


# ------------------------------------------------------------------------ atomicity


@pytest.mark.parametrize(
    "bad, error",
    [
        (set_cell("nope", b"q", b"v", 1000), gexc.NotFound),
        (set_cell("cf1", b"q", b"v", 1500), gexc.InvalidArgument),
        (delete_from_family("nope"), gexc.NotFound),
        (v2.Mutation(), gexc.InvalidArgument),
    ],
    ids=["unknown-family", "bad-timestamp", "delete-unknown-family", "empty-mutation"],
)
def test_chosen_branch_is_all_or_nothing(bt, bad, error):
    t = bt.table(["cf1", "cf2"])
    t.write(b"r", *BASE)
    with pytest.raises(error):
        t.check_and_mutate(b"r", f_value(b"new"), true=[delete_from_row(), set_cell("cf1", b"n", b"1", 1000), bad, set_cell("cf2", b"m", b"2", 1000)])
    assert t.read() == [Row(b"r", ordered(BASE))]


# ----------------------------------------------------------------------- validation


def test_both_mutation_lists_empty_is_invalid_argument(bt):
    t = bt.table(["cf1"])
    t.write(b"r", ("cf1", b"q", 1000, b"v"))
    for predicate in (None, f_pass_all()):
        with pytest.raises(gexc.InvalidArgument):
            t.check_and_mutate(b"r", predicate)


def test_unknown_family_is_not_found(bt):
    t = bt.table(["cf1"])
    with pytest.raises(gexc.NotFound):
        t.check_and_mutate(b"r", None, false=[set_cell("nope", b"q", b"v", 1000)])
    with pytest.raises(gexc.NotFound):
        t.check_and_mutate(b"r", None, false=[delete_from_column("nope", b"q")])
    assert t.read() == []


def test_unknown_table_is_not_found(bt):
    with pytest.raises(gexc.NotFound):
        check_and_mutate(bt.data, table_name("no-such-table"), b"r", None, false=[F])


@pytest.mark.parametrize("key", [b"", b"k" * (MAX_ROW_KEY + 1)], ids=["empty", "4097-bytes"])
def test_bad_row_key_is_invalid_argument(bt, key):
    t = bt.table(["cf1"])
    with pytest.raises(gexc.InvalidArgument):
        t.check_and_mutate(key, None, false=[F])
    assert t.read() == []


def test_row_key_of_4096_bytes_is_accepted(bt):
    t = bt.table(["cf1"])
    key = b"k" * MAX_ROW_KEY
    assert t.check_and_mutate(key, None, false=[F]) is False
    assert t.keys() == [key]


@functools.cache
def many_set_cells(n: int) -> list:
    return raw_set_cells("cf1", (b"q%06d" % i for i in range(n)), b"", 1000)


@pytest.mark.parametrize("which", ["true", "false"])
def test_more_than_100000_mutations_is_invalid_argument(bt, which):
    t = bt.table(["cf1"])
    with pytest.raises(gexc.InvalidArgument):
        t.check_and_mutate(b"r", None, **{which: many_set_cells(MAX_MUTATIONS + 1)})
    assert t.read() == []


def test_100000_mutations_are_accepted(bt):
    t = bt.table(["cf1"])
    assert t.check_and_mutate(b"r", None, false=many_set_cells(MAX_MUTATIONS)) is False
    (row,) = t.read(filter=f_strip())
    assert len(row.cells) == MAX_MUTATIONS


@pytest.mark.parametrize(
    "predicate",
    [f_chain(f_pass_all()), f_row_offset(-1), f_condition(f_pass_all(), f_chain(f_label("x"), f_sink())), f_label("BAD")],
    ids=["chain-of-1", "negative-offset", "sink-in-condition", "bad-label"],
)
def test_invalid_predicate_is_invalid_argument(bt, predicate):
    t = bt.table(["cf1"])
    with pytest.raises(gexc.InvalidArgument):
        t.check_and_mutate(b"r", predicate, true=[T], false=[F])
    assert t.read() == []


# ------------------------------------------------------------------ high-level clients


def test_data_client_check_and_mutate(bt):
    from google.cloud.bigtable.data import row_filters as drf
    from google.cloud.bigtable.data.mutations import DeleteAllFromRow, SetCell

    t = bt.table(["cf1"])
    dt = t.data_table
    assert dt.check_and_mutate_row(b"r", None, false_case_mutations=SetCell("cf1", b"q", b"first", timestamp_micros=1000)) is False
    assert dt.check_and_mutate_row(
        b"r", drf.ValueRegexFilter(b"first"),
        true_case_mutations=[SetCell("cf1", b"q", b"second", timestamp_micros=2000)],
        false_case_mutations=[DeleteAllFromRow()],
    ) is True
    assert dt.check_and_mutate_row(b"r", drf.ValueRegexFilter(b"first"), false_case_mutations=DeleteAllFromRow()) is True
    assert t.read() == [Row(b"r", [Cell("cf1", b"q", 2000, b"second"), Cell("cf1", b"q", 1000, b"first")])]
    pred = drf.RowFilterChain(filters=[drf.CellsColumnLimitFilter(1), drf.ValueRegexFilter(b"first")])
    assert dt.check_and_mutate_row(b"r", pred, true_case_mutations=SetCell("cf1", b"x", b"!", 1000), false_case_mutations=DeleteAllFromRow()) is False
    assert t.read() == []


def test_classic_client_conditional_row(bt):
    from google.cloud.bigtable import row_filters as rf

    t = bt.table(["cf1"])
    t.write(b"r", ("cf1", b"status", 1000, b"pending"))
    ct = t.classic_table
    row = ct.conditional_row(b"r", filter_=rf.RowFilterChain(filters=[rf.ColumnQualifierRegexFilter(b"status"), rf.ValueRegexFilter(b"pending")]))
    row.set_cell("cf1", b"status", b"done", timestamp=None, state=True)
    row.set_cell("cf1", b"error", b"not pending", state=False)
    assert row.commit() is True
    (cell_new, cell_old) = t.read_row(b"r").cells
    assert (cell_new.qualifier, cell_new.value, cell_old.value) == (b"status", b"done", b"pending")
    assert cell_new.ts > 1000

    again = ct.conditional_row(b"r", filter_=rf.RowFilterChain(filters=[rf.ColumnQualifierRegexFilter(b"status"), rf.CellsColumnLimitFilter(1), rf.ValueRegexFilter(b"pending")]))
    again.set_cell("cf1", b"status", b"twice", state=True)
    again.set_cell("cf1", b"error", b"not pending", timestamp=None, state=False)
    assert again.commit() is False
    assert [c.qualifier for c in t.read_row(b"r").cells] == [b"error", b"status", b"status"]


# ---------------------------------------------------------------------- concurrency


def test_concurrent_lock_acquisition_has_exactly_one_winner(bt):
    """N threads race to take a lock per round: predicate "column cf1:owner exists";
    the false branch sets owner = me. The winner is the one that saw predicate_matched=False
    (its false_mutations ran); everybody else must see True."""
    threads, rounds = 6, 20
    t = bt.table(["cf1"])
    barrier = threading.Barrier(threads)
    results = [[None] * threads for _ in range(rounds)]
    owner = f_chain(f_family("cf1"), f_qualifier(b"owner"))

    def worker(i):
        for rnd in range(rounds):
            barrier.wait(30)
            results[rnd][i] = check_and_mutate(
                bt.data, t.name, b"lock-%02d" % rnd, owner,
                false=[set_cell("cf1", b"owner", b"thread-%d" % i, SERVER_TIME)],
            )

    run_threads(threads, worker)
    rows = {r.key: r.cells for r in t.read()}
    assert len(rows) == rounds
    for rnd in range(rounds):
        winners = [i for i, matched in enumerate(results[rnd]) if matched is False]
        assert len(winners) == 1, f"round {rnd}: predicate_matched={results[rnd]}"
        (cell,) = rows[b"lock-%02d" % rnd]
        assert (cell.qualifier, cell.value) == (b"owner", b"thread-%d" % winners[0])


def test_concurrent_compare_and_set_counter_loses_no_update(bt):
    """Optimistic concurrency: read the counter, then CheckAndMutate "value is still v" ->
    set v+1. Every successful CAS must be counted exactly once in the final value."""
    threads, per_thread = 4, 25
    t = bt.table(["cf1"])
    t.write(b"counter", ("cf1", b"n", 1000, b"0"))
    seen = [[] for _ in range(threads)]

    def worker(i):
        while len(seen[i]) < per_thread:
            (cell,) = btlib.read_rows(bt.data, t.name, keys=[b"counter"])[0].cells
            v = int(cell.value)
            pred = f_chain(f_qualifier(b"n"), f_value(cell.value))  # full match: b"1" does not match b"17"
            if check_and_mutate(bt.data, t.name, b"counter", pred, true=[set_cell("cf1", b"n", b"%d" % (v + 1), 1000)]):
                seen[i].append(v)

    run_threads(threads, worker)
    total = threads * per_thread
    assert t.read() == [Row(b"counter", [Cell("cf1", b"n", 1000, b"%d" % total)])]
    assert sorted(v for s in seen for v in s) == list(range(total))
