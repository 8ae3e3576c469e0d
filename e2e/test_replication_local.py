"""Replication between the clusters of an instance on the local runtime (one etcd, two
Clusters of two tablet servers each, all real processes on 127.0.0.1), through the official
Python client:

* clients write to both clusters at once — distinct rows, the same cells from both sides,
  and row deletes — then GenerateConsistencyToken (through a server of one cluster) and
  CheckConsistency (polled, as the client libraries' wait-for-replication helpers do,
  through a server of the other) turns true; afterwards every server of every cluster reads
  the same table (a digest of every cell), every acknowledged write is there, the cells
  both clusters wrote hold one value everywhere, and the deleted rows are gone everywhere;
* a server of each cluster killed with SIGKILL while both clusters take writes: once they are
  back, the clusters converge again, and nothing acknowledged is lost;
* a second cluster added (``local apply``) to a running one-cluster instance that holds data
  (rows with several versions, deleted rows and cells, counters), while a client writes: it
  is seeded (GetTable's replication view shows it INITIALIZING, then READY), CheckConsistency
  turns true only once it holds everything, and then it reads exactly what the first
  cluster reads, counters included;
* a partition between the clusters for 30 s, then healed: each Cluster's ``peerEndpoint`` is
  a TCP proxy in front of its servers (``tcpproxy``), black-holed in both directions while
  both clusters take writes (the same cells and counters included). Meanwhile a row written
  in one cluster does not reach the other, and no consistency token can be made (each cluster
  is asked through its peer endpoint for the writes it acknowledged: UNAVAILABLE); after the
  heal a token made then turns consistent within seconds, and every server of every cluster reads the
  same table, with every acknowledged write and increment;
* a backup made in one cluster and restored through the other fills the table in both: every
  server of each reads what the source held;
* a server whose data directory is lost (SIGKILL, directory deleted, restarted empty with a
  new identity) has its tablets re-created and re-seeded from the other cluster, with no
  ``accept-data-loss``: every acknowledged write is back, in both clusters."""

from __future__ import annotations

import datetime
import hashlib
import os
import shutil
import signal
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from google.api_core import exceptions as gexc
from google.cloud.bigtable_admin_v2.types import bigtable_table_admin as at

import btlib
import localrt
import tcpproxy
from btlib import GapicClients
from conftest import free_port

PROJECT = "repl-p"
TABLE = "replicated"
SPLITS = [b"g", b"p"]
CONVERGE_TIMEOUT = 60


def manifest(instance: str, clusters=("a", "b"), spec: str = "",
             peer_endpoints: dict[str, str] | None = None) -> str:
    """The Instance and its Clusters of two servers each (``spec``: more lines of the
    Instance's spec; ``peer_endpoints``: the ``spec.peerEndpoint`` of some clusters)."""
    peer_endpoints = peer_endpoints or {}
    clusters = "".join(f"""---
apiVersion: basalt.dev/v1alpha1
kind: Cluster
metadata:
  name: {instance}-{c}
spec:
  instanceRef: {instance}
  serveNodes: 2
  storageSize: 1Gi
""" + (f"  peerEndpoint: {peer_endpoints[c]}\n" if c in peer_endpoints else "") for c in clusters)
    return f"""apiVersion: basalt.dev/v1alpha1
kind: Instance
metadata:
  name: {instance}
spec:
  displayName: Replicated
  type: Development
  projectId: {PROJECT}
{spec}{clusters}"""


def tname(instance: str) -> str:
    return btlib.table_name(TABLE, instance, PROJECT)


def cluster_servers(rt: localrt.LocalRuntime, instance: str, cluster: str) -> list[dict]:
    return rt.cluster(instance, f"{instance}-{cluster}")["servers"]


def start(tmp_path: Path, instance: str, clusters=("a", "b"), env=None,
          spec: str = "", text: str | None = None,
          peer_endpoints: dict[str, str] | None = None) -> localrt.LocalRuntime:
    """The runtime of ``manifest(instance, clusters, spec, peer_endpoints)`` (or of
    ``text``), with the table made and served by every server."""
    rt = localrt.LocalRuntime(tmp_path, text or manifest(instance, clusters, spec, peer_endpoints),
                              f"127.0.0.1:{free_port()}", env=env).start()
    client = GapicClients(cluster_servers(rt, instance, "a")[0]["grpc"])
    client.admin.create_table(
        request=at.CreateTableRequest(
            parent=btlib.instance_name(instance, PROJECT), table_id=TABLE,
            table=btlib.Table(column_families={"cf": btlib.column_family(),
                                               "n": btlib.aggregate_family("sum")}),
            initial_splits=[at.CreateTableRequest.Split(key=k) for k in SPLITS]),
        timeout=60)
    client.close()
    for c in clusters:
        cl = localrt.EtcdCluster(rt, instance, f"{instance}-{c}")
        localrt.wait(f"3 tablets of cluster {c} owned",
                     lambda: sum(cl.owners().values()) == 3, 60, rt)
    for s in rt.servers():
        localrt.wait(f"server {s['name']} serving the table",
                     lambda: serves(s["grpc"], tname(instance)), 60, rt)
    return rt


def serves(endpoint: str, table: str) -> bool:
    client = GapicClients(endpoint)
    try:
        btlib.read_rows(client.data, table, keys=[b"a"], timeout=5)
        return True
    except gexc.GoogleAPICallError:
        return False
    finally:
        client.close()


def try_token(client: GapicClients, table: str) -> str | None:
    """A consistency token made through ``client``; None while one cannot be made."""
    try:
        return client.admin.generate_consistency_token(
            request=at.GenerateConsistencyTokenRequest(name=table), timeout=10,
            retry=None).consistency_token
    except gexc.ServiceUnavailable:
        return None


class Writers(localrt.ClientLoad):
    """One writer thread per cluster, each through one server of it: distinct rows
    (``acked``), the same cell ``shared:<n % 10>`` cf:q@1000 written by both (so both clusters
    write the same cells), an AddToCell to one of the counters ``counter-<n % 5>`` n:c@0 that
    both clusters add to (``counted``: the acknowledged increments; ``maybe_counted``: those
    answered with an error, which may or may not have been applied), and now and then a
    DeleteFromRow of one of its own acknowledged rows (``deleted``; never written again).
    Started, stopped and waited on as a ``ClientLoad``."""

    def __init__(self, endpoints: dict[str, str], table: str, prefix: str = ""):
        super().__init__(next(iter(endpoints.values())), table)
        self.prefix = prefix
        self.endpoints = dict(endpoints)
        self.deleted: set[bytes] = set()
        # Writes and deletes whose outcome the client does not know (an error answered).
        self.unsure: set[bytes] = set()
        self.counted = {f"counter-{i}".encode(): 0 for i in range(5)}
        self.maybe_counted = dict.fromkeys(self.counted, 0)
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, args=(c,)) for c in self.endpoints]

    def run(self, cluster: str):
        mine: list[bytes] = []
        n = 0
        while not self.stop.is_set():
            client = GapicClients(self.endpoints[cluster])
            try:
                while not self.stop.is_set():
                    key = f"{self.prefix}{'bdfhjlnprtvxz'[n % 13]}-{cluster}-{n:06}".encode()
                    shared = f"shared-{n % 10}".encode()
                    counter, increment = f"counter-{n % 5}".encode(), 1 + n % 3
                    victim = None
                    adding = False
                    try:
                        btlib.mutate_row(client.data, self.table, key,
                                         [btlib.set_cell("cf", b"q", key, 1000)], timeout=20)
                        with self.lock:
                            self.acked.append(key)
                        mine.append(key)
                        btlib.mutate_row(client.data, self.table, shared,
                                         [btlib.set_cell("cf", b"q", key, 1000)], timeout=20)
                        adding = True
                        btlib.mutate_row(client.data, self.table, counter,
                                         [btlib.add_to_cell("n", b"c", 0, increment)], timeout=20)
                        adding = False
                        with self.lock:
                            self.counted[counter] += increment
                        if n % 7 == 6:
                            victim = mine.pop(len(mine) // 2)
                            # Deleted once the delete is acknowledged (before: maybe not).
                            btlib.mutate_row(client.data, self.table, victim,
                                             [btlib.delete_from_row()], timeout=20)
                            with self.lock:
                                self.deleted.add(victim)
                    except gexc.GoogleAPICallError as e:
                        with self.lock:
                            if adding:
                                self.maybe_counted[counter] += increment
                            else:
                                self.unsure.add(victim or key)
                            self.errors.append(f"{cluster} {key!r}: {str(e)[:160]}")
                        time.sleep(0.1)
                        break  # a new channel (the server may have been restarted)
                    n += 1
            finally:
                client.close()

    def absorb(self, earlier: "Writers"):
        """Takes in what an earlier load wrote to the same table (its acknowledged, deleted and
        unsure rows, its counted increments): the checks then cover both."""
        self.acked.extend(earlier.acked)
        self.deleted |= earlier.deleted
        self.unsure |= earlier.unsure
        for key in self.counted:
            self.counted[key] += earlier.counted[key]
            self.maybe_counted[key] += earlier.maybe_counted[key]


def wait_consistent(rt: localrt.LocalRuntime, instance: str, token_via: str, check_via: str):
    """GenerateConsistencyToken through ``token_via``, then CheckConsistency through
    ``check_via`` until it says true."""
    gen = GapicClients(token_via)
    token = gen.admin.generate_consistency_token(
        request=at.GenerateConsistencyTokenRequest(name=tname(instance)), timeout=30
    ).consistency_token
    gen.close()
    checker = GapicClients(check_via)
    try:
        localrt.wait("CheckConsistency true", lambda: checker.admin.check_consistency(
            request=at.CheckConsistencyRequest(name=tname(instance), consistency_token=token),
            timeout=10).consistent, CONVERGE_TIMEOUT, rt, every=0.5)
    finally:
        checker.close()


def table_through(endpoint: str, table: str) -> dict[bytes, list]:
    client = GapicClients(endpoint)
    try:
        rows = btlib.read_rows(client.data, table, timeout=60)
    finally:
        client.close()
    return {r.key: [(c.family, c.qualifier, c.ts, c.value) for c in r.cells] for r in rows}


def digest(rows: dict[bytes, list]) -> str:
    h = hashlib.sha256()
    for key in sorted(rows):
        h.update(repr((key, rows[key])).encode())
    return f"{len(rows)} rows, {h.hexdigest()[:16]}"


def assert_converged(rt: localrt.LocalRuntime, instance: str, w: Writers, clusters=("a", "b"),
                     written_before: frozenset[bytes] = frozenset()):
    """Consistent, then every server of every cluster of ``clusters`` reads the same table,
    with every acknowledged write and none deleted."""
    servers = [s for c in clusters for s in cluster_servers(rt, instance, c)]
    wait_consistent(rt, instance, servers[0]["grpc"], servers[-1]["grpc"])
    views = {s["name"]: table_through(s["grpc"], tname(instance)) for s in servers}
    digests = {name: digest(rows) for name, rows in views.items()}
    if len(set(digests.values())) != 1:
        first, *others = views.items()
        diff = {name: {k: (first[1].get(k), rows.get(k)) for k in set(first[1]) | set(rows)
                       if first[1].get(k) != rows.get(k)} for name, rows in others}
        raise AssertionError(f"the clusters differ: {digests}; against {first[0]}: "
                             f"{ {n: list(d.items())[:4] for n, d in diff.items() if d} }")
    rows = next(iter(views.values()))
    missing = [k for k in w.acked if k not in w.deleted | w.unsure and k not in rows]
    assert not missing, f"{len(missing)} acknowledged rows missing, e.g. {missing[:5]}"
    resurrected = [k for k in w.deleted if k in rows]
    assert not resurrected, f"deleted rows read back: {resurrected[:5]}"
    # Both clusters wrote the shared cells: one value each, the same everywhere (above).
    for n in range(10):
        cells = rows.get(f"shared-{n}".encode(), [])
        assert len(cells) <= 1, cells
    unknown = [k for k in rows if not k.startswith((b"shared-", b"counter-"))
               and k not in w.acked and k not in w.unsure and k not in written_before]
    assert not unknown, f"rows nobody wrote: {unknown[:5]}"
    # Both clusters added to the same counters: each holds every acknowledged increment, once
    # (plus, at most, the increments whose answer was an error).
    for key, acked in w.counted.items():
        cells = rows.get(key, [])
        got = int.from_bytes(cells[0][3], "big", signed=True) if cells else 0
        assert acked <= got <= acked + w.maybe_counted[key], (
            key, got, acked, w.maybe_counted[key])
    assert sum(w.counted.values()) > 0, "the writers added to the counters"


def test_two_clusters_converge_under_writes_to_both(tmp_path):
    instance = "repl-two"
    rt = start(tmp_path, instance)
    try:
        a, b = (cluster_servers(rt, instance, c) for c in ("a", "b"))
        with Writers({"a": a[0]["grpc"], "b": b[1]["grpc"]}, tname(instance)) as w:
            w.wait_for_more(300, timeout=60)
        assert not w.errors, w.errors[:5]
        assert w.deleted, "the writers deleted rows"
        assert_converged(rt, instance, w)
        # A write after convergence reaches the other cluster too.
        client = GapicClients(b[0]["grpc"])
        btlib.mutate_row(client.data, tname(instance), b"late",
                         [btlib.set_cell("cf", b"q", b"from b", 2000)], timeout=20)
        client.close()
        localrt.wait("the late write read in cluster a",
                     lambda: b"late" in table_through(a[1]["grpc"], tname(instance)), 30, rt)
        # `local status` shows each direction caught up.
        status = localrt.wait("local status: both directions caught up", lambda: (
            out := rt.cli("status").stdout).count(": caught up") == 2 and out, 30, rt)
        assert f"  replication:\n    {instance}-a → {instance}-b: caught up\n" in status, status
        # local.json carries the same pairs, caught up.
        pairs = localrt.wait("local.json: both directions caught up", lambda: (
            r := rt.instance(instance).get("replication", [])) and all(
                p["pendingWrites"] == 0 for p in r) and r, 30, rt)
        assert {(p["source"], p["destination"]) for p in pairs} == {
            (f"{instance}-a", f"{instance}-b"), (f"{instance}-b", f"{instance}-a")}, pairs
        # GetTable's replication view names both clusters, READY.
        client = GapicClients(b[1]["grpc"])
        got = client.admin.get_table(request=at.GetTableRequest(
            name=tname(instance), view=btlib.admin_types.Table.View.REPLICATION_VIEW))
        READY = btlib.admin_types.Table.ClusterState.ReplicationState.READY
        assert {c: s.replication_state for c, s in got.cluster_states.items()} == {
            f"{instance}-a": READY, f"{instance}-b": READY}
        # DropRowRange through one cluster drops the rows in both.
        client.admin.drop_row_range(request=at.DropRowRangeRequest(
            name=tname(instance), row_key_prefix=b"shared-"), timeout=60)
        client.close()
        for s in a + b:
            rows = table_through(s["grpc"], tname(instance))
            assert not [k for k in rows if k.startswith(b"shared-")], s["name"]
            assert b"late" in rows, s["name"]

        # A backup made in cluster b, restored through a server of cluster a: the restore
        # fills the table in both clusters (its data bypasses replication), so every server
        # of each reads what the source held; a write to it then replicates as to any table.
        source = table_through(a[0]["grpc"], tname(instance))
        client = GapicClients(b[0]["grpc"])
        backup = client.admin.create_backup(request=at.CreateBackupRequest(
            parent=f"{btlib.instance_name(instance, PROJECT)}/clusters/{instance}-b",
            backup_id="converged", backup=btlib.admin_types.Backup(
                source_table=tname(instance),
                expire_time=datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=7))),
            retry=None, timeout=60).result(timeout=120)
        client.close()
        client = GapicClients(a[1]["grpc"])
        started = time.monotonic()
        client.admin.restore_table(request=at.RestoreTableRequest(
            parent=btlib.instance_name(instance, PROJECT), table_id="restored", backup=backup.name),
            retry=None, timeout=60).result(timeout=180)
        restored_in = time.monotonic() - started
        restored = btlib.table_name("restored", instance, PROJECT)
        for s in a + b:
            got = table_through(s["grpc"], restored)
            assert got == source, (s["name"], digest(got), digest(source))
        btlib.mutate_row(client.data, restored, b"after-restore",
                         [btlib.set_cell("cf", b"q", b"from a", 3000)], timeout=20)
        client.close()
        localrt.wait("the write to the restored table read in cluster b",
                     lambda: b"after-restore" in table_through(b[1]["grpc"], restored), 30, rt)
        print(f"restored into both clusters in {restored_in:.1f} s ({digest(source)})")
    finally:
        assert rt.stop() == 0, rt.logs()


def test_servers_killed_in_each_cluster_mid_stream_converge(tmp_path):
    instance = "repl-kill"
    rt = start(tmp_path, instance)
    try:
        a, b = (cluster_servers(rt, instance, c) for c in ("a", "b"))
        # The writers go through the servers that stay up; the killed ones own tablets, ship
        # their logs and receive the other cluster's writes.
        with Writers({"a": a[0]["grpc"], "b": b[0]["grpc"]}, tname(instance)) as w:
            w.wait_for_more(100, timeout=60)
            killed = [a[1], b[1]]
            for s in killed:
                os.kill(s["pid"], signal.SIGKILL)
            w.wait_for_more(100, timeout=120)
            rt.wait_ready(timeout=120, pids_not=[s["pid"] for s in killed])
            w.wait_for_more(100, timeout=120)
        assert_converged(rt, instance, w)
    finally:
        assert rt.stop() == 0, rt.logs()


def replication_states(endpoint: str, instance: str) -> dict[str, str]:
    client = GapicClients(endpoint)
    try:
        got = client.admin.get_table(request=at.GetTableRequest(
            name=tname(instance), view=btlib.admin_types.Table.View.REPLICATION_VIEW), timeout=10)
    finally:
        client.close()
    return {c: s.replication_state.name for c, s in got.cluster_states.items()}


@pytest.mark.parametrize("before", [("a",), ("a", "c")], ids=["second", "third"])
def test_a_cluster_added_to_an_instance_with_data_is_seeded_under_writes(tmp_path, before):
    """The second cluster of an instance (no change log was kept before it: only the seed
    brings the old rows), or the third (the logs are on, and some of their entries overlap
    the seed)."""
    instance = f"repl-seed{len(before) + 1}"
    rt = start(tmp_path, instance, clusters=before)
    try:
        a = cluster_servers(rt, instance, "a")
        table = tname(instance)
        # Data from before the new cluster existed: rows of 1 KiB cells over three tablets,
        # some with three versions, deleted rows and cells, and counters.
        client = GapicClients(a[0]["grpc"])
        old_rows: list[bytes] = []
        for i in range(0, 1500, 100):
            entries = []
            for j in range(i, i + 100):
                key = f"{'bdfhjlnprtvxz'[j % 13]}-old-{j:05}".encode()
                old_rows.append(key)
                entries.append((key, [btlib.set_cell("cf", b"q", os.urandom(512).hex().encode(), ts)
                                      for ts in ((1000, 2000, 3000) if j % 5 == 0 else (1000,))]))
            assert set(btlib.mutate_rows(client.data, table, entries)) == {"OK"}, i
        for j in range(0, 1500, 50):
            btlib.mutate_row(client.data, table, old_rows[j], [btlib.delete_from_row()], timeout=20)
        for j in range(5, 1500, 50):
            btlib.mutate_row(client.data, table, old_rows[j],
                             [btlib.delete_from_column("cf", b"q", 0, 2000)], timeout=20)
        counters = {f"count-{c}".encode(): 0 for c in range(5)}
        for n in range(60):
            key = f"count-{n % 5}".encode()
            btlib.mutate_row(client.data, table, key, [btlib.add_to_cell("n", b"c", 0, n)], timeout=20)
            counters[key] += n
        client.close()
        original = table_through(a[1]["grpc"], table)
        assert len(original) >= 1400, len(original)

        writers = {c: cluster_servers(rt, instance, c)[0]["grpc"] for c in before}
        with Writers(writers, table) as w:
            w.wait_for_more(50, timeout=60)
            applied = rt.apply(manifest(instance, (*before, "b")))
            assert applied.returncode == 0, applied.stdout + applied.stderr
            rt.wait_ready(timeout=120)
            b = cluster_servers(rt, instance, "b")
            assert len(b) == 2, b
            # The new cluster is INITIALIZING until it holds the table; READY afterwards.
            seen: set[str] = set()

            def ready():
                try:
                    state = replication_states(b[0]["grpc"], instance)
                except gexc.GoogleAPICallError:
                    return False
                seen.add(state.get(f"{instance}-b", "absent"))
                return state == {f"{instance}-{c}": "READY" for c in (*before, "b")}
            localrt.wait("cluster b READY", ready, 120, rt, every=0.2)
            w.wait_for_more(100, timeout=60)
        assert not w.errors, w.errors[:5]
        # Seen INITIALIZING, unless the seed was done before the first look.
        assert seen <= {"INITIALIZING", "READY", "absent"}, seen
        status = rt.cli("status").stdout
        assert "initializing" not in status, status
        assert_converged(rt, instance, w, clusters=(*before, "b"),
                         written_before=frozenset(original))
        # Everything from before is there in cluster b, as cluster a reads it.
        now = table_through(b[1]["grpc"], table)
        for key, cells in original.items():
            if not key.startswith(b"shared-") and key not in w.deleted:
                assert now.get(key) == cells, (key, cells[:1], now.get(key, [])[:1])
        for key, total in counters.items():
            got = now[key]
            assert len(got) == 1 and int.from_bytes(got[0][3], "big", signed=True) == total, (key, got)
        deleted = [old_rows[j] for j in range(0, 1500, 50) if old_rows[j] in now]
        assert not deleted, deleted[:3]
    finally:
        assert rt.stop() == 0, rt.logs()


def test_a_server_that_lost_its_data_is_reseeded_from_the_other_cluster(tmp_path):
    instance = "repl-lost"
    rt = start(tmp_path, instance,
               env={"BASALT_LEASE_TTL_SECS": "3", "BASALT_LEASE_GRACE_SECS": "1"})
    try:
        a, b = (cluster_servers(rt, instance, c) for c in ("a", "b"))
        table = tname(instance)
        with Writers({"a": a[0]["grpc"], "b": b[0]["grpc"]}, table) as w:
            w.wait_for_more(200, timeout=60)
        assert not w.errors, w.errors[:5]
        wait_consistent(rt, instance, a[0]["grpc"], b[0]["grpc"])
        before = table_through(b[1]["grpc"], table)
        victim = next(s for s in a[1:])
        assert localrt.EtcdCluster(rt, instance, f"{instance}-a").owners().get(victim["name"]), \
            "the victim owns tablets"
        # Its volume is lost: killed, its data directory deleted before the runtime restarts it.
        os.kill(victim["pid"], signal.SIGKILL)
        shutil.rmtree(victim["dataDir"], ignore_errors=True)
        rt.wait_ready(timeout=60, pids_not=(victim["pid"],))
        with Writers({"a": a[0]["grpc"], "b": b[0]["grpc"]}, table, prefix="2") as w2:
            # The master declares the old store lost (lease + margin), re-creates its tablets
            # and seeds them from cluster b; meanwhile cluster b takes writes, and so does a.
            localrt.wait("the lost tablets re-seeded (READY everywhere)", lambda: (
                "repl-lost-a: initializing" not in rt.cli("status").stdout
                and replication_states(b[0]["grpc"], instance)
                == {f"{instance}-a": "READY", f"{instance}-b": "READY"}
                and b"re-seeded from cluster" in b"".join(
                    p.read_bytes() for p in (rt.data_dir / "logs").glob("*master*.log"))),
                120, rt, every=0.5)
            w2.wait_for_more(100, timeout=60)
        # Everything acknowledged before the loss is back, through every server of a.
        for s in cluster_servers(rt, instance, "a"):
            rows = table_through(s["grpc"], table)
            missing = [k for k in before if k not in rows and k not in w2.deleted]
            assert not missing, (s["name"], missing[:5], rt.logs())
        w2.absorb(w)
        assert_converged(rt, instance, w2)
    finally:
        assert rt.stop() == 0, rt.logs()


def test_a_cluster_left_out_is_released_and_no_longer_waited_for(tmp_path):
    """A Cluster left out of the manifests the runtime starts with leaves the instance: its
    number and positions are released, the other cluster stops shipping to it, GetTable no
    longer names it, and consistency tokens do not wait for it."""
    instance = "repl-leave"
    rt = start(tmp_path, instance)
    try:
        a = cluster_servers(rt, instance, "a")
        with Writers({"a": a[0]["grpc"], "b": cluster_servers(rt, instance, "b")[0]["grpc"]},
                     tname(instance)) as w:
            w.wait_for_more(50, timeout=60)
        assert_converged(rt, instance, w)
    finally:
        assert rt.stop() == 0, rt.logs()
    # Started again on the same data with cluster a only.
    rt.manifest.write_text(manifest(instance, ("a",)))
    rt.start()
    try:
        a = cluster_servers(rt, instance, "a")
        assert f"{instance}-b" not in rt.instance(instance)["clusters"]
        localrt.wait("GetTable names cluster a only", lambda: replication_states(
            a[0]["grpc"], instance) == {f"{instance}-a": "READY"}, 30, rt)
        # Writes through a turn consistent without cluster b.
        client = GapicClients(a[1]["grpc"])
        btlib.mutate_row(client.data, tname(instance), b"after", [btlib.set_cell("cf", b"q", b"v", 1000)],
                         timeout=20)
        client.close()
        wait_consistent(rt, instance, a[0]["grpc"], a[1]["grpc"])
        # No pair, no seeding, nothing shipped towards b any more.
        state = localrt.wait("local.json without replication", lambda: (
            i := rt.instance(instance)) and not i.get("replication") and i, 30, rt)
        assert not state.get("seeding"), state
        shipped = localrt.etcd_range(rt.state()["etcd"], f"/basalt/v1/default/{instance}/shipped/")
        assert not [k for k, _ in shipped if k.endswith(f"/{instance}-b")], shipped
        assert not localrt.etcd_range(rt.state()["etcd"],
                                      f"/basalt/v1/default/{instance}/cluster-numbers/{instance}-b",
                                      prefix=False)
        rows = table_through(a[0]["grpc"], tname(instance))
        assert b"after" in rows and all(k in rows for k in w.acked if k not in w.deleted | w.unsure)
    finally:
        assert rt.stop() == 0, rt.logs()


def test_a_cluster_not_heard_from_within_the_retention_is_reseeded(tmp_path):
    """With a change-log retention of 3 s, cluster b's servers are stopped (SIGSTOP) while
    cluster a takes writes for longer than that: a's servers stop keeping their log for b and
    mark b for a re-seed (its seed record, shown in local.json) instead of pinning the log.
    Once b runs again, the master copies every table into it; CheckConsistency turns true and
    b holds every row and counter acknowledged meanwhile — including those whose log entries
    were dropped (without the re-seed they would be missing)."""
    instance = "repl-stale"
    rt = start(tmp_path, instance, env={"BASALT_CHANGE_LOG_RETENTION_SECS": "3"})
    try:
        a, b = (cluster_servers(rt, instance, c) for c in ("a", "b"))
        with Writers({"a": a[0]["grpc"], "b": b[0]["grpc"]}, tname(instance)) as w:
            w.wait_for_more(60, timeout=60)
        assert not w.errors, w.errors[:5]
        wait_consistent(rt, instance, a[0]["grpc"], b[0]["grpc"])
        for s in b:
            os.kill(s["pid"], signal.SIGSTOP)
        try:
            with Writers({"a": a[0]["grpc"]}, tname(instance), prefix="2") as w2:
                w2.wait_for_more(100, timeout=60)
                logs = lambda: b"".join(p.read_bytes() for p in (rt.data_dir / "logs").glob(
                    f"{instance}-a-*.log"))
                localrt.wait("cluster a drops log entries b never had, and marks b for a re-seed",
                             lambda: b"not heard from within the change log's retention" in logs(),
                             60, rt, every=0.5)
                seeding = localrt.wait("local.json: b is being seeded", lambda: [
                    s for s in rt.instance(instance).get("seeding", [])
                    if s["cluster"] == f"{instance}-b"], 30, rt)
                assert seeding, rt.instance(instance)
                w2.wait_for_more(50, timeout=60)
        finally:
            for s in b:
                os.kill(s["pid"], signal.SIGCONT)
        assert not w2.errors, w2.errors[:5]
        w2.absorb(w)
        assert_converged(rt, instance, w2)
        # Each server reads the seed records every second.
        localrt.wait("GetTable: b READY again", lambda: replication_states(
            b[1]["grpc"], instance) == {f"{instance}-a": "READY", f"{instance}-b": "READY"},
                     10, rt)
        master = (rt.data_dir / "logs" / f"{instance}-master.log").read_text()
        assert [line for line in master.splitlines()
                if "seeded with: READY" in line and f'"{instance}-b"' in line], master[-2000:]
    finally:
        assert rt.stop() == 0, rt.logs()


def metric(server: dict, name: str, **labels: str) -> float:
    """The sum of ``name`` over the series of ``server``'s /metrics that carry ``labels``."""
    with urllib.request.urlopen(f"http://{server['http']}/metrics", timeout=5) as r:
        text = r.read().decode()
    return btlib.Metrics(text).value(name, **labels)


def test_seeding_and_shipping_keep_to_the_instances_rate_limits(tmp_path):
    """``spec.replication`` limits the seeding copy and the shipping, as the runtime records
    it in etcd: seeding a cluster with N bytes at R bytes/s takes at least (N - R) / R (the
    bucket lends one second), so does shipping N bytes written afterwards; both converge
    exactly, and the shippers count the time they waited."""
    instance = "repl-rate"
    rate = 200_000
    n_bytes = 600_000  # values alone; what is sent (keys, versions) is more
    limits = f"  replication:\n    shipBytesPerSecond: {rate}\n    seedBytesPerSecond: {rate}\n"
    rt = start(tmp_path, instance, clusters=("a",), spec=limits)
    try:
        a = cluster_servers(rt, instance, "a")
        table = tname(instance)

        def write(prefix: str):
            client = GapicClients(a[0]["grpc"])
            try:
                for i in range(0, n_bytes // 1000, 100):
                    entries = [(f"{'bdfhjlnprtvxz'[j % 13]}-{prefix}-{j:05}".encode(),
                                [btlib.set_cell("cf", b"q", os.urandom(500).hex().encode(), 1000)])
                               for j in range(i, i + 100)]
                    assert set(btlib.mutate_rows(client.data, table, entries)) == {"OK"}, i
            finally:
                client.close()

        write("seeded")
        began = time.monotonic()
        applied = rt.apply(manifest(instance, ("a", "b"), limits))
        assert applied.returncode == 0, applied.stdout + applied.stderr
        localrt.wait("cluster b READY", lambda: replication_states(
            a[0]["grpc"], instance) == {f"{instance}-a": "READY", f"{instance}-b": "READY"},
                     120, rt, every=0.2)
        seeded_in = time.monotonic() - began
        assert seeded_in >= (n_bytes - rate) / rate, seeded_in
        rt.wait_ready(timeout=60)
        b = cluster_servers(rt, instance, "b")

        began = time.monotonic()
        write("shipped")
        wait_consistent(rt, instance, a[0]["grpc"], b[0]["grpc"])
        shipped_in = time.monotonic() - began
        assert shipped_in >= (n_bytes - rate) / rate, shipped_in
        throttled = sum(metric(s, "basalt_replication_throttled_seconds_total",
                               peer_cluster=f"{instance}-b") for s in a)
        assert throttled > 0, throttled
        sent = sum(metric(s, "basalt_replication_bytes_total", peer_cluster=f"{instance}-b")
                   for s in a)
        assert sent >= n_bytes, sent
        # Exactly the same rows in both clusters, through every server.
        views = {s["name"]: digest(table_through(s["grpc"], table)) for s in a + b}
        assert len(set(views.values())) == 1, views
        assert next(iter(views.values())).startswith(f"{2 * n_bytes // 1000} rows"), views
    finally:
        assert rt.stop() == 0, rt.logs()


def test_a_cluster_removed_while_running_ships_its_writes_first(tmp_path):
    """``local apply`` of the manifests without cluster b while both clusters take writes: b
    leaves the endpoint at once and shows ``removing`` (held while a cannot take its writes:
    a's servers are stopped with SIGSTOP for a moment); a writer connected to b's server
    writes on, served by a; then b's servers stop and it is released; every write acknowledged
    anywhere, also by b, reads through a, counters exact."""
    instance = "repl-remove"
    rt = start(tmp_path, instance)
    try:
        a, b = (cluster_servers(rt, instance, c) for c in ("a", "b"))
        with Writers({"a": a[0]["grpc"]}, tname(instance)) as wa, \
                Writers({"b": b[0]["grpc"]}, tname(instance)) as wb:
            wb.wait_for_more(50, timeout=60)
            for s in a:
                os.kill(s["pid"], signal.SIGSTOP)
            try:
                wb.wait_for_more(30, timeout=30)
                applied = rt.apply(manifest(instance, ("a",)))
                assert applied.returncode == 0, applied.stdout + applied.stderr
                assert f"cluster {instance}-b removing" in applied.stdout, applied.stdout
                removing = rt.cluster(instance, f"{instance}-b")["removing"]
                assert removing["reason"] == "UnshippedWrites", removing
                # b's servers report entries a has not taken.
                held = localrt.wait("local.json: b held by its unshipped writes", lambda: (
                    r := rt.cluster(instance, f"{instance}-b")["removing"])
                    and "change log entries waiting" in r["message"] and r, 20, rt)
                assert f"to {instance}-a" in held["message"], held
                status = rt.cli("status").stdout
                assert "removing (UnshippedWrites)" in status, status
            finally:
                for s in a:
                    os.kill(s["pid"], signal.SIGCONT)
            # b's writer keeps its connection to b's server throughout, as a client whose
            # connection was open before the removal: b's server sends those writes to a (they
            # go on being acknowledged) and logs none of its own, so the removal finishes
            # while they go on.
            acked_before = len(wb.acked)
            localrt.wait("cluster b released", lambda: f"{instance}-b" not in rt.instance(
                instance)["clusters"], 60, rt, every=0.5)
            assert len(wb.acked) > acked_before, "b's writer was not served during the removal"
        assert not wa.errors, wa.errors[:3]
        # b's writer failed only once b's servers stopped (its channel had nowhere to go).
        assert all("503" in e for e in wb.errors), wb.errors[:3]
        b_log = (rt.data_dir / "logs" / f"{instance}-b-0.log").read_text()
        assert "this cluster is being removed: client requests go to the clusters that stay" \
            in b_log, b_log[-2000:]
        assert not localrt.etcd_range(rt.state()["etcd"],
                                      f"/basalt/v1/default/{instance}/cluster-numbers/{instance}-b",
                                      prefix=False)
        # Every write either cluster acknowledged, b's included, reads through a.
        wa.absorb(wb)
        assert_converged(rt, instance, wa, clusters=("a",))
        log = (rt.base_dir / "runtime.log").read_text()
        assert "every write of the cluster is in another cluster: stopping its servers" in log
    finally:
        assert rt.stop() == 0, rt.logs()
PARTITION_SECS = 30


def test_a_partition_between_the_clusters_heals(tmp_path):
    """Each cluster's peer endpoint is a proxy in front of its servers: the other cluster's
    shippers reach it only there. Both proxies black-hole everything for PARTITION_SECS while
    writers go on in both clusters; then they heal and the clusters converge."""
    instance = "repl-part"
    table = tname(instance)
    proxies = {c: tcpproxy.TcpProxy().start() for c in ("a", "b")}
    rt = None
    try:
        rt = start(tmp_path, instance,
                   peer_endpoints={c: p.address for c, p in proxies.items()})
        a, b = (cluster_servers(rt, instance, c) for c in ("a", "b"))
        for c, servers in (("a", a), ("b", b)):
            proxies[c].targets = [s["grpc"] for s in servers]
        # Recorded in etcd, where the shippers read it.
        for c, p in proxies.items():
            assert localrt.etcd_range(rt.state()["etcd"],
                                      f"/basalt/v1/default/{instance}/peer-endpoints/{instance}-{c}",
                                      prefix=False) == [
                (f"/basalt/v1/default/{instance}/peer-endpoints/{instance}-{c}",
                 p.address.encode())]
        with Writers({"a": a[0]["grpc"], "b": b[1]["grpc"]}, table) as w:
            w.wait_for_more(100, timeout=30)
            # Replication goes through the proxies.
            localrt.wait("both clusters replicating through the proxies",
                         lambda: all(p.forwarded for p in proxies.values()), 10, rt)
            mark = len(w.acked)
            for p in proxies.values():
                p.partition()
            cut_at = time.monotonic()
            # Through a only: its write. No token covers it while b is cut off: a token asks
            # every cluster, each where the others reach it (its peer endpoint), for the
            # writes it acknowledged, and b cannot answer.
            client = GapicClients(a[1]["grpc"])
            btlib.mutate_row(client.data, table, b"partitioned",
                             [btlib.set_cell("cf", b"q", b"from a", 1000)], timeout=20)
            with pytest.raises(gexc.ServiceUnavailable, match=f"cluster {instance}-b"):
                client.admin.generate_consistency_token(
                    request=at.GenerateConsistencyTokenRequest(name=table), timeout=30,
                    retry=None)
            checks = 0
            while time.monotonic() - cut_at < PARTITION_SECS:
                for s in b:
                    c = GapicClients(s["grpc"])
                    try:
                        rows = btlib.read_rows(c.data, table, keys=[b"partitioned"], timeout=10)
                        assert not rows, f"{s['name']} reads a's write during the partition"
                    finally:
                        c.close()
                checks += 1
                time.sleep(2)
            assert checks >= 5, checks
            acked_in_partition = w.acked_since(mark)
            for p in proxies.values():
                p.heal()
            healed_at = time.monotonic()
            # Made through a once b is reached again: it covers a's write of the partition.
            token = localrt.wait("a consistency token after the heal", lambda: try_token(client, table),
                                 30, rt, every=0.5)
            client.close()
            w.wait_for_more(50, timeout=30)
        assert not w.errors, w.errors[:5]
        assert acked_in_partition > 200, "both clusters took writes during the partition"
        checker = GapicClients(b[0]["grpc"])
        try:
            localrt.wait("CheckConsistency true after the heal", lambda: checker.admin.check_consistency(
                request=at.CheckConsistencyRequest(name=table, consistency_token=token),
                timeout=10).consistent, 30, rt, every=0.5)
        finally:
            checker.close()
        print(f"consistent {time.monotonic() - healed_at:.1f} s after the heal")
        assert_converged(rt, instance, w, written_before=frozenset({b"partitioned"}))
        for s in b:
            assert b"partitioned" in table_through(s["grpc"], table), s["name"]
    finally:
        try:
            if rt is not None:
                assert rt.stop() == 0, rt.logs()
        finally:
            for p in proxies.values():
                p.close()
