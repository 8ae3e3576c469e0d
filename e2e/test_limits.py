"""Size and count limits: row key 4 KiB, qualifier 16 KiB, value 100 MiB,
100,000 mutations per request. Just-at-the-limit succeeds and round-trips; one over is
INVALID_ARGUMENT and applies nothing. After every test the server must still be healthy."""

import os

import pytest
from google.api_core import exceptions as gexc
from google.cloud.bigtable_v2 import types as v2

from btlib import (
    MAX_MUTATIONS,
    MAX_QUALIFIER,
    MAX_ROW_KEY,
    MAX_VALUE,
    Cell,
    MiB,
    digest,
    http_get,
    raw_set_cells,
    set_cell,
)


@pytest.fixture(autouse=True)
def server_still_healthy(bt):
    yield
    bt.server.assert_alive()
    status, _, body = http_get(f"{bt.server.http_url}/healthz")
    assert status == 200, body
    canary = bt.table(["cf"], table_id=bt.unique_id("canary"))
    canary.write(b"canary", ("cf", b"q", 1000, b"alive"))
    assert canary.read() == [(b"canary", [Cell("cf", b"q", 1000, b"alive")])]


def raw_mutate_row(t, key: bytes, raw_mutations, timeout=300):
    req = v2.MutateRowRequest.pb()(table_name=t.name, row_key=key, mutations=raw_mutations)
    t.env.data.mutate_row(request=v2.MutateRowRequest.wrap(req), retry=None, timeout=timeout)


def raw_mutate_rows(t, entries, timeout=300):
    """entries: [(key, [raw mutation pb])] -> list of status code names."""
    from google.rpc import code_pb2

    Entry = v2.MutateRowsRequest.Entry.pb()
    req = v2.MutateRowsRequest.pb()(
        table_name=t.name, entries=[Entry(row_key=k, mutations=ms) for k, ms in entries]
    )
    statuses = {}
    for resp in t.env.data.mutate_rows(request=v2.MutateRowsRequest.wrap(req), retry=None, timeout=timeout):
        for e in resp.entries:
            statuses[e.index] = code_pb2.Code.Name(e.status.code)
    return [statuses.get(i) for i in range(len(entries))]


# ---------------------------------------------------------------------- row keys


def test_row_key_at_limit(table):
    key = b"k" * (MAX_ROW_KEY - 1) + b"\xff"
    table.write(key, ("cf1", b"q", 1000, b"v"))
    assert table.read(keys=[key]) == [(key, [Cell("cf1", b"q", 1000, b"v")])]
    assert table.keys() == [key]


def test_row_key_over_limit_is_invalid_argument(table):
    key = b"k" * (MAX_ROW_KEY + 1)
    with pytest.raises(gexc.InvalidArgument):
        table.write(key, ("cf1", b"q", 1000, b"v"))
    statuses = table.mutate_rows([(b"ok", [set_cell("cf1", b"q", b"v", 1000)]), (key, [set_cell("cf1", b"q", b"v", 1000)])])
    assert statuses == ["OK", "INVALID_ARGUMENT"]
    assert table.keys() == [b"ok"]


def test_empty_row_key_is_invalid_argument(table):
    # Bigtable's wording, which clients and users match on.
    with pytest.raises(gexc.InvalidArgument, match="Row keys must be non-empty"):
        table.write(b"", ("cf1", b"q", 1000, b"v"))
    assert table.read() == []
    with pytest.raises(gexc.InvalidArgument, match="Row keys must be non-empty"):
        table.read(keys=[b"a", b""])
    with pytest.raises(gexc.InvalidArgument, match="Row keys must be non-empty"):
        table.check_and_mutate(b"", true=[set_cell("cf1", b"q", b"v", 1000)])


def test_no_mutations_is_invalid_argument_in_bigtables_words(table):
    with pytest.raises(gexc.InvalidArgument, match="No mutations provided"):
        table.check_and_mutate(b"r")
    with pytest.raises(gexc.InvalidArgument, match="No mutations provided"):
        table.mutate(b"r")
    assert table.read() == []


# -------------------------------------------------------------------- qualifiers


def test_qualifier_at_limit(table):
    q = bytes(range(256)) * (MAX_QUALIFIER // 256)
    assert len(q) == MAX_QUALIFIER
    table.write(b"r", ("cf1", q, 1000, b"v"))
    assert table.read_row(b"r").cells == [Cell("cf1", q, 1000, b"v")]


def test_qualifier_over_limit_is_invalid_argument(table):
    q = b"q" * (MAX_QUALIFIER + 1)
    with pytest.raises(gexc.InvalidArgument):
        table.write(b"r", ("cf1", b"fine", 1000, b"v"), ("cf1", q, 1000, b"v"))
    assert table.read() == []
    from btlib import delete_from_column

    with pytest.raises(gexc.InvalidArgument):
        table.mutate(b"r", delete_from_column("cf1", q))


# ------------------------------------------------------------------------ values


def test_10_mib_value_round_trip(table):
    value = os.urandom(10 * MiB)
    table.write(b"big", ("cf1", b"q", 1000, value), ("cf1", b"small", 1000, b"s"))
    table.write(b"next", ("cf1", b"q", 1000, b"after"))
    rows = table.read()
    assert [r.key for r in rows] == [b"big", b"next"]
    (big, small) = rows[0].cells
    assert (big.family, big.qualifier, big.ts) == ("cf1", b"q", 1000)
    assert digest(big.value) == digest(value)
    assert small == Cell("cf1", b"small", 1000, b"s")
    assert rows[1].cells == [Cell("cf1", b"q", 1000, b"after")]


def test_big_values_through_data_client(table):
    """The Python data client talks to an emulator host over a channel with gRPC's default
    4 MiB receive limit, and it accepts only responses that end on a row boundary. A row
    with a 3.5 MiB value after a small row travels whole in a response of its own; a 10 MiB
    row reaches it only through a client with larger messages (see test_scans.py)."""
    from google.cloud.bigtable.data import ReadRowsQuery
    from google.cloud.bigtable.data.mutations import SetCell

    value = os.urandom(3 * MiB + MiB // 2)
    dt = table.data_table
    dt.mutate_row(b"a", SetCell("cf1", b"q", b"small", timestamp_micros=1000))
    dt.mutate_row(b"big", SetCell("cf1", b"q", value, timestamp_micros=2000))
    dt.mutate_row(b"c", SetCell("cf1", b"q", b"after", timestamp_micros=1000))
    rows = dt.read_rows(ReadRowsQuery())
    assert [r.row_key for r in rows] == [b"a", b"big", b"c"]
    (cell,) = rows[1].cells
    assert cell.timestamp_micros == 2000
    assert digest(cell.value) == digest(value)
    (cell,) = dt.read_row(b"big").cells
    assert digest(cell.value) == digest(value)


def test_several_big_cells_in_one_row(table):
    values = [os.urandom(3 * MiB + i) for i in range(4)]
    table.write(b"r", *[("cf1", b"q", (i + 1) * 1000, v) for i, v in enumerate(values)])
    cells = table.read_row(b"r").cells
    assert [c.ts for c in cells] == [4000, 3000, 2000, 1000]
    assert [digest(c.value) for c in cells] == [digest(v) for v in reversed(values)]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_100_mib_value_round_trip(table):
    value = os.urandom(MAX_VALUE)
    expected = digest(value)
    table.write(b"huge", ("cf1", b"q", 1000, value))
    del value  # keep only the digest around
    rows = table.read(keys=[b"huge"])
    assert [r.key for r in rows] == [b"huge"]
    (cell,) = rows[0].cells
    assert (cell.family, cell.qualifier, cell.ts) == ("cf1", b"q", 1000)
    assert digest(cell.value) == expected


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_value_over_100_mib_is_invalid_argument(table):
    with pytest.raises(gexc.InvalidArgument):
        table.write(b"huge", ("cf1", b"q", 1000, b"\x00" * (MAX_VALUE + 1)))
    assert table.read() == []


# --------------------------------------------------------------- mutation counts


def test_100k_mutations_in_one_mutate_row(table):
    quals = [b"q%06d" % i for i in range(MAX_MUTATIONS)]
    raw_mutate_row(table, b"wide", raw_set_cells("cf1", quals, b"v", 1000))
    (row,) = table.read()
    assert row.key == b"wide"
    assert len(row.cells) == MAX_MUTATIONS
    assert [c.qualifier for c in row.cells] == quals
    assert all(c.ts == 1000 and c.value == b"v" and c.family == "cf1" for c in row.cells)


def test_100k_plus_1_mutations_in_one_mutate_row_is_invalid_argument(table):
    quals = [b"q%06d" % i for i in range(MAX_MUTATIONS + 1)]
    with pytest.raises(gexc.InvalidArgument):
        raw_mutate_row(table, b"wide", raw_set_cells("cf1", quals, b"v", 1000))
    assert table.read() == []


def test_100k_mutations_total_in_mutate_rows(table):
    per_row = MAX_MUTATIONS // 10
    entries = [
        (b"row%d" % r, raw_set_cells("cf1", [b"q%05d" % i for i in range(per_row)], b"v", 1000)) for r in range(10)
    ]
    assert raw_mutate_rows(table, entries) == ["OK"] * 10
    rows = table.read()
    assert [r.key for r in rows] == [b"row%d" % r for r in range(10)]
    assert all(len(r.cells) == per_row for r in rows)


def test_100k_plus_1_mutations_total_in_mutate_rows_is_invalid_argument(table):
    per_row = MAX_MUTATIONS // 10
    entries = [
        (b"row%d" % r, raw_set_cells("cf1", [b"q%05d" % i for i in range(per_row)], b"v", 1000)) for r in range(10)
    ]
    entries.append((b"extra", raw_set_cells("cf1", [b"q"], b"v", 1000)))
    with pytest.raises(gexc.InvalidArgument):
        raw_mutate_rows(table, entries)
    assert table.read() == []


def test_many_versions_and_columns(table):
    # 2,000 columns x 5 versions in one row, written in reverse order
    cells = [("cf1", b"c%04d" % c, v * 1000, b"%d-%d" % (c, v)) for c in reversed(range(2000)) for v in range(1, 6)]
    table.write(b"r", *cells)
    got = table.read_row(b"r").cells
    assert len(got) == 10_000
    assert got == [Cell("cf1", b"c%04d" % c, v * 1000, b"%d-%d" % (c, v)) for c in range(2000) for v in range(5, 0, -1)]


# ---------------------------------------------------------------------- filter output


def test_filter_multiplying_a_row_beyond_the_budget_is_resource_exhausted(bt):
    """An interleave of 3,000 pass_alls (12 KB, under the 20,480-byte filter limit) copies
    every cell 3,000 times; on a 400-cell row that is 1.2 M cells. Basalt refuses with
    RESOURCE_EXHAUSTED instead of exhausting its memory; a smaller row still works."""
    from btlib import f_interleave, f_pass_all, read_rows

    t = bt.table(["cf"])
    t.write(b"big", *[("cf", b"q%03d" % i, 1000, b"v") for i in range(400)])
    t.write(b"small", ("cf", b"q", 1000, b"v"))
    wide = f_interleave(*[f_pass_all()] * 3000)
    with pytest.raises(gexc.ResourceExhausted):
        read_rows(t.env.data, t.name, keys=[b"big"], filter=wide)
    rows = read_rows(t.env.data, t.name, keys=[b"small"], filter=wide)
    assert len(rows) == 1 and len(rows[0].cells) == 3000
    assert {c.value for c in rows[0].cells} == {b"v"}
