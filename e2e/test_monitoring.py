"""The chart's monitoring assets against a real Prometheus (Debian's ``prometheus``, with
``promtool``) scraping the local runtime (etcd, tablet servers and the master as processes):

* ``promtool check rules`` passes on ``charts/basalt-operator/files/prometheus-rules.yaml``, and
  ``promtool check config`` on the Prometheus configuration below;
* Prometheus (scrape and rule evaluation every second) finds its targets in the runtime's
  ``prometheus-targets.json`` (file_sd): every tablet server under the job
  ``basalt-tablet-server`` and the master under ``basalt-master``, exactly the addresses of
  ``local.json``, all up;
* the instance has two clusters: ``…-c1`` of fixed size (1 server, then 2: the master moves
  tablets to the new one) and ``…-c2`` that autoscales (1–2 nodes, CPU target 50 %), so
  replication runs between them; clients write, read and make NOT_FOUND errors through the
  instance's endpoint and at a server of each cluster the whole time;
* every recording rule is loaded and healthy, and its series has a finite value; the
  ``basalt:cluster_*`` rules of the servers' and the master's metrics have one for each
  cluster, labelled with the instance's namespace and name; the node count, the tablets, the
  autoscaler's bounds and target and the leader are the values the runtime runs with;
* the Grafana dashboard (``files/grafana-dashboard.json``): its variables' ``label_values``
  queries list the namespace, the instance and both clusters, and every panel's every query,
  with the variables substituted as Grafana does (``$cluster`` multi-valued: ``(c1|c2)``,
  ``$__rate_interval``: ``1m``), returns a finite value;
* every alert has a ``for:``, a ``severity`` label, ``summary`` and ``description``, and a
  ``measured`` annotation (the rule file's convention, see its header) that is a verbatim part
  of its expression; the expression evaluates without error and its measured part returns
  data; the alerts about failures (no leader, lost tablets, servers not ready or down) are
  silent while everything runs;
* then a tablet server is stopped (SIGSTOP): ``BasaltServerDown`` for its address turns up in
  ``/api/v1/alerts`` (pending, its ``for:`` not yet over), and so does ``BasaltServerNotReady``
  for its cluster once the master sees it not ready; SIGCONT, and the runtime stops cleanly.

Queries that need data that is still accruing (rates need two samples) are retried for up to
``DATA_TIMEOUT`` seconds; what still fails then is reported all at once."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import urllib.parse
from pathlib import Path

import pytest
from google.api_core import exceptions as gexc

import btlib
import localrt
from btlib import GapicClients
from conftest import REPO, free_port

CHART_FILES = REPO / "charts" / "basalt-operator" / "files"
RULES = CHART_FILES / "prometheus-rules.yaml"
DASHBOARD = CHART_FILES / "grafana-dashboard.json"

PROJECT = "mon-p"
NAMESPACE = "default"
INSTANCE = "e2e-monitoring"
C1, C2 = f"{INSTANCE}-c1", f"{INSTANCE}-c2"
TABLE = "watched"
SPLITS = [b"d", b"h", b"m", b"r", b"w"]  # 6 tablets
DATA_TIMEOUT = 60.0
ALERT_TIMEOUT = 40.0
# Grafana's substitutions for Prometheus: a multi-valued variable becomes a regex alternation.
RATE_INTERVAL = "1m"
REQUIRED_ALERTS = {"BasaltHotServer", "BasaltStorageNearlyFull", "BasaltAutoscalerAtMax",
                   "BasaltTabletsLost", "BasaltServerNotReady", "BasaltServerDown",
                   "BasaltMasterWithoutLeader"}
# Alerts about failures: silent while every process runs and every tablet is served.
SILENT_WHEN_HEALTHY = {"BasaltTabletsLost", "BasaltServerNotReady", "BasaltServerDown",
                       "BasaltMasterWithoutLeader"}
# Recording rules whose series exist for every cluster (the others: per server, per RPC, per
# table, or only where replication or errors are).
PER_CLUSTER_RULES = {"basalt:cluster_cpu_load", "basalt:cluster_cpu_load_hottest_node",
                     "basalt:cluster_storage_bytes", "basalt:cluster_storage_capacity_bytes",
                     "basalt:cluster_storage_utilization", "basalt:cluster_node_count",
                     "basalt:cluster_tablets", "basalt:cluster_request_rate"}


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is missing: apt-get install prometheus (e2e/run-tests checks for it)")
    return path


def manifest(c1_nodes: int) -> str:
    return f"""apiVersion: basalt.dev/v1alpha1
kind: Instance
metadata:
  name: {INSTANCE}
spec:
  displayName: Monitoring
  type: Development
  projectId: {PROJECT}
---
apiVersion: basalt.dev/v1alpha1
kind: Cluster
metadata:
  name: {C1}
spec:
  instanceRef: {INSTANCE}
  serveNodes: {c1_nodes}
  storageSize: 1Gi
---
apiVersion: basalt.dev/v1alpha1
kind: Cluster
metadata:
  name: {C2}
spec:
  instanceRef: {INSTANCE}
  storageSize: 1Gi
  autoscaling:
    minServeNodes: 1
    maxServeNodes: 2
    cpuUtilizationPercent: 50
"""


# ------------------------------------------------------------------------------ Prometheus


class PromError(AssertionError):
    pass


class Prometheus:
    """A real Prometheus in ``base/prometheus``: scrapes the runtime's file_sd targets and
    evaluates the chart's rule file, both every second."""

    def __init__(self, base: Path, targets_file: Path):
        self.dir = base / "prometheus"
        self.dir.mkdir()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = self.dir / "prometheus.yml"
        # JSON is YAML.
        self.config.write_text(json.dumps({
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [{
                "job_name": "basalt",  # each target group's own job label wins
                # The targets carry labels the series have too (docs/monitoring.md).
                "honor_labels": True,
                "file_sd_configs": [{"files": [str(targets_file)], "refresh_interval": "1s"}],
            }],
        }, indent=2))
        self.log = self.dir / "prometheus.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30) -> "Prometheus":
        self.proc = subprocess.Popen(
            [tool("prometheus"), f"--config.file={self.config}",
             f"--storage.tsdb.path={self.dir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=open(self.log, "ab"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited ({self.proc.returncode})\n{self.logs()}")
            status, _, _ = self._get("/-/ready")
            if status == 200:
                return self
            time.sleep(0.2)
        raise AssertionError(f"prometheus not ready in {timeout}s\n{self.logs()}")

    def _get(self, path: str, params=()) -> tuple[int, dict, bytes]:
        url = self.url + path + ("?" + urllib.parse.urlencode(params) if params else "")
        try:
            return btlib.http_get(url, timeout=10)
        except OSError as e:
            return 0, {}, repr(e).encode()

    def api(self, path: str, params=()) -> dict | list:
        status, _, body = self._get("/api/v1/" + path, params)
        try:
            doc = json.loads(body)
        except ValueError:
            raise PromError(f"GET /api/v1/{path} {params}: HTTP {status}: {body[:300]!r}")
        if doc.get("status") != "success":
            raise PromError(f"{doc.get('errorType')}: {doc.get('error')}")
        return doc["data"]

    def query(self, expr: str) -> list[dict]:
        """An instant query's vector (or scalar, as a one-element list)."""
        data = self.api("query", [("query", expr)])
        if data["resultType"] == "vector":
            return data["result"]
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        raise PromError(f"{expr}: a {data['resultType']}, not a vector")

    def rules(self, kind: str) -> list[dict]:
        return [r for g in self.api("rules", [("type", kind)])["groups"] for r in g["rules"]]

    def logs(self) -> str:
        try:
            return "--- prometheus.log\n" + self.log.read_bytes()[-4000:].decode(errors="replace")
        except OSError:
            return "<no prometheus log>"

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def finite(result: list[dict]) -> bool:
    return any(math.isfinite(float(r["value"][1])) for r in result)


def converge(what: str, checks: dict, timeout: float, diagnostics) -> None:
    """Runs every check (a function returning None when it holds, else what is wrong) until all
    hold; those still failing after ``timeout`` seconds fail the test, all listed."""
    started = time.monotonic()
    deadline = started + timeout
    pending = dict(checks)
    failures: dict[str, str] = {}
    while True:
        for name, check in list(pending.items()):
            try:
                problem = check()
            except PromError as e:  # a query Prometheus refuses does not get better: fail now
                raise AssertionError(f"{what}: {name}: {e}\n{diagnostics()}") from None
            if problem is None:
                del pending[name]
                failures.pop(name, None)
            else:
                failures[name] = problem
        if not pending:
            print(f"{what}: {len(checks)} checks hold after {time.monotonic() - started:.1f}s")
            return
        if time.monotonic() > deadline:
            listed = "\n".join(f"  - {n}: {failures[n]}" for n in pending)
            raise AssertionError(f"{what}: {len(pending)} of {len(checks)} still failing after "
                                 f"{timeout}s:\n{listed}\n{diagnostics()}")
        time.sleep(1)


def squash(expr: str) -> str:
    return re.sub(r"\s+", "", expr)


# ------------------------------------------------------------------------------ traffic


class Traffic:
    """Client threads, one per endpoint, working until stopped: MutateRow, MutateRows, ReadRows
    of a row and of a range, and every tenth round a write to a family the table does not have
    and a read of a table that does not exist (NOT_FOUND both: the error series)."""

    def __init__(self, endpoints: list[str]):
        self.table = btlib.table_name(TABLE, INSTANCE, PROJECT)
        self.missing = btlib.table_name("no-such-table", INSTANCE, PROJECT)
        self.rounds = 0
        self.not_found = 0
        self.errors: list[str] = []
        self.stopped = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(e, i), daemon=True)
                        for i, e in enumerate(endpoints)]

    def _run(self, endpoint: str, idx: int):
        client = GapicClients(endpoint)
        try:
            n = 0
            while not self.stopped.is_set():
                key = f"{'aeimqu'[n % 6]}-{idx}-{n:06}".encode()
                cell = btlib.set_cell("cf", b"q", key * 20, btlib.now_micros())
                try:
                    btlib.mutate_row(client.data, self.table, key, [cell], timeout=10)
                    if n % 5 == 0:
                        btlib.mutate_rows(client.data, self.table,
                                          [(key + b"-%d" % i, [cell]) for i in range(5)], timeout=10)
                    btlib.read_rows(client.data, self.table, keys=[key], timeout=10)
                    if n % 10 == 0:
                        btlib.read_rows(client.data, self.table, limit=20, timeout=10)
                        try:  # a family the table does not have
                            btlib.mutate_row(client.data, self.table, key,
                                             [btlib.set_cell("nope", b"q", b"v", 1000)], timeout=10)
                        except gexc.NotFound:
                            self.not_found += 1
                        try:  # a table that does not exist
                            btlib.read_rows(client.data, self.missing, keys=[key], timeout=10)
                        except gexc.NotFound:
                            self.not_found += 1
                    self.rounds += 1
                except gexc.GoogleAPICallError as e:
                    self.errors.append(f"{key!r}: {str(e)[:200]}")
                    time.sleep(0.2)
                n += 1
                time.sleep(0.02)
        finally:
            client.close()

    def start(self) -> "Traffic":
        for t in self.threads:
            t.start()
        return self

    def wait_rounds(self, rounds: int, timeout: float = 30):
        mark = self.rounds
        deadline = time.monotonic() + timeout
        while self.rounds < mark + rounds:
            assert time.monotonic() < deadline, (self.rounds - mark, self.errors[-5:])
            time.sleep(0.1)

    def stop(self):
        self.stopped.set()
        for t in self.threads:
            t.join(30)


# ------------------------------------------------------------------------------ the test


def create_table(rt: localrt.LocalRuntime):
    client = GapicClients(rt.cluster(INSTANCE, C1)["servers"][0]["grpc"])
    try:
        client.admin.create_table(
            request=btlib.admin_types.CreateTableRequest(
                parent=btlib.instance_name(INSTANCE, PROJECT), table_id=TABLE,
                table=btlib.Table(column_families={"cf": btlib.column_family(btlib.gc_versions(1))}),
                initial_splits=[btlib.admin_types.CreateTableRequest.Split(key=k) for k in SPLITS]),
            timeout=60)
    finally:
        client.close()
    for c in (C1, C2):
        cl = localrt.EtcdCluster(rt, INSTANCE, c, NAMESPACE)
        localrt.wait(f"the table's {len(SPLITS) + 1} tablets owned in {c}",
                     lambda: sum(cl.owners().values()) == len(SPLITS) + 1, 60, rt)


def endpoint_serves(rt: localrt.LocalRuntime) -> bool:
    client = GapicClients(rt.endpoint)
    try:
        btlib.read_rows(client.data, btlib.table_name(TABLE, INSTANCE, PROJECT), keys=[b"a"], timeout=5)
        return True
    except gexc.GoogleAPICallError:
        return False
    finally:
        client.close()


def targets_file(rt: localrt.LocalRuntime) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """The addresses prometheus-targets.json lists by job, and what local.json says they must
    be: every server's HTTP address (job basalt-tablet-server), the master's metrics address
    (basalt-master)."""
    groups = json.loads((rt.data_dir / "prometheus-targets.json").read_text())
    by_job: dict[str, set[str]] = {}
    for g in groups:
        by_job.setdefault(g["labels"]["job"], set()).update(g["targets"])
    want = {"basalt-tablet-server": {s["http"] for s in rt.servers()},
            "basalt-master": {rt.instance(INSTANCE)["master"]["metrics"]}}
    return by_job, want


def dashboard_exprs() -> tuple[dict, list[tuple[str, str]]]:
    """The dashboard, and (panel title / refId, expr) of every query of every panel."""
    d = json.loads(DASHBOARD.read_text())
    out = []
    # A collapsed row holds its panels.
    panels = [q for p in d["panels"] for q in ([p] + p.get("panels", []))]
    for p in panels:
        if p["type"] == "row":
            assert not p.get("targets"), p["title"]
            continue
        assert p.get("targets"), f"panel {p['title']!r} has no query"
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}", (p["title"], t)
            out.append((f"#{p['id']} {p['title']} / {t['refId']}", t["expr"]))
    return d, out


def substitute(expr: str) -> str:
    out = (expr.replace("$__rate_interval", RATE_INTERVAL)
           .replace("$namespace", NAMESPACE).replace("$instance", INSTANCE)
           .replace("$cluster", f"({C1}|{C2})"))
    assert "$" not in out, f"a variable the test does not know: {expr}"
    return out


@pytest.mark.timeout(300)
def test_rules_dashboard_and_an_alert_on_a_real_prometheus(tmp_path):
    started = time.monotonic()
    cp = subprocess.run([tool("promtool"), "check", "rules", str(RULES)], capture_output=True,
                        text=True, timeout=60)
    assert cp.returncode == 0 and "SUCCESS" in cp.stdout, cp.stdout + cp.stderr

    # The autoscaler samples every 2 s instead of 15: its series (wanted nodes, CPU input)
    # exist from its first sample on.
    rt = localrt.LocalRuntime(tmp_path, manifest(1), f"127.0.0.1:{free_port()}",
                              env={"BASALT_AUTOSCALE_SAMPLE_SECS": "2"})
    prom = Prometheus(tmp_path, rt.data_dir / "prometheus-targets.json")
    cp = subprocess.run([tool("promtool"), "check", "config", str(prom.config)], capture_output=True,
                        text=True, timeout=60)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    traffic = None
    stopped_pid = None

    def diagnostics() -> str:
        return f"{prom.logs()}\n{rt.logs()}"

    rt.start()
    try:
        prom.start()
        create_table(rt)
        # The endpoint follows the runtime's own readiness probes, which may lag the servers'.
        localrt.wait("the endpoint serving the table", lambda: endpoint_serves(rt), 30, rt)
        # Through the instance's endpoint (one connection: one server), and to a server of each
        # cluster directly, so that every cluster has client requests of its own.
        traffic = Traffic([rt.endpoint] + [rt.cluster(INSTANCE, c)["servers"][0]["grpc"]
                                           for c in (C1, C2)]).start()
        traffic.wait_rounds(30)
        # c1 grows to 2 servers: the master moves tablets to the new one.
        out = rt.apply(manifest(2))
        assert out.returncode == 0, out.stdout + out.stderr
        cl1 = localrt.EtcdCluster(rt, INSTANCE, C1, NAMESPACE)
        localrt.wait("c1's tablets on both of its servers",
                     lambda: len(rt.cluster(INSTANCE, C1)["servers"]) == 2
                     and all(rt.server_ready(s) for s in rt.servers())
                     and len(cl1.owners()) == 2 and not cl1.moves(), 90, rt)
        traffic.wait_rounds(20)

        # The targets: the runtime's file_sd file, as Prometheus sees it.
        def targets_listed():
            try:
                got, want = targets_file(rt)
            except (OSError, ValueError, KeyError) as e:
                return repr(e)
            return None if got == want else f"{got}, want {want}"
        converge("prometheus-targets.json", {"the 3 servers and the master": targets_listed}, 30,
                 diagnostics)
        by_job = targets_file(rt)[0]

        def targets_up():
            active = prom.api("targets", [("state", "active")])["activeTargets"]
            seen = {}
            for t in active:
                seen.setdefault(t["labels"]["job"], {})[t["labels"]["instance"]] = t["health"]
            want = {job: {addr: "up" for addr in addrs} for job, addrs in by_job.items()}
            return None if seen == want else f"{seen} (want {want})"
        converge("Prometheus' targets", {"all up": targets_up}, 30, diagnostics)
        exported = [n for n in prom.api("labels") if n.startswith("exported_")]
        assert not exported, f"labels of targets and series collide: {exported}"

        # Recording rules: loaded, healthy, each with a finite value; per-cluster ones per cluster.
        records = prom.rules("record")
        assert records, "no recording rule loaded"
        servers = {s["name"] for s in rt.servers()}

        def record_check(rule):
            def check():
                if rule["health"] != "ok":
                    return f"health {rule['health']}: {rule.get('lastError')}"
                result = prom.query(rule["name"])
                if not finite(result):
                    return f"no finite value: {result[:3]}"
                for r in result:
                    m = r["metric"]
                    if m.get("basalt_namespace") != NAMESPACE or m.get("basalt_instance") != INSTANCE:
                        return f"a series without the instance's labels: {m}"
                if rule["name"] in PER_CLUSTER_RULES:
                    got = {r["metric"].get("basalt_cluster") for r in result}
                    if got != {C1, C2}:
                        return f"clusters {got}, want {C1} and {C2}"
                if rule["name"].startswith("basalt:server_"):
                    got = {r["metric"].get("basalt_server") for r in result}
                    if got != servers:
                        return f"servers {got}, want {servers}"
                return None
            return check
        converge("recording rules", {r["name"]: record_check(r) for r in records}, DATA_TIMEOUT,
                 diagnostics)

        # A few values the processes know for sure: the servers of each cluster, the tablets of
        # the table in each, the autoscaled cluster's bounds and target, one leading master.
        def value_check(expr, want):
            def check():
                got = {r["metric"].get("basalt_cluster", ""): float(r["value"][1]) for r in prom.query(expr)}
                return None if got == want else f"{expr}: {got}, want {want}"
            return check
        tablets = float(len(SPLITS) + 1)
        converge("values", {
            "node count": value_check("basalt:cluster_node_count", {C1: 2.0, C2: 1.0}),
            "serving tablets": value_check('max by (basalt_cluster) (basalt_master_tablets{state="serving"})',
                                           {C1: tablets, C2: tablets}),
            "tablets owned": value_check("basalt:cluster_tablets", {C1: tablets, C2: tablets}),
            "autoscaler bounds": value_check(
                "basalt_autoscaler_min_nodes * 1000 + basalt_autoscaler_max_nodes", {C2: 1002.0}),
            "autoscaler target": value_check("basalt_autoscaler_cpu_target", {C2: 0.5}),
            "leader": value_check("max by (basalt_namespace, basalt_instance) (basalt_master_leader)", {"": 1.0}),
        }, DATA_TIMEOUT, diagnostics)

        # The dashboard: its variables, then every query of every panel.
        dashboard, exprs = dashboard_exprs()
        assert 38 <= dashboard["schemaVersion"] <= 41, dashboard["schemaVersion"]
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"
        assert variables["cluster"]["multi"], "the cluster variable takes several clusters"
        want_values = {"namespace": NAMESPACE, "instance": INSTANCE, "cluster": {C1, C2}}

        def variable_check(name):
            def check():
                v = variables[name]
                query = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
                m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query)
                assert m, f"variable {name}: {query!r} is not label_values(selector, label)"
                values = set(prom.api(f"label/{m.group(2)}/values",
                                      [("match[]", substitute(m.group(1)))]))
                want = want_values[name]
                want = want if isinstance(want, set) else {want}
                return None if want <= values else f"{query}: {values}, want {want}"
            return check

        def panel_check(expr):
            def check():
                result = prom.query(substitute(expr))
                return None if finite(result) else f"no finite value: {result[:3]}"
            return check
        checks = {f"variable {n}": variable_check(n) for n in want_values}
        checks.update({f"panel {title}": panel_check(expr) for title, expr in exprs})
        assert len(checks) == len(want_values) + len(exprs), "two queries under one name"
        converge("the dashboard's queries", checks, DATA_TIMEOUT, diagnostics)

        # Alerts: the file's conventions, each expression evaluates, its measured part has data,
        # and those about failures are silent now.
        alerts = prom.rules("alert")
        names = {a["name"] for a in alerts}
        assert REQUIRED_ALERTS <= names, REQUIRED_ALERTS - names
        for a in alerts:
            assert a["health"] == "ok", (a["name"], a.get("lastError"))
            assert a["duration"] > 0, f"{a['name']} has no for:"
            assert a["labels"].get("severity") in ("critical", "warning"), (a["name"], a["labels"])
            for key in ("summary", "description", "measured"):
                assert a["annotations"].get(key), f"{a['name']} has no {key} annotation"
            assert squash(a["annotations"]["measured"]) in squash(a["query"]), (
                f"{a['name']}: measured {a['annotations']['measured']!r} is not part of {a['query']!r}")

        def alert_check(a):
            def check():
                fired = prom.query(a["query"])
                if a["name"] in SILENT_WHEN_HEALTHY and fired:
                    return f"fires while everything runs: {fired[:3]}"
                measured = prom.query(a["annotations"]["measured"])
                return None if measured else f"measured {a['annotations']['measured']!r} returns nothing"
            return check
        converge("the alerts", {a["name"]: alert_check(a) for a in alerts}, DATA_TIMEOUT, diagnostics)
        traffic.stop()
        assert traffic.not_found > 0 and traffic.rounds > 50, (traffic.rounds, traffic.not_found,
                                                               traffic.errors[-5:])

        # An alert for real: a stopped tablet server of c1.
        victim = rt.cluster(INSTANCE, C1)["servers"][1]
        stopped_pid = victim["pid"]
        os.kill(stopped_pid, signal.SIGSTOP)

        def active_alert(name, **labels):
            def check():
                for alert in prom.api("alerts")["alerts"]:
                    if alert["labels"]["alertname"] == name and \
                            all(alert["labels"].get(k) == v for k, v in labels.items()):
                        return None if alert["state"] in ("pending", "firing") else alert["state"]
                return "not active"
            return check
        converge("alerts on a stopped server", {
            "BasaltServerDown": active_alert("BasaltServerDown", job="basalt-tablet-server",
                                             instance=victim["http"]),
            "BasaltServerNotReady": active_alert("BasaltServerNotReady", basalt_cluster=C1,
                                                 basalt_instance=INSTANCE),
        }, ALERT_TIMEOUT, diagnostics)
        os.kill(stopped_pid, signal.SIGCONT)
        stopped_pid = None
    finally:
        if stopped_pid is not None:
            os.kill(stopped_pid, signal.SIGCONT)
        if traffic is not None:
            traffic.stop()
        prom.stop()
        if rt.running():
            assert rt.stop() == 0, rt.logs()
    print(f"test_monitoring: {time.monotonic() - started:.0f}s")


def test_cluster_cpu_load_counts_only_the_servers_scraped_now():
    """``promtool test rules`` of e2e/prometheus/cluster-cpu-load.test.yaml: a server that stops
    leaves a CPU rate over the window but no allocation; the cluster's load (as the dashboard
    and the autoscaler count it) must not add its last rate to the others' allocation."""
    cp = subprocess.run([tool("promtool"), "test", "rules", "cluster-cpu-load.test.yaml"],
                        cwd=REPO / "e2e" / "prometheus", capture_output=True, text=True,
                        timeout=60)
    assert cp.returncode == 0 and "SUCCESS" in cp.stdout, cp.stdout + cp.stderr
