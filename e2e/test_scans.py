"""Scans of many MiB through the official clients: every row arrives exactly once.

The official clients only accept ReadRowsResponses that end on a row boundary (Python's row
merger and Go's chunk reader reset their row state per response), so a scan that is cut at
any chunk fails after ~1 MiB: ``InvalidChunk('row keys should be strictly increasing')`` in
the data client, ``invalid state for end of stream`` in cbt. These tests scan tables of
several row shapes — many small multi-cell rows, rows larger than a response, 3 and 20 MiB
cells after small rows — forward and reversed, with limits and filters, through the Python
data client, the classic API, cbt, and the raw GAPIC stream (which also checks that every
response ends on a committed row).

The Python data client keeps gRPC's default 4 MiB receive limit on the channel it opens to
an emulator host (``insecure_channel(host)`` without options), the classic API reads through
it, and cbt keeps the same limit; rows above that reach Python through a GAPIC client on a
channel of one's own (as ``btlib`` does), and the Node.js client reads them, as with Google's
emulator. ``test_clients_with_a_4_mib_limit_refuse_bigger_rows_whole`` pins the limit down.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from google.cloud.bigtable_v2 import types as v2

import btlib
from btlib import MiB, f_cells_per_column, f_chain, f_family, f_qualifier, set_cell
from test_cbt import Cbt

TS = 1000


def value_for(key: bytes, column: int, size: int) -> bytes:
    """A deterministic value, so that reads can be checked without keeping what was written."""
    seed = hashlib.sha256(key + b"/%d" % column).digest()
    return (seed * (size // len(seed) + 1))[:size]


def load(t, rows: int, cells: int, size: int, prefix: bytes = b"r", batch_bytes: int = 4 * MiB):
    """``rows`` rows of ``cells`` cells (family cf1, qualifiers c00…) of ``size`` bytes each."""
    entries, pending = [], 0
    for i in range(rows):
        key = prefix + b"%06d" % i
        entries.append((key, [set_cell("cf1", b"c%03d" % c, value_for(key, c, size), TS) for c in range(cells)]))
        pending += cells * size
        if pending >= batch_bytes:
            assert set(t.mutate_rows(entries)) == {"OK"}
            entries, pending = [], 0
    if entries:
        assert set(t.mutate_rows(entries)) == {"OK"}


def expected_row(key: bytes, cells: int, size: int) -> list[tuple[bytes, bytes]]:
    return [(b"c%03d" % c, value_for(key, c, size)) for c in range(cells)]


def check_rows(got: list[tuple[bytes, list[tuple[bytes, bytes]]]], keys: list[bytes], cells: int, size: int):
    """Every expected row exactly once, in order, with every cell and value."""
    got_keys = [k for k, _ in got]
    assert len(got_keys) == len(keys), f"{len(got_keys)} rows, expected {len(keys)}"
    assert got_keys == keys, "rows missing, repeated or out of order"
    for key, row in got:
        if row != expected_row(key, cells, size):
            pytest.fail(f"row {key!r}: cells differ from what was written")


# ----------------------------------------------------------------------------- clients


def via_data_client(t, start=None, end=None, limit=None, row_filter=None):
    from google.cloud.bigtable.data import ReadRowsQuery, RowRange

    query = ReadRowsQuery(
        row_ranges=RowRange(start_key=start, end_key=end) if (start or end) else None,
        limit=limit, row_filter=row_filter)
    return [(r.row_key, [(c.qualifier, c.value) for c in r.cells]) for r in t.data_table.read_rows(query)]


def via_classic(t, start=None, end=None, limit=None, row_filter=None):
    rows = t.classic_table.read_rows(start_key=start, end_key=end, limit=limit, filter_=row_filter)
    out = []
    for r in rows:
        cells = [(q, c.value) for q, cs in sorted(r.cells.get("cf1", {}).items()) for c in cs]
        out.append((r.row_key, cells))
    return out


def via_gapic(t, reversed_=False, limit=0, row_filter=None, ranges=None):
    """The raw stream, merged by btlib's strict merger (every response must end on a row)."""
    rows = btlib.read_rows(t.env.data, t.name, ranges=ranges, filter=row_filter, limit=limit,
                           reversed=reversed_, timeout=300)
    return [(r.key, [(c.qualifier, c.value) for c in r.cells]) for r in rows]


NODE_DIR = Path(__file__).resolve().parent / "node"


def via_node(t, start="", end="", limit=0):
    """The official Node.js client (e2e/node/scan.js); cells as (qualifier, length, sha256)."""
    node = shutil.which("node")
    assert node, "node is required for this test (install Node.js)"
    env = {**os.environ, "BIGTABLE_EMULATOR_HOST": t.env.server.data_endpoint}
    proc = subprocess.run([node, "scan.js", t.id, start, end, str(limit or "")], cwd=NODE_DIR, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"node scan.js failed:\n{proc.stderr[-4000:]}"
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    return [(r["key"].encode(), [(q.encode(), n, h) for q, n, h in r["cells"]]) for r in rows]


def digests(rows):
    return [(k, [(q, len(v), hashlib.sha256(v).hexdigest()) for q, v in cells]) for k, cells in rows]


def cbt_keys(cbt: Cbt, table: str, *args: str) -> list[bytes]:
    out = cbt.run("read", table, *args).stdout
    return [line.encode() for line in out.splitlines() if line and not line.startswith((" ", "-"))]


@pytest.fixture
def cbt(basalt_server, tmp_path) -> Cbt:
    return Cbt(basalt_server.data_endpoint, tmp_path)


# ------------------------------------------------------------------------------- shapes

# (rows, cells per row, value bytes): ~6 MiB of small 5-cell rows (the shape that failed after
# 2,952 rows), 7-cell rows, and rows larger than a response (200 cells of 8 KiB = 1.6 MiB).
SHAPES = [
    pytest.param(10_000, 5, 100, id="10000x5-cells"),
    pytest.param(6_000, 7, 100, id="6000x7-cells"),
    pytest.param(12, 200, 8 * 1024, id="rows-of-1.6MiB"),
]


@pytest.mark.parametrize("rows, cells, size", SHAPES)
def test_full_scans_return_every_row_once(bt, cbt, rows, cells, size):
    t = bt.table(["cf1"])
    load(t, rows, cells, size)
    keys = [b"r%06d" % i for i in range(rows)]

    check_rows(via_data_client(t), keys, cells, size)
    check_rows(via_classic(t), keys, cells, size)
    check_rows(via_gapic(t), keys, cells, size)
    check_rows(via_gapic(t, reversed_=True), keys[::-1], cells, size)
    assert cbt_keys(cbt, t.id) == keys
    expected = digests([(k, expected_row(k, cells, size)) for k in keys])
    assert via_node(t) == expected, "the Node.js client read other rows"

    # Limits and filters over the same rows.
    n = rows // 2 + 1
    check_rows(via_data_client(t, limit=n), keys[:n], cells, size)
    check_rows(via_classic(t, limit=n), keys[:n], cells, size)
    check_rows(via_gapic(t, reversed_=True, limit=n), keys[::-1][:n], cells, size)
    assert cbt_keys(cbt, t.id, f"count={n}") == keys[:n]
    from google.cloud.bigtable.data.row_filters import ColumnQualifierRegexFilter

    first_two = via_data_client(t, row_filter=ColumnQualifierRegexFilter(b"c00[01]"))
    check_rows(first_two, keys, 2, size)
    reversed_two = via_gapic(t, reversed_=True, row_filter=f_chain(f_family("cf1"), f_qualifier(b"c00[01]")))
    check_rows(reversed_two, keys[::-1], 2, size)
    q = rows // 4  # q + n < rows for every shape
    ranged = via_gapic(t, ranges=[v2.RowRange(start_key_closed=keys[q], end_key_open=keys[q + n])])
    check_rows(ranged, keys[q:q + n], cells, size)
    check_rows(via_gapic(t, row_filter=f_cells_per_column(1)), keys, cells, size)


def big_cell_table(bt):
    """r1 small, r2 one 3 MiB cell, r3 small, r4 one 20 MiB cell, r5 small."""
    t = bt.table(["cf1"])
    layout = {b"r1": 10, b"r2": 3 * MiB, b"r3": 10, b"r4": 20 * MiB, b"r5": 10}
    for key, size in layout.items():
        t.write(key, ("cf1", b"c000", TS, value_for(key, 0, size)))
    return t, layout


def check_big(got, layout):
    assert [k for k, _ in got] == list(layout), [k for k, _ in got]
    for key, cells in got:
        assert cells == expected_row(key, 1, layout[key]), f"row {key!r} differs"


def test_big_cells_after_small_rows(bt, cbt):
    t, layout = big_cell_table(bt)
    # GAPIC on a channel without the 4 MiB limit: everything, both directions.
    check_big(via_gapic(t), layout)
    got = via_gapic(t, reversed_=True)
    assert [k for k, _ in got] == list(layout)[::-1]
    check_big(via_gapic(t, limit=4), dict(list(layout.items())[:4]))
    # The data client and the classic API: everything up to the 3 MiB cell (their channel
    # to an emulator host takes up to 4 MiB).
    small = {k: v for k, v in layout.items() if k < b"r4"}
    check_big(via_data_client(t, end=b"r4"), small)
    check_big(via_classic(t, end=b"r4"), small)
    assert [(k, c) for k, c in via_data_client(t, start=b"r2", end=b"r3")] == [(b"r2", expected_row(b"r2", 1, 3 * MiB))]

    # The Node.js client (no message limit): everything, a point read of the 20 MiB row, a limit.
    expected = digests([(k, expected_row(k, 1, n)) for k, n in layout.items()])
    assert via_node(t) == expected
    assert via_node(t, start="r4", end="r4") == expected[3:4]  # Node: end is inclusive
    assert via_node(t, limit=2) == expected[:2]

    # cbt (its channel to an emulator host takes up to 4 MiB too): a point read of each row up
    # to the 3 MiB one, and a scan over them.
    for key in small:
        assert cbt_keys(cbt, t.id, f"prefix={key.decode()}") == [key]
        out = cbt.run("lookup", t.id, key.decode()).stdout
        printed = [line for line in out.splitlines() if line and not line.startswith((" ", "-"))]
        assert printed == [key.decode()], out[:200]
    assert cbt_keys(cbt, t.id, "end=r4") == list(small)


def test_clients_with_a_4_mib_limit_refuse_bigger_rows_whole(bt, cbt):
    """Above 4 MiB a row exceeds the receive limit the Python clients (the classic API reads
    through the data client) and cbt keep on an emulator host: the client refuses the message
    (RESOURCE_EXHAUSTED), it never gets a partial row; the rows before it arrived whole."""
    from google.api_core import exceptions as gexc

    t, layout = big_cell_table(bt)
    with pytest.raises(gexc.ResourceExhausted, match="larger than max"):
        via_data_client(t, start=b"r4", end=b"r5")
    with pytest.raises(gexc.ResourceExhausted, match="larger than max"):
        via_classic(t, start=b"r4", end=b"r5")
    failed = cbt.run("lookup", t.id, "r4", check=False)
    assert failed.returncode != 0 and "larger than max" in failed.stderr, failed.stderr
    failed = cbt.run("read", t.id, check=False)
    assert failed.returncode != 0 and "larger than max" in failed.stderr, failed.stderr
    printed = [line for line in failed.stdout.splitlines() if line and not line.startswith((" ", "-"))]
    assert printed == ["r1", "r2", "r3"], printed
