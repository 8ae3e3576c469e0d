"""Basalt on a real Kubernetes control plane (kube-apiserver + kube-controller-manager 1.20.2,
etcd), with the operator running out of cluster as the Helm chart's ServiceAccount and a
process kubelet (e2e/k8s/kubelet.py) running real basalt-tablet-server processes for pods, and
Debian's etcd for the pods of each Instance's metadata store.

The control plane is built by e2e/k8s/build-control-plane (cached outside the clone). Without
its binaries the module is skipped, unless BASALT_K8S_E2E=1 (CI), where that is a failure.
See docs/kubernetes-e2e.md.

The scenarios share one control plane and one operator, and run in file order: later ones
build on objects earlier ones made (the examples, the quickstart instance).

The operator runs with the autoscaler's timings shortened through its environment
(AUTOSCALE_TIMINGS, see docs/kubernetes-e2e.md): a sample every 2 s (in effect 5 s: no faster
than the master reads the servers' reports), up after 6 s of sustained load, down after 12 s of
samples that all want fewer and 10 s after the last change, so the autoscaling scenario sees a
scale-up and a scale-down within a minute each; Clusters with a fixed serveNodes are not
affected. It has no --prometheus-url: the autoscalers sample the servers' own reports.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "k8s"))

import harness  # noqa: E402
from harness import Api, ApiError, ControlPlane, Kubectl, Operator, wait_for  # noqa: E402
from kubelet import ProcessKubelet  # noqa: E402

from conftest import server_binary  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
GROUP = "/apis/basalt.dev/v1alpha1"
NS = "examples"  # where examples/ is applied
TIMEOUT = 90.0
REQUIRED = os.environ.get("BASALT_K8S_E2E", "") not in ("", "0")

# Operator bugs this suite found on a real API server (fixed), by a line of the operator's log.
# A wait that has not succeeded after FAST_FAIL seconds while the operator logs one of them
# fails at once with the explanation, instead of running into its timeout.
KNOWN_OPERATOR_ERRORS = {
    "associative list with keys has an element that omits key field":
        "operator bug: server-side apply of a Service (and of the StatefulSet's container ports) "
        "without `protocol` fails on Kubernetes < 1.21 with HTTP 500 \"failed to create typed "
        "patch object: .spec.ports: element 0: associative list with keys has an element that "
        "omits key field \"protocol\"\"; operator/src/build/ (service.rs, statefulset.rs) must set protocol: TCP on every "
        "ServicePort and ContainerPort",
    "status.conditions.message in body must be of type string":
        "operator bug: status conditions are applied with message \"\" (e.g. Degraded=False, "
        "AsExpected); the server-side apply of kube-apiserver 1.20 turns the empty string into "
        "null and the CRD schema (message: string) refuses the whole status with HTTP 422 "
        "\"status.conditions.message in body must be of type string: null\", so the status of "
        "Instances, Clusters, Tables and AppProfiles is not written; operator/src/conditions.rs "
        "must never send an empty message",
}
FAST_FAIL = 10.0
STATUS_MESSAGE_BUG = KNOWN_OPERATOR_ERRORS["status.conditions.message in body must be of type string"]

# The autoscaler's timings in the operator's environment (read by timing_from_env in
# operator/src/master/autoscaler.rs; the defaults are Bigtable's: 15 s, 60 s, 30 min, 10 min).
AUTOSCALE_TIMINGS = {
    "BASALT_AUTOSCALE_SAMPLE_SECS": "2",
    "BASALT_AUTOSCALE_UP_WINDOW_SECS": "6",
    "BASALT_AUTOSCALE_DOWN_WINDOW_SECS": "12",
    "BASALT_AUTOSCALE_DOWN_COOLDOWN_SECS": "10",
}
# The operator's environment: the autoscaler's timings, and the metadata stores'
# NetworkPolicies on as the chart has them (no network plugin here enforces them: their shape
# is checked).
OPERATOR_ENV = {**AUTOSCALE_TIMINGS, "BASALT_METADATA_STORE_NETWORK_POLICIES": "true",
                "BASALT_TOKEN_REVIEWER_CLUSTER_ROLE": f"{harness.RELEASE}-token-reviewer"}


def _missing() -> list[str]:
    missing = harness.missing_binaries()
    for b in (server_binary(), harness.operator_binary()):
        if not os.access(b, os.X_OK):
            missing.append(str(b))
    return missing


if _missing() and not REQUIRED:
    pytest.skip("Kubernetes e2e: missing " + ", ".join(_missing())
                + " (run e2e/k8s/build-control-plane and cargo build; set BASALT_K8S_E2E=1 to "
                "make this a failure)", allow_module_level=True)


class Env:
    def __init__(self, root: Path):
        self.root = root
        self.cp = ControlPlane(root / "control-plane")
        self.api: Api | None = None
        self.kubectl: Kubectl | None = None
        self.kubelet: ProcessKubelet | None = None
        self.operators: dict[str, Operator] = {}
        self.operator_kubeconfig: Path | None = None
        self.events: list[str] = []

    # ------------------------------------------------------------------ helpers

    def log(self, msg: str) -> None:
        self.events.append(f"{time.strftime('%H:%M:%S')} {msg}")

    def namespace(self, name: str) -> None:
        try:
            self.api.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                 "metadata": {"name": name}})
        except ApiError as e:
            if e.status != 409:
                raise
        # Pods need the namespace's default ServiceAccount (ServiceAccount admission).
        wait_for(f"ServiceAccount {name}/default",
                 lambda: self.api.get_or_none(f"/api/v1/namespaces/{name}/serviceaccounts/default"),
                 timeout=TIMEOUT)

    def apply(self, yaml_or_path, ns: str = NS, check: bool = True):
        if isinstance(yaml_or_path, Path):
            return self.kubectl.run("apply", "-n", ns, "-f", str(yaml_or_path), check=check)
        return self.kubectl.run("apply", "-n", ns, "-f", "-", input=yaml_or_path, check=check)

    def cr(self, plural: str, name: str, ns: str = NS):
        return self.api.get_or_none(f"{GROUP}/namespaces/{ns}/{plural}/{name}")

    def sts(self, name: str, ns: str = NS):
        return self.api.get_or_none(f"/apis/apps/v1/namespaces/{ns}/statefulsets/{name}")

    def svc(self, name: str, ns: str = NS):
        return self.api.get_or_none(f"/api/v1/namespaces/{ns}/services/{name}")

    def pvc(self, name: str, ns: str = NS):
        return self.api.get_or_none(f"/api/v1/namespaces/{ns}/persistentvolumeclaims/{name}")

    def pods(self, selector: str, ns: str = NS) -> list[dict]:
        return self.api.get(f"/api/v1/namespaces/{ns}/pods", labelSelector=selector)["items"]

    def known_operator_error(self, bugs=None) -> str | None:
        found = []
        for op in self.operators.values():
            text = harness.tail(op.log, 200_000)
            for pattern, explanation in KNOWN_OPERATOR_ERRORS.items():
                if pattern in text and explanation not in found and (bugs is None or explanation in bugs):
                    found.append(explanation)
        return "; ".join(found) or None

    def wait(self, what: str, fn, timeout: float = TIMEOUT, bugs=None):
        start = time.monotonic()

        def checked():
            self.cp.check()
            for op in self.operators.values():
                if op.proc is not None:
                    op.proc.check()
            got = fn()
            if not got and time.monotonic() - start > FAST_FAIL:
                known = self.known_operator_error(bugs)
                if known:
                    raise OperatorBug(f"waiting for {what}: {known}")
            return got

        return wait_for(what, checked, timeout=timeout, interval=0.3)

    def wait_cond(self, plural: str, name: str, ctype: str, status: str = "True",
                  reason: str | None = None, ns: str = NS, timeout: float = TIMEOUT):
        def ok():
            obj = self.cr(plural, name, ns)
            c = cond(obj, ctype)
            if c and c["status"] == status and (reason is None or c.get("reason") == reason):
                return obj
            return None

        return self.wait(f"{plural}/{name} {ctype}={status}{' ' + reason if reason else ''}", ok,
                         timeout=timeout)

    def wait_gone(self, what: str, fn, timeout: float = TIMEOUT):
        return self.wait(f"{what} to be gone", lambda: fn() is None, timeout=timeout)

    def ready_pod_ip(self, cluster: str, ns: str = NS) -> str:
        def ip():
            for p in self.pods(f"basalt.dev/cluster={cluster}", ns):
                if cond(p, "Ready") and cond(p, "Ready")["status"] == "True":
                    return p["status"]["podIP"]
            return None

        return self.wait(f"a ready pod of {cluster}", ip)

    def start_operator(self, identity: str) -> Operator:
        op = Operator(self.operator_kubeconfig, self.root, identity, env=OPERATOR_ENV).start()
        self.operators[identity] = op
        return op

    def stop_operator(self, identity: str) -> int | None:
        op = self.operators.pop(identity)
        return op.stop()

    def diagnostics(self) -> str:
        parts = [self.cp.logs_tail()]
        for op in self.operators.values():
            parts.append(f"--- {op.log.name}\n{harness.tail(op.log, 6000)}")
        if self.kubelet:
            parts.append("--- kubelet errors\n" + "\n".join(self.kubelet.errors[-5:]))
        parts.append("--- events\n" + "\n".join(self.events[-40:]))
        return "\n".join(parts)


class OperatorBug(AssertionError):
    pass


def cond(obj, ctype: str):
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype:
            return c
    return None


@pytest.fixture(scope="module")
def k8s(tmp_path_factory):
    missing = _missing()
    if missing:
        pytest.fail("BASALT_K8S_E2E is set but the Kubernetes e2e cannot run, missing: "
                    + ", ".join(missing) + " (run e2e/k8s/build-control-plane)")
    env = Env(tmp_path_factory.mktemp("k8s"))
    t0 = time.monotonic()
    try:
        env.cp.start()
        env.api = env.cp.api
        env.kubectl = Kubectl(env.cp.admin_kubeconfig)
        env.log(f"control plane up in {time.monotonic() - t0:.1f}s at {env.cp.server}")

        # CRDs (scenario 1 checks them) and the chart's RBAC for the operator.
        # kubectl 1.20 validates client-side against the served OpenAPI, which does not know
        # x-kubernetes-validations (CEL, 1.25+): --validate=false lets the API server decide
        # (1.20 drops the unknown field).
        env.kubectl.run("apply", "--validate=false", "-f", str(REPO / "crds"))
        env.namespace(harness.OPERATOR_NAMESPACE)
        env.kubectl.run("apply", "-f", "-", input=harness.render_rbac())
        token = harness.service_account_token(env.api, harness.OPERATOR_NAMESPACE, harness.RELEASE)
        env.operator_kubeconfig = harness.write_kubeconfig(
            env.root / "operator.kubeconfig", env.cp.server, env.cp.pki / "ca.crt", token=token,
            user=f"system:serviceaccount:{harness.OPERATOR_NAMESPACE}:{harness.RELEASE}",
            namespace=harness.OPERATOR_NAMESPACE)

        env.kubelet = ProcessKubelet(env.api, env.root / "kubelet", server_binary(),
                                     log=env.log).start()
        for crd in ("instances", "clusters", "tables", "appprofiles", "backups", "backupschedules"):
            env.wait(f"CRD {crd} Established",
                     lambda crd=crd: cond(env.api.get(
                         f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}.basalt.dev"),
                         "Established") or None)
        env.start_operator("op-1")
        env.log(f"environment ready in {time.monotonic() - t0:.1f}s")
        yield env
    except BaseException:
        print(env.diagnostics(), file=sys.stderr)
        raise
    finally:
        for ident in list(env.operators):
            env.stop_operator(ident)
        if env.kubelet:
            env.kubelet.stop()
        env.cp.stop()


@pytest.fixture
def k(k8s, request):
    """The shared environment; prints diagnostics (logs' tails) after a failed test."""
    failed = request.session.testsfailed
    yield k8s
    if request.session.testsfailed != failed:
        print(k8s.diagnostics(), file=sys.stderr)


# ------------------------------------------------------------------------------- scenarios


def test_crds_and_rbac_installed(k):
    """The CRDs from crds/ are accepted by a real API server as structural schemas, with the
    status and scale subresources; the operator runs under the chart's RBAC (not an admin)."""
    for plural in ("instances", "clusters", "tables", "appprofiles", "backups", "backupschedules"):
        crd = k.api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{plural}.basalt.dev")
        assert cond(crd, "Established")["status"] == "True"
        assert cond(crd, "NamesAccepted")["status"] == "True"
        nsc = cond(crd, "NonStructuralSchema")
        assert nsc is None or nsc["status"] != "True", nsc
        v = crd["spec"]["versions"][0]
        assert "status" in v.get("subresources", {}), plural
    scale = k.api.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/clusters.basalt.dev")[
        "spec"]["versions"][0]["subresources"]["scale"]
    assert scale["specReplicasPath"] == ".spec.serveNodes"
    assert scale["statusReplicasPath"] == ".status.serveNodes"
    # `kubectl get basalt` (the category) works.
    k.wait("`kubectl get basalt -A`",
           lambda: k.kubectl.fresh().run("get", "basalt", "-A", check=False).returncode == 0)

    # The operator's identity is the ServiceAccount, bound only to the chart's rules.
    sa = f"system:serviceaccount:{harness.OPERATOR_NAMESPACE}:{harness.RELEASE}"

    def can(verb, resource, ns=None, group=""):
        args = ["auth", "can-i", verb, resource, f"--as={sa}"]
        if ns:
            args += ["-n", ns]
        return k.kubectl.run(*args, check=False).stdout.strip() == "yes"

    assert can("patch", "statefulsets.apps", "anywhere")
    # Pods: patched only to take a removed Cluster's pods out of the Instance's Service.
    assert can("patch", "pods", "anywhere") and not can("delete", "pods", "anywhere")
    assert can("watch", "clusters.basalt.dev", "anywhere")
    assert can("update", "leases.coordination.k8s.io", harness.OPERATOR_NAMESPACE)
    assert not can("update", "leases.coordination.k8s.io", "default")
    # Secrets: the certificates of secured Instances, read by name, never listed or deleted.
    assert can("patch", "secrets", "anywhere") and can("get", "secrets", "anywhere")
    assert not can("list", "secrets", "anywhere") and not can("delete", "secrets", "default")
    assert can("patch", "networkpolicies.networking.k8s.io", "anywhere")
    assert not can("delete", "nodes")
    assert k.operators["op-1"].metric("basalt_operator_leader") == 1


def _statefulset(name: str, ns: str) -> dict:
    """A StatefulSet shaped like the operator's (e2e/k8s is tested without the operator)."""
    labels = {"app.kubernetes.io/name": "basalt", "app.kubernetes.io/component": "tablet-server",
              "basalt.dev/cluster": name}
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {
            "replicas": 1, "serviceName": f"{name}-nodes", "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {
                "terminationGracePeriodSeconds": 10,
                "automountServiceAccountToken": False,
                "containers": [{
                    "name": "tablet-server", "image": "basalt/basalt-tablet-server:test",
                    "args": ["--standalone", "--data-dir=/var/lib/basalt/data",
                             "--listen=0.0.0.0:8086", "--http-listen=0.0.0.0:8087",
                             f"--cluster-id={name}", "--log-format=json",
                             "--shutdown-timeout-secs=5"],
                    "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                    "ports": [{"name": "grpc", "containerPort": 8086}, {"name": "http", "containerPort": 8087}],
                    "readinessProbe": {"httpGet": {"path": "/readyz", "port": "http"}, "periodSeconds": 5},
                    "volumeMounts": [{"name": "data", "mountPath": "/var/lib/basalt"}],
                }]}},
            "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {
                "accessModes": ["ReadWriteOnce"], "storageClassName": "standard",
                "resources": {"requests": {"storage": "1Gi"}}}}],
        },
    }


def test_process_kubelet_runs_statefulset_pods(k, monkeypatch):
    """The harness itself, without the operator: the real StatefulSet controller creates a
    pod and its claim, the process kubelet binds it, runs the tablet server on the pod IP
    with the claim's directory and reports it Ready; the Python client writes through it; a
    deleted pod is stopped (SIGTERM) and recreated by the controller with the same IP and
    data; deleting the claim removes the directory."""
    from google.cloud import bigtable
    from google.cloud.bigtable import column_family

    ns = "kubelet-test"
    k.namespace(ns)
    k.api.post(f"/apis/apps/v1/namespaces/{ns}/statefulsets", _statefulset("raw", ns))
    k.wait("StatefulSet raw readyReplicas=1",
           lambda: (k.sts("raw", ns).get("status") or {}).get("readyReplicas") == 1)
    pod = k.api.get(f"/api/v1/namespaces/{ns}/pods/raw-0")
    assert pod["spec"]["nodeName"] == "basalt-test-node"
    ip = pod["status"]["podIP"]
    assert ip.startswith(k.kubelet.ip_prefix)
    assert k.pvc("data-raw-0", ns) is not None
    data = k.kubelet.claim_dir(ns, "data-raw-0")

    monkeypatch.setenv("BIGTABLE_EMULATOR_HOST", f"{ip}:8086")
    client = bigtable.Client(project=ns, admin=True)
    table = client.instance("raw").table("t")
    table.create(column_families={"cf": column_family.MaxVersionsGCRule(1)})
    row = table.direct_row(b"r1")
    row.set_cell("cf", b"greeting", b"kept")
    row.commit()
    client.close()
    assert (data / "data").is_dir()

    uid = pod["metadata"]["uid"]
    k.api.delete(f"/api/v1/namespaces/{ns}/pods/raw-0")
    k.wait("raw-0 recreated and Ready", lambda: (lambda p: p and p["metadata"]["uid"] != uid and
                                                 (cond(p, "Ready") or {}).get("status") == "True")(
        k.api.get_or_none(f"/api/v1/namespaces/{ns}/pods/raw-0")))
    log = k.kubelet.pod_log(ns, "raw-0").read_text()
    assert "exited with 0" in log, log[-2000:]  # SIGTERM: a clean shutdown
    assert k.api.get(f"/api/v1/namespaces/{ns}/pods/raw-0")["status"]["podIP"] == ip
    write_and_read(monkeypatch, ip, ns, "raw", "t", {b"r1": b"kept"}, write=False)

    k.api.delete(f"/apis/apps/v1/namespaces/{ns}/statefulsets/raw")
    k.wait("pods of raw gone", lambda: not k.pods("basalt.dev/cluster=raw", ns))
    assert data.is_dir()  # the claim outlives the StatefulSet
    k.api.delete(f"/api/v1/namespaces/{ns}/persistentvolumeclaims/data-raw-0")
    k.wait("the claim's directory removed", lambda: not data.exists())


def test_apply_examples(k):
    """Every file in examples/ is accepted by the API server, with the CRDs' defaults filled
    in; the operator puts its deletion-protection finalizer on the protected Instance."""
    k.namespace(NS)
    out = k.apply(REPO / "examples").stdout
    for kind_name in ("instance.basalt.dev/orders-prod", "cluster.basalt.dev/orders-prod-c1",
                      "cluster.basalt.dev/orders-prod-c2", "table.basalt.dev/orders",
                      "appprofile.basalt.dev/batch", "appprofile.basalt.dev/serving",
                      "instance.basalt.dev/quickstart", "cluster.basalt.dev/quickstart-c1",
                      "table.basalt.dev/greetings"):
        assert kind_name in out, out
    # Structural-schema defaulting by the API server.
    assert k.cr("clusters", "quickstart-c1")["spec"]["storageType"] == "SSD"
    k.wait("the deletion-protection finalizer on orders-prod",
           lambda: "basalt.dev/deletion-protection" in (
               k.cr("instances", "orders-prod")["metadata"].get("finalizers") or []))


def test_scale_subresource(k):
    """`kubectl scale` on a Cluster goes through the CRD's scale subresource to
    spec.serveNodes (API server only)."""
    k.kubectl.run("scale", "-n", NS, "cluster/orders-prod-c1", "--replicas=2")
    assert k.cr("clusters", "orders-prod-c1")["spec"]["serveNodes"] == 2
    scale = k.api.get(f"{GROUP}/namespaces/{NS}/clusters/orders-prod-c1/scale")
    assert scale["kind"] == "Scale" and scale["spec"]["replicas"] == 2
    k.kubectl.run("scale", "-n", NS, "cluster/orders-prod-c1", "--replicas=3")
    assert k.cr("clusters", "orders-prod-c1")["spec"]["serveNodes"] == 3


def test_examples_reconciled(k):
    """The operator makes a StatefulSet per Cluster (replicas from serveNodes, or the
    autoscaling minimum) owned by it and a headless Service, skips the PodDisruptionBudget on
    1.20 with a condition, and zone-pinned pods stay unschedulable on the test node (it has
    no zone). Each Instance gets its metadata store: an etcd StatefulSet `<instance>-meta`
    (3 members for Production, 1 for Development) owned by it, and the tablet servers run in
    cluster mode against it."""
    for cluster, replicas in (("orders-prod-c1", 3), ("orders-prod-c2", 1), ("quickstart-c1", 3)):
        sts = k.wait(f"StatefulSet {cluster} with {replicas} replicas",
                     lambda c=cluster, r=replicas: (lambda x: x if x and x["spec"]["replicas"] == r else None)(k.sts(c)))
        assert sts["spec"]["podManagementPolicy"] == "Parallel"
        owner = sts["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner.get("controller")) == ("Cluster", cluster, True)
        assert k.svc(f"{cluster}-nodes")["spec"]["clusterIP"] == "None"
        c = k.wait_cond("clusters", cluster, "DisruptionBudget", "False")
        assert cond(c, "DisruptionBudget")["reason"] == "Unsupported", cond(c, "DisruptionBudget")
        assert cond(c, "SingleDatabase") is None, c["status"]["conditions"]
        args = sts["spec"]["template"]["spec"]["containers"][0]["args"]
        assert f"--cluster={cluster}" in args and "--server-id=$(POD_NAME)" in args, args
        assert "--advertise-address=$(POD_IP):8086" in args, args
    assert k.api.get_or_none(f"/apis/policy/v1beta1/namespaces/{NS}/poddisruptionbudgets/orders-prod-c1") is None

    for instance, members in (("orders-prod", 3), ("quickstart", 1)):
        meta = k.wait(f"etcd StatefulSet {instance}-meta", lambda i=instance: k.sts(f"{i}-meta"))
        assert meta["spec"]["replicas"] == members, meta["spec"]
        assert meta["spec"]["serviceName"] == f"{instance}-meta"
        assert meta["metadata"]["ownerReferences"][0]["kind"] == "Instance"
        svc = k.svc(f"{instance}-meta")
        assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    args = k.sts("quickstart-c1")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--etcd=http://quickstart-meta-0.quickstart-meta.{NS}.svc:2379" in args, args

    # orders-prod-c1 is pinned to europe-west1-b: its pods are not scheduled here.
    k.wait("3 orders-prod-c1 pods Unschedulable", lambda: (lambda pods: len(pods) == 3 and all(
        (cond(p, "PodScheduled") or {}).get("reason") == "Unschedulable" for p in pods))(
        k.pods("basalt.dev/cluster=orders-prod-c1")))
    k.wait_cond("clusters", "orders-prod-c1", "Ready", "False")


def test_app_profiles_status(k):
    """The operator reports each AppProfile's status (validated against the instance's
    clusters), and the API server accepts every status it writes."""
    for name in ("batch", "serving"):
        conds = k.wait(f"AppProfile {name} status conditions",
                       lambda n=name: ((k.cr("appprofiles", n) or {}).get("status") or {}).get("conditions"),
                       bugs=(STATUS_MESSAGE_BUG,))
        # Whether its record is in the instance's catalog in etcd is reported with the rest.
        assert any(c.get("type") == "Recorded" for c in conds), conds
    time.sleep(2)
    known = k.known_operator_error(bugs=(STATUS_MESSAGE_BUG,))
    if known:
        raise OperatorBug(known)


def test_quickstart_ready_table_and_client(k, monkeypatch):
    """An Instance with one Cluster of three nodes becomes Ready, its metadata store (one etcd
    member) too; the Table is created with its column families; the Python client writes and
    reads through a pod; the table's four tablets end up spread over the three servers."""
    k.wait_cond("instances", "quickstart", "MetadataStoreReady", timeout=120)
    inst = k.wait_cond("instances", "quickstart", "Ready", timeout=120)
    assert inst["status"]["metadataStore"]["endpoints"] == [
        f"http://quickstart-meta-0.quickstart-meta.{NS}.svc:2379"], inst["status"]
    assert inst["status"]["resourceName"] == f"projects/{NS}/instances/quickstart"
    assert inst["status"]["endpoint"].startswith(f"quickstart.{NS}.svc")
    assert k.svc("quickstart")["spec"]["ports"][0]["port"] == 8086
    assert k.api.get_or_none(f"/api/v1/namespaces/{NS}/configmaps/quickstart-config") is not None

    # Ready as soon as one tablet server is; the others follow.
    k.wait_cond("clusters", "quickstart-c1", "Ready")
    cl = k.wait("Cluster status 3/3", lambda: (lambda c: c if (c.get("status") or {}).get("readyNodes") == 3
                                                else None)(k.cr("clusters", "quickstart-c1") or {}),
                timeout=120)
    assert cl["status"]["serveNodes"] == 3
    assert "basalt.dev/cluster=quickstart-c1" in cl["status"]["selector"]
    sts = k.sts("quickstart-c1")
    assert sts["status"].get("readyReplicas") == 3

    table = k.wait("Table greetings with its column families",
                   lambda: (lambda t: t if "cf" in ((t.get("status") or {}).get("columnFamilies") or {}) else None)(
                       k.cr("tables", "greetings")))
    assert table["status"]["columnFamilies"]["cf"]["gcRule"]["maxNumVersions"] == 1

    ip = k.ready_pod_ip("quickstart-c1")
    project = inst["status"]["resourceName"].split("/")[1]
    write_and_read(monkeypatch, ip, project, "quickstart", "greetings",
                   {b"hello#1": b"world", b"hello#2": b"basalt"})

    # The Cluster status reports what the tablet servers serve, as they tell the operator over
    # Basalt's control protocol (GetServerStatus): the table's tablet and the bytes stored. A
    # metadata change makes the operator look again now rather than at its next resync.
    k.api.merge_patch(f"{GROUP}/namespaces/{NS}/clusters/quickstart-c1",
                      {"metadata": {"annotations": {"e2e.basalt.dev/look-again": "1"}}})
    cl = k.wait("Cluster status with the servers' tablets and stored bytes",
                lambda: (lambda s: s if (s.get("tablets") or 0) == 4 and s.get("storageUsedBytes") is not None
                         else None)((k.cr("clusters", "quickstart-c1") or {}).get("status") or {}))
    assert cl["tablets"] == 4, cl
    assert cl["storageUsedBytes"] >= 0, cl

    # The tablet map in the metadata store: the table's four tablets spread over the three
    # servers (2/1/1). The master places a new table on the servers registered then; one that
    # came up later receives its share from the rebalancer.
    def spread():
        _poke(k, "clusters", "quickstart-c1", NS)
        s = (k.cr("clusters", "quickstart-c1") or {}).get("status") or {}
        return s if sorted(n["tablets"] for n in s.get("nodes") or []) == [1, 1, 2] else None

    cl = k.wait("the table's tablets spread 2/1/1 over the 3 servers", spread, timeout=120)
    nodes = cl.get("nodes") or []
    assert [(n["name"], n["registered"]) for n in nodes] == [
        (f"quickstart-c1-{i}", True) for i in range(3)], cl
    assert sorted(n["tablets"] for n in nodes) == [1, 1, 2], cl
    assert (cond({"status": cl}, "DataLoss") or {}).get("status") == "False", cl["conditions"]


def _secret(k, name: str, ns: str = NS) -> dict[str, bytes] | None:
    import base64
    s = k.api.get_or_none(f"/api/v1/namespaces/{ns}/secrets/{name}")
    return None if s is None else {key: base64.b64decode(v) for key, v in (s.get("data") or {}).items()}


SECURED = """apiVersion: basalt.dev/v1alpha1
kind: Instance
metadata: {name: secured}
spec:
  displayName: Secured
  type: Development
  security:
    tls: Enabled
    identities: [{name: app}]
    serviceAccountTokens: true
---
apiVersion: basalt.dev/v1alpha1
kind: Cluster
metadata: {name: secured-c1}
spec: {instanceRef: secured, serveNodes: 1, storageSize: 1Gi}
---
apiVersion: basalt.dev/v1alpha1
kind: Table
metadata: {name: secured-t}
spec:
  instanceRef: secured
  tableId: t
  columnFamilies: {cf: {gcRule: {maxNumVersions: 1}}}
"""


def test_secured_instance_over_tls(k):
    """The example Production Instance (orders-prod) is secured by default: the operator issues
    its Secrets from its own CA (basalt-operator-ca in its namespace), its etcd members speak
    TLS to clients and want a certificate of the CA, its tablet servers serve TLS and
    authenticate every request, and the operator (Table, Cluster status, master) reaches both
    with its own certificate. An application uses the issued identity Secret."""
    import ssl
    import urllib.request

    import btlib
    from google.api_core import exceptions as gexc
    from google.cloud.bigtable_v2 import types as v2

    ca = k.wait("the operator's CA Secret",
                lambda: _secret(k, "basalt-operator-ca", harness.OPERATOR_NAMESPACE))
    assert b"BEGIN CERTIFICATE" in ca["ca.crt"] and b"PRIVATE KEY" in ca["ca.key"]
    names = ("orders-prod-server-tls", "orders-prod-meta-tls",
             "orders-prod-identity-admin", "orders-prod-identity-checkout")
    secrets = {n: k.wait(f"Secret {n}", lambda n=n: _secret(k, n)) for n in names}
    for s in secrets.values():
        assert s["ca.crt"] == ca["ca.crt"]
    checkout = secrets["orders-prod-identity-checkout"]
    assert checkout["principal"] == f"user:checkout@orders-prod.{NS}.basalt".encode()
    assert checkout["token"].decode() in secrets["orders-prod-server-tls"]["tokens"].decode()
    raw = k.api.get(f"/api/v1/namespaces/{NS}/secrets/orders-prod-identity-checkout")
    assert raw["type"] == "kubernetes.io/tls"
    assert raw["metadata"]["ownerReferences"][0]["name"] == "orders-prod"

    # Its NetworkPolicy: etcd's client port for the instance's servers and the operator's pods.
    policy = k.api.get(f"/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies/orders-prod-meta")
    assert [p["port"] for p in policy["spec"]["ingress"][0]["ports"]] == [2379], policy["spec"]
    assert policy["spec"]["ingress"][0]["from"][1]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": harness.OPERATOR_NAMESPACE}, policy["spec"]
    # The metadata store: three members over TLS, ready (its status lists https endpoints).
    inst = k.wait_cond("instances", "orders-prod", "MetadataStoreReady", timeout=120)
    assert all(e.startswith("https://") for e in inst["status"]["metadataStore"]["endpoints"]), inst["status"]
    member_ip = k.wait("an etcd member of orders-prod with an IP", lambda: next(
        (p["status"].get("podIP") for p in k.pods("app.kubernetes.io/component=metadata-store,"
                                                    "basalt.dev/instance=orders-prod")
         if (p.get("status") or {}).get("podIP")), None))
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://{member_ip}:2379/version", timeout=5).read()
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        files = {}
        for name, data in (("ca", ca["ca.crt"]),
                           ("cert", secrets["orders-prod-server-tls"]["tls.crt"]),
                           ("key", secrets["orders-prod-server-tls"]["tls.key"])):
            files[name] = f"{d}/{name}.pem"
            with open(files[name], "wb") as f:
                f.write(data)
        anonymous = ssl.create_default_context(cafile=files["ca"])
        anonymous.check_hostname = False
        with pytest.raises((OSError, ssl.SSLError)):
            urllib.request.urlopen(f"https://{member_ip}:2379/version", timeout=5,
                                   context=anonymous).read()
        with_certificate = ssl.create_default_context(cafile=files["ca"])
        with_certificate.check_hostname = False
        with_certificate.load_cert_chain(files["cert"], files["key"])
        with urllib.request.urlopen(f"https://{member_ip}:2379/version", timeout=5,
                                    context=with_certificate) as resp:
            assert b"etcdserver" in resp.read()
        # An application identity's certificate, of the same CA, is refused: etcd admits only
        # Basalt's own processes (internal.basalt).
        for name, data in (("app-cert", checkout["tls.crt"]), ("app-key", checkout["tls.key"])):
            files[name] = f"{d}/{name}.pem"
            with open(files[name], "wb") as f:
                f.write(data)
        application = ssl.create_default_context(cafile=files["ca"])
        application.check_hostname = False
        application.load_cert_chain(files["app-cert"], files["app-key"])
        with pytest.raises((OSError, ssl.SSLError)):
            urllib.request.urlopen(f"https://{member_ip}:2379/version", timeout=5,
                                   context=application).read()

    # The example's Clusters are pinned to zones this node lacks: a Development Instance
    # with TLS turned on (one etcd member, one server) serves here. The operator creates its
    # Table through the server with its own certificate and reports it.
    k.apply(SECURED)
    k.wait_cond("clusters", "secured-c1", "Ready", timeout=120)
    k.wait("Table secured-t created over TLS", lambda: "cf" in (
        ((k.cr("tables", "secured-t") or {}).get("status") or {}).get("columnFamilies") or {}),
        timeout=90)
    secured = {n: k.wait(f"Secret {n}", lambda n=n: _secret(k, n))
               for n in ("secured-identity-admin", "secured-identity-app")}
    ip = k.ready_pod_ip("secured-c1")
    endpoint = f"{ip}:8086"
    server_name = f"server.secured.{NS}.basalt"
    table = f"projects/{NS}/instances/secured/tables/t"
    admin = secured["secured-identity-admin"]
    c = btlib.GapicClients(endpoint, btlib.secure_channel(
        endpoint, ca["ca.crt"], key=admin["tls.key"], cert=admin["tls.crt"],
        server_name=server_name))
    try:
        btlib.mutate_row(c.data, table, b"row#1",
                         [btlib.set_cell("cf", b"q", b"v", 1000)], timeout=20)
        got = [ch.row_key for r in c.data.read_rows(
            request=v2.ReadRowsRequest(table_name=table), timeout=20) for ch in r.chunks if ch.row_key]
        assert got == [b"row#1"], got
    finally:
        c.close()
    # The identity's bearer token authenticates it (it holds no role yet: PERMISSION_DENIED);
    # no credentials: UNAUTHENTICATED; plaintext fails.
    app = secured["secured-identity-app"]
    token = btlib.GapicClients(endpoint, btlib.secure_channel(
        endpoint, ca["ca.crt"], token=app["token"].decode().strip(), server_name=server_name))
    anonymous = btlib.GapicClients(endpoint, btlib.secure_channel(
        endpoint, ca["ca.crt"], server_name=server_name))
    plain = btlib.GapicClients(endpoint)
    try:
        request = v2.ReadRowsRequest(table_name=table)
        with pytest.raises(gexc.PermissionDenied):
            list(token.data.read_rows(request=request, timeout=20))
        with pytest.raises(gexc.Unauthenticated):
            list(anonymous.data.read_rows(request=request, timeout=20))
        with pytest.raises((gexc.ServiceUnavailable, gexc.DeadlineExceeded)):
            list(plain.data.read_rows(request=request, timeout=5))
    finally:
        for x in (token, anonymous, plain):
            x.close()

    # serviceAccountTokens: the servers run as secured-tablet-server, bound (by the operator,
    # with the chart's RBAC) to the token reviewer, and take a pod's ServiceAccount token:
    # TokenReview says who it is; it holds what it is granted.
    binding_path = f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/basalt:token-review:{NS}:secured"
    binding = k.api.get(binding_path)
    assert binding["roleRef"]["name"] == f"{harness.RELEASE}-token-reviewer", binding
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "secured-tablet-server",
                                    "namespace": NS}], binding
    sa = k.api.get(f"/api/v1/namespaces/{NS}/serviceaccounts/secured-tablet-server")
    assert sa["metadata"]["ownerReferences"][0]["name"] == "secured"
    pod = k.pods("basalt.dev/cluster=secured-c1")[0]
    assert pod["spec"]["serviceAccountName"] == "secured-tablet-server"
    k.kubectl.run("create", "serviceaccount", "-n", NS, "reporting")
    sa_token = harness.service_account_token(k.api, NS, "reporting")
    member = f"serviceAccount:system:serviceaccount:{NS}:reporting"
    reporting = btlib.GapicClients(endpoint, btlib.secure_channel(
        endpoint, ca["ca.crt"], token=sa_token, server_name=server_name))
    forged = btlib.GapicClients(endpoint, btlib.secure_channel(
        endpoint, ca["ca.crt"], token=sa_token[:-4] + "AAAA", server_name=server_name))
    c = btlib.GapicClients(endpoint, btlib.secure_channel(
        endpoint, ca["ca.crt"], key=admin["tls.key"], cert=admin["tls.crt"],
        server_name=server_name))
    try:
        request = v2.ReadRowsRequest(table_name=table)
        with pytest.raises(gexc.PermissionDenied) as denied:
            list(reporting.data.read_rows(request=request, timeout=20))
        assert member in str(denied.value) and "bigtable.tables.readRows" in str(denied.value)
        with pytest.raises(gexc.Unauthenticated) as refused:
            list(forged.data.read_rows(request=request, timeout=20))
        assert sa_token[:20] not in str(refused.value)
        from google.iam.v1 import iam_policy_pb2, policy_pb2
        policy = c.admin.get_iam_policy(
            request=iam_policy_pb2.GetIamPolicyRequest(resource=table), timeout=10)
        policy.bindings.append(policy_pb2.Binding(role="roles/bigtable.reader", members=[member]))
        c.admin.set_iam_policy(request=iam_policy_pb2.SetIamPolicyRequest(
            resource=table, policy=policy), timeout=10)

        def granted():
            try:
                return [ch.row_key for r in reporting.data.read_rows(request=request, timeout=20)
                        for ch in r.chunks if ch.row_key]
            except gexc.PermissionDenied:
                return None
        assert k.wait("the ServiceAccount's grant to take effect", granted, timeout=20) == [b"row#1"]
        with pytest.raises(gexc.PermissionDenied):
            btlib.mutate_row(reporting.data, table, b"row#2",
                             [btlib.set_cell("cf", b"q", b"v", 1000)], timeout=20)
        # A grant to the group of the namespace's ServiceAccounts (a group TokenReview names
        # for the token) reaches it: it may write now.
        policy = c.admin.get_iam_policy(
            request=iam_policy_pb2.GetIamPolicyRequest(resource=table), timeout=10)
        policy.bindings.append(policy_pb2.Binding(
            role="roles/bigtable.user", members=[f"group:system:serviceaccounts:{NS}"]))
        c.admin.set_iam_policy(request=iam_policy_pb2.SetIamPolicyRequest(
            resource=table, policy=policy), timeout=10)

        def writes():
            try:
                btlib.mutate_row(reporting.data, table, b"row#2",
                                 [btlib.set_cell("cf", b"q", b"v", 1000)], timeout=20)
                return True
            except gexc.PermissionDenied:
                return False
        k.wait("the group's grant to take effect", writes, timeout=20)
        assert [ch.row_key for r in reporting.data.read_rows(request=request, timeout=20)
                for ch in r.chunks if ch.row_key] == [b"row#1", b"row#2"]
    finally:
        for x in (reporting, forged, c):
            x.close()
    k.kubectl.run("delete", "-n", NS, "table/secured-t", "cluster/secured-c1", "instance/secured",
                  "--wait=false")
    # The binding is cluster-scoped: the Instance's finalizer deletes it.
    k.wait("the token-review binding deleted with its Instance",
           lambda: k.api.get_or_none(binding_path) is None, timeout=60)


def write_and_read(monkeypatch, ip, project, instance, table_id, rows: dict, write: bool = True):
    from google.cloud import bigtable

    monkeypatch.setenv("BIGTABLE_EMULATOR_HOST", f"{ip}:8086")
    client = bigtable.Client(project=project, admin=True)
    try:
        inst = client.instance(instance)
        assert table_id in [t.table_id for t in inst.list_tables()]
        table = inst.table(table_id)
        if write:
            for key, value in rows.items():
                row = table.direct_row(key)
                row.set_cell("cf", b"greeting", value)
                row.commit()
        for key, value in rows.items():
            got = table.read_row(key)
            assert got is not None, key
            assert got.cells["cf"][b"greeting"][0].value == value
    finally:
        client.close()


def read_rows(monkeypatch, ip, project, instance, table_id, rows: dict) -> bool:
    """True when every row of ``rows`` reads back with its value through the server at ``ip``;
    False when one does not. A failed call raises (a wait retries it: a tablet mid-move answers
    a retryable UNAVAILABLE for a moment)."""
    from google.cloud import bigtable

    monkeypatch.setenv("BIGTABLE_EMULATOR_HOST", f"{ip}:8086")
    client = bigtable.Client(project=project, admin=True)
    try:
        table = client.instance(instance).table(table_id)
        for key, value in rows.items():
            got = table.read_row(key)
            if got is None or got.cells["cf"][b"greeting"][0].value != value:
                return False
        return True
    finally:
        client.close()


def _events(k, name: str, ns: str = NS) -> list[tuple[str, str]]:
    """(reason, message) of the events about object ``name``."""
    items = k.api.get(f"/api/v1/namespaces/{ns}/events",
                      fieldSelector=f"involvedObject.name={name}")["items"]
    return [(e.get("reason") or "", e.get("message") or e.get("note") or "") for e in items]


def test_kubectl_scale_cluster(k, monkeypatch):
    """`kubectl scale` on a Cluster (scale subresource) changes the StatefulSet. 3 → 4: the new
    pod runs, is Ready and receives tablets from the rebalancer. 4 → 3 goes in two steps: the
    Cluster shows the scale-in draining quickstart-c1-3 (status.scaleIn, ScaleIn=True), the
    master moves its tablets off, then its pod stops; its volume claim stays (Retain) and every
    row written before reads back. 3 → 1 reverted at once to 3 cancels: every pod keeps running
    with its data, the rows read back through each, scaleIn is gone."""
    k.wait_cond("clusters", "quickstart-c1", "Ready")
    ip = k.ready_pod_ip("quickstart-c1")
    # One row in each of the table's four tablets (split at g, n, t).
    rows = {f"{prefix}#scale".encode(): f"written before scaling, {prefix}".encode()
            for prefix in ("apple", "kiwi", "pear", "zucchini")}
    write_and_read(monkeypatch, ip, NS, "quickstart", "greetings", rows)

    def status():
        return (k.cr("clusters", "quickstart-c1") or {}).get("status") or {}

    def tablets_of(name: str) -> int | None:
        for n in status().get("nodes") or []:
            if n["name"] == name:
                return n["tablets"]
        return None

    def all_pods_read_the_rows():
        pods = [p for p in k.pods("basalt.dev/cluster=quickstart-c1")
                if (cond(p, "Ready") or {}).get("status") == "True"]
        return len(pods) >= 1 and all(
            read_rows(monkeypatch, p["status"]["podIP"], NS, "quickstart", "greetings", rows)
            for p in pods) and pods

    # 3 → 4: the fourth server comes up and the rebalancer gives it tablets.
    k.kubectl.run("scale", "-n", NS, "cluster/quickstart-c1", "--replicas=4")
    assert k.cr("clusters", "quickstart-c1")["spec"]["serveNodes"] == 4
    k.wait("StatefulSet quickstart-c1 replicas=4", lambda: k.sts("quickstart-c1")["spec"]["replicas"] == 4)
    k.wait("4 ready tablet servers", lambda: (k.sts("quickstart-c1")["status"].get("readyReplicas") or 0) == 4,
           timeout=120)
    k.wait("Cluster status 4/4", lambda: (lambda s: s.get("serveNodes") == 4 and s.get("readyNodes") == 4)(
        status()))
    scale = k.api.get(f"{GROUP}/namespaces/{NS}/clusters/quickstart-c1/scale")
    assert scale["spec"]["replicas"] == 4 and scale["status"]["replicas"] == 4
    assert "basalt.dev/cluster=quickstart-c1" in scale["status"]["selector"]

    def fourth_has_tablets():
        _poke(k, "clusters", "quickstart-c1", NS)
        return (tablets_of("quickstart-c1-3") or 0) >= 1

    k.wait("the rebalancer to give quickstart-c1-3 tablets", fourth_has_tablets, timeout=120)
    k.wait("every pod to read the rows", all_pods_read_the_rows, timeout=60)

    # 4 → 3: drained, then stopped.
    k.kubectl.run("scale", "-n", NS, "cluster/quickstart-c1", "--replicas=3")
    draining = k.wait("status.scaleIn draining quickstart-c1-3",
                      lambda: (lambda s: s if (s.get("scaleIn") or {}).get("drainingNodes") == ["quickstart-c1-3"]
                               else None)(status()))
    assert draining["scaleIn"]["fromNodes"] == 4 and draining["scaleIn"]["toNodes"] == 3, draining["scaleIn"]
    c = cond({"status": draining}, "ScaleIn")
    assert c["status"] == "True" and c["reason"] == "Draining", c
    assert "scaling in from 4 to 3" in c["message"], c
    assert k.api.get_or_none(f"/api/v1/namespaces/{NS}/pods/quickstart-c1-3") is not None

    def drained():
        _poke(k, "clusters", "quickstart-c1", NS)
        return tablets_of("quickstart-c1-3") in (0, None)

    k.wait("the tablets of quickstart-c1-3 to move off it", drained, timeout=120)
    k.wait("StatefulSet quickstart-c1 replicas=3", lambda: k.sts("quickstart-c1")["spec"]["replicas"] == 3)
    k.wait_gone("pod quickstart-c1-3",
                lambda: k.api.get_or_none(f"/api/v1/namespaces/{NS}/pods/quickstart-c1-3"), timeout=120)
    done = k.wait_cond("clusters", "quickstart-c1", "ScaleIn", "False", reason="Completed")
    assert "scaleIn" not in done["status"], done["status"]
    assert k.pvc("data-quickstart-c1-3") is not None, "a scale-in keeps the volume claim (Retain)"
    k.wait("Cluster status 3/3", lambda: (lambda s: s.get("serveNodes") == 3 and s.get("readyNodes") == 3)(
        status()))
    assert sum(n["tablets"] for n in status().get("nodes") or []) == 4, status().get("nodes")
    k.wait("every pod to read the rows", all_pods_read_the_rows, timeout=60)
    reasons = [r for r, _ in _events(k, "quickstart-c1")]
    assert "ScaleInStarted" in reasons and "ScaleInCompleted" in reasons, reasons
    assert cond(done, "DrainBlocked")["status"] == "False", done["status"]["conditions"]
    assert cond(done, "ScaleInBlocked") is None, done["status"]["conditions"]

    # 3 → 1, and right away back to 3: cancelled, nothing stopped, nothing lost.
    uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in k.pods("basalt.dev/cluster=quickstart-c1")}
    assert len(uids) == 3, uids
    k.kubectl.run("scale", "-n", NS, "cluster/quickstart-c1", "--replicas=1")
    started = k.wait("status.scaleIn to 1",
                     lambda: (lambda s: s if (s.get("scaleIn") or {}).get("toNodes") == 1 else None)(status()),
                     timeout=30)
    assert started["scaleIn"]["drainingNodes"] == ["quickstart-c1-1", "quickstart-c1-2"], started["scaleIn"]
    k.kubectl.run("scale", "-n", NS, "cluster/quickstart-c1", "--replicas=3")
    cancelled = k.wait_cond("clusters", "quickstart-c1", "ScaleIn", "False", reason="Cancelled")
    assert "scaleIn" not in cancelled["status"], cancelled["status"]
    assert k.sts("quickstart-c1")["spec"]["replicas"] == 3
    k.wait("every pod to read the rows", all_pods_read_the_rows, timeout=60)
    after = {p["metadata"]["name"]: p["metadata"]["uid"] for p in k.pods("basalt.dev/cluster=quickstart-c1")}
    assert after == uids, "a cancelled scale-in stops no pod"
    assert "ScaleInCancelled" in [r for r, _ in _events(k, "quickstart-c1")]
    k.wait_cond("clusters", "quickstart-c1", "Ready")


INVALID_SCHEMA = [
    ("storageType enum", """
apiVersion: basalt.dev/v1alpha1
kind: Cluster
metadata: {name: bad-storage}
spec: {instanceRef: quickstart, serveNodes: 1, storageType: NVMe}
""", "storageType"),
    ("serveNodes minimum", """
apiVersion: basalt.dev/v1alpha1
kind: Cluster
metadata: {name: bad-nodes}
spec: {instanceRef: quickstart, serveNodes: 0}
""", "serveNodes"),
    ("displayName length", """
apiVersion: basalt.dev/v1alpha1
kind: Instance
metadata: {name: bad-display}
spec: {displayName: ab}
""", "displayName"),
    ("gcRule maxAge pattern", """
apiVersion: basalt.dev/v1alpha1
kind: Table
metadata: {name: bad-gc}
spec:
  instanceRef: quickstart
  columnFamilies: {cf: {gcRule: {maxAge: "7 days"}}}
""", "maxAge"),
]


@pytest.mark.parametrize("what,doc,field", INVALID_SCHEMA, ids=[w for w, _, _ in INVALID_SCHEMA])
def test_invalid_refused_by_schema(k, what, doc, field):
    """The API server's structural schema refuses invalid specs."""
    cp = k.apply(doc, check=False)
    assert cp.returncode != 0, f"{what}: accepted:\n{cp.stdout}"
    assert field in cp.stderr, cp.stderr
    assert "Invalid value" in cp.stderr or "Unsupported value" in cp.stderr, cp.stderr


def test_invalid_reported_in_conditions(k):
    """What 1.20 cannot check (CEL rules are ignored there) the operator refuses: Degraded
    with reason InvalidSpec, and nothing is created or changed."""
    # Both serveNodes and autoscaling (a CEL rule on newer API servers).
    k.apply("""
apiVersion: basalt.dev/v1alpha1
kind: Cluster
metadata: {name: both-sizes}
spec:
  instanceRef: quickstart
  serveNodes: 1
  autoscaling: {minServeNodes: 1, maxServeNodes: 2, cpuUtilizationPercent: 50}
""")
    c = k.wait_cond("clusters", "both-sizes", "Degraded", "True", reason="InvalidSpec")
    assert "serveNodes" in cond(c, "Degraded")["message"]
    assert k.sts("both-sizes") is None

    # The cluster id rule on the name (CEL on metadata.name).
    k.apply("""
apiVersion: basalt.dev/v1alpha1
kind: Cluster
metadata: {name: c1}
spec: {instanceRef: quickstart, serveNodes: 1}
""")
    k.wait_cond("clusters", "c1", "Degraded", "True", reason="InvalidSpec")
    assert k.sts("c1") is None

    k.kubectl.run("delete", "-n", NS, "cluster/both-sizes", "cluster/c1", "--wait=false")


def test_immutable_field_reported_in_conditions(k):
    """Changing an immutable field of a running Cluster (storageType) gives Degraded with
    InvalidSpec naming the field; the StatefulSet is not changed; reverting clears it."""
    before = k.wait("StatefulSet quickstart-c1", lambda: k.sts("quickstart-c1"))
    k.kubectl.run("patch", "-n", NS, "cluster/quickstart-c1", "--type=merge",
                  "-p", '{"spec":{"storageType":"HDD"}}')
    try:
        c = k.wait_cond("clusters", "quickstart-c1", "Degraded", "True", reason="InvalidSpec")
        assert "storageType" in cond(c, "Degraded")["message"]
        after = k.sts("quickstart-c1")
        assert after["metadata"]["generation"] == before["metadata"]["generation"]
        assert after["metadata"]["labels"]["basalt.dev/storage-type"] == "SSD"
    finally:
        k.kubectl.run("patch", "-n", NS, "cluster/quickstart-c1", "--type=merge",
                      "-p", '{"spec":{"storageType":"SSD"}}')
    k.wait_cond("clusters", "quickstart-c1", "Degraded", "False")
    k.wait_cond("clusters", "quickstart-c1", "Ready")


def test_deletion_protection(k):
    """An Instance with deletionProtection stays after `kubectl delete` (finalizer,
    DeletionBlocked) until the field is set to false; then it goes."""
    inst = k.wait("Instance orders-prod with the finalizer",
                  lambda: (lambda i: i if "basalt.dev/deletion-protection" in (i["metadata"].get("finalizers") or []) else None)(
                      k.cr("instances", "orders-prod")))
    assert inst["spec"]["deletionProtection"] is True
    k.kubectl.run("delete", "-n", NS, "instance/orders-prod", "--wait=false")
    k.wait_cond("instances", "orders-prod", "DeletionBlocked", "True")
    time.sleep(2)
    inst = k.cr("instances", "orders-prod")
    assert inst is not None and inst["metadata"].get("deletionTimestamp")

    k.kubectl.run("patch", "-n", NS, "instance/orders-prod", "--type=merge",
                  "-p", '{"spec":{"deletionProtection":false}}')
    k.wait_gone("Instance orders-prod", lambda: k.cr("instances", "orders-prod"))


def test_cluster_without_instance_reports_it(k):
    """The Clusters of a deleted Instance stay, reporting InstanceNotFound."""
    try:
        k.wait("orders-prod-c1 reporting InstanceNotFound",
               lambda: "InstanceNotFound" in str((k.cr("clusters", "orders-prod-c1").get("status") or {}).get("conditions")))
    finally:
        k.kubectl.run("delete", "-n", NS, "cluster/orders-prod-c1", "cluster/orders-prod-c2",
                      "table/orders", "appprofile/batch", "appprofile/serving", "--wait=false")


def test_instance_deletion_collects_service_and_configmap(k):
    """An Instance's Service and ConfigMap are owned by it and go with it (garbage
    collector, owner references)."""
    k.apply("""
apiVersion: basalt.dev/v1alpha1
kind: Instance
metadata: {name: gc-instance}
spec: {displayName: GC test}
""")
    svc = k.wait("Service gc-instance", lambda: k.svc("gc-instance"))
    assert svc["metadata"]["ownerReferences"][0]["name"] == "gc-instance"
    k.wait("ConfigMap gc-instance-config",
           lambda: k.api.get_or_none(f"/api/v1/namespaces/{NS}/configmaps/gc-instance-config"))
    k.kubectl.run("delete", "-n", NS, "instance/gc-instance", "--wait=false")
    k.wait_gone("Instance gc-instance", lambda: k.cr("instances", "gc-instance"))
    k.wait_gone("Service gc-instance", lambda: k.svc("gc-instance"))
    k.wait_gone("ConfigMap gc-instance-config",
                lambda: k.api.get_or_none(f"/api/v1/namespaces/{NS}/configmaps/gc-instance-config"))


def test_cluster_deletion_keeps_volumes_unless_opted_in(k, monkeypatch):
    """Deleting a Cluster removes its StatefulSet, Services and pods through owner
    references but keeps the PersistentVolumeClaim and its data (Retain): re-creating the
    Cluster serves the same rows. A second Cluster of the Instance is seeded with the rows
    written before it and replicates the first's writes; AppProfiles' status says where they
    route; deleting it is held while a single-cluster AppProfile names it, a client connected
    to its pod is served by the other meanwhile, and every write it acknowledged stays. With
    volumeReclaimPolicy Delete the claims go too."""
    k.wait_cond("clusters", "quickstart-c1", "Ready")
    ip = k.ready_pod_ip("quickstart-c1")
    rows = {b"keep#1": b"still here"}
    write_and_read(monkeypatch, ip, NS, "quickstart", "greetings", rows)
    data_dir = k.kubelet.claim_dir(NS, "data-quickstart-c1-0")
    assert data_dir.is_dir()

    k.kubectl.run("delete", "-n", NS, "cluster/quickstart-c1", "--wait=false")
    k.wait_gone("Cluster quickstart-c1", lambda: k.cr("clusters", "quickstart-c1"))
    k.wait_gone("StatefulSet quickstart-c1", lambda: k.sts("quickstart-c1"))
    k.wait_gone("Service quickstart-c1-nodes", lambda: k.svc("quickstart-c1-nodes"))
    k.wait("pods of quickstart-c1 gone", lambda: not k.pods("basalt.dev/cluster=quickstart-c1"))
    assert k.pvc("data-quickstart-c1-0") is not None
    assert data_dir.is_dir() and any(data_dir.iterdir())

    k.apply(REPO / "examples" / "quickstart.yaml")
    k.wait_cond("clusters", "quickstart-c1", "Ready")
    ip = k.ready_pod_ip("quickstart-c1")
    write_and_read(monkeypatch, ip, NS, "quickstart", "greetings", rows, write=False)

    # Opted in: volumeReclaimPolicy Delete.
    k.apply("""
apiVersion: basalt.dev/v1alpha1
kind: Cluster
metadata: {name: quickstart-tmp}
spec:
  instanceRef: quickstart
  serveNodes: 1
  volumeReclaimPolicy: Delete
  podTemplate: {terminationGracePeriodSeconds: 10}
""")
    c = k.wait_cond("clusters", "quickstart-tmp", "Ready")
    assert "basalt.dev/delete-volumes" in c["metadata"]["finalizers"]
    # A second Cluster of the Instance is a replica: a row written through quickstart-c1's
    # server reads back through quickstart-tmp's (docs/replication.md).
    replicated = {b"replicated#1": b"written in c1"}
    write_and_read(monkeypatch, ip, NS, "quickstart", "greetings", replicated)
    tmp_ip = k.ready_pod_ip("quickstart-tmp")
    k.wait("the row replicated to quickstart-tmp",
           lambda: read_rows(monkeypatch, tmp_ip, NS, "quickstart", "greetings", replicated))
    # It joined an instance with data: the master seeded it with the rows written before.
    k.wait("the rows from before seeded into quickstart-tmp",
           lambda: read_rows(monkeypatch, tmp_ip, NS, "quickstart", "greetings", rows))
    # The Instance reports the replication per pair of clusters.
    inst = k.wait_cond("instances", "quickstart", "Replicating")
    pairs = {(p["source"], p["destination"]) for p in inst["status"]["replication"]}
    assert pairs == {("quickstart-c1", "quickstart-tmp"), ("quickstart-tmp", "quickstart-c1")}
    assert cond(inst, "ReplicationDegraded")["status"] == "False"
    k.wait("PVC data-quickstart-tmp-0", lambda: k.pvc("data-quickstart-tmp-0"))
    tmp_dir = k.kubelet.claim_dir(NS, "data-quickstart-tmp-0")
    k.wait("its data dir", tmp_dir.is_dir)

    # Deleting one Cluster of two, under writes (docs/replication.md, "Removing a cluster"):
    # the finalizer holds it until every write its server acknowledged is in quickstart-c1.
    # The writer stays connected to quickstart-tmp's pod (as a client whose connection was
    # open before the Service stopped routing to it) until the server stops.
    c = k.cr("clusters", "quickstart-tmp")
    assert "basalt.dev/ship-before-removal" in c["metadata"]["finalizers"], c["metadata"]
    # Two AppProfiles: one that routes to any cluster, one to quickstart-tmp alone. Their
    # status says where their requests go (docs/app-profiles.md).
    k.apply("""
apiVersion: basalt.dev/v1alpha1
kind: AppProfile
metadata: {name: qs-any}
spec:
  instanceRef: quickstart
  routing: {multiClusterRoutingUseAny: {}}
---
apiVersion: basalt.dev/v1alpha1
kind: AppProfile
metadata: {name: qs-tmp}
spec:
  instanceRef: quickstart
  routing: {singleClusterRouting: {clusterId: quickstart-tmp}}
""")
    routes = lambda name: ((k.cr("appprofiles", name) or {}).get("status") or {}).get("routesTo")
    k.wait("qs-any routes to both clusters",
           lambda: routes("qs-any") == ["quickstart-c1", "quickstart-tmp"])
    k.wait("qs-tmp routes to quickstart-tmp", lambda: routes("qs-tmp") == ["quickstart-tmp"])
    assert cond(k.cr("appprofiles", "qs-any"), "ClustersAvailable")["status"] == "True"
    acked, stop = _removal_writer(monkeypatch, tmp_ip)
    time.sleep(1)
    k.kubectl.run("delete", "-n", NS, "cluster/quickstart-tmp", "--wait=false")
    # Held while qs-tmp routes only to it, as Bigtable refuses to delete such a cluster; the
    # multi-cluster profile leaves it out at once.
    held = k.wait("the removal held by AppProfile qs-tmp", lambda: (
        r := cond({"status": (k.cr("clusters", "quickstart-tmp") or {}).get("status") or {}},
                  "Removing")) and r["reason"] == "TargetedByAppProfile" and r)
    assert "app profile(s) qs-tmp route only to cluster quickstart-tmp" in held["message"], held
    k.wait("qs-any routes to quickstart-c1 alone", lambda: routes("qs-any") == ["quickstart-c1"])
    held_for = len(acked)
    time.sleep(2)
    assert k.cr("clusters", "quickstart-tmp") is not None
    # The writer's connection to quickstart-tmp's pod is served by quickstart-c1 meanwhile.
    assert len(acked) > held_for, "the writer connected to the removed cluster's pod stalled"
    k.kubectl.run("delete", "-n", NS, "appprofile/qs-tmp", "--wait=false")
    seen, unrouted = set(), False
    deadline = time.time() + TIMEOUT
    while (c := k.cr("clusters", "quickstart-tmp")) is not None and time.time() < deadline:
        r = cond({"status": c.get("status") or {}}, "Removing")
        if r and r["status"] == "True":
            seen.add(r["reason"])
        unrouted = unrouted or any("basalt.dev/instance" not in p["metadata"].get("labels", {})
                                   for p in k.pods("basalt.dev/cluster=quickstart-tmp"))
        time.sleep(0.2)
    stop.set()
    assert k.cr("clusters", "quickstart-tmp") is None, "the removal did not finish"
    # After the hold, it waits (if at all) for writes to ship, then stops its servers.
    assert seen <= {"TargetedByAppProfile", "UnshippedWrites", "StoppingServers"}, seen
    assert unrouted, "the Instance's Service kept routing to the removed Cluster's pods"
    reasons = [r for r, _ in _events(k, "quickstart-tmp")]
    assert "Removing" in reasons and "Removed" in reasons, reasons
    assert len(acked) > 5, len(acked)
    # Every write quickstart-tmp acknowledged reads back through quickstart-c1.
    assert read_rows(monkeypatch, ip, NS, "quickstart", "greetings", dict(acked)), (
        f"a write acknowledged by the removed cluster is missing from quickstart-c1 "
        f"({len(acked)} acknowledged)")
    k.wait_gone("PVC data-quickstart-tmp-0", lambda: k.pvc("data-quickstart-tmp-0"))
    k.wait_gone("StatefulSet quickstart-tmp", lambda: k.sts("quickstart-tmp"))
    k.wait("its data dir removed", lambda: not tmp_dir.exists())
    k.kubectl.run("delete", "-n", NS, "appprofile/qs-any")


def _removal_writer(monkeypatch, ip: str):
    """Writes rows through the server at ``ip`` until the returned event is set (a failed write
    is not acknowledged and not retried): the dict of acknowledged rows, and the event."""
    import threading

    from google.cloud import bigtable

    monkeypatch.setenv("BIGTABLE_EMULATOR_HOST", f"{ip}:8086")
    client = bigtable.Client(project=NS, admin=True)
    table = client.instance("quickstart").table("greetings")
    acked: dict[bytes, bytes] = {}
    stop = threading.Event()

    def write():
        i = 0
        while not stop.is_set():
            key, value = f"removal#{i:06d}".encode(), f"v{i}".encode()
            i += 1
            row = table.direct_row(key)
            row.set_cell("cf", b"greeting", value)
            try:
                status = table.mutate_rows([row], retry=None, timeout=2)[0]
            except Exception:  # the server stopped: not acknowledged
                time.sleep(0.05)
                continue
            if status.code == 0:
                acked[key] = value
        client.close()

    threading.Thread(target=write, daemon=True).start()
    return acked, stop


def _snapshot(k) -> dict:
    """What the operator manages for the quickstart instance: specs, labels, annotations,
    owners, generations, and the tablet server pod's uid (not resourceVersions: 1.20 bumps
    them for a no-op server-side apply, through managedFields)."""
    out = {}
    for path in (f"/apis/apps/v1/namespaces/{NS}/statefulsets/quickstart-c1",
                 f"/api/v1/namespaces/{NS}/services/quickstart-c1-nodes",
                 f"/api/v1/namespaces/{NS}/services/quickstart",
                 f"/api/v1/namespaces/{NS}/configmaps/quickstart-config",
                 f"/api/v1/namespaces/{NS}/pods/quickstart-c1-0"):
        obj = k.api.get(path)
        m = obj["metadata"]
        out[path] = {"uid": m["uid"], "generation": m.get("generation"), "labels": m.get("labels"),
                     "annotations": m.get("annotations"), "owners": m.get("ownerReferences"),
                     "spec": obj.get("spec"), "data": obj.get("data")}
    return out


def test_operator_restart_converges(k):
    """The operator killed mid-way (SIGKILL while objects are being created) and started
    again converges to the same state; a restart on a converged state changes nothing."""
    k.stop_operator("op-1")
    k.apply("""
apiVersion: basalt.dev/v1alpha1
kind: Table
metadata: {name: later}
spec:
  instanceRef: quickstart
  columnFamilies: {cf: {gcRule: {maxNumVersions: 2}}, more: {gcRule: {maxAge: 1h}}}
""")
    k.apply("""
apiVersion: basalt.dev/v1alpha1
kind: Cluster
metadata: {name: quickstart-c9}
spec:
  instanceRef: quickstart
  serveNodes: 1
  podTemplate: {terminationGracePeriodSeconds: 10}
""")
    op = k.start_operator("op-1")
    # Kill it as soon as it has started creating things.
    k.wait("the operator to start on quickstart-c9", lambda: k.sts("quickstart-c9"), timeout=60)
    op.proc.p.kill()
    op.proc.p.wait()
    k.operators.pop("op-1")
    k.start_operator("op-1")

    k.wait_cond("clusters", "quickstart-c9", "Ready")
    k.wait("Table later with both families", lambda: set(
        ((k.cr("tables", "later").get("status") or {}).get("columnFamilies") or {})) == {"cf", "more"})
    k.wait_cond("instances", "quickstart", "Ready")
    k.kubectl.run("delete", "-n", NS, "cluster/quickstart-c9", "--wait=false")
    k.wait_gone("StatefulSet quickstart-c9", lambda: k.sts("quickstart-c9"))

    # Converged: a restart changes nothing.
    time.sleep(3)
    before = _snapshot(k)
    k.stop_operator("op-1")
    k.start_operator("op-1")
    k.wait_cond("clusters", "quickstart-c1", "Ready")
    time.sleep(8)
    assert _snapshot(k) == before


def test_two_replicas_elect_one_leader(k):
    """Two operator replicas: one holds the Lease and reconciles, the other waits; when the
    leader stops, the other takes over and reconciles."""
    lease_path = (f"/apis/coordination.k8s.io/v1/namespaces/{harness.OPERATOR_NAMESPACE}"
                  f"/leases/basalt-operator")
    op1 = k.operators["op-1"]
    k.wait("op-1 leading", lambda: op1.metric("basalt_operator_leader") == 1)
    op2 = k.start_operator("op-2")
    time.sleep(3)
    assert k.api.get(lease_path)["spec"]["holderIdentity"] == "op-1"
    assert op2.metric("basalt_operator_leader") == 0
    assert op1.metric("basalt_operator_leader") == 1

    assert k.stop_operator("op-1") == 0
    k.wait("op-2 leading", lambda: op2.metric("basalt_operator_leader") == 1, timeout=60)
    assert k.api.get(lease_path)["spec"]["holderIdentity"] == "op-2"

    # op-2 reconciles.
    k.apply("""
apiVersion: basalt.dev/v1alpha1
kind: Cluster
metadata: {name: leader-check}
spec:
  instanceRef: quickstart
  serveNodes: 1
  autoscaling: {minServeNodes: 1, maxServeNodes: 2, cpuUtilizationPercent: 50}
""")
    k.wait_cond("clusters", "leader-check", "Degraded", "True", reason="InvalidSpec")
    k.kubectl.run("delete", "-n", NS, "cluster/leader-check", "--wait=false")

    # op-1 comes back as a follower.
    op1 = k.start_operator("op-1")
    time.sleep(3)
    assert op1.metric("basalt_operator_leader") == 0
    assert k.api.get(lease_path)["spec"]["holderIdentity"] == "op-2"


def _poke(k, plural: str, name: str, ns: str) -> None:
    """A metadata change: the operator reconciles the object now, not at its next resync."""
    k.api.merge_patch(f"{GROUP}/namespaces/{ns}/{plural}/{name}",
                      {"metadata": {"annotations": {"e2e.basalt.dev/look-again": str(time.monotonic())}}})


def test_three_node_cluster_serves_one_table_through_its_service(k, monkeypatch):
    """A Development Instance (one etcd member) with a Cluster of 3 nodes and a Table split
    into 4 tablets: the master spreads the tablets over the 3 tablet servers; rows written
    through the Instance's Service are read back through every pod (each forwards what it does
    not own); the Cluster status shows tablets on all 3 nodes."""
    from google.cloud import bigtable

    ns = "three-nodes"
    k.namespace(ns)
    k.apply("""
apiVersion: basalt.dev/v1alpha1
kind: Instance
metadata: {name: triple}
spec: {displayName: Three nodes, type: Development}
---
apiVersion: basalt.dev/v1alpha1
kind: Cluster
metadata: {name: triple-c1}
spec:
  instanceRef: triple
  serveNodes: 3
  podTemplate: {terminationGracePeriodSeconds: 10}
---
apiVersion: basalt.dev/v1alpha1
kind: Table
metadata: {name: spread}
spec:
  instanceRef: triple
  columnFamilies: {cf: {gcRule: {maxNumVersions: 1}}}
  initialSplits: ["g", "n", "t"]
""", ns=ns)
    try:
        meta = k.wait("etcd pod triple-meta-0 Ready", lambda: (lambda p: p if p and (
            cond(p, "Ready") or {}).get("status") == "True" else None)(
            k.api.get_or_none(f"/api/v1/namespaces/{ns}/pods/triple-meta-0")), timeout=120)
        assert meta["spec"]["containers"][0]["image"].rsplit("/", 1)[-1].startswith("etcd")
        k.wait("3 ready tablet servers of triple-c1",
               lambda: (k.sts("triple-c1", ns).get("status") or {}).get("readyReplicas") == 3,
               timeout=180)
        k.wait_cond("instances", "triple", "MetadataStoreReady", ns=ns)
        k.wait("Table spread with its family",
               lambda: "cf" in (((k.cr("tables", "spread", ns) or {}).get("status") or {})
                                .get("columnFamilies") or {}), timeout=120)

        # The Instance's Service, resolved as cluster DNS would (one ready tablet server).
        service_ip = k.wait("Service triple resolvable",
                       lambda: k.kubelet.service_hosts().get(f"triple.{ns}.svc"))
        pods = sorted(k.pods("basalt.dev/cluster=triple-c1", ns), key=lambda p: p["metadata"]["name"])
        assert len(pods) == 3
        ips = [p["status"]["podIP"] for p in pods]
        assert service_ip in ips

        rows = {f"{prefix}#{i}".encode(): f"value {prefix} {i}".encode()
                for prefix in ("apple", "kiwi", "pear", "zucchini") for i in range(3)}

        def write_via_service():
            monkeypatch.setenv("BIGTABLE_EMULATOR_HOST", f"{service_ip}:8086")
            client = bigtable.Client(project=ns, admin=True)
            try:
                table = client.instance("triple").table("spread")
                for key, value in rows.items():
                    row = table.direct_row(key)
                    row.set_cell("cf", b"greeting", value)
                    row.commit()
                return True
            finally:
                client.close()

        # The master assigns the new table's tablets within moments of its creation; until
        # then a write fails UNAVAILABLE (the wait retries it; a row written twice is the same).
        k.wait("writes through the Service", write_via_service, timeout=60)
        for ip in ips:
            write_and_read(monkeypatch, ip, ns, "triple", "spread", rows, write=False)
            monkeypatch.setenv("BIGTABLE_EMULATOR_HOST", f"{ip}:8086")
            client = bigtable.Client(project=ns, admin=True)
            try:
                scanned = {r.row_key: r.cells["cf"][b"greeting"][0].value
                           for r in client.instance("triple").table("spread").read_rows()}
            finally:
                client.close()
            assert scanned == rows, (ip, sorted(scanned))

        def spread_status():
            _poke(k, "clusters", "triple-c1", ns)
            st = (k.cr("clusters", "triple-c1", ns) or {}).get("status") or {}
            nodes = st.get("nodes") or []
            if len(nodes) == 3 and all(n["registered"] and n["tablets"] >= 1 for n in nodes):
                return st
            return None

        st = k.wait("Cluster status with tablets on all 3 nodes", spread_status, timeout=60)
        assert sorted(n["name"] for n in st["nodes"]) == [f"triple-c1-{i}" for i in range(3)], st
        assert sum(n["tablets"] for n in st["nodes"]) == 4, st["nodes"]
        assert (cond({"status": st}, "DataLoss") or {}).get("status") == "False", st["conditions"]
    finally:
        k.kubectl.run("delete", "-n", ns, "table/spread", "cluster/triple-c1", "instance/triple",
                      "--wait=false", check=False)


def test_autoscaled_cluster_follows_the_autoscaler(k, monkeypatch):
    """A Cluster with `autoscaling` (1 to 2 nodes, a CPU target of 10 %) and a CPU request of
    200m, the tablet servers' allocation (BASALT_CPU_ALLOCATION_MILLICORES, downward API): a
    target of 20 millicores a node, far below what one client writing batches costs a server
    (about 150m) and far above what an idle server spends (about 3m; it must stay under half
    the target for 2 idle nodes to want 1). Without Prometheus the master's autoscaler samples
    the servers' own reports and says so (ScalingActive=True, ServerReports). Under the load the
    StatefulSet follows its decision to 2 (status.autoscaler, an `Autoscaled` event), the new
    server receives tablets, and, the load wanting more than 2, ScalingLimited=True with
    MaxServeNodesReached. Once the load stops it scales in back to 1 through the drain: the
    leaving server's tablets move before its pod stops. Every write the client got
    acknowledged reads back exactly, after the scale-up and after the scale-in. The operator
    runs with AUTOSCALE_TIMINGS: about 10 s up, 25 s down."""
    ns = "autoscaling"
    k.namespace(ns)
    k.apply("""
apiVersion: basalt.dev/v1alpha1
kind: Instance
metadata: {name: elastic}
spec: {displayName: Autoscaled, type: Development}
---
apiVersion: basalt.dev/v1alpha1
kind: Cluster
metadata: {name: elastic-c1}
spec:
  instanceRef: elastic
  resources: {requests: {cpu: 200m}}
  autoscaling: {minServeNodes: 1, maxServeNodes: 2, cpuUtilizationPercent: 10}
  podTemplate: {terminationGracePeriodSeconds: 10}
---
apiVersion: basalt.dev/v1alpha1
kind: Table
metadata: {name: load}
spec:
  instanceRef: elastic
  columnFamilies: {cf: {gcRule: {maxNumVersions: 1}}}
  initialSplits: ["g", "n", "t"]
""", ns=ns)
    load = None
    watch = _AutoscalerWatch(k, ns, "elastic-c1")
    try:
        def status():
            return (k.cr("clusters", "elastic-c1", ns) or {}).get("status") or {}

        def replicas():
            return (k.sts("elastic-c1", ns) or {}).get("spec", {}).get("replicas")

        def tablets_of(name: str) -> int | None:
            for n in status().get("nodes") or []:
                if n["name"] == name:
                    return n["tablets"]
            return None

        k.wait_cond("instances", "elastic", "Ready", ns=ns, timeout=120)
        k.wait_cond("clusters", "elastic-c1", "Ready", ns=ns, timeout=120)
        assert replicas() == 1, "an autoscaled Cluster starts at minServeNodes"
        k.wait("Table load with its family",
               lambda: "cf" in (((k.cr("tables", "load", ns) or {}).get("status") or {})
                                .get("columnFamilies") or {}), timeout=60)
        # The pod's CPU request is the server's allocation (downward API, in millicores).
        env = k.sts("elastic-c1", ns)["spec"]["template"]["spec"]["containers"][0]["env"]
        alloc = next(e for e in env if e["name"] == "BASALT_CPU_ALLOCATION_MILLICORES")
        assert alloc["valueFrom"]["resourceFieldRef"]["resource"] == "requests.cpu", alloc
        assert "BASALT_CPU_ALLOCATION_MILLICORES=200" in _proc_environ(k, ns, "elastic-c1-0")

        # The autoscaler decides from the servers' own reports: no Prometheus is configured.
        active = k.wait_cond("clusters", "elastic-c1", "ScalingActive", ns=ns, timeout=60)
        c = cond(active, "ScalingActive")
        assert c["reason"] == "ServerReports", c
        assert "from the tablet servers' own reports" in c["message"], c
        assert "no Prometheus is configured (--prometheus-url)" in c["message"], c
        auto = active["status"]["autoscaler"]
        assert auto["source"] == "servers" and auto["dimension"] == "cpu", auto
        assert auto["nodes"] == 1 and auto.get("cpuUtilizationPercent") is not None, auto
        limited = cond(active, "ScalingLimited")
        assert limited and limited["status"] == "False", active["status"]["conditions"]

        # Load: rows written through the first pod (it stays; it forwards what it does not own).
        ip = k.ready_pod_ip("elastic-c1", ns)
        load = _load_writer(monkeypatch, ip, ns, "elastic", "load")
        started = time.monotonic()
        up = k.wait("status.autoscaler.nodes 2",
                    lambda: (lambda s: s if (s.get("autoscaler") or {}).get("nodes") == 2 else None)(
                        status()), timeout=60)
        k.log(f"autoscaler: 2 nodes {time.monotonic() - started:.1f}s into the load; {up['autoscaler']}")
        assert up["autoscaler"]["dimension"] == "cpu", up["autoscaler"]
        k.wait("StatefulSet elastic-c1 replicas=2", lambda: replicas() == 2, timeout=30)
        k.wait("2 ready tablet servers of elastic-c1",
               lambda: (k.sts("elastic-c1", ns).get("status") or {}).get("readyReplicas") == 2,
               timeout=60)
        scaled = k.wait("an Autoscaled event",
                        lambda: [m for r, m in _events(k, "elastic-c1", ns) if r == "Autoscaled"],
                        timeout=30)
        assert any("from 1 to 2" in m for m in scaled), scaled
        # Still loaded at 2 nodes, the CPU wants more: held at the maximum, and said so.
        held = k.wait_cond("clusters", "elastic-c1", "ScalingLimited", reason="MaxServeNodesReached",
                           ns=ns, timeout=60)
        assert "maxServeNodes is 2" in cond(held, "ScalingLimited")["message"], held["status"]
        assert held["status"]["autoscaler"]["nodes"] == 2, held["status"]["autoscaler"]
        assert held["status"]["autoscaler"]["cpuNodes"] > 2, held["status"]["autoscaler"]
        assert replicas() == 2
        k.log(f"autoscaler: held at 2 {time.monotonic() - started:.1f}s into the load")
        # The rebalancer gives the new server tablets (the Cluster status follows every 5 s).
        k.wait("the rebalancer to give elastic-c1-1 tablets",
               lambda: (tablets_of("elastic-c1-1") or 0) >= 1, timeout=60)
        assert load.writing(), f"the load stopped: {load.errors[-3:]}"
        load.stop()
        k.log(f"load: {len(load.acked)} rows acknowledged in {time.monotonic() - started:.1f}s, "
              f"{len(load.errors)} failed: {load.errors[:3]}")
        assert len(load.acked) > 50, (len(load.acked), load.errors[-3:])
        k.wait("every acknowledged row to read back exactly",
               lambda: _rows_exactly(monkeypatch, ip, ns, "elastic", "load", load), timeout=30)

        # Idle: back to one node once every sample of the down window wants fewer, through the
        # drain: the leaving server's tablets move before its pod stops.
        stopped = time.monotonic()
        draining = k.wait("the scale-in to 1 draining elastic-c1-1", lambda: (
            lambda s: s if (s.get("scaleIn") or {}).get("drainingNodes") == ["elastic-c1-1"] else None)(
            status()), timeout=60)
        assert draining["autoscaler"]["nodes"] == 1, draining["autoscaler"]
        assert draining["scaleIn"]["fromNodes"] == 2 and draining["scaleIn"]["toNodes"] == 1, draining
        assert k.api.get_or_none(f"/api/v1/namespaces/{ns}/pods/elastic-c1-1") is not None
        k.wait("the tablets of elastic-c1-1 to move off it",
               lambda: tablets_of("elastic-c1-1") in (0, None), timeout=60)
        k.wait("StatefulSet elastic-c1 replicas=1", lambda: replicas() == 1, timeout=60)
        k.log(f"autoscaler: back to 1 replica {time.monotonic() - stopped:.1f}s after the load stopped")
        k.wait_gone("pod elastic-c1-1",
                    lambda: k.api.get_or_none(f"/api/v1/namespaces/{ns}/pods/elastic-c1-1"), timeout=60)
        done = k.wait_cond("clusters", "elastic-c1", "ScaleIn", "False", reason="Completed", ns=ns)
        assert "scaleIn" not in done["status"], done["status"]
        assert [(n["name"], n["tablets"]) for n in done["status"].get("nodes") or []] == [
            ("elastic-c1-0", 4)], done["status"].get("nodes")
        assert (cond(done, "DataLoss") or {}).get("status") != "True", done["status"]["conditions"]
        k.wait("every acknowledged row to read back exactly after the scale-in",
               lambda: _rows_exactly(monkeypatch, ip, ns, "elastic", "load", load), timeout=30)
    finally:
        watch.stop()
        if load is not None:
            load.stop()
        k.kubectl.run("delete", "-n", ns, "table/load", "cluster/elastic-c1", "instance/elastic",
                      "--wait=false", check=False)
    k.wait_gone("StatefulSet elastic-c1", lambda: k.sts("elastic-c1", ns))


class _AutoscalerWatch:
    """Logs (the diagnostics' events) every change of a Cluster's autoscaler status, its
    scaling conditions and its StatefulSet's replicas, once a second: what the autoscaler saw
    and did, should the scenario fail."""

    def __init__(self, k, ns: str, name: str):
        import threading

        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(k, ns, name), daemon=True)
        self.thread.start()

    def _run(self, k, ns, name):
        last = None
        while not self.stopped.wait(1.0):
            try:
                c = k.cr("clusters", name, ns) or {}
                a = (c.get("status") or {}).get("autoscaler") or {}
                seen = (a.get("nodes"), a.get("cpuUtilizationPercent"), a.get("cpuNodes"),
                        *((x or {}).get("reason") for x in (cond(c, "ScalingActive"),
                                                            cond(c, "ScalingLimited"),
                                                            cond(c, "ScaleIn"))),
                        ((k.sts(name, ns) or {}).get("spec") or {}).get("replicas"),
                        {n["name"]: n["tablets"] for n in (c.get("status") or {}).get("nodes") or []})
            except Exception as e:  # noqa: BLE001 - diagnostics only
                seen = repr(e)[:200]
            if seen != last:
                k.log(f"{name}: nodes, cpu %, cpu nodes, ScalingActive, ScalingLimited, ScaleIn, "
                      f"replicas, tablets: {seen}")
                last = seen

    def stop(self):
        self.stopped.set()
        self.thread.join(5)


def _proc_environ(k, ns: str, pod: str) -> str:
    """The environment of the process the kubelet runs for ``pod``, one VAR=value a line."""
    uid = k.api.get(f"/api/v1/namespaces/{ns}/pods/{pod}")["metadata"]["uid"]
    pp = k.kubelet.pods[uid]
    return Path(f"/proc/{pp.proc.pid}/environ").read_bytes().replace(b"\0", b"\n").decode()


class _Load:
    """A client thread writing rows through one server, BATCH rows a request, as fast as it
    answers, until stopped: every row attempted and every row acknowledged (a failed write is
    not retried)."""

    BATCH = 20

    def __init__(self, client, table):
        import threading

        self.client = client
        self.table = table
        self.attempted: dict[bytes, bytes] = {}
        self.acked: dict[bytes, bytes] = {}
        self.errors: list[str] = []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.last_ack = time.monotonic()

    def _run(self):
        i = 0
        while not self.stopped.is_set():
            batch = []
            for _ in range(self.BATCH):
                # Spread over the table's four tablets (split at g, n, t).
                key = f"{'cipw'[i % 4]}#{i:07d}".encode()
                value = f"value {i} ".encode() * 8
                i += 1
                row = self.table.direct_row(key)
                row.set_cell("cf", b"greeting", value)
                self.attempted[key] = value
                batch.append((key, value, row))
            try:
                statuses = self.table.mutate_rows([r for _, _, r in batch], retry=None, timeout=5)
            except Exception as e:  # noqa: BLE001 - not acknowledged
                self.errors.append(f"{batch[0][0]!r}…: {e!r}"[:300])
                time.sleep(0.05)
                continue
            for (key, value, _), status in zip(batch, statuses):
                if status.code == 0:
                    self.acked[key] = value
                    self.last_ack = time.monotonic()
                else:
                    self.errors.append(f"{key!r}: {status}"[:300])

    def writing(self) -> bool:
        return self.thread.is_alive() and time.monotonic() - self.last_ack < 10

    def stop(self):
        self.stopped.set()
        self.thread.join(30)
        if not self.thread.is_alive() and self.client is not None:
            self.client.close()
            self.client = None


def _load_writer(monkeypatch, ip, project, instance, table_id) -> _Load:
    from google.cloud import bigtable

    monkeypatch.setenv("BIGTABLE_EMULATOR_HOST", f"{ip}:8086")
    client = bigtable.Client(project=project, admin=True)
    load = _Load(client, client.instance(instance).table(table_id))
    load.thread.start()
    return load


def _rows_exactly(monkeypatch, ip, project, instance, table_id, load: _Load) -> bool:
    """True when a scan through ``ip`` holds every row ``load`` got acknowledged, with its
    value, one cell each, and nothing it did not write. A failed call raises (waits retry)."""
    from google.cloud import bigtable

    monkeypatch.setenv("BIGTABLE_EMULATOR_HOST", f"{ip}:8086")
    client = bigtable.Client(project=project, admin=True)
    try:
        rows = {}
        for r in client.instance(instance).table(table_id).read_rows():
            cells = r.cells.get("cf", {}).get(b"greeting") or []
            assert len(cells) == 1, (r.row_key, cells)
            rows[r.row_key] = cells[0].value
    finally:
        client.close()
    missing = [key for key in load.acked if key not in rows]
    wrong = [key for key, v in load.acked.items() if key in rows and rows[key] != v]
    unknown = [key for key, v in rows.items() if load.attempted.get(key) != v]
    assert not wrong and not unknown, f"rows not as written: {wrong[:5]} {unknown[:5]}"
    if missing:
        raise AssertionError(f"{len(missing)} of {len(load.acked)} acknowledged rows missing, "
                             f"e.g. {missing[:5]}")
    return True


def test_backup_store_takes_backups_into_s3(k, monkeypatch, tmp_path):
    """An Instance with `spec.backupStore` naming an S3-compatible store (SeaweedFS's gateway,
    `weed mini` on loopback ports) and a credentials Secret: the StatefulSet gives its servers
    `--backup-url`, the endpoint and region as env and the Secret's keys through secretKeyRef
    (the pod waits, CreateContainerConfigError, until the Secret exists; the operator never
    reads it). Through the official Python admin client, CreateBackup of a table with rows
    becomes READY, RestoreTable into a new table reads back identically, and the backup's
    manifest and chunks are objects in the bucket under the url's prefix."""
    import datetime

    from google.cloud import bigtable
    from google.cloud.bigtable_admin_v2 import types as admin_types

    from seaweed import ACCESS_KEY, REGION, SECRET_KEY, SeaweedFS

    ns, instance, cluster = "backup-store", "archive", "archive-c1"
    store = SeaweedFS(tmp_path).start()
    k.namespace(ns)
    try:
        k.apply(f"""
apiVersion: basalt.dev/v1alpha1
kind: Instance
metadata: {{name: {instance}}}
spec:
  displayName: Archive
  type: Development
  backupStore:
    url: s3://{store.bucket}/k8s
    endpoint: {store.endpoint}
    region: {REGION}
    credentialsSecret: archive-backup-creds
---
apiVersion: basalt.dev/v1alpha1
kind: Cluster
metadata: {{name: {cluster}}}
spec:
  instanceRef: {instance}
  serveNodes: 1
  podTemplate: {{terminationGracePeriodSeconds: 10}}
---
apiVersion: basalt.dev/v1alpha1
kind: Table
metadata: {{name: ledger}}
spec:
  instanceRef: {instance}
  columnFamilies: {{cf: {{gcRule: {{maxNumVersions: 1}}}}}}
""", ns=ns)
        sts = k.wait(f"StatefulSet {cluster}", lambda: k.sts(cluster, ns))
        c = sts["spec"]["template"]["spec"]["containers"][0]
        assert f"--backup-url=s3://{store.bucket}/k8s" in c["args"], c["args"]
        env = {e["name"]: e.get("value") or e.get("valueFrom") for e in c["env"]}
        assert env["AWS_ENDPOINT_URL"] == store.endpoint and env["AWS_ALLOW_HTTP"] == "true", env
        assert env["AWS_REGION"] == REGION, env
        assert env["AWS_ACCESS_KEY_ID"] == {"secretKeyRef": {
            "name": "archive-backup-creds", "key": "AWS_ACCESS_KEY_ID"}}, env
        assert env["AWS_SESSION_TOKEN"]["secretKeyRef"]["optional"] is True, env

        # No Secret yet: the server's container cannot be created.
        def waiting_for_secret():
            pod = k.api.get_or_none(f"/api/v1/namespaces/{ns}/pods/{cluster}-0")
            st = ((pod or {}).get("status") or {}).get("containerStatuses") or [{}]
            reason = ((st[0].get("state") or {}).get("waiting") or {}).get("reason")
            return reason == "CreateContainerConfigError"

        k.wait(f"{cluster}-0 waiting for its Secret", waiting_for_secret)
        k.api.post(f"/api/v1/namespaces/{ns}/secrets", {
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "archive-backup-creds"},
            "stringData": {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}})
        k.wait(f"1 ready tablet server of {cluster}",
               lambda: (k.sts(cluster, ns).get("status") or {}).get("readyReplicas") == 1,
               timeout=180)
        environ = _proc_environ(k, ns, f"{cluster}-0").splitlines()
        assert f"AWS_ACCESS_KEY_ID={ACCESS_KEY}" in environ, environ
        assert f"AWS_ENDPOINT_URL={store.endpoint}" in environ, environ
        assert not any(e.startswith("AWS_SESSION_TOKEN=") for e in environ), environ
        k.wait("Table ledger with its family",
               lambda: "cf" in (((k.cr("tables", "ledger", ns) or {}).get("status") or {})
                                .get("columnFamilies") or {}), timeout=120)

        ip = k.ready_pod_ip(cluster, ns)
        monkeypatch.setenv("BIGTABLE_EMULATOR_HOST", f"{ip}:8086")
        client = bigtable.Client(project=ns, admin=True)
        try:
            table = client.instance(instance).table("ledger")
            rows = {b"entry#%04d" % i: b"amount %d" % (i * 7) for i in range(200)}

            def write():
                mutations = []
                for key, value in rows.items():
                    row = table.direct_row(key)
                    row.set_cell("cf", b"greeting", value)
                    mutations.append(row)
                assert all(s.code == 0 for s in table.mutate_rows(mutations))
                return True

            # The new table's tablet is assigned within moments (UNAVAILABLE until then).
            k.wait("rows written", write, timeout=60)

            admin = client.table_admin_client
            parent = f"projects/{ns}/instances/{instance}/clusters/{cluster}"
            expire = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=1)
            backup = admin.create_backup(
                parent=parent, backup_id="ledger-daily",
                backup=admin_types.Backup(source_table=table.name, expire_time=expire),
            ).result(timeout=120)
            assert backup.state == admin_types.Backup.State.READY, backup
            assert backup.size_bytes > 0, backup
            client.instance(instance).table("ledger_restored").restore(
                "ledger_restored", backup_name=backup.name).result(timeout=120)
            restored = {r.row_key: r.cells["cf"][b"greeting"][0].value
                        for r in client.instance(instance).table("ledger_restored").read_rows()}
            assert restored == rows, sorted(set(restored) ^ set(rows))[:5]
        finally:
            client.close()

        s3 = store.s3()
        manifests = s3.keys(store.bucket, f"k8s/backups/{ns}/{instance}/{cluster}/")
        assert manifests == [f"k8s/backups/{ns}/{instance}/{cluster}/ledger-daily/manifest.json"], \
            manifests
        assert s3.keys(store.bucket, "k8s/chunks/"), "no chunks under k8s/chunks/"

        # Declared backups: a Backup made once (deleted with its resource), and a schedule
        # every 4 s keeping the newest one.
        k.apply(f"""
apiVersion: basalt.dev/v1alpha1
kind: Backup
metadata: {{name: ledger-before-upgrade}}
spec: {{instanceRef: {instance}, table: ledger, retention: 2d, deletionPolicy: Delete}}
---
apiVersion: basalt.dev/v1alpha1
kind: BackupSchedule
metadata: {{name: often}}
spec: {{instanceRef: {instance}, tables: [ledger], schedule: "*/4 * * * * *", keep: 1}}
""", ns=ns)
        made = k.wait("Backup ledger-before-upgrade Ready", lambda: (lambda b: b if (
            (b or {}).get("status") or {}).get("phase") == "Ready" else None)(
            k.cr("backups", "ledger-before-upgrade", ns)), timeout=120)
        st = made["status"]
        assert st["backupName"] == f"{parent}/backups/ledger-before-upgrade", st
        assert st["sizeBytes"] > 0 and st["endTime"] and st["expireTime"], st
        assert cond(made, "Ready")["status"] == "True", st
        assert cond(made, "Ready")["observedGeneration"] == made["metadata"]["generation"], st
        assert "basalt.dev/delete-backup" in made["metadata"]["finalizers"], made["metadata"]
        backup_manifest = f"k8s/backups/{ns}/{instance}/{cluster}/ledger-before-upgrade/manifest.json"
        assert backup_manifest in s3.keys(store.bucket, f"k8s/backups/{ns}/"), "not in the bucket"

        def scheduled():
            return [key for key in s3.keys(store.bucket, f"k8s/backups/{ns}/{instance}/{cluster}/")
                    if "/often-ledger-" in key]
        seen: set[str] = set()

        def three_runs():
            seen.update(scheduled())
            return len(seen) >= 3
        k.wait("three runs of BackupSchedule often", three_runs, timeout=90)
        k.wait("pruned to one scheduled backup", lambda: len(scheduled()) == 1, timeout=30)
        sched = k.cr("backupschedules", "often", ns)
        assert sched["status"]["lastScheduleTime"] and sched["status"]["nextScheduleTime"], sched["status"]
        assert cond(sched, "Ready")["status"] == "True", sched["status"]
        assert any(b["table"] == "ledger" for b in sched["status"]["backups"]), sched["status"]
        k.kubectl.run("delete", "-n", ns, "backupschedule/often")
        # deletionPolicy Delete: the backup goes with the resource.
        k.kubectl.run("delete", "-n", ns, "backup/ledger-before-upgrade", "--timeout=60s")
        assert backup_manifest not in s3.keys(store.bucket, f"k8s/backups/{ns}/")
    finally:
        k.kubectl.run("delete", "-n", ns, "backupschedule/often", "backup/ledger-before-upgrade",
                      "--wait=false", check=False)
        k.kubectl.run("delete", "-n", ns, "table/ledger", "cluster/archive-c1", "instance/archive",
                      "--wait=false", check=False)
        store.stop()
