"""Scale-in on the local runtime (``basalt-operator local``: real etcd, tablet servers and
master processes on 127.0.0.1), with clients writing and reading rows through the instance's
endpoint the whole time:

* 5 → 2 servers with ``local apply``: the runtime records the count in etcd, the master moves
  every tablet off servers 2..4, and the runtime stops each of them only once etcd's tablet map
  says it owns nothing; every acknowledged row reads back exactly once, every tablet is owned
  by server 0 or 1, and (``volumeReclaimPolicy: Delete``) the leaving servers' data is gone;
* 4 → 2, then back to 4 while the drain runs: lowering further meanwhile is refused (a
  scale-in to 2 is in progress), the raise cancels it — all four servers run, the intent is
  gone from local.json, etcd holds 4, no data is lost;
* a runtime stopped and started again with fewer servers in its manifests runs the servers
  above the count once more and drains them like any scale-in, instead of leaving their
  tablets without a server.

The tablet map, the registrations and the recorded count are read from etcd itself (its JSON
gateway), not from Basalt's own reports. The master may run up to 4 moves at once here."""

from __future__ import annotations

import os
import random
import re
import time
from pathlib import Path

from google.api_core import exceptions as gexc

import btlib
import localrt
from btlib import GapicClients, set_cell
from conftest import free_port

PROJECT = "shrink-p"
SPLITS = [b"b", b"d", b"f", b"h", b"k", b"n", b"q", b"t", b"w"]  # 10 tablets
ENV = {"BASALT_MOVES_PER_CLUSTER": "4"}
DRAIN_TIMEOUT = 120


def tname(instance: str) -> str:
    return btlib.table_name("shrinking", instance, PROJECT)


def start(tmp_path: Path, instance: str, cluster: str, nodes: int, reclaim: str | None = None):
    return localrt.LocalRuntime(
        tmp_path, localrt.manifest(instance, PROJECT, cluster, nodes, reclaim),
        f"127.0.0.1:{free_port()}", env=ENV).start()


def wait(what: str, fn, timeout: float, rt: localrt.LocalRuntime):
    deadline = time.monotonic() + timeout
    while True:
        rt.assert_alive()
        try:
            if fn():
                return
        except (OSError, ValueError, KeyError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout}s\n{rt.logs()}")
        time.sleep(0.3)


def create_table(rt: localrt.LocalRuntime, instance: str, cl: localrt.EtcdCluster, servers: int):
    client = GapicClients(rt.servers()[0]["grpc"])
    client.admin.create_table(
        request=btlib.admin_types.CreateTableRequest(
            parent=btlib.instance_name(instance, PROJECT), table_id="shrinking",
            table=btlib.Table(column_families={"cf": btlib.column_family()}),
            initial_splits=[btlib.admin_types.CreateTableRequest.Split(key=k) for k in SPLITS]),
        timeout=60)
    client.close()
    wait(f"10 tablets over {servers} servers",
         lambda: sum(cl.owners().values()) == 10 and len(cl.owners()) == servers, 30, rt)
    wait("the endpoint serving", lambda: endpoint_serves(rt, tname(instance)), 30, rt)


def endpoint_serves(rt: localrt.LocalRuntime, table: str) -> bool:
    """A read through the endpoint succeeds (the runtime's own readiness probes, which the
    endpoint follows, may lag the servers' by half a second)."""
    client = GapicClients(rt.endpoint)
    try:
        btlib.read_rows(client.data, table, keys=[b"a"], timeout=5)
        return True
    except gexc.GoogleAPICallError:
        return False
    finally:
        client.close()


class Clients(localrt.ClientLoad):
    """Threads writing distinct rows through the endpoint (``acked``: MutateRow answered OK)
    and reading acknowledged rows back; ``missing`` are reads that succeeded without a row
    that was acknowledged before."""

    def __init__(self, rt: localrt.LocalRuntime, table: str, writers: int = 2):
        super().__init__(rt.endpoint, table)
        self.missing: list[bytes] = []
        self.reads = 0
        self.rngs = [random.Random(idx) for idx in range(writers)]
        self.spawn(self.run, writers)

    def run(self, client, idx: int, n: int):
        self.write_row(client, idx, n)
        if (n + 1) % 3 == 0 and self.acked:
            k = self.rngs[idx].choice(self.acked)
            try:
                rows = btlib.read_rows(client.data, self.table, keys=[k], timeout=20)
                self.reads += 1
                if [r.key for r in rows] != [k]:
                    self.missing.append(k)
            except gexc.GoogleAPICallError as e:
                self.errors.append(f"read {k!r}: {str(e)[:200]}")


def assert_every_ack_once(rt: localrt.LocalRuntime, table: str, acked: list[bytes]):
    client = GapicClients(rt.endpoint)
    got = [r.key for r in btlib.read_rows(client.data, table, timeout=60)]
    client.close()
    assert len(got) == len(set(got)), "a row read twice"
    missing = set(acked) - set(got)
    assert not missing, f"{len(missing)} acknowledged writes lost, e.g. {sorted(missing)[:5]}\n{rt.logs()}"


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_scale_in_5_to_2_moves_every_tablet_then_stops_the_leaving_servers(tmp_path):
    instance, cluster = "e2e-shrink", "shrink-c1"
    rt = start(tmp_path, instance, cluster, 5, reclaim="Delete")
    try:
        cl = localrt.EtcdCluster(rt, instance, cluster)
        assert cl.serve_nodes() == 5  # recorded when the cluster started
        create_table(rt, instance, cl, 5)
        leaving = [s for s in rt.servers() if int(s["name"].rsplit("-", 1)[1]) >= 2]
        assert len(leaving) == 3
        with Clients(rt, tname(instance)) as c:
            c.wait_for_more(20)
            out = rt.apply(localrt.manifest(instance, PROJECT, cluster, 2, reclaim="Delete"))
            assert out.returncode == 0, out.stderr
            assert f"cluster {cluster} scaling in from 5 to 2 server(s): {cluster}-2, " \
                f"{cluster}-3, {cluster}-4 drain(s)" in out.stdout, out.stdout
            assert re.search(r"\(\d+ tablet\(s\) to move\)", out.stdout), out.stdout
            assert cl.serve_nodes() == 2
            state = rt.cluster(instance, cluster)
            assert state["serveNodes"] == 2
            if state["scaleIn"] is not None:  # (it cannot be done yet, but never flake on it)
                assert (state["scaleIn"]["from"], state["scaleIn"]["to"]) == (5, 2), state
                status = rt.cli("status")
                assert status.returncode == 0, status.stderr
                assert "scale-in from 5 to 2" in status.stdout or \
                    rt.cluster(instance, cluster)["scaleIn"] is None, status.stdout
            # The servers drain, then stop; progress is reported meanwhile.
            def done():
                s = rt.cluster(instance, cluster)
                if s["scaleIn"] is not None:
                    assert isinstance(s["scaleIn"]["remainingTablets"], int), s["scaleIn"]
                    assert s["scaleIn"]["blocked"] is None or "not ready" in s["scaleIn"]["blocked"] \
                        or "not registered" in s["scaleIn"]["blocked"], s["scaleIn"]
                    # A leaving server runs as long as etcd says it owns a tablet.
                    owners = cl.owners()
                    for srv in s["servers"]:
                        if srv["name"] in s["scaleIn"]["stopped"]:
                            assert owners.get(srv["name"], 0) == 0, (srv, owners)
                return s["scaleIn"] is None and [x["name"] for x in s["servers"]] == \
                    [f"{cluster}-0", f"{cluster}-1"]
            wait("the scale-in 5 → 2 done", done, DRAIN_TIMEOUT, rt)
            # Clients keep being served by the two that remain.
            c.wait_for_more(20)
        assert len(c.acked) > 50, (len(c.acked), c.errors[:5])
        assert c.reads > 10, c.errors[:5]
        assert not c.missing, f"acknowledged rows read back missing: {c.missing[:5]}"
        assert_every_ack_once(rt, tname(instance), c.acked)
        # Every tablet is owned by server 0 or 1 (the two may still even out between them).
        owners = cl.owners()
        assert set(owners) <= {f"{cluster}-0", f"{cluster}-1"}, owners
        assert sum(owners.values()) >= 10, owners
        wait("no move in flight", lambda: cl.moves() == [], 60, rt)
        assert all(t["state"] == "serving" for t in cl.tablets()), cl.tablets()
        assert set(cl.owners()) <= {f"{cluster}-0", f"{cluster}-1"}, cl.owners()
        # A stopped server's registration goes at the latest with its lease (10 s).
        wait("only servers 0 and 1 registered",
             lambda: sorted(cl.names().values()) == [f"{cluster}-0", f"{cluster}-1"], 30, rt)
        # The leaving servers are gone, and so is their data (volumeReclaimPolicy: Delete).
        for s in leaving:
            assert not alive(s["pid"]), s
            assert not os.path.exists(s["dataDir"]), s
        assert sum(s["tablets"] for s in rt.servers()) == sum(owners.values())
        assert cl.serve_nodes() == 2
    finally:
        if rt.running():
            assert rt.stop() == 0, rt.logs()


def test_raising_the_count_while_draining_cancels_the_scale_in(tmp_path):
    instance, cluster = "e2e-unshrink", "unshrink-c1"
    rt = start(tmp_path, instance, cluster, 4)
    try:
        cl = localrt.EtcdCluster(rt, instance, cluster)
        create_table(rt, instance, cl, 4)
        before = {s["name"]: s for s in rt.servers()}
        with Clients(rt, tname(instance)) as c:
            c.wait_for_more(20)
            out = rt.apply(localrt.manifest(instance, PROJECT, cluster, 2))
            assert out.returncode == 0, out.stderr
            assert "scaling in from 4 to 2" in out.stdout, out.stdout
            # Lowering further waits for the scale-in under way, and says so.
            refused = rt.apply(localrt.manifest(instance, PROJECT, cluster, 1))
            assert refused.returncode != 0, refused.stdout
            assert f"a scale-in of cluster {cluster} from 4 to 2 server(s) is in progress" \
                in refused.stderr, refused.stderr
            assert cl.serve_nodes() == 2
            # Back to 4 at once: cancelled.
            out = rt.apply(localrt.manifest(instance, PROJECT, cluster, 4))
            assert out.returncode == 0, out.stderr
            assert "scale-in from 4 to 2 server(s) cancelled, serveNodes 4" in out.stdout, out.stdout
            assert cl.serve_nodes() == 4
            state = rt.cluster(instance, cluster)
            assert state["serveNodes"] == 4 and state["scaleIn"] is None, state
            wait("all four servers running again",
                 lambda: len(rt.servers()) == 4 and all(s["pid"] for s in rt.servers()), 60, rt)
            rt.wait_ready(timeout=60)
            c.wait_for_more(20)
            # Nothing stops afterwards: the intent is gone for good.
            time.sleep(3)
            assert [s["name"] for s in rt.servers()] == sorted(before), rt.servers()
            assert rt.cluster(instance, cluster)["scaleIn"] is None
        assert not c.missing, f"acknowledged rows read back missing: {c.missing[:5]}"
        assert_every_ack_once(rt, tname(instance), c.acked)
        # A server that had not stopped kept its process; one that had stopped runs again on
        # its data directory (kept: volumeReclaimPolicy Retain).
        for s in rt.servers():
            assert s["pid"] and alive(s["pid"]), s
            assert s["dataDir"] == before[s["name"]]["dataDir"] and os.path.isdir(s["dataDir"])
        for name in (f"{cluster}-0", f"{cluster}-1"):
            assert rt.servers()[int(name[-1])]["pid"] == before[name]["pid"]
        # Every tablet has a registered owner among the four; moves left over finish.
        wait("no move in flight", lambda: cl.moves() == [], 60, rt)
        owners = cl.owners()
        assert set(owners) <= set(before) and sum(owners.values()) >= 10, owners
    finally:
        if rt.running():
            assert rt.stop() == 0, rt.logs()


def test_a_restart_with_fewer_servers_drains_the_ones_above(tmp_path):
    instance, cluster = "e2e-restart", "restart-c1"
    rt = start(tmp_path, instance, cluster, 3)
    try:
        cl = localrt.EtcdCluster(rt, instance, cluster)
        create_table(rt, instance, cl, 3)
        keys = [b"0-row"] + [k + b"-row" for k in SPLITS]  # one row per tablet
        client = GapicClients(rt.servers()[0]["grpc"])
        assert btlib.mutate_rows(client.data, tname(instance),
                                 [(k, [set_cell("cf", b"q", k, 1000)]) for k in keys]) == ["OK"] * 10
        client.close()
        assert rt.stop() == 0, rt.logs()
        # The manifests now say 1: servers 1 and 2 (which own tablets) start again and drain.
        rt.manifest.write_text(localrt.manifest(instance, PROJECT, cluster, 1))
        rt.start()
        assert cl.serve_nodes() == 1
        wait("the scale-in 3 → 1 done after the restart",
             lambda: rt.cluster(instance, cluster)["scaleIn"] is None
             and [s["name"] for s in rt.servers()] == [f"{cluster}-0"], DRAIN_TIMEOUT, rt)
        assert set(cl.owners()) == {f"{cluster}-0"}, cl.owners()
        client = GapicClients(rt.servers()[0]["grpc"])
        got = [r.key for r in btlib.read_rows(client.data, tname(instance), timeout=60)]
        client.close()
        assert got == sorted(keys)
    finally:
        if rt.running():
            assert rt.stop() == 0, rt.logs()


def test_local_restart_restarts_one_server_on_its_data_while_clients_are_served(tmp_path):
    """`local restart NAME` (the local runtime's NodeRuntime restart, as a deleted pod on
    Kubernetes): the server's process ends and starts again on its data directory under a new
    pid, the others keep theirs, its tablets are served again, and no acknowledged write is
    lost. An unknown name is refused with the reason."""
    instance, cluster = "e2e-restart1", "restart1-c1"
    rt = start(tmp_path, instance, cluster, 2)
    try:
        cl = localrt.EtcdCluster(rt, instance, cluster)
        create_table(rt, instance, cl, 2)
        before = {s["name"]: s for s in rt.servers()}
        victim = f"{cluster}-1"
        with Clients(rt, tname(instance)) as c:
            c.wait_for_more(20)
            out = rt.cli("restart", victim)
            assert out.returncode == 0, out.stderr
            assert f"server {victim} restarting on its data directory" in out.stdout, out.stdout
            wait("the server back under a new pid",
                 lambda: next(s for s in rt.servers() if s["name"] == victim)["pid"]
                 not in (None, before[victim]["pid"]), 60, rt)
            rt.wait_ready(timeout=90, pids_not=(before[victim]["pid"],))
            wait("its tablets served again", lambda: endpoint_serves(rt, tname(instance)), 60, rt)
            c.wait_for_more(20)
        after = {s["name"]: s for s in rt.servers()}
        assert after[f"{cluster}-0"]["pid"] == before[f"{cluster}-0"]["pid"]
        assert after[victim]["dataDir"] == before[victim]["dataDir"]
        assert not alive(before[victim]["pid"])
        assert not c.missing, f"acknowledged rows read back missing: {c.missing[:5]}"
        assert_every_ack_once(rt, tname(instance), c.acked)
        refused = rt.cli("restart", f"{cluster}-7")
        assert refused.returncode != 0
        assert f'no tablet server named "{cluster}-7" runs here' in refused.stderr, refused.stderr
    finally:
        if rt.running():
            assert rt.stop() == 0, rt.logs()
