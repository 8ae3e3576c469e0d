"""Autoscaling measured (docs/benchmarks.md), not a test. On the local runtime, a Cluster with
``autoscaling: {minServeNodes: 1, maxServeNodes: 3, cpuUtilizationPercent: 50}`` and a CPU
request of 100m (the servers' allocation, so that one client on this machine is far above the
target), a table of 16 tablets (``usertable``, split on the first hex digit of basalt-bench's
hashed keys) loaded with ``--records`` rows of 1 KiB, basalt-bench YCSB A as the load:

1. **Load step → more capacity serving.** The cluster idle at one node (the autoscaler's
   newest samples recommend 1), then a steady load (``--concurrency`` in flight through the
   instance's endpoint) as a loop of 5 s basalt-bench runs: a new process, new connections
   (spread over the servers the endpoint knows then, as a reconnecting client's would) and
   one JSON line per run, so each 5 s window has its own ops/s and p99. Times from the step:
   ``decision`` (the autoscaler's record says nodes > 1; its ``lastChangeUnixMs``, and when
   ``local.json``, polled every 0.5 s, showed it), ``servers_started`` (the new servers in
   ``local.json`` with a pid), ``servers_ready`` (their ``/readyz`` answers 200),
   ``first_tablet`` / ``tablets`` (the first / every new server owns a tablet, as
   ``local.json`` says from etcd, refreshed every second) and ``even`` (every server within
   one tablet of the others).
2. **Oscillating load.** From one idle node again: the same load on for ``--short-on`` s, off
   for ``--short-off`` s (each quiet spell shorter than the down window), for
   ``--short-seconds``; every change of the autoscaler's ``nodes`` with its time, and the
   changes of direction. The decision's rule: up once, no flapping. Then, for contrast, on a
   fresh runtime, ``--long-on`` / ``--long-off`` (quiet spells longer than the down window).

The autoscaler's timings are shortened through its settings (Bigtable's defaults: a sample
every 15 s, up after 60 s of sustained load, down after 30 min of samples that all want fewer
and not within 10 min of the last change): samples every 2 s (in effect every 5 s: never
faster than the master reads the servers' reports), up window 10 s, down window 30 s,
cool-down 20 s. Time to capacity ≈ up window + one sample + server start + first tablet moves.

Samples come from the servers' own reports (CPU used between two reports 5 s apart) unless
``--prometheus``: a real Prometheus (scraping every second) whose CPU query is a
``rate(...[1m])``, which stays high for up to a minute after the load stops.

    e2e/.venv/bin/python e2e/bench_autoscale.py
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import btlib  # noqa: E402
import localrt  # noqa: E402
from btlib import GapicClients  # noqa: E402
from conftest import free_port  # noqa: E402
from google.api_core import exceptions as gexc  # noqa: E402

PROJECT, INSTANCE, CLUSTER = "bench", "benchy", "benchy-c1"
TABLE = btlib.table_name("usertable", INSTANCE, PROJECT)
# basalt-bench's hashed keys are user<16 hex digits>: 16 tablets of equal size.
SPLITS = [f"user{d:x}".encode() for d in range(1, 16)]
# The master reads the servers' reports every 5 s; the autoscaler samples no faster.
REPORT_INTERVAL_S = 5.0
DEFAULTS = {"sample_s": 15, "up_window_s": 60, "down_window_s": 1800, "down_cooldown_s": 600}


def manifest(args) -> str:
    return f"""apiVersion: basalt.dev/v1alpha1
kind: Instance
metadata:
  name: {INSTANCE}
spec:
  displayName: Autoscaling bench
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
    requests: {{cpu: {args.cpu_request}}}
  autoscaling: {{minServeNodes: 1, maxServeNodes: {args.max_nodes}, cpuUtilizationPercent: {args.cpu_target}}}
"""


def timings(args) -> dict:
    return {
        "BASALT_AUTOSCALE_SAMPLE_SECS": str(args.sample),
        "BASALT_AUTOSCALE_UP_WINDOW_SECS": str(args.up_window),
        "BASALT_AUTOSCALE_DOWN_WINDOW_SECS": str(args.down_window),
        "BASALT_AUTOSCALE_DOWN_COOLDOWN_SECS": str(args.down_cooldown),
    }


def show(what: str, value):
    print(what, json.dumps(value), flush=True)
    return value


# ----------------------------------------------------------------------------- basalt-bench

class Procs:
    """Every basalt-bench process started, so that none outlives the script."""

    def __init__(self):
        self.running: set[subprocess.Popen] = set()
        self.lock = threading.Lock()

    def run(self, endpoint: str, *args: str, timeout: float) -> dict:
        p = subprocess.Popen(
            [str(localrt._bin("basalt-bench")), "--endpoint", endpoint, "--table", TABLE,
             "--progress", "0", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        with self.lock:
            self.running.add(p)
        try:
            out, err = p.communicate(timeout=timeout)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            with self.lock:
                self.running.discard(p)
        phases = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        if not phases:
            raise RuntimeError(f"basalt-bench failed ({p.returncode}):\n{out[-2000:]}\n{err[-3000:]}")
        return phases[-1]

    def kill_all(self):
        with self.lock:
            procs = list(self.running)
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


class Cpu:
    """The machine's busy share (``/proc/stat``) and the CPU the tablet servers used
    (``/proc/<pid>/stat``) between two readings."""

    TICK = os.sysconf("SC_CLK_TCK")

    def __init__(self, pids):
        self.at = time.monotonic()
        self.busy, self.total = self._machine()
        self.procs = {pid: self._proc(pid) for pid in pids}

    @staticmethod
    def _machine() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return sum(fields) - idle, sum(fields)

    @classmethod
    def _proc(cls, pid: int) -> float:
        try:
            rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(rest[11]) + int(rest[12])) / cls.TICK  # utime + stime

    def since(self, before: "Cpu") -> dict:
        seconds = max(self.at - before.at, 1e-6)
        used = sum(max(0.0, t - before.procs.get(pid, 0.0)) for pid, t in self.procs.items())
        return {"machine_busy_pct": round(100 * (self.busy - before.busy) / max(1, self.total - before.total)),
                "servers_cores": round(used / seconds, 2)}


def workload(args, seconds: float) -> list[str]:
    return ["--workload", "ycsb-a", "--records", str(args.records), "--concurrency",
            str(args.concurrency), "--connections", str(args.max_nodes),
            "--duration", f"{seconds:g}"]


# ------------------------------------------------------------------- what the runtime shows

class Poller(threading.Thread):
    """Polls ``local.json`` every 0.5 s: the autoscaler's record and the servers (pid, tablets),
    and each server's ``/readyz`` until it first answers 200. Times are seconds from ``t0``
    (``mark()``), on the monotonic clock; ``t0_wall`` converts the record's wall-clock times."""

    def __init__(self, rt: localrt.LocalRuntime, every: float = 0.5):
        super().__init__(daemon=True)
        self.rt, self.every = rt, every
        self.stopped = threading.Event()
        self.lock = threading.Lock()
        self.t0 = time.monotonic()
        self.t0_wall = time.time()
        self.last: dict = {}
        self.changes: list[dict] = []     # every change of the record's nodes
        self.started: dict[str, float] = {}  # server name -> first seen with a pid
        self.ready: dict[str, float] = {}    # server name -> first /readyz 200
        self.snaps: list[dict] = []

    def mark(self):
        with self.lock:
            self.t0, self.t0_wall = time.monotonic(), time.time()
            self.changes, self.snaps = [], []
            self.started = {k: 0.0 for k in self.started}
            self.ready = {k: 0.0 for k in self.ready}

    def now(self) -> float:
        return time.monotonic() - self.t0

    def run(self):
        while not self.stopped.is_set():
            try:
                self._poll()
            except (OSError, ValueError, KeyError):
                pass  # a half-written local.json, or the runtime stopping
            self.stopped.wait(self.every)

    def _poll(self):
        c = self.rt.cluster(INSTANCE, CLUSTER)
        a = c.get("autoscaler") or {}
        t = self.now()
        servers = [{"name": s["name"], "pid": s.get("pid"), "tablets": s.get("tablets", 0),
                    "http": s["http"]} for s in c["servers"]]
        for s in servers:
            if s["pid"] and s["name"] not in self.started:
                self.started[s["name"]] = t
            if s["pid"] and s["name"] not in self.ready and self.rt.server_ready(s):
                self.ready[s["name"]] = self.now()
        snap = {"t": round(t, 2), "nodes": a.get("nodes"), "recommended": a.get("recommendedNodes"),
                "wanted": a.get("wantedNodes"), "cpu": a.get("cpuUtilization"),
                "held": a.get("heldReason"), "source": a.get("source"),
                "last_change_ms": a.get("lastChangeUnixMs"),
                "servers": {s["name"]: s["tablets"] for s in servers if s["pid"]},
                "pids": [s["pid"] for s in servers if s["pid"]]}
        with self.lock:
            prev = self.last.get("nodes")
            if a and prev is not None and a.get("nodes") != prev:
                ms = a.get("lastChangeUnixMs")
                self.changes.append({
                    "from": prev, "to": a["nodes"], "seen_s": round(t, 2),
                    "decided_s": round(ms / 1000 - self.t0_wall, 2) if ms else None,
                    "cpu": a.get("cpuUtilization"), "wanted": a.get("wantedNodes"),
                    "held": a.get("heldReason")})
            self.last = snap
            self.snaps.append(snap)

    def snapshot(self) -> dict:
        with self.lock:
            return dict(self.last)

    def first(self, pred) -> float | None:
        with self.lock:
            return next((s["t"] for s in self.snaps if pred(s)), None)

    def stop(self):
        self.stopped.set()
        self.join(5)


def wait_until(what: str, fn, timeout: float, rt: localrt.LocalRuntime, every: float = 0.5):
    return localrt.wait(what, fn, timeout, rt, every=every)


def wait_idle(poller: Poller, rt: localrt.LocalRuntime, args) -> dict:
    """Until the autoscaler runs one node and its samples have recommended one for a whole up
    window (no sample of the data load left to count toward a scale-up)."""
    deadline = time.monotonic() + 180
    quiet_since = None
    while time.monotonic() < deadline:
        rt.assert_alive()
        s = poller.snapshot()
        low = (s.get("nodes") == 1 and s.get("cpu") is not None and s.get("recommended") == 1
               and len(s.get("servers", {})) == 1)
        if not low:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= args.up_window + effective_sample(args):
            return s
        time.sleep(0.5)
    raise AssertionError(f"the cluster did not settle idle at one node: {poller.snapshot()}\n"
                         f"{rt.logs()}")


def effective_sample(args) -> float:
    return max(float(args.sample), REPORT_INTERVAL_S)


# ------------------------------------------------------------------------------ one runtime

class Setup:
    """A fresh runtime (and Prometheus with ``--prometheus``) with the table created, spread and
    loaded, and the poller running; a context manager that stops everything."""

    def __init__(self, base: Path, name: str, args, procs: Procs):
        self.dir = base / name
        self.dir.mkdir(parents=True)
        self.args, self.procs = args, procs
        self.prom = self.rt = self.poller = None

    def __enter__(self) -> "Setup":
        env = dict(timings(self.args), RUST_LOG="info")
        try:
            if self.args.prometheus:
                from test_monitoring import Prometheus
                self.prom = Prometheus(self.dir, self.dir / "local" / "prometheus-targets.json").start()
                env["BASALT_PROMETHEUS_URL"] = self.prom.url
            self.rt = localrt.LocalRuntime(self.dir, manifest(self.args),
                                           f"127.0.0.1:{free_port()}", env=env)
            t = time.monotonic()
            self.rt.start()
            self.started_s = round(time.monotonic() - t, 2)
            self.create_table()
            wait_until("the endpoint serving the table", self.endpoint_serves, 60, self.rt)
            self.procs.run(self.rt.endpoint, "--workload", "load", "--records",
                           str(self.args.records), "--concurrency", "16", timeout=600)
            self.poller = Poller(self.rt)
            self.poller.start()
            t = time.monotonic()
            self.idle = wait_idle(self.poller, self.rt, self.args)
            self.idle_wait_s = round(time.monotonic() - t, 1)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def create_table(self):
        client = GapicClients(self.rt.servers()[0]["grpc"])
        try:
            client.admin.create_table(
                request=btlib.admin_types.CreateTableRequest(
                    parent=btlib.instance_name(INSTANCE, PROJECT), table_id="usertable",
                    table=btlib.Table(column_families={"cf": btlib.column_family(btlib.gc_versions(1))}),
                    initial_splits=[btlib.admin_types.CreateTableRequest.Split(key=k) for k in SPLITS]),
                timeout=60)
        finally:
            client.close()

    def endpoint_serves(self) -> bool:
        client = GapicClients(self.rt.endpoint)
        try:
            for k in (b"user0", b"userf"):
                btlib.read_rows(client.data, TABLE, keys=[k], timeout=5)
            return True
        except gexc.GoogleAPICallError:
            return False
        finally:
            client.close()

    def __exit__(self, *exc):
        self.procs.kill_all()
        if self.poller is not None:
            self.poller.stop()
        try:
            if self.rt is not None and self.rt.running():
                self.rt.stop()
        finally:
            if self.prom is not None:
                self.prom.stop()


# ------------------------------------------------------------------------- 1. the load step

def summarize(windows: list[dict]) -> dict | None:
    if not windows:
        return None
    return {"windows": len(windows),
            "ops_per_s_mean": round(statistics.mean(w["ops_per_s"] for w in windows)),
            "ops_per_s_range": [round(min(w["ops_per_s"] for w in windows)),
                                round(max(w["ops_per_s"] for w in windows))],
            "p99_ms_median": round(statistics.median(w["p99_ms"] for w in windows), 2),
            "p99_ms_range": [round(min(w["p99_ms"] for w in windows), 2),
                             round(max(w["p99_ms"] for w in windows), 2)],
            "errors": sum(w["errors"] for w in windows),
            "machine_busy_pct_mean": round(statistics.mean(w["machine_busy_pct"] for w in windows)),
            "servers_cores_mean": round(statistics.mean(w["servers_cores"] for w in windows), 2),
            "server_cpu_us_per_op": round(1e6 * statistics.mean(w["servers_cores"] for w in windows)
                                          / max(1, statistics.mean(w["ops_per_s"] for w in windows)))}


def load_step(base: Path, args, procs: Procs) -> dict:
    with Setup(base, "step", args, procs) as s:
        rt, poller = s.rt, s.poller
        show("step_idle", {"runtime_start_s": s.started_s, "idle_wait_s": s.idle_wait_s,
                           "autoscaler": {k: s.idle.get(k) for k in ("nodes", "cpu", "recommended", "source")}})
        windows: list[dict] = []
        stop = threading.Event()
        failure: list[BaseException] = []

        def loop():
            try:
                while not stop.is_set():
                    start = poller.now()
                    cpu = Cpu(poller.snapshot().get("pids", []))
                    r = procs.run(rt.endpoint, *workload(args, args.window), timeout=args.window + 120)
                    snap = poller.snapshot()
                    w = {"start_s": round(start, 1), "end_s": round(poller.now(), 1),
                         "ops_per_s": round(r["ops_per_s"]), "p50_ms": r["latency_ms"]["p50"],
                         "p99_ms": r["latency_ms"]["p99"], "errors": r["errors"],
                         **({"errors_by_code": r.get("errors_by_code")} if r["errors"] else {}),
                         **Cpu(snap.get("pids", [])).since(cpu),
                         "nodes": snap.get("nodes"), "tablets": snap.get("servers")}
                    windows.append(w)
                    print("window", json.dumps(w), flush=True)
            except BaseException as e:  # noqa: BLE001 - reported by the main thread
                if not stop.is_set():
                    failure.append(e)

        def even(snap) -> bool:
            counts = list(snap.get("servers", {}).values())
            return len(counts) == args.max_nodes and max(counts) - min(counts) <= 1

        poller.mark()
        loader = threading.Thread(target=loop, daemon=True)
        loader.start()
        try:
            while True:
                rt.assert_alive()
                if failure:
                    raise failure[0]
                t = poller.now()
                even_at = poller.first(even)
                done_after_even = even_at is not None and sum(
                    1 for w in windows if w["start_s"] >= even_at) >= args.after_windows
                if (t >= args.step_seconds and done_after_even) or t >= args.step_max:
                    break
                time.sleep(0.5)
        finally:
            stop.set()
            loader.join(args.window + 130)

        # Each scale-up decision adds the servers of the ordinals from..to-1.
        servers = {}
        for c in poller.changes:
            for ordinal in range(c["from"], c["to"]):
                name = f"{CLUSTER}-{ordinal}"
                if c["to"] > c["from"] and name not in servers:
                    tablet = poller.first(lambda x, n=name: x.get("servers", {}).get(n, 0) >= 1)
                    servers[name] = {
                        "decided_s": c["decided_s"], "decision_seen_s": c["seen_s"],
                        "started_s": _round(poller.started.get(name)),
                        "ready_s": _round(poller.ready.get(name)), "first_tablet_s": tablet}
        ups = [c for c in poller.changes if c["to"] > c["from"]]
        first = servers.get(f"{CLUSTER}-1", {})
        complete = len(servers) == args.max_nodes - 1
        last_of = lambda k: (max(v[k] for v in servers.values())  # noqa: E731
                             if complete and all(v[k] is not None for v in servers.values()) else None)
        times = {
            "decision_s": ups[0]["decided_s"] if ups else None,
            "decision_seen_s": ups[0]["seen_s"] if ups else None,
            "first_decision": f"{ups[0]['from']} -> {ups[0]['to']}" if ups else None,
            "first_new_server_ready_s": first.get("ready_s"),
            "first_new_server_tablet_s": first.get("first_tablet_s"),
            "max_nodes_decided_s": next((c["decided_s"] for c in ups if c["to"] == args.max_nodes), None),
            "all_new_servers_ready_s": last_of("ready_s"),
            "all_new_servers_tablets_s": last_of("first_tablet_s"),
            "even_s": poller.first(even),
        }
        before = [w for w in windows if times["first_new_server_tablet_s"] is None
                  or w["end_s"] <= times["first_new_server_tablet_s"]]
        after = [w for w in windows if times["even_s"] is not None and w["start_s"] >= times["even_s"]]
        during = [w for w in windows if w not in before and w not in after]
        final = poller.snapshot()
        out = {
            "times_from_step_s": times,
            "new_servers": servers,
            "first_new_server_components_s": {
                "decision (step -> nodes > 1 recorded)": times["decision_s"],
                "server start (decision -> /readyz 200)": _diff(first.get("ready_s"), times["decision_s"]),
                "first tablet move (ready -> owns a tablet)": _diff(first.get("first_tablet_s"), first.get("ready_s")),
            },
            "windows_before_first_move": summarize(before),
            "windows_during_moves": summarize(during),
            "windows_after_even": summarize(after),
            "windows": windows,
            "final_autoscaler": {k: final.get(k) for k in ("nodes", "recommended", "wanted", "cpu", "held", "source")},
            "final_tablets": final.get("servers"),
            "changes": poller.changes,
        }
        return show("load_step", out)


def _round(x, digits: int = 2):
    return None if x is None else round(x, digits)


def _diff(a, b):
    return round(a - b, 2) if a is not None and b is not None else None


# ------------------------------------------------------------------- 2. the oscillating load

def oscillate(base: Path, name: str, args, procs: Procs, on: float, off: float, total: float) -> dict:
    with Setup(base, name, args, procs) as s:
        rt, poller = s.rt, s.poller
        poller.mark()
        phases: list[dict] = []
        while poller.now() + 1 < total:
            rt.assert_alive()
            start = poller.now()
            seconds = min(on, total - start)
            r = procs.run(rt.endpoint, *workload(args, seconds), timeout=seconds + 120)
            phases.append({"on_s": round(start, 1), "off_s": round(poller.now(), 1),
                           "ops_per_s": round(r["ops_per_s"]), "p99_ms": r["latency_ms"]["p99"],
                           "errors": r["errors"],
                           **({"errors_by_code": r.get("errors_by_code")} if r["errors"] else {})})
            print(name, "phase", json.dumps(phases[-1]), flush=True)
            quiet = min(off, total - poller.now())
            if quiet > 0:
                time.sleep(quiet)
        time.sleep(1.5)  # the last changes into local.json
        changes = list(poller.changes)
        directions = ["up" if c["to"] > c["from"] else "down" for c in changes]
        flips = sum(1 for a, b in zip(directions, directions[1:]) if a != b)
        final = poller.snapshot()
        out = {
            "on_s": on, "off_s": off, "seconds": total,
            "quiet_spell_vs_down_window": "shorter" if off < args.down_window else "longer",
            "nodes_sequence": [changes[0]["from"]] + [c["to"] for c in changes] if changes else [final.get("nodes")],
            "changes": changes,
            "change_count": len(changes),
            "direction_changes": flips,
            "load_phases": phases,
            "final_autoscaler": {k: final.get(k) for k in ("nodes", "recommended", "cpu", "held", "source")},
        }
        return show(name, out)


# ------------------------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=("all", "step", "oscillate"), default="all")
    ap.add_argument("--records", type=int, default=20_000, help="rows of 1 KiB loaded first")
    ap.add_argument("--concurrency", type=int, default=8, help="basalt-bench requests in flight")
    ap.add_argument("--max-nodes", type=int, default=3, help="maxServeNodes (min is 1)")
    ap.add_argument("--cpu-request", default="100m", help="the Cluster's CPU request (each server's allocation)")
    ap.add_argument("--cpu-target", type=int, default=50, help="cpuUtilizationPercent")
    ap.add_argument("--sample", type=float, default=2, help="BASALT_AUTOSCALE_SAMPLE_SECS")
    ap.add_argument("--up-window", type=float, default=10, help="BASALT_AUTOSCALE_UP_WINDOW_SECS")
    ap.add_argument("--down-window", type=float, default=30, help="BASALT_AUTOSCALE_DOWN_WINDOW_SECS")
    ap.add_argument("--down-cooldown", type=float, default=20, help="BASALT_AUTOSCALE_DOWN_COOLDOWN_SECS")
    ap.add_argument("--window", type=float, default=5, help="seconds of each basalt-bench run of the step")
    ap.add_argument("--step-seconds", type=float, default=90, help="least seconds of load after the step")
    ap.add_argument("--step-max", type=float, default=150, help="most seconds of load after the step")
    ap.add_argument("--after-windows", type=int, default=4, help="windows wanted once the tablets are even")
    ap.add_argument("--short-on", type=float, default=20)
    ap.add_argument("--short-off", type=float, default=20)
    ap.add_argument("--short-seconds", type=float, default=240)
    ap.add_argument("--long-on", type=float, default=60)
    ap.add_argument("--long-off", type=float, default=60)
    ap.add_argument("--long-seconds", type=float, default=240)
    ap.add_argument("--prometheus", action="store_true",
                    help="sample through a real Prometheus (/usr/bin/prometheus) instead of the servers' reports")
    args = ap.parse_args()

    # SIGTERM (and SIGHUP) unwind like Ctrl-C, so that every process started is stopped.
    def interrupted(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGHUP, interrupted)

    base = Path(tempfile.mkdtemp(prefix="bench-autoscale-"))
    sample = effective_sample(args)
    results: dict = {"setup": show("setup", {
        "data_dir": str(base),
        "cluster": {"minServeNodes": 1, "maxServeNodes": args.max_nodes,
                    "cpuUtilizationPercent": args.cpu_target, "cpuRequest": args.cpu_request},
        "table": "usertable, 16 tablets", "records": args.records,
        "load": f"basalt-bench ycsb-a, {args.concurrency} in flight, {args.max_nodes} connections",
        "source": "prometheus (rate over 1m, scraped every 1 s)" if args.prometheus else "servers' reports",
        "timings_s": {"sample_configured": args.sample, "sample_effective": sample,
                      "up_window": args.up_window, "down_window": args.down_window,
                      "down_cooldown": args.down_cooldown},
        "bigtable_defaults_s": DEFAULTS,
        "why_shortened": "Bigtable's windows (60 s up, 30 min down, 10 min cool-down) would make "
                         "one run take hours; the decision's rule is the same with shorter windows",
        "formula": "time to capacity ≈ up window + one sample + server start + first tablet moves",
        # A sample measures the CPU of the interval before it, so the window is covered by
        # samples spanning the window less one interval (docs: "but for one interval").
        "expected_decision_s": [args.up_window - sample, args.up_window + sample],
    })}
    procs = Procs()
    started = time.monotonic()
    try:
        if args.only in ("all", "step"):
            results["load_step"] = load_step(base, args, procs)
            t = results["load_step"]["times_from_step_s"]
            rest = _diff(t["first_new_server_tablet_s"], t["decision_s"])
            results["time_to_capacity"] = show("time_to_capacity", {
                "first_new_server_serving_a_tablet_s": t["first_new_server_tablet_s"],
                "decision_s": t["decision_s"],
                "after_the_decision_s": rest,
                "every_new_server_serving_s": t["all_new_servers_tablets_s"],
                "even_s": t["even_s"],
                "with_bigtable_defaults_estimate_s": (
                    [round(DEFAULTS["up_window_s"] - DEFAULTS["sample_s"] + rest, 1),
                     round(DEFAULTS["up_window_s"] + DEFAULTS["sample_s"] + rest, 1)]
                    if rest is not None else None),
            })
        if args.only in ("all", "oscillate"):
            results["oscillate_short"] = oscillate(base, "oscillate_short", args, procs,
                                                   args.short_on, args.short_off, args.short_seconds)
            results["oscillate_long"] = oscillate(base, "oscillate_long", args, procs,
                                                  args.long_on, args.long_off, args.long_seconds)
    finally:
        procs.kill_all()
    results["total_seconds"] = round(time.monotonic() - started)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
