"""The Key Visualizer on Kubernetes through ``kubectl port-forward`` (issue 29: "the page works
with kubectl port-forward"), opened as docs/key-visualizer.md and docs/helm.md say:
``kubectl -n <operator namespace> port-forward deploy/<fullname> 8081``, then
``http://localhost:8081/keyviz``.

A Kubernetes 1.20.2 cluster of the module's own (``cluster.KubeCluster``): the chart installed
with ``helm install``, its operator Deployment's pod run by the process kubelet as the
``basalt-operator`` binary on the pod's loopback IP (the chart's
``--key-visualizer-listen=127.0.0.1:8081`` rewritten to that IP, as the pod's own loopback), and
the real kubectl 1.20 forwarding through the real API server's ``pods/portforward`` to the
process kubelet's streaming server (SPDY/3.1, e2e/k8s/streaming.py).

* ``test_port_forward_streams``: the streaming server itself, under what a page's loads do and
  more: concurrent connections over one ``kubectl port-forward`` (one SPDY connection) and two
  port-forwards at once, 600 KiB each way per connection (more than SPDY's initial 64 KiB
  window, which spdystream never opens further), half-closes both ways, and a refused port
  reported on the error stream while the other forwarded port goes on working.
* ``test_streaming_server_refuses_what_it_cannot_upgrade``: the Node announces the server's
  port; a pod not on the node, no protocol in common, no upgrade headers are refused as the
  kubelet refuses them.
* ``test_key_visualizer_through_port_forward``: a small Instance (one etcd member, one tablet
  server) and a Table; through the forwarded port the page, the instances (listing it), its
  tables and, once a minute of writes is collected, the heatmap; then the page in headless
  Chromium (``e2e/node/keyviz-browser.js``, as ``test_keyviz_local.py`` drives it) renders the
  heatmap without console errors. Its wait for a minute to close and be collected is most of
  the module's time (about 1.5 minutes in all).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import socket
import socketserver
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "k8s"))

import btlib  # noqa: E402
import cluster  # noqa: E402
import harness  # noqa: E402
import localrt  # noqa: E402
from cluster import KubeCluster  # noqa: E402
from conftest import free_port, server_binary  # noqa: E402

OPERATOR_NS = harness.OPERATOR_NAMESPACE
DEPLOYMENT = f"deploy/{harness.RELEASE}"  # the chart's fullname
KEYVIZ_PORT = 8081  # the chart's keyVisualizer.listen port
NS = "default"
INSTANCE, CLUSTER, TABLE = "keyviz", "keyviz-c1", "events"
MANIFEST = localrt.manifest(INSTANCE, btlib.PROJECT, CLUSTER, 1) + f"""---
apiVersion: basalt.dev/v1alpha1
kind: Table
metadata:
  name: {TABLE}
spec:
  instanceRef: {INSTANCE}
  columnFamilies:
    cf:
      gcRule:
        maxNumVersions: 1
  initialSplits: ["m"]
"""
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
NODE_DIR = Path(__file__).parent / "node"
# A minute is collected 5 s after it closes (docs/key-visualizer.md): at most a minute and a bit.
COLLECTED_WITHIN = 100.0
WAIT = 120.0


@pytest.fixture(scope="module")
def kc(tmp_path_factory):
    """The cluster with the chart installed and its operator pod Ready."""
    cluster.need("the Key Visualizer through kubectl port-forward", server_binary())
    c = KubeCluster(tmp_path_factory.mktemp("k8s-keyviz"), server_binary(), wait=WAIT)
    try:
        c.start()
        c.run(f"helm install {harness.RELEASE} charts/basalt-operator --namespace {OPERATOR_NS} "
              "--create-namespace")
        c.wait("the chart's operator pod Ready",
               lambda: c.ready_pods(OPERATOR_NS, "app.kubernetes.io/name=basalt-operator"))
        yield c
    except BaseException:
        print(c.diagnostics(), file=sys.stderr)
        raise
    finally:
        c.stop()


@pytest.fixture
def k(kc, request):
    failed = request.session.testsfailed
    yield kc
    if request.session.testsfailed != failed:
        print(kc.diagnostics(), file=sys.stderr)


def operator_pod(c: KubeCluster) -> dict:
    return c.ready_pods(OPERATOR_NS, "app.kubernetes.io/name=basalt-operator")[0]


def get(port: int, path: str, **params) -> tuple[int, str, bytes]:
    """GET through the forwarded port: (status, content type, body)."""
    url = f"http://127.0.0.1:{port}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
    try:
        with urllib.request.urlopen(url, timeout=15) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read()


def get_json(port: int, path: str, **params):
    status, ctype, body = get(port, path, **params)
    if status != 200 or not ctype.startswith("application/json"):
        # Not an AssertionError: a wait retries it.
        raise RuntimeError(f"GET {path} {params}: {status} {ctype} {body[:500]!r}")
    return json.loads(body)


# --------------------------------------------------------------------- the streaming server


class _Reverser(socketserver.BaseRequestHandler):
    """Reads everything until the client's FIN, answers it reversed, closes."""

    def handle(self):
        data = bytearray()
        while chunk := self.request.recv(65536):
            data += chunk
        self.request.sendall(bytes(reversed(data)))


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def roundtrip(port: int, payload: bytes) -> bytes:
    """Sends ``payload``, half-closes, reads the answer until the other side closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        out = bytearray()
        while chunk := s.recv(65536):
            out += chunk
    return bytes(out)


def test_port_forward_streams(k):
    """Concurrent forwarded connections over one SPDY connection and over two, 600 KiB each
    way per connection, half-closes in both directions, and a refused port reported by
    kubectl from the error stream while the other port of the same port-forward works on."""
    pod = operator_pod(k)
    ip, name = pod["status"]["podIP"], pod["metadata"]["name"]
    # A process of "the pod" besides the operator: listening on the pod's IP (its network).
    server = _Server((ip, free_port(ip)), _Reverser)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    echo, refused = server.server_address[1], free_port(ip)
    local = [free_port() for _ in range(3)]
    first = k.port_forward(OPERATOR_NS, DEPLOYMENT, f"{local[0]}:{echo}", f"{local[1]}:{refused}")
    second = k.port_forward(OPERATOR_NS, DEPLOYMENT, f"{local[2]}:{echo}")
    try:
        k.wait("two SPDY sessions", lambda: len(k.kubelet.streaming.sessions) == 2, timeout=10)
        rng = random.Random(29)
        payloads = [rng.randbytes(600 * 1024) for _ in range(6)]
        ports = [local[0]] * 4 + [local[2]] * 2
        with ThreadPoolExecutor(len(payloads)) as pool:
            answers = list(pool.map(roundtrip, ports, payloads))
        for sent, got in zip(payloads, answers):
            assert len(got) == len(sent) and hashlib.sha256(got).digest() == \
                hashlib.sha256(sent[::-1]).digest(), (len(sent), len(got))

        # Nothing listens on `refused`: kubectl closes the local connection and prints the
        # kubelet's error from the error stream.
        with socket.create_connection(("127.0.0.1", local[1]), timeout=30) as s:
            assert s.recv(1) == b""
        expected = (f"an error occurred forwarding {local[1]} -> {refused}: error forwarding port "
                    f"{refused} to pod {OPERATOR_NS}/{name}, uid {pod['metadata']['uid']}: "
                    f"dial tcp {ip}:{refused}: connect: connection refused")
        deadline = time.monotonic() + 10
        while not any(expected in line for line in first.stderr) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert any(expected in line for line in first.stderr), first.output()
        # The same port-forward (the same SPDY connection) goes on.
        assert roundtrip(local[0], b"still there") == b"ereht llits"
    finally:
        codes = (first.stop(), second.stop())
        server.shutdown()
        server.server_close()
    assert codes == (0, 0), (first.output(), second.output())
    k.wait("the kubelet's SPDY sessions closed", lambda: not k.kubelet.streaming.sessions, timeout=15)


def test_streaming_server_refuses_what_it_cannot_upgrade(k):
    """The Node announces the streaming server's port; straight to it (as the API server
    would send them), a pod not on the node is 404, no protocol in common 403 (naming the
    accepted one), a request without the SPDY upgrade headers 400."""
    port = k.kubelet.streaming.port
    node = k.api.get("/api/v1/nodes/basalt-test-node")
    assert node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"] == port, node["status"]
    pod = operator_pod(k)["metadata"]["name"]
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # self-signed, as the API server sees it

    def post(path: str, **headers) -> tuple[int, dict, str]:
        req = urllib.request.Request(f"https://127.0.0.1:{port}{path}", data=b"", method="POST",
                                     headers=headers)
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
                return r.status, dict(r.headers), r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read().decode()

    upgrade = {"Connection": "Upgrade", "Upgrade": "SPDY/3.1"}
    status, _, body = post(f"/portForward/{OPERATOR_NS}/nope", **upgrade,
                           **{"X-Stream-Protocol-Version": "portforward.k8s.io"})
    assert status == 404 and "not found" in body, (status, body)
    status, headers, body = post(f"/portForward/{OPERATOR_NS}/{pod}", **upgrade,
                                 **{"X-Stream-Protocol-Version": "v4.channel.k8s.io"})
    assert status == 403 and "unable to negotiate protocol" in body, (status, body)
    assert headers["X-Accepted-Stream-Protocol-Versions"] == "portforward.k8s.io", headers
    status, _, body = post(f"/portForward/{OPERATOR_NS}/{pod}",
                           **{"X-Stream-Protocol-Version": "portforward.k8s.io"})
    assert status == 400 and "missing upgrade headers" in body, (status, body)


# ----------------------------------------------------------------------- the Key Visualizer


def write_rows(monkeypatch, ip: str, project: str, n: int) -> None:
    from google.cloud import bigtable

    monkeypatch.setenv("BIGTABLE_EMULATOR_HOST", f"{ip}:8086")
    client = bigtable.Client(project=project, admin=True)
    try:
        table = client.instance(INSTANCE).table(TABLE)
        rows = []
        for i in range(n):
            row = table.direct_row(f"{'a' if i % 4 else 'x'}-{i:05d}".encode())
            row.set_cell("cf", b"q", b"v" * 100)
            rows.append(row)
        statuses = table.mutate_rows(rows)
        assert all(s.code == 0 for s in statuses), [s for s in statuses if s.code][:3]
    finally:
        client.close()


@pytest.mark.timeout(600)
def test_key_visualizer_through_port_forward(k, monkeypatch, tmp_path):
    k.kubectl("apply", "-n", NS, "-f", "-", input=MANIFEST)
    local = free_port()
    pf = k.port_forward(OPERATOR_NS, DEPLOYMENT, f"{local}:{KEYVIZ_PORT}")
    try:
        # The page: one self-contained HTML file.
        status, ctype, body = get(local, "/keyviz")
        assert status == 200 and ctype.startswith("text/html"), (status, ctype, body[:300])
        page = body.decode()
        assert 'id="heatmap"' in page and "/api/keyviz/heatmap" in page, page[:500]

        inst = k.wait(f"Instance {INSTANCE} Ready", lambda: k.ready("instances", INSTANCE, NS))
        k.wait(f"Table {TABLE} Ready", lambda: k.ready("tables", TABLE, NS))
        # The instance's master runs in the operator: the Key Visualizer lists the instance.
        listed = k.wait("the instance in /api/keyviz/instances", lambda: (
            lambda got: got if {"namespace": NS, "name": INSTANCE} in got["instances"] else None)(
            get_json(local, "/api/keyviz/instances")))
        assert listed == {"instances": [{"namespace": NS, "name": INSTANCE}]}, listed
        tables = get_json(local, "/api/keyviz/tables", instance=f"{NS}/{INSTANCE}")
        assert TABLE in tables["tables"], tables

        # A minute of writes, collected from the tablet server a few seconds after it closes.
        server = k.wait("the tablet server's pod",
                        lambda: k.ready_pods(NS, f"basalt.dev/cluster={CLUSTER}"))[0]
        project = inst["status"]["resourceName"].split("/")[1]
        written = time.time()
        write_rows(monkeypatch, server["status"]["podIP"], project, 400)

        def heatmap():
            hm = get_json(local, "/api/keyviz/heatmap", instance=f"{NS}/{INSTANCE}", table=TABLE,
                          metric="writes")
            return hm if hm["times"] and sum(map(sum, hm["values"])) >= 399.5 else None

        hm = k.wait("a minute of writes in the heatmap", heatmap, timeout=COLLECTED_WITHIN)
        assert abs(sum(map(sum, hm["values"])) - 400) < 0.5, hm["values"]
        print(f"collected {time.time() - written:.0f}s after the writes")

        # The page in headless Chromium, through the forwarded port.
        if not Path(CHROMIUM).exists():
            pytest.fail(f"no Chromium at {CHROMIUM}: install Debian's chromium")
        shot = tmp_path / "keyviz-port-forward.png"
        query = urllib.parse.urlencode({"instance": f"{NS}/{INSTANCE}", "table": TABLE,
                                        "metric": "writes", "window": "30m"})
        out = subprocess.run(["node", str(NODE_DIR / "keyviz-browser.js"),
                              f"http://localhost:{local}/keyviz?{query}", str(shot)],
                             capture_output=True, text=True, timeout=120, cwd=NODE_DIR,
                             env={**os.environ, "CHROMIUM": CHROMIUM})
        assert out.returncode == 0, (out.stdout, out.stderr, pf.output())
        seen = json.loads(out.stdout.strip().splitlines()[-1])
        assert seen["consoleErrors"] == [], seen["consoleErrors"]
        assert seen["canvas"]["width"] > 100 and seen["canvas"]["height"] > 100, seen["canvas"]
        assert seen["canvas"]["litPixels"] > 0, seen["canvas"]
        assert seen["times"] >= 1 and seen["buckets"] >= 1, seen
        assert "range" in seen["tooltip"]["text"] and "writes" in seen["tooltip"]["text"], seen["tooltip"]
        assert shot.stat().st_size > 10_000
    finally:
        code = pf.stop()
    assert code == 0, pf.output()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", local), timeout=5).close()
