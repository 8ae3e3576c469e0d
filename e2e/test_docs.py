"""Every code block of README.md and docs/*.md, run as a reader would run it.

``docblocks.COVERAGE`` says which test below runs each block, or why no test can run it on
this machine; ``test_every_block_is_run`` fails on a block that no rule covers, so a new
snippet cannot go unrun silently (``text`` blocks — diagrams, grammars, synopses — are not
code), and each test fails on a block given to it that it does not know how to run.

* README.md, docs/user-guide.md: each document's blocks run in order, as one reader's session:
  the block that starts a server runs each of its commands (``cargo run …``, the built binary)
  as the reader would, waits until it is ready, stops the earlier ones with SIGTERM (exit 0
  asserted) and keeps the last one serving the blocks that follow; ``sh`` blocks run in bash
  and ``python`` blocks in the test venv's Python (the pinned official client), with
  ``BIGTABLE_EMULATOR_HOST`` set as the reader's ``export`` sets it.
* docs/benchmarks.md: its three blocks as one bash session (the server it starts in the
  background is stopped with SIGTERM afterwards); ``cargo bench`` in the block's own
  ``# quicker:`` form.
* docs/helm.md, docs/operator.md: against a fresh Kubernetes 1.20.2 control plane (etcd,
  kube-apiserver, kube-controller-manager: e2e/k8s/harness.py) whose process kubelet
  (e2e/k8s/kubelet.py) runs the chart's operator pod as ``basalt-operator`` with its
  ServiceAccount's token and the tablet-server pods as ``basalt-tablet-server``; ``kubectl``
  (1.20) and ``helm`` are first on ``PATH``, ``KUBECONFIG`` is the admin's. Blocks run "inside
  the cluster": Service names resolve to the pods they select (``kubelet.in_cluster``). The
  chart needs Kubernetes 1.25 (CEL rules in its CRDs, ``kubeVersion: >=1.25.0-0``): the test
  asserts that helm.md's blocks, as written, fail on 1.20 for exactly that, then runs them
  verbatim in a checkout whose chart lacks those two things (``chart_for_1_20``).
* docs/kubernetes-e2e.md: "Running it" (which runs e2e/test_k8s.py again) and the by-hand
  session (``e2e/k8s/control-plane up --detach`` … ``down``) verbatim; the test command
  excerpt verbatim, checked against e2e/run-tests. Its kind/k3d and Dockerfile blocks cannot
  run here (no container runtime): ``COVERAGE`` says so.

Blocks run verbatim but for rewrites that keep the tests off a reader's own servers, data and
fixed ports: documented addresses (``127.0.0.1:8086``/``8087``, ``18086``/``18087``) become free
ports and documented paths (``./basalt-data``, ``/tmp/bench-data``, ``/tmp/perf-read.data``,
``/tmp/basalt-k8s-demo``) temporary ones.

The long, independent sessions (benchmarks.md, kubernetes-e2e.md's "Running it" and by-hand
blocks) start in the background when this module starts and are joined by their tests, so
they overlap the other tests.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import btlib
import docblocks
from btlib import http_get
from conftest import REPO, BasaltServer, free_port, server_binary

sys.path.insert(0, str(Path(__file__).resolve().parent / "k8s"))

import harness  # noqa: E402
import cluster  # noqa: E402
from cluster import KubeCluster, output_of  # noqa: E402

# cargo run may compile the server first (a different feature set than the test build).
SERVER_START_TIMEOUT = 1200
BLOCK_TIMEOUT = 420  # one k8s doc block (kubectl wait --timeout=300s inside)
WAIT = 180.0  # a wait of the k8s doc scenarios
BENCH_TIMEOUT = 1500  # benchmarks.md: load + ycsb-a, cargo bench (may compile), perf
RUNNING_IT_TIMEOUT = 1800  # kubernetes-e2e.md "Running it" (cold control-plane build: 5-8 min)
BY_HAND_TIMEOUT = 600
MARK = "@@@ docs block"


def starts_server(lang: str, code: str) -> bool:
    return lang == "sh" and "--standalone" in code


def commands(code: str) -> list[str]:
    """The commands of a block: its lines without comments and blank lines."""
    return [line for line in code.splitlines() if line.strip() and not line.lstrip().startswith("#")]


# The README's test command sits in the block of its run command; it is what runs this test.
TEST_COMMAND = "e2e/run-tests"


def server_commands(code: str) -> list[str]:
    return [c for c in commands(code) if c != TEST_COMMAND]


def tail(path: Path, n: int = 12000) -> str:
    return harness.tail(path, n)


# ----------------------------------------------------------------- README and user guide


class Session:
    """One reader's shell session: a data dir, two free ports and the server they started."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.grpc = f"127.0.0.1:{free_port()}"
        self.http = f"127.0.0.1:{free_port()}"
        self.data_dir = tmp / "basalt-data"
        self.server: subprocess.Popen | None = None
        self.logs: list[Path] = []
        self.env = {
            **os.environ,
            "BIGTABLE_EMULATOR_HOST": self.grpc,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        }
        self.env.pop("BASALT_LISTEN", None)
        self.env.pop("BASALT_HTTP_LISTEN", None)

    def rewrite(self, code: str) -> str:
        return (code.replace("127.0.0.1:8086", self.grpc)
                    .replace("127.0.0.1:8087", self.http)
                    .replace("./basalt-data", str(self.data_dir)))

    def log_tail(self) -> str:
        return "\n".join(f"--- {p}\n{p.read_text(errors='replace')[-8000:]}" for p in self.logs)

    def start_server(self, command: str):
        """Runs one documented server command (the addresses come from the environment the
        flags fall back to, so the command itself stays as written)."""
        self.stop_server()
        log = self.tmp / f"server-{len(self.logs)}.log"
        self.logs.append(log)
        env = {**self.env, "BASALT_LISTEN": self.grpc, "BASALT_HTTP_LISTEN": self.http}
        with open(log, "wb") as out:
            self.server = subprocess.Popen(
                ["bash", "-c", f"exec {self.rewrite(command)}"], cwd=REPO, env=env,
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        while time.monotonic() < deadline:
            if self.server.poll() is not None:
                pytest.fail(f"`{command}` exited with {self.server.returncode}\n{self.log_tail()}")
            try:
                if http_get(f"http://{self.http}/readyz", timeout=1)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        pytest.fail(f"`{command}` not ready after {SERVER_START_TIMEOUT}s\n{self.log_tail()}")

    def stop_server(self):
        if self.server is None:
            return
        self.server.send_signal(signal.SIGTERM)
        rc = self.server.wait(60)
        self.server = None
        assert rc == 0, f"the server exited with {rc} on SIGTERM\n{self.log_tail()}"

    def run(self, lang: str, code: str) -> str:
        code = self.rewrite(code)
        argv = ["bash", "-euo", "pipefail", "-c", code] if lang == "sh" else [sys.executable, "-c", code]
        cp = subprocess.run(argv, cwd=self.tmp, env=self.env, capture_output=True, text=True, timeout=300)
        assert cp.returncode == 0, (
            f"{lang} block failed ({cp.returncode}):\n{code}\n--- stdout\n{cp.stdout}\n--- stderr\n{cp.stderr}"
            f"\n{self.log_tail()}")
        return cp.stdout


def run_document(test: str, tmp: Path) -> list[str]:
    session = Session(tmp)
    outputs = []
    try:
        for b in docblocks.assigned(test):
            assert b.lang in ("sh", "python"), f"{b}: {test} runs sh and python blocks only"
            if starts_server(b.lang, b.code):
                for command in server_commands(b.code):
                    session.start_server(command)
                outputs.append("")
            else:
                outputs.append(session.run(b.lang, b.code))
        session.stop_server()
    finally:
        if session.server is not None:
            session.server.kill()
            session.server.wait()
    return outputs


# ---------------------------------------------------------------------- coverage


def test_every_block_is_run():
    """Every fenced block of README.md and docs/*.md is text, or a rule of docblocks.COVERAGE
    gives it to a test of this module (or says why it cannot run here)."""
    tests = {name for name, fn in globals().items() if name.startswith("test_") and callable(fn)}
    for doc in docblocks.documents():
        found = docblocks.blocks(doc)
        assert docblocks.fence_lines(doc) == 2 * len(found), (
            f"{doc}: a code fence docblocks.FENCE does not parse (indented, ~~~, or with text after "
            "the language): write fences as ```lang at the start of a line")
        for b in found:
            if b.lang in docblocks.NOT_CODE:
                continue
            assert b.lang, f"{b}: an unlabelled fence: ```text if it is not a command, else its language"
            rules = docblocks.rule_for(b)
            assert len(rules) == 1, (
                f"{b}: covered by {len(rules)} rules of docblocks.COVERAGE; give it to exactly one test "
                "that runs it (or, if it cannot run on this machine, a rule saying why)")
    for r in docblocks.COVERAGE:
        assert any(r.covers(b) for b in docblocks.blocks(r.doc)), f"a rule that covers no block: {r}"
        if r.runnable:
            assert r.test in tests, f"{r}: no test {r.test} in {__file__}"
        else:
            assert r.test is None and r.how.startswith("not runnable here: "), r
    # The server blocks start what they say: at least one server per document.
    for test in ("test_readme", "test_user_guide"):
        server_blocks = [b for b in docblocks.assigned(test) if starts_server(b.lang, b.code)]
        assert server_blocks, test
        for b in server_blocks:
            for command in server_commands(b.code):
                assert "--standalone" in command, f"{b}: {command!r} is not a server command"


@pytest.mark.timeout(SERVER_START_TIMEOUT + 600)
def test_readme(tmp_path):
    run_cmd, cbt, python = run_document("test_readme", tmp_path)
    # cbt's read prints the row it just wrote; Python prints the value it read back.
    assert re.search(r"^alice\n\s+profile:name\s+@ .*\n\s+\"Alice\"", cbt, re.M), cbt
    assert python.strip() == "b'Alice'", python


@pytest.mark.timeout(SERVER_START_TIMEOUT + 600)
def test_user_guide(tmp_path):
    outputs = run_document("test_user_guide", tmp_path)
    # The last block: `cbt ls` lists the table the Python block created.
    assert "events" in outputs[-1].split(), outputs[-1]


@pytest.mark.timeout(SERVER_START_TIMEOUT + 300)
def test_backups_md(tmp_path):
    """SeaweedFS as the page starts it (free ports instead of its fixed ones), the server with
    the page's exports and flags, then the Python session: backup, restore, copy, delete."""
    import shlex

    from seaweed import S3, SeaweedFS

    weed_block, server_block, python_block = docblocks.assigned("test_backups_md")
    assert (weed_block.lang, server_block.lang, python_block.lang) == ("sh", "sh", "python")
    store = SeaweedFS(tmp_path)  # only for its free ports, its logs and its stop()
    s3_port = store.ports["s3.port"]
    flags = " ".join(f"-{name}={port}" for name, port in store.ports.items())
    flags += " -master.telemetry=false -admin.ui=false -webdav=false"
    # exec: stopping the script stops weed itself
    weed_lines = [c if "weed mini" not in c else c.replace("weed mini", "exec weed mini") + " " + flags
                  for c in weed_block.commands()]
    assert sum("exec weed mini" in line for line in weed_lines) == 1, weed_block
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    with open(store.log_path, "wb") as log:
        store.proc = subprocess.Popen(["bash", "-euo", "pipefail", "-c", "\n".join(weed_lines)],
                                      cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL)
    session = Session(tmp_path)
    try:
        # The exports of the server's block, with the S3 endpoint's port made the free one.
        exported = {}
        for c in server_block.commands():
            if c.startswith("export "):
                exported.update(kv.split("=", 1) for kv in shlex.split(c)[1:])
        exported["AWS_ENDPOINT_URL"] = exported["AWS_ENDPOINT_URL"].replace(":8333", f":{s3_port}")
        s3 = S3(exported["AWS_ENDPOINT_URL"], exported["AWS_ACCESS_KEY_ID"], exported["AWS_SECRET_ACCESS_KEY"])
        def s3_ready() -> bool:
            try:
                return s3.request("GET", "/basalt-backups", query={"list-type": "2"}, timeout=2)[0] == 200
            except OSError:  # not listening yet
                return False

        deadline = time.monotonic() + 60
        while not s3_ready():
            assert store.proc.poll() is None, f"weed mini exited\n{store.logs()}"
            assert time.monotonic() < deadline, f"SeaweedFS not ready in 60s\n{store.logs()}"
            time.sleep(0.3)
        session.env.update(exported)
        server_lines = [c for c in server_block.commands() if not c.startswith("export ")]
        assert len(server_lines) == 1 and "--standalone" in server_lines[0], server_block
        session.start_server(server_lines[0])
        out = session.run("python", python_block.code)
        session.stop_server()
        keys = s3.keys("basalt-backups", "basalt/backups/p/i/local/")
    finally:
        if session.server is not None:
            session.server.kill()
            session.server.wait()
        store.stop()
    lines = out.splitlines()
    assert lines[0] == "projects/p/instances/i/clusters/local/backups/orders-monday READY " + lines[0].split()[-1]
    assert int(lines[0].split()[-1]) > 0
    assert "projects/p/instances/i/clusters/local/backups/orders-monday" in lines[1]
    assert lines[3] == "b'420'", out
    assert lines[4] == "projects/p/instances/i/clusters/local/backups/orders-monday", out
    # In the object store: the copy's manifest, not the deleted backup's.
    assert keys == ["basalt/backups/p/i/local/orders-monday-copy/manifest.json"], keys


# ------------------------------------------------------------------ background sessions


class Job:
    """A bash script in a session of its own, its output in a log; ``stop()`` ends its
    process group (background jobs it started included)."""

    def __init__(self, name: str, script: str, cwd: Path, env: dict, log: Path):
        self.name = name
        self.log = log
        self.script = log.with_suffix(".sh")
        self.script.write_text(script)
        self.started = time.monotonic()
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(["bash", str(self.script)], cwd=cwd, env=env, stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        self.after: list = []  # cleanups after stop()

    def join(self, timeout: float) -> tuple[int, str]:
        try:
            rc = self.proc.wait(max(1.0, timeout - (time.monotonic() - self.started)))
        except subprocess.TimeoutExpired:
            self.stop()
            pytest.fail(f"{self.name}: still running after {timeout:.0f}s\n{tail(self.log)}")
        return rc, self.log.read_text(errors="replace")

    def stop(self) -> None:
        """SIGINT first, as a reader's Ctrl-C (a nested pytest then tears its control plane
        down; a server finishes and flushes), then SIGTERM, then SIGKILL."""
        for sig, grace in ((signal.SIGINT, 60), (signal.SIGTERM, 30), (signal.SIGKILL, 0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                try:
                    os.killpg(self.proc.pid, 0)
                except ProcessLookupError:
                    break
                self.proc.poll()
                time.sleep(0.2)
            else:
                continue
            break
        self.proc.poll()
        for fn in self.after:
            fn()
        self.after.clear()


def sections(log: str) -> dict[int, str]:
    """A script's output by block index (``MARK <index>`` lines separate them)."""
    out: dict[int, str] = {}
    current = None
    for line in log.splitlines(keepends=True):
        if line.startswith(MARK):
            current = int(line.split()[-1])
            out[current] = ""
        elif current is not None:
            out[current] += line
    return out


def session_script(blocks: list[docblocks.Block], rewrite=lambda b, code: code) -> str:
    parts = ["set -euo pipefail"]
    for b in blocks:
        parts += [f"echo '{MARK} {b.index}'", rewrite(b, b.code)]
    return "\n".join(parts) + "\n"


def k8s_missing() -> list[str]:
    return cluster.missing(server_binary())


def need_k8s() -> None:
    cluster.need("Kubernetes doc tests", server_binary())


def bench_job(tmp: Path) -> Job:
    """docs/benchmarks.md as one bash session: its data dir, ports and perf file moved to
    ``tmp`` and free ports, cargo bench in the block's `# quicker:` form."""
    grpc, http = free_port(), free_port()
    data = tmp / "bench-data"

    def rewrite(b: docblocks.Block, code: str) -> str:
        if "cargo bench -p basalt-tablet-server" in code:
            code = quicker(code)
        code = (code.replace("127.0.0.1:18086", f"127.0.0.1:{grpc}")
                    .replace("127.0.0.1:18087", f"127.0.0.1:{http}")
                    .replace("/tmp/bench-data", str(data))
                    .replace("/tmp/perf-read.data", str(tmp / "perf-read.data")))
        assert "/tmp/" not in code.replace(str(tmp), ""), f"{b}: a /tmp path the test does not move"
        return code

    blocks = docblocks.assigned("test_benchmarks_md")
    job = Job("docs/benchmarks.md", session_script(blocks, rewrite), REPO,
              {**os.environ}, tmp / "benchmarks.log")
    job.blocks = blocks
    job.http = f"127.0.0.1:{http}"
    job.after.append(lambda: shutil.rmtree(data, ignore_errors=True))  # ~2 GB
    return job


def quicker(code: str) -> str:
    """A `cargo bench` block in its `# quicker: <command>` form."""
    quick = [line.split("# quicker:", 1)[1].strip() for line in code.splitlines() if "# quicker:" in line]
    full = [line for line in code.splitlines() if line.startswith("cargo bench ")]
    assert len(quick) == 1 and len(full) == 1, f"a cargo bench block without one `# quicker:` form:\n{code}"
    return "".join(quick[0] + "\n" if line == full[0] else line + "\n" for line in code.splitlines())


def running_it_job(tmp: Path) -> Job:
    (b,) = docblocks.assigned("test_kubernetes_e2e_md_running_it")
    return Job("docs/kubernetes-e2e.md: Running it", session_script([b]), REPO, {**os.environ},
               tmp / "running-it.log")


def by_hand_job(tmp: Path) -> Job:
    """The by-hand block with its control plane's directory in ``tmp``, and a HOME of its own
    (kubectl's discovery cache) whose ~/.cache is the real one (the control plane's binaries)."""
    (b,) = docblocks.assigned("test_kubernetes_e2e_md_by_hand")
    demo = tmp / "basalt-k8s-demo"
    home = tmp / "home"
    home.mkdir()
    (home / ".cache").symlink_to(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    env = {**os.environ, "HOME": str(home)}
    env.pop("KUBECONFIG", None)
    script = session_script([b], lambda b, code: code.replace("/tmp/basalt-k8s-demo", str(demo)))
    job = Job("docs/kubernetes-e2e.md: by hand", script, REPO, env, tmp / "by-hand.log")
    job.demo = demo
    job.after.append(lambda: subprocess.run([str(REPO / "e2e/k8s/control-plane"), "down", "--dir", str(demo)],
                                            env=env, capture_output=True, timeout=180))
    return job


BACKGROUND = {
    "test_benchmarks_md": (bench_job, False),
    "test_kubernetes_e2e_md_running_it": (running_it_job, True),
    "test_kubernetes_e2e_md_by_hand": (by_hand_job, True),
}


@pytest.fixture(scope="module", autouse=True)
def background(request, tmp_path_factory):
    """Starts the long sessions of the selected tests when the module starts."""
    here = Path(__file__).name
    selected = {item.originalname or item.name for item in request.session.items
                if item.nodeid.split("::")[0].endswith(here)}
    jobs: dict[str, Job] = {}
    try:
        for test, (make, needs_k8s) in BACKGROUND.items():
            if test in selected and not (needs_k8s and k8s_missing()):
                jobs[test] = make(tmp_path_factory.mktemp(test))
        yield jobs
    finally:
        for job in jobs.values():
            job.stop()


def joined(background, test: str, timeout: float) -> tuple[Job, int, str]:
    job = background.get(test)
    if job is None:
        need_k8s()
        pytest.fail(f"{test}: its background session was not started")
    rc, log = job.join(timeout)
    return job, rc, log


# ------------------------------------------------------------------------ autoscaling.md

# Reads YAML files with the manifests venv's PyYAML (the test venv has none): their documents
# as JSON, [file index, document] each.
YAML_TO_JSON = ("import json, sys, yaml\n"
                "print(json.dumps([[i, d] for i, f in enumerate(sys.argv[1:])"
                " for d in yaml.safe_load_all(open(f)) if d]))")


def test_autoscaling_md_yaml_is_valid(tmp_path):
    """docs/autoscaling.md's manifests: every Basalt document against its CRD (schema, defaults,
    CEL rules) and every HorizontalPodAutoscaler against Kubernetes' schema, with
    e2e/manifests/check.py as e2e/check-manifests runs it. Each HPA scales a Cluster the page
    declares with serveNodes; the page's autoscaled Cluster, given serveNodes as a write through
    the scale subresource would, is rejected for the reason the page gives."""
    py = manifests_python()
    assert py.exists(), f"{py} missing: run e2e/check-manifests (the test command does, before pytest)"
    blocks = docblocks.assigned("test_autoscaling_md_yaml_is_valid")
    assert blocks and all(b.lang == "yaml" for b in blocks), blocks
    files = []
    for b in blocks:
        files.append(tmp_path / f"autoscaling-md-{b.index}.yaml")
        files[-1].write_text(b.code)
    cp = subprocess.run([str(py), "-c", YAML_TO_JSON, *map(str, files)], capture_output=True,
                        text=True, timeout=60)
    assert cp.returncode == 0, output_of(cp)
    docs = [d for _, d in json.loads(cp.stdout)]
    basalt = [d for d in docs if d["apiVersion"] == "basalt.dev/v1alpha1"]
    hpas = [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]
    assert len(basalt) + len(hpas) == len(docs), [(d["apiVersion"], d["kind"]) for d in docs]
    clusters = [d for d in basalt if d["kind"] == "Cluster"]
    autoscaled = [c for c in clusters if "autoscaling" in c["spec"]]
    fixed = {(c["metadata"].get("namespace", "default"), c["metadata"]["name"])
             for c in clusters if "serveNodes" in c["spec"]}
    assert autoscaled and fixed and hpas, (len(autoscaled), fixed, len(hpas))
    for h in hpas:
        ref = h["spec"]["scaleTargetRef"]
        assert (ref["apiVersion"], ref["kind"]) == ("basalt.dev/v1alpha1", "Cluster"), ref
        assert (h["metadata"].get("namespace", "default"), ref["name"]) in fixed, (ref, fixed)

    examples, rendered = [], []
    for i, d in enumerate(basalt + hpas):
        path = tmp_path / f"doc-{i}.yaml"
        path.write_text(json.dumps(d))
        (examples if d in basalt else rendered).append(path)
    invalid = tmp_path / "scaled-autoscaled-cluster.yaml"
    invalid.write_text("".join(
        "---\n# expect: set exactly one of serveNodes and autoscaling\n"
        + json.dumps({**c, "spec": {**c["spec"], "serveNodes": c["spec"]["autoscaling"]["minServeNodes"] + 1}})
        + "\n" for c in autoscaled))
    cp = subprocess.run([str(py), "e2e/manifests/check.py", "--kubernetes-version",
                         os.environ.get("KUBERNETES_VERSION", "1.35.0"), "--crds", "crds",
                         "--rendered", *map(str, rendered), "--examples", *map(str, examples),
                         "--invalid", str(invalid)],
                        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert cp.returncode == 0 and "FAIL" not in cp.stdout, output_of(cp)
    assert f"examples against their CRDs ({len(examples)} files)" in cp.stdout, cp.stdout
    for path in rendered:
        assert re.search(rf"^ok   {re.escape(path.name)}#0 HorizontalPodAutoscaler/", cp.stdout, re.M), cp.stdout
    assert cp.stdout.count("rejected (set exactly one of serveNodes and autoscaling)") == len(autoscaled), cp.stdout


def test_autoscaling_md_promql(tmp_path):
    """docs/autoscaling.md's PromQL block: the autoscaler's four queries for one cluster, each
    valid PromQL (promtool), each selecting that cluster by the servers' own labels, the first
    exactly what operator/src/prometheus.rs's unit test expects ClusterQueries to ask."""
    (b,) = docblocks.assigned("test_autoscaling_md_promql")
    queries = b.commands()
    assert len(queries) == 4, queries
    selector = '{basalt_namespace="prod",basalt_instance="orders",basalt_cluster="orders-c1"}'
    for q in queries:
        assert selector in q, q
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: apt-get install prometheus"
    rules = {"groups": [{"name": "docs-autoscaling", "rules": [
        {"record": f"docs:autoscaling_query_{i}", "expr": q} for i, q in enumerate(queries)]}]}
    (tmp_path / "queries.yaml").write_text(json.dumps(rules))  # JSON is YAML
    cp = subprocess.run([promtool, "check", "rules", str(tmp_path / "queries.yaml")],
                        capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0 and "SUCCESS: 4 rules found" in cp.stdout, output_of(cp)
    source = (REPO / "operator/src/prometheus.rs").read_text()
    expected = re.search(r'q\.cpu_used,\s*"((?:[^"\\]|\\.)*)"', source)
    assert expected, "operator/src/prometheus.rs: no unit test asserting q.cpu_used"
    assert queries[0] == expected.group(1).replace('\\"', '"'), (queries[0], expected.group(1))


# ------------------------------------------------------------------------- security.md


def test_security_md_certificates(tmp_path):
    """docs/security.md's openssl commands make a CA, a server and a client certificate that a
    server with the guide's mutual-TLS flags accepts: the client's principal (its CN), named
    --admin-principal, creates a table over TLS; without a certificate the handshake fails."""
    import grpc

    (b,) = docblocks.assigned("test_security_md_certificates")
    cp = subprocess.run(["bash", "-euo", "pipefail", "-c", b.code], cwd=tmp_path,
                        capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, output_of(cp)
    assert "server.pem: OK" in cp.stdout and "alice.pem: OK" in cp.stdout, output_of(cp)
    server = BasaltServer(tmp_path / "server", extra_args=(
        "--tls-cert", str(tmp_path / "server.pem"), "--tls-key", str(tmp_path / "server.key"),
        "--tls-client-ca", str(tmp_path / "ca.pem"),
        "--admin-principal", "user:alice@example.com")).start()
    try:
        ca = (tmp_path / "ca.pem").read_bytes()
        alice = btlib.GapicClients(server.data_endpoint, btlib.secure_channel(
            server.data_endpoint, ca, (tmp_path / "alice.key").read_bytes(),
            (tmp_path / "alice.pem").read_bytes()))
        try:
            alice.admin.create_table(parent="projects/p/instances/i", table_id="t",
                                     table=btlib.Table(), timeout=30)
        finally:
            alice.close()
        anonymous = btlib.secure_channel(server.data_endpoint, ca)
        try:
            ping = anonymous.unary_unary("/google.bigtable.v2.Bigtable/PingAndWarm",
                                         request_serializer=lambda _: b"",
                                         response_deserializer=lambda r: r)
            with pytest.raises(grpc.RpcError) as e:
                ping(None, timeout=5)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE, e.value
        finally:
            anonymous.close()
    finally:
        server.stop()


def test_security_md_secured_instance(tmp_path):
    """docs/security.md's secured Instance runs on the local runtime (with a Cluster of one
    server and a Table, as the guide's Instance needs): the runtime issues what the page says
    under DIR/tls, and the page's Python snippet, with DIR and the endpoint of this run,
    reaches the instance as the issued admin over mutual TLS; its plaintext refusal is a
    failed handshake."""
    import localrt
    from google.cloud.bigtable_v2 import types as v2

    blocks = docblocks.assigned("test_security_md_secured_instance")
    (instance,) = [b for b in blocks if b.lang == "yaml"]
    python = [b for b in blocks if b.lang == "python"]
    (mounted,) = [b for b in python if "/var/run/secrets/" in b.code]
    (snippet,) = [b for b in python if b is not mounted]
    manifest = instance.code + """---
apiVersion: basalt.dev/v1alpha1
kind: Cluster
metadata:
  name: orders-c1
spec:
  instanceRef: orders
  serveNodes: 1
  storageSize: 1Gi
---
apiVersion: basalt.dev/v1alpha1
kind: Table
metadata:
  name: carts
spec:
  instanceRef: orders
  columnFamilies:
    cf: {}
"""
    endpoint = f"127.0.0.1:{free_port()}"
    rt = localrt.LocalRuntime(tmp_path, manifest, endpoint).start()
    try:
        tls = rt.data_dir / "tls"
        for f in ("ca.pem", "ca-key.pem", "etcd/cert.pem", "operator/cert.pem",
                  "default/orders/server/cert.pem", "default/orders/master/key.pem",
                  "default/orders/clients/admin/token", "default/orders/clients/checkout/cert.pem",
                  "default/orders/tokens"):
            assert (tls / f).is_file(), f
        assert oct((tls / "ca-key.pem").stat().st_mode & 0o777) == "0o600"
        sec = rt.instance("orders")["security"]
        assert sec["identities"]["checkout"]["principal"] == "user:checkout@orders.default.basalt"
        code = snippet.code.replace("DIR", str(rt.data_dir)).replace("127.0.0.1:8086", endpoint)
        scope: dict = {}
        exec(compile(code, "security.md", "exec"), scope)
        table = "projects/default/instances/orders/tables/carts"
        localrt.wait("the table applied", lambda: rt.instance("orders")["tables"].get("carts") == "synced",
                     60, rt)
        scope["data"].mutate_row(request=v2.MutateRowRequest(
            table_name=table, row_key=b"r1",
            mutations=[btlib.set_cell("cf", b"q", b"v", 1000)]), timeout=20)
        rows = [c.row_key for r in scope["data"].read_rows(
            request=v2.ReadRowsRequest(table_name=table), timeout=20) for c in r.chunks if c.row_key]
        assert rows == [b"r1"]
        # The Kubernetes snippet: an identity Secret's keys, as the operator writes them
        # (build/secrets.rs) and a mounted volume shows them, here the admin's files.
        secret = tmp_path / "secret"
        secret.mkdir()
        admin = sec["identities"]["admin"]
        for key, source in (("ca.crt", sec["ca"]), ("tls.crt", admin["cert"]), ("tls.key", admin["key"])):
            (secret / key).write_bytes(Path(source).read_bytes())
        code = mounted.code.replace("/var/run/secrets/orders-identity-checkout", str(secret)) \
            .replace("orders.default.svc:8086", endpoint)
        assert code != mounted.code
        scope = {}
        exec(compile(code, "security.md", "exec"), scope)
        rows = [c.row_key for r in scope["data"].read_rows(
            request=v2.ReadRowsRequest(table_name=table), timeout=20) for c in r.chunks if c.row_key]
        assert rows == [b"r1"]
    finally:
        rt.stop()


# ------------------------------------------------------------------------- operator.md


def manifests_python() -> Path:
    cache = os.environ.get("BASALT_TOOLS_CACHE") or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "basalt-tools"
    return Path(cache) / "manifests-venv" / "bin" / "python"


def test_operator_md_yaml_is_valid(tmp_path):
    """Each YAML block of docs/operator.md validates against its CRD as e2e/check-manifests
    validates examples/*.yaml: schema, defaults and the CEL rules (which a 1.20 API server
    ignores)."""
    py = manifests_python()
    assert py.exists(), f"{py} missing: run e2e/check-manifests (the test command does, before pytest)"
    files = []
    for b in docblocks.assigned("test_operator_md"):
        if b.lang == "yaml":
            files.append(tmp_path / f"operator-md-{b.index}.yaml")
            files[-1].write_text(b.code)
    assert len(files) == 4, files
    cp = subprocess.run([str(py), "e2e/manifests/check.py", "--kubernetes-version",
                         os.environ.get("KUBERNETES_VERSION", "1.35.0"), "--crds", "crds",
                         "--examples", *map(str, files), "--invalid",
                         *sorted(map(str, (REPO / "e2e/manifests/invalid").glob("*.yaml")))],
                        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert cp.returncode == 0 and "FAIL" not in cp.stdout, output_of(cp)
    assert f"examples against their CRDs ({len(files)} files)" in cp.stdout, cp.stdout


def test_operator_md_synopsis_matches_help():
    """The `basalt-operator` synopsis (a text block) names only flags the binary has."""
    (synopsis,) = [b for b in docblocks.blocks("docs/operator.md")
                   if b.lang == "text" and "basalt-operator run [" in b.code]
    op = harness.operator_binary()
    if not os.access(op, os.X_OK):
        pytest.fail(f"{op} missing: cargo build --release --workspace")
    for line in synopsis.code.replace("\n                    ", " ").splitlines():
        sub = line.split()[1]
        helptext = subprocess.run([str(op), sub, "--help"], capture_output=True, text=True,
                                  timeout=30, check=True).stdout
        for flag in re.findall(r"--[a-z][a-z-]+", line):
            assert flag in helptext, f"`basalt-operator {sub}` has no {flag}:\n{helptext}"


# ----------------------------------------------------------- the documentation's cluster

# docs/operator.md's Cluster is pinned to europe-west1-b: the node is in that zone.
ZONE = {"topology.kubernetes.io/zone": "europe-west1-b", "topology.kubernetes.io/region": "europe-west1"}
SERVICEMONITOR_CRD = REPO / "e2e" / "k8s" / "servicemonitor-crd.yaml"
OPERATOR_NS = harness.OPERATOR_NAMESPACE
CEL = harness.CEL


class DocCluster(KubeCluster):
    """A reader's empty Kubernetes 1.20.2 cluster (``cluster.KubeCluster``): the process kubelet
    also runs the chart's operator pods, and its node is in docs/operator.md's zone."""

    def __init__(self, root: Path):
        super().__init__(root, server_binary(), node_labels=ZONE, wait=WAIT, run_timeout=BLOCK_TIMEOUT)

    def operator_pods(self) -> list[dict]:
        return self.api.get("/api/v1/pods", labelSelector="app.kubernetes.io/name=basalt-operator")["items"]

    def leading_operator_pod(self) -> dict | None:
        """The chart's operator pod that is Ready and holds the Lease (its name is the holder:
        POD_NAME and POD_NAMESPACE came from the downward API)."""
        lease = self.api.get_or_none(f"/apis/coordination.k8s.io/v1/namespaces/{OPERATOR_NS}/leases/basalt-operator")
        holder = ((lease or {}).get("spec") or {}).get("holderIdentity")
        for p in self.operator_pods():
            ready = any(c["type"] == "Ready" and c["status"] == "True"
                        for c in (p.get("status") or {}).get("conditions") or [])
            if ready and p["metadata"]["name"] == holder and not p["metadata"].get("deletionTimestamp"):
                return p
        return None

    def release(self) -> dict | None:
        cp = self.kubectl("get", "secret", "-n", OPERATOR_NS, "-l", "owner=helm,name=basalt-operator",
                          "-o", "json", check=False)
        items = json.loads(cp.stdout)["items"] if cp.returncode == 0 else []
        if not items:
            return None
        latest = max(items, key=lambda s: int(s["metadata"]["labels"]["version"]))
        return {"revision": int(latest["metadata"]["labels"]["version"]),
                "status": latest["metadata"]["labels"]["status"]}

    def bigtable_roundtrip(self, endpoint: str, project: str, instance: str, table: str, key: str) -> str:
        """The official Python client writes a row and reads it back through ``endpoint`` (as
        BIGTABLE_EMULATOR_HOST), from inside the cluster."""
        code = (
            "from google.cloud import bigtable\n"
            f"client = bigtable.Client(project={project!r}, admin=True)\n"
            f"table = client.instance({instance!r}).table({table!r})\n"
            f"row = table.direct_row({key.encode()!r})\n"
            "row.set_cell('cf', b'greeting', b'through the endpoint')\n"
            "row.commit()\n"
            f"print(table.read_row({key.encode()!r}).cells['cf'][b'greeting'][0].value.decode())\n")
        cp = self.run(code, argv=[sys.executable, "-c", code], env={"BIGTABLE_EMULATOR_HOST": endpoint})
        return cp.stdout.strip()


@pytest.fixture(scope="module")
def doc_cluster(tmp_path_factory):
    need_k8s()
    c = DocCluster(tmp_path_factory.mktemp("doc-cluster"))
    try:
        c.start()
        yield c
    except BaseException:
        print(c.diagnostics(), file=sys.stderr)
        raise
    finally:
        c.stop()


def by_key(test: str, keys: dict[str, str]) -> dict[str, docblocks.Block]:
    """The blocks given to ``test``, each named by the one key text it contains."""
    out = {}
    for b in docblocks.assigned(test):
        names = [name for name, text in keys.items() if text in b.code]
        assert len(names) == 1, f"{b}: {test} does not know this block (it matches {names})"
        assert names[0] not in out, f"{b}: a second {names[0]} block"
        out[names[0]] = b
    assert set(out) == set(keys), f"{test}: blocks not found: {set(keys) - set(out)}"
    return out


HELM_BLOCKS = {
    "install": "helm install basalt-operator charts/basalt-operator",
    "template": "helm template basalt-operator charts/basalt-operator",
    "quickstart": "kubectl apply -f examples/quickstart.yaml",
    "crds": "kubectl apply --server-side -f charts/basalt-operator/crds/",
    "servicemonitor": "--set serviceMonitor.enabled=true",
}
NOT_ON_1_20 = {
    # helm 4 installs the chart's crds/ with server-side apply; 1.20's typed patch does not know
    # the CEL field (added to the CRD API in 1.23, on by default in 1.25).
    "helm_crds": f"{CEL}: field not declared in schema",
    # kubectl 1.20 validates the CRDs against 1.20's OpenAPI, which has no CEL field.
    "kubectl_crds": f'unknown field "{CEL}"',
    "kube_version": "chart requires kubeVersion: >=1.25.0-0 which is incompatible with Kubernetes v1.20.2",
}


@pytest.mark.timeout(1200)
def test_helm_md(doc_cluster):
    """docs/helm.md on a Kubernetes 1.20.2 cluster: the chart as it is needs 1.25 and fails on
    1.20 for exactly that (asserted); with the chart minus its kubeVersion and CEL rules, every
    block runs verbatim: render-and-apply (then removed), install, the quickstart through the
    endpoint, the CRD upgrade, the ServiceMonitor."""
    c = doc_cluster
    b = by_key("test_helm_md", HELM_BLOCKS)

    # Without Helm on the cluster side, on the empty cluster: render and apply. The operator
    # Deployment's pod runs basalt-operator with the chart's ServiceAccount and leads.
    out = c.run(b["template"].code).stdout
    for obj in ("customresourcedefinition.apiextensions.k8s.io/instances.basalt.dev",
                "clusterrole.rbac.authorization.k8s.io/basalt-operator",
                "role.rbac.authorization.k8s.io/basalt-operator-leader-election",
                "deployment.apps/basalt-operator", "service/basalt-operator-metrics"):
        assert f"{obj} serverside-applied" in out, out
    c.wait("the rendered operator's pod Ready and leading", c.leading_operator_pod)
    # Removed again (but the CRDs), so that the Helm install below starts from scratch.
    rendered = c.run("", argv=["helm", "template", "basalt-operator", "charts/basalt-operator",
                               "--namespace", OPERATOR_NS]).stdout
    c.kubectl("delete", "-f", "-", input=rendered)
    c.kubectl("delete", "namespace", OPERATOR_NS, "--timeout=180s")
    c.wait("the rendered operator's pods gone", lambda: not c.operator_pods())

    # As written, on 1.20: the chart's own CRDs and kubeVersion stop it, and nothing else.
    real = c.run(b["install"].code, cwd=REPO, check=False)
    assert real.returncode != 0 and NOT_ON_1_20["helm_crds"] in real.stderr, output_of(real)
    real = c.run(b["template"].code, cwd=REPO, check=False)
    assert real.returncode != 0 and NOT_ON_1_20["kubectl_crds"] in real.stderr, output_of(real)
    kube_version_only = harness.chart_for_1_20(c.root / "checkout-kube-version", keep_kube_version=True)
    real = c.run(b["install"].code, cwd=kube_version_only, check=False)
    assert real.returncode != 0 and NOT_ON_1_20["kube_version"] in real.stderr, output_of(real)
    assert c.release() is None

    # Install.
    out = c.run(b["install"].code).stdout
    assert "STATUS: deployed" in out and "REVISION: 1" in out, out
    pod = c.wait("the chart's operator pod Ready and leading", c.leading_operator_pod)
    deployment = c.api.get(f"/apis/apps/v1/namespaces/{OPERATOR_NS}/deployments/basalt-operator")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--ssd-storage-class=premium-rwo" in args and "--hdd-storage-class=standard-rwo" in args, args
    assert pod["spec"]["serviceAccountName"] == "basalt-operator"

    # An instance and its endpoint; a Bigtable client writes and reads through it.
    out = c.run(b["quickstart"].code).stdout
    endpoint = out.rsplit("\n", 1)[-1]
    inst = c.cr("instances", "quickstart")
    assert endpoint and endpoint == inst["status"]["endpoint"], out
    assert endpoint == "quickstart.default.svc:8086", endpoint
    assert re.search(r"^instance\.basalt\.dev/quickstart\s", out, re.M), out
    c.wait("Table greetings Ready", lambda: c.ready("tables", "greetings"))
    project = inst["status"]["resourceName"].split("/")[1]
    assert c.bigtable_roundtrip(endpoint, project, "quickstart", "greetings", "helm#1") == "through the endpoint"

    # Upgrading: the CRDs by hand, then the release with its values reused.
    out = c.run(b["crds"].code).stdout
    # One line per CRD in crds/: Instance, Cluster, Table, AppProfile, Backup, BackupSchedule.
    assert out.count(".basalt.dev serverside-applied") == 6, out
    assert c.release() == {"revision": 2, "status": "deployed"}, c.release()
    args = c.api.get(f"/apis/apps/v1/namespaces/{OPERATOR_NS}/deployments/basalt-operator")[
        "spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--ssd-storage-class=premium-rwo" in args, args  # --reuse-values

    # With the Prometheus Operator (its ServiceMonitor CRD: the precondition), the ServiceMonitor.
    c.kubectl("apply", "-f", str(SERVICEMONITOR_CRD))
    c.kubectl("wait", "--for=condition=Established", "crd/servicemonitors.monitoring.coreos.com", "--timeout=60s")
    c.run(b["servicemonitor"].code)
    assert c.release() == {"revision": 3, "status": "deployed"}, c.release()
    sm = c.api.get(f"/apis/monitoring.coreos.com/v1/namespaces/{OPERATOR_NS}/servicemonitors/basalt-operator")
    assert sm["metadata"]["labels"]["release"] == "prometheus", sm["metadata"]
    assert sm["spec"]["endpoints"][0]["port"] == "http-metrics", sm["spec"]
    svc = c.api.get(f"/api/v1/namespaces/{OPERATOR_NS}/services/basalt-operator-metrics")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert any(p["name"] == "http-metrics" for p in svc["spec"]["ports"])

    # The upgrade blocks as written stop at the same two 1.25 requirements.
    real = c.run(b["crds"].code, cwd=REPO, check=False)
    assert real.returncode != 0 and NOT_ON_1_20["kubectl_crds"] in real.stderr, output_of(real)
    real = c.run(b["servicemonitor"].code, cwd=REPO, check=False)
    assert real.returncode != 0 and NOT_ON_1_20["kube_version"] in real.stderr, output_of(real)
    assert c.release() == {"revision": 3, "status": "deployed"}
    assert c.leading_operator_pod() is not None


@pytest.fixture
def chart_operator(doc_cluster):
    """The chart's operator, installed by docs/helm.md's install block if test_helm_md has not."""
    c = doc_cluster
    if c.release() is None:
        c.run(by_key("test_helm_md", HELM_BLOCKS)["install"].code)
    c.wait("the chart's operator pod Ready and leading", c.leading_operator_pod)
    return c


@pytest.mark.timeout(900)
def test_operator_md(chart_operator):
    """docs/operator.md's Instance, Cluster, Table and AppProfile, applied as they are and
    reconciled by the chart's operator: the zone-pinned Cluster's tablet server runs, the Table
    is created with its families; then the shell block, inside the cluster, lists it."""
    c = chart_operator
    blocks = docblocks.assigned("test_operator_md")
    yaml_blocks = [b for b in blocks if b.lang == "yaml"]
    sh_blocks = [b for b in blocks if b.lang == "sh"]
    assert len(yaml_blocks) + len(sh_blocks) == len(blocks)
    kinds = {}
    for b in yaml_blocks:
        kind = re.search(r"^kind: (\w+)$", b.code, re.M).group(1)
        name = re.search(r"^  name: ([\w-]+)", b.code, re.M).group(1)
        out = c.kubectl("apply", "-f", "-", input=b.code).stdout
        assert f"{kind.lower()}.basalt.dev/{name} created" in out, out
        kinds[kind] = name
    assert set(kinds) == {"Instance", "Cluster", "Table", "AppProfile"}, kinds

    c.wait(f"Cluster {kinds['Cluster']} Ready", lambda: c.ready("clusters", kinds["Cluster"]))
    inst = c.wait(f"Instance {kinds['Instance']} Ready", lambda: c.ready("instances", kinds["Instance"]))
    table = c.wait(f"Table {kinds['Table']} Ready", lambda: c.ready("tables", kinds["Table"]))
    assert set(table["status"]["columnFamilies"]) == {"details", "stats"}, table["status"]
    c.wait(f"AppProfile {kinds['AppProfile']} Ready", lambda: c.ready("appprofiles", kinds["AppProfile"]))
    assert inst["status"]["resourceName"] == "projects/acme/instances/orders-prod", inst["status"]
    pod = c.api.get(f"/api/v1/namespaces/default/pods/{kinds['Cluster']}-0")
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert "europe-west1-b" in json.dumps(terms)  # location: scheduled in the zone

    assert sh_blocks
    for b in sh_blocks:
        out = c.run(b.code).stdout
        assert "cbt" in b.code and kinds["Table"] in out.split(), out


# ---------------------------------------------------------------------- kubernetes-e2e.md


def test_kubernetes_e2e_md_test_command_excerpt():
    """The block that quotes the test command runs, and is a verbatim excerpt of it."""
    (b,) = docblocks.assigned("test_kubernetes_e2e_md_test_command_excerpt")
    script = (REPO / "e2e" / "run-tests").read_text()
    assert b.code in script, f"{b} is not an excerpt of e2e/run-tests:\n{b.code}"
    cp = subprocess.run(["bash", "-euo", "pipefail", "-c", b.code], cwd=REPO, capture_output=True,
                        text=True, timeout=1200)
    assert cp.returncode == 0, output_of(cp)
    assert cp.stdout.startswith("== Kubernetes control plane"), cp.stdout
    assert cp.stdout.strip().endswith(str(harness.bin_dir())), cp.stdout


@pytest.mark.timeout(RUNNING_IT_TIMEOUT + 120)
def test_kubernetes_e2e_md_running_it(background):
    """"Running it": build-control-plane, cargo build, check-manifests, then e2e/test_k8s.py
    (all of it, in the background of the other tests of this module)."""
    _, rc, log = joined(background, "test_kubernetes_e2e_md_running_it", RUNNING_IT_TIMEOUT)
    assert rc == 0, f"docs/kubernetes-e2e.md's Running it failed ({rc}):\n{log[-30000:]}"
    assert "check-manifests: done" in log, log[-5000:]
    summary = log.strip().splitlines()[-1]
    assert re.search(r"=+ \d+ passed", summary), summary
    assert not re.search(r"failed|error|skipped|deselected", summary), summary
    assert "test_k8s.py::test_two_replicas_elect_one_leader PASSED" in log, log[-5000:]


@pytest.mark.timeout(BY_HAND_TIMEOUT + 120)
def test_kubernetes_e2e_md_by_hand(background):
    """The by-hand session: `control-plane up --operator --detach` returns once ready, the
    quickstart becomes Ready, its pod has a 127.77.X.N address, cbt reads the (empty) table
    through it, and `control-plane down` stops it all."""
    job, rc, log = joined(background, "test_kubernetes_e2e_md_by_hand", BY_HAND_TIMEOUT)
    assert rc == 0, f"docs/kubernetes-e2e.md's by-hand block failed ({rc}):\n{log[-20000:]}"
    assert f"export KUBECONFIG={job.demo}/control-plane/admin.kubeconfig" in log, log
    assert re.search(r"^instance\.basalt\.dev/quickstart\s", log, re.M), log
    assert re.search(r"^quickstart-c1-0\s+1/1\s+Running\s.*\s127\.77\.\d+\.\d+\s", log, re.M), log
    assert "control-plane: stopped" in log, log
    assert not (job.demo / "control-plane.pid").exists()


# ------------------------------------------------------------------------ benchmarks.md


def bench_json(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith('{"by_op"')]


@pytest.mark.timeout(BENCH_TIMEOUT + 120)
def test_benchmarks_md(background):
    """docs/benchmarks.md: build, start a server, load 1,000,000 rows, YCSB A for 15 s; the
    storage benchmarks in their quicker form; a perf profile of point reads."""
    job, rc, log = joined(background, "test_benchmarks_md", BENCH_TIMEOUT)
    try:
        assert rc == 0, f"docs/benchmarks.md failed ({rc}):\n{log[-20000:]}"
        out = sections(log)
        assert [b.index for b in job.blocks] == sorted(out), out.keys()
        load_block, bench_block, perf_block = job.blocks
        assert "--workload load" in load_block.code and "cargo bench" in bench_block.code \
            and "perf record" in perf_block.code, job.blocks

        load, ycsb = bench_json(out[load_block.index])
        assert (load["workload"], load["by_op"]["load"]["rows"]) == ("load", 1_000_000), load
        assert load["errors"] == 0 and ycsb["errors"] == 0, (load, ycsb)
        assert ycsb["workload"] == "ycsb-a" and ycsb["ops"] > 0, ycsb

        # Every group of the doc's table was measured, Basalt's side and raw RocksDB's.
        table = (REPO / "docs/benchmarks.md").read_text().split("| group | Basalt | raw RocksDB |", 1)[1]
        groups = re.findall(r"^\| `(\w+)` \|", table.split("\n\n", 1)[0], re.M)
        assert groups, "no benchmark groups in docs/benchmarks.md's table"
        for g in groups:
            assert re.search(rf"^{g}/\S+\s+time:", out[bench_block.index], re.M), (g, out[bench_block.index][-6000:])

        (read,) = bench_json(out[perf_block.index])
        assert read["workload"] == "read" and read["errors"] == 0 and read["ops"] > 0, read
        assert re.search(r"^\s+[\d.]+%\s+basalt-tablet-server\s", out[perf_block.index], re.M), \
            out[perf_block.index][-6000:]
    finally:
        # The block's server runs in the background of the session: stopped as a reader's
        # Ctrl-C would stop it; it must go (and the ~2 GB of data with it).
        job.stop()

        def down():
            try:
                http_get(f"http://{job.http}/readyz", timeout=1)
                return False
            except OSError:
                return True

        harness.wait_for("the benchmark server to stop", down, timeout=60)


# ------------------------------------------------------------------------ monitoring.md


def test_monitoring_md(tmp_path):
    """docs/monitoring.md: the promtool block runs verbatim at the repository's top; the
    prometheus.yml block is a configuration `promtool check config` accepts, with its relative
    paths (the chart's rule file, the runtime's targets file) made absolute as Prometheus
    resolves them: against the file's directory, the repository's top."""
    blocks = docblocks.assigned("test_monitoring_md")
    yaml_blocks = [b for b in blocks if b.lang == "yaml"]
    sh_blocks = [b for b in blocks if b.lang == "sh"]
    assert len(yaml_blocks) == 1 and len(sh_blocks) == 1, blocks
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: apt-get install prometheus"

    cp = subprocess.run(["bash", "-euo", "pipefail", "-c", sh_blocks[0].code], cwd=REPO,
                        capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0 and "SUCCESS" in cp.stdout, output_of(cp)

    config = yaml_blocks[0].code
    for path in ("charts/basalt-operator/files/prometheus-rules.yaml", "basalt-local/prometheus-targets.json"):
        assert f"- {path}\n" in config, f"{yaml_blocks[0]} does not name {path}"
    config = config.replace("- charts/", f"- {REPO}/charts/").replace("- basalt-local/", f"- {tmp_path}/basalt-local/")
    (tmp_path / "prometheus.yml").write_text(config)
    cp = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")],
                        capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0 and "SUCCESS: 1 rule files found" in cp.stdout, output_of(cp)
