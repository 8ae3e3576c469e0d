"""Helpers for the semantics reference suite (``e2e/semantics``).

Cell specs
----------
Table-driven filter cases describe rows as a compact string of cell tokens::

    "r1:cf1:a@3 r1:cf1:a@2#foo r2:cf2:b@2!"

A token is ``row:family:qualifier@ts[#label][!]``: the cell of row ``row``, family ``family``,
qualifier ``qualifier`` at timestamp ``ts * 1000`` µs, whose value is the token's own
``row:family:qualifier@ts`` text (so every cell of a dataset written with :func:`write_spec` has a
unique, self-describing value). ``#label`` is a label the read must carry, ``!`` means the value
was stripped (empty). Tokens of one row must be contiguous; rows appear in read order.

Interleaves and sinks may return identical cells "in an unspecified mutual order" (data.proto):
:func:`canon` sorts each run of cells with the same column and timestamp, and nothing else, so
comparing ``canon(actual) == canon(expected)`` still checks the Bigtable cell order.
"""

from __future__ import annotations

import threading
import uuid

import btlib
from btlib import Cell, Row, set_cell


def token_cell(token: str) -> tuple[bytes, Cell]:
    stripped = token.endswith("!")
    if stripped:
        token = token[:-1]
    labels: tuple = ()
    if "#" in token:
        token, label = token.split("#", 1)
        labels = (label,)
    row, family, rest = token.split(":", 2)
    qualifier, ts = rest.rsplit("@", 1)
    value = b"" if stripped else f"{row}:{family}:{qualifier}@{ts}".encode()
    return row.encode(), Cell(family, qualifier.encode(), int(ts) * 1000, value, labels)


def spec_rows(spec: str) -> list[Row]:
    """Rows described by a cell spec (see module docstring)."""
    rows: list[Row] = []
    for token in spec.split():
        key, cell = token_cell(token)
        if rows and rows[-1].key == key:
            rows[-1].cells.append(cell)
        else:
            assert all(r.key != key for r in rows), f"row {key!r} is not contiguous in the spec"
            rows.append(Row(key, [cell]))
    return rows


def spec_map(spec: str, suffix: str) -> str:
    """Appends ``suffix`` (e.g. ``"#foo"`` or ``"!"``) to every token of a spec."""
    return " ".join(t + suffix for t in spec.split())


def canon(rows: list[Row]) -> list[Row]:
    """Sorts each run of cells with equal (family, qualifier, timestamp) by (labels, value)."""
    out = []
    for row in rows:
        cells, run = [], []
        for c in row.cells:
            if run and (run[0].family, run[0].qualifier, run[0].ts) != (c.family, c.qualifier, c.ts):
                cells.extend(sorted(run, key=lambda x: (x.labels, x.value)))
                run = []
            run.append(c)
        cells.extend(sorted(run, key=lambda x: (x.labels, x.value)))
        out.append(Row(row.key, cells))
    return out


def write_spec(data, table_name: str, spec: str) -> None:
    """Writes the cells of a spec (values as described in the module docstring), one
    MutateRows entry per row."""
    entries = []
    for row in spec_rows(spec):
        entries.append((row.key, [set_cell(c.family, c.qualifier, c.value, c.ts) for c in row.cells]))
    assert btlib.mutate_rows(data, table_name, entries) == ["OK"] * len(entries)


class SharedTable:
    """A table shared (read-only) by the cases of one test module: created once, with fixed
    contents, deleted at the end. Reads go through the GAPIC client and the chunk checker."""

    def __init__(self, gapic, hint: str, families):
        self.gapic = gapic
        self.data = gapic.data
        self.id = f"sem_{hint}_{uuid.uuid4().hex[:8]}"
        self.name = btlib.table_name(self.id)
        btlib.create_table(gapic.admin, self.id, families)

    def read(self, **kw) -> list[Row]:
        return btlib.read_rows(self.data, self.name, **kw)

    def drop(self):
        btlib.delete_table(self.gapic.admin, self.name)


def run_threads(n: int, target) -> None:
    """Runs target(0..n-1) on n threads at once; re-raises the first failure in any of them."""
    errors = []

    def wrapped(i):
        try:
            target(i)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=wrapped, args=(i,)) for i in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not any(th.is_alive() for th in threads), "threads did not finish"
    if errors:
        raise errors[0]
