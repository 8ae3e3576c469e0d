"""Fixtures that run a real basalt-tablet-server process.

* ``basalt_server`` (session): one server shared by most tests.
* ``bt`` (function): clients for the shared server + ``bt.table(...)`` to create a
  fresh, uniquely named table with the families a test asks for (deleted afterwards).
* ``server_factory`` (function): private servers for tests that restart or kill them.

The binary is ``$BASALT_BIN``, else ``$CARGO_TARGET_DIR/release/basalt-tablet-server``,
else ``<repo>/target/release/basalt-tablet-server`` (``cargo build --release``).
"""

from __future__ import annotations

import atexit
import itertools
import os
import re
import signal
import subprocess
import time
import warnings
from pathlib import Path

import pytest
from google.api_core import exceptions as gexc

import btlib
from btlib import GapicClients, http_get
from ports import free_port  # noqa: F401  (the tests take it from here)

REPO = Path(__file__).resolve().parent.parent
BIN_NAME = "basalt-tablet-server"
READY_TIMEOUT = 30.0
STOP_TIMEOUT = 30.0


def server_binary() -> Path:
    if os.environ.get("BASALT_BIN"):
        return Path(os.environ["BASALT_BIN"])
    if os.environ.get("CARGO_TARGET_DIR"):
        return Path(os.environ["CARGO_TARGET_DIR"]) / "release" / BIN_NAME
    return REPO / "target" / "release" / BIN_NAME


def _tail(path: Path, max_bytes: int = 16_000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return "<no log>"
    if len(data) > max_bytes:
        data = b"[...]\n" + data[-max_bytes:]
    return data.decode(errors="replace")


class ServerError(AssertionError):
    pass


class BasaltServer:
    """One basalt-tablet-server process on a fixed data dir and fixed ports.

    ``start()`` waits for /readyz; ``stop()`` sends SIGTERM and asserts exit code 0;
    ``kill9()`` sends SIGKILL; ``restart()`` = stop + start (same data dir and ports).
    Each start logs to ``<base>/server-N.stdout.log`` / ``server-N.stderr.log``."""

    all_servers: list["BasaltServer"] = []

    def __init__(self, base_dir: Path, binary: Path | None = None, extra_args: tuple = (),
                 env: dict | None = None):
        self.binary = Path(binary or server_binary())
        self.base_dir = Path(base_dir)
        self.data_dir = self.base_dir / "data"
        self.port = free_port()
        self.http_port = free_port()
        self.extra_args = tuple(extra_args)
        self.env = dict(env or {})  # added to the test's environment (e.g. AWS_* for backups)
        self.proc: subprocess.Popen | None = None
        self.generation = 0
        self.stdout_path: Path | None = None
        self.stderr_path: Path | None = None
        BasaltServer.all_servers.append(self)

    @property
    def data_endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def command(self) -> list[str]:
        return [
            str(self.binary),
            "--standalone",
            "--data-dir",
            str(self.data_dir),
            "--listen",
            self.data_endpoint,
            "--http-listen",
            f"127.0.0.1:{self.http_port}",
            *self.extra_args,
        ]

    def logs(self) -> str:
        if self.stderr_path is None:
            return "<never started>"
        return (
            f"--- {self.stderr_path} (tail) ---\n{_tail(self.stderr_path)}\n"
            f"--- {self.stdout_path} (tail) ---\n{_tail(self.stdout_path)}"
        )

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = READY_TIMEOUT) -> "BasaltServer":
        assert not self.running(), "server already running"
        if not self.binary.exists():
            raise ServerError(
                f"server binary {self.binary} does not exist: build it (cargo build --release -p {BIN_NAME}) "
                "or point BASALT_BIN at it"
            )
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.generation += 1
        self.stdout_path = self.base_dir / f"server-{self.generation}.stdout.log"
        self.stderr_path = self.base_dir / f"server-{self.generation}.stderr.log"
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                self.command(), stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                env={**os.environ, "RUST_BACKTRACE": "1", **self.env},
            )
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            rc = self.proc.poll()
            if rc is not None:
                raise ServerError(f"server exited with code {rc} while starting\n{self.logs()}")
            try:
                status, _, _ = http_get(f"{self.http_url}/readyz", timeout=1)
                if status == 200:
                    return
                last = f"HTTP {status}"
            except OSError as e:  # connection refused while starting
                last = repr(e)
            time.sleep(0.05)
        self.proc.kill()
        self.proc.wait()
        raise ServerError(f"server not ready after {timeout}s (last /readyz: {last})\n{self.logs()}")

    def stop(self, timeout: float = STOP_TIMEOUT) -> int:
        """Graceful stop: SIGTERM, then assert the process exits 0 within ``timeout``."""
        assert self.proc is not None, "server was never started"
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise ServerError(f"server did not exit within {timeout}s of SIGTERM\n{self.logs()}")
        rc = self.proc.returncode
        if rc != 0:
            raise ServerError(f"server exited with code {rc} after SIGTERM (expected 0)\n{self.logs()}")
        return rc

    def kill9(self) -> None:
        assert self.proc is not None, "server was never started"
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def restart(self, timeout: float = READY_TIMEOUT) -> "BasaltServer":
        self.stop()
        return self.start(timeout)

    def crash_restart(self, timeout: float = READY_TIMEOUT) -> "BasaltServer":
        self.kill9()
        return self.start(timeout)

    def assert_alive(self):
        if self.proc is not None and self.proc.poll() is not None:
            raise ServerError(f"server died (exit code {self.proc.returncode})\n{self.logs()}")

    def clients(self) -> GapicClients:
        return GapicClients(self.data_endpoint)


@atexit.register
def _kill_leftover_servers():
    # last resort if pytest is torn down abruptly: never leave servers behind
    for s in BasaltServer.all_servers:
        if s.running():
            s.proc.kill()
            s.proc.wait()


# --------------------------------------------------------------------------- hooks


def pytest_collection_modifyitems(session, config, items):
    # Slow tests (100 MiB values, the crash test) run last, crash test very last.
    def rank(item):
        if item.get_closest_marker("crash"):
            return 2
        if item.get_closest_marker("slow"):
            return 1
        return 0

    items.sort(key=rank)  # stable: file order is kept within each group


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    servers = []
    for value in getattr(item, "funcargs", {}).values():
        for cand in (value, getattr(value, "server", None)):
            if isinstance(cand, BasaltServer) and cand not in servers:
                servers.append(cand)
    factory = getattr(item, "funcargs", {}).get("server_factory")
    if factory is not None:
        servers.extend(s for s in factory.servers if s not in servers)
    for s in servers:
        report.sections.append((f"basalt server {s.data_endpoint} logs", s.logs()))
    # Other processes a test ran (e.g. seaweed.SeaweedFS): whatever says failure_logs().
    for name, value in getattr(item, "funcargs", {}).items():
        if callable(getattr(value, "failure_logs", None)):
            report.sections.append((f"{name} logs", value.failure_logs()))


# ------------------------------------------------------------------------- fixtures


CLUSTER_MODE = bool(os.environ.get("BASALT_E2E_CLUSTER"))
# Cluster mode: every table the fixtures create is split into many tablets, spread over the
# cluster's servers, so that the rows of one test live on several servers.
CLUSTER_SPLITS = ("b", "f", "k", "r", "r1", "r2", "r3", "row", "s", "x")


@pytest.fixture(scope="session")
def basalt_server(tmp_path_factory):
    if CLUSTER_MODE:
        import localrt

        base = tmp_path_factory.mktemp("basalt-cluster")
        runtime = localrt.LocalRuntime(
            base,
            localrt.manifest(btlib.INSTANCE, btlib.PROJECT, "e2e-c1", 3),
            f"127.0.0.1:{free_port()}",
        ).start()
        server = localrt.ClusterServerView(runtime, 0)
        yield server
        # The suite really went through a frontend: server 0 forwarded requests to the others.
        forwarded = btlib.scrape(server.http_url).value("basalt_requests_forwarded_total")
        assert forwarded > 0, "no request was forwarded: the tables did not span the servers"
        assert runtime.stop() == 0, runtime.logs()
        return
    server = BasaltServer(tmp_path_factory.mktemp("basalt-shared"))
    server.start()
    yield server
    if server.running():
        server.stop()
    else:
        server.assert_alive()


@pytest.fixture(scope="session")
def emulator_env(basalt_server):
    """BIGTABLE_EMULATOR_HOST for the shared server, for the whole session (the
    google-cloud-bigtable clients read it when constructed)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("BIGTABLE_EMULATOR_HOST", basalt_server.data_endpoint)
    yield basalt_server.data_endpoint
    mp.undo()


@pytest.fixture(scope="session")
def gapic(basalt_server) -> GapicClients:
    clients = basalt_server.clients()
    yield clients
    clients.close()


@pytest.fixture(scope="session")
def classic_client(emulator_env):
    """The classic ``google.cloud.bigtable.Client`` (admin=True), via BIGTABLE_EMULATOR_HOST."""
    from google.cloud import bigtable

    client = bigtable.Client(project=btlib.PROJECT, admin=True)
    yield client
    client.close()


@pytest.fixture(scope="session")
def data_client(emulator_env):
    """The new ``google.cloud.bigtable.data.BigtableDataClient``, via BIGTABLE_EMULATOR_HOST."""
    from google.cloud.bigtable.data import BigtableDataClient

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "Connecting to Bigtable emulator at ..."
        client = BigtableDataClient(project=btlib.PROJECT)
    yield client
    client.close()


_table_counter = itertools.count(1)


class TestTable:
    """A table created for one test. Data helpers go through the GAPIC clients."""

    __test__ = False  # not a pytest test class

    def __init__(self, env: "Env", table_id: str, families: dict):
        self.env = env
        self.id = table_id
        self.name = btlib.table_name(table_id)
        self.families = families

    # data
    def mutate(self, key, *mutations):
        btlib.mutate_row(self.env.data, self.name, key, mutations)

    def write(self, key, *cells):
        """write(key, (family, qualifier, ts, value), ...) in one MutateRow."""
        self.mutate(key, *[btlib.set_cell(f, q, v, ts) for f, q, ts, v in cells])

    def mutate_rows(self, entries):
        return btlib.mutate_rows(self.env.data, self.name, entries)

    def read(self, **kw) -> list:
        return btlib.read_rows(self.env.data, self.name, **kw)

    def read_row(self, key, **kw):
        rows = self.read(keys=[key], **kw)
        assert len(rows) <= 1
        return rows[0] if rows else None

    def keys(self, **kw) -> list[bytes]:
        return [r.key for r in self.read(**kw)]

    def sample(self):
        return btlib.sample_row_keys(self.env.data, self.name)

    def check_and_mutate(self, key, predicate=None, true=(), false=()) -> bool:
        """CheckAndMutateRow; returns predicate_matched."""
        return btlib.check_and_mutate(self.env.data, self.name, key, predicate, true, false)

    def read_modify_write(self, key, *rules):
        """ReadModifyWriteRow; returns the modified cells as a btlib.Row."""
        return btlib.read_modify_write(self.env.data, self.name, key, rules)

    # admin
    def get(self, view=btlib.View.SCHEMA_VIEW):
        return btlib.get_table(self.env.admin, self.name, view)

    def modify(self, *mods):
        return btlib.modify_families(self.env.admin, self.name, *mods)

    # other clients
    @property
    def data_table(self):
        """This table through the new data client (google.cloud.bigtable.data)."""
        return self.env.data_client.get_table(btlib.INSTANCE, self.id)

    @property
    def classic_table(self):
        """This table through the classic client (google.cloud.bigtable.Client)."""
        return self.env.classic_client.instance(btlib.INSTANCE).table(self.id)


class Env:
    """What the ``bt`` fixture hands a test."""

    def __init__(self, request, server: BasaltServer, gapic: GapicClients):
        self._request = request
        self.server = server
        self.gapic = gapic
        self.data = gapic.data
        self.admin = gapic.admin
        self.created: list[TestTable] = []

    @property
    def data_client(self):
        return self._request.getfixturevalue("data_client")

    @property
    def classic_client(self):
        return self._request.getfixturevalue("classic_client")

    def unique_id(self, hint: str = "") -> str:
        base = re.sub(r"[^-_.a-zA-Z0-9]", "_", hint or self._request.node.name)
        return f"t{next(_table_counter)}_{base}"[:50]

    def table(self, families=("cf",), splits=(), deletion_protection=False, table_id=None) -> TestTable:
        """Create a fresh table. ``families``: list of ids or {id: GcRule or None}."""
        if not isinstance(families, dict):
            families = {f: None for f in families}
        tid = table_id or self.unique_id()
        if CLUSTER_MODE and not splits:
            splits = CLUSTER_SPLITS
        btlib.create_table(self.admin, tid, families, splits=splits, deletion_protection=deletion_protection)
        t = TestTable(self, tid, families)
        self.created.append(t)
        return t

    def track(self, table_id: str, families=()) -> TestTable:
        """Register a table created some other way, so it is deleted after the test."""
        t = TestTable(self, table_id, dict.fromkeys(families))
        self.created.append(t)
        return t

    def cleanup(self):
        for t in self.created:
            try:
                btlib.delete_table(self.admin, t.name)
            except gexc.NotFound:
                pass
            except gexc.FailedPrecondition:
                btlib.set_deletion_protection(self.admin, t.name, False)
                btlib.delete_table(self.admin, t.name)


@pytest.fixture
def bt(request, basalt_server, gapic):
    env = Env(request, basalt_server, gapic)
    yield env
    basalt_server.assert_alive()
    env.cleanup()


@pytest.fixture
def table(bt) -> TestTable:
    """A fresh table with families ``cf1`` and ``cf2`` (no GC rules)."""
    return bt.table(["cf1", "cf2"])


class ServerFactory:
    def __init__(self, tmp_path: Path):
        self.tmp_path = tmp_path
        self.servers: list[BasaltServer] = []

    def __call__(self, start: bool = True, **kw) -> BasaltServer:
        """``kw``: BasaltServer's ``binary``, ``extra_args``, ``env``."""
        s = BasaltServer(self.tmp_path / f"server{len(self.servers)}", **kw)
        self.servers.append(s)
        if start:
            s.start()
        return s


@pytest.fixture
def server_factory(tmp_path):
    """Private servers (own data dir and ports) for tests that stop/kill/restart them.
    Servers still running at teardown are stopped with SIGTERM (exit code 0 asserted)."""
    factory = ServerFactory(tmp_path)
    yield factory
    errors = []
    for s in factory.servers:
        if s.running():
            try:
                s.stop()
            except ServerError as e:
                errors.append(str(e))
    assert not errors, "\n".join(errors)
