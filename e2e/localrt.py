"""The local runtime (``basalt-operator local``) as a test fixture: one etcd, a Cluster's tablet
servers and the master as real processes on 127.0.0.1, driven through ``DIR/local.json``."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

from google.api_core import exceptions as gexc

import btlib
from btlib import GapicClients, http_get

REPO = Path(__file__).resolve().parent.parent


def _bin(name: str) -> Path:
    target = os.environ.get("CARGO_TARGET_DIR")
    return Path(target) / "release" / name if target else REPO / "target" / "release" / name


def operator_binary() -> Path:
    return Path(os.environ.get("BASALT_OPERATOR_BIN") or _bin("basalt-operator"))


def tablet_server_binary() -> Path:
    return Path(os.environ.get("BASALT_BIN") or _bin("basalt-tablet-server"))


def manifest(instance: str, project: str, cluster: str, nodes: int,
             reclaim: str | None = None) -> str:
    """An Instance and one Cluster of ``nodes`` servers (``reclaim``: its
    ``volumeReclaimPolicy``, unset by default)."""
    policy = f"  volumeReclaimPolicy: {reclaim}\n" if reclaim else ""
    return f"""apiVersion: basalt.dev/v1alpha1
kind: Instance
metadata:
  name: {instance}
spec:
  displayName: E2E cluster
  type: Development
  projectId: {project}
---
apiVersion: basalt.dev/v1alpha1
kind: Cluster
metadata:
  name: {cluster}
spec:
  instanceRef: {instance}
  serveNodes: {nodes}
  storageSize: 1Gi
{policy}"""


def app_profile(name: str, instance: str, routing: dict, priority: str = "High") -> str:
    """An AppProfile document (with its leading ``---``): ``routing`` as in its spec, e.g.
    ``{"singleClusterRouting": {"clusterId": "c1"}}`` (JSON is YAML)."""
    return f"""---
apiVersion: basalt.dev/v1alpha1
kind: AppProfile
metadata:
  name: {name}
spec:
  instanceRef: {instance}
  priority: {priority}
  routing: {json.dumps(routing)}
"""


# ------------------------------------------------------------------------ etcd, read directly

def etcd_range(url: str, key: str, prefix: bool = True) -> list[tuple[str, bytes]]:
    """The keys under ``key`` (or ``key`` alone) with their raw values, read from etcd
    itself through its JSON gateway (``/v3/kv/range``), not through Basalt."""
    k = key.encode()
    body = {"key": base64.b64encode(k).decode()}
    if prefix:
        body["range_end"] = base64.b64encode(k[:-1] + bytes([k[-1] + 1])).decode()
    req = urllib.request.Request(f"{url}/v3/kv/range", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        kvs = json.loads(resp.read()).get("kvs") or []
    return [(base64.b64decode(kv["key"]).decode(), base64.b64decode(kv.get("value", "")))
            for kv in kvs]


class EtcdCluster:
    """What etcd says of one cluster of a runtime: registrations, tablet map, moves, the
    recorded serveNodes."""

    def __init__(self, rt: "LocalRuntime", instance: str, cluster: str, namespace: str = "default"):
        self.rt, self.cluster = rt, cluster
        self.prefix = f"/basalt/v1/{namespace}/{instance}/clusters/{cluster}/"

    def _json(self, what: str) -> list[dict]:
        return [json.loads(v) for _, v in etcd_range(self.rt.state()["etcd"], self.prefix + what + "/")]

    def tablets(self) -> list[dict]:
        return self._json("tablets")

    def moves(self) -> list[dict]:
        return self._json("moves")

    def names(self) -> dict[str, str]:
        """Store id → name of the registered servers."""
        return {r["storeId"]: r["name"] for r in self._json("servers")}

    def owners(self) -> dict[str, int]:
        """Tablets per owner, by server name (``?<store id>`` for an unregistered owner)."""
        names = self.names()
        out: dict[str, int] = {}
        for t in self.tablets():
            name = names.get(t["owner"], "?" + t["owner"])
            out[name] = out.get(name, 0) + 1
        return out

    def serve_nodes(self) -> int | None:
        kvs = etcd_range(self.rt.state()["etcd"], self.prefix + "serve-nodes", prefix=False)
        return int(kvs[0][1]) if kvs else None


class LocalRuntime:
    """``basalt-operator local`` on ``base_dir`` with one manifest file."""

    def __init__(self, base_dir: Path, manifest_text: str, endpoint: str, env: dict | None = None):
        self.base_dir = Path(base_dir)
        self.data_dir = self.base_dir / "local"
        self.manifest = self.base_dir / "manifest.yaml"
        self.manifest.write_text(manifest_text)
        self.endpoint = endpoint
        self.proc: subprocess.Popen | None = None
        self.log = self.base_dir / "runtime.log"
        self.env = dict(env or {})

    def start(self, timeout: float = 120.0) -> "LocalRuntime":
        env = dict(os.environ, BASALT_TABLET_SERVER_BIN=str(tablet_server_binary()), **self.env)
        env.setdefault("RUST_LOG", "info")
        self.proc = subprocess.Popen(
            [str(operator_binary()), "local", "-f", str(self.manifest), "--data-dir",
             str(self.data_dir), "--endpoint", self.endpoint],
            stdout=open(self.log, "ab"), stderr=subprocess.STDOUT, env=env)
        self.wait_ready(timeout)
        return self

    def logs(self) -> str:
        parts = []
        for p in [self.log, *sorted((self.data_dir / "logs").glob("*.log"))]:
            try:
                data = p.read_bytes()[-6000:].decode(errors="replace")
            except OSError:
                continue
            parts.append(f"--- {p.name}\n{data}")
        return "\n".join(parts)

    def state(self) -> dict:
        return json.loads((self.data_dir / "local.json").read_text())

    def instance(self, name: str) -> dict:
        return self.state()["instances"][name]

    def cluster(self, instance: str, cluster: str) -> dict:
        """local.json's entry for one cluster (``serveNodes``, ``servers``, ``scaleIn``)."""
        return self.instance(instance)["clusters"][cluster]

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """``basalt-operator local ARGS --data-dir DIR`` (``apply``, ``status``)."""
        return subprocess.run(
            [str(operator_binary()), "local", *args, "--data-dir", str(self.data_dir)],
            capture_output=True, text=True, timeout=timeout)

    def apply(self, text: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """``local apply -f`` of ``text`` (written next to the runtime's manifest)."""
        path = self.base_dir / f"apply-{time.monotonic_ns()}.yaml"
        path.write_text(text)
        return self.cli("apply", "-f", str(path), timeout=timeout)

    def servers(self) -> list[dict]:
        out = []
        for inst in self.state()["instances"].values():
            for c in inst["clusters"].values():
                out.extend(c["servers"])
        return out

    def server_ready(self, s: dict) -> bool:
        try:
            status, _, _ = http_get(f"http://{s['http']}/readyz", timeout=1)
            return status == 200
        except OSError:
            return False

    def wait_ready(self, timeout: float = 120.0, pids_not=()):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"local runtime exited ({self.proc.returncode})\n{self.logs()}")
            try:
                servers = self.servers()
            except (OSError, ValueError, KeyError):
                servers = []
            if servers and all(s.get("pid") not in pids_not and self.server_ready(s) for s in servers):
                return
            time.sleep(0.2)
        raise AssertionError(f"local runtime not ready in {timeout}s\n{self.logs()}")

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def assert_alive(self):
        if not self.running():
            raise AssertionError(f"local runtime died\n{self.logs()}")

    def stop(self, timeout: float = 60.0) -> int:
        self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"local runtime did not stop in {timeout}s\n{self.logs()}")



def wait(what: str, fn, timeout: float, rt: "LocalRuntime", every: float = 0.2):
    """Polls ``fn`` (a runtime that died fails at once) until it returns something true, which
    is returned; an exception of a half-read state counts as not yet."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        rt.assert_alive()
        try:
            last = fn()
        except (OSError, ValueError, KeyError, StopIteration) as e:
            last = e
        if last and not isinstance(last, Exception):
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}\n{rt.logs()}")


class ClusterServerView:
    """What the e2e fixtures need of "the server" when the suite runs against a cluster: the
    client talks to one server (``index``) which owns only part of the tablets."""

    def __init__(self, runtime: LocalRuntime, index: int = 0):
        self.runtime = runtime
        self.index = index

    @property
    def _server(self) -> dict:
        return self.runtime.servers()[self.index]

    @property
    def data_endpoint(self) -> str:
        return self._server["grpc"]

    @property
    def http_url(self) -> str:
        return f"http://{self._server['http']}"

    def running(self) -> bool:
        return self.runtime.running()

    def assert_alive(self):
        self.runtime.assert_alive()

    def stop(self):
        assert self.runtime.stop() == 0, self.runtime.logs()

    def logs(self) -> str:
        return self.runtime.logs()

    def clients(self) -> GapicClients:
        return GapicClients(self.data_endpoint)


class ClientLoad:
    """Client threads working through an endpoint until stopped (a context manager): each
    thread, with its own clients, runs ``step(client, idx, n)`` for n = 0, 1, … until the load
    stops. ``acked`` are the rows whose MutateRow answered OK (``write_row``), ``errors`` what
    the clients saw fail, one line each (``"<what> <key>: <error>"``)."""

    def __init__(self, endpoint: str, table: str):
        self.endpoint, self.table = endpoint, table
        self.acked: list[bytes] = []
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []

    def spawn(self, step, count: int = 1):
        """``count`` more threads running ``step`` (idx 0 … count-1 among them)."""
        for idx in range(count):
            self.threads.append(threading.Thread(target=self._run, args=(step, idx)))

    def _run(self, step, idx: int):
        client = GapicClients(self.endpoint)
        try:
            n = 0
            while not self.stop.is_set():
                step(client, idx, n)
                n += 1
        finally:
            client.close()

    def write_row(self, client, idx: int, n: int, *, value=lambda key: key, timeout: float = 20,
                  width: int = 0) -> bytes | None:
        """MutateRow of a new row ``cf:q``; keys start with a…y in turn, so writes spread over
        every tablet. Returns the key when acknowledged."""
        key = f"{'acegikmoqsuwy'[n % 13]}-{idx}-{n:0{width}}".encode()
        try:
            btlib.mutate_row(client.data, self.table, key,
                             [btlib.set_cell("cf", b"q", value(key), 1000)], timeout=timeout)
        except gexc.GoogleAPICallError as e:
            self.errors.append(f"write {key!r}: {str(e)[:200]}")
            time.sleep(0.05)
            return None
        self.acked.append(key)
        return key

    def acked_since(self, mark: int) -> int:
        return len(self.acked) - mark

    def wait_for_more(self, rows: int, timeout: float = 30):
        """Waits until ``rows`` more writes were acknowledged."""
        mark = len(self.acked)
        deadline = time.monotonic() + timeout
        while len(self.acked) < mark + rows:
            assert time.monotonic() < deadline, (len(self.acked) - mark, self.errors[-5:])
            time.sleep(0.1)

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(60)
