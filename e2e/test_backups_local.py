"""Backups of a multi-server cluster (issue 28) on the local runtime: three tablet servers, a
table over five tablets spread over them, backed up while a writer keeps adding rows. The
backup is one point in time across every server (one cut at the same clock value), and a
restore places the backup's tablets on the servers and fills each from the backup location
(`DIR/backups`, which the runtime gives all its servers).

Faults, with real processes (kill -9): the coordinating server killed mid-backup (the backup is
seen CREATING from the other servers, never READY, gone once its lease expired, and a retry
through another server succeeds and restores its point in time); a server that owns tablets
killed mid-backup (the backup completes or fails cleanly; a retry succeeds); the server running
a restore killed after it created the table (the half-restored table is deleted within the lease
and a sweep, its operation fails saying so, and a restore again succeeds). The servers'
backups are paced at 1 MB/s (``BASALT_BACKUP_MAX_MB_PER_SEC``, which the runtime's servers
inherit) so that a backup of the fault tests' 16 MB table lasts seconds."""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import signal
import threading
import time

import grpc
import pytest
from google.api_core import exceptions as gexc
from google.longrunning import operations_pb2, operations_pb2_grpc
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
BIG = "big"
BIG_SPLITS = (b"b#1", b"b#2", b"b#3", b"w#")
BIG_ROWS = 4000
BIG_VALUE = 4096  # 16 MB over four tablets: seconds to back up at 1 MB/s a server
LEASE = 10  # the lease of a backup's record in etcd (IN_FLIGHT_TTL)
RESTORE_HOLD_MS = 3000


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
                              f"127.0.0.1:{free_port()}",
                              env={"BASALT_BACKUP_MAX_MB_PER_SEC": "1",
                                   # Every restore's fill waits 3 s after its table exists (the
                                   # window the kill -9 of a restore's server needs), and the
                                   # servers sweep every 2 s.
                                   "FAILPOINTS": f"restore-before-fill=return({RESTORE_HOLD_MS})",
                                   "BASALT_BACKUP_SWEEP_INTERVAL_SECS": "2"})
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


# ------------------------------------------------------------------------- faults


def big_value(i: int) -> bytes:
    seed = hashlib.sha256(b"big %d" % i).digest()
    # Distinct 32-byte blocks: nothing for a chunk to share with another row.
    return b"".join(hashlib.sha256(seed + bytes([j])).digest() for j in range(BIG_VALUE // 32))


def servers(rt) -> list[dict]:
    return rt.cluster(INSTANCE, CLUSTER)["servers"]


def clients_of(rt, index: int) -> btlib.GapicClients:
    return btlib.GapicClients(servers(rt)[index]["grpc"])


class Writer(threading.Thread):
    """Adds rows w#000000, w#000001, … through one server, each acknowledged before the next
    (an error: the same row again, idempotent)."""

    def __init__(self, endpoint: str, table: str):
        super().__init__(daemon=True)
        self.endpoint, self.table = endpoint, table
        self.acked: list[tuple[bytes, float, float]] = []
        self.errors: list[str] = []
        self.stopping = threading.Event()

    def run(self):
        writer = btlib.GapicClients(self.endpoint)
        n = 0
        try:
            while not self.stopping.is_set():
                key = b"w#%06d" % n
                sent = time.time()
                try:
                    btlib.mutate_row(writer.data, self.table, key,
                                     [btlib.set_cell("cf", b"q", b"w", 1000)], timeout=20)
                except Exception as e:  # noqa: BLE001
                    self.errors.append(str(e)[:200])
                    time.sleep(0.1)
                    continue
                self.acked.append((key, sent, time.time()))
                n += 1
        finally:
            writer.close()

    def stop(self):
        self.stopping.set()
        self.join(30)
        assert not self.is_alive(), "the writer did not stop"


@pytest.fixture(scope="module")
def big(cluster):
    """A 16 MB table of its own over four tablets (b#1…, b#2…, b#3…, w#) on the servers."""
    rt, clients = cluster
    btlib.create_table(clients.admin, BIG, ["cf"], splits=list(BIG_SPLITS), instance=INSTANCE)
    name = btlib.table_name(BIG, INSTANCE)
    for start in range(0, BIG_ROWS, 200):
        entries = [(b"b#%d%05d" % (i % 3 + 1, i), [btlib.set_cell("cf", b"q", big_value(i), 1000)])
                   for i in range(start, start + 200)]
        assert set(btlib.mutate_rows(clients.data, name, entries)) == {"OK"}
    expected = digest(btlib.read_rows(clients.data, name, ranges=[prefix(b"b#")]))
    return name, expected


def start_backup(admin, backup_id: str, table: str):
    expire = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=7)
    return admin.create_backup(request=admin_types.CreateBackupRequest(
        parent=f"{btlib.instance_name(INSTANCE)}/clusters/{CLUSTER}", backup_id=backup_id,
        backup=Backup(source_table=table, expire_time=expire)), retry=None, timeout=60)


def backup_name(backup_id: str) -> str:
    return f"{btlib.instance_name(INSTANCE)}/clusters/{CLUSTER}/backups/{backup_id}"


def listed(admin) -> dict[str, Backup]:
    return {b.name: b for b in admin.list_backups(
        parent=f"{btlib.instance_name(INSTANCE)}/clusters/{CLUSTER}", retry=None, timeout=30)}


def get_operation(clients, name: str) -> operations_pb2.Operation:
    stub = operations_pb2_grpc.OperationsStub(clients.channel)
    return stub.GetOperation(operations_pb2.GetOperationRequest(name=name), timeout=30)


def restored_reads_its_point_in_time(clients, backup, source: str, restored_id: str,
                                     expected_static: str, acked) -> None:
    """Restores ``backup`` and checks the table: the static rows as they were loaded, and (with
    ``acked``, a writer's rows) every one acknowledged before the backup's start, none sent
    after its end, in order."""
    clients.admin.restore_table(request=admin_types.RestoreTableRequest(
        parent=btlib.instance_name(INSTANCE), table_id=restored_id, backup=backup.name),
        retry=None, timeout=60).result(timeout=OP_TIMEOUT)
    restored = btlib.table_name(restored_id, INSTANCE)
    assert digest(btlib.read_rows(clients.data, restored, ranges=[prefix(b"b#")])) == expected_static
    if acked is None:
        return
    start, end = backup.start_time.timestamp(), backup.end_time.timestamp()
    got = [r.key for r in btlib.read_rows(clients.data, restored, ranges=[prefix(b"w#")])]
    keys = [k for k, _, _ in acked]
    assert got == keys[:len(got)]
    assert [k for k, _, a in acked if a < start and k not in set(got)] == []
    assert [k for k, s, _ in acked if s > end + 0.5 and k in set(got)] == []
    source_w = [r.key for r in btlib.read_rows(clients.data, source, ranges=[prefix(b"w#")])]
    assert set(got) <= set(source_w)


@pytest.mark.timeout(300)
def test_the_coordinator_killed_mid_backup_leaves_no_backup_and_a_retry_elsewhere_succeeds(cluster, big):
    rt, _ = cluster
    name, expected = big
    backup_id = "big-coordinator-killed"
    full = backup_name(backup_id)
    coordinator, other, third = clients_of(rt, 0), clients_of(rt, 1), clients_of(rt, 2)
    writer = Writer(servers(rt)[1]["grpc"], name)
    writer.start()
    try:
        time.sleep(1.0)
        victim = servers(rt)[0]["pid"]
        op = start_backup(coordinator.admin, backup_id, name)
        op_name = op.operation.name
        # The other servers see it being created, and refuse a second one of that name.
        assert third.admin.get_backup(name=full, retry=None, timeout=30).state == Backup.State.CREATING
        assert listed(other.admin)[full].state == Backup.State.CREATING
        with pytest.raises(gexc.AlreadyExists, match="being created"):
            start_backup(other.admin, backup_id, name)
        running = get_operation(third, op_name)
        assert not running.done, running
        time.sleep(2.0)
        assert listed(third.admin)[full].state == Backup.State.CREATING, \
            "the backup finished before it could be interrupted"
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()

        # Never READY; gone once the coordinator's lease expired.
        while True:
            try:
                state = listed(third.admin).get(full)
            except gexc.GoogleAPICallError:
                state = Backup()  # a transient error of the listing server, not a state
            if state is None:
                break
            assert state.state != Backup.State.READY, "an interrupted backup is listed READY"
            assert time.monotonic() - killed_at < LEASE + 15, "the interrupted backup is still listed"
            time.sleep(0.3)
        gone_after = time.monotonic() - killed_at
        with pytest.raises(gexc.NotFound):
            third.admin.get_backup(name=full, retry=None, timeout=30)
        failed = get_operation(third, op_name)
        assert failed.done and failed.HasField("error"), failed
        assert failed.error.code == grpc.StatusCode.UNAVAILABLE.value[0], failed
        assert "did not finish" in failed.error.message, failed

        # The same id again, through another server, while the writer writes.
        backup = start_backup(other.admin, backup_id, name).result(timeout=OP_TIMEOUT)
        assert backup.state == Backup.State.READY
        assert listed(third.admin)[full].state == Backup.State.READY
        # Its operation, asked of a server that did not run it, is done with the backup.
        start = backup.start_time.timestamp_pb()
        retried = get_operation(
            third, f"operations/{full}/operations/create-{start.seconds * 1_000_000 + start.nanos // 1000}")
        assert retried.done and retried.HasField("response"), retried
        deadline = time.monotonic() + 30
        while not any(s > backup.end_time.timestamp() for _, s, _ in writer.acked[-5:]):
            assert time.monotonic() < deadline, "no write acknowledged after the backup's end"
            time.sleep(0.2)
    finally:
        writer.stop()
        for c in (coordinator, other, third):
            c.close()
    assert gone_after < LEASE + 15
    rt.wait_ready(timeout=120, pids_not=[victim])
    clients = clients_of(rt, 1)
    try:
        restored_reads_its_point_in_time(clients, backup, name, "big_retried", expected, writer.acked)
    finally:
        clients.close()


@pytest.mark.timeout(300)
def test_an_owner_killed_mid_backup_the_backup_completes_or_fails_cleanly(cluster, big):
    rt, _ = cluster
    rt.wait_ready(timeout=120)
    name, expected = big
    backup_id = "big-owner-killed"
    full = backup_name(backup_id)
    etcd = localrt.EtcdCluster(rt, INSTANCE, CLUSTER)
    names = etcd.names()
    owners = {names.get(json.loads(v)["owner"]) for _, v in localrt.etcd_range(
        rt.state()["etcd"], etcd.prefix + f"tablets/{BIG}/")}
    by_name = {s["name"]: i for i, s in enumerate(servers(rt))}
    # The coordinator: a server; the victim: another one that owns tablets of the table.
    victim_index = next(by_name[n] for n in sorted(owners) if n in by_name)
    coordinator_index = next(i for i in range(3) if i != victim_index)
    coordinator = clients_of(rt, coordinator_index)
    try:
        victim = servers(rt)[victim_index]["pid"]
        op = start_backup(coordinator.admin, backup_id, name)
        time.sleep(1.5)
        os.kill(victim, signal.SIGKILL)
        try:
            backup = op.result(timeout=OP_TIMEOUT)
            outcome = "completed"
        except gexc.GoogleAPICallError as e:
            outcome = f"failed: {e.message}"
            assert e.grpc_status_code == grpc.StatusCode.UNAVAILABLE, e
            backup = None
        if backup is None:
            # Failed cleanly: not listed, and a retry (once the server is back) succeeds.
            assert full not in listed(coordinator.admin)
            rt.wait_ready(timeout=120, pids_not=[victim])
            backup = start_backup(coordinator.admin, backup_id, name).result(timeout=OP_TIMEOUT)
        assert backup.state == Backup.State.READY, outcome
        assert listed(coordinator.admin)[full].state == Backup.State.READY
        rt.wait_ready(timeout=120, pids_not=[victim])
    finally:
        coordinator.close()
    clients = clients_of(rt, coordinator_index)
    try:
        # The table took no writes since it was loaded (its w# rows: the first test's writer).
        restored_reads_its_point_in_time(clients, backup, name, "big_owner_killed", expected, None)
        w = btlib.read_rows(clients.data, name, ranges=[prefix(b"w#")])
        assert digest(btlib.read_rows(clients.data, btlib.table_name("big_owner_killed", INSTANCE),
                                      ranges=[prefix(b"w#")])) == digest(w)
    finally:
        clients.close()
    print(f"owner killed mid-backup: the first attempt {outcome}")


@pytest.mark.timeout(300)
def test_the_server_running_a_restore_killed_its_half_restored_table_is_deleted(cluster):
    rt, _ = cluster
    rt.wait_ready(timeout=120)
    source = btlib.table_name(TABLE, INSTANCE)
    victim_index, other_index = 2, 0
    victim_clients, other = clients_of(rt, victim_index), clients_of(rt, other_index)
    restored = btlib.table_name("orders_half", INSTANCE)
    try:
        expected = digest(btlib.read_rows(other.data, source, ranges=[prefix(b"s#")]))
        backup = start_backup(other.admin, "orders-for-restore", source).result(timeout=OP_TIMEOUT)
        victim = servers(rt)[victim_index]["pid"]
        op = victim_clients.admin.restore_table(request=admin_types.RestoreTableRequest(
            parent=btlib.instance_name(INSTANCE), table_id="orders_half", backup=backup.name),
            retry=None, timeout=60)
        op_name = op.operation.name
        # The table exists, its fill held by the fail point: the restore runs when the server dies.
        assert other.admin.get_table(name=restored, retry=None, timeout=30).name == restored
        running = get_operation(other, op_name)
        assert not running.done, running
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()

        # Once the server's lease lapsed, a sweep deletes the half-restored table, and the
        # operation, asked of another server, failed saying what happened.
        deadline = killed_at + LEASE + 30
        while True:
            try:
                other.admin.get_table(name=restored, retry=None, timeout=30)
            except gexc.NotFound:
                break
            assert time.monotonic() < deadline, f"the half-restored table is still there\n{rt.logs()}"
            time.sleep(0.3)
        gone_after = time.monotonic() - killed_at
        failed = get_operation(other, op_name)
        assert failed.done and failed.HasField("error"), failed
        assert failed.error.code == grpc.StatusCode.UNAVAILABLE.value[0], failed
        assert "half-restored table was deleted" in failed.error.message, failed
        assert "orders_half" not in {t.name.rsplit("/", 1)[-1] for t in other.admin.list_tables(
            parent=btlib.instance_name(INSTANCE), retry=None, timeout=30)}

        # Restored again, through a live server, under the same id: the backup whole.
        other.admin.restore_table(request=admin_types.RestoreTableRequest(
            parent=btlib.instance_name(INSTANCE), table_id="orders_half", backup=backup.name),
            retry=None, timeout=60).result(timeout=OP_TIMEOUT)
        assert digest(btlib.read_rows(other.data, restored, ranges=[prefix(b"s#")])) == expected
    finally:
        victim_clients.close()
        other.close()
    assert gone_after < LEASE + 30
    rt.wait_ready(timeout=120, pids_not=[victim])
    print(f"the half-restored table was deleted {gone_after:.1f} s after the kill")
