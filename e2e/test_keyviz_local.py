"""The Key Visualizer on the local runtime (issue 29): three tablet servers, a table split over
them, sequential keys written into one key range for three minutes next to a uniform
background load. The API's hottest ranges for that window must cover the written range and
hold at least 80 % of the writes, the background must show no bucket above three times its
mean, every minute's writes must add up to what the clients had acknowledged, the history
must survive a kill -9 of the master, and the page must render in headless Chromium with a
hover over the hottest cell showing its range. Last, the tablets' sizes: the bytes stored show
where the rows are.

One cluster and one load for the whole module (about four minutes: the load runs three whole
minutes, and a minute is collected a few seconds after it closes)."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from google.api_core import exceptions as gexc

import btlib
import localrt
from conftest import free_port

INSTANCE = "keyviz"
CLUSTER = "keyviz-c1"
TABLE = "events"
MINUTES = 3
ARTIFACTS = Path(os.environ.get("BASALT_E2E_ARTIFACTS", Path(__file__).parent / "artifacts"))
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
NODE_DIR = Path(__file__).parent / "node"


def api(rt, path: str, **params) -> dict:
    control = rt.state()["control"]
    query = urllib.parse.urlencode(params)
    with urllib.request.urlopen(f"http://{control}{path}?{query}", timeout=30) as r:
        return json.loads(r.read())


def heatmap(rt, **params) -> dict:
    return api(rt, "/api/keyviz/heatmap", instance=f"default/{INSTANCE}", table=TABLE, **params)


def bg_key(n: int) -> bytes:
    return f"bg-{n:06d}".encode()


def seq_key(n: int) -> bytes:
    return f"seq-{n:010d}".encode()


class Load:
    """Sequential writes (most of the load) and uniform background writes and reads, with the
    acknowledged writes counted per minute of the wall clock."""

    def __init__(self, endpoint: str):
        self.endpoint = endpoint
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.per_minute: dict[int, int] = {}
        self.seq_next = 0
        self.seq_written: list[tuple[int, int]] = []  # (minute acknowledged, n)
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self.sequential) for _ in range(3)]
        self.threads.append(threading.Thread(target=self.background))

    def acked(self):
        minute = int(time.time()) // 60
        with self.lock:
            self.per_minute[minute] = self.per_minute.get(minute, 0) + 1

    def sequential(self):
        client = btlib.GapicClients(self.endpoint)
        try:
            while not self.stop.is_set():
                with self.lock:
                    n = self.seq_next
                    self.seq_next += 1
                try:
                    btlib.mutate_row(client.data, btlib.table_name(TABLE, INSTANCE), seq_key(n),
                                     [btlib.set_cell("cf", b"q", b"x" * 100, 1000)], timeout=20)
                except Exception as e:  # noqa: BLE001 - counted, asserted empty
                    self.errors.append(f"seq {n}: {str(e)[:200]}")
                    continue
                self.acked()
                with self.lock:
                    self.seq_written.append((int(time.time()) // 60, n))
        finally:
            client.close()

    def background(self):
        client = btlib.GapicClients(self.endpoint)
        rng = random.Random(29)
        try:
            while not self.stop.is_set():
                key = bg_key(rng.randrange(1_000_000))
                try:
                    btlib.mutate_row(client.data, btlib.table_name(TABLE, INSTANCE), key,
                                     [btlib.set_cell("cf", b"q", b"y" * 100, 1000)], timeout=20)
                except Exception as e:  # noqa: BLE001
                    self.errors.append(f"bg {key!r}: {str(e)[:200]}")
                    continue
                self.acked()
                time.sleep(0.02)
        finally:
            client.close()

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(60)


def endpoint_serves(rt) -> bool:
    client = btlib.GapicClients(rt.endpoint)
    try:
        btlib.read_rows(client.data, btlib.table_name(TABLE, INSTANCE), keys=[b"bg-0"], timeout=5)
        return True
    except gexc.GoogleAPICallError:
        return False
    finally:
        client.close()


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """The runtime after the load: (runtime, load, first minute, last minute + 1)."""
    base = tmp_path_factory.mktemp("keyviz")
    rt = localrt.LocalRuntime(base, localrt.manifest(INSTANCE, btlib.PROJECT, CLUSTER, 3),
                              f"127.0.0.1:{free_port()}")
    rt.start()
    try:
        clients = btlib.GapicClients(rt.cluster(INSTANCE, CLUSTER)["servers"][0]["grpc"])
        splits = [b"bg-250000", b"bg-500000", b"bg-750000", b"seq-"]
        btlib.create_table(clients.admin, TABLE, ["cf"], splits=splits, instance=INSTANCE)
        clients.close()
        cluster = localrt.EtcdCluster(rt, INSTANCE, CLUSTER)
        localrt.wait("the table's 5 tablets owned", lambda: sum(cluster.owners().values()) == 5,
                     60, rt)
        localrt.wait("the endpoint serving the table", lambda: endpoint_serves(rt), 60, rt)
        # Whole minutes: the load starts at least 20 s before the first one (a table's first
        # minute is one range: the next is cut where that one's requests were, as for any table
        # that was in use before), and stops right after the third ends.
        first = (int(time.time()) + 20) // 60 + 1
        with Load(rt.endpoint) as load:
            # Half-way through the second minute the master is killed: the minutes it had
            # not collected yet are collected by the next one, none twice.
            time.sleep((first + 1) * 60 + 30 - time.time())
            killed = rt.instance(INSTANCE)["master"]["pid"]
            os.kill(killed, 9)
            localrt.wait("the master running again", lambda: rt.instance(INSTANCE)["master"].get(
                "pid") not in (None, killed), 30, rt)
            time.sleep((first + MINUTES) * 60 - time.time() + 0.5)
        rt.assert_alive()
        assert not load.errors, load.errors[:5]
        end = first + MINUTES
        # Collected a few seconds after each minute closes.
        localrt.wait("the load's minutes in the history", lambda: {
            t["start"] // 60 for t in heatmap(rt, metric="writes", start=first * 60,
                                              end=end * 60)["times"]} >= set(range(first, end)),
            90, rt, every=2)
        load.killed_master = killed
        yield rt, load, first, end
    finally:
        rt.stop()


def covered(hm: dict) -> list[tuple[bytes, bytes, float]]:
    """The hottest ranges as (start, end, share); an empty end is the table's end."""
    return [(bytes.fromhex(h["start_hex"]), bytes.fromhex(h["end_hex"]), h["share"])
            for h in hm["hottest"]]


def test_every_minute_adds_up_to_the_acknowledged_writes(loaded):
    rt, load, first, end = loaded
    hm = heatmap(rt, metric="writes", start=first * 60, end=end * 60)
    by_minute = {t["start"] // 60: sum(row) for t, row in zip(hm["times"], hm["values"])}
    for minute in range(first, end):
        acked = load.per_minute.get(minute, 0)
        assert acked > 1000, (minute, acked)
        # A write acknowledged just after a minute turned may have been counted in the one
        # before: a handful at each edge.
        assert abs(by_minute[minute] - acked) <= 0.01 * acked + 20, (minute, by_minute[minute], acked)


def test_the_hottest_ranges_cover_the_sequential_keys_and_hold_most_writes(loaded):
    rt, load, first, end = loaded
    hm = heatmap(rt, metric="writes", start=first * 60, end=end * 60)
    assert 1 <= len(hm["buckets"]) <= 1000
    written = [n for minute, n in load.seq_written if first <= minute < end]
    low, high = seq_key(min(written)), seq_key(max(written))
    hot = covered(hm)
    assert hot, hm["hottest"]

    def inside(key: bytes) -> bool:
        return any(s <= key and (e == b"" or key < e) for s, e, _ in hot)

    assert inside(low) and inside(high), (low, high, hot)
    # Every sequential key written is in a hottest range, and those ranges hold >= 80 %.
    missing = [n for n in written[::97] if not inside(seq_key(n))]
    assert not missing, (missing[:5], hot)
    share = sum(s for _, _, s in hot)
    assert share >= 0.8, (share, hm["hottest"])
    # The hottest range is in the sequential keys' range, not the background's.
    assert hot[0][0] >= b"seq-" or hot[0][1] > b"seq-", hot[0]
    # ... and lists the tablet (and its server) holding it.
    assert hm["hottest"][0]["tablets"], hm["hottest"][0]
    assert all(t["server"].startswith(CLUSTER) for t in hm["hottest"][0]["tablets"])


def test_the_uniform_background_shows_no_bucket_above_three_times_its_mean(loaded):
    rt, load, first, end = loaded
    hm = heatmap(rt, metric="writes", start=first * 60, end=end * 60)
    background = []
    for b, *_ in [(i,) for i in range(len(hm["buckets"]))]:
        bucket = hm["buckets"][b]
        start, stop = bytes.fromhex(bucket["start_hex"]), bytes.fromhex(bucket["end_hex"])
        if start >= b"bg-" and stop != b"" and stop <= b"bg-999999\xff":
            background.append(sum(row[b] for row in hm["values"]))
    assert len(background) >= 5, hm["buckets"]
    mean = sum(background) / len(background)
    assert mean > 0
    assert max(background) <= 3 * mean, (max(background), mean, background)


def test_the_history_survives_a_restart_of_the_master(loaded):
    """The master was killed (kill -9) half-way through the load's second minute: the new one
    read the history back and went on, so every minute is there, each counted once (the
    per-minute sums above), and the minutes before the kill are still the old master's."""
    rt, load, first, end = loaded
    assert rt.instance(INSTANCE)["master"]["pid"] != load.killed_master
    assert rt.instance(INSTANCE)["master"]["restarts"] >= 1
    hm = heatmap(rt, metric="writes", start=first * 60, end=end * 60)
    minutes = [t["start"] // 60 for t in hm["times"]]
    assert minutes == list(range(first, end)), minutes
    assert all(t["minutes"] == 1 for t in hm["times"])


def test_list_hot_tablets_names_the_tablet_of_the_sequential_keys(loaded):
    """Bigtable's ListHotTablets through the official Python admin client, from the same
    history: the tablet holding the sequential keys took most of its server's requests."""
    rt, load, first, end = loaded
    clients = btlib.GapicClients(rt.endpoint)
    try:
        admin = clients.instance_admin()
        parent = f"{btlib.instance_name(INSTANCE)}/clusters/{CLUSTER}"
        from google.protobuf import timestamp_pb2
        hot = list(admin.list_hot_tablets(request={
            "parent": parent,
            "start_time": timestamp_pb2.Timestamp(seconds=first * 60),
            "end_time": timestamp_pb2.Timestamp(seconds=end * 60)}))
        assert hot, "no hot tablet"
        top = hot[0]
        assert top.table_name == btlib.table_name(TABLE, INSTANCE)
        assert top.name.startswith(parent + "/hotTablets/")
        # The sequential keys' tablet: [seq-, end).
        assert top.start_key == "seq-" and top.end_key == "", top
        assert top.node_cpu_usage_percent >= 50, top
        assert first * 60 <= top.start_time.timestamp() < end * 60
        # A malformed cluster name is INVALID_ARGUMENT, naming it.
        with pytest.raises(gexc.InvalidArgument, match="projects/p/nope"):
            list(admin.list_hot_tablets(request={"parent": "projects/p/nope"}))
    finally:
        clients.close()


def test_status_names_the_page_and_the_page_renders_in_chromium(loaded, tmp_path):
    rt, load, first, end = loaded
    status = rt.cli("status")
    control = rt.state()["control"]
    assert f"key visualizer http://{control}/keyviz" in status.stdout, status.stdout
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: install Debian's chromium")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "keyviz.png"
    query = urllib.parse.urlencode({"instance": f"default/{INSTANCE}", "table": TABLE,
                                    "metric": "writes", "window": "30m"})
    out = subprocess.run(["node", str(NODE_DIR / "keyviz-browser.js"),
                          f"http://{control}/keyviz?{query}", str(shot)],
                         capture_output=True, text=True, timeout=120, cwd=NODE_DIR)
    assert out.returncode == 0, (out.stdout, out.stderr)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["consoleErrors"] == [], seen["consoleErrors"]
    assert seen["canvas"]["width"] > 100 and seen["canvas"]["height"] > 100, seen["canvas"]
    assert seen["canvas"]["litPixels"] > 100, seen["canvas"]
    assert seen["times"] >= MINUTES and seen["buckets"] >= 5, seen
    # Hovering the hottest cell shows its key range: it is in the sequential keys.
    assert "seq-" in seen["tooltip"]["text"], seen["tooltip"]
    assert seen["hottest"] and "seq-" in seen["hottest"][0], seen["hottest"]
    assert shot.exists() and shot.stat().st_size > 10_000


def test_the_bytes_stored_show_where_the_rows_are(loaded):
    """The tablets' sizes, sampled each minute (RocksDB's estimates of flushed data): the
    server holding the sequential keys is restarted with SIGTERM (a graceful stop flushes its
    memtables to files), and the next collected minute's `stored_bytes` heatmap holds, in the
    sequential keys' range, about what their rows take. Last in the module: it restarts a
    server."""
    rt, load, first, end = loaded
    hm = heatmap(rt, metric="writes", start=first * 60, end=end * 60)
    holder = hm["hottest"][0]["tablets"][0]["server"]
    server = next(s for s in rt.servers() if s["name"] == holder)
    os.kill(server["pid"], signal.SIGTERM)
    rt.wait_ready(120, pids_not=(server["pid"],))
    restarted = int(time.time()) // 60

    def in_sequential_keys(hm: dict) -> float:
        """The last column's bytes stored in buckets from "seq-" on."""
        if not hm["values"]:
            return 0.0
        return sum(v for bucket, v in zip(hm["buckets"], hm["values"][-1])
                   if bytes.fromhex(bucket["start_hex"]) >= b"seq-")

    def sized() -> dict | None:
        hm = heatmap(rt, metric="stored_bytes", start=restarted * 60, end=(restarted + 5) * 60)
        return hm if in_sequential_keys(hm) > 0 else None

    localrt.wait("a minute with the tablets' sizes collected", sized, 150, rt, every=2)
    hm = sized()
    assert hm["unit"] == "bytes stored", hm["unit"]
    assert all(t["minutes"] == 1 for t in hm["times"])
    # Thousands of rows of a 100-byte value, in files: compressed, but over 10 bytes a row,
    # and under 300 (key, value, timestamp, the files' own blocks).
    rows = len(load.seq_written)
    stored = in_sequential_keys(hm)
    assert 10 * rows <= stored <= 300 * rows, (stored, rows)
