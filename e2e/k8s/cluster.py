"""A reader's Kubernetes cluster for end-to-end tests that use it as a user would (helm, kubectl,
clients "inside the cluster").

``KubeCluster`` is a Kubernetes 1.20.2 control plane (``harness.ControlPlane``) whose one node is
the process kubelet (``kubelet.ProcessKubelet``; with a ``kubelet.PodmanNode`` its pods run their
images in containers), kubectl 1.20 and helm first on ``PATH``, ``KUBECONFIG`` the admin's, HOME
and helm's directories of its own, and a checkout whose chart is the repository's minus what
1.20 cannot take (``harness.chart_for_1_20``). ``run`` runs a command inside the cluster (Service
names resolve, ``kubelet.in_cluster``); ``port_forward`` runs ``kubectl port-forward`` in the
background (``PortForward``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import harness
from kubelet import PodmanNode, ProcessKubelet, in_cluster


# With BASALT_K8S_E2E set (the test command sets it), a missing piece is a failure, not a skip.
REQUIRED = os.environ.get("BASALT_K8S_E2E", "") not in ("", "0")


def missing(server_binary: Path) -> list[str]:
    """What a ``KubeCluster`` needs and this machine lacks."""
    absent = harness.missing_binaries()
    for b in (server_binary, harness.operator_binary()):
        if not os.access(b, os.X_OK):
            absent.append(str(b))
    if not harness.helm_binary():
        absent.append("helm (e2e/check-manifests installs it)")
    if not shutil.which("unshare"):
        absent.append("unshare (util-linux)")
    return absent


def need(what: str, server_binary: Path) -> None:
    """Skips the calling test when a piece is missing, or fails it when ``REQUIRED``."""
    absent = missing(server_binary)
    if absent:
        why = f"{what}: missing " + ", ".join(absent)
        if REQUIRED:
            pytest.fail(why + " (BASALT_K8S_E2E is set)")
        pytest.skip(why + " (run e2e/k8s/build-control-plane, cargo build and e2e/check-manifests)")


def output_of(cp: subprocess.CompletedProcess) -> str:
    return f"--- stdout\n{cp.stdout}\n--- stderr\n{cp.stderr}"


class KubeCluster:
    def __init__(self, root: Path, server_binary: Path, *, node: PodmanNode | None = None,
                 node_labels: dict | None = None, wait: float = 90.0, run_timeout: float = 300.0):
        self.root = Path(root)
        self.server_binary = Path(server_binary)
        self.node = node
        self.node_labels = node_labels
        self.wait_timeout = wait
        self.run_timeout = run_timeout
        self.cp = harness.ControlPlane(self.root / "control-plane")
        self.kubelet: ProcessKubelet | None = None
        self.events: list[str] = []

    def log(self, msg: str) -> None:
        self.events.append(f"{time.strftime('%H:%M:%S')} {msg}")

    def start(self) -> "KubeCluster":
        self.cp.start()
        self.api = self.cp.api
        # Without a container runtime the chart's operator pod runs the operator binary.
        operator = None if self.node else harness.operator_binary()
        self.kubelet = ProcessKubelet(self.api, self.root / "kubelet", self.server_binary,
                                      operator_binary=operator, node_labels=self.node_labels,
                                      node=self.node, log=self.log).start()
        bin_dir = self.root / "bin"
        bin_dir.mkdir()
        (bin_dir / "kubectl").symlink_to(harness.bin_dir() / "kubectl")
        (bin_dir / "helm").symlink_to(harness.helm_binary())
        home = self.root / "home"
        home.mkdir()
        self.checkout = harness.chart_for_1_20(self.root / "checkout")
        self.env = {
            **{k: v for k, v in os.environ.items()
               if k not in ("KUBECONFIG", "BIGTABLE_EMULATOR_HOST") and not k.startswith("HELM_")},
            "PATH": os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ["PATH"]]),
            "KUBECONFIG": str(self.cp.admin_kubeconfig),
            "HOME": str(home),
            "HELM_CONFIG_HOME": str(self.root / "helm" / "config"),
            "HELM_CACHE_HOME": str(self.root / "helm" / "cache"),
            "HELM_DATA_HOME": str(self.root / "helm" / "data"),
        }
        return self

    def stop(self) -> None:
        try:
            if self.kubelet:
                self.kubelet.stop()
            self.cp.stop()
        finally:
            if self.node:
                self.node.cleanup()

    def run(self, code: str = "", *, argv: list[str] | None = None, cwd: Path | None = None,
            check: bool = True, env: dict | None = None,
            timeout: float | None = None) -> subprocess.CompletedProcess:
        """``code`` in bash (or ``argv``), inside the cluster, from the checkout."""
        hosts = self.kubelet.write_hosts(self.root / "hosts")
        argv = argv or ["bash", "-euo", "pipefail", "-c", code]
        cp = subprocess.run(in_cluster(argv, hosts), cwd=cwd or self.checkout, env={**self.env, **(env or {})},
                            capture_output=True, text=True, timeout=timeout or self.run_timeout)
        if check:
            assert cp.returncode == 0, (f"failed ({cp.returncode}):\n{code or ' '.join(argv)}\n"
                                        f"{output_of(cp)}\n{self.diagnostics()}")
        return cp

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        cp = subprocess.run(["kubectl", *args], input=input, env=self.env, cwd=self.checkout,
                            capture_output=True, text=True, timeout=300)
        if check:
            assert cp.returncode == 0, f"kubectl {' '.join(args)}:\n{output_of(cp)}"
        return cp

    def port_forward(self, ns: str, target: str, *ports: str) -> "PortForward":
        """``kubectl -n <ns> port-forward <target> LOCAL:REMOTE…`` in the background, once it
        forwards every local port (through the API server to the process kubelet's streaming
        server); ``stop()`` it."""
        pf = PortForward(["kubectl", "-n", ns, "port-forward", target, *ports], self.env, self.checkout)
        try:
            pf.wait_forwarding([int(p.split(":")[0]) for p in ports])
        except BaseException:
            pf.stop()
            raise
        return pf

    def wait(self, what: str, fn, timeout: float | None = None):
        def checked():
            self.cp.check()
            return fn()

        try:
            return harness.wait_for(what, checked, timeout=timeout or self.wait_timeout, interval=0.5)
        except TimeoutError as e:
            pytest.fail(f"{e}\n{self.diagnostics()}")

    def cr(self, plural: str, name: str, ns: str = "default"):
        return self.api.get_or_none(f"/apis/basalt.dev/v1alpha1/namespaces/{ns}/{plural}/{name}")

    def ready(self, plural: str, name: str, ns: str = "default"):
        """The custom resource when its Ready condition is True, else None."""
        obj = self.cr(plural, name, ns)
        c = next((c for c in ((obj or {}).get("status") or {}).get("conditions") or []
                  if c["type"] == "Ready"), None)
        return obj if c and c["status"] == "True" else None

    def ready_pods(self, ns: str, selector: str) -> list[dict]:
        """The pods of ``selector`` that are Ready and not being deleted."""
        pods = self.api.get(f"/api/v1/namespaces/{ns}/pods", labelSelector=selector)["items"]
        return [p for p in pods if not p["metadata"].get("deletionTimestamp") and any(
            c["type"] == "Ready" and c["status"] == "True" for c in (p.get("status") or {}).get("conditions") or [])]

    def diagnostics(self) -> str:
        parts = [self.cp.logs_tail()]
        for log in sorted((self.root / "kubelet" / "pod-logs").glob("*.log")):
            parts.append(f"--- pod {log.name}\n{harness.tail(log, 4000)}")
        if self.kubelet and self.kubelet.errors:
            parts.append("--- kubelet errors\n" + "\n".join(self.kubelet.errors[-3:]))
        parts.append("--- events\n" + "\n".join(self.events[-40:]))
        return "\n".join(parts)


class PortForward:
    """A ``kubectl port-forward`` process and what it printed."""

    def __init__(self, argv: list[str], env: dict, cwd: Path):
        self.argv = argv
        self.proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self._readers = [threading.Thread(target=self._read, args=(f, lines), daemon=True)
                         for f, lines in ((self.proc.stdout, self.stdout), (self.proc.stderr, self.stderr))]
        for t in self._readers:
            t.start()

    @staticmethod
    def _read(f, lines: list[str]) -> None:
        for line in f:
            lines.append(line.rstrip("\n"))

    def output(self) -> str:
        return "--- stdout\n" + "\n".join(self.stdout) + "\n--- stderr\n" + "\n".join(self.stderr)

    def wait_forwarding(self, local_ports: list[int], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not all(any(line.startswith(f"Forwarding from 127.0.0.1:{p} ->") for line in self.stdout)
                      for p in local_ports):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                for t in self._readers:
                    t.join(2)
                raise AssertionError(f"{' '.join(self.argv)}: not forwarding "
                                     f"(exit {self.proc.poll()}):\n{self.output()}")
            time.sleep(0.1)

    def stop(self, timeout: float = 15.0) -> int:
        """Ctrl-C (SIGINT), as a user stops it; SIGKILL after ``timeout``. Its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        for t in self._readers:
            t.join(5)
        return self.proc.returncode
