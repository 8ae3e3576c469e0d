"""Bigtable's backups on a standalone server (docs/backups.md), kept in a real S3 object store
(SeaweedFS, e2e/seaweed.py), through the official Python admin client
(``BigtableTableAdminClient``: CreateBackup, GetBackup, ListBackups, UpdateBackup, DeleteBackup,
RestoreTable, CopyBackup, and their long-running operations) and data client.

One SeaweedFS and one server (``--backup-url s3://<bucket>/basalt``, a 2 s sweep) serve the
module; the kill -9 test has a server of its own (paced backups, so that it can be killed in
the middle of one). Objects are read and rewritten through S3 (signed requests) where a test
damages or expires a backup as the object store's owner could.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import threading
import time

import grpc
import pytest
from google.api_core import exceptions as gexc
from google.cloud.bigtable_admin_v2 import types as admin_types
from google.protobuf import field_mask_pb2

import btlib
from btlib import add_to_cell, aggregate_family, gc_versions, set_cell
from conftest import CLUSTER_MODE, BasaltServer
from seaweed import SeaweedFS

pytestmark = pytest.mark.skipif(CLUSTER_MODE, reason="backups are a standalone server's (docs/backups.md)")

PREFIX = "basalt"  # --backup-url s3://<bucket>/basalt
CLUSTER = "local"  # a standalone server's cluster id (--cluster-id's default)
Backup = admin_types.Backup
OP_TIMEOUT = 120
SPLITS = ("s#1", "s#2", "s#3", "w#")
STATIC_ROWS = 4000
VALUE_BYTES = 700  # 3 versions of one 700-byte cell a row: about 8.5 MB over four tablets


def now_micros() -> int:
    return time.time_ns() // 1000


def micros(ts: datetime.datetime) -> int:
    """A proto timestamp field (DatetimeWithNanoseconds) or a datetime, in microseconds."""
    if hasattr(ts, "timestamp_pb"):
        pb = ts.timestamp_pb()
        return pb.seconds * 1_000_000 + pb.nanos // 1000
    return int(ts.timestamp()) * 1_000_000 + ts.microsecond


def in_days(days: float) -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=days)


def cluster_name(instance: str = btlib.INSTANCE) -> str:
    return f"{btlib.instance_name(instance)}/clusters/{CLUSTER}"


def backup_name(backup_id: str, instance: str = btlib.INSTANCE) -> str:
    return f"{cluster_name(instance)}/backups/{backup_id}"


def manifest_key(backup_id: str, instance: str = btlib.INSTANCE) -> str:
    return f"{PREFIX}/backups/{btlib.PROJECT}/{instance}/{CLUSTER}/{backup_id}/manifest.json"


def static_value(i: int, version: int) -> bytes:
    # Incompressible-looking, distinct per row and version.
    seed = hashlib.sha256(f"{i}/{version}".encode()).digest()
    return (seed * (VALUE_BYTES // len(seed) + 1))[:VALUE_BYTES]


def rows_digest(rows: list[btlib.Row]) -> str:
    h = hashlib.sha256()
    for r in rows:
        h.update(b"R" + r.key)
        for c in r.cells:
            h.update(b"C%s\0%s\0%d\0%s" % (c.family.encode(), c.qualifier, c.ts, hashlib.sha256(c.value).digest()))
    return f"{len(rows)} rows, sha256 {h.hexdigest()}"


def prefix_range(prefix: bytes) -> btlib.RowRange:
    return btlib.RowRange(start_key_closed=prefix, end_key_open=prefix[:-1] + bytes([prefix[-1] + 1]))


def read_prefix(env, table_name: str, prefix: bytes) -> list[btlib.Row]:
    return btlib.read_rows(env.data, table_name, ranges=[prefix_range(prefix)])


def create_backup(admin, table_name: str, backup_id: str, days: float = 7,
                  instance: str = btlib.INSTANCE) -> Backup:
    op = admin.create_backup(
        request=admin_types.CreateBackupRequest(
            parent=cluster_name(instance), backup_id=backup_id,
            backup=Backup(source_table=table_name, expire_time=in_days(days))),
        retry=None, timeout=60)
    return op.result(timeout=OP_TIMEOUT)


def restore(admin, backup: str, table_id: str, instance: str = btlib.INSTANCE):
    op = admin.restore_table(
        request=admin_types.RestoreTableRequest(
            parent=btlib.instance_name(instance), table_id=table_id, backup=backup),
        retry=None, timeout=60)
    return op.result(timeout=OP_TIMEOUT)


def list_backups(admin, instance: str = btlib.INSTANCE) -> dict[str, Backup]:
    pager = admin.list_backups(request=admin_types.ListBackupsRequest(parent=cluster_name(instance)),
                               retry=None, timeout=60)
    return {b.name: b for b in pager}


def wait_for(what: str, check, timeout: float, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout}s")
        time.sleep(interval)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory):
    store = SeaweedFS(tmp_path_factory.mktemp("seaweedfs")).start()
    yield store
    store.stop()


@pytest.fixture(scope="module")
def server(seaweed, tmp_path_factory):
    s = BasaltServer(tmp_path_factory.mktemp("backup-server"),
                     extra_args=("--backup-url", f"s3://{seaweed.bucket}/{PREFIX}",
                                 "--backup-sweep-interval-secs", "2"),
                     env=seaweed.aws_env())
    s.start()
    yield s
    if s.running():
        s.stop()


@pytest.fixture(scope="module")
def env(server):
    clients = server.clients()
    yield clients
    clients.close()


class Source:
    """The source table: STATIC_ROWS rows ``s#<n>`` over four tablets, each with three versions
    of ``cf:q`` and an Int64 sum in ``agg:n``; the writer's rows ``w#<n>`` in a fifth."""

    def __init__(self, env, table_id: str):
        self.id = table_id
        self.name = btlib.table_name(table_id)
        btlib.create_table(env.admin, table_id,
                           {"cf": gc_versions(5), "agg": aggregate_family("sum")}, splits=SPLITS)
        batch = []
        for i in range(STATIC_ROWS):
            key = b"s#%d%04d" % (i % 4, i)
            batch.append((key, [
                *(set_cell("cf", b"q", static_value(i, v), 1_000_000 * (v + 1)) for v in range(3)),
                add_to_cell("agg", b"n", 1000, i),
                add_to_cell("agg", b"n", 1000, 7),
            ]))
            if len(batch) == 250:
                assert set(btlib.mutate_rows(env.data, self.name, batch)) == {"OK"}
                batch = []
        assert not batch


class Writer(threading.Thread):
    """Writes rows ``w#<n>``, each once, and records (key, when sent, when acknowledged)."""

    def __init__(self, env, table_name: str):
        super().__init__(daemon=True)
        self.env, self.table_name = env, table_name
        self.acked: list[tuple[bytes, int, int]] = []
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self):
        n = 0
        try:
            while not self.stopping.is_set():
                key = b"w#%08d" % n
                sent = now_micros()
                btlib.mutate_row(self.env.data, self.table_name, key,
                                 [set_cell("cf", b"w", b"written %d" % n, btlib.SERVER_TIME),
                                  add_to_cell("agg", b"n", 0, n)])
                self.acked.append((key, sent, now_micros()))
                n += 1
        except BaseException as e:  # noqa: BLE001 (reported by stop())
            self.error = e

    def stop(self):
        self.stopping.set()
        self.join(30)
        assert not self.is_alive(), "the writer did not stop"
        assert self.error is None, f"the writer failed: {self.error!r}"


@pytest.fixture(scope="module")
def source(env):
    return Source(env, "orders")


@pytest.fixture(scope="module")
def under_load(env, source):
    """The first backup, taken while a writer keeps writing; the writer stopped afterwards."""
    writer = Writer(env, source.name)
    writer.start()
    wait_for("the writer's first acknowledged writes", lambda: len(writer.acked) >= 50, 30)
    backup = create_backup(env.admin, source.name, "orders-1")
    # Keep writing past the backup's end: those writes must not be in it.
    wait_for("writes acknowledged after the backup's end", lambda: any(
        sent > micros(backup.end_time) for _, sent, _ in writer.acked[-20:]), 30)
    writer.stop()
    return backup, writer.acked


# ------------------------------------------------------------------------------ tests


def test_backup_under_write_load_restores_its_point_in_time(env, source, under_load):
    backup, acked = under_load
    start, end = micros(backup.start_time), micros(backup.end_time)
    assert backup.name == backup_name("orders-1")
    assert backup.state == Backup.State.READY
    assert backup.source_table == source.name
    assert start <= end
    assert backup.size_bytes > STATIC_ROWS * VALUE_BYTES, backup.size_bytes
    assert abs(micros(backup.expire_time) - micros(in_days(7))) < 600 * 1_000_000
    assert env.admin.get_backup(name=backup.name, retry=None, timeout=30) == backup

    restored = restore(env.admin, backup.name, "orders_restored")
    assert restored.name == btlib.table_name("orders_restored")
    restored_name = restored.name

    # The static rows, every version and the aggregates, as they are in the source.
    src_static = read_prefix(env, source.name, b"s#")
    assert len(src_static) == STATIC_ROWS
    assert rows_digest(read_prefix(env, restored_name, b"s#")) == rows_digest(src_static)
    row = btlib.read_rows(env.data, restored_name, keys=[b"s#30003"])[0]
    assert [c for c in row.cells if c.family == "agg"] == [
        btlib.Cell("agg", b"n", 1000, btlib.i64(3 + 7))]
    assert [c.ts for c in row.cells if c.family == "cf"] == [3_000_000, 2_000_000, 1_000_000]

    # The rows written under load: one point in time.
    restored_w = {r.key: r for r in read_prefix(env, restored_name, b"w#")}
    source_w = {r.key: r for r in read_prefix(env, source.name, b"w#")}
    before = [k for k, _, ack in acked if ack < start]
    after = [k for k, sent, _ in acked if sent > end]
    assert before and after, "the writer did not write on both sides of the backup"
    assert [k for k in before if k not in restored_w] == [], "acknowledged before start_time, missing"
    assert [k for k in after if k in restored_w] == [], "written after end_time, yet in the backup"
    assert set(restored_w) <= set(source_w)
    assert all(restored_w[k] == source_w[k] for k in restored_w)
    # Rows are written in order, one at a time: the backup holds a prefix of them.
    keys = [k for k, _, _ in acked]
    assert sorted(restored_w) == keys[:len(restored_w)]

    # The restored table has the source's families and is a table like any other.
    families = btlib.get_table(env.admin, restored_name).column_families
    assert set(families) == {"cf", "agg"}
    btlib.mutate_row(env.data, restored_name, b"s#00000", [add_to_cell("agg", b"n", 1000, 5)])
    row = btlib.read_rows(env.data, restored_name, keys=[b"s#00000"])[0]
    assert [c.value for c in row.cells if c.family == "agg"] == [btlib.i64(0 + 7 + 5)]


def test_restore_into_another_instance(env, source, under_load):
    backup, _ = under_load
    table = restore(env.admin, backup.name, "orders_copy", instance="other")
    assert table.name == btlib.table_name("orders_copy", instance="other")
    assert rows_digest(read_prefix(env, table.name, b"s#")) == rows_digest(
        read_prefix(env, source.name, b"s#"))
    # The other instance has its table; the source instance's tables are unchanged.
    assert btlib.get_table(env.admin, table.name).name == table.name


def test_second_backup_uploads_only_what_changed(env, seaweed, source, under_load):
    s3 = seaweed.s3()
    for i in (5, 9, 13):  # rows of one tablet (s#1...)
        btlib.mutate_row(env.data, source.name, b"s#1%04d" % i, [set_cell("cf", b"q", b"changed", 4_000_000)])
    second = create_backup(env.admin, source.name, "orders-2")
    assert second.state == Backup.State.READY
    manifest = json.loads(s3.get(seaweed.bucket, manifest_key("orders-2")))
    assert manifest["name"] == second.name
    assert manifest["size_bytes"] == second.size_bytes == sum(c["bytes"] for c in manifest["chunks"])
    assert 0 < manifest["uploaded_bytes"] < manifest["size_bytes"] // 4, (
        manifest["uploaded_bytes"], manifest["size_bytes"])
    first = json.loads(s3.get(seaweed.bucket, manifest_key("orders-1")))
    assert first["uploaded_bytes"] == first["size_bytes"]  # the first one uploaded everything
    shared = {c["sha256"] for c in first["chunks"]} & {c["sha256"] for c in manifest["chunks"]}
    assert shared, "the two backups share no chunk"
    # Every chunk either manifest names is in the store, under its SHA-256.
    stored = set(s3.keys(seaweed.bucket, f"{PREFIX}/chunks/"))
    for c in first["chunks"] + manifest["chunks"]:
        assert f"{PREFIX}/chunks/{c['sha256']}" in stored


def test_backup_api(env, source, under_load):
    admin = env.admin
    listed = list_backups(admin)
    assert {backup_name("orders-1"), backup_name("orders-2")} <= set(listed)
    assert all(b.state == Backup.State.READY for b in listed.values())
    assert listed[backup_name("orders-1")] == admin.get_backup(name=backup_name("orders-1"), retry=None)

    # UpdateBackup: expire_time only, 6 hours to 90 days from now.
    later = in_days(30)
    updated = admin.update_backup(
        request=admin_types.UpdateBackupRequest(
            backup=Backup(name=backup_name("orders-2"), expire_time=later),
            update_mask=field_mask_pb2.FieldMask(paths=["expire_time"])), retry=None)
    assert abs(micros(updated.expire_time) - micros(later)) <= 1000
    assert admin.get_backup(name=backup_name("orders-2"), retry=None).expire_time == updated.expire_time
    for days in (0.1, 91):  # 2.4 hours, 91 days
        with pytest.raises(gexc.InvalidArgument):
            admin.update_backup(
                request=admin_types.UpdateBackupRequest(
                    backup=Backup(name=backup_name("orders-2"), expire_time=in_days(days)),
                    update_mask=field_mask_pb2.FieldMask(paths=["expire_time"])), retry=None)
        with pytest.raises(gexc.InvalidArgument):
            create_backup(admin, source.name, f"too-{int(days)}", days=days)
    assert backup_name("too-0") not in list_backups(admin)

    # RestoreTable never overwrites a table.
    with pytest.raises(gexc.AlreadyExists):
        restore(admin, backup_name("orders-1"), source.id)
    with pytest.raises(gexc.NotFound):
        admin.get_backup(name=backup_name("no-such-backup"), retry=None)
    with pytest.raises(gexc.NotFound):
        admin.get_backup(name=f"{btlib.instance_name()}/clusters/no-such-cluster/backups/orders-1",
                         retry=None)

    # CopyBackup: a READY copy that names its source.
    op = admin.copy_backup(
        request=admin_types.CopyBackupRequest(
            parent=cluster_name(), backup_id="orders-1-copy",
            source_backup=backup_name("orders-1"), expire_time=in_days(10)), retry=None)
    copy = op.result(timeout=OP_TIMEOUT)
    assert copy.backup_type == Backup.BackupType.STANDARD
    assert copy.name == backup_name("orders-1-copy")
    assert copy.state == Backup.State.READY
    assert copy.source_backup == backup_name("orders-1")
    assert copy.source_table == source.name
    assert copy.size_bytes == under_load[0].size_bytes
    assert copy.end_time == under_load[0].end_time

    # A copy is kept at most 30 days (where a backup may be kept 90).
    with pytest.raises(gexc.InvalidArgument, match="30 days"):
        admin.copy_backup(
            request=admin_types.CopyBackupRequest(
                parent=cluster_name(), backup_id="orders-1-copy-31d",
                source_backup=backup_name("orders-1"), expire_time=in_days(31)), retry=None)
    assert backup_name("orders-1-copy-31d") not in list_backups(admin)

    # DeleteBackup: gone from GetBackup and ListBackups; the other backups are intact.
    admin.delete_backup(name=backup_name("orders-1-copy"), retry=None)
    with pytest.raises(gexc.NotFound):
        admin.get_backup(name=backup_name("orders-1-copy"), retry=None)
    assert backup_name("orders-1-copy") not in list_backups(admin)
    restored = restore(admin, backup_name("orders-1"), "orders_after_delete")
    assert rows_digest(read_prefix(env, restored.name, b"s#")) == rows_digest(
        read_prefix(env, btlib.table_name("orders_copy", instance="other"), b"s#"))


def small_table(env, table_id: str, rows: int = 50) -> str:
    """A table of its own content (its chunks are its own: damaging them harms no other backup)."""
    name = btlib.table_name(table_id)
    btlib.create_table(env.admin, table_id, ["cf"])
    entries = [(b"k%03d" % i, [set_cell("cf", b"q", f"{table_id} {i} {time.time_ns()}", 1000)])
               for i in range(rows)]
    assert set(btlib.mutate_rows(env.data, name, entries)) == {"OK"}
    return name


def test_expired_backup_is_swept(env, seaweed):
    s3 = seaweed.s3()
    create_backup(env.admin, small_table(env, "short_lived"), "short-lived")
    key = manifest_key("short-lived")
    manifest = json.loads(s3.get(seaweed.bucket, key))
    manifest["expire_time_micros"] = now_micros() - 60_000_000
    s3.put(seaweed.bucket, key, json.dumps(manifest).encode())
    # --backup-sweep-interval-secs 2: gone within a few sweeps.
    wait_for("the expired backup leaving ListBackups",
             lambda: backup_name("short-lived") not in list_backups(env.admin), 15, interval=0.5)
    with pytest.raises(gexc.NotFound):
        env.admin.get_backup(name=backup_name("short-lived"), retry=None)
    assert s3.get(seaweed.bucket, key) is None


def test_hot_backups_turn_standard_at_their_time(env, seaweed):
    """Bigtable's backup types: HOT as asked, with its hot_to_standard_time (at least 24 hours
    after creation, HOT backups only), changed by UpdateBackup; STANDARD once it has passed."""
    admin = env.admin
    table = small_table(env, "hot_source")

    def create(backup_id: str, kind, hot_days: float | None = None) -> Backup:
        op = admin.create_backup(
            request=admin_types.CreateBackupRequest(
                parent=cluster_name(), backup_id=backup_id,
                backup=Backup(source_table=table, expire_time=in_days(7), backup_type=kind,
                              hot_to_standard_time=in_days(hot_days) if hot_days else None)),
            retry=None, timeout=60)
        return op.result(timeout=OP_TIMEOUT)

    def update_hot(backup_id: str, days: float) -> Backup:
        return admin.update_backup(
            request=admin_types.UpdateBackupRequest(
                backup=Backup(name=backup_name(backup_id), hot_to_standard_time=in_days(days)),
                update_mask=field_mask_pb2.FieldMask(paths=["hot_to_standard_time"])), retry=None)

    hot = create("hot-1", Backup.BackupType.HOT, hot_days=2)
    assert hot.backup_type == Backup.BackupType.HOT
    assert abs(micros(hot.hot_to_standard_time) - micros(in_days(2))) < 60_000_000
    got = admin.get_backup(name=backup_name("hot-1"), retry=None)
    assert got.backup_type == Backup.BackupType.HOT and got.hot_to_standard_time == hot.hot_to_standard_time
    plain = create("standard-1", Backup.BackupType.BACKUP_TYPE_UNSPECIFIED)
    assert plain.backup_type == Backup.BackupType.STANDARD and not plain.hot_to_standard_time

    # Bigtable's rules, each refused with what was wrong; nothing is created.
    with pytest.raises(gexc.InvalidArgument, match="24 hours"):
        create("hot-too-soon", Backup.BackupType.HOT, hot_days=0.5)
    with pytest.raises(gexc.InvalidArgument, match="only to a HOT"):
        create("standard-with-time", Backup.BackupType.STANDARD, hot_days=2)
    assert not {backup_name("hot-too-soon"), backup_name("standard-with-time")} & set(list_backups(admin))
    with pytest.raises(gexc.InvalidArgument, match="STANDARD backup"):
        update_hot("standard-1", 3)
    with pytest.raises(gexc.InvalidArgument, match="24 hours"):
        update_hot("hot-1", 0.5)

    moved = update_hot("hot-1", 5)
    assert abs(micros(moved.hot_to_standard_time) - micros(in_days(5))) < 60_000_000
    assert admin.get_backup(name=backup_name("hot-1"), retry=None).hot_to_standard_time == moved.hot_to_standard_time

    # Its time passed (the manifest rewritten, as time would): STANDARD from then on.
    s3 = seaweed.s3()
    key = manifest_key("hot-1")
    manifest = json.loads(s3.get(seaweed.bucket, key))
    assert manifest["backup_type"] == "HOT"
    manifest["hot_to_standard_time_micros"] = now_micros() - 1_000_000
    s3.put(seaweed.bucket, key, json.dumps(manifest).encode())
    assert admin.get_backup(name=backup_name("hot-1"), retry=None).backup_type == Backup.BackupType.STANDARD
    assert list_backups(admin)[backup_name("hot-1")].backup_type == Backup.BackupType.STANDARD
    with pytest.raises(gexc.InvalidArgument, match="STANDARD backup"):
        update_hot("hot-1", 3)
    # A HOT backup restores like any other.
    restored = restore(admin, backup_name("hot-1"), "hot_restored")
    assert rows_digest(btlib.read_rows(env.data, restored.name)) == rows_digest(btlib.read_rows(env.data, table))


def test_cells_of_a_dropped_family_stay_dead_in_the_restored_table(env):
    """A family dropped and created again: its old cells are dead in the source, though they
    stay on disk (and so in the backup) until a compaction. The restored table reads as the
    source does, and stays so when the family is dropped and created again there."""
    admin = env.admin
    source = btlib.table_name("drops")
    btlib.create_table(admin, "drops", ["a", "b"])
    rows = [b"r%02d" % i for i in range(20)]
    assert set(btlib.mutate_rows(env.data, source, [
        (k, [set_cell("a", b"q", b"old " + k, 1000), set_cell("b", b"q", b"kept " + k, 1000)])
        for k in rows])) == {"OK"}
    btlib.modify_families(admin, source, btlib.mod_drop("a"))
    btlib.modify_families(admin, source, btlib.mod_create("a"))
    assert set(btlib.mutate_rows(env.data, source, [
        (k, [set_cell("a", b"q", b"new " + k, 2000)]) for k in rows[::2]])) == {"OK"}

    def cells(table: str) -> list[tuple]:
        return [(r.key, c.family, c.qualifier, c.value) for r in btlib.read_rows(env.data, table)
                for c in r.cells]

    expected = cells(source)
    assert {v[:4] for _, f, _, v in expected if f == "a"} == {b"new "}, expected[:4]
    backup = create_backup(admin, source, "drops-1")
    restored = restore(admin, backup.name, "drops_restored").name
    assert cells(restored) == expected
    # The restored table's own drop and create hides the new cells too, and nothing older.
    btlib.modify_families(admin, restored, btlib.mod_drop("a"))
    btlib.modify_families(admin, restored, btlib.mod_create("a"))
    assert cells(restored) == [c for c in expected if c[1] != "a"]


def test_corrupted_chunk_fails_restore_with_data_loss(env, seaweed):
    s3 = seaweed.s3()
    create_backup(env.admin, small_table(env, "fragile"), "fragile")
    manifest = json.loads(s3.get(seaweed.bucket, manifest_key("fragile")))
    chunk = manifest["chunks"][0]["sha256"]
    key = f"{PREFIX}/chunks/{chunk}"
    data = bytearray(s3.get(seaweed.bucket, key))
    data[len(data) // 2] ^= 0xFF
    s3.put(seaweed.bucket, key, bytes(data))

    with pytest.raises(gexc.GoogleAPICallError) as failed:
        restore(env.admin, backup_name("fragile"), "fragile_restored")
    assert failed.value.grpc_status_code == grpc.StatusCode.DATA_LOSS, failed.value
    assert chunk in str(failed.value.message)
    with pytest.raises(gexc.NotFound):
        btlib.get_table(env.admin, btlib.table_name("fragile_restored"))
    # The table id is free again: nothing was left behind.
    assert "fragile_restored" not in [
        t.name.rsplit("/", 1)[-1] for t in env.admin.list_tables(parent=btlib.instance_name(), retry=None)]


@pytest.mark.timeout(240)
def test_kill9_during_backup_leaves_no_backup_and_a_retry_succeeds(seaweed, server_factory):
    # A server of its own, its backups paced at 1 MB/s: a ~6 MB table takes seconds to back up.
    prefix = "basalt-crash"
    s = server_factory(extra_args=("--backup-url", f"s3://{seaweed.bucket}/{prefix}",
                                   "--backup-max-mb-per-sec", "1"),
                       env=seaweed.aws_env())
    clients = s.clients()
    try:
        name = btlib.table_name("big")
        btlib.create_table(clients.admin, "big", ["cf"], splits=("k1", "k2"))
        for start in range(0, 3000, 250):
            entries = [(b"k%d%05d" % (i % 3, i), [set_cell("cf", b"q", static_value(i, 0) * 3, 1000)])
                       for i in range(start, start + 250)]
            assert set(btlib.mutate_rows(clients.data, name, entries)) == {"OK"}
        expected = rows_digest(btlib.read_rows(clients.data, name))

        clients.admin.create_backup(
            request=admin_types.CreateBackupRequest(
                parent=cluster_name(), backup_id="big",
                backup=Backup(source_table=name, expire_time=in_days(7))), retry=None)
        wait_for("the backup listed as CREATING", lambda: list_backups(clients.admin).get(
            backup_name("big"), Backup()).state == Backup.State.CREATING, 10, interval=0.05)
        time.sleep(1)  # let it upload some chunks first (not an assertion)
        assert list_backups(clients.admin)[backup_name("big")].state == Backup.State.CREATING, (
            "the backup finished before it could be interrupted")
        s.kill9()
        clients.close()

        s.extra_args = ("--backup-url", f"s3://{seaweed.bucket}/{prefix}", "--backup-max-mb-per-sec", "0")
        s.start()
        clients = s.clients()
        assert backup_name("big") not in list_backups(clients.admin)
        with pytest.raises(gexc.NotFound):
            clients.admin.get_backup(name=backup_name("big"), retry=None)
        s3 = seaweed.s3()
        assert s3.get(seaweed.bucket, f"{prefix}/backups/{btlib.PROJECT}/{btlib.INSTANCE}/{CLUSTER}/big/manifest.json") is None
        assert s3.keys(seaweed.bucket, f"{prefix}/chunks/"), "the interrupted backup uploaded no chunk"

        backup = create_backup(clients.admin, name, "big")
        assert backup.state == Backup.State.READY
        assert list_backups(clients.admin)[backup_name("big")].state == Backup.State.READY
        restored = restore(clients.admin, backup.name, "big_restored")
        assert rows_digest(btlib.read_rows(clients.data, restored.name)) == expected
    finally:
        clients.close()


@pytest.mark.timeout(240)
def test_kill9_during_restore_the_half_restored_table_is_gone_after_restart(seaweed, server_factory):
    # A server of its own whose every restore waits 60 s once its table exists (a fail point):
    # killed in that window, as it could be in the middle of a long fill.
    prefix = "basalt-restore-crash"
    args = ("--backup-url", f"s3://{seaweed.bucket}/{prefix}")
    s = server_factory(extra_args=args,
                       env={**seaweed.aws_env(), "FAILPOINTS": "restore-before-fill=return(60000)"})
    clients = s.clients()
    try:
        name = btlib.table_name("orders")
        btlib.create_table(clients.admin, "orders", ["cf"], splits=("k1",))
        rows = [(b"k%d%03d" % (i % 2, i), [set_cell("cf", b"q", static_value(i, 2), 1000)])
                for i in range(300)]
        assert set(btlib.mutate_rows(clients.data, name, rows)) == {"OK"}
        expected = rows_digest(btlib.read_rows(clients.data, name))
        backup = create_backup(clients.admin, name, "orders")
        restored = btlib.table_name("orders_restored")
        op = clients.admin.restore_table(
            request=admin_types.RestoreTableRequest(
                parent=btlib.instance_name(), table_id="orders_restored", backup=backup.name),
            retry=None, timeout=60)

        # While its restore runs, the table exists and says where it comes from (Bigtable's
        # restore_info), but serves no read or write: its data is not all there.
        table = btlib.get_table(clients.admin, restored)
        assert table.restore_info.source_type == admin_types.RestoreSourceType.BACKUP
        assert table.restore_info.backup_info.backup == backup.name
        assert table.restore_info.backup_info.source_table == name
        state = btlib.get_table(clients.admin, restored, view=admin_types.Table.View.REPLICATION_VIEW)
        assert {c.replication_state for c in state.cluster_states.values()} == {
            admin_types.Table.ClusterState.ReplicationState.INITIALIZING}, state
        with pytest.raises(gexc.ServiceUnavailable) as refused:
            btlib.read_rows(clients.data, restored)
        assert "being restored" in refused.value.message, refused.value.message
        with pytest.raises(gexc.ServiceUnavailable):
            btlib.mutate_row(clients.data, restored, b"k0000", [set_cell("cf", b"q", b"x", 1000)])
        # Nor can it be backed up: a backup would hold part of the backup being restored.
        with pytest.raises(gexc.FailedPrecondition) as refused:
            create_backup(clients.admin, restored, "half")
        assert "being restored" in refused.value.message, refused.value.message
        assert not op.done()
        s.kill9()
        clients.close()

        # Started again (no fail point): the half-restored table is deleted at once, by the
        # server's first sweep; the same restore then succeeds.
        s.env = seaweed.aws_env()
        s.start()
        started = time.monotonic()
        clients = s.clients()
        wait_for("the half-restored table deleted", lambda: "orders_restored" not in [
            t.name.rsplit("/", 1)[-1] for t in clients.admin.list_tables(
                parent=btlib.instance_name(), retry=None, timeout=30)], 30)
        gone_after = time.monotonic() - started
        restore(clients.admin, backup.name, "orders_restored")
        assert rows_digest(btlib.read_rows(clients.data, restored)) == expected
        table = btlib.get_table(clients.admin, restored)
        info = table.restore_info.backup_info
        assert (info.backup, info.source_table) == (backup.name, name)
        assert micros(info.end_time) == micros(backup.end_time)
        state = btlib.get_table(clients.admin, restored, view=admin_types.Table.View.REPLICATION_VIEW)
        assert {c.replication_state for c in state.cluster_states.values()} == {
            admin_types.Table.ClusterState.ReplicationState.READY}, state
        btlib.mutate_row(clients.data, restored, b"k0000", [set_cell("cf", b"q", b"written", 2000)])
        print(f"the half-restored table was gone {gone_after:.1f}s after the restart")
    finally:
        clients.close()


@pytest.mark.timeout(300)
def test_object_store_killed_mid_backup_fails_it_and_a_retry_succeeds(server_factory, tmp_path):
    # An object store and a server of their own (paced backups: 1 MB/s), so that the other
    # tests' store stays up.
    store = SeaweedFS(tmp_path / "weed").start()
    prefix = "basalt-weed-crash"
    s = server_factory(extra_args=("--backup-url", f"s3://{store.bucket}/{prefix}",
                                   "--backup-max-mb-per-sec", "1"),
                       env=store.aws_env())
    clients = s.clients()
    try:
        name = btlib.table_name("store_crash")
        btlib.create_table(clients.admin, "store_crash", ["cf"], splits=("k1", "k2"))
        for start in range(0, 3000, 250):
            entries = [(b"k%d%05d" % (i % 3, i), [set_cell("cf", b"q", static_value(i, 1) * 3, 1000)])
                       for i in range(start, start + 250)]
            assert set(btlib.mutate_rows(clients.data, name, entries)) == {"OK"}
        expected = rows_digest(btlib.read_rows(clients.data, name))

        op = clients.admin.create_backup(
            request=admin_types.CreateBackupRequest(
                parent=cluster_name(), backup_id="store-crash",
                backup=Backup(source_table=name, expire_time=in_days(7))), retry=None)
        wait_for("the backup listed as CREATING", lambda: list_backups(clients.admin).get(
            backup_name("store-crash"), Backup()).state == Backup.State.CREATING, 10, interval=0.05)
        time.sleep(1.5)  # some chunks uploaded first (not an assertion)
        store.kill9()
        killed = time.monotonic()
        # The operation ends with an error naming the backup storage (once the S3 client's
        # retries of the dead endpoint are spent), and the backup is never READY.
        with pytest.raises(gexc.GoogleAPICallError) as failed:
            op.result(timeout=OP_TIMEOUT)
        failed_after = time.monotonic() - killed
        assert failed.value.grpc_status_code == grpc.StatusCode.UNAVAILABLE, failed.value
        assert "backup storage" in failed.value.message, failed.value.message
        assert store.endpoint.split("//")[1] in failed.value.message, failed.value.message

        store.start()
        listed = list_backups(clients.admin)
        assert backup_name("store-crash") not in listed, listed
        with pytest.raises(gexc.NotFound):
            clients.admin.get_backup(name=backup_name("store-crash"), retry=None)

        backup = create_backup(clients.admin, name, "store-crash")
        assert backup.state == Backup.State.READY
        assert list_backups(clients.admin)[backup_name("store-crash")].state == Backup.State.READY
        restored = restore(clients.admin, backup.name, "store_crash_restored")
        assert rows_digest(btlib.read_rows(clients.data, restored.name)) == expected
        print(f"the backup failed {failed_after:.1f}s after the object store was killed")
    finally:
        clients.close()
        store.stop()
