"""Durability: graceful restarts and kill -9 keep every acknowledged write and all
schema changes; the crash test checks that no mutation is ever half-applied."""

import itertools
import os
import random
import threading
import time
from collections import defaultdict

import pytest
from google.api_core import exceptions as gexc

import btlib
from btlib import (
    Cell,
    Row,
    View,
    create_table,
    delete_from_column,
    delete_from_row,
    delete_table,
    drop_row_range,
    family_rules,
    gc_age,
    gc_union,
    gc_versions,
    get_table,
    mod_create,
    mod_drop,
    mod_update,
    modify_families,
    mutate_row,
    mutate_rows,
    read_rows,
    sample_row_keys,
    set_cell,
    set_deletion_protection,
    table_name,
)


def snapshot(c: btlib.GapicClients, names):
    """Everything a user can see about some tables: schema (FULL view) and all rows."""
    out = {}
    for n in names:
        t = get_table(c.admin, n, View.FULL)
        out[n] = (
            family_rules(t),
            t.granularity,
            t.deletion_protection,
            read_rows(c.data, n),
            # intermediate sample keys may change with the storage layout; splits may not
            [k for k, _ in sample_row_keys(c.data, n) if k in (b"m", b"t", b"")],
        )
    return out


def populate(c: btlib.GapicClients):
    """A bit of everything; returns the table names."""
    a, b = table_name("durable_a"), table_name("durable_b")
    create_table(c.admin, "durable_a", {"cf": gc_versions(3), "ttl": gc_age(86400), "x": None}, splits=[b"m", b"t"])
    create_table(c.admin, "durable_b", {"cf": gc_union(gc_versions(1), gc_age(3600))}, deletion_protection=True)
    big = os.urandom(2 * btlib.MiB)
    mutate_row(c.data, a, b"big", [set_cell("x", b"blob", big, 1000)])
    for i in range(200):
        mutate_row(c.data, a, b"row%03d" % i, [set_cell("cf", b"q", b"v%d" % i, 1000), set_cell("x", b"n", b"%d" % i, 2000)])
    assert mutate_rows(c.data, a, [(b"bulk%02d" % i, [set_cell("cf", b"q", b"b", 1000)]) for i in range(50)]) == ["OK"] * 50
    mutate_row(c.data, a, b"row007", [delete_from_row()])
    mutate_row(c.data, a, b"row008", [delete_from_column("x", b"n")])
    drop_row_range(c.admin, a, prefix=b"bulk1")
    now = btlib.now_micros()
    mutate_row(c.data, b, b"k", [set_cell("cf", b"q", b"new", now), set_cell("cf", b"q", b"older", now - 1000)])
    modify_families(c.admin, a, mod_create("late", gc_versions(2)), mod_update("x", gc_versions(5)))
    mutate_row(c.data, a, b"row001", [set_cell("late", b"q", b"l", 1000)])
    return [a, b]


def test_graceful_restart_keeps_data_and_schema(server_factory):
    server = server_factory()
    c = server.clients()
    names = populate(c)
    before = snapshot(c, names)
    assert [r.key for r in before[names[0]][3]][:3] == [b"big", b"bulk00", b"bulk01"]
    c.close()

    server.restart()  # SIGTERM, exit code 0 asserted
    c = server.clients()
    after = snapshot(c, names)
    assert after == before
    assert after[names[1]][2] is True  # deletion protection survived
    with pytest.raises(gexc.FailedPrecondition):
        delete_table(c.admin, names[1])
    c.close()


def test_kill9_keeps_acknowledged_writes_and_schema_changes(server_factory):
    server = server_factory()
    c = server.clients()
    names = populate(c)
    # more schema changes right before the crash
    create_table(c.admin, "doomed", ["cf"])
    delete_table(c.admin, table_name("doomed"))
    create_table(c.admin, "fresh", ["cf"])
    mutate_row(c.data, names[0], b"last", [set_cell("cf", b"q", b"acked just before the crash", 1000)])
    before = snapshot(c, names + [table_name("fresh")])
    c.close()

    server.crash_restart()
    c = server.clients()
    assert snapshot(c, names + [table_name("fresh")]) == before
    with pytest.raises(gexc.NotFound):
        get_table(c.admin, table_name("doomed"))
    c.close()


def test_kill9_right_after_each_write(server_factory):
    """Crash immediately after an acknowledgement, several times over."""
    server = server_factory()
    c = server.clients()
    t = table_name("t")
    create_table(c.admin, "t", ["cf"])
    for i in range(4):
        c.close()
        c = server.clients()
        mutate_row(c.data, t, b"r%d" % i, [set_cell("cf", b"q", b"v%d" % i, 1000)])
        server.crash_restart()
    c.close()
    c = server.clients()
    assert read_rows(c.data, t) == [Row(b"r%d" % i, [Cell("cf", b"q", 1000, b"v%d" % i)]) for i in range(4)]
    c.close()


def test_dropped_family_and_table_stay_dropped_after_restart(server_factory):
    server = server_factory()
    c = server.clients()
    t = table_name("t")
    create_table(c.admin, "t", ["cf", "tmp"])
    mutate_row(c.data, t, b"r", [set_cell("cf", b"q", b"keep", 1000), set_cell("tmp", b"q", b"drop", 1000)])
    modify_families(c.admin, t, mod_drop("tmp"))
    drop_row_range(c.admin, t, all_data=False, prefix=b"zzz")
    c.close()
    server.crash_restart()
    c = server.clients()
    modify_families(c.admin, t, mod_create("tmp"))
    assert read_rows(c.data, t) == [Row(b"r", [Cell("cf", b"q", 1000, b"keep")])]
    c.close()
    server.restart()
    c = server.clients()
    assert read_rows(c.data, t) == [Row(b"r", [Cell("cf", b"q", 1000, b"keep")])]
    assert sorted(get_table(c.admin, t).column_families) == ["cf", "tmp"]
    c.close()


def test_deletion_protection_change_survives_kill9(server_factory):
    server = server_factory()
    c = server.clients()
    t = table_name("t")
    create_table(c.admin, "t", ["cf"])
    set_deletion_protection(c.admin, t, True)
    c.close()
    server.crash_restart()
    c = server.clients()
    assert get_table(c.admin, t, View.FULL).deletion_protection is True
    with pytest.raises(gexc.FailedPrecondition):
        delete_table(c.admin, t)
    c.close()


# ------------------------------------------------------------------ crash test

CRASH_CYCLES = int(os.environ.get("BASALT_CRASH_CYCLES", "6"))
WRITERS = 3
ROWS_PER_WRITER = 6
TOKEN_COLUMNS = [("cf", b"a"), ("cf", b"b"), ("cf", b"c"), ("cf2", b"d")]


class CrashWorkload:
    """Writers send MutateRow / MutateRows whose every mutation carries one token.

    Mutation number n on row R:  DeleteFromColumn(cf:x)  then  SetCell cf:a, cf:b, cf:c,
    cf2:d and cf:x, all with value tok-n at timestamp n*1000.  A whole mutation leaves
    cells at ts n*1000 in all of a/b/c/d; cf:x always holds exactly one cell, the one of
    the newest mutation applied to the row. Half of a mutation breaks one of these."""

    def __init__(self, table: str, rng: random.Random):
        self.table = table
        self.rng = rng
        self.counter = itertools.count(1)
        self.lock = threading.Lock()
        self.attempted = defaultdict(set)  # row -> {n}
        self.acked = defaultdict(set)  # row -> {n}

    @staticmethod
    def token(n: int) -> bytes:
        return b"tok-%d" % n

    def mutations(self, n: int):
        ts, tok = n * 1000, self.token(n)
        return [delete_from_column("cf", b"x")] + [set_cell(f, q, tok, ts) for f, q in TOKEN_COLUMNS + [("cf", b"x")]]

    def writer(self, wid: int, data, stop: threading.Event, killing: threading.Event, errors: list):
        rng = random.Random(self.rng.random())
        rows = [b"w%d-row%d" % (wid, i) for i in range(ROWS_PER_WRITER)]
        try:
            while not stop.is_set():
                if wid == 0:  # writer 0 uses MutateRows with a few entries per request
                    batch = [(rng.choice(rows), next(self.counter)) for _ in range(rng.randint(1, 4))]
                    batch = list({r: (r, n) for r, n in batch}.values())  # one entry per row
                else:
                    batch = [(rng.choice(rows), next(self.counter))]
                with self.lock:
                    for r, n in batch:
                        self.attempted[r].add(n)
                try:
                    if len(batch) == 1 and wid != 0:
                        r, n = batch[0]
                        mutate_row(data, self.table, r, self.mutations(n), timeout=10)
                        ok = [(r, n)]
                    else:
                        statuses = mutate_rows(data, self.table, [(r, self.mutations(n)) for r, n in batch], timeout=10)
                        ok = [(r, n) for (r, n), s in zip(batch, statuses) if s == "OK"]
                except (gexc.GoogleAPICallError, AssertionError) as e:
                    # AssertionError: a MutateRows stream ended before every entry had a status
                    if killing.is_set():
                        continue  # the server is being killed: not acknowledged, may or may not apply
                    errors.append(e)  # an error while the server is healthy is a failure
                    return
                with self.lock:
                    for r, n in ok:
                        self.acked[r].add(n)
        except Exception as e:  # anything else is a test failure
            errors.append(e)

    def verify(self, rows: list) -> int:
        """Checks every row; returns the number of mutations found applied."""
        by_key = {r.key: r.cells for r in rows}
        problems = []
        applied_total = 0
        with self.lock:
            attempted = {k: set(v) for k, v in self.attempted.items()}
            acked = {k: set(v) for k, v in self.acked.items()}
        for key in set(by_key) | set(acked):
            cells = by_key.get(key, [])
            cols = defaultdict(list)
            for c in cells:
                cols[(c.family, c.qualifier)].append(c)
            unexpected = set(cols) - set(TOKEN_COLUMNS) - {("cf", b"x")}
            if unexpected:
                problems.append(f"{key!r}: unexpected columns {unexpected}")
            for (f, q), cs in cols.items():
                for c in cs:
                    if c.ts % 1000 or c.value != self.token(c.ts // 1000):
                        problems.append(f"{key!r} {f}:{q!r}: cell ts {c.ts} carries {c.value!r}")
            ns = [{c.ts // 1000 for c in cols.get(col, [])} for col in TOKEN_COLUMNS]
            applied = set().union(*ns)
            for col, s in zip(TOKEN_COLUMNS, ns):
                if s != applied:
                    problems.append(f"{key!r}: half-applied mutations {sorted(applied - s)} (missing in {col})")
            phantom = applied - attempted.get(key, set())
            if phantom:
                problems.append(f"{key!r}: mutations never sent to this row: {sorted(phantom)}")
            lost = acked.get(key, set()) - applied
            if lost:
                problems.append(f"{key!r}: acknowledged mutations lost: {sorted(lost)}")
            x = [c.ts // 1000 for c in cols.get(("cf", b"x"), [])]
            if applied and x != [max(applied)]:
                problems.append(f"{key!r}: cf:x holds {x}, expected exactly the newest mutation {max(applied)}")
            if not applied and x:
                problems.append(f"{key!r}: cf:x holds {x} but no mutation is complete")
            applied_total += len(applied)
        assert not problems, "\n".join(problems[:50])
        return applied_total


@pytest.mark.crash
@pytest.mark.timeout(900)
def test_crash_consistency(server_factory):
    seed = int(os.environ.get("BASALT_CRASH_SEED", time.time_ns() % 1_000_000))
    print(f"crash test seed: {seed} (BASALT_CRASH_SEED={seed} to replay the timing)")
    rng = random.Random(seed)
    server = server_factory()
    c = server.clients()
    name = table_name("crash")
    create_table(c.admin, "crash", ["cf", "cf2"])
    c.close()
    work = CrashWorkload(name, rng)
    history = []

    for cycle in range(CRASH_CYCLES):
        c = server.clients()
        stop, killing = threading.Event(), threading.Event()
        errors: list = []
        threads = [
            threading.Thread(target=work.writer, args=(w, c.data, stop, killing, errors), daemon=True)
            for w in range(WRITERS)
        ]
        for th in threads:
            th.start()
        delay = rng.uniform(0.5, 2.0)
        time.sleep(delay)
        killing.set()
        server.kill9()
        stop.set()
        for th in threads:
            th.join(30)
            assert not th.is_alive(), "writer thread hung after the server was killed"
        c.close()
        assert not errors, f"writer failed: {errors[0]!r}"
        acked = sum(len(v) for v in work.acked.values())
        assert acked > (history[-1][1] if history else 0), f"no write was acknowledged in cycle {cycle}"
        history.append((round(delay, 2), acked))

        server.start()
        c = server.clients()
        applied = work.verify(read_rows(c.data, name))
        c.close()
        print(f"cycle {cycle}: killed after {delay:.2f}s; acked so far {acked}, applied {applied}")

    assert history[-1][1] >= 20 * CRASH_CYCLES, f"too few acknowledged writes to mean anything: {history}"
    server.stop()
    server.start()
    c = server.clients()
    work.verify(read_rows(c.data, name))
    c.close()
