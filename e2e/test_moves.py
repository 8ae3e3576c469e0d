"""Tablet moves on the local runtime (real etcd, tablet servers and master processes on
127.0.0.1), with clients writing, incrementing and reading through the instance's endpoint the
whole time:

* 3 → 5 servers: the rebalancer moves tablets to the new servers until every server carries
  its share, and the clients see latency, never an error;
* a fail point holds a move at each of its phases while the source, the destination or the
  master is killed with SIGKILL: every move ends committed or aborted, every tablet has
  exactly one owner, every acknowledged write is present exactly once and every counter
  equals the sum of its acknowledged increments.

The tablet map, the move records and the registrations are read from etcd itself (its JSON
gateway), not from Basalt's own reports."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
from collections import Counter

import pytest
from google.api_core import exceptions as gexc

import btlib
import localrt
from localrt import wait
from btlib import GapicClients, set_cell
from conftest import free_port

PROJECT = "moves-p"
SPLITS = [b"b", b"d", b"f", b"h", b"k", b"n", b"q", b"t", b"w"]  # 10 tablets
COUNTERS = [b"a-counter", b"g-counter", b"m-counter", b"s-counter", b"x-counter"]


def tname(instance: str, tid: str = "moving") -> str:
    return btlib.table_name(tid, instance, PROJECT)


# ---------------------------------------------------------------------------- etcd itself

def etcd_range(url: str, prefix: str) -> list[tuple[str, dict]]:
    """Every key under ``prefix`` with its JSON value, through etcd's gRPC gateway."""
    key = prefix.encode()
    end = key[:-1] + bytes([key[-1] + 1])
    body = json.dumps({"key": base64.b64encode(key).decode(),
                       "range_end": base64.b64encode(end).decode()}).encode()
    req = urllib.request.Request(f"{url}/v3/kv/range", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        kvs = json.loads(resp.read()).get("kvs") or []
    return [(base64.b64decode(kv["key"]).decode(), json.loads(base64.b64decode(kv["value"])))
            for kv in kvs]


class Cluster:
    """What etcd says of one cluster of a local runtime."""

    def __init__(self, rt: localrt.LocalRuntime, instance: str, cluster: str):
        self.rt, self.instance, self.cluster = rt, instance, cluster

    def prefix(self, what: str) -> str:
        return f"/basalt/v1/default/{self.instance}/clusters/{self.cluster}/{what}/"

    def tablets(self) -> list[dict]:
        return [v for _, v in etcd_range(self.rt.state()["etcd"], self.prefix("tablets"))]

    def moves(self) -> list[dict]:
        return [v for _, v in etcd_range(self.rt.state()["etcd"], self.prefix("moves"))]

    def names(self) -> dict[str, str]:
        """Store id → server name, of the registered servers."""
        return {v["storeId"]: v["name"]
                for _, v in etcd_range(self.rt.state()["etcd"], self.prefix("servers"))}

    def per_server(self) -> Counter:
        names = self.names()
        return Counter(names.get(t["owner"], t["owner"]) for t in self.tablets())

    def server(self, name: str) -> dict:
        return next(s for s in self.rt.servers() if s["name"] == name)


def metric(server: dict, name: str, labels: str = "") -> float:
    """The value of ``name`` (with exactly ``labels``, e.g. ``direction="sent"``, besides the
    server's own ``basalt_*`` labels) on a server."""
    _, _, body = btlib.http_get(f"http://{server['http']}/metrics", timeout=5)
    text = body.decode() if isinstance(body, bytes) else body
    want = dict(re.findall(r'(\w+)="([^"]*)"', labels))
    for have, value in btlib.Metrics(text).find(name):
        # The server's own labels (basalt_cluster, basalt_server, …) aside.
        if {k: v for k, v in have.items() if not k.startswith("basalt_")} == want:
            return value
    return 0.0


# ---------------------------------------------------------------------------- the clients

class Load(localrt.ClientLoad):
    """Writers of distinct rows and incrementers of a few counters, through the endpoint,
    until stopped. ``acked`` rows and ``increments`` are what the service acknowledged;
    ``errors`` what the clients saw fail."""

    def __init__(self, rt: localrt.LocalRuntime, table: str, writers: int = 2):
        super().__init__(rt.endpoint, table)
        self.increments: Counter = Counter()
        self.spawn(lambda client, idx, n: self.write_row(client, idx, n, value=lambda k: k * 8,
                                                         timeout=30, width=6), writers)
        self.spawn(self.increment)

    def increment(self, client, _idx: int, n: int):
        row = COUNTERS[n % len(COUNTERS)]
        try:
            btlib.read_modify_write(client.data, self.table, row,
                                    [btlib.rmw_increment("cf", b"n", 1)], timeout=30)
            self.increments[row] += 1
        except gexc.GoogleAPICallError as e:
            self.errors.append(f"increment {row!r}: {str(e)[:200]}")
            time.sleep(0.05)

    def check(self, rt: localrt.LocalRuntime, strict: bool):
        """Every acknowledged row once; every counter at least its acknowledged increments
        and, when ``strict`` (no failure whose outcome the client could not know), exactly."""
        client = GapicClients(rt.endpoint)
        try:
            rows = btlib.read_rows(client.data, self.table, timeout=120)
        finally:
            client.close()
        keys = [r.key for r in rows]
        assert len(keys) == len(set(keys)), "a row was read twice"
        missing = set(self.acked) - set(keys)
        assert not missing, (f"{len(missing)} of {len(self.acked)} acknowledged writes lost, "
                             f"e.g. {sorted(missing)[:5]}\n{rt.logs()}")
        by_key = {r.key: r for r in rows}
        unknown = Counter(e.split("'")[1].encode() for e in self.errors
                          if e.startswith("increment"))
        for row in COUNTERS:
            got = int.from_bytes(by_key[row].cells[0].value, "big", signed=True) if row in by_key else 0
            want = self.increments[row]
            if strict:
                assert got == want, f"{row!r}: {got} ≠ {want} acknowledged increments"
            else:
                assert want <= got <= want + unknown[row], (
                    f"{row!r}: {got}, acknowledged {want}, unknown outcomes {unknown[row]}")


def endpoint_serves(rt: localrt.LocalRuntime, table: str) -> bool:
    """A read through the endpoint succeeds (the runtime marks servers ready behind its
    endpoint a moment after they answer /readyz)."""
    client = GapicClients(rt.endpoint)
    try:
        btlib.read_rows(client.data, table, keys=[b"probe"], timeout=5)
        return True
    except gexc.GoogleAPICallError:
        return False
    finally:
        client.close()


def create_table(rt: localrt.LocalRuntime, instance: str):
    client = GapicClients(rt.servers()[0]["grpc"])
    try:
        client.admin.create_table(
            request=btlib.admin_types.CreateTableRequest(
                parent=btlib.instance_name(instance, PROJECT), table_id="moving",
                table=btlib.Table(column_families={"cf": btlib.column_family()}),
                initial_splits=[btlib.admin_types.CreateTableRequest.Split(key=k) for k in SPLITS]),
            timeout=60)
    finally:
        client.close()


def manifest(instance: str, cluster: str, nodes: int) -> str:
    return localrt.manifest(instance, PROJECT, cluster, nodes)


def apply(rt: localrt.LocalRuntime, text: str):
    path = rt.base_dir / f"apply-{time.monotonic_ns()}.yaml"
    path.write_text(text)
    out = subprocess.run(
        [str(localrt.operator_binary()), "local", "apply", "-f", str(path),
         "--data-dir", str(rt.data_dir)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr



def assert_one_owner_each(cl: Cluster):
    """Every tablet in etcd is owned by one registered server and serving, and every server's
    own count of the tablets it owns agrees with etcd — once the moves still running (the
    rebalancer keeps working) are over and every server has read the map."""
    def settled():
        tablets = cl.tablets()
        names = cl.names()
        assert len(tablets) == len(SPLITS) + 1, tablets
        assert all(t["owner"] in names for t in tablets), (tablets, names)
        if cl.moves() or any(t["state"] != "serving" for t in tablets):
            return None
        per = cl.per_server()
        counts = {s["name"]: metric(s, "basalt_tablets") for s in cl.rt.servers()}
        return counts == {name: float(per.get(name, 0)) for name in counts} or None

    wait("every server's tablets to agree with etcd", settled, 60, cl.rt)


# ---------------------------------------------------------------------------- scenarios

def test_scale_out_3_to_5_spreads_the_tablets_while_clients_see_no_error(tmp_path):
    """serveNodes 3 → 5 under load: the new servers receive tablets until the cluster is even
    (10 tablets: 2 each, give or take one); no client request fails; nothing is lost or
    doubled."""
    instance, cluster = "moves-out", "moves-out-c1"
    rt = localrt.LocalRuntime(tmp_path, manifest(instance, cluster, 3), f"127.0.0.1:{free_port()}",
                              env={"BASALT_LEASE_TTL_SECS": "3", "BASALT_LEASE_GRACE_SECS": "1"}).start()
    cl = Cluster(rt, instance, cluster)
    try:
        create_table(rt, instance)
        wait("10 tablets on 3 servers", lambda: sorted(cl.per_server().values()) == [3, 3, 4], 30, rt)
        wait("the endpoint", lambda: endpoint_serves(rt, tname(instance)), 30, rt)
        with Load(rt, tname(instance)) as load:
            time.sleep(2)
            before = len(load.acked)
            apply(rt, manifest(instance, cluster, 5))
            started = time.monotonic()
            # Even by the balancer's score (bytes, requests and tablet count; the writes do
            # not load the tablets evenly): every server carries tablets, none more than 3.
            wait("the tablets spread over the 5 servers",
                 lambda: len(cl.names()) == 5 and len(cl.per_server()) == 5
                 and max(cl.per_server().values()) <= 3, 90, rt)
            converged = time.monotonic() - started
            time.sleep(2)
        print(f"3 → 5 converged in {converged:.1f}s; {len(load.acked) - before} writes during it")
        assert load.errors == [], load.errors[:10]
        load.check(rt, strict=True)
        assert_one_owner_each(cl)
        # The new servers' tablets came with their rows: snapshots were received.
        for name in (f"{cluster}-3", f"{cluster}-4"):
            assert metric(cl.server(name), "basalt_tablet_move_bytes_total",
                          'direction="received"') > 0, name
    finally:
        if rt.running():
            assert rt.stop() == 0, rt.logs()


# A fail point holds every move at one phase for HOLD_MS: the window in which the test kills
# the source, the destination or the master (one of each per scenario, one scale-out each).
HOLD_MS = 4000
PHASES = {
    # name: (fail point, what shows that a move is in the window)
    "before-snapshot": ("move-before-snapshot", "copying"),
    "mid-stream": ("move-source-mid-stream", "copying"),
    # The destination applies records as they come: while it copies, and after the fence.
    "catch-up": ("move-destination-catch-up", "any"),
    "after-fence": ("move-after-fence", "fencing"),
    "before-commit": ("move-before-commit", "fencing"),
    "after-commit": ("move-after-commit", "committed"),
}


def in_window(cl: Cluster, shows: str, before: dict) -> tuple[str, str] | None:
    """(source, destination) store ids of a move in its held phase, or None."""
    if shows == "committed":
        # The record is gone at the commit; the tablet has a new owner at a later epoch.
        for t in cl.tablets():
            prev = before.get(t["start"])
            if prev and t["epoch"] > prev["epoch"] and t["owner"] != prev["owner"]:
                return prev["owner"], t["owner"]
        return None
    for m in cl.moves():
        if shows in ("any", m["phase"]):
            return m["from"], m["to"]
    return None


@pytest.mark.parametrize("phase", list(PHASES))
def test_kill_9_of_source_destination_or_master_at_every_move_phase_loses_nothing(tmp_path, phase):
    """With every move held at one phase, the source, then the destination, then the master
    of a move are killed with SIGKILL (after scale-outs 3 → 4 → 5 → 6 start new moves), while
    clients write and increment throughout. Afterwards: every tablet has one owner and no move
    is left, every acknowledged write is present once, every counter equals its acknowledged
    increments (give or take the increments whose outcome a client could not know)."""
    point, shows = PHASES[phase]
    instance, cluster = f"kill-{phase}"[:20].rstrip("-"), f"kill-{phase}"[:20].rstrip("-") + "-c1"
    rt = localrt.LocalRuntime(
        tmp_path, manifest(instance, cluster, 3), f"127.0.0.1:{free_port()}",
        env={"BASALT_LEASE_TTL_SECS": "4", "BASALT_LEASE_GRACE_SECS": "2",
             "FAILPOINTS": f"{point}=return({HOLD_MS})",
             # One move at a time: the window is that move's.
             "BASALT_MOVES_PER_CLUSTER": "1"}).start()
    cl = Cluster(rt, instance, cluster)
    killed = []
    try:
        create_table(rt, instance)
        wait("10 tablets on 3 servers", lambda: sorted(cl.per_server().values()) == [3, 3, 4], 30, rt)
        wait("the endpoint", lambda: endpoint_serves(rt, tname(instance)), 30, rt)
        with Load(rt, tname(instance)) as load:
            for nodes, victim in ((4, "source"), (5, "destination"), (6, "master")):
                before = {t["start"]: t for t in cl.tablets()}
                apply(rt, manifest(instance, cluster, nodes))
                source, destination = wait(f"a move held {phase}",
                                           lambda: in_window(cl, shows, before), 60, rt)
                time.sleep(0.5)
                if victim == "master":
                    pid = rt.instance(instance)["master"]["pid"]
                else:
                    name = cl.names()[source if victim == "source" else destination]
                    pid = cl.server(name)["pid"]
                os.kill(pid, signal.SIGKILL)
                killed.append((victim, pid))
                # Recovery: the killed process is back, every server ready, no move left
                # half-done (each ends committed or aborted).
                rt.wait_ready(timeout=90, pids_not=(pid,))
                wait("no move left behind after the kill",
                     lambda: cl.moves() == [] and all(t["state"] == "serving" for t in cl.tablets()),
                     90, rt)
            time.sleep(1)
        load.check(rt, strict=False)
        assert_one_owner_each(cl)
        assert len(load.acked) > 100, len(load.acked)
    finally:
        if rt.running():
            assert rt.stop() == 0, rt.logs()


def test_a_large_tablet_splits_by_size_and_a_hot_one_by_load_and_both_spread(tmp_path):
    """Two servers; split size 8 MiB and split load 60 requests/s (instead of 512 MiB and 2,000/s).
    A table of one tablet loaded with ~80 MiB splits by size at row boundaries (metadata only)
    and its tablets spread over both servers; another table of one tablet read and written
    ~300 times a second splits by load and spreads too. Every row written is read back once."""
    instance, cluster = "moves-split", "moves-split-c1"
    rt = localrt.LocalRuntime(
        tmp_path, manifest(instance, cluster, 2), f"127.0.0.1:{free_port()}",
        env={"BASALT_LEASE_TTL_SECS": "4", "BASALT_LEASE_GRACE_SECS": "2",
             "BASALT_SPLIT_BYTES": str(8 << 20), "BASALT_SPLIT_REQUESTS_PER_SEC": "60"}).start()
    cl = Cluster(rt, instance, cluster)
    client = GapicClients(rt.servers()[0]["grpc"])
    try:
        for tid in ("large", "hot"):
            client.admin.create_table(
                request=btlib.admin_types.CreateTableRequest(
                    parent=btlib.instance_name(instance, PROJECT), table_id=tid,
                    table=btlib.Table(column_families={"cf": btlib.column_family()})),
                timeout=60)
        tablets_of = lambda tid: [t for k, t in etcd_range(
            rt.state()["etcd"], cl.prefix("tablets") + tid + "/")]
        wait("both tables placed", lambda: tablets_of("large") and tablets_of("hot"), 30, rt)

        # ~80 MiB of incompressible values in 800 rows: past the 64 MiB memtable, so RocksDB
        # writes SST files and the tablet's size shows.
        large = tname(instance, "large")
        keys = [f"row-{i:05}".encode() for i in range(800)]
        for chunk in range(0, len(keys), 50):
            part = keys[chunk:chunk + 50]
            assert btlib.mutate_rows(client.data, large, [
                (k, [set_cell("cf", b"v", os.urandom(100 << 10), 1000)]) for k in part],
                timeout=120) == ["OK"] * len(part)
        split = wait("the large table split by size, over both servers",
                     lambda: (lambda ts: ts if len(ts) >= 4 and len({t["owner"] for t in ts}) == 2
                              else None)(tablets_of("large")), 120, rt)
        # Split at row boundaries: every row is in exactly one tablet, and reads back.
        rows = btlib.read_rows(GapicClients(rt.endpoint).data, large, timeout=120)
        assert [r.key for r in rows] == keys
        assert all(t["epoch"] >= 2 for t in split)

        # A hot table: reads and writes of rows across its key space.
        hot = tname(instance, "hot")
        acked: list[bytes] = []
        stop = threading.Event()

        def hammer(idx: int):
            c = GapicClients(rt.endpoint)
            n = 0
            while not stop.is_set():
                key = f"{'0123456789abcdefghijklmnopqrstuvwxyz'[n % 36]}-{idx}-{n}".encode()
                n += 1
                btlib.mutate_row(c.data, hot, key, [set_cell("cf", b"q", key, 1000)], timeout=30)
                acked.append(key)
                btlib.read_rows(c.data, hot, keys=[key], timeout=30)
            c.close()

        threads = [threading.Thread(target=hammer, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        try:
            wait("the hot table split by load, over both servers",
                 lambda: (lambda ts: ts if len(ts) >= 2 and len({t["owner"] for t in ts}) == 2
                          else None)(tablets_of("hot")), 150, rt)
        finally:
            stop.set()
            for t in threads:
                t.join(60)
        got = [r.key for r in btlib.read_rows(GapicClients(rt.endpoint).data, hot, timeout=120)]
        assert sorted(got) == sorted(set(acked)) and len(got) == len(acked)
        master_log = re.sub(r"\x1b\[[0-9;]*m", "", (rt.data_dir / "logs" / f"{instance}-master.log")
                            .read_text(errors="replace"))
        assert re.search(r"split a tablet.*reason=size", master_log), master_log[-3000:]
        assert re.search(r"split a tablet.*reason=load", master_log), master_log[-3000:]
    finally:
        client.close()
        if rt.running():
            assert rt.stop() == 0, rt.logs()
