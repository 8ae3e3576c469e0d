"""Point-in-time recovery on a standalone server (docs/backups.md, "Point-in-time recovery"):
servers started with ``--log-backup-interval-secs`` ship every write they take to the backup
location (a real S3 object store, SeaweedFS, e2e/seaweed.py), and RestoreTable with the request
metadata ``x-basalt-restore-time`` (RFC 3339) restores a backup and replays the shipped writes
after its ``end_time`` up to that time, through the official Python admin client.

* the disaster case: a backup, then writes of every kind (SetCell with server and explicit
  timestamps, values over 64 bytes, DeleteFromColumn, DeleteFromRow, AddToCell into an Int64
  sum family, versions pushed out of a max-versions family) read at T1, more at T2, then a
  DropRowRange of everything: a restore to T1 reads exactly as the table read at T1, to T2 as
  at T2, a plain restore as the backup; the counters are exact;
* the same when the table itself was deleted right after the writes (the backup outlives it),
  and when it was the server's only table;
* refusals before anything is restored: a time before the backup's ``end_time``, in the future
  or not RFC 3339 (INVALID_ARGUMENT); no log backup of the instance, a server whose log backup
  began after the backup, a server that has not shipped through the time (FAILED_PRECONDITION,
  naming the server); a damaged segment fails the operation with DATA_LOSS;
* a graceful stop ships the rest of the log (``position.json`` says ``stopped``), and the
  server started again does not let a restore skip the writes it takes after that;
* a kill -9 before any shipping: the log survives in the store and is shipped after the
  restart, so a restore holds every acknowledged write.

One SeaweedFS and one server (``--log-backup-interval-secs 1``) serve the module; the tests that
stop, freeze or kill servers have servers (and location prefixes) of their own. Times are the
client's clock read after the last acknowledged write and before the next is sent (one machine,
one clock); waits are bounded polls, never sleeps taken for assertions.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import time

import grpc
import pytest
from google.api_core import exceptions as gexc
from google.cloud.bigtable_admin_v2 import types as admin_types

import btlib
from btlib import (add_to_cell, aggregate_family, delete_from_column, delete_from_row, gc_versions,
                   set_cell)
from conftest import CLUSTER_MODE, BasaltServer
from seaweed import SeaweedFS
from test_backups import (CLUSTER, OP_TIMEOUT, create_backup, micros, now_micros, rows_digest,
                          wait_for)

pytestmark = pytest.mark.skipif(CLUSTER_MODE, reason="a standalone server's log backup; "
                                "the cluster's is test_point_in_time_local.py")

HEADER = "x-basalt-restore-time"
PREFIX = "pitr"  # the module server's --backup-url s3://<bucket>/pitr
SERVER_TIME = btlib.SERVER_TIME


# ----------------------------------------------------------------------------- helpers


def rfc3339(us: int, offset_minutes: int = 0) -> str:
    """``us`` (microseconds since the epoch) as RFC 3339 with microseconds: ``...Z``, or in the
    zone ``offset_minutes`` east of UTC (``...+02:00``)."""
    secs, frac = divmod(us, 1_000_000)
    tz = datetime.timezone(datetime.timedelta(minutes=offset_minutes))
    t = datetime.datetime.fromtimestamp(secs, tz)
    zone = "Z" if offset_minutes == 0 else t.strftime("%z")[:3] + ":" + t.strftime("%z")[3:]
    return t.strftime("%Y-%m-%dT%H:%M:%S") + f".{frac:06d}" + zone


def start_restore(admin, backup: str, table_id: str, when: str | None,
                  instance: str = btlib.INSTANCE):
    """RestoreTable into ``instance`` (``when``: the x-basalt-restore-time text, None for a
    plain restore); returns the long-running operation (refusals raise here)."""
    metadata = [(HEADER, when)] if when is not None else []
    request = admin_types.RestoreTableRequest(parent=btlib.instance_name(instance),
                                              table_id=table_id, backup=backup)
    return admin.restore_table(request=request, metadata=metadata, retry=None, timeout=60)


def restore_to(admin, backup: str, table_id: str, when_us: int | None, wait: float = 20.0,
               offset_minutes: int = 0, instance: str = btlib.INSTANCE):
    """A restore to ``when_us`` (None: plain), waited for. While a server has not shipped its
    writes through the time yet, RestoreTable answers FAILED_PRECONDITION "has shipped its
    writes up to": asked again until ``wait`` seconds have passed."""
    when = None if when_us is None else rfc3339(when_us, offset_minutes)
    deadline = time.monotonic() + wait
    while True:
        try:
            op = start_restore(admin, backup, table_id, when, instance)
            break
        except gexc.FailedPrecondition as e:
            if "has shipped its writes up to" not in e.message or time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    return op.result(timeout=OP_TIMEOUT)


def read_all(data, name: str) -> list[btlib.Row]:
    return btlib.read_rows(data, name)


def table_exists(admin, table_id: str) -> bool:
    try:
        btlib.get_table(admin, btlib.table_name(table_id))
        return True
    except gexc.NotFound:
        return False


def big(tag: str, n: int = 300) -> bytes:
    """A value over 64 bytes (logged by reference to its cell), distinct per tag."""
    return (tag.encode() + b":" + b"0123456789abcdef" * (n // 16 + 1))[:n]


def log_dir(prefix: str, instance: str = btlib.INSTANCE) -> str:
    return f"{prefix}/logs/{btlib.PROJECT}/{instance}/{CLUSTER}/"


def positions(store: SeaweedFS, prefix: str) -> dict[str, dict]:
    """The servers' ``position.json`` under ``prefix``, by server id."""
    s3 = store.s3()
    out = {}
    for key in s3.keys(store.bucket, log_dir(prefix)):
        if key.endswith("/position.json"):
            body = s3.get(store.bucket, key)
            if body is not None:
                p = json.loads(body)
                out[p["server"]] = p
    return out


def segments(store: SeaweedFS, prefix: str, server: str | None = None) -> list[tuple[str, dict]]:
    """The segment keys under ``prefix`` (of ``server``), with the numbers their names carry."""
    out = []
    for key in store.s3().keys(store.bucket, log_dir(prefix)):
        if not key.endswith(".seg") or (server and f"/{server}/" not in key):
            continue
        first, last, lo, hi = (int(x) for x in key.rsplit("/", 1)[1][:-4].split("-"))
        out.append((key, {"first_seq": first, "last_seq": last, "min_hlc": lo, "max_hlc": hi}))
    return out


def covered(store: SeaweedFS, prefix: str, t: int) -> bool:
    """Whether every server's position under ``prefix`` says its writes through ``t`` are shipped."""
    ps = positions(store, prefix)
    return bool(ps) and all(p["covered_hlc"] > t or p["stopped"] for p in ps.values())


def log_server(store: SeaweedFS, prefix: str, args=(), env=None, interval: int = 1):
    """(extra_args, env) of a server that keeps its backups under ``prefix`` and ships its log
    every ``interval`` seconds (0: no log backup)."""
    extra = ("--backup-url", f"s3://{store.bucket}/{prefix}", *args)
    if interval:
        extra += ("--log-backup-interval-secs", str(interval))
    return extra, {**store.aws_env(), **(env or {})}


def cell_map(rows: list[btlib.Row]) -> dict:
    return {(r.key, c.family, c.qualifier, c.ts): c.value for r in rows for c in r.cells}


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory):
    store = SeaweedFS(tmp_path_factory.mktemp("pitr-seaweedfs")).start()
    yield store
    store.stop()


@pytest.fixture(scope="module")
def server(seaweed, tmp_path_factory):
    args, env = log_server(seaweed, PREFIX)
    s = BasaltServer(tmp_path_factory.mktemp("pitr-server"), extra_args=args, env=env)
    s.start()
    yield s
    if s.running():
        s.stop()


@pytest.fixture(scope="module")
def env(server):
    clients = server.clients()
    yield clients
    clients.close()


# ------------------------------------------------------------------ the disaster case

FAMILIES = {"v": gc_versions(2), "agg": aggregate_family("sum"), "cf": None}


def load_base(env, table: str):
    """The rows the backup holds."""
    name = btlib.table_name(table)
    btlib.create_table(env.admin, table, FAMILIES, splits=("m",))
    assert set(btlib.mutate_rows(env.data, name, [
        (b"r-keep", [set_cell("v", b"q", b"k1", 1000), set_cell("v", b"q", b"k2", 2000),
                     set_cell("cf", b"big", big("base"), 1000)]),
        (b"r-del-row", [set_cell("v", b"q", b"x", 1000), set_cell("cf", b"q", b"y", 1000)]),
        (b"r-del-col", [set_cell("v", b"a", b"a1", 1000), set_cell("v", b"b", b"b1", 1000)]),
        (b"r-push", [set_cell("v", b"q", b"p1", 1000), set_cell("v", b"q", b"p2", 2000)]),
        (b"c-1", [add_to_cell("agg", b"n", 0, 10), add_to_cell("agg", b"n", 1000, 1)]),
        (b"z-tail", [set_cell("cf", b"q", b"in the second tablet", 1000)]),
    ])) == {"OK"}


def phase1(env, name: str):
    """Every kind of write after the backup."""
    btlib.mutate_row(env.data, name, b"r-new-1", [set_cell("cf", b"q", b"server time 1", SERVER_TIME)])
    btlib.mutate_row(env.data, name, b"r-new-2", [set_cell("cf", b"big", big("p1-server"), SERVER_TIME)])
    btlib.mutate_row(env.data, name, b"r-keep", [set_cell("cf", b"big", big("p1-explicit"), 5000)])
    btlib.mutate_row(env.data, name, b"r-del-col", [delete_from_column("v", b"a")])
    btlib.mutate_row(env.data, name, b"r-del-row", [delete_from_row()])
    # A third version: p1 is pushed out of the 2-version family by this write.
    btlib.mutate_row(env.data, name, b"r-push", [set_cell("v", b"q", b"p3", 3000)])
    btlib.mutate_row(env.data, name, b"r-over", [set_cell("v", b"q", b"o1", 4000)])
    btlib.mutate_row(env.data, name, b"r-p1-small", [set_cell("cf", b"q", b"short-lived", 1000),
                                                     set_cell("v", b"q", b"s", 1000)])
    assert set(btlib.mutate_rows(env.data, name, [
        (b"c-1", [add_to_cell("agg", b"n", 0, 5)]),
        (b"c-2", [add_to_cell("agg", b"n", 0, 7), add_to_cell("agg", b"n", 0, 8)]),
        (b"z-new", [set_cell("cf", b"big", big("p1-z"), 1000)]),
    ])) == {"OK"}


def phase2(env, name: str):
    """Overwrites and deletes of phase 1's rows, more counters."""
    btlib.mutate_row(env.data, name, b"r-new-1", [set_cell("cf", b"q", b"server time 2", SERVER_TIME)])
    btlib.mutate_row(env.data, name, b"r-new-2", [set_cell("cf", b"big", big("p2-explicit"), 7000)])
    # A short value overwritten at the same timestamp.
    btlib.mutate_row(env.data, name, b"r-over", [set_cell("v", b"q", b"o2", 4000)])
    # p3 deleted: p2 is left (p1 stays collected).
    btlib.mutate_row(env.data, name, b"r-push", [delete_from_column("v", b"q", 3000, 4000)])
    btlib.mutate_row(env.data, name, b"r-p1-small", [delete_from_row()])
    btlib.mutate_row(env.data, name, b"r-del-row", [set_cell("cf", b"q", b"back", 1000)])
    assert set(btlib.mutate_rows(env.data, name, [
        (b"c-1", [add_to_cell("agg", b"n", 0, 100)]),
        (b"c-2", [add_to_cell("agg", b"n", 1000, 3)]),
        (b"c-3", [add_to_cell("agg", b"n", 0, -4)]),
        (b"z-new", [set_cell("cf", b"q", b"small", 2000)]),
    ])) == {"OK"}


COUNTERS_AT = {  # (row, ts) -> the Int64 sum a reader sees
    "backup": {(b"c-1", 1000): 1, (b"c-1", 0): 10},
    "T1": {(b"c-1", 1000): 1, (b"c-1", 0): 15, (b"c-2", 0): 15},
    "T2": {(b"c-1", 1000): 1, (b"c-1", 0): 115, (b"c-2", 1000): 3, (b"c-2", 0): 15, (b"c-3", 0): -4},
}


def counters(rows: list[btlib.Row]) -> dict:
    return {(r.key, c.ts): int.from_bytes(c.value, "big", signed=True)
            for r in rows for c in r.cells if c.family == "agg"}


@pytest.mark.parametrize("drop", ["at-once", "once-shipped"])
def test_restore_to_points_in_time_before_a_drop_of_everything(env, seaweed, drop):
    """``at-once``: the DropRowRange right after the last write, as a disaster comes (within
    the shipping interval). ``once-shipped``: the drop waits until the log covers T2, so that
    only the replay is under test."""
    table = f"orders_{drop.replace('-', '_')}"
    name = btlib.table_name(table)
    load_base(env, table)
    base_rows = read_all(env.data, name)
    backup = create_backup(env.admin, name, f"{table}-base".replace("_", "-"))
    assert counters(base_rows) == COUNTERS_AT["backup"]

    phase1(env, name)
    rows1 = read_all(env.data, name)
    t1 = now_micros()
    phase2(env, name)
    rows2 = read_all(env.data, name)
    t2 = now_micros()
    if drop == "once-shipped":
        wait_for("the log shipped through T2", lambda: covered(seaweed, PREFIX, t2), 15)
    btlib.drop_row_range(env.admin, name, all_data=True)  # the disaster
    assert read_all(env.data, name) == []

    # What the source read at T1 and T2 (the writes of each phase as a user sees them).
    c1, c2 = cell_map(rows1), cell_map(rows2)
    assert (b"r-del-row", "v", b"q", 1000) not in c1 and (b"r-del-col", "v", b"a", 1000) not in c1
    assert [ts for (k, f, q, ts) in c1 if (k, f, q) == (b"r-push", "v", b"q")] == [3000, 2000]
    assert [ts for (k, f, q, ts) in c2 if (k, f, q) == (b"r-push", "v", b"q")] == [2000]
    assert c1[(b"r-over", "v", b"q", 4000)] == b"o1" and c2[(b"r-over", "v", b"q", 4000)] == b"o2"
    assert counters(rows1) == COUNTERS_AT["T1"] and counters(rows2) == COUNTERS_AT["T2"]
    assert not any(k == b"r-p1-small" for (k, *_) in c2)

    # T2 first: its wait for the log covers T1 too.
    at_t2 = restore_to(env.admin, backup.name, f"{table}_t2", t2).name
    got2 = read_all(env.data, at_t2)
    assert rows_digest(got2) == rows_digest(rows2), (
        f"restored to T2: missing {sorted(set(c2) - set(cell_map(got2)))}, "
        f"extra {sorted(set(cell_map(got2)) - set(c2))}")
    assert counters(got2) == COUNTERS_AT["T2"]

    at_t1 = restore_to(env.admin, backup.name, f"{table}_t1", t1).name
    got1 = read_all(env.data, at_t1)
    assert rows_digest(got1) == rows_digest(rows1), (
        f"restored to T1: missing {sorted(set(c1) - set(cell_map(got1)))}, "
        f"extra {sorted(set(cell_map(got1)) - set(c1))}")
    assert counters(got1) == COUNTERS_AT["T1"]

    # The same time written in another zone is the same point in time.
    at_t1_zoned = restore_to(env.admin, backup.name, f"{table}_t1_zoned", t1,
                             offset_minutes=-300).name
    assert rows_digest(read_all(env.data, at_t1_zoned)) == rows_digest(rows1)

    plain = restore_to(env.admin, backup.name, f"{table}_backup", None).name
    got0 = read_all(env.data, plain)
    assert rows_digest(got0) == rows_digest(base_rows)
    assert counters(got0) == COUNTERS_AT["backup"]

    # The restored tables are tables like any other: they take writes, and the restore says
    # where it came from.
    info = btlib.get_table(env.admin, at_t1).restore_info
    assert info.source_type == admin_types.RestoreSourceType.BACKUP
    assert info.backup_info.backup == backup.name and info.backup_info.source_table == name
    btlib.mutate_row(env.data, at_t1, b"c-1", [add_to_cell("agg", b"n", 0, 1)])
    assert counters(read_all(env.data, at_t1))[(b"c-1", 0)] == 16


def test_restore_to_just_before_the_table_was_deleted(env):
    """The backup outlives its table: a table deleted right after acknowledged writes (within
    one shipping interval) restores to a time before its deletion with those writes."""
    table = "ledger"
    name = btlib.table_name(table)
    # Another table stays (the server's only table deleted is the next test's case).
    btlib.create_table(env.admin, "ledger_neighbour", ["cf"])
    btlib.create_table(env.admin, table, {"cf": None, "agg": aggregate_family("sum")})
    assert set(btlib.mutate_rows(env.data, name, [
        (b"a%02d" % i, [set_cell("cf", b"q", b"base %d" % i, 1000)]) for i in range(10)])) == {"OK"}
    backup = create_backup(env.admin, name, "ledger-base")
    assert set(btlib.mutate_rows(env.data, name, [
        (b"b%02d" % i, [set_cell("cf", b"q", b"after %d" % i, 2000), add_to_cell("agg", b"n", 0, i)])
        for i in range(10)])) == {"OK"}
    btlib.mutate_row(env.data, name, b"a00", [delete_from_row()])
    expected = read_all(env.data, name)
    t = now_micros()
    btlib.delete_table(env.admin, name)

    got = read_all(env.data, restore_to(env.admin, backup.name, "ledger_restored", t).name)
    assert rows_digest(got) == rows_digest(expected), (
        f"missing {sorted(set(cell_map(expected)) - set(cell_map(got)))[:5]}, "
        f"extra {sorted(set(cell_map(got)) - set(cell_map(expected)))[:5]}")


def test_the_only_table_deleted_restores_to_a_time_before_its_deletion(seaweed, server_factory):
    """A server whose one table is deleted (every write shipped before, none since): the
    backup restores to a time just before the deletion, once the log covers that time (the
    server keeps saying how far it shipped though it has no table left)."""
    prefix = "pitr-only"
    args, aws = log_server(seaweed, prefix)
    s = server_factory(extra_args=args, env=aws)
    clients = s.clients()
    try:
        name = btlib.table_name("only")
        btlib.create_table(clients.admin, "only", ["cf"])
        btlib.mutate_row(clients.data, name, b"a", [set_cell("cf", b"q", b"in the backup", 1000)])
        backup = create_backup(clients.admin, name, "only")
        btlib.mutate_row(clients.data, name, b"b", [set_cell("cf", b"q", b"after it", 1000)])
        expected = read_all(clients.data, name)
        written = now_micros()
        wait_for("the log shipped through the write", lambda: covered(seaweed, prefix, written), 15)
        # No write since: the restore has nothing more to wait for once the time is covered.
        t = now_micros()
        btlib.delete_table(clients.admin, name)
        try:
            got = read_all(clients.data, restore_to(clients.admin, backup.name, "only_restored", t,
                                                    wait=8).name)
        except gexc.FailedPrecondition as refused:
            pytest.fail(f"the restore to {rfc3339(t)} was refused for 8 s: {refused.message}; "
                        f"positions: {positions(seaweed, prefix)}")
        assert rows_digest(got) == rows_digest(expected)
    finally:
        clients.close()


# ------------------------------------------------------------------------- refusals


def test_bad_restore_times_are_refused_before_anything_is_restored(env):
    table = "refusals"
    name = btlib.table_name(table)
    btlib.create_table(env.admin, table, ["cf"])
    btlib.mutate_row(env.data, name, b"r", [set_cell("cf", b"q", b"v", 1000)])
    backup = create_backup(env.admin, name, "refusals")
    end = micros(backup.end_time)

    cases = [
        (rfc3339(end - 1_000_000), "before backup"),
        (rfc3339(now_micros() + 3600 * 1_000_000), "in the future"),
        ("yesterday", "RFC 3339"),
        ("2026-13-45T25:61:00Z", "RFC 3339"),
        ("", "RFC 3339"),
    ]
    for i, (when, says) in enumerate(cases):
        with pytest.raises(gexc.InvalidArgument) as refused:
            start_restore(env.admin, backup.name, f"refused_{i}", when)
        assert says in refused.value.message, (when, refused.value.message)
        assert not table_exists(env.admin, f"refused_{i}"), when
    # The backup's own end_time is a time it can be restored to (nothing to replay).
    restored = restore_to(env.admin, backup.name, "refusals_at_end", end).name
    assert rows_digest(read_all(env.data, restored)) == rows_digest(read_all(env.data, name))


def test_a_location_without_log_backup_and_a_log_backup_begun_after_the_backup(seaweed, server_factory):
    """A server without log backup: no log of the instance in its location. The same server
    then started with it: its log begins after the backup taken before, which a restore to a
    later time refuses; a backup taken since restores to a point in time, and a segment it
    needs, damaged, fails that restore with DATA_LOSS."""
    prefix = "pitr-late"
    args, aws = log_server(seaweed, prefix, interval=0)
    s = server_factory(extra_args=args, env=aws)
    clients = s.clients()
    name = btlib.table_name("late")
    try:
        btlib.create_table(clients.admin, "late", ["cf"])
        btlib.mutate_row(clients.data, name, b"r0", [set_cell("cf", b"q", b"before", 1000)])
        early = create_backup(clients.admin, name, "late-early")
        btlib.mutate_row(clients.data, name, b"r1", [set_cell("cf", b"q", b"after", 1000)])
        t = now_micros()
        with pytest.raises(gexc.FailedPrecondition) as refused:
            start_restore(clients.admin, early.name, "late_none", rfc3339(t))
        assert "no log backup of instance" in refused.value.message, refused.value.message
        assert btlib.instance_name() in refused.value.message, refused.value.message
        assert not table_exists(clients.admin, "late_none")

        # Log backup on from now: it cannot reach back to the early backup's end_time.
        clients.close()
        s.stop()
        s.extra_args, s.env = log_server(seaweed, prefix, interval=1)
        s.start()
        clients = s.clients()
        (server_id, position), = wait_for("the server's first position", lambda: list(
            positions(seaweed, prefix).items()), 15)
        assert position["since_hlc"] > micros(early.end_time), position
        assert position["cluster"] == CLUSTER and not position["stopped"], position
        btlib.mutate_row(clients.data, name, b"r2", [set_cell("cf", b"q", b"logged", 1000)])
        t = now_micros()
        with pytest.raises(gexc.FailedPrecondition) as refused:
            start_restore(clients.admin, early.name, "late_since", rfc3339(t))
        assert "ships its writes only since" in refused.value.message, refused.value.message
        assert server_id in refused.value.message, refused.value.message
        assert not table_exists(clients.admin, "late_since")

        # A backup taken since: restorable to a point in time after it.
        later = create_backup(clients.admin, name, "late-later")
        btlib.mutate_row(clients.data, name, b"r3", [set_cell("cf", b"q", b"x" * 200, 1000)])
        btlib.mutate_row(clients.data, name, b"r0", [delete_from_row()])
        expected = read_all(clients.data, name)
        t = now_micros()
        btlib.mutate_row(clients.data, name, b"r4", [set_cell("cf", b"q", b"too late", 1000)])
        got = read_all(clients.data, restore_to(clients.admin, later.name, "late_ok", t).name)
        assert rows_digest(got) == rows_digest(expected)
        assert [r.key for r in got] == [b"r1", b"r2", b"r3"]

        # Every segment holding writes after that backup's cut, damaged: DATA_LOSS, and the
        # new table is gone.
        s3 = seaweed.s3()
        cut = micros(later.end_time)
        damaged = [key for key, n in segments(seaweed, prefix) if n["max_hlc"] > cut and n["min_hlc"] <= t]
        assert damaged, segments(seaweed, prefix)
        for key in damaged:
            data = bytearray(s3.get(seaweed.bucket, key))
            data[len(data) // 2] ^= 0xFF
            s3.put(seaweed.bucket, key, bytes(data))
        with pytest.raises(gexc.GoogleAPICallError) as failed:
            restore_to(clients.admin, later.name, "late_damaged", t)
        assert failed.value.grpc_status_code == grpc.StatusCode.DATA_LOSS, failed.value
        assert ".seg" in failed.value.message, failed.value.message
        wait_for("the damaged restore's table deleted",
                 lambda: not table_exists(clients.admin, "late_damaged"), 15)
    finally:
        clients.close()


def test_a_server_that_has_not_shipped_through_the_time_holds_the_restore_back(seaweed, server_factory):
    """Two servers of one location (and instance): one frozen (SIGSTOP) after it shipped once.
    A restore through the other to a time after that is refused, naming the frozen server and
    how far it shipped; once it runs again and ships, the same restore succeeds."""
    prefix = "pitr-behind"
    args, aws = log_server(seaweed, prefix)
    behind = server_factory(extra_args=args, env=aws)
    b_clients = behind.clients()
    btlib.create_table(b_clients.admin, "elsewhere", ["cf"])
    btlib.mutate_row(b_clients.data, btlib.table_name("elsewhere"), b"r", [set_cell("cf", b"q", b"v", 1000)])
    b_clients.close()
    (behind_id, _), = wait_for("the first server's position", lambda: list(
        positions(seaweed, prefix).items()), 15)

    ahead = server_factory(extra_args=args, env=aws)
    clients = ahead.clients()
    frozen = False
    try:
        name = btlib.table_name("ahead")
        btlib.create_table(clients.admin, "ahead", ["cf"])
        btlib.mutate_row(clients.data, name, b"r0", [set_cell("cf", b"q", b"in the backup", 1000)])
        backup = create_backup(clients.admin, name, "ahead")
        wait_for("both servers' positions", lambda: len(positions(seaweed, prefix)) == 2, 15)
        os.kill(behind.proc.pid, signal.SIGSTOP)
        frozen = True
        shipped = positions(seaweed, prefix)[behind_id]["covered_hlc"]
        btlib.mutate_row(clients.data, name, b"r1", [set_cell("cf", b"q", b"replayed", 1000)])
        expected = read_all(clients.data, name)
        t = now_micros()

        # Once the running server covers t, the refusal names the frozen one.
        def refusal():
            with pytest.raises(gexc.FailedPrecondition) as refused:
                start_restore(clients.admin, backup.name, "ahead_restored", rfc3339(t))
            return behind_id in refused.value.message and refused.value.message
        message = wait_for("a refusal naming the frozen server", refusal, 15)
        assert "has shipped its writes up to" in message, message
        assert rfc3339(shipped)[:19] in message, (rfc3339(shipped), message)
        assert not table_exists(clients.admin, "ahead_restored")

        os.kill(behind.proc.pid, signal.SIGCONT)
        frozen = False
        got = read_all(clients.data, restore_to(clients.admin, backup.name, "ahead_restored", t).name)
        assert rows_digest(got) == rows_digest(expected)
    finally:
        if frozen:
            os.kill(behind.proc.pid, signal.SIGCONT)
        clients.close()


# --------------------------------------------------------------------- stop and crash


def small_and_big_writes(clients, name: str, tag: str) -> None:
    assert set(btlib.mutate_rows(clients.data, name, [
        (b"%s-%02d" % (tag.encode(), i), [set_cell("cf", b"q", b"%s %d" % (tag.encode(), i), SERVER_TIME),
                                         set_cell("cf", b"big", big(f"{tag}{i}"), 1000),
                                         add_to_cell("agg", b"n", 0, i)])
        for i in range(20)])) == {"OK"}
    btlib.mutate_row(clients.data, name, b"base-00", [delete_from_row()])
    btlib.mutate_row(clients.data, name, b"base-01", [add_to_cell("agg", b"n", 0, 5)])


def base_table(clients, table: str) -> str:
    name = btlib.table_name(table)
    btlib.create_table(clients.admin, table, {"cf": None, "agg": aggregate_family("sum")}, splits=("m",))
    assert set(btlib.mutate_rows(clients.data, name, [
        (b"base-%02d" % i, [set_cell("cf", b"q", b"base", 1000), add_to_cell("agg", b"n", 0, 1)])
        for i in range(5)])) == {"OK"}
    return name


def test_a_graceful_stop_ships_the_rest_of_the_log(seaweed, server_factory):
    prefix = "pitr-stop"
    args, aws = log_server(seaweed, prefix, interval=600)
    s = server_factory(extra_args=args, env=aws)
    clients = s.clients()
    name = base_table(clients, "stopped")
    backup = create_backup(clients.admin, name, "stopped")
    small_and_big_writes(clients, name, "w")
    expected = read_all(clients.data, name)
    t = now_micros()
    clients.close()
    assert positions(seaweed, prefix) == {}, "shipped before its 600 s interval"
    s.stop()

    (server_id, position), = positions(seaweed, prefix).items()
    assert position["stopped"] is True, position
    assert position["covered_hlc"] > t, (position, t)
    assert position["cluster"] == CLUSTER and position["server"] == server_id, position
    assert segments(seaweed, prefix, server_id), "no segment shipped at stop"

    s.start()
    clients = s.clients()
    try:
        got = read_all(clients.data, restore_to(clients.admin, backup.name, "stopped_at_t", t, wait=0).name)
        assert rows_digest(got) == rows_digest(expected)
        assert counters(got) == counters(expected)
    finally:
        clients.close()


def test_a_restarted_server_does_not_let_a_restore_skip_its_new_writes(seaweed, server_factory):
    """Stopped (its position says so), then started again with a long interval: it takes
    writes it has not shipped. A restore to a time after them must not read as if they never
    happened: it waits (FAILED_PRECONDITION) or holds them."""
    prefix = "pitr-restarted"
    args, aws = log_server(seaweed, prefix, interval=600)
    s = server_factory(extra_args=args, env=aws)
    clients = s.clients()
    name = base_table(clients, "restarted")
    backup = create_backup(clients.admin, name, "restarted")
    clients.close()
    s.stop()
    s.start()
    clients = s.clients()
    try:
        small_and_big_writes(clients, name, "after-restart")
        expected = read_all(clients.data, name)
        t = now_micros()
        position = next(iter(positions(seaweed, prefix).values()))
        try:
            op = start_restore(clients.admin, backup.name, "restarted_at_t", rfc3339(t))
        except gexc.FailedPrecondition as refused:
            assert "has shipped its writes up to" in refused.message, refused.message
            return
        got = read_all(clients.data, op.result(timeout=OP_TIMEOUT).name)
        assert rows_digest(got) == rows_digest(expected), (
            f"the restore to {rfc3339(t)} succeeded without the writes acknowledged before it "
            f"(position.json after the restart: {position}); restored rows: "
            f"{[r.key for r in got]}")
    finally:
        clients.close()


def test_writes_acknowledged_before_a_kill9_are_shipped_after_the_restart(seaweed, server_factory):
    prefix = "pitr-kill"
    args, aws = log_server(seaweed, prefix, interval=600)
    s = server_factory(extra_args=args, env=aws)
    clients = s.clients()
    name = base_table(clients, "killed")
    backup = create_backup(clients.admin, name, "killed")
    small_and_big_writes(clients, name, "k")
    expected = read_all(clients.data, name)
    t = now_micros()
    clients.close()
    s.kill9()
    assert positions(seaweed, prefix) == {} and segments(seaweed, prefix) == [], "shipped before the kill"

    s.extra_args, s.env = log_server(seaweed, prefix, interval=1)
    s.start()
    clients = s.clients()
    try:
        # The log survived in the store: the writes before the kill are shipped after the
        # restart (a segment holding writes of before t).
        wait_for("a segment of the writes before the kill", lambda: [
            key for key, n in segments(seaweed, prefix) if n["min_hlc"] <= t], 15)
        wait_for("the restarted server's position", lambda: positions(seaweed, prefix), 15)
        # The log was on throughout (its cursor kept in the store), so the restore reaches back
        # to the backup.
        got = read_all(clients.data, restore_to(clients.admin, backup.name, "killed_at_t", t).name)
        assert rows_digest(got) == rows_digest(expected), (
            f"missing {sorted(set(cell_map(expected)) - set(cell_map(got)))[:5]}")
        assert counters(got) == counters(expected)
    finally:
        clients.close()
