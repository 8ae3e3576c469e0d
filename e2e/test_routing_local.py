"""App-profile routing and failover on the local runtime (one etcd, two Clusters of two tablet
servers each, real processes on 127.0.0.1), through the official Python clients and cbt:

* a single-cluster profile sends every request to its cluster wherever it arrived: a row
  written through it is read back at once through it, through any server of either cluster,
  and through the other cluster's profile once CheckConsistency says so;
* single-row transactions only through a single-cluster profile that allows them
  (FAILED_PRECONDITION with Bigtable's message otherwise); an unknown profile is NOT_FOUND;
* the high-level data client and cbt, with their app-profile options, on the instance's
  endpoint;
* LOW-priority requests wait while HIGH ones keep a server busy, and still run;
* a profile switched from one cluster to the other takes effect on every server within a
  second;
* a partition (a TCP proxy as each cluster's peer endpoint) between the clusters: requests
  of a multi-cluster profile go on in the cluster that can still serve them, those of a
  single-cluster profile to the cut-off cluster fail, and after the heal both clusters hold
  every acknowledged write;
* every server of one cluster killed with SIGKILL while clients read and write through a
  multi-cluster profile: errors only around the kill (the window is measured), and once the
  cluster is back and consistent, every acknowledged write reads the same in both."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
import warnings
from urllib.parse import quote

import pytest
from google.api_core import exceptions as gexc
from google.cloud.bigtable_admin_v2.types import bigtable_table_admin as at
from google.cloud.bigtable_v2 import types as v2

import btlib
import localrt
import tcpproxy
import test_replication_local as repl
from btlib import GapicClients
from test_cbt import Cbt

INSTANCE = "routed"
A, B = f"{INSTANCE}-a", f"{INSTANCE}-b"
TABLE = repl.tname(INSTANCE)


def profiles(switch_to: str = A) -> str:
    def single(cluster: str, transactional: bool = False) -> dict:
        return {"singleClusterRouting": {"clusterId": cluster,
                                         "allowTransactionalWrites": transactional}}
    return "".join(localrt.app_profile(name, INSTANCE, routing, priority)
                   for name, routing, priority in (
                       ("to-a", single(A, transactional=True), "High"),
                       ("to-b", single(B), "High"),
                       ("any", {"multiClusterRoutingUseAny": {}}, "High"),
                       ("sticky", {"multiClusterRoutingUseAny": {"rowAffinity": True}}, "High"),
                       ("switch", single(switch_to), "High"),
                       ("batch", single(A), "Low"),
                   ))


def manifest(switch_to: str = A) -> str:
    return repl.manifest(INSTANCE) + profiles(switch_to)


@pytest.fixture(scope="module")
def rt(tmp_path_factory):
    rt = repl.start(tmp_path_factory.mktemp("routing"), INSTANCE, text=manifest())
    try:
        yield rt
    finally:
        rt.stop()


def servers(rt, cluster: str) -> list[dict]:
    return repl.cluster_servers(rt, INSTANCE, cluster.rsplit("-", 1)[1])


def params(profile: str) -> list[tuple[str, str]]:
    """The routing header the client libraries send with every request."""
    return [("x-goog-request-params",
             f"table_name={quote(TABLE, safe='')}&app_profile_id={profile}")]


def write(data, key: bytes, profile: str, value: bytes = b"v", ts: int = 1000, timeout=10):
    data.mutate_row(request=v2.MutateRowRequest(
        table_name=TABLE, row_key=key, app_profile_id=profile,
        mutations=[btlib.set_cell("cf", b"q", value, ts)]),
        metadata=params(profile), retry=None, timeout=timeout)


def read(data, key: bytes, profile: str, timeout=10) -> list:
    stream = data.read_rows(request=v2.ReadRowsRequest(
        table_name=TABLE, app_profile_id=profile, rows=v2.RowSet(row_keys=[key])),
        metadata=params(profile), retry=None, timeout=timeout)
    return btlib.merge_chunks(stream)


def served(server: dict, profile: str, cluster: str, method: str = "MutateRow") -> int:
    """How many of ``server``'s client requests through ``profile`` ``cluster`` served."""
    _, _, body = btlib.http_get(f"http://{server['http']}/metrics", timeout=5)
    return int(btlib.Metrics(body.decode()).value(
        "basalt_app_profile_request_seconds_count", app_profile=profile, cluster=cluster,
        method=method, code="OK"))


def failovers(server: dict, profile: str, source: str, to: str) -> int:
    _, _, body = btlib.http_get(f"http://{server['http']}/metrics", timeout=5)
    return int(btlib.Metrics(body.decode()).value(
        "basalt_multi_cluster_failovers_total", app_profile=profile, from_cluster=source,
        to_cluster=to))


def test_single_cluster_profiles_route_wherever_the_request_arrives(rt):
    a0, b0 = servers(rt, A)[0], servers(rt, B)[0]
    via_a, via_b = GapicClients(a0["grpc"]), GapicClients(b0["grpc"])
    try:
        # Written to cluster a through a server of b, read at once through a server of a and
        # through the other server of b: replication alone (it ships every few ms) would
        # miss some of them.
        for i in range(40):
            key = f"single-a-{i:03}".encode()
            write(via_b.data, key, "to-a", value=key)
            for data in (via_a.data, via_b.data):
                rows = read(data, key, "to-a")
                assert [r.key for r in rows] == [key], f"{key!r} not read back at once"
            key = f"single-b-{i:03}".encode()
            write(via_a.data, key, "to-b", value=key)
            rows = read(via_a.data, key, "to-b")
            assert [r.key for r in rows] == [key], f"{key!r} not read back at once"
        # Each receiving server says which cluster served its requests.
        assert served(b0, "to-a", A) == 40 and served(b0, "to-a", B) == 0
        assert served(a0, "to-b", B) == 40 and served(a0, "to-b", A) == 0
        # The other cluster's profile reads them once replication caught up.
        repl.wait_consistent(rt, INSTANCE, a0["grpc"], b0["grpc"])
        for i in range(40):
            for key, other in ((f"single-a-{i:03}", "to-b"), (f"single-b-{i:03}", "to-a")):
                assert [r.key for r in read(via_a.data, key.encode(), other)] == [key.encode()]
    finally:
        via_a.close()
        via_b.close()


def test_transactions_need_a_transactional_single_cluster_profile(rt):
    client = GapicClients(servers(rt, B)[1]["grpc"])
    try:
        def cam(profile: str):
            return client.data.check_and_mutate_row(request=v2.CheckAndMutateRowRequest(
                table_name=TABLE, row_key=b"txn", app_profile_id=profile,
                true_mutations=[btlib.set_cell("cf", b"q", b"t", 1000)],
                false_mutations=[btlib.set_cell("cf", b"q", b"f", 1000)]),
                metadata=params(profile), retry=None, timeout=10)

        def rmw(profile: str):
            return client.data.read_modify_write_row(request=v2.ReadModifyWriteRowRequest(
                table_name=TABLE, row_key=b"txn", app_profile_id=profile,
                rules=[btlib.rmw_append("cf", b"log", b"x")]),
                metadata=params(profile), retry=None, timeout=10)

        for profile in ("any", "sticky", "to-b"):
            for call in (cam, rmw):
                with pytest.raises(gexc.FailedPrecondition) as e:
                    call(profile)
                assert e.value.message == ("Single-row transactions are not allowed by this "
                                           "app profile"), e.value.message
        assert cam("to-a").predicate_matched is False
        assert cam("to-a").predicate_matched is True
        assert rmw("to-a").row.families[0].columns[0].cells[0].value == b"x"
        cells = read(client.data, b"txn", "to-a")[0].cells
        assert sorted((c.qualifier, c.value) for c in cells) == [(b"log", b"x"), (b"q", b"t")]
        # The default profile (none declared): the receiving cluster, transactions allowed;
        # what the first call wrote there, the second sees at once.
        def cam_default(key: bytes):
            return client.data.check_and_mutate_row(request=v2.CheckAndMutateRowRequest(
                table_name=TABLE, row_key=key,
                false_mutations=[btlib.set_cell("cf", b"q", b"f", 1000)]),
                retry=None, timeout=10).predicate_matched
        for i in range(10):
            key = f"txn-default-{i}".encode()
            assert (cam_default(key), cam_default(key)) == (False, True)
        with pytest.raises(gexc.NotFound) as e:
            write(client.data, b"r", "no-such-profile")
        assert "appProfiles/no-such-profile" in e.value.message, e.value.message
    finally:
        client.close()


def test_the_data_client_and_cbt_choose_the_cluster_with_the_app_profile(rt, tmp_path):
    from google.cloud.bigtable.data import BigtableDataClient
    from google.cloud.bigtable.data.mutations import SetCell

    old = os.environ.get("BIGTABLE_EMULATOR_HOST")
    os.environ["BIGTABLE_EMULATOR_HOST"] = rt.endpoint
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            client = BigtableDataClient(project=repl.PROJECT)
    finally:
        if old is None:
            del os.environ["BIGTABLE_EMULATOR_HOST"]
        else:
            os.environ["BIGTABLE_EMULATOR_HOST"] = old
    try:
        before = sum(served(s, "to-b", B) for s in rt.servers())
        to_b = client.get_table(INSTANCE, repl.TABLE, app_profile_id="to-b")
        for i in range(10):
            key = f"client-{i}".encode()
            to_b.mutate_row(key, SetCell("cf", b"q", key, 2000))
            assert to_b.read_row(key) is not None, f"{key!r} not read back at once"
        assert sum(served(s, "to-b", B) for s in rt.servers()) - before == 10
        anywhere = client.get_table(INSTANCE, repl.TABLE, app_profile_id="any")
        with pytest.raises(gexc.FailedPrecondition):
            anywhere.check_and_mutate_row(b"client-0", None, true_case_mutations=[
                SetCell("cf", b"q", b"x", 3000)])
        with pytest.raises(gexc.NotFound):
            client.get_table(INSTANCE, repl.TABLE, app_profile_id="nope").read_row(b"client-0")
    finally:
        client.close()
    cbt = Cbt(rt.endpoint, tmp_path, project=repl.PROJECT, instance=INSTANCE)
    out = cbt("lookup", repl.TABLE, "client-3", "app-profile=to-b")
    assert "client-3" in out, out
    cbt("set", repl.TABLE, "cbt-row", "app-profile=to-a", "cf:q=from-cbt@3000")
    assert "from-cbt" in cbt("lookup", repl.TABLE, "cbt-row", "app-profile=to-a")
    bad = cbt.run("lookup", repl.TABLE, "cbt-row", "app-profile=nope", check=False)
    assert bad.returncode != 0 and "not found" in (bad.stdout + bad.stderr).lower(), bad


def waits(server: dict, priority: str) -> int:
    _, _, body = btlib.http_get(f"http://{server['http']}/metrics", timeout=5)
    return int(btlib.Metrics(body.decode()).value(
        "basalt_priority_wait_seconds_count", priority=priority))


def test_low_priority_requests_wait_while_high_ones_keep_a_server_busy(rt):
    a0 = servers(rt, A)[0]
    stop = threading.Event()
    done = {"batch": 0, "to-a": 0}
    errors: list[str] = []
    lock = threading.Lock()

    def load(profile: str, idx: int):
        client = GapicClients(a0["grpc"])
        n = 0
        try:
            while not stop.is_set():
                try:
                    if profile == "batch":
                        entries = [v2.MutateRowsRequest.Entry(
                            row_key=f"batch-{idx}-{n:05}-{i:02}".encode(),
                            mutations=[btlib.set_cell("cf", b"q", b"x" * 1000, 1000)])
                            for i in range(20)]
                        for _ in client.data.mutate_rows(request=v2.MutateRowsRequest(
                                table_name=TABLE, app_profile_id=profile, entries=entries),
                                metadata=params(profile), retry=None, timeout=30):
                            pass
                    else:
                        read(client.data, f"single-a-{n % 40:03}".encode(), profile)
                    with lock:
                        done[profile] += 1
                except gexc.GoogleAPICallError as e:
                    errors.append(str(e)[:200])
                n += 1
        finally:
            client.close()

    before = {p: waits(a0, p) for p in ("HIGH", "LOW")}
    threads = [threading.Thread(target=load, args=(p, i))
               for p, k in (("to-a", 4), ("batch", 6)) for i in range(k)]
    for t in threads:
        t.start()
    try:
        time.sleep(4)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors[:3]
    assert done["batch"] > 0 and done["to-a"] > 0, done
    # Six LOW batches at once, at most two running while HIGH reads keep the server busy.
    assert waits(a0, "LOW") - before["LOW"] > 0, done
    assert waits(a0, "HIGH") == before["HIGH"] == 0, "HIGH requests never wait"
    # The bytes they write are paced (128 KiB/s by default): in 4 s about 26 batches of
    # 20 KB instead of hundreds; twice that allows for the start, before HIGH traffic.
    assert done["batch"] * 20_000 <= 2 * (128 << 10) * 4 + 200_000, done


def test_a_switched_profile_takes_effect_on_every_server_within_a_second(rt):
    clients = [GapicClients(s["grpc"]) for s in rt.servers()]
    stop = threading.Event()
    errors: list[str] = []

    def load(data, idx):
        n = 0
        while not stop.is_set():
            try:
                write(data, f"switch-{idx}-{n:05}".encode(), "switch")
            except gexc.GoogleAPICallError as e:
                errors.append(str(e)[:200])
            n += 1

    threads = [threading.Thread(target=load, args=(c.data, i)) for i, c in enumerate(clients)]
    for t in threads:
        t.start()
    try:
        time.sleep(1)
        assert all(served(s, "switch", A) > 0 for s in rt.servers())
        before = {s["name"]: served(s, "switch", A) for s in rt.servers()}
        out = rt.apply(manifest(switch_to=B))
        assert out.returncode == 0, out.stdout + out.stderr
        applied = time.monotonic()
        # Every server, wherever its clients are, sends the profile's requests to b now: its
        # count of requests a served stops growing.
        switched: dict[str, float] = {}
        while len(switched) < len(before) and time.monotonic() - applied < 10:
            for s in rt.servers():
                if s["name"] not in switched and served(s, "switch", B) > 0:
                    switched[s["name"]] = time.monotonic() - applied
            time.sleep(0.05)
        print(f"profile switch took effect after {switched}")
        assert len(switched) == len(before), f"not every server switched: {switched}"
        assert max(switched.values()) < 1.0, switched
        # local.json says where it routes now, as an AppProfile's status does.
        localrt.wait("local.json showing the switch", lambda: rt.instance(INSTANCE).get(
            "routing", {}).get("switch", {}).get("routesTo") == [B], 10, rt)
        assert rt.instance(INSTANCE)["routing"]["any"]["routesTo"] == [A, B]
        settled = {s["name"]: served(s, "switch", A) for s in rt.servers()}
        time.sleep(0.5)
        assert settled == {s["name"]: served(s, "switch", A) for s in rt.servers()}
    finally:
        stop.set()
        for t in threads:
            t.join()
        for c in clients:
            c.close()
    assert not errors, errors[:3]


def assert_every_server_holds(rt, acked: list[bytes]):
    """Once CheckConsistency says the clusters converged, every server of both reads every
    row in ``acked``."""
    a0, b0 = servers(rt, A)[0], servers(rt, B)[0]
    repl.wait_consistent(rt, INSTANCE, a0["grpc"], b0["grpc"])
    for cluster in (A, B):
        for s in servers(rt, cluster):
            rows = repl.table_through(s["grpc"], TABLE)
            missing = [k for k in acked if k not in rows]
            assert not missing, f"{s['name']} misses {len(missing)} rows, e.g. {missing[:3]}"


class MultiClusterLoad(localrt.ClientLoad):
    """Client threads writing (and reading back) rows through a multi-cluster profile at
    ``endpoint``; every failed request is kept with its time (``failures``), ``oks`` counts the
    rows written and read back. Started and stopped as a ``ClientLoad``."""

    def __init__(self, endpoint: str, profile: str, threads: int = 4, ts: int = 1000):
        super().__init__(endpoint, TABLE)
        self.profile = profile
        self.ts = ts
        self.slowest_write = 0.0
        self.lock = threading.Lock()
        self.failures: list[tuple[float, str]] = []
        self.oks = 0
        self.threads = [threading.Thread(target=self.run, args=(i,)) for i in range(threads)]

    def run(self, idx: int):
        n = 0
        while not self.stop.is_set():
            client = GapicClients(self.endpoint)
            try:
                while not self.stop.is_set():
                    key = f"multi-{self.profile}-{idx}-{n:06}".encode()
                    n += 1
                    try:
                        started = time.monotonic()
                        write(client.data, key, self.profile, value=key, ts=self.ts, timeout=5)
                        took = time.monotonic() - started
                        with self.lock:
                            self.acked.append(key)
                            self.slowest_write = max(self.slowest_write, took)
                        read(client.data, key, self.profile, timeout=5)
                        with self.lock:
                            self.oks += 1
                    except gexc.GoogleAPICallError as e:
                        with self.lock:
                            self.failures.append((time.monotonic(), str(e)[:200]))
                        break  # a new channel, as a client would after a broken connection
            finally:
                client.close()


@pytest.mark.parametrize("profile", ["any", "sticky"])
def test_a_cluster_killed_whole_fails_over_within_two_seconds(rt, profile):
    with MultiClusterLoad(rt.endpoint, profile) as load:
        localrt.wait("the load running", lambda: load.oks > 100, 30, rt)
        victims = servers(rt, B)
        killed_at = time.monotonic()
        for s in victims:
            os.kill(s["pid"], signal.SIGKILL)
        time.sleep(4)
        during = load.oks
        time.sleep(2)
        assert load.oks > during, "clients make progress with cluster b down"
        rt.wait_ready(timeout=120, pids_not=[s["pid"] for s in victims])
        back = load.oks
        localrt.wait("more requests once b is back", lambda: load.oks > back + 50, 30, rt)
    after = [(t - killed_at, e) for t, e in load.failures if t >= killed_at]
    window = max((t for t, _ in after), default=0.0)
    print(f"{profile}: {len(after)} failed requests after the kill, the last "
          f"{window:.2f} s after it; {len(load.acked)} rows acknowledged")
    before = [e for t, e in load.failures if t < killed_at]
    assert not before, before[:3]
    assert window <= 2.0, after[-3:]
    if profile == "sticky":
        # Half the rows stick to b: cluster a's servers took them over while b was down.
        assert sum(failovers(s, profile, B, A) for s in servers(rt, A)) > 0
    # Once consistent, both clusters hold every acknowledged row.
    assert_every_server_holds(rt, load.acked)


def test_a_stopped_server_of_the_receiving_cluster_fails_over_to_the_other(rt):
    """One server of cluster a stops answering (SIGSTOP) while clients write and read through
    a's other server with a multi-cluster profile: requests for the tablets of the stopped one
    wait for a only as long as its patience, then cluster b serves them, so every request
    succeeds within the clients' 5 s deadline (without a failover they would wait for the
    tablets to move); every acknowledged row reads in both clusters afterwards."""
    receiver, victim = servers(rt, A)[:2]
    with MultiClusterLoad(receiver["grpc"], "any") as load:
        localrt.wait("the load running", lambda: load.oks > 100, 30, rt)
        before = failovers(receiver, "any", A, B)
        stopped_at = time.monotonic()
        os.kill(victim["pid"], signal.SIGSTOP)
        try:
            time.sleep(6)
            during = load.oks
            time.sleep(2)
        finally:
            os.kill(victim["pid"], signal.SIGCONT)
        assert load.oks > during, "clients make progress with a server of a stopped"
        rt.wait_ready(timeout=120)
        back = load.oks
        localrt.wait("more requests once it is back", lambda: load.oks > back + 50, 30, rt)
    after = [(round(t - stopped_at, 2), e) for t, e in load.failures if t >= stopped_at]
    assert not load.failures, (after[:3], load.failures[:3])
    assert failovers(receiver, "any", A, B) > before, "no request went to b"
    assert_every_server_holds(rt, load.acked)


def test_writes_not_safe_to_send_twice_fail_over_when_an_owner_dies(rt):
    """Writes with the server's timestamp (not safe to send twice) through a multi-cluster
    profile at one server of cluster a, while the other server of a is killed with SIGKILL
    three times in a row (the runtime restarts it after 1, 2, then 4 s): a write for a tablet
    of the dead server is refused as not delivered once its cluster's patience is over, and
    cluster b takes it, instead of waiting in a for the server to return or its tablets to be
    reassigned. So no write fails but those in flight at a kill (UNAVAILABLE), none takes 2 s,
    and every acknowledged row reads in both clusters once the killed server is back."""
    receiver, victim = servers(rt, A)[:2]
    rt.wait_ready(timeout=120)
    kills: list[float] = []
    killed: list[int] = []
    with MultiClusterLoad(receiver["grpc"], "any", ts=-1) as load:
        localrt.wait("the load running", lambda: load.oks > 100, 30, rt)
        before = failovers(receiver, "any", A, B)
        with load.lock:
            load.slowest_write = 0.0
        def running() -> int | None:
            pid = next(s["pid"] for s in rt.servers() if s["name"] == victim["name"])
            return pid if pid and pid not in killed else None

        for _ in range(3):
            pid = localrt.wait("the server running again", running, 30, rt, every=0.05)
            kills.append(time.monotonic())
            killed.append(pid)
            os.kill(pid, signal.SIGKILL)
        time.sleep(3)
        during = load.oks
        time.sleep(2)
        assert load.oks > during, "clients make progress with a server of a dead"
        slowest = load.slowest_write
        rt.wait_ready(timeout=120, pids_not=killed)
        back = load.oks
        localrt.wait("more requests once it is back", lambda: load.oks > back + 50, 30, rt)
    after = [(round(t - kills[0], 2), e) for t, e in load.failures if t >= kills[0]]
    print(f"slowest write after the first kill {slowest:.2f} s; failed: {after[:3]}")
    assert not [e for t, e in load.failures if t < kills[0]]
    # Only writes in flight at a kill may fail (their outcome is unknown), with UNAVAILABLE.
    in_flight = [e for t, e in load.failures
                 if any(0 <= t - k <= 0.5 for k in kills) and e.startswith("503 ")]
    assert len(in_flight) == len(after), after[:3]
    assert failovers(receiver, "any", A, B) > before, "no request went to b"
    assert slowest < 2.0, f"a write waited {slowest:.2f} s in cluster a"
    assert_every_server_holds(rt, load.acked)


def test_a_partition_between_the_clusters_moves_multi_cluster_traffic(tmp_path):
    proxies = {c: tcpproxy.TcpProxy().start() for c in ("a", "b")}
    text = (repl.manifest(INSTANCE, peer_endpoints={
        f"{c}": p.address for c, p in proxies.items()}) + profiles())
    rt = None
    try:
        rt = repl.start(tmp_path, INSTANCE, text=text)
        for c, p in proxies.items():
            p.targets = [s["grpc"] for s in servers(rt, f"{INSTANCE}-{c}")]
        with MultiClusterLoad(servers(rt, A)[0]["grpc"], "sticky", threads=3) as load:
            localrt.wait("the load running", lambda: load.oks > 100, 30, rt)
            # Rows that stick to b are sent through b's proxy.
            localrt.wait("requests routed to b", lambda: proxies["b"].forwarded > 0, 10, rt)
            cut_at = time.monotonic()
            proxies["b"].partition()
            time.sleep(2)
            during = load.oks
            client = GapicClients(servers(rt, A)[1]["grpc"])
            try:
                with pytest.raises((gexc.DeadlineExceeded, gexc.ServiceUnavailable)):
                    write(client.data, b"cut-off", "to-b", timeout=3)
            finally:
                client.close()
            time.sleep(6)
            assert load.oks > during + 100, "multi-cluster requests go on in a"
            proxies["b"].heal()
            healed = load.oks
            localrt.wait("more requests after the heal", lambda: load.oks > healed + 50, 30, rt)
        after = [(t - cut_at, e) for t, e in load.failures if t >= cut_at]
        print(f"partition: {len(after)} failed requests, {len(load.acked)} acknowledged")
        # Reads and writes of explicit versions are safe to send again: none failed.
        assert not load.failures, load.failures[:3]
        assert sum(failovers(s, "sticky", B, A) for s in servers(rt, A)) > 0
        assert_every_server_holds(rt, load.acked)
    finally:
        for p in proxies.values():
            p.heal()
        if rt is not None:
            rt.stop()
        for p in proxies.values():
            p.close()
