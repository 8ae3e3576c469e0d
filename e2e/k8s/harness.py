"""A real Kubernetes control plane on 127.0.0.1 for Basalt's end-to-end tests.

``ControlPlane`` runs etcd, kube-apiserver and kube-controller-manager (built by
``e2e/k8s/build-control-plane``) on free loopback ports with a throwaway CA, RBAC on, and
writes an admin kubeconfig (client certificate in ``system:masters``). ``Api`` is a small
JSON client for the API server (stdlib only). ``Kubectl`` runs the matching kubectl.

Nothing here listens on anything but 127.0.0.1, and everything lives in one temporary
directory that ``stop()`` leaves behind for debugging (logs) unless asked to remove it.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import sys
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

K8S_VERSION = "1.20.2"
HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE.parent))  # e2e/: ports.py, for a harness run from e2e/k8s alone
from ports import free_port  # noqa: E402


def cache_dir() -> Path:
    if os.environ.get("BASALT_K8S_CACHE"):
        return Path(os.environ["BASALT_K8S_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "basalt-k8s" / f"v{K8S_VERSION}"


def bin_dir() -> Path:
    return Path(os.environ.get("BASALT_K8S_BIN") or cache_dir() / "bin")


def etcd_binary() -> str | None:
    return os.environ.get("BASALT_ETCD") or shutil.which("etcd")


def missing_binaries() -> list[str]:
    """What the control plane needs but is not there (empty when all is present)."""
    missing = [str(bin_dir() / b) for b in ("kube-apiserver", "kube-controller-manager", "kubectl")
               if not os.access(bin_dir() / b, os.X_OK)]
    if not etcd_binary():
        missing.append("etcd (apt-get install etcd-server)")
    if not shutil.which("openssl"):
        missing.append("openssl")
    return missing


def tail(path: Path, max_bytes: int = 8000) -> str:
    try:
        data = Path(path).read_bytes()
    except OSError:
        return "<no log>"
    if len(data) > max_bytes:
        data = b"[...]\n" + data[-max_bytes:]
    return data.decode(errors="replace")


# ------------------------------------------------------------------------------ certificates


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def make_pki(d: Path) -> None:
    """A throwaway CA, the API server's serving certificate, an admin client certificate
    (O=system:masters) and the service-account signing key pair."""
    d.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
             "-days", "2", "-subj", "/CN=basalt-e2e-ca", cwd=d)

    def leaf(name: str, subj: str, ext: str) -> None:
        (d / f"{name}.ext").write_text(ext)
        _openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
                 "-out", f"{name}.csr", "-subj", subj, cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext",
                 cwd=d)

    leaf("apiserver", "/CN=kube-apiserver",
         "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
         "extendedKeyUsage=serverAuth\n"
         "subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,"
         "DNS:kubernetes.default,DNS:kubernetes.default.svc\n")
    leaf("admin", "/O=system:masters/CN=basalt-e2e-admin",
         "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
         "extendedKeyUsage=clientAuth\n")
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=d)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)


def write_kubeconfig(path: Path, server: str, ca_file: Path, *, cert: Path | None = None,
                     key: Path | None = None, token: str | None = None,
                     user: str = "user", namespace: str = "default") -> Path:
    """A kubeconfig (JSON is valid YAML) with the CA and either a client cert or a token."""
    u: dict = {}
    if cert:
        u["client-certificate-data"] = base64.b64encode(Path(cert).read_bytes()).decode()
        u["client-key-data"] = base64.b64encode(Path(key).read_bytes()).decode()
    if token:
        u["token"] = token
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "basalt-e2e", "cluster": {
            "server": server,
            "certificate-authority-data": base64.b64encode(Path(ca_file).read_bytes()).decode(),
        }}],
        "users": [{"name": user, "user": u}],
        "contexts": [{"name": "basalt-e2e", "context": {
            "cluster": "basalt-e2e", "user": user, "namespace": namespace}}],
        "current-context": "basalt-e2e",
    }
    path.write_text(json.dumps(cfg, indent=1))
    path.chmod(0o600)
    return path


# ----------------------------------------------------------------------------------- API client


class ApiError(Exception):
    def __init__(self, status: int, body: str, method: str, path: str):
        self.status = status
        self.body = body
        try:
            self.json = json.loads(body)
        except ValueError:
            self.json = {}
        super().__init__(f"{method} {path}: HTTP {status}: {self.json.get('message') or body[:500]}")


class Api:
    """JSON over HTTPS to the API server with the admin client certificate."""

    def __init__(self, server: str, ca: Path, cert: Path, key: Path):
        self.server = server.rstrip("/")
        self.ctx = ssl.create_default_context(cafile=str(ca))
        self.ctx.load_cert_chain(str(cert), str(key))

    def request(self, method: str, path: str, body=None, *, content_type="application/json",
                query: dict | None = None, timeout: float = 30.0):
        url = self.server + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            raise ApiError(e.code, e.read().decode(errors="replace"), method, path) from None
        return json.loads(raw) if raw else None

    def get(self, path: str, **query):
        return self.request("GET", path, query=query or None)

    def get_or_none(self, path: str):
        try:
            return self.get(path)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def post(self, path: str, body):
        return self.request("POST", path, body)

    def put(self, path: str, body):
        return self.request("PUT", path, body)

    def merge_patch(self, path: str, body):
        return self.request("PATCH", path, body, content_type="application/merge-patch+json")

    def delete(self, path: str, body=None, **query):
        return self.request("DELETE", path, body, query=query or None)

    def readyz(self) -> bool:
        try:
            req = urllib.request.Request(self.server + "/readyz")
            with urllib.request.urlopen(req, context=self.ctx, timeout=3) as resp:
                return resp.read().strip() == b"ok"
        except (OSError, urllib.error.URLError):
            return False


# --------------------------------------------------------------------------------- processes


class Proc:
    """A child process with its log file; ``stop()`` = SIGTERM, then SIGKILL."""

    def __init__(self, name: str, argv: list[str], log: Path, env: dict | None = None,
                 cwd: Path | None = None):
        self.name = name
        self.argv = argv
        self.log = log
        self.logf = open(log, "ab")
        self.p = subprocess.Popen(argv, stdout=self.logf, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, env=env, cwd=cwd,
                                  start_new_session=True)

    @property
    def pid(self) -> int:
        return self.p.pid

    def alive(self) -> bool:
        return self.p.poll() is None

    def check(self) -> None:
        if not self.alive():
            raise RuntimeError(f"{self.name} exited with {self.p.returncode}:\n{tail(self.log)}")

    def stop(self, timeout: float = 15.0) -> int | None:
        if self.alive():
            try:
                self.p.send_signal(signal.SIGTERM)
                self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(10)
            except ProcessLookupError:
                pass
        self.logf.close()
        return self.p.returncode


def wait_for(what: str, fn, timeout: float = 60.0, interval: float = 0.25, procs=()):
    """Polls ``fn`` until it returns something truthy; fails with ``what`` (and the last value
    or exception) after ``timeout`` seconds, or when one of ``procs`` has exited."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        for p in procs:
            p.check()
        try:
            last = fn()
            if last:
                return last
        except AssertionError:
            raise
        except Exception as e:  # noqa: BLE001 - reported on timeout
            last = e
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}")
        time.sleep(interval)


# ------------------------------------------------------------------------------ control plane


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager on 127.0.0.1, in ``workdir``."""

    SERVICE_CIDR = "10.0.0.0/24"

    def __init__(self, workdir: Path):
        self.dir = Path(workdir)
        self.pki = self.dir / "pki"
        self.logs = self.dir / "logs"
        self.procs: list[Proc] = []
        self.server = ""
        self.api: Api | None = None
        self.admin_kubeconfig = self.dir / "admin.kubeconfig"

    def start(self, timeout: float = 120.0) -> "ControlPlane":
        missing = missing_binaries()
        if missing:
            raise FileNotFoundError("control-plane binaries missing (run e2e/k8s/build-control-plane): "
                                    + ", ".join(missing))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        make_pki(self.pki)
        bins = bin_dir()

        # etcd
        etcd_port, peer_port = free_port(), free_port()
        etcd = Proc("etcd", [
            etcd_binary(), "--name", "basalt-e2e", "--data-dir", str(self.dir / "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
            "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-cluster", f"basalt-e2e=http://127.0.0.1:{peer_port}",
            "--listen-metrics-urls", f"http://127.0.0.1:{free_port()}",
            "--quota-backend-bytes", str(1 << 30), "--logger", "zap", "--log-outputs", "stderr",
        ], self.logs / "etcd.log")
        self.procs.append(etcd)

        def etcd_ok():
            with urllib.request.urlopen(f"http://127.0.0.1:{etcd_port}/health", timeout=2) as r:
                return json.loads(r.read()).get("health") == "true"

        wait_for("etcd /health", etcd_ok, timeout=30, procs=[etcd])

        # kube-apiserver
        port = free_port()
        self.server = f"https://127.0.0.1:{port}"
        p = self.pki
        apiserver = Proc("kube-apiserver", [
            str(bins / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            "--bind-address=127.0.0.1", f"--secure-port={port}", "--insecure-port=0",
            "--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none",
            f"--cert-dir={self.dir / 'apiserver-certs'}",
            f"--tls-cert-file={p / 'apiserver.crt'}", f"--tls-private-key-file={p / 'apiserver.key'}",
            f"--client-ca-file={p / 'ca.crt'}",
            "--authorization-mode=Node,RBAC",
            f"--service-account-key-file={p / 'sa.pub'}",
            f"--service-account-signing-key-file={p / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc",
            "--api-audiences=https://kubernetes.default.svc",
            f"--service-cluster-ip-range={self.SERVICE_CIDR}",
            # How it reaches kubelets (pods/portforward): 1.20 prefers a Node's Hostname
            # address, which nothing resolves here (the process kubelet's Node is
            # basalt-test-node); InternalIP first, as kubeadm sets it. No
            # --kubelet-certificate-authority: the kubelet's certificate is not verified.
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            "--allow-privileged=true", "--profiling=false",
            "--watch-cache=true", "--event-ttl=30m",
            "--v=0",
        ], self.logs / "kube-apiserver.log")
        self.procs.append(apiserver)
        self.api = Api(self.server, p / "ca.crt", p / "admin.crt", p / "admin.key")
        write_kubeconfig(self.admin_kubeconfig, self.server, p / "ca.crt",
                         cert=p / "admin.crt", key=p / "admin.key", user="admin")
        wait_for("kube-apiserver /readyz", self.api.readyz, timeout=timeout, interval=0.5,
                 procs=[etcd, apiserver])

        # kube-controller-manager: the StatefulSet, garbage-collector, service-account and
        # token, namespace, endpoints and PV controllers, ... (all defaults) except the node
        # lifecycle controller (the process kubelet's Node sends no heartbeats).
        kcm = Proc("kube-controller-manager", [
            str(bins / "kube-controller-manager"),
            f"--kubeconfig={self.admin_kubeconfig}",
            "--bind-address=127.0.0.1", "--secure-port=0", "--port=0",
            "--leader-elect=false",
            f"--service-account-private-key-file={p / 'sa.key'}",
            f"--root-ca-file={p / 'ca.crt'}",
            "--controllers=*,-nodelifecycle,-nodeipam,-cloud-node-lifecycle,-route,-service",
            f"--service-cluster-ip-range={self.SERVICE_CIDR}",
            "--concurrent-statefulset-syncs=5", "--concurrent-gc-syncs=5",
            "--v=0",
        ], self.logs / "kube-controller-manager.log")
        self.procs.append(kcm)

        # The service-account controller makes `default` in every namespace, the token
        # controller its token secret: both prove the controller manager works.
        def default_sa_token():
            sa = self.api.get_or_none("/api/v1/namespaces/default/serviceaccounts/default")
            return sa and sa.get("secrets")

        wait_for("the default ServiceAccount and its token (kube-controller-manager)",
                 default_sa_token, timeout=timeout, interval=0.5, procs=self.procs)
        return self

    def check(self) -> None:
        for p in self.procs:
            p.check()

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.stop()
        self.procs.clear()

    def logs_tail(self) -> str:
        return "\n".join(f"--- {f.name}\n{tail(f, 3000)}" for f in sorted(self.logs.glob("*.log")))


class Kubectl:
    def __init__(self, kubeconfig: Path):
        self.kubeconfig = Path(kubeconfig)
        self.binary = str(bin_dir() / "kubectl")
        # A discovery cache of its own (next to the kubeconfig), so nothing stale from other
        # runs on other API servers is used; `fresh()` drops it after CRDs change.
        self.cache = self.kubeconfig.parent / f"{self.kubeconfig.stem}.kubectl-cache"

    def fresh(self) -> "Kubectl":
        shutil.rmtree(self.cache, ignore_errors=True)
        return self

    def run(self, *args: str, input: str | None = None, check: bool = True,
            timeout: float = 60.0) -> subprocess.CompletedProcess:
        cp = subprocess.run([self.binary, f"--kubeconfig={self.kubeconfig}",
                             f"--cache-dir={self.cache}", *args],
                            input=input, capture_output=True, text=True, timeout=timeout)
        if check and cp.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed ({cp.returncode}):\n{cp.stderr}{cp.stdout}")
        return cp

    def json(self, *args: str):
        return json.loads(self.run(*args, "-o", "json").stdout)


# ----------------------------------------------------------------------------------- operator

OPERATOR_NAMESPACE = "basalt-system"
RELEASE = "basalt-operator"  # chart fullname == release name == ServiceAccount name
CHART = REPO / "charts" / "basalt-operator"
RBAC_TEMPLATES = ("serviceaccount.yaml", "clusterrole.yaml", "clusterrolebinding.yaml",
                  "role.yaml", "rolebinding.yaml")


def helm_binary() -> str | None:
    """The helm that e2e/check-manifests installs (or $HELM, or one on PATH)."""
    if os.environ.get("HELM"):
        return os.environ["HELM"]
    base = Path(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"))
    found = sorted((base / "basalt-tools").glob("helm-*/helm"))
    if found:
        return str(found[-1])
    return shutil.which("helm")


# CRD validation rules in CEL: Kubernetes 1.25+ (the chart needs them; 1.20 does not know them).
CEL = "x-kubernetes-validations"


def strip_cel(crd_yaml: str) -> str:
    """A CRD's YAML without its x-kubernetes-validations (CEL) lists: what a 1.20 API server
    keeps of it (it drops the field it does not know)."""
    out, skip = [], None
    for line in crd_yaml.splitlines(keepends=True):
        body = line.lstrip(" ")
        indent = len(line) - len(body)
        if skip is not None:
            if not body.strip() or indent > skip or (indent == skip and body.startswith("- ")):
                continue
            skip = None
        if body.startswith(CEL + ":"):
            skip = indent
            continue
        out.append(line)
    return "".join(out)


def chart_for_1_20(dst: Path, keep_kube_version: bool = False) -> Path:
    """A checkout (charts/basalt-operator, examples/, crds/) whose chart is the repository's
    without what Kubernetes 1.20 cannot take: the CRDs' CEL rules and Chart.yaml's
    ``kubeVersion: >=1.25.0-0``. Everything else is the chart's."""
    chart = dst / "charts" / "basalt-operator"
    shutil.copytree(CHART, chart)
    for crd in (chart / "crds").glob("*.yaml"):
        text = strip_cel(crd.read_text())
        assert CEL not in text and "openAPIV3Schema" in text, crd
        crd.write_text(text)
    if not keep_kube_version:
        meta = chart / "Chart.yaml"
        lines = meta.read_text().splitlines(keepends=True)
        kept = [line for line in lines if not line.startswith("kubeVersion:")]
        assert len(kept) == len(lines) - 1, "Chart.yaml has no kubeVersion line"
        meta.write_text("".join(kept))
    for d in ("examples", "crds"):
        (dst / d).symlink_to(REPO / d)
    return dst


def render_rbac(namespace: str = OPERATOR_NAMESPACE) -> str:
    """The chart's ServiceAccount, ClusterRole, Role and bindings as YAML, rendered by helm
    (`helm template --show-only`), or, without helm, from the same templates with their few
    template expressions substituted (the rules themselves are plain YAML)."""
    helm = helm_binary()
    if helm:
        args = [helm, "template", RELEASE, str(CHART), "--namespace", namespace]
        for t in RBAC_TEMPLATES:
            args += ["--show-only", f"templates/{t}"]
        env = dict(os.environ)
        tmp = cache_dir() / "helm-home"
        env.update(HELM_CONFIG_HOME=str(tmp / "config"), HELM_CACHE_HOME=str(tmp / "cache"),
                   HELM_DATA_HOME=str(tmp / "data"))
        return subprocess.run(args, check=True, capture_output=True, text=True, env=env).stdout
    import re

    docs = []
    for t in RBAC_TEMPLATES:
        out = []
        for line in (CHART / "templates" / t).read_text().splitlines():
            s = line.strip()
            if s.startswith("{{-") and ("if " in s or "end" in s or "with " in s or "toYaml" in s
                                       or "labels\" ." in s):
                continue
            if s in ("annotations:", "labels:"):
                continue
            line = re.sub(r'\{\{ include "basalt-operator\.(fullname|serviceAccountName)" \. \}\}',
                          RELEASE, line)
            line = line.replace("{{ .Release.Namespace }}", namespace)
            if "{{" in line:
                raise RuntimeError(f"cannot render {t} without helm: {line}")
            out.append(line)
        docs.append("\n".join(out))
    return "\n---\n".join(docs) + "\n"


def service_account_token(api: Api, namespace: str, name: str, timeout: float = 60.0) -> str:
    """The token of a ServiceAccount's kubernetes.io/service-account-token Secret (made by the
    token controller of kube-controller-manager 1.20)."""

    def token():
        sa = api.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}")
        for ref in sa.get("secrets") or []:
            sec = api.get_or_none(f"/api/v1/namespaces/{namespace}/secrets/{ref['name']}")
            if sec and sec.get("type") == "kubernetes.io/service-account-token" and \
                    sec.get("data", {}).get("token"):
                return base64.b64decode(sec["data"]["token"]).decode()
        return None

    return wait_for(f"the token of ServiceAccount {namespace}/{name}", token, timeout=timeout)


def operator_binary() -> Path:
    if os.environ.get("BASALT_OPERATOR_BIN"):
        return Path(os.environ["BASALT_OPERATOR_BIN"])
    if os.environ.get("BASALT_BIN"):
        return Path(os.environ["BASALT_BIN"]).parent / "basalt-operator"
    if os.environ.get("CARGO_TARGET_DIR"):
        return Path(os.environ["CARGO_TARGET_DIR"]) / "release" / "basalt-operator"
    return REPO / "target" / "release" / "basalt-operator"


class Operator:
    """`basalt-operator run` out of cluster, as the chart's ServiceAccount. ``env``: variables
    set in its environment besides ``KUBECONFIG`` (e.g. the autoscaler's timings,
    ``BASALT_AUTOSCALE_*_SECS``)."""

    def __init__(self, kubeconfig: Path, logdir: Path, identity: str,
                 storage_class: str = "standard", extra: tuple = (), env: dict | None = None):
        self.kubeconfig = kubeconfig
        self.identity = identity
        self.env = dict(env or {})
        self.metrics_port = free_port()
        self.keyviz_port = free_port()
        self.log = Path(logdir) / f"operator-{identity}.log"
        self.argv = [str(operator_binary()), "run",
                     "--lease-namespace", OPERATOR_NAMESPACE, "--identity", identity,
                     "--metrics-listen", f"127.0.0.1:{self.metrics_port}",
                     "--key-visualizer-listen", f"127.0.0.1:{self.keyviz_port}",
                     "--ssd-storage-class", storage_class, "--hdd-storage-class", storage_class,
                     "--lease-duration-secs", "6", *extra]
        self.proc: Proc | None = None

    def start(self) -> "Operator":
        env = {k: v for k, v in os.environ.items() if not k.startswith(("POD_", "KUBERNETES_"))}
        env.update(self.env)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env.setdefault("RUST_LOG", "info")
        self.proc = Proc(f"operator {self.identity}", self.argv, self.log, env=env)
        wait_for(f"operator {self.identity} /healthz", self.healthy, timeout=30, procs=[self.proc])
        return self

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/healthz", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return r.read().decode()

    def metric(self, name: str) -> float | None:
        for line in self.metrics().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        return None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        code = self.proc.stop(timeout=30)
        self.proc = None
        return code
