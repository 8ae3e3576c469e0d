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
inherit) so that a backup of the fault tests' 16 MB table lasts seconds.

Chunk collection: two backups sharing chunks, one deleted; with the chunk files aged past the
hour (their mtime), a sweep collects the deleted backup's own chunks and never the other's,
which restores whole. A large restore (two families, several versions, five tablets) read
back by `cbt` and the official Python clients, compared with the source."""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import signal
import threading
import time
import warnings
from pathlib import Path

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
        # Through any server, the table serves nothing while a restore fills it.
        with pytest.raises(gexc.ServiceUnavailable) as refused:
            btlib.read_rows(other.data, restored)
        assert "being restored" in refused.value.message, refused.value.message
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
        # Done means done through every server, at once.
        third = clients_of(rt, 1)
        try:
            assert digest(btlib.read_rows(third.data, restored, ranges=[prefix(b"s#")])) == expected
            info = third.admin.get_table(name=restored, retry=None, timeout=30).restore_info
            assert info.backup_info.backup == backup.name and info.backup_info.source_table == source
        finally:
            third.close()
    finally:
        victim_clients.close()
        other.close()
    assert gone_after < LEASE + 30
    rt.wait_ready(timeout=120, pids_not=[victim])
    print(f"the half-restored table was deleted {gone_after:.1f} s after the kill")


# --------------------------------------------------------------- chunk collection


def location(rt) -> Path:
    """The backup location the runtime gives its servers: ``file://DIR/backups``."""
    return rt.data_dir / "backups"


def manifest_of(rt, backup_id: str) -> dict:
    return json.loads((location(rt) / "backups" / btlib.PROJECT / INSTANCE / CLUSTER / backup_id
                       / "manifest.json").read_text())


def chunk_files(rt) -> set[str]:
    return {p.name for p in (location(rt) / "chunks").iterdir()}


def age(path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


GC_SPLITS = (b"g#2", b"g#3", b"g#4")


def gc_row(tablet: int, i: int, version: int = 0) -> tuple[bytes, list]:
    key = b"g#%d%04d" % (tablet, i)
    data = hashlib.sha256(key + b"/%d" % version).digest() * 32  # 1 KB, of its row alone
    return key, [btlib.set_cell("cf", b"q", data, 1000 * (version + 1))]


@pytest.mark.timeout(240)
def test_unheld_chunks_are_collected_once_old_and_held_ones_never(cluster):
    """Backups A and B of a table whose first two tablets changed between them share the
    other tablets' chunks. A deleted, and every chunk file aged two hours (as if an hour had
    passed; a file:// location's age is the file's mtime): a sweep collects the chunks only A
    held, keeps an unheld one 50 minutes old, and never touches B's, which restores whole."""
    rt, _ = cluster
    rt.wait_ready(timeout=120)
    clients = clients_of(rt, 0)
    table_id, restored_id = "gc_source", "gc_restored"
    name = btlib.table_name(table_id, INSTANCE)
    made: list[str] = []
    try:
        btlib.create_table(clients.admin, table_id, ["cf"], splits=list(GC_SPLITS), instance=INSTANCE)
        for tablet in (1, 2, 3, 4):
            assert set(btlib.mutate_rows(clients.data, name, [gc_row(tablet, i) for i in range(60)])) == {"OK"}
        a = start_backup(clients.admin, "gc-a", name).result(timeout=OP_TIMEOUT)
        made.append(a.name)
        # Tablets 1 and 2 change (a new version of a row, a new row); 3 and 4 do not.
        assert set(btlib.mutate_rows(clients.data, name, [gc_row(1, 7, version=1), gc_row(2, 60)])) == {"OK"}
        b = start_backup(clients.admin, "gc-b", name).result(timeout=OP_TIMEOUT)
        made.append(b.name)
        at_b = digest(btlib.read_rows(clients.data, name))
        # Written after B: not in its restore.
        assert set(btlib.mutate_rows(clients.data, name, [gc_row(3, 999)])) == {"OK"}

        ma, mb = manifest_of(rt, "gc-a"), manifest_of(rt, "gc-b")
        held_a = {c["sha256"] for c in ma["chunks"]}
        held_b = {c["sha256"] for c in mb["chunks"]}
        shared, only_a, only_b = held_a & held_b, held_a - held_b, held_b - held_a
        assert shared and only_b and len(only_a) >= 2, (sorted(held_a), sorted(held_b))
        on_disk = chunk_files(rt)
        assert held_a | held_b <= on_disk
        # B uploaded only its own chunks; the shared ones were there already.
        sizes = {c["sha256"]: c["bytes"] for c in mb["chunks"]}
        assert mb["size_bytes"] == sum(sizes.values()) == b.size_bytes
        assert mb["uploaded_bytes"] == sum(sizes[h] for h in only_b), mb["uploaded_bytes"]

        clients.admin.delete_backup(name=a.name, retry=None, timeout=30)
        made.remove(a.name)
        with pytest.raises(gexc.NotFound):
            clients.admin.get_backup(name=a.name, retry=None, timeout=30)
        assert a.name not in listed(clients.admin)
        with pytest.raises(FileNotFoundError):
            manifest_of(rt, "gc-a")

        # An hour passes for every chunk but one of A's, which is 50 minutes old.
        young = sorted(only_a)[0]
        for h in chunk_files(rt):
            age(location(rt) / "chunks" / h, 50 * 60 if h == young else 2 * 3600)
        aged_at = time.monotonic()
        localrt.wait("A's own old chunks collected",
                     lambda: not (only_a - {young}) & chunk_files(rt), 30, rt, every=0.2)
        collected_after = time.monotonic() - aged_at
        left = chunk_files(rt)
        assert held_b <= left, f"chunks B holds were collected: {sorted(held_b - left)}"
        assert young in left, "a chunk younger than an hour was collected"
        # Its hour over too: the next sweep takes it, and still none of B's.
        age(location(rt) / "chunks" / young, 2 * 3600)
        localrt.wait("A's last chunk collected", lambda: young not in chunk_files(rt), 30, rt)
        left = chunk_files(rt)
        assert held_b <= left, f"chunks B holds were collected: {sorted(held_b - left)}"
        assert manifest_of(rt, "gc-b") == mb

        # B restores whole, to the table as it was when B was made.
        clients.admin.restore_table(request=admin_types.RestoreTableRequest(
            parent=btlib.instance_name(INSTANCE), table_id=restored_id, backup=b.name),
            retry=None, timeout=60).result(timeout=OP_TIMEOUT)
        got = digest(btlib.read_rows(clients.data, btlib.table_name(restored_id, INSTANCE)))
        assert got == at_b
        assert got != digest(btlib.read_rows(clients.data, name))
        assert held_b <= chunk_files(rt)
    finally:
        for backup in made:
            clients.admin.delete_backup(name=backup, retry=None, timeout=30)
        clients.close()
    print(f"chunk collection: A's {len(only_a)} own chunks collected {collected_after:.1f} s after "
          f"aging; B's {len(held_b)} ({len(shared)} shared with A) kept")


# ------------------------------------------------- a large restore, read as a user would

LARGE_SPLITS = (b"user#00600", b"user#01200", b"user#01800", b"user#02400")
LARGE_ROWS = 3000


def hex_text(seed: bytes, size: int) -> str:
    """``size`` printable characters of its seed alone (cbt prints them as they are)."""
    out, block = [], seed
    while len(out) * 64 < size:
        block = hashlib.sha256(block).digest()
        out.append(block.hex())
    return "".join(out)[:size]


def large_cells(i: int) -> dict[str, list[tuple[str, int, str]]]:
    """Row ``user#<i>``: family ``a`` (name, email, three versions each), family ``b`` (blob,
    two versions of 700 bytes; n, one): ``fam:qual`` → [(ts, value)] newest first, about 2.3 KB."""
    key = b"user#%05d" % i
    return {
        "a:email": [(ts, f"u{i}.v{v}@example.com " + hex_text(key + b"e%d" % v, 120))
                    for v, ts in ((3, 3000), (2, 2000), (1, 1000))],
        "a:name": [(ts, f"User {i} v{v} " + hex_text(key + b"n%d" % v, 100))
                   for v, ts in ((3, 3000), (2, 2000), (1, 1000))],
        "b:blob": [(ts, hex_text(key + b"b%d" % v, 700)) for v, ts in ((2, 2000), (1, 1000))],
        "b:n": [(1000, str(i))],
    }


@contextlib.contextmanager
def emulator_host(endpoint: str):
    """BIGTABLE_EMULATOR_HOST=endpoint while the official clients are built (they read it then)."""
    old = os.environ.get("BIGTABLE_EMULATOR_HOST")
    os.environ["BIGTABLE_EMULATOR_HOST"] = endpoint
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # "Connecting to Bigtable emulator"
            yield
    finally:
        if old is None:
            del os.environ["BIGTABLE_EMULATOR_HOST"]
        else:
            os.environ["BIGTABLE_EMULATOR_HOST"] = old


@pytest.mark.timeout(300)
def test_a_large_restore_reads_the_same_through_cbt_and_the_python_clients(cluster, tmp_path):
    """A table of five tablets, 3,000 rows of two families and several versions (about 7 MB),
    backed up and restored with the official Python client as docs/backups.md shows; the
    restored table read back by cbt (count, a prefix over three tablets, compared with the
    source's output and with what was written) and by the Python data client (every cell,
    compared with the source's)."""
    from google.cloud import bigtable
    from google.cloud.bigtable.data import BigtableDataClient, ReadRowsQuery
    from test_cbt import Cbt

    rt, _ = cluster
    rt.wait_ready(timeout=120)
    table_id, restored_id, backup_id = "profiles", "profiles_restored", "profiles-large"
    loader = clients_of(rt, 0)
    name = btlib.table_name(table_id, INSTANCE)
    started = time.monotonic()
    btlib.create_table(loader.admin, table_id, {"a": btlib.gc_versions(3), "b": btlib.gc_versions(2)},
                       splits=list(LARGE_SPLITS), instance=INSTANCE)
    written = 0
    for start in range(0, LARGE_ROWS, 200):
        entries = []
        for i in range(start, start + 200):
            muts = [btlib.set_cell(col.split(":")[0], col.split(":")[1].encode(), v.encode(), ts)
                    for col, versions in large_cells(i).items() for ts, v in versions]
            written += sum(len(m.set_cell.value) for m in muts)
            entries.append((b"user#%05d" % i, muts))
        assert set(btlib.mutate_rows(loader.data, name, entries)) == {"OK"}
    loaded = time.monotonic() - started
    source_digest = digest(btlib.read_rows(loader.data, name, timeout=300))
    assert source_digest.startswith(f"{LARGE_ROWS} rows")

    endpoint = servers(rt)[1]["grpc"]
    with emulator_host(endpoint):
        client = bigtable.Client(project=btlib.PROJECT, admin=True)
        data_client = BigtableDataClient(project=btlib.PROJECT)
    backup_name = f"{btlib.instance_name(INSTANCE)}/clusters/{CLUSTER}/backups/{backup_id}"
    try:
        started = time.monotonic()
        expire = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=7)
        backup = client.table_admin_client.create_backup(
            parent=f"{btlib.instance_name(INSTANCE)}/clusters/{CLUSTER}", backup_id=backup_id,
            backup=admin_types.Backup(source_table=name, expire_time=expire)).result(timeout=OP_TIMEOUT)
        backed_up = time.monotonic() - started
        assert backup.state == Backup.State.READY
        assert backup.size_bytes >= written, (backup.size_bytes, written)
        started = time.monotonic()
        client.instance(INSTANCE).table(restored_id).restore(
            restored_id, backup_name=backup.name).result(timeout=OP_TIMEOUT)
        restored_in = time.monotonic() - started
        restored = btlib.table_name(restored_id, INSTANCE)

        # The Python data client: every cell of the restored table, as in the source.
        rows = [btlib.Row(r.row_key, [btlib.Cell(c.family, c.qualifier, c.timestamp_micros, c.value)
                                      for c in r.cells])
                for r in data_client.get_table(INSTANCE, restored_id).read_rows(ReadRowsQuery())]
        assert digest(rows) == source_digest
        # The schema and the tablets came with it.
        got = btlib.family_rules(btlib.get_table(loader.admin, restored))
        assert got == btlib.family_rules(btlib.get_table(loader.admin, name))
        assert set(got) == {"a", "b"}
        etcd = localrt.EtcdCluster(rt, INSTANCE, CLUSTER)
        tablets = [json.loads(v) for _, v in localrt.etcd_range(
            rt.state()["etcd"], etcd.prefix + f"tablets/{restored_id}/")]
        assert len(tablets) == len(LARGE_SPLITS) + 1, tablets

        # cbt, against another server of the runtime.
        home = tmp_path / "cbt-home"
        home.mkdir()
        cbt = Cbt(servers(rt)[2]["grpc"], home, project=btlib.PROJECT, instance=INSTANCE)
        assert cbt("count", restored_id).strip() == cbt("count", table_id).strip() == str(LARGE_ROWS)
        # user#01000 … user#01999: over the tablets at user#01200 and user#01800.
        out = cbt("read", restored_id, "prefix=user#01")
        assert out == cbt("read", table_id, "prefix=user#01")
        printed = cbt.rows("read", restored_id, "prefix=user#01")
        assert list(printed) == ["user#%05d" % i for i in range(1000, 2000)]
        for i in (1000, 1199, 1200, 1555, 1800, 1999):
            assert printed["user#%05d" % i] == [(col, v) for col, versions in large_cells(i).items()
                                                 for _, v in versions], i
        assert cbt.rows("lookup", restored_id, "user#02999") == {
            "user#02999": [(col, v) for col, versions in large_cells(2999).items() for _, v in versions]}
        assert "NotFound" in cbt.fails("read", "profiles_nosuch")
    finally:
        data_client.close()
        try:
            client.table_admin_client.delete_backup(name=backup_name)
        except gexc.NotFound:
            pass
        loader.close()
    print(f"large restore: {LARGE_ROWS} rows, {written / 1e6:.1f} MB of values over 5 tablets: "
          f"loaded in {loaded:.1f} s, backed up in {backed_up:.1f} s, restored in {restored_in:.1f} s "
          f"({backup.size_bytes / 1e6:.1f} MB of chunks)")
