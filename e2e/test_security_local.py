"""A secured instance on the local runtime, as its users see it: a `Production` Instance (TLS
by default) with two Clusters, one of two servers and one of one, and one application
identity. ``basalt-operator local`` issues every certificate from its own CA under the data
directory and lists the clients' credentials in ``local.json``; then:

* the runtime applied the Table of the manifest over TLS with its own certificate, and the
  master (TLS to etcd and to the servers) gave it tablets in both clusters;
* the issued ``admin`` identity writes and scans through the instance's endpoint with its
  client certificate, over every tablet — a request reaching a server that does not own a row
  is forwarded over mutual TLS — and the other cluster gets every row (replication over TLS,
  CheckConsistency says so);
* the application identity, with its bearer token and no certificate, holds no role until
  the admin grants it ``roles/bigtable.reader`` with SetIamPolicy: then it reads, and its
  write is PERMISSION_DENIED;
* a TLS client without credentials is UNAUTHENTICATED; a plaintext client of the endpoint and
  of a server fails; etcd refuses plaintext and a TLS client without a certificate of the CA,
  and answers the runtime's own certificate;
* ``local status`` asks every server over TLS."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request

import grpc
import pytest
from google.api_core import exceptions as gexc
from google.cloud.bigtable_admin_v2.types import bigtable_table_admin as at
from google.iam.v1 import iam_policy_pb2, policy_pb2

import btlib
import localrt
from btlib import GapicClients
from conftest import free_port

INSTANCE, PROJECT, TABLE_ID = "secured", "p", "t"
TABLE = btlib.table_name(TABLE_ID, INSTANCE, PROJECT)
SPLITS = ["g", "n", "t"]
KEYS = [f"{c}{n:03d}".encode() for c in "bhpx" for n in range(25)]

MANIFEST = f"""apiVersion: basalt.dev/v1alpha1
kind: Instance
metadata:
  name: {INSTANCE}
spec:
  displayName: Secured
  type: Production
  projectId: {PROJECT}
  security:
    identities:
      - name: app
---
apiVersion: basalt.dev/v1alpha1
kind: Cluster
metadata:
  name: {INSTANCE}-a
spec:
  instanceRef: {INSTANCE}
  serveNodes: 2
  storageSize: 1Gi
---
apiVersion: basalt.dev/v1alpha1
kind: Cluster
metadata:
  name: {INSTANCE}-b
spec:
  instanceRef: {INSTANCE}
  serveNodes: 1
  storageSize: 1Gi
---
apiVersion: basalt.dev/v1alpha1
kind: Table
metadata:
  name: {TABLE_ID}
spec:
  instanceRef: {INSTANCE}
  columnFamilies:
    cf:
      gcRule:
        maxNumVersions: 1
  initialSplits: {json.dumps(SPLITS)}
"""


@pytest.fixture(scope="module")
def rt(tmp_path_factory):
    rt = localrt.LocalRuntime(tmp_path_factory.mktemp("secured"), MANIFEST,
                              f"127.0.0.1:{free_port()}").start()
    try:
        for c in ("a", "b"):
            cluster = localrt.EtcdCluster(rt, INSTANCE, f"{INSTANCE}-{c}")
            localrt.wait(f"the table's 4 tablets owned in cluster {c}",
                         lambda: sum(owners(rt, cluster).values()) == 4, 90, rt)
        yield rt
    finally:
        rt.stop()


def security(rt) -> dict:
    return rt.instance(INSTANCE)["security"]


def identity(rt, name: str) -> dict:
    return security(rt)["identities"][name]


def read(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def etcdctl(rt, *args: str, cert: dict | None = None) -> subprocess.CompletedProcess:
    """Debian's etcdctl (gRPC, as Basalt's processes reach etcd) against the runtime's etcd,
    trusting its CA and presenting ``cert`` ({"cert", "key"} paths; None: no certificate)."""
    tls = rt.state()["tls"]
    cmd = ["etcdctl", "--endpoints", rt.state()["etcd"], "--cacert", tls["ca"],
           "--dial-timeout=3s", "--command-timeout=5s"]
    if cert:
        cmd += ["--cert", cert["cert"], "--key", cert["key"]]
    return subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=30,
                          env={**os.environ, "ETCDCTL_API": "3"})


def etcd_range(rt, prefix: str, cert: dict | None = None) -> list[tuple[bytes, bytes]]:
    """The keys and values under ``prefix``, read with ``cert`` (default: the runtime's)."""
    import base64
    cp = etcdctl(rt, "get", "--prefix", prefix, "-w", "json",
                 cert=cert or rt.state()["tls"]["operator"])
    assert cp.returncode == 0, cp.stderr
    return [(base64.b64decode(kv["key"]), base64.b64decode(kv.get("value", "")))
            for kv in json.loads(cp.stdout).get("kvs") or []]


def owners(rt, cluster: localrt.EtcdCluster) -> dict[str, int]:
    """Tablets per owner, read from etcd over TLS with the runtime's certificate."""
    out: dict[str, int] = {}
    for _, value in etcd_range(rt, cluster.prefix + "tablets/"):
        owner = json.loads(value)["owner"]
        out[owner] = out.get(owner, 0) + 1
    return out


def client(rt, endpoint: str, who: str, certificate: bool = True,
           token: bool = False) -> GapicClients:
    """GAPIC clients on a TLS channel trusting the runtime's CA, as ``who`` (an issued
    identity) with its certificate and/or its token."""
    i = identity(rt, who)
    channel = btlib.secure_channel(
        endpoint, read(security(rt)["ca"]),
        key=read(i["key"]) if certificate else None,
        cert=read(i["cert"]) if certificate else None,
        token=read(i["token"]).decode().strip() if token else None)
    return GapicClients(endpoint, channel)


def write(c: GapicClients, key: bytes):
    btlib.mutate_row(c.data, TABLE, key, [btlib.set_cell("cf", b"q", key, 1000)], timeout=20)


def keys(c: GapicClients, app_profile: str = "") -> list[bytes]:
    from google.cloud.bigtable_v2 import types as v2
    rows = []
    for resp in c.data.read_rows(request=v2.ReadRowsRequest(table_name=TABLE,
                                                          app_profile_id=app_profile),
                                 timeout=30):
        rows.extend(ch.row_key for ch in resp.chunks if ch.row_key)
    return rows


def test_local_json_lists_the_issued_credentials(rt):
    sec = security(rt)
    assert set(sec["identities"]) == {"admin", "app"}
    assert sec["identities"]["app"]["principal"] == f"user:app@{INSTANCE}.default.basalt"
    for who in ("admin", "app"):
        i = sec["identities"][who]
        for f in ("cert", "key", "token"):
            assert read(i[f]), (who, f)
    assert rt.state()["etcd"].startswith("https://"), rt.state()["etcd"]


def wait_consistent(c: GapicClients, cluster: str):
    """Until CheckConsistency, asked at a server of ``cluster``, says the writes made before
    are there."""
    token = c.admin.generate_consistency_token(
        request=at.GenerateConsistencyTokenRequest(name=TABLE), timeout=10)
    deadline = time.monotonic() + 60
    while not c.admin.check_consistency(request=at.CheckConsistencyRequest(
            name=TABLE, consistency_token=token.consistency_token), timeout=10).consistent:
        assert time.monotonic() < deadline, f"cluster {cluster} never consistent"
        time.sleep(0.5)


def test_admin_writes_and_scans_every_tablet_over_mutual_tls(rt):
    # Through the endpoint, the connection lands on a server of either cluster (the implicit
    # default profile serves it there): it reads its own writes at once.
    admin = client(rt, rt.instance(INSTANCE)["endpoint"], "admin")
    try:
        for k in KEYS:
            write(admin, k)
        assert keys(admin) == KEYS
    finally:
        admin.close()
    # Every server of both clusters, asked directly, once its cluster has every write
    # (replication over TLS): the rows a server does not own are forwarded to the other
    # server of its cluster over mutual TLS.
    for cluster in ("a", "b"):
        servers = rt.cluster(INSTANCE, f"{INSTANCE}-{cluster}")["servers"]
        for n, s in enumerate(servers):
            c = client(rt, s["grpc"], "admin")
            try:
                if n == 0:
                    wait_consistent(c, cluster)
                assert keys(c) == KEYS, s["name"]
            finally:
                c.close()


def test_an_application_token_holds_only_what_it_is_granted(rt):
    endpoint = rt.instance(INSTANCE)["endpoint"]
    app = client(rt, endpoint, "app", certificate=False, token=True)
    admin = client(rt, endpoint, "admin")
    try:
        with pytest.raises(gexc.PermissionDenied) as denied:
            keys(app)
        assert "bigtable.tables.readRows" in str(denied.value)
        iam = admin.instance_admin()
        resource = btlib.instance_name(INSTANCE, PROJECT)
        policy = iam.get_iam_policy(request=iam_policy_pb2.GetIamPolicyRequest(resource=resource))
        policy.bindings.append(policy_pb2.Binding(
            role="roles/bigtable.reader", members=[identity(rt, "app")["principal"]]))
        iam.set_iam_policy(request=iam_policy_pb2.SetIamPolicyRequest(
            resource=resource, policy=policy), timeout=10)
        # Every server caches policies for up to 2 s.
        deadline = time.monotonic() + 10
        while True:
            try:
                assert keys(app) == sorted(keys(admin))
                break
            except gexc.PermissionDenied:
                assert time.monotonic() < deadline, "the grant never took effect"
                time.sleep(0.3)
        with pytest.raises(gexc.PermissionDenied) as denied:
            write(app, b"app-row")
        assert "bigtable.tables.mutateRows" in str(denied.value)
    finally:
        app.close()
        admin.close()


def test_no_credentials_and_plaintext_are_refused(rt):
    endpoint = rt.instance(INSTANCE)["endpoint"]
    server = rt.cluster(INSTANCE, f"{INSTANCE}-a")["servers"][0]["grpc"]
    anonymous = GapicClients(endpoint, btlib.secure_channel(endpoint, read(security(rt)["ca"])))
    try:
        with pytest.raises(gexc.Unauthenticated):
            keys(anonymous)
    finally:
        anonymous.close()
    for target in (endpoint, server):
        plain = GapicClients(target)
        try:
            with pytest.raises(gexc.GoogleAPICallError) as failed:
                keys(plain)
            assert isinstance(failed.value, (gexc.ServiceUnavailable, gexc.DeadlineExceeded)), \
                failed.value
        finally:
            plain.close()
    # etcd: plaintext HTTP to its TLS port fails; TLS without a client certificate is refused,
    # and so is an application identity's certificate of the same CA (the admin's: etcd admits
    # only certificates naming internal.basalt); the runtime's own certificate is answered.
    host, port = rt.state()["etcd"].split("//")[1].split(":")
    with pytest.raises((OSError, urllib.error.URLError)):
        urllib.request.urlopen(f"http://{host}:{port}/version", timeout=5).read()
    assert etcdctl(rt, "get", "/").returncode != 0
    admin = identity(rt, "admin")
    log = rt.data_dir / "logs" / "etcd.log"
    refusals = log.read_text().count("client certificate authentication failed\", ServerName")
    refused = etcdctl(rt, "get", "--prefix", "/basalt/", cert=admin)
    assert refused.returncode != 0, refused
    assert log.read_text().count("client certificate authentication failed\", ServerName") > refusals, \
        "etcd did not refuse the identity's certificate"
    assert etcd_range(rt, "/basalt/v1/"), "the runtime's certificate reads the metadata"


def test_local_status_asks_every_server_over_tls(rt):
    cp = rt.cli("status")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    lines = cp.stdout.splitlines()
    for s in rt.servers():
        line = next(line for line in lines if line.strip().startswith(s["name"] + " "))
        # READY yes and its tablet count: the server answered GetServerStatus.
        assert " yes " in line, cp.stdout


def test_the_official_python_client_with_a_client_certificate(rt, tmp_path):
    """The high-level ``google.cloud.bigtable.Client`` as an application configures mutual TLS:
    ``api_endpoint``, ``client_cert_source`` with GOOGLE_API_USE_CLIENT_CERTIFICATE=true, the
    CA through gRPC's roots file, and no OAuth token (anonymous credentials). Its data calls
    present the certificate; its table admin calls do not (the library makes that channel
    itself), so they are UNAUTHENTICATED — docs/security.md says to give such a client a
    token."""
    import os
    import sys

    admin = identity(rt, "admin")
    ep = rt.instance(INSTANCE)["endpoint"]
    script = tmp_path / "client.py"
    script.write_text(f"""
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import bigtable

def cert_source():
    return open({admin["cert"]!r}, "rb").read(), open({admin["key"]!r}, "rb").read()

options = ClientOptions(api_endpoint="{ep}", client_cert_source=cert_source)
client = bigtable.Client(project="{PROJECT}", admin=True, credentials=AnonymousCredentials(),
                         client_options=options, admin_client_options=options)
table = client.instance("{INSTANCE}").table("{TABLE_ID}")
row = table.direct_row(b"from-python")
row.set_cell("cf", b"q", b"v")
row.commit()
print(table.read_row(b"from-python").cells["cf"][b"q"][0].value.decode())
try:
    client.instance("{INSTANCE}").list_tables()
except Exception as e:
    print(type(e).__name__)
""")
    env = {k: v for k, v in os.environ.items() if k != "BIGTABLE_EMULATOR_HOST"}
    env["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"] = security(rt)["ca"]
    env["GOOGLE_API_USE_CLIENT_CERTIFICATE"] = "true"
    cp = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                        timeout=120)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.splitlines() == ["v", "Unauthenticated"], cp.stdout
