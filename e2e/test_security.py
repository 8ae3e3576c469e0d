"""Security of a tablet server, as its users see it: TLS with a custom CA (certificates made
here with ``openssl``), clients authenticated by certificate (mutual TLS) or by bearer token,
and every call authorized with Bigtable's IAM roles — through the official Python client (its
GAPIC layer on a TLS channel, and its high-level ``Client`` with ``api_endpoint`` and OAuth
credentials), the official Node.js client and ``cbt`` (``-cert-file``, ``-access-token``).

Two servers: one requiring client certificates, one taking tokens over TLS (cbt cannot send a
client certificate). What a user must see: a reader cannot write (PERMISSION_DENIED naming
``bigtable.tables.mutateRows``), a user cannot drop a table, an admin can; TestIamPermissions
answers the subset; a table's grant does not reach another table; a stale etag is ABORTED;
no credentials are UNAUTHENTICATED and the answer never repeats a token; a plaintext client,
a client without a certificate or with one from another CA fail their handshake; Basalt's own
protocol refuses clients; a token added to the token file works at once; the certificate is
rotated under load without a failed request."""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest
from google.api_core import exceptions as gexc
from google.iam.v1 import iam_policy_pb2, policy_pb2

import btlib
from btlib import GapicClients
from conftest import BasaltServer

PROJECT, INSTANCE = "p", "i"
INSTANCE_NAME = f"projects/{PROJECT}/instances/{INSTANCE}"
ADMIN = "user:admin@example.com"
NODE_DIR = Path(__file__).resolve().parent / "node"


# ----------------------------------------------------------------------- certificates


def openssl(*args: str, cwd: Path):
    cp = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, f"openssl {' '.join(args)}:\n{cp.stderr}"


def make_ca(d: Path, name: str):
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "30",
            "-subj", f"/CN={name}", cwd=d)


def make_leaf(d: Path, name: str, cn: str, ca: str = "ca", san: str | None = None):
    """``name``.pem / ``name``.key: a certificate for ``cn`` signed by ``ca``."""
    openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}",
            cwd=d)
    ext = d / f"{name}.ext"
    ext.write_text(f"subjectAltName={san}\n" if san else "basicConstraints=CA:FALSE\n")
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-days", "30", "-out", f"{name}.pem", "-extfile", ext.name,
            cwd=d)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    assert shutil.which("openssl"), "openssl is required (apt-get install openssl)"
    d = tmp_path_factory.mktemp("pki")
    make_ca(d, "ca")
    make_ca(d, "other-ca")
    # The server's certificate names 127.0.0.1 (clients dial it by address); its common
    # name is the servers' own principal.
    make_leaf(d, "server", "basalt-server", san="IP:127.0.0.1,DNS:localhost")
    for who in ("admin", "reader", "writer", "nobody"):
        make_leaf(d, who, f"{who}@example.com")
    make_leaf(d, "stranger", "admin@example.com", ca="other-ca")
    return d


def read(p: Path) -> bytes:
    return p.read_bytes()


def mtls_client(server: BasaltServer, pki: Path, who: str, ca: str = "ca") -> GapicClients:
    return GapicClients(server.data_endpoint, btlib.secure_channel(
        server.data_endpoint, read(pki / f"{ca}.pem"), read(pki / f"{who}.key"),
        read(pki / f"{who}.pem")))


def token_client(server: BasaltServer, pki: Path, token: str | None) -> GapicClients:
    return GapicClients(server.data_endpoint, btlib.secure_channel(
        server.data_endpoint, read(pki / "ca.pem"), token=token))


def create_table(c: GapicClients, table_id: str):
    c.admin.create_table(parent=INSTANCE_NAME, table_id=table_id,
                         table=btlib.Table(column_families={"cf": btlib.column_family()}),
                         timeout=30)


def write(c: GapicClients, table_id: str, key: bytes, value: bytes = b"v"):
    btlib.mutate_row(c.data, btlib.table_name(table_id, INSTANCE, PROJECT), key,
                     [btlib.set_cell("cf", b"q", value, 1000)], timeout=10)


def keys(c: GapicClients, table_id: str) -> list[bytes]:
    return [r.key for r in btlib.read_rows(c.data, btlib.table_name(table_id, INSTANCE, PROJECT),
                                           timeout=10)]


def denied(fn) -> str:
    with pytest.raises(gexc.PermissionDenied) as e:
        fn()
    return str(e.value)


def set_policy(c: GapicClients, resource: str, bindings: dict[str, list[str]], etag=b"",
               instance: bool = False):
    policy = policy_pb2.Policy(
        bindings=[policy_pb2.Binding(role=r, members=m) for r, m in bindings.items()], etag=etag)
    request = iam_policy_pb2.SetIamPolicyRequest(resource=resource, policy=policy)
    api = c.instance_admin() if instance else c.admin
    return api.set_iam_policy(request=request, timeout=10)


def handshake_fails(endpoint: str, channel: grpc.Channel):
    """A call on ``channel`` fails as a client sees a failed handshake: UNAVAILABLE."""
    stub = channel.unary_unary("/google.bigtable.v2.Bigtable/PingAndWarm",
                               request_serializer=lambda _: b"",
                               response_deserializer=lambda b: b)
    with pytest.raises(grpc.RpcError) as e:
        stub(None, timeout=5)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE, (endpoint, e.value)
    channel.close()


# ----------------------------------------------------------------------- mutual TLS


@pytest.fixture(scope="module")
def mtls_server(pki, tmp_path_factory):
    s = BasaltServer(tmp_path_factory.mktemp("mtls"), extra_args=(
        "--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server.key"),
        "--tls-client-ca", str(pki / "ca.pem"), "--admin-principal", ADMIN)).start()
    yield s
    s.stop()


def test_client_certificates_and_bigtable_roles(mtls_server, pki):
    admin = mtls_client(mtls_server, pki, "admin")
    reader = mtls_client(mtls_server, pki, "reader")
    writer = mtls_client(mtls_server, pki, "writer")
    nobody = mtls_client(mtls_server, pki, "nobody")
    try:
        # The bootstrap admin administers a fresh server.
        create_table(admin, "orders")
        create_table(admin, "audit")
        # Nobody else holds anything yet.
        assert "bigtable.tables.readRows" in denied(lambda: keys(reader, "orders"))
        policy = set_policy(admin, INSTANCE_NAME, {
            "roles/bigtable.reader": ["user:reader@example.com"],
            "roles/bigtable.user": ["user:writer@example.com"],
        }, instance=True)
        got = admin.instance_admin().get_iam_policy(resource=INSTANCE_NAME, timeout=10)
        assert {b.role: list(b.members) for b in got.bindings} == {
            "roles/bigtable.reader": ["user:reader@example.com"],
            "roles/bigtable.user": ["user:writer@example.com"]}
        assert got.etag == policy.etag
        time.sleep(2.1)  # the servers' policy cache (docs/security.md)

        # A user reads and writes, cannot drop a table.
        write(writer, "orders", b"o1")
        assert keys(writer, "orders") == [b"o1"]
        msg = denied(lambda: writer.admin.delete_table(
            name=btlib.table_name("orders", INSTANCE, PROJECT), timeout=10))
        assert "bigtable.tables.delete" in msg and "user:writer@example.com" in msg, msg
        # A reader reads, cannot write (MutateRow or MutateRows), cannot set policies.
        assert keys(reader, "orders") == [b"o1"]
        msg = denied(lambda: write(reader, "orders", b"o2"))
        assert "bigtable.tables.mutateRows" in msg and "orders" in msg, msg
        with pytest.raises(gexc.PermissionDenied):
            btlib.mutate_rows(reader.data, btlib.table_name("orders", INSTANCE, PROJECT),
                              [(b"o3", [btlib.set_cell("cf", b"q", b"v", 1000)])], timeout=10)
        denied(lambda: set_policy(reader, INSTANCE_NAME, {}, instance=True))
        assert keys(admin, "orders") == [b"o1"], "nothing the reader sent was applied"

        # TestIamPermissions: the subset the caller holds.
        asked = ["bigtable.tables.readRows", "bigtable.tables.mutateRows",
                 "bigtable.tables.delete"]
        table = btlib.table_name("orders", INSTANCE, PROJECT)
        for client, want in ((reader, asked[:1]), (writer, asked[:2]), (admin, asked),
                             (nobody, [])):
            r = client.admin.test_iam_permissions(resource=table, permissions=asked, timeout=10)
            assert list(r.permissions) == want

        # A table's grant reaches that table only.
        set_policy(admin, table, {"roles/bigtable.reader": ["user:nobody@example.com"]})
        assert keys(nobody, "orders") == [b"o1"]
        denied(lambda: keys(nobody, "audit"))
        # A stale etag is refused (read, change, set again), the current one passes.
        with pytest.raises(gexc.Aborted):
            set_policy(admin, INSTANCE_NAME, {}, etag=b"\0\0\0\0\0\0\0\x09", instance=True)
        # An admin drops the table; its grants go with it.
        admin.admin.delete_table(name=table, timeout=10)
        create_table(admin, "orders")
        time.sleep(2.1)
        denied(lambda: keys(nobody, "orders"))
        # Unknown roles and malformed members are INVALID_ARGUMENT.
        with pytest.raises(gexc.InvalidArgument):
            set_policy(admin, INSTANCE_NAME, {"roles/owner": [ADMIN]}, instance=True)
        with pytest.raises(gexc.InvalidArgument):
            set_policy(admin, INSTANCE_NAME, {"roles/bigtable.user": ["alice"]}, instance=True)

        # Basalt's own protocol refuses clients, even an admin.
        status = admin.channel.unary_unary(
            "/basalt.control.v1.TabletServerControl/GetServerStatus",
            request_serializer=lambda _: b"", response_deserializer=lambda b: b)
        with pytest.raises(grpc.RpcError) as e:
            status(None, timeout=5)
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED, e.value
    finally:
        for c in (admin, reader, writer, nobody):
            c.close()

    # Without a certificate, with one from another CA, or in plaintext: no connection.
    ep = mtls_server.data_endpoint
    handshake_fails(ep, btlib.secure_channel(ep, read(pki / "ca.pem")))
    handshake_fails(ep, mtls_client(mtls_server, pki, "stranger").channel)
    handshake_fails(ep, grpc.insecure_channel(ep))
    mtls_server.assert_alive()
    # The audit log names who changed what.
    log = mtls_server.stderr_path.read_text()
    assert "basalt::audit" in log and "user:admin@example.com" in log and "SetIamPolicy" in log


def test_node_client_with_a_client_certificate(mtls_server, pki):
    node = shutil.which("node")
    assert node, "node is required for this test (install Node.js)"
    assert (NODE_DIR / "node_modules" / "@google-cloud" / "bigtable").is_dir(), (
        "run `npm ci --prefix e2e/node` first (e2e/run-tests does)")
    admin = mtls_client(mtls_server, pki, "admin")
    try:
        create_table(admin, "node_tls")
    finally:
        admin.close()
    host, port = mtls_server.data_endpoint.split(":")
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"),
           "BASALT_HOST": host, "BASALT_PORT": port, "BASALT_CA": str(pki / "ca.pem"),
           "BASALT_KEY": str(pki / "admin.key"), "BASALT_CERT": str(pki / "admin.pem")}
    proc = subprocess.run([node, "tls.js", "node_tls"], cwd=NODE_DIR, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "node tls client: ok" in proc.stdout, (
        proc.stdout + proc.stderr + mtls_server.logs())


# ----------------------------------------------------------------------- tokens


@pytest.fixture(scope="module")
def token_server(pki, tmp_path_factory):
    d = tmp_path_factory.mktemp("tokens")
    tokens = d / "tokens"
    tokens.write_text("# token member\nadm1n-t0ken user:admin@example.com\n"
                      "r3ader-t0ken user:reader@example.com\n")
    # The server's material lives in files of its own, so the rotation test can replace them.
    for f in ("server.pem", "server.key"):
        shutil.copy(pki / f, d / f)
    s = BasaltServer(d, extra_args=(
        "--tls-cert", str(d / "server.pem"), "--tls-key", str(d / "server.key"),
        "--auth-token-file", str(tokens), "--admin-principal", ADMIN)).start()
    s.tokens = tokens
    yield s
    s.stop()


def test_bearer_tokens_cbt_and_the_python_client(token_server, pki, tmp_path):
    ep = token_server.data_endpoint
    # No credentials, or a token the server does not know: UNAUTHENTICATED, token not echoed.
    anon = token_client(token_server, pki, None)
    guess = token_client(token_server, pki, "guessed-t0ken")
    try:
        with pytest.raises(gexc.Unauthenticated) as e:
            keys(anon, "x")
        assert "no credentials" in str(e.value)
        with pytest.raises(gexc.Unauthenticated) as e:
            keys(guess, "x")
        assert "guessed-t0ken" not in str(e.value)
    finally:
        anon.close()
        guess.close()
    handshake_fails(ep, grpc.insecure_channel(ep))

    # The token as cbt's -auth-token sends it (x-goog-iam-authorization-token).
    c = token_client(token_server, pki, None)
    try:
        c.data.ping_and_warm(name=INSTANCE_NAME, timeout=5,
                             metadata=[("x-goog-iam-authorization-token", "adm1n-t0ken")])
        with pytest.raises(gexc.Unauthenticated):
            c.data.ping_and_warm(name=INSTANCE_NAME, timeout=5,
                                 metadata=[("x-goog-iam-authorization-token", "nope")])
    finally:
        c.close()

    # cbt over TLS with the custom CA and an access token (authorization: Bearer). Its
    # -auth-token also wants Google's default credentials, which a Basalt user has not.
    cbt = shutil.which("cbt")
    assert cbt, "cbt is required (Debian package google-cloud-cli-cbt)"

    def run_cbt(token: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [cbt, "-project", PROJECT, "-instance", INSTANCE, "-data-endpoint", ep,
             "-admin-endpoint", ep, "-cert-file", str(pki / "ca.pem"), "-access-token", token,
             *args],
            env={"HOME": str(tmp_path), "PATH": "/nonexistent"}, capture_output=True,
            text=True, timeout=60)

    for args in (("createtable", "users"), ("createfamily", "users", "cf"),
                 ("set", "users", "alice", "cf:name=Alice")):
        cp = run_cbt("adm1n-t0ken", *args)
        assert cp.returncode == 0, cp.stderr
    cp = run_cbt("adm1n-t0ken", "read", "users")
    assert cp.returncode == 0 and "alice" in cp.stdout and "Alice" in cp.stdout, cp.stderr
    # The reader holds nothing until an admin grants it; then it reads and cannot write.
    admin = token_client(token_server, pki, "adm1n-t0ken")
    try:
        set_policy(admin, INSTANCE_NAME, {"roles/bigtable.reader": ["user:reader@example.com"]},
                   instance=True)
    finally:
        admin.close()
    time.sleep(2.1)
    cp = run_cbt("r3ader-t0ken", "read", "users")
    assert cp.returncode == 0 and "Alice" in cp.stdout, cp.stderr
    cp = run_cbt("r3ader-t0ken", "set", "users", "bob", "cf:name=Bob")
    assert cp.returncode != 0 and "PermissionDenied" in cp.stderr + cp.stdout, cp
    cp = run_cbt("r3ader-t0ken", "deletetable", "users")
    assert cp.returncode != 0 and "bigtable.tables.delete" in cp.stderr + cp.stdout, cp

    # The official Python client as an application uses it: api_endpoint, the CA through
    # gRPC's roots file, OAuth credentials carrying the token.
    script = tmp_path / "client.py"
    script.write_text(f"""
import google.oauth2.credentials
from google.api_core.client_options import ClientOptions
from google.cloud import bigtable
creds = google.oauth2.credentials.Credentials("adm1n-t0ken")
client = bigtable.Client(project="{PROJECT}", admin=True, credentials=creds,
                         client_options=ClientOptions(api_endpoint="{ep}"),
                         admin_client_options=ClientOptions(api_endpoint="{ep}"))
table = client.instance("{INSTANCE}").table("users")
row = table.direct_row(b"carol")
row.set_cell("cf", b"name", b"Carol")
row.commit()
print(sorted(r.row_key.decode() for r in table.read_rows()))
print([t.table_id for t in client.instance("{INSTANCE}").list_tables()])
""")
    env = {k: v for k, v in os.environ.items() if k != "BIGTABLE_EMULATOR_HOST"}
    env["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"] = str(pki / "ca.pem")
    cp = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                        timeout=120)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.splitlines() == ["['alice', 'carol']", "['users']"], cp.stdout

    # A token added to the file works within a quarter second; one removed stops working.
    text = token_server.tokens.read_text()
    token_server.tokens.write_text(text.replace("r3ader-t0ken", "n3w-t0ken"))
    time.sleep(0.3)  # the file is looked at every 250 ms at most (docs/security.md)
    fresh = token_client(token_server, pki, "n3w-t0ken")
    old = token_client(token_server, pki, "r3ader-t0ken")
    try:
        assert b"alice" in keys(fresh, "users")
        with pytest.raises(gexc.Unauthenticated):
            keys(old, "users")
    finally:
        fresh.close()
        old.close()


def served_certificate(endpoint: str, ca: Path) -> bytes:
    host, port = endpoint.split(":")
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.set_alpn_protocols(["h2"])
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        with ctx.wrap_socket(sock, server_hostname=host) as tls:
            return tls.getpeercert(binary_form=True)


def test_a_certificate_rotated_under_load_fails_no_request(token_server, pki):
    admin = token_client(token_server, pki, "adm1n-t0ken")
    try:
        create_table(admin, "rotation")
    finally:
        admin.close()
    d = token_server.base_dir
    before = served_certificate(token_server.data_endpoint, pki / "ca.pem")
    acked: list[bytes] = []
    errors: list[str] = []
    stop = threading.Event()

    def writer():
        n = 0
        while not stop.is_set():
            # A new connection (a new handshake) every few writes, as clients come and go.
            c = token_client(token_server, pki, "adm1n-t0ken")
            try:
                for _ in range(5):
                    key = b"r%06d" % n
                    try:
                        write(c, "rotation", key)
                        acked.append(key)
                    except gexc.GoogleAPICallError as e:
                        errors.append(f"{key!r}: {e}")
                    n += 1
            finally:
                c.close()

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    time.sleep(1.5)
    # The rotation as a Secret update does it: new files renamed into place.
    make_leaf(pki, "server2", "basalt-server", san="IP:127.0.0.1,DNS:localhost")
    for src, dst in (("server2.key", "server.key"), ("server2.pem", "server.pem")):
        shutil.copy(pki / src, d / f"{dst}.new")
        os.replace(d / f"{dst}.new", d / dst)
    deadline = time.monotonic() + 10
    while served_certificate(token_server.data_endpoint, pki / "ca.pem") == before:
        assert time.monotonic() < deadline, "the new certificate is not served"
        time.sleep(0.1)
    rotated_at = len(acked)
    time.sleep(1.5)
    stop.set()
    t.join(30)
    assert not errors, errors[:5]
    assert len(acked) > rotated_at > 0, (rotated_at, len(acked))
    reader = token_client(token_server, pki, "adm1n-t0ken")
    try:
        assert keys(reader, "rotation") == sorted(acked)
    finally:
        reader.close()
    token_server.assert_alive()
