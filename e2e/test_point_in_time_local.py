"""Point-in-time recovery of a multi-server cluster on the local runtime (docs/backups.md,
"Point-in-time recovery"): three tablet servers started with ``BASALT_LOG_BACKUP_INTERVAL_SECS=1``
ship their change logs to the runtime's backup location (``DIR/backups``, file://), each under
``logs/<project>/<instance>/<cluster>/<server>/``; RestoreTable with the request metadata
``x-basalt-restore-time`` restores a backup and replays every server's writes up to that time.

* a table over six tablets owned by the three servers; a backup; writes of every kind through
  different servers into every tablet; the table read at T; more writes and a DropRowRange of
  everything (at once, as a disaster comes, or once every server shipped through it); a
  restore to T through a server other than the backup's reads exactly as the table read at T,
  through each of the three servers;
* while a writer keeps writing, a fourth server joins and the master moves tablets to it: a
  restore to a time in the middle of the moves holds every write acknowledged before it and
  none sent after it, and a restore to a time after them reads exactly as the table did.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
from google.api_core import exceptions as gexc
from google.cloud.bigtable_admin_v2 import types as admin_types
from google.cloud.bigtable_admin_v2.types import Backup

import btlib
import localrt
from btlib import (add_to_cell, aggregate_family, delete_from_column, delete_from_row, gc_versions,
                   set_cell)
from conftest import free_port
from test_backups import in_days, micros, now_micros, rows_digest
from test_point_in_time import big, cell_map, counters, restore_to

INSTANCE = "pitr-local"
CLUSTER = "pitr-local-c1"
OP_TIMEOUT = 180
SPLITS = (b"d", b"h", b"m", b"r", b"v")  # 6 tablets
PREFIXES = (b"a", b"e", b"j", b"n", b"s", b"x")  # one in each tablet
FAMILIES = {"cf": None, "v": gc_versions(2), "agg": aggregate_family("sum")}


def tname(table: str) -> str:
    return btlib.table_name(table, INSTANCE)


def servers(rt) -> list[dict]:
    return rt.cluster(INSTANCE, CLUSTER)["servers"]


def create_backup(admin, table: str, backup_id: str) -> Backup:
    parent = f"{btlib.instance_name(INSTANCE)}/clusters/{CLUSTER}"
    return admin.create_backup(request=admin_types.CreateBackupRequest(
        parent=parent, backup_id=backup_id, backup=Backup(source_table=tname(table), expire_time=in_days(7))),
        retry=None, timeout=60).result(timeout=OP_TIMEOUT)


def positions(rt) -> dict[str, dict]:
    """Every server's ``position.json`` in the runtime's backup location, by server id."""
    d = rt.data_dir / "backups" / "logs" / btlib.PROJECT / INSTANCE / CLUSTER
    out = {}
    for p in d.glob("*/position.json"):
        try:
            pos = json.loads(p.read_text())
        except (OSError, ValueError):  # being written
            continue
        out[pos["server"]] = pos
    return out


def tablets(rt, etcd: localrt.EtcdCluster, table: str) -> list[dict]:
    """The table's tablets in etcd's tablet map (read from etcd itself)."""
    return [json.loads(v) for _, v in localrt.etcd_range(rt.state()["etcd"],
                                                         etcd.prefix + f"tablets/{table}/")]


def create_table(rt, clients, table: str, etcd: localrt.EtcdCluster):
    btlib.create_table(clients.admin, table, FAMILIES, splits=SPLITS, instance=INSTANCE)
    localrt.wait(f"{table}'s 6 tablets owned by the 3 servers", lambda: (
        len(tablets(rt, etcd, table)) == 6 and len({t["owner"] for t in tablets(rt, etcd, table)}) == 3),
        60, rt)


def read_through_each(rt, name: str) -> list[str]:
    """The table's digest read through each server of the cluster."""
    out = []
    for s in servers(rt):
        c = btlib.GapicClients(s["grpc"])
        try:
            out.append(rows_digest(btlib.read_rows(c.data, name)))
        finally:
            c.close()
    return out


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    base = tmp_path_factory.mktemp("pitr-local")
    rt = localrt.LocalRuntime(base, localrt.manifest(INSTANCE, btlib.PROJECT, CLUSTER, 3),
                              f"127.0.0.1:{free_port()}",
                              env={"BASALT_LOG_BACKUP_INTERVAL_SECS": "1",
                                   "BASALT_MOVES_PER_CLUSTER": "2"})
    rt.start()
    clients = [btlib.GapicClients(s["grpc"]) for s in servers(rt)]
    try:
        yield rt, clients
    finally:
        for c in clients:
            c.close()
        assert rt.stop() == 0, rt.logs()


def covered(rt, t: int) -> bool:
    """Whether each of the 3 servers' positions says its writes through ``t`` are shipped."""
    ps = positions(rt)
    return len(ps) == 3 and all(p["covered_hlc"] > t or p["stopped"] for p in ps.values())


@pytest.mark.parametrize("drop", ["at-once", "once-shipped"])
def test_restore_to_a_time_across_servers_reads_as_the_table_did(cluster, drop):
    """``at-once``: the DropRowRange right after the last write, as a disaster comes (within
    the shipping interval); ``once-shipped``: once every server's log covers the time before
    it, so that only the replay is under test."""
    rt, (c0, c1, c2) = cluster
    etcd = localrt.EtcdCluster(rt, INSTANCE, CLUSTER)
    table = f"events_{drop.replace('-', '_')}"
    create_table(rt, c0, table, etcd)
    name = tname(table)
    # Every server ships: three positions, one per server.
    localrt.wait("a position of each of the 3 servers", lambda: len(positions(rt)) == 3, 30, rt)

    assert set(btlib.mutate_rows(c0.data, name, [
        (p + b"-base-%d" % i, [set_cell("cf", b"q", b"base", 1000), set_cell("v", b"q", b"v1", 1000),
                               set_cell("v", b"q", b"v2", 2000), add_to_cell("agg", b"n", 0, 1)])
        for p in PREFIXES for i in range(4)])) == {"OK"}
    backup = create_backup(c0.admin, table, f"{table}-base".replace("_", "-"))
    assert all(p["since_hlc"] <= micros(backup.end_time) for p in positions(rt).values()), positions(rt)

    # Writes through servers 1 and 2 (forwarded to the tablets' owners), into every tablet.
    for p in PREFIXES:
        btlib.mutate_row(c1.data, name, p + b"-new", [set_cell("cf", b"q", b"server time", -1),
                                                      set_cell("cf", b"big", big(p.decode()), 1000)])
        btlib.mutate_row(c2.data, name, p + b"-base-0", [delete_from_row()])
        btlib.mutate_row(c1.data, name, p + b"-base-1", [delete_from_column("v", b"q", 2000, 3000)])
        btlib.mutate_row(c2.data, name, p + b"-base-2", [set_cell("v", b"q", b"v3", 3000)])
        btlib.mutate_row(c1.data, name, p + b"-base-3", [add_to_cell("agg", b"n", 0, 10)])
    assert set(btlib.mutate_rows(c2.data, name, [
        (p + b"-base-3", [add_to_cell("agg", b"n", 0, 100)]) for p in PREFIXES])) == {"OK"}
    rows = btlib.read_rows(c0.data, name)
    t = now_micros()
    # More writes after T (none deleting a value over 64 bytes: a documented limit), then the
    # disaster.
    for p in PREFIXES:
        btlib.mutate_row(c2.data, name, p + b"-base-1", [delete_from_row()])
        btlib.mutate_row(c2.data, name, p + b"-new", [set_cell("cf", b"q", b"after T", -1)])
        btlib.mutate_row(c1.data, name, p + b"-base-3", [add_to_cell("agg", b"n", 0, 1000)])
        btlib.mutate_row(c1.data, name, p + b"-later", [set_cell("cf", b"q", b"after T", 1000)])
    if drop == "once-shipped":
        before_drop = now_micros()
        localrt.wait("the 3 servers' logs shipped through the drop", lambda: covered(rt, before_drop), 15, rt)
    btlib.drop_row_range(c0.admin, name, all_data=True)
    assert btlib.read_rows(c0.data, name) == []

    expected = cell_map(rows)
    assert len(rows) == 4 * len(PREFIXES)  # base-1..3 and -new of each prefix
    assert {k: v for k, v in counters(rows).items() if k[0].endswith(b"-base-3")} == {
        (p + b"-base-3", 0): 111 for p in PREFIXES}

    restored = restore_to(c1.admin, backup.name, f"{table}_at_t", t, wait=30, instance=INSTANCE).name
    digests = read_through_each(rt, restored)
    got = btlib.read_rows(c2.data, restored)
    assert digests == [rows_digest(rows)] * 3, (
        f"missing {sorted(set(expected) - set(cell_map(got)))[:6]}, "
        f"extra {sorted(set(cell_map(got)) - set(expected))[:6]}")
    assert counters(got) == counters(rows)


class Writer(threading.Thread):
    """Rows ``<prefix>-w-<n>`` (a short value and one over 64 bytes) through one server, into
    every tablet in turn, each acknowledged before the next, then adding 1 to its tablet's
    counter; records (key, sent, acked) in microseconds, and the keys of writes that failed
    (they may or may not have happened)."""

    def __init__(self, endpoint: str, table: str):
        super().__init__(daemon=True)
        self.endpoint, self.table = endpoint, table
        self.acked: list[tuple[bytes, int, int]] = []
        self.failed: list[tuple[bytes, int, str]] = []
        self.stop = threading.Event()

    def run(self):
        clients = btlib.GapicClients(self.endpoint)
        n = 0
        try:
            while not self.stop.is_set():
                p = PREFIXES[n % len(PREFIXES)]
                key = p + b"-w-%06d" % n
                sent = now_micros()
                try:
                    btlib.mutate_row(clients.data, self.table, key, [
                        set_cell("cf", b"q", b"w%d" % n, -1),
                        set_cell("cf", b"big", big(key.decode()), 1000)], timeout=30)
                    btlib.mutate_row(clients.data, self.table, p + b"-counter", [
                        add_to_cell("agg", b"n", 0, 1)], timeout=30)
                except gexc.GoogleAPICallError as e:
                    self.failed.append((key, sent, str(e)[:200]))
                else:
                    self.acked.append((key, sent, now_micros()))
                n += 1
                time.sleep(0.01)
        finally:
            clients.close()


def test_restore_to_times_during_and_after_tablet_moves(cluster):
    rt, (c0, c1, c2) = cluster
    etcd = localrt.EtcdCluster(rt, INSTANCE, CLUSTER)
    # This table alone, so that the moves the new server brings are of its tablets.
    for t in c0.admin.list_tables(parent=btlib.instance_name(INSTANCE), retry=None, timeout=60):
        btlib.delete_table(c0.admin, t.name)
    create_table(rt, c0, "moving", etcd)
    name = tname("moving")
    owners_before = {t["start"]: t["owner"] for t in tablets(rt, etcd, "moving")}
    assert set(btlib.mutate_rows(c0.data, name, [
        (p + b"-base", [set_cell("cf", b"q", b"base", 1000), add_to_cell("agg", b"n", 0, 1)])
        for p in PREFIXES])) == {"OK"}
    backup = create_backup(c0.admin, "moving", "moving-base")

    def moved_to_the_new_server() -> list[dict]:
        return [t for t in tablets(rt, etcd, "moving") if t["owner"] not in owners_before.values()]

    writer = Writer(servers(rt)[0]["grpc"], name)
    writer.start()
    try:
        localrt.wait("the writer going", lambda: len(writer.acked) >= 20, 30, rt)
        # A fourth server: the master moves tablets to it.
        applied = rt.apply(localrt.manifest(INSTANCE, btlib.PROJECT, CLUSTER, 4))
        assert applied.returncode == 0, applied.stdout + applied.stderr
        # A move may also be over between two looks: then the time is after it.
        move = localrt.wait("a tablet move, or one done", lambda: etcd.moves() or moved_to_the_new_server(),
                     90, rt, every=0.05)
        t_mid = now_micros()
        localrt.wait("a tablet owned by the new server, no move left", lambda: (
            moved_to_the_new_server() and not etcd.moves()), 120, rt, every=0.1)
        mark = len(writer.acked)
        localrt.wait("more writes after the moves", lambda: len(writer.acked) >= mark + 30, 30, rt)
    finally:
        writer.stop.set()
        writer.join(60)
    assert len(writer.failed) < 5, writer.failed
    rows = btlib.read_rows(c0.data, name)
    t_after = now_micros()
    assert len(servers(rt)) == 4
    moved = moved_to_the_new_server()
    print(f"first move {move}; moved to the new server: {[t['start'] for t in moved]}; "
          f"{len(writer.acked)} writes acked")

    # After the moves: exactly the table as read, through every server.
    restored = restore_to(c2.admin, backup.name, "moving_after", t_after, wait=30, instance=INSTANCE).name
    got = btlib.read_rows(c1.data, restored)
    assert read_through_each(rt, restored) == [rows_digest(rows)] * 4, (
        f"missing {sorted(set(cell_map(rows)) - set(cell_map(got)))[:6]}, "
        f"extra {sorted(set(cell_map(got)) - set(cell_map(rows)))[:6]}, moved {moved}")

    # In the middle of a move: every write acknowledged before t_mid, none sent after it.
    mid = restore_to(c1.admin, backup.name, "moving_mid", t_mid, wait=30, instance=INSTANCE).name
    keys = {r.key for r in btlib.read_rows(c0.data, mid)}
    acked_before = {k for k, _, a in writer.acked if a <= t_mid}
    sent_after = {k for k, s, _ in writer.acked if s > t_mid} | {k for k, s, _ in writer.failed if s > t_mid}
    assert acked_before and sent_after
    assert sorted(acked_before - keys) == [], "acknowledged before the time, not restored"
    assert sorted(keys & sent_after) == [], "sent after the time, restored"
    assert {p + b"-base" for p in PREFIXES} <= keys
