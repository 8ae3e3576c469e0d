"""An Instance's ``spec.backupStore`` in the local runtime: its servers keep backups where the
manifest says (here SeaweedFS's S3 gateway, ``weed mini`` on free loopback ports) instead of
``DIR/backups``, with the manifest's endpoint and region in their environment and the
credentials from the runtime's own environment (the runtime has no Secrets: it says so when
``credentialsSecret`` is set)."""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import pytest
from google.cloud.bigtable_admin_v2 import types as admin_types
from google.cloud.bigtable_admin_v2.types import Backup

import btlib
import localrt
from conftest import free_port
from seaweed import ACCESS_KEY, REGION, SECRET_KEY, SeaweedFS

INSTANCE = "archive"
CLUSTER = "archive-c1"
TABLE = "ledger"
OP_TIMEOUT = 120
NOTICE = "backupStore.credentialsSecret \"archive-creds\" is a Kubernetes Secret"


def manifest(store: SeaweedFS) -> str:
    return f"""apiVersion: basalt.dev/v1alpha1
kind: Instance
metadata:
  name: {INSTANCE}
spec:
  displayName: Archive
  type: Development
  projectId: {btlib.PROJECT}
  backupStore:
    url: s3://{store.bucket}/local
    endpoint: {store.endpoint}
    region: {REGION}
    credentialsSecret: archive-creds
---
apiVersion: basalt.dev/v1alpha1
kind: Cluster
metadata:
  name: {CLUSTER}
spec:
  instanceRef: {INSTANCE}
  serveNodes: 2
  storageSize: 1Gi
"""


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    base = tmp_path_factory.mktemp("backup-store-local")
    store = SeaweedFS(base).start()
    try:
        # Only the credentials come from the runtime's environment; the endpoint and region
        # must come from the manifest.
        for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT", "AWS_REGION", "AWS_DEFAULT_REGION",
                     "AWS_ALLOW_HTTP", "AWS_SESSION_TOKEN"):
            assert name not in os.environ, f"{name} is set in the test's environment"
        rt = localrt.LocalRuntime(base, manifest(store), f"127.0.0.1:{free_port()}",
                                  env={"AWS_ACCESS_KEY_ID": ACCESS_KEY,
                                       "AWS_SECRET_ACCESS_KEY": SECRET_KEY})
        rt.start()
        try:
            yield rt, store
        finally:
            rt.stop()
    finally:
        store.stop()


def environ(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")


def test_backups_go_to_the_instances_backup_store(runtime):
    rt, store = runtime
    servers = rt.cluster(INSTANCE, CLUSTER)["servers"]
    assert len(servers) == 2
    for s in servers:
        env = environ(s["pid"])
        for var in (f"AWS_ENDPOINT_URL={store.endpoint}", "AWS_ALLOW_HTTP=true",
                    f"AWS_REGION={REGION}", f"AWS_ACCESS_KEY_ID={ACCESS_KEY}"):
            assert var in env, (s["name"], var)
    # The runtime said where the credentials come from.
    assert NOTICE in rt.log.read_text(errors="replace")

    clients = btlib.GapicClients(servers[0]["grpc"])
    try:
        btlib.create_table(clients.admin, TABLE, ["cf"], splits=[b"m"], instance=INSTANCE)
        name = btlib.table_name(TABLE, INSTANCE)
        btlib.mutate_rows(clients.data, name, [
            (b"%s#%04d" % (b"a" if i % 2 else b"x", i), [btlib.set_cell("cf", b"q", b"v%d" % i, 1000)])
            for i in range(300)])
        parent = f"{btlib.instance_name(INSTANCE)}/clusters/{CLUSTER}"
        expire = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=1)
        backup = clients.admin.create_backup(request=admin_types.CreateBackupRequest(
            parent=parent, backup_id="nightly",
            backup=Backup(source_table=name, expire_time=expire)),
            timeout=60).result(timeout=OP_TIMEOUT)
        assert backup.state == Backup.State.READY
        clients.admin.restore_table(request=admin_types.RestoreTableRequest(
            parent=btlib.instance_name(INSTANCE), table_id="ledger_restored", backup=backup.name),
            timeout=60).result(timeout=OP_TIMEOUT)
        restored = btlib.read_rows(clients.data, btlib.table_name("ledger_restored", INSTANCE))
        original = btlib.read_rows(clients.data, name)
        assert len(original) == 300
        assert [(r.key, [(c.qualifier, c.value) for c in r.cells]) for r in restored] == \
            [(r.key, [(c.qualifier, c.value) for c in r.cells]) for r in original]
    finally:
        clients.close()

    # In the bucket under the url's prefix, and not in the runtime's default directory.
    s3 = store.s3()
    assert s3.keys(store.bucket, f"local/backups/{btlib.PROJECT}/{INSTANCE}/{CLUSTER}/") == \
        [f"local/backups/{btlib.PROJECT}/{INSTANCE}/{CLUSTER}/nightly/manifest.json"]
    assert s3.keys(store.bucket, "local/chunks/")
    assert not (rt.data_dir / "backups").exists()

    # `local apply` of the Instance says it again.
    out = rt.apply(manifest(store))
    assert out.returncode == 0, out.stderr
    assert NOTICE in out.stdout + out.stderr, out
