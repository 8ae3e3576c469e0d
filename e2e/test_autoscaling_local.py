"""Autoscaling on the local runtime, with a real Prometheus scraping the tablet servers
(``prometheus-targets.json``) and ``basalt-bench`` as the load: a Cluster with
``autoscaling: {minServeNodes: 1, maxServeNodes: 4, cpuUtilizationPercent: 50}`` grows under
sustained load (the new servers receive tablets), stops at the maximum and says so, and once
the load stops shrinks in bounded steps back to the minimum — while client threads write
throughout, and every write they got acknowledged is read back exactly once at the end. With
Prometheus stopped, the same decision is made from the servers' own reports, and the
autoscaler says that it is.

The autoscaler's windows are shortened through its documented settings (docs/autoscaling.md):
samples every 2 s (no faster than the master reads the servers' reports, every 5 s), up after
6 s of sustained load, down after 12 s of samples that all want fewer and 8 s after the last
change. The servers' CPU allocation is the Cluster's ``resources.requests.cpu`` (100m), so the
benchmark's load is far above the target."""

from __future__ import annotations

import subprocess
import threading
import time

import pytest
from google.api_core import exceptions as gexc

import btlib
import localrt
from btlib import GapicClients
from conftest import free_port
from test_monitoring import Prometheus

PROJECT = "as-p"
INSTANCE = "e2e-autoscale"
CLUSTER = f"{INSTANCE}-c1"
TABLE = "writes"
SPLITS = [b"c", b"f", b"i", b"l", b"o", b"r", b"u", b"x"]  # 9 tablets
TIMINGS = {
    "BASALT_AUTOSCALE_SAMPLE_SECS": "2",
    "BASALT_AUTOSCALE_UP_WINDOW_SECS": "6",
    "BASALT_AUTOSCALE_DOWN_WINDOW_SECS": "12",
    "BASALT_AUTOSCALE_DOWN_COOLDOWN_SECS": "8",
}

MANIFEST = f"""apiVersion: basalt.dev/v1alpha1
kind: Instance
metadata:
  name: {INSTANCE}
spec:
  displayName: Autoscaling E2E
  type: Development
  projectId: {PROJECT}
---
apiVersion: basalt.dev/v1alpha1
kind: Cluster
metadata:
  name: {CLUSTER}
spec:
  instanceRef: {INSTANCE}
  storageSize: 1Gi
  resources:
    requests: {{cpu: 100m}}
  autoscaling: {{minServeNodes: 1, maxServeNodes: 4, cpuUtilizationPercent: 50}}
"""


class Writers:
    """Client threads writing rows of their own through the instance's endpoint, each with an
    explicit timestamp (safe to retry), until stopped; every acknowledged row is remembered."""

    def __init__(self, endpoint: str, n: int = 2):
        self.table = btlib.table_name(TABLE, INSTANCE, PROJECT)
        self.acked: dict[bytes, bytes] = {}
        self.errors: list[str] = []
        self.stopped = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(endpoint, i), daemon=True)
                        for i in range(n)]

    def _run(self, endpoint: str, idx: int):
        client = GapicClients(endpoint)
        try:
            n = 0
            while not self.stopped.is_set():
                key = f"{'adgjmpsvy'[n % 9]}-{idx}-{n:06}".encode()
                value = b"v-%d-%d" % (idx, n)
                cell = btlib.set_cell("cf", b"q", value, (1_000_000 + n) * 1000)
                try:
                    btlib.mutate_row(client.data, self.table, key, [cell], timeout=30)
                    with self.lock:
                        self.acked[key] = value
                except gexc.GoogleAPICallError as e:
                    self.errors.append(f"{key!r}: {str(e)[:300]}")
                n += 1
                # 10 rows a second per thread: enough to see every scale step under writes,
                # little enough that the idle cluster's CPU stays well under half the target
                # (a 2-node cluster shrinks only below 25 % of its 100m each).
                time.sleep(0.1)
        finally:
            client.close()

    def start(self) -> "Writers":
        for t in self.threads:
            t.start()
        return self

    def stop(self):
        self.stopped.set()
        for t in self.threads:
            t.join(60)


class Bench:
    """``basalt-bench`` running YCSB A against the instance's endpoint in the background."""

    def __init__(self, rt: localrt.LocalRuntime, seconds: int):
        table = btlib.table_name("usertable", INSTANCE, PROJECT)
        self.log = rt.base_dir / f"bench-{time.monotonic_ns()}.log"
        self.proc = subprocess.Popen(
            [str(localrt._bin("basalt-bench")), "--endpoint", rt.endpoint, "--table", table,
             "--workload", "ycsb-a", "--load", "--records", "5000", "--concurrency", "8",
             "--duration", str(seconds)],
            stdout=open(self.log, "ab"), stderr=subprocess.STDOUT)

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(30)
        return self.log.read_text(errors="replace")[-2000:]


def decision(rt: localrt.LocalRuntime) -> dict:
    return rt.cluster(INSTANCE, CLUSTER).get("autoscaler") or {}


class Recorder:
    """Polls local.json: every change of the autoscaler's decision, with when it was seen."""

    def __init__(self, rt: localrt.LocalRuntime):
        self.rt = rt
        self.changes: list[tuple[float, int, str | None]] = []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.stopped.is_set():
            try:
                d = decision(self.rt)
            except (OSError, ValueError, KeyError):
                d = {}
            if d and (not self.changes or self.changes[-1][1] != d["nodes"]):
                self.changes.append((time.monotonic(), d["nodes"], d.get("heldReason")))
            time.sleep(0.25)

    def start(self) -> "Recorder":
        self.thread.start()
        return self

    def nodes(self) -> list[int]:
        return [n for _, n, _ in self.changes]


def create_table(rt: localrt.LocalRuntime):
    client = GapicClients(rt.cluster(INSTANCE, CLUSTER)["servers"][0]["grpc"])
    try:
        client.admin.create_table(
            request=btlib.admin_types.CreateTableRequest(
                parent=btlib.instance_name(INSTANCE, PROJECT), table_id=TABLE,
                table=btlib.Table(column_families={"cf": btlib.column_family(btlib.gc_versions(1))}),
                initial_splits=[btlib.admin_types.CreateTableRequest.Split(key=k) for k in SPLITS]),
            timeout=60)
    finally:
        client.close()


def endpoint_serves(rt: localrt.LocalRuntime) -> bool:
    client = GapicClients(rt.endpoint)
    try:
        btlib.read_rows(client.data, btlib.table_name(TABLE, INSTANCE, PROJECT), keys=[b"a"],
                        timeout=5)
        return True
    except gexc.GoogleAPICallError:
        return False
    finally:
        client.close()


@pytest.mark.timeout(420)
def test_a_cluster_grows_under_load_stops_at_max_and_shrinks_in_steps(tmp_path):
    prom = Prometheus(tmp_path, tmp_path / "local" / "prometheus-targets.json").start()
    rt = localrt.LocalRuntime(tmp_path, MANIFEST, f"127.0.0.1:{free_port()}",
                              env={**TIMINGS, "BASALT_PROMETHEUS_URL": prom.url})
    rt.start()
    writers = bench = None
    try:
        create_table(rt)
        localrt.wait("the endpoint serving", lambda: endpoint_serves(rt), 30, rt)
        localrt.wait("the decision, sampled from Prometheus, at one node",
                     lambda: decision(rt).get("source") == "prometheus"
                     and decision(rt).get("cpuUtilization") is not None
                     and decision(rt)["nodes"] == 1, 60, rt)
        recorder = Recorder(rt).start()
        writers = Writers(rt.endpoint).start()

        # Sustained load: a scale-up within about a minute, up to the maximum, and held there.
        loaded = time.monotonic()
        bench = Bench(rt, 300)
        localrt.wait("a scale-up", lambda: decision(rt)["nodes"] > 1, 60, rt)
        first_up = time.monotonic() - loaded
        localrt.wait("maxServeNodes (4) reached and held back there",
                     lambda: decision(rt)["nodes"] == 4
                     and decision(rt).get("heldReason") == "MaxServeNodesReached", 120, rt)
        d = decision(rt)
        assert d["source"] == "prometheus" and "sourceMessage" not in d, d
        assert d["wantedNodes"] > 4 and d["recommendedNodes"] == 4, d
        assert "maxServeNodes is 4" in d["heldMessage"], d
        status = rt.cli("status")
        assert "MaxServeNodesReached" in status.stdout, status.stdout
        # The new servers run and receive tablets.
        cl = localrt.EtcdCluster(rt, INSTANCE, CLUSTER)
        localrt.wait("four servers, each owning tablets",
                     lambda: len(rt.cluster(INSTANCE, CLUSTER)["servers"]) == 4
                     and len(cl.owners()) == 4 and all(n > 0 for n in cl.owners().values()),
                     60, rt)
        print(f"scale-up decided {first_up:.1f} s after the load began; steps {recorder.nodes()}")

        # The load stops: down in steps of at most 30 % of the nodes (at least one), to min.
        bench.stop()
        bench = None
        localrt.wait("back to minServeNodes (1)",
                     lambda: decision(rt)["nodes"] == 1
                     and len(rt.cluster(INSTANCE, CLUSTER)["servers"]) == 1, 180, rt)
        nodes = recorder.nodes()
        top = nodes.index(4)
        assert nodes[:top + 1] == sorted(nodes[:top + 1]), f"only up under load: {nodes}"
        down = nodes[top:]
        assert down == [4, 3, 2, 1], f"one node per step from 4 (30 % of 4 is 1): {nodes}"
        times = [t for t, n, _ in recorder.changes[top:]]
        gaps = [b - a for a, b in zip(times, times[1:])]
        assert all(g >= 8 - 1 for g in gaps), f"a cool-down between scale-downs: {gaps}"

        # Prometheus stopped: the servers' reports take over, and the same decision follows.
        prom.stop()
        bench = Bench(rt, 120)
        localrt.wait("the fallback says so",
                     lambda: decision(rt).get("source") == "servers"
                     and "Prometheus" in decision(rt).get("sourceMessage", ""), 60, rt)
        localrt.wait("a scale-up from the servers' reports", lambda: decision(rt)["nodes"] > 1,
                     60, rt)
        assert "samples from servers" in rt.cli("status").stdout
        bench.stop()
        bench = None

        writers.stop()
        # What a client may see while tablets move and servers stop: retryable errors (the
        # official clients retry them), never anything else.
        odd = [e for e in writers.errors if "503" not in e and "504" not in e]
        assert not odd, odd[:5]
        assert len(writers.errors) < len(writers.acked) / 20, writers.errors[:5]
        assert len(writers.acked) > 100, len(writers.acked)
        client = GapicClients(rt.endpoint)
        try:
            rows = btlib.read_rows(client.data, writers.table, timeout=60)
        finally:
            client.close()
        got: dict[bytes, list[bytes]] = {}
        for row in rows:
            assert row.key not in got, f"row {row.key!r} read twice"
            got[row.key] = [c.value for c in row.cells]
        missing = [k for k in writers.acked if k not in got]
        assert not missing, f"{len(missing)} acknowledged rows missing, e.g. {missing[:5]}"
        wrong = [k for k, v in writers.acked.items() if got[k] != [v]]
        assert not wrong, f"rows not exactly as written: {[(k, got[k]) for k in wrong[:5]]}"
        recorder.stopped.set()
        assert rt.stop() == 0, rt.logs()
    finally:
        if bench is not None:
            bench.stop()
        if writers is not None:
            writers.stop()
        if rt.running():
            rt.stop()
        prom.stop()
