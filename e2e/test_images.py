"""The container images images/build makes (images/Containerfile on a base from Debian packages),
run with podman as a user would run them.

* The tablet server image, with its default command, data on a named volume, the gRPC and HTTP
  ports published, a read-only root filesystem without tmpfs mounts (as the operator's pods run
  it), all capabilities dropped: ``cbt`` and the Python client write, ``podman kill`` (SIGKILL),
  a new container on the same volume reads everything back; ``podman stop`` (SIGTERM through
  tini, PID 1) stops the server cleanly within seconds, exit code 0.
* The operator image answers ``--help`` and ``crd`` (the repository's CRDs), and runs the
  chart's command line (``basalt-operator run``, found on the image's PATH).
* The OCI archives are what ``kind load image-archive`` does with them: ``ctr images import``
  into a containerd of the test's own, under the names the chart's defaults pull.
* ``helm install`` with the images: the archives loaded into a Kubernetes node's own image store
  (the test suite's 1.20.2 control plane, its kubelet running pods from images with podman), the
  chart installed with its default image names, the quickstart Ready and served by containers of
  the images (see ``test_helm_install_runs_the_built_images``). It needs the control plane
  (e2e/k8s/build-control-plane) and helm: skipped without them, a failure with
  ``BASALT_K8S_E2E=1``.

images/build runs once per session (about 5 s once its base is cached). Without podman the
module is skipped with that reason; with ``BASALT_IMAGES_E2E=1`` (.ci/run sets it) a missing
podman, buildah, mmdebstrap, runc or containerd is a failure.

Podman flags for this sandbox (a Firecracker VM without CAP_SYS_RESOURCE, cgroup v1 with a
hugetlb controller on the unified hierarchy): bookworm's crun refuses the hybrid cgroup layout
("cgroups in hybrid mode not supported"), so containers run with ``--runtime runc``; and an
rlimit above the podman process's own cannot be set (EPERM), so ``--ulimit`` passes this
process's open-files limit and at most 32768 processes (podman lowers its own to that) instead
of podman's defaults (1048576). Both are harmless elsewhere."""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
import uuid

import pytest

import btlib
from conftest import REPO, free_port, server_binary
from test_cbt import Cbt

sys.path.insert(0, str(REPO / "e2e" / "k8s"))

import cluster  # noqa: E402
from cluster import KubeCluster  # noqa: E402
from kubelet import PodmanNode, normalize_image  # noqa: E402

REQUIRED = bool(os.environ.get("BASALT_IMAGES_E2E"))
TOOLS = ("podman", "buildah", "mmdebstrap", "runc")

if not REQUIRED and not shutil.which("podman"):
    pytest.skip("podman is not installed (apt-get install podman buildah mmdebstrap runc); "
                "BASALT_IMAGES_E2E=1 makes this a failure", allow_module_level=True)

CHART = REPO / "charts" / "basalt-operator"
WAIT = 60.0  # every wait on a container is bounded by this


def chart_default(path: str) -> str:
    """A top-level scalar of the chart's values.yaml or Chart.yaml (no YAML parser in the venv)."""
    file, key = path.split(":")
    section, _, leaf = key.rpartition(".")
    current = None
    for line in (CHART / file).read_text().splitlines():
        if line and not line.startswith((" ", "#")):
            current = line.split(":")[0]
            if not section and current == leaf:
                return line.split(":", 1)[1].strip().strip('"')
        elif section and current == section and line.strip().startswith(f"{leaf}:"):
            return line.split(":", 1)[1].strip().strip('"')
    raise AssertionError(f"{key} not found in {file}")


APP_VERSION = chart_default("Chart.yaml:appVersion")
TABLET_SERVER_IMAGE = f"docker.io/basalt/basalt-tablet-server:{APP_VERSION}"
OPERATOR_IMAGE = f"docker.io/basalt/basalt-operator:{APP_VERSION}"


def podman(*args: str, check: bool = True, timeout: float = WAIT) -> subprocess.CompletedProcess:
    proc = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)
    if check:
        assert proc.returncode == 0, (
            f"podman {' '.join(args)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def run_flags() -> list[str]:
    _, nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
    _, nproc = resource.getrlimit(resource.RLIMIT_NPROC)
    nofile = 1048576 if nofile == resource.RLIM_INFINITY else nofile
    nproc = 32768 if nproc == resource.RLIM_INFINITY else min(nproc, 32768)
    return ["--runtime", "runc", "--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={nproc}:{nproc}"]


@pytest.fixture(scope="session")
def images(tmp_path_factory) -> dict:
    """images/build once per session: the two images in containers-storage and their archives."""
    missing = [t for t in TOOLS if not shutil.which(t)]
    assert not missing, f"the image tests need {', '.join(missing)}: apt-get install {' '.join(missing)}"
    out = tmp_path_factory.mktemp("images")
    started = time.monotonic()
    # The binaries the rest of the suite runs ($BASALT_BIN's directory: the test command's profile).
    bin_dir = server_binary().parent
    proc = subprocess.run([str(REPO / "images" / "build"), "--bin-dir", str(bin_dir), "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"images/build failed\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    print(f"images/build: {time.monotonic() - started:.1f} s\n{(out / 'sizes.txt').read_text()}")
    return {"out": out, "sizes": (out / "sizes.txt").read_text()}


class Containers:
    """Names of this test's containers and volumes, all removed at teardown."""

    def __init__(self):
        self.tag = uuid.uuid4().hex[:8]
        self.containers: list[str] = []
        self.volumes: list[str] = []

    def name(self, what: str) -> str:
        name = f"basalt-e2e-{what}-{self.tag}-{len(self.containers) + 1}"
        self.containers.append(name)
        return name

    def volume(self) -> str:
        name = f"basalt-e2e-data-{self.tag}"
        podman("volume", "create", name)
        self.volumes.append(name)
        return name

    def cleanup(self):
        for c in self.containers:
            podman("rm", "--force", "--volumes", "--time", "0", c, check=False)
        for v in self.volumes:
            podman("volume", "rm", "--force", v, check=False)


@pytest.fixture
def containers():
    c = Containers()
    yield c
    c.cleanup()


def state(container: str) -> dict:
    out = podman("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", container).stdout.split()
    return {"status": out[0], "exit_code": int(out[1])}


def final_state(container: str) -> dict:
    """The container's state once podman is done with it: a container passes through "stopped"
    (its process is gone, podman's cleanup not yet done) on the way to "exited"."""
    deadline = time.monotonic() + WAIT
    while (now := state(container))["status"] != "exited" and time.monotonic() < deadline:
        time.sleep(0.1)
    return now


def logs(container: str) -> str:
    p = podman("logs", container, check=False)
    return p.stdout + p.stderr


def start_tablet_server(containers: Containers, volume: str, port: int, http_port: int) -> str:
    """The image's own command (standalone, /var/lib/basalt/data) on `volume`, as the operator's
    pods run it: read-only root without tmpfs mounts, no capabilities, no privilege escalation."""
    name = containers.name("tablet-server")
    podman("run", "--detach", "--name", name, *run_flags(),
           "--read-only", "--read-only-tmpfs=false", "--cap-drop=ALL",
           "--security-opt=no-new-privileges",
           "--volume", f"{volume}:/var/lib/basalt",
           "--publish", f"127.0.0.1:{port}:8086", "--publish", f"127.0.0.1:{http_port}:8087",
           TABLET_SERVER_IMAGE)
    deadline = time.monotonic() + WAIT
    last = None
    while time.monotonic() < deadline:
        st = state(name)
        assert st["status"] == "running", f"{name} is {st} while starting\n{logs(name)}"
        try:
            status, _, _ = btlib.http_get(f"http://127.0.0.1:{http_port}/readyz", timeout=1)
            if status == 200:
                return name
            last = f"HTTP {status}"
        except OSError as e:
            last = repr(e)
        time.sleep(0.2)
    raise AssertionError(f"{name} not ready after {WAIT}s (last /readyz: {last})\n{logs(name)}")


def test_tablet_server_image_survives_kill_and_stops_on_sigterm(images, containers, tmp_path):
    volume = containers.volume()
    port, http_port = free_port(), free_port()
    endpoint = f"127.0.0.1:{port}"
    first = start_tablet_server(containers, volume, port, http_port)

    # Who runs: tini is PID 1, the server its child, as the image's user (uid 65532), not root.
    top = podman("top", first, "pid", "user", "comm").stdout
    procs = [line.split() for line in top.splitlines()[1:]]
    assert ["1", "basalt", "tini"] in procs, top
    assert any(p[1] == "basalt" and p[2].startswith("basalt-tablet") for p in procs), top

    home = tmp_path / "home"
    home.mkdir()
    cbt = Cbt(endpoint, home)
    cbt("createtable", "users")
    cbt("createfamily", "users", "profile")
    cbt("setgcpolicy", "users", "profile", "maxversions=3")
    cbt("set", "users", "alice", "profile:name=Alice")
    cbt("set", "users", "bob", "profile:name=Bob", "profile:age=41")
    expected_cbt = {"alice": [("profile:name", "Alice")],
                    "bob": [("profile:age", "41"), ("profile:name", "Bob")]}
    assert cbt.rows("read", "users") == expected_cbt

    clients = btlib.GapicClients(endpoint)
    try:
        table = btlib.table_name("accounts")
        btlib.create_table(clients.admin, "accounts", ["cf"])
        for i in range(50):
            btlib.mutate_row(clients.data, table, f"row{i:03}", [btlib.set_cell("cf", b"v", f"value-{i}", 1000)])
        expected_py = btlib.read_rows(clients.data, table)
        assert len(expected_py) == 50
    finally:
        clients.close()

    # SIGKILL: no shutdown at all. A new container on the same volume has every acknowledged write.
    podman("kill", first)
    assert final_state(first) == {"status": "exited", "exit_code": 137}, logs(first)
    assert "shutdown requested" not in logs(first)

    second = start_tablet_server(containers, volume, port, http_port)
    assert cbt.rows("read", "users") == expected_cbt
    clients = btlib.GapicClients(endpoint)
    try:
        assert btlib.read_rows(clients.data, table) == expected_py
    finally:
        clients.close()

    # SIGTERM (podman stop, as the kubelet): tini forwards it, the server drains, flushes and
    # exits 0 well before podman's SIGKILL (after 30 s here).
    started = time.monotonic()
    podman("stop", "--time", "30", second)
    took = time.monotonic() - started
    assert final_state(second) == {"status": "exited", "exit_code": 0}, logs(second)
    assert took < 10, f"podman stop took {took:.1f} s\n{logs(second)}"
    out = logs(second)
    assert "shutdown requested" in out and "store flushed; bye" in out, out


def test_operator_image_help_crd_and_chart_command(images, containers):
    help_text = podman("run", "--rm", *run_flags(), OPERATOR_IMAGE, "--help").stdout
    assert "Basalt's Kubernetes operator" in help_text, help_text
    for command in ("run", "crd", "local"):
        assert f"\n  {command} " in help_text, help_text

    # `crd` prints the CRDs the repository checks in (crds/), one YAML document each.
    printed = podman("run", "--rm", *run_flags(), "--read-only", "--read-only-tmpfs=false",
                     OPERATOR_IMAGE, "crd").stdout
    docs = sorted(d.strip() for d in re.split(r"^---$", printed, flags=re.M) if d.strip())
    files = sorted(p.read_text().strip() for p in (REPO / "crds").glob("*.yaml"))
    # Instance, Cluster, Table, AppProfile, Backup, BackupSchedule.
    assert len(files) == 6 and docs == files, printed[:2000]

    # The chart's container command replaces the entrypoint: `basalt-operator run`, from PATH.
    run_help = podman("run", "--rm", *run_flags(), "--entrypoint", "basalt-operator",
                      OPERATOR_IMAGE, "run", "--help").stdout
    assert "--tablet-server-image" in run_help, run_help


def test_chart_defaults_are_the_built_images(images):
    """The chart pulls what images/build tags: its operator image and its default tablet server."""
    repository = chart_default("values.yaml:image.repository")
    tag = chart_default("values.yaml:image.tag") or APP_VERSION
    assert normalize_image(f"{repository}:{tag}") == OPERATOR_IMAGE
    assert chart_default("values.yaml:tabletServer.image") == ""  # → basalt/basalt-tablet-server:<appVersion>
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    assert 'printf "basalt/basalt-tablet-server:%s" .Chart.AppVersion' in helpers
    assert normalize_image(f"basalt/basalt-tablet-server:{APP_VERSION}") == TABLET_SERVER_IMAGE
    for image in (TABLET_SERVER_IMAGE, OPERATOR_IMAGE):
        assert image in images["sizes"], images["sizes"]
        config = podman("image", "inspect", "--format", "{{.Config.User}}", image).stdout.strip()
        assert config == "65532:65532", f"{image} runs as {config!r}"


def test_archives_import_into_containerd_as_kind_loads_them(images, tmp_path):
    """`kind load image-archive` runs `ctr --namespace=k8s.io images import --all-platforms
    --digests` in the node; k3d's `image import` does the same through k3s. Here: a containerd
    of the test's own (its own root, state and socket), the same import, the images under the
    names the kubelet asks for."""
    for tool in ("containerd", "ctr"):
        if not shutil.which(tool):
            assert not REQUIRED, f"{tool} is not installed (apt-get install containerd)"
            pytest.skip(f"{tool} is not installed (apt-get install containerd)")
    root = tmp_path / "containerd"
    sock = root / "containerd.sock"
    root.mkdir()
    (root / "config.toml").write_text(
        f'version = 2\nroot = "{root}/root"\nstate = "{root}/state"\n'
        f'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n[grpc]\n  address = "{sock}"\n')
    log = open(root / "containerd.log", "wb")
    daemon = subprocess.Popen(["containerd", "--config", str(root / "config.toml")],
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    ctr = ["ctr", "--address", str(sock), "--namespace", "k8s.io"]
    try:
        deadline = time.monotonic() + WAIT
        while subprocess.run([*ctr, "version"], capture_output=True).returncode != 0:
            assert daemon.poll() is None, (root / "containerd.log").read_text()
            assert time.monotonic() < deadline, (root / "containerd.log").read_text()
            time.sleep(0.2)
        for image in (TABLET_SERVER_IMAGE, OPERATOR_IMAGE):
            archive = images["out"] / f"{image.split('/')[-1].split(':')[0]}.oci.tar"
            proc = subprocess.run([*ctr, "images", "import", "--all-platforms", "--digests", str(archive)],
                                  capture_output=True, text=True, timeout=120)
            assert proc.returncode == 0, proc.stdout + proc.stderr
        listed = subprocess.run([*ctr, "images", "ls", "--quiet"], capture_output=True, text=True,
                                timeout=WAIT).stdout.split()
        assert TABLET_SERVER_IMAGE in listed and OPERATOR_IMAGE in listed, listed
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(WAIT)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        log.close()


# ---------------------------------------------------------------- helm install with the images

K8S_WAIT = 150.0


@pytest.fixture
def image_cluster(images, tmp_path):
    cluster.need("helm install with the images", server_binary())
    # The node's runtime: podman with an image store of the node's own, empty until the test
    # loads the archives into it.
    c = KubeCluster(tmp_path, server_binary(), node=PodmanNode(tmp_path / "node", run_flags()), wait=K8S_WAIT)
    try:
        c.start()
        yield c
    finally:
        c.stop()


PYTHON_ROWS = """
import json, os, sys
from google.cloud import bigtable
table = bigtable.Client(project="default", admin=True).instance("quickstart").table("greetings")
if sys.argv[1] == "write":
    for key in json.loads(sys.argv[2]):
        row = table.direct_row(key.encode())
        row.set_cell("cf", b"greeting", ("hello " + key).encode())
        row.commit()
print(json.dumps({r.row_key.decode(): r.cells["cf"][b"greeting"][0].value.decode() for r in table.read_rows()}))
"""


def test_helm_install_runs_the_built_images(images, image_cluster):
    """docs/helm.md with the images: images/build's OCI archives loaded into the node's image
    store (``podman load``, what ``kind load image-archive`` does with them), ``helm install``
    with the chart's default image names, the quickstart. The chart's operator pod and every
    tablet server pod run *from the images* (their imageID is the loaded image's, their
    container runs as the images' user with a read-only root filesystem), the Instance becomes
    Ready, and the Python client writes and reads through its endpoint. A deleted tablet server
    pod's container gets SIGTERM (podman stop, as the kubelet), exits 0, and its replacement
    serves the same rows from the same volume. The metadata store's etcd image is not built
    here: its pod runs Debian's etcd as a process."""
    c = image_cluster
    # The node has no image until the archives are loaded.
    assert c.node.image_id(OPERATOR_IMAGE) is None and c.node.image_id(TABLET_SERVER_IMAGE) is None
    loaded = []
    for name in ("basalt-operator", "basalt-tablet-server"):
        loaded += c.node.load(images["out"] / f"{name}.oci.tar")
    assert sorted(loaded) == sorted([OPERATOR_IMAGE, TABLET_SERVER_IMAGE]), loaded
    ids = {image: c.node.image_id(image) for image in (OPERATOR_IMAGE, TABLET_SERVER_IMAGE)}
    # The same images images/build left in the machine's own containers-storage.
    for image, image_id in ids.items():
        assert image_id == "sha256:" + podman("image", "inspect", "--format", "{{.Id}}", image).stdout.strip()

    c.run("helm install basalt-operator charts/basalt-operator --namespace basalt-system --create-namespace")
    op = c.wait("the chart's operator pod Ready",
                lambda: c.ready_pods("basalt-system", "app.kubernetes.io/name=basalt-operator"))[0]
    status = op["status"]["containerStatuses"][0]
    assert status["image"] == f"basalt/basalt-operator:{APP_VERSION}", status
    assert status["imageID"] == ids[OPERATOR_IMAGE], status
    assert status["containerID"].startswith("podman://"), status
    lease = c.wait("the operator's Lease", lambda: c.api.get_or_none(
        "/apis/coordination.k8s.io/v1/namespaces/basalt-system/leases/basalt-operator"))
    assert lease["spec"]["holderIdentity"] == op["metadata"]["name"], lease

    c.run("kubectl apply -f examples/quickstart.yaml")
    inst = c.wait("Instance quickstart Ready", lambda: c.ready("instances", "quickstart"))
    endpoint = inst["status"]["endpoint"]
    assert endpoint == "quickstart.default.svc:8086", inst["status"]
    c.wait("Table greetings Ready", lambda: c.ready("tables", "greetings"))
    servers = c.wait("three Ready tablet servers", lambda: (
        p := c.ready_pods("default", "app.kubernetes.io/component=tablet-server")) and len(p) == 3 and p)
    for pod in servers:
        st = pod["status"]["containerStatuses"][0]
        assert st["image"] == f"basalt/basalt-tablet-server:{APP_VERSION}", st
        assert st["imageID"] == ids[TABLET_SERVER_IMAGE], st
    # The containers the node runs: two images, the images' user, a read-only root filesystem.
    running = {ctr["Names"][0]: ctr for ctr in c.node.containers()}
    assert len(running) == 4, running
    for name in running:
        inspect = json.loads(c.node.podman_run("inspect", name).stdout)[0]
        assert inspect["Config"]["User"] == "65532:65532", (name, inspect["Config"]["User"])
        assert inspect["HostConfig"]["ReadonlyRootfs"] is True, name
        assert normalize_image(inspect["ImageName"]) in ids, inspect["ImageName"]
    assert sorted(normalize_image(ctr["Image"]) for ctr in running.values()) == sorted(
        [OPERATOR_IMAGE] + [TABLET_SERVER_IMAGE] * 3)

    keys = [f"{prefix}-{i}" for prefix in "ahou" for i in range(5)]  # every tablet of the table
    expected = {k: f"hello {k}" for k in keys}
    env = {"BIGTABLE_EMULATOR_HOST": endpoint}
    assert json.loads(c.run(argv=[sys.executable, "-c", PYTHON_ROWS, "write", json.dumps(keys)], env=env).stdout) == expected
    # The volume is the container's: RocksDB's files belong to the images' user.
    data = c.kubelet.claim_dir("default", "data-quickstart-c1-1")
    owners = {(f.stat().st_uid, f.stat().st_gid) for f in data.rglob("*") if f.is_file()}
    assert owners == {(65532, 65532)}, owners

    # A deleted pod: SIGTERM to its container, exit 0, a new pod on the same claim.
    old_uid = next(p["metadata"]["uid"] for p in servers if p["metadata"]["name"] == "quickstart-c1-1")
    c.api.delete("/api/v1/namespaces/default/pods/quickstart-c1-1")
    c.wait("quickstart-c1-1 stopped", lambda: any("default/quickstart-c1-1 stopped" in e for e in c.events))
    stopped = next(e for e in c.events if "default/quickstart-c1-1 stopped" in e)
    assert stopped.endswith("(exit 0)"), stopped
    log = c.kubelet.pod_log("default", "quickstart-c1-1").read_text()
    assert "store flushed; bye" in log, log[-3000:]
    c.wait("quickstart-c1-1 back, Ready", lambda: any(
        p["metadata"]["name"] == "quickstart-c1-1" and p["metadata"]["uid"] != old_uid
        for p in c.ready_pods("default", "app.kubernetes.io/component=tablet-server")))
    assert json.loads(c.run(argv=[sys.executable, "-c", PYTHON_ROWS, "read"], env=env).stdout) == expected
