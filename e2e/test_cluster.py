"""A real cluster on the local runtime (``basalt-operator local``): one etcd, three tablet
servers and the master as processes on 127.0.0.1. Tablets spread over the servers; any server
answers any request with the standalone server's semantics; faults — kill -9 of a server, of
the master and of etcd, SIGSTOP of a server past its lease — lose no acknowledged write, and no
tablet ever changes owner.

The servers run with a short lease (TTL 3 s, grace 1 s) so that the SIGSTOP scenario passes
the serving deadline quickly; the master's margin (15 s) stays longer than the grace."""

from __future__ import annotations

import os
import subprocess
import signal
import time

import pytest
from google.api_core import exceptions as gexc

import btlib
import localrt
from btlib import GapicClients, set_cell
from conftest import free_port

INSTANCE = "e2e-spread"
PROJECT = "cluster-p"
SPLITS = [b"b", b"d", b"f", b"h", b"k", b"n", b"q", b"t", b"w"]  # 10 tablets


def tname(tid: str) -> str:
    return btlib.table_name(tid, INSTANCE, PROJECT)


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    rt = localrt.LocalRuntime(
        tmp_path_factory.mktemp("cluster"),
        localrt.manifest(INSTANCE, PROJECT, "spread-c1", 3),
        f"127.0.0.1:{free_port()}",
        # Failover, not balancing, is what this module checks: with a tolerance no imbalance
        # reaches, the master never moves a tablet, so owners change only through the faults
        # under test (moves are e2e/test_moves.py's).
        env={"BASALT_LEASE_TTL_SECS": "3", "BASALT_LEASE_GRACE_SECS": "1",
             "BASALT_BALANCE_TOLERANCE": "1000"},
    ).start()
    yield rt
    if rt.running():
        assert rt.stop() == 0, rt.logs()


@pytest.fixture(scope="module")
def clients(runtime):
    cs = [GapicClients(s["grpc"]) for s in runtime.servers()]
    yield cs
    for c in cs:
        c.close()


def create(client: GapicClients, table_id: str, splits=SPLITS):
    client.admin.create_table(
        request=btlib.admin_types.CreateTableRequest(
            parent=btlib.instance_name(INSTANCE, PROJECT), table_id=table_id,
            table=btlib.Table(column_families={"cf": btlib.column_family()}),
            initial_splits=[btlib.admin_types.CreateTableRequest.Split(key=k) for k in splits]),
        timeout=60)


def tablets_per_server(runtime) -> list[int]:
    counts = []
    for s in runtime.servers():
        _, _, body = btlib.http_get(f"http://{s['http']}/metrics", timeout=5)
        text = body.decode() if isinstance(body, bytes) else body
        (labels, value), = btlib.Metrics(text).find("basalt_tablets")
        assert labels.get("basalt_server") == s["name"], labels
        counts.append(int(value))
    return counts


def test_tablets_spread_and_every_server_serves_every_row(runtime, clients):
    a, b_, c = clients
    create(a, "spread")
    # The table created through server A is usable through server C at once.
    keys = [bytes([ch]) + b"-row" for ch in b"acegijlmoprsuvxz"]
    statuses = btlib.mutate_rows(c.data, tname("spread"),
                                 [(k, [set_cell("cf", b"q", k, 1000)]) for k in keys])
    assert statuses == ["OK"] * len(keys)
    # Ten tablets over three servers: 4/3/3 (in some order), in the servers' metrics and in
    # local.json.
    assert sorted(tablets_per_server(runtime)) == [3, 3, 4]
    deadline = time.monotonic() + 10
    while sorted(s["tablets"] for s in runtime.servers()) != [3, 3, 4]:
        assert time.monotonic() < deadline, runtime.servers()
        time.sleep(0.2)
    for client in clients:
        rows = btlib.read_rows(client.data, tname("spread"))
        assert [r.key for r in rows] == sorted(keys)
        rev = btlib.read_rows(client.data, tname("spread"), reversed=True)
        assert [r.key for r in rev] == sorted(keys, reverse=True)
        limited = btlib.read_rows(client.data, tname("spread"), limit=5)
        assert [r.key for r in limited] == sorted(keys)[:5]
        rlimited = btlib.read_rows(client.data, tname("spread"), limit=7, reversed=True)
        assert [r.key for r in rlimited] == sorted(keys, reverse=True)[:7]
        for k in keys:
            row = btlib.read_rows(client.data, tname("spread"), keys=[k])
            assert [r.key for r in row] == [k]
    # One entry with an unknown family fails alone, whichever server owns its row.
    statuses = btlib.mutate_rows(b_.data, tname("spread"), [
        (b"a-x", [set_cell("cf", b"q", b"1", 1000)]),
        (b"m-x", [set_cell("nope", b"q", b"1", 1000)]),
        (b"z-x", [set_cell("cf", b"q", b"1", 1000)]),
    ])
    assert statuses == ["OK", "NOT_FOUND", "OK"]
    # Sample keys cover the whole table and end with the empty key.
    samples = btlib.sample_row_keys(a.data, tname("spread"))
    assert samples[-1][0] == b""
    assert [k for k, _ in samples[:-1]] == sorted(k for k, _ in samples[:-1])
    # Another instance is NOT_FOUND on a cluster (as in Bigtable).
    with pytest.raises(gexc.NotFound):
        btlib.read_rows(a.data, btlib.table_name("spread", "other-instance", PROJECT))
    # Single-row calls through a server that does not own the row.
    assert btlib.check_and_mutate(b_.data, tname("spread"), b"z-row", None,
                                  true=[set_cell("cf", b"c", b"yes", 2000)])
    got = btlib.read_modify_write(c.data, tname("spread"), b"a-row",
                                  [btlib.rmw_append("cf", b"q", b"+")])
    assert got.cells[0].value == b"a-row+"


def test_a_table_of_many_initial_splits_is_spread_and_served(runtime, clients):
    """300 initial splits: more tablets than etcd takes in one transaction (128 operations),
    so the master writes them in batches behind a marker; no server sees the table half
    covered, and then every row is served through every server."""
    a, b_, c = clients
    before = owners(runtime)
    splits = [b"s%04d" % i for i in range(1, 301)]
    create(a, "many", splits)
    deadline = time.monotonic() + 30
    while sum(owners(runtime).values()) != sum(before.values()) + 301:
        assert time.monotonic() < deadline, (owners(runtime), runtime.logs())
        time.sleep(0.3)
    added = {name: n - before[name] for name, n in owners(runtime).items()}
    assert all(n >= 90 for n in added.values()), added
    # One row in every tablet (and one before the first split), written through one server,
    # read whole, reversed and one by one through the others.
    keys = [b"a"] + [k + b"-row" for k in splits]
    statuses = btlib.mutate_rows(b_.data, tname("many"),
                                 [(k, [set_cell("cf", b"q", k, 1000)]) for k in keys])
    assert statuses == ["OK"] * len(keys)
    for client in (a, c):
        assert [r.key for r in btlib.read_rows(client.data, tname("many"))] == keys
    rev = btlib.read_rows(c.data, tname("many"), reversed=True, limit=50)
    assert [r.key for r in rev] == keys[::-1][:50]
    for k in keys[::37]:
        assert [r.key for r in btlib.read_rows(a.data, tname("many"), keys=[k])] == [k]
    samples = btlib.sample_row_keys(c.data, tname("many"))
    assert samples[-1][0] == b"" and len(samples) >= 301, len(samples)
    # Dropped: the servers give the tablets up (later tests count their tablets).
    a.admin.delete_table(name=tname("many"), timeout=60)
    deadline = time.monotonic() + 30
    while owners(runtime) != before:
        assert time.monotonic() < deadline, (owners(runtime), before)
        time.sleep(0.3)


class Writers(localrt.ClientLoad):
    """Clients writing distinct rows through the instance endpoint for the whole scenario;
    ``acked`` are the rows whose MutateRow returned OK."""

    def __init__(self, runtime, table: str, n: int = 3):
        super().__init__(runtime.endpoint, tname(table))
        self.spawn(self.write_row, n)


def assert_every_ack_once(runtime, clients, table: str, acked: list[bytes]):
    rows = btlib.read_rows(clients[2].data, tname(table))
    got = [r.key for r in rows]
    assert len(got) == len(set(got)), "a row read twice"
    missing = set(acked) - set(got)
    assert not missing, f"{len(missing)} acknowledged writes lost, e.g. {sorted(missing)[:5]}\n{runtime.logs()}"


def owners(runtime) -> dict[str, int]:
    return {s["name"]: s["tablets"] for s in runtime.servers()}


def test_killed_server_restarts_and_no_acknowledged_write_is_lost(runtime, clients):
    create(clients[0], "kill9")
    time.sleep(1.5)
    before = owners(runtime)
    with Writers(runtime, "kill9") as w:
        time.sleep(2)
        victim = runtime.servers()[1]
        os.kill(victim["pid"], signal.SIGKILL)
        time.sleep(1)
        runtime.wait_ready(timeout=60, pids_not=(victim["pid"],))
        mark = len(w.acked)
        time.sleep(2)
        assert w.acked_since(mark) > 10, w.errors[-5:]
    assert len(w.acked) > 50, (len(w.acked), w.errors[:5])
    assert_every_ack_once(runtime, clients, "kill9", w.acked)
    # The restarted server got its own tablets back; nobody else took them.
    assert owners(runtime) == before


def test_killed_master_is_replaced_and_assigns_new_tables(runtime, clients):
    master = runtime.instance(INSTANCE)["master"]
    assert master["pid"], runtime.instance(INSTANCE)
    with Writers(runtime, "spread") as w:
        os.kill(master["pid"], signal.SIGKILL)
        time.sleep(1)
        # Clients keep writing: the servers do not need the master to serve.
        mark = len(w.acked)
        time.sleep(2)
        assert w.acked_since(mark) > 10, w.errors[-5:]
    deadline = time.monotonic() + 30
    while runtime.instance(INSTANCE)["master"]["pid"] in (None, master["pid"]):
        assert time.monotonic() < deadline, runtime.logs()
        time.sleep(0.2)
    # The new master (elected once the old one's lease is gone) assigns a new table.
    before = sum(owners(runtime).values())
    create(clients[1], "after-master")
    deadline = time.monotonic() + 40
    while sum(owners(runtime).values()) != before + len(SPLITS) + 1:
        assert time.monotonic() < deadline, (owners(runtime), runtime.logs())
        time.sleep(0.3)
    statuses = btlib.mutate_rows(clients[2].data, tname("after-master"),
                                 [(k + b"-x", [set_cell("cf", b"q", b"v", 1000)]) for k in SPLITS])
    assert statuses == ["OK"] * len(SPLITS)
    assert_every_ack_once(runtime, clients, "spread", w.acked)


def test_killed_etcd_stops_nothing_shorter_than_the_lease(runtime, clients):
    etcd_pid = runtime.state()["etcdPid"]
    before = owners(runtime)
    with Writers(runtime, "spread") as w:
        time.sleep(1)
        os.kill(etcd_pid, signal.SIGKILL)
        mark = len(w.acked)
        time.sleep(1.5)
        # etcd down (the runtime restarts it after a back-off): writes keep succeeding.
        assert w.acked_since(mark) > 10, w.errors[-5:]
        deadline = time.monotonic() + 30
        while runtime.state().get("etcdPid") in (None, etcd_pid):
            assert time.monotonic() < deadline, runtime.logs()
            time.sleep(0.2)
        runtime.wait_ready(timeout=60)
        mark = len(w.acked)
        time.sleep(2)
        assert w.acked_since(mark) > 10, w.errors[-5:]
    assert_every_ack_once(runtime, clients, "spread", w.acked)
    assert owners(runtime) == before


def test_a_stopped_server_stops_serving_past_its_lease_and_recovers(runtime, clients):
    earlier = owners(runtime)
    create(clients[0], "sigstop")
    deadline = time.monotonic() + 10  # local.json's tablet counts are refreshed every second
    while sum(owners(runtime).values()) != sum(earlier.values()) + len(SPLITS) + 1:
        assert time.monotonic() < deadline, owners(runtime)
        time.sleep(0.2)
    before = owners(runtime)
    victim = runtime.servers()[2]
    front = clients[0]  # a server that stays up
    # One row per tablet (the tablets start at "" and at each split key).
    rows = [b"0-row"] + [k + b"-row" for k in SPLITS]
    for k in rows:
        btlib.mutate_row(front.data, tname("sigstop"), k, [set_cell("cf", b"q", b"v1", 1000)])
    os.kill(victim["pid"], signal.SIGSTOP)
    try:
        # Past TTL (3 s) + grace (1 s): its lease has expired in etcd.
        time.sleep(6)
        served, refused = [], []
        for k in rows:
            try:
                btlib.mutate_row(front.data, tname("sigstop"), k,
                                 [set_cell("cf", b"q", b"v2", 2000)], timeout=4)
                served.append(k)
            except (gexc.ServiceUnavailable, gexc.DeadlineExceeded):
                # The client's 4 s deadline passed while the frontend waited for the owner:
                # DEADLINE_EXCEEDED, from the client or from the server, as from Bigtable
                # (never CANCELLED: tablet-server/src/deadline.rs).
                refused.append(k)
        # Exactly the stopped server's tablets are unavailable; nobody else serves them.
        victims_tablets = before[victim["name"]] - earlier[victim["name"]]
        assert len(refused) == victims_tablets, (served, refused, before, earlier)
        assert len(served) == len(rows) - len(refused)
        # Nobody took its tablets: the other servers own what they owned.
        during = owners(runtime)
        assert {n: c for n, c in during.items() if n != victim["name"]} == \
            {n: c for n, c in before.items() if n != victim["name"]}, (during, before)
    finally:
        os.kill(victim["pid"], signal.SIGCONT)
    # It registers again under a new lease and serves its own tablets again.
    runtime.wait_ready(timeout=60)
    for k in refused:
        btlib.mutate_row(front.data, tname("sigstop"), k, [set_cell("cf", b"q", b"v2", 2000)],
                         timeout=30)
    got = {r.key: r for r in btlib.read_rows(front.data, tname("sigstop"))}
    assert sorted(got) == sorted(rows)
    for k in rows:
        values = [c.value for c in got[k].cells]
        assert values == [b"v2", b"v1"], (k, values)
    # It owns what it owned before, nobody else does (local.json follows within a second).
    deadline = time.monotonic() + 10
    while owners(runtime) != before:
        assert time.monotonic() < deadline, (owners(runtime), before)
        time.sleep(0.2)


def test_a_server_added_by_local_apply_receives_new_tablets(runtime, clients):
    """serveNodes 3 → 4 with `basalt-operator local apply`: a fourth server starts, registers,
    and the tablets of the next table go to it (the least loaded server first)."""
    manifest = runtime.base_dir / "scale-out.yaml"
    manifest.write_text(localrt.manifest(INSTANCE, PROJECT, "spread-c1", 4))
    out = subprocess.run(
        [str(localrt.operator_binary()), "local", "apply", "-f", str(manifest),
         "--data-dir", str(runtime.data_dir)],
        capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    deadline = time.monotonic() + 60
    while len(runtime.servers()) < 4:
        assert time.monotonic() < deadline, runtime.logs()
        time.sleep(0.2)
    runtime.wait_ready(timeout=60)
    new = runtime.servers()[3]["name"]
    assert owners(runtime)[new] == 0
    create(clients[0], "after-scale-out")
    deadline = time.monotonic() + 10
    while owners(runtime)[new] == 0:
        assert time.monotonic() < deadline, owners(runtime)
        time.sleep(0.2)
    # It serves them: rows of every tablet, written through server 0, read through it.
    keys = [b"0-n"] + [k + b"-n" for k in SPLITS]
    assert btlib.mutate_rows(clients[0].data, tname("after-scale-out"),
                             [(k, [set_cell("cf", b"q", k, 1000)]) for k in keys]) == ["OK"] * len(keys)
    fourth = GapicClients(runtime.servers()[3]["grpc"])
    got = btlib.read_rows(fourth.data, tname("after-scale-out"))
    fourth.close()
    assert [r.key for r in got] == sorted(keys)


def test_a_lost_data_directory_is_never_served_empty_until_the_loss_is_accepted(tmp_path):
    """A server whose data directory is gone comes back with a new identity: its tablets turn
    Lost (after its old lease expired plus the master's margin) and answer UNAVAILABLE — never
    empty — until an administrator accepts the loss; then they are served again, empty."""
    rt = localrt.LocalRuntime(
        tmp_path, localrt.manifest("e2e-lossy", PROJECT, "lossy-c1", 2),
        f"127.0.0.1:{free_port()}",
        env={"BASALT_LEASE_TTL_SECS": "3", "BASALT_LEASE_GRACE_SECS": "1"},
    ).start()
    try:
        name = btlib.table_name("lossy", "e2e-lossy", PROJECT)
        a, b_ = (GapicClients(s["grpc"]) for s in rt.servers())
        a.admin.create_table(
            request=btlib.admin_types.CreateTableRequest(
                parent=btlib.instance_name("e2e-lossy", PROJECT), table_id="lossy",
                table=btlib.Table(column_families={"cf": btlib.column_family()}),
                initial_splits=[btlib.admin_types.CreateTableRequest.Split(key=b"m")]),
            timeout=60)
        for k in (b"a", b"z"):
            btlib.mutate_row(a.data, name, k, [set_cell("cf", b"q", b"old", 1000)])
        # Server 1's volume is lost: kill it and delete its data directory before the
        # runtime restarts it (as a pod rescheduled with a new, empty volume).
        victim = rt.servers()[1]
        os.kill(victim["pid"], signal.SIGKILL)
        import shutil
        shutil.rmtree(victim["dataDir"], ignore_errors=True)
        rt.wait_ready(timeout=60, pids_not=(victim["pid"],))
        # Which row was on the victim: the one that is now refused. Until the master declares
        # the old store lost it is "not registered"; then "lost" — never an empty row.
        deadline = time.monotonic() + 90
        lost_key = message = None
        while time.monotonic() < deadline:
            for k in (b"a", b"z"):
                try:
                    rows = btlib.read_rows(a.data, name, keys=[k], timeout=15)
                    assert [r.key for r in rows] == [k], f"row {k!r} served without its data"
                except gexc.ServiceUnavailable as e:
                    lost_key, message = k, e.message
            if message and "is lost" in message:
                break
            time.sleep(0.5)
        assert message and "is lost" in message, (message, rt.logs())
        with pytest.raises(gexc.ServiceUnavailable):
            btlib.mutate_row(a.data, name, lost_key, [set_cell("cf", b"q", b"new", 2000)],
                             timeout=15)
        store_id = next(w for w in message.replace("(", " ").split() if w.startswith("st-"))
        out = subprocess.run(
            [str(localrt.operator_binary()), "accept-data-loss", "--data-dir", str(rt.data_dir),
             "--instance", "e2e-lossy", "--cluster", "lossy-c1", "--store-id", store_id],
            capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        # The master re-creates the tablet empty on a live server: writable again, the old
        # row gone for good; the other tablet kept its data.
        deadline = time.monotonic() + 30
        while True:
            try:
                btlib.mutate_row(b_.data, name, lost_key, [set_cell("cf", b"q", b"new", 2000)],
                                 timeout=15)
                break
            except gexc.ServiceUnavailable:
                assert time.monotonic() < deadline, rt.logs()
                time.sleep(0.5)
        got = {r.key: [c.value for c in r.cells] for r in btlib.read_rows(a.data, name)}
        other = b"z" if lost_key == b"a" else b"a"
        assert got == {lost_key: [b"new"], other: [b"old"]}, got
        a.close()
        b_.close()
    finally:
        assert rt.stop() == 0, rt.logs()
