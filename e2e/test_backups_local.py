"""Backups of a multi-server cluster (issue 28) on the local runtime: three tablet servers, a
table over five tablets spread over them, backed up while a writer keeps adding rows. The
backup is one point in time across every server (one cut at the same clock value), and a
restore places the backup's tablets on the servers and fills each from the backup location
(`DIR/backups`, which the runtime gives all its servers)."""

from __future__ import annotations

import datetime
import hashlib
import json
import threading
import time

import pytest
from google.cloud.bigtable_admin_v2 import types as admin_types
from google.cloud.bigtable_admin_v2.types import Backup

import btlib
import localrt
from conftest import free_port

INSTANCE = "backups"
CLUSTER = "backups-c1"
TABLE = "orders"
SPLITS = (b"s#1", b"s#2", b"s#3", b"w#")
STATIC_ROWS = 3000
OP_TIMEOUT = 180


def value(i: int) -> bytes:
    return hashlib.sha256(b"%d" % i).digest() * 16


def digest(rows) -> str:
    h = hashlib.sha256()
    for r in rows:
        h.update(b"R" + r.key)
        for c in r.cells:
            h.update(b"C%s\0%s\0%d\0%s" % (c.family.encode(), c.qualifier, c.ts, c.value))
    return f"{len(rows)} rows, {h.hexdigest()}"


def prefix(p: bytes) -> btlib.RowRange:
    return btlib.RowRange(start_key_closed=p, end_key_open=p[:-1] + bytes([p[-1] + 1]))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    base = tmp_path_factory.mktemp("backups-local")
    rt = localrt.LocalRuntime(base, localrt.manifest(INSTANCE, btlib.PROJECT, CLUSTER, 3),
                              f"127.0.0.1:{free_port()}")
    rt.start()
    try:
        clients = btlib.GapicClients(rt.cluster(INSTANCE, CLUSTER)["servers"][0]["grpc"])
        btlib.create_table(clients.admin, TABLE, ["cf"], splits=list(SPLITS), instance=INSTANCE)
        etcd = localrt.EtcdCluster(rt, INSTANCE, CLUSTER)
        localrt.wait("the table's 5 tablets owned by 3 servers",
                     lambda: sum(etcd.owners().values()) == 5 and len(etcd.owners()) == 3, 90, rt)
        name = btlib.table_name(TABLE, INSTANCE)
        for start in range(0, STATIC_ROWS, 500):
            btlib.mutate_rows(clients.data, name, [
                (b"s#%d%05d" % (i % 3 + 1, i), [btlib.set_cell("cf", b"q", value(i), 1000)])
                for i in range(start, start + 500)])
        yield rt, clients
        clients.close()
    finally:
        rt.stop()


def test_a_cluster_backup_is_one_point_in_time_and_restores_on_the_servers(cluster):
    rt, clients = cluster
    name = btlib.table_name(TABLE, INSTANCE)
    parent = f"{btlib.instance_name(INSTANCE)}/clusters/{CLUSTER}"
    # A writer adds rows w#000000, w#000001, … in order, each acknowledged before the next.
    acked: list[tuple[bytes, float, float]] = []
    errors: list[str] = []
    stop = threading.Event()

    def write():
        writer = btlib.GapicClients(rt.cluster(INSTANCE, CLUSTER)["servers"][1]["grpc"])
        n = 0
        try:
            while not stop.is_set():
                key = b"w#%06d" % n
                sent = time.time()
                try:
                    btlib.mutate_row(writer.data, name, key,
                                     [btlib.set_cell("cf", b"q", b"w", 1000)], timeout=20)
                except Exception as e:  # noqa: BLE001 - the same row again (idempotent)
                    errors.append(str(e)[:200])
                    continue
                acked.append((key, sent, time.time()))
                n += 1
        finally:
            writer.close()

    t = threading.Thread(target=write)
    t.start()
    try:
        time.sleep(1.5)
        expire = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=7)
        backup = clients.admin.create_backup(request=admin_types.CreateBackupRequest(
            parent=parent, backup_id="monday", backup=Backup(source_table=name, expire_time=expire)),
            timeout=60).result(timeout=OP_TIMEOUT)
        time.sleep(1.0)
    finally:
        stop.set()
        t.join(30)
    assert len(errors) < 5, errors
    assert backup.state == Backup.State.READY
    assert backup.size_bytes > 0
    start = backup.start_time.timestamp()
    end = backup.end_time.timestamp()
    assert start <= end

    clients.admin.restore_table(request=admin_types.RestoreTableRequest(
        parent=btlib.instance_name(INSTANCE), table_id="orders_monday", backup=backup.name),
        timeout=60).result(timeout=OP_TIMEOUT)
    restored = btlib.table_name("orders_monday", INSTANCE)
    # The rows loaded before: identical.
    assert digest(btlib.read_rows(clients.data, restored, ranges=[prefix(b"s#")])) == \
        digest(btlib.read_rows(clients.data, name, ranges=[prefix(b"s#")]))
    # The writer's rows: a prefix of them, holding every one acknowledged before the backup
    # started and none sent after it ended.
    got = [r.key for r in btlib.read_rows(clients.data, restored, ranges=[prefix(b"w#")])]
    keys = [k for k, _, _ in acked]
    assert got == keys[:len(got)]
    assert [k for k, _, a in acked if a < start and k not in set(got)] == []
    assert [k for k, s, _ in acked if s > end + 0.5 and k in set(got)] == []
    assert any(a < start for _, _, a in acked) and any(s > end for _, s, _ in acked)
    # The restored table is spread over the servers like any other.
    etcd = localrt.EtcdCluster(rt, INSTANCE, CLUSTER)
    tablets = [json.loads(v) for _, v in localrt.etcd_range(
        rt.state()["etcd"], etcd.prefix + "tablets/orders_monday/")]
    assert len(tablets) == 5, tablets
    assert len({t["owner"] for t in tablets}) >= 2, tablets
    listed = clients.admin.list_backups(parent=parent, timeout=60)
    assert [b.name for b in listed] == [backup.name]
