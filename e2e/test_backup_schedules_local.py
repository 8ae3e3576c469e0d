"""Backups declared as manifests (issue 28) on the local runtime: a `BackupSchedule` makes
backups of its table on its cron (here every 3 seconds, cron's seconds field as
CloudNativePG's) and prunes all but the newest `keep`; a `Backup` is made once, shows in
`local status`, and restores to the rows written before it; changing a Backup's retention
moves its expire time (start + retention) without making it again; a HOT Backup's
`hotToStandardAfter` is its `hot_to_standard_time` (start + that), moved when it changes and
unset when it goes. The same lifecycle code
(`operator/src/lifecycle/backups.rs`) runs the Kubernetes controllers."""

from __future__ import annotations

import datetime
import re
import time

import pytest
from google.cloud.bigtable_admin_v2 import types as admin_types

import btlib
import localrt
from conftest import free_port

INSTANCE = "schedules"
CLUSTER = "schedules-c1"
TABLE = "orders"
ROWS = 200


def table_manifest() -> str:
    return f"""---
apiVersion: basalt.dev/v1alpha1
kind: Table
metadata: {{name: {TABLE}}}
spec:
  instanceRef: {INSTANCE}
  columnFamilies: {{cf: {{}}}}
  initialSplits: ["k100"]
"""


def schedule_manifest(suspend: bool = False) -> str:
    return f"""---
apiVersion: basalt.dev/v1alpha1
kind: BackupSchedule
metadata: {{name: every3s}}
spec:
  instanceRef: {INSTANCE}
  tables: [{TABLE}]
  schedule: "*/3 * * * * *"
  retention: 2d
  keep: 2
  suspend: {str(suspend).lower()}
"""


BACKUP = f"""apiVersion: basalt.dev/v1alpha1
kind: Backup
metadata: {{name: before-migration}}
spec:
  instanceRef: {INSTANCE}
  table: {TABLE}
  retention: 30d
  backupType: Hot
  hotToStandardAfter: 3d
"""


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    base = tmp_path_factory.mktemp("backup-schedules")
    text = localrt.manifest(INSTANCE, btlib.PROJECT, CLUSTER, 1) + table_manifest() + schedule_manifest()
    rt = localrt.LocalRuntime(base, text, f"127.0.0.1:{free_port()}")
    rt.start()
    try:
        clients = btlib.GapicClients(rt.cluster(INSTANCE, CLUSTER)["servers"][0]["grpc"])
        yield rt, clients
        clients.close()
    finally:
        rt.stop()


def scheduled(clients, parent: str) -> dict[str, int]:
    """The schedule's backups now: id → state."""
    return {b.name.rsplit("/", 1)[1]: b.state for b in clients.admin.list_backups(parent=parent, timeout=30)
            if re.fullmatch(r"every3s-orders-\d{14}", b.name.rsplit("/", 1)[1])}


def test_schedule_makes_backups_on_its_cron_and_keeps_the_newest(runtime):
    rt, clients = runtime
    parent = f"{btlib.instance_name(INSTANCE)}/clusters/{CLUSTER}"
    name = btlib.table_name(TABLE, INSTANCE)
    localrt.wait("the Table applied", lambda: rt.instance(INSTANCE).get("tables", {}).get(TABLE) == "synced", 60, rt)
    btlib.mutate_rows(clients.data, name, [
        (b"k%03d" % i, [btlib.set_cell("cf", b"q", b"v%d" % i, 1000)]) for i in range(ROWS)])

    seen: dict[str, int] = {}

    def five_runs():
        now = scheduled(clients, parent)
        seen.update(now)
        return len(seen) >= 5
    localrt.wait("five runs of the schedule", five_runs, 60, rt, every=0.5)
    # Pruned down to the newest two ready ones (a run being made may add one more).
    localrt.wait("the schedule's oldest backups pruned", lambda: sum(
        1 for s in scheduled(clients, parent).values() if s == admin_types.Backup.State.READY) == 2, 20, rt)
    now = scheduled(clients, parent)
    ready = sorted(i for i, s in now.items() if s == admin_types.Backup.State.READY)
    oldest_seen = sorted(seen)[:len(seen) - 3]
    assert not set(oldest_seen) & set(now), (oldest_seen, now)
    for backup_id in seen:
        at = datetime.datetime.strptime(backup_id[-14:], "%Y%m%d%H%M%S")
        assert at.second % 3 == 0, backup_id
    # A scheduled backup restores to the table's rows.
    newest = ready[-1]
    backup = clients.admin.get_backup(name=f"{parent}/backups/{newest}", timeout=30)
    assert backup.source_table == name
    assert backup.backup_type == admin_types.Backup.BackupType.STANDARD
    expire = backup.expire_time.timestamp() - backup.start_time.timestamp()
    assert abs(expire - 2 * 86400) < 60, expire
    clients.admin.restore_table(request=admin_types.RestoreTableRequest(
        parent=btlib.instance_name(INSTANCE), table_id="orders_scheduled", backup=backup.name),
        timeout=60).result(timeout=120)
    rows = btlib.read_rows(clients.data, btlib.table_name("orders_scheduled", INSTANCE))
    assert [r.key for r in rows] == [b"k%03d" % i for i in range(ROWS)]
    status = rt.cli("status").stdout
    assert "BackupSchedule every3s: next at" in status, status

    # Suspended: no new run.
    out = rt.apply(localrt.manifest(INSTANCE, btlib.PROJECT, CLUSTER, 1) + schedule_manifest(suspend=True))
    assert "BackupSchedule every3s applied" in out.stdout, out.stdout + out.stderr
    time.sleep(1.5)  # a run asked for before the apply finishes
    before = set(scheduled(clients, parent))
    time.sleep(7)
    assert set(scheduled(clients, parent)) <= before
    localrt.wait("`local status` says suspended",
                 lambda: "BackupSchedule every3s: suspended" in rt.cli("status").stdout, 10, rt)


def test_backup_manifest_is_made_once_and_restores(runtime):
    rt, clients = runtime
    parent = f"{btlib.instance_name(INSTANCE)}/clusters/{CLUSTER}"
    name = btlib.table_name(TABLE, INSTANCE)
    btlib.mutate_rows(clients.data, name, [(b"m%03d" % i, [btlib.set_cell("cf", b"q", b"m", 1000)]) for i in range(50)])
    out = rt.apply(BACKUP)
    assert "Backup before-migration applied" in out.stdout, out.stdout + out.stderr
    backup_name = f"{parent}/backups/before-migration"

    def ready():
        line = rt.instance(INSTANCE).get("backups", {}).get("Backup before-migration", "")
        return line.startswith(f"{backup_name}: Ready") and line
    line = localrt.wait("the Backup ready", ready, 60, rt)
    backup = clients.admin.get_backup(name=backup_name, timeout=30)
    assert backup.state == admin_types.Backup.State.READY
    # The manifest's backupType: Bigtable's HOT, as the admin API reports it.
    assert backup.backup_type == admin_types.Backup.BackupType.HOT, backup
    assert f"{backup.size_bytes} bytes" in line, line
    assert abs(backup.expire_time.timestamp() - backup.start_time.timestamp() - 30 * 86400) < 60
    # hotToStandardAfter: 3d, as Bigtable's hot_to_standard_time: 3 days after its start (to
    # the second, as the expire time is kept), and `local status` says so.
    assert abs(hot_after_start(backup) - 3 * 86400) < 1.0, backup
    shown = re.search(r", Hot until (\S+), expires ", line)
    assert shown, line
    shown = datetime.datetime.fromisoformat(shown.group(1).replace("Z", "+00:00"))
    assert abs(shown.timestamp() - backup.hot_to_standard_time.timestamp()) < 0.001, line
    # Written after it: not in it.
    btlib.mutate_rows(clients.data, name, [(b"z-after", [btlib.set_cell("cf", b"q", b"z", 1000)])])
    clients.admin.restore_table(request=admin_types.RestoreTableRequest(
        parent=btlib.instance_name(INSTANCE), table_id="orders_before", backup=backup_name),
        timeout=60).result(timeout=120)
    keys = [r.key for r in btlib.read_rows(clients.data, btlib.table_name("orders_before", INSTANCE))]
    assert b"z-after" not in keys
    assert [k for k in keys if k.startswith(b"m")] == [b"m%03d" % i for i in range(50)]
    # Made once: still the same backup a few seconds later.
    time.sleep(2)
    again = clients.admin.get_backup(name=backup_name, timeout=30)
    assert again.start_time == backup.start_time

    # hotToStandardAfter changed: UpdateBackup moves the time to 4 days after the same start
    # (a Ready backup is looked at again every 10 s); removed: unset, the backup stays HOT.
    out = rt.apply(BACKUP.replace("hotToStandardAfter: 3d", "hotToStandardAfter: 4d"))
    assert out.returncode == 0, out.stdout + out.stderr

    def hot_for(days):
        b = clients.admin.get_backup(name=backup_name, timeout=30)
        if days is None:
            return "hot_to_standard_time" not in b and b
        return "hot_to_standard_time" in b and abs(hot_after_start(b) - days * 86400) < 1.0 and b
    moved = localrt.wait("hot_to_standard_time at start + 4d", lambda: hot_for(4), 40, rt, every=0.5)
    assert moved.start_time == backup.start_time and moved.expire_time == backup.expire_time
    assert moved.backup_type == admin_types.Backup.BackupType.HOT
    out = rt.apply(BACKUP.replace("  hotToStandardAfter: 3d\n", ""))
    assert out.returncode == 0, out.stdout + out.stderr
    kept_hot = localrt.wait("hot_to_standard_time unset", lambda: hot_for(None), 40, rt, every=0.5)
    assert kept_hot.start_time == backup.start_time
    assert kept_hot.backup_type == admin_types.Backup.BackupType.HOT


def test_invalid_backup_manifests_are_refused(runtime):
    rt, _ = runtime
    bad = schedule_manifest().replace('"*/3 * * * * *"', '"every day"').replace("every3s", "bad")
    out = rt.apply(bad)
    assert out.returncode != 0
    assert "BackupSchedule default/bad: schedule \"every day\"" in out.stdout + out.stderr, out.stdout + out.stderr
    bad = BACKUP.replace("30d", "1h").replace("before-migration", "short")
    out = rt.apply(bad)
    assert out.returncode != 0
    assert "Backup default/short: retention \"1h\" is out of range" in out.stdout + out.stderr
    # hotToStandardAfter under Bigtable's 24 hours, not before the retention, or on a STANDARD
    # backup: refused, and nothing of it applied.
    for spec, refusal in [
        ("backupType: Hot, hotToStandardAfter: 12h", 'hotToStandardAfter "12h" is too short'),
        ("backupType: Hot, hotToStandardAfter: 30d",
         'hotToStandardAfter "30d" is not shorter than the retention "30d"'),
        ("backupType: Standard, hotToStandardAfter: 3d",
         'hotToStandardAfter "3d" applies only to backupType: Hot'),
    ]:
        out = rt.apply(f"""apiVersion: basalt.dev/v1alpha1
kind: Backup
metadata: {{name: bad-hot}}
spec: {{instanceRef: {INSTANCE}, table: {TABLE}, retention: 30d, {spec}}}
""")
        assert out.returncode != 0, spec
        assert f"Backup default/bad-hot: {refusal}" in out.stdout + out.stderr, out.stdout + out.stderr
    assert "Backup bad-hot" not in rt.instance(INSTANCE).get("backups", {})


def hot_after_start(b) -> float:
    """Seconds from a backup's start to its hot_to_standard_time (get_backup's answer)."""
    return b.hot_to_standard_time.timestamp() - b.start_time.timestamp()


def backup_manifest(name: str, retention: str) -> str:
    return f"""apiVersion: basalt.dev/v1alpha1
kind: Backup
metadata: {{name: {name}}}
spec:
  instanceRef: {INSTANCE}
  table: {TABLE}
  retention: {retention}
"""


def status_expires(line: str) -> datetime.datetime:
    """The expire time a Backup's status line (``local.json`` / ``local status``) shows."""
    m = re.search(r", expires (\S+)$", line)
    assert m, line
    return datetime.datetime.fromisoformat(m.group(1).replace("Z", "+00:00"))


@pytest.mark.timeout(180)
def test_backup_retention_change_moves_its_expire_time(runtime):
    rt, clients = runtime
    parent = f"{btlib.instance_name(INSTANCE)}/clusters/{CLUSTER}"
    backup_name = f"{parent}/backups/kept-longer"
    localrt.wait("the Table applied", lambda: rt.instance(INSTANCE).get("tables", {}).get(TABLE) == "synced", 60, rt)
    day = 86400.0

    def line():
        return rt.instance(INSTANCE).get("backups", {}).get("Backup kept-longer", "")

    def applied(retention: str):
        out = rt.apply(backup_manifest("kept-longer", retention))
        assert out.returncode == 0 and "Backup kept-longer applied" in out.stdout, out.stdout + out.stderr

    def expires_after_start(days: float, timeout: float):
        """Waits until get_backup's expire_time is start + ``days`` (to the second, as the
        resource's retention is kept after the backup's start) and the status line says it."""
        def moved():
            b = clients.admin.get_backup(name=backup_name, timeout=30)
            kept = b.expire_time.timestamp() - b.start_time.timestamp()
            shown = line()
            return (abs(kept - days * day) < 1.0 and shown.startswith(f"{backup_name}: Ready")
                    and abs(status_expires(shown).timestamp() - b.expire_time.timestamp()) < 0.001
                    and (b, shown))
        return localrt.wait(f"expire_time at start + {days}d", moved, timeout, rt, every=0.5)

    applied("2d")
    localrt.wait("the Backup ready", lambda: line().startswith(f"{backup_name}: Ready"), 60, rt)
    first, _ = expires_after_start(2, 15)
    assert first.state == admin_types.Backup.State.READY

    # Longer: 5 days after the same start (a Ready backup is rechecked every 10 s).
    changed_at = time.monotonic()
    applied("5d")
    longer, shown = expires_after_start(5, 40)
    took = time.monotonic() - changed_at
    assert longer.start_time == first.start_time and longer.end_time == first.end_time, \
        "the backup was made again instead of its expire time moved"
    assert longer.size_bytes == first.size_bytes
    status = rt.cli("status").stdout
    assert shown in status, status

    # Shorter again, in hours: 36h after the start (Bigtable allows shortening too).
    applied("36h")
    shorter, _ = expires_after_start(1.5, 40)
    assert shorter.start_time == first.start_time
    listed = [b for b in clients.admin.list_backups(parent=parent, timeout=30) if b.name == backup_name]
    assert [b.expire_time for b in listed] == [shorter.expire_time]

    # The shortest retention Bigtable allows, 6h, counted by the runtime from its clock a
    # moment before the server checks it: made, and kept 6 hours after its start.
    out = rt.apply(backup_manifest("six-hours", "6h"))
    assert out.returncode == 0, out.stdout + out.stderr
    six = f"{parent}/backups/six-hours"
    localrt.wait("the 6h Backup ready", lambda: rt.instance(INSTANCE).get("backups", {}).get(
        "Backup six-hours", "").startswith(f"{six}: Ready"), 60, rt)
    b = clients.admin.get_backup(name=six, timeout=30)
    assert abs(b.expire_time.timestamp() - b.start_time.timestamp() - 6 * 3600) < 5, b
    print(f"Backup retention 2d -> 5d: expire_time moved {took:.1f} s after the apply")
