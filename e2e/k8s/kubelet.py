"""A process kubelet for Basalt's pods.

It acts as the scheduler and the kubelet for Pods labelled ``app.kubernetes.io/name=basalt``
(tablet servers) or ``app.kubernetes.io/name=basalt-operator`` (the Helm chart's operator) in
every namespace, without containers: each pod is a real binary started with the container's
command, args and env, on a loopback address of its own. The image says which binary: the
chart's operator image (``…/basalt-operator:<tag>``) runs ``basalt-operator`` (the
container's ``command`` is ``[basalt-operator, run]``), an etcd image (repository ending in
``etcd``, e.g. the metadata stores' ``registry.k8s.io/etcd``) Debian's ``/usr/bin/etcd``
(``$BASALT_ETCD``; the command word ``etcd`` is dropped, its flags kept), every other image
``basalt-tablet-server`` (``$BASALT_BIN``).

* Registers one Node (``basalt-test-node``, Ready) and binds pods to it (pods/binding).
* Expands ``$(VAR)`` in command and args from the container's env, as the kubelet does.
* Gives each pod a stable loopback IP (127.77.X.N, X random per kubelet, N by namespace/name,
  kept across restarts),
  rewrites ``0.0.0.0`` and the pod's own loopback ``127.0.0.1`` in listen flags (``--listen=``,
  ``--http-listen=``, ``--metrics-listen=``, ``--key-visualizer-listen=``, etcd's
  ``--listen-client-urls=``/``--listen-peer-urls=``) to it, and
  rewrites paths under a PersistentVolumeClaim's mountPath (``/var/lib/basalt``) to a
  directory of its own per claim (``<root>/pvc/<namespace>/<claim>``), kept across pod
  restarts as a volume would be, and removed when the PersistentVolumeClaim object is deleted.
* Stands in for cluster DNS in command lines (a process has no cluster DNS): a pod's stable
  DNS name under a headless Service, ``<pod>.<service>.<namespace>.svc`` (with or without
  ``.cluster.local``), is rewritten in every argument to that pod's loopback IP — the kubelet
  knows (or assigns, for a pod not seen yet) every pod's IP. That is how etcd members find their
  peers (``--initial-cluster=…``, the advertised URLs) and tablet servers their metadata store
  (``--etcd=http://<instance>-meta-0.<instance>-meta.<ns>.svc:2379``).
* Resolves env ``valueFrom.secretKeyRef``/``configMapKeyRef`` and ``envFrom`` (Secrets and
  ConfigMaps) by reading them, as the kubelet does; a missing one that is not optional keeps the
  pod waiting (CreateContainerConfigError) until it exists. Values are read at each start.
* Resolves env ``valueFrom.fieldRef`` for metadata.name/namespace/uid, status.podIP,
  spec.nodeName, and ``valueFrom.resourceFieldRef`` (``requests.cpu``, ``limits.memory``, …)
  as the kubelet does: the container's quantity divided by the divisor (default 1), rounded
  up; an unset limit is the node's allocatable, an unset request 0 (the API server has already
  defaulted a request to its limit when only the limit is set). E.g. the operator's
  ``BASALT_CPU_ALLOCATION_MILLICORES`` (``requests.cpu``, divisor ``1m``) of a pod requesting
  ``10m`` is ``10``.
* Mounts the ServiceAccount token the way a process can take it: when the pod has the token
  volume (ServiceAccount admission adds it unless automountServiceAccountToken is false), the
  process gets ``KUBECONFIG`` pointing to a kubeconfig with that Secret's token and CA (kube-rs'
  ``Config::infer`` reads ``KUBECONFIG`` first), so it talks to the API server as the pod's
  ServiceAccount, with exactly the RBAC it was granted.
* Writes pod status through pods/status: Running, podIP, hostIP, container status, and the
  conditions PodScheduled/Initialized/ContainersReady/Ready, Ready following the container's
  readiness probe (an HTTP GET of its path and port on the pod IP, as the kubelet would).
* Restarts a process that exits (restartPolicy Always), counting restarts.
* Serves ``kubectl port-forward`` as a kubelet does (``streaming.StreamingServer``): an HTTPS
  server on 127.0.0.1 (a self-signed certificate, a port of its own) announced in the Node's
  ``status.daemonEndpoints.kubeletEndpoint.Port``, to which the API server's ``pods/portforward``
  proxies the upgrade to ``/portForward/<namespace>/<pod>`` (the harness makes it prefer the
  Node's InternalIP, 127.0.0.1); over SPDY/3.1 each forwarded connection reaches the pod's IP
  and port, where the pod's process listens (its 127.0.0.1 was rewritten). No exec, attach or
  logs.
* On deletion (deletionTimestamp): SIGTERM, up to the pod's grace period, SIGKILL, then
  deletes the pod object (gracePeriodSeconds=0) so the StatefulSet controller recreates it.

With a ``PodmanNode`` (the node's container runtime, its own image store), pods run their
*images* instead: ``podman run --network=host`` on the pod's loopback IP, the container's command,
args and env, every volume mounted at its path (claims with the fsGroup's ownership, emptyDirs,
ConfigMaps, the ServiceAccount token with ``KUBERNETES_SERVICE_HOST``/``PORT`` naming the API
server), the security contexts (user, groups, read-only root, no new privileges, capabilities,
runAsNonRoot), ``podman stop`` on deletion. Only images loaded into the node run (no registry);
etcd images still run Debian's etcd as a process.

It polls the API server (every ``interval`` seconds) rather than watching: simple, and fast
enough for tests.
"""

from __future__ import annotations

import base64
import fcntl
import datetime
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import traceback
import urllib.parse
import urllib.request
from fractions import Fraction
from pathlib import Path

from harness import Api, ApiError, write_kubeconfig
from streaming import StreamingServer

NODE = "basalt-test-node"
SELECTOR = "app.kubernetes.io/name in (basalt,basalt-operator)"
IP_BASE = "127.77"
# The last path component of the Helm chart's operator image repository (values.yaml:
# image.repository, basalt/basalt-operator): pods of that image run basalt-operator.
OPERATOR_IMAGE_NAME = "basalt-operator"
# Pods of an image whose repository ends with this run etcd (the instances' metadata stores).
ETCD_IMAGE_SUFFIX = "etcd"
# A pod's DNS name under a headless Service: <pod>.<service>.<namespace>.svc[.cluster.local].
POD_DNS = re.compile(r"\b([a-z0-9]([-a-z0-9]*[a-z0-9])?)\.([a-z0-9]([-a-z0-9]*[a-z0-9])?)"
                     r"\.([a-z0-9]([-a-z0-9]*[a-z0-9])?)\.svc(\.cluster\.local)?\b")
# $(VAR) in command and args (the kubelet's expansion; $$ escapes).
ENV_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
SERVICE_ACCOUNT_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


NODE_LABELS = {"kubernetes.io/hostname": NODE, "kubernetes.io/os": "linux",
               "kubernetes.io/arch": "amd64", "basalt.dev/process-kubelet": "true"}
# The Node's capacity and allocatable (what an unset limit stands for in resourceFieldRefs).
NODE_ALLOCATABLE = {"cpu": "64", "memory": "256Gi", "pods": "250", "ephemeral-storage": "1Ti"}

# Kubernetes resource quantities (k8s.io/apimachinery resource.Quantity): a decimal number,
# then a binary suffix, a decimal suffix, or a decimal exponent.
QUANTITY = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
                      r"(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?$")
QUANTITY_SUFFIX = {None: Fraction(1), "n": Fraction(1, 10**9), "u": Fraction(1, 10**6),
                   "m": Fraction(1, 1000), "k": Fraction(10**3), "M": Fraction(10**6),
                   "G": Fraction(10**9), "T": Fraction(10**12), "P": Fraction(10**15),
                   "E": Fraction(10**18), "Ki": Fraction(2**10), "Mi": Fraction(2**20),
                   "Gi": Fraction(2**30), "Ti": Fraction(2**40), "Pi": Fraction(2**50),
                   "Ei": Fraction(2**60)}


def image_name(image: str) -> str:
    """The last path component of an image reference, without tag or digest."""
    name = image.split("@", 1)[0].rsplit("/", 1)[-1]
    return name.split(":", 1)[0]


def expand_env(arg: str, env: dict) -> str:
    """``$(VAR)`` replaced by ``env[VAR]`` (left as is when undefined), ``$$`` by ``$``."""
    def one(m):
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return ENV_REF.sub(one, arg)


def parse_quantity(q) -> Fraction:
    """A resource quantity (``"10m"``, ``"1.5"``, ``"256Gi"``, ``"1e3"``, or a number) exactly."""
    m = QUANTITY.match(str(q).strip())
    if not m:
        raise ValueError(f"not a resource quantity: {q!r}")
    number, suffix = Fraction(m.group(1)), m.group(2)
    if suffix and suffix[0] in "eE":
        return number * Fraction(10) ** int(suffix[1:])
    return number * QUANTITY_SUFFIX[suffix]


def resource_field_value(selector: dict, container: dict,
                         allocatable: dict = NODE_ALLOCATABLE) -> str:
    """An env ``valueFrom.resourceFieldRef`` as the kubelet resolves it
    (``ExtractContainerResourceValue`` after ``defaultPodLimitsForDownwardAPI``): the container's
    request or limit over the divisor (default ``1``), rounded up — for CPU in whole
    millicores first (``MilliValue``), for memory and ephemeral storage in whole bytes. An unset
    limit is the node's allocatable; an unset request is 0 (a request left out next to a limit
    was set to the limit by the API server's defaulting)."""
    kind, _, resource = selector["resource"].partition(".")
    if kind not in ("requests", "limits") or resource not in ("cpu", "memory", "ephemeral-storage"):
        raise ValueError(f"unsupported container resource: {selector['resource']}")
    given = ((container.get("resources") or {}).get(kind) or {}).get(resource)
    if given is None and kind == "limits":
        given = allocatable.get(resource)
    value = parse_quantity(given) if given is not None else Fraction(0)
    divisor = parse_quantity(selector.get("divisor") or "1")
    if divisor == 0:
        divisor = Fraction(1)
    if resource == "cpu":
        # ceil(MilliValue(q) / MilliValue(divisor)); MilliValue rounds up.
        return str(math.ceil(Fraction(math.ceil(value * 1000), math.ceil(divisor * 1000))))
    return str(math.ceil(Fraction(math.ceil(value), math.ceil(divisor))))


def default_etcd_binary() -> Path:
    return Path(os.environ.get("BASALT_ETCD") or shutil.which("etcd") or "/usr/bin/etcd")


def _match(expr: dict, labels: dict = NODE_LABELS) -> bool:
    have = labels.get(expr["key"])
    op, values = expr["operator"], expr.get("values") or []
    if op == "In":
        return have in values
    if op == "NotIn":
        return have not in values
    if op == "Exists":
        return have is not None
    if op == "DoesNotExist":
        return have is None
    return False


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def normalize_image(ref: str) -> str:
    """An image reference as container runtimes name it: ``basalt/x:1`` is
    ``docker.io/basalt/x:1``, ``x`` is ``docker.io/library/x:latest``."""
    name, sep, digest = ref.partition("@")
    first = name.split("/")[0]
    if "/" not in name:
        name = f"docker.io/library/{name}"
    elif "." not in first and ":" not in first and first != "localhost":
        name = f"docker.io/{name}"
    if not sep and ":" not in name.rsplit("/", 1)[-1]:
        name += ":latest"
    return name + sep + digest


class PodmanNode:
    """The node's container runtime and image store: podman with storage of its own
    (``--root`` under ``root``, a short ``--runroot`` under /tmp), as a kind node's containerd has images of its
    own. ``load`` is what ``kind load image-archive`` does; pods can run only what was loaded
    (``--pull=never``: the node reaches no registry). Containers use the host's network, so a
    container binds its pod's loopback IP as the process would."""

    def __init__(self, root: Path, run_flags: list[str] | tuple = ()):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        # podman refuses a runroot longer than 50 characters: a short one under /tmp.
        self.runroot = Path(tempfile.mkdtemp(prefix="basalt-node-", dir="/tmp"))
        self.base = ["podman", "--root", str(self.root / "storage"), "--runroot", str(self.runroot)]
        # Flags every `podman run` takes (e.g. --runtime, --ulimit for a restricted sandbox).
        self.run_flags = list(run_flags)

    def podman(self, *args: str) -> list[str]:
        return [*self.base, *args]

    def podman_run(self, *args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
        cp = subprocess.run(self.podman(*args), capture_output=True, text=True, timeout=timeout)
        if check and cp.returncode != 0:
            raise RuntimeError(f"podman {' '.join(args)} exited {cp.returncode}: {cp.stderr.strip()}")
        return cp

    def load(self, archive: Path) -> list[str]:
        """Loads an image archive into the node's store; returns the names it loaded."""
        out = self.podman_run("load", "--input", str(archive), timeout=300).stdout
        return re.findall(r"^Loaded image(?:\(s\))?: (.+)$", out, re.M)

    def image_id(self, image: str) -> str | None:
        """``sha256:<config digest>`` of an image in the node's store, None when absent."""
        cp = self.podman_run("image", "inspect", "--format", "{{.Id}}", normalize_image(image), check=False)
        return f"sha256:{cp.stdout.strip()}" if cp.returncode == 0 else None

    def image_user(self, image: str) -> str:
        return self.podman_run("image", "inspect", "--format", "{{.Config.User}}",
                               normalize_image(image)).stdout.strip()

    def containers(self) -> list[dict]:
        """The running containers: name, image, image ID, user, state."""
        out = self.podman_run("ps", "--format", "json").stdout
        return json.loads(out or "[]")

    def cleanup(self) -> None:
        """Removes every container and image, then the store."""
        self.podman_run("rm", "--all", "--force", "--time", "0", check=False, timeout=120)
        self.podman_run("rmi", "--all", "--force", check=False, timeout=120)
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.rmtree(self.runroot, ignore_errors=True)


class SecretMissing(Exception):
    """A pod's Secret volume, or a Secret or ConfigMap its env refers to, does not exist (yet):
    it waits."""


# What the kubelet accepts as an environment variable's name from envFrom.
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")


# How often the Secret volumes of a running pod are brought up to date.
SECRET_REFRESH = 5.0


class PodProc:
    def __init__(self, pod: dict):
        self.uid = pod["metadata"]["uid"]
        self.ns = pod["metadata"]["namespace"]
        self.name = pod["metadata"]["name"]
        self.proc: subprocess.Popen | None = None
        self.logf = None
        self.restarts = 0
        self.started_at = now()
        self.ready = None  # last reported readiness
        self.reported_restarts = -1
        self.reported_waiting: tuple[str, str] | None = None
        self.terminating = False
        self.probe: tuple[str, int] | None = None
        self.next_start = 0.0
        self.waiting: tuple[str, str] | None = None  # why it is not running (reason, message)
        self.container: str | None = None  # the container's name (container runtime)
        self.image_id: str | None = None
        self.secrets_refreshed = 0.0


def _claim_ip_block() -> tuple[int, int]:
    """A third octet X for this kubelet's pod IPs, and the descriptor of the lock that keeps
    it: X is picked at random among those no live kubelet on this machine holds."""
    locks = Path(tempfile.gettempdir()) / "basalt-kubelet-ips"
    locks.mkdir(exist_ok=True)
    for x in random.sample(range(1, 255), 254):
        fd = os.open(locks / str(x), os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return x, fd
        except BlockingIOError:
            os.close(fd)
    raise RuntimeError("every 127.77.X block is held by a running kubelet")


class ProcessKubelet:
    def __init__(self, api: Api, root: Path, binary: Path, interval: float = 0.5,
                 log=lambda msg: None, operator_binary: Path | None = None,
                 node_labels: dict | None = None, etcd_binary: Path | None = None,
                 node: "PodmanNode | None" = None):
        self.api = api
        # The node's container runtime: with one, pods run their images (except etcd images);
        # without, the binaries run as processes.
        self.node = node
        self.root = Path(root)
        self.binary = Path(binary)
        # The binary for pods of an etcd image.
        self.etcd_binary = Path(etcd_binary) if etcd_binary else default_etcd_binary()
        # The binary for pods of the chart's operator image (None: such pods fail to start).
        self.operator_binary = Path(operator_binary) if operator_binary else None
        # Extra labels of the Node, e.g. topology.kubernetes.io/zone for zone-pinned Clusters.
        self.node_labels = {**NODE_LABELS, **(node_labels or {})}
        # The Node's allocatable resources (an unset limit in a resourceFieldRef stands for them).
        self.node_allocatable = dict(NODE_ALLOCATABLE)
        self.interval = interval
        self.log = log
        self.pods: dict[str, PodProc] = {}  # by uid
        self.ips: dict[str, str] = {}  # "ns/name" -> ip
        self.seen_pvcs: dict[str, str] = {}  # "ns/name" -> uid
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.thread: threading.Thread | None = None
        self.errors: list[str] = []
        # The streaming server (kubectl port-forward through the API server), once started.
        self.streaming: StreamingServer | None = None
        # Pod IPs 127.77.X.N: X differs between kubelets, so servers left over from a run that
        # was killed (they run in their own sessions) do not hold this run's addresses, and
        # kubelets running at the same time (the doc tests run up to three control planes)
        # never share one: each holds a lock on its X for its lifetime.
        self._ip_lock = _claim_ip_block()
        self.ip_prefix = f"{IP_BASE}.{self._ip_lock[0]}."
        (self.root / "pvc").mkdir(parents=True, exist_ok=True)
        (self.root / "pod-logs").mkdir(parents=True, exist_ok=True)

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> "ProcessKubelet":
        self.streaming = StreamingServer(self.root / "streaming", self.streaming_target, NODE,
                                         log=self.log).start()
        self.register_node()
        self.thread = threading.Thread(target=self._loop, name="process-kubelet", daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        if self.thread:
            self.thread.join(30)
        with self.lock:
            pods = list(self.pods.values())
        for pp in pods:
            self._kill(pp, grace=5)
        if self.streaming:
            self.streaming.stop()
        if self._ip_lock:
            os.close(self._ip_lock[1])
            self._ip_lock = None

    def register_node(self) -> None:
        node = {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": NODE, "labels": dict(self.node_labels)},
        }
        try:
            self.api.post("/api/v1/nodes", node)
        except ApiError as e:
            if e.status != 409:
                raise
        cap = dict(self.node_allocatable)
        t = now()
        self.api.merge_patch(f"/api/v1/nodes/{NODE}/status", {"status": {
            "capacity": cap, "allocatable": cap,
            # The API server reaches the kubelet at the address of the first of its
            # --kubelet-preferred-address-types the Node has (the harness: InternalIP first) and
            # the port of daemonEndpoints: pods/portforward goes to the streaming server.
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                          {"type": "Hostname", "address": NODE}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.streaming.port if self.streaming else 0}},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "process kubelet", "lastHeartbeatTime": t,
                            "lastTransitionTime": t}],
            "nodeInfo": {"kubeletVersion": "v1.20.2", "kubeProxyVersion": "v1.20.2",
                         "operatingSystem": "linux", "architecture": "amd64",
                         "containerRuntimeVersion": "process://basalt", "osImage": "",
                         "kernelVersion": "", "machineID": "", "systemUUID": "", "bootID": ""},
        }})

    def _loop(self) -> None:
        while not self.stop_event.is_set():
            try:
                self.sync()
            except Exception:  # noqa: BLE001 - keep going; tests see self.errors
                msg = traceback.format_exc()
                self.errors.append(msg)
                self.log(f"kubelet sync error: {msg}")
            self.stop_event.wait(self.interval)

    # ---------------------------------------------------------------------- sync

    def sync(self) -> None:
        pods = self.api.get("/api/v1/pods", labelSelector=SELECTOR)["items"]
        pvcs = self.api.get("/api/v1/persistentvolumeclaims")["items"]
        live_uids = set()
        for pod in pods:
            uid = pod["metadata"]["uid"]
            live_uids.add(uid)
            try:
                self.sync_pod(pod)
            except ApiError as e:
                if e.status not in (404, 409):
                    raise
        # Pods gone from the API (force-deleted) but still running here.
        with self.lock:
            gone = [pp for uid, pp in self.pods.items() if uid not in live_uids and not pp.terminating]
        for pp in gone:
            pp.terminating = True
            threading.Thread(target=self._kill_and_forget, args=(pp, 30), daemon=True).start()
        self.sync_pvcs(pvcs)

    def sync_pvcs(self, pvcs: list[dict]) -> None:
        current = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p["metadata"]["uid"]
                   for p in pvcs}
        for key, uid in list(self.seen_pvcs.items()):
            if current.get(key) != uid:
                # The claim was deleted (or replaced by a new one): its volume goes with it.
                ns, name = key.split("/", 1)
                if not self._claim_in_use(ns, name):
                    shutil.rmtree(self.claim_dir(ns, name), ignore_errors=True)
                    self.log(f"kubelet: PVC {key} deleted: removed its data dir")
                    del self.seen_pvcs[key]
        for key, uid in current.items():
            self.seen_pvcs.setdefault(key, uid)

    def _claim_in_use(self, ns: str, claim: str) -> bool:
        with self.lock:
            pods = [pp for pp in self.pods.values() if pp.ns == ns and pp.proc and pp.proc.poll() is None]
        return any(claim.endswith("-" + pp.name) for pp in pods)

    def claim_dir(self, ns: str, claim: str) -> Path:
        return self.root / "pvc" / ns / claim

    def streaming_target(self, ns: str, name: str) -> tuple[str, str] | None:
        """The IP and uid of a pod this kubelet runs (not being deleted), or None: where the
        streaming server forwards a port-forward of ``ns/name`` to."""
        with self.lock:
            for pp in self.pods.values():
                if pp.ns == ns and pp.name == name and not pp.terminating and f"{ns}/{name}" in self.ips:
                    return self.ips[f"{ns}/{name}"], pp.uid
        return None

    def pod_ip(self, ns: str, name: str) -> str:
        key = f"{ns}/{name}"
        with self.lock:
            if key not in self.ips:
                n = len(self.ips) + 2
                if n > 254:
                    raise RuntimeError("out of loopback pod IPs")
                self.ips[key] = self.ip_prefix + str(n)
            return self.ips[key]

    def sync_pod(self, pod: dict) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        ns, name, uid = meta["namespace"], meta["name"], meta["uid"]
        path = f"/api/v1/namespaces/{ns}/pods/{name}"
        with self.lock:
            pp = self.pods.get(uid)

        if meta.get("deletionTimestamp"):
            if pp is None:
                self.api.delete(path, {"kind": "DeleteOptions", "apiVersion": "v1",
                                       "gracePeriodSeconds": 0,
                                       "preconditions": {"uid": uid}})
            elif not pp.terminating:
                pp.terminating = True
                grace = spec.get("terminationGracePeriodSeconds", 30)
                threading.Thread(target=self._terminate, args=(pp, grace, path),
                                 daemon=True).start()
            return

        if not spec.get("nodeName"):
            why = self.unschedulable(spec)
            if why:
                cond = (pod.get("status") or {}).get("conditions") or []
                if not any(c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
                           for c in cond):
                    self.api.merge_patch(f"{path}/status", {"status": {
                        "phase": "Pending", "conditions": [{
                            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                            "message": f"0/1 nodes are available: {why}",
                            "lastTransitionTime": now()}]}})
                return
            self.api.post(f"{path}/binding", {
                "apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": name, "namespace": ns, "uid": uid},
                "target": {"apiVersion": "v1", "kind": "Node", "name": NODE}})
            return  # next round sees the bound pod

        if pp is None:
            pp = PodProc(pod)
            with self.lock:
                self.pods[uid] = pp
            self._start(pp, pod)
            self._report(pp, pod, ready=False)
            return

        if pp.proc is not None and pp.proc.poll() is not None:
            code = pp.proc.returncode
            self.log(f"kubelet: {ns}/{name} exited with {code}; restarting")
            pp.proc = None
            pp.restarts += 1
            pp.next_start = time.monotonic() + min(10, 2 ** min(pp.restarts, 4) / 4)
        if pp.proc is None:
            if time.monotonic() >= pp.next_start:
                self._start(pp, pod)
            ready = False
        else:
            ready = self._probe(pp)
            if time.monotonic() - pp.secrets_refreshed > SECRET_REFRESH:
                pp.secrets_refreshed = time.monotonic()
                self._refresh_secrets(pod)
        if ready != pp.ready or pp.restarts != pp.reported_restarts or pp.waiting != pp.reported_waiting:
            self._report(pp, pod, ready=ready)

    # ---------------------------------------------------------------- scheduling

    def unschedulable(self, spec: dict) -> str | None:
        """Why the one node does not fit the pod's nodeSelector or required node affinity
        (None when it fits). Preferred terms, spread constraints and resources are ignored."""
        for k, v in (spec.get("nodeSelector") or {}).items():
            if self.node_labels.get(k) != v:
                return f"1 node(s) didn't match node selector {k}={v}"
        req = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
               .get("requiredDuringSchedulingIgnoredDuringExecution"))
        if req:
            terms = req.get("nodeSelectorTerms") or []
            if not any(all(_match(e, self.node_labels) for e in t.get("matchExpressions") or [])
                       for t in terms):
                return "1 node(s) didn't match Pod's node affinity"
        return None

    # ----------------------------------------------------------------- processes

    def _start(self, pp: PodProc, pod: dict) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        ns, name = meta["namespace"], meta["name"]
        c = spec["containers"][0]
        ip = self.pod_ip(ns, name)
        image = c.get("image", "")
        in_container = self.node is not None and not image_name(image).endswith(ETCD_IMAGE_SUFFIX)

        fields = {"metadata.name": name, "metadata.namespace": ns, "metadata.uid": meta["uid"],
                  "status.podIP": ip, "spec.nodeName": NODE, "status.hostIP": "127.0.0.1"}
        try:
            container_env = self._container_env(pod, c, fields)
        except SecretMissing as e:
            # As the kubelet: the container is not created until its env can be resolved.
            pp.waiting = ("CreateContainerConfigError", str(e))
            pp.next_start = time.monotonic() + 1
            return

        # Volumes. In a container they are mounted at their paths; a process instead sees the
        # PVC mount paths in its arguments rewritten to the claim's directory.
        try:
            mounts = self._volumes(pod, c, in_container)
        except SecretMissing as e:
            pp.waiting = ("ContainerCreating", str(e))
            pp.next_start = time.monotonic() + 1
            return
        pp.secrets_refreshed = time.monotonic()

        args = []
        for a in list(c.get("command") or [])[1:] + list(c.get("args") or []):
            a = expand_env(a, container_env)
            if a.startswith("--") and "listen" in a.split("=", 1)[0]:
                # A pod's own loopback is its address here (pods share the host's).
                a = a.replace("0.0.0.0:", f"{ip}:").replace("127.0.0.1:", f"{ip}:")
            if not in_container:
                for mp, (d, _) in mounts.items():
                    if mp + "/" in a or a.endswith(mp):
                        a = a.replace(mp, d)
            a = POD_DNS.sub(lambda m: self.pod_ip(m.group(5), m.group(1)), a)
            args.append(a)
        rp = c.get("readinessProbe", {}).get("httpGet")
        if rp:
            port = rp.get("port")
            if isinstance(port, str):
                port = next((p["containerPort"] for p in c.get("ports", []) if p.get("name") == port), None)
            pp.probe = (rp.get("path", "/"), int(port)) if port else None

        log = self.root / "pod-logs" / f"{ns}_{name}.log"
        if pp.logf is None:
            pp.logf = open(log, "ab")
        if in_container:
            argv = self._container_argv(pp, pod, c, image, args, container_env, mounts)
            if argv is None:
                return
        else:
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.root), **container_env}
            kubeconfig = self.service_account_kubeconfig(pod, c)
            if kubeconfig:
                env["KUBECONFIG"] = str(kubeconfig)
            argv = [str(self.binary_for(image)), *args]
        pp.waiting = None
        pp.logf.write(f"=== {now()} start #{pp.restarts}: {' '.join(argv)}\n".encode())
        pp.logf.flush()
        pp.proc = subprocess.Popen(argv, env=None if in_container else env, stdout=pp.logf,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   cwd=str(self.root), start_new_session=True)
        pp.started_at = now()
        self.log(f"kubelet: started {ns}/{name} pid {pp.proc.pid} on {ip}"
                 + (f" in container {pp.container}" if in_container else ""))

    def _container_env(self, pod: dict, c: dict, fields: dict) -> dict[str, str]:
        """The container's environment as the kubelet builds it: ``envFrom`` (Secrets and
        ConfigMaps, each key with its ``prefix``; keys that are not variable names skipped),
        then ``env``, later entries winning: ``value``, ``valueFrom.fieldRef``,
        ``resourceFieldRef``, ``secretKeyRef`` and ``configMapKeyRef``. A Secret, ConfigMap or
        key that is missing and not ``optional`` raises ``SecretMissing`` (the pod waits with
        CreateContainerConfigError)."""
        ns = pod["metadata"]["namespace"]

        def source(kind: str, name: str, optional: bool) -> dict[str, str] | None:
            path = "secrets" if kind == "Secret" else "configmaps"
            obj = self.api.get_or_none(f"/api/v1/namespaces/{ns}/{path}/{name}")
            if obj is None:
                if optional:
                    return None
                raise SecretMissing(f"{kind.lower()} {ns}/{name} not found")
            if kind == "Secret":
                return {k: base64.b64decode(v).decode() for k, v in (obj.get("data") or {}).items()}
            return dict(obj.get("data") or {})

        env: dict[str, str] = {}
        for f in c.get("envFrom") or []:
            kind, ref = ("Secret", f["secretRef"]) if f.get("secretRef") else ("ConfigMap", f.get("configMapRef") or {})
            data = source(kind, ref["name"], bool(ref.get("optional"))) or {}
            for k, v in data.items():
                if ENV_NAME.match(f.get("prefix", "") + k):
                    env[f.get("prefix", "") + k] = v
        for e in c.get("env") or []:
            vf = e.get("valueFrom") or {}
            if "value" in e:
                env[e["name"]] = e["value"]
            elif vf.get("fieldRef"):
                env[e["name"]] = fields.get(vf["fieldRef"]["fieldPath"], "")
            elif vf.get("resourceFieldRef"):
                ref = vf["resourceFieldRef"]
                named = ref.get("containerName")
                of = next((x for x in pod["spec"]["containers"] if x["name"] == named), c) if named else c
                env[e["name"]] = resource_field_value(ref, of, self.node_allocatable)
            elif vf.get("secretKeyRef") or vf.get("configMapKeyRef"):
                kind, ref = ("Secret", vf["secretKeyRef"]) if vf.get("secretKeyRef") else ("ConfigMap", vf["configMapKeyRef"])
                optional = bool(ref.get("optional"))
                data = source(kind, ref["name"], optional)
                if data is not None and ref["key"] in data:
                    env[e["name"]] = data[ref["key"]]
                elif not optional:
                    raise SecretMissing(f"couldn't find key {ref['key']} in {kind} {ns}/{ref['name']}")
            else:
                env[e["name"]] = ""
        return env

    def _volumes(self, pod: dict, c: dict, in_container: bool) -> dict[str, tuple[str, bool]]:
        """The container's volume mounts: mountPath -> (host directory, read-only). A process
        gets only its claims (paths in its arguments are rewritten to them); a container gets
        every volume: claims, emptyDirs, ConfigMaps and the ServiceAccount token."""
        meta, spec = pod["metadata"], pod["spec"]
        ns, name, uid = meta["namespace"], meta["name"], meta["uid"]
        fs_group = (spec.get("securityContext") or {}).get("fsGroup")
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        mounts = {}
        for m in c.get("volumeMounts", []):
            v = volumes.get(m["name"], {})
            path, ro = m["mountPath"].rstrip("/"), bool(m.get("readOnly"))
            if (v.get("secret") or {}).get("secretName") and path != SERVICE_ACCOUNT_MOUNT:
                # A Secret volume (a secured Instance's certificates): its keys as files, for a
                # process too (its arguments name them under the mount path, rewritten).
                mounts[path] = (str(self._secret_dir(ns, uid, m["name"], v["secret"])), True)
            elif v.get("persistentVolumeClaim"):
                d = self.claim_dir(ns, v["persistentVolumeClaim"]["claimName"])
                d.mkdir(parents=True, exist_ok=True)
                if in_container and fs_group is not None:
                    # The kubelet's volume ownership for fsGroup: the group owns the volume,
                    # may write it, and new files inherit the group (setgid).
                    os.chown(d, -1, fs_group)
                    d.chmod(0o2775)
                mounts[path] = (str(d), ro)
            elif not in_container:
                continue
            elif "emptyDir" in v:
                d = self.root / "emptydir" / uid / m["name"]
                d.mkdir(parents=True, exist_ok=True)
                d.chmod(0o1777)
                mounts[path] = (str(d), ro)
            elif v.get("configMap"):
                mounts[path] = (str(self._config_map_dir(ns, uid, m["name"], v["configMap"])), True)
            elif path == SERVICE_ACCOUNT_MOUNT and (v.get("secret") or {}).get("secretName"):
                mounts[path] = (str(self._service_account_dir(pod, v["secret"]["secretName"])), True)
            else:
                raise RuntimeError(f"pod {ns}/{name}: volume {m['name']} of a kind this kubelet "
                                   f"cannot mount: {sorted(v)}")
        return mounts

    def _config_map_dir(self, ns: str, uid: str, volume: str, source: dict) -> Path:
        """A ConfigMap volume: one file per key (an optional ConfigMap that does not exist is an
        empty directory, as the kubelet mounts it)."""
        d = self.root / "configmap" / uid / volume
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        cm = self.api.get_or_none(f"/api/v1/namespaces/{ns}/configmaps/{source['name']}")
        if cm is None and not source.get("optional"):
            raise RuntimeError(f"configmap {ns}/{source['name']} not found")
        for key, value in ((cm or {}).get("data") or {}).items():
            (d / key).write_text(value)
            (d / key).chmod(0o644)
        return d

    def _refresh_secrets(self, pod: dict) -> None:
        """The running pod's Secret volumes brought up to date (a renewed certificate)."""
        meta = pod["metadata"]
        volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
        for m in pod["spec"]["containers"][0].get("volumeMounts", []):
            source = volumes.get(m["name"], {}).get("secret") or {}
            if source.get("secretName") and m["mountPath"].rstrip("/") != SERVICE_ACCOUNT_MOUNT:
                try:
                    self._secret_dir(meta["namespace"], meta["uid"], m["name"], source)
                except SecretMissing:
                    pass

    def _secret_dir(self, ns: str, uid: str, volume: str, source: dict) -> Path:
        """A Secret volume: one file per key with the volume's defaultMode, written anew at
        each (re)start and refreshed by ``sync`` while the pod runs (the kubelet updates a
        mounted Secret in place). A Secret that does not exist yet keeps the pod waiting, as
        the kubelet does (ContainerCreating), unless the volume is optional."""
        d = self.root / "secret" / uid / volume
        secret = self.api.get_or_none(f"/api/v1/namespaces/{ns}/secrets/{source['secretName']}")
        if secret is None and not source.get("optional"):
            raise SecretMissing(f"secret {ns}/{source['secretName']} not found")
        d.mkdir(parents=True, exist_ok=True)
        mode = source.get("defaultMode", 0o644)
        # A process runs as this user: the files stay readable by it whatever the mode says.
        mode |= 0o400
        for key, value in ((secret or {}).get("data") or {}).items():
            data = base64.b64decode(value)
            f = d / key
            if f.exists() and f.read_bytes() == data:
                continue
            tmp = d / f".{key}.tmp"
            tmp.write_bytes(data)
            tmp.chmod(mode)
            tmp.replace(f)
        return d

    def _service_account_secret(self, pod: dict, secret_name: str) -> dict:
        ns = pod["metadata"]["namespace"]
        data = self.api.get(f"/api/v1/namespaces/{ns}/secrets/{secret_name}").get("data") or {}
        return {k: base64.b64decode(v) for k, v in data.items()}

    def _service_account_dir(self, pod: dict, secret_name: str) -> Path:
        """The token volume as a container sees it: token, ca.crt and namespace files."""
        data = self._service_account_secret(pod, secret_name)
        d = self.root / "serviceaccount" / pod["metadata"]["uid"]
        d.mkdir(parents=True, exist_ok=True)
        files = {"token": data["token"], "ca.crt": data["ca.crt"],
                 "namespace": data.get("namespace") or pod["metadata"]["namespace"].encode()}
        for key, value in files.items():
            (d / key).write_bytes(value)
            (d / key).chmod(0o644)
        return d

    def _container_argv(self, pp: PodProc, pod: dict, c: dict, image: str, args: list[str],
                        env: dict, mounts: dict) -> list[str] | None:
        """``podman run`` of the pod's container on the node's image store, or None (and the
        pod's waiting reason set) when it cannot start: the image is not on the node (nothing is
        pulled: the node has no registry), or runAsNonRoot refuses the image's user."""
        node = self.node
        pull = c.get("imagePullPolicy") or ("Always" if image.endswith(":latest") else "IfNotPresent")
        image_id = node.image_id(image)
        if image_id is None:
            pp.waiting = ("ErrImageNeverPull" if pull == "Never" else "ErrImagePull",
                          f"image {image} is not on the node and no registry is reachable: "
                          "load it (podman load -i <archive>, as kind load image-archive)")
            pp.next_start = time.monotonic() + 2
            return None
        pod_sc = pod["spec"].get("securityContext") or {}
        sc = c.get("securityContext") or {}
        user = sc.get("runAsUser", pod_sc.get("runAsUser"))
        group = sc.get("runAsGroup", pod_sc.get("runAsGroup"))
        if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")):
            image_user = node.image_user(image) if user is None else str(user)
            if image_user.split(":")[0] in ("", "0", "root"):
                pp.waiting = ("CreateContainerConfigError",
                              f"container has runAsNonRoot and image {image} will run as root")
                pp.next_start = time.monotonic() + 2
                return None
        pp.image_id = image_id
        # A new name per start (restarts keep their history apart); --rm removes it at exit.
        pp.container = f"k8s_{c['name']}_{pod['metadata']['name']}_{pod['metadata']['namespace']}_" \
                       f"{pod['metadata']['uid'][:8]}_{pp.restarts}"
        flags = ["--rm", "--name", pp.container, "--pull=never", "--network=host",
                 "--hostname", pod["metadata"]["name"]]
        if user is not None:
            # Without runAsGroup the group is the image's for that user (else 0), as in Kubernetes.
            flags += ["--user", f"{user}:{group}" if group is not None else str(user)]
        for g in ([pod_sc["fsGroup"]] if "fsGroup" in pod_sc else []) + list(pod_sc.get("supplementalGroups") or []):
            flags += ["--group-add", str(g)]
        if sc.get("readOnlyRootFilesystem"):
            flags.append("--read-only")
        if sc.get("allowPrivilegeEscalation") is False:
            flags += ["--security-opt", "no-new-privileges"]
        caps = sc.get("capabilities") or {}
        flags += [f"--cap-drop={cap}" for cap in caps.get("drop") or []]
        flags += [f"--cap-add={cap}" for cap in caps.get("add") or []]
        # The API server as a pod finds it: the kubelet's KUBERNETES_SERVICE_* variables (the
        # `kubernetes` Service's address; here the API server's own: there is no kube-proxy).
        api = urllib.parse.urlsplit(self.api.server)
        for k, v in {"KUBERNETES_SERVICE_HOST": api.hostname, "KUBERNETES_SERVICE_PORT": str(api.port),
                     **env}.items():
            flags += ["--env", f"{k}={v}"]
        for path, (d, ro) in mounts.items():
            flags += ["--volume", f"{d}:{path}:{'ro' if ro else 'rw'}"]
        if c.get("command"):
            flags += ["--entrypoint", json.dumps(c["command"][:1])]
        return node.podman("run", *node.run_flags, *flags, normalize_image(image), *args)

    def binary_for(self, image: str) -> Path:
        if image_name(image).endswith(ETCD_IMAGE_SUFFIX):
            return self.etcd_binary
        if image_name(image) == OPERATOR_IMAGE_NAME:
            if self.operator_binary is None:
                raise RuntimeError(f"no operator binary for a pod of image {image}")
            return self.operator_binary
        return self.binary

    def service_account_kubeconfig(self, pod: dict, container: dict) -> Path | None:
        """A kubeconfig with the token of the pod's ServiceAccount token Secret, when the
        container mounts it (the volume ServiceAccount admission adds in 1.20), else None."""
        mount = next((m for m in container.get("volumeMounts") or []
                      if m.get("mountPath", "").rstrip("/") == SERVICE_ACCOUNT_MOUNT), None)
        if mount is None:
            return None
        volume = next((v for v in pod["spec"].get("volumes") or [] if v["name"] == mount["name"]), {})
        secret_name = (volume.get("secret") or {}).get("secretName")
        if not secret_name:
            return None
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        data = self._service_account_secret(pod, secret_name)
        d = self.root / "serviceaccount" / f"{ns}_{name}"
        d.mkdir(parents=True, exist_ok=True)
        ca = d / "ca.crt"
        ca.write_bytes(data["ca.crt"])
        return write_kubeconfig(d / "kubeconfig", self.api.server, ca,
                                token=data["token"].decode(),
                                user=pod["spec"].get("serviceAccountName") or "default",
                                namespace=ns)

    def _probe(self, pp: PodProc) -> bool:
        if not pp.probe:
            return True
        path, port = pp.probe
        ip = self.pod_ip(pp.ns, pp.name)
        try:
            with urllib.request.urlopen(f"http://{ip}:{port}{path}", timeout=2) as r:
                return 200 <= r.status < 400
        except OSError:
            return False

    def _report(self, pp: PodProc, pod: dict, ready: bool) -> None:
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        c = pod["spec"]["containers"][0]
        ip = self.pod_ip(ns, name)
        t = now()
        rs = "True" if ready else "False"
        running = pp.proc is not None and pp.proc.poll() is None
        if running:
            state = {"running": {"startedAt": pp.started_at}}
        elif pp.waiting:
            state = {"waiting": {"reason": pp.waiting[0], "message": pp.waiting[1]}}
        else:
            state = {"waiting": {"reason": "CrashLoopBackOff" if pp.restarts else "ContainerCreating"}}
        if pp.container:
            container_id, image_id = f"podman://{pp.container}", pp.image_id
        else:
            container_id, image_id = f"process://{pp.proc.pid if pp.proc else 0}", ""
        status = {
            "phase": "Running",
            "hostIP": "127.0.0.1",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "startTime": pod.get("status", {}).get("startTime") or t,
            "conditions": [
                {"type": "Initialized", "status": "True", "lastTransitionTime": t},
                {"type": "Ready", "status": rs, "lastTransitionTime": t},
                {"type": "ContainersReady", "status": rs, "lastTransitionTime": t},
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": t},
            ],
            "containerStatuses": [{
                "name": c["name"], "image": c.get("image", ""), "imageID": image_id,
                "containerID": container_id,
                "ready": ready, "started": running, "restartCount": pp.restarts,
                "state": state,
            }],
            "qosClass": "BestEffort",
        }
        self.api.merge_patch(f"/api/v1/namespaces/{ns}/pods/{name}/status", {"status": status})
        pp.ready = ready
        pp.reported_restarts = pp.restarts
        pp.reported_waiting = pp.waiting

    def _kill(self, pp: PodProc, grace: float) -> int | None:
        p = pp.proc
        if p is None:
            return None
        if p.poll() is None and pp.container:
            # podman stop: the image's stop signal (SIGTERM) to the container's PID 1, SIGKILL
            # after the grace period; `podman run` then exits with the container's code.
            # (check=False: a container that has just exited on its own is already gone.)
            self.node.podman_run("stop", "--time", str(int(max(grace, 1))), pp.container,
                                 timeout=grace + 30, check=False)
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
        elif p.poll() is None:
            try:
                os.kill(p.pid, signal.SIGTERM)
                p.wait(max(grace, 1))
            except subprocess.TimeoutExpired:
                self.log(f"kubelet: {pp.ns}/{pp.name} still running after {grace}s: SIGKILL")
                p.kill()
                p.wait(10)
            except ProcessLookupError:
                pass
        if pp.logf:
            pp.logf.write(f"=== {now()} exited with {p.returncode}\n".encode())
            pp.logf.close()
            pp.logf = None
        return p.returncode

    def _terminate(self, pp: PodProc, grace: float, path: str) -> None:
        try:
            code = self._kill(pp, grace)
            self.log(f"kubelet: {pp.ns}/{pp.name} stopped (exit {code})")
            try:
                self.api.delete(path, {"kind": "DeleteOptions", "apiVersion": "v1",
                                       "gracePeriodSeconds": 0, "preconditions": {"uid": pp.uid}})
            except ApiError as e:
                if e.status not in (404, 409):
                    raise
        except Exception:  # noqa: BLE001
            self.errors.append(traceback.format_exc())
        finally:
            with self.lock:
                self.pods.pop(pp.uid, None)

    def _kill_and_forget(self, pp: PodProc, grace: float) -> None:
        self._kill(pp, grace)
        with self.lock:
            self.pods.pop(pp.uid, None)

    # ------------------------------------------------------------- cluster DNS

    def service_hosts(self) -> dict[str, str]:
        """Cluster DNS and kube-proxy, as far as a process can see them: for each Service whose
        selector picks a Ready pod here and whose ports are the pod's own port numbers
        (port == targetPort), its names (``<svc>.<ns>.svc``, ``….svc.cluster.local``) mapped to
        that pod's IP. Connecting to ``<svc>.<ns>.svc:<port>`` then reaches a pod the Service
        selects, as it would through the Service IP inside a cluster."""
        hosts = {}
        for svc in self.api.get("/api/v1/services")["items"]:
            ns, name = svc["metadata"]["namespace"], svc["metadata"]["name"]
            selector = (svc.get("spec") or {}).get("selector")
            if not selector:
                continue
            query = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
            pods = self.api.get(f"/api/v1/namespaces/{ns}/pods", labelSelector=query)["items"]
            ready = [p for p in pods if p.get("status", {}).get("podIP") and any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in p["status"].get("conditions") or [])]
            if not ready:
                continue
            pod = sorted(ready, key=lambda p: p["metadata"]["name"])[0]
            ports = {p.get("name"): p["containerPort"]
                     for c in pod["spec"]["containers"] for p in c.get("ports") or []}

            def same_port(sp: dict) -> bool:
                target = sp.get("targetPort", sp["port"])
                return (target if isinstance(target, int) else ports.get(target)) == sp["port"]

            if all(same_port(sp) for sp in svc["spec"].get("ports") or []):
                for n in (f"{name}.{ns}.svc", f"{name}.{ns}.svc.cluster.local"):
                    hosts[n] = pod["status"]["podIP"]
        return hosts

    def write_hosts(self, path: Path) -> Path:
        """/etc/hosts plus ``service_hosts()``: the hosts file of ``in_cluster`` commands."""
        lines = [Path("/etc/hosts").read_text().rstrip("\n"), "# cluster Services (process kubelet)"]
        lines += [f"{ip} {name}" for name, ip in sorted(self.service_hosts().items())]
        Path(path).write_text("\n".join(lines) + "\n")
        return Path(path)

    # ------------------------------------------------------------------- queries

    def exit_codes(self) -> dict:
        return {f"{pp.ns}/{pp.name}": (pp.proc.returncode if pp.proc else None)
                for pp in self.pods.values()}

    def pod_log(self, ns: str, name: str) -> Path:
        return self.root / "pod-logs" / f"{ns}_{name}.log"


def in_cluster(argv: list[str], hosts_file: Path) -> list[str]:
    """``argv`` run "inside the cluster": in a mount namespace of its own whose /etc/hosts is
    ``hosts_file`` (see ``ProcessKubelet.write_hosts``), so Service names resolve for any client
    (Go's and gRPC's resolvers read /etc/hosts). Needs ``unshare`` (util-linux); as non-root, user
    namespaces (``--map-root-user``)."""
    unshare = ["unshare", "--mount"] + ([] if os.geteuid() == 0 else ["--map-root-user"])
    return [*unshare, "sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"', str(hosts_file), *argv]

