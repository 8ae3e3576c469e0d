"""Aggregate column families (Sum / Min / Max over Int64): schema, AddToCell, MergeToCell,
reads, deletes, GC, validation, durability.

References: ``ColumnFamily.value_type`` (admin table.proto: "For now, only the Aggregate type
is supported ... can only be set at family creation"), ``Type.Aggregate`` (types.proto: Sum /
Min / Max take Int64, "State: same as input"; ``state_type`` is output only),
``Mutation.AddToCell`` / ``Mutation.MergeToCell`` (data.proto: qualifier "must be a raw_value",
timestamp "must be a raw_timestamp_micros that matches the table's granularity", merging NULL
"is allowed, but has no effect"), and https://cloud.google.com/bigtable/docs/aggregates
(aggregate cells are garbage collected like others; an add to a deleted cell creates a new one).
Reads return the state: a 64-bit big-endian signed integer. MergeToCell inputs are sent as
``int_value`` (the transport kind of the Int64 state type, types.proto); which other Value kinds
production accepts there (the official Go client's MergeBytesToCell sends ``raw_value``) is not
documented, so it is not asserted here.

Basalt does not support HyperLogLog++ families (UNIMPLEMENTED) -- a Basalt choice, not Bigtable
behaviour.
"""

import pytest
from google.api_core import exceptions as gexc
from google.cloud.bigtable_admin_v2 import types as at
from google.cloud.bigtable_v2 import types as v2

import btlib
from btlib import (
    AdminType,
    Cell,
    Row,
    add_to_cell,
    aggregate_family,
    delete_from_column,
    delete_from_family,
    delete_from_row,
    f_cells_per_column,
    gc_age,
    gc_versions,
    i64,
    int64_be_type,
    merge_to_cell,
    mod_create,
    now_micros,
    rmw_increment,
    set_cell,
)

AGGS = ["sum", "min", "max"]


@pytest.fixture
def agg(bt):
    """Families sum / min / max (aggregates) and raw (plain bytes)."""
    return bt.table({"max": aggregate_family("max"), "min": aggregate_family("min"), "raw": None, "sum": aggregate_family("sum")})


def expected_type(aggregator: str) -> AdminType:
    field = {"sum": ("sum", AdminType.Aggregate.Sum()), "min": ("min_", AdminType.Aggregate.Min()),
             "max": ("max_", AdminType.Aggregate.Max())}[aggregator]
    return AdminType(aggregate_type=AdminType.Aggregate(
        input_type=int64_be_type(), state_type=int64_be_type(), **{field[0]: field[1]}))


# --------------------------------------------------------------------------- schema


@pytest.mark.parametrize("aggregator", AGGS)
def test_create_table_with_aggregate_family(bt, aggregator):
    t = bt.table({"agg": aggregate_family(aggregator), "plain": None})
    fams = t.get().column_families
    assert fams["agg"].value_type == expected_type(aggregator)
    assert at.ColumnFamily.pb(fams["plain"]).HasField("value_type") is False


@pytest.mark.parametrize("aggregator", AGGS)
def test_modify_column_families_creates_aggregate_family(bt, aggregator):
    t = bt.table(["plain"])
    got = t.modify(mod_create("agg", aggregate_family(aggregator, gc_versions(3))))
    assert got.column_families["agg"].value_type == expected_type(aggregator)
    fam = t.get().column_families["agg"]
    assert fam.value_type == expected_type(aggregator)
    assert fam.gc_rule == gc_versions(3)
    t.mutate(b"r", add_to_cell("agg", b"q", 1000, 4))
    assert t.read() == [Row(b"r", [Cell("agg", b"q", 1000, i64(4))])]


@pytest.mark.parametrize("aggregator", AGGS)
@pytest.mark.parametrize("encoding", ["unset", "empty"])
def test_int64_without_encoding_means_big_endian(bt, aggregator, encoding):
    """The way the Python client naturally writes it --
    ``Type.Aggregate(input_type=Type(int64_type=Type.Int64()), sum=...)`` -- leaves the Int64's
    encoding unset; the Go client fills in big-endian there and the emulator assumes it.
    Created through CreateTable and ModifyColumnFamilies; GetTable reports big-endian."""
    int64 = AdminType.Int64() if encoding == "unset" else AdminType.Int64(encoding=AdminType.Int64.Encoding())
    family = at.ColumnFamily(value_type=btlib.aggregate_type(aggregator, AdminType(int64_type=int64)))
    t = bt.table({"agg": family})
    assert t.get().column_families["agg"].value_type == expected_type(aggregator)
    got = t.modify(mod_create("more", family))
    assert got.column_families["more"].value_type == expected_type(aggregator)
    t.mutate(b"r", add_to_cell("agg", b"q", 1000, 4), add_to_cell("agg", b"q", 1000, 3))
    expected = {"sum": 7, "min": 3, "max": 4}[aggregator]
    assert t.read() == [Row(b"r", [Cell("agg", b"q", 1000, i64(expected))])]


def hll_type() -> AdminType:
    return AdminType(aggregate_type=AdminType.Aggregate(
        input_type=AdminType(bytes_type=AdminType.Bytes(encoding=AdminType.Bytes.Encoding(raw=AdminType.Bytes.Encoding.Raw()))),
        state_type=int64_be_type(),
        hllpp_unique_count=AdminType.Aggregate.HyperLogLogPlusPlusUniqueCount()))


def test_hll_family_counts_distinct_inputs(bt):
    t = bt.table({"hll": aggregate_family("hll"), "plain": None})
    assert t.get().column_families["hll"].value_type == hll_type()
    # 300 distinct users, each seen 3 times, in several requests and encodings.
    for rnd in range(3):
        t.mutate(b"page", *[add_to_cell("hll", b"visitors", 1000, v2.Value(raw_value=b"user-%d" % i)) for i in range(0, 300, 2)])
        t.mutate(b"page", *[add_to_cell("hll", b"visitors", 1000, v2.Value(string_value="user-%d" % i)) for i in range(1, 300, 2)])
    t.mutate(b"page", add_to_cell("hll", b"ids", 1000, 7), add_to_cell("hll", b"ids", 1000, v2.Value(raw_value=i64(7))),
             add_to_cell("hll", b"ids", 1000, 8))
    rows = t.read()
    assert [(c.qualifier, c.ts) for c in rows[0].cells] == [(b"ids", 1000), (b"visitors", 1000)]
    counts = {c.qualifier: int.from_bytes(c.value, "big", signed=True) for c in rows[0].cells}
    # int_value 7 and its 8-byte raw encoding are the same input.
    assert counts[b"ids"] == 2
    # HyperLogLog++ at precision 14: small cardinalities are (near) exact.
    assert abs(counts[b"visitors"] - 300) <= 3, counts


def test_hll_rejects_merges_and_unhashable_inputs(bt):
    t = bt.table({"hll": aggregate_family("hll")})
    t.mutate(b"r", add_to_cell("hll", b"q", 1000, v2.Value(raw_value=b"a")))
    with pytest.raises(gexc.InvalidArgument):
        t.mutate(b"r", merge_to_cell("hll", b"q", 1000, v2.Value(raw_value=b"state")))
    with pytest.raises(gexc.InvalidArgument):
        t.mutate(b"r", add_to_cell("hll", b"q", 1000, v2.Value(float_value=1.5)))
    assert [c.value for c in t.read()[0].cells] == [i64(1)]


def test_hll_counts_survive_restart(server_factory):
    server = server_factory()
    c = server.clients()
    name = btlib.table_name("hll_restart")
    btlib.create_table(c.admin, "hll_restart", {"hll": aggregate_family("hll")})
    btlib.mutate_row(c.data, name, b"r", [add_to_cell("hll", b"q", 1000, v2.Value(raw_value=b"u%d" % i)) for i in range(50)])
    c.close()
    server.kill9()
    server.start()
    c = server.clients()
    rows = btlib.read_rows(c.data, name)
    c.close()
    assert [c.value for c in rows[0].cells] == [i64(50)]


# ---------------------------------------------------------------------- aggregation


AGGREGATION = [
    ("sum", [1, 2, 3], 6),
    ("sum", [5, -8], -3),
    ("sum", [0], 0),
    ("sum", [-1], -1),
    ("sum", [2**40, 2**40, -(2**39)], 2**41 - 2**39),
    ("min", [5, -3, 10], -3),
    ("min", [7], 7),
    ("min", [9, 4, 4, 6], 4),
    ("max", [-5, -2], -2),
    ("max", [1, 9, 4], 9),
    ("max", [-7], -7),
]


@pytest.mark.parametrize("aggregator, inputs, expected", AGGREGATION, ids=[f"{a}-{'_'.join(map(str, i))}" for a, i, _ in AGGREGATION])
@pytest.mark.parametrize("batching", ["one-request", "separate-requests"])
def test_add_to_cell(agg, aggregator, inputs, expected, batching):
    adds = [add_to_cell(aggregator, b"q", 1000, n) for n in inputs]
    if batching == "one-request":
        agg.mutate(b"r", *adds)
    else:
        for m in adds:
            agg.mutate(b"r", m)
    assert agg.read() == [Row(b"r", [Cell(aggregator, b"q", 1000, i64(expected))])]


def test_each_timestamp_is_a_separate_cell(agg):
    agg.mutate(b"r", add_to_cell("sum", b"q", 1000, 1), add_to_cell("sum", b"q", 2000, 10), add_to_cell("sum", b"q", 1000, 2))
    agg.mutate(b"r", add_to_cell("sum", b"q", 3000, 100))
    assert agg.read() == [Row(b"r", [Cell("sum", b"q", 3000, i64(100)), Cell("sum", b"q", 2000, i64(10)), Cell("sum", b"q", 1000, i64(3))])]
    assert agg.read(filter=f_cells_per_column(1)) == [Row(b"r", [Cell("sum", b"q", 3000, i64(100))])]


def test_columns_rows_and_families_are_independent(agg):
    agg.mutate_rows([
        (b"a", [add_to_cell("sum", b"x", 1000, 1), add_to_cell("sum", b"y", 1000, 2), add_to_cell("max", b"x", 1000, 3)]),
        (b"b", [add_to_cell("sum", b"x", 1000, 4), add_to_cell("min", b"x", 1000, 5), set_cell("raw", b"x", b"plain", 1000)]),
    ])
    agg.mutate_rows([(b"a", [add_to_cell("sum", b"x", 1000, 10)]), (b"b", [add_to_cell("min", b"x", 1000, -5)])])
    assert agg.read() == [
        Row(b"a", [Cell("max", b"x", 1000, i64(3)), Cell("sum", b"x", 1000, i64(11)), Cell("sum", b"y", 1000, i64(2))]),
        Row(b"b", [Cell("min", b"x", 1000, i64(-5)), Cell("raw", b"x", 1000, b"plain"), Cell("sum", b"x", 1000, i64(4))]),
    ]


# ---------------------------------------------------------------------- merge_to_cell

MERGES = [
    ("sum", [add_to_cell("sum", b"q", 1000, 5), merge_to_cell("sum", b"q", 1000, 10)], 15),
    ("sum", [merge_to_cell("sum", b"q", 1000, -4)], -4),
    ("min", [add_to_cell("min", b"q", 1000, 5), merge_to_cell("min", b"q", 1000, 2)], 2),
    ("min", [merge_to_cell("min", b"q", 1000, 8), add_to_cell("min", b"q", 1000, 9)], 8),
    ("max", [merge_to_cell("max", b"q", 1000, 7), add_to_cell("max", b"q", 1000, 3)], 7),
    ("max", [add_to_cell("max", b"q", 1000, -7), merge_to_cell("max", b"q", 1000, -9)], -7),
    ("sum", [add_to_cell("sum", b"q", 1000, 5), merge_to_cell("sum", b"q", 1000, v2.Value())], 5),
]


@pytest.mark.parametrize("family, mutations, expected", MERGES,
                         ids=["sum-add-merge", "sum-merge-into-empty", "min-add-merge", "min-merge-add",
                              "max-merge-add", "max-negative", "merge-null-has-no-effect"])
def test_merge_to_cell(agg, family, mutations, expected):
    for m in mutations:
        agg.mutate(b"r", m)
    assert agg.read() == [Row(b"r", [Cell(family, b"q", 1000, i64(expected))])]


@pytest.mark.parametrize("kind", ["raw_value", "bytes_value"])
def test_merge_to_cell_accepts_the_encoded_state(agg, kind):
    # The state of Sum/Min/Max is an Int64; the Go client's MergeBytesToCell sends it encoded.
    agg.mutate(b"r", add_to_cell("sum", b"q", 1000, 5))
    agg.mutate(b"r", raw_add(Q, TS, v2.Value(**{kind: i64(37)}), merge=True))
    assert agg.read() == [Row(b"r", [Cell("sum", b"q", 1000, i64(42))])]
    with pytest.raises(gexc.InvalidArgument):
        agg.mutate(b"r", raw_add(Q, TS, v2.Value(**{kind: b"\x01\x02"}), merge=True))
    assert agg.read() == [Row(b"r", [Cell("sum", b"q", 1000, i64(42))])]


def test_merge_null_into_missing_cell_creates_nothing(agg):
    agg.mutate(b"r", merge_to_cell("sum", b"q", 1000, v2.Value()))
    assert agg.read() == []


# ---------------------------------------------------------------------- deletes, GC


def test_delete_from_column_then_add_starts_from_zero(agg):
    agg.mutate(b"r", add_to_cell("sum", b"q", 1000, 5), add_to_cell("min", b"q", 1000, -50))
    agg.mutate(b"r", delete_from_column("sum", b"q"), delete_from_column("min", b"q"))
    assert agg.read() == []
    agg.mutate(b"r", add_to_cell("sum", b"q", 1000, 2), add_to_cell("min", b"q", 1000, 9))
    assert agg.read() == [Row(b"r", [Cell("min", b"q", 1000, i64(9)), Cell("sum", b"q", 1000, i64(2))])]


def test_delete_between_adds_in_one_request(agg):
    agg.mutate(b"r", add_to_cell("sum", b"q", 1000, 5), delete_from_column("sum", b"q"), add_to_cell("sum", b"q", 1000, 2))
    assert agg.read() == [Row(b"r", [Cell("sum", b"q", 1000, i64(2))])]


def test_delete_time_range_of_aggregate_cells(agg):
    agg.mutate(b"r", *[add_to_cell("sum", b"q", ts, ts // 1000) for ts in (1000, 2000, 3000)])
    agg.mutate(b"r", delete_from_column("sum", b"q", start=2000, end=3000))
    agg.mutate(b"r", add_to_cell("sum", b"q", 2000, 7), add_to_cell("sum", b"q", 3000, 7))
    assert agg.read() == [Row(b"r", [Cell("sum", b"q", 3000, i64(10)), Cell("sum", b"q", 2000, i64(7)), Cell("sum", b"q", 1000, i64(1))])]


def test_delete_family_and_row(agg):
    agg.mutate(b"r", add_to_cell("sum", b"q", 1000, 5), add_to_cell("max", b"q", 1000, 5))
    agg.mutate(b"r", delete_from_family("sum"))
    assert agg.read() == [Row(b"r", [Cell("max", b"q", 1000, i64(5))])]
    agg.mutate(b"r", delete_from_row())
    agg.mutate(b"r", add_to_cell("max", b"q", 1000, -1))
    assert agg.read() == [Row(b"r", [Cell("max", b"q", 1000, i64(-1))])]


def test_gc_max_versions_applies_to_aggregate_cells(bt):
    t = bt.table({"sum": aggregate_family("sum", gc_versions(2))})
    for ts in (1000, 2000, 3000):
        t.mutate(b"r", add_to_cell("sum", b"q", ts, ts // 1000), add_to_cell("sum", b"q", ts, 10))
    assert t.read() == [Row(b"r", [Cell("sum", b"q", 3000, i64(13)), Cell("sum", b"q", 2000, i64(12))])]


def test_gc_max_age_applies_to_aggregate_cells(bt):
    t = bt.table({"sum": aggregate_family("sum", gc_age(3600))})
    now = now_micros()
    t.mutate(b"r", add_to_cell("sum", b"q", 1000, 5), add_to_cell("sum", b"q", now, 6), add_to_cell("sum", b"q", now, 1))
    assert t.read() == [Row(b"r", [Cell("sum", b"q", now, i64(7))])]


# ------------------------------------------------------------------------ validation


def test_add_to_cell_into_plain_family_is_invalid_argument(agg):
    for m in (add_to_cell("raw", b"q", 1000, 1), merge_to_cell("raw", b"q", 1000, 1)):
        with pytest.raises(gexc.InvalidArgument):
            agg.mutate(b"r", m)
    assert agg.read() == []


def test_set_cell_into_aggregate_family_is_invalid_argument(agg):
    for fam in AGGS:
        with pytest.raises(gexc.InvalidArgument):
            agg.mutate(b"r", set_cell(fam, b"q", i64(1), 1000))
    assert agg.read() == []


def test_unknown_family_is_not_found(agg):
    for m in (add_to_cell("nope", b"q", 1000, 1), merge_to_cell("nope", b"q", 1000, 1)):
        with pytest.raises(gexc.NotFound):
            agg.mutate(b"r", m)


def raw_add(qualifier=None, timestamp=None, input=None, merge=False):
    kw = {"family_name": "sum"}
    for name, v in (("column_qualifier", qualifier), ("timestamp", timestamp), ("input", input)):
        if v is not None:
            kw[name] = v
    if merge:
        return v2.Mutation(merge_to_cell=v2.Mutation.MergeToCell(**kw))
    return v2.Mutation(add_to_cell=v2.Mutation.AddToCell(**kw))


Q, TS, ONE = v2.Value(raw_value=b"q"), v2.Value(raw_timestamp_micros=1000), v2.Value(int_value=1)


@pytest.mark.parametrize(
    "mutation",
    [
        raw_add(None, TS, ONE),
        raw_add(v2.Value(bytes_value=b"q"), TS, ONE),
        raw_add(v2.Value(string_value="q"), TS, ONE),
        raw_add(Q, None, ONE),
        raw_add(Q, v2.Value(int_value=1000), ONE),
        raw_add(Q, v2.Value(raw_timestamp_micros=1500), ONE),
        raw_add(Q, TS, v2.Value(raw_value=i64(1))),
        raw_add(Q, TS, v2.Value(string_value="1")),
        raw_add(Q, TS, v2.Value(float_value=1.0)),
        raw_add(Q, TS, v2.Value(bool_value=True)),
        raw_add(Q, TS, v2.Value(string_value="1"), merge=True),
        raw_add(v2.Value(string_value="q"), TS, ONE, merge=True),
        raw_add(Q, v2.Value(raw_timestamp_micros=1001), ONE, merge=True),
    ],
    ids=[
        "qualifier-missing", "qualifier-bytes-value", "qualifier-string-value", "timestamp-missing",
        "timestamp-int-value", "timestamp-not-millis", "input-raw-value", "input-string", "input-float",
        "input-bool", "merge-input-string", "merge-qualifier-string", "merge-timestamp-not-millis",
    ],
)
def test_malformed_aggregate_mutation_is_invalid_argument(agg, mutation):
    with pytest.raises(gexc.InvalidArgument):
        agg.mutate(b"r", add_to_cell("sum", b"q", 1000, 5), mutation)
    assert agg.read() == []


def test_read_modify_write_on_aggregate_family_is_invalid_argument(agg):
    agg.mutate(b"r", add_to_cell("sum", b"q", 1000, 5))
    with pytest.raises(gexc.InvalidArgument):
        agg.read_modify_write(b"r", rmw_increment("sum", b"q", 1))
    assert agg.read() == [Row(b"r", [Cell("sum", b"q", 1000, i64(5))])]


# -------------------------------------------------------------------- other clients


def test_data_client_add_to_cell(agg):
    from google.cloud.bigtable.data.mutations import AddToCell, RowMutationEntry

    dt = agg.data_table
    dt.mutate_row(b"r", [AddToCell("sum", b"q", 5, timestamp_micros=1000), AddToCell("sum", "q", -2, timestamp_micros=1000)])
    dt.bulk_mutate_rows([RowMutationEntry(b"r", AddToCell("max", b"q", 3, 1000)), RowMutationEntry(b"s", AddToCell("min", b"q", -9, 1000))])
    assert agg.read() == [
        Row(b"r", [Cell("max", b"q", 1000, i64(3)), Cell("sum", b"q", 1000, i64(3))]),
        Row(b"s", [Cell("min", b"q", 1000, i64(-9))]),
    ]
    row = dt.read_row(b"r")
    assert [(c.family, int.from_bytes(c.value, "big", signed=True)) for c in row.cells] == [("max", 3), ("sum", 3)]


# ------------------------------------------------------------------------ durability


def test_aggregates_survive_restart(server_factory):
    server = server_factory()
    clients = server.clients()
    try:
        name = btlib.table_name("agg_restart")
        btlib.create_table(clients.admin, "agg_restart", {"sum": aggregate_family("sum"), "max": aggregate_family("max")})
        for n in (1, 2, 3):
            btlib.mutate_row(clients.data, name, b"r", [add_to_cell("sum", b"q", 1000, n), add_to_cell("max", b"q", 1000, n)])
        server.restart()
        assert btlib.read_rows(clients.data, name) == [Row(b"r", [Cell("max", b"q", 1000, i64(3)), Cell("sum", b"q", 1000, i64(6))])]
        fams = btlib.get_table(clients.admin, name).column_families
        assert fams["sum"].value_type == expected_type("sum") and fams["max"].value_type == expected_type("max")
        btlib.mutate_row(clients.data, name, b"r", [add_to_cell("sum", b"q", 1000, 10), add_to_cell("max", b"q", 1000, 2)])
        server.restart()
        assert btlib.read_rows(clients.data, name) == [Row(b"r", [Cell("max", b"q", 1000, i64(3)), Cell("sum", b"q", 1000, i64(16))])]
        with pytest.raises(gexc.InvalidArgument):  # still an aggregate family
            btlib.mutate_row(clients.data, name, b"r", [set_cell("sum", b"q", b"x", 2000)])
    finally:
        clients.close()
